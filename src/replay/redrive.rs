//! Re-drive: run the real event loop again over a recorded journal and check that it makes the
//! same provider calls, in the same order, and gives callers the same answers.
//!
//! [`verify`](super::verify) checks the pure core; this checks everything around it — the event
//! loop, the order in which it performs commands, timers, recovery after a restart — by running
//! an [`Orchestrator`] (in a scratch data directory) against a [`ReplayProvider`] that answers
//! each call with the outcome the journal recorded for it, on virtual time (a paused tokio clock
//! read through a [`ReplayClock`]): requests are issued at their recorded times, and each answer
//! is delivered at the time its outcome was recorded, so the engine sees the same `now`s.
//!
//! A journal written by the CLI spans many processes, and a process boundary matters (a new
//! process recovers the task; timers die with the old one). The journal marks every boundary
//! that matters: loading a task that is mid-flight commits `recovered`, and loading it with
//! changed settings commits `settings_changed`. The re-drive therefore runs one orchestrator
//! *session* per stretch of entries between such markers, shutting the previous one down first.
//! Outcomes are paired with the calls of their own session, first come first served by key
//! (a sandbox's generation, a request id, a snapshot's seq, an id); a call whose outcome never
//! made it into the journal (the process died) is left unanswered, as it was.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use serde::Serialize;

use crate::clock::Clock;
use crate::config::Config;
use crate::core::{
    Command, Event, Failure, FailureKind, Millis, RequestId, TaskSettings, TaskState,
};
use crate::engine::{EngineError, Orchestrator};
use crate::ids::TaskId;
use crate::provider::{
    sandbox_name, ExecOutput, ExecRequest, ListedResource, ProviderError, ProviderFuture,
    SandboxInfo, SandboxProvider, SandboxSpec, SnapshotInfo,
};
use crate::retry::Jitter;
use crate::store::{JournalEntry, Store, StoreError};

use super::{diff, Divergence, DivergenceKind};

/// One provider call, as the engine makes it (the arguments that decide what happens).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum ProviderCall {
    /// `create_sandbox`.
    CreateSandbox {
        /// The task.
        task_id: String,
        /// The generation.
        generation: u64,
        /// The sandbox name.
        name: String,
        /// The snapshot to restore.
        source_snapshot: Option<String>,
        /// Platform timeout.
        timeout_ms: u64,
    },
    /// `exec`.
    Exec {
        /// The sandbox.
        sandbox_id: String,
        /// The shell command.
        command: String,
        /// Its timeout.
        timeout_ms: u64,
    },
    /// `snapshot`.
    Snapshot {
        /// The task.
        task_id: String,
        /// The sandbox.
        sandbox_id: String,
        /// The snapshot sequence number.
        seq: u64,
    },
    /// `stop_sandbox`.
    StopSandbox {
        /// The sandbox.
        sandbox_id: String,
    },
    /// `extend_timeout`.
    ExtendTimeout {
        /// The sandbox.
        sandbox_id: String,
        /// By how much.
        duration_ms: u64,
    },
    /// `delete_snapshot`.
    DeleteSnapshot {
        /// The snapshot.
        snapshot_id: String,
    },
    /// `probe_sandbox`.
    ProbeSandbox {
        /// The sandbox.
        sandbox_id: String,
    },
}

impl ProviderCall {
    /// The call an engine of installation `installation_id` makes to perform `command` for
    /// `task_id` (`None` for commands that are not provider calls: timers and replies).
    pub fn from_command(
        installation_id: &str,
        task_id: &str,
        command: &Command,
    ) -> Option<ProviderCall> {
        Some(match command {
            Command::CreateSandbox {
                generation,
                source_snapshot,
                timeout_ms,
            } => ProviderCall::CreateSandbox {
                task_id: task_id.to_string(),
                generation: *generation,
                name: sandbox_name(installation_id, task_id, *generation),
                source_snapshot: source_snapshot.clone(),
                timeout_ms: *timeout_ms,
            },
            Command::RunCommand {
                sandbox_id,
                command,
                timeout_ms,
                ..
            } => ProviderCall::Exec {
                sandbox_id: sandbox_id.clone(),
                command: command.clone(),
                timeout_ms: *timeout_ms,
            },
            Command::TakeSnapshot { sandbox_id, seq } => ProviderCall::Snapshot {
                task_id: task_id.to_string(),
                sandbox_id: sandbox_id.clone(),
                seq: *seq,
            },
            Command::StopSandbox { sandbox_id } => ProviderCall::StopSandbox {
                sandbox_id: sandbox_id.clone(),
            },
            Command::ExtendTimeout {
                sandbox_id,
                duration_ms,
            } => ProviderCall::ExtendTimeout {
                sandbox_id: sandbox_id.clone(),
                duration_ms: *duration_ms,
            },
            Command::DeleteSnapshot { snapshot_id } => ProviderCall::DeleteSnapshot {
                snapshot_id: snapshot_id.clone(),
            },
            Command::ProbeSandbox { sandbox_id } => ProviderCall::ProbeSandbox {
                sandbox_id: sandbox_id.clone(),
            },
            Command::ScheduleTimer { .. } | Command::Reply { .. } => return None,
        })
    }

