//! `taskbox fork` through the library: a new task starts `expired` from one of its parent's
//! snapshots, shared with the parent (never copied), and a shared snapshot is deleted only when
//! no task retains it — on the simulated platform (a property over interleavings, with
//! crashes), the local backend (real archives) and the fake Vercel server.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use taskbox::clock::TokioClock;
use taskbox::config::Config;
use taskbox::core::{ForkFrom, SnapshotStatus, TaskState};
use taskbox::engine::{EngineError, Orchestrator};
use taskbox::provider::sim::{SimFaults, SimProvider};
use taskbox::retry::Jitter;
use taskbox::TaskId;

use crate::support::paused_runtime;

const START_MS: u64 = 1_700_000_000_000;

fn config(keep: u32) -> Config {
    let mut c = Config::default();
    c.terminal.lifetime_seconds = 120;
    c.terminal.sandbox_timeout_seconds = 300;
    c.terminal.max_sandbox_lifetime_seconds = 600;
    c.terminal.checkpoint_margin_seconds = 30;
    c.terminal.timeout = 60;
    c.terminal.keep_snapshots = keep;
    c
}

async fn open(
    dir: &std::path::Path,
    sim: &Arc<SimProvider>,
    clock: &Arc<TokioClock>,
    keep: u32,
) -> Orchestrator {
    Orchestrator::builder(dir.to_path_buf(), config(keep))
        .provider(sim.clone())
        .clock(clock.clone())
        .jitter(Jitter::None)
        .reconcile_on_start(false)
        .open()
        .await
        .expect("open orchestrator")
}

fn id(s: &str) -> TaskId {
    TaskId::new(s).expect("task id")
}

