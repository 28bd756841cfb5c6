//! The [`ReplayProvider`]: a sandbox provider that answers each call with the outcome the
//! journal recorded for it, at the recorded time, and remembers the calls it received.
//!
//! Each [`SandboxProvider`] method builds its [`ReceivedCall`] and turns the recorded outcome
//! back into that method's answer: the outcome half of the mapping that `call` starts.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::clock::{Clock, TokioClock};
use crate::core::{Event, Failure, FailureKind, Millis, PlatformSnapshot, SessionUsage};
use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::provider::{
    Call, ExecIo, ExecOutput, ExecRequest, ListedResource, ProviderError, ProviderFuture,
    ReceivedCall, SandboxInfo, SandboxProvider, SandboxSpec, SnapshotInfo,
};

use super::plan::Expected;

/// A [`SandboxProvider`] that answers each call with the outcome the journal recorded for it,
/// at the time it was recorded, and records the calls it receives. The first call that is not
/// the next one recorded is refused (a permanent failure) and remembered as the mismatch.
pub struct ReplayProvider {
    clock: TokioClock,
    state: Mutex<ReplayState>,
    /// What the recorded provider said of its sandboxes' files past a deadline, as the
    /// session's settings recorded it.
    keeps_files: std::sync::atomic::AtomicBool,
    /// Whether the recorded provider reported session usage (the session's `reports_usage`).
    reports_usage: std::sync::atomic::AtomicBool,
    /// Whether the recorded provider checkpointed live sandboxes (the session's
    /// `live_checkpoint`).
    checkpoints_live: std::sync::atomic::AtomicBool,
    /// The task re-driven (each re-drive has a provider of its own): the probe's call names it.
    task_id: TaskId,
    /// The platform snapshot the last recorded probe of each sandbox found, answered by
    /// [`SandboxProvider::platform_snapshot`] right after that probe.
    platform_snapshots: Mutex<std::collections::HashMap<SandboxId, PlatformSnapshot>>,
    /// The session usage the last recorded probe (that found the sandbox gone) or stop of each
    /// sandbox reported (or that it reported none), answered by
    /// [`SandboxProvider::session_usage`] right after that call; a `session_usage` with nothing
    /// stashed is the engine's own [`Call::ReadUsage`], answered from the recording.
    usages: Mutex<std::collections::HashMap<SandboxId, Option<SessionUsage>>>,
}

pub(super) struct ReplayState {
    pub(super) expected: Vec<Expected>,
    pub(super) next: usize,
    pub(super) received: Vec<ReceivedCall>,
    pub(super) mismatch: Option<usize>,
}

enum Answer {
    At(Millis, Event),
    Never,
    Refuse,
}

impl ReplayProvider {
    pub(super) fn new(
        expected: Vec<Expected>,
        clock: TokioClock,
        task_id: TaskId,
    ) -> ReplayProvider {
        ReplayProvider {
            clock,
            state: Mutex::new(ReplayState {
                expected,
                next: 0,
                received: Vec::new(),
                mismatch: None,
            }),
            keeps_files: std::sync::atomic::AtomicBool::new(false),
            reports_usage: std::sync::atomic::AtomicBool::new(false),
            checkpoints_live: std::sync::atomic::AtomicBool::new(false),
            task_id,
            platform_snapshots: Mutex::default(),
            usages: Mutex::default(),
        }
    }

    /// Answers [`SandboxProvider::keeps_files_after_deadline`] as the recorded provider did
    /// (the session's `late_checkpoint` setting).
    pub(super) fn set_keeps_files_after_deadline(&self, keeps: bool) {
        self.keeps_files
            .store(keeps, std::sync::atomic::Ordering::SeqCst);
    }

    /// Answers [`SandboxProvider::checkpoints_live`] as the recorded provider did (the
    /// session's `live_checkpoint` setting).
    pub(super) fn set_checkpoints_live(&self, live: bool) {
        self.checkpoints_live
            .store(live, std::sync::atomic::Ordering::SeqCst);
    }

    /// Answers [`SandboxProvider::reports_usage`] as the recorded provider did (the session's
    /// `reports_usage` setting).
    pub(super) fn set_reports_usage(&self, reports: bool) {
        self.reports_usage
            .store(reports, std::sync::atomic::Ordering::SeqCst);
    }

