//! Table tests of recovery after a restart: what `loaded` decides in each situation, the
//! requests that wait for the recovery probe, probe failures retried by the policy and then
//! given up, and the older journals' `recovered`, which replays without the wait.

use taskbox::core::*;

use super::{settings, T0};
use crate::support::tid;

const DEADLINE: Millis = T0 + 300_000;

fn at(task: &Task, ev: Event, now: Millis) -> Transition {
    step(task, ev, now).expect("valid event")
}

/// A task running in sandbox `s` (deadline [`DEADLINE`]), nothing in flight, as a previous
/// process left it.
fn running_task() -> Task {
    let t = Task::new(tid("demo"), settings(), T0);
    let tr = at(&t, Event::ResumeRequested { request_id: 1 }, T0);
    at(
        &tr.next,
        Event::SandboxReady {
            generation: 1,
            sandbox_id: "s".into(),
            name: "s".into(),
            deadline: DEADLINE,
        },
        T0,
    )
    .next
}

/// `running_task` loaded by a new process: probing, the probe emitted.
fn probing_task() -> Task {
    let tr = at(&running_task(), Event::Loaded, T0 + 10);
    assert!(tr.next.probing);
    assert_eq!(tr.next.attempts, 1, "the probe is attempt 1");
    assert_eq!(
        tr.commands,
        vec![Command::ProbeSandbox {
            sandbox_id: "s".into()
        }]
    );
    tr.next
}

fn run(request_id: RequestId) -> Event {
    Event::RunRequested {
        request_id,
        command: "make".into(),
        timeout_ms: 1_000,
    }
}

fn runs(commands: &[Command]) -> Vec<RequestId> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::RunCommand { request_id, .. } => Some(*request_id),
            _ => None,
        })
        .collect()
}

fn retry_timer(commands: &[Command]) -> Option<Millis> {
    commands.iter().find_map(|c| match c {
        Command::ScheduleTimer {
            timer: TimerKind::Retry,
            at,
        } => Some(*at),
        _ => None,
    })
}

#[test]
fn loading_a_task_with_nothing_in_flight_changes_nothing() {
    let idle = Task::new(tid("demo"), settings(), T0);
    let tr = at(&idle, Event::Loaded, T0 + 10);
    assert_eq!(tr.next, idle, "absorbed");
    assert!(tr.commands.is_empty());
}

#[test]
fn a_run_requested_while_probing_waits_for_the_probe_then_runs() {
    let t = probing_task();
    let held = at(&t, run(2), T0 + 20);
    assert!(
        held.commands.is_empty(),
        "nothing runs before the probe answers"
    );
    assert_eq!(held.next.queue.len(), 1, "the request waits in the queue");
    assert!(held.next.running.is_none());
    // The sandbox's own timers wait too.
    for timer in [TimerKind::Idle, TimerKind::Checkpoint, TimerKind::Deadline] {
        let tr = at(&held.next, Event::TimerFired { timer }, DEADLINE + 1);
        assert_eq!(tr.next, held.next, "{timer:?} while probing");
        assert!(tr.commands.is_empty());
    }

    let probed = at(
        &held.next,
        Event::SandboxProbed {
            sandbox_id: "s".into(),
            alive: Some(DEADLINE + 5),
            platform_snapshot: None,
            usage: None,
        },
        T0 + 30,
    );
    assert!(!probed.next.probing);
    assert_eq!(runs(&probed.commands), vec![2], "served after the probe");
    assert_eq!(
        probed.next.sandbox.as_ref().map(|s| s.deadline),
        Some(DEADLINE + 5)
    );
    assert!(probed.next.queue.is_empty());
}

#[test]
fn a_run_requested_while_probing_a_dead_sandbox_restores_it_first() {
    // Take a snapshot first, so that the files have somewhere to come back from.
    let t = running_task();
    let tr = at(&t, Event::SuspendRequested { request_id: 2 }, T0);
    let tr = at(
        &tr.next,
        Event::SnapshotTaken {
            seq: 1,
            snapshot_id: "snap-1".into(),
            size_bytes: 1,
            expires_at: None,
            omitted: Vec::new(),
            usage: None,
            resources: None,
        },
        T0,
    );
    let tr = at(&tr.next, Event::ResumeRequested { request_id: 3 }, T0);
    let t = at(
        &tr.next,
        Event::SandboxReady {
            generation: 2,
            sandbox_id: "s2".into(),
            name: "s2".into(),
            deadline: DEADLINE,
        },
        T0,
    )
    .next;

    let loaded = at(&t, Event::Loaded, T0 + 10);
    let held = at(&loaded.next, run(4), T0 + 20);
    assert!(runs(&held.commands).is_empty());
    let dead = at(
        &held.next,
        Event::SandboxProbed {
            sandbox_id: "s2".into(),
            alive: None,
            platform_snapshot: None,
            usage: None,
        },
        T0 + 30,
    );
    assert_eq!(dead.next.state, TaskState::Restoring, "{:?}", dead.next);
    assert!(!dead.next.probing);
    assert!(dead.commands.iter().any(|c| matches!(
        c,
        Command::CreateSandbox {
            source_snapshot: Some(s),
            ..
        } if s.as_str() == "snap-1"
    )));
    assert!(
        !dead
            .commands
            .iter()
            .any(|c| matches!(c, Command::Reply { request_id: 4, .. })),
        "the request is not failed: it runs once the files are restored"
    );
}

