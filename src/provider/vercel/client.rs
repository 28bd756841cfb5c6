//! The Vercel Sandbox v2 REST client: one method per endpoint, typed objects, and the single
//! place where an HTTP outcome becomes a classified [`ProviderError`] ([`classify`]).
//!
//! Transport rules (see `vercel-sandbox-api.md`): every request carries `?teamId=`, a bearer
//! token, `content-type: application/json` (even on GETs; file upload uses `application/gzip`)
//! and a user-agent. The client never retries: transient failures go back to the engine, which
//! retries with backoff and honours `Retry-After`. The one exception lives in the provider (the
//! long-poll loop of a running command), not here.
//!
//! Tokens never reach an error: the bearer header is marked sensitive, transport errors are
//! stripped of their URL, and messages quote only the server's error code and message.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::auth::{AuthMode, Credentials, OIDC_FIX};
use crate::clock::Clock;
use crate::core::{FailureKind, Millis};
use crate::provider::ProviderError;

/// Page size for list calls (the API's maximum).
pub const MAX_PAGE: u32 = 50;

/// How long an ordinary (non-streaming) call may take before it counts as a network failure.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Stopping and snapshotting block until the VM has stopped; give them longer.
const BLOCKING_CALL_TIMEOUT: Duration = Duration::from_secs(600);
/// Connecting should be quick; a black-holed address must not hang a caller.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest server message quoted in an error.
const MAX_QUOTED: usize = 300;

/// The client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientBuildError {
    /// The base URL does not parse or is not http(s).
    #[error("invalid Vercel API URL `{url}`: {reason}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// Why.
        reason: String,
    },
    /// The HTTP stack (TLS roots) failed to initialise.
    #[error("cannot initialise the HTTP client")]
    Http(#[source] reqwest::Error),
}

// ----------------------------------------------------------------------------------------------
// API objects. Unknown fields are ignored and most fields are optional, so a server that adds
// or omits a field does not break parsing; only what taskbox relies on is required.
// ----------------------------------------------------------------------------------------------

/// A session's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// Booting.
    Pending,
    /// Accepting commands.
    Running,
    /// Shutting down.
    Stopping,
    /// Stopped (terminal).
    Stopped,
    /// Failed (terminal).
    Failed,
    /// Aborted (terminal).
    Aborted,
    /// A snapshot is being taken; it stops afterwards.
    Snapshotting,
    /// A status this client does not know.
    #[serde(other)]
    Unknown,
}

impl SessionStatus {
    /// `stopped`, `failed` or `aborted`: the session will never run again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            SessionStatus::Stopped | SessionStatus::Failed | SessionStatus::Aborted
        )
    }
}

/// One boot of a named sandbox. Commands run in sessions.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    /// Session id: the handle taskbox gives the engine.
    pub id: String,
    /// Status.
    pub status: SessionStatus,
    /// Lifetime from start, ms (grows with extend-timeout).
    #[serde(default)]
    pub timeout: Option<u64>,
    /// When it was requested.
    #[serde(default)]
    pub requested_at: Option<Millis>,
    /// When it started running.
    #[serde(default)]
    pub started_at: Option<Millis>,
    /// When it stopped.
    #[serde(default)]
    pub stopped_at: Option<Millis>,
    /// When it was created.
    #[serde(default)]
    pub created_at: Option<Millis>,
    /// The snapshot it booted from.
    #[serde(default)]
    pub source_snapshot_id: Option<String>,
    /// Working directory of commands.
    #[serde(default)]
    pub cwd: Option<String>,
    /// vCPUs.
    #[serde(default)]
    pub vcpus: Option<u32>,
    /// Memory, MB.
    #[serde(default)]
    pub memory: Option<u32>,
    /// Runtime image.
    #[serde(default)]
    pub runtime: Option<String>,
}

impl Session {
    /// When the platform stops it: start (or request, while pending) plus its timeout.
    pub fn deadline(&self) -> Option<Millis> {
        let start = self.started_at.or(self.requested_at).or(self.created_at)?;
        Some(start.saturating_add(self.timeout?))
    }
}

/// A named sandbox (persists across sessions).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// Its name.
    pub name: String,
    /// The latest session.
    #[serde(default)]
    pub current_session_id: Option<String>,
    /// The latest snapshot.
    #[serde(default)]
    pub current_snapshot_id: Option<String>,
    /// Status of the current session.
    #[serde(default)]
    pub status: Option<SessionStatus>,
    /// Tags.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Created at.
    #[serde(default)]
    pub created_at: Option<Millis>,
}

/// A sandbox with its current session, as create and get-by-name return it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SandboxAndSession {
    /// The named sandbox.
    pub sandbox: Sandbox,
    /// Its current session.
    pub session: Session,
}

/// A command.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Command {
    /// Command id.
    pub id: String,
    /// Exit code; `None` while running.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// Started at.
    #[serde(default)]
    pub started_at: Option<Millis>,
    /// Runtime so far, ms.
    #[serde(default)]
    pub duration_ms: Option<u64>,
}