    /// The operation's name (`create_sandbox`, `exec`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            ProviderCall::CreateSandbox { .. } => "create_sandbox",
            ProviderCall::Exec { .. } => "exec",
            ProviderCall::Snapshot { .. } => "snapshot",
            ProviderCall::StopSandbox { .. } => "stop_sandbox",
            ProviderCall::ExtendTimeout { .. } => "extend_timeout",
            ProviderCall::DeleteSnapshot { .. } => "delete_snapshot",
            ProviderCall::ProbeSandbox { .. } => "probe_sandbox",
        }
    }
}

/// What pairs a call with its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    Create(u64),
    Run(RequestId),
    Snapshot(u64),
    Stop(String),
    Extend(String),
    Delete(String),
    Probe(String),
}

fn command_key(c: &Command) -> Option<Key> {
    Some(match c {
        Command::CreateSandbox { generation, .. } => Key::Create(*generation),
        Command::RunCommand { request_id, .. } => Key::Run(*request_id),
        Command::TakeSnapshot { seq, .. } => Key::Snapshot(*seq),
        Command::StopSandbox { sandbox_id } => Key::Stop(sandbox_id.clone()),
        Command::ExtendTimeout { sandbox_id, .. } => Key::Extend(sandbox_id.clone()),
        Command::DeleteSnapshot { snapshot_id } => Key::Delete(snapshot_id.clone()),
        Command::ProbeSandbox { sandbox_id } => Key::Probe(sandbox_id.clone()),
        Command::ScheduleTimer { .. } | Command::Reply { .. } => return None,
    })
}

fn outcome_key(e: &Event) -> Option<Key> {
    Some(match e {
        Event::SandboxReady { generation, .. } | Event::CreateFailed { generation, .. } => {
            Key::Create(*generation)
        }
        Event::CommandExited { request_id, .. } | Event::CommandFailed { request_id, .. } => {
            Key::Run(*request_id)
        }
        Event::SnapshotTaken { seq, .. } | Event::SnapshotFailed { seq, .. } => Key::Snapshot(*seq),
        Event::SandboxStopped { sandbox_id } | Event::StopFailed { sandbox_id, .. } => {
            Key::Stop(sandbox_id.clone())
        }
        Event::TimeoutExtended { sandbox_id, .. } | Event::ExtendFailed { sandbox_id, .. } => {
            Key::Extend(sandbox_id.clone())
        }
        Event::SnapshotDeleted { snapshot_id } | Event::DeleteFailed { snapshot_id, .. } => {
            Key::Delete(snapshot_id.clone())
        }
        Event::SandboxProbed { sandbox_id, .. } => Key::Probe(sandbox_id.clone()),
        Event::RunRequested { .. }
        | Event::SuspendRequested { .. }
        | Event::ResumeRequested { .. }
        | Event::SettingsChanged { .. }
        | Event::TimerFired { .. }
        | Event::Recovered => return None,
    })
}

/// A call the recording made, and the outcome it got (if the journal has one).
#[derive(Debug, Clone)]
struct Expected {
    call: ProviderCall,
    key: Key,
    /// Index of the entry that emitted the command.
    entry: usize,
    /// When and what the provider answered.
    answer: Option<(Millis, Event)>,
}

/// The entries one process committed (as far as the journal tells).
#[derive(Debug, Clone)]
struct Session {
    first: usize,
    last: usize,
    settings: TaskSettings,
    requests: Vec<usize>,
}

/// The outcome of re-driving one task.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedriveReport {
    /// The task.
    pub task_id: String,
    /// Orchestrator sessions run (one per process the journal shows).
    pub sessions: usize,
    /// Provider calls in the recording.
    pub calls_expected: usize,
    /// Provider calls the engine made.
    pub calls_made: usize,
    /// Replies (answers to callers) in the recording.
    pub replies: usize,
    /// The first difference, if any.
    pub divergence: Option<Divergence>,
}

