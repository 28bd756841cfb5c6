//! [`FailureReason`]: why a request failed, as data. The one place where a failure's stable code
//! (the server's JSON `code`), its wording (`Display`) and its hint (what to do next, printed by
//! the CLI and sent by the server) are made.
//!
//! `step` builds a reason where it gives up on a request and puts it in
//! [`Reply::Failed`](crate::Reply::Failed); nobody downstream reads English to decide anything.
//!
//! # Stored form
//! A reason is journaled as an object tagged by its code:
//! `{"code":"command_failed","command":"ls","attempts":3,"failure":{…}}`. Journals written
//! before reasons were typed hold the wording as a plain string (`"error":"…"`); it reads back as
//! [`FailureReason::Recorded`]. Two reasons are equal when their wording is (see the
//! `PartialEq` impl), so replaying such a journal with today's `step` — which builds the typed
//! reason — finds the same reply it recorded.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::SnapshotId;
use crate::types::{Failure, FailureKind};

/// Why a request failed.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum FailureReason {
    /// Creating a fresh sandbox failed for good (attempts used up, or a failure retrying cannot
    /// fix).
    CreateFailed {
        /// Attempts made.
        attempts: u32,
        /// The last provider failure.
        failure: Failure,
    },
    /// Restoring the sandbox from its snapshot failed for good; the snapshot is kept, the next
    /// request tries again.
    RestoreFailed {
        /// Attempts made.
        attempts: u32,
        /// The last provider failure.
        failure: Failure,
    },
    /// A command could not be run (or its outcome not learnt) after its attempts.
    CommandFailed {
        /// The command.
        command: String,
        /// Attempts made.
        attempts: u32,
        /// The last provider failure.
        failure: Failure,
    },
    /// A snapshot failed for good; the sandbox keeps running.
    SnapshotFailed {
        /// Attempts made.
        attempts: u32,
        /// The last provider failure.
        failure: Failure,
    },
    /// A snapshot's outcome is still unknown after its attempts; taskbox keeps retrying it.
    SnapshotPending {
        /// Attempts made.
        attempts: u32,
        /// The last provider failure.
        failure: Failure,
    },
    /// The sandbox reached its platform deadline while a command ran in it.
    ExpiredDuringCommand {
        /// The command.
        command: String,
        /// The snapshot the files come back from (`None`: none holds them).
        restore_from: Option<SnapshotId>,
    },
    /// The sandbox reached its deadline while a command ran in it, on a provider that keeps a
    /// sandbox's files past its deadline: the command was stopped, the files are kept in a late
    /// checkpoint.
    DeadlineDuringCommand {
        /// The command.
        command: String,
    },
    /// The task's sandboxes were gone as soon as they were made, and the core's bound on
    /// creations per task per minute ([`MAX_CREATES_PER_MINUTE`](crate::MAX_CREATES_PER_MINUTE))
    /// was reached: no more are created before the minute is over.
    TooManyCreates {
        /// Sandboxes created within the last minute.
        created: u32,
    },
    /// The sandbox reached its platform deadline before the snapshot asked for completed.
    ExpiredDuringSnapshot {
        /// The snapshot the files come back from (`None`: none holds them).
        restore_from: Option<SnapshotId>,
    },
    /// taskbox restarted while the command ran; whether it finished is unknown.
    InterruptedCommand {
        /// The command.
        command: String,
    },
    /// taskbox restarted before a queued request was served.
    Interrupted,
    /// A fork named a snapshot the task does not retain as complete (never taken, superseded,
    /// deleted or expired).
    UnknownSnapshot {
        /// What was asked for (`demo.s3`, or a provider id).
        snapshot: String,
        /// The task's complete snapshots it could fork from instead, oldest first.
        retained: Vec<String>,
    },
    /// A fork from the latest snapshot of a task that has none to give: no complete snapshot,
    /// or (not persistent) none would be taken of its live sandbox.
    NothingToFork {
        /// `terminal.container_persistent` for the task.
        persistent: bool,
    },
    /// A rewind named a snapshot of the task that cannot be restored (deleted, failed,
    /// pending, gone, expired).
    SnapshotUnusable {
        /// What was asked for (`demo.s3`).
        snapshot: String,
        /// Its status.
        status: String,
    },
    /// `rewind --back N` asked for more snapshots than the task has before its current files.
    RewindTooFar {
        /// N.
        back: u64,
        /// Complete snapshots before the current files.
        available: u64,
    },
    /// A checkpoint or rewind of a task that keeps no snapshots.
    NotPersistent,
    /// The engine could not make the request's transition durable (an earlier transition of
    /// the task failed to commit), so it was dropped unperformed. Built by the engine.
    NotCommitted {
        /// Why, from the store.
        message: String,
    },
    /// The engine's loop answered a request with a reply of the wrong kind (a bug). Built by
    /// the engine.
    UnexpectedReply {
        /// The reply, as debug text.
        reply: String,
    },
    /// A reason recorded as plain text, by a taskbox from before reasons were typed.
    #[serde(rename = "failed")]
    Recorded {
        /// The wording, as recorded.
        message: String,
    },
}

