//! Classification: the one place an HTTP outcome becomes a [`FailureKind`]. A failed exchange
//! ([`HttpFailure`]) and what the call is ([`Call`]: may it be repeated, what a 404 means) go
//! in; a [`ProviderError`] the engine can act on comes out ([`classify`]).
//!
//! Messages quote only the server's error code and message (truncated), never a URL or a
//! header, so tokens cannot leak through an error.

use serde::Deserialize;

use super::auth::{AuthMode, OIDC_FIX};
use crate::core::FailureKind;
use crate::provider::ProviderError;

/// Longest server message quoted in an error.
const MAX_QUOTED: usize = 300;

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
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
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
