//! Snapshots: their records and expiry (counted from the last use), taking one (which ends the
//! session), the automatic one a persistent sandbox's stop writes, deleting, the admin's forced
//! expiry, and the snapshot views and list.

use super::session::Phase;
use super::{admits, Access, ListQuery, World};
use crate::core::Millis;
use crate::fake::wire::{ApiError, SnapshotView};

/// A snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SnapshotRec {
    pub seq: u64,
    pub id: String,
    pub source_session_id: String,
    pub sandbox_name: String,
    pub project_id: String,
    /// The runtime (v2) or image (v3) a sandbox restored from it gets.
    pub runtime: Option<String>,
    pub image: Option<String>,
    pub size_bytes: u64,
    /// Where its files are.
    pub archive: String,
    /// 0: never expires. Counted from the last use.
    pub expiration_ms: u64,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub last_used_at: Option<Millis>,
    pub parent_id: Option<String>,
    pub deleted_at: Option<Millis>,
    /// Set by `/_admin/expire-snapshot`.
    pub forced_expiry: Option<Millis>,
    /// Its archive was removed after it expired.
    pub discarded: bool,
}

/// Whether a snapshot can be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SnapState {
    Live,
    Expired,
    Deleted,
}

impl SnapshotRec {
    pub(crate) fn expires_at(&self) -> Option<Millis> {
        let natural = (self.expiration_ms > 0).then(|| {
            self.last_used_at
                .unwrap_or(self.created_at)
                .saturating_add(self.expiration_ms)
        });
        match (natural, self.forced_expiry) {
            (Some(n), Some(f)) => Some(n.min(f)),
            (n, f) => n.or(f),
        }
    }

    pub(crate) fn state(&self, now: Millis) -> SnapState {
        if self.deleted_at.is_some() {
            SnapState::Deleted
        } else if self.expires_at().is_some_and(|e| e <= now) {
            SnapState::Expired
        } else {
            SnapState::Live
        }
    }
}

/// Where a snapshot's files are kept (the key is opaque here: the storage's own snapshot id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Archived {
    pub key: String,
    pub size_bytes: u64,
}

impl World {
    /// A usable snapshot, or why not (404 never existed, 410 expired or deleted).
    pub(super) fn usable_snapshot(&self, id: &str, now: Millis) -> Result<&SnapshotRec, ApiError> {
        let snap = self
            .snapshots
            .get(id)
            .ok_or_else(|| ApiError::not_found(format!("Snapshot {id} not found.")))?;
        match snap.state(now) {
            SnapState::Live => Ok(snap),
            SnapState::Expired | SnapState::Deleted => Err(ApiError::snapshot_not_found(id)),
        }
    }

    /// Begins a snapshot of a running session: it becomes `snapshotting` and will stop.
    /// The caller has checked [`World::access`].
    pub(crate) fn begin_snapshot(&mut self, id: &str, now: Millis) -> Result<String, ApiError> {
        if self.access(id, now)? != Access::Ready {
            return Err(ApiError::new(
                409,
                "sandbox_pending",
                format!("The sandbox session {id} is still starting."),
            ));
        }
        let (_, snap_id) = self.next("snap_");
        if let Some(s) = self.sessions.get_mut(id) {
            s.phase = Phase::Snapshotting { settle_until: None };
            s.requested_stop_at = Some(now);
            s.updated_at = now;
        }
        Ok(snap_id)
    }

