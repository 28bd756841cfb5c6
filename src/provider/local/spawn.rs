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
//! The clone is a `fork` of the server (no `CLONE_VM`: a child sharing the parent's memory
//! needs a stack of its own and cannot return through Rust code), and between the clone and its
//! `execve` the child makes only async-signal-safe system calls on values prepared before the
//! clone: its three descriptors, its own process group, its directory, the default signal mask
//! and `SIGPIPE` disposition (what the standard library's spawn gives a child), the exec. An exec
//! that fails is reported through a close-on-exec pipe, as the standard library does; the caller
//! then spawns the usual way, whose errors it already reports (nothing ran).

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncRead, AsyncWrite};

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
            .spawn(move || {
                let mut status = 0;
                // SAFETY: waitpid(2) writes only into `status`, ours; `pid` is our unreaped child.
                while unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) } < 0
                    && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
                {}
            });
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

/// What to start: `program` (looked up on `PATH`) with `args`, in `cwd`, in its own process
/// group, with this process's environment but `set` and without `remove`.
pub(super) struct Spec<'a> {
    pub(super) program: &'a str,
    pub(super) args: &'a [&'a OsStr],
    pub(super) cwd: &'a Path,
    pub(super) set: &'a [(&'a str, &'a OsStr)],
    pub(super) remove: &'a [&'a str],
    pub(super) stdin_piped: bool,
}

/// Set once a clone into a cgroup was refused as unsupported here (an old kernel, a seccomp
/// filter without `clone3`): the usual spawn from then on.
static UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// `clone3`'s arguments (`struct clone_args`, version 2: with `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_PIDFD: u64 = 0x1000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Starts `spec` born in the cgroup `cgroup_dir` (making the directory if a sweep removed it).
/// `None`: it could not be cloned there (not Linux, an old kernel, no such cgroup, a failed
/// exec...), nothing ran, and the caller spawns the usual way.
pub(super) fn clone_into_cgroup(cgroup_dir: &Path, spec: &Spec<'_>) -> Option<Started> {
    if UNSUPPORTED.load(Ordering::Relaxed) {
        return None;
    }
    match try_clone(cgroup_dir, spec) {
        Ok(started) => Some(started),
        Err(e) => {
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOSYS | libc::EPERM | libc::EOPNOTSUPP | libc::E2BIG)
            ) {
                UNSUPPORTED.store(true, Ordering::Relaxed);
            }
            tracing::debug!(cgroup = %cgroup_dir.display(), error = %e,
                "cannot clone the command into its cgroup; it joins the cgroup itself");
            None
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
fn try_clone(_cgroup_dir: &Path, _spec: &Spec<'_>) -> io::Result<Started> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

#[cfg(target_os = "linux")]
fn try_clone(cgroup_dir: &Path, spec: &Spec<'_>) -> io::Result<Started> {
    // Everything the child needs, made before the clone (the child must not allocate).
    let program = cstring(find_program(spec.program)?.as_os_str().as_bytes())?;
    let mut argv = vec![cstring(spec.program.as_bytes())?];
    for a in spec.args {
        argv.push(cstring(a.as_bytes())?);
    }
    let mut envp = Vec::new();
    for (k, v) in std::env::vars_os() {
        let key = k.as_bytes();
        if spec.remove.iter().any(|r| r.as_bytes() == key)
            || spec.set.iter().any(|(s, _)| s.as_bytes() == key)
        {
            continue;
        }
        envp.push(cstring(&[key, b"=", v.as_bytes()].concat())?);
    }
    for (k, v) in spec.set {
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
        Err(e) => return Err(e),
    };
    let (stdin_child, stdin_parent) = if spec.stdin_piped {
        let (r, w) = pipe()?;
        (r, Some(w))
    } else {
        (open(Path::new("/dev/null"), libc::O_RDONLY)?, None)
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (exec_r, exec_w) = pipe()?;
    let child_fds: [RawFd; 4] = [
        stdin_child.as_raw_fd(),
        out_w.as_raw_fd(),
        err_w.as_raw_fd(),
        exec_w.as_raw_fd(),
    ];
    // The server's own 0, 1 and 2 are open, so these are above them: a dup2 onto 0-2 never
    // lands on one of them.
    if child_fds.iter().any(|&fd| fd <= 2) {
        return Err(io::Error::other("a pipe got a standard descriptor's number"));
    }

    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: CLONE_PIDFD | CLONE_INTO_CGROUP,
        pidfd: std::ptr::addr_of_mut!(pidfd) as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: `args` is a valid `clone_args` of the size passed. Without `CLONE_VM` the child
    // is a copy of this process with one thread, which runs only `child_exec` (async-signal-safe
    // system calls on the pointers prepared above, then exec or `_exit`), never returning here.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::addr_of!(args),
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if r == 0 {
        // SAFETY: in the child, see above; the pointers are to memory copied into it.
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
    if r < 0 {
        return Err(io::Error::last_os_error());
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
        // It exits at once: reaped here (by `Drop` if the wait fails).
        let mut status = 0;
        // SAFETY: waitpid(2) writes only into `status`; `pid` is our child.
        if unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) } > 0 {
            cloned.status = Some(ExitStatus::from_raw(status));
        }
        return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(errno)));
    }
    cloned.pidfd = Some(tokio::io::unix::AsyncFd::with_interest(
        pidfd,
        tokio::io::Interest::READABLE,
    )?);
    let stdin = match stdin_parent {
        Some(w) => Some(Box::new(tokio::net::unix::pipe::Sender::from_owned_fd(w)?)
            as Box<dyn AsyncWrite + Unpin + Send>),
        None => None,
    };
    let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(out_r)?;
    let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(err_r)?;
    Ok(Started {
        proc: Proc::Cloned(cloned),
        stdin,
        stdout: Some(Box::new(stdout)),
        stderr: Some(Box::new(stderr)),
    })
}

#[cfg(target_os = "linux")]
/// The cloned child: descriptors, process group, directory, signals, exec; on a failure its
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
    // SAFETY (the whole body): async-signal-safe system calls on integers and on the caller's
    // valid pointers; nothing allocates or takes a lock.
    unsafe {
        let ok = libc::dup2(stdin, 0) >= 0
            && libc::dup2(stdout, 1) >= 0
            && libc::dup2(stderr, 2) >= 0
            && libc::setpgid(0, 0) == 0
            && libc::chdir(cwd) == 0
            && {
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
