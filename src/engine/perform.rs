//! Performing the commands of a committed transition.
//!
//! Two halves, kept apart on purpose. [`EventLoop::perform`] dispatches each [`Command`] to a
//! `perform_*` method that does the plumbing: it gathers what the call needs from the loop's
//! state, spawns the call (creations behind the `max_concurrent_creates` semaphore), and routes
//! the outcome back to the loop as a message; timers and replies never reach the provider. The
//! free functions at the end are the mapping itself, one per provider operation: the call made
//! for the command, and its outcome as the [`Event`] the core expects back. They know nothing of
//! the loop, so they can be lifted out and shared with re-drive.

use std::time::Duration;

use super::event_loop::{Answer, EventLoop, Msg};
use crate::core::{Command, Event, Millis, Reply, RequestId, TimerKind};
use crate::provider::{sandbox_name, ExecOutput, ExecRequest, SandboxProvider, SandboxSpec};

impl EventLoop {
    /// Performs one command of a transition that is durable.
    pub(super) fn perform(&mut self, id: &str, cmd: Command, now: Millis) {
        match cmd {
            Command::CreateSandbox {
                generation,
                source_snapshot,
                timeout_ms,
            } => self.perform_create(id, generation, source_snapshot, timeout_ms),
            Command::RunCommand {
                request_id,
                sandbox_id,
                command,
                timeout_ms,
            } => self.perform_run(id, request_id, sandbox_id, command, timeout_ms),
            Command::TakeSnapshot { sandbox_id, seq } => self.perform_snapshot(id, sandbox_id, seq),
            Command::StopSandbox { sandbox_id } => self.perform_stop(id, sandbox_id),
            Command::ExtendTimeout {
                sandbox_id,
                duration_ms,
            } => self.perform_extend(id, sandbox_id, duration_ms),
            Command::DeleteSnapshot { snapshot_id } => {
                self.perform_delete_snapshot(id, snapshot_id)
            }
            Command::ProbeSandbox { sandbox_id } => self.perform_probe(id, sandbox_id),
            Command::ScheduleTimer { timer, at } => self.schedule_timer(id, timer, at, now),
            Command::Reply { request_id, reply } => self.reply(id, request_id, reply),
        }
    }

    fn perform_create(
        &mut self,
        id: &str,
        generation: u64,
        source_snapshot: Option<String>,
        timeout_ms: u64,
    ) {
        let p = self.provider.clone();
        let spec = SandboxSpec {
            task_id: id.to_string(),
            generation,
            name: sandbox_name(&self.installation_id, id, generation),
            source_snapshot,
            timeout_ms,
            installation_id: self.installation_id.clone(),
        };
        let creates = self.creates.clone();
        self.spawn_op(id, async move {
            // Bounded creation concurrency keeps a burst of tasks under the provider's
            // rate limits.
            let _permit = creates.acquire_owned().await;
            (create(&*p, &spec).await, None)
        });
    }

    fn perform_run(
        &mut self,
        id: &str,
        request_id: RequestId,
        sandbox_id: String,
        command: String,
        timeout_ms: u64,
    ) {
        let p = self.provider.clone();
        self.spawn_op(id, async move {
            let req = ExecRequest {
                command,
                timeout_ms,
            };
            exec(&*p, request_id, &sandbox_id, &req).await
        });
    }

    fn perform_snapshot(&mut self, id: &str, sandbox_id: String, seq: u64) {
        let p = self.provider.clone();
        let task = id.to_string();
        self.spawn_op(id, async move {
            (snapshot(&*p, &task, sandbox_id, seq).await, None)
        });
    }

    fn perform_stop(&mut self, id: &str, sandbox_id: String) {
        let p = self.provider.clone();
        self.spawn_op(id, async move { (stop(&*p, sandbox_id).await, None) });
    }

    fn perform_extend(&mut self, id: &str, sandbox_id: String, duration_ms: u64) {
        let p = self.provider.clone();
        self.spawn_op(id, async move {
            (extend(&*p, sandbox_id, duration_ms).await, None)
        });
    }

    fn perform_delete_snapshot(&mut self, id: &str, snapshot_id: String) {
        let p = self.provider.clone();
        self.spawn_op(id, async move {
            (delete_snapshot(&*p, snapshot_id).await, None)
        });
    }

    fn perform_probe(&mut self, id: &str, sandbox_id: String) {
        let p = self.provider.clone();
        self.spawn_op(id, async move { (probe(&*p, sandbox_id).await, None) });
    }

