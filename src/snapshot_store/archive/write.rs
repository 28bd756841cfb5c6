//! Packing: the workspace walk into a tar stream, handed in chunks to a zstd compressor thread
//! behind the container prefix.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use super::format::write_prefix;
use super::tree::{os, show};
use super::{ArchiveError, ArchiveHeader};

/// The zstd level: the `zstd` command's default, fast enough to keep up with the walk.
pub const ZSTD_LEVEL: i32 = 3;

/// Size of the chunks handed from the tar walk to the compressor thread.
const CHUNK_BYTES: usize = 256 * 1024;

/// How many chunks may wait for the compressor (bounds memory to about 2 MiB).
const CHUNKS_IN_FLIGHT: usize = 8;

/// The longest path the file system calls accept, with its NUL.
const PATH_MAX: usize = libc::PATH_MAX as usize;

/// Room left for a restore's staging directory being longer than the workspace's own path
/// (`tmp/create.<pid>.<n>.<name>` against `sandboxes/<name>`).
const RESTORE_PATH_SLACK: usize = 128;

/// Something the packer left out of an archive, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Omitted {
    /// The path relative to the workspace (lossily decoded for printing).
    pub path: String,
    /// Why it was left out.
    pub reason: String,
}

/// What [`pack`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackStats {
    /// Entries written (directories, files, links).
    pub entries: u64,
    /// Entries left out: unreadable ones, and sockets, fifos and devices.
    pub omitted: Vec<Omitted>,
}

/// Writes the archive of `workspace` to `out`: the prefix, then the compressed tar. Returns `out`
/// (for the caller to fsync) and what was written and left out.
pub fn pack<W: Write + Send>(
    workspace: &Path,
    header: &ArchiveHeader,
    mut out: W,
) -> Result<(W, PackStats), ArchiveError> {
    write_prefix(&mut out, header)?;
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(CHUNKS_IN_FLIGHT);
    std::thread::scope(|scope| {
        let compressor = scope.spawn(move || compress(rx, out));
        let walked = walk_into_tar(workspace, ChunkWriter::new(tx));
        let compressed = compressor.join().map_err(|_| ArchiveError::Stream {
            operation: "compress the snapshot archive",
            source: io::Error::other("the compressor thread panicked"),
        })?;
        // If the compressor failed, the walk saw a closed channel; the compressor's error is the
        // real cause.
        let out = compressed?;
        let stats = walked?;
        Ok((out, stats))
    })
}

/// The compressor thread: zstd-compresses every chunk into `out` until the walk hangs up.
fn compress<W: Write>(rx: mpsc::Receiver<Vec<u8>>, out: W) -> Result<W, ArchiveError> {
    let write = |e| ArchiveError::stream("write the compressed snapshot archive")(e);
    let mut encoder = zstd::Encoder::new(out, ZSTD_LEVEL).map_err(write)?;
    // The checksum lets a restore detect a corrupt or cut archive instead of restoring garbage.
    encoder.include_checksum(true).map_err(write)?;
    for chunk in rx {
        encoder.write_all(&chunk).map_err(write)?;
    }
    encoder.finish().map_err(write)
}

/// A `Write` that batches bytes into chunks for the compressor thread.
struct ChunkWriter {
    buf: Vec<u8>,
    tx: mpsc::SyncSender<Vec<u8>>,
}

impl ChunkWriter {
    fn new(tx: mpsc::SyncSender<Vec<u8>>) -> Self {
        ChunkWriter {
            buf: Vec::with_capacity(CHUNK_BYTES),
            tx,
        }
    }

    fn send(&mut self) -> io::Result<()> {
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK_BYTES));
        self.tx
            .send(chunk)
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the compressor stopped"))
    }

    /// Sends what is left; dropping the writer afterwards tells the compressor to finish.
    fn finish(mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.send()?;
        }
        Ok(())
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(CHUNK_BYTES - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK_BYTES {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        // Chunks are sent when full or at `finish`; a flush has nothing to force.
        Ok(())
    }
}

