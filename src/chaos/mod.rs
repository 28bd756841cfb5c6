//! Chaos runs: deterministic fault simulation with an invariant checker (issue 6).
//!
//! In the manner of FoundationDB's simulator and TigerBeetle's VOPR, one `u64` seed decides
//! everything: the workload of every task (commands, suspends, resumes, idle waits), where the
//! engine crashes, and every fault the simulated platform injects (429s with `Retry-After`,
//! 5xx, timeouts, creates whose answer is lost, sandboxes that expire mid-command, snapshots
//! that fail, are slow or later vanish, deletes that fail). A seed runs the real engine with a
//! real SQLite store in a fresh data dir against [`SimProvider`](crate::provider::sim::SimProvider), on a current-thread tokio
//! runtime whose clock is paused: hours of virtual time pass in milliseconds, and the same seed
//! gives the same run, bit for bit — [`SeedReport::digest`] hashes the journal and the
//! platform's final state so that this is checked, not assumed.
//!
//! In the manner of Jepsen, the history is checked afterwards: once the workload is over, the
//! faults are switched off, every task runs one last command (which recovers and restores it),
//! the orphan reconciler runs, and [`check`] compares the journal with the platform's ground
//! truth. A violating seed keeps its data dir and prints the command that reproduces it.
//!
//! With [`ChaosOptions::http`], the same fault kinds are injected one level down instead: the
//! real Vercel client against an in-process fake Vercel server, on real sockets and real time
//! (the `http` module). Those runs are bounded to seconds per seed and are not bit-reproducible.
//!
//! [`run`] runs many seeds (on several threads, each seed on its own runtime); [`run_seed`] one.

pub mod check;
mod driver;
#[cfg(feature = "postgres")]
mod fleet;
mod http;
mod planted;
mod sim;
mod witness;
pub mod workload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::engine::EngineError;
use crate::provider::sim::{SimFaults, SimFaultsError};
use crate::store::StoreError;

pub use check::{Invariant, JournalCounts, Violation};
#[doc(hidden)]
pub use planted::{IgnorePlatformSnapshot, OldestRestore, PlantedBug, UnknownPlantedBug};
pub use sim::run_seed;
use sim::Digest;

/// Virtual time at which every seed starts (2023-11-14T22:13:20Z).
const START_MS: u64 = 1_700_000_000_000;
/// Salt that keeps the workload's stream apart from the platform's.
const WORKLOAD_SALT: u64 = 0x005E_ED0F_C4A0_5000;
/// The plan's cap on a sandbox's lifetime in the simulated world (matches the config below).
const MAX_LIFETIME_MS: u64 = 600_000;
/// Virtual time the workload may take before the seed is declared stuck.
const WORKLOAD_BOUND: Duration = Duration::from_secs(48 * 3600);
/// Virtual time, with faults off, for retries and slow calls in flight to finish.
const SETTLE: Duration = Duration::from_secs(60);

/// The faults of a chaos run: the simulated platform's ([`SimFaults`]), plus engine crashes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChaosFaults {
    /// The platform's faults.
    pub sim: SimFaults,
    /// The chance, per workload step, that the engine crashes at a random moment during it
    /// (its event loop is killed, as by `kill -9`, and a new one opens the same data dir).
    pub crash: f64,
    /// With `--fleet` only: the chance, per workload step, that the database expires one
    /// engine's leases behind its back (its renewals lost, as in a partition), so that another
    /// engine may take its tasks over while it still believes it owns them.
    pub lease_expiry: f64,
}

impl Default for ChaosFaults {
    fn default() -> Self {
        ChaosFaults::moderate()
    }
}

impl ChaosFaults {
    /// No faults at all.
    pub fn none() -> ChaosFaults {
        ChaosFaults {
            sim: SimFaults::none(),
            crash: 0.0,
            lease_expiry: 0.0,
        }
    }

