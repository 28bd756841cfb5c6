//! A checkpoint of a live local sandbox: pause its processes (the cgroup freezer,
//! [`freeze`](super::freeze)), snapshot the workspace as a snapshot does (the content store,
//! walking only what the change tracker saw change), start tracking again from the new
//! snapshot, and resume them — the thaw is a guard's drop, so a failure never leaves them
//! paused. The sandbox is not touched otherwise: same processes, same deadline.
//!
//! A checkpoint that finds nothing changed since `previous` (the task's latest snapshot)
//! writes nothing and answers `None`: the tracker, paused with the processes, says no event
//! came since its index was the content of `previous`; without a tracker (this process did not
//! restore the sandbox) the new manifest is compared with `previous`'s.

use std::fs;
use std::io::BufReader;

use super::archive::{self, ArchiveHeader};
use super::cas::{Index, Limits, Tracker};
use super::error::LocalError;
use super::freeze::{Freezer, Frozen};
use super::names::{check_owner, SandboxName, SnapshotRef};
use super::snapshot::{kept_bytes, random_nonce, read_manifest, write_snapshot, Walk, INDEX_FILE};
use super::{cgroup, run_blocking, LocalProvider, Slot};
use crate::ids::TaskId;
use crate::provider::SnapshotInfo;

/// What the blocking part of a checkpoint found.
enum Outcome {
    /// Nothing changed since `previous`: nothing written.
    Unchanged,
    /// A snapshot written: its data bytes, what it left out, and its manifest's id.
    Taken {
        size_bytes: u64,
        omitted: Vec<String>,
    },
}

impl LocalProvider {
    pub(super) async fn checkpoint_sandbox(
        &self,
        task_id: &str,
        sandbox_id: &str,
        seq: u64,
        previous: Option<&str>,
    ) -> Result<Option<SnapshotInfo>, LocalError> {
        let task = TaskId::new(task_id)?;
        let name = SandboxName::parse(sandbox_id)?;
        check_owner(&name, "task", name.task.as_str(), task.as_str())?;
        let slot = self.slot(&name);
        let _guard = slot.lock.lock().await;
        let meta = self.existing_meta(&name)?;
        check_owner(&name, "task", &meta.task_id, task.as_str())?;
        // Taken before by this same operation (recovery re-issuing it): answer it again.
        if let Some((snap, archive_bytes)) = self.find_taken(&name, seq, Some(&meta.instance))? {
            let path = self.snapshot_path(&snap);
            let size_bytes = run_blocking("read a snapshot's manifest", move || {
                Ok(kept_bytes(&path).unwrap_or(archive_bytes))
            })
            .await?;
            return Ok(Some(info(&snap, size_bytes, Vec::new())));
        }
        let freezer = self.freezer(&name, &slot)?;
        let snap = SnapshotRef {
            task,
            seq,
            nonce: Some(random_nonce()?),
        };
        let path = self.snapshot_path(&snap);
        let (header, tmp, in_flight) = self.archive_start(&snap, &path, &name, &meta);
        let sandbox_dir = self.sandbox_dir(&name);
        let workspace = self.workspace_dir(&name);
        let index = sandbox_dir.join(INDEX_FILE);
        let tracker = super::lock(&self.trackers).remove(&name.name);
        let base = super::lock(&self.tracked_base).remove(&name.name);
        let previous_path = previous
            .and_then(|p| SnapshotRef::parse(p).ok())
            .map(|p| self.snapshot_path(&p));
        let unchanged_base = previous.is_some() && base.as_deref() == previous;
        let cas = self.cas.clone();
        let (snap2, path2) = (snap.clone(), path.clone());
        let (outcome, tracker) = run_blocking("take a checkpoint", move || {
            let _in_flight = in_flight;
            // Paused until `frozen` drops, whatever happens below.
            let frozen = match freezer {
                Some(f) => Some(Frozen::freeze(f).map_err(|reason| LocalError::Freeze {
                    sandbox: snap2.id(),
                    reason,
                })?),
                None => None,
            };
            // Nothing changed since the index, which holds `previous`'s files: no snapshot.
            if unchanged_base && tracker.as_ref().is_some_and(Tracker::unchanged) {
                return Ok((Outcome::Unchanged, tracker));
            }
            let walk = match tracker.map(Tracker::finish) {
                Some(Ok(tracked)) => Walk::Tracked(Box::new(tracked)),
                Some(Err(why)) => {
                    tracing::info!(snapshot = %snap2.id(), reason = %why,
                        "the checkpoint walks every file");
                    Walk::Full { index: &index }
                }
                None => Walk::Full { index: &index },
            };
            let same_as_previous = |manifest: &super::cas::Manifest| {
                let Some(prev) = previous_path.as_ref() else {
                    return false;
                };
                let Ok(file) = fs::File::open(prev) else {
                    return false;
                };
                let mut reader = BufReader::new(file);
                match archive::read_prefix_versioned(&mut reader) {
                    Ok((version, _)) if version >= archive::VERSION => {
                        read_manifest(reader).is_ok_and(|p| p.same_content(manifest))
                    }
                    _ => false,
                }
            };
            let written = write_snapshot_unless(
                &cas,
                &snap2,
                &workspace,
                walk,
                &header,
                &path2,
                &tmp,
                same_as_previous,
            )?;
            let Some((size_bytes, stats, manifest)) = written else {
                // The walk found the files as `previous` holds them: track from there.
                return Ok((
                    Outcome::Unchanged,
                    restart_tracker(&workspace, &index, None),
                ));
            };
            for o in &stats.omitted {
                tracing::warn!(snapshot = %snap2.id(), path = %o.path, reason = %o.reason,
                    "left out of the checkpoint");
            }
            // Track from the checkpoint on, before anything can write again.
            let tracker = restart_tracker(&workspace, &index, Some(manifest));
            let paused = frozen.as_ref().map(|f| f.took);
            drop(frozen);
            tracing::debug!(snapshot = %snap2.id(), size_bytes, ?paused,
                tracked = stats.tracked, files_read = stats.files_read,
                objects_written = stats.objects_written, "local checkpoint taken");
            Ok((
                Outcome::Taken {
                    size_bytes,
                    omitted: stats
                        .omitted
                        .into_iter()
                        .map(|o| format!("{}: {}", o.path, o.reason))
                        .collect(),
                },
                tracker,
            ))
        })
        .await?;
        let base_now = match &outcome {
            Outcome::Unchanged => previous.map(str::to_string),
            Outcome::Taken { .. } => Some(snap.id()),
        };
        if let Some(tracker) = tracker {
            super::lock(&self.trackers).insert(name.name.clone(), tracker);
            if let Some(base_now) = base_now {
                super::lock(&self.tracked_base).insert(name.name.clone(), base_now);
            }
        }
        Ok(match outcome {
            Outcome::Unchanged => None,
            Outcome::Taken {
                size_bytes,
                omitted,
            } => Some(info(&snap, size_bytes, omitted)),
        })
    }

