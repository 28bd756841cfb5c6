//! Content gc: mark what the manifests and indexes refer to, sweep the rest (see the module
//! docs for why a concurrent snapshot's content is never swept).

use std::collections::HashSet;
use std::fs;
use std::io;

use super::object::Hash;
use super::{Cas, CasError};

/// What a content gc did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcStats {
    /// Objects some manifest or index refers to.
    pub marked: u64,
    /// Objects removed.
    pub swept: u64,
    /// Bytes those took.
    pub bytes_swept: u64,
    /// Temporaries of crashed writers removed.
    pub temporaries: u64,
}

impl Cas {
    /// Takes the store's lock exclusively, calls `mark` for every hash still referred to
    /// (it reads every manifest and index; an error stops the gc before anything is removed),
    /// then removes every object not marked and every temporary left by a writer (none is
    /// running: they hold the lock shared).
    pub fn gc(
        &self,
        mark: impl FnOnce(&mut HashSet<Hash>) -> Result<(), CasError>,
    ) -> Result<GcStats, CasError> {
        let _lock = self.lock(true)?;
        let mut live = HashSet::new();
        mark(&mut live)?;
        let mut stats = GcStats {
            marked: live.len() as u64,
            ..GcStats::default()
        };
        let objects = self.dir().join("objects");
        for fan in fs::read_dir(&objects).map_err(CasError::io("list", &objects))? {
            let fan = fan.map_err(CasError::io("list", &objects))?;
            let dir = fan.path();
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotADirectory => continue,
                Err(e) => return Err(CasError::io("list", &dir)(e)),
            };
            for entry in entries {
                let entry = entry.map_err(CasError::io("list", &dir))?;
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                let doomed = if name.ends_with(".tmp") {
                    stats.temporaries += 1;
                    true
                } else if let Some(hash) = Hash::from_hex(name) {
                    if live.contains(&hash) {
                        false
                    } else {
                        stats.swept += 1;
                        stats.bytes_swept += entry.metadata().map(|m| m.len()).unwrap_or(0);
                        true
                    }
                } else {
                    false // not ours: leave it
                };
                if doomed {
                    let path = entry.path();
                    match fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(CasError::io("remove", &path)(e)),
                    }
                }
            }
        }
        Ok(stats)
    }
}
