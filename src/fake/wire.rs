//! The JSON the fake sends: object shapes and error bodies, field for field as the official SDK's
//! zod schemas (`@vercel/sandbox` 3.x `api-client/validators.ts`) expect them. Timestamps are
//! milliseconds since the epoch, as numbers; optional fields are omitted, never `null`, except
//! `exitCode` and `pagination.next`, which the schemas declare nullable.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::core::Millis;

/// An API error: the status and the `{"error":{"code","message"}}` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    /// `Retry-After` seconds (429 only).
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// 400 with the service's ``Invalid request: ...`` wording.
    pub(crate) fn invalid(message: impl AsRef<str>) -> Self {
        Self::new(
            400,
            "bad_request",
            format!("Invalid request: {}", message.as_ref()),
        )
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "not_found", message)
    }

    pub(crate) fn sandbox_stopped(session_id: &str) -> Self {
        Self::new(
            410,
            "sandbox_stopped",
            format!("The sandbox session {session_id} is stopped."),
        )
    }

    pub(crate) fn sandbox_stopping(session_id: &str) -> Self {
        Self::new(
            422,
            "sandbox_stopping",
            format!("The sandbox session {session_id} is stopping."),
        )
    }

    pub(crate) fn sandbox_snapshotting(session_id: &str) -> Self {
        Self::new(
            422,
            "sandbox_snapshotting",
            format!("The sandbox session {session_id} is being snapshotted and is stopping."),
        )
    }

    pub(crate) fn snapshot_not_found(snapshot_id: &str) -> Self {
        Self::new(
            410,
            "snapshot_not_found",
            format!("The snapshot {snapshot_id} has expired or was deleted."),
        )
    }

    /// 413 for a request body over `limit` bytes.
    pub(crate) fn too_large(limit: u64) -> Self {
        Self::new(
            413,
            "payload_too_large",
            format!("The request body is too large: this endpoint takes at most {limit} bytes."),
        )
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "internal_server_error", message)
    }

    /// The JSON body.
    pub(crate) fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {"code": self.code, "message": self.message}})
    }
}

/// A session (one boot of a named sandbox).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SessionView {
    pub id: String,
    pub memory: u32,
    pub vcpus: u32,
    pub region: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    pub timeout: u64,
    pub status: &'static str,
    pub requested_at: Millis,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Millis>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested_stop_at: Option<Millis>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<Millis>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_snapshot_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshotted_at: Option<Millis>,
    pub created_at: Millis,
    pub cwd: String,
    /// The fake's model of billed CPU (see `SessionRec::active_cpu_ms`); `networkTransfer` is
    /// not modelled (the API reports it only where present).
    pub active_cpu_duration_ms: u64,
    pub updated_at: Millis,
}

/// A named sandbox.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SandboxView {
    pub name: String,
    pub persistent: bool,
    pub region: String,
    pub vcpus: u32,
    pub memory: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    pub timeout: u64,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub current_session_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_snapshot_id: Option<String>,
    pub status: &'static str,
    pub status_updated_at: Millis,
    pub cwd: String,
    pub tags: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_expiration: Option<u64>,
}

/// A port route (`routes` in create/get answers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RouteView {
    pub url: String,
    pub subdomain: String,
    pub port: u16,
}

/// A command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CommandView {
    pub id: String,
    pub name: String,
    pub args: Vec<String>,
    pub cwd: String,
    pub session_id: String,
    /// `null` while it runs.
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    pub started_at: Millis,
}

/// A snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SnapshotView {
    pub id: String,
    pub source_session_id: String,
    pub region: String,
    pub status: &'static str,
    pub size_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Millis>,
    pub created_at: Millis,
    pub updated_at: Millis,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<Millis>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
}

/// `{"count", "next"}` of a list answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Pagination {
    pub count: usize,
    /// The opaque cursor of the next page; `null` on the last.
    pub next: Option<String>,
}