/// Why a journal could not be re-driven at all (as opposed to re-driving and diverging).
#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    /// The journal has a shape the re-drive cannot reproduce.
    #[error("task {task}: cannot re-drive the journal: {why}")]
    Unsupported {
        /// The task.
        task: String,
        /// Why, naming the entries involved.
        why: String,
    },
    /// The engine failed to start or stop.
    #[error("task {task}: the re-driven engine failed")]
    Engine {
        /// The task.
        task: String,
        /// The cause (boxed: engine errors are large, and this one is rare).
        #[source]
        source: Box<EngineError>,
    },
    /// The re-driven journal could not be read back.
    #[error("task {task}: cannot read the re-driven journal")]
    Store {
        /// The task.
        task: String,
        /// The cause (boxed, like the engine's).
        #[source]
        source: Box<StoreError>,
    },
    /// No scratch directory could be made for the re-drive's store.
    #[error("cannot create a scratch directory under {}", path.display())]
    Scratch {
        /// Where.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The virtual-time runtime could not be built.
    #[error("cannot start the re-drive's runtime")]
    Runtime(#[source] std::io::Error),
    /// The re-drive thread panicked (a bug in the engine or the re-drive).
    #[error("task {task}: the re-drive panicked: {message}")]
    Panicked {
        /// The task.
        task: String,
        /// The panic message.
        message: String,
    },
}

/// Re-drives every task in `entries` (each task on its own, in the order they first appear).
/// Runs on its own thread and virtual-time runtime, so it may be called from anywhere,
/// including from inside another tokio runtime.
pub fn redrive(entries: &[JournalEntry]) -> Result<Vec<RedriveReport>, RedriveError> {
    super::group_by_task(entries)
        .into_iter()
        .map(|(id, es)| {
            let es: Vec<JournalEntry> = es.into_iter().cloned().collect();
            redrive_task(&id, es)
        })
        .collect()
}

fn redrive_task(task_id: &str, entries: Vec<JournalEntry>) -> Result<RedriveReport, RedriveError> {
    let task = TaskId::new(task_id).map_err(|e| RedriveError::Unsupported {
        task: task_id.to_string(),
        why: e.to_string(),
    })?;
    let scratch = Scratch::new()?;
    let root = scratch.path.clone();
    let scratch_err = |source| RedriveError::Scratch {
        path: root.clone(),
        source,
    };
    // The engine names sandboxes after its installation, and the scratch store's installation
    // cannot be the recording's: expect the names the engine makes in this one.
    let first_dir = session_dir(&root, 0).map_err(scratch_err)?;
    let installation_id = Store::open(&first_dir.join(STORE_FILE))
        .map_err(|source| RedriveError::Store {
            task: task_id.to_string(),
            source: Box::new(source),
        })?
        .installation_id()
        .to_string();
    let (sessions, expected) = plan(&installation_id, task_id, &entries)?;
    let task_name = task_id.to_string();
    let joined = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .map_err(RedriveError::Runtime)?;
            rt.block_on(drive(task, &entries, sessions, expected, root))
        })
        .join()
    });
    let outcome = joined.map_err(|panic| RedriveError::Panicked {
        task: task_name.clone(),
        message: panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into()),
    })??;
    drop(scratch);
    Ok(outcome)
}

fn is_load_marker(e: &JournalEntry) -> bool {
    matches!(e.event, Event::Recovered | Event::SettingsChanged { .. })
}

/// Splits the journal into sessions and pairs each recorded call with its outcome.
fn plan(
    installation_id: &str,
    task_id: &str,
    entries: &[JournalEntry],
) -> Result<(Vec<Session>, Vec<Expected>), RedriveError> {
    let unsupported = |why: String| RedriveError::Unsupported {
        task: task_id.to_string(),
        why,
    };
    let Some(first) = entries.first() else {
        return Err(unsupported("the journal is empty".into()));
    };
    let Event::SettingsChanged { settings } = &first.event else {
        return Err(unsupported(format!(
            "entry #{} is {}, not the task's creation (run `taskbox replay` without --redrive to see why)",
            first.task_seq,
            first.event.name()
        )));
    };
    let mut sessions: Vec<Session> = vec![Session {
        first: 0,
        last: 0,
        settings: settings.clone(),
        requests: Vec::new(),
    }];
    for (i, e) in entries.iter().enumerate().skip(1) {
        if is_load_marker(e) && !is_load_marker(&entries[i - 1]) {
            sessions.push(Session {
                first: i,
                last: i,
                settings: entries[i - 1].task_after.settings.clone(),
                requests: Vec::new(),
            });
        }
        let s = sessions
            .last_mut()
            .expect("there is always a first session");
        s.last = i;
        match &e.event {
            Event::SettingsChanged { settings } => s.settings = settings.clone(),
            Event::RunRequested { .. }
            | Event::SuspendRequested { .. }
            | Event::ResumeRequested { .. } => s.requests.push(i),
            _ => {}
        }
    }
    if let Some(s) = sessions
        .iter()
        .find(|s| s.requests.is_empty() && s.first > 0)
    {
        return Err(unsupported(format!(
            "entries #{}–#{} were committed by a process that made no request, and the \
             re-drive can only load a task through a request",
            entries[s.first].task_seq, entries[s.last].task_seq
        )));
    }
    let mut expected: Vec<Expected> = Vec::new();
    for s in &sessions {
        let open_from = expected.len();
        for (i, e) in entries.iter().enumerate().take(s.last + 1).skip(s.first) {
            if let Some(key) = outcome_key(&e.event) {
                let slot = expected[open_from..]
                    .iter_mut()
                    .find(|x| x.answer.is_none() && x.key == key);
                match slot {
                    Some(x) => x.answer = Some((e.at, e.event.clone())),
                    None => {
                        return Err(unsupported(format!(
                        "entry #{} ({}) answers no provider call made earlier by the same process",
                        e.task_seq,
                        e.event.name()
                    )))
                    }
                }
            }
            for c in &e.commands {
                if let (Some(call), Some(key)) = (
                    ProviderCall::from_command(installation_id, task_id, c),
                    command_key(c),
                ) {
                    expected.push(Expected {
                        call,
                        key,
                        entry: i,
                        answer: None,
                    });
                }
            }
        }
    }
    Ok((sessions, expected))
}

