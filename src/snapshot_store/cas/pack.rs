//! The workspace walk into a manifest: entries in depth-first name order (symlinks verbatim,
//! hard links once, sparse files by their data segments), the contents of every file not
//! matched by the index read on two threads, hashed, and stored unless already present.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::manifest::{Chunk, Entry, EntryKind, FileStat, Manifest, Meta, Root};
use super::object::{compressor, sync_path, Hash, PackWriter, CHUNK};
use super::restore::Index;
use super::track::{Changes, Tracked};
use super::{show, Cas, CasError};
use crate::snapshot_store::archive::{
    data_segments, fits, inspected, list_sorted, omit, too_long, walk_workspace, Omitted, Walked,
};

/// Threads reading, hashing and compressing file contents.
const WORKERS: usize = 2;

/// A file longer than this (and not sparse) is read in parts of this many bytes, each a job of
/// its own, so that both threads hash and compress it. A multiple of [`CHUNK`]: the chunks are
/// the same as when the file is read whole.
const PART: u64 = 8 * CHUNK;

/// What [`Cas::pack`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackedStats {
    /// Entries in the manifest.
    pub entries: u64,
    /// Regular files whose contents were read (the others matched the index).
    pub files_read: u64,
    /// Bytes of file data read.
    pub bytes_read: u64,
    /// Chunks newly written to the store.
    pub objects_written: u64,
    /// Bytes of the packs they were written to.
    pub bytes_written: u64,
    /// Entries left out: unreadable ones, and sockets, fifos and devices.
    pub omitted: Vec<Omitted>,
    /// Entries whose `lstat` fields were read (a full walk: all of them; a tracked snapshot:
    /// the changed ones, hard links and racy files).
    pub entries_looked_at: u64,
    /// Whether the walk was guided by tracked changes ([`Cas::pack_tracked`]); `false` for a
    /// full walk, also when tracking fell back to one.
    pub tracked: bool,
    /// Why a tracked snapshot fell back to a full walk, if it did.
    pub fell_back: Option<String>,
}

fn nanos(secs: i64, nsec: i64) -> i64 {
    secs.saturating_mul(1_000_000_000).saturating_add(nsec)
}

/// A file (or a part of one) whose contents must be read.
struct Job {
    entry: usize,
    abs: std::path::PathBuf,
    ino: u64,
    sparse: bool,
    /// `None`: the whole file, its length and stat fields as found when it is opened. Else this
    /// byte range of a file read in parts: its entry keeps the stat fields the walk found (taken
    /// before any part was read, so a change made during the snapshot is seen by the next one).
    part: Option<std::ops::Range<u64>>,
}

/// What reading one job gave.
enum Read {
    /// A whole file.
    Done {
        size: u64,
        stat: FileStat,
        mtime_ns: i64,
        chunks: Vec<Chunk>,
        bytes: u64,
    },
    /// A part of a file read in parts: its chunks.
    Part {
        chunks: Vec<Chunk>,
        bytes: u64,
    },
    Omit(String),
}

impl Cas {
    /// Walks `workspace` into a manifest, storing every content not in the store yet. Files
    /// that match `index` (same size, mtime, ctime, device and inode, not racy) and whose
    /// chunks are all present keep their chunks without being read. The caller holds the
    /// store's lock shared; the new chunks are durable when this returns.
    pub fn pack(
        &self,
        workspace: &Path,
        index: Option<&Index>,
    ) -> Result<(Manifest, PackedStats), CasError> {
        let (manifest, stats, staged) = self
            .pack_with(workspace, index, None)?
            .expect("a full walk always finishes");
        staged.commit()?;
        Ok((manifest, stats))
    }

    /// [`Cas::pack`] of a workspace whose changes since `tracked.index` were tracked
    /// ([`Tracker`](super::Tracker)): only the changed entries are looked at (and read if their
    /// stat fields moved), every other one is taken from the index, and the manifest is the
    /// one a full walk would give. Hard links and racy entries are always looked at. It falls
    /// back to a full walk (and says why in the stats) when a file turns out to have a link
    /// count above one that the index does not explain: a link made during the sandbox's life
    /// whose other names the walk would not visit.
    pub fn pack_tracked(
        &self,
        workspace: &Path,
        tracked: &Tracked,
    ) -> Result<(Manifest, PackedStats), CasError> {
        let (manifest, stats, staged) = self.pack_tracked_staged(workspace, tracked)?;
        staged.commit()?;
        Ok((manifest, stats))
    }

