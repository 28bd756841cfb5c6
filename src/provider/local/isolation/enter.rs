//! A command entering its sandbox (see the module docs of `isolation`).
//!
//! [`Enter::spawn`], the way a command starts: the server's spawning thread clones a *helper*
//! that shares its memory and waits for it (`CLONE_VM | CLONE_VFORK`, on a stack of its own, as
//! `posix_spawn` does: no copy of the server's page tables, none to tear down). The helper moves
//! itself into the sandbox's limit cgroups, where it has them (see `limits`), `setns`es into
//! the init's namespaces (through the descriptors the init's start opened, user namespace
//! first), and, since entering a PID namespace places only the caller's *children* in it,
//! clones the command the same way, as the *server's* child (`CLONE_PARENT`): born in the
//! cgroups and the namespaces, it takes its own process group, resets the signals, takes its
//! descriptors, enters its working directory, sets `no_new_privs`, installs the seccomp filter
//! and execs. The helper then exits: the server reaps it, adopts the command's pid (a pidfd)
//! and waits for it and signals its process group as for an unisolated command. Between the
//! clones and the exec both make only async-signal-safe system calls on values prepared
//! before, and report a failed step through memory they share with the server.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::Arc;

use super::super::spawn::{self, Spec, Started};
use super::child::{self, block_signals, join_cgroup, record, restore_signals, Exec, Step};
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
}

/// The descriptor an isolated command gets the report pipe's write end at: [`REPORT_FD`], or
/// the highest one this process may open when its soft `RLIMIT_NOFILE` is lower (a server
/// started under `ulimit -n 64`: `dup2` refuses a target at or above the limit, and the
/// command inherits the limit). Read once: this process's limit does not change.
fn report_fd() -> RawFd {
    static FD: std::sync::OnceLock<RawFd> = std::sync::OnceLock::new();
    *FD.get_or_init(report_fd_for_limit)
}

fn report_fd_for_limit() -> RawFd {
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
        })
    }

    /// The descriptor the command finds the report pipe's write end at: [`REPORT_FD`], lower
    /// only under a lower `RLIMIT_NOFILE`.
    pub fn report_fd(&self) -> RawFd {
        self.report_fd
    }
}

/// The size of each of the two stacks the helper and the command run on until the command's
/// exec (only this module's code, a few small frames; untouched pages cost nothing).
const STACK: usize = 256 * 1024;

/// What the helper reads: the command's [`Exec`], the sandbox's cgroups and namespaces, and
/// the command's stack. On the spawning thread's stack, shared through `CLONE_VM` until the
/// command's exec.
struct Shared<'a> {
    exec: Exec,
    /// The sandbox's namespaces, user first.
    namespaces: &'a [(RawFd, libc::c_int)],
    /// The sandbox's limit cgroups' `cgroup.procs`/`tasks`.
    cgroup_procs: &'a [CString],
    /// The top of the command's stack.
    command_stack: *mut libc::c_void,
}

/// Two stacks in one mapping, unmapped when dropped (after both clones are done with them).
struct Stacks(*mut libc::c_void);

// SAFETY: a mapping of this process's that only one spawn uses at a time (taken from the pool
// and given back), and nothing else refers to.
unsafe impl Send for Stacks {}

/// The stacks of spawns that ended, for the next ones: a mapping made and unmapped per command
/// costs its page faults and, in a process of many threads, the unmap's TLB shootdown.
static POOL: std::sync::Mutex<Vec<Stacks>> = std::sync::Mutex::new(Vec::new());

/// How many stacks the pool keeps (as many as commands spawned at once, at most).
const POOL_SIZE: usize = 8;

impl Stacks {
    /// Stacks from the pool, or new ones.
    fn take() -> io::Result<Stacks> {
        let pooled = POOL.lock().ok().and_then(|mut pool| pool.pop());
        match pooled {
            Some(stacks) => Ok(stacks),
            None => Stacks::map(),
        }
    }

