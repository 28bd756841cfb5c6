//! The PostgreSQL store ([`PgStore`]): the same tables, journal and contract as the SQLite
//! file, in a database that many taskbox servers share.
//!
//! **Client.** `tokio-postgres`, one connection per store and no pool: a store belongs to one
//! event loop, which issues one statement sequence at a time, so a pool would add a dependency
//! and nothing else. TLS is not built in (`NoTls`): the database is expected on loopback or a
//! private network; a URL asking for `sslmode=require` fails to connect with the server's
//! answer.
//!
//! **Blocking bridge.** [`Backend`] is synchronous (the engine calls the store between events,
//! as it calls SQLite), and the engine may run on any tokio runtime, a paused single-threaded
//! one included, where a nested `block_on` would panic. So the store owns a one-thread runtime
//! of its own that drives the connection; a call spawns its statements there and waits for the
//! answer on a plain channel. The caller's thread blocks for the round trips exactly as it
//! blocks for SQLite's disk sync.
//!
//! **Durability.** A commit returns once PostgreSQL committed (with the server's default
//! `synchronous_commit = on`, after its WAL flush). One transition is one statement, a
//! transaction of its own (one round trip); a batch is one transaction: `BEGIN`, one
//! `taskbox_commit` call per transition, `COMMIT`.
//!
//! **Connection loss.** A call made while the connection is closed first reconnects (the
//! server's `connect_timeout`, 5 s unless the URL says otherwise); a statement cut by a lost
//! connection fails with [`StoreError::Postgres`] whose hint says it is retryable. A commit cut
//! that way may or may not have landed: the engine treats it as not committed, unloads the task
//! and recovers it from the journal on its next request, which is exactly what the journal is
//! for. Statements are not retried behind the caller's back.
//!
//! **Secrets.** The URL is kept parsed ([`PgTarget`]); only its redacted form (password
//! replaced by `[redacted]`) is ever put in an error or a log line.

mod commit;
mod connection;
mod lease;
mod rows;
mod schema;
mod target;

use std::sync::{Arc, Mutex};

use super::Sync as CommitSync;
use super::{
    Backend, JournalEntry, SandboxRow, SnapshotRow, StoreError, TaskMarks, TransitionRecord,
};
use crate::core::{Millis, Task};
use crate::ids::TaskId;

use connection::{migrate, Fail, Session};
use rows::JOURNAL_COLUMNS;
use tokio_postgres::NoTls;

pub use lease::{Fences, JournalWriter, Lease, LeaseRow};
pub use target::PgTarget;

