//! The platform's operations on the simulated world — create, snapshot, stop, extend, delete,
//! probe, list — each drawing its faults at the start of the call, waiting its latency on
//! virtual time, then taking effect under the lock.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::Notify;

use super::world::{SandboxState, SnapshotState};
use super::{
    SimEnd, SimProvider, DEFAULT_SNAPSHOT_EXPIRY_MS, MIN_TIMEOUT_MS, OP_CREATE, OP_DELETE,
    OP_EXTEND, OP_LIST_SANDBOXES, OP_LIST_SNAPSHOTS, OP_PROBE, OP_SNAPSHOT, OP_STOP,
};
use crate::core::{FailureKind, Millis};
use crate::provider::{ListedResource, ProviderError, SandboxInfo, SandboxSpec, SnapshotInfo};

/// Counts one snapshot call as under way on its sandbox, until dropped.
struct SnapshottingGuard<'a> {
    provider: &'a SimProvider,
    sandbox_id: &'a str,
}

impl<'a> SnapshottingGuard<'a> {
    fn new(provider: &'a SimProvider, sandbox_id: &'a str) -> Self {
        *provider
            .world()
            .snapshotting
            .entry(sandbox_id.to_string())
            .or_default() += 1;
        SnapshottingGuard {
            provider,
            sandbox_id,
        }
    }
}

impl Drop for SnapshottingGuard<'_> {
    fn drop(&mut self) {
        let mut w = self.provider.world();
        if let Some(n) = w.snapshotting.get_mut(self.sandbox_id) {
            *n -= 1;
            if *n == 0 {
                w.snapshotting.remove(self.sandbox_id);
            }
        }
    }
}

impl SimProvider {
    pub(super) async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, ProviderError> {
        let (plan, lose) = self.plan_and_draw(OP_CREATE, |f| f.lost_create);
        Self::admitted(&plan).await?;
        let now = self.now();
        let mut w = self.world();
        let w = &mut *w;
        if spec.name.is_empty() {
            return Err(ProviderError::new(
                FailureKind::Invalid,
                OP_CREATE,
                "400 bad_request: the sandbox name is empty",
            ));
        }
        if spec.timeout_ms < MIN_TIMEOUT_MS {
            return Err(ProviderError::new(
                FailureKind::Invalid,
                OP_CREATE,
                format!(
                    "400 bad_request: `timeout` should be >= {MIN_TIMEOUT_MS} ms, got {}",
                    spec.timeout_ms
                ),
            ));
        }
        if let Some(max) = w.max_lifetime_ms.filter(|max| spec.timeout_ms > *max) {
            return Err(ProviderError::new(
                FailureKind::Invalid,
                OP_CREATE,
                format!(
                    "400 bad_request: `timeout` should be <= {max} ms (the plan's maximum), got {}",
                    spec.timeout_ms
                ),
            ));
        }
        let existing = w.by_name.get(&spec.name).cloned();
        let found = existing.and_then(|id| w.live_sandbox(&id, now).map(|sb| sb.info()));
        let info = match found {
            Some(info) => info,
            None => {
                let files = match &spec.source_snapshot {
                    None => BTreeMap::new(),
                    Some(snap_id) => match w.snapshots.get(snap_id.as_str()) {
                        Some(s) if s.present(now) => s.files.clone(),
                        Some(s) => {
                            let why = if s.deleted { "was deleted" } else { "expired" };
                            return Err(ProviderError::snapshot_gone(
                                OP_CREATE,
                                format!("410 snapshot_not_found: snapshot {snap_id} {why}"),
                            ));
                        }
                        None => {
                            return Err(ProviderError::snapshot_gone(
                                OP_CREATE,
                                format!("410 snapshot_not_found: no snapshot {snap_id}"),
                            ))
                        }
                    },
                };
                w.next_sandbox += 1;
                w.next_order += 1;
                let sb = SandboxState {
                    id: format!("sim-sbx-{:06}", w.next_sandbox),
                    name: spec.name.clone(),
                    task_id: spec.task_id.to_string(),
                    installation_id: spec.installation_id.clone(),
                    generation: spec.generation,
                    source_snapshot: spec.source_snapshot.as_deref().map(str::to_string),
                    created_at: now,
                    order: w.next_order,
                    deadline: now.saturating_add(spec.timeout_ms),
                    ended: None,
                    files,
                    running: BTreeMap::new(),
                    changed: Arc::new(Notify::new()),
                };
                let info = sb.info();
                w.stats.sandboxes_created += 1;
                w.by_name.insert(sb.name.clone(), sb.id.clone());
                w.sandboxes.insert(sb.id.clone(), sb);
                info
            }
        };
        if let Some(e) = plan.lost_answer() {
            return Err(e);
        }
        if lose {
            w.stats.fault("lost_create");
            return Err(ProviderError::transient(
                OP_CREATE,
                format!(
                    "connection reset before the answer arrived (simulated; sandbox {} exists)",
                    spec.name
                ),
                None,
            ));
        }
        Ok(info)
    }

