//! Snapshots on disk: where a task's archives live (`snapshots/<task>/<seq>.<nonce>.tbx`),
//! taking one (stop the processes, pack the workspace, write it durably, discard the sandbox),
//! restoring one into a new workspace, deleting and listing them. The archive format itself is
//! [`archive`](super::archive).
//!
//! A snapshot call is idempotent by the operation that makes it, never by its sequence number
//! alone: a repeated call (recovery re-issuing it) finds its archive only if the archive's
//! header names the same installation, task, sandbox (so the same generation), sequence number
//! and — while the sandbox still exists — the same sandbox instance. Every new archive gets a
//! random nonce in its name, so an archive left by an earlier store (the database removed or
//! moved aside: a new installation, sequence numbers starting again at 1) is never overwritten,
//! never restored for the new store and never mistaken for a snapshot already taken — which
//! would discard the live workspace.

use std::fs;
use std::io::{self, BufReader};
use std::path::{Path, PathBuf};

use super::archive::{self, ArchiveHeader};
use super::cas::{Cas, Index, Manifest, PackedStats, Tracked};
use super::error::LocalError;
use super::fsutil::{ignore_not_found, sync_dir};
use super::names::{check_owner, SandboxName, SnapshotRef};
use super::workspace::{SandboxMeta, SandboxStatus};
use super::{run_blocking, InFlight, LocalProvider};
use crate::core::Millis;
use crate::ids::TaskId;
use crate::provider::{ListedResource, SnapshotInfo};

/// File name suffix of snapshot archives.
pub(super) const ARCHIVE_EXT: &str = "tbx";

impl LocalProvider {
    /// The header of the archive `snap` of the sandbox `name` (its meta `meta`), and the
    /// temporary path beside `path` it is written at, marked in flight.
    pub(super) fn archive_start(
        &self,
        snap: &SnapshotRef,
        path: &Path,
        name: &SandboxName,
        meta: &SandboxMeta,
    ) -> (ArchiveHeader, PathBuf, InFlight) {
        let seq = snap.seq;
        let header = ArchiveHeader {
            task_id: snap.task.to_string(),
            seq,
            installation_id: meta.installation_id.clone(),
            created_at: self.clock.now_ms(),
            source_sandbox: name.name.clone(),
            generation: Some(name.generation),
            instance: Some(meta.instance.clone()),
            nonce: snap.nonce.clone(),
            cwd: Some(meta.cwd.clone()),
        };
        let dir = path.parent().expect("an archive path has a parent");
        let (tmp, in_flight) = self.temp_path(dir, &format!("{seq}.{ARCHIVE_EXT}."), ".tmp");
        (header, tmp, in_flight)
    }

    pub(super) fn snapshot_path(&self, snap: &SnapshotRef) -> PathBuf {
        self.task_snapshots_dir(&snap.task)
            .join(snap.file_name(ARCHIVE_EXT))
    }

    pub(super) fn task_snapshots_dir(&self, task: &TaskId) -> PathBuf {
        self.root.join("snapshots").join(task.as_str())
    }

