//! Sandbox providers: the only code that knows processes (local), HTTP (vercel_sandbox) or a
//! simulated world (sim). The engine talks to them through [`SandboxProvider`].
//!
//! A platform implements [`Platform`] (plain `async fn`s, its own typed error) and is a
//! [`SandboxProvider`] by the blanket implementation in `platform.rs`; the [`registry`] says
//! what config, `doctor`, `cost` and `export-snapshot` need of each backend; and
//! `tests/it/provider_contract.rs` holds every provider to the promises below.
//!
//! Every operation except [`SandboxProvider::exec`] is idempotent by its key, which is what lets
//! the engine recover from a crash by re-issuing the operation that was in flight:
//! - `create_sandbox` by the sandbox name (task id + generation): a second call finds the first
//!   sandbox instead of creating another;
//! - `snapshot` by (task id, seq): a second call returns the snapshot the first one took;
//! - `stop_sandbox`, `delete_snapshot`: stopping a stopped sandbox or deleting a deleted snapshot
//!   succeeds.

mod call;
mod decorator;
pub mod live;
mod platform;
pub mod registry;
// Providers are where processes and waiting on the platform live: `local` spawns `bash` and
// polls its processes, `sim` sleeps its latencies on (paused) tokio time, `vercel` waits out
// retry-afters and long polls.
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
pub mod local;
#[allow(clippy::disallowed_methods)]
pub mod sim;
#[allow(clippy::disallowed_methods)]
pub mod vercel;

pub use call::{Call, ReceivedCall};
pub use decorator::Decorator;
pub use live::{CancelSignal, Canceller, ExecIo, OutputChunk, OutputStream};
pub use platform::{Platform, PlatformError};
pub use registry::{from_config, SetupError};

/// Every backend, one line each: its folder's [`registry::Entry`]. A new backend is its folder
/// (declared above) and its line here; the [`registry`] answers for them all. (The list sits
/// here, not in the registry, which each backend's entry names: no import circle.)
pub const BACKENDS: &[&registry::Entry] = &[&local::BACKEND, &vercel::BACKEND];

/// Every backend's note about snapshot archives of another installation under the data dir
/// ([`registry::take_foreign_notes`]), one line per backend that keeps archives there (its
/// [`registry::Entry::foreign`]). A list apart from [`BACKENDS`] because `taskbox run`'s fast
/// path takes these notes: naming the backends' entries would link every backend's provider
/// (the local sandboxes, the Vercel client with its HTTP and TLS stacks) into the small front
/// binary, whose start is most of what a warm command costs (ARCHITECTURE.md, "The CLI's fast
/// path"; at 7a55a34 it grew from 1,745 to 13,779 relocations that way).
pub const FOREIGN_NOTES: &[registry::TakeNote] = &[local::take_foreign_note];

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

use crate::core::{Failure, FailureKind, Millis};
use crate::ids::{SandboxId, SnapshotId, TaskId};

/// The boxed future every provider operation returns (keeps the trait object-safe).
pub type ProviderFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, ProviderError>> + Send + 'a>>;

/// A provider failure, classified once where it arises.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{operation}: {message}")]
pub struct ProviderError {
    /// How to treat it.
    pub kind: FailureKind,
    /// The operation that failed (`create sandbox`, `run command`, ...).
    pub operation: &'static str,
    /// What happened; never contains a secret.
    pub message: String,
    /// An `exec` that failed before its command started (the run request itself was refused):
    /// the command provably never ran. See [`ProviderError::before_start`].
    pub not_started: bool,
}

impl ProviderError {
    /// A failure of `kind` during `operation`.
    pub fn new(kind: FailureKind, operation: &'static str, message: impl Into<String>) -> Self {
        ProviderError {
            kind,
            operation,
            message: message.into(),
            not_started: false,
        }
    }

    /// Marks an `exec` failure that came before the command started (the request to run it was
    /// refused, or the sandbox was found stopped first): the engine may run the command again,
    /// on a restored sandbox if this one is gone ([`Event::CommandNotStarted`]). Only for
    /// answers that prove the command never ran — never for a cut stream.
    ///
    /// [`Event::CommandNotStarted`]: crate::core::Event::CommandNotStarted
    pub fn before_start(mut self) -> Self {
        self.not_started = true;
        self
    }

