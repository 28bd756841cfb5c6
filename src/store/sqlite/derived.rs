//! The `sandboxes` and `snapshots` rows, and who retains a snapshot, derived from the journal
//! and the forks' lineage instead of read from their tables.
//!
//! The commit path writes those tables as mirrors of the task's records, and they cost the
//! `journal.batch` benchmark most of what separates the store from a raw insert loop (README,
//! Performance). A store that did not write them would answer [`SqliteStore::sandboxes`],
//! [`SqliteStore::snapshots`] and [`SqliteStore::snapshot_holders`] with these readers; until
//! it does, the property tests hold them equal to the tables: the store's (random histories
//! cut into random batches), the engine's (a faulty provider) and the forks' (forks,
//! retention, gc, removals and crashes).

use super::rows::get;
use super::write::sandbox_row_part;
use super::SqliteStore;
use crate::core::{Millis, SandboxRecord, SnapshotStatus};
use crate::ids::TaskId;
use crate::store::rows::Columns;
use crate::store::{SandboxRow, SandboxStatus, SnapshotRow, StoreError};

impl SqliteStore {
    /// The rows [`SqliteStore::sandboxes`] reads (of one task or of all, in the same order),
    /// derived from the tasks' journals: one per sandbox a task ever held, with its last record
    /// while held, `running` while the task's last row holds it, else `released` at the time of
    /// the first row after it that did not.
    ///
    /// Reads only the rows that hold a `sandbox` member, and only that member: every keyframe
    /// (a whole task) and every delta that changed it, which a delta's text says with
    /// `"sandbox":` (inside a JSON string a quote is escaped, so that text is a member name;
    /// the parse below decides, the filter only skips rows without it). A delta without the
    /// member left the sandbox as it was.
    pub fn sandboxes_from_journal(
        &self,
        task_id: Option<&str>,
    ) -> Result<Vec<SandboxRow>, StoreError> {
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

    /// The rows [`SqliteStore::snapshots`] reads (of one task or of all, in the same order),
    /// derived from the tasks as their journals rebuild them: one per snapshot record.
    pub fn snapshots_from_journal(
        &self,
        task_id: Option<&str>,
    ) -> Result<Vec<SnapshotRow>, StoreError> {
        let tasks = match task_id {
            Some(id) => self.load_task(id)?.into_iter().collect(),
            None => self.load_tasks()?,
        };
        let mut out = Vec::new();
        for task in &tasks {
            let mut rows: Vec<SnapshotRow> = task
                .snapshots
                .iter()
                .map(|s| SnapshotRow {
                    task_id: task.id.clone(),
                    seq: s.seq,
                    provider_id: s.id.clone(),
                    status: s.status,
                    size_bytes: s.size_bytes,
                    sandbox_id: s.sandbox_id.clone(),
                    started_at: s.started_at,
                    created_at: s.created_at,
                    expires_at: s.expires_at,
                })
                .collect();
            rows.sort_by_key(|r| r.seq);
            out.extend(rows);
        }
        Ok(out)
    }

    /// The tasks that retain the provider snapshot `provider_id` (a record of it `complete` or
    /// `pending`, the task not removed unless `taskbox rm --keep-snapshots` kept them), found
    /// through forks instead of the `snapshots` table: a snapshot is retained by a task other
    /// than the one that took it only because a fork shares it, so the candidates are the
    /// tasks whose lineage names it and the tasks they were forked from (the taker among
    /// them, whatever the depth: a fork of a fork from the same snapshot names its own
    /// parent, which names the taker). The one answer it does not give is the taker alone
    /// when no fork shares the snapshot — which only the taker itself asks, and the engine
    /// leaves the asking task out of [`SqliteStore::snapshot_holders`]'s answer anyway.
    ///
    /// Reads every task (its lineage); a store that answered with it would keep the forks'
    /// (snapshot, child, parent) in a table written by the rare `forked` commit instead.
    pub fn snapshot_holders_from_lineage(
        &self,
        provider_id: &str,
    ) -> Result<Vec<String>, StoreError> {
        let tasks = self.load_tasks()?;
        let mut candidates: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
        for t in &tasks {
            if let Some(l) = t
                .lineage
                .as_ref()
                .filter(|l| l.snapshot.as_str() == provider_id)
            {
                candidates.insert(t.id.as_str());
                candidates.insert(l.parent.as_str());
            }
        }
        let mut holders = Vec::new();
        for t in tasks.iter().filter(|t| candidates.contains(t.id.as_str())) {
            let retains = t.snapshots.iter().any(|s| {
                s.id.as_ref().is_some_and(|id| id.as_str() == provider_id)
                    && matches!(s.status, SnapshotStatus::Complete | SnapshotStatus::Pending)
            });
            let gone = self
                .task_marks(t.id.as_str())?
                .is_some_and(|m| m.removed_at.is_some() && !m.kept_snapshots);
            if retains && !gone {
                holders.push(t.id.to_string());
            }
        }
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

/// The row of a sandbox the task `task_id` holds, from its record ([`sandbox_row_part`]: what
/// the commit path compares).
fn held_row(task_id: &TaskId, sb: &SandboxRecord) -> SandboxRow {
    let (id, name, generation, created_at, deadline, source_snapshot) = sandbox_row_part(sb);
    SandboxRow {
        provider_id: id.clone(),
        name: name.to_string(),
        task_id: task_id.clone(),
        generation,
        created_at,
        deadline,
        source_snapshot: source_snapshot.cloned(),
        status: SandboxStatus::Running,
        released_at: None,
    }
}
