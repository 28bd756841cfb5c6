//! Two stores on one file (one database) committing interleaved, and group commit (`commit_batch`) equal to the
//! same single commits.

use std::sync::{Arc, Barrier};

use taskbox::core::{Event, Task, TaskSettings, TaskState, TimerKind};
use taskbox::store::{Store, StoreError, TransitionRecord};

use super::{lifecycle, on_both_stores, Kind, Owned};
use crate::support::tid;

on_both_stores! {
fn two_stores_on_one_file_commit_interleaved_without_loss(db) {
    const PER_TASK: u64 = 25;
    // Opened here, not in the threads: a thread failing before the barrier would leave the
    // other waiting forever.
    let stores = [db.open(), db.open()];
    let barrier = Arc::new(Barrier::new(2));
    let workers: Vec<_> = ["x", "y"]
        .into_iter()
        .zip(stores)
        .map(|(prefix, mut store)| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || -> Result<Vec<u64>, StoreError> {
                let ids = [format!("{prefix}1"), format!("{prefix}2")];
                let mut tasks: Vec<Task> = ids
                    .iter()
                    .map(|id| Task::new(tid(id), TaskSettings::default(), 0))
                    .collect();
                barrier.wait();
                let mut seqs = Vec::new();
                for n in 0..PER_TASK {
                    for task in &mut tasks {
                        task.last_activity = n;
                        let rec = TransitionRecord {
                            at: n,
                            event: &Event::TimerFired {
                                timer: TimerKind::Idle,
                            },
                            state_before: TaskState::Idle,
                            task_after: task,
                            commands: &[],
                        };
                        seqs.push(store.commit(&rec)?);
                    }
                }
                Ok(seqs)
            })
        })
        .collect();
    let mut all_seqs = Vec::new();
    for worker in workers {
        all_seqs.extend(worker.join().expect("no panic").expect("no store error"));
    }
    let n = all_seqs.len();
    all_seqs.sort_unstable();
    all_seqs.dedup();
    assert_eq!(all_seqs.len(), n, "every commit got its own journal seq");

    let store = db.open();
    assert_eq!(store.task_ids().expect("ids"), ["x1", "x2", "y1", "y2"]);
    for id in ["x1", "x2", "y1", "y2"] {
        let journal = store.journal(id).expect("journal");
        assert_eq!(
            journal.iter().map(|e| e.task_seq).collect::<Vec<_>>(),
            (1..=PER_TASK).collect::<Vec<_>>(),
            "task {id}"
        );
        let task = store.load_task(id).expect("load").expect("present");
        assert_eq!(task.last_activity, PER_TASK - 1);
    }
}
}

on_both_stores! {
fn commit_batch_equals_the_same_single_commits(db) {
    let (single_db, batch_db) = (db.sibling("single"), db.sibling("batch"));
    let mut single = single_db.open();
    let mut batch = batch_db.open();

    // Two tasks interleaved, with several records of one task inside one batch.
    let a = lifecycle("a", 1_000);
    let b = lifecycle("b", 1_005);
    let mut steps = Vec::new();
    for (sa, sb) in a.iter().zip(&b) {
        steps.push(sa.clone());
        steps.push(sb.clone());
    }
    let single_seqs: Vec<u64> = steps
        .iter()
        .map(|s| single.commit(&s.rec()).expect("commit"))
        .collect();
    let (first, rest) = steps.split_at(3);
    let mut batch_seqs = batch
        .commit_batch(&first.iter().map(Owned::rec).collect::<Vec<_>>())
        .expect("batch 1");
    batch_seqs.extend(
        batch
            .commit_batch(&rest.iter().map(Owned::rec).collect::<Vec<_>>())
            .expect("batch 2"),
    );
    assert!(batch.commit_batch(&[]).expect("empty batch").is_empty());

    assert_eq!(batch_seqs, single_seqs);
    assert_eq!(
        batch.load_tasks().expect("tasks"),
        single.load_tasks().expect("tasks")
    );
    for id in ["a", "b"] {
        assert_eq!(
            batch.journal(id).expect("j"),
            single.journal(id).expect("j")
        );
    }
    assert_eq!(
        batch.snapshots(None).expect("s"),
        single.snapshots(None).expect("s")
    );
    assert_eq!(
        batch.sandboxes(None).expect("s"),
        single.sandboxes(None).expect("s")
    );
    // And both are what the transitions imply.
    let (sandboxes, snapshots): (Vec<_>, Vec<_>) = {
        let rows = |t: &[Owned]| crate::store::model::sandbox_rows(t.iter().map(|s| (s.at, &s.task)));
        (
            [rows(&a), rows(&b)].concat(),
            [&a, &b]
                .iter()
                .flat_map(|t| crate::store::model::snapshot_rows(&t.last().expect("steps").task))
                .collect(),
        )
    };
    assert_eq!(batch.sandboxes(None).expect("s"), sandboxes);
    assert_eq!(batch.snapshots(None).expect("s"), snapshots);
}
}

