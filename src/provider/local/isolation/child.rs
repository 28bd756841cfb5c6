//! A command between its clone and its exec, however it entered its sandbox (`enter`'s helper
//! or the sandbox's `spawner`): what it needs ([`Exec`]), the steps it takes and the one that
//! failed ([`Step`], [`record`]), and the async-signal-safe pieces the helper and the spawner
//! share (the signal mask, the handlers, a cgroup's join).

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// A step of a command's start between its clones and its exec, as the helper, the spawner or
/// the command reports the one that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(super) enum Step {
    /// Joining the limit cgroup whose `cgroup.procs` or `tasks` is the `index`th.
    Cgroup = 1,
    /// Entering the `index`th namespace.
    Namespace,
    /// Cloning the command.
    Clone,
    /// Its own process group.
    ProcessGroup,
    /// Its standard descriptors.
    Descriptors,
    /// Its working directory.
    Directory,
    /// The report descriptor.
    Report,
    /// `no_new_privs`.
    NoNewPrivs,
    /// The seccomp filter.
    Seccomp,
    /// The exec.
    Exec,
}

impl Step {
    pub(super) const ALL: [Step; 10] = [
        Step::Cgroup,
        Step::Namespace,
        Step::Clone,
        Step::ProcessGroup,
        Step::Descriptors,
        Step::Directory,
        Step::Report,
        Step::NoNewPrivs,
        Step::Seccomp,
        Step::Exec,
    ];
}

/// What a command needs from its clone to its exec, and where it reports the step that failed:
/// prepared before the clone, in memory the command shares (`CLONE_VM`) with the process that
/// waits for its exec — the server's spawning thread's stack for the helper's clone, the memory
/// shared with the sandbox's spawner for the spawner's (see `spawner`). Every pointer is valid
/// in the command's memory.
#[repr(C)]
pub(super) struct Exec {
    /// The command's stdin, stdout and stderr (close-on-exec, above 2).
    pub(super) stdio: [RawFd; 3],
    /// The report pipe's write end (-1: none).
    pub(super) report: RawFd,
    /// Where the command gets it (`Enter::report_fd`).
    pub(super) report_fd: RawFd,
    /// Its working directory inside, and the workspace (where it starts if that is gone).
    pub(super) cwd: *const libc::c_char,
    pub(super) workspace: *const libc::c_char,
    /// The program in each directory of the command's `PATH`, tried in turn (null-terminated).
    pub(super) programs: *const *const libc::c_char,
    pub(super) argv: *const *const libc::c_char,
    pub(super) envp: *const *const libc::c_char,
    /// Whether the command resets the signal handlers it inherited (false where the process
    /// cloning it has every handler at its default already: the spawner).
    pub(super) reset_signals: bool,
    /// `no_new_privs` and the seccomp filter (null: none) to set before the exec: false and
    /// null where the process cloning the command has them already (the spawner's, inherited).
    pub(super) no_new_privs: bool,
    pub(super) filter: *const libc::sock_filter,
    pub(super) filter_len: u16,
    /// The command's pid (in the server's PID namespace), once cloned.
    pub(super) pid: AtomicI32,
    /// The step that failed (0: none) and its index and errno.
    pub(super) step: AtomicU32,
    pub(super) index: AtomicU32,
    pub(super) errno: AtomicI32,
}

/// Blocks every signal on this thread; returns the mask it had.
pub(super) fn block_signals() -> io::Result<libc::sigset_t> {
    // SAFETY: all-zero `sigset_t`s are valid values, which `sigfillset` and `pthread_sigmask`
    // fill in; this changes only this thread's mask.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        if libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old) != 0 {
            return Err(io::Error::other("cannot block signals for the spawn"));
        }
        Ok(old)
    }
}

/// Restores this thread's mask [`block_signals`] returned.
pub(super) fn restore_signals(old: &libc::sigset_t) {
    // SAFETY: restores a mask read by `pthread_sigmask`, on this thread.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut());
    }
}

