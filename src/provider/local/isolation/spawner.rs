//! A sandbox's spawner: a process that enters the sandbox once — its limit cgroups, its
//! namespaces, `no_new_privs`, the seccomp filter — and from there clones each command on
//! request, as the server's own child (`CLONE_PARENT`).
//!
//! Why: a command entering the sandbox by itself (`enter`'s helper) pays, per command, the
//! moves into the limit cgroups (six v1 hierarchies on a hybrid machine), the `setns` into
//! seven namespaces and the seccomp filter's install (the kernel checks and compiles the filter
//! and works out, for every system call number, whether it always allows it). A command cloned
//! by the spawner is born in all of it, as a child inherits its parent's cgroups, namespaces,
//! `no_new_privs` and filter, and with the default signal handlers the spawner set once: its
//! start is then the clone, its own process group and signal mask, its descriptors, its
//! directory, and the exec (what that saves is measured in docs/performance.md, session 34).
//!
//! Like the init, the spawner is a fork of the server, so it holds a copy-on-write view of the
//! server's memory at its fork (undumpable, outside the sandbox's PID namespace, unreachable
//! from inside); pages the server writes afterwards are copied for the server, not shared.
//!
//! **How.** The server forks the spawner when it makes the sandbox's init (a fork-like `clone3`
//! of the spawning thread, every signal blocked, as the init's). It joins the cgroups, enters
//! the namespaces (the user namespace first), closes every descriptor but its end of a
//! `SOCK_SEQPACKET` socket pair, makes itself undumpable (its memory is a copy of the
//! server's), sets `no_new_privs`, installs the filter, says it is ready, and then waits on the
//! socket. Per command the server lays the command's [`Exec`] — argv, environment, the
//! programs of its `PATH`, its directory — out in memory the two share (`MAP_SHARED`, mapped
//! before the fork: the same addresses in both, so its pointers hold in each), sends one byte
//! with the command's descriptors (`SCM_RIGHTS`), and waits for one byte back. The spawner
//! clones the command (`CLONE_VM | CLONE_VFORK | CLONE_PARENT`: it runs `child::command` on a
//! stack of the spawner's, in the spawner's memory, until its exec), closes its copies of the
//! descriptors and answers; the server adopts the pid as it does the helper's command.
//!
//! **What may go wrong.** The spawner makes only async-signal-safe system calls and never
//! allocates (it is a fork of a threaded process). It can die only by SIGKILL (every other
//! signal is blocked): the memory limit's killer, or the sandbox's end. A spawner that is gone
//! before a request is seen by the send (the socket's peer closed): nothing started, and the
//! command is started through the helper instead, as it is whenever the request does not fit
//! the shared memory. One that dies between the send and its answer (a moment of a few
//! hundred microseconds) may have cloned the command: the kernel wrote its pid into the shared
//! `Exec` as it made it (`CLONE_PARENT_SETTID`), so the server adopts it all the same (a
//! command unknown to the server would never be reaped, and the sandbox's init, which ends only
//! once every process of its namespace is reaped, would never end); without a pid nothing
//! started, and the command goes the helper's way. A stopped sandbox kills its spawner with its init
//! (`Init::stop`), and the spawner exits by itself when the server's end of the socket closes
//! (the server died): it is not in the sandbox's PID namespace, so the init's end does not end
//! it. It is in the sandbox's cgroups (the commands it clones are born there): the freezer
//! pauses it with them, and a command asked for during a checkpoint starts once it is thawed,
//! as through the helper.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use super::super::spawn::{self, CloneArgs};
use super::child::{self, Exec, Step};

/// The memory shared with the spawner: the request's [`Exec`] and what it points to (a command
/// whose arguments and environment need more is started through the helper).
const REGION: usize = 1 << 20;

/// The stack a command runs on in the spawner until its exec (only `child::command`).
const STACK: usize = 256 * 1024;