/// Reads exactly `remaining` bytes of a file, failing if it shrinks while being archived (a tar
/// entry whose data is shorter than its header says would corrupt the rest of the archive).
struct ExactReader {
    file: File,
    remaining: u64,
}

impl Read for ExactReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        let n = self.file.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file shrank while the snapshot was being taken",
            ));
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}

fn entry_header(meta: &fs::Metadata, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    // Permission bits only: the type is the entry type, and set-id bits are dropped on restore.
    header.set_mode(meta.mode() & 0o7777);
    header.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
    header.set_uid(u64::from(meta.uid()));
    header.set_gid(u64::from(meta.gid()));
    header
}

/// Walks `workspace` (without following symlinks) into a tar stream written to `sink`.
///
/// What cannot be read is left out and listed, so that one unreadable entry never costs the
/// rest of the workspace its snapshot; only a failure to write the archive itself (or to list
/// the workspace's root) fails the walk.
fn walk_into_tar(workspace: &Path, sink: ChunkWriter) -> Result<PackStats, ArchiveError> {
    let mut builder = tar::Builder::new(sink);
    let mut stats = PackStats::default();
    let mut first_link: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    let write = |e| ArchiveError::stream("write the snapshot archive")(e);
    let entries = &mut stats.entries;
    // Depth-first, children in name order: deterministic output, parents before children.
    walk_workspace(
        workspace,
        &mut stats.omitted,
        |dir_abs, e| ArchiveError::io("list directory", dir_abs)(e),
        |omitted, Walked { rel, abs, meta }| {
            let file_type = meta.file_type();
            if file_type.is_dir() {
                let mut header = entry_header(&meta, tar::EntryType::Directory, 0);
                builder
                    .append_data(&mut header, os(&rel), io::empty())
                    .map_err(write)?;
            } else if file_type.is_file() {
                let inode = (meta.dev(), meta.ino());
                if meta.nlink() > 1 {
                    if let Some(first) = first_link.get(&inode) {
                        let mut header = entry_header(&meta, tar::EntryType::Link, 0);
                        builder
                            .append_link(&mut header, os(&rel), os(first))
                            .map_err(write)?;
                        *entries += 1;
                        return Ok(());
                    }
                }
                let file = match File::open(&abs) {
                    Ok(file) => file,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => {
                        omit(omitted, &rel, "read", &e);
                        return Ok(());
                    }
                };
                let archived = if is_sparse(&meta) {
                    append_sparse(&mut builder, &meta, &rel, file)
                } else {
                    let mut header = entry_header(&meta, tar::EntryType::Regular, meta.len());
                    let reader = ExactReader {
                        file,
                        remaining: meta.len(),
                    };
                    builder.append_data(&mut header, os(&rel), reader)
                };
                archived.map_err(|e| {
                    if e.kind() == io::ErrorKind::BrokenPipe {
                        write(e)
                    } else {
                        ArchiveError::io("archive", &abs)(e)
                    }
                })?;
                if meta.nlink() > 1 {
                    first_link.insert(inode, rel);
                }
            } else if file_type.is_symlink() {
                // Verbatim, wherever it points: a symlink is data.
                let target = match fs::read_link(&abs) {
                    Ok(target) => target,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => {
                        omit(omitted, &rel, "read the symlink", &e);
                        return Ok(());
                    }
                };
                let mut header = entry_header(&meta, tar::EntryType::Symlink, 0);
                builder
                    .append_link(&mut header, os(&rel), &target)
                    .map_err(write)?;
            } else {
                omitted.push(Omitted {
                    path: show(&rel),
                    reason: "sockets, fifos and devices are not kept in snapshots".into(),
                });
                return Ok(());
            }
            *entries += 1;
            Ok(())
        },
    )?;
    let sink = builder.into_inner().map_err(write)?;
    sink.finish().map_err(write)?;
    Ok(stats)
}

/// One entry [`walk_workspace`] reached.
pub(crate) struct Walked {
    /// Its path below the workspace, `/`-joined.
    pub(crate) rel: Vec<u8>,
    /// Its path on the host.
    pub(crate) abs: PathBuf,
    /// Its own metadata (a symlink's, not its target's).
    pub(crate) meta: fs::Metadata,
}

