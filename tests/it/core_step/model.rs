//! A model-based property test of `step`.
//!
//! The property test plays an executor that holds the commands `step` emitted and answers them
//! in a random order with random outcomes (success, transient error, sandbox gone, snapshot
//! gone, permanent error, a platform stop with its own snapshot), interleaved with caller
//! requests, timers, clock jumps and crashes (the task is serialized and read back, and
//! everything in flight is lost). A tiny reference
//! model tracks which snapshot is the latest *confirmed* one; after every step the invariants
//! are checked, above all: **every restore uses the latest confirmed snapshot, and a task that
//! has none never restores anything.**

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use taskbox::core::*;

use super::{settings, T0};
use crate::support::tid;

#[derive(Debug, Clone, Copy)]
enum Outcome {
    Ok,
    Transient,
    SandboxGone,
    SnapshotGone,
    Permanent,
    /// The platform stopped the sandbox and snapshotted it itself (a persistent sandbox): a
    /// probe finds it gone, with that snapshot.
    PlatformStopped,
}

#[derive(Debug, Clone)]
enum Action {
    Run,
    Suspend,
    Resume,
    Complete(usize, Outcome),
    Timer(TimerKind),
    Advance(u64),
    Crash,
    SetPersistent(bool),
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        6 => Just(Outcome::Ok),
        2 => Just(Outcome::Transient),
        1 => Just(Outcome::SandboxGone),
        1 => Just(Outcome::SnapshotGone),
        1 => Just(Outcome::Permanent),
        1 => Just(Outcome::PlatformStopped),
    ]
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => Just(Action::Run),
        2 => Just(Action::Suspend),
        1 => Just(Action::Resume),
        12 => (any::<usize>(), outcome()).prop_map(|(i, o)| Action::Complete(i, o)),
        1 => Just(Action::Timer(TimerKind::Idle)),
        1 => Just(Action::Timer(TimerKind::Checkpoint)),
        1 => Just(Action::Timer(TimerKind::Deadline)),
        2 => Just(Action::Timer(TimerKind::Retry)),
        2 => (1u64..400_000).prop_map(Action::Advance),
        1 => Just(Action::Crash),
        1 => any::<bool>().prop_map(Action::SetPersistent),
    ]
}

/// The reference model: what the world has confirmed, independent of the core's bookkeeping.
#[derive(Default, Debug)]
struct Model {
    /// Snapshots whose completion the core accepted, in order.
    confirmed: Vec<String>,
    /// Snapshots the provider said are gone.
    gone: BTreeSet<String>,
    /// Snapshots that fell out of retention, by the model's own count: when a snapshot is
    /// confirmed, all but the newest `keep` confirmed snapshots still there.
    pruned: BTreeSet<String>,
    /// `keep_snapshots` as the test set it (not read back from the task).
    keep: usize,
    /// Requests answered (each exactly once).
    replied: BTreeSet<RequestId>,
    /// Requests made.
    requested: BTreeSet<RequestId>,
}

impl Model {
    fn new() -> Model {
        Model {
            keep: settings().keep_snapshots.max(1) as usize,
            ..Model::default()
        }
    }

    /// The confirmed snapshots still kept, oldest first.
    fn kept(&self) -> Vec<&String> {
        self.confirmed
            .iter()
            .filter(|id| !self.gone.contains(*id) && !self.pruned.contains(*id))
            .collect()
    }

    fn latest_valid(&self) -> Option<&String> {
        self.kept().last().copied()
    }

    /// A snapshot the core accepted: it joins the kept ones, and the oldest beyond `keep`
    /// fall out of retention.
    fn confirm(&mut self, id: String) {
        self.confirmed.push(id);
        let kept: Vec<String> = self.kept().into_iter().cloned().collect();
        let excess = kept.len().saturating_sub(self.keep);
        self.pruned.extend(kept.into_iter().take(excess));
    }
}

struct Harness {
    task: Task,
    now: Millis,
    inflight: Vec<Command>,
    model: Model,
    next_request: RequestId,
    deadlines: BTreeMap<String, Millis>,
    steps: usize,
}

