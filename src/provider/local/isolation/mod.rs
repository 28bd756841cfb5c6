//! A local sandbox in namespaces of its own (`terminal.local_isolation = namespaces`, the
//! default; issue 31).
//!
//! **Who creates and ends them.** A sandbox's first command (in this process) starts its *init*
//! (`Init::start`): a process cloned from the server with new user, mount, PID, network, IPC,
//! UTS and cgroup namespaces, which is PID 1 of its PID namespace. Before it reports ready it
//! maps one user, builds the sandbox's filesystem and `pivot_root`s into it (see `init`), brings
//! its loopback up (with `isolated`, the server then attaches `pasta` to its network namespace,
//! see `network`), then only reaps the processes the kernel hands it, until its *lifeline* (a
//! pipe whose only write end the server holds) closes: a stop (`Init::kill`) or the server's
//! own death. When PID 1 of a PID namespace ends, the kernel kills every other process in it, so
//! nothing a command started outlives the sandbox, whatever it did (`setsid`, `env -i`,
//! double forks): no process scan and no environment marker is needed.
//!
//! **How a command enters them.** Each command — the provider's own `bash`, the fake Vercel's
//! contained commands (`Contained::spawn`), doctor's probe — is started by `Enter::spawn` (see
//! `enter`): a helper that shares the server's memory (a `vfork`-like clone on a stack of its
//! own) joins the sandbox's limit cgroups and `setns`es into all seven namespaces (descriptors
//! opened at the init's start), then clones the command the same way as the *server's* child
//! (`CLONE_PARENT`), because entering a PID namespace places only the caller's *children* in
//! it. The command takes its own process group, sets `no_new_privs`, installs the seccomp
//! filter (`seccomp`), enters its working directory and execs with a clean environment; the
//! helper exits. The server waits for the command through a pidfd and signals its process
//! group as for an unisolated command, so waits, signals and exit codes are unchanged — and no
//! copy of the server's memory is made per command.
//!
//! **What a command sees.** The workspace at [`WORKSPACE`] (read-write, the only tree shared with
//! the host); `/usr`, `/bin`, `/sbin`, `/lib*`, `/opt` and `/etc` read-only, with `/etc/shadow`,
//! `/etc/gshadow` and their backups, the SSH host keys, `/etc/ssl/private` and the credential
//! stores masked (empty); a private `/tmp` and `/dev/shm` (tmpfs: not kept in snapshots); a
//! fresh `/proc` of its PID namespace, with `/proc/sys`, `irq`, `bus` and `fs` read-only and
//! `sysrq-trigger`, `kcore`, `timer_list`, `keys` masked; a `/dev` with only `null`, `zero`,
//! `full`, `random`, `urandom` and `tty`; and a read-only root. Home directories, `/root`, the
//! data dir (the journal, the snapshot store, other tasks' workspaces, the server's socket and
//! lock) and `/sys` are not there at all. It runs as uid and gid [`UID`] (not root: no
//! capability survives its exec; root inside is not offered), mapped to the server's own uid and
//! gid outside, so it can do nothing the server's user could not — and, when the server runs as
//! root, it *is* root to the kernel's owner checks, which is why the root-owned knobs and keys
//! above are read-only or masked. Its network is `terminal.local_network`'s (see `network`): its
//! own network namespace with outbound access through `pasta` and no route to the host's
//! `127.0.0.1` (`isolated`, loopback only where `pasta` is missing), its own with loopback only
//! (`none`), or the host's (`host`: no network namespace of its own). Its environment is
//! `environment`'s, nothing of the server's.
//!
//! **What bounds it.** Where a cgroup hierarchy allows it, the sandbox's limits
//! (`terminal.container_cpu`, `container_memory`, `container_pids`) hold for all its processes
//! together: cgroups made as its init starts, joined by each command's hook before it enters,
//! removed when the init ends (see `limits`).
//!
//! Why [`WORKSPACE`] is `/workspace`: one path, the same for every task, every generation,
//! every restore and every fork, and for every data dir, so absolute paths a command records in
//! its files (shebangs, virtualenvs, build caches) stay true wherever its snapshot is restored.

mod child;
mod dns;
mod enter;
mod init;
mod limits;
mod network;
mod plan;
mod seccomp;
mod spawner;

