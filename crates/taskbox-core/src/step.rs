//! The transition table: `step(task, event, now) -> Transition`.
//!
//! One exhaustive `match (state, event)` with no wildcard arm: adding a state or an event forces a
//! decision for every pair. Outcomes that arrive late or twice (a second "snapshot taken", the
//! exit of a command whose sandbox already expired, a timer armed before the state moved on) are
//! absorbed on purpose — they leave the task unchanged or only release what they name. Events
//! that no correct engine can produce are typed [`StepError`]s.

use std::mem;

use super::types::*;
use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::reason::FailureReason;
use crate::retention;

/// The outcome of one step: the task after the event, and the effects to perform — in order,
/// after the transition has been committed to the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The task after the event.
    pub next: Task,
    /// Effects to perform.
    pub commands: Vec<Command>,
}

/// An event that cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// A request id was reused (request ids grow per task).
    #[error("task {task}: request id {request_id} was already used (last was {last})")]
    DuplicateRequest {
        /// The task.
        task: TaskId,
        /// The id given.
        request_id: RequestId,
        /// The highest id seen.
        last: RequestId,
    },
    /// A request asked for something impossible (such as a zero timeout).
    #[error("task {task}: invalid request: {why}")]
    InvalidRequest {
        /// The task.
        task: TaskId,
        /// What is wrong.
        why: &'static str,
    },
}

