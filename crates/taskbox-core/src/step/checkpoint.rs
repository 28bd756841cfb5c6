//! Checkpoints and rewinds inside a step: a snapshot that keeps the sandbox running (where the
//! provider can, [`TaskSettings::live_checkpoint`]), the checkpoints `terminal.checkpoint`
//! takes by itself, and a rewind — the current files kept first, then the chosen snapshot
//! restored into a new sandbox.

use std::mem;

use super::Cx;
use crate::ids::SnapshotId;
use crate::reason::FailureReason;
use crate::types::*;

impl Cx {
    /// running ---- checkpoint | rewind ----> snapshotting. A live checkpoint keeps the
    /// sandbox ([`Command::TakeCheckpoint`]); elsewhere it is a snapshot that stops it.
    pub(super) fn begin_checkpoint(&mut self, reason: SnapshotReason) {
        if !reason.is_live() {
            return self.begin_snapshot(reason);
        }
        let previous = self.t.restore_point().and_then(|s| s.id.clone());
        self.begin_snapshot(reason);
        // `begin_snapshot` asked for a snapshot that stops the sandbox: ask for a live one.
        if let Some(Command::TakeSnapshot { sandbox_id, seq }) = self.cmds.pop() {
            self.cmds.push(Command::TakeCheckpoint {
                sandbox_id,
                seq,
                previous,
            });
        }
    }

    /// The reason a checkpoint of the live sandbox would have now.
    pub(super) fn checkpoint_reason(&self, request_id: Option<RequestId>) -> SnapshotReason {
        SnapshotReason::Checkpointing {
            request_id,
            live: self.t.settings.live_checkpoint,
        }
    }

    /// After a command: whether `terminal.checkpoint` wants a checkpoint now. Only a provider
    /// that checkpoints a live sandbox takes them by themselves (elsewhere each would stop it).
    pub(super) fn auto_checkpoint_due(&self) -> bool {
        if !(self.t.settings.persistent && self.t.settings.live_checkpoint) {
            return false;
        }
        match self.t.settings.checkpoint {
            AutoCheckpoint::Off => false,
            AutoCheckpoint::EveryCommand => true,
            AutoCheckpoint::Interval { ms } => {
                let since = self
                    .t
                    .latest_complete()
                    .and_then(|s| s.created_at)
                    .into_iter()
                    .chain(self.t.sandbox.as_ref().map(|s| s.created_at))
                    .max()
                    .unwrap_or(0);
                self.now >= since.saturating_add(ms)
            }
        }
    }

    /// snapshotting ---- live checkpoint taken | unchanged ----> running (the sandbox runs on),
    /// then a rewind waiting for it goes on. `taken`: the new snapshot; `None`: nothing
    /// changed, the latest complete snapshot holds the files.
    pub(super) fn finish_live_checkpoint(&mut self, taken: Option<SnapshotId>) {
        self.t.state = TaskState::Running;
        self.clear_op();
        if taken.is_some() {
            // The checkpoint holds the files as they are: nothing is behind it any more.
            self.t.files_behind = false;
            self.t.rewound_to = None;
            self.t.rewind_saved = None;
            if let Some(sb) = self.t.sandbox.as_mut() {
                sb.used = false;
            }
        }
        let latest = self
            .t
            .restore_point()
            .map(|s| (s.id.clone(), s.seq))
            .unzip();
        match self.t.snapshot_reason.take() {
            Some(SnapshotReason::Checkpointing {
                request_id: Some(request_id),
                ..
            }) => {
                let outcome = if taken.is_some() {
                    CheckpointOutcome::Taken
                } else {
                    CheckpointOutcome::Unchanged
                };
                self.reply(
                    request_id,
                    Reply::Checkpointed {
                        snapshot_id: latest.0.flatten(),
                        seq: latest.1,
                        outcome,
                    },
                );
            }
            Some(SnapshotReason::Rewind { .. }) => {
                self.arm_idle();
                self.arm_deadline();
                return self.start_rewind();
            }
            Some(
                SnapshotReason::Checkpointing {
                    request_id: None, ..
                }
                | SnapshotReason::Suspend { .. }
                | SnapshotReason::IdleReap
                | SnapshotReason::BusyCap
                | SnapshotReason::Checkpoint
                | SnapshotReason::LateCheckpoint { .. }
                | SnapshotReason::Fork { .. },
            )
            | None => {}
        }
        if taken.is_some() {
            self.prune_snapshots();
        }
        // Timers that fired while the snapshot was taken were absorbed: arm them again.
        self.arm_idle();
        self.arm_deadline();
        self.pump();
    }

