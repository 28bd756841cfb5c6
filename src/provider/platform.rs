//! [`Platform`]: the contract a sandbox platform implements, in plain `async fn`s failing with
//! its own typed error; the blanket implementation below makes every platform a
//! [`SandboxProvider`] (the object-safe, boxed form the engine holds).
//!
//! The glue is written once here: each operation's future is boxed and its error turned into a
//! [`ProviderError`] that names the operation (`create sandbox`, `run command`, ...). A new
//! platform implements [`Platform`], registers in [`super::registry`], and runs the contract
//! suite (`tests/it/provider_contract.rs`).

use std::future::Future;

use super::{
    ExecIo, ExecOutput, ExecRequest, ListedResource, ProviderError, ProviderFuture, SandboxInfo,
    SandboxProvider, SandboxSpec, SnapshotInfo,
};
use crate::core::{Millis, PlatformSnapshot, Resources, SessionUsage};
use crate::ids::{SandboxId, SnapshotId, TaskId};

/// A platform's own error: it says, once, where it arises, whether the failure is retryable
/// ([`FailureKind::Transient`](crate::core::FailureKind::Transient)), a resource that is gone (`SandboxGone`, `SnapshotGone`) or a failure a retry cannot fix, by becoming a
/// [`ProviderError`] that names the operation that failed (a [`ProviderError`] already names
/// it).
pub trait PlatformError: Send {
    /// The provider error for a failure of `operation` (`create sandbox`, `run command`, ...).
    fn into_provider(self, operation: &'static str) -> ProviderError;
}

impl PlatformError for ProviderError {
    fn into_provider(self, _operation: &'static str) -> ProviderError {
        self
    }
}

/// A sandbox platform, as it implements the provider contract. The promises are
/// [`SandboxProvider`]'s (each method there says its own); the contract suite holds every
/// platform to them.
pub trait Platform: Send + Sync {
    /// The platform's typed failure.
    type Error: PlatformError;

    /// The backend name (`local`, `vercel_sandbox`, `sim`).
    fn name(&self) -> &'static str;

    /// See [`SandboxProvider::create_sandbox`].
    fn create_sandbox(
        &self,
        spec: &SandboxSpec,
    ) -> impl Future<Output = Result<SandboxInfo, Self::Error>> + Send;

    /// See [`SandboxProvider::exec_live`]. A platform without a live side runs the command
    /// and then hands the capture to [`ExecIo::forward_capture`].
    fn exec_live(
        &self,
        sandbox_id: &SandboxId,
        req: &ExecRequest,
        io: ExecIo,
    ) -> impl Future<Output = Result<ExecOutput, Self::Error>> + Send;

    /// See [`SandboxProvider::snapshot`].
    fn snapshot(
        &self,
        task_id: &TaskId,
        sandbox_id: &SandboxId,
        seq: u64,
    ) -> impl Future<Output = Result<SnapshotInfo, Self::Error>> + Send;

    /// See [`SandboxProvider::stop_sandbox`].
    fn stop_sandbox(
        &self,
        sandbox_id: &SandboxId,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// See [`SandboxProvider::extend_timeout`].
    fn extend_timeout(
        &self,
        sandbox_id: &SandboxId,
        duration_ms: u64,
    ) -> impl Future<Output = Result<Millis, Self::Error>> + Send;

    /// See [`SandboxProvider::delete_snapshot`].
    fn delete_snapshot(
        &self,
        snapshot_id: &SnapshotId,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// See [`SandboxProvider::probe_sandbox`].
    fn probe_sandbox(
        &self,
        sandbox_id: &SandboxId,
    ) -> impl Future<Output = Result<Option<Millis>, Self::Error>> + Send;

    /// See [`SandboxProvider::list_sandboxes`].
    fn list_sandboxes(
        &self,
        installation_id: &str,
    ) -> impl Future<Output = Result<Vec<ListedResource>, Self::Error>> + Send;

    /// See [`SandboxProvider::list_snapshots`].
    fn list_snapshots(
        &self,
        installation_id: &str,
    ) -> impl Future<Output = Result<Vec<ListedResource>, Self::Error>> + Send;

    /// See [`SandboxProvider::platform_snapshot`]. The default: none.
    fn platform_snapshot(
        &self,
        task_id: &TaskId,
        sandbox_id: &SandboxId,
    ) -> impl Future<Output = Result<Option<PlatformSnapshot>, Self::Error>> + Send {
        let _ = (task_id, sandbox_id);
        async { Ok(None) }
    }

    /// See [`SandboxProvider::session_usage`]. The default: none.
    fn session_usage(
        &self,
        sandbox_id: &SandboxId,
    ) -> impl Future<Output = Result<Option<SessionUsage>, Self::Error>> + Send {
        let _ = sandbox_id;
        async { Ok(None) }
    }

    /// See [`SandboxProvider::resources`]. The default: none.
    fn resources(
        &self,
        sandbox_id: &SandboxId,
    ) -> impl Future<Output = Result<Option<Resources>, Self::Error>> + Send {
        let _ = sandbox_id;
        async { Ok(None) }
    }

    /// See [`SandboxProvider::sweep_temporaries`]. The default: nothing to sweep.
    fn sweep_temporaries(&self) -> impl Future<Output = Result<usize, Self::Error>> + Send {
        async { Ok(0) }
    }

    /// See [`SandboxProvider::checkpoint`]: its error is already a provider error (it names
    /// the operation). The default refuses (see [`Platform::checkpoints_live`]).
    fn checkpoint(
        &self,
        task_id: &TaskId,
        sandbox_id: &SandboxId,
        seq: u64,
        previous: Option<&SnapshotId>,
    ) -> impl Future<Output = Result<Option<SnapshotInfo>, ProviderError>> + Send {
        let _ = (task_id, sandbox_id, seq, previous);
        let name = self.name();
        async move {
            Err(ProviderError::new(
                crate::core::FailureKind::Invalid,
                "checkpoint",
                format!("the {name} backend cannot snapshot a sandbox without stopping it"),
            ))
        }
    }

    /// See [`SandboxProvider::checkpoints_live`]. The default: no.
    fn checkpoints_live(&self) -> bool {
        false
    }

    /// See [`SandboxProvider::keeps_files_after_deadline`]. The default: no.
    fn keeps_files_after_deadline(&self) -> bool {
        false
    }

    /// See [`SandboxProvider::reports_usage`]. The default: no.
    fn reports_usage(&self) -> bool {
        false
    }

    /// See [`SandboxProvider::measures_activity`]. The default: no.
    fn measures_activity(&self) -> bool {
        false
    }
}

/// Boxes a platform's answer to `operation`, its error named by the operation.
fn named<'a, T, E: PlatformError>(
    operation: &'static str,
    answer: impl Future<Output = Result<T, E>> + Send + 'a,
) -> ProviderFuture<'a, T> {
    Box::pin(async move { answer.await.map_err(|e| e.into_provider(operation)) })
}

impl<P: Platform> SandboxProvider for P {
    fn name(&self) -> &'static str {
        Platform::name(self)
    }

