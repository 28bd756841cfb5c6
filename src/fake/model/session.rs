//! Sessions, one boot of a sandbox each: their phases and statuses (see the diagram in the
//! module above), whether a call may use one now, stopping (by request or on timeout),
//! extending, the admin's forced timeout, and the session views and list.

use std::collections::BTreeMap;

use super::{admits, Archived, ListQuery, World};
use crate::core::Millis;
use crate::fake::validate::{human_ms, MB_PER_VCPU};
use crate::fake::wire::{ApiError, SessionView};

/// Where a session is in its life (see the module diagram); `pending`/`running` are both `Live`,
/// told apart by the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Live,
    Stopping,
    /// `settle_until` is `None` while the archive is being written.
    Snapshotting {
        settle_until: Option<Millis>,
    },
    Stopped,
    Failed,
}

/// The session statuses of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Pending,
    Running,
    Stopping,
    Snapshotting,
    Stopped,
    Failed,
}

impl Status {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Running => "running",
            Status::Stopping => "stopping",
            Status::Snapshotting => "snapshotting",
            Status::Stopped => "stopped",
            Status::Failed => "failed",
        }
    }
}

/// One boot of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionRec {
    pub seq: u64,
    pub id: String,
    pub sandbox_name: String,
    pub project_id: String,
    pub runtime: Option<String>,
    /// The working directory it reports and starts commands in.
    pub cwd: String,
    pub vcpus: u32,
    pub timeout_ms: u64,
    pub env: BTreeMap<String, String>,
    pub requested_at: Millis,
    /// When it is (or will be) running: `requested_at` plus the boot delay.
    pub started_at: Millis,
    pub source_snapshot_id: Option<String>,
    pub phase: Phase,
    pub requested_stop_at: Option<Millis>,
    pub stopped_at: Option<Millis>,
    pub snapshotted_at: Option<Millis>,
    /// `activeCpuDurationMs`: a model, not Vercel's meter — the wall time of the session's
    /// finished commands, added when the session ends (Vercel bills CPU actually used, without
    /// I/O wait, so its figure is lower).
    pub active_cpu_ms: u64,
    pub updated_at: Millis,
    /// Set by `/_admin/expire-session`: the session times out now.
    pub forced_deadline: Option<Millis>,
}

impl SessionRec {
    /// The status at `now`.
    pub(crate) fn status(&self, now: Millis) -> Status {
        match self.phase {
            Phase::Live if now < self.started_at => Status::Pending,
            Phase::Live => Status::Running,
            Phase::Stopping => Status::Stopping,
            Phase::Snapshotting {
                settle_until: Some(until),
            } if now >= until => Status::Stopped,
            Phase::Snapshotting { .. } => Status::Snapshotting,
            Phase::Stopped => Status::Stopped,
            Phase::Failed => Status::Failed,
        }
    }

    /// When the platform stops it.
    pub(crate) fn deadline(&self) -> Millis {
        let natural = self.started_at.saturating_add(self.timeout_ms);
        self.forced_deadline.map_or(natural, |f| f.min(natural))
    }
}

/// A stop the caller must carry out: kill the session's processes, archive its workspace into
/// `auto_snapshot` if set, discard the workspace, then `finish_stop`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StopWork {
    pub session_id: String,
    pub auto_snapshot: Option<String>,
}

/// What a stop asks of the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StopPlan {
    AlreadyStopped,
    Stop(StopWork),
}

/// How a session-scoped call may proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Ready,
    /// Still booting: retry at this time.
    BootingUntil(Millis),
}

impl World {
    pub(super) fn session_or_404(&self, id: &str) -> Result<&SessionRec, ApiError> {
        self.sessions
            .get(id)
            .ok_or_else(|| ApiError::not_found(format!("Sandbox session {id} not found.")))
    }

    /// Whether a session-scoped call (command, files, snapshot, extend) may run now.
    pub(crate) fn access(&self, id: &str, now: Millis) -> Result<Access, ApiError> {
        let s = self.session_or_404(id)?;
        match s.status(now) {
            Status::Pending => Ok(Access::BootingUntil(s.started_at)),
            Status::Running => Ok(Access::Ready),
            Status::Stopping => Err(ApiError::sandbox_stopping(id)),
            Status::Snapshotting => Err(ApiError::sandbox_snapshotting(id)),
            Status::Stopped | Status::Failed => Err(ApiError::sandbox_stopped(id)),
        }
    }

    /// Whether a session's commands can still be read: like [`World::access`], but a session
    /// that is stopping or snapshotting still answers.
    pub(crate) fn readable(&self, id: &str, now: Millis) -> Result<(), ApiError> {
        let s = self.session_or_404(id)?;
        match s.status(now) {
            Status::Stopped | Status::Failed => Err(ApiError::sandbox_stopped(id)),
            _ => Ok(()),
        }
    }

