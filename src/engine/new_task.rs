//! A task made by the event loop outside a caller's `run`: a fork's child, committed whole
//! before the parent's caller is answered.

use super::batch::{batch_sync, Staged};
use super::event_loop::EventLoop;
use super::EngineError;
use crate::core::{Event, SnapshotRecord, Task};
use crate::ids::TaskId;
use crate::store::TransitionRecord;

impl EventLoop {
    /// Refuses `child` as the name of a new task when a task has (or had) that name.
    pub(super) fn check_new_task(&self, child: &TaskId) -> Result<(), EngineError> {
        if self.tasks.contains_key(child.as_str())
            || self.store.task_marks(child.as_str())?.is_some()
        {
            return Err(EngineError::TaskExists {
                task: child.clone(),
            });
        }
        Ok(())
    }

    /// Creates the task `child`, forked from `parent`'s `snapshot` (the parent's answer to a
    /// fork request, durable already): its creation and [`Event::Forked`] are committed now,
    /// before the parent's caller is answered (an answered fork is in the journal: `show`
    /// finds it, a crash keeps it) and before any later transition's command is performed —
    /// in particular before a delete of that snapshot could ask who retains it.
    pub(super) fn create_fork(
        &mut self,
        parent: &TaskId,
        child: &TaskId,
        snapshot: SnapshotRecord,
    ) -> Result<(), EngineError> {
        self.check_new_task(child)?;
        let now = self.clock.now_ms();
        let task = Task::new(child.clone(), self.settings.clone(), now);
        self.staged.push(Staged {
            task: child.clone(),
            at: now,
            event: Event::SettingsChanged {
                settings: self.settings.clone(),
            },
            state_before: task.state,
            task_before: None,
            task_after: task.clone(),
            commands: Vec::new(),
        });
        self.tasks.insert(child.clone(), task);
        self.hold(child);
        let forked = Event::Forked {
            parent: parent.clone(),
            snapshot,
        };
        if let Err(e) = self.apply(child, forked) {
            // Nothing of it is committed yet: forget it whole.
            self.tasks.remove(child);
            self.staged.retain(|s| &s.task != child);
            return Err(e);
        }
        self.commit_new_task(child)
    }

    /// Commits the staged transitions of the new task `child` at once, alone (other tasks'
    /// staged transitions wait for the next flush), and performs their commands. If the store
    /// does not take them, the task is forgotten whole and the error returned.
    fn commit_new_task(&mut self, child: &TaskId) -> Result<(), EngineError> {
        let (mine, rest): (Vec<Staged>, Vec<Staged>) = std::mem::take(&mut self.staged)
            .into_iter()
            .partition(|s| &s.task == child);
        self.staged = rest;
        let records: Vec<TransitionRecord<'_>> = mine.iter().map(Staged::record).collect();
        let watch = crate::clock::Stopwatch::start();
        let committed = self.store.commit_batch_with(&records, batch_sync(&mine));
        crate::engine::metrics::global().commit_done(
            watch.elapsed_secs(),
            records.len(),
            committed.is_ok(),
        );
        drop(records);
        if let Err(e) = committed {
            self.tasks.remove(child);
            return Err(e.into());
        }
        for s in mine {
            self.committed(s);
        }
        Ok(())
    }
}
