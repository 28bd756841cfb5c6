//! The engine end to end on the deterministic simulated provider: the real event loop, the real
//! SQLite store (a file in a temp dir), virtual time.
//!
//! The central property of the design: over random interleavings of commands, suspends, idle
//! reaps, sandbox expiries, failed and interrupted snapshots, transient provider errors and
//! crashes (the event loop is killed and a new one reopens the SQLite file), **a resumed task
//! always restores its latest completed snapshot — and never restores anything when it has
//! none.** Ground truth comes from the simulated platform, not from the engine's own records.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use taskbox::clock::TokioClock;
use taskbox::config::Config;
use taskbox::core::TaskState;
use taskbox::engine::{store_file, Orchestrator};
use taskbox::provider::sim::{SimFaults, SimProvider};
use taskbox::retry::Jitter;
use taskbox::store::Store;
use taskbox::TaskId;

use crate::support::paused_runtime;

const START_MS: u64 = 1_700_000_000_000;

fn config() -> Config {
    let mut c = Config::default();
    c.terminal.lifetime_seconds = 120;
    c.terminal.sandbox_timeout_seconds = 300;
    c.terminal.max_sandbox_lifetime_seconds = 600;
    c.terminal.checkpoint_margin_seconds = 30;
    c.terminal.timeout = 60;
    c
}

async fn open(
    dir: &std::path::Path,
    sim: &Arc<SimProvider>,
    clock: &Arc<TokioClock>,
) -> Orchestrator {
    open_with(dir, sim, clock, config()).await
}

#[derive(Debug, Clone)]
enum Action {
    Write(u32),
    Read,
    Suspend,
    Resume,
    Sleep(u64),
    ExpireSandbox,
    Crash,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (0u32..1000).prop_map(Action::Write),
        3 => Just(Action::Read),
        2 => Just(Action::Suspend),
        1 => Just(Action::Resume),
        2 => prop_oneof![Just(30_000u64), Just(130_000), Just(400_000)].prop_map(Action::Sleep),
        1 => Just(Action::ExpireSandbox),
        2 => Just(Action::Crash),
    ]
}

fn faults() -> SimFaults {
    SimFaults {
        rate_limit: 0.04,
        retry_after_ms: 2_000,
        server_error: 0.04,
        timeout: 0.02,
        timeout_ms: 5_000,
        lost_create: 0.05,
        expire_mid_command: 0.02,
        snapshot_fail_permanent: 0.03,
        snapshot_fail_transient: 0.05,
        snapshot_slow: 0.1,
        snapshot_slow_ms: 20_000,
        snapshot_gone: 0.05,
        snapshot_gone_after_ms: 200_000,
        delete_fail: 0.1,
        latency_min_ms: 1,
        latency_max_ms: 200,
    }
}

/// Checks every sandbox the platform created for `task`: one created from a snapshot used the
/// task's newest snapshot that existed at that moment; one created fresh had none to use.
/// (The chaos runner's checker; here without deletion times, as before.)
/// Every sandbox of `task` came from the newest snapshot present when it was made. A snapshot
/// the task retired (retention deleting it) is not present from the moment its journal says so:
/// after the retained ones expire, a restore from nothing is right, not one from an older
/// snapshot the task already gave up.
fn check_restores(sim: &SimProvider, dir: &Path, task: &str) -> Result<(), TestCaseError> {
    let sandboxes: Vec<_> = sim.all_sandboxes().iter().map(Into::into).collect();
    let snapshots: Vec<_> = sim.snapshots().iter().map(Into::into).collect();
    let store = Store::open_existing(&store_file(dir)).expect("the store");
    let journal = store.journal(task).expect("the task's journal");
    // The snapshot and sandbox rows are what the task's history implies.
    let (sandbox_rows, snapshot_rows) = crate::store::model::rows_of(&store, Some(task));
    prop_assert_eq!(store.sandboxes(Some(task)).expect("rows"), sandbox_rows);
    prop_assert_eq!(store.snapshots(Some(task)).expect("rows"), snapshot_rows);
    let retired = taskbox::chaos::check::retired_at_for(&journal, &BTreeMap::new(), task);
    let violations = taskbox::chaos::check::restores(&sandboxes, &snapshots, &retired, task);
    prop_assert!(violations.is_empty(), "{:?}", violations);
    check_retention(&journal)?;
    Ok(())
}

