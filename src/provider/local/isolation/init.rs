//! A sandbox's init: PID 1 of its namespaces, which builds the sandbox's filesystem and then
//! holds the namespaces until its lifeline closes (see the module docs of `isolation`).
//!
//! Everything the child does between its clone and its end is prepared before the clone (a
//! [`Plan`] of paths, flags and texts): a clone of a multi-threaded process may only make
//! async-signal-safe system calls, so the child neither allocates nor takes a lock. A step that
//! fails writes its number and errno to the status pipe and the child exits; the parent names
//! the step ([`InitError::Step`]).

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use super::super::spawn::CloneArgs;
use super::plan::{Plan, Step};
use super::{InitError, REFUSED_HINT};

/// The running init of a sandbox: its pid and pidfd (how commands enter it), and the lifeline
/// whose closing ends it.
pub struct Init {
    pid: u32,
    pidfd: OwnedFd,
    /// Its namespaces, user first, opened while it could still be inspected (it makes itself
    /// undumpable once ready; `setns` through a pidfd would then need `CAP_SYS_PTRACE`).
    namespaces: Vec<(OwnedFd, libc::c_int)>,
    lifeline: Option<OwnedFd>,
    reaped: bool,
    /// The sandbox's limit cgroups, removed once it has ended.
    cgroups: Option<super::Cgroups>,
    /// The `pasta` giving its network namespace outbound access, ended with it.
    pasta: Option<super::network::Pasta>,
    /// The UDP socket its init bound at the host's loopback resolver's address inside, until
    /// [`Init::relay_dns`] relays it (see `dns`).
    dns_socket: Option<OwnedFd>,
    /// The relay of its DNS queries to the host's loopback resolver, ended with it.
    dns_relay: Option<super::dns::Relay>,
    /// The process that clones its commands (see `spawner`), ended with it.
    spawner: Option<super::spawner::Spawner>,
}

/// The namespaces' names under `/proc/<pid>/ns/` and their flags, in the order a command
/// enters them (the user namespace first: it gives the rights to enter the others).
const NAMESPACE_FILES: [(&str, libc::c_int); 7] = [
    ("user", libc::CLONE_NEWUSER),
    ("mnt", libc::CLONE_NEWNS),
    ("pid", libc::CLONE_NEWPID),
    ("net", libc::CLONE_NEWNET),
    ("ipc", libc::CLONE_NEWIPC),
    ("uts", libc::CLONE_NEWUTS),
    ("cgroup", libc::CLONE_NEWCGROUP),
];

impl fmt::Debug for Init {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Init").field("pid", &self.pid).finish()
    }
}

/// A pipe, both ends close-on-exec: (read, write).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two descriptors for `pipe2` to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `pipe2` succeeded: both are open descriptors nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The namespaces a sandbox has of its own.
pub(super) const NAMESPACES: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP;