    /// The archive a previous call of this very operation wrote, if any: same installation,
    /// task, sandbox (generation) and sequence number, and taken from `instance` when the
    /// sandbox still exists.
    pub(super) fn find_taken(
        &self,
        name: &SandboxName,
        seq: u64,
        instance: Option<&str>,
    ) -> Result<Option<(SnapshotRef, u64)>, LocalError> {
        let dir = self.task_snapshots_dir(&name.task);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(LocalError::io("list", &dir)(e)),
        };
        // The newest match: with the sandbox gone, two store lifetimes that reused this
        // generation and sequence number (a database restored from a backup) both match.
        let mut found: Option<(SnapshotRef, u64, Millis)> = None;
        for file in entries {
            let file = file.map_err(LocalError::io("list", &dir))?;
            let Some(snap) = file
                .file_name()
                .to_str()
                .and_then(|n| SnapshotRef::from_file_name(&name.task, n, ARCHIVE_EXT))
                .filter(|snap| snap.seq == seq)
            else {
                continue;
            };
            let path = file.path();
            let Ok(Some((header, size))) = read_header(&path) else {
                continue; // unreadable: certainly not an archive this operation completed
            };
            let same_operation = header.task_id == name.task.as_str()
                && header.seq == seq
                && header.source_sandbox == name.name
                && (instance.is_none() || header.instance.as_deref() == instance);
            if same_operation && found.as_ref().is_none_or(|f| f.2 <= header.created_at) {
                found = Some((snap, size, header.created_at));
            }
        }
        Ok(found.map(|(snap, size, _)| (snap, size)))
    }

    pub(super) async fn snapshot_sandbox(
        &self,
        task_id: &str,
        sandbox_id: &str,
        seq: u64,
    ) -> Result<SnapshotInfo, LocalError> {
        let task = TaskId::new(task_id)?;
        let name = SandboxName::parse(sandbox_id)?;
        check_owner(&name, "task", name.task.as_str(), task.as_str())?;
        let slot = self.slot(&name);
        let _guard = slot.lock.lock().await;

        let existing = self.read_meta(&name)?;
        let instance = existing.as_ref().map(|m| m.instance.as_str());
        if let Some((snap, archive_bytes)) = self.find_taken(&name, seq, instance)? {
            // Taken before by this same operation (a repeated call): make sure the sandbox is
            // stopped, as it would be. Its size is the first answer's (the file data its
            // manifest keeps), read again from the manifest.
            let path = self.snapshot_path(&snap);
            let size_bytes = run_blocking("read a snapshot's manifest", move || {
                Ok(kept_bytes(&path).unwrap_or(archive_bytes))
            })
            .await?;
            self.discard(&name, &slot).await?;
            return Ok(SnapshotInfo {
                id: snap.id().into(),
                size_bytes,
                expires_at: None,
                omitted: Vec::new(),
                // The local backend reports no platform usage: its ledger is sandbox time,
                // creations and snapshot bytes, all read from the journal.
                usage: None,
                // Its processes were stopped by the first answer, which read them.
                resources: None,
            });
        }
        let snap = SnapshotRef {
            task,
            seq,
            nonce: Some(random_nonce()?),
        };
        let path = self.snapshot_path(&snap);
        // Past its deadline too: a late checkpoint saves the files a sandbox still holds.
        let mut meta = self.existing_meta(&name)?;
        check_owner(&name, "task", &meta.task_id, snap.task.as_str())?;
        // A VM is paused for its snapshot: stop every process so no file changes under the walk.
        // Its tracked changes count only once they are gone (see `stop_processes`).
        // What they used, read from their cgroups before those go with them.
        let resources = self.read_resources(sandbox_id);
        let quiesced = self.stop_processes(&name, &slot).await?;
        let tracker = super::lock(&self.trackers).remove(&name.name);
        let sandbox_dir = self.sandbox_dir(&name);
        meta.status = SandboxStatus::Snapshotting;
        self.write_meta(&sandbox_dir, &meta)?;

        let (header, tmp, in_flight) = self.archive_start(&snap, &path, &name, &meta);
        let workspace = self.workspace_dir(&name);
        let index = sandbox_dir.join(INDEX_FILE);
        let (snap2, path2, cas) = (snap.clone(), path.clone(), self.cas.clone());
        let written = run_blocking("write a snapshot", move || {
            let _in_flight = in_flight;
            let tracked = match tracker {
                Some(tracker) if quiesced => tracker
                    .finish()
                    .inspect_err(|e| {
                        tracing::info!(snapshot = %snap2.id(), reason = %e,
                        "the snapshot walks every file")
                    })
                    .ok(),
                Some(_) => {
                    tracing::info!(snapshot = %snap2.id(), "the sandbox's processes are not \
                        known to be gone: the snapshot walks every file");
                    None
                }
                None => None,
            };
            let source = match tracked {
                Some(tracked) => Walk::Tracked(Box::new(tracked)),
                None => Walk::Full { index: &index },
            };
            write_snapshot(&cas, &snap2, &workspace, source, &header, &path2, &tmp)
        })
        .await;
        let (size_bytes, stats) = match written {
            Ok(written) => written,
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
            looked_at = stats.entries_looked_at, tracked = stats.tracked,
            fell_back = ?stats.fell_back, files_read = stats.files_read,
            objects_written = stats.objects_written, "local snapshot taken");
        Ok(SnapshotInfo {
            id: snap.id().into(),
            size_bytes,
            expires_at: None,
            omitted: stats
                .omitted
                .into_iter()
                .map(|o| format!("{}: {}", o.path, o.reason))
                .collect(),
            usage: None,
            resources,
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
        let mut found = Vec::new();
        // Strict: gc must not take a listing it could not read for one without those snapshots.
        archives(
            &self.root,
            Unreadable::Fail,
            |_, snap, header| match header {
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
            },
        )?;
        found.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(found)
    }
}

/// What [`archives`] does with a directory or entry it cannot read.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Unreadable {
    /// Pass over it (and a missing `snapshots/` is no archives): for advice, such as the note
    /// about another installation's archives.
    Skip,
    /// Fail with the error: for the reconciler's listing.
    Fail,
}

