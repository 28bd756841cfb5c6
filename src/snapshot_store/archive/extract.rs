//! Extraction: the compressed tar body unpacked into an empty directory under the rules in the
//! [module docs](super), with symlinks created last (as leaves, targets verbatim) and directory
//! modes applied deepest first.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufRead, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use super::tree::{os, show, Node, Tree};
use super::write::{SPARSE_MAP, SPARSE_SIZE};
use super::ArchiveError;

/// Extracts the compressed tar body (what follows [`read_prefix`](super::read_prefix)) into
/// `dest`, an empty directory the caller created and deletes if this fails.
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
                let sparse = sparse_map(entry).map_err(&refuse)?;
                let abs = self.abs(&path);
                let mut file = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .mode(0o600)
                    .open(&abs)
                    .map_err(ArchiveError::io("create", &abs))?;
                match sparse {
                    None => copy_buffered(entry, &mut file, &mut self.buf)
                        .map_err(ArchiveError::io("write", &abs))?,
                    Some((size, segments)) => {
                        // Only the data segments are written; the rest stays a hole.
                        for (offset, len) in segments {
                            file.seek(SeekFrom::Start(offset))
                                .map_err(ArchiveError::io("seek in", &abs))?;
                            copy_buffered(
                                &mut Read::by_ref(entry).take(len),
                                &mut file,
                                &mut self.buf,
                            )
                            .map_err(ArchiveError::io("write", &abs))?;
                        }
                        file.set_len(size)
                            .map_err(ArchiveError::io("set the length of", &abs))?;
                    }
                }
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
                // Stored verbatim, wherever it points: it is created only after all files and
                // directories (see `finish`), and no entry may be created below it, so nothing
                // is ever written through it.
                self.tree.insert(path.clone(), Node::Symlink);
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
                if self.tree.get(&target_path) != Some(Node::File) {
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
                Some(Node::Symlink) => {
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

    /// Creates the symlinks (leaves in directories this extraction made, so none is created
    /// through another), then applies directory modes and mtimes deepest first.
    fn finish(self) -> Result<(), ArchiveError> {
        for (path, target) in &self.symlinks {
            let abs = self.abs(path);
            std::os::unix::fs::symlink(os(target), &abs)
                .map_err(ArchiveError::io("create symlink", &abs))?;
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

/// A sparse file's length and its data segments `(offset, length)`.
type SparseMap = (u64, Vec<(u64, u64)>);

/// The sparse map of a regular entry, if its pax records carry one: the file's length and its
/// data segments, which must be ordered, disjoint, inside the file and add up to the entry's
/// stored size.
fn sparse_map<R: Read>(entry: &mut tar::Entry<'_, R>) -> Result<Option<SparseMap>, String> {
    let stored = entry.header().size().map_err(|e| e.to_string())?;
    let Some(pax) = entry.pax_extensions().map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let (mut size, mut map) = (None, None);
    for ext in pax {
        let ext = ext.map_err(|e| e.to_string())?;
        let value = || {
            ext.value()
                .map_err(|_| format!("its pax record `{}` is not UTF-8", show(ext.key_bytes())))
        };
        match ext.key_bytes() {
            k if k == SPARSE_SIZE.as_bytes() => size = Some(value()?.to_string()),
            k if k == SPARSE_MAP.as_bytes() => map = Some(value()?.to_string()),
            _ => {}
        }
    }
    let (size, map) = match (size, map) {
        (None, None) => return Ok(None),
        (Some(size), Some(map)) => (size, map),
        _ => return Err("its sparse map is incomplete".into()),
    };
    let bad = || format!("its sparse map `{size}` / `{map}` is malformed");
    let size: u64 = size.parse().map_err(|_| bad())?;
    let numbers = if map.is_empty() {
        Vec::new()
    } else {
        map.split(',')
            .map(|n| n.parse::<u64>().map_err(|_| bad()))
            .collect::<Result<Vec<_>, _>>()?
    };
    if numbers.len() % 2 != 0 {
        return Err(bad());
    }
    let segments: Vec<(u64, u64)> = numbers.chunks(2).map(|p| (p[0], p[1])).collect();
    let (mut end, mut total) = (0u64, 0u64);
    for &(offset, len) in &segments {
        let seg_end = offset.checked_add(len).ok_or_else(bad)?;
        if offset < end || seg_end > size {
            return Err(bad());
        }
        end = seg_end;
        total = total.checked_add(len).ok_or_else(bad)?;
    }
    if total != stored {
        return Err(bad());
    }
    Ok(Some((size, segments)))
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
}