    /// Every fault kind at a moderate rate, with some latency: the default of `taskbox chaos`.
    pub fn moderate() -> ChaosFaults {
        ChaosFaults {
            sim: SimFaults {
                rate_limit: 0.04,
                retry_after_ms: 2_000,
                server_error: 0.04,
                timeout: 0.02,
                timeout_ms: 5_000,
                lost_create: 0.05,
                expire_mid_command: 0.03,
                snapshot_fail_permanent: 0.03,
                snapshot_fail_transient: 0.05,
                snapshot_slow: 0.1,
                snapshot_slow_ms: 20_000,
                snapshot_gone: 0.05,
                snapshot_gone_after_ms: 200_000,
                delete_fail: 0.1,
                latency_min_ms: 1,
                latency_max_ms: 200,
            },
            crash: 0.03,
            lease_expiry: 0.0,
        }
    }

    /// [`ChaosFaults::moderate`] with lease expiries too: the default of `taskbox chaos
    /// --fleet`.
    pub fn moderate_fleet() -> ChaosFaults {
        ChaosFaults {
            lease_expiry: 0.08,
            ..ChaosFaults::moderate()
        }
    }

    /// Parses `name=value,...`: everything [`SimFaults::parse_list`] takes, plus `crash=R`
    /// and `lease_expiry=R` (`all=R` sets those rates too). Empty or `none` gives
    /// [`ChaosFaults::none`].
    pub fn parse_list(list: &str) -> Result<ChaosFaults, SimFaultsError> {
        let mut crash = 0.0;
        let mut lease_expiry = 0.0;
        let mut sim_items = Vec::new();
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let name = item.split_once('=').map_or(item, |(n, _)| n.trim());
            if name == "crash" || name == "lease_expiry" || name == "all" {
                let value = item.split_once('=').map_or("", |(_, v)| v.trim());
                let rate = match value.parse::<f64>() {
                    Ok(r) if (0.0..=1.0).contains(&r) => r,
                    _ => {
                        return Err(SimFaultsError::BadValue {
                            name: name.to_string(),
                            value: value.to_string(),
                            expected: "a rate between 0 and 1",
                        })
                    }
                };
                match name {
                    "crash" => {
                        crash = rate;
                        continue;
                    }
                    "lease_expiry" => {
                        lease_expiry = rate;
                        continue;
                    }
                    _ => {
                        crash = rate;
                        lease_expiry = rate;
                    }
                }
            }
            sim_items.push(item);
        }
        let sim = SimFaults::parse_list(&sim_items.join(",")).map_err(|e| match e {
            SimFaultsError::UnknownKind { name, known } => SimFaultsError::UnknownKind {
                name,
                known: format!("{known}, crash, lease_expiry"),
            },
            other => other,
        })?;
        Ok(ChaosFaults {
            sim,
            crash,
            lease_expiry,
        })
    }

    /// The list form, every field included (`lease_expiry` when it is not 0), which
    /// [`ChaosFaults::parse_list`] reads back.
    pub fn to_list(&self) -> String {
        let mut list = format!("{},crash={}", self.sim.to_list(), self.crash);
        if self.lease_expiry > 0.0 {
            list.push_str(&format!(",lease_expiry={}", self.lease_expiry));
        }
        list
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// The first seed.
    pub first_seed: u64,
    /// How many seeds, from `first_seed` up.
    pub seeds: u64,
    /// Tasks per seed, driven concurrently.
    pub tasks: u32,
    /// The faults.
    pub faults: ChaosFaults,
    /// A bug to plant (to show the checker catches it).
    #[doc(hidden)]
    pub planted_bug: Option<PlantedBug>,
    /// Seeds run at once, each on its own thread.
    pub jobs: usize,
    /// Where each seed's data dir is made (and kept, if it violates an invariant; a violating
    /// seed's dir on the RAM disk moves to the system temp dir instead, unless `keep_all`).
    pub work_dir: PathBuf,
    /// Keep every seed's data dir, not only violating ones.
    pub keep_all: bool,
    /// Run against an in-process fake Vercel server through the real Vercel client, on real
    /// sockets and real time, instead of the simulated platform (see the `http` module).
    pub http: bool,
    /// Run several engines on one shared PostgreSQL store instead of one engine on its own
    /// SQLite file (see the `fleet` module; feature `postgres`).
    pub fleet: Option<FleetOptions>,
}