pub(super) use self::enter::Enter;
pub(super) use self::init::Init;
pub use self::limits::{support as limits_support, Cgroups, Limits, PREFIX as LIMITS_PREFIX};
pub use self::network::{degraded_note, find_pasta, ADDRESS, GATEWAY, HOST_NETWORK_NOTE};
pub use self::seccomp::DENIED;

use std::io;
use std::path::Path;

use crate::config::{LocalIsolation, LocalNetwork};

/// Where a sandbox's workspace is inside it.
pub const WORKSPACE: &str = "/workspace";

/// The uid and gid commands run as inside a sandbox (mapped to the server's outside).
pub const UID: u32 = 1000;

/// The hostname inside a sandbox.
pub(super) const HOSTNAME: &str = "taskbox";

/// The descriptor a command's exit trap reports its working directory through, inside a
/// sandbox (the server's `/proc/<pid>/fd/<n>` is not visible there). High, so that a command
/// that takes over low descriptors does not close it by accident (lower only where the
/// server's `RLIMIT_NOFILE` is: see `Enter::report_fd`).
pub(super) const REPORT_FD: i32 = 1000;

/// What a sandbox's first command says before its own output in its stderr, where
/// `terminal.local_isolation = none` was said on purpose.
pub const UNISOLATED_NOTE: &str = "taskbox: warning: terminal.local_isolation = none: this \
     sandbox's commands run unisolated, as the server's user in the host's namespaces (they \
     can read and write anything that user can, other tasks and \
     taskbox's data included); remove the setting to run them in namespaces of their own\n";

/// The isolation the local provider applies (see `terminal.local_isolation`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Settings {
    /// Namespaces (the default) or none.
    pub mode: LocalIsolation,
    /// The limits of each isolated sandbox.
    pub limits: Limits,
    /// Its network.
    pub network: Network,
    /// A second path inside where each sandbox's workspace also is (the fake Vercel's
    /// `/vercel/sandbox`, so that its commands see the paths its API names); `None` for
    /// taskbox's own sandboxes.
    pub workspace_alias: Option<std::path::PathBuf>,
}

impl Settings {
    /// The settings `terminal.*` configures (as the backend registry builds them).
    pub fn of(t: &crate::config::TerminalConfig) -> Settings {
        Settings {
            mode: t.local_isolation,
            limits: Limits {
                cpu: t.container_cpu,
                memory_mb: t.container_memory,
                pids: t.container_pids,
            },
            network: Network {
                mode: t.local_network,
                pasta: t.local_pasta.clone(),
                resolv_conf: t.local_resolv_conf.clone().into(),
            },
            workspace_alias: None,
        }
    }

    /// Whether commands run in namespaces of their sandbox's own.
    pub fn namespaces(&self) -> bool {
        self.mode == LocalIsolation::Namespaces
    }
}

/// An isolated sandbox's network (`terminal.local_network`, `terminal.local_pasta`; see
/// `network`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    /// Isolated, none or host.
    pub mode: LocalNetwork,
    /// The `pasta` program: a bare name looked up on `PATH`, or an absolute path.
    pub pasta: String,
    /// The resolver configuration an `isolated` sandbox gets (`terminal.local_resolv_conf`;
    /// see `dns`).
    pub resolv_conf: std::path::PathBuf,
}

impl Default for Network {
    fn default() -> Network {
        Network {
            mode: LocalNetwork::default(),
            pasta: "pasta".into(),
            resolv_conf: crate::config::DEFAULT_RESOLV_CONF.into(),
        }
    }
}

