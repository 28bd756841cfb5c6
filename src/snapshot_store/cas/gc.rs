//! Content gc: mark what the manifests and indexes refer to, then sweep the packs (see the
//! module docs for why a concurrent snapshot's content is never swept).
//!
//! A pack none of whose chunks is marked is deleted (its index first, so a crash leaves an
//! uncommitted pack, which the next gc removes). A pack with some chunks marked is kept while
//! at least half of its bytes are live; below that its live chunks are copied into a new pack,
//! committed (durable) before the old one is deleted, so a crash at any point leaves every live
//! chunk in at least one committed pack. Packs without an index (a crashed or failed writer) and
//! index temporaries are removed: no writer is running, since writers hold the lock shared.

use std::collections::HashSet;
use std::fs;
use std::io;

use super::object::{read_stored, sync_path, Hash, PackWriter};
use super::{Cas, CasError};

/// What a content gc did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcStats {
    /// Chunks some manifest or index refers to.
    pub marked: u64,
    /// Chunks removed.
    pub swept: u64,
    /// Bytes of packs removed (less the bytes repacked).
    pub bytes_swept: u64,
    /// Packs rewritten with their live chunks only.
    pub repacked: u64,
    /// Uncommitted packs and temporaries of crashed writers removed.
    pub temporaries: u64,
}

impl Cas {
    /// Takes the store's lock exclusively, calls `mark` for every hash still referred to
    /// (it reads every manifest and index; an error stops the gc before anything is removed),
    /// then sweeps (see the module docs).
    pub fn gc(
        &self,
        mark: impl FnOnce(&mut HashSet<Hash>) -> Result<(), CasError>,
    ) -> Result<GcStats, CasError> {
        let _lock = self.lock(true)?;
        let mut live = HashSet::new();
        mark(&mut live)?;
        let catalog = self.catalog()?;
        let mut stats = GcStats {
            marked: live.len() as u64,
            ..GcStats::default()
        };
        let dir = self.packs_dir();
        let remove = |path: &std::path::Path| match fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CasError::io("remove", path)(e)),
        };
        // Uncommitted packs and temporaries.
        // A pack whose index is unreadable counts as committed: what it holds is unknown.
        let committed: HashSet<&str> = catalog
            .packs()
            .iter()
            .map(String::as_str)
            .chain(catalog.unreadable())
            .collect();
        for entry in fs::read_dir(&dir).map_err(CasError::io("list", &dir))? {
            let entry = entry.map_err(CasError::io("list", &dir))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let stale = name.ends_with(".tmp")
                || name
                    .strip_suffix(".pack")
                    .is_some_and(|stem| !committed.contains(stem));
            if stale {
                remove(&entry.path())?;
                stats.temporaries += 1;
            }
        }
        let mut buf = Vec::new();
        let mut changed = false;
        for (i, name) in catalog.packs().iter().enumerate() {
            let pack = dir.join(format!("{name}.pack"));
            let idx = dir.join(format!("{name}.idx"));
            let (mut live_bytes, mut dead_bytes, mut dead) = (0u64, 0u64, 0u64);
            let mut keep = Vec::new();
            for (hash, loc) in catalog.entries_of(i) {
                if live.contains(hash) {
                    live_bytes += u64::from(loc.stored());
                    keep.push((*hash, *loc));
                } else {
                    dead_bytes += u64::from(loc.stored());
                    dead += 1;
                }
            }
            if dead == 0 || (!keep.is_empty() && live_bytes >= dead_bytes) {
                continue;
            }
            if !keep.is_empty() {
                let mut writer = PackWriter::create(self)?;
                for (hash, loc) in &keep {
                    let (codec, raw_len) = read_stored(self, &catalog, loc, &mut buf)?;
                    writer.append_stored(hash, codec, &buf, raw_len)?;
                }
                writer.commit()?;
                sync_path(&dir)?;
                stats.repacked += 1;
            }
            // The index first: from then on the pack is uncommitted.
            remove(&idx)?;
            remove(&pack)?;
            stats.swept += dead;
            stats.bytes_swept += dead_bytes;
            changed = true;
        }
        if changed {
            sync_path(&dir)?;
        }
        Ok(stats)
    }
}
