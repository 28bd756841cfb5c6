//! Performing the commands of a committed transition.
//!
//! [`EventLoop::perform`] hands each provider command to [`Call`] — the one map from a
//! [`Command`] to a provider call and from its answer back to an [`Event`], shared with
//! re-drive — and does the plumbing around it: the call runs in a spawned future (creations
//! behind the `max_concurrent_creates` semaphore) that only sends its outcome back to the loop
//! as a message. Timers and replies never reach the provider; the loop performs them itself.

use std::time::Duration;

use super::event_loop::{Answer, Armed, EventLoop, Msg};
use crate::clock::Stopwatch;
use crate::core::retention::{self, Disposal};
use crate::core::{Command, Event, Failure, Millis, Reply, RequestId, TimerKind};
use crate::ids::{SnapshotId, TaskId};
use crate::provider::{Call, ExecIo};

impl EventLoop {
    /// Performs one command of a transition that is durable.
    pub(super) fn perform(&mut self, id: &TaskId, cmd: Command, now: Millis) {
        match cmd {
            Command::ScheduleTimer { timer, at } => self.schedule_timer(id, timer, at, now),
            Command::Reply { request_id, reply } => self.reply(id, request_id, reply),
            Command::DeleteSnapshot { ref snapshot_id } if self.released(id, snapshot_id) => {}
            // The rest call the provider: `Call::from_command` names every command (no
            // wildcard there), as does `batch::calls_provider`.
            _ => {
                let mut call = Call::from_command(&self.installation_id, id, &cmd)
                    .expect("every provider command maps to a call");
                // The journal holds the command redacted; the sandbox runs it as typed.
                if let Call::Exec {
                    request_id,
                    request,
                    ..
                } = &mut call
                {
                    if let Some(typed) = self.typed_commands.get(&(id.clone(), *request_id)) {
                        request.command = typed.clone();
                    }
                }
                let io = match &cmd {
                    Command::RunCommand { request_id, .. } => self.live_io(id, *request_id),
                    _ => ExecIo::default(),
                };
                self.spawn_call(id, call, io);
            }
        }
    }

    /// Whether `task`'s delete of `snapshot_id` is a release instead: another task retains the
    /// same provider snapshot (a fork shares its parent's), so it stays, and the task learns so
    /// as the call's outcome ([`Event::SnapshotReleased`]). A snapshot is deleted only when no
    /// task retains it. When the store cannot say, the delete is answered as failed (the
    /// record stays `deleting` and is retried), never performed blind.
    fn released(&mut self, task: &TaskId, snapshot_id: &SnapshotId) -> bool {
        let event = match self.snapshot_holders(snapshot_id, task.as_str()) {
            Ok(holders) => match retention::disposal(holders) {
                Disposal::Delete => return false,
                Disposal::Release { held_by } => Event::SnapshotReleased {
                    snapshot_id: snapshot_id.clone(),
                    held_by: TaskId::new(&held_by).expect("stored task ids are valid"),
                },
            },
            Err(e) => Event::DeleteFailed {
                snapshot_id: snapshot_id.clone(),
                failure: Failure::transient(
                    format!("cannot tell whether another task retains the snapshot: {e}"),
                    None,
                ),
            },
        };
        self.call_started(task);
        let _ = self.tx.send(Msg::Outcome {
            task: task.clone(),
            event,
            output: None,
        });
        true
    }

    fn schedule_timer(&mut self, id: &TaskId, timer: TimerKind, at: Millis, now: Millis) {
        let mut delay = at.saturating_sub(now);
        if timer == TimerKind::Retry {
            crate::engine::metrics::global().retry_scheduled();
            delay = self.jitter.apply(delay);
        }
        let key = (id.clone(), timer);
        if let Some(old) = self.timers.remove(&key) {
            old.handle.abort();
        }
        let tx = self.tx.clone();
        let task = id.clone();
        let token = self.next_timer;
        self.next_timer += 1;
        let handle = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let _ = tx.send(Msg::Timer { task, timer, token });
        });
        self.timers.insert(key, Armed { handle, at, token });
    }

    /// The live side of an attempt to run `request_id`'s command: its caller's output, cancel
    /// and variables, and its stdin if no earlier attempt took it.
    fn live_io(&mut self, id: &TaskId, request_id: RequestId) -> ExecIo {
        match self.live.get_mut(&(id.clone(), request_id)) {
            Some(live) => ExecIo {
                output: live.output.clone(),
                stdin: live.stdin.take(),
                cancel: live.cancel.clone(),
                env: live.env.clone(),
            },
            None => ExecIo::default(),
        }
    }

    /// Answers the caller waiting for `request_id`, with the command's output if it ran.
    fn reply(&mut self, id: &TaskId, request_id: RequestId, reply: Reply) {
        let key = (id.clone(), request_id);
        self.live.remove(&key);
        let output = self.outputs.remove(&key);
        self.typed_commands.remove(&key);
        // A fork's source is named: the child is made now, before anything else can retire
        // that snapshot.
        let made = match &reply {
            Reply::Forked { child, snapshot } => self.create_fork(id, child, snapshot.clone()),
            _ => Ok(()),
        };
        if let Some(w) = self.waiters.remove(&key) {
            let _ = w.send(made.map(|()| Answer { reply, output }));
        } else if let Err(e) = made {
            tracing::warn!(task = %id, error = %e, "could not create a fork");
        }
    }

    /// The recorded size of the snapshot a `create_sandbox` restores (for `/metrics`), `None`
    /// for any other call and for a fresh sandbox.
    fn restored_bytes(&self, task: &TaskId, call: &Call) -> Option<u64> {
        let Call::CreateSandbox { spec } = call else {
            return None;
        };
        let source = spec.source_snapshot.as_ref()?;
        let size = self.tasks.get(task).and_then(|t| {
            t.snapshots
                .iter()
                .find(|s| s.id.as_ref() == Some(source))
                .map(|s| s.size_bytes)
        });
        Some(size.unwrap_or(0))
    }

    /// Runs one provider call in its own future, which only sends its outcome back to the loop.
    fn spawn_call(&mut self, task: &TaskId, call: Call, io: ExecIo) {
        self.call_started(task);
        let p = self.provider.clone();
        // Bounded creation concurrency keeps a burst of tasks under the provider's rate limits.
        let creates = matches!(call, Call::CreateSandbox { .. }).then(|| self.creates.clone());
        let restored_bytes = self.restored_bytes(task, &call);
        let tx = self.tx.clone();
        let task = task.clone();
        tokio::spawn(async move {
            let (event, output) = {
                let _permit = match creates {
                    Some(creates) => Some(creates.acquire_owned().await),
                    None => None,
                };
                // Counted from after the permit: the call's own time, not its wait.
                let watch = Stopwatch::start();
                let (event, output) = call.perform_live(&*p, io).await;
                let secs = watch.elapsed_secs();
                crate::engine::metrics::global().call_done(
                    call.name(),
                    &event,
                    secs,
                    restored_bytes,
                );
                (event, output)
            };
            let _ = tx.send(Msg::Outcome {
                task,
                event,
                output,
            });
        });
    }
}
