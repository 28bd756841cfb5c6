//! `taskbox chaos --http`: the same fault kinds one level down, on real sockets and real time.
//!
//! Each seed starts an in-process fake Vercel server ([`crate::fake::FakeServer`], real bash
//! sandboxes) on a loopback port and drives the real engine through the real Vercel client
//! ([`crate::provider::vercel`]). The seed decides the fault plan: 5xx rates (everywhere, and
//! more on snapshots and deletes), the status code, latency, how slowly snapshots settle, the
//! workload, where the engine crashes, and what a fault driver does every few hundred
//! milliseconds while the workload runs — arm a burst of 429s with `Retry-After`, lose the
//! answer of the next create, cut command streams, expire a live sandbox (mid-command, often),
//! expire a snapshot. While the engine is down after a crash, the platform stops a live
//! sandbox now and then (the stop endpoint, which snapshots a persistent sandbox): the restarted
//! engine must find that snapshot and restore the newest files from it (the restore check sees
//! the platform's snapshot as the newest candidate). Then faults go off, every task runs one last command, `gc` reconciles, and
//! the same checks as on the simulator compare the journal with what the server reports.
//!
//! Real time is not reproducible: a seed names the fault plan, not the interleaving, so these
//! runs have no digest. They are bounded: a few seconds of workload per seed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::check::{PlatformSandbox, PlatformSnapshot};
use super::driver::{self, Driver};
use super::witness::Witness;
use super::workload::{self, Flavor};
use super::{ChaosError, ChaosOptions, SeedReport};
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::core::Millis;
use crate::fake::{
    CutMode, DropCreate, DropMode, FakeOptions, FakeServer, Faults, RateLimitBurst, StreamCut,
};
use crate::provider::vercel::auth::Credentials;
use crate::provider::vercel::client::{SessionStatus, SnapshotStatus, VercelClient};
use crate::provider::vercel::settings::VercelSettings;
use crate::provider::vercel::VercelProvider;
use crate::provider::SandboxProvider;
use crate::rng::SplitMix64;

/// Salts that keep the fault plan's and the workload's streams apart.
const PLAN_SALT: u64 = 0x4854_5450_0000_0001;
const WORKLOAD_SALT: u64 = 0x4854_5450_0000_0002;
/// Real time the workload of a seed may take before the seed is declared stuck.
const WORKLOAD_BOUND: Duration = Duration::from_secs(120);
/// Real time, with faults off, for calls in flight to finish.
const SETTLE: Duration = Duration::from_millis(500);
/// How often the fault driver acts, at most and at least.
const TICK_MS: (u64, u64) = (100, 400);

/// The engine configuration of an HTTP chaos run: lifetimes of seconds.
fn config(base_url: &str) -> Config {
    let mut c = Config::default();
    c.terminal.backend = crate::provider::vercel::BACKEND.backend();
    c.terminal.vercel_api_url = base_url.to_string();
    c.terminal.container_cpu = 1;
    c.terminal.container_memory = 2048;
    c.terminal.lifetime_seconds = 2;
    c.terminal.sandbox_timeout_seconds = 8;
    c.terminal.max_sandbox_lifetime_seconds = 16;
    c.terminal.checkpoint_margin_seconds = 2;
    c.terminal.timeout = 5;
    c.terminal.keep_snapshots = 2;
    c
}

/// The per-tick chance of an injected event, from a per-call rate of the fault list.
fn per_tick(rate: f64) -> f64 {
    (rate * 5.0).clamp(0.0, 1.0)
}

/// Runs one seed against a fresh fake server (on its own multi-thread runtime).
pub(super) fn run_seed(
    seed: u64,
    opts: &ChaosOptions,
    home: &Path,
) -> Result<SeedReport, ChaosError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| ChaosError::Runtime { seed, source })?;
    rt.block_on(seed_run(seed, opts, home))
}

