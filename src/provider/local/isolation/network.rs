//! A sandbox's network (`terminal.local_network`): its own namespace with outbound access
//! through `pasta` (`isolated`), its own namespace with its loopback only (`none`), or the
//! host's (`host`).
//!
//! **`isolated`.** Once the sandbox's init is ready, the server starts `pasta` (Debian's
//! `passt`, the user-mode network stack of rootless Podman) attached to the init's network
//! namespace from outside: it joins the sandbox's user and network namespaces through the
//! descriptors the init's start opened, which it inherits as descriptors 3 and 4 and names
//! `/proc/self/fd/3` and `/4` (the init is undumpable, and the server's own descriptors are out
//! of reach of a `pasta` that dropped its capabilities), makes a tap interface there, gives it [`ADDRESS`] with [`GATEWAY`] as the default route, and
//! carries every connection out through sockets of its own in the host's network namespace. So
//! a command reaches what the host's non-loopback addresses reach (the internet, the LAN, the
//! host's own services bound to its non-loopback addresses), and nothing bound to the host's
//! loopback: `--no-map-gw` stops `pasta` from mapping the gateway to the host's `127.0.0.1`,
//! `-T none -U none` forward no port of the sandbox's loopback to the host's, and the sandbox's
//! `127.0.0.1` is its own. `-t none -u none`: nothing of the sandbox is exposed on the host.
//! DNS goes to the nameservers of the host's `/etc/resolv.conf` (the sandbox sees the host's
//! `/etc`), reached through `pasta` like any address — except a resolver on the host's loopback
//! (such as systemd-resolved's `127.0.0.53`, whose `/etc/resolv.conf` is moreover a symlink into
//! `/run`, which the sandbox does not see): there a command has no DNS (`--dns-forward` with a
//! resolv.conf of the sandbox's own is not built).
//!
//! **Its life.** `pasta` runs in the foreground as a child of one thread of the server that
//! lives as long as the server (`keeper`), with `PR_SET_PDEATHSIG = SIGKILL`: it dies with the
//! server however the server ends. The sandbox's stop kills it just after the init (`Init::end`)
//! and reaps it on a thread of its own (its exit, 12-50 ms here, is not the stop's to wait for).
//! It starts once per sandbox, not per command.
//!
//! **Where `pasta` is missing** (or fails to start), the sandbox keeps its own network namespace
//! with its loopback only — less access, never more — and its first command's stderr says so
//! ([`degraded_note`]).

use std::ffi::OsString;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The sandbox's address on its `pasta` interface (the host's own addresses stay reachable
/// through the gateway, which is why the sandbox does not copy one of them, as `pasta` would by
/// default).
pub const ADDRESS: &str = "10.0.2.100";

/// The sandbox's default gateway: `pasta` itself. Not mapped to the host (`--no-map-gw`).
pub const GATEWAY: &str = "10.0.2.2";

/// How long `pasta` may take to configure the sandbox's interface before it counts as failed.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// Where `program` (`terminal.local_pasta`: a bare name looked up on `PATH`, or an absolute
/// path) is, or why not.
pub fn find_pasta(program: &str) -> Result<PathBuf, String> {
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = PathBuf::from(program);
        return if executable(&path) {
            Ok(path)
        } else {
            Err(format!("{program} is not an executable file"))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
        .ok_or_else(|| format!("`{program}` is not on PATH"))
}

/// The note a sandbox's first command gets when `isolated` fell back to loopback only.
pub fn degraded_note(why: &str) -> String {
    format!(
        "taskbox: terminal.local_network = isolated, but {why}: this sandbox has no network but \
         its own loopback (as with `none`); install pasta (Debian and Ubuntu: `apt-get install \
         passt`) or point terminal.local_pasta at it, or set terminal.local_network = none to \
         say so on purpose\n"
    )
}

/// What a sandbox's first command says before its own output in its stderr, where
/// `terminal.local_network = host` was said on purpose (as [`super::UNISOLATED_NOTE`] does for
/// `local_isolation = none`): every other layer holds, but not this one.
pub const HOST_NETWORK_NOTE: &str = "taskbox: warning: terminal.local_network = host: this \
     sandbox shares the host's network, its loopback services included (the taskbox server, \
     databases): its commands reach whatever the server's user reaches; set \
     terminal.local_network = isolated (outbound through pasta) or none to take it away\n";

/// A running `pasta`, attached to one sandbox's network namespace.
pub struct Pasta {
    child: Child,
}

impl std::fmt::Debug for Pasta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pasta")
            .field("pid", &self.child.id())
            .finish()
    }
}