/// Retention counted by a model of its own: walking the journal's *events* (not the core's
/// delete commands or snapshot statuses), a snapshot is confirmed when a `snapshot_taken`
/// ends the snapshotting state, and is gone when a restore from it fails with "snapshot
/// gone"; after each confirmation all but the newest `keep_snapshots` confirmed snapshots
/// still there are dropped. After every transition the task's complete snapshots must be
/// exactly the model's kept ones: the same count and the same ids.
fn check_retention(journal: &[taskbox::store::JournalEntry]) -> Result<(), TestCaseError> {
    use taskbox::core::{Command, Event, FailureKind, SnapshotStatus};
    let keep = config().terminal.keep_snapshots.max(1) as usize;
    let mut confirmed: Vec<String> = Vec::new();
    let mut dropped: std::collections::BTreeSet<String> = Default::default();
    let mut sources: BTreeMap<u64, Option<String>> = BTreeMap::new();
    for entry in journal {
        match &entry.event {
            Event::SnapshotTaken { snapshot_id, .. }
                if entry.state_before == TaskState::Snapshotting
                    && entry.state_after != TaskState::Snapshotting =>
            {
                confirmed.push(snapshot_id.to_string());
                let kept: Vec<&String> = confirmed
                    .iter()
                    .filter(|id| !dropped.contains(*id))
                    .collect();
                let excess = kept.len().saturating_sub(keep);
                let out: Vec<String> = kept.into_iter().take(excess).cloned().collect();
                dropped.extend(out);
            }
            Event::CreateFailed {
                generation,
                failure,
            } if failure.kind == FailureKind::SnapshotGone
                && entry.state_before == TaskState::Restoring =>
            {
                if let Some(Some(source)) = sources.get(generation) {
                    dropped.insert(source.clone());
                }
            }
            _ => {}
        }
        for cmd in &entry.commands {
            if let Command::CreateSandbox {
                generation,
                source_snapshot,
                ..
            } = cmd
            {
                sources.insert(*generation, source_snapshot.as_ref().map(|s| s.to_string()));
            }
        }
        let kept: Vec<&str> = confirmed
            .iter()
            .filter(|id| !dropped.contains(*id))
            .map(String::as_str)
            .collect();
        let complete: Vec<&str> = entry
            .task_after
            .snapshots
            .iter()
            .filter(|s| s.status == SnapshotStatus::Complete)
            .filter_map(|s| s.id.as_deref())
            .collect();
        prop_assert_eq!(
            &complete,
            &kept,
            "retention after journal entry {} ({})",
            entry.task_seq,
            entry.event.name()
        );
    }
    Ok(())
}

