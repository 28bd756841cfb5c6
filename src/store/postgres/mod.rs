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

mod schema;
mod target;

use std::future::Future;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row, Statement};

use super::Sync as CommitSync;
use super::{
    Backend, JournalEntry, SandboxRow, SandboxStatus, SnapshotRow, StoreError, TaskMarks,
    TransitionRecord,
};
use crate::core::{Millis, Task, TaskState};
use crate::ids::TaskId;

pub use target::PgTarget;

/// How long connecting may take when the URL does not say (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The columns journal reads decode, in this order.
const JOURNAL_COLUMNS: &str = "seq, task_id, task_seq, at, event, state_before, state_after, \
                               commands, task_after";

/// The commit statement: one call of the schema's `taskbox_commit` function.
const COMMIT_SQL: &str = "SELECT taskbox_commit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, \
                          $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)";

/// The fenced commit: `taskbox_commit_fenced`, the lease's token first.
const COMMIT_FENCED_SQL: &str = "SELECT taskbox_commit_fenced($24, $1, $2, $3, $4, $5, $6, $7, \
                                 $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, \
                                 $20, $21, $22, $23)";

/// A task's lease, as this server holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The task.
    pub task_id: String,
    /// This server's name in the `leases` table.
    pub owner: String,
    /// The fencing token: greater than that of every earlier owner.
    pub token: i64,
}

/// The fencing tokens this server's commits carry, by task. Shared by the stores of one server
/// (the one that renews leases and the event loop's), so a commit always carries the token of
/// the lease as last acquired.
pub type Fences = Arc<Mutex<std::collections::HashMap<String, i64>>>;

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

/// One connection and the statements prepared on it.
struct Session {
    client: Client,
    commit: Statement,
    commit_fenced: Statement,
}

/// Why a call failed on the connection's side.
enum Fail {
    /// tokio-postgres's error.
    Pg(tokio_postgres::Error),
    /// Already a store error (a refused transition).
    Store(StoreError),
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Fail {
        Fail::Pg(e)
    }
}

/// One transition, owned and bound to SQL types, for the connection's runtime.
struct PgRecord {
    id: String,
    state_before: &'static str,
    state: &'static str,
    data: String,
    created_at: i64,
    at: i64,
    event_name: String,
    event: String,
    commands: String,
    snap_seq: Vec<i64>,
    snap_provider: Vec<Option<String>>,
    snap_status: Vec<&'static str>,
    snap_size: Vec<i64>,
    snap_sandbox: Vec<String>,
    snap_started: Vec<i64>,
    snap_created: Vec<Option<i64>>,
    snap_expires: Vec<Option<i64>>,
    sb_id: Option<String>,
    sb_name: Option<String>,
    sb_generation: Option<i64>,
    sb_created: Option<i64>,
    sb_deadline: Option<i64>,
    sb_source: Option<String>,
}

