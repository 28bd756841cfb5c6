//! [`EngineError`]: every way a request to the engine can fail, with the task it concerns.

use std::path::PathBuf;

use crate::core::{Notice, StepError};
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
    #[error("task {task}: {message}")]
    Request {
        /// The task.
        task: String,
        /// The last real error, with context.
        message: String,
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