/// Applies `event` to `task` at time `now`.
pub fn step(task: &Task, event: Event, now: Millis) -> Result<Transition, StepError> {
    use TaskState::*;
    let mut cx = Cx {
        t: task.clone(),
        cmds: Vec::new(),
        now,
        usage_known: false,
    };
    match (task.state, event) {
        // ---- caller requests: queued in every state, then the queue is pumped ----
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::RunRequested {
                request_id,
                command,
                timeout_ms,
            },
        ) => {
            if timeout_ms == 0 {
                return Err(StepError::InvalidRequest {
                    task: task.id.clone(),
                    why: "the command timeout must be at least 1 ms",
                });
            }
            cx.accept_request(request_id)?;
            cx.t.queue.push_back(Request::Run {
                id: request_id,
                command,
                timeout_ms,
            });
            cx.pump();
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::SuspendRequested { request_id },
        ) => {
            cx.accept_request(request_id)?;
            cx.t.queue.push_back(Request::Suspend { id: request_id });
            cx.pump();
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::ResumeRequested { request_id },
        ) => {
            cx.accept_request(request_id)?;
            cx.t.queue.push_back(Request::Resume { id: request_id });
            cx.pump();
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::ForkRequested {
                request_id,
                child,
                from,
            },
        ) => {
            if child == task.id {
                return Err(StepError::InvalidRequest {
                    task: task.id.clone(),
                    why: "a task cannot be forked into itself",
                });
            }
            cx.accept_request(request_id)?;
            cx.t.queue.push_back(Request::Fork {
                id: request_id,
                child,
                from,
            });
            cx.pump();
        }

        // ---- forks ----
        // (new) ---- forked ----> expired, the parent's snapshot its restore source
        (Idle, Event::Forked { parent, snapshot })
            if task.generation == 0
                && task.snapshots.is_empty()
                && task.lineage.is_none()
                && task.queue.is_empty()
                && snapshot.status == SnapshotStatus::Complete
                && snapshot.id.is_some() =>
        {
            let id = snapshot.id.clone().expect("checked above");
            cx.t.lineage = Some(Lineage {
                parent,
                snapshot: id,
                parent_seq: snapshot.seq,
                forked_at: now,
            });
            cx.t.snapshots.push(SnapshotRecord { seq: 0, ..snapshot });
            cx.settle_without_sandbox();
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::Forked { .. },
        ) => {
            return Err(StepError::InvalidRequest {
                task: task.id.clone(),
                why: "a fork makes a new task from a complete snapshot; this task already has a \
                      history, or the snapshot is not complete",
            });
        }

        // ---- configuration ----
        (Expired, Event::SettingsChanged { settings }) => {
            cx.t.settings = settings;
            if !cx.t.settings.persistent {
                // Not persistent any more: the next sandbox starts fresh.
                cx.t.state = Idle;
            }
        }
        (
            Idle | Provisioning | Running | Snapshotting | Restoring,
            Event::SettingsChanged { settings },
        ) => {
            cx.t.settings = settings;
        }

        // ---- sandbox creation ----
        // provisioning/restoring ---- ready ----> running
        (
            Provisioning | Restoring,
            Event::SandboxReady {
                generation,
                sandbox_id,
                name,
                deadline,
            },
        ) if generation == task.generation => {
            let source = cx.t.restore_source.take();
            let changes_lost = source.is_some() && cx.t.files_behind;
            cx.t.files_behind = false;
            if task.generation > 1 || source.is_some() {
                let taken_at = source.as_deref().and_then(|id| {
                    cx.t.snapshots
                        .iter()
                        .find(|s| s.id.as_deref() == Some(id))
                        .and_then(|s| s.created_at)
                });
                cx.t.notices.push(Notice::Recreated {
                    from_snapshot: source.clone(),
                    taken_at,
                    changes_lost,
                });
            }
            cx.t.sandbox = Some(SandboxRecord {
                id: sandbox_id,
                name,
                generation,
                created_at: now,
                deadline,
                source_snapshot: source,
                used: false,
            });
            cx.t.state = Running;
            cx.clear_op();
            cx.t.last_activity = now;
            cx.arm_idle();
            cx.arm_deadline();
            cx.pump();
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::SandboxReady { sandbox_id, .. },
        ) => {
            // A sandbox we no longer want (an earlier generation, or the task moved on): stop it
            // unless it is the one we hold (a duplicate answer).
            if cx.t.sandbox.as_ref().map(|s| s.id.as_str()) != Some(sandbox_id.as_str()) {
                cx.cmds.push(Command::StopSandbox { sandbox_id });
            }
        }
        (
            Provisioning | Restoring,
            Event::CreateFailed {
                generation,
                failure,
            },
        ) if generation == task.generation => match failure.kind {
            FailureKind::Transient { retry_after_ms } => {
                cx.retry_or_give_up(retry_after_ms, &failure)
            }
            FailureKind::SnapshotGone if task.state == Restoring => cx.snapshot_gone(&failure),
            FailureKind::SnapshotGone
            | FailureKind::SandboxGone
            | FailureKind::Auth
            | FailureKind::Invalid
            | FailureKind::Permanent => cx.give_up(&failure),
        },
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::CreateFailed { .. },
        ) => {} // stale: an earlier generation's create

        // ---- commands ----
        // running ---- command exited ----> running
        (
            Running,
            Event::CommandExited {
                request_id,
                exit_code,
                timed_out,
            },
        ) if cx.is_running(request_id) => {
            cx.t.running = None;
            cx.clear_op();
            cx.t.last_activity = now;
            let notices = mem::take(&mut cx.t.notices);
            cx.reply(
                request_id,
                Reply::Ran {
                    exit_code,
                    timed_out,
                    notices,
                },
            );
            cx.arm_idle();
            cx.pump();
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::CommandExited { .. },
        ) => {} // stale: the request was already answered (expiry, restart)
        (
            Running,
            Event::CommandFailed {
                request_id,
                failure,
            },
        ) if cx.is_running(request_id) => match failure.kind {
            FailureKind::Transient { retry_after_ms } => {
                cx.retry_or_give_up(retry_after_ms, &failure)
            }
            // running ---- sandbox gone under the command ----> expired | idle
            // (| snapshotting: a late checkpoint where the provider keeps files)
            FailureKind::SandboxGone => cx.sandbox_gone(),
            FailureKind::SnapshotGone
            | FailureKind::Auth
            | FailureKind::Invalid
            | FailureKind::Permanent => cx.give_up(&failure),
        },
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::CommandFailed { .. },
        ) => {}
        // running ---- the command never started, sandbox gone ----> (expired | snapshotting)
        // with the request back at the front of the queue: it runs on the restored sandbox.
        (
            Running,
            Event::CommandNotStarted {
                request_id,
                failure,
            },
        ) if cx.is_running(request_id) => match failure.kind {
            FailureKind::Transient { retry_after_ms } => {
                cx.retry_or_give_up(retry_after_ms, &failure)
            }
            FailureKind::SandboxGone => {
                if let Some(run) = cx.t.running.take() {
                    cx.t.queue.push_front(Request::Run {
                        id: run.request_id,
                        command: run.command,
                        timeout_ms: run.timeout_ms,
                    });
                }
                cx.sandbox_gone();
            }
            FailureKind::SnapshotGone
            | FailureKind::Auth
            | FailureKind::Invalid
            | FailureKind::Permanent => cx.give_up(&failure),
        },
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::CommandNotStarted { .. },
        ) => {}

        // ---- snapshots ----
        // snapshotting ---- snapshot taken ----> expired
        (
            Snapshotting,
            Event::SnapshotTaken {
                seq,
                snapshot_id,
                size_bytes,
                expires_at,
                omitted,
                usage: _,
            },
        ) if cx.pending_seq() == Some(seq) => {
            let rec =
                cx.t.snapshots
                    .last_mut()
                    .expect("pending_seq found a record");
            rec.status = SnapshotStatus::Complete;
            rec.id = Some(snapshot_id.clone());
            rec.size_bytes = size_bytes;
            rec.created_at = Some(now);
            rec.expires_at = expires_at;
            rec.omitted = omitted.clone();
            // The latest snapshot now holds the files as they were last written.
            cx.t.files_behind = false;
            if let Some(SnapshotReason::LateCheckpoint { deadline }) = cx.t.snapshot_reason {
                cx.t.notices.push(Notice::LateCheckpoint {
                    snapshot_id: snapshot_id.clone(),
                    deadline,
                });
                cx.t.snapshot_reason = None;
            }
            // A snapshot stops the sandbox. (Persistence may have been switched off while the
            // snapshot was taken: then the task starts fresh next time.)
            cx.t.sandbox = None;
            cx.settle_without_sandbox();
            cx.t.checkpoint_due = false;
            cx.clear_op();
            match cx.t.snapshot_reason.take() {
                Some(SnapshotReason::Suspend { request_id }) => cx.reply(
                    request_id,
                    Reply::Suspended {
                        snapshot_id: Some(snapshot_id),
                        omitted,
                    },
                ),
                // The fork request waits at the front of the queue: `pump` below answers it
                // with this snapshot, now the latest.
                Some(
                    SnapshotReason::Fork { .. }
                    | SnapshotReason::IdleReap
                    | SnapshotReason::Checkpoint
                    | SnapshotReason::LateCheckpoint { .. },
                )
                | None => {}
            }
            cx.prune_snapshots();
            cx.pump();
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::SnapshotTaken {
                seq, snapshot_id, ..
            },
        ) => {
            let known = task
                .snapshots
                .iter()
                .any(|s| s.seq == seq && s.id.as_deref() == Some(snapshot_id.as_str()));
            if !known {
                // A late success of an attempt we already gave up on: nothing refers to it,
                // and its files are still in the live sandbox, so release it.
                cx.cmds.push(Command::DeleteSnapshot { snapshot_id });
            }
        }
        (Snapshotting, Event::SnapshotFailed { seq, failure }) if cx.pending_seq() == Some(seq) => {
            match failure.kind {
                FailureKind::Transient { retry_after_ms } => {
                    cx.retry_or_give_up(retry_after_ms, &failure)
                }
                FailureKind::SandboxGone => cx.expire(),
                FailureKind::SnapshotGone
                | FailureKind::Auth
                | FailureKind::Invalid
                | FailureKind::Permanent => cx.give_up(&failure),
            }
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::SnapshotFailed { .. },
        ) => {}

        // running ---- its own sandbox stopped (`taskbox rm` stops it) ----> expired | idle
        // Every other stop is of a sandbox the task no longer holds.
        (Running, Event::SandboxStopped { sandbox_id, .. }) if cx.holds(&sandbox_id) => {
            if let Some(sb) = cx.t.sandbox.take() {
                if sb.used && cx.t.settings.persistent && cx.t.latest_complete().is_some() {
                    // Commands ran after the latest snapshot in a sandbox that is gone now.
                    cx.t.files_behind = true;
                }
            }
            cx.clear_op();
            cx.settle_without_sandbox();
        }
        // ---- bookkeeping outcomes, absorbed in every state ----
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::SandboxStopped { .. } | Event::StopFailed { .. },
        ) => {
            // The store records the sandbox as released; a failed stop is left to the
            // reconciler (`taskbox gc`), which stops every sandbox no task holds.
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::SnapshotDeleted { snapshot_id },
        ) => cx.mark_deleted(&snapshot_id, SnapshotStatus::Deleted),
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::SnapshotReleased { snapshot_id, .. },
        ) => cx.mark_deleted(&snapshot_id, SnapshotStatus::Released),
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::DeleteFailed {
                snapshot_id,
                failure,
            },
        ) => {
            if failure.kind == FailureKind::SnapshotGone {
                cx.mark_deleted(&snapshot_id, SnapshotStatus::Deleted);
            }
            // Otherwise it stays `deleting` and is retried on the next recovery or snapshot.
        }

        // ---- deadlines ----
        (
            Running | Snapshotting,
            Event::TimeoutExtended {
                sandbox_id,
                deadline,
            },
        ) if cx.holds(&sandbox_id) => {
            if let Some(sb) = cx.t.sandbox.as_mut() {
                sb.deadline = sb.deadline.max(deadline);
            }
            cx.arm_deadline();
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::TimeoutExtended { .. },
        ) => {}
        (Running, Event::ExtendFailed { sandbox_id, .. }) if cx.holds(&sandbox_id) => {
            // The plan allows no more time: checkpoint as soon as no command runs.
            if cx.t.settings.persistent {
                cx.t.checkpoint_due = true;
                cx.pump();
            }
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::ExtendFailed { .. },
        ) => {}

        // ---- reconciliation ----
        // running (probing) ---- probed ----> running (requests served) | expired | idle
        // A sandbox gone with a snapshot the platform took of it as it stopped: that snapshot
        // becomes the task's latest (reason `platform`) before the sandbox is given up.
        (
            Running | Snapshotting,
            Event::SandboxProbed {
                sandbox_id,
                alive,
                platform_snapshot,
                ..
            },
        ) if cx.holds(&sandbox_id) => {
            match alive {
                Some(deadline) => cx.sandbox_lives_until(deadline),
                None if task.state == Running => {
                    // The probe asked the platform for the session's usage already.
                    cx.usage_known = true;
                    if let Some(found) = platform_snapshot {
                        cx.adopt_platform_snapshot(found);
                    }
                    cx.sandbox_gone();
                    cx.prune_snapshots();
                }
                // While snapshotting, the snapshot call's answer decides.
                None => {}
            }
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::SandboxProbed { .. },
        ) => {}
        // running (probing) ---- probe failed ----> running (probe retried | assumed alive)
        (
            Running,
            Event::ProbeFailed {
                sandbox_id,
                failure,
            },
        ) if task.probing && cx.holds(&sandbox_id) => cx.probe_failed(&failure),
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::ProbeFailed { .. },
        ) => {} // stale: no probe of this sandbox is outstanding
        // ---- usage, for the cost ledger only ----
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::UsageRead { .. },
        ) => {}

        // ---- timers ----
        (state, Event::TimerFired { timer }) => cx.on_timer(state, timer),

        // ---- restart ----
        (state, Event::Loaded) => cx.recover(state, true),
        // A journal of an engine that held requests for the probe itself.
        (state, Event::Recovered) => cx.recover(state, false),
    }
    Ok(Transition {
        next: cx.t,
        commands: cx.cmds,
    })
}

