//! [`Orchestrator::checkpoint`] and [`Orchestrator::rewind`], and what they answer: a
//! snapshot of a live sandbox that keeps it running, and a task's files put back as one of its
//! snapshots held them (the current files kept first).

use serde::{Deserialize, Serialize};

use super::api::unexpected;
use super::event_loop::ApiRequest;
use super::{EngineError, Orchestrator};
use crate::core::{CheckpointOutcome, Notice, Reply, RewindTo};
use crate::ids::{SandboxId, SnapshotId, TaskId};

/// The result of `taskbox checkpoint`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointResult {
    /// The snapshot holding the task's files now (`None`: it has none).
    pub snapshot_id: Option<SnapshotId>,
    /// Its sequence number (`<task>.s<seq>`).
    pub seq: Option<u64>,
    /// What happened: `taken` (the sandbox runs on), `unchanged` (nothing changed since that
    /// snapshot: none was taken), `stopped` (the platform's snapshot stopped the sandbox; the
    /// next command restores it), `no_sandbox` (nothing live to checkpoint).
    pub outcome: CheckpointOutcome,
}

/// The result of `taskbox rewind`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RewindResult {
    /// The snapshot restored.
    pub to: SnapshotId,
    /// Its sequence number.
    pub to_seq: u64,
    /// The snapshot holding the files as they were before (rewinding to it undoes this).
    pub saved: Option<SnapshotId>,
    /// Its sequence number.
    pub saved_seq: Option<u64>,
    /// The new sandbox (live processes of the one before ended).
    pub sandbox_id: SandboxId,
    /// What the caller should know.
    pub notices: Vec<Notice>,
}

/// Reads what a rewind asks for: exactly one of `to` (`<task>.s<seq>`, `s<seq>` or a provider
/// snapshot id) and `back` (at least 1). A `to` naming another task's snapshot
/// (`<other>.s<seq>`) is refused here, naming that task: a rewind restores the task's own
/// snapshots (a fork starts a new task from another's).
pub fn rewind_to(task: &TaskId, to: Option<&str>, back: Option<u64>) -> Result<RewindTo, String> {
    match (to, back) {
        (Some(_), Some(_)) => {
            Err("give either a snapshot to rewind to or how many back, not both".into())
        }
        (None, None) => Err(
            "name the snapshot to rewind to (`--to TASK.sN`) or how many back (`--back N`)".into(),
        ),
        (None, Some(0)) => {
            Err("--back counts snapshots before the current files: at least 1".into())
        }
        (None, Some(n)) => Ok(RewindTo::Back { n }),
        (Some(s), None) => {
            let s = s.trim();
            if s.is_empty() {
                return Err(
                    "the snapshot to rewind to is empty: give `TASK.sN`, `sN` or a snapshot id"
                        .into(),
                );
            }
            if let Some((other, seq)) = s.rsplit_once(".s") {
                let numbered = !seq.is_empty() && seq.bytes().all(|b| b.is_ascii_digit());
                if numbered && other != task.as_str() && TaskId::new(other).is_ok() {
                    return Err(format!(
                        "snapshot {s} is task {other}'s, not {task}'s: a rewind restores the task's \
                         own snapshots (`taskbox fork {other} NEW --snapshot {s}` starts a new \
                         task from it)"
                    ));
                }
            }
            Ok(RewindTo::parse(task, s))
        }
    }
}

impl Orchestrator {
    /// `taskbox checkpoint`: snapshots the task's live sandbox's files without stopping it,
    /// where the provider can (the local backend pauses its processes for the moment of the
    /// snapshot: they keep their pids, open files and sockets; the deadline is unchanged). On
    /// a platform whose snapshot stops the sandbox, the answer says it stopped
    /// ([`CheckpointOutcome::Stopped`]). With no live sandbox nothing is taken and the answer
    /// names the latest snapshot. A checkpoint is journaled as its own request.
    pub async fn checkpoint(&self, task: &TaskId) -> Result<CheckpointResult, EngineError> {
        let answer = self.request(task, ApiRequest::Checkpoint).await?;
        match answer.reply {
            Reply::Checkpointed {
                snapshot_id,
                seq,
                outcome,
            } => Ok(CheckpointResult {
                snapshot_id,
                seq,
                outcome,
            }),
            other => Err(unexpected(task, other)),
        }
    }

    /// `taskbox rewind`: keeps the task's current files in a checkpoint first (so rewinding to
    /// it undoes this), then restores `to` into a new sandbox at the same path; live
    /// processes end, as on any restore. Refused, the files unchanged, for a snapshot the task
    /// does not have, one that is not complete, or `--back` beyond what exists.
    pub async fn rewind(&self, task: &TaskId, to: RewindTo) -> Result<RewindResult, EngineError> {
        let answer = self.request(task, ApiRequest::Rewind { to }).await?;
        match answer.reply {
            Reply::Rewound {
                to,
                to_seq,
                saved,
                saved_seq,
                sandbox_id,
                notices,
            } => Ok(RewindResult {
                to,
                to_seq,
                saved,
                saved_seq,
                sandbox_id,
                notices,
            }),
            other => Err(unexpected(task, other)),
        }
    }
}
