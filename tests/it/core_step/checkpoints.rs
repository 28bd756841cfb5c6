//! A model-based property test of checkpoints and rewinds through `step`: any sequence of
//! writes, checkpoints, rewinds, suspends, resumes and restarts (the engine dropped, outcomes
//! in flight lost, the journal's task reloaded) against a world that keeps files — a workspace
//! is one number, each write a new one — and a model of what the files must be.
//!
//! After every action, once the world has answered everything: the task's files (its live
//! sandbox's, or else those of the snapshot a restore would use) are the model's; every
//! rewind restored exactly the snapshot it named, and the snapshot it says kept the files from
//! before holds them (so rewinding to it undoes the rewind); no snapshot is deleted while a
//! rewind restored it or a queued rewind names it; live checkpoints never stop the sandbox.

use std::collections::{BTreeMap, VecDeque};

use proptest::prelude::*;
use taskbox::core::{
    step, AutoCheckpoint, CheckpointOutcome, Command, Event, Reply, RewindTo, Task, TaskState,
};
use taskbox::ids::{SandboxId, SnapshotId, TaskId};

use super::{settings, T0};

#[derive(Debug, Clone)]
enum Action {
    Write,
    Touch,
    Checkpoint,
    RewindBack(u64),
    RewindSeq(u64),
    Suspend,
    Resume,
    Restart,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => Just(Action::Write),
        1 => Just(Action::Touch),
        3 => Just(Action::Checkpoint),
        2 => (1u64..4).prop_map(Action::RewindBack),
        1 => (1u64..8).prop_map(Action::RewindSeq),
        1 => Just(Action::Suspend),
        1 => Just(Action::Resume),
        1 => Just(Action::Restart),
    ]
}

/// The platform: sandboxes and snapshots holding a workspace's content.
#[derive(Default)]
struct World {
    sandbox: Option<(SandboxId, u64)>,
    snapshots: BTreeMap<SnapshotId, u64>,
    /// What each run request writes (`None`: it writes nothing).
    writes: BTreeMap<u64, Option<u64>>,
    replies: Vec<(u64, Reply)>,
}

struct Harness {
    task: Task,
    world: World,
    pending: VecDeque<Command>,
    now: u64,
    next_request: u64,
    next_value: u64,
    /// The files the task must hold.
    expected: u64,
    live: bool,
}

impl Harness {
    fn new(live: bool, keep: u32, keep_checkpoints: u32, every_command: bool) -> Harness {
        let mut s = settings();
        s.live_checkpoint = live;
        s.record_kinds = true;
        s.keep_snapshots = keep;
        s.keep_checkpoints = keep_checkpoints;
        s.late_checkpoint = false;
        if every_command {
            s.checkpoint = AutoCheckpoint::EveryCommand;
        }
        Harness {
            task: Task::new(TaskId::new("model").expect("id"), s, T0),
            world: World::default(),
            pending: VecDeque::new(),
            now: T0,
            next_request: 1,
            next_value: 1,
            expected: 0,
            live,
        }
    }

    fn apply(&mut self, event: Event) -> Result<(), TestCaseError> {
        self.now += 1;
        let tr = step(&self.task, event.clone(), self.now)
            .map_err(|e| TestCaseError::fail(format!("{event:?}: {e}")))?;
        self.task = tr.next;
        for c in tr.commands {
            match c {
                Command::Reply { request_id, reply } => {
                    self.world.replies.push((request_id, reply))
                }
                Command::ScheduleTimer { .. } => {}
                other => self.pending.push_back(other),
            }
        }
        Ok(())
    }

