//! The schema, its append-only migrations, and opening a connection with the pragmas the
//! engine's durability depends on.
//!
//! Migrations are keyed by `PRAGMA user_version`: migration `i` (0-based) takes the file from
//! version `i` to `i + 1`. Never edit or reorder an entry once released — append a new one. A
//! file whose version is newer than `MIGRATIONS.len()` was written by a newer taskbox and is
//! refused before anything is written to it.

use std::fs;
use std::path::Path;

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::store::error::{StoreError, BUSY_TIMEOUT};

/// The schema, one migration per entry, applied in order, each in its own transaction.
///
/// Why so few CHECKs:
/// - enum names (task states, snapshot statuses) belong to the core and may grow; a CHECK would
///   force rebuilding the append-only journal to admit a new name;
/// - the JSON columns are always written from serde output, valid by construction, and a
///   `json_valid` CHECK would parse every document again on every commit (measured: about a
///   tenth of a commit's CPU time).
///
/// Reads decode every value and report a bad one as corrupt data instead. The task id CHECK
/// stays: ids become directory and sandbox names, and an unsafe one must never be stored.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    r#"
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY NOT NULL,
        value TEXT NOT NULL
    ) WITHOUT ROWID;

    CREATE TABLE tasks (
        id         TEXT PRIMARY KEY NOT NULL CHECK (
                       length(id) BETWEEN 1 AND 64
                       AND id GLOB '[A-Za-z0-9]*'
                       AND id NOT GLOB '*[^A-Za-z0-9_-]*'),
        state      TEXT NOT NULL,
        data       TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );

    CREATE TABLE journal (
        seq          INTEGER PRIMARY KEY AUTOINCREMENT,
        task_id      TEXT NOT NULL REFERENCES tasks(id),
        task_seq     INTEGER NOT NULL CHECK (task_seq >= 1),
        at           INTEGER NOT NULL,
        event_name   TEXT NOT NULL,
        event        TEXT NOT NULL,
        state_before TEXT NOT NULL,
        state_after  TEXT NOT NULL,
        commands     TEXT NOT NULL,
        task_after   TEXT NOT NULL
    );
    CREATE UNIQUE INDEX journal_task_seq ON journal(task_id, task_seq);

    -- The journal is the write-ahead log and the replay record: history is never rewritten.
    CREATE TRIGGER journal_no_update BEFORE UPDATE ON journal
    BEGIN
        SELECT RAISE(ABORT, 'the journal is append-only: UPDATE refused');
    END;
    CREATE TRIGGER journal_no_delete BEFORE DELETE ON journal
    BEGIN
        SELECT RAISE(ABORT, 'the journal is append-only: DELETE refused');
    END;

    CREATE TABLE snapshots (
        task_id     TEXT NOT NULL REFERENCES tasks(id),
        seq         INTEGER NOT NULL,
        provider_id TEXT,
        status      TEXT NOT NULL,
        size_bytes  INTEGER NOT NULL,
        sandbox_id  TEXT NOT NULL,
        started_at  INTEGER NOT NULL,
        created_at  INTEGER,
        expires_at  INTEGER,
        PRIMARY KEY (task_id, seq)
    ) WITHOUT ROWID;
    CREATE INDEX snapshots_provider_id ON snapshots(provider_id) WHERE provider_id IS NOT NULL;

    CREATE TABLE sandboxes (
        provider_id     TEXT PRIMARY KEY NOT NULL,
        name            TEXT NOT NULL,
        task_id         TEXT NOT NULL REFERENCES tasks(id),
        generation      INTEGER NOT NULL,
        created_at      INTEGER NOT NULL,
        deadline        INTEGER NOT NULL,
        source_snapshot TEXT,
        status          TEXT NOT NULL CHECK (status IN ('running', 'released')),
        released_at     INTEGER,
        CHECK ((status = 'released') = (released_at IS NOT NULL))
    ) WITHOUT ROWID;
    CREATE INDEX sandboxes_task ON sandboxes(task_id, status);
    "#,
    // 2: what the core does not know about a task: the backend that holds its sandboxes and
    // snapshots (NULL in stores written before: the next process to load the task records its
    // own), and whether `taskbox rm` removed it (and kept its snapshots).
    r#"
    ALTER TABLE tasks ADD COLUMN backend TEXT;
    ALTER TABLE tasks ADD COLUMN removed_at INTEGER;
    ALTER TABLE tasks ADD COLUMN kept_snapshots INTEGER;
    "#,
    // 3: the journal without `AUTOINCREMENT`, whose `sqlite_sequence` update every append paid.
    // Seqs still only grow: a rowid table without AUTOINCREMENT reuses a seq only after its
    // largest row is deleted, and the triggers refuse every DELETE. The rows are copied with
    // their seqs; the index and the triggers are made again.
    r#"
    CREATE TABLE journal_v3 (
        seq          INTEGER PRIMARY KEY,
        task_id      TEXT NOT NULL REFERENCES tasks(id),
        task_seq     INTEGER NOT NULL CHECK (task_seq >= 1),
        at           INTEGER NOT NULL,
        event_name   TEXT NOT NULL,
        event        TEXT NOT NULL,
        state_before TEXT NOT NULL,
        state_after  TEXT NOT NULL,
        commands     TEXT NOT NULL,
        task_after   TEXT NOT NULL
    );
    INSERT INTO journal_v3 (seq, task_id, task_seq, at, event_name, event, state_before,
                            state_after, commands, task_after)
        SELECT seq, task_id, task_seq, at, event_name, event, state_before, state_after,
               commands, task_after
        FROM journal ORDER BY seq;
    DROP TABLE journal;
    ALTER TABLE journal_v3 RENAME TO journal;
    CREATE UNIQUE INDEX journal_task_seq ON journal(task_id, task_seq);
    CREATE TRIGGER journal_no_update BEFORE UPDATE ON journal
    BEGIN
        SELECT RAISE(ABORT, 'the journal is append-only: UPDATE refused');
    END;
    CREATE TRIGGER journal_no_delete BEFORE DELETE ON journal
    BEGIN
        SELECT RAISE(ABORT, 'the journal is append-only: DELETE refused');
    END;
    "#,
    // 4: journal rows that store what changed (`sqlite/delta.rs`). NULL: `task_after` is the
    // whole task (every row written before); otherwise it is a delta against the task's row
    // before, and `task_key` is the `task_seq` of the keyframe the chain of deltas starts from.
    r#"
    ALTER TABLE journal ADD COLUMN task_key INTEGER
        CHECK (task_key IS NULL OR (task_key >= 1 AND task_key < task_seq));
    "#,
    // 5: the task row holds the task's state, not the task: its journal holds it (the chain
    // of the last row rebuilds it, `sqlite/rows.rs`), so a commit no longer writes a whole task
    // per task per batch. Until now `data` held the task after the task's last journal row:
    // `migrate` checks that every row's is the one its journal rebuilds before dropping it.
    r#"
    ALTER TABLE tasks DROP COLUMN data;
    "#,
    // 6: the sandboxes' index by task without their status, which releasing a sandbox changes
    // (its entry was rewritten on every release). A task has few sandboxes: reading its
    // `running` ones through the task alone costs nothing.
    r#"
    DROP INDEX sandboxes_task;
    CREATE INDEX sandboxes_by_task ON sandboxes(task_id);
    "#,
    // 7: a commit writes the journal (and a new task's row), not tables that repeat it. The
    // sandbox and snapshot rows are read from the tasks' journals (`sqlite/derived.rs`), which
    // hold everything the tables held; who retains a snapshot is found through the forks that share it: `fork_shares`
    // (a fork, the snapshot it started from, its parent), written by a fork's first row and
    // filled here from every row that names a lineage (a keyframe, or the delta that set it).
    // The task row keeps what the journal does not hold (its backend, its removal): a task's
    // state is its last journal row's `state_after`, so the row's `state` and `updated_at`,
    // which every batch rewrote, go too.
    r#"
    CREATE TABLE fork_shares (
        snapshot TEXT NOT NULL,
        child    TEXT NOT NULL REFERENCES tasks(id),
        parent   TEXT NOT NULL,
        PRIMARY KEY (snapshot, child)
    ) WITHOUT ROWID;
    INSERT OR IGNORE INTO fork_shares (snapshot, child, parent)
        SELECT json_extract(task_after, '$.lineage.snapshot'), task_id,
               json_extract(task_after, '$.lineage.parent')
        FROM journal
        WHERE instr(task_after, '"lineage":') > 0
          AND json_type(task_after, '$.lineage') = 'object';
    DROP TABLE snapshots;
    DROP TABLE sandboxes;
    ALTER TABLE tasks DROP COLUMN state;
    ALTER TABLE tasks DROP COLUMN updated_at;
    "#,
];

