//! [`EventLoop`]: the one tokio task that owns every loaded task and the store, and the
//! messages ([`Msg`]) that reach it. For each message it steps the pure core, stages the
//! transition, commits the staged batch in one transaction (group commit), and only then hands
//! the commands to [`perform`](super::perform).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{broadcast, mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, info_span, warn};

use super::batch::{batch_sync, Staged};
use super::{EngineError, StateChange};
use crate::clock::{Clock, Stopwatch};
use crate::core::{
    step, Event, FailureReason, ForkFrom, Millis, Reply, RequestId, Task, TaskSettings, TimerKind,
};
use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::provider::{ExecIo, ExecOutput, SandboxProvider};
use crate::retry::Jitter;
use crate::store::{Store, TransitionRecord};

/// A caller's request, as the API sends it to the loop.
pub(super) enum ApiRequest {
    Run {
        command: String,
        timeout_ms: u64,
        /// The command's live side (output, stdin, cancel); never journaled.
        io: ExecIo,
    },
    Suspend,
    Resume,
    /// Fork the task into the new task `child`.
    Fork {
        child: TaskId,
        from: ForkFrom,
    },
    /// Checkpoint the task's live sandbox.
    Checkpoint,
    /// Rewind the task to one of its snapshots.
    Rewind {
        to: crate::core::RewindTo,
    },
}

/// The loop's answer to a request: the core's reply, and a command's captured output.
pub(super) struct Answer {
    pub(super) reply: Reply,
    pub(super) output: Option<ExecOutput>,
}

/// A read of the loop's state, run on the loop between batches.
pub(super) type QueryFn = Box<dyn FnOnce(&EventLoop) + Send>;

/// Where a request's answer goes.
type Responder = oneshot::Sender<Result<Answer, EngineError>>;

/// A timer armed for a task: the sleep that will send [`Msg::Timer`], when the core asked for
/// it, and which arming it is.
pub(super) struct Armed {
    pub(super) handle: JoinHandle<()>,
    /// The core's time for it (`Command::ScheduleTimer::at`; a retry's sleep may be longer by
    /// the jitter).
    pub(super) at: Millis,
    pub(super) token: u64,
}

/// Everything that reaches the loop: requests, provider outcomes, timers, queries, shutdown.
pub(super) enum Msg {
    Request {
        task: TaskId,
        req: ApiRequest,
        respond: oneshot::Sender<Result<Answer, EngineError>>,
    },
    Outcome {
        task: TaskId,
        event: Event,
        output: Option<ExecOutput>,
    },
    Timer {
        task: TaskId,
        timer: TimerKind,
        /// Which arming of the timer fired ([`Armed::token`]): a timer replaced since, or
        /// applied already because another event of its task came after its time, is stale.
        token: u64,
    },
    Query(QueryFn),
    /// A fleet: the renewal found the task's lease taken over by `owner`; stop driving it.
    /// Sent only by the PostgreSQL lease renewal (`lease.rs`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    LeaseLost {
        task: TaskId,
        owner: Option<String>,
    },
    /// Load a task now (recovering it), so its timers run without waiting for a request.
    Load {
        task: TaskId,
        done: oneshot::Sender<Result<(), EngineError>>,
    },
    Shutdown {
        done: oneshot::Sender<()>,
    },
    /// New settings for the tasks from now on (`reconfigure.rs`).
    Reconfigure {
        settings: TaskSettings,
        done: oneshot::Sender<()>,
    },
    /// `taskbox rm`: mark the task removed and unload it; the answer says what to stop and
    /// delete (the API performs those calls).
    Remove {
        task: TaskId,
        keep_snapshots: bool,
        respond: oneshot::Sender<Result<RemovalPlan, EngineError>>,
    },
    /// `taskbox rm`: the outcome of the removed task's stop (its session's usage with it), to
    /// journal in the task's record: a removed task is unloaded, so it is stepped and
    /// committed here, alone.
    RemovedOutcome {
        task: TaskId,
        event: Event,
        respond: oneshot::Sender<Result<(), EngineError>>,
    },
}

