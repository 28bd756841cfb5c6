//! A checkpoint of a live local sandbox: pause its processes (the cgroup freezer,
//! [`freeze`](super::freeze)), snapshot the workspace as a snapshot does (the content store,
//! walking only what the change tracker saw change), and resume them — the thaw is a guard's
//! drop, so a failure never leaves them paused. The sandbox is not touched otherwise: same
//! processes, same deadline.
//!
//! The pause holds only what consistency needs: the tracker's changes handed over
//! ([`Tracker::take`]), the changed entries looked at and their contents read into the content
//! store's packs (the manifest naming them is then fixed), the tracker re-armed for the entries
//! that may be new ([`Tracker::rearm`]; the others keep their watches, so a write after the
//! thaw is never missed) and the index's time taken ([`Index::stamp`]). Making those contents
//! durable ([`Staged::commit`](super::cas::Staged::commit)), writing the manifest's archive
//! (temporary file, fsync, rename, in that order as before) and the index happen after the
//! thaw, still under the content store's lock; whatever the processes write by then is the
//! next checkpoint's. Without tracked changes (none, or untrusted) every entry is looked at and
//! tracking starts anew, all of it paused, as before.
//!
//! A checkpoint that finds nothing changed since `previous` (the task's latest snapshot)
//! writes nothing and answers `None`: the tracker, paused with the processes, says no event
//! came since its index was the content of `previous`; otherwise the new manifest is compared
//! with `previous`'s.

use std::fs;
use std::io::BufReader;
use std::path::Path;
use std::time::Duration;

use super::archive::{self, ArchiveHeader};
use super::cas::{Cas, CasError, Index, Limits, Manifest, PackedStats, Tracked, Tracker};
use super::error::LocalError;
use super::freeze::{Freezer, Frozen};
use super::names::{check_owner, SandboxName, SnapshotRef};
use super::snapshot::{kept_bytes, random_nonce, read_manifest, write_manifest, INDEX_FILE};
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
        // The tracker's index holds `previous`'s files.
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
            // Whether `manifest` holds `previous`'s files. Read from its archive, unless the
            // tracker's index (handed over as `tracked`) holds them: then it is compared with
            // that, in memory.
            let same_as_previous = |manifest: &Manifest, tracked: Option<&Tracked>| {
                if let Some(tracked) = tracked.filter(|_| unchanged_base) {
                    return manifest.same_content(&tracked.index.manifest);
                }
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
            let at = Place {
                cas: &cas,
                snap: &snap2,
                workspace: &workspace,
                index: &index,
                header: &header,
                path: &path2,
                tmp: &tmp,
            };
            let mut tracker = tracker;
            match tracker.as_mut().map(Tracker::take) {
                Some(Ok(tracked)) => {
                    let tracker = tracker.expect("it handed its changes over");
                    return at.tracked(frozen, tracker, tracked, same_as_previous);
                }
                Some(Err(why)) => {
                    tracing::info!(snapshot = %snap2.id(), reason = %why,
                        "the checkpoint walks every file");
                }
                None => {}
            }
            drop(tracker);
            at.walked(frozen, same_as_previous)
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

/// Where a checkpoint's snapshot comes from and goes: the blocking part's inputs.
struct Place<'a> {
    cas: &'a Cas,
    snap: &'a SnapshotRef,
    workspace: &'a Path,
    /// The workspace's index file.
    index: &'a Path,
    header: &'a ArchiveHeader,
    /// The archive's path, and the temporary one it is written at first.
    path: &'a Path,
    tmp: &'a Path,
}

/// What the blocking part answers: the outcome, and the tracker to keep (`None`: the next
/// snapshot walks every file).
type Answer = (Outcome, Option<Tracker>);

