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

use std::collections::BTreeMap;

use base64::Engine as _;

use super::validate::{human_ms, CreateRequest, Limits, MB_PER_VCPU};
use super::wire::{ApiError, Pagination, RouteView, SandboxView, SessionView, SnapshotView};
use crate::core::Millis;

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
}

/// A named sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SandboxRec {
    pub seq: u64,
    pub name: String,
    pub project_id: String,
    pub persistent: bool,
    pub runtime: Option<String>,
    pub image: Option<String>,
    pub vcpus: u32,
    pub timeout_ms: u64,
    pub ports: Vec<u16>,
    pub env: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    pub snapshot_expiration_ms: Option<u64>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub current_session_id: String,
    pub current_snapshot_id: Option<String>,
}

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

/// Work that time alone made due.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Due {
    /// Sessions past their deadline, now `stopping`.
    pub stops: Vec<StopWork>,
    /// Archives of expired snapshots, which can go.
    pub discard_archives: Vec<String>,
}

/// A parsed list query (`limit`, `cursor`, `sortOrder` and the filters).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ListQuery {
    pub project: Option<String>,
    pub name: Option<String>,
    pub name_prefix: Option<String>,
    pub tags: Vec<(String, String)>,
    pub limit: usize,
    pub cursor: Option<u64>,
    pub ascending: bool,
}

const DEFAULT_LIMIT: usize = 20;
const MAX_LIMIT: usize = 50;

impl ListQuery {
    /// Parses the query pairs of a list call (repeated `tags=k:v` allowed).
    pub(crate) fn parse(pairs: &[(String, String)]) -> Result<ListQuery, ApiError> {
        let mut q = ListQuery {
            limit: DEFAULT_LIMIT,
            ..ListQuery::default()
        };
        for (k, v) in pairs {
            match k.as_str() {
                "project" | "projectId" => q.project = Some(v.clone()),
                "name" => q.name = Some(v.clone()),
                "namePrefix" => q.name_prefix = Some(v.clone()),
                "tags" => {
                    let (tk, tv) = v.split_once(':').ok_or_else(|| {
                        ApiError::invalid(format!("`tags` should look like key:value (got {v:?})."))
                    })?;
                    q.tags.push((tk.to_string(), tv.to_string()));
                }
                "limit" => {
                    let n: usize = v
                        .parse()
                        .map_err(|_| ApiError::invalid("`limit` should be integer."))?;
                    if n == 0 {
                        return Err(ApiError::invalid("`limit` should be >= 1."));
                    }
                    if n > MAX_LIMIT {
                        return Err(ApiError::invalid(format!(
                            "`limit` should be <= {MAX_LIMIT}."
                        )));
                    }
                    q.limit = n;
                }
                "cursor" => q.cursor = Some(decode_cursor(v)?),
                "sortOrder" => {
                    match v.as_str() {
                        "asc" => q.ascending = true,
                        "desc" => q.ascending = false,
                        _ => return Err(ApiError::invalid(
                            "`sortOrder` should be equal to one of the allowed values: asc, desc.",
                        )),
                    }
                }
                // teamId, sortBy and anything else the SDK adds are accepted and ignored.
                _ => {}
            }
        }
        Ok(q)
    }

    /// Orders `items` by sequence, skips to the cursor and cuts a page.
    fn page<T>(&self, mut items: Vec<(u64, T)>) -> (Vec<T>, Pagination) {
        items.sort_by_key(|(seq, _)| *seq);
        if !self.ascending {
            items.reverse();
        }
        if let Some(c) = self.cursor {
            items.retain(|(seq, _)| if self.ascending { *seq > c } else { *seq < c });
        }
        let more = items.len() > self.limit;
        items.truncate(self.limit);
        let next = if more {
            items.last().map(|(seq, _)| encode_cursor(*seq))
        } else {
            None
        };
        let page: Vec<T> = items.into_iter().map(|(_, t)| t).collect();
        let count = page.len();
        (page, Pagination { count, next })
    }
}

fn encode_cursor(seq: u64) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("seq:{seq}"))
}