/// What removing a task leaves the API to do on the provider, once the removal is durable.
pub(super) struct RemovalPlan {
    /// The live sandbox to stop.
    pub(super) sandbox: Option<SandboxId>,
    /// The snapshots to delete.
    pub(super) delete: Vec<SnapshotId>,
    /// The snapshots kept (`--keep-snapshots`).
    pub(super) kept: Vec<SnapshotId>,
}

/// The one owner of every loaded task and the store; see the [module docs](self).
pub(super) struct EventLoop {
    pub(super) store: Store,
    pub(super) provider: Arc<dyn SandboxProvider>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) jitter: Jitter,
    pub(super) settings: TaskSettings,
    pub(super) installation_id: String,
    pub(super) tasks: HashMap<TaskId, Task>,
    /// Callers waiting for an answer. Ordered, so that when the loop stops they are woken in a
    /// deterministic order (simulations reproduce bit for bit).
    pub(super) waiters: std::collections::BTreeMap<(TaskId, u64), Responder>,
    pub(super) outputs: HashMap<(TaskId, u64), ExecOutput>,
    /// The live side of each run request until it is answered (kept out of the journal).
    pub(super) live: HashMap<(TaskId, u64), ExecIo>,
    /// Commands as typed, by request, where they differ from the journaled (redacted) ones.
    pub(super) typed_commands: HashMap<(TaskId, u64), String>,
    pub(super) timers: HashMap<(TaskId, TimerKind), Armed>,
    /// The token of the next timer armed.
    pub(super) next_timer: u64,
    pub(super) inflight: usize,
    pub(super) creates: Arc<Semaphore>,
    pub(super) tx: mpsc::UnboundedSender<Msg>,
    pub(super) changes: broadcast::Sender<StateChange>,
    pub(super) shutdown: Option<oneshot::Sender<()>>,
    /// Transitions stepped but not yet committed; see [`EventLoop::flush`].
    pub(super) staged: Vec<Staged>,
    /// A fleet's leases (PostgreSQL store); `None` under the `flock`s of the SQLite store.
    pub(super) fence: Option<Arc<dyn super::fence::Fence>>,
    /// The `flock`s of the SQLite store, told when a task is loaded and unloaded; `None` on a
    /// fleet's leases.
    pub(super) locks: Option<Arc<super::lock::TaskLocks>>,
    /// Tasks committed since the last [`EventLoop::unload_settled`], to unload if nothing of
    /// them is live.
    pub(super) settled: Vec<TaskId>,
    /// Provider calls in flight, by task (their sum is `inflight`).
    pub(super) inflight_by_task: HashMap<TaskId, usize>,
}

/// Most messages handled before their transitions are committed together.
const MAX_BATCH_MESSAGES: usize = 512;

