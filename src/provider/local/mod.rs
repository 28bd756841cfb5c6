//! The local sandbox provider, the embedded default backend: real `bash` processes in a
//! per-sandbox workspace directory, and real snapshot archives on disk. It behaves like a microVM
//! platform so that the engine cannot tell the difference: a sandbox has a deadline after which
//! it is gone, a snapshot stops it, a stop discards its files and kills its processes.
//!
//! Layout under the root (`<data dir>/local`):
//!
//! ```text
//! sandboxes/<sandbox name>/workspace/   the files commands see (their starting directory)
//! sandboxes/<sandbox name>/meta.json    task, installation, generation, deadline, cwd, status
//! sandboxes/<sandbox name>/run/         per-command state files (the cwd a command ended in)
//! snapshots/<task id>/<seq>.tbx         snapshot archives (see `archive`)
//! tmp/                                  sandboxes being created and sandboxes being removed
//! ```
//!
//! Crash safety comes from renames: a sandbox is assembled (restored, meta written) under `tmp/`
//! and renamed into `sandboxes/` whole, so a half-restored workspace never carries a sandbox's
//! name; a discarded sandbox is renamed out of `sandboxes/` before its files are removed; an
//! archive is written to a temporary file, fsynced, renamed into place and its directory
//! fsynced. What a crash leaves in `tmp/` or as `*.tmp` is removed by
//! [`LocalProvider::sweep_temporaries`].
//!
//! Every id that reaches a path is validated first: task ids by [`TaskId`],
//! sandbox names by their `taskbox-<task>-g<N>-<installation>` shape, snapshot ids by
//! `<task>.s<seq>`.
//!
//! A command runs as `bash -c` in its own process group, with stdin closed and the environment
//! of taskbox plus `TASKBOX_TASK_ID`, `TASKBOX_SANDBOX` and `TASKBOX_WORKSPACE`. The last one also
//! marks every process the sandbox started, which is how a stop finds background jobs that
//! outlived their command (as a VM stop would kill them).
//!
//! Lifecycle operations on one sandbox are serialised by a per-sandbox lock; a command holds it
//! only while it starts and while it records its working directory, so a stop or a snapshot can
//! interrupt a long command (which is then killed, as a VM stop would kill it).
//!
//! The code is split by concern: `error` ([`LocalError`]) for failures, `names` for the validated
//! ids, `workspace` for a sandbox's directory, meta and working directory, `lifecycle` for
//! create/extend/probe/stop/discard, `exec` for running a command, `output` for its bounded
//! capture, `kill` for killing processes, `snapshot` for taking, restoring and listing archives
//! (whose format is [`archive`]), `temp` for temporary paths and their sweep, and `fsutil` for
//! durable file-system helpers. This file holds the provider itself and the
//! [`SandboxProvider`] glue.

// Every `unsafe` block here (process signals) must say why it is sound.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod archive;
pub mod doctor;
mod error;
mod exec;
mod fsutil;
mod kill;
mod lifecycle;
mod names;
mod output;
mod snapshot;
mod temp;
mod workspace;

pub use self::error::LocalError;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use self::names::SandboxName;
use super::{
    ExecIo, ExecOutput, ExecRequest, ListedResource, ProviderFuture, SandboxInfo, SandboxProvider,
    SandboxSpec, SnapshotInfo,
};
use crate::clock::Clock;
use crate::core::Millis;
use crate::ids::{SandboxId, SnapshotId, TaskId};

// ---------------------------------------------------------------------------------------------
// The provider

/// Per-sandbox coordination within this process.
struct Slot {
    /// Serialises lifecycle operations (create, snapshot, stop, extend, probe) on the sandbox.
    lock: tokio::sync::Mutex<()>,
    /// The deadline running commands watch; updated by `extend_timeout`.
    deadline: AtomicU64,
    /// Bumped whenever the sandbox is discarded or its processes are stopped: running commands
    /// kill their process group and report the sandbox gone.
    stopped: watch::Sender<u64>,
}

/// The local backend. See the module docs.
pub struct LocalProvider {
    root: PathBuf,
    installation_id: String,
    clock: Arc<dyn Clock>,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Temporary paths that operations of this process are using (never swept).
    in_flight: Arc<Mutex<HashSet<PathBuf>>>,
    counter: AtomicU64,
}

