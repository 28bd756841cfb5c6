//! Snapshots inside a step: taking one, adopting the platform's, a snapshot gone, and
//! retention (pruning by [`retention`], deletes and their outcomes).

use super::Cx;
use crate::ids::SnapshotId;
use crate::reason::FailureReason;
use crate::retention;
use crate::types::*;

impl Cx {
    /// The sequence number of the snapshot being taken, if any.
    pub(super) fn pending_seq(&self) -> Option<u64> {
        self.t
            .snapshots
            .last()
            .filter(|s| s.status == SnapshotStatus::Pending)
            .map(|s| s.seq)
    }

    /// The snapshot holding the task's files while it has no sandbox.
    pub(super) fn kept_snapshot_id(&self) -> Option<SnapshotId> {
        if self.t.settings.persistent {
            self.t.restore_point().and_then(|s| s.id.clone())
        } else {
            None
        }
    }

    /// running ---- suspend | idle | checkpoint ----> snapshotting
    pub(super) fn begin_snapshot(&mut self, reason: SnapshotReason) {
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
            kind: self.t.settings.record_kinds.then(|| reason.kind()),
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
    pub(super) fn adopt_platform_snapshot(&mut self, found: PlatformSnapshot) {
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
            kind: None,
        });
    }

    /// Answers the caller a snapshot was taken for (a suspend, or a fork waiting at the front of
    /// the queue) with `reason`; whether there was one.
    pub(super) fn fail_snapshot_requester(&mut self, reason: FailureReason, attempts: u32) -> bool {
        let request_id = match self.t.snapshot_reason {
            Some(SnapshotReason::Suspend { request_id }) => request_id,
            Some(
                SnapshotReason::Fork { request_id } | SnapshotReason::Rewind { request_id, .. },
            ) => {
                let before = self.t.queue.len();
                self.t.queue.retain(|r| r.id() != request_id);
                if self.t.queue.len() == before {
                    return false; // answered already (a restart failed the queue)
                }
                request_id
            }
            Some(SnapshotReason::Checkpointing {
                request_id: Some(request_id),
                ..
            }) => request_id,
            Some(
                SnapshotReason::IdleReap
                | SnapshotReason::BusyCap
                | SnapshotReason::Checkpoint
                | SnapshotReason::LateCheckpoint { .. }
                | SnapshotReason::Checkpointing {
                    request_id: None, ..
                },
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

    /// restoring ---- snapshot gone ----> restoring (next retained) | provisioning (none left)
    pub(super) fn snapshot_gone(&mut self, failure: &Failure) {
        let gone = self.t.restore_source.take();
        if let Some(gone_id) = gone.as_deref() {
            for s in &mut self.t.snapshots {
                if s.id.as_deref() == Some(gone_id) {
                    s.status = SnapshotStatus::Gone;
                }
            }
        }
        if self.t.rewound_to.is_some() && self.t.rewound_to == gone {
            self.t.rewound_to = None;
        }
        let gone_id = gone.as_deref().unwrap_or_default();
        self.t.recent_creates.push(self.now);
        self.t.generation += 1;
        self.t.attempts = 1;
        self.t.retry_at = None;
        let next = if self.t.settings.persistent {
            self.t.restore_point().and_then(|s| s.id.clone())
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

    /// Keeps the newest `keep_snapshots` complete snapshots (and `keep_checkpoints`
    /// checkpoints apart, when set) and every one still needed; the rest are deleted
    /// ([`retention::to_retire_kept`]).
    pub(super) fn prune_snapshots(&mut self) {
        let needed = self.needed_snapshots();
        for i in retention::to_retire_kept(&self.t.snapshots, &self.t.settings, &needed) {
            self.t.snapshots[i].status = SnapshotStatus::Deleting;
        }
        self.emit_pending_deletes();
    }

    pub(super) fn emit_pending_deletes(&mut self) {
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

    pub(super) fn mark_deleted(&mut self, snapshot_id: &SnapshotId, status: SnapshotStatus) {
        for s in &mut self.t.snapshots {
            if s.id.as_ref() == Some(snapshot_id) && s.status == SnapshotStatus::Deleting {
                s.status = status;
            }
        }
    }
}
