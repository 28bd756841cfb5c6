//! The HTTP API under `/v1` (written down in `docs/api.md`): one handler per endpoint, each a
//! thin call into the [`Orchestrator`], errors as [`ApiError`] objects, and the bearer-token
//! check that guards the TCP listener.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

use super::answer::{body, engine_failure, failure, task_id, Answer};
use super::AppState;
use crate::client::wire::{ApiError, GcRequest, Health, LiveTask, API_PREFIX};
use crate::engine::EngineError;

/// The API's routes.
pub(super) fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/health", get(health))
        .route("/tasks", get(tasks))
        .route("/tasks/{task}", get(show))
        .route("/tasks/{task}/run", post(super::runs::run))
        .route("/runs/{run}/cancel", post(super::runs::cancel))
        .route("/runs/{run}/stdin", post(super::runs::stdin))
        .route("/tasks/{task}/suspend", post(suspend))
        .route("/tasks/{task}/resume", post(resume))
        .route("/tasks/{task}/watch", get(super::watch::watch))
        .route("/tasks/{task}/remove", post(remove))
        .route("/tasks/{task}/fork", post(fork))
        .route(
            "/tasks/{task}/checkpoint",
            post(super::checkpoint::checkpoint),
        )
        .route("/tasks/{task}/rewind", post(super::checkpoint::rewind))
        .route("/gc", post(gc))
        .route("/cost", get(super::cost::cost))
        .route("/shutdown", post(shutdown));
    Router::new()
        .nest(API_PREFIX, v1)
        .route(super::metrics::PATH, get(super::metrics::metrics))
        .merge(super::dashboard::routes())
        .fallback(|| async {
            failure(
                StatusCode::NOT_FOUND,
                ApiError::new("not_found", "no such endpoint")
                    .hint("docs/api.md lists the endpoints; every path starts with /v1"),
            )
        })
        .layer(axum::middleware::from_fn(json_errors))
        .layer(axum::middleware::from_fn(super::conn::body_idle_timeout))
        .with_state(state)
}

/// The most of an error body written by axum itself (a rejection's plain text) kept as the
/// JSON error's message.
const REJECTION_TEXT_MAX: usize = 16 * 1024;

/// Every error answer is an [`ApiError`] object: the ones axum writes itself before a handler
/// runs (a method the path does not take: 405 with an empty body; a body over the limit: 413;
/// a query or path it cannot parse: 400 — plain text) get one too, with a stable code and the
/// text as the message.
async fn json_errors(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let res = next.run(req).await;
    let status = res.status();
    let is_json = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if status.as_u16() < 400 || is_json {
        return res;
    }
    let text = axum::body::to_bytes(res.into_body(), REJECTION_TEXT_MAX)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let err = match status {
        StatusCode::METHOD_NOT_ALLOWED => ApiError::new(
            "method_not_allowed",
            format!("{method} is not an operation of {path}"),
        )
        .hint("docs/api.md lists each endpoint with its method"),
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            "payload_too_large",
            "the request body is over the server's limit",
        )
        .hint("send a long command's input on its stdin (`POST /v1/runs/{run}/stdin`)"),
        s if s.is_client_error() => ApiError::new(
            "bad_request",
            if text.is_empty() { s.to_string() } else { text },
        ),
        s => ApiError::new(
            "internal",
            if text.is_empty() { s.to_string() } else { text },
        ),
    };
    failure(status, err).into_response()
}

async fn health(State(st): State<AppState>) -> Answer<Health> {
    let loaded = st.orch.loaded_tasks().await.map_err(engine_failure)?;
    let live_tasks = loaded
        .into_iter()
        .filter_map(|t| {
            let sb = t.sandbox?;
            Some(LiveTask {
                task: t.id.to_string(),
                state: t.state.as_str().to_string(),
                sandbox: sb.id.to_string(),
                deadline: sb.deadline,
            })
        })
        .collect();
    let i = &st.info;
    Ok(Json(Health {
        version: env!("CARGO_PKG_VERSION").to_string(),
        pid: i.pid,
        started_at: i.started_at,
        data_dir: i.data_dir.clone(),
        auto: i.auto,
        idle_exit_seconds: i.idle_exit_seconds,
        tcp: i.tcp.clone(),
        requests_in_flight: st.activity.in_flight(),
        live_tasks,
    }))
}

async fn suspend(
    State(st): State<AppState>,
    Path(task): Path<String>,
) -> Answer<crate::engine::SuspendResult> {
    let _busy = st.activity.begin();
    let task = task_id(&task)?;
    st.orch
        .suspend(&task)
        .await
        .map(Json)
        .map_err(engine_failure)
}

async fn remove(
    State(st): State<AppState>,
    Path(task): Path<String>,
    bytes: Bytes,
) -> Answer<crate::engine::RemoveResult> {
    let _busy = st.activity.begin();
    let task = task_id(&task)?;
    let req: crate::client::wire::RemoveRequest = body(&bytes)?;
    st.orch
        .remove(&task, req.keep_snapshots)
        .await
        .map(Json)
        .map_err(engine_failure)
}