fn scenario(seed: u64, actions: Vec<Action>) -> Result<(), TestCaseError> {
    let rt = paused_runtime();
    rt.block_on(async move {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(TokioClock::starting_at(START_MS));
        let sim = Arc::new(SimProvider::new(seed, faults(), clock.clone()));
        let task = TaskId::new("t").expect("id");
        let mut orch = open(dir.path(), &sim, &clock).await;
        for action in actions {
            match action {
                Action::Write(v) => {
                    let _ = orch.run(&task, &format!("write f {v}"), None).await;
                }
                Action::Read => {
                    // A read after a suspend or an expiry is what makes the engine restore.
                    let _ = orch.run(&task, "cat f", None).await;
                }
                Action::Suspend => {
                    let _ = orch.suspend(&task).await;
                }
                Action::Resume => {
                    let _ = orch.resume(&task).await;
                }
                Action::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                Action::ExpireSandbox => {
                    for sb in sim.live_sandboxes() {
                        sim.expire_sandbox_now(&sb.id);
                    }
                }
                Action::Crash => {
                    orch.abort().await;
                    orch = open(dir.path(), &sim, &clock).await;
                }
            }
            check_restores(&sim, dir.path(), "t")?;
        }
        // Settle: let retries finish, then one last command must see the latest snapshot.
        tokio::time::sleep(Duration::from_secs(120)).await;
        let _ = orch.run(&task, "cat f", None).await;
        check_restores(&sim, dir.path(), "t")?;
        // Every snapshot the engine calls complete exists on the platform, or was reported gone.
        let view = orch
            .show(&task, 0)
            .await
            .expect("show")
            .expect("task exists");
        let on_platform: BTreeMap<_, _> = sim
            .snapshots()
            .into_iter()
            .map(|s| (s.id.clone(), s))
            .collect();
        for rec in &view.task.snapshots {
            if rec.status == taskbox::core::SnapshotStatus::Complete {
                let id = rec.id.as_deref().unwrap_or_default().to_string();
                let snap = on_platform.get(&id);
                prop_assert!(
                    snap.is_some_and(|s| !s.deleted),
                    "complete snapshot {} was deleted on the platform",
                    id
                );
            }
        }
        orch.shutdown_within(Duration::from_secs(600)).await;
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::support::proptest_cases(48, 48), max_shrink_iters: 200, failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/engine.txt"))), ..ProptestConfig::default() })]

    #[test]
    fn a_resumed_task_restores_its_latest_complete_snapshot(seed in any::<u64>(), actions in proptest::collection::vec(action(), 1..30)) {
        scenario(seed, actions)?;
    }
}

/// The same scenario with and without a restart in the middle ends in the same state.
#[test]
fn crash_and_reload_is_equivalent_to_running_through() {
    fn final_state(restart_at: Option<usize>) -> (TaskState, Vec<String>, String) {
        paused_runtime().block_on(async move {
            let dir = tempfile::tempdir().expect("temp dir");
            let clock = Arc::new(TokioClock::starting_at(START_MS));
            let sim = Arc::new(SimProvider::new(7, SimFaults::none(), clock.clone()));
            let task = TaskId::new("eq").expect("id");
            let mut orch = open(dir.path(), &sim, &clock).await;
            let steps = [
                "write f 1",
                "SUSPEND",
                "append f 2",
                "SUSPEND",
                "append f 3",
                "cat f",
            ];
            let mut last = String::new();
            for (i, s) in steps.iter().enumerate() {
                if restart_at == Some(i) {
                    orch.shutdown().await;
                    orch = open(dir.path(), &sim, &clock).await;
                }
                if *s == "SUSPEND" {
                    orch.suspend(&task).await.expect("suspend");
                } else {
                    last = orch.run(&task, s, None).await.expect("run").stdout;
                }
            }
            let view = orch.show(&task, 0).await.expect("show").expect("task");
            orch.shutdown().await;
            let snaps = view
                .task
                .snapshots
                .iter()
                .map(|s| format!("{}:{}", s.seq, s.status.as_str()))
                .collect();
            (view.task.state, snaps, last)
        })
    }
    let straight = final_state(None);
    assert_eq!(straight.2, "123");
    for cut in 1..6 {
        assert_eq!(
            final_state(Some(cut)),
            straight,
            "restart before step {cut}"
        );
    }
}

/// Idle sandboxes are snapshotted and stopped after `terminal.lifetime_seconds`; the next
/// command restores them. The reaper never stops a sandbox under a running command.
/// The idle reaper, not the checkpoint timer: the lifetime is 120 s and the checkpoint comes at
/// 270 s (a 300 s sandbox, a 30 s margin), so a sandbox left idle after a short command must be
/// snapshotted at its last activity plus 120 s — by the Idle timer (the journal says which) —
/// and not a moment before. A command longer than the lifetime is activity, not idleness.
#[test]
fn idle_reap_snapshots_and_the_next_command_restores() {
    use taskbox::clock::Clock;
    paused_runtime().block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(TokioClock::starting_at(START_MS));
        let sim = Arc::new(SimProvider::new(1, SimFaults::none(), clock.clone()));
        let orch = open(dir.path(), &sim, &clock).await;
        let task = TaskId::new("idle").expect("id");
        let mut changes = orch.watch();
        let created = clock.now_ms();
        orch.run(&task, "write f kept", None).await.expect("run");
        let checkpoint_at = created + (300 - 30) * 1_000;
        // A command longer than the idle lifetime is activity, not idleness.
        let out = orch
            .run(&task, "sleep 121000; cat f", Some(Duration::from_secs(200)))
            .await
            .expect("run");
        assert_eq!(out.stdout, "kept");
        let last_activity = clock.now_ms();
        let due = last_activity + 120_000;
        assert!(
            due + 10_000 < checkpoint_at,
            "the test needs the idle deadline ({due}) well before the checkpoint ({checkpoint_at})"
        );
        assert!(sim.live_sandboxes().iter().any(|s| s.task_id == "idle"));
        // Five seconds before the lifetime is over: still live, nothing snapshotted.
        tokio::time::sleep(Duration::from_millis(due - 5_000 - clock.now_ms())).await;
        let mut saw_snapshotting = false;
        while let Ok(c) = changes.try_recv() {
            saw_snapshotting |= c.task_id == task && c.to == TaskState::Snapshotting;
        }
        assert!(
            !saw_snapshotting,
            "snapshotted before the idle lifetime was over"
        );
        assert!(sim.live_sandboxes().iter().any(|s| s.task_id == "idle"));
        // Ten seconds later (still 10 s or more before the checkpoint): reaped into a snapshot.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let mut snapshotting_at = None;
        while let Ok(c) = changes.try_recv() {
            if c.task_id == task && c.to == TaskState::Snapshotting && snapshotting_at.is_none() {
                snapshotting_at = Some(c.at);
            }
        }
        let at = snapshotting_at.expect("the idle reaper snapshotted the sandbox");
        assert!(
            (due..due + 5_000).contains(&at),
            "snapshotted at {at}, the idle deadline was {due}"
        );
        assert!(sim.live_sandboxes().iter().all(|s| s.task_id != "idle"));
        let view = orch.show(&task, 1_000).await.expect("show").expect("task");
        assert!(
            view.journal
                .iter()
                .any(|e| e.state_after == TaskState::Snapshotting
                    && matches!(
                        e.event,
                        taskbox::core::Event::TimerFired {
                            timer: taskbox::core::TimerKind::Idle
                        }
                    )),
            "the Idle timer (not the checkpoint) took the sandbox into a snapshot: {:?}",
            view.journal
                .iter()
                .map(|e| (e.event.name(), e.state_after))
                .collect::<Vec<_>>()
        );
        let out = orch.run(&task, "cat f", None).await.expect("run");
        assert_eq!(out.stdout, "kept");
        assert!(
            !out.notices.is_empty(),
            "the caller is told the sandbox was recreated"
        );
        orch.shutdown().await;
    });
}

