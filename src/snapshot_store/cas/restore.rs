//! A manifest materialised into an empty directory, and the index it leaves for the next
//! snapshot's change detection.
//!
//! The restore trusts nothing in the manifest and never writes through a symlink: every path
//! must be relative without `..`, its parent must be a directory entry earlier in the manifest
//! (so everything is created inside directories this restore made), no path appears twice, a
//! hard link must name a regular file earlier in the manifest, and symlinks are created last, as
//! leaves, with their targets verbatim and never resolved. Files are opened with `O_NOFOLLOW`
//! and `O_CREAT | O_EXCL`. Contents are read, verified and written on two threads; chunks are
//! written at their offsets, so holes stay holes. Any failure fails the whole restore; the
//! caller restores into a temporary directory and deletes it on failure.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::manifest::{Chunk, Entry, EntryKind, FileStat, Manifest, Meta, Root};
use super::object::CHUNK;
use super::{show, Cas, CasError};

/// Threads decompressing and writing.
const WORKERS: usize = 2;

/// Files with more chunks than this are written by several jobs, in ranges of this many.
const CHUNKS_PER_JOB: usize = 8;

const INDEX_MAGIC: [u8; 8] = *b"TBXINDX\0";
const INDEX_VERSION: u32 = 1;

pub(crate) fn os(path: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(path))
}

/// A workspace's index: the manifest of what a restore wrote, with the `lstat` fields the files
/// had afterwards, and when it was written (entries changed as late as that are racy).
#[derive(Debug, Clone)]
pub struct Index {
    /// The entries, with the restored files' stat fields.
    pub manifest: Manifest,
    /// The index file's mtime in nanoseconds: an entry whose ctime is not older is not trusted.
    pub written_ns: i64,
}

/// An index file begun before its manifest is known: its time is the time it was begun (see
/// [`Index::stamp`]). Dropped unwritten (a checkpoint that failed after it), its temporary
/// file is removed.
#[derive(Debug)]
pub struct IndexStamp {
    path: PathBuf,
    tmp: PathBuf,
    file: File,
    modified: SystemTime,
    /// Set once the file is renamed into place.
    placed: bool,
}

impl Drop for IndexStamp {
    fn drop(&mut self) {
        if !self.placed {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

impl Index {
    /// Writes `manifest` as the index at `path` (temporary file and rename; no fsync: a lost
    /// index only means the next snapshot reads every file).
    pub fn write(path: &Path, manifest: &Manifest) -> Result<(), CasError> {
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, index_bytes(&manifest.encode(), path)?)
            .map_err(CasError::io("write", &tmp))?;
        fs::rename(&tmp, path).map_err(CasError::io("move into place", path))
    }

    /// Begins the index at `path` now, to be written by [`IndexStamp::write`] later with the
    /// time of this call: the time an index is trusted from (`written_ns`) must not be later
    /// than the `lstat` of its files, or a file changed after them within the same tick of the
    /// file system's clock would look unchanged. A checkpoint calls it while its processes are
    /// still paused, and writes the index after they resume.
    pub fn stamp(path: &Path) -> Result<IndexStamp, CasError> {
        let tmp = path.with_extension("tmp");
        let file = File::create(&tmp).map_err(CasError::io("create", &tmp))?;
        let modified = file
            .metadata()
            .and_then(|m| m.modified())
            .map_err(CasError::io("inspect", &tmp))?;
        Ok(IndexStamp {
            path: path.to_path_buf(),
            tmp,
            file,
            modified,
            placed: false,
        })
    }

    /// [`Index::write`], returning the index as [`Index::read`] would give it back (without
    /// reading the file again).
    pub fn write_kept(path: &Path, manifest: Manifest) -> Result<Index, CasError> {
        Index::write(path, &manifest)?;
        let written = fs::symlink_metadata(path).map_err(CasError::io("inspect", path))?;
        Ok(Index {
            manifest,
            written_ns: written
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(written.mtime_nsec()),
        })
    }

    /// The index at `path`; `None` if there is none or it is not one this code reads (then
    /// every file is read, which is always correct).
    pub fn read(path: &Path) -> Option<Index> {
        let data = fs::read(path).ok()?;
        let written = fs::metadata(path).ok()?;
        if data.len() < 12 || data[..8] != INDEX_MAGIC || data[8..12] != INDEX_VERSION.to_le_bytes()
        {
            return None;
        }
        let body = zstd::stream::decode_all(&data[12..]).ok()?;
        let manifest = Manifest::decode(&body).ok()?;
        Some(Index {
            manifest,
            written_ns: written
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(written.mtime_nsec()),
        })
    }
}

impl IndexStamp {
    /// Writes `manifest` as the index begun by [`Index::stamp`], with the time of that call,
    /// and returns it as [`Index::read`] would give it back. `body` is `manifest.encode()`
    /// (which a checkpoint writes as its archive too). On an error nothing is left.
    pub fn write(mut self, manifest: Manifest, body: &[u8]) -> Result<Index, CasError> {
        let tmp = self.tmp.clone();
        let written = (|| -> Result<fs::Metadata, CasError> {
            self.file
                .write_all(&index_bytes(body, &self.path)?)
                .map_err(CasError::io("write", &tmp))?;
            // After the data: a write moves the time.
            self.file
                .set_modified(self.modified)
                .map_err(CasError::io("set the time of", &tmp))?;
            let meta = self
                .file
                .metadata()
                .map_err(CasError::io("inspect", &tmp))?;
            fs::rename(&tmp, &self.path).map_err(CasError::io("move into place", &self.path))?;
            Ok(meta)
        })();
        // On an error the drop removes the temporary file.
        let meta = written?;
        self.placed = true;
        Ok(Index {
            manifest,
            written_ns: meta
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.mtime_nsec()),
        })
    }
}

/// The bytes of an index file (which will be at `path`) holding the manifest encoded as
/// `encoded`.
fn index_bytes(encoded: &[u8], path: &Path) -> Result<Vec<u8>, CasError> {
    let body =
        zstd::bulk::compress(encoded, 1).map_err(CasError::io("compress the index", path))?;
    let mut data = Vec::with_capacity(body.len() + 12);
    data.extend_from_slice(&INDEX_MAGIC);
    data.extend_from_slice(&INDEX_VERSION.to_le_bytes());
    data.extend_from_slice(&body);
    Ok(data)
}

fn time_of(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// What a path is, in the restore's model of what it created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Dir,
    File,
    Symlink,
}

/// A piece of work for the writer threads.
struct Job {
    entry: usize,
    /// Which chunks of the file.
    chunks: std::ops::Range<usize>,
    /// The whole file in one job: create it, write it, set its length, mode and mtime.
    whole: bool,
}

fn components(raw: &[u8]) -> Result<(), &'static str> {
    if raw.is_empty() {
        return Err("its path is empty");
    }
    if raw.contains(&0) {
        return Err("its path contains a NUL byte");
    }
    if raw[0] == b'/' {
        return Err("its path is absolute");
    }
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => return Err("its path is not in normal form (empty or `.` component)"),
            b".." => return Err("its path contains `..`"),
            _ => {}
        }
    }
    Ok(())
}