    pub(super) fn insert_snapshot(
        &mut self,
        session_id: &str,
        snap_id: String,
        archived: Archived,
        expiration_ms: Option<u64>,
        now: Millis,
    ) {
        let Some(session) = self.sessions.get(session_id) else {
            return;
        };
        let sandbox = self.sandboxes.get(&session.sandbox_name);
        let image = sandbox.and_then(|sb| sb.image.clone());
        let expiration_ms = expiration_ms
            .or_else(|| sandbox.and_then(|sb| sb.snapshot_expiration_ms))
            .unwrap_or(self.settings.default_snapshot_expiration_ms);
        self.next_seq += 1;
        let rec = SnapshotRec {
            seq: self.next_seq,
            id: snap_id.clone(),
            source_session_id: session_id.to_string(),
            sandbox_name: session.sandbox_name.clone(),
            project_id: session.project_id.clone(),
            runtime: session.runtime.clone(),
            image,
            size_bytes: archived.size_bytes,
            archive: archived.key,
            expiration_ms,
            created_at: now,
            updated_at: now,
            last_used_at: None,
            parent_id: session.source_snapshot_id.clone(),
            deleted_at: None,
            forced_expiry: None,
            discarded: false,
        };
        let name = session.sandbox_name.clone();
        if let Some(sb) = self.sandboxes.get_mut(&name) {
            sb.current_snapshot_id = Some(snap_id.clone());
            sb.updated_at = now;
        }
        self.snapshots.insert(snap_id, rec);
    }

    /// Ends a snapshot: the snapshot exists, the session settles, then is stopped.
    pub(crate) fn finish_snapshot(
        &mut self,
        session_id: &str,
        snap_id: &str,
        archived: Archived,
        expiration_ms: Option<u64>,
        now: Millis,
    ) {
        self.insert_snapshot(
            session_id,
            snap_id.to_string(),
            archived,
            expiration_ms,
            now,
        );
        let settle_until = now.saturating_add(self.settings.snapshot_settle_ms);
        if let Some(s) = self.sessions.get_mut(session_id) {
            s.phase = Phase::Snapshotting {
                settle_until: Some(settle_until),
            };
            s.snapshotted_at = Some(now);
            s.stopped_at = Some(settle_until);
            s.updated_at = now;
        }
    }

    /// A snapshot that could not be written leaves the session failed.
    pub(crate) fn fail_session(&mut self, session_id: &str, now: Millis) {
        if let Some(s) = self.sessions.get_mut(session_id) {
            s.phase = Phase::Failed;
            s.stopped_at = Some(now);
            s.updated_at = now;
        }
    }

    /// Makes a snapshot expire now (admin).
    pub(crate) fn expire_snapshot(&mut self, id: &str, now: Millis) -> Result<(), ApiError> {
        let s = self
            .snapshots
            .get_mut(id)
            .ok_or_else(|| ApiError::not_found(format!("Snapshot {id} not found.")))?;
        s.forced_expiry = Some(now);
        Ok(())
    }

    /// A snapshot that can be read (404 unknown, 410 expired or deleted).
    pub(crate) fn get_snapshot(&self, id: &str, now: Millis) -> Result<SnapshotView, ApiError> {
        let snap = self.usable_snapshot(id, now)?;
        Ok(self.snapshot_view(snap, now))
    }

    /// Deletes a snapshot; the answer shows it `deleted`. Returns the archive for the caller to
    /// remove.
    pub(crate) fn delete_snapshot(
        &mut self,
        id: &str,
        now: Millis,
    ) -> Result<(SnapshotView, String), ApiError> {
        self.usable_snapshot(id, now)?;
        let snap = self
            .snapshots
            .get_mut(id)
            .expect("usable_snapshot found it");
        snap.deleted_at = Some(now);
        snap.updated_at = now;
        let snap = snap.clone();
        Ok((self.snapshot_view(&snap, now), snap.archive))
    }

    pub(crate) fn snapshot_view(&self, snap: &SnapshotRec, now: Millis) -> SnapshotView {
        SnapshotView {
            id: snap.id.clone(),
            source_session_id: snap.source_session_id.clone(),
            region: self.settings.region.clone(),
            status: match snap.state(now) {
                SnapState::Deleted => "deleted",
                SnapState::Live | SnapState::Expired => "created",
            },
            size_bytes: snap.size_bytes,
            expires_at: snap.expires_at(),
            created_at: snap.created_at,
            updated_at: snap.updated_at,
            last_used_at: snap.last_used_at,
            parent_id: snap.parent_id.clone(),
        }
    }