fn decode_cursor(s: &str) -> Result<u64, ApiError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|t| t.strip_prefix("seq:").and_then(|n| n.parse().ok()))
        .ok_or_else(|| ApiError::invalid("`cursor` is not a cursor this server issued."))
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

    fn session_or_404(&self, id: &str) -> Result<&SessionRec, ApiError> {
        self.sessions
            .get(id)
            .ok_or_else(|| ApiError::not_found(format!("Sandbox session {id} not found.")))
    }

    fn sandbox_or_404(&self, name: &str, project: Option<&str>) -> Result<&SandboxRec, ApiError> {
        self.sandboxes
            .get(name)
            .filter(|sb| admits(project, &sb.project_id))
            .ok_or_else(|| ApiError::not_found(format!("Sandbox {name} not found.")))
    }

    /// A usable snapshot, or why not (404 never existed, 410 expired or deleted).
    fn usable_snapshot(&self, id: &str, now: Millis) -> Result<&SnapshotRec, ApiError> {
        let snap = self
            .snapshots
            .get(id)
            .ok_or_else(|| ApiError::not_found(format!("Snapshot {id} not found.")))?;
        match snap.state(now) {
            SnapState::Live => Ok(snap),
            SnapState::Expired | SnapState::Deleted => Err(ApiError::snapshot_not_found(id)),
        }
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
            vcpus: sandbox.vcpus,
            timeout_ms: sandbox.timeout_ms,
            env: sandbox.env.clone(),
            requested_at: now,
            started_at: now.saturating_add(self.settings.boot_delay_ms),
            source_snapshot_id,
            phase: Phase::Live,
            requested_stop_at: None,
            stopped_at: None,
            snapshotted_at: None,
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
            vcpus: req.vcpus,
            timeout_ms: req.timeout_ms,
            ports: req.ports,
            env: req.env,
            tags: req.tags,
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
        Ok(StopPlan::Stop(self.mark_stopping(id, now)))
    }

    fn mark_stopping(&mut self, id: &str, now: Millis) -> StopWork {
        let persistent = self
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

    fn insert_snapshot(
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

    /// Makes a snapshot expire now (admin).
    pub(crate) fn expire_snapshot(&mut self, id: &str, now: Millis) -> Result<(), ApiError> {
        let s = self
            .snapshots
            .get_mut(id)
            .ok_or_else(|| ApiError::not_found(format!("Snapshot {id} not found.")))?;
        s.forced_expiry = Some(now);
        Ok(())
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
            .map(|id| self.mark_stopping(id, now))
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
            let mut work = self.mark_stopping(&sb.current_session_id, now);
            work.auto_snapshot = None;
            work
        });
        self.sandboxes.remove(name);
        Ok((view, stop))
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
            cwd: WORKSPACE_ROOT.to_string(),
            updated_at: derived,
        }
    }

    pub(crate) fn sandbox_view(&self, sb: &SandboxRec, now: Millis) -> SandboxView {
        let session = self.sessions.get(&sb.current_session_id);
        let session_view = session.map(|s| self.session_view(s, now));
        SandboxView {
            name: sb.name.clone(),
            persistent: sb.persistent,
            region: self.settings.region.clone(),
            vcpus: sb.vcpus,
            memory: sb.vcpus * MB_PER_VCPU,
            runtime: sb.runtime.clone(),
            image: sb.image.clone(),
            timeout: sb.timeout_ms,
            created_at: sb.created_at,
            updated_at: sb.updated_at,
            current_session_id: sb.current_session_id.clone(),
            current_snapshot_id: sb.current_snapshot_id.clone(),
            status: session_view.as_ref().map_or("stopped", |v| v.status),
            status_updated_at: session_view
                .as_ref()
                .map_or(sb.updated_at, |v| v.updated_at),
            cwd: WORKSPACE_ROOT.to_string(),
            tags: sb.tags.clone(),
            snapshot_expiration: sb.snapshot_expiration_ms,
        }
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

    /// The routes of a sandbox's ports (the fake serves none of them; the shapes are right).
    pub(crate) fn routes(&self, sb: &SandboxRec) -> Vec<RouteView> {
        sb.ports
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
                    .all(|(k, v)| sb.tags.get(k).is_some_and(|have| have == v))
            })
            .map(|sb| (sb.seq, self.sandbox_view(sb, now)))
            .collect();
        let (sandboxes, pagination) = q.page(items);
        serde_json::json!({"sandboxes": sandboxes, "pagination": pagination})
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

