//! What `step` emits: effects to perform ([`Command`]) and the answers they carry ([`Reply`]).

use serde::{Deserialize, Serialize};

use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::reason::FailureReason;

use super::{Millis, Notice, RequestId, SnapshotRecord, TimerKind};

/// What a finished request answers its caller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reply {
    /// The command ran (its output is delivered by the executor, not journaled).
    Ran {
        /// Exit code (124 on timeout).
        exit_code: i32,
        /// Whether the timeout killed it.
        timed_out: bool,
        /// Whether the sandbox's memory limit killed a process of the command (from
        /// [`Event::CommandExited`](crate::Event::CommandExited)); absent when false.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        memory_killed: bool,
        /// What the caller should know (recreated sandbox, files lost...).
        notices: Vec<Notice>,
    },
    /// The task is suspended.
    Suspended {
        /// The snapshot holding its files (`None`: nothing kept).
        snapshot_id: Option<SnapshotId>,
        /// What that snapshot could not keep (`path: reason`), when it was taken for this
        /// request.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        omitted: Vec<String>,
    },
    /// A fork may start from this snapshot: the engine creates the child task from it.
    Forked {
        /// The new task.
        child: TaskId,
        /// The snapshot record (this task's) the child starts from.
        snapshot: SnapshotRecord,
    },
    /// A checkpoint request is answered.
    Checkpointed {
        /// The snapshot holding the files now (`None`: the task has none).
        snapshot_id: Option<SnapshotId>,
        /// Its sequence number.
        seq: Option<u64>,
        /// What happened.
        outcome: CheckpointOutcome,
    },
    /// A rewind is done: the task's sandbox is a new one, restored from `to`.
    Rewound {
        /// The snapshot restored.
        to: SnapshotId,
        /// Its sequence number.
        to_seq: u64,
        /// The snapshot holding the files as they were before (rewinding to it undoes this).
        saved: Option<SnapshotId>,
        /// Its sequence number.
        saved_seq: Option<u64>,
        /// The new sandbox.
        sandbox_id: SandboxId,
        /// What the caller should know.
        notices: Vec<Notice>,
    },
    /// The task has a live sandbox.
    Resumed {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// What the caller should know.
        notices: Vec<Notice>,
    },
    /// The request failed.
    Failed {
        /// Why, with the last real error. Stored as `reason`; journals written before reasons
        /// were typed hold the wording as `error`, read back as [`FailureReason::Recorded`].
        #[serde(
            alias = "error",
            deserialize_with = "crate::reason::deserialize_stored"
        )]
        reason: FailureReason,
        /// How many attempts were made.
        attempts: u32,
        /// What the caller should know.
        notices: Vec<Notice>,
    },
}

/// What a checkpoint did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointOutcome {
    /// A new snapshot was taken; the sandbox and its processes run on.
    Taken,
    /// Nothing changed since the latest snapshot, which holds the files: none was taken.
    Unchanged,
    /// The platform cannot snapshot a running sandbox: the snapshot stopped it, and the next
    /// command restores it (live processes ended).
    Stopped,
    /// The task has no live sandbox: nothing to checkpoint; its files are in the latest
    /// snapshot, if any.
    NoSandbox,
}

impl CheckpointOutcome {
    /// The outcome's name as printed (`taken`, `unchanged`, `stopped`, `no_sandbox`).
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointOutcome::Taken => "taken",
            CheckpointOutcome::Unchanged => "unchanged",
            CheckpointOutcome::Stopped => "stopped",
            CheckpointOutcome::NoSandbox => "no_sandbox",
        }
    }
}

