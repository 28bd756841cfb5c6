//! The store: tasks, their journal, and the snapshot and sandbox rows derived from them. The
//! only module that contains SQL.
//!
//! [`Backend`] is what the engine, replay, chaos and the CLI need of a store; it has two
//! implementations, and [`Store`] is the one type they hold, either of them:
//!
//! - [`SqliteStore`] (`sqlite/`, its schema in `sqlite/schema.rs`): one SQLite file per data
//!   directory, the default;
//! - `PgStore` (`postgres/`, cargo feature `postgres`): a PostgreSQL database that many servers
//!   share (`terminal.store = "postgres://…"`).
//!
//! Both keep the same contract: a commit is one transaction that is durable when it returns
//! (the engine's write-ahead step), the journal is append-only (the database refuses UPDATE and
//! DELETE on it), the schema moves forward by append-only, versioned migrations applied on open,
//! and a transition whose `state_before` is not the stored state is refused
//! ([`StoreError::StateConflict`]). [`Store`] is an enum of the two, and derefs to
//! `dyn Backend`: each method is written once in the trait and once per store, and a call
//! through [`Store`] costs one dynamic dispatch, nil beside the disk sync or round trip it
//! waits for.
//!
//! # Two write models, on purpose
//!
//! The SQLite store writes only the journal (and a new task's row, and a fork's share); the
//! sandbox and snapshot rows and a snapshot's holders are derived from the journal when asked
//! (`sqlite/derived.rs`). A file has one writer, the commit's cost is what it writes, and the
//! readers (`show`, `gc`, a delete's holder check) are rare and local: repeating the tasks'
//! records in tables cost the group-commit benchmark most of what separated it from a raw
//! insert loop. The PostgreSQL store materialises `snapshots` and `sandboxes` in its commit
//! function (`taskbox_commit`, one round trip either way): a fleet's servers ask about tasks
//! that other servers hold, over the network, where deriving would ship whole journals per
//! question, and an indexed join answers it. The answers are the same: the store tests run on
//! both stores and hold their rows and holders to one model computed from the tasks'
//! histories (`tests/it/store/model.rs`).

mod error;
// The data dir's disk reserve: a preallocated file the SQLite store gives back when the disk fills.
#[cfg(feature = "postgres")]
mod postgres;
pub mod reserve;
mod rows;
mod sqlite;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::core::{Command, Event, Millis, SnapshotStatus, Task, TaskState};
use crate::ids::{SandboxId, SnapshotId, TaskId};

pub use error::StoreError;
#[cfg(feature = "postgres")]
pub use postgres::{Fences, JournalWriter, Lease, LeaseRow, PgStore, PgTarget};
pub use sqlite::SqliteStore;

/// One transition to commit: the event that caused it, the task before (its state) and after,
/// and the commands to perform once it is durable.
#[derive(Clone, Copy, Debug)]
pub struct TransitionRecord<'a> {
    /// When the transition happened (the `now` given to `step`).
    pub at: Millis,
    /// The event that was applied.
    pub event: &'a Event,
    /// The task's state before the event; must match the stored state.
    pub state_before: TaskState,
    /// The whole task after the event.
    pub task_after: &'a Task,
    /// The commands the transition emitted.
    pub commands: &'a [Command],
}

/// When a commit reaches the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sync {
    /// Synced before the commit returns (`synchronous = FULL`): it survives a power loss. What
    /// the engine's write-ahead needs before it performs a provider call.
    Now,
    /// Written to the WAL before the commit returns — every reader sees it and it survives a
    /// crash of any process — but synced by the next [`Sync::Now`] commit (or checkpoint) of the
    /// file, not before (`synchronous = NORMAL` for this transaction; on PostgreSQL,
    /// `synchronous_commit = off` for it). The WAL is appended in order, so a power loss can
    /// lose it (and whatever else is not synced yet) but never a later, synced commit without it.
    WithNext,
}