/// Every snapshot a task (not removed) retains as complete exists on the platform, not deleted
/// — above all each task's latest complete one, its restore source. Ground truth is the
/// simulated platform's.
async fn check_retained(
    orch: &Orchestrator,
    sim: &SimProvider,
    removed: &BTreeSet<String>,
) -> Result<(), TestCaseError> {
    let deleted: BTreeSet<String> = sim
        .snapshots()
        .into_iter()
        .filter(|s| s.deleted)
        .map(|s| s.id)
        .collect();
    for t in orch.tasks().await.expect("tasks") {
        if removed.contains(t.id.as_str()) {
            continue;
        }
        for rec in &t.snapshots {
            if rec.status != SnapshotStatus::Complete {
                continue;
            }
            let sid = rec.id.as_deref().unwrap_or_default();
            let latest = t.latest_complete().and_then(|l| l.id.as_deref()) == Some(sid);
            prop_assert!(
                !deleted.contains(sid),
                "task {} retains snapshot {sid} (seq {}, latest: {latest}, lineage {:?}) but \
                 the platform deleted it",
                t.id,
                rec.seq,
                t.lineage
            );
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Action {
    Write(usize, u32),
    Suspend(usize),
    /// Fork task `.0`: from its latest snapshot, or from its snapshot seq `.1`.
    Fork(usize, Option<u64>),
    Sleep(u64),
    Gc,
    Remove(usize),
    Crash,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        5 => (0usize..8, 0u32..1000).prop_map(|(t, v)| Action::Write(t, v)),
        3 => (0usize..8).prop_map(Action::Suspend),
        3 => (0usize..8, proptest::option::of(1u64..5)).prop_map(|(t, s)| Action::Fork(t, s)),
        2 => prop_oneof![Just(5_000u64), Just(130_000), Just(400_000)].prop_map(Action::Sleep),
        1 => Just(Action::Gc),
        1 => (0usize..8).prop_map(Action::Remove),
        1 => Just(Action::Crash),
    ]
}

/// Transient faults and lost answers; no snapshot vanishes behind the engine's back (that would
/// be the platform deleting, not taskbox).
fn faults() -> SimFaults {
    SimFaults {
        rate_limit: 0.03,
        retry_after_ms: 2_000,
        server_error: 0.03,
        timeout: 0.02,
        timeout_ms: 5_000,
        delete_fail: 0.1,
        snapshot_fail_transient: 0.03,
        latency_min_ms: 1,
        latency_max_ms: 200,
        ..SimFaults::none()
    }
}

fn scenario(seed: u64, actions: Vec<Action>) -> Result<(), TestCaseError> {
    paused_runtime().block_on(async move {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(TokioClock::starting_at(START_MS));
        let sim = Arc::new(SimProvider::new(seed, faults(), clock.clone()));
        // One snapshot kept per task: retention drops a parent's record as soon as it can.
        let mut orch = open(dir.path(), &sim, &clock, 1).await;
        let mut tasks = vec!["p".to_string()];
        let mut removed = BTreeSet::new();
        let _ = orch.run(&id("p"), "write f start", None).await;
        for action in actions {
            let pick = |i: usize| tasks[i % tasks.len()].clone();
            match action {
                Action::Write(t, v) => {
                    let _ = orch.run(&id(&pick(t)), &format!("write f {v}"), None).await;
                }
                Action::Suspend(t) => {
                    let _ = orch.suspend(&id(&pick(t))).await;
                }
                Action::Fork(t, seq) => {
                    let child = format!("c{}", tasks.len());
                    let from = seq.map_or(ForkFrom::Latest, |seq| ForkFrom::Seq { seq });
                    if orch.fork(&id(&pick(t)), &id(&child), from).await.is_ok() {
                        tasks.push(child);
                    }
                }
                Action::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                Action::Gc => {
                    let _ = orch.gc(false).await;
                }
                Action::Remove(t) => {
                    let t = pick(t);
                    if orch.remove(&id(&t), false).await.is_ok() {
                        removed.insert(t);
                    }
                }
                Action::Crash => {
                    orch.abort().await;
                    orch = open(dir.path(), &sim, &clock, 1).await;
                }
            }
            check_retained(&orch, &sim, &removed).await?;
        }
        // Settle; then every fork still there restores its files.
        tokio::time::sleep(Duration::from_secs(120)).await;
        let _ = orch.gc(false).await;
        check_retained(&orch, &sim, &removed).await?;
        for t in orch.tasks().await.expect("tasks") {
            if removed.contains(t.id.as_str()) || t.lineage.is_none() {
                continue;
            }
            let mut out = orch.run(&t.id, "cat f", None).await;
            if out.is_err() {
                // A transient fault may use up a request's attempts; a second try must work.
                out = orch.run(&t.id, "cat f", None).await;
            }
            prop_assert!(out.is_ok(), "fork {} cannot restore: {:?}", t.id, out.err());
        }
        check_retained(&orch, &sim, &removed).await?;
        orch.shutdown_within(Duration::from_secs(600)).await;
        check_derived(dir.path())
    })
}

/// The snapshot and sandbox rows, and who retains each snapshot, are what the tasks' histories
/// imply (`store::model`): the rows row for row; the holders of every snapshot a task names,
/// asked by that task (the store finds them through the forks' shares, the model through every
/// task's records).
fn check_derived(dir: &std::path::Path) -> Result<(), TestCaseError> {
    let store = taskbox::store::Store::open_existing(&dir.join("taskbox.db")).expect("store");
    let (sandboxes, snapshots) = crate::store::model::rows_of(&store, None);
    prop_assert_eq!(store.sandboxes(None).expect("rows"), sandboxes);
    prop_assert_eq!(store.snapshots(None).expect("rows"), snapshots);
    for t in store.load_tasks().expect("tasks") {
        for p in t.snapshots.iter().filter_map(|r| r.id.as_ref()) {
            prop_assert_eq!(
                store
                    .snapshot_holders(p.as_str(), t.id.as_str())
                    .expect("holders"),
                crate::store::model::holders(&store, p.as_str(), t.id.as_str()),
                "holders of {} asked by {}",
                p.as_str(),
                t.id
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::support::proptest_cases(32, 128), max_shrink_iters: 200, failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/fork.txt"))), ..ProptestConfig::default() })]

    /// Any interleaving of runs, suspends, forks, retention, gc, removals and crashes never
    /// deletes a snapshot that some task retains — its latest complete one above all.
    #[test]
    fn a_shared_snapshot_is_never_deleted_while_a_task_retains_it(seed in any::<u64>(), actions in proptest::collection::vec(action(), 1..24)) {
        scenario(seed, actions)?;
    }
}

/// The fork's lineage, its files, the parent's retention releasing (not deleting) the shared
/// snapshot, and the last holder deleting it.
#[test]
fn a_fork_starts_expired_from_the_parents_snapshot_and_the_last_holder_deletes_it() {
    paused_runtime().block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(TokioClock::starting_at(START_MS));
        let sim = Arc::new(SimProvider::new(3, SimFaults::none(), clock.clone()));
        let orch = open(dir.path(), &sim, &clock, 1).await;
        let (p, c) = (id("demo"), id("demo-alt"));
        orch.run(&p, "write f one", None).await.expect("run");
        // The parent is live: the fork snapshots it first.
        let fork = orch.fork(&p, &c, ForkFrom::Latest).await.expect("fork");
        assert_eq!(
            (fork.task.as_str(), fork.parent.as_str()),
            ("demo-alt", "demo")
        );
        assert_eq!(fork.parent_seq, 1);
        let parent = orch.show(&p, 0).await.expect("show").expect("parent");
        assert_eq!(
            parent.task.state,
            TaskState::Expired,
            "the snapshot stopped it"
        );
        let child = orch.show(&c, 0).await.expect("show").expect("child");
        assert_eq!(child.task.state, TaskState::Expired);
        let lineage = child.task.lineage.clone().expect("lineage");
        assert_eq!(lineage.parent, p);
        assert_eq!(lineage.snapshot, fork.snapshot_id);
        assert_eq!(
            child.task.latest_complete().and_then(|s| s.id.clone()),
            Some(fork.snapshot_id.clone()),
            "the child's restore source is the parent's snapshot"
        );
        // Both run on from the same files, each in a sandbox of its own.
        assert_eq!(
            orch.run(&c, "cat f", None).await.expect("run").stdout,
            "one"
        );
        orch.run(&c, "write f two", None).await.expect("run");
        assert_eq!(
            orch.run(&p, "cat f", None).await.expect("run").stdout,
            "one"
        );
        // The parent keeps one snapshot: its next one retires the shared record, which another
        // task retains, so it is released, not deleted.
        orch.suspend(&p).await.expect("suspend");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let parent = orch.show(&p, 0).await.expect("show").expect("parent");
        let shared = parent
            .task
            .snapshots
            .iter()
            .find(|s| s.id.as_ref() == Some(&fork.snapshot_id))
            .expect("record");
        assert_eq!(shared.status, SnapshotStatus::Released);
        let on_platform = |sid: &str| {
            sim.snapshots()
                .into_iter()
                .find(|s| s.id == sid)
                .is_some_and(|s| !s.deleted)
        };
        assert!(on_platform(&fork.snapshot_id), "still retained by the fork");
        // gc counts the fork's reference too.
        let report = orch.gc(false).await.expect("gc");
        assert!(report.snapshots_deleted.is_empty(), "{report:?}");
        assert!(on_platform(&fork.snapshot_id));
        // The child's own snapshot retires its inherited record: no task retains it any more.
        orch.suspend(&c).await.expect("suspend");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !on_platform(&fork.snapshot_id),
            "the last holder deleted it"
        );
        let child = orch.show(&c, 0).await.expect("show").expect("child");
        assert_eq!(child.task.snapshots[0].status, SnapshotStatus::Deleted);
        assert_eq!(
            orch.run(&c, "cat f", None).await.expect("run").stdout,
            "two"
        );
        orch.shutdown().await;
    })
}

/// `taskbox rm` of a parent leaves the snapshot its fork starts from.
#[test]
fn removing_the_parent_keeps_the_snapshot_a_fork_retains() {
    paused_runtime().block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(TokioClock::starting_at(START_MS));
        let sim = Arc::new(SimProvider::new(4, SimFaults::none(), clock.clone()));
        let orch = open(dir.path(), &sim, &clock, 2).await;
        let (p, c) = (id("base"), id("branch"));
        orch.run(&p, "write f base", None).await.expect("run");
        orch.suspend(&p).await.expect("suspend");
        let fork = orch.fork(&p, &c, ForkFrom::Latest).await.expect("fork");
        let rm = orch.remove(&p, false).await.expect("rm");
        assert!(rm.snapshots_deleted.is_empty(), "{rm:?}");
        assert_eq!(rm.snapshots_kept, vec![fork.snapshot_id.to_string()]);
        orch.gc(false).await.expect("gc");
        assert_eq!(
            orch.run(&c, "cat f", None).await.expect("run").stdout,
            "base"
        );
        orch.shutdown().await;
    })
}

