//! Reading rows back: running a query and decoding tasks and journal entries with
//! [`RowContext`], which names the row and column of anything corrupt.

use std::path::Path;

use rusqlite::types::FromSql;
use rusqlite::Row;
use serde::de::DeserializeOwned;

use super::SqliteStore;
use crate::core::{Task, TaskState};
use crate::ids::TaskId;
use crate::store::{JournalEntry, StoreError};

impl SqliteStore {
    /// Starts decoding a row by reading its task id (`task_id_column` is `table.column`).
    pub(super) fn row_context(
        &self,
        row: &Row<'_>,
        task_id_column: &'static str,
        task_id_index: usize,
    ) -> Result<RowContext<'_>, StoreError> {
        let mut cx = RowContext {
            path: &self.path,
            task_id: "?".to_string(),
            task_column: task_id_column,
            seq: None,
        };
        cx.task_id = cx.get(row, task_id_index, task_id_column)?;
        Ok(cx)
    }

    /// Decodes `SELECT id, state, data FROM tasks`, checking that the columns agree with the
    /// JSON (they are written together; a mismatch means the row was edited by hand).
    pub(super) fn decode_task(&self, row: &Row<'_>) -> Result<Task, StoreError> {
        let cx = self.row_context(row, "tasks.id", 0)?;
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

    pub(super) fn query_journal(
        &self,
        sql: &str,
        params: &[&dyn rusqlite::ToSql],
        task_id: &str,
    ) -> Result<Vec<JournalEntry>, StoreError> {
        self.query_rows("reading the journal", sql, params, Some(task_id), |row| {
            let mut cx = self.row_context(row, "journal.task_id", 1)?;
            let seq: u64 = cx.get(row, 0, "journal.seq")?;
            cx.seq = Some(seq);
            Ok(JournalEntry {
                seq,
                task_id: cx.task()?,
                task_seq: cx.get(row, 2, "journal.task_seq")?,
                at: cx.get(row, 3, "journal.at")?,
                event: cx.json(row, 4, "journal.event")?,
                state_before: cx.name(row, 5, "journal.state_before")?,
                state_after: cx.name(row, 6, "journal.state_after")?,
                commands: cx.json(row, 7, "journal.commands")?,
                task_after: cx.json(row, 8, "journal.task_after")?,
            })
        })
    }

    /// Runs `sql` (`operation` names it in errors, with `task_id`) and decodes each row with
    /// `decode`, in order.
    pub(super) fn query_rows<T>(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&dyn rusqlite::ToSql],
        task_id: Option<&str>,
        mut decode: impl FnMut(&Row<'_>) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let err = |e| self.sql(operation, task_id, e);
        let mut stmt = self.conn.prepare_cached(sql).map_err(err)?;
        let mut rows = stmt.query(params).map_err(err)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(err)? {
            out.push(decode(row)?);
        }
        Ok(out)
    }
}

/// Where a decoded value comes from, for [`StoreError::Corrupt`].
pub(super) struct RowContext<'a> {
    pub(super) path: &'a Path,
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
            path: self.path.to_path_buf(),
            task_id: self.task_id.clone(),
            column,
            seq: self.seq,
            reason,
            source,
        }
    }

    /// A column of a plain SQL type (a NULL, a negative number or a wrong type is corrupt).
    pub(super) fn get<T: FromSql>(
        &self,
        row: &Row<'_>,
        index: usize,
        column: &'static str,
    ) -> Result<T, StoreError> {
        row.get(index)
            .map_err(|e| self.corrupt(column, e.to_string(), None))
    }

    /// The row's task id, validated (an id that is not one is corrupt: ids become paths).
    pub(super) fn task(&self) -> Result<TaskId, StoreError> {
        TaskId::new(&self.task_id).map_err(|e| self.corrupt(self.task_column, e.to_string(), None))
    }

    /// A JSON column.
    pub(super) fn json<T: DeserializeOwned>(
        &self,
        row: &Row<'_>,
        index: usize,
        column: &'static str,
    ) -> Result<T, StoreError> {
        let text = row
            .get_ref(index)
            .and_then(|v| v.as_str().map_err(Into::into))
            .map_err(|e| self.corrupt(column, e.to_string(), None))?;
        serde_json::from_str(text)
            .map_err(|e| self.corrupt(column, "invalid JSON for its type".to_string(), Some(e)))
    }

    /// A column holding a name of a core enum (a state, a snapshot status), decoded through
    /// serde so that it accepts exactly the names the core serializes.
    pub(super) fn name<T: DeserializeOwned>(
        &self,
        row: &Row<'_>,
        index: usize,
        column: &'static str,
    ) -> Result<T, StoreError> {
        let text: String = self.get(row, index, column)?;
        serde_json::from_value(serde_json::Value::String(text.clone()))
            .map_err(|_| self.corrupt(column, format!("unknown name `{text}`"), None))
    }
}
