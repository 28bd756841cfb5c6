//! [`EngineError`]: every way a request to the engine can fail, with the task it concerns.

use std::path::PathBuf;

use crate::core::{FailureReason, Notice, StepError};
use crate::ids::TaskIdError;
use crate::store::StoreError;

/// An engine failure, with the task it concerns.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A task id was refused.
    #[error(transparent)]
    TaskId(#[from] TaskIdError),
    /// The core refused an event.
    #[error(transparent)]
    Step(#[from] StepError),
    /// A request finished with a failure (after retries, where retrying made sense).
    #[error("task {task}: {reason}")]
    Request {
        /// The task.
        task: String,
        /// Why, with the last real error (its wording, code and hint are made there). Boxed to
        /// keep `EngineError` small.
        reason: Box<FailureReason>,
        /// Attempts made.
        attempts: u32,
        /// What the caller should know (sandbox expired, files lost...).
        notices: Vec<Notice>,
    },
    /// The provider could not be set up, or a reconciliation call failed.
    #[error("{backend} backend: {message}")]
    Provider {
        /// The backend.
        backend: &'static str,
        /// What went wrong.
        message: String,
        /// How to fix it, if known.
        hint: Option<String>,
    },
    /// Another process drives the task and did not let go in time.
    #[error("task {task} is busy: another taskbox process has driven it for over {waited_secs} s (lock {path})")]
    Busy {
        /// The task.
        task: String,
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited_secs: u64,
    },
    /// The task lock could not be taken.
    #[error("cannot lock task {task} ({path})")]
    Lock {
        /// The task.
        task: String,
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The event loop has stopped.
    #[error("the taskbox engine has stopped")]
    Stopped,
}

impl EngineError {
    /// The stable snake_case code the server answers with (a failed request's comes from its
    /// [`FailureReason`]).
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::Store(_) => "store",
            EngineError::TaskId(_) => "invalid_task_id",
            EngineError::Step(_) => "step",
            EngineError::Request { reason, .. } => reason.code(),
            EngineError::Provider { .. } => "provider",
            EngineError::Busy { .. } => "busy",
            EngineError::Lock { .. } => "lock",
            EngineError::Stopped => "stopped",
        }
    }

    /// What the user can do about it, for the CLI and the server alike (a failed request's
    /// comes from its [`FailureReason`]). A stopped engine has none here: what to do depends on
    /// who stopped it (the server says so itself).
    pub fn hint(&self) -> Option<String> {
        match self {
            EngineError::Provider { hint, .. } => hint.clone(),
            EngineError::Busy { .. } => Some(
                "another taskbox process is driving this task; wait for it to finish".to_string(),
            ),
            EngineError::Request { reason, .. } => reason.hint().map(str::to_string),
            EngineError::Store(_)
            | EngineError::Stopped
            | EngineError::TaskId(_)
            | EngineError::Step(_)
            | EngineError::Lock { .. } => None,
        }
    }
}