impl Init {
    /// Starts the init of a sandbox whose workspace is `workspace`, building its root in the
    /// empty directory `root` (in its own mount namespace: the host sees nothing mounted), in a
    /// network namespace of its own unless `host_network`, with its DNS as `dns` says. Blocks
    /// until it is ready (a few milliseconds). The workspace is also at `alias` inside, where
    /// given.
    pub(super) fn start(
        workspace: &Path,
        root: &Path,
        host_network: bool,
        dns: Option<&super::dns::Dns>,
        alias: Option<&Path>,
    ) -> Result<Init, InitError> {
        let plan = Plan::new(workspace, root, !host_network, dns, alias)?;
        let namespaces = if host_network {
            NAMESPACES & !libc::CLONE_NEWNET
        } else {
            NAMESPACES
        };
        let prep = |e: io::Error| InitError::Prepare(e.to_string());
        let (status_r, status_w) = pipe().map_err(prep)?;
        let (life_r, life_w) = pipe().map_err(prep)?;
        let (go_r, go_w) = pipe().map_err(prep)?;
        let mut pidfd: libc::c_int = -1;
        let args = CloneArgs {
            flags: namespaces as u64 | libc::CLONE_PIDFD as u64,
            pidfd: std::ptr::addr_of_mut!(pidfd) as u64,
            exit_signal: libc::SIGCHLD as u64,
            ..CloneArgs::default()
        };
        let keep = [status_w.as_raw_fd(), life_r.as_raw_fd(), go_r.as_raw_fd()];
        // Every signal blocked across the clone, so the child never runs one of the server's
        // handlers (it keeps them blocked: it waits on a signalfd).
        // SAFETY: all-zero `sigset_t`s are valid; sigfillset and pthread_sigmask fill them.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: both sets are ours; this changes only the calling thread's mask.
        unsafe {
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        }
        // SAFETY: a fork-like clone3 (no CLONE_VM, no stack): the child gets a copy of this
        // process (one thread, this one) and continues here with 0. It runs only `child`,
        // which makes async-signal-safe system calls on the plan prepared above and never
        // returns.
        let r = unsafe { args.clone3() };
        if r == 0 {
            // SAFETY: in the child of the clone above, as `child` requires.
            unsafe { child(&plan, keep) }
        }
        let clone_error = io::Error::last_os_error();
        // SAFETY: restores the mask saved above, on this thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        if r < 0 {
            return Err(match clone_error.raw_os_error() {
                Some(libc::EPERM | libc::EACCES | libc::ENOSPC | libc::EUSERS | libc::EINVAL) => {
                    InitError::Refused {
                        source: clone_error,
                        hint: REFUSED_HINT,
                    }
                }
                _ => InitError::Prepare(format!("clone3: {clone_error}")),
            });
        }
        // SAFETY: `CLONE_PIDFD` stored a new descriptor in `pidfd` that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        drop((status_w, life_r, go_r));
        let mut init = Init {
            pid: r as u32,
            pidfd,
            namespaces: Vec::new(),
            lifeline: Some(life_w),
            reaped: false,
            cgroups: None,
            pasta: None,
            dns_socket: None,
            dns_relay: None,
            spawner: None,
        };
        // Its namespaces, opened while it waits for the go (before it makes itself undumpable).
        for (name, flag) in NAMESPACE_FILES {
            if namespaces & flag == 0 {
                continue;
            }
            let path = format!("/proc/{}/ns/{name}", init.pid);
            match std::fs::File::open(&path) {
                Ok(file) => init.namespaces.push((OwnedFd::from(file), flag)),
                Err(e) => {
                    init.kill();
                    return Err(InitError::Prepare(format!("cannot open {path}: {e}")));
                }
            }
        }
        // SAFETY: writes one byte from a local buffer to our end of the go pipe.
        unsafe { libc::write(go_w.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        drop(go_w);
        // Ready: the child closes its end (EOF) after writing one zero byte; a failed step
        // writes its index and errno instead.
        let mut buf = [0u8; 8];
        let got = read_full(status_r.as_raw_fd(), &mut buf);
        if got == 1 && buf[0] == 0 {
            init.dns_socket = plan
                .dns_channel
                .as_ref()
                .and_then(|(server, _)| super::dns::receive_fd(server.as_raw_fd()));
            return Ok(init);
        }
        init.kill();
        if got == 8 {
            let step = u32::from_ne_bytes(buf[..4].try_into().expect("four bytes")) as usize;
            let errno = i32::from_ne_bytes(buf[4..].try_into().expect("four bytes"));
            let what = plan.steps.get(step).map_or("an unknown step", |(_, w)| w);
            let source = io::Error::from_raw_os_error(errno);
            // The very first steps fail where user namespaces are crippled (a mapping refused).
            if step < 3 {
                return Err(InitError::Refused {
                    source,
                    hint: REFUSED_HINT,
                });
            }
            return Err(InitError::Step {
                step: what.to_string(),
                source,
            });
        }
        Err(InitError::Prepare(
            "the sandbox's init ended before it was ready".into(),
        ))
    }

    /// Gives the sandbox its limit cgroups (before any command joins them): every command joins
    /// them, and they are removed when the init ends.
    pub fn set_cgroups(&mut self, cgroups: super::Cgroups) {
        self.cgroups = Some(cgroups);
    }

    /// Attaches `pasta` (the program at `program`) to the sandbox's network namespace, giving
    /// it outbound access (see `network`); ended with the sandbox. `pidfile` is a path of the
    /// host's for `pasta` to say it is ready through. `Err` says why not (the sandbox then has
    /// its loopback only).
    pub fn attach_pasta(&mut self, program: &Path, pidfile: &Path) -> Result<(), String> {
        let fd = |flag| {
            self.namespaces
                .iter()
                .find(|(_, f)| *f == flag)
                .map(|(fd, _)| fd.as_raw_fd())
        };
        let (Some(user), Some(net)) = (fd(libc::CLONE_NEWUSER), fd(libc::CLONE_NEWNET)) else {
            return Err("the sandbox has no network namespace of its own".into());
        };
        let pasta = super::network::Pasta::start(program, user, net, pidfile)?;
        self.pasta = Some(pasta);
        Ok(())
    }

    /// Relays the DNS queries that reach the socket its init bound (see `dns`) to `upstream`,
    /// the host's loopback resolver, until the sandbox ends. `Err` says why not.
    pub(super) fn relay_dns(&mut self, upstream: std::net::SocketAddrV4) -> Result<(), String> {
        let socket = self
            .dns_socket
            .take()
            .ok_or("the sandbox's init could not bind a socket for it")?;
        let relay = super::dns::Relay::start(socket, upstream)
            .map_err(|e| format!("cannot start its thread: {e}"))?;
        self.dns_relay = Some(relay);
        Ok(())
    }

    /// The sandbox's limit cgroups, if it has them.
    /// Starts the process that clones its commands (see `spawner`) with `filter` as its seccomp
    /// filter, once its cgroups are set. Without one (it could not start: said in the log),
    /// commands enter the sandbox by a helper of their own.
    pub(super) fn start_spawner(&mut self, filter: Option<&[libc::sock_filter]>) {
        let namespaces: Vec<(RawFd, libc::c_int)> = self.namespace_fds().collect();
        let procs = self.cgroups.as_ref().map_or(&[][..], |c| c.procs());
        match super::spawner::Spawner::start(&namespaces, procs, filter) {
            Ok(spawner) => self.spawner = Some(spawner),
            Err(e) => tracing::debug!(init = self.pid, error = %e,
                "no spawner for the sandbox: each command enters it by a helper"),
        }
    }

    /// The process that clones its commands, if it has one.
    pub(super) fn spawner(&self) -> Option<&super::spawner::Spawner> {
        self.spawner.as_ref()
    }

    pub fn cgroups(&self) -> Option<&super::Cgroups> {
        self.cgroups.as_ref()
    }

    /// The descriptors of its namespaces and their flags, in the order to enter them.
    pub(super) fn namespace_fds(&self) -> impl Iterator<Item = (RawFd, libc::c_int)> + '_ {
        self.namespaces
            .iter()
            .map(|(fd, flag)| (fd.as_raw_fd(), *flag))
    }