/// The engine's settings come from a [`Config`]; this is the config that yields `settings`.
fn config_for(task: &str, settings: &TaskSettings) -> Result<Config, RedriveError> {
    let secs = |ms: u64| ms / 1000;
    let mut c = Config::default();
    let t = &mut c.terminal;
    t.container_persistent = settings.persistent;
    t.timeout = secs(settings.command_timeout_ms);
    t.lifetime_seconds = secs(settings.idle_lifetime_ms);
    t.sandbox_timeout_seconds = secs(settings.sandbox_timeout_ms);
    t.max_sandbox_lifetime_seconds = secs(settings.max_sandbox_lifetime_ms);
    t.checkpoint_margin_seconds = secs(settings.checkpoint_margin_ms);
    t.keep_snapshots = settings.keep_snapshots;
    if c.task_settings() != *settings {
        return Err(RedriveError::Unsupported {
            task: task.to_string(),
            why: format!(
                "its settings cannot be expressed as a taskbox configuration, so the engine \
                 cannot be started with them: {settings:?}"
            ),
        });
    }
    Ok(c)
}

/// A clock on tokio's (paused) time that reads `origin_ms` at creation, and converts journal
/// times to tokio instants so that the re-drive can wait for them.
#[derive(Debug, Clone, Copy)]
pub struct ReplayClock {
    origin_ms: Millis,
    origin: tokio::time::Instant,
}

impl ReplayClock {
    /// A clock reading `origin_ms` now (call inside the runtime whose time it follows).
    pub fn starting_at(origin_ms: Millis) -> ReplayClock {
        ReplayClock {
            origin_ms,
            origin: tokio::time::Instant::now(),
        }
    }

    /// The tokio instant at which this clock reads `ms` (its origin, for earlier times).
    pub fn instant(&self, ms: Millis) -> tokio::time::Instant {
        self.origin + Duration::from_millis(ms.saturating_sub(self.origin_ms))
    }

    /// Waits until the clock reads `ms`.
    pub async fn sleep_until(&self, ms: Millis) {
        tokio::time::sleep_until(self.instant(ms)).await
    }
}

impl Clock for ReplayClock {
    fn now_ms(&self) -> Millis {
        self.origin_ms + self.origin.elapsed().as_millis() as Millis
    }
}

/// A [`SandboxProvider`] that answers each call with the outcome the journal recorded for it,
/// at the time it was recorded, and records the calls it receives. The first call that is not
/// the next one recorded is refused (a permanent failure) and remembered as the mismatch.
pub struct ReplayProvider {
    clock: ReplayClock,
    state: Mutex<ReplayState>,
}

struct ReplayState {
    expected: Vec<Expected>,
    next: usize,
    received: Vec<ProviderCall>,
    mismatch: Option<usize>,
}

enum Answer {
    At(Millis, Event),
    Never,
    Refuse,
}