/// One row of the journal, decoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// Global, strictly increasing commit order across all tasks.
    pub seq: u64,
    /// The task.
    pub task_id: TaskId,
    /// 1, 2, 3… within the task.
    pub task_seq: u64,
    /// When the transition happened.
    pub at: Millis,
    /// The event applied.
    pub event: Event,
    /// State before.
    pub state_before: TaskState,
    /// State after.
    pub state_after: TaskState,
    /// Commands emitted.
    pub commands: Vec<Command>,
    /// The whole task after the transition.
    pub task_after: Task,
}

/// Whether a task still holds a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxStatus {
    /// It is the task's `sandbox`.
    Running,
    /// A later transition's task no longer held it (stopped, expired, or replaced).
    Released,
}

impl SandboxStatus {
    /// The name as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxStatus::Running => "running",
            SandboxStatus::Released => "released",
        }
    }
}

/// What the store records about a task besides the core's record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskMarks {
    /// The backend that holds its sandboxes and snapshots (`None`: not recorded yet).
    pub backend: Option<String>,
    /// When `taskbox rm` removed it.
    pub removed_at: Option<Millis>,
    /// Whether `taskbox rm --keep-snapshots` kept its snapshots.
    pub kept_snapshots: bool,
}

/// A sandbox a task held: a row of PostgreSQL's `sandboxes` table; on SQLite, derived from the
/// task's journal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRow {
    /// The provider's handle.
    pub provider_id: SandboxId,
    /// The sandbox's stable name.
    pub name: String,
    /// The task it belongs to.
    pub task_id: TaskId,
    /// Which creation of the task's sandbox it is.
    pub generation: u64,
    /// When it became ready.
    pub created_at: Millis,
    /// Its platform deadline as last recorded.
    pub deadline: Millis,
    /// The snapshot it was restored from.
    pub source_snapshot: Option<SnapshotId>,
    /// Whether the task still holds it.
    pub status: SandboxStatus,
    /// When the first transition without it was committed.
    pub released_at: Option<Millis>,
}

/// A snapshot record of a task: a row of PostgreSQL's `snapshots` table; on SQLite, read from
/// the task's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRow {
    /// The task.
    pub task_id: TaskId,
    /// Per-task snapshot sequence number.
    pub seq: u64,
    /// The provider's snapshot id, once known.
    pub provider_id: Option<SnapshotId>,
    /// Where it stands.
    pub status: SnapshotStatus,
    /// Size reported by the provider.
    pub size_bytes: u64,
    /// The sandbox it was taken of.
    pub sandbox_id: SandboxId,
    /// When the attempt started.
    pub started_at: Millis,
    /// When the provider confirmed it.
    pub created_at: Option<Millis>,
    /// When the provider will expire it.
    pub expires_at: Option<Millis>,
}

impl SnapshotRow {
    /// The row of the task `task_id`'s snapshot record `rec`. It leaves out what the provider
    /// could not keep (`omitted`), who took it (`taken_by`) and what made it (`kind`: `show`
    /// reads it from the task's record); every field is named, so a new
    /// one does not compile until it is sorted into the row or out of it.
    pub fn of_record(task_id: &TaskId, rec: &crate::core::SnapshotRecord) -> SnapshotRow {
        let crate::core::SnapshotRecord {
            seq,
            id,
            status,
            size_bytes,
            sandbox_id,
            started_at,
            created_at,
            expires_at,
            omitted: _,
            taken_by: _,
            kind: _,
        } = rec;
        SnapshotRow {
            task_id: task_id.clone(),
            seq: *seq,
            provider_id: id.clone(),
            status: *status,
            size_bytes: *size_bytes,
            sandbox_id: sandbox_id.clone(),
            started_at: *started_at,
            created_at: *created_at,
            expires_at: *expires_at,
        }
    }
}

/// What the engine, replay, chaos and the CLI need of a store. Every write is one transaction,
/// durable when it returns `Ok`; nothing is written when it returns an error.
pub trait Backend {
    /// The installation's random id, created with the store and never changed.
    fn installation_id(&self) -> &str;

    /// The task with this id, if it was ever committed.
    fn load_task(&self, id: &str) -> Result<Option<Task>, StoreError>;

    /// Every task, ordered by id.
    fn load_tasks(&self) -> Result<Vec<Task>, StoreError>;

