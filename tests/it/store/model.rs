//! The sandbox and snapshot rows and a snapshot's holders, computed the plain way from the
//! tasks' whole histories: the model the stores' readers are held to.
//!
//! The SQLite store derives them from its journal (reading only the rows that hold a `sandbox`
//! member, and finding holders through the forks' shares); the PostgreSQL store keeps tables
//! its commit writes. This model does neither: it folds over whole tasks, one after another.

use taskbox::core::{retention, Millis, Task};
use taskbox::store::{SandboxRow, SandboxStatus, SnapshotRow, Store};

/// The sandbox rows a task's history (each transition's time and the task after it, in order)
/// implies: one per sandbox it ever held, with its last record while held, `running` while
/// the last task holds it, else `released` at the time of the first transition that did not;
/// ordered by generation and id.
pub(crate) fn sandbox_rows<'a>(
    history: impl IntoIterator<Item = (Millis, &'a Task)>,
) -> Vec<SandboxRow> {
    let mut rows: Vec<SandboxRow> = Vec::new();
    let mut held: Option<usize> = None;
    for (at, task) in history {
        let now = task.sandbox.as_ref();
        if let Some(i) = held {
            if now.map(|s| &s.id) != Some(&rows[i].provider_id) {
                rows[i].status = SandboxStatus::Released;
                rows[i].released_at = Some(at);
                held = None;
            }
        }
        if let Some(sb) = now {
            let row = SandboxRow {
                provider_id: sb.id.clone(),
                name: sb.name.clone(),
                task_id: task.id.clone(),
                generation: sb.generation,
                created_at: sb.created_at,
                deadline: sb.deadline,
                source_snapshot: sb.source_snapshot.clone(),
                status: SandboxStatus::Running,
                released_at: None,
            };
            match rows.iter().position(|r| r.provider_id == sb.id) {
                Some(i) => {
                    rows[i] = row;
                    held = Some(i);
                }
                None => {
                    rows.push(row);
                    held = Some(rows.len() - 1);
                }
            }
        }
    }
    rows.sort_by(|a, b| {
        (a.generation, a.provider_id.as_str()).cmp(&(b.generation, b.provider_id.as_str()))
    });
    rows
}

/// The snapshot rows of a task: one per record, by seq.
pub(crate) fn snapshot_rows(task: &Task) -> Vec<SnapshotRow> {
    let mut rows: Vec<SnapshotRow> = task
        .snapshots
        .iter()
        .map(|s| SnapshotRow::of_record(&task.id, s))
        .collect();
    rows.sort_by_key(|r| r.seq);
    rows
}

/// The rows of every task of `store` (or of `task`), from the whole tasks its journal rebuilds.
pub(crate) fn rows_of(store: &Store, task: Option<&str>) -> (Vec<SandboxRow>, Vec<SnapshotRow>) {
    let ids: Vec<String> = match task {
        Some(t) => vec![t.to_string()],
        None => store
            .task_ids()
            .expect("task ids")
            .iter()
            .map(|t| t.to_string())
            .collect(),
    };
    let (mut sandboxes, mut snapshots) = (Vec::new(), Vec::new());
    for id in &ids {
        let journal = store.journal(id).expect("the task's journal");
        sandboxes.extend(sandbox_rows(journal.iter().map(|e| (e.at, &e.task_after))));
        if let Some(last) = journal.last() {
            snapshots.extend(snapshot_rows(&last.task_after));
        }
    }
    (sandboxes, snapshots)
}

/// The tasks other than `asking` whose records retain the provider snapshot `snapshot`
/// (`retention::task_holds`), not removed unless their snapshots were kept
/// (`retention::removed_task_holds`): every task of `store` looked at. Both stores' readers are
/// held to it, the PostgreSQL one's SQL above all, which cannot call the Rust rule.
pub(crate) fn holders(store: &Store, snapshot: &str, asking: &str) -> Vec<String> {
    let mut out = Vec::new();
    for t in store.load_tasks().expect("tasks") {
        let retains = retention::task_holds(&t, snapshot);
        let marks_keep = store
            .task_marks(t.id.as_str())
            .expect("marks")
            .is_none_or(|m| {
                retention::removed_task_holds(m.removed_at.is_some(), m.kept_snapshots)
            });
        if t.id.as_str() != asking && retains && marks_keep {
            out.push(t.id.to_string());
        }
    }
    out
}