impl ReplayProvider {
    fn new(expected: Vec<Expected>, clock: ReplayClock) -> ReplayProvider {
        ReplayProvider {
            clock,
            state: Mutex::new(ReplayState {
                expected,
                next: 0,
                received: Vec::new(),
                mismatch: None,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, ReplayState> {
        // A poisoned lock means a panic in another call already failed the re-drive; the
        // state is still the best account of what happened.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The calls received so far, in order.
    pub fn calls_received(&self) -> Vec<ProviderCall> {
        self.state().received.clone()
    }

    /// Whether a call did not match the recording.
    pub fn diverged(&self) -> bool {
        self.state().mismatch.is_some()
    }

    fn take(&self, call: ProviderCall) -> Answer {
        let mut st = self.state();
        st.received.push(call.clone());
        if st.mismatch.is_some() {
            return Answer::Refuse;
        }
        let next = st.next;
        match st.expected.get(next) {
            Some(exp) if exp.call == call => {
                let answer = match &exp.answer {
                    Some((at, ev)) => Answer::At(*at, ev.clone()),
                    None => Answer::Never,
                };
                st.next += 1;
                answer
            }
            _ => {
                st.mismatch = Some(st.received.len() - 1);
                Answer::Refuse
            }
        }
    }

    async fn answer(
        &self,
        call: ProviderCall,
        operation: &'static str,
    ) -> Result<Event, ProviderError> {
        match self.take(call) {
            Answer::At(at, event) => {
                self.clock.sleep_until(at).await;
                Ok(event)
            }
            // The recording never got an answer (its process ended first): neither do we.
            Answer::Never => std::future::pending().await,
            Answer::Refuse => Err(ProviderError::new(
                FailureKind::Permanent,
                operation,
                "replay: the recorded journal has no such call at this point",
            )),
        }
    }
}

/// The recorded failure as a provider error that the engine turns back into the same failure
/// (`ProviderError` displays as `operation: message`, which is how the failure was recorded).
fn recorded_error(f: &Failure) -> ProviderError {
    let (op, msg) = f
        .message
        .split_once(": ")
        .map_or(("replay", f.message.as_str()), |(o, m)| (intern(o), m));
    ProviderError::new(f.kind.clone(), op, msg)
}

/// Operation names are `&'static str` in [`ProviderError`]; recorded ones are leaked once per
/// distinct name, and there are only a handful (bounded below so a hostile file cannot grow it).
fn intern(op: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<BTreeSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(|| Mutex::new(BTreeSet::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(n) = names.get(op) {
        return n;
    }
    if names.len() >= 64 {
        return "replay";
    }
    let leaked: &'static str = Box::leak(op.to_string().into_boxed_str());
    names.insert(leaked);
    leaked
}

fn wrong_outcome(operation: &'static str, ev: &Event) -> ProviderError {
    ProviderError::new(
        FailureKind::Permanent,
        operation,
        format!(
            "replay: the recorded outcome {} does not answer this call",
            ev.name()
        ),
    )
}

impl SandboxProvider for ReplayProvider {
    fn name(&self) -> &'static str {
        "replay"
    }

    fn create_sandbox<'a>(&'a self, spec: &'a SandboxSpec) -> ProviderFuture<'a, SandboxInfo> {
        let call = ProviderCall::CreateSandbox {
            task_id: spec.task_id.clone(),
            generation: spec.generation,
            name: spec.name.clone(),
            source_snapshot: spec.source_snapshot.clone(),
            timeout_ms: spec.timeout_ms,
        };
        Box::pin(async move {
            match self.answer(call, "create sandbox").await? {
                Event::SandboxReady {
                    sandbox_id,
                    name,
                    deadline,
                    ..
                } => Ok(SandboxInfo {
                    id: sandbox_id,
                    name,
                    deadline,
                }),
                Event::CreateFailed { failure, .. } => Err(recorded_error(&failure)),
                other => Err(wrong_outcome("create sandbox", &other)),
            }
        })
    }

    fn exec<'a>(
        &'a self,
        sandbox_id: &'a str,
        req: &'a ExecRequest,
    ) -> ProviderFuture<'a, ExecOutput> {
        let call = ProviderCall::Exec {
            sandbox_id: sandbox_id.to_string(),
            command: req.command.clone(),
            timeout_ms: req.timeout_ms,
        };
        Box::pin(async move {
            let started = self.clock.now_ms();
            match self.answer(call, "run command").await? {
                // Output is not journaled; only the exit status decides anything.
                Event::CommandExited {
                    exit_code,
                    timed_out,
                    ..
                } => Ok(ExecOutput {
                    exit_code,
                    timed_out,
                    stdout: String::new(),
                    stderr: String::new(),
                    duration_ms: self.clock.now_ms().saturating_sub(started),
                }),
                Event::CommandFailed { failure, .. } => Err(recorded_error(&failure)),
                other => Err(wrong_outcome("run command", &other)),
            }
        })
    }

    fn snapshot<'a>(
        &'a self,
        task_id: &'a str,
        sandbox_id: &'a str,
        seq: u64,
    ) -> ProviderFuture<'a, SnapshotInfo> {
        let call = ProviderCall::Snapshot {
            task_id: task_id.to_string(),
            sandbox_id: sandbox_id.to_string(),
            seq,
        };
        Box::pin(async move {
            match self.answer(call, "take snapshot").await? {
                Event::SnapshotTaken {
                    snapshot_id,
                    size_bytes,
                    expires_at,
                    ..
                } => Ok(SnapshotInfo {
                    id: snapshot_id,
                    size_bytes,
                    expires_at,
                }),
                Event::SnapshotFailed { failure, .. } => Err(recorded_error(&failure)),
                other => Err(wrong_outcome("take snapshot", &other)),
            }
        })
    }

    fn stop_sandbox<'a>(&'a self, sandbox_id: &'a str) -> ProviderFuture<'a, ()> {
        let call = ProviderCall::StopSandbox {
            sandbox_id: sandbox_id.to_string(),
        };
        Box::pin(async move {
            match self.answer(call, "stop sandbox").await? {
                Event::SandboxStopped { .. } => Ok(()),
                Event::StopFailed { failure, .. } => Err(recorded_error(&failure)),
                other => Err(wrong_outcome("stop sandbox", &other)),
            }
        })
    }

    fn extend_timeout<'a>(
        &'a self,
        sandbox_id: &'a str,
        duration_ms: u64,
    ) -> ProviderFuture<'a, Millis> {
        let call = ProviderCall::ExtendTimeout {
            sandbox_id: sandbox_id.to_string(),
            duration_ms,
        };
        Box::pin(async move {
            match self.answer(call, "extend timeout").await? {
                Event::TimeoutExtended { deadline, .. } => Ok(deadline),
                Event::ExtendFailed { failure, .. } => Err(recorded_error(&failure)),
                other => Err(wrong_outcome("extend timeout", &other)),
            }
        })
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> ProviderFuture<'a, ()> {
        let call = ProviderCall::DeleteSnapshot {
            snapshot_id: snapshot_id.to_string(),
        };
        Box::pin(async move {
            match self.answer(call, "delete snapshot").await? {
                Event::SnapshotDeleted { .. } => Ok(()),
                Event::DeleteFailed { failure, .. } => Err(recorded_error(&failure)),
                other => Err(wrong_outcome("delete snapshot", &other)),
            }
        })
    }

