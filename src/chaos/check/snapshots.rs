//! The checks of restores and snapshots against the platform: restored-latest, fork-source,
//! deleted-while-referenced and snapshot-kept.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::{Command, Event, Millis, SnapshotStatus, Task};
use crate::store::JournalEntry;

use super::{Invariant, PlatformSandbox, PlatformSnapshot, Violation};

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
/// decision is checked on its own by [`journal`](super::journal)). A deleted snapshot missing
/// from it is taken to have been present, which makes the check weaker, never wrong the other
/// way round.
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

/// The restores from a snapshot the task's files were rewound to: `(task, generation,
/// snapshot)` of every create a journal entry issues from its task's `rewound_to` — the
/// rewind's own restore, and any restore while the files stay rewound. Those are not from the
/// newest snapshot by design; the journal's rule (`restored-latest` there) checks that the
/// engine asked for the restore point, and the chaos driver that the files are that
/// snapshot's (`rewind-restores`).
pub fn rewound_restores(entries: &[JournalEntry]) -> BTreeSet<(String, u64, String)> {
    let mut out = BTreeSet::new();
    for e in entries {
        let Some(rewound) = &e.task_after.rewound_to else {
            continue;
        };
        for c in &e.commands {
            if let Command::CreateSandbox {
                source_snapshot: Some(source),
                generation,
                ..
            } = c
            {
                if source == rewound {
                    out.insert((e.task_id.to_string(), *generation, source.to_string()));
                }
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
