//! Process isolation of a local sandbox with a cgroup v2 (Linux): every command of a sandbox
//! runs in the sandbox's own cgroup from before it runs anything of the caller's, and stopping the
//! sandbox kills the whole cgroup. A process cannot leave its cgroup by `setsid`, `env -i`, a
//! cleared `TASKBOX_WORKSPACE` or double-forking (only by writing to another cgroup's
//! `cgroup.procs`, which needs rights over it), so nothing a command started survives its sandbox.
//!
//! The cgroup is made under the cgroup this process runs in (`/proc/self/cgroup`, on the cgroup2
//! mount from `/proc/self/mountinfo`), named `taskbox-<sandbox name>-<hash of the sandbox's
//! directory>` (two data dirs may hold sandboxes of one name), and its path is recorded in the
//! sandbox's directory (`cgroup`) so that another taskbox process stopping the sandbox finds it.
//! It lives from the sandbox's first command until the sandbox stops (`kill_all` removes it);
//! the sweep (`remove_empty`) removes empty ones, which the next command makes again.
//!
//! A command's shell is born in the cgroup where Linux can (`spawn`: `clone3` with
//! `CLONE_INTO_CGROUP`, Linux 5.7+), so it never moves: a move (a write to `cgroup.procs`)
//! waits for an RCU grace period, ~14 ms, unless another move happened just before. Otherwise
//! (an older kernel, a seccomp filter, a cgroup that cannot be opened) the shell is spawned as
//! usual and joins as the first thing its `bash -c` script does (`Join::script`:
//! `echo 0 > <cgroup>/cgroup.procs`, making the cgroup again if a sweep just removed it), which
//! keeps that spawn a `posix_spawn` (a `pre_exec` hook would fork the server and still move the
//! process). Nothing of the caller's runs before the join (bash reads only the server's own
//! `BASH_ENV`, if it has one, before), so every process the command starts is in the cgroup; a
//! join that fails runs nothing and the exec fails
//! (`Join::failed`). Where no writable cgroup v2 hierarchy is available (not Linux, cgroup v1
//! only, no delegation to this user), [`support`] says why, `taskbox doctor` reports it, and
//! only the environment sweep of `kill::kill_leftovers` (which those escapes evade) remains.

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
pub(super) fn name(sandbox_dir: &Path, sandbox: &str) -> String {
    cgroup_name(sandbox_dir, sandbox)
}

fn cgroup_name(sandbox_dir: &Path, sandbox: &str) -> String {
    // FNV-1a of the directory: stable across processes and runs (unlike std's hasher).
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in sandbox_dir.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01B3);
    }
    format!("taskbox-{sandbox}-{:08x}", h as u32)
}

/// A sandbox's cgroup as a command joins it: the directory and its `cgroup.procs`.
pub(super) struct Join {
    dir: PathBuf,
    procs: PathBuf,
}

/// What a command's script writes to its report file when it could not join the cgroup (a
/// working directory reported there always starts with `/`).
const JOIN_FAILED: &[u8] = b"!cgroup";

impl Join {
    /// The cgroup's directory.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The start of a command's `bash -c` script (no newline, so the command's line numbers are
    /// unchanged): moves the shell into the cgroup, making the cgroup again and retrying if it
    /// is not there (a sweep may just have removed it); if that fails, writes [`JOIN_FAILED`] to
    /// `report` and exits 125 without running anything else. Sets `__taskbox_join`.
    pub(super) fn script(&self, report: &Path) -> Vec<u8> {
        use std::os::unix::ffi::OsStrExt;
        let q = |p: &Path| crate::shell::quote_bytes(p.as_os_str().as_bytes());
        let (procs, dir, report) = (q(&self.procs), q(&self.dir), q(report));
        let mut s = b"for __taskbox_join in 1 2 3; do { builtin echo 0 >| ".to_vec();
        s.extend_from_slice(&procs);
        s.extend_from_slice(b"; } 2>/dev/null && break; mkdir -- ");
        s.extend_from_slice(&dir);
        s.extend_from_slice(b" 2>/dev/null; false; done || { { builtin echo '");
        s.extend_from_slice(JOIN_FAILED);
        s.extend_from_slice(b"' >| ");
        s.extend_from_slice(&report);
        s.extend_from_slice(b"; } 2>/dev/null; builtin exit 125; }; ");
        s
    }

