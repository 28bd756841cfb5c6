//! The per-task lock that keeps two processes from driving one task: an exclusive `flock` on
//! `<data dir>/locks/<task>.lock`, taken before a task is loaded and held until shutdown. The OS
//! releases it when the process dies, so a crash never leaves a task locked.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use super::EngineError;
use crate::ids::TaskId;

/// How often a held lock is tried again.
const POLL: Duration = Duration::from_millis(10);
/// How long a wait goes unreported (a forked child's copy of the descriptor holds the lock
/// for well under this).
const WARN_AFTER: Duration = Duration::from_millis(500);

/// The task locks one orchestrator holds, and where and how long to wait for them.
pub(super) struct TaskLocks {
    /// Held locks by task id; dropping a file releases its lock.
    held: Mutex<HashMap<String, File>>,
    dir: PathBuf,
    wait: Duration,
}

impl TaskLocks {
    /// Locks under `dir`, waiting up to `wait` for another process to let go of one.
    pub(super) fn new(dir: PathBuf, wait: Duration) -> TaskLocks {
        TaskLocks {
            held: Mutex::new(HashMap::new()),
            dir,
            wait,
        }
    }

    /// Takes the task's lock (once per orchestrator), waiting for another process to let go.
    pub(super) async fn acquire(&self, task: &TaskId) -> Result<(), EngineError> {
        let id = task.as_str().to_string();
        if self.held.lock().expect("locks mutex").contains_key(&id) {
            return Ok(());
        }
        let path = self.dir.join(format!("{id}.lock"));
        let lock_err = |source| EngineError::Lock {
            task: id.clone(),
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(lock_err)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(lock_err)?;
        // The wait is counted in polls, and each poll sleeps on a blocking-pool thread, not on
        // the runtime's clock: a lock can be held for a moment by no taskbox at all — a child
        // that another thread of this process is forking has a copy of the lock's descriptor
        // (and so holds the `flock`) until it execs — and on a paused (virtual) clock a timer
        // here would move simulated time by however often that happened to coincide, so the
        // same seed would not give the same run. A blocking-pool wait stops virtual time.
        let mut waited = Duration::ZERO;
        let mut warned = false;
        loop {
            match try_flock(&file) {
                Ok(true) => break,
                Ok(false) => {
                    if waited >= self.wait {
                        return Err(EngineError::Busy {
                            task: id.clone(),
                            path: path.clone(),
                            waited_secs: waited.as_secs(),
                        });
                    }
                    if !warned && waited >= WARN_AFTER {
                        tracing::info!(task = %id, "waiting for another taskbox process driving this task");
                        warned = true;
                    }
                    // Blocks a blocking-pool thread, never the runtime, for one poll interval.
                    #[allow(clippy::disallowed_methods)]
                    let _ = tokio::task::spawn_blocking(|| std::thread::sleep(POLL)).await;
                    waited += POLL;
                }
                Err(e) => return Err(lock_err(e)),
            }
        }
        self.held.lock().expect("locks mutex").insert(id, file);
        Ok(())
    }

    /// Lets go of every task lock (closing a lock file releases its `flock`).
    pub(super) fn release_all(&self) {
        self.held.lock().expect("locks mutex").clear();
    }
}

/// Takes an exclusive advisory lock without blocking; `Ok(false)` if another holder has it.
/// Shared with the client's autostart lock: the one `unsafe` call for `flock` in taskbox.
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