/// Forking from a named snapshot, and every refusal: clear errors with stable codes, nothing
/// created.
#[test]
fn fork_errors_name_the_problem_and_create_nothing() {
    paused_runtime().block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(TokioClock::starting_at(START_MS));
        let sim = Arc::new(SimProvider::new(5, SimFaults::none(), clock.clone()));
        let orch = open(dir.path(), &sim, &clock, 3).await;
        let p = id("demo");
        orch.run(&p, "write f one", None).await.expect("run");
        orch.suspend(&p).await.expect("suspend");
        orch.run(&p, "write f two", None).await.expect("run");
        orch.suspend(&p).await.expect("suspend");
        // An older snapshot, by sequence number and by provider id.
        let old = orch
            .fork(&p, &id("demo-old"), ForkFrom::Seq { seq: 1 })
            .await
            .expect("fork s1");
        assert_eq!(old.parent_seq, 1);
        assert_eq!(
            orch.run(&id("demo-old"), "cat f", None)
                .await
                .expect("run")
                .stdout,
            "one"
        );
        let by_id = orch
            .fork(
                &p,
                &id("demo-id"),
                ForkFrom::Id {
                    snapshot_id: old.snapshot_id.clone(),
                },
            )
            .await
            .expect("fork by id");
        assert_eq!(by_id.snapshot_id, old.snapshot_id);
        let code = |r: Result<taskbox::engine::ForkResult, EngineError>| match r {
            Ok(r) => panic!("forked: {r:?}"),
            Err(e) => (e.code(), e.to_string(), e.hint()),
        };
        let (c, msg, _) = code(orch.fork(&id("nope"), &id("x1"), ForkFrom::Latest).await);
        assert_eq!(c, "no_such_task", "{msg}");
        let (c, msg, _) = code(orch.fork(&p, &id("demo-old"), ForkFrom::Latest).await);
        assert_eq!(c, "task_exists", "{msg}");
        assert!(msg.contains("demo-old"), "{msg}");
        let (c, msg, _) = code(orch.fork(&p, &p, ForkFrom::Latest).await);
        assert_eq!(c, "task_exists", "{msg}");
        let (c, msg, hint2) = code(orch.fork(&p, &id("x2"), ForkFrom::Seq { seq: 9 }).await);
        assert_eq!(c, "unknown_snapshot", "{msg}");
        assert!(msg.contains("demo.s9") && msg.contains("demo.s2"), "{msg}");
        assert!(hint2.is_some_and(|h| h.contains("taskbox show")));
        // A task with nothing to fork from.
        orch.resume(&id("demo-old")).await.expect("resume");
        let fresh = id("fresh");
        orch.run(&fresh, "write g 1", None).await.expect("run");
        let nothing = orch.fork(&fresh, &id("x3"), ForkFrom::Seq { seq: 1 }).await;
        assert_eq!(code(nothing).0, "unknown_snapshot");
        for t in ["x1", "x2", "x3"] {
            assert!(
                orch.show(&id(t), 0).await.expect("show").is_none(),
                "{t} was not created"
            );
        }
        // Lineage is journaled: the parent's request, the child's first events.
        let parent = orch.show(&p, 100).await.expect("show").expect("task");
        let forks: Vec<_> = parent
            .journal
            .iter()
            .filter(|e| e.event.name() == "fork_requested")
            .collect();
        // demo-old, demo-id and the unknown snapshot; a child name in use and a fork into
        // itself are refused before anything is journaled.
        assert_eq!(
            forks.len(),
            3,
            "every fork request demo served is journaled"
        );
        let child = orch
            .show(&id("demo-old"), 100)
            .await
            .expect("show")
            .expect("task");
        let names: Vec<_> = child.journal.iter().map(|e| e.event.name()).collect();
        assert_eq!(&names[..2], &["settings_changed", "forked"]);
        orch.shutdown().await;
    })
}

