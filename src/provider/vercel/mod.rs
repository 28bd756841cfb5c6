//! The Vercel Sandbox backend (`terminal.backend = vercel_sandbox`): [`VercelProvider`] over
//! the v2 REST API.
//!
//! - [`settings`]: the `terminal.*` keys as Vercel sees them (runtime, 2048 MB per vCPU, no
//!   disk size, API URL), validated before anything is sent.
//! - [`auth`]: access token or OIDC token, team and project, with `.vercel/project.json`
//!   defaults; tokens never printed.
//! - [`client`]: the REST client, one method per endpoint, grouped by resource.
//! - [`wire`]: the API's objects (serde shapes and typed requests).
//! - [`ndjson`]: the reader of a command's NDJSON stream.
//! - [`classify`]: [`classify::classify`], the single place where an HTTP outcome becomes a
//!   classified [`ProviderError`].
//! - [`exec`]: a command in one request, with recovery from cut streams and kill-on-timeout.
//! - [`doctor`]: the checks `taskbox doctor` prints.
//!
//! Handles: a task's sandbox is a **named** Vercel sandbox (`spec.name`, deterministic from
//! task id and generation, so a repeated create finds the first one); the handle the engine
//! keeps is the **session id** of its running boot, because commands, snapshots, stops and
//! extensions all address sessions. Ownership is recorded in two tags on every sandbox,
//! [`TAG_INSTALLATION`] and [`TAG_TASK`], which is what lets the reconciler touch exactly this
//! installation's resources. Snapshots carry no tags; they are found through their source
//! sandbox's name.
//!
//! Nothing here retries a transient failure (the engine does, with backoff and `Retry-After`),
//! except the long-poll that waits for an already running command.

pub mod auth;
pub mod classify;
pub mod client;
pub mod doctor;
pub mod exec;
pub mod ndjson;
pub mod settings;
pub mod wire;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::auth::{AuthError, Credentials};
use self::client::{
    ClientBuildError, CreateSandbox, Sandbox, SandboxAndSession, Session, SessionStatus, Snapshot,
    SnapshotStatus, VercelClient,
};
use self::exec::ExecOptions;
use self::settings::{VercelConfigError, VercelSettings};
use crate::clock::Clock;
use crate::config::TerminalConfig;
use crate::core::{FailureKind, Millis};
use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::provider::{
    ExecIo, ExecOutput, ExecRequest, ListedResource, ProviderError, SandboxInfo, SandboxSpec,
    SnapshotInfo,
};

pub use self::auth::AuthMode;
pub use self::exec::TIMEOUT_EXIT_CODE;

/// The tag naming the installation that owns a sandbox.
pub const TAG_INSTALLATION: &str = "taskbox-installation";
/// The tag naming the task that owns a sandbox.
pub const TAG_TASK: &str = "taskbox-task";

