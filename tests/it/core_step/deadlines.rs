//! Deadlines and what the caller is told (issue 12): a late checkpoint where the provider keeps
//! a sandbox's files past its deadline, restore notes that say when changes are gone, and the
//! bound on sandbox creations per task per minute.

use taskbox::core::*;

use super::{settings, T0};
use crate::support::tid;

const DEADLINE: Millis = T0 + 300_000;

fn ok(task: &Task, ev: Event, now: Millis) -> Transition {
    step(task, ev, now).expect("valid event")
}

fn ready(generation: u64, deadline: Millis) -> Event {
    Event::SandboxReady {
        generation,
        sandbox_id: format!("s{generation}").into(),
        name: format!("s{generation}"),
        deadline,
    }
}

fn run(request_id: RequestId, command: &str) -> Event {
    Event::RunRequested {
        request_id,
        command: command.into(),
        timeout_ms: 5_000,
    }
}

fn exited(request_id: RequestId) -> Event {
    Event::CommandExited {
        request_id,
        exit_code: 0,
        timed_out: false,
        memory_killed: false,
    }
}

fn taken(seq: u64) -> Event {
    Event::SnapshotTaken {
        seq,
        snapshot_id: format!("snap-{seq}").into(),
        size_bytes: 1,
        expires_at: None,
        omitted: Vec::new(),
        usage: None,
        resources: None,
    }
}

/// A task that ran `echo v1 > f`, was suspended (snap-1 at `T0 + 20`), then restored and ran a
/// second command in generation 2 (its sandbox's deadline is `DEADLINE`).
fn used_after_snapshot(late_checkpoint: bool) -> Task {
    let mut s = settings();
    s.late_checkpoint = late_checkpoint;
    let t = Task::new(tid("demo"), s, T0);
    let t = ok(&t, run(1, "echo v1 > f"), T0).next;
    let t = ok(&t, ready(1, DEADLINE), T0 + 1).next;
    let t = ok(&t, exited(1), T0 + 2).next;
    let t = ok(&t, Event::SuspendRequested { request_id: 2 }, T0 + 10).next;
    let t = ok(&t, taken(1), T0 + 20).next;
    assert_eq!(t.state, TaskState::Expired);
    let t = ok(&t, run(3, "echo v2 > f"), T0 + 30).next;
    let tr = ok(&t, ready(2, DEADLINE), T0 + 40);
    // A restore of the snapshot the last sandbox ended with: nothing was lost.
    assert!(tr.next.notices.contains(&Notice::Recreated {
        from_snapshot: Some("snap-1".into()),
        taken_at: Some(T0 + 20),
        changes_lost: false,
    }));
    let t = ok(&tr.next, exited(3), T0 + 50).next;
    assert_eq!(t.state, TaskState::Running);
    t
}

fn recreated(tr: &Transition) -> Option<&Notice> {
    tr.commands.iter().find_map(|c| match c {
        Command::Reply {
            reply: Reply::Ran { notices, .. },
            ..
        } => notices
            .iter()
            .find(|n| matches!(n, Notice::Recreated { .. })),
        _ => None,
    })
}

#[test]
fn where_files_outlive_the_deadline_a_late_checkpoint_keeps_them() {
    let t = used_after_snapshot(true);
    // The next request comes after the deadline (nothing ran meanwhile): snapshot first.
    let tr = ok(&t, run(4, "cat f"), DEADLINE + 1_000);
    assert_eq!(tr.next.state, TaskState::Snapshotting);
    assert_eq!(
        tr.next.snapshot_reason,
        Some(SnapshotReason::LateCheckpoint { deadline: DEADLINE })
    );
    assert!(tr.commands.contains(&Command::TakeSnapshot {
        sandbox_id: "s2".into(),
        seq: 2
    }));
    // The checkpoint completes: the request restores from it, and nothing was lost.
    let tr = ok(&tr.next, taken(2), DEADLINE + 1_100);
    assert_eq!(tr.next.state, TaskState::Restoring);
    assert_eq!(tr.next.restore_source.as_deref(), Some("snap-2"));
    let tr = ok(&tr.next, ready(3, DEADLINE + 400_000), DEADLINE + 1_200);
    let tr = ok(&tr.next, exited(4), DEADLINE + 1_300);
    let Some(Command::Reply {
        reply: Reply::Ran { notices, .. },
        ..
    }) = tr.commands.first()
    else {
        panic!("{:?}", tr.commands)
    };
    assert!(notices.contains(&Notice::LateCheckpoint {
        snapshot_id: "snap-2".into(),
        deadline: DEADLINE
    }));
    assert!(notices.contains(&Notice::Recreated {
        from_snapshot: Some("snap-2".into()),
        taken_at: Some(DEADLINE + 1_100),
        changes_lost: false,
    }));
    assert!(!notices
        .iter()
        .any(|n| matches!(n, Notice::FilesLost { .. } | Notice::SandboxExpired { .. })));
}

