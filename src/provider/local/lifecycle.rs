//! A sandbox's life: create (empty or restored from a snapshot, assembled under `tmp/` and
//! renamed into its task's directory, parking the generation found there), the deadline check
//! every operation makes, extend, probe, stop, and the discard that kills its processes and
//! removes its files. Also the listing the reconciler uses.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::cas::{Limits, Tracker};
use super::cgroup;
use super::error::LocalError;
use super::foreign;
use super::fsutil::{remove_tree, sync_dir};
use super::inflight;
use super::kill::kill_leftovers;
use super::names::{check_owner, SandboxName, SnapshotRef};
use super::snapshot::restore;
use super::workspace::{read_meta_at, SandboxMeta, SandboxStatus, META_FORMAT};
use super::{run_blocking, LocalProvider, Slot};
use crate::clock::format_ms;
use crate::core::Millis;
use crate::ids::TaskId;
use crate::provider::{sandbox_name, ListedResource, SandboxInfo, SandboxSpec};

impl LocalProvider {
    /// The sandbox's meta if it exists, past its deadline or not (its files stay until it is
    /// stopped or snapshotted: see [`SandboxProvider::keeps_files_after_deadline`]).
    ///
    /// [`SandboxProvider::keeps_files_after_deadline`]: crate::provider::SandboxProvider::keeps_files_after_deadline
    pub(super) fn existing_meta(&self, name: &SandboxName) -> Result<SandboxMeta, LocalError> {
        self.read_meta(name)?.ok_or_else(|| {
            LocalError::gone(
                name,
                "it does not exist (stopped, snapshotted or never created)",
            )
        })
    }

    /// The sandbox's meta if it exists and has not passed its deadline. Past it, its processes
    /// are killed (nothing runs past a deadline) but its files stay, for a late checkpoint.
    /// The caller holds the slot's lock.
    pub(super) async fn live_meta(
        &self,
        name: &SandboxName,
        slot: &Slot,
    ) -> Result<SandboxMeta, LocalError> {
        Ok(self.live_located(name, slot).await?.1)
    }

    /// [`live_meta`](Self::live_meta) with the sandbox's directory, its meta read once.
    pub(super) async fn live_located(
        &self,
        name: &SandboxName,
        slot: &Slot,
    ) -> Result<(PathBuf, SandboxMeta), LocalError> {
        let (dir, meta) = self.locate(name)?.ok_or_else(|| {
            LocalError::gone(
                name,
                "it does not exist (stopped, snapshotted or never created)",
            )
        })?;
        // A server killed under a command left it running (an unisolated sandbox does not end
        // with its server): its processes die before anything else is done with the sandbox.
        let orphans = inflight::orphaned(&dir.join("run"));
        if !orphans.is_empty() {
            tracing::info!(sandbox = %name.name, marks = orphans.len(),
                "a command's server died under it; its sandbox's processes are killed");
            self.stop_processes(name, slot).await?;
            for mark in orphans {
                fs::remove_file(&mark)
                    .map_err(LocalError::io("remove the mark of a command", &mark))?;
            }
        }
        let now = self.clock.now_ms();
        if now >= meta.deadline {
            self.stop_processes(name, slot).await?;
            return Err(LocalError::gone(
                name,
                format!(
                    "it passed its deadline at {} (its files are kept until it is snapshotted \
                     or stopped)",
                    format_ms(meta.deadline)
                ),
            ));
        }
        Ok((dir, meta))
    }

    // -- discarding ----------------------------------------------------------------------------

    /// Kills the sandbox's running commands and leftover processes. The caller holds the lock.
    /// Returns whether they are known to be gone with every file they had open released: its
    /// cgroup emptied and removed, or (no cgroup recorded) this process never ran a command in
    /// it — and no leftover found either way. Only then can a snapshot trust tracked changes
    /// (a write through a mapping is reported when its file is released).
    pub(super) async fn stop_processes(
        &self,
        name: &SandboxName,
        slot: &Slot,
    ) -> Result<bool, LocalError> {
        slot.stopped.send_modify(|n| *n += 1);
        let sandbox = name.name.clone();
        let cgroup = cgroup::recorded(&self.sandbox_dir(name), &name.name);
        let no_commands = slot.commands.load(Ordering::SeqCst) == 0;
        // Its namespaces end first: once the init is reaped, nothing of them runs.
        slot.kill_init().await;
        let ended = super::run_blocking_ref(|| Ok(slot.end_namespaces()))?;
        run_blocking("stop the sandbox's processes", move || {
            let emptied = match &cgroup {
                Some(cg) => cgroup::kill_all(cg),
                None => no_commands || ended,
            };
            let leftovers = kill_leftovers(&sandbox);
            Ok(emptied && leftovers == 0)
        })
        .await
    }

