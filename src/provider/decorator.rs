//! [`Decorator`]: a provider that wraps another and changes only some of its operations.
//!
//! Test and chaos tooling wraps providers to watch or bend what the platform does (record when
//! snapshots were deleted, plant a bug, count creations in flight). Written against
//! [`SandboxProvider`] directly, each such wrapper repeats every operation just to forward it;
//! a [`Decorator`] names its inner provider and overrides only what it changes, and the blanket
//! implementation makes it a [`SandboxProvider`].

use super::{
    ExecIo, ExecOutput, ExecRequest, ListedResource, ProviderFuture, SandboxInfo, SandboxProvider,
    SandboxSpec, SnapshotInfo,
};
use crate::core::{Millis, PlatformSnapshot, SessionUsage};
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

    /// See [`SandboxProvider::exec`].
    fn exec<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        req: &'a ExecRequest,
    ) -> ProviderFuture<'a, ExecOutput> {
        self.inner().exec(sandbox_id, req)
    }

    /// See [`SandboxProvider::exec_live`]. A decorator that overrides [`Decorator::exec`]
    /// overrides this too (the engine runs commands through it).
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

    /// See [`SandboxProvider::keeps_files_after_deadline`].
    fn keeps_files_after_deadline(&self) -> bool {
        self.inner().keeps_files_after_deadline()
    }

    /// See [`SandboxProvider::reports_usage`].
    fn reports_usage(&self) -> bool {
        self.inner().reports_usage()
    }
}

impl<T: Decorator> SandboxProvider for T {
    fn name(&self) -> &'static str {
        Decorator::name(self)
    }

    fn create_sandbox<'a>(&'a self, spec: &'a SandboxSpec) -> ProviderFuture<'a, SandboxInfo> {
        Decorator::create_sandbox(self, spec)
    }

    fn exec<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        req: &'a ExecRequest,
    ) -> ProviderFuture<'a, ExecOutput> {
        Decorator::exec(self, sandbox_id, req)
    }

    fn exec_live<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        req: &'a ExecRequest,
        io: ExecIo,
    ) -> ProviderFuture<'a, ExecOutput> {
        Decorator::exec_live(self, sandbox_id, req, io)
    }

    fn snapshot<'a>(
        &'a self,
        task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
        seq: u64,
    ) -> ProviderFuture<'a, SnapshotInfo> {
        Decorator::snapshot(self, task_id, sandbox_id, seq)
    }

    fn stop_sandbox<'a>(&'a self, sandbox_id: &'a SandboxId) -> ProviderFuture<'a, ()> {
        Decorator::stop_sandbox(self, sandbox_id)
    }

    fn extend_timeout<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        duration_ms: u64,
    ) -> ProviderFuture<'a, Millis> {
        Decorator::extend_timeout(self, sandbox_id, duration_ms)
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a SnapshotId) -> ProviderFuture<'a, ()> {
        Decorator::delete_snapshot(self, snapshot_id)
    }

    fn probe_sandbox<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<Millis>> {
        Decorator::probe_sandbox(self, sandbox_id)
    }

    fn platform_snapshot<'a>(
        &'a self,
        task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<PlatformSnapshot>> {
        Decorator::platform_snapshot(self, task_id, sandbox_id)
    }

    fn session_usage<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<SessionUsage>> {
        Decorator::session_usage(self, sandbox_id)
    }

    fn list_sandboxes<'a>(
        &'a self,
        installation_id: &'a str,
    ) -> ProviderFuture<'a, Vec<ListedResource>> {
        Decorator::list_sandboxes(self, installation_id)
    }

    fn list_snapshots<'a>(
        &'a self,
        installation_id: &'a str,
    ) -> ProviderFuture<'a, Vec<ListedResource>> {
        Decorator::list_snapshots(self, installation_id)
    }

    fn sweep_temporaries(&self) -> ProviderFuture<'_, usize> {
        Decorator::sweep_temporaries(self)
    }

    fn keeps_files_after_deadline(&self) -> bool {
        Decorator::keeps_files_after_deadline(self)
    }

    fn reports_usage(&self) -> bool {
        Decorator::reports_usage(self)
    }
}
