//! The engine side of a chaos seed, whatever the platform: the engine that crashes and
//! restarts ([`Driver`]), one worker per task playing its workload, the fault-free settling
//! phase, reading the store back, and the checks that compare it with the platform's records.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::check::{self, Invariant, JournalCounts, PlatformSandbox, PlatformSnapshot, Violation};
use super::workload::{Op, RewindOp, TaskPlan};
use super::{ChaosError, RunCounts};
use crate::clock::Clock;
use crate::config::Config;
use crate::core::{ForkFrom, Millis, Notice, RewindTo, SnapshotStatus, Task};
use crate::engine::{EngineError, Orchestrator, RewindResult, RunResult};
use crate::ids::SnapshotId;
use crate::provider::SandboxProvider;
use crate::retry::Jitter;
use crate::rng::SplitMix64;
use crate::store::{JournalEntry, Store};
use crate::TaskId;

/// Salt that keeps the jitter's stream apart from the platform's.
const JITTER_SALT: u64 = 0x0017_7E50_0000_0001;

/// What happens on the platform while the engine is dead (between a crash and the restart).
pub(super) type WhileDead =
    Arc<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// What the command after a rewind would see in a snapshot's files, by snapshot id: `(stdout,
/// stderr)` of [`Driver::probe`] run on them (`None`: the platform does not know it). The
/// platform's ground truth, never the engine's.
pub(super) type SnapshotView = Arc<dyn Fn(&str) -> Option<(String, String)> + Send + Sync>;

/// How the driver checks rewinds: the command that shows the files (run before and after each
/// rewind), and where the platform says what a snapshot holds (when it can).
#[derive(Clone)]
pub(super) struct RewindCheck {
    /// A command that prints every file the workload writes.
    pub(super) probe: String,
    /// What a snapshot holds, as that command would print it.
    pub(super) view: Option<SnapshotView>,
}

/// The engine of a seed, which crashes and restarts: the current orchestrator and its epoch.
pub(super) struct Driver {
    seed: u64,
    config: Config,
    data_dir: PathBuf,
    provider: Arc<dyn SandboxProvider>,
    clock: Arc<dyn Clock>,
    /// The engine now, and how many times it has been restarted.
    current: Mutex<(u64, Orchestrator)>,
    /// Workers waiting for the restart, by task id, woken in that order. A crash wakes the
    /// workers whose requests it cut off in hash-map order (the engine drops its table of
    /// waiting callers), so they must not simply race to the new engine: the order of their
    /// next requests would then differ between runs of the same seed.
    waiting: Mutex<BTreeMap<String, oneshot::Sender<()>>>,
    crash_lock: tokio::sync::Mutex<()>,
    crashes: AtomicU64,
    /// When each crash killed the engine (the clock's time at the abort).
    crash_times: Mutex<Vec<Millis>>,
    pending_crashes: Mutex<Vec<JoinHandle<()>>>,
    errors: Mutex<Vec<String>>,
    while_dead: Mutex<Option<WhileDead>>,
    rewind_check: Mutex<Option<RewindCheck>>,
    /// Broken invariants the workers saw (rewind-restores).
    violations: Mutex<Vec<Violation>>,
}

impl Driver {
    /// Opens the first engine on `data_dir`.
    pub(super) async fn open(
        seed: u64,
        data_dir: &Path,
        provider: Arc<dyn SandboxProvider>,
        clock: Arc<dyn Clock>,
        config: Config,
    ) -> Result<Arc<Driver>, EngineError> {
        let first = Self::open_engine(seed, data_dir, &provider, &clock, &config, 0).await?;
        Ok(Arc::new(Driver {
            seed,
            config,
            data_dir: data_dir.to_path_buf(),
            provider,
            clock,
            current: Mutex::new((0, first)),
            waiting: Mutex::new(BTreeMap::new()),
            crash_lock: tokio::sync::Mutex::new(()),
            crashes: AtomicU64::new(0),
            crash_times: Mutex::new(Vec::new()),
            pending_crashes: Mutex::new(Vec::new()),
            errors: Mutex::new(Vec::new()),
            while_dead: Mutex::new(None),
            rewind_check: Mutex::new(None),
            violations: Mutex::new(Vec::new()),
        }))
    }

