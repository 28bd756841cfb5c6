//! Leases and fencing tokens (a task's one owner among the servers sharing the database), and the
//! installation-wide jobs one server at a time runs (advisory locks).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{rows, PgStore};
use crate::store::rows::Columns;
use crate::store::StoreError;

/// A task's lease, as this server holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The task.
    pub task_id: String,
    /// This server's name in the `leases` table.
    pub owner: String,
    /// The fencing token: greater than that of every earlier owner.
    pub token: i64,
}

/// A task's lease as the `leases` table holds it ([`PgStore::leases`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LeaseRow {
    /// The task.
    pub task_id: String,
    /// The server that holds (or last held) it: `HOST pid N since T at ADDR`.
    pub owner: String,
    /// The fencing token.
    pub token: i64,
    /// How long the lease still runs, in ms on the database's clock; negative once expired.
    pub remaining_ms: i64,
}

/// Who wrote one fenced journal entry (migration 3's `journal_writers`): the token its commit
/// carried and the lease's owner at that token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalWriter {
    /// The task.
    pub task_id: String,
    /// The entry's place in the task's journal.
    pub task_seq: u64,
    /// The fencing token the commit carried.
    pub token: i64,
    /// The lease's owner at that token: the server that wrote the entry.
    pub owner: String,
}

/// The fencing tokens this server's commits carry, by task. Shared by the stores of one server
/// (the one that renews leases and the event loop's), so a commit always carries the token of
/// the lease as last acquired.
pub type Fences = Arc<Mutex<std::collections::HashMap<String, i64>>>;

