//! `GET /metrics`: the process's Prometheus metrics ([`crate::engine::metrics`]) in the text format,
//! on the Unix socket and, behind the bearer token, on `--listen`. What is only known by
//! looking is read here, at each scrape: every task's state (as `GET /v1/tasks` reads them)
//! and the sandboxes of the loaded tasks.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::answer::{engine_failure, Failure};
use super::AppState;

/// The path Prometheus scrapes (its default `metrics_path`), outside `/v1`.
pub(super) const PATH: &str = "/metrics";

/// Renders every metric. Asking does not count as activity (an auto-started server still exits
/// when idle, as with `GET /v1/health`).
pub(super) async fn metrics(State(st): State<AppState>) -> Result<Response, Failure> {
    let tasks = st.orch.tasks().await.map_err(engine_failure)?;
    let open = st
        .orch
        .loaded_tasks()
        .await
        .map_err(engine_failure)?
        .iter()
        .filter(|t| t.sandbox.is_some())
        .count();
    let text = crate::engine::metrics::global().render(tasks.iter().map(|t| t.state), open);
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, crate::engine::metrics::CONTENT_TYPE)],
        text,
    )
        .into_response())
}
