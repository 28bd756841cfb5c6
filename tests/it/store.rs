//! The SQLite store on real files in temporary directories: durability shape (tables, journal,
//! triggers), atomicity, schema versioning, concurrency between two handles, and group commit.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use rusqlite::Connection;
use taskbox::core::{
    Command, Event, Millis, SandboxRecord, SnapshotRecord, SnapshotStatus, Task, TaskSettings,
    TaskState, TimerKind,
};
use taskbox::store::{SandboxStatus, Store, StoreError, TransitionRecord};

/// One transition with owned parts, so a test can build a sequence and commit it later.
#[derive(Clone)]
struct Owned {
    at: Millis,
    event: Event,
    before: TaskState,
    task: Task,
    commands: Vec<Command>,
}

impl Owned {
    fn rec(&self) -> TransitionRecord<'_> {
        TransitionRecord {
            at: self.at,
            event: &self.event,
            state_before: self.before,
            task_after: &self.task,
            commands: &self.commands,
        }
    }
}

/// Builds a task's transitions one after the other, each starting from the previous task.
struct Script {
    task: Task,
    at: Millis,
    steps: Vec<Owned>,
}

impl Script {
    fn new(id: &str, at: Millis) -> Script {
        Script {
            task: Task::new(id, TaskSettings::default(), at),
            at,
            steps: Vec::new(),
        }
    }

    fn step(&mut self, event: Event, commands: Vec<Command>, change: impl FnOnce(&mut Task)) {
        let before = self.task.state;
        change(&mut self.task);
        self.at += 10;
        self.steps.push(Owned {
            at: self.at,
            event,
            before,
            task: self.task.clone(),
            commands,
        });
    }
}

fn sandbox(task: &str, generation: u64, created_at: Millis) -> SandboxRecord {
    SandboxRecord {
        id: format!("sbx_{task}_{generation}"),
        name: format!("taskbox-{task}-{generation}"),
        generation,
        created_at,
        deadline: created_at + 300_000,
        source_snapshot: None,
    }
}

/// A whole lifecycle: idle → provisioning → running → snapshotting → expired.
fn lifecycle(id: &str, start: Millis) -> Vec<Owned> {
    let mut s = Script::new(id, start);
    s.step(
        Event::RunRequested {
            request_id: 1,
            command: "echo hi".into(),
            timeout_ms: 1_000,
        },
        vec![Command::CreateSandbox {
            generation: 1,
            source_snapshot: None,
            timeout_ms: 300_000,
        }],
        |t| {
            t.state = TaskState::Provisioning;
            t.generation = 1;
        },
    );
    let sb = sandbox(id, 1, start + 20);
    s.step(
        Event::SandboxReady {
            generation: 1,
            sandbox_id: sb.id.clone(),
            name: sb.name.clone(),
            deadline: sb.deadline,
        },
        vec![Command::RunCommand {
            request_id: 1,
            sandbox_id: sb.id.clone(),
            command: "echo hi".into(),
            timeout_ms: 1_000,
        }],
        |t| {
            t.state = TaskState::Running;
            t.sandbox = Some(sb.clone());
        },
    );
    s.step(
        Event::SuspendRequested { request_id: 2 },
        vec![Command::TakeSnapshot {
            sandbox_id: sb.id.clone(),
            seq: 1,
        }],
        |t| {
            t.state = TaskState::Snapshotting;
            t.snapshots.push(SnapshotRecord {
                seq: 1,
                id: None,
                status: SnapshotStatus::Pending,
                size_bytes: 0,
                sandbox_id: sb.id.clone(),
                started_at: start + 30,
                created_at: None,
                expires_at: None,
            });
        },
    );
    s.step(
        Event::SnapshotTaken {
            seq: 1,
            snapshot_id: format!("snap_{id}_1"),
            size_bytes: 4096,
            expires_at: Some(start + 1_000_000),
        },
        vec![],
        |t| {
            t.state = TaskState::Expired;
            t.sandbox = None;
            let snap = &mut t.snapshots[0];
            snap.id = Some(format!("snap_{id}_1"));
            snap.status = SnapshotStatus::Complete;
            snap.size_bytes = 4096;
            snap.created_at = Some(start + 40);
            snap.expires_at = Some(start + 1_000_000);
        },
    );
    s.steps
}

fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("data").join("taskbox.db");
    (dir, path)
}

fn raw(path: &Path) -> Connection {
    Connection::open(path).expect("raw connection")
}

fn count(conn: &Connection, table: &str) -> i64 {
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .expect("count")
}

/// Row counts of the four tables, for "nothing changed" checks.
fn counts(path: &Path) -> [i64; 4] {
    let conn = raw(path);
    ["tasks", "journal", "snapshots", "sandboxes"].map(|t| count(&conn, t))
}

