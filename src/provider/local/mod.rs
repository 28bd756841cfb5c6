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
//! Every id that reaches a path is validated first: task ids by [`TaskId`], sandbox names by
//! their `taskbox-<task>-g<N>-<installation>` shape, snapshot ids by `<task>.s<seq>`.
//!
//! A command runs as `bash -c` in its own process group, with stdin closed and the environment
//! of taskbox plus `TASKBOX_TASK_ID`, `TASKBOX_SANDBOX` and `TASKBOX_WORKSPACE`. The last one also
//! marks every process the sandbox started, which is how a stop finds background jobs that
//! outlived their command (as a VM stop would kill them).
//!
//! Lifecycle operations on one sandbox are serialised by a per-sandbox lock; a command holds it
//! only while it starts and while it records its working directory, so a stop or a snapshot can
//! interrupt a long command (which is then killed, as a VM stop would kill it).

pub mod archive;
pub mod doctor;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs;
use std::io::{self, BufReader};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::watch;

use self::archive::{ArchiveError, ArchiveHeader, PackStats};
use super::{
    bound_output, sandbox_name, ExecOutput, ExecRequest, ListedResource, ProviderError,
    ProviderFuture, SandboxInfo, SandboxProvider, SandboxSpec, SnapshotInfo, MAX_OUTPUT_CHARS,
};
use crate::clock::{format_ms, Clock};
use crate::core::{FailureKind, Millis};
use crate::ids::{TaskId, TaskIdError};

/// How often a running command checks the sandbox deadline. The deadline lives on the injected
/// clock (which may be virtual), so it is polled rather than turned into a timer.
const DEADLINE_POLL: Duration = Duration::from_millis(50);

/// How long output is still collected after a command's process ended. A background child that
/// inherited stdout keeps the pipe open; its later output is not the command's.
const OUTPUT_GRACE: Duration = Duration::from_millis(250);

/// Version of `meta.json`.
const META_FORMAT: u32 = 1;

/// File name suffix of snapshot archives.
const ARCHIVE_EXT: &str = "tbx";

// ---------------------------------------------------------------------------------------------
// Errors

/// A local-provider failure, with the task, sandbox, snapshot or path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// A task id that is not a safe name.
    #[error(transparent)]
    TaskId(#[from] TaskIdError),
    /// A sandbox id that is not `taskbox-<task id>-g<generation>-<installation>`.
    #[error("invalid sandbox id `{id}`: {reason} (expected `taskbox-<task id>-g<generation>-<installation>`)")]
    SandboxId {
        /// The id given (escaped).
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A snapshot id that is not `<task id>.s<seq>`.
    #[error("invalid snapshot id `{id}`: {reason} (expected `<task id>.s<seq>`)")]
    SnapshotId {
        /// The id given (escaped).
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The spec's name is not the one [`sandbox_name`] gives for its task and generation.
    #[error("sandbox name `{name}` does not match task `{task_id}` generation {generation} (expected `{expected}`)")]
    SpecName {
        /// The name in the spec.
        name: String,
        /// The spec's task.
        task_id: String,
        /// The spec's generation.
        generation: u64,
        /// The name it should have.
        expected: String,
    },
    /// A command string that cannot be passed to a process.
    #[error("the command for sandbox `{sandbox}` contains a NUL byte")]
    BadCommand {
        /// The sandbox.
        sandbox: String,
    },
    /// The sandbox belongs to another task or installation.
    #[error("sandbox `{sandbox}` belongs to {what} `{owner}`, not `{expected}`")]
    Ownership {
        /// The sandbox.
        sandbox: String,
        /// `task` or `installation`.
        what: &'static str,
        /// Who owns it.
        owner: String,
        /// Who asked.
        expected: String,
    },
    /// The sandbox does not exist (any more).
    #[error("sandbox `{sandbox}` is gone: {reason}")]
    SandboxGone {
        /// The sandbox.
        sandbox: String,
        /// Why (expired, stopped, never created).
        reason: String,
    },
    /// The snapshot's archive does not exist (any more).
    #[error("snapshot `{snapshot}` is gone (no archive at `{path}`)")]
    SnapshotGone {
        /// The snapshot id.
        snapshot: String,
        /// Where its archive was.
        path: PathBuf,
    },
    /// The snapshot's archive could not be written, read or restored.
    #[error("snapshot `{snapshot}` (archive `{path}`)")]
    Archive {
        /// The snapshot id.
        snapshot: String,
        /// The archive file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: ArchiveError,
    },
    /// The archive under a snapshot's name holds another task's or sequence's files.
    #[error("archive `{path}` of snapshot `{snapshot}` holds task `{found_task}` snapshot {found_seq}, not what its name says")]
    ArchiveMismatch {
        /// The snapshot id.
        snapshot: String,
        /// The archive file.
        path: PathBuf,
        /// The task in its header.
        found_task: String,
        /// The sequence number in its header.
        found_seq: u64,
    },
    /// A file-system operation failed.
    #[error("cannot {operation} `{path}`")]
    Io {
        /// What was being done.
        operation: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A sandbox's `meta.json` is not readable as ours.
    #[error("sandbox meta file `{path}` is not valid")]
    Meta {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// `bash` could not be started.
    #[error("cannot start `bash` in sandbox `{sandbox}` (is bash installed and on PATH?)")]
    Spawn {
        /// The sandbox.
        sandbox: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A blocking helper task panicked or was cancelled.
    #[error("background work to {operation} did not finish: {message}")]
    Background {
        /// What it was doing.
        operation: &'static str,
        /// The join error.
        message: String,
    },
}

impl LocalError {
    fn io(operation: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| LocalError::Io {
            operation,
            path,
            source,
        }
    }

    fn gone(sandbox: &SandboxName, reason: impl Into<String>) -> Self {
        LocalError::SandboxGone {
            sandbox: sandbox.name.clone(),
            reason: reason.into(),
        }
    }

    /// How the engine must treat this failure.
    pub fn kind(&self) -> FailureKind {
        match self {
            LocalError::TaskId(_)
            | LocalError::SandboxId { .. }
            | LocalError::SnapshotId { .. }
            | LocalError::SpecName { .. }
            | LocalError::BadCommand { .. }
            | LocalError::Ownership { .. } => FailureKind::Invalid,
            LocalError::SandboxGone { .. } => FailureKind::SandboxGone,
            LocalError::SnapshotGone { .. } => FailureKind::SnapshotGone,
            LocalError::Archive { source, .. } => match source.io_error() {
                Some(e) => io_kind(e),
                None => FailureKind::Permanent,
            },
            LocalError::Io { source, .. } | LocalError::Spawn { source, .. } => io_kind(source),
            LocalError::ArchiveMismatch { .. } | LocalError::Meta { .. } => FailureKind::Permanent,
            LocalError::Background { .. } => FailureKind::Permanent,
        }
    }

    /// The provider-level error for `operation`, with the whole cause chain in its message.
    pub fn into_provider(self, operation: &'static str) -> ProviderError {
        let mut message = self.to_string();
        let mut source = std::error::Error::source(&self);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        ProviderError::new(self.kind(), operation, message)
    }
}

/// I/O errors are permanent unless they are clearly about momentary resource pressure.
fn io_kind(e: &io::Error) -> FailureKind {
    let transient = matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EAGAIN | libc::EMFILE | libc::ENFILE | libc::EBUSY | libc::ENOMEM)
    );
    if transient {
        FailureKind::Transient {
            retry_after_ms: None,
        }
    } else if e.kind() == io::ErrorKind::InvalidInput {
        FailureKind::Invalid
    } else {
        FailureKind::Permanent
    }
}

// ---------------------------------------------------------------------------------------------
// Validated names

/// A parsed, validated sandbox name: `taskbox-<task id>-g<generation>-<installation>`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SandboxName {
    name: String,
    task: TaskId,
    generation: u64,
}

impl SandboxName {
    fn parse(id: &str) -> Result<SandboxName, LocalError> {
        let err = |reason| LocalError::SandboxId {
            id: id.escape_debug().to_string(),
            reason,
        };
        if !id.starts_with("taskbox-") {
            return Err(err("it does not start with `taskbox-`"));
        }
        let (inst, task, generation) = crate::provider::parse_sandbox_name(id)
            .ok_or_else(|| err("it is not `taskbox-<task>-g<generation>-<installation>`"))?;
        let task = TaskId::new(&task).map_err(|_| err("it does not contain a valid task id"))?;
        // The round trip guarantees the name is exactly what `sandbox_name` builds.
        if sandbox_name(&inst, task.as_str(), generation) != id {
            return Err(err("it is not in canonical form"));
        }
        Ok(SandboxName {
            name: id.to_string(),
            task,
            generation,
        })
    }
}

/// A parsed, validated snapshot id: `<task id>.s<seq>`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SnapshotRef {
    task: TaskId,
    seq: u64,
}

impl SnapshotRef {
    fn parse(id: &str) -> Result<SnapshotRef, LocalError> {
        let err = |reason| LocalError::SnapshotId {
            id: id.escape_debug().to_string(),
            reason,
        };
        let (task, seq) = id
            .split_once('.')
            .ok_or_else(|| err("it has no `.s<seq>` suffix"))?;
        let seq = seq
            .strip_prefix('s')
            .and_then(parse_canonical_u64)
            .ok_or_else(|| err("its sequence number is not `s` and a plain number"))?;
        let task = TaskId::new(task).map_err(|_| err("it does not start with a valid task id"))?;
        Ok(SnapshotRef { task, seq })
    }

    fn id(&self) -> String {
        format!("{}.s{}", self.task, self.seq)
    }
}

/// Digits only, no sign, no leading zero: one spelling per number, so one path per id.
fn parse_canonical_u64(s: &str) -> Option<u64> {
    let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    s.parse().ok()
}

// ---------------------------------------------------------------------------------------------
// Sandbox metadata

/// What the provider records about a sandbox, in `meta.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SandboxMeta {
    format: u32,
    name: String,
    task_id: String,
    installation_id: String,
    generation: u64,
    /// Unique per creation: a command that started in an earlier sandbox of the same name must
    /// not write its working directory into this one.
    instance: String,
    created_at: Millis,
    deadline: Millis,
    source_snapshot: Option<String>,
    /// The working directory for the next command, relative to the workspace (`""`: its root).
    cwd: String,
    status: SandboxStatus,
}