    pub(super) async fn snapshot(
        &self,
        task_id: &str,
        sandbox_id: &str,
        seq: u64,
    ) -> Result<SnapshotInfo, ProviderError> {
        let (plan, fail_permanent, fail_transient, slow, gone_soon) = {
            let mut w = self.world();
            let plan = w.plan(OP_SNAPSHOT);
            let fail_permanent = w.chance(|f| f.snapshot_fail_permanent);
            let fail_transient = w.chance(|f| f.snapshot_fail_transient);
            let slow = w.chance(|f| f.snapshot_slow);
            // How soon the snapshot expires, if it is one that is later gone.
            let gone_soon = w.chance(|f| f.snapshot_gone).then(|| {
                let max = w.faults.snapshot_gone_after_ms.max(1);
                w.rng.between(1, max)
            });
            (plan, fail_permanent, fail_transient, slow, gone_soon)
        };
        // A call that reaches the platform keeps the sandbox "snapshotting" until it is done
        // (including a call whose caller is gone, such as one sent by a process that crashed).
        let _underway = plan
            .rejection()
            .is_none()
            .then(|| SnapshottingGuard::new(self, sandbox_id));
        Self::admitted(&plan).await?;
        let key = (task_id.to_string(), seq);
        let taken = self.world().snapshot_keys.contains_key(&key);
        if slow && !taken {
            let slow_ms = {
                let mut w = self.world();
                w.stats.fault("snapshot_slow");
                w.faults.snapshot_slow_ms
            };
            Self::pause(slow_ms).await;
        }
        let now = self.now();
        let mut w = self.world();
        let w = &mut *w;
        let info = if let Some(id) = w.snapshot_keys.get(&key) {
            let s = w
                .snapshots
                .get(id)
                .expect("every snapshot key points at a stored snapshot");
            if !s.present(now) {
                return Err(ProviderError::snapshot_gone(
                    OP_SNAPSHOT,
                    format!(
                        "410 snapshot_not_found: snapshot {id} (task {task_id}, seq {seq}) is gone"
                    ),
                ));
            }
            s.info()
        } else {
            let underway = w.snapshotting.get(sandbox_id).copied().unwrap_or(0);
            let sb = w.live_or_gone(OP_SNAPSHOT, sandbox_id, now)?;
            if underway > 1 {
                // Another snapshot of this sandbox is under way. (Its own faults were drawn for
                // it; this call must not fail for good while that one may still succeed.)
                return Err(ProviderError::transient(
                    OP_SNAPSHOT,
                    format!("422 sandbox_snapshotting: {sandbox_id} is being snapshotted"),
                    None,
                ));
            }
            if sb.task_id != task_id {
                return Err(ProviderError::new(
                    FailureKind::Invalid,
                    OP_SNAPSHOT,
                    format!(
                        "sandbox {sandbox_id} belongs to task {}, not to task {task_id}",
                        sb.task_id
                    ),
                ));
            }
            if fail_transient {
                w.stats.fault("snapshot_fail_transient");
                return Err(ProviderError::transient(
                    OP_SNAPSHOT,
                    format!("422 sandbox_snapshotting: snapshot of {sandbox_id} did not complete (simulated); try again"),
                    None,
                ));
            }
            if fail_permanent {
                w.stats.fault("snapshot_fail_permanent");
                return Err(ProviderError::new(
                    FailureKind::Permanent,
                    OP_SNAPSHOT,
                    format!("snapshot of {sandbox_id} failed (simulated)"),
                ));
            }
            let files = std::mem::take(&mut sb.files);
            let installation_id = sb.installation_id.clone();
            sb.end(SimEnd::Snapshotted, now);
            let expires_at = if let Some(after) = gone_soon {
                w.stats.fault("snapshot_gone");
                now.saturating_add(after)
            } else {
                now.saturating_add(DEFAULT_SNAPSHOT_EXPIRY_MS)
            };
            w.next_snapshot += 1;
            w.next_order += 1;
            let s = SnapshotState {
                id: format!("sim-snap-{:06}", w.next_snapshot),
                task_id: task_id.to_string(),
                seq,
                installation_id,
                sandbox_id: sandbox_id.to_string(),
                files,
                created_at: now,
                order: w.next_order,
                expires_at: Some(expires_at),
                deleted: false,
            };
            let info = s.info();
            w.stats.snapshots_taken += 1;
            w.snapshot_keys.insert(key, s.id.clone());
            w.snapshots.insert(s.id.clone(), s);
            info
        };
        if let Some(e) = plan.lost_answer() {
            return Err(e);
        }
        Ok(info)
    }