    /// [`Cas::pack_tracked`] that leaves the new contents to be committed by the caller: read
    /// and stored, but not fsynced nor listed in the catalog until [`Staged::commit`]. A
    /// checkpoint reads the contents while the sandbox's processes are paused and commits them
    /// after they resume, before the manifest naming them is written. The caller holds the
    /// store's lock shared until it has committed them.
    pub fn pack_tracked_staged(
        &self,
        workspace: &Path,
        tracked: &Tracked,
    ) -> Result<(Manifest, PackedStats, Staged), CasError> {
        match self.pack_with(workspace, Some(&tracked.index), Some(&tracked.changes))? {
            Ok(packed) => Ok(packed),
            Err(why) => {
                let (manifest, mut stats, staged) = self
                    .pack_with(workspace, Some(&tracked.index), None)?
                    .expect("a full walk always finishes");
                stats.fell_back = Some(why);
                Ok((manifest, stats, staged))
            }
        }
    }

    /// The walk and the reads. With `changes` (and an index), a tracked walk; `Ok(Err(why))`
    /// when it must be redone as a full one.
    #[allow(clippy::type_complexity)]
    fn pack_with(
        &self,
        workspace: &Path,
        index: Option<&Index>,
        changes: Option<&Changes>,
    ) -> Result<Result<(Manifest, PackedStats, Staged), String>, CasError> {
        let mut stats = PackedStats {
            tracked: changes.is_some(),
            ..PackedStats::default()
        };
        let mut entries: Vec<Entry> =
            Vec::with_capacity(index.map_or(0, |i| i.manifest.entries.len()));
        let mut jobs: Vec<Job> = Vec::new();
        // The index's entries by path (files for the reuse check, all of them for the tracked
        // walk), built once.
        let known: HashMap<&[u8], &Entry, ahash::RandomState> = index
            .map(|i| {
                i.manifest
                    .entries
                    .iter()
                    .map(|e| (e.path.as_slice(), e))
                    .collect()
            })
            .unwrap_or_default();
        let catalog = self.catalog()?;
        let mut first_link: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
        // A tracked walk: the entries of the index's hard-link groups (always looked at) and
        // their inodes (any other file with more than one link sends it back to a full walk).
        let (mut linked, mut group_inodes): (HashSet<&[u8]>, HashSet<(u64, u64)>) =
            Default::default();
        if let (Some(index), Some(_)) = (index, changes) {
            for e in &index.manifest.entries {
                if let EntryKind::HardLink { target } = &e.kind {
                    linked.insert(&e.path);
                    linked.insert(target);
                    if let Some(EntryKind::File { stat, .. }) =
                        known.get(target.as_slice()).map(|t| &t.kind)
                    {
                        group_inodes.insert((stat.dev, stat.ino));
                    }
                }
            }
        }
        let mut untrusted: Option<String> = None;
        let mut looked_at = 0u64;
        let visit = |omitted: &mut Vec<Omitted>, step: Step<'_>| -> Result<(), CasError> {
            let Walked { rel, abs, meta } = match step {
                Step::Walked(walked) => walked,
                Step::Kept { entry } => {
                    let keep = match &entry.kind {
                        EntryKind::Dir | EntryKind::Symlink { .. } => true,
                        EntryKind::File { stat, chunks, .. } => {
                            let written = index.map_or(i64::MIN, |i| i.written_ns);
                            stat.ctime_ns < written
                                && chunks.iter().all(|c| catalog.contains(&c.hash))
                        }
                        EntryKind::HardLink { .. } => false,
                    };
                    if keep {
                        entries.push(entry.clone());
                        return Ok(());
                    }
                    let rel = entry.path.clone();
                    let abs = workspace.join(std::ffi::OsStr::from_bytes(&rel));
                    match inspected(omitted, &rel, fs::symlink_metadata(&abs)) {
                        Some(meta) => Walked { rel, abs, meta },
                        None => return Ok(()),
                    }
                }
            };
            looked_at += 1;
            let mode = meta.mode() & 0o7777;
            let mtime_ns = nanos(meta.mtime(), meta.mtime_nsec());
            // A file whose size, mtime, inode and ctime are its index entry's, with a ctime
            // older than the index, has the owner and attributes the index recorded as they
            // were then: a chown, a chmod or a setxattr would have moved its ctime. They are
            // taken from there rather than listed again — a second snapshot spent most of its
            // time reading attributes nobody changed (issue 32 item 9).
            let unchanged = index
                .filter(|_| meta.file_type().is_file())
                .and_then(|index| {
                    let old = known.get(rel.as_slice())?;
                    let EntryKind::File { size, stat, .. } = &old.kind else {
                        return None;
                    };
                    let ctime_ns = nanos(meta.ctime(), meta.ctime_nsec());
                    let same = *size == meta.len()
                        && old.mtime_ns == mtime_ns
                        && (stat.dev, stat.ino, stat.ctime_ns)
                            == (meta.dev(), meta.ino(), ctime_ns)
                        && ctime_ns < index.written_ns;
                    same.then(|| old.meta.clone()).flatten()
                });
            // Its owner and extended attributes: what cannot be read of them is listed as left
            // out, and the entry kept without them.
            let read = match unchanged {
                Some(m) => Ok(m),
                None => super::xattr::read(&abs, meta.uid(), meta.gid()),
            };
            let owned = match read {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => {
                    omitted.push(Omitted {
                        path: show(&rel),
                        reason: format!(
                            "cannot read its extended attributes (kept without them): {e}"
                        ),
                    });
                    Meta {
                        uid: meta.uid(),
                        gid: meta.gid(),
                        xattrs: Vec::new(),
                    }
                }
            };
            let ft = meta.file_type();
            let kind = if ft.is_dir() {
                EntryKind::Dir
            } else if ft.is_symlink() {
                match fs::read_link(&abs) {
                    Ok(target) => EntryKind::Symlink {
                        target: target.into_os_string().into_vec(),
                    },
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => {
                        omit(omitted, &rel, "read the symlink", &e);
                        return Ok(());
                    }
                }
            } else if ft.is_file() {
                let inode = (meta.dev(), meta.ino());
                if meta.nlink() > 1 && changes.is_some() && !group_inodes.contains(&inode) {
                    untrusted.get_or_insert_with(|| {
                        format!(
                            "`{}` has {} links, which the index does not explain",
                            show(&rel),
                            meta.nlink()
                        )
                    });
                }
                if meta.nlink() > 1 {
                    if let Some(first) = first_link.get(&inode) {
                        entries.push(Entry {
                            path: rel,
                            mode,
                            mtime_ns,
                            meta: Some(owned),
                            kind: EntryKind::HardLink {
                                target: first.clone(),
                            },
                        });
                        return Ok(());
                    }
                    first_link.insert(inode, rel.clone());
                }
                let stat = FileStat {
                    dev: meta.dev(),
                    ino: meta.ino(),
                    ctime_ns: nanos(meta.ctime(), meta.ctime_nsec()),
                };
                let reuse = index.and_then(|index| {
                    let old = known.get(rel.as_slice())?;
                    let EntryKind::File {
                        size,
                        stat: old_stat,
                        chunks,
                    } = &old.kind
                    else {
                        return None;
                    };
                    let same = *size == meta.len()
                        && old.mtime_ns == mtime_ns
                        && *old_stat == stat
                        && stat.ctime_ns < index.written_ns;
                    if !same {
                        return None;
                    }
                    // Reused only while every chunk is still stored.
                    chunks
                        .iter()
                        .all(|c| catalog.contains(&c.hash))
                        .then(|| chunks.clone())
                });
                match reuse {
                    Some(chunks) => EntryKind::File {
                        size: meta.len(),
                        stat,
                        chunks,
                    },
                    None => {
                        let (size, entry) = (meta.len(), entries.len());
                        let sparse = meta.blocks().saturating_mul(512) < size;
                        if sparse || size <= PART {
                            jobs.push(Job {
                                entry,
                                abs,
                                ino: meta.ino(),
                                sparse,
                                part: None,
                            });
                        } else {
                            let mut start = 0;
                            while start < size {
                                let end = (start + PART).min(size);
                                jobs.push(Job {
                                    entry,
                                    abs: abs.clone(),
                                    ino: meta.ino(),
                                    sparse,
                                    part: Some(start..end),
                                });
                                start = end;
                            }
                        }
                        EntryKind::File {
                            size: meta.len(),
                            stat,
                            chunks: Vec::new(),
                        }
                    }
                }
            } else {
                omitted.push(Omitted {
                    path: show(&rel),
                    reason: "sockets, fifos and devices are not kept in snapshots".into(),
                });
                return Ok(());
            };
            entries.push(Entry {
                path: rel,
                mode,
                mtime_ns,
                meta: Some(owned),
                kind,
            });
            Ok(())
        };
        let root_err = |dir_abs: &Path, e| CasError::io("list directory", dir_abs)(e);
        match (index, changes) {
            (Some(index), Some(changes)) => walk_tracked(
                workspace,
                &index.manifest,
                &known,
                changes,
                &linked,
                &mut stats.omitted,
                root_err,
                visit,
            )?,
            _ => {
                let mut visit = visit;
                walk_workspace(
                    workspace,
                    &mut stats.omitted,
                    root_err,
                    |omitted, walked| visit(omitted, Step::Walked(walked)),
                )?
            }
        }
        stats.entries_looked_at = looked_at;
        if let Some(why) = untrusted {
            return Ok(Err(why));
        }