    fn probe_sandbox<'a>(&'a self, sandbox_id: &'a str) -> ProviderFuture<'a, Option<Millis>> {
        let call = ProviderCall::ProbeSandbox {
            sandbox_id: sandbox_id.to_string(),
        };
        Box::pin(async move {
            match self.answer(call, "probe sandbox").await? {
                Event::SandboxProbed { alive, .. } => Ok(alive),
                other => Err(wrong_outcome("probe sandbox", &other)),
            }
        })
    }

    fn list_sandboxes<'a>(
        &'a self,
        _installation_id: &'a str,
    ) -> ProviderFuture<'a, Vec<ListedResource>> {
        // The event loop never lists; the reconciler does, and it is not re-driven.
        Box::pin(async { Ok(Vec::new()) })
    }

    fn list_snapshots<'a>(
        &'a self,
        _installation_id: &'a str,
    ) -> ProviderFuture<'a, Vec<ListedResource>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// Lets every task that is ready at the current virtual instant run (timers due now included:
/// `yield_now` defers to after the runtime has polled its timers) before time moves on.
async fn settle() {
    for _ in 0..32 {
        tokio::task::yield_now().await;
    }
}

/// How long the last session may take to wind down in virtual time (costs no real time).
const FINAL_GRACE_MS: u64 = 3_600_000;