/// `taskbox chaos --fleet N --store URL`: several engines sharing one PostgreSQL store.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Engines per seed (2 or 3 is the point: a takeover needs another engine).
    pub engines: u32,
    /// A PostgreSQL server's URL whose user may create databases: each seed runs in a scratch
    /// database of its own there (dropped when the seed is clean).
    pub store: String,
}

impl ChaosOptions {
    /// `seeds` seeds from `first_seed`, `tasks` tasks each, moderate faults, one job, data
    /// dirs under the system temp dir.
    pub fn new(first_seed: u64, seeds: u64, tasks: u32) -> ChaosOptions {
        ChaosOptions {
            first_seed,
            seeds,
            tasks,
            faults: ChaosFaults::moderate(),
            planted_bug: None,
            jobs: 1,
            work_dir: default_work_dir(),
            keep_all: false,
            http: false,
            fleet: None,
        }
    }

    /// The command that reruns exactly `seed` of this run.
    pub fn repro_command(&self, seed: u64) -> String {
        let mut cmd = format!(
            "taskbox chaos --seed {seed} --tasks {} --faults '{}'",
            self.tasks,
            self.faults.to_list()
        );
        if self.http {
            cmd.push_str(" --http");
        }
        if let Some(f) = &self.fleet {
            cmd.push_str(&format!(
                " --fleet {} --store '{}'",
                f.engines,
                crate::redact::redact(&f.store)
            ));
        }
        if let Some(bug) = self.planted_bug {
            cmd.push_str(&format!(" --planted-bug {bug}"));
        }
        cmd
    }
}

/// The RAM disk seeds run on when it is there.
const RAM_DISK: &str = "/dev/shm";

