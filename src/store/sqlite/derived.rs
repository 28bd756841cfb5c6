//! The sandbox and snapshot rows ([`SqliteStore::sandboxes`], [`SqliteStore::snapshots`]) and
//! who retains a snapshot ([`SqliteStore::snapshot_holders`]), derived from the journal and the
//! forks' shares: a commit writes journal rows (and a new task's row, and a fork's share), not
//! tables that repeat what the tasks' records say (migration 7 dropped them; they cost the
//! `journal.batch` benchmark most of what separated the store from a raw insert loop:
//! docs/performance.md, "The journal-only commit"). PostgreSQL's store keeps its tables; the
//! stores' tests hold both to the same answers, and the property tests hold these to a model
//! computed from the tasks' histories.

use std::collections::BTreeSet;

use super::rows::get;
use super::SqliteStore;
use crate::core::{Millis, SandboxRecord};
use crate::ids::TaskId;
use crate::store::rows::Columns;
use crate::store::{SandboxRow, SandboxStatus, SnapshotRow, StoreError};

impl SqliteStore {
    /// Sandbox rows, of one task or of all, ordered by task, generation and id, derived from
    /// the tasks' journals: one per sandbox a task ever held, with its last record
    /// while held, `running` while the task's last row holds it, else `released` at the time of
    /// the first row after it that did not.
    ///
    /// Reads only the rows that hold a `sandbox` member, and only that member: every keyframe
    /// (a whole task) and every delta that changed it, which a delta's text says with
    /// `"sandbox":` (inside a JSON string a quote is escaped, so that text is a member name;
    /// the parse below decides, the filter only skips rows without it). A delta without the
    /// member left the sandbox as it was.
    pub fn sandboxes(&self, task_id: Option<&str>) -> Result<Vec<SandboxRow>, StoreError> {
        let ids = match task_id {
            Some(id) => vec![id.to_string()],
            None => self
                .task_ids()?
                .iter()
                .map(|t| t.as_str().to_string())
                .collect(),
        };
        let sql = "SELECT task_id, task_seq, at, task_after FROM journal \
                   WHERE task_id = ?1 AND (task_key IS NULL OR instr(task_after, '\"sandbox\":') > 0) \
                   ORDER BY task_seq";
        let mut out = Vec::new();
        for id in &ids {
            let mut rows: Vec<SandboxRow> = Vec::new();
            // The index in `rows` of the sandbox the task's row before held.
            let mut held: Option<usize> = None;
            let changes =
                self.query_rows("deriving a task's sandboxes", sql, &[id], Some(id), |row| {
                    let mut cx = self.row_context(row, "journal.task_id", 0)?;
                    cx.seq = Some(get(&cx, row, 1, "journal.task_seq")?);
                    let at: Millis = get(&cx, row, 2, "journal.at")?;
                    let text = row.json_text(&cx, (3, "journal.task_after"))?;
                    let member: SandboxMember = serde_json::from_str(text).map_err(|e| {
                        cx.corrupt(
                            "journal.task_after",
                            "not a task or a change of one".into(),
                            Some(e),
                        )
                    })?;
                    match member.sandbox {
                        Some(sb) => Ok(Some((cx.task()?, at, sb))),
                        None => Ok(None),
                    }
                })?;
            for (task, at, now) in changes.into_iter().flatten() {
                if let (Some(i), Some(sb)) = (held, now.as_ref()) {
                    if rows[i].provider_id == sb.id {
                        rows[i] = held_row(&task, sb);
                        continue;
                    }
                }
                if let Some(i) = held.take() {
                    rows[i].status = SandboxStatus::Released;
                    rows[i].released_at = Some(at);
                }
                if let Some(sb) = now.as_ref() {
                    // A sandbox held again takes its row back, running.
                    let row = held_row(&task, sb);
                    let i = match rows.iter().position(|r| r.provider_id == sb.id) {
                        Some(i) => {
                            rows[i] = row;
                            i
                        }
                        None => {
                            rows.push(row);
                            rows.len() - 1
                        }
                    };
                    held = Some(i);
                }
            }
            rows.sort_by(|a, b| {
                (a.generation, a.provider_id.as_str()).cmp(&(b.generation, b.provider_id.as_str()))
            });
            out.extend(rows);
        }
        Ok(out)
    }

