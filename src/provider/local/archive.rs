//! The local provider's snapshot archive: a versioned container around a zstd-compressed tar,
//! and the extraction that refuses anything able to write outside the restored workspace.
//!
//! Layout of version 1 (all integers little-endian):
//!
//! ```text
//! "TBXSNAP\0" | u32 version | u32 header length | header (JSON) | zstd frame of a tar stream
//! ```
//!
//! The magic and the version come first so that a future taskbox can change everything after
//! them, and an older one says "this archive is version N, I read version 1" instead of
//! misreading it (the firecracker snapshot-format rule). The JSON header names the owning task
//! and installation, which is how the reconciler lists snapshots without unpacking them.
//!
//! Packing streams: the directory walk and tar framing run on the calling thread and hand
//! 256 KiB chunks to a compressor thread through a bounded channel, so memory stays bounded and
//! walking and compressing overlap the way `tar | zstd` does. Symlinks are stored as symlinks,
//! never followed; files with several links inside the workspace are stored once plus hard-link
//! entries.
//!
//! Extraction trusts nothing in the archive. Every entry path must be relative without `..`;
//! parents must be directories created by this extraction (never a symlink, so nothing is written
//! through one); symlinks are created only after every file and directory, and only if their
//! target — followed through the other symlinks of the archive — stays inside the workspace;
//! hard links must point at a regular file extracted earlier; devices and fifos are refused. Any
//! refusal fails the whole extraction, naming the entry; the caller extracts into a temporary
//! directory and deletes it on failure, so nothing half-restored ever appears.
//!
//! The packer applies the same symlink rule and leaves out (with a warning) what the extractor
//! would refuse — an absolute symlink such as a virtualenv's `bin/python -> /usr/bin/python3`,
//! a socket — because an archive that cannot be restored would lose every file of the task.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, BufRead, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::core::Millis;

/// The first bytes of every archive.
pub const MAGIC: [u8; 8] = *b"TBXSNAP\0";

/// The format version this code writes and reads.
pub const VERSION: u32 = 1;

/// The largest JSON header accepted (it holds a few ids; anything bigger is not ours).
pub const MAX_HEADER_LEN: u32 = 64 * 1024;

/// The zstd level: the `zstd` command's default, fast enough to keep up with the walk.
pub const ZSTD_LEVEL: i32 = 3;

/// How many symlinks one path may go through before it is refused (the kernel's limit).
const MAX_SYMLINK_HOPS: usize = 40;

/// Size of the chunks handed from the tar walk to the compressor thread.
const CHUNK_BYTES: usize = 256 * 1024;

/// How many chunks may wait for the compressor (bounds memory to about 2 MiB).
const CHUNKS_IN_FLIGHT: usize = 8;

/// The archive's self-description, stored uncompressed after the version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveHeader {
    /// The task whose workspace this is.
    pub task_id: String,
    /// The task's snapshot sequence number.
    pub seq: u64,
    /// The installation that took it (for the reconciler's ownership check).
    pub installation_id: String,
    /// When it was taken (the provider's clock).
    pub created_at: Millis,
    /// The sandbox it was taken from.
    pub source_sandbox: String,
}

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
        "snapshot archive format version {found} is not supported (this taskbox reads version \
         {supported}); restore it with the taskbox version that wrote it"
    )]
    UnknownVersion {
        /// The version in the file.
        found: u32,
        /// The version this code reads.
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
    #[error("cannot {operation} `{path}`")]
    Io {
        /// What was being done.
        operation: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
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
    fn io(operation: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| ArchiveError::Io {
            operation,
            path,
            source,
        }
    }

    fn stream(operation: &'static str) -> impl FnOnce(io::Error) -> Self {
        move |source| ArchiveError::Stream { operation, source }
    }

    /// The underlying I/O error, if this is one (for transient/permanent classification).
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            ArchiveError::Io { source, .. } | ArchiveError::Stream { source, .. } => Some(source),
            _ => None,
        }
    }
}

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
    /// Entries left out because a restore would refuse them.
    pub omitted: Vec<Omitted>,
}

