//! What can happen to a task: the closed [`Event`] enum `step` consumes, and the timers that fire.

use serde::{Deserialize, Serialize};

use crate::ids::{SandboxId, SnapshotId, TaskId};

use super::{
    Failure, ForkFrom, Millis, PlatformSnapshot, RequestId, Resources, RewindTo, SessionUsage,
    SnapshotRecord, TaskSettings,
};

/// Which timer fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimerKind {
    /// The idle lifetime may have passed.
    Idle,
    /// The checkpoint margin before the deadline is reached.
    Checkpoint,
    /// The sandbox's platform deadline is reached.
    Deadline,
    /// A backoff delay before retrying the operation in flight is over.
    Retry,
    /// The idle timer falls due soon: take the first of the two activity samples that decide
    /// whether the sandbox is idle (activity-aware idle).
    Activity,
}

/// Everything that can happen to a task: caller requests, provider outcomes, timers, restarts.
/// Closed: adding a variant forces a look at every arm of [`step`](crate::step).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A caller asked to run a command.
    RunRequested {
        /// Request id.
        request_id: RequestId,
        /// The shell command.
        command: String,
        /// Its timeout.
        timeout_ms: u64,
    },
    /// A caller asked to suspend the task.
    SuspendRequested {
        /// Request id.
        request_id: RequestId,
    },
    /// A caller asked to make the sandbox live again without running anything.
    ResumeRequested {
        /// Request id.
        request_id: RequestId,
    },
    /// A caller asked to fork this task into a new task `child`; answered with
    /// [`Reply::Forked`](super::Reply::Forked) naming the snapshot the child starts from.
    ForkRequested {
        /// Request id.
        request_id: RequestId,
        /// The new task.
        child: TaskId,
        /// Which snapshot.
        from: ForkFrom,
    },
    /// A caller asked to checkpoint the task: snapshot its live sandbox's files without
    /// stopping it (where the provider can); answered with
    /// [`Reply::Checkpointed`](super::Reply::Checkpointed).
    CheckpointRequested {
        /// Request id.
        request_id: RequestId,
    },
    /// A caller asked to rewind the task to one of its snapshots: the current files are kept
    /// in a checkpoint first, then `to` is restored into a new sandbox; answered with
    /// [`Reply::Rewound`](super::Reply::Rewound).
    RewindRequested {
        /// Request id.
        request_id: RequestId,
        /// Which snapshot.
        to: RewindTo,
    },
    /// `TakeCheckpoint` found nothing changed since the snapshot it named as `previous`: no
    /// snapshot was made, the sandbox runs on.
    CheckpointUnchanged {
        /// The sequence number the checkpoint would have had.
        seq: u64,
    },
    /// The first event of a forked task (after its creation): it starts `expired`, its files
    /// held in `snapshot`, the parent's record of it (shared on the provider).
    Forked {
        /// The task it was forked from.
        parent: TaskId,
        /// The parent's snapshot record.
        snapshot: SnapshotRecord,
    },
    /// The configuration changed; the new settings apply from now on.
    SettingsChanged {
        /// The new settings.
        settings: TaskSettings,
    },
    /// `CreateSandbox` succeeded.
    SandboxReady {
        /// The generation that was created.
        generation: u64,
        /// Provider handle.
        sandbox_id: SandboxId,
        /// Stable name.
        name: String,
        /// Platform deadline.
        deadline: Millis,
    },
    /// `CreateSandbox` failed.
    CreateFailed {
        /// The generation that failed.
        generation: u64,
        /// Why.
        failure: Failure,
    },
    /// `RunCommand` finished (the command ran; its own exit code may be non-zero).
    CommandExited {
        /// The request it served.
        request_id: RequestId,
        /// The command's exit code (124 on timeout).
        exit_code: i32,
        /// Whether the timeout killed it.
        timed_out: bool,
        /// Whether the sandbox's memory limit killed a process of the command while it ran (an
        /// isolated local sandbox, `terminal.container_memory`): the command ran, the sandbox
        /// lives on. Absent from journals written before it existed and when false, so those
        /// read, replay and compare as before.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        memory_killed: bool,
    },
    /// `RunCommand` could not run or complete the command.
    CommandFailed {
        /// The request it served.
        request_id: RequestId,
        /// Why.
        failure: Failure,
    },
    /// `RunCommand` was refused before the command started (the run request was answered
    /// "sandbox gone", or the sandbox was found stopped before it): the command provably never
    /// ran, so it may be run again — on a restored sandbox when this one is gone.
    CommandNotStarted {
        /// The request it serves.
        request_id: RequestId,
        /// Why.
        failure: Failure,
    },
    /// `TakeSnapshot` completed: the snapshot is confirmed and the sandbox has stopped.
    SnapshotTaken {
        /// The snapshot sequence number.
        seq: u64,
        /// The provider's snapshot id.
        snapshot_id: SnapshotId,
        /// Its size.
        size_bytes: u64,
        /// When the provider will expire it.
        expires_at: Option<Millis>,
        /// What it could not keep (`path: reason`); absent from journals written before it
        /// existed and when nothing was left out.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        omitted: Vec<String>,
        /// What the platform reported of the session the snapshot stopped (Vercel's session
        /// object: active CPU, vCPUs, memory, start and stop). Journaled as it arrives so that
        /// the cost ledger (`taskbox cost`) is computed from the journal alone. Absent where the
        /// provider reports none (the local backend) and in journals written before it existed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<SessionUsage>,
        /// What the sandbox's processes used over its life, read just before the snapshot
        /// stopped them (the local backend's cgroups): the generation's resources, journaled as
        /// it ends. Absent where not measured and in journals written before it existed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resources: Option<Resources>,
    },
    /// `TakeSnapshot` failed.
    SnapshotFailed {
        /// The snapshot sequence number.
        seq: u64,
        /// Why.
        failure: Failure,
    },
    /// `StopSandbox` completed.
    SandboxStopped {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// What the platform reported of the session it stopped, as [`Event::SnapshotTaken`]'s
        /// `usage` (for `taskbox cost`). Absent where the provider reports none and in journals
        /// written before it existed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<SessionUsage>,
    },
    /// `StopSandbox` failed (left for the reconciler).
    StopFailed {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// Why.
        failure: Failure,
    },
    /// `ExtendTimeout` succeeded.
    TimeoutExtended {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The new deadline.
        deadline: Millis,
    },
    /// `ExtendTimeout` failed (the plan cap, or an error): a checkpoint is due instead.
    ExtendFailed {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// Why.
        failure: Failure,
    },
    /// `DeleteSnapshot` completed.
    SnapshotDeleted {
        /// The snapshot.
        snapshot_id: SnapshotId,
    },
    /// `DeleteSnapshot` found another task still retaining the snapshot: this task's record of
    /// it is dropped, the snapshot itself is left to that task.
    SnapshotReleased {
        /// The snapshot.
        snapshot_id: SnapshotId,
        /// A task that still retains it.
        held_by: TaskId,
    },
    /// `DeleteSnapshot` failed; retried later.
    DeleteFailed {
        /// The snapshot.
        snapshot_id: SnapshotId,
        /// Why.
        failure: Failure,
    },
    /// `ProbeSandbox` answered.
    SandboxProbed {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// Whether it is still running; with its deadline when it is.
        alive: Option<Millis>,
        /// When it is not: the snapshot the platform took of it as it stopped (a persistent
        /// Vercel sandbox), which then holds its files. Absent otherwise, and in journals
        /// written before it existed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        platform_snapshot: Option<PlatformSnapshot>,
        /// When it is not: what the platform reported of the session that ended (it timed out,
        /// stopped and snapshotted itself, or was stopped), as [`Event::SnapshotTaken`]'s
        /// `usage`, so that a session ended without a taskbox snapshot is in the cost ledger
        /// too. Absent when none was reported (a session gone without a trace) and in
        /// journals written before it existed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<SessionUsage>,
    },
    /// `ProbeSandbox` got no answer: whether the sandbox lives is unknown.
    ProbeFailed {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// Why.
        failure: Failure,
    },
    /// `ReadUsage` answered: what the platform reports the session used, as
    /// [`Event::SnapshotTaken`]'s `usage`; `None` when it could not be read (the ledger then
    /// counts the session's usage as unknown). Absorbed in every state: the ledger reads it.
    UsageRead {
        /// The session.
        sandbox_id: SandboxId,
        /// What it used, when the platform answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<SessionUsage>,
    },
    /// `SampleActivity` answered: what the sandbox's processes used so far; `None` when it
    /// could not be read (then the sandbox counts as idle, as without sampling).
    ActivitySampled {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// Its counters, when read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resources: Option<Resources>,
    },
    /// A timer fired.
    TimerFired {
        /// Which one.
        timer: TimerKind,
    },
    /// The engine loaded this task from the store: the first event of every process that
    /// drives it (after `SettingsChanged` when the configuration changed). `step` decides what
    /// to recover — the operation in flight is re-issued, a running command is reported
    /// interrupted and the sandbox probed, with requests waiting for the probe — and absorbs
    /// the event when nothing was in flight.
    Loaded,
    /// What engines wrote before [`Event::Loaded`], only when a loaded task needed recovery,
    /// and while they held requests for the probe themselves (outside the journal). Never
    /// written any more; kept so that their journals replay exactly: the same recovery as
    /// `Loaded`, without the probe wait.
    Recovered,
}