impl PgRecord {
    fn params_fenced<'a>(&'a self, token: &'a i64) -> Vec<&'a (dyn ToSql + Sync)> {
        let mut p = self.params().to_vec();
        p.push(token);
        p
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 23] {
        [
            &self.id,
            &self.state_before,
            &self.state,
            &self.data,
            &self.created_at,
            &self.at,
            &self.event_name,
            &self.event,
            &self.commands,
            &self.snap_seq,
            &self.snap_provider,
            &self.snap_status,
            &self.snap_size,
            &self.snap_sandbox,
            &self.snap_started,
            &self.snap_created,
            &self.snap_expires,
            &self.sb_id,
            &self.sb_name,
            &self.sb_generation,
            &self.sb_created,
            &self.sb_deadline,
            &self.sb_source,
        ]
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

    /// Takes (or renews, when `owner` holds it already) the task's lease for `ttl`, measured on
    /// the database's clock. A new owner gets a token greater than every earlier one; from
    /// then on this store's commits of the task are fenced by it. Refused with
    /// [`StoreError::LeaseHeld`] while another owner's lease is fresh.
    pub fn acquire_lease(
        &self,
        task_id: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease, StoreError> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let rows = self.query(
            "taking a task's lease",
            Some(task_id),
            "WITH taken AS (
                 INSERT INTO leases AS l (task_id, owner, token, expires_at)
                 VALUES ($1, $2, nextval('lease_tokens'),
                         now() + CAST($3 AS BIGINT) * interval '1 millisecond')
                 ON CONFLICT (task_id) DO UPDATE
                     SET owner = excluded.owner,
                         token = CASE WHEN l.owner = excluded.owner THEN l.token
                                      ELSE excluded.token END,
                         expires_at = excluded.expires_at
                     WHERE l.owner = excluded.owner OR l.expires_at < now()
                 RETURNING token)
             SELECT token, NULL::TEXT, NULL::BIGINT FROM taken
             UNION ALL
             SELECT NULL, owner,
                    CAST(GREATEST(0, EXTRACT(EPOCH FROM expires_at - now()) * 1000) AS BIGINT)
             FROM leases WHERE task_id = $1 AND NOT EXISTS (SELECT 1 FROM taken)"
                .to_string(),
            vec![
                Box::new(task_id.to_string()),
                Box::new(owner.to_string()),
                Box::new(ttl_ms),
            ],
        )?;
        let row = rows.first().ok_or_else(|| StoreError::LeaseLost {
            task_id: task_id.to_string(),
            owner: None,
        })?;
        let cx = self.cx(Some(task_id));
        match cx.get::<Option<i64>>(row, 0, "leases.token")? {
            Some(token) => {
                self.fences
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(task_id.to_string(), token);
                Ok(Lease {
                    task_id: task_id.to_string(),
                    owner: owner.to_string(),
                    token,
                })
            }
            None => Err(StoreError::LeaseHeld {
                task_id: task_id.to_string(),
                owner: cx.get(row, 1, "leases.owner")?,
                expires_in_ms: cx.opt_uint(row, 2, "leases.expires_at")?.unwrap_or(0),
            }),
        }
    }

