//! Retries inside a step: re-issuing the operation in flight, the policy's decision after a
//! failure, and giving up with the last real error.

use std::mem;

use super::Cx;
use crate::reason::FailureReason;
use crate::types::*;

impl Cx {
    pub(super) fn clear_op(&mut self) {
        self.t.attempts = 0;
        self.t.retry_at = None;
        self.t.probing = false;
    }

    /// Re-issues the operation in flight (after a retry delay or a restart).
    pub(super) fn reissue(&mut self) {
        match self.t.state {
            TaskState::Provisioning | TaskState::Restoring => self.emit_create(),
            TaskState::Snapshotting => {
                if let (Some(seq), Some(sb)) = (self.pending_seq(), self.t.sandbox.as_ref()) {
                    let sandbox_id = sb.id.clone();
                    if self.t.snapshot_reason.is_some_and(SnapshotReason::is_live) {
                        let previous = self.t.restore_point().and_then(|s| s.id.clone());
                        self.cmds.push(Command::TakeCheckpoint {
                            sandbox_id,
                            seq,
                            previous,
                        });
                    } else {
                        self.cmds.push(Command::TakeSnapshot { sandbox_id, seq });
                    }
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

    pub(super) fn retry_or_give_up(&mut self, retry_after_ms: Option<u64>, failure: &Failure) {
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
    pub(super) fn keep_trying_snapshot(&mut self, retry_after_ms: Option<u64>, failure: &Failure) {
        let attempts = self.t.attempts;
        let reason = FailureReason::SnapshotPending {
            attempts,
            failure: failure.clone(),
        };
        self.fail_snapshot_requester(reason, attempts);
        match self.t.snapshot_reason {
            Some(SnapshotReason::Suspend { .. } | SnapshotReason::Fork { .. }) => {
                self.t.snapshot_reason = Some(SnapshotReason::IdleReap);
            }
            // A live checkpoint stays live (its sandbox runs on); nobody waits for it now.
            Some(
                SnapshotReason::Checkpointing { live, .. } | SnapshotReason::Rewind { live, .. },
            ) => {
                self.t.snapshot_reason = Some(SnapshotReason::Checkpointing {
                    request_id: None,
                    live,
                });
            }
            Some(
                SnapshotReason::IdleReap
                | SnapshotReason::BusyCap
                | SnapshotReason::Checkpoint
                | SnapshotReason::LateCheckpoint { .. },
            )
            | None => {}
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
    pub(super) fn give_up(&mut self, failure: &Failure) {
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
                self.fail_rewinding(&reason, attempts);
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
}
