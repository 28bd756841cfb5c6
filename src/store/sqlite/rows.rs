//! Reading rows back: running a query, and the [`Columns`] reads of a SQLite row that the
//! shared decoders (`store/rows.rs`) and the marks here decode with.

use std::path::Path;

use rusqlite::types::FromSql;
use rusqlite::Row;

use super::{delta, SqliteStore};
use crate::core::Task;
use crate::store::rows::{self, Col, Columns, RowContext};
use crate::store::{JournalEntry, StoreError};

impl SqliteStore {
    /// Starts decoding a row by reading its task id (`task_id_column` is `table.column`).
    pub(super) fn row_context(
        &self,
        row: &Row<'_>,
        task_id_column: &'static str,
        task_id_index: usize,
    ) -> Result<RowContext<'_>, StoreError> {
        let mut cx = RowContext::new(&self.path, "?", task_id_column);
        cx.read_task(row, task_id_index, task_id_column)?;
        Ok(cx)
    }

    /// Reads one task's journal rows, which `sql` selects (`JOURNAL_COLUMNS`, then `task_key`)
    /// in `task_seq` order without gaps, rebuilding the whole task of each delta row from the
    /// row before ([`super::delta`]). Rows before `from` (a `task_seq`) are read only to
    /// rebuild the ones after: they are not decoded or returned.
    pub(super) fn query_journal(
        &self,
        sql: &str,
        params: &[&dyn rusqlite::ToSql],
        task_id: &str,
        from: u64,
    ) -> Result<Vec<JournalEntry>, StoreError> {
        let mut chain = Chain::default();
        let mut out = Vec::new();
        self.query_rows("reading the journal", sql, params, Some(task_id), |row| {
            let mut cx = self.row_context(row, "journal.task_id", 1)?;
            cx.seq = Some(get(&cx, row, 0, "journal.seq")?);
            // A bad task id is reported as such before its rows are put together.
            cx.task()?;
            let task_seq: u64 = get(&cx, row, 2, "journal.task_seq")?;
            let key: Option<u64> = get(&cx, row, 9, "journal.task_key")?;
            let text = row.json_text(&cx, (8, "journal.task_after"))?;
            chain.next(&cx, task_seq, key, text)?;
            if task_seq >= from {
                let rebuilt = Rebuilt {
                    row,
                    task_after: &chain.text,
                };
                out.push(rows::decode_journal(&self.path, &rebuilt)?);
            }
            Ok(())
        })?;
        Ok(out)
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

/// Reads tasks with `sql` ([`super::LOAD_TASKS`], ordered by task id and then `task_seq`): each
/// task rebuilt from its journal's rows from the keyframe its last row's chain starts from,
/// decoded and checked against its row. On `conn`, which need not be a store's yet (migration
/// 5 checks with it); `operation` names the read in errors.
pub(crate) fn query_tasks(
    conn: &rusqlite::Connection,
    path: &Path,
    operation: &'static str,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
    task_id: Option<&str>,
) -> Result<Vec<Task>, StoreError> {
    let err = |e| StoreError::sql(path, operation, task_id, e);
    let mut stmt = conn.prepare_cached(sql).map_err(err)?;
    let mut rows = stmt.query(params).map_err(err)?;
    let mut tasks = Vec::new();
    let mut loading: Option<Loading> = None;
    while let Some(row) = rows.next().map_err(err)? {
        let mut cx = RowContext::new(path, "?", "tasks.id");
        cx.read_task(row, 0, "tasks.id")?;
        if loading.as_ref().is_none_or(|l| l.id != cx.task_id) {
            if let Some(done) = loading.take() {
                tasks.push(done.finish(path)?);
            }
            loading = Some(Loading {
                id: cx.task_id.clone(),
                state: String::new(),
                chain: Chain::default(),
            });
        }
        let l = loading.as_mut().expect("set above");
        let Some(task_seq) = get::<Option<u64>>(&cx, row, 2, "journal.task_seq")? else {
            return Err(cx.corrupt(
                "journal.task_id",
                "the task has a row but no journal row holds it".to_string(),
                None,
            ));
        };
        cx.seq = Some(task_seq);
        // The task's state is its last row's (the rows come in `task_seq` order).
        l.state = get(&cx, row, 1, "journal.state_after")?;
        let key: Option<u64> = get(&cx, row, 3, "journal.task_key")?;
        let text = row.json_text(&cx, (4, "journal.task_after"))?;
        l.chain.next(&cx, task_seq, key, text)?;
    }
    if let Some(done) = loading {
        tasks.push(done.finish(path)?);
    }
    Ok(tasks)
}

/// A column of a plain SQL type (a NULL, a negative number or a wrong type is corrupt).
pub(super) fn get<T: FromSql>(
    cx: &RowContext<'_>,
    row: &Row<'_>,
    index: usize,
    column: &'static str,
) -> Result<T, StoreError> {
    row.get(index)
        .map_err(|e| cx.corrupt(column, e.to_string(), None))
}

impl Columns for Row<'_> {
    fn text(&self, cx: &RowContext<'_>, col: Col) -> Result<String, StoreError> {
        get(cx, self, col.0, col.1)
    }

    fn opt_text(&self, cx: &RowContext<'_>, col: Col) -> Result<Option<String>, StoreError> {
        get(cx, self, col.0, col.1)
    }

    fn json_text(&self, cx: &RowContext<'_>, col: Col) -> Result<&str, StoreError> {
        self.get_ref(col.0)
            .and_then(|v| v.as_str().map_err(Into::into))
            .map_err(|e| cx.corrupt(col.1, e.to_string(), None))
    }

    fn uint(&self, cx: &RowContext<'_>, col: Col) -> Result<u64, StoreError> {
        get(cx, self, col.0, col.1)
    }

    fn opt_uint(&self, cx: &RowContext<'_>, col: Col) -> Result<Option<u64>, StoreError> {
        get(cx, self, col.0, col.1)
    }
}

