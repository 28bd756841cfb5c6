//! The local sandbox provider, the embedded default backend: real `bash` processes in a
//! per-sandbox workspace directory, and real snapshot archives on disk. It behaves like a microVM
//! platform so that the engine cannot tell the difference: a sandbox has a deadline after which
//! nothing runs in it, a snapshot stops it, a stop discards its files and kills its processes.
//! Unlike a microVM, its files outlive the deadline until it is snapshotted or stopped
//! ([`keeps_files_after_deadline`]): the engine takes a late checkpoint of them.
//!
//! [`keeps_files_after_deadline`]: crate::provider::SandboxProvider::keeps_files_after_deadline
//!
//! Layout under the root (`<data dir>/local`):
//!
//! ```text
//! tasks/<task id>/workspace/            the task's sandbox's files: one stable path per task,
//!                                       whatever the generation (as `/vercel/sandbox` on Vercel)
//! tasks/<task id>/meta.json             which sandbox it is: name, installation, generation,
//!                                       instance, deadline, cwd, status
//! tasks/<task id>/run/                  per-command state files (the cwd a command ended in)
//! sandboxes/<sandbox name>/...          the same, for a sandbox parked out of its task's
//!                                       directory by a newer generation it did not know of
//! snapshots/<task id>/<seq>.<nonce>.tbx snapshot manifests (older ones: whole archives; see
//!                                       `snapshot_store::archive` and `snapshot`)
//! cas/                                  the contents they refer to, stored once by hash and
//!                                       shared by every task (see `snapshot_store::cas`)
//! tasks/<task id>/index                 what the restore wrote (the change detection's index)
//! tmp/                                  sandboxes being created
//! trash/                                discarded sandboxes' files being removed (in the
//!                                       background, so a snapshot or a stop does not wait)
//! lost+found/                           a task directory found without meta.json, kept aside
//! ```
//!
//! A task's live sandbox holds `tasks/<task>/`, so absolute paths recorded in its files
//! (shebangs, virtualenvs, build caches) stay true across snapshots and restores. A sandbox is
//! found by its name: in `tasks/<task>/` if that directory's meta names it, else parked under
//! `sandboxes/<name>/` (creating generation N while generation N-1 is still alive parks N-1
//! there rather than discarding its files; one past its deadline is parked too, its processes
//! stopped, since its files stay until it is snapshotted or stopped).
//!
//! Crash safety comes from renames: a sandbox is assembled (restored, meta written) under `tmp/`
//! and renamed into `tasks/<task>/` whole, so a half-restored workspace never carries a
//! sandbox's name; a discarded sandbox is renamed out (to `trash/`) before its files are
//! removed; an
//! archive is written to a temporary file, fsynced, renamed into place and its directory
//! fsynced. What a crash leaves in `tmp/` or as `*.tmp` is removed by
//! [`LocalProvider::sweep_temporaries`].
//!
//! Every id that reaches a path is validated first: task ids by [`TaskId`],
//! sandbox names by their `taskbox-<task>-g<N>-<installation>` shape, snapshot ids by
//! `<task>.s<seq>`.
//!
//! With `terminal.local_isolation = namespaces` (the default) a sandbox is held in namespaces
//! of its own and every command enters them (see [`isolation`]): its workspace is `/workspace`
//! inside, its environment a clean one, and a stop ends its PID namespace. With `none` (said on
//! purpose; every sandbox's first command warns in its stderr, [`isolation::UNISOLATED_NOTE`]):
//! a command runs as `bash -c` in its own process group, with stdin closed and the environment
//! of taskbox plus `TASKBOX_TASK_ID`, `TASKBOX_SANDBOX` and `TASKBOX_WORKSPACE`. `TASKBOX_SANDBOX`
//! (unique per generation, unlike the workspace path) also marks every process the sandbox
//! started, which is how a stop finds background jobs that outlived their command (as a VM stop
//! would kill them).
//!
//! Lifecycle operations on a task's sandboxes are serialised by a per-task lock (its generations
//! share the task's directory); a command holds it
//! only while it starts and while it records its working directory, so a stop or a snapshot can
//! interrupt a long command (which is then killed, as a VM stop would kill it).
//!
//! The code is split by concern: `error` ([`LocalError`]) for failures, `names` for the validated
//! ids, `workspace` for a sandbox's directory, meta and working directory, `lifecycle` for
//! create/extend/probe/stop/discard, `exec` for running a command, `output` for its bounded
//! capture, `kill` for killing processes, `cgroup` for the cgroup each sandbox's processes run
//! in, `spawn` for starting a command's shell born in that cgroup, `snapshot` for taking, restoring and listing archives
//! (whose format is [`archive`]), `foreign` for archives of another installation (a store
//! reset), `temp` for temporary paths and their sweep, and `fsutil` for
//! durable file-system helpers. This file holds the provider itself and the
//! [`SandboxProvider`](crate::provider::SandboxProvider) glue.