    /// Extends `lease` by `ttl` from now; [`StoreError::LeaseLost`] when another owner took it
    /// (its token changed), and then this store's commits of the task stay refused.
    pub fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<(), StoreError> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let rows = self.query(
            "renewing a task's lease",
            Some(&lease.task_id),
            "UPDATE leases SET expires_at = now() + CAST($3 AS BIGINT) * interval '1 millisecond'
             WHERE task_id = $1 AND token = $2 RETURNING token"
                .to_string(),
            vec![
                Box::new(lease.task_id.clone()),
                Box::new(lease.token),
                Box::new(ttl_ms),
            ],
        )?;
        if rows.is_empty() {
            let owner = self
                .query(
                    "reading a task's lease",
                    Some(&lease.task_id),
                    "SELECT owner FROM leases WHERE task_id = $1".to_string(),
                    vec![Box::new(lease.task_id.clone())],
                )?
                .first()
                .and_then(|r| r.try_get::<_, String>(0).ok());
            return Err(StoreError::LeaseLost {
                task_id: lease.task_id.clone(),
                owner,
            });
        }
        Ok(())
    }

    /// Lets the lease go (a server stopping cleanly): another server may take the task at
    /// once. The token stays with the row, so the next owner's is still greater.
    pub fn release_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        self.query(
            "releasing a task's lease",
            Some(&lease.task_id),
            "UPDATE leases SET expires_at = now() - interval '1 millisecond'
             WHERE task_id = $1 AND token = $2"
                .to_string(),
            vec![Box::new(lease.task_id.clone()), Box::new(lease.token)],
        )?;
        Ok(())
    }

    /// Tries to become the one holder of the installation-wide job `name` (gc, the reaper): a
    /// session-level advisory lock, held by this store's connection until [`PgStore::release_job`]
    /// or until the connection ends (a dead server's lock goes with it).
    pub fn try_job(&self, name: &str) -> Result<bool, StoreError> {
        let rows = self.query(
            "taking a job's advisory lock",
            None,
            "SELECT pg_try_advisory_lock(hashtextextended('taskbox job ' || $1, 0))".to_string(),
            vec![Box::new(name.to_string())],
        )?;
        Ok(rows.first().is_some_and(|r| r.get::<_, bool>(0)))
    }

    /// Lets go of the job `name` taken by [`PgStore::try_job`].
    pub fn release_job(&self, name: &str) -> Result<(), StoreError> {
        self.query(
            "releasing a job's advisory lock",
            None,
            "SELECT pg_advisory_unlock(hashtextextended('taskbox job ' || $1, 0))".to_string(),
            vec![Box::new(name.to_string())],
        )?;
        Ok(())
    }

    fn config(&self) -> tokio_postgres::Config {
        let mut config = self.target.config.clone();
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config
    }

    /// Runs `fut` on the store's runtime and waits for it (`None`: the runtime is gone).
    fn block<T: Send + 'static>(&self, fut: impl Future<Output = T> + Send + 'static) -> Option<T> {
        let rt = self.rt.as_ref()?;
        let (tx, rx) = mpsc::sync_channel(1);
        rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().ok()
    }

    fn error(
        &self,
        operation: &'static str,
        task_id: Option<&str>,
        e: tokio_postgres::Error,
    ) -> StoreError {
        // A closed connection or an I/O error may heal by itself; an SQL error will not.
        let retryable = e.is_closed()
            || match e.as_db_error() {
                Some(db) => is_transient(db.code()),
                // Connecting or talking to the server failed (an I/O error or a timeout).
                None => std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>()),
            };
        StoreError::Postgres {
            target: self.target.redacted().to_string(),
            operation,
            task_id: task_id.map(str::to_string),
            retryable,
            source: Box::new(e),
        }
    }

    fn gone(&self, operation: &'static str, task_id: Option<&str>) -> StoreError {
        StoreError::Postgres {
            target: self.target.redacted().to_string(),
            operation,
            task_id: task_id.map(str::to_string),
            retryable: false,
            source: "the store's client runtime stopped".into(),
        }
    }

    /// The open connection, connecting first if there is none or it was closed.
    // The store is the one module allowed to connect to PostgreSQL (clippy.toml).
    #[allow(clippy::disallowed_methods)]
    fn session(
        &self,
        operation: &'static str,
        task_id: Option<&str>,
    ) -> Result<Arc<Session>, StoreError> {
        let mut slot = self.session.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slot.as_ref().filter(|s| !s.client.is_closed()) {
            return Ok(s.clone());
        }
        *slot = None;
        let config = self.config();
        let session = self
            .block(async move {
                let (client, conn) = config.connect(NoTls).await?;
                tokio::spawn(async move {
                    // Ends when the connection does; the next call sees `is_closed`.
                    let _ = conn.await;
                });
                let commit = client.prepare(COMMIT_SQL).await?;
                let commit_fenced = client.prepare(COMMIT_FENCED_SQL).await?;
                Ok::<_, tokio_postgres::Error>(Session {
                    client,
                    commit,
                    commit_fenced,
                })
            })
            .ok_or_else(|| self.gone(operation, task_id))?
            .map_err(|e| self.error(operation, task_id, e))?;
        let session = Arc::new(session);
        *slot = Some(session.clone());
        Ok(session)
    }

    /// Runs `f` on the connection and waits for its answer.
    fn call<T, F, Fut>(
        &self,
        operation: &'static str,
        task_id: Option<&str>,
        f: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Session>) -> Fut,
        Fut: Future<Output = Result<T, Fail>> + Send + 'static,
    {
        let session = self.session(operation, task_id)?;
        match self.block(f(session)) {
            Some(Ok(v)) => Ok(v),
            Some(Err(Fail::Store(e))) => Err(e),
            Some(Err(Fail::Pg(e))) => Err(self.error(operation, task_id, e)),
            None => Err(self.gone(operation, task_id)),
        }
    }

    /// Runs one query with owned parameters and returns its rows.
    fn query(
        &self,
        operation: &'static str,
        task_id: Option<&str>,
        sql: String,
        params: Vec<Box<dyn ToSql + Sync + Send>>,
    ) -> Result<Vec<Row>, StoreError> {
        self.call(operation, task_id, move |s| async move {
            let refs: Vec<&(dyn ToSql + Sync)> = params
                .iter()
                .map(|p| p.as_ref() as &(dyn ToSql + Sync))
                .collect();
            Ok(s.client.query(sql.as_str(), &refs).await?)
        })
    }

    fn read_installation_id(&self) -> Result<String, StoreError> {
        let candidate = super::schema::random_hex_128()?;
        let rows = self.query(
            "reading the installation id",
            None,
            "WITH ins AS (
                 INSERT INTO meta (key, value) VALUES ('installation_id', $1)
                 ON CONFLICT (key) DO NOTHING RETURNING value)
             SELECT value FROM ins UNION ALL
             SELECT value FROM meta WHERE key = 'installation_id'"
                .to_string(),
            vec![Box::new(candidate)],
        )?;
        let row = rows.first().ok_or_else(|| StoreError::Corrupt {
            path: self.target.redacted().into(),
            task_id: "-".to_string(),
            column: "meta.value",
            seq: None,
            reason: "the installation id row is missing".to_string(),
            source: None,
        })?;
        self.cx(None).get(row, 0, "meta.value")
    }

    fn cx(&self, task_id: Option<&str>) -> RowContext<'_> {
        RowContext {
            target: self.target.redacted(),
            task_id: task_id.unwrap_or("?").to_string(),
            task_column: "tasks.id",
            seq: None,
        }
    }

    fn decode_task(&self, row: &Row) -> Result<Task, StoreError> {
        let mut cx = self.cx(None);
        cx.task_id = cx.get(row, 0, "tasks.id")?;
        let state: TaskState = cx.name(row, 1, "tasks.state")?;
        let task: Task = cx.json(row, 2, "tasks.data")?;
        if task.id.as_str() != cx.task_id {
            return Err(cx.corrupt(
                "tasks.data",
                format!("the JSON is of task `{}`", task.id),
                None,
            ));
        }
        if task.state != state {
            return Err(cx.corrupt(
                "tasks.state",
                format!(
                    "the column says `{state}` but the JSON says `{}`",
                    task.state
                ),
                None,
            ));
        }
        Ok(task)
    }

    fn decode_journal(&self, rows: &[Row]) -> Result<Vec<JournalEntry>, StoreError> {
        rows.iter()
            .map(|row| {
                let mut cx = self.cx(None);
                cx.read_task(row, 1, "journal.task_id")?;
                let seq: u64 = cx.uint(row, 0, "journal.seq")?;
                cx.seq = Some(seq);
                Ok(JournalEntry {
                    seq,
                    task_id: cx.task()?,
                    task_seq: cx.uint(row, 2, "journal.task_seq")?,
                    at: cx.uint(row, 3, "journal.at")?,
                    event: cx.json(row, 4, "journal.event")?,
                    state_before: cx.name(row, 5, "journal.state_before")?,
                    state_after: cx.name(row, 6, "journal.state_after")?,
                    commands: cx.json(row, 7, "journal.commands")?,
                    task_after: cx.json(row, 8, "journal.task_after")?,
                })
            })
            .collect()
    }

    fn decode_marks(&self, row: &Row, first: usize) -> Result<TaskMarks, StoreError> {
        let cx = self.cx(None);
        Ok(TaskMarks {
            backend: cx.get(row, first, "tasks.backend")?,
            removed_at: cx.opt_uint(row, first + 1, "tasks.removed_at")?,
            kept_snapshots: cx
                .get::<Option<bool>>(row, first + 2, "tasks.kept_snapshots")?
                .unwrap_or(false),
        })
    }

    /// Binds one transition to SQL values (serializing its JSON here, on the caller's thread).
    fn bind(&self, rec: &TransitionRecord<'_>) -> Result<PgRecord, StoreError> {
        let task = rec.task_after;
        let id = task.id.as_str();
        let ser = |what, r: serde_json::Result<String>| {
            r.map_err(|source| StoreError::Serialize {
                task_id: id.to_string(),
                what,
                source,
            })
        };
        let int = |what: &'static str, v: u64| {
            i64::try_from(v).map_err(|_| StoreError::OutOfRange {
                task_id: id.to_string(),
                what,
                value: v,
            })
        };
        let opt = |what: &'static str, v: Option<u64>| v.map(|v| int(what, v)).transpose();
        let snaps = &task.snapshots;
        let sb = task.sandbox.as_ref();
        Ok(PgRecord {
            id: id.to_string(),
            state_before: rec.state_before.as_str(),
            state: task.state.as_str(),
            data: ser("task", serde_json::to_string(task))?,
            created_at: int("created_at", task.created_at)?,
            at: int("at", rec.at)?,
            event_name: rec.event.name().to_string(),
            event: ser("event", serde_json::to_string(rec.event))?,
            commands: ser("commands", serde_json::to_string(rec.commands))?,
            snap_seq: snaps
                .iter()
                .map(|s| int("snapshot seq", s.seq))
                .collect::<Result<_, _>>()?,
            snap_provider: snaps
                .iter()
                .map(|s| s.id.as_deref().map(str::to_string))
                .collect(),
            snap_status: snaps.iter().map(|s| s.status.as_str()).collect(),
            snap_size: snaps
                .iter()
                .map(|s| int("snapshot size", s.size_bytes))
                .collect::<Result<_, _>>()?,
            snap_sandbox: snaps.iter().map(|s| s.sandbox_id.to_string()).collect(),
            snap_started: snaps
                .iter()
                .map(|s| int("snapshot start", s.started_at))
                .collect::<Result<_, _>>()?,
            snap_created: snaps
                .iter()
                .map(|s| opt("snapshot creation", s.created_at))
                .collect::<Result<_, _>>()?,
            snap_expires: snaps
                .iter()
                .map(|s| opt("snapshot expiry", s.expires_at))
                .collect::<Result<_, _>>()?,
            sb_id: sb.map(|s| s.id.to_string()),
            sb_name: sb.map(|s| s.name.clone()),
            sb_generation: opt("sandbox generation", sb.map(|s| s.generation))?,
            sb_created: opt("sandbox creation", sb.map(|s| s.created_at))?,
            sb_deadline: opt("sandbox deadline", sb.map(|s| s.deadline))?,
            sb_source: sb.and_then(|s| s.source_snapshot.as_deref().map(str::to_string)),
        })
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