impl FailureReason {
    /// The stable snake_case code: the server's JSON error `code`, and what scripts match on.
    pub fn code(&self) -> &'static str {
        match self {
            FailureReason::CreateFailed { .. } => "create_failed",
            FailureReason::RestoreFailed { .. } => "restore_failed",
            FailureReason::CommandFailed { .. } => "command_failed",
            FailureReason::SnapshotFailed { .. } => "snapshot_failed",
            FailureReason::SnapshotPending { .. } => "snapshot_pending",
            FailureReason::ExpiredDuringCommand { .. } => "sandbox_expired",
            FailureReason::ExpiredDuringSnapshot { .. } => "sandbox_expired",
            FailureReason::DeadlineDuringCommand { .. } => "sandbox_expired",
            FailureReason::TooManyCreates { .. } => "too_many_creates",
            FailureReason::InterruptedCommand { .. } | FailureReason::Interrupted => "interrupted",
            FailureReason::UnknownSnapshot { .. } => "unknown_snapshot",
            FailureReason::NothingToFork { .. } => "nothing_to_fork",
            FailureReason::SnapshotUnusable { .. } => "snapshot_unusable",
            FailureReason::RewindTooFar { .. } => "rewind_too_far",
            FailureReason::NotPersistent => "not_persistent",
            FailureReason::NotCommitted { .. } => "not_committed",
            FailureReason::UnexpectedReply { .. } => "unexpected_reply",
            FailureReason::Recorded { .. } => "failed",
        }
    }

    /// What the user can do about it, if there is something to say.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            FailureReason::ExpiredDuringCommand { .. }
            | FailureReason::ExpiredDuringSnapshot { .. }
            | FailureReason::DeadlineDuringCommand { .. } => Some(
                "live processes do not survive a sandbox's expiry; files come back from the latest snapshot",
            ),
            FailureReason::TooManyCreates { .. } => Some(
                "each sandbox was gone as soon as it was made: check terminal.sandbox_timeout_seconds (`taskbox config get`), then try again in a minute",
            ),
            FailureReason::InterruptedCommand { .. } | FailureReason::Interrupted => Some(
                "taskbox restarted before the request finished; send it again (the task's files were kept)",
            ),
            FailureReason::CreateFailed { failure, .. }
            | FailureReason::RestoreFailed { failure, .. }
            | FailureReason::CommandFailed { failure, .. }
            | FailureReason::SnapshotFailed { failure, .. }
            | FailureReason::SnapshotPending { failure, .. } => match failure.kind {
                FailureKind::Auth => Some(
                    "the provider refused the credentials; `taskbox doctor` checks them",
                ),
                FailureKind::Invalid => Some(
                    "the provider refused the request as invalid; `taskbox config show` lists the settings it was built from",
                ),
                FailureKind::Transient { .. }
                | FailureKind::SandboxGone
                | FailureKind::SnapshotGone
                | FailureKind::Permanent => None,
            },
            FailureReason::NotCommitted { .. } => Some(
                "nothing of the request was performed; once the store accepts writes again, send it again",
            ),
            FailureReason::UnknownSnapshot { .. } => Some(
                "`taskbox show <task>` lists the task's snapshots; name a complete one (a fork without --snapshot starts from the latest)",
            ),
            FailureReason::NothingToFork { persistent: true } => Some(
                "run a command in the task first (a fork starts from a snapshot of its files)",
            ),
            FailureReason::NothingToFork { persistent: false } => Some(
                "forks start from snapshots: `taskbox config set terminal.container_persistent true`",
            ),
            FailureReason::SnapshotUnusable { .. } | FailureReason::RewindTooFar { .. } => Some(
                "`taskbox show <task>` lists the task's snapshots; rewind to a complete one",
            ),
            FailureReason::NotPersistent => Some(
                "checkpoints are snapshots: `taskbox config set terminal.container_persistent true`",
            ),
            FailureReason::UnexpectedReply { .. } | FailureReason::Recorded { .. } => None,
        }
    }

    /// The provider failure behind it, when there is one.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            FailureReason::CreateFailed { failure, .. }
            | FailureReason::RestoreFailed { failure, .. }
            | FailureReason::CommandFailed { failure, .. }
            | FailureReason::SnapshotFailed { failure, .. }
            | FailureReason::SnapshotPending { failure, .. } => Some(failure),
            FailureReason::ExpiredDuringCommand { .. }
            | FailureReason::ExpiredDuringSnapshot { .. }
            | FailureReason::DeadlineDuringCommand { .. }
            | FailureReason::TooManyCreates { .. }
            | FailureReason::InterruptedCommand { .. }
            | FailureReason::Interrupted
            | FailureReason::UnknownSnapshot { .. }
            | FailureReason::NothingToFork { .. }
            | FailureReason::SnapshotUnusable { .. }
            | FailureReason::RewindTooFar { .. }
            | FailureReason::NotPersistent
            | FailureReason::NotCommitted { .. }
            | FailureReason::UnexpectedReply { .. }
            | FailureReason::Recorded { .. } => None,
        }
    }
}