    /// A transient failure (worth a retry), with the provider's retry-after hint if any.
    pub fn transient(
        operation: &'static str,
        message: impl Into<String>,
        retry_after_ms: Option<u64>,
    ) -> Self {
        Self::new(
            FailureKind::Transient { retry_after_ms },
            operation,
            message,
        )
    }

    /// The sandbox is gone.
    pub fn sandbox_gone(operation: &'static str, message: impl Into<String>) -> Self {
        Self::new(FailureKind::SandboxGone, operation, message)
    }

    /// The snapshot is gone.
    pub fn snapshot_gone(operation: &'static str, message: impl Into<String>) -> Self {
        Self::new(FailureKind::SnapshotGone, operation, message)
    }

    /// Whether a retry may help.
    pub fn is_transient(&self) -> bool {
        matches!(self.kind, FailureKind::Transient { .. })
    }

    /// The core's view of this failure.
    pub fn to_failure(&self) -> Failure {
        Failure::new(self.kind.clone(), self.to_string())
    }
}

/// What to create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The owning task.
    pub task_id: TaskId,
    /// Which creation of the task's sandbox this is.
    pub generation: u64,
    /// The stable name: [`sandbox_name`] of the installation, task id and generation.
    pub name: String,
    /// Restore from this snapshot, or start fresh.
    pub source_snapshot: Option<SnapshotId>,
    /// Platform lifetime from creation.
    pub timeout_ms: u64,
    /// The installation that owns it (a tag on the sandbox, for the reconciler).
    pub installation_id: String,
}

impl SandboxSpec {
    /// The spec of `task_id`'s sandbox number `generation` for `installation_id`, named by
    /// [`sandbox_name`].
    pub fn new(
        installation_id: &str,
        task_id: &TaskId,
        generation: u64,
        source_snapshot: Option<SnapshotId>,
        timeout_ms: u64,
    ) -> SandboxSpec {
        SandboxSpec {
            task_id: task_id.clone(),
            generation,
            name: sandbox_name(installation_id, task_id, generation),
            source_snapshot,
            timeout_ms,
            installation_id: installation_id.to_string(),
        }
    }
}

pub use crate::ids::{installation_prefix, parse_sandbox_name, sandbox_name};

/// A created (or found) sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxInfo {
    /// The handle for later calls.
    pub id: SandboxId,
    /// Its name.
    pub name: String,
    /// When the platform stops it.
    pub deadline: Millis,
}

/// One command to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// The `bash -c` command string.
    pub command: String,
    /// Kill it (the command, not the sandbox) after this long; the result then has exit 124.
    pub timeout_ms: u64,
}

/// A finished command.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutput {
    /// Exit code; 124 when the timeout killed it.
    pub exit_code: i32,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// Captured stdout, bounded (see [`bound_output`]).
    pub stdout: String,
    /// Captured stderr, bounded.
    pub stderr: String,
    /// Wall time.
    pub duration_ms: u64,
    /// The captured stdout's bytes when they are not UTF-8 (bounded by bytes, see
    /// [`live::bound_bytes`]); `stdout` is then their lossy text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_bytes: Option<Vec<u8>>,
    /// The captured stderr's bytes when they are not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_bytes: Option<Vec<u8>>,
    /// Whether the capture of stdout dropped its middle.
    #[serde(default)]
    pub stdout_truncated: bool,
    /// Whether the capture of stderr dropped its middle.
    #[serde(default)]
    pub stderr_truncated: bool,
    /// Whether the sandbox's memory limit killed a process of the command while it ran (an
    /// isolated local sandbox; its stderr ends with a note saying so).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory_killed: bool,
}

/// A snapshot as the provider reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// Provider id.
    pub id: SnapshotId,
    /// Size.
    pub size_bytes: u64,
    /// Expiry (`None`: never).
    pub expires_at: Option<Millis>,
    /// What the snapshot could not keep (`path: reason`), e.g. unreadable files; everything
    /// else is in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub omitted: Vec<String>,
    /// What the platform reported of the session the snapshot stopped (`None`: nothing
    /// reported, as on the local backend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::core::SessionUsage>,
    /// What the sandbox's processes used over its life, read before the snapshot stopped them
    /// ([`SandboxProvider::resources`]; `None`: not measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<crate::core::Resources>,
}

