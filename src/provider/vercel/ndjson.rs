//! The NDJSON line reader: a command's streamed body (`wait:true` run or `/logs`) read record
//! by record into [`StreamEvent`]s, with a broken body reported as a [`StreamCut`].

use std::fmt;

use reqwest::Response;
use serde_json::Value;

use super::classify::error_chain;
use super::wire::Command;

/// One record of a command's NDJSON stream (`wait:true` run or `/logs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// A command record: the first one (running) or the last (with the exit code).
    Command(Command),
    /// A run of stdout bytes (not necessarily a line).
    Stdout(String),
    /// A run of stderr bytes.
    Stderr(String),
    /// An in-band error, e.g. `sandbox_stream_closed`.
    Error {
        /// The code.
        code: String,
        /// The message.
        message: String,
    },
}

/// A streaming body broke before its end (transport error or a malformed record).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StreamCut(pub String);

/// An NDJSON response body read record by record. HTTP chunks and records do not align, so
/// bytes are buffered until a newline.
pub struct NdjsonStream {
    response: Response,
    buf: Vec<u8>,
    done: bool,
}

impl fmt::Debug for NdjsonStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NdjsonStream")
            .field("buffered", &self.buf.len())
            .field("done", &self.done)
            .finish()
    }
}

impl NdjsonStream {
    pub(super) fn new(response: Response) -> NdjsonStream {
        NdjsonStream {
            response,
            buf: Vec::new(),
            done: false,
        }
    }

    /// The next record; `Ok(None)` at a clean end of the body.
    pub async fn next(&mut self) -> Result<Option<StreamEvent>, StreamCut> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                match parse_record(&line[..line.len() - 1])? {
                    Some(ev) => return Ok(Some(ev)),
                    None => continue,
                }
            }
            if self.done {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                // A last record without a trailing newline is still a record.
                let line = std::mem::take(&mut self.buf);
                return parse_record(&line);
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk),
                Ok(None) => self.done = true,
                Err(e) => {
                    return Err(StreamCut(format!(
                        "stream broken: {}",
                        error_chain(&e.without_url())
                    )))
                }
            }
        }
    }
}

fn parse_record(line: &[u8]) -> Result<Option<StreamEvent>, StreamCut> {
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let v: Value = serde_json::from_str(text)
        .map_err(|e| StreamCut(format!("malformed stream record ({e})")))?;
    if let Some(cmd) = v.get("command") {
        let cmd: Command = serde_json::from_value(cmd.clone())
            .map_err(|e| StreamCut(format!("malformed command record ({e})")))?;
        return Ok(Some(StreamEvent::Command(cmd)));
    }
    let data = v.get("data");
    match v.get("stream").and_then(Value::as_str) {
        Some("stdout") => Ok(Some(StreamEvent::Stdout(
            data.and_then(Value::as_str).unwrap_or("").to_string(),
        ))),
        Some("stderr") => Ok(Some(StreamEvent::Stderr(
            data.and_then(Value::as_str).unwrap_or("").to_string(),
        ))),
        Some("error") => Ok(Some(StreamEvent::Error {
            code: data
                .and_then(|d| d.get("code"))
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string(),
            message: data
                .and_then(|d| d.get("message"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        })),
        // Records of kinds this client does not know are skipped, not fatal.
        _ => Ok(None),
    }
}
