//! An isolated sandbox's limits (`terminal.container_cpu`, `container_memory`,
//! `container_pids`): cgroups made when its init starts and removed when it ends.
//!
//! Where the unified hierarchy (cgroup v2) offers `memory`, `pids` and `cpu`, one cgroup there
//! holds them (`memory.max`, `pids.max`, `cpu.max`). Where it does not — a hybrid machine,
//! whose v2 mount offers only `hugetlb` — each controller's v1 hierarchy gets a cgroup of the
//! sandbox's (`memory.limit_in_bytes` and `memory.memsw.limit_in_bytes`, `pids.max`,
//! `cpu.cfs_quota_us` over `cpu.cfs_period_us`), made under the cgroup this process is in for
//! that controller (`/proc/self/cgroup`).
//!
//! Every command's helper joins them before it enters the namespaces (`enter`): it writes `0`
//! to each `cgroup.procs` (v2) or `tasks` (v1), so the command it then clones is born in them,
//! and everything the command starts is counted. A
//! process move into a v1 cgroup (`cgroup.procs`) takes the global threadgroup lock, whose write
//! side waits for an RCU grace period when no move happened just before: measured on this
//! hybrid machine (kernel 6.18, 2 cores, load 2), writing the three v1 `cgroup.procs` from a
//! forked child took a median 0.57 ms with a tail of 13–15 ms, and the same through `tasks` a
//! median 0.59 ms with a tail of 0.7 ms. The helper has one thread, so moving that thread
//! (`tasks`, which the kernel does without the global lock) moves the whole process.
//!
//! The same cgroups are what the server reads a sandbox's resources from (`resources`: CPU time,
//! peak memory, IO). Where v1's `cpuacct` and `blkio` are hierarchies of their own (this hybrid
//! machine's `cpu` and `cpuacct` are mounted apart), the sandbox gets a cgroup in each too,
//! with no limit, for their counters only; a hierarchy that cannot be written leaves that figure
//! unmeasured. On v2, `io` is enabled beside the three where the hierarchy offers it.
//!
//! A command killed by the memory limit is noted after its output (`exec` compares the
//! cgroup's `oom_kill` count before and after it, [`OomCounter`]); its exit code is the
//! kernel's (137 for a shell killed outright).

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// A sandbox's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// CPUs (`terminal.container_cpu`).
    pub cpu: u32,
    /// Memory in MB (`terminal.container_memory`).
    pub memory_mb: u32,
    /// Processes and threads (`terminal.container_pids`).
    pub pids: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            cpu: 1,
            memory_mb: 5120,
            pids: crate::config::DEFAULT_CONTAINER_PIDS,
        }
    }
}

/// Where limit cgroups are made.
#[derive(Debug)]
enum Hierarchy {
    /// One cgroup v2 directory under this one.
    V2(PathBuf),
    /// One directory under each of these (memory, pids, cpu), under each hierarchy kept for
    /// its counters only (`cpuacct` where not mounted with `cpu`, `blkio`), and under freezer
    /// where it is mounted (it pauses the sandbox's processes for a checkpoint).
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: PathBuf,
        counters: Vec<PathBuf>,
        freezer: Option<PathBuf>,
    },
}

impl Hierarchy {
    /// The directories a sandbox's limit cgroups are made under: v2's one; v1's memory, pids
    /// and cpu first (`Cgroups::make` takes the memory one first), then the counters' and the
    /// freezer's.
    fn bases(&self) -> Box<dyn Iterator<Item = &PathBuf> + '_> {
        match self {
            Hierarchy::V2(base) => Box::new(std::iter::once(base)),
            Hierarchy::V1 {
                memory,
                pids,
                cpu,
                counters,
                freezer,
            } => Box::new(
                [memory, pids, cpu]
                    .into_iter()
                    .chain(counters)
                    .chain(freezer),
            ),
        }
    }
}

/// The period of the CPU quota, microseconds.
const CPU_PERIOD_US: u64 = 100_000;

/// Where this process can make limit cgroups, or why not: probed once per process.
fn hierarchy() -> Result<&'static Hierarchy, &'static str> {
    static FOUND: OnceLock<Result<Hierarchy, String>> = OnceLock::new();
    match FOUND.get_or_init(probe) {
        Ok(h) => Ok(h),
        Err(e) => Err(e.as_str()),
    }
}

