//! What the engine hands back to callers: the result of each request ([`RunResult`],
//! [`SuspendResult`], [`ResumeResult`]), the [`StateChange`]s broadcast to watchers, and the
//! [`TaskView`] of one task for `taskbox show`.

use crate::ids::{SandboxId, SnapshotId, TaskId};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::EngineError;
use crate::core::{Millis, Notice, Task, TaskState};
use crate::store::{JournalEntry, SandboxRow, SnapshotRow, Store, TaskMarks};

/// The result of a command that ran.
///
/// Its output is the bounded capture (the first 40 % and the last 60 % of 50,000 characters per
/// stream). Output that is valid UTF-8 is in `stdout`/`stderr` as text; output that is not is
/// there as base64 of its bytes, with `stdout_encoding`/`stderr_encoding` set to `base64`
/// ([`RunResult::stdout_bytes`] gives the bytes either way). `--json` prints this object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResult {
    /// Exit code (124 when the timeout killed it).
    pub exit_code: i32,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// Captured stdout (bounded): text, or base64 when `stdout_encoding` says so.
    pub stdout: String,
    /// `base64` when stdout was not UTF-8; absent for text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_encoding: Option<Encoding>,
    /// Whether the capture of stdout dropped its middle.
    #[serde(default)]
    pub stdout_truncated: bool,
    /// Captured stderr (bounded): text, or base64 when `stderr_encoding` says so.
    pub stderr: String,
    /// `base64` when stderr was not UTF-8; absent for text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_encoding: Option<Encoding>,
    /// Whether the capture of stderr dropped its middle.
    #[serde(default)]
    pub stderr_truncated: bool,
    /// Wall time of the command.
    pub duration_ms: u64,
    /// Whether the sandbox's memory limit killed a process of the command (an isolated local
    /// sandbox, `terminal.container_memory`); present only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory_killed: bool,
    /// What the caller should know: the sandbox was recreated (live processes are gone), from
    /// which snapshot, files lost...
    pub notices: Vec<Notice>,
}

/// How a captured stream that is not text is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Standard base64 (with padding) of the bytes.
    Base64,
}

impl RunResult {
    /// The result of a command that ran, from the provider's output.
    pub fn from_output(out: crate::provider::ExecOutput, notices: Vec<Notice>) -> RunResult {
        let carry = |text: String, bytes: Option<Vec<u8>>| match bytes {
            Some(b) => (BASE64.encode(b), Some(Encoding::Base64)),
            None => (text, None),
        };
        let (stdout, stdout_encoding) = carry(out.stdout, out.stdout_bytes);
        let (stderr, stderr_encoding) = carry(out.stderr, out.stderr_bytes);
        RunResult {
            exit_code: out.exit_code,
            timed_out: out.timed_out,
            stdout,
            stdout_encoding,
            stdout_truncated: out.stdout_truncated,
            stderr,
            stderr_encoding,
            stderr_truncated: out.stderr_truncated,
            duration_ms: out.duration_ms,
            memory_killed: out.memory_killed,
            notices,
        }
    }

    /// The captured stdout's bytes (decoded when carried as base64).
    pub fn stdout_bytes(&self) -> Vec<u8> {
        decode(&self.stdout, self.stdout_encoding)
    }

    /// The captured stderr's bytes (decoded when carried as base64).
    pub fn stderr_bytes(&self) -> Vec<u8> {
        decode(&self.stderr, self.stderr_encoding)
    }
}

fn decode(s: &str, encoding: Option<Encoding>) -> Vec<u8> {
    match encoding {
        None => s.as_bytes().to_vec(),
        // Made by `from_output`; a peer that sent bad base64 gets its text back as is.
        Some(Encoding::Base64) => BASE64.decode(s).unwrap_or_else(|_| s.as_bytes().to_vec()),
    }
}

/// The result of a suspend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuspendResult {
    /// The snapshot holding the task's files (`None`: nothing kept).
    pub snapshot_id: Option<SnapshotId>,
    /// What the snapshot could not keep (`path: reason`); everything else is in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub omitted: Vec<String>,
}

/// The result of a fork: the new task and where it starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkResult {
    /// The new task (state `expired`: its first command restores `snapshot_id`).
    pub task: String,
    /// The task it was forked from.
    pub parent: String,
    /// The parent's snapshot it starts from (shared with the parent, not copied).
    pub snapshot_id: SnapshotId,
    /// That snapshot's sequence number in the parent (`<parent>.s<seq>`).
    pub parent_seq: u64,
    /// When the snapshot was taken (ms since the epoch).
    pub taken_at: Option<Millis>,
}

/// The result of a resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeResult {
    /// The live sandbox.
    pub sandbox_id: SandboxId,
    /// What the caller should know.
    pub notices: Vec<Notice>,
}