    /// Whether a command's report says it could not join the cgroup (and so ran nothing), and
    /// if so the error to answer with.
    pub(super) fn failed(&self, report: Option<&[u8]>) -> Option<io::Error> {
        (report?.strip_suffix(b"\n") == Some(JOIN_FAILED)).then(|| {
            // The reason, as this process meets it (the same user, the same cgroup).
            let why = fs::OpenOptions::new()
                .write(true)
                .open(&self.procs)
                .err()
                .map_or_else(String::new, |e| format!(": {e}"));
            io::Error::other(format!(
                "the command could not join the sandbox's cgroup {}{why}; nothing was run",
                self.dir.display()
            ))
        })
    }
}

/// Finds the cgroup of the sandbox `sandbox` whose directory is `sandbox_dir`, records it there
/// (unless it already is) and makes it (unless it exists), for each command to join. `None`
/// when cgroups are not available here (or the record cannot be written: the reason is logged).
pub(super) fn prepare(sandbox_dir: &Path, sandbox: &str) -> Option<Join> {
    let base = support().ok()?;
    let dir = recorded(sandbox_dir, sandbox);
    let recorded_already = dir.is_some();
    let dir = dir.unwrap_or_else(|| base.join(cgroup_name(sandbox_dir, sandbox)));
    if !recorded_already {
        if let Err(e) = fs::write(sandbox_dir.join(RECORD), dir.as_os_str().as_encoded_bytes()) {
            tracing::warn!(sandbox, cgroup = %dir.display(), error = %e,
                "cannot record the sandbox's cgroup; processes that leave its process group \
                 may outlive it");
            return None;
        }
    }
    // Made here, where it is cheap; the command's script makes it again if it has to.
    let _ = fs::create_dir(&dir);
    let procs = dir.join("cgroup.procs");
    Some(Join { dir, procs })
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

/// Removes every empty cgroup of this installation's sandboxes (`taskbox-<sandbox name>-<hash>`,
/// the sandbox name ending in the installation's prefix) where this process makes them;
/// cgroups with processes stay (the kernel refuses to remove them), and another installation's
/// (another data dir on this machine) are its own gc's to remove.
pub(super) fn remove_empty(installation_id: &str) {
    let Ok(base) = support() else {
        return;
    };
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    let ours = format!("-{}", crate::provider::installation_prefix(installation_id));
    for entry in entries.flatten() {
        let name = entry.file_name();
        let sandbox = name
            .to_str()
            .filter(|n| n.starts_with("taskbox-"))
            .and_then(|n| n.rsplit_once('-'))
            .map(|(sandbox, _hash)| sandbox);
        if sandbox.is_some_and(|s| s.ends_with(&ours)) {
            let _ = fs::remove_dir(entry.path());
        }
    }
}

/// Kills every process in the cgroup `dir` and removes it. Returns whether the cgroup is gone
/// (every process of it has exited, its open files released); blocking (waits up to a few
/// seconds for the killed processes to leave).
pub(super) fn kill_all(dir: &Path) -> bool {
    let procs = dir.join("cgroup.procs");
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
            Ok(()) => return true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return true,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    tracing::warn!(cgroup = %dir.display(), "a stopped sandbox's cgroup is not empty yet");
    false
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The script makes the cgroup when it is missing (a sweep removed it after `prepare`), joins
    /// it, and only then runs the command.
    #[test]
    fn the_script_makes_a_missing_cgroup_and_joins_it_before_the_command() {
        // Skipped where there are none (the integration tests say so, and fail under CI as root).
        let Ok(base) = support() else {
            return;
        };
        let dir = base.join(format!("taskbox-unit-{}", std::process::id()));
        let _ = fs::remove_dir(&dir);
        let join = Join {
            procs: dir.join("cgroup.procs"),
            dir: dir.clone(),
        };
        let report =
            std::env::temp_dir().join(format!("taskbox-unit-report-{}", std::process::id()));
        let mut script = join.script(&report);
        script.extend_from_slice(b"cat /proc/self/cgroup");
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&script))
            .output()
            .expect("run bash");
        let _ = fs::remove_dir(&dir);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        let name = dir.file_name().and_then(|n| n.to_str()).expect("utf-8");
        assert!(
            text.lines()
                .any(|l| l.starts_with("0::") && l.trim_end().ends_with(name)),
            "{text}"
        );
        assert!(join.failed(fs::read(&report).ok().as_deref()).is_none());
        let _ = fs::remove_file(&report);
    }
}
