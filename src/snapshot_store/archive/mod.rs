//! The local provider's snapshot archive: a versioned container around a zstd-compressed tar,
//! and the extraction that refuses anything able to write outside the restored workspace.
//!
//! Layout (all integers little-endian; every version shares it):
//!
//! ```text
//! "TBXSNAP\0" | u32 version | u32 header length | header (JSON) | zstd frame of the body
//! ```
//!
//! The body of versions 1 and 2 is a tar stream of the whole workspace (still read; [`pack`]
//! still writes version 2); the body of version 3, written now, is a snapshot manifest whose
//! contents live in the installation's content-addressed store (see
//! [`cas`](crate::snapshot_store::cas)). What follows describes the tar bodies.
//!
//! The magic and the version come first so that a future taskbox can change everything after
//! them, and an older one says "this archive is version N, I read versions 1 to M" instead of
//! misreading it (the firecracker snapshot-format rule). The JSON header names the owning task,
//! installation, generation, sandbox instance and the snapshot operation's nonce, which is how
//! the reconciler lists snapshots without unpacking them and how a repeated snapshot call
//! recognises its own archive (and nothing else). Version 2 (written now) differs from version
//! 1 (still read) in what the body may hold: symlinks pointing anywhere, and sparse files.
//!
//! Packing streams: the directory walk and tar framing run on the calling thread and hand
//! 256 KiB chunks to a compressor thread through a bounded channel, so memory stays bounded and
//! walking and compressing overlap the way `tar | zstd` does. Symlinks are data: every one is
//! stored verbatim (absolute, relative, dangling, pointing outside — a virtualenv's
//! `bin/python -> /usr/bin/python3`, `node_modules/.bin/*`), never followed. Files with several
//! links inside the workspace are stored once plus hard-link entries. A sparse file (fewer
//! blocks allocated than its length) is stored as its data segments plus a map of them, and
//! restored with its holes. An entry that cannot be read (permissions, a path longer than
//! `PATH_MAX`) or cannot be stored (a socket, a fifo, a device) is left out and listed in
//! [`PackStats::omitted`]; the rest of the workspace is still archived.
//!
//! Extraction trusts nothing in the archive and never writes through a symlink. Every entry
//! path must be relative without `..`; parents must be directories created by this extraction
//! (an entry below a symlink of the archive is refused, wherever the symlink points); symlinks
//! are created only after every file and directory, as leaves, so nothing is ever opened through
//! one; a symlink's target is stored as given and never resolved by the extraction; hard links
//! must point at a regular file extracted earlier; devices and fifos are refused. Any refusal
//! fails the whole extraction, naming the entry; the caller extracts into a temporary directory
//! and deletes it on failure, so nothing half-restored ever appears.
//!
//! The code is split by concern: `format` is the container (magic, version, header), `tree`
//! the extraction's model of what it created, `write` the packer and `extract` the extractor.

mod extract;
mod format;
mod tree;
mod write;

pub use self::extract::unpack_body;
pub use self::format::{
    read_prefix, read_prefix_versioned, write_prefix, write_prefix_version, ArchiveHeader, MAGIC,
    MAX_HEADER_LEN, OLDEST_READABLE, TAR_VERSION, VERSION,
};
pub(crate) use self::write::{
    data_segments, fits, inspected, list_sorted, omit, too_long, walk_workspace, Walked,
};
pub use self::write::{pack, Omitted, PackStats, ZSTD_LEVEL};

use std::io;
use std::path::PathBuf;

use crate::snapshot_store::IoContext;

/// A failure to write, read or safely extract an archive.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The file does not start with [`MAGIC`].
    #[error(
        "not a taskbox snapshot archive (it starts with {found:02x?}, expected \"TBXSNAP\\0\")"
    )]
    BadMagic {
        /// The first bytes found.
        found: Vec<u8>,
    },
    /// The format version is not one this taskbox reads.
    #[error(
        "snapshot archive format version {found} is not supported (this taskbox reads versions 1 \
         to {supported}); restore it with the taskbox version that wrote it"
    )]
    UnknownVersion {
        /// The version in the file.
        found: u32,
        /// The newest version this code reads.
        supported: u32,
    },
    /// The header length field is implausible.
    #[error("snapshot archive header is {len} bytes, more than the {max} allowed")]
    HeaderTooLarge {
        /// The length found.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// The file ends inside the fixed-size prefix or the header.
    #[error("snapshot archive is truncated inside its {part}")]
    Truncated {
        /// Which part was cut.
        part: &'static str,
    },
    /// The header is not the JSON we write.
    #[error("snapshot archive header is not valid")]
    Header(#[source] serde_json::Error),
    /// An entry was refused by the extraction rules; nothing is restored.
    #[error("refused archive entry `{entry}`: {reason}")]
    UnsafeEntry {
        /// The entry's path as stored (escaped for printing).
        entry: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// A file-system operation on a named path failed.
    #[error(transparent)]
    Io(#[from] IoContext),
    /// Reading or writing the archive stream itself failed (corrupt data, full disk, ...).
    #[error("cannot {operation}")]
    Stream {
        /// What was being done.
        operation: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

impl ArchiveError {
    pub(super) fn io(
        operation: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> Self {
        IoContext::wrap(operation, path)
    }

    pub(super) fn stream(operation: &'static str) -> impl FnOnce(io::Error) -> Self {
        move |source| ArchiveError::Stream { operation, source }
    }

    /// The underlying I/O error, if this is one (for transient/permanent classification).
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            ArchiveError::Io(IoContext { source, .. }) | ArchiveError::Stream { source, .. } => {
                Some(source)
            }
            _ => None,
        }
    }
}
