//! The Vercel Sandbox API's objects as taskbox reads and sends them: the serde shapes of
//! sessions, sandboxes, commands, snapshots and list pages, and the typed requests
//! ([`CreateSandbox`], [`RunCommand`]) the client turns into bodies.
//!
//! Unknown fields are ignored and most fields are optional, so a server that adds or omits a
//! field does not break parsing; only what taskbox relies on is required.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::settings::SandboxBase;
use crate::core::Millis;

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
    /// CPU time billed (I/O wait is not), ms.
    #[serde(default)]
    pub active_cpu_duration_ms: Option<u64>,
    /// Network transfer, where reported.
    #[serde(default)]
    pub network_transfer: Option<NetworkTransfer>,
}

/// A session's network transfer, bytes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NetworkTransfer {
    /// Received.
    #[serde(default)]
    pub ingress: u64,
    /// Sent.
    #[serde(default)]
    pub egress: u64,
}

impl Session {
    /// What it used, as the cost ledger journals it; `None` before it started.
    pub fn usage(&self) -> Option<crate::core::SessionUsage> {
        Some(crate::core::SessionUsage {
            started_at: self.started_at?,
            stopped_at: self.stopped_at,
            vcpus: self.vcpus.unwrap_or(0),
            memory_mb: self.memory.unwrap_or(0),
            active_cpu_ms: self.active_cpu_duration_ms,
            transfer_bytes: self
                .network_transfer
                .as_ref()
                .map(|t| t.ingress.saturating_add(t.egress)),
        })
    }

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
pub(super) struct Pagination {
    #[serde(default)]
    next: Value,
}

impl Pagination {
    /// The cursor is opaque: a string in v2, a number in v1; `null` ends the list.
    pub(super) fn cursor(&self) -> Option<String> {
        match &self.next {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct SandboxesPage {
    pub(super) sandboxes: Vec<Sandbox>,
    pub(super) pagination: Option<Pagination>,
}

#[derive(Deserialize)]
pub(super) struct SnapshotsPage {
    pub(super) snapshots: Vec<Snapshot>,
    pub(super) pagination: Option<Pagination>,
}

#[derive(Deserialize)]
pub(super) struct SessionBody {
    pub(super) session: Session,
}

#[derive(Deserialize)]
pub(super) struct CommandBody {
    pub(super) command: Command,
}

#[derive(Deserialize)]
pub(super) struct SnapshotBody {
    pub(super) snapshot: Snapshot,
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

/// What `stop session` returns: the stopped session and, for a persistent sandbox, the
/// snapshot the platform took of it as it stopped.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct StopAnswer {
    /// The session.
    pub session: Session,
    /// The platform's snapshot of it (persistent sandboxes).
    #[serde(default)]
    pub snapshot: Option<Snapshot>,
}

/// A sandbox to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateSandbox {
    /// The name (idempotency key).
    pub name: String,
    /// Image (v3) or runtime (v2) to create from; decides the endpoint. Neither is sent when
    /// `source_snapshot` is set, because the API refuses the pair (hermes-agent #74753 lost
    /// every restore to it).
    pub base: SandboxBase,
    /// Whether the platform snapshots the sandbox itself when it stops (`persistent: true`).
    pub persistent: bool,
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
