//! Session handlers: list, get, stop (carried out even if the client goes away) and extend
//! the timeout.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use super::{detached, pairs, App, Pairs, Shared};
use crate::fake::model::{ListQuery, StopPlan};
use crate::fake::validate;
use crate::fake::wire::ApiError;

pub(super) async fn list_sessions(State(app): App, query: Pairs) -> Result<Json<Value>, ApiError> {
    let q = ListQuery::parse(&pairs(query)?)?;
    let now = app.now();
    Ok(Json(app.world().list_sessions(&q, now)))
}

pub(super) async fn get_session(
    State(app): App,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let now = app.now();
    Ok(Json(app.world().session_answer(&id, now)?))
}

pub(super) async fn stop_session(
    State(app): App,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
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

pub(super) async fn extend_timeout(
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
