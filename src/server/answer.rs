//! How the API answers a failure: [`Failure`] (a status and an [`ApiError`] body), a task id
//! checked from a path, and an engine error mapped to its status and code. Below the handlers
//! (`http`, `runs`, `watch`), which all answer through it.

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;

use crate::client::wire::ApiError;
use crate::core::FailureReason;
use crate::engine::EngineError;
use crate::ids::TaskId;
use crate::store::StoreError;

/// An error answer: a status and an [`ApiError`] body.
pub(super) struct Failure(StatusCode, pub(super) Box<ApiError>);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(*self.1)).into_response()
    }
}

/// A failure answered with `status` and `err`.
pub(super) fn failure(status: StatusCode, err: ApiError) -> Failure {
    Failure(status, Box::new(err))
}

/// A request body read as `T`, which must be a JSON object: serde's derived structs also take
/// an array of their fields in order (`[]` was a `GcRequest`, `["ls"]` a `RunRequest`), which no
/// client means and `docs/openapi.yaml` does not allow (schemathesis found both). The error is
/// the reason, for the endpoint's `bad_request`.
pub(super) fn json_object<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let kind = match &value {
        serde_json::Value::Object(_) => {
            return serde_json::from_value(value).map_err(|e| e.to_string())
        }
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Null => "null",
    };
    Err(format!("it is {kind}, not a JSON object"))
}

/// The task id a path names, or a 400 that says what a task id is.
pub(super) fn task_id(s: &str) -> Result<TaskId, Failure> {
    TaskId::new(s).map_err(|e| {
        failure(
            StatusCode::BAD_REQUEST,
            ApiError::new("invalid_task_id", e.to_string()).hint(
                "a task id is 1 to 64 letters, digits, `-` or `_`, starting with a letter or digit",
            ),
        )
    })
}

/// An engine error as the API answers it: a stable code per kind, the message, its causes,
/// the hint the CLI would print, and the notices.
pub(super) fn engine_failure(err: EngineError) -> Failure {
    let status = match &err {
        EngineError::TaskId(_) | EngineError::InvalidCommand { .. } => StatusCode::BAD_REQUEST,
        // A fork's refusals are about the request, not the provider.
        EngineError::Request { reason, .. } => match **reason {
            FailureReason::UnknownSnapshot { .. } => StatusCode::NOT_FOUND,
            FailureReason::NothingToFork { .. } => StatusCode::CONFLICT,
            // A rewind's refusals too: the task's files are unchanged.
            FailureReason::SnapshotUnusable { .. }
            | FailureReason::RewindTooFar { .. }
            | FailureReason::NotPersistent => StatusCode::CONFLICT,
            _ => StatusCode::BAD_GATEWAY,
        },
        EngineError::Provider { .. } => StatusCode::BAD_GATEWAY,
        // A fleet: the task is another server's (now); the error names it.
        EngineError::Store(StoreError::LeaseLost { .. } | StoreError::LeaseHeld { .. }) => {
            StatusCode::CONFLICT
        }
        // The caller cancelled while the task was another process's.
        EngineError::Busy { .. }
        | EngineError::Interrupted { .. }
        | EngineError::WrongBackend { .. }
        | EngineError::TaskExists { .. }
        | EngineError::InFlight { .. } => StatusCode::CONFLICT,
        EngineError::NoTask { .. } => StatusCode::NOT_FOUND,
        EngineError::Removed { .. } => StatusCode::GONE,
        EngineError::Stopped => StatusCode::SERVICE_UNAVAILABLE,
        EngineError::Store(_)
        | EngineError::Config(_)
        | EngineError::Step(_)
        | EngineError::Lock { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let code = err.code();
    let hint = match &err {
        EngineError::Stopped => Some("the server is stopping; run the command again".to_string()),
        other => other.hint(),
    };
    let notices = match &err {
        EngineError::Request { notices, .. } => notices.clone(),
        _ => Vec::new(),
    };
    let retryable = err.is_retryable();
    let message = err.to_string();
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            causes.push(text);
        }
        source = s.source();
    }
    failure(
        status,
        ApiError {
            code: code.to_string(),
            message,
            causes,
            hint,
            notices,
            retryable,
        },
    )
}

/// What a JSON endpoint answers.
pub(super) type Answer<T> = Result<Json<T>, Failure>;

/// A request body as `T`: empty (or blank) is `T::default()`, anything else must be a JSON
/// object of its fields (400 `bad_request` otherwise).
pub(super) fn body<T: DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, Failure> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    json_object(bytes).map_err(|e| {
        failure(
            StatusCode::BAD_REQUEST,
            ApiError::new("bad_request", format!("the request body is not valid: {e}")),
        )
    })
}
