//! The snapshot store: a workspace's files kept as a snapshot and given back, on the local file
//! system, for any provider that keeps its snapshots there (today the local one).
//!
//! - [`cas`]: the content-addressed store (format version 3): manifests of every path,
//!   contents by hash in packs shared by every snapshot of an installation, restore, gc, export
//!   as a plain tarball, and the change tracking (`cas::Tracker`, inotify) that lets a snapshot
//!   read only what changed since the restore.
//! - [`archive`]: the snapshot file's versioned header and the older tar bodies (versions 1
//!   and 2) a restore still reads.
//!
//! Its interface is [`cas::Cas`] (pack a workspace into a manifest, restore one, gc) and
//! [`archive`]'s header functions; it knows files and directories, never sandboxes, tasks'
//! lifecycles or the journal. Its failures ([`cas::CasError`], [`archive::ArchiveError`]) carry
//! the path and operation ([`IoContext`]).

pub mod archive;
pub mod cas;

use std::io;
use std::path::PathBuf;

/// A file-system operation on a named path that failed: the payload of the `Io` variant of
/// the local provider's, the archive's and the store's errors alike.
#[derive(Debug, thiserror::Error)]
#[error("cannot {operation} `{path}`")]
pub struct IoContext {
    /// What was being done.
    pub operation: &'static str,
    /// The path it was done to.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: io::Error,
}

impl IoContext {
    /// For `map_err`: the failure to `operation` on `path`, as any error with an `Io` variant.
    pub(crate) fn wrap<E: From<IoContext>>(
        operation: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> E {
        let path = path.into();
        move |source| {
            E::from(IoContext {
                operation,
                path,
                source,
            })
        }
    }
}
