//! Starting a command's shell: born in its sandbox's cgroup where Linux can (`clone3` with
//! `CLONE_INTO_CGROUP`), otherwise spawned as usual (`posix_spawn`) to join the cgroup in its
//! own script (`cgroup::Join::script`).
//!
//! Why not always join in the script: moving a process into a cgroup (a write to
//! `cgroup.procs`) takes the kernel's global `cgroup_threadgroup_rwsem` for writing, and unless
//! the cgroup2 hierarchy is mounted with `favordynmods` that waits for an RCU grace period
//! whenever no other move happened within the last one or two. On the 2-vCPU development VM
//! (Linux 6.18) a move 50 ms after the previous one took 13.8 ms (median), one 8 ms after it
//! 0.1 ms: a command an agent sends after thinking for seconds always paid the grace period, and
//! the Hermes benchmark's back-to-back commands paid it about one time in seven (its p90 tail). A
//! process cloned into the cgroup takes that lock only for reading.
//!
//! The clone is a plain `clone3` (a fork born in the cgroup): the child gets a copy of the
//! server's memory, and between the clone and its `execve` it makes only async-signal-safe
//! system calls on values prepared before the clone: its three descriptors, its own process
//! group, its directory, default signal handlers (it is cloned with every signal blocked, as
//! `posix_spawn` does, so it never runs one of the server's), the default signal mask and
//! `SIGPIPE` disposition (what the standard library's spawn gives a child), the exec. An exec
//! that fails is reported through a close-on-exec pipe, as the standard library does; the caller
//! then spawns the usual way, whose errors it already reports (nothing ran).
//!
//! A `vfork` on a stack of the child's own (x86-64 assembly) saved the copy of the server's page
//! tables, 0.2–0.4 ms per unisolated command; it was dropped (issue 29) once measured beside this
//! clone in one release run (docs/performance.md), since an isolated command, the default, was
//! then forked by a `pre_exec` hook anyway. (An isolated command is now started by a
//! `vfork`-like clone of the standard C library's own, `isolation::enter`: its [`Stdio`] and
//! [`Stdio::adopt`] are here.)

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncRead, AsyncWrite};

use super::kill::signal_group;

/// A command's shell, however it was started.
pub(super) enum Proc {
    /// Spawned by tokio (the command joins its cgroup in its script, if there is one).
    Spawned(tokio::process::Child),
    /// Cloned into the sandbox's cgroup.
    Cloned(Cloned),
}

/// What a command's shell was started with.
pub(super) struct Started {
    pub(super) proc: Proc,
    pub(super) stdin: Option<Box<dyn AsyncWrite + Unpin + Send>>,
    pub(super) stdout: Option<Box<dyn AsyncRead + Unpin + Send>>,
    pub(super) stderr: Option<Box<dyn AsyncRead + Unpin + Send>>,
}

impl Started {
    /// Takes a tokio child's pipes.
    pub(super) fn spawned(mut child: tokio::process::Child) -> Started {
        let stdin = child
            .stdin
            .take()
            .map(|p| Box::new(p) as Box<dyn AsyncWrite + Unpin + Send>);
        let stdout = child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn AsyncRead + Unpin + Send>);
        let stderr = child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn AsyncRead + Unpin + Send>);
        Started {
            proc: Proc::Spawned(child),
            stdin,
            stdout,
            stderr,
        }
    }
}

impl Proc {
    /// The shell's pid, until it is reaped.
    pub(super) fn id(&self) -> Option<u32> {
        match self {
            Proc::Spawned(c) => c.id(),
            Proc::Cloned(c) => c.status.is_none().then_some(c.pid),
        }
    }

    /// Waits for the shell to exit and reaps it (cancel-safe: dropped before the end, it can be
    /// awaited again).
    pub(super) async fn wait(&mut self) -> io::Result<ExitStatus> {
        match self {
            Proc::Spawned(c) => c.wait().await,
            Proc::Cloned(c) => c.wait().await,
        }
    }
}

