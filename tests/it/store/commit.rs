//! The durability shape and atomicity: what a commit writes to the four tables, the journal's
//! order and its refusal of updates and deletes, and a failed commit leaving nothing behind.

use taskbox::core::{Event, SnapshotStatus, TaskState};
use taskbox::store::{SandboxStatus, Store, StoreError};

use super::{counts, lifecycle, raw, temp_db, Script};

#[test]
fn create_and_reopen_keeps_installation_id_and_tasks() {
    let (_dir, path) = temp_db();
    let first_id;
    {
        let mut store = Store::open(&path).expect("open creates the file and its parents");
        assert_eq!(store.path(), Some(path.as_path()));
        first_id = store.installation_id().to_string();
        assert_eq!(first_id.len(), 32, "128 bits as hex: {first_id}");
        assert!(first_id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        for id in ["zeta", "alpha"] {
            for step in lifecycle(id, 1_000) {
                store.commit(&step.rec()).expect("commit");
            }
        }
    }
    let store = Store::open(&path).expect("reopen");
    assert_eq!(store.installation_id(), first_id);
    assert_eq!(store.task_ids().expect("ids"), ["alpha", "zeta"]);
    let expected = lifecycle("alpha", 1_000).pop().expect("steps").task;
    assert_eq!(store.load_task("alpha").expect("load"), Some(expected));
    assert_eq!(store.load_task("missing").expect("load"), None);
    let tasks = store.load_tasks().expect("load all");
    assert_eq!(
        tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        ["alpha", "zeta"]
    );
    assert!(tasks.iter().all(|t| t.state == TaskState::Expired));
    store.integrity_check().expect("a fresh store is intact");
    let mode: String = raw(&path)
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("journal mode");
    assert_eq!(mode, "wal", "the store runs in write-ahead-log mode");

    // A different store file is a different installation.
    let other = Store::open(&path.with_file_name("other.db")).expect("open other");
    assert_ne!(other.installation_id(), first_id);
}

#[test]
fn commit_writes_all_four_tables_and_orders_the_journal_per_task() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let a = lifecycle("a", 1_000);
    let b = lifecycle("b", 5_000);
    // Interleave the two tasks' transitions.
    let mut seqs = Vec::new();
    for (sa, sb) in a.iter().zip(&b) {
        seqs.push(store.commit(&sa.rec()).expect("commit a"));
        seqs.push(store.commit(&sb.rec()).expect("commit b"));
    }
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "global seqs increase: {seqs:?}"
    );

    let journal = store.journal("a").expect("journal");
    assert_eq!(journal.len(), a.len());
    for (i, (entry, step)) in journal.iter().zip(&a).enumerate() {
        assert_eq!(entry.task_id, "a");
        assert_eq!(entry.task_seq, i as u64 + 1);
        assert_eq!(entry.seq, seqs[2 * i]);
        assert_eq!(entry.at, step.at);
        assert_eq!(entry.event, step.event);
        assert_eq!(entry.state_before, step.before);
        assert_eq!(entry.state_after, step.task.state);
        assert_eq!(entry.commands, step.commands);
        assert_eq!(entry.task_after, step.task);
    }
    let states: Vec<_> = journal
        .iter()
        .map(|e| (e.state_before, e.state_after))
        .collect();
    assert_eq!(
        states,
        [
            (TaskState::Idle, TaskState::Provisioning),
            (TaskState::Provisioning, TaskState::Running),
            (TaskState::Running, TaskState::Snapshotting),
            (TaskState::Snapshotting, TaskState::Expired),
        ]
    );
    let tail = store.journal_tail("a", 2).expect("tail");
    assert_eq!(tail, journal[2..]);
    assert_eq!(store.journal_tail("a", 100).expect("tail"), journal);
    assert!(store.journal_tail("a", 0).expect("tail").is_empty());
    assert!(store.journal("nobody").expect("journal").is_empty());

    // The rows are queryable with plain SQL.
    let conn = raw(&path);
    let (state, data_state, updated_at): (String, String, i64) = conn
        .query_row(
            "SELECT state, json_extract(data, '$.state'), updated_at FROM tasks WHERE id = 'a'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("task row");
    assert_eq!(
        (state.as_str(), data_state.as_str()),
        ("expired", "expired")
    );
    assert_eq!(updated_at as u64, a.last().expect("steps").at);
    let names: Vec<String> = conn
        .prepare("SELECT event_name FROM journal WHERE task_id = 'b' ORDER BY task_seq")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("names");
    assert_eq!(
        names,
        [
            "run_requested",
            "sandbox_ready",
            "suspend_requested",
            "snapshot_taken"
        ]
    );

    let snaps = store.snapshots(Some("a")).expect("snapshots");
    assert_eq!(snaps.len(), 1);
    assert_eq!(snaps[0].provider_id.as_deref(), Some("snap_a_1"));
    assert_eq!(snaps[0].status, SnapshotStatus::Complete);
    assert_eq!(snaps[0].size_bytes, 4096);
    assert_eq!(snaps[0].sandbox_id, "sbx_a_1");
    assert_eq!(store.snapshots(None).expect("all snapshots").len(), 2);

    let sbs = store.sandboxes(Some("a")).expect("sandboxes");
    assert_eq!(sbs.len(), 1);
    assert_eq!(sbs[0].provider_id, "sbx_a_1");
    assert_eq!(sbs[0].status, SandboxStatus::Released);
    assert_eq!(
        sbs[0].released_at,
        Some(a[3].at),
        "released by the transition that dropped it"
    );
}

