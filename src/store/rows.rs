//! Decoding rows back, for both stores: [`RowContext`] names the row and column of anything
//! corrupt, [`Columns`] is how a driver reads one typed column, and the decoders of tasks and
//! journal entries (and their checks: the task JSON against its columns) are written once on
//! top of them. (The sandbox and snapshot rows are tables only on PostgreSQL, whose `rows.rs`
//! decodes them.)

use std::path::Path;

use serde::de::DeserializeOwned;

use super::{JournalEntry, StoreError};
use crate::core::{Task, TaskState};
use crate::ids::TaskId;

/// A column to read: its index in the row and its name (`table.column`, for errors).
pub(crate) type Col = (usize, &'static str);

/// One row as a store's driver reads it: each read names the column (`table.column`) in the
/// [`StoreError::Corrupt`] it returns through `cx` (a NULL, a negative number or a wrong type).
pub(crate) trait Columns {
    /// A TEXT column.
    fn text(&self, cx: &RowContext<'_>, col: Col) -> Result<String, StoreError>;
    /// A TEXT column that may be NULL (read by PostgreSQL's rows; SQLite's store has no such
    /// column left to read, but its rows keep the trait whole).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn opt_text(&self, cx: &RowContext<'_>, col: Col) -> Result<Option<String>, StoreError>;
    /// The text of a JSON column, before it is parsed.
    fn json_text(&self, cx: &RowContext<'_>, col: Col) -> Result<&str, StoreError>;
    /// An integer column that must not be negative.
    fn uint(&self, cx: &RowContext<'_>, col: Col) -> Result<u64, StoreError>;
    /// An integer column that must not be negative, or NULL (as [`Columns::opt_text`]).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn opt_uint(&self, cx: &RowContext<'_>, col: Col) -> Result<Option<u64>, StoreError>;
}

/// Where a decoded value comes from, for [`StoreError::Corrupt`].
pub(crate) struct RowContext<'a> {
    /// The store's file, or its redacted URL.
    pub(crate) path: &'a Path,
    /// The row's task id as stored (validated by [`RowContext::task`]).
    pub(crate) task_id: String,
    /// The column it was read from.
    pub(crate) task_column: &'static str,
    /// The row's journal or snapshot seq, once read.
    pub(crate) seq: Option<u64>,
}

impl<'a> RowContext<'a> {
    /// A context naming the task `task_id` (`?` until a row's id is read), read from
    /// `task_column`.
    pub(crate) fn new(path: &'a Path, task_id: &str, task_column: &'static str) -> Self {
        RowContext {
            path,
            task_id: task_id.to_string(),
            task_column,
            seq: None,
        }
    }

    /// The error for a corrupt value in `column`.
    pub(crate) fn corrupt(
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

    /// Reads the row's task id from `column` (at `index`), to name it in later errors.
    pub(crate) fn read_task(
        &mut self,
        row: &impl Columns,
        index: usize,
        column: &'static str,
    ) -> Result<(), StoreError> {
        self.task_column = column;
        self.task_id = row.text(self, (index, column))?;
        Ok(())
    }

    /// The row's task id, validated (an id that is not one is corrupt: ids become paths).
    pub(crate) fn task(&self) -> Result<TaskId, StoreError> {
        TaskId::new(&self.task_id).map_err(|e| self.corrupt(self.task_column, e.to_string(), None))
    }

    /// A JSON column.
    pub(crate) fn json<T: DeserializeOwned>(
        &self,
        row: &impl Columns,
        index: usize,
        column: &'static str,
    ) -> Result<T, StoreError> {
        let text = row.json_text(self, (index, column))?;
        serde_json::from_str(text)
            .map_err(|e| self.corrupt(column, "invalid JSON for its type".to_string(), Some(e)))
    }

    /// A column holding a name of a core enum (a state, a snapshot status), decoded through
    /// serde so that it accepts exactly the names the core serializes.
    pub(crate) fn name<T: DeserializeOwned>(
        &self,
        row: &impl Columns,
        index: usize,
        column: &'static str,
    ) -> Result<T, StoreError> {
        let text = row.text(self, (index, column))?;
        serde_json::from_value(serde_json::Value::String(text.clone()))
            .map_err(|_| self.corrupt(column, format!("unknown name `{text}`"), None))
    }
}

/// Decodes a task's id, state and task JSON (`SELECT id, state, data FROM tasks` on PostgreSQL;
/// on SQLite the state is the task's last journal row's `state_after` and the JSON is rebuilt
/// from the journal: `state_column` and `data_column` name where they come from), checking that
/// the columns agree with the JSON (they are written together; a mismatch means the row was
/// edited by hand).
pub(crate) fn decode_task(
    path: &Path,
    row: &impl Columns,
    state_column: &'static str,
    data_column: &'static str,
) -> Result<Task, StoreError> {
    let mut cx = RowContext::new(path, "?", "tasks.id");
    cx.read_task(row, 0, "tasks.id")?;
    let state: TaskState = cx.name(row, 1, state_column)?;
    let task: Task = cx.json(row, 2, data_column)?;
    if task.id.as_str() != cx.task_id {
        return Err(cx.corrupt(
            data_column,
            format!("the JSON is of task `{}`", task.id),
            None,
        ));
    }
    if task.state != state {
        return Err(cx.corrupt(
            state_column,
            format!(
                "the column says `{state}` but the JSON says `{}`",
                task.state
            ),
            None,
        ));
    }
    Ok(task)
}

/// Decodes a journal row, its columns in the order `seq, task_id, task_seq, at, event,
/// state_before, state_after, commands, task_after`.
pub(crate) fn decode_journal(path: &Path, row: &impl Columns) -> Result<JournalEntry, StoreError> {
    let mut cx = RowContext::new(path, "?", "journal.task_id");
    cx.read_task(row, 1, "journal.task_id")?;
    let seq = row.uint(&cx, (0, "journal.seq"))?;
    cx.seq = Some(seq);
    Ok(JournalEntry {
        seq,
        task_id: cx.task()?,
        task_seq: row.uint(&cx, (2, "journal.task_seq"))?,
        at: row.uint(&cx, (3, "journal.at"))?,
        event: cx.json(row, 4, "journal.event")?,
        state_before: cx.name(row, 5, "journal.state_before")?,
        state_after: cx.name(row, 6, "journal.state_after")?,
        commands: cx.json(row, 7, "journal.commands")?,
        task_after: cx.json(row, 8, "journal.task_after")?,
    })
}