#[test]
fn a_late_checkpoint_is_taken_at_the_deadline_timer_and_after_a_gone_command() {
    let t = used_after_snapshot(true);
    let tr = ok(
        &t,
        Event::TimerFired {
            timer: TimerKind::Deadline,
        },
        DEADLINE,
    );
    assert_eq!(tr.next.state, TaskState::Snapshotting);
    // A command stopped at the deadline fails, and the files go to a late checkpoint.
    let t = ok(&t, run(4, "sleep 100"), T0 + 60).next;
    let tr = ok(
        &t,
        Event::CommandFailed {
            request_id: 4,
            failure: Failure::new(FailureKind::SandboxGone, "passed its deadline"),
        },
        DEADLINE,
    );
    assert_eq!(tr.next.state, TaskState::Snapshotting);
    assert!(tr.commands.iter().any(|c| matches!(
        c,
        Command::Reply { request_id: 4, reply: Reply::Failed { reason, .. } }
            if reason.to_string().contains("late checkpoint")
    )));
    // Only the snapshot finding the files really gone gives them up.
    let gone = ok(
        &tr.next,
        Event::SnapshotFailed {
            seq: 2,
            failure: Failure::new(FailureKind::SandboxGone, "no such sandbox"),
        },
        DEADLINE + 10,
    );
    assert_eq!(gone.next.state, TaskState::Expired);
    assert!(gone.next.files_behind);
    // A late checkpoint that fails for good does not loop: the sandbox is given up.
    let failed = ok(
        &tr.next,
        Event::SnapshotFailed {
            seq: 2,
            failure: Failure::new(FailureKind::Permanent, "unreadable"),
        },
        DEADLINE + 10,
    );
    assert_eq!(failed.next.state, TaskState::Expired);
    assert!(!failed
        .commands
        .iter()
        .any(|c| matches!(c, Command::TakeSnapshot { .. })));
}

#[test]
fn without_late_checkpoints_the_deadline_expires_the_sandbox() {
    let t = used_after_snapshot(false);
    let tr = ok(&t, run(4, "cat f"), DEADLINE + 1_000);
    assert_eq!(tr.next.state, TaskState::Restoring);
    assert_eq!(tr.next.restore_source.as_deref(), Some("snap-1"));
}

#[test]
fn a_restore_older_than_the_last_files_written_says_changes_are_gone() {
    // The sandbox that ran `echo v2` expired without a snapshot of it: snap-1 is older.
    let t = used_after_snapshot(false);
    let t = ok(&t, run(4, "cat f"), DEADLINE + 1_000).next;
    let tr = ok(&t, ready(3, DEADLINE + 400_000), DEADLINE + 1_100);
    let tr = ok(&tr.next, exited(4), DEADLINE + 1_200);
    assert_eq!(
        recreated(&tr),
        Some(&Notice::Recreated {
            from_snapshot: Some("snap-1".into()),
            taken_at: Some(T0 + 20),
            changes_lost: true,
        })
    );
    // Reported once: the next restore of a snapshot of the last sandbox loses nothing.
    assert!(!tr.next.files_behind);

    // A sandbox that expired with no command run in it since its restore loses nothing.
    let mut s = settings();
    s.late_checkpoint = false;
    let t = Task::new(tid("idle"), s, T0);
    let t = ok(&t, run(1, "echo v1 > f"), T0).next;
    let t = ok(&t, ready(1, DEADLINE), T0 + 1).next;
    let t = ok(&t, exited(1), T0 + 2).next;
    let t = ok(&t, Event::SuspendRequested { request_id: 2 }, T0 + 10).next;
    let t = ok(&t, taken(1), T0 + 20).next;
    let t = ok(&t, Event::ResumeRequested { request_id: 3 }, T0 + 30).next;
    let t = ok(&t, ready(2, DEADLINE), T0 + 40).next;
    let t = ok(&t, run(4, "cat f"), DEADLINE + 1).next;
    let tr = ok(&t, ready(3, DEADLINE + 400_000), DEADLINE + 2);
    let tr = ok(&tr.next, exited(4), DEADLINE + 3);
    assert!(matches!(
        recreated(&tr),
        Some(Notice::Recreated {
            changes_lost: false,
            ..
        })
    ));
}