/// Where a sandbox is in its life (a stopped sandbox has no meta: it is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SandboxStatus {
    /// Accepting commands.
    Running,
    /// Its processes were stopped and its files are being archived.
    Snapshotting,
}

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

/// Removes a temporary path from the in-flight set when the operation using it ends.
struct InFlight {
    set: Arc<Mutex<HashSet<PathBuf>>>,
    path: PathBuf,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.set).remove(&self.path);
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

    /// The workspace directory of a live-on-disk sandbox, if `sandbox_id` is valid and exists.
    pub fn workspace_path(&self, sandbox_id: &str) -> Option<PathBuf> {
        let name = SandboxName::parse(sandbox_id).ok()?;
        let path = self.workspace_dir(&name);
        path.is_dir().then_some(path)
    }

    fn sandbox_dir(&self, name: &SandboxName) -> PathBuf {
        self.root.join("sandboxes").join(&name.name)
    }

    fn workspace_dir(&self, name: &SandboxName) -> PathBuf {
        self.sandbox_dir(name).join("workspace")
    }

    fn snapshot_path(&self, snap: &SnapshotRef) -> PathBuf {
        self.root
            .join("snapshots")
            .join(snap.task.as_str())
            .join(format!("{}.{ARCHIVE_EXT}", snap.seq))
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

    /// A fresh path `<dir>/<prefix><pid>.<n><suffix>`, registered as in flight.
    fn temp_path(&self, dir: &Path, prefix: &str, suffix: &str) -> (PathBuf, InFlight) {
        let path = dir.join(format!("{prefix}{}{suffix}", self.unique()));
        lock(&self.in_flight).insert(path.clone());
        let guard = InFlight {
            set: self.in_flight.clone(),
            path: path.clone(),
        };
        (path, guard)
    }

    // -- meta ----------------------------------------------------------------------------------

    fn read_meta(&self, name: &SandboxName) -> Result<Option<SandboxMeta>, LocalError> {
        let path = self.sandbox_dir(name).join("meta.json");
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| LocalError::Meta { path, source }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(LocalError::io("read", path)(e)),
        }
    }

    /// Writes `meta.json` into `sandbox_dir` atomically (temporary file, fsync, rename).
    fn write_meta(&self, sandbox_dir: &Path, meta: &SandboxMeta) -> Result<(), LocalError> {
        let path = sandbox_dir.join("meta.json");
        let tmp = sandbox_dir.join(format!("meta.json.{}.tmp", self.unique()));
        let bytes = serde_json::to_vec_pretty(meta).expect("sandbox meta always serialises");
        let result = write_synced(&tmp, &bytes)
            .and_then(|()| fs::rename(&tmp, &path).map_err(LocalError::io("replace", &path)));
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// The sandbox's meta if it exists and has not expired; an expired one is discarded.
    /// The caller holds the slot's lock.
    async fn live_meta(&self, name: &SandboxName, slot: &Slot) -> Result<SandboxMeta, LocalError> {
        let meta = self.read_meta(name)?.ok_or_else(|| {
            LocalError::gone(
                name,
                "it does not exist (stopped, snapshotted or never created)",
            )
        })?;
        let now = self.clock.now_ms();
        if now >= meta.deadline {
            self.discard(name, slot).await?;
            return Err(LocalError::gone(
                name,
                format!("it expired at {}", format_ms(meta.deadline)),
            ));
        }
        Ok(meta)
    }

    // -- discarding ----------------------------------------------------------------------------

    /// Kills the sandbox's running commands and leftover processes. The caller holds the lock.
    async fn stop_processes(&self, name: &SandboxName, slot: &Slot) -> Result<(), LocalError> {
        slot.stopped.send_modify(|n| *n += 1);
        let workspace = self.workspace_dir(name);
        run_blocking("stop the sandbox's processes", move || {
            kill_leftovers(&workspace);
            Ok(())
        })
        .await
    }

    /// Stops the sandbox and removes its files. Returns whether it existed. The caller holds the
    /// slot's lock.
    async fn discard(&self, name: &SandboxName, slot: &Slot) -> Result<bool, LocalError> {
        slot.stopped.send_modify(|n| *n += 1);
        let dir = self.sandbox_dir(name);
        let (trash, in_flight) =
            self.temp_path(&self.root.join("tmp"), "trash.", &format!(".{}", name.name));
        // Out of `sandboxes/` first: from this instant the sandbox is gone, even if removing its
        // files is slow or a crash interrupts it (the sweep finishes the job).
        let existed = match fs::rename(&dir, &trash) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(LocalError::io("move away", &dir)(e)),
        };
        // Processes are matched by the workspace path they were started with (their
        // environment), which is the path before the rename.
        let workspace = self.workspace_dir(name);
        let sandbox = name.name.clone();
        run_blocking("remove the sandbox", move || {
            let _in_flight = in_flight;
            kill_leftovers(&workspace);
            if existed {
                if let Err(e) = remove_tree(&trash) {
                    tracing::warn!(sandbox = %sandbox, path = %trash.display(), error = %e,
                        "could not remove a discarded sandbox's files; the sweep will retry");
                }
            }
            Ok(())
        })
        .await?;
        Ok(existed)
    }

    // -- operations ----------------------------------------------------------------------------

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, LocalError> {
        let task = TaskId::new(&spec.task_id)?;
        let expected = sandbox_name(&spec.installation_id, task.as_str(), spec.generation);
        if spec.name != expected {
            return Err(LocalError::SpecName {
                name: spec.name.escape_debug().to_string(),
                task_id: task.to_string(),
                generation: spec.generation,
                expected,
            });
        }
        let name = SandboxName::parse(&spec.name)?;
        let source = spec
            .source_snapshot
            .as_deref()
            .map(SnapshotRef::parse)
            .transpose()?;
        let slot = self.slot(&name);
        let _guard = slot.lock.lock().await;

        if let Some(meta) = self.read_meta(&name)? {
            check_owner(&name, "task", &meta.task_id, task.as_str())?;
            check_owner(
                &name,
                "installation",
                &meta.installation_id,
                &spec.installation_id,
            )?;
            if self.clock.now_ms() < meta.deadline {
                return Ok(SandboxInfo {
                    id: name.name.clone(),
                    name: name.name.clone(),
                    deadline: meta.deadline,
                });
            }
            self.discard(&name, &slot).await?;
        }

        // Held until the staging directory is renamed or removed, so a sweep leaves it alone.
        let (staging, _in_flight) = self.temp_path(
            &self.root.join("tmp"),
            "create.",
            &format!(".{}", name.name),
        );
        let built = self.assemble(&name, spec, source.as_ref(), &staging).await;
        let meta = match built {
            Ok(meta) => meta,
            Err(e) => {
                let staging = staging.clone();
                let _ = run_blocking("clean up a failed create", move || {
                    let _ = remove_tree(&staging);
                    Ok(())
                })
                .await;
                return Err(e);
            }
        };
        tracing::debug!(sandbox = %name.name, deadline = meta.deadline, "local sandbox created");
        Ok(SandboxInfo {
            id: name.name.clone(),
            name: name.name.clone(),
            deadline: meta.deadline,
        })
    }

    /// Builds the sandbox directory at `staging` and renames it into place.
    async fn assemble(
        &self,
        name: &SandboxName,
        spec: &SandboxSpec,
        source: Option<&SnapshotRef>,
        staging: &Path,
    ) -> Result<SandboxMeta, LocalError> {
        fs::create_dir(staging).map_err(LocalError::io("create directory", staging))?;
        let run_dir = staging.join("run");
        fs::create_dir(&run_dir).map_err(LocalError::io("create directory", &run_dir))?;
        let workspace = staging.join("workspace");
        match source {
            Some(snap) => {
                let archive = self.snapshot_path(snap);
                let snap = snap.clone();
                let workspace = workspace.clone();
                run_blocking("restore a snapshot", move || {
                    restore(&snap, &archive, &workspace)
                })
                .await?;
            }
            None => {
                fs::create_dir(&workspace)
                    .map_err(LocalError::io("create directory", &workspace))?;
            }
        }
        let now = self.clock.now_ms();
        let meta = SandboxMeta {
            format: META_FORMAT,
            name: name.name.clone(),
            task_id: name.task.to_string(),
            installation_id: spec.installation_id.clone(),
            generation: name.generation,
            instance: format!("{}.{now}", self.unique()),
            created_at: now,
            deadline: now.saturating_add(spec.timeout_ms),
            source_snapshot: source.map(SnapshotRef::id),
            cwd: String::new(),
            status: SandboxStatus::Running,
        };
        self.write_meta(staging, &meta)?;
        let dest = self.sandbox_dir(name);
        if let Err(e) = fs::rename(staging, &dest) {
            // Another process sharing this root created it first: use theirs, as a repeated
            // create would.
            if let Some(theirs) = self.read_meta(name).ok().flatten() {
                if theirs.task_id == meta.task_id
                    && theirs.installation_id == meta.installation_id
                    && self.clock.now_ms() < theirs.deadline
                {
                    let _ = remove_tree(staging);
                    return Ok(theirs);
                }
            }
            return Err(LocalError::io("move into place", &dest)(e));
        }
        sync_dir(&self.root.join("sandboxes"))?;
        Ok(meta)
    }

    async fn exec_command(
        &self,
        sandbox_id: &str,
        req: &ExecRequest,
    ) -> Result<ExecOutput, LocalError> {
        let name = SandboxName::parse(sandbox_id)?;
        if req.command.contains('\0') {
            return Err(LocalError::BadCommand {
                sandbox: name.name.clone(),
            });
        }
        let slot = self.slot(&name);
        let workspace = self.workspace_dir(&name);
        let run_dir = self.sandbox_dir(&name).join("run");
        let (meta, mut stopped) = {
            let _guard = slot.lock.lock().await;
            let meta = self.live_meta(&name, &slot).await?;
            // A command may have deleted the workspace itself; a VM's root would still exist.
            // (Under the lock: after a discard this would leave a nameless sandbox behind.)
            for dir in [&workspace, &run_dir] {
                fs::create_dir_all(dir).map_err(LocalError::io("create directory", dir))?;
            }
            slot.deadline.store(meta.deadline, Ordering::SeqCst);
            // Subscribed under the lock: a discard after this point is seen by this command.
            (meta, slot.stopped.subscribe())
        };
        let cwd = resolve_cwd(&workspace, &meta.cwd);
        let cwd_file = run_dir.join(format!("cwd.{}", self.unique()));
        let script = wrap_command(&req.command, &cwd_file);

        let mut command = tokio::process::Command::new("bash");
        command
            .arg("-c")
            .arg(script)
            .current_dir(&cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("TASKBOX_TASK_ID", meta.task_id.as_str())
            .env("TASKBOX_SANDBOX", name.name.as_str())
            .env("TASKBOX_WORKSPACE", &workspace)
            .env_remove("PWD")
            .env_remove("OLDPWD")
            // Its own process group, so a timeout kills everything the command started.
            .process_group(0);
        let started = tokio::time::Instant::now();
        let mut child = match command.spawn() {
            Ok(child) => child,
            // Discarded since the check above: its directory went away under the spawn.
            Err(_) if stopped.has_changed().unwrap_or(true) => {
                return Err(LocalError::gone(
                    &name,
                    "it was stopped as the command started",
                ))
            }
            Err(source) => {
                return Err(LocalError::Spawn {
                    sandbox: name.name.clone(),
                    source,
                })
            }
        };
        let pgid = child.id().expect("a child that was just spawned has a pid");
        let mut group = GroupGuard { pgid: Some(pgid) };
        let stdout = Pump::start(child.stdout.take());
        let stderr = Pump::start(child.stderr.take());

        let command_timeout = tokio::time::sleep(Duration::from_millis(req.timeout_ms));
        tokio::pin!(command_timeout);
        let mut tick = tokio::time::interval(DEADLINE_POLL);
        let mut exited = None;
        let outcome = loop {
            tokio::select! {
                status = child.wait() => {
                    exited = Some(status);
                    break Outcome::Exited;
                }
                () = &mut command_timeout => break Outcome::TimedOut,
                _ = stopped.changed() => break Outcome::Stopped,
                _ = tick.tick() => {
                    if self.clock.now_ms() >= slot.deadline.load(Ordering::SeqCst) {
                        break Outcome::Expired;
                    }
                }
            }
        };
        if outcome != Outcome::Exited && child.id().is_some() {
            // Not reaped yet, so the group id cannot have been reused: safe to kill.
            kill_group(pgid);
        }
        let status = match exited {
            Some(status) => status,
            None => child.wait().await,
        };
        group.pgid = None; // reaped: the id may be reused from now on
        let stdout = stdout.finish().await;
        let stderr = stderr.finish().await;
        let duration_ms = started.elapsed().as_millis() as u64;
        let reported_cwd = fs::read(&cwd_file).ok();
        let _ = fs::remove_file(&cwd_file);

        match outcome {
            Outcome::Expired => {
                let _guard = slot.lock.lock().await;
                if let Some(current) = self.read_meta(&name)? {
                    if current.instance == meta.instance {
                        self.discard(&name, &slot).await?;
                    }
                }
                Err(LocalError::gone(
                    &name,
                    "it expired while the command was running (the command was killed)",
                ))
            }
            Outcome::Stopped => Err(LocalError::gone(
                &name,
                "it was stopped while the command was running (the command was killed)",
            )),
            Outcome::TimedOut => Ok(ExecOutput {
                exit_code: 124,
                timed_out: true,
                stdout,
                stderr,
                duration_ms,
            }),
            Outcome::Exited => {
                // Killed by a stop that raced with its exit: the sandbox is gone all the same.
                if stopped.has_changed().unwrap_or(true) {
                    return Err(LocalError::gone(
                        &name,
                        "it was stopped while the command was running (the command was killed)",
                    ));
                }
                let status = status.map_err(LocalError::io("wait for the command in", &cwd))?;
                if let Some(reported) = reported_cwd.filter(|r| !r.is_empty()) {
                    let rel = relative_cwd(&workspace, &reported);
                    if let Err(e) = self.record_cwd(&name, &slot, &meta.instance, rel).await {
                        tracing::warn!(sandbox = %name.name, error = %e,
                            "could not record the command's working directory");
                    }
                }
                Ok(ExecOutput {
                    exit_code: exit_code(status),
                    timed_out: false,
                    stdout,
                    stderr,
                    duration_ms,
                })
            }
        }
    }

    /// Stores `rel` as the next command's starting directory, unless the sandbox was replaced
    /// meanwhile.
    async fn record_cwd(
        &self,
        name: &SandboxName,
        slot: &Slot,
        instance: &str,
        rel: String,
    ) -> Result<(), LocalError> {
        let _guard = slot.lock.lock().await;
        let Some(mut meta) = self.read_meta(name)? else {
            return Ok(());
        };
        if meta.instance != instance || meta.cwd == rel {
            return Ok(());
        }
        meta.cwd = rel;
        self.write_meta(&self.sandbox_dir(name), &meta)
    }

    async fn snapshot_sandbox(
        &self,
        task_id: &str,
        sandbox_id: &str,
        seq: u64,
    ) -> Result<SnapshotInfo, LocalError> {
        let task = TaskId::new(task_id)?;
        let name = SandboxName::parse(sandbox_id)?;
        let snap = SnapshotRef { task, seq };
        let path = self.snapshot_path(&snap);
        let slot = self.slot(&name);
        let _guard = slot.lock.lock().await;

        if let Some(size_bytes) = existing_archive(&snap, &path)? {
            // Taken before (a repeated call): make sure the sandbox is stopped, as it would be.
            self.discard(&name, &slot).await?;
            return Ok(SnapshotInfo {
                id: snap.id(),
                size_bytes,
                expires_at: None,
            });
        }
        let mut meta = self.live_meta(&name, &slot).await?;
        check_owner(&name, "task", &meta.task_id, snap.task.as_str())?;
        // A VM is paused for its snapshot: stop every process so no file changes under the walk.
        self.stop_processes(&name, &slot).await?;
        let sandbox_dir = self.sandbox_dir(&name);
        meta.status = SandboxStatus::Snapshotting;
        self.write_meta(&sandbox_dir, &meta)?;

        let header = ArchiveHeader {
            task_id: snap.task.to_string(),
            seq,
            installation_id: meta.installation_id.clone(),
            created_at: self.clock.now_ms(),
            source_sandbox: name.name.clone(),
        };
        let dir = path
            .parent()
            .expect("an archive path has a parent")
            .to_path_buf();
        let (tmp, in_flight) = self.temp_path(&dir, &format!("{seq}.{ARCHIVE_EXT}."), ".tmp");
        let workspace = self.workspace_dir(&name);
        let (snap2, path2) = (snap.clone(), path.clone());
        let written = run_blocking("write a snapshot archive", move || {
            let _in_flight = in_flight;
            write_archive(&snap2, &workspace, &header, &path2, &tmp)
        })
        .await;
        let (size_bytes, stats) = match written {
            Ok(done) => done,
            Err(e) => {
                meta.status = SandboxStatus::Running;
                let _ = self.write_meta(&sandbox_dir, &meta);
                return Err(e);
            }
        };
        for omitted in &stats.omitted {
            tracing::warn!(snapshot = %snap.id(), path = %omitted.path, reason = %omitted.reason,
                "left out of the snapshot");
        }
        self.discard(&name, &slot).await?;
        tracing::debug!(snapshot = %snap.id(), size_bytes, entries = stats.entries,
            "local snapshot taken");
        Ok(SnapshotInfo {
            id: snap.id(),
            size_bytes,
            expires_at: None,
        })
    }

    async fn stop(&self, sandbox_id: &str) -> Result<(), LocalError> {
        let name = SandboxName::parse(sandbox_id)?;
        let slot = self.slot(&name);
        let _guard = slot.lock.lock().await;
        self.discard(&name, &slot).await?;
        Ok(())
    }

    async fn extend(&self, sandbox_id: &str, duration_ms: u64) -> Result<Millis, LocalError> {
        let name = SandboxName::parse(sandbox_id)?;
        let slot = self.slot(&name);
        let _guard = slot.lock.lock().await;
        let mut meta = self.live_meta(&name, &slot).await?;
        meta.deadline = meta.deadline.saturating_add(duration_ms);
        self.write_meta(&self.sandbox_dir(&name), &meta)?;
        slot.deadline.store(meta.deadline, Ordering::SeqCst);
        Ok(meta.deadline)
    }

    async fn probe(&self, sandbox_id: &str) -> Result<Option<Millis>, LocalError> {
        let name = SandboxName::parse(sandbox_id)?;
        let slot = self.slot(&name);
        let _guard = slot.lock.lock().await;
        match self.live_meta(&name, &slot).await {
            Ok(meta) => Ok(Some(meta.deadline)),
            Err(LocalError::SandboxGone { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn delete(&self, snapshot_id: &str) -> Result<(), LocalError> {
        let snap = SnapshotRef::parse(snapshot_id)?;
        let path = self.snapshot_path(&snap);
        fs::remove_file(&path)
            .or_else(ignore_not_found)
            .map_err(LocalError::io("delete", &path))?;
        if let Some(dir) = path.parent() {
            // Drop the task's directory once its last archive is gone; a concurrent writer
            // re-creates it (see `write_archive`).
            let _ = fs::remove_dir(dir);
        }
        Ok(())
    }

    fn sandboxes_of(&self, installation_id: &str) -> Result<Vec<ListedResource>, LocalError> {
        let dir = self.root.join("sandboxes");
        let now = self.clock.now_ms();
        let mut found = Vec::new();
        for entry in fs::read_dir(&dir).map_err(LocalError::io("list", &dir))? {
            let entry = entry.map_err(LocalError::io("list", &dir))?;
            let Some(name) = entry
                .file_name()
                .to_str()
                .and_then(|n| SandboxName::parse(n).ok())
            else {
                tracing::warn!(path = %entry.path().display(), "not a sandbox directory; ignored");
                continue;
            };
            match self.read_meta(&name) {
                Ok(Some(meta)) if meta.installation_id == installation_id => {
                    found.push(ListedResource {
                        id: name.name.clone(),
                        task_id: Some(meta.task_id),
                        live: now < meta.deadline,
                    })
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(sandbox = %name.name, error = %e,
                    "unreadable sandbox meta; not listed"),
            }
        }
        found.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(found)
    }

    fn snapshots_of(&self, installation_id: &str) -> Result<Vec<ListedResource>, LocalError> {
        let dir = self.root.join("snapshots");
        let mut found = Vec::new();
        for task_dir in fs::read_dir(&dir).map_err(LocalError::io("list", &dir))? {
            let task_dir = task_dir.map_err(LocalError::io("list", &dir))?;
            let Some(task) = task_dir
                .file_name()
                .to_str()
                .and_then(|n| TaskId::new(n).ok())
            else {
                continue;
            };
            let path = task_dir.path();
            let entries = match fs::read_dir(&path) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(LocalError::io("list", &path)(e)),
            };
            for file in entries {
                let file = file.map_err(LocalError::io("list", &path))?;
                let Some(seq) = file.file_name().to_str().and_then(|n| {
                    n.strip_suffix(&format!(".{ARCHIVE_EXT}"))
                        .and_then(parse_canonical_u64)
                }) else {
                    continue; // temporaries and strangers
                };
                let snap = SnapshotRef {
                    task: task.clone(),
                    seq,
                };
                let header = fs::File::open(file.path())
                    .map_err(|e| e.to_string())
                    .and_then(|f| {
                        archive::read_prefix(&mut BufReader::new(f)).map_err(|e| e.to_string())
                    });
                match header {
                    Ok(header) if header.installation_id == installation_id => {
                        found.push(ListedResource {
                            id: snap.id(),
                            task_id: Some(header.task_id),
                            live: true,
                        })
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(snapshot = %snap.id(), error = %e,
                        "unreadable snapshot archive; not listed"),
                }
            }
        }
        found.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(found)
    }

    /// Removes what interrupted operations left behind: half-created and half-removed sandbox
    /// directories under `tmp/` and `*.tmp` archives, except those an operation of a live
    /// process is still using. Returns how many were removed.
    pub fn sweep_temporaries(&self) -> Result<usize, LocalError> {
        let mut stale = Vec::new();
        let tmp = self.root.join("tmp");
        for entry in fs::read_dir(&tmp).map_err(LocalError::io("list", &tmp))? {
            let entry = entry.map_err(LocalError::io("list", &tmp))?;
            stale.push(entry.path());
        }
        let snapshots = self.root.join("snapshots");
        for task_dir in fs::read_dir(&snapshots).map_err(LocalError::io("list", &snapshots))? {
            let task_dir = task_dir.map_err(LocalError::io("list", &snapshots))?;
            let Ok(entries) = fs::read_dir(task_dir.path()) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_name().as_bytes().ends_with(b".tmp") {
                    stale.push(entry.path());
                }
            }
        }
        let me = std::process::id();
        let mut removed = 0;
        for path in stale {
            let Some(owner) = temp_owner_pid(&path) else {
                continue; // not named by us: leave it alone
            };
            let busy = if owner == me {
                lock(&self.in_flight).contains(&path)
            } else {
                process_alive(owner)
            };
            if busy {
                continue;
            }
            let result = if path.is_dir() && !path.is_symlink() {
                remove_tree(&path)
            } else {
                fs::remove_file(&path).or_else(ignore_not_found)
            };
            result.map_err(LocalError::io("remove", &path))?;
            removed += 1;
        }
        Ok(removed)
    }
}

fn check_owner(
    name: &SandboxName,
    what: &'static str,
    owner: &str,
    expected: &str,
) -> Result<(), LocalError> {
    if owner == expected {
        return Ok(());
    }
    Err(LocalError::Ownership {
        sandbox: name.name.clone(),
        what,
        owner: owner.to_string(),
        expected: expected.to_string(),
    })
}

/// The pid in a temporary name (`<kind>.<pid>.<n>...` or `<seq>.tbx.<pid>.<n>.tmp`).
fn temp_owner_pid(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let mut parts = name.split('.');
    let first = parts.next()?;
    let pid = if first.bytes().all(|b| b.is_ascii_digit()) {
        // `<seq>.tbx.<pid>.<n>.tmp`
        (parts.next()? == ARCHIVE_EXT).then_some(())?;
        parts.next()?
    } else {
        parts.next()?
    };
    pid.parse().ok()
}

fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // Signal 0 checks existence; EPERM means it exists but is not ours.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The size of the complete archive of `snap` if one exists (checking its header names it).
fn existing_archive(snap: &SnapshotRef, path: &Path) -> Result<Option<u64>, LocalError> {
    let file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LocalError::io("open", path)(e)),
    };
    let size = file
        .metadata()
        .map_err(LocalError::io("inspect", path))?
        .len();
    let header =
        archive::read_prefix(&mut BufReader::new(file)).map_err(|source| LocalError::Archive {
            snapshot: snap.id(),
            path: path.to_path_buf(),
            source,
        })?;
    check_header(snap, path, &header)?;
    Ok(Some(size))
}

fn check_header(snap: &SnapshotRef, path: &Path, header: &ArchiveHeader) -> Result<(), LocalError> {
    if header.task_id != snap.task.as_str() || header.seq != snap.seq {
        return Err(LocalError::ArchiveMismatch {
            snapshot: snap.id(),
            path: path.to_path_buf(),
            found_task: header.task_id.escape_debug().to_string(),
            found_seq: header.seq,
        });
    }
    Ok(())
}

/// Writes the archive to `tmp`, fsyncs it, renames it to `path` and fsyncs the directory.
/// Returns its size.
fn write_archive(
    snap: &SnapshotRef,
    workspace: &Path,
    header: &ArchiveHeader,
    path: &Path,
    tmp: &Path,
) -> Result<(u64, PackStats), LocalError> {
    let dir = path.parent().expect("an archive path has a parent");
    let create = || {
        fs::create_dir_all(dir)?;
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(tmp)
    };
    // A concurrent delete may remove the task's (empty) directory between the two calls.
    let file = create()
        .or_else(|_| create())
        .map_err(LocalError::io("create", tmp))?;
    let result = (|| {
        let (file, stats) =
            archive::pack(workspace, header, file).map_err(|source| LocalError::Archive {
                snapshot: snap.id(),
                path: path.to_path_buf(),
                source,
            })?;
        file.sync_all().map_err(LocalError::io("fsync", tmp))?;
        let size = file
            .metadata()
            .map_err(LocalError::io("inspect", tmp))?
            .len();
        drop(file);
        fs::rename(tmp, path).map_err(LocalError::io("move into place", path))?;
        sync_dir(dir)?;
        Ok((size, stats))
    })();
    if result.is_err() {
        let _ = fs::remove_file(tmp);
    }
    result
}

/// Unpacks the archive of `snap` into `workspace` (which must not exist yet).
fn restore(snap: &SnapshotRef, path: &Path, workspace: &Path) -> Result<(), LocalError> {
    let file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LocalError::SnapshotGone {
                snapshot: snap.id(),
                path: path.to_path_buf(),
            })
        }
        Err(e) => return Err(LocalError::io("open", path)(e)),
    };
    let archive_err = |source| LocalError::Archive {
        snapshot: snap.id(),
        path: path.to_path_buf(),
        source,
    };
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let header = archive::read_prefix(&mut reader).map_err(archive_err)?;
    check_header(snap, path, &header)?;
    fs::create_dir(workspace).map_err(LocalError::io("create directory", workspace))?;
    archive::unpack_body(reader, workspace).map_err(archive_err)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), LocalError> {
    use std::io::Write;
    let mut file = fs::File::create(path).map_err(LocalError::io("create", path))?;
    file.write_all(bytes)
        .map_err(LocalError::io("write", path))?;
    file.sync_all().map_err(LocalError::io("fsync", path))
}

