//! The plan of a sandbox's init: every path, flag and text its child needs, prepared before
//! the clone (see `init`), so that the child neither allocates nor takes a lock.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::dns::{self, Dns};
use super::{InitError, HOSTNAME, UID, WORKSPACE};

/// One step of the child's setup.
pub(super) enum Step {
    /// Write `text` to the file `path` (the uid and gid maps, `setgroups`).
    Write { path: CString, text: CString },
    /// `mount(source, target, fstype, flags, data)`.
    Mount {
        source: Option<CString>,
        target: CString,
        fstype: Option<CString>,
        flags: libc::c_ulong,
        data: Option<CString>,
    },
    /// `mkdir(path, 0755)` (an existing directory is fine).
    Mkdir(CString),
    /// Create an empty file to mount over.
    Touch(CString),
    /// `symlink(target, link)`.
    Symlink { target: CString, link: CString },
    /// `chdir(new root)`, `pivot_root(".", ".")`, detach the old root, `chdir("/")`.
    PivotRoot(CString),
    /// `sethostname`.
    Hostname(CString),
    /// Bring the loopback interface up.
    LoopbackUp,
    /// Bind a UDP socket to `addr` in the sandbox's network namespace and send it to the
    /// server over the Unix socket `channel` (the DNS relay's, see `dns`). Its failure leaves
    /// the sandbox without DNS, not without a start.
    DnsSocket {
        addr: libc::sockaddr_in,
        channel: std::os::fd::RawFd,
    },
}

/// What the child does, and a description of each step for errors.
pub(super) struct Plan {
    pub(super) steps: Vec<(Step, String)>,
    /// The server's end of the socket pair a [`Step::DnsSocket`] sends over, and the child's.
    pub(super) dns_channel: Option<(OwnedFd, OwnedFd)>,
}

/// Whether the host path `path` is inside a system directory bound into every sandbox (so the
/// sandbox sees it where the host does).
fn is_bound(path: &Path) -> bool {
    SYSTEM_DIRS.iter().any(|dir| {
        path.starts_with(dir) && std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir())
    })
}

/// Directories of the sandbox's root that a bound `resolv.conf` may not be under: they are
/// mounted over (or are the workspace).
const NOT_FOR_RESOLV_CONF: &[&str] = &["/dev", "/tmp", "/proc", WORKSPACE];