/// Walks `workspace` without following symlinks, depth-first, children in name order (the
/// one walk of both snapshot formats): `visit` gets every entry, a directory before what is
/// below it. Entries that vanish meanwhile are skipped; what cannot be listed or inspected,
/// and paths too long to be restored, are left out into `omitted` (`visit` may leave out more
/// there). Only a failure to list the root (`root_err`) or `visit`'s own fails the walk.
pub(crate) fn walk_workspace<E>(
    workspace: &Path,
    omitted: &mut Vec<Omitted>,
    root_err: impl Fn(&Path, io::Error) -> E,
    mut visit: impl FnMut(&mut Vec<Omitted>, Walked) -> Result<(), E>,
) -> Result<(), E> {
    let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(dir) = stack.pop() {
        let dir_abs = workspace.join(os(&dir));
        let entries = match list_sorted(&dir_abs) {
            Ok(entries) => entries,
            // Vanished between listing its parent and now: nothing to keep.
            Err(e) if e.kind() == io::ErrorKind::NotFound && !dir.is_empty() => continue,
            Err(e) if dir.is_empty() => return Err(root_err(&dir_abs, e)),
            Err(e) => {
                // The directory's own entry is kept; its contents are not.
                omit(omitted, &dir, "list the contents of", &e);
                continue;
            }
        };
        let mut subdirs = Vec::new();
        for (name, entry) in entries {
            let rel = if dir.is_empty() {
                name
            } else {
                [dir.as_slice(), b"/", name.as_slice()].concat()
            };
            let abs = workspace.join(os(&rel));
            if too_long(omitted, &rel, &abs) {
                continue;
            }
            // `DirEntry::metadata` does not follow symlinks.
            let Some(meta) = inspected(omitted, &rel, entry.metadata()) else {
                continue;
            };
            if meta.is_dir() {
                subdirs.push(rel.clone());
            }
            visit(omitted, Walked { rel, abs, meta })?;
        }
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(())
}

/// A directory's entries, sorted by name (the walk's order).
pub(crate) fn list_sorted(dir: &Path) -> io::Result<Vec<(Vec<u8>, fs::DirEntry)>> {
    let mut entries = fs::read_dir(dir).and_then(|it| {
        it.map(|e| e.map(|e| (e.file_name().into_vec(), e)))
            .collect::<Result<Vec<_>, _>>()
    })?;
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(entries)
}

/// Whether `rel` is short enough in `workspace` for [`too_long`] to pass it, told without
/// building the path (it may count one byte more than the path has: a no is checked again).
pub(crate) fn fits(workspace: &Path, rel: &[u8]) -> bool {
    workspace.as_os_str().len() + 1 + rel.len() + RESTORE_PATH_SLACK < PATH_MAX
}

/// Whether `abs` is too long to be read by path or restored; if so, leaves it (and what is
/// below it) out with the reason, rather than write a snapshot that cannot be restored.
pub(crate) fn too_long(omitted: &mut Vec<Omitted>, rel: &[u8], abs: &Path) -> bool {
    if abs.as_os_str().len() + RESTORE_PATH_SLACK < PATH_MAX {
        return false;
    }
    omitted.push(Omitted {
        path: show(rel),
        reason: format!(
            "its path is {} bytes long, too close to PATH_MAX ({PATH_MAX}) to be restored",
            abs.as_os_str().len()
        ),
    });
    true
}

/// `rel`'s metadata, as `found` says: `None` if it is gone (the walk moves on) or cannot be
/// inspected (then it is left out of the snapshot, with the reason).
pub(crate) fn inspected(
    omitted: &mut Vec<Omitted>,
    rel: &[u8],
    found: io::Result<fs::Metadata>,
) -> Option<fs::Metadata> {
    match found {
        Ok(meta) => Some(meta),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            omit(omitted, rel, "inspect", &e);
            None
        }
    }
}

