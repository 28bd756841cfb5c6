//! Table tests of chosen transitions: late and duplicate outcomes absorbed, snapshot fallbacks,
//! the idle reaper, refused request ids and the retry policy.

use taskbox::core::*;

use super::{settings, T0};
use crate::support::tid;

fn t0() -> Task {
    Task::new(tid("demo"), settings(), T0)
}

fn run_step(task: &Task, ev: Event) -> Transition {
    step(task, ev, T0 + 10).expect("valid event")
}

#[test]
fn first_run_provisions_then_runs() {
    let tr = run_step(
        &t0(),
        Event::RunRequested {
            request_id: 1,
            command: "ls".into(),
            timeout_ms: 5,
        },
    );
    assert_eq!(tr.next.state, TaskState::Provisioning);
    assert!(matches!(
        tr.commands[..],
        [Command::CreateSandbox {
            generation: 1,
            source_snapshot: None,
            ..
        }]
    ));
    let tr = run_step(
        &tr.next,
        Event::SandboxReady {
            generation: 1,
            sandbox_id: "s".into(),
            name: "s".into(),
            deadline: T0 + 300_000,
        },
    );
    assert_eq!(tr.next.state, TaskState::Running);
    assert!(tr
        .commands
        .iter()
        .any(|c| matches!(c, Command::RunCommand { request_id: 1, .. })));
    // The first sandbox of a task is no "recreation".
    assert!(tr.next.notices.is_empty());
}

fn running_task() -> Task {
    let tr = run_step(&t0(), Event::ResumeRequested { request_id: 1 });
    run_step(
        &tr.next,
        Event::SandboxReady {
            generation: 1,
            sandbox_id: "s".into(),
            name: "s".into(),
            deadline: T0 + 300_000,
        },
    )
    .next
}

fn suspended_task() -> Task {
    let tr = run_step(&running_task(), Event::SuspendRequested { request_id: 2 });
    assert_eq!(tr.next.state, TaskState::Snapshotting);
    let tr = run_step(
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
    );
    assert_eq!(tr.next.state, TaskState::Expired);
    assert!(tr.commands.contains(&Command::Reply {
        request_id: 2,
        reply: Reply::Suspended {
            snapshot_id: Some("snap-1".into()),
            omitted: Vec::new(),
        }
    }));
    tr.next
}

#[test]
fn duplicate_snapshot_taken_is_absorbed() {
    let t = suspended_task();
    let tr = run_step(
        &t,
        Event::SnapshotTaken {
            seq: 1,
            snapshot_id: "snap-1".into(),
            size_bytes: 1,
            expires_at: None,
            omitted: Vec::new(),
            usage: None,
            resources: None,
        },
    );
    assert_eq!(tr.next, t, "a second 'snapshot taken' changes nothing");
    assert!(tr.commands.is_empty());
}

#[test]
fn stale_command_exit_is_absorbed() {
    let t = running_task();
    let tr = run_step(
        &t,
        Event::CommandExited {
            request_id: 99,
            exit_code: 0,
            timed_out: false,
            memory_killed: false,
        },
    );
    assert_eq!(tr.next, t);
    assert!(tr.commands.is_empty());
}

#[test]
fn a_late_ready_from_an_old_generation_is_stopped() {
    let t = running_task();
    let tr = run_step(
        &t,
        Event::SandboxReady {
            generation: 7,
            sandbox_id: "other".into(),
            name: "other".into(),
            deadline: 0,
        },
    );
    assert_eq!(tr.next, t);
    assert_eq!(
        tr.commands,
        vec![Command::StopSandbox {
            sandbox_id: "other".into()
        }]
    );
}