/// Makes a rename in `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), LocalError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(LocalError::io("fsync directory", dir))
}

fn ignore_not_found(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(e)
    }
}

/// Removes a directory tree, first making its directories writable if a command made them
/// read-only (which would otherwise make the removal fail for a non-root user).
fn remove_tree(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            let mut stack = vec![path.to_path_buf()];
            while let Some(dir) = stack.pop() {
                let Ok(meta) = fs::symlink_metadata(&dir) else {
                    continue;
                };
                if !meta.is_dir() {
                    continue;
                }
                let mode = meta.permissions().mode();
                if mode & 0o700 != 0o700 {
                    let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(mode | 0o700));
                }
                if let Ok(entries) = fs::read_dir(&dir) {
                    stack.extend(entries.flatten().map(|e| e.path()));
                }
            }
            fs::remove_dir_all(path).or_else(ignore_not_found)
        }
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

// ---------------------------------------------------------------------------------------------
// Processes

/// How a command's wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Exited,
    TimedOut,
    Stopped,
    Expired,
}

/// Kills the command's process group if the exec future is dropped before the command ended.
struct GroupGuard {
    pgid: Option<u32>,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid {
            kill_group(pgid);
        }
    }
}

fn kill_group(pgid: u32) {
    if let Ok(pgid) = libc::pid_t::try_from(pgid) {
        // SIGKILL: a command that ignores SIGTERM must not outlive its timeout.
        unsafe {
            libc::killpg(pgid, libc::SIGKILL);
        }
    }
}

