//! The exported journal: versioned, self-describing JSON Lines.
//!
//! ```text
//! {"format":"taskbox-journal","version":2,"taskbox_version":"0.1.0","exported_at":"…","exported_at_ms":…,"installation_id":"…","tasks":["demo"],"entries":14,"redacted_values":0}
//! {"seq":1,"task_id":"demo","task_seq":1,"at":…,"event":{"type":"settings_changed",…},…}
//! …one journal entry per line, in commit order…
//! ```
//!
//! The header line names the format and its version, so a reader refuses what it cannot read
//! with a typed error instead of misreading it (a newer version, another format, a file that is
//! not a journal at all), and it announces the entry count, so a file cut at a line boundary is
//! caught as truncated. Entries pass through [`redact`](super::redact) on the way out.
//! Nothing is added to what the journal holds: no environment, no configuration file.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

use crate::clock::format_ms;
use crate::core::Millis;
use crate::store::JournalEntry;

/// The `format` field of the header.
pub const FORMAT: &str = "taskbox-journal";
/// The version this build writes and the newest it reads. Version 2: a failed reply carries a
/// typed `reason` (`{"code": …}`) instead of an `error` string; version 1 files still read (the
/// string becomes `FailureReason::Recorded`). Version 3: forks — the events `fork_requested`,
/// `forked` and `snapshot_released`, the reply `forked`, the snapshot status `released`, the
/// snapshot reason `fork` and a task's `lineage`; version 1 and 2 files still read unchanged
/// (they hold none of these, and `lineage` is absent from a task that is not a fork).
pub const VERSION: u32 = 3;

/// The first line of an exported journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportHeader {
    /// Always [`FORMAT`].
    pub format: String,
    /// The format version ([`VERSION`] when written by this build).
    pub version: u32,
    /// The taskbox version that wrote the file.
    pub taskbox_version: String,
    /// When it was written (RFC 3339).
    pub exported_at: String,
    /// When it was written (ms since the epoch).
    pub exported_at_ms: Millis,
    /// The installation (data directory) the journal comes from.
    pub installation_id: String,
    /// The tasks in the file, in the order they first appear.
    pub tasks: Vec<String>,
    /// How many entry lines follow.
    pub entries: usize,
    /// How many distinct secret values were replaced by `[redacted]`.
    pub redacted_values: usize,
}

/// An exported journal, read back.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalFile {
    /// The header.
    pub header: ExportHeader,
    /// The entries, in file order.
    pub entries: Vec<JournalEntry>,
}

