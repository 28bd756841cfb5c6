//! The invariant checker: what must hold after a chaos run, checked from the journal (the
//! store) and the platform's ground truth (the simulated provider's own records), never from
//! the engine's memory. Every function here is pure, so the same checks serve the chaos runner,
//! the engine's property tests and anyone holding a journal.
//!
//! The invariants, each named in [`Invariant`]:
//! - **restored-latest**: every sandbox created from a snapshot used the task's newest snapshot
//!   present at that moment, and one created fresh had none to use ([`restores`]); every create
//!   the journal shows asks for the task's latest complete snapshot, or the one its files were
//!   rewound to while no newer one holds them ([`journal`]).
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
//!
//! - **idle-reaped**: a live sandbox left idle (nothing running, nothing queued) is
//!   snapshotted — or stopped, for a task that keeps nothing — by its last activity plus its
//!   idle lifetime plus some slack; a gap in which the engine died is not judged
//!   ([`idle_reaped`]).
//!
//! - **one-writer-per-token** (`taskbox chaos --fleet`, several engines on one PostgreSQL
//!   store): every entry was written under a lease's fencing token, by one writer per token,
//!   and never with a token older than an earlier entry's — no stale owner wrote after a
//!   takeover ([`one_writer_per_token`]).
//!
//! The rooms: `platform.rs` is the platform's records as the checks read them, `snapshots.rs`
//! the checks of restores and snapshots against them, `journal_rules.rs` the checks made by
//! walking each task's journal, `idle.rs` the idle reaper's, `writers.rs` the fleet's writer check; the reconciliation and settling checks and the report's types
//! are here.

mod idle;
mod journal_rules;
mod platform;
mod snapshots;
mod writers;

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::core::Task;

pub use idle::idle_reaped;
pub use journal_rules::journal;
pub use platform::{PlatformSandbox, PlatformSnapshot};
pub use snapshots::{
    adopted_sandboxes, deleted_while_referenced, forks, restores, restores_of, retired_at,
    retired_at_for, rewound_restores, snapshots_kept,
};
pub use writers::{one_writer_per_token, FencedWrite};

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
    /// A live sandbox stayed idle past its idle lifetime (plus slack) without being reaped.
    IdleReaped,
    /// After a rewind, the files were not those of the snapshot rewound to, or the snapshot it
    /// saved did not hold the files from before.
    RewindRestores,
    /// On a shared store: an entry written without a fencing token, by a second writer at one
    /// token, or with a token older than an earlier entry's (a stale owner after a takeover).
    OneWriterPerToken,
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
            Invariant::IdleReaped => "idle-reaped",
            Invariant::RewindRestores => "rewind-restores",
            Invariant::OneWriterPerToken => "one-writer-per-token",
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
    /// Tasks forked (`forked` entries: a child made from its parent's snapshot).
    pub forks: u64,
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
