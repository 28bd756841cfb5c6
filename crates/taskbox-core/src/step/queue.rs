//! The request queue: accepting a request id, answering, and serving queued requests as far
//! as the state allows ([`Cx::pump`]); failing every queued request at once.

use std::mem;

use super::Cx;
use super::StepError;
use crate::reason::FailureReason;
use crate::types::*;

impl Cx {
    pub(super) fn accept_request(&mut self, request_id: RequestId) -> Result<(), StepError> {
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

    pub(super) fn reply(&mut self, request_id: RequestId, reply: Reply) {
        self.cmds.push(Command::Reply { request_id, reply });
    }

    pub(super) fn is_running(&self, request_id: RequestId) -> bool {
        self.t.running.as_ref().map(|r| r.request_id) == Some(request_id)
    }

    /// Serves queued requests as far as the current state allows.
    pub(super) fn pump(&mut self) {
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
                    // No live sandbox: nothing to checkpoint; the latest snapshot (if any) holds
                    // the files, and the answer says which.
                    Some(Request::Checkpoint { id }) => {
                        let id = *id;
                        self.t.queue.pop_front();
                        let latest = self.kept_snapshot_id().and_then(|sid| {
                            self.t
                                .snapshots
                                .iter()
                                .find(|s| s.id.as_ref() == Some(&sid))
                                .map(|s| (sid.clone(), s.seq))
                        });
                        let (snapshot_id, seq) = latest.unzip();
                        self.reply(
                            id,
                            Reply::Checkpointed {
                                snapshot_id,
                                seq,
                                outcome: CheckpointOutcome::NoSandbox,
                            },
                        );
                    }
                    // The latest snapshot holds the current files: restore the one named.
                    Some(Request::Rewind { .. }) => {
                        self.start_rewind();
                        return;
                    }
                    Some(Request::Run { .. } | Request::Resume { .. }) => {
                        self.begin_sandbox();
                        return;
                    }
                },
                TaskState::Running => {
                    // One command at a time, and none before the recovery probe or an activity
                    // sample has answered.
                    if self.t.running.is_some() || self.t.probing || self.sampling() {
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
                    // A rewind keeps the current files first, waiting at the front of the queue
                    // until they are kept (`finish_live_checkpoint`, or — the platform's
                    // snapshot stopping the sandbox — the `expired` arm above).
                    if let Some(Request::Rewind { id, .. }) = self.t.queue.front() {
                        let request_id = *id;
                        if self.t.settings.persistent {
                            let live = self.t.settings.live_checkpoint;
                            self.begin_checkpoint(SnapshotReason::Rewind { request_id, live });
                            return;
                        }
                        self.t.queue.pop_front();
                        self.reply(
                            request_id,
                            Reply::Failed {
                                reason: FailureReason::NotPersistent,
                                attempts: 1,
                                notices: Vec::new(),
                            },
                        );
                        continue;
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
                        // running ---- checkpoint ----> snapshotting (live where it can be)
                        Request::Checkpoint { id } => {
                            if self.t.settings.persistent {
                                let reason = self.checkpoint_reason(Some(id));
                                self.begin_checkpoint(reason);
                                return;
                            }
                            self.reply(
                                id,
                                Reply::Failed {
                                    reason: FailureReason::NotPersistent,
                                    attempts: 1,
                                    notices: Vec::new(),
                                },
                            );
                        }
                        // Handled above, before the pop.
                        Request::Rewind { .. } => {}
                    }
                }
                TaskState::Provisioning | TaskState::Snapshotting | TaskState::Restoring => return,
            }
        }
    }

    pub(super) fn fail_queue(&mut self, reason: &FailureReason, attempts: u32) {
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
                Request::Fork { id, .. }
                | Request::Checkpoint { id }
                | Request::Rewind { id, .. } => self.reply(
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
}