/// The working copy of a task during one step, and the commands emitted so far.
struct Cx {
    t: Task,
    cmds: Vec<Command>,
    now: Millis,
    /// The event itself reports what the ending session used (a probe that found it gone):
    /// no [`Command::ReadUsage`] for it.
    usage_known: bool,
}

impl Cx {
    fn accept_request(&mut self, request_id: RequestId) -> Result<(), StepError> {
        if request_id <= self.t.last_request_id {
            return Err(StepError::DuplicateRequest {
                task: self.t.id.clone(),
                request_id,
                last: self.t.last_request_id,
            });
        }
        self.t.last_request_id = request_id;
        Ok(())
    }

    fn reply(&mut self, request_id: RequestId, reply: Reply) {
        self.cmds.push(Command::Reply { request_id, reply });
    }

    fn is_running(&self, request_id: RequestId) -> bool {
        self.t.running.as_ref().map(|r| r.request_id) == Some(request_id)
    }

    fn holds(&self, sandbox_id: &SandboxId) -> bool {
        self.t.sandbox.as_ref().map(|s| &s.id) == Some(sandbox_id)
    }

    /// The sequence number of the snapshot being taken, if any.
    fn pending_seq(&self) -> Option<u64> {
        self.t
            .snapshots
            .last()
            .filter(|s| s.status == SnapshotStatus::Pending)
            .map(|s| s.seq)
    }

    fn clear_op(&mut self) {
        self.t.attempts = 0;
        self.t.retry_at = None;
        self.t.probing = false;
    }

    fn timer(&mut self, timer: TimerKind, at: Millis) {
        self.cmds.push(Command::ScheduleTimer { timer, at });
    }

    fn arm_idle(&mut self) {
        let at = self
            .t
            .last_activity
            .saturating_add(self.t.settings.idle_lifetime_ms);
        self.timer(TimerKind::Idle, at);
    }

    fn arm_deadline(&mut self) {
        if let Some(deadline) = self.t.sandbox.as_ref().map(|s| s.deadline) {
            let margin = self.t.settings.checkpoint_margin_ms;
            self.timer(TimerKind::Checkpoint, deadline.saturating_sub(margin));
            self.timer(TimerKind::Deadline, deadline);
        }
    }