/// Whether an optional filter admits `value` (no filter admits everything).
fn admits(filter: Option<&str>, value: &str) -> bool {
    filter.is_none_or(|f| f == value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::validate::{create_request, CreateApi, Limits};

    fn settings() -> Settings {
        Settings {
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

    fn archived(key: &str) -> Archived {
        Archived {
            key: key.to_string(),
            size_bytes: 42,
        }
    }

    fn create(world: &mut World, body: &str, now: Millis) -> Result<CreatePlan, ApiError> {
        let req = create_request(body.as_bytes(), &world.settings.limits, CreateApi::V2)?;
        world.plan_create(req, now)
    }

    fn booted(world: &mut World, body: &str, now: Millis) -> String {
        match create(world, body, now).unwrap() {
            CreatePlan::New(new) => {
                let id = new.session.id.clone();
                world.commit_session(*new, now);
                id
            }
            other => panic!("expected a new sandbox, got {other:?}"),
        }
    }

    #[test]
    fn a_session_boots_runs_and_times_out() {
        let mut w = World::new(settings(), "t".into());
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
        // Persistent by default: the timeout auto-snapshots.
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
    fn snapshot_settles_then_stops_and_restores() {
        let mut w = World::new(settings(), "t".into());
        let id = booted(
            &mut w,
            r#"{"projectId":"p","name":"a","persistent":false}"#,
            0,
        );
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
        let mut w = World::new(settings(), "t".into());
        let id = booted(&mut w, r#"{"projectId":"p","name":"a"}"#, 0);
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

    #[test]
    fn resume_boots_from_the_current_snapshot() {
        let mut w = World::new(settings(), "t".into());
        let id = booted(&mut w, r#"{"projectId":"p","name":"a"}"#, 0);
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

    #[test]
    fn extend_is_capped_by_the_plan() {
        let mut w = World::new(settings(), "t".into());
        let id = booted(
            &mut w,
            r#"{"projectId":"p","name":"a","timeout":2700000}"#,
            0,
        );
        w.extend(&id, 300_000, 200).unwrap();
        assert_eq!(w.session(&id).unwrap().timeout_ms, 3_000_000);
        let e = w.extend(&id, 60_000, 300).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("maximum of 50m"), "{}", e.message);
    }

    #[test]
    fn stop_is_idempotent_and_422_while_snapshotting() {
        let mut w = World::new(settings(), "t".into());
        let id = booted(
            &mut w,
            r#"{"projectId":"p","name":"a","persistent":false}"#,
            0,
        );
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

    #[test]
    fn lists_filter_and_paginate() {
        let mut w = World::new(settings(), "t".into());
        for i in 0..5 {
            let tag = if i % 2 == 0 { "even" } else { "odd" };
            booted(
                &mut w,
                &format!(r#"{{"projectId":"p","name":"s{i}","tags":{{"kind":"{tag}"}}}}"#),
                i,
            );
        }
        let pairs = |s: &[(&str, &str)]| -> Vec<(String, String)> {
            s.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let q = ListQuery::parse(&pairs(&[("tags", "kind:even"), ("limit", "2")])).unwrap();
        let page = w.list_sandboxes(&q, 10);
        let names: Vec<&str> = page["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["s4", "s2"]);
        assert_eq!(page["pagination"]["count"], 2);
        let next = page["pagination"]["next"].as_str().unwrap().to_string();
        let q2 = ListQuery::parse(&pairs(&[
            ("tags", "kind:even"),
            ("limit", "2"),
            ("cursor", &next),
        ]))
        .unwrap();
        let page2 = w.list_sandboxes(&q2, 10);
        assert_eq!(page2["sandboxes"][0]["name"], "s0");
        assert!(page2["pagination"]["next"].is_null());
        assert!(ListQuery::parse(&pairs(&[("limit", "51")])).is_err());
        assert!(ListQuery::parse(&pairs(&[("cursor", "garbage!")])).is_err());
        assert!(ListQuery::parse(&pairs(&[("tags", "nocolon")])).is_err());
    }
}