impl Harness {
    fn new() -> Harness {
        Harness {
            task: Task::new(tid("t"), settings(), T0),
            now: T0,
            inflight: Vec::new(),
            model: Model::new(),
            next_request: 1,
            deadlines: BTreeMap::new(),
            steps: 0,
        }
    }

    fn apply(&mut self, event: Event) -> Result<(), TestCaseError> {
        let before = self.task.clone();
        // The model's view of acceptance: a snapshot completion counts when it answers the
        // pending snapshot of a snapshotting task.
        if let Event::SnapshotTaken {
            seq, snapshot_id, ..
        } = &event
        {
            let pending = before
                .snapshots
                .last()
                .filter(|s| s.status == SnapshotStatus::Pending)
                .map(|s| s.seq);
            if before.state == TaskState::Snapshotting && pending == Some(*seq) {
                self.model.confirm(snapshot_id.to_string());
            }
        }
        // A platform's snapshot counts when a probe of the sandbox a running, persistent task
        // holds finds it.
        if let Event::SandboxProbed {
            sandbox_id,
            alive: None,
            platform_snapshot: Some(found),
            ..
        } = &event
        {
            let holds = before.sandbox.as_ref().is_some_and(|s| &s.id == sandbox_id);
            if before.state == TaskState::Running && holds && before.settings.persistent {
                self.model.confirm(found.snapshot_id.to_string());
            }
        }
        let tr = step(&before, event.clone(), self.now)
            .map_err(|e| TestCaseError::fail(format!("step refused {event:?}: {e}")))?;
        self.steps += 1;
        for cmd in &tr.commands {
            self.check_command(&before, &tr.next, cmd)?;
        }
        self.task = tr.next;
        self.check_invariants(&before, &event)?;
        for cmd in tr.commands {
            match cmd {
                Command::ScheduleTimer { .. } => {}
                Command::Reply { request_id, .. } => {
                    prop_assert!(
                        self.model.replied.insert(request_id),
                        "request {request_id} answered twice"
                    );
                }
                other => self.inflight.push(other),
            }
        }
        Ok(())
    }

    fn check_command(
        &mut self,
        before: &Task,
        after: &Task,
        cmd: &Command,
    ) -> Result<(), TestCaseError> {
        match cmd {
            Command::CreateSandbox {
                source_snapshot,
                generation,
                ..
            } => {
                let latest = self.model.latest_valid().cloned();
                if *generation == before.generation {
                    // A re-issue (retry, recovery) repeats the operation exactly as it began.
                    prop_assert_eq!(
                        source_snapshot,
                        &before.restore_source,
                        "a re-issued create changed its source"
                    );
                } else if after.settings.persistent {
                    // THE property: a restore uses the latest confirmed snapshot, and a task
                    // without one starts fresh.
                    prop_assert_eq!(
                        source_snapshot.as_deref().map(str::to_string),
                        latest,
                        "create from the wrong snapshot (task before: {:?})",
                        before
                    );
                } else {
                    prop_assert!(
                        source_snapshot.is_none(),
                        "non-persistent task restored a snapshot"
                    );
                }
            }
            Command::DeleteSnapshot { snapshot_id } => {
                // Only superseded snapshots are deleted, never the latest confirmed one...
                let known = after
                    .snapshots
                    .iter()
                    .any(|s| s.id.as_deref() == Some(snapshot_id));
                if known {
                    prop_assert_ne!(
                        Some(snapshot_id),
                        after.latest_complete().and_then(|s| s.id.as_ref())
                    );
                    prop_assert!(
                        self.model.pruned.contains(snapshot_id.as_str()),
                        "{} deleted, but the model keeps it (kept: {:?})",
                        snapshot_id,
                        self.model.kept()
                    );
                } else {
                    // ...or a late success the core never adopted.
                    prop_assert!(!self.model.confirmed.contains(&snapshot_id.to_string()));
                }
            }
            Command::RunCommand { sandbox_id, .. } | Command::TakeSnapshot { sandbox_id, .. } => {
                prop_assert_eq!(
                    Some(sandbox_id),
                    after.sandbox.as_ref().map(|s| &s.id),
                    "a command for a sandbox the task does not hold"
                );
                // Requests wait for the recovery probe.
                prop_assert!(!after.probing, "{} while probing", cmd.name());
            }
            _ => {}
        }
        Ok(())
    }