    /// Serves the rewind at the front of the queue once the current files are kept (in a
    /// checkpoint, or — no live sandbox — in the latest snapshot): restores the snapshot it
    /// names into a new sandbox (running | expired | idle ----> restoring), or answers why not.
    pub(super) fn start_rewind(&mut self) {
        let Some(Request::Rewind { id, to }) = self.t.queue.pop_front() else {
            return self.pump();
        };
        let saved = self.t.restore_point().map(|s| (s.id.clone(), s.seq));
        let target = match self.rewind_target(&to) {
            Ok(rec) => rec,
            Err(reason) => {
                let notices = mem::take(&mut self.t.notices);
                self.reply(
                    id,
                    Reply::Failed {
                        reason,
                        attempts: 1,
                        notices,
                    },
                );
                return self.pump();
            }
        };
        if let Some(reason) = self.create_bound_reached() {
            let attempts = u32::try_from(self.t.recent_creates.len()).unwrap_or(u32::MAX);
            self.reply(
                id,
                Reply::Failed {
                    reason,
                    attempts,
                    notices: Vec::new(),
                },
            );
            return self.pump();
        }
        let to_id = target.id.clone().expect("a rewind target is complete");
        // Live processes end with the sandbox, as on any restore.
        if let Some(sb) = self.t.sandbox.take() {
            self.cmds.push(Command::StopSandbox { sandbox_id: sb.id });
        }
        self.t.running = None;
        self.t.checkpoint_due = false;
        self.t.rewound_to = Some(to_id.clone());
        self.t.rewind_saved = saved.as_ref().and_then(|s| s.0.clone());
        self.t.files_behind = false;
        self.t.rewinding = Some(Rewinding {
            request_id: id,
            to: to_id.clone(),
            to_seq: target.seq,
            saved: saved.as_ref().and_then(|s| s.0.clone()),
            saved_seq: saved.map(|s| s.1),
        });
        self.t.recent_creates.push(self.now);
        self.t.generation += 1;
        self.t.attempts = 1;
        self.t.retry_at = None;
        self.t.state = TaskState::Restoring;
        self.t.restore_source = Some(to_id);
        self.prune_snapshots();
        self.emit_create();
    }

    /// The complete snapshot a rewind restores, or why none: an unknown name, a snapshot that
    /// is not complete (deleted, failed, gone...), or `--back` beyond what exists. Relative to
    /// the snapshot now holding the current files (the newest complete one).
    pub(super) fn rewind_target(&self, to: &RewindTo) -> Result<SnapshotRecord, FailureReason> {
        if !self.t.settings.persistent {
            return Err(FailureReason::NotPersistent);
        }
        let now = self.now;
        let name = |s: &SnapshotRecord| format!("{}.s{}", self.t.id, s.seq);
        let usable = |s: &SnapshotRecord| {
            s.status == SnapshotStatus::Complete
                && s.id.is_some()
                && s.expires_at.is_none_or(|e| e > now)
        };
        let check = |s: &SnapshotRecord| {
            if usable(s) {
                Ok(s.clone())
            } else {
                let status = if s.status == SnapshotStatus::Complete {
                    "expired".to_string()
                } else {
                    s.status.as_str().to_string()
                };
                Err(FailureReason::SnapshotUnusable {
                    snapshot: name(s),
                    status,
                })
            }
        };
        match to {
            RewindTo::Seq { seq } => match self.t.snapshots.iter().find(|s| s.seq == *seq) {
                Some(s) => check(s),
                None => Err(FailureReason::UnknownSnapshot {
                    snapshot: format!("{}.s{seq}", self.t.id),
                    retained: self.retained_names(),
                }),
            },
            RewindTo::Id { snapshot_id } => {
                let mut named = self
                    .t
                    .snapshots
                    .iter()
                    .filter(|s| s.id.as_ref() == Some(snapshot_id));
                match named.clone().find(|s| usable(s)).or_else(|| named.next()) {
                    Some(s) => check(s),
                    None => Err(FailureReason::UnknownSnapshot {
                        snapshot: snapshot_id.to_string(),
                        retained: self.retained_names(),
                    }),
                }
            }
            RewindTo::Back { n } => {
                let complete: Vec<&SnapshotRecord> =
                    self.t.snapshots.iter().filter(|s| usable(s)).collect();
                // Counted from the snapshot holding the current files: the latest, or the one
                // an earlier rewind restored.
                let current = self.t.restore_point().map(|s| s.seq);
                let pos = complete
                    .iter()
                    .position(|s| Some(s.seq) == current)
                    .unwrap_or(complete.len().saturating_sub(1));
                let available = pos as u64;
                if *n == 0 || *n > available {
                    return Err(FailureReason::RewindTooFar {
                        back: *n,
                        available,
                    });
                }
                Ok(complete[pos - *n as usize].clone())
            }
        }
    }