/// What the fault driver injected.
#[derive(Default)]
struct Injected {
    expired_sessions: AtomicU64,
    /// Sandboxes the platform stopped while the engine was dead.
    platform_stops: AtomicU64,
    /// The snapshots those stops took, by id: their task and when the stop answered (the
    /// checker needs them even when gc deleted them later, so that a restore that ignored
    /// one is caught).
    platform_snapshots: Mutex<BTreeMap<String, (String, Millis, String)>>,
    /// The snapshots it expired, with the time it asked (the server expires them during the
    /// call, within milliseconds).
    expired_snapshots: Mutex<BTreeMap<String, Millis>>,
}

// Reads the wall clock only to report how long the seed took.
#[allow(clippy::disallowed_methods)]
async fn seed_run(seed: u64, opts: &ChaosOptions, home: &Path) -> Result<SeedReport, ChaosError> {
    let started = Instant::now();
    let data_dir = home.join("data");
    let f = &opts.faults.sim;
    let mut plan = SplitMix64::new(seed ^ PLAN_SALT);
    let mut error_rate = BTreeMap::new();
    error_rate.insert("*".to_string(), f.server_error);
    error_rate.insert(
        "create_snapshot".to_string(),
        (f.server_error + f.snapshot_fail_transient).min(1.0),
    );
    error_rate.insert(
        "delete_snapshot".to_string(),
        (f.server_error + f.delete_fail).min(1.0),
    );
    let base_faults = Faults {
        seed,
        latency_ms: plan.between(f.latency_min_ms.min(30), f.latency_max_ms.min(30)),
        error_rate,
        error_status: [500, 502, 503][plan.between(0, 2) as usize],
        ..Faults::default()
    };
    let mut fake_opts = FakeOptions::new(home.join("fake"));
    fake_opts.faults = base_faults.clone();
    // A slow snapshot: the session answers 422 `sandbox_snapshotting` for a while.
    fake_opts.snapshot_settle_ms = if plan.chance(per_tick(f.snapshot_slow)) {
        1_500
    } else {
        50
    };
    let setup = |what: &str, e: &dyn std::fmt::Display| ChaosError::Http {
        seed,
        message: format!("{what}: {e}"),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| setup("cannot bind a loopback port for the fake server", &e))?;
    let fake = Arc::new(
        FakeServer::start(listener, fake_opts)
            .await
            .map_err(|e| setup("cannot start the fake Vercel server", &e))?,
    );
    let cfg = config(&fake.base_url());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let client = || {
        VercelClient::new(
            &fake.base_url(),
            Credentials::access_token("chaos-token", "team_chaos", "prj_chaos"),
            clock.clone(),
        )
        .map_err(|e| setup("cannot build the Vercel client", &e))
    };
    let settings = VercelSettings::from_config(&cfg.terminal, &|_| None)
        .map_err(|e| setup("the chaos config is not a valid Vercel config", &e))?;
    let vercel = Arc::new(VercelProvider::new(client()?, settings));
    let engine_side: Arc<dyn SandboxProvider> = match opts.planted_bug {
        Some(bug) => bug.wrap(vercel.clone()),
        None => vercel.clone(),
    };
    let witness = Arc::new(Witness::new(engine_side, None, clock.clone()));
    let (plans, task_ids) = workload::plan(
        seed ^ WORKLOAD_SALT,
        opts.tasks,
        opts.faults.crash,
        Flavor::Http,
    );
    let d = Driver::open(seed, &data_dir, witness.clone(), clock.clone(), cfg.clone())
        .await
        .map_err(|source| ChaosError::Engine {
            seed,
            source: Box::new(source),
        })?;
    // The fake keeps its snapshots' files to itself: a rewind is checked against what earlier
    // rewinds saved (undoable), not against the platform's record.
    d.set_rewind_check(driver::RewindCheck {
        probe: "cat f0; cat f1; cat f2; cat log".into(),
        view: None,
    });

    // ---- the workload, with the fault driver acting beside it ----
    let stop = Arc::new(AtomicBool::new(false));
    let injected = Arc::new(Injected::default());
    let fault_driver = tokio::spawn(drive_faults(
        fake.clone(),
        vercel.clone(),
        d.current().1.installation_id().to_string(),
        base_faults,
        opts.faults.clone(),
        SplitMix64::new(seed ^ PLAN_SALT).fork(),
        stop.clone(),
        injected.clone(),
    ));
    {
        // While the engine is dead after a crash, the platform stops one of the live
        // sandboxes, at even odds per crash (drawn from the plan's stream).
        let vercel = vercel.clone();
        let injected = injected.clone();
        let installation = d.current().1.installation_id().to_string();
        let odds = Arc::new(Mutex::new(SplitMix64::new(seed ^ PLAN_SALT).fork().fork()));
        d.set_while_dead(Arc::new(move || {
            let (vercel, injected, installation, odds) = (
                vercel.clone(),
                injected.clone(),
                installation.clone(),
                odds.clone(),
            );
            Box::pin(async move {
                let pick = {
                    let mut r = odds.lock().unwrap_or_else(|p| p.into_inner());
                    r.chance(0.5).then(|| r.between(0, 1_000))
                };
                let Some(pick) = pick else { return };
                let Ok(listed) = vercel.list_sandboxes(&installation).await else {
                    return;
                };
                let live: Vec<_> = listed.into_iter().filter(|s| s.live).collect();
                if live.is_empty() {
                    return;
                }
                let victim = &live[(pick % live.len() as u64) as usize];
                if let Ok(answer) = vercel.client().stop_session(&victim.id).await {
                    injected.platform_stops.fetch_add(1, Ordering::Relaxed);
                    if let (Some(snap), Some(task)) = (answer.snapshot, victim.task_id.clone()) {
                        let at = SystemClock.now_ms();
                        injected
                            .platform_snapshots
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(snap.id, (task, at, victim.id.clone()));
                    }
                }
            })
        }));
    }
    let (tally, mut violations) = driver::run_workload(&d, plans, WORKLOAD_BOUND).await;
    stop.store(true, Ordering::Relaxed);
    let _ = fault_driver.await;
    let _ = fake.set_faults(Faults::default());
    let (settled, crashes, _) = driver::settle(d, &task_ids, SETTLE).await;
    violations.extend(settled);

    // ---- the history, checked against what the server reports ----
    let rec = driver::read_store(seed, &data_dir)?;
    let truth = client()?;
    let now = clock.now_ms();
    let mut sandboxes = Vec::new();
    let mut seen = BTreeSet::new();
    for e in &rec.entries {
        let Some(sb) = e.task_after.sandbox.as_ref() else {
            continue;
        };
        if !seen.insert(sb.id.clone()) {
            continue;
        }
        match truth.get_session(&sb.id).await {
            Ok(s) => sandboxes.push(PlatformSandbox {
                id: sb.id.to_string(),
                task_id: e.task_id.to_string(),
                generation: Some(sb.generation),
                source_snapshot: s.source_snapshot_id.clone(),
                created_at: s.created_at.or(s.requested_at).unwrap_or(sb.created_at),
                order: None,
                live: matches!(s.status, SessionStatus::Pending | SessionStatus::Running),
            }),
            Err(e) => violations.push(super::Violation::new(
                super::Invariant::EngineError,
                None,
                format!("cannot read session {} back from the server: {e}", sb.id),
            )),
        }
    }
    let live: Vec<PlatformSandbox> = match vercel.list_sandboxes(&rec.installation).await {
        Ok(listed) => listed
            .into_iter()
            .filter(|s| s.live)
            .map(|s| PlatformSandbox {
                id: s.id,
                task_id: s.task_id.unwrap_or_default(),
                generation: None,
                source_snapshot: None,
                created_at: 0,
                order: None,
                live: true,
            })
            .collect(),
        Err(e) => {
            violations.push(super::Violation::new(
                super::Invariant::NoOrphan,
                None,
                format!("cannot list the sandboxes on the server: {e}"),
            ));
            Vec::new()
        }
    };
    // Every snapshot the server lists for this installation, and every one the store knows.
    let mut snapshot_ids: BTreeMap<String, String> = BTreeMap::new();
    if let Ok(listed) = vercel.list_snapshots(&rec.installation).await {
        for s in listed {
            snapshot_ids.insert(s.id, s.task_id.unwrap_or_default());
        }
    }
    // Each snapshot is the task's that took it (its `snapshot_taken` entry, or the probe that
    // adopted the platform's snapshot): a fork's record of the parent's snapshot it started
    // from leaves it the parent's, whose restore candidate it is, even once the parent has
    // released it to the fork.
    for e in &rec.entries {
        let taken = match &e.event {
            crate::core::Event::SnapshotTaken { snapshot_id, .. } => Some(snapshot_id),
            crate::core::Event::SandboxProbed {
                platform_snapshot: Some(p),
                ..
            } => Some(&p.snapshot_id),
            _ => None,
        };
        if let Some(id) = taken {
            snapshot_ids.insert(id.to_string(), e.task_id.to_string());
        }
    }
    for t in &rec.tasks {
        for s in &t.snapshots {
            if let Some(id) = &s.id {
                snapshot_ids
                    .entry(id.to_string())
                    .or_insert_with(|| t.id.to_string());
            }
        }
    }
    // The snapshots the platform took when it stopped a sandbox while the engine was dead —
    // of a sandbox its task held (one whose create was still in flight held none of its files).
    let platform_taken: BTreeMap<String, (String, Millis)> = injected
        .platform_snapshots
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(_, (_, _, session))| seen.contains(session.as_str()))
        .map(|(id, (task, at, _))| (id.clone(), (task.clone(), *at)))
        .collect();
    for (id, (task, _)) in &platform_taken {
        snapshot_ids
            .entry(id.clone())
            .or_insert_with(|| task.clone());
    }
    // When the store saw each snapshot confirmed (or the platform's stop answered with it): an
    // upper bound of its creation, for the ones the server no longer reports.
    let mut confirmed: BTreeMap<&str, Millis> = rec
        .tasks
        .iter()
        .flat_map(|t| &t.snapshots)
        .filter_map(|s| Some((s.id.as_deref()?, s.created_at?)))
        .collect();
    for (id, (_, at)) in &platform_taken {
        confirmed.entry(id.as_str()).or_insert(*at);
    }
    let expired_by_us = injected
        .expired_snapshots
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut snapshots = Vec::new();
    for (id, task_id) in snapshot_ids {
        match truth.get_snapshot(&id).await {
            // The platform's snapshot of a session no task ever held (its create was in flight
            // when the platform stopped it, and the create was made again): it holds no file a
            // task wrote, so it is no restore candidate.
            Ok(s)
                if !confirmed.contains_key(id.as_str())
                    && s.source_session_id
                        .as_deref()
                        .is_some_and(|session| !seen.contains(session)) => {}
            Ok(s) => snapshots.push(PlatformSnapshot {
                created_at: s
                    .created_at
                    .or_else(|| confirmed.get(id.as_str()).copied())
                    .unwrap_or(0),
                order: None,
                id,
                task_id,
                expires_at: s.expires_at,
                deleted: s.status == SnapshotStatus::Deleted,
                expired: s.expires_at.is_some_and(|e| e <= now),
            }),
            // Not found: the server has forgotten it, after an expiry (ours) or a deletion.
            Err(e) if e.kind == crate::core::FailureKind::SnapshotGone => {
                let Some(created_at) = confirmed.get(id.as_str()).copied() else {
                    continue;
                };
                let expired_at = expired_by_us.get(&id).copied();
                snapshots.push(PlatformSnapshot {
                    id,
                    task_id,
                    created_at,
                    order: None,
                    expires_at: expired_at,
                    deleted: expired_at.is_none(),
                    expired: expired_at.is_some(),
                })
            }
            Err(e) => violations.push(super::Violation::new(
                super::Invariant::EngineError,
                None,
                format!("cannot read snapshot {id} back from the server: {e}"),
            )),
        }
    }
    let (checked, journal_file) = driver::check_and_export(
        driver::Evidence {
            data_dir: &data_dir,
            task_ids: &task_ids,
            rec: &rec,
            sandboxes: &sandboxes,
            snapshots: &snapshots,
            live: &live,
            deleted_at: &witness.deleted_at(),
            now,
            keep_all: opts.keep_all,
            idle: None,
        },
        &mut violations,
    );

    let stats = fake.stats();
    let mut faults = BTreeMap::new();
    let mut count = |kind: &str, n: u64| {
        if n > 0 {
            faults.insert(kind.to_string(), n);
        }
    };
    count("server_error", stats.injected.errors);
    count("rate_limit", stats.injected.rate_limited);
    count("lost_create", stats.injected.dropped_creates);
    count("timeout", stats.injected.cut_streams);
    count(
        "expire_mid_command",
        injected.expired_sessions.load(Ordering::Relaxed),
    );
    count("snapshot_gone", expired_by_us.len() as u64);
    count(
        "platform_stop_while_dead",
        injected.platform_stops.load(Ordering::Relaxed),
    );
    count("crash", crashes);
    if let Ok(fake) = Arc::try_unwrap(fake) {
        let _ = fake.shutdown().await;
    }
    Ok(SeedReport {
        counts: tally.counts(faults, stats.total, checked.counts),
        snapshots_expired: checked.expired,
        violations,
        journal_file,
        ..driver::real_time_report(seed, opts, started)
    })
}

