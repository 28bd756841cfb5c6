//! The data of the pure core: states, events, commands and the per-task record they act on.
//!
//! The task's record and what it holds are here; what happens to a task ([`Event`], in
//! `event.rs`) and what `step` emits ([`Command`], [`Reply`], in `command.rs`) are submodules,
//! re-exported so every type keeps its path.

mod activity;
mod command;
mod event;

pub use activity::{
    busy_between, sample_window_ms, Resources, SandboxActivity, BUSY_CPU_USEC_PER_SEC,
    BUSY_IO_BYTES_PER_SEC,
};
pub use command::{CheckpointOutcome, Command, Reply};
pub use event::{Event, TimerKind};

use std::collections::VecDeque;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{SandboxId, SnapshotId, TaskId};

/// Milliseconds since the UNIX epoch. The core never reads a clock; every `now` is one of these.
pub type Millis = u64;

/// Identifies one caller request (a run, a suspend or a resume) within a task.
pub type RequestId = u64;

/// The lifecycle state of a task. Exactly these six; see the module docs for the diagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// No sandbox, and nothing to restore: the next request provisions a fresh sandbox.
    Idle,
    /// A fresh sandbox is being created.
    Provisioning,
    /// A sandbox is live; commands run in it one at a time.
    Running,
    /// A snapshot of the sandbox's filesystem is being taken; the sandbox stops when it completes.
    Snapshotting,
    /// No live sandbox, but the task's files are held in its latest complete snapshot.
    Expired,
    /// A sandbox is being created from the latest complete snapshot.
    Restoring,
}

impl TaskState {
    /// All states, in lifecycle order.
    pub const ALL: [TaskState; 6] = [
        TaskState::Idle,
        TaskState::Provisioning,
        TaskState::Running,
        TaskState::Snapshotting,
        TaskState::Expired,
        TaskState::Restoring,
    ];

    /// The state's name as stored and printed (`idle`, `provisioning`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Idle => "idle",
            TaskState::Provisioning => "provisioning",
            TaskState::Running => "running",
            TaskState::Snapshotting => "snapshotting",
            TaskState::Expired => "expired",
            TaskState::Restoring => "restoring",
        }
    }

    /// Parses a stored state name.
    pub fn parse(s: &str) -> Option<TaskState> {
        TaskState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// A transient state has a provider operation in flight; a task found in one after a crash
    /// is reconciled by re-issuing that operation (all of them are idempotent by key).
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            TaskState::Provisioning | TaskState::Snapshotting | TaskState::Restoring
        )
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a provider failure is to be treated. Decided once, where a response or an I/O error is
/// turned into a typed failure (the provider modules), never re-guessed by the core.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FailureKind {
    /// Worth retrying: network errors, 5xx, 429, "still settling". `retry_after_ms` is the
    /// provider's own hint (a `Retry-After` header), honoured as a lower bound on the delay.
    Transient {
        /// The provider's `Retry-After` hint, in milliseconds.
        retry_after_ms: Option<u64>,
    },
    /// The sandbox is gone (expired at its platform timeout, stopped, or discarded).
    SandboxGone,
    /// The snapshot is gone (expired or deleted). The only answer that drops a snapshot mapping.
    SnapshotGone,
    /// Credentials are missing, wrong or expired.
    Auth,
    /// The request was rejected as invalid (bad configuration); retrying cannot help.
    Invalid,
    /// Anything else that retrying will not fix.
    Permanent,
}

/// A classified provider failure, with a message that is safe to journal (no secrets).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// How to treat it.
    pub kind: FailureKind,
    /// What happened, already scrubbed of secrets.
    pub message: String,
}

impl Failure {
    /// A transient failure with an optional retry-after hint.
    pub fn transient(message: impl Into<String>, retry_after_ms: Option<u64>) -> Failure {
        Failure {
            kind: FailureKind::Transient { retry_after_ms },
            message: message.into(),
        }
    }

