//! Chunks: their hash, their codec, and the packs they are stored in.
//!
//! A pack is `"TBXPACK\0" | u32 version (1) | records`, a record `32-byte hash | u8 codec |
//! u32 stored length | u32 raw length | body` (codec 0 = the raw bytes, 1 = one zstd frame of
//! them). Its index `<name>.idx` (`"TBXPIDX\0" | u32 version | entries of hash, u64 body
//! offset, u32 stored length, u8 codec`) is written, fsynced and renamed into place only after
//! the pack is fsynced: a pack without its index is not committed and holds nothing anyone
//! refers to.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{Cas, CasError};

/// Chunk size: files are cut at multiples of this offset inside each data segment.
pub const CHUNK: u64 = 1 << 20;

const CODEC_RAW: u8 = 0;
const CODEC_ZSTD: u8 = 1;

/// zstd level of chunks: the fastest, as `zstd -1`.
const LEVEL: i32 = 1;

/// A BLAKE3 hash of a chunk's raw bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hash(pub [u8; 32]);

impl Hash {
    /// The hash of `data`.
    pub fn of(data: &[u8]) -> Hash {
        Hash(*blake3::hash(data).as_bytes())
    }

    /// Lowercase hex, as in object names.
    pub fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(DIGITS[usize::from(b >> 4)] as char);
            s.push(DIGITS[usize::from(b & 15)] as char);
        }
        s
    }

    /// Parses 64 lowercase hex digits.
    pub fn from_hex(hex: &str) -> Option<Hash> {
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            let digit = |c: u8| match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            };
            out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(Hash(out))
    }
}

/// Where a chunk is: which pack, where its record's body starts, how it is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Location {
    /// Index into [`Catalog::packs`].
    pack: u32,
    /// Offset of the stored body in the pack.
    offset: u64,
    /// Length of the stored body.
    stored: u32,
    codec: u8,
}

/// Every committed chunk of the store: the packs whose index is in place, and where each hash
/// is. Read at the start of a snapshot, a restore or a gc (under the store's lock).
#[derive(Debug, Default)]
pub struct Catalog {
    packs: Vec<String>,
    map: HashMap<Hash, Location, ahash::RandomState>,
    /// Packs whose index could not be read, and why: their chunks are unknown, so a chunk not
    /// found is not "definitely missing" while there are any, and gc keeps these packs.
    unreadable: Vec<(String, String)>,
}

impl Catalog {
    /// Whether `hash` is stored.
    pub fn contains(&self, hash: &Hash) -> bool {
        self.map.contains_key(hash)
    }

    /// How many chunks are stored.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The committed packs' names.
    pub(super) fn packs(&self) -> &[String] {
        &self.packs
    }

    /// The packs whose index is there but unreadable.
    pub(super) fn unreadable(&self) -> impl Iterator<Item = &str> {
        self.unreadable.iter().map(|(name, _)| name.as_str())
    }

    /// The chunks of pack `i` (its name's position in [`Catalog::packs`]).
    pub(super) fn entries_of(&self, i: usize) -> impl Iterator<Item = (&Hash, &Location)> {
        self.map.iter().filter(move |(_, l)| l.pack as usize == i)
    }
}

impl Location {
    pub(super) fn stored(&self) -> u32 {
        self.stored
    }
}

const PACK_MAGIC: [u8; 8] = *b"TBXPACK\0";
const IDX_MAGIC: [u8; 8] = *b"TBXPIDX\0";
const PACK_VERSION: u32 = 1;
/// hash | codec | stored length | raw length
const RECORD_HEADER: usize = 32 + 1 + 4 + 4;
/// hash | offset | stored | codec
const IDX_ENTRY: usize = 32 + 8 + 4 + 1;

