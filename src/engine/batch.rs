//! Which batches of the event loop wait for the disk sync ([`batch_sync`]): every batch that
//! calls the provider (write-ahead), and a new task's first; the others ride on the next one.

use super::event_loop::Staged;
use crate::core::Command;
use crate::store::Sync;

/// When a batch must be on disk: before any provider call it performs (write-ahead), and
/// before a new task's first transition (its backend is claimed right after). A batch that
/// only answers callers and arms timers — a command's result, a request queued behind another —
/// rides on the next commit's sync ([`Sync::WithNext`]): it is committed (every reader sees it,
/// a crash of any process keeps it) before its answers are sent, and only a power loss before
/// the next synced commit can lose it. That loses an outcome, never a decision: recovery then
/// finds the command still running, reports it interrupted and probes the sandbox, exactly as
/// after a power loss during the command; no provider call was made on the strength of it.
pub(super) fn batch_sync(staged: &[Staged]) -> Sync {
    let calls_provider = staged
        .iter()
        .any(|s| s.task_before.is_none() || s.commands.iter().any(calls_provider));
    if calls_provider {
        Sync::Now
    } else {
        Sync::WithNext
    }
}

/// Whether performing `cmd` calls the provider (no wildcard: a new command is decided here).
pub(super) fn calls_provider(cmd: &Command) -> bool {
    match cmd {
        Command::CreateSandbox { .. }
        | Command::RunCommand { .. }
        | Command::TakeSnapshot { .. }
        | Command::StopSandbox { .. }
        | Command::ExtendTimeout { .. }
        | Command::DeleteSnapshot { .. }
        | Command::ProbeSandbox { .. } => true,
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

    /// A warm command makes one synced commit, before it runs (write-ahead of the command);
    /// its result, which only answers the caller, rides on the next one. A new task's first
    /// batch and anything that calls the provider are synced.
    #[test]
    fn a_warm_command_syncs_before_it_runs_and_its_result_rides_on_the_next_sync() {
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
        let (s, task) = staged(
            &task,
            Event::SandboxReady {
                generation: 1,
                sandbox_id: "sbx".into(),
                name: "sbx".into(),
                deadline: 1_000_000,
            },
            2,
            false,
        );
        assert!(s
            .commands
            .iter()
            .any(|c| matches!(c, Command::RunCommand { .. })));
        assert_eq!(batch_sync(&[s]), Sync::Now, "write-ahead of the command");
        let exited = |request_id| Event::CommandExited {
            request_id,
            exit_code: 0,
            timed_out: false,
        };
        let (s, task) = staged(&task, exited(1), 3, false);
        assert!(
            s.commands.iter().all(|c| !calls_provider(c)),
            "{:?}",
            s.commands
        );
        assert_eq!(batch_sync(&[s]), Sync::WithNext, "only an answer");
        // Warm: the request runs at once (synced), its result is deferred.
        let (s, task) = staged(&task, run(2), 4, false);
        let (ran, task) = (s, task);
        assert_eq!(batch_sync(std::slice::from_ref(&ran)), Sync::Now);
        let (done, _) = staged(&task, exited(2), 5, false);
        assert_eq!(batch_sync(std::slice::from_ref(&done)), Sync::WithNext);
        // A batch with both is synced.
        assert_eq!(batch_sync(&[done, ran]), Sync::Now);
    }
}