    /// Back to the pool (unmapped when it is full). Only once both clones are done with them.
    fn give_back(self) {
        if let Ok(mut pool) = POOL.lock() {
            if pool.len() < POOL_SIZE {
                pool.push(self);
            }
        }
    }

    fn map() -> io::Result<Stacks> {
        // SAFETY: a new private anonymous mapping; nothing else refers to it.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * STACK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Stacks(at))
    }

    /// The top of the `n`th (0 or 1), 16-byte aligned: stacks grow down on every
    /// architecture Linux's `clone` wrapper supports here.
    fn top(&self, n: usize) -> *mut libc::c_void {
        ((self.0 as usize + (n + 1) * STACK) & !15) as *mut libc::c_void
    }
}

impl Drop for Stacks {
    fn drop(&mut self) {
        // SAFETY: the mapping `map` made, of that length, which nothing runs on any more.
        unsafe {
            libc::munmap(self.0, 2 * STACK);
        }
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

impl Enter {
    /// Starts `spec` in the sandbox as this process's own child, in its own process group,
    /// with exactly `spec.env` and its program found on that environment's `PATH` inside the
    /// sandbox, starting in the directory [`Enter::new`] was given (`spec.cwd` is not used: it
    /// is a path of the host's). Blocks until the command has exec'd (well under a
    /// millisecond). `Err` names the step that failed; nothing then runs.
    pub(in crate::provider::local) fn spawn(&self, spec: &Spec<'_>) -> io::Result<Started> {
        let stdio = spawn::Stdio::make(spec.stdin_piped)?;
        let pid = self.start([0, 1, 2].map(|i| stdio.child[i].as_raw_fd()), spec)?;
        stdio.adopt(pid)
    }

    /// Starts `spec` as [`Enter::spawn`] does, with `stdio` as its stdin, stdout and stderr
    /// (descriptors above 2, which it gets at 0, 1 and 2), and returns its pid: this process's
    /// child, for the caller to wait for and reap. Through the sandbox's spawner where it has
    /// one (see `spawner`), otherwise (none, it ended, or the request does not fit its memory)
    /// through a helper cloned for this command.
    pub(super) fn start(&self, stdio: [RawFd; 3], spec: &Spec<'_>) -> io::Result<u32> {
        // (A `dup2` onto itself would leave its close-on-exec flag: the exec would close it.)
        if stdio.iter().any(|fd| *fd <= 2) {
            return Err(io::Error::other(
                "a command's standard descriptor is one of this process's own (0-2)",
            ));
        }
        let programs = self.programs(spec)?;
        let argv = std::iter::once(spec.program.as_bytes())
            .chain(spec.args.iter().map(|a| a.as_bytes()))
            .map(cstring)
            .collect::<io::Result<Vec<_>>>()?;
        let envp = spec
            .env
            .iter()
            .map(|(k, v)| cstring(&[k.as_bytes(), b"=", v.as_bytes()].concat()))
            .collect::<io::Result<Vec<_>>>()?;
        let report = self.report.as_ref().map_or(-1, |r| r.as_raw_fd());
        if let Some(spawner) = self.init.spawner() {
            let request = super::spawner::Request {
                stdio,
                report,
                report_fd: self.report_fd,
                cwd: &self.cwd,
                workspace: &self.workspace,
                programs: &programs,
                argv: &argv,
                envp: &envp,
            };
            match spawner.spawn(&request) {
                Ok(pid) => return Ok(pid),
                Err(super::spawner::SpawnError::Step { step, index, errno }) => {
                    return Err(self.failed(step, index as usize, errno, spec))
                }
                Err(super::spawner::SpawnError::Lost(e)) => return Err(e),
                // Nothing was started: the helper's way below.
                Err(super::spawner::SpawnError::Unavailable) => {}
            }
        }
        let (programs_ptrs, argv_ptrs, envp_ptrs) =
            (pointers(&programs), pointers(&argv), pointers(&envp));
        let cgroup_procs = self.init.cgroups().map_or(&[][..], |c| c.procs());
        let namespaces: Vec<(RawFd, libc::c_int)> = self.init.namespace_fds().collect();
        let stacks = Stacks::take()?;
        let filter = super::seccomp::filter();
        let shared = Shared {
            exec: Exec {
                stdio,
                report,
                report_fd: self.report_fd,
                cwd: self.cwd.as_ptr(),
                workspace: self.workspace.as_ptr(),
                programs: programs_ptrs.as_ptr(),
                argv: argv_ptrs.as_ptr(),
                envp: envp_ptrs.as_ptr(),
                reset_signals: true,
                no_new_privs: true,
                filter: filter.map_or(std::ptr::null(), |f| f.as_ptr()),
                filter_len: filter.map_or(0, |f| f.len() as u16),
                pid: AtomicI32::new(0),
                step: AtomicU32::new(0),
                index: AtomicU32::new(0),
                errno: AtomicI32::new(0),
            },
            namespaces: &namespaces,
            cgroup_procs,
            command_stack: stacks.top(1),
        };
        // Every signal blocked across the clones (as `posix_spawn` does): the helper never
        // unblocks them, and the command resets the handlers before it does, so neither runs
        // one of the server's.
        let old = block_signals()?;
        // SAFETY: the helper shares this process's memory and this thread waits
        // (`CLONE_VFORK`) until it has exited: it runs on a stack of its own, reads `shared`
        // (alive on this thread's stack until then) and makes only async-signal-safe system
        // calls, as does the command it clones, which it waits for the same way.
        let helper = unsafe {
            libc::clone(
                helper,
                stacks.top(0),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                std::ptr::from_ref(&shared).cast_mut().cast(),
            )
        };
        let clone_error = io::Error::last_os_error();
        restore_signals(&old);
        // Both clones are done with them: the helper has exited (or was never made), and the
        // command had exec'd or ended before the helper went on.
        stacks.give_back();
        if helper < 0 {
            return Err(io::Error::new(
                clone_error.kind(),
                format!("cannot clone a process to enter the sandbox: {clone_error}"),
            ));
        }
        // It has exited (a vfork returns once its child exits or execs).
        spawn::wait_blocking(helper as u32);
        let exec = &shared.exec;
        let pid = exec.pid.load(Ordering::SeqCst);
        let step = exec.step.load(Ordering::SeqCst);
        if step != 0 {
            if pid > 0 {
                // Cloned, but it ended before its exec: reaped here.
                spawn::wait_blocking(pid as u32);
            }
            let index = exec.index.load(Ordering::SeqCst) as usize;
            let errno = exec.errno.load(Ordering::SeqCst);
            return Err(self.failed(step, index, errno, spec));
        }
        u32::try_from(pid)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| io::Error::other("the helper entering the sandbox ended early"))
    }

    /// Where `spec`'s program may be, in the order its exec tries them: its path, or each
    /// directory of the `PATH` in its environment (the system's default without one).
    fn programs(&self, spec: &Spec<'_>) -> io::Result<Vec<CString>> {
        if spec.program.contains('/') {
            return Ok(vec![cstring(spec.program.as_bytes())?]);
        }
        let path = spec
            .env
            .iter()
            .rev()
            .find(|(k, _)| *k == "PATH")
            .map_or(&b"/usr/bin:/bin"[..], |(_, v)| v.as_bytes());
        path.split(|b| *b == b':')
            .map(|dir| if dir.is_empty() { &b"."[..] } else { dir })
            .map(|dir| cstring(&[dir, b"/", spec.program.as_bytes()].concat()))
            .collect()
    }

    /// The error of the step `step` (its `index`th item) that failed with `errno`.
    fn failed(&self, step: u32, index: usize, errno: i32, spec: &Spec<'_>) -> io::Error {
        let source = io::Error::from_raw_os_error(errno);
        let step = Step::ALL.into_iter().find(|s| *s as u32 == step);
        let what = match step {
            Some(Step::Cgroup) => format!(
                "cannot join the sandbox's limit cgroup ({})",
                self.init
                    .cgroups()
                    .and_then(|c| c.procs().get(index))
                    .map_or_else(|| "?".into(), |p| p.to_string_lossy().into_owned())
            ),
            Some(Step::Namespace) => format!(
                "cannot enter the sandbox's {} namespace",
                self.init
                    .namespace_fds()
                    .nth(index)
                    .map_or("?", |(_, flag)| namespace_name(flag))
            ),
            Some(Step::Clone) => "cannot start the command inside the sandbox".into(),
            Some(Step::ProcessGroup) => "cannot give the command its own process group".into(),
            Some(Step::Descriptors) => "cannot give the command its standard descriptors".into(),
            Some(Step::Directory) => format!(
                "cannot enter the command's directory {} (nor {WORKSPACE})",
                self.cwd.to_string_lossy()
            ),
            Some(Step::Report) => "cannot give the command its report descriptor".into(),
            Some(Step::NoNewPrivs) => "cannot set no_new_privs".into(),
            Some(Step::Seccomp) => "cannot install the seccomp filter".into(),
            Some(Step::Exec) => format!("cannot execute {} inside the sandbox", spec.program),
            None => "cannot start the command inside the sandbox".into(),
        };
        io::Error::new(source.kind(), StepFailed { what, source })
    }
}

/// A step of [`Enter::spawn`] that failed: what it was, and its errno as the source (which
/// `LocalError`'s hints read).
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
struct StepFailed {
    what: String,
    #[source]
    source: io::Error,
}

/// The name of the namespace `flag` stands for.
fn namespace_name(flag: libc::c_int) -> &'static str {
    match flag {
        libc::CLONE_NEWUSER => "user",
        libc::CLONE_NEWNS => "mount",
        libc::CLONE_NEWPID => "PID",
        libc::CLONE_NEWNET => "network",
        libc::CLONE_NEWIPC => "IPC",
        libc::CLONE_NEWUTS => "UTS",
        libc::CLONE_NEWCGROUP => "cgroup",
        _ => "?",
    }
}

