//! Deliberately broken variants, to prove that the chaos checker can fail.
//!
//! A bug is planted in a provider decorator, never in the engine or the pure core: the engine
//! under test is the real one, and the decorator makes the platform do something the engine did
//! not ask for, exactly as an engine bug would look from the outside. Hidden from the docs and
//! the CLI help (`taskbox chaos --planted-bug oldest-restore`).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::provider::{
    Decorator, ProviderFuture, SandboxInfo, SandboxProvider, SandboxSpec, SnapshotInfo,
};

/// A bug the chaos run plants on purpose.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlantedBug {
    /// Every restore uses the task's oldest snapshot instead of the one the engine chose.
    OldestRestore,
    /// The snapshot a persistent sandbox took of itself as the platform stopped it is never
    /// found: the engine restores an older one (HTTP runs, where the platform stops sandboxes
    /// while the engine is dead).
    IgnorePlatformSnapshot,
    /// Every restore uses the task's newest snapshot instead of the one the engine chose: a
    /// rewind restores the latest snapshot (the one it just saved) instead of the one named.
    RewindLatest,
}

impl PlantedBug {
    /// The name the CLI takes.
    pub fn as_str(self) -> &'static str {
        match self {
            PlantedBug::OldestRestore => "oldest-restore",
            PlantedBug::IgnorePlatformSnapshot => "ignore-platform-snapshot",
            PlantedBug::RewindLatest => "rewind-latest",
        }
    }

    /// Wraps `inner` in the decorator that plants this bug.
    pub fn wrap(self, inner: Arc<dyn SandboxProvider>) -> Arc<dyn SandboxProvider> {
        match self {
            PlantedBug::OldestRestore => Arc::new(OldestRestore::new(inner)),
            PlantedBug::IgnorePlatformSnapshot => Arc::new(IgnorePlatformSnapshot { inner }),
            PlantedBug::RewindLatest => Arc::new(OldestRestore::newest(inner)),
        }
    }
}

impl fmt::Display for PlantedBug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown `--planted-bug` name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown planted bug `{0}`; known: oldest-restore, ignore-platform-snapshot, rewind-latest"
)]
pub struct UnknownPlantedBug(pub String);

impl FromStr for PlantedBug {
    type Err = UnknownPlantedBug;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "oldest-restore" => Ok(PlantedBug::OldestRestore),
            "ignore-platform-snapshot" => Ok(PlantedBug::IgnorePlatformSnapshot),
            "rewind-latest" => Ok(PlantedBug::RewindLatest),
            other => Err(UnknownPlantedBug(other.to_string())),
        }
    }
}

/// A provider decorator that rewrites every restore's `source_snapshot` to the task's oldest
/// snapshot that it has seen taken and not deleted: the "restores a stale snapshot" bug (or,
/// made by [`OldestRestore::newest`], to its newest: the "rewind restores the latest snapshot
/// instead of the one named" bug, which changes nothing but the restores of rewinds).
#[doc(hidden)]
pub struct OldestRestore {
    inner: Arc<dyn SandboxProvider>,
    /// Restore the newest snapshot instead of the oldest.
    newest: bool,
    /// Per task, the snapshots taken (and not deleted) through this decorator, oldest first.
    taken: Mutex<BTreeMap<TaskId, Vec<SnapshotId>>>,
}

impl OldestRestore {
    /// Decorates `inner`.
    pub fn new(inner: Arc<dyn SandboxProvider>) -> OldestRestore {
        OldestRestore {
            inner,
            newest: false,
            taken: Mutex::new(BTreeMap::new()),
        }
    }

    /// Decorates `inner`, restoring the newest snapshot instead of the oldest.
    pub fn newest(inner: Arc<dyn SandboxProvider>) -> OldestRestore {
        OldestRestore {
            newest: true,
            ..OldestRestore::new(inner)
        }
    }

    fn taken(&self) -> std::sync::MutexGuard<'_, BTreeMap<TaskId, Vec<SnapshotId>>> {
        self.taken.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Decorator for OldestRestore {
    fn inner(&self) -> &dyn SandboxProvider {
        &*self.inner
    }

    fn create_sandbox<'a>(&'a self, spec: &'a SandboxSpec) -> ProviderFuture<'a, SandboxInfo> {
        Box::pin(async move {
            let mut spec = spec.clone();
            if spec.source_snapshot.is_some() {
                let oldest = self.taken().get(&spec.task_id).and_then(|ids| {
                    if self.newest {
                        ids.last().cloned()
                    } else {
                        ids.first().cloned()
                    }
                });
                if let Some(oldest) = oldest {
                    spec.source_snapshot = Some(oldest);
                }
            }
            self.inner.create_sandbox(&spec).await
        })
    }

    fn snapshot<'a>(
        &'a self,
        task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
        seq: u64,
    ) -> ProviderFuture<'a, SnapshotInfo> {
        Box::pin(async move {
            let info = self.inner.snapshot(task_id, sandbox_id, seq).await?;
            let mut taken = self.taken();
            let ids = taken.entry(task_id.clone()).or_default();
            if !ids.contains(&info.id) {
                ids.push(info.id.clone());
            }
            Ok(info)
        })
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a SnapshotId) -> ProviderFuture<'a, ()> {
        Box::pin(async move {
            self.inner.delete_snapshot(snapshot_id).await?;
            for ids in self.taken().values_mut() {
                ids.retain(|id| id != snapshot_id);
            }
            Ok(())
        })
    }
}

/// A provider decorator that never finds the platform's own snapshot of a stopped sandbox: the
/// "files back from the platform's snapshot" safety net switched off.
#[doc(hidden)]
pub struct IgnorePlatformSnapshot {
    inner: Arc<dyn SandboxProvider>,
}

impl Decorator for IgnorePlatformSnapshot {
    fn inner(&self) -> &dyn SandboxProvider {
        &*self.inner
    }

    fn platform_snapshot<'a>(
        &'a self,
        _task_id: &'a TaskId,
        _sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<crate::core::PlatformSnapshot>> {
        Box::pin(async { Ok(None) })
    }
}