#[test]
fn probe_failures_are_retried_by_the_policy_then_the_sandbox_is_assumed_alive() {
    let policy = settings().retry;
    let mut t = at(&probing_task(), run(2), T0 + 20).next;
    let mut now = T0 + 30;
    for attempt in 1..policy.max_attempts {
        let failed = at(
            &t,
            Event::ProbeFailed {
                sandbox_id: "s".into(),
                failure: Failure::transient("503 service unavailable", None),
            },
            now,
        );
        let RetryDecision::RetryAfter(delay) = policy.decide(attempt, None) else {
            panic!("attempt {attempt} is retried");
        };
        assert_eq!(retry_timer(&failed.commands), Some(now + delay));
        assert_eq!(failed.next.retry_at, Some(now + delay));
        assert!(failed.next.probing, "still waiting");
        assert!(runs(&failed.commands).is_empty());

        now += delay;
        let retried = at(
            &failed.next,
            Event::TimerFired {
                timer: TimerKind::Retry,
            },
            now,
        );
        assert_eq!(
            retried.commands,
            vec![Command::ProbeSandbox {
                sandbox_id: "s".into()
            }]
        );
        assert_eq!(retried.next.attempts, attempt + 1);
        t = retried.next;
    }
    // Out of attempts: the sandbox is assumed alive until its recorded deadline, and the
    // waiting request runs (a dead sandbox would show in its answer).
    let gave_up = at(
        &t,
        Event::ProbeFailed {
            sandbox_id: "s".into(),
            failure: Failure::transient("503 service unavailable", None),
        },
        now,
    );
    assert!(!gave_up.next.probing);
    assert_eq!(
        gave_up.next.sandbox.as_ref().map(|s| s.deadline),
        Some(DEADLINE)
    );
    assert_eq!(retry_timer(&gave_up.commands), None);
    assert_eq!(runs(&gave_up.commands), vec![2]);
}

#[test]
fn a_probe_failure_retrying_cannot_help_assumes_the_sandbox_alive_at_once() {
    let t = at(&probing_task(), run(2), T0 + 20).next;
    let tr = at(
        &t,
        Event::ProbeFailed {
            sandbox_id: "s".into(),
            failure: Failure::new(FailureKind::Auth, "401 token expired"),
        },
        T0 + 30,
    );
    assert!(!tr.next.probing);
    assert_eq!(runs(&tr.commands), vec![2]);
}

#[test]
fn a_restart_during_the_probe_carries_on_with_it() {
    let t = probing_task();
    let failed = at(
        &at(&t, run(2), T0 + 20).next,
        Event::ProbeFailed {
            sandbox_id: "s".into(),
            failure: Failure::transient("503", Some(5_000)),
        },
        T0 + 30,
    );
    let due = failed.next.retry_at.expect("a retry is due");
    // The new process: the waiting caller is gone, the retry stays due, attempts are kept.
    let again = at(&failed.next, Event::Loaded, T0 + 40);
    assert!(again.next.probing);
    assert_eq!(again.next.attempts, 1);
    assert_eq!(retry_timer(&again.commands), Some(due));
    assert!(again.commands.iter().any(|c| matches!(
        c,
        Command::Reply {
            request_id: 2,
            reply: Reply::Failed { .. }
        }
    )));
    // Without a retry pending, the probe is simply made again.
    let again = at(&t, Event::Loaded, T0 + 40);
    assert!(again.next.probing);
    assert_eq!(
        again.commands,
        vec![Command::ProbeSandbox {
            sandbox_id: "s".into()
        }]
    );
}

#[test]
fn a_probe_failure_nobody_waits_for_is_absorbed() {
    let t = running_task();
    let tr = at(
        &t,
        Event::ProbeFailed {
            sandbox_id: "s".into(),
            failure: Failure::transient("503", None),
        },
        T0 + 10,
    );
    assert_eq!(tr.next, t);
    assert!(tr.commands.is_empty());
}

#[test]
fn an_older_journals_recovered_replays_without_the_wait() {
    // Engines that wrote `recovered` held requests for the probe themselves: their journal
    // shows the probe and no wait, and must replay exactly so.
    let tr = at(&running_task(), Event::Recovered, T0 + 10);
    assert!(!tr.next.probing);
    assert_eq!(tr.next.attempts, 0);
    assert_eq!(
        tr.commands,
        vec![Command::ProbeSandbox {
            sandbox_id: "s".into()
        }]
    );
    let ran = at(&tr.next, run(2), T0 + 20);
    assert_eq!(runs(&ran.commands), vec![2]);
}