#[test]
fn a_fallback_to_an_older_snapshot_says_changes_are_gone() {
    let t = used_after_snapshot(false);
    let t = ok(&t, Event::SuspendRequested { request_id: 4 }, T0 + 60).next;
    let t = ok(&t, taken(2), T0 + 70).next;
    let t = ok(&t, run(5, "cat f"), T0 + 80).next;
    assert_eq!(t.restore_source.as_deref(), Some("snap-2"));
    let t = ok(
        &t,
        Event::CreateFailed {
            generation: 3,
            failure: Failure::new(FailureKind::SnapshotGone, "410"),
        },
        T0 + 90,
    )
    .next;
    assert_eq!(t.restore_source.as_deref(), Some("snap-1"));
    let tr = ok(&t, ready(4, DEADLINE + 1_000), T0 + 100);
    let tr = ok(&tr.next, exited(5), T0 + 110);
    assert_eq!(
        recreated(&tr),
        Some(&Notice::Recreated {
            from_snapshot: Some("snap-1".into()),
            taken_at: Some(T0 + 20),
            changes_lost: true,
        })
    );
}

/// A sandbox that is gone as soon as it is made (a zero timeout) cannot turn a request into a
/// create loop: after `MAX_CREATES_PER_MINUTE` creations the request is answered with an error.
#[test]
fn a_create_loop_is_impossible_whatever_the_timeout() {
    for late_checkpoint in [false, true] {
        let mut s = settings();
        s.sandbox_timeout_ms = 0;
        s.late_checkpoint = late_checkpoint;
        let mut t = Task::new(tid("loop"), s, T0);
        let mut now = T0;
        let mut creates = 0;
        let mut pending = vec![run(1, "ls")];
        let mut answer = None;
        let mut steps = 0;
        while let Some(ev) = pending.pop() {
            steps += 1;
            assert!(steps < 10_000, "no answer after {steps} steps");
            let tr = ok(&t, ev, now);
            t = tr.next;
            for c in tr.commands {
                match c {
                    Command::CreateSandbox { generation, .. } => {
                        creates += 1;
                        // Ready at once, with its deadline already reached.
                        pending.push(ready(generation, now));
                    }
                    Command::TakeSnapshot { seq, .. } => pending.push(taken(seq)),
                    Command::Reply { reply, .. } => answer = Some(reply),
                    _ => {}
                }
            }
            now += 1;
        }
        let Some(Reply::Failed { reason, .. }) = answer else {
            panic!("the request was not refused: {answer:?}")
        };
        assert_eq!(reason.code(), "too_many_creates", "{reason}");
        assert!(reason.to_string().contains("within a minute"), "{reason}");
        assert_eq!(creates, MAX_CREATES_PER_MINUTE);
        // A minute later a request may create again.
        let tr = ok(&t, run(2, "ls"), now + 60_000);
        assert!(tr
            .commands
            .iter()
            .any(|c| matches!(c, Command::CreateSandbox { .. })));
    }
}

/// A command that provably never started (its sandbox was found stopped) is run on a restored
/// sandbox; its reply says the sandbox was recreated. A command that may have started fails.
#[test]
fn a_command_that_never_started_runs_on_a_restored_sandbox() {
    let t = used_after_snapshot(false);
    let t = ok(&t, run(4, "cat f"), T0 + 60).next;
    let gone = Failure::new(FailureKind::SandboxGone, "410 sandbox_stopped");
    let tr = ok(
        &t,
        Event::CommandNotStarted {
            request_id: 4,
            failure: gone.clone(),
        },
        T0 + 70,
    );
    assert_eq!(tr.next.state, TaskState::Restoring);
    assert!(
        !tr.commands
            .iter()
            .any(|c| matches!(c, Command::Reply { .. })),
        "{:?}",
        tr.commands
    );
    let tr = ok(&tr.next, ready(3, DEADLINE + 1_000), T0 + 80);
    assert!(tr.commands.iter().any(|c| matches!(
        c,
        Command::RunCommand { request_id: 4, command, .. } if command == "cat f"
    )));
    let tr = ok(&tr.next, exited(4), T0 + 90);
    let Some(Command::Reply {
        request_id: 4,
        reply: Reply::Ran { notices, .. },
    }) = tr.commands.first()
    else {
        panic!("{:?}", tr.commands)
    };
    // Stopped before its deadline: the note says when it was found gone, not the deadline.
    assert!(notices.contains(&Notice::SandboxExpired { at: T0 + 70 }));
    assert!(notices.iter().any(|n| matches!(
        n,
        Notice::Recreated {
            from_snapshot: Some(_),
            ..
        }
    )));

    // The same failure while the command may have run is reported, not repeated.
    let tr = ok(
        &t,
        Event::CommandFailed {
            request_id: 4,
            failure: gone,
        },
        T0 + 70,
    );
    assert!(tr.commands.iter().any(|c| matches!(
        c,
        Command::Reply {
            request_id: 4,
            reply: Reply::Failed { .. }
        }
    )));
}

