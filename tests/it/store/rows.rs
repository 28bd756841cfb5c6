//! The snapshot and sandbox rows follow the task through replacement, retention and loss, and
//! mirror it after every commit.

use taskbox::core::{Event, Millis, SnapshotRecord, SnapshotStatus, Task, TaskState, TimerKind};
use taskbox::store::{SandboxStatus, StoreError};

use super::{assert_rows_mirror, lifecycle, on_both_stores, raw, sandbox, Kind, Owned, Script};

/// A running task whose sandbox is replaced and extended, whose snapshots come, change status
/// and fall out of retention, and which finally loses its sandbox.
fn sandbox_and_snapshot_scenario() -> Vec<Owned> {
    let mut s = Script::new("t", 1_000);
    let g1 = sandbox("t", 1, 1_000);
    let g2 = sandbox("t", 2, 2_000);
    let snap = |seq: u64, status| SnapshotRecord {
        seq,
        id: Some(format!("snap_{seq}").into()),
        status,
        size_bytes: seq * 100,
        sandbox_id: "sbx_t_1".into(),
        started_at: 1_500,
        created_at: Some(1_600),
        expires_at: None,
        omitted: Vec::new(),
        taken_by: None,
        kind: None,
    };
    s.step(Event::Recovered, vec![], |t| {
        t.state = TaskState::Running;
        t.sandbox = Some(g1.clone());
    });
    s.step(Event::Recovered, vec![], |t| {
        t.snapshots = vec![
            snap(1, SnapshotStatus::Complete),
            snap(2, SnapshotStatus::Complete),
        ];
    });
    // The sandbox is replaced, the first snapshot falls out of retention, the second is
    // being deleted.
    s.step(Event::Recovered, vec![], |t| {
        t.sandbox = Some(g2.clone());
        t.snapshots = vec![
            snap(2, SnapshotStatus::Deleting),
            snap(3, SnapshotStatus::Complete),
        ];
    });
    s.step(
        Event::TimeoutExtended {
            sandbox_id: g2.id.clone(),
            deadline: 9_999_999,
        },
        vec![],
        |t| {
            if let Some(sb) = t.sandbox.as_mut() {
                sb.deadline = 9_999_999;
            }
        },
    );
    s.step(Event::Recovered, vec![], |t| {
        t.state = TaskState::Expired;
        t.sandbox = None;
    });
    s.steps
}

on_both_stores! {
fn snapshot_and_sandbox_rows_follow_the_task(db) {
    let mut store = db.open();
    let steps = sandbox_and_snapshot_scenario();
    let at: Vec<Millis> = steps.iter().map(|o| o.at).collect();

    store.commit(&steps[0].rec()).expect("commit");
    let rows = store.sandboxes(Some("t")).expect("sandboxes");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].provider_id.as_str(), rows[0].status),
        ("sbx_t_1", SandboxStatus::Running)
    );
    assert_eq!(rows[0].name, "taskbox-t-g1-0f1e2d3c");
    assert_eq!(rows[0].generation, 1);
    assert_eq!(rows[0].released_at, None);
    assert!(store.snapshots(Some("t")).expect("snapshots").is_empty());

    store.commit(&steps[1].rec()).expect("commit");
    let snaps = store.snapshots(Some("t")).expect("snapshots");
    assert_eq!(snaps.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2]);

    store.commit(&steps[2].rec()).expect("commit");
    let snaps = store.snapshots(Some("t")).expect("snapshots");
    assert_eq!(
        snaps
            .iter()
            .map(|r| (
                r.seq,
                r.status,
                r.provider_id.as_deref().unwrap_or_default()
            ))
            .collect::<Vec<_>>(),
        [
            (2, SnapshotStatus::Deleting, "snap_2"),
            (3, SnapshotStatus::Complete, "snap_3"),
        ]
    );
    let rows = store.sandboxes(Some("t")).expect("sandboxes");
    assert_eq!(
        rows.iter()
            .map(|r| (r.provider_id.as_str(), r.status, r.released_at))
            .collect::<Vec<_>>(),
        [
            ("sbx_t_1", SandboxStatus::Released, Some(at[2])),
            ("sbx_t_2", SandboxStatus::Running, None),
        ]
    );

    store.commit(&steps[3].rec()).expect("commit");
    let rows = store.sandboxes(Some("t")).expect("sandboxes");
    assert_eq!(
        rows[1].deadline, 9_999_999,
        "the extended deadline is recorded"
    );
    assert_eq!(
        rows[0].released_at,
        Some(at[2]),
        "an old release stays as it was"
    );

    store.commit(&steps[4].rec()).expect("commit");
    let rows = store.sandboxes(None).expect("sandboxes");
    assert_eq!(
        rows.iter()
            .map(|r| (r.provider_id.as_str(), r.status, r.released_at))
            .collect::<Vec<_>>(),
        [
            ("sbx_t_1", SandboxStatus::Released, Some(at[2])),
            ("sbx_t_2", SandboxStatus::Released, Some(at[4])),
        ]
    );
    assert!(store
        .sandboxes(Some("other"))
        .expect("sandboxes")
        .is_empty());
    assert_eq!(store.snapshots(Some("t")).expect("snapshots").len(), 2);
}
}