/// SQLSTATE classes that say "try again": connection exceptions (08), insufficient resources
/// (53), operator intervention (57: the server shutting down or restarting), serialization
/// failures and deadlocks (40).
fn is_transient(code: &tokio_postgres::error::SqlState) -> bool {
    let c = code.code();
    c.starts_with("08") || c.starts_with("53") || c.starts_with("57") || c.starts_with("40")
}

/// Applies the missing migrations, each in its own transaction under the migration lock.
// The store is the one module allowed to connect to PostgreSQL (clippy.toml).
#[allow(clippy::disallowed_methods)]
async fn migrate(config: &tokio_postgres::Config, redacted: &str) -> Result<(), Fail> {
    let (mut client, conn) = config.connect(NoTls).await?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let result = async {
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS taskbox_schema (
                     one     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
                     version BIGINT NOT NULL)",
            )
            .await
            .or_else(|e| {
                // Two servers creating it at once: the loser sees a unique violation on the
                // catalog; the table exists either way.
                if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
                    Ok(())
                } else {
                    Err(e)
                }
            })?;
        for (index, sql) in schema::MIGRATIONS.iter().enumerate() {
            let version = index as i64 + 1;
            let tx = client.transaction().await?;
            tx.execute(
                "SELECT pg_advisory_xact_lock($1)",
                &[&schema::MIGRATION_LOCK],
            )
            .await?;
            let current: i64 = tx
                .query_opt("SELECT version FROM taskbox_schema", &[])
                .await?
                .map_or(0, |r| r.get(0));
            if current > schema::supported_version() {
                return Err(Fail::Store(StoreError::TooNew {
                    path: redacted.into(),
                    found: current,
                    supported: schema::supported_version(),
                }));
            }
            if current >= version {
                continue;
            }
            tx.batch_execute(sql).await?;
            tx.execute(
                "INSERT INTO taskbox_schema (one, version) VALUES (TRUE, $1)
                 ON CONFLICT (one) DO UPDATE SET version = excluded.version",
                &[&version],
            )
            .await?;
            tx.commit().await?;
        }
        Ok(())
    }
    .await;
    drop(client);
    let _ = driver.await;
    result
}