/// A shell cloned into a cgroup: its pid and a pidfd (readable once it exited).
pub(super) struct Cloned {
    pid: u32,
    pidfd: Option<tokio::io::unix::AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
}

impl Cloned {
    async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.status {
                return Ok(status);
            }
            if let Some(status) = try_reap(self.pid)? {
                self.status = Some(status);
                self.pidfd = None;
                continue;
            }
            let Some(pidfd) = &self.pidfd else {
                return Err(io::Error::other("the command's pidfd is gone"));
            };
            let mut ready = pidfd.readable().await?;
            ready.clear_ready();
        }
    }
}

impl Drop for Cloned {
    fn drop(&mut self) {
        if self.status.is_some() || matches!(try_reap(self.pid), Ok(Some(_))) {
            return;
        }
        // Dropped while it runs (the exec future was dropped, and its `GroupGuard`, dropped
        // first, killed the group): reaped once it exits, so no zombie stays behind.
        let pid = self.pid;
        let _ = std::thread::Builder::new()
            .name("taskbox-reap".into())
            .spawn(move || wait_blocking(pid));
    }
}

/// Reaps `pid` if it exited (`None`: still running).
fn try_reap(pid: u32) -> io::Result<Option<ExitStatus>> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid(2) writes only into `status`, which is ours. `pid` is a child of this
        // process that nothing else reaps (tokio reaps only the children it spawned).
        let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
        match r {
            0 => return Ok(None),
            r if r > 0 => return Ok(Some(ExitStatus::from_raw(status))),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// What to start: `program` (looked up on this process's `PATH`) with `args`, in `cwd`, in its
/// own process group, with exactly the environment `env` (nothing of this process's own: a
/// command never sees the server's variables).
pub(super) struct Spec<'a> {
    pub(super) program: &'a str,
    pub(super) args: &'a [&'a OsStr],
    pub(super) cwd: &'a Path,
    pub(super) env: &'a [(&'a str, &'a OsStr)],
    pub(super) stdin_piped: bool,
}

/// Set once a clone into a cgroup was refused as unsupported here (an old kernel, a seccomp
/// filter without `clone3`): the usual spawn from then on.
static UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// `clone3`'s arguments (`struct clone_args`, version 2: with `cgroup`), for this module's
/// spawn and the isolated sandbox's init (fields it leaves zero mean "not asked for").
#[repr(C)]
#[derive(Default)]
pub(super) struct CloneArgs {
    pub(super) flags: u64,
    pub(super) pidfd: u64,
    pub(super) child_tid: u64,
    pub(super) parent_tid: u64,
    pub(super) exit_signal: u64,
    pub(super) stack: u64,
    pub(super) stack_size: u64,
    pub(super) tls: u64,
    pub(super) set_tid: u64,
    pub(super) set_tid_size: u64,
    pub(super) cgroup: u64,
}

impl CloneArgs {
    /// `clone3` with these arguments: 0 in the child, the child's pid in the parent, or -1
    /// (the error in `errno`). With no stack, the child continues on its copy of this thread's
    /// stack, as after a `fork`.
    ///
    /// # Safety
    /// As a `fork` of a multi-threaded process: until it execs or exits, the child may make
    /// only async-signal-safe calls on values prepared before the clone, and must not return
    /// into code that allocates or takes a lock.
    pub(super) unsafe fn clone3(&self) -> libc::c_long {
        // SAFETY: `self` is a valid `clone_args` of the size passed; the rest is the caller's.
        unsafe {
            libc::syscall(
                libc::SYS_clone3,
                std::ptr::from_ref(self),
                std::mem::size_of::<CloneArgs>(),
            )
        }
    }
}

const CLONE_PIDFD: u64 = 0x1000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Why a clone gave no running command.
enum CloneError {
    /// Nothing ran (not Linux, an old kernel, no such cgroup, a failed exec...).
    NotStarted(io::Error),
    /// It started but cannot be waited for: it was killed.
    Lost(io::Error),
}

impl From<io::Error> for CloneError {
    fn from(e: io::Error) -> CloneError {
        CloneError::NotStarted(e)
    }
}