    fn check_invariants(&self, before: &Task, event: &Event) -> Result<(), TestCaseError> {
        let t = &self.task;
        let ctx = || format!("after {event:?} from {before:?}\n-> {t:?}");
        let holds = t.sandbox.is_some();
        let should_hold = matches!(t.state, TaskState::Running | TaskState::Snapshotting);
        prop_assert_eq!(holds, should_hold, "sandbox vs state: {}", ctx());
        if t.running.is_some() {
            prop_assert_eq!(t.state, TaskState::Running, "{}", ctx());
        }
        if t.probing {
            prop_assert_eq!(t.state, TaskState::Running, "{}", ctx());
            prop_assert!(
                t.running.is_none(),
                "a command ran while probing: {}",
                ctx()
            );
        }
        let pending: Vec<_> = t
            .snapshots
            .iter()
            .filter(|s| s.status == SnapshotStatus::Pending)
            .collect();
        prop_assert!(pending.len() <= 1, "{}", ctx());
        if !pending.is_empty() {
            prop_assert_eq!(t.state, TaskState::Snapshotting, "{}", ctx());
            prop_assert_eq!(
                t.snapshots.last().map(|s| s.status),
                Some(SnapshotStatus::Pending)
            );
        }
        if t.state == TaskState::Snapshotting {
            prop_assert_eq!(pending.len(), 1, "{}", ctx());
        }
        if t.state == TaskState::Expired {
            prop_assert!(
                t.settings.persistent && t.latest_complete().is_some(),
                "{}",
                ctx()
            );
        }
        if t.state == TaskState::Restoring {
            prop_assert!(t.restore_source.is_some(), "{}", ctx());
        }
        // The core's latest complete snapshot is the model's latest valid one.
        prop_assert_eq!(
            t.latest_complete()
                .and_then(|s| s.id.as_deref().map(str::to_string)),
            self.model.latest_valid().cloned(),
            "{}",
            ctx()
        );
        // Retention, counted by the model: the core's complete snapshots are exactly the newest
        // `keep` confirmed ones still there — the same ids, in the same order.
        let complete: Vec<&str> = t
            .snapshots
            .iter()
            .filter(|s| s.status == SnapshotStatus::Complete)
            .filter_map(|s| s.id.as_deref())
            .collect();
        let kept: Vec<&str> = self.model.kept().into_iter().map(String::as_str).collect();
        prop_assert_eq!(&complete, &kept, "retention: {}", ctx());
        prop_assert!(complete.len() <= self.model.keep, "{}", ctx());
        // The snapshot sequence grows.
        prop_assert!(
            t.snapshots.windows(2).all(|w| w[0].seq < w[1].seq),
            "{}",
            ctx()
        );
        Ok(())
    }