/// A sandbox that expires under a command is reported honestly, and the next command comes
/// back from the latest snapshot.
#[test]
fn expiry_under_a_command_is_reported_and_files_come_back() {
    paused_runtime().block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(TokioClock::starting_at(START_MS));
        let sim = Arc::new(SimProvider::new(3, SimFaults::none(), clock.clone()));
        let orch = open(dir.path(), &sim, &clock).await;
        let task = TaskId::new("exp").expect("id");
        orch.run(&task, "write f v1", None).await.expect("run");
        orch.suspend(&task).await.expect("suspend");
        orch.run(&task, "write f v2", None).await.expect("run");
        let live = sim.live_sandboxes();
        let run = {
            let orch = orch.clone();
            let task = task.clone();
            tokio::spawn(async move {
                orch.run(&task, "sleep 100000", Some(Duration::from_secs(200)))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        for sb in live {
            sim.expire_sandbox_now(&sb.id);
        }
        let err = run
            .await
            .expect("join")
            .expect_err("the sandbox expired under it");
        let msg = err.to_string();
        assert!(
            msg.contains("expired while `sleep 100000` was running"),
            "{msg}"
        );
        assert!(msg.contains("restored from snapshot"), "{msg}");
        // The failure is typed: the code the server answers with and the hint the CLI prints
        // come from the reason, not from matching the message.
        let taskbox::engine::EngineError::Request { reason, .. } = &err else {
            panic!("a failed request: {err:?}");
        };
        assert!(
            matches!(
                &**reason,
                taskbox::core::FailureReason::ExpiredDuringCommand {
                    restore_from: Some(_),
                    ..
                }
            ),
            "{reason:?}"
        );
        assert_eq!(err.code(), "sandbox_expired");
        assert!(err.hint().is_some_and(|h| h.contains("expiry")), "{err:?}");
        let out = orch.run(&task, "cat f", None).await.expect("run");
        assert_eq!(out.stdout, "v1", "files come back from the latest snapshot");
        orch.shutdown().await;
    });
}

async fn open_with(
    dir: &std::path::Path,
    sim: &Arc<SimProvider>,
    clock: &Arc<TokioClock>,
    cfg: Config,
) -> Orchestrator {
    Orchestrator::builder(dir.to_path_buf(), cfg)
        .provider(sim.clone())
        .clock(clock.clone())
        .jitter(Jitter::None)
        .reconcile_on_start(false)
        .open()
        .await
        .expect("open orchestrator")
}

/// While commands keep coming, the sandbox's deadline is extended (up to the plan's cap): the
/// task keeps one sandbox well past its initial timeout.
#[test]
fn deadlines_are_extended_while_work_goes_on() {
    paused_runtime().block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(TokioClock::starting_at(START_MS));
        let sim = Arc::new(SimProvider::new(5, SimFaults::none(), clock.clone()));
        let mut cfg = config();
        cfg.terminal.max_sandbox_lifetime_seconds = 3_600;
        let orch = open_with(dir.path(), &sim, &clock, cfg).await;
        let task = TaskId::new("busy").expect("id");
        orch.run(&task, "write f 0", None).await.expect("run");
        let first = sim.live_sandboxes()[0].id.clone();
        for i in 1..=20 {
            tokio::time::sleep(Duration::from_secs(60)).await;
            orch.run(&task, &format!("append f {i}"), None)
                .await
                .expect("run");
        }
        // 20 minutes on a sandbox created with a 5-minute timeout: still the same one.
        let live = sim.live_sandboxes();
        assert_eq!(live.len(), 1);
        assert_eq!(live[0].id, first, "the sandbox was extended, not recreated");
        assert!(
            sim.stats()
                .calls
                .get("extend timeout")
                .copied()
                .unwrap_or(0)
                > 0
        );
        orch.shutdown().await;
    });
}

