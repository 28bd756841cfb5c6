//! Garbage collection: [`Orchestrator::gc`] finds this installation's sandboxes and snapshots
//! that no task references and stops or deletes them, reporting what it did in a [`GcReport`].

use serde::{Deserialize, Serialize};

use super::{EngineError, Orchestrator};
use crate::ids::{SandboxId, SnapshotId, TaskId};

/// One resource `gc` acted on (or would have).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcItem {
    /// Provider id.
    pub id: String,
    /// The task its tags or name name, if any.
    pub task_id: Option<String>,
    /// Why it was chosen or skipped.
    pub reason: String,
}

/// What `gc` found and did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GcReport {
    /// Nothing was changed.
    pub dry_run: bool,
    /// Live sandboxes of this installation that no task holds: stopped.
    pub sandboxes_stopped: Vec<GcItem>,
    /// Snapshots of this installation that no task retains: deleted.
    pub snapshots_deleted: Vec<GcItem>,
    /// Resources left alone because their task has an operation in flight.
    pub skipped: Vec<GcItem>,
    /// Stop or delete calls that failed (the next gc tries again).
    pub errors: Vec<String>,
    /// Leftovers of interrupted operations removed (local backend: half-written archives,
    /// half-restored workspaces).
    pub temporaries_removed: usize,
    /// A fleet (PostgreSQL store): another server was running gc for the installation, so this
    /// one did nothing (one server at a time, under an advisory lock).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held_elsewhere: bool,
}

impl Orchestrator {
    /// Finds this installation's sandboxes and snapshots on the provider (by tag) that no task
    /// references, and stops or deletes them. Never touches another installation's resources,
    /// nor those of a task with an operation in flight (its recovery owns them: the write-ahead
    /// journal records a create or snapshot before it is made). `dry_run` only reports.
    ///
    /// On a fleet's PostgreSQL store, one server at a time runs it (an advisory lock scoped to
    /// the database): while another does, this answers at once with
    /// [`GcReport::held_elsewhere`] and nothing else.
    pub async fn gc(&self, dry_run: bool) -> Result<GcReport, EngineError> {
        let ran = self
            .inner
            .ownership
            .exclusive("gc", self.gc_now(dry_run))
            .await?;
        Ok(ran.unwrap_or(GcReport {
            dry_run,
            held_elsewhere: true,
            ..GcReport::default()
        }))
    }

    async fn gc_now(&self, dry_run: bool) -> Result<GcReport, EngineError> {
        let p = self.inner.provider.clone();
        let installation = self.inner.installation_id.clone();
        let backend = p.name();
        let listing = |e: crate::provider::ProviderError| EngineError::Provider {
            backend: backend.to_string(),
            message: format!("cannot list resources for gc: {e}"),
            hint: None,
        };
        let sandboxes = p.list_sandboxes(&installation).await.map_err(listing)?;
        let snapshots = p.list_snapshots(&installation).await.map_err(listing)?;
        // Read the tasks only after listing: the journal records a create or a snapshot before
        // it is made, so every resource listed above is already known to its task as in flight
        // or held. (Reading first would race with another process creating one.)
        let mut tasks = self.tasks().await?;
        // A removed task (`taskbox rm`) holds no sandbox, and no snapshot unless it kept them:
        // what its removal could not stop or delete is an orphan here.
        let removed: std::collections::HashMap<TaskId, bool> = self
            .query(|lp| Ok(lp.store.removed_tasks()?))
            .await?
            .into_iter()
            .map(|(id, m)| (id, m.kept_snapshots))
            .collect();
        for t in &mut tasks {
            if let Some(&kept) = removed.get(t.id.as_str()) {
                t.sandbox = None;
                if !crate::core::retention::removed_task_holds(true, kept) {
                    t.snapshots.clear();
                }
            }
        }
        let busy: std::collections::HashSet<&str> = tasks
            .iter()
            .filter(|t| t.state.is_transient())
            .map(|t| t.id.as_str())
            .collect();
        // A persistent task still holding a sandbox may yet adopt the snapshot the platform
        // took of that sandbox as it stopped (its next probe finds it): none of its unretained
        // snapshots is deleted until it holds no sandbox.
        let may_adopt: std::collections::HashSet<&str> = tasks
            .iter()
            .filter(|t| t.sandbox.is_some() && t.settings.persistent)
            .map(|t| t.id.as_str())
            .collect();
        let held: std::collections::HashSet<&str> = tasks
            .iter()
            .filter_map(|t| t.sandbox.as_ref().map(|s| s.id.as_str()))
            .collect();
        let retained: std::collections::HashSet<&str> = tasks
            .iter()
            .flat_map(|t| t.retained_snapshot_ids())
            .map(SnapshotId::as_str)
            .collect();
        let mut report = GcReport {
            dry_run,
            ..GcReport::default()
        };
        let is_busy = |task: &Option<String>| task.as_deref().is_some_and(|t| busy.contains(t));
        // Sandboxes first, then snapshots: one pass, the kind deciding the call and the list.
        let orphans = sandboxes
            .into_iter()
            .filter(|s| s.live && !held.contains(s.id.as_str()))
            .map(|r| (Orphan::Sandbox, r))
            .chain(
                snapshots
                    .into_iter()
                    .filter(|s| s.live && !retained.contains(s.id.as_str()))
                    .map(|r| (Orphan::Snapshot, r)),
            );
        for (kind, r) in orphans {
            if is_busy(&r.task_id) {
                report.skipped.push(GcItem {
                    reason: "its task has an operation in flight".into(),
                    id: r.id,
                    task_id: r.task_id,
                });
                continue;
            }
            if kind == Orphan::Snapshot
                && r.task_id.as_deref().is_some_and(|t| may_adopt.contains(t))
            {
                report.skipped.push(GcItem {
                    reason: "its task holds a sandbox whose platform snapshot it may still adopt"
                        .into(),
                    id: r.id,
                    task_id: r.task_id,
                });
                continue;
            }
            if !dry_run {
                let done = match kind {
                    Orphan::Sandbox => p.stop_sandbox(&SandboxId::from(r.id.as_str())).await,
                    Orphan::Snapshot => p.delete_snapshot(&SnapshotId::from(r.id.as_str())).await,
                };
                if let Err(e) = done {
                    report
                        .errors
                        .push(format!("{} {}: {e}", kind.action(), r.id));
                    continue;
                }
            }
            let (list, reason) = match kind {
                Orphan::Sandbox => (&mut report.sandboxes_stopped, "no task holds this sandbox"),
                Orphan::Snapshot => (
                    &mut report.snapshots_deleted,
                    "no task retains this snapshot",
                ),
            };
            list.push(GcItem {
                reason: reason.into(),
                id: r.id,
                task_id: r.task_id,
            });
        }
        if !dry_run {
            match p.sweep_temporaries().await {
                Ok(n) => report.temporaries_removed = n,
                Err(e) => report.errors.push(format!("sweep temporaries: {e}")),
            }
        }
        Ok(report)
    }
}

/// What kind of orphan a listed resource is, for [`Orchestrator::gc`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Orphan {
    Sandbox,
    Snapshot,
}

impl Orphan {
    /// The call that removes it, as an error message names it.
    fn action(self) -> &'static str {
        match self {
            Orphan::Sandbox => "stop sandbox",
            Orphan::Snapshot => "delete snapshot",
        }
    }
}