/// The local backend: a fork restores the parent's archive without copying it (no archive
/// appears under the child's name before its own first snapshot), and the parent's files are
/// its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_fork_shares_the_archive_and_the_files_diverge() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = Config::default();
    cfg.terminal.keep_snapshots = 1;
    let orch = Orchestrator::builder(dir.path().to_path_buf(), cfg)
        .reconcile_on_start(false)
        .open()
        .await
        .expect("open");
    let (p, c) = (id("demo"), id("demo-alt"));
    orch.run(
        &p,
        "mkdir -p src && echo v1 > src/a.txt && ln -s src/a.txt link",
        None,
    )
    .await
    .expect("run");
    let fork = orch.fork(&p, &c, ForkFrom::Latest).await.expect("fork");
    let archives = |task: &str| -> Vec<String> {
        std::fs::read_dir(dir.path().join("local").join("snapshots").join(task))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(archives("demo").len(), 1);
    assert!(
        archives("demo-alt").is_empty(),
        "nothing copied for the fork"
    );
    let out = orch
        .run(&c, "cat link; readlink link; echo v2 > src/a.txt", None)
        .await
        .expect("run");
    assert_eq!(out.stdout, "v1\nsrc/a.txt\n");
    let out = orch.run(&p, "cat src/a.txt", None).await.expect("run");
    assert_eq!(out.stdout, "v1\n", "the parent's files are its own");
    // The parent's next snapshot retires its record of the shared archive; the fork still
    // holds it, so it stays on disk.
    orch.suspend(&p).await.expect("suspend");
    let shared_file = archives("demo")
        .into_iter()
        .filter(|n| fork.snapshot_id.ends_with(n.trim_end_matches(".tbx")))
        .count();
    assert_eq!(
        shared_file,
        1,
        "{:?} {}",
        archives("demo"),
        fork.snapshot_id
    );
    orch.suspend(&c).await.expect("suspend");
    let out = orch.run(&c, "cat src/a.txt", None).await.expect("run");
    assert_eq!(out.stdout, "v2\n");
    orch.shutdown().await;
}