/// Walks `<root>/snapshots/<task>/`: calls `visit` with each archive's task, name and header
/// (or why the header could not be read), in directory order. Task directories whose names are
/// not task ids, temporaries and other files are passed over.
pub(super) fn archives(
    root: &Path,
    unreadable: Unreadable,
    mut visit: impl FnMut(&TaskId, SnapshotRef, Result<ArchiveHeader, String>),
) -> Result<(), LocalError> {
    let lenient = unreadable == Unreadable::Skip;
    let dir = root.join("snapshots");
    let task_dirs = match fs::read_dir(&dir) {
        Ok(it) => it,
        Err(e) if lenient && e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LocalError::io("list", &dir)(e)),
    };
    for task_dir in task_dirs {
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
            Err(e) if lenient || e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(LocalError::io("list", &path)(e)),
        };
        for file in entries {
            let file = match file {
                Ok(file) => file,
                Err(_) if lenient => continue,
                Err(e) => return Err(LocalError::io("list", &path)(e)),
            };
            let Some(snap) = file
                .file_name()
                .to_str()
                .and_then(|n| SnapshotRef::from_file_name(&task, n, ARCHIVE_EXT))
            else {
                continue; // temporaries and strangers
            };
            let header = fs::File::open(file.path())
                .map_err(|e| e.to_string())
                .and_then(|f| {
                    archive::read_prefix(&mut BufReader::new(f)).map_err(|e| e.to_string())
                });
            visit(&task, snap, header);
        }
    }
    Ok(())
}

/// The header and size of the archive at `path`, if it exists.
fn read_header(path: &Path) -> Result<Option<(ArchiveHeader, u64)>, String> {
    let file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let header = archive::read_prefix(&mut BufReader::new(file)).map_err(|e| e.to_string())?;
    Ok(Some((header, size)))
}

/// 64 random bits from `/dev/urandom`, as 16 lowercase hex digits.
pub(super) fn random_nonce() -> Result<String, LocalError> {
    super::cas::random_name().map_err(LocalError::io(
        "read random bytes from",
        Path::new("/dev/urandom"),
    ))
}

fn check_header(snap: &SnapshotRef, path: &Path, header: &ArchiveHeader) -> Result<(), LocalError> {
    if header.task_id != snap.task.as_str()
        || header.seq != snap.seq
        || (snap.nonce.is_some() && header.nonce != snap.nonce)
    {
        return Err(LocalError::ArchiveMismatch {
            snapshot: snap.id(),
            path: path.to_path_buf(),
            found_task: header.task_id.escape_debug().to_string(),
            found_seq: header.seq,
        });
    }
    Ok(())
}

/// The file next to a sandbox's workspace that holds its index (see [`cas`](super::cas)).
pub(super) const INDEX_FILE: &str = "index";

/// The largest manifest read (a manifest of a million entries is about 100 MB).
const MAX_MANIFEST_BYTES: u64 = 1 << 30;

/// How a snapshot finds what changed.
pub(super) enum Walk<'a> {
    /// Every entry looked at, files matching the index at this path not read.
    Full {
        /// The workspace's index file.
        index: &'a Path,
    },
    /// Only the entries a tracker saw change looked at (see `Cas::pack_tracked`).
    Tracked(Box<Tracked>),
}