/// 64 random bits from `/dev/urandom`, as 16 lowercase hex digits (snapshot nonces and pack
/// names).
pub(crate) fn random_name() -> io::Result<String> {
    let mut bytes = [0u8; 8];
    fs::File::open("/dev/urandom").and_then(|mut f| io::Read::read_exact(&mut f, &mut bytes))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Cas {
    /// Reads every committed pack index (a pack whose `.idx` is not there yet is a writer's,
    /// or a crashed writer's, and holds nothing anyone refers to).
    pub fn catalog(&self) -> Result<Catalog, CasError> {
        let dir = self.packs_dir();
        let mut catalog = Catalog::default();
        let mut names: Vec<String> = Vec::new();
        for entry in fs::read_dir(&dir).map_err(CasError::io("list", &dir))? {
            let entry = entry.map_err(CasError::io("list", &dir))?;
            if let Some(name) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".idx"))
            {
                names.push(name.to_string());
            }
        }
        names.sort();
        for name in names {
            let path = dir.join(format!("{name}.idx"));
            let data = fs::read(&path).map_err(CasError::io("read", &path))?;
            let problem = if data.len() < 12 || data[..8] != IDX_MAGIC {
                Some("it does not start with its magic")
            } else if data[8..12] != PACK_VERSION.to_le_bytes() {
                Some("it is of a format version this taskbox does not read")
            } else if (data.len() - 12) % IDX_ENTRY != 0 {
                Some("it is truncated")
            } else {
                None
            };
            if let Some(problem) = problem {
                tracing::warn!(path = %path.display(), problem,
                    "unreadable pack index: its chunks are unknown (kept; restores that need them fail)");
                catalog
                    .unreadable
                    .push((name, format!("`{}`: {problem}", path.display())));
                continue;
            }
            let body = &data[12..];
            let pack = catalog.packs.len() as u32;
            for e in body.chunks(IDX_ENTRY) {
                let mut hash = [0u8; 32];
                hash.copy_from_slice(&e[..32]);
                let offset = u64::from_le_bytes(e[32..40].try_into().expect("8 bytes"));
                let stored = u32::from_le_bytes(e[40..44].try_into().expect("4 bytes"));
                catalog.map.entry(Hash(hash)).or_insert(Location {
                    pack,
                    offset,
                    stored,
                    codec: e[44],
                });
            }
            catalog.packs.push(name);
        }
        Ok(catalog)
    }

    pub(super) fn packs_dir(&self) -> PathBuf {
        self.dir().join("packs")
    }

    /// Reads the chunk `hash` (of `len` bytes) into `out`, verifying its hash. `entry` names
    /// the file that needs it, for the error; `files` caches open packs.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn get(
        &self,
        catalog: &Catalog,
        hash: &Hash,
        len: usize,
        entry: &[u8],
        out: &mut Vec<u8>,
        raw: &mut Vec<u8>,
        decompressor: &mut zstd::bulk::Decompressor<'_>,
        files: &mut HashMap<u32, fs::File>,
    ) -> Result<(), CasError> {
        let missing = |path: PathBuf| CasError::ContentMissing {
            hash: hash.to_hex(),
            entry: super::show(entry),
            path,
        };
        let Some(loc) = catalog.map.get(hash) else {
            // Definitely missing only if every index could be read.
            if let Some((_, why)) = catalog.unreadable.first() {
                return Err(CasError::ContentCorrupt {
                    hash: hash.to_hex(),
                    entry: super::show(entry),
                    path: self.packs_dir(),
                    reason: format!(
                        "it is in no readable pack index, and one is unreadable ({why})"
                    ),
                });
            }
            return Err(missing(self.packs_dir()));
        };
        let path = self
            .packs_dir()
            .join(format!("{}.pack", catalog.packs[loc.pack as usize]));
        let corrupt = |reason: String| CasError::ContentCorrupt {
            hash: hash.to_hex(),
            entry: super::show(entry),
            path: path.clone(),
            reason,
        };
        let file = match files.entry(loc.pack) {
            std::collections::hash_map::Entry::Occupied(f) => f.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => match fs::File::open(&path) {
                Ok(f) => v.insert(f),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(missing(path)),
                Err(e) => return Err(CasError::io("open", &path)(e)),
            },
        };
        raw.clear();
        raw.resize(RECORD_HEADER + loc.stored as usize, 0);
        let record_start = loc.offset - RECORD_HEADER as u64;
        file.read_exact_at(raw, record_start).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                corrupt("the pack ends before the chunk does".into())
            } else {
                CasError::io("read", &path)(e)
            }
        })?;
        if raw[..32] != hash.0 {
            return Err(corrupt("the pack holds another chunk at its place".into()));
        }
        let body = &raw[RECORD_HEADER..];
        out.clear();
        match loc.codec {
            CODEC_RAW => out.extend_from_slice(body),
            CODEC_ZSTD => {
                out.reserve(len);
                decompressor
                    .decompress_to_buffer(body, out)
                    .map_err(|e| corrupt(format!("it does not decompress ({e})")))?;
            }
            other => return Err(corrupt(format!("unknown codec {other}"))),
        }
        if out.len() != len {
            return Err(corrupt(format!(
                "it holds {} bytes, the manifest says {len}",
                out.len()
            )));
        }
        if Hash::of(out) != *hash {
            return Err(corrupt("its bytes do not match its hash".into()));
        }
        Ok(())
    }
}

/// A pack being written by one thread of one snapshot (or by a gc's repack): chunk records
/// appended to `<name>.pack`; committed by [`PackWriter::commit`] (fsync, then the index
/// written, fsynced and renamed into place).
pub(super) struct PackWriter {
    name: String,
    path: PathBuf,
    file: io::BufWriter<fs::File>,
    offset: u64,
    entries: Vec<(Hash, u64, u32, u8)>,
    /// Bytes written (the pack's size).
    pub(super) bytes: u64,
}

impl PackWriter {
    pub(super) fn create(cas: &Cas) -> Result<PackWriter, CasError> {
        let dir = cas.packs_dir();
        let name = format!(
            "{}-{}",
            std::process::id(),
            random_name().map_err(CasError::io("read random bytes for", &dir))?
        );
        let path = dir.join(format!("{name}.pack"));
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(CasError::io("create", &path))?;
        let mut file = io::BufWriter::with_capacity(1 << 20, file);
        file.write_all(&PACK_MAGIC)
            .and_then(|()| file.write_all(&PACK_VERSION.to_le_bytes()))
            .map_err(CasError::io("write", &path))?;
        Ok(PackWriter {
            name,
            path,
            file,
            offset: 12,
            entries: Vec::new(),
            bytes: 12,
        })
    }