fn parent(path: &[u8]) -> Option<&[u8]> {
    path.iter().rposition(|b| *b == b'/').map(|i| &path[..i])
}

impl Cas {
    /// Materialises `manifest` into `dest`, an empty directory the caller created and deletes
    /// if this fails. Returns the manifest with the restored files' stat fields (the
    /// workspace's index). The caller holds the store's lock shared.
    pub fn restore(&self, manifest: &Manifest, dest: &Path) -> Result<Manifest, CasError> {
        // Check every entry before creating anything.
        let mut tree: HashMap<&[u8], Node> = HashMap::new();
        for e in &manifest.entries {
            let refuse = |reason: String| CasError::UnsafeEntry {
                entry: show(&e.path),
                reason,
            };
            components(&e.path).map_err(|r| refuse(r.into()))?;
            if let Some(parent) = parent(&e.path) {
                match tree.get(parent) {
                    Some(Node::Dir) => {}
                    Some(Node::Symlink) => {
                        return Err(refuse(format!(
                            "it would be written through `{}`, a symlink",
                            show(parent)
                        )))
                    }
                    Some(Node::File) => {
                        return Err(refuse(format!("its parent `{}` is a file", show(parent))))
                    }
                    None => {
                        return Err(refuse(format!(
                            "its parent `{}` is not a directory before it in the manifest",
                            show(parent)
                        )))
                    }
                }
            }
            let node = match &e.kind {
                EntryKind::Dir => Node::Dir,
                EntryKind::File { .. } => Node::File,
                EntryKind::Symlink { target } => {
                    if target.is_empty() {
                        return Err(refuse("the symlink has no target".into()));
                    }
                    if target.contains(&0) {
                        return Err(refuse("its target contains a NUL byte".into()));
                    }
                    Node::Symlink
                }
                EntryKind::HardLink { target } => {
                    if tree.get(target.as_slice()) != Some(&Node::File) {
                        return Err(refuse(format!(
                            "it is a hard link to `{}`, which is not a regular file before it",
                            show(target)
                        )));
                    }
                    Node::File
                }
            };
            if tree.insert(&e.path, node).is_some() {
                return Err(refuse("it appears twice in the manifest".into()));
            }
        }

        let catalog = self.catalog()?;
        // Directories, writable while they are filled.
        let abs = |p: &[u8]| dest.join(os(p));
        for e in &manifest.entries {
            if let EntryKind::Dir = e.kind {
                let path = abs(&e.path);
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&path)
                    .map_err(CasError::io("create directory", &path))?;
            }
        }