    pub(crate) fn list_snapshots(&self, q: &ListQuery, now: Millis) -> serde_json::Value {
        let items = self
            .snapshots
            .values()
            .filter(|s| s.state(now) == SnapState::Live)
            .filter(|s| admits(q.project.as_deref(), &s.project_id))
            .filter(|s| admits(q.name.as_deref(), &s.sandbox_name))
            .map(|s| (s.seq, self.snapshot_view(s, now)))
            .collect();
        let (snapshots, pagination) = q.page(items);
        serde_json::json!({"snapshots": snapshots, "pagination": pagination})
    }
}

#[cfg(test)]
mod tests {
    use crate::fake::model::fixtures::{archived, booted, booted_world, create};

    #[test]
    fn snapshot_settles_then_stops_and_restores() {
        let (mut w, id) = booted_world(r#"{"projectId":"p","name":"a","persistent":false}"#, 0);
        let snap = w.begin_snapshot(&id, 200).unwrap();
        assert_eq!(w.access(&id, 200).unwrap_err().code, "sandbox_snapshotting");
        w.finish_snapshot(&id, &snap, archived("a"), Some(0), 300);
        assert_eq!(w.access(&id, 799).unwrap_err().code, "sandbox_snapshotting");
        let stopped = w.access(&id, 800).unwrap_err();
        assert_eq!((stopped.status, stopped.code), (410, "sandbox_stopped"));
        let view = w.session_view(w.session(&id).unwrap(), 900);
        assert_eq!((view.status, view.stopped_at), ("stopped", Some(800)));
        assert_eq!(w.get_snapshot(&snap, 900).unwrap().expires_at, None);

        let body = format!(
            r#"{{"projectId":"p","name":"b","source":{{"type":"snapshot","snapshotId":"{snap}"}}}}"#
        );
        let restored = booted(&mut w, &body, 1000);
        let s = w.session(&restored).unwrap();
        assert_eq!(s.source_snapshot_id.as_deref(), Some(snap.as_str()));
        assert_eq!(w.snapshot_record(&snap).unwrap().size_bytes, 42);
        assert_eq!(s.runtime.as_deref(), Some("node24"));

        w.delete_snapshot(&snap, 1100).unwrap();
        assert_eq!(
            w.get_snapshot(&snap, 1100).unwrap_err().code,
            "snapshot_not_found"
        );
        let body = body.replace("\"b\"", "\"c\"");
        let e = create(&mut w, &body, 1200).unwrap_err();
        assert_eq!((e.status, e.code), (410, "snapshot_not_found"));
        assert_eq!(w.delete_snapshot(&snap, 1300).unwrap_err().status, 410);
    }

    #[test]
    fn snapshots_expire_from_last_use_or_by_admin() {
        let (mut w, id) = booted_world(r#"{"projectId":"p","name":"a"}"#, 0);
        let snap = w.begin_snapshot(&id, 200).unwrap();
        w.finish_snapshot(&id, &snap, archived("a"), Some(10_000), 200);
        assert_eq!(
            w.get_snapshot(&snap, 10_199).unwrap().expires_at,
            Some(10_200)
        );
        assert_eq!(w.get_snapshot(&snap, 10_200).unwrap_err().status, 410);
        assert_eq!(w.tick(10_200).discard_archives, vec!["a".to_string()]);
        assert!(w.tick(10_300).discard_archives.is_empty());

        let id2 = booted(&mut w, r#"{"projectId":"p","name":"b"}"#, 0);
        let snap2 = w.begin_snapshot(&id2, 200).unwrap();
        w.finish_snapshot(&id2, &snap2, archived("b"), None, 200);
        w.expire_snapshot(&snap2, 300).unwrap();
        assert_eq!(
            w.get_snapshot(&snap2, 300).unwrap_err().code,
            "snapshot_not_found"
        );
    }
}
