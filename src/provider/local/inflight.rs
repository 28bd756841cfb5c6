//! A command's mark in its sandbox while a server runs it, so that a server that was killed
//! under a command does not leave it running for good.
//!
//! An isolated sandbox ends with the server that ran it (its init holds a lifeline to the
//! server), so its commands leave no mark. An unisolated one does not: a SIGKILLed server's
//! command runs on — past its timeout, which only that server applied — in a sandbox a
//! restarted server still uses. So each unisolated command leaves `run/inflight.<pid>.<n>` in its sandbox while it runs (`<pid>` the
//! server's), removed when its exec ends in any way but the server's death. The next operation
//! on the sandbox (the recovery's probe comes first) finds a mark whose process is gone: the
//! command it stands for was interrupted, and the sandbox's processes are killed before anything
//! else — as the isolated sandbox's were, with its server — while its files stay.

use std::fs;
use std::path::{Path, PathBuf};

use super::error::LocalError;
use super::kill::process_alive;

/// The prefix of a mark's file name.
const PREFIX: &str = "inflight.";

/// A running command's mark, removed on drop.
pub(super) struct InFlight {
    path: PathBuf,
}

impl InFlight {
    /// Marks a command in the sandbox whose run directory is `run_dir`; `unique` starts with
    /// this process's pid (`LocalProvider::unique`).
    pub(super) fn mark(run_dir: &Path, unique: &str) -> Result<InFlight, LocalError> {
        let path = run_dir.join(format!("{PREFIX}{unique}"));
        fs::write(&path, b"").map_err(LocalError::io("mark a command in flight", &path))?;
        Ok(InFlight { path })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// The marks in `run_dir` of commands whose server is gone (not this process, not alive): each
/// stands for a command that was interrupted and may still run. A missing directory has none.
pub(super) fn orphaned(run_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(run_dir) else {
        return Vec::new();
    };
    let me = std::process::id();
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix(PREFIX))
                .and_then(|rest| rest.split('.').next())
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                return false;
            };
            pid != me && !process_alive(pid)
        })
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_of_a_gone_process_is_orphaned_and_ours_and_a_live_ones_are_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ours = InFlight::mark(dir.path(), &format!("{}.1", std::process::id())).expect("mark");
        // A process that has exited and been reaped: its pid names no process (until reused,
        // which a fresh pid is not within this test).
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let gone = child.id();
        child.wait().expect("reap");
        fs::write(dir.path().join(format!("{PREFIX}{gone}.7")), b"").expect("write");
        // pid 1 is alive in every PID namespace.
        fs::write(dir.path().join(format!("{PREFIX}1.3")), b"").expect("write");
        fs::write(dir.path().join("cwd.5.1"), b"").expect("write");
        let found = orphaned(dir.path());
        assert_eq!(found, [dir.path().join(format!("{PREFIX}{gone}.7"))]);
        drop(ours);
        assert!(!dir
            .path()
            .join(format!("{PREFIX}{}.1", std::process::id()))
            .exists());
        assert!(orphaned(&dir.path().join("missing")).is_empty());
    }
}
