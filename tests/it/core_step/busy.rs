//! Activity-aware idle (issue 34): the idle rule falls due `idle_lifetime_ms` after the last
//! command or after the last sample that found the sandbox's processes busy, a busy sandbox is
//! kept no longer than `max_busy_ms` after the last command (the busy cap), and without
//! sampling (`max_busy_ms` 0, or nothing measured) idle is what it was. `step` is driven as the
//! engine drives it: timers fire when due, each `SampleActivity` is answered a millisecond
//! later with the counters of a workload.

use std::cell::Cell;

use proptest::prelude::*;
use taskbox::core::*;

use super::{settings, T0};
use crate::support::tid;

/// What the sandbox's processes do after the last command: `rate` µs of CPU per ms (1000: one
/// core busy) for `busy_ms`, then nothing. `None`: the provider measures nothing.
#[derive(Debug, Clone, Copy)]
struct Workload {
    rate: u64,
    busy_ms: u64,
    measured: bool,
}

impl Workload {
    fn counters(&self, since_command: u64) -> Option<Resources> {
        self.measured.then(|| Resources {
            cpu_usec: Some(self.rate * since_command.min(self.busy_ms)),
            memory_peak_bytes: Some(1 << 20),
            io_bytes: Some(0),
        })
    }
}

/// How the sandbox ended: the snapshot's reason (`None`: stopped without one) and when, after
/// the last command; and how many samples were asked for.
#[derive(Debug)]
struct Ended {
    reason: Option<SnapshotReason>,
    after_command: u64,
    samples: usize,
}

/// A task whose one command ended at `T0 + 10` in a sandbox with a far deadline, then `work`.
fn drive(lifetime_ms: u64, max_busy_ms: u64, work: Workload) -> Ended {
    let mut s = settings();
    s.idle_lifetime_ms = lifetime_ms;
    s.max_busy_ms = max_busy_ms;
    s.sandbox_timeout_ms = 10_000_000;
    s.max_sandbox_lifetime_ms = 10_000_000;
    let mut task = Task::new(tid("busy"), s, T0);
    // The engine's timers: one per kind, a later one replacing it.
    let mut timers: Vec<(TimerKind, Millis)> = Vec::new();
    let mut answers: Vec<(Millis, Event)> = Vec::new();
    let samples = Cell::new(0);
    let apply = |task: &mut Task,
                 timers: &mut Vec<(TimerKind, Millis)>,
                 answers: &mut Vec<(Millis, Event)>,
                 ev: Event,
                 now: Millis|
     -> Option<Option<SnapshotReason>> {
        let tr = step(task, ev, now).expect("a valid transition");
        *task = tr.next;
        let mut ended = None;
        for c in tr.commands {
            match c {
                Command::ScheduleTimer { timer, at } => {
                    timers.retain(|(k, _)| *k != timer);
                    timers.push((timer, at));
                }
                Command::SampleActivity { sandbox_id } => {
                    samples.set(samples.get() + 1);
                    let last = task.last_activity;
                    answers.push((
                        now + 1,
                        Event::ActivitySampled {
                            sandbox_id,
                            resources: work.counters(now + 1 - last),
                        },
                    ));
                }
                Command::TakeSnapshot { .. } => ended = Some(task.snapshot_reason),
                Command::StopSandbox { .. } => ended = Some(None),
                _ => {}
            }
        }
        ended
    };
    let run = Event::RunRequested {
        request_id: 1,
        command: "yes > /dev/null &".into(),
        timeout_ms: 5_000,
    };
    apply(&mut task, &mut timers, &mut answers, run, T0);
    let ready = Event::SandboxReady {
        generation: 1,
        sandbox_id: "s1".into(),
        name: "s1".into(),
        deadline: T0 + 10_000_000,
    };
    apply(&mut task, &mut timers, &mut answers, ready, T0 + 5);
    let exited = Event::CommandExited {
        request_id: 1,
        exit_code: 0,
        timed_out: false,
        memory_killed: false,
    };
    apply(&mut task, &mut timers, &mut answers, exited, T0 + 10);
    let last = task.last_activity;
    assert_eq!(last, T0 + 10);
    for _ in 0..100_000 {
        let timer = timers
            .iter()
            .enumerate()
            .min_by_key(|(_, (_, at))| *at)
            .map(|(i, (k, at))| (*at, *k, i));
        answers.sort_by_key(|(at, _)| *at);
        let answer_at = answers.first().map(|(at, _)| *at);
        let (now, ev) = match (timer, answer_at) {
            (Some((at, _, _)), Some(a)) if a <= at => answers.remove(0),
            (Some((at, kind, i)), _) => {
                timers.remove(i);
                (at, Event::TimerFired { timer: kind })
            }
            (None, Some(_)) => answers.remove(0),
            (None, None) => panic!("nothing left to happen, and the sandbox lives: {task:?}"),
        };
        if let Some(reason) = apply(&mut task, &mut timers, &mut answers, ev, now) {
            return Ended {
                reason,
                after_command: now - last,
                samples: samples.get(),
            };
        }
    }
    panic!("the sandbox never ended: {task:?}")
}