    /// A failure of the given kind.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The pure retry policy: attempt number in, delay or give-up out. Jitter is added by the
/// executor (`taskbox::retry`), so the journal and replay stay deterministic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Total attempts of one operation, the first included. `1` means never retry.
    pub max_attempts: u32,
    /// Delay before the first retry.
    pub initial_delay_ms: u64,
    /// Upper bound on the computed delay (a provider's retry-after may exceed it).
    pub max_delay_ms: u64,
    /// Growth factor between consecutive delays.
    pub multiplier: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 6,
            initial_delay_ms: 200,
            max_delay_ms: 10_000,
            multiplier: 2,
        }
    }
}

/// What the retry policy says about a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryDecision {
    /// Try again after this many milliseconds (before jitter).
    RetryAfter(u64),
    /// Attempts are used up: report the last error and the count.
    GiveUp,
}

impl RetryPolicy {
    /// Decides whether attempt number `attempts_made` (1 for the first) may be followed by
    /// another, and after how long. A provider's `retry_after_ms` is honoured as a lower bound.
    pub fn decide(&self, attempts_made: u32, retry_after_ms: Option<u64>) -> RetryDecision {
        if attempts_made >= self.max_attempts {
            return RetryDecision::GiveUp;
        }
        let exp = attempts_made.saturating_sub(1).min(30);
        let base = self
            .initial_delay_ms
            .saturating_mul(u64::from(self.multiplier.max(1)).saturating_pow(exp))
            .min(self.max_delay_ms);
        RetryDecision::RetryAfter(base.max(retry_after_ms.unwrap_or(0)))
    }
}

/// The settings a task's lifecycle depends on, captured in the task so that replay sees exactly
/// what the engine saw. Updated through [`Event::SettingsChanged`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSettings {
    /// `terminal.container_persistent`: keep files in snapshots across sandboxes.
    pub persistent: bool,
    /// `terminal.sandbox_timeout_seconds` in ms: a sandbox's platform lifetime at creation.
    pub sandbox_timeout_ms: u64,
    /// `terminal.lifetime_seconds` in ms: idle time after which a sandbox is reaped.
    pub idle_lifetime_ms: u64,
    /// `terminal.timeout` in ms: the default per-command timeout.
    pub command_timeout_ms: u64,
    /// `terminal.keep_snapshots`: complete snapshots kept per task (at least 1).
    pub keep_snapshots: u32,
    /// `terminal.checkpoint_margin_seconds` in ms: how long before the deadline a checkpoint
    /// snapshot is taken when the timeout cannot be extended further.
    pub checkpoint_margin_ms: u64,
    /// `terminal.max_sandbox_lifetime_seconds` in ms: the plan's cap on a sandbox's total
    /// lifetime; extensions never go past `created_at + max_sandbox_lifetime_ms`.
    pub max_sandbox_lifetime_ms: u64,
    /// `terminal.max_busy_seconds` in ms: how long after the last command a sandbox whose
    /// processes keep working is kept from its idle snapshot (activity-aware idle). 0: idle
    /// counts from the last command only — where the provider cannot sample activity, and in
    /// journals written before it existed (absent, and not written while 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_busy_ms: u64,
    /// Retries of transient provider failures.
    pub retry: RetryPolicy,
    /// The provider keeps a sandbox's files after its deadline until it is stopped (the local
    /// backend: nothing dies at a deadline there). A sandbox found past its deadline, or
    /// reported gone, is then snapshotted first — a late checkpoint — and only a snapshot that
    /// finds the files really gone gives them up. Set from the provider, not the config;
    /// absent (false) in journals written before it existed.
    #[serde(default)]
    pub late_checkpoint: bool,
    /// The provider reports what a session used (Vercel): when a session ends without the
    /// platform being asked — its deadline passed while the engine watched, or a command or a
    /// snapshot found it gone — the engine reads its usage ([`Command::ReadUsage`]) for the
    /// cost ledger. Set from the provider, not the config; absent (false) in journals written
    /// before it existed, and not written while false, so other backends' journals read as
    /// before.
    #[serde(default, skip_serializing_if = "is_false")]
    pub reports_usage: bool,
    /// The provider can snapshot a live sandbox without stopping it (the local backend
    /// freezes its processes for the moment of the snapshot): a checkpoint then keeps the
    /// sandbox running ([`Command::TakeCheckpoint`]); elsewhere (Vercel, whose snapshot stops
    /// the VM) a checkpoint is a snapshot that stops it, and says so. Set from the provider,
    /// not the config; absent (false) in journals written before it existed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub live_checkpoint: bool,
    /// Each new snapshot record says what made it ([`SnapshotRecord::kind`]). Set by every
    /// engine that knows kinds; absent (false) in journals written before, whose records then
    /// replay without one.
    #[serde(default, skip_serializing_if = "is_false")]
    pub record_kinds: bool,
    /// `terminal.checkpoint`: checkpoints taken by themselves after commands. Absent (off) in
    /// journals written before it existed.
    #[serde(default, skip_serializing_if = "AutoCheckpoint::is_off")]
    pub checkpoint: AutoCheckpoint,
    /// `terminal.keep_checkpoints`: complete checkpoints kept per task, counted apart from the
    /// other snapshots so that they never push a suspend's snapshot out. `0` (journals written
    /// before it existed): checkpoints count with `keep_snapshots`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub keep_checkpoints: u32,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// `terminal.checkpoint`: when a live sandbox is checkpointed without being asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AutoCheckpoint {
    /// Only `taskbox checkpoint` (and a rewind) checkpoint.
    #[default]
    Off,
    /// After every command; one that changed no file costs no snapshot.
    EveryCommand,
    /// After a command that ends at least this long after the latest snapshot.
    Interval {
        /// The interval, in milliseconds.
        ms: u64,
    },
}

