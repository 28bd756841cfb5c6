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
//!   ([`Event::SnapshotReleased`]), and deletes it otherwise. The recording says which: a
//!   stand-in task ([`HOLDER`]) is committed retaining exactly the snapshots this task's
//!   recording released, so the re-driven engine releases those and deletes the others, as
//!   the recorded one did. (A task drops a snapshot once, so whether another held it then is
//!   one fact per snapshot. A delete that failed and was then answered by a release is the one
//!   history this cannot reproduce.)
//! - **A parent's fork request** is re-driven (it may snapshot the parent first, a provider
//!   call); the child it makes in the scratch store is removed at once (its snapshots released,
//!   not deleted, since the parent retains them), so that it retains nothing the recording's
//!   child had let go of by the time the parent dropped it — the stand-in answers for the
//!   ones it still retained.

use crate::core::{Event, SnapshotRecord, SnapshotStatus, Task, TaskState};
use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::store::{JournalEntry, Store, StoreError, TransitionRecord};

/// The stand-in that retains the snapshots another task retained in the recording.
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
/// tasks of `task_id`'s fork did: its creation as a fork, and the stand-in holder.
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
    let released: Vec<&SnapshotId> = entries
        .iter()
        .filter_map(|e| match &e.event {
            Event::SnapshotReleased { snapshot_id, .. } => Some(snapshot_id),
            _ => None,
        })
        .collect();
    let (Some(first), false) = (entries.first(), released.is_empty()) else {
        return Ok(());
    };
    let name = if task_id.as_str() == HOLDER {
        "redrive-holder-2"
    } else {
        HOLDER
    };
    let holder_id = TaskId::new(name).expect("a valid task id");
    let mut holder = Task::new(holder_id, first.task_after.settings.clone(), first.at);
    holder.snapshots = released
        .into_iter()
        .enumerate()
        .map(|(i, id)| SnapshotRecord {
            seq: i as u64 + 1,
            id: Some(id.clone()),
            status: SnapshotStatus::Complete,
            size_bytes: 0,
            sandbox_id: SandboxId::from(name),
            started_at: first.at,
            created_at: Some(first.at),
            expires_at: None,
            omitted: Vec::new(),
            taken_by: None,
        })
        .collect();
    let settings = Event::SettingsChanged {
        settings: holder.settings.clone(),
    };
    store.commit(&TransitionRecord {
        at: first.at,
        event: &settings,
        state_before: TaskState::Idle,
        task_after: &holder,
        commands: &[],
    })?;
    Ok(())
}
