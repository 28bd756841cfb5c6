//! The store's error type: every variant names the store file, and where one is involved the
//! task and the operation, so that `taskbox doctor` and the CLI can say what to do about it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::core::TaskState;

/// How long a statement waits for another process's write lock before giving up.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The directory that should hold the store file could not be created.
    #[error("cannot create the directory {} for the store", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// [`Store::open_existing`](super::Store::open_existing) found no store file.
    #[error("no taskbox store at {}", path.display())]
    Missing {
        /// The store file that does not exist.
        path: PathBuf,
    },

    /// SQLite could not open (or set up) the file.
    #[error("cannot open the store {}", path.display())]
    Open {
        /// The store file.
        path: PathBuf,
        /// What SQLite said.
        #[source]
        source: Box<rusqlite::Error>,
    },

    /// The file exists but is not an SQLite database.
    #[error(
        "{} is not a taskbox store (the file is not an SQLite database); \
         move it aside or point the data directory elsewhere",
        path.display()
    )]
    NotADatabase {
        /// The file.
        path: PathBuf,
    },

    /// SQLite would not put the file in write-ahead-log mode (e.g. a network filesystem).
    #[error(
        "the store {} cannot use write-ahead logging (its journal mode stayed `{mode}`); \
         put the data directory on a local filesystem",
        path.display()
    )]
    WalUnavailable {
        /// The store file.
        path: PathBuf,
        /// The journal mode SQLite kept.
        mode: String,
    },

    /// The file's schema is newer than this build understands.
    #[error(
        "the store {} was written by a newer taskbox (schema version {found}, this build knows \
         up to {supported}); upgrade taskbox instead of downgrading it",
        path.display()
    )]
    TooNew {
        /// The store file.
        path: PathBuf,
        /// The schema version found in the file.
        found: i64,
        /// The newest schema version this build knows.
        supported: i64,
    },

    /// Applying a schema migration failed; the file stays at the previous version.
    #[error("migrating the store {} to schema version {version} failed", path.display())]
    Migrate {
        /// The store file.
        path: PathBuf,
        /// The version being migrated to.
        version: i64,
        /// What SQLite said.
        #[source]
        source: Box<rusqlite::Error>,
    },

    /// Migration 5 stops storing a task in its row (the journal holds it) and found a task row
    /// whose task is not the one its journal rebuilds: the row was edited, or the journal
    /// damaged. Nothing was changed.
    #[error(
        "migrating the store {} to schema version 5 refused: the row of task `{task_id}` holds \
         another task than its journal's last row ({reason}); the migration keeps only the \
         journal's, so it changed nothing. Make them agree (or remove the task) with the taskbox \
         that wrote this store, or restore the file from a backup",
        path.display()
    )]
    TaskRowDisagrees {
        /// The store file.
        path: PathBuf,
        /// The task.
        task_id: String,
        /// How they differ, or why the journal could not be read.
        reason: String,
    },

    /// The installation id could not be generated.
    #[error("cannot read random bytes from /dev/urandom for the installation id")]
    Random {
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// Another process held the write lock for longer than the busy timeout.
    #[error(
        "{operation}{}: the store {} stayed locked by another process for more than {}s; \
         is another taskbox writing to this data directory?",
        for_task(task_id), path.display(), BUSY_TIMEOUT.as_secs()
    )]
    Busy {
        /// The store file.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// The task concerned, if any.
        task_id: Option<String>,
        /// What SQLite said.
        #[source]
        source: Box<rusqlite::Error>,
    },

    /// An SQL statement failed.
    #[error("{operation}{} failed in the store {}", for_task(task_id), path.display())]
    Sql {
        /// The store file.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// The task concerned, if any.
        task_id: Option<String>,
        /// What SQLite said.
        #[source]
        source: Box<rusqlite::Error>,
    },

    /// The disk holding the store is full: SQLite could not write (SQLITE_FULL). Nothing
    /// committed before is lost; the write that failed did not happen.
    #[error(
        "{operation}{}: no space left on device for the store {} ({detail})",
        for_task(task_id), path.display()
    )]
    Full {
        /// The store file.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// The task concerned, if any.
        task_id: Option<String>,
        /// What SQLite said.
        detail: String,
    },

    /// A stored value could not be decoded (bad JSON, an unknown state name, a wrong type).
    #[error(
        "the store {} holds corrupt data for task `{task_id}` in {column}{}: {reason}",
        path.display(), at_seq(seq)
    )]
    Corrupt {
        /// The store file.
        path: PathBuf,
        /// The task whose row it is.
        task_id: String,
        /// Where: `table.column`.
        column: &'static str,
        /// The journal or snapshot sequence number of the row, where there is one.
        seq: Option<u64>,
        /// What is wrong.
        reason: String,
        /// The JSON error, when it is one.
        #[source]
        source: Option<serde_json::Error>,
    },

    /// A value to be stored could not be serialized to JSON.
    #[error("cannot serialize the {what} of task `{task_id}` to JSON")]
    Serialize {
        /// The task.
        task_id: String,
        /// `event`, `commands` or `task`.
        what: &'static str,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },

    /// The stored state of the task is not the state the transition started from: another
    /// writer changed the task in between, and committing would lose its update.
    #[error(
        "task `{task_id}`: the transition started from state `{expected}` but the store holds \
         `{stored}`; another writer changed the task (is a second taskbox running?)"
    )]
    StateConflict {
        /// The task.
        task_id: String,
        /// The transition's `state_before`.
        expected: TaskState,
        /// The state in the store.
        stored: String,
    },

    /// A transition's sandbox is already recorded for a different task. Two tasks sharing one
    /// sandbox would see each other's files, so the transition is refused.
    #[error("task `{task_id}`: sandbox `{sandbox_id}` already belongs to task `{owner}`")]
    SandboxOwned {
        /// The task committing.
        task_id: String,
        /// The sandbox.
        sandbox_id: crate::ids::SandboxId,
        /// The task it is recorded for.
        owner: String,
    },

    /// A PostgreSQL store's connection or statement failed.
    #[error("{operation}{} failed in the store {target}", for_task(task_id))]
    Postgres {
        /// The store's URL, password redacted.
        target: String,
        /// What was being done.
        operation: &'static str,
        /// The task concerned, if any.
        task_id: Option<String>,
        /// Whether trying again later may succeed (a lost connection, a server restarting).
        retryable: bool,
        /// What the client or the server said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// Another server took the task's lease over: this one may no longer write it (its commit
    /// carried a stale fencing token and was refused; nothing of it was written).
    #[error(
        "task `{task_id}` moved to another server{}: this server's lease on it lapsed or was \
         taken over, so this server stopped driving it (nothing more of it is written here)",
        owner.as_deref().filter(|o| !o.is_empty()).map(|o| format!(" (`{o}`)")).unwrap_or_default()
    )]
    LeaseLost {
        /// The task.
        task_id: String,
        /// The server that holds the lease now, if any does.
        owner: Option<String>,
    },

    /// Another live server holds the task's lease.
    #[error(
        "task `{task_id}` is driven by another server (`{owner}`, its lease runs for \
         {expires_in_ms} ms more); send the request to that server"
    )]
    LeaseHeld {
        /// The task.
        task_id: String,
        /// The server that holds it.
        owner: String,
        /// How long its lease runs unless renewed.
        expires_in_ms: u64,
    },

    /// The configured store is not one this build can open.
    #[error("invalid store `{target}`: {reason}")]
    BadTarget {
        /// The store as given, any password redacted.
        target: String,
        /// What is wrong, and how to write it.
        reason: String,
    },

    /// A number to be stored does not fit the database's 63-bit integers.
    #[error("task `{task_id}`: the {what} {value} is too large to store")]
    OutOfRange {
        /// The task.
        task_id: String,
        /// Which value.
        what: &'static str,
        /// The value.
        value: u64,
    },

    /// `PRAGMA integrity_check` or `PRAGMA foreign_key_check` found problems.
    #[error(
        "the store {} failed its integrity check: {report}; restore it from a backup or move it \
         aside to start afresh",
        path.display()
    )]
    Integrity {
        /// The store file.
        path: PathBuf,
        /// What SQLite reported, one problem per line.
        report: String,
    },
}