impl AutoCheckpoint {
    /// Whether no checkpoint is taken by itself.
    pub fn is_off(&self) -> bool {
        *self == AutoCheckpoint::Off
    }
}

impl Default for TaskSettings {
    fn default() -> Self {
        TaskSettings {
            persistent: true,
            sandbox_timeout_ms: 300_000,
            idle_lifetime_ms: 300_000,
            command_timeout_ms: 180_000,
            keep_snapshots: 2,
            checkpoint_margin_ms: 30_000,
            max_sandbox_lifetime_ms: 300_000,
            max_busy_ms: 0,
            retry: RetryPolicy::default(),
            late_checkpoint: false,
            reports_usage: false,
            live_checkpoint: false,
            record_kinds: false,
            checkpoint: AutoCheckpoint::Off,
            keep_checkpoints: 0,
        }
    }
}

/// The status of one snapshot record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotStatus {
    /// Being taken; never restored from.
    Pending,
    /// Confirmed complete by the provider: a restore candidate.
    Complete,
    /// The attempt failed or was interrupted; never restored from.
    Failed,
    /// Superseded; a delete on the provider is outstanding (retried until confirmed).
    Deleting,
    /// Deleted on the provider.
    Deleted,
    /// The provider answered "snapshot gone" (expired or deleted behind our back).
    Gone,
    /// Dropped from this task's retention while another task (a fork, or the task it was forked
    /// from) still retains the same provider snapshot: not deleted, since deleting it is the
    /// last holder's to do ([`Event::SnapshotReleased`]).
    Released,
}

impl SnapshotStatus {
    /// The status name as stored and printed.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotStatus::Pending => "pending",
            SnapshotStatus::Complete => "complete",
            SnapshotStatus::Failed => "failed",
            SnapshotStatus::Deleting => "deleting",
            SnapshotStatus::Deleted => "deleted",
            SnapshotStatus::Gone => "gone",
            SnapshotStatus::Released => "released",
        }
    }
}