/// Sets the handled signals back to their default (ignored ones stay ignored, as across any
/// exec, except `SIGPIPE`, which the server ignores and a command gets as the standard
/// library's spawn gives it; glibc's own two refuse and are skipped).
///
/// # Safety
/// Only in a process of one thread that runs none of the handlers (every signal blocked).
pub(super) unsafe fn default_signal_handlers() {
    // SAFETY: `sigaction` on zeroed (valid) structs; the caller runs no handler meanwhile.
    unsafe {
        for signal in 1..=64 {
            let mut act: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut act) == 0
                && act.sa_sigaction != libc::SIG_DFL
                && (act.sa_sigaction != libc::SIG_IGN || signal == libc::SIGPIPE)
            {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
    }
}

/// Moves the calling process (of one thread) into the cgroup whose `cgroup.procs` or `tasks`
/// is `procs`; `false` with errno set when it could not.
///
/// # Safety
/// Async-signal-safe: for a helper or the spawner before their work.
pub(super) unsafe fn join_cgroup(procs: &CString) -> bool {
    // SAFETY: open, write and close on a valid path and a buffer of one byte.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let written = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
        if !written {
            let errno = *libc::__errno_location();
            libc::close(fd);
            *libc::__errno_location() = errno;
            return false;
        }
        libc::close(fd);
        true
    }
}

/// Records in `exec` that `step` (its `index`th item) failed with this thread's errno.
///
/// # Safety
/// Only in the helper, the spawner or the command, before the command's exec.
pub(super) unsafe fn record(exec: &Exec, step: Step, index: usize) {
    // SAFETY: reads this thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    exec.errno.store(errno, Ordering::SeqCst);
    exec.index.store(index as u32, Ordering::SeqCst);
    exec.step.store(step as u32, Ordering::SeqCst);
}

/// The command, from its clone to its exec, in the sandbox's namespaces and cgroups, sharing
/// the memory of the process that cloned it (which waits, `CLONE_VFORK`): its own process
/// group, the server's signal handlers reset and every signal unblocked, its descriptors, its
/// directory, the report descriptor, `no_new_privs` and the seccomp filter (unless inherited),
/// the exec. A step that fails is recorded in its [`Exec`], and it exits 127.
pub(super) extern "C" fn command(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is an `Exec`, alive while the process that cloned this one waits for this
    // exec; the rest are async-signal-safe system calls on it and the memory it points to.
    unsafe {
        let exec = &*arg.cast::<Exec>();
        let fail = |step: Step| -> libc::c_int {
            record(exec, step, 0);
            libc::_exit(127)
        };
        if libc::setpgid(0, 0) != 0 {
            return fail(Step::ProcessGroup);
        }
        if exec.reset_signals {
            default_signal_handlers();
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        let [stdin, stdout, stderr] = exec.stdio;
        if libc::dup2(stdin, 0) < 0 || libc::dup2(stdout, 1) < 0 || libc::dup2(stderr, 2) < 0 {
            return fail(Step::Descriptors);
        }
        if libc::chdir(exec.cwd) != 0 && libc::chdir(exec.workspace) != 0 {
            return fail(Step::Directory);
        }
        let report = exec.report;
        if report >= 0 && report != exec.report_fd {
            if libc::dup2(report, exec.report_fd) < 0 {
                return fail(Step::Report);
            }
        } else if report >= 0 && libc::fcntl(report, libc::F_SETFD, 0) < 0 {
            // Already there (`dup2` would leave its close-on-exec flag): kept open.
            return fail(Step::Report);
        }
        if exec.no_new_privs && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return fail(Step::NoNewPrivs);
        }
        if !exec.filter.is_null() {
            let prog = libc::sock_fprog {
                len: exec.filter_len,
                filter: exec.filter.cast_mut(),
            };
            if libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                std::ptr::from_ref(&prog),
                0,
                0,
            ) != 0
            {
                return fail(Step::Seccomp);
            }
        }
        // The program on the command's `PATH`, as `execvp` searches it: a directory without it
        // (or one it may not search) is skipped, any other failure ends the search.
        let mut errno = libc::ENOENT;
        let mut program = exec.programs;
        while !(*program).is_null() {
            libc::execve(*program, exec.argv, exec.envp);
            match *libc::__errno_location() {
                libc::ENOENT | libc::ENOTDIR => {}
                libc::EACCES => errno = libc::EACCES,
                e => {
                    errno = e;
                    break;
                }
            }
            program = program.add(1);
        }
        *libc::__errno_location() = errno;
        fail(Step::Exec)
    }
}