        // Files: small ones whole, big ones created here and written in ranges.
        let mut jobs = Vec::new();
        for (i, e) in manifest.entries.iter().enumerate() {
            let EntryKind::File { size, chunks, .. } = &e.kind else {
                continue;
            };
            if chunks.len() <= CHUNKS_PER_JOB {
                jobs.push(Job {
                    entry: i,
                    chunks: 0..chunks.len(),
                    whole: true,
                });
                continue;
            }
            let path = abs(&e.path);
            let file = create(&path)?;
            file.set_len(*size)
                .map_err(CasError::io("set the length of", &path))?;
            for start in (0..chunks.len()).step_by(CHUNKS_PER_JOB) {
                jobs.push(Job {
                    entry: i,
                    chunks: start..(start + CHUNKS_PER_JOB).min(chunks.len()),
                    whole: false,
                });
            }
        }
        // Big ranges first, so both threads end together.
        jobs.sort_by_key(|j| std::cmp::Reverse(j.chunks.len()));
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let results: Vec<Result<(), CasError>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..WORKERS.min(jobs.len()))
                .map(|_| {
                    scope.spawn(|| {
                        let mut decompressor = zstd::bulk::Decompressor::new()
                            .map_err(CasError::io("start decompressing from", self.dir()))?;
                        let (mut out, mut raw) = (
                            Vec::with_capacity(CHUNK as usize),
                            Vec::with_capacity(CHUNK as usize),
                        );
                        let mut files = HashMap::new();
                        while !failed.load(Ordering::Relaxed) {
                            let Some(job) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) else {
                                break;
                            };
                            let r = self.write_job(
                                manifest,
                                job,
                                dest,
                                Buffers {
                                    catalog: &catalog,
                                    out: &mut out,
                                    raw: &mut raw,
                                    decompressor: &mut decompressor,
                                    files: &mut files,
                                },
                            );
                            if r.is_err() {
                                failed.store(true, Ordering::Relaxed);
                                return r;
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| {
                    w.join().unwrap_or_else(|_| {
                        Err(CasError::io("restore into", dest)(std::io::Error::other(
                            "a writer thread panicked",
                        )))
                    })
                })
                .collect()
        });
        for r in results {
            r?;
        }
        // The big files' modes and mtimes, now that their data is in.
        for e in &manifest.entries {
            if let EntryKind::File { chunks, .. } = &e.kind {
                if chunks.len() > CHUNKS_PER_JOB {
                    let path = abs(&e.path);
                    let file = File::options()
                        .write(true)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&path)
                        .map_err(CasError::io("open", &path))?;
                    finish_file(&file, &path, e)?;
                }
            }
        }
        for e in &manifest.entries {
            if let EntryKind::HardLink { target } = &e.kind {
                let (from, to) = (abs(target), abs(&e.path));
                fs::hard_link(&from, &to).map_err(CasError::io("create hard link", &to))?;
            }
        }
        // Symlinks last, as leaves in directories this restore made, with their own owner and
        // mtime (a symlink's mode is always 0777).
        for e in &manifest.entries {
            if let EntryKind::Symlink { target } = &e.kind {
                let path = abs(&e.path);
                std::os::unix::fs::symlink(os(target), &path)
                    .map_err(CasError::io("create symlink", &path))?;
                own(&path, e.meta.as_ref())?;
                super::xattr::set_mtime_nofollow(&path, e.mtime_ns)
                    .map_err(CasError::io("set the mtime of", &path))?;
            }
        }
        // Directory mtimes and modes, deepest first.
        let mut dirs: Vec<_> = manifest
            .entries
            .iter()
            .filter(|e| matches!(e.kind, EntryKind::Dir))
            .collect();
        dirs.sort_by_key(|e| std::cmp::Reverse(e.path.iter().filter(|b| **b == b'/').count()));
        for e in dirs {
            let path = abs(&e.path);
            own(&path, e.meta.as_ref())?;
            if let Ok(handle) = File::open(&path) {
                // Best effort: a directory's mtime is cosmetic, its mode is not.
                let _ = handle.set_modified(time_of(e.mtime_ns));
            }
            fs::set_permissions(&path, fs::Permissions::from_mode(e.mode & 0o7777))
                .map_err(CasError::io("set the mode of", &path))?;
        }
        // The workspace directory itself, once nothing is created in it any more.
        if let Some(Root {
            mode,
            mtime_ns,
            meta,
        }) = &manifest.root
        {
            own(dest, Some(meta))?;
            fs::set_permissions(dest, fs::Permissions::from_mode(mode & 0o7777))
                .map_err(CasError::io("set the mode of", dest))?;
            super::xattr::set_mtime_nofollow(dest, *mtime_ns)
                .map_err(CasError::io("set the mtime of", dest))?;
        }
        // The index: what each entry is now (a full walk's view of it: what this process could
        // set of the owner, attributes and mode, a symlink's own mtime), and each file's stat
        // fields.
        let mut index = manifest.clone();
        if let Some(root) = &mut index.root {
            let meta = fs::symlink_metadata(dest).map_err(CasError::io("inspect", dest))?;
            root.mode = meta.mode() & 0o7777;
            root.meta = meta_now(dest, &meta)?;
        }
        for e in &mut index.entries {
            let path = dest.join(os(&e.path));
            let meta = fs::symlink_metadata(&path).map_err(CasError::io("inspect", &path))?;
            e.meta = Some(meta_now(&path, &meta)?);
            e.mode = meta.mode() & 0o7777;
            e.mtime_ns = meta
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.mtime_nsec());
            if let EntryKind::File { stat, .. } = &mut e.kind {
                *stat = FileStat {
                    dev: meta.dev(),
                    ino: meta.ino(),
                    ctime_ns: meta
                        .ctime()
                        .saturating_mul(1_000_000_000)
                        .saturating_add(meta.ctime_nsec()),
                };
            }
        }
        Ok(index)
    }

    fn write_job(
        &self,
        manifest: &Manifest,
        job: &Job,
        dest: &Path,
        b: Buffers<'_, '_>,
    ) -> Result<(), CasError> {
        let Buffers {
            catalog,
            out,
            raw,
            decompressor,
            files,
        } = b;
        let e = &manifest.entries[job.entry];
        let EntryKind::File { size, chunks, .. } = &e.kind else {
            return Ok(());
        };
        let path = dest.join(os(&e.path));
        let file = if job.whole {
            create(&path)?
        } else {
            File::options()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(CasError::io("open", &path))?
        };
        for Chunk { offset, len, hash } in &chunks[job.chunks.clone()] {
            self.get(
                catalog,
                hash,
                *len as usize,
                &e.path,
                out,
                raw,
                decompressor,
                files,
            )?;
            if job.whole && *offset == 0 && out.len() as u64 == *size {
                (&file)
                    .write_all(out)
                    .map_err(CasError::io("write", &path))?;
            } else {
                file.write_all_at(out, *offset)
                    .map_err(CasError::io("write", &path))?;
            }
        }
        if job.whole {
            let len = file
                .metadata()
                .map_err(CasError::io("inspect", &path))?
                .len();
            if len != *size {
                file.set_len(*size)
                    .map_err(CasError::io("set the length of", &path))?;
            }
            finish_file(&file, &path, e)?;
        }
        Ok(())
    }
}