/// Starts `spec` born in the cgroup `cgroup_dir` (making the directory if a sweep removed it).
/// `Ok(None)`: it could not be cloned there (not Linux, an old kernel, no such cgroup, a failed
/// exec...), nothing ran, and the caller spawns the usual way. `Err`: it started but could not
/// be watched (the runtime refused its pidfd), so it was killed; the caller reports it.
pub(super) fn clone_into_cgroup(cgroup_dir: &Path, spec: &Spec<'_>) -> io::Result<Option<Started>> {
    if UNSUPPORTED.load(Ordering::Relaxed) {
        return Ok(None);
    }
    match try_clone(cgroup_dir, spec) {
        Ok(started) => Ok(Some(started)),
        Err(CloneError::Lost(e)) => Err(e),
        Err(CloneError::NotStarted(e)) => {
            // An old kernel (no `clone3`, or none that takes a cgroup), a seccomp filter
            // refusing `clone3`: so for every command, not only this one.
            if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::E2BIG)) {
                UNSUPPORTED.store(true, Ordering::Relaxed);
            }
            tracing::debug!(cgroup = %cgroup_dir.display(), error = %e,
                "cannot clone the command into its cgroup; it joins the cgroup itself");
            Ok(None)
        }
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// `program`'s path on this process's `PATH`, as a spawn would find it.
fn find_program(program: &str) -> io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin"));
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
}

/// A pipe, both ends close-on-exec: (read, write).
#[cfg(target_os = "linux")]
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two descriptors for `pipe2` to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `pipe2` succeeded: both are open descriptors nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn open(path: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = cstring(path.as_os_str().as_bytes())?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `open` succeeded: an open descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(not(target_os = "linux"))]
fn try_clone(_cgroup_dir: &Path, _spec: &Spec<'_>) -> Result<Started, CloneError> {
    Err(io::Error::from(io::ErrorKind::Unsupported).into())
}

