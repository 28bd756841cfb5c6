//! What the store refuses or reports: a store from a newer taskbox, a file that is not SQLite,
//! corrupt rows (typed errors naming task and column) and dangling rows.

use taskbox::core::{Event, TaskState};
use taskbox::store::{Store, StoreError};

use super::{assert_rows_mirror, lifecycle, on_both_stores, temp_db, Kind};

on_both_stores! {
fn a_store_from_a_newer_taskbox_is_refused_untouched(db) {
    drop(db.open());
    let (bump, read) = match db.kind {
        Kind::Sqlite => ("PRAGMA user_version = 99", "SELECT CAST(user_version AS TEXT) FROM pragma_user_version"),
        Kind::Postgres => (
            "UPDATE taskbox_schema SET version = 99",
            "SELECT CAST(version AS TEXT) FROM taskbox_schema",
        ),
    };
    db.exec(bump).expect("bump version");
    let err = db.try_open().expect_err("newer schema");
    let location = match db.kind {
        Kind::Sqlite => db.path.clone(),
        Kind::Postgres => db.url().into(),
    };
    match &err {
        StoreError::TooNew {
            path: p,
            found,
            supported,
        } => {
            assert_eq!(p, &location);
            assert_eq!(*found, 99);
            assert!(*supported >= 1 && *supported < 99);
        }
        other => panic!("expected TooNew, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("newer taskbox") && msg.contains("instead of downgrading"),
        "{msg}"
    );
    assert!(msg.contains(&location.display().to_string()), "{msg}");
    assert_eq!(db.text(read).expect("version"), "99");
}
}

#[test]
fn a_file_that_is_not_sqlite_is_refused_untouched() {
    let (dir, _) = temp_db();
    let path = dir.path().join("notes.db");
    let garbage = "these are my notes, not a database\n".repeat(200);
    std::fs::write(&path, &garbage).expect("write");
    let err = Store::open(&path).expect_err("garbage");
    assert!(
        matches!(&err, StoreError::NotADatabase { path: p } if p == &path),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&path).expect("read"), garbage);
}

on_both_stores! {
fn corrupt_rows_are_typed_errors_naming_task_and_column(db) {
    let mut store = db.open();
    for step in lifecycle("a", 1_000) {
        store.commit(&step.rec()).expect("commit");
    }
    // The task as stored: on PostgreSQL the task row's JSON, on SQLite its journal's (the last
    // row, a change of the task, rebuilt on the rows before it).
    let (damage, column) = match db.kind {
        Kind::Sqlite => (
            "DROP TRIGGER journal_no_update;
             UPDATE journal SET task_after = '{\"state\": 5}' WHERE task_id = 'a' AND task_seq = 4;
             CREATE TRIGGER journal_no_update BEFORE UPDATE ON journal
             BEGIN SELECT RAISE(ABORT, 'the journal is append-only: UPDATE refused'); END;",
            "journal.task_after",
        ),
        Kind::Postgres => (
            "UPDATE tasks SET data = '{\"id\": \"a\"}' WHERE id = 'a'",
            "tasks.data",
        ),
    };
    db.exec(damage).expect("corrupt the task");
    for err in [
        store.load_task("a").expect_err("corrupt data"),
        store.load_tasks().expect_err("corrupt data"),
    ] {
        assert!(
            matches!(&err, StoreError::Corrupt { task_id, column: c, .. }
                if task_id == "a" && *c == column),
            "{err:?}"
        );
        assert!(err.to_string().contains("task `a`"), "{err}");
    }
    // The next transition replaces the damaged task whole: the task row on PostgreSQL (its
    // JSON lacks the `snapshots` and `sandbox` the commit compares against), a keyframe on
    // SQLite (another connection wrote since this one's last commit).
    let mut next = lifecycle("a", 1_000).pop().expect("steps");
    next.before = TaskState::Expired;
    next.event = Event::Recovered;
    store
        .commit(&next.rec())
        .expect("commit over the damaged row");
    assert_eq!(store.load_task("a").expect("load"), Some(next.task.clone()));
    assert_rows_mirror(&store, &next.task);

    // Rewriting history takes dropping the trigger first; the read still refuses bad rows.
    let drop_trigger = match db.kind {
        Kind::Sqlite => "DROP TRIGGER journal_no_update;",
        Kind::Postgres => "DROP TRIGGER journal_no_update ON journal;",
    };
    db.exec(&format!(
        "{drop_trigger} UPDATE journal SET state_after = 'sleeping' WHERE task_seq = 2;"
    ))
    .expect("corrupt the journal");
    let err = store.journal("a").expect_err("corrupt state");
    assert!(
        matches!(&err, StoreError::Corrupt { task_id, column: "journal.state_after",
            seq: Some(_), reason, .. } if task_id == "a" && reason.contains("sleeping")),
        "{err:?}"
    );
    db.exec(
        "UPDATE journal SET state_after = 'running', commands = '[{\"type\": \"explode\"}]'
         WHERE task_seq = 2",
    )
    .expect("corrupt the commands");
    let err = store.journal_tail("a", 4).expect_err("corrupt commands");
    assert!(
        matches!(
            &err,
            StoreError::Corrupt {
                column: "journal.commands",
                source: Some(_),
                ..
            }
        ),
        "{err:?}"
    );
}
}

