//! `GET /v1/cost`: what tasks used, from their journals — `taskbox cost` for a server on
//! another machine (`taskbox --server URL cost`, issue 32 item 19). The answer is exactly
//! `taskbox cost --json`'s object, priced with the server's `cost.*` keys as it runs with them.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

use super::answer::{engine_failure, failure, task_id, Failure};
use super::AppState;
use crate::client::wire::ApiError;
use crate::clock::{Clock, SystemClock};
use crate::engine::cost;

/// `?task=T&since=7d`, both optional.
#[derive(Deserialize)]
pub(super) struct CostQuery {
    task: Option<String>,
    since: Option<String>,
}

/// One task's ledger, or every task's that used something in the window, with their totals.
pub(super) async fn cost(
    State(st): State<AppState>,
    Query(q): Query<CostQuery>,
) -> Result<Json<serde_json::Value>, Failure> {
    let _busy = st.activity.begin();
    let since = q.since.as_deref().map(str::trim);
    let since_ms = since.map(cost::parse_since).transpose().map_err(|e| {
        failure(
            StatusCode::BAD_REQUEST,
            ApiError::new("invalid_since", e.to_string()).hint(e.hint()),
        )
    })?;
    let task = q.task.as_deref().map(task_id).transpose()?;
    let all = task.is_none();
    let prices = st.config.running().await.prices();
    let window = cost::window(since_ms, SystemClock.now_ms());
    let rows = st
        .orch
        .ledgers(task, window)
        .await
        .map_err(engine_failure)?;
    Ok(Json(cost::report_json(&rows, &prices, since, window, all)))
}
