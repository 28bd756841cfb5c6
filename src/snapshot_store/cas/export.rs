//! A manifest as a plain tar stream (`taskbox export-snapshot`): directories, files (holes
//! written as zeros), symlinks verbatim and hard links, with their modes (set-id bits
//! included), owners by number and extended attributes (`SCHILY.xattr.*` pax records), every
//! chunk verified as it is read.

use std::io::{self, Read, Write};

use super::manifest::{Chunk, EntryKind, Manifest};
use super::restore::os;
use super::{Cas, CasError};

/// Writes the tar of `manifest` to `out` (uncompressed; the caller compresses).
pub fn export_tar<W: Write>(cas: &Cas, manifest: &Manifest, out: W) -> Result<W, CasError> {
    let write = |e| CasError::io("write the tarball to", "the output")(e);
    let mut builder = tar::Builder::new(out);
    let mut decompressor = zstd::bulk::Decompressor::new()
        .map_err(CasError::io("start decompressing from", cas.dir()))?;
    let catalog = cas.catalog()?;
    let mut files = std::collections::HashMap::new();
    for e in &manifest.entries {
        let mut header = tar::Header::new_gnu();
        header.set_mode(e.mode & 0o7777);
        header.set_mtime(u64::try_from(e.mtime_ns.div_euclid(1_000_000_000)).unwrap_or(0));
        if let Some(meta) = &e.meta {
            // The owner by number, and the extended attributes (ACLs among them) as the pax
            // records GNU tar and bsdtar read back with `--xattrs` (`--acls`).
            header.set_uid(u64::from(meta.uid));
            header.set_gid(u64::from(meta.gid));
            if !meta.xattrs.is_empty() {
                let records: Vec<(String, &[u8])> = meta
                    .xattrs
                    .iter()
                    .map(|(name, value)| {
                        (
                            format!("SCHILY.xattr.{}", String::from_utf8_lossy(name)),
                            value.as_slice(),
                        )
                    })
                    .collect();
                builder
                    .append_pax_extensions(records.iter().map(|(k, v)| (k.as_str(), *v)))
                    .map_err(write)?;
            }
        }
        match &e.kind {
            EntryKind::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder
                    .append_data(&mut header, os(&e.path), io::empty())
                    .map_err(write)?;
            }
            EntryKind::File { size, chunks, .. } => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(*size);
                let mut reader = ChunkReader {
                    cas,
                    catalog: &catalog,
                    files: &mut files,
                    path: &e.path,
                    size: *size,
                    at: 0,
                    chunks,
                    next: 0,
                    buf: Vec::new(),
                    raw: Vec::new(),
                    buf_at: 0,
                    decompressor: &mut decompressor,
                    error: None,
                };
                let r = builder.append_data(&mut header, os(&e.path), &mut reader);
                if let Some(err) = reader.error.take() {
                    return Err(err);
                }
                r.map_err(write)?;
            }
            EntryKind::Symlink { target } | EntryKind::HardLink { target } => {
                header.set_entry_type(if matches!(e.kind, EntryKind::Symlink { .. }) {
                    tar::EntryType::Symlink
                } else {
                    tar::EntryType::Link
                });
                header.set_size(0);
                builder
                    .append_link(&mut header, os(&e.path), os(target))
                    .map_err(write)?;
            }
        }
    }
    builder.into_inner().map_err(write)
}

/// A file's bytes from its chunks, zeros where it has holes.
struct ChunkReader<'a, 'd> {
    cas: &'a Cas,
    catalog: &'a super::Catalog,
    files: &'a mut std::collections::HashMap<u32, std::fs::File>,
    path: &'a [u8],
    size: u64,
    at: u64,
    chunks: &'a [Chunk],
    next: usize,
    buf: Vec<u8>,
    raw: Vec<u8>,
    buf_at: usize,
    decompressor: &'a mut zstd::bulk::Decompressor<'d>,
    error: Option<CasError>,
}

impl Read for ChunkReader<'_, '_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.buf_at < self.buf.len() {
            let n = out.len().min(self.buf.len() - self.buf_at);
            out[..n].copy_from_slice(&self.buf[self.buf_at..self.buf_at + n]);
            self.buf_at += n;
            self.at += n as u64;
            return Ok(n);
        }
        if self.at >= self.size {
            return Ok(0);
        }
        let hole_end = self.chunks.get(self.next).map_or(self.size, |c| c.offset);
        if self.at < hole_end {
            let n = out
                .len()
                .min(usize::try_from(hole_end - self.at).unwrap_or(usize::MAX));
            out[..n].fill(0);
            self.at += n as u64;
            return Ok(n);
        }
        let chunk = self.chunks[self.next];
        self.next += 1;
        if let Err(e) = self.cas.get(
            self.catalog,
            &chunk.hash,
            chunk.len as usize,
            self.path,
            &mut self.buf,
            &mut self.raw,
            self.decompressor,
            self.files,
        ) {
            let message = e.to_string();
            self.error = Some(e);
            return Err(io::Error::other(message));
        }
        self.buf_at = 0;
        self.read(out)
    }
}
