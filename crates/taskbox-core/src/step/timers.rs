//! Timers: arming the idle, checkpoint and deadline timers, and what each does when it fires
//! in each state ([`Cx::on_timer`]); and activity-aware idle, the rule that keeps a sandbox whose
//! processes are busy from its idle snapshot ([`Cx::activity_sampled`]).
//!
//! Where the provider samples activity (`max_busy_ms` > 0), the idle rule falls due
//! `idle_lifetime_ms` after the last command or after the last sample that found the processes
//! busy, whichever is later, but a busy sandbox no later than `max_busy_ms` after the last
//! command ([`Cx::idle_due`]). A window before it falls due the activity timer takes a first
//! sample; when it falls due a second one is taken, and the difference decides:
//!
//! ```text
//!  running ──Activity timer──▶ SampleActivity ──ActivitySampled──▶ (kept as the baseline)
//!  running ──Idle timer (due)──▶ SampleActivity ──ActivitySampled──▶ busy?
//!     busy, before the cap ─▶ running, idle timer re-armed from now
//!     busy, at the cap      ─▶ snapshotting (BusyCap)
//!     idle or not measured  ─▶ snapshotting (IdleReap), as without sampling
//! ```
//!
//! A busy sandbox is also kept past its platform deadline where the platform lets its timeout
//! be extended (the checkpoint timer counts it as active), never past
//! `max_sandbox_lifetime_ms`.

use super::Cx;
use crate::types::*;

impl Cx {
    pub(super) fn timer(&mut self, timer: TimerKind, at: Millis) {
        self.cmds.push(Command::ScheduleTimer { timer, at });
    }

    pub(super) fn arm_idle(&mut self) {
        let due = self.idle_due();
        if self.samples_activity() {
            let window = sample_window_ms(self.t.settings.idle_lifetime_ms);
            self.timer(TimerKind::Activity, due.saturating_sub(window));
        }
        self.timer(TimerKind::Idle, due);
    }

    /// Whether idle sees the sandbox's processes' work (the provider samples it).
    fn samples_activity(&self) -> bool {
        self.t.settings.max_busy_ms > 0
    }

    /// When the idle rule falls due: `idle_lifetime_ms` after the last command, or after the
    /// last sample that found the processes busy if that is later, capped for a busy sandbox at
    /// [`busy_cap`](Self::busy_cap) (a cap below the idle lifetime never shortens it).
    pub(super) fn idle_due(&self) -> Millis {
        let idle = self.t.settings.idle_lifetime_ms;
        let from_command = self.t.last_activity.saturating_add(idle);
        let busy_at = self
            .t
            .sandbox
            .as_ref()
            .and_then(|s| s.activity)
            .and_then(|a| a.busy_at)
            .filter(|at| *at > self.t.last_activity);
        match busy_at {
            Some(at) if self.samples_activity() => at
                .saturating_add(idle)
                .min(self.busy_cap())
                .max(from_command),
            _ => from_command,
        }
    }

    /// How long a busy sandbox is kept: `max_busy_ms` after the last command.
    fn busy_cap(&self) -> Millis {
        self.t
            .last_activity
            .saturating_add(self.t.settings.max_busy_ms)
    }

    /// Nothing is running or waiting: the idle rule may apply.
    fn quiet(&self) -> bool {
        self.t.running.is_none() && self.t.queue.is_empty()
    }

    /// Asks for a sample, unless one is out already.
    fn sample_activity(&mut self) {
        if let Some(sb) = self.t.sandbox.as_mut().filter(|sb| !sb.sampling) {
            sb.sampling = true;
            let sandbox_id = sb.id.clone();
            self.cmds.push(Command::SampleActivity { sandbox_id });
        }
    }