/// What [`Spawner::spawn`] starts: the command's descriptors (in this process) and what
/// [`Exec`] points to.
pub(super) struct Request<'a> {
    /// Its stdin, stdout and stderr (above 2).
    pub(super) stdio: [RawFd; 3],
    /// The report pipe's write end (-1: none), and where the command gets it.
    pub(super) report: RawFd,
    pub(super) report_fd: RawFd,
    pub(super) cwd: &'a CString,
    pub(super) workspace: &'a CString,
    pub(super) programs: &'a [CString],
    pub(super) argv: &'a [CString],
    pub(super) envp: &'a [CString],
}

/// Why [`Spawner::spawn`] did not start a command.
#[derive(Debug)]
pub(super) enum SpawnError {
    /// Nothing was started (the spawner is gone, or the request does not fit its memory): the
    /// caller may start the command another way.
    Unavailable,
    /// A step of the command's start failed (as `enter` names it): nothing runs.
    Step { step: u32, index: u32, errno: i32 },
    /// The spawner answered without a command and without a failed step (it never does).
    Lost(io::Error),
}

/// Memory shared with the spawner (`MAP_SHARED`), unmapped when dropped.
struct Region(*mut u8);

// SAFETY: a mapping of this process's that only the `Spawner` holding it writes, under its
// lock.
unsafe impl Send for Region {}
// SAFETY: as above: every access is under the `Spawner`'s lock.
unsafe impl Sync for Region {}

impl Region {
    fn map() -> io::Result<Region> {
        // SAFETY: a new shared anonymous mapping; nothing else refers to it.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                REGION,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Region(at.cast()))
    }

    fn exec(&self) -> *mut Exec {
        self.0.cast()
    }

    /// Lays `req` out: its [`Exec`] at the start, then the pointer arrays and the strings.
    /// `None`: it does not fit.
    fn lay_out(&self, req: &Request<'_>) -> Option<()> {
        let mut bump = Bump {
            base: self.0,
            used: std::mem::size_of::<Exec>(),
        };
        let cwd = bump.string(req.cwd)?;
        let workspace = bump.string(req.workspace)?;
        let programs = bump.list(req.programs)?;
        let argv = bump.list(req.argv)?;
        let envp = bump.list(req.envp)?;
        let exec = Exec {
            // The spawner puts the descriptors it received here.
            stdio: [-1; 3],
            report: -1,
            report_fd: req.report_fd,
            cwd,
            workspace,
            programs,
            argv,
            envp,
            // The spawner's already, inherited by what it clones.
            reset_signals: false,
            no_new_privs: false,
            filter: std::ptr::null(),
            filter_len: 0,
            pid: AtomicI32::new(0),
            step: AtomicU32::new(0),
            index: AtomicU32::new(0),
            errno: AtomicI32::new(0),
        };
        // SAFETY: the start of the mapping, aligned (a page) and large enough for an `Exec`;
        // the spawner reads it only after the request's send.
        unsafe { self.exec().write(exec) };
        Some(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping `map` made, of that length.
        unsafe {
            libc::munmap(self.0.cast(), REGION);
        }
    }
}

/// Space handed out from the start of a [`Region`] on.
struct Bump {
    base: *mut u8,
    used: usize,
}

impl Bump {
    fn take(&mut self, len: usize, align: usize) -> Option<*mut u8> {
        let at = self.used.checked_next_multiple_of(align)?;
        let end = at.checked_add(len).filter(|end| *end <= REGION)?;
        self.used = end;
        // SAFETY: `at` is within the mapping (checked above).
        Some(unsafe { self.base.add(at) })
    }

    fn string(&mut self, s: &CString) -> Option<*const libc::c_char> {
        let bytes = s.as_bytes_with_nul();
        let at = self.take(bytes.len(), 1)?;
        // SAFETY: `take` gave `bytes.len()` bytes of the mapping at `at`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len()) };
        Some(at.cast_const().cast())
    }