/// Packs `workspace` into the content store (reusing what its index says is unchanged) and
/// writes the manifest archive to `tmp`, fsyncs it, renames it to `path` and fsyncs the
/// directory: the snapshot exists only once all of it is durable. Returns the bytes of file data
/// the snapshot keeps ([`data_bytes`], what a repeated call finds again in the manifest; the
/// new contents are in the stats).
// The walk's inputs and the archive's place.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_snapshot(
    cas: &Cas,
    snap: &SnapshotRef,
    workspace: &Path,
    walk: Walk<'_>,
    header: &ArchiveHeader,
    path: &Path,
    tmp: &Path,
) -> Result<(u64, PackedStats), LocalError> {
    let content = |source| LocalError::Content {
        snapshot: snap.id(),
        path: path.to_path_buf(),
        source: Box::new(source),
    };
    // Held until the manifest is in place: gc cannot sweep what this snapshot stores or reuses.
    let _lock = cas.lock(false).map_err(content)?;
    let (manifest, stats) = match walk {
        Walk::Full { index } => cas.pack(workspace, Index::read(index).as_ref()),
        Walk::Tracked(tracked) => cas.pack_tracked(workspace, &tracked),
    }
    .map_err(content)?;
    let size = write_manifest(snap, &manifest, &manifest.encode(), header, path, tmp)?;
    Ok((size, stats))
}

/// Writes the archive of snapshot `snap` holding `manifest` (whose contents are in the store)
/// at `path`: at `tmp` first, fsynced, then renamed into place and the directory fsynced, so
/// a crash leaves either no archive or a complete one. Its data bytes (see [`data_bytes`]).
/// `body` is `manifest.encode()` (a checkpoint writes it as the index too). The caller holds
/// the store's lock from the packing of `manifest` until this returns.
pub(super) fn write_manifest(
    snap: &SnapshotRef,
    manifest: &Manifest,
    body: &[u8],
    header: &ArchiveHeader,
    path: &Path,
    tmp: &Path,
) -> Result<u64, LocalError> {
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
        let archive_err = |source| LocalError::Archive {
            snapshot: snap.id(),
            path: path.to_path_buf(),
            source,
        };
        let mut file = io::BufWriter::new(file);
        archive::write_prefix_version(&mut file, header, archive::VERSION).map_err(archive_err)?;
        // Level -1 (`zstd --fast=1`): the manifest is written by every snapshot, and its size
        // matters less than its time. On the 17,000-entry `--full` bench tree (2.5 MB encoded)
        // it compresses at 760 MB/s against level 1's 520 MB/s, for 0.2 % more bytes: a third of
        // its 32-byte chunk hashes, which no level compresses.
        let mut encoder = zstd::Encoder::new(file, -1).map_err(LocalError::io("write", tmp))?;
        encoder
            .include_checksum(true)
            .map_err(LocalError::io("write", tmp))?;
        io::Write::write_all(&mut encoder, body).map_err(LocalError::io("write", tmp))?;
        let file = encoder
            .finish()
            .map_err(LocalError::io("write", tmp))?
            .into_inner()
            .map_err(|e| LocalError::io("write", tmp)(e.into_error()))?;
        file.sync_all().map_err(LocalError::io("fsync", tmp))?;
        let size = file
            .metadata()
            .map_err(LocalError::io("inspect", tmp))?
            .len();
        drop(file);
        fs::rename(tmp, path).map_err(LocalError::io("move into place", path))?;
        sync_dir(dir)?;
        tracing::trace!(manifest_bytes = size, "manifest written");
        Ok(data_bytes(manifest))
    })();
    if result.is_err() {
        let _ = fs::remove_file(tmp);
    }
    result
}

/// The size the ledger records for a content-addressed snapshot (`snapshot bytes kept`): the
/// bytes of file data its manifest refers to — the workspace's logical size, holes of sparse
/// files left out, each hard-linked file once. Not the bytes it added to the shared store (a
/// snapshot that changed one file of a large workspace would then keep "nothing", and the
/// figure would move to no one when an older snapshot is deleted), nor the manifest's own size.
fn data_bytes(manifest: &Manifest) -> u64 {
    manifest
        .entries
        .iter()
        .map(|e| match &e.kind {
            super::cas::EntryKind::File { chunks, .. } => {
                chunks.iter().map(|c| u64::from(c.len)).sum::<u64>()
            }
            _ => 0,
        })
        .sum()
}

