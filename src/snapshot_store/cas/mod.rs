//! The content-addressed store behind local snapshots (archive format version 3).
//!
//! A snapshot is a *manifest* — the workspace directory's own mode, mtime, owner and extended
//! attributes, and every path of the workspace with its kind, mode (set-id bits included),
//! mtime, owner, extended attributes (POSIX ACLs among them), size,
//! symlink target (verbatim), hard-link target, sparse layout and the *chunks* of its contents —
//! and the contents live once, by hash, in a store shared by every snapshot and task of the
//! installation (`<root>/cas/`):
//!
//! ```text
//! cas/packs/<pid>-<random>.pack    chunks appended by one writer thread of one snapshot
//! cas/packs/<pid>-<random>.idx     its index (hash → offset): the pack's commit
//! cas/lock                         the gc lock (see "gc" below)
//! ```
//!
//! Chunks are stored in *packs*, as git and restic do, rather than a file each: a workspace of
//! 17,000 small files would otherwise cost 17,000 files created, renamed and fsynced per first
//! snapshot, where a pack costs one fsync (and a snapshot writes one pack per thread). A pack is
//! committed by its index, written after the pack is fsynced; the catalog of the store is the
//! union of the committed indexes.
//!
//! **Hash.** BLAKE3 of the chunk's raw bytes (the `blake3` crate: SIMD, the standard in
//! content-addressed tools of the last years), hex in the object's name. Every read recomputes
//! it: a chunk whose bytes do not hash to its name fails the restore with
//! [`CasError::ContentCorrupt`] (the snapshot record is kept), a chunk that is not there at all
//! is [`CasError::ContentMissing`] — the only content failure the provider reports as
//! "snapshot gone".
//!
//! **Chunks.** Fixed 1 MiB chunks at file offsets that are multiples of [`CHUNK`] inside each
//! data segment. Fixed rather than content-defined: the large files of agent workspaces change
//! by appending (logs, build outputs) or in place (SQLite pages, caches), and both touch only the
//! chunks they write; content-defined chunking pays off for insertions in the middle of big
//! files, which workspaces rarely see, and costs a rolling hash over every byte. Fixed offsets
//! also let a restore write every chunk where it belongs with `pwrite`, in any order (so on both
//! cores), and keep holes: a chunk is stored with its file offset and only data segments
//! (`SEEK_DATA`/`SEEK_HOLE`) are chunked, so a sparse file is restored sparse.
//!
//! **Codec.** zstd level 1 (a chunk that does not shrink by 3 % is stored raw, so
//! incompressible blobs cost neither compression nor decompression).
//!
//! **Change detection** works like git's index: a restore records, for every regular file it
//! materialised, the `lstat` fields after it finished (device, inode, size, mtime, ctime) in
//! an *index* next to the workspace (the same encoding as a manifest). The next snapshot of that
//! workspace reuses the chunks of every file whose fields all match, without reading it. An
//! entry whose ctime is not older than the index itself is "racy" (a write within the same
//! timestamp tick would not change it) and is read again.
//!
//! **Durability.** Before the manifest that refers to them becomes visible, the snapshot's
//! packs are fsynced and committed (index written, fsynced, renamed; the directory fsynced), and
//! the manifest is written as the archive always was: temporary file, fsync, rename, fsync of
//! its directory. A crash leaves either the previous manifests or the new one, never a partial
//! one, and never a manifest whose chunks are not durably committed.
//!
//! **gc** deletes the chunks no manifest and no index refers to: under an exclusive `flock` of
//! `cas/lock`, it reads every manifest under `snapshots/` (whatever its installation) and every
//! sandbox's index (*mark*), then deletes the packs with no marked chunk, rewrites the packs
//! that are mostly dead with their marked chunks only (the new pack committed before the old
//! one is deleted), and removes uncommitted packs left by crashed writers (*sweep*). Snapshots and restores hold the same lock *shared* for their whole
//! run, so a chunk written (or found and reused) by a snapshot whose manifest is not yet visible
//! can never be swept: gc waits for it, and marks its manifest once it is there. A manifest that
//! cannot be read stops the sweep (nothing is deleted: gc cannot know what it refers to). A
//! SIGKILL during gc leaves every marked chunk in a committed pack; the OS releases the lock
//! of a killed process.
//!
//! **Tracked changes.** While the engine that restored a workspace lives, a [`Tracker`]
//! (inotify, see `track`) keeps the paths that changed since the restore, and
//! [`Cas::pack_tracked`] looks only at those: the others are taken from the index without a
//! system call, giving the manifest a full walk would. Whenever tracking is not trustworthy
//! the snapshot walks everything (see `track` for when).
//!
//! The code is split by concern: `object` (chunks: hash, codec, packs, catalog), `manifest`
//! (the entries and their binary encoding), `pack` (the workspace walk into a manifest, full or
//! guided by tracked changes), `track` (the inotify watcher), `restore` (a manifest
//! materialised), `gc` and `export` (a manifest as a plain tarball).