/// One snapshot of a task's filesystem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// Per-task sequence number; the idempotency key of the snapshot operation.
    pub seq: u64,
    /// The provider's snapshot id, known once complete.
    pub id: Option<SnapshotId>,
    /// Where it stands.
    pub status: SnapshotStatus,
    /// Size reported by the provider.
    pub size_bytes: u64,
    /// The sandbox it was taken of.
    pub sandbox_id: SandboxId,
    /// When the attempt started.
    pub started_at: Millis,
    /// When the provider confirmed it.
    pub created_at: Option<Millis>,
    /// When the provider will expire it (`None`: never).
    pub expires_at: Option<Millis>,
    /// What the provider could not keep in it (`path: reason`), e.g. unreadable files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub omitted: Vec<String>,
    /// Set when the platform took it, not taskbox: a persistent sandbox's own snapshot when it
    /// stopped while no engine watched ([`Event::SandboxProbed`]'s `platform_snapshot`).
    /// Absent for taskbox's own snapshots (and in journals written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_by: Option<SnapshotTaker>,
    /// What made it (suspend, idle, deadline, checkpoint, rewind...), when the engine that
    /// took it recorded kinds ([`TaskSettings::record_kinds`]); absent in journals written
    /// before, and for a snapshot the platform took ([`SnapshotRecord::taken_by`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<SnapshotKind>,
}

/// What made a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// A suspend.
    Suspend,
    /// The sandbox idled for `terminal.lifetime_seconds`.
    Idle,
    /// Its deadline neared and could not be extended.
    Deadline,
    /// It was found past its deadline with its files still there.
    LateCheckpoint,
    /// A fork of the live task.
    Fork,
    /// `taskbox checkpoint`, or `terminal.checkpoint`.
    Checkpoint,
    /// The current files, kept before a rewind (rewinding to it undoes the rewind).
    Rewind,
}

impl SnapshotKind {
    /// The kind's name as stored and printed.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Suspend => "suspend",
            SnapshotKind::Idle => "idle",
            SnapshotKind::Deadline => "deadline",
            SnapshotKind::LateCheckpoint => "late_checkpoint",
            SnapshotKind::Fork => "fork",
            SnapshotKind::Checkpoint => "checkpoint",
            SnapshotKind::Rewind => "rewind",
        }
    }

    /// Whether retention counts it among the checkpoints (`terminal.keep_checkpoints`).
    pub fn is_checkpoint(self) -> bool {
        matches!(self, SnapshotKind::Checkpoint | SnapshotKind::Rewind)
    }
}

/// Who took a snapshot that taskbox did not ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotTaker {
    /// The platform (reason `platform`): a persistent sandbox snapshots itself when it stops.
    Platform,
}

/// A snapshot the platform took of a sandbox by itself, found when taskbox next looked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlatformSnapshot {
    /// The provider's snapshot id.
    pub snapshot_id: SnapshotId,
    /// Its size.
    pub size_bytes: u64,
    /// When the provider will expire it (`None`: never).
    pub expires_at: Option<Millis>,
}

/// What a platform reports a sandbox session used, as it reports it (Vercel's session object).
/// Only journaled (in [`Event::SnapshotTaken`], and [`Event::SandboxProbed`] and
/// [`Event::SandboxStopped`] for a session that ended without a snapshot); the core decides
/// nothing by it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionUsage {
    /// When the session started running (`startedAt`).
    pub started_at: Millis,
    /// When it stopped (`stoppedAt`), when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<Millis>,
    /// vCPUs provisioned.
    pub vcpus: u32,
    /// Memory provisioned, MB.
    pub memory_mb: u32,
    /// CPU time actually billed (`activeCpuDurationMs`), when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_cpu_ms: Option<u64>,
    /// Network transfer, ingress plus egress, bytes (`networkTransfer`), when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer_bytes: Option<u64>,
}