    /// Drops the sandbox's change tracker, if this process has one (its thread joined, its
    /// inotify descriptor closed).
    pub(super) fn drop_tracker(&self, name: &SandboxName) {
        let tracker = super::lock(&self.trackers).remove(&name.name);
        super::lock(&self.tracked_base).remove(&name.name);
        drop(tracker);
    }

    /// Stops the sandbox and removes its files. Returns whether it existed. The caller holds the
    /// slot's lock.
    pub(super) async fn discard(
        &self,
        name: &SandboxName,
        slot: &Slot,
    ) -> Result<bool, LocalError> {
        slot.stopped.send_modify(|n| *n += 1);
        self.drop_tracker(name);
        slot.kill_init().await;
        super::run_blocking_ref(|| Ok(slot.end_namespaces()))?;
        let dir = self.sandbox_dir(name);
        let cgroup = cgroup::recorded(&dir, &name.name);
        let (trash, in_flight) = self.temp_path(
            &self.root.join("trash"),
            "trash.",
            &format!(".{}", name.name),
        );
        // Out of its place first: from this instant the sandbox is gone, even if removing its
        // files is slow or a crash interrupts it (the sweep finishes the job).
        let existed = match fs::rename(&dir, &trash) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(LocalError::io("move away", &dir)(e)),
        };
        // Processes are matched by the sandbox name in their environment.
        let sandbox = name.name.clone();
        run_blocking("remove the sandbox", move || {
            if let Some(cg) = &cgroup {
                cgroup::kill_all(cg);
            }
            kill_leftovers(&sandbox);
            if existed {
                // Its files go in the background: the sandbox is gone already (renamed out of
                // its place, its processes killed), and unlinking a big workspace must not be
                // what a snapshot or a stop waits for. A crash leaves the tree under `trash/`
                // for the sweep (it is named after this process).
                let remove = move || {
                    let _in_flight = in_flight;
                    if let Err(e) = remove_tree(&trash) {
                        tracing::warn!(sandbox = %sandbox, path = %trash.display(), error = %e,
                            "could not remove a discarded sandbox's files; the sweep will retry");
                    }
                };
                let shared = std::sync::Arc::new(std::sync::Mutex::new(Some(remove)));
                let in_thread = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("taskbox-trash".into())
                    .spawn(move || {
                        if let Some(remove) = super::lock(&in_thread).take() {
                            remove();
                        }
                    });
                if spawned.is_err() {
                    if let Some(remove) = super::lock(&shared).take() {
                        remove();
                    }
                }
            }
            Ok(())
        })
        .await?;
        Ok(existed)
    }

    // -- operations ----------------------------------------------------------------------------

    pub(super) async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, LocalError> {
        let task = TaskId::new(&spec.task_id)?;
        let expected = sandbox_name(&spec.installation_id, task.as_str(), spec.generation);
        if spec.name != expected {
            return Err(LocalError::SpecName {
                name: spec.name.escape_debug().to_string(),
                task_id: task.to_string(),
                generation: spec.generation,
                expected,
            });
        }
        let name = SandboxName::parse(&spec.name)?;
        let source = spec
            .source_snapshot
            .as_deref()
            .map(SnapshotRef::parse)
            .transpose()?;
        // A task's first sandbox starts from the archive `taskbox doctor --adopt-archives`
        // adopted for it, if any.
        let adopted = match source {
            None => foreign::adopted(&self.root, &task),
            Some(_) => None,
        };
        let source = source.or(adopted.clone());
        let slot = self.slot(&name);
        let _guard = slot.lock.lock().await;

        if let Some(meta) = self.read_meta(&name)? {
            check_owner(&name, "task", &meta.task_id, task.as_str())?;
            check_owner(
                &name,
                "installation",
                &meta.installation_id,
                &spec.installation_id,
            )?;
            if self.clock.now_ms() < meta.deadline {
                return Ok(SandboxInfo {
                    id: name.name.as_str().into(),
                    name: name.name.clone(),
                    deadline: meta.deadline,
                });
            }
            self.discard(&name, &slot).await?;
        }

        // Held until the staging directory is renamed or removed, so a sweep leaves it alone.
        let (staging, _in_flight) = self.temp_path(
            &self.root.join("tmp"),
            "create.",
            &format!(".{}", name.name),
        );
        let built = self.assemble(&name, spec, source.as_ref(), &staging).await;
        let meta = match built {
            Ok(meta) => meta,
            Err(e) => {
                let staging = staging.clone();
                let _ = run_blocking("clean up a failed create", move || {
                    let _ = remove_tree(&staging);
                    Ok(())
                })
                .await;
                return Err(e);
            }
        };
        if let Some(snap) = adopted {
            tracing::info!(sandbox = %name.name, snapshot = %snap.id(),
                "the task's first sandbox starts from an adopted archive");
            foreign::adoption_done(&self.root, &task);
        }
        tracing::debug!(sandbox = %name.name, deadline = meta.deadline, "local sandbox created");
        Ok(SandboxInfo {
            id: name.name.as_str().into(),
            name: name.name.clone(),
            deadline: meta.deadline,
        })
    }

    /// Builds the sandbox directory at `staging` and renames it into place.
    async fn assemble(
        &self,
        name: &SandboxName,
        spec: &SandboxSpec,
        source: Option<&SnapshotRef>,
        staging: &Path,
    ) -> Result<SandboxMeta, LocalError> {
        fs::create_dir(staging).map_err(LocalError::io("create directory", staging))?;
        let run_dir = staging.join("run");
        fs::create_dir(&run_dir).map_err(LocalError::io("create directory", &run_dir))?;
        let workspace = staging.join("workspace");
        let mut restored: Option<Tracker> = None;
        // The working directory the snapshot was taken in carries over, as a VM's would.
        let cwd = match source {
            Some(snap) => {
                let archive = self.snapshot_path(snap);
                let snap = snap.clone();
                let workspace = workspace.clone();
                let cas = self.cas.clone();
                let (header, tracker) = run_blocking("restore a snapshot", move || {
                    let (header, index) = restore(&cas, &snap, &archive, &workspace)?;
                    // Watching from before anything runs in it (see `cas::Tracker`).
                    let tracker = index.and_then(|index| {
                        match Tracker::start(&workspace, index, Limits::default()) {
                            Ok(tracker) => Some(tracker),
                            Err(e) => {
                                tracing::info!(snapshot = %snap.id(), error = %e,
                                    "the workspace's changes are not tracked; its next \
                                     snapshot walks every file");
                                None
                            }
                        }
                    });
                    Ok((header, tracker))
                })
                .await?;
                restored = tracker;
                header.cwd.unwrap_or_default()
            }
            None => {
                fs::create_dir(&workspace)
                    .map_err(LocalError::io("create directory", &workspace))?;
                String::new()
            }
        };
        let now = self.clock.now_ms();
        let meta = SandboxMeta {
            format: META_FORMAT,
            name: name.name.clone(),
            task_id: name.task.to_string(),
            installation_id: spec.installation_id.clone(),
            generation: name.generation,
            instance: format!("{}.{now}", self.unique()),
            created_at: now,
            deadline: now.saturating_add(spec.timeout_ms),
            source_snapshot: source.map(SnapshotRef::id),
            cwd,
            status: SandboxStatus::Running,
        };
        self.write_meta(staging, &meta)?;
        self.vacate_task_dir(name).await?;
        let dest = self.task_dir(&name.task);
        if let Err(e) = fs::rename(staging, &dest) {
            // Another process sharing this root created it first: use theirs, as a repeated
            // create would.
            if let Some(theirs) = self.read_meta(name).ok().flatten() {
                if theirs.task_id == meta.task_id
                    && theirs.installation_id == meta.installation_id
                    && self.clock.now_ms() < theirs.deadline
                {
                    let _ = remove_tree(staging);
                    return Ok(theirs);
                }
            }
            return Err(LocalError::io("move into place", &dest)(e));
        }
        sync_dir(&self.root.join("tasks"))?;
        if let Some(tracker) = restored {
            super::lock(&self.trackers).insert(name.name.clone(), tracker);
            // What the tracked changes are relative to: a checkpoint that finds none needs
            // no snapshot when this is still the task's latest.
            if let Some(src) = source {
                super::lock(&self.tracked_base).insert(name.name.clone(), src.id());
            }
        }
        Ok(meta)
    }

    /// Makes `tasks/<task>/` free for `name`: another generation holding it is parked under
    /// `sandboxes/` with its files (its processes too while it is within its deadline; past it
    /// they are stopped).
    /// The caller holds the task's lock.
    async fn vacate_task_dir(&self, name: &SandboxName) -> Result<(), LocalError> {
        let task_dir = self.task_dir(&name.task);
        let holder = match self.holder(&name.task)? {
            Some(holder) => holder,
            None => {
                if fs::symlink_metadata(&task_dir).is_ok() {
                    // Not a sandbox (no meta.json): nothing of ours made it; keep it aside
                    // (never swept) rather than delete what we cannot name.
                    let lost = self.root.join("lost+found");
                    fs::create_dir_all(&lost).map_err(LocalError::io("create directory", &lost))?;
                    let aside = lost.join(format!("{}.{}", name.task, self.unique()));
                    fs::rename(&task_dir, &aside)
                        .map_err(LocalError::io("move away", &task_dir))?;
                    tracing::warn!(path = %aside.display(),
                        "a task directory without meta.json was moved aside");
                }
                return Ok(());
            }
        };
        let held_by = SandboxName::parse(&holder.name)?;
        if held_by.task != name.task {
            return Err(LocalError::Ownership {
                sandbox: holder.name.clone(),
                what: "task",
                owner: held_by.task.to_string(),
                expected: name.task.to_string(),
            });
        }
        if self.clock.now_ms() >= holder.deadline {
            // Nothing runs past a deadline, but its files stay until it is snapshotted or
            // stopped (a late checkpoint may still want them): parked like a live one, for the
            // reconciler to stop once no task holds it.
            let slot = self.slot(&held_by);
            self.stop_processes(&held_by, &slot).await?;
        }
        let parked = self.parked_dir(&held_by);
        fs::rename(&task_dir, &parked).map_err(LocalError::io("park", &parked))?;
        sync_dir(&self.root.join("sandboxes"))?;
        tracing::info!(sandbox = %held_by.name, for_sandbox = %name.name,
            "a live sandbox was parked out of its task's directory for a newer generation");
        Ok(())
    }

    pub(super) async fn stop(&self, sandbox_id: &str) -> Result<(), LocalError> {
        let name = SandboxName::parse(sandbox_id)?;
        let slot = self.slot(&name);
        let _guard = slot.lock.lock().await;
        self.discard(&name, &slot).await?;
        Ok(())
    }

    pub(super) async fn extend(
        &self,
        sandbox_id: &str,
        duration_ms: u64,
    ) -> Result<Millis, LocalError> {
        let name = SandboxName::parse(sandbox_id)?;
        let slot = self.slot(&name);
        let _guard = slot.lock.lock().await;
        let mut meta = self.live_meta(&name, &slot).await?;
        meta.deadline = meta.deadline.saturating_add(duration_ms);
        self.write_meta(&self.sandbox_dir(&name), &meta)?;
        slot.deadline.store(meta.deadline, Ordering::SeqCst);
        Ok(meta.deadline)
    }

    pub(super) async fn probe(&self, sandbox_id: &str) -> Result<Option<Millis>, LocalError> {
        let name = SandboxName::parse(sandbox_id)?;
        let slot = self.slot(&name);
        let _guard = slot.lock.lock().await;
        match self.live_meta(&name, &slot).await {
            Ok(meta) => Ok(Some(meta.deadline)),
            Err(LocalError::SandboxGone { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) fn sandboxes_of(
        &self,
        installation_id: &str,
    ) -> Result<Vec<ListedResource>, LocalError> {
        let mut found = Vec::new();
        let mut names = Vec::new();
        // Holders of task directories, then parked sandboxes.
        let tasks = self.root.join("tasks");
        for entry in fs::read_dir(&tasks).map_err(LocalError::io("list", &tasks))? {
            let entry = entry.map_err(LocalError::io("list", &tasks))?;
            match read_meta_at(&entry.path().join("meta.json")) {
                Ok(Some(meta)) => match SandboxName::parse(&meta.name) {
                    Ok(name) => names.push(name),
                    Err(e) => tracing::warn!(path = %entry.path().display(), error = %e,
                        "a task directory names no valid sandbox; ignored"),
                },
                Ok(None) => {}
                Err(e) => tracing::warn!(path = %entry.path().display(), error = %e,
                    "unreadable sandbox meta; not listed"),
            }
        }
        let dir = self.root.join("sandboxes");
        for entry in fs::read_dir(&dir).map_err(LocalError::io("list", &dir))? {
            let entry = entry.map_err(LocalError::io("list", &dir))?;
            let Some(name) = entry
                .file_name()
                .to_str()
                .and_then(|n| SandboxName::parse(n).ok())
            else {
                tracing::warn!(path = %entry.path().display(), "not a sandbox directory; ignored");
                continue;
            };
            names.push(name);
        }
        for name in names {
            match self.read_meta(&name) {
                Ok(Some(meta)) if meta.installation_id == installation_id => {
                    // Past its deadline a sandbox still holds its files until it is stopped, so
                    // it is listed live: a sandbox dir no task holds is the reconciler's to
                    // remove whatever its deadline.
                    found.push(ListedResource {
                        id: name.name.as_str().into(),
                        task_id: Some(meta.task_id),
                        live: true,
                    })
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(sandbox = %name.name, error = %e,
                    "unreadable sandbox meta; not listed"),
            }
        }
        found.sort_by(|a, b| a.id.cmp(&b.id));
        found.dedup_by(|a, b| a.id == b.id);
        Ok(found)
    }
}