    /// The init's pid (in the server's PID namespace).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether it still runs (its pidfd is not readable yet).
    pub fn alive(&self) -> bool {
        if self.reaped {
            return false;
        }
        let mut p = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `p` is one valid pollfd; a zero timeout makes this a check.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n == 0
    }

    /// Ends the sandbox: kills its init, so the kernel kills every process of its PID
    /// namespace, and reaps it, which happens only once they are all gone. Blocks until then.
    pub fn kill(mut self) {
        self.end();
    }

    /// Sends the init SIGKILL through its pidfd (nothing if it is gone already).
    fn send_kill(&self) {
        super::sigkill(&self.pidfd);
    }

    /// Kills the init and waits until it has exited, which PID 1 of a namespace does only once
    /// every other process of the namespace is gone (the kernel waits for them in its exit).
    /// Not reaped: whoever holds the last reference does that. For a caller that shares it
    /// (a command being spawned holds it a moment).
    pub fn stop(&self) {
        if self.reaped {
            return;
        }
        self.send_kill();
        // Not in the sandbox's PID namespace: it does not end with the init.
        if let Some(spawner) = &self.spawner {
            spawner.kill();
        }
        let mut p = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // A pidfd is readable once its process has exited.
        // SAFETY: `p` is one valid pollfd.
        while unsafe { libc::poll(&mut p, 1, -1) } < 0
            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
        {}
    }

    /// Kills the init and waits, without blocking the thread, until it has exited. PID 1 of a
    /// namespace exits only once every other process of it is reaped, and a command's shell is
    /// this process's own child (see `enter`), reaped by its exec: a stop awaited beside that
    /// exec (in the same task's runtime, one of a single thread) must let it run. The blocking
    /// reap of [`Init::kill`] or [`Init::stop`] is then immediate.
    pub async fn killed(&self) {
        if self.reaped {
            return;
        }
        self.send_kill();
        if let Some(spawner) = &self.spawner {
            spawner.kill();
        }
        // A pidfd is readable once its process has exited. Without one to register, the
        // blocking wait of `kill` or `stop` is what remains.
        let Ok(fd) = self.pidfd.try_clone() else {
            return;
        };
        // SAFETY: the `AsyncFd` owns the duplicated descriptor (nothing else closes or
        // replaces it) until it is dropped at the end of this function.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        };
        if let Ok(fd) = registered {
            let _ = fd.readable().await;
        }
    }