#[test]
fn a_failed_commit_leaves_nothing_half_written() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let a = lifecycle("a", 1_000);
    for step in &a[..2] {
        store.commit(&step.rec()).expect("commit");
    }
    let task_before = store.load_task("a").expect("load");
    let before = counts(&path);

    // Task `b` claims `a`'s live sandbox. The task row and the journal row are written before
    // the sandbox row is refused, so this exercises a real rollback.
    let mut thief = Script::new("b", 2_000);
    thief.step(Event::Recovered, vec![], |t| {
        t.state = TaskState::Running;
        t.sandbox = a[1].task.sandbox.clone();
        t.snapshots.push(a[3].task.snapshots[0].clone());
    });
    let err = store
        .commit(&thief.steps[0].rec())
        .expect_err("sandbox of another task");
    assert!(
        matches!(&err, StoreError::SandboxOwned { task_id, sandbox_id, owner }
            if task_id == "b" && sandbox_id == "sbx_a_1" && owner == "a"),
        "{err:?}"
    );
    assert_eq!(counts(&path), before, "no row of the failed commit remains");
    assert_eq!(store.load_task("b").expect("load"), None);

    // A transition that starts from a state other than the stored one lost a race.
    let mut stale = a[2].clone();
    stale.before = TaskState::Idle;
    let err = store.commit(&stale.rec()).expect_err("stale state_before");
    assert!(
        matches!(&err, StoreError::StateConflict { task_id, expected: TaskState::Idle, stored }
            if task_id == "a" && stored == "running"),
        "{err:?}"
    );
    assert_eq!(counts(&path), before);
    assert_eq!(store.load_task("a").expect("load"), task_before);

    // In a batch, a bad last record undoes the good ones before it.
    let c = lifecycle("c", 3_000);
    let batch = [c[0].rec(), c[1].rec(), a[2].rec(), thief.steps[0].rec()];
    let err = store
        .commit_batch(&batch)
        .expect_err("sandbox of another task");
    assert!(matches!(err, StoreError::SandboxOwned { .. }), "{err:?}");
    // An unsafe task id cannot reach a commit at all: a `Task` holds a validated `TaskId`.
    assert!(taskbox::TaskId::new("../escape").is_err());
    assert_eq!(counts(&path), before);
    assert_eq!(store.load_task("c").expect("load"), None);
    assert_eq!(store.load_task("a").expect("load"), task_before);

    // The schema refuses an unsafe id even from a writer that skips the store's validation.
    let err = raw(&path)
        .execute(
            "INSERT INTO tasks (id, state, data, created_at, updated_at)
             VALUES ('a/b', 'idle', '{}', 0, 0)",
            [],
        )
        .expect_err("CHECK on tasks.id");
    assert!(err.to_string().contains("CHECK constraint failed"), "{err}");

    // The store still works after the failures, and continues the task's numbering.
    store.commit(&a[2].rec()).expect("commit after failures");
    let journal = store.journal("a").expect("journal");
    assert_eq!(
        journal.iter().map(|e| e.task_seq).collect::<Vec<_>>(),
        [1, 2, 3]
    );
}

#[test]
fn the_journal_refuses_update_and_delete() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    for step in lifecycle("a", 1_000) {
        store.commit(&step.rec()).expect("commit");
    }
    let before = store.journal("a").expect("journal");
    let conn = raw(&path);
    for sql in [
        "UPDATE journal SET event_name = 'forged' WHERE task_seq = 1",
        "DELETE FROM journal WHERE task_seq = 2",
        "DELETE FROM journal",
    ] {
        let err = conn.execute(sql, []).expect_err(sql);
        assert!(err.to_string().contains("append-only"), "{sql}: {err}");
    }
    assert_eq!(store.journal("a").expect("journal"), before);
}