fn read_usage(tr: &Transition) -> Vec<&SandboxId> {
    tr.commands
        .iter()
        .filter_map(|c| match c {
            Command::ReadUsage { sandbox_id } => Some(sandbox_id),
            _ => None,
        })
        .collect()
}

/// On a provider that reports usage, a session that ends without the platform being asked —
/// the deadline timer, a command or a snapshot answered "sandbox gone" — is read for the
/// ledger (`ReadUsage`, once); a probe that found it gone asked already, a stop and a
/// snapshot answer with it, and a provider that reports none is never asked. The answer,
/// whatever it says, changes nothing but the journal.
#[test]
fn a_session_that_ends_unasked_has_its_usage_read_once() {
    let mut t = used_after_snapshot(false);
    t.settings.reports_usage = true;
    let gone = |kind| Failure::new(kind, "410 sandbox_stopped");

    // The deadline timer.
    let tr = ok(
        &t,
        Event::TimerFired {
            timer: TimerKind::Deadline,
        },
        DEADLINE,
    );
    assert_eq!(tr.next.state, TaskState::Expired);
    assert_eq!(read_usage(&tr), [&SandboxId::from("s2")]);
    // Its answer is absorbed in every state, read or not.
    for usage in [
        None,
        Some(SessionUsage {
            started_at: T0,
            stopped_at: Some(DEADLINE),
            vcpus: 1,
            memory_mb: 2048,
            active_cpu_ms: Some(1000),
            transfer_bytes: None,
        }),
    ] {
        let read = Event::UsageRead {
            sandbox_id: "s2".into(),
            usage,
        };
        let after = ok(&tr.next, read.clone(), DEADLINE + 5);
        assert_eq!(after.next, tr.next);
        assert!(after.commands.is_empty());
        let running = ok(&t, read, DEADLINE - 5);
        assert_eq!(running.next, t);
    }

    // A command answered "sandbox gone", whether it started or not.
    let mut busy = ok(&t, run(4, "make"), T0 + 60).next;
    busy.settings.reports_usage = true;
    for ev in [
        Event::CommandFailed {
            request_id: 4,
            failure: gone(FailureKind::SandboxGone),
        },
        Event::CommandNotStarted {
            request_id: 4,
            failure: gone(FailureKind::SandboxGone),
        },
    ] {
        let tr = ok(&busy, ev, T0 + 70);
        assert_eq!(read_usage(&tr), [&SandboxId::from("s2")], "{tr:?}");
    }

    // A snapshot answered "sandbox gone".
    let snapping = ok(&t, Event::SuspendRequested { request_id: 4 }, T0 + 60).next;
    assert_eq!(snapping.state, TaskState::Snapshotting);
    let tr = ok(
        &snapping,
        Event::SnapshotFailed {
            seq: 2,
            failure: gone(FailureKind::SandboxGone),
        },
        T0 + 70,
    );
    assert_eq!(read_usage(&tr), [&SandboxId::from("s2")], "{tr:?}");

    // A probe that found it gone read the usage itself.
    let probing = ok(&t, Event::Loaded, T0 + 60).next;
    let tr = ok(
        &probing,
        Event::SandboxProbed {
            sandbox_id: "s2".into(),
            alive: None,
            platform_snapshot: None,
            usage: None,
        },
        T0 + 70,
    );
    assert_eq!(tr.next.state, TaskState::Expired);
    assert!(read_usage(&tr).is_empty(), "{tr:?}");

    // A provider that reports no usage is never asked.
    let mut local = t.clone();
    local.settings.reports_usage = false;
    let tr = ok(
        &local,
        Event::TimerFired {
            timer: TimerKind::Deadline,
        },
        DEADLINE,
    );
    assert!(read_usage(&tr).is_empty(), "{tr:?}");
}

/// `taskbox rm` stops a running task's sandbox outside the lifecycle; its stop, journaled in
/// the removed task's record, ends the sandbox there (a stop of any other sandbox stays
/// absorbed).
#[test]
fn a_stop_of_the_live_sandbox_ends_it() {
    let t = used_after_snapshot(false);
    let other = ok(
        &t,
        Event::SandboxStopped {
            sandbox_id: "s1".into(),
            usage: None,
        },
        T0 + 60,
    );
    assert_eq!(other.next, t);
    let tr = ok(
        &t,
        Event::SandboxStopped {
            sandbox_id: "s2".into(),
            usage: None,
        },
        T0 + 60,
    );
    assert!(tr.next.sandbox.is_none());
    assert_eq!(tr.next.state, TaskState::Expired);
    assert!(tr.next.files_behind, "v2 was written after snap-1");
    assert!(tr.commands.is_empty(), "{:?}", tr.commands);
}