    fn end(&mut self) {
        if self.reaped {
            return;
        }
        self.lifeline = None;
        self.stop();
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes only into `status`; the init is our unreaped child.
            let r = unsafe { libc::waitpid(self.pid as libc::pid_t, &mut status, 0) };
            if r >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                break;
            }
        }
        self.reaped = true;
        // Killed by the stop above: reaped as it drops.
        self.spawner = None;
        // Its network namespace is gone with it: so is what carried its connections out.
        if let Some(pasta) = self.pasta.take() {
            pasta.end();
        }
        self.dns_socket = None;
        if let Some(relay) = self.dns_relay.take() {
            relay.end();
        }
        // Every process of the sandbox is dead: its cgroups can go.
        if let Some(cgroups) = self.cgroups.take() {
            cgroups.remove();
        }
    }
}

impl Drop for Init {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        // Killed and reaped on a thread of its own (the reap waits for the whole namespace).
        let init = Init {
            pid: self.pid,
            pidfd: match self.pidfd.try_clone() {
                Ok(fd) => fd,
                Err(_) => return,
            },
            namespaces: Vec::new(),
            lifeline: self.lifeline.take(),
            reaped: false,
            cgroups: self.cgroups.take(),
            pasta: self.pasta.take(),
            dns_socket: self.dns_socket.take(),
            dns_relay: self.dns_relay.take(),
            spawner: self.spawner.take(),
        };
        self.reaped = true;
        let _ = std::thread::Builder::new()
            .name("taskbox-init-reap".into())
            .spawn(move || init.kill());
    }
}