/// The task's live sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// The provider's handle for later calls (a workspace name, a Vercel session id).
    pub id: SandboxId,
    /// The sandbox's stable name (derived from task id and generation).
    pub name: String,
    /// Which creation of this task's sandbox it is.
    pub generation: u64,
    /// When it became ready.
    pub created_at: Millis,
    /// When the platform will stop it unless extended.
    pub deadline: Millis,
    /// The snapshot it was restored from, if any.
    pub source_snapshot: Option<SnapshotId>,
    /// A command was started in it: it may hold files no snapshot has. Absent (false) in
    /// journals written before it existed.
    #[serde(default)]
    pub used: bool,
    /// What its processes did, as last sampled (activity-aware idle, and the resources it used
    /// so far). Absent before the first sample, where nothing is sampled, and in journals
    /// written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<SandboxActivity>,
    /// A `SampleActivity` is out: the next command waits for its answer, so that a sample and
    /// a command never race to the provider (a re-drive makes the calls in the journal's
    /// order). Absent (false) while none is, and in journals written before it existed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub sampling: bool,
}

/// A caller's request waiting in a task's queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Request {
    /// Run `command` (a `bash -c` string) with a timeout.
    Run {
        /// Request id.
        id: RequestId,
        /// The shell command.
        command: String,
        /// Per-command timeout.
        timeout_ms: u64,
    },
    /// Snapshot (when persistent) and stop the sandbox.
    Suspend {
        /// Request id.
        id: RequestId,
    },
    /// Make a sandbox live (restoring the latest snapshot) without running anything.
    Resume {
        /// Request id.
        id: RequestId,
    },
    /// Name the snapshot a new task `child` starts from (snapshotting first when the task is
    /// live and `from` is [`ForkFrom::Latest`]).
    Fork {
        /// Request id.
        id: RequestId,
        /// The new task.
        child: TaskId,
        /// Which snapshot.
        from: ForkFrom,
    },
    /// Snapshot the live sandbox's files without stopping it.
    Checkpoint {
        /// Request id.
        id: RequestId,
    },
    /// Keep the current files in a checkpoint, then restore `to` into a new sandbox.
    Rewind {
        /// Request id.
        id: RequestId,
        /// Which snapshot.
        to: RewindTo,
    },
}

impl Request {
    /// The request's id.
    pub fn id(&self) -> RequestId {
        match self {
            Request::Run { id, .. }
            | Request::Suspend { id }
            | Request::Resume { id }
            | Request::Fork { id, .. }
            | Request::Checkpoint { id }
            | Request::Rewind { id, .. } => *id,
        }
    }
}

/// Which of a task's snapshots a rewind restores.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RewindTo {
    /// The task's snapshot with this sequence number (`demo.s3`).
    Seq {
        /// The sequence number.
        seq: u64,
    },
    /// The task's snapshot with this provider id.
    Id {
        /// The provider's snapshot id.
        snapshot_id: SnapshotId,
    },
    /// `n` complete snapshots before the one that holds the current files (which the rewind
    /// keeps first).
    Back {
        /// How many.
        n: u64,
    },
}

impl RewindTo {
    /// Reads `--to`: `<task>.s<seq>` or `s<seq>`, else a provider snapshot id.
    pub fn parse(task: &TaskId, s: &str) -> RewindTo {
        match ForkFrom::parse(task, s) {
            ForkFrom::Seq { seq } => RewindTo::Seq { seq },
            ForkFrom::Id { snapshot_id } => RewindTo::Id { snapshot_id },
            ForkFrom::Latest => RewindTo::Id {
                snapshot_id: SnapshotId::from(s),
            },
        }
    }
}

impl fmt::Display for RewindTo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RewindTo::Seq { seq } => write!(f, "snapshot seq {seq}"),
            RewindTo::Id { snapshot_id } => write!(f, "snapshot {snapshot_id}"),
            RewindTo::Back { n } => write!(f, "{n} snapshot(s) back"),
        }
    }
}

/// A rewind whose restore is in flight: answered when the restored sandbox is ready.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rewinding {
    /// The rewind request.
    pub request_id: RequestId,
    /// The snapshot being restored.
    pub to: SnapshotId,
    /// Its sequence number.
    pub to_seq: u64,
    /// The snapshot holding the files as they were before the rewind (rewinding to it undoes
    /// this rewind).
    pub saved: Option<SnapshotId>,
    /// Its sequence number.
    pub saved_seq: Option<u64>,
}

