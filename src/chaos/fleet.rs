//! `taskbox chaos --fleet N --store postgres://…`: several engines sharing one PostgreSQL store,
//! as the servers of a fleet do, on real time.
//!
//! Each seed gets a scratch database on the given server (created, and dropped when the seed is
//! clean) and `N` engines in this process, each with its own data dir and its own name in the
//! `leases` table, all on one simulated platform ([`SimProvider`] on real time, its delays
//! shortened to fit a lease of one second). Every task's worker sends its requests to one engine
//! and follows the answers a client of a fleet gets: "the task lives on engine X"
//! (`task_elsewhere`) sends it there; "the task moved" (`task_moved`) or a stopped engine sends
//! it elsewhere. Besides the platform's faults, the seed injects:
//! - **crashes**: an engine's event loop is killed (as by `kill -9`: its leases are left to
//!   expire) and a new one, under a new name, starts on the same store a moment later;
//! - **lease expiries**: the database expires one engine's leases behind its back — what it
//!   sees when a server's renewals stop reaching it (a partition, a pause) — while the engine
//!   still believes them fresh. The next request for such a task on another engine takes it
//!   over with a newer token; from then on only fencing keeps the old owner from writing.
//!
//! Then faults go off, every engine but the first stops cleanly (letting its leases go), every
//! task runs one last command on the first, gc reconciles, and the checks of the simulated seeds
//! run on the shared journal, plus **one-writer-per-token** on who wrote each entry
//! (`journal_writers`). Real time is not reproducible: a seed names the workload and the fault
//! plan, not the interleaving, so these runs have no digest.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::check::{self, FencedWrite, Invariant, PlatformSandbox, PlatformSnapshot, Violation};
use super::driver::{self, Tally};
use super::witness::Witness;
use super::workload::{self, Flavor, Op, TaskPlan};
use super::{ChaosError, ChaosOptions, FleetOptions, SeedReport};
use crate::clock::{Clock, TokioClock};
use crate::config::{Config, StoreSetting};
use crate::engine::{EngineError, Orchestrator};
use crate::provider::sim::{SimFaults, SimProvider};
use crate::provider::SandboxProvider;
use crate::retry::Jitter;
use crate::rng::SplitMix64;
use crate::store::{PgStore, PgTarget, Store, StoreError};
use crate::TaskId;

/// Salts that keep the workload's, the faults' and the jitter's streams apart.
const WORKLOAD_SALT: u64 = 0x464C_4545_0000_0001;
const FAULT_SALT: u64 = 0x464C_4545_0000_0002;
const JITTER_SALT: u64 = 0x464C_4545_0000_0003;
/// Virtual time at which the clock of every seed starts (as on the simulator).
const START_MS: u64 = super::START_MS;
/// The simulated platform's cap on a sandbox's lifetime (matches the config below).
const MAX_LIFETIME_MS: u64 = 16_000;
/// Real time the workload of a seed may take before the seed is declared stuck.
const WORKLOAD_BOUND: Duration = Duration::from_secs(120);
/// How long a worker follows "the task lives elsewhere" answers for one step before it calls
/// the task stuck: far more than a lease (one second) and a crashed engine's restart.
const ELSEWHERE_BOUND: Duration = Duration::from_secs(20);
/// Real time, with faults off, for calls in flight to finish.
const SETTLE: Duration = Duration::from_millis(1_500);
/// The longest an engine stays dead after a crash.
const DEAD_MS: u64 = 1_500;

/// The engine configuration of a fleet seed: a lease of one second, lifetimes of seconds.
fn config(store_url: &str) -> Config {
    let mut c = Config::default();
    c.terminal.store = StoreSetting::postgres(store_url);
    c.terminal.lease_seconds = 1;
    c.terminal.lifetime_seconds = 2;
    c.terminal.sandbox_timeout_seconds = 8;
    c.terminal.max_sandbox_lifetime_seconds = MAX_LIFETIME_MS / 1000;
    c.terminal.checkpoint_margin_seconds = 2;
    c.terminal.timeout = 5;
    c.terminal.keep_snapshots = 2;
    c
}

