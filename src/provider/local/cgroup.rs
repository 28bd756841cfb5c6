//! Process isolation of a local sandbox with a cgroup v2 (Linux): every command of a sandbox
//! joins the sandbox's own cgroup before `bash` starts, and stopping the sandbox kills the whole
//! cgroup. A process cannot leave its cgroup by `setsid`, `env -i`, a cleared
//! `TASKBOX_WORKSPACE` or double-forking (only by writing to another cgroup's `cgroup.procs`,
//! which needs rights over it), so nothing a command started survives its sandbox.
//!
//! The cgroup is made under the cgroup this process runs in (`/proc/self/cgroup`, on the cgroup2
//! mount from `/proc/self/mountinfo`), named `taskbox-<sandbox name>-<hash of the sandbox's
//! directory>` (two data dirs may hold sandboxes of one name), and its path is recorded in the
//! sandbox's directory (`cgroup`) so that another taskbox process stopping the sandbox finds it.
//! A command that ends leaving nothing behind removes the empty cgroup (the next command makes
//! it again), so only a sandbox with live processes holds one. Where no writable cgroup v2 hierarchy is available (not Linux, cgroup v1 only, no
//! delegation to this user), [`support`] says why, `taskbox doctor` reports it, and only the
//! environment sweep of `kill::kill_leftovers` (which those escapes evade) remains.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// The file in a sandbox's directory that records its cgroup.
pub(super) const RECORD: &str = "cgroup";

/// Where sandbox cgroups are made, or why they cannot be: probed once per process.
pub fn support() -> Result<&'static Path, &'static str> {
    static SUPPORT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match SUPPORT.get_or_init(probe) {
        Ok(p) => Ok(p.as_path()),
        Err(e) => Err(e.as_str()),
    }
}

#[cfg(target_os = "linux")]
fn probe() -> Result<PathBuf, String> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    // Fields: id parent major:minor root mount-point options... - fstype source super-options.
    let mount = mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            let point = left.split_whitespace().nth(4)?;
            (fstype == "cgroup2").then(|| PathBuf::from(point))
        })
        // The unified hierarchy proper before a hybrid system's secondary mount.
        .min_by_key(|p| p != Path::new("/sys/fs/cgroup"))
        .ok_or("no cgroup v2 hierarchy is mounted (cgroup v1 only)")?;
    let own = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("this process is in no cgroup v2 (no `0::` line in /proc/self/cgroup)")?;
    let base = mount.join(own.trim().trim_start_matches('/'));
    let probe = base.join(format!("taskbox-probe-{}", std::process::id()));
    match fs::create_dir(&probe) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(format!(
                "cannot make a cgroup under {} ({e}): run as root or with a delegated cgroup \
                 (systemd `Delegate=yes`)",
                base.display()
            ))
        }
    }
    let _ = fs::remove_dir(&probe);
    Ok(base)
}

#[cfg(not(target_os = "linux"))]
fn probe() -> Result<PathBuf, String> {
    Err("cgroups exist only on Linux".to_string())
}

/// The cgroup's name for the sandbox `sandbox` in `sandbox_dir`.
fn cgroup_name(sandbox_dir: &Path, sandbox: &str) -> String {
    // FNV-1a of the directory: stable across processes and runs (unlike std's hasher).
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in sandbox_dir.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01B3);
    }
    format!("taskbox-{sandbox}-{:08x}", h as u32)
}

/// A sandbox's cgroup as a command joins it: the directory and its `cgroup.procs`, as C strings
/// made before the fork (the child may not allocate).
pub(super) struct Join {
    dir: std::ffi::CString,
    procs: std::ffi::CString,
}

/// Finds the cgroup of the sandbox `sandbox` whose directory is `sandbox_dir` and records it
/// there, for each command to join. `None` when cgroups are not available here (or the record
/// cannot be written: the reason is logged).
pub(super) fn prepare(sandbox_dir: &Path, sandbox: &str) -> Option<Join> {
    use std::os::unix::ffi::OsStrExt;
    let base = support().ok()?;
    let dir = recorded(sandbox_dir, sandbox)
        .unwrap_or_else(|| base.join(cgroup_name(sandbox_dir, sandbox)));
    if let Err(e) = fs::write(sandbox_dir.join(RECORD), dir.as_os_str().as_encoded_bytes()) {
        tracing::warn!(sandbox, cgroup = %dir.display(), error = %e,
            "cannot record the sandbox's cgroup; processes that leave its process group \
             may outlive it");
        return None;
    }
    Some(Join {
        dir: std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?,
        procs: std::ffi::CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).ok()?,
    })
}