    /// restoring ---- ready ----> running: answers the rewind whose restore this was (or, the
    /// restore having fallen back to another snapshot, says it failed).
    pub(super) fn answer_rewind(&mut self, restored_from: Option<&SnapshotId>) {
        let Some(r) = self.t.rewinding.take() else {
            return;
        };
        let Some(sandbox_id) = self.t.sandbox.as_ref().map(|s| s.id.clone()) else {
            return;
        };
        let notices = mem::take(&mut self.t.notices);
        let reply = if restored_from == Some(&r.to) {
            Reply::Rewound {
                to: r.to,
                to_seq: r.to_seq,
                saved: r.saved,
                saved_seq: r.saved_seq,
                sandbox_id,
                notices,
            }
        } else {
            Reply::Failed {
                reason: FailureReason::SnapshotUnusable {
                    snapshot: format!("{}.s{}", self.t.id, r.to_seq),
                    status: SnapshotStatus::Gone.as_str().to_string(),
                },
                attempts: 1,
                notices,
            }
        };
        self.reply(r.request_id, reply);
    }

    /// The rewind in flight, if any, failed (its restore gave up, or taskbox restarted).
    pub(super) fn fail_rewinding(&mut self, reason: &FailureReason, attempts: u32) {
        if let Some(r) = self.t.rewinding.take() {
            self.reply(
                r.request_id,
                Reply::Failed {
                    reason: reason.clone(),
                    attempts,
                    notices: Vec::new(),
                },
            );
        }
    }

    /// Snapshots retention must keep whatever its count says: the one the files were rewound
    /// to and the one holding the files from before (the undo), the one a rewind in flight
    /// restores, and those queued rewinds and forks name
    /// (for `--back N`, the newest N + 1).
    pub(super) fn needed_snapshots(&self) -> Vec<SnapshotId> {
        let mut needed: Vec<SnapshotId> = self.t.rewound_to.iter().cloned().collect();
        needed.extend(self.t.rewind_saved.iter().cloned());
        needed.extend(self.t.rewinding.as_ref().map(|r| r.to.clone()));
        needed.extend(self.t.rewinding.as_ref().and_then(|r| r.saved.clone()));
        let complete: Vec<&SnapshotRecord> = self
            .t
            .snapshots
            .iter()
            .filter(|s| s.status == SnapshotStatus::Complete)
            .collect();
        for req in &self.t.queue {
            let by_seq = |seq: u64| {
                complete
                    .iter()
                    .find(|s| s.seq == seq)
                    .and_then(|s| s.id.clone())
            };
            match req {
                Request::Rewind {
                    to: RewindTo::Seq { seq },
                    ..
                }
                | Request::Fork {
                    from: ForkFrom::Seq { seq },
                    ..
                } => needed.extend(by_seq(*seq)),
                Request::Rewind {
                    to: RewindTo::Id { snapshot_id },
                    ..
                }
                | Request::Fork {
                    from: ForkFrom::Id { snapshot_id },
                    ..
                } => needed.push(snapshot_id.clone()),
                Request::Rewind {
                    to: RewindTo::Back { n },
                    ..
                } => needed.extend(
                    complete
                        .iter()
                        .rev()
                        .take(usize::try_from(*n).unwrap_or(usize::MAX).saturating_add(1))
                        .filter_map(|s| s.id.clone()),
                ),
                Request::Run { .. }
                | Request::Suspend { .. }
                | Request::Resume { .. }
                | Request::Checkpoint { .. }
                | Request::Fork {
                    from: ForkFrom::Latest,
                    ..
                } => {}
            }
        }
        needed
    }
}
