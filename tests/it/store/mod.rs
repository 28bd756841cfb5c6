//! The store, one concern a file: the durability shape (tables, journal, triggers) and
//! atomicity in `commit`, schema versioning and damaged files and rows in `integrity`, two
//! handles on one store and group commit in `concurrency`, and the snapshot and sandbox rows
//! that mirror a task in `rows`. The scripts and row checks they share live here.
//!
//! Every test written with [`on_both_stores!`] runs twice: on an SQLite file in a temporary
//! directory (`…::sqlite`) and on a database of a throwaway PostgreSQL (`…::postgres`, see
//! `crate::pg`; skipped with a message where PostgreSQL is not installed, except under CI).
//! The few plain `#[test]`s are about SQLite files themselves.

mod commit;
mod concurrency;
mod integrity;
mod lease;
pub(crate) mod model;
mod reconnect;
mod rows;

use std::path::{Path, PathBuf};

use crate::support::tid;
use rusqlite::Connection;
use taskbox::core::{
    Command, Event, Millis, SandboxRecord, SnapshotRecord, SnapshotStatus, Task, TaskSettings,
    TaskState,
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
            task: Task::new(tid(id), TaskSettings::default(), at),
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

/// A fork `child` of the task whose steps are `parent`, from the parent's first snapshot: its
/// first row names its lineage and holds a record of that snapshot (as `Event::Forked` leaves
/// it), three more rows do not (deltas). Returns the fork's steps and the snapshot.
fn fork_of(parent: &[Owned], child: &str, at: Millis) -> (Script, taskbox::ids::SnapshotId) {
    let taken = parent
        .last()
        .and_then(|s| s.task.snapshots.first().cloned())
        .expect("the parent's snapshot");
    let snap = taken.id.clone().expect("complete");
    let mut s = Script::new(child, at);
    s.step(Event::Recovered, vec![], |t| {
        t.state = TaskState::Expired;
        t.lineage = Some(taskbox::core::Lineage {
            parent: parent[0].task.id.clone(),
            snapshot: snap.clone(),
            parent_seq: taken.seq,
            forked_at: at,
        });
        t.restore_source = Some(snap.clone());
        t.snapshots.push(SnapshotRecord {
            seq: 0,
            ..taken.clone()
        });
    });
    for _ in 0..3 {
        s.step(Event::Recovered, vec![], |t| t.last_activity += 1);
    }
    (s, snap)
}

/// The installation the test sandboxes' names are made for.
const INSTALLATION: &str = "0f1e2d3c4b5a6978";

fn sandbox(task: &str, generation: u64, created_at: Millis) -> SandboxRecord {
    SandboxRecord {
        id: format!("sbx_{task}_{generation}").into(),
        // A name as the engine makes it: the store refuses a record whose name is another
        // task's.
        name: taskbox::provider::sandbox_name(INSTALLATION, task, generation),
        generation,
        created_at,
        deadline: created_at + 300_000,
        source_snapshot: None,
        used: false,
        activity: None,
        sampling: false,
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
                omitted: Vec::new(),
                taken_by: None,
                kind: None,
            });
        },
    );
    s.step(
        Event::SnapshotTaken {
            seq: 1,
            snapshot_id: format!("snap_{id}_1").into(),
            size_bytes: 4096,
            expires_at: Some(start + 1_000_000),
            omitted: Vec::new(),
            usage: None,
            resources: None,
        },
        vec![],
        |t| {
            t.state = TaskState::Expired;
            t.sandbox = None;
            let snap = &mut t.snapshots[0];
            snap.id = Some(format!("snap_{id}_1").into());
            snap.status = SnapshotStatus::Complete;
            snap.size_bytes = 4096;
            snap.created_at = Some(start + 40);
            snap.expires_at = Some(start + 1_000_000);
        },
    );
    s.steps
}

/// Which store a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Sqlite,
    Postgres,
}

