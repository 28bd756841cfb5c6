//! Snapshots on disk: where a task's archives live (`snapshots/<task>/<seq>.tbx`), taking one
//! (stop the processes, pack the workspace, write it durably, discard the sandbox), restoring
//! one into a new workspace, deleting and listing them. The archive format itself is
//! [`archive`](super::archive).

use std::fs;
use std::io::{self, BufReader};
use std::path::{Path, PathBuf};

use super::archive::{self, ArchiveHeader, PackStats};
use super::error::LocalError;
use super::fsutil::{ignore_not_found, sync_dir};
use super::lifecycle::check_owner;
use super::names::{parse_canonical_u64, SandboxName, SnapshotRef};
use super::workspace::SandboxStatus;
use super::{run_blocking, LocalProvider};
use crate::ids::TaskId;
use crate::provider::{ListedResource, SnapshotInfo};

/// File name suffix of snapshot archives.
pub(super) const ARCHIVE_EXT: &str = "tbx";

impl LocalProvider {
    pub(super) fn snapshot_path(&self, snap: &SnapshotRef) -> PathBuf {
        self.root
            .join("snapshots")
            .join(snap.task.as_str())
            .join(format!("{}.{ARCHIVE_EXT}", snap.seq))
    }

    pub(super) async fn snapshot_sandbox(
        &self,
        task_id: &str,
        sandbox_id: &str,
        seq: u64,
    ) -> Result<SnapshotInfo, LocalError> {
        let task = TaskId::new(task_id)?;
        let name = SandboxName::parse(sandbox_id)?;
        let snap = SnapshotRef { task, seq };
        let path = self.snapshot_path(&snap);
        let slot = self.slot(&name);
        let _guard = slot.lock.lock().await;

        if let Some(size_bytes) = existing_archive(&snap, &path)? {
            // Taken before (a repeated call): make sure the sandbox is stopped, as it would be.
            self.discard(&name, &slot).await?;
            return Ok(SnapshotInfo {
                id: snap.id().into(),
                size_bytes,
                expires_at: None,
            });
        }
        let mut meta = self.live_meta(&name, &slot).await?;
        check_owner(&name, "task", &meta.task_id, snap.task.as_str())?;
        // A VM is paused for its snapshot: stop every process so no file changes under the walk.
        self.stop_processes(&name, &slot).await?;
        let sandbox_dir = self.sandbox_dir(&name);
        meta.status = SandboxStatus::Snapshotting;
        self.write_meta(&sandbox_dir, &meta)?;

        let header = ArchiveHeader {
            task_id: snap.task.to_string(),
            seq,
            installation_id: meta.installation_id.clone(),
            created_at: self.clock.now_ms(),
            source_sandbox: name.name.clone(),
        };
        let dir = path
            .parent()
            .expect("an archive path has a parent")
            .to_path_buf();
        let (tmp, in_flight) = self.temp_path(&dir, &format!("{seq}.{ARCHIVE_EXT}."), ".tmp");
        let workspace = self.workspace_dir(&name);
        let (snap2, path2) = (snap.clone(), path.clone());
        let written = run_blocking("write a snapshot archive", move || {
            let _in_flight = in_flight;
            write_archive(&snap2, &workspace, &header, &path2, &tmp)
        })
        .await;
        let (size_bytes, stats) = match written {
            Ok(done) => done,
            Err(e) => {
                meta.status = SandboxStatus::Running;
                let _ = self.write_meta(&sandbox_dir, &meta);
                return Err(e);
            }
        };
        for omitted in &stats.omitted {
            tracing::warn!(snapshot = %snap.id(), path = %omitted.path, reason = %omitted.reason,
                "left out of the snapshot");
        }
        self.discard(&name, &slot).await?;
        tracing::debug!(snapshot = %snap.id(), size_bytes, entries = stats.entries,
            "local snapshot taken");
        Ok(SnapshotInfo {
            id: snap.id().into(),
            size_bytes,
            expires_at: None,
        })
    }

    pub(super) async fn delete(&self, snapshot_id: &str) -> Result<(), LocalError> {
        let snap = SnapshotRef::parse(snapshot_id)?;
        let path = self.snapshot_path(&snap);
        fs::remove_file(&path)
            .or_else(ignore_not_found)
            .map_err(LocalError::io("delete", &path))?;
        if let Some(dir) = path.parent() {
            // Drop the task's directory once its last archive is gone; a concurrent writer
            // re-creates it (see `write_archive`).
            let _ = fs::remove_dir(dir);
        }
        Ok(())
    }