    /// Serves queued requests as far as the current state allows.
    fn pump(&mut self) {
        loop {
            match self.t.state {
                TaskState::Idle | TaskState::Expired => match self.t.queue.front() {
                    None => return,
                    Some(Request::Suspend { id }) => {
                        let id = *id;
                        self.t.queue.pop_front();
                        let snapshot_id = self.kept_snapshot_id();
                        self.reply(
                            id,
                            Reply::Suspended {
                                snapshot_id,
                                omitted: Vec::new(),
                            },
                        );
                    }
                    Some(Request::Fork { .. }) => {
                        if let Some(Request::Fork { id, child, from }) = self.t.queue.pop_front() {
                            self.answer_fork(id, child, &from);
                        }
                    }
                    Some(Request::Run { .. } | Request::Resume { .. }) => {
                        self.begin_sandbox();
                        return;
                    }
                },
                TaskState::Running => {
                    // One command at a time, and none before the recovery probe has answered.
                    if self.t.running.is_some() || self.t.probing {
                        return;
                    }
                    // The recorded deadline passed while no timer could fire (taskbox was not
                    // running): the sandbox is gone, as the deadline timer would have found.
                    // Expire now, so the request restores the files instead of failing in a
                    // dead sandbox with "expired while running".
                    if self
                        .t
                        .sandbox
                        .as_ref()
                        .is_some_and(|sb| self.now >= sb.deadline)
                    {
                        self.sandbox_gone();
                        return;
                    }
                    if self.t.checkpoint_due && self.t.settings.persistent {
                        self.begin_snapshot(SnapshotReason::Checkpoint);
                        return;
                    }
                    // A fork from the latest snapshot of a live task snapshots it first, the
                    // request waiting at the front of the queue until the task settles.
                    if let Some(Request::Fork {
                        id,
                        from: ForkFrom::Latest,
                        ..
                    }) = self.t.queue.front()
                    {
                        if self.t.settings.persistent {
                            let request_id = *id;
                            self.begin_snapshot(SnapshotReason::Fork { request_id });
                            return;
                        }
                    }
                    let Some(req) = self.t.queue.pop_front() else {
                        return;
                    };
                    let sandbox_id = self
                        .t
                        .sandbox
                        .as_ref()
                        .map(|s| s.id.clone())
                        .expect("a running task holds a sandbox");
                    match req {
                        Request::Run {
                            id,
                            command,
                            timeout_ms,
                        } => {
                            self.t.running = Some(RunningCommand {
                                request_id: id,
                                command: command.clone(),
                                timeout_ms,
                                started_at: self.now,
                            });
                            self.t.last_activity = self.now;
                            self.t.attempts = 1;
                            if let Some(sb) = self.t.sandbox.as_mut() {
                                sb.used = true;
                            }
                            self.cmds.push(Command::RunCommand {
                                request_id: id,
                                sandbox_id,
                                command,
                                timeout_ms,
                            });
                            return;
                        }
                        Request::Suspend { id } => {
                            if self.t.settings.persistent {
                                self.begin_snapshot(SnapshotReason::Suspend { request_id: id });
                                return;
                            }
                            self.cmds.push(Command::StopSandbox { sandbox_id });
                            self.t.sandbox = None;
                            self.t.state = TaskState::Idle;
                            self.reply(
                                id,
                                Reply::Suspended {
                                    snapshot_id: None,
                                    omitted: Vec::new(),
                                },
                            );
                        }
                        Request::Resume { id } => {
                            let notices = mem::take(&mut self.t.notices);
                            self.reply(
                                id,
                                Reply::Resumed {
                                    sandbox_id,
                                    notices,
                                },
                            );
                        }
                        // A named snapshot is already taken; a task that is not persistent has
                        // nothing to snapshot (`fork_source` says so).
                        Request::Fork { id, child, from } => self.answer_fork(id, child, &from),
                    }
                }
                TaskState::Provisioning | TaskState::Snapshotting | TaskState::Restoring => return,
            }
        }
    }

    /// Without a sandbox, a task is `expired` when a snapshot holds its files for the next
    /// sandbox, and `idle` when the next sandbox starts fresh.
    fn settle_without_sandbox(&mut self) {
        self.t.state = if self.t.settings.persistent && self.t.latest_complete().is_some() {
            TaskState::Expired
        } else {
            TaskState::Idle
        };
    }

    /// The snapshot holding the task's files while it has no sandbox.
    fn kept_snapshot_id(&self) -> Option<SnapshotId> {
        if self.t.settings.persistent {
            self.t.latest_complete().and_then(|s| s.id.clone())
        } else {
            None
        }
    }

    /// idle ---- run/resume ----> provisioning; expired ---- run/resume ----> restoring
    fn begin_sandbox(&mut self) {
        if let Some(reason) = self.create_bound_reached() {
            let attempts = u32::try_from(self.t.recent_creates.len()).unwrap_or(u32::MAX);
            self.fail_queue(&reason, attempts);
            return;
        }
        self.t.recent_creates.push(self.now);
        self.t.generation += 1;
        self.t.attempts = 1;
        self.t.retry_at = None;
        let source = if self.t.settings.persistent {
            self.t.latest_complete().and_then(|s| s.id.clone())
        } else {
            None
        };
        if source.is_none() && self.t.state == TaskState::Expired && self.t.settings.persistent {
            self.t.notices.push(Notice::FilesLost {
                reason: "no complete snapshot of the task is retained".into(),
            });
        }
        self.t.state = if source.is_some() {
            TaskState::Restoring
        } else {
            TaskState::Provisioning
        };
        self.t.restore_source = source.clone();
        self.emit_create();
    }

    fn emit_create(&mut self) {
        self.cmds.push(Command::CreateSandbox {
            generation: self.t.generation,
            source_snapshot: self.t.restore_source.clone(),
            timeout_ms: self.t.settings.sandbox_timeout_ms,
        });
    }

    /// running ---- suspend | idle | checkpoint ----> snapshotting
    fn begin_snapshot(&mut self, reason: SnapshotReason) {
        let sandbox_id = self
            .t
            .sandbox
            .as_ref()
            .map(|s| s.id.clone())
            .expect("only a task holding a sandbox snapshots");
        let seq = self.t.snapshots.last().map_or(1, |s| s.seq + 1);
        self.t.snapshots.push(SnapshotRecord {
            seq,
            id: None,
            status: SnapshotStatus::Pending,
            size_bytes: 0,
            sandbox_id: sandbox_id.clone(),
            started_at: self.now,
            created_at: None,
            expires_at: None,
            omitted: Vec::new(),
            taken_by: None,
        });
        self.t.snapshot_reason = Some(reason);
        self.t.state = TaskState::Snapshotting;
        self.t.attempts = 1;
        self.t.retry_at = None;
        self.cmds.push(Command::TakeSnapshot { sandbox_id, seq });
    }