/// The platform's faults, their delays cut to real-time size (a retry-after of seconds would
/// outlast every lease of the seed).
fn real_time(f: &SimFaults) -> SimFaults {
    let mut f = f.clone();
    f.retry_after_ms = f.retry_after_ms.min(300);
    f.timeout_ms = f.timeout_ms.min(500);
    f.snapshot_slow_ms = f.snapshot_slow_ms.min(1_500);
    f.snapshot_gone_after_ms = f.snapshot_gone_after_ms.min(8_000);
    f.latency_min_ms = f.latency_min_ms.min(20);
    f.latency_max_ms = f.latency_max_ms.min(30);
    f
}

/// The name of engine `k` at `epoch` in the `leases` table.
fn owner(k: usize, epoch: u64) -> String {
    format!("engine-{k}.{epoch}")
}

/// Which engine an owner name is (`engine-K.E`), and its epoch.
fn parse_owner(name: &str) -> Option<(usize, u64)> {
    let (k, e) = name.strip_prefix("engine-")?.split_once('.')?;
    Some((k.parse().ok()?, e.parse().ok()?))
}

/// Runs one fleet seed in a scratch database of `fleet.store`'s server (on its own runtime).
pub(super) fn run_seed(
    seed: u64,
    opts: &ChaosOptions,
    fleet: &FleetOptions,
    home: &Path,
) -> Result<SeedReport, ChaosError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let setup = |what: &str, e: &dyn std::fmt::Display| ChaosError::Fleet {
        seed,
        message: format!("{what}: {e}"),
    };
    let admin =
        PgTarget::parse(&fleet.store).map_err(|e| setup("--store is not a usable URL", &e))?;
    let name = format!(
        "taskbox_chaos_{}_{seed}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let (target, url) = PgTarget::url_with_database(&fleet.store, &name)
        .map_err(|e| setup("--store is not a usable URL", &e))?;
    PgStore::scratch_database(&admin, &name, true).map_err(|e| {
        setup(
            "cannot create the seed's scratch database (the --store user needs CREATEDB)",
            &e,
        )
    })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| ChaosError::Runtime { seed, source })?;
    let result = rt.block_on(seed_run(
        seed,
        opts,
        fleet.engines.max(1) as usize,
        &url,
        home,
    ));
    drop(rt);
    match &result {
        Ok(r) if r.violations.is_empty() && !opts.keep_all => {
            PgStore::scratch_database(&admin, &name, false)
                .map_err(|e| setup("cannot drop the seed's scratch database", &e))?;
        }
        Ok(_) => {
            // Kept for diagnosis: say where (without the password).
            let _ = std::fs::write(home.join("store.txt"), format!("{}\n", target.redacted()));
        }
        Err(_) => {
            let _ = PgStore::scratch_database(&admin, &name, false);
        }
    }
    result
}

/// One engine of the fleet: the current orchestrator and its epoch (bumped by each restart).
struct Engine {
    slot: Mutex<(u64, Orchestrator)>,
    crash_lock: tokio::sync::Mutex<()>,
    /// Stopped for good (the settling stops every engine but the first): the load balancer
    /// sends nothing there any more.
    stopped: AtomicBool,
}

/// The fleet of a seed.
struct Fleet {
    seed: u64,
    engines: Vec<Engine>,
    home: std::path::PathBuf,
    config: Config,
    provider: Arc<dyn SandboxProvider>,
    clock: Arc<dyn Clock>,
    /// A connection of the fault injector's own (lease expiries).
    injector: Arc<PgStore>,
    crashes: AtomicU64,
    lease_expiries: AtomicU64,
    /// Answers "the task moved to another server" the workers got.
    moved: AtomicU64,
    pending: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    errors: Mutex<Vec<String>>,
}

impl Fleet {
    async fn open_engine(&self, k: usize, epoch: u64) -> Result<Orchestrator, EngineError> {
        open_engine(
            self.seed,
            &self.home,
            &self.config,
            &self.provider,
            &self.clock,
            k,
            epoch,
        )
        .await
    }

    fn current(&self, k: usize) -> (u64, Orchestrator) {
        self.engines[k]
            .slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether engine `k` still takes requests (not stopped by the settling).
    fn in_service(&self, k: usize) -> bool {
        !self.engines[k].stopped.load(Ordering::Relaxed)
    }

    fn error(&self, e: String) {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e);
    }