    /// The ids of every task, ordered.
    fn task_ids(&self) -> Result<Vec<TaskId>, StoreError>;

    /// What the store knows of a task beyond the core's record (`None`: no such task).
    fn task_marks(&self, id: &str) -> Result<Option<TaskMarks>, StoreError>;

    /// The tasks other than `asking` that retain the provider snapshot `provider_id` (a record
    /// of it `complete` or `pending`), ordered by id: a fork shares its parent's snapshot, and a
    /// snapshot is deleted only when no task retains it. A removed task retains its snapshots
    /// only when `taskbox rm --keep-snapshots` kept them.
    ///
    /// `asking` is a task that holds a record of the snapshot (it took it, or was forked from
    /// it): only a fork gives a task a record of another's snapshot, so the SQLite store looks
    /// for the others among the forks that share it and the tasks they were forked from
    /// (`fork_shares`), not through every task's records.
    fn snapshot_holders(&self, provider_id: &str, asking: &str) -> Result<Vec<String>, StoreError>;

    /// The marks of every removed task, by id.
    fn removed_tasks(&self) -> Result<Vec<(TaskId, TaskMarks)>, StoreError>;

    /// Records `backend` as the task's, unless one is recorded already; returns the recorded
    /// one (`None`: no such task).
    fn claim_backend(&mut self, id: &str, backend: &str) -> Result<Option<String>, StoreError>;

    /// Marks the task removed at `at` (`taskbox rm`), its snapshots kept when `kept`; its
    /// record and journal stay.
    fn mark_removed(&mut self, id: &str, at: Millis, kept: bool) -> Result<(), StoreError>;

    /// Commits one transition in one transaction: a journal row, and the task row (SQLite: only
    /// for a task new to the store; PostgreSQL: always, with the snapshot and sandbox rows).
    /// Returns the journal `seq`.
    fn commit(&mut self, rec: &TransitionRecord<'_>) -> Result<u64, StoreError> {
        let seqs = self.commit_batch(std::slice::from_ref(rec))?;
        Ok(seqs
            .into_iter()
            .next()
            .expect("commit_batch returns one seq per record"))
    }

    /// Group commit: the transitions, in order (several may be of one task), in ONE
    /// transaction. Returns their journal `seq`s in the same order. All or nothing.
    fn commit_batch(&mut self, recs: &[TransitionRecord<'_>]) -> Result<Vec<u64>, StoreError>;

    /// [`Backend::commit_batch`], reaching the disk as `sync` says.
    fn commit_batch_with(
        &mut self,
        recs: &[TransitionRecord<'_>],
        sync: Sync,
    ) -> Result<Vec<u64>, StoreError>;

    /// The task's whole journal, oldest first.
    fn journal(&self, task_id: &str) -> Result<Vec<JournalEntry>, StoreError>;

    /// The task's last `limit` journal entries, oldest first.
    fn journal_tail(&self, task_id: &str, limit: usize) -> Result<Vec<JournalEntry>, StoreError>;

    /// Checks the store's own consistency (for `taskbox doctor`).
    fn integrity_check(&self) -> Result<(), StoreError>;

    /// Sandbox rows, of one task or of all, ordered by task, generation and id.
    fn sandboxes(&self, task_id: Option<&str>) -> Result<Vec<SandboxRow>, StoreError>;

    /// Snapshot rows, of one task or of all, ordered by task and seq.
    fn snapshots(&self, task_id: Option<&str>) -> Result<Vec<SnapshotRow>, StoreError>;
}

/// The JSON text of `value`, the `what` (`task`, `event` or `commands`) of the task `task_id`
/// that a transition stores ([`StoreError::Serialize`] if it cannot be written). (The SQLite
/// store serializes into buffers it reuses instead.)
#[cfg(feature = "postgres")]
pub(crate) fn to_json<T: Serialize + ?Sized>(
    task_id: &str,
    what: &'static str,
    value: &T,
) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|source| StoreError::Serialize {
        task_id: task_id.to_string(),
        what,
        source,
    })
}

/// 128 random bits as 32 hex digits (an installation id), from `/dev/urandom`.
pub(crate) fn random_hex_128() -> Result<String, StoreError> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|source| StoreError::Random { source })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// `location` (a `terminal.store` value) as it may be shown: a URL's password replaced.
pub fn redact_location(location: &str) -> String {
    crate::redact::redact(location)
}