    fn list(&mut self, strings: &[CString]) -> Option<*const *const libc::c_char> {
        let size = std::mem::size_of::<*const libc::c_char>();
        let array = self
            .take((strings.len() + 1) * size, size)?
            .cast::<*const libc::c_char>();
        for (i, s) in strings.iter().enumerate() {
            let at = self.string(s)?;
            // SAFETY: `array` has room for `strings.len() + 1` aligned pointers.
            unsafe { array.add(i).write(at) };
        }
        // SAFETY: as above: the last slot.
        unsafe { array.add(strings.len()).write(std::ptr::null()) };
        Some(array.cast_const())
    }
}

/// A sandbox's running spawner (killed and reaped when dropped).
pub struct Spawner {
    pid: u32,
    pidfd: OwnedFd,
    sock: OwnedFd,
    region: Region,
    /// One request at a time; `true` once it is unusable (it ended, or its socket failed).
    broken: Mutex<bool>,
    /// The commands it started.
    started: AtomicU64,
}

impl std::fmt::Debug for Spawner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spawner").field("pid", &self.pid).finish()
    }
}

impl Spawner {
    /// Starts the spawner of a sandbox whose namespaces are `namespaces` (user first) and whose
    /// limit cgroups' `cgroup.procs`/`tasks` are `cgroup_procs`, with `filter` as its
    /// seccomp filter. Blocks until it is ready (a few milliseconds: the fork copies this
    /// process's page tables).
    pub(super) fn start(
        namespaces: &[(RawFd, libc::c_int)],
        cgroup_procs: &[CString],
        filter: Option<&[libc::sock_filter]>,
    ) -> io::Result<Spawner> {
        let region = Region::map()?;
        let mut pair = [0 as libc::c_int; 2];
        // SAFETY: `pair` is a valid array of two descriptors for `socketpair` to fill.
        if unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                pair.as_mut_ptr(),
            )
        } != 0
        {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `socketpair` made both; nothing else owns them.
        let (ours, theirs) =
            unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
        let mut pidfd: libc::c_int = -1;
        let args = CloneArgs {
            flags: libc::CLONE_PIDFD as u64,
            pidfd: std::ptr::addr_of_mut!(pidfd) as u64,
            exit_signal: libc::SIGCHLD as u64,
            ..CloneArgs::default()
        };
        let child_args = ChildArgs {
            sock: theirs.as_raw_fd(),
            exec: region.exec(),
            namespaces,
            cgroup_procs,
            filter,
        };
        // Blocked across the fork; the child never unblocks them.
        let old = child::block_signals()?;
        // SAFETY: a fork-like clone3 (no CLONE_VM, no stack): the child gets a copy of this
        // process (one thread, this one) and continues here with 0. It runs only `child`,
        // which makes async-signal-safe system calls on values prepared above and never
        // returns.
        let r = unsafe { args.clone3() };
        if r == 0 {
            // SAFETY: in the child of the clone above, as `child` requires.
            unsafe { child(&child_args) }
        }
        let clone_error = io::Error::last_os_error();
        child::restore_signals(&old);
        if r < 0 {
            return Err(clone_error);
        }
        // SAFETY: `CLONE_PIDFD` stored a new descriptor in `pidfd` that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        drop(theirs);
        let spawner = Spawner {
            pid: r as u32,
            pidfd,
            sock: ours,
            region,
            broken: Mutex::new(false),
            started: AtomicU64::new(0),
        };
        // Ready (one zero byte), or the stage that failed and its errno.
        let mut answer = [0u8; 8];
        let n = recv(spawner.sock.as_raw_fd(), &mut answer);
        match n {
            1 if answer[0] == 0 => Ok(spawner),
            8 => {
                let errno = i32::from_ne_bytes([answer[4], answer[5], answer[6], answer[7]]);
                let stage = match answer[0] {
                    1 => "join the sandbox's limit cgroups",
                    2 => "enter the sandbox's namespaces",
                    3 => "set no_new_privs",
                    4 => "install the seccomp filter",
                    6 => "open /dev/null",
                    _ => "map its stack",
                };
                Err(io::Error::new(
                    io::Error::from_raw_os_error(errno).kind(),
                    format!(
                        "the sandbox's spawner could not {stage}: {}",
                        io::Error::from_raw_os_error(errno)
                    ),
                ))
            }
            _ => Err(io::Error::other(
                "the sandbox's spawner ended as it started",
            )),
        }
    }

    /// Starts `req`'s command: this process's child, in its own process group, in the
    /// sandbox. Blocks until it has exec'd (or failed to).
    pub(super) fn spawn(&self, req: &Request<'_>) -> Result<u32, SpawnError> {
        let mut broken = self.broken.lock().unwrap_or_else(|e| e.into_inner());
        if *broken {
            return Err(SpawnError::Unavailable);
        }
        if self.region.lay_out(req).is_none() {
            return Err(SpawnError::Unavailable);
        }
        let [stdin, stdout, stderr] = req.stdio;
        let fds = [stdin, stdout, stderr, req.report];
        let count = if req.report >= 0 { 4 } else { 3 };
        if send_fds(self.sock.as_raw_fd(), &fds[..count]).is_err() {
            // Gone before it read anything (the peer closed), or the socket failed: nothing
            // was started.
            *broken = true;
            return Err(SpawnError::Unavailable);
        }
        let mut answer = [0u8; 1];
        let answered = recv(self.sock.as_raw_fd(), &mut answer) == 1;
        // SAFETY: the spawner has answered (or is gone): nothing else writes the `Exec` now.
        let exec = unsafe { &*self.region.exec() };
        let pid = exec.pid.load(Ordering::SeqCst);
        if !answered {
            *broken = true;
            // Cloned or not: the kernel wrote the pid as it cloned the command (see `serve`).
            return match u32::try_from(pid).ok().filter(|p| *p > 0) {
                Some(pid) => Ok(pid),
                None => Err(SpawnError::Unavailable),
            };
        }
        let step = exec.step.load(Ordering::SeqCst);
        if step != 0 {
            if pid > 0 {
                // Cloned, but it ended before its exec: reaped here.
                spawn::wait_blocking(pid as u32);
            }
            return Err(SpawnError::Step {
                step,
                index: exec.index.load(Ordering::SeqCst),
                errno: exec.errno.load(Ordering::SeqCst),
            });
        }
        let pid = u32::try_from(pid).ok().filter(|p| *p > 0).ok_or_else(|| {
            SpawnError::Lost(io::Error::other(
                "the sandbox's spawner answered without a command",
            ))
        })?;
        self.started.fetch_add(1, Ordering::Relaxed);
        Ok(pid)
    }

    /// How many commands it started.
    #[cfg(test)]
    pub(super) fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Sends it SIGKILL (nothing if it is gone already).
    pub(super) fn kill(&self) {
        super::sigkill(&self.pidfd);
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        self.kill();
        spawn::wait_blocking(self.pid);
    }
}