impl EventLoop {
    /// Group commit: every message already waiting is handled (stepped, the tasks updated in
    /// memory) before their transitions are committed in one transaction — one disk sync for
    /// the lot — and only then are their commands performed. With one task the batch is one
    /// transition and nothing changes; with thousands, the journal keeps up.
    pub(super) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        while let Some(msg) = rx.recv().await {
            self.handle(msg);
            for _ in 1..MAX_BATCH_MESSAGES {
                match rx.try_recv() {
                    Ok(msg) => self.handle(msg),
                    Err(_) => break,
                }
            }
            self.flush();
            self.unload_settled();
            if self.shutdown.is_some() && self.inflight == 0 {
                if let Some(done) = self.shutdown.take() {
                    let _ = done.send(());
                }
                break;
            }
        }
        self.cancel_timers(None);
    }

    fn handle(&mut self, msg: Msg) {
        {
            match msg {
                Msg::Request { task, req, respond } => {
                    if self.shutdown.is_some() {
                        let _ = respond.send(Err(EngineError::Stopped));
                        return;
                    }
                    self.fire_due_timers(&task);
                    self.on_request(task, req, respond);
                }
                Msg::Outcome {
                    task,
                    event,
                    output,
                } => {
                    self.call_answered(&task);
                    self.fire_due_timers(&task);
                    if let (Some(out), Event::CommandExited { request_id, .. }) = (output, &event) {
                        self.outputs.insert((task.clone(), *request_id), out);
                    }
                    if let Err(e) = self.apply(&task, event) {
                        warn!(task = %task, error = %e, "could not apply a provider outcome");
                    }
                }
                Msg::Timer { task, timer, token } => {
                    let key = (task.clone(), timer);
                    if self.timers.get(&key).map(|a| a.token) != Some(token) {
                        return; // replaced since, or applied already (`fire_due_timers`)
                    }
                    // Timers of the task whose time came earlier go first (this one among
                    // them, in its place), even when their sleeps wake later: a retry's is
                    // longer by the jitter, which a re-drive does not apply.
                    self.fire_due_timers(&task);
                    if self.timers.remove(&key).is_some() && self.shutdown.is_none() {
                        if let Err(e) = self.apply(&task, Event::TimerFired { timer }) {
                            warn!(task = %task, error = %e, "could not apply a timer");
                        }
                    }
                }
                Msg::Query(f) => {
                    // A query sees committed state only.
                    self.flush();
                    f(self)
                }
                Msg::LeaseLost { task, owner } => self.lease_lost(task, owner),
                Msg::Load { task, done } => {
                    let _ = done.send(self.ensure_loaded(&task, false));
                }
                Msg::Remove {
                    task,
                    keep_snapshots,
                    respond,
                } => {
                    // Decided on committed state.
                    self.flush();
                    let _ = respond.send(self.remove(&task, keep_snapshots));
                }
                Msg::RemovedOutcome {
                    task,
                    event,
                    respond,
                } => {
                    self.flush();
                    let _ = respond.send(self.journal_removed(&task, event));
                }
                Msg::Shutdown { done } => {
                    self.cancel_timers(None);
                    self.shutdown = Some(done);
                }
                Msg::Reconfigure { settings, done } => {
                    self.reconfigure(settings);
                    let _ = done.send(());
                }
            }
        }
    }

    /// Applies `task`'s timers whose time has come (by the engine's clock, at the core's time
    /// for them), oldest first, before another event of the task: a timer is applied no later
    /// than the first event at or after its time. Their sleeps may still be pending — a loop
    /// busy, a machine loaded, a retry's jitter — and a request, an outcome or another timer
    /// arriving then must not overtake them, or the journal's order would depend on how late
    /// a sleep woke, which a re-drive on virtual time (timers exactly on time, no jitter)
    /// cannot reproduce.
    fn fire_due_timers(&mut self, task: &TaskId) {
        if self.shutdown.is_some() {
            return;
        }
        let now = self.clock.now_ms();
        let mut due: Vec<(Millis, u64, TimerKind)> = self
            .timers
            .iter()
            .filter(|((t, _), armed)| t == task && armed.at <= now)
            .map(|((_, kind), armed)| (armed.at, armed.token, *kind))
            .collect();
        // Oldest first; timers of one time in the order they were armed (tokens grow).
        due.sort_unstable_by_key(|(at, token, _)| (*at, *token));
        for (_, _, timer) in due {
            if let Some(armed) = self.timers.remove(&(task.clone(), timer)) {
                armed.handle.abort();
            }
            if let Err(e) = self.apply(task, Event::TimerFired { timer }) {
                warn!(task = %task, error = %e, "could not apply a timer");
            }
        }
    }

    fn on_request(
        &mut self,
        task: TaskId,
        req: ApiRequest,
        respond: oneshot::Sender<Result<Answer, EngineError>>,
    ) {
        // Only `run` creates a task: a typo in `suspend`/`resume` must not make one.
        let create = matches!(req, ApiRequest::Run { .. });
        if let Err(e) = self.ensure_loaded(&task, create) {
            let _ = respond.send(Err(e));
            return;
        }
        if let ApiRequest::Fork { child, .. } = &req {
            if let Err(e) = self.check_new_task(child) {
                let _ = respond.send(Err(e));
                return;
            }
        }
        let request_id = self.tasks[&task].last_request_id + 1;
        let event = match req {
            ApiRequest::Run {
                command,
                timeout_ms,
                io,
            } => {
                self.live.insert((task.clone(), request_id), io);
                // The journal (and so the task record, `show`, error messages) gets the command
                // with its secrets redacted; the sandbox runs it as typed. A journaled command
                // is never run again (recovery fails the requests it finds), so the one typed
                // lives here, in memory, until the request is answered.
                let journaled = crate::redact::redact(&command);
                if journaled != command {
                    self.typed_commands
                        .insert((task.clone(), request_id), command);
                }
                Event::RunRequested {
                    request_id,
                    command: journaled,
                    timeout_ms,
                }
            }
            ApiRequest::Suspend => Event::SuspendRequested { request_id },
            ApiRequest::Resume => Event::ResumeRequested { request_id },
            ApiRequest::Fork { child, from } => Event::ForkRequested {
                request_id,
                child,
                from,
            },
            ApiRequest::Checkpoint => Event::CheckpointRequested { request_id },
            ApiRequest::Rewind { to } => Event::RewindRequested { request_id, to },
        };
        self.waiters.insert((task.clone(), request_id), respond);
        if let Err(e) = self.apply(&task, event) {
            self.live.remove(&(task.clone(), request_id));
            self.typed_commands.remove(&(task.clone(), request_id));
            if let Some(w) = self.waiters.remove(&(task, request_id)) {
                let _ = w.send(Err(e));
            }
        }
    }

    /// Loads a task into memory the first time this process touches it: creates it (only when
    /// `create`: only `run` makes a task; anything else on an unknown name is
    /// [`EngineError::NoTask`] with the closest existing name), or brings its settings up to
    /// date and applies [`Event::Loaded`], for the core to recover whatever a previous process
    /// left in flight (and to hold requests while it probes the sandbox).
    fn ensure_loaded(&mut self, id: &TaskId, create: bool) -> Result<(), EngineError> {
        if self.tasks.contains_key(id) {
            return Ok(());
        }
        self.check_marks(id)?;
        match self.store.load_task(id)? {
            None if !create => {
                let names = self.store.task_ids()?;
                return Err(EngineError::NoTask {
                    task: id.clone(),
                    suggestion: super::closest(id, names.iter().map(TaskId::as_str)),
                });
            }
            None => {
                let now = self.clock.now_ms();
                let task = Task::new(id.clone(), self.settings.clone(), now);
                let event = Event::SettingsChanged {
                    settings: self.settings.clone(),
                };
                self.staged.push(Staged {
                    task: id.clone(),
                    at: now,
                    event,
                    state_before: task.state,
                    task_before: None,
                    task_after: task.clone(),
                    commands: Vec::new(),
                });
                self.tasks.insert(id.clone(), task);
                self.hold(id);
            }
            Some(task) => {
                let stale_settings = task.settings != self.settings;
                self.tasks.insert(id.clone(), task);
                self.hold(id);
                if stale_settings {
                    let settings = self.settings.clone();
                    self.apply(id, Event::SettingsChanged { settings })?;
                }
                self.apply(id, Event::Loaded)?;
            }
        }
        Ok(())
    }

    /// The tasks other than `except` that retain the provider snapshot `snapshot_id`: loaded
    /// tasks as they are in memory (ahead of the store by the transitions staged since the last
    /// commit), the others as the store has them.
    pub(super) fn snapshot_holders(
        &self,
        snapshot_id: &str,
        except: &str,
    ) -> Result<Vec<String>, EngineError> {
        let mut holders: Vec<String> = self
            .store
            .snapshot_holders(snapshot_id, except)?
            .into_iter()
            .filter(|t| !self.tasks.contains_key(t.as_str()))
            .collect();
        holders.extend(
            self.tasks
                .values()
                .filter(|t| t.id.as_str() != except && t.holds_snapshot(snapshot_id))
                .map(|t| t.id.to_string()),
        );
        holders.sort();
        Ok(holders)
    }

    /// Refuses a task `taskbox rm` removed, and one whose sandboxes and snapshots belong to
    /// another backend than this engine's (a task recorded before backends were recorded is
    /// claimed by this one).
    fn check_marks(&mut self, id: &TaskId) -> Result<(), EngineError> {
        let Some(marks) = self.store.task_marks(id)? else {
            return Ok(());
        };
        if let Some(at) = marks.removed_at {
            return Err(EngineError::Removed {
                task: id.clone(),
                removed_at: crate::clock::format_ms(at),
            });
        }
        let current = self.provider.name();
        let recorded = match marks.backend {
            Some(b) => b,
            None => self
                .store
                .claim_backend(id, current)?
                .unwrap_or_else(|| current.to_string()),
        };
        if recorded != current {
            return Err(EngineError::WrongBackend {
                task: id.clone(),
                task_backend: recorded,
                current: current.to_string(),
            });
        }
        Ok(())
    }

    /// Journals `event`, the outcome of a call `taskbox rm` made for the removed task `id`
    /// (its sandbox's stop), through `step` like any outcome, committed alone and synced: the
    /// task is no longer loaded, so nothing else is staged for it and no command follows.
    fn journal_removed(&mut self, id: &TaskId, event: Event) -> Result<(), EngineError> {
        let Some(task) = self.store.load_task(id)? else {
            return Ok(());
        };
        let now = self.clock.now_ms();
        let tr = step(&task, event.clone(), now)?;
        self.store.commit(&TransitionRecord {
            at: now,
            event: &event,
            state_before: task.state,
            task_after: &tr.next,
            commands: &tr.commands,
        })?;
        Ok(())
    }

    /// `taskbox rm`: refuses a task with an operation in flight; otherwise marks it removed in
    /// the store (durable before any provider call), unloads it and cancels its timers, and
    /// says what is left to stop and delete. The journal stays, for replay.
    fn remove(&mut self, id: &TaskId, keep_snapshots: bool) -> Result<RemovalPlan, EngineError> {
        if self.store.task_marks(id)?.is_none() {
            let names = self.store.task_ids()?;
            return Err(EngineError::NoTask {
                task: id.clone(),
                suggestion: super::closest(id, names.iter().map(TaskId::as_str)),
            });
        }
        self.check_marks(id)?;
        let task = match self.tasks.get(id) {
            Some(t) => t.clone(),
            None => match self.store.load_task(id)? {
                Some(t) => t,
                None => {
                    return Err(EngineError::NoTask {
                        task: id.clone(),
                        suggestion: None,
                    })
                }
            },
        };
        if task.state.is_transient() || task.running.is_some() || !task.queue.is_empty() {
            return Err(EngineError::InFlight {
                task: id.clone(),
                state: task.state.to_string(),
            });
        }
        let snapshots: Vec<SnapshotId> = task.retained_snapshot_ids().cloned().collect();
        let now = self.clock.now_ms();
        self.store.mark_removed(id, now, keep_snapshots)?;
        self.tasks.remove(id);
        if let Some(locks) = &self.locks {
            locks.unloaded(id);
        }
        self.cancel_timers(Some(id));
        let (delete, kept) = if keep_snapshots {
            (Vec::new(), snapshots)
        } else {
            // A snapshot a fork (or the task this one was forked from) retains stays: deleting
            // it is the last holder's to do. The removal is durable already, so this task no
            // longer counts as one.
            let mut delete = Vec::new();
            let mut kept = Vec::new();
            for snap in snapshots {
                if self.snapshot_holders(&snap, id)?.is_empty() {
                    delete.push(snap);
                } else {
                    kept.push(snap);
                }
            }
            (delete, kept)
        };
        Ok(RemovalPlan {
            sandbox: task.sandbox.map(|s| s.id),
            delete,
            kept,
        })
    }

    /// One event: step, and stage the transition for the next [`EventLoop::flush`], which
    /// commits it and then performs its commands.
    pub(super) fn apply(&mut self, id: &TaskId, event: Event) -> Result<(), EngineError> {
        let now = self.clock.now_ms();
        let Some(task) = self.tasks.get(id) else {
            debug!(task = %id, event = event.name(), "event for a task not loaded here; ignored");
            return Ok(());
        };
        let span = info_span!("event", task_id = %id, state = %task.state, event = event.name());
        let _guard = span.enter();
        let tr = step(task, event.clone(), now)?;
        let before = self.tasks.insert(id.clone(), tr.next.clone());
        self.staged.push(Staged {
            task: id.clone(),
            at: now,
            event,
            state_before: before.as_ref().map_or(tr.next.state, |t| t.state),
            task_before: before,
            task_after: tr.next,
            commands: tr.commands,
        });
        Ok(())
    }

    /// Commits every staged transition in one transaction, then performs their commands in
    /// order. If the batch cannot be committed, each transition is retried alone; one that
    /// still fails is dropped with the rest of its task's batch, the task goes back to its last
    /// committed state, and requests among the dropped events get the error.
    fn flush(&mut self) {
        if self.staged.is_empty() {
            return;
        }
        let staged = std::mem::take(&mut self.staged);
        let records: Vec<TransitionRecord<'_>> = staged.iter().map(Staged::record).collect();
        let sync = batch_sync(&staged);
        let watch = Stopwatch::start();
        let batch = self.store.commit_batch_with(&records, sync);
        crate::engine::metrics::global().commit_done(
            watch.elapsed_secs(),
            records.len(),
            batch.is_ok(),
        );
        drop(records);
        if batch.is_ok() {
            for s in staged {
                self.committed(s);
            }
            return;
        }
        let mut failed: HashMap<TaskId, String> = HashMap::new();
        for s in staged {
            if let Some(message) = failed.get(&s.task) {
                let message = format!("an earlier transition could not be journaled: {message}");
                self.dropped(&s, message);
                continue;
            }
            let watch = Stopwatch::start();
            let one = self.store.commit(&s.record());
            crate::engine::metrics::global().commit_done(watch.elapsed_secs(), 1, one.is_ok());
            match one {
                Ok(_) => self.committed(s),
                Err(e) => {
                    let message = e.to_string();
                    warn!(task = %s.task, event = s.event.name(), error = %message,
                        "could not journal a transition; the task is unloaded");
                    self.unload_after_failed_commit(&s, e);
                    failed.insert(s.task, message);
                }
            }
        }
    }

    /// A transition is durable: announce it and perform its commands.
    pub(super) fn committed(&mut self, s: Staged) {
        if self.fence.is_some() && !self.may_act(&s) {
            return;
        }
        if self.locks.is_some() {
            self.settled.push(s.task.clone());
        }
        if s.task_before.is_none() {
            // A new task belongs to this engine's backend.
            if let Err(e) = self.store.claim_backend(&s.task, self.provider.name()) {
                warn!(task = %s.task, error = %e, "could not record the task's backend");
            }
        }
        let after = s.task_after.state;
        if s.task_before.is_some() && s.state_before != after {
            debug!(task = %s.task, from = %s.state_before, to = %after, "state changed");
            let _ = self.changes.send(StateChange {
                task_id: s.task.clone(),
                from: s.state_before,
                to: after,
                event: s.event.name(),
                at: s.at,
            });
        }
        for cmd in s.commands {
            self.perform(&s.task_after.id, cmd, s.at);
        }
    }

    /// A transition of task `s.task` could not be journaled (a full disk, an I/O error). What
    /// happened in memory since its last committed state cannot be trusted to match the journal
    /// any more — an outcome (a command's exit, a snapshot) is lost — so the task is unloaded:
    /// every caller waiting on it is answered with the store error (not left waiting for an
    /// answer that would never come), its timers are cancelled, and the next request loads it
    /// from the journal and recovers it as after a restart (an interrupted command reported,
    /// the sandbox probed, the operation in flight re-issued). Outcomes of calls still in
    /// flight for it are ignored until then (`apply` skips a task not loaded).
    fn unload_after_failed_commit(&mut self, s: &Staged, err: crate::store::StoreError) {
        // The request whose own transition failed gets the error itself; the others a copy.
        self.unload(&s.task, request_of(&s.event), err);
    }

    /// Unloads `task` after `err` (see [`EventLoop::unload_after_failed_commit`]), answering
    /// every caller waiting on it: the request `own` with `err` itself, the others a copy.
    pub(super) fn unload(
        &mut self,
        task: &TaskId,
        own: Option<u64>,
        err: crate::store::StoreError,
    ) {
        if let (Some(fence), crate::store::StoreError::LeaseLost { .. }) = (&self.fence, &err) {
            fence.lost(task);
        }
        self.tasks.remove(task);
        self.cancel_timers(Some(task));
        self.outputs.retain(|(t, _), _| t != task);
        let waiting: Vec<_> = self
            .waiters
            .keys()
            .filter(|(t, _)| t == task)
            .cloned()
            .collect();
        let message = err.to_string();
        let mut err = Some(err);
        for key in waiting {
            let Some(w) = self.waiters.remove(&key) else {
                continue;
            };
            let copy = err.as_ref().and_then(|e| e.for_another_caller());
            let e = match (Some(key.1) == own, err.take(), copy) {
                (true, Some(e), _) => EngineError::Store(e),
                (false, original, Some(copy)) => {
                    err = original;
                    EngineError::Store(copy)
                }
                (_, original, _) => {
                    err = original;
                    EngineError::Request {
                        task: task.clone(),
                        reason: Box::new(FailureReason::NotCommitted {
                            message: format!("the task's journal could not be written: {message}"),
                        }),
                        attempts: 0,
                        notices: Vec::new(),
                    }
                }
            };
            let _ = w.send(Err(e));
        }
    }

    /// A transition dropped because an earlier one of its task could not be committed.
    fn dropped(&mut self, s: &Staged, message: String) {
        warn!(task = %s.task, event = s.event.name(), "transition dropped: {message}");
        self.fail_request(
            s,
            EngineError::Request {
                task: s.task.clone(),
                reason: Box::new(FailureReason::NotCommitted { message }),
                attempts: 0,
                notices: Vec::new(),
            },
        );
    }

    /// If `s` was a caller's request, answers it with `err`.
    fn fail_request(&mut self, s: &Staged, err: EngineError) {
        let Some(request_id) = request_of(&s.event) else {
            return;
        };
        self.live.remove(&(s.task.clone(), request_id));
        self.typed_commands.remove(&(s.task.clone(), request_id));
        if let Some(w) = self.waiters.remove(&(s.task.clone(), request_id)) {
            let _ = w.send(Err(err));
        }
    }
}

impl EventLoop {
    /// Cancels the armed timers of `task`, or every timer (`None`: the loop is stopping).
    fn cancel_timers(&mut self, task: Option<&TaskId>) {
        self.timers.retain(|(t, _), armed| {
            let cancel = task.is_none_or(|task| t == task);
            if cancel {
                armed.handle.abort();
            }
            !cancel
        });
    }
}

/// The caller's request an event is, if it is one: the id its answer is waited on by.
fn request_of(event: &Event) -> Option<RequestId> {
    match event {
        Event::RunRequested { request_id, .. }
        | Event::SuspendRequested { request_id }
        | Event::ResumeRequested { request_id }
        | Event::ForkRequested { request_id, .. }
        | Event::CheckpointRequested { request_id }
        | Event::RewindRequested { request_id, .. } => Some(*request_id),
        _ => None,
    }
}
