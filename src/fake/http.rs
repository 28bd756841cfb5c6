//! The HTTP edge: the axum router, one handler per endpoint, the guard every API request passes
//! (statistics, auth, injected latency/429/5xx) and the `/_admin` endpoints.
//!
//! Handlers hold the world lock only to read or plan; processes, archives and streams run
//! outside it, then report back through the `finish_*` calls of [`World`].

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, MethodRouter};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

use super::conn::{channel_body, BodySender, ConnHandle};
use super::endpoint::Endpoint;
use super::exec::{self, CommandRun, EndCause, Event, SpawnSpec};
use super::faults::{CutMode, FaultState, Faults, StreamCut, Verdict};
use super::files::{self, FsError};
use super::model::{
    Access, Archived, CreatePlan, Due, ListQuery, NewSession, ResumePlan, StopPlan, StopWork,
    World, WORKSPACE_ROOT,
};
use super::stats::Stats;
use super::validate::{self, CreateApi, Limits};
use super::wire::ApiError;
use crate::clock::Clock;
use crate::core::{FailureKind, Millis};
use crate::provider::local::LocalProvider;
use crate::provider::{sandbox_name, ProviderError, SandboxProvider, SandboxSpec};

/// Largest `fs/write` upload.
const UPLOAD_LIMIT: usize = 1 << 30;
/// How long a stop waits for a session's processes to die.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How long a resume waits for a stopping session to finish stopping.
const RESUME_WAIT: Duration = Duration::from_secs(30);
/// The content type of command streams; the SDK compares it exactly.
const NDJSON: &str = "application/x-ndjson";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, Json(self.body())).into_response();
        if let Some(secs) = self.retry_after_s {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

impl From<FsError> for ApiError {
    fn from(e: FsError) -> Self {
        match &e {
            FsError::NotFound { .. } => ApiError::not_found(e.to_string()),
            FsError::Outside { .. }
            | FsError::IsDir { .. }
            | FsError::Exists { .. }
            | FsError::NoParent { .. }
            | FsError::BadArchive { .. } => ApiError::invalid(e.to_string()),
            FsError::Io { .. } => ApiError::internal(e.to_string()),
        }
    }
}

/// Everything the handlers share.
pub(crate) struct Shared {
    world: Mutex<World>,
    commands: Mutex<BTreeMap<String, Arc<CommandRun>>>,
    faults: Mutex<FaultState>,
    stats: Mutex<Stats>,
    token: Option<String>,
    limits: Limits,
    pub(crate) clock: Arc<dyn Clock>,
    /// Holds every session's workspace (one local sandbox per session) and every snapshot's
    /// archive.
    local: LocalProvider,
    /// The local sandboxes' own lifetime: longer than any session can live, so the fake alone
    /// decides when a session ends.
    local_timeout_ms: u64,
    /// `$HOME` directories of the sessions' commands.
    homes_dir: PathBuf,
    /// Serializes creates and resumes, so a retried create finds the first one's sandbox.
    create_lock: tokio::sync::Mutex<()>,
    next_cmd: AtomicU64,
    nonce: String,
}

/// Locks a mutex, keeping its data if a panic poisoned it (every critical section leaves the
/// data consistent between statements).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn blocking<T: Send + 'static>(
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
fn local_sandbox(session_id: &str) -> String {
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
            nonce,
        }
    }

    fn now(&self) -> Millis {
        self.clock.now_ms()
    }

    fn world(&self) -> MutexGuard<'_, World> {
        lock(&self.world)
    }

    fn faults_state(&self) -> MutexGuard<'_, FaultState> {
        lock(&self.faults)
    }

    fn stats_mut(&self) -> MutexGuard<'_, Stats> {
        lock(&self.stats)
    }

    pub(crate) fn stats(&self) -> Stats {
        self.stats_mut().clone()
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

    fn home(&self, session_id: &str) -> PathBuf {
        self.homes_dir.join(session_id)
    }

    /// The host directory `/vercel/sandbox` maps onto for a live session.
    fn workspace(&self, session_id: &str) -> Result<PathBuf, ApiError> {
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
            if let Err(e) = self.local.delete_snapshot(&archive).await {
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
    fn kill_session_commands(&self, session_id: &str) -> Vec<Arc<CommandRun>> {
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
    async fn reap(&self, session_id: &str, runs: Vec<Arc<CommandRun>>) {
        for run in &runs {
            if tokio::time::timeout(KILL_WAIT, run.wait()).await.is_err() {
                tracing::warn!(command = %run.id, "a command survived SIGKILL for {KILL_WAIT:?}");
            }
        }
        lock(&self.commands).retain(|_, r| r.session_id != session_id);
    }

    /// Discards a session's local sandbox and home.
    async fn discard(&self, session_id: &str) {
        if let Err(e) = self.local.stop_sandbox(&local_sandbox(session_id)).await {
            tracing::warn!(session = %session_id, error = %e, "could not discard the workspace");
        }
        let home = self.home(session_id);
        if let Err(e) = blocking(move || files::remove_dir(&home)).await {
            tracing::warn!(session = %session_id, error = %e, "could not remove the home directory");
        }
    }

    /// Snapshots a session's workspace through the local provider (which also discards it).
    async fn snapshot_workspace(&self, session_id: &str) -> Result<Archived, ProviderError> {
        // One snapshot per session: a snapshot ends the session.
        let info = self
            .local
            .snapshot(session_id, &local_sandbox(session_id), 1)
            .await?;
        Ok(Archived {
            key: info.id,
            size_bytes: info.size_bytes,
        })
    }

    /// Carries out a stop: processes die, the workspace is snapshotted if the sandbox persists,
    /// then discarded. Returns the auto-snapshot's id, if one was taken.
    async fn perform_stop(&self, work: StopWork) -> Option<String> {
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
    async fn ready(&self, session_id: &str) -> Result<(), ApiError> {
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
    async fn boot(&self, new: NewSession) -> Result<(), ApiError> {
        let session_id = new.session.id.clone();
        let spec = SandboxSpec {
            task_id: session_id.clone(),
            generation: 0,
            name: local_sandbox(&session_id),
            source_snapshot: new.source_archive.clone(),
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
        if let Err(e) = blocking(move || files::create_dir(&home)).await {
            self.discard(&session_id).await;
            return Err(ApiError::internal(format!(
                "could not prepare the sandbox filesystem: {e}"
            )));
        }
        let now = self.now();
        self.world().commit_session(new, now);
        Ok(())
    }

    fn command(&self, session_id: &str, cmd_id: &str) -> Result<Arc<CommandRun>, ApiError> {
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

    fn stream_cut(&self) -> Option<StreamCut> {
        self.faults_state().stream_cut()
    }

    fn count_cut(&self) {
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

type App = State<Arc<Shared>>;
type Pairs = Result<Query<Vec<(String, String)>>, QueryRejection>;

fn pairs(q: Pairs) -> Result<Vec<(String, String)>, ApiError> {
    q.map(|Query(p)| p)
        .map_err(|e| ApiError::invalid(format!("the query string is malformed ({e}).")))
}

fn param<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The API router (under `/api`), the admin router and the JSON 404 fallback.
pub(crate) fn router(app: Arc<Shared>) -> Router {
    let guarded = |endpoint: Endpoint, route: MethodRouter<Arc<Shared>>| {
        route.layer(from_fn_with_state((Arc::clone(&app), endpoint), guard))
    };
    let api = Router::new()
        .route(
            "/v2/sandboxes",
            guarded(Endpoint::CreateSandbox, post(create_sandbox)),
        )
        .route(
            "/v3/sandboxes",
            guarded(Endpoint::CreateSandbox, post(create_sandbox_v3)),
        )
        .route(
            "/v2/sandboxes",
            guarded(Endpoint::ListSandboxes, get(list_sandboxes)),
        )
        .route(
            "/v2/sandboxes/{name}",
            guarded(Endpoint::GetSandbox, get(get_sandbox)),
        )
        .route(
            "/v2/sandboxes/{name}",
            guarded(Endpoint::DeleteSandbox, delete(delete_sandbox)),
        )
        .route(
            "/v2/sandboxes/sessions",
            guarded(Endpoint::ListSessions, get(list_sessions)),
        )
        .route(
            "/v2/sandboxes/sessions/{id}",
            guarded(Endpoint::GetSession, get(get_session)),
        )
        .route(
            "/v2/sandboxes/sessions/{id}/stop",
            guarded(Endpoint::StopSession, post(stop_session)),
        )
        .route(
            "/v2/sandboxes/sessions/{id}/extend-timeout",
            guarded(Endpoint::ExtendTimeout, post(extend_timeout)),
        )
        .route(
            "/v2/sandboxes/sessions/{id}/cmd",
            guarded(Endpoint::RunCommand, post(run_command)),
        )
        .route(
            "/v2/sandboxes/sessions/{id}/cmd/{cmd}",
            guarded(Endpoint::GetCommand, get(get_command)),
        )
        .route(
            "/v2/sandboxes/sessions/{id}/cmd/{cmd}/logs",
            guarded(Endpoint::CommandLogs, get(command_logs)),
        )
        .route(
            "/v2/sandboxes/sessions/{id}/cmd/{cmd}/kill",
            guarded(Endpoint::KillCommand, post(kill_command)),
        )
        .route(
            "/v2/sandboxes/sessions/{id}/fs/write",
            guarded(
                Endpoint::WriteFiles,
                post(write_files).layer(DefaultBodyLimit::max(UPLOAD_LIMIT)),
            ),
        )
        .route(
            "/v2/sandboxes/sessions/{id}/fs/read",
            guarded(Endpoint::ReadFile, post(read_file)),
        )
        .route(
            "/v2/sandboxes/sessions/{id}/fs/mkdir",
            guarded(Endpoint::MakeDir, post(make_dir)),
        )
        .route(
            "/v2/sandboxes/sessions/{id}/snapshot",
            guarded(Endpoint::CreateSnapshot, post(create_snapshot)),
        )
        .route(
            "/v2/sandboxes/snapshots",
            guarded(Endpoint::ListSnapshots, get(list_snapshots)),
        )
        .route(
            "/v2/sandboxes/snapshots/{id}",
            guarded(Endpoint::GetSnapshot, get(get_snapshot)),
        )
        .route(
            "/v2/sandboxes/snapshots/{id}",
            guarded(Endpoint::DeleteSnapshot, delete(delete_snapshot)),
        );
    let admin = Router::new()
        .route("/faults", get(admin_get_faults).post(admin_set_faults))
        .route("/stats", get(admin_stats).delete(admin_reset_stats))
        .route("/expire-session/{id}", post(admin_expire_session))
        .route("/expire-snapshot/{id}", post(admin_expire_snapshot));
    Router::new()
        .nest("/api", api)
        .nest("/_admin", admin)
        .fallback(fallback)
        .with_state(app)
}

async fn fallback(method: Method, uri: Uri) -> ApiError {
    let path = uri.path();
    let hint = if path.starts_with("/api/v3/") {
        " Of the v3 API, taskbox fake-vercel implements only POST /v3/sandboxes; the rest is v2."
    } else if !path.starts_with("/api/") && !path.starts_with("/_admin/") {
        " The API is served under /api (base URL http://HOST:PORT/api)."
    } else {
        ""
    };
    ApiError::not_found(format!(
        "taskbox fake-vercel does not serve {method} {path}.{hint}"
    ))
}

/// Every API request passes here: it is counted, delayed, authenticated and possibly failed on
/// purpose before its handler runs.
async fn guard(
    State((app, endpoint)): State<(Arc<Shared>, Endpoint)>,
    req: Request,
    next: Next,
) -> Response {
    app.stats_mut().count_request(endpoint);
    app.spawn_due();
    let latency = app.faults_state().latency_ms();
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let resp = match check_auth(app.token.as_deref(), req.headers()) {
        Err(e) => e.into_response(),
        Ok(()) => {
            let verdict = app.faults_state().decide(endpoint);
            match verdict {
                Verdict::Proceed => next.run(req).await,
                Verdict::RateLimited { retry_after_s } => {
                    app.stats_mut().injected.rate_limited += 1;
                    ApiError {
                        retry_after_s: Some(retry_after_s),
                        ..ApiError::new(
                            429,
                            "rate_limited",
                            "Too many requests (injected by taskbox fake-vercel). Retry later.",
                        )
                    }
                    .into_response()
                }
                Verdict::Error { status } => {
                    app.stats_mut().injected.errors += 1;
                    ApiError::new(
                        status,
                        "internal_server_error",
                        "An unexpected error occurred (injected by taskbox fake-vercel).",
                    )
                    .into_response()
                }
            }
        }
    };
    app.stats_mut()
        .count_response(endpoint, resp.status().as_u16());
    resp
}

/// Bearer auth: 401 without a token; 403 with the wrong one when the fake has a token.
fn check_auth(expected: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let Some(given) = given else {
        return Err(ApiError::new(
            401,
            "unauthorized",
            "Missing `Authorization: Bearer <token>` header.",
        ));
    };
    match expected {
        Some(token) if !constant_time_eq(given.as_bytes(), token.as_bytes()) => Err(ApiError::new(
            403,
            "forbidden",
            "Not authorized: the token is invalid or expired.",
        )),
        _ => Ok(()),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn create_sandbox(
    State(app): App,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    body: Bytes,
) -> Result<Response, ApiError> {
    detached(create(app, conn, body, CreateApi::V2)).await
}

async fn create_sandbox_v3(
    State(app): App,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    body: Bytes,
) -> Result<Response, ApiError> {
    detached(create(app, conn, body, CreateApi::V3)).await
}

async fn create(
    app: Arc<Shared>,
    conn: ConnHandle,
    body: Bytes,
    api: CreateApi,
) -> Result<Response, ApiError> {
    let req = validate::create_request(&body, &app.limits, api)?;
    let guard = app.create_lock.lock().await;
    let now = app.now();
    let plan = app.world().plan_create(req, now)?;
    let name = match plan {
        CreatePlan::Existing { name } => name,
        CreatePlan::New(new) => {
            let name = new.session.sandbox_name.clone();
            app.boot(*new).await?;
            tracing::info!(sandbox = %name, "sandbox created");
            name
        }
    };
    drop(guard);
    let now = app.now();
    let answer = app.world().sandbox_answer(&name, None, now)?;
    let dropped = app.faults_state().take_drop_create();
    if let Some(mode) = dropped {
        app.stats_mut().injected.dropped_creates += 1;
        if mode == super::faults::DropMode::Close {
            conn.kill();
        }
        return Err(ApiError::internal(
            "The sandbox was created but the response was lost (injected by taskbox fake-vercel).",
        ));
    }
    Ok(Json(answer).into_response())
}

async fn get_sandbox(
    State(app): App,
    Path(name): Path<String>,
    query: Pairs,
) -> Result<Json<Value>, ApiError> {
    let pairs = pairs(query)?;
    let project = param(&pairs, "projectId").map(str::to_string);
    let mut resumed = false;
    if param(&pairs, "resume") == Some("true") {
        let _guard = app.create_lock.lock().await;
        let give_up = tokio::time::Instant::now() + RESUME_WAIT;
        loop {
            let now = app.now();
            let plan = app.world().plan_resume(&name, project.as_deref(), now)?;
            match plan {
                ResumePlan::Current => break,
                ResumePlan::New(new) => {
                    app.boot(*new).await?;
                    resumed = true;
                    break;
                }
                ResumePlan::Wait if tokio::time::Instant::now() >= give_up => {
                    return Err(ApiError::new(
                        422,
                        "sandbox_stopping",
                        format!("The sandbox {name} is still stopping; retry the resume."),
                    ));
                }
                ResumePlan::Wait => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
    let now = app.now();
    let mut answer = app.world().sandbox_answer(&name, project.as_deref(), now)?;
    answer["resumed"] = Value::Bool(resumed);
    Ok(Json(answer))
}

async fn delete_sandbox(
    State(app): App,
    Path(name): Path<String>,
    query: Pairs,
) -> Result<Json<Value>, ApiError> {
    let pairs = pairs(query)?;
    let now = app.now();
    let (view, stop) = app
        .world()
        .delete_sandbox(&name, param(&pairs, "projectId"), now)?;
    if let Some(work) = stop {
        app.perform_stop(work).await;
    }
    Ok(Json(json!({ "sandbox": view })))
}

async fn list_sandboxes(State(app): App, query: Pairs) -> Result<Json<Value>, ApiError> {
    let q = ListQuery::parse(&pairs(query)?)?;
    let now = app.now();
    Ok(Json(app.world().list_sandboxes(&q, now)))
}

async fn list_sessions(State(app): App, query: Pairs) -> Result<Json<Value>, ApiError> {
    let q = ListQuery::parse(&pairs(query)?)?;
    let now = app.now();
    Ok(Json(app.world().list_sessions(&q, now)))
}

async fn list_snapshots(State(app): App, query: Pairs) -> Result<Json<Value>, ApiError> {
    let q = ListQuery::parse(&pairs(query)?)?;
    let now = app.now();
    Ok(Json(app.world().list_snapshots(&q, now)))
}

async fn get_session(State(app): App, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let now = app.now();
    Ok(Json(app.world().session_answer(&id, now)?))
}

async fn stop_session(State(app): App, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    detached(stop_session_work(app, id)).await
}

async fn stop_session_work(app: Arc<Shared>, id: String) -> Result<Json<Value>, ApiError> {
    let now = app.now();
    let plan = app.world().begin_stop(&id, now)?;
    let snapshot = match plan {
        StopPlan::AlreadyStopped => None,
        StopPlan::Stop(work) => app.perform_stop(work).await,
    };
    let now = app.now();
    let world = app.world();
    let session = world
        .session(&id)
        .ok_or_else(|| ApiError::internal(format!("session {id} vanished while stopping")))?;
    let mut answer = json!({ "session": world.session_view(session, now) });
    if let Some(sb) = world.sandbox(&session.sandbox_name) {
        answer["sandbox"] = json!(world.sandbox_view(sb, now));
    }
    if let Some(snap) = snapshot {
        answer["snapshot"] = json!(world.get_snapshot(&snap, now)?);
    }
    Ok(Json(answer))
}

async fn extend_timeout(
    State(app): App,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let duration = validate::extend_request(&body)?;
    let now = app.now();
    let mut world = app.world();
    world.extend(&id, duration, now)?;
    let session = world.session(&id).expect("extend() found the session");
    Ok(Json(json!({ "session": world.session_view(session, now) })))
}

async fn run_command(
    State(app): App,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req = validate::run_request(&body)?;
    app.ready(&id).await?;
    let cwd = files::resolve(None, req.cwd.as_deref().unwrap_or(WORKSPACE_ROOT));
    let workspace = app.workspace(&id)?;
    let host_cwd = files::host_path(&workspace, &cwd)?;
    if !host_cwd.is_dir() {
        return Err(ApiError::invalid(format!(
            "`cwd` {cwd} is not a directory in the sandbox."
        )));
    }
    let mut env = app
        .world()
        .session(&id)
        .map(|s| s.env.clone())
        .unwrap_or_default();
    env.extend(req.env);
    // The local provider's stop finds the processes a session left behind by this variable.
    env.insert(
        "TASKBOX_WORKSPACE".to_string(),
        workspace.display().to_string(),
    );
    let n = app.next_cmd.fetch_add(1, Ordering::SeqCst) + 1;
    let spec = SpawnSpec {
        id: format!("cmd_{}{n:05}", app.nonce),
        session_id: id.clone(),
        command: req.command,
        args: req.args,
        cwd,
        host_cwd,
        home: app.home(&id),
        env,
        timeout: req.timeout_ms.map(Duration::from_millis),
    };
    let run = exec::spawn(spec, Arc::clone(&app.clock));
    lock(&app.commands).insert(run.id.clone(), Arc::clone(&run));
    // A stop that began between `ready` and the insert did not see this command.
    let now = app.now();
    let still = app.world().access(&id, now);
    if let Err(e) = still {
        run.kill_for_session_stop();
        return Err(e);
    }
    if !req.wait {
        return Ok(Json(json!({ "command": run.view() })).into_response());
    }
    Ok(command_stream(&app, run, true, req.logs))
}

fn ndjson_line(value: &Value) -> Bytes {
    let mut line = value.to_string().into_bytes();
    line.push(b'\n');
    Bytes::from(line)
}

async fn send_line(tx: &BodySender, value: Value) -> bool {
    tx.send(Ok(ndjson_line(&value))).await.is_ok()
}

/// An NDJSON response following a command: its log chunks (if `logs`), framed by its command
/// record before and after (if `records`). A session stopping under it ends the stream with an
/// in-band error record; a configured cut ends it early.
fn command_stream(app: &Arc<Shared>, run: Arc<CommandRun>, records: bool, logs: bool) -> Response {
    let (tx, body) = channel_body();
    let app = Arc::clone(app);
    let cut = app.stream_cut();
    tokio::spawn(async move {
        if records {
            let mut first = run.view();
            first.exit_code = None;
            first.duration_ms = None;
            if !send_line(&tx, json!({ "command": first })).await {
                return;
            }
        }
        let deadline = cut
            .as_ref()
            .map(|c| tokio::time::Instant::now() + Duration::from_millis(c.after_ms));
        let mut cursor = run.cursor();
        loop {
            let event = match deadline {
                Some(at) => tokio::select! {
                    ev = cursor.next() => ev,
                    () = tokio::time::sleep_until(at) => {
                        app.count_cut();
                        let mode = cut.as_ref().map_or(CutMode::Abort, |c| c.mode);
                        match mode {
                            CutMode::Abort => {
                                let _ = tx.send(Err(io::Error::other("stream cut by fault injection"))).await;
                            }
                            CutMode::ErrorRecord => {
                                send_line(&tx, json!({"stream": "error", "data": {
                                    "code": "sandbox_stream_closed",
                                    "message": "The command stream was closed (injected by taskbox fake-vercel); poll the command instead.",
                                }})).await;
                            }
                        }
                        return;
                    }
                },
                None => cursor.next().await,
            };
            let ok = match event {
                Some(Event::Logs(chunks)) if logs => {
                    let mut ok = true;
                    for c in chunks {
                        ok = ok
                            && send_line(&tx, json!({"stream": c.stream.as_str(), "data": c.data}))
                                .await;
                    }
                    ok
                }
                Some(Event::Logs(_)) => true,
                Some(Event::Finished(exit)) => {
                    if exit.cause == EndCause::SessionStopped {
                        send_line(&tx, json!({"stream": "error", "data": {
                            "code": "sandbox_stopped",
                            "message": format!("The sandbox session {} stopped while the command was running.", run.session_id),
                        }}))
                        .await;
                    } else if records {
                        send_line(&tx, json!({ "command": run.view() })).await;
                    }
                    return;
                }
                None => return,
            };
            if !ok {
                return;
            }
        }
    });
    let mut resp = body.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON));
    resp
}

async fn get_command(
    State(app): App,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    Path((id, cmd)): Path<(String, String)>,
    query: Pairs,
) -> Result<Json<Value>, ApiError> {
    let pairs = pairs(query)?;
    let now = app.now();
    app.world().readable(&id, now)?;
    let run = app.command(&id, &cmd)?;
    if param(&pairs, "wait") == Some("true") {
        let exit = match app.stream_cut() {
            Some(cut) => tokio::select! {
                exit = run.wait() => exit,
                () = tokio::time::sleep(Duration::from_millis(cut.after_ms)) => {
                    // A long poll has sent nothing yet: cutting it drops the connection.
                    app.count_cut();
                    conn.kill();
                    return Err(ApiError::internal("long poll cut by fault injection"));
                }
            },
            None => run.wait().await,
        };
        if exit.cause == EndCause::SessionStopped {
            return Err(ApiError::sandbox_stopped(&id));
        }
    }
    Ok(Json(json!({ "command": run.view() })))
}

async fn command_logs(
    State(app): App,
    Path((id, cmd)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let now = app.now();
    app.world().readable(&id, now)?;
    let run = app.command(&id, &cmd)?;
    Ok(command_stream(&app, run, false, true))
}

async fn kill_command(
    State(app): App,
    Path((id, cmd)): Path<(String, String)>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let signal = validate::kill_request(&body)?;
    let now = app.now();
    app.world().readable(&id, now)?;
    let run = app.command(&id, &cmd)?;
    run.signal(signal);
    Ok(Json(json!({ "command": run.view() })))
}

async fn write_files(
    State(app): App,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let x_cwd = headers
        .get("x-cwd")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("/")
        .to_string();
    if !x_cwd.starts_with('/') {
        return Err(ApiError::invalid(format!(
            "the `x-cwd` header should be an absolute path (got {x_cwd:?})."
        )));
    }
    app.ready(&id).await?;
    let ws = app.workspace(&id)?;
    blocking(move || files::extract_upload(&ws, &x_cwd, &body)).await?;
    Ok(Json(json!({})))
}

async fn read_file(
    State(app): App,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req = validate::path_request(&body)?;
    app.ready(&id).await?;
    let ws = app.workspace(&id)?;
    let path = blocking(move || files::readable_file(&ws, req.cwd.as_deref(), &req.path)).await?;
    let mut file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| ApiError::internal(format!("open {}: {e}", path.display())))?;
    let (tx, body) = channel_body();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match file.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => {
                    if tx
                        .send(Ok(Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
    });
    let mut resp = body.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(resp)
}

async fn make_dir(
    State(app): App,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req = validate::path_request(&body)?;
    app.ready(&id).await?;
    let ws = app.workspace(&id)?;
    blocking(move || files::make_dir(&ws, req.cwd.as_deref(), &req.path, req.recursive)).await?;
    Ok(Json(json!({})))
}

/// Runs a handler's work to completion even if the client goes away, as the real service does:
/// a request it accepted is carried out, only the answer is lost. (axum drops a handler's future
/// when its connection closes; without this a client killed mid-snapshot would leave the session
/// `snapshotting` forever.)
async fn detached<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::spawn(work).await.unwrap_or_else(|e| {
        Err(ApiError::internal(format!(
            "the request's work failed: {e}"
        )))
    })
}

async fn create_snapshot(
    State(app): App,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    detached(create_snapshot_work(app, id, body)).await
}

async fn create_snapshot_work(
    app: Arc<Shared>,
    id: String,
    body: Bytes,
) -> Result<Response, ApiError> {
    let expiration = validate::snapshot_request(&body)?;
    app.ready(&id).await?;
    let now = app.now();
    let snap_id = app.world().begin_snapshot(&id, now)?;
    let runs = app.kill_session_commands(&id);
    let archived = app.snapshot_workspace(&id).await;
    // A snapshot that worked already discarded the workspace; one that failed did not.
    app.discard(&id).await;
    app.reap(&id, runs).await;
    let now = app.now();
    let mut world = app.world();
    match archived {
        Ok(archived) => world.finish_snapshot(&id, &snap_id, archived, expiration, now),
        Err(e) => {
            world.fail_session(&id, now);
            return Err(ApiError::internal(format!(
                "could not write the snapshot: {e}"
            )));
        }
    }
    tracing::info!(session = %id, snapshot = %snap_id, "snapshot created");
    let session = world
        .session(&id)
        .expect("begin_snapshot found the session");
    let answer = json!({
        "snapshot": world.get_snapshot(&snap_id, now)?,
        "session": world.session_view(session, now),
    });
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

async fn get_snapshot(State(app): App, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let now = app.now();
    Ok(Json(
        json!({ "snapshot": app.world().get_snapshot(&id, now)? }),
    ))
}

async fn delete_snapshot(State(app): App, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let now = app.now();
    let (view, archive) = app.world().delete_snapshot(&id, now)?;
    if let Err(e) = app.local.delete_snapshot(&archive).await {
        tracing::warn!(snapshot = %id, error = %e, "could not remove a deleted snapshot's archive");
    }
    Ok(Json(json!({ "snapshot": view })))
}

async fn admin_get_faults(State(app): App) -> Json<Faults> {
    Json(app.faults())
}

async fn admin_set_faults(State(app): App, body: Bytes) -> Result<Json<Faults>, ApiError> {
    let faults: Faults = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("the faults body is not valid: {e}.")))?;
    faults
        .validate()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    tracing::info!(?faults, "faults replaced");
    app.set_faults(faults);
    Ok(Json(app.faults()))
}

async fn admin_stats(State(app): App) -> Json<Stats> {
    Json(app.stats())
}

async fn admin_reset_stats(State(app): App) -> Json<Stats> {
    app.reset_stats();
    Json(app.stats())
}

async fn admin_expire_session(
    State(app): App,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(app.expire_session(&id).await?))
}

async fn admin_expire_snapshot(
    State(app): App,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    app.expire_snapshot(&id).await?;
    let now = app.now();
    let world = app.world();
    // An expired snapshot no longer answers GET; show the record anyway.
    let view = world
        .snapshot_record(&id)
        .map(|s| world.snapshot_view(s, now));
    Ok(Json(json!({ "snapshot": view })))
}
