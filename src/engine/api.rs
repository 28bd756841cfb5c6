//! The public API: [`Orchestrator`] (run, suspend, resume, tasks, show, watch, shutdown) and
//! the [`OrchestratorBuilder`] that opens one. Each call takes the task's lock, sends one
//! message to the [`EventLoop`] and waits for its answer.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

use super::event_loop::{Answer, ApiRequest, EventLoop, Msg, QueryFn};
use super::lock::TaskLocks;
use super::owner::Ownership;
use super::{
    store_file, EngineError, ForkResult, RemoveResult, ResumeResult, RunResult, StateChange,
    SuspendResult, TaskView,
};
use crate::clock::{Clock, SystemClock};
use crate::config::{CommandEnv, Config};
use crate::core::{Event, FailureReason, ForkFrom, Reply, SnapshotRecord, Task, TaskSettings};
use crate::ids::TaskId;
use crate::provider::{ExecIo, ExecOutput, SandboxProvider};
use crate::retry::Jitter;
use crate::store::Store;

/// How to open an [`Orchestrator`].
pub struct OrchestratorBuilder {
    data_dir: PathBuf,
    config: Config,
    provider: Option<Arc<dyn SandboxProvider>>,
    clock: Arc<dyn Clock>,
    jitter: Jitter,
    lock_wait: Duration,
    reconcile_on_start: bool,
    owner: Option<String>,
    on_lock_wait: Option<super::lock::LockWaitHook>,
    record_kinds: bool,
}

impl OrchestratorBuilder {
    /// Whether to run [`Orchestrator::gc`] in the background right after opening (default:
    /// yes), stopping orphaned sandboxes and deleting unreferenced snapshots of this
    /// installation that a crash may have left behind.
    pub fn reconcile_on_start(mut self, yes: bool) -> Self {
        self.reconcile_on_start = yes;
        self
    }

    /// Whether new snapshot records say what made them (default: yes). Re-drive sets what the
    /// recorded engine did ([`TaskSettings::record_kinds`](crate::core::TaskSettings)).
    pub fn record_kinds(mut self, yes: bool) -> Self {
        self.record_kinds = yes;
        self
    }

