//! Sandbox handlers: create (v2 and v3, idempotent by name, carried out even if the client
//! goes away), get by name (with `resume=true` booting a new session), delete and list.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{detached, pairs, param, App, Pairs, Shared};
use crate::fake::conn::ConnHandle;
use crate::fake::faults::DropMode;
use crate::fake::model::{CreatePlan, ListQuery, ResumePlan};
use crate::fake::validate::{self, CreateApi};
use crate::fake::wire::ApiError;

/// How long a resume waits for a stopping session to finish stopping.
const RESUME_WAIT: Duration = Duration::from_secs(30);

pub(super) async fn create_sandbox(
    State(app): App,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    body: Bytes,
) -> Result<Response, ApiError> {
    detached(create(app, conn, body, CreateApi::V2)).await
}

pub(super) async fn create_sandbox_v3(
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
        if mode == DropMode::Close {
            conn.kill();
        }
        return Err(ApiError::internal(
            "The sandbox was created but the response was lost (injected by taskbox fake-vercel).",
        ));
    }
    Ok(Json(answer).into_response())
}

pub(super) async fn get_sandbox(
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

pub(super) async fn delete_sandbox(
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

pub(super) async fn list_sandboxes(State(app): App, query: Pairs) -> Result<Json<Value>, ApiError> {
    let q = ListQuery::parse(&pairs(query)?)?;
    let now = app.now();
    Ok(Json(app.world().list_sandboxes(&q, now)))
}