    pub(super) fn snapshots_of(
        &self,
        installation_id: &str,
    ) -> Result<Vec<ListedResource>, LocalError> {
        let dir = self.root.join("snapshots");
        let mut found = Vec::new();
        for task_dir in fs::read_dir(&dir).map_err(LocalError::io("list", &dir))? {
            let task_dir = task_dir.map_err(LocalError::io("list", &dir))?;
            let Some(task) = task_dir
                .file_name()
                .to_str()
                .and_then(|n| TaskId::new(n).ok())
            else {
                continue;
            };
            let path = task_dir.path();
            let entries = match fs::read_dir(&path) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(LocalError::io("list", &path)(e)),
            };
            for file in entries {
                let file = file.map_err(LocalError::io("list", &path))?;
                let Some(seq) = file.file_name().to_str().and_then(|n| {
                    n.strip_suffix(&format!(".{ARCHIVE_EXT}"))
                        .and_then(parse_canonical_u64)
                }) else {
                    continue; // temporaries and strangers
                };
                let snap = SnapshotRef {
                    task: task.clone(),
                    seq,
                };
                let header = fs::File::open(file.path())
                    .map_err(|e| e.to_string())
                    .and_then(|f| {
                        archive::read_prefix(&mut BufReader::new(f)).map_err(|e| e.to_string())
                    });
                match header {
                    Ok(header) if header.installation_id == installation_id => {
                        found.push(ListedResource {
                            id: snap.id(),
                            task_id: Some(header.task_id),
                            live: true,
                        })
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(snapshot = %snap.id(), error = %e,
                        "unreadable snapshot archive; not listed"),
                }
            }
        }
        found.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(found)
    }
}

/// The size of the complete archive of `snap` if one exists (checking its header names it).
fn existing_archive(snap: &SnapshotRef, path: &Path) -> Result<Option<u64>, LocalError> {
    let file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LocalError::io("open", path)(e)),
    };
    let size = file
        .metadata()
        .map_err(LocalError::io("inspect", path))?
        .len();
    let header =
        archive::read_prefix(&mut BufReader::new(file)).map_err(|source| LocalError::Archive {
            snapshot: snap.id(),
            path: path.to_path_buf(),
            source,
        })?;
    check_header(snap, path, &header)?;
    Ok(Some(size))
}

fn check_header(snap: &SnapshotRef, path: &Path, header: &ArchiveHeader) -> Result<(), LocalError> {
    if header.task_id != snap.task.as_str() || header.seq != snap.seq {
        return Err(LocalError::ArchiveMismatch {
            snapshot: snap.id(),
            path: path.to_path_buf(),
            found_task: header.task_id.escape_debug().to_string(),
            found_seq: header.seq,
        });
    }
    Ok(())
}

/// Writes the archive to `tmp`, fsyncs it, renames it to `path` and fsyncs the directory.
/// Returns its size.
fn write_archive(
    snap: &SnapshotRef,
    workspace: &Path,
    header: &ArchiveHeader,
    path: &Path,
    tmp: &Path,
) -> Result<(u64, PackStats), LocalError> {
    let dir = path.parent().expect("an archive path has a parent");
    let create = || {
        fs::create_dir_all(dir)?;
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(tmp)
    };
    // A concurrent delete may remove the task's (empty) directory between the two calls.
    let file = create()
        .or_else(|_| create())
        .map_err(LocalError::io("create", tmp))?;
    let result = (|| {
        let (file, stats) =
            archive::pack(workspace, header, file).map_err(|source| LocalError::Archive {
                snapshot: snap.id(),
                path: path.to_path_buf(),
                source,
            })?;
        file.sync_all().map_err(LocalError::io("fsync", tmp))?;
        let size = file
            .metadata()
            .map_err(LocalError::io("inspect", tmp))?
            .len();
        drop(file);
        fs::rename(tmp, path).map_err(LocalError::io("move into place", path))?;
        sync_dir(dir)?;
        Ok((size, stats))
    })();
    if result.is_err() {
        let _ = fs::remove_file(tmp);
    }
    result
}

/// Unpacks the archive of `snap` into `workspace` (which must not exist yet).
pub(super) fn restore(snap: &SnapshotRef, path: &Path, workspace: &Path) -> Result<(), LocalError> {
    let file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LocalError::SnapshotGone {
                snapshot: snap.id(),
                path: path.to_path_buf(),
            })
        }
        Err(e) => return Err(LocalError::io("open", path)(e)),
    };
    let archive_err = |source| LocalError::Archive {
        snapshot: snap.id(),
        path: path.to_path_buf(),
        source,
    };
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let header = archive::read_prefix(&mut reader).map_err(archive_err)?;
    check_header(snap, path, &header)?;
    fs::create_dir(workspace).map_err(LocalError::io("create directory", workspace))?;
    archive::unpack_body(reader, workspace).map_err(archive_err)
}