        // Read, hash and store the contents on two threads, each into a pack of its own.
        let next = AtomicUsize::new(0);
        let claimed: Mutex<HashSet<Hash>> = Mutex::new(HashSet::new());
        let workers_n = WORKERS.min(jobs.len());
        let mut writers = Vec::new();
        for _ in 0..workers_n {
            writers.push(Mutex::new(Some(PackWriter::create(self)?)));
        }
        let results: Vec<Result<Vec<(usize, Read)>, CasError>> = std::thread::scope(|scope| {
            let workers: Vec<_> = writers
                .iter()
                .map(|writer| {
                    let (next, claimed, catalog, jobs) = (&next, &claimed, &catalog, &jobs);
                    scope.spawn(move || {
                        let mut guard = writer.lock().unwrap_or_else(|p| p.into_inner());
                        let pack = guard.as_mut().expect("a writer per worker");
                        let mut done = Vec::new();
                        let mut compressor = compressor()
                            .map_err(CasError::io("start compressing in", self.dir()))?;
                        let mut buf = vec![0u8; CHUNK as usize];
                        let mut store = |hash: &Hash, data: &[u8]| -> Result<(), CasError> {
                            if catalog.contains(hash)
                                || !claimed
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .insert(*hash)
                            {
                                return Ok(());
                            }
                            pack.append(hash, data, &mut compressor)
                        };
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(job) = jobs.get(i) else { break };
                            let read = read_file(job, &mut buf, &mut store)?;
                            done.push((job.entry, read));
                        }
                        Ok(done)
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| {
                    w.join().unwrap_or_else(|_| {
                        Err(CasError::io("read the workspace", workspace)(
                            io::Error::other("a reader thread panicked"),
                        ))
                    })
                })
                .collect()
        });
        let writers: Vec<PackWriter> = writers
            .into_iter()
            .filter_map(|w| w.into_inner().unwrap_or_else(|p| p.into_inner()))
            .collect();
        if let Some(e) = results.iter().find_map(|r| r.as_ref().err()) {
            let message = e.to_string();
            for w in writers {
                w.abandon();
            }
            return Err(results
                .into_iter()
                .find_map(Result::err)
                .unwrap_or_else(|| CasError::manifest(message)));
        }
        for w in writers.iter().filter(|w| !w.is_empty()) {
            stats.objects_written += w.len() as u64;
            stats.bytes_written += w.bytes;
        }
        let staged = Staged {
            writers,
            packs_dir: self.packs_dir(),
        };
        let mut omitted_files: HashSet<usize> = HashSet::new();
        let mut in_parts: HashSet<usize> = HashSet::new();
        for result in results {
            for (i, read) in result.expect("errors returned above") {
                match read {
                    Read::Part {
                        chunks: part,
                        bytes,
                    } => {
                        if in_parts.insert(i) {
                            stats.files_read += 1;
                        }
                        stats.bytes_read += bytes;
                        if let EntryKind::File { chunks, .. } = &mut entries[i].kind {
                            chunks.extend(part);
                        }
                    }
                    Read::Done {
                        size,
                        stat,
                        mtime_ns,
                        chunks,
                        bytes,
                    } => {
                        stats.files_read += 1;
                        stats.bytes_read += bytes;
                        entries[i].mtime_ns = mtime_ns;
                        entries[i].kind = EntryKind::File { size, stat, chunks };
                    }
                    Read::Omit(reason) => {
                        if omitted_files.insert(i) {
                            stats.omitted.push(Omitted {
                                path: show(&entries[i].path),
                                reason,
                            });
                        }
                    }
                }
            }
        }
        // The parts of a file come back from both threads in any order.
        for i in in_parts {
            if let EntryKind::File { chunks, .. } = &mut entries[i].kind {
                chunks.sort_unstable_by_key(|c| c.offset);
            }
        }
        if !omitted_files.is_empty() {
            // A hard link to a file left out keeps nothing to link to: the first such link
            // becomes the file's stand-in would need its contents, so it is left out too.
            let gone: HashSet<Vec<u8>> = omitted_files
                .iter()
                .map(|i| entries[*i].path.clone())
                .collect();
            let mut index = 0;
            entries.retain(|e| {
                let keep = !omitted_files.contains(&index)
                    && !matches!(&e.kind, EntryKind::HardLink { target } if gone.contains(target));
                index += 1;
                keep
            });
        }
        stats.entries = entries.len() as u64;
        // The workspace directory itself, after the walk: its mtime moves with its entries.
        let root = fs::symlink_metadata(workspace).map_err(CasError::io("inspect", workspace))?;
        let root = Root {
            mode: root.mode() & 0o7777,
            mtime_ns: nanos(root.mtime(), root.mtime_nsec()),
            meta: super::xattr::read(workspace, root.uid(), root.gid())
                .map_err(CasError::io("read the extended attributes of", workspace))?,
        };
        Ok(Ok((
            Manifest {
                root: Some(root),
                entries,
            },
            stats,
            staged,
        )))
    }
}

/// The contents a walk stored, not durable yet: [`Staged::commit`] makes them so. Dropped
/// uncommitted, they are abandoned (their packs removed; nothing can refer to them yet: the
/// store's catalog lists only committed packs).
#[must_use = "the contents are abandoned unless committed"]
pub struct Staged {
    writers: Vec<PackWriter>,
    packs_dir: std::path::PathBuf,
}

impl Staged {
    /// Commits the packs: each fsynced and indexed, then their directory once. Once this
    /// returns, the catalog lists the contents and they survive a crash.
    pub fn commit(mut self) -> Result<(), CasError> {
        let mut committed = false;
        for w in std::mem::take(&mut self.writers) {
            committed |= !w.is_empty();
            w.commit()?;
        }
        if committed {
            sync_path(&self.packs_dir)?;
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for w in self.writers.drain(..) {
            w.abandon();
        }
    }
}

/// What the tracked walk hands its visitor.
// Handed over by value, one at a time, never stored: a boxed `Walked` would cost an allocation
// per entry looked at.
#[allow(clippy::large_enum_variant)]
enum Step<'m> {
    /// An entry looked at (its `lstat` fields read), as the full walk gives it.
    Walked(Walked),
    /// An entry no event touched: the index's, unless the visitor decides to look (its path
    /// in the workspace is not too long: checked by the walk).
    Kept { entry: &'m Entry },
}

/// A directory's child in a tracked walk.
enum Child<'m> {
    /// The index's entry, taken as it is (its path is not too long here).
    Kept(&'m Entry),
    /// A path to look at: its `DirEntry` if the directory was listed.
    Look(Vec<u8>, Option<fs::DirEntry>),
}

/// The full walk's order and entries (see `walk_workspace`), with every path no change
/// touched taken from `prev` (the index) without a system call: a directory is listed again
/// only if its listing changed, is new or lies in a subtree created or moved in (walked whole),
/// and an entry is looked at only if a change names it, it is new or it is in `linked`.
/// `by_path` is `prev`'s entries by path.
#[allow(clippy::too_many_arguments)]
fn walk_tracked<'m, E>(
    workspace: &Path,
    prev: &'m Manifest,
    by_path: &HashMap<&'m [u8], &'m Entry, ahash::RandomState>,
    changes: &Changes,
    linked: &HashSet<&[u8]>,
    omitted: &mut Vec<Omitted>,
    root_err: impl Fn(&Path, io::Error) -> E,
    mut visit: impl FnMut(&mut Vec<Omitted>, Step<'m>) -> Result<(), E>,
) -> Result<(), E> {
    let os = |p: &[u8]| Path::new(std::ffi::OsStr::from_bytes(p)).to_path_buf();
    // Each directory's children, in the walk's (name) order.
    let mut children: HashMap<&[u8], Vec<&'m Entry>, ahash::RandomState> = HashMap::default();
    for e in &prev.entries {
        let parent = e
            .path
            .iter()
            .rposition(|b| *b == b'/')
            .map_or(&[][..], |i| &e.path[..i]);
        children.entry(parent).or_default().push(e);
    }
    let mut stack: Vec<(Vec<u8>, bool)> = vec![(Vec::new(), changes.trees.contains(&[][..]))];
    while let Some((dir, whole)) = stack.pop() {
        let dir_abs = workspace.join(os(&dir));
        let known = dir.is_empty()
            || matches!(by_path.get(dir.as_slice()), Some(e) if e.kind == EntryKind::Dir);
        let whole = whole || !known;
        let looked_at = |rel: &[u8]| whole || changes.paths.contains(rel) || linked.contains(rel);
        let reuse = |rel: &[u8]| {
            if looked_at(rel) {
                None
            } else {
                by_path.get(rel).copied()
            }
        };
        let mut subdirs = Vec::new();
        let child = |rel: &[u8]| {
            if dir.is_empty() {
                rel.to_vec()
            } else {
                [dir.as_slice(), b"/", rel].concat()
            }
        };
        // The directory's children in name order: listed anew where it changed (a `DirEntry`
        // each), else the index's. Most of a tracked walk is the index's entries no change
        // touched: they are handed over as they are, without copying their paths.
        let listing: Vec<Child<'m>> = if whole || changes.listed.contains(&dir) {
            match list_sorted(&dir_abs) {
                Ok(entries) => entries
                    .into_iter()
                    .map(|(name, dirent)| Child::Look(child(&name), Some(dirent)))
                    .collect(),
                Err(e) if e.kind() == io::ErrorKind::NotFound && !dir.is_empty() => continue,
                Err(e) if dir.is_empty() => return Err(root_err(&dir_abs, e)),
                Err(e) => {
                    omit(omitted, &dir, "list the contents of", &e);
                    continue;
                }
            }
        } else {
            children
                .get(dir.as_slice())
                .into_iter()
                .flatten()
                .map(|e| {
                    if looked_at(&e.path) || !fits(workspace, &e.path) {
                        Child::Look(e.path.clone(), None)
                    } else {
                        Child::Kept(e)
                    }
                })
                .collect()
        };
        for item in listing {
            let entry = match item {
                Child::Kept(entry) => entry,
                Child::Look(rel, dirent) => {
                    let abs = workspace.join(os(&rel));
                    if too_long(omitted, &rel, &abs) {
                        continue;
                    }
                    if let Some(entry) = reuse(&rel) {
                        entry
                    } else {
                        // Neither follows a symlink.
                        let found =
                            dirent.map_or_else(|| fs::symlink_metadata(&abs), |d| d.metadata());
                        let Some(meta) = inspected(omitted, &rel, found) else {
                            continue;
                        };
                        if meta.is_dir() {
                            subdirs.push((rel.clone(), whole || changes.trees.contains(&rel)));
                        }
                        visit(omitted, Step::Walked(Walked { rel, abs, meta }))?;
                        continue;
                    }
                }
            };
            if entry.kind == EntryKind::Dir {
                subdirs.push((entry.path.clone(), changes.trees.contains(&entry.path)));
            }
            visit(omitted, Step::Kept { entry })?;
        }
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(())
}

/// Reads one file's data segments in chunks, handing each to `store`.
fn read_file(
    job: &Job,
    buf: &mut [u8],
    store: &mut impl FnMut(&Hash, &[u8]) -> Result<(), CasError>,
) -> Result<Read, CasError> {
    {
        let file = match File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&job.abs)
        {
            Ok(file) => file,
            Err(e) => return Ok(Read::Omit(format!("cannot read it: {e}"))),
        };
        let meta = match file.metadata() {
            Ok(meta) if meta.is_file() && meta.ino() == job.ino => meta,
            Ok(_) => return Ok(Read::Omit("it was replaced while being read".into())),
            Err(e) => return Ok(Read::Omit(format!("cannot inspect it: {e}"))),
        };
        if let Some(part) = &job.part {
            if meta.len() < part.end {
                return Ok(Read::Omit(
                    "it shrank while the snapshot was being taken".into(),
                ));
            }
            let (chunks, bytes) = match read_range(&file, part.clone(), buf, store)? {
                Ok(read) => read,
                Err(reason) => return Ok(Read::Omit(reason)),
            };
            return Ok(Read::Part { chunks, bytes });
        }
        let size = meta.len();
        let segments = if job.sparse {
            match data_segments(&file, size) {
                Ok(segments) => segments,
                Err(e) => return Ok(Read::Omit(format!("cannot map its holes: {e}"))),
            }
        } else {
            vec![(0, size)]
        };
        let mut chunks = Vec::new();
        let mut bytes = 0;
        for (start, len) in segments {
            match read_range(&file, start..start + len, buf, store)? {
                Ok((more, n)) => {
                    chunks.extend(more);
                    bytes += n;
                }
                Err(reason) => return Ok(Read::Omit(reason)),
            }
        }
        Ok(Read::Done {
            size,
            stat: FileStat {
                dev: meta.dev(),
                ino: meta.ino(),
                ctime_ns: nanos(meta.ctime(), meta.ctime_nsec()),
            },
            mtime_ns: nanos(meta.mtime(), meta.mtime_nsec()),
            chunks,
            bytes,
        })
    }
}

/// Reads `range` of `file` in chunks at multiples of [`CHUNK`] from its start, handing each to
/// `store`: the chunks and the bytes read, or why the file must be left out.
#[allow(clippy::type_complexity)]
fn read_range(
    file: &File,
    range: std::ops::Range<u64>,
    buf: &mut [u8],
    store: &mut impl FnMut(&Hash, &[u8]) -> Result<(), CasError>,
) -> Result<Result<(Vec<Chunk>, u64), String>, CasError> {
    let mut chunks = Vec::new();
    let mut at = range.start;
    while at < range.end {
        let want = (range.end - at).min(CHUNK) as usize;
        let data = &mut buf[..want];
        if let Err(e) = file.read_exact_at(data, at) {
            return Ok(Err(if e.kind() == io::ErrorKind::UnexpectedEof {
                "it shrank while the snapshot was being taken".into()
            } else {
                format!("cannot read it: {e}")
            }));
        }
        let hash = Hash::of(data);
        store(&hash, data)?;
        chunks.push(Chunk {
            offset: at,
            len: want as u32,
            hash,
        });
        at += want as u64;
    }
    Ok(Ok((chunks, range.end - range.start)))
}