    fn create_sandbox<'a>(&'a self, spec: &'a SandboxSpec) -> ProviderFuture<'a, SandboxInfo> {
        named("create sandbox", Platform::create_sandbox(self, spec))
    }

    fn exec_live<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        req: &'a ExecRequest,
        io: ExecIo,
    ) -> ProviderFuture<'a, ExecOutput> {
        named(
            "run command",
            Platform::exec_live(self, sandbox_id, req, io),
        )
    }

    fn snapshot<'a>(
        &'a self,
        task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
        seq: u64,
    ) -> ProviderFuture<'a, SnapshotInfo> {
        named(
            "take snapshot",
            Platform::snapshot(self, task_id, sandbox_id, seq),
        )
    }

    fn checkpoint<'a>(
        &'a self,
        task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
        seq: u64,
        previous: Option<&'a SnapshotId>,
    ) -> ProviderFuture<'a, Option<SnapshotInfo>> {
        Box::pin(Platform::checkpoint(
            self, task_id, sandbox_id, seq, previous,
        ))
    }

    fn checkpoints_live(&self) -> bool {
        Platform::checkpoints_live(self)
    }

    fn stop_sandbox<'a>(&'a self, sandbox_id: &'a SandboxId) -> ProviderFuture<'a, ()> {
        named("stop sandbox", Platform::stop_sandbox(self, sandbox_id))
    }

    fn extend_timeout<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        duration_ms: u64,
    ) -> ProviderFuture<'a, Millis> {
        named(
            "extend timeout",
            Platform::extend_timeout(self, sandbox_id, duration_ms),
        )
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a SnapshotId) -> ProviderFuture<'a, ()> {
        named(
            "delete snapshot",
            Platform::delete_snapshot(self, snapshot_id),
        )
    }

    fn probe_sandbox<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<Millis>> {
        named("probe sandbox", Platform::probe_sandbox(self, sandbox_id))
    }

    fn platform_snapshot<'a>(
        &'a self,
        task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<PlatformSnapshot>> {
        named(
            "find platform snapshot",
            Platform::platform_snapshot(self, task_id, sandbox_id),
        )
    }

    fn session_usage<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<SessionUsage>> {
        named(
            "read session usage",
            Platform::session_usage(self, sandbox_id),
        )
    }

    fn resources<'a>(&'a self, sandbox_id: &'a SandboxId) -> ProviderFuture<'a, Option<Resources>> {
        named("read resources", Platform::resources(self, sandbox_id))
    }

    fn list_sandboxes<'a>(
        &'a self,
        installation_id: &'a str,
    ) -> ProviderFuture<'a, Vec<ListedResource>> {
        named(
            "list sandboxes",
            Platform::list_sandboxes(self, installation_id),
        )
    }

    fn list_snapshots<'a>(
        &'a self,
        installation_id: &'a str,
    ) -> ProviderFuture<'a, Vec<ListedResource>> {
        named(
            "list snapshots",
            Platform::list_snapshots(self, installation_id),
        )
    }

    fn sweep_temporaries(&self) -> ProviderFuture<'_, usize> {
        named("sweep temporaries", Platform::sweep_temporaries(self))
    }

    fn keeps_files_after_deadline(&self) -> bool {
        Platform::keeps_files_after_deadline(self)
    }

    fn reports_usage(&self) -> bool {
        Platform::reports_usage(self)
    }

    fn measures_activity(&self) -> bool {
        Platform::measures_activity(self)
    }
}