#[cfg(target_os = "linux")]
fn try_clone(cgroup_dir: &Path, spec: &Spec<'_>) -> Result<Started, CloneError> {
    // Everything the child needs, made before the clone (the child must not allocate).
    let program = cstring(find_program(spec.program)?.as_os_str().as_bytes())?;
    let mut argv = vec![cstring(spec.program.as_bytes())?];
    for a in spec.args {
        argv.push(cstring(a.as_bytes())?);
    }
    let mut envp = Vec::new();
    for (k, v) in spec.env {
        envp.push(cstring(&[k.as_bytes(), b"=", v.as_bytes()].concat())?);
    }
    let argv_ptrs: Vec<*const libc::c_char> = argv
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp_ptrs: Vec<*const libc::c_char> = envp
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let cwd = cstring(spec.cwd.as_os_str().as_bytes())?;

    let cgroup = match open(cgroup_dir, libc::O_RDONLY | libc::O_DIRECTORY) {
        Ok(fd) => fd,
        // A sweep removed it (empty): made again, as the script's join would.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir(cgroup_dir)?;
            open(cgroup_dir, libc::O_RDONLY | libc::O_DIRECTORY)?
        }
        Err(e) => return Err(e.into()),
    };
    // The pipes, and our ends ready for the runtime before the clone: once the command runs,
    // nothing can fail that would make the caller start it a second time.
    let Stdio {
        child: [stdin_child, out_w, err_w],
        stdin,
        stdout,
        stderr,
    } = Stdio::make(spec.stdin_piped)?;
    let (exec_r, exec_w) = pipe()?;
    let child_fds: [RawFd; 4] = [
        stdin_child.as_raw_fd(),
        out_w.as_raw_fd(),
        err_w.as_raw_fd(),
        exec_w.as_raw_fd(),
    ];
    // Above the server's own 0, 1 and 2 (open), as `Stdio::make`'s are.
    if exec_w.as_raw_fd() <= 2 {
        return Err(io::Error::other("a pipe got a standard descriptor's number").into());
    }

    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: CLONE_PIDFD | CLONE_INTO_CGROUP,
        pidfd: std::ptr::addr_of_mut!(pidfd) as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // Every signal blocked across the clone (as `posix_spawn` does), so that the child runs no
    // handler of this process's (tokio's, writing to the runtime's own pipe) before it resets
    // them to the default; the parent's mask is restored right after.
    // SAFETY: all-zero `sigset_t`s are valid values, which `sigfillset` and `pthread_sigmask`
    // then fill in; both write only into these, ours.
    let old_mask = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        if libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old) != 0 {
            return Err(io::Error::other("cannot block signals for the clone").into());
        }
        old
    };
    // SAFETY: the child runs only `child_exec`, which makes async-signal-safe calls on the
    // values prepared above and never returns.
    let r = unsafe { args.clone3() };
    if r == 0 {
        // SAFETY: this is the child of the clone above (one thread, a copy of this process's
        // memory), and the pointers are to the values prepared before it, alive in the copy.
        unsafe {
            child_exec(
                child_fds,
                cwd.as_ptr(),
                program.as_ptr(),
                argv_ptrs.as_ptr(),
                envp_ptrs.as_ptr(),
            )
        }
    }
    let clone_error = io::Error::last_os_error();
    // SAFETY: restores the mask read above; `pthread_sigmask` only reads it.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut());
    }
    if r < 0 {
        return Err(clone_error.into());
    }
    let pid = r as u32;
    // SAFETY: `CLONE_PIDFD` stored a new descriptor in `pidfd` that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop((stdin_child, out_w, err_w, exec_w, cgroup));

    // The child closes its end by exec (close-on-exec), or writes the exec's errno first.
    let mut errno = [0u8; 4];
    let mut got = 0;
    while got < errno.len() {
        // SAFETY: reads into the rest of `errno`, which is ours.
        let n = unsafe {
            libc::read(
                exec_r.as_raw_fd(),
                errno[got..].as_mut_ptr().cast(),
                errno.len() - got,
            )
        };
        match n {
            0 => break,
            n if n > 0 => got += n as usize,
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
    let mut cloned = Cloned {
        pid,
        pidfd: None,
        status: None,
    };
    if got == errno.len() {
        // It ran nothing and exits at once: reaped here (by `Drop` if this wait fails).
        if let Some(status) = wait_blocking(pid) {
            cloned.status = Some(status);
        }
        return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(errno)).into());
    }
    // SAFETY: the `OwnedFd` is moved into the `AsyncFd`, which owns it (nothing else closes or
    // replaces it) until it is dropped, so its descriptor stays the same open pidfd meanwhile.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    };
    match registered {
        Ok(pidfd) => cloned.pidfd = Some(pidfd),
        Err(e) => {
            // It runs, but could not be waited for: killed (its group is its own), and reaped
            // by `Drop`. Not started again.
            signal_group(pid, libc::SIGKILL);
            return Err(CloneError::Lost(e.into()));
        }
    }
    Ok(Started {
        proc: Proc::Cloned(cloned),
        stdin,
        stdout: Some(stdout),
        stderr: Some(stderr),
    })
}

/// The three standard descriptors of a command about to be started some other way than
/// [`clone_into_cgroup`] (an isolated command, `isolation::Enter::spawn`): the child's ends
/// (stdin, stdout, stderr; every one close-on-exec, above 2), and ours, ready for the runtime.
pub(super) struct Stdio {
    pub(super) child: [OwnedFd; 3],
    stdin: Option<Box<dyn AsyncWrite + Unpin + Send>>,
    stdout: Box<dyn AsyncRead + Unpin + Send>,
    stderr: Box<dyn AsyncRead + Unpin + Send>,
}