/// A snapshot status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotStatus {
    /// Complete and usable.
    Created,
    /// Deleted.
    Deleted,
    /// The attempt failed.
    Failed,
    /// A status this client does not know.
    #[serde(other)]
    Unknown,
}

/// A filesystem snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// Snapshot id.
    pub id: String,
    /// The session it was taken of.
    #[serde(default)]
    pub source_session_id: Option<String>,
    /// Status.
    pub status: SnapshotStatus,
    /// Size.
    #[serde(default)]
    pub size_bytes: u64,
    /// Expiry (absent: never).
    #[serde(default)]
    pub expires_at: Option<Millis>,
    /// Created at.
    #[serde(default)]
    pub created_at: Option<Millis>,
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// The cursor of the next page, if any.
    pub next: Option<String>,
}

#[derive(Deserialize)]
struct Pagination {
    #[serde(default)]
    next: Value,
}

impl Pagination {
    /// The cursor is opaque: a string in v2, a number in v1; `null` ends the list.
    fn cursor(&self) -> Option<String> {
        match &self.next {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
struct SandboxesPage {
    sandboxes: Vec<Sandbox>,
    pagination: Option<Pagination>,
}

#[derive(Deserialize)]
struct SnapshotsPage {
    snapshots: Vec<Snapshot>,
    pagination: Option<Pagination>,
}

#[derive(Deserialize)]
struct SessionBody {
    session: Session,
}

#[derive(Deserialize)]
struct CommandBody {
    command: Command,
}

#[derive(Deserialize)]
struct SnapshotBody {
    snapshot: Snapshot,
}

/// What `create snapshot` returns: the snapshot and the (now stopping) session.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SnapshotAndSession {
    /// The snapshot.
    pub snapshot: Snapshot,
    /// The session it was taken of.
    #[serde(default)]
    pub session: Option<Session>,
}

/// A sandbox to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateSandbox {
    /// The name (idempotency key).
    pub name: String,
    /// Runtime image; ignored (never sent) when `source_snapshot` is set, because the API
    /// refuses the pair (hermes-agent #74753 lost every restore to it).
    pub runtime: String,
    /// vCPUs.
    pub vcpus: u32,
    /// Lifetime, ms.
    pub timeout_ms: u64,
    /// Tags (at most 5).
    pub tags: BTreeMap<String, String>,
    /// Boot from this snapshot.
    pub source_snapshot: Option<String>,
}

/// A command to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCommand {
    /// The executable (not a shell string).
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Working directory (`None`: the session's).
    pub cwd: Option<String>,
    /// Environment.
    pub env: BTreeMap<String, String>,
    /// Run with sudo.
    pub sudo: bool,
    /// Server-side kill (SIGKILL) after this long, ms.
    pub timeout_ms: Option<u64>,
}

/// One record of a command's NDJSON stream (`wait:true` run or `/logs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// A command record: the first one (running) or the last (with the exit code).
    Command(Command),
    /// A run of stdout bytes (not necessarily a line).
    Stdout(String),
    /// A run of stderr bytes.
    Stderr(String),
    /// An in-band error, e.g. `sandbox_stream_closed`.
    Error {
        /// The code.
        code: String,
        /// The message.
        message: String,
    },
}

/// A streaming body broke before its end (transport error or a malformed record).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StreamCut(pub String);

/// An NDJSON response body read record by record. HTTP chunks and records do not align, so
/// bytes are buffered until a newline.
pub struct NdjsonStream {
    response: Response,
    buf: Vec<u8>,
    done: bool,
}

impl fmt::Debug for NdjsonStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NdjsonStream")
            .field("buffered", &self.buf.len())
            .field("done", &self.done)
            .finish()
    }
}

impl NdjsonStream {
    fn new(response: Response) -> NdjsonStream {
        NdjsonStream {
            response,
            buf: Vec::new(),
            done: false,
        }
    }

    /// The next record; `Ok(None)` at a clean end of the body.
    pub async fn next(&mut self) -> Result<Option<StreamEvent>, StreamCut> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                match parse_record(&line[..line.len() - 1])? {
                    Some(ev) => return Ok(Some(ev)),
                    None => continue,
                }
            }
            if self.done {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                // A last record without a trailing newline is still a record.
                let line = std::mem::take(&mut self.buf);
                return parse_record(&line);
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk),
                Ok(None) => self.done = true,
                Err(e) => {
                    return Err(StreamCut(format!(
                        "stream broken: {}",
                        error_chain(&e.without_url())
                    )))
                }
            }
        }
    }
}