    async fn open_engine(
        seed: u64,
        data_dir: &Path,
        provider: &Arc<dyn SandboxProvider>,
        clock: &Arc<dyn Clock>,
        config: &Config,
        epoch: u64,
    ) -> Result<Orchestrator, EngineError> {
        Orchestrator::builder(data_dir.to_path_buf(), config.clone())
            .provider(provider.clone())
            .clock(clock.clone())
            .jitter(Jitter::Seeded(SplitMix64::new(seed ^ JITTER_SALT ^ epoch)))
            .lock_wait(Duration::from_secs(3600))
            // A restart reconciles orphans in the background, as `taskbox` itself does.
            .reconcile_on_start(epoch > 0)
            .open()
            .await
    }

    /// Sets what the platform does while the engine is dead after each crash.
    pub(super) fn set_while_dead(&self, hook: WhileDead) {
        *self.while_dead.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }

    /// Sets how rewinds are checked (without it, the workload's rewinds run unchecked).
    pub(super) fn set_rewind_check(&self, check: RewindCheck) {
        *self.rewind_check.lock().unwrap_or_else(|p| p.into_inner()) = Some(check);
    }

    fn rewind_check(&self) -> Option<RewindCheck> {
        self.rewind_check
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn violation(&self, v: Violation) {
        self.violations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(v);
    }

    pub(super) fn current(&self) -> (u64, Orchestrator) {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until the engine of `epoch` has been replaced (bounded: a restart that failed
    /// must not hang the seed).
    async fn wait_past(&self, task: &str, epoch: u64) -> bool {
        let woken = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            if self.current().0 > epoch {
                return true;
            }
            let (tx, rx) = oneshot::channel();
            waiting.insert(task.to_string(), tx);
            rx
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(3600), woken).await,
            Ok(Ok(()))
        )
    }

    /// Crashes the engine `after_ms` from now and opens a new one on the same data dir.
    // Waits on the runtime's clock (virtual in a simulated seed): the crash point is the plan's.
    #[allow(clippy::disallowed_methods)]
    fn schedule_crash(self: &Arc<Self>, after_ms: u64) {
        let d = self.clone();
        let h = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(after_ms)).await;
            let _one_at_a_time = d.crash_lock.lock().await;
            let (epoch, orch) = d.current();
            d.crash_times
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(d.clock.now_ms());
            orch.abort().await;
            drop(orch);
            d.crashes.fetch_add(1, Ordering::Relaxed);
            let hook = d
                .while_dead
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if let Some(hook) = hook {
                hook().await;
            }
            let reopened = Self::open_engine(
                d.seed,
                &d.data_dir,
                &d.provider,
                &d.clock,
                &d.config,
                epoch + 1,
            )
            .await;
            match reopened {
                Ok(o) => {
                    let mut waiting = d.waiting.lock().unwrap_or_else(|p| p.into_inner());
                    *d.current.lock().unwrap_or_else(|p| p.into_inner()) = (epoch + 1, o);
                    for (_, w) in std::mem::take(&mut *waiting) {
                        let _ = w.send(());
                    }
                }
                Err(e) => d
                    .errors
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("could not reopen the engine after a crash: {e}")),
            }
        });
        self.pending_crashes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(h);
    }

    pub(super) async fn wait_crashes(&self) {
        loop {
            let hs: Vec<_> = std::mem::take(
                &mut *self
                    .pending_crashes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()),
            );
            if hs.is_empty() {
                return;
            }
            for h in hs {
                let _ = h.await;
            }
        }
    }

    pub(super) fn error(&self, e: String) {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e);
    }
}

