//! [`Decorator`]: a provider that wraps another and changes only some of its operations.
//!
//! Test and chaos tooling wraps providers to watch or bend what the platform does (record when
//! snapshots were deleted, plant a bug, count creations in flight). Written against
//! [`SandboxProvider`] directly, each such wrapper repeats every operation just to forward it;
//! a [`Decorator`] names its inner provider and overrides only what it changes, and the blanket
//! implementation makes it a [`Platform`] (and so a [`SandboxProvider`]).

use super::{
    ExecIo, ExecOutput, ExecRequest, ListedResource, Platform, ProviderError, ProviderFuture,
    SandboxInfo, SandboxProvider, SandboxSpec, SnapshotInfo,
};
use crate::core::{Millis, PlatformSnapshot, Resources, SessionUsage};
use crate::ids::{SandboxId, SnapshotId, TaskId};

/// A [`SandboxProvider`] that forwards every operation to [`Decorator::inner`] unless it
/// overrides it. The methods mirror [`SandboxProvider`]'s, with the same contracts; an
/// override that calls the inner provider keeps its idempotency keys as they are.
pub trait Decorator: Send + Sync {
    /// The provider being decorated.
    fn inner(&self) -> &dyn SandboxProvider;

    /// See [`SandboxProvider::name`].
    fn name(&self) -> &'static str {
        self.inner().name()
    }

    /// See [`SandboxProvider::create_sandbox`].
    fn create_sandbox<'a>(&'a self, spec: &'a SandboxSpec) -> ProviderFuture<'a, SandboxInfo> {
        self.inner().create_sandbox(spec)
    }

    /// See [`SandboxProvider::exec_live`] (which [`SandboxProvider::exec`] runs too).
    fn exec_live<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        req: &'a ExecRequest,
        io: ExecIo,
    ) -> ProviderFuture<'a, ExecOutput> {
        self.inner().exec_live(sandbox_id, req, io)
    }

    /// See [`SandboxProvider::snapshot`].
    fn snapshot<'a>(
        &'a self,
        task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
        seq: u64,
    ) -> ProviderFuture<'a, SnapshotInfo> {
        self.inner().snapshot(task_id, sandbox_id, seq)
    }

    /// See [`SandboxProvider::stop_sandbox`].
    fn stop_sandbox<'a>(&'a self, sandbox_id: &'a SandboxId) -> ProviderFuture<'a, ()> {
        self.inner().stop_sandbox(sandbox_id)
    }

    /// See [`SandboxProvider::extend_timeout`].
    fn extend_timeout<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        duration_ms: u64,
    ) -> ProviderFuture<'a, Millis> {
        self.inner().extend_timeout(sandbox_id, duration_ms)
    }

    /// See [`SandboxProvider::delete_snapshot`].
    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a SnapshotId) -> ProviderFuture<'a, ()> {
        self.inner().delete_snapshot(snapshot_id)
    }

    /// See [`SandboxProvider::probe_sandbox`].
    fn probe_sandbox<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<Millis>> {
        self.inner().probe_sandbox(sandbox_id)
    }

    /// See [`SandboxProvider::platform_snapshot`].
    fn platform_snapshot<'a>(
        &'a self,
        task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<PlatformSnapshot>> {
        self.inner().platform_snapshot(task_id, sandbox_id)
    }

    /// See [`SandboxProvider::session_usage`].
    fn session_usage<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<SessionUsage>> {
        self.inner().session_usage(sandbox_id)
    }

    /// See [`SandboxProvider::resources`].
    fn resources<'a>(&'a self, sandbox_id: &'a SandboxId) -> ProviderFuture<'a, Option<Resources>> {
        self.inner().resources(sandbox_id)
    }

    /// See [`SandboxProvider::list_sandboxes`].
    fn list_sandboxes<'a>(
        &'a self,
        installation_id: &'a str,
    ) -> ProviderFuture<'a, Vec<ListedResource>> {
        self.inner().list_sandboxes(installation_id)
    }

    /// See [`SandboxProvider::list_snapshots`].
    fn list_snapshots<'a>(
        &'a self,
        installation_id: &'a str,
    ) -> ProviderFuture<'a, Vec<ListedResource>> {
        self.inner().list_snapshots(installation_id)
    }

    /// See [`SandboxProvider::sweep_temporaries`].
    fn sweep_temporaries(&self) -> ProviderFuture<'_, usize> {
        self.inner().sweep_temporaries()
    }

    /// See [`SandboxProvider::checkpoint`].
    fn checkpoint<'a>(
        &'a self,
        task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
        seq: u64,
        previous: Option<&'a SnapshotId>,
    ) -> ProviderFuture<'a, Option<SnapshotInfo>> {
        self.inner().checkpoint(task_id, sandbox_id, seq, previous)
    }

    /// See [`SandboxProvider::checkpoints_live`].
    fn checkpoints_live(&self) -> bool {
        self.inner().checkpoints_live()
    }

    /// See [`SandboxProvider::keeps_files_after_deadline`].
    fn keeps_files_after_deadline(&self) -> bool {
        self.inner().keeps_files_after_deadline()
    }

    /// See [`SandboxProvider::reports_usage`].
    fn reports_usage(&self) -> bool {
        self.inner().reports_usage()
    }

    /// See [`SandboxProvider::measures_activity`].
    fn measures_activity(&self) -> bool {
        self.inner().measures_activity()
    }
}

