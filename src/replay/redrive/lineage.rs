//! A fork's lineage in the re-drive: the other tasks of a fork, which the re-drive does not
//! drive, put into the scratch store as the recording shows them to this task.
//!
//! A fork spans tasks. The re-drive drives one task alone, so what the others did is given:
//!
//! - **A child** starts with its creation and [`Event::Forked`] (written by its parent's
//!   engine, the parent's snapshot as its restore source). Those two entries are committed to
//!   the scratch store as recorded before the first session, so the child's first request
//!   finds it `expired` with that snapshot, and its restore makes the recorded create call.
//! - **A snapshot another task retains.** Dropping a snapshot it shares, a task's engine
//!   releases it without a provider call while another task retains it
//!   ([`Event::SnapshotReleased`]), and deletes it otherwise. The recording says which: one
//!   stand-in task per snapshot this task's recording released ([`HOLDER`]`-1`, `-2`, …) is
//!   committed retaining it, as a fork of this task from it (the store finds a snapshot's
//!   other holders among the forks that share it), so the re-driven engine releases those and
//!   deletes the others, as the recorded one did. (A task drops a snapshot once, so whether
//!   another held it then is one fact per snapshot. A delete that failed and was then answered
//!   by a release is the one history this cannot reproduce.)
//! - **A parent's fork request** is re-driven (it may snapshot the parent first, a provider
//!   call); the child it makes in the scratch store is removed at once (its snapshots released,
//!   not deleted, since the parent retains them), so that it retains nothing the recording's
//!   child had let go of by the time the parent dropped it — the stand-ins answer for the
//!   ones it still retained.

use crate::core::{Event, Lineage, SnapshotRecord, SnapshotStatus, Task, TaskState};
use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::store::{JournalEntry, Store, StoreError, TransitionRecord};

/// The stand-ins that retain the snapshots another task retained in the recording are named
/// `HOLDER-1`, `HOLDER-2`, … (another prefix when the re-driven task's own id starts with it).
pub(super) const HOLDER: &str = "redrive-holder";

/// How many of `entries` are a child's creation and its [`Event::Forked`] (2), or 0 for a task
/// that is no fork.
pub(super) fn lineage_len(entries: &[JournalEntry]) -> usize {
    match entries.get(1) {
        Some(e) if matches!(e.event, Event::Forked { .. }) => 2,
        _ => 0,
    }
}

/// Commits to `store` (the scratch store, before the first session opens it) what the other
/// tasks of `task_id`'s fork did: its creation as a fork, and the stand-in holders.
pub(super) fn seed(
    store: &mut Store,
    task_id: &TaskId,
    entries: &[JournalEntry],
) -> Result<(), StoreError> {
    for e in &entries[..lineage_len(entries)] {
        store.commit(&TransitionRecord {
            at: e.at,
            event: &e.event,
            state_before: e.state_before,
            task_after: &e.task_after,
            commands: &e.commands,
        })?;
    }
    let mut released: Vec<&SnapshotId> = Vec::new();
    for e in entries {
        if let Event::SnapshotReleased { snapshot_id, .. } = &e.event {
            if !released.contains(&snapshot_id) {
                released.push(snapshot_id);
            }
        }
    }
    let Some(first) = entries.first() else {
        return Ok(());
    };
    let prefix = if task_id.as_str().starts_with(HOLDER) {
        "redrive-stand-in"
    } else {
        HOLDER
    };
    let settings = Event::SettingsChanged {
        settings: first.task_after.settings.clone(),
    };
    for (i, id) in released.into_iter().enumerate() {
        let name = format!("{prefix}-{}", i + 1);
        let holder_id = TaskId::new(&name).expect("a valid task id");
        let mut holder = Task::new(holder_id, first.task_after.settings.clone(), first.at);
        // The seq the re-driven task gave the snapshot, as a fork's lineage names it.
        let parent_seq = entries
            .iter()
            .flat_map(|e| &e.task_after.snapshots)
            .find(|s| s.id.as_ref() == Some(id))
            .map_or(0, |s| s.seq);
        holder.lineage = Some(Lineage {
            parent: task_id.clone(),
            snapshot: id.clone(),
            parent_seq,
            forked_at: first.at,
        });
        holder.snapshots = vec![SnapshotRecord {
            seq: 0,
            id: Some(id.clone()),
            status: SnapshotStatus::Complete,
            size_bytes: 0,
            sandbox_id: SandboxId::from(name.as_str()),
            started_at: first.at,
            created_at: Some(first.at),
            expires_at: None,
            omitted: Vec::new(),
            taken_by: None,
            kind: None,
        }];
        store.commit(&TransitionRecord {
            at: first.at,
            event: &settings,
            state_before: TaskState::Idle,
            task_after: &holder,
            commands: &[],
        })?;
    }
    Ok(())
}