    /// Records the snapshot the platform took of the live sandbox as it stopped, as a complete
    /// snapshot of the task (under the same retention as taskbox's own): it holds the files as
    /// they were last written, so nothing is behind it. Ignored unless the task is persistent
    /// (then the reconciler deletes it as retained by no task) or it is already known.
    fn adopt_platform_snapshot(&mut self, found: PlatformSnapshot) {
        if !self.t.settings.persistent
            || self
                .t
                .snapshots
                .iter()
                .any(|s| s.id.as_ref() == Some(&found.snapshot_id))
        {
            return;
        }
        let Some(sandbox) = self.t.sandbox.as_mut() else {
            return;
        };
        // Nothing ran after this snapshot: the restore from it is not behind.
        sandbox.used = false;
        let sandbox_id = sandbox.id.clone();
        let seq = self.t.snapshots.last().map_or(1, |s| s.seq + 1);
        self.t.snapshots.push(SnapshotRecord {
            seq,
            id: Some(found.snapshot_id),
            status: SnapshotStatus::Complete,
            size_bytes: found.size_bytes,
            sandbox_id,
            started_at: self.now,
            created_at: Some(self.now),
            expires_at: found.expires_at,
            omitted: Vec::new(),
            taken_by: Some(SnapshotTaker::Platform),
        });
    }

    /// Re-issues the operation in flight (after a retry delay or a restart).
    fn reissue(&mut self) {
        match self.t.state {
            TaskState::Provisioning | TaskState::Restoring => self.emit_create(),
            TaskState::Snapshotting => {
                if let (Some(seq), Some(sb)) = (self.pending_seq(), self.t.sandbox.as_ref()) {
                    let sandbox_id = sb.id.clone();
                    self.cmds.push(Command::TakeSnapshot { sandbox_id, seq });
                }
            }
            TaskState::Running if self.t.probing => {
                if let Some(sb) = self.t.sandbox.as_ref() {
                    let sandbox_id = sb.id.clone();
                    self.cmds.push(Command::ProbeSandbox { sandbox_id });
                }
            }
            TaskState::Running => {
                if let (Some(run), Some(sb)) = (self.t.running.as_ref(), self.t.sandbox.as_ref()) {
                    self.cmds.push(Command::RunCommand {
                        request_id: run.request_id,
                        sandbox_id: sb.id.clone(),
                        command: run.command.clone(),
                        timeout_ms: run.timeout_ms,
                    });
                }
            }
            TaskState::Idle | TaskState::Expired => {}
        }
    }

    fn retry_or_give_up(&mut self, retry_after_ms: Option<u64>, failure: &Failure) {
        match self
            .t
            .settings
            .retry
            .decide(self.t.attempts, retry_after_ms)
        {
            RetryDecision::RetryAfter(delay) => {
                let at = self.now.saturating_add(delay);
                self.t.retry_at = Some(at);
                self.timer(TimerKind::Retry, at);
            }
            RetryDecision::GiveUp if self.t.state == TaskState::Snapshotting => {
                self.keep_trying_snapshot(retry_after_ms, failure)
            }
            RetryDecision::GiveUp => self.give_up(failure),
        }
    }

    /// A snapshot whose attempts failed transiently has an *unknown* outcome: the provider may
    /// have taken it (and stopped the sandbox) while its answer was lost. Treating it as failed
    /// could leave the task restoring an older snapshot while a newer one exists, so the caller
    /// is answered now, but the task stays `snapshotting` and keeps re-issuing the (idempotent)
    /// snapshot at the policy's longest delay until the provider gives a definite answer.
    fn keep_trying_snapshot(&mut self, retry_after_ms: Option<u64>, failure: &Failure) {
        let attempts = self.t.attempts;
        let reason = FailureReason::SnapshotPending {
            attempts,
            failure: failure.clone(),
        };
        self.fail_snapshot_requester(reason, attempts);
        if matches!(
            self.t.snapshot_reason,
            Some(SnapshotReason::Suspend { .. } | SnapshotReason::Fork { .. })
        ) {
            self.t.snapshot_reason = Some(SnapshotReason::IdleReap);
        }
        let delay = self
            .t
            .settings
            .retry
            .max_delay_ms
            .max(retry_after_ms.unwrap_or(0));
        let at = self.now.saturating_add(delay);
        self.t.retry_at = Some(at);
        self.timer(TimerKind::Retry, at);
    }

    /// The operation in flight failed for good: settle the state and answer who was waiting.
    fn give_up(&mut self, failure: &Failure) {
        let attempts = self.t.attempts.max(1);
        let failure = failure.clone();
        match self.t.state {
            TaskState::Provisioning | TaskState::Restoring => {
                let reason = if self.t.state == TaskState::Restoring {
                    FailureReason::RestoreFailed { attempts, failure }
                } else {
                    FailureReason::CreateFailed { attempts, failure }
                };
                // A failed restore keeps the snapshot mapping: the next request tries again.
                self.settle_without_sandbox();
                self.t.restore_source = None;
                self.clear_op();
                self.fail_queue(&reason, attempts);
            }
            TaskState::Snapshotting
                if matches!(
                    self.t.snapshot_reason,
                    Some(SnapshotReason::LateCheckpoint { .. })
                ) =>
            {
                // The sandbox is past its deadline: it cannot keep running until another try.
                self.expire();
            }
            TaskState::Snapshotting => {
                let reason = FailureReason::SnapshotFailed { attempts, failure };
                if let Some(rec) = self.t.snapshots.last_mut() {
                    rec.status = SnapshotStatus::Failed;
                }
                self.t.state = TaskState::Running;
                self.clear_op();
                self.t.checkpoint_due = false;
                self.fail_snapshot_requester(reason, attempts);
                self.t.snapshot_reason = None;
                self.t.last_activity = self.now;
                self.arm_idle();
                self.pump();
            }
            TaskState::Running => {
                if let Some(run) = self.t.running.take() {
                    let reason = FailureReason::CommandFailed {
                        command: run.command,
                        attempts,
                        failure,
                    };
                    let notices = mem::take(&mut self.t.notices);
                    self.reply(
                        run.request_id,
                        Reply::Failed {
                            reason,
                            attempts,
                            notices,
                        },
                    );
                }
                self.clear_op();
                self.t.last_activity = self.now;
                self.arm_idle();
                self.pump();
            }
            TaskState::Idle | TaskState::Expired => {}
        }
    }