/// Starts a sandbox's init (see [`Init::start`]) with its network as `network` says. With
/// `isolated`, the note is what its first command must say when `pasta` could not be attached
/// (the sandbox then has its loopback only) or its DNS cannot be relayed; with `host`, that it
/// shares the host's network. The workspace is also at `alias` inside, where given.
pub(super) fn start(
    workspace: &Path,
    root: &Path,
    network: &Network,
    alias: Option<&Path>,
) -> Result<(Init, Option<String>), InitError> {
    let isolated = network.mode == LocalNetwork::Isolated;
    let dns = if isolated {
        dns::plan(&network.resolv_conf)
    } else {
        None
    };
    let mut init = Init::start(
        workspace,
        root,
        network.mode == LocalNetwork::Host,
        dns.as_ref(),
        alias,
    )?;
    let mut note = None;
    if network.mode == LocalNetwork::Host {
        note = Some(HOST_NETWORK_NOTE.to_string());
    }
    if isolated {
        let attached = find_pasta(&network.pasta)
            .and_then(|program| init.attach_pasta(&program, &root.join("pasta.pid")));
        match attached {
            Err(why) => {
                tracing::info!(init = init.pid(), reason = %why,
                    "the sandbox has no outbound network (terminal.local_network = isolated)");
                note = Some(degraded_note(&why));
            }
            Ok(()) => {
                // Only with an outbound network: without one, it has no DNS either.
                if let Some(resolver) = dns.as_ref().and_then(|d| d.relay_to) {
                    let upstream = std::net::SocketAddrV4::new(resolver, dns::PORT);
                    if let Err(why) = init.relay_dns(upstream) {
                        tracing::warn!(init = init.pid(), reason = %why,
                            "the sandbox's DNS cannot reach the host's resolver");
                        note = Some(dns_note(resolver, &why));
                    }
                }
            }
        }
    }
    Ok((init, note))
}

/// The note a sandbox's first command gets when its DNS cannot be relayed to the host's
/// loopback resolver `resolver`.
fn dns_note(resolver: std::net::Ipv4Addr, why: &str) -> String {
    format!(
        "taskbox: terminal.local_network = isolated: this sandbox has no DNS: the host's \
         resolver {resolver} is on its loopback and cannot be relayed ({why}); point \
         terminal.local_resolv_conf at a resolv.conf naming a resolver off the loopback\n"
    )
}

/// The whole environment of an isolated command: `PATH`, `HOME` (the workspace), `LANG`,
/// `TERM` (the server's, else `dumb`) and the `TASKBOX_*` variables in `taskbox`, with
/// `TASKBOX_WORKSPACE` its path inside. Nothing else of the server's environment.
pub(super) fn environment<'a>(
    taskbox: &'a [(&'a str, &'a std::ffi::OsStr)],
) -> Vec<(&'a str, std::ffi::OsString)> {
    let term = std::env::var_os("TERM").unwrap_or_else(|| "dumb".into());
    let mut env = vec![
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("HOME", WORKSPACE.into()),
        ("LANG", "C.UTF-8".into()),
        ("TERM", term),
    ];
    for (key, value) in taskbox {
        let value = if *key == "TASKBOX_WORKSPACE" {
            WORKSPACE.into()
        } else {
            value.to_os_string()
        };
        env.push((key, value));
    }
    env
}

/// Sends SIGKILL to the process `pidfd` refers to (nothing if it is gone already).
fn sigkill(pidfd: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal on a pidfd of ours, no siginfo, no flags.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        );
    }
}

/// Starts the process that clones `init`'s commands, with the sandbox's seccomp filter (see
/// `spawner`; without one, commands enter the sandbox by a helper of their own).
pub fn start_spawner(init: &mut Init) {
    init.start_spawner(seccomp::filter());
}

/// One layer of the isolation, as `taskbox doctor` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// `user namespace`, `mount namespace`, ...
    pub name: &'static str,
    /// Whether it holds here.
    pub ok: bool,
    /// Whether its absence lets something escape (a ✗) rather than leaving a limit unapplied
    /// (a warning).
    pub required: bool,
    /// What it gives, or why not.
    pub detail: String,
    /// How to fix it, where the layer says (else doctor's general hint).
    pub fix: Option<String>,
}

/// Whether this machine lets this user make the namespaces a sandbox needs, found by starting
/// one: `Err` names the cause and the fix (what `run` reports).
pub fn probe() -> Result<(), InitError> {
    let loopback = Network {
        mode: LocalNetwork::None,
        ..Network::default()
    };
    with_probe_sandbox(&loopback, false, |_, _| Ok(()))
}