    /// Snapshot rows, of one task or of all, ordered by task and seq, from the tasks as their
    /// journals rebuild them: one per snapshot record.
    pub fn snapshots(&self, task_id: Option<&str>) -> Result<Vec<SnapshotRow>, StoreError> {
        let tasks = match task_id {
            Some(id) => self.load_task(id)?.into_iter().collect(),
            None => self.load_tasks()?,
        };
        let mut out = Vec::new();
        for task in &tasks {
            let mut rows: Vec<SnapshotRow> = task
                .snapshots
                .iter()
                .map(|s| SnapshotRow::of_record(&task.id, s))
                .collect();
            rows.sort_by_key(|r| r.seq);
            out.extend(rows);
        }
        Ok(out)
    }

    /// The tasks other than `asking` that retain the provider snapshot `provider_id` (a record
    /// of it `complete` or `pending`, the task not removed unless `taskbox rm --keep-snapshots`
    /// kept them), ordered by id; `asking` holds a record of it ([`Backend::snapshot_holders`]).
    ///
    /// Only a fork gives a task a record of a snapshot it did not take, so the tasks that may
    /// retain it besides the one that took it are the forks that share it and the tasks they
    /// were forked from (the taker among them, whatever the depth: a fork of a fork from the
    /// same snapshot names its own parent, which names the taker), which `fork_shares` lists.
    /// When no fork shares it, the taker is the only task with a record of it: the one asking.
    ///
    /// [`Backend::snapshot_holders`]: crate::store::Backend::snapshot_holders
    pub fn snapshot_holders(
        &self,
        provider_id: &str,
        asking: &str,
    ) -> Result<Vec<String>, StoreError> {
        let op = "finding the tasks that retain a snapshot";
        // One read transaction: the shares, the tasks and their marks as of one commit.
        let read = self
            .conn
            .unchecked_transaction()
            .map_err(|e| self.sql(op, None, e))?;
        let sql = "SELECT child, parent FROM fork_shares WHERE snapshot = ?1";
        let shares = self.query_rows(op, sql, &[&provider_id], None, |row| {
            let child = self.row_context(row, "fork_shares.child", 0)?.task()?;
            let parent = self.row_context(row, "fork_shares.parent", 1)?.task()?;
            Ok([child, parent])
        })?;
        let candidates: BTreeSet<TaskId> = shares
            .into_iter()
            .flatten()
            .filter(|t| t.as_str() != asking)
            .collect();
        let mut holders = Vec::new();
        for id in candidates {
            let Some(task) = self.load_task(id.as_str())? else {
                continue;
            };
            let retains = task.holds_snapshot(provider_id);
            let marks_keep = self.task_marks(id.as_str())?.is_none_or(|m| {
                crate::core::retention::removed_task_holds(m.removed_at.is_some(), m.kept_snapshots)
            });
            if retains && marks_keep {
                holders.push(id.to_string());
            }
        }
        drop(read);
        Ok(holders)
    }
}

/// The `sandbox` member of a journal row's `task_after`: absent (`None`: the row did not change
/// it), `null` (`Some(None)`), or the record held after the row.
#[derive(serde::Deserialize)]
struct SandboxMember {
    #[serde(default, deserialize_with = "present")]
    sandbox: Option<Option<SandboxRecord>>,
}

/// A member that is present, whatever its value (`null` included).
fn present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<SandboxRecord>>, D::Error> {
    serde::Deserialize::deserialize(d).map(Some)
}

/// The row of a sandbox the task `task_id` holds, from its record. It leaves out `used`, which
/// every first command of a sandbox sets, and `activity` and `sampling`, which only sampling changes. Every field is named, so a new one does not compile
/// until it is sorted into the row or out of it.
fn held_row(task_id: &TaskId, sb: &SandboxRecord) -> SandboxRow {
    let SandboxRecord {
        id,
        name,
        generation,
        created_at,
        deadline,
        source_snapshot,
        used: _,
        activity: _,
        sampling: _,
    } = sb;
    SandboxRow {
        provider_id: id.clone(),
        name: name.clone(),
        task_id: task_id.clone(),
        generation: *generation,
        created_at: *created_at,
        deadline: *deadline,
        source_snapshot: source_snapshot.clone(),
        status: SandboxStatus::Running,
        released_at: None,
    }
}
