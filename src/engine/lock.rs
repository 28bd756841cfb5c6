//! The per-task lock that keeps two processes from driving one task, taken before a task is
//! loaded and held until shutdown. The OS releases it when the process dies, so a crash never
//! leaves a task locked.
//!
//! It is two locks, because a lock *file* alone can be unlinked from under its holder (a user
//! cleaning up, `rm -rf locks/`): the next process would create a new file, lock it and drive
//! the task beside the first. So:
//!
//! - an exclusive `flock` on `<data dir>/locks/<task>.lock`, re-checked after locking: if the
//!   path no longer names the locked file (it was unlinked or replaced meanwhile), the lock is
//!   dropped and taken again on the file the path names now;
//! - on Linux, a bound *abstract* Unix socket named after the data directory's identity (device
//!   and inode) and the task. An abstract name has no file to unlink; only its holder's death or
//!   release frees it. (It is per network namespace: processes sharing a data dir must share
//!   one, as they share a machine.)
//!
//! A lock costs two descriptors, so it is held only while the task needs it: while a caller
//! is being served ([`Claim`]) or the event loop has the task loaded. The loop unloads a task
//! that has nothing live (no sandbox, no operation, no timer, no caller) and tells
//! [`TaskLocks::unloaded`]; the lock goes when its last claim does. A server's descriptors are
//! bounded by its live work, not by every task it ever drove; the next request takes the lock
//! again and loads the task from the journal.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::EngineError;
use crate::ids::TaskId;

/// One held task lock; dropping it releases both parts.
struct Held {
    _file: File,
    #[cfg(target_os = "linux")]
    _name: std::os::unix::net::UnixListener,
    /// Callers holding a [`Claim`] on it now.
    claims: usize,
    /// The event loop has the task loaded (between [`TaskLocks::loaded`] and
    /// [`TaskLocks::unloaded`]).
    loaded: bool,
}

/// A caller's hold on a task's lock, from [`TaskLocks::acquire`] until it is answered: the
/// lock is not released under it. Dropping the last claim of a task the event loop does not
/// have loaded releases the lock.
#[must_use = "the lock may be released as soon as the claim is dropped"]
pub(super) struct Claim {
    locks: Arc<TaskLocks>,
    task: TaskId,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock().expect("locks mutex");
        if let Some(h) = held.get_mut(&self.task) {
            h.claims = h.claims.saturating_sub(1);
            if h.claims == 0 && !h.loaded {
                held.remove(&self.task);
            }
        }
    }
}

/// How often a held lock is tried again.
const POLL: Duration = Duration::from_millis(10);
/// How long a wait goes unreported (a forked child's copy of the descriptor holds the lock
/// for well under this).
const WARN_AFTER: Duration = Duration::from_millis(500);

/// A wait for a task's lock that another process holds, as it begins: told at once to the
/// hook of [`OrchestratorBuilder::on_lock_wait`](super::OrchestratorBuilder::on_lock_wait).
#[derive(Debug, Clone)]
pub struct LockWait {
    /// The task.
    pub task: TaskId,
    /// The holder's process id, as it wrote it in the lock file (`None`: not written yet, or
    /// unreadable).
    pub holder: Option<u32>,
    /// The holder is a `taskbox serve` (by its command line).
    pub holder_is_server: bool,
    /// How long the wait may last before it fails as `busy`.
    pub limit: Duration,
}

/// What an orchestrator's owner is told when a lock wait begins.
pub(super) type LockWaitHook = Arc<dyn Fn(&LockWait) + Send + Sync>;

/// The task locks one orchestrator holds, and where and how long to wait for them.
pub(super) struct TaskLocks {
    /// Held locks by task id; dropping one releases it.
    held: Mutex<HashMap<TaskId, Held>>,
    /// One gate per task whose lock a caller of this process is taking now. A second caller
    /// for the same task waits at the gate for the first's outcome: trying the file itself
    /// would find it locked — by this very process, through the first caller's descriptor —
    /// and wait the whole `wait` for a holder that is itself.
    taking: Mutex<HashMap<TaskId, Arc<tokio::sync::Mutex<()>>>>,
    dir: PathBuf,
    wait: Duration,
    /// Wait for a held lock on the calling thread itself (see [`TaskLocks::acquire`]).
    hold_runtime: bool,
    /// Told when a wait for another process begins.
    on_wait: Option<LockWaitHook>,
}