fn attempts_text(n: u32) -> String {
    if n == 1 {
        "1 attempt".to_string()
    } else {
        format!("{n} attempts")
    }
}

struct RestoreNote<'a>(&'a Option<SnapshotId>);

impl fmt::Display for RestoreNote<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(id) => write!(
                f,
                "the task's files will be restored from snapshot {id} on the next command"
            ),
            None => {
                f.write_str("no snapshot holds the task's files; the next command starts fresh")
            }
        }
    }
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureReason::CreateFailed { attempts, failure } => write!(
                f,
                "could not create the sandbox after {}: {failure}",
                attempts_text(*attempts)
            ),
            FailureReason::RestoreFailed { attempts, failure } => write!(
                f,
                "could not restore the sandbox from its snapshot after {}: {failure}",
                attempts_text(*attempts)
            ),
            FailureReason::CommandFailed {
                command,
                attempts,
                failure,
            } => write!(
                f,
                "could not run `{command}` after {}: {failure}",
                attempts_text(*attempts)
            ),
            FailureReason::SnapshotFailed { attempts, failure } => write!(
                f,
                "could not snapshot the sandbox after {}: {failure}; the sandbox keeps running \
                 and the previous snapshot stays the latest",
                attempts_text(*attempts)
            ),
            FailureReason::SnapshotPending { attempts, failure } => write!(
                f,
                "the snapshot has not completed after {attempts} attempts: {failure}; taskbox \
                 keeps retrying it, and the previous snapshot stays the latest until it completes"
            ),
            FailureReason::ExpiredDuringCommand {
                command,
                restore_from,
            } => write!(
                f,
                "the sandbox expired while `{command}` was running; {}",
                RestoreNote(restore_from)
            ),
            FailureReason::DeadlineDuringCommand { command } => write!(
                f,
                "the sandbox reached its deadline while `{command}` was running (the command was \
                 stopped); its files are kept in a late checkpoint"
            ),
            FailureReason::TooManyCreates { created } => write!(
                f,
                "{created} sandboxes were created for this task within a minute, the most \
                 taskbox creates per task; each was gone before it could serve a request"
            ),
            FailureReason::ExpiredDuringSnapshot { restore_from } => write!(
                f,
                "the sandbox expired before its snapshot completed; {}",
                RestoreNote(restore_from)
            ),
            FailureReason::InterruptedCommand { command } => {
                write!(
                    f,
                    "interrupted: taskbox restarted while `{command}` was running"
                )
            }
            FailureReason::Interrupted => {
                f.write_str("interrupted: taskbox restarted before the request finished")
            }
            FailureReason::UnknownSnapshot { snapshot, retained } => {
                write!(f, "no complete snapshot {snapshot} is retained")?;
                if retained.is_empty() {
                    f.write_str(" (the task retains no complete snapshot)")
                } else {
                    write!(f, " (retained: {})", retained.join(", "))
                }
            }
            FailureReason::NothingToFork { persistent: true } => {
                f.write_str("the task has no complete snapshot to fork from")
            }
            FailureReason::NothingToFork { persistent: false } => f.write_str(
                "the task keeps no snapshots (terminal.container_persistent is false), so there \
                 is nothing to fork from",
            ),
            FailureReason::SnapshotUnusable { snapshot, status } => write!(
                f,
                "snapshot {snapshot} is {status}, so it cannot be restored; the task's files are \
                 unchanged"
            ),
            FailureReason::RewindTooFar { back, available } => write!(
                f,
                "cannot rewind {back} back: the task retains {available} complete snapshot(s) \
                 before the one holding its current files; the task's files are unchanged"
            ),
            FailureReason::NotPersistent => f.write_str(
                "the task keeps no snapshots (terminal.container_persistent is false), so it \
                 has no checkpoints to take or rewind to",
            ),
            FailureReason::NotCommitted { message } => f.write_str(message),
            FailureReason::UnexpectedReply { reply } => {
                write!(f, "unexpected answer from the engine: {reply}")
            }
            FailureReason::Recorded { message } => f.write_str(message),
        }
    }
}

