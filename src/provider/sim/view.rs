//! Read-only copies of the simulated world — its sandboxes, snapshots and counters — that
//! invariant checkers compare the engine's beliefs against.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::core::Millis;

/// Why a simulated sandbox is no longer running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SimEnd {
    /// `stop_sandbox` stopped it.
    Stopped,
    /// A snapshot stopped it.
    Snapshotted,
    /// Its deadline passed.
    Expired,
}

/// A read-only copy of one simulated sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimSandbox {
    /// Provider handle.
    pub id: String,
    /// Stable name from the create spec.
    pub name: String,
    /// The owning task.
    pub task_id: String,
    /// The installation that owns it.
    pub installation_id: String,
    /// Which creation of the task's sandbox it is.
    pub generation: u64,
    /// The snapshot its files came from.
    pub source_snapshot: Option<String>,
    /// When it was created.
    pub created_at: Millis,
    /// Its place among every sandbox and snapshot the platform made (1 for the first): the
    /// order of creations within one millisecond, which `created_at` cannot tell.
    pub order: u64,
    /// When the platform stops it (moved by extensions and expiry faults).
    pub deadline: Millis,
    /// Whether it is still running.
    pub alive: bool,
    /// Why and when it stopped, once it has.
    pub ended: Option<(SimEnd, Millis)>,
    /// Its filesystem (empty once it has stopped: the files are discarded).
    pub files: BTreeMap<String, String>,
    /// The commands running in it now.
    pub running: Vec<String>,
}

/// A read-only copy of one simulated snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimSnapshot {
    /// Provider id.
    pub id: String,
    /// The task it was taken for.
    pub task_id: String,
    /// The task's sequence number for it (its idempotency key, with the task id).
    pub seq: u64,
    /// The installation that owns it.
    pub installation_id: String,
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    /// The files it holds (kept after deletion or expiry, for diagnosis).
    pub files: BTreeMap<String, String>,
    /// When it was taken.
    pub created_at: Millis,
    /// Its place among every sandbox and snapshot the platform made (see [`SimSandbox::order`]).
    pub order: u64,
    /// When it expires (`None`: never).
    pub expires_at: Option<Millis>,
    /// Whether `delete_snapshot` removed it.
    pub deleted: bool,
    /// Whether it has expired.
    pub expired: bool,
}

impl SimSnapshot {
    /// Whether a restore from it would succeed now.
    pub fn present(&self) -> bool {
        !self.deleted && !self.expired
    }
}

/// What the simulation has done so far: calls per operation, faults per kind, effects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimStats {
    /// Calls per operation (`create sandbox`, `run command`, ...).
    pub calls: BTreeMap<String, u64>,
    /// Faults injected per kind (the [`SimFaults`](super::SimFaults) field names).
    pub faults: BTreeMap<String, u64>,
    /// Sandboxes actually created (a create that found its sandbox by name does not count).
    pub sandboxes_created: u64,
    /// Snapshots actually taken.
    pub snapshots_taken: u64,
    /// Commands that started running.
    pub commands_run: u64,
}

impl SimStats {
    /// Faults injected in total.
    pub fn total_faults(&self) -> u64 {
        self.faults.values().sum()
    }

    pub(super) fn call(&mut self, op: &'static str) {
        *self.calls.entry(op.to_string()).or_default() += 1;
    }

    pub(super) fn fault(&mut self, kind: &'static str) {
        *self.faults.entry(kind.to_string()).or_default() += 1;
    }
}