/// Whether limits apply here: a line for `doctor` saying where, or why not.
pub fn support() -> Result<String, String> {
    match hierarchy()? {
        Hierarchy::V2(base) => Ok(format!("cgroup v2 under {}", base.display())),
        Hierarchy::V1 {
            memory, pids, cpu, ..
        } => Ok(format!(
            "cgroup v1: {}, {}, {}",
            memory.display(),
            pids.display(),
            cpu.display()
        )),
    }
    .map_err(str::to_string)
}

fn probe() -> Result<Hierarchy, String> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let own = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let mut v2_why = String::from("no cgroup v2 hierarchy");
    if let Ok(base) = super::super::cgroup::support() {
        match v2(base) {
            Ok(h) => return Ok(h),
            Err(e) => v2_why = e,
        }
    }
    let v1 = |controller: &str| -> Result<PathBuf, String> {
        let base = v1_base(&mountinfo, &own, controller).ok_or_else(|| {
            format!("no cgroup v1 hierarchy of `{controller}` is mounted for this process")
        })?;
        writable(&base)?;
        Ok(base)
    };
    let found = (|| {
        let cpu = v1("cpu")?;
        // Counters only: a hierarchy missing or not writable leaves its figure unmeasured.
        let counters = ["cpuacct", "blkio"]
            .into_iter()
            .filter_map(|c| v1(c).ok())
            .filter(|base| *base != cpu)
            .collect();
        Ok::<_, String>(Hierarchy::V1 {
            memory: v1("memory")?,
            pids: v1("pids")?,
            cpu,
            counters,
            // Optional: without it a checkpoint cannot pause the processes and says so.
            freezer: v1("freezer").ok(),
        })
    })();
    found.map_err(|v1_why| {
        format!(
            "{v2_why}; {v1_why}: run the server as root or with a delegated cgroup (systemd \
             `Delegate=yes`), or opt out with `terminal.local_isolation = none`"
        )
    })
}

/// The unified hierarchy, if it offers the three controllers (enabled for children here).
fn v2(base: &Path) -> Result<Hierarchy, String> {
    let offered = fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    let missing: Vec<&str> = ["memory", "pids", "cpu"]
        .into_iter()
        .filter(|c| !offered.split_whitespace().any(|o| o == *c))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the cgroup v2 hierarchy at {} does not offer {}",
            base.display(),
            missing.join(", ")
        ));
    }
    let enabled = fs::read_to_string(base.join("cgroup.subtree_control")).unwrap_or_default();
    if !["memory", "pids", "cpu"]
        .iter()
        .all(|c| enabled.split_whitespace().any(|o| o == *c))
    {
        fs::write(base.join("cgroup.subtree_control"), b"+memory +pids +cpu").map_err(|e| {
            format!(
                "cannot enable memory, pids and cpu in {}/cgroup.subtree_control: {e}",
                base.display()
            )
        })?;
    }
    // IO counters where offered (not a limit: a hierarchy without `io` only leaves IO
    // unmeasured).
    if offered.split_whitespace().any(|o| o == "io")
        && !enabled.split_whitespace().any(|o| o == "io")
    {
        if let Err(e) = fs::write(base.join("cgroup.subtree_control"), b"+io") {
            tracing::debug!(cgroup = %base.display(), error = %e, "io is not counted per sandbox");
        }
    }
    writable(base)?;
    Ok(Hierarchy::V2(base.to_path_buf()))
}

/// The directory of this process's cgroup in the v1 hierarchy of `controller`.
fn v1_base(mountinfo: &str, own: &str, controller: &str) -> Option<PathBuf> {
    // Fields: id parent major:minor root mount-point options... - fstype source super-options.
    let (root, point) = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut right = right.split_whitespace();
        let (fstype, options) = (right.next()?, right.nth(1)?);
        let ours = fstype == "cgroup" && options.split(',').any(|o| o == controller);
        let mut left = left.split_whitespace();
        ours.then(|| Some((left.nth(3)?.to_string(), left.next()?.to_string())))?
    })?;
    // Lines: id:controllers:path.
    let path = own.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| path.trim().to_string())
    })?;
    // The mount shows the hierarchy from `root` down (a container's view).
    let below = Path::new(&path).strip_prefix(&root).ok()?;
    Some(Path::new(&point).join(below))
}

