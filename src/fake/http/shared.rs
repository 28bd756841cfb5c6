//! [`Shared`], the state every handler reaches (the world behind its lock, the running
//! commands, the faults and statistics, the local provider holding workspaces and archives), and
//! the effects the world's plans ask for: booting a session's workspace, stopping and reaping its
//! commands, snapshotting and discarding it, and the work time made due.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;

use crate::clock::Clock;
use crate::core::{FailureKind, Millis};
use crate::fake::exec::CommandRun;
use crate::fake::faults::{FaultState, Faults, StreamCut};
use crate::fake::files::{self, FsError};
use crate::fake::model::{Access, Archived, Due, NewSession, StopWork, World};
use crate::fake::stats::Stats;
use crate::fake::validate::Limits;
use crate::fake::wire::ApiError;
use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::provider::local::LocalProvider;
use crate::provider::{sandbox_name, ProviderError, SandboxProvider, SandboxSpec};

/// How long a stop waits for a session's processes to die.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Everything the handlers share.
pub(crate) struct Shared {
    world: Mutex<World>,
    pub(super) commands: Mutex<BTreeMap<String, Arc<CommandRun>>>,
    faults: Mutex<FaultState>,
    stats: Mutex<Stats>,
    pub(super) token: Option<String>,
    pub(super) limits: Limits,
    pub(crate) clock: Arc<dyn Clock>,
    /// Holds every session's workspace (one local sandbox per session) and every snapshot's
    /// archive.
    pub(super) local: LocalProvider,
    /// The local sandboxes' own lifetime: longer than any session can live, so the fake alone
    /// decides when a session ends.
    local_timeout_ms: u64,
    /// `$HOME` directories of the sessions' commands.
    homes_dir: PathBuf,
    /// Serializes creates and resumes, so a retried create finds the first one's sandbox.
    pub(super) create_lock: tokio::sync::Mutex<()>,
    pub(super) next_cmd: AtomicU64,
    /// API requests in the guard now ([`Stats::in_flight`]).
    pub(super) in_flight: AtomicU64,
    pub(super) nonce: String,
}

/// Locks a mutex, keeping its data if a panic poisoned it (every critical section leaves the
/// data consistent between statements).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, FsError> + Send + 'static,
) -> Result<T, FsError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(FsError::Io {
            op: "run file task",
            path: PathBuf::new(),
            source: io::Error::other(e.to_string()),
        })
    })
}

/// Sleeps until the clock reads `at` (at least a millisecond, so a loop cannot spin).
async fn sleep_until_ms(clock: &dyn Clock, at: Millis) {
    let wait = at.saturating_sub(clock.now_ms()).max(1);
    tokio::time::sleep(Duration::from_millis(wait)).await;
}

/// The installation id the fake's local sandboxes carry.
const LOCAL_INSTALLATION: &str = "fake-vercel";

/// The local sandbox that holds a session's workspace. Session ids (`sbx_…`) are valid task ids.
pub(super) fn local_sandbox(session_id: &str) -> String {
    sandbox_name(LOCAL_INSTALLATION, session_id, 0)
}

/// Where everything a fake server keeps lives.
pub(crate) struct Storage {
    pub local: LocalProvider,
    pub local_timeout_ms: u64,
    pub homes_dir: PathBuf,
}

impl Shared {
    pub(crate) fn new(
        world: World,
        faults: Faults,
        token: Option<String>,
        limits: Limits,
        clock: Arc<dyn Clock>,
        storage: Storage,
        nonce: String,
    ) -> Shared {
        Shared {
            world: Mutex::new(world),
            commands: Mutex::new(BTreeMap::new()),
            faults: Mutex::new(FaultState::new(faults)),
            stats: Mutex::new(Stats::default()),
            token,
            limits,
            clock,
            local: storage.local,
            local_timeout_ms: storage.local_timeout_ms,
            homes_dir: storage.homes_dir,
            create_lock: tokio::sync::Mutex::new(()),
            next_cmd: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            nonce,
        }
    }

    pub(super) fn now(&self) -> Millis {
        self.clock.now_ms()
    }

