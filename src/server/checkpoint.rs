//! `POST /v1/tasks/{task}/checkpoint` and `POST /v1/tasks/{task}/rewind` (docs/api.md): thin
//! calls into [`Orchestrator::checkpoint`](crate::engine::Orchestrator::checkpoint) and
//! [`Orchestrator::rewind`](crate::engine::Orchestrator::rewind).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

use super::answer::{body, engine_failure, failure, task_id, Answer};
use super::AppState;
use crate::client::wire::{ApiError, RewindRequest};

pub(super) async fn checkpoint(
    State(st): State<AppState>,
    Path(task): Path<String>,
) -> Answer<crate::engine::CheckpointResult> {
    let _busy = st.activity.begin();
    let task = task_id(&task)?;
    st.orch
        .checkpoint(&task)
        .await
        .map(Json)
        .map_err(engine_failure)
}

pub(super) async fn rewind(
    State(st): State<AppState>,
    Path(task): Path<String>,
    bytes: Bytes,
) -> Answer<crate::engine::RewindResult> {
    let _busy = st.activity.begin();
    let task = task_id(&task)?;
    let req: RewindRequest = body(&bytes)?;
    let to = crate::engine::rewind_to(&task, req.to.as_deref(), req.back).map_err(|why| {
        failure(
            StatusCode::BAD_REQUEST,
            ApiError::new("bad_request", why).hint(
                "send {\"to\": \"TASK.sN\"} or {\"back\": N}; `GET /v1/tasks/{task}` lists the \
                 task's snapshots",
            ),
        )
    })?;
    st.orch
        .rewind(&task, to)
        .await
        .map(Json)
        .map_err(engine_failure)
}
