//! A sandbox's life: create (empty or restored from a snapshot, assembled under `tmp/` and
//! renamed into place), the deadline check every operation makes, extend, probe, stop, and the
//! discard that kills its processes and removes its files. Also the listing the reconciler uses.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;

use super::error::LocalError;
use super::fsutil::{remove_tree, sync_dir};
use super::kill::kill_leftovers;
use super::names::{SandboxName, SnapshotRef};
use super::snapshot::restore;
use super::workspace::{SandboxMeta, SandboxStatus, META_FORMAT};
use super::{run_blocking, LocalProvider, Slot};
use crate::clock::format_ms;
use crate::core::Millis;
use crate::ids::TaskId;
use crate::provider::{sandbox_name, ListedResource, SandboxInfo, SandboxSpec};

impl LocalProvider {
    /// The sandbox's meta if it exists and has not expired; an expired one is discarded.
    /// The caller holds the slot's lock.
    pub(super) async fn live_meta(
        &self,
        name: &SandboxName,
        slot: &Slot,
    ) -> Result<SandboxMeta, LocalError> {
        let meta = self.read_meta(name)?.ok_or_else(|| {
            LocalError::gone(
                name,
                "it does not exist (stopped, snapshotted or never created)",
            )
        })?;
        let now = self.clock.now_ms();
        if now >= meta.deadline {
            self.discard(name, slot).await?;
            return Err(LocalError::gone(
                name,
                format!("it expired at {}", format_ms(meta.deadline)),
            ));
        }
        Ok(meta)
    }

    // -- discarding ----------------------------------------------------------------------------

    /// Kills the sandbox's running commands and leftover processes. The caller holds the lock.
    pub(super) async fn stop_processes(
        &self,
        name: &SandboxName,
        slot: &Slot,
    ) -> Result<(), LocalError> {
        slot.stopped.send_modify(|n| *n += 1);
        let workspace = self.workspace_dir(name);
        run_blocking("stop the sandbox's processes", move || {
            kill_leftovers(&workspace);
            Ok(())
        })
        .await
    }

    /// Stops the sandbox and removes its files. Returns whether it existed. The caller holds the
    /// slot's lock.
    pub(super) async fn discard(
        &self,
        name: &SandboxName,
        slot: &Slot,
    ) -> Result<bool, LocalError> {
        slot.stopped.send_modify(|n| *n += 1);
        let dir = self.sandbox_dir(name);
        let (trash, in_flight) =
            self.temp_path(&self.root.join("tmp"), "trash.", &format!(".{}", name.name));
        // Out of `sandboxes/` first: from this instant the sandbox is gone, even if removing its
        // files is slow or a crash interrupts it (the sweep finishes the job).
        let existed = match fs::rename(&dir, &trash) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(LocalError::io("move away", &dir)(e)),
        };
        // Processes are matched by the workspace path they were started with (their
        // environment), which is the path before the rename.
        let workspace = self.workspace_dir(name);
        let sandbox = name.name.clone();
        run_blocking("remove the sandbox", move || {
            let _in_flight = in_flight;
            kill_leftovers(&workspace);
            if existed {
                if let Err(e) = remove_tree(&trash) {
                    tracing::warn!(sandbox = %sandbox, path = %trash.display(), error = %e,
                        "could not remove a discarded sandbox's files; the sweep will retry");
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
        match source {
            Some(snap) => {
                let archive = self.snapshot_path(snap);
                let snap = snap.clone();
                let workspace = workspace.clone();
                run_blocking("restore a snapshot", move || {
                    restore(&snap, &archive, &workspace)
                })
                .await?;
            }
            None => {
                fs::create_dir(&workspace)
                    .map_err(LocalError::io("create directory", &workspace))?;
            }
        }
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
            cwd: String::new(),
            status: SandboxStatus::Running,
        };
        self.write_meta(staging, &meta)?;
        let dest = self.sandbox_dir(name);
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
        sync_dir(&self.root.join("sandboxes"))?;
        Ok(meta)
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
        let dir = self.root.join("sandboxes");
        let now = self.clock.now_ms();
        let mut found = Vec::new();
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
            match self.read_meta(&name) {
                Ok(Some(meta)) if meta.installation_id == installation_id => {
                    found.push(ListedResource {
                        id: name.name.as_str().into(),
                        task_id: Some(meta.task_id),
                        live: now < meta.deadline,
                    })
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(sandbox = %name.name, error = %e,
                    "unreadable sandbox meta; not listed"),
            }
        }
        found.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(found)
    }
}

pub(super) fn check_owner(
    name: &SandboxName,
    what: &'static str,
    owner: &str,
    expected: &str,
) -> Result<(), LocalError> {
    if owner == expected {
        return Ok(());
    }
    Err(LocalError::Ownership {
        sandbox: name.name.clone(),
        what,
        owner: owner.to_string(),
        expected: expected.to_string(),
    })
}
