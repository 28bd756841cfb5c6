//! What the store refuses or reports: a store from a newer taskbox, a file that is not SQLite,
//! corrupt rows (typed errors naming task and column) and dangling rows.

use taskbox::core::{Event, TaskState};
use taskbox::store::{Store, StoreError};

use super::{assert_rows_mirror, lifecycle, raw, temp_db};

#[test]
fn a_store_from_a_newer_taskbox_is_refused_untouched() {
    let (_dir, path) = temp_db();
    drop(Store::open(&path).expect("create"));
    raw(&path)
        .pragma_update(None, "user_version", 99)
        .expect("bump version");
    let err = Store::open(&path).expect_err("newer schema");
    match &err {
        StoreError::TooNew {
            path: p,
            found,
            supported,
        } => {
            assert_eq!(p, &path);
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
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    let version: i64 = raw(&path)
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, 99);
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

#[test]
fn corrupt_rows_are_typed_errors_naming_task_and_column() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    for step in lifecycle("a", 1_000) {
        store.commit(&step.rec()).expect("commit");
    }
    let conn = raw(&path);
    conn.execute(
        "UPDATE tasks SET data = '{\"id\": \"a\"}' WHERE id = 'a'",
        [],
    )
    .expect("corrupt the task");
    for err in [
        store.load_task("a").expect_err("corrupt data"),
        store.load_tasks().expect_err("corrupt data"),
    ] {
        assert!(
            matches!(&err, StoreError::Corrupt { task_id, column: "tasks.data", .. }
                if task_id == "a"),
            "{err:?}"
        );
        assert!(err.to_string().contains("task `a`"), "{err}");
    }
    // The next transition replaces the damaged row whole (its JSON lacks the `snapshots` and
    // `sandbox` the commit compares against).
    let mut next = lifecycle("a", 1_000).pop().expect("steps");
    next.before = TaskState::Expired;
    next.event = Event::Recovered;
    store
        .commit(&next.rec())
        .expect("commit over the damaged row");
    assert_eq!(store.load_task("a").expect("load"), Some(next.task.clone()));
    assert_rows_mirror(&store, &next.task);

    // Rewriting history takes dropping the trigger first; the read still refuses bad rows.
    conn.execute_batch(
        "DROP TRIGGER journal_no_update;
         UPDATE journal SET state_after = 'sleeping' WHERE task_seq = 2;",
    )
    .expect("corrupt the journal");
    let err = store.journal("a").expect_err("corrupt state");
    assert!(
        matches!(&err, StoreError::Corrupt { task_id, column: "journal.state_after",
            seq: Some(_), reason, .. } if task_id == "a" && reason.contains("sleeping")),
        "{err:?}"
    );
    conn.execute(
        "UPDATE journal SET state_after = 'running', commands = '[{\"type\": \"explode\"}]'
         WHERE task_seq = 2",
        [],
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

/// Ids are typed when they leave the store: a row whose task id is not a valid task id (edited
/// by hand into a path) is reported corrupt, naming the column, and never handed out as a task.
#[test]
fn a_row_whose_task_id_is_not_a_task_id_is_corrupt() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    for step in lifecycle("a", 1_000) {
        store.commit(&step.rec()).expect("commit");
    }
    let conn = raw(&path);
    conn.pragma_update(None, "foreign_keys", false)
        .expect("edit rows by hand");
    conn.execute("UPDATE snapshots SET task_id = '../evil'", [])
        .expect("corrupt the snapshot rows");
    let err = store.snapshots(None).expect_err("a path for a task id");
    assert!(
        matches!(&err, StoreError::Corrupt { task_id, column: "snapshots.task_id", .. }
            if task_id == "../evil"),
        "{err:?}"
    );
    conn.execute("UPDATE sandboxes SET task_id = '../evil'", [])
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
    // (`tasks.id` has a CHECK of its own; the journal's column has none.)
    conn.execute_batch(
        "DROP TRIGGER journal_no_update;
         UPDATE journal SET task_id = '../evil' WHERE task_seq = 2;",
    )
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
