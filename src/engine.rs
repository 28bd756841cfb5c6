//! The event loop, and [`Orchestrator`]: the public API for programs that drive tasks.
//!
//! One tokio task owns every loaded [`Task`] and the [`Store`]. Everything that happens reaches
//! it as a message on one channel: caller requests, provider outcomes (from spawned futures that
//! only perform one provider call and send its result back), timers and queries. For each event
//! the loop calls the pure [`step`], commits the transition (state, journal entry and the
//! commands to perform) in one SQLite transaction, and only then performs the commands.
//!
//! A task is driven by one process at a time: before a task is loaded the orchestrator takes an
//! exclusive `flock` on `<data dir>/locks/<task>.lock`, which the OS releases if the process dies.
//! The first time a process loads a task that was left mid-flight, it applies
//! [`Event::Recovered`]: the core re-issues the operation in flight (every provider operation but
//! `exec` is idempotent by key) or probes the sandbox.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{broadcast, mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, info_span, warn};

use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::core::{
    step, Command, Event, Millis, Notice, Reply, StepError, Task, TaskSettings, TaskState,
    TimerKind,
};
use crate::ids::{TaskId, TaskIdError};
use crate::provider::{sandbox_name, ExecOutput, ExecRequest, SandboxProvider, SandboxSpec};
use crate::retry::Jitter;
use crate::store::{JournalEntry, SandboxRow, SnapshotRow, Store, StoreError, TransitionRecord};

/// An engine failure, with the task it concerns.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A task id was refused.
    #[error(transparent)]
    TaskId(#[from] TaskIdError),
    /// The core refused an event.
    #[error(transparent)]
    Step(#[from] StepError),
    /// A request finished with a failure (after retries, where retrying made sense).
    #[error("task {task}: {message}")]
    Request {
        /// The task.
        task: String,
        /// The last real error, with context.
        message: String,
        /// Attempts made.
        attempts: u32,
        /// What the caller should know (sandbox expired, files lost...).
        notices: Vec<Notice>,
    },
    /// The provider could not be set up, or a reconciliation call failed.
    #[error("{backend} backend: {message}")]
    Provider {
        /// The backend.
        backend: &'static str,
        /// What went wrong.
        message: String,
        /// How to fix it, if known.
        hint: Option<String>,
    },
    /// Another process drives the task and did not let go in time.
    #[error("task {task} is busy: another taskbox process has driven it for over {waited_secs} s (lock {path})")]
    Busy {
        /// The task.
        task: String,
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited_secs: u64,
    },
    /// The task lock could not be taken.
    #[error("cannot lock task {task} ({path})")]
    Lock {
        /// The task.
        task: String,
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The event loop has stopped.
    #[error("the taskbox engine has stopped")]
    Stopped,
}

/// The result of a command that ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunResult {
    /// Exit code (124 when the timeout killed it).
    pub exit_code: i32,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// Captured stdout (bounded).
    pub stdout: String,
    /// Captured stderr (bounded).
    pub stderr: String,
    /// Wall time of the command.
    pub duration_ms: u64,
    /// What the caller should know: the sandbox was recreated (live processes are gone), from
    /// which snapshot, files lost...
    pub notices: Vec<Notice>,
}

/// The result of a suspend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SuspendResult {
    /// The snapshot holding the task's files (`None`: nothing kept).
    pub snapshot_id: Option<String>,
}

/// The result of a resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResumeResult {
    /// The live sandbox.
    pub sandbox_id: String,
    /// What the caller should know.
    pub notices: Vec<Notice>,
}

/// A state change, as broadcast to watchers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateChange {
    /// The task.
    pub task_id: String,
    /// State before.
    pub from: TaskState,
    /// State after.
    pub to: TaskState,
    /// The event that caused it.
    pub event: &'static str,
    /// When.
    pub at: Millis,
}

/// Everything known about one task, for `taskbox show`.
#[derive(Debug, Clone, Serialize)]
pub struct TaskView {
    /// The task as the core sees it.
    pub task: Task,
    /// Its sandboxes, as recorded.
    pub sandboxes: Vec<SandboxRow>,
    /// Its snapshots, as recorded.
    pub snapshots: Vec<SnapshotRow>,
    /// The last journal entries, oldest first.
    pub journal: Vec<JournalEntry>,
}