/// One store for a test: an SQLite file in a temporary directory, or a fresh PostgreSQL
/// database; with raw SQL access beside the store for checks and damage.
struct TestDb {
    kind: Kind,
    _dir: tempfile::TempDir,
    path: PathBuf,
    pg: Option<crate::pg::Db>,
}

impl TestDb {
    /// `None`: PostgreSQL is not installed (the harness said so).
    fn new(kind: Kind) -> Option<TestDb> {
        let (dir, path) = temp_db();
        let pg = match kind {
            Kind::Sqlite => None,
            Kind::Postgres => Some(crate::pg::database()?),
        };
        Some(TestDb {
            kind,
            _dir: dir,
            path,
            pg,
        })
    }

    /// Another, independent store of the same kind.
    fn sibling(&self, name: &str) -> TestDb {
        TestDb {
            kind: self.kind,
            _dir: tempfile::tempdir().expect("temp dir"),
            path: self.path.with_file_name(format!("{name}.db")),
            pg: self
                .pg
                .as_ref()
                .map(|_| crate::pg::database().expect("the server is up")),
        }
    }

    fn url(&self) -> &str {
        &self.pg.as_ref().expect("a PostgreSQL test").url
    }

    fn try_open(&self) -> Result<Store, StoreError> {
        match self.kind {
            Kind::Sqlite => Store::open(&self.path),
            Kind::Postgres => Store::connect(self.url()),
        }
    }

    fn open(&self) -> Store {
        self.try_open().expect("open the store")
    }

    /// Runs raw SQL beside the store; the error's text.
    fn exec(&self, sql: &str) -> Result<(), String> {
        match self.kind {
            Kind::Sqlite => raw(&self.path)
                .execute_batch(sql)
                .map_err(|e| e.to_string()),
            Kind::Postgres => crate::pg::execute(self.url(), sql),
        }
    }

    /// The first column of the first row, as text.
    fn text(&self, sql: &str) -> Option<String> {
        match self.kind {
            Kind::Sqlite => raw(&self.path)
                .query_row(sql, [], |r| r.get::<_, Option<String>>(0))
                .expect("query"),
            Kind::Postgres => crate::pg::query_text(self.url(), sql),
        }
    }

    /// Row counts of the tables a commit writes, for "nothing changed" checks: on SQLite the
    /// tasks, the journal and the forks' shares; on PostgreSQL the tasks, the journal and the
    /// snapshot and sandbox tables.
    fn counts(&self) -> Vec<(&'static str, i64)> {
        let tables: &[&'static str] = match self.kind {
            Kind::Sqlite => &["tasks", "journal", "fork_shares"],
            Kind::Postgres => &["tasks", "journal", "snapshots", "sandboxes"],
        };
        tables
            .iter()
            .map(|t| {
                let n = self
                    .text(&format!("SELECT CAST(count(*) AS TEXT) FROM {t}"))
                    .expect("a count")
                    .parse()
                    .expect("a number");
                (*t, n)
            })
            .collect()
    }
}

/// Writes a test that runs on both stores: `fn name(db: &TestDb) { … }` becomes the module
/// `name` with the tests `sqlite` and `postgres`.
macro_rules! on_both_stores {
    ($(#[doc = $doc:literal])* fn $name:ident($db:ident) $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            $(#[doc = $doc])*
            fn body($db: &$crate::store::TestDb) $body

            #[test]
            fn sqlite() {
                body(&$crate::store::TestDb::new($crate::store::Kind::Sqlite).expect("sqlite"));
            }

            #[test]
            fn postgres() {
                if let Some(db) = $crate::store::TestDb::new($crate::store::Kind::Postgres) {
                    body(&db);
                }
            }
        }
    };
}
pub(crate) use on_both_stores;

fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("data").join("taskbox.db");
    (dir, path)
}

fn raw(path: &Path) -> Connection {
    Connection::open(path).expect("raw connection")
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
            omitted: Vec::new(),
            taken_by: None,
            kind: None,
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
            used: false,
            activity: None,
            sampling: false,
        })
        .collect();
    assert_eq!(running, task.sandbox.iter().cloned().collect::<Vec<_>>());
}