async fn drive(
    task: TaskId,
    entries: &[JournalEntry],
    sessions: Vec<Session>,
    expected: Vec<Expected>,
    root: PathBuf,
) -> Result<RedriveReport, RedriveError> {
    let task_id = task.as_str().to_string();
    let engine_err = |source| RedriveError::Engine {
        task: task_id.clone(),
        source: Box::new(source),
    };
    let clock = ReplayClock::starting_at(entries[0].at);
    let calls_expected = expected.len();
    let provider = Arc::new(ReplayProvider::new(expected, clock));
    let mut sessions_run: usize = 0;
    for (si, s) in sessions.iter().enumerate() {
        if provider.diverged() {
            break;
        }
        clock.sleep_until(entries[s.first].at).await;
        let data_dir = if si == 0 {
            root.join("session-0")
        } else {
            session_dir(&root, si).map_err(|source| RedriveError::Scratch {
                path: root.clone(),
                source,
            })?
        };
        let orch = Orchestrator::builder(data_dir, config_for(&task_id, &s.settings)?)
            .provider(provider.clone())
            .clock(Arc::new(clock))
            .jitter(Jitter::None)
            .open()
            .await
            .map_err(engine_err)?;
        sessions_run += 1;
        let mut callers = Vec::new();
        for &ri in &s.requests {
            clock.sleep_until(entries[ri].at).await;
            settle().await;
            if provider.diverged() {
                break;
            }
            let orch = orch.clone();
            let task = task.clone();
            let event = entries[ri].event.clone();
            // Callers wait for their reply concurrently, as the recorded callers did.
            callers.push(tokio::spawn(async move {
                match event {
                    Event::RunRequested {
                        command,
                        timeout_ms,
                        ..
                    } => {
                        let timeout = Some(Duration::from_millis(timeout_ms));
                        orch.run(&task, &command, timeout).await.map(drop)
                    }
                    Event::SuspendRequested { .. } => orch.suspend(&task).await.map(drop),
                    _ => orch.resume(&task).await.map(drop),
                }
            }));
            settle().await;
        }
        clock.sleep_until(entries[s.last].at).await;
        settle().await;
        let grace = match sessions.get(si + 1) {
            Some(next) => entries[next.first].at.saturating_sub(clock.now_ms()).max(1),
            None => FINAL_GRACE_MS,
        };
        orch.shutdown_within(Duration::from_millis(grace)).await;
        for c in callers {
            match c.await {
                // A caller's own answer (a reply, a failed request, or "stopped" when the
                // recording's process ended first) is compared through the journal.
                Ok(Ok(()))
                | Ok(Err(EngineError::Request { .. }))
                | Ok(Err(EngineError::Stopped)) => {}
                // Anything else means the re-drive itself could not do what the recording did.
                Ok(Err(e)) => return Err(engine_err(e)),
                Err(join) => {
                    return Err(RedriveError::Panicked {
                        task: task_id.clone(),
                        message: join.to_string(),
                    })
                }
            }
        }
    }
    let store_err = |source| RedriveError::Store {
        task: task_id.clone(),
        source: Box::new(source),
    };
    let last = root.join(format!("session-{}", sessions_run.saturating_sub(1)));
    let store = Store::open(&last.join(STORE_FILE)).map_err(store_err)?;
    let redriven = store.journal(&task_id).map_err(store_err)?;
    let st = provider.state();
    let replies = replies_of(entries).len();
    let divergence = call_divergence(entries, &redriven, &st)
        .or_else(|| reply_divergence(entries, &redriven))
        .or_else(|| final_state_divergence(entries, &redriven));
    Ok(RedriveReport {
        task_id,
        sessions: sessions_run,
        calls_expected,
        calls_made: st.received.len(),
        replies,
        divergence,
    })
}

fn call_json(c: &ProviderCall) -> serde_json::Value {
    serde_json::to_value(c).unwrap_or(serde_json::Value::Null)
}

/// Where in the re-driven journal the `n`-th provider call was emitted.
fn redriven_call_entry(redriven: &[JournalEntry], n: usize) -> Option<&JournalEntry> {
    redriven
        .iter()
        .flat_map(|e| {
            e.commands
                .iter()
                .filter(|c| command_key(c).is_some())
                .map(move |_| e)
        })
        .nth(n)
}

fn call_divergence(
    entries: &[JournalEntry],
    redriven: &[JournalEntry],
    st: &ReplayState,
) -> Option<Divergence> {
    let n = match st.mismatch {
        Some(n) => n,
        None if st.next < st.expected.len() => st.next,
        None => return None,
    };
    match (st.expected.get(n), st.received.get(n)) {
        (Some(exp), Some(got)) => {
            let e = &entries[exp.entry];
            let detail = if exp.call.name() == got.name() {
                format!(
                    "provider call {} differs: the engine now calls {} with other arguments",
                    n + 1,
                    got.name()
                )
            } else {
                format!(
                    "provider call {}: the recording called {} here, the engine now calls {}",
                    n + 1,
                    exp.call.name(),
                    got.name()
                )
            };
            Some(
                Divergence::at_entry(e, DivergenceKind::ProviderCall, detail)
                    .with_diffs(diff::diff("call", &call_json(&exp.call), &call_json(got))),
            )
        }
        (Some(exp), None) => {
            let e = &entries[exp.entry];
            Some(
                Divergence::at_entry(
                    e,
                    DivergenceKind::ProviderCall,
                    format!(
                        "provider call {}: the recording called {} here, the engine never did",
                        n + 1,
                        exp.call.name()
                    ),
                )
                .with_diffs((
                    vec![diff::FieldDiff {
                        path: "call".into(),
                        recorded: Some(call_json(&exp.call)),
                        recomputed: None,
                    }],
                    1,
                )),
            )
        }
        (None, Some(got)) => {
            let at = redriven_call_entry(redriven, n)
                .or(entries.last())
                .expect("a journal with a call has entries");
            Some(
                Divergence::at_entry(
                    at,
                    DivergenceKind::ProviderCall,
                    format!(
                        "provider call {}: the engine now calls {} (at its entry #{}), the recording made no more calls",
                        n + 1,
                        got.name(),
                        at.task_seq
                    ),
                )
                .with_diffs((
                    vec![diff::FieldDiff {
                        path: "call".into(),
                        recorded: None,
                        recomputed: Some(call_json(got)),
                    }],
                    1,
                )),
            )
        }
        (None, None) => None,
    }
}