on_both_stores! {
/// Ids are typed when they leave the store: a row whose task id is not a valid task id (edited
/// by hand into a path) is reported corrupt, naming the column, and never handed out as a task.
fn a_row_whose_task_id_is_not_a_task_id_is_corrupt(db) {
    let mut store = db.open();
    for step in lifecycle("a", 1_000) {
        store.commit(&step.rec()).expect("commit");
    }
    // Edit rows by hand: without the foreign keys (SQLite: per connection; PostgreSQL: the
    // constraints dropped) and the journal's trigger.
    let (prelude, drop_trigger) = match db.kind {
        Kind::Sqlite => ("PRAGMA foreign_keys = OFF;", "DROP TRIGGER journal_no_update;"),
        Kind::Postgres => (
            "ALTER TABLE snapshots DROP CONSTRAINT IF EXISTS snapshots_task_id_fkey;
             ALTER TABLE sandboxes DROP CONSTRAINT IF EXISTS sandboxes_task_id_fkey;
             ALTER TABLE journal DROP CONSTRAINT IF EXISTS journal_task_id_fkey;",
            "DROP TRIGGER journal_no_update ON journal;",
        ),
    };
    match db.kind {
        // SQLite derives those rows from the journal (below); its own table of task ids is the
        // forks' shares.
        Kind::Sqlite => {
            db.exec(&format!(
                "{prelude} INSERT INTO fork_shares (snapshot, child, parent) \
                 VALUES ('snap-x', '../evil', 'a')"
            ))
            .expect("corrupt the forks' shares");
            let err = store
                .snapshot_holders("snap-x", "a")
                .expect_err("a path for a task id");
            assert!(
                matches!(&err, StoreError::Corrupt { task_id, column: "fork_shares.child", .. }
                    if task_id == "../evil"),
                "{err:?}"
            );
        }
        Kind::Postgres => {
            db.exec(&format!(
                "{prelude} UPDATE snapshots SET task_id = '../evil'"
            ))
            .expect("corrupt the snapshot rows");
            let err = store.snapshots(None).expect_err("a path for a task id");
            assert!(
                matches!(&err, StoreError::Corrupt { task_id, column: "snapshots.task_id", .. }
                    if task_id == "../evil"),
                "{err:?}"
            );
            db.exec(&format!("{prelude} UPDATE sandboxes SET task_id = '../evil'"))
                .expect("corrupt the sandbox rows");
            let err = store.sandboxes(None).expect_err("a path for a task id");
            assert!(
                matches!(
                    &err,
                    StoreError::Corrupt {
                        column: "sandboxes.task_id",
                        ..
                    }
                ),
                "{err:?}"
            );
        }
    }
    // (`tasks.id` has a CHECK of its own; the journal's column has none.)
    db.exec(&format!(
        "{prelude} {drop_trigger} UPDATE journal SET task_id = '../evil' WHERE task_seq = 2;"
    ))
    .expect("corrupt the journal");
    let err = store.journal("../evil").expect_err("a path for a task id");
    assert!(
        matches!(
            &err,
            StoreError::Corrupt {
                column: "journal.task_id",
                seq: Some(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("../evil"), "{err}");
}
}

/// Migration 5 drops the task rows' `data` only when every row holds the task its journal
/// rebuilds: a row edited by hand refuses it, naming the task, and leaves the file as it was.
#[test]
fn migration_5_refuses_a_task_row_its_journal_disagrees_with() {
    let (_dir, path) = temp_db();
    let steps = lifecycle("a", 1_000);
    let mut store = Store::open(&path).expect("open");
    for step in &steps {
        store.commit(&step.rec()).expect("commit");
    }
    drop(store);
    // The row as a version-4 store held it, but edited: the task after its second transition.
    let conn = super::raw(&path);
    back_to_6(&conn);
    conn.execute_batch("ALTER TABLE tasks ADD COLUMN data TEXT NOT NULL DEFAULT ''")
        .expect("the data column");
    conn.execute(
        "UPDATE tasks SET data = ?1 WHERE id = 'a'",
        [serde_json::to_string(&steps[1].task).expect("serializes")],
    )
    .expect("the task's data");
    conn.execute_batch(
        "DROP INDEX sandboxes_by_task;
         CREATE INDEX sandboxes_task ON sandboxes(task_id, status);
         PRAGMA user_version = 4;",
    )
    .expect("version 4");
    drop(conn);

    let err = Store::open(&path).expect_err("a row that disagrees");
    assert!(
        matches!(&err, StoreError::TaskRowDisagrees { task_id, .. } if task_id == "a"),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("task `a`")
            && text.contains("schema version 5")
            && text.contains("changed nothing"),
        "{text}"
    );
    let conn = super::raw(&path);
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, 4, "the file stays at version 4");
    let data: String = conn
        .query_row("SELECT data FROM tasks WHERE id = 'a'", [], |r| r.get(0))
        .expect("the row keeps its data");
    assert_eq!(
        data,
        serde_json::to_string(&steps[1].task).expect("serializes")
    );

    // Made to agree, it migrates, and the task reads back from its journal.
    conn.execute(
        "UPDATE tasks SET data = ?1 WHERE id = 'a'",
        [serde_json::to_string(&steps[steps.len() - 1].task).expect("serializes")],
    )
    .expect("the task's data");
    drop(conn);
    let store = Store::open(&path).expect("migrates");
    assert_eq!(
        store.load_task("a").expect("load"),
        Some(steps[steps.len() - 1].task.clone())
    );
}

/// A store written before migration 3 (its journal with `AUTOINCREMENT`) keeps every journal
/// row and its seq when opened; appends go on after the largest seq, the journal stays
/// append-only and its rows still need their task.
#[test]
fn migration_3_keeps_the_journal_and_its_seqs() {
    let (_dir, path) = temp_db();
    let (a, b) = (lifecycle("a", 1_000), lifecycle("b", 2_000));
    // A connection per commit: each row holds its whole task, as every row did before
    // migration 4.
    for step in a.iter().take(2).chain(&b) {
        Store::open(&path)
            .expect("open")
            .commit(&step.rec())
            .expect("commit");
    }
    let store = Store::open(&path).expect("open");
    let before = (
        store.journal("a").expect("a"),
        store.journal("b").expect("b"),
    );
    let tasks = store.load_tasks().expect("tasks");
    drop(store);
    // The journal as migrations 1 and 2 left it, and the task rows with their `data` (the task
    // after its last journal row) as before migration 5.
    let conn = super::raw(&path);
    back_to_6(&conn);
    conn.execute_batch("ALTER TABLE tasks ADD COLUMN data TEXT NOT NULL DEFAULT ''")
        .expect("the data column");
    for task in &tasks {
        conn.execute(
            "UPDATE tasks SET data = ?2 WHERE id = ?1",
            [
                task.id.as_str(),
                &serde_json::to_string(task).expect("serializes"),
            ],
        )
        .expect("the task's data");
    }
    conn.execute_batch(
        "PRAGMA foreign_keys = OFF;
         BEGIN;
         CREATE TABLE journal_v2 (
             seq          INTEGER PRIMARY KEY AUTOINCREMENT,
             task_id      TEXT NOT NULL REFERENCES tasks(id),
             task_seq     INTEGER NOT NULL CHECK (task_seq >= 1),
             at           INTEGER NOT NULL,
             event_name   TEXT NOT NULL,
             event        TEXT NOT NULL,
             state_before TEXT NOT NULL,
             state_after  TEXT NOT NULL,
             commands     TEXT NOT NULL,
             task_after   TEXT NOT NULL
         );
         INSERT INTO journal_v2 SELECT seq, task_id, task_seq, at, event_name, event,
             state_before, state_after, commands, task_after FROM journal;
         DROP TABLE journal;
         ALTER TABLE journal_v2 RENAME TO journal;
         CREATE UNIQUE INDEX journal_task_seq ON journal(task_id, task_seq);
         CREATE TRIGGER journal_no_update BEFORE UPDATE ON journal
         BEGIN SELECT RAISE(ABORT, 'the journal is append-only: UPDATE refused'); END;
         CREATE TRIGGER journal_no_delete BEFORE DELETE ON journal
         BEGIN SELECT RAISE(ABORT, 'the journal is append-only: DELETE refused'); END;
         DROP INDEX sandboxes_by_task;
         CREATE INDEX sandboxes_task ON sandboxes(task_id, status);
         PRAGMA user_version = 2;
         COMMIT;",
    )
    .expect("write a version 2 journal");
    let count = |conn: &rusqlite::Connection, sql: &str| -> i64 {
        conn.query_row(sql, [], |r| r.get(0)).expect(sql)
    };
    const SEQUENCE: &str = "SELECT COUNT(*) FROM sqlite_sequence WHERE name = 'journal'";
    assert_eq!(
        count(&conn, SEQUENCE),
        1,
        "the version 2 journal has its sequence"
    );
    let largest = count(&conn, "SELECT MAX(seq) FROM journal");
    drop(conn);

    let mut store = Store::open(&path).expect("open and migrate");
    assert_eq!(
        (
            store.journal("a").expect("a"),
            store.journal("b").expect("b")
        ),
        before,
        "the rows and their seqs are kept"
    );
    // Migration 5 dropped the task rows' `data`: the tasks read back from the journal.
    assert_eq!(store.load_tasks().expect("tasks"), tasks);
    for step in a.iter().skip(2) {
        store
            .commit(&step.rec())
            .expect("commit after the migration");
    }
    let journal = store.journal("a").expect("a");
    assert_eq!(journal.len(), a.len());
    assert!(
        journal[2..].iter().all(|e| e.seq > largest as u64),
        "{journal:?}"
    );
    assert!(journal.windows(2).all(|w| w[0].seq < w[1].seq));
    store
        .integrity_check()
        .expect("a sound store after the migration");
    drop(store);

    let conn = super::raw(&path);
    assert!(count(&conn, "PRAGMA user_version") >= 3);
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) FROM sqlite_schema WHERE name LIKE 'sandboxes%'"
        ),
        0,
        "migration 6 replaced the sandboxes' index, and migration 7 dropped the table"
    );
    assert_eq!(count(&conn, SEQUENCE), 0, "AUTOINCREMENT is gone");
    for (sql, refused) in [
        ("UPDATE journal SET at = 0", "UPDATE refused"),
        ("DELETE FROM journal", "DELETE refused"),
    ] {
        let err = conn.execute_batch(sql).expect_err(sql).to_string();
        assert!(err.contains(refused), "{sql}: {err}");
    }
    let orphan = "PRAGMA foreign_keys = ON;
        INSERT INTO journal (task_id, task_seq, at, event_name, event, state_before,
                             state_after, commands, task_after)
        VALUES ('nobody', 1, 0, 'x', '{}', 'idle', 'idle', '[]', '{}')";
    let err = conn.execute_batch(orphan).expect_err("a row of no task");
    assert!(err.to_string().contains("FOREIGN KEY"), "{err}");
}

