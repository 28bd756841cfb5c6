//! The platform's ground truth as the checks read it: its sandboxes and snapshots, from the
//! simulator's records or the fake Vercel server's.

use serde::Serialize;

use crate::core::Millis;
use crate::provider::sim::{SimSandbox, SimSnapshot};

/// A sandbox as the platform records it (the simulator's view, or the fake Vercel server's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlatformSandbox {
    /// Provider handle (a session id on Vercel).
    pub id: String,
    /// The task it was created for.
    pub task_id: String,
    /// Which creation of the task's sandbox it is, when the platform knows.
    pub generation: Option<u64>,
    /// The snapshot its files came from.
    pub source_snapshot: Option<String>,
    /// When the platform created it.
    pub created_at: Millis,
    /// Its place in the platform's order of creations (sandboxes and snapshots together), when
    /// the platform records one: it orders creations within one millisecond.
    pub order: Option<u64>,
    /// Whether it is still running.
    pub live: bool,
}

impl From<&SimSandbox> for PlatformSandbox {
    fn from(s: &SimSandbox) -> Self {
        PlatformSandbox {
            id: s.id.clone(),
            task_id: s.task_id.clone(),
            generation: Some(s.generation),
            source_snapshot: s.source_snapshot.clone(),
            created_at: s.created_at,
            order: Some(s.order),
            live: s.alive,
        }
    }
}

/// A snapshot as the platform records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlatformSnapshot {
    /// Provider id.
    pub id: String,
    /// The task it was taken for.
    pub task_id: String,
    /// When the platform took it.
    pub created_at: Millis,
    /// Its place in the platform's order of creations (see [`PlatformSandbox::order`]).
    pub order: Option<u64>,
    /// When it expires (or expired); `None`: never.
    pub expires_at: Option<Millis>,
    /// Whether it was deleted.
    pub deleted: bool,
    /// Whether it has expired.
    pub expired: bool,
}

impl From<&SimSnapshot> for PlatformSnapshot {
    fn from(s: &SimSnapshot) -> Self {
        PlatformSnapshot {
            id: s.id.clone(),
            task_id: s.task_id.clone(),
            created_at: s.created_at,
            order: Some(s.order),
            expires_at: s.expires_at,
            deleted: s.deleted,
            expired: s.expired,
        }
    }
}
