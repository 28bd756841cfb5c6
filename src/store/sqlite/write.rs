//! The commit path's writes: a batch's journal rows (and a new task's row, a fork's share of
//! its parent's snapshot), inside the caller's transaction.
//!
//! Per transition: the event and the commands are serialized once, into buffers the store
//! reuses; one journal row is appended (its `task_seq` bound from what this connection knows,
//! not looked up; its `task_after` the members that changed since the task's row before when
//! this connection wrote that row, compared field by field by [`task_delta`], else the whole
//! task: see [`super::delta`]: the whole task is serialized only for such a keyframe); a task
//! new to the store gets its row first (the journal row refers to it), and no other task row is
//! written: the row holds neither the task (migration 5) nor its state (migration 7), which
//! are its journal's. A sandbox record named for another task is
//! refused in memory ([`check_sandbox`]); a fork's share of its parent's snapshot is inserted
//! with its keyframes. Each statement is taken from the connection's cache once per batch
//! ([`Stmts`]). Nothing is read per transition: the stored state and the last `task_seq` of a
//! task come from [`Known`], read from the file once per task when this connection does not
//! know them.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use rusqlite::{params, CachedStatement, Connection, OptionalExtension, Transaction};
use serde::Serialize;

use super::delta::KEYFRAME_EVERY;
use crate::core::Task;
use crate::ids::parse_sandbox_name;
use crate::store::{StoreError, TransitionRecord};

/// An error mapper for a statement of the commit path.
fn on<'a>(
    path: &'a Path,
    task_id: &'a str,
    operation: &'static str,
) -> impl Fn(rusqlite::Error) -> StoreError + 'a {
    move |e| StoreError::sql(path, operation, Some(task_id), e)
}

/// The serialization buffers a store reuses from one transition to the next.
#[derive(Debug, Default)]
pub(super) struct Buffers {
    task: Vec<u8>,
    event: Vec<u8>,
    commands: Vec<u8>,
    /// The delta written for `task`.
    delta: Vec<u8>,
}

/// Serializes `value` (the `what` of the task `task_id`) into `buf`, replacing what it held.
fn json_into<'b, T: Serialize + ?Sized>(
    buf: &'b mut Vec<u8>,
    task_id: &str,
    what: &'static str,
    value: &T,
) -> Result<&'b str, StoreError> {
    buf.clear();
    serde_json::to_writer(&mut *buf, value).map_err(|source| StoreError::Serialize {
        task_id: task_id.to_string(),
        what,
        source,
    })?;
    Ok(std::str::from_utf8(buf).expect("serde_json writes UTF-8"))
}

/// The commit path's statements.
#[derive(Debug, Clone, Copy)]
enum Sql {
    /// Whether another connection committed since (`Known::begin`).
    DataVersion,
    /// A task's last journal row, as `Known::head` reads it.
    ReadHead,
    /// A task new to the store: its row.
    InsertTask,
    /// A transition's journal row.
    AppendJournal,
    /// A fork's share of its parent's snapshot (`fork_shares`), written again (and ignored)
    /// with every keyframe of the fork.
    InsertShare,
}

/// How many [`Sql`] statements there are: keep [`Sql::InsertShare`] the last variant.
const SQL_COUNT: usize = Sql::InsertShare as usize + 1;

impl Sql {
    fn text(self) -> &'static str {
        match self {
            Sql::DataVersion => "PRAGMA data_version",
            Sql::ReadHead => {
                "SELECT state_after, task_seq FROM journal WHERE task_id = ?1
                 ORDER BY task_seq DESC LIMIT 1"
            }
            Sql::InsertTask => "INSERT INTO tasks (id, created_at) VALUES (?1, ?2)",
            Sql::AppendJournal => {
                "INSERT INTO journal (task_id, task_seq, at, event_name, event, state_before,
                                      state_after, commands, task_after, task_key)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
            }
            Sql::InsertShare => {
                "INSERT OR IGNORE INTO fork_shares (snapshot, child, parent) VALUES (?1, ?2, ?3)"
            }
        }
    }
}