/// Receives into `buf`, retrying when interrupted: the length, 0 at the peer's end, -1 on an
/// error.
fn recv(fd: RawFd, buf: &mut [u8]) -> isize {
    loop {
        // SAFETY: `buf` is valid for `buf.len()` bytes.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return n;
        }
    }
}

/// The room for up to four descriptors in a control message.
#[repr(C)]
union Control {
    buf: [u8; 64],
    _align: libc::cmsghdr,
}

/// Sends one byte with `fds` (`SCM_RIGHTS`).
fn send_fds(sock: RawFd, fds: &[RawFd]) -> io::Result<()> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = Control { buf: [0; 64] };
    let data_len = std::mem::size_of_val(fds) as u32;
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call, and the
    // control buffer has room for a header and four descriptors (`CMSG_SPACE(16)` is 32).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = std::ptr::addr_of_mut!(control.buf).cast();
        msg.msg_controllen = libc::CMSG_SPACE(data_len) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(data_len) as _;
        std::ptr::copy_nonoverlapping(
            fds.as_ptr().cast::<u8>(),
            libc::CMSG_DATA(cmsg),
            data_len as usize,
        );
        loop {
            if libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) == 1 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// What the spawner's child needs, prepared before the fork.
struct ChildArgs<'a> {
    sock: RawFd,
    exec: *mut Exec,
    namespaces: &'a [(RawFd, libc::c_int)],
    cgroup_procs: &'a [CString],
    filter: Option<&'a [libc::sock_filter]>,
}