impl Pasta {
    /// Starts `program` attached to the network namespace `net` inside the user namespace
    /// `user` (descriptors of this process), writing its pid to `pidfile` once the sandbox's
    /// interface is configured. Blocks until then; `Err` says why it did not get there.
    pub fn start(program: &Path, user: RawFd, net: RawFd, pidfile: &Path) -> Result<Pasta, String> {
        let _ = std::fs::remove_file(pidfile);
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let mut args: Vec<OsString> = [
            "--foreground",
            "--quiet",
            "--config-net",
            "--address",
            ADDRESS,
            "--netmask",
            "24",
            "--gateway",
            GATEWAY,
            "--no-map-gw",
            "--tcp-ports",
            "none",
            "--udp-ports",
            "none",
            "--tcp-ns",
            "none",
            "--udp-ns",
            "none",
            "--no-netns-quit",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        // As root it would drop to `nobody`, who may not enter the sandbox's user namespace
        // (owned by the server's user); it runs as the server's user, whoever that is.
        args.push("--runas".into());
        args.push(format!("{uid}:{gid}").into());
        args.push("--userns".into());
        args.push(format!("/proc/self/fd/{USER_FD}").into());
        args.push("--netns".into());
        args.push(format!("/proc/self/fd/{NET_FD}").into());
        args.push("--pid".into());
        args.push(pidfile.as_os_str().to_owned());
        let mut child = keeper_spawn(program.to_owned(), args, [user, net])
            .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
        let started = Instant::now();
        loop {
            if std::fs::read_to_string(pidfile).is_ok_and(|p| !p.trim().is_empty()) {
                let _ = std::fs::remove_file(pidfile);
                return Ok(Pasta { child });
            }
            if let Ok(Some(status)) = child.try_wait() {
                let mut said = String::new();
                if let Some(mut err) = child.stderr.take() {
                    let _ = io::Read::read_to_string(&mut err, &mut said);
                }
                let said: Vec<&str> = said
                    .lines()
                    .filter(|l| !l.starts_with("Failed to send") && !l.trim().is_empty())
                    .collect();
                return Err(format!(
                    "{} exited with {status} before the sandbox's network was up ({})",
                    program.display(),
                    said.join("; ")
                ));
            }
            if started.elapsed() > READY_WITHIN {
                Pasta { child }.end();
                return Err(format!(
                    "{} did not configure the sandbox's network within {} s",
                    program.display(),
                    READY_WITHIN.as_secs()
                ));
            }
            // A few milliseconds at a sandbox's start, once per sandbox.
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Kills it, and reaps it on a thread of its own: its exit takes 12-50 ms here (its
    /// buffers unmapped, its sockets closed), which a sandbox's stop, and so its snapshot,
    /// need not wait for: nothing of the sandbox runs in it, and its network namespace has
    /// no process left.
    pub fn end(mut self) {
        let _ = self.child.kill();
        let reaped = std::thread::Builder::new()
            .name("taskbox-pasta-reap".into())
            .spawn(move || {
                let _ = self.child.wait();
            });
        if let Err(e) = reaped {
            tracing::debug!(error = %e, "no thread to reap pasta on; it stays a zombie until the server ends");
        }
    }
}

/// The descriptors `pasta` inherits the sandbox's user and network namespaces as.
const USER_FD: RawFd = 3;
const NET_FD: RawFd = 4;

/// A request to the keeper thread: a program, its arguments, the descriptors it inherits as
/// [`USER_FD`] and [`NET_FD`], where to answer.
type Request = (
    PathBuf,
    Vec<OsString>,
    [RawFd; 2],
    mpsc::Sender<io::Result<Child>>,
);

/// Spawns `program` from the keeper: one thread that lives as long as this process, so the
/// child's parent-death signal (sent when the thread that spawned it ends) fires only when the
/// server itself ends. The caller keeps `fds` open until this returns.
fn keeper_spawn(program: PathBuf, args: Vec<OsString>, fds: [RawFd; 2]) -> io::Result<Child> {
    static KEEPER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        let spawned = std::thread::Builder::new()
            .name("taskbox-pasta".into())
            .spawn(move || {
                for (program, args, [user, net], answer) in rx {
                    let mut command = Command::new(program);
                    command
                        .args(args)
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::piped());
                    // SAFETY: prctl, fcntl, dup2 and close are async-signal-safe; nothing is
                    // allocated. The descriptors are open in the forked child (the requester
                    // holds them until the spawn returns).
                    unsafe {
                        command.pre_exec(move || {
                            let fail = || Err(io::Error::last_os_error());
                            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                                return fail();
                            }
                            // Above 4 first, so that neither lands on the other's target.
                            let high = [user, net].map(|fd| libc::fcntl(fd, libc::F_DUPFD, 64));
                            for (fd, target) in high.into_iter().zip([USER_FD, NET_FD]) {
                                // dup2 leaves the new descriptor inheritable.
                                if fd < 0 || libc::dup2(fd, target) != target {
                                    return fail();
                                }
                                libc::close(fd);
                            }
                            Ok(())
                        });
                    }
                    let _ = answer.send(command.spawn());
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the thread that runs pasta");
        }
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::channel();
    keeper
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((program, args, fds, tx))
        .map_err(|_| io::Error::other("the thread that runs pasta is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("the thread that runs pasta is gone"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_pasta_is_named_and_the_note_says_what_the_sandbox_has() {
        let e = find_pasta("/nonexistent/pasta").expect_err("not there");
        assert!(e.contains("/nonexistent/pasta"), "{e}");
        let e = find_pasta("taskbox-no-such-pasta").expect_err("not on PATH");
        assert!(e.contains("not on PATH"), "{e}");
        let note = degraded_note(&e);
        assert!(note.contains("loopback"), "{note}");
        assert!(note.contains("apt-get install passt"), "{note}");
        assert!(note.contains("terminal.local_network = none"), "{note}");
    }
}