impl Stdio {
    /// Its pipes (stdin from `/dev/null` unless `stdin_piped`).
    #[cfg(target_os = "linux")]
    pub(super) fn make(stdin_piped: bool) -> io::Result<Stdio> {
        let (stdin_child, stdin_parent) = if stdin_piped {
            let (r, w) = pipe()?;
            (r, Some(w))
        } else {
            (open(Path::new("/dev/null"), libc::O_RDONLY)?, None)
        };
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        // The server's own 0, 1 and 2 are open, so these are above them: a dup2 onto 0-2 never
        // lands on one of them.
        if [&stdin_child, &out_w, &err_w]
            .iter()
            .any(|fd| fd.as_raw_fd() <= 2)
        {
            return Err(io::Error::other(
                "a pipe got a standard descriptor's number",
            ));
        }
        let stdin = match stdin_parent {
            Some(w) => Some(Box::new(tokio::net::unix::pipe::Sender::from_owned_fd(w)?)
                as Box<dyn AsyncWrite + Unpin + Send>),
            None => None,
        };
        Ok(Stdio {
            child: [stdin_child, out_w, err_w],
            stdin,
            stdout: Box::new(tokio::net::unix::pipe::Receiver::from_owned_fd(out_r)?),
            stderr: Box::new(tokio::net::unix::pipe::Receiver::from_owned_fd(err_r)?),
        })
    }

    /// The command started as this process's child `pid` (in its own process group), with
    /// these pipes: watched through a pidfd as a cloned one is. `Err`: it could not be watched,
    /// so it was killed (and is reaped by the drop); the caller reports it.
    #[cfg(target_os = "linux")]
    pub(super) fn adopt(self, pid: u32) -> io::Result<Started> {
        let Stdio {
            child,
            stdin,
            stdout,
            stderr,
        } = self;
        drop(child);
        let mut cloned = Cloned {
            pid,
            pidfd: None,
            status: None,
        };
        // SAFETY: pidfd_open takes a pid and flags; `pid` is our unreaped child, so the number
        // is still that process's.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
        let registered = if fd < 0 {
            Err(io::Error::last_os_error())
        } else {
            // SAFETY: pidfd_open returned a new descriptor that nothing else owns, which the
            // `AsyncFd` then owns until it is dropped (nothing else closes or replaces it).
            unsafe {
                let fd = OwnedFd::from_raw_fd(fd as RawFd);
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
                    .map_err(io::Error::from)
            }
        };
        match registered {
            Ok(pidfd) => cloned.pidfd = Some(pidfd),
            Err(e) => {
                signal_group(pid, libc::SIGKILL);
                return Err(e);
            }
        }
        Ok(Started {
            proc: Proc::Cloned(cloned),
            stdin,
            stdout: Some(stdout),
            stderr: Some(stderr),
        })
    }
}

/// Waits for our child `pid` to exit and reaps it (`None`: the wait failed).
pub(super) fn wait_blocking(pid: u32) -> Option<ExitStatus> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid(2) writes only into `status`, ours; `pid` is our unreaped child.
        if unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) } > 0 {
            return Some(ExitStatus::from_raw(status));
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return None;
        }
    }
}

