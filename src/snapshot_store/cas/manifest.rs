//! A snapshot's manifest: every path of the workspace and what it is, and its binary encoding
//! (the body of a version 3 archive, zstd-compressed; also the encoding of a workspace's index).
//!
//! Encoding (little-endian), version 2: `u64 MARK_V2 | u8 root? [u32 mode | i64 mtime (ns) |
//! meta] | u64 entry count`, then per entry `u8 kind | u32 path length | path | u32 mode | i64
//! mtime (ns) | u8 meta? [meta]` followed by, for a file, `u64 size | u64 dev | u64 inode | i64
//! ctime (ns) | u32 chunk count | chunks (u64 offset | u32 length | 32-byte hash)`, for a
//! symlink or a hard link `u32 length | target`; `meta` is `u32 uid | u32 gid | u32 count |
//! (u32 length | name | u32 length | value)*`. Version 1 (written before owners and extended
//! attributes were kept) has no mark, no root and no meta: it starts with the entry count, which
//! can never be `MARK_V2`, so both are read, and a reader of version 1 alone refuses version 2
//! (its count is more than the bytes could hold). Entries come parents first (a depth-first
//! walk), a hard link after the file it names.

use super::object::Hash;
use super::CasError;

/// A snapshot: the workspace's entries, parents before children.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    /// The workspace directory itself (`None` in a version 1 manifest: left as the restore
    /// makes it).
    pub root: Option<Root>,
    /// The entries, in walk order.
    pub entries: Vec<Entry>,
}

/// The workspace directory's own mode, mtime, owner and attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    /// Permission bits (`0o7777`).
    pub mode: u32,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Owner and extended attributes.
    pub meta: Meta,
}

/// A path's owner and extended attributes (POSIX ACLs among them, as `system.posix_acl_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta {
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Extended attributes, `(name, value)`, sorted by name.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// One path of the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Relative to the workspace, `/`-joined, no `.` or `..` (checked again on restore).
    pub path: Vec<u8>,
    /// Permission bits (`0o7777`, set-id and sticky bits included).
    pub mode: u32,
    /// Modification time, nanoseconds since the epoch (a symlink's own).
    pub mtime_ns: i64,
    /// Owner and extended attributes (`None` in a version 1 manifest: restored as the
    /// restoring user, with none).
    pub meta: Option<Meta>,
    /// What it is.
    pub kind: EntryKind,
}

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// A directory.
    Dir,
    /// A regular file: its length, where its stat fields were when it was read (for change
    /// detection) and its chunks (the data segments; the rest of the length is holes).
    File {
        /// Length in bytes.
        size: u64,
        /// The fields change detection compares.
        stat: FileStat,
        /// Its data, by file offset.
        chunks: Vec<Chunk>,
    },
    /// A symlink, its target verbatim (never resolved).
    Symlink {
        /// The target as stored.
        target: Vec<u8>,
    },
    /// A hard link to a regular file earlier in the manifest.
    HardLink {
        /// The path of that file.
        target: Vec<u8>,
    },
}

/// The `lstat` fields change detection compares besides size and mtime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileStat {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Status change time, nanoseconds since the epoch.
    pub ctime_ns: i64,
}

/// A piece of a file's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Where it goes in the file.
    pub offset: u64,
    /// Its length (at most [`CHUNK`](super::CHUNK)).
    pub len: u32,
    /// Its content's hash.
    pub hash: Hash,
}

/// Each entry's kind, as its first byte in the encoding.
mod tag {
    pub(super) const DIR: u8 = 0;
    pub(super) const FILE: u8 = 1;
    pub(super) const SYMLINK: u8 = 2;
    pub(super) const HARDLINK: u8 = 3;
}

/// Longest path or link target a manifest may hold (PATH_MAX).
const MAX_PATH: u32 = 4096;

/// The first word of a version 2 encoding (a version 1 encoding starts with its entry count).
const MARK_V2: u64 = u64::MAX - 1;

/// Most extended attributes one entry may carry, and the largest value (`XATTR_SIZE_MAX`).
const MAX_XATTRS: u32 = 4096;
const MAX_XATTR_VALUE: u32 = 64 * 1024;

fn encode_meta(out: &mut Vec<u8>, m: &Meta) {
    out.extend_from_slice(&m.uid.to_le_bytes());
    out.extend_from_slice(&m.gid.to_le_bytes());
    out.extend_from_slice(&(m.xattrs.len() as u32).to_le_bytes());
    for (name, value) in &m.xattrs {
        bytes(out, name);
        bytes(out, value);
    }
}

