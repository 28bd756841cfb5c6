//! Reading rows back: running a query, and the [`Columns`] reads of a SQLite row that the
//! shared decoders (`store/rows.rs`) and the marks here decode with.

use rusqlite::types::FromSql;
use rusqlite::Row;

use super::SqliteStore;
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

    pub(super) fn query_journal(
        &self,
        sql: &str,
        params: &[&dyn rusqlite::ToSql],
        task_id: &str,
    ) -> Result<Vec<JournalEntry>, StoreError> {
        self.query_rows("reading the journal", sql, params, Some(task_id), |row| {
            rows::decode_journal(&self.path, row)
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
