//! Snapshot handlers: create (which ends the session; carried out even if the client goes
//! away), get, delete and list.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{detached, pairs, App, Pairs, Shared};
use crate::fake::model::ListQuery;
use crate::fake::validate;
use crate::fake::wire::ApiError;
use crate::provider::SandboxProvider;

pub(super) async fn list_snapshots(State(app): App, query: Pairs) -> Result<Json<Value>, ApiError> {
    let q = ListQuery::parse(&pairs(query)?)?;
    let now = app.now();
    Ok(Json(app.world().list_snapshots(&q, now)))
}

pub(super) async fn create_snapshot(
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

pub(super) async fn get_snapshot(
    State(app): App,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let now = app.now();
    Ok(Json(
        json!({ "snapshot": app.world().get_snapshot(&id, now)? }),
    ))
}

pub(super) async fn delete_snapshot(
    State(app): App,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let now = app.now();
    let (view, archive) = app.world().delete_snapshot(&id, now)?;
    if let Err(e) = app
        .local
        .delete_snapshot(&crate::ids::SnapshotId::from(archive.as_str()))
        .await
    {
        tracing::warn!(snapshot = %id, error = %e, "could not remove a deleted snapshot's archive");
    }
    Ok(Json(json!({ "snapshot": view })))
}
