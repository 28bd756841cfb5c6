//! Temporary paths: every sandbox being built or removed and every archive being written has a
//! name under `tmp/` (or a `*.tmp` name) that carries the owning process's pid, so that
//! [`LocalProvider::sweep_temporaries`] can remove what a crash left without touching what a
//! live process is still using.

use std::collections::HashSet;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::error::LocalError;
use super::fsutil::{ignore_not_found, remove_tree};
use super::kill::process_alive;
use super::snapshot::ARCHIVE_EXT;
use super::{lock, LocalProvider};

/// Removes a temporary path from the in-flight set when the operation using it ends.
pub(super) struct InFlight {
    set: Arc<Mutex<HashSet<PathBuf>>>,
    path: PathBuf,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.set).remove(&self.path);
    }
}

impl LocalProvider {
    /// A fresh path `<dir>/<prefix><pid>.<n><suffix>`, registered as in flight.
    pub(super) fn temp_path(&self, dir: &Path, prefix: &str, suffix: &str) -> (PathBuf, InFlight) {
        let path = dir.join(format!("{prefix}{}{suffix}", self.unique()));
        lock(&self.in_flight).insert(path.clone());
        let guard = InFlight {
            set: self.in_flight.clone(),
            path: path.clone(),
        };
        (path, guard)
    }

    /// Removes what interrupted operations left behind: half-created and half-removed sandbox
    /// directories under `tmp/` and `*.tmp` archives, except those an operation of a live
    /// process is still using. Returns how many were removed.
    pub fn sweep_temporaries(&self) -> Result<usize, LocalError> {
        // Sandbox cgroups left empty (a sandbox whose last processes ended on their own and
        // that was never stopped): the kernel removes only empty ones, and a command makes
        // its sandbox's again as it starts.
        super::cgroup::remove_empty(&self.installation_id);
        let mut stale = Vec::new();
        for place in ["tmp", "trash"] {
            let dir = self.root.join(place);
            for entry in fs::read_dir(&dir).map_err(LocalError::io("list", &dir))? {
                let entry = entry.map_err(LocalError::io("list", &dir))?;
                stale.push(entry.path());
            }
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
        // Contents no snapshot refers to any more (deleted snapshots, crashed writers).
        let gc = self.gc_content()?;
        if gc.swept + gc.temporaries > 0 {
            tracing::debug!(
                swept = gc.swept,
                bytes = gc.bytes_swept,
                temporaries = gc.temporaries,
                "content gc"
            );
        }
        Ok(removed + gc.temporaries as usize)
    }
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

#[cfg(test)]
mod tests {
    use super::*;
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
}
