//! The SQLite store ([`SqliteStore`]): tasks and their journal, in one file of a data directory;
//! the sandbox and snapshot rows and a snapshot's holders are derived from them (`derived`).
//!
//! One file per data directory, in WAL mode with `synchronous = FULL`: [`Backend::commit`] is the
//! engine's write-ahead step, so a transition that returned is on disk before any of its
//! commands is performed, and survives power loss. Each commit is one transaction that
//!
//! - refuses it with [`StoreError::StateConflict`] if the task's stored state (its last journal
//!   row's `state_after`) is not the transition's `state_before` (a second writer would
//!   otherwise silently lose an update);
//! - writes the task's row when the task is new to the store. The row holds what the journal
//!   does not (the task's backend, its removal): not the task (migration 5) nor its state
//!   (migration 7). Loading a task rebuilds it from the journal's rows from the keyframe its
//!   last row's chain starts from (`LOAD_TASKS`, at most [`delta::KEYFRAME_EVERY`] rows), as
//!   the journal's readers do;
//! - appends a `journal` row (the event, the commands, and the task after the transition) with
//!   the next per-task sequence number. The task after it is stored as what changed since the
//!   task's row before, with the whole task every so often ([`delta`]); the readers rebuild it.
//!   Triggers refuse any UPDATE or DELETE on the journal;
//! - for a fork, records its share of its parent's snapshot (`fork_shares`, insert-only), which
//!   [`SqliteStore::snapshot_holders`] looks through;
//! - refuses, in memory, a sandbox record named for another task
//!   ([`StoreError::SandboxOwned`]).
//!
//! Nothing else: the `snapshots` and `sandboxes` tables that repeated the tasks' records were
//! dropped by migration 7 (their rows are read from the journal now, `derived`), because
//! writing them was most of what a commit cost beyond its journal row.
//!
//! Several processes may open the same file: writes take the lock up front (`BEGIN IMMEDIATE`)
//! and wait up to 10 s for it instead of failing ([`StoreError::Busy`] after that).
//!
//! Throughput: a commit costs one disk sync, which dominates; [`Backend::commit_batch`] puts many
//! transitions behind one sync, and [`Backend::commit_batch_with`]`(…, `[`Sync::WithNext`]`)`
//! lets a batch that performs nothing on a provider (the engine's answers: a command's result)
//! ride on the next commit's sync. Statements are prepared once per connection (`prepare_cached`);
//! in a batch, each transition is serialized once (its task as what changed, see [`delta`]) and
//! appends its journal row, and nothing is read per transition (see `write::Known`). The journal's `seq` is a
//! plain rowid (migration 3 dropped `AUTOINCREMENT`).

mod delta;
mod derived;
mod rows;
mod schema;
mod write;

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::error::StoreError;
use super::reserve::{Held, Reserve};
use super::{Backend, JournalEntry, SandboxRow, SnapshotRow, Sync, TaskMarks, TransitionRecord};
use crate::core::{Millis, Task};
use crate::ids::TaskId;

use write::{write_batch, Buffers, Known};

/// An open SQLite store file. Not `Sync`: give each thread its own store (they may share the
/// file).
#[derive(Debug)]
pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
    installation_id: String,
    /// The connection was left at `synchronous = NORMAL` (setting FULL back after a
    /// [`Sync::WithNext`] commit failed): every write sets FULL again before it writes.
    not_full: bool,
    /// What the task rows and the journal hold, as far as this connection knows.
    known: Known,
    /// Serialization buffers, reused by every commit.
    bufs: Buffers,
    /// The data dir's disk reserve, given back when a commit finds the disk full (set by the
    /// engine that writes through this store; `None`: a reader's store, or none configured).
    reserve: Option<Reserve>,
}

/// What `rows::query_tasks` reads: each task row with its journal's rows from the keyframe its
/// last row's chain starts from (`ORDER BY` and any `WHERE` are added by the caller). One
/// statement, so the rows are of one commit.
pub(crate) const LOAD_TASKS: &str =
    "SELECT t.id, j.state_after, j.task_seq, j.task_key, j.task_after \
     FROM tasks t LEFT JOIN journal j ON j.task_id = t.id AND j.task_seq >= \
     (SELECT COALESCE(l.task_key, l.task_seq) FROM journal l WHERE l.task_id = t.id \
      ORDER BY l.task_seq DESC LIMIT 1)";

