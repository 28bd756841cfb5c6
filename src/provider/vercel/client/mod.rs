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
//!
//! This file holds the client, its transport (the helpers every request goes through, which
//! classify each failure) and the table of calls; the endpoints are grouped by resource in
//! `sandboxes`, `sessions`, `commands`, `files` and `snapshots`. The API objects live in
//! [`super::wire`], the NDJSON reader in [`super::ndjson`] and classification in
//! [`super::classify`]; their public items are re-exported here, under the paths callers use.

mod commands;
mod files;
mod sandboxes;
mod sessions;
mod snapshots;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::auth::{Credentials, OIDC_FIX};
use super::classify::error_chain;
use crate::clock::Clock;
use crate::core::FailureKind;
use crate::provider::ProviderError;

pub use super::classify::{
    classify, error_code_and_message, parse_retry_after, Call, HttpFailure, Missing, Replay,
};
pub use super::ndjson::{NdjsonStream, StreamCut, StreamEvent};
pub use super::wire::{
    Command, CreateSandbox, Page, RunCommand, Sandbox, SandboxAndSession, Session, SessionStatus,
    Snapshot, SnapshotAndSession, SnapshotStatus, StopAnswer,
};

/// Page size for list calls (the API's maximum).
pub const MAX_PAGE: u32 = 50;

/// How long an ordinary (non-streaming) call may take before it counts as a network failure.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Stopping and snapshotting block until the VM has stopped; give them longer.
const BLOCKING_CALL_TIMEOUT: Duration = Duration::from_secs(600);
/// Connecting should be quick; a black-holed address must not hang a caller.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

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
}
