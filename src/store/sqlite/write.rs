//! The commit path's writes: one transition's task row, journal row, and the snapshot and
//! sandbox rows mirrored from the task, inside the caller's transaction.

use std::collections::HashMap;
use std::path::Path;

use rusqlite::{params, OptionalExtension, Transaction};

use crate::core::{Millis, SandboxRecord, SnapshotRecord, Task};
use crate::store::{to_json, StoreError, TransitionRecord};

/// An error mapper for a statement of the commit path.
fn on<'a>(
    path: &'a Path,
    task_id: &'a str,
    operation: &'static str,
) -> impl Fn(rusqlite::Error) -> StoreError + 'a {
    move |e| StoreError::sql(path, operation, Some(task_id), e)
}

/// Writes one transition inside `tx`: task row, journal row, snapshot rows, sandbox rows.
pub(super) fn write_transition(
    tx: &Transaction<'_>,
    path: &Path,
    rec: &TransitionRecord<'_>,
    mirrors: &mut Mirrors,
) -> Result<u64, StoreError> {
    let task = rec.task_after;
    let id = task.id.as_str();
    let task_json = to_json(id, "task", task)?;
    let event_json = to_json(id, "event", rec.event)?;
    let commands_json = to_json(id, "commands", rec.commands)?;

    // The stored state, read under the write lock.
    let stored: Option<String> = tx
        .prepare_cached("SELECT state FROM tasks WHERE id = ?1")
        .and_then(|mut s| s.query_row([id], |r| r.get(0)).optional())
        .map_err(on(path, id, "reading the task"))?;
    if let Some(stored) = stored.filter(|s| s != rec.state_before.as_str()) {
        // Another writer moved the task on since this transition's `state_before` was read;
        // committing would silently drop its update.
        return Err(StoreError::StateConflict {
            task_id: id.to_string(),
            expected: rec.state_before,
            stored,
        });
    }
    // The snapshot and sandbox rows are rewritten only when they may differ from the task's
    // records: when this connection does not know what they hold (see [`Mirrors`]) or the
    // records changed. Most transitions change neither.
    let known = mirrors.get(id);
    let snapshots_unchanged = known.is_some_and(|m| m.snapshots == task.snapshots);
    let sandbox_unchanged = known.is_some_and(|m| m.sandbox == task.sandbox);

    tx.prepare_cached(
        "INSERT INTO tasks (id, state, data, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (id) DO UPDATE
            SET state = excluded.state, data = excluded.data, updated_at = excluded.updated_at",
    )
    .and_then(|mut s| {
        s.execute(params![
            id,
            task.state.as_str(),
            task_json,
            task.created_at,
            rec.at,
        ])
    })
    .map_err(on(path, id, "writing the task"))?;

    // The journal row, numbered after the task's last one (found through the unique index).
    let seq: u64 = tx
        .prepare_cached(
            "INSERT INTO journal (task_id, task_seq, at, event_name, event, state_before,
                                  state_after, commands, task_after)
             VALUES (?1, (SELECT COALESCE(MAX(task_seq), 0) + 1 FROM journal WHERE task_id = ?1),
                     ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             RETURNING seq",
        )
        .and_then(|mut s| {
            s.query_row(
                params![
                    id,
                    rec.at,
                    rec.event.name(),
                    event_json,
                    rec.state_before.as_str(),
                    task.state.as_str(),
                    commands_json,
                    task_json,
                ],
                |r| r.get(0),
            )
        })
        .map_err(on(path, id, "appending to the journal"))?;

    if !snapshots_unchanged {
        sync_snapshots(tx, path, task)?;
    }
    if !sandbox_unchanged {
        sync_sandboxes(tx, path, task, rec.at)?;
    }
    if !(snapshots_unchanged && sandbox_unchanged) {
        mirrors.pending.insert(
            id.to_string(),
            Mirror {
                snapshots: task.snapshots.clone(),
                sandbox: task.sandbox.clone(),
            },
        );
    }
    Ok(seq)
}

/// What one task's `snapshots` and `sandboxes` rows mirror: the records they were last written
/// from.
#[derive(Debug, Clone, PartialEq)]
struct Mirror {
    snapshots: Vec<SnapshotRecord>,
    sandbox: Option<SandboxRecord>,
}

/// What this connection knows the `snapshots` and `sandboxes` rows hold, per task: the records
/// of the last transition it committed for the task. Only commits write those rows, so the
/// knowledge stays true until another connection commits — which `PRAGMA data_version` (read
/// under the write lock at the start of every commit) reveals, and then everything is forgotten.
/// A task not known here has its rows rewritten (the writes are idempotent), so a cold or
/// forgotten cache costs time, never correctness.
#[derive(Debug, Default)]
pub(super) struct Mirrors {
    /// `data_version` as of this connection's last commit; `None`: nothing is known.
    version: Option<i64>,
    known: HashMap<String, Mirror>,
    /// What the transaction in progress wrote (applied to `known` once it commits).
    pending: HashMap<String, Mirror>,
}

/// More tasks than this known and the knowledge is dropped (it is rebuilt as tasks commit).
const MAX_KNOWN: usize = 100_000;