fn parse_record(line: &[u8]) -> Result<Option<StreamEvent>, StreamCut> {
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let v: Value = serde_json::from_str(text)
        .map_err(|e| StreamCut(format!("malformed stream record ({e})")))?;
    if let Some(cmd) = v.get("command") {
        let cmd: Command = serde_json::from_value(cmd.clone())
            .map_err(|e| StreamCut(format!("malformed command record ({e})")))?;
        return Ok(Some(StreamEvent::Command(cmd)));
    }
    let data = v.get("data");
    match v.get("stream").and_then(Value::as_str) {
        Some("stdout") => Ok(Some(StreamEvent::Stdout(
            data.and_then(Value::as_str).unwrap_or("").to_string(),
        ))),
        Some("stderr") => Ok(Some(StreamEvent::Stderr(
            data.and_then(Value::as_str).unwrap_or("").to_string(),
        ))),
        Some("error") => Ok(Some(StreamEvent::Error {
            code: data
                .and_then(|d| d.get("code"))
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string(),
            message: data
                .and_then(|d| d.get("message"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        })),
        // Records of kinds this client does not know are skipped, not fatal.
        _ => Ok(None),
    }
}

// ----------------------------------------------------------------------------------------------
// Classification: the one place an HTTP outcome becomes a FailureKind.
// ----------------------------------------------------------------------------------------------

/// A failed HTTP exchange, before classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpFailure {
    /// No response: connection refused, reset, timed out, TLS...
    Transport {
        /// Whether it failed while connecting (so the request was certainly not sent).
        connect: bool,
        /// The error chain, without URL or headers.
        message: String,
    },
    /// A non-success status.
    Status {
        /// The status code.
        status: u16,
        /// The `Retry-After` header.
        retry_after: Option<String>,
        /// The body (possibly truncated).
        body: Vec<u8>,
    },
    /// A success status whose body is not what the API documents.
    BadBody {
        /// What failed to parse.
        message: String,
    },
}

/// Whether repeating a request is harmless. Running a command is not: if the connection breaks
/// after the request went out, the command may have run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Idempotent, or made idempotent by a key (names, lookups before retrying).
    Safe,
    /// Not safe to repeat once sent.
    Unsafe,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: Option<ErrorDetail>,
}

#[derive(Deserialize)]
struct ErrorDetail {
    code: Option<String>,
    message: Option<String>,
}

/// The `{"error":{"code","message"}}` of an error body, if it has one.
pub fn error_code_and_message(body: &[u8]) -> (Option<String>, Option<String>) {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(ErrorBody {
            error: Some(ErrorDetail { code, message }),
        }) => (code, message.map(|m| quote(&m))),
        _ => (None, None),
    }
}

/// `Retry-After` in seconds (integer or decimal) as ms. HTTP-date forms are ignored: Vercel
/// sends seconds, and a missing hint only means the engine's own backoff applies.
pub fn parse_retry_after(value: &str) -> Option<u64> {
    let secs: f64 = value.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| (secs * 1000.0).round() as u64)
}

fn quote(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() <= MAX_QUOTED {
        s.to_string()
    } else {
        let cut: String = s.chars().take(MAX_QUOTED).collect();
        format!("{cut}…")
    }
}

/// What a 404 means for a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// Nothing in particular: a permanent error (calls that expect "not found" as an answer
    /// ask for it explicitly and never get here).
    Permanent,
    /// The session (or its command) no longer exists: the sandbox is gone.
    SandboxGone,
    /// The snapshot no longer exists.
    SnapshotGone,
}

/// One API call as classification sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// The operation, as errors name it (`create sandbox`, `run command`, ...).
    pub op: &'static str,
    /// Whether repeating it is harmless.
    pub replay: Replay,
    /// What a 404 means.
    pub missing: Missing,
}

impl Call {
    /// A call description.
    pub const fn new(op: &'static str, replay: Replay, missing: Missing) -> Call {
        Call {
            op,
            replay,
            missing,
        }
    }
}