/// The backend could not be set up from the config and environment.
#[derive(Debug, thiserror::Error)]
pub enum VercelSetupError {
    /// A config value Vercel cannot run with.
    #[error(transparent)]
    Config(#[from] VercelConfigError),
    /// No usable credentials.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The HTTP client could not be built.
    #[error(transparent)]
    Client(#[from] ClientBuildError),
}

impl VercelSetupError {
    /// How to fix it, if known.
    pub fn hint(&self) -> Option<String> {
        match self {
            VercelSetupError::Config(e) => Some(e.hint()),
            VercelSetupError::Auth(e) => Some(e.hint()),
            VercelSetupError::Client(_) => None,
        }
    }
}

/// The Vercel backend in the [registry](crate::provider::registry): built from the config and
/// the environment's credentials; its sessions are priced; its snapshots live on the platform.
pub const BACKEND: crate::provider::registry::Entry = crate::provider::registry::Entry {
    name: "vercel_sandbox",
    // The short name the Vercel backend is also known by.
    aliases: &["vercel"],
    build: |config, _data_dir, _installation_id, clock| {
        let cwd = std::env::current_dir().unwrap_or_else(|_| std::path::PathBuf::from("."));
        let env = |k: &str| std::env::var(k).ok();
        VercelProvider::from_config(&config.terminal, &env, &cwd, clock)
            .map(|p| Arc::new(p) as Arc<dyn crate::provider::SandboxProvider>)
            .map_err(|e| {
                let hint = e.hint();
                crate::provider::SetupError::new("vercel_sandbox", e, hint)
            })
    },
    checks: |config| Box::pin(doctor::checks(config)),
    priced: true,
    export_snapshot: None,
    foreign: None,
};

/// Tuning of the provider (defaults suit production; tests shorten the waits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderOptions {
    /// How long a new session may stay `pending`.
    pub start_timeout: Duration,
    /// How long to wait for a session that ended unasked (past its deadline) to stop, before
    /// its usage is read as it stands.
    pub usage_wait: Duration,
    /// Snapshot expiry sent with each snapshot (`None`: the platform default of 30 days from
    /// last use; `Some(0)`: never).
    pub snapshot_expiration_ms: Option<u64>,
    /// Command execution.
    pub exec: ExecOptions,
}

impl Default for ProviderOptions {
    fn default() -> Self {
        ProviderOptions {
            start_timeout: Duration::from_secs(180),
            usage_wait: Duration::from_secs(10),
            snapshot_expiration_ms: None,
            exec: ExecOptions::default(),
        }
    }
}

/// Vercel Sandbox as a [`SandboxProvider`](crate::provider::SandboxProvider).
#[derive(Debug)]
pub struct VercelProvider {
    client: VercelClient,
    settings: VercelSettings,
    options: ProviderOptions,
    /// Session id → sandbox name, for sessions this process created or found. Only a shortcut
    /// for finding a session's snapshots; after a restart the names are found by tag.
    names: Mutex<HashMap<String, String>>,
    /// Session id → its working directory, as the session reports it (image-based sandboxes
    /// need not use `/vercel/sandbox`); read again after a restart.
    cwds: Mutex<HashMap<String, String>>,
    /// Session id → what it used (`None`: the platform knew the session no more), as the probe
    /// that found it ended or the stop that ended it read it; taken by
    /// [`SandboxProvider::session_usage`](crate::provider::SandboxProvider) right after, so the
    /// ledger gets it without another request.
    ended: Mutex<HashMap<String, Option<crate::core::SessionUsage>>>,
}

impl VercelProvider {
    /// A provider over `client` with validated `settings`.
    pub fn new(client: VercelClient, settings: VercelSettings) -> VercelProvider {
        VercelProvider {
            client,
            settings,
            options: ProviderOptions::default(),
            names: Mutex::new(HashMap::new()),
            cwds: Mutex::new(HashMap::new()),
            ended: Mutex::new(HashMap::new()),
        }
    }

    /// Replaces the tuning.
    pub fn with_options(mut self, options: ProviderOptions) -> VercelProvider {
        self.options = options;
        self
    }

    /// Validates the config, resolves credentials (refusing an expired OIDC token before any
    /// request) and builds the client.
    pub fn from_config(
        t: &TerminalConfig,
        env: &dyn Fn(&str) -> Option<String>,
        cwd: &Path,
        clock: Arc<dyn Clock>,
    ) -> Result<VercelProvider, VercelSetupError> {
        let settings = VercelSettings::from_config(t, env)?;
        let creds = Credentials::resolve(env, cwd, clock.now_ms())?;
        let client = VercelClient::new(&settings.api_url, creds, clock)?;
        Ok(VercelProvider::new(client, settings))
    }

    /// The client (for `taskbox doctor` and tests).
    pub fn client(&self) -> &VercelClient {
        &self.client
    }

    /// The settings in use.
    pub fn settings(&self) -> &VercelSettings {
        &self.settings
    }

