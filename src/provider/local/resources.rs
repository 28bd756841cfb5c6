//! What a local sandbox's processes used, read from outside from its cgroups
//! ([`SandboxProvider::resources`](crate::provider::SandboxProvider::resources)): CPU time,
//! peak memory and IO bytes, cumulative over the sandbox's life.
//!
//! An isolated sandbox (`terminal.local_isolation = namespaces`) is read from its limit cgroups
//! (`isolation::limits`), which live as long as its init: from its first command until its
//! processes are stopped, so the figures cover the whole generation. cgroup v2 gives
//! `cpu.stat` (`usage_usec`), `memory.peak` (Linux 5.19+) and `io.stat` (`rbytes`, `wbytes`);
//! v1 `cpuacct.usage` (ns), `memory.max_usage_in_bytes` and `blkio.throttle.io_service_bytes`
//! (or `blkio.io_service_bytes`). An unisolated sandbox is read from its v2 cgroup (`cgroup`):
//! `cpu.stat` is there without any controller, memory and IO only where the hierarchy enables
//! them (not on a hybrid machine whose v2 offers `hugetlb` alone); that cgroup is removed by the
//! sweep once empty and made again by the next command, so its figures count from then. A
//! figure no file gives is `None` ("not measured"); before the first command a measurable
//! sandbox has used nothing.

use std::fs;
use std::path::{Path, PathBuf};

use super::names::SandboxName;
use super::LocalProvider;
use crate::core::Resources;

impl LocalProvider {
    /// Whether this provider can read its sandboxes' CPU time (activity-aware idle needs it):
    /// where their cgroups can be made.
    pub(super) fn can_measure(&self) -> bool {
        if self.isolation.namespaces() {
            super::isolation::limits_support().is_ok()
        } else {
            super::cgroup::support().is_ok()
        }
    }

    /// What the sandbox `sandbox_id`'s processes used so far; `None` where nothing can be
    /// measured, or the sandbox is not one of this provider's.
    pub(super) fn read_resources(&self, sandbox_id: &str) -> Option<Resources> {
        if !self.can_measure() {
            return None;
        }
        let name = SandboxName::parse(sandbox_id).ok()?;
        let dirs: Vec<PathBuf> = if self.isolation.namespaces() {
            self.limit_cgroups(sandbox_id)
        } else {
            let dir = self.sandbox_dir(&name);
            super::cgroup::recorded(&dir, &name.name)
                .filter(|d| d.is_dir())
                .into_iter()
                .collect()
        };
        if dirs.is_empty() {
            // No cgroup yet (no command) or none now (the sweep removed an empty one).
            return Some(Resources {
                cpu_usec: Some(0),
                ..Resources::default()
            });
        }
        Some(read(&dirs))
    }
}

/// The figures the cgroup directories `dirs` give (the first that gives each).
pub(super) fn read(dirs: &[PathBuf]) -> Resources {
    let mut r = Resources::default();
    for dir in dirs {
        r.cpu_usec = r.cpu_usec.or_else(|| cpu_usec(dir));
        r.memory_peak_bytes = r.memory_peak_bytes.or_else(|| memory_peak(dir));
        r.io_bytes = r.io_bytes.or_else(|| io_bytes(dir));
    }
    r
}

fn text(dir: &Path, file: &str) -> Option<String> {
    fs::read_to_string(dir.join(file)).ok()
}

/// `key value` lines: the value of `key`.
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

fn cpu_usec(dir: &Path) -> Option<u64> {
    // v2 (v1's `cpu.stat` has no `usage_usec`), then v1's nanoseconds.
    text(dir, "cpu.stat")
        .and_then(|t| keyed(&t, "usage_usec"))
        .or_else(|| {
            text(dir, "cpuacct.usage")
                .and_then(|t| t.trim().parse::<u64>().ok())
                .map(|ns| ns / 1000)
        })
}

fn memory_peak(dir: &Path) -> Option<u64> {
    ["memory.peak", "memory.max_usage_in_bytes"]
        .into_iter()
        .find_map(|f| text(dir, f).and_then(|t| t.trim().parse().ok()))
}

fn io_bytes(dir: &Path) -> Option<u64> {
    if let Some(t) = text(dir, "io.stat") {
        return Some(io_stat(&t));
    }
    ["blkio.throttle.io_service_bytes", "blkio.io_service_bytes"]
        .into_iter()
        .find_map(|f| text(dir, f).map(|t| blkio(&t)))
}

/// v2 `io.stat`: `maj:min rbytes=N wbytes=N rios=N ...` per device; read and written bytes.
fn io_stat(text: &str) -> u64 {
    text.split_whitespace()
        .filter_map(|field| {
            let (k, v) = field.split_once('=')?;
            matches!(k, "rbytes" | "wbytes").then(|| v.parse::<u64>().ok())?
        })
        .fold(0, u64::saturating_add)
}

/// v1 `blkio.*io_service_bytes`: `maj:min Read N`, `maj:min Write N`, ... per device, then
/// `Total N`; read and written bytes.
fn blkio(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_device, op, n) = (f.next()?, f.next()?, f.next()?);
            matches!(op, "Read" | "Write").then(|| n.parse::<u64>().ok())?
        })
        .fold(0, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_stat_adds_read_and_written_bytes_of_every_device() {
        let t = "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n\
                 259:0 rbytes=1 wbytes=2 rios=1 wios=1 dbytes=99 dios=1\n";
        assert_eq!(io_stat(t), 4096 + 8192 + 1 + 2);
        assert_eq!(io_stat(""), 0);
    }

    #[test]
    fn blkio_adds_reads_and_writes_but_not_the_totals() {
        let t = "8:0 Read 100\n8:0 Write 200\n8:0 Sync 250\n8:0 Async 50\n8:0 Total 300\n\
                 8:16 Read 1\n8:16 Write 2\nTotal 303\n";
        assert_eq!(blkio(t), 303);
        assert_eq!(blkio("Total 0\n"), 0);
    }

    #[test]
    fn v2_and_v1_files_are_read_each_where_it_is() {
        let root = std::env::temp_dir().join(format!("taskbox-res-{}", std::process::id()));
        let (v2, cpuacct, mem) = (root.join("v2"), root.join("cpuacct"), root.join("mem"));
        for d in [&v2, &cpuacct, &mem] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(v2.join("cpu.stat"), "usage_usec 1500\nuser_usec 1000\n").unwrap();
        fs::write(v2.join("memory.peak"), "52428800\n").unwrap();
        fs::write(v2.join("io.stat"), "8:0 rbytes=10 wbytes=20\n").unwrap();
        assert_eq!(
            read(std::slice::from_ref(&v2)),
            Resources {
                cpu_usec: Some(1500),
                memory_peak_bytes: Some(52_428_800),
                io_bytes: Some(30),
            }
        );
        // v1: the cpu hierarchy's own `cpu.stat` has no usage; cpuacct counts nanoseconds.
        let cpu = root.join("cpu");
        fs::create_dir_all(&cpu).unwrap();
        fs::write(cpu.join("cpu.stat"), "nr_periods 3\nthrottled_time 0\n").unwrap();
        fs::write(cpuacct.join("cpuacct.usage"), "2500000\n").unwrap();
        fs::write(mem.join("memory.max_usage_in_bytes"), "1000\n").unwrap();
        assert_eq!(
            read(&[mem.clone(), cpu, cpuacct]),
            Resources {
                cpu_usec: Some(2500),
                memory_peak_bytes: Some(1000),
                io_bytes: None,
            }
        );
        fs::remove_dir_all(&root).unwrap();
    }
}