    /// Answers every outstanding command, as the platform would.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        let mut guard = 0;
        while let Some(c) = self.pending.pop_front() {
            guard += 1;
            prop_assert!(guard < 1000, "the task never settles");
            let event = self.answer(c)?;
            if let Some(e) = event {
                self.apply(e)?;
            }
        }
        Ok(())
    }

    fn needed(&self) -> Vec<SnapshotId> {
        let mut needed: Vec<SnapshotId> = self.task.rewound_to.iter().cloned().collect();
        needed.extend(self.task.rewind_saved.iter().cloned());
        needed.extend(self.task.rewinding.as_ref().map(|r| r.to.clone()));
        needed
    }

    fn answer(&mut self, c: Command) -> Result<Option<Event>, TestCaseError> {
        let needed = self.needed();
        let w = &mut self.world;
        Ok(Some(match c {
            Command::CreateSandbox {
                generation,
                source_snapshot,
                ..
            } => {
                let content = match &source_snapshot {
                    Some(id) => match w.snapshots.get(id) {
                        Some(c) => *c,
                        None => {
                            return Err(TestCaseError::fail(format!(
                                "a restore of {id}, which is deleted"
                            )))
                        }
                    },
                    None => 0,
                };
                let id = SandboxId::from(format!("sb-{generation}").as_str());
                w.sandbox = Some((id.clone(), content));
                Event::SandboxReady {
                    generation,
                    sandbox_id: id,
                    name: format!("sb-{generation}"),
                    deadline: u64::MAX / 4,
                }
            }
            Command::RunCommand {
                request_id,
                sandbox_id,
                ..
            } => {
                let sb = w.sandbox.as_mut().filter(|s| s.0 == sandbox_id);
                let sb = sb.ok_or_else(|| TestCaseError::fail("a command for no live sandbox"))?;
                if let Some(Some(v)) = w.writes.get(&request_id) {
                    sb.1 = *v;
                }
                Event::CommandExited {
                    request_id,
                    exit_code: 0,
                    timed_out: false,
                    memory_killed: false,
                }
            }
            Command::TakeSnapshot { sandbox_id, seq } => {
                let (sb, content) = w
                    .sandbox
                    .take()
                    .filter(|s| s.0 == sandbox_id)
                    .ok_or_else(|| TestCaseError::fail("a snapshot of no live sandbox"))?;
                let id = SnapshotId::from(format!("snap-{seq}-{sb}").as_str());
                w.snapshots.insert(id.clone(), content);
                snapshot_taken(seq, id)
            }
            Command::TakeCheckpoint {
                sandbox_id,
                seq,
                previous,
            } => {
                prop_assert!(self.live, "a live checkpoint on a platform without them");
                let (sb, content) = w
                    .sandbox
                    .clone()
                    .filter(|s| s.0 == sandbox_id)
                    .ok_or_else(|| TestCaseError::fail("a checkpoint of no live sandbox"))?;
                if previous.as_ref().and_then(|p| w.snapshots.get(p)) == Some(&content) {
                    Event::CheckpointUnchanged { seq }
                } else {
                    let id = SnapshotId::from(format!("snap-{seq}-{sb}").as_str());
                    w.snapshots.insert(id.clone(), content);
                    snapshot_taken(seq, id)
                }
            }
            Command::StopSandbox { sandbox_id } => {
                if w.sandbox.as_ref().is_some_and(|s| s.0 == sandbox_id) {
                    w.sandbox = None;
                }
                Event::SandboxStopped {
                    sandbox_id,
                    usage: None,
                }
            }
            Command::DeleteSnapshot { snapshot_id } => {
                prop_assert!(
                    !needed.contains(&snapshot_id),
                    "retention deleted {snapshot_id}, which a rewind needs: {:?}",
                    self.task
                );
                w.snapshots.remove(&snapshot_id);
                Event::SnapshotDeleted { snapshot_id }
            }
            Command::ProbeSandbox { sandbox_id } => {
                let alive = w.sandbox.as_ref().is_some_and(|s| s.0 == sandbox_id);
                Event::SandboxProbed {
                    sandbox_id,
                    alive: alive.then_some(u64::MAX / 4),
                    platform_snapshot: None,
                    usage: None,
                }
            }
            // Nothing measured: idleness counts from the last command, as without the rule.
            Command::SampleActivity { sandbox_id } => Event::ActivitySampled {
                sandbox_id,
                resources: None,
            },
            Command::ExtendTimeout { .. } | Command::ReadUsage { .. } => return Ok(None),
            Command::ScheduleTimer { .. } | Command::Reply { .. } => return Ok(None),
        }))
    }

    fn request(&mut self, make: impl FnOnce(u64) -> Event) -> Result<u64, TestCaseError> {
        let id = self.next_request;
        self.next_request += 1;
        self.apply(make(id))?;
        Ok(id)
    }

    fn reply(&self, id: u64) -> Option<&Reply> {
        self.world
            .replies
            .iter()
            .find(|(r, _)| *r == id)
            .map(|(_, reply)| reply)
    }

    fn files_now(&self) -> Option<u64> {
        match self.task.state {
            TaskState::Running => self.world.sandbox.as_ref().map(|s| s.1),
            TaskState::Expired => self
                .task
                .restore_point()
                .and_then(|s| s.id.as_ref())
                .and_then(|id| self.world.snapshots.get(id).copied()),
            TaskState::Idle => Some(0),
            _ => None,
        }
    }

    fn act(&mut self, a: &Action) -> Result<(), TestCaseError> {
        let before = self.expected;
        let live_before = self.world.sandbox.as_ref().map(|s| s.0.clone());
        match a {
            Action::Write | Action::Touch => {
                let value = matches!(a, Action::Write).then(|| {
                    self.next_value += 1;
                    self.next_value
                });
                let id = self.next_request;
                self.world.writes.insert(id, value);
                self.request(|request_id| Event::RunRequested {
                    request_id,
                    command: "write".into(),
                    timeout_ms: 1_000,
                })?;
                self.settle()?;
                if let Some(v) = value {
                    if matches!(self.reply(id), Some(Reply::Ran { .. })) {
                        self.expected = v;
                    }
                }
            }
            Action::Checkpoint => {
                let id = self.request(|request_id| Event::CheckpointRequested { request_id })?;
                self.settle()?;
                match self.reply(id) {
                    Some(Reply::Checkpointed { outcome, .. }) => {
                        if self.live && *outcome == CheckpointOutcome::Taken {
                            prop_assert_eq!(
                                self.world.sandbox.as_ref().map(|s| s.0.clone()),
                                live_before,
                                "a live checkpoint stopped or replaced the sandbox"
                            );
                        }
                    }
                    other => prop_assert!(false, "checkpoint answered {:?}", other),
                }
            }
            Action::RewindBack(_) | Action::RewindSeq(_) => {
                let to = match a {
                    Action::RewindBack(n) => RewindTo::Back { n: *n },
                    Action::RewindSeq(seq) => RewindTo::Seq { seq: *seq },
                    _ => unreachable!(),
                };
                let id = self.request(|request_id| Event::RewindRequested { request_id, to })?;
                self.settle()?;
                match self.reply(id).cloned() {
                    Some(Reply::Rewound { to, saved, .. }) => {
                        let restored = self.world.sandbox.as_ref().map(|s| s.1);
                        let named = self.world.snapshots.get(&to).copied();
                        prop_assert!(named.is_some(), "rewound to {to}, which is gone");
                        prop_assert_eq!(restored, named, "the rewind did not restore {}", to);
                        let saved = saved.expect("the files before are kept");
                        prop_assert_eq!(
                            self.world.snapshots.get(&saved).copied(),
                            Some(before),
                            "the snapshot {} kept before the rewind does not hold the files",
                            saved
                        );
                        self.expected = named.unwrap_or_default();
                    }
                    Some(Reply::Failed { .. }) => {}
                    other => prop_assert!(false, "rewind answered {:?}", other),
                }
            }
            Action::Suspend => {
                self.request(|request_id| Event::SuspendRequested { request_id })?;
                self.settle()?;
            }
            Action::Resume => {
                self.request(|request_id| Event::ResumeRequested { request_id })?;
                self.settle()?;
            }
            Action::Restart => {
                // Outcomes in flight are lost; the next engine reloads the task (here: as it
                // was committed) and recovers it.
                self.pending.clear();
                self.apply(Event::Loaded)?;
                self.settle()?;
            }
        }
        prop_assert_eq!(
            self.files_now(),
            Some(self.expected),
            "after {:?}: the task's files are not the model's: {:?}",
            a,
            self.task
        );
        Ok(())
    }
}

fn snapshot_taken(seq: u64, id: SnapshotId) -> Event {
    Event::SnapshotTaken {
        seq,
        snapshot_id: id,
        size_bytes: 1,
        expires_at: None,
        omitted: Vec::new(),
        usage: None,
        resources: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::support::proptest_cases(512, 512), failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/core_step_checkpoints.txt"))), ..ProptestConfig::default() })]

    /// The task's files are always the model's; every rewind restores exactly the snapshot
    /// named and is undoable; retention never deletes what a rewind needs.
    #[test]
    fn checkpoints_and_rewinds_keep_the_files_the_model_says(
        live in any::<bool>(),
        keep in 1u32..3,
        keep_checkpoints in 0u32..3,
        every_command in any::<bool>(),
        actions in proptest::collection::vec(action(), 1..40),
    ) {
        let mut h = Harness::new(live, keep, keep_checkpoints, every_command);
        for a in &actions {
            h.act(a)?;
        }
    }
}