#[test]
fn create_and_reopen_keeps_installation_id_and_tasks() {
    let (_dir, path) = temp_db();
    let first_id;
    {
        let mut store = Store::open(&path).expect("open creates the file and its parents");
        assert_eq!(store.path(), path);
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
    let mut unsafe_id = Script::new("../escape", 3_000);
    unsafe_id.step(Event::Recovered, vec![], |_| {});
    let batch = [c[0].rec(), c[1].rec(), a[2].rec(), unsafe_id.steps[0].rec()];
    let err = store.commit_batch(&batch).expect_err("unsafe id");
    assert!(matches!(err, StoreError::InvalidTaskId { .. }), "{err:?}");
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
fn two_stores_on_one_file_commit_interleaved_without_loss() {
    const PER_TASK: u64 = 25;
    let (_dir, path) = temp_db();
    // Opened here, not in the threads: a thread failing before the barrier would leave the
    // other waiting forever.
    let stores = [
        Store::open(&path).expect("first handle"),
        Store::open(&path).expect("second handle"),
    ];
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
                    .map(|id| Task::new(id.as_str(), TaskSettings::default(), 0))
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

    let store = Store::open(&path).expect("reopen");
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

#[test]
fn commit_batch_equals_the_same_single_commits() {
    let (_dir, path) = temp_db();
    let single_path = path.with_file_name("single.db");
    let batch_path = path.with_file_name("batch.db");
    let mut single = Store::open(&single_path).expect("open single");
    let mut batch = Store::open(&batch_path).expect("open batch");

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
}

/// The snapshot rows are exactly the task's records, and the one `running` sandbox row (if any)
/// is the task's sandbox.
fn assert_rows_mirror(store: &Store, task: &Task) {
    let rows = store.snapshots(Some(&task.id)).expect("snapshots");
    let records: Vec<_> = rows
        .iter()
        .map(|r| SnapshotRecord {
            seq: r.seq,
            id: r.provider_id.clone(),
            status: r.status,
            size_bytes: r.size_bytes,
            sandbox_id: r.sandbox_id.clone(),
            started_at: r.started_at,
            created_at: r.created_at,
            expires_at: r.expires_at,
        })
        .collect();
    assert_eq!(records, task.snapshots);
    let running: Vec<_> = store
        .sandboxes(Some(&task.id))
        .expect("sandboxes")
        .into_iter()
        .filter(|r| r.status == SandboxStatus::Running)
        .map(|r| SandboxRecord {
            id: r.provider_id,
            name: r.name,
            generation: r.generation,
            created_at: r.created_at,
            deadline: r.deadline,
            source_snapshot: r.source_snapshot,
        })
        .collect();
    assert_eq!(running, task.sandbox.iter().cloned().collect::<Vec<_>>());
}

/// A running task whose sandbox is replaced and extended, whose snapshots come, change status
/// and fall out of retention, and which finally loses its sandbox.
fn sandbox_and_snapshot_scenario() -> Vec<Owned> {
    let mut s = Script::new("t", 1_000);
    let g1 = sandbox("t", 1, 1_000);
    let g2 = sandbox("t", 2, 2_000);
    let snap = |seq: u64, status| SnapshotRecord {
        seq,
        id: Some(format!("snap_{seq}")),
        status,
        size_bytes: seq * 100,
        sandbox_id: "sbx_t_1".into(),
        started_at: 1_500,
        created_at: Some(1_600),
        expires_at: None,
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

#[test]
fn snapshot_and_sandbox_rows_follow_the_task() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    let steps = sandbox_and_snapshot_scenario();
    let at: Vec<Millis> = steps.iter().map(|o| o.at).collect();

    store.commit(&steps[0].rec()).expect("commit");
    let rows = store.sandboxes(Some("t")).expect("sandboxes");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].provider_id.as_str(), rows[0].status),
        ("sbx_t_1", SandboxStatus::Running)
    );
    assert_eq!(rows[0].name, "taskbox-t-1");
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
            .map(|r| (r.seq, r.status, r.provider_id.clone().unwrap_or_default()))
            .collect::<Vec<_>>(),
        [
            (2, SnapshotStatus::Deleting, "snap_2".to_string()),
            (3, SnapshotStatus::Complete, "snap_3".to_string()),
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

#[test]
fn integrity_check_reports_dangling_rows() {
    let (_dir, path) = temp_db();
    let store = Store::open(&path).expect("open");
    store.integrity_check().expect("intact");
    // A writer with foreign keys off (the default of many SQLite builds) can leave a row
    // pointing nowhere.
    let conn = raw(&path);
    conn.pragma_update(None, "foreign_keys", false)
        .expect("foreign keys off");
    conn.execute(
        "INSERT INTO snapshots (task_id, seq, status, size_bytes, sandbox_id, started_at)
             VALUES ('ghost', 1, 'complete', 0, 'sbx', 0)",
        [],
    )
    .expect("insert dangling row");
    let err = store.integrity_check().expect_err("dangling snapshot row");
    assert!(
        matches!(&err, StoreError::Integrity { report, .. } if report.contains("snapshots")),
        "{err:?}"
    );
}

#[test]
fn rows_mirror_the_task_after_every_commit_including_no_op_ones() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
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
    // The skip relies on SQLite rendering a stored JSON subtree as serde wrote it; check that
    // it does, or the skip would never apply (correct, only slower).
    let task = store.load_task("t").expect("load").expect("present");
    let (snapshots, sandbox): (String, String) = raw(&path)
        .query_row(
            "SELECT data -> '$.snapshots', data -> '$.sandbox' FROM tasks WHERE id = 't'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("json subtrees");
    assert_eq!(
        snapshots,
        serde_json::to_string(&task.snapshots).expect("json")
    );
    assert_eq!(sandbox, serde_json::to_string(&task.sandbox).expect("json"));
}