    pub(super) async fn stop(&self, sandbox_id: &str) -> Result<(), ProviderError> {
        let plan = self.plan(OP_STOP);
        Self::admitted(&plan).await?;
        let now = self.now();
        if let Some(sb) = self.world().live_sandbox(sandbox_id, now) {
            sb.end(SimEnd::Stopped, now);
        }
        plan.lost_answer().map_or(Ok(()), Err)
    }

    pub(super) async fn extend(
        &self,
        sandbox_id: &str,
        duration_ms: u64,
    ) -> Result<Millis, ProviderError> {
        let plan = self.plan(OP_EXTEND);
        Self::admitted(&plan).await?;
        let now = self.now();
        let mut w = self.world();
        let w = &mut *w;
        if duration_ms < MIN_TIMEOUT_MS {
            return Err(ProviderError::new(
                FailureKind::Invalid,
                OP_EXTEND,
                format!("400 bad_request: `duration` should be >= {MIN_TIMEOUT_MS} ms, got {duration_ms}"),
            ));
        }
        let max = w.max_lifetime_ms;
        let sb = w.live_or_gone(OP_EXTEND, sandbox_id, now)?;
        let deadline = sb.deadline.saturating_add(duration_ms);
        if let Some(max) = max.filter(|max| deadline - sb.created_at > *max) {
            return Err(ProviderError::new(
                FailureKind::Invalid,
                OP_EXTEND,
                format!(
                    "400 bad_request: extending {sandbox_id} by {duration_ms} ms would exceed the plan's \
                     maximum lifetime of {max} ms"
                ),
            ));
        }
        sb.deadline = deadline;
        sb.changed.notify_waiters();
        plan.lost_answer().map_or(Ok(deadline), Err)
    }

    pub(super) async fn delete_snapshot_op(&self, snapshot_id: &str) -> Result<(), ProviderError> {
        let (plan, fail) = self.plan_and_draw(OP_DELETE, |f| f.delete_fail);
        Self::admitted(&plan).await?;
        let mut w = self.world();
        if fail {
            w.stats.fault("delete_fail");
            return Err(ProviderError::transient(
                OP_DELETE,
                format!(
                    "500 internal_server_error: deleting snapshot {snapshot_id} failed (simulated)"
                ),
                None,
            ));
        }
        // Unknown, deleted and expired snapshots are all "gone", and deleting a gone snapshot
        // succeeds (a 404 on the platform).
        if let Some(s) = w.snapshots.get_mut(snapshot_id) {
            s.deleted = true;
        }
        plan.lost_answer().map_or(Ok(()), Err)
    }

    pub(super) async fn probe(&self, sandbox_id: &str) -> Result<Option<Millis>, ProviderError> {
        Self::answered(&self.plan(OP_PROBE)).await?;
        let now = self.now();
        Ok(self
            .world()
            .live_sandbox(sandbox_id, now)
            .map(|sb| sb.deadline))
    }

    pub(super) async fn list_sandboxes_op(
        &self,
        installation_id: &str,
    ) -> Result<Vec<ListedResource>, ProviderError> {
        Self::answered(&self.plan(OP_LIST_SANDBOXES)).await?;
        let now = self.now();
        let mut w = self.world();
        Ok(w.sandboxes
            .values_mut()
            .filter(|sb| sb.installation_id == installation_id)
            .map(|sb| ListedResource {
                live: sb.settle(now),
                id: sb.id.clone(),
                task_id: Some(sb.task_id.clone()),
            })
            .collect())
    }

    pub(super) async fn list_snapshots_op(
        &self,
        installation_id: &str,
    ) -> Result<Vec<ListedResource>, ProviderError> {
        Self::answered(&self.plan(OP_LIST_SNAPSHOTS)).await?;
        let now = self.now();
        let w = self.world();
        Ok(w.snapshots
            .values()
            .filter(|s| s.installation_id == installation_id)
            .map(|s| ListedResource {
                id: s.id.clone(),
                task_id: Some(s.task_id.clone()),
                live: s.present(now),
            })
            .collect())
    }
}
