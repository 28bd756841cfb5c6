//! Timers: arming the idle, checkpoint and deadline timers, and what each does when it fires
//! in each state ([`Cx::on_timer`]).

use super::Cx;
use crate::types::*;

impl Cx {
    pub(super) fn timer(&mut self, timer: TimerKind, at: Millis) {
        self.cmds.push(Command::ScheduleTimer { timer, at });
    }

    pub(super) fn arm_idle(&mut self) {
        let at = self
            .t
            .last_activity
            .saturating_add(self.t.settings.idle_lifetime_ms);
        self.timer(TimerKind::Idle, at);
    }

    pub(super) fn arm_deadline(&mut self) {
        if let Some(deadline) = self.t.sandbox.as_ref().map(|s| s.deadline) {
            let margin = self.t.settings.checkpoint_margin_ms;
            self.timer(TimerKind::Checkpoint, deadline.saturating_sub(margin));
            self.timer(TimerKind::Deadline, deadline);
        }
    }

    pub(super) fn on_timer(&mut self, state: TaskState, timer: TimerKind) {
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
}