    /// Keeps a recorded call's session usage (none included: the engine asks right after the
    /// call all the same) for [`SandboxProvider::session_usage`].
    fn stash_usage(&self, sandbox_id: &SandboxId, usage: Option<SessionUsage>) {
        if let Ok(mut stash) = self.usages.lock() {
            stash.insert(sandbox_id.clone(), usage);
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, ReplayState> {
        // A poisoned lock means a panic in another call already failed the re-drive; the
        // state is still the best account of what happened.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The calls received so far, in order.
    pub fn calls_received(&self) -> Vec<ReceivedCall> {
        self.state().received.clone()
    }

    /// Whether a call did not match the recording.
    pub fn diverged(&self) -> bool {
        self.state().mismatch.is_some()
    }

    fn take(&self, call: ReceivedCall) -> Answer {
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
        call: ReceivedCall,
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

    fn keeps_files_after_deadline(&self) -> bool {
        self.keeps_files.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn create_sandbox<'a>(&'a self, spec: &'a SandboxSpec) -> ProviderFuture<'a, SandboxInfo> {
        let call = Call::CreateSandbox { spec: spec.clone() };
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

    // A replayed command has no live side: its output was never journaled.
    fn exec_live<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        req: &'a ExecRequest,
        _io: ExecIo,
    ) -> ProviderFuture<'a, ExecOutput> {
        let call = Call::Exec {
            request_id: (),
            sandbox_id: sandbox_id.clone(),
            request: req.clone(),
        };
        Box::pin(async move {
            let started = self.clock.now_ms();
            match self.answer(call, "run command").await? {
                // Output is not journaled; only the exit status decides anything.
                Event::CommandExited {
                    exit_code,
                    timed_out,
                    memory_killed,
                    ..
                } => Ok(ExecOutput {
                    exit_code,
                    timed_out,
                    memory_killed,
                    stdout: String::new(),
                    stderr: String::new(),
                    duration_ms: self.clock.now_ms().saturating_sub(started),
                    ..ExecOutput::default()
                }),
                Event::CommandFailed { failure, .. } => Err(recorded_error(&failure)),
                Event::CommandNotStarted { failure, .. } => {
                    Err(recorded_error(&failure).before_start())
                }
                other => Err(wrong_outcome("run command", &other)),
            }
        })
    }

    fn snapshot<'a>(
        &'a self,
        task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
        seq: u64,
    ) -> ProviderFuture<'a, SnapshotInfo> {
        let call = Call::Snapshot {
            task_id: task_id.clone(),
            sandbox_id: sandbox_id.clone(),
            seq,
        };
        Box::pin(async move {
            match self.answer(call, "take snapshot").await? {
                Event::SnapshotTaken {
                    snapshot_id,
                    size_bytes,
                    expires_at,
                    omitted,
                    usage,
                    resources,
                    ..
                } => Ok(SnapshotInfo {
                    id: snapshot_id,
                    size_bytes,
                    expires_at,
                    omitted,
                    usage,
                    resources,
                }),
                Event::SnapshotFailed { failure, .. } => Err(recorded_error(&failure)),
                other => Err(wrong_outcome("take snapshot", &other)),
            }
        })
    }

    fn stop_sandbox<'a>(&'a self, sandbox_id: &'a SandboxId) -> ProviderFuture<'a, ()> {
        let call = Call::StopSandbox {
            sandbox_id: sandbox_id.clone(),
        };
        Box::pin(async move {
            match self.answer(call, "stop sandbox").await? {
                Event::SandboxStopped { usage, .. } => {
                    self.stash_usage(sandbox_id, usage);
                    Ok(())
                }
                Event::StopFailed { failure, .. } => Err(recorded_error(&failure)),
                other => Err(wrong_outcome("stop sandbox", &other)),
            }
        })
    }

    fn extend_timeout<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
        duration_ms: u64,
    ) -> ProviderFuture<'a, Millis> {
        let call = Call::ExtendTimeout {
            sandbox_id: sandbox_id.clone(),
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

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a SnapshotId) -> ProviderFuture<'a, ()> {
        let call = Call::DeleteSnapshot {
            snapshot_id: snapshot_id.clone(),
        };
        Box::pin(async move {
            match self.answer(call, "delete snapshot").await? {
                Event::SnapshotDeleted { .. } => Ok(()),
                Event::DeleteFailed { failure, .. } => Err(recorded_error(&failure)),
                other => Err(wrong_outcome("delete snapshot", &other)),
            }
        })
    }

    fn probe_sandbox<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<Millis>> {
        let call = Call::ProbeSandbox {
            task_id: self.task_id.clone(),
            sandbox_id: sandbox_id.clone(),
        };
        Box::pin(async move {
            match self.answer(call, "probe sandbox").await? {
                Event::SandboxProbed {
                    alive,
                    platform_snapshot,
                    usage,
                    ..
                } => {
                    // The engine asks for the usage only of a sandbox found not running.
                    if alive.is_none() {
                        self.stash_usage(sandbox_id, usage);
                    }
                    if let (Some(found), Ok(mut stash)) =
                        (platform_snapshot, self.platform_snapshots.lock())
                    {
                        stash.insert(sandbox_id.clone(), found);
                    }
                    Ok(alive)
                }
                Event::ProbeFailed { failure, .. } => Err(recorded_error(&failure)),
                other => Err(wrong_outcome("probe sandbox", &other)),
            }
        })
    }

    fn platform_snapshot<'a>(
        &'a self,
        _task_id: &'a TaskId,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<PlatformSnapshot>> {
        // Part of the recorded probe's answer, not a call of its own.
        let found = self
            .platform_snapshots
            .lock()
            .ok()
            .and_then(|mut stash| stash.remove(sandbox_id));
        Box::pin(async move { Ok(found) })
    }

    fn session_usage<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<SessionUsage>> {
        // Part of the recorded probe's or stop's answer, not a call of its own; else the
        // engine's read of a session that ended unasked, a call of its own.
        let stashed = self
            .usages
            .lock()
            .ok()
            .and_then(|mut stash| stash.remove(sandbox_id));
        Box::pin(async move {
            if let Some(usage) = stashed {
                return Ok(usage);
            }
            let call = Call::ReadUsage {
                sandbox_id: sandbox_id.clone(),
            };
            match self.answer(call, "read session usage").await? {
                Event::UsageRead { usage, .. } => Ok(usage),
                other => Err(wrong_outcome("read session usage", &other)),
            }
        })
    }

    fn reports_usage(&self) -> bool {
        self.reports_usage.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn resources<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> ProviderFuture<'a, Option<crate::core::Resources>> {
        Box::pin(async move {
            let call = Call::SampleActivity {
                sandbox_id: sandbox_id.clone(),
            };
            match self.answer(call, "read resources").await? {
                Event::ActivitySampled { resources, .. } => Ok(resources),
                other => Err(wrong_outcome("read resources", &other)),
            }
        })
    }

    /// The recording's settings say whether activity was sampled (`max_busy_ms`, which the
    /// re-drive's configuration reproduces): the replay answers every sample it recorded.
    fn measures_activity(&self) -> bool {
        true
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