impl TaskView {
    /// Reads a task's view from the store (no provider, no lock: for read-only tools).
    /// `live` replaces the stored task when an event loop holds a newer one in memory.
    pub fn load(
        store: &Store,
        id: &str,
        journal_entries: usize,
        live: Option<Task>,
    ) -> Result<Option<TaskView>, EngineError> {
        let task = match live {
            Some(t) => Some(t),
            None => store.load_task(id)?,
        };
        let Some(task) = task else {
            return Ok(None);
        };
        Ok(Some(TaskView {
            sandboxes: store.sandboxes(Some(id))?,
            snapshots: store.snapshots(Some(id))?,
            journal: store.journal_tail(id, journal_entries)?,
            task,
        }))
    }
}

/// One resource `gc` acted on (or would have).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GcItem {
    /// Provider id.
    pub id: String,
    /// The task its tags or name name, if any.
    pub task_id: Option<String>,
    /// Why it was chosen or skipped.
    pub reason: String,
}

/// What `gc` found and did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    /// Nothing was changed.
    pub dry_run: bool,
    /// Live sandboxes of this installation that no task holds: stopped.
    pub sandboxes_stopped: Vec<GcItem>,
    /// Snapshots of this installation that no task retains: deleted.
    pub snapshots_deleted: Vec<GcItem>,
    /// Resources left alone because their task has an operation in flight.
    pub skipped: Vec<GcItem>,
    /// Stop or delete calls that failed (the next gc tries again).
    pub errors: Vec<String>,
    /// Leftovers of interrupted operations removed (local backend: half-written archives,
    /// half-restored workspaces).
    pub temporaries_removed: usize,
}

/// How to open an [`Orchestrator`].
pub struct OrchestratorBuilder {
    data_dir: PathBuf,
    config: Config,
    provider: Option<Arc<dyn SandboxProvider>>,
    clock: Arc<dyn Clock>,
    jitter: Jitter,
    lock_wait: Duration,
    reconcile_on_start: bool,
}