/// A writer thread's reusable state.
struct Buffers<'a, 'd> {
    catalog: &'a super::Catalog,
    out: &'a mut Vec<u8>,
    raw: &'a mut Vec<u8>,
    decompressor: &'a mut zstd::bulk::Decompressor<'d>,
    files: &'a mut HashMap<u32, File>,
}

fn create(path: &PathBuf) -> Result<File, CasError> {
    File::options()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(path)
        .map_err(CasError::io("create", path))
}

/// Sets a restored file's owner and extended attributes ([`own`]), then its whole mode (set-id
/// bits included: after the chown, which clears them) and mtime, through its descriptor.
fn finish_file(file: &File, path: &Path, e: &Entry) -> Result<(), CasError> {
    own(path, e.meta.as_ref())?;
    file.set_permissions(fs::Permissions::from_mode(e.mode & 0o7777))
        .map_err(CasError::io("set the mode of", path))?;
    file.set_modified(time_of(e.mtime_ns))
        .map_err(CasError::io("set the mtime of", path))
}

/// Gives `path` (not followed) the owner and extended attributes the snapshot recorded, as far
/// as this process may ([`xattr::apply`](super::xattr::apply)); a version 1 entry has none.
fn own(path: &Path, meta: Option<&Meta>) -> Result<(), CasError> {
    match meta {
        Some(m) => super::xattr::apply(path, m)
            .map_err(CasError::io("set the owner and attributes of", path)),
        None => Ok(()),
    }
}

/// `path`'s owner and extended attributes as they are now, from its `lstat` `meta`.
fn meta_now(path: &Path, meta: &fs::Metadata) -> Result<Meta, CasError> {
    super::xattr::read(path, meta.uid(), meta.gid())
        .map_err(CasError::io("read the extended attributes of", path))
}