impl PgStore {
    /// Takes (or renews, when `owner` holds it already) the task's lease for `ttl`, measured on
    /// the database's clock. A new owner gets a token greater than every earlier one; from
    /// then on this store's commits of the task are fenced by it. Refused with
    /// [`StoreError::LeaseHeld`] while another owner's lease is fresh.
    pub fn acquire_lease(
        &self,
        task_id: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease, StoreError> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let rows = self.query(
            "taking a task's lease",
            Some(task_id),
            "WITH taken AS (
                 INSERT INTO leases AS l (task_id, owner, token, expires_at)
                 VALUES ($1, $2, nextval('lease_tokens'),
                         now() + CAST($3 AS BIGINT) * interval '1 millisecond')
                 ON CONFLICT (task_id) DO UPDATE
                     SET owner = excluded.owner,
                         token = CASE WHEN l.owner = excluded.owner THEN l.token
                                      ELSE excluded.token END,
                         expires_at = excluded.expires_at
                     WHERE l.owner = excluded.owner OR l.expires_at < now()
                 RETURNING token)
             SELECT token, NULL::TEXT, NULL::BIGINT FROM taken
             UNION ALL
             SELECT NULL, owner,
                    CAST(GREATEST(0, EXTRACT(EPOCH FROM expires_at - now()) * 1000) AS BIGINT)
             FROM leases WHERE task_id = $1 AND NOT EXISTS (SELECT 1 FROM taken)"
                .to_string(),
            vec![
                Box::new(task_id.to_string()),
                Box::new(owner.to_string()),
                Box::new(ttl_ms),
            ],
        )?;
        let row = rows.first().ok_or_else(|| StoreError::LeaseLost {
            task_id: task_id.to_string(),
            owner: None,
        })?;
        let cx = self.cx(Some(task_id));
        match rows::get::<Option<i64>>(&cx, row, 0, "leases.token")? {
            Some(token) => {
                self.fences
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(task_id.to_string(), token);
                Ok(Lease {
                    task_id: task_id.to_string(),
                    owner: owner.to_string(),
                    token,
                })
            }
            None => Err(StoreError::LeaseHeld {
                task_id: task_id.to_string(),
                owner: rows::get(&cx, row, 1, "leases.owner")?,
                expires_in_ms: row.opt_uint(&cx, (2, "leases.expires_at"))?.unwrap_or(0),
            }),
        }
    }

    /// Extends `lease` by `ttl` from now; [`StoreError::LeaseLost`] when another owner took it
    /// (its token changed), and then this store's commits of the task stay refused.
    pub fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<(), StoreError> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let rows = self.query(
            "renewing a task's lease",
            Some(&lease.task_id),
            "UPDATE leases SET expires_at = now() + CAST($3 AS BIGINT) * interval '1 millisecond'
             WHERE task_id = $1 AND token = $2 RETURNING token"
                .to_string(),
            vec![
                Box::new(lease.task_id.clone()),
                Box::new(lease.token),
                Box::new(ttl_ms),
            ],
        )?;
        if rows.is_empty() {
            let owner = self
                .query_task(
                    "reading a task's lease",
                    &lease.task_id,
                    "SELECT owner FROM leases WHERE task_id = $1",
                )?
                .first()
                .and_then(|r| r.try_get::<_, String>(0).ok());
            return Err(StoreError::LeaseLost {
                task_id: lease.task_id.clone(),
                owner,
            });
        }
        Ok(())
    }

    /// Extends every lease of `leases` by `ttl` from now, in one statement (a server renews all
    /// the leases it holds at once). Returns the leases no longer this server's — another
    /// owner took them over (their token changed) — each with the owner that holds it now.
    pub fn renew_leases(
        &self,
        leases: &[Lease],
        ttl: Duration,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let ids: Vec<String> = leases.iter().map(|l| l.task_id.clone()).collect();
        let tokens: Vec<i64> = leases.iter().map(|l| l.token).collect();
        // The outer SELECT sees `leases` as it was before the UPDATE: for a lost lease, the
        // owner that took it.
        let rows = self.query(
            "renewing the server's leases",
            None,
            "WITH mine AS (
                 SELECT * FROM unnest(CAST($1 AS TEXT[]), CAST($2 AS BIGINT[]))
                     AS u(task_id, token)),
             renewed AS (
                 UPDATE leases l
                 SET expires_at = now() + CAST($3 AS BIGINT) * interval '1 millisecond'
                 FROM mine WHERE l.task_id = mine.task_id AND l.token = mine.token
                 RETURNING l.task_id)
             SELECT m.task_id, l.owner FROM mine m
             LEFT JOIN leases l ON l.task_id = m.task_id
             WHERE NOT EXISTS (SELECT 1 FROM renewed r WHERE r.task_id = m.task_id)"
                .to_string(),
            vec![Box::new(ids), Box::new(tokens), Box::new(ttl_ms)],
        )?;
        let cx = self.cx(None);
        rows.iter()
            .map(|r| {
                Ok((
                    rows::get::<String>(&cx, r, 0, "leases.task_id")?,
                    rows::get::<Option<String>>(&cx, r, 1, "leases.owner")?,
                ))
            })
            .collect()
    }

    /// Lets the lease go (a server stopping cleanly): another server may take the task at
    /// once. The token stays with the row, so the next owner's is still greater.
    pub fn release_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        self.query(
            "releasing a task's lease",
            Some(&lease.task_id),
            "UPDATE leases SET expires_at = now() - interval '1 millisecond'
             WHERE task_id = $1 AND token = $2"
                .to_string(),
            vec![Box::new(lease.task_id.clone()), Box::new(lease.token)],
        )?;
        Ok(())
    }

    /// Who wrote each fenced journal entry, in commit order (entries committed without a lease
    /// have no row: a fleet's servers fence every commit).
    pub fn journal_writers(&self) -> Result<Vec<JournalWriter>, StoreError> {
        let rows = self.query_all(
            "reading the journal's writers",
            "SELECT task_id, task_seq, token, owner FROM journal_writers ORDER BY seq",
        )?;
        let cx = self.cx(None);
        rows.iter()
            .map(|r| {
                let task_seq = rows::get::<i64>(&cx, r, 1, "journal_writers.task_seq")?;
                Ok(JournalWriter {
                    task_id: rows::get::<String>(&cx, r, 0, "journal_writers.task_id")?,
                    task_seq: u64::try_from(task_seq).unwrap_or(0),
                    token: rows::get::<i64>(&cx, r, 2, "journal_writers.token")?,
                    owner: rows::get::<String>(&cx, r, 3, "journal_writers.owner")?,
                })
            })
            .collect()
    }

    /// Every task's lease row, by owner then task: who holds it, its token and how long it
    /// still runs on the database's clock (negative: expired, and any server may take the task
    /// over). For the dashboard's fleet page.
    pub fn leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        let rows = self.query_all(
            "reading the leases",
            "SELECT task_id, owner, token,
                    CAST(EXTRACT(EPOCH FROM expires_at - now()) * 1000 AS BIGINT)
             FROM leases ORDER BY owner, task_id",
        )?;
        let cx = self.cx(None);
        rows.iter()
            .map(|r| {
                Ok(LeaseRow {
                    task_id: rows::get::<String>(&cx, r, 0, "leases.task_id")?,
                    owner: rows::get::<String>(&cx, r, 1, "leases.owner")?,
                    token: rows::get::<i64>(&cx, r, 2, "leases.token")?,
                    remaining_ms: rows::get::<i64>(&cx, r, 3, "leases.expires_at")?,
                })
            })
            .collect()
    }

    /// Expires every lease `owner` holds, now, whatever its token — what the database sees
    /// when a server's renewals stop reaching it (a partition, a pause) while the server
    /// still believes its leases fresh. For `taskbox chaos --fleet`'s lease-expiry fault; a
    /// server never calls it. Returns how many leases it expired.
    pub fn expire_leases_of(&self, owner: &str) -> Result<u64, StoreError> {
        let rows = self.query(
            "expiring a server's leases",
            None,
            "UPDATE leases SET expires_at = now() - interval '1 millisecond'
             WHERE owner = $1 AND expires_at > now() RETURNING task_id"
                .to_string(),
            vec![Box::new(owner.to_string())],
        )?;
        Ok(rows.len() as u64)
    }

    /// Tries to become the one holder of the installation-wide job `name` (gc, the reaper): a
    /// session-level advisory lock, held by this store's connection until [`PgStore::release_job`]
    /// or until the connection ends (a dead server's lock goes with it).
    pub fn try_job(&self, name: &str) -> Result<bool, StoreError> {
        let rows = self.query(
            "taking a job's advisory lock",
            None,
            "SELECT pg_try_advisory_lock(hashtextextended('taskbox job ' || $1, 0))".to_string(),
            vec![Box::new(name.to_string())],
        )?;
        Ok(rows.first().is_some_and(|r| r.get::<_, bool>(0)))
    }

    /// Lets go of the job `name` taken by [`PgStore::try_job`].
    pub fn release_job(&self, name: &str) -> Result<(), StoreError> {
        self.query(
            "releasing a job's advisory lock",
            None,
            "SELECT pg_advisory_unlock(hashtextextended('taskbox job ' || $1, 0))".to_string(),
            vec![Box::new(name.to_string())],
        )?;
        Ok(())
    }
}