/// One task's journal rows read in `task_seq` order: the whole task text of the row read last.
#[derive(Default)]
struct Chain {
    /// The `task_seq` of the row read last (`None`: none yet).
    seq: Option<u64>,
    /// That row's whole task text.
    text: String,
}

impl Chain {
    /// Reads the row `task_seq` (`key`: its `task_key`; `text`: its `task_after`): a keyframe
    /// replaces the text, a delta is applied to the row read just before it ([`super::delta`]).
    fn next(
        &mut self,
        cx: &RowContext<'_>,
        task_seq: u64,
        key: Option<u64>,
        text: &str,
    ) -> Result<(), StoreError> {
        match (self.seq, key) {
            (_, None) => {
                self.text.clear();
                self.text.push_str(text);
            }
            (Some(before), Some(_)) if before + 1 == task_seq => {
                let mut whole = String::new();
                delta::apply(&self.text, text, &mut whole)
                    .map_err(|e| cx.corrupt("journal.task_after", e, None))?;
                self.text = whole;
            }
            (before, Some(key)) => {
                return Err(cx.corrupt(
                    "journal.task_after",
                    format!(
                        "a delta against the task's row {}, which was not read before it \
                         (its chain starts at row {key}; the row read before: {before:?})",
                        task_seq.saturating_sub(1)
                    ),
                    None,
                ))
            }
        }
        self.seq = Some(task_seq);
        Ok(())
    }
}

/// A task being read by `query_tasks`: its row's id, its last journal row's state, and its
/// journal's rows.
struct Loading {
    id: String,
    state: String,
    chain: Chain,
}

impl Loading {
    /// Decodes the task, checked against its row's columns.
    fn finish(self, path: &Path) -> Result<Task, StoreError> {
        rows::decode_task(path, &self, "journal.state_after", "journal.task_after")
    }
}