async fn fork(
    State(st): State<AppState>,
    Path(task): Path<String>,
    bytes: Bytes,
) -> Answer<crate::engine::ForkResult> {
    let _busy = st.activity.begin();
    let task = task_id(&task)?;
    let req: crate::client::wire::ForkRequest = body(&bytes)?;
    if req.child.is_empty() {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            ApiError::new("bad_request", "the request body names no `child` task")
                .hint("send {\"child\": \"NEW-TASK\"} (and \"snapshot\": \"TASK.sN\" for an older snapshot)"),
        ));
    }
    let child = task_id(&req.child)?;
    let from = req
        .snapshot
        .as_deref()
        .map_or(crate::core::ForkFrom::Latest, |s| {
            crate::core::ForkFrom::parse(&task, s)
        });
    st.orch
        .fork(&task, &child, from)
        .await
        .map(Json)
        .map_err(engine_failure)
}

async fn resume(
    State(st): State<AppState>,
    Path(task): Path<String>,
) -> Answer<crate::engine::ResumeResult> {
    let _busy = st.activity.begin();
    let task = task_id(&task)?;
    st.orch
        .resume(&task)
        .await
        .map(Json)
        .map_err(engine_failure)
}

async fn tasks(State(st): State<AppState>) -> Answer<serde_json::Value> {
    let _busy = st.activity.begin();
    let tasks = st.orch.tasks().await.map_err(engine_failure)?;
    let mut v = serde_json::to_value(tasks).map_err(|e| {
        failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::new("encode", format!("cannot encode the tasks: {e}")),
        )
    })?;
    crate::redact::redact_value(&mut v);
    Ok(Json(v))
}

/// `?journal=N` on `GET /v1/tasks/{task}`.
#[derive(Deserialize)]
struct ShowQuery {
    #[serde(default = "twenty")]
    journal: usize,
}

fn twenty() -> usize {
    20
}

async fn show(
    State(st): State<AppState>,
    Path(task): Path<String>,
    Query(q): Query<ShowQuery>,
) -> Answer<serde_json::Value> {
    let _busy = st.activity.begin();
    let task = task_id(&task)?;
    match st.orch.show(&task, q.journal).await {
        Ok(Some(view)) => view.to_redacted_json().map(Json).map_err(|e| {
            failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                ApiError::new("encode", format!("cannot encode the task: {e}")),
            )
        }),
        Ok(None) => {
            let names: Vec<String> = st
                .orch
                .tasks()
                .await
                .map_err(engine_failure)?
                .into_iter()
                .map(|t| t.id.to_string())
                .collect();
            Err(engine_failure(EngineError::NoTask {
                suggestion: crate::engine::closest(task.as_str(), names.iter().map(String::as_str)),
                task,
            }))
        }
        Err(e) => Err(engine_failure(e)),
    }
}

async fn gc(State(st): State<AppState>, bytes: Bytes) -> Answer<crate::engine::GcReport> {
    let _busy = st.activity.begin();
    let req: GcRequest = body(&bytes)?;
    st.orch
        .gc(req.dry_run)
        .await
        .map(Json)
        .map_err(engine_failure)
}

async fn shutdown(State(st): State<AppState>) -> Json<serde_json::Value> {
    st.stop.notify_one();
    Json(serde_json::json!({ "stopping": true }))
}

/// The guard of a TCP listener (`serve --listen`, `taskbox mcp --http`): `Authorization: Bearer
/// <token>` or 401, before any handler runs.
/// The token is compared in constant time and never echoed.
pub async fn require_token(State(token): State<Arc<String>>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .unwrap_or("");
    if constant_time_eq(given.as_bytes(), token.as_bytes()) {
        return next.run(req).await;
    }
    tracing::warn!(path = %req.uri().path(), "refused a TCP request without the right bearer token");
    unauthorized()
}

/// The 401 of a TCP request without the right bearer token.
pub(super) fn unauthorized() -> Response {
    failure(
        StatusCode::UNAUTHORIZED,
        ApiError::new("unauthorized", "missing or wrong bearer token").hint(
            "send `Authorization: Bearer <token>` with the token of the server's --token-file",
        ),
    )
    .into_response()
}

/// The token of an `Authorization` value of the `Bearer` scheme, whose name is
/// case-insensitive (RFC 9110 §11.1: `bearer` and `BEARER` are `Bearer` too).
pub(super) fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// Compares without an early exit, so timing does not reveal how much of a guess was right.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    /// The scheme of `Authorization: Bearer` is case-insensitive (issue 32 item 11: a
    /// lower-case `bearer` got 401); anything else is no token.
    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for v in ["Bearer tok", "bearer tok", "BEARER tok", "bEaReR  tok"] {
            assert_eq!(super::bearer_token(v), Some("tok"), "{v}");
        }
        for v in ["Basic tok", "Bearertok", "tok", ""] {
            assert_eq!(super::bearer_token(v), None, "{v}");
        }
    }

    use super::constant_time_eq;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"secret"));
    }
}