// A decorator is a platform whose error is already a provider error (it names its operation,
// so the blanket's naming leaves it as it is).
impl<T: Decorator> Platform for T {
    type Error = ProviderError;

    fn name(&self) -> &'static str {
        Decorator::name(self)
    }

    async fn create_sandbox(&self, spec: &SandboxSpec) -> Result<SandboxInfo, ProviderError> {
        Decorator::create_sandbox(self, spec).await
    }

    async fn exec_live(
        &self,
        sandbox_id: &SandboxId,
        req: &ExecRequest,
        io: ExecIo,
    ) -> Result<ExecOutput, ProviderError> {
        Decorator::exec_live(self, sandbox_id, req, io).await
    }

    async fn snapshot(
        &self,
        task_id: &TaskId,
        sandbox_id: &SandboxId,
        seq: u64,
    ) -> Result<SnapshotInfo, ProviderError> {
        Decorator::snapshot(self, task_id, sandbox_id, seq).await
    }

    async fn stop_sandbox(&self, sandbox_id: &SandboxId) -> Result<(), ProviderError> {
        Decorator::stop_sandbox(self, sandbox_id).await
    }

    async fn extend_timeout(
        &self,
        sandbox_id: &SandboxId,
        duration_ms: u64,
    ) -> Result<Millis, ProviderError> {
        Decorator::extend_timeout(self, sandbox_id, duration_ms).await
    }

    async fn delete_snapshot(&self, snapshot_id: &SnapshotId) -> Result<(), ProviderError> {
        Decorator::delete_snapshot(self, snapshot_id).await
    }

    async fn probe_sandbox(&self, sandbox_id: &SandboxId) -> Result<Option<Millis>, ProviderError> {
        Decorator::probe_sandbox(self, sandbox_id).await
    }

    async fn platform_snapshot(
        &self,
        task_id: &TaskId,
        sandbox_id: &SandboxId,
    ) -> Result<Option<PlatformSnapshot>, ProviderError> {
        Decorator::platform_snapshot(self, task_id, sandbox_id).await
    }

    async fn session_usage(
        &self,
        sandbox_id: &SandboxId,
    ) -> Result<Option<SessionUsage>, ProviderError> {
        Decorator::session_usage(self, sandbox_id).await
    }

    async fn resources(&self, sandbox_id: &SandboxId) -> Result<Option<Resources>, ProviderError> {
        Decorator::resources(self, sandbox_id).await
    }

    async fn list_sandboxes(
        &self,
        installation_id: &str,
    ) -> Result<Vec<ListedResource>, ProviderError> {
        Decorator::list_sandboxes(self, installation_id).await
    }

    async fn list_snapshots(
        &self,
        installation_id: &str,
    ) -> Result<Vec<ListedResource>, ProviderError> {
        Decorator::list_snapshots(self, installation_id).await
    }

    async fn sweep_temporaries(&self) -> Result<usize, ProviderError> {
        Decorator::sweep_temporaries(self).await
    }

    async fn checkpoint(
        &self,
        task_id: &TaskId,
        sandbox_id: &SandboxId,
        seq: u64,
        previous: Option<&SnapshotId>,
    ) -> Result<Option<SnapshotInfo>, ProviderError> {
        Decorator::checkpoint(self, task_id, sandbox_id, seq, previous).await
    }

    fn checkpoints_live(&self) -> bool {
        Decorator::checkpoints_live(self)
    }

    fn keeps_files_after_deadline(&self) -> bool {
        Decorator::keeps_files_after_deadline(self)
    }

    fn reports_usage(&self) -> bool {
        Decorator::reports_usage(self)
    }

    fn measures_activity(&self) -> bool {
        Decorator::measures_activity(self)
    }
}
