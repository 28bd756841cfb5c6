//! The container around the compressed tar: the magic, the format version and the JSON header
//! that names the archive's task and installation, readable without decompressing anything.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use super::ArchiveError;
use crate::core::Millis;

/// The first bytes of every archive.
pub const MAGIC: [u8; 8] = *b"TBXSNAP\0";

/// The format version snapshots are written in. Version 3's body is a manifest pointing into
/// the content-addressed store ([`cas`](crate::snapshot_store::cas)) instead of a tar of the
/// whole workspace; versions 1 and 2 (tar bodies) are still read.
pub const VERSION: u32 = 3;

/// The newest version whose body is a zstd-compressed tar ([`pack`](super::pack) writes it).
/// Version 2 stores every symlink verbatim (version 1 left out the ones pointing outside the
/// workspace) and keeps the holes of sparse files (`TASKBOX.sparse.*` pax records before the
/// entry); its header also names the generation, the sandbox instance and the operation's
/// nonce, and the working directory.
pub const TAR_VERSION: u32 = 2;

/// The oldest format version this code still reads (version 1 bodies are a subset of
/// version 2's, and its header lacks only the optional fields).
pub const OLDEST_READABLE: u32 = 1;

/// The largest JSON header accepted (it holds a few ids; anything bigger is not ours).
pub const MAX_HEADER_LEN: u32 = 64 * 1024;

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
    /// The generation of that sandbox (`None` in version 1 archives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The instance of that sandbox (unique per creation; `None` in version 1 archives): a
    /// repeated snapshot call matches an archive only if it was taken from the same instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The random nonce of the snapshot operation that wrote it, also in its file name, so
    /// that no two operations ever share an archive (`None` in version 1 archives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// The working directory of the next command, relative to the workspace (`None` in
    /// version 1 archives: the root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// Writes the magic, the tar body's version ([`TAR_VERSION`]) and the header.
pub fn write_prefix<W: Write>(out: &mut W, header: &ArchiveHeader) -> Result<(), ArchiveError> {
    write_prefix_version(out, header, TAR_VERSION)
}

/// Writes the magic, `version` and the header.
pub fn write_prefix_version<W: Write>(
    out: &mut W,
    header: &ArchiveHeader,
    version: u32,
) -> Result<(), ArchiveError> {
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
    prefix.extend_from_slice(&version.to_le_bytes());
    prefix.extend_from_slice(&len.to_le_bytes());
    prefix.extend_from_slice(&json);
    out.write_all(&prefix).map_err(write)
}

/// Reads and checks the magic, the version and the header, leaving `input` at the compressed
/// body.
pub fn read_prefix<R: Read>(input: &mut R) -> Result<ArchiveHeader, ArchiveError> {
    read_prefix_versioned(input).map(|(_, header)| header)
}

/// [`read_prefix`], also answering the format version (which says what the body is).
pub fn read_prefix_versioned<R: Read>(input: &mut R) -> Result<(u32, ArchiveHeader), ArchiveError> {
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
    if !(OLDEST_READABLE..=VERSION).contains(&version) {
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
    let header = serde_json::from_slice(&json).map_err(ArchiveError::Header)?;
    Ok((version, header))
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

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn prefix_round_trips_and_rejects_other_versions() {
        let header = ArchiveHeader {
            task_id: "t1".into(),
            seq: 3,
            installation_id: "inst".into(),
            created_at: 42,
            source_sandbox: "taskbox-t1-g1".into(),
            generation: Some(1),
            instance: Some("i".into()),
            nonce: Some("0123456789abcdef".into()),
            cwd: None,
        };
        let mut buf = Vec::new();
        write_prefix(&mut buf, &header).unwrap();
        assert_eq!(read_prefix(&mut buf.as_slice()).unwrap(), header);

        let mut newer = buf.clone();
        newer[8..12].copy_from_slice(&4u32.to_le_bytes());
        assert!(matches!(
            read_prefix(&mut newer.as_slice()),
            Err(ArchiveError::UnknownVersion {
                found: 4,
                supported: 3
            })
        ));
        // Version 1 is still read; its header has none of the optional fields.
        let v1 = br#"{"task_id":"t1","seq":3,"installation_id":"inst","created_at":42,"source_sandbox":"taskbox-t1-g1"}"#;
        let mut old = Vec::new();
        old.extend_from_slice(&MAGIC);
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&(v1.len() as u32).to_le_bytes());
        old.extend_from_slice(v1);
        let read = read_prefix(&mut old.as_slice()).unwrap();
        assert_eq!((read.seq, read.generation, read.nonce), (3, None, None));
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
