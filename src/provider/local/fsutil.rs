//! File-system helpers that make the provider's renames durable and its removals thorough.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::error::LocalError;

pub(super) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), LocalError> {
    use std::io::Write;
    let mut file = fs::File::create(path).map_err(LocalError::io("create", path))?;
    file.write_all(bytes)
        .map_err(LocalError::io("write", path))?;
    file.sync_all().map_err(LocalError::io("fsync", path))
}

/// Makes a rename in `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), LocalError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(LocalError::io("fsync directory", dir))
}

pub(super) fn ignore_not_found(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(e)
    }
}

/// Removes a directory tree, first making its directories writable if a command made them
/// read-only (which would otherwise make the removal fail for a non-root user).
pub(super) fn remove_tree(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            let mut stack = vec![path.to_path_buf()];
            while let Some(dir) = stack.pop() {
                let Ok(meta) = fs::symlink_metadata(&dir) else {
                    continue;
                };
                if !meta.is_dir() {
                    continue;
                }
                let mode = meta.permissions().mode();
                if mode & 0o700 != 0o700 {
                    let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(mode | 0o700));
                }
                if let Ok(entries) = fs::read_dir(&dir) {
                    stack.extend(entries.flatten().map(|e| e.path()));
                }
            }
            fs::remove_dir_all(path).or_else(ignore_not_found)
        }
    }
}
