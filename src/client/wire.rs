//! The objects of the server's HTTP API (`docs/api.md`), shared by [`crate::server`] and the
//! [client](super): request bodies, the health answer, and [`ApiError`].

use serde::{Deserialize, Serialize};

use crate::config::CommandEnv;
use crate::core::{Millis, Notice};
use crate::engine::RunResult;
use crate::provider::{CancelSignal, OutputChunk, OutputStream};

/// The API's version prefix: every path starts with it.
pub const API_PREFIX: &str = "/v1";

/// The Unix socket's file name in a data dir.
pub const SOCKET_FILE: &str = "taskbox.sock";

/// `POST /v1/tasks/{task}/run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRequest {
    /// A `bash -c` string.
    pub command: String,
    /// Per-command timeout in seconds (default: the server's `terminal.timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// The caller will send the command's stdin (`POST /v1/runs/{run}/stdin`); without it
    /// the command's stdin is empty and nothing waits for one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin: bool,
    /// Variables for the command, over the server's `terminal.env` (names
    /// `[A-Za-z_][A-Za-z0-9_]*`, not `TASKBOX_*`). Secrets: never journaled nor shown.
    #[serde(default, skip_serializing_if = "CommandEnv::is_empty")]
    pub env: CommandEnv,
}

/// One line of `POST /v1/tasks/{task}/run`'s NDJSON answer: `started` first, then `output`
/// chunks as the command writes them, then one `result` or `error`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum RunEvent {
    /// The run was accepted; `run` names it for `/v1/runs/{run}/cancel` and `/stdin`.
    Started {
        /// The run's id on this server.
        run: String,
    },
    /// A chunk of output, exactly as written: `text` when it is UTF-8, else `base64`.
    Output {
        /// `stdout` or `stderr`.
        stream: OutputStream,
        /// The chunk, when it is UTF-8.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// The chunk's bytes in base64, when it is not UTF-8.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base64: Option<String>,
    },
    /// The command ran: the result, as `taskbox run --json` prints it.
    Result(RunResult),
    /// The command could not be run: the error object of any other endpoint.
    Error(ApiError),
}

impl RunEvent {
    /// The line for a chunk of output.
    pub fn output(chunk: OutputChunk) -> RunEvent {
        use base64::Engine as _;
        match String::from_utf8(chunk.data) {
            Ok(text) => RunEvent::Output {
                stream: chunk.stream,
                text: Some(text),
                base64: None,
            },
            Err(e) => RunEvent::Output {
                stream: chunk.stream,
                text: None,
                base64: Some(base64::engine::general_purpose::STANDARD.encode(e.into_bytes())),
            },
        }
    }

    /// The chunk an `output` line carries (`None` for other lines or bad base64).
    pub fn into_chunk(self) -> Option<OutputChunk> {
        use base64::Engine as _;
        let RunEvent::Output {
            stream,
            text,
            base64,
        } = self
        else {
            return None;
        };
        let data = match (text, base64) {
            (Some(t), _) => t.into_bytes(),
            (None, Some(b)) => base64::engine::general_purpose::STANDARD.decode(b).ok()?,
            (None, None) => Vec::new(),
        };
        Some(OutputChunk { stream, data })
    }
}

/// `POST /v1/runs/{run}/cancel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    /// `INT`, `TERM` or `HUP`: sent to the command's process group (never the sandbox).
    pub signal: CancelSignal,
}

/// `POST /v1/tasks/{task}/remove`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveRequest {
    /// Keep the task's snapshots (`taskbox rm --keep-snapshots`).
    #[serde(default)]
    pub keep_snapshots: bool,
}

/// `POST /v1/tasks/{task}/fork`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkRequest {
    /// The new task.
    pub child: String,
    /// Which snapshot: `<task>.s<seq>`, `s<seq>`, a provider id, or absent (`latest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// `POST /v1/tasks/{task}/rewind`: exactly one of `to` and `back`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RewindRequest {
    /// The snapshot: `<task>.s<seq>`, `s<seq>` or a provider id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// How many snapshots back from the one holding the current files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub back: Option<u64>,
}

/// `POST /v1/gc`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcRequest {
    /// Only report.
    #[serde(default)]
    pub dry_run: bool,
}

/// A task with a live sandbox, as `GET /v1/health` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveTask {
    /// The task.
    pub task: String,
    /// Its state.
    pub state: String,
    /// Its sandbox.
    pub sandbox: String,
    /// The sandbox's platform deadline (ms since the epoch).
    pub deadline: Millis,
}

/// `GET /v1/health`: who serves, since when, and which tasks have live sandboxes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// The server's taskbox version.
    pub version: String,
    /// Its process id.
    pub pid: u32,
    /// When it started (ms since the epoch).
    pub started_at: Millis,
    /// The data dir it serves.
    pub data_dir: String,
    /// Started by the CLI (`serve --auto`): exits once idle with no live sandbox.
    pub auto: bool,
    /// `terminal.server_idle_exit_seconds` as the server read it.
    pub idle_exit_seconds: u64,
    /// The TCP address it also listens on, if any.
    pub tcp: Option<String>,
    /// Requests being served now.
    pub requests_in_flight: u64,
    /// Tasks with a live sandbox, by name.
    pub live_tasks: Vec<LiveTask>,
}

/// Every error the API answers with: a stable `code` to branch on, the message, the causes
/// below it, a hint when a fix is known, and notices (a sandbox expired, files lost...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// Stable: `invalid_task_id`, `bad_request`, `not_found`, `unauthorized`, `provider`,
    /// `busy`, `lock`, `interrupted`, `invalid_command`, `method_not_allowed`,
    /// `payload_too_large`, `headers_too_large`, `uri_too_long`, `too_many_connections`, `internal`, `store`, `step`, `stopped`, `config`, `no_such_task`, `wrong_backend`,
    /// `task_removed`, `in_flight`, `task_moved` and `task_elsewhere` (a fleet: the task moved
    /// to, or lives on, another server), and for a failed request its
    /// [`FailureReason`](crate::core::FailureReason) code (`command_failed`, `sandbox_expired`…).
    pub code: String,
    /// What went wrong.
    pub message: String,
    /// The causes, outermost first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<String>,
    /// How to fix it, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// What the caller should know.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notices: Vec<Notice>,
    /// Sending the same request again may succeed (`task_moved`, `task_elsewhere`, a store
    /// that lost its connection, a server stopping). Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retryable: bool,
}

impl ApiError {
    /// An error with no causes, hint or notices.
    pub fn new(code: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code: code.to_string(),
            message: message.into(),
            causes: Vec::new(),
            hint: None,
            notices: Vec::new(),
            retryable: false,
        }
    }

    /// With a hint.
    pub fn hint(mut self, hint: impl Into<String>) -> ApiError {
        self.hint = Some(hint.into());
        self
    }
}

/// One line of `GET /v1/tasks/{task}/watch` (NDJSON): the task's state when the watch began,
/// then each transition as it is committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WatchEvent {
    /// The first line: the task's state now (and again after `lagged`).
    State {
        /// The task.
        task: String,
        /// Its state.
        state: String,
        /// Its live sandbox, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<String>,
    },
    /// The task changed state.
    Transition {
        /// The task.
        task: String,
        /// State before.
        from: String,
        /// State after.
        to: String,
        /// The event that caused it (`run_requested`, `timer_fired`, `snapshot_taken`...).
        event: String,
        /// When it was committed (ms since the epoch).
        at: Millis,
    },
    /// The watcher fell behind and `missed` transitions were dropped; a `state` line follows.
    Lagged {
        /// How many.
        missed: u64,
    },
}