/// The statements of one commit, each taken from the connection's statement cache the first
/// time the commit runs it and held until the commit ends: the cache hashes a statement's whole
/// text each time it is taken and each time it is given back, which cost more than some of
/// the statements themselves.
pub(super) struct Stmts<'c> {
    conn: &'c Connection,
    held: [Option<CachedStatement<'c>>; SQL_COUNT],
}

impl<'c> Stmts<'c> {
    pub(super) fn new(conn: &'c Connection) -> Self {
        Stmts {
            conn,
            held: std::array::from_fn(|_| None),
        }
    }

    fn get(&mut self, sql: Sql) -> rusqlite::Result<&mut CachedStatement<'c>> {
        let slot = &mut self.held[sql as usize];
        if slot.is_none() {
            *slot = Some(self.conn.prepare_cached(sql.text())?);
        }
        Ok(slot.as_mut().expect("prepared above"))
    }
}

/// Writes the transitions `recs`, in order, inside `tx`; returns their journal `seq`s.
pub(super) fn write_batch(
    tx: &Transaction<'_>,
    path: &Path,
    recs: &[TransitionRecord<'_>],
    known: &mut Known,
    bufs: &mut Buffers,
) -> Result<Vec<u64>, StoreError> {
    let mut st = Stmts::new(tx);
    known.begin(&mut st, path)?;
    let order = batch_order(recs);
    let mut seqs = Vec::with_capacity(recs.len());
    for (rec, &Place { previous, is_last }) in recs.iter().zip(&order) {
        let task = rec.task_after;
        let id = task.id.as_str();
        let head = known.head(&mut st, path, id)?;
        if let Some(h) = head
            .as_ref()
            .filter(|h| h.state != rec.state_before.as_str())
        {
            // Another writer moved the task on since this transition's `state_before` was
            // read; committing would silently drop its update.
            return Err(StoreError::StateConflict {
                task_id: id.to_string(),
                expected: rec.state_before,
                stored: h.state.to_string(),
            });
        }
        let task_seq = head.as_ref().map_or(0, |h| h.task_seq) + 1;

        let event_json = json_into(&mut bufs.event, id, "event", rec.event)?;
        let commands_json = json_into(&mut bufs.commands, id, "commands", rec.commands)?;
        // The task's row before, when this connection wrote it (in this batch, or as the
        // cache kept it), and the keyframe its chain starts from: a delta may follow it.
        let last = head.as_mut().and_then(|h| h.last.take());
        let key = last.as_ref().map(|l| l.key);
        let prev: Option<Cow<'_, Task>> = match previous {
            Some(j) => Some(Cow::Borrowed(recs[j].task_after)),
            None => last.and_then(|l| l.task).map(|t| Cow::Owned(*t)),
        };
        check_sandbox(id, task, prev.as_deref())?;
        let chain = prev
            .as_deref()
            .zip(key)
            .filter(|(_, k)| task_seq - k < KEYFRAME_EVERY);
        let task_key = match chain {
            Some((prev, key)) => task_delta(prev, task, &mut bufs.delta)
                .map_err(|source| StoreError::Serialize {
                    task_id: id.to_string(),
                    what: "task",
                    source,
                })?
                .then_some(key),
            None => None,
        };
        // The whole task: for a keyframe.
        let task_after = match task_key {
            Some(_) => std::str::from_utf8(&bufs.delta).expect("serde_json writes UTF-8"),
            None => json_into(&mut bufs.task, id, "task", task)?,
        };

        // A task new to the store needs its row before its first journal row (the foreign key
        // of the journal and fork-share rows, and `known.head` of a later batch). The row holds
        // what the journal does not (its backend, its removal); the task's state is its last
        // journal row's.
        if head.is_none() {
            st.get(Sql::InsertTask)
                .and_then(|s| s.execute(params![id, task.created_at]))
                .map_err(on(path, id, "writing the task"))?;
        }
        st.get(Sql::AppendJournal)
            .and_then(|s| {
                s.execute(params![
                    id,
                    task_seq,
                    rec.at,
                    rec.event.name(),
                    event_json,
                    rec.state_before.as_str(),
                    task.state.as_str(),
                    commands_json,
                    task_after,
                    task_key,
                ])
            })
            .map_err(on(path, id, "appending to the journal"))?;
        let seq = u64::try_from(tx.last_insert_rowid()).expect("journal seqs are positive");

        // A fork's share of its parent's snapshot: with the fork's first row, and again (ignored)
        // with every keyframe, so a store that lost it gets it back.
        if let Some(l) = task.lineage.as_ref().filter(|l| {
            task_key.is_none() || prev.as_ref().is_none_or(|p| p.lineage.as_ref() != Some(*l))
        }) {
            st.get(Sql::InsertShare)
                .and_then(|s| s.execute(params![l.snapshot.as_str(), id, l.parent.as_str()]))
                .map_err(on(
                    path,
                    id,
                    "recording the fork's share of its parent's snapshot",
                ))?;
        }
        *head = Some(Head {
            state: Cow::Borrowed(task.state.as_str()),
            task_seq,
            last: Some(Last {
                key: task_key.unwrap_or(task_seq),
                // The next batch's first row of the task compares with it; within this batch
                // the records themselves are at hand.
                task: is_last.then(|| Box::new(task.clone())),
            }),
        });
        seqs.push(seq);
    }
    Ok(seqs)
}