// Every `unsafe` block here (process signals) must say why it is sound.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cgroup;
mod checkpoint;
mod contained;
pub mod doctor;
mod error;
mod exec;
pub mod foreign;
mod freeze;
mod fsutil;
mod inflight;
pub mod isolation;
mod kill;
mod lifecycle;
mod names;
mod output;
mod resources;
mod script;
mod snapshot;
mod spawn;
mod temp;
// A temporary path's in-flight mark, which the snapshot code holds while it writes.
use temp::InFlight;
mod workspace;

pub use self::contained::{Contained, ContainedChild};
pub use self::error::{IoContext, LocalError};
pub use self::snapshot::export_snapshot;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use self::names::SandboxName;
use super::{
    ExecIo, ExecOutput, ExecRequest, ListedResource, SandboxInfo, SandboxSpec, SnapshotInfo,
};
use crate::clock::Clock;
use crate::core::{Millis, Resources};
use crate::ids::{SandboxId, SnapshotId, TaskId};
// The snapshot store, as the local provider's submodules name it (`super::cas`).
use crate::snapshot_store::{archive, cas};

/// The local backend in the [registry](crate::provider::registry): its sandboxes and snapshots
/// live under the data dir's `local/`, where `export-snapshot` reads them; nothing is priced.
pub const BACKEND: crate::provider::registry::Entry = crate::provider::registry::Entry {
    name: "local",
    aliases: &[],
    build: |config, data_dir, installation_id, clock| {
        LocalProvider::new(data_dir.join("local"), installation_id.to_string(), clock)
            .map(|p| {
                let p = p.with_isolation(isolation::Settings::of(&config.terminal));
                Arc::new(p) as Arc<dyn crate::provider::SandboxProvider>
            })
            .map_err(|e| crate::provider::SetupError::new("local", e, None))
    },
    checks: |config| {
        let checks = doctor::checks(config);
        Box::pin(async move { checks })
    },
    priced: false,
    export_snapshot: Some(|data_dir, id, out| {
        export_snapshot(&data_dir.join("local"), id, out)
            .map(|_| ())
            .map_err(|e| crate::provider::PlatformError::into_provider(e, "export a snapshot"))
    }),
    foreign: Some(&FOREIGN),
};

/// The local backend's archives of another installation: under the data dir's `local/`.
const FOREIGN: crate::provider::registry::Foreign = {
    crate::provider::registry::Foreign {
        archives: |data_dir| {
            let root = data_dir.join("local");
            root.is_dir().then(|| root.join("snapshots"))
        },
        scan: |data_dir, installation_id| {
            foreign::scan(&data_dir.join("local"), installation_id)
                .map_err(|e| e.into_provider("scan the snapshot archives"))
        },
        ignore: |data_dir, tasks| {
            foreign::ignore(&data_dir.join("local"), tasks)
                .map_err(|e| e.into_provider("record the ignored installations"))
        },
        adopt: |data_dir, tasks| {
            foreign::adopt(&data_dir.join("local"), tasks)
                .map_err(|e| e.into_provider("record the adoptions"))
        },
    }
};

/// The local backend's note about archives of another installation (its line of
/// [`FOREIGN_NOTES`](crate::provider::FOREIGN_NOTES)).
pub fn take_foreign_note(data_dir: &Path) -> Option<String> {
    foreign::take_note(&data_dir.join("local"))
}

// ---------------------------------------------------------------------------------------------
// The provider

/// Per-sandbox coordination within this process.
struct Slot {
    /// Serialises lifecycle operations (create, snapshot, stop, extend, probe) on the sandbox;
    /// shared by every generation of its task, since they share the task's directory.
    lock: Arc<tokio::sync::Mutex<()>>,
    /// The deadline running commands watch; updated by `extend_timeout`.
    deadline: AtomicU64,
    /// Bumped whenever the sandbox is discarded or its processes are stopped: running commands
    /// kill their process group and report the sandbox gone.
    stopped: watch::Sender<u64>,
    /// Commands this process started in the sandbox (a snapshot trusts tracked changes without
    /// a cgroup only if there were none: then no process of it can be writing).
    commands: AtomicU64,
    /// The init holding the sandbox's namespaces (`terminal.local_isolation = namespaces`),
    /// from its first command in this process until its processes are stopped.
    init: Mutex<Option<Arc<isolation::Init>>>,
}

