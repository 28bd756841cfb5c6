//! The event loop's side of a fleet's leases (PostgreSQL store): what it does when a task's
//! lease is found lost, and the check before a committed transition's provider calls.
//!
//! A fenced commit that is refused (another server took the lease: `StoreError::LeaseLost`)
//! goes the way of every failed commit — the task is unloaded and its callers are answered
//! (`EventLoop::unload`, which also tells the [`Fence`](super::fence::Fence)). Here: the
//! renewal timer's report of a lost lease, and a lease that lapsed by this server's own clock
//! between a commit and its provider calls (a server paused, or cut off from the database).

use super::batch::calls_provider;
use super::batch::Staged;
use super::event_loop::EventLoop;
use crate::ids::TaskId;
use crate::store::StoreError;

impl EventLoop {
    /// The renewal found the task's lease taken over by `owner`: stop driving the task now.
    /// What was staged for it is dropped (it could not be committed any more) and every caller
    /// waiting on it is answered "moved to another server"; the outcomes of its calls still in
    /// flight are ignored. A later request takes the lease again, or learns where it lives.
    pub(super) fn lease_lost(&mut self, task: TaskId, owner: Option<String>) {
        if let Some(fence) = &self.fence {
            fence.lost(&task);
        }
        if !self.tasks.contains_key(&task) {
            return;
        }
        self.staged.retain(|s| s.task != task);
        let err = StoreError::LeaseLost {
            task_id: task.to_string(),
            owner,
        };
        self.unload(&task, None, err);
    }

    /// Whether the committed transition `s` may have its commands performed. On a fleet, a
    /// transition that calls the provider is performed only while this server's lease on the
    /// task is fresh by its own clock: a server that was paused (or cut off from the database)
    /// past its lease between the commit and now must not act — another server may own the task
    /// and be re-issuing the same operation. The task is given up instead (its callers get the
    /// retryable "moved" error) and the next request recovers it from the journal, here or on
    /// the server that took it. A task given up earlier in the same batch performs nothing.
    pub(super) fn may_act(&mut self, s: &Staged) -> bool {
        let Some(fence) = self.fence.clone() else {
            return true;
        };
        if !self.tasks.contains_key(&s.task) {
            return false;
        }
        if !s.commands.iter().any(calls_provider) || fence.may_act(&s.task) {
            return true;
        }
        tracing::warn!(task = %s.task,
            "the task's lease lapsed before its provider call; this server stops driving it");
        let err = StoreError::LeaseLost {
            task_id: s.task.to_string(),
            owner: None,
        };
        self.unload(&s.task, None, err);
        false
    }
}