impl Mirrors {
    /// Starts a commit: forgets everything if another connection committed since this one's
    /// last commit. `tx` holds the write lock.
    pub(super) fn begin(&mut self, tx: &Transaction<'_>, path: &Path) -> Result<(), StoreError> {
        self.pending.clear();
        let version: i64 = tx
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut s| s.query_row([], |r| r.get(0)))
            .map_err(|e| StoreError::sql(path, "reading the data version", None, e))?;
        if self.version != Some(version) || self.known.len() > MAX_KNOWN {
            self.known.clear();
            self.version = Some(version);
        }
        Ok(())
    }

    /// The rows of `task` as of this transaction: its own writes first.
    fn get(&self, task: &str) -> Option<&Mirror> {
        self.pending.get(task).or_else(|| self.known.get(task))
    }

    /// The transaction committed: what it wrote is what the rows hold.
    pub(super) fn committed(&mut self) {
        self.known.extend(self.pending.drain());
    }

    /// The transaction did not commit (or may not have): nothing is known any more.
    pub(super) fn forget(&mut self) {
        self.pending.clear();
        self.known.clear();
        self.version = None;
    }
}

/// Mirrors `task.snapshots` into the `snapshots` table. Unchanged rows are not rewritten (the
/// guarded upsert), so a commit only dirties the pages of records that changed.
fn sync_snapshots(tx: &Transaction<'_>, path: &Path, task: &Task) -> Result<(), StoreError> {
    let id = task.id.as_str();
    let err = on(path, id, "recording the task's snapshots");
    if !task.snapshots.is_empty() {
        let mut upsert = tx
            .prepare_cached(
                "INSERT INTO snapshots (task_id, seq, provider_id, status, size_bytes, sandbox_id,
                                        started_at, created_at, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT (task_id, seq) DO UPDATE
                    SET provider_id = excluded.provider_id, status = excluded.status,
                        size_bytes = excluded.size_bytes, sandbox_id = excluded.sandbox_id,
                        started_at = excluded.started_at, created_at = excluded.created_at,
                        expires_at = excluded.expires_at
                    WHERE (provider_id, status, size_bytes, sandbox_id, started_at, created_at,
                           expires_at)
                       IS NOT (excluded.provider_id, excluded.status, excluded.size_bytes,
                               excluded.sandbox_id, excluded.started_at, excluded.created_at,
                               excluded.expires_at)",
            )
            .map_err(&err)?;
        for snap in &task.snapshots {
            upsert
                .execute(params![
                    id,
                    snap.seq,
                    snap.id.as_deref(),
                    snap.status.as_str(),
                    snap.size_bytes,
                    snap.sandbox_id.as_str(),
                    snap.started_at,
                    snap.created_at,
                    snap.expires_at,
                ])
                .map_err(&err)?;
        }
    }
    // Records the task no longer holds. The list of kept seqs travels as one JSON array so
    // that the statement stays the same (and cached) whatever the number of snapshots.
    let kept = serde_json::to_string(&task.snapshots.iter().map(|s| s.seq).collect::<Vec<_>>())
        .expect("a list of integers always serializes");
    tx.prepare_cached(
        "DELETE FROM snapshots
         WHERE task_id = ?1 AND seq NOT IN (SELECT value FROM json_each(?2))",
    )
    .and_then(|mut s| s.execute(params![id, kept]))
    .map_err(&err)?;
    Ok(())
}

/// Mirrors `task.sandbox` into the `sandboxes` table: the held sandbox is `running`; any other
/// sandbox of the task still marked `running` becomes `released` at `at`.
fn sync_sandboxes(
    tx: &Transaction<'_>,
    path: &Path,
    task: &Task,
    at: Millis,
) -> Result<(), StoreError> {
    let id = task.id.as_str();
    let err = on(path, id, "recording the task's sandbox");
    if let Some(sb) = &task.sandbox {
        // The guard skips both an unchanged row (no write) and a row of another task (no
        // takeover); the second case is told apart below.
        let changed = tx
            .prepare_cached(
                "INSERT INTO sandboxes (provider_id, name, task_id, generation, created_at,
                                        deadline, source_snapshot, status, released_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running', NULL)
                 ON CONFLICT (provider_id) DO UPDATE
                    SET name = excluded.name, generation = excluded.generation,
                        created_at = excluded.created_at, deadline = excluded.deadline,
                        source_snapshot = excluded.source_snapshot, status = 'running',
                        released_at = NULL
                    WHERE task_id = excluded.task_id
                      AND (name, generation, created_at, deadline, source_snapshot, status)
                          IS NOT (excluded.name, excluded.generation, excluded.created_at,
                                  excluded.deadline, excluded.source_snapshot, 'running')",
            )
            .and_then(|mut s| {
                s.execute(params![
                    sb.id.as_str(),
                    sb.name,
                    id,
                    sb.generation,
                    sb.created_at,
                    sb.deadline,
                    sb.source_snapshot.as_deref(),
                ])
            })
            .map_err(&err)?;
        if changed == 0 {
            let owner: String = tx
                .prepare_cached("SELECT task_id FROM sandboxes WHERE provider_id = ?1")
                .and_then(|mut s| s.query_row([sb.id.as_str()], |r| r.get(0)))
                .map_err(&err)?;
            if owner != id {
                return Err(StoreError::SandboxOwned {
                    task_id: id.to_string(),
                    sandbox_id: sb.id.clone(),
                    owner,
                });
            }
        }
    }
    tx.prepare_cached(
        "UPDATE sandboxes SET status = 'released', released_at = ?3
         WHERE task_id = ?1 AND status = 'running' AND provider_id IS NOT ?2",
    )
    .and_then(|mut s| {
        s.execute(params![
            id,
            task.sandbox.as_ref().map(|s| s.id.as_str()),
            at
        ])
    })
    .map_err(&err)?;
    Ok(())
}