impl Event {
    /// A short name for logs and journal columns.
    pub fn name(&self) -> &'static str {
        match self {
            Event::RunRequested { .. } => "run_requested",
            Event::SuspendRequested { .. } => "suspend_requested",
            Event::ResumeRequested { .. } => "resume_requested",
            Event::ForkRequested { .. } => "fork_requested",
            Event::CheckpointRequested { .. } => "checkpoint_requested",
            Event::RewindRequested { .. } => "rewind_requested",
            Event::CheckpointUnchanged { .. } => "checkpoint_unchanged",
            Event::Forked { .. } => "forked",
            Event::SettingsChanged { .. } => "settings_changed",
            Event::SandboxReady { .. } => "sandbox_ready",
            Event::CreateFailed { .. } => "create_failed",
            Event::CommandExited { .. } => "command_exited",
            Event::CommandFailed { .. } => "command_failed",
            Event::CommandNotStarted { .. } => "command_not_started",
            Event::SnapshotTaken { .. } => "snapshot_taken",
            Event::SnapshotFailed { .. } => "snapshot_failed",
            Event::SandboxStopped { .. } => "sandbox_stopped",
            Event::StopFailed { .. } => "stop_failed",
            Event::TimeoutExtended { .. } => "timeout_extended",
            Event::ExtendFailed { .. } => "extend_failed",
            Event::SnapshotDeleted { .. } => "snapshot_deleted",
            Event::SnapshotReleased { .. } => "snapshot_released",
            Event::DeleteFailed { .. } => "delete_failed",
            Event::SandboxProbed { .. } => "sandbox_probed",
            Event::ProbeFailed { .. } => "probe_failed",
            Event::UsageRead { .. } => "usage_read",
            Event::ActivitySampled { .. } => "activity_sampled",
            Event::TimerFired { .. } => "timer_fired",
            Event::Loaded => "loaded",
            Event::Recovered => "recovered",
        }
    }
}
