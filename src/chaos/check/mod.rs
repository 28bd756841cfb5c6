//! The invariant checker: what must hold after a chaos run, checked from the journal (the
//! store) and the platform's ground truth (the simulated provider's own records), never from
//! the engine's memory. Every function here is pure, so the same checks serve the chaos runner,
//! the engine's property tests and anyone holding a journal.
//!
//! The invariants, each named in [`Invariant`]:
//! - **restored-latest**: every sandbox created from a snapshot used the task's newest snapshot
//!   present at that moment, and one created fresh had none to use ([`restores`]); every create
//!   the journal shows asks for the task's latest complete snapshot ([`journal`]).
//! - **snapshot-kept**: a snapshot complete in the store is present on the platform, unless the
//!   platform expired it (those are reported, not violations); one the store calls gone is gone;
//!   the engine never asks to delete a snapshot it still calls complete ([`snapshots_kept`],
//!   [`journal`]).
//! - **no-orphan** and **one-sandbox**: after reconciliation, every live sandbox is the one its
//!   task holds, and no task has two ([`sandboxes_after_reconcile`]).
//! - **retry-policy**: attempts never exceed the policy's `max_attempts`, each retry waits
//!   exactly the policy's delay (at least the provider's retry-after), and a timer never fires
//!   early — except a snapshot whose outcome is unknown, which the core keeps re-issuing at the
//!   policy's longest delay (`keep_trying_snapshot` in `core::step`): for that one the spacing
//!   is checked instead ([`journal`]).
//! - **journal-order**: each task's journal is gap-free and each entry starts in the state the
//!   previous one ended in ([`journal`]).
//! - **journal-replays**: folding the journal's events through the core reproduces every entry
//!   (`crate::replay::verify`, called by the chaos runner).
//! - **fork-source**: a fork's restore source — its parent's snapshot — existed on the platform
//!   (taken, not deleted, not expired) when the fork was made ([`forks`]).
//! - **deleted-while-referenced**: the platform never deleted a snapshot while some task
//!   retained it (a complete or pending record in the task's journal as of the deletion):
//!   forks share their parent's snapshots, and a snapshot is deleted only by its last holder
//!   ([`deleted_while_referenced`]). The chaos workload removes no task (a removed task's
//!   journal still shows what it retained).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

use crate::core::{
    Command, Event, FailureKind, Millis, Notice, Reply, RetryDecision, SnapshotStatus, Task,
    TaskState, TimerKind,
};
use crate::provider::sim::{SimSandbox, SimSnapshot};
use crate::store::JournalEntry;

/// A sandbox as the platform records it (the simulator's view, or the fake Vercel server's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlatformSandbox {
    /// Provider handle (a session id on Vercel).
    pub id: String,
    /// The task it was created for.
    pub task_id: String,
    /// Which creation of the task's sandbox it is, when the platform knows.
    pub generation: Option<u64>,
    /// The snapshot its files came from.
    pub source_snapshot: Option<String>,
    /// When the platform created it.
    pub created_at: Millis,
    /// Its place in the platform's order of creations (sandboxes and snapshots together), when
    /// the platform records one: it orders creations within one millisecond.
    pub order: Option<u64>,
    /// Whether it is still running.
    pub live: bool,
}

impl From<&SimSandbox> for PlatformSandbox {
    fn from(s: &SimSandbox) -> Self {
        PlatformSandbox {
            id: s.id.clone(),
            task_id: s.task_id.clone(),
            generation: Some(s.generation),
            source_snapshot: s.source_snapshot.clone(),
            created_at: s.created_at,
            order: Some(s.order),
            live: s.alive,
        }
    }
}

/// A snapshot as the platform records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlatformSnapshot {
    /// Provider id.
    pub id: String,
    /// The task it was taken for.
    pub task_id: String,
    /// When the platform took it.
    pub created_at: Millis,
    /// Its place in the platform's order of creations (see [`PlatformSandbox::order`]).
    pub order: Option<u64>,
    /// When it expires (or expired); `None`: never.
    pub expires_at: Option<Millis>,
    /// Whether it was deleted.
    pub deleted: bool,
    /// Whether it has expired.
    pub expired: bool,
}