// ---------------------------------------------------------------------------------------------
// Container prefix

/// Writes the magic, the version and the header.
pub fn write_prefix<W: Write>(out: &mut W, header: &ArchiveHeader) -> Result<(), ArchiveError> {
    let json = serde_json::to_vec(header).map_err(ArchiveError::Header)?;
    let len = u32::try_from(json.len())
        .ok()
        .filter(|len| *len <= MAX_HEADER_LEN)
        .ok_or(ArchiveError::HeaderTooLarge {
            len: u32::try_from(json.len()).unwrap_or(u32::MAX),
            max: MAX_HEADER_LEN,
        })?;
    let write = ArchiveError::stream("write the snapshot archive header");
    let mut prefix = Vec::with_capacity(16 + json.len());
    prefix.extend_from_slice(&MAGIC);
    prefix.extend_from_slice(&VERSION.to_le_bytes());
    prefix.extend_from_slice(&len.to_le_bytes());
    prefix.extend_from_slice(&json);
    out.write_all(&prefix).map_err(write)
}

/// Reads and checks the magic, the version and the header, leaving `input` at the compressed
/// body.
pub fn read_prefix<R: Read>(input: &mut R) -> Result<ArchiveHeader, ArchiveError> {
    let mut magic = [0u8; 8];
    let n = read_full(input, &mut magic)?;
    if n < magic.len() || magic != MAGIC {
        // A short file that does start like ours is truncated; anything else is not ours.
        if n < magic.len() && magic[..n] == MAGIC[..n] {
            return Err(ArchiveError::Truncated { part: "magic" });
        }
        return Err(ArchiveError::BadMagic {
            found: magic[..n].to_vec(),
        });
    }
    let mut word = [0u8; 4];
    if read_full(input, &mut word)? < 4 {
        return Err(ArchiveError::Truncated { part: "version" });
    }
    let version = u32::from_le_bytes(word);
    if version != VERSION {
        return Err(ArchiveError::UnknownVersion {
            found: version,
            supported: VERSION,
        });
    }
    if read_full(input, &mut word)? < 4 {
        return Err(ArchiveError::Truncated {
            part: "header length",
        });
    }
    let len = u32::from_le_bytes(word);
    if len > MAX_HEADER_LEN {
        return Err(ArchiveError::HeaderTooLarge {
            len,
            max: MAX_HEADER_LEN,
        });
    }
    let mut json = vec![0u8; len as usize];
    if read_full(input, &mut json)? < json.len() {
        return Err(ArchiveError::Truncated { part: "header" });
    }
    serde_json::from_slice(&json).map_err(ArchiveError::Header)
}

/// Reads until `buf` is full or the input ends; returns how much was read.
fn read_full<R: Read>(input: &mut R, buf: &mut [u8]) -> Result<usize, ArchiveError> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ArchiveError::stream("read the snapshot archive header")(e)),
        }
    }
    Ok(filled)
}

// ---------------------------------------------------------------------------------------------
// The tree model shared by packing and extraction

/// What a path in the archive is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Dir,
    File,
    Symlink(Vec<u8>),
}

/// Every path of an archive (relative, `/`-joined, no `.` or `..`) and what it is. Symlink
/// targets are resolved against this model, never against the real file system, so the verdict
/// does not depend on what happens to exist on the host.
#[derive(Debug, Default)]
struct Tree {
    nodes: HashMap<Vec<u8>, Node>,
}

impl Tree {
    fn get(&self, path: &[u8]) -> Option<&Node> {
        self.nodes.get(path)
    }

    fn insert(&mut self, path: Vec<u8>, node: Node) {
        self.nodes.insert(path, node);
    }