impl OrchestratorBuilder {
    /// Whether to run [`Orchestrator::gc`] in the background right after opening (default:
    /// yes), stopping orphaned sandboxes and deleting unreferenced snapshots of this
    /// installation that a crash may have left behind.
    pub fn reconcile_on_start(mut self, yes: bool) -> Self {
        self.reconcile_on_start = yes;
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

    /// Opens the store and starts the event loop.
    pub async fn open(self) -> Result<Orchestrator, EngineError> {
        let store = Store::open(&store_file(&self.data_dir))?;
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
                backend: self.config.terminal.backend.as_str(),
                message: e.to_string(),
                hint: e.hint(),
            })?,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let (changes, _) = broadcast::channel(1024);
        let max_creates = self.config.terminal.max_concurrent_creates.max(1) as usize;
        let lp = EventLoop {
            store,
            provider: provider.clone(),
            clock: self.clock.clone(),
            jitter: self.jitter,
            settings: self.config.task_settings(),
            installation_id: installation_id.clone(),
            tasks: HashMap::new(),
            waiters: Default::default(),
            outputs: HashMap::new(),
            timers: HashMap::new(),
            inflight: 0,
            probing: Default::default(),
            deferred: HashMap::new(),
            creates: Arc::new(Semaphore::new(max_creates)),
            tx: tx.clone(),
            changes: changes.clone(),
            shutdown: None,
            staged: Vec::new(),
        };
        let handle = tokio::spawn(lp.run(rx));
        let orch = Orchestrator {
            inner: Arc::new(Inner {
                tx,
                changes,
                locks: Mutex::new(HashMap::new()),
                lock_dir: self.data_dir.join("locks"),
                lock_wait: self.lock_wait,
                settings: self.config.task_settings(),
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
    inner: Arc<Inner>,
}

struct Inner {
    tx: mpsc::UnboundedSender<Msg>,
    changes: broadcast::Sender<StateChange>,
    locks: Mutex<HashMap<String, File>>,
    lock_dir: PathBuf,
    lock_wait: Duration,
    settings: TaskSettings,
    installation_id: String,
    provider: Arc<dyn SandboxProvider>,
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
        let timeout_ms = timeout.map_or(self.inner.settings.command_timeout_ms, |d| {
            (d.as_millis() as u64).max(1)
        });
        let answer = self
            .request(
                task,
                ApiRequest::Run {
                    command: command.to_string(),
                    timeout_ms,
                },
            )
            .await?;
        match answer.reply {
            Reply::Ran {
                exit_code,
                timed_out,
                notices,
            } => {
                let out = answer.output.unwrap_or(ExecOutput {
                    exit_code,
                    timed_out,
                    stdout: String::new(),
                    stderr: String::new(),
                    duration_ms: 0,
                });
                Ok(RunResult {
                    exit_code,
                    timed_out,
                    stdout: out.stdout,
                    stderr: out.stderr,
                    duration_ms: out.duration_ms,
                    notices,
                })
            }
            other => Err(unexpected(task, other)),
        }
    }

    /// Snapshots the task's files (when `terminal.container_persistent`) and stops its sandbox.
    pub async fn suspend(&self, task: &TaskId) -> Result<SuspendResult, EngineError> {
        let answer = self.request(task, ApiRequest::Suspend).await?;
        match answer.reply {
            Reply::Suspended { snapshot_id } => Ok(SuspendResult { snapshot_id }),
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

    /// Every task in the store, with its current state.
    pub async fn tasks(&self) -> Result<Vec<Task>, EngineError> {
        self.query(|lp| {
            let mut tasks = lp.store.load_tasks()?;
            for t in &mut tasks {
                if let Some(live) = lp.tasks.get(&t.id) {
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
        let id = task.as_str().to_string();
        self.query(move |lp| {
            let live = lp.tasks.get(&id).cloned();
            TaskView::load(&lp.store, &id, journal_entries, live)
        })
        .await
    }

    /// Finds this installation's sandboxes and snapshots on the provider (by tag) that no task
    /// references, and stops or deletes them. Never touches another installation's resources,
    /// nor those of a task with an operation in flight (its recovery owns them: the write-ahead
    /// journal records a create or snapshot before it is made). `dry_run` only reports.
    pub async fn gc(&self, dry_run: bool) -> Result<GcReport, EngineError> {
        let p = self.inner.provider.clone();
        let installation = self.inner.installation_id.clone();
        let backend = p.name();
        let listing = |e: crate::provider::ProviderError| EngineError::Provider {
            backend,
            message: format!("cannot list resources for gc: {e}"),
            hint: None,
        };
        let sandboxes = p.list_sandboxes(&installation).await.map_err(listing)?;
        let snapshots = p.list_snapshots(&installation).await.map_err(listing)?;
        // Read the tasks only after listing: the journal records a create or a snapshot before
        // it is made, so every resource listed above is already known to its task as in flight
        // or held. (Reading first would race with another process creating one.)
        let tasks = self.tasks().await?;
        let busy: std::collections::HashSet<&str> = tasks
            .iter()
            .filter(|t| t.state.is_transient())
            .map(|t| t.id.as_str())
            .collect();
        let held: std::collections::HashSet<&str> = tasks
            .iter()
            .filter_map(|t| t.sandbox.as_ref().map(|s| s.id.as_str()))
            .collect();
        let retained: std::collections::HashSet<&str> = tasks
            .iter()
            .flat_map(|t| t.retained_snapshot_ids())
            .collect();
        let mut report = GcReport {
            dry_run,
            ..GcReport::default()
        };
        let is_busy = |task: &Option<String>| task.as_deref().is_some_and(|t| busy.contains(t));
        for sb in sandboxes.into_iter().filter(|s| s.live) {
            if held.contains(sb.id.as_str()) {
                continue;
            }
            if is_busy(&sb.task_id) {
                report.skipped.push(GcItem {
                    reason: "its task has an operation in flight".into(),
                    id: sb.id,
                    task_id: sb.task_id,
                });
                continue;
            }
            if !dry_run {
                if let Err(e) = p.stop_sandbox(&sb.id).await {
                    report.errors.push(format!("stop sandbox {}: {e}", sb.id));
                    continue;
                }
            }
            report.sandboxes_stopped.push(GcItem {
                reason: "no task holds this sandbox".into(),
                id: sb.id,
                task_id: sb.task_id,
            });
        }
        for snap in snapshots.into_iter().filter(|s| s.live) {
            if retained.contains(snap.id.as_str()) {
                continue;
            }
            if is_busy(&snap.task_id) {
                report.skipped.push(GcItem {
                    reason: "its task has an operation in flight".into(),
                    id: snap.id,
                    task_id: snap.task_id,
                });
                continue;
            }
            if !dry_run {
                if let Err(e) = p.delete_snapshot(&snap.id).await {
                    report
                        .errors
                        .push(format!("delete snapshot {}: {e}", snap.id));
                    continue;
                }
            }
            report.snapshots_deleted.push(GcItem {
                reason: "no task retains this snapshot".into(),
                id: snap.id,
                task_id: snap.task_id,
            });
        }
        if !dry_run {
            match p.sweep_temporaries().await {
                Ok(n) => report.temporaries_removed = n,
                Err(e) => report.errors.push(format!("sweep temporaries: {e}")),
            }
        }
        Ok(report)
    }

    /// State changes of every task this orchestrator drives, as they are committed.
    pub fn watch(&self) -> broadcast::Receiver<StateChange> {
        self.inner.changes.subscribe()
    }

    /// Stops accepting requests, waits (up to `grace`) for provider calls in flight to finish
    /// and be journaled, and stops the event loop. Task locks are released.
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
        self.inner.locks.lock().expect("locks mutex").clear();
    }

    /// Stops the event loop at once, as a crash would: nothing in flight is awaited or
    /// journaled, and task locks are released. For resilience tests; the next orchestrator on
    /// the same data dir recovers from the journal.
    pub async fn abort(&self) {
        let handle = self.inner.handle.lock().expect("handle lock").take();
        if let Some(h) = handle {
            h.abort();
            let _ = h.await;
        }
        self.inner.locks.lock().expect("locks mutex").clear();
    }

    /// [`Orchestrator::shutdown_within`] with a 60 s grace period.
    pub async fn shutdown(&self) {
        self.shutdown_within(Duration::from_secs(60)).await
    }

    async fn request(&self, task: &TaskId, req: ApiRequest) -> Result<Answer, EngineError> {
        self.lock_task(task).await?;
        let (tx, rx) = oneshot::channel();
        self.inner
            .tx
            .send(Msg::Request {
                task: task.as_str().to_string(),
                req,
                respond: tx,
            })
            .map_err(|_| EngineError::Stopped)?;
        let answer = rx.await.map_err(|_| EngineError::Stopped)??;
        if let Reply::Failed {
            error,
            attempts,
            notices,
        } = answer.reply
        {
            return Err(EngineError::Request {
                task: task.as_str().to_string(),
                message: error,
                attempts,
                notices,
            });
        }
        Ok(answer)
    }

    async fn query<T: Send + 'static>(
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

    /// Takes the task's lock (once per orchestrator), waiting for another process to let go.
    async fn lock_task(&self, task: &TaskId) -> Result<(), EngineError> {
        let id = task.as_str().to_string();
        if self
            .inner
            .locks
            .lock()
            .expect("locks mutex")
            .contains_key(&id)
        {
            return Ok(());
        }
        let path = self.inner.lock_dir.join(format!("{id}.lock"));
        let lock_err = |source| EngineError::Lock {
            task: id.clone(),
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.inner.lock_dir).map_err(lock_err)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(lock_err)?;
        let started = tokio::time::Instant::now();
        let mut warned = false;
        loop {
            match try_flock(&file) {
                Ok(true) => break,
                Ok(false) => {
                    if !warned {
                        tracing::info!(task = %id, "waiting for another taskbox process driving this task");
                        warned = true;
                    }
                    if started.elapsed() >= self.inner.lock_wait {
                        return Err(EngineError::Busy {
                            task: id.clone(),
                            path: path.clone(),
                            waited_secs: started.elapsed().as_secs(),
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(lock_err(e)),
            }
        }
        self.inner
            .locks
            .lock()
            .expect("locks mutex")
            .insert(id, file);
        Ok(())
    }
}

/// Takes an exclusive advisory lock without blocking; `Ok(false)` if another holder has it.
fn try_flock(file: &File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a file descriptor we own; no memory is shared with the kernel.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

fn unexpected(task: &TaskId, reply: Reply) -> EngineError {
    EngineError::Request {
        task: task.as_str().to_string(),
        message: format!("unexpected answer from the engine: {reply:?}"),
        attempts: 0,
        notices: Vec::new(),
    }
}

enum ApiRequest {
    Run { command: String, timeout_ms: u64 },
    Suspend,
    Resume,
}

struct Answer {
    reply: Reply,
    output: Option<ExecOutput>,
}

type QueryFn = Box<dyn FnOnce(&EventLoop) + Send>;

/// Where a request's answer goes.
type Responder = oneshot::Sender<Result<Answer, EngineError>>;

enum Msg {
    Request {
        task: String,
        req: ApiRequest,
        respond: oneshot::Sender<Result<Answer, EngineError>>,
    },
    Outcome {
        task: String,
        event: Event,
        output: Option<ExecOutput>,
    },
    Timer {
        task: String,
        timer: TimerKind,
    },
    Query(QueryFn),
    Shutdown {
        done: oneshot::Sender<()>,
    },
}

struct EventLoop {
    store: Store,
    provider: Arc<dyn SandboxProvider>,
    clock: Arc<dyn Clock>,
    jitter: Jitter,
    settings: TaskSettings,
    installation_id: String,
    tasks: HashMap<String, Task>,
    /// Callers waiting for an answer. Ordered, so that when the loop stops they are woken in a
    /// deterministic order (simulations reproduce bit for bit).
    waiters: std::collections::BTreeMap<(String, u64), Responder>,
    outputs: HashMap<(String, u64), ExecOutput>,
    timers: HashMap<(String, TimerKind), JoinHandle<()>>,
    inflight: usize,
    /// Tasks whose sandbox is being probed after a restart; their requests wait for the answer.
    probing: std::collections::HashSet<String>,
    deferred: HashMap<String, Vec<(ApiRequest, Responder)>>,
    creates: Arc<Semaphore>,
    tx: mpsc::UnboundedSender<Msg>,
    changes: broadcast::Sender<StateChange>,
    shutdown: Option<oneshot::Sender<()>>,
    /// Transitions stepped but not yet committed; see [`EventLoop::flush`].
    staged: Vec<Staged>,
}

/// Most messages handled before their transitions are committed together.
const MAX_BATCH_MESSAGES: usize = 512;

/// A transition waiting for the group commit: applied to the in-memory task already, its
/// commands held back until it is durable.
struct Staged {
    task: String,
    at: Millis,
    event: Event,
    state_before: TaskState,
    /// The task before the transition (`None`: it did not exist), restored if the transition
    /// cannot be committed.
    task_before: Option<Task>,
    task_after: Task,
    commands: Vec<Command>,
}

impl EventLoop {
    /// Group commit: every message already waiting is handled (stepped, the tasks updated in
    /// memory) before their transitions are committed in one transaction — one disk sync for
    /// the lot — and only then are their commands performed. With one task the batch is one
    /// transition and nothing changes; with thousands, the journal keeps up.
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        while let Some(msg) = rx.recv().await {
            self.handle(msg);
            for _ in 1..MAX_BATCH_MESSAGES {
                match rx.try_recv() {
                    Ok(msg) => self.handle(msg),
                    Err(_) => break,
                }
            }
            self.flush();
            if self.shutdown.is_some() && self.inflight == 0 {
                if let Some(done) = self.shutdown.take() {
                    let _ = done.send(());
                }
                break;
            }
        }
        for (_, h) in self.timers.drain() {
            h.abort();
        }
    }

    fn handle(&mut self, msg: Msg) {
        {
            match msg {
                Msg::Request { task, req, respond } => {
                    if self.shutdown.is_some() {
                        let _ = respond.send(Err(EngineError::Stopped));
                        return;
                    }
                    self.on_request(task, req, respond);
                }
                Msg::Outcome {
                    task,
                    event,
                    output,
                } => {
                    self.inflight -= 1;
                    let probed = matches!(event, Event::SandboxProbed { .. });
                    if let (Some(out), Event::CommandExited { request_id, .. }) = (output, &event) {
                        self.outputs.insert((task.clone(), *request_id), out);
                    }
                    if let Err(e) = self.apply(&task, event) {
                        warn!(task = %task, error = %e, "could not apply a provider outcome");
                    }
                    if probed && self.probing.remove(&task) {
                        for (req, respond) in self.deferred.remove(&task).unwrap_or_default() {
                            self.on_request(task.clone(), req, respond);
                        }
                    }
                }
                Msg::Timer { task, timer } => {
                    self.timers.remove(&(task.clone(), timer));
                    if self.shutdown.is_none() {
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
                Msg::Shutdown { done } => {
                    for (_, h) in self.timers.drain() {
                        h.abort();
                    }
                    self.shutdown = Some(done);
                }
            }
        }
    }

    fn on_request(
        &mut self,
        task: String,
        req: ApiRequest,
        respond: oneshot::Sender<Result<Answer, EngineError>>,
    ) {
        if let Err(e) = self.ensure_loaded(&task) {
            let _ = respond.send(Err(e));
            return;
        }
        if self.probing.contains(&task) {
            // Recovery is asking whether the sandbox a previous process left still lives; a
            // command started before the answer could land on a dead sandbox and fail, when
            // waiting lets the engine restore the files first and run it.
            self.deferred.entry(task).or_default().push((req, respond));
            return;
        }
        let request_id = self.tasks[&task].last_request_id + 1;
        let event = match req {
            ApiRequest::Run {
                command,
                timeout_ms,
            } => Event::RunRequested {
                request_id,
                command,
                timeout_ms,
            },
            ApiRequest::Suspend => Event::SuspendRequested { request_id },
            ApiRequest::Resume => Event::ResumeRequested { request_id },
        };
        self.waiters.insert((task.clone(), request_id), respond);
        if let Err(e) = self.apply(&task, event) {
            if let Some(w) = self.waiters.remove(&(task, request_id)) {
                let _ = w.send(Err(e));
            }
        }
    }

    /// Loads a task into memory the first time this process touches it: creates it, brings its
    /// settings up to date, and recovers whatever a previous process left in flight.
    fn ensure_loaded(&mut self, id: &str) -> Result<(), EngineError> {
        if self.tasks.contains_key(id) {
            return Ok(());
        }
        TaskId::new(id)?;
        match self.store.load_task(id)? {
            None => {
                let now = self.clock.now_ms();
                let task = Task::new(id, self.settings.clone(), now);
                let event = Event::SettingsChanged {
                    settings: self.settings.clone(),
                };
                self.staged.push(Staged {
                    task: id.to_string(),
                    at: now,
                    event,
                    state_before: task.state,
                    task_before: None,
                    task_after: task.clone(),
                    commands: Vec::new(),
                });
                self.tasks.insert(id.to_string(), task);
            }
            Some(task) => {
                let needs_recovery = task.state != TaskState::Idle
                    && task.state != TaskState::Expired
                    || !task.queue.is_empty()
                    || task
                        .snapshots
                        .iter()
                        .any(|s| s.status == crate::core::SnapshotStatus::Deleting);
                let stale_settings = task.settings != self.settings;
                self.tasks.insert(id.to_string(), task);
                if stale_settings {
                    let settings = self.settings.clone();
                    self.apply(id, Event::SettingsChanged { settings })?;
                }
                if needs_recovery {
                    self.apply(id, Event::Recovered)?;
                }
            }
        }
        Ok(())
    }

    /// One event: step, and stage the transition for the next [`EventLoop::flush`], which
    /// commits it and then performs its commands.
    fn apply(&mut self, id: &str, event: Event) -> Result<(), EngineError> {
        let now = self.clock.now_ms();
        let Some(task) = self.tasks.get(id) else {
            debug!(task = %id, event = event.name(), "event for a task not loaded here; ignored");
            return Ok(());
        };
        let span = info_span!("event", task_id = %id, state = %task.state, event = event.name());
        let _guard = span.enter();
        let tr = step(task, event.clone(), now)?;
        let before = self.tasks.insert(id.to_string(), tr.next.clone());
        self.staged.push(Staged {
            task: id.to_string(),
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
        let records: Vec<TransitionRecord<'_>> = staged
            .iter()
            .map(|s| TransitionRecord {
                at: s.at,
                event: &s.event,
                state_before: s.state_before,
                task_after: &s.task_after,
                commands: &s.commands,
            })
            .collect();
        let batch = self.store.commit_batch(&records);
        drop(records);
        if batch.is_ok() {
            for s in staged {
                self.committed(s);
            }
            return;
        }
        let mut failed: HashMap<String, String> = HashMap::new();
        for s in staged {
            if let Some(message) = failed.get(&s.task) {
                let message = format!("an earlier transition could not be journaled: {message}");
                self.dropped(&s, message);
                continue;
            }
            let one = self.store.commit(&TransitionRecord {
                at: s.at,
                event: &s.event,
                state_before: s.state_before,
                task_after: &s.task_after,
                commands: &s.commands,
            });
            match one {
                Ok(_) => self.committed(s),
                Err(e) => {
                    let message = e.to_string();
                    warn!(task = %s.task, event = s.event.name(), error = %message,
                        "could not journal a transition; the task stays where it was");
                    match &s.task_before {
                        Some(t) => self.tasks.insert(s.task.clone(), t.clone()),
                        None => self.tasks.remove(&s.task),
                    };
                    self.fail_request(&s, EngineError::Store(e));
                    failed.insert(s.task, message);
                }
            }
        }
    }

    /// A transition is durable: announce it and perform its commands.
    fn committed(&mut self, s: Staged) {
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
            self.perform(&s.task, cmd, s.at);
        }
    }

    /// A transition dropped because an earlier one of its task could not be committed.
    fn dropped(&mut self, s: &Staged, message: String) {
        warn!(task = %s.task, event = s.event.name(), "transition dropped: {message}");
        self.fail_request(
            s,
            EngineError::Request {
                task: s.task.clone(),
                message,
                attempts: 0,
                notices: Vec::new(),
            },
        );
    }

    /// If `s` was a caller's request, answers it with `err`.
    fn fail_request(&mut self, s: &Staged, err: EngineError) {
        let request_id = match &s.event {
            Event::RunRequested { request_id, .. }
            | Event::SuspendRequested { request_id }
            | Event::ResumeRequested { request_id } => *request_id,
            _ => return,
        };
        if let Some(w) = self.waiters.remove(&(s.task.clone(), request_id)) {
            let _ = w.send(Err(err));
        }
    }

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

    fn perform(&mut self, id: &str, cmd: Command, now: Millis) {
        let p = self.provider.clone();
        match cmd {
            Command::CreateSandbox {
                generation,
                source_snapshot,
                timeout_ms,
            } => {
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
                    let event = match p.create_sandbox(&spec).await {
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
                    };
                    (event, None)
                });
            }
            Command::RunCommand {
                request_id,
                sandbox_id,
                command,
                timeout_ms,
            } => {
                self.spawn_op(id, async move {
                    let req = ExecRequest {
                        command,
                        timeout_ms,
                    };
                    match p.exec(&sandbox_id, &req).await {
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
                });
            }
            Command::TakeSnapshot { sandbox_id, seq } => {
                let task = id.to_string();
                self.spawn_op(id, async move {
                    let event = match p.snapshot(&task, &sandbox_id, seq).await {
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
                    };
                    (event, None)
                });
            }
            Command::StopSandbox { sandbox_id } => {
                self.spawn_op(id, async move {
                    let event = match p.stop_sandbox(&sandbox_id).await {
                        Ok(()) => Event::SandboxStopped { sandbox_id },
                        Err(e) => Event::StopFailed {
                            sandbox_id,
                            failure: e.to_failure(),
                        },
                    };
                    (event, None)
                });
            }
            Command::ExtendTimeout {
                sandbox_id,
                duration_ms,
            } => {
                self.spawn_op(id, async move {
                    let event = match p.extend_timeout(&sandbox_id, duration_ms).await {
                        Ok(deadline) => Event::TimeoutExtended {
                            sandbox_id,
                            deadline,
                        },
                        Err(e) => Event::ExtendFailed {
                            sandbox_id,
                            failure: e.to_failure(),
                        },
                    };
                    (event, None)
                });
            }
            Command::DeleteSnapshot { snapshot_id } => {
                self.spawn_op(id, async move {
                    let event = match p.delete_snapshot(&snapshot_id).await {
                        Ok(()) => Event::SnapshotDeleted { snapshot_id },
                        Err(e) => Event::DeleteFailed {
                            snapshot_id,
                            failure: e.to_failure(),
                        },
                    };
                    (event, None)
                });
            }
            Command::ProbeSandbox { sandbox_id } => {
                self.probing.insert(id.to_string());
                let known_deadline = self
                    .tasks
                    .get(id)
                    .and_then(|t| t.sandbox.as_ref())
                    .map(|s| s.deadline);
                self.spawn_op(id, async move {
                    // A probe is read-only, so transient failures are retried here, briefly.
                    // If the provider stays unreachable, the sandbox is assumed alive until its
                    // recorded deadline: declaring it gone would drop files it may still hold,
                    // while the next command finds out the truth anyway.
                    let mut delay = Duration::from_millis(200);
                    for attempt in 1..=5 {
                        match p.probe_sandbox(&sandbox_id).await {
                            Ok(alive) => return (Event::SandboxProbed { sandbox_id, alive }, None),
                            Err(e) if e.is_transient() && attempt < 5 => {
                                tokio::time::sleep(delay).await;
                                delay *= 2;
                            }
                            Err(e) => {
                                warn!(sandbox = %sandbox_id, error = %e, "could not probe the sandbox; assuming it lives until its recorded deadline");
                                break;
                            }
                        }
                    }
                    (
                        Event::SandboxProbed {
                            sandbox_id,
                            alive: known_deadline,
                        },
                        None,
                    )
                });
            }
            Command::ScheduleTimer { timer, at } => {
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
            Command::Reply { request_id, reply } => {
                let key = (id.to_string(), request_id);
                let output = self.outputs.remove(&key);
                if let Some(w) = self.waiters.remove(&key) {
                    let _ = w.send(Ok(Answer { reply, output }));
                }
            }
        }
    }
}

/// The SQLite store's file name in a data dir.
pub const STORE_FILE: &str = "taskbox.db";

/// The SQLite store of a data dir.
pub fn store_file(data_dir: &Path) -> PathBuf {
    data_dir.join(STORE_FILE)
}

/// Where taskbox keeps its config and data.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The TOML config file.
    pub config_file: PathBuf,
    /// The data dir (SQLite store, local workspaces, archives, locks).
    pub data_dir: PathBuf,
}

impl Paths {
    /// `TASKBOX_HOME` (config at `$TASKBOX_HOME/config.toml`, data in `$TASKBOX_HOME/data`), or
    /// the XDG dirs (`$XDG_CONFIG_HOME/taskbox/config.toml`, `$XDG_DATA_HOME/taskbox`).
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Paths {
        let non_empty = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        if let Some(home) = non_empty("TASKBOX_HOME") {
            return Paths::under(&home);
        }
        let home = non_empty("HOME").unwrap_or_else(|| PathBuf::from("."));
        let config = non_empty("XDG_CONFIG_HOME").unwrap_or_else(|| home.join(".config"));
        let data = non_empty("XDG_DATA_HOME").unwrap_or_else(|| home.join(".local/share"));
        Paths {
            config_file: config.join("taskbox").join("config.toml"),
            data_dir: data.join("taskbox"),
        }
    }

    /// The SQLite store in the data dir.
    pub fn store_file(&self) -> PathBuf {
        store_file(&self.data_dir)
    }

    /// Config and data under one directory.
    pub fn under(home: &Path) -> Paths {
        Paths {
            config_file: home.join("config.toml"),
            data_dir: home.join("data"),
        }
    }
}