/// Kills every process started in `workspace`'s sandbox that is still running, found by the
/// `TASKBOX_WORKSPACE` variable each command's processes inherit. This catches background jobs
/// of finished commands and processes that left the command's process group, as a VM stop
/// would. Only Linux exposes other processes' environments; elsewhere only the running
/// commands (their process groups) are killed.
fn kill_leftovers(workspace: &Path) -> usize {
    #[cfg(target_os = "linux")]
    {
        let marker = [b"TASKBOX_WORKSPACE=", workspace.as_os_str().as_bytes()].concat();
        let me = std::process::id();
        let Ok(procs) = fs::read_dir("/proc") else {
            return 0;
        };
        let mut killed = 0;
        for entry in procs.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<libc::pid_t>().ok())
            else {
                continue;
            };
            if pid as u32 == me {
                continue;
            }
            let Ok(environ) = fs::read(entry.path().join("environ")) else {
                continue;
            };
            if environ
                .split(|b| *b == 0)
                .any(|var| var == marker.as_slice())
            {
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
                killed += 1;
            }
        }
        killed
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = workspace;
        0
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|sig| 128 + sig))
        .unwrap_or(-1)
}

/// Single-quotes `s` for bash.
fn shell_quote(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len() + 2);
    out.push(b'\'');
    for &b in s {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.push(b'\'');
    out
}