/// A provider resource listed for reconciliation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedResource {
    /// Provider id (sandbox handle or snapshot id).
    pub id: String,
    /// The task that owns it, from its tags or name.
    pub task_id: Option<String>,
    /// Whether it is still running (sandboxes) or present (snapshots).
    pub live: bool,
}

/// A sandbox platform.
pub trait SandboxProvider: Send + Sync {
    /// The backend name (`local`, `vercel_sandbox`, `sim`).
    fn name(&self) -> &'static str;

    /// Creates the sandbox named `spec.name` (or finds it, if a create was already made).
    /// A missing source snapshot is [`FailureKind::SnapshotGone`].
    fn create_sandbox<'a>(&'a self, spec: &'a SandboxSpec) -> ProviderFuture<'a, SandboxInfo>;

    /// Runs one command; cancelling by timeout kills the command, never the sandbox.
    /// A sandbox that is gone (or expires under the command) is [`FailureKind::SandboxGone`].
    /// It is [`SandboxProvider::exec_live`] with no live side.
    fn exec<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        req: &'a ExecRequest,
    ) -> ProviderFuture<'a, ExecOutput> {
        self.exec_live(sandbox_id, req, ExecIo::default())
    }

    /// [`SandboxProvider::exec`] with its live side: output forwarded to `io.output` as it is
    /// produced, `io.stdin` as the command's stdin, and `io.cancel` signalling the command (its
    /// process group, never the sandbox; what the command then exits with is its result). The
    /// result still carries the bounded capture. A platform without a live side forwards the
    /// captured output once the command has run ([`ExecIo::forward_capture`]).
    fn exec_live<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        req: &'a ExecRequest,
        io: ExecIo,
    ) -> ProviderFuture<'a, ExecOutput>;

    /// Snapshots the sandbox's filesystem and stops it. Idempotent by (`task_id`, `seq`).
    fn snapshot<'a>(
        &'a self,
        task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
        seq: u64,
    ) -> ProviderFuture<'a, SnapshotInfo>;

    /// Snapshots the live sandbox's files without stopping it: its processes are paused for
    /// the moment of the snapshot (so nothing they write lands half in it) and run on with
    /// the same pids, open files and sockets. Idempotent by (`task_id`, `seq`). `Ok(None)`:
    /// nothing changed since `previous` (the task's latest snapshot), and nothing was made.
    /// Only called where [`Self::checkpoints_live`] says so; the default refuses.
    fn checkpoint<'a>(
        &'a self,
        task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
        seq: u64,
        previous: Option<&'a SnapshotId>,
    ) -> ProviderFuture<'a, Option<SnapshotInfo>> {
        let _ = (task_id, sandbox_id, seq, previous);
        let name = self.name();
        Box::pin(async move {
            Err(ProviderError::new(
                FailureKind::Invalid,
                "checkpoint",
                format!("the {name} backend cannot snapshot a sandbox without stopping it"),
            ))
        })
    }

    /// Whether [`Self::checkpoint`] snapshots a live sandbox without stopping it (the local
    /// backend). Elsewhere a checkpoint is a snapshot that stops the sandbox, and says so
    /// ([`TaskSettings::live_checkpoint`]). The default: no.
    ///
    /// [`TaskSettings::live_checkpoint`]: crate::core::TaskSettings::live_checkpoint
    fn checkpoints_live(&self) -> bool {
        false
    }

    /// Stops the sandbox (its files are discarded). Stopping a gone sandbox succeeds.
    fn stop_sandbox<'a>(&'a self, sandbox_id: &'a SandboxId) -> ProviderFuture<'a, ()>;

    /// Extends the sandbox's lifetime by `duration_ms`; returns the new deadline.
    fn extend_timeout<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        duration_ms: u64,
    ) -> ProviderFuture<'a, Millis>;

    /// Deletes a snapshot. Deleting a gone snapshot succeeds.
    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a SnapshotId) -> ProviderFuture<'a, ()>;

    /// Whether the sandbox still runs: `Some(deadline)` if it does.
    fn probe_sandbox<'a>(&'a self, sandbox_id: &'a SandboxId)
        -> ProviderFuture<'a, Option<Millis>>;

    /// After [`Self::probe_sandbox`] found `task_id`'s sandbox not running: the complete
    /// snapshot the platform took of it by itself as it stopped, if the platform does that
    /// (a persistent Vercel sandbox); it then holds the sandbox's files. The default: none.
    fn platform_snapshot<'a>(
        &'a self,
        task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<crate::core::PlatformSnapshot>> {
        let _ = (task_id, sandbox_id);
        Box::pin(async { Ok(None) })
    }

    /// What the platform reports a session that ended used (Vercel's session object), so that
    /// a session ended without a taskbox snapshot is in the cost ledger too: asked after
    /// [`Self::probe_sandbox`] found a sandbox not running, after [`Self::stop_sandbox`]
    /// stopped it (both may answer from what that call read), and for a session that ended
    /// without the platform being asked ([`Self::reports_usage`]). Reading it may fail; the
    /// caller then journals none. The default: none (the local and simulated backends report
    /// no platform usage).
    fn session_usage<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<crate::core::SessionUsage>> {
        let _ = sandbox_id;
        Box::pin(async { Ok(None) })
    }

    /// What a live sandbox's processes used so far ([`Resources`](crate::core::Resources),
    /// cumulative over the sandbox's life), read from outside it: activity-aware idle compares
    /// two readings, and `show` and `cost` report the last one. `None` where nothing can be
    /// measured. The default: none (a platform that cannot be measured from outside).
    fn resources<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<crate::core::Resources>> {
        let _ = sandbox_id;
        Box::pin(async { Ok(None) })
    }

    /// This installation's sandboxes (found by tag), for the reconciler.
    fn list_sandboxes<'a>(
        &'a self,
        installation_id: &'a str,
    ) -> ProviderFuture<'a, Vec<ListedResource>>;

    /// This installation's snapshots, for the reconciler.
    fn list_snapshots<'a>(
        &'a self,
        installation_id: &'a str,
    ) -> ProviderFuture<'a, Vec<ListedResource>>;

    /// Removes leftovers of interrupted operations that no listing shows (half-written archives,
    /// half-restored workspaces); returns how many. Platforms that keep none need not override.
    fn sweep_temporaries(&self) -> ProviderFuture<'_, usize> {
        Box::pin(async { Ok(0) })
    }

    /// Whether a sandbox's files outlive its deadline until it is stopped or snapshotted (the
    /// local backend: nothing dies at a deadline there). The engine then snapshots a sandbox
    /// found past its deadline before giving it up ([`TaskSettings::late_checkpoint`]), so
    /// `snapshot` must accept a sandbox past its deadline whose files are still there, and
    /// answer [`FailureKind::SandboxGone`] only when they are not.
    ///
    /// [`TaskSettings::late_checkpoint`]: crate::core::TaskSettings::late_checkpoint
    fn keeps_files_after_deadline(&self) -> bool {
        false
    }

    /// Whether [`Self::session_usage`] can read what a session used from the platform (Vercel).
    /// The engine then asks for it when a session ends without the platform being asked (its
    /// deadline passed, a command or a snapshot found it gone: [`TaskSettings::reports_usage`]).
    /// The default: no (the local and simulated backends report no platform usage).
    ///
    /// [`TaskSettings::reports_usage`]: crate::core::TaskSettings::reports_usage
    fn reports_usage(&self) -> bool {
        false
    }

    /// Whether [`Self::resources`] can tell a sandbox's busy processes from idle ones (CPU time
    /// or IO). The engine then keeps a busy sandbox from its idle snapshot, up to
    /// `terminal.max_busy_seconds` ([`TaskSettings::max_busy_ms`]); where not, idle counts from
    /// the last command only. The default: no.
    ///
    /// [`TaskSettings::max_busy_ms`]: crate::core::TaskSettings::max_busy_ms
    fn measures_activity(&self) -> bool {
        false
    }
}

/// Bounds captured output the way Hermes does: at most `max_chars` characters, keeping the first
/// 40 % and the last 60 %, with a line in between saying how much was cut.
pub fn bound_output(text: &str, max_chars: usize) -> String {
    let total = text.chars().count();
    if total <= max_chars {
        return text.to_string();
    }
    let head_n = max_chars * 2 / 5;
    let tail_n = max_chars - head_n;
    let head: String = text.chars().take(head_n).collect();
    let tail: String = text.chars().skip(total - tail_n).collect();
    format!(
        "{head}\n[taskbox: output truncated, {} of {total} characters omitted]\n{tail}",
        total - head_n - tail_n
    )
}

/// The default bound on captured output per stream (Hermes's 50,000 characters).
pub const MAX_OUTPUT_CHARS: usize = 50_000;