/// An effect to perform, emitted by `step` and committed to the journal before it is performed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Command {
    /// Emitted entering `provisioning`/`restoring` (and on retry or recovery): create the
    /// sandbox of this generation, from a snapshot when restoring. Idempotent by
    /// (task, generation): a create whose answer was lost finds the sandbox by name.
    CreateSandbox {
        /// Generation (names the sandbox).
        generation: u64,
        /// The snapshot to restore, or `None` for a fresh sandbox.
        source_snapshot: Option<SnapshotId>,
        /// Platform timeout for the new sandbox.
        timeout_ms: u64,
    },
    /// Emitted when a run request reaches the front of the queue in `running` (and on retry).
    RunCommand {
        /// The request.
        request_id: RequestId,
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The shell command.
        command: String,
        /// Its timeout.
        timeout_ms: u64,
    },
    /// Emitted entering `snapshotting` (and on retry or recovery). Idempotent by (task, seq).
    /// The sandbox stops once the snapshot completes.
    TakeSnapshot {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The snapshot sequence number.
        seq: u64,
    },
    /// Emitted entering `snapshotting` for a live checkpoint (a checkpoint or the files kept
    /// before a rewind, on a provider that can, [`TaskSettings::live_checkpoint`](super::TaskSettings))
    /// and on retry or recovery: snapshot the sandbox's files without stopping it (its
    /// processes paused for the moment). Idempotent by (task, seq). Answered by
    /// [`Event::SnapshotTaken`](super::Event::SnapshotTaken), or
    /// [`Event::CheckpointUnchanged`](super::Event::CheckpointUnchanged) when nothing changed
    /// since `previous`.
    TakeCheckpoint {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The snapshot sequence number.
        seq: u64,
        /// The task's latest complete snapshot, which may already hold the files.
        previous: Option<SnapshotId>,
    },
    /// Emitted when a sandbox is no longer wanted (non-persistent suspend or reap, a stale
    /// sandbox from an earlier generation).
    StopSandbox {
        /// The sandbox.
        sandbox_id: SandboxId,
    },
    /// Emitted at the checkpoint timer while commands keep coming and the plan allows more.
    ExtendTimeout {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// How much longer.
        duration_ms: u64,
    },
    /// Emitted when a newer snapshot has been confirmed and this one falls out of retention
    /// (and on recovery while it is `deleting`). The engine deletes it only when no other task
    /// retains it, and answers [`Event::SnapshotReleased`](super::Event::SnapshotReleased)
    /// otherwise.
    DeleteSnapshot {
        /// The snapshot.
        snapshot_id: SnapshotId,
    },
    /// Emitted on recovery of a `running` task (and on retry): ask whether the sandbox still
    /// lives.
    ProbeSandbox {
        /// The sandbox.
        sandbox_id: SandboxId,
    },
    /// Emitted when a session ended without the platform being asked — the deadline timer found
    /// it past its deadline, or a command or a snapshot was answered "sandbox gone" — on a
    /// provider that reports usage ([`TaskSettings::reports_usage`](super::TaskSettings)):
    /// read what the session used, for the cost ledger. Answered by
    /// [`Event::UsageRead`](super::Event::UsageRead); nothing waits for it.
    ReadUsage {
        /// The session that ended.
        sandbox_id: SandboxId,
    },
    /// Emitted in `running` with no command running, as the idle timer nears (its
    /// [`TimerKind::Activity`]) and when it falls due, where the provider samples activity
    /// ([`TaskSettings::max_busy_ms`](super::TaskSettings::max_busy_ms) > 0): read what the
    /// sandbox's processes used so far. Answered by
    /// [`Event::ActivitySampled`](super::Event::ActivitySampled); the second answer decides
    /// whether the sandbox is idle.
    SampleActivity {
        /// The sandbox.
        sandbox_id: SandboxId,
    },
    /// Emitted to arm a timer; a later timer of the same kind replaces it.
    ScheduleTimer {
        /// Which timer.
        timer: TimerKind,
        /// When it fires.
        at: Millis,
    },
    /// Emitted when a request is finished: answer its caller.
    Reply {
        /// The request.
        request_id: RequestId,
        /// The answer.
        reply: Reply,
    },
}

impl Command {
    /// A short name for logs, tables and journal summaries.
    pub fn name(&self) -> &'static str {
        match self {
            Command::CreateSandbox { .. } => "create_sandbox",
            Command::RunCommand { .. } => "run_command",
            Command::TakeSnapshot { .. } => "take_snapshot",
            Command::TakeCheckpoint { .. } => "take_checkpoint",
            Command::StopSandbox { .. } => "stop_sandbox",
            Command::ExtendTimeout { .. } => "extend_timeout",
            Command::DeleteSnapshot { .. } => "delete_snapshot",
            Command::ProbeSandbox { .. } => "probe_sandbox",
            Command::ReadUsage { .. } => "read_usage",
            Command::SampleActivity { .. } => "sample_activity",
            Command::ScheduleTimer { .. } => "schedule_timer",
            Command::Reply { .. } => "reply",
        }
    }
}