    /// Answers the caller a snapshot was taken for (a suspend, or a fork waiting at the front of
    /// the queue) with `reason`; whether there was one.
    fn fail_snapshot_requester(&mut self, reason: FailureReason, attempts: u32) -> bool {
        let request_id = match self.t.snapshot_reason {
            Some(SnapshotReason::Suspend { request_id }) => request_id,
            Some(SnapshotReason::Fork { request_id }) => {
                let before = self.t.queue.len();
                self.t.queue.retain(|r| r.id() != request_id);
                if self.t.queue.len() == before {
                    return false; // answered already (a restart failed the queue)
                }
                request_id
            }
            Some(
                SnapshotReason::IdleReap
                | SnapshotReason::Checkpoint
                | SnapshotReason::LateCheckpoint { .. },
            )
            | None => return false,
        };
        self.reply(
            request_id,
            Reply::Failed {
                reason,
                attempts,
                notices: Vec::new(),
            },
        );
        true
    }

    /// The snapshot a fork starts from, or why there is none. Only a complete snapshot that has
    /// not expired qualifies (a restore needs it to exist).
    fn fork_source(&self, from: &ForkFrom) -> Result<SnapshotRecord, FailureReason> {
        // A task that keeps no snapshots has none to give (an old one may linger from before
        // persistence was switched off, but its files are not the task's any more), and a fork
        // made under the same settings would start fresh: refuse rather than mislead.
        if !self.t.settings.persistent {
            return Err(FailureReason::NothingToFork { persistent: false });
        }
        let now = self.now;
        let usable = |s: &&SnapshotRecord| {
            s.status == SnapshotStatus::Complete
                && s.id.is_some()
                && s.expires_at.is_none_or(|e| e > now)
        };
        let mut usable_ones = self.t.snapshots.iter().filter(usable);
        let found = match from {
            ForkFrom::Latest => usable_ones.next_back(),
            ForkFrom::Seq { seq } => usable_ones.find(|s| s.seq == *seq),
            ForkFrom::Id { snapshot_id } => {
                usable_ones.find(|s| s.id.as_ref() == Some(snapshot_id))
            }
        };
        if let Some(rec) = found {
            return Ok(rec.clone());
        }
        Err(match from {
            ForkFrom::Latest => FailureReason::NothingToFork {
                persistent: self.t.settings.persistent,
            },
            ForkFrom::Seq { seq } => FailureReason::UnknownSnapshot {
                snapshot: format!("{}.s{seq}", self.t.id),
                retained: self.retained_names(),
            },
            ForkFrom::Id { snapshot_id } => FailureReason::UnknownSnapshot {
                snapshot: snapshot_id.to_string(),
                retained: self.retained_names(),
            },
        })
    }

    /// The task's complete snapshots as `<task>.s<seq> (<id>)`, oldest first.
    fn retained_names(&self) -> Vec<String> {
        self.t
            .snapshots
            .iter()
            .filter(|s| s.status == SnapshotStatus::Complete)
            .filter_map(|s| {
                s.id.as_ref()
                    .map(|id| format!("{}.s{} ({id})", self.t.id, s.seq))
            })
            .collect()
    }

    /// Answers a fork request: the child starts from the snapshot `from` names, or the caller
    /// learns why there is none.
    fn answer_fork(&mut self, id: RequestId, child: TaskId, from: &ForkFrom) {
        let reply = match self.fork_source(from) {
            Ok(snapshot) => Reply::Forked { child, snapshot },
            Err(reason) => Reply::Failed {
                reason,
                attempts: 1,
                notices: Vec::new(),
            },
        };
        self.reply(id, reply);
    }

    fn fail_queue(&mut self, reason: &FailureReason, attempts: u32) {
        for req in mem::take(&mut self.t.queue) {
            match req {
                Request::Suspend { id } => {
                    let snapshot_id = self.kept_snapshot_id();
                    self.reply(
                        id,
                        Reply::Suspended {
                            snapshot_id,
                            omitted: Vec::new(),
                        },
                    );
                }
                Request::Fork { id, .. } => self.reply(
                    id,
                    Reply::Failed {
                        reason: reason.clone(),
                        attempts,
                        notices: Vec::new(),
                    },
                ),
                Request::Run { id, .. } | Request::Resume { id } => {
                    let notices = mem::take(&mut self.t.notices);
                    self.reply(
                        id,
                        Reply::Failed {
                            reason: reason.clone(),
                            attempts,
                            notices,
                        },
                    )
                }
            }
        }
    }

    /// restoring ---- snapshot gone ----> restoring (next retained) | provisioning (none left)
    fn snapshot_gone(&mut self, failure: &Failure) {
        let gone = self.t.restore_source.take();
        if let Some(gone_id) = gone.as_deref() {
            for s in &mut self.t.snapshots {
                if s.id.as_deref() == Some(gone_id) {
                    s.status = SnapshotStatus::Gone;
                }
            }
        }
        let gone_id = gone.as_deref().unwrap_or_default();
        self.t.recent_creates.push(self.now);
        self.t.generation += 1;
        self.t.attempts = 1;
        self.t.retry_at = None;
        let next = if self.t.settings.persistent {
            self.t.latest_complete().and_then(|s| s.id.clone())
        } else {
            None
        };
        match next {
            Some(next) => {
                // The gone snapshot held newer files than the one restored now.
                self.t.files_behind = true;
                self.t.state = TaskState::Restoring;
                self.t.restore_source = Some(next);
            }
            None if !self.t.settings.persistent => self.t.state = TaskState::Provisioning,
            None => {
                self.t.notices.push(Notice::FilesLost {
                    reason: format!(
                        "snapshot {gone_id} is gone ({failure}) and no older snapshot is retained; \
                         the sandbox starts fresh"
                    ),
                });
                self.t.state = TaskState::Provisioning;
            }
        }
        self.emit_create();
    }

