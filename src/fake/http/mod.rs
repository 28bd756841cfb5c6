//! The HTTP edge: the axum router, one handler per endpoint, the guard every API request passes
//! (statistics, auth, injected latency/429/5xx) and the `/_admin` endpoints.
//!
//! Handlers hold the world lock only to read or plan; processes, archives and streams run
//! outside it, then report back through the `finish_*` calls of
//! [`World`](super::model::World).
//!
//! Rooms: `shared` holds [`Shared`] (the world, the running commands, the storage) and the
//! effects the world's plans ask for (booting, stopping, snapshotting workspaces); `guard` the
//! guard; `errors` how an [`ApiError`] becomes a response; the handlers are grouped by resource
//! in `sandboxes`, `sessions`, `commands`, `fs` and `snapshots`; `admin` serves `/_admin`.

mod admin;
mod commands;
mod errors;
mod fs;
mod guard;
mod sandboxes;
mod sessions;
mod shared;
mod snapshots;

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::Request;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{header, Method, Uri};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, MethodRouter};
use axum::Router;

use self::admin::{
    admin_expire_session, admin_expire_snapshot, admin_get_faults, admin_reset_stats,
    admin_set_faults, admin_stats,
};
use self::commands::{command_logs, get_command, kill_command, run_command};
use self::fs::{make_dir, read_file, write_files};
use self::guard::guard;
use self::sandboxes::{
    create_sandbox, create_sandbox_v3, delete_sandbox, get_sandbox, list_sandboxes,
};
use self::sessions::{extend_timeout, get_session, list_sessions, stop_session};
use self::snapshots::{create_snapshot, delete_snapshot, get_snapshot, list_snapshots};
use super::endpoint::Endpoint;
use super::wire::ApiError;

pub(crate) use self::shared::{Shared, Storage};

/// Largest `fs/write` upload (streamed, so it costs no memory).
const UPLOAD_LIMIT: u64 = 1 << 30;

/// Largest body of every other endpoint (axum's default: their bodies are small JSON objects).
const BODY_LIMIT: usize = 2 << 20;

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
                post(write_files).layer(DefaultBodyLimit::disable()),
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
        .route("/expire-snapshot/{id}", post(admin_expire_snapshot))
        .layer(from_fn_with_state(Arc::clone(&app), admin_guard));
    Router::new()
        .nest("/api", api)
        .nest("/_admin", admin)
        .fallback(fallback)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(from_fn(json_errors))
        .with_state(app)
}

/// Every error answer is the service's JSON error object: the ones axum makes itself — 405 for
/// a method a path does not take (its `Allow` header kept), 413 for a body over the limit, the
/// extractors' rejections — are plain text or empty, and are rewritten here.
async fn json_errors(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let allow = resp.headers().get(header::ALLOW).cloned();
    let error = match status.as_u16() {
        405 => ApiError::new(
            405,
            "method_not_allowed",
            format!(
                "{method} is not allowed on {path}; it takes {}.",
                allow
                    .as_ref()
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("other methods")
            ),
        ),
        413 => ApiError::too_large(BODY_LIMIT as u64),
        code => {
            let text = axum::body::to_bytes(resp.into_body(), 64 * 1024)
                .await
                .map(|b| String::from_utf8_lossy(&b).trim().to_string())
                .unwrap_or_default();
            let message = if text.is_empty() {
                format!("{method} {path} failed")
            } else {
                text
            };
            if code >= 500 {
                ApiError::internal(message)
            } else {
                ApiError::invalid(message)
            }
        }
    };
    let mut out = ApiError {
        status: status.as_u16(),
        ..error
    }
    .into_response();
    if let Some(allow) = allow {
        out.headers_mut().insert(header::ALLOW, allow);
    }
    out
}

/// The `/_admin` endpoints take the same bearer token as the API when the fake has one (`--token`):
/// 401 without it, 403 with another. Without `--token` they are open, as the API takes any token.
async fn admin_guard(State(app): App, req: Request, next: Next) -> Response {
    if app.token.is_some() {
        if let Err(e) = guard::check_auth(app.token.as_deref(), req.headers()) {
            return e.into_response();
        }
    }
    next.run(req).await
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