impl From<&SimSnapshot> for PlatformSnapshot {
    fn from(s: &SimSnapshot) -> Self {
        PlatformSnapshot {
            id: s.id.clone(),
            task_id: s.task_id.clone(),
            created_at: s.created_at,
            order: Some(s.order),
            expires_at: s.expires_at,
            deleted: s.deleted,
            expired: s.expired,
        }
    }
}

/// Which invariant a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Invariant {
    /// A restore used a snapshot other than the latest complete one.
    RestoredLatest,
    /// A confirmed snapshot was lost, or the store's view of one is wrong.
    SnapshotKept,
    /// A live sandbox no task holds survived reconciliation.
    NoOrphan,
    /// A task has two live sandboxes.
    OneSandbox,
    /// A retry broke the retry policy.
    RetryPolicy,
    /// The journal has a gap, or an entry does not start where the previous one ended.
    JournalOrder,
    /// Re-applying the journal's events through the core does not reproduce it.
    JournalReplays,
    /// With faults switched off, the task did not come to rest or could not run a command.
    Settles,
    /// The engine returned an error no correct engine returns (a store conflict, ...).
    EngineError,
    /// A fork's restore source did not exist when the fork was made.
    ForkSource,
    /// The platform deleted a snapshot that a task still retained.
    DeletedWhileReferenced,
}