const ONE_CORE: u64 = 1_000;

#[test]
fn a_busy_sandbox_is_kept_to_the_cap_and_then_snapshotted_by_the_busy_cap() {
    let work = Workload {
        rate: ONE_CORE,
        busy_ms: u64::MAX / 4_000,
        measured: true,
    };
    let e = drive(10_000, 60_000, work);
    assert_eq!(e.reason, Some(SnapshotReason::BusyCap));
    assert!(
        (60_000..60_010).contains(&e.after_command),
        "at the cap: {e:?}"
    );
    // Two samples per lifetime at most while busy (the window's first and the verdict).
    assert!(e.samples <= 2 * (60_000 / 10_000 + 1), "{e:?}");
}

#[test]
fn a_sleeping_sandbox_is_snapshotted_by_the_idle_rule_at_its_lifetime() {
    let work = Workload {
        rate: 0,
        busy_ms: 0,
        measured: true,
    };
    let e = drive(10_000, 60_000, work);
    assert_eq!(e.reason, Some(SnapshotReason::IdleReap));
    assert!((10_000..10_005).contains(&e.after_command), "{e:?}");
    assert_eq!(e.samples, 2, "the window's first sample and the verdict");
}

#[test]
fn without_sampling_idle_counts_from_the_last_command_only() {
    let busy = Workload {
        rate: ONE_CORE,
        busy_ms: 1_000_000,
        measured: true,
    };
    // max_busy_ms 0: the provider cannot sample (or the key is 0): no sample is asked for.
    let e = drive(10_000, 0, busy);
    assert_eq!(e.reason, Some(SnapshotReason::IdleReap));
    assert_eq!(e.after_command, 10_000);
    assert_eq!(e.samples, 0);
    // Sampling that reads nothing counts as idle.
    let unmeasured = Workload {
        measured: false,
        ..busy
    };
    let e = drive(10_000, 60_000, unmeasured);
    assert_eq!(e.reason, Some(SnapshotReason::IdleReap));
    assert!((10_000..10_005).contains(&e.after_command), "{e:?}");
}