    /// The freezer holding the sandbox's processes: its isolated init's cgroups, or (not
    /// isolated) its own cgroup; `None` when nothing of it can be running (no init, no
    /// cgroup); an error when processes may run but no freezer can pause them.
    fn freezer(&self, name: &SandboxName, slot: &Slot) -> Result<Option<Freezer>, LocalError> {
        let no_freezer = |why: &str| LocalError::Freeze {
            sandbox: name.name.clone(),
            reason: format!(
                "{why}; `taskbox suspend` snapshots it by stopping it instead, and `taskbox \
                 doctor` says which cgroups this machine offers"
            ),
        };
        let init = super::lock(&slot.init).clone();
        // An init held but ended: its namespaces are gone, and every process with them.
        let ended_init = init.is_some();
        if let Some(init) = init.filter(|i| i.alive()) {
            return match init.cgroups().and_then(|c| c.freezer()) {
                Some((dir, true)) => Ok(Some(Freezer::V2(dir.to_path_buf()))),
                Some((dir, false)) => Ok(Some(Freezer::V1(dir.to_path_buf()))),
                None => Err(no_freezer(
                    "its cgroups have no freezer (no cgroup v2 with the limits, and no v1 \
                     `freezer` hierarchy mounted)",
                )),
            };
        }
        match cgroup::recorded(&self.sandbox_dir(name), &name.name) {
            Some(dir) if dir.join("cgroup.freeze").exists() => Ok(Some(Freezer::V2(dir))),
            Some(dir) if dir.exists() => Err(no_freezer(&format!(
                "its cgroup {} has no `cgroup.freeze` (Linux before 5.2)",
                dir.display()
            ))),
            // The cgroup is gone (the sweep removes it once empty): nothing of it runs.
            Some(_) => Ok(None),
            // No command ran in it in this process, or its namespaces ended: nothing runs.
            None if ended_init || slot.commands.load(std::sync::atomic::Ordering::SeqCst) == 0 => {
                Ok(None)
            }
            None => Err(no_freezer(
                "it has no cgroup (cgroup v2 is not available here)",
            )),
        }
    }
}

/// [`write_snapshot`], unless the packed manifest holds the same files as `same` says: then
/// nothing is written and `None` comes back.
#[allow(clippy::too_many_arguments)]
fn write_snapshot_unless(
    cas: &super::cas::Cas,
    snap: &SnapshotRef,
    workspace: &std::path::Path,
    walk: Walk<'_>,
    header: &ArchiveHeader,
    path: &std::path::Path,
    tmp: &std::path::Path,
    same: impl Fn(&super::cas::Manifest) -> bool,
) -> Result<Option<(u64, super::cas::PackedStats, super::cas::Manifest)>, LocalError> {
    write_snapshot(cas, snap, workspace, walk, header, path, tmp, Some(&same))
}

/// A tracker of `workspace` from `manifest` (written as its index first), or from the index
/// on disk when `manifest` is `None`; `None` (the next snapshot walks every file) when it
/// cannot start.
fn restart_tracker(
    workspace: &std::path::Path,
    index_path: &std::path::Path,
    manifest: Option<super::cas::Manifest>,
) -> Option<Tracker> {
    let index = match manifest {
        Some(m) => Index::write_kept(index_path, m).ok(),
        None => Index::read(index_path),
    }?;
    Tracker::start(workspace, index, Limits::default())
        .inspect_err(|e| {
            tracing::info!(error = %e, "the workspace's changes are not tracked after the \
                checkpoint; the next snapshot walks every file")
        })
        .ok()
}

fn info(snap: &SnapshotRef, size_bytes: u64, omitted: Vec<String>) -> SnapshotInfo {
    SnapshotInfo {
        id: snap.id().into(),
        size_bytes,
        expires_at: None,
        omitted,
        usage: None,
        // A live checkpoint ends no generation (see `SnapshotTaken::resources`).
        resources: None,
    }
}