/// `taskbox fork`, `show`, `tasks --tree` and the errors, end to end: a one-shot engine and
/// through an auto-started server (the CLI as its client, `POST /v1/tasks/{task}/fork`).
#[test]
fn cli_fork_in_process_and_through_a_server() {
    use crate::support::{ok, stderr, stdout, Home};
    let json = |s: &str| -> serde_json::Value {
        serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
    };
    let local = Home::new();
    let served = crate::server::ServerHome::new();
    for home in [&local, &served.home] {
        ok(&home.run(&["run", "-t", "demo", "--", "echo a > f"]));
        let v = json(&ok(&home.run(&["fork", "demo", "demo-alt", "--json"])));
        assert_eq!(
            (v["task"].as_str(), v["parent"].as_str()),
            (Some("demo-alt"), Some("demo"))
        );
        assert_eq!(v["parent_seq"], 1, "{v}");
        assert_eq!(
            ok(&home.run(&["run", "-t", "demo-alt", "--", "cat f"])),
            "a\n"
        );
        ok(&home.run(&["run", "-t", "demo", "--", "echo b > f"]));
        ok(&home.run(&["suspend", "demo"]));
        let o = home.run(&["fork", "demo", "demo-old", "--snapshot", "demo.s1"]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("forked demo-old from demo.s1"),
            "{}",
            stderr(&o)
        );
        assert_eq!(
            ok(&home.run(&["run", "-t", "demo-old", "--", "cat f"])),
            "a\n"
        );
        assert_eq!(ok(&home.run(&["run", "-t", "demo", "--", "cat f"])), "b\n");

        let show = ok(&home.run(&["show", "demo-alt"]));
        assert!(
            show.contains("forked from: demo at snapshot demo.s1"),
            "{show}"
        );
        let show = json(&ok(&home.run(&["show", "demo-old", "--json"])));
        assert_eq!(show["task"]["lineage"]["parent"], "demo", "{show}");
        assert!(show["task"]["lineage"]["forked_at"].is_string(), "{show}");
        let tree = ok(&home.run(&["tasks", "--tree"]));
        assert!(tree.starts_with("demo  "), "{tree}");
        assert!(
            tree.contains("\n└─ demo-alt  ") && tree.contains("\n└─ demo-old  "),
            "{tree}"
        );
        let tree = json(&ok(&home.run(&["tasks", "--tree", "--json"])));
        assert_eq!(tree.as_array().map(Vec::len), Some(1), "{tree}");
        assert_eq!(tree[0]["forks"].as_array().map(Vec::len), Some(2), "{tree}");
        let flat = json(&ok(&home.run(&["tasks", "--json"])));
        let alt = flat
            .as_array()
            .and_then(|a| a.iter().find(|t| t["task"] == "demo-alt"))
            .cloned()
            .expect("demo-alt listed");
        assert_eq!(alt["parent"], "demo", "{alt}");
        assert_eq!(alt["forked_from"]["seq"], 1, "{alt}");

        // Errors: exit 125, a stable code and a hint under --json.
        for (args, code) in [
            (&["fork", "nope", "x1", "--json"][..], "no_such_task"),
            (&["fork", "demo", "demo-alt", "--json"], "task_exists"),
            (
                &["fork", "demo", "x2", "--snapshot", "demo.s99", "--json"],
                "unknown_snapshot",
            ),
            (&["fork", "demo", "../x", "--json"], "invalid_task_id"),
            // The same code as the server's for a bad id anywhere (it was `error` here).
            (
                &["run", "-t", "../x", "--json", "--", "true"],
                "invalid_task_id",
            ),
        ] {
            let o = home.run(args);
            assert_eq!(o.status.code(), Some(125), "{args:?}: {}", stderr(&o));
            let e = json(&stdout(&o));
            assert_eq!(e["code"], code, "{args:?}: {e}");
            assert!(e["hint"].is_string(), "{args:?}: {e}");
        }
        let o = home.run(&["fork", "demo", "x2", "--snapshot", "demo.s99"]);
        assert!(
            stderr(&o).contains("demo.s99") && stderr(&o).contains("retained"),
            "{}",
            stderr(&o)
        );
        // The journals replay as recorded, forks included.
        for t in ["demo", "demo-alt", "demo-old"] {
            ok(&home.run(&["replay", t]));
        }
        // And re-drive identically, one task at a time: the parent's fork requests, each
        // child's restore of the parent's snapshot (its lineage given from the journal).
        for t in ["demo", "demo-alt", "demo-old"] {
            let v = json(&ok(&home.run(&["replay", t, "--redrive", "--json"])));
            let r = &v["redrive"][0];
            assert_eq!(r["task_id"], t, "{v}");
            assert_eq!(r["divergence"], serde_json::Value::Null, "{t}: {v}");
            assert!(r["calls_expected"].as_u64().unwrap_or(0) > 0, "{t}: {v}");
            assert_eq!(r["calls_made"], r["calls_expected"], "{t}: {v}");
        }
        if std::ptr::eq(home, &served.home) {
            ok(&home.run(&["serve", "--stop"]));
        }
    }
}

