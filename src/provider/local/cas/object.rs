//! Chunks: their hash, their on-disk codec, and writing and reading them.
//!
//! An object file is `"TBXC" | u8 version (1) | u8 codec | body`, codec 0 = the raw bytes,
//! 1 = one zstd frame of them.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Cas, CasError};

/// Chunk size: files are cut at multiples of this offset inside each data segment.
pub const CHUNK: u64 = 1 << 20;

const OBJECT_MAGIC: [u8; 4] = *b"TBXC";
const OBJECT_VERSION: u8 = 1;
const CODEC_RAW: u8 = 0;
const CODEC_ZSTD: u8 = 1;
const PREFIX_LEN: usize = 6;

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

/// Distinguishes the temporaries of one process's writers.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// What [`Cas::put`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Put {
    /// The object was already there.
    Present,
    /// The object was written (this many bytes on disk); it still needs to be made durable.
    Written(u64),
}

impl Cas {
    /// Stores `data` under `hash` unless an object of that name is already there. The object
    /// is written to a temporary name and renamed, so a crash never leaves a partial object
    /// under a real name. The caller holds the lock shared.
    pub(super) fn put(
        &self,
        hash: &Hash,
        data: &[u8],
        compressor: &mut zstd::bulk::Compressor<'_>,
    ) -> Result<Put, CasError> {
        let path = self.object_path(hash);
        if fs::symlink_metadata(&path).is_ok() {
            return Ok(Put::Present);
        }
        let dir = path.parent().expect("an object path has a parent");
        let compressed = compressor
            .compress(data)
            .map_err(CasError::io("compress content for", &path))?;
        let (codec, body) = if compressed.len() as u64 * 100 < data.len() as u64 * 97 {
            (CODEC_ZSTD, compressed.as_slice())
        } else {
            (CODEC_RAW, data)
        };
        let tmp = dir.join(format!(
            "{}.{}.{}.tmp",
            &hash.to_hex()[..16],
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let open = || {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)
        };
        let mut file = match open() {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(dir).map_err(CasError::io("create directory", dir))?;
                open().map_err(CasError::io("create", &tmp))?
            }
            Err(e) => return Err(CasError::io("create", &tmp)(e)),
        };
        let written = (|| {
            file.write_all(&[
                OBJECT_MAGIC[0],
                OBJECT_MAGIC[1],
                OBJECT_MAGIC[2],
                OBJECT_MAGIC[3],
                OBJECT_VERSION,
                codec,
            ])?;
            file.write_all(body)?;
            drop(file);
            fs::rename(&tmp, &path)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(CasError::io("write content", &path)(e));
        }
        Ok(Put::Written((PREFIX_LEN + body.len()) as u64))
    }

    /// Reads the chunk `hash` (of `len` bytes) into `out` (cleared first), verifying its hash.
    /// `entry` names the file that needs it, for the error.
    pub(super) fn get(
        &self,
        hash: &Hash,
        len: usize,
        entry: &[u8],
        out: &mut Vec<u8>,
        raw: &mut Vec<u8>,
        decompressor: &mut zstd::bulk::Decompressor<'_>,
    ) -> Result<(), CasError> {
        let path = self.object_path(hash);
        let corrupt = |reason: String| CasError::ContentCorrupt {
            hash: hash.to_hex(),
            entry: super::show(entry),
            path: path.clone(),
            reason,
        };
        raw.clear();
        match fs::File::open(&path) {
            Ok(mut file) => {
                io::Read::read_to_end(&mut file, raw).map_err(CasError::io("read", &path))?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(CasError::ContentMissing {
                    hash: hash.to_hex(),
                    entry: super::show(entry),
                    path,
                })
            }
            Err(e) => return Err(CasError::io("open", &path)(e)),
        };
        if raw.len() < PREFIX_LEN || raw[..4] != OBJECT_MAGIC {
            return Err(corrupt("it does not start with the object magic".into()));
        }
        if raw[4] != OBJECT_VERSION {
            return Err(corrupt(format!(
                "object format version {} is not supported (this taskbox reads version \
                 {OBJECT_VERSION})",
                raw[4]
            )));
        }
        out.clear();
        match raw[5] {
            CODEC_RAW => out.extend_from_slice(&raw[PREFIX_LEN..]),
            CODEC_ZSTD => {
                out.reserve(len);
                decompressor
                    .decompress_to_buffer(&raw[PREFIX_LEN..], out)
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

/// A new zstd compressor at the chunk level.
pub(super) fn compressor() -> io::Result<zstd::bulk::Compressor<'static>> {
    zstd::bulk::Compressor::new(LEVEL)
}

/// Makes the objects `written` durable: each fsynced (with its directory) when there are few,
/// one `syncfs` of the store's file system when there are many.
pub(super) fn make_durable(cas: &Cas, written: &[Hash]) -> Result<(), CasError> {
    const FEW: usize = 64;
    if written.is_empty() {
        return Ok(());
    }
    if written.len() <= FEW {
        let mut dirs = std::collections::BTreeSet::new();
        for hash in written {
            let path = cas.object_path(hash);
            fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(CasError::io("fsync", &path))?;
            dirs.insert(path.parent().expect("an object has a parent").to_path_buf());
        }
        for dir in dirs {
            sync_path(&dir)?;
        }
        return Ok(());
    }
    let dir = cas.dir().join("objects");
    let handle = fs::File::open(&dir).map_err(CasError::io("open", &dir))?;
    use std::os::fd::AsRawFd;
    // SAFETY: `syncfs` takes a descriptor and touches no memory of ours; `handle` stays open for
    // the whole call.
    let rc = unsafe { libc::syncfs(handle.as_raw_fd()) };
    if rc != 0 {
        return Err(CasError::io("sync the file system of", &dir)(
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

fn sync_path(dir: &Path) -> Result<(), CasError> {
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
