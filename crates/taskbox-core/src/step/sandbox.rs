//! The sandbox's life inside a step: creating one (within the create bound), settling when
//! there is none, a sandbox gone behind our back, and expiry at its deadline.

use std::mem;

use super::Cx;
use crate::ids::{SandboxId, SnapshotId};
use crate::reason::FailureReason;
use crate::types::*;

impl Cx {
    pub(super) fn holds(&self, sandbox_id: &SandboxId) -> bool {
        self.t.sandbox.as_ref().map(|s| &s.id) == Some(sandbox_id)
    }

    /// Without a sandbox, a task is `expired` when a snapshot holds its files for the next
    /// sandbox, and `idle` when the next sandbox starts fresh.
    pub(super) fn settle_without_sandbox(&mut self) {
        self.t.state = if self.t.settings.persistent && self.t.latest_complete().is_some() {
            TaskState::Expired
        } else {
            TaskState::Idle
        };
    }

    /// idle ---- run/resume ----> provisioning; expired ---- run/resume ----> restoring
    pub(super) fn begin_sandbox(&mut self) {
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
            self.t.restore_point().and_then(|s| s.id.clone())
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

    pub(super) fn emit_create(&mut self) {
        self.cmds.push(Command::CreateSandbox {
            generation: self.t.generation,
            source_snapshot: self.t.restore_source.clone(),
            timeout_ms: self.t.settings.sandbox_timeout_ms,
        });
    }

    /// The sandbox passed its deadline or was reported gone while `running`. Where the provider
    /// keeps a sandbox's files after its deadline ([`TaskSettings::late_checkpoint`]), they are
    /// snapshotted first — running ---- late checkpoint ----> snapshotting — and only that
    /// snapshot finding them really gone expires the task; elsewhere the sandbox is gone.
    pub(super) fn sandbox_gone(&mut self) {
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
    pub(super) fn create_bound_reached(&mut self) -> Option<FailureReason> {
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
    pub(super) fn expire(&mut self) {
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
            self.t.restore_point().map(|s| {
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

    /// The probe answered that the sandbox lives until `deadline` (or is assumed to): the
    /// probe is over, the sandbox's timers are armed and the waiting requests served.
    pub(super) fn sandbox_lives_until(&mut self, deadline: Millis) {
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
}
