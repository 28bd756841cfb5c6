//! The durability shape and atomicity: what a commit writes to the four tables, the journal's
//! order and its refusal of updates and deletes, and a failed commit leaving nothing behind.

use taskbox::core::{Event, SnapshotStatus, TaskState};
use taskbox::store::{SandboxStatus, StoreError};

use super::{lifecycle, on_both_stores, raw, Kind, Script};

on_both_stores! {
fn create_and_reopen_keeps_installation_id_and_tasks(db) {
    let first_id;
    {
        let mut store = db.open();
        if db.kind == Kind::Sqlite {
            assert_eq!(store.path(), Some(db.path.as_path()), "open creates the file");
        }
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
    let store = db.open();
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
    if db.kind == Kind::Sqlite {
        let mode: String = raw(&db.path)
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .expect("journal mode");
        assert_eq!(mode, "wal", "the store runs in write-ahead-log mode");
    }

    // A different store is a different installation.
    let other = db.sibling("other").open();
    assert_ne!(other.installation_id(), first_id);
}
}

on_both_stores! {
fn commit_writes_all_four_tables_and_orders_the_journal_per_task(db) {
    let mut store = db.open();
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

    // The rows are queryable with plain SQL. On PostgreSQL the task row holds the task's state
    // and the whole task (`data`); on SQLite the journal holds both (migrations 5 and 7): the
    // task's state is its last row's.
    let sql = match db.kind {
        Kind::Sqlite => {
            "SELECT state_after || ' ' || state_after || ' ' || CAST(at AS TEXT) FROM journal \
             WHERE task_id = 'a' ORDER BY task_seq DESC LIMIT 1"
        }
        Kind::Postgres => {
            "SELECT state || ' ' || (CAST(data AS JSONB) ->> 'state') || ' ' || \
             CAST(updated_at AS TEXT) FROM tasks WHERE id = 'a'"
        }
    };
    let row = db.text(sql).expect("task row");
    assert_eq!(
        row,
        format!("expired expired {}", a.last().expect("steps").at)
    );
    if db.kind == Kind::Sqlite {
        assert_eq!(
            db.text("SELECT CAST(COUNT(*) AS TEXT) FROM pragma_table_info('tasks') \
                     WHERE name IN ('data', 'state', 'updated_at')"),
            Some("0".to_string()),
            "the task row holds neither the task nor its state"
        );
    }
    let agg = match db.kind {
        Kind::Sqlite => "group_concat(event_name, ',')",
        Kind::Postgres => "string_agg(event_name, ',')",
    };
    let names = db
        .text(&format!(
            "SELECT {agg} FROM (SELECT event_name FROM journal WHERE task_id = 'b' \
             ORDER BY task_seq) AS e"
        ))
        .expect("names");
    assert_eq!(
        names,
        "run_requested,sandbox_ready,suspend_requested,snapshot_taken"
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
}

on_both_stores! {
fn a_failed_commit_leaves_nothing_half_written(db) {
    let mut store = db.open();
    let a = lifecycle("a", 1_000);
    for step in &a[..2] {
        store.commit(&step.rec()).expect("commit");
    }
    let task_before = store.load_task("a").expect("load");
    let before = db.counts();

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
    assert_eq!(db.counts(), before, "no row of the failed commit remains");
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
    assert_eq!(db.counts(), before);
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
    assert_eq!(db.counts(), before);
    assert_eq!(store.load_task("c").expect("load"), None);
    assert_eq!(store.load_task("a").expect("load"), task_before);

    // The schema refuses an unsafe id even from a writer that skips the store's validation.
    let insert = match db.kind {
        Kind::Sqlite => {
            "INSERT INTO tasks (id, created_at) VALUES ('a/b', 0)"
        }
        Kind::Postgres => {
            "INSERT INTO tasks (id, state, data, created_at, updated_at)
             VALUES ('a/b', 'idle', '{}', 0, 0)"
        }
    };
    let err = db.exec(insert).expect_err("CHECK on tasks.id");
    assert!(
        err.contains("CHECK constraint failed") || err.contains("violates check constraint"),
        "{err}"
    );

    // The store still works after the failures, and continues the task's numbering.
    store.commit(&a[2].rec()).expect("commit after failures");
    let journal = store.journal("a").expect("journal");
    assert_eq!(
        journal.iter().map(|e| e.task_seq).collect::<Vec<_>>(),
        [1, 2, 3]
    );
}
}

on_both_stores! {
fn the_journal_refuses_update_and_delete(db) {
    let mut store = db.open();
    for step in lifecycle("a", 1_000) {
        store.commit(&step.rec()).expect("commit");
    }
    let before = store.journal("a").expect("journal");
    let mut refused = vec![
        "UPDATE journal SET event_name = 'forged' WHERE task_seq = 1",
        "DELETE FROM journal WHERE task_seq = 2",
        "DELETE FROM journal",
    ];
    if db.kind == Kind::Postgres {
        refused.push("TRUNCATE journal CASCADE");
    }
    for sql in refused {
        let err = db.exec(sql).expect_err(sql);
        assert!(err.contains("append-only"), "{sql}: {err}");
    }
    assert_eq!(store.journal("a").expect("journal"), before);
}
}

on_both_stores! {
/// A batch committed with `Sync::WithNext` (the engine's answers: a command's result) is
/// committed like any other — every other connection sees it at once, a reopened store has it,
/// the journal stays in order — and the synced commits after it go on as before.
fn a_commit_that_syncs_with_the_next_is_committed_at_once_and_in_order(db) {
    use taskbox::store::Sync;
    let steps = lifecycle("d", 1_000);
    let (first, rest) = steps.split_at(steps.len() / 2);
    {
        let mut store = db.open();
        for (i, step) in first.iter().enumerate() {
            let sync = if i % 2 == 0 {
                Sync::Now
            } else {
                Sync::WithNext
            };
            store
                .commit_batch_with(&[step.rec()], sync)
                .expect("commit");
            let seen = db
                .text("SELECT CAST(count(*) AS TEXT) FROM journal WHERE task_id = 'd'")
                .expect("count");
            assert_eq!(
                seen,
                (i + 1).to_string(),
                "another connection sees commit {i} at once"
            );
        }
        for step in rest {
            store
                .commit(&step.rec())
                .expect("a synced commit after a deferred one");
        }
    }
    let store = db.open();
    let journal = store.journal("d").expect("journal");
    assert_eq!(journal.len(), steps.len());
    assert!(journal
        .windows(2)
        .all(|w| w[0].task_seq + 1 == w[1].task_seq));
    assert_eq!(
        store.load_task("d").expect("load"),
        Some(steps.last().expect("steps").task.clone())
    );
    store.integrity_check().expect("intact");
}
}

/// SQLite journal rows hold what changed: a delta against the task's row before, with a
/// keyframe (the whole task) on a task's first row, at least every 32 rows, after another
/// connection wrote (this one no longer knows the row before) and when a member appears. They
/// read back whole: `journal` and every `journal_tail` give the committed tasks, and the rows
/// take a fraction of the room of whole tasks. A damaged delta is reported as corrupt, and
/// only the rows that rebuild from it are lost to readers.
#[test]
fn journal_rows_hold_what_changed_and_read_back_whole() {
    let (_dir, path) = super::temp_db();
    let mut s = Script::new("a", 1_000);
    for i in 0..100u64 {
        s.step(
            Event::RunRequested {
                request_id: i + 1,
                command: format!("echo {i}"),
                timeout_ms: 1_000,
            },
            Vec::new(),
            |t| {
                t.last_request_id = i + 1;
                t.last_activity = 2_000 + i;
                t.attempts = (i % 3) as u32;
                if i == 50 {
                    t.settings.idle_lifetime_ms += 1;
                }
                if i == 80 {
                    t.lineage = Some(taskbox::core::Lineage {
                        parent: crate::support::tid("p"),
                        snapshot: "snap-p-1".into(),
                        parent_seq: 1,
                        forked_at: 900,
                    });
                }
            },
        );
    }
    let steps = s.steps;
    // After every commit the task loads as committed (from its journal).
    let check = |store: &taskbox::store::Store, done: usize| {
        assert_eq!(
            store.load_task("a").expect("load"),
            Some(steps[done - 1].task.clone()),
            "after {done} rows"
        );
    };
    let mut store = taskbox::store::Store::open(&path).expect("open");
    for (i, chunk) in steps[..40].chunks(7).enumerate() {
        let recs: Vec<_> = chunk.iter().map(|o| o.rec()).collect();
        store.commit_batch(&recs).expect("batch");
        check(&store, (7 * i + chunk.len()).min(40));
    }
    taskbox::store::Store::open(&path)
        .expect("a second connection")
        .commit(&steps[40].rec())
        .expect("its commit");
    check(&store, 41);
    for (i, step) in steps.iter().enumerate().skip(41) {
        store.commit(&step.rec()).expect("commit");
        check(&store, i + 1);
    }
    let journal = store.journal("a").expect("journal");
    let tasks: Vec<_> = journal.iter().map(|e| e.task_after.clone()).collect();
    let expected: Vec<_> = steps.iter().map(|o| o.task.clone()).collect();
    assert!(
        tasks == expected,
        "the journal gives back every committed task"
    );
    assert!(journal.iter().zip(1..).all(|(e, n)| e.task_seq == n));
    for n in 0..=journal.len() + 2 {
        let tail = store.journal_tail("a", n).expect("tail");
        assert_eq!(
            tail,
            journal[journal.len().saturating_sub(n)..],
            "the last {n} rows"
        );
    }

    let conn = raw(&path);
    let keyframes: Vec<u64> = conn
        .prepare("SELECT task_seq FROM journal WHERE task_key IS NULL ORDER BY task_seq")
        .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())
        .expect("keyframes");
    // The first row, a new chain every 32 rows, row 41 (the other connection's), row 42 (this
    // connection's first after it) and row 81 (the lineage appears).
    assert_eq!(keyframes, [1, 33, 41, 42, 74, 81], "{keyframes:?}");
    let (stored, whole): (i64, usize) = (
        conn.query_row("SELECT SUM(length(task_after)) FROM journal", [], |r| {
            r.get(0)
        })
        .expect("sum"),
        expected
            .iter()
            .map(|t| serde_json::to_string(t).expect("serializes").len())
            .sum(),
    );
    assert!(
        (stored as usize) * 3 < whole,
        "rows of {stored} bytes for {whole} bytes of tasks"
    );

    // A damaged row in the middle of a chain: the rows rebuilt through it are corrupt, and
    // the last ones, on a later keyframe, still read.
    conn.execute_batch(
        "DROP TRIGGER journal_no_update;
         UPDATE journal SET task_after = '[1]' WHERE task_seq = 20;",
    )
    .expect("damage a row");
    let err = store.journal("a").expect_err("a damaged delta");
    assert!(
        matches!(
            &err,
            StoreError::Corrupt {
                column: "journal.task_after",
                seq: Some(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        store.journal_tail("a", 10).expect("the last rows"),
        journal[journal.len() - 10..]
    );
}

/// The sandbox rows derived from the journal read a row's `sandbox` member, not text that looks
/// like it: a queued command holding `"sandbox":` (escaped inside the JSON) and a sandbox
/// record that changes only its deadline, then another sandbox, then none, give the table's
/// rows — the released one at the time of the row that let it go.
#[test]
fn sandboxes_derived_from_the_journal_read_the_member_not_its_text() {
    let db = super::TestDb::new(Kind::Sqlite).expect("sqlite");
    let mut store = db.open();
    let mut s = Script::new("q", 1_000);
    s.step(Event::Recovered, vec![], |t| {
        t.queue.push_back(taskbox::core::Request::Run {
            id: 1,
            command: r#"echo '{"sandbox": null, "sandbox":{}}'"#.into(),
            timeout_ms: 5,
        });
    });
    s.step(Event::Recovered, vec![], |t| {
        t.state = TaskState::Running;
        t.sandbox = Some(super::sandbox("q", 1, 1_010));
    });
    s.step(Event::Recovered, vec![], |t| {
        t.queue.clear();
        t.last_activity += 1;
    });
    s.step(Event::Recovered, vec![], |t| {
        if let Some(sb) = t.sandbox.as_mut() {
            sb.deadline += 60_000;
            sb.used = true;
        }
    });
    s.step(Event::Recovered, vec![], |t| {
        t.sandbox = Some(super::sandbox("q", 2, 1_040));
    });
    s.step(Event::Recovered, vec![], |t| {
        t.state = TaskState::Idle;
        t.sandbox = None;
    });
    for step in &s.steps {
        store.commit(&step.rec()).expect("commit");
    }
    let taskbox::store::Store::Sqlite(sqlite) = &store else {
        unreachable!("a SQLite store")
    };
    let rows = sqlite.sandboxes(Some("q")).expect("rows");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].deadline, 1_010 + 300_000 + 60_000);
    assert_eq!(
        (rows[0].status, rows[0].released_at),
        (SandboxStatus::Released, Some(s.steps[4].at))
    );
    assert_eq!(
        (rows[1].status, rows[1].released_at),
        (SandboxStatus::Released, Some(s.steps[5].at))
    );
    let history: Vec<_> = s.steps.iter().map(|s| (s.at, &s.task)).collect();
    assert_eq!(rows, crate::store::model::sandbox_rows(history));
}
