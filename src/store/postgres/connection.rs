//! The connection: the store's own runtime, the blocking bridge to it, (re)connecting, error
//! classification and the migrations run when a store opens.

use std::future::Future;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row, Statement};

use super::schema;
use super::PgStore;
use crate::store::StoreError;

/// How long connecting may take when the URL does not say (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The commit statement: one call of the schema's `taskbox_commit` function.
const COMMIT_SQL: &str = "SELECT taskbox_commit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, \
                          $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)";

/// The fenced commit: `taskbox_commit_fenced`, the lease's token first.
const COMMIT_FENCED_SQL: &str = "SELECT taskbox_commit_fenced($24, $1, $2, $3, $4, $5, $6, $7, \
                                 $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, \
                                 $20, $21, $22, $23)";

/// One connection and the statements prepared on it.
pub(super) struct Session {
    pub(super) client: Client,
    pub(super) commit: Statement,
    pub(super) commit_fenced: Statement,
}

/// Why a call failed on the connection's side.
pub(super) enum Fail {
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

impl PgStore {
    pub(super) fn config(&self) -> tokio_postgres::Config {
        let mut config = self.target.config.clone();
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config
    }

    /// Runs `fut` on the store's runtime and waits for it (`None`: the runtime is gone).
    pub(super) fn block<T: Send + 'static>(
        &self,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        let rt = self.rt.as_ref()?;
        let (tx, rx) = mpsc::sync_channel(1);
        rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().ok()
    }

    pub(super) fn error(
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

    pub(super) fn gone(&self, operation: &'static str, task_id: Option<&str>) -> StoreError {
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
    pub(super) fn session(
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
    pub(super) fn call<T, F, Fut>(
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
    pub(super) fn query(
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

    /// Runs one query about the task `task_id`, its only parameter (`$1`).
    pub(super) fn query_task(
        &self,
        operation: &'static str,
        task_id: &str,
        sql: &str,
    ) -> Result<Vec<Row>, StoreError> {
        let param: Box<dyn ToSql + Sync + Send> = Box::new(task_id.to_string());
        self.query(operation, Some(task_id), sql.to_string(), vec![param])
    }

    /// Runs one query without parameters, about no one task.
    pub(super) fn query_all(
        &self,
        operation: &'static str,
        sql: &str,
    ) -> Result<Vec<Row>, StoreError> {
        self.query(operation, None, sql.to_string(), Vec::new())
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
pub(super) async fn migrate(config: &tokio_postgres::Config, redacted: &str) -> Result<(), Fail> {
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