    /// The sandbox passed its deadline or was reported gone while `running`. Where the provider
    /// keeps a sandbox's files after its deadline ([`TaskSettings::late_checkpoint`]), they are
    /// snapshotted first — running ---- late checkpoint ----> snapshotting — and only that
    /// snapshot finding them really gone expires the task; elsewhere the sandbox is gone.
    fn sandbox_gone(&mut self) {
        let Some(deadline) = self.t.sandbox.as_ref().map(|s| s.deadline) else {
            return self.expire();
        };
        if !(self.t.settings.late_checkpoint && self.t.settings.persistent) {
            return self.expire();
        }
        if let Some(run) = self.t.running.take() {
            let notices = mem::take(&mut self.t.notices);
            let attempts = self.t.attempts.max(1);
            self.reply(
                run.request_id,
                Reply::Failed {
                    reason: FailureReason::DeadlineDuringCommand {
                        command: run.command,
                    },
                    attempts,
                    notices,
                },
            );
        }
        self.clear_op();
        self.t.checkpoint_due = false;
        self.begin_snapshot(SnapshotReason::LateCheckpoint { deadline });
    }

    /// Whether a new sandbox would pass [`MAX_CREATES_PER_MINUTE`]; the reason to answer if so.
    fn create_bound_reached(&mut self) -> Option<FailureReason> {
        const MINUTE_MS: Millis = 60_000;
        let since = self.now.saturating_sub(MINUTE_MS);
        self.t.recent_creates.retain(|&at| at > since);
        let n = self.t.recent_creates.len();
        if n < MAX_CREATES_PER_MINUTE {
            return None;
        }
        Some(FailureReason::TooManyCreates {
            created: u32::try_from(n).unwrap_or(u32::MAX),
        })
    }

    /// The sandbox is gone (platform deadline, or found dead): running/snapshotting ---->
    /// expired (files in the latest snapshot) | idle (nothing kept).
    fn expire(&mut self) {
        let ended = self.t.sandbox.take();
        let (deadline, used) = ended
            .as_ref()
            .map_or((self.now, false), |s| (s.deadline.min(self.now), s.used));
        // The session ended without the platform being asked: ask it what the session used.
        if let Some(sb) = ended {
            if self.t.settings.reports_usage && !self.usage_known {
                self.cmds.push(Command::ReadUsage { sandbox_id: sb.id });
            }
        }
        let latest = if self.t.settings.persistent {
            self.t.latest_complete().map(|s| {
                (
                    s.id.as_deref().unwrap_or_default().to_string(),
                    s.created_at.unwrap_or(0),
                )
            })
        } else {
            None
        };
        self.t.notices.push(Notice::SandboxExpired { at: deadline });
        let restore_from: Option<SnapshotId> = latest.as_ref().map(|(id, _)| id.as_str().into());
        if latest.is_some() && used {
            // Commands ran after the latest snapshot in a sandbox that is gone now.
            self.t.files_behind = true;
        }
        if latest.is_none() && self.t.settings.persistent {
            self.t.notices.push(Notice::FilesLost {
                reason: "the sandbox expired before any snapshot of it completed".into(),
            });
        }
        if self.t.state == TaskState::Snapshotting {
            if let Some(rec) = self.t.snapshots.last_mut() {
                if rec.status == SnapshotStatus::Pending {
                    rec.status = SnapshotStatus::Failed;
                }
            }
            let attempts = self.t.attempts.max(1);
            let reason = FailureReason::ExpiredDuringSnapshot {
                restore_from: restore_from.clone(),
            };
            self.fail_snapshot_requester(reason, attempts);
        }
        self.t.snapshot_reason = None;
        self.t.checkpoint_due = false;
        if let Some(run) = self.t.running.take() {
            let notices = mem::take(&mut self.t.notices);
            let attempts = self.t.attempts.max(1);
            self.reply(
                run.request_id,
                Reply::Failed {
                    reason: FailureReason::ExpiredDuringCommand {
                        command: run.command,
                        restore_from,
                    },
                    attempts,
                    notices,
                },
            );
        }
        self.clear_op();
        self.settle_without_sandbox();
        self.pump();
    }

    /// Keeps the newest `keep_snapshots` complete snapshots; the rest are deleted
    /// ([`retention::to_retire`]).
    fn prune_snapshots(&mut self) {
        let keep = retention::keep_count(&self.t.settings);
        for i in retention::to_retire(&self.t.snapshots, keep) {
            self.t.snapshots[i].status = SnapshotStatus::Deleting;
        }
        self.emit_pending_deletes();
    }

    fn emit_pending_deletes(&mut self) {
        let ids: Vec<SnapshotId> = self
            .t
            .snapshots
            .iter()
            .filter(|s| s.status == SnapshotStatus::Deleting)
            .filter_map(|s| s.id.clone())
            .collect();
        for snapshot_id in ids {
            self.cmds.push(Command::DeleteSnapshot { snapshot_id });
        }
    }

    fn mark_deleted(&mut self, snapshot_id: &SnapshotId, status: SnapshotStatus) {
        for s in &mut self.t.snapshots {
            if s.id.as_ref() == Some(snapshot_id) && s.status == SnapshotStatus::Deleting {
                s.status = status;
            }
        }
    }

