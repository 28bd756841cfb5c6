//! Snapshot retention, in one room: how many complete snapshots a task keeps, which of its
//! records make it a holder of a provider snapshot, and whether a retired snapshot is deleted
//! or only released.
//!
//! The rule is written once here and called from every place that applies it: the transition
//! table (`step`: pruning after a snapshot), [`Task::holds_snapshot`] and
//! [`Task::retained_snapshot_ids`], the engine (who else holds a snapshot before a delete;
//! `gc`'s retained set), the SQLite store's reader of holders and the chaos checker. The
//! PostgreSQL store answers holders in SQL, which cannot call Rust: its query names
//! [`holds`] and [`removed_task_holds`] beside it, and the store model test holds the two
//! stores equal to them.
//!
//! Deleting is the last holder's to do: a fork shares its parent's snapshot, so a task that
//! retires a snapshot another task still holds only releases it ([`Disposal::Release`]).

use crate::ids::SnapshotId;
use crate::types::{Millis, SnapshotRecord, SnapshotStatus, Task, TaskSettings};

/// How many complete snapshots a task keeps: its `keep_snapshots`, and never fewer than one,
/// since the latest complete snapshot is the one a restore uses.
pub fn keep_count(settings: &TaskSettings) -> usize {
    settings.keep_snapshots.max(1) as usize
}

/// The positions in `snapshots` (oldest first) of the complete snapshots to retire: all but the
/// newest `keep`.
pub fn to_retire(snapshots: &[SnapshotRecord], keep: usize) -> Vec<usize> {
    let complete: Vec<usize> = snapshots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.status == SnapshotStatus::Complete)
        .map(|(i, _)| i)
        .collect();
    let excess = complete.len().saturating_sub(keep);
    complete[..excess].to_vec()
}

/// The positions in `snapshots` (oldest first) of the complete snapshots to retire under the
/// task's settings: checkpoints ([`SnapshotKind::is_checkpoint`]) and the other snapshots each
/// keep their newest — `keep_checkpoints` and [`keep_count`] — when `keep_checkpoints` is set
/// (so checkpoints never push a suspend's snapshot out), else all count together as
/// [`to_retire`]; and a snapshot in `needed` (the one a rewind restored or will restore, one a
/// queued fork names) is never retired.
///
/// [`SnapshotKind::is_checkpoint`]: crate::SnapshotKind::is_checkpoint
pub fn to_retire_kept(
    snapshots: &[SnapshotRecord],
    settings: &TaskSettings,
    needed: &[SnapshotId],
) -> Vec<usize> {
    let keep = keep_count(settings);
    let mut retire = if settings.keep_checkpoints == 0 {
        to_retire(snapshots, keep)
    } else {
        let is_checkpoint = |s: &SnapshotRecord| s.kind.is_some_and(|k| k.is_checkpoint());
        let group = |checkpoints: bool, keep: usize| {
            let complete: Vec<usize> = snapshots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.status == SnapshotStatus::Complete)
                .filter(|(_, s)| is_checkpoint(s) == checkpoints)
                .map(|(i, _)| i)
                .collect();
            let excess = complete.len().saturating_sub(keep);
            complete[..excess].to_vec()
        };
        let mut both = group(true, settings.keep_checkpoints as usize);
        both.extend(group(false, keep));
        both.sort_unstable();
        both
    };
    retire.retain(|&i| {
        snapshots[i]
            .id
            .as_ref()
            .is_none_or(|id| !needed.contains(id))
    });
    retire
}

/// How many complete snapshots of `snapshots` are newer than `seq`: retiring `seq` keeps the
/// rule while that is at least [`keep_count`] (what the chaos checker asks of every retirement).
pub fn newer_complete(snapshots: &[SnapshotRecord], seq: u64) -> usize {
    snapshots
        .iter()
        .filter(|s| s.seq > seq && s.status == SnapshotStatus::Complete)
        .count()
}

/// Whether a record of a snapshot in `status` makes its task one of the snapshot's holders:
/// complete (a restore candidate) or pending (being taken). A holder's retention decides; any
/// other task's delete of a snapshot it holds becomes a release.
pub fn holds(status: SnapshotStatus) -> bool {
    matches!(status, SnapshotStatus::Complete | SnapshotStatus::Pending)
}

/// Whether a record in `status` still stands for a snapshot on the provider that its task
/// accounts for: held, or superseded with its delete outstanding. `gc` deletes only what no
/// task accounts for.
pub fn on_provider(status: SnapshotStatus) -> bool {
    holds(status) || status == SnapshotStatus::Deleting
}

/// Whether a task's records still hold snapshots after its removal marks: a task not removed
/// does; one `taskbox rm` removed does only if it kept its snapshots (`--keep-snapshots`).
pub fn removed_task_holds(removed: bool, kept_snapshots: bool) -> bool {
    !removed || kept_snapshots
}