    /// Checks that the symlink at `link` (a tree path) with `target` resolves inside the tree's
    /// root, following the tree's other symlinks. A target through a missing path is resolved
    /// lexically from there on, which is the strict reading (the path could be created later).
    fn check_symlink(&self, link: &[u8], target: &[u8]) -> Result<(), String> {
        if target.is_empty() {
            return Err("its target is empty".into());
        }
        if target[0] == b'/' {
            return Err(format!(
                "it points to the absolute path `{}`, outside the workspace",
                show(target)
            ));
        }
        let mut cur: Vec<&[u8]> = split_path(link);
        cur.pop(); // resolution starts in the link's directory
        let mut pending: Vec<&[u8]> = split_path(target).into_iter().rev().collect();
        let mut hops = 0;
        while let Some(component) = pending.pop() {
            match component {
                b"" | b"." => {}
                b".." => {
                    if cur.pop().is_none() {
                        return Err(format!(
                            "its target `{}` resolves outside the workspace",
                            show(target)
                        ));
                    }
                }
                name => {
                    cur.push(name);
                    if let Some(Node::Symlink(next)) = self.get(&cur.join(&b'/')) {
                        hops += 1;
                        if hops > MAX_SYMLINK_HOPS {
                            return Err(format!(
                                "its target `{}` goes through more than {MAX_SYMLINK_HOPS} \
                                 symlinks (a loop)",
                                show(target)
                            ));
                        }
                        if next.first() == Some(&b'/') {
                            return Err(format!(
                                "its target `{}` goes through `{}`, a symlink to the absolute \
                                 path `{}`",
                                show(target),
                                show(&cur.join(&b'/')),
                                show(next)
                            ));
                        }
                        cur.pop();
                        pending.extend(split_path(next).into_iter().rev());
                    }
                }
            }
        }
        Ok(())
    }
}

fn split_path(path: &[u8]) -> Vec<&[u8]> {
    path.split(|b| *b == b'/').collect()
}

/// A path from an archive, printable and free of control characters.
fn show(path: &[u8]) -> String {
    String::from_utf8_lossy(path).escape_debug().to_string()
}

fn os(path: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(path))
}

