//! Which batches of the event loop wait for the disk sync ([`batch_sync`]): every batch that
//! calls the provider (write-ahead) — but a command in a sandbox that has run one before — and
//! a new task's first; the others ride on the next one.

use crate::core::{Command, Event, Millis, Task, TaskState};
use crate::ids::TaskId;
use crate::store::{Sync, TransitionRecord};

/// A transition waiting for the group commit: applied to the in-memory task already, its
/// commands held back until it is durable.
pub(super) struct Staged {
    pub(super) task: TaskId,
    pub(super) at: Millis,
    pub(super) event: Event,
    pub(super) state_before: TaskState,
    /// The task before the transition (`None`: it did not exist), restored if the transition
    /// cannot be committed.
    pub(super) task_before: Option<Task>,
    pub(super) task_after: Task,
    pub(super) commands: Vec<Command>,
}

impl Staged {
    /// The transition as the store journals it.
    pub(super) fn record(&self) -> TransitionRecord<'_> {
        TransitionRecord {
            at: self.at,
            event: &self.event,
            state_before: self.state_before,
            task_after: &self.task_after,
            commands: &self.commands,
        }
    }
}

/// When a batch must be on disk: before any provider call it performs (write-ahead), and
/// before a new task's first transition (its backend is claimed right after). A batch that
/// only answers callers and arms timers — a command's result, a request queued behind another —
/// rides on the next commit's sync ([`Sync::WithNext`]): it is committed (every reader sees it,
/// a crash of any process keeps it) before its answers are sent, and only a power loss before
/// the next synced commit can lose it. That loses an outcome, never a decision: recovery then
/// finds the command still running, reports it interrupted and probes the sandbox, exactly as
/// after a power loss during the command; no provider call was made on the strength of it.
///
/// So does a command started in a sandbox that already ran one ([`Command::RunCommand`] with
/// the sandbox marked `used` before the transition, nothing else calling the provider): the
/// first command in a sandbox is synced before it runs, since it marks the sandbox as holding
/// files no snapshot has (what a later restore tells the caller). A power loss that drops a
/// later command's record leaves the journal as it was after the previous command — the same
/// sandbox, already `used`, idle since then — so nothing decided from it changes: a snapshot is
/// never skipped for it, only the idle timer counts from the previous command. The command
/// itself dies with the machine (local) or finishes unwatched (Vercel, where the idle
/// snapshot then stops it); its caller, gone with the power, had no answer either way.
pub(super) fn batch_sync(staged: &[Staged]) -> Sync {
    if staged.iter().any(needs_sync) {
        Sync::Now
    } else {
        Sync::WithNext
    }
}

/// Whether one staged transition must be synced before its commands are performed.
fn needs_sync(s: &Staged) -> bool {
    let Some(before) = &s.task_before else {
        return true; // a new task's first transition
    };
    s.commands.iter().any(|c| match c {
        Command::RunCommand { sandbox_id, .. } => !before
            .sandbox
            .as_ref()
            .is_some_and(|sb| sb.used && &sb.id == sandbox_id),
        other => calls_provider(other),
    })
}