on_both_stores! {
/// A batch with several transitions of one task leaves the task at the last of them (its state
/// and when it changed: PostgreSQL's task row, SQLite's last journal row; its JSON); a store that committed before notices another connection's
/// commit (its stale view of the task's state is refused, not trusted); a store opened cold
/// continues a task's journal numbering; and a reopened store reads the same tasks.
fn a_batch_leaves_each_task_row_at_its_last_transition(db) {
    let a = lifecycle("a", 1_000);
    let b = lifecycle("b", 1_005);
    assert_eq!(a.len(), 4, "the lifecycle this test walks");
    let mut store = db.open();
    store
        .commit_batch(&[a[0].rec(), b[0].rec(), a[1].rec(), b[1].rec()])
        .expect("batch");
    assert_eq!(store.load_task("a").expect("load"), Some(a[1].task.clone()));
    assert_eq!(store.load_task("b").expect("load"), Some(b[1].task.clone()));
    // The task's state and when it last changed: on SQLite its last journal row's.
    let row = |id: &str| match db.kind {
        Kind::Sqlite => db.text(&format!(
            "SELECT state_after || ' ' || CAST(at AS TEXT) FROM journal WHERE task_id = '{id}' \
             ORDER BY task_seq DESC LIMIT 1"
        )),
        Kind::Postgres => db.text(&format!(
            "SELECT state || ' ' || CAST(updated_at AS TEXT) FROM tasks WHERE id = '{id}'"
        )),
    };
    // On PostgreSQL the row also holds the task after its last journal row (on SQLite the
    // journal alone holds it). Read through the store: a journal row may hold only what changed.
    let last_task_after = |store: &Store, id: &str| {
        let journal = store.journal(id).expect("journal");
        let last = journal.last().expect("a row");
        Some(serde_json::to_string(&last.task_after).expect("serializes"))
    };
    let data = |id: &str| match db.kind {
        Kind::Postgres => db.text(&format!("SELECT CAST(data AS TEXT) FROM tasks WHERE id = '{id}'")),
        Kind::Sqlite => last_task_after(&db.open(), id),
    };
    assert_eq!(row("a"), Some(format!("running {}", a[1].at)));
    assert_eq!(data("a"), last_task_after(&store, "a"), "the row holds the last transition's task");
    assert_eq!(data("b"), last_task_after(&store, "b"));

    // Another connection moves `a` on; the first store must not trust what it last wrote.
    db.open().commit(&a[2].rec()).expect("the other connection's commit");
    let err = store.commit(&a[2].rec()).expect_err("a stale state_before");
    assert!(
        matches!(&err, StoreError::StateConflict { task_id, expected: TaskState::Running, stored }
            if task_id == "a" && stored == "snapshotting"),
        "{err:?}"
    );
    store.commit_batch(&[a[3].rec()]).expect("after the other's commit");
    // A store opened cold reads where `b`'s journal stands.
    db.open()
        .commit_batch(&[b[2].rec(), b[3].rec()])
        .expect("a cold store's batch");

    for (id, steps) in [("a", &a), ("b", &b)] {
        let journal = store.journal(id).expect("journal");
        assert_eq!(
            journal.iter().map(|e| e.task_seq).collect::<Vec<_>>(),
            [1, 2, 3, 4],
            "task {id}"
        );
        assert_eq!(
            journal.iter().map(|e| e.task_after.clone()).collect::<Vec<_>>(),
            steps.iter().map(|s| s.task.clone()).collect::<Vec<_>>()
        );
        assert_eq!(data(id), last_task_after(&store, id));
    }
    assert_eq!(row("a"), Some(format!("expired {}", a[3].at)));
    let tasks = store.load_tasks().expect("tasks");
    assert_eq!(tasks, [a[3].task.clone(), b[3].task.clone()]);
    drop(store);
    assert_eq!(db.open().load_tasks().expect("tasks after reopening"), tasks);
}
}