fn replies_of(entries: &[JournalEntry]) -> Vec<(&JournalEntry, &Command)> {
    entries
        .iter()
        .flat_map(|e| {
            e.commands
                .iter()
                .filter(|c| matches!(c, Command::Reply { .. }))
                .map(move |c| (e, c))
        })
        .collect()
}

fn reply_divergence(entries: &[JournalEntry], redriven: &[JournalEntry]) -> Option<Divergence> {
    let recorded = replies_of(entries);
    let again = replies_of(redriven);
    for i in 0..recorded.len().max(again.len()) {
        let (r, a) = (recorded.get(i), again.get(i));
        if r.map(|x| x.1) == a.map(|x| x.1) {
            continue;
        }
        let at = r.or(a).map(|x| x.0).expect("one side has reply i");
        let json = |c: Option<&(&JournalEntry, &Command)>| {
            c.map(|(_, c)| serde_json::to_value(c).unwrap_or(serde_json::Value::Null))
        };
        let (rj, aj) = (json(r), json(a));
        let diffs = match (&rj, &aj) {
            (Some(x), Some(y)) => diff::diff("reply", x, y),
            _ => (
                vec![diff::FieldDiff {
                    path: "reply".into(),
                    recorded: rj.clone(),
                    recomputed: aj.clone(),
                }],
                1,
            ),
        };
        let detail = match (r, a) {
            (Some(_), Some(_)) => format!("reply {} to a caller differs", i + 1),
            (Some(_), None) => format!(
                "the recording answered a caller here (reply {}), the engine never did",
                i + 1
            ),
            _ => format!(
                "the engine now answers a caller (reply {}) the recording did not",
                i + 1
            ),
        };
        return Some(Divergence::at_entry(at, DivergenceKind::Reply, detail).with_diffs(diffs));
    }
    None
}

fn final_state_divergence(
    entries: &[JournalEntry],
    redriven: &[JournalEntry],
) -> Option<Divergence> {
    let last = entries.last()?;
    let now: Option<TaskState> = redriven.last().map(|e| e.state_after);
    if now == Some(last.state_after) {
        return None;
    }
    Some(
        Divergence::at_entry(
            last,
            DivergenceKind::FinalState,
            "the re-driven task ends in another state than the recording",
        )
        .with_diffs((
            vec![diff::FieldDiff {
                path: "state".into(),
                recorded: Some(serde_json::json!(last.state_after)),
                recomputed: now.map(|s| serde_json::json!(s)),
            }],
            1,
        )),
    )
}

use crate::engine::STORE_FILE;

/// The data directory of session `n`: a fresh one per session, with the store moved over from
/// the previous session (closed by then). Fresh, because a task lock file that another session
/// ever opened may still be held for a moment by a child process forked elsewhere in this
/// process (a forked child holds copies of every descriptor until it execs): the engine would
/// then wait for the lock in *virtual* time, and the session's clock would run away.
fn session_dir(root: &Path, n: usize) -> std::io::Result<PathBuf> {
    let dir = root.join(format!("session-{n}"));
    std::fs::create_dir(&dir)?;
    if n > 0 {
        let prev = root.join(format!("session-{}", n - 1));
        for suffix in ["", "-wal"] {
            let from = prev.join(format!("{STORE_FILE}{suffix}"));
            if from.exists() {
                std::fs::rename(&from, dir.join(format!("{STORE_FILE}{suffix}")))?;
            }
        }
        // The shared-memory index is rebuilt from the WAL on open.
        let _ = std::fs::remove_file(prev.join(format!("{STORE_FILE}-shm")));
    }
    Ok(dir)
}

/// A fresh directory under the system temp dir, removed on drop.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn new() -> Result<Scratch, RedriveError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!(
                "taskbox-redrive-{}-{nanos:08x}-{n}",
                std::process::id()
            ));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(Scratch { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => continue,
                Err(source) => return Err(RedriveError::Scratch { path: base, source }),
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Best effort: a scratch store left in the temp dir harms nothing.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