/// The result of `taskbox rm`: what was stopped, deleted and kept, and what could not be done
/// (left for `taskbox gc`: a removed task holds no sandbox, nor snapshots unless kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveResult {
    /// The task.
    pub task: TaskId,
    /// The live sandbox stopped.
    pub sandbox_stopped: Option<SandboxId>,
    /// The snapshots deleted.
    pub snapshots_deleted: Vec<SnapshotId>,
    /// The snapshots kept (`--keep-snapshots`).
    pub snapshots_kept: Vec<SnapshotId>,
    /// Provider calls that failed (the task is removed all the same).
    pub errors: Vec<String>,
}

/// A state change, as broadcast to watchers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateChange {
    /// The task.
    pub task_id: TaskId,
    /// State before.
    pub from: TaskState,
    /// State after.
    pub to: TaskState,
    /// The event that caused it.
    pub event: &'static str,
    /// When.
    pub at: Millis,
}

/// Everything known about one task, for `taskbox show` (read back from a server's
/// `GET /v1/tasks/{task}` by `taskbox --server URL show`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskView {
    /// The task as the core sees it.
    pub task: Task,
    /// Its sandboxes, as recorded.
    pub sandboxes: Vec<SandboxRow>,
    /// Its snapshots, as recorded.
    pub snapshots: Vec<SnapshotRow>,
    /// The last journal entries, oldest first.
    pub journal: Vec<JournalEntry>,
    /// Its backend, and whether `taskbox rm` removed it.
    pub marks: TaskMarks,
    /// What each of its sandbox generations' processes used (CPU time, peak memory, IO), from
    /// its journal ([`Ledger::resources`](crate::core::ledger::Ledger::resources)): final for
    /// a generation that ended with a snapshot, as last sampled for the live one. Absent when
    /// nothing was measured (and from servers before it existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<crate::core::ledger::GenerationResources>,
}

impl TaskView {
    /// Reads a task's view from the store (no provider, no lock: for read-only tools).
    /// `live` replaces the stored task when an event loop holds a newer one in memory.
    pub fn load(
        store: &Store,
        id: &TaskId,
        journal_entries: usize,
        live: Option<Task>,
    ) -> Result<Option<TaskView>, EngineError> {
        let task = match live {
            Some(t) => Some(t),
            None => store.load_task(id)?,
        };
        let Some(mut task) = task else {
            return Ok(None);
        };
        let marks = store.task_marks(id)?.unwrap_or_default();
        let mut snapshots = store.snapshots(Some(id))?;
        if marks.removed_at.is_some() {
            as_removed(store, &mut task, &marks)?;
            for row in &mut snapshots {
                if let Some(rec) = task.snapshots.iter().find(|s| s.seq == row.seq) {
                    row.status = rec.status;
                }
            }
        }
        let (ledger, _) =
            super::cost::task_ledger(store, id, crate::core::ledger::Window::until(Millis::MAX))?;
        Ok(Some(TaskView {
            resources: ledger.resources,
            sandboxes: store.sandboxes(Some(id))?,
            snapshots,
            journal: store.journal_tail(id, journal_entries)?,
            marks,
            task,
        }))
    }
}

/// `task`'s snapshot records as they stand after `taskbox rm` removed it (`marks`): the journal
/// keeps them as they were before the removal, and a removal that did not keep its snapshots
/// holds none of them any more ([`status_after_removal`](crate::core::retention::status_after_removal):
/// `released` where another task still holds the snapshot, `deleted` otherwise). What `show`
/// and `tasks` print of a removed task; a task not removed is left as it is.
pub fn as_removed(store: &Store, task: &mut Task, marks: &TaskMarks) -> Result<(), EngineError> {
    if marks.removed_at.is_none() {
        return Ok(());
    }
    for rec in &mut task.snapshots {
        let held_elsewhere = match &rec.id {
            Some(sid) if crate::core::retention::on_provider(rec.status) => {
                !store.snapshot_holders(sid, task.id.as_str())?.is_empty()
            }
            _ => false,
        };
        rec.status = crate::core::retention::status_after_removal(
            rec.status,
            marks.kept_snapshots,
            held_elsewhere,
        );
    }
    Ok(())
}

impl TaskView {
    /// The view as JSON with every secret redacted ([`crate::redact`]): what `show --json` and
    /// the server's `GET /v1/tasks/{task}` print, so that a journal written before commands
    /// were journaled redacted prints no secret either.
    pub fn to_redacted_json(&self) -> Result<serde_json::Value, serde_json::Error> {
        let mut v = serde_json::to_value(self)?;
        crate::redact::redact_value(&mut v);
        Ok(v)
    }
}