impl StoreError {
    /// Wraps an SQLite error from `operation`, recognising a lock held too long.
    pub(crate) fn sql(
        path: &Path,
        operation: &'static str,
        task_id: Option<&str>,
        source: rusqlite::Error,
    ) -> StoreError {
        let path = path.to_path_buf();
        let task_id = task_id.map(str::to_string);
        match source.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                StoreError::Busy {
                    path,
                    operation,
                    task_id,
                    source: Box::new(source),
                }
            }
            Some(rusqlite::ErrorCode::DiskFull) => StoreError::Full {
                path,
                operation,
                task_id,
                detail: source.to_string(),
            },
            _ => StoreError::Sql {
                path,
                operation,
                task_id,
                source: Box::new(source),
            },
        }
    }
}

impl StoreError {
    /// What the user can do about it, where there is something to do.
    pub fn hint(&self) -> Option<String> {
        match self {
            StoreError::Full { path, .. } => {
                let dir = path.parent().unwrap_or(path);
                Some(format!(
                    "free space on the filesystem holding {} (`df -h {}`), then run the command \
                     again: nothing journaled is lost, and the task recovers from its journal",
                    dir.display(),
                    dir.display()
                ))
            }
            StoreError::Postgres {
                retryable: true, ..
            } => Some(
                "the PostgreSQL server did not answer or is restarting; run the command again \
                 once it is back: nothing committed is lost, and a task whose commit was cut \
                 off recovers from its journal"
                    .to_string(),
            ),
            StoreError::LeaseLost { owner, .. } => Some(format!(
                "send the request again{}: the server that holds the task now (or any server, \
                 once its lease expires) recovers it from the journal; nothing committed is lost",
                owner
                    .as_deref()
                    .filter(|o| !o.is_empty())
                    .map(|o| format!(" to `{o}`"))
                    .unwrap_or_default()
            )),
            StoreError::LeaseHeld { owner, .. } => Some(format!(
                "send the request to the server `{owner}` (`taskbox --server`, or through the \
                 load balancer); if that server is gone, any server takes the task over once \
                 its lease expires, so sending it again then succeeds"
            )),
            _ => None,
        }
    }

    /// Whether trying the same operation again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Busy { .. }
                | StoreError::LeaseLost { .. }
                | StoreError::LeaseHeld { .. }
                | StoreError::Postgres {
                    retryable: true,
                    ..
                }
        )
    }

    /// The same error for another caller waiting on the same failed write: a disk-full error
    /// and a lost lease are repeated as they are, any other as its message.
    pub fn for_another_caller(&self) -> Option<StoreError> {
        match self {
            StoreError::Full {
                path,
                operation,
                task_id,
                detail,
            } => Some(StoreError::Full {
                path: path.clone(),
                operation,
                task_id: task_id.clone(),
                detail: detail.clone(),
            }),
            StoreError::LeaseLost { task_id, owner } => Some(StoreError::LeaseLost {
                task_id: task_id.clone(),
                owner: owner.clone(),
            }),
            _ => None,
        }
    }
}

fn for_task(task_id: &Option<String>) -> String {
    match task_id {
        Some(id) => format!(" for task `{id}`"),
        None => String::new(),
    }
}

fn at_seq(seq: &Option<u64>) -> String {
    match seq {
        Some(seq) => format!(" (seq {seq})"),
        None => String::new(),
    }
}