impl Slot {
    /// Kills the sandbox's init, if this process holds it, and waits without blocking until
    /// it has exited (see `Init::killed`); [`Slot::end_namespaces`] then reaps it at once.
    async fn kill_init(&self) {
        let init = lock(&self.init).clone();
        if let Some(init) = init {
            init.killed().await;
        }
    }

    /// The sandbox's init, while it runs (`None`: none yet, or it ended).
    fn running_init(&self) -> Option<Arc<isolation::Init>> {
        lock(&self.init).as_ref().filter(|i| i.alive()).cloned()
    }

    /// Ends the sandbox's namespaces, if this process holds them: every process in them is
    /// dead when this returns (blocking). Returns whether there were any.
    fn end_namespaces(&self) -> bool {
        let init = lock(&self.init).take();
        match init {
            Some(init) => {
                match Arc::try_unwrap(init) {
                    Ok(init) => init.kill(),
                    // A command being spawned holds it a moment longer: ended now, reaped as
                    // it drops.
                    Err(shared) => shared.stop(),
                }
                true
            }
            None => false,
        }
    }
}

/// The local backend. See the module docs.
pub struct LocalProvider {
    root: PathBuf,
    installation_id: String,
    clock: Arc<dyn Clock>,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    task_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Temporary paths that operations of this process are using (never swept).
    in_flight: Arc<Mutex<HashSet<PathBuf>>>,
    counter: AtomicU64,
    /// The content store every snapshot of this root shares (`cas/`).
    cas: cas::Cas,
    /// The change trackers of the live sandboxes this process restored, by sandbox name
    /// (see `cas::Tracker`): dropped with their sandbox, consumed by its snapshot.
    trackers: Mutex<HashMap<String, cas::Tracker>>,
    /// The snapshot each tracker's index holds (the restore's source, or the last
    /// checkpoint), by sandbox name: a checkpoint finding no change since it needs none.
    tracked_base: Mutex<HashMap<String, String>>,
    /// How commands are isolated (`terminal.local_isolation`).
    isolation: isolation::Settings,
    /// Whether that isolation was said (by [`LocalProvider::with_isolation`]) rather than the
    /// bare provider's: an unisolated sandbox then warns on its first command.
    isolation_said: bool,
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
    /// A provider keeping its sandboxes and snapshots under `root` (created if missing), its
    /// commands unisolated until [`with_isolation`](Self::with_isolation) says otherwise: the
    /// registry's build (every CLI and server) always does, from `terminal.local_isolation`
    /// (namespaces by default); a bare provider serves the fake Vercel's storage and the
    /// provider's own benches and tests.
    pub fn new(
        root: PathBuf,
        installation_id: String,
        clock: Arc<dyn Clock>,
    ) -> Result<LocalProvider, LocalError> {
        for dir in ["tasks", "sandboxes", "snapshots", "tmp", "trash"] {
            let path = root.join(dir);
            fs::create_dir_all(&path).map_err(LocalError::io("create directory", &path))?;
        }
        // Canonical, so that the `pwd -P` a command reports can be compared with it.
        let root = fs::canonicalize(&root).map_err(LocalError::io("resolve", &root))?;
        // A note for the CLI if this installation is new here and archives of another are.
        if let Err(e) = foreign::on_open(&root, &installation_id) {
            tracing::warn!(error = %e, "could not check for archives of another installation");
        }
        let cas = cas::Cas::open(root.join("cas")).map_err(|e| match e {
            cas::CasError::Io(io) => LocalError::Io(io),
            other => LocalError::io("open the content store in", &root)(std::io::Error::other(
                other.to_string(),
            )),
        })?;
        Ok(LocalProvider {
            cas,
            root,
            installation_id,
            clock,
            slots: Mutex::new(HashMap::new()),
            task_locks: Mutex::new(HashMap::new()),
            in_flight: Arc::new(Mutex::new(HashSet::new())),
            counter: AtomicU64::new(0),
            trackers: Mutex::new(HashMap::new()),
            tracked_base: Mutex::new(HashMap::new()),
            isolation: isolation::Settings {
                mode: crate::config::LocalIsolation::None,
                ..isolation::Settings::default()
            },
            isolation_said: false,
        })
    }