// ---------------------------------------------------------------------------------------------
// Packing

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
/// Only symlinks go into the tree model: resolving a target consults nothing else, so a
/// directory or file entry would cost a map insert per path for nothing.
fn walk_into_tar(workspace: &Path, sink: ChunkWriter) -> Result<PackStats, ArchiveError> {
    let mut builder = tar::Builder::new(sink);
    let mut tree = Tree::default();
    let mut stats = PackStats::default();
    let mut first_link: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    let mut symlinks: Vec<(Vec<u8>, Vec<u8>, fs::Metadata)> = Vec::new();
    let write = |e| ArchiveError::stream("write the snapshot archive")(e);

    // Depth-first, children in name order: deterministic output, parents before children.
    let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(dir) = stack.pop() {
        let dir_abs = workspace.join(os(&dir));
        let mut entries = match fs::read_dir(&dir_abs) {
            Ok(it) => it
                .map(|e| e.map(|e| (e.file_name().into_vec(), e)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(ArchiveError::io("list directory", &dir_abs))?,
            // Vanished between listing its parent and now: nothing to keep.
            Err(e) if e.kind() == io::ErrorKind::NotFound && !dir.is_empty() => continue,
            Err(e) => return Err(ArchiveError::io("list directory", &dir_abs)(e)),
        };
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut subdirs = Vec::new();
        for (name, entry) in entries {
            let rel = if dir.is_empty() {
                name
            } else {
                [dir.as_slice(), b"/", name.as_slice()].concat()
            };
            let abs = workspace.join(os(&rel));
            // `DirEntry::metadata` does not follow symlinks.
            let meta = match entry.metadata() {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(ArchiveError::io("inspect", &abs)(e)),
            };
            let file_type = meta.file_type();
            if file_type.is_dir() {
                let mut header = entry_header(&meta, tar::EntryType::Directory, 0);
                builder
                    .append_data(&mut header, os(&rel), io::empty())
                    .map_err(write)?;
                subdirs.push(rel);
            } else if file_type.is_file() {
                let inode = (meta.dev(), meta.ino());
                if meta.nlink() > 1 {
                    if let Some(first) = first_link.get(&inode) {
                        let mut header = entry_header(&meta, tar::EntryType::Link, 0);
                        builder
                            .append_link(&mut header, os(&rel), os(first))
                            .map_err(write)?;
                        stats.entries += 1;
                        continue;
                    }
                }
                let file = match File::open(&abs) {
                    Ok(file) => file,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(ArchiveError::io("read", &abs)(e)),
                };
                let mut header = entry_header(&meta, tar::EntryType::Regular, meta.len());
                let reader = ExactReader {
                    file,
                    remaining: meta.len(),
                };
                builder
                    .append_data(&mut header, os(&rel), reader)
                    .map_err(|e| {
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
                let target = fs::read_link(&abs)
                    .map_err(ArchiveError::io("read symlink", &abs))?
                    .into_os_string()
                    .into_vec();
                tree.insert(rel.clone(), Node::Symlink(target.clone()));
                symlinks.push((rel, target, meta));
                continue; // counted when written
            } else {
                stats.omitted.push(Omitted {
                    path: show(&rel),
                    reason: "sockets, fifos and devices are not kept in snapshots".into(),
                });
                continue;
            }
            stats.entries += 1;
        }
        stack.extend(subdirs.into_iter().rev());
    }

    // Symlinks last, judged against the whole tree exactly as the extractor will judge them.
    for (rel, target, meta) in symlinks {
        match tree.check_symlink(&rel, &target) {
            Ok(()) => {
                let mut header = entry_header(&meta, tar::EntryType::Symlink, 0);
                builder
                    .append_link(&mut header, os(&rel), os(&target))
                    .map_err(write)?;
                stats.entries += 1;
            }
            Err(reason) => stats.omitted.push(Omitted {
                path: show(&rel),
                reason: format!("a restore would refuse this symlink: {reason}"),
            }),
        }
    }
    let sink = builder.into_inner().map_err(write)?;
    sink.finish().map_err(write)?;
    Ok(stats)
}

// ---------------------------------------------------------------------------------------------
// Extraction

/// Extracts the compressed tar body (what follows [`read_prefix`]) into `dest`, an empty
/// directory the caller created and deletes if this fails.
pub fn unpack_body<R: BufRead>(input: R, dest: &Path) -> Result<(), ArchiveError> {
    let decoder = zstd::Decoder::with_buffer(input).map_err(ArchiveError::stream(
        "start decompressing the snapshot archive",
    ))?;
    let mut archive = tar::Archive::new(decoder);
    let mut extractor = Extractor::new(dest);
    let read = |e| ArchiveError::stream("read the snapshot archive")(e);
    for entry in archive.entries().map_err(read)? {
        let mut entry = entry.map_err(read)?;
        extractor.entry(&mut entry)?;
    }
    // Read to the end of the zstd frame: this verifies its checksum and catches an archive cut
    // after the tar end marker.
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(read)?;
    extractor.finish()
}

/// A directory whose final mode and mtime are applied once everything inside it exists.
struct PendingDir {
    path: Vec<u8>,
    mode: u32,
    mtime: u64,
}

struct Extractor<'a> {
    dest: &'a Path,
    tree: Tree,
    dirs: Vec<PendingDir>,
    /// Where each directory is in `dirs` (a directory listed again updates its entry).
    dir_index: HashMap<Vec<u8>, usize>,
    symlinks: Vec<(Vec<u8>, Vec<u8>)>,
    buf: Vec<u8>,
}

/// Mode of directories while they are being filled: the owner must be able to write into
/// them even if the archive says read-only.
const FILLING_DIR_MODE: u32 = 0o700;

/// Mode of directories the archive implies (a parent without an entry of its own).
const IMPLIED_DIR_MODE: u32 = 0o755;

impl<'a> Extractor<'a> {
    fn new(dest: &'a Path) -> Self {
        Extractor {
            dest,
            tree: Tree::default(),
            dirs: Vec::new(),
            dir_index: HashMap::new(),
            symlinks: Vec::new(),
            buf: vec![0; 128 * 1024],
        }
    }

    fn abs(&self, path: &[u8]) -> PathBuf {
        self.dest.join(os(path))
    }

    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), ArchiveError> {
        let raw = entry.path_bytes().into_owned();
        let refuse = |reason: String| ArchiveError::UnsafeEntry {
            entry: show(&raw),
            reason,
        };
        let kind = entry.header().entry_type();
        if kind == tar::EntryType::XGlobalHeader {
            return Ok(()); // pax global metadata, nothing to create
        }
        let parts = entry_components(&raw).map_err(|r| refuse(r.into()))?;
        if parts.is_empty() {
            return if kind.is_dir() {
                Ok(()) // the workspace root itself
            } else {
                Err(refuse("it names the workspace root".into()))
            };
        }
        let path = parts.join(&b'/');
        self.make_parents(&parts).map_err(|e| match e {
            Refusal::Rule(reason) => refuse(reason),
            Refusal::Failed(e) => e,
        })?;
        let mode = entry.header().mode().unwrap_or(0o644) & 0o7777;
        let mtime = entry.header().mtime().unwrap_or(0);
        match self.tree.get(&path) {
            Some(Node::Dir) if kind.is_dir() => {
                // A directory listed twice (or implied, then listed): the last mode wins.
                self.set_dir_mode(&path, mode, mtime);
                return Ok(());
            }
            Some(_) => return Err(refuse("it appears twice in the archive".into())),
            None => {}
        }
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let abs = self.abs(&path);
                let mut file = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&abs)
                    .map_err(ArchiveError::io("create", &abs))?;
                copy_buffered(entry, &mut file, &mut self.buf)
                    .map_err(ArchiveError::io("write", &abs))?;
                // Set-id bits never survive a restore: an archive must not mint setuid binaries.
                file.set_permissions(fs::Permissions::from_mode(mode & 0o777))
                    .map_err(ArchiveError::io("set the mode of", &abs))?;
                file.set_modified(UNIX_EPOCH + Duration::from_secs(mtime))
                    .map_err(ArchiveError::io("set the mtime of", &abs))?;
                self.tree.insert(path, Node::File);
            }
            tar::EntryType::Directory => {
                let abs = self.abs(&path);
                make_dir(&abs)?;
                self.tree.insert(path.clone(), Node::Dir);
                self.push_dir(PendingDir { path, mode, mtime });
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                if target.is_empty() {
                    return Err(refuse("the symlink has no target".into()));
                }
                if target.contains(&0) {
                    return Err(refuse("its target contains a NUL byte".into()));
                }
                if target[0] == b'/' {
                    return Err(refuse(format!(
                        "it is a symlink to the absolute path `{}`, outside the workspace",
                        show(&target)
                    )));
                }
                // Created only after all files and directories (see `finish`), so no later entry
                // can be written through it.
                self.tree
                    .insert(path.clone(), Node::Symlink(target.clone()));
                self.symlinks.push((path, target));
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let target_parts = entry_components(&target).map_err(|r| {
                    refuse(format!("its hard-link target `{}`: {r}", show(&target)))
                })?;
                let target_path = target_parts.join(&b'/');
                if self.tree.get(&target_path) != Some(&Node::File) {
                    return Err(refuse(format!(
                        "it is a hard link to `{}`, which is not a regular file extracted before \
                         it",
                        show(&target)
                    )));
                }
                let (from, to) = (self.abs(&target_path), self.abs(&path));
                fs::hard_link(&from, &to).map_err(ArchiveError::io("create hard link", &to))?;
                self.tree.insert(path, Node::File);
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                return Err(refuse(
                    "device and fifo entries are not allowed in a workspace".into(),
                ));
            }
            other => {
                return Err(refuse(format!(
                    "entry type {:?} (`{}`) is not supported",
                    other,
                    other.as_byte().escape_ascii()
                )));
            }
        }
        Ok(())
    }

    /// Creates the missing parents of `parts`, refusing to go through anything but directories
    /// this extraction created.
    fn make_parents(&mut self, parts: &[&[u8]]) -> Result<(), Refusal> {
        for depth in 1..parts.len() {
            let parent = parts[..depth].join(&b'/');
            match self.tree.get(&parent) {
                Some(Node::Dir) => {}
                Some(Node::Symlink(_)) => {
                    return Err(Refusal::Rule(format!(
                        "it would be written through `{}`, a symlink",
                        show(&parent)
                    )))
                }
                Some(Node::File) => {
                    return Err(Refusal::Rule(format!(
                        "its parent `{}` is a file",
                        show(&parent)
                    )))
                }
                None => {
                    make_dir(&self.abs(&parent)).map_err(Refusal::Failed)?;
                    self.tree.insert(parent.clone(), Node::Dir);
                    self.push_dir(PendingDir {
                        path: parent,
                        mode: IMPLIED_DIR_MODE,
                        mtime: 0,
                    });
                }
            }
        }
        Ok(())
    }

    fn push_dir(&mut self, dir: PendingDir) {
        self.dir_index.insert(dir.path.clone(), self.dirs.len());
        self.dirs.push(dir);
    }

    fn set_dir_mode(&mut self, path: &[u8], mode: u32, mtime: u64) {
        if let Some(&i) = self.dir_index.get(path) {
            self.dirs[i].mode = mode;
            self.dirs[i].mtime = mtime;
        }
    }

    /// Creates the symlinks (after checking them all against the complete tree), then applies
    /// directory modes and mtimes deepest first.
    fn finish(self) -> Result<(), ArchiveError> {
        for (path, target) in &self.symlinks {
            self.tree
                .check_symlink(path, target)
                .map_err(|reason| ArchiveError::UnsafeEntry {
                    entry: show(path),
                    reason,
                })?;
        }
        let root = fs::canonicalize(self.dest)
            .map_err(ArchiveError::io("resolve", self.dest.to_path_buf()))?;
        for (path, target) in &self.symlinks {
            let abs = self.abs(path);
            std::os::unix::fs::symlink(os(target), &abs)
                .map_err(ArchiveError::io("create symlink", &abs))?;
        }
        // Belt and braces: the model said every link stays inside; the file system must agree.
        for (path, target) in &self.symlinks {
            if let Ok(real) = fs::canonicalize(self.abs(path)) {
                if !real.starts_with(&root) {
                    return Err(ArchiveError::UnsafeEntry {
                        entry: show(path),
                        reason: format!(
                            "its target `{}` resolves outside the workspace",
                            show(target)
                        ),
                    });
                }
            }
        }
        let mut dirs = self.dirs;
        dirs.sort_by_key(|d| std::cmp::Reverse(d.path.iter().filter(|b| **b == b'/').count()));
        for dir in dirs {
            let abs = self.dest.join(os(&dir.path));
            if dir.mtime > 0 {
                // Best effort: a directory's mtime is cosmetic, its mode is not.
                if let Ok(handle) = File::open(&abs) {
                    let _ = handle.set_modified(UNIX_EPOCH + Duration::from_secs(dir.mtime));
                }
            }
            fs::set_permissions(&abs, fs::Permissions::from_mode(dir.mode & 0o1777))
                .map_err(ArchiveError::io("set the mode of", &abs))?;
        }
        Ok(())
    }
}

