//! The server's claim on a data dir: the exclusive `flock` on `<data>/serve.lock` (one server
//! per data dir; the OS releases it when the process dies), and the Unix socket
//! `<data>/taskbox.sock`, bound with mode 0600 once the lock is held — so a socket file found
//! then is a dead server's, and is replaced, unless another user owns it.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::ServerError;
use crate::client::SOCKET_FILE;

/// The serve lock's file name in a data dir.
pub const LOCK_FILE: &str = "serve.lock";

/// The held serve lock; dropping it lets another server start.
#[derive(Debug)]
pub struct ServeLock {
    _file: File,
}

/// Takes the data dir's serve lock, or says which process holds it.
pub fn lock(data_dir: &Path) -> Result<ServeLock, ServerError> {
    let path = data_dir.join(LOCK_FILE);
    let io = |source| ServerError::Io {
        what: format!("cannot open {}", path.display()),
        source,
    };
    std::fs::create_dir_all(data_dir).map_err(io)?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io)?;
    if !crate::engine::try_flock(&file).map_err(io)? {
        let pid = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        return Err(ServerError::AlreadyRunning {
            data_dir: data_dir.to_path_buf(),
            pid,
        });
    }
    // Ours now: say who holds it, for the next one's error message.
    file.set_len(0).map_err(io)?;
    write!(file, "{}", std::process::id()).map_err(io)?;
    Ok(ServeLock { _file: file })
}

/// Binds `<data>/taskbox.sock` with mode 0600, replacing a dead server's socket file (the
/// caller holds the serve lock, so no live server owns it) unless another user owns it.
pub fn bind(data_dir: &Path, _lock: &ServeLock) -> Result<tokio::net::UnixListener, ServerError> {
    let path = data_dir.join(SOCKET_FILE);
    let io = |what: &str, source| ServerError::Io {
        what: format!("cannot {what} {}", path.display()),
        source,
    };
    match std::fs::symlink_metadata(&path) {
        Ok(meta) => {
            crate::client::check_owner(&path, &meta).map_err(|e| ServerError::ForeignSocket {
                message: e.to_string(),
            })?;
            tracing::info!(socket = %path.display(), "removing the socket file of a server that is gone");
            std::fs::remove_file(&path).map_err(|e| io("remove the stale socket", e))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("inspect", e)),
    }
    // SAFETY: `umask` only swaps the process's file-creation mask and cannot fail. The mask
    // makes the socket 0600 from its creation on (no window where another user may connect);
    // it is restored at once, and nothing else in this process creates files while the server
    // starts.
    let old = unsafe { libc::umask(0o177) };
    let bound = tokio::net::UnixListener::bind(&path);
    // SAFETY: as above: restores the previous mask.
    unsafe { libc::umask(old) };
    let listener = bound.map_err(|e| io("bind", e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| io("chmod", e))?;
    Ok(listener)
}

/// Removes the socket file at exit (while the lock is still held).
pub fn unbind(data_dir: &Path) -> PathBuf {
    let path = data_dir.join(SOCKET_FILE);
    let _ = std::fs::remove_file(&path);
    path
}