    fn answer(&mut self, cmd: Command, outcome: Outcome) -> Option<Event> {
        let now = self.now;
        let transient = || Failure::transient("503 service unavailable", Some(50));
        let gone = |kind: FailureKind| Failure::new(kind, "410");
        let permanent = || Failure::new(FailureKind::Permanent, "500 broken");
        Some(match cmd {
            Command::CreateSandbox {
                generation,
                source_snapshot,
                timeout_ms,
            } => match outcome {
                Outcome::Ok => {
                    let id = format!("sb-{generation}");
                    self.deadlines.insert(id.clone(), now + timeout_ms);
                    Event::SandboxReady {
                        generation,
                        sandbox_id: id.as_str().into(),
                        name: id,
                        deadline: now + timeout_ms,
                    }
                }
                Outcome::Transient => Event::CreateFailed {
                    generation,
                    failure: transient(),
                },
                Outcome::SnapshotGone if source_snapshot.is_some() => {
                    self.model
                        .gone
                        .insert(source_snapshot.as_deref().unwrap_or_default().to_string());
                    Event::CreateFailed {
                        generation,
                        failure: gone(FailureKind::SnapshotGone),
                    }
                }
                _ => Event::CreateFailed {
                    generation,
                    failure: permanent(),
                },
            },
            Command::RunCommand { request_id, .. } => match outcome {
                Outcome::Ok => Event::CommandExited {
                    request_id,
                    exit_code: 0,
                    timed_out: false,
                    memory_killed: false,
                },
                Outcome::Transient => Event::CommandFailed {
                    request_id,
                    failure: transient(),
                },
                Outcome::SandboxGone => Event::CommandFailed {
                    request_id,
                    failure: gone(FailureKind::SandboxGone),
                },
                _ => Event::CommandFailed {
                    request_id,
                    failure: permanent(),
                },
            },
            Command::TakeSnapshot { seq, .. } | Command::TakeCheckpoint { seq, .. } => {
                match outcome {
                    Outcome::Ok => Event::SnapshotTaken {
                        seq,
                        snapshot_id: format!("snap-{seq}").into(),
                        size_bytes: 10,
                        expires_at: None,
                        omitted: Vec::new(),
                        usage: None,
                        resources: None,
                    },
                    Outcome::Transient => Event::SnapshotFailed {
                        seq,
                        failure: transient(),
                    },
                    Outcome::SandboxGone => Event::SnapshotFailed {
                        seq,
                        failure: gone(FailureKind::SandboxGone),
                    },
                    _ => Event::SnapshotFailed {
                        seq,
                        failure: permanent(),
                    },
                }
            }
            Command::StopSandbox { sandbox_id } => Event::SandboxStopped {
                sandbox_id,
                usage: None,
            },
            Command::ExtendTimeout {
                sandbox_id,
                duration_ms,
            } => match outcome {
                Outcome::Ok => {
                    let d = self.deadlines.entry(sandbox_id.to_string()).or_insert(now);
                    *d += duration_ms;
                    Event::TimeoutExtended {
                        deadline: *d,
                        sandbox_id,
                    }
                }
                _ => Event::ExtendFailed {
                    sandbox_id,
                    failure: permanent(),
                },
            },
            Command::DeleteSnapshot { snapshot_id } => match outcome {
                Outcome::Ok | Outcome::SnapshotGone => Event::SnapshotDeleted { snapshot_id },
                _ => Event::DeleteFailed {
                    snapshot_id,
                    failure: transient(),
                },
            },
            Command::ProbeSandbox { sandbox_id } => match outcome {
                Outcome::Transient => Event::ProbeFailed {
                    sandbox_id,
                    failure: transient(),
                },
                Outcome::Permanent => Event::ProbeFailed {
                    sandbox_id,
                    failure: permanent(),
                },
                Outcome::SandboxGone => Event::SandboxProbed {
                    sandbox_id,
                    alive: None,
                    platform_snapshot: None,
                    usage: None,
                },
                Outcome::PlatformStopped => {
                    self.deadlines.remove(sandbox_id.as_str());
                    Event::SandboxProbed {
                        platform_snapshot: Some(PlatformSnapshot {
                            snapshot_id: format!("plat-{sandbox_id}-{}", self.steps).into(),
                            size_bytes: 10,
                            expires_at: None,
                        }),
                        sandbox_id,
                        alive: None,
                        usage: None,
                    }
                }
                Outcome::Ok | Outcome::SnapshotGone => {
                    let alive = self
                        .deadlines
                        .get(sandbox_id.as_str())
                        .copied()
                        .filter(|d| *d > now);
                    Event::SandboxProbed {
                        sandbox_id,
                        alive,
                        platform_snapshot: None,
                        usage: None,
                    }
                }
            },
            // The ledger's business only: the lifecycle ignores what it says.
            Command::ReadUsage { sandbox_id } => Event::UsageRead {
                sandbox_id,
                usage: None,
            },
            Command::SampleActivity { sandbox_id } => Event::ActivitySampled {
                sandbox_id,
                resources: None,
            },
            Command::ScheduleTimer { .. } | Command::Reply { .. } => return None,
        })
    }

