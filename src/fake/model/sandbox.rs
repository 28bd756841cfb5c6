//! Named sandboxes: their records, creating one (idempotent by name) and resuming it (a new
//! session from its current snapshot) as plans for the HTTP layer to boot, deleting, and the
//! sandbox views, routes and list.

use super::session::{Phase, SessionRec, Status};
use super::{admits, ListQuery, StopWork, World, WORKSPACE_ROOT};
use crate::core::Millis;
use crate::fake::validate::{CreateRequest, SandboxSettings, MB_PER_VCPU};
use crate::fake::wire::{ApiError, RouteView, SandboxView};

/// A named sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SandboxRec {
    pub seq: u64,
    pub name: String,
    pub project_id: String,
    pub persistent: bool,
    pub runtime: Option<String>,
    pub image: Option<String>,
    pub settings: SandboxSettings,
    pub snapshot_expiration_ms: Option<u64>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub current_session_id: String,
    pub current_snapshot_id: Option<String>,
}

/// A session the caller must boot: records to insert once its workspace is ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewSession {
    /// `Some` when the sandbox itself is new (a create); `None` on a resume.
    pub sandbox: Option<SandboxRec>,
    pub session: SessionRec,
    /// The archive to restore the workspace from (the source snapshot's).
    pub source_archive: Option<String>,
}

/// What a create asks of the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CreatePlan {
    /// The name exists: answer with the sandbox as it is (a retried create finds its sandbox).
    Existing { name: String },
    /// Restore `source_archive` (if any) into a new workspace, then `commit_session`.
    New(Box<NewSession>),
}

/// What a `GET /v2/sandboxes/{name}?resume=true` asks of the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ResumePlan {
    /// The current session is alive: answer with it.
    Current,
    /// The current session is still stopping: wait, then ask again.
    Wait,
    /// Boot this new session.
    New(Box<NewSession>),
}

impl World {
    fn sandbox_or_404(&self, name: &str, project: Option<&str>) -> Result<&SandboxRec, ApiError> {
        self.sandboxes
            .get(name)
            .filter(|sb| admits(project, &sb.project_id))
            .ok_or_else(|| ApiError::not_found(format!("Sandbox {name} not found.")))
    }

    fn new_session(
        &mut self,
        sandbox: &SandboxRec,
        runtime: Option<String>,
        source_snapshot_id: Option<String>,
        now: Millis,
    ) -> SessionRec {
        let (seq, id) = self.next("sbx_");
        SessionRec {
            seq,
            id,
            sandbox_name: sandbox.name.clone(),
            project_id: sandbox.project_id.clone(),
            runtime,
            cwd: match sandbox.image {
                Some(_) => self.settings.image_cwd.clone(),
                None => WORKSPACE_ROOT.to_string(),
            },
            vcpus: sandbox.settings.vcpus,
            timeout_ms: sandbox.settings.timeout_ms,
            env: sandbox.settings.env.clone(),
            requested_at: now,
            started_at: now.saturating_add(self.settings.boot_delay_ms),
            source_snapshot_id,
            phase: Phase::Live,
            requested_stop_at: None,
            stopped_at: None,
            snapshotted_at: None,
            active_cpu_ms: 0,
            updated_at: now,
            forced_deadline: None,
        }
    }

    /// Plans a create: an existing name answers with its sandbox, a new one needs booting.
    pub(crate) fn plan_create(
        &mut self,
        req: CreateRequest,
        now: Millis,
    ) -> Result<CreatePlan, ApiError> {
        if let Some(name) = &req.name {
            if let Some(existing) = self.sandboxes.get(name) {
                if existing.project_id != req.project_id {
                    return Err(ApiError::new(
                        409,
                        "conflict",
                        format!("A sandbox named {name} already exists in another project."),
                    ));
                }
                return Ok(CreatePlan::Existing { name: name.clone() });
            }
        }
        let (runtime, image, source_archive) = match &req.source_snapshot {
            Some(snap) => {
                let snap = self.usable_snapshot(snap, now)?;
                (
                    snap.runtime.clone(),
                    req.image.clone().or(snap.image.clone()),
                    Some(snap.archive.clone()),
                )
            }
            None => (
                req.runtime.map(|r| r.as_str().to_string()),
                req.image.clone(),
                None,
            ),
        };
        let (seq, generated) = self.next("sbx-");
        let name = req.name.clone().unwrap_or(generated);
        let sandbox = SandboxRec {
            seq,
            name,
            project_id: req.project_id,
            persistent: req.persistent,
            runtime: runtime.clone(),
            image,
            settings: req.settings,
            snapshot_expiration_ms: req.snapshot_expiration_ms,
            created_at: now,
            updated_at: now,
            current_session_id: String::new(),
            current_snapshot_id: req.source_snapshot.clone(),
        };
        let session = self.new_session(&sandbox, runtime, req.source_snapshot, now);
        Ok(CreatePlan::New(Box::new(NewSession {
            sandbox: Some(SandboxRec {
                current_session_id: session.id.clone(),
                ..sandbox
            }),
            session,
            source_archive,
        })))
    }

