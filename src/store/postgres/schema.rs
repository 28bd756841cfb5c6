//! The PostgreSQL schema and its append-only migrations.
//!
//! Migration `i` (0-based) takes the database from version `i` to `i + 1`; the version is the
//! one row of `taskbox_schema`. Never edit or reorder an entry once released — append one.
//! Every server of a fleet runs the migrations on start: each runs in its own transaction
//! under a transaction-scoped advisory lock, and reads the version again under it, so two
//! servers starting together apply each migration once. A database whose version is newer
//! than this build's is refused before anything is written to it.
//!
//! The tables are those of the SQLite store (`src/store/schema.rs`) with the same columns, and
//! the same reasons for few CHECKs; ids are `COLLATE "C"` so that orderings are bytewise, as in
//! SQLite. A commit is one call of `taskbox_commit` per transition (the state check, the task
//! row, the journal row and the mirrored rows on the server: one round trip each).

/// The key of the advisory lock that migrations take (`pg_advisory_xact_lock`).
pub(super) const MIGRATION_LOCK: i64 = 0x7461_736b_626f_7801; // "taskbox" 01

/// The schema, one migration per entry.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: the schema of SQLite's migrations 1 and 2, and the commit function.
    r#"
    CREATE TABLE meta (
        key   TEXT COLLATE "C" PRIMARY KEY,
        value TEXT NOT NULL
    );

    CREATE TABLE tasks (
        id             TEXT COLLATE "C" PRIMARY KEY
                       CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$'),
        state          TEXT NOT NULL,
        data           TEXT NOT NULL,
        created_at     BIGINT NOT NULL,
        updated_at     BIGINT NOT NULL,
        backend        TEXT,
        removed_at     BIGINT,
        kept_snapshots BOOLEAN
    );

    CREATE TABLE journal (
        seq          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        task_id      TEXT COLLATE "C" NOT NULL REFERENCES tasks(id),
        task_seq     BIGINT NOT NULL CHECK (task_seq >= 1),
        at           BIGINT NOT NULL,
        event_name   TEXT NOT NULL,
        event        TEXT NOT NULL,
        state_before TEXT NOT NULL,
        state_after  TEXT NOT NULL,
        commands     TEXT NOT NULL,
        task_after   TEXT NOT NULL
    );
    CREATE UNIQUE INDEX journal_task_seq ON journal(task_id, task_seq);

    -- The journal is the write-ahead log and the replay record: history is never rewritten.
    CREATE FUNCTION taskbox_journal_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'the journal is append-only: % refused', TG_OP;
    END
    $$;
    CREATE TRIGGER journal_no_update BEFORE UPDATE OR DELETE ON journal
        FOR EACH ROW EXECUTE FUNCTION taskbox_journal_append_only();
    CREATE TRIGGER journal_no_truncate BEFORE TRUNCATE ON journal
        FOR EACH STATEMENT EXECUTE FUNCTION taskbox_journal_append_only();

    CREATE TABLE snapshots (
        task_id     TEXT COLLATE "C" NOT NULL REFERENCES tasks(id),
        seq         BIGINT NOT NULL,
        provider_id TEXT,
        status      TEXT NOT NULL,
        size_bytes  BIGINT NOT NULL,
        sandbox_id  TEXT NOT NULL,
        started_at  BIGINT NOT NULL,
        created_at  BIGINT,
        expires_at  BIGINT,
        PRIMARY KEY (task_id, seq)
    );
    CREATE INDEX snapshots_provider_id ON snapshots(provider_id) WHERE provider_id IS NOT NULL;

    CREATE TABLE sandboxes (
        provider_id     TEXT COLLATE "C" PRIMARY KEY,
        name            TEXT NOT NULL,
        task_id         TEXT COLLATE "C" NOT NULL REFERENCES tasks(id),
        generation      BIGINT NOT NULL,
        created_at      BIGINT NOT NULL,
        deadline        BIGINT NOT NULL,
        source_snapshot TEXT,
        status          TEXT NOT NULL CHECK (status IN ('running', 'released')),
        released_at     BIGINT,
        CHECK ((status = 'released') = (released_at IS NOT NULL))
    );
    CREATE INDEX sandboxes_task ON sandboxes(task_id, status);

    -- One transition: refused with SQLSTATE TB001 (message: the stored state) when the stored
    -- state is not p_state_before, with TB002 (message: the owner) when the sandbox belongs to
    -- another task. Returns the journal seq.
    CREATE FUNCTION taskbox_commit(
        p_id TEXT, p_state_before TEXT, p_state TEXT, p_data TEXT, p_created_at BIGINT,
        p_at BIGINT, p_event_name TEXT, p_event TEXT, p_commands TEXT,
        p_snap_seq BIGINT[], p_snap_provider TEXT[], p_snap_status TEXT[], p_snap_size BIGINT[],
        p_snap_sandbox TEXT[], p_snap_started BIGINT[], p_snap_created BIGINT[],
        p_snap_expires BIGINT[],
        p_sb_id TEXT, p_sb_name TEXT, p_sb_generation BIGINT, p_sb_created BIGINT,
        p_sb_deadline BIGINT, p_sb_source TEXT
    ) RETURNS BIGINT LANGUAGE plpgsql AS $$
    DECLARE
        v_stored TEXT;
        v_seq BIGINT;
        v_owner TEXT;
    BEGIN
        SELECT state INTO v_stored FROM tasks WHERE id = p_id FOR UPDATE;
        IF FOUND AND v_stored <> p_state_before THEN
            RAISE EXCEPTION USING ERRCODE = 'TB001', MESSAGE = v_stored;
        END IF;
        INSERT INTO tasks AS t (id, state, data, created_at, updated_at)
        VALUES (p_id, p_state, p_data, p_created_at, p_at)
        ON CONFLICT (id) DO UPDATE
            SET state = excluded.state, data = excluded.data, updated_at = excluded.updated_at
            WHERE t.state = p_state_before;
        IF NOT FOUND THEN
            -- Another writer created the task between the read above and the insert.
            SELECT state INTO v_stored FROM tasks WHERE id = p_id;
            RAISE EXCEPTION USING ERRCODE = 'TB001', MESSAGE = v_stored;
        END IF;

        INSERT INTO journal (task_id, task_seq, at, event_name, event, state_before,
                             state_after, commands, task_after)
        VALUES (p_id,
                (SELECT COALESCE(MAX(task_seq), 0) + 1 FROM journal WHERE task_id = p_id),
                p_at, p_event_name, p_event, p_state_before, p_state, p_commands, p_data)
        RETURNING seq INTO v_seq;

        INSERT INTO snapshots AS s (task_id, seq, provider_id, status, size_bytes, sandbox_id,
                                    started_at, created_at, expires_at)
        SELECT p_id, u.* FROM unnest(p_snap_seq, p_snap_provider, p_snap_status, p_snap_size,
                                     p_snap_sandbox, p_snap_started, p_snap_created,
                                     p_snap_expires) AS u
        ON CONFLICT (task_id, seq) DO UPDATE
            SET provider_id = excluded.provider_id, status = excluded.status,
                size_bytes = excluded.size_bytes, sandbox_id = excluded.sandbox_id,
                started_at = excluded.started_at, created_at = excluded.created_at,
                expires_at = excluded.expires_at
            WHERE (s.provider_id, s.status, s.size_bytes, s.sandbox_id, s.started_at,
                   s.created_at, s.expires_at)
                  IS DISTINCT FROM
                  (excluded.provider_id, excluded.status, excluded.size_bytes,
                   excluded.sandbox_id, excluded.started_at, excluded.created_at,
                   excluded.expires_at);
        DELETE FROM snapshots WHERE task_id = p_id AND NOT (seq = ANY (p_snap_seq));

        IF p_sb_id IS NOT NULL THEN
            INSERT INTO sandboxes AS b (provider_id, name, task_id, generation, created_at,
                                        deadline, source_snapshot, status, released_at)
            VALUES (p_sb_id, p_sb_name, p_id, p_sb_generation, p_sb_created, p_sb_deadline,
                    p_sb_source, 'running', NULL)
            ON CONFLICT (provider_id) DO UPDATE
                SET name = excluded.name, generation = excluded.generation,
                    created_at = excluded.created_at, deadline = excluded.deadline,
                    source_snapshot = excluded.source_snapshot, status = 'running',
                    released_at = NULL
                WHERE b.task_id = excluded.task_id
                  AND (b.name, b.generation, b.created_at, b.deadline, b.source_snapshot,
                       b.status)
                      IS DISTINCT FROM
                      (excluded.name, excluded.generation, excluded.created_at,
                       excluded.deadline, excluded.source_snapshot, 'running');
            SELECT task_id INTO v_owner FROM sandboxes WHERE provider_id = p_sb_id;
            IF v_owner <> p_id THEN
                RAISE EXCEPTION USING ERRCODE = 'TB002', MESSAGE = v_owner, DETAIL = p_sb_id;
            END IF;
        END IF;
        UPDATE sandboxes SET status = 'released', released_at = p_at
        WHERE task_id = p_id AND status = 'running' AND provider_id IS DISTINCT FROM p_sb_id;
        RETURN v_seq;
    END
    $$;
    "#,
    // 2: leases. A server of a fleet owns a task while its lease row is fresh; the token grows
    // with each new owner (one sequence for all tasks), and a fenced commit is refused (TB003)
    // unless the lease still carries the committer's token. Expiry is the database's clock, so
    // the servers' clocks do not matter.
    r#"
    CREATE SEQUENCE lease_tokens;
    CREATE TABLE leases (
        task_id    TEXT COLLATE "C" PRIMARY KEY,
        owner      TEXT NOT NULL,
        token      BIGINT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
    );

    -- Refuses (TB003, message: the owner now, detail: its token) unless the task's lease has
    -- p_token. The row is locked for share until the commit ends, so a takeover waits for it
    -- (and a commit after a takeover sees the new token).
    CREATE FUNCTION taskbox_fence(p_id TEXT, p_token BIGINT) RETURNS VOID LANGUAGE plpgsql AS $$
    DECLARE
        v_owner TEXT;
        v_token BIGINT;
    BEGIN
        SELECT owner, token INTO v_owner, v_token FROM leases WHERE task_id = p_id FOR SHARE;
        IF NOT FOUND OR v_token <> p_token THEN
            RAISE EXCEPTION USING ERRCODE = 'TB003', MESSAGE = COALESCE(v_owner, ''),
                DETAIL = COALESCE(CAST(v_token AS TEXT), '');
        END IF;
    END
    $$;

    CREATE FUNCTION taskbox_commit_fenced(
        p_token BIGINT,
        p_id TEXT, p_state_before TEXT, p_state TEXT, p_data TEXT, p_created_at BIGINT,
        p_at BIGINT, p_event_name TEXT, p_event TEXT, p_commands TEXT,
        p_snap_seq BIGINT[], p_snap_provider TEXT[], p_snap_status TEXT[], p_snap_size BIGINT[],
        p_snap_sandbox TEXT[], p_snap_started BIGINT[], p_snap_created BIGINT[],
        p_snap_expires BIGINT[],
        p_sb_id TEXT, p_sb_name TEXT, p_sb_generation BIGINT, p_sb_created BIGINT,
        p_sb_deadline BIGINT, p_sb_source TEXT
    ) RETURNS BIGINT LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM taskbox_fence(p_id, p_token);
        RETURN taskbox_commit(p_id, p_state_before, p_state, p_data, p_created_at, p_at,
            p_event_name, p_event, p_commands, p_snap_seq, p_snap_provider, p_snap_status,
            p_snap_size, p_snap_sandbox, p_snap_started, p_snap_created, p_snap_expires,
            p_sb_id, p_sb_name, p_sb_generation, p_sb_created, p_sb_deadline, p_sb_source);
    END
    $$;
    "#,
    // 3: who wrote each fenced journal entry: the lease token its commit carried and the owner
    // of the lease at that token (append-only, like the journal). `taskbox chaos --fleet`
    // checks from it that a task has one writer at any token, and that no entry was written
    // with a token older than one before it (a stale writer after a takeover).
    r#"
    CREATE TABLE journal_writers (
        seq      BIGINT PRIMARY KEY REFERENCES journal(seq),
        task_id  TEXT COLLATE "C" NOT NULL,
        task_seq BIGINT NOT NULL,
        token    BIGINT NOT NULL,
        owner    TEXT NOT NULL
    );
    CREATE TRIGGER journal_writers_no_update BEFORE UPDATE OR DELETE ON journal_writers
        FOR EACH ROW EXECUTE FUNCTION taskbox_journal_append_only();
    CREATE TRIGGER journal_writers_no_truncate BEFORE TRUNCATE ON journal_writers
        FOR EACH STATEMENT EXECUTE FUNCTION taskbox_journal_append_only();

    CREATE OR REPLACE FUNCTION taskbox_commit_fenced(
        p_token BIGINT,
        p_id TEXT, p_state_before TEXT, p_state TEXT, p_data TEXT, p_created_at BIGINT,
        p_at BIGINT, p_event_name TEXT, p_event TEXT, p_commands TEXT,
        p_snap_seq BIGINT[], p_snap_provider TEXT[], p_snap_status TEXT[], p_snap_size BIGINT[],
        p_snap_sandbox TEXT[], p_snap_started BIGINT[], p_snap_created BIGINT[],
        p_snap_expires BIGINT[],
        p_sb_id TEXT, p_sb_name TEXT, p_sb_generation BIGINT, p_sb_created BIGINT,
        p_sb_deadline BIGINT, p_sb_source TEXT
    ) RETURNS BIGINT LANGUAGE plpgsql AS $$
    DECLARE
        v_seq BIGINT;
    BEGIN
        PERFORM taskbox_fence(p_id, p_token);
        v_seq := taskbox_commit(p_id, p_state_before, p_state, p_data, p_created_at, p_at,
            p_event_name, p_event, p_commands, p_snap_seq, p_snap_provider, p_snap_status,
            p_snap_size, p_snap_sandbox, p_snap_started, p_snap_created, p_snap_expires,
            p_sb_id, p_sb_name, p_sb_generation, p_sb_created, p_sb_deadline, p_sb_source);
        INSERT INTO journal_writers (seq, task_id, task_seq, token, owner)
        SELECT v_seq, j.task_id, j.task_seq, p_token, l.owner
        FROM journal j, leases l WHERE j.seq = v_seq AND l.task_id = p_id;
        RETURN v_seq;
    END
    $$;
    "#,
];

/// The schema version this build writes.
pub(super) fn supported_version() -> i64 {
    MIGRATIONS.len() as i64
}