/// The store the engine holds: one of the [`Backend`] implementations.
// One `Store` per event loop (or command), moved once: the size difference costs nothing, and
// boxing a variant would put an indirection on every call for no saving.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Store {
    /// The embedded SQLite file.
    Sqlite(SqliteStore),
    /// A PostgreSQL database, shared by a fleet.
    #[cfg(feature = "postgres")]
    Postgres(PgStore),
}

impl Store {
    /// Keeps the data dir's disk `reserve` for the SQLite file's commits
    /// ([`SqliteStore::set_reserve`]); a fleet's PostgreSQL database is not on this disk.
    pub fn set_reserve(&mut self, reserve: reserve::Reserve) {
        match self {
            Store::Sqlite(s) => s.set_reserve(reserve),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => {}
        }
    }

    /// Whether this is the data dir's own SQLite file (not a fleet's shared database).
    pub fn is_sqlite(&self) -> bool {
        match self {
            Store::Sqlite(_) => true,
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => false,
        }
    }

    /// Opens the SQLite store at `path`, creating it if needed ([`SqliteStore::open`]).
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        SqliteStore::open(path).map(Store::Sqlite)
    }

    /// Opens the SQLite store at `path` only if the file exists
    /// ([`SqliteStore::open_existing`]).
    pub fn open_existing(path: &Path) -> Result<Store, StoreError> {
        SqliteStore::open_existing(path).map(Store::Sqlite)
    }

    /// Opens the store `location` names: a `postgres://` URL, or the SQLite file at `default`
    /// when it is `None` (`terminal.store` unset). `create` says whether a missing SQLite file
    /// may be created ([`Store::open`]) or is refused ([`Store::open_existing`]).
    pub fn open_location(
        location: Option<&str>,
        default: &Path,
        create: bool,
    ) -> Result<Store, StoreError> {
        match location {
            None => {
                if create {
                    Store::open(default)
                } else {
                    Store::open_existing(default)
                }
            }
            Some(url) => Store::connect(url),
        }
    }

    /// Connects to the PostgreSQL store at `url` and brings its schema up to date.
    pub fn connect(url: &str) -> Result<Store, StoreError> {
        #[cfg(feature = "postgres")]
        {
            let target = PgTarget::parse(url)?;
            PgStore::open(&target).map(Store::Postgres)
        }
        #[cfg(not(feature = "postgres"))]
        {
            Err(StoreError::BadTarget {
                target: redact_location(url),
                reason: "this taskbox was built without the `postgres` feature; rebuild with \
                         it or leave `terminal.store` unset for the SQLite file"
                    .to_string(),
            })
        }
    }

    /// The store file, for an SQLite store.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Store::Sqlite(s) => Some(s.path()),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => None,
        }
    }

    /// Where the store is, for messages: the file's path, or the URL with its password
    /// replaced.
    pub fn location(&self) -> String {
        match self {
            Store::Sqlite(s) => s.path().display().to_string(),
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s.target().redacted().to_string(),
        }
    }
}

/// Every [`Backend`] method, called on the store it holds: `store.commit(…)` derefs to the
/// backend, so callers need neither import the trait nor a method written out again here.
///
/// That is one dynamic call per store call, where a match per method was a direct one. Its
/// cost is nil beside what each call does: a commit waits for a disk sync (SQLite) or a
/// round trip and a WAL flush (PostgreSQL), milliseconds; an indirect call is a nanosecond,
/// and a read runs SQL.
impl std::ops::Deref for Store {
    type Target = dyn Backend;

    fn deref(&self) -> &(dyn Backend + 'static) {
        match self {
            Store::Sqlite(s) => s,
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s,
        }
    }
}

impl std::ops::DerefMut for Store {
    fn deref_mut(&mut self) -> &mut (dyn Backend + 'static) {
        match self {
            Store::Sqlite(s) => s,
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s,
        }
    }
}