/// Whether a cgroup can be made under `base`.
fn writable(base: &Path) -> Result<(), String> {
    let probe = base.join(format!("taskbox-limits-probe-{}", std::process::id()));
    match fs::create_dir(&probe) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(format!(
                "cannot make a cgroup under {}: {e}",
                base.display()
            ))
        }
    }
    let _ = fs::remove_dir(&probe);
    Ok(())
}

/// A sandbox's limit cgroups, removed by [`Cgroups::remove`] (when its init ends).
#[derive(Debug)]
pub struct Cgroups {
    dirs: Vec<PathBuf>,
    /// The directory with the memory controller's files.
    memory: PathBuf,
    /// The directory that pauses its processes: v2's (`cgroup.freeze`) or v1's freezer
    /// (`freezer.state`); `None` where neither is available.
    freezer: Option<PathBuf>,
    v2: bool,
    /// Each directory's `cgroup.procs` (v2) or `tasks` (v1), for a command's hook.
    procs: Vec<CString>,
    /// Its memory controller's `memory.events` (v2) or `memory.oom_control` (v1), opened once
    /// and read again from its start per command ([`OomCounter`]).
    oom_file: Option<Arc<fs::File>>,
    limits: Limits,
}

impl Cgroups {
    /// Makes the cgroups named `name` with `limits` (reusing ones a crash left behind), which
    /// must end in `-<pid of this process>.<n>` (the sweep of leftover limit cgroups goes by it).
    pub fn make(name: &str, limits: Limits) -> Result<Cgroups, String> {
        let hierarchy = hierarchy()?;
        sweep(hierarchy);
        let dirs: Vec<PathBuf> = hierarchy.bases().map(|base| base.join(name)).collect();
        let freezer = match hierarchy {
            Hierarchy::V2(_) => Some(dirs[0].clone()),
            Hierarchy::V1 { freezer, .. } => freezer.as_ref().map(|f| f.join(name)),
        };
        let cgroups = Cgroups {
            memory: dirs[0].clone(),
            freezer,
            v2: matches!(hierarchy, Hierarchy::V2(_)),
            // v1: a command's helper moves its own (only) thread through `tasks`, which the
            // kernel does without the global threadgroup lock whose write side waits for an
            // RCU grace period (up to ~14 ms per command when no move happened just before) —
            // the helper is single-threaded, so its thread is the whole process. v2 has no
            // such file for a domain cgroup: `cgroup.procs`.
            procs: dirs
                .iter()
                .map(|d| {
                    let file = if matches!(hierarchy, Hierarchy::V2(_)) {
                        "cgroup.procs"
                    } else {
                        "tasks"
                    };
                    CString::new(d.join(file).as_os_str().as_bytes())
                        .map_err(|_| format!("a cgroup path with a NUL byte: {}", d.display()))
                })
                .collect::<Result<_, _>>()?,
            oom_file: None,
            dirs,
            limits,
        };
        if let Err(e) = cgroups.apply() {
            cgroups.remove();
            return Err(e);
        }
        let mut cgroups = cgroups;
        cgroups.open_files();
        Ok(cgroups)
    }

    /// Opens the memory controller's counter of OOM kills (where the kernel has it), which
    /// every command reads twice.
    fn open_files(&mut self) {
        self.oom_file = fs::File::open(self.memory.join(self.oom_file_name()))
            .ok()
            .map(Arc::new);
    }