/// Which of a task's snapshots a fork starts from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ForkFrom {
    /// The latest complete snapshot; a live task is snapshotted first, so the fork has the
    /// files as they are now.
    Latest,
    /// The task's complete snapshot with this sequence number (`demo.s3` on the command line).
    Seq {
        /// The sequence number.
        seq: u64,
    },
    /// The task's complete snapshot with this provider id.
    Id {
        /// The provider's snapshot id.
        snapshot_id: SnapshotId,
    },
}

impl ForkFrom {
    /// Reads the snapshot a fork of `task` names: `latest`; `<task>.s<seq>` or `s<seq>` (the
    /// task's snapshot by sequence number, as `taskbox show` numbers them); anything else is a
    /// provider snapshot id.
    pub fn parse(task: &TaskId, s: &str) -> ForkFrom {
        let seq = |rest: &str| {
            (!rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
                .then(|| rest.parse::<u64>().ok())
                .flatten()
        };
        if s == "latest" {
            return ForkFrom::Latest;
        }
        let short = s
            .strip_prefix(task.as_str())
            .and_then(|r| r.strip_prefix(".s"))
            .or_else(|| s.strip_prefix('s'));
        match short.and_then(seq) {
            Some(seq) => ForkFrom::Seq { seq },
            None => ForkFrom::Id {
                snapshot_id: SnapshotId::from(s),
            },
        }
    }
}

impl fmt::Display for ForkFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ForkFrom::Latest => f.write_str("the latest snapshot"),
            ForkFrom::Seq { seq } => write!(f, "snapshot seq {seq}"),
            ForkFrom::Id { snapshot_id } => write!(f, "snapshot {snapshot_id}"),
        }
    }
}

/// Where a forked task came from: recorded by [`Event::Forked`], never changed after.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lineage {
    /// The task it was forked from.
    pub parent: TaskId,
    /// The parent's snapshot it starts from (shared with the parent on the provider).
    pub snapshot: SnapshotId,
    /// That snapshot's sequence number in the parent.
    pub parent_seq: u64,
    /// When the fork was made.
    pub forked_at: Millis,
}

/// A command currently executing in the sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningCommand {
    /// The request it serves.
    pub request_id: RequestId,
    /// The shell command (reported if the sandbox expires under it).
    pub command: String,
    /// Its timeout.
    pub timeout_ms: u64,
    /// When it was started.
    pub started_at: Millis,
}

/// Why a snapshot is being taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SnapshotReason {
    /// A caller asked to suspend.
    Suspend {
        /// The suspend request.
        request_id: RequestId,
    },
    /// The sandbox was idle for `idle_lifetime_ms`.
    IdleReap,
    /// Its processes were still busy `max_busy_ms` after the last command: activity-aware
    /// idle kept it that long and no longer.
    BusyCap,
    /// The deadline is near and the timeout cannot be extended further.
    Checkpoint,
    /// The sandbox is past its deadline (or was reported gone) on a provider that keeps its
    /// files ([`TaskSettings::late_checkpoint`]): save them before giving the sandbox up.
    LateCheckpoint {
        /// The deadline it passed.
        deadline: Millis,
    },
    /// A caller asked to fork the live task: the fork starts from this snapshot.
    Fork {
        /// The fork request.
        request_id: RequestId,
    },
    /// A checkpoint: `taskbox checkpoint` (`request_id`) or `terminal.checkpoint` (none).
    /// `live`: the sandbox keeps running ([`Command::TakeCheckpoint`]); otherwise the
    /// platform's snapshot stops it.
    Checkpointing {
        /// The checkpoint request, if a caller asked.
        request_id: Option<RequestId>,
        /// Whether the sandbox keeps running.
        live: bool,
    },
    /// The current files, kept before the rewind waiting at the front of the queue.
    Rewind {
        /// The rewind request.
        request_id: RequestId,
        /// Whether the sandbox keeps running (until the rewind replaces it).
        live: bool,
    },
}

