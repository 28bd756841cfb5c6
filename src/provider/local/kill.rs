//! Process killing and liveness: a command's process group on timeout, stop or cancellation;
//! every process a sandbox started (found by its environment) on stop; and whether the owner of
//! a temporary path is still alive.

use std::fs;
use std::io;

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

/// Sends `signal` to the command's shell alone (the cancel's second signal, see
/// `exec::CANCEL_NUDGE`). Callers only pass a shell that is not reaped yet, as for
/// [`kill_group`].
pub(super) fn signal_shell(pid: u32, signal: i32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) takes two integers and touches no memory of ours, so it has no
        // memory-safety preconditions. `pid` is an unreaped spawned child's pid (never 0).
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// Whether our child `pid` has exited, without reaping it: it stays a zombie until it is waited
/// for, so its pid (and with it its process group's id) cannot be reused meanwhile. An error
/// (not our child, or reaped already) is returned as such.
pub(super) fn exited_unreaped(pid: u32) -> io::Result<bool> {
    let pid = libc::id_t::try_from(pid).map_err(io::Error::other)?;
    // SAFETY: an all-zero `siginfo_t` is a valid value (plain integers and a union of them).
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid(2) writes only into `info`, which is ours and of the type it expects.
    // WNOWAIT leaves the child waitable, WNOHANG makes this a poll.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: waitid filled `info` in (or left it zeroed: WNOHANG and nothing exited, which
    // reads as pid 0).
    Ok(unsafe { info.si_pid() } != 0)
}

/// Whether a process of group `pgid` other than a zombie still exists. Only Linux lists other
/// processes' groups; elsewhere one is assumed to, so that the caller's grace runs out and its
/// kill follows.
pub(super) fn group_has_live_members(pgid: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        let Ok(procs) = fs::read_dir("/proc") else {
            return true;
        };
        let pgid = pgid.to_string();
        procs.flatten().any(|entry| {
            if !entry.file_name().as_encoded_bytes()[0].is_ascii_digit() {
                return false;
            }
            // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
            let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
                return false;
            };
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let mut fields = rest.split_whitespace();
            let state = fields.next().unwrap_or("Z");
            fields.nth(1) == Some(pgid.as_str()) && state != "Z" && state != "X"
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = pgid;
        true
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

/// Kills every process started in sandbox `sandbox` that is still running, found by the
/// `TASKBOX_SANDBOX` variable each command's processes inherit (not `TASKBOX_WORKSPACE`: a
/// task's generations share their workspace path). This catches background jobs
/// of finished commands and processes that left the command's process group, as a VM stop
/// would. Only Linux exposes other processes' environments; elsewhere only the running
/// commands (their process groups) are killed.
pub(super) fn kill_leftovers(sandbox: &str) -> usize {
    #[cfg(target_os = "linux")]
    {
        let marker = [b"TASKBOX_SANDBOX=", sandbox.as_bytes()].concat();
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
        let _ = sandbox;
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
    let exists = rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    exists && !is_zombie(pid)
}

/// Whether `pid` has exited and only waits for its parent to collect its status (state `Z`):
/// it holds no file and finishes no operation. A SIGKILLed server, re-parented to an init that
/// reaps slowly (as some containers' do), stays one for a while; its temporaries are stale.
fn is_zombie(pid: libc::pid_t) -> bool {
    // `/proc/<pid>/stat` is `pid (comm) state ...`; comm may hold spaces and parentheses, so
    // the state follows the last `)`.
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod zombie_tests {
    use super::process_alive;

    #[test]
    fn a_zombie_is_not_alive() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        // It exits at once; until we collect its status it is a zombie.
        let mut zombie = false;
        // Bounded by time, not by a count of tries: on a loaded machine `true` may wait a while
        // for a CPU before it gets to exit.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            {
                zombie = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(zombie, "the child never became a zombie");
        assert!(!process_alive(pid), "a zombie counted as alive");
        child.wait().expect("reap");
        assert!(process_alive(std::process::id()));
    }
}
