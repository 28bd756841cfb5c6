//! The `/_admin` handlers (beside the API, behind its token when the fake has one): read and replace the faults, read
//! and reset the statistics, expire a session or a snapshot now.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use super::App;
use crate::fake::faults::Faults;
use crate::fake::stats::Stats;
use crate::fake::wire::ApiError;

pub(super) async fn admin_get_faults(State(app): App) -> Json<Faults> {
    Json(app.faults())
}

pub(super) async fn admin_set_faults(
    State(app): App,
    body: Bytes,
) -> Result<Json<Faults>, ApiError> {
    let faults: Faults = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("the faults body is not valid: {e}.")))?;
    faults
        .validate()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    tracing::info!(?faults, "faults replaced");
    app.set_faults(faults);
    Ok(Json(app.faults()))
}

pub(super) async fn admin_stats(State(app): App) -> Json<Stats> {
    Json(app.stats())
}

pub(super) async fn admin_reset_stats(State(app): App) -> Json<Stats> {
    app.reset_stats();
    Json(app.stats())
}

pub(super) async fn admin_expire_session(
    State(app): App,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(app.expire_session(&id).await?))
}

pub(super) async fn admin_expire_snapshot(
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
