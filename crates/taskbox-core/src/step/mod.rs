//! The transition table: `step(task, event, now) -> Transition`.
//!
//! One exhaustive `match (state, event)` with no wildcard arm: adding a state or an event forces a
//! decision for every pair. Outcomes that arrive late or twice (a second "snapshot taken", the
//! exit of a command whose sandbox already expired, a timer armed before the state moved on) are
//! absorbed on purpose — they leave the task unchanged or only release what they name. Events
//! that no correct engine can produce are typed [`StepError`]s.
//!
//! This file holds the table; the helpers its arms call live by concern: `queue` (accepting,
//! answering and serving requests), `sandbox` (creation, expiry, a sandbox gone), `snapshot`
//! (taking, adopting and retiring snapshots, by [`crate::retention`]), `retry` (re-issuing and
//! giving up), `timers`, `recover` (restart reconciliation) and `fork`.

mod checkpoint;
mod fork;
mod queue;
mod recover;
mod retry;
mod sandbox;
mod snapshot;
mod timers;

use std::mem;

use super::types::*;
use crate::ids::TaskId;

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

        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::CheckpointRequested { request_id },
        ) => {
            cx.accept_request(request_id)?;
            cx.t.queue.push_back(Request::Checkpoint { id: request_id });
            cx.pump();
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::RewindRequested { request_id, to },
        ) => {
            cx.accept_request(request_id)?;
            cx.t.queue.push_back(Request::Rewind { id: request_id, to });
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
                source_snapshot: source.clone(),
                used: false,
                activity: None,
                sampling: false,
            });
            cx.t.state = Running;
            cx.clear_op();
            cx.t.last_activity = now;
            cx.arm_idle();
            cx.arm_deadline();
            // A rewind's restore: answer it (it names both snapshots).
            cx.answer_rewind(source.as_ref());
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
                memory_killed,
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
                    memory_killed,
                    notices,
                },
            );
            cx.arm_idle();
            // running ---- command exited, `terminal.checkpoint` due ----> snapshotting (live)
            if cx.auto_checkpoint_due() {
                let reason = cx.checkpoint_reason(None);
                cx.begin_checkpoint(reason);
            } else {
                cx.pump();
            }
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
        // snapshotting ---- live checkpoint taken ----> running (the sandbox runs on)
        (
            Snapshotting,
            Event::SnapshotTaken {
                seq,
                snapshot_id,
                size_bytes,
                expires_at,
                omitted,
                usage: _,
                // A live checkpoint ends no generation: its figures come with the snapshot
                // that does.
                resources: _,
            },
        ) if cx.pending_seq() == Some(seq)
            && task.snapshot_reason.is_some_and(SnapshotReason::is_live) =>
        {
            let rec =
                cx.t.snapshots
                    .last_mut()
                    .expect("pending_seq found a record");
            rec.status = SnapshotStatus::Complete;
            rec.id = Some(snapshot_id.clone());
            rec.size_bytes = size_bytes;
            rec.created_at = Some(now);
            rec.expires_at = expires_at;
            rec.omitted = omitted;
            cx.finish_live_checkpoint(Some(snapshot_id));
        }
        // snapshotting ---- live checkpoint found nothing changed ----> running, no snapshot
        (Snapshotting, Event::CheckpointUnchanged { seq })
            if cx.pending_seq() == Some(seq)
                && task.snapshot_reason.is_some_and(SnapshotReason::is_live) =>
        {
            // Nothing was made for this sequence number: the record goes, and the number is
            // taken again by the next snapshot (the provider wrote nothing under it).
            cx.t.snapshots.pop();
            cx.finish_live_checkpoint(None);
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::CheckpointUnchanged { .. },
        ) => {} // stale: an attempt already answered
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
                resources: _,
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
                // The platform cannot checkpoint a running sandbox: say it stopped.
                Some(SnapshotReason::Checkpointing {
                    request_id: Some(request_id),
                    ..
                }) => cx.reply(
                    request_id,
                    Reply::Checkpointed {
                        snapshot_id: Some(snapshot_id),
                        seq: Some(seq),
                        outcome: CheckpointOutcome::Stopped,
                    },
                ),
                // The fork request waits at the front of the queue: `pump` below answers it
                // with this snapshot, now the latest.
                // So does a rewind waiting at the front, served now that the files are kept.
                Some(
                    SnapshotReason::Fork { .. }
                    | SnapshotReason::Rewind { .. }
                    | SnapshotReason::IdleReap
                    | SnapshotReason::BusyCap
                    | SnapshotReason::Checkpoint
                    | SnapshotReason::LateCheckpoint { .. }
                    | SnapshotReason::Checkpointing {
                        request_id: None, ..
                    },
                )
                | None => {}
            }
            cx.t.rewound_to = None;
            cx.t.rewind_saved = None;
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
        // ---- activity-aware idle ----
        // running ---- activity sampled ----> running | snapshotting (see `timers`)
        (
            Running,
            Event::ActivitySampled {
                sandbox_id,
                resources,
            },
        ) if cx.holds(&sandbox_id) => cx.activity_sampled(resources),
        // snapshotting ---- activity sampled ----> snapshotting (the sample is out no more, should
        // the snapshot fail and the sandbox run on)
        (Snapshotting, Event::ActivitySampled { sandbox_id, .. }) if cx.holds(&sandbox_id) => {
            if let Some(sb) = cx.t.sandbox.as_mut() {
                sb.sampling = false;
            }
        }
        (
            Idle | Provisioning | Running | Snapshotting | Expired | Restoring,
            Event::ActivitySampled { .. },
        ) => {} // late: the sandbox is gone
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