impl TaskLocks {
    /// Locks under `dir`, waiting up to `wait` for another process to let go of one.
    /// `hold_runtime`: the engine runs on a virtual clock (a simulation), where a wait must
    /// stop every other task of the runtime too.
    pub(super) fn new(dir: PathBuf, wait: Duration, hold_runtime: bool) -> TaskLocks {
        TaskLocks {
            held: Mutex::new(HashMap::new()),
            taking: Mutex::new(HashMap::new()),
            dir,
            wait,
            hold_runtime,
            on_wait: None,
        }
    }

    /// Tells `hook` when a wait for another process's lock begins.
    pub(super) fn on_wait(mut self, hook: Option<LockWaitHook>) -> TaskLocks {
        self.on_wait = hook;
        self
    }

    /// Takes the task's lock (or a claim on it, when this orchestrator holds it already),
    /// waiting for another process to let go. Callers of this process asking for the same
    /// task at once take it once: the first takes it, the others wait for that and share it.
    pub(super) async fn acquire(self: &Arc<Self>, task: &TaskId) -> Result<Claim, EngineError> {
        if let Some(claim) = self.claim_held(task) {
            return Ok(claim);
        }
        let gate = self
            .taking
            .lock()
            .expect("locks mutex")
            .entry(task.clone())
            .or_default()
            .clone();
        let taken = {
            let _turn = gate.lock().await;
            match self.claim_held(task) {
                Some(claim) => Ok(claim),
                None => self.take(task).await,
            }
        };
        // The last caller through the gate removes it (the map's copy and ours are the two
        // left), so the map holds only tasks being taken now.
        let mut taking = self.taking.lock().expect("locks mutex");
        if Arc::strong_count(&gate) == 2 {
            taking.remove(task);
        }
        taken
    }

    /// A claim on the task's lock if this orchestrator holds it.
    fn claim_held(self: &Arc<Self>, task: &TaskId) -> Option<Claim> {
        let mut held = self.held.lock().expect("locks mutex");
        let h = held.get_mut(task)?;
        h.claims += 1;
        Some(Claim {
            locks: self.clone(),
            task: task.clone(),
        })
    }

    /// The event loop loaded `task` (under a caller's claim): its lock stays until the loop
    /// unloads it.
    pub(super) fn loaded(&self, task: &TaskId) {
        if let Some(h) = self.held.lock().expect("locks mutex").get_mut(task) {
            h.loaded = true;
        }
    }

    /// The event loop unloaded `task`: its lock goes now, or with its last claim.
    pub(super) fn unloaded(&self, task: &TaskId) {
        let mut held = self.held.lock().expect("locks mutex");
        if let Some(h) = held.get_mut(task) {
            h.loaded = false;
            if h.claims == 0 {
                held.remove(task);
            }
        }
    }

    /// How many task locks this orchestrator holds.
    #[cfg(test)]
    fn held_count(&self) -> usize {
        self.held.lock().expect("locks mutex").len()
    }

