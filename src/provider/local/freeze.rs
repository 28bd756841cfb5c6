//! Pausing a sandbox's processes for a checkpoint: the cgroup freezer. Where the sandbox's
//! cgroup is a v2 one, `cgroup.freeze` (Linux 5.2+; it works on a hybrid machine's secondary
//! v2 mount too, whose only controller may be `hugetlb`: freezing is a core v2 feature, not a
//! controller); where its limits live in v1 hierarchies, the v1 `freezer` one
//! (`freezer.state`). A frozen process stops between instructions of its own, outside any
//! system call that changes a file, so nothing it writes lands half in the snapshot; it keeps
//! its pid, open files and sockets, and runs on when thawed.
//!
//! [`Frozen`] thaws on drop, so a checkpoint that fails (or panics) half-way never leaves a
//! sandbox paused.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long the kernel may take to freeze every process before the checkpoint gives up
/// (a process in an uninterruptible sleep — a stuck NFS read — delays it).
const FREEZE_WAIT: Duration = Duration::from_secs(5);

/// A cgroup that pauses processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Freezer {
    /// A cgroup v2 directory (`cgroup.freeze`, `cgroup.events`).
    V2(PathBuf),
    /// A cgroup of the v1 `freezer` hierarchy (`freezer.state`).
    V1(PathBuf),
}

impl Freezer {
    fn dir(&self) -> &Path {
        match self {
            Freezer::V2(d) | Freezer::V1(d) => d,
        }
    }

    fn set(&self, frozen: bool) -> io::Result<()> {
        match self {
            Freezer::V2(d) => fs::write(d.join("cgroup.freeze"), if frozen { "1" } else { "0" }),
            Freezer::V1(d) => fs::write(
                d.join("freezer.state"),
                if frozen { "FROZEN" } else { "THAWED" },
            ),
        }
    }

    fn is_frozen(&self) -> io::Result<bool> {
        match self {
            Freezer::V2(d) => Ok(fs::read_to_string(d.join("cgroup.events"))?
                .lines()
                .any(|l| l.trim() == "frozen 1")),
            Freezer::V1(d) => Ok(fs::read_to_string(d.join("freezer.state"))?.trim() == "FROZEN"),
        }
    }
}

/// The sandbox's processes, paused until this is dropped.
#[derive(Debug)]
pub(super) struct Frozen {
    freezer: Freezer,
    /// How long freezing took (until the kernel said every process was frozen).
    pub(super) took: Duration,
}

impl Frozen {
    /// Pauses every process of `freezer`'s cgroup and waits until the kernel says they all
    /// are. On an error nothing stays frozen.
    pub(super) fn freeze(freezer: Freezer) -> Result<Frozen, String> {
        let start = Instant::now();
        freezer
            .set(true)
            .map_err(|e| format!("cannot write to {}: {e}", freezer.dir().display()))?;
        // From here on, dropping `frozen` thaws.
        let mut frozen = Frozen {
            freezer,
            took: Duration::ZERO,
        };
        let mut pause = Duration::from_micros(50);
        loop {
            match frozen.freezer.is_frozen() {
                Ok(true) => break,
                Ok(false) if start.elapsed() < FREEZE_WAIT => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(5));
                }
                Ok(false) => {
                    return Err(format!(
                        "the kernel did not freeze every process of {} within {} s (one may be \
                         stuck in the kernel); they run on",
                        frozen.freezer.dir().display(),
                        FREEZE_WAIT.as_secs()
                    ))
                }
                Err(e) => {
                    return Err(format!(
                        "cannot read the state of {}: {e}",
                        frozen.freezer.dir().display()
                    ))
                }
            }
        }
        frozen.took = start.elapsed();
        Ok(frozen)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Err(e) = self.freezer.set(false) {
            tracing::error!(cgroup = %self.freezer.dir().display(), error = %e,
                "could not thaw a sandbox's processes after a checkpoint");
        }
    }
}
