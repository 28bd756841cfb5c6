//! What a sandbox's processes use, as the provider reads it from outside (the local backend's
//! cgroups), and the rule that tells a busy sandbox from an idle one (activity-aware idle).
//!
//! The engine samples a sandbox's counters when the core asks ([`Command::SampleActivity`]) and
//! answers with [`Event::ActivitySampled`]; the core keeps the last sample on the sandbox's
//! record ([`SandboxActivity`]) and compares the next with it ([`busy_between`]). Counters are
//! cumulative over the sandbox's life, so two samples give what its processes did in between.
//!
//! [`Command::SampleActivity`]: super::Command::SampleActivity
//! [`Event::ActivitySampled`]: super::Event::ActivitySampled

use std::fmt;

use serde::{Deserialize, Serialize};

use super::Millis;

/// What a sandbox's processes used so far, cumulative over the sandbox's life; each figure is
/// absent where the provider cannot measure it (an unisolated local sandbox has no memory or IO
/// accounting on a machine whose cgroup v2 offers no controllers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// CPU time, microseconds (cgroup v2 `cpu.stat` `usage_usec`, v1 `cpuacct.usage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_usec: Option<u64>,
    /// The most memory its processes held at once, bytes (v2 `memory.peak`, v1
    /// `memory.max_usage_in_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak_bytes: Option<u64>,
    /// Bytes read and written to block devices (v2 `io.stat` `rbytes` + `wbytes`, v1
    /// `blkio` service bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_bytes: Option<u64>,
}

impl Resources {
    /// Whether nothing was measured.
    pub fn is_empty(&self) -> bool {
        self.cpu_usec.is_none() && self.memory_peak_bytes.is_none() && self.io_bytes.is_none()
    }

    /// The later of two readings of one sandbox: counters only grow, so the larger of each
    /// figure (a figure one reading lacks is taken from the other).
    pub fn merge(self, other: Resources) -> Resources {
        let max = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Resources {
            cpu_usec: max(self.cpu_usec, other.cpu_usec),
            memory_peak_bytes: max(self.memory_peak_bytes, other.memory_peak_bytes),
            io_bytes: max(self.io_bytes, other.io_bytes),
        }
    }
}

/// `cpu 0.31 s, peak memory 52.4 MB, io 1.2 MB`, each figure `not measured` where absent
/// (MB are 10^6 bytes).
impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cpu_usec {
            Some(us) => write!(f, "cpu {:.2} s", us as f64 / 1e6)?,
            None => f.write_str("cpu not measured")?,
        }
        match self.memory_peak_bytes {
            Some(b) => write!(f, ", peak memory {:.1} MB", b as f64 / 1e6)?,
            None => f.write_str(", peak memory not measured")?,
        }
        match self.io_bytes {
            Some(b) => write!(f, ", io {:.1} MB", b as f64 / 1e6),
            None => f.write_str(", io not measured"),
        }
    }
}

/// The sandbox's activity as last sampled, kept on its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxActivity {
    /// When the last sample was taken.
    pub sampled_at: Millis,
    /// What it read.
    #[serde(default)]
    pub resources: Resources,
    /// The last time a sample found its processes busy ([`busy_between`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_at: Option<Millis>,
}

/// CPU time per second of wall time above which a sandbox's processes count as busy:
/// 20 ms/s (2 % of a CPU). A shell, a sleeping dev server or an idle language server stays far
/// below it; a build, a test run or `yes` is far above.
pub const BUSY_CPU_USEC_PER_SEC: u64 = 20_000;

/// Block IO per second of wall time above which a sandbox's processes count as busy: 64 KiB/s
/// (a download or a build writing its outputs, not a log line now and then).
pub const BUSY_IO_BYTES_PER_SEC: u64 = 64 * 1024;

/// How long before the idle timer falls due the first of the two samples whose difference
/// decides is taken: at most 5 s, and at most half the idle lifetime.
pub fn sample_window_ms(idle_lifetime_ms: u64) -> u64 {
    (idle_lifetime_ms / 2).clamp(1, 5_000)
}

/// Whether the processes did work between two samples `elapsed_ms` apart: CPU time or IO
/// above the thresholds' rate over that time. A figure missing from either sample says nothing;
/// no time between them (or no figure at all) is not busy.
pub fn busy_between(before: &Resources, after: &Resources, elapsed_ms: u64) -> bool {
    if elapsed_ms == 0 {
        return false;
    }
    let grew = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    // `delta / elapsed_s ≥ rate`, as `delta * 1000 ≥ rate * elapsed_ms` in u128 (no overflow).
    let above = |delta: Option<u64>, rate: u64| {
        delta.is_some_and(|d| u128::from(d) * 1000 >= u128::from(rate) * u128::from(elapsed_ms))
    };
    above(grew(before.cpu_usec, after.cpu_usec), BUSY_CPU_USEC_PER_SEC)
        || above(grew(before.io_bytes, after.io_bytes), BUSY_IO_BYTES_PER_SEC)
}