/// An open PostgreSQL store. Like the SQLite store, give each thread its own.
pub struct PgStore {
    target: PgTarget,
    installation_id: String,
    /// Tasks whose commits are fenced, and their tokens (see [`PgStore::acquire_lease`]).
    fences: Fences,
    /// The connection, replaced when found closed.
    session: Mutex<Option<Arc<Session>>>,
    /// Drives the connection; `None` only while dropping.
    rt: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("target", &self.target)
            .field("installation_id", &self.installation_id)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to the database at `target`, brings its schema up to date (refusing one written
    /// by a newer taskbox) and reads or creates the installation id.
    pub fn open(target: &PgTarget) -> Result<PgStore, StoreError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("taskbox-postgres")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Postgres {
                target: target.redacted().to_string(),
                operation: "starting the PostgreSQL client's runtime",
                task_id: None,
                retryable: false,
                source: Box::new(e),
            })?;
        let mut store = PgStore {
            target: target.clone(),
            installation_id: String::new(),
            fences: Fences::default(),
            session: Mutex::new(None),
            rt: Some(rt),
        };
        let config = store.config();
        let redacted = store.target.redacted().to_string();
        let migrated = store.block(async move { migrate(&config, &redacted).await });
        match migrated {
            Some(Ok(())) => {}
            Some(Err(Fail::Store(e))) => return Err(e),
            Some(Err(Fail::Pg(e))) => return Err(store.error("migrating the schema", None, e)),
            None => return Err(store.gone("migrating the schema", None)),
        }
        store.installation_id = store.read_installation_id()?;
        Ok(store)
    }

    /// Where the store is, password redacted.
    pub fn target(&self) -> &PgTarget {
        &self.target
    }

    /// The fencing tokens this store's commits carry; give the same to every store of one
    /// server ([`PgStore::share_fences`]).
    pub fn fences(&self) -> Fences {
        self.fences.clone()
    }

    /// Makes this store's commits carry the tokens of `fences` (another store's of this server).
    pub fn share_fences(&mut self, fences: Fences) {
        self.fences = fences;
    }

    /// Creates (`create`) or drops the database `name` on the server of `admin` (connected to
    /// as `admin` says): the scratch database of a `taskbox chaos --fleet` seed. `name` is
    /// made of lowercase letters, digits and `_`. Runs on a thread of its own, so it may be
    /// called from anywhere, a runtime included.
    // The store is the one module allowed to connect to PostgreSQL (clippy.toml).
    #[allow(clippy::disallowed_methods)]
    pub fn scratch_database(admin: &PgTarget, name: &str, create: bool) -> Result<(), StoreError> {
        let operation = if create {
            "creating a scratch database"
        } else {
            "dropping a scratch database"
        };
        let fail = |retryable: bool, source: Box<dyn std::error::Error + Send + Sync>| {
            StoreError::Postgres {
                target: admin.redacted().to_string(),
                operation,
                task_id: None,
                retryable,
                source,
            }
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(fail(
                false,
                format!("`{name}` is not a plain database name").into(),
            ));
        }
        let sql = if create {
            format!("CREATE DATABASE {name}")
        } else {
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        };
        let config = admin.config.clone();
        let done = std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async {
                    let (client, conn) = config.connect(NoTls).await?;
                    let driver = tokio::spawn(async move {
                        let _ = conn.await;
                    });
                    let r = client.batch_execute(&sql).await;
                    drop(client);
                    let _ = driver.await;
                    r
                })
                .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { Box::new(e) })
            })
            .join()
        });
        match done {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(fail(true, e)),
            Err(_) => Err(fail(false, "the thread running it panicked".into())),
        }
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Close the connection, then let the runtime go without waiting (a store may be dropped
        // inside another runtime, where a blocking shutdown would panic).
        self.session
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Backend for PgStore {
    fn installation_id(&self) -> &str {
        &self.installation_id
    }

    fn load_task(&self, id: &str) -> Result<Option<Task>, StoreError> {
        let rows = self.query_task(
            "loading a task",
            id,
            "SELECT id, state, data FROM tasks WHERE id = $1",
        )?;
        rows.first().map(|r| self.decode_task(r)).transpose()
    }

    fn load_tasks(&self) -> Result<Vec<Task>, StoreError> {
        let rows = self.query_all(
            "loading tasks",
            "SELECT id, state, data FROM tasks ORDER BY id",
        )?;
        rows.iter().map(|r| self.decode_task(r)).collect()
    }

    fn task_ids(&self) -> Result<Vec<TaskId>, StoreError> {
        let rows = self.query_all("listing task ids", "SELECT id FROM tasks ORDER BY id")?;
        rows.iter().map(|r| self.decode_task_id(r, 0)).collect()
    }

    fn task_marks(&self, id: &str) -> Result<Option<TaskMarks>, StoreError> {
        let rows = self.query_task(
            "reading a task's backend",
            id,
            "SELECT backend, removed_at, kept_snapshots FROM tasks WHERE id = $1",
        )?;
        rows.first().map(|r| self.decode_marks(r, 0)).transpose()
    }

    /// The SQL mirrors `taskbox_core::retention::holds` (the status list) and
    /// `retention::removed_task_holds` (the removal marks); the store model test
    /// (`tests/it/store/rows.rs`, against `store::model::holders`) holds it equal to them.
    fn snapshot_holders(&self, provider_id: &str, asking: &str) -> Result<Vec<String>, StoreError> {
        let rows = self.query(
            "finding the tasks that retain a snapshot",
            None,
            "SELECT DISTINCT s.task_id FROM snapshots s JOIN tasks t ON t.id = s.task_id
             WHERE s.provider_id = $1 AND s.task_id <> $2
               AND s.status IN ('complete', 'pending')
               AND (t.removed_at IS NULL OR t.kept_snapshots)
             ORDER BY s.task_id"
                .to_string(),
            vec![
                Box::new(provider_id.to_string()),
                Box::new(asking.to_string()),
            ],
        )?;
        rows.iter()
            .map(|r| rows::get(&self.cx(None), r, 0, "snapshots.task_id"))
            .collect()
    }

    fn removed_tasks(&self) -> Result<Vec<(TaskId, TaskMarks)>, StoreError> {
        let rows = self.query_all(
            "listing removed tasks",
            "SELECT id, backend, removed_at, kept_snapshots FROM tasks
             WHERE removed_at IS NOT NULL ORDER BY id",
        )?;
        rows.iter()
            .map(|r| Ok((self.decode_task_id(r, 0)?, self.decode_marks(r, 1)?)))
            .collect()
    }

    fn claim_backend(&mut self, id: &str, backend: &str) -> Result<Option<String>, StoreError> {
        self.query(
            "recording a task's backend",
            Some(id),
            "UPDATE tasks SET backend = $2 WHERE id = $1 AND backend IS NULL".to_string(),
            vec![Box::new(id.to_string()), Box::new(backend.to_string())],
        )?;
        Ok(Backend::task_marks(self, id)?.and_then(|m| m.backend))
    }

    fn mark_removed(&mut self, id: &str, at: Millis, kept: bool) -> Result<(), StoreError> {
        let at = i64::try_from(at).map_err(|_| StoreError::OutOfRange {
            task_id: id.to_string(),
            what: "removal time",
            value: at,
        })?;
        self.query(
            "marking a task removed",
            Some(id),
            "UPDATE tasks SET removed_at = $2, kept_snapshots = $3 WHERE id = $1".to_string(),
            vec![Box::new(id.to_string()), Box::new(at), Box::new(kept)],
        )?;
        Ok(())
    }

    fn commit_batch(&mut self, recs: &[TransitionRecord<'_>]) -> Result<Vec<u64>, StoreError> {
        Backend::commit_batch_with(self, recs, CommitSync::Now)
    }

    fn commit_batch_with(
        &mut self,
        recs: &[TransitionRecord<'_>],
        sync: CommitSync,
    ) -> Result<Vec<u64>, StoreError> {
        self.commit_transitions(recs, sync)
    }

    fn journal(&self, task_id: &str) -> Result<Vec<JournalEntry>, StoreError> {
        let rows = self.query_task(
            "reading the journal",
            task_id,
            &format!("SELECT {JOURNAL_COLUMNS} FROM journal WHERE task_id = $1 ORDER BY task_seq"),
        )?;
        self.decode_journal(&rows)
    }

    fn journal_tail(&self, task_id: &str, limit: usize) -> Result<Vec<JournalEntry>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.query(
            "reading the journal",
            Some(task_id),
            format!(
                "SELECT * FROM (SELECT {JOURNAL_COLUMNS} FROM journal WHERE task_id = $1 \
                 ORDER BY task_seq DESC LIMIT $2) AS tail ORDER BY task_seq"
            ),
            vec![Box::new(task_id.to_string()), Box::new(limit)],
        )?;
        self.decode_journal(&rows)
    }

    fn integrity_check(&self) -> Result<(), StoreError> {
        let rows = self.query_all(
            "checking integrity",
            "SELECT (SELECT version FROM taskbox_schema),
                    (SELECT count(*) FROM pg_trigger
                     WHERE tgrelid = 'journal'::regclass AND NOT tgisinternal
                       AND tgname IN ('journal_no_update', 'journal_no_truncate')),
                    (SELECT count(*) FROM tasks t
                     WHERE NOT EXISTS (SELECT 1 FROM journal j WHERE j.task_id = t.id))",
        )?;
        let mut problems = Vec::new();
        if let Some(row) = rows.first() {
            let version: Option<i64> = row.get(0);
            if version != Some(schema::supported_version()) {
                problems.push(format!(
                    "schema version {version:?}, expected {}",
                    schema::supported_version()
                ));
            }
            if row.get::<_, i64>(1) != 2 {
                problems.push("the journal's append-only triggers are missing".to_string());
            }
            let orphans: i64 = row.get(2);
            if orphans > 0 {
                problems.push(format!("{orphans} task rows have no journal"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(StoreError::Integrity {
                path: self.target.redacted().into(),
                report: problems.join("\n"),
            })
        }
    }

    fn sandboxes(&self, task_id: Option<&str>) -> Result<Vec<SandboxRow>, StoreError> {
        let rows = self.query(
            "listing sandboxes",
            task_id,
            "SELECT provider_id, name, task_id, generation, created_at, deadline,
                    source_snapshot, status, released_at
             FROM sandboxes WHERE $1::TEXT IS NULL OR task_id = $1
             ORDER BY task_id, generation, provider_id"
                .to_string(),
            vec![Box::new(task_id.map(str::to_string))],
        )?;
        let path = std::path::Path::new(self.target.redacted());
        rows.iter()
            .map(|row| rows::decode_sandbox(path, row))
            .collect()
    }

    fn snapshots(&self, task_id: Option<&str>) -> Result<Vec<SnapshotRow>, StoreError> {
        let rows = self.query(
            "listing snapshots",
            task_id,
            "SELECT task_id, seq, provider_id, status, size_bytes, sandbox_id, started_at,
                    created_at, expires_at
             FROM snapshots WHERE $1::TEXT IS NULL OR task_id = $1
             ORDER BY task_id, seq"
                .to_string(),
            vec![Box::new(task_id.map(str::to_string))],
        )?;
        let path = std::path::Path::new(self.target.redacted());
        rows.iter()
            .map(|row| rows::decode_snapshot(path, row))
            .collect()
    }
}
