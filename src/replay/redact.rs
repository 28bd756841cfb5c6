//! Keeps secrets out of journals that leave the store (`taskbox export`, `taskbox replay`
//! output).
//!
//! The finding and replacing is [`crate::redact`], the one redaction taskbox has (the engine
//! journals commands through it too); journals written before it did are redacted here.
//!
//! The journal holds no credentials of taskbox's own, but it does hold the shell commands an
//! agent ran and the error messages providers returned, and an agent may well have typed
//! `export GITHUB_TOKEN=ghp_…` or `curl -H 'Authorization: Bearer …'`. Redaction works in two
//! passes over *every* string of the entries: first find secret values (`NAME=value` where the
//! name says token/secret/password/key, `Bearer …`, `--token …`, passwords in URLs, private-key
//! blocks, well-known token prefixes such as `ghp_`), then replace each occurrence of those values
//! everywhere with [`REDACTED`]. Replacing the same values everywhere is what keeps a redacted
//! journal replayable: the core only copies and concatenates strings, so a command and the
//! error message quoting it are redacted alike, and `step` recomputes the redacted record.

use std::collections::BTreeSet;

use crate::redact::{collect, replace};
pub use crate::redact::{find_secrets, scrub, REDACTED};
use crate::store::JournalEntry;

/// Entries with every secret value replaced by [`REDACTED`], and how many distinct secret values
/// were found. Values are replaced alike in every entry, so the result replays like the input.
pub fn redact_entries(
    entries: &[JournalEntry],
) -> Result<(Vec<JournalEntry>, usize), serde_json::Error> {
    let mut values = entries
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()?;
    let mut found = BTreeSet::new();
    for v in &values {
        collect(v, None, &mut found);
    }
    if found.is_empty() {
        return Ok((entries.to_vec(), 0));
    }
    let mut secrets: Vec<String> = found.into_iter().collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for v in &mut values {
        replace(v, None, &secrets);
    }
    let redacted = values
        .into_iter()
        .map(serde_json::from_value)
        .collect::<Result<Vec<JournalEntry>, _>>()?;
    Ok((redacted, secrets.len()))
}