    /// The idle rule fired (`reason` says which): snapshot the sandbox, or stop it when files
    /// are not kept.
    fn reap(&mut self, reason: SnapshotReason) {
        if self.t.settings.persistent {
            self.begin_snapshot(reason);
        } else if let Some(sb) = self.t.sandbox.take() {
            self.cmds.push(Command::StopSandbox { sandbox_id: sb.id });
            self.t.state = TaskState::Idle;
        }
    }

    /// `running` ---- activity sampled ----> running | snapshotting: keeps the sample, and once
    /// the idle rule is due decides by the difference from the previous one, the window's first
    /// (see the module docs). A sample taken before (the window's first) only becomes the next
    /// one's baseline; a sample that could not be read counts as idle.
    pub(super) fn activity_sampled(&mut self, resources: Option<Resources>) {
        let now = self.now;
        let verdict = self.quiet() && self.samples_activity() && now >= self.idle_due();
        let Some(sb) = self.t.sandbox.as_mut() else {
            return;
        };
        sb.sampling = false;
        if self.t.probing {
            return; // a restart's probe decides first; it re-arms the timers
        }
        let before = sb.activity;
        let busy = match (before, resources) {
            (Some(b), Some(r)) => busy_between(&b.resources, &r, now.saturating_sub(b.sampled_at)),
            _ => false,
        };
        if let Some(resources) = resources {
            sb.activity = Some(SandboxActivity {
                sampled_at: now,
                resources,
                busy_at: if verdict && busy {
                    Some(now)
                } else {
                    before.and_then(|b| b.busy_at)
                },
            });
        }
        if !verdict {
            // A request that came meanwhile waited for this answer.
            self.pump();
            return;
        }
        if !busy {
            self.reap(SnapshotReason::IdleReap);
        } else if now >= self.busy_cap() {
            self.reap(SnapshotReason::BusyCap);
        } else {
            self.arm_idle();
            // A checkpoint that fell due meanwhile waited for this answer.
            self.pump();
        }
    }

    /// A sample is out: commands wait for its answer.
    pub(super) fn sampling(&self) -> bool {
        self.t.sandbox.as_ref().is_some_and(|sb| sb.sampling)
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
            (
                TaskState::Running,
                TimerKind::Idle | TimerKind::Checkpoint | TimerKind::Deadline | TimerKind::Activity,
            ) if self.t.probing => {}
            // running ---- idle lifetime over, no command running ----> snapshotting | idle
            // (or, where activity is sampled, the sample that decides: running)
            (TaskState::Running, TimerKind::Idle) => {
                if self.quiet() && now >= self.idle_due() {
                    if self.samples_activity() {
                        self.sample_activity();
                    } else {
                        self.reap(SnapshotReason::IdleReap);
                    }
                }
            }
            // running ---- the idle rule nears, no command running ----> running (first sample)
            // Not when the window has a sample already (the cap can bring the window's start
            // before a busy verdict that re-armed it).
            (TaskState::Running, TimerKind::Activity) => {
                let due = self.idle_due();
                let window_start =
                    due.saturating_sub(sample_window_ms(self.t.settings.idle_lifetime_ms));
                let sampled = self
                    .t
                    .sandbox
                    .as_ref()
                    .and_then(|s| s.activity)
                    .is_some_and(|a| a.sampled_at >= window_start);
                if self.quiet() && self.samples_activity() && now < due && !sampled {
                    self.sample_activity();
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
                // A command, one lately, or processes busy lately (activity-aware idle).
                let active = self.t.running.is_some() || now < self.idle_due();
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
                TimerKind::Idle | TimerKind::Checkpoint | TimerKind::Deadline | TimerKind::Activity,
            )
            | (
                TaskState::Idle | TaskState::Expired,
                TimerKind::Idle
                | TimerKind::Checkpoint
                | TimerKind::Deadline
                | TimerKind::Retry
                | TimerKind::Activity,
            )
            | (
                TaskState::Provisioning | TaskState::Restoring,
                TimerKind::Idle | TimerKind::Checkpoint | TimerKind::Deadline | TimerKind::Activity,
            ) => {}
        }
    }
}