/// Every layer of a sandbox with the network `network`, found by starting one and running a
/// command in it: what doctor lists with ✓ or ✗ (never one ✓ for the whole).
pub fn layers(network: &Network) -> Vec<Layer> {
    // Through a spawner, as a sandbox's commands start (`spawner`).
    let found = with_probe_sandbox(network, true, |init, note| {
        let script = "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status; id -u; \
                      test -w /usr && echo usr-writable; \
                      echo routes=$(grep -c '^[^I]' /proc/net/route); ls /proc | grep -c '^[0-9]'";
        let enter = Enter::new(init, std::path::Path::new(WORKSPACE), None)
            .map_err(|e| InitError::Prepare(e.to_string()))?;
        let out = probe_output(&enter, script)
            .map_err(|e| InitError::Prepare(format!("cannot run a probe command: {e}")))?;
        Ok((String::from_utf8_lossy(&out).into_owned(), note))
    });
    let layer = |name, ok, detail: String| Layer {
        name,
        ok,
        required: true,
        detail,
        fix: None,
    };
    let (out, note) = match found {
        Ok(found) => found,
        Err(e) => {
            return vec![layer("namespaces", false, e.to_string())];
        }
    };
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let has = |line: &str| out.lines().any(|l| l == line);
    let pids: u32 = out
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(u32::MAX);
    vec![
        layer(
            "user namespace",
            has(&UID.to_string()),
            format!("commands run as uid {UID} inside (not root), mapped to uid {uid} outside"),
        ),
        layer(
            "mount namespace",
            !has("usr-writable"),
            format!(
                "the workspace at {WORKSPACE} is the only shared writable tree; the system is \
                 read-only, /etc/shadow masked; no home, data dir or other task"
            ),
        ),
        layer(
            "PID namespace",
            pids <= 4,
            format!("a command sees only its sandbox's processes ({pids} seen by the probe)"),
        ),
        network_layer(network, note, has("routes=0")),
        layer(
            "seccomp",
            has("Seccomp:\t2"),
            format!("{} groups of system calls denied", DENIED.len()),
        ),
        layer(
            "no_new_privs",
            has("NoNewPrivs:\t1"),
            "setuid binaries grant nothing".into(),
        ),
        match limits::support() {
            Ok(where_) => layer(
                "cgroup limits",
                true,
                format!(
                    "terminal.container_cpu, container_memory and container_pids bound each \
                     sandbox ({where_})"
                ),
            ),
            Err(why) => layer(
                "cgroup limits",
                false,
                format!(
                    "terminal.container_cpu, container_memory and container_pids cannot be \
                     applied: {why}"
                ),
            ),
        },
    ]
}

/// What `bash -c script`, started through `enter` with the clean environment, printed on its
/// stdout (blocking until it ended; its stdin and stderr are `/dev/null`).
fn probe_output(enter: &Enter, script: &str) -> io::Result<Vec<u8>> {
    probe_output_of(
        enter,
        &[std::ffi::OsStr::new("-c"), std::ffi::OsStr::new(script)],
    )
}

/// What `bash` with `args` writes to its stdout in `enter`'s sandbox.
fn probe_output_of(enter: &Enter, args: &[&std::ffi::OsStr]) -> io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let null = std::fs::File::open("/dev/null")?;
    let (mut read, write) = std::io::pipe()?;
    let env = environment(&[]);
    let env: Vec<(&str, &std::ffi::OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let spec = super::spawn::Spec {
        program: "bash",
        args,
        cwd: Path::new(WORKSPACE),
        env: &env,
        stdin_piped: false,
    };
    let pid = enter.start(
        [null.as_raw_fd(), write.as_raw_fd(), null.as_raw_fd()],
        &spec,
    )?;
    drop(write);
    let mut out = Vec::new();
    let read_result = read.read_to_end(&mut out);
    super::spawn::wait_blocking(pid);
    read_result?;
    Ok(out)
}