/// The Vercel backend against the fake: the fork is a create from the parent's snapshot id
/// (`source: {type: "snapshot"}`) at the fork's first command, the snapshot shared, and the
/// parent's retention releases it while the fork retains it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vercel_fork_creates_from_the_parents_snapshot_id() {
    use crate::vercel_engine::{open as open_vercel, start_fake, vercel_config};
    let dir = tempfile::tempdir().expect("dir");
    let fake = start_fake(dir.path(), taskbox::fake::Faults::default()).await;
    let mut cfg = vercel_config(&fake.base_url());
    cfg.terminal.keep_snapshots = 1;
    let orch = open_vercel(&dir.path().join("data"), &fake, &cfg).await;
    let (p, c) = (id("vdemo"), id("vdemo-alt"));
    orch.run(&p, "echo one > f", None).await.expect("run");
    let fork = orch.fork(&p, &c, ForkFrom::Latest).await.expect("fork");
    let out = orch
        .run(&c, "cat f; echo two > f", None)
        .await
        .expect("run");
    assert_eq!(out.stdout, "one\n");
    let view = orch.show(&c, 0).await.expect("show").expect("child");
    let sb = view
        .task
        .sandbox
        .as_ref()
        .expect("the fork has a sandbox of its own");
    assert_eq!(sb.source_snapshot.as_ref(), Some(&fork.snapshot_id));
    // The parent's next snapshot retires its record; the fork still holds the snapshot.
    assert_eq!(
        orch.run(&p, "cat f", None).await.expect("run").stdout,
        "one\n"
    );
    orch.suspend(&p).await.expect("suspend");
    let listed = || async {
        orch.provider()
            .list_snapshots(orch.installation_id())
            .await
            .expect("list")
            .into_iter()
            .filter(|s| s.live)
            .map(|s| s.id)
            .collect::<Vec<_>>()
    };
    assert!(listed().await.contains(&fork.snapshot_id.to_string()));
    let report = orch.gc(false).await.expect("gc");
    assert!(report.snapshots_deleted.is_empty(), "{report:?}");
    // The fork's own snapshot: it was the last holder, so the shared one is deleted now.
    orch.suspend(&c).await.expect("suspend");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while listed().await.contains(&fork.snapshot_id.to_string()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the shared snapshot was not deleted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        orch.run(&c, "cat f", None).await.expect("run").stdout,
        "two\n"
    );
    orch.shutdown().await;
}

