//! Recovery after a restart: reconciling a task caught in a transient state from its journal
//! and a probe of the provider, never by guessing.

use std::mem;

use super::Cx;
use crate::reason::FailureReason;
use crate::types::*;

impl Cx {
    /// The engine restarted. Callers of queued requests are gone; the operation in flight is
    /// re-issued (idempotent by key) or, for a command, reported interrupted and the sandbox
    /// probed — with later requests waiting for the probe's answer when `hold_for_probe`.
    /// Nothing in flight, nothing queued, nothing to delete: nothing happens.
    pub(super) fn recover(&mut self, state: TaskState, hold_for_probe: bool) {
        // An activity sample's answer went with the previous process.
        if let Some(sb) = self.t.sandbox.as_mut() {
            sb.sampling = false;
        }
        self.fail_queue(&FailureReason::Interrupted, self.t.attempts.max(1));
        // A rewind's restore goes on (re-issued below); its caller is gone.
        self.fail_rewinding(&FailureReason::Interrupted, self.t.attempts.max(1));
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

    /// The recovery probe got no answer. A probe is read-only, so a transient failure is
    /// retried as the policy says. When attempts run out, or retrying cannot help, the sandbox
    /// is assumed alive until its recorded deadline: declaring it gone would drop files it may
    /// still hold, while the next command finds out the truth anyway.
    pub(super) fn probe_failed(&mut self, failure: &Failure) {
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