    /// Kills engine `k` `after_ms` from now (its leases are left to expire) and starts a new
    /// one under a new name `dead_ms` later.
    // Waits on the runtime's clock: the crash point and the dead time are the plan's.
    #[allow(clippy::disallowed_methods)]
    fn schedule_crash(self: &Arc<Self>, k: usize, after_ms: u64, dead_ms: u64) {
        let f = self.clone();
        let h = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(after_ms)).await;
            let _one_at_a_time = f.engines[k].crash_lock.lock().await;
            let (epoch, orch) = f.current(k);
            orch.abort().await;
            drop(orch);
            f.crashes.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(dead_ms)).await;
            match f.open_engine(k, epoch + 1).await {
                Ok(o) => {
                    *f.engines[k].slot.lock().unwrap_or_else(|p| p.into_inner()) = (epoch + 1, o);
                }
                Err(e) => f.error(format!("could not restart engine {k} after a crash: {e}")),
            }
        });
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(h);
    }

    /// Expires engine `k`'s leases in the database `after_ms` from now, behind its back, and
    /// then (as a second client of the fleet would) asks another engine to resume `task`:
    /// that engine takes the task over with a newer token while `k` may still be driving it —
    /// a command running, a snapshot in flight — and only fencing stops `k` from writing.
    // Waits on the runtime's clock: the moment is the plan's.
    #[allow(clippy::disallowed_methods)]
    fn schedule_lease_expiry(self: &Arc<Self>, k: usize, after_ms: u64, task: TaskId) {
        let f = self.clone();
        let h = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(after_ms)).await;
            let name = owner(k, f.current(k).0);
            let store = f.injector.clone();
            match tokio::task::spawn_blocking(move || store.expire_leases_of(&name)).await {
                Ok(Ok(n)) if n > 0 => {
                    f.lease_expiries.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => f.error(format!("could not expire engine {k}'s leases: {e}")),
                Err(e) => f.error(format!("the lease expiry panicked: {e}")),
            }
            let other = (k + 1) % f.engines.len();
            let (_, orch) = f.current(other);
            match orch.resume(&task).await {
                // Taken over and resumed; refused for a reason of its own; told where the task
                // lives (renewed meanwhile, or its first commit still to come); cut off.
                Ok(_)
                | Err(EngineError::Request { .. })
                | Err(EngineError::NoTask { .. })
                | Err(EngineError::Stopped)
                | Err(EngineError::Store(
                    StoreError::LeaseHeld { .. } | StoreError::LeaseLost { .. },
                )) => {}
                Err(e) => f.error(format!(
                    "task {task}: a resume on engine {other} after a lease expiry failed: {e}"
                )),
            }
        });
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(h);
    }

    async fn wait_pending(&self) {
        loop {
            let hs: Vec<_> =
                std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
            if hs.is_empty() {
                return;
            }
            for h in hs {
                let _ = h.await;
            }
        }
    }

    /// Sends `op` for `task` to the engine `route` points at, following "the task lives on
    /// engine X" answers (for at most [`ELSEWHERE_BOUND`]); `route` is left where the task
    /// was last found.
    // Waits on the runtime's clock between tries.
    #[allow(clippy::disallowed_methods)]
    async fn send(&self, task: &TaskId, op: &Op, route: &mut usize) -> Result<(), EngineError> {
        let n = self.engines.len();
        let started = tokio::time::Instant::now();
        loop {
            let (_, orch) = self.current(*route);
            let result = match op {
                Op::Run { command } => orch.run(task, command, None).await.map(drop),
                Op::Suspend => orch.suspend(task).await.map(drop),
                Op::Resume => orch.resume(task).await.map(drop),
                // The fleet's workload forks, checkpoints and rewinds nothing, and waits outside.
                Op::Fork { .. } | Op::Wait { .. } | Op::Checkpoint | Op::Rewind { .. } => Ok(()),
            };
            drop(orch);
            let Err(EngineError::Store(StoreError::LeaseHeld { owner: held_by, .. })) = &result
            else {
                return result;
            };
            if started.elapsed() > ELSEWHERE_BOUND {
                return result;
            }
            // To the engine that holds it, if that one is alive; otherwise to the next one in
            // service, which takes the task over once the dead one's lease expires.
            *route = match parse_owner(held_by) {
                Some((k, epoch)) if k < n && self.in_service(k) && self.current(k).0 == epoch => k,
                _ => (1..=n)
                    .map(|i| (*route + i) % n)
                    .find(|&k| self.in_service(k))
                    .unwrap_or(*route),
            };
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn open_engine(
    seed: u64,
    home: &Path,
    config: &Config,
    provider: &Arc<dyn SandboxProvider>,
    clock: &Arc<dyn Clock>,
    k: usize,
    epoch: u64,
) -> Result<Orchestrator, EngineError> {
    Orchestrator::builder(home.join(format!("engine-{k}")), config.clone())
        .provider(provider.clone())
        .clock(clock.clone())
        .jitter(Jitter::Seeded(SplitMix64::new(
            seed ^ JITTER_SALT ^ ((k as u64) << 32) ^ epoch,
        )))
        .owner(owner(k, epoch))
        // A restarted engine reconciles orphans in the background, as `taskbox` does (gc
        // runs on one engine of the fleet at a time).
        .reconcile_on_start(epoch > 0)
        .open()
        .await
}

/// One task's workload: each step to the engine the task was last found on, with the crashes
/// and lease expiries the fault stream draws for it.
// A `Wait` step sleeps on the runtime's clock: idling is part of the workload.
#[allow(clippy::disallowed_methods)]
async fn worker(f: Arc<Fleet>, plan: TaskPlan, mut faults: SplitMix64, lease_expiry: f64) -> Tally {
    let mut tally = Tally::default();
    let n = f.engines.len();
    let task = match TaskId::new(&plan.task_id) {
        Ok(t) => t,
        Err(e) => {
            f.error(format!("bad task id {}: {e}", plan.task_id));
            return tally;
        }
    };
    let mut route = faults.between(0, n as u64 - 1) as usize;
    let mut created = false;
    for step in plan.steps {
        tally.steps += 1;
        if let Some(after) = step.crash_after_ms {
            // Mostly the engine driving the task, now and then another.
            let k = if faults.chance(0.7) {
                route
            } else {
                faults.between(0, n as u64 - 1) as usize
            };
            f.schedule_crash(k, after, faults.between(0, DEAD_MS));
        }
        if faults.chance(lease_expiry) {
            f.schedule_lease_expiry(route, faults.between(0, 1_000), task.clone());
        }
        if let Op::Wait { ms } = step.op {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            continue;
        }
        let result = f.send(&task, &step.op, &mut route).await;
        if matches!(step.op, Op::Run { .. })
            && matches!(result, Ok(()) | Err(EngineError::Request { .. }))
        {
            created = true;
        }
        match result {
            Ok(()) => tally.ok += 1,
            Err(EngineError::Request { .. }) => tally.failed += 1,
            Err(EngineError::NoTask { .. }) if !created => tally.failed += 1,
            // Cut off by a crash, or by a takeover: the caller sends the next request
            // elsewhere (a client of a fleet retries through the load balancer).
            Err(EngineError::Stopped) => {
                tally.interrupted += 1;
                route = (route + 1) % n;
            }
            Err(EngineError::Store(StoreError::LeaseLost { .. })) => {
                tally.interrupted += 1;
                f.moved.fetch_add(1, Ordering::Relaxed);
                route = (route + 1) % n;
            }
            Err(e) => {
                tally.failed += 1;
                f.error(format!("task {task}: {} failed: {e}", step.op.kind()));
            }
        }
    }
    tally
}

// Reads the wall clock only to report how long the seed took.
#[allow(clippy::disallowed_methods)]
async fn seed_run(
    seed: u64,
    opts: &ChaosOptions,
    engines: usize,
    url: &str,
    home: &Path,
) -> Result<SeedReport, ChaosError> {
    let started = Instant::now();
    let engine_err = |source| ChaosError::Engine {
        seed,
        source: Box::new(source),
    };
    let clock = Arc::new(TokioClock::starting_at(START_MS));
    let clock_dyn: Arc<dyn Clock> = clock.clone();
    let sim = Arc::new(
        SimProvider::new(seed, real_time(&opts.faults.sim), clock_dyn.clone())
            .with_max_lifetime_ms(MAX_LIFETIME_MS),
    );
    let engine_side: Arc<dyn SandboxProvider> = match opts.planted_bug {
        Some(bug) => bug.wrap(sim.clone()),
        None => sim.clone(),
    };
    let witness = Arc::new(Witness::new(
        engine_side,
        Some(sim.clone()),
        clock_dyn.clone(),
    ));
    let provider: Arc<dyn SandboxProvider> = witness.clone();
    let cfg = config(url);
    let mut opened = Vec::new();
    for k in 0..engines {
        let o = open_engine(seed, home, &cfg, &provider, &clock_dyn, k, 0)
            .await
            .map_err(engine_err)?;
        opened.push(Engine {
            slot: Mutex::new((0, o)),
            crash_lock: tokio::sync::Mutex::new(()),
            stopped: AtomicBool::new(false),
        });
    }
    let injector = {
        let url = url.to_string();
        tokio::task::spawn_blocking(move || Store::connect(&url))
            .await
            .map_err(|e| ChaosError::Fleet {
                seed,
                message: format!("connecting the fault injector panicked: {e}"),
            })?
    };
    let injector = match injector {
        Ok(Store::Postgres(pg)) => Arc::new(pg),
        Ok(_) => {
            return Err(ChaosError::Fleet {
                seed,
                message: "the fleet's store is not PostgreSQL".into(),
            })
        }
        Err(e) => return Err(engine_err(e.into())),
    };
    let f = Arc::new(Fleet {
        seed,
        engines: opened,
        home: home.to_path_buf(),
        config: cfg,
        provider,
        clock: clock_dyn.clone(),
        injector,
        crashes: AtomicU64::new(0),
        lease_expiries: AtomicU64::new(0),
        moved: AtomicU64::new(0),
        pending: Mutex::new(Vec::new()),
        errors: Mutex::new(Vec::new()),
    });

    // ---- the workload, under faults ----
    let (plans, task_ids) = workload::plan(
        seed ^ WORKLOAD_SALT,
        opts.tasks,
        opts.faults.crash,
        Flavor::Fleet,
    );
    let mut fault_rng = SplitMix64::new(seed ^ FAULT_SALT);
    let workers: Vec<_> = plans
        .into_iter()
        .map(|p| {
            tokio::spawn(worker(
                f.clone(),
                p,
                fault_rng.fork(),
                opts.faults.lease_expiry,
            ))
        })
        .collect();
    let mut violations = Vec::new();
    let tally =
        driver::join_workers(workers, WORKLOAD_BOUND, &mut violations, |e| f.error(e)).await;
    f.wait_pending().await;

    // ---- faults off; every engine but the first stops cleanly; the first settles all ----
    sim.set_faults(SimFaults::none());
    settle(&f, &task_ids, &mut violations).await;

    // ---- the history, checked against the platform's records ----
    let read = {
        let url = url.to_string();
        tokio::task::spawn_blocking(move || read_store(seed, &url))
            .await
            .map_err(|e| ChaosError::Fleet {
                seed,
                message: format!("reading the store back panicked: {e}"),
            })?
    };
    let (rec, writes) = read?;
    let installation = rec.installation.clone();
    let platform_sandboxes: Vec<PlatformSandbox> = sim
        .all_sandboxes()
        .iter()
        .filter(|s| s.installation_id == installation)
        .map(Into::into)
        .collect();
    let platform_snapshots: Vec<PlatformSnapshot> = sim
        .snapshots()
        .iter()
        .filter(|s| s.installation_id == installation)
        .map(Into::into)
        .collect();
    let live = driver::live(&platform_sandboxes);
    violations.extend(check::one_writer_per_token(&rec.entries, &writes));
    let data_dir = home.join("data");
    let (checked, journal_file) = driver::check_and_export(
        driver::Evidence {
            data_dir: &data_dir,
            task_ids: &task_ids,
            rec: &rec,
            sandboxes: &platform_sandboxes,
            snapshots: &platform_snapshots,
            live: &live,
            deleted_at: &witness.deleted_at(),
            now: clock.now_ms(),
            keep_all: opts.keep_all,
            idle: None,
        },
        &mut violations,
    );
    let stats = sim.stats();
    let mut faults: BTreeMap<String, u64> = stats.faults.clone();
    for (name, n) in [
        ("crash", f.crashes.load(Ordering::Relaxed)),
        ("lease_expiry", f.lease_expiries.load(Ordering::Relaxed)),
    ] {
        if n > 0 {
            faults.insert(name.into(), n);
        }
    }
    let mut counts = tally.counts(faults, stats.calls.values().sum(), checked.counts);
    counts.requests_moved = f.moved.load(Ordering::Relaxed);
    counts.takeovers = takeovers(&writes);
    Ok(SeedReport {
        counts,
        snapshots_expired: checked.expired,
        stale_sandboxes: checked.stale,
        violations,
        journal_file,
        ..driver::real_time_report(seed, opts, started)
    })
}

/// How many times a task's journal passed to a newer token under another owner.
fn takeovers(writes: &[FencedWrite]) -> u64 {
    let mut last: BTreeMap<&str, (i64, &str)> = BTreeMap::new();
    let mut n = 0;
    let mut sorted: Vec<&FencedWrite> = writes.iter().collect();
    sorted.sort_by_key(|w| (w.task_id.as_str(), w.task_seq));
    for w in sorted {
        if let Some((token, owner)) = last.get(w.task_id.as_str()) {
            if *token != w.token && *owner != w.owner {
                n += 1;
            }
        }
        last.insert(&w.task_id, (w.token, &w.owner));
    }
    n
}

/// Faults are off: lets calls in flight finish, stops every engine but the first cleanly
/// (their leases go at once), runs one last command in every task on the first (which takes
/// each task over and recovers it), reconciles, and stops it.
// Settling is a wait on the runtime's clock.
#[allow(clippy::disallowed_methods)]
async fn settle(f: &Arc<Fleet>, task_ids: &[String], violations: &mut Vec<Violation>) {
    tokio::time::sleep(SETTLE).await;
    for k in 1..f.engines.len() {
        f.engines[k].stopped.store(true, Ordering::Relaxed);
        let (_, orch) = f.current(k);
        orch.shutdown_within(Duration::from_secs(60)).await;
    }
    let (_, first) = f.current(0);
    let ids = driver::tasks_to_settle(task_ids, &first, |e| f.error(e)).await;
    drop(first);
    for id in &ids {
        let Ok(task) = TaskId::new(id) else { continue };
        let cat = Op::Run {
            command: "cat f0".into(),
        };
        // A first failure may be honest (a sandbox found dead by this very command); the
        // second must not happen. "Moved" is not a failure: the lease of one second lapsed by
        // the engine's own clock (a loaded machine) before a provider call, and the task is
        // given up to be recovered at the next request — sent again, as a client would.
        let mut failures = Vec::new();
        for _ in 0..10 {
            let mut route = 0;
            match f.send(&task, &cat, &mut route).await {
                Ok(()) => break,
                Err(EngineError::Store(StoreError::LeaseLost { .. })) => {}
                Err(e) => {
                    failures.push(e.to_string());
                    if failures.len() == 2 {
                        break;
                    }
                }
            }
        }
        if failures.len() == 2 {
            violations.push(Violation::new(
                Invariant::Settles,
                Some(id),
                format!(
                    "with faults off, a command failed twice: {}",
                    failures.join("; then: ")
                ),
            ));
        }
    }
    let (_, first) = f.current(0);
    driver::reconcile(&first, violations).await;
    first.shutdown_within(Duration::from_secs(60)).await;
    for e in f.errors.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
        violations.push(Violation::new(Invariant::EngineError, None, e));
    }
}

/// Reads the shared store back: every task and journal, and who wrote each entry.
fn read_store(seed: u64, url: &str) -> Result<(driver::Recorded, Vec<FencedWrite>), ChaosError> {
    let store_err = |source| ChaosError::Store {
        seed,
        source: Box::new(source),
    };
    let store = Store::connect(url).map_err(store_err)?;
    let tasks = store.load_tasks().map_err(store_err)?;
    let mut entries = Vec::new();
    for id in store.task_ids().map_err(store_err)? {
        entries.extend(store.journal(&id).map_err(store_err)?);
    }
    entries.sort_by_key(|e| e.seq);
    let writes = match &store {
        Store::Postgres(pg) => pg
            .journal_writers()
            .map_err(store_err)?
            .into_iter()
            .map(|w| FencedWrite {
                task_id: w.task_id,
                task_seq: w.task_seq,
                token: w.token,
                owner: w.owner,
            })
            .collect(),
        _ => Vec::new(),
    };
    Ok((
        driver::Recorded {
            tasks,
            entries,
            installation: store.installation_id().to_string(),
        },
        writes,
    ))
}
