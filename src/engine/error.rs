//! [`EngineError`]: every way a request to the engine can fail, with the task it concerns.

use std::path::PathBuf;

use crate::core::{FailureReason, Notice, StepError};
use crate::ids::{TaskId, TaskIdError};
use crate::store::StoreError;

/// An engine failure, with the task it concerns.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The configuration has a value out of its bounds.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
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
        task: TaskId,
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
        backend: String,
        /// What went wrong.
        message: String,
        /// How to fix it, if known.
        hint: Option<String>,
    },
    /// Another process drives the task and did not let go in time.
    #[error("task {task} is busy: another taskbox process has driven it for over {waited_secs} s (lock {path})")]
    Busy {
        /// The task.
        task: TaskId,
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited_secs: u64,
    },
    /// The caller cancelled (a signal) while another process still drove the task: nothing
    /// ran.
    #[error("task {task}: SIG{signal} while waiting for another taskbox process to let go of it; the command did not run")]
    Interrupted {
        /// The task.
        task: TaskId,
        /// The signal's short name (`INT`, `TERM`, `HUP`).
        signal: &'static str,
    },
    /// A command that can never run (a NUL byte, over the argument limit); nothing was made.
    #[error("task {task}: {problem}; nothing was run or created")]
    InvalidCommand {
        /// The task.
        task: TaskId,
        /// What is wrong with it (never the whole command).
        problem: String,
    },
    /// The task lock could not be taken.
    #[error("cannot lock task {task} ({path})")]
    Lock {
        /// The task.
        task: TaskId,
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The event loop has stopped.
    #[error("the taskbox engine has stopped")]
    Stopped,
    /// The task has an operation in flight, which the request (`rm`) must not cut short.
    #[error("task {task} has an operation in flight (state {state}); it cannot be removed now")]
    InFlight {
        /// The task.
        task: TaskId,
        /// Its state.
        state: String,
    },
    /// A request other than `run` named a task that does not exist (only `run` creates one).
    #[error("no task named `{task}`")]
    NoTask {
        /// The name given.
        task: TaskId,
        /// The closest existing task name, if one is close.
        suggestion: Option<String>,
    },
    /// The task was made under another backend than the one configured now.
    #[error(
        "task {task} belongs to the {task_backend} backend, but terminal.backend is {current}"
    )]
    WrongBackend {
        /// The task.
        task: TaskId,
        /// The backend that holds its sandboxes and snapshots.
        task_backend: String,
        /// The backend configured now.
        current: String,
    },
    /// A fork named a new task that already exists (or existed: a removed task's name is not
    /// reused).
    #[error("task {task} already exists; a fork makes a new task")]
    TaskExists {
        /// The name given.
        task: TaskId,
    },
    /// The task was removed with `taskbox rm`.
    #[error("task {task} was removed at {removed_at}")]
    Removed {
        /// The task.
        task: TaskId,
        /// When (RFC 3339).
        removed_at: String,
    },
}

impl EngineError {
    /// A stable name for the kind of failure, for scripts (the server's and `--json`'s `code`).
    pub fn code(&self) -> &'static str {
        match self {
            // A fleet's answers (PostgreSQL store): retryable, at the server that has it.
            EngineError::Store(StoreError::LeaseLost { .. }) => "task_moved",
            EngineError::Store(StoreError::LeaseHeld { .. }) => "task_elsewhere",
            EngineError::Store(_) => "store",
            EngineError::Config(_) => "config",
            EngineError::TaskId(_) => "invalid_task_id",
            EngineError::Step(_) => "step",
            EngineError::Request { reason, .. } => reason.code(),
            EngineError::InFlight { .. } => "in_flight",
            EngineError::Provider { .. } => "provider",
            EngineError::Busy { .. } => "busy",
            EngineError::Lock { .. } => "lock",
            EngineError::Interrupted { .. } => "interrupted",
            EngineError::InvalidCommand { .. } => "invalid_command",
            EngineError::Stopped => "stopped",
            EngineError::NoTask { .. } => "no_such_task",
            EngineError::WrongBackend { .. } => "wrong_backend",
            EngineError::Removed { .. } => "task_removed",
            EngineError::TaskExists { .. } => "task_exists",
        }
    }

    /// Whether sending the same request again may succeed: a lost connection to the store, a
    /// task that moved to (or lives on) another server of a fleet, a request whose transition
    /// the store did not take (`not_committed`: nothing of it was performed; the task is
    /// recovered from the journal at the next request).
    pub fn is_retryable(&self) -> bool {
        match self {
            EngineError::Store(e) => e.is_retryable(),
            EngineError::Stopped => true,
            EngineError::Request { reason, .. } => {
                matches!(**reason, FailureReason::NotCommitted { .. })
            }
            _ => false,
        }
    }

    /// How to fix it, when known.
    pub fn hint(&self) -> Option<String> {
        match self {
            EngineError::Provider { hint, .. } => hint.clone(),
            EngineError::Config(e) => e.hint(),
            EngineError::TaskId(_) => Some(
                "a task id is 1 to 64 letters, digits, `-` or `_`, starting with a letter or digit"
                    .into(),
            ),
            EngineError::Busy { .. } => Some(
                "another taskbox process is driving this task; wait for it to finish".into(),
            ),
            EngineError::Request { reason, .. } => reason.hint().map(str::to_string),
            EngineError::Store(e) => e.hint(),
            EngineError::InFlight { task, .. } => Some(format!(
                "wait for it to finish, or `taskbox suspend {task}` first, then try again"
            )),
            EngineError::NoTask { suggestion: Some(s), .. } => Some(format!(
                "did you mean `{s}`? `taskbox tasks` lists the tasks; only `taskbox run --task NAME -- CMD` creates one"
            )),
            EngineError::NoTask { suggestion: None, .. } => Some(
                "`taskbox tasks` lists the tasks; only `taskbox run --task NAME -- CMD` creates one".into(),
            ),
            EngineError::WrongBackend { task, task_backend, current } => Some(format!(
                "switch back with `taskbox config set terminal.backend {task_backend}` to drive it, or `taskbox rm {task}` under {task_backend} and start anew under {current}"
            )),
            EngineError::InvalidCommand { .. } => Some(format!(
                "put long input in a file in the task's workspace (or send it on the command's stdin) and keep the command short, at most {} bytes, without NUL bytes",
                super::api::MAX_COMMAND_BYTES
            )),
            EngineError::TaskExists { task } => Some(format!(
                "pick a name no task has (`taskbox tasks` lists them), e.g. `{task}-2`"
            )),
            EngineError::Removed { .. } => Some(
                "a removed task's name is not reused (its journal is kept for `taskbox replay`); run the work under a new task name".into(),
            ),
            _ => None,
        }
    }
}

/// The closest of `names` to `name` (edit distance at most a third of its length, at least 2),
/// for a "did you mean" hint.
pub fn closest<'a>(name: &str, names: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let limit = (name.chars().count() / 3).max(2);
    names
        .into_iter()
        .filter(|n| *n != name)
        .map(|n| (edit_distance(name, n), n))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, n)| n.to_string())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    #[test]
    fn suggests_the_closest_name_only_when_close() {
        let names = ["build-api", "deploy", "docs"];
        assert_eq!(super::closest("buid-api", names), Some("build-api".into()));
        assert_eq!(super::closest("dosc", names), Some("docs".into()));
        assert_eq!(super::closest("zzzzzzzz", names), None);
    }
}