/// Takes a file of this version back to schema version 6: the task rows with their state (the
/// last journal row's) and `updated_at`, the snapshot and sandbox tables as migrations 1 and 6
/// left them (empty: migration 7 drops them whatever they hold), and no forks' shares.
fn back_to_6(conn: &rusqlite::Connection) {
    conn.execute_batch(
        "DROP TABLE fork_shares;
         ALTER TABLE tasks ADD COLUMN state TEXT NOT NULL DEFAULT '';
         ALTER TABLE tasks ADD COLUMN updated_at INTEGER NOT NULL DEFAULT 0;
         UPDATE tasks SET state = (SELECT state_after FROM journal WHERE task_id = tasks.id
                                   ORDER BY task_seq DESC LIMIT 1);
         CREATE TABLE snapshots (
             task_id     TEXT NOT NULL REFERENCES tasks(id),
             seq         INTEGER NOT NULL,
             provider_id TEXT,
             status      TEXT NOT NULL,
             size_bytes  INTEGER NOT NULL,
             sandbox_id  TEXT NOT NULL,
             started_at  INTEGER NOT NULL,
             created_at  INTEGER,
             expires_at  INTEGER,
             PRIMARY KEY (task_id, seq)
         ) WITHOUT ROWID;
         CREATE INDEX snapshots_provider_id ON snapshots(provider_id)
             WHERE provider_id IS NOT NULL;
         CREATE TABLE sandboxes (
             provider_id     TEXT PRIMARY KEY NOT NULL,
             name            TEXT NOT NULL,
             task_id         TEXT NOT NULL REFERENCES tasks(id),
             generation      INTEGER NOT NULL,
             created_at      INTEGER NOT NULL,
             deadline        INTEGER NOT NULL,
             source_snapshot TEXT,
             status          TEXT NOT NULL CHECK (status IN ('running', 'released')),
             released_at     INTEGER,
             CHECK ((status = 'released') = (released_at IS NOT NULL))
         ) WITHOUT ROWID;
         CREATE INDEX sandboxes_by_task ON sandboxes(task_id);
         PRAGMA user_version = 6;",
    )
    .expect("back to version 6");
}