/// Equal when the wording is: a reason read back from a journal written before reasons were
/// typed ([`FailureReason::Recorded`]) equals the typed reason today's `step` builds for the same
/// failure, so such journals still replay without a divergence.
impl PartialEq for FailureReason {
    fn eq(&self, other: &FailureReason) -> bool {
        match (self, other) {
            (FailureReason::Recorded { .. }, _) | (_, FailureReason::Recorded { .. }) => {
                self.to_string() == other.to_string()
            }
            _ => self.code() == other.code() && self.to_string() == other.to_string(),
        }
    }
}

impl Eq for FailureReason {}

/// Reads a reason as stored: the typed object, or the plain text older journals hold (which
/// becomes [`FailureReason::Recorded`]). For `#[serde(deserialize_with = …)]`.
pub fn deserialize_stored<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<FailureReason, D::Error> {
    StoredReason::deserialize(d).map(FailureReason::from)
}

/// How a reason is read: the typed object, or the plain text older journals hold.
#[derive(Deserialize)]
#[serde(untagged)]
enum StoredReason {
    /// `{"code": …, …}`.
    Typed(FailureReason),
    /// `"…"`, written before reasons were typed.
    Text(String),
}

impl From<StoredReason> for FailureReason {
    fn from(stored: StoredReason) -> FailureReason {
        match stored {
            StoredReason::Typed(reason) => reason,
            StoredReason::Text(message) => FailureReason::Recorded { message },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transient(message: &str) -> Failure {
        Failure::transient(message, None)
    }

    #[test]
    fn codes_are_stable_and_wording_is_made_here() {
        let r = FailureReason::ExpiredDuringCommand {
            command: "sleep 4".into(),
            restore_from: None,
        };
        assert_eq!(r.code(), "sandbox_expired");
        assert_eq!(
            r.to_string(),
            "the sandbox expired while `sleep 4` was running; no snapshot holds the task's \
             files; the next command starts fresh"
        );
        assert!(r.hint().is_some_and(|h| h.contains("expiry")));
        let c = FailureReason::CommandFailed {
            command: "ls".into(),
            attempts: 1,
            failure: transient("503"),
        };
        assert_eq!(c.code(), "command_failed");
        assert_eq!(c.to_string(), "could not run `ls` after 1 attempt: 503");
        assert_eq!(c.hint(), None);
        let auth = FailureReason::CreateFailed {
            attempts: 1,
            failure: Failure::new(FailureKind::Auth, "401"),
        };
        assert!(auth.hint().is_some_and(|h| h.contains("credentials")));
    }

    #[test]
    fn a_recorded_text_equals_the_typed_reason_with_the_same_wording() {
        let typed = FailureReason::InterruptedCommand {
            command: "sleep 3".into(),
        };
        let recorded = FailureReason::Recorded {
            message: "interrupted: taskbox restarted while `sleep 3` was running".into(),
        };
        assert_eq!(typed, recorded);
        assert_eq!(recorded, typed);
        assert_ne!(
            typed,
            FailureReason::Recorded {
                message: "something else".into()
            }
        );
    }
}