mod export;
mod gc;
mod manifest;
mod object;
mod pack;
mod restore;
mod track;
mod xattr;

pub use self::export::export_tar;
pub use self::gc::GcStats;
pub use self::manifest::{Chunk, Entry, EntryKind, FileStat, Manifest, Meta, Root};
pub(crate) use self::object::random_name;
pub use self::object::{Catalog, Hash, CHUNK};
pub use self::pack::{PackedStats, Staged};
pub use self::restore::{Index, IndexStamp};
pub use self::track::{Changes, Limits, Tracked, Tracker, Untracked};

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use crate::snapshot_store::IoContext;

/// A failure of the content store.
#[derive(Debug, thiserror::Error)]
pub enum CasError {
    /// A chunk a manifest refers to is not in the store: the snapshot's contents are gone.
    #[error("content {hash} (of `{entry}`) is missing from the snapshot store (`{path}`)")]
    ContentMissing {
        /// The chunk's hash.
        hash: String,
        /// The entry that needs it (escaped for printing).
        entry: String,
        /// Where it should be.
        path: PathBuf,
    },
    /// A chunk is present but its bytes are not what its name says.
    #[error(
        "content {hash} (of `{entry}`) in `{path}` is corrupt: {reason}; the snapshot is kept \
         but cannot be restored until the file is repaired or an older snapshot is used"
    )]
    ContentCorrupt {
        /// The chunk's hash.
        hash: String,
        /// The entry that needs it.
        entry: String,
        /// The pack (or pack index) file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The manifest's bytes are not a manifest this code reads.
    #[error("snapshot manifest is not valid: {reason}")]
    Manifest {
        /// What is wrong.
        reason: String,
    },
    /// A manifest entry was refused by the restore's rules; nothing is restored.
    #[error("refused manifest entry `{entry}`: {reason}")]
    UnsafeEntry {
        /// The entry's path (escaped for printing).
        entry: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// A file-system operation on a named path failed.
    #[error(transparent)]
    Io(#[from] IoContext),
}

impl CasError {
    pub(crate) fn io(
        operation: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> Self {
        IoContext::wrap(operation, path)
    }

    pub(crate) fn manifest(reason: impl Into<String>) -> Self {
        CasError::Manifest {
            reason: reason.into(),
        }
    }

    /// The underlying I/O error, if this is one (for transient/permanent classification).
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            CasError::Io(io) => Some(&io.source),
            _ => None,
        }
    }
}

/// The content store of one installation (`<root>/cas`).
#[derive(Debug, Clone)]
pub struct Cas {
    dir: PathBuf,
}

impl Cas {
    /// Opens (creating if needed) the store under `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Cas, CasError> {
        let dir = dir.into();
        let packs = dir.join("packs");
        fs::create_dir_all(&packs).map_err(CasError::io("create directory", &packs))?;
        Ok(Cas { dir })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Takes the gc lock shared (snapshots, restores) or exclusive (gc); released on drop.
    pub fn lock(&self, exclusive: bool) -> Result<StoreLock, CasError> {
        let path = self.dir.join("lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(CasError::io("open", &path))?;
        flock(&file, exclusive).map_err(CasError::io("lock", &path))?;
        Ok(StoreLock { _file: file })
    }
}

/// A held `cas/lock` (see the module docs); the OS releases it when the file is closed or the
/// process dies.
#[derive(Debug)]
pub struct StoreLock {
    _file: File,
}

fn flock(file: &File, exclusive: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    loop {
        // SAFETY: `flock` takes a descriptor and flags and touches no memory of ours; `file`
        // is borrowed for the whole call, so its descriptor stays open until it returns.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A path from a manifest, printable and free of control characters.
pub(crate) fn show(path: &[u8]) -> String {
    String::from_utf8_lossy(path).escape_debug().to_string()
}