impl Manifest {
    /// The encoding (uncompressed).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * 108 + 64);
        out.extend_from_slice(&MARK_V2.to_le_bytes());
        match &self.root {
            Some(root) => {
                out.push(1);
                out.extend_from_slice(&root.mode.to_le_bytes());
                out.extend_from_slice(&root.mtime_ns.to_le_bytes());
                encode_meta(&mut out, &root.meta);
            }
            None => out.push(0),
        }
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for e in &self.entries {
            let kind = match &e.kind {
                EntryKind::Dir => tag::DIR,
                EntryKind::File { .. } => tag::FILE,
                EntryKind::Symlink { .. } => tag::SYMLINK,
                EntryKind::HardLink { .. } => tag::HARDLINK,
            };
            out.push(kind);
            bytes(&mut out, &e.path);
            out.extend_from_slice(&e.mode.to_le_bytes());
            out.extend_from_slice(&e.mtime_ns.to_le_bytes());
            match &e.meta {
                Some(m) => {
                    out.push(1);
                    encode_meta(&mut out, m);
                }
                None => out.push(0),
            }
            match &e.kind {
                EntryKind::Dir => {}
                EntryKind::File { size, stat, chunks } => {
                    out.extend_from_slice(&size.to_le_bytes());
                    out.extend_from_slice(&stat.dev.to_le_bytes());
                    out.extend_from_slice(&stat.ino.to_le_bytes());
                    out.extend_from_slice(&stat.ctime_ns.to_le_bytes());
                    out.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
                    for c in chunks {
                        out.extend_from_slice(&c.offset.to_le_bytes());
                        out.extend_from_slice(&c.len.to_le_bytes());
                        out.extend_from_slice(&c.hash.0);
                    }
                }
                EntryKind::Symlink { target } | EntryKind::HardLink { target } => {
                    bytes(&mut out, target)
                }
            }
        }
        out
    }

    /// Decodes [`Manifest::encode`]'s output, refusing anything malformed (lengths past the
    /// end, unknown kinds, chunks out of order or past the file's end, trailing bytes).
    pub fn decode(data: &[u8]) -> Result<Manifest, CasError> {
        let mut r = Reader { data, at: 0 };
        let mut count = r.u64()?;
        let v2 = count == MARK_V2;
        let mut root = None;
        if v2 {
            if r.flag()? {
                root = Some(Root {
                    mode: r.u32()?,
                    mtime_ns: r.i64()?,
                    meta: r.meta()?,
                });
            }
            count = r.u64()?;
        }
        // Every entry takes at least 17 bytes: a count larger than that is a lie.
        if count > (data.len() / 17) as u64 {
            return Err(CasError::manifest(format!(
                "it claims {count} entries in {} bytes",
                data.len()
            )));
        }
        let mut entries = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let kind = r.u8()?;
            let path = r.bytes()?;
            let mode = r.u32()?;
            let mtime_ns = r.i64()?;
            let meta = if v2 && r.flag()? {
                Some(r.meta()?)
            } else {
                None
            };
            let kind = match kind {
                tag::DIR => EntryKind::Dir,
                tag::FILE => {
                    let size = r.u64()?;
                    let stat = FileStat {
                        dev: r.u64()?,
                        ino: r.u64()?,
                        ctime_ns: r.i64()?,
                    };
                    let n = r.u32()?;
                    if u64::from(n) > (data.len() - r.at) as u64 / 44 {
                        return Err(CasError::manifest("a file claims more chunks than fit"));
                    }
                    let mut chunks = Vec::with_capacity(n as usize);
                    let mut end = 0u64;
                    for _ in 0..n {
                        let offset = r.u64()?;
                        let len = r.u32()?;
                        let hash = Hash(r.array()?);
                        let chunk_end = offset.checked_add(u64::from(len));
                        if offset < end
                            || chunk_end.is_none_or(|e| e > size)
                            || u64::from(len) > super::CHUNK
                        {
                            return Err(CasError::manifest(format!(
                                "the chunks of `{}` overlap or run past its end",
                                super::show(&path)
                            )));
                        }
                        end = chunk_end.unwrap_or(size);
                        chunks.push(Chunk { offset, len, hash });
                    }
                    EntryKind::File { size, stat, chunks }
                }
                tag::SYMLINK => EntryKind::Symlink { target: r.bytes()? },
                tag::HARDLINK => EntryKind::HardLink { target: r.bytes()? },
                other => return Err(CasError::manifest(format!("unknown entry kind {other}"))),
            };
            entries.push(Entry {
                path,
                mode,
                mtime_ns,
                meta,
                kind,
            });
        }
        if r.at != data.len() {
            return Err(CasError::manifest("trailing bytes after the last entry"));
        }
        Ok(Manifest { root, entries })
    }

    /// Whether `self` and `other` hold the same files: the same entries with the same modes,
    /// times, owners, attributes and contents. The stat fields change detection keeps (inode,
    /// ctime) are left out, since a restore gives every file new ones.
    pub fn same_content(&self, other: &Manifest) -> bool {
        let kind_eq = |a: &EntryKind, b: &EntryKind| match (a, b) {
            (
                EntryKind::File {
                    size: sa,
                    chunks: ca,
                    ..
                },
                EntryKind::File {
                    size: sb,
                    chunks: cb,
                    ..
                },
            ) => sa == sb && ca == cb,
            (a, b) => a == b,
        };
        self.root == other.root
            && self.entries.len() == other.entries.len()
            && self.entries.iter().zip(&other.entries).all(|(a, b)| {
                a.path == b.path
                    && a.mode == b.mode
                    && a.mtime_ns == b.mtime_ns
                    && a.meta == b.meta
                    && kind_eq(&a.kind, &b.kind)
            })
    }

    /// Every chunk hash the manifest refers to.
    pub fn hashes(&self) -> impl Iterator<Item = &Hash> {
        self.entries
            .iter()
            .flat_map(|e| match &e.kind {
                EntryKind::File { chunks, .. } => chunks.as_slice(),
                _ => &[],
            })
            .map(|c| &c.hash)
    }
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], CasError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.data.len())
            .ok_or_else(|| CasError::manifest("it ends inside an entry"))?;
        let s = &self.data[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CasError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, CasError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, CasError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, CasError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, CasError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    fn flag(&mut self) -> Result<bool, CasError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(CasError::manifest(format!("a flag byte is {other}"))),
        }
    }

    fn meta(&mut self) -> Result<Meta, CasError> {
        let (uid, gid, n) = (self.u32()?, self.u32()?, self.u32()?);
        if n > MAX_XATTRS {
            return Err(CasError::manifest(format!(
                "an entry claims {n} extended attributes"
            )));
        }
        let mut xattrs = Vec::new();
        for _ in 0..n {
            let name = self.bytes()?;
            let len = self.u32()?;
            if len > MAX_XATTR_VALUE {
                return Err(CasError::manifest(format!(
                    "an extended attribute of {len} bytes is larger than the kernel allows"
                )));
            }
            xattrs.push((name, self.take(len as usize)?.to_vec()));
        }
        Ok(Meta { uid, gid, xattrs })
    }

    fn bytes(&mut self) -> Result<Vec<u8>, CasError> {
        let n = self.u32()?;
        if n > MAX_PATH {
            return Err(CasError::manifest(format!(
                "a path or target of {n} bytes is longer than PATH_MAX"
            )));
        }
        Ok(self.take(n as usize)?.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn manifests_round_trip_and_truncations_are_refused() {
        let meta = Meta {
            uid: 1234,
            gid: 5678,
            xattrs: vec![
                (b"system.posix_acl_access".to_vec(), vec![2, 0, 0, 0, 1, 0]),
                (b"user.note".to_vec(), b"kept".to_vec()),
            ],
        };
        let m = Manifest {
            root: Some(Root {
                mode: 0o2775,
                mtime_ns: 9,
                meta: meta.clone(),
            }),
            entries: vec![
                Entry {
                    path: b"d".to_vec(),
                    mode: 0o2775,
                    mtime_ns: 5,
                    meta: Some(meta.clone()),
                    kind: EntryKind::Dir,
                },
                Entry {
                    path: b"d/f".to_vec(),
                    mode: 0o4755,
                    mtime_ns: -3,
                    meta: None,
                    kind: EntryKind::File {
                        size: 10,
                        stat: FileStat {
                            dev: 1,
                            ino: 2,
                            ctime_ns: 3,
                        },
                        chunks: vec![Chunk {
                            offset: 2,
                            len: 8,
                            hash: Hash::of(b"x"),
                        }],
                    },
                },
                Entry {
                    path: b"l".to_vec(),
                    mode: 0o777,
                    mtime_ns: 0,
                    meta: Some(Meta::default()),
                    kind: EntryKind::Symlink {
                        target: b"/etc".to_vec(),
                    },
                },
            ],
        };
        let enc = m.encode();
        assert_eq!(Manifest::decode(&enc).unwrap(), m);
        for cut in 0..enc.len() {
            assert!(Manifest::decode(&enc[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = enc.clone();
        longer.push(0);
        assert!(Manifest::decode(&longer).is_err());
    }

    /// A manifest written before owners and attributes were kept (version 1: no mark, no root,
    /// no meta) still reads, with none of them.
    #[test]
    fn a_version_1_manifest_still_reads() {
        let mut v1 = Vec::new();
        v1.extend_from_slice(&1u64.to_le_bytes());
        v1.push(tag::SYMLINK);
        bytes(&mut v1, b"l");
        v1.extend_from_slice(&0o777u32.to_le_bytes());
        v1.extend_from_slice(&7i64.to_le_bytes());
        bytes(&mut v1, b"target");
        let m = Manifest::decode(&v1).expect("a version 1 manifest");
        assert_eq!(m.root, None);
        assert_eq!(
            m.entries,
            [Entry {
                path: b"l".to_vec(),
                mode: 0o777,
                mtime_ns: 7,
                meta: None,
                kind: EntryKind::Symlink {
                    target: b"target".to_vec()
                },
            }]
        );
    }
}