/// When the plan allows no more time, a persistent task is checkpointed a margin before the
/// deadline, so the platform's expiry loses nothing written before the checkpoint.
#[test]
fn a_checkpoint_before_an_unextendable_deadline_keeps_the_files() {
    paused_runtime().block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(TokioClock::starting_at(START_MS));
        let sim = Arc::new(SimProvider::new(6, SimFaults::none(), clock.clone()));
        let mut cfg = config();
        cfg.terminal.sandbox_timeout_seconds = 300;
        cfg.terminal.max_sandbox_lifetime_seconds = 300; // nothing to extend
        cfg.terminal.lifetime_seconds = 3_600; // the idle reaper stays out of the way
        let orch = open_with(dir.path(), &sim, &clock, cfg).await;
        let task = TaskId::new("cp").expect("id");
        orch.run(&task, "write f precious", None)
            .await
            .expect("run");
        // Work goes on until past the deadline; without a checkpoint the platform's expiry at
        // 300 s would take the file with the sandbox.
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(60)).await;
            let _ = orch.run(&task, "true", None).await;
        }
        let out = orch.run(&task, "cat f", None).await.expect("run");
        assert_eq!(out.stdout, "precious");
        let view = orch.show(&task, 0).await.expect("show").expect("task");
        assert!(
            view.task.latest_complete().is_some(),
            "a checkpoint snapshot was taken"
        );
        orch.shutdown().await;
    });
}