    /// Begins a stop. Stopping a stopped session is fine (idempotent); one that is stopping or
    /// snapshotting answers 422.
    pub(crate) fn begin_stop(&mut self, id: &str, now: Millis) -> Result<StopPlan, ApiError> {
        let s = self.session_or_404(id)?;
        match s.status(now) {
            Status::Stopped | Status::Failed => return Ok(StopPlan::AlreadyStopped),
            Status::Stopping => return Err(ApiError::sandbox_stopping(id)),
            Status::Snapshotting => return Err(ApiError::sandbox_snapshotting(id)),
            Status::Pending | Status::Running => {}
        }
        Ok(StopPlan::Stop(self.mark_stopping(id, now, true)))
    }

    /// Marks a session stopping; a persistent sandbox's stop writes a snapshot when
    /// `may_snapshot` (always for a stop; for a timeout as [`super::Settings::snapshot_on_timeout`]
    /// says).
    pub(super) fn mark_stopping(&mut self, id: &str, now: Millis, may_snapshot: bool) -> StopWork {
        let persistent = may_snapshot
            && self
                .sessions
                .get(id)
                .and_then(|s| self.sandboxes.get(&s.sandbox_name))
                .is_some_and(|sb| sb.persistent);
        let auto_snapshot = persistent.then(|| self.next("snap_").1);
        if let Some(s) = self.sessions.get_mut(id) {
            s.phase = Phase::Stopping;
            s.requested_stop_at = Some(now);
            s.updated_at = now;
        }
        StopWork {
            session_id: id.to_string(),
            auto_snapshot,
        }
    }

    /// Ends a stop; `snapshot` is the auto-snapshot (its id and archive) if one was written.
    pub(crate) fn finish_stop(
        &mut self,
        id: &str,
        snapshot: Option<(String, Archived)>,
        now: Millis,
    ) {
        if let Some((snap_id, archived)) = snapshot {
            self.insert_snapshot(id, snap_id, archived, None, now);
        }
        if let Some(s) = self.sessions.get_mut(id) {
            s.phase = Phase::Stopped;
            s.stopped_at = Some(now);
            s.updated_at = now;
        }
    }

    /// Extends a live session's timeout, up to the plan's maximum.
    pub(crate) fn extend(
        &mut self,
        id: &str,
        duration_ms: u64,
        now: Millis,
    ) -> Result<(), ApiError> {
        self.access(id, now)?;
        let max = self.settings.limits.max_total_timeout_ms;
        let s = self
            .sessions
            .get_mut(id)
            .expect("access() found the session");
        let total = s.timeout_ms.saturating_add(duration_ms);
        if total > max {
            return Err(ApiError::invalid(format!(
                "extending by {} would make the session's timeout {}, above the plan's maximum \
                 of {}.",
                human_ms(duration_ms),
                human_ms(total),
                human_ms(max)
            )));
        }
        s.timeout_ms = total;
        s.updated_at = now;
        Ok(())
    }

    /// Adds the wall time of a session's commands to its `activeCpuDurationMs` (when its
    /// commands are reaped, as it ends).
    pub(crate) fn add_active_cpu(&mut self, id: &str, ms: u64) {
        if let Some(s) = self.sessions.get_mut(id) {
            s.active_cpu_ms = s.active_cpu_ms.saturating_add(ms);
        }
    }

    /// Makes a live session time out now (admin); [`World::tick`] then stops it.
    pub(crate) fn expire_session(&mut self, id: &str, now: Millis) -> Result<(), ApiError> {
        let s = self
            .sessions
            .get_mut(id)
            .ok_or_else(|| ApiError::not_found(format!("Sandbox session {id} not found.")))?;
        if s.phase == Phase::Live {
            s.forced_deadline = Some(now);
        }
        Ok(())
    }

    pub(crate) fn session_view(&self, s: &SessionRec, now: Millis) -> SessionView {
        let status = s.status(now);
        let stopped = matches!(status, Status::Stopped | Status::Failed);
        let stopped_at = if stopped { s.stopped_at } else { None };
        // Time-derived transitions move `updatedAt` too.
        let derived = match status {
            Status::Running if s.updated_at < s.started_at => s.started_at,
            Status::Stopped => stopped_at.unwrap_or(s.updated_at).max(s.updated_at),
            _ => s.updated_at,
        };
        SessionView {
            id: s.id.clone(),
            memory: s.vcpus * MB_PER_VCPU,
            vcpus: s.vcpus,
            region: self.settings.region.clone(),
            runtime: s.runtime.clone(),
            timeout: s.timeout_ms,
            status: status.as_str(),
            requested_at: s.requested_at,
            started_at: (status != Status::Pending).then_some(s.started_at),
            requested_stop_at: s.requested_stop_at,
            stopped_at,
            duration: stopped_at.map(|at| at.saturating_sub(s.started_at)),
            source_snapshot_id: s.source_snapshot_id.clone(),
            snapshotted_at: s.snapshotted_at,
            created_at: s.requested_at,
            cwd: s.cwd.clone(),
            active_cpu_duration_ms: s.active_cpu_ms,
            updated_at: derived,
        }
    }