/// The network layer, from the probe sandbox's `note` (why `isolated` fell back) and whether it
/// had no route at all.
fn network_layer(network: &Network, note: Option<String>, no_route: bool) -> Layer {
    let layer = |ok, required, detail: String, fix: Option<&str>| Layer {
        name: "network",
        ok,
        required,
        detail,
        fix: fix.map(str::to_string),
    };
    match network.mode {
        LocalNetwork::None => layer(
            true,
            true,
            "terminal.local_network = none: its own network namespace, loopback only; no route \
             to the host's services or the internet"
                .into(),
            None,
        ),
        LocalNetwork::Host => layer(
            false,
            true,
            "terminal.local_network = host: commands share the host's network, its loopback \
             services included (the taskbox server, databases)"
                .into(),
            Some("set terminal.local_network = isolated (outbound through pasta) or none"),
        ),
        LocalNetwork::Isolated => match (note, find_pasta(&network.pasta)) {
            (None, Ok(program)) if !no_route => layer(
                true,
                true,
                format!(
                    "terminal.local_network = isolated: its own network namespace, outbound \
                     through pasta ({}) as {ADDRESS} via {GATEWAY}; no route to the host's \
                     loopback services",
                    program.display()
                ),
                None,
            ),
            (note, found) => layer(
                false,
                false,
                format!(
                    "terminal.local_network = isolated falls back to loopback only: {}",
                    match (note, found) {
                        (_, Err(why)) => why,
                        (Some(note), _) => note.trim_end().to_string(),
                        (None, Ok(_)) => "the probe sandbox had no route".into(),
                    }
                ),
                Some(
                    "install pasta (Debian and Ubuntu: `apt-get install passt`) or point \
                     terminal.local_pasta at it, or set terminal.local_network = none",
                ),
            ),
        },
    }
}

/// Starts a sandbox with the network `network` over an empty workspace in a temporary
/// directory and runs `check` with it and its network note.
fn with_probe_sandbox<T>(
    network: &Network,
    spawner: bool,
    check: impl FnOnce(std::sync::Arc<Init>, Option<String>) -> Result<T, InitError>,
) -> Result<T, InitError> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "taskbox-isolation-probe-{}-{n}",
        std::process::id()
    ));
    let workspace = dir.join("workspace");
    let root = dir.join("run");
    let made = [&workspace, &root].iter().try_for_each(|d| {
        std::fs::create_dir_all(d)
            .map_err(|e| InitError::Prepare(format!("cannot make {}: {e}", d.display())))
    });
    let result = made.and_then(|()| {
        let (mut init, note) = start(&workspace, &root, network, None)?;
        if spawner {
            start_spawner(&mut init);
        }
        let init = std::sync::Arc::new(init);
        let result = check(init.clone(), note);
        if let Ok(init) = std::sync::Arc::try_unwrap(init) {
            init.kill();
        }
        result
    });
    let _ = std::fs::remove_dir_all(&dir);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn the_environment_is_the_fixed_few_and_the_workspace_inside() {
        let taskbox = [
            ("TASKBOX_TASK_ID", OsStr::new("t")),
            (
                "TASKBOX_WORKSPACE",
                OsStr::new("/data/local/tasks/t/workspace"),
            ),
        ];
        let env = environment(&taskbox);
        let keys: Vec<&str> = env.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            [
                "PATH",
                "HOME",
                "LANG",
                "TERM",
                "TASKBOX_TASK_ID",
                "TASKBOX_WORKSPACE"
            ]
        );
        let get = |k: &str| {
            env.iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get("TASKBOX_WORKSPACE"), Some(WORKSPACE.into()));
        assert_eq!(get("HOME"), Some(WORKSPACE.into()));
        assert_eq!(get("TASKBOX_TASK_ID"), Some("t".into()));
    }
}

/// Why a sandbox's namespaces could not be made.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// The kernel refused the namespaces themselves (unprivileged user namespaces forbidden).
    #[error("the kernel refused to create the sandbox's namespaces (clone3 with CLONE_NEWUSER: {source}); {hint}")]
    Refused {
        /// The clone's error.
        source: io::Error,
        /// The likely cause and fix.
        hint: &'static str,
    },
    /// A step of building the sandbox failed.
    #[error("cannot set up the sandbox's isolation: {step} failed: {source}")]
    Step {
        /// The step (e.g. "bind /usr read-only").
        step: String,
        /// Its errno.
        source: io::Error,
    },
    /// Something before the clone (a path with a NUL byte, a pipe).
    #[error("cannot prepare the sandbox's isolation: {0}")]
    Prepare(String),
}

impl InitError {
    /// How to fix it, when known (the same text as the error's own).
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            InitError::Refused { hint, .. } => Some(hint),
            _ => None,
        }
    }
}

pub(super) const REFUSED_HINT: &str =
    "unprivileged user namespaces are not allowed here: on Ubuntu set \
     `sysctl kernel.apparmor_restrict_unprivileged_userns=0`, elsewhere \
     `sysctl user.max_user_namespaces=15000` (or run in a container that allows them), or opt out \
     with `terminal.local_isolation = none`";
