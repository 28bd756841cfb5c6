//! The fake service's state as plain data: named sandboxes, their sessions and the snapshots.
//!
//! Everything here is pure. Time comes in as `now`; the I/O that a transition needs (killing a
//! session's processes, archiving or restoring its workspace) is returned as a plan, performed by
//! the HTTP layer outside the lock, and reported back with a `finish_*` call. Statuses that change
//! with time alone (`pending → running` after the boot delay, `snapshotting → stopped` after the
//! settle delay, a snapshot's expiry) are derived from timestamps when read, so no timer has to
//! fire for an answer to be right. Session timeouts do need work (processes die), which
//! [`World::tick`] hands out.
//!
//! A session's lifecycle:
//!
//! ```text
//! pending ──boot delay──▶ running ──stop──▶ stopping ──(auto-snapshot if persistent)──▶ stopped
//!                            │ └──timeout─────▲
//!                            └──snapshot──▶ snapshotting ──settle delay──▶ stopped
//! ```
//!
//! Rooms: this file holds the [`World`] itself, its [`Settings`] and the work time makes due
//! ([`World::tick`]); `sandbox`, `session` and `snapshot` each hold one resource's records, the
//! plans its calls hand out, its transitions and the views the API answers with; `list` parses
//! list queries and cuts pages.

mod list;
mod sandbox;
mod session;
mod snapshot;

use std::collections::BTreeMap;

use self::sandbox::SandboxRec;
use self::session::{Phase, SessionRec};
use self::snapshot::{SnapState, SnapshotRec};
use super::validate::Limits;
use crate::core::Millis;

pub(crate) use self::list::ListQuery;
pub(crate) use self::sandbox::{CreatePlan, NewSession, ResumePlan};
pub(crate) use self::session::{Access, StopPlan, StopWork};
pub(crate) use self::snapshot::Archived;

/// Where the workspace lives inside the sandbox; the fake maps it onto a host directory.
pub(crate) const WORKSPACE_ROOT: &str = "/vercel/sandbox";

/// Behaviour knobs that are not request validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    pub limits: Limits,
    pub region: String,
    /// How long a new session stays `pending`.
    pub boot_delay_ms: u64,
    /// How long a session stays `snapshotting` after its snapshot was taken.
    pub snapshot_settle_ms: u64,
    /// Snapshot expiry when none is given (0: never).
    pub default_snapshot_expiration_ms: u64,
    /// The working directory image-based (v3) sessions report and start commands in; legacy
    /// runtimes use `/vercel/sandbox`. Which directory Vercel's images use is not documented
    /// (the reference only says to read it from the session), so the fake defaults to the same
    /// and tests choose another to prove a client reads it.
    pub image_cwd: String,
    /// Whether a persistent sandbox snapshots itself when its session times out, as it does
    /// when stopped. Unverified: Vercel's changelog says a stop snapshots; whether a timeout
    /// does is not confirmed, so the fake's default is no.
    pub snapshot_on_timeout: bool,
}

/// Work that time alone made due.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Due {
    /// Sessions past their deadline, now `stopping`.
    pub stops: Vec<StopWork>,
    /// Archives of expired snapshots, which can go.
    pub discard_archives: Vec<String>,
}

/// The fake's whole state.
#[derive(Debug, Clone)]
pub(crate) struct World {
    pub settings: Settings,
    sandboxes: BTreeMap<String, SandboxRec>,
    sessions: BTreeMap<String, SessionRec>,
    snapshots: BTreeMap<String, SnapshotRec>,
    next_seq: u64,
    /// Makes ids unique across runs sharing a data directory.
    nonce: String,
}

impl World {
    /// An empty world; `nonce` goes into every id.
    pub(crate) fn new(settings: Settings, nonce: String) -> World {
        World {
            settings,
            sandboxes: BTreeMap::new(),
            sessions: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            next_seq: 0,
            nonce,
        }
    }

    fn next(&mut self, prefix: &str) -> (u64, String) {
        self.next_seq += 1;
        let seq = self.next_seq;
        (seq, format!("{prefix}{}{seq:05}", self.nonce))
    }

    pub(crate) fn sandbox(&self, name: &str) -> Option<&SandboxRec> {
        self.sandboxes.get(name)
    }

    pub(crate) fn session(&self, id: &str) -> Option<&SessionRec> {
        self.sessions.get(id)
    }

    /// Ids of every session not yet stopped (for shutdown).
    pub(crate) fn session_ids(&self) -> Vec<String> {
        self.sessions.keys().cloned().collect()
    }

    pub(crate) fn snapshot_record(&self, id: &str) -> Option<&SnapshotRec> {
        self.snapshots.get(id)
    }

    /// The work that time made due: sessions past their deadline begin stopping; expired
    /// snapshots give up their archives.
    pub(crate) fn tick(&mut self, now: Millis) -> Due {
        let expired: Vec<String> = self
            .sessions
            .values()
            .filter(|s| s.phase == Phase::Live && now >= s.deadline())
            .map(|s| s.id.clone())
            .collect();
        let stops = expired
            .iter()
            .map(|id| {
                let snapshot = self.settings.snapshot_on_timeout;
                self.mark_stopping(id, now, snapshot)
            })
            .collect();
        let mut discard_archives = Vec::new();
        for snap in self.snapshots.values_mut() {
            if !snap.discarded && snap.state(now) == SnapState::Expired {
                snap.discarded = true;
                discard_archives.push(snap.archive.clone());
            }
        }
        Due {
            stops,
            discard_archives,
        }
    }
}

/// Whether an optional filter admits `value` (no filter admits everything).
fn admits(filter: Option<&str>, value: &str) -> bool {
    filter.is_none_or(|f| f == value)
}

/// What the tests of every room start from.
#[cfg(test)]
mod fixtures {
    use super::*;
    use crate::fake::validate::{create_request, CreateApi, Limits};
    use crate::fake::wire::ApiError;

    pub(super) fn settings() -> Settings {
        Settings {
            image_cwd: WORKSPACE_ROOT.to_string(),
            snapshot_on_timeout: false,
            limits: Limits {
                max_timeout_ms: 2_700_000,
                max_total_timeout_ms: 3_000_000,
                max_vcpus: 8,
            },
            region: "iad1".into(),
            boot_delay_ms: 100,
            snapshot_settle_ms: 500,
            default_snapshot_expiration_ms: 30 * 86_400_000,
        }
    }

    pub(super) fn archived(key: &str) -> Archived {
        Archived {
            key: key.to_string(),
            size_bytes: 42,
        }
    }

    pub(super) fn create(
        world: &mut World,
        body: &str,
        now: Millis,
    ) -> Result<CreatePlan, ApiError> {
        let req = create_request(body.as_bytes(), &world.settings.limits, CreateApi::V2)?;
        world.plan_create(req, now)
    }

    pub(super) fn booted(world: &mut World, body: &str, now: Millis) -> String {
        match create(world, body, now).unwrap() {
            CreatePlan::New(new) => {
                let id = new.session.id.clone();
                world.commit_session(*new, now);
                id
            }
            other => panic!("expected a new sandbox, got {other:?}"),
        }
    }

    /// A new world with one sandbox, created from `body` at `now` and booted; and its session id.
    pub(super) fn booted_world(body: &str, now: Millis) -> (World, String) {
        let mut world = World::new(settings(), "t".into());
        let id = booted(&mut world, body, now);
        (world, id)
    }
}