/// The columns `query_journal` decodes, in its order.
const JOURNAL_COLUMNS: &str = "seq, task_id, task_seq, at, event, state_before, state_after, \
                               commands, task_after";

impl SqliteStore {
    /// Opens the store at `path`, creating the file and its parent directories if needed and
    /// bringing the schema up to date.
    ///
    /// Refuses a file that is not an SQLite database ([`StoreError::NotADatabase`]) and one
    /// written by a newer taskbox ([`StoreError::TooNew`]), without writing to either.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(path, schema::Create::Yes)
    }

    /// Opens the store at `path` only if the file exists ([`StoreError::Missing`] otherwise),
    /// for commands that read what is there: pointed at the wrong directory they should say so,
    /// not leave an empty store behind. An existing file is brought up to date like
    /// [`SqliteStore::open`] does.
    pub fn open_existing(path: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(path, schema::Create::No)
    }

    fn open_with(path: &Path, create: schema::Create) -> Result<SqliteStore, StoreError> {
        let conn = schema::open(path, create)?;
        let installation_id = schema::installation_id(&conn, path)?;
        Ok(SqliteStore {
            conn,
            path: path.to_path_buf(),
            installation_id,
            not_full: false,
            known: Known::default(),
            bufs: Buffers::default(),
            reserve: None,
        })
    }

    /// Keeps `reserve` for this store's commits: a commit that finds the disk full gives it back
    /// and is tried once more; after every commit, a missing reserve is made again once there is
    /// room ([`Reserve::ensure`]).
    pub fn set_reserve(&mut self, reserve: Reserve) {
        self.reserve = Some(reserve);
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This data directory's random id, created with the file and never changed.
    pub fn installation_id(&self) -> &str {
        &self.installation_id
    }

    /// The task with this id, if it was ever committed.
    pub fn load_task(&self, id: &str) -> Result<Option<Task>, StoreError> {
        let sql = format!("{LOAD_TASKS} WHERE t.id = ?1 ORDER BY j.task_seq");
        Ok(rows::query_tasks(
            &self.conn,
            &self.path,
            "loading a task",
            &sql,
            params![id],
            Some(id),
        )?
        .pop())
    }

    /// Every task, ordered by id.
    pub fn load_tasks(&self) -> Result<Vec<Task>, StoreError> {
        let sql = format!("{LOAD_TASKS} ORDER BY t.id, j.task_seq");
        rows::query_tasks(&self.conn, &self.path, "loading tasks", &sql, &[], None)
    }

    /// The ids of every task, ordered.
    pub fn task_ids(&self) -> Result<Vec<TaskId>, StoreError> {
        let sql = "SELECT id FROM tasks ORDER BY id";
        self.query_rows("listing task ids", sql, &[], None, |row| {
            self.row_context(row, "tasks.id", 0)?.task()
        })
    }

    /// What the store knows of a task beyond the core's record (`None`: no such task).
    pub fn task_marks(&self, id: &str) -> Result<Option<TaskMarks>, StoreError> {
        let op = "reading a task's backend";
        self.conn
            .prepare_cached("SELECT backend, removed_at, kept_snapshots FROM tasks WHERE id = ?1")
            .and_then(|mut s| {
                s.query_row([id], |r| {
                    Ok(TaskMarks {
                        backend: r.get(0)?,
                        removed_at: r.get(1)?,
                        kept_snapshots: r.get::<_, Option<bool>>(2)?.unwrap_or(false),
                    })
                })
                .optional()
            })
            .map_err(|e| self.sql(op, Some(id), e))
    }

    /// The marks of every removed task, by id.
    pub fn removed_tasks(&self) -> Result<Vec<(TaskId, TaskMarks)>, StoreError> {
        let sql = "SELECT id, backend, removed_at, kept_snapshots FROM tasks
                   WHERE removed_at IS NOT NULL ORDER BY id";
        self.query_rows("listing removed tasks", sql, &[], None, |row| {
            let cx = self.row_context(row, "tasks.id", 0)?;
            let marks = TaskMarks {
                backend: rows::get(&cx, row, 1, "tasks.backend")?,
                removed_at: rows::get(&cx, row, 2, "tasks.removed_at")?,
                kept_snapshots: rows::get::<Option<bool>>(&cx, row, 3, "tasks.kept_snapshots")?
                    .unwrap_or(false),
            };
            Ok((cx.task()?, marks))
        })
    }

    /// Records `backend` as the task's, unless one is recorded already; returns the recorded
    /// one (`None`: no such task).
    pub fn claim_backend(&mut self, id: &str, backend: &str) -> Result<Option<String>, StoreError> {
        self.full_sync(Some(id))?;
        let op = "recording a task's backend";
        self.conn
            .prepare_cached("UPDATE tasks SET backend = ?2 WHERE id = ?1 AND backend IS NULL")
            .and_then(|mut s| s.execute(params![id, backend]))
            .map_err(|e| self.sql(op, Some(id), e))?;
        Ok(self.task_marks(id)?.and_then(|m| m.backend))
    }

    /// Marks the task removed at `at` (`taskbox rm`); its record and journal stay.
    pub fn mark_removed(&mut self, id: &str, at: Millis, kept: bool) -> Result<(), StoreError> {
        self.full_sync(Some(id))?;
        let op = "marking a task removed";
        self.conn
            .prepare_cached("UPDATE tasks SET removed_at = ?2, kept_snapshots = ?3 WHERE id = ?1")
            .and_then(|mut s| s.execute(params![id, at, kept]))
            .map_err(|e| self.sql(op, Some(id), e))?;
        Ok(())
    }

    /// Commits one transition in one transaction: a journal row (and a new task's row, a fork's
    /// share of its parent's snapshot). Returns the journal `seq`. Nothing is written if any part
    /// fails; once it returns `Ok`, the transition is durable.
    pub fn commit(&mut self, rec: &TransitionRecord<'_>) -> Result<u64, StoreError> {
        let seqs = self.commit_batch(std::slice::from_ref(rec))?;
        Ok(seqs
            .into_iter()
            .next()
            .expect("commit_batch returns one seq per record"))
    }

    /// Group commit: the transitions, in order (several may be of one task), in ONE
    /// transaction and one disk sync. Returns their journal `seq`s in the same order. All or
    /// nothing: if one record fails, none is written.
    pub fn commit_batch(&mut self, recs: &[TransitionRecord<'_>]) -> Result<Vec<u64>, StoreError> {
        self.commit_batch_with(recs, Sync::Now)
    }

    /// [`SqliteStore::commit_batch`], reaching the disk as `sync` says. A [`Sync::Now`] commit, and
    /// every other write, is made at `synchronous = FULL` whatever came before.
    pub fn commit_batch_with(
        &mut self,
        recs: &[TransitionRecord<'_>],
        sync: Sync,
    ) -> Result<Vec<u64>, StoreError> {
        if recs.is_empty() {
            return Ok(Vec::new());
        }
        let first_task = Some(recs[0].task_after.id.as_str());
        if sync == Sync::Now {
            self.full_sync(first_task)?;
            return self.commit_reserved(recs);
        }
        self.set_synchronous(false, first_task)?;
        self.not_full = true;
        let result = self.commit_reserved(recs);
        // Not an error of the commit: if this fails, the next write sets FULL before writing.
        let _ = self.full_sync(first_task);
        result
    }

    /// [`SqliteStore::commit_records`], once more after giving the disk reserve back if the disk
    /// was full (the failed attempt wrote nothing: its transaction rolled back); then the
    /// reserve is made again if it is missing and there is room.
    fn commit_reserved(&mut self, recs: &[TransitionRecord<'_>]) -> Result<Vec<u64>, StoreError> {
        let mut result = self.commit_records(recs);
        if let (Err(StoreError::Full { .. }), Some(reserve)) = (&result, &self.reserve) {
            if reserve.release() {
                tracing::warn!(store = %self.path.display(), reserve = %reserve.path().display(),
                    "the disk is full: gave the store's reserve back to commit");
                result = self.commit_records(recs);
            }
        }
        if let Some(reserve) = &self.reserve {
            match reserve.ensure() {
                Ok(Held::Made) => tracing::info!(reserve = %reserve.path().display(),
                    "there is room again: the store's disk reserve is made again"),
                Ok(Held::Kept | Held::NoRoom(_) | Held::Off) => {}
                Err(e) => tracing::debug!(error = %e, "could not make the disk reserve"),
            }
        }
        result
    }

    /// Sets `synchronous = FULL` again if a [`Sync::WithNext`] commit could not.
    fn full_sync(&mut self, task: Option<&str>) -> Result<(), StoreError> {
        if self.not_full {
            self.set_synchronous(true, task)?;
            self.not_full = false;
        }
        Ok(())
    }

    /// `synchronous = FULL` (`full`) or `NORMAL`. The statement is cached: a warm command's
    /// commits switch the mode, and parsing the pragma anew each time showed in the server's
    /// profile.
    fn set_synchronous(&self, full: bool, task: Option<&str>) -> Result<(), StoreError> {
        let sql = if full {
            "PRAGMA synchronous = FULL"
        } else {
            "PRAGMA synchronous = NORMAL"
        };
        self.conn
            .prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute([]).map(drop))
            .map_err(|e| StoreError::sql(&self.path, "choosing when a commit syncs", task, e))
    }

    fn commit_records(&mut self, recs: &[TransitionRecord<'_>]) -> Result<Vec<u64>, StoreError> {
        let path = self.path.as_path();
        let first_task = Some(recs[0].task_after.id.as_str());
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| StoreError::sql(path, "beginning a commit", first_task, e))?;
        let written = write_batch(&tx, path, recs, &mut self.known, &mut self.bufs);
        // An error drops `tx`, which rolls back every record written so far.
        let committed = written.and_then(|seqs| {
            tx.commit()
                .map(|()| seqs)
                .map_err(|e| StoreError::sql(path, "committing a transition", first_task, e))
        });
        match &committed {
            Ok(_) => self.known.committed(),
            Err(_) => self.known.forget(),
        }
        committed
    }

    /// The task's whole journal, oldest first.
    pub fn journal(&self, task_id: &str) -> Result<Vec<JournalEntry>, StoreError> {
        let sql = format!(
            "SELECT {JOURNAL_COLUMNS}, task_key FROM journal WHERE task_id = ?1 \
             ORDER BY task_seq"
        );
        self.query_journal(&sql, params![task_id], task_id, 0)
    }

    /// The task's last `limit` journal entries, oldest first.
    pub fn journal_tail(
        &self,
        task_id: &str,
        limit: usize,
    ) -> Result<Vec<JournalEntry>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // One read transaction: both statements see the same journal.
        let read = self
            .conn
            .unchecked_transaction()
            .map_err(|e| self.sql("reading the journal", Some(task_id), e))?;
        // The first of the last `limit` rows, and the keyframe it rebuilds from.
        let first: Option<(u64, u64)> = read
            .prepare_cached(
                "SELECT task_seq, COALESCE(task_key, task_seq) FROM journal
                 WHERE task_id = ?1 AND task_seq = (
                     SELECT MIN(task_seq) FROM (SELECT task_seq FROM journal WHERE task_id = ?1
                                                ORDER BY task_seq DESC LIMIT ?2))",
            )
            .and_then(|mut s| {
                s.query_row(
                    params![task_id, i64::try_from(limit).unwrap_or(i64::MAX)],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
            })
            .map_err(|e| self.sql("reading the journal", Some(task_id), e))?;
        let Some((first, start)) = first else {
            return Ok(Vec::new());
        };
        let sql = format!(
            "SELECT {JOURNAL_COLUMNS}, task_key FROM journal \
             WHERE task_id = ?1 AND task_seq >= ?2 ORDER BY task_seq"
        );
        let entries = self.query_journal(&sql, params![task_id, start], task_id, first)?;
        drop(read);
        Ok(entries)
    }

    /// Runs SQLite's `integrity_check` and `foreign_key_check` (for `taskbox doctor`).
    pub fn integrity_check(&self) -> Result<(), StoreError> {
        let op = "checking integrity";
        let err = |e| self.sql(op, None, e);
        let mut problems: Vec<String> = self
            .conn
            .prepare("PRAGMA integrity_check")
            .and_then(|mut s| {
                s.query_map([], |r| r.get::<_, String>(0))?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(err)?;
        if problems == ["ok"] {
            problems.clear();
        }
        let fk: Vec<String> = self
            .conn
            .prepare("PRAGMA foreign_key_check")
            .and_then(|mut s| {
                s.query_map([], |r| {
                    Ok(format!(
                        "row {} of {} refers to a missing row of {}",
                        r.get::<_, Option<i64>>(1)?
                            .map_or_else(|| "?".to_string(), |id| id.to_string()),
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(2)?,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(err)?;
        problems.extend(fk);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(StoreError::Integrity {
                path: self.path.clone(),
                report: problems.join("\n"),
            })
        }
    }

    fn sql(
        &self,
        operation: &'static str,
        task_id: Option<&str>,
        e: rusqlite::Error,
    ) -> StoreError {
        StoreError::sql(&self.path, operation, task_id, e)
    }
}

impl Backend for SqliteStore {
    fn installation_id(&self) -> &str {
        SqliteStore::installation_id(self)
    }
    fn load_task(&self, id: &str) -> Result<Option<Task>, StoreError> {
        SqliteStore::load_task(self, id)
    }
    fn load_tasks(&self) -> Result<Vec<Task>, StoreError> {
        SqliteStore::load_tasks(self)
    }
    fn task_ids(&self) -> Result<Vec<TaskId>, StoreError> {
        SqliteStore::task_ids(self)
    }
    fn task_marks(&self, id: &str) -> Result<Option<TaskMarks>, StoreError> {
        SqliteStore::task_marks(self, id)
    }
    fn snapshot_holders(&self, provider_id: &str, asking: &str) -> Result<Vec<String>, StoreError> {
        SqliteStore::snapshot_holders(self, provider_id, asking)
    }
    fn removed_tasks(&self) -> Result<Vec<(TaskId, TaskMarks)>, StoreError> {
        SqliteStore::removed_tasks(self)
    }
    fn claim_backend(&mut self, id: &str, backend: &str) -> Result<Option<String>, StoreError> {
        SqliteStore::claim_backend(self, id, backend)
    }
    fn mark_removed(&mut self, id: &str, at: Millis, kept: bool) -> Result<(), StoreError> {
        SqliteStore::mark_removed(self, id, at, kept)
    }
    fn commit(&mut self, rec: &TransitionRecord<'_>) -> Result<u64, StoreError> {
        SqliteStore::commit(self, rec)
    }
    fn commit_batch(&mut self, recs: &[TransitionRecord<'_>]) -> Result<Vec<u64>, StoreError> {
        SqliteStore::commit_batch(self, recs)
    }
    fn commit_batch_with(
        &mut self,
        recs: &[TransitionRecord<'_>],
        sync: Sync,
    ) -> Result<Vec<u64>, StoreError> {
        SqliteStore::commit_batch_with(self, recs, sync)
    }
    fn journal(&self, task_id: &str) -> Result<Vec<JournalEntry>, StoreError> {
        SqliteStore::journal(self, task_id)
    }
    fn journal_tail(&self, task_id: &str, limit: usize) -> Result<Vec<JournalEntry>, StoreError> {
        SqliteStore::journal_tail(self, task_id, limit)
    }
    fn integrity_check(&self) -> Result<(), StoreError> {
        SqliteStore::integrity_check(self)
    }
    fn sandboxes(&self, task_id: Option<&str>) -> Result<Vec<SandboxRow>, StoreError> {
        SqliteStore::sandboxes(self, task_id)
    }
    fn snapshots(&self, task_id: Option<&str>) -> Result<Vec<SnapshotRow>, StoreError> {
        SqliteStore::snapshots(self, task_id)
    }
}
