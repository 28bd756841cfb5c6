//! The re-drive's throwaway data directories: a [`Scratch`] root removed on drop, and a fresh
//! directory per session with the store carried over.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::engine::STORE_FILE;

use super::RedriveError;

/// The data directory of session `n`: a fresh one per session, with the store moved over from
/// the previous session (closed by then). Fresh, because a task lock file that another session
/// ever opened may still be held for a moment by a child process forked elsewhere in this
/// process (a forked child holds copies of every descriptor until it execs): the engine would
/// then wait for the lock in *virtual* time, and the session's clock would run away.
pub(super) fn session_dir(root: &Path, n: usize) -> std::io::Result<PathBuf> {
    let dir = root.join(format!("session-{n}"));
    std::fs::create_dir(&dir)?;
    if n > 0 {
        let prev = root.join(format!("session-{}", n - 1));
        for suffix in ["", "-wal"] {
            let from = prev.join(format!("{STORE_FILE}{suffix}"));
            if from.exists() {
                std::fs::rename(&from, dir.join(format!("{STORE_FILE}{suffix}")))?;
            }
        }
        // The shared-memory index is rebuilt from the WAL on open.
        let _ = std::fs::remove_file(prev.join(format!("{STORE_FILE}-shm")));
    }
    Ok(dir)
}

/// A fresh directory under the system temp dir, removed on drop.
pub(super) struct Scratch {
    pub(super) path: PathBuf,
}

impl Scratch {
    pub(super) fn new() -> Result<Scratch, RedriveError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!(
                "taskbox-redrive-{}-{nanos:08x}-{n}",
                std::process::id()
            ));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(Scratch { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => continue,
                Err(source) => return Err(RedriveError::Scratch { path: base, source }),
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Best effort: a scratch store left in the temp dir harms nothing.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