    fn remember(&self, session_id: &str, name: &str) {
        if let Ok(mut names) = self.names.lock() {
            names.insert(session_id.to_string(), name.to_string());
        }
    }

    fn remembered(&self, session_id: &str) -> Option<String> {
        self.names.lock().ok()?.get(session_id).cloned()
    }

    /// Forgets a session that is over, so the maps hold live sessions only.
    fn forget(&self, session_id: &str) {
        if let Ok(mut names) = self.names.lock() {
            names.remove(session_id);
        }
        if let Ok(mut cwds) = self.cwds.lock() {
            cwds.remove(session_id);
        }
    }

    /// Keeps what an ended session used (`None`: the platform answered that it is gone) until
    /// [`Self::ended_usage`] takes it.
    fn remember_usage(&self, session_id: &str, usage: Option<crate::core::SessionUsage>) {
        if let Ok(mut ended) = self.ended.lock() {
            // Stops made outside `Call` (gc) leave theirs untaken: keep the map bounded.
            if ended.len() >= 1024 {
                ended.clear();
            }
            ended.insert(session_id.to_string(), usage);
        }
    }

    /// What the session used: as the probe that found it ended or the stop that ended it read
    /// it (none for a session that was gone: the platform reports nothing of it), else read
    /// from the session now — a session that ended without the platform being asked (its
    /// deadline passed, a command found it gone). A session not stopped yet (the platform
    /// stops it a moment after its deadline) reports no stop time; the ledger then counts its
    /// memory up to the time the answer was journaled. It is read once it has stopped, within
    /// [`ProviderOptions::usage_wait`] (the platform stops a session a moment after its
    /// deadline).
    async fn ended_usage(
        &self,
        session_id: &SandboxId,
    ) -> Result<Option<crate::core::SessionUsage>, ProviderError> {
        let remembered = self
            .ended
            .lock()
            .ok()
            .and_then(|mut ended| ended.remove(session_id.as_str()));
        match remembered {
            Some(usage) => Ok(usage),
            None => Ok(self
                .client
                .wait_until_ended(session_id, self.options.usage_wait)
                .await?
                .usage()),
        }
    }

    fn remember_cwd(&self, session: &Session) {
        if let (Some(cwd), Ok(mut cwds)) = (&session.cwd, self.cwds.lock()) {
            cwds.insert(session.id.clone(), cwd.clone());
        }
    }

    /// The session's working directory: remembered from its create, else read from the session
    /// (after a restart), else the legacy runtimes' documented `/vercel/sandbox`.
    async fn session_cwd(&self, session_id: &str) -> Result<String, ProviderError> {
        if let Some(cwd) = self
            .cwds
            .lock()
            .ok()
            .and_then(|c| c.get(session_id).cloned())
        {
            return Ok(cwd);
        }
        let session = self.client.get_session(session_id).await?;
        self.remember_cwd(&session);
        Ok(session
            .cwd
            .unwrap_or_else(|| exec::LEGACY_SANDBOX_ROOT.to_string()))
    }

