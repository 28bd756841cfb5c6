//! Committing transitions: one transition bound to SQL values, the (fenced) commit function's
//! calls in one transaction, and its refusals turned into the store's errors.

use tokio_postgres::types::ToSql;

use super::connection::Fail;
use super::PgStore;
use crate::core::TaskState;
use crate::store::Sync as CommitSync;
use crate::store::{to_json, StoreError, TransitionRecord};

/// One transition, owned and bound to SQL types, for the connection's runtime.
struct PgRecord {
    id: String,
    state_before: &'static str,
    state: &'static str,
    data: String,
    created_at: i64,
    at: i64,
    event_name: String,
    event: String,
    commands: String,
    snap_seq: Vec<i64>,
    snap_provider: Vec<Option<String>>,
    snap_status: Vec<&'static str>,
    snap_size: Vec<i64>,
    snap_sandbox: Vec<String>,
    snap_started: Vec<i64>,
    snap_created: Vec<Option<i64>>,
    snap_expires: Vec<Option<i64>>,
    sb_id: Option<String>,
    sb_name: Option<String>,
    sb_generation: Option<i64>,
    sb_created: Option<i64>,
    sb_deadline: Option<i64>,
    sb_source: Option<String>,
}

impl PgRecord {
    fn params_fenced<'a>(&'a self, token: &'a i64) -> Vec<&'a (dyn ToSql + Sync)> {
        let mut p = self.params().to_vec();
        p.push(token);
        p
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 23] {
        [
            &self.id,
            &self.state_before,
            &self.state,
            &self.data,
            &self.created_at,
            &self.at,
            &self.event_name,
            &self.event,
            &self.commands,
            &self.snap_seq,
            &self.snap_provider,
            &self.snap_status,
            &self.snap_size,
            &self.snap_sandbox,
            &self.snap_started,
            &self.snap_created,
            &self.snap_expires,
            &self.sb_id,
            &self.sb_name,
            &self.sb_generation,
            &self.sb_created,
            &self.sb_deadline,
            &self.sb_source,
        ]
    }
}