/// The spawner, in the child of the fork: enters the sandbox, then serves requests until the
/// server's end of the socket closes.
///
/// # Safety
/// Only in the child of a fork-like clone (one thread), with every signal blocked.
unsafe fn child(args: &ChildArgs<'_>) -> ! {
    // SAFETY: (the whole body) async-signal-safe system calls on integers and on memory the
    // fork copied (or the shared mapping); nothing allocates or takes a lock.
    unsafe {
        let sock = args.sock;
        // First of all, nothing of the server's stays open here (its sockets, its database,
        // the init's lifeline, a test's socket) but this end of the socket and the namespaces'
        // descriptors, closed in turn once entered.
        let mut keep = [-1 as RawFd; 8];
        keep[0] = sock;
        for (slot, (fd, _)) in keep[1..].iter_mut().zip(args.namespaces) {
            *slot = *fd;
        }
        let kept = 1 + args.namespaces.len().min(keep.len() - 1);
        keep[..kept].sort_unstable();
        let mut from = 0u32;
        for fd in &keep[..kept] {
            let fd = *fd as u32;
            if fd > from {
                libc::syscall(libc::SYS_close_range, from, fd - 1, 0u32);
            }
            from = fd + 1;
        }
        libc::syscall(libc::SYS_close_range, from, u32::MAX, 0u32);
        let fail = |stage: u8| -> ! {
            let errno = *libc::__errno_location();
            let mut buf = [0u8; 8];
            buf[0] = stage;
            buf[4..].copy_from_slice(&errno.to_ne_bytes());
            libc::send(sock, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL);
            libc::_exit(1)
        };
        for procs in args.cgroup_procs {
            if !child::join_cgroup(procs) {
                fail(1);
            }
        }
        for (fd, flag) in args.namespaces {
            if libc::setns(*fd, *flag) != 0 {
                fail(2);
            }
            libc::close(*fd);
        }
        // 0, 1 and 2 taken (by the sandbox's `/dev/null`), so that the descriptors a request
        // brings are above them: one received at 0-2 would keep its close-on-exec flag through
        // the command's `dup2` onto itself, and be closed by the exec.
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null != 0 || libc::dup2(null, 1) != 1 || libc::dup2(null, 2) != 2 {
            fail(6);
        }
        // Its memory is a copy of the server's: no process may read it.
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        // The server's handlers, once for every command it clones (it runs none: every
        // signal stays blocked here; a command unblocks them after its clone).
        child::default_signal_handlers();
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            fail(3);
        }
        if let Some(filter) = args.filter {
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
                fail(4);
            }
        }
        let stack = libc::mmap(
            std::ptr::null_mut(),
            STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if stack == libc::MAP_FAILED {
            fail(5);
        }
        let stack_top = ((stack as usize + STACK) & !15) as *mut libc::c_void;
        if libc::send(sock, [0u8].as_ptr().cast(), 1, libc::MSG_NOSIGNAL) != 1 {
            libc::_exit(1);
        }
        let exec = args.exec;
        loop {
            let mut byte = [0u8; 1];
            let mut iov = libc::iovec {
                iov_base: byte.as_mut_ptr().cast(),
                iov_len: 1,
            };
            let mut control = Control { buf: [0; 64] };
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = std::ptr::addr_of_mut!(control.buf).cast();
            msg.msg_controllen = std::mem::size_of::<Control>() as _;
            let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n == 0 {
                // The server's end closed: it is gone.
                libc::_exit(0);
            }
            if n < 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                libc::_exit(1);
            }
            // The descriptors received: stdin, stdout, stderr and the report pipe's end.
            let mut fds = [-1 as RawFd; 4];
            let mut count = 0;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            if !cmsg.is_null()
                && (*cmsg).cmsg_level == libc::SOL_SOCKET
                && (*cmsg).cmsg_type == libc::SCM_RIGHTS
            {
                let len = ((*cmsg).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                count = len.min(4);
                std::ptr::copy_nonoverlapping(
                    libc::CMSG_DATA(cmsg).cast::<RawFd>(),
                    fds.as_mut_ptr(),
                    count,
                );
            }
            if count >= 3 {
                (*exec).stdio = [fds[0], fds[1], fds[2]];
                (*exec).report = if count == 4 { fds[3] } else { -1 };
                // The command: the server's child, born in the cgroups and the namespaces;
                // this process waits until it has exec'd or ended.
                // `CLONE_PARENT_SETTID`: the kernel writes the command's pid into the shared
                // `Exec` before the command runs, so the server learns it even if this process
                // is killed while it waits for the exec (the command then runs on, the
                // server's child: unknown to it, it would never be reaped, and the sandbox's
                // init, which ends only once every process of its namespace is reaped, never).
                let pid = libc::clone(
                    child::command,
                    stack_top,
                    libc::CLONE_VM
                        | libc::CLONE_VFORK
                        | libc::CLONE_PARENT
                        | libc::CLONE_PARENT_SETTID
                        | libc::SIGCHLD,
                    exec.cast(),
                    (*exec).pid.as_ptr(),
                );
                if pid < 0 {
                    child::record(&*exec, Step::Clone, 0);
                }
            } else {
                *libc::__errno_location() = libc::EBADF;
                child::record(&*exec, Step::Descriptors, 0);
            }
            for fd in &fds[..count] {
                libc::close(*fd);
            }
            if libc::send(sock, [0u8].as_ptr().cast(), 1, libc::MSG_NOSIGNAL) != 1 {
                libc::_exit(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::path::Path;

    use super::super::{
        probe_output, probe_output_of, with_probe_sandbox, Enter, InitError, Network, WORKSPACE,
    };
    use crate::config::LocalNetwork;

    /// Whether this machine refuses the namespaces and the test may skip (never under CI).
    fn refused(e: &InitError) -> bool {
        matches!(e, InitError::Refused { .. }) && std::env::var("CI").as_deref() != Ok("true")
    }

    #[test]
    fn commands_start_through_the_spawner_and_through_a_helper_once_it_is_gone() {
        let network = Network {
            mode: LocalNetwork::None,
            ..Network::default()
        };
        let result = with_probe_sandbox(&network, true, |init, _| {
            let spawner = init.spawner().expect("the sandbox has a spawner");
            let enter = Enter::new(init.clone(), Path::new(WORKSPACE), None)
                .map_err(|e| InitError::Prepare(e.to_string()))?;
            let run = |script: &str| {
                String::from_utf8(probe_output(&enter, script).expect("the command runs"))
                    .expect("UTF-8")
            };
            // Born with the spawner's no_new_privs and filter, in the sandbox's PID namespace
            // (the init is 1, the parent, outside, is 0), with the signals a helper's command
            // gets.
            let layers = "grep -E '^(NoNewPrivs|Seccomp|Seccomp_filters|SigBlk|SigIgn|SigCgt):' \
                          /proc/self/status; pwd; echo parent=$PPID; cut -d')' -f1 /proc/1/stat";
            let through_spawner = run(layers);
            let init_stat = std::fs::read_to_string(format!("/proc/{}/stat", init.pid()))
                .expect("the init's stat");
            let init_is_1 = format!("1 {}", init_stat.split_once(' ').expect("a stat").1);
            let init_is_1 = init_is_1.split(')').next().expect("a name");
            for line in [
                "NoNewPrivs:\t1",
                "Seccomp:\t2",
                "Seccomp_filters:\t1",
                "/workspace",
                "parent=0",
            ] {
                assert!(
                    through_spawner.lines().any(|l| l == line),
                    "{line:?} in {through_spawner}"
                );
            }
            assert!(
                through_spawner.lines().any(|l| l == init_is_1),
                "the sandbox's 1 is its init ({init_is_1}): {through_spawner}"
            );
            assert_eq!(spawner.started(), 1);
            // A request larger than the memory shared with the spawner: through a helper.
            let big = "x".repeat(100_000);
            let mut args = vec![
                OsStr::new("-c"),
                OsStr::new("echo $# ${#1}"),
                OsStr::new("bash"),
            ];
            args.extend(std::iter::repeat_n(OsStr::new(big.as_str()), 12));
            let out = probe_output_of(&enter, &args).expect("the command runs");
            assert_eq!(String::from_utf8_lossy(&out).trim(), "12 100000");
            assert_eq!(spawner.started(), 1, "the large one went through a helper");
            // Killed: the next command starts through a helper, with the same layers.
            spawner.kill();
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert_eq!(run(layers), through_spawner);
            assert_eq!(spawner.started(), 1);
            Ok(())
        });
        match result {
            Ok(()) => {}
            // This machine refuses the namespaces (never under CI): nothing to test here.
            Err(e) if refused(&e) => {}
            Err(e) => panic!("{e}"),
        }
    }

    /// This process's children in the PID namespace `ns` (a `/proc/<pid>/ns/pid` link), its
    /// init included.
    fn children_in(ns: &Path) -> Vec<u32> {
        let me = std::process::id().to_string();
        let target = std::fs::read_link(ns).ok();
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let parent = stat
                    .rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().nth(1));
                parent == Some(me.as_str())
                    && std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok() == target
            })
            .collect()
    }

    /// A spawner killed while it starts a command (a sandbox stopped as a command starts, or
    /// the memory limit's killer) leaves no command the server does not know of: one it cloned
    /// is returned to be waited for, whenever the kill lands. An unknown one would never be
    /// reaped, and the sandbox's init, which ends only once every process of its namespace is
    /// reaped, would never end (the stop waiting for it with it).
    #[test]
    fn a_spawner_killed_as_it_starts_a_command_leaves_no_command_unknown() {
        let network = Network {
            mode: LocalNetwork::None,
            ..Network::default()
        };
        let mut unknown = Vec::new();
        for round in 0..24u64 {
            let result = with_probe_sandbox(&network, true, |init, _| {
                let spawner = init.spawner().expect("the sandbox has a spawner");
                let enter = Enter::new(init.clone(), Path::new(WORKSPACE), None)
                    .map_err(|e| InitError::Prepare(e.to_string()))?;
                let ns = std::path::PathBuf::from(format!("/proc/{}/ns/pid", init.pid()));
                let null = std::fs::File::open("/dev/null").expect("/dev/null");
                let fd = std::os::fd::AsRawFd::as_raw_fd(&null);
                let env = [("PATH", OsStr::new("/usr/bin:/bin"))];
                let spec = super::super::super::spawn::Spec {
                    program: "bash",
                    args: &[OsStr::new("-c"), OsStr::new("exit 0")],
                    cwd: Path::new(WORKSPACE),
                    env: &env,
                    stdin_piped: false,
                };
                let mut started = Vec::new();
                std::thread::scope(|scope| {
                    let killer = scope.spawn(|| {
                        // A different moment of the spawner's loop each round.
                        std::thread::sleep(std::time::Duration::from_micros(200 + round * 137));
                        spawner.kill();
                    });
                    // Commands until the spawner is gone, and a few through helpers after.
                    let mut after = 0;
                    while after < 3 {
                        if killer.is_finished() {
                            after += 1;
                        }
                        if let Ok(pid) = enter.start([fd; 3], &spec) {
                            started.push(pid);
                        }
                    }
                });
                let leaked: Vec<u32> = children_in(&ns)
                    .into_iter()
                    .filter(|pid| *pid != init.pid() && !started.contains(pid))
                    .collect();
                for pid in started.iter().chain(&leaked) {
                    super::super::super::spawn::wait_blocking(*pid);
                }
                Ok(leaked)
            });
            match result {
                Ok(leaked) => unknown.extend(leaked),
                Err(e) if refused(&e) => return,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(
            unknown.is_empty(),
            "commands started but never returned: {unknown:?}"
        );
    }
}