/// Classifies a failed exchange: the only place a status, an error code or a transport error
/// decides between retrying, "sandbox gone", "snapshot gone", auth, invalid and permanent.
pub fn classify(call: Call, failure: HttpFailure, mode: AuthMode) -> ProviderError {
    let operation = call.op;
    let (status, retry_after, body) = match failure {
        HttpFailure::Transport { connect, message } => {
            if call.replay == Replay::Unsafe && !connect {
                return ProviderError::new(
                    FailureKind::Permanent,
                    operation,
                    format!(
                        "the connection failed after the request was sent ({message}); it may have been carried out, so it is not retried automatically"
                    ),
                );
            }
            return ProviderError::transient(operation, format!("network error: {message}"), None);
        }
        HttpFailure::BadBody { message } => {
            return ProviderError::new(
                FailureKind::Permanent,
                operation,
                format!("unexpected response from the Vercel API: {message}"),
            )
        }
        HttpFailure::Status {
            status,
            retry_after,
            body,
        } => (status, retry_after, body),
    };
    let (code, message) = error_code_and_message(&body);
    let code_str = code.as_deref().unwrap_or("");
    let said = match (&code, &message) {
        (Some(c), Some(m)) => format!("HTTP {status} {c}: {m}"),
        (Some(c), None) => format!("HTTP {status} {c}"),
        (None, Some(m)) => format!("HTTP {status}: {m}"),
        (None, None) => format!("HTTP {status}"),
    };
    match status {
        429 => {
            let retry_after_ms = retry_after.as_deref().and_then(parse_retry_after);
            ProviderError::transient(
                operation,
                format!("rate or concurrency limit reached ({said})"),
                retry_after_ms,
            )
        }
        500..=599 | 408 => ProviderError::transient(
            operation,
            format!("the Vercel API failed ({said})"),
            retry_after.as_deref().and_then(parse_retry_after),
        ),
        422 if code_str == "sandbox_snapshotting" || code_str == "sandbox_stopping" => {
            ProviderError::transient(operation, format!("the sandbox is settling ({said})"), None)
        }
        410 if code_str == "snapshot_not_found" => {
            ProviderError::snapshot_gone(operation, format!("the snapshot is gone ({said})"))
        }
        410 => ProviderError::sandbox_gone(operation, format!("the sandbox is gone ({said})")),
        401 | 403 => {
            let fix = match mode {
                AuthMode::Oidc => format!("the OIDC token may have expired: {OIDC_FIX}"),
                AuthMode::AccessToken => "check that VERCEL_TOKEN is valid and can access the team VERCEL_TEAM_ID and the project VERCEL_PROJECT_ID".to_string(),
            };
            ProviderError::new(
                FailureKind::Auth,
                operation,
                format!("Vercel refused the credentials ({said}); {fix}"),
            )
        }
        404 => match call.missing {
            Missing::SandboxGone => {
                ProviderError::sandbox_gone(operation, format!("the sandbox is gone ({said})"))
            }
            Missing::SnapshotGone => {
                ProviderError::snapshot_gone(operation, format!("the snapshot is gone ({said})"))
            }
            Missing::Permanent => ProviderError::new(FailureKind::Permanent, operation, said),
        },
        400 => ProviderError::new(
            FailureKind::Invalid,
            operation,
            format!("Vercel rejected the request ({said})"),
        ),
        402 => ProviderError::new(
            FailureKind::Permanent,
            operation,
            format!("payment required, e.g. a quota such as snapshot storage is used up ({said})"),
        ),
        _ => ProviderError::new(FailureKind::Permanent, operation, said),
    }
}

/// An error's message with its sources, e.g. "error sending request: connection refused".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
        src = cause.source();
    }
    s
}

/// Every API call: its name in errors, whether it may be repeated, and what a 404 means.
const CREATE_SANDBOX: Call = Call::new("create sandbox", Replay::Safe, Missing::Permanent);
const GET_SANDBOX: Call = Call::new("get sandbox", Replay::Safe, Missing::Permanent);
const DELETE_SANDBOX: Call = Call::new("delete sandbox", Replay::Safe, Missing::Permanent);
const LIST_SANDBOXES: Call = Call::new("list sandboxes", Replay::Safe, Missing::Permanent);
const GET_SESSION: Call = Call::new("get session", Replay::Safe, Missing::SandboxGone);
const STOP_SESSION: Call = Call::new("stop sandbox", Replay::Safe, Missing::SandboxGone);
const EXTEND_TIMEOUT: Call = Call::new("extend timeout", Replay::Safe, Missing::SandboxGone);
const RUN_COMMAND: Call = Call::new("run command", Replay::Unsafe, Missing::SandboxGone);
const GET_COMMAND: Call = Call::new("get command", Replay::Safe, Missing::SandboxGone);
const COMMAND_LOGS: Call = Call::new("command logs", Replay::Safe, Missing::SandboxGone);
const KILL_COMMAND: Call = Call::new("kill command", Replay::Safe, Missing::SandboxGone);
const WRITE_FILES: Call = Call::new("write files", Replay::Safe, Missing::SandboxGone);
const READ_FILE: Call = Call::new("read file", Replay::Safe, Missing::SandboxGone);
const MKDIR: Call = Call::new("make directory", Replay::Safe, Missing::SandboxGone);
const CREATE_SNAPSHOT: Call = Call::new("create snapshot", Replay::Safe, Missing::SandboxGone);
const GET_SNAPSHOT: Call = Call::new("get snapshot", Replay::Safe, Missing::SnapshotGone);
const DELETE_SNAPSHOT: Call = Call::new("delete snapshot", Replay::Safe, Missing::SnapshotGone);
const LIST_SNAPSHOTS: Call = Call::new("list snapshots", Replay::Safe, Missing::Permanent);

// ----------------------------------------------------------------------------------------------
// The client.
// ----------------------------------------------------------------------------------------------

/// A Vercel Sandbox v2 API client for one team and project.
#[derive(Clone)]
pub struct VercelClient {
    http: reqwest::Client,
    base: Url,
    creds: Credentials,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for VercelClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VercelClient")
            .field("base", &self.base.as_str())
            .field("credentials", &self.creds)
            .finish()
    }
}