/// The script `bash -c` runs: the user's command, preceded (on the same line, so its line
/// numbers are unchanged) by an EXIT trap that writes the final working directory to `cwd_file`
/// and exits with the command's own status. The trap also runs on `exit N`; it writes nothing to
/// the command's stdout or stderr. (Subshells do not inherit the trap, so only the command's own
/// shell reports.)
fn wrap_command(command: &str, cwd_file: &Path) -> OsString {
    // `builtin` in case the command defined functions of these names; `>|` in case it set
    // noclobber; `|| true` in case it set errexit and its directory was deleted meanwhile.
    let mut trap_body = b"__taskbox_status=$?; { builtin pwd -P >| ".to_vec();
    trap_body.extend_from_slice(&shell_quote(cwd_file.as_os_str().as_bytes()));
    trap_body.extend_from_slice(b"; } 2>/dev/null || true; builtin exit $__taskbox_status");
    let mut script = b"trap ".to_vec();
    script.extend_from_slice(&shell_quote(&trap_body));
    script.extend_from_slice(b" EXIT; ");
    script.extend_from_slice(command.as_bytes());
    OsString::from_vec(script)
}

/// The directory a command starts in: the recorded one if it still exists inside the
/// workspace, else the workspace root.
fn resolve_cwd(workspace: &Path, recorded: &str) -> PathBuf {
    if recorded.is_empty() {
        return workspace.to_path_buf();
    }
    match fs::canonicalize(workspace.join(recorded)) {
        Ok(real) if real.starts_with(workspace) && real.is_dir() => real,
        _ => workspace.to_path_buf(),
    }
}