    /// Plans a resume of `name`'s sandbox (its current session stopped: boot a new one from the
    /// current snapshot, or fresh when it has none).
    pub(crate) fn plan_resume(
        &mut self,
        name: &str,
        project: Option<&str>,
        now: Millis,
    ) -> Result<ResumePlan, ApiError> {
        let sandbox = self.sandbox_or_404(name, project)?.clone();
        let current = self.session_or_404(&sandbox.current_session_id)?;
        let can_resume = match current.status(now) {
            Status::Pending | Status::Running => return Ok(ResumePlan::Current),
            Status::Stopping => return Ok(ResumePlan::Wait),
            // The snapshot is taken before the settle delay starts, so a new session can
            // already boot from it.
            Status::Snapshotting => current.snapshotted_at.is_some(),
            Status::Stopped | Status::Failed => true,
        };
        if !can_resume {
            return Ok(ResumePlan::Wait);
        }
        let source_archive = match &sandbox.current_snapshot_id {
            Some(snap) => Some(self.usable_snapshot(snap, now)?.archive.clone()),
            None => None,
        };
        let runtime = sandbox.runtime.clone();
        let session = self.new_session(&sandbox, runtime, sandbox.current_snapshot_id.clone(), now);
        Ok(ResumePlan::New(Box::new(NewSession {
            sandbox: None,
            session,
            source_archive,
        })))
    }

    /// Records a booted session (and its new sandbox); marks its source snapshot used.
    pub(crate) fn commit_session(&mut self, new: NewSession, now: Millis) {
        let NewSession {
            sandbox, session, ..
        } = new;
        if let Some(snap) = session
            .source_snapshot_id
            .as_ref()
            .and_then(|id| self.snapshots.get_mut(id))
        {
            snap.last_used_at = Some(now);
            snap.updated_at = now;
        }
        if let Some(sb) = sandbox {
            self.sandboxes.insert(sb.name.clone(), sb);
        } else if let Some(sb) = self.sandboxes.get_mut(&session.sandbox_name) {
            sb.current_session_id = session.id.clone();
            sb.updated_at = now;
        }
        self.sessions.insert(session.id.clone(), session);
    }

    /// Deletes a sandbox by name. Returns the view and the session to stop (if still live).
    pub(crate) fn delete_sandbox(
        &mut self,
        name: &str,
        project: Option<&str>,
        now: Millis,
    ) -> Result<(SandboxView, Option<StopWork>), ApiError> {
        let sb = self.sandbox_or_404(name, project)?.clone();
        let view = self.sandbox_view(&sb, now);
        let live = self
            .sessions
            .get(&sb.current_session_id)
            .is_some_and(|s| s.phase == Phase::Live);
        let stop = live.then(|| {
            // Deleting discards the session: no auto-snapshot.
            self.mark_stopping(&sb.current_session_id, now, false)
        });
        self.sandboxes.remove(name);
        Ok((view, stop))
    }