/// The user-agent sent with every request.
pub fn user_agent() -> String {
    format!(
        "taskbox/{} (rust; {}/{})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

impl VercelClient {
    /// A client for `base_url` (e.g. `https://vercel.com/api`) with `credentials`. `clock`
    /// decides when an OIDC token has expired (checked before every request).
    pub fn new(
        base_url: &str,
        credentials: Credentials,
        clock: Arc<dyn Clock>,
    ) -> Result<VercelClient, ClientBuildError> {
        let bad = |reason: &str| ClientBuildError::BadUrl {
            url: base_url.to_string(),
            reason: reason.to_string(),
        };
        let base =
            Url::parse(base_url.trim().trim_end_matches('/')).map_err(|e| bad(&e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(bad("expected an http:// or https:// URL"));
        }
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let ua = HeaderValue::from_str(&user_agent()).map_err(|_| bad("bad user agent"))?;
        headers.insert(USER_AGENT, ua);
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(ClientBuildError::Http)?;
        Ok(VercelClient {
            http,
            base,
            creds: credentials,
            clock,
        })
    }

    /// The credentials in use (token redacted when printed).
    pub fn credentials(&self) -> &Credentials {
        &self.creds
    }

    /// The clock deciding token expiry (and fallback deadlines).
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The API base URL.
    pub fn base_url(&self) -> &str {
        self.base.as_str()
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("checked in new: the base URL can be a base")
            .pop_if_empty()
            .extend(segments);
        url
    }

    fn request(&self, method: Method, segments: &[&str]) -> RequestBuilder {
        self.http
            .request(method, self.url(segments))
            .query(&[("teamId", self.creds.team_id())])
            .bearer_auth(self.creds.token().expose())
    }

    fn classify(&self, call: Call, failure: HttpFailure) -> ProviderError {
        classify(call, failure, self.creds.mode())
    }

    /// Sends a request and returns the response if its status is a success; every failure is
    /// classified. An expired OIDC token fails here without anything being sent.
    async fn send(&self, call: Call, request: RequestBuilder) -> Result<Response, ProviderError> {
        let response = self.send_or_404(call, request, false).await?;
        Ok(response.expect("send_or_404 classifies a 404 unless it is allowed"))
    }

    /// Like [`Self::send`], but a 404 is `Ok(None)` when `allow_404` (for the calls where "not
    /// found" is an answer: a sandbox name not taken yet, a file that does not exist).
    async fn send_or_404(
        &self,
        call: Call,
        request: RequestBuilder,
        allow_404: bool,
    ) -> Result<Option<Response>, ProviderError> {
        if let Some(exp) = self.creds.expires_at_ms() {
            if exp <= self.clock.now_ms() {
                return Err(ProviderError::new(
                    FailureKind::Auth,
                    call.op,
                    format!(
                        "VERCEL_OIDC_TOKEN expired at {}; {OIDC_FIX}",
                        crate::clock::format_ms(exp)
                    ),
                ));
            }
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                let failure = HttpFailure::Transport {
                    connect: e.is_connect(),
                    message: error_chain(&e.without_url()),
                };
                return Err(self.classify(call, failure));
            }
        };
        let status = response.status();
        if status.is_success() {
            return Ok(Some(response));
        }
        if allow_404 && status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        // An error body that cannot be read still has a status worth classifying.
        let body = response
            .bytes()
            .await
            .map(|b| b.to_vec())
            .unwrap_or_default();
        Err(self.classify(
            call,
            HttpFailure::Status {
                status: status.as_u16(),
                retry_after,
                body,
            },
        ))
    }

    /// Reads a whole body. A connection that breaks here broke after the server acted, so it
    /// counts as sent (`connect: false`).
    async fn read_body(&self, call: Call, response: Response) -> Result<Vec<u8>, ProviderError> {
        match response.bytes().await {
            Ok(b) => Ok(b.to_vec()),
            Err(e) => Err(self.classify(
                call,
                HttpFailure::Transport {
                    connect: false,
                    message: error_chain(&e.without_url()),
                },
            )),
        }
    }

    async fn read_json<T: DeserializeOwned>(
        &self,
        call: Call,
        response: Response,
    ) -> Result<T, ProviderError> {
        let bytes = self.read_body(call, response).await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            self.classify(
                call,
                HttpFailure::BadBody {
                    message: e.to_string(),
                },
            )
        })
    }

    async fn json<T: DeserializeOwned>(
        &self,
        call: Call,
        request: RequestBuilder,
    ) -> Result<T, ProviderError> {
        let response = self.send(call, request).await?;
        self.read_json(call, response).await
    }

    fn body(request: RequestBuilder, body: &Value) -> RequestBuilder {
        request.body(serde_json::to_vec(body).expect("a JSON value always serializes"))
    }

    // ---- sandboxes --------------------------------------------------------------------------

    /// `POST /v2/sandboxes`. Not retried here; [`Self::get_sandbox`] by name finds a sandbox
    /// whose create response was lost.
    pub async fn create_sandbox(
        &self,
        spec: &CreateSandbox,
    ) -> Result<SandboxAndSession, ProviderError> {
        let mut body = serde_json::json!({
            "projectId": self.creds.project_id(),
            "name": spec.name,
            "resources": {"vcpus": spec.vcpus},
            "timeout": spec.timeout_ms,
            "ports": [],
            "env": {},
            "tags": spec.tags,
            "persistent": false,
        });
        match &spec.source_snapshot {
            Some(id) => body["source"] = serde_json::json!({"type": "snapshot", "snapshotId": id}),
            None => body["runtime"] = Value::String(spec.runtime.clone()),
        }
        let rb = self
            .request(Method::POST, &["v2", "sandboxes"])
            .timeout(CALL_TIMEOUT);
        self.json(CREATE_SANDBOX, Self::body(rb, &body)).await
    }

    /// `GET /v2/sandboxes/{name}`; `None` when no sandbox has that name.
    pub async fn get_sandbox(
        &self,
        name: &str,
    ) -> Result<Option<SandboxAndSession>, ProviderError> {
        let rb = self
            .request(Method::GET, &["v2", "sandboxes", name])
            .query(&[("projectId", self.creds.project_id())])
            .timeout(CALL_TIMEOUT);
        match self.send_or_404(GET_SANDBOX, rb, true).await? {
            Some(r) => self.read_json(GET_SANDBOX, r).await.map(Some),
            None => Ok(None),
        }
    }

    /// `DELETE /v2/sandboxes/{name}`; a missing sandbox counts as deleted.
    pub async fn delete_sandbox(&self, name: &str) -> Result<(), ProviderError> {
        let rb = self
            .request(Method::DELETE, &["v2", "sandboxes", name])
            .query(&[("projectId", self.creds.project_id())])
            .timeout(CALL_TIMEOUT);
        match self.send_or_404(DELETE_SANDBOX, rb, true).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind == FailureKind::SandboxGone => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// One page of `GET /v2/sandboxes`, filtered by one tag and/or a name prefix.
    pub async fn list_sandboxes(
        &self,
        tag: Option<(&str, &str)>,
        name_prefix: Option<&str>,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<Sandbox>, ProviderError> {
        let mut query: Vec<(&str, String)> = vec![
            ("project", self.creds.project_id().to_string()),
            ("limit", limit.clamp(1, MAX_PAGE).to_string()),
        ];
        if let Some((k, v)) = tag {
            query.push(("tags", format!("{k}:{v}")));
        }
        if let Some(p) = name_prefix {
            query.push(("namePrefix", p.to_string()));
        }
        if let Some(c) = cursor {
            query.push(("cursor", c.to_string()));
        }
        let rb = self
            .request(Method::GET, &["v2", "sandboxes"])
            .query(&query)
            .timeout(CALL_TIMEOUT);
        let page: SandboxesPage = self.json(LIST_SANDBOXES, rb).await?;
        Ok(Page {
            next: page.pagination.and_then(|p| p.cursor()),
            items: page.sandboxes,
        })
    }

    /// Every sandbox carrying the tag `key:value` (all pages).
    pub async fn list_all_sandboxes(
        &self,
        tag: (&str, &str),
    ) -> Result<Vec<Sandbox>, ProviderError> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = self
                .list_sandboxes(Some(tag), None, MAX_PAGE, cursor.as_deref())
                .await?;
            all.extend(page.items);
            match page.next {
                // A server that repeats a cursor would loop forever; stop instead.
                Some(next) if Some(&next) != cursor.as_ref() => cursor = Some(next),
                _ => return Ok(all),
            }
        }
    }

    // ---- sessions ---------------------------------------------------------------------------

    /// `GET /v2/sandboxes/sessions/{id}`.
    pub async fn get_session(&self, session_id: &str) -> Result<Session, ProviderError> {
        let rb = self
            .request(Method::GET, &["v2", "sandboxes", "sessions", session_id])
            .timeout(CALL_TIMEOUT);
        let body: SessionBody = self.json(GET_SESSION, rb).await?;
        Ok(body.session)
    }

    /// Polls the session until it runs (a create may answer `pending`). A session that ends in
    /// a terminal state, or is still pending after `max_wait`, is a transient failure: the
    /// engine's next create finds the named sandbox and replaces its dead session.
    pub async fn wait_until_running(
        &self,
        session: Session,
        max_wait: Duration,
    ) -> Result<Session, ProviderError> {
        let give_up = tokio::time::Instant::now() + max_wait;
        let mut delay = Duration::from_millis(50);
        let mut session = session;
        loop {
            match session.status {
                SessionStatus::Running => return Ok(session),
                s if s.is_terminal() => {
                    return Err(ProviderError::transient(
                        "start session",
                        format!("session {} ended as {s:?} while starting", session.id),
                        None,
                    ))
                }
                _ => {}
            }
            if tokio::time::Instant::now() + delay > give_up {
                return Err(ProviderError::transient(
                    "start session",
                    format!(
                        "session {} still {:?} after {} s",
                        session.id,
                        session.status,
                        max_wait.as_secs()
                    ),
                    None,
                ));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
            session = self.get_session(&session.id).await?;
        }
    }

    /// `POST …/stop` (blocks until stopped).
    pub async fn stop_session(&self, session_id: &str) -> Result<Session, ProviderError> {
        let rb = self
            .request(
                Method::POST,
                &["v2", "sandboxes", "sessions", session_id, "stop"],
            )
            .timeout(BLOCKING_CALL_TIMEOUT)
            .body("{}");
        let body: SessionBody = self.json(STOP_SESSION, rb).await?;
        Ok(body.session)
    }

    /// `POST …/extend-timeout` by `duration_ms` (≥ 1000).
    pub async fn extend_timeout(
        &self,
        session_id: &str,
        duration_ms: u64,
    ) -> Result<Session, ProviderError> {
        let rb = self
            .request(
                Method::POST,
                &["v2", "sandboxes", "sessions", session_id, "extend-timeout"],
            )
            .timeout(CALL_TIMEOUT);
        let rb = Self::body(rb, &serde_json::json!({"duration": duration_ms.max(1000)}));
        let body: SessionBody = self.json(EXTEND_TIMEOUT, rb).await?;
        Ok(body.session)
    }

    // ---- commands ---------------------------------------------------------------------------

    fn command_body(cmd: &RunCommand, wait: bool) -> Value {
        let mut body = serde_json::json!({
            "command": cmd.command,
            "args": cmd.args,
            "env": cmd.env,
            "sudo": cmd.sudo,
        });
        if let Some(cwd) = &cmd.cwd {
            body["cwd"] = Value::String(cwd.clone());
        }
        if let Some(t) = cmd.timeout_ms {
            body["timeout"] = Value::from(t.max(100));
        }
        if wait {
            body["wait"] = Value::Bool(true);
            body["logs"] = Value::Bool(true);
        }
        body
    }

    /// `POST …/cmd` detached: returns the running command.
    pub async fn run_command(
        &self,
        session_id: &str,
        cmd: &RunCommand,
    ) -> Result<Command, ProviderError> {
        let rb = self
            .request(
                Method::POST,
                &["v2", "sandboxes", "sessions", session_id, "cmd"],
            )
            .timeout(CALL_TIMEOUT);
        let rb = Self::body(rb, &Self::command_body(cmd, false));
        let body: CommandBody = self.json(RUN_COMMAND, rb).await?;
        Ok(body.command)
    }

    /// `POST …/cmd` with `wait:true, logs:true`: one request that streams the command record,
    /// its output and the final record with the exit code.
    pub async fn run_command_streaming(
        &self,
        session_id: &str,
        cmd: &RunCommand,
    ) -> Result<NdjsonStream, ProviderError> {
        let rb = self.request(
            Method::POST,
            &["v2", "sandboxes", "sessions", session_id, "cmd"],
        );
        let rb = Self::body(rb, &Self::command_body(cmd, true));
        let response = self.send(RUN_COMMAND, rb).await?;
        Ok(NdjsonStream::new(response))
    }

    /// `GET …/cmd/{id}`; with `wait`, a long-poll that answers when the command has exited
    /// (no per-request timeout: the caller bounds it).
    pub async fn get_command(
        &self,
        session_id: &str,
        cmd_id: &str,
        wait: bool,
    ) -> Result<Command, ProviderError> {
        let mut rb = self.request(
            Method::GET,
            &["v2", "sandboxes", "sessions", session_id, "cmd", cmd_id],
        );
        if wait {
            rb = rb.query(&[("wait", "true")]);
        } else {
            rb = rb.timeout(CALL_TIMEOUT);
        }
        let body: CommandBody = self.json(GET_COMMAND, rb).await?;
        Ok(body.command)
    }

    /// `GET …/cmd/{id}/logs`: the command's output from the start, as NDJSON.
    pub async fn command_logs(
        &self,
        session_id: &str,
        cmd_id: &str,
    ) -> Result<NdjsonStream, ProviderError> {
        let rb = self.request(
            Method::GET,
            &[
                "v2",
                "sandboxes",
                "sessions",
                session_id,
                "cmd",
                cmd_id,
                "logs",
            ],
        );
        let response = self.send(COMMAND_LOGS, rb).await?;
        Ok(NdjsonStream::new(response))
    }

    /// `POST …/cmd/{id}/kill` with a numeric signal (15 = SIGTERM).
    pub async fn kill_command(
        &self,
        session_id: &str,
        cmd_id: &str,
        signal: i32,
    ) -> Result<Command, ProviderError> {
        let rb = self
            .request(
                Method::POST,
                &[
                    "v2",
                    "sandboxes",
                    "sessions",
                    session_id,
                    "cmd",
                    cmd_id,
                    "kill",
                ],
            )
            .timeout(CALL_TIMEOUT);
        let rb = Self::body(rb, &serde_json::json!({"signal": signal}));
        let body: CommandBody = self.json(KILL_COMMAND, rb).await?;
        Ok(body.command)
    }

    // ---- files ------------------------------------------------------------------------------

    /// `POST …/fs/write`: writes `files` (absolute paths → contents) as one gzipped tar
    /// extracted at `/`; parent directories are created.
    pub async fn write_files(
        &self,
        session_id: &str,
        files: &[(&str, &[u8])],
    ) -> Result<(), ProviderError> {
        let archive = tar_gz(files).map_err(|e| {
            ProviderError::new(
                FailureKind::Invalid,
                "write files",
                format!("cannot build the upload archive: {e}"),
            )
        })?;
        let rb = self
            .request(
                Method::POST,
                &["v2", "sandboxes", "sessions", session_id, "fs", "write"],
            )
            .header(CONTENT_TYPE, "application/gzip")
            .header("x-cwd", "/")
            .timeout(BLOCKING_CALL_TIMEOUT)
            .body(archive);
        self.send(WRITE_FILES, rb).await?;
        Ok(())
    }

    /// `POST …/fs/read`: the file's bytes, or `None` when it does not exist (404).
    pub async fn read_file(
        &self,
        session_id: &str,
        path: &str,
    ) -> Result<Option<Vec<u8>>, ProviderError> {
        let rb = self
            .request(
                Method::POST,
                &["v2", "sandboxes", "sessions", session_id, "fs", "read"],
            )
            .timeout(BLOCKING_CALL_TIMEOUT);
        let rb = Self::body(rb, &serde_json::json!({"path": path}));
        let Some(response) = self.send_or_404(READ_FILE, rb, true).await? else {
            return Ok(None);
        };
        self.read_body(READ_FILE, response).await.map(Some)
    }

    /// `POST …/fs/mkdir` (recursive, sent explicitly since sources disagree on the default).
    pub async fn mkdir(&self, session_id: &str, path: &str) -> Result<(), ProviderError> {
        let rb = self
            .request(
                Method::POST,
                &["v2", "sandboxes", "sessions", session_id, "fs", "mkdir"],
            )
            .timeout(CALL_TIMEOUT);
        let rb = Self::body(rb, &serde_json::json!({"path": path, "recursive": true}));
        self.send(MKDIR, rb).await?;
        Ok(())
    }

    // ---- snapshots --------------------------------------------------------------------------

    /// `POST …/snapshot` (201): snapshots the filesystem; **the session stops**.
    /// `expiration_ms`: `None` for the platform default, `Some(0)` for never.
    pub async fn create_snapshot(
        &self,
        session_id: &str,
        expiration_ms: Option<u64>,
    ) -> Result<SnapshotAndSession, ProviderError> {
        let rb = self
            .request(
                Method::POST,
                &["v2", "sandboxes", "sessions", session_id, "snapshot"],
            )
            .timeout(BLOCKING_CALL_TIMEOUT);
        let body = match expiration_ms {
            Some(ms) => serde_json::json!({"expiration": ms}),
            None => serde_json::json!({}),
        };
        self.json(CREATE_SNAPSHOT, Self::body(rb, &body)).await
    }

    /// `GET /v2/sandboxes/snapshots/{id}`.
    pub async fn get_snapshot(&self, snapshot_id: &str) -> Result<Snapshot, ProviderError> {
        let rb = self
            .request(Method::GET, &["v2", "sandboxes", "snapshots", snapshot_id])
            .timeout(CALL_TIMEOUT);
        let body: SnapshotBody = self.json(GET_SNAPSHOT, rb).await?;
        Ok(body.snapshot)
    }

    /// `DELETE /v2/sandboxes/snapshots/{id}`.
    pub async fn delete_snapshot(&self, snapshot_id: &str) -> Result<Snapshot, ProviderError> {
        let rb = self
            .request(
                Method::DELETE,
                &["v2", "sandboxes", "snapshots", snapshot_id],
            )
            .timeout(CALL_TIMEOUT);
        let body: SnapshotBody = self.json(DELETE_SNAPSHOT, rb).await?;
        Ok(body.snapshot)
    }

    /// One page of `GET /v2/sandboxes/snapshots`, optionally of one sandbox (by name).
    pub async fn list_snapshots(
        &self,
        sandbox_name: Option<&str>,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<Snapshot>, ProviderError> {
        let mut query: Vec<(&str, String)> = vec![
            ("project", self.creds.project_id().to_string()),
            ("limit", limit.clamp(1, MAX_PAGE).to_string()),
        ];
        if let Some(n) = sandbox_name {
            query.push(("name", n.to_string()));
        }
        if let Some(c) = cursor {
            query.push(("cursor", c.to_string()));
        }
        let rb = self
            .request(Method::GET, &["v2", "sandboxes", "snapshots"])
            .query(&query)
            .timeout(CALL_TIMEOUT);
        let page: SnapshotsPage = self.json(LIST_SNAPSHOTS, rb).await?;
        Ok(Page {
            next: page.pagination.and_then(|p| p.cursor()),
            items: page.snapshots,
        })
    }

    /// Every snapshot of the sandbox named `sandbox_name` (all pages).
    pub async fn list_all_snapshots(
        &self,
        sandbox_name: &str,
    ) -> Result<Vec<Snapshot>, ProviderError> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = self
                .list_snapshots(Some(sandbox_name), MAX_PAGE, cursor.as_deref())
                .await?;
            all.extend(page.items);
            match page.next {
                Some(next) if Some(&next) != cursor.as_ref() => cursor = Some(next),
                _ => return Ok(all),
            }
        }
    }
}

/// A gzipped tar of `files` with names relative to `/` (the upload's `x-cwd`).
fn tar_gz(files: &[(&str, &[u8])]) -> std::io::Result<Vec<u8>> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (path, content) in files {
        let name = path.trim_start_matches('/');
        if name.is_empty() || name.split('/').any(|c| c == "..") {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("`{path}` is not a file path inside the sandbox"),
            ));
        }
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, name, *content)?;
    }
    tar.into_inner()?.finish()
}