/// What the workers saw.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) steps: u64,
    pub(super) ok: u64,
    pub(super) failed: u64,
    pub(super) interrupted: u64,
    pub(super) checkpoints: u64,
    pub(super) rewinds: u64,
    pub(super) rewinds_checked: u64,
}

impl Tally {
    /// A seed's counts: what the workers saw, with the faults injected, the calls the platform
    /// received and what the journal shows.
    pub(super) fn counts(
        &self,
        faults: BTreeMap<String, u64>,
        provider_calls: u64,
        journal: JournalCounts,
    ) -> RunCounts {
        RunCounts {
            steps: self.steps,
            requests_ok: self.ok,
            requests_failed: self.failed,
            requests_interrupted: self.interrupted,
            faults,
            provider_calls,
            requests_moved: 0,
            takeovers: 0,
            checkpoints: self.checkpoints,
            rewinds: self.rewinds,
            rewinds_checked: self.rewinds_checked,
            journal,
        }
    }
}

// A `Wait` step sleeps on the runtime's clock (virtual in a simulated seed): idling is part of
// the workload.
#[allow(clippy::disallowed_methods)]
async fn worker(d: Arc<Driver>, plan: TaskPlan) -> Tally {
    let mut tally = Tally::default();
    let task = match TaskId::new(&plan.task_id) {
        Ok(t) => t,
        Err(e) => {
            d.error(format!("bad task id {}: {e}", plan.task_id));
            return tally;
        }
    };
    // Only `run` creates a task: a `suspend` or `resume` before any run of it was answered
    // (committed) is refused with `NoTask`, as it should be; after one, `NoTask` is a lost task.
    let mut created = false;
    // What the task's earlier rewinds saved (what an undo goes back to).
    let mut rewinds = Rewinds::default();
    for step in plan.steps {
        tally.steps += 1;
        if let Some(after) = step.crash_after_ms {
            d.schedule_crash(after);
        }
        let (epoch, orch) = d.current();
        let result = match &step.op {
            Op::Run { command } => orch.run(&task, command, None).await.map(drop),
            Op::Suspend => orch.suspend(&task).await.map(drop),
            Op::Resume => orch.resume(&task).await.map(drop),
            Op::Fork { child, seq } => match TaskId::new(child) {
                Ok(child) => {
                    let from = seq.map_or(ForkFrom::Latest, |seq| ForkFrom::Seq { seq });
                    match orch.fork(&task, &child, from).await {
                        // The fork's first command restores the parent's snapshot.
                        Ok(_) => orch.run(&child, "cat f0", None).await.map(drop),
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e.into()),
            },
            Op::Wait { ms } => {
                tokio::time::sleep(Duration::from_millis(*ms)).await;
                Ok(())
            }
            Op::Checkpoint => orch.checkpoint(&task).await.map(|_| tally.checkpoints += 1),
            Op::Rewind { to } => rewind(&d, &orch, &task, *to, &mut rewinds)
                .await
                .map(|checked| {
                    tally.rewinds += 1;
                    tally.rewinds_checked += u64::from(checked);
                }),
        };
        drop(orch);
        if matches!(step.op, Op::Run { .. })
            && matches!(result, Ok(()) | Err(EngineError::Request { .. }))
        {
            created = true;
        }
        match result {
            Ok(()) => {
                if !matches!(step.op, Op::Wait { .. }) {
                    tally.ok += 1;
                }
            }
            Err(EngineError::Request { .. }) => tally.failed += 1,
            Err(EngineError::NoTask { .. }) if !created => tally.failed += 1,
            Err(EngineError::Stopped) => {
                tally.interrupted += 1;
                if !d.wait_past(task.as_str(), epoch).await {
                    d.error(format!(
                        "task {task}: the engine stopped and was not restarted within an hour"
                    ));
                    return tally;
                }
            }
            Err(e) => {
                tally.failed += 1;
                d.error(format!("task {task}: {} failed: {e}", step.op.kind()));
            }
        }
    }
    tally
}

/// What a task's earlier rewinds saved: the snapshot the latest one kept the files from before
/// it in, and for every snapshot a rewind saved them in, what the probe showed of them then.
#[derive(Default)]
struct Rewinds {
    last_saved: Option<SnapshotId>,
    saved: BTreeMap<SnapshotId, (String, String)>,
}

/// Runs the probe command: what it printed, `None` if it failed (a fault); an engine that
/// stopped is the caller's to handle.
async fn probe(
    orch: &Orchestrator,
    task: &TaskId,
    command: &str,
) -> Result<Option<RunResult>, EngineError> {
    match orch.run(task, command, None).await {
        Ok(r) => Ok(Some(r)),
        Err(EngineError::Request { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether a reply's notices say its files came from somewhere other than `to` (a restore that
/// fell back to another snapshot, or files lost): then it does not show `to`'s files, and says
/// so.
fn restored_elsewhere(notices: &[Notice], to: &SnapshotId) -> bool {
    notices.iter().any(|n| match n {
        Notice::Recreated {
            from_snapshot,
            changes_lost,
            ..
        } => from_snapshot.as_ref() != Some(to) || *changes_lost,
        Notice::FilesLost { .. } => true,
        Notice::LateCheckpoint { .. } | Notice::SandboxExpired { .. } => false,
    })
}

/// One rewind step: the probe (the files before), the rewind, the probe again (the files
/// after), and the **rewind-restores** checks: the command after a rewind answered OK sees
/// exactly the files of the snapshot rewound to; the snapshot the rewind saved holds the files
/// from before; and an undo (a rewind to that saved snapshot) gives those files back.
/// Whether the files restored were compared with the snapshot's.
async fn rewind(
    d: &Driver,
    orch: &Orchestrator,
    task: &TaskId,
    op: RewindOp,
    earlier: &mut Rewinds,
) -> Result<bool, EngineError> {
    let to = match op {
        RewindOp::Back { n } => RewindTo::Back { n },
        RewindOp::Undo => match &earlier.last_saved {
            Some(saved) => RewindTo::Id {
                snapshot_id: saved.clone(),
            },
            None => RewindTo::Back { n: 1 },
        },
        RewindOp::To { pick } => {
            let retained: Vec<u64> = orch
                .tasks()
                .await?
                .iter()
                .find(|t| t.id == *task)
                .map(|t| {
                    t.snapshots
                        .iter()
                        .filter(|s| s.status == SnapshotStatus::Complete)
                        .map(|s| s.seq)
                        .collect()
                })
                .unwrap_or_default();
            match retained.len() as u64 {
                0 => RewindTo::Back { n: 1 },
                n => RewindTo::Seq {
                    seq: retained[(pick % n) as usize],
                },
            }
        }
    };
    let Some(check) = d.rewind_check() else {
        return orch.rewind(task, to).await.map(|_| false);
    };
    let before = probe(orch, task, &check.probe)
        .await?
        .map(|r| (r.stdout, r.stderr));
    let answer = orch.rewind(task, to).await?;
    let after = probe(orch, task, &check.probe).await?;
    let (findings, checked) =
        rewind_findings(&check, &answer, before.as_ref(), after.as_ref(), earlier);
    for detail in findings {
        d.violation(Violation::new(
            Invariant::RewindRestores,
            Some(task.as_str()),
            detail,
        ));
    }
    if let Some(saved) = answer.saved {
        if let Some(before) = before {
            earlier.saved.insert(saved.clone(), before);
        }
        earlier.last_saved = Some(saved);
    }
    Ok(checked)
}

/// What is wrong with a rewind that answered `answer`, given what the probe showed before and
/// after it, and what earlier rewinds saved; and whether the files after it were compared with
/// the snapshot's.
fn rewind_findings(
    check: &RewindCheck,
    answer: &RewindResult,
    before: Option<&(String, String)>,
    after: Option<&RunResult>,
    earlier: &Rewinds,
) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    let to = &answer.to;
    // The command after the rewind shows `to`'s files, unless its reply (or the rewind's) says
    // they came from elsewhere.
    let after = after
        .filter(|r| !restored_elsewhere(&answer.notices, to) && !restored_elsewhere(&r.notices, to))
        .map(|r| (r.stdout.clone(), r.stderr.clone()));
    let view = |id: &SnapshotId| check.view.as_ref().and_then(|v| v(id.as_str()));
    let mut checked = false;
    if let (Some(seen), Some(held)) = (&after, view(to)) {
        checked = true;
        if *seen != held {
            out.push(format!(
                "rewound to {to} (seq {}) into sandbox {}, but the next command saw {seen:?}, \
                 and that snapshot holds {held:?}",
                answer.to_seq, answer.sandbox_id
            ));
        }
    }
    if let (Some(saved), Some(before)) = (&answer.saved, before) {
        if let Some(held) = view(saved).filter(|held| held != before) {
            out.push(format!(
                "the rewind to {to} saved the files from before in {saved} (seq {}), but that \
                 snapshot holds {held:?}, and the files were {before:?}",
                answer.saved_seq.unwrap_or(0)
            ));
        }
    }
    // Undoable: a rewind to a snapshot an earlier rewind saved the files in gives them back.
    if let (Some(seen), Some(before)) = (&after, earlier.saved.get(to)) {
        checked = true;
        if before != seen {
            out.push(format!(
                "rewound to {to}, which an earlier rewind saved the files in, but the next \
                 command saw {seen:?}, and the files before that rewind were {before:?}",
            ));
        }
    }
    (out, checked)
}

/// Plays every task's workload at once (bounded by `bound` of the runtime's time), then waits
/// for pending crashes to have restarted the engine.
pub(super) async fn run_workload(
    d: &Arc<Driver>,
    plans: Vec<TaskPlan>,
    bound: Duration,
) -> (Tally, Vec<Violation>) {
    let mut violations = Vec::new();
    let workers: Vec<JoinHandle<Tally>> = plans
        .into_iter()
        .map(|p| tokio::spawn(worker(d.clone(), p)))
        .collect();
    let tally = join_workers(workers, bound, &mut violations, |e| d.error(e)).await;
    d.wait_crashes().await;
    (tally, violations)
}

/// Waits for the workload's workers (bounded by `bound` of the runtime's time) and adds up
/// their tallies; a worker that panicked is reported through `error`, a workload that did not
/// finish in time is a violation of [`Invariant::Settles`].
pub(super) async fn join_workers(
    workers: Vec<JoinHandle<Tally>>,
    bound: Duration,
    violations: &mut Vec<Violation>,
    mut error: impl FnMut(String),
) -> Tally {
    let mut tally = Tally::default();
    let joined = tokio::time::timeout(bound, async {
        let mut out = Vec::new();
        for w in workers {
            out.push(w.await);
        }
        out
    })
    .await;
    match joined {
        Ok(results) => {
            for r in results {
                match r {
                    Ok(t) => {
                        tally.steps += t.steps;
                        tally.ok += t.ok;
                        tally.failed += t.failed;
                        tally.interrupted += t.interrupted;
                        tally.checkpoints += t.checkpoints;
                        tally.rewinds += t.rewinds;
                        tally.rewinds_checked += t.rewinds_checked;
                    }
                    Err(e) => error(format!("a task's worker panicked: {e}")),
                }
            }
        }
        Err(_) => violations.push(Violation::new(
            Invariant::Settles,
            None,
            format!("the workload did not finish within {} s", bound.as_secs()),
        )),
    }
    tally
}

/// The tasks to settle: the workload's, then any other `orch` knows (the forks made of them).
pub(super) async fn tasks_to_settle(
    task_ids: &[String],
    orch: &Orchestrator,
    mut error: impl FnMut(String),
) -> Vec<String> {
    let mut ids: Vec<String> = task_ids.to_vec();
    match orch.tasks().await {
        Ok(tasks) => {
            for t in tasks {
                if !ids.iter().any(|i| i == t.id.as_str()) {
                    ids.push(t.id.to_string());
                }
            }
        }
        Err(e) => error(format!("cannot list the tasks to settle: {e}")),
    }
    ids
}

/// Reconciles with faults off (a gc): anything it cannot do, or a gc another engine held, is
/// a violation of [`Invariant::NoOrphan`].
pub(super) async fn reconcile(orch: &Orchestrator, violations: &mut Vec<Violation>) {
    let failed = |e: &dyn std::fmt::Display| {
        Violation::new(
            Invariant::NoOrphan,
            None,
            format!("reconciliation with faults off failed: {e}"),
        )
    };
    match orch.gc(false).await {
        Ok(gc) => {
            violations.extend(gc.errors.iter().map(|e| failed(e)));
            if gc.held_elsewhere {
                violations.push(Violation::new(
                    Invariant::NoOrphan,
                    None,
                    "reconciliation with faults off did not run: another engine held gc",
                ));
            }
        }
        Err(e) => violations.push(failed(&e)),
    }
}

/// With faults already off: lets calls in flight finish (`settle`), runs one last command in
/// every task (which recovers and restores it), reconciles orphans, and shuts the engine down.
/// Returns the violations found, the number of crashes and when each killed the engine.
// Settling is a wait on the runtime's clock (virtual in a simulated seed).
#[allow(clippy::disallowed_methods)]
pub(super) async fn settle(
    d: Arc<Driver>,
    task_ids: &[String],
    settle: Duration,
) -> (Vec<Violation>, u64, Vec<Millis>) {
    let mut violations = Vec::new();
    tokio::time::sleep(settle).await;
    let (_, orch) = d.current();
    let mut finals = Vec::new();
    // The workload's tasks and the forks made of them.
    let ids = tasks_to_settle(task_ids, &orch, |e| d.error(e)).await;
    for id in &ids {
        let orch = orch.clone();
        let id = id.clone();
        finals.push(tokio::spawn(async move {
            let task = TaskId::new(&id).map_err(|e| e.to_string())?;
            // A first try may fail honestly: a sandbox that died before its recorded deadline
            // while the engine was down is found dead by this very command (the command never
            // ran, and the error says so); the second try must restore and succeed.
            if orch.run(&task, "cat f0", None).await.is_ok() {
                return Ok(());
            }
            orch.run(&task, "cat f0", None)
                .await
                .map(drop)
                .map_err(|e| format!("task {id}: with faults off, a command failed twice: {e}"))
        }));
    }
    for f in finals {
        match f.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => violations.push(Violation::new(Invariant::Settles, None, e)),
            Err(e) => d.error(format!("a final command panicked: {e}")),
        }
    }
    reconcile(&orch, &mut violations).await;
    orch.shutdown_within(Duration::from_secs(600)).await;
    drop(orch);
    for e in d.errors.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
        violations.push(Violation::new(Invariant::EngineError, None, e));
    }
    violations.append(&mut d.violations.lock().unwrap_or_else(|p| p.into_inner()));
    let crashes = d.crashes.load(Ordering::Relaxed);
    let crash_times = d
        .crash_times
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    (violations, crashes, crash_times)
}

/// What the store holds after a seed.
pub(super) struct Recorded {
    pub(super) tasks: Vec<Task>,
    /// Every task's journal, in commit order.
    pub(super) entries: Vec<JournalEntry>,
    pub(super) installation: String,
}

/// Reads the store back (after the engine has shut down).
pub(super) fn read_store(seed: u64, data_dir: &Path) -> Result<Recorded, ChaosError> {
    let store_err = |source| ChaosError::Store {
        seed,
        source: Box::new(source),
    };
    let store = Store::open(&data_dir.join("taskbox.db")).map_err(store_err)?;
    let tasks = store.load_tasks().map_err(store_err)?;
    let mut entries: Vec<JournalEntry> = Vec::new();
    for id in store.task_ids().map_err(store_err)? {
        entries.extend(store.journal(&id).map_err(store_err)?);
    }
    entries.sort_by_key(|e| e.seq);
    Ok(Recorded {
        tasks,
        entries,
        installation: store.installation_id().to_string(),
    })
}

/// What the checks found.
pub(super) struct Checked {
    pub(super) counts: JournalCounts,
    pub(super) violations: Vec<Violation>,
    /// Complete snapshots the platform expired, as `task/snapshot`.
    pub(super) expired: Vec<String>,
    /// Sandboxes no task adopted.
    pub(super) stale: u64,
}

/// Every check of the store against the platform's records: `sandboxes` are every sandbox the
/// platform knows of (adopted or not), `live` those running after reconciliation,
/// `deleted_at` when the platform deleted snapshots.
pub(super) fn check_all(
    task_ids: &[String],
    rec: &Recorded,
    sandboxes: &[PlatformSandbox],
    snapshots: &[PlatformSnapshot],
    live: &[PlatformSandbox],
    deleted_at: &BTreeMap<String, Millis>,
    idle: Option<IdleCheck<'_>>,
) -> Checked {
    let mut violations = Vec::new();
    let adopted_ids = check::adopted_sandboxes(&rec.entries);
    let (adopted, stale): (Vec<_>, Vec<_>) = sandboxes
        .iter()
        .cloned()
        .partition(|s| adopted_ids.contains(&s.id));
    // A restore from the snapshot the files were rewound to is not from the newest one, by
    // design: the journal's rule and the driver's rewind check judge those.
    let rewound = check::rewound_restores(&rec.entries);
    let newest_due: Vec<PlatformSandbox> = adopted
        .iter()
        .filter(|s| {
            !matches!((s.generation, &s.source_snapshot), (Some(g), Some(src))
                if rewound.contains(&(s.task_id.clone(), g, src.clone())))
        })
        .cloned()
        .collect();
    // The workload's tasks and the forks made of them.
    let mut ids: Vec<&str> = task_ids.iter().map(String::as_str).collect();
    for t in &rec.tasks {
        if !ids.contains(&t.id.as_str()) {
            ids.push(t.id.as_str());
        }
    }
    for id in ids {
        let retired_at = check::retired_at_for(&rec.entries, deleted_at, id);
        let inherited = rec
            .tasks
            .iter()
            .find(|t| t.id.as_str() == id)
            .and_then(|t| t.lineage.as_ref())
            .map(|l| l.snapshot.as_str());
        violations.extend(check::restores_of(
            &newest_due,
            snapshots,
            &retired_at,
            id,
            inherited,
        ));
    }
    violations.extend(check::forks(&rec.entries, snapshots, deleted_at));
    violations.extend(check::deleted_while_referenced(&rec.entries, deleted_at));
    let (expired, kept) = check::snapshots_kept(&rec.tasks, snapshots);
    violations.extend(kept);
    violations.extend(check::sandboxes_after_reconcile(&rec.tasks, live));
    violations.extend(check::unsettled(&rec.tasks));
    let (counts, journal_violations) = check::journal(&rec.entries);
    violations.extend(journal_violations);
    if let Some(idle) = idle {
        violations.extend(check::idle_reaped(
            &rec.entries,
            idle.crashes,
            idle.slack_ms,
        ));
    }
    // Folding the journal's events through today's core must reproduce every entry.
    for d in crate::replay::verify(&rec.entries).divergences() {
        violations.push(Violation::new(
            Invariant::JournalReplays,
            Some(&d.task_id),
            format!(
                "entry {} ({}) does not replay: {}",
                d.task_seq, d.event, d.detail
            ),
        ));
    }
    Checked {
        counts,
        violations,
        expired: expired
            .into_iter()
            .map(|(t, s)| format!("{t}/{s}"))
            .collect(),
        stale: stale.len() as u64,
    }
}

/// Of the sandboxes the platform knows, those running (after reconciliation).
pub(super) fn live(sandboxes: &[PlatformSandbox]) -> Vec<PlatformSandbox> {
    sandboxes.iter().filter(|s| s.live).cloned().collect()
}

/// A seed's report on real time (`--http`, `--fleet`): no digest, no kept home, its span the
/// seed's wall time since `started`; the caller fills in what it found.
pub(super) fn real_time_report(
    seed: u64,
    opts: &super::ChaosOptions,
    started: std::time::Instant,
) -> super::SeedReport {
    super::SeedReport {
        seed,
        tasks: opts.tasks,
        counts: super::RunCounts::default(),
        snapshots_expired: Vec::new(),
        stale_sandboxes: 0,
        violations: Vec::new(),
        digest: String::new(),
        virtual_ms: started.elapsed().as_millis() as u64,
        home: None,
        journal_file: None,
        repro: opts.repro_command(seed),
    }
}

/// What a seed's run left behind, for [`check_and_export`]: the arguments of [`check_all`],
/// where the journal goes and when.
pub(super) struct Evidence<'a> {
    pub(super) data_dir: &'a Path,
    pub(super) task_ids: &'a [String],
    pub(super) rec: &'a Recorded,
    pub(super) sandboxes: &'a [PlatformSandbox],
    pub(super) snapshots: &'a [PlatformSnapshot],
    pub(super) live: &'a [PlatformSandbox],
    pub(super) deleted_at: &'a BTreeMap<String, Millis>,
    /// Stamped on the exported journal.
    pub(super) now: Millis,
    /// Export the journal even when nothing is violated.
    pub(super) keep_all: bool,
    /// Whether (and how) idle-reaped is judged: on a virtual clock only, where a timer fires
    /// when it is due (on a real clock two busy cores make any slack a guess).
    pub(super) idle: Option<IdleCheck<'a>>,
}

/// What the idle-reaped check needs beside the journal ([`check::idle_reaped`]).
#[derive(Clone, Copy)]
pub(super) struct IdleCheck<'a> {
    /// When the engine died (no timers fire until it is back).
    pub(super) crashes: &'a [Millis],
    /// How late past the idle deadline a reap may come.
    pub(super) slack_ms: Millis,
}