    /// Decides what to do with a sandbox already holding `spec.name`: reuse its session, or
    /// (`None`) replace it because its session is over.
    async fn adopt(
        &self,
        spec: &SandboxSpec,
        found: SandboxAndSession,
    ) -> Result<Option<Session>, ProviderError> {
        if let Some(owner) = found.sandbox.tags.get(TAG_INSTALLATION) {
            if owner != &spec.installation_id {
                return Err(ProviderError::new(
                    FailureKind::Permanent,
                    "create sandbox",
                    format!(
                        "the sandbox name {} is taken by another taskbox installation ({owner}) in this Vercel project",
                        spec.name
                    ),
                ));
            }
        }
        let session = found.session;
        match session.status {
            SessionStatus::Pending | SessionStatus::Running => Ok(Some(session)),
            s if s.is_terminal() => {
                // This generation's sandbox was created before and has since died (e.g. the
                // engine crashed for longer than its timeout). Its files are gone either way,
                // so replace it under the same name.
                tracing::info!(name = %spec.name, status = ?s, "replacing a dead sandbox");
                self.client.delete_sandbox(&spec.name).await?;
                Ok(None)
            }
            s => Err(ProviderError::transient(
                "create sandbox",
                format!(
                    "the sandbox {} exists but its session is {s:?}; waiting for it to settle",
                    spec.name
                ),
                None,
            )),
        }
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, ProviderError> {
        if spec.timeout_ms < 1000 {
            return Err(ProviderError::new(
                FailureKind::Invalid,
                "create sandbox",
                format!(
                    "a sandbox timeout of {} ms is below Vercel's minimum of 1000 ms",
                    spec.timeout_ms
                ),
            ));
        }
        // Look first: a create that went through before a crash or a lost response is found
        // by its name instead of being made twice.
        let existing = match self.client.get_sandbox(&spec.name).await? {
            Some(found) => self.adopt(spec, found).await?,
            None => None,
        };
        let session = match existing {
            Some(session) => session,
            None => {
                let request = CreateSandbox {
                    name: spec.name.clone(),
                    base: self.settings.base.clone(),
                    persistent: self.settings.persistent,
                    vcpus: self.settings.vcpus,
                    timeout_ms: spec.timeout_ms,
                    tags: BTreeMap::from([
                        (TAG_INSTALLATION.to_string(), spec.installation_id.clone()),
                        (TAG_TASK.to_string(), spec.task_id.to_string()),
                    ]),
                    source_snapshot: spec.source_snapshot.as_deref().map(str::to_string),
                };
                match self.client.create_sandbox(&request).await {
                    Ok(created) => created.session,
                    Err(e)
                        if matches!(
                            e.kind,
                            FailureKind::Transient { .. } | FailureKind::Permanent
                        ) =>
                    {
                        // The answer may be lost or a conflict: did the sandbox come to exist?
                        match self.client.get_sandbox(&spec.name).await {
                            Ok(Some(found)) => match self.adopt(spec, found).await? {
                                Some(session) => session,
                                None => return Err(e),
                            },
                            _ => return Err(e),
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let session = self
            .client
            .wait_until_running(session, self.options.start_timeout)
            .await?;
        self.remember(&session.id, &spec.name);
        self.remember_cwd(&session);
        let deadline = session
            .deadline()
            .unwrap_or_else(|| self.client.clock().now_ms().saturating_add(spec.timeout_ms));
        Ok(SandboxInfo {
            id: session.id.into(),
            name: spec.name.clone(),
            deadline,
        })
    }

    /// The names of the sandboxes `session_id` may belong to: the remembered one, else the
    /// task's sandbox (found by tag) whose current session it is — a session stays its
    /// sandbox's current one until the next boot, which taskbox never asks of a sandbox that
    /// has been snapshotted. Should no sandbox claim it, every sandbox of the task is searched.
    async fn candidate_names(
        &self,
        task_id: &TaskId,
        session_id: &str,
    ) -> Result<Vec<String>, ProviderError> {
        if let Some(name) = self.remembered(session_id) {
            return Ok(vec![name]);
        }
        let sandboxes = self
            .client
            .list_all_sandboxes((TAG_TASK, task_id.as_str()))
            .await?;
        let (current, others): (Vec<_>, Vec<_>) = sandboxes
            .into_iter()
            .partition(|s| s.current_session_id.as_deref() == Some(session_id));
        let chosen = if current.is_empty() { others } else { current };
        Ok(chosen.into_iter().map(|s| s.name).collect())
    }

    /// The snapshot already taken of `session_id`, if any.
    async fn find_snapshot_of(
        &self,
        task_id: &TaskId,
        session_id: &str,
    ) -> Result<Option<Snapshot>, ProviderError> {
        for name in self.candidate_names(task_id, session_id).await? {
            let snapshots = self.client.list_all_snapshots(&name).await?;
            if let Some(s) = snapshots
                .into_iter()
                .find(|s| s.source_session_id.as_deref() == Some(session_id))
            {
                return Ok(Some(s));
            }
        }
        Ok(None)
    }

    fn snapshot_info(snapshot: Snapshot) -> Result<SnapshotInfo, ProviderError> {
        match snapshot.status {
            SnapshotStatus::Created => Ok(SnapshotInfo {
                id: snapshot.id.into(),
                size_bytes: snapshot.size_bytes,
                expires_at: snapshot.expires_at,
                omitted: Vec::new(),
                usage: None,
                resources: None,
            }),
            SnapshotStatus::Failed => Err(ProviderError::new(
                FailureKind::Permanent,
                "create snapshot",
                format!("snapshot {} failed on the platform", snapshot.id),
            )),
            SnapshotStatus::Deleted => Err(ProviderError::snapshot_gone(
                "create snapshot",
                format!("snapshot {} was deleted", snapshot.id),
            )),
            SnapshotStatus::Unknown => Err(ProviderError::transient(
                "create snapshot",
                format!("snapshot {} is not complete yet", snapshot.id),
                None,
            )),
        }
    }

    /// A snapshot found again (a repeated call, or a create whose answer was lost) with the
    /// usage of the session it stopped, read from the session as the create's answer would
    /// have carried it; none when that read fails (the snapshot itself stands, and the ledger
    /// counts the session as unreported).
    async fn with_usage(
        &self,
        mut info: SnapshotInfo,
        session_id: &str,
    ) -> Result<SnapshotInfo, ProviderError> {
        info.usage = match self.client.get_session(session_id).await {
            Ok(session) => session.usage(),
            Err(e) => {
                tracing::debug!(session = %session_id, error = %e, "no usage for a snapshot found again");
                None
            }
        };
        Ok(info)
    }

    async fn take_snapshot(
        &self,
        task_id: &TaskId,
        session_id: &SandboxId,
        _seq: u64,
    ) -> Result<SnapshotInfo, ProviderError> {
        // A session is snapshotted at most once (the snapshot stops it), so "the snapshot of
        // this session" is the idempotency key: a repeat returns the first one, with the
        // session's usage read from the session (the create's answer carried it the first time).
        if let Some(found) = self.find_snapshot_of(task_id, session_id).await? {
            return self
                .with_usage(Self::snapshot_info(found)?, session_id)
                .await;
        }
        match self
            .client
            .create_snapshot(session_id, self.options.snapshot_expiration_ms)
            .await
        {
            Ok(taken) => {
                self.forget(session_id);
                let mut info = Self::snapshot_info(taken.snapshot)?;
                info.usage = taken.session.as_ref().and_then(wire::Session::usage);
                Ok(info)
            }
            Err(e) => {
                // A snapshot whose answer was lost has stopped the session, so the retry sees
                // 410 or 422: look once more before reporting.
                if matches!(
                    e.kind,
                    FailureKind::SandboxGone
                        | FailureKind::Transient { .. }
                        | FailureKind::Permanent
                ) {
                    if let Ok(Some(found)) = self.find_snapshot_of(task_id, session_id).await {
                        return self
                            .with_usage(Self::snapshot_info(found)?, session_id)
                            .await;
                    }
                }
                Err(e)
            }
        }
    }

    async fn run(
        &self,
        sandbox_id: &SandboxId,
        req: &ExecRequest,
        io: ExecIo,
    ) -> Result<ExecOutput, ProviderError> {
        // The working directory is needed only to place an uploaded stdin file.
        let cwd = match io.stdin {
            Some(_) => Some(self.session_cwd(sandbox_id).await?),
            None => None,
        };
        exec::exec(
            &self.client,
            sandbox_id,
            req,
            &self.options.exec,
            io,
            cwd.as_deref(),
        )
        .await
    }

    /// The snapshot a persistent sandbox took of `session_id` as it stopped (found among its
    /// sandbox's snapshots by its source session — the sandbox's current snapshot). taskbox
    /// never resumes the sandbox: it creates the next generation from that snapshot like from
    /// any other, so every session it drives is one it created.
    async fn find_platform_snapshot(
        &self,
        task_id: &TaskId,
        session_id: &SandboxId,
    ) -> Result<Option<crate::core::PlatformSnapshot>, ProviderError> {
        if !self.settings.persistent {
            return Ok(None);
        }
        Ok(self
            .find_snapshot_of(task_id, session_id)
            .await?
            .filter(|s| s.status == SnapshotStatus::Created)
            .map(|s| crate::core::PlatformSnapshot {
                snapshot_id: s.id.into(),
                size_bytes: s.size_bytes,
                expires_at: s.expires_at,
            }))
    }

    /// The sandboxes tagged with `installation_id` (the listing's filter, checked again on each
    /// answer), each with the task it belongs to (its tag, or else its name).
    async fn installation_sandboxes(
        &self,
        installation_id: &str,
    ) -> Result<Vec<(Sandbox, Option<String>)>, ProviderError> {
        let sandboxes = self
            .client
            .list_all_sandboxes((TAG_INSTALLATION, installation_id))
            .await?;
        Ok(sandboxes
            .into_iter()
            .filter(|s| s.tags.get(TAG_INSTALLATION).map(String::as_str) == Some(installation_id))
            .map(|s| {
                let task_id = s
                    .tags
                    .get(TAG_TASK)
                    .cloned()
                    .or_else(|| task_from_name(&s.name));
                (s, task_id)
            })
            .collect())
    }

    async fn listed_sandboxes(
        &self,
        installation_id: &str,
    ) -> Result<Vec<ListedResource>, ProviderError> {
        Ok(self
            .installation_sandboxes(installation_id)
            .await?
            .into_iter()
            .filter_map(|(s, task_id)| {
                let id = s.current_session_id?;
                Some(ListedResource {
                    id,
                    task_id,
                    live: matches!(
                        s.status,
                        Some(SessionStatus::Pending | SessionStatus::Running)
                    ),
                })
            })
            .collect())
    }

    async fn listed_snapshots(
        &self,
        installation_id: &str,
    ) -> Result<Vec<ListedResource>, ProviderError> {
        let mut seen = HashSet::new();
        let mut listed = Vec::new();
        for (sb, task_id) in self.installation_sandboxes(installation_id).await? {
            for snap in self.client.list_all_snapshots(&sb.name).await? {
                if snap.status == SnapshotStatus::Deleted || !seen.insert(snap.id.clone()) {
                    continue;
                }
                listed.push(ListedResource {
                    live: snap.status == SnapshotStatus::Created,
                    id: snap.id,
                    task_id: task_id.clone(),
                });
            }
        }
        Ok(listed)
    }
}

/// The task id in a name made by [`crate::provider::sandbox_name`]
/// (`taskbox-{task}-g{n}-{installation}`).
pub fn task_from_name(name: &str) -> Option<String> {
    crate::provider::parse_sandbox_name(name).map(|(_, task, _)| task)
}

impl super::Platform for VercelProvider {
    type Error = ProviderError;

    fn name(&self) -> &'static str {
        "vercel_sandbox"
    }

    async fn create_sandbox(&self, spec: &SandboxSpec) -> Result<SandboxInfo, ProviderError> {
        self.create(spec).await
    }

    async fn exec_live(
        &self,
        sandbox_id: &SandboxId,
        req: &ExecRequest,
        io: ExecIo,
    ) -> Result<ExecOutput, ProviderError> {
        self.run(sandbox_id, req, io).await
    }

    async fn snapshot(
        &self,
        task_id: &TaskId,
        sandbox_id: &SandboxId,
        seq: u64,
    ) -> Result<SnapshotInfo, ProviderError> {
        self.take_snapshot(task_id, sandbox_id, seq).await
    }

    async fn stop_sandbox(&self, sandbox_id: &SandboxId) -> Result<(), ProviderError> {
        match self.client.stop_session(sandbox_id).await {
            // The stop answers once the session has stopped: its usage is final.
            Ok(answer) => self.remember_usage(sandbox_id, answer.session.usage()),
            Err(e) if e.kind == FailureKind::SandboxGone => self.remember_usage(sandbox_id, None),
            Err(e) => return Err(e),
        }
        self.forget(sandbox_id);
        Ok(())
    }

    async fn extend_timeout(
        &self,
        sandbox_id: &SandboxId,
        duration_ms: u64,
    ) -> Result<Millis, ProviderError> {
        let session = self.client.extend_timeout(sandbox_id, duration_ms).await?;
        session.deadline().ok_or_else(|| {
            ProviderError::new(
                FailureKind::Permanent,
                "extend timeout",
                format!("session {sandbox_id} reports no start time or timeout"),
            )
        })
    }

    async fn delete_snapshot(&self, snapshot_id: &SnapshotId) -> Result<(), ProviderError> {
        match self.client.delete_snapshot(snapshot_id).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind == FailureKind::SnapshotGone => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn probe_sandbox(&self, sandbox_id: &SandboxId) -> Result<Option<Millis>, ProviderError> {
        let session_id = sandbox_id.as_str();
        match self.client.get_session(session_id).await {
            Ok(s) => match s.status {
                SessionStatus::Pending | SessionStatus::Running => Ok(s.deadline()),
                // A persistent sandbox snapshots itself as it stops: wait for that snapshot
                // rather than give the sandbox up without it (the probe is retried). A session
                // `snapshotting` was snapshotted by a call (taskbox's own snapshot, recorded as
                // such), so it counts as stopped.
                SessionStatus::Stopping if self.settings.persistent => {
                    Err(ProviderError::transient(
                        "probe sandbox",
                        format!(
                            "session {session_id} is {:?}; waiting for it to stop",
                            s.status
                        ),
                        None,
                    ))
                }
                _ => {
                    self.remember_usage(session_id, s.usage());
                    Ok(None)
                }
            },
            Err(e) if e.kind == FailureKind::SandboxGone => {
                self.remember_usage(session_id, None);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    async fn platform_snapshot(
        &self,
        task_id: &TaskId,
        sandbox_id: &SandboxId,
    ) -> Result<Option<crate::core::PlatformSnapshot>, ProviderError> {
        self.find_platform_snapshot(task_id, sandbox_id).await
    }

    async fn session_usage(
        &self,
        sandbox_id: &SandboxId,
    ) -> Result<Option<crate::core::SessionUsage>, ProviderError> {
        self.ended_usage(sandbox_id).await
    }

    async fn list_sandboxes(
        &self,
        installation_id: &str,
    ) -> Result<Vec<ListedResource>, ProviderError> {
        self.listed_sandboxes(installation_id).await
    }

    async fn list_snapshots(
        &self,
        installation_id: &str,
    ) -> Result<Vec<ListedResource>, ProviderError> {
        self.listed_snapshots(installation_id).await
    }

    /// Vercel's session object says what an ended session used.
    fn reports_usage(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::sandbox_name;

    #[test]
    fn task_id_round_trips_through_the_sandbox_name() {
        for (task, generation) in [("demo", 0), ("a-g1", 12), ("x_y-z", 3)] {
            assert_eq!(
                task_from_name(&sandbox_name("0123456789abcdef", task, generation)).as_deref(),
                Some(task)
            );
        }
        assert_eq!(task_from_name("other-demo-g1"), None);
        assert_eq!(task_from_name("taskbox-demo"), None);
        assert_eq!(task_from_name("taskbox-demo-gx"), None);
    }
}