    pub(super) fn world(&self) -> MutexGuard<'_, World> {
        lock(&self.world)
    }

    pub(super) fn faults_state(&self) -> MutexGuard<'_, FaultState> {
        lock(&self.faults)
    }

    pub(super) fn stats_mut(&self) -> MutexGuard<'_, Stats> {
        lock(&self.stats)
    }

    pub(crate) fn stats(&self) -> Stats {
        let mut stats = self.stats_mut().clone();
        stats.in_flight = self.in_flight.load(Ordering::SeqCst);
        stats
    }

    pub(crate) fn reset_stats(&self) {
        *self.stats_mut() = Stats::default();
    }

    pub(crate) fn faults(&self) -> Faults {
        self.faults_state().current()
    }

    pub(crate) fn set_faults(&self, faults: Faults) {
        *self.faults_state() = FaultState::new(faults);
    }

    pub(super) fn home(&self, session_id: &str) -> PathBuf {
        self.homes_dir.join(session_id)
    }

    /// The host directory `/vercel/sandbox` maps onto for a live session.
    pub(super) fn workspace(&self, session_id: &str) -> Result<PathBuf, ApiError> {
        self.local
            .workspace_path(&local_sandbox(session_id))
            .ok_or_else(|| ApiError::sandbox_stopped(session_id))
    }

    /// Takes the work time made due (timeouts, expired snapshots).
    fn take_due(&self) -> Due {
        let now = self.now();
        self.world().tick(now)
    }

    /// Starts due work in the background (requests do not wait for someone else's stop).
    pub(crate) fn spawn_due(self: &Arc<Self>) {
        let due = self.take_due();
        if due.stops.is_empty() && due.discard_archives.is_empty() {
            return;
        }
        let app = Arc::clone(self);
        tokio::spawn(async move { app.perform_due(due).await });
    }

    async fn perform_due(self: &Arc<Self>, due: Due) {
        for archive in due.discard_archives {
            if let Err(e) = self
                .local
                .delete_snapshot(&SnapshotId::from(archive.as_str()))
                .await
            {
                tracing::warn!(archive = %archive, error = %e, "could not remove an expired snapshot");
            }
        }
        for work in due.stops {
            tracing::info!(session = %work.session_id, "session timed out");
            self.perform_stop(work).await;
        }
    }

    /// Kills the running commands of a session (marking them ended by the stop); leftover
    /// background processes die with the local sandbox.
    pub(super) fn kill_session_commands(&self, session_id: &str) -> Vec<Arc<CommandRun>> {
        let runs: Vec<Arc<CommandRun>> = lock(&self.commands)
            .values()
            .filter(|r| r.session_id == session_id)
            .cloned()
            .collect();
        for run in &runs {
            run.kill_for_session_stop();
        }
        runs
    }

    /// Waits (bounded) for killed commands to be reaped, then forgets the session's commands.
    pub(super) async fn reap(&self, session_id: &str, runs: Vec<Arc<CommandRun>>) {
        for run in &runs {
            if tokio::time::timeout(KILL_WAIT, run.wait()).await.is_err() {
                tracing::warn!(command = %run.id, "a command survived SIGKILL for {KILL_WAIT:?}");
            }
        }
        let mut commands = lock(&self.commands);
        let ran: u64 = commands
            .values()
            .filter(|r| r.session_id == session_id)
            .filter_map(|r| r.exit())
            .map(|e| e.duration_ms)
            .sum();
        commands.retain(|_, r| r.session_id != session_id);
        drop(commands);
        self.world().add_active_cpu(session_id, ran);
    }

    /// Discards a session's local sandbox and home.
    pub(super) async fn discard(&self, session_id: &str) {
        if let Err(e) = self
            .local
            .stop_sandbox(&SandboxId::from(local_sandbox(session_id)))
            .await
        {
            tracing::warn!(session = %session_id, error = %e, "could not discard the workspace");
        }
        let home = self.home(session_id);
        if let Err(e) = blocking(move || files::remove_dir(&home)).await {
            tracing::warn!(session = %session_id, error = %e, "could not remove the home directory");
        }
    }

    /// Snapshots a session's workspace through the local provider (which also discards it).
    pub(super) async fn snapshot_workspace(
        &self,
        session_id: &str,
    ) -> Result<Archived, ProviderError> {
        // One snapshot per session: a snapshot ends the session.
        let task = TaskId::new(session_id).map_err(|e| {
            ProviderError::new(FailureKind::Invalid, "take snapshot", e.to_string())
        })?;
        let info = self
            .local
            .snapshot(&task, &SandboxId::from(local_sandbox(session_id)), 1)
            .await?;
        Ok(Archived {
            key: info.id.into(),
            size_bytes: info.size_bytes,
        })
    }

    /// Carries out a stop: processes die, the workspace is snapshotted if the sandbox persists,
    /// then discarded. Returns the auto-snapshot's id, if one was taken.
    pub(super) async fn perform_stop(&self, work: StopWork) -> Option<String> {
        let runs = self.kill_session_commands(&work.session_id);
        let mut snapshot = None;
        if let Some(snap_id) = work.auto_snapshot {
            match self.snapshot_workspace(&work.session_id).await {
                Ok(archived) => snapshot = Some((snap_id, archived)),
                Err(e) => tracing::warn!(
                    session = %work.session_id, error = %e,
                    "could not take the automatic snapshot; the session stops without one"
                ),
            }
        }
        self.discard(&work.session_id).await;
        self.reap(&work.session_id, runs).await;
        let snap_id = snapshot.as_ref().map(|(id, _)| id.clone());
        let now = self.now();
        self.world().finish_stop(&work.session_id, snapshot, now);
        snap_id
    }

    /// Waits while the session boots; fails if it cannot take calls.
    pub(super) async fn ready(&self, session_id: &str) -> Result<(), ApiError> {
        loop {
            let now = self.now();
            let access = self.world().access(session_id, now)?;
            match access {
                Access::Ready => return Ok(()),
                Access::BootingUntil(at) => sleep_until_ms(self.clock.as_ref(), at).await,
            }
        }
    }

    /// Prepares a new session's workspace (a local sandbox, restored from the source snapshot's
    /// archive) and records the session.
    pub(super) async fn boot(&self, new: NewSession) -> Result<(), ApiError> {
        let session_id = new.session.id.clone();
        let task_id = TaskId::new(&session_id).map_err(|e| {
            ApiError::internal(format!("the session id cannot name a workspace: {e}"))
        })?;
        let spec = SandboxSpec {
            task_id,
            generation: 0,
            name: local_sandbox(&session_id),
            source_snapshot: new.source_archive.clone().map(SnapshotId::from),
            timeout_ms: self.local_timeout_ms,
            installation_id: LOCAL_INSTALLATION.to_string(),
        };
        if let Err(e) = self.local.create_sandbox(&spec).await {
            return Err(match (&e.kind, &new.session.source_snapshot_id) {
                // Deleted between the check and the restore.
                (FailureKind::SnapshotGone, Some(snap)) => ApiError::snapshot_not_found(snap),
                _ => ApiError::internal(format!("could not prepare the sandbox filesystem: {e}")),
            });
        }
        let home = self.home(&session_id);
        let workspace = self.workspace(&session_id)?;
        let cwd = files::host_path(&workspace, &new.session.cwd)
            .map_err(|e| ApiError::internal(format!("the session's working directory: {e}")))?;
        if let Err(e) = blocking(move || {
            files::create_dir(&home)?;
            files::create_dir(&cwd)
        })
        .await
        {
            self.discard(&session_id).await;
            return Err(ApiError::internal(format!(
                "could not prepare the sandbox filesystem: {e}"
            )));
        }
        let now = self.now();
        self.world().commit_session(new, now);
        Ok(())
    }

    pub(super) fn command(
        &self,
        session_id: &str,
        cmd_id: &str,
    ) -> Result<Arc<CommandRun>, ApiError> {
        lock(&self.commands)
            .get(cmd_id)
            .filter(|r| r.session_id == session_id)
            .cloned()
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "Command {cmd_id} not found in sandbox session {session_id}."
                ))
            })
    }

    pub(super) fn stream_cut(&self) -> Option<StreamCut> {
        self.faults_state().stream_cut()
    }

    pub(super) fn count_cut(&self) {
        self.stats_mut().injected.cut_streams += 1;
    }

    /// Kills everything and discards every workspace (server shutdown). Snapshot archives stay.
    pub(crate) async fn shutdown_sessions(&self) {
        let runs: Vec<Arc<CommandRun>> = lock(&self.commands).values().cloned().collect();
        for run in &runs {
            run.kill_for_session_stop();
        }
        let ids = self.world().session_ids();
        for id in ids {
            self.discard(&id).await;
        }
        for run in &runs {
            let _ = tokio::time::timeout(KILL_WAIT, run.wait()).await;
        }
        lock(&self.commands).clear();
    }

    /// Kills every running command without waiting (for `Drop`).
    pub(crate) fn kill_all_now(&self) {
        for run in lock(&self.commands).values() {
            run.kill_for_session_stop();
        }
    }

    /// Makes a session time out now and waits for it to stop (admin).
    pub(crate) async fn expire_session(self: &Arc<Self>, id: &str) -> Result<Value, ApiError> {
        let now = self.now();
        self.world().expire_session(id, now)?;
        let due = self.take_due();
        self.perform_due(due).await;
        let now = self.now();
        self.world().session_answer(id, now)
    }

    /// Makes a snapshot expire now and discards its archive (admin).
    pub(crate) async fn expire_snapshot(self: &Arc<Self>, id: &str) -> Result<(), ApiError> {
        let now = self.now();
        self.world().expire_snapshot(id, now)?;
        let due = self.take_due();
        self.perform_due(due).await;
        Ok(())
    }
}