/// The cgroup recorded in the directory of the sandbox `sandbox`, if any. The record sits
/// beside the workspace, where a command could rewrite it: only the cgroup named for this very
/// sandbox is taken, so a forged record cannot make a stop kill anything else.
pub(super) fn recorded(sandbox_dir: &Path, sandbox: &str) -> Option<PathBuf> {
    let text = fs::read_to_string(sandbox_dir.join(RECORD)).ok()?;
    let path = PathBuf::from(text.trim());
    let expected = cgroup_name(sandbox_dir, sandbox);
    let ours = path.is_absolute()
        && path.file_name().and_then(|n| n.to_str()) == Some(expected.as_str())
        && !path
            .components()
            .any(|c| c == std::path::Component::ParentDir);
    ours.then_some(path)
}

/// Removes the sandbox's cgroup if no process is left in it (after a command ended). A cgroup
/// with processes is not removed (the kernel refuses), and the next command makes it again.
pub(super) fn remove_if_empty(sandbox_dir: &Path, sandbox: &str) {
    if let Some(dir) = recorded(sandbox_dir, sandbox) {
        let _ = fs::remove_dir(dir);
    }
}

/// Removes every empty sandbox cgroup (`taskbox-*`) where this process makes them; cgroups with
/// processes stay (the kernel refuses to remove them).
pub(super) fn remove_empty() {
    let Ok(base) = support() else {
        return;
    };
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_str().is_some_and(|n| n.starts_with("taskbox-")) {
            let _ = fs::remove_dir(entry.path());
        }
    }
}

/// Moves the calling process into the sandbox's cgroup, making it if it is not there (a
/// command that ended may just have removed it). Runs in a forked child before `exec`, so it
/// only makes system calls (`mkdir`, `open`, `write`, `close`) and allocates nothing.
pub(super) fn join(cg: &Join) -> io::Result<()> {
    let mut last = io::Error::from_raw_os_error(libc::ENOENT);
    for _ in 0..3 {
        // SAFETY: `cg.dir` is a valid NUL-terminated string borrowed for the whole call;
        // mkdir(2) reads it and touches no other memory of ours.
        unsafe {
            libc::mkdir(cg.dir.as_ptr(), 0o755);
        }
        // SAFETY: as above, for `cg.procs` and open(2).
        let fd = unsafe { libc::open(cg.procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            // Removed between the mkdir and the open by a command that just ended: again.
            last = io::Error::last_os_error();
            continue;
        }
        // "0" means the writing process itself.
        // SAFETY: `fd` was just opened by us; the buffer is a 1-byte static string, read only.
        let written = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        let err = io::Error::last_os_error();
        // SAFETY: `fd` is ours and closed exactly once.
        unsafe {
            libc::close(fd);
        }
        if written == 1 {
            return Ok(());
        }
        last = err;
    }
    Err(last)
}

/// Kills every process in the cgroup `dir` and removes it. Returns how many processes it held.
/// Blocking (waits up to a few seconds for the killed processes to leave).
pub(super) fn kill_all(dir: &Path) -> usize {
    let procs = dir.join("cgroup.procs");
    let count = read_pids(&procs).len();
    // `cgroup.kill` (Linux 5.14+) kills the whole cgroup at once, forks in flight included.
    if fs::write(dir.join("cgroup.kill"), b"1").is_err() {
        // Older kernels: kill what is listed until nothing is (a process forking meanwhile is
        // listed on the next pass).
        for _ in 0..100 {
            let pids = read_pids(&procs);
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                // SAFETY: kill(2) takes two integers and touches no memory of ours, so it has no
                // memory-safety preconditions. `pid` was read from the sandbox's own cgroup and
                // is positive (`read_pids` keeps only those).
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
    // A killed process leaves the cgroup as it exits; then the empty cgroup can be removed.
    for _ in 0..200 {
        match fs::remove_dir(dir) {
            Ok(()) => return count,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return count,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    tracing::warn!(cgroup = %dir.display(), "a stopped sandbox's cgroup is not empty yet");
    count
}

fn read_pids(procs: &Path) -> Vec<libc::pid_t> {
    fs::read_to_string(procs)
        .map(|t| {
            t.lines()
                .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
                .filter(|p| *p > 0)
                .collect()
        })
        .unwrap_or_default()
}