/// Why an exported journal cannot be read. Every variant names the line.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Reading failed.
    #[error("cannot read the journal file at line {line}")]
    Io {
        /// The line being read.
        line: usize,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is empty.
    #[error("line 1: the file is empty; a taskbox journal starts with a `{FORMAT}` header line")]
    Empty,
    /// The first line is not a header.
    #[error("line {line}: missing header: {found}; a taskbox journal starts with a `{FORMAT}` header line (`taskbox export` writes one)")]
    MissingHeader {
        /// The line (1).
        line: usize,
        /// What was found instead.
        found: String,
    },
    /// The header names another format.
    #[error("line {line}: this is a `{found}` file, not a `{FORMAT}` file")]
    WrongFormat {
        /// The line (1).
        line: usize,
        /// The format named.
        found: String,
    },
    /// The file was written in a newer format version.
    #[error("line {line}: the journal is format version {found}, written by taskbox {writer}; this taskbox reads up to version {VERSION} — upgrade taskbox to read it")]
    NewerVersion {
        /// The line (1).
        line: usize,
        /// The version found.
        found: u32,
        /// The taskbox version that wrote it.
        writer: String,
    },
    /// A line is cut short (the file ends inside it).
    #[error("line {line}: the line is cut short ({message}); the file looks truncated")]
    Truncated {
        /// The line.
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// A line is not valid JSON.
    #[error("line {line}: not valid JSON ({message}); the file looks corrupted")]
    Corrupt {
        /// The line.
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// A line is JSON but not a journal entry (or the header lacks a field).
    #[error("line {line}: not a valid {what} ({message})")]
    Invalid {
        /// The line.
        line: usize,
        /// `header` or `journal entry`.
        what: &'static str,
        /// The decoder's message.
        message: String,
    },
    /// Fewer or more entries than the header announces.
    #[error("line {line}: the header announces {announced} entries but the file holds {found}; the file looks truncated or was edited")]
    Count {
        /// The line after the last one read.
        line: usize,
        /// Entries announced.
        announced: usize,
        /// Entries read.
        found: usize,
    },
    /// An entry could not be encoded (or redacted) for writing.
    #[error("cannot encode journal entry {seq} as JSON")]
    Encode {
        /// The entry's global sequence number.
        seq: u64,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// Writing failed.
    #[error("cannot write the journal")]
    Write(#[source] std::io::Error),
}

/// Writes `entries` (redacted) with a header. `now` is the export time; `installation_id` names
/// the data directory they come from.
pub fn write_journal(
    out: &mut impl Write,
    entries: &[JournalEntry],
    installation_id: &str,
    now: Millis,
) -> Result<ExportHeader, ExportError> {
    let (entries, redacted_values) =
        super::redact::redact_entries(entries).map_err(|source| ExportError::Encode {
            seq: entries.first().map_or(0, |e| e.seq),
            source,
        })?;
    let header = ExportHeader {
        format: FORMAT.to_string(),
        version: VERSION,
        taskbox_version: env!("CARGO_PKG_VERSION").to_string(),
        exported_at: format_ms(now),
        exported_at_ms: now,
        installation_id: installation_id.to_string(),
        tasks: super::group_by_task(&entries)
            .into_iter()
            .map(|(id, _)| id.to_string())
            .collect(),
        entries: entries.len(),
        redacted_values,
    };
    let line =
        serde_json::to_string(&header).map_err(|source| ExportError::Encode { seq: 0, source })?;
    writeln!(out, "{line}").map_err(ExportError::Write)?;
    for e in &entries {
        let line = serde_json::to_string(e)
            .map_err(|source| ExportError::Encode { seq: e.seq, source })?;
        writeln!(out, "{line}").map_err(ExportError::Write)?;
    }
    out.flush().map_err(ExportError::Write)?;
    Ok(header)
}

/// Reads an exported journal. Blank lines are skipped; anything else that is not exactly a
/// header followed by the announced number of entries is an error naming the line.
pub fn read_journal(input: impl BufRead) -> Result<JournalFile, ExportError> {
    let mut header: Option<ExportHeader> = None;
    let mut entries = Vec::new();
    let mut line_no = 0;
    for line in input.split(b'\n') {
        line_no += 1;
        let raw = line.map_err(|source| ExportError::Io {
            line: line_no,
            source,
        })?;
        let text = String::from_utf8_lossy(&raw);
        let text = text.trim_end_matches('\r');
        if text.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            if e.is_eof() {
                ExportError::Truncated {
                    line: line_no,
                    message: e.to_string(),
                }
            } else {
                ExportError::Corrupt {
                    line: line_no,
                    message: e.to_string(),
                }
            }
        })?;
        match &header {
            None => header = Some(parse_header(line_no, value)?),
            Some(_) => {
                entries.push(serde_json::from_value::<JournalEntry>(value).map_err(|e| {
                    ExportError::Invalid {
                        line: line_no,
                        what: "journal entry",
                        message: e.to_string(),
                    }
                })?)
            }
        }
    }
    let header = header.ok_or(ExportError::Empty)?;
    if entries.len() != header.entries {
        return Err(ExportError::Count {
            line: line_no + 1,
            announced: header.entries,
            found: entries.len(),
        });
    }
    Ok(JournalFile { header, entries })
}

fn parse_header(line: usize, value: serde_json::Value) -> Result<ExportHeader, ExportError> {
    let Some(obj) = value.as_object() else {
        return Err(ExportError::MissingHeader {
            line,
            found: "the first line is not a JSON object".into(),
        });
    };
    let Some(format) = obj.get("format") else {
        let found = if obj.contains_key("task_seq") || obj.contains_key("event") {
            "the first line is a journal entry (was the start of the file cut off?)".to_string()
        } else {
            "the first line has no `format` field".to_string()
        };
        return Err(ExportError::MissingHeader { line, found });
    };
    if format.as_str() != Some(FORMAT) {
        return Err(ExportError::WrongFormat {
            line,
            found: format
                .as_str()
                .map_or_else(|| format.to_string(), str::to_string),
        });
    }
    if let Some(found) = obj.get("version").and_then(|v| v.as_u64()) {
        if found > u64::from(VERSION) {
            return Err(ExportError::NewerVersion {
                line,
                found: u32::try_from(found).unwrap_or(u32::MAX),
                writer: obj
                    .get("taskbox_version")
                    .and_then(|v| v.as_str())
                    .unwrap_or("(unknown)")
                    .to_string(),
            });
        }
    }
    serde_json::from_value(value).map_err(|e| ExportError::Invalid {
        line,
        what: "header",
        message: e.to_string(),
    })
}