impl Backend for PgStore {
    fn installation_id(&self) -> &str {
        &self.installation_id
    }

    fn load_task(&self, id: &str) -> Result<Option<Task>, StoreError> {
        let rows = self.query(
            "loading a task",
            Some(id),
            "SELECT id, state, data FROM tasks WHERE id = $1".to_string(),
            vec![Box::new(id.to_string())],
        )?;
        rows.first().map(|r| self.decode_task(r)).transpose()
    }

    fn load_tasks(&self) -> Result<Vec<Task>, StoreError> {
        let rows = self.query(
            "loading tasks",
            None,
            "SELECT id, state, data FROM tasks ORDER BY id".to_string(),
            Vec::new(),
        )?;
        rows.iter().map(|r| self.decode_task(r)).collect()
    }

    fn task_ids(&self) -> Result<Vec<TaskId>, StoreError> {
        let rows = self.query(
            "listing task ids",
            None,
            "SELECT id FROM tasks ORDER BY id".to_string(),
            Vec::new(),
        )?;
        rows.iter()
            .map(|r| {
                let mut cx = self.cx(None);
                cx.read_task(r, 0, "tasks.id")?;
                cx.task()
            })
            .collect()
    }

    fn task_marks(&self, id: &str) -> Result<Option<TaskMarks>, StoreError> {
        let rows = self.query(
            "reading a task's backend",
            Some(id),
            "SELECT backend, removed_at, kept_snapshots FROM tasks WHERE id = $1".to_string(),
            vec![Box::new(id.to_string())],
        )?;
        rows.first().map(|r| self.decode_marks(r, 0)).transpose()
    }

