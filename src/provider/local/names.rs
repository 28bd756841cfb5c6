//! The ids that reach paths, parsed and validated before they do: sandbox names
//! (`taskbox-<task>-g<N>-<installation>`) and snapshot ids (`<task>.s<seq>`). Each has one
//! canonical spelling, so each names exactly one directory or archive.
//!
//! A snapshot id is `<task>.s<seq>.<nonce>`: the nonce (16 lowercase hex digits, random per
//! snapshot operation) makes every archive unique across store lifetimes, so an archive left
//! by an earlier store can never be taken for one this store asked for. Ids without a nonce
//! (`<task>.s<seq>`) name archives written before nonces existed and are still restorable.

use super::error::LocalError;
use crate::ids::TaskId;
use crate::provider::sandbox_name;

/// A parsed, validated sandbox name: `taskbox-<task id>-g<generation>-<installation>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SandboxName {
    pub(super) name: String,
    pub(super) task: TaskId,
    pub(super) generation: u64,
}

impl SandboxName {
    pub(super) fn parse(id: &str) -> Result<SandboxName, LocalError> {
        let err = |reason| LocalError::SandboxId {
            id: id.escape_debug().to_string(),
            reason,
        };
        if !id.starts_with("taskbox-") {
            return Err(err("it does not start with `taskbox-`"));
        }
        let (inst, task, generation) = crate::provider::parse_sandbox_name(id)
            .ok_or_else(|| err("it is not `taskbox-<task>-g<generation>-<installation>`"))?;
        let task = TaskId::new(&task).map_err(|_| err("it does not contain a valid task id"))?;
        // The round trip guarantees the name is exactly what `sandbox_name` builds.
        if sandbox_name(&inst, task.as_str(), generation) != id {
            return Err(err("it is not in canonical form"));
        }
        Ok(SandboxName {
            name: id.to_string(),
            task,
            generation,
        })
    }
}

/// A parsed, validated snapshot id: `<task id>.s<seq>.<nonce>` (or `<task id>.s<seq>` for an
/// archive written before nonces).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SnapshotRef {
    pub(super) task: TaskId,
    pub(super) seq: u64,
    pub(super) nonce: Option<String>,
}

/// Length of a snapshot nonce in hex digits.
pub(super) const NONCE_LEN: usize = 16;

impl SnapshotRef {
    pub(super) fn parse(id: &str) -> Result<SnapshotRef, LocalError> {
        let err = |reason| LocalError::SnapshotId {
            id: id.escape_debug().to_string(),
            reason,
        };
        let (task, rest) = id
            .split_once('.')
            .ok_or_else(|| err("it has no `.s<seq>` suffix"))?;
        let (seq, nonce) = match rest.split_once('.') {
            Some((seq, nonce)) => (seq, Some(nonce)),
            None => (rest, None),
        };
        let seq = seq
            .strip_prefix('s')
            .and_then(parse_canonical_u64)
            .ok_or_else(|| err("its sequence number is not `s` and a plain number"))?;
        if let Some(nonce) = nonce {
            if !is_nonce(nonce) {
                return Err(err("its nonce is not 16 lowercase hex digits"));
            }
        }
        let task = TaskId::new(task).map_err(|_| err("it does not start with a valid task id"))?;
        Ok(SnapshotRef {
            task,
            seq,
            nonce: nonce.map(str::to_string),
        })
    }

    pub(super) fn id(&self) -> String {
        match &self.nonce {
            Some(nonce) => format!("{}.s{}.{nonce}", self.task, self.seq),
            None => format!("{}.s{}", self.task, self.seq),
        }
    }

    /// The archive's file name in its task's directory: `<seq>.<nonce>.tbx` (`<seq>.tbx`
    /// without a nonce).
    pub(super) fn file_name(&self, ext: &str) -> String {
        match &self.nonce {
            Some(nonce) => format!("{}.{nonce}.{ext}", self.seq),
            None => format!("{}.{ext}", self.seq),
        }
    }