/// A fork's commit records its share of its parent's snapshot, through which the store finds
/// who else retains it; migration 7 fills the shares of the forks made before it from their
/// journals (the row that set the lineage, or a keyframe), and drops the tables a commit no
/// longer writes. A removed fork stops retaining it, unless its snapshots were kept.
#[test]
fn migration_7_finds_the_forks_in_the_journal() {
    let (_dir, path) = temp_db();
    let parent = lifecycle("p", 1_000);
    let (child, snap) = super::fork_of(&parent, "c", 2_000);
    let mut store = Store::open(&path).expect("open");
    for step in parent.iter().chain(&child.steps) {
        store.commit(&step.rec()).expect("commit");
    }
    let holders = |store: &Store| {
        (
            store
                .snapshot_holders(snap.as_str(), "p")
                .expect("asked by p"),
            store
                .snapshot_holders(snap.as_str(), "c")
                .expect("asked by c"),
        )
    };
    assert_eq!(
        holders(&store),
        (vec!["c".to_string()], vec!["p".to_string()])
    );
    drop(store);

    let conn = super::raw(&path);
    back_to_6(&conn);
    drop(conn);
    let mut store = Store::open(&path).expect("migrates");
    assert_eq!(
        holders(&store),
        (vec!["c".to_string()], vec!["p".to_string()])
    );
    let conn = super::raw(&path);
    let tables: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite%' \
             ORDER BY name",
        )
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("tables");
    assert_eq!(tables, ["fork_shares", "journal", "meta", "tasks"]);
    let shares: (String, String, String) = conn
        .query_row("SELECT snapshot, child, parent FROM fork_shares", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .expect("one share");
    assert_eq!(shares, (snap.to_string(), "c".into(), "p".into()));
    drop(conn);

    // Removed without keeping its snapshots, the fork retains nothing.
    store.mark_removed("c", 3_000, false).expect("remove");
    assert_eq!(holders(&store), (vec![], vec!["p".to_string()]));
    store.integrity_check().expect("a sound store");
}