impl SnapshotReason {
    /// What a snapshot taken for this reason is, as its record says.
    pub fn kind(self) -> SnapshotKind {
        match self {
            SnapshotReason::Suspend { .. } => SnapshotKind::Suspend,
            // Idleness too: the rule that kept a busy sandbox ran out.
            SnapshotReason::IdleReap | SnapshotReason::BusyCap => SnapshotKind::Idle,
            SnapshotReason::Checkpoint => SnapshotKind::Deadline,
            SnapshotReason::LateCheckpoint { .. } => SnapshotKind::LateCheckpoint,
            SnapshotReason::Fork { .. } => SnapshotKind::Fork,
            SnapshotReason::Checkpointing { .. } => SnapshotKind::Checkpoint,
            SnapshotReason::Rewind { .. } => SnapshotKind::Rewind,
        }
    }

    /// Whether the snapshot keeps the sandbox running.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            SnapshotReason::Checkpointing { live: true, .. }
                | SnapshotReason::Rewind { live: true, .. }
        )
    }
}

/// Something the caller of the next command should know: reported once, with the next reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Notice {
    /// A new sandbox was created for the task; live processes from before are gone.
    Recreated {
        /// The snapshot its files came from (`None`: started fresh).
        from_snapshot: Option<SnapshotId>,
        /// When that snapshot was taken. Absent in journals written before it existed.
        #[serde(default)]
        taken_at: Option<Millis>,
        /// Files written after that snapshot are gone: the sandbox that held them ended without
        /// a snapshot of it, or the restore fell back to an older snapshot. `false`: the files
        /// are back as they were last written.
        #[serde(default)]
        changes_lost: bool,
    },
    /// The sandbox was found past its deadline with its files still there (see
    /// [`TaskSettings::late_checkpoint`]); they were kept in this snapshot.
    LateCheckpoint {
        /// The snapshot holding them.
        snapshot_id: SnapshotId,
        /// The deadline the sandbox had passed.
        deadline: Millis,
    },
    /// The sandbox expired at its platform deadline (or stopped before it).
    SandboxExpired {
        /// When: its deadline, or the moment it was found gone if that came first.
        at: Millis,
    },
    /// Files were lost: no retained snapshot could be restored.
    FilesLost {
        /// Why.
        reason: String,
    },
}

/// Everything the core knows about one task. The store persists it whole with each transition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// The task id (validated once, where it came in; see [`crate::TaskId`]).
    pub id: TaskId,
    /// Lifecycle state.
    pub state: TaskState,
    /// Settings in force.
    pub settings: TaskSettings,
    /// Sandbox creations so far; the current or next sandbox's generation.
    pub generation: u64,
    /// The live sandbox, in `running` and `snapshotting`.
    pub sandbox: Option<SandboxRecord>,
    /// The snapshot a `restoring` task is being restored from.
    pub restore_source: Option<SnapshotId>,
    /// Every snapshot record, oldest first.
    pub snapshots: Vec<SnapshotRecord>,
    /// Why the current snapshot (the last record, `pending`) is being taken.
    pub snapshot_reason: Option<SnapshotReason>,
    /// Requests waiting their turn.
    pub queue: VecDeque<Request>,
    /// The command executing now, in `running`.
    pub running: Option<RunningCommand>,
    /// Attempts made of the operation in flight (persisted: a restart does not reset it).
    pub attempts: u32,
    /// When the operation in flight is due to be retried after a transient failure.
    pub retry_at: Option<Millis>,
    /// The highest request id seen; request ids must grow.
    pub last_request_id: RequestId,
    /// Last time a command started or finished (the idle reaper's clock).
    pub last_activity: Millis,
    /// A checkpoint fell due while a command was running: take it when the command ends.
    pub checkpoint_due: bool,
    /// Notices for the next reply.
    pub notices: Vec<Notice>,
    /// When the task was created.
    pub created_at: Millis,
    /// A `running` task was loaded after a restart and its sandbox is being probed: requests
    /// wait in the queue until the probe answers, so that a sandbox which died meanwhile is
    /// restored before a command lands in it. The probe is the operation in flight (`attempts`,
    /// `retry_at`). Absent (false) in journals written before it existed.
    #[serde(default)]
    pub probing: bool,
    /// The next restore brings back files older than the last ones written: a sandbox that ran
    /// commands ended without a snapshot of it, or a restore fell back to an older snapshot. The
    /// next [`Notice::Recreated`] says so. Absent (false) in journals written before it existed.
    #[serde(default)]
    pub files_behind: bool,
    /// When this task's sandboxes were created, within the last minute (see
    /// [`MAX_CREATES_PER_MINUTE`]). Absent (empty) in journals written before it existed.
    #[serde(default)]
    pub recent_creates: Vec<Millis>,
    /// The task it was forked from, and the snapshot it started from (`None`: not a fork).
    /// Absent in journals written before forks existed, and for tasks that are not forks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
    /// The snapshot the task's files were rewound to, while no newer snapshot holds them: a
    /// restore uses it rather than the latest (the checkpoint the rewind kept), and retention
    /// keeps it. Absent otherwise, and in journals written before rewinds existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewound_to: Option<SnapshotId>,
    /// The snapshot the last rewind kept the files from before in (rewinding to it undoes the
    /// rewind), for as long as [`Task::rewound_to`] stands: retention keeps it. Absent
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewind_saved: Option<SnapshotId>,
    /// A rewind whose restore is in flight. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewinding: Option<Rewinding>,
}