/// Why [`Extractor::make_parents`] stopped.
enum Refusal {
    Rule(String),
    Failed(ArchiveError),
}

fn make_dir(abs: &Path) -> Result<(), ArchiveError> {
    fs::DirBuilder::new()
        .mode(FILLING_DIR_MODE)
        .create(abs)
        .map_err(ArchiveError::io("create directory", abs))
}

/// Splits an entry path into its components, refusing absolute paths, `..` and NUL bytes.
/// Empty and `.` components are dropped; an empty result names the root.
fn entry_components(raw: &[u8]) -> Result<Vec<&[u8]>, &'static str> {
    if raw.contains(&0) {
        return Err("its path contains a NUL byte");
    }
    if raw.first() == Some(&b'/') {
        return Err("its path is absolute");
    }
    let mut parts = Vec::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err("its path contains `..`"),
            part => parts.push(part),
        }
    }
    Ok(parts)
}

fn copy_buffered<R: Read, W: Write>(from: &mut R, to: &mut W, buf: &mut [u8]) -> io::Result<()> {
    loop {
        match from.read(buf) {
            Ok(0) => return Ok(()),
            Ok(n) => to.write_all(&buf[..n])?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(entries: &[(&str, Option<&str>)]) -> Tree {
        let mut tree = Tree::default();
        for (path, link) in entries {
            let node = match link {
                Some(t) => Node::Symlink(t.as_bytes().to_vec()),
                None if path.ends_with('/') => Node::Dir,
                None => Node::File,
            };
            tree.insert(path.trim_end_matches('/').as_bytes().to_vec(), node);
        }
        tree
    }

    #[test]
    fn symlinks_inside_the_tree_are_accepted() {
        let t = tree(&[
            ("a/", None),
            ("a/b/", None),
            ("a/b/f", None),
            ("a/up", Some("..")),
            ("a/b/l", Some("../../a/b/f")),
        ]);
        assert_eq!(t.check_symlink(b"a/b/l", b"../../a/b/f"), Ok(()));
        assert_eq!(t.check_symlink(b"a/up", b".."), Ok(()));
        assert_eq!(t.check_symlink(b"x", b"a/up/a/b/f"), Ok(()));
        assert_eq!(t.check_symlink(b"x", b"dangling/file"), Ok(()));
    }

    #[test]
    fn symlinks_leaving_the_tree_are_refused() {
        let t = tree(&[
            ("a/", None),
            ("a/up", Some("..")),
            ("a/abs", Some("/etc")),
            ("loop1", Some("loop2")),
            ("loop2", Some("loop1")),
        ]);
        assert!(t.check_symlink(b"l", b"/etc").is_err());
        assert!(t.check_symlink(b"l", b"..").is_err());
        assert!(t.check_symlink(b"a/l", b"../..").is_err());
        assert!(t.check_symlink(b"l", b"").is_err());
        // Lexically `a/up/..` is `a`, but `a/up` is the root, so this is the root's parent.
        assert!(t.check_symlink(b"l", b"a/up/..").is_err());
        assert!(t.check_symlink(b"l", b"a/up/a/up/../..").is_err());
        assert!(t.check_symlink(b"l", b"a/abs/passwd").is_err());
        assert!(t.check_symlink(b"l", b"loop1").is_err());
        // A missing component is resolved lexically, strictly.
        assert!(t.check_symlink(b"l", b"missing/../..").is_err());
    }

    #[test]
    fn entry_paths_are_normalised_or_refused() {
        assert_eq!(
            entry_components(b"./a//b/./c/").unwrap(),
            vec![&b"a"[..], b"b", b"c"]
        );
        assert!(entry_components(b"./").unwrap().is_empty());
        assert!(entry_components(b"/etc/passwd").is_err());
        assert!(entry_components(b"a/../../x").is_err());
        assert!(entry_components(b"..").is_err());
        assert!(entry_components(b"a\0b").is_err());
    }

    #[test]
    fn prefix_round_trips_and_rejects_other_versions() {
        let header = ArchiveHeader {
            task_id: "t1".into(),
            seq: 3,
            installation_id: "inst".into(),
            created_at: 42,
            source_sandbox: "taskbox-t1-g1".into(),
        };
        let mut buf = Vec::new();
        write_prefix(&mut buf, &header).unwrap();
        assert_eq!(read_prefix(&mut buf.as_slice()).unwrap(), header);

        let mut newer = buf.clone();
        newer[8..12].copy_from_slice(&2u32.to_le_bytes());
        assert!(matches!(
            read_prefix(&mut newer.as_slice()),
            Err(ArchiveError::UnknownVersion {
                found: 2,
                supported: 1
            })
        ));
        assert!(matches!(
            read_prefix(&mut &b"PK\x03\x04rest"[..]),
            Err(ArchiveError::BadMagic { .. })
        ));
        assert!(matches!(
            read_prefix(&mut &buf[..buf.len() - 1]),
            Err(ArchiveError::Truncated { part: "header" })
        ));
        assert!(matches!(
            read_prefix(&mut &buf[..4]),
            Err(ArchiveError::Truncated { part: "magic" })
        ));
    }
}