impl Place<'_> {
    /// A failure of the content store, as this checkpoint's snapshot's.
    fn content(&self, source: CasError) -> LocalError {
        LocalError::Content {
            snapshot: self.snap.id(),
            path: self.path.to_path_buf(),
            source: Box::new(source),
        }
    }

    /// A checkpoint with the tracker's changes (handed over by [`Tracker::take`] while the
    /// processes are paused). Paused: the changed entries are looked at and their contents
    /// read into the store's packs (not fsynced yet), the tracker re-armed for the entries that
    /// may be new, and the index's time stamped. Then they resume, and the manifest — fixed by
    /// then: what it names is read — has its contents committed (fsynced, listed), is compared
    /// with `previous`'s, written as the archive and kept as the tracker's new index. Whatever
    /// the processes write after the thaw is the next checkpoint's: the tracker watched on
    /// through it.
    fn tracked(
        &self,
        frozen: Option<Frozen>,
        mut tracker: Tracker,
        tracked: Tracked,
        same_as_previous: impl Fn(&Manifest, Option<&Tracked>) -> bool,
    ) -> Result<Answer, LocalError> {
        let content = |source| self.content(source);
        // Held until the manifest and the index are in place: gc cannot sweep what they name.
        let _lock = self.cas.lock(false).map_err(content)?;
        let (manifest, stats, staged) = self
            .cas
            .pack_tracked_staged(self.workspace, &tracked)
            .map_err(content)?;
        let armed = match &stats.fell_back {
            // A walk the changes could not guide: they do not say which entries are new.
            Some(why) => Err(why.clone()),
            None => tracker
                .rearm(self.workspace, &manifest, &tracked.changes)
                .map_err(|e| e.to_string())
                .and_then(|()| Index::stamp(self.index).map_err(|e| e.to_string())),
        };
        let (tracker, stamp) = match armed {
            Ok(stamp) => (Some(tracker), Some(stamp)),
            Err(why) => {
                tracing::info!(snapshot = %self.snap.id(), reason = %why,
                    "the checkpoint starts watching the workspace anew");
                drop(tracker);
                (
                    restart_tracker(self.workspace, self.index, manifest.clone()),
                    None,
                )
            }
        };
        let paused = frozen.as_ref().map(|f| f.took);
        drop(frozen);
        // The contents read are the manifest's whatever the processes write now: made durable
        // before the manifest naming them, as a snapshot's are.
        staged.commit().map_err(content)?;
        let mut tracker = tracker;
        // Encoded once: the archive's body and the index's.
        let body = manifest.encode();
        let keep_index = |tracker: &mut Option<Tracker>, manifest: Manifest| {
            let (Some(t), Some(stamp)) = (tracker.as_mut(), stamp) else {
                return;
            };
            match stamp.write(manifest, &body) {
                Ok(index) => t.set_index(index),
                Err(e) => {
                    tracing::info!(error = %e, "the workspace's changes are not tracked after \
                        the checkpoint; the next snapshot walks every file");
                    *tracker = None;
                }
            }
        };
        if same_as_previous(&manifest, Some(&tracked)) {
            // The files as `previous` holds them: no snapshot; track from them.
            keep_index(&mut tracker, manifest);
            return Ok((Outcome::Unchanged, tracker));
        }
        let size_bytes = write_manifest(
            self.snap,
            &manifest,
            &body,
            self.header,
            self.path,
            self.tmp,
        )?;
        keep_index(&mut tracker, manifest);
        self.log(size_bytes, &stats, paused);
        Ok((taken(size_bytes, stats), tracker))
    }

    /// A checkpoint without tracked changes: every entry looked at (files matching the index
    /// on disk not read) and tracking started anew from the manifest, while the processes are
    /// paused; the archive written after they resume.
    fn walked(
        &self,
        frozen: Option<Frozen>,
        same_as_previous: impl Fn(&Manifest, Option<&Tracked>) -> bool,
    ) -> Result<Answer, LocalError> {
        let content = |source| self.content(source);
        // Held until the manifest is in place: gc cannot sweep what it names.
        let _lock = self.cas.lock(false).map_err(content)?;
        let (manifest, stats) = self
            .cas
            .pack(self.workspace, Index::read(self.index).as_ref())
            .map_err(content)?;
        // Track from the checkpoint on, before anything can write again.
        let tracker = restart_tracker(self.workspace, self.index, manifest.clone());
        let paused = frozen.as_ref().map(|f| f.took);
        drop(frozen);
        if same_as_previous(&manifest, None) {
            // The files as `previous` holds them: no snapshot.
            return Ok((Outcome::Unchanged, tracker));
        }
        let size_bytes = write_manifest(
            self.snap,
            &manifest,
            &manifest.encode(),
            self.header,
            self.path,
            self.tmp,
        )?;
        self.log(size_bytes, &stats, paused);
        Ok((taken(size_bytes, stats), tracker))
    }

    fn log(&self, size_bytes: u64, stats: &PackedStats, freezing: Option<Duration>) {
        for o in &stats.omitted {
            tracing::warn!(snapshot = %self.snap.id(), path = %o.path, reason = %o.reason,
                "left out of the checkpoint");
        }
        tracing::debug!(snapshot = %self.snap.id(), size_bytes, ?freezing,
            tracked = stats.tracked, files_read = stats.files_read,
            objects_written = stats.objects_written, "local checkpoint taken");
    }
}

fn taken(size_bytes: u64, stats: PackedStats) -> Outcome {
    Outcome::Taken {
        size_bytes,
        omitted: stats
            .omitted
            .into_iter()
            .map(|o| format!("{}: {}", o.path, o.reason))
            .collect(),
    }
}

/// A tracker of `workspace` from `manifest` (written as its index first); `None` (the next
/// snapshot walks every file) when it cannot start.
fn restart_tracker(workspace: &Path, index_path: &Path, manifest: Manifest) -> Option<Tracker> {
    let index = Index::write_kept(index_path, manifest).ok()?;
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
