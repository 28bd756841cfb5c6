//! The disk reserve: space the store keeps for itself on the data dir's filesystem, so that one
//! task filling the disk does not stop every other task (issue 31).
//!
//! Every task's workspace, the journal (`taskbox.db`) and the snapshot store (`local/cas`) share
//! the data dir's filesystem. A command that writes until the disk is full (`dd if=/dev/zero`)
//! would otherwise leave the store unable to journal anything, and every task would fail. So the
//! data dir holds a file of `terminal.store_reserve_mb` MB, preallocated (`fallocate`, so its
//! blocks are really taken), named [`FILE_NAME`]. Where a journal commit finds the disk full
//! (`SQLITE_FULL`), the SQLite store [`release`](Reserve::release)s it and commits once more:
//! the other tasks then commit, snapshot and restore in the space it gave back. Nothing
//! committed is ever at stake: a commit that failed wrote nothing (SQLite rolled it back).
//!
//! The reserve comes back by itself once there is room again: [`Reserve::ensure`] re-creates it
//! when at least twice its size is free (so that re-making it never takes the last of the space
//! a task just freed), and the SQLite store calls it after every journal commit while the file
//! is missing — a `stat`, and a `statvfs` when it is missing, cheap beside the commit.
//!
//! What it is not: a quota. A task may fill what the reserve gave back, too; the reserve buys
//! the store one more round of writes at a time, not a bound on a workspace. (A per-workspace
//! quota needs project quotas, which the filesystems taskbox's data dir sits on here — ext4
//! without the `project` feature, tmpfs — do not offer; see `docs/backends.md#isolation`.)

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The reserve's file name in the data dir.
pub const FILE_NAME: &str = "reserve";

/// The data dir's disk reserve (a path and a size; the file is the only state, so every holder
/// of one — this process's store, another process's on the same data dir — sees the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserve {
    path: PathBuf,
    bytes: u64,
}

/// What [`Reserve::ensure`] found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// The file was there, whole.
    Kept,
    /// The file was made now.
    Made,
    /// The file is missing and there is not room enough to make it (less than twice its size
    /// free).
    NoRoom(Space),
    /// `terminal.store_reserve_mb = 0`: no reserve (a file left from before is removed).
    Off,
}

/// A filesystem's space as `statvfs` reports it to an unprivileged writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes a writer may still use.
    pub available: u64,
    /// The filesystem's size in bytes.
    pub total: u64,
}

impl fmt::Display for Space {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} free of {}", mb(self.available), mb(self.total))
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / (1024.0 * 1024.0))
}

/// Why the reserve could not be made.
#[derive(Debug, thiserror::Error)]
#[error("could not make the disk reserve {} ({} bytes): {source}", path.display(), bytes)]
pub struct ReserveError {
    /// The reserve's file.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// What the filesystem said.
    #[source]
    pub source: io::Error,
}

impl Reserve {
    /// The reserve of the data dir `data_dir`, `mb` MB (0: none).
    pub fn new(data_dir: &Path, mb: u32) -> Reserve {
        Reserve {
            path: data_dir.join(FILE_NAME),
            bytes: u64::from(mb) << 20,
        }
    }

    /// The reserve's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its size in bytes (0: no reserve).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Makes sure the reserve is held: keeps the file when it is there at its size, makes it when
    /// it is missing and at least twice its size is free, and says which.
    pub fn ensure(&self) -> Result<Held, ReserveError> {
        let err = |source| ReserveError {
            path: self.path.clone(),
            bytes: self.bytes,
            source,
        };
        if self.bytes == 0 {
            self.release();
            return Ok(Held::Off);
        }
        match fs::metadata(&self.path) {
            Ok(m) if m.len() == self.bytes => return Ok(Held::Kept),
            // Another size (the setting changed) or a partial file: made again below.
            Ok(_) => {
                self.release();
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(e)),
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let space = space(dir).map_err(err)?;
        if space.available < self.bytes.saturating_mul(2) {
            return Ok(Held::NoRoom(space));
        }
        let tmp = self.path.with_extension("tmp");
        match make(&tmp, self.bytes).and_then(|()| fs::rename(&tmp, &self.path)) {
            Ok(()) => Ok(Held::Made),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                if is_disk_full(&e) {
                    // Taken by someone else between the statvfs and the allocation.
                    Ok(Held::NoRoom(space))
                } else {
                    Err(err(e))
                }
            }
        }
    }

    /// Gives the reserve back to the filesystem; true when there was one to give (so a write
    /// that found the disk full may succeed if tried again).
    pub fn release(&self) -> bool {
        fs::remove_file(&self.path).is_ok()
    }
}

/// Writes `bytes` of really allocated space into a new file at `path`.
fn make(path: &Path, bytes: u64) -> io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    let len =
        libc::off_t::try_from(bytes).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: the descriptor is the open file's, alive for the call; fallocate only reads its
    // integer arguments.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(e);
        }
        // A filesystem without fallocate: zeros written take the blocks all the same.
        let chunk = vec![0u8; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            file.write_all(&chunk[..n])?;
            left -= n as u64;
        }
    }
    file.sync_all()
}

/// The space of the filesystem holding `path`.
pub fn space(path: &Path) -> io::Result<Space> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: an all-zero `statvfs` is a valid value (plain integers).
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path; `st` is ours for statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let unit = st.f_frsize as u64;
    Ok(Space {
        available: (st.f_bavail as u64).saturating_mul(unit),
        total: (st.f_blocks as u64).saturating_mul(unit),
    })
}

/// Whether `e` says the disk (or the writer's quota) is full.
pub fn is_disk_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
        || e.kind() == io::ErrorKind::StorageFull
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_kept_released_and_off() {
        let dir = tempfile::tempdir().expect("temp dir");
        let r = Reserve::new(dir.path(), 1);
        assert_eq!(r.ensure().expect("made"), Held::Made);
        let len = fs::metadata(r.path()).expect("the file").len();
        assert_eq!(len, 1 << 20);
        assert_eq!(r.ensure().expect("kept"), Held::Kept);
        assert!(r.release());
        assert!(!r.release(), "nothing left to give");
        assert_eq!(r.ensure().expect("made again"), Held::Made);
        // Another size makes it again at the new one; 0 removes it.
        let bigger = Reserve::new(dir.path(), 2);
        assert_eq!(bigger.ensure().expect("made"), Held::Made);
        assert_eq!(fs::metadata(r.path()).expect("file").len(), 2 << 20);
        assert_eq!(
            Reserve::new(dir.path(), 0).ensure().expect("off"),
            Held::Off
        );
        assert!(!r.path().exists());
    }

    #[test]
    fn no_room_is_said_not_failed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let free = space(dir.path()).expect("statvfs").available;
        // More than half of what is free can never be made.
        let mb = u32::try_from((free >> 20) / 2 + 1).unwrap_or(u32::MAX);
        let r = Reserve::new(dir.path(), mb);
        assert!(matches!(r.ensure().expect("said"), Held::NoRoom(_)));
        assert!(!r.path().exists());
        assert!(!r.path().with_extension("tmp").exists());
    }

    #[test]
    fn a_full_disk_is_recognised() {
        assert!(is_disk_full(&io::Error::from_raw_os_error(libc::ENOSPC)));
        assert!(is_disk_full(&io::Error::from_raw_os_error(libc::EDQUOT)));
        assert!(!is_disk_full(&io::Error::from_raw_os_error(libc::EIO)));
    }
}