/// Reads into `buf` until it is full or the pipe's end; returns how much was read.
fn read_full(fd: RawFd, buf: &mut [u8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reads into the rest of `buf`, which is ours.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        match n {
            0 => break,
            n if n > 0 => got += n as usize,
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
    got
}

/// `struct ifreq` with its flags member, for `SIOCSIFFLAGS`.
#[repr(C)]
struct IfReqFlags {
    name: [u8; 16],
    flags: libc::c_short,
    pad: [u8; 22],
}

/// The init itself, in the child of the clone: runs the plan, reports ready, then reaps until
/// its lifeline closes.
///
/// # Safety
/// Only in the child of a fork-like clone (one thread), with every signal blocked.
unsafe fn child(plan: &Plan, [status, lifeline, go]: [RawFd; 3]) -> ! {
    // SAFETY: (the whole body) async-signal-safe system calls on integers and on pointers into
    // the plan, which the fork copied and nothing frees; nothing allocates or takes a lock.
    unsafe {
        let fail = |index: usize| -> ! {
            let errno = *libc::__errno_location();
            let mut buf = [0u8; 8];
            buf[..4].copy_from_slice(&(index as u32).to_ne_bytes());
            buf[4..].copy_from_slice(&errno.to_ne_bytes());
            libc::write(status, buf.as_ptr().cast(), buf.len());
            libc::_exit(1)
        };
        let opt = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        for (index, (step, _)) in plan.steps.iter().enumerate() {
            let ok = match step {
                Step::Write { path, text } => {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    let len = text.as_bytes().len();
                    let ok = fd >= 0 && libc::write(fd, text.as_ptr().cast(), len) == len as isize;
                    if fd >= 0 {
                        libc::close(fd);
                    }
                    ok
                }
                Step::Mount {
                    source,
                    target,
                    fstype,
                    flags,
                    data,
                } => {
                    libc::mount(
                        opt(source),
                        target.as_ptr(),
                        opt(fstype),
                        *flags,
                        opt(data).cast(),
                    ) == 0
                }
                Step::Mkdir(path) => {
                    libc::mkdir(path.as_ptr(), 0o755) == 0
                        || *libc::__errno_location() == libc::EEXIST
                }
                Step::Touch(path) => {
                    let fd = libc::open(
                        path.as_ptr(),
                        libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
                        0o644,
                    );
                    fd >= 0 && libc::close(fd) == 0
                }
                Step::Symlink { target, link } => {
                    libc::symlink(target.as_ptr(), link.as_ptr()) == 0
                }
                Step::PivotRoot(root) => {
                    let dot = c".".as_ptr();
                    libc::chdir(root.as_ptr()) == 0
                        && libc::syscall(libc::SYS_pivot_root, dot, dot) == 0
                        && libc::umount2(dot, libc::MNT_DETACH) == 0
                        && libc::chdir(c"/".as_ptr()) == 0
                }
                Step::Hostname(name) => {
                    libc::sethostname(name.as_ptr(), name.as_bytes().len()) == 0
                }
                Step::LoopbackUp => {
                    let sock =
                        libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
                    let mut req = IfReqFlags {
                        name: [0; 16],
                        flags: (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short,
                        pad: [0; 22],
                    };
                    req.name[..2].copy_from_slice(b"lo");
                    let ok = sock >= 0
                        && libc::ioctl(sock, libc::SIOCSIFFLAGS, std::ptr::addr_of_mut!(req)) == 0;
                    if sock >= 0 {
                        libc::close(sock);
                    }
                    ok
                }
                Step::DnsSocket { addr, channel } => {
                    let sock =
                        libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
                    if sock >= 0 {
                        let bound = libc::bind(
                            sock,
                            (addr as *const libc::sockaddr_in).cast(),
                            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                        ) == 0;
                        if bound {
                            super::dns::send_fd(*channel, sock);
                        }
                        libc::close(sock);
                    }
                    // Without it the sandbox has no DNS (the server says so), not no start.
                    true
                }
            };
            if !ok {
                fail(index);
            }
        }
        // Nothing of the server's stays open here (its sockets, its lock, its database, and
        // this process's copies of the pipes' other ends): everything but the status pipe, the
        // lifeline and the go pipe is closed — before the wait for go, which would otherwise
        // wait forever on a write end of its own were the server to die first (a SIGKILL
        // while it starts a sandbox).
        let mut keep = [status, lifeline, go];
        keep.sort_unstable();
        let mut from = 0u32;
        for fd in keep {
            let fd = fd as u32;
            if fd > from {
                libc::syscall(libc::SYS_close_range, from, fd - 1, 0u32);
            }
            from = fd + 1;
        }
        libc::syscall(libc::SYS_close_range, from, u32::MAX, 0u32);
        // The parent has opened its namespaces' files once it says go (or has gone).
        let mut byte = [0u8; 1];
        while libc::read(go, byte.as_mut_ptr().cast(), 1) < 0
            && *libc::__errno_location() == libc::EINTR
        {}
        libc::close(go);
        // Its memory is a copy of the server's: no process of the sandbox may read it.
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        libc::write(status, [0u8].as_ptr().cast(), 1);
        libc::close(status);

        let mut chld: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut chld);
        libc::sigaddset(&mut chld, libc::SIGCHLD);
        let sfd = libc::signalfd(-1, &chld, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        let mut fds = [
            libc::pollfd {
                fd: lifeline,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sfd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            // Reap whatever ended (orphans of the namespace are this process's children).
            loop {
                let mut st = 0;
                if libc::waitpid(-1, &mut st, libc::WNOHANG) <= 0 {
                    break;
                }
            }
            let n = libc::poll(fds.as_mut_ptr(), if sfd >= 0 { 2 } else { 1 }, -1);
            if n < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(1);
            }
            if fds[0].revents != 0 {
                // The lifeline closed: the sandbox ends with this process.
                libc::_exit(0);
            }
            if sfd >= 0 && fds[1].revents != 0 {
                let mut info = [0u8; 128];
                libc::read(sfd, info.as_mut_ptr().cast(), info.len());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_namespace_names_the_cause_and_the_fix() {
        let e = InitError::Refused {
            source: io::Error::from_raw_os_error(libc::EPERM),
            hint: REFUSED_HINT,
        };
        let text = e.to_string();
        assert!(text.contains("CLONE_NEWUSER"), "{text}");
        assert!(
            text.contains("apparmor_restrict_unprivileged_userns"),
            "{text}"
        );
        assert!(text.contains("terminal.local_isolation = none"), "{text}");
        assert_eq!(e.hint(), Some(REFUSED_HINT));
    }
}
