//! Reading rows back: the installation id, and decoding tasks, journal entries and marks with
//! [`RowContext`], which names the row and column of anything corrupt.

use serde::de::DeserializeOwned;
use tokio_postgres::Row;

use super::PgStore;
use crate::core::{Task, TaskState};
use crate::ids::TaskId;
use crate::store::{JournalEntry, StoreError, TaskMarks};

/// The columns journal reads decode, in this order.
pub(super) const JOURNAL_COLUMNS: &str =
    "seq, task_id, task_seq, at, event, state_before, state_after, \
                               commands, task_after";

impl PgStore {
    pub(super) fn read_installation_id(&self) -> Result<String, StoreError> {
        let candidate = crate::store::schema::random_hex_128()?;
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

    pub(super) fn cx(&self, task_id: Option<&str>) -> RowContext<'_> {
        RowContext {
            target: self.target.redacted(),
            task_id: task_id.unwrap_or("?").to_string(),
            task_column: "tasks.id",
            seq: None,
        }
    }

    pub(super) fn decode_task(&self, row: &Row) -> Result<Task, StoreError> {
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

    pub(super) fn decode_journal(&self, rows: &[Row]) -> Result<Vec<JournalEntry>, StoreError> {
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

    pub(super) fn decode_marks(&self, row: &Row, first: usize) -> Result<TaskMarks, StoreError> {
        let cx = self.cx(None);
        Ok(TaskMarks {
            backend: cx.get(row, first, "tasks.backend")?,
            removed_at: cx.opt_uint(row, first + 1, "tasks.removed_at")?,
            kept_snapshots: cx
                .get::<Option<bool>>(row, first + 2, "tasks.kept_snapshots")?
                .unwrap_or(false),
        })
    }
}

/// Where a decoded value comes from, for [`StoreError::Corrupt`].
pub(super) struct RowContext<'a> {
    pub(super) target: &'a str,
    /// The row's task id as stored (validated by [`RowContext::task`]).
    pub(super) task_id: String,
    /// The column it was read from.
    pub(super) task_column: &'static str,
    pub(super) seq: Option<u64>,
}

impl RowContext<'_> {
    pub(super) fn corrupt(
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

    pub(super) fn get<'r, T: tokio_postgres::types::FromSql<'r>>(
        &self,
        row: &'r Row,
        index: usize,
        column: &'static str,
    ) -> Result<T, StoreError> {
        row.try_get(index)
            .map_err(|e| self.corrupt(column, e.to_string(), None))
    }

    /// Reads the row's task id from `column` (at `index`), to name it in later errors.
    pub(super) fn read_task(
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
    pub(super) fn task(&self) -> Result<TaskId, StoreError> {
        TaskId::new(&self.task_id).map_err(|e| self.corrupt(self.task_column, e.to_string(), None))
    }

    /// A BIGINT that must not be negative.
    pub(super) fn uint(
        &self,
        row: &Row,
        index: usize,
        column: &'static str,
    ) -> Result<u64, StoreError> {
        let v: i64 = self.get(row, index, column)?;
        u64::try_from(v).map_err(|_| self.corrupt(column, format!("negative value {v}"), None))
    }

    pub(super) fn opt_uint(
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

    pub(super) fn json<T: DeserializeOwned>(
        &self,
        row: &Row,
        index: usize,
        column: &'static str,
    ) -> Result<T, StoreError> {
        let text: &str = self.get(row, index, column)?;
        serde_json::from_str(text)
            .map_err(|e| self.corrupt(column, "invalid JSON for its type".to_string(), Some(e)))
    }

    pub(super) fn name<T: DeserializeOwned>(
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