    fn snapshot_holders(&self, provider_id: &str) -> Result<Vec<String>, StoreError> {
        let rows = self.query(
            "finding the tasks that retain a snapshot",
            None,
            "SELECT DISTINCT s.task_id FROM snapshots s JOIN tasks t ON t.id = s.task_id
             WHERE s.provider_id = $1 AND s.status IN ('complete', 'pending')
               AND (t.removed_at IS NULL OR t.kept_snapshots)
             ORDER BY s.task_id"
                .to_string(),
            vec![Box::new(provider_id.to_string())],
        )?;
        rows.iter()
            .map(|r| self.cx(None).get(r, 0, "snapshots.task_id"))
            .collect()
    }

    fn removed_tasks(&self) -> Result<Vec<(TaskId, TaskMarks)>, StoreError> {
        let rows = self.query(
            "listing removed tasks",
            None,
            "SELECT id, backend, removed_at, kept_snapshots FROM tasks
             WHERE removed_at IS NOT NULL ORDER BY id"
                .to_string(),
            Vec::new(),
        )?;
        rows.iter()
            .map(|r| {
                let mut cx = self.cx(None);
                cx.read_task(r, 0, "tasks.id")?;
                Ok((cx.task()?, self.decode_marks(r, 1)?))
            })
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

    fn mark_removed(
        &mut self,
        id: &str,
        at: Millis,
        kept_snapshots: bool,
    ) -> Result<(), StoreError> {
        let at = i64::try_from(at).map_err(|_| StoreError::OutOfRange {
            task_id: id.to_string(),
            what: "removal time",
            value: at,
        })?;
        self.query(
            "marking a task removed",
            Some(id),
            "UPDATE tasks SET removed_at = $2, kept_snapshots = $3 WHERE id = $1".to_string(),
            vec![
                Box::new(id.to_string()),
                Box::new(at),
                Box::new(kept_snapshots),
            ],
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
        if recs.is_empty() {
            return Ok(Vec::new());
        }
        let bound = recs
            .iter()
            .map(|r| self.bind(r))
            .collect::<Result<Vec<_>, _>>()?;
        let first_task = recs[0].task_after.id.as_str().to_string();
        let states: Vec<TaskState> = recs.iter().map(|r| r.state_before).collect();
        let tokens: Vec<Option<i64>> = {
            let fences = self.fences.lock().unwrap_or_else(|p| p.into_inner());
            bound.iter().map(|r| fences.get(&r.id).copied()).collect()
        };
        self.call(
            "committing a transition",
            Some(&first_task),
            move |s| async move {
                // One record: its one statement is a transaction of its own (one round trip).
                // `CommitSync::WithNext`: the transaction's commit does not wait for the WAL flush;
                // the next flushed commit flushes it (PostgreSQL's WAL is written in order).
                let single = bound.len() == 1 && sync == CommitSync::Now;
                if !single {
                    s.client.batch_execute("BEGIN").await?;
                    if sync == CommitSync::WithNext {
                        s.client
                            .batch_execute("SET LOCAL synchronous_commit TO OFF")
                            .await?;
                    }
                }
                let mut seqs = Vec::with_capacity(bound.len());
                for ((rec, expected), token) in bound.iter().zip(states).zip(tokens) {
                    let answer = match &token {
                        Some(t) => {
                            s.client
                                .query_one(&s.commit_fenced, &rec.params_fenced(t))
                                .await
                        }
                        None => s.client.query_one(&s.commit, &rec.params()).await,
                    };
                    match answer {
                        Ok(row) => seqs.push(row.get::<_, i64>(0) as u64),
                        Err(e) => {
                            // Best effort: a broken connection rolls back by itself.
                            if !single {
                                let _ = s.client.batch_execute("ROLLBACK").await;
                            }
                            return Err(refused(&rec.id, expected, e));
                        }
                    }
                }
                if !single {
                    s.client.batch_execute("COMMIT").await?;
                }
                Ok(seqs)
            },
        )
    }

    fn journal(&self, task_id: &str) -> Result<Vec<JournalEntry>, StoreError> {
        let rows = self.query(
            "reading the journal",
            Some(task_id),
            format!("SELECT {JOURNAL_COLUMNS} FROM journal WHERE task_id = $1 ORDER BY task_seq"),
            vec![Box::new(task_id.to_string())],
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
        let rows = self.query(
            "checking integrity",
            None,
            "SELECT (SELECT version FROM taskbox_schema),
                    (SELECT count(*) FROM pg_trigger
                     WHERE tgrelid = 'journal'::regclass AND NOT tgisinternal
                       AND tgname IN ('journal_no_update', 'journal_no_truncate')),
                    (SELECT count(*) FROM tasks t
                     WHERE NOT EXISTS (SELECT 1 FROM journal j WHERE j.task_id = t.id))"
                .to_string(),
            Vec::new(),
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
        rows.iter()
            .map(|row| {
                let mut cx = self.cx(None);
                cx.read_task(row, 2, "sandboxes.task_id")?;
                let status: String = cx.get(row, 7, "sandboxes.status")?;
                let status = match status.as_str() {
                    "running" => SandboxStatus::Running,
                    "released" => SandboxStatus::Released,
                    other => {
                        return Err(cx.corrupt(
                            "sandboxes.status",
                            format!("unknown status `{other}`"),
                            None,
                        ))
                    }
                };
                Ok(SandboxRow {
                    provider_id: cx.get::<String>(row, 0, "sandboxes.provider_id")?.into(),
                    name: cx.get(row, 1, "sandboxes.name")?,
                    task_id: cx.task()?,
                    generation: cx.uint(row, 3, "sandboxes.generation")?,
                    created_at: cx.uint(row, 4, "sandboxes.created_at")?,
                    deadline: cx.uint(row, 5, "sandboxes.deadline")?,
                    source_snapshot: cx
                        .get::<Option<String>>(row, 6, "sandboxes.source_snapshot")?
                        .map(Into::into),
                    status,
                    released_at: cx.opt_uint(row, 8, "sandboxes.released_at")?,
                })
            })
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
        rows.iter()
            .map(|row| {
                let mut cx = self.cx(None);
                cx.read_task(row, 0, "snapshots.task_id")?;
                let seq = cx.uint(row, 1, "snapshots.seq")?;
                cx.seq = Some(seq);
                Ok(SnapshotRow {
                    task_id: cx.task()?,
                    seq,
                    provider_id: cx
                        .get::<Option<String>>(row, 2, "snapshots.provider_id")?
                        .map(Into::into),
                    status: cx.name(row, 3, "snapshots.status")?,
                    size_bytes: cx.uint(row, 4, "snapshots.size_bytes")?,
                    sandbox_id: cx.get::<String>(row, 5, "snapshots.sandbox_id")?.into(),
                    started_at: cx.uint(row, 6, "snapshots.started_at")?,
                    created_at: cx.opt_uint(row, 7, "snapshots.created_at")?,
                    expires_at: cx.opt_uint(row, 8, "snapshots.expires_at")?,
                })
            })
            .collect()
    }
}

/// Turns the commit function's refusals into the store's errors.
fn refused(task_id: &str, expected: TaskState, e: tokio_postgres::Error) -> Fail {
    match e.as_db_error().map(|db| (db.code().code(), db.message())) {
        Some(("TB001", stored)) => Fail::Store(StoreError::StateConflict {
            task_id: task_id.to_string(),
            expected,
            stored: stored.to_string(),
        }),
        Some(("TB003", owner)) => Fail::Store(StoreError::LeaseLost {
            task_id: task_id.to_string(),
            owner: Some(owner.to_string()).filter(|o| !o.is_empty()),
        }),
        Some(("TB002", owner)) => Fail::Store(StoreError::SandboxOwned {
            task_id: task_id.to_string(),
            sandbox_id: e
                .as_db_error()
                .and_then(|db| db.detail())
                .unwrap_or_default()
                .to_string()
                .into(),
            owner: owner.to_string(),
        }),
        _ => Fail::Pg(e),
    }
}

/// Where a decoded value comes from, for [`StoreError::Corrupt`].
struct RowContext<'a> {
    target: &'a str,
    /// The row's task id as stored (validated by [`RowContext::task`]).
    task_id: String,
    /// The column it was read from.
    task_column: &'static str,
    seq: Option<u64>,
}

impl RowContext<'_> {
    fn corrupt(
        &self,
        column: &'static str,
        reason: String,
        source: Option<serde_json::Error>,
    ) -> StoreError {
        StoreError::Corrupt {
            path: self.target.into(),
            task_id: self.task_id.clone(),
            column,
            seq: self.seq,
            reason,
            source,
        }
    }

    fn get<'r, T: tokio_postgres::types::FromSql<'r>>(
        &self,
        row: &'r Row,
        index: usize,
        column: &'static str,
    ) -> Result<T, StoreError> {
        row.try_get(index)
            .map_err(|e| self.corrupt(column, e.to_string(), None))
    }

    /// Reads the row's task id from `column` (at `index`), to name it in later errors.
    fn read_task(
        &mut self,
        row: &Row,
        index: usize,
        column: &'static str,
    ) -> Result<(), StoreError> {
        self.task_column = column;
        self.task_id = self.get(row, index, column)?;
        Ok(())
    }

    /// The row's task id, validated (an id that is not one is corrupt: ids become paths).
    fn task(&self) -> Result<TaskId, StoreError> {
        TaskId::new(&self.task_id).map_err(|e| self.corrupt(self.task_column, e.to_string(), None))
    }

    /// A BIGINT that must not be negative.
    fn uint(&self, row: &Row, index: usize, column: &'static str) -> Result<u64, StoreError> {
        let v: i64 = self.get(row, index, column)?;
        u64::try_from(v).map_err(|_| self.corrupt(column, format!("negative value {v}"), None))
    }

    fn opt_uint(
        &self,
        row: &Row,
        index: usize,
        column: &'static str,
    ) -> Result<Option<u64>, StoreError> {
        let v: Option<i64> = self.get(row, index, column)?;
        v.map(|v| {
            u64::try_from(v).map_err(|_| self.corrupt(column, format!("negative value {v}"), None))
        })
        .transpose()
    }

    fn json<T: DeserializeOwned>(
        &self,
        row: &Row,
        index: usize,
        column: &'static str,
    ) -> Result<T, StoreError> {
        let text: &str = self.get(row, index, column)?;
        serde_json::from_str(text)
            .map_err(|e| self.corrupt(column, "invalid JSON for its type".to_string(), Some(e)))
    }

    fn name<T: DeserializeOwned>(
        &self,
        row: &Row,
        index: usize,
        column: &'static str,
    ) -> Result<T, StoreError> {
        let text: String = self.get(row, index, column)?;
        serde_json::from_value(serde_json::Value::String(text.clone()))
            .map_err(|_| self.corrupt(column, format!("unknown name `{text}`"), None))
    }
}