/// Writes into `out` the members of `cur` whose value differs from `prev`'s, as a JSON object in
/// the order serde writes them (a delta, [`super::delta`]); `false` (and `out` unspecified)
/// when a member appears or disappears, which only a keyframe can say. Compared field by field
/// instead of serializing both tasks: the destructuring names every field, so a new one does not
/// compile until it is listed here, and a test holds the result to serde's own text.
fn task_delta(prev: &Task, cur: &Task, out: &mut Vec<u8>) -> Result<bool, serde_json::Error> {
    let Task {
        id,
        state,
        settings,
        generation,
        sandbox,
        restore_source,
        snapshots,
        snapshot_reason,
        queue,
        running,
        attempts,
        retry_at,
        last_request_id,
        last_activity,
        checkpoint_due,
        notices,
        created_at,
        probing,
        files_behind,
        recent_creates,
        lineage,
        rewound_to,
        rewind_saved,
        rewinding,
    } = cur;
    // `lineage`, `rewound_to` and `rewinding` are left out of the JSON when they are `None`.
    if prev.lineage.is_some() != lineage.is_some()
        || prev.rewound_to.is_some() != rewound_to.is_some()
        || prev.rewind_saved.is_some() != rewind_saved.is_some()
        || prev.rewinding.is_some() != rewinding.is_some()
    {
        return Ok(false);
    }
    out.clear();
    out.push(b'{');
    member(out, "id", &prev.id, id)?;
    member(out, "state", &prev.state, state)?;
    member(out, "settings", &prev.settings, settings)?;
    member(out, "generation", &prev.generation, generation)?;
    member(out, "sandbox", &prev.sandbox, sandbox)?;
    member(out, "restore_source", &prev.restore_source, restore_source)?;
    member(out, "snapshots", &prev.snapshots, snapshots)?;
    member(
        out,
        "snapshot_reason",
        &prev.snapshot_reason,
        snapshot_reason,
    )?;
    member(out, "queue", &prev.queue, queue)?;
    member(out, "running", &prev.running, running)?;
    member(out, "attempts", &prev.attempts, attempts)?;
    member(out, "retry_at", &prev.retry_at, retry_at)?;
    member(
        out,
        "last_request_id",
        &prev.last_request_id,
        last_request_id,
    )?;
    member(out, "last_activity", &prev.last_activity, last_activity)?;
    member(out, "checkpoint_due", &prev.checkpoint_due, checkpoint_due)?;
    member(out, "notices", &prev.notices, notices)?;
    member(out, "created_at", &prev.created_at, created_at)?;
    member(out, "probing", &prev.probing, probing)?;
    member(out, "files_behind", &prev.files_behind, files_behind)?;
    member(out, "recent_creates", &prev.recent_creates, recent_creates)?;
    member(out, "lineage", &prev.lineage, lineage)?;
    member(out, "rewound_to", &prev.rewound_to, rewound_to)?;
    member(out, "rewind_saved", &prev.rewind_saved, rewind_saved)?;
    member(out, "rewinding", &prev.rewinding, rewinding)?;
    out.push(b'}');
    Ok(true)
}

