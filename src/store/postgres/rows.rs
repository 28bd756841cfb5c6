//! Reading rows back: the installation id, the marks, and the [`Columns`] reads of a
//! PostgreSQL row that the shared decoders (`store/rows.rs`) decode tasks and journal entries
//! with.

use std::path::Path;

use tokio_postgres::Row;

use super::PgStore;
use crate::core::Task;
use crate::ids::TaskId;
use crate::store::rows::{self, Col, Columns, RowContext};
use crate::store::{JournalEntry, SandboxRow, SandboxStatus, SnapshotRow, StoreError, TaskMarks};

/// The columns journal reads decode, in this order.
pub(super) const JOURNAL_COLUMNS: &str =
    "seq, task_id, task_seq, at, event, state_before, state_after, \
                               commands, task_after";

impl PgStore {
    pub(super) fn read_installation_id(&self) -> Result<String, StoreError> {
        let candidate = crate::store::random_hex_128()?;
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
        get(&self.cx(None), row, 0, "meta.value")
    }

    /// A context for decoding a row of the task `task_id` (`None`: not known yet).
    pub(super) fn cx(&self, task_id: Option<&str>) -> RowContext<'_> {
        RowContext::new(
            Path::new(self.target.redacted()),
            task_id.unwrap_or("?"),
            "tasks.id",
        )
    }

    /// The task id in column `index` of `row`.
    pub(super) fn decode_task_id(&self, row: &Row, index: usize) -> Result<TaskId, StoreError> {
        let mut cx = self.cx(None);
        cx.read_task(row, index, "tasks.id")?;
        cx.task()
    }

    pub(super) fn decode_task(&self, row: &Row) -> Result<Task, StoreError> {
        rows::decode_task(
            Path::new(self.target.redacted()),
            row,
            "tasks.state",
            "tasks.data",
        )
    }

    pub(super) fn decode_journal(&self, rows: &[Row]) -> Result<Vec<JournalEntry>, StoreError> {
        let path = Path::new(self.target.redacted());
        rows.iter()
            .map(|row| rows::decode_journal(path, row))
            .collect()
    }

    pub(super) fn decode_marks(&self, row: &Row, first: usize) -> Result<TaskMarks, StoreError> {
        let cx = self.cx(None);
        Ok(TaskMarks {
            backend: get(&cx, row, first, "tasks.backend")?,
            removed_at: row.opt_uint(&cx, (first + 1, "tasks.removed_at"))?,
            kept_snapshots: get::<Option<bool>>(&cx, row, first + 2, "tasks.kept_snapshots")?
                .unwrap_or(false),
        })
    }
}

/// A column of a plain SQL type (a NULL or a wrong type is corrupt).
pub(super) fn get<'r, T: tokio_postgres::types::FromSql<'r>>(
    cx: &RowContext<'_>,
    row: &'r Row,
    index: usize,
    column: &'static str,
) -> Result<T, StoreError> {
    row.try_get(index)
        .map_err(|e| cx.corrupt(column, e.to_string(), None))
}

/// A BIGINT that must not be negative.
fn to_uint(cx: &RowContext<'_>, v: i64, column: &'static str) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| cx.corrupt(column, format!("negative value {v}"), None))
}

impl Columns for Row {
    fn text(&self, cx: &RowContext<'_>, col: Col) -> Result<String, StoreError> {
        get(cx, self, col.0, col.1)
    }

    fn opt_text(&self, cx: &RowContext<'_>, col: Col) -> Result<Option<String>, StoreError> {
        get(cx, self, col.0, col.1)
    }

    fn json_text(&self, cx: &RowContext<'_>, col: Col) -> Result<&str, StoreError> {
        get(cx, self, col.0, col.1)
    }

    fn uint(&self, cx: &RowContext<'_>, col: Col) -> Result<u64, StoreError> {
        to_uint(cx, get(cx, self, col.0, col.1)?, col.1)
    }

    fn opt_uint(&self, cx: &RowContext<'_>, col: Col) -> Result<Option<u64>, StoreError> {
        let v: Option<i64> = get(cx, self, col.0, col.1)?;
        v.map(|v| to_uint(cx, v, col.1)).transpose()
    }
}

/// Decodes a sandbox row: `provider_id, name, task_id, generation, created_at, deadline,
/// source_snapshot, status, released_at`.
pub(super) fn decode_sandbox(path: &Path, row: &impl Columns) -> Result<SandboxRow, StoreError> {
    let mut cx = RowContext::new(path, "?", "sandboxes.task_id");
    cx.read_task(row, 2, "sandboxes.task_id")?;
    let status = row.text(&cx, (7, "sandboxes.status"))?;
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
        provider_id: row.text(&cx, (0, "sandboxes.provider_id"))?.into(),
        name: row.text(&cx, (1, "sandboxes.name"))?,
        task_id: cx.task()?,
        generation: row.uint(&cx, (3, "sandboxes.generation"))?,
        created_at: row.uint(&cx, (4, "sandboxes.created_at"))?,
        deadline: row.uint(&cx, (5, "sandboxes.deadline"))?,
        source_snapshot: row
            .opt_text(&cx, (6, "sandboxes.source_snapshot"))?
            .map(Into::into),
        status,
        released_at: row.opt_uint(&cx, (8, "sandboxes.released_at"))?,
    })
}

/// Decodes a snapshot row: `task_id, seq, provider_id, status, size_bytes, sandbox_id,
/// started_at, created_at, expires_at`.
pub(super) fn decode_snapshot(path: &Path, row: &impl Columns) -> Result<SnapshotRow, StoreError> {
    let mut cx = RowContext::new(path, "?", "snapshots.task_id");
    cx.read_task(row, 0, "snapshots.task_id")?;
    let seq = row.uint(&cx, (1, "snapshots.seq"))?;
    cx.seq = Some(seq);
    Ok(SnapshotRow {
        task_id: cx.task()?,
        seq,
        provider_id: row
            .opt_text(&cx, (2, "snapshots.provider_id"))?
            .map(Into::into),
        status: cx.name(row, 3, "snapshots.status")?,
        size_bytes: row.uint(&cx, (4, "snapshots.size_bytes"))?,
        sandbox_id: row.text(&cx, (5, "snapshots.sandbox_id"))?.into(),
        started_at: row.uint(&cx, (6, "snapshots.started_at"))?,
        created_at: row.opt_uint(&cx, (7, "snapshots.created_at"))?,
        expires_at: row.opt_uint(&cx, (8, "snapshots.expires_at"))?,
    })
}