    fn on_timer(&mut self, state: TaskState, timer: TimerKind) {
        let now = self.now;
        match (state, timer) {
            (
                TaskState::Provisioning | TaskState::Restoring | TaskState::Snapshotting,
                TimerKind::Retry,
            )
            | (TaskState::Running, TimerKind::Retry) => {
                if self.t.retry_at.is_some_and(|at| at <= now) {
                    self.t.retry_at = None;
                    self.t.attempts += 1;
                    self.reissue();
                }
            }
            // While the recovery probe is out, the sandbox's own timers wait for its answer,
            // which arms them afresh.
            (TaskState::Running, TimerKind::Idle | TimerKind::Checkpoint | TimerKind::Deadline)
                if self.t.probing => {}
            // running ---- idle lifetime over, no command running ----> snapshotting | idle
            (TaskState::Running, TimerKind::Idle) => {
                let due = self
                    .t
                    .last_activity
                    .saturating_add(self.t.settings.idle_lifetime_ms);
                if self.t.running.is_none() && self.t.queue.is_empty() && now >= due {
                    if self.t.settings.persistent {
                        self.begin_snapshot(SnapshotReason::IdleReap);
                    } else if let Some(sb) = self.t.sandbox.take() {
                        self.cmds.push(Command::StopSandbox { sandbox_id: sb.id });
                        self.t.state = TaskState::Idle;
                    }
                }
            }
            (TaskState::Running, TimerKind::Checkpoint) => {
                let Some(sb) = self.t.sandbox.as_ref() else {
                    return;
                };
                if now.saturating_add(self.t.settings.checkpoint_margin_ms) < sb.deadline {
                    return; // an earlier timer; the deadline has moved since
                }
                let cap = sb
                    .created_at
                    .saturating_add(self.t.settings.max_sandbox_lifetime_ms);
                let active = self.t.running.is_some()
                    || now
                        < self
                            .t
                            .last_activity
                            .saturating_add(self.t.settings.idle_lifetime_ms);
                if sb.deadline < cap && active {
                    let duration_ms = (cap - sb.deadline).min(self.t.settings.sandbox_timeout_ms);
                    let sandbox_id = sb.id.clone();
                    self.cmds.push(Command::ExtendTimeout {
                        sandbox_id,
                        duration_ms,
                    });
                } else if self.t.settings.persistent {
                    self.t.checkpoint_due = true;
                    self.pump();
                }
            }
            (TaskState::Running, TimerKind::Deadline) => {
                if self.t.sandbox.as_ref().is_some_and(|sb| now >= sb.deadline) {
                    self.sandbox_gone();
                }
            }
            // While snapshotting, the deadline is left to the snapshot's own answer: a
            // snapshot that completed must not be discarded because a timer fired first.
            (
                TaskState::Snapshotting,
                TimerKind::Idle | TimerKind::Checkpoint | TimerKind::Deadline,
            )
            | (
                TaskState::Idle | TaskState::Expired,
                TimerKind::Idle | TimerKind::Checkpoint | TimerKind::Deadline | TimerKind::Retry,
            )
            | (
                TaskState::Provisioning | TaskState::Restoring,
                TimerKind::Idle | TimerKind::Checkpoint | TimerKind::Deadline,
            ) => {}
        }
    }

    /// The engine restarted. Callers of queued requests are gone; the operation in flight is
    /// re-issued (idempotent by key) or, for a command, reported interrupted and the sandbox
    /// probed — with later requests waiting for the probe's answer when `hold_for_probe`.
    /// Nothing in flight, nothing queued, nothing to delete: nothing happens.
    fn recover(&mut self, state: TaskState, hold_for_probe: bool) {
        self.fail_queue(&FailureReason::Interrupted, self.t.attempts.max(1));
        self.emit_pending_deletes();
        match state {
            TaskState::Idle | TaskState::Expired => {}
            TaskState::Provisioning | TaskState::Restoring | TaskState::Snapshotting => {
                match self.t.retry_at {
                    Some(at) => self.timer(TimerKind::Retry, at),
                    None => self.reissue(),
                }
            }
            // The previous process stopped while probing: carry on with that probe, its
            // attempts kept (no command can have started meanwhile).
            TaskState::Running if hold_for_probe && self.t.probing => match self.t.retry_at {
                Some(at) => self.timer(TimerKind::Retry, at),
                None => self.reissue(),
            },
            TaskState::Running => {
                if let Some(run) = self.t.running.take() {
                    let notices = mem::take(&mut self.t.notices);
                    self.reply(
                        run.request_id,
                        Reply::Failed {
                            reason: FailureReason::InterruptedCommand {
                                command: run.command,
                            },
                            attempts: self.t.attempts.max(1),
                            notices,
                        },
                    );
                }
                self.clear_op();
                if let Some(sb) = self.t.sandbox.as_ref() {
                    let sandbox_id = sb.id.clone();
                    self.cmds.push(Command::ProbeSandbox { sandbox_id });
                    if hold_for_probe {
                        self.t.probing = true;
                        self.t.attempts = 1;
                    }
                }
            }
        }
    }

    /// The probe answered that the sandbox lives until `deadline` (or is assumed to): the
    /// probe is over, the sandbox's timers are armed and the waiting requests served.
    fn sandbox_lives_until(&mut self, deadline: Millis) {
        if let Some(sb) = self.t.sandbox.as_mut() {
            sb.deadline = deadline;
        }
        if self.t.probing {
            self.clear_op();
        }
        self.arm_idle();
        self.arm_deadline();
        self.pump();
    }

    /// The recovery probe got no answer. A probe is read-only, so a transient failure is
    /// retried as the policy says. When attempts run out, or retrying cannot help, the sandbox
    /// is assumed alive until its recorded deadline: declaring it gone would drop files it may
    /// still hold, while the next command finds out the truth anyway.
    fn probe_failed(&mut self, failure: &Failure) {
        let decision = match failure.kind {
            FailureKind::Transient { retry_after_ms } => self
                .t
                .settings
                .retry
                .decide(self.t.attempts, retry_after_ms),
            FailureKind::SandboxGone
            | FailureKind::SnapshotGone
            | FailureKind::Auth
            | FailureKind::Invalid
            | FailureKind::Permanent => RetryDecision::GiveUp,
        };
        match decision {
            RetryDecision::RetryAfter(delay) => {
                let at = self.now.saturating_add(delay);
                self.t.retry_at = Some(at);
                self.timer(TimerKind::Retry, at);
            }
            RetryDecision::GiveUp => {
                if let Some(deadline) = self.t.sandbox.as_ref().map(|s| s.deadline) {
                    self.sandbox_lives_until(deadline);
                }
            }
        }
    }
}