    /// The inverse of [`SnapshotRef::file_name`] for `task`'s directory; `None` for anything
    /// else (temporaries, strangers).
    pub(super) fn from_file_name(task: &TaskId, name: &str, ext: &str) -> Option<SnapshotRef> {
        let stem = name.strip_suffix(ext)?.strip_suffix('.')?;
        let (seq, nonce) = match stem.split_once('.') {
            Some((_, nonce)) if !is_nonce(nonce) => return None,
            Some((seq, nonce)) => (seq, Some(nonce.to_string())),
            None => (stem, None),
        };
        Some(SnapshotRef {
            task: task.clone(),
            seq: parse_canonical_u64(seq)?,
            nonce,
        })
    }
}

fn is_nonce(s: &str) -> bool {
    s.len() == NONCE_LEN && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Digits only, no sign, no leading zero: one spelling per number, so one path per id.
pub(super) fn parse_canonical_u64(s: &str) -> Option<u64> {
    let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    s.parse().ok()
}

/// That the sandbox `name`'s `what` (its task, its installation) is `expected`, as its
/// metadata says `owner`.
pub(super) fn check_owner(
    name: &SandboxName,
    what: &'static str,
    owner: &str,
    expected: &str,
) -> Result<(), LocalError> {
    if owner == expected {
        return Ok(());
    }
    Err(LocalError::Ownership {
        sandbox: name.name.clone(),
        what,
        owner: owner.to_string(),
        expected: expected.to_string(),
    })
}

impl LocalError {
    /// The sandbox `sandbox` is gone, for `reason`.
    pub(super) fn gone(sandbox: &SandboxName, reason: impl Into<String>) -> Self {
        LocalError::SandboxGone {
            sandbox: sandbox.name.clone(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn sandbox_names_round_trip_and_reject_lookalikes() {
        let name = SandboxName::parse("taskbox-a-g1-g12-abc123").unwrap();
        assert_eq!(name.task.as_str(), "a-g1");
        assert_eq!(name.generation, 12);
        for bad in [
            "",
            "taskbox-",
            "taskbox--g1-abc",
            "taskbox-a-g-abc",
            "taskbox-a-g01-abc",
            "taskbox-a-g+1-abc",
            "taskbox-../x-g1-abc",
            "taskbox-a/b-g1-abc",
            "sandbox-a-g1-abc",
            "taskbox-a.b-g1-abc",
            "taskbox-a-g1-abc/..",
            "taskbox-a-g1-ABC",
            "taskbox-a-g1",
        ] {
            assert!(SandboxName::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn snapshot_ids_round_trip_and_reject_lookalikes() {
        let snap = SnapshotRef::parse("task-1.s7").unwrap();
        assert_eq!((snap.task.as_str(), snap.seq), ("task-1", 7));
        assert_eq!(snap.id(), "task-1.s7");
        assert_eq!(snap.file_name("tbx"), "7.tbx");
        let snap = SnapshotRef::parse("task-1.s7.0123456789abcdef").unwrap();
        assert_eq!(snap.nonce.as_deref(), Some("0123456789abcdef"));
        assert_eq!(snap.id(), "task-1.s7.0123456789abcdef");
        assert_eq!(snap.file_name("tbx"), "7.0123456789abcdef.tbx");
        assert_eq!(
            SnapshotRef::from_file_name(&snap.task, "7.0123456789abcdef.tbx", "tbx"),
            Some(snap.clone())
        );
        for stranger in [
            "7.tbx.1.2.tmp",
            "07.tbx",
            "7.0123.tbx",
            "7.0123456789ABCDEF.tbx",
        ] {
            assert_eq!(
                SnapshotRef::from_file_name(&snap.task, stranger, "tbx"),
                None
            );
        }
        for bad in [
            "",
            "task",
            "task.7",
            "task.s",
            "task.s07",
            "task.s-1",
            "../x.s1",
            "a.b.s1",
            "task.s1.",
            ".s1",
            "task.s1.0123456789ABCDEF",
            "task.s1.0123",
            "task.s1.x/..",
            "task.s1.0123456789abcdef.0123456789abcdef",
        ] {
            assert!(SnapshotRef::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
