//! Forks: which snapshot a fork starts from, and answering the fork request.

use super::Cx;
use crate::ids::TaskId;
use crate::reason::FailureReason;
use crate::types::*;

impl Cx {
    /// The snapshot a fork starts from, or why there is none. Only a complete snapshot that has
    /// not expired qualifies (a restore needs it to exist).
    pub(super) fn fork_source(&self, from: &ForkFrom) -> Result<SnapshotRecord, FailureReason> {
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
    pub(super) fn retained_names(&self) -> Vec<String> {
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
    pub(super) fn answer_fork(&mut self, id: RequestId, child: TaskId, from: &ForkFrom) {
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
}