    /// Appends `data` (compressed unless that saves under 3 %); its hash is `hash`.
    pub(super) fn append(
        &mut self,
        hash: &Hash,
        data: &[u8],
        compressor: &mut zstd::bulk::Compressor<'_>,
    ) -> Result<(), CasError> {
        let compressed = compressor
            .compress(data)
            .map_err(CasError::io("compress content for", &self.path))?;
        let (codec, body) = if compressed.len() as u64 * 100 < data.len() as u64 * 97 {
            (CODEC_ZSTD, compressed.as_slice())
        } else {
            (CODEC_RAW, data)
        };
        self.append_stored(hash, codec, body, data.len() as u32)
    }

    /// Appends a chunk already in its stored form (a gc's repack).
    pub(super) fn append_stored(
        &mut self,
        hash: &Hash,
        codec: u8,
        body: &[u8],
        raw_len: u32,
    ) -> Result<(), CasError> {
        let mut header = [0u8; RECORD_HEADER];
        header[..32].copy_from_slice(&hash.0);
        header[32] = codec;
        header[33..37].copy_from_slice(&(body.len() as u32).to_le_bytes());
        header[37..41].copy_from_slice(&raw_len.to_le_bytes());
        self.file
            .write_all(&header)
            .and_then(|()| self.file.write_all(body))
            .map_err(CasError::io("write", &self.path))?;
        let offset = self.offset + RECORD_HEADER as u64;
        self.entries.push((*hash, offset, body.len() as u32, codec));
        self.offset = offset + body.len() as u64;
        self.bytes = self.offset;
        Ok(())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Chunks appended.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Makes the pack durable and commits it: fsync the pack, write its index to a temporary
    /// file, fsync it, rename it into place. The caller fsyncs the packs directory once for all
    /// the packs it commits. An empty pack is removed instead.
    pub(super) fn commit(self) -> Result<u64, CasError> {
        let file = self
            .file
            .into_inner()
            .map_err(|e| CasError::io("write", &self.path)(e.into_error()))?;
        if self.entries.is_empty() {
            drop(file);
            fs::remove_file(&self.path).map_err(CasError::io("remove", &self.path))?;
            return Ok(0);
        }
        file.sync_all().map_err(CasError::io("fsync", &self.path))?;
        let dir = self.path.parent().expect("a pack has a parent");
        let idx = dir.join(format!("{}.idx", self.name));
        let tmp = dir.join(format!("{}.idx.tmp", self.name));
        let mut data = Vec::with_capacity(12 + self.entries.len() * IDX_ENTRY);
        data.extend_from_slice(&IDX_MAGIC);
        data.extend_from_slice(&PACK_VERSION.to_le_bytes());
        for (hash, offset, stored, codec) in &self.entries {
            data.extend_from_slice(&hash.0);
            data.extend_from_slice(&offset.to_le_bytes());
            data.extend_from_slice(&stored.to_le_bytes());
            data.push(*codec);
        }
        let mut f = fs::File::create(&tmp).map_err(CasError::io("create", &tmp))?;
        f.write_all(&data)
            .and_then(|()| f.sync_all())
            .map_err(CasError::io("write", &tmp))?;
        fs::rename(&tmp, &idx).map_err(CasError::io("move into place", &idx))?;
        Ok(self.bytes)
    }

    /// Removes an uncommitted pack (a failed snapshot).
    pub(super) fn abandon(self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Reads a stored chunk's body as it is in its pack (for a gc's repack).
pub(super) fn read_stored(
    cas: &Cas,
    catalog: &Catalog,
    loc: &Location,
    out: &mut Vec<u8>,
) -> Result<(u8, u32), CasError> {
    let path = cas
        .packs_dir()
        .join(format!("{}.pack", catalog.packs[loc.pack as usize]));
    let file = fs::File::open(&path).map_err(CasError::io("open", &path))?;
    out.clear();
    out.resize(RECORD_HEADER + loc.stored as usize, 0);
    file.read_exact_at(out, loc.offset - RECORD_HEADER as u64)
        .map_err(CasError::io("read", &path))?;
    let raw_len = u32::from_le_bytes(out[37..41].try_into().expect("4 bytes"));
    out.drain(..RECORD_HEADER);
    Ok((loc.codec, raw_len))
}

/// A new zstd compressor at the chunk level.
pub(super) fn compressor() -> io::Result<zstd::bulk::Compressor<'static>> {
    zstd::bulk::Compressor::new(LEVEL)
}

/// fsyncs a directory (a rename in it becomes durable).
pub(super) fn sync_path(dir: &Path) -> Result<(), CasError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(CasError::io("fsync directory", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn hashes_round_trip_through_hex() {
        let h = Hash::of(b"hello");
        assert_eq!(Hash::from_hex(&h.to_hex()), Some(h));
        assert_eq!(Hash::from_hex("zz"), None);
        assert_eq!(Hash::from_hex(&"A".repeat(64)), None);
    }
}