/// The columns `rows::decode_task` reads: `id, state, data`, the data rebuilt from the journal.
impl Columns for Loading {
    fn text(&self, cx: &RowContext<'_>, col: Col) -> Result<String, StoreError> {
        match col.0 {
            0 => Ok(self.id.clone()),
            1 => Ok(self.state.clone()),
            _ => Err(cx.corrupt(col.1, "not a text column".to_string(), None)),
        }
    }

    fn opt_text(&self, cx: &RowContext<'_>, col: Col) -> Result<Option<String>, StoreError> {
        self.text(cx, col).map(Some)
    }

    fn json_text(&self, cx: &RowContext<'_>, col: Col) -> Result<&str, StoreError> {
        match col.0 {
            2 => Ok(&self.chain.text),
            _ => Err(cx.corrupt(col.1, "not a JSON column".to_string(), None)),
        }
    }

    fn uint(&self, cx: &RowContext<'_>, col: Col) -> Result<u64, StoreError> {
        Err(cx.corrupt(col.1, "not an integer column".to_string(), None))
    }

    fn opt_uint(&self, cx: &RowContext<'_>, col: Col) -> Result<Option<u64>, StoreError> {
        self.uint(cx, col).map(Some)
    }
}

/// A journal row whose `task_after` (column 8) was rebuilt from a delta.
struct Rebuilt<'r, 's> {
    row: &'r Row<'s>,
    task_after: &'r str,
}

impl Columns for Rebuilt<'_, '_> {
    fn text(&self, cx: &RowContext<'_>, col: Col) -> Result<String, StoreError> {
        self.row.text(cx, col)
    }

    fn opt_text(&self, cx: &RowContext<'_>, col: Col) -> Result<Option<String>, StoreError> {
        self.row.opt_text(cx, col)
    }

    fn json_text(&self, cx: &RowContext<'_>, col: Col) -> Result<&str, StoreError> {
        if col.0 == 8 {
            Ok(self.task_after)
        } else {
            self.row.json_text(cx, col)
        }
    }

    fn uint(&self, cx: &RowContext<'_>, col: Col) -> Result<u64, StoreError> {
        self.row.uint(cx, col)
    }

    fn opt_uint(&self, cx: &RowContext<'_>, col: Col) -> Result<Option<u64>, StoreError> {
        self.row.opt_uint(cx, col)
    }
}

/// Before migration 5 drops `tasks.data`: checks on `conn` (inside the migration's transaction)
/// that every task row's `data` is the task its journal rebuilds, so that dropping it loses
/// nothing. Refuses with [`StoreError::TaskRowDisagrees`] otherwise.
pub(crate) fn check_rows_before_5(
    conn: &rusqlite::Connection,
    path: &Path,
) -> Result<(), StoreError> {
    let op = "checking the task rows before migration 5";
    let ids_and_data: Vec<(String, String)> = conn
        .prepare("SELECT id, data FROM tasks ORDER BY id")
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()
        })
        .map_err(|e| StoreError::sql(path, op, None, e))?;
    let sql = format!("{} WHERE t.id = ?1 ORDER BY j.task_seq", super::LOAD_TASKS);
    for (id, data) in ids_and_data {
        let disagree = |reason: String| StoreError::TaskRowDisagrees {
            path: path.to_path_buf(),
            task_id: id.clone(),
            reason,
        };
        let row: Task = serde_json::from_str(&data)
            .map_err(|e| disagree(format!("its row's data does not decode: {e}")))?;
        let rebuilt = query_tasks(conn, path, op, &sql, rusqlite::params![id], Some(&id))
            .map_err(|e| disagree(format!("its journal does not read back: {e}")))?;
        match rebuilt.as_slice() {
            [task] if *task == row => {}
            [task] => {
                return Err(disagree(format!(
                    "the row's task is in state `{}` at request {}, the journal's in state `{}` \
                     at request {}",
                    row.state, row.last_request_id, task.state, task.last_request_id
                )))
            }
            _ => return Err(disagree("its journal does not read back".to_string())),
        }
    }
    Ok(())
}