impl Invariant {
    /// The invariant's name, as printed.
    pub fn as_str(self) -> &'static str {
        match self {
            Invariant::RestoredLatest => "restored-latest",
            Invariant::SnapshotKept => "snapshot-kept",
            Invariant::NoOrphan => "no-orphan",
            Invariant::OneSandbox => "one-sandbox",
            Invariant::RetryPolicy => "retry-policy",
            Invariant::JournalOrder => "journal-order",
            Invariant::JournalReplays => "journal-replays",
            Invariant::Settles => "settles",
            Invariant::EngineError => "engine-error",
            Invariant::ForkSource => "fork-source",
            Invariant::DeletedWhileReferenced => "deleted-while-referenced",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One broken invariant, with what was seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// The invariant.
    pub invariant: Invariant,
    /// The task concerned, if one is.
    pub task_id: Option<String>,
    /// What was seen, with ids and times.
    pub detail: String,
}

impl Violation {
    /// A violation of `invariant` by `task`.
    pub fn new(invariant: Invariant, task: Option<&str>, detail: impl Into<String>) -> Violation {
        Violation {
            invariant,
            task_id: task.map(str::to_string),
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.task_id {
            Some(t) => write!(f, "[{}] task {t}: {}", self.invariant, self.detail),
            None => write!(f, "[{}] {}", self.invariant, self.detail),
        }
    }
}

/// What the journal says happened, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct JournalCounts {
    /// Journal entries.
    pub entries: u64,
    /// Operations re-issued after a transient failure (retry timers that fired and retried).
    pub retries: u64,
    /// Sandboxes restored from a snapshot.
    pub restores: u64,
    /// Restores whose snapshot was gone, so an older snapshot (or a fresh sandbox) was used.
    pub fallbacks: u64,
    /// "Files lost" notices raised.
    pub files_lost: u64,
    /// Commands refused before they started because their sandbox was gone
    /// (`command_not_started`), and so run again on a restored one.
    pub reruns: u64,
    /// Restarts that found something to recover (`loaded` events that did something, and the
    /// `recovered` events of older journals).
    pub recoveries: u64,
}

/// Checks every sandbox of `sandboxes` that belongs to `task`: one created from a snapshot used
/// the task's newest snapshot present at that moment; one created fresh had none to use.
///
/// Give it the sandboxes the task adopted ([`adopted_sandboxes`]): a create sent by an engine
/// that crashed before the answer came can land later, after the task moved on, and make a
/// sandbox nobody uses (from a then-stale snapshot); reconciliation stops those.
///
/// "Present" is the platform's view: taken before the creation, not expired by then, and not
/// retired by then. `retired_at` says from when a snapshot no longer counts: the time the
/// platform deleted it, or the time the task's retention superseded it ([`retired_at`]; that
/// decision is checked on its own by [`journal`]). A deleted snapshot missing from it is taken
/// to have been present, which makes the check weaker, never wrong the other way round.
///
/// Times are milliseconds, and with no platform latency a snapshot, the sandbox restored from
/// it and the next snapshot all happen in one: "taken before" uses the platform's order of
/// creations within a millisecond (when it records one; otherwise the same millisecond counts
/// as before), and a snapshot retired in the very millisecond of the creation may have been
/// used or not (the journal and the platform share no finer clock), so either is accepted.
pub fn restores(
    sandboxes: &[PlatformSandbox],
    snapshots: &[PlatformSnapshot],
    retired_at: &BTreeMap<String, Millis>,
    task: &str,
) -> Vec<Violation> {
    restores_of(sandboxes, snapshots, retired_at, task, None)
}

/// [`restores`] for a task that may be a fork: `inherited` is the parent's snapshot it started
/// from (its lineage), a candidate beside the task's own. Give it the task's own retirement
/// times ([`retired_at_for`]): a parent retiring a shared snapshot does not retire it for the
/// fork.
pub fn restores_of(
    sandboxes: &[PlatformSandbox],
    snapshots: &[PlatformSnapshot],
    retired_at: &BTreeMap<String, Millis>,
    task: &str,
    inherited: Option<&str>,
) -> Vec<Violation> {
    let snaps: Vec<&PlatformSnapshot> = snapshots
        .iter()
        .filter(|s| s.task_id == task || Some(s.id.as_str()) == inherited)
        .collect();
    let key = |s: &&PlatformSnapshot| (s.created_at, s.order, s.id.clone());
    let mut out = Vec::new();
    for sb in sandboxes.iter().filter(|s| s.task_id == task) {
        let at = sb.created_at;
        let taken_before = |s: &&&PlatformSnapshot| match (s.created_at.cmp(&at), s.order, sb.order)
        {
            (std::cmp::Ordering::Less, _, _) => true,
            (std::cmp::Ordering::Equal, Some(a), Some(b)) => a < b,
            (std::cmp::Ordering::Equal, _, _) => true,
            (std::cmp::Ordering::Greater, _, _) => false,
        };
        let candidates: Vec<&&PlatformSnapshot> = snaps
            .iter()
            .filter(taken_before)
            .filter(|s| s.expires_at.is_none_or(|e| e > at))
            .filter(|s| retired_at.get(&s.id).is_none_or(|r| *r >= at))
            .collect();
        let newest = candidates
            .iter()
            .filter(|s| retired_at.get(&s.id).is_none_or(|r| *r > at))
            .max_by_key(|s| key(s));
        // Retired in this very millisecond: newer than `newest`, it may have been the newest.
        let acceptable = |id: &str| {
            candidates.iter().any(|s| {
                s.id == id
                    && retired_at.get(&s.id) == Some(&at)
                    && newest.is_none_or(|n| key(s) > key(n))
            })
        };
        let newest = newest.map(|s| s.id.clone());
        let fine =
            sb.source_snapshot == newest || sb.source_snapshot.as_deref().is_some_and(acceptable);
        if !fine {
            out.push(Violation::new(
                Invariant::RestoredLatest,
                Some(task),
                format!(
                    "sandbox {} (generation {}, created at {at}) was created from {}, but the \
                     newest snapshot present then was {}",
                    sb.id,
                    sb.generation
                        .map_or_else(|| "?".to_string(), |g| g.to_string()),
                    sb.source_snapshot.as_deref().unwrap_or("nothing"),
                    newest.as_deref().unwrap_or("none"),
                ),
            ));
        }
    }
    out
}

/// From when each snapshot stops being a restore candidate: the earlier of the time the
/// platform deleted it (`deleted_at`, the platform's record) and the time a journal entry first
/// shows its task retiring it (`deleting` or `deleted`: superseded by the newer snapshots the
/// task keeps).
pub fn retired_at(
    entries: &[JournalEntry],
    deleted_at: &BTreeMap<String, Millis>,
) -> BTreeMap<String, Millis> {
    let mut out = deleted_at.clone();
    for e in entries {
        for s in &e.task_after.snapshots {
            if matches!(s.status, SnapshotStatus::Deleting | SnapshotStatus::Deleted) {
                if let Some(id) = &s.id {
                    let at = out.entry(id.to_string()).or_insert(e.at);
                    *at = (*at).min(e.at);
                }
            }
        }
    }
    out
}

/// [`retired_at`] as one task sees it: the platform's deletions, and the time the task's own
/// journal first shows it retiring a snapshot (`deleting`, `deleted`, or `released` to a task
/// that shares it). Another task retiring a shared snapshot does not retire it for this one.
pub fn retired_at_for(
    entries: &[JournalEntry],
    deleted_at: &BTreeMap<String, Millis>,
    task: &str,
) -> BTreeMap<String, Millis> {
    let mut out = deleted_at.clone();
    for e in entries.iter().filter(|e| e.task_id == task) {
        for s in &e.task_after.snapshots {
            if matches!(
                s.status,
                SnapshotStatus::Deleting | SnapshotStatus::Deleted | SnapshotStatus::Released
            ) {
                if let Some(id) = &s.id {
                    let at = out.entry(id.to_string()).or_insert(e.at);
                    *at = (*at).min(e.at);
                }
            }
        }
    }
    out
}

/// **fork-source**: every fork's restore source (the parent's snapshot its `forked` entry
/// names) existed on the platform when the fork was made: taken by then, not deleted
/// (`deleted_at`, the platform's record) and not expired.
pub fn forks(
    entries: &[JournalEntry],
    snapshots: &[PlatformSnapshot],
    deleted_at: &BTreeMap<String, Millis>,
) -> Vec<Violation> {
    let mut out = Vec::new();
    for e in entries {
        let Event::Forked { parent, snapshot } = &e.event else {
            continue;
        };
        let Some(id) = snapshot.id.as_deref() else {
            out.push(Violation::new(
                Invariant::ForkSource,
                Some(&e.task_id),
                format!(
                    "forked from {parent}'s snapshot seq {} with no id",
                    snapshot.seq
                ),
            ));
            continue;
        };
        let why = match snapshots.iter().find(|s| s.id == id) {
            None => Some("the platform never had it".to_string()),
            Some(s) if s.created_at > e.at => {
                Some(format!("it was taken later, at {}", s.created_at))
            }
            Some(s) if s.expires_at.is_some_and(|x| x <= e.at) => {
                Some("it had expired".to_string())
            }
            Some(_) => deleted_at
                .get(id)
                .filter(|d| **d < e.at)
                .map(|d| format!("the platform deleted it at {d}")),
        };
        if let Some(why) = why {
            out.push(Violation::new(
                Invariant::ForkSource,
                Some(&e.task_id),
                format!(
                    "forked at {} from {parent}'s snapshot {id} (seq {}), but {why}",
                    e.at, snapshot.seq
                ),
            ));
        }
    }
    out
}

/// **deleted-while-referenced**: for every snapshot the platform deleted (at `deleted_at`), no
/// task retained it then — its last journal entry at or before the deletion holds no complete
/// or pending record of it.
pub fn deleted_while_referenced(
    entries: &[JournalEntry],
    deleted_at: &BTreeMap<String, Millis>,
) -> Vec<Violation> {
    let mut by_task: BTreeMap<&str, Vec<&JournalEntry>> = BTreeMap::new();
    for e in entries {
        by_task.entry(e.task_id.as_str()).or_default().push(e);
    }
    let mut out = Vec::new();
    for (id, &at) in deleted_at {
        for (task, list) in &by_task {
            let Some(last) = list.iter().rev().find(|e| e.at <= at) else {
                continue;
            };
            let held = last.task_after.snapshots.iter().find(|s| {
                s.id.as_deref() == Some(id.as_str())
                    && matches!(s.status, SnapshotStatus::Complete | SnapshotStatus::Pending)
            });
            if let Some(rec) = held {
                out.push(Violation::new(
                    Invariant::DeletedWhileReferenced,
                    Some(task),
                    format!(
                        "the platform deleted snapshot {id} at {at} while the task retained it \
                         (seq {}, {}, as of journal entry {})",
                        rec.seq,
                        rec.status.as_str(),
                        last.task_seq
                    ),
                ));
            }
        }
    }
    out
}

/// The ids of the sandboxes the tasks adopted: every sandbox a journal entry shows a task
/// holding.
pub fn adopted_sandboxes(entries: &[JournalEntry]) -> BTreeSet<String> {
    entries
        .iter()
        .filter_map(|e| e.task_after.sandbox.as_ref().map(|s| s.id.to_string()))
        .collect()
}

/// Checks every task's snapshots against the platform: complete ⇒ present (or expired by the
/// platform: returned as `(task, snapshot id)`, not a violation); gone ⇒ not present.
pub fn snapshots_kept(
    tasks: &[Task],
    snapshots: &[PlatformSnapshot],
) -> (Vec<(String, String)>, Vec<Violation>) {
    let on_platform: BTreeMap<&str, &PlatformSnapshot> =
        snapshots.iter().map(|s| (s.id.as_str(), s)).collect();
    let mut expired = Vec::new();
    let mut out = Vec::new();
    for t in tasks {
        for rec in &t.snapshots {
            let Some(id) = rec.id.as_deref() else {
                continue;
            };
            let snap = on_platform.get(id);
            match rec.status {
                SnapshotStatus::Complete => match snap {
                    Some(s) if s.deleted => out.push(Violation::new(
                        Invariant::SnapshotKept,
                        Some(&t.id),
                        format!(
                            "snapshot {id} (seq {}) is complete in the store but was deleted on \
                             the platform",
                            rec.seq
                        ),
                    )),
                    Some(s) if s.expired => expired.push((t.id.to_string(), id.to_string())),
                    Some(_) => {}
                    None => out.push(Violation::new(
                        Invariant::SnapshotKept,
                        Some(&t.id),
                        format!(
                            "snapshot {id} (seq {}) is complete in the store but the platform \
                             never had it",
                            rec.seq
                        ),
                    )),
                },
                SnapshotStatus::Gone => {
                    if snap.is_some_and(|s| !s.deleted && !s.expired) {
                        out.push(Violation::new(
                            Invariant::SnapshotKept,
                            Some(&t.id),
                            format!(
                                "snapshot {id} (seq {}) is marked gone in the store but is \
                                 present on the platform (the task lost files it still had)",
                                rec.seq
                            ),
                        ));
                    }
                }
                SnapshotStatus::Pending
                | SnapshotStatus::Failed
                | SnapshotStatus::Deleting
                | SnapshotStatus::Deleted
                | SnapshotStatus::Released => {}
            }
        }
    }
    (expired, out)
}

/// After reconciliation: every live sandbox is the one its task holds, and no task has two.
/// `live` is the platform's live sandboxes of this installation.
pub fn sandboxes_after_reconcile(tasks: &[Task], live: &[PlatformSandbox]) -> Vec<Violation> {
    let held: BTreeMap<&str, &str> = tasks
        .iter()
        .filter_map(|t| t.sandbox.as_ref().map(|s| (s.id.as_str(), t.id.as_str())))
        .collect();
    let mut out = Vec::new();
    let mut per_task: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for sb in live {
        per_task.entry(&sb.task_id).or_default().push(&sb.id);
        match held.get(sb.id.as_str()) {
            Some(owner) if *owner == sb.task_id => {}
            Some(owner) => out.push(Violation::new(
                Invariant::NoOrphan,
                Some(&sb.task_id),
                format!("live sandbox {} is held by another task, {owner}", sb.id),
            )),
            None => out.push(Violation::new(
                Invariant::NoOrphan,
                Some(&sb.task_id),
                format!(
                    "live sandbox {} is held by no task after reconciliation",
                    sb.id
                ),
            )),
        }
    }
    for (task, ids) in per_task {
        if ids.len() > 1 {
            out.push(Violation::new(
                Invariant::OneSandbox,
                Some(task),
                format!("{} live sandboxes: {}", ids.len(), ids.join(", ")),
            ));
        }
    }
    out
}

/// Checks and counts every task's journal (entries of several tasks, in any order).
pub fn journal(entries: &[JournalEntry]) -> (JournalCounts, Vec<Violation>) {
    let mut by_task: BTreeMap<&str, Vec<&JournalEntry>> = BTreeMap::new();
    for e in entries {
        by_task.entry(&e.task_id).or_default().push(e);
    }
    let mut counts = JournalCounts::default();
    let mut out = Vec::new();
    for (task, mut es) in by_task {
        es.sort_by_key(|e| e.task_seq);
        task_journal(task, &es, &mut counts, &mut out);
    }
    (counts, out)
}

fn task_journal(
    task: &str,
    es: &[&JournalEntry],
    counts: &mut JournalCounts,
    out: &mut Vec<Violation>,
) {
    let mut prev: Option<&Task> = None;
    let mut reported_order = false;
    for (i, e) in es.iter().enumerate() {
        counts.entries += 1;
        let t = &e.task_after;
        let v = |inv: Invariant, detail: String| {
            Violation::new(
                inv,
                Some(task),
                format!("entry {} ({}): {detail}", e.task_seq, e.event.name()),
            )
        };
        // ---- order ----
        if !reported_order {
            let expected_seq = i as u64 + 1;
            let expected_state = prev.map_or(TaskState::Idle, |p| p.state);
            if e.task_seq != expected_seq
                || e.state_before != expected_state
                || t.state != e.state_after
            {
                out.push(v(
                    Invariant::JournalOrder,
                    format!(
                        "expected task_seq {expected_seq} starting in {expected_state}, found \
                         task_seq {} from {} to {} (task says {})",
                        e.task_seq, e.state_before, e.state_after, t.state
                    ),
                ));
                reported_order = true;
            }
        }
        // ---- counts ----
        let prev_attempts = prev.map_or(0, |p| p.attempts);
        if matches!(
            e.event,
            Event::TimerFired {
                timer: TimerKind::Retry
            }
        ) && t.attempts > prev_attempts
        {
            counts.retries += 1;
        }
        if matches!(e.event, Event::Loaded | Event::Recovered) && !e.commands.is_empty() {
            counts.recoveries += 1;
        }
        if matches!(e.event, Event::SandboxReady { .. })
            && e.state_before == TaskState::Restoring
            && e.state_after == TaskState::Running
        {
            counts.restores += 1;
        }
        if let Event::CreateFailed { failure, .. } = &e.event {
            if failure.kind == FailureKind::SnapshotGone && e.state_before == TaskState::Restoring {
                counts.fallbacks += 1;
            }
        }
        if let Event::CommandNotStarted { failure, .. } = &e.event {
            if failure.kind == FailureKind::SandboxGone && e.state_before == TaskState::Running {
                counts.reruns += 1;
            }
        }
        let lost = |ns: &[Notice]| {
            ns.iter()
                .filter(|n| matches!(n, Notice::FilesLost { .. }))
                .count() as u64
        };
        let replied: u64 = e
            .commands
            .iter()
            .map(|c| match c {
                Command::Reply { reply, .. } => match reply {
                    Reply::Ran { notices, .. }
                    | Reply::Resumed { notices, .. }
                    | Reply::Failed { notices, .. } => lost(notices),
                    Reply::Suspended { .. } | Reply::Forked { .. } => 0,
                },
                _ => 0,
            })
            .sum();
        counts.files_lost +=
            (lost(&t.notices) + replied).saturating_sub(prev.map_or(0, |p| lost(&p.notices)));

        // ---- retry policy ----
        let policy = &t.settings.retry;
        if t.attempts > policy.max_attempts && t.state != TaskState::Snapshotting {
            out.push(v(
                Invariant::RetryPolicy,
                format!(
                    "{} attempts in {} exceed the policy's {} (only an unknown-outcome snapshot \
                     may keep trying)",
                    t.attempts, t.state, policy.max_attempts
                ),
            ));
        }
        if matches!(
            e.event,
            Event::TimerFired {
                timer: TimerKind::Retry
            }
        ) && t.attempts > prev_attempts
        {
            if let Some(due) = prev.and_then(|p| p.retry_at) {
                if e.at < due {
                    out.push(v(
                        Invariant::RetryPolicy,
                        format!(
                            "retried at {}, {} ms before the retry was due at {due}",
                            e.at,
                            due - e.at
                        ),
                    ));
                }
            }
        }
        let hint = match &e.event {
            Event::CreateFailed { failure, .. }
            | Event::CommandFailed { failure, .. }
            | Event::CommandNotStarted { failure, .. }
            | Event::SnapshotFailed { failure, .. }
            | Event::ProbeFailed { failure, .. } => match failure.kind {
                FailureKind::Transient { retry_after_ms } => Some(retry_after_ms),
                _ => None,
            },
            _ => None,
        };
        for c in &e.commands {
            let Command::ScheduleTimer {
                timer: TimerKind::Retry,
                at,
            } = c
            else {
                continue;
            };
            let Some(retry_after_ms) = hint else {
                // Re-arming a retry already due (after a restart) schedules nothing new.
                if !matches!(e.event, Event::Loaded | Event::Recovered) {
                    out.push(v(
                        Invariant::RetryPolicy,
                        format!("a retry was scheduled at {at} without a transient failure"),
                    ));
                }
                continue;
            };
            let delay = at.saturating_sub(e.at);
            let expected = match policy.decide(t.attempts, retry_after_ms) {
                RetryDecision::RetryAfter(d) => Some(d),
                // keep_trying_snapshot: the longest delay, or the provider's longer hint.
                RetryDecision::GiveUp if t.state == TaskState::Snapshotting => {
                    Some(policy.max_delay_ms.max(retry_after_ms.unwrap_or(0)))
                }
                RetryDecision::GiveUp => None,
            };
            match expected {
                Some(d) if d == delay => {}
                Some(d) => out.push(v(
                    Invariant::RetryPolicy,
                    format!(
                        "retry {} scheduled {delay} ms after the failure; the policy says {d} ms \
                         (retry-after {:?})",
                        t.attempts + 1,
                        retry_after_ms
                    ),
                )),
                None => out.push(v(
                    Invariant::RetryPolicy,
                    format!(
                        "a retry was scheduled after attempt {} of at most {}",
                        t.attempts, policy.max_attempts
                    ),
                )),
            }
        }

        // ---- retention: a snapshot is retired only behind `keep_snapshots` newer ones ----
        if let Some(p) = prev {
            for rec in &t.snapshots {
                let was_complete = p
                    .snapshots
                    .iter()
                    .any(|o| o.seq == rec.seq && o.status == SnapshotStatus::Complete);
                if was_complete && rec.status == SnapshotStatus::Deleting {
                    let newer = t
                        .snapshots
                        .iter()
                        .filter(|o| o.seq > rec.seq && o.status == SnapshotStatus::Complete)
                        .count();
                    let keep = t.settings.keep_snapshots.max(1) as usize;
                    if newer < keep {
                        out.push(v(
                            Invariant::SnapshotKept,
                            format!(
                                "retires snapshot seq {} with only {newer} newer complete \
                                 snapshot(s); it keeps {keep}",
                                rec.seq
                            ),
                        ));
                    }
                }
            }
        }

        // ---- restore decisions and deletes ----
        for c in &e.commands {
            match c {
                Command::CreateSandbox {
                    source_snapshot,
                    generation,
                    ..
                } => {
                    let latest = if t.settings.persistent {
                        t.latest_complete().and_then(|s| s.id.clone())
                    } else {
                        None
                    };
                    if *source_snapshot != latest {
                        out.push(v(
                            Invariant::RestoredLatest,
                            format!(
                                "generation {generation} is created from {}, but the latest \
                                 complete snapshot is {}",
                                source_snapshot.as_deref().unwrap_or("nothing"),
                                latest.as_deref().unwrap_or("none")
                            ),
                        ));
                    }
                }
                Command::DeleteSnapshot { snapshot_id } => {
                    let complete = t.snapshots.iter().any(|s| {
                        s.id.as_deref() == Some(snapshot_id.as_str())
                            && s.status == SnapshotStatus::Complete
                    });
                    if complete {
                        out.push(v(
                            Invariant::SnapshotKept,
                            format!(
                                "deletes snapshot {snapshot_id}, which it still calls complete"
                            ),
                        ));
                    }
                }
                _ => {}
            }
        }
        prev = Some(t);
    }
}

/// Tasks that did not come to rest: still in a state with an operation in flight, or with
/// requests queued.
pub fn unsettled(tasks: &[Task]) -> Vec<Violation> {
    tasks
        .iter()
        .filter(|t| t.state.is_transient() || !t.queue.is_empty() || t.running.is_some())
        .map(|t| {
            Violation::new(
                Invariant::Settles,
                Some(&t.id),
                format!(
                    "still {} with {} queued request(s) after the fault-free settling phase",
                    t.state,
                    t.queue.len()
                ),
            )
        })
        .collect()
}