/// The recorded form of the directory a command ended in: relative to the workspace, or `""`
/// (the root) when it is outside the workspace or not representable.
fn relative_cwd(workspace: &Path, reported: &[u8]) -> String {
    let reported = reported.strip_suffix(b"\n").unwrap_or(reported);
    let path = Path::new(std::ffi::OsStr::from_bytes(reported));
    path.strip_prefix(workspace)
        .ok()
        .and_then(|rel| rel.to_str())
        .map(str::to_string)
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Output capture

/// Characters kept from the start of a stream (as `bound_output` keeps them).
const HEAD_CHARS: usize = MAX_OUTPUT_CHARS * 2 / 5;
/// Characters kept from the end of a stream.
const TAIL_CHARS: usize = MAX_OUTPUT_CHARS - HEAD_CHARS;
/// Bytes that always hold at least `HEAD_CHARS` whole characters (UTF-8 uses at most 4 bytes
/// per character; the slack covers a character cut at the boundary).
const HEAD_BYTES: usize = HEAD_CHARS * 4 + 4;
/// Bytes that always hold at least `TAIL_CHARS` whole characters.
const TAIL_BYTES: usize = TAIL_CHARS * 4 + 4;

/// A stream's first and last bytes plus counts, in bounded memory however much is written.
#[derive(Debug, Default)]
struct Capture {
    head: Vec<u8>,
    tail: Vec<u8>,
    total_bytes: u64,
    /// Characters seen, counted as bytes that do not continue a UTF-8 sequence.
    total_chars: u64,
    /// The command's result was taken: later bytes (a background job's) are drained unseen.
    detached: bool,
}

impl Capture {
    fn push(&mut self, data: &[u8]) {
        if self.detached {
            return;
        }
        self.total_bytes += data.len() as u64;
        self.total_chars += data.iter().filter(|b| (**b & 0xC0) != 0x80).count() as u64;
        let room = HEAD_BYTES - self.head.len();
        let (to_head, rest) = data.split_at(room.min(data.len()));
        self.head.extend_from_slice(to_head);
        self.tail.extend_from_slice(rest);
        // Trim in batches so the cost stays linear in the output size.
        if self.tail.len() > 2 * TAIL_BYTES {
            self.tail.drain(..self.tail.len() - TAIL_BYTES);
        }
    }

    /// The captured text, bounded exactly as [`bound_output`] bounds it.
    fn finish(mut self) -> String {
        if self.tail.len() > TAIL_BYTES {
            self.tail.drain(..self.tail.len() - TAIL_BYTES);
        }
        let kept = (self.head.len() + self.tail.len()) as u64;
        if self.total_bytes == kept {
            let mut all = self.head;
            all.extend_from_slice(&self.tail);
            return bound_output(&String::from_utf8_lossy(&all), MAX_OUTPUT_CHARS);
        }
        // The middle was never kept. The text is what `bound_output` would make of the whole
        // stream (the same format), built from the parts kept.
        let head: String = String::from_utf8_lossy(&self.head)
            .chars()
            .take(HEAD_CHARS)
            .collect();
        let start = self
            .tail
            .iter()
            .position(|b| (*b & 0xC0) != 0x80)
            .unwrap_or(self.tail.len());
        let tail_text = String::from_utf8_lossy(&self.tail[start..]).into_owned();
        let tail_len = tail_text.chars().count();
        let tail: String = tail_text
            .chars()
            .skip(tail_len.saturating_sub(TAIL_CHARS))
            .collect();
        let total = self.total_chars;
        let omitted = total.saturating_sub((HEAD_CHARS + TAIL_CHARS) as u64);
        format!(
            "{head}\n[taskbox: output truncated, {omitted} of {total} characters omitted]\n{tail}"
        )
    }
}

/// Reads one of the command's pipes into a [`Capture`] on its own task, so stdout and stderr
/// drain concurrently and neither can fill up and block the command.
struct Pump {
    capture: Arc<Mutex<Capture>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Pump {
    fn start<R: AsyncRead + Unpin + Send + 'static>(pipe: Option<R>) -> Pump {
        let capture = Arc::new(Mutex::new(Capture::default()));
        let task = pipe.map(|mut pipe| {
            let capture = capture.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match pipe.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => lock(&capture).push(&buf[..n]),
                    }
                }
            })
        });
        Pump { capture, task }
    }

    /// Waits for the pipe to close and returns the bounded text. A background job that
    /// inherited the pipe keeps it open: after [`OUTPUT_GRACE`] the text is taken as it is, and
    /// the task goes on draining the pipe unseen (closing it would kill the job with SIGPIPE on
    /// its next write) until the job exits or the sandbox is stopped.
    async fn finish(mut self) -> String {
        if let Some(mut task) = self.task.take() {
            if tokio::time::timeout(OUTPUT_GRACE, &mut task).await.is_err() {
                tracing::debug!("a background job holds the command's output open; detached");
            }
        }
        let mut capture = lock(&self.capture);
        let taken = std::mem::take(&mut *capture);
        capture.detached = true;
        drop(capture);
        taken.finish()
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        // Still set only when the exec was cancelled before `finish`: its group is being killed.
        if let Some(task) = &self.task {
            task.abort();
        }
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
        sandbox_id: &'a str,
        req: &'a ExecRequest,
    ) -> ProviderFuture<'a, ExecOutput> {
        Box::pin(async move {
            self.exec_command(sandbox_id, req)
                .await
                .map_err(|e| e.into_provider("run command"))
        })
    }

    fn snapshot<'a>(
        &'a self,
        task_id: &'a str,
        sandbox_id: &'a str,
        seq: u64,
    ) -> ProviderFuture<'a, SnapshotInfo> {
        Box::pin(async move {
            self.snapshot_sandbox(task_id, sandbox_id, seq)
                .await
                .map_err(|e| e.into_provider("take snapshot"))
        })
    }

    fn stop_sandbox<'a>(&'a self, sandbox_id: &'a str) -> ProviderFuture<'a, ()> {
        Box::pin(async move {
            self.stop(sandbox_id)
                .await
                .map_err(|e| e.into_provider("stop sandbox"))
        })
    }

    fn extend_timeout<'a>(
        &'a self,
        sandbox_id: &'a str,
        duration_ms: u64,
    ) -> ProviderFuture<'a, Millis> {
        Box::pin(async move {
            self.extend(sandbox_id, duration_ms)
                .await
                .map_err(|e| e.into_provider("extend timeout"))
        })
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> ProviderFuture<'a, ()> {
        Box::pin(async move {
            self.delete(snapshot_id)
                .await
                .map_err(|e| e.into_provider("delete snapshot"))
        })
    }

    fn probe_sandbox<'a>(&'a self, sandbox_id: &'a str) -> ProviderFuture<'a, Option<Millis>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_names_round_trip_and_reject_lookalikes() {
        let name = SandboxName::parse("taskbox-a-g1-g12-abc123").unwrap();
        assert_eq!(name.task.as_str(), "a-g1");
        assert_eq!(name.generation, 12);
        for bad in [
            "",
            "taskbox-",
            "taskbox--g1-abc",
            "taskbox-a-g-abc",
            "taskbox-a-g01-abc",
            "taskbox-a-g+1-abc",
            "taskbox-../x-g1-abc",
            "taskbox-a/b-g1-abc",
            "sandbox-a-g1-abc",
            "taskbox-a.b-g1-abc",
            "taskbox-a-g1-abc/..",
            "taskbox-a-g1-ABC",
            "taskbox-a-g1",
        ] {
            assert!(SandboxName::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn snapshot_ids_round_trip_and_reject_lookalikes() {
        let snap = SnapshotRef::parse("task-1.s7").unwrap();
        assert_eq!((snap.task.as_str(), snap.seq), ("task-1", 7));
        assert_eq!(snap.id(), "task-1.s7");
        for bad in [
            "", "task", "task.7", "task.s", "task.s07", "task.s-1", "../x.s1", "a.b.s1",
            "task.s1.", ".s1",
        ] {
            assert!(SnapshotRef::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn capture_matches_bound_output_whether_or_not_it_drops_the_middle() {
        for text in [
            "short".to_string(),
            "é".repeat(60_000),
            "0123456789\n".repeat(100_000),
            "ab€𝄞".repeat(90_000),
        ] {
            let mut capture = Capture::default();
            for chunk in text.as_bytes().chunks(7_777) {
                capture.push(chunk);
            }
            assert_eq!(
                capture.finish(),
                bound_output(&text, MAX_OUTPUT_CHARS),
                "input of {} bytes",
                text.len()
            );
        }
    }

    #[test]
    fn capture_memory_stays_bounded() {
        let mut capture = Capture::default();
        let chunk = vec![b'y'; 65_536];
        for _ in 0..200 {
            capture.push(&chunk);
            assert!(capture.head.len() + capture.tail.len() <= HEAD_BYTES + 2 * TAIL_BYTES);
        }
    }

    #[test]
    fn cwd_is_recorded_relative_to_the_workspace_only() {
        let ws = Path::new("/data/local/sandboxes/taskbox-t-g1/workspace");
        assert_eq!(
            relative_cwd(ws, b"/data/local/sandboxes/taskbox-t-g1/workspace/a/b\n"),
            "a/b"
        );
        assert_eq!(
            relative_cwd(ws, b"/data/local/sandboxes/taskbox-t-g1/workspace\n"),
            ""
        );
        assert_eq!(relative_cwd(ws, b"/tmp\n"), "");
        assert_eq!(
            relative_cwd(ws, b"/data/local/sandboxes/taskbox-t-g1/workspace2\n"),
            ""
        );
    }

    #[test]
    fn temporary_names_carry_their_owner() {
        assert_eq!(
            temp_owner_pid(Path::new("/r/tmp/create.123.4.taskbox-t-g1")),
            Some(123)
        );
        assert_eq!(
            temp_owner_pid(Path::new("/r/snapshots/t/7.tbx.55.0.tmp")),
            Some(55)
        );
        assert_eq!(temp_owner_pid(Path::new("/r/tmp/whatever")), None);
    }

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(shell_quote(b"a'b"), b"'a'\\''b'".to_vec());
    }
}