/// Appends `"name":cur` to the delta object being written in `out` when `cur` differs from
/// `prev`.
fn member<T: Serialize + PartialEq>(
    out: &mut Vec<u8>,
    name: &str,
    prev: &T,
    cur: &T,
) -> Result<(), serde_json::Error> {
    if prev == cur {
        return Ok(());
    }
    if out.len() > 1 {
        out.push(b',');
    }
    out.push(b'"');
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":");
    serde_json::to_writer(out, cur)
}

/// Refuses a transition whose task holds a sandbox named for another task
/// ([`StoreError::SandboxOwned`]): two tasks sharing one sandbox would see each other's files.
/// A sandbox's name is [`sandbox_name`]`(installation, task, generation)`, so the record says
/// whose it is; a name of another shape (a journal written before names had one) passes.
/// Checked when the task starts holding a sandbox, or holds one under another name; `prev`:
/// the task before this transition, when this connection knows it.
fn check_sandbox(id: &str, task: &Task, prev: Option<&Task>) -> Result<(), StoreError> {
    let Some(sb) = task.sandbox.as_ref() else {
        return Ok(());
    };
    let unchanged = prev
        .and_then(|p| p.sandbox.as_ref())
        .is_some_and(|p| p.id == sb.id && p.name == sb.name);
    if unchanged {
        return Ok(());
    }
    match parse_sandbox_name(&sb.name) {
        Some((_, owner, _)) if owner != id => Err(StoreError::SandboxOwned {
            task_id: id.to_string(),
            sandbox_id: sb.id.clone(),
            owner,
        }),
        _ => Ok(()),
    }
}

/// Where a record stands among its task's records in a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place {
    /// The index of the task's previous record in the batch.
    previous: Option<usize>,
    /// Whether it is the task's last record in the batch.
    is_last: bool,
}