impl PgStore {
    /// Binds one transition to SQL values (serializing its JSON here, on the caller's thread).
    fn bind(&self, rec: &TransitionRecord<'_>) -> Result<PgRecord, StoreError> {
        let task = rec.task_after;
        let id = task.id.as_str();
        let int = |what: &'static str, v: u64| {
            i64::try_from(v).map_err(|_| StoreError::OutOfRange {
                task_id: id.to_string(),
                what,
                value: v,
            })
        };
        let opt = |what: &'static str, v: Option<u64>| v.map(|v| int(what, v)).transpose();
        let snaps = &task.snapshots;
        let sb = task.sandbox.as_ref();
        Ok(PgRecord {
            id: id.to_string(),
            state_before: rec.state_before.as_str(),
            state: task.state.as_str(),
            data: to_json(id, "task", task)?,
            created_at: int("created_at", task.created_at)?,
            at: int("at", rec.at)?,
            event_name: rec.event.name().to_string(),
            event: to_json(id, "event", rec.event)?,
            commands: to_json(id, "commands", rec.commands)?,
            snap_seq: snaps
                .iter()
                .map(|s| int("snapshot seq", s.seq))
                .collect::<Result<_, _>>()?,
            snap_provider: snaps
                .iter()
                .map(|s| s.id.as_deref().map(str::to_string))
                .collect(),
            snap_status: snaps.iter().map(|s| s.status.as_str()).collect(),
            snap_size: snaps
                .iter()
                .map(|s| int("snapshot size", s.size_bytes))
                .collect::<Result<_, _>>()?,
            snap_sandbox: snaps.iter().map(|s| s.sandbox_id.to_string()).collect(),
            snap_started: snaps
                .iter()
                .map(|s| int("snapshot start", s.started_at))
                .collect::<Result<_, _>>()?,
            snap_created: snaps
                .iter()
                .map(|s| opt("snapshot creation", s.created_at))
                .collect::<Result<_, _>>()?,
            snap_expires: snaps
                .iter()
                .map(|s| opt("snapshot expiry", s.expires_at))
                .collect::<Result<_, _>>()?,
            sb_id: sb.map(|s| s.id.to_string()),
            sb_name: sb.map(|s| s.name.clone()),
            sb_generation: opt("sandbox generation", sb.map(|s| s.generation))?,
            sb_created: opt("sandbox creation", sb.map(|s| s.created_at))?,
            sb_deadline: opt("sandbox deadline", sb.map(|s| s.deadline))?,
            sb_source: sb.and_then(|s| s.source_snapshot.as_deref().map(str::to_string)),
        })
    }

    /// Commits `recs` in one transaction (one statement when it is a single synced one), each
    /// fenced by its task's token when this server holds the task's lease.
    pub(super) fn commit_transitions(
        &mut self,
        recs: &[TransitionRecord<'_>],
        sync: CommitSync,
    ) -> Result<Vec<u64>, StoreError> {
        if recs.is_empty() {
            return Ok(Vec::new());
        }
        let bound = recs
            .iter()
            .map(|r| self.bind(r))
            .collect::<Result<Vec<_>, _>>()?;
        let first_task = recs[0].task_after.id.as_str().to_string();
        let states: Vec<TaskState> = recs.iter().map(|r| r.state_before).collect();
        let tokens: Vec<Option<i64>> = {
            let fences = self.fences.lock().unwrap_or_else(|p| p.into_inner());
            bound.iter().map(|r| fences.get(&r.id).copied()).collect()
        };
        self.call(
            "committing a transition",
            Some(&first_task),
            move |s| async move {
                // One record: its one statement is a transaction of its own (one round trip).
                // `CommitSync::WithNext`: the transaction's commit does not wait for the WAL flush;
                // the next flushed commit flushes it (PostgreSQL's WAL is written in order).
                let single = bound.len() == 1 && sync == CommitSync::Now;
                if !single {
                    s.client.batch_execute("BEGIN").await?;
                    if sync == CommitSync::WithNext {
                        s.client
                            .batch_execute("SET LOCAL synchronous_commit TO OFF")
                            .await?;
                    }
                }
                let mut seqs = Vec::with_capacity(bound.len());
                for ((rec, expected), token) in bound.iter().zip(states).zip(tokens) {
                    let answer = match &token {
                        Some(t) => {
                            s.client
                                .query_one(&s.commit_fenced, &rec.params_fenced(t))
                                .await
                        }
                        None => s.client.query_one(&s.commit, &rec.params()).await,
                    };
                    match answer {
                        Ok(row) => seqs.push(row.get::<_, i64>(0) as u64),
                        Err(e) => {
                            // Best effort: a broken connection rolls back by itself.
                            if !single {
                                let _ = s.client.batch_execute("ROLLBACK").await;
                            }
                            return Err(refused(&rec.id, expected, e));
                        }
                    }
                }
                if !single {
                    s.client.batch_execute("COMMIT").await?;
                }
                Ok(seqs)
            },
        )
    }
}

/// Turns the commit function's refusals into the store's errors.
fn refused(task_id: &str, expected: TaskState, e: tokio_postgres::Error) -> Fail {
    match e.as_db_error().map(|db| (db.code().code(), db.message())) {
        Some(("TB001", stored)) => Fail::Store(StoreError::StateConflict {
            task_id: task_id.to_string(),
            expected,
            stored: stored.to_string(),
        }),
        Some(("TB003", owner)) => Fail::Store(StoreError::LeaseLost {
            task_id: task_id.to_string(),
            owner: Some(owner.to_string()).filter(|o| !o.is_empty()),
        }),
        Some(("TB002", owner)) => Fail::Store(StoreError::SandboxOwned {
            task_id: task_id.to_string(),
            sandbox_id: e
                .as_db_error()
                .and_then(|db| db.detail())
                .unwrap_or_default()
                .to_string()
                .into(),
            owner: owner.to_string(),
        }),
        _ => Fail::Pg(e),
    }
}