    pub(crate) fn sandbox_view(&self, sb: &SandboxRec, now: Millis) -> SandboxView {
        let session = self.sessions.get(&sb.current_session_id);
        let session_view = session.map(|s| self.session_view(s, now));
        SandboxView {
            name: sb.name.clone(),
            persistent: sb.persistent,
            region: self.settings.region.clone(),
            vcpus: sb.settings.vcpus,
            memory: sb.settings.vcpus * MB_PER_VCPU,
            runtime: sb.runtime.clone(),
            image: sb.image.clone(),
            timeout: sb.settings.timeout_ms,
            created_at: sb.created_at,
            updated_at: sb.updated_at,
            current_session_id: sb.current_session_id.clone(),
            current_snapshot_id: sb.current_snapshot_id.clone(),
            status: session_view.as_ref().map_or("stopped", |v| v.status),
            status_updated_at: session_view
                .as_ref()
                .map_or(sb.updated_at, |v| v.updated_at),
            cwd: session.map_or_else(|| WORKSPACE_ROOT.to_string(), |s| s.cwd.clone()),
            tags: sb.settings.tags.clone(),
            snapshot_expiration: sb.snapshot_expiration_ms,
        }
    }

    /// The routes of a sandbox's ports (the fake serves none of them; the shapes are right).
    pub(crate) fn routes(&self, sb: &SandboxRec) -> Vec<RouteView> {
        sb.settings
            .ports
            .iter()
            .map(|port| {
                let subdomain = format!("{}-{port}", sb.name.to_ascii_lowercase());
                RouteView {
                    url: format!("https://{subdomain}.vercel.run"),
                    subdomain,
                    port: *port,
                }
            })
            .collect()
    }

    /// `{sandbox, session, routes}` for a sandbox's current session (404 when the name is unknown
    /// or belongs to another project).
    pub(crate) fn sandbox_answer(
        &self,
        name: &str,
        project: Option<&str>,
        now: Millis,
    ) -> Result<serde_json::Value, ApiError> {
        let sb = self.sandbox_or_404(name, project)?;
        let session = self.session_or_404(&sb.current_session_id)?;
        Ok(serde_json::json!({
            "sandbox": self.sandbox_view(sb, now),
            "session": self.session_view(session, now),
            "routes": self.routes(sb),
        }))
    }

    pub(crate) fn list_sandboxes(&self, q: &ListQuery, now: Millis) -> serde_json::Value {
        let items = self
            .sandboxes
            .values()
            .filter(|sb| admits(q.project.as_deref(), &sb.project_id))
            .filter(|sb| {
                q.name_prefix
                    .as_deref()
                    .is_none_or(|p| sb.name.starts_with(p))
            })
            .filter(|sb| {
                q.tags
                    .iter()
                    .all(|(k, v)| sb.settings.tags.get(k).is_some_and(|have| have == v))
            })
            .map(|sb| (sb.seq, self.sandbox_view(sb, now)))
            .collect();
        let (sandboxes, pagination) = q.page(items);
        serde_json::json!({"sandboxes": sandboxes, "pagination": pagination})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::model::fixtures::{archived, booted, booted_world, create, settings};

    #[test]
    fn a_second_create_with_the_name_finds_the_first() {
        let mut w = World::new(settings(), "t".into());
        booted(&mut w, r#"{"projectId":"p","name":"a"}"#, 0);
        assert_eq!(
            create(&mut w, r#"{"projectId":"p","name":"a"}"#, 5).unwrap(),
            CreatePlan::Existing { name: "a".into() }
        );
        assert_eq!(
            create(&mut w, r#"{"projectId":"other","name":"a"}"#, 5)
                .unwrap_err()
                .status,
            409
        );
    }

    #[test]
    fn resume_boots_from_the_current_snapshot() {
        let (mut w, id) = booted_world(r#"{"projectId":"p","name":"a"}"#, 0);
        assert_eq!(w.plan_resume("a", None, 200).unwrap(), ResumePlan::Current);
        let snap = w.begin_snapshot(&id, 200).unwrap();
        assert_eq!(w.plan_resume("a", None, 250).unwrap(), ResumePlan::Wait);
        w.finish_snapshot(&id, &snap, archived("a"), None, 300);
        let ResumePlan::New(new) = w.plan_resume("a", Some("p"), 310).unwrap() else {
            panic!("expected a new session");
        };
        assert_eq!(new.session.source_snapshot_id, Some(snap));
        assert_eq!(new.source_archive.as_deref(), Some("a"));
        let new_id = new.session.id.clone();
        w.commit_session(*new, 310);
        assert_eq!(w.sandbox("a").unwrap().current_session_id, new_id);
        assert_eq!(
            w.plan_resume("a", Some("other"), 310).unwrap_err().status,
            404
        );
    }
}