    /// Uses this provider instead of the one the config names.
    pub fn provider(mut self, provider: Arc<dyn SandboxProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// Uses this clock (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Uses this retry jitter (default: random).
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// How long to wait for another process that drives the same task (default 15 min).
    pub fn lock_wait(mut self, wait: Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    /// Calls `hook` as soon as a request starts waiting for a task that another process
    /// drives (who, and for how long at most), so that a caller can say so at once.
    pub fn on_lock_wait(mut self, hook: impl Fn(&super::LockWait) + Send + Sync + 'static) -> Self {
        self.on_lock_wait = Some(Arc::new(hook));
        self
    }

    /// This process's name in a fleet's `leases` table (PostgreSQL store), shown to a caller
    /// whose task it drives (default: [`owner_name`](super::owner_name) without an address).
    pub fn owner(mut self, name: String) -> Self {
        self.owner = Some(name);
        self
    }

    /// Opens the store and starts the event loop.
    pub async fn open(self) -> Result<Orchestrator, EngineError> {
        self.config.validate(crate::config::ValueSource::Program)?;
        let store = Store::open_location(
            self.config.terminal.store.url(),
            &store_file(&self.data_dir),
            true,
        )?;
        if store.is_sqlite() {
            super::paths::make_private(&self.data_dir);
        }
        let mut store = store;
        keep_reserve(
            &mut store,
            &self.data_dir,
            self.config.terminal.store_reserve_mb,
        );
        let installation_id = store.installation_id().to_string();
        let provider = match self.provider {
            Some(p) => p,
            None => crate::provider::from_config(
                &self.config,
                &self.data_dir,
                &installation_id,
                self.clock.clone(),
            )
            .map_err(|e| EngineError::Provider {
                backend: e.backend.clone(),
                message: e.to_string(),
                hint: e.hint(),
            })?,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let (changes, _) = broadcast::channel(1024);
        // Who may drive a task: the data dir's `flock`s (SQLite), or a fleet's leases.
        let owner = self.owner;
        let ownership = match &store {
            Store::Sqlite(_) => {
                let _ = owner;
                Ownership::Locks(Arc::new(
                    TaskLocks::new(
                        self.data_dir.join("locks"),
                        self.lock_wait,
                        self.clock.is_virtual(),
                    )
                    .on_wait(self.on_lock_wait),
                ))
            }
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => Ownership::Leases(super::owner::Leases::start(
                pg,
                owner.unwrap_or_else(|| super::owner_name(None)),
                Duration::from_secs(self.config.terminal.lease_seconds),
                tx.clone(),
            )?),
        };
        // What the lifecycle depends on: the configuration, whether the provider keeps a
        // sandbox's files past its deadline (then a late checkpoint saves them), whether it
        // reports what a session used (then a session that ended unasked is read for the ledger),
        // and whether it samples activity (then idle sees the processes' work).
        let mut settings = self.config.task_settings();
        settings.record_kinds = self.record_kinds;
        with_provider_properties(&mut settings, provider.as_ref());
        let max_creates = self.config.terminal.max_concurrent_creates.max(1) as usize;
        let lp = EventLoop {
            store,
            provider: provider.clone(),
            clock: self.clock.clone(),
            jitter: self.jitter,
            settings: settings.clone(),
            installation_id: installation_id.clone(),
            tasks: HashMap::new(),
            waiters: Default::default(),
            outputs: HashMap::new(),
            live: HashMap::new(),
            typed_commands: HashMap::new(),
            timers: HashMap::new(),
            next_timer: 0,
            inflight: 0,
            creates: Arc::new(Semaphore::new(max_creates)),
            tx: tx.clone(),
            changes: changes.clone(),
            shutdown: None,
            staged: Vec::new(),
            fence: ownership.fence(),
            locks: ownership.locks(),
            settled: Vec::new(),
            inflight_by_task: HashMap::new(),
        };
        let handle = tokio::spawn(lp.run(rx));
        let orch = Orchestrator {
            inner: Arc::new(Inner {
                tx,
                changes,
                ownership,
                settings: std::sync::RwLock::new(settings),
                env: std::sync::RwLock::new(self.config.terminal.env.clone()),
                installation_id,
                provider,
                handle: Mutex::new(Some(handle)),
            }),
        };
        if self.reconcile_on_start {
            let o = orch.clone();
            tokio::spawn(async move {
                match o.gc(false).await {
                    Ok(r) if !r.sandboxes_stopped.is_empty() || !r.snapshots_deleted.is_empty() => {
                        tracing::info!(
                            sandboxes = r.sandboxes_stopped.len(),
                            snapshots = r.snapshots_deleted.len(),
                            "reconciled orphaned resources at start"
                        )
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, "reconcile at start did not complete"),
                }
            });
        }
        Ok(orch)
    }
}

/// Drives tasks: runs commands in their sandboxes, suspends and resumes them.
///
/// Cheap to clone; every clone talks to the same event loop. Call [`Orchestrator::shutdown`]
/// before dropping the last one so in-flight provider calls are finished and journaled.
///
/// ```no_run
/// # async fn demo() -> Result<(), taskbox::engine::EngineError> {
/// use taskbox::{config::Config, engine::Orchestrator, TaskId};
/// let orch = Orchestrator::builder("/tmp/taskbox-data".into(), Config::default()).open().await?;
/// let task = TaskId::new("demo")?;
/// let out = orch.run(&task, "echo hello > notes.txt; cat notes.txt", None).await?;
/// assert_eq!(out.stdout, "hello\n");
/// orch.suspend(&task).await?;
/// orch.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Orchestrator {
    pub(super) inner: Arc<Inner>,
}

/// What every clone of an [`Orchestrator`] shares.
/// What of a task's settings the provider decides, not the config: set at open and kept by
/// [`Orchestrator::reconfigure`].
pub(super) fn with_provider_properties(
    settings: &mut TaskSettings,
    provider: &dyn SandboxProvider,
) {
    settings.late_checkpoint = provider.keeps_files_after_deadline();
    settings.reports_usage = provider.reports_usage();
    // Activity-aware idle only where the provider can tell busy processes from idle ones.
    if !provider.measures_activity() {
        settings.max_busy_ms = 0;
    }
    // Whether a checkpoint keeps the sandbox running.
    settings.live_checkpoint = provider.checkpoints_live();
}

pub(super) struct Inner {
    pub(super) tx: mpsc::UnboundedSender<Msg>,
    changes: broadcast::Sender<StateChange>,
    pub(super) ownership: Ownership,
    /// The settings new commands and tasks get ([`Orchestrator::reconfigure`] replaces them).
    pub(super) settings: std::sync::RwLock<TaskSettings>,
    /// `terminal.env`: the variables every command gets, under a run's own.
    pub(super) env: std::sync::RwLock<CommandEnv>,
    pub(super) installation_id: String,
    pub(super) provider: Arc<dyn SandboxProvider>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Orchestrator {
    /// Starts building an orchestrator over `data_dir` with `config`.
    pub fn builder(data_dir: PathBuf, config: Config) -> OrchestratorBuilder {
        OrchestratorBuilder {
            data_dir,
            config,
            provider: None,
            clock: Arc::new(SystemClock),
            jitter: Jitter::Random,
            lock_wait: Duration::from_secs(900),
            reconcile_on_start: true,
            owner: None,
            on_lock_wait: None,
            record_kinds: true,
        }
    }

    /// This installation's id (tags every sandbox it creates).
    pub fn installation_id(&self) -> &str {
        &self.inner.installation_id
    }

    /// The provider in use.
    pub fn provider(&self) -> Arc<dyn SandboxProvider> {
        self.inner.provider.clone()
    }

    /// Runs `command` (a `bash -c` string) in the task's sandbox, creating or restoring the
    /// sandbox first when needed. `timeout` defaults to `terminal.timeout`.
    ///
    /// A command that ran returns `Ok` whatever its exit code; `Err` means taskbox could not run
    /// it (after retries), or the sandbox expired under it.
    pub async fn run(
        &self,
        task: &TaskId,
        command: &str,
        timeout: Option<Duration>,
    ) -> Result<RunResult, EngineError> {
        self.run_live(task, command, timeout, ExecIo::default())
            .await
    }

    /// [`Orchestrator::run`] with the command's live side: its output is sent to `io.output`
    /// as it is produced (stdout and stderr chunks in the order they were read; every chunk is
    /// sent before this returns), `io.stdin` is its stdin, and a cancel through `io.cancel`
    /// signals the command (never the sandbox) — its result is then whatever it exited with.
    /// `io.env` are variables for the command, over `terminal.env` (secrets: only their
    /// command sees them). None of this is journaled; the result carries the bounded capture
    /// as `run` does.
    ///
    /// Read `io.output` while the command runs: a full channel makes the command's writes wait,
    /// as a full pipe would (on the local backend, a reader that takes nothing for 10 s after
    /// the command ended is given up, so it cannot hold the result).
    ///
    /// ```no_run
    /// # async fn demo(orch: taskbox::engine::Orchestrator) -> Result<(), taskbox::engine::EngineError> {
    /// use taskbox::provider::{ExecIo, OutputChunk, live::OUTPUT_CHANNEL_CHUNKS};
    /// let task = taskbox::TaskId::new("demo")?;
    /// let (tx, mut rx) = tokio::sync::mpsc::channel::<OutputChunk>(OUTPUT_CHANNEL_CHUNKS);
    /// let printer = tokio::spawn(async move {
    ///     while let Some(chunk) = rx.recv().await {
    ///         println!("{:?}: {}", chunk.stream, String::from_utf8_lossy(&chunk.data));
    ///     }
    /// });
    /// let io = ExecIo { output: Some(tx), ..ExecIo::default() };
    /// let res = orch.run_live(&task, "for i in 1 2 3; do echo $i; sleep 1; done", None, io).await?;
    /// printer.await.ok();
    /// # Ok(()) }
    /// ```
    pub async fn run_live(
        &self,
        task: &TaskId,
        command: &str,
        timeout: Option<Duration>,
        mut io: ExecIo,
    ) -> Result<RunResult, EngineError> {
        // A command that can never run is refused before the task (or a sandbox) is made.
        if let Some(problem) = command_problem(command) {
            return Err(EngineError::InvalidCommand {
                task: task.clone(),
                problem,
            });
        }
        // Saturating: a huge timeout must never wrap into a tiny one.
        let timeout_ms = timeout.map_or_else(
            || self.settings().command_timeout_ms,
            |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1),
        );
        // The run's own variables over `terminal.env`.
        io.env = io.env.over(&self.command_env());
        let answer = self
            .request(
                task,
                ApiRequest::Run {
                    command: command.to_string(),
                    timeout_ms,
                    io,
                },
            )
            .await?;
        match answer.reply {
            Reply::Ran {
                exit_code,
                timed_out,
                memory_killed,
                notices,
            } => {
                let out = answer.output.unwrap_or(ExecOutput {
                    exit_code,
                    timed_out,
                    memory_killed,
                    ..ExecOutput::default()
                });
                Ok(RunResult::from_output(out, notices))
            }
            other => Err(unexpected(task, other)),
        }
    }

    /// Snapshots the task's files (when `terminal.container_persistent`) and stops its sandbox.
    pub async fn suspend(&self, task: &TaskId) -> Result<SuspendResult, EngineError> {
        let answer = self.request(task, ApiRequest::Suspend).await?;
        match answer.reply {
            Reply::Suspended {
                snapshot_id,
                omitted,
            } => Ok(SuspendResult {
                snapshot_id,
                omitted,
            }),
            other => Err(unexpected(task, other)),
        }
    }

    /// Makes the task's sandbox live now, restoring the latest snapshot, without running anything.
    pub async fn resume(&self, task: &TaskId) -> Result<ResumeResult, EngineError> {
        let answer = self.request(task, ApiRequest::Resume).await?;
        match answer.reply {
            Reply::Resumed {
                sandbox_id,
                notices,
            } => Ok(ResumeResult {
                sandbox_id,
                notices,
            }),
            other => Err(unexpected(task, other)),
        }
    }

    /// `taskbox fork`: makes the new task `child` from one of `parent`'s snapshots — the latest
    /// ([`ForkFrom::Latest`]; a live parent is snapshotted first, which stops its sandbox as a
    /// suspend does, so the fork has its files as they are now), or a complete one it retains
    /// ([`ForkFrom::Seq`], [`ForkFrom::Id`]). The child starts `expired` with that snapshot as
    /// its restore source: its first command restores it into a sandbox of its own. Nothing is
    /// copied: parent and child share the provider's snapshot, and it is deleted only when no
    /// task retains it. The parent's request is journaled (it answers which snapshot), and so
    /// is the child's lineage ([`Task::lineage`]).
    ///
    /// Errors: no task `parent` ([`EngineError::NoTask`]), `child` exists or existed
    /// ([`EngineError::TaskExists`]), no such snapshot (`unknown_snapshot`), nothing to fork
    /// (`nothing_to_fork`), or the snapshot of a live parent failed.
    pub async fn fork(
        &self,
        parent: &TaskId,
        child: &TaskId,
        from: ForkFrom,
    ) -> Result<ForkResult, EngineError> {
        if parent == child {
            return Err(EngineError::TaskExists {
                task: child.clone(),
            });
        }
        // The child's lock first: no other process may make or drive it meanwhile.
        let _child = self.inner.ownership.acquire(child).await?;
        let answer = self
            .request(
                parent,
                ApiRequest::Fork {
                    child: child.clone(),
                    from,
                },
            )
            .await?;
        match answer.reply {
            Reply::Forked {
                child,
                snapshot:
                    SnapshotRecord {
                        id: Some(snapshot_id),
                        seq,
                        created_at,
                        ..
                    },
            } => Ok(ForkResult {
                task: child.to_string(),
                parent: parent.to_string(),
                snapshot_id,
                parent_seq: seq,
                taken_at: created_at,
            }),
            other => Err(unexpected(parent, other)),
        }
    }

    /// `taskbox rm`: stops the task's sandbox, deletes its snapshots unless `keep_snapshots`,
    /// and marks it removed; its journal stays for `taskbox replay`. The name is not reused: a
    /// later request for it is refused ([`EngineError::Removed`]). Refused while an operation
    /// is in flight. Provider calls that fail are reported; `taskbox gc` finishes them.
    pub async fn remove(
        &self,
        task: &TaskId,
        keep_snapshots: bool,
    ) -> Result<RemoveResult, EngineError> {
        let _claim = self.inner.ownership.acquire(task).await?;
        let (tx, rx) = oneshot::channel();
        self.inner
            .tx
            .send(Msg::Remove {
                task: task.clone(),
                keep_snapshots,
                respond: tx,
            })
            .map_err(|_| EngineError::Stopped)?;
        let plan = rx.await.map_err(|_| EngineError::Stopped)??;
        let p = &self.inner.provider;
        let mut res = RemoveResult {
            task: task.clone(),
            sandbox_stopped: None,
            snapshots_deleted: Vec::new(),
            snapshots_kept: plan.kept,
            errors: Vec::new(),
        };
        if let Some(sb) = plan.sandbox {
            // The stop as the engine makes it (`Call`, the one map): its outcome carries what
            // the session used, and is journaled in the removed task's record, so the ledger
            // has the session and its sandbox time ends here. A failed stop is left to gc.
            let stop = crate::provider::Call::StopSandbox {
                sandbox_id: sb.clone(),
            };
            match stop.perform(&**p).await.0 {
                event @ Event::SandboxStopped { .. } => {
                    res.sandbox_stopped = Some(sb.clone());
                    let (tx, rx) = oneshot::channel();
                    let journaled = self
                        .inner
                        .tx
                        .send(Msg::RemovedOutcome {
                            task: task.clone(),
                            event,
                            respond: tx,
                        })
                        .map_err(|_| EngineError::Stopped);
                    let journaled = match journaled {
                        Ok(()) => rx.await.map_err(|_| EngineError::Stopped).and_then(|r| r),
                        Err(e) => Err(e),
                    };
                    if let Err(e) = journaled {
                        res.errors
                            .push(format!("journal the stop of sandbox {sb}: {e}"));
                    }
                }
                Event::StopFailed { failure, .. }
                    if failure.kind == crate::core::FailureKind::SandboxGone => {}
                Event::StopFailed { failure, .. } => {
                    res.errors.push(format!("stop sandbox {sb}: {failure}"))
                }
                other => res.errors.push(format!(
                    "stop sandbox {sb}: unexpected outcome {}",
                    other.name()
                )),
            }
        }
        for snap in plan.delete {
            match p.delete_snapshot(&snap).await {
                Ok(()) => res.snapshots_deleted.push(snap),
                Err(e) if e.kind == crate::core::FailureKind::SnapshotGone => {
                    res.snapshots_deleted.push(snap)
                }
                Err(e) => res.errors.push(format!("delete snapshot {snap}: {e}")),
            }
        }
        Ok(res)
    }

    /// Every task in the store, with its current state.
    pub async fn tasks(&self) -> Result<Vec<Task>, EngineError> {
        self.query(|lp| {
            let mut tasks = lp.store.load_tasks()?;
            for t in &mut tasks {
                if let Some(live) = lp.tasks.get(t.id.as_str()) {
                    *t = live.clone();
                }
            }
            Ok(tasks)
        })
        .await
    }

    /// Everything known about one task (`None` if it does not exist).
    pub async fn show(
        &self,
        task: &TaskId,
        journal_entries: usize,
    ) -> Result<Option<TaskView>, EngineError> {
        let id = task.clone();
        self.query(move |lp| {
            let live = lp.tasks.get(&id).cloned();
            TaskView::load(&lp.store, &id, journal_entries, live)
        })
        .await
    }

    /// Takes the task's lock and loads it now, recovering whatever a previous process left in
    /// flight, so that its timers (idle snapshot, checkpoint before the deadline) run without
    /// waiting for a request to name it. A long-lived driver (`taskbox serve`) loads every task
    /// with a live sandbox at start.
    pub async fn load(&self, task: &TaskId) -> Result<(), EngineError> {
        let _claim = self.inner.ownership.acquire(task).await?;
        let (tx, rx) = oneshot::channel();
        self.inner
            .tx
            .send(Msg::Load {
                task: task.clone(),
                done: tx,
            })
            .map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }

    /// The tasks this orchestrator has loaded (the ones it drives), as they are in memory. Reads
    /// no store: cheap enough to ask often.
    pub async fn loaded_tasks(&self) -> Result<Vec<Task>, EngineError> {
        self.query(|lp| {
            let mut tasks: Vec<Task> = lp.tasks.values().cloned().collect();
            tasks.sort_by(|a, b| a.id.cmp(&b.id));
            Ok(tasks)
        })
        .await
    }

    /// State changes of every task this orchestrator drives, as they are committed.
    pub fn watch(&self) -> broadcast::Receiver<StateChange> {
        self.inner.changes.subscribe()
    }

    /// One task as it is now and a receiver of the state changes committed after that moment,
    /// taken together on the event loop so that no change falls between the two (the receiver
    /// carries every task's changes; filter by [`StateChange::task_id`]). `None`: no such task.
    pub async fn watch_task(
        &self,
        task: &TaskId,
    ) -> Result<Option<(Task, broadcast::Receiver<StateChange>)>, EngineError> {
        let id = task.clone();
        self.query(move |lp| {
            let rx = lp.changes.subscribe();
            let current = match lp.tasks.get(&id) {
                Some(t) => Some(t.clone()),
                None => lp.store.load_task(&id)?,
            };
            Ok(current.map(|t| (t, rx)))
        })
        .await
    }

    /// Stops accepting requests, waits (up to `grace`) for provider calls in flight to finish
    /// and be journaled, and stops the event loop. Task locks are released (a fleet's leases
    /// let go, so that another server may take the tasks at once).
    pub async fn shutdown_within(&self, grace: Duration) {
        let (tx, rx) = oneshot::channel();
        if self.inner.tx.send(Msg::Shutdown { done: tx }).is_ok() {
            let _ = tokio::time::timeout(grace, rx).await;
        }
        let handle = self.inner.handle.lock().expect("handle lock").take();
        if let Some(h) = handle {
            h.abort();
            let _ = h.await;
        }
        self.inner.ownership.release_all(true).await;
    }

    /// Stops the event loop at once, as a crash would: nothing in flight is awaited or
    /// journaled, and task locks are released (a fleet's leases are left to expire, as after a
    /// crash). For resilience tests; the next orchestrator on
    /// the same data dir recovers from the journal.
    pub async fn abort(&self) {
        let handle = self.inner.handle.lock().expect("handle lock").take();
        if let Some(h) = handle {
            h.abort();
            let _ = h.await;
        }
        self.inner.ownership.release_all(false).await;
    }

    /// [`Orchestrator::shutdown_within`] with a 60 s grace period.
    pub async fn shutdown(&self) {
        self.shutdown_within(Duration::from_secs(60)).await
    }

    pub(super) async fn request(
        &self,
        task: &TaskId,
        req: ApiRequest,
    ) -> Result<Answer, EngineError> {
        // A command's caller may cancel while the task is still another process's: the wait
        // ends then, and nothing ran.
        let cancel = match &req {
            ApiRequest::Run { io, .. } => io.cancel.clone(),
            _ => None,
        };
        let _claim = match cancel {
            Some(cancel) => {
                let mut cancel = Some(cancel);
                tokio::select! {
                    claim = self.inner.ownership.acquire(task) => claim?,
                    signal = crate::provider::live::cancel_requested(&mut cancel) => {
                        return Err(EngineError::Interrupted {
                            task: task.clone(),
                            signal: signal.name(),
                        });
                    }
                }
            }
            None => self.inner.ownership.acquire(task).await?,
        };
        let (tx, rx) = oneshot::channel();
        self.inner
            .tx
            .send(Msg::Request {
                task: task.clone(),
                req,
                respond: tx,
            })
            .map_err(|_| EngineError::Stopped)?;
        let answer = rx.await.map_err(|_| EngineError::Stopped)??;
        if let Reply::Failed {
            reason,
            attempts,
            notices,
        } = answer.reply
        {
            return Err(EngineError::Request {
                task: task.clone(),
                reason: Box::new(reason),
                attempts,
                notices,
            });
        }
        Ok(answer)
    }

    pub(super) async fn query<T: Send + 'static>(
        &self,
        f: impl FnOnce(&EventLoop) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<T, EngineError> {
        let (tx, rx) = oneshot::channel();
        let f: QueryFn = Box::new(move |lp| {
            let _ = tx.send(f(lp));
        });
        self.inner
            .tx
            .send(Msg::Query(f))
            .map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }
}

/// The most bytes a command may have: it is run as one argument of `bash -c`, and Linux
/// refuses an argument over `MAX_ARG_STRLEN` (131,072 bytes with its terminating NUL).
pub const MAX_COMMAND_BYTES: usize = 131_071;

/// Why `command` can never run (`None`: it can): a NUL byte (an argument ends there), or more
/// bytes than an argument may have. The reason never quotes the whole command: its start, cut.
fn command_problem(command: &str) -> Option<String> {
    if let Some(at) = command.find('\0') {
        return Some(format!(
            "the command has a NUL byte at byte {at} (`{}`), where a command's argument would end",
            crate::redact::redact(&cut(command, 60)).replace('\0', "\\0")
        ));
    }
    if command.len() > MAX_COMMAND_BYTES {
        return Some(format!(
            "the command is {} bytes (`{}`), over the {MAX_COMMAND_BYTES} bytes an argument of `bash -c` may have",
            command.len(),
            crate::redact::redact(&cut(command, 60))
        ));
    }
    None
}

/// The first `max` characters of `s`, with `…` when it was longer.
fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

pub(super) fn unexpected(task: &TaskId, reply: Reply) -> EngineError {
    EngineError::Request {
        task: task.clone(),
        reason: Box::new(FailureReason::UnexpectedReply {
            reply: format!("{reply:?}"),
        }),
        attempts: 0,
        notices: Vec::new(),
    }
}

/// Makes the data dir's disk reserve (`terminal.store_reserve_mb`) and hands it to the SQLite
/// store, which gives it back when a commit finds the disk full ([`crate::store::reserve`]). A fleet's
/// PostgreSQL store is not on this disk; a reserve that cannot be made now is made by a later
/// commit once there is room.
fn keep_reserve(store: &mut Store, data_dir: &std::path::Path, mb: u32) {
    if !store.is_sqlite() {
        return;
    }
    let reserve = crate::store::reserve::Reserve::new(data_dir, mb);
    match reserve.ensure() {
        Ok(crate::store::reserve::Held::NoRoom(space)) => tracing::info!(
            reserve = %reserve.path().display(), %space,
            "the disk is too full to keep the store's reserve; it is made once there is room"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "no disk reserve for the store"),
    }
    if reserve.bytes() > 0 {
        store.set_reserve(reserve);
    }
}