    fn act(&mut self, action: Action) -> Result<(), TestCaseError> {
        match action {
            Action::Run => {
                let request_id = self.take_request();
                self.apply(Event::RunRequested {
                    request_id,
                    command: "make".into(),
                    timeout_ms: 1000,
                })
            }
            Action::Suspend => {
                let request_id = self.take_request();
                self.apply(Event::SuspendRequested { request_id })
            }
            Action::Resume => {
                let request_id = self.take_request();
                self.apply(Event::ResumeRequested { request_id })
            }
            Action::Complete(i, outcome) => {
                if self.inflight.is_empty() {
                    return Ok(());
                }
                let cmd = self.inflight.remove(i % self.inflight.len());
                match self.answer(cmd, outcome) {
                    Some(ev) => self.apply(ev),
                    None => Ok(()),
                }
            }
            Action::Timer(timer) => self.apply(Event::TimerFired { timer }),
            Action::Advance(ms) => {
                self.now += ms;
                Ok(())
            }
            Action::Crash => {
                // Everything in flight is lost; the task is read back from its stored form.
                self.inflight.clear();
                let json = serde_json::to_string(&self.task).expect("task serializes");
                self.task = serde_json::from_str(&json).expect("task deserializes");
                // Waiting callers died with the process: their replies are still due once.
                self.apply(Event::Loaded)
            }
            Action::SetPersistent(p) => {
                let mut s = self.task.settings.clone();
                s.persistent = p;
                self.apply(Event::SettingsChanged { settings: s })
            }
        }
    }

    fn take_request(&mut self) -> RequestId {
        let id = self.next_request;
        self.next_request += 1;
        self.model.requested.insert(id);
        id
    }

    /// Lets every operation succeed until nothing is in flight, then checks every request was
    /// answered exactly once.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..500 {
            if self.inflight.is_empty() {
                if self.task.retry_at.is_some() {
                    self.now = self.task.retry_at.unwrap_or(self.now);
                    self.apply(Event::TimerFired {
                        timer: TimerKind::Retry,
                    })?;
                    continue;
                }
                break;
            }
            let cmd = self.inflight.remove(0);
            if let Some(ev) = self.answer(cmd, Outcome::Ok) {
                self.apply(ev)?;
            }
        }
        prop_assert!(
            self.inflight.is_empty(),
            "operations never settled: {:?}",
            self.inflight
        );
        prop_assert!(
            self.task.queue.is_empty(),
            "requests left queued: {:?}",
            self.task
        );
        prop_assert_eq!(
            &self.model.replied,
            &self.model.requested,
            "every request answered once"
        );
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::support::proptest_cases(2048, 2048), max_shrink_iters: 4000, failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/core_step.txt"))), ..ProptestConfig::default() })]

    /// Invariants hold after every step, whatever the interleaving of requests, outcomes,
    /// timers and crashes; every restore picks the latest confirmed snapshot.
    #[test]
    fn step_keeps_invariants_and_restores_latest(actions in proptest::collection::vec(action(), 1..120)) {
        let mut h = Harness::new();
        for a in actions {
            h.act(a)?;
        }
        h.drain()?;
    }

    /// Crash-and-reload equivalence at the core level: a run whose task is serialized and read
    /// back in the middle ends exactly like the same run without the reload.
    #[test]
    fn reload_in_the_middle_changes_nothing(actions in proptest::collection::vec(action().prop_filter("no crash", |a| !matches!(a, Action::Crash)), 1..80), cut in 0usize..80) {
        let mut a = Harness::new();
        let mut b = Harness::new();
        for (i, act) in actions.into_iter().enumerate() {
            if i == cut {
                let json = serde_json::to_string(&b.task).expect("serializes");
                b.task = serde_json::from_str(&json).expect("deserializes");
            }
            a.act(act.clone())?;
            b.act(act)?;
        }
        prop_assert_eq!(a.task, b.task);
        prop_assert_eq!(a.inflight, b.inflight);
    }
}