/// A Unix datagram socket pair, both ends close-on-exec: (server's, child's).
fn socket_pair() -> Result<(OwnedFd, OwnedFd), InitError> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two descriptors for socketpair to fill.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(InitError::Prepare(format!(
            "socketpair: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: socketpair succeeded: both are open descriptors nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn cstr(bytes: &[u8]) -> Result<CString, InitError> {
    CString::new(bytes).map_err(|_| InitError::Prepare("a path contains a NUL byte".into()))
}

fn cpath(path: &Path) -> Result<CString, InitError> {
    cstr(path.as_os_str().as_bytes())
}

/// The system directories bound read-only (those that exist; a symlink such as merged-usr's
/// `/bin -> usr/bin` is recreated as the same symlink).
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

/// Files of `/etc` masked (bound over with an empty file): secrets no build needs.
const MASKED: &[&str] = &[
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/shadow-",
    "/etc/gshadow-",
    "/etc/security/opasswd",
];

/// Directories of `/proc` made read-only: the kernel's settings (`sys`: `core_pattern` would run
/// a program as the host's root), interrupts, buses and file systems.
const PROC_READ_ONLY: &[&str] = &["sys", "irq", "bus", "fs"];

/// Files of `/proc` masked (bound over with `/dev/null`).
const PROC_MASKED: &[&str] = &["sysrq-trigger", "kcore", "timer_list", "keys"];

/// Directories of `/etc` masked (an empty read-only tmpfs over each): private keys.
const MASKED_DIRS: &[&str] = &[
    "/etc/ssl/private",
    "/etc/credstore",
    "/etc/credstore.encrypted",
];

/// Device nodes bound from the host's `/dev`.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// The `statvfs` flags a read-only remount must keep (a bind of a mount locked by a less
/// privileged user namespace cannot drop them) — the same bits as the `MS_*` mount flags.
fn kept_flags(path: &Path) -> libc::c_ulong {
    let Ok(c) = cpath(path) else { return 0 };
    // SAFETY: an all-zero `statvfs` is a valid value (plain integers).
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path; `st` is ours for statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return 0;
    }
    let keep = libc::ST_NOSUID
        | libc::ST_NODEV
        | libc::ST_NOEXEC
        | libc::ST_NOATIME
        | libc::ST_NODIRATIME
        | libc::ST_RELATIME;
    st.f_flag & keep
}

/// The mount points of this process's mount namespace strictly below `dir` (a recursive bind
/// copies them; each is made read-only too).
fn submounts(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(unescape_mountinfo)
        .filter(|p| p.starts_with(dir) && p != dir)
        .collect()
}

/// `/proc/self/mountinfo` escapes spaces, tabs, newlines and backslashes as `\ooo`.
fn unescape_mountinfo(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            if let Some(n) = field
                .get(i + 1..i + 4)
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(n);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

impl Plan {
    /// The setup of a sandbox whose workspace is `workspace`, built in the empty directory
    /// `root` (which becomes its `/`); with its own network namespace's loopback brought up if
    /// `loopback`, and its DNS as `dns` says (see `dns`); the workspace also at `alias` where
    /// given (the fake Vercel's `/vercel/sandbox`).
    pub(super) fn new(
        workspace: &Path,
        root: &Path,
        loopback: bool,
        dns: Option<&Dns>,
        alias: Option<&Path>,
    ) -> Result<Plan, InitError> {
        let mut steps = Vec::new();
        let mut push = |step: Step, what: String| steps.push((step, what));
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        push(
            Step::Write {
                path: cstr(b"/proc/self/uid_map")?,
                text: cstr(format!("{UID} {uid} 1\n").as_bytes())?,
            },
            format!("map uid {UID} to {uid}"),
        );
        push(
            Step::Write {
                path: cstr(b"/proc/self/setgroups")?,
                text: cstr(b"deny")?,
            },
            "deny setgroups".into(),
        );
        push(
            Step::Write {
                path: cstr(b"/proc/self/gid_map")?,
                text: cstr(format!("{UID} {gid} 1\n").as_bytes())?,
            },
            format!("map gid {UID} to {gid}"),
        );
        let mount = |source: Option<&[u8]>,
                     target: &Path,
                     fstype: Option<&[u8]>,
                     flags: libc::c_ulong,
                     data: Option<&[u8]>|
         -> Result<Step, InitError> {
            Ok(Step::Mount {
                source: source.map(cstr).transpose()?,
                target: cpath(target)?,
                fstype: fstype.map(cstr).transpose()?,
                flags,
                data: data.map(cstr).transpose()?,
            })
        };
        push(
            mount(
                None,
                Path::new("/"),
                None,
                libc::MS_REC | libc::MS_PRIVATE,
                None,
            )?,
            "make the mounts private".into(),
        );
        let tmpfs_flags = libc::MS_NOSUID | libc::MS_NODEV;
        push(
            mount(
                Some(b"tmpfs"),
                root,
                Some(b"tmpfs"),
                tmpfs_flags,
                Some(b"mode=0755,size=1m"),
            )?,
            format!("mount the root tmpfs on {}", root.display()),
        );
        let inside = |p: &str| root.join(p.trim_start_matches('/'));

        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for dir in SYSTEM_DIRS {
            let host = Path::new(dir);
            let Ok(meta) = std::fs::symlink_metadata(host) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(host)
                    .map_err(|e| InitError::Prepare(format!("cannot read the link {dir}: {e}")))?;
                push(
                    Step::Symlink {
                        target: cpath(&target)?,
                        link: cpath(&inside(dir))?,
                    },
                    format!("link {dir}"),
                );
                continue;
            }
            if !meta.is_dir() {
                continue;
            }
            push(Step::Mkdir(cpath(&inside(dir))?), format!("make {dir}"));
            push(
                mount(
                    Some(host.as_os_str().as_bytes()),
                    &inside(dir),
                    None,
                    libc::MS_BIND | libc::MS_REC,
                    None,
                )?,
                format!("bind {dir}"),
            );
            let mut points = vec![host.to_path_buf()];
            points.extend(submounts(&mountinfo, host));
            for point in points {
                let flags = libc::MS_REMOUNT
                    | libc::MS_BIND
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | kept_flags(&point);
                push(
                    mount(None, &inside(&point.to_string_lossy()), None, flags, None)?,
                    format!("make {} read-only", point.display()),
                );
            }
        }
        // The host's private keys: SSH host keys (owner-readable by root, whom the sandbox's
        // uid is when the server runs as root) and the TLS and credential stores.
        let mut masked: Vec<PathBuf> = MASKED.iter().map(PathBuf::from).collect();
        if let Ok(entries) = std::fs::read_dir("/etc/ssh") {
            masked.extend(entries.flatten().map(|e| e.path()).filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("ssh_host_") && n.ends_with("_key"))
            }));
        }
        for dir in MASKED_DIRS {
            if std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
                push(
                    mount(
                        Some(b"tmpfs"),
                        &inside(dir),
                        Some(b"tmpfs"),
                        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        Some(b"mode=0755,size=4k"),
                    )?,
                    format!("mask {dir}"),
                );
            }
        }
        for file in &masked {
            let file = file.to_string_lossy();
            let file: &str = &file;
            if std::fs::symlink_metadata(file).is_ok_and(|m| m.is_file()) {
                push(
                    mount(Some(b"/dev/null"), &inside(file), None, libc::MS_BIND, None)?,
                    format!("mask {file}"),
                );
            }
        }

        // /dev: a tmpfs with a few nodes bound from the host's, and /dev/shm.
        let dev = inside("/dev");
        push(Step::Mkdir(cpath(&dev)?), "make /dev".into());
        push(
            mount(
                Some(b"tmpfs"),
                &dev,
                Some(b"tmpfs"),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                Some(b"mode=0755,size=64k"),
            )?,
            "mount /dev".into(),
        );
        for node in DEVICES {
            let host = Path::new("/dev").join(node);
            if !host.exists() {
                continue;
            }
            let target = dev.join(node);
            push(Step::Touch(cpath(&target)?), format!("make /dev/{node}"));
            push(
                mount(
                    Some(host.as_os_str().as_bytes()),
                    &target,
                    None,
                    libc::MS_BIND,
                    None,
                )?,
                format!("bind /dev/{node}"),
            );
        }
        for (link, target) in [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ] {
            push(
                Step::Symlink {
                    target: cstr(target.as_bytes())?,
                    link: cpath(&dev.join(link))?,
                },
                format!("link /dev/{link}"),
            );
        }
        for (dir, options) in [
            ("/dev/shm", &b"mode=1777,size=256m"[..]),
            ("/tmp", &b"mode=1777,size=1g"[..]),
        ] {
            let target = inside(dir);
            push(Step::Mkdir(cpath(&target)?), format!("make {dir}"));
            push(
                mount(
                    Some(b"tmpfs"),
                    &target,
                    Some(b"tmpfs"),
                    tmpfs_flags,
                    Some(options),
                )?,
                format!("mount {dir}"),
            );
        }

        // A fresh /proc of the sandbox's PID namespace (the init is its PID 1).
        let proc = inside("/proc");
        push(Step::Mkdir(cpath(&proc)?), "make /proc".into());
        push(
            mount(
                Some(b"proc"),
                &proc,
                Some(b"proc"),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                None,
            )?,
            "mount /proc".into(),
        );
        // The kernel's knobs under /proc are checked against the *global* root's uid, which
        // the sandbox's uid is when the server runs as root: read-only (or masked), as
        // container runtimes do.
        for dir in PROC_READ_ONLY {
            let target = proc.join(dir);
            if !Path::new("/proc").join(dir).exists() {
                continue;
            }
            push(
                mount(
                    Some(target.as_os_str().as_bytes()),
                    &target,
                    None,
                    libc::MS_BIND | libc::MS_REC,
                    None,
                )?,
                format!("bind /proc/{dir}"),
            );
            push(
                mount(
                    None,
                    &target,
                    None,
                    libc::MS_REMOUNT
                        | libc::MS_BIND
                        | libc::MS_RDONLY
                        | libc::MS_NOSUID
                        | libc::MS_NODEV
                        | libc::MS_NOEXEC,
                    None,
                )?,
                format!("make /proc/{dir} read-only"),
            );
        }
        for file in PROC_MASKED {
            if !Path::new("/proc").join(file).exists() {
                continue;
            }
            push(
                mount(
                    Some(b"/dev/null"),
                    &proc.join(file),
                    None,
                    libc::MS_BIND,
                    None,
                )?,
                format!("mask /proc/{file}"),
            );
        }

        // The resolver configuration, where the sandbox's differs from what the host's /etc
        // shows (a source of its own, or a symlink into a directory the sandbox does not see).
        if let Some((source, target)) = dns.and_then(|d| d.bind.as_ref()) {
            let clear = NOT_FOR_RESOLV_CONF
                .iter()
                .all(|dir| !target.starts_with(dir));
            // A file over itself where the sandbox sees it anyway is no bind.
            let seen = source == target && is_bound(target);
            if clear && target.is_absolute() && !seen {
                if !is_bound(target) {
                    let mut dirs: Vec<&Path> = target.ancestors().skip(1).collect();
                    dirs.reverse();
                    for dir in dirs.into_iter().filter(|d| d.parent().is_some()) {
                        push(
                            Step::Mkdir(cpath(&inside(&dir.to_string_lossy()))?),
                            format!("make {}", dir.display()),
                        );
                    }
                    push(
                        Step::Touch(cpath(&inside(&target.to_string_lossy()))?),
                        format!("make {}", target.display()),
                    );
                }
                let at = inside(&target.to_string_lossy());
                push(
                    mount(
                        Some(source.as_os_str().as_bytes()),
                        &at,
                        None,
                        libc::MS_BIND,
                        None,
                    )?,
                    format!("bind {} at {}", source.display(), target.display()),
                );
                push(
                    mount(
                        None,
                        &at,
                        None,
                        libc::MS_REMOUNT
                            | libc::MS_BIND
                            | libc::MS_RDONLY
                            | libc::MS_NOSUID
                            | libc::MS_NODEV
                            | libc::MS_NOEXEC
                            | kept_flags(source),
                        None,
                    )?,
                    format!("make {} read-only", target.display()),
                );
            }
        }

        // The workspace: the one tree shared with the host, writable.
        let ws = inside(WORKSPACE);
        push(Step::Mkdir(cpath(&ws)?), format!("make {WORKSPACE}"));
        push(
            mount(
                Some(workspace.as_os_str().as_bytes()),
                &ws,
                None,
                libc::MS_BIND | libc::MS_REC,
                None,
            )?,
            format!("bind the workspace at {WORKSPACE}"),
        );
        push(
            mount(
                None,
                &ws,
                None,
                libc::MS_REMOUNT
                    | libc::MS_BIND
                    | libc::MS_NOSUID
                    | libc::MS_NODEV
                    | kept_flags(workspace),
                None,
            )?,
            format!("make {WORKSPACE} nosuid"),
        );

        // The same tree at a second path (the sandbox's root is a tmpfs of its own: the path's
        // directories are made there).
        if let Some(alias) = alias {
            let clear = NOT_FOR_RESOLV_CONF
                .iter()
                .all(|dir| !alias.starts_with(dir));
            if !alias.is_absolute() || is_bound(alias) || !clear || alias == Path::new("/") {
                return Err(InitError::Prepare(format!(
                    "the workspace cannot also be at {} (an absolute path outside the system \
                     directories, /dev, /proc, /tmp and {WORKSPACE})",
                    alias.display()
                )));
            }
            let mut dirs: Vec<&Path> = alias.ancestors().filter(|d| d.parent().is_some()).collect();
            dirs.reverse();
            for dir in dirs {
                push(
                    Step::Mkdir(cpath(&inside(&dir.to_string_lossy()))?),
                    format!("make {}", dir.display()),
                );
            }
            let at = inside(&alias.to_string_lossy());
            push(
                mount(
                    Some(workspace.as_os_str().as_bytes()),
                    &at,
                    None,
                    libc::MS_BIND | libc::MS_REC,
                    None,
                )?,
                format!("bind the workspace at {}", alias.display()),
            );
            push(
                mount(
                    None,
                    &at,
                    None,
                    libc::MS_REMOUNT
                        | libc::MS_BIND
                        | libc::MS_NOSUID
                        | libc::MS_NODEV
                        | kept_flags(workspace),
                    None,
                )?,
                format!("make {} nosuid", alias.display()),
            );
        }

        push(
            Step::PivotRoot(cpath(root)?),
            "pivot_root into the sandbox".into(),
        );
        push(
            mount(
                None,
                Path::new("/"),
                None,
                libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | tmpfs_flags,
                None,
            )?,
            "make / read-only".into(),
        );
        push(
            Step::Hostname(cstr(HOSTNAME.as_bytes())?),
            "set the hostname".into(),
        );
        let mut dns_channel = None;
        if loopback {
            push(Step::LoopbackUp, "bring the loopback interface up".into());
            if let Some(resolver) = dns.and_then(|d| d.relay_to) {
                let (server, child) = socket_pair()?;
                push(
                    Step::DnsSocket {
                        addr: dns::sockaddr(resolver, dns::PORT),
                        channel: child.as_raw_fd(),
                    },
                    format!("bind the DNS relay's socket at {resolver}:{}", dns::PORT),
                );
                dns_channel = Some((server, child));
            }
        }
        Ok(Plan { steps, dns_channel })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped_and_submounts_found() {
        assert_eq!(
            unescape_mountinfo("/mnt/a\\040b\\134c"),
            PathBuf::from("/mnt/a b\\c")
        );
        let info = "22 1 0:21 / / rw - ext4 /dev/x rw\n\
                    23 22 0:22 / /etc rw - ext4 /dev/x rw\n\
                    24 22 0:23 /h /etc/hosts rw - ext4 /dev/x rw\n\
                    25 22 0:24 / /etcetera rw - ext4 /dev/x rw\n";
        assert_eq!(
            submounts(info, Path::new("/etc")),
            vec![PathBuf::from("/etc/hosts")]
        );
    }
}