/// How a removed task's record of a snapshot reads once `taskbox rm` removed the task: a record
/// of a snapshot still on the provider ([`on_provider`]) that the removal did not keep
/// ([`removed_task_holds`]) reads `released` when another task still holds the snapshot
/// (`held_elsewhere`) and `deleted` otherwise (the removal deleted it, or `taskbox gc` finishes
/// a delete that failed). The journal keeps the record as it was before the removal; `show`,
/// `tasks` and the ledger read it through this rule, so a removed task lists no `complete`
/// snapshot it no longer has.
pub fn status_after_removal(
    status: SnapshotStatus,
    kept_snapshots: bool,
    held_elsewhere: bool,
) -> SnapshotStatus {
    if removed_task_holds(true, kept_snapshots) || !on_provider(status) {
        status
    } else if held_elsewhere {
        SnapshotStatus::Released
    } else {
        SnapshotStatus::Deleted
    }
}

/// When a task stopped retaining snapshots for good: the time `taskbox rm` removed it
/// (`removed_at`), unless the removal kept its snapshots. The ledger counts no snapshot storage
/// to the task after it.
pub fn retention_ends(removed_at: Option<Millis>, kept_snapshots: bool) -> Option<Millis> {
    removed_at.filter(|_| !removed_task_holds(true, kept_snapshots))
}

/// Whether `task` holds the provider snapshot `id` (a record of it that [`holds`]).
pub fn task_holds(task: &Task, id: &str) -> bool {
    task.snapshots
        .iter()
        .any(|s| s.id.as_deref() == Some(id) && holds(s.status))
}

/// What becomes of a snapshot a task retires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disposal<H> {
    /// No other task holds it: the provider deletes it.
    Delete,
    /// Another task holds it (the first of its holders, named): it stays on the provider and
    /// the retiring task only lets go of it.
    Release {
        /// The holder that keeps it.
        held_by: H,
    },
}

/// Delete vs release, from the other tasks that hold the snapshot (ordered; the first is named).
pub fn disposal<H>(other_holders: impl IntoIterator<Item = H>) -> Disposal<H> {
    match other_holders.into_iter().next() {
        None => Disposal::Delete,
        Some(held_by) => Disposal::Release { held_by },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64, status: SnapshotStatus) -> SnapshotRecord {
        SnapshotRecord {
            seq,
            id: Some(format!("snap_{seq}").into()),
            status,
            size_bytes: 0,
            sandbox_id: "sbx".into(),
            started_at: 0,
            created_at: None,
            expires_at: None,
            omitted: Vec::new(),
            taken_by: None,
            kind: None,
        }
    }

    #[test]
    fn keep_n_retires_the_oldest_complete_and_skips_the_others() {
        use SnapshotStatus::*;
        let s = [
            rec(1, Complete),
            rec(2, Failed),
            rec(3, Complete),
            rec(4, Pending),
            rec(5, Complete),
        ];
        assert_eq!(to_retire(&s, 2), [0]);
        assert_eq!(to_retire(&s, 1), [0, 2]);
        assert!(to_retire(&s, 3).is_empty());
        assert_eq!(newer_complete(&s, 1), 2);
        assert_eq!(newer_complete(&s, 3), 1);
    }

    #[test]
    fn keep_count_is_at_least_one() {
        let settings = TaskSettings {
            keep_snapshots: 0,
            ..TaskSettings::default()
        };
        assert_eq!(keep_count(&settings), 1);
    }

    #[test]
    fn holders_are_complete_or_pending_and_deleting_is_still_on_the_provider() {
        use SnapshotStatus::*;
        let all = [Pending, Complete, Failed, Deleting, Deleted, Gone, Released];
        let held: Vec<_> = all.iter().copied().filter(|s| holds(*s)).collect();
        assert_eq!(held, [Pending, Complete]);
        let kept: Vec<_> = all.iter().copied().filter(|s| on_provider(*s)).collect();
        assert_eq!(kept, [Pending, Complete, Deleting]);
        assert!(removed_task_holds(false, false));
        assert!(removed_task_holds(true, true));
        assert!(!removed_task_holds(true, false));
        assert_eq!(disposal(Vec::<&str>::new()), Disposal::Delete);
        assert_eq!(disposal(["a", "b"]), Disposal::Release { held_by: "a" });
    }

    #[test]
    fn a_removal_that_did_not_keep_its_snapshots_ends_every_record_still_on_the_provider() {
        use SnapshotStatus::*;
        let all = [Pending, Complete, Failed, Deleting, Deleted, Gone, Released];
        let alone: Vec<_> = all
            .iter()
            .map(|s| status_after_removal(*s, false, false))
            .collect();
        assert_eq!(
            alone,
            [Deleted, Deleted, Failed, Deleted, Deleted, Gone, Released]
        );
        let shared: Vec<_> = all
            .iter()
            .map(|s| status_after_removal(*s, false, true))
            .collect();
        assert_eq!(
            shared,
            [Released, Released, Failed, Released, Deleted, Gone, Released]
        );
        // `rm --keep-snapshots`: the records stand as they were.
        for s in all {
            assert_eq!(status_after_removal(s, true, false), s);
            assert_eq!(status_after_removal(s, true, true), s);
        }
        assert_eq!(retention_ends(Some(7), false), Some(7));
        assert_eq!(retention_ends(Some(7), true), None);
        assert_eq!(retention_ends(None, false), None);
    }
}