/// Superseded snapshots are deleted once a newer one is confirmed; a failed delete is retried
/// later (on the next start), never forgotten.
#[test]
fn superseded_snapshots_are_pruned_and_failed_deletes_retried() {
    paused_runtime().block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(TokioClock::starting_at(START_MS));
        let sim = Arc::new(SimProvider::new(8, SimFaults::none(), clock.clone()));
        let orch = open(dir.path(), &sim, &clock).await;
        let task = TaskId::new("keep").expect("id");
        for i in 0..3 {
            orch.run(&task, &format!("write f {i}"), None)
                .await
                .expect("run");
            orch.suspend(&task).await.expect("suspend");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let present =
            |sim: &SimProvider| sim.snapshots().into_iter().filter(|s| s.present()).count();
        assert_eq!(present(&sim), 2, "keep_snapshots = 2");
        // Deletes fail now: the superseded snapshot is kept on record as `deleting`.
        sim.set_faults(SimFaults {
            delete_fail: 1.0,
            ..SimFaults::none()
        });
        orch.run(&task, "write f 3", None).await.expect("run");
        orch.suspend(&task).await.expect("suspend");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(present(&sim), 3, "the delete failed");
        let view = orch.show(&task, 0).await.expect("show").expect("task");
        assert!(view
            .task
            .snapshots
            .iter()
            .any(|s| s.status == taskbox::core::SnapshotStatus::Deleting));
        orch.shutdown().await;
        // The provider recovers; the next engine start retries the delete.
        sim.set_faults(SimFaults::none());
        let orch = open(dir.path(), &sim, &clock).await;
        let out = orch.run(&task, "cat f", None).await.expect("run");
        assert_eq!(out.stdout, "3");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(present(&sim), 2, "the failed delete was retried");
        orch.shutdown().await;
    });
}

/// The engine commits the transitions of every waiting message together (group commit). A
/// transition the store refuses — here because another writer moved the task on behind the
/// engine's back — fails the request that caused it, performs none of its commands, and leaves
/// the other tasks alone.
#[test]
fn a_transition_the_store_refuses_fails_its_request_and_nothing_else() {
    use taskbox::core::Event;
    use taskbox::engine::EngineError;
    use taskbox::store::{Store, StoreError, TransitionRecord};
    paused_runtime().block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(TokioClock::starting_at(START_MS));
        let sim = Arc::new(SimProvider::new(1, SimFaults::none(), clock.clone()));
        let orch = open(dir.path(), &sim, &clock).await;
        let (a, b) = (TaskId::new("a").expect("id"), TaskId::new("b").expect("id"));
        orch.run(&a, "write f 1", None).await.expect("run");

        let mut other = Store::open(&dir.path().join("taskbox.db")).expect("second handle");
        let stored = other.load_task("a").expect("load").expect("task a exists");
        let mut moved = stored.clone();
        moved.state = TaskState::Idle;
        other
            .commit(&TransitionRecord {
                at: START_MS,
                event: &Event::Recovered,
                state_before: stored.state,
                task_after: &moved,
                commands: &[],
            })
            .expect("the other writer commits");

        let (ra, rb) = tokio::join!(
            orch.run(&a, "write f 2", None),
            orch.run(&b, "write f 3; cat f", None)
        );
        match ra {
            Err(EngineError::Store(StoreError::StateConflict { task_id, .. })) => {
                assert_eq!(task_id, "a")
            }
            other => panic!("expected a state conflict for task a, got {other:?}"),
        }
        assert_eq!(rb.expect("task b is unaffected").stdout, "3");
        let sandbox_a = sim
            .live_sandboxes()
            .into_iter()
            .find(|s| s.task_id == "a")
            .expect("task a's sandbox is alive");
        assert_eq!(
            sandbox_a.files.get("f").map(String::as_str),
            Some("1"),
            "the refused transition's command was not performed"
        );
        orch.shutdown().await;
    });
}

/// A simulated platform whose first command fails transiently 210 ms before its sandbox's
/// deadline, so that the engine's retry falls 10 ms before the deadline.
struct FailsBeforeTheDeadline {
    inner: Arc<SimProvider>,
    clock: Arc<TokioClock>,
    failed: std::sync::atomic::AtomicBool,
}