/// The most sandboxes the core creates for one task in a minute, whatever the configuration
/// says: a sandbox that is gone as soon as it is made (a zero timeout, a platform that stops it
/// at once) must not turn into a create loop. A request that would need one more is answered
/// with an error instead.
pub const MAX_CREATES_PER_MINUTE: usize = 20;

impl Task {
    /// A new idle task.
    pub fn new(id: TaskId, settings: TaskSettings, now: Millis) -> Task {
        Task {
            id,
            state: TaskState::Idle,
            settings,
            generation: 0,
            sandbox: None,
            restore_source: None,
            snapshots: Vec::new(),
            snapshot_reason: None,
            queue: VecDeque::new(),
            running: None,
            attempts: 0,
            retry_at: None,
            last_request_id: 0,
            last_activity: now,
            checkpoint_due: false,
            notices: Vec::new(),
            created_at: now,
            probing: false,
            files_behind: false,
            recent_creates: Vec::new(),
            lineage: None,
            rewound_to: None,
            rewind_saved: None,
            rewinding: None,
        }
    }

    /// The snapshot a restore uses: the one the files were rewound to, while no newer one
    /// holds them, else the latest complete one.
    pub fn restore_point(&self) -> Option<&SnapshotRecord> {
        self.rewound_to
            .as_ref()
            .and_then(|id| {
                self.snapshots
                    .iter()
                    .find(|s| s.id.as_ref() == Some(id) && s.status == SnapshotStatus::Complete)
            })
            .or_else(|| self.latest_complete())
    }

    /// The latest complete snapshot: the one a restore must use.
    pub fn latest_complete(&self) -> Option<&SnapshotRecord> {
        self.snapshots
            .iter()
            .rev()
            .find(|s| s.status == SnapshotStatus::Complete)
    }

    /// Whether the task keeps the provider snapshot `id` for itself (a record of it complete,
    /// or pending): what makes a task one of the snapshot's holders, whose delete of a shared
    /// snapshot becomes a release while another holds it ([`crate::retention::task_holds`]).
    pub fn holds_snapshot(&self, id: &str) -> bool {
        crate::retention::task_holds(self, id)
    }

    /// Snapshots retained on the provider (complete, or superseded but not yet deleted):
    /// [`crate::retention::on_provider`].
    pub fn retained_snapshot_ids(&self) -> impl Iterator<Item = &SnapshotId> {
        self.snapshots
            .iter()
            .filter(|s| crate::retention::on_provider(s.status))
            .filter_map(|s| s.id.as_ref())
    }
}