/// Every few hundred milliseconds until `stop`: arms the server's one-shot faults and expires
/// live sandboxes and snapshots, each at the chance the fault list gives it.
// Ticks in real time: the fake server and the HTTP client it disturbs run on real time too.
#[allow(clippy::too_many_arguments, clippy::disallowed_methods)]
async fn drive_faults(
    fake: Arc<FakeServer>,
    vercel: Arc<VercelProvider>,
    installation: String,
    base: Faults,
    rates: super::ChaosFaults,
    mut r: SplitMix64,
    stop: Arc<AtomicBool>,
    injected: Arc<Injected>,
) {
    let f = rates.sim;
    let clock = SystemClock;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(r.between(TICK_MS.0, TICK_MS.1))).await;
        let mut faults = base.clone();
        if r.chance(per_tick(f.rate_limit)) {
            faults.rate_limit = Some(RateLimitBurst {
                count: r.between(1, 3) as u32,
                retry_after_s: 1,
                endpoint: None,
            });
        }
        if r.chance(per_tick(f.lost_create)) {
            faults.drop_create = Some(DropCreate {
                count: 1,
                mode: if r.chance(0.5) {
                    DropMode::Close
                } else {
                    DropMode::Error
                },
            });
        }
        if r.chance(per_tick(f.timeout)) {
            faults.cut_streams = Some(StreamCut {
                after_ms: r.between(100, 800),
                mode: if r.chance(0.5) {
                    CutMode::Abort
                } else {
                    CutMode::ErrorRecord
                },
            });
        }
        let _ = fake.set_faults(faults);
        if r.chance(per_tick(f.expire_mid_command)) {
            if let Ok(listed) = vercel.list_sandboxes(&installation).await {
                let live: Vec<String> = listed
                    .into_iter()
                    .filter(|s| s.live)
                    .map(|s| s.id)
                    .collect();
                if !live.is_empty() {
                    let id = &live[r.between(0, live.len() as u64 - 1) as usize];
                    if fake.expire_session(id).await.is_ok() {
                        injected.expired_sessions.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        if r.chance(per_tick(f.snapshot_gone)) {
            if let Ok(listed) = vercel.list_snapshots(&installation).await {
                let done = injected
                    .expired_snapshots
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                let live: Vec<String> = listed
                    .into_iter()
                    .filter(|s| s.live && !done.contains_key(&s.id))
                    .map(|s| s.id)
                    .collect();
                if !live.is_empty() {
                    let id = live[r.between(0, live.len() as u64 - 1) as usize].clone();
                    let asked = clock.now_ms();
                    if fake.expire_snapshot(&id).await.is_ok() {
                        injected
                            .expired_snapshots
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(id, asked);
                    }
                }
            }
        }
    }
}