    fn schedule_timer(&mut self, id: &str, timer: TimerKind, at: Millis, now: Millis) {
        let mut delay = at.saturating_sub(now);
        if timer == TimerKind::Retry {
            delay = self.jitter.apply(delay);
        }
        let key = (id.to_string(), timer);
        if let Some(old) = self.timers.remove(&key) {
            old.abort();
        }
        let tx = self.tx.clone();
        let task = id.to_string();
        let handle = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let _ = tx.send(Msg::Timer { task, timer });
        });
        self.timers.insert(key, handle);
    }

    /// Answers the caller waiting for `request_id`, with the command's output if it ran.
    fn reply(&mut self, id: &str, request_id: RequestId, reply: Reply) {
        let key = (id.to_string(), request_id);
        let output = self.outputs.remove(&key);
        if let Some(w) = self.waiters.remove(&key) {
            let _ = w.send(Ok(Answer { reply, output }));
        }
    }

    /// Runs one provider call in its own future, which only sends its outcome back to the loop.
    fn spawn_op<F>(&mut self, task: &str, fut: F)
    where
        F: std::future::Future<Output = (Event, Option<ExecOutput>)> + Send + 'static,
    {
        self.inflight += 1;
        let tx = self.tx.clone();
        let task = task.to_string();
        tokio::spawn(async move {
            let (event, output) = fut.await;
            let _ = tx.send(Msg::Outcome {
                task,
                event,
                output,
            });
        });
    }
}

/// [`Command::CreateSandbox`]: `SandboxReady` or `CreateFailed`.
async fn create(p: &dyn SandboxProvider, spec: &SandboxSpec) -> Event {
    let generation = spec.generation;
    match p.create_sandbox(spec).await {
        Ok(info) => Event::SandboxReady {
            generation,
            sandbox_id: info.id,
            name: info.name,
            deadline: info.deadline,
        },
        Err(e) => Event::CreateFailed {
            generation,
            failure: e.to_failure(),
        },
    }
}

/// [`Command::RunCommand`]: `CommandExited` with the captured output, or `CommandFailed`.
async fn exec(
    p: &dyn SandboxProvider,
    request_id: RequestId,
    sandbox_id: &str,
    req: &ExecRequest,
) -> (Event, Option<ExecOutput>) {
    match p.exec(sandbox_id, req).await {
        Ok(out) => (
            Event::CommandExited {
                request_id,
                exit_code: out.exit_code,
                timed_out: out.timed_out,
            },
            Some(out),
        ),
        Err(e) => (
            Event::CommandFailed {
                request_id,
                failure: e.to_failure(),
            },
            None,
        ),
    }
}

/// [`Command::TakeSnapshot`]: `SnapshotTaken` or `SnapshotFailed`.
async fn snapshot(p: &dyn SandboxProvider, task: &str, sandbox_id: String, seq: u64) -> Event {
    match p.snapshot(task, &sandbox_id, seq).await {
        Ok(info) => Event::SnapshotTaken {
            seq,
            snapshot_id: info.id,
            size_bytes: info.size_bytes,
            expires_at: info.expires_at,
        },
        Err(e) => Event::SnapshotFailed {
            seq,
            failure: e.to_failure(),
        },
    }
}

/// [`Command::StopSandbox`]: `SandboxStopped` or `StopFailed`.
async fn stop(p: &dyn SandboxProvider, sandbox_id: String) -> Event {
    match p.stop_sandbox(&sandbox_id).await {
        Ok(()) => Event::SandboxStopped { sandbox_id },
        Err(e) => Event::StopFailed {
            sandbox_id,
            failure: e.to_failure(),
        },
    }
}

/// [`Command::ExtendTimeout`]: `TimeoutExtended` or `ExtendFailed`.
async fn extend(p: &dyn SandboxProvider, sandbox_id: String, duration_ms: u64) -> Event {
    match p.extend_timeout(&sandbox_id, duration_ms).await {
        Ok(deadline) => Event::TimeoutExtended {
            sandbox_id,
            deadline,
        },
        Err(e) => Event::ExtendFailed {
            sandbox_id,
            failure: e.to_failure(),
        },
    }
}

/// [`Command::DeleteSnapshot`]: `SnapshotDeleted` or `DeleteFailed`.
async fn delete_snapshot(p: &dyn SandboxProvider, snapshot_id: String) -> Event {
    match p.delete_snapshot(&snapshot_id).await {
        Ok(()) => Event::SnapshotDeleted { snapshot_id },
        Err(e) => Event::DeleteFailed {
            snapshot_id,
            failure: e.to_failure(),
        },
    }
}

/// [`Command::ProbeSandbox`]: `SandboxProbed` or `ProbeFailed` (the core decides on retries).
async fn probe(p: &dyn SandboxProvider, sandbox_id: String) -> Event {
    match p.probe_sandbox(&sandbox_id).await {
        Ok(alive) => Event::SandboxProbed { sandbox_id, alive },
        Err(e) => Event::ProbeFailed {
            sandbox_id,
            failure: e.to_failure(),
        },
    }
}
