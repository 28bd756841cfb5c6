//! A command entering its sandbox: the `pre_exec` hook of its `bash` (see the module docs of
//! `isolation`).
//!
//! The hook runs in the forked child of the server, before the exec, so it may only make
//! async-signal-safe system calls on values prepared before the fork ([`Enter::new`]). It
//! `setns`es into the init's namespaces (through the descriptors the init's start opened, user
//! namespace first), then forks: the grandchild (in the sandbox's PID
//! namespace) goes on to the exec, the child stays outside and waits for it, ending as it ended
//! (its exit code, or the same signal), so that the server's wait and its signals to the
//! command's process group (which both share) work as for an unisolated command.
//!
//! Before all that, the hook moves itself into the sandbox's limit cgroups, where it has them
//! (see `limits`): the command and everything it starts are born there.

use std::ffi::CString;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use super::init::Init;
use super::{REPORT_FD, WORKSPACE};

/// Everything a command needs to enter its sandbox, prepared before its spawn.
pub struct Enter {
    /// Held so that the init's pidfd stays open until the spawn has forked.
    init: Arc<Init>,
    cwd: CString,
    workspace: CString,
    report: Option<OwnedFd>,
    /// Where the command finds `report` ([`report_fd`]).
    report_fd: RawFd,
    filter: Option<Vec<libc::sock_filter>>,
}

/// The descriptor an isolated command gets the report pipe's write end at: [`REPORT_FD`], or
/// the highest one this process may open when its soft `RLIMIT_NOFILE` is lower (a server
/// started under `ulimit -n 64`: `dup2` refuses a target at or above the limit, and the
/// command inherits the limit).
fn report_fd() -> RawFd {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return REPORT_FD;
    }
    let highest = RawFd::try_from(limit.rlim_cur)
        .unwrap_or(RawFd::MAX)
        .saturating_sub(1);
    REPORT_FD.min(highest).max(3)
}

impl Enter {
    /// Entering `init`'s sandbox, starting in `cwd` (a path inside it), with the write end of
    /// the report pipe at [`Enter::report_fd`].
    pub fn new(init: Arc<Init>, cwd: &Path, report: Option<OwnedFd>) -> io::Result<Enter> {
        let c =
            |b: &[u8]| CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
        Ok(Enter {
            init,
            cwd: c(cwd.as_os_str().as_bytes())?,
            workspace: c(WORKSPACE.as_bytes())?,
            report,
            report_fd: report_fd(),
            filter: super::seccomp::program(),
        })
    }

    /// The descriptor the command finds the report pipe's write end at: [`REPORT_FD`], lower
    /// only under a lower `RLIMIT_NOFILE`.
    pub fn report_fd(&self) -> RawFd {
        self.report_fd
    }

    /// The `pre_exec` hook.
    ///
    /// # Safety
    /// Only in the forked child of a spawn (one thread), before its exec.
    pub unsafe fn run(&self) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let report: RawFd = self.report.as_ref().map_or(-1, |r| r.as_raw_fd());
        // SAFETY: (the whole body) async-signal-safe system calls on integers and on pointers
        // into `self`, which the fork copied; nothing allocates or takes a lock.
        unsafe {
            // Into the sandbox's limit cgroups first (the hierarchies are not visible inside):
            // the waiting child and the command are both counted, and all the command starts.
            for procs in self.init.cgroups().map_or(&[][..], |c| c.procs()) {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                let error = io::Error::last_os_error();
                libc::close(fd);
                if written != 1 {
                    return Err(error);
                }
            }
            for (fd, flag) in self.init.namespace_fds() {
                if libc::setns(fd, flag) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            // Blocked across the fork: the waiting child never handles one (the group's
            // signals are for the command; a SIGKILL still ends it).
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::sigprocmask(libc::SIG_SETMASK, &all, &mut old);
            let pid = libc::fork();
            if pid < 0 {
                return Err(io::Error::last_os_error());
            }
            if pid == 0 {
                // The command, in the sandbox's PID namespace.
                libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
                if libc::chdir(self.cwd.as_ptr()) != 0 && libc::chdir(self.workspace.as_ptr()) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                if report >= 0 && report != self.report_fd {
                    if libc::dup2(report, self.report_fd) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                } else if report >= 0 && libc::fcntl(report, libc::F_SETFD, 0) < 0 {
                    // Already there (`dup2` would leave its close-on-exec flag): kept open.
                    return Err(io::Error::last_os_error());
                }
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if let Some(filter) = &self.filter {
                    let prog = libc::sock_fprog {
                        len: filter.len() as u16,
                        filter: filter.as_ptr().cast_mut(),
                    };
                    if libc::prctl(
                        libc::PR_SET_SECCOMP,
                        libc::SECCOMP_MODE_FILTER,
                        std::ptr::from_ref(&prog),
                        0,
                        0,
                    ) != 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                }
                return Ok(());
            }
            // The waiting child: nothing of the server's stays open in it (the spawn's own
            // error pipe included, whose end the spawn waits for).
            libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
            let mut status = 0;
            loop {
                let r = libc::waitpid(pid, &mut status, 0);
                if r == pid {
                    break;
                }
                if r < 0 && *libc::__errno_location() != libc::EINTR {
                    libc::_exit(127);
                }
            }
            if libc::WIFEXITED(status) {
                libc::_exit(libc::WEXITSTATUS(status));
            }
            let signal = libc::WTERMSIG(status);
            libc::signal(signal, libc::SIG_DFL);
            let mut one: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut one);
            libc::sigaddset(&mut one, signal);
            libc::kill(libc::getpid(), signal);
            libc::sigprocmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
            libc::_exit(128 + signal)
        }
    }
}