#[test]
fn restore_falls_back_to_older_snapshot_only_when_gone() {
    let mut t = suspended_task();
    // Take a second snapshot.
    let tr = run_step(&t, Event::ResumeRequested { request_id: 3 });
    let tr = run_step(
        &tr.next,
        Event::SandboxReady {
            generation: 2,
            sandbox_id: "s2".into(),
            name: "s2".into(),
            deadline: T0 + 300_000,
        },
    );
    let tr = run_step(&tr.next, Event::SuspendRequested { request_id: 4 });
    t = run_step(
        &tr.next,
        Event::SnapshotTaken {
            seq: 2,
            snapshot_id: "snap-2".into(),
            size_bytes: 1,
            expires_at: None,
            omitted: Vec::new(),
            usage: None,
            resources: None,
        },
    )
    .next;
    // A transient restore error keeps the mapping and retries the same snapshot.
    let tr = run_step(
        &t,
        Event::RunRequested {
            request_id: 5,
            command: "ls".into(),
            timeout_ms: 5,
        },
    );
    assert_eq!(tr.next.restore_source.as_deref(), Some("snap-2"));
    let failed = run_step(
        &tr.next,
        Event::CreateFailed {
            generation: 3,
            failure: Failure::transient("503", None),
        },
    );
    assert_eq!(failed.next.state, TaskState::Restoring);
    assert_eq!(failed.next.restore_source.as_deref(), Some("snap-2"));
    // A permanent restore error gives up but keeps the snapshot.
    let perm = run_step(
        &tr.next,
        Event::CreateFailed {
            generation: 3,
            failure: Failure::new(FailureKind::Permanent, "500"),
        },
    );
    assert_eq!(perm.next.state, TaskState::Expired);
    assert_eq!(
        perm.next.latest_complete().and_then(|s| s.id.as_deref()),
        Some("snap-2")
    );
    // Only "snapshot gone" drops it, falling back to the older one.
    let gone = run_step(
        &tr.next,
        Event::CreateFailed {
            generation: 3,
            failure: Failure::new(FailureKind::SnapshotGone, "410 snapshot_not_found"),
        },
    );
    assert_eq!(gone.next.state, TaskState::Restoring);
    assert_eq!(gone.next.restore_source.as_deref(), Some("snap-1"));
    // And when none is left, it starts fresh and says files were lost.
    let gone2 = run_step(
        &gone.next,
        Event::CreateFailed {
            generation: 4,
            failure: Failure::new(FailureKind::SnapshotGone, "410 snapshot_not_found"),
        },
    );
    assert_eq!(gone2.next.state, TaskState::Provisioning);
    assert!(gone2
        .next
        .notices
        .iter()
        .any(|n| matches!(n, Notice::FilesLost { .. })));
}

/// The idle reaper at every step of its life: a command's end arms the Idle timer at
/// `last_activity + idle_lifetime`; a timer that fires a millisecond early (a clock that runs
/// fast, a timer armed for an earlier activity) leaves the sandbox alone; at the due time, with
/// nothing running or queued, a persistent task snapshots with reason `IdleReap`.
#[test]
fn the_idle_timer_snapshots_at_last_activity_plus_lifetime_and_not_before() {
    let t = running_task();
    let tr = run_step(
        &t,
        Event::RunRequested {
            request_id: 2,
            command: "true".into(),
            timeout_ms: 5_000,
        },
    );
    let done_at = T0 + 500;
    let tr = step(
        &tr.next,
        Event::CommandExited {
            request_id: 2,
            exit_code: 0,
            timed_out: false,
            memory_killed: false,
        },
        done_at,
    )
    .expect("valid");
    let idle = tr.next.clone();
    assert_eq!(idle.state, TaskState::Running);
    assert_eq!(idle.last_activity, done_at, "the command's end is activity");
    let due = done_at + settings().idle_lifetime_ms;
    assert!(
        tr.commands.iter().any(|c| matches!(
            c,
            Command::ScheduleTimer { timer: TimerKind::Idle, at } if *at == due
        )),
        "the Idle timer is armed at last_activity + lifetime: {:?}",
        tr.commands
    );
    let fired = Event::TimerFired {
        timer: TimerKind::Idle,
    };
    // A millisecond early: nothing happens.
    let early = step(&idle, fired.clone(), due - 1).expect("valid");
    assert_eq!(
        early.next.state,
        TaskState::Running,
        "not idle long enough yet"
    );
    assert!(
        !early.commands.iter().any(|c| matches!(
            c,
            Command::TakeSnapshot { .. } | Command::StopSandbox { .. }
        )),
        "{:?}",
        early.commands
    );
    // At the due time exactly: reaped into a snapshot of the live sandbox.
    for now in [due, due + 1] {
        let reap = step(&idle, fired.clone(), now).expect("valid");
        assert_eq!(reap.next.state, TaskState::Snapshotting, "at {now}");
        assert_eq!(reap.next.snapshot_reason, Some(SnapshotReason::IdleReap));
        assert!(
            reap.commands.iter().any(|c| matches!(
                c,
                Command::TakeSnapshot { sandbox_id, .. } if sandbox_id.as_str() == "s"
            )),
            "{:?}",
            reap.commands
        );
    }
}

#[test]
fn idle_reaper_never_stops_a_sandbox_mid_command() {
    let t = running_task();
    let tr = run_step(
        &t,
        Event::RunRequested {
            request_id: 2,
            command: "sleep 1000".into(),
            timeout_ms: 5_000_000,
        },
    );
    assert!(tr.next.running.is_some());
    let late = step(
        &tr.next,
        Event::TimerFired {
            timer: TimerKind::Idle,
        },
        T0 + 10_000_000,
    )
    .expect("valid");
    assert_eq!(
        late.next.state,
        TaskState::Running,
        "a running command is activity"
    );
    assert!(late.commands.is_empty());
}