/// [`data_bytes`] of the version 3 archive at `path`; `None` for an older format (whose size
/// is the archive's) or an archive that cannot be read.
pub(super) fn kept_bytes(path: &Path) -> Option<u64> {
    let mut reader = BufReader::new(fs::File::open(path).ok()?);
    let (version, _) = archive::read_prefix_versioned(&mut reader).ok()?;
    if version < archive::VERSION {
        return None;
    }
    read_manifest(reader).ok().map(|m| data_bytes(&m))
}

/// Reads the manifest body of a version 3 archive (what follows its prefix).
pub(super) fn read_manifest<R: io::Read>(reader: R) -> Result<Manifest, super::cas::CasError> {
    use super::cas::CasError;
    let mut decoder = zstd::Decoder::new(reader)
        .map_err(|e| CasError::manifest(format!("it does not decompress: {e}")))?;
    let mut body = Vec::new();
    io::Read::read_to_end(
        &mut io::Read::take(&mut decoder, MAX_MANIFEST_BYTES + 1),
        &mut body,
    )
    .map_err(|e| CasError::manifest(format!("it does not decompress: {e}")))?;
    if body.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(CasError::manifest(format!(
            "it is larger than {MAX_MANIFEST_BYTES} bytes"
        )));
    }
    Manifest::decode(&body)
}

/// Restores the snapshot `snap` into `workspace` (which must not exist yet): a version 3
/// manifest from the content store (leaving the workspace's index next to it), an older tar
/// archive by extraction. Returns its header (which carries the working directory to resume
/// in) and the index written, if one was.
pub(super) fn restore(
    cas: &Cas,
    snap: &SnapshotRef,
    path: &Path,
    workspace: &Path,
) -> Result<(ArchiveHeader, Option<Index>), LocalError> {
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
    let (version, header) = archive::read_prefix_versioned(&mut reader).map_err(archive_err)?;
    check_header(snap, path, &header)?;
    if version < archive::VERSION {
        fs::create_dir(workspace).map_err(LocalError::io("create directory", workspace))?;
        archive::unpack_body(reader, workspace).map_err(archive_err)?;
        return Ok((header, None));
    }
    let content = |source| LocalError::Content {
        snapshot: snap.id(),
        path: path.to_path_buf(),
        source: Box::new(source),
    };
    let manifest = read_manifest(reader).map_err(content)?;
    let _lock = cas.lock(false).map_err(content)?;
    fs::create_dir(workspace).map_err(LocalError::io("create directory", workspace))?;
    let index = cas.restore(&manifest, workspace).map_err(content)?;
    let index = workspace.parent().and_then(|dir| {
        Index::write_kept(&dir.join(INDEX_FILE), index)
            .inspect_err(|e| {
                tracing::warn!(error = %e, "could not write the workspace index; the next \
                    snapshot reads every file")
            })
            .ok()
    });
    Ok((header, index))
}