    /// Takes the task's lock with one claim on it, waiting up to `wait` for another process to
    /// let go; the caller is alone at the task's gate.
    async fn take(self: &Arc<Self>, task: &TaskId) -> Result<Claim, EngineError> {
        let id = task;
        let path = self.dir.join(format!("{id}.lock"));
        let lock_err = |source| EngineError::Lock {
            task: task.clone(),
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(lock_err)?;
        // The wait is counted in polls, and each poll sleeps on a blocking-pool thread, not on
        // the runtime's clock: a lock can be held for a moment by no taskbox at all — a child
        // that another thread of this process is forking has a copy of the lock's descriptor
        // (and so holds the `flock`) until it execs — and on a paused (virtual) clock a timer
        // here would move simulated time by however often that happened to coincide, so the
        // same seed would not give the same run. A blocking-pool wait stops virtual time.
        let mut waited = Duration::ZERO;
        let mut warned = false;
        let held = loop {
            match try_lock(&self.dir, &path, task).map_err(lock_err)? {
                Some(held) => break held,
                None => {
                    if waited.is_zero() {
                        if let Some(hook) = &self.on_wait {
                            let holder = holder(&path);
                            hook(&LockWait {
                                task: task.clone(),
                                holder,
                                holder_is_server: holder.is_some_and(is_server),
                                limit: self.wait,
                            });
                        }
                    }
                    if waited >= self.wait {
                        return Err(EngineError::Busy {
                            task: task.clone(),
                            path: path.clone(),
                            waited_secs: waited.as_secs(),
                        });
                    }
                    if !warned && waited >= WARN_AFTER {
                        tracing::info!(task = %id, "waiting for another taskbox process driving this task");
                        warned = true;
                    }
                    // Blocks a blocking-pool thread, never the runtime, for one poll interval —
                    // except in a simulation (a virtual clock, one runtime thread): there the
                    // other tasks must not run on while this one waits either, or requests of
                    // the same virtual instant reach the engine (and the simulated platform's
                    // seeded draws) in another order than without the wait, and the same seed
                    // would not give the same run. The wait is for a moment (a forking child
                    // holding a copy of the lock's descriptor), or a real bug.
                    if self.hold_runtime {
                        #[allow(clippy::disallowed_methods)]
                        std::thread::sleep(POLL);
                    } else {
                        #[allow(clippy::disallowed_methods)]
                        let _ = tokio::task::spawn_blocking(|| std::thread::sleep(POLL)).await;
                    }
                    waited += POLL;
                }
            }
        };
        self.held
            .lock()
            .expect("locks mutex")
            .insert(id.clone(), held);
        Ok(Claim {
            locks: self.clone(),
            task: task.clone(),
        })
    }

    /// Lets go of every task lock (closing a lock file releases its `flock`, closing the socket
    /// frees its name).
    pub(super) fn release_all(&self) {
        self.held.lock().expect("locks mutex").clear();
    }
}

/// The process id the lock file at `path` names (its holder wrote it when it took the lock).
fn holder(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether the process `pid` is a `taskbox serve`, by its command line.
fn is_server(pid: u32) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    cmdline.split(|b| *b == 0).any(|arg| arg == b"serve")
}

/// One attempt at both parts of the lock; `Ok(None)` while another holder has either.
fn try_lock(dir: &Path, path: &Path, task: &TaskId) -> std::io::Result<Option<Held>> {
    let Some(file) = lock_file(path)? else {
        return Ok(None);
    };
    #[cfg(target_os = "linux")]
    {
        let data_dir = dir.parent().unwrap_or(dir);
        let Some(name) = bind_abstract(data_dir, task)? else {
            return Ok(None);
        };
        Ok(Some(Held {
            _file: file,
            _name: name,
            claims: 1,
            loaded: false,
        }))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (dir, task);
        Ok(Some(Held {
            _file: file,
            claims: 1,
            loaded: false,
        }))
    }
}

/// Opens and `flock`s the lock file, and checks that the path still names the file locked: a
/// file unlinked (or replaced) between the open and the lock would be a lock nobody else sees,
/// so it is dropped and the path's current file locked instead.
fn lock_file(path: &Path) -> std::io::Result<Option<File>> {
    lock_file_with(path, || {})
}

/// [`lock_file`], calling `between` after each open and before its `flock` (where a test
/// replaces the file).
fn lock_file_with(path: &Path, mut between: impl FnMut()) -> std::io::Result<Option<File>> {
    use std::os::unix::fs::MetadataExt;
    loop {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        between();
        if !try_flock(&file)? {
            return Ok(None);
        }
        let locked = file.metadata()?;
        match std::fs::metadata(path) {
            Ok(now) if now.dev() == locked.dev() && now.ino() == locked.ino() => {
                // Ours now: say who holds it, for a waiter's message.
                use std::io::Write;
                file.set_len(0)?;
                (&file).write_all(std::process::id().to_string().as_bytes())?;
                return Ok(Some(file));
            }
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The abstract socket name of a task's lock: the data directory's device and inode (two data
/// dirs never share a name, one reached by two paths always does) and the task id. At most
/// 8 + 16 + 1 + 16 + 1 + 64 = 106 bytes, within the 107 an abstract name may have.
#[cfg(target_os = "linux")]
fn abstract_name(data_dir: &Path, task: &TaskId) -> std::io::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(data_dir)?;
    Ok(format!(
        "taskbox:{:x}:{:x}:{}",
        meta.dev(),
        meta.ino(),
        task.as_str()
    ))
}

/// Binds the task's abstract socket name; `Ok(None)` if another holder has it bound.
#[cfg(target_os = "linux")]
fn bind_abstract(
    data_dir: &Path,
    task: &TaskId,
) -> std::io::Result<Option<std::os::unix::net::UnixListener>> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    let name = abstract_name(data_dir, task)?;
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    match UnixListener::bind_addr(&addr) {
        Ok(listener) => Ok(Some(listener)),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Ok(None),
        Err(e) => Err(e),
    }
}

/// Takes an exclusive advisory lock without blocking; `Ok(false)` if another holder has it.
/// Shared with the client's autostart lock and the server's serve lock: the one `unsafe` call
/// for `flock` in taskbox.
pub(crate) fn try_flock(file: &File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: `flock` takes a file descriptor and two flags and touches no memory of ours, so
    // the only requirement is a valid descriptor: `file` is borrowed for the whole call, so its
    // descriptor stays open (and is not reused for another file) until `flock` returns. An
    // invalid descriptor would only make `flock` fail with EBADF, reported as an error below.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Callers of one process asking for a new task's lock at the same moment all get it: none
    /// waits for the process's own lock (issue 32 item 1: one of twenty parallel first
    /// commands waited 900 s for "another taskbox process" that was its own server).
    #[test]
    fn parallel_callers_of_one_process_share_the_lock() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("temp dir");
        rt.block_on(async {
            let locks = Arc::new(TaskLocks::new(
                dir.path().join("locks"),
                Duration::from_millis(300),
                false,
            ));
            for round in 0..200 {
                let task = TaskId::new(&format!("t{round}")).expect("task id");
                let start = Arc::new(tokio::sync::Barrier::new(20));
                let callers: Vec<_> = (0..20)
                    .map(|_| {
                        let (locks, task, start) = (locks.clone(), task.clone(), start.clone());
                        tokio::spawn(async move {
                            start.wait().await;
                            locks.acquire(&task).await
                        })
                    })
                    .collect();
                let mut claims = Vec::new();
                for caller in callers {
                    match caller.await.expect("caller") {
                        Ok(claim) => claims.push(claim),
                        Err(e) => panic!("round {round}: {e:?}"),
                    }
                }
                assert_eq!(locks.held_count(), 1, "round {round}");
                drop(claims);
                assert_eq!(locks.held_count(), 0, "the last claim released the lock");
            }
            assert!(
                locks.taking.lock().expect("locks mutex").is_empty(),
                "no gate outlives its acquisitions"
            );
        });
    }

    /// A lock is held while the event loop has its task loaded or a caller holds a claim, and
    /// goes when neither does (issue 32 item 4: every lock ever taken was held until shutdown,
    /// two descriptors per task).
    #[test]
    fn a_lock_goes_when_its_task_is_unloaded_and_its_claims_dropped() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("temp dir");
        let locks = Arc::new(TaskLocks::new(
            dir.path().join("locks"),
            Duration::from_millis(100),
            false,
        ));
        let task = TaskId::new("t").expect("task id");
        rt.block_on(async {
            // Loaded under a claim: kept after the claim.
            let claim = locks.acquire(&task).await.expect("lock");
            locks.loaded(&task);
            drop(claim);
            assert_eq!(locks.held_count(), 1);
            // Unloaded while a caller holds a claim: kept until the claim goes.
            let claim = locks.acquire(&task).await.expect("lock");
            locks.unloaded(&task);
            assert_eq!(locks.held_count(), 1);
            drop(claim);
            assert_eq!(locks.held_count(), 0);
            // Released for real: another holder (a second orchestrator) takes it at once.
            let other = Arc::new(TaskLocks::new(
                dir.path().join("locks"),
                Duration::from_millis(100),
                false,
            ));
            let _theirs = other.acquire(&task).await.expect("the released lock");
            assert!(matches!(
                locks.acquire(&task).await,
                Err(EngineError::Busy { .. })
            ));
        });
    }

    /// The lock file replaced between its open and its `flock` (a user cleaning up, another
    /// process recreating it): the taker notices the path names another file now and locks that
    /// one, the file every later taker opens. Only the file part, without the abstract socket
    /// that would keep two holders apart on its own (issue 33).
    #[test]
    fn a_lock_file_replaced_before_its_flock_is_taken_again_on_the_new_file() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("t.lock");
        let mut replaced = None;
        let file = lock_file_with(&path, || {
            if replaced.is_none() {
                let new = dir.path().join("t.lock.new");
                std::fs::write(&new, b"").expect("write the new file");
                std::fs::rename(&new, &path).expect("replace the lock file");
                replaced = Some(std::fs::metadata(&path).expect("the new file").ino());
            }
        })
        .expect("lock")
        .expect("nobody else holds it");
        let now = std::fs::metadata(&path).expect("the lock file").ino();
        assert_eq!(replaced, Some(now));
        assert_eq!(
            file.metadata().expect("the locked file").ino(),
            now,
            "the lock is on the file the path names"
        );
        // And it is held there: another open of the path cannot lock it.
        let other = std::fs::File::open(&path).expect("open");
        assert!(!try_flock(&other).expect("flock"));
    }
}
