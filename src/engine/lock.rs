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
        let started = tokio::time::Instant::now();
        let mut warned = false;
        loop {
            match try_flock(&file) {
                Ok(true) => break,
                Ok(false) => {
                    if !warned {
                        tracing::info!(task = %id, "waiting for another taskbox process driving this task");
                        warned = true;
                    }
                    if started.elapsed() >= self.wait {
                        return Err(EngineError::Busy {
                            task: id.clone(),
                            path: path.clone(),
                            waited_secs: started.elapsed().as_secs(),
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
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