impl LocalProvider {
    /// Deletes the contents no snapshot manifest and no sandbox's index refers to (mark, then
    /// sweep, under the content store's exclusive lock; see [`cas`](super::cas)). Manifests of
    /// every installation under this root count. A manifest that cannot be read stops the gc
    /// before anything is deleted.
    pub fn gc_content(&self) -> Result<super::cas::GcStats, LocalError> {
        let snapshots = self.root.join("snapshots");
        let root = self.root.clone();
        let cas_err = |path: PathBuf| {
            move |source| LocalError::Content {
                snapshot: "(content gc)".into(),
                path,
                source: Box::new(source),
            }
        };
        self.cas
            .gc(|live| {
                let list = |dir: &Path| -> Result<Vec<PathBuf>, super::cas::CasError> {
                    match fs::read_dir(dir) {
                        Ok(entries) => Ok(entries.flatten().map(|e| e.path()).collect()),
                        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
                        Err(e) => Err(super::cas::CasError::io("list", dir)(e)),
                    }
                };
                for task_dir in list(&snapshots)? {
                    for path in list(&task_dir)? {
                        let is_archive = path
                            .extension()
                            .is_some_and(|ext| ext == std::ffi::OsStr::new(ARCHIVE_EXT));
                        if !is_archive {
                            continue; // temporaries: their content is not referred to yet
                        }
                        let file = fs::File::open(&path)
                            .map_err(super::cas::CasError::io("open", &path))?;
                        let mut reader = BufReader::new(file);
                        let (version, _) = match archive::read_prefix_versioned(&mut reader) {
                            Ok(read) => read,
                            // Not ours at all: it refers to nothing of ours.
                            Err(archive::ArchiveError::BadMagic { .. }) => continue,
                            Err(e) => {
                                return Err(super::cas::CasError::manifest(format!(
                                    "`{}`: {e}; content gc stopped",
                                    path.display()
                                )))
                            }
                        };
                        if version < archive::VERSION {
                            continue; // a whole archive refers to nothing
                        }
                        let manifest = read_manifest(reader).map_err(|e| {
                            super::cas::CasError::manifest(format!(
                                "`{}`: {e}; content gc stopped",
                                path.display()
                            ))
                        })?;
                        live.extend(manifest.hashes().copied());
                    }
                }
                // The indexes of live sandboxes and of restores being assembled: what they
                // reuse stays.
                for place in ["tasks", "sandboxes", "tmp"] {
                    for dir in list(&root.join(place))? {
                        if let Some(index) = Index::read(&dir.join(INDEX_FILE)) {
                            live.extend(index.manifest.hashes().copied());
                        }
                    }
                }
                Ok(())
            })
            .map_err(cas_err(self.cas.dir().to_path_buf()))
    }
}

/// Writes local snapshot `snapshot_id` of the installation rooted at `root` (`<data>/local`)
/// to `out` as a plain zstd-compressed tarball: a version 3 manifest with its contents from the
/// store (every chunk's hash verified), an older archive re-packed from a temporary
/// extraction (so its sparse files come out as plain files). Reads only; takes the store's lock
/// shared.
pub fn export_snapshot<W: io::Write>(
    root: &Path,
    snapshot_id: &str,
    out: W,
) -> Result<W, LocalError> {
    let snap = SnapshotRef::parse(snapshot_id)?;
    let path = root
        .join("snapshots")
        .join(snap.task.as_str())
        .join(snap.file_name(ARCHIVE_EXT));
    let file = match fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LocalError::SnapshotGone {
                snapshot: snap.id(),
                path,
            })
        }
        Err(e) => return Err(LocalError::io("open", &path)(e)),
    };
    let archive_err = |source| LocalError::Archive {
        snapshot: snap.id(),
        path: path.clone(),
        source,
    };
    let content = |source| LocalError::Content {
        snapshot: snap.id(),
        path: path.clone(),
        source: Box::new(source),
    };
    let mut reader = BufReader::new(file);
    let (version, header) = archive::read_prefix_versioned(&mut reader).map_err(archive_err)?;
    check_header(&snap, &path, &header)?;
    let write = |e| LocalError::io("write the tarball to", "standard output")(e);
    let mut encoder = zstd::Encoder::new(out, 3).map_err(write)?;
    if version >= archive::VERSION {
        let manifest = read_manifest(reader).map_err(content)?;
        let cas = Cas::open(root.join("cas")).map_err(content)?;
        let _lock = cas.lock(false).map_err(content)?;
        super::cas::export_tar(&cas, &manifest, &mut encoder).map_err(content)?;
    } else {
        let tmp =
            root.join("tmp")
                .join(format!("export.{}.{}", std::process::id(), random_nonce()?));
        let workspace = tmp.join("workspace");
        fs::create_dir_all(&tmp).map_err(LocalError::io("create directory", &tmp))?;
        let result = (|| {
            fs::create_dir(&workspace).map_err(LocalError::io("create directory", &workspace))?;
            archive::unpack_body(reader, &workspace).map_err(archive_err)?;
            let mut builder = tar::Builder::new(&mut encoder);
            builder.follow_symlinks(false);
            builder
                .append_dir_all(".", &workspace)
                .and_then(|()| builder.finish())
                .map_err(write)
        })();
        let _ = super::fsutil::remove_tree(&tmp);
        result?;
    }
    encoder.finish().map_err(write)
}