/// Whether performing `cmd` calls the provider (no wildcard: a new command is decided here).
pub(super) fn calls_provider(cmd: &Command) -> bool {
    match cmd {
        Command::CreateSandbox { .. }
        | Command::RunCommand { .. }
        | Command::TakeSnapshot { .. }
        | Command::TakeCheckpoint { .. }
        | Command::StopSandbox { .. }
        | Command::ExtendTimeout { .. }
        | Command::DeleteSnapshot { .. }
        | Command::ProbeSandbox { .. }
        | Command::ReadUsage { .. }
        | Command::SampleActivity { .. } => true,
        Command::ScheduleTimer { .. } | Command::Reply { .. } => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{step, Event, Millis, Task, TaskSettings};
    use crate::ids::TaskId;

    /// `step` on `task`, staged as the loop stages it.
    fn staged(task: &Task, event: Event, now: Millis, new: bool) -> (Staged, Task) {
        let tr = step(task, event.clone(), now).expect("a valid transition");
        let s = Staged {
            task: task.id.clone(),
            at: now,
            event,
            state_before: task.state,
            task_before: (!new).then(|| task.clone()),
            task_after: tr.next.clone(),
            commands: tr.commands,
        };
        (s, tr.next)
    }

    /// The first sandbox of a task becomes ready.
    fn ready() -> Event {
        Event::SandboxReady {
            generation: 1,
            sandbox_id: "sbx".into(),
            name: "sbx".into(),
            deadline: 1_000_000,
        }
    }

    /// The first command in a sandbox makes one synced commit, before it runs (write-ahead of
    /// the command, which marks the sandbox used); a later one and every result, which only
    /// answers the caller, ride on the next sync. A new task's first batch and anything else
    /// that calls the provider are synced.
    #[test]
    fn a_sandbox_s_first_command_syncs_before_it_runs_and_later_ones_and_results_ride_on_the_next_sync(
    ) {
        let id = TaskId::new("t").expect("a valid id");
        let task = Task::new(id, TaskSettings::default(), 0);
        let run = |request_id| Event::RunRequested {
            request_id,
            command: "true".into(),
            timeout_ms: 1_000,
        };
        // Cold: a new task, and a create.
        let (s, task) = staged(&task, run(1), 1, true);
        assert_eq!(batch_sync(&[s]), Sync::Now, "a new task's first commit");
        let (s, task) = staged(&task, ready(), 2, false);
        assert!(s
            .commands
            .iter()
            .any(|c| matches!(c, Command::RunCommand { .. })));
        assert_eq!(
            batch_sync(&[s]),
            Sync::Now,
            "write-ahead of the sandbox's first command"
        );
        let exited = |request_id| Event::CommandExited {
            request_id,
            exit_code: 0,
            timed_out: false,
            memory_killed: false,
        };
        let (s, task) = staged(&task, exited(1), 3, false);
        assert!(
            s.commands.iter().all(|c| !calls_provider(c)),
            "{:?}",
            s.commands
        );
        assert_eq!(batch_sync(&[s]), Sync::WithNext, "only an answer");
        // Warm: the sandbox ran a command already, so the next one rides too, as its result.
        let (ran, task) = staged(&task, run(2), 4, false);
        assert!(ran
            .commands
            .iter()
            .any(|c| matches!(c, Command::RunCommand { .. })));
        assert_eq!(batch_sync(std::slice::from_ref(&ran)), Sync::WithNext);
        let (done, task) = staged(&task, exited(2), 5, false);
        assert_eq!(batch_sync(std::slice::from_ref(&done)), Sync::WithNext);
        assert_eq!(batch_sync(&[done, ran]), Sync::WithNext);
        // Anything else that calls the provider is synced, with it or alone.
        let (suspend, _) = staged(&task, Event::SuspendRequested { request_id: 3 }, 6, false);
        assert!(suspend.commands.iter().any(calls_provider));
        assert_eq!(batch_sync(&[suspend]), Sync::Now);
    }

    /// A command in a sandbox that never ran one (restored, say) is synced before it runs: it
    /// marks the sandbox as holding files no snapshot has.
    #[test]
    fn a_command_in_an_unused_sandbox_is_synced_even_when_the_task_is_warm() {
        let id = TaskId::new("t").expect("a valid id");
        let task = Task::new(id, TaskSettings::default(), 0);
        let (_, task) = staged(
            &task,
            Event::RunRequested {
                request_id: 1,
                command: "true".into(),
                timeout_ms: 1_000,
            },
            1,
            true,
        );
        let (_, mut task) = staged(&task, ready(), 2, false);
        let (_, t) = staged(
            &task,
            Event::CommandExited {
                request_id: 1,
                exit_code: 0,
                timed_out: false,
                memory_killed: false,
            },
            3,
            false,
        );
        task = t;
        task.sandbox.as_mut().expect("a live sandbox").used = false;
        let (ran, _) = staged(
            &task,
            Event::RunRequested {
                request_id: 2,
                command: "true".into(),
                timeout_ms: 1_000,
            },
            4,
            false,
        );
        assert!(ran
            .commands
            .iter()
            .any(|c| matches!(c, Command::RunCommand { .. })));
        assert_eq!(batch_sync(&[ran]), Sync::Now);
    }
}