/// `running_task` after a suspend (snapshot `snap-1`), resumed into `s2` where a command ran,
/// then loaded by a new process: probing `s2`.
fn probing_after_work() -> Task {
    let t = running_task();
    let tr = at(&t, Event::SuspendRequested { request_id: 2 }, T0);
    let tr = at(
        &tr.next,
        Event::SnapshotTaken {
            seq: 1,
            snapshot_id: "snap-1".into(),
            size_bytes: 1,
            expires_at: None,
            omitted: Vec::new(),
            usage: None,
            resources: None,
        },
        T0,
    );
    let tr = at(&tr.next, run(3), T0);
    let tr = at(
        &tr.next,
        Event::SandboxReady {
            generation: 2,
            sandbox_id: "s2".into(),
            name: "s2".into(),
            deadline: DEADLINE,
        },
        T0,
    );
    let tr = at(
        &tr.next,
        Event::CommandExited {
            request_id: 3,
            exit_code: 0,
            timed_out: false,
            memory_killed: false,
        },
        T0 + 5,
    );
    at(&tr.next, Event::Loaded, T0 + 10).next
}

#[test]
fn a_sandbox_the_platform_stopped_with_a_snapshot_of_its_own_is_restored_from_that_snapshot() {
    let t = probing_after_work();
    let held = at(&t, run(4), T0 + 20);
    let found = PlatformSnapshot {
        snapshot_id: "snap-platform".into(),
        size_bytes: 42,
        expires_at: Some(T0 + 86_400_000),
    };
    let dead = at(
        &held.next,
        Event::SandboxProbed {
            sandbox_id: "s2".into(),
            alive: None,
            platform_snapshot: Some(found.clone()),
            usage: None,
        },
        T0 + 30,
    );
    let next = &dead.next;
    assert_eq!(next.state, TaskState::Restoring, "{next:?}");
    // Journaled as the task's newest complete snapshot, reason `platform`.
    let latest = next.latest_complete().expect("a complete snapshot");
    assert_eq!(latest.id.as_deref(), Some("snap-platform"));
    assert_eq!(latest.seq, 2);
    assert_eq!(latest.size_bytes, 42);
    assert_eq!(latest.expires_at, found.expires_at);
    assert_eq!(latest.taken_by, Some(SnapshotTaker::Platform));
    assert_eq!(latest.sandbox_id.as_str(), "s2");
    // The restore uses it, and is not behind: the platform's snapshot has every file written.
    assert_eq!(next.restore_source.as_deref(), Some("snap-platform"));
    assert!(!next.files_behind);
    assert!(dead.commands.iter().any(|c| matches!(
        c,
        Command::CreateSandbox { source_snapshot: Some(s), .. } if s.as_str() == "snap-platform"
    )));
    // Retention counts it like any other (keep_snapshots = 2 here: both kept).
    assert!(!dead
        .commands
        .iter()
        .any(|c| matches!(c, Command::DeleteSnapshot { .. })));
    let restored = at(
        next,
        Event::SandboxReady {
            generation: 3,
            sandbox_id: "s3".into(),
            name: "s3".into(),
            deadline: DEADLINE + 60_000,
        },
        T0 + 40,
    );
    let said_lost = restored.commands.iter().any(|c| {
        matches!(c, Command::Reply { reply, .. } if format!("{reply:?}").contains("changes_lost: true"))
    });
    assert!(!said_lost, "{:?}", restored.commands);

    // Without it, the same probe restores the older snapshot and says changes were lost.
    let dead = at(
        &held.next,
        Event::SandboxProbed {
            sandbox_id: "s2".into(),
            alive: None,
            platform_snapshot: None,
            usage: None,
        },
        T0 + 30,
    );
    assert_eq!(dead.next.restore_source.as_deref(), Some("snap-1"));
    assert!(dead.next.files_behind);
}

#[test]
fn a_platform_snapshot_falls_under_keep_snapshots_and_is_ignored_when_not_persistent() {
    // keep_snapshots = 1: adopting the platform's snapshot retires snap-1.
    let mut t = probing_after_work();
    t.settings.keep_snapshots = 1;
    let found = PlatformSnapshot {
        snapshot_id: "snap-platform".into(),
        size_bytes: 42,
        expires_at: None,
    };
    let probed = |t: &Task| {
        at(
            t,
            Event::SandboxProbed {
                sandbox_id: "s2".into(),
                alive: None,
                platform_snapshot: Some(found.clone()),
                usage: None,
            },
            T0 + 30,
        )
    };
    let tr = probed(&t);
    assert!(tr.commands.iter().any(|c| matches!(
        c,
        Command::DeleteSnapshot { snapshot_id } if snapshot_id.as_str() == "snap-1"
    )));
    // No request waits: the task settles expired, its files in the platform's snapshot.
    assert_eq!(tr.next.state, TaskState::Expired);
    assert_eq!(
        tr.next.latest_complete().and_then(|s| s.id.as_deref()),
        Some("snap-platform")
    );

    // Not persistent: the task keeps no snapshots, so it does not adopt one either.
    let mut t = probing_after_work();
    t.settings.persistent = false;
    let tr = probed(&t);
    assert!(tr
        .next
        .snapshots
        .iter()
        .all(|s| s.id.as_deref() != Some("snap-platform")));
}