impl taskbox::provider::Decorator for FailsBeforeTheDeadline {
    fn inner(&self) -> &dyn taskbox::provider::SandboxProvider {
        &*self.inner
    }
    fn exec_live<'a>(
        &'a self,
        sandbox_id: &'a taskbox::ids::SandboxId,
        req: &'a taskbox::provider::ExecRequest,
        io: taskbox::provider::ExecIo,
    ) -> taskbox::provider::ProviderFuture<'a, taskbox::provider::ExecOutput> {
        use taskbox::clock::Clock;
        use taskbox::provider::SandboxProvider;
        Box::pin(async move {
            if self.failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return self.inner.exec_live(sandbox_id, req, io).await;
            }
            let deadline = self
                .inner
                .probe_sandbox(sandbox_id)
                .await?
                .expect("a live sandbox");
            let at = deadline - 210;
            tokio::time::sleep(Duration::from_millis(at - self.clock.now_ms())).await;
            Err(taskbox::provider::ProviderError::transient(
                "run command",
                "503 service unavailable",
                None,
            ))
        })
    }
}

/// A retry's sleep is longer than the core's delay by the jitter, and a re-drive applies none.
/// A timer whose time falls between the two — here the sandbox's deadline, 10 ms after the
/// retry's time and before its jittered sleep wakes — must not overtake the retry: the engine
/// applies a timer whose time has passed before a later one, so the journal holds the retry
/// (its command run again) and then the deadline, as the re-drive's clock has them, and
/// re-drives identically.
#[test]
fn a_retry_lengthened_by_the_jitter_goes_before_a_later_timer_and_redrives() {
    use taskbox::core::{Command, Event, TimerKind};
    use taskbox::rng::SplitMix64;

    // A seed whose first jittered 200 ms retry sleeps past the deadline (at least 230 ms).
    let seed = (0..1000)
        .find(|s| Jitter::Seeded(SplitMix64::new(*s)).apply(200) >= 230)
        .expect("a seed");
    let dir = tempfile::tempdir().expect("temp dir");
    let journal = paused_runtime().block_on(async {
        let clock = Arc::new(TokioClock::starting_at(START_MS));
        let sim = Arc::new(SimProvider::new(1, SimFaults::none(), clock.clone()));
        let provider = Arc::new(FailsBeforeTheDeadline {
            inner: sim,
            clock: clock.clone(),
            failed: false.into(),
        });
        let mut cfg = config();
        cfg.terminal.container_persistent = false;
        cfg.terminal.sandbox_timeout_seconds = 300;
        cfg.terminal.max_sandbox_lifetime_seconds = 300;
        cfg.terminal.lifetime_seconds = 3_600;
        let orch = Orchestrator::builder(dir.path().to_path_buf(), cfg)
            .provider(provider)
            .clock(clock.clone())
            .jitter(Jitter::Seeded(SplitMix64::new(seed)))
            .reconcile_on_start(false)
            .open()
            .await
            .expect("open");
        let task = TaskId::new("jitter").expect("id");
        // The deadline ends the sandbox under the retried command.
        assert!(orch.run(&task, "true", None).await.is_err());
        orch.shutdown().await;
        Store::open_existing(&store_file(dir.path()))
            .expect("store")
            .journal("jitter")
            .expect("journal")
    });
    let reports = taskbox::replay::redrive::redrive(&journal).expect("re-drive runs");
    assert!(reports[0].divergence.is_none(), "{:?}", reports[0]);
    let timers: Vec<TimerKind> = journal
        .iter()
        .filter_map(|e| match e.event {
            Event::TimerFired {
                timer: timer @ (TimerKind::Retry | TimerKind::Deadline),
            } => Some(timer),
            _ => None,
        })
        .collect();
    assert_eq!(
        timers,
        [TimerKind::Retry, TimerKind::Deadline],
        "{journal:#?}"
    );
    let retried = journal
        .iter()
        .find(|e| {
            matches!(
                e.event,
                Event::TimerFired {
                    timer: TimerKind::Retry
                }
            )
        })
        .expect("the retry");
    assert!(
        retried
            .commands
            .iter()
            .any(|c| matches!(c, Command::RunCommand { .. })),
        "{retried:#?}"
    );
}