/// One change to a task's records in [`batch_splits_write_the_rows_single_commits_write`].
#[derive(Debug, Clone, Copy)]
enum Change {
    /// A new sandbox (the next generation) replaces whatever the task held.
    NewSandbox,
    /// The held sandbox's deadline moves (a timeout extension).
    Extend,
    /// The held sandbox ran its first command.
    Use,
    /// The task lets its sandbox go.
    Release,
    /// A snapshot attempt starts.
    SnapStart,
    /// The oldest pending snapshot completes.
    SnapDone,
    /// The oldest snapshot record is dropped.
    SnapForget,
    /// Nothing the rows mirror changes.
    Nothing,
}

fn change() -> impl proptest::strategy::Strategy<Value = Change> {
    use proptest::prelude::*;
    prop_oneof![
        Just(Change::NewSandbox),
        Just(Change::Extend),
        Just(Change::Use),
        Just(Change::Release),
        Just(Change::SnapStart),
        Just(Change::SnapDone),
        Just(Change::SnapForget),
        Just(Change::Nothing),
    ]
}

/// Applies `change` to `t` at `at`.
fn apply(t: &mut Task, change: Change, at: taskbox::core::Millis) {
    use taskbox::core::{SnapshotRecord, SnapshotStatus};
    let id = t.id.to_string();
    match change {
        Change::NewSandbox => {
            t.generation += 1;
            t.sandbox = Some(super::sandbox(&id, t.generation, at));
            t.state = TaskState::Running;
        }
        Change::Extend => {
            if let Some(sb) = &mut t.sandbox {
                sb.deadline += 1_000;
            }
        }
        Change::Use => {
            if let Some(sb) = &mut t.sandbox {
                sb.used = true;
            }
        }
        Change::Release => {
            t.sandbox = None;
            t.state = TaskState::Expired;
        }
        Change::SnapStart => {
            let seq = t.snapshots.iter().map(|s| s.seq).max().unwrap_or(0) + 1;
            t.snapshots.push(SnapshotRecord {
                seq,
                id: None,
                status: SnapshotStatus::Pending,
                size_bytes: 0,
                sandbox_id: t
                    .sandbox
                    .as_ref()
                    .map_or_else(|| format!("sbx_{id}_gone").into(), |s| s.id.clone()),
                started_at: at,
                created_at: None,
                expires_at: None,
                omitted: Vec::new(),
                taken_by: None,
                kind: None,
            });
            t.state = TaskState::Snapshotting;
        }
        Change::SnapDone => {
            if let Some(s) = t
                .snapshots
                .iter_mut()
                .find(|s| s.status == SnapshotStatus::Pending)
            {
                s.id = Some(format!("snap_{id}_{}", s.seq).into());
                s.status = SnapshotStatus::Complete;
                s.size_bytes = 4096 * s.seq;
                s.created_at = Some(at);
            }
        }
        Change::SnapForget => {
            if !t.snapshots.is_empty() {
                t.snapshots.remove(0);
            }
        }
        Change::Nothing => t.last_activity = at,
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: crate::support::proptest_cases(48, 48), max_shrink_iters: 200, failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/store.txt"))), ..proptest::prelude::ProptestConfig::default() })]

    /// Group commit writes the snapshot and sandbox rows once per task per batch where that
    /// gives the same rows (a sandbox's release is written when it happens, at its time): for
    /// random changes of three interleaved tasks split into random batches, the rows, tasks and
    /// journals equal those of the same transitions committed one by one.
    #[test]
    fn batch_splits_write_the_rows_single_commits_write(
        changes in proptest::collection::vec((0usize..3, change()), 1..40),
        cuts in proptest::collection::vec(1usize..8, 1..40),
    ) {
        let single_db = super::TestDb::new(super::Kind::Sqlite).expect("sqlite");
        let batch_db = single_db.sibling("batch");
        let mut single = single_db.open();
        let mut batch = batch_db.open();

        let mut tasks: Vec<Task> = ["a", "b", "c"]
            .iter()
            .map(|id| Task::new(tid(id), TaskSettings::default(), 0))
            .collect();
        let mut steps = Vec::new();
        for (n, (which, change)) in changes.into_iter().enumerate() {
            let at = 1_000 + 10 * n as u64;
            let task = &mut tasks[which];
            let before = task.state;
            apply(task, change, at);
            steps.push(Owned {
                at,
                event: Event::TimerFired { timer: TimerKind::Idle },
                before,
                task: task.clone(),
                commands: Vec::new(),
            });
        }
        for s in &steps {
            single.commit(&s.rec()).expect("commit");
        }
        let mut rest = steps.as_slice();
        for cut in cuts.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (now, later) = rest.split_at((*cut).min(rest.len()));
            batch
                .commit_batch(&now.iter().map(Owned::rec).collect::<Vec<_>>())
                .expect("batch");
            rest = later;
        }

        proptest::prop_assert_eq!(batch.sandboxes(None).expect("s"), single.sandboxes(None).expect("s"));
        proptest::prop_assert_eq!(batch.snapshots(None).expect("s"), single.snapshots(None).expect("s"));
        // And they are what the transitions imply, whichever way they were cut.
        let mut ids: Vec<&str> = steps.iter().map(|s| s.task.id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        let history = |id: &str| -> Vec<(taskbox::core::Millis, &Task)> {
            steps.iter().filter(|s| s.task.id.as_str() == id).map(|s| (s.at, &s.task)).collect()
        };
        let last = |id: &str| history(id).last().map(|(_, t)| (*t).clone()).expect("a task");
        let sandboxes: Vec<_> = ids.iter().flat_map(|id| crate::store::model::sandbox_rows(history(id))).collect();
        let snapshots: Vec<_> = ids.iter().flat_map(|id| crate::store::model::snapshot_rows(&last(id))).collect();
        proptest::prop_assert_eq!(batch.sandboxes(None).expect("s"), sandboxes);
        proptest::prop_assert_eq!(batch.snapshots(None).expect("s"), snapshots);
        for id in &ids {
            proptest::prop_assert_eq!(batch.sandboxes(Some(id)).expect("s"), crate::store::model::sandbox_rows(history(id)));
            proptest::prop_assert_eq!(batch.snapshots(Some(id)).expect("s"), crate::store::model::snapshot_rows(&last(id)));
        }
        proptest::prop_assert_eq!(batch.load_tasks().expect("t"), single.load_tasks().expect("t"));
        for id in ["a", "b", "c"] {
            proptest::prop_assert_eq!(batch.journal(id).expect("j"), single.journal(id).expect("j"));
        }
    }
}