/// The [`Place`] of each record of `recs`.
fn batch_order(recs: &[TransitionRecord<'_>]) -> Vec<Place> {
    if let [_] = recs {
        return vec![Place {
            previous: None,
            is_last: true,
        }];
    }
    let mut latest: HashMap<&str, usize> = HashMap::with_capacity(recs.len());
    let mut order: Vec<Place> = Vec::with_capacity(recs.len());
    for (i, r) in recs.iter().enumerate() {
        let previous = latest.insert(r.task_after.id.as_str(), i);
        if let Some(j) = previous {
            order[j].is_last = false;
        }
        order.push(Place {
            previous,
            is_last: true,
        });
    }
    order
}

/// What this connection knows of one task's rows.
#[derive(Debug, Clone)]
struct Head {
    /// The task's last journal row's `state_after`: what a transition must start from.
    state: Cow<'static, str>,
    /// The task's last journal row's `task_seq` (0: none).
    task_seq: u64,
    /// The task's last journal row, when this connection wrote it (a delta may follow it).
    last: Option<Last>,
}

/// A task's last journal row, as this connection wrote it.
#[derive(Debug, Clone)]
struct Last {
    /// The `task_seq` of the keyframe its chain starts from (its own when it is one).
    key: u64,
    /// The task it holds, kept when the row was the task's last in its batch (the next batch
    /// compares with it); `None` within a batch, whose records are at hand. Boxed: the cache's
    /// table moves its entries as it grows.
    task: Option<Box<Task>>,
}

/// What this connection knows the store holds, per task: its last journal row's state,
/// `task_seq` and task. Only commits write those (`claim_backend`
/// and `mark_removed` touch other columns), so the knowledge stays true until another
/// connection commits — which `PRAGMA data_version` (read under the write lock at the start of
/// every commit) reveals, and then everything is forgotten. A task not known here is read once
/// per batch (its last row's state and `task_seq`), gets a keyframe, and has its sandbox's name
/// checked and a fork's share inserted again (ignored when present), so a cold or forgotten
/// cache costs time, never correctness; a wrong `task_seq` could not pass the journal's unique
/// index anyway.
#[derive(Debug, Default)]
pub(super) struct Known {
    /// `data_version` as of this connection's last commit; `None`: nothing is known.
    version: Option<i64>,
    tasks: HashMap<String, Head>,
    /// The tasks the transaction in progress touched, as it left them (`None`: no row yet);
    /// applied to `tasks` once it commits.
    pending: HashMap<String, Option<Head>>,
}

/// More tasks than this known and the knowledge is dropped (it is rebuilt as tasks commit).
const MAX_KNOWN: usize = 100_000;

impl Known {
    /// Starts a commit: forgets everything if another connection committed since this one's
    /// last commit. `tx` holds the write lock.
    fn begin(&mut self, st: &mut Stmts<'_>, path: &Path) -> Result<(), StoreError> {
        self.pending.clear();
        let version: i64 = st
            .get(Sql::DataVersion)
            .and_then(|s| s.query_row([], |r| r.get(0)))
            .map_err(|e| StoreError::sql(path, "reading the data version", None, e))?;
        if self.version != Some(version) || self.tasks.len() > MAX_KNOWN {
            self.tasks.clear();
            self.version = Some(version);
        }
        Ok(())
    }

    /// The task's rows as of this transaction (`None`: no task row), read from the file the
    /// first time the batch meets a task this connection does not know.
    fn head(
        &mut self,
        st: &mut Stmts<'_>,
        path: &Path,
        id: &str,
    ) -> Result<&mut Option<Head>, StoreError> {
        if !self.pending.contains_key(id) {
            // Taken, not copied: the transaction's end puts it back (`committed`) or forgets
            // everything (`forget`).
            let head = match self.tasks.remove(id) {
                Some(h) => Some(h),
                None => st
                    .get(Sql::ReadHead)
                    .and_then(|s| {
                        s.query_row([id], |r| {
                            Ok(Head {
                                state: Cow::Owned(r.get(0)?),
                                task_seq: r.get(1)?,
                                last: None,
                            })
                        })
                        .optional()
                    })
                    .map_err(on(path, id, "reading the task"))?,
            };
            self.pending.insert(id.to_string(), head);
        }
        Ok(self
            .pending
            .get_mut(id)
            .expect("inserted above when missing"))
    }

    /// The transaction committed: what it wrote is what the rows hold.
    pub(super) fn committed(&mut self) {
        for (id, head) in self.pending.drain() {
            if let Some(head) = head {
                self.tasks.insert(id, head);
            }
        }
    }

    /// The transaction did not commit (or may not have): nothing is known any more.
    pub(super) fn forget(&mut self) {
        self.pending.clear();
        self.tasks.clear();
        self.version = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{
        Lineage, Notice, Request, RunningCommand, SandboxRecord, SnapshotReason, SnapshotRecord,
        SnapshotStatus, TaskSettings, TaskState,
    };
    use crate::ids::TaskId;
    use crate::store::sqlite::delta;

    /// The delta the store writes, field by field, is the delta of the two tasks' serde texts:
    /// the same members, names and order, byte for byte; a member that appears asks for a
    /// keyframe. Every field changes once, then several at a time.
    #[test]
    fn the_field_by_field_delta_is_the_delta_of_the_serialized_tasks() {
        let sandbox = SandboxRecord {
            id: "sb-1".into(),
            name: "taskbox-a-1".into(),
            generation: 1,
            created_at: 5,
            deadline: 9,
            source_snapshot: None,
            used: true,
            activity: None,
            sampling: false,
        };
        let snapshot = SnapshotRecord {
            seq: 1,
            id: Some("snap-1".into()),
            status: SnapshotStatus::Complete,
            size_bytes: 10,
            sandbox_id: "sb-1".into(),
            started_at: 1,
            created_at: Some(2),
            expires_at: None,
            omitted: vec!["a\"b".into()],
            taken_by: None,
            kind: None,
        };
        type Change = Box<dyn Fn(&mut Task)>;
        let changes: Vec<Change> = vec![
            Box::new(|t| t.id = TaskId::new("b").expect("an id")),
            Box::new(|t| t.state = TaskState::Running),
            Box::new(|t| t.settings.idle_lifetime_ms += 1),
            Box::new(|t| t.generation += 1),
            Box::new(move |t| t.sandbox = Some(sandbox.clone())),
            Box::new(|t| {
                if let Some(sb) = t.sandbox.as_mut() {
                    sb.activity = Some(crate::core::SandboxActivity {
                        sampled_at: 3,
                        resources: crate::core::Resources {
                            cpu_usec: Some(5),
                            ..Default::default()
                        },
                        busy_at: Some(3),
                    });
                }
            }),
            Box::new(|t| t.settings.max_busy_ms = 8_000),
            Box::new(|t| t.restore_source = Some("snap-0".into())),
            Box::new(move |t| t.snapshots.push(snapshot.clone())),
            Box::new(|t| t.snapshot_reason = Some(SnapshotReason::Suspend { request_id: 2 })),
            Box::new(|t| {
                t.queue.push_back(Request::Run {
                    id: 3,
                    command: "printf '{\"x\": [1]}\\n' \u{e9}".into(),
                    timeout_ms: 5,
                })
            }),
            Box::new(|t| {
                t.running = Some(RunningCommand {
                    request_id: 3,
                    command: "ls".into(),
                    timeout_ms: 5,
                    started_at: 6,
                })
            }),
            Box::new(|t| t.attempts += 1),
            Box::new(|t| t.retry_at = Some(8)),
            Box::new(|t| t.last_request_id += 1),
            Box::new(|t| t.last_activity += 1),
            Box::new(|t| t.checkpoint_due = true),
            Box::new(|t| t.notices.push(Notice::FilesLost { reason: "x".into() })),
            Box::new(|t| t.created_at += 1),
            Box::new(|t| t.probing = true),
            Box::new(|t| t.files_behind = true),
            Box::new(|t| t.recent_creates.push(4)),
            Box::new(|t| {
                t.state = TaskState::Idle;
                t.running = None;
                t.queue.clear();
                t.last_activity += 7;
            }),
        ];
        let text = |t: &Task| serde_json::to_string(t).expect("serializes");
        let mut prev = Task::new(TaskId::new("a").expect("an id"), TaskSettings::default(), 7);
        let mut out = Vec::new();
        for change in &changes {
            let mut cur = prev.clone();
            change(&mut cur);
            assert_ne!(cur, prev);
            assert!(task_delta(&prev, &cur, &mut out).expect("serializes"));
            let (p, c) = (text(&prev), text(&cur));
            let (mut pm, mut cm, mut expected) = (Vec::new(), Vec::new(), Vec::new());
            delta::members(p.as_bytes(), &mut pm).expect("an object");
            delta::members(c.as_bytes(), &mut cm).expect("an object");
            assert!(delta::encode(
                p.as_bytes(),
                &pm,
                c.as_bytes(),
                &cm,
                &mut expected
            ));
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&expected)
            );
            let mut rebuilt = String::new();
            delta::apply(&p, std::str::from_utf8(&out).expect("UTF-8"), &mut rebuilt)
                .expect("applies");
            assert_eq!(rebuilt, c);
            prev = cur;
        }
        assert!(task_delta(&prev, &prev, &mut out).expect("serializes"));
        assert_eq!(out, b"{}");
        let mut forked = prev.clone();
        forked.lineage = Some(Lineage {
            parent: TaskId::new("p").expect("an id"),
            snapshot: "snap-p".into(),
            parent_seq: 4,
            forked_at: 3,
        });
        assert!(!task_delta(&prev, &forked, &mut out).expect("serializes"));
        assert!(!task_delta(&forked, &prev, &mut out).expect("serializes"));
        let mut moved = forked.clone();
        if let Some(l) = moved.lineage.as_mut() {
            l.parent_seq += 1;
        }
        assert!(task_delta(&forked, &moved, &mut out).expect("serializes"));
        assert!(String::from_utf8_lossy(&out).starts_with("{\"lineage\":"));
    }
}