/// The schema version this build writes.
pub(crate) fn supported_version() -> i64 {
    MIGRATIONS.len() as i64
}

/// Whether opening may create the store file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Create {
    /// Create the file and its parent directories when missing.
    Yes,
    /// Refuse a missing file with [`StoreError::Missing`].
    No,
}

/// Opens `path` (creating it and its parent directories if `create` says so), checks that it is
/// a store this build understands, sets the connection up and brings the schema up to date.
// The store is the one module allowed to open SQLite connections (clippy.toml).
#[allow(clippy::disallowed_methods)]
pub(crate) fn open(path: &Path, create: Create) -> Result<Connection, StoreError> {
    let open_err = |source| StoreError::Open {
        path: path.to_path_buf(),
        source: Box::new(source),
    };
    let conn = match create {
        Create::Yes => {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs::create_dir_all(parent).map_err(|source| StoreError::CreateDir {
                    path: parent.to_path_buf(),
                    source,
                })?;
            }
            Connection::open(path).map_err(open_err)?
        }
        Create::No => {
            // When existence cannot be told (a permission problem), SQLite's error says more.
            if matches!(path.try_exists(), Ok(false)) {
                return Err(StoreError::Missing {
                    path: path.to_path_buf(),
                });
            }
            // rusqlite's default flags without CREATE: a file removed since the check above
            // is an error here rather than a new, empty store.
            let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_URI
                | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            Connection::open_with_flags(path, flags).map_err(open_err)?
        }
    };
    // Set first: every later statement, the WAL switch and the migrations included, may meet
    // another taskbox process holding the write lock and must wait for it rather than fail.
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;

    // The first read of the file is where SQLite notices it is not a database. Checking the
    // version before anything is written leaves a newer store untouched.
    let version = user_version(&conn).map_err(|e| classify_open(path, e))?;
    check_version(path, version)?;

    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(|e| classify_open(path, e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::WalUnavailable {
            path: path.to_path_buf(),
            mode,
        });
    }
    // FULL: in WAL mode, NORMAL may lose the last commits on power loss; the journal is the
    // engine's write-ahead log, so a commit must be on disk before its commands are performed.
    // (`Store::commit_batch_with(…, Sync::WithNext)` lowers it for one transaction that calls no
    // provider; the next FULL commit syncs it.)
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(open_err)?;
    conn.pragma_update(None, "foreign_keys", true)
        .map_err(open_err)?;
    // Room for every statement the store prepares, so none is re-prepared on the hot path.
    conn.set_prepared_statement_cache_capacity(64);

    migrate(&conn, path)?;
    Ok(conn)
}

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
}