/// Leaves `rel` out of a snapshot: it could not be `what`-ed.
pub(crate) fn omit(omitted: &mut Vec<Omitted>, rel: &[u8], what: &str, e: &dyn std::fmt::Display) {
    omitted.push(Omitted {
        path: show(rel),
        reason: format!("cannot {what} it: {e}"),
    });
}

/// The pax record holding a sparse file's length.
pub(super) const SPARSE_SIZE: &str = "TASKBOX.sparse.size";

/// The pax record holding a sparse file's data segments: `offset,length,offset,length,...`.
pub(super) const SPARSE_MAP: &str = "TASKBOX.sparse.map";

/// Whether a regular file has fewer blocks allocated than its length needs (it has holes).
fn is_sparse(meta: &fs::Metadata) -> bool {
    meta.blocks().saturating_mul(512) < meta.len()
}

/// The data segments of `file` (`SEEK_DATA`/`SEEK_HOLE`), up to `len` (the one copy: the
/// content store's walk uses it too).
pub(crate) fn data_segments(file: &File, len: u64) -> io::Result<Vec<(u64, u64)>> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let seek = |offset: u64, whence| -> io::Result<Option<u64>> {
        let offset = libc::off_t::try_from(offset).map_err(io::Error::other)?;
        // SAFETY: `fd` is an open descriptor owned by `file` for the duration of the call;
        // lseek only moves its offset.
        let r = unsafe { libc::lseek(fd, offset, whence) };
        if r < 0 {
            let e = io::Error::last_os_error();
            // ENXIO: no more data after `offset`.
            return if e.raw_os_error() == Some(libc::ENXIO) {
                Ok(None)
            } else {
                Err(e)
            };
        }
        Ok(Some(u64::try_from(r).map_err(io::Error::other)?))
    };
    let mut segments = Vec::new();
    let mut at = 0;
    while at < len {
        let Some(start) = seek(at, libc::SEEK_DATA)? else {
            break;
        };
        if start >= len {
            break;
        }
        let end = seek(start, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        segments.push((start, end - start));
        at = end;
    }
    Ok(segments)
}

/// Appends a sparse file as its data segments behind a pax record of its map.
fn append_sparse<W: Write>(
    builder: &mut tar::Builder<W>,
    meta: &fs::Metadata,
    rel: &[u8],
    mut file: File,
) -> io::Result<()> {
    let len = meta.len();
    let segments = data_segments(&file, len)?;
    let stored: u64 = segments.iter().map(|(_, l)| l).sum();
    let map = segments
        .iter()
        .map(|(o, l)| format!("{o},{l}"))
        .collect::<Vec<_>>()
        .join(",");
    let size = len.to_string();
    builder
        .append_pax_extensions([(SPARSE_SIZE, size.as_bytes()), (SPARSE_MAP, map.as_bytes())])?;
    let mut header = entry_header(meta, tar::EntryType::Regular, stored);
    let reader = SegmentReader {
        file: &mut file,
        segments: segments.into_iter(),
        current: None,
    };
    builder.append_data(&mut header, os(rel), reader)
}

/// Reads the data segments of a file one after the other (exactly their lengths, failing if
/// the file shrinks, as [`ExactReader`] does).
struct SegmentReader<'a, I> {
    file: &'a mut File,
    segments: I,
    current: Option<u64>,
}

impl<I: Iterator<Item = (u64, u64)>> Read for SegmentReader<'_, I> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::io::{Seek, SeekFrom};
        loop {
            match self.current {
                Some(0) | None => match self.segments.next() {
                    None => return Ok(0),
                    Some((offset, len)) => {
                        self.file.seek(SeekFrom::Start(offset))?;
                        self.current = Some(len);
                    }
                },
                Some(remaining) => {
                    let want = buf
                        .len()
                        .min(usize::try_from(remaining).unwrap_or(usize::MAX));
                    let n = self.file.read(&mut buf[..want])?;
                    if n == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the file shrank while the snapshot was being taken",
                        ));
                    }
                    self.current = Some(remaining - n as u64);
                    return Ok(n);
                }
            }
        }
    }
}
