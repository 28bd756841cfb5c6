//! Unloading settled tasks, so that a server's descriptors (two per task lock) and memory are
//! bounded by its live work, not by every task it ever drove.
//!
//! After each commit, every task it touched is looked at once its commands are performed
//! ([`EventLoop::unload_settled`]): a task with nothing live — no sandbox, no operation or
//! request, no retry due, no snapshot being taken or deleted, no provider call in flight, no
//! caller waiting — is dropped from memory with its timers (the core absorbs every timer of
//! an idle or expired task) and its lock let go ([`TaskLocks::unloaded`](super::lock::TaskLocks::unloaded); a caller's
//! claim keeps it until answered). Everything about it is in the journal: the next request
//! takes the lock again and loads it as a new process would ([`Event::Loaded`] finds nothing
//! to recover). A fleet's leases (PostgreSQL) are left as they are.
//!
//! [`Event::Loaded`]: crate::core::Event::Loaded

use super::event_loop::EventLoop;
use crate::core::{SnapshotStatus, Task, TaskState};
use crate::ids::TaskId;

impl EventLoop {
    /// The event loop loaded `task`: its lock stays while it is loaded.
    pub(super) fn hold(&self, task: &TaskId) {
        if let Some(locks) = &self.locks {
            locks.loaded(task);
        }
    }

    /// A provider call for `task` started.
    pub(super) fn call_started(&mut self, task: &TaskId) {
        self.inflight += 1;
        *self.inflight_by_task.entry(task.clone()).or_default() += 1;
    }

    /// A provider call for `task` answered.
    pub(super) fn call_answered(&mut self, task: &TaskId) {
        self.inflight -= 1;
        if let Some(n) = self.inflight_by_task.get_mut(task) {
            *n -= 1;
            if *n == 0 {
                self.inflight_by_task.remove(task);
            }
        }
    }

    /// Unloads the tasks committed since the last call that have nothing live, and lets go of
    /// their locks (see the [module docs](self)). Only under the `flock`s.
    pub(super) fn unload_settled(&mut self) {
        let settled = std::mem::take(&mut self.settled);
        let Some(locks) = self.locks.clone() else {
            return;
        };
        if self.shutdown.is_some() {
            return;
        }
        for id in settled {
            let quiet = match self.tasks.get(&id) {
                Some(task) => self.is_quiet(task),
                None => false,
            };
            if quiet {
                self.tasks.remove(&id);
                // Its timers are moot (the core absorbs every timer of a task at rest).
                let timers: Vec<_> = self
                    .timers
                    .keys()
                    .filter(|(t, _)| t == &id)
                    .cloned()
                    .collect();
                for key in timers {
                    if let Some(armed) = self.timers.remove(&key) {
                        armed.handle.abort();
                    }
                }
                locks.unloaded(&id);
            }
        }
    }

    /// Whether nothing about `task` is live: what is left of it is all in the journal.
    fn is_quiet(&self, task: &Task) -> bool {
        let id = &task.id;
        let at_rest = matches!(task.state, TaskState::Idle | TaskState::Expired)
            && task.sandbox.is_none()
            && task.queue.is_empty()
            && task.running.is_none()
            && !task.probing
            && task.retry_at.is_none()
            && task
                .snapshots
                .iter()
                .all(|s| !matches!(s.status, SnapshotStatus::Pending | SnapshotStatus::Deleting));
        at_rest
            && !self.staged.iter().any(|s| &s.task == id)
            && !self.inflight_by_task.contains_key(id)
            && self
                .waiters
                .range((id.clone(), 0)..=(id.clone(), u64::MAX))
                .next()
                .is_none()
    }
}