/// Where seeds' data dirs go by default: `/dev/shm` when it is a writable directory (a RAM
/// disk, where SQLite's fsyncs cost nothing, so thousands of seeds run in minutes), otherwise
/// the system temp dir. The store is the same real SQLite store either way. Nothing stays on
/// the RAM disk after a run: a violating seed's data dir moves to the system temp dir (unless
/// [`ChaosOptions::keep_all`] keeps every seed's where it is).
pub fn default_work_dir() -> PathBuf {
    let shm = Path::new(RAM_DISK);
    let writable = std::fs::metadata(shm)
        .map(|m| m.is_dir() && !m.permissions().readonly())
        .unwrap_or(false);
    if writable {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Why a chaos run could not be carried out (as opposed to finding a violation).
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// A seed's data dir could not be made or removed.
    #[error("chaos seed {seed}: cannot prepare the data dir {path}")]
    DataDir {
        /// The seed.
        seed: u64,
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The tokio runtime could not be built.
    #[error("chaos seed {seed}: cannot start a tokio runtime")]
    Runtime {
        /// The seed.
        seed: u64,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The engine could not be opened.
    #[error("chaos seed {seed}: cannot open the engine")]
    Engine {
        /// The seed.
        seed: u64,
        /// The cause.
        #[source]
        source: Box<EngineError>,
    },
    /// The fake Vercel server or the client could not be set up (`--http`).
    #[error("chaos seed {seed}: {message}")]
    Http {
        /// The seed.
        seed: u64,
        /// What failed.
        message: String,
    },
    /// The fleet's scratch database or its engines could not be set up (`--fleet`).
    #[error("chaos seed {seed}: {message}")]
    Fleet {
        /// The seed.
        seed: u64,
        /// What failed.
        message: String,
    },
    /// The store could not be read back for checking.
    #[error("chaos seed {seed}: cannot read the store back")]
    Store {
        /// The seed.
        seed: u64,
        /// The cause.
        #[source]
        source: Box<StoreError>,
    },
}

/// What one seed did and what the checker found.
#[derive(Debug, Clone, Serialize)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Tasks driven.
    pub tasks: u32,
    /// What the seed did (flattened: the report reads as one object).
    #[serde(flatten)]
    pub counts: RunCounts,
    /// Snapshots complete in the store that the platform expired (the `snapshot_gone` fault):
    /// not lost by taskbox, reported separately.
    pub snapshots_expired: Vec<String>,
    /// Sandboxes no task ever adopted: made by a create that a crashed engine sent and that
    /// landed after the task had moved on. Reconciliation stops them (checked).
    pub stale_sandboxes: u64,
    /// Broken invariants (must be none).
    pub violations: Vec<Violation>,
    /// A hash of the journal and the platform's final state: equal for equal runs (empty for
    /// `--http` runs, which are on real time).
    pub digest: String,
    /// Virtual time the seed covered (wall time, for `--http` runs).
    pub virtual_ms: u64,
    /// The kept `TASKBOX_HOME` of this seed (its store is at `data/taskbox.db`), if kept.
    pub home: Option<PathBuf>,
    /// The seed's journal exported for `taskbox replay --journal FILE`, if kept.
    pub journal_file: Option<PathBuf>,
    /// The command that reruns this seed.
    pub repro: String,
}

/// What one seed did, or (summed) many: the counts a [`SeedReport`] and the [`Totals`] share.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunCounts {
    /// Workload steps taken (commands, suspends, resumes, waits).
    pub steps: u64,
    /// Requests that the engine answered with a result.
    pub requests_ok: u64,
    /// Requests that failed (after retries, or a sandbox expired under them): reported to the
    /// caller, which is correct behaviour under faults.
    pub requests_failed: u64,
    /// Requests cut off by an engine crash.
    pub requests_interrupted: u64,
    /// Faults injected, by kind (the [`SimFaults`] names, and `crash`).
    pub faults: BTreeMap<String, u64>,
    /// Calls the platform received.
    pub provider_calls: u64,
    /// `--fleet`: requests answered "the task moved to another server" (a takeover cut them
    /// off; counted among the interrupted too).
    #[serde(skip_serializing_if = "is_zero")]
    pub requests_moved: u64,
    /// `--fleet`: times a task's journal passed to a newer fencing token under another engine.
    #[serde(skip_serializing_if = "is_zero")]
    pub takeovers: u64,
    /// Checkpoints answered.
    #[serde(skip_serializing_if = "is_zero")]
    pub checkpoints: u64,
    /// Rewinds answered.
    #[serde(skip_serializing_if = "is_zero")]
    pub rewinds: u64,
    /// Rewinds whose restored files were compared with the platform's record of the snapshot
    /// rewound to (the rest: the command after it failed, or a fault made the engine restore
    /// from elsewhere and say so).
    #[serde(skip_serializing_if = "is_zero")]
    pub rewinds_checked: u64,
    /// What the journal shows: retries, restores, fallbacks, files lost, recoveries, forks.
    pub journal: JournalCounts,
}

impl RunCounts {
    fn add(&mut self, r: &RunCounts) {
        self.steps += r.steps;
        self.requests_ok += r.requests_ok;
        self.requests_failed += r.requests_failed;
        self.requests_interrupted += r.requests_interrupted;
        for (k, v) in &r.faults {
            *self.faults.entry(k.clone()).or_default() += v;
        }
        self.provider_calls += r.provider_calls;
        self.requests_moved += r.requests_moved;
        self.takeovers += r.takeovers;
        self.checkpoints += r.checkpoints;
        self.rewinds += r.rewinds;
        self.rewinds_checked += r.rewinds_checked;
        let j = &mut self.journal;
        j.entries += r.journal.entries;
        j.retries += r.journal.retries;
        j.restores += r.journal.restores;
        j.fallbacks += r.journal.fallbacks;
        j.reruns += r.journal.reruns;
        j.files_lost += r.journal.files_lost;
        j.recoveries += r.journal.recoveries;
        j.forks += r.journal.forks;
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Sums over many seeds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    /// Tasks driven.
    pub tasks: u64,
    /// The seeds' counts, summed (flattened).
    #[serde(flatten)]
    pub counts: RunCounts,
    /// Snapshots the platform expired.
    pub snapshots_expired: u64,
    /// Sandboxes no task adopted (late creates of a crashed engine).
    pub stale_sandboxes: u64,
    /// Violations.
    pub violations: u64,
    /// Virtual time covered.
    pub virtual_ms: u64,
}

impl Totals {
    fn add(&mut self, r: &SeedReport) {
        self.tasks += u64::from(r.tasks);
        self.counts.add(&r.counts);
        self.snapshots_expired += r.snapshots_expired.len() as u64;
        self.stale_sandboxes += r.stale_sandboxes;
        self.violations += r.violations.len() as u64;
        self.virtual_ms += r.virtual_ms;
    }
}

/// The outcome of many seeds.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosReport {
    /// The first seed.
    pub first_seed: u64,
    /// Seeds run.
    pub seeds_run: u64,
    /// Tasks per seed.
    pub tasks_per_seed: u32,
    /// The faults, in list form (`--faults`).
    pub faults: String,
    /// The planted bug, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planted_bug: Option<PlantedBug>,
    /// Whether the run was against the fake Vercel server (real time: no digest).
    pub http: bool,
    /// Engines per seed of a `--fleet` run (real time: no digest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet: Option<u32>,
    /// Sums over all seeds.
    pub totals: Totals,
    /// Every seed that violated an invariant, in seed order, in full.
    pub violating_seeds: Vec<SeedReport>,
    /// A hash of every seed's digest, in seed order: equal for equal runs.
    pub digest: String,
    /// Wall time of the run.
    pub wall_ms: u64,
}

impl ChaosReport {
    /// Whether every invariant held in every seed.
    pub fn is_clean(&self) -> bool {
        self.totals.violations == 0
    }
}

/// Runs `opts.seeds` seeds on `opts.jobs` threads; `progress` is called after each seed (from
/// the thread that ran it). Stops at the first seed that cannot be run at all.
// Reads the wall clock only to report how long the run took.
#[allow(clippy::disallowed_methods)]
pub fn run(
    opts: &ChaosOptions,
    progress: &(dyn Fn(&SeedReport) + Sync),
) -> Result<ChaosReport, ChaosError> {
    let started = Instant::now();
    let next = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    struct Acc {
        totals: Totals,
        violating: Vec<SeedReport>,
        digests: Vec<(u64, String)>,
        error: Option<ChaosError>,
    }
    let acc = Mutex::new(Acc {
        totals: Totals::default(),
        violating: Vec::new(),
        digests: Vec::new(),
        error: None,
    });
    let jobs = opts.jobs.clamp(1, 64).min(opts.seeds.max(1) as usize);
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= opts.seeds || failed.load(Ordering::Relaxed) {
                    break;
                }
                let seed = opts.first_seed.wrapping_add(i);
                let result = run_seed(seed, opts);
                let mut a = acc.lock().unwrap_or_else(|p| p.into_inner());
                match result {
                    Ok(report) => {
                        a.totals.add(&report);
                        a.digests.push((seed, report.digest.clone()));
                        progress(&report);
                        if !report.violations.is_empty() {
                            a.violating.push(report);
                        }
                    }
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        if a.error.is_none() {
                            a.error = Some(e);
                        }
                    }
                }
            });
        }
    });
    let mut a = acc.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = a.error {
        return Err(e);
    }
    a.violating.sort_by_key(|r| r.seed);
    a.digests.sort();
    let mut h = Digest::new(&[]);
    for (seed, d) in &a.digests {
        h.update(&seed.to_le_bytes());
        h.update(d.as_bytes());
    }
    Ok(ChaosReport {
        first_seed: opts.first_seed,
        seeds_run: a.digests.len() as u64,
        tasks_per_seed: opts.tasks,
        faults: opts.faults.to_list(),
        planted_bug: opts.planted_bug,
        http: opts.http,
        fleet: opts.fleet.as_ref().map(|f| f.engines),
        totals: a.totals,
        violating_seeds: a.violating,
        digest: if opts.http || opts.fleet.is_some() {
            String::new()
        } else {
            h.finish()
        },
        wall_ms: started.elapsed().as_millis() as u64,
    })
}