impl std::fmt::Debug for LocalProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalProvider")
            .field("root", &self.root)
            .field("installation_id", &self.installation_id)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data behind these mutexes stays consistent even if a holder panicked.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl LocalProvider {
    /// A provider keeping its sandboxes and snapshots under `root` (created if missing).
    pub fn new(
        root: PathBuf,
        installation_id: String,
        clock: Arc<dyn Clock>,
    ) -> Result<LocalProvider, LocalError> {
        for dir in ["sandboxes", "snapshots", "tmp"] {
            let path = root.join(dir);
            fs::create_dir_all(&path).map_err(LocalError::io("create directory", &path))?;
        }
        // Canonical, so that the `pwd -P` a command reports can be compared with it.
        let root = fs::canonicalize(&root).map_err(LocalError::io("resolve", &root))?;
        Ok(LocalProvider {
            root,
            installation_id,
            clock,
            slots: Mutex::new(HashMap::new()),
            in_flight: Arc::new(Mutex::new(HashSet::new())),
            counter: AtomicU64::new(0),
        })
    }

    /// The root directory (canonical).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The installation this provider was opened for. Sandboxes carry the installation of
    /// their spec (a fake server may serve several); listings filter by the one asked for.
    pub fn installation_id(&self) -> &str {
        &self.installation_id
    }

    fn slot(&self, name: &SandboxName) -> Arc<Slot> {
        lock(&self.slots)
            .entry(name.name.clone())
            .or_insert_with(|| {
                Arc::new(Slot {
                    lock: tokio::sync::Mutex::new(()),
                    deadline: AtomicU64::new(0),
                    stopped: watch::channel(0).0,
                })
            })
            .clone()
    }

    fn unique(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("{}.{n}", std::process::id())
    }
}

// ---------------------------------------------------------------------------------------------
// The trait

impl SandboxProvider for LocalProvider {
    fn name(&self) -> &'static str {
        "local"
    }

    fn create_sandbox<'a>(&'a self, spec: &'a SandboxSpec) -> ProviderFuture<'a, SandboxInfo> {
        Box::pin(async move {
            self.create(spec)
                .await
                .map_err(|e| e.into_provider("create sandbox"))
        })
    }

    fn exec<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        req: &'a ExecRequest,
    ) -> ProviderFuture<'a, ExecOutput> {
        self.exec_live(sandbox_id, req, ExecIo::default())
    }

    fn exec_live<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        req: &'a ExecRequest,
        io: ExecIo,
    ) -> ProviderFuture<'a, ExecOutput> {
        Box::pin(async move {
            self.exec_command(sandbox_id, req, io)
                .await
                .map_err(|e| e.into_provider("run command"))
        })
    }

    fn snapshot<'a>(
        &'a self,
        task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
        seq: u64,
    ) -> ProviderFuture<'a, SnapshotInfo> {
        Box::pin(async move {
            self.snapshot_sandbox(task_id, sandbox_id, seq)
                .await
                .map_err(|e| e.into_provider("take snapshot"))
        })
    }

    fn stop_sandbox<'a>(&'a self, sandbox_id: &'a SandboxId) -> ProviderFuture<'a, ()> {
        Box::pin(async move {
            self.stop(sandbox_id)
                .await
                .map_err(|e| e.into_provider("stop sandbox"))
        })
    }

    fn extend_timeout<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        duration_ms: u64,
    ) -> ProviderFuture<'a, Millis> {
        Box::pin(async move {
            self.extend(sandbox_id, duration_ms)
                .await
                .map_err(|e| e.into_provider("extend timeout"))
        })
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a SnapshotId) -> ProviderFuture<'a, ()> {
        Box::pin(async move {
            self.delete(snapshot_id)
                .await
                .map_err(|e| e.into_provider("delete snapshot"))
        })
    }

    fn probe_sandbox<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<Millis>> {
        Box::pin(async move {
            self.probe(sandbox_id)
                .await
                .map_err(|e| e.into_provider("probe sandbox"))
        })
    }

    fn list_sandboxes<'a>(
        &'a self,
        installation_id: &'a str,
    ) -> ProviderFuture<'a, Vec<ListedResource>> {
        Box::pin(async move {
            run_blocking_ref(|| self.sandboxes_of(installation_id))
                .map_err(|e| e.into_provider("list sandboxes"))
        })
    }

    fn list_snapshots<'a>(
        &'a self,
        installation_id: &'a str,
    ) -> ProviderFuture<'a, Vec<ListedResource>> {
        Box::pin(async move {
            run_blocking_ref(|| self.snapshots_of(installation_id))
                .map_err(|e| e.into_provider("list snapshots"))
        })
    }

    fn sweep_temporaries(&self) -> ProviderFuture<'_, usize> {
        Box::pin(async move {
            run_blocking_ref(|| LocalProvider::sweep_temporaries(self))
                .map_err(|e| e.into_provider("sweep temporaries"))
        })
    }
}

/// Runs a directory scan that borrows the provider. It is short (one `read_dir` per sandbox or
/// task), so it runs in place, with tokio told that this thread blocks for a moment.
fn run_blocking_ref<T>(work: impl FnOnce() -> Result<T, LocalError>) -> Result<T, LocalError> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

/// Runs blocking file-system work off the async threads.
async fn run_blocking<T: Send + 'static>(
    operation: &'static str,
    work: impl FnOnce() -> Result<T, LocalError> + Send + 'static,
) -> Result<T, LocalError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| LocalError::Background {
            operation,
            message: e.to_string(),
        })?
}