#[test]
fn a_failed_snapshot_never_replaces_a_good_one() {
    let t = suspended_task();
    let tr = run_step(&t, Event::ResumeRequested { request_id: 3 });
    let tr = run_step(
        &tr.next,
        Event::SandboxReady {
            generation: 2,
            sandbox_id: "s2".into(),
            name: "s2".into(),
            deadline: T0 + 300_000,
        },
    );
    let tr = run_step(&tr.next, Event::SuspendRequested { request_id: 4 });
    let tr = run_step(
        &tr.next,
        Event::SnapshotFailed {
            seq: 2,
            failure: Failure::new(FailureKind::Permanent, "disk full"),
        },
    );
    assert_eq!(tr.next.state, TaskState::Running);
    assert_eq!(
        tr.next.latest_complete().and_then(|s| s.id.as_deref()),
        Some("snap-1")
    );
    assert!(tr.commands.iter().any(|c| matches!(
        c,
        Command::Reply {
            request_id: 4,
            reply: Reply::Failed { .. }
        }
    )));
}

#[test]
fn reused_request_ids_are_refused() {
    let t = running_task();
    let err = step(&t, Event::SuspendRequested { request_id: 1 }, T0).unwrap_err();
    assert!(matches!(
        err,
        StepError::DuplicateRequest { request_id: 1, .. }
    ));
}

#[test]
fn retry_policy_gives_up_after_max_attempts_and_honours_retry_after() {
    let p = RetryPolicy {
        max_attempts: 3,
        initial_delay_ms: 100,
        max_delay_ms: 1000,
        multiplier: 2,
    };
    assert_eq!(p.decide(1, None), RetryDecision::RetryAfter(100));
    assert_eq!(p.decide(2, None), RetryDecision::RetryAfter(200));
    assert_eq!(p.decide(2, Some(5_000)), RetryDecision::RetryAfter(5_000));
    assert_eq!(p.decide(3, None), RetryDecision::GiveUp);
}

/// A command the sandbox's memory limit killed is a command that ran: its reply says so, the
/// task stays running on the same sandbox; the journal's form of both leaves the flag out when it
/// is false (the goldens and every journal from before it read as they were), and a journal
/// from before it reads back as "not killed".
#[test]
fn a_memory_kill_is_recorded_in_the_exit_and_the_reply() {
    let t = running_task();
    let tr = run_step(
        &t,
        Event::RunRequested {
            request_id: 2,
            command: "hog".into(),
            timeout_ms: 5_000,
        },
    );
    let killed = Event::CommandExited {
        request_id: 2,
        exit_code: 137,
        timed_out: false,
        memory_killed: true,
    };
    let json = serde_json::to_value(&killed).expect("JSON");
    assert_eq!(json["memory_killed"], true, "{json}");
    let done = step(&tr.next, killed, T0 + 20).expect("valid");
    assert_eq!(done.next.state, TaskState::Running);
    assert_eq!(
        done.next.sandbox.as_ref().map(|s| &s.id),
        t.sandbox.as_ref().map(|s| &s.id),
        "the sandbox lives on"
    );
    let reply = done
        .commands
        .iter()
        .find_map(|c| match c {
            Command::Reply { reply, .. } => Some(reply.clone()),
            _ => None,
        })
        .expect("a reply");
    assert!(
        matches!(
            reply,
            Reply::Ran {
                exit_code: 137,
                timed_out: false,
                memory_killed: true,
                ..
            }
        ),
        "{reply:?}"
    );
    let not_killed = Event::CommandExited {
        request_id: 2,
        exit_code: 0,
        timed_out: false,
        memory_killed: false,
    };
    let text = serde_json::to_string(&not_killed).expect("JSON");
    assert!(!text.contains("memory_killed"), "{text}");
    let old: Event = serde_json::from_str(
        r#"{"type":"command_exited","request_id":2,"exit_code":0,"timed_out":false}"#,
    )
    .expect("a journal from before the flag reads");
    assert_eq!(old, not_killed);
    let old: Reply =
        serde_json::from_str(r#"{"kind":"ran","exit_code":0,"timed_out":false,"notices":[]}"#)
            .expect("a reply from before the flag reads");
    assert!(
        matches!(
            old,
            Reply::Ran {
                memory_killed: false,
                ..
            }
        ),
        "{old:?}"
    );
}