    /// `{session, routes}`.
    pub(crate) fn session_answer(
        &self,
        id: &str,
        now: Millis,
    ) -> Result<serde_json::Value, ApiError> {
        let s = self.session_or_404(id)?;
        let routes = self
            .sandboxes
            .get(&s.sandbox_name)
            .map(|sb| self.routes(sb))
            .unwrap_or_default();
        Ok(serde_json::json!({"session": self.session_view(s, now), "routes": routes}))
    }

    pub(crate) fn list_sessions(&self, q: &ListQuery, now: Millis) -> serde_json::Value {
        let items = self
            .sessions
            .values()
            .filter(|s| admits(q.project.as_deref(), &s.project_id))
            .filter(|s| admits(q.name.as_deref(), &s.sandbox_name))
            .map(|s| (s.seq, self.session_view(s, now)))
            .collect();
        let (sessions, pagination) = q.page(items);
        serde_json::json!({"sessions": sessions, "pagination": pagination})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::model::fixtures::{archived, booted, booted_world, settings};
    use crate::fake::model::Settings;

    #[test]
    fn a_session_boots_runs_and_times_out() {
        // A timeout that snapshots (`snapshot_on_timeout`, unverified on the service).
        let mut w = World::new(
            Settings {
                snapshot_on_timeout: true,
                ..settings()
            },
            "t".into(),
        );
        let id = booted(
            &mut w,
            r#"{"projectId":"p","name":"a","timeout":1000}"#,
            1000,
        );
        assert_eq!(w.access(&id, 1050), Ok(Access::BootingUntil(1100)));
        assert_eq!(
            w.session_view(w.session(&id).unwrap(), 1050).status,
            "pending"
        );
        assert_eq!(w.access(&id, 1100), Ok(Access::Ready));
        assert!(w.tick(2099).stops.is_empty());
        let due = w.tick(2100);
        assert_eq!(due.stops.len(), 1);
        // Persistent by default: the timeout auto-snapshots (as asked).
        let snap = due.stops[0]
            .auto_snapshot
            .clone()
            .expect("auto snapshot id");
        assert_eq!(w.access(&id, 2100).unwrap_err().code, "sandbox_stopping");
        w.finish_stop(&id, Some((snap.clone(), archived("a1"))), 2150);
        assert_eq!(w.access(&id, 2150).unwrap_err().status, 410);
        assert_eq!(w.sandbox("a").unwrap().current_snapshot_id, Some(snap));
        assert!(
            w.tick(5000).stops.is_empty(),
            "a stopped session is not stopped twice"
        );
    }

    #[test]
    fn a_timeout_snapshots_only_when_asked_but_a_stop_does() {
        let (mut w, id) = booted_world(r#"{"projectId":"p","name":"a","timeout":1000}"#, 1000);
        let due = w.tick(2100);
        assert_eq!(due.stops.len(), 1);
        assert_eq!(
            due.stops[0].auto_snapshot, None,
            "a timeout does not snapshot"
        );
        let id2 = booted(
            &mut w,
            r#"{"projectId":"p","name":"b","timeout":60000}"#,
            3000,
        );
        match w.begin_stop(&id2, 3100).unwrap() {
            StopPlan::Stop(work) => assert!(work.auto_snapshot.is_some(), "a stop snapshots"),
            StopPlan::AlreadyStopped => panic!("the session was running"),
        }
        let _ = id;
    }

    #[test]
    fn extend_is_capped_by_the_plan() {
        let (mut w, id) = booted_world(r#"{"projectId":"p","name":"a","timeout":2700000}"#, 0);
        w.extend(&id, 300_000, 200).unwrap();
        assert_eq!(w.session(&id).unwrap().timeout_ms, 3_000_000);
        let e = w.extend(&id, 60_000, 300).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("maximum of 50m"), "{}", e.message);
    }

    #[test]
    fn stop_is_idempotent_and_422_while_snapshotting() {
        let (mut w, id) = booted_world(r#"{"projectId":"p","name":"a","persistent":false}"#, 0);
        let StopPlan::Stop(work) = w.begin_stop(&id, 200).unwrap() else {
            panic!("expected a stop");
        };
        assert_eq!(work.auto_snapshot, None);
        assert_eq!(w.begin_stop(&id, 210).unwrap_err().code, "sandbox_stopping");
        w.finish_stop(&id, None, 220);
        assert_eq!(w.begin_stop(&id, 230).unwrap(), StopPlan::AlreadyStopped);

        let id2 = booted(&mut w, r#"{"projectId":"p","name":"b"}"#, 0);
        w.begin_snapshot(&id2, 200).unwrap();
        assert_eq!(
            w.begin_stop(&id2, 210).unwrap_err().code,
            "sandbox_snapshotting"
        );
    }
}