/// Every check ([`check_all`]) added to `violations`, then the journal exported
/// ([`export_journal`]) if anything is violated (or `keep_all`): what the checks counted, and
/// the exported file.
pub(super) fn check_and_export(
    ev: Evidence<'_>,
    violations: &mut Vec<Violation>,
) -> (Checked, Option<PathBuf>) {
    let mut checked = check_all(
        ev.task_ids,
        ev.rec,
        ev.sandboxes,
        ev.snapshots,
        ev.live,
        ev.deleted_at,
        ev.idle,
    );
    violations.append(&mut checked.violations);
    let journal_file = if violations.is_empty() && !ev.keep_all {
        None
    } else {
        export_journal(ev.data_dir, ev.rec, ev.now, violations)
    };
    (checked, journal_file)
}

/// Writes the seed's journal to `journal.jsonl` beside its data dir, for `taskbox replay
/// --journal FILE` on any machine. A failure is a violation of its own (the evidence is lost).
pub(super) fn export_journal(
    data_dir: &Path,
    rec: &Recorded,
    now: Millis,
    violations: &mut Vec<Violation>,
) -> Option<PathBuf> {
    let path = data_dir.parent().unwrap_or(data_dir).join("journal.jsonl");
    let written = std::fs::File::create(&path)
        .map_err(crate::replay::export::ExportError::Write)
        .and_then(|f| {
            let mut out = std::io::BufWriter::new(f);
            crate::replay::export::write_journal(&mut out, &rec.entries, &rec.installation, now)
        });
    match written {
        Ok(_) => Some(path),
        Err(e) => {
            violations.push(Violation::new(
                Invariant::EngineError,
                None,
                format!("could not export the journal to {}: {e}", path.display()),
            ));
            None
        }
    }
}