/// The helper, from its clone to its exit, sharing the server's memory (whose spawning thread
/// waits, `CLONE_VFORK`): into the cgroups, into the namespaces, then the command's clone.
/// Returns (exits) 0, or 1 with the failed step in `shared`.
extern "C" fn helper(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the spawning thread's `Shared`, alive while it waits for this process;
    // the rest are async-signal-safe system calls on it.
    unsafe {
        let shared = &*arg.cast::<Shared<'_>>();
        let exec = &shared.exec;
        // Into the sandbox's limit cgroups first (the hierarchies are not visible inside): the
        // command is born in them, and all it starts. This process has one thread, so writing
        // `tasks` (v1) moves all of it.
        for (index, procs) in shared.cgroup_procs.iter().enumerate() {
            if !join_cgroup(procs) {
                record(exec, Step::Cgroup, index);
                return 1;
            }
        }
        for (index, (fd, flag)) in shared.namespaces.iter().enumerate() {
            if libc::setns(*fd, *flag) != 0 {
                record(exec, Step::Namespace, index);
                return 1;
            }
        }
        // The command: the server's child (`CLONE_PARENT`), in the PID namespace just entered;
        // this process waits until it has exec'd or ended (`CLONE_VFORK`).
        // `CLONE_PARENT_SETTID`: the kernel writes its pid for the server before it runs, so a
        // helper killed while it waits (the memory limit's killer) leaves no command unknown
        // (see `spawner`).
        let pid = libc::clone(
            child::command,
            shared.command_stack,
            libc::CLONE_VM
                | libc::CLONE_VFORK
                | libc::CLONE_PARENT
                | libc::CLONE_PARENT_SETTID
                | libc::SIGCHLD,
            std::ptr::from_ref(exec).cast_mut().cast(),
            exec.pid.as_ptr(),
        );
        if pid < 0 {
            record(exec, Step::Clone, 0);
            return 1;
        }
        0
    }
}