#[cfg(target_os = "linux")]
/// The cloned child (every signal blocked): descriptors, process group, directory, signal
/// handlers reset and the mask emptied, exec; on a failure its
/// errno goes to the exec pipe and it exits 127.
///
/// # Safety
/// Called only in the child of `clone3` (one thread), with pointers to NUL-terminated strings
/// and NULL-terminated arrays of them that stay valid until the exec.
unsafe fn child_exec(
    [stdin, stdout, stderr, exec_pipe]: [RawFd; 4],
    cwd: *const libc::c_char,
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> ! {
    // SAFETY: (the whole body) async-signal-safe system calls on integers and on the caller's
    // valid pointers; nothing allocates or takes a lock.
    unsafe {
        let ok = libc::dup2(stdin, 0) >= 0
            && libc::dup2(stdout, 1) >= 0
            && libc::dup2(stderr, 2) >= 0
            && libc::setpgid(0, 0) == 0
            && libc::chdir(cwd) == 0
            && {
                // Handled signals back to the default before they are unblocked (ignored ones
                // stay ignored, as across any exec; glibc's own two refuse and are skipped).
                for signal in 1..=64 {
                    let mut act: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(signal, std::ptr::null(), &mut act) == 0
                        && act.sa_sigaction != libc::SIG_DFL
                        && act.sa_sigaction != libc::SIG_IGN
                    {
                        let mut default: libc::sigaction = std::mem::zeroed();
                        default.sa_sigaction = libc::SIG_DFL;
                        libc::sigaction(signal, &default, std::ptr::null_mut());
                    }
                }
                let mut empty: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut empty);
                libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) == 0
            }
            && libc::signal(libc::SIGPIPE, libc::SIG_DFL) != libc::SIG_ERR;
        if ok {
            libc::execve(program, argv, envp);
        }
        let errno = *libc::__errno_location();
        let bytes = errno.to_ne_bytes();
        libc::write(exec_pipe, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(127)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A cgroup of this test's own where sandbox cgroups are made (`None`: none here, and the
    /// test skips — a failure under CI, as every skip of the integration tests is).
    fn test_cgroup(test: &str) -> Option<PathBuf> {
        let base = match super::super::cgroup::support() {
            Ok(base) => base,
            Err(why) => {
                skip(test, &format!("no sandbox cgroups here: {why}"));
                return None;
            }
        };
        let dir = base.join(format!("taskbox-unit-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("make the test's cgroup");
        Some(dir)
    }

    /// The unit tests' copy of `tests/it/support.rs`'s `skip` (a library's unit tests cannot
    /// use the integration tests' helpers; the two decide "CI" the same way): under `CI` a skip
    /// panics; otherwise one line goes straight to stderr — past libtest's capture, which only
    /// catches the `eprint!` macros — and to `<target>/taskbox-skipped-tests.txt`.
    fn skip(test: &str, why: &str) {
        use std::io::Write;
        let ci = std::env::var("CI")
            .is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "FALSE" | "False"));
        assert!(
            !ci,
            "{test} would skip, and CI never skips (unset CI to allow it): {why}"
        );
        let line = format!("SKIPPED {test}: {why}\n");
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        // The test binary is `<target>/<profile>/deps/taskbox-…`.
        if let Some(target) = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.ancestors().nth(3).map(PathBuf::from))
        {
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(target.join("taskbox-skipped-tests.txt"))
                .and_then(|mut f| f.write_all(line.as_bytes()));
        }
    }

    async fn read_all(r: Option<Box<dyn AsyncRead + Unpin + Send>>) -> String {
        let mut text = String::new();
        r.expect("a pipe")
            .read_to_string(&mut text)
            .await
            .expect("read");
        text
    }

    /// Whether `pid` exists at all (a zombie, not reaped yet, does).
    fn exists(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
    }

    /// Whether `pid` runs (not a zombie left to whoever adopted it).
    fn runs(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z" && state != "X")
        })
    }

    /// The shell is born in the cgroup, leads its own process group, starts in its directory
    /// with the environment asked for, and its three pipes and exit status are the caller's.
    #[tokio::test]
    async fn a_command_is_born_in_the_cgroup_as_asked() {
        let Some(cg) = test_cgroup("born") else {
            return;
        };
        let tmp = tempfile::tempdir().unwrap();
        let cwd = tmp.path().canonicalize().unwrap();
        let script = "grep ^0:: /proc/self/cgroup; cut -d' ' -f5 /proc/$$/stat; echo $$; pwd -P; \
                      echo \"$TASKBOX_UNIT|${HOME-unset}\"; read line; echo \"got $line\"; \
                      grep SigBlk /proc/self/status; echo oops >&2; exit 3";
        let spec = Spec {
            program: "bash",
            args: &[OsStr::new("-c"), OsStr::new(script)],
            cwd: &cwd,
            env: &[("TASKBOX_UNIT", OsStr::new("yes"))],
            stdin_piped: true,
        };
        let started = clone_into_cgroup(&cg, &spec)
            .expect("not lost")
            .expect("cloned into the cgroup");
        let Started {
            mut proc,
            stdin,
            stdout,
            stderr,
        } = started;
        let pid = proc.id().expect("running");
        let mut stdin = stdin.expect("a stdin pipe");
        stdin.write_all(b"hello\n").await.unwrap();
        drop(stdin);
        let (out, err) = tokio::join!(read_all(stdout), read_all(stderr));
        let status = proc.wait().await.expect("wait");
        assert_eq!(status.code(), Some(3), "{out}{err}");
        assert_eq!(proc.id(), None, "reaped");
        assert!(!exists(pid), "reaped, not a zombie");
        let _ = std::fs::remove_dir(&cg);
        let name = cg.file_name().and_then(|n| n.to_str()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with("0::") && lines[0].ends_with(name),
            "{out}"
        );
        assert_eq!(lines[1], pid.to_string(), "its own process group: {out}");
        assert_eq!(lines[2], pid.to_string(), "{out}");
        assert_eq!(Path::new(lines[3]), cwd, "{out}");
        assert_eq!(lines[4], "yes|unset", "{out}");
        assert_eq!(lines[5], "got hello", "{out}");
        // Cloned with every signal blocked, what it runs has none blocked.
        assert_eq!(lines[6], "SigBlk:\t0000000000000000", "{out}");
        assert_eq!(err, "oops\n");
    }

    /// A program that cannot be executed, or a directory that cannot be entered, is reported
    /// with its errno, and nothing runs: the caller spawns the usual way and reports that.
    #[tokio::test]
    async fn a_failed_exec_is_reported_and_nothing_runs() {
        let Some(cg) = test_cgroup("noexec") else {
            return;
        };
        let tmp = tempfile::tempdir().unwrap();
        let not_executable = tmp.path().join("script");
        std::fs::write(&not_executable, "#!/bin/sh\ntouch ran\n").unwrap();
        let program = not_executable.to_str().unwrap();
        let mut spec = Spec {
            program,
            args: &[],
            cwd: tmp.path(),
            env: &[],
            stdin_piped: false,
        };
        let errno = |r: Result<Started, CloneError>| match r {
            Err(CloneError::NotStarted(e)) => e.raw_os_error(),
            Err(CloneError::Lost(e)) => panic!("lost: {e}"),
            Ok(_) => panic!("it started"),
        };
        assert_eq!(errno(try_clone(&cg, &spec)), Some(libc::EACCES));
        let missing = tmp.path().join("gone");
        spec.program = "touch";
        let touch = [OsStr::new("ran")];
        spec.args = &touch;
        spec.cwd = &missing;
        assert_eq!(errno(try_clone(&cg, &spec)), Some(libc::ENOENT));
        assert!(matches!(clone_into_cgroup(&cg, &spec), Ok(None)));
        assert!(!tmp.path().join("ran").exists() && !missing.exists());
        // Both children were reaped: the cgroup is empty and goes.
        std::fs::remove_dir(&cg).expect("an empty cgroup");
    }

    /// Killing the group ends the shell and what it started; dropped unreaped, the shell is
    /// reaped all the same (no zombie stays).
    #[tokio::test]
    async fn a_killed_group_ends_and_a_dropped_shell_is_reaped() {
        let Some(cg) = test_cgroup("kill") else {
            return;
        };
        let tmp = tempfile::tempdir().unwrap();
        let spec = Spec {
            program: "bash",
            args: &[OsStr::new("-c"), OsStr::new("sleep 1000 & echo $!; wait")],
            cwd: tmp.path(),
            env: &[],
            stdin_piped: false,
        };
        let started = clone_into_cgroup(&cg, &spec).unwrap().expect("cloned");
        let mut stdout = started.stdout.expect("stdout");
        let mut buf = [0u8; 32];
        let n = stdout.read(&mut buf).await.unwrap();
        let sleep: u32 = std::str::from_utf8(&buf[..n])
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let shell = started.proc.id().expect("running");
        signal_group(shell, libc::SIGKILL);
        drop(started.proc);
        for _ in 0..200 {
            if !exists(shell) && !runs(sleep) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!exists(shell), "the dropped shell was reaped");
        assert!(!runs(sleep), "the group's other process was killed");
        std::fs::remove_dir(&cg).expect("an empty cgroup");
    }
}