fn check_version(path: &Path, found: i64) -> Result<(), StoreError> {
    if found > supported_version() {
        return Err(StoreError::TooNew {
            path: path.to_path_buf(),
            found,
            supported: supported_version(),
        });
    }
    Ok(())
}

fn classify_open(path: &Path, source: rusqlite::Error) -> StoreError {
    match source.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => StoreError::NotADatabase {
            path: path.to_path_buf(),
        },
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            StoreError::sql(path, "opening the store", None, source)
        }
        _ => StoreError::Open {
            path: path.to_path_buf(),
            source: Box::new(source),
        },
    }
}

/// Applies the missing migrations, each in its own IMMEDIATE transaction. The version is read
/// again inside the transaction because another process may have migrated in the meantime.
fn migrate(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    for (index, sql) in MIGRATIONS.iter().enumerate() {
        let version = index as i64 + 1;
        let mig_err = |source| StoreError::Migrate {
            path: path.to_path_buf(),
            version,
            source: Box::new(source),
        };
        if user_version(conn).map_err(mig_err)? >= version {
            continue;
        }
        let tx = rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
            .map_err(|e| classify_open(path, e))?;
        let current = user_version(&tx).map_err(mig_err)?;
        check_version(path, current)?;
        if current >= version {
            continue;
        }
        if version == 5 {
            super::rows::check_rows_before_5(&tx, path)?;
        }
        tx.execute_batch(sql).map_err(mig_err)?;
        tx.pragma_update(None, "user_version", version)
            .map_err(mig_err)?;
        tx.commit().map_err(mig_err)?;
    }
    Ok(())
}

/// Reads the installation id, creating it on first open: 128 random bits from `/dev/urandom`
/// as lowercase hex, then never changed.
pub(crate) fn installation_id(conn: &Connection, path: &Path) -> Result<String, StoreError> {
    const SELECT: &str = "SELECT value FROM meta WHERE key = 'installation_id'";
    let op = "reading the installation id";
    let err = |e| StoreError::sql(path, op, None, e);
    if let Some(id) = conn
        .query_row(SELECT, [], |r| r.get(0))
        .optional()
        .map_err(err)?
    {
        return Ok(id);
    }
    let tx =
        rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate).map_err(err)?;
    // Another process may have created it between the read above and taking the lock.
    if let Some(id) = tx
        .query_row(SELECT, [], |r| r.get(0))
        .optional()
        .map_err(err)?
    {
        return Ok(id);
    }
    let id = crate::store::random_hex_128()?;
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ('installation_id', ?1)",
        [&id],
    )
    .map_err(err)?;
    tx.commit().map_err(err)?;
    Ok(id)
}