    /// The same provider, isolating its sandboxes as `settings` say.
    pub fn with_isolation(mut self, settings: isolation::Settings) -> LocalProvider {
        self.isolation = settings;
        self.isolation_said = true;
        self
    }

    /// Whether a sandbox's first command warns that it runs unisolated: said on purpose
    /// (`terminal.local_isolation = none`), not the bare provider of [`LocalProvider::new`].
    fn warn_unisolated(&self) -> bool {
        self.isolation_said && !self.isolation.namespaces()
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
        let task_lock = lock(&self.task_locks)
            .entry(name.task.to_string())
            .or_default()
            .clone();
        lock(&self.slots)
            .entry(name.name.clone())
            .or_insert_with(|| {
                Arc::new(Slot {
                    lock: task_lock,
                    deadline: AtomicU64::new(0),
                    stopped: watch::channel(0).0,
                    commands: AtomicU64::new(0),
                    init: Mutex::new(None),
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

impl super::Platform for LocalProvider {
    type Error = LocalError;

    fn name(&self) -> &'static str {
        "local"
    }

    async fn create_sandbox(&self, spec: &SandboxSpec) -> Result<SandboxInfo, LocalError> {
        self.create(spec).await
    }

    async fn exec_live(
        &self,
        sandbox_id: &SandboxId,
        req: &ExecRequest,
        io: ExecIo,
    ) -> Result<ExecOutput, LocalError> {
        self.exec_command(sandbox_id, req, io).await
    }

    async fn snapshot(
        &self,
        task_id: &TaskId,
        sandbox_id: &SandboxId,
        seq: u64,
    ) -> Result<SnapshotInfo, LocalError> {
        self.snapshot_sandbox(task_id, sandbox_id, seq).await
    }

    async fn stop_sandbox(&self, sandbox_id: &SandboxId) -> Result<(), LocalError> {
        self.stop(sandbox_id).await
    }

    async fn extend_timeout(
        &self,
        sandbox_id: &SandboxId,
        duration_ms: u64,
    ) -> Result<Millis, LocalError> {
        self.extend(sandbox_id, duration_ms).await
    }

    async fn delete_snapshot(&self, snapshot_id: &SnapshotId) -> Result<(), LocalError> {
        self.delete(snapshot_id).await
    }

    async fn probe_sandbox(&self, sandbox_id: &SandboxId) -> Result<Option<Millis>, LocalError> {
        self.probe(sandbox_id).await
    }

    async fn list_sandboxes(
        &self,
        installation_id: &str,
    ) -> Result<Vec<ListedResource>, LocalError> {
        run_blocking_ref(|| self.sandboxes_of(installation_id))
    }

    async fn list_snapshots(
        &self,
        installation_id: &str,
    ) -> Result<Vec<ListedResource>, LocalError> {
        run_blocking_ref(|| self.snapshots_of(installation_id))
    }

    async fn sweep_temporaries(&self) -> Result<usize, LocalError> {
        run_blocking_ref(|| LocalProvider::sweep_temporaries(self))
    }

    /// Nothing dies at a deadline here: a sandbox's workspace stays until it is stopped or
    /// snapshotted.
    fn keeps_files_after_deadline(&self) -> bool {
        true
    }

    async fn resources(&self, sandbox_id: &SandboxId) -> Result<Option<Resources>, LocalError> {
        Ok(self.read_resources(sandbox_id))
    }

    /// Where its sandboxes' cgroups can be made (see `resources`).
    fn measures_activity(&self) -> bool {
        self.can_measure()
    }

    async fn checkpoint(
        &self,
        task_id: &TaskId,
        sandbox_id: &SandboxId,
        seq: u64,
        previous: Option<&SnapshotId>,
    ) -> Result<Option<SnapshotInfo>, crate::provider::ProviderError> {
        self.checkpoint_sandbox(task_id, sandbox_id, seq, previous.map(|p| p.as_str()))
            .await
            .map_err(|e| crate::provider::PlatformError::into_provider(e, "checkpoint"))
    }

    /// The sandbox's processes are paused (a cgroup freezer) for the moment of a checkpoint.
    fn checkpoints_live(&self) -> bool {
        true
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
