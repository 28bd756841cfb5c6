//! Process killing and liveness: a command's process group on timeout, stop or cancellation;
//! every process a sandbox started (found by its environment) on stop; and whether the owner of
//! a temporary path is still alive.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Kills the command's process group if the exec future is dropped before the command ended.
pub(super) struct GroupGuard {
    pub(super) pgid: Option<u32>,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid {
            kill_group(pgid);
        }
    }
}

/// Sends `signal` to the command's process group (a cancel passing on the caller's signal).
/// Callers only pass a group whose leader is not reaped yet, as for [`kill_group`].
pub(super) fn signal_group(pgid: u32, signal: i32) {
    if let Ok(pgid) = libc::pid_t::try_from(pgid) {
        // SAFETY: killpg(2) takes two integers and touches no memory of ours, so it has no
        // memory-safety preconditions. `pgid` is an unreaped spawned child's pid (never 0).
        unsafe {
            libc::killpg(pgid, signal);
        }
    }
}

pub(super) fn kill_group(pgid: u32) {
    if let Ok(pgid) = libc::pid_t::try_from(pgid) {
        // SIGKILL: a command that ignores SIGTERM must not outlive its timeout.
        // SAFETY: killpg(2) takes two integers and touches no memory of ours, so it has no
        // memory-safety preconditions. `pgid` is a spawned child's pid (never 0, which would
        // mean our own group), and callers only pass one not yet reaped, so it is still theirs.
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
pub(super) fn kill_leftovers(workspace: &Path) -> usize {
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
                // SAFETY: kill(2) takes two integers and touches no memory of ours, so it has no
                // memory-safety preconditions. `pid` is a positive /proc entry other than us.
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

pub(super) fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // Signal 0 checks existence; EPERM means it exists but is not ours.
    // SAFETY: kill(2) takes two integers and touches no memory of ours, and signal 0 delivers
    // nothing: it only reports whether `pid` could be signalled.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}