on_both_stores! {
/// SQLite: a writer with foreign keys off (the default of many SQLite builds) can leave a row
/// pointing nowhere. PostgreSQL enforces them always; what a hand can break there is the
/// journal's append-only trigger.
fn integrity_check_reports_dangling_rows(db) {
    let store = db.open();
    store.integrity_check().expect("intact");
    let expected = match db.kind {
        Kind::Sqlite => {
            let conn = raw(&db.path);
            conn.pragma_update(None, "foreign_keys", false)
                .expect("foreign keys off");
            conn.execute(
                "INSERT INTO fork_shares (snapshot, child, parent) VALUES ('snap', 'ghost', 't')",
                [],
            )
            .expect("insert dangling row");
            "fork_shares"
        }
        Kind::Postgres => {
            db.exec("DROP TRIGGER journal_no_update ON journal")
                .expect("drop the trigger");
            "append-only"
        }
    };
    let err = store.integrity_check().expect_err("a damaged store");
    assert!(
        matches!(&err, StoreError::Integrity { report, .. } if report.contains(expected)),
        "{err:?}"
    );
}
}

on_both_stores! {
fn rows_mirror_the_task_after_every_commit_including_no_op_ones(db) {
    let mut store = db.open();
    // After each step, one that changes neither snapshots nor sandbox: its commit leaves their
    // rows alone, and they must still match.
    for step in sandbox_and_snapshot_scenario() {
        let mut quiet = step.clone();
        quiet.before = step.task.state;
        quiet.event = Event::TimerFired {
            timer: TimerKind::Idle,
        };
        quiet.task.last_activity += 1;
        quiet.at += 1;
        for s in [&step, &quiet] {
            store.commit(&s.rec()).expect("commit");
            assert_rows_mirror(&store, &s.task);
        }
    }
    // A commit that changes neither is spared the rewrite only while this connection knows
    // what the rows hold: another connection's commit in between (here: one that adds a
    // snapshot, then this one's that drops it again) must not be taken for "unchanged".
    let base = store.load_task("t").expect("load").expect("present");
    let quiet = |task: Task, at: Millis| Owned {
        at,
        event: Event::TimerFired {
            timer: TimerKind::Idle,
        },
        before: task.state,
        task,
        commands: vec![],
    };
    let mut theirs = base.clone();
    theirs.snapshots.push(SnapshotRecord {
        seq: 9,
        id: Some("snap_9".to_string().into()),
        status: SnapshotStatus::Complete,
        size_bytes: 900,
        sandbox_id: "sbx_t_2".into(),
        started_at: 90_000,
        created_at: Some(90_001),
        expires_at: None,
        omitted: Vec::new(),
        taken_by: None,
        kind: None,
    });
    let mut other = db.open();
    other.commit(&quiet(theirs.clone(), 90_000).rec()).expect("commit");
    assert_rows_mirror(&other, &theirs);
    store.commit(&quiet(base.clone(), 90_010).rec()).expect("commit");
    assert_rows_mirror(&store, &base);
}
}

on_both_stores! {
/// Who else retains a snapshot: a fork shares its parent's, so each is the other's holder (the
/// asking task left out); a fork of the fork from the same snapshot holds it too; a task removed
/// without keeping its snapshots holds nothing, one removed keeping them still does.
fn a_fork_and_its_parent_hold_their_shared_snapshot(db) {
    let mut store = db.open();
    let parent = lifecycle("p", 1_000);
    let (child, snap) = crate::store::fork_of(&parent, "c", 2_000);
    let (grandchild, same) = crate::store::fork_of(&child.steps, "g", 3_000);
    assert_eq!(same, snap, "the grandchild is forked from the snapshot the child shares");
    for step in parent.iter().chain(&child.steps).chain(&grandchild.steps) {
        store.commit(&step.rec()).expect("commit");
    }
    let holders = |store: &taskbox::store::Store, asking: &str| {
        store.snapshot_holders(snap.as_str(), asking).expect("holders")
    };
    // The store's answer is the model's, which applies `core::retention`: on PostgreSQL that
    // holds its SQL equal to the Rust rule.
    let as_model = |store: &taskbox::store::Store| {
        for asking in ["p", "c", "g"] {
            assert_eq!(
                store.snapshot_holders(snap.as_str(), asking).expect("holders"),
                crate::store::model::holders(store, snap.as_str(), asking),
                "holders asked by {asking}"
            );
        }
    };
    assert_eq!(holders(&store, "p"), ["c", "g"]);
    assert_eq!(holders(&store, "c"), ["g", "p"]);
    assert_eq!(holders(&store, "g"), ["c", "p"]);
    as_model(&store);
    assert!(store.snapshot_holders("snap_nobody", "p").expect("holders").is_empty());
    // The child's record of the shared snapshot through every status: only the statuses
    // `retention::holds` names keep it a holder.
    let mut last = child.steps.last().expect("steps").clone();
    for status in [
        SnapshotStatus::Pending,
        SnapshotStatus::Deleting,
        SnapshotStatus::Failed,
        SnapshotStatus::Gone,
        SnapshotStatus::Released,
        SnapshotStatus::Deleted,
        SnapshotStatus::Complete,
    ] {
        last.at += 10;
        last.before = last.task.state;
        last.task.snapshots[0].status = status;
        store.commit(&last.rec()).expect("commit");
        as_model(&store);
        assert_eq!(
            holders(&store, "p").contains(&"c".to_string()),
            taskbox::core::retention::holds(status),
            "{status:?}"
        );
    }
    store.mark_removed("c", 4_000, false).expect("remove c");
    store.mark_removed("g", 4_000, true).expect("remove g, keeping its snapshots");
    assert_eq!(holders(&store, "p"), ["g"]);
    assert_eq!(holders(&store, "g"), ["p"]);
    as_model(&store);
}
}