    fn oom_file_name(&self) -> &'static str {
        if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        }
    }

    fn apply(&self) -> Result<(), String> {
        for dir in &self.dirs {
            match fs::create_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("cannot make the cgroup {}: {e}", dir.display())),
            }
        }
        let memory = u64::from(self.limits.memory_mb) * 1024 * 1024;
        let quota = u64::from(self.limits.cpu) * CPU_PERIOD_US;
        let write = |dir: &Path, file: &str, value: String| {
            fs::write(dir.join(file), value.as_bytes())
                .map_err(|e| format!("cannot set {} to {value}: {e}", dir.join(file).display()))
        };
        if self.v2 {
            let dir = &self.dirs[0];
            write(dir, "memory.max", memory.to_string())?;
            // No swap beyond the limit, where swap is accounted.
            if dir.join("memory.swap.max").exists() {
                write(dir, "memory.swap.max", "0".into())?;
            }
            write(dir, "pids.max", self.limits.pids.to_string())?;
            write(dir, "cpu.max", format!("{quota} {CPU_PERIOD_US}"))?;
        } else {
            let [mem, pids, cpu] = [&self.dirs[0], &self.dirs[1], &self.dirs[2]];
            write(mem, "memory.limit_in_bytes", memory.to_string())?;
            // Memory and swap together (where swap is accounted): the same bound.
            if mem.join("memory.memsw.limit_in_bytes").exists() {
                write(mem, "memory.memsw.limit_in_bytes", memory.to_string())?;
            }
            write(pids, "pids.max", self.limits.pids.to_string())?;
            write(cpu, "cpu.cfs_period_us", CPU_PERIOD_US.to_string())?;
            write(cpu, "cpu.cfs_quota_us", quota.to_string())?;
        }
        Ok(())
    }

    /// Each cgroup's `cgroup.procs` or `tasks` (what a command's hook writes `0` to).
    pub(super) fn procs(&self) -> &[CString] {
        &self.procs
    }

    /// The cgroups' directories.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The cgroup that pauses the sandbox's processes, and whether it is v2's.
    pub fn freezer(&self) -> Option<(&Path, bool)> {
        self.freezer.as_deref().map(|d| (d, self.v2))
    }

    /// The limits applied.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// What counts the processes the memory limit killed.
    pub fn oom_counter(&self) -> OomCounter {
        OomCounter {
            file: self.oom_file.clone(),
            memory_mb: self.limits.memory_mb,
        }
    }

    /// Kills what is left in the cgroups and removes them (blocking, a few seconds at most).
    pub fn remove(&self) {
        for dir in &self.dirs {
            if !super::super::cgroup::kill_all(dir) {
                tracing::warn!(cgroup = %dir.display(), "a sandbox's limit cgroup could not be removed");
            }
        }
    }
}

/// The prefix of limit cgroups' names.
pub const PREFIX: &str = "taskbox.limits-";

/// Removes the limit cgroups of taskbox processes that are gone (a one-shot `taskbox run`
/// exits with its sandbox's init; a killed server never removed its own): their sandboxes'
/// inits died with them, so they are empty, and the kernel refuses to remove any that is not.
fn sweep(hierarchy: &Hierarchy) {
    for base in hierarchy.bases() {
        let Ok(entries) = fs::read_dir(base) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(owner) = name
                .to_str()
                .filter(|n| n.starts_with(PREFIX))
                .and_then(|n| n.rsplit_once('-'))
                .and_then(|(_, unique)| unique.split_once('.'))
                .and_then(|(pid, _)| pid.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{owner}")).exists() {
                let _ = fs::remove_dir(entry.path());
            }
        }
    }
}

/// The kernel's count of the processes a sandbox's memory limit killed (`oom_kill` in v2's
/// `memory.events`, v1's `memory.oom_control`).
#[derive(Debug, Clone)]
pub struct OomCounter {
    /// The counter's file, open (`None` where the kernel has none).
    file: Option<Arc<fs::File>>,
    memory_mb: u32,
}

impl OomCounter {
    /// The count so far (0 where the kernel does not count, or the cgroup is gone).
    pub fn count(&self) -> u64 {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 512];
        // Each read from offset 0 makes the kernel print the file anew.
        self.file
            .as_ref()
            .and_then(|f| f.read_at(&mut buf, 0).ok())
            .and_then(|n| std::str::from_utf8(&buf[..n]).ok())
            .and_then(|t| {
                t.lines().find_map(|l| {
                    l.strip_prefix("oom_kill ")
                        .and_then(|n| n.trim().parse().ok())
                })
            })
            .unwrap_or(0)
    }

    /// The note a command killed by the limit gets in its stderr.
    pub fn note(&self) -> String {
        format!(
            "taskbox: the command was killed by its sandbox's memory limit \
             (terminal.container_memory = {} MB); the sandbox and its files are kept\n",
            self.memory_mb
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v1_base_is_the_mount_joined_with_the_own_path_below_its_root() {
        let mountinfo = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                         39 31 0:36 /docker/x /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n\
                         41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                         32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        let own = "8:pids:/docker/x/inner\n4:memory:/process_api/abc\n2:cpu,cpuacct:/\n0::/\n";
        assert_eq!(
            v1_base(mountinfo, own, "memory"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
        );
        assert_eq!(
            v1_base(mountinfo, own, "pids"),
            Some(PathBuf::from("/sys/fs/cgroup/pids/inner"))
        );
        assert_eq!(
            v1_base(mountinfo, own, "cpu"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(v1_base(mountinfo, own, "blkio"), None);
    }
}