#[test]
fn work_that_stops_keeps_the_sandbox_a_lifetime_after_it_and_no_more() {
    let work = Workload {
        rate: ONE_CORE,
        busy_ms: 25_000,
        measured: true,
    };
    let e = drive(10_000, 60_000, work);
    assert_eq!(e.reason, Some(SnapshotReason::IdleReap));
    // Busy until 25 s: the last busy verdict is at most a lifetime after the work ended, and the
    // idle one a lifetime after that verdict.
    assert!((25_000..=45_010).contains(&e.after_command), "{e:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::support::proptest_cases(64, 256)))]

    /// Whatever the lifetime, the cap and the work: never snapshotted before the idle lifetime;
    /// the busy cap fires only at the cap (or the lifetime, when the cap is shorter) and only
    /// while the processes worked within the last sample window; the idle rule fires at most
    /// a lifetime plus a window after the work ended, and never after the cap; work still going
    /// at the cap always ends in the busy cap.
    #[test]
    fn the_idle_rule_and_the_busy_cap_hold_for_any_work(
        lifetime_ms in 2_000u64..60_000,
        max_busy_ms in 1u64..200_000,
        busy_ms in 0u64..300_000,
        rate in prop_oneof![Just(0u64), Just(5u64), Just(50u64), Just(ONE_CORE)],
    ) {
        let work = Workload { rate, busy_ms, measured: true };
        let e = drive(lifetime_ms, max_busy_ms, work);
        let window = sample_window_ms(lifetime_ms);
        let cap = max_busy_ms.max(lifetime_ms);
        let slack = 10;
        prop_assert!(e.after_command >= lifetime_ms, "before the lifetime: {:?}", e);
        let works = rate > 0 && busy_ms > 0;
        match e.reason {
            Some(SnapshotReason::BusyCap) => {
                prop_assert!(works, "busy cap without work: {:?}", e);
                prop_assert!((cap..cap + slack).contains(&e.after_command), "{:?}", e);
                prop_assert!(busy_ms + window + slack > e.after_command, "{:?}", e);
            }
            Some(SnapshotReason::IdleReap) => {
                prop_assert!(e.after_command < cap + slack, "past the cap: {:?}", e);
                let last_work = if works { busy_ms } else { 0 };
                prop_assert!(
                    e.after_command <= (last_work + lifetime_ms + window).max(lifetime_ms) + slack,
                    "kept too long after the work: {:?}", e
                );
                let still_working_at_cap = rate >= 50 && busy_ms >= cap + slack;
                prop_assert!(!still_working_at_cap, "idle while working: {:?}", e);
            }
            other => prop_assert!(false, "another rule fired: {:?} {:?}", other, e),
        }
    }
}

/// A task whose one command ended at `T0 + 10`, with its first sample of the window out.
fn sampling_task() -> Task {
    let mut s = settings();
    s.idle_lifetime_ms = 10_000;
    s.max_busy_ms = 60_000;
    let t = Task::new(tid("busy"), s, T0);
    let ok = |t: &Task, ev: Event, now: Millis| step(t, ev, now).expect("valid").next;
    let t = ok(
        &t,
        Event::RunRequested {
            request_id: 1,
            command: "yes &".into(),
            timeout_ms: 5_000,
        },
        T0,
    );
    let t = ok(
        &t,
        Event::SandboxReady {
            generation: 1,
            sandbox_id: "s1".into(),
            name: "s1".into(),
            deadline: T0 + 300_000,
        },
        T0 + 5,
    );
    let t = ok(
        &t,
        Event::CommandExited {
            request_id: 1,
            exit_code: 0,
            timed_out: false,
            memory_killed: false,
        },
        T0 + 10,
    );
    let tr = step(
        &t,
        Event::TimerFired {
            timer: TimerKind::Activity,
        },
        T0 + 5_010,
    )
    .expect("valid");
    assert!(
        matches!(tr.commands[..], [Command::SampleActivity { .. }]),
        "{:?}",
        tr.commands
    );
    tr.next
}

#[test]
fn a_command_waits_for_the_sample_out_so_the_two_never_race_to_the_provider() {
    let t = sampling_task();
    let run = Event::RunRequested {
        request_id: 2,
        command: "ls".into(),
        timeout_ms: 5_000,
    };
    let tr = step(&t, run, T0 + 5_011).expect("valid");
    assert!(
        !tr.commands
            .iter()
            .any(|c| matches!(c, Command::RunCommand { .. })),
        "{:?}",
        tr.commands
    );
    let sampled = Event::ActivitySampled {
        sandbox_id: "s1".into(),
        resources: None,
    };
    let tr = step(&tr.next, sampled, T0 + 5_012).expect("valid");
    assert!(
        tr.commands
            .iter()
            .any(|c| matches!(c, Command::RunCommand { request_id: 2, .. })),
        "the command starts once the sample answered: {:?}",
        tr.commands
    );
    // A second timer while a sample is out asks for no other.
    let t = sampling_task();
    let tr = step(
        &t,
        Event::TimerFired {
            timer: TimerKind::Idle,
        },
        T0 + 10_010,
    )
    .expect("valid");
    assert!(tr.commands.is_empty(), "{:?}", tr.commands);
}

#[test]
fn a_restart_forgets_the_sample_that_was_out() {
    let t = sampling_task();
    assert!(t.sandbox.as_ref().is_some_and(|sb| sb.sampling));
    let tr = step(&t, Event::Loaded, T0 + 5_100).expect("valid");
    assert!(
        tr.next.sandbox.as_ref().is_some_and(|sb| !sb.sampling),
        "{:?}",
        tr.next.sandbox
    );
}