/// The chaos checker's fork invariants hold on a real fork's journal and platform records, and
/// fail when the platform record says the shared snapshot was deleted while still retained
/// (the checks can fail: with the engine's release guard removed, `taskbox chaos` reports
/// `deleted-while-referenced` on most seeds).
#[test]
fn the_chaos_fork_checks_hold_on_a_real_fork_and_catch_a_deleted_source() {
    use taskbox::chaos::check::{self, Invariant, PlatformSnapshot};
    paused_runtime().block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(TokioClock::starting_at(START_MS));
        let sim = Arc::new(SimProvider::new(8, SimFaults::none(), clock.clone()));
        let orch = open(dir.path(), &sim, &clock, 1).await;
        orch.run(&id("a"), "write f 1", None).await.expect("run");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let fork = orch
            .fork(&id("a"), &id("b"), ForkFrom::Latest)
            .await
            .expect("fork");
        orch.run(&id("b"), "cat f", None).await.expect("run");
        orch.shutdown().await;
        let store = taskbox::store::Store::open(&dir.path().join("taskbox.db")).expect("store");
        let mut entries = store.journal("a").expect("journal");
        entries.extend(store.journal("b").expect("journal"));
        entries.sort_by_key(|e| e.seq);
        let snapshots: Vec<PlatformSnapshot> = sim.snapshots().iter().map(Into::into).collect();
        let none = std::collections::BTreeMap::new();
        assert!(check::forks(&entries, &snapshots, &none).is_empty());
        assert!(check::deleted_while_referenced(&entries, &none).is_empty());
        let forked_at = entries
            .iter()
            .find(|e| e.event.name() == "forked")
            .map(|e| e.at)
            .expect("forked entry");
        let deleted: std::collections::BTreeMap<String, u64> =
            [(fork.snapshot_id.to_string(), forked_at - 1)].into();
        let v = check::forks(&entries, &snapshots, &deleted);
        assert!(
            v.iter().any(|v| v.invariant == Invariant::ForkSource),
            "{v:?}"
        );
        // Deleted as the fork was made: the fork (and the parent) retained it then.
        let deleted: std::collections::BTreeMap<String, u64> =
            [(fork.snapshot_id.to_string(), forked_at)].into();
        let v = check::deleted_while_referenced(&entries, &deleted);
        assert!(
            v.iter()
                .any(|v| v.invariant == Invariant::DeletedWhileReferenced),
            "{v:?}"
        );
    })
}

/// The core refuses a fork of a task that keeps no snapshots, even one with an old complete
/// snapshot from before persistence was switched off (its files are no longer the task's).
#[test]
fn a_task_that_keeps_no_snapshots_has_nothing_to_fork() {
    use taskbox::core::{step, Event, FailureReason, Reply, Task, TaskSettings};
    let mut t = Task::new(id("np"), TaskSettings::default(), START_MS);
    t.state = TaskState::Expired;
    t.snapshots.push(taskbox::core::SnapshotRecord {
        seq: 1,
        id: Some(crate::support::snap("np.s1.x")),
        status: SnapshotStatus::Complete,
        size_bytes: 1,
        sandbox_id: crate::support::sbx("sb"),
        started_at: START_MS,
        created_at: Some(START_MS),
        expires_at: None,
        omitted: Vec::new(),
        taken_by: None,
        kind: None,
    });
    let fork = |t: &Task| {
        let tr = step(
            t,
            Event::ForkRequested {
                request_id: 1,
                child: id("np-alt"),
                from: ForkFrom::Latest,
            },
            START_MS + 1,
        )
        .expect("step");
        tr.commands
            .into_iter()
            .find_map(|c| match c {
                taskbox::core::Command::Reply { reply, .. } => Some(reply),
                _ => None,
            })
            .expect("a reply")
    };
    assert!(matches!(fork(&t), Reply::Forked { .. }));
    t.settings.persistent = false;
    match fork(&t) {
        Reply::Failed { reason, .. } => {
            assert_eq!(reason, FailureReason::NothingToFork { persistent: false });
            assert_eq!(reason.code(), "nothing_to_fork");
        }
        other => panic!("{other:?}"),
    }
}
