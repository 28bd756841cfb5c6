//! The check `taskbox doctor` runs for the local backend: that `bash` runs, since every command
//! of a local sandbox is `bash -c`. It lives here rather than in the CLI because only providers
//! spawn processes.

use std::process::{Command, ExitStatus};

/// Why `bash` could not report its version.
#[derive(Debug, thiserror::Error)]
pub enum BashError {
    /// bash started and failed.
    #[error("bash exited with {0}")]
    Exited(ExitStatus),
    /// bash could not be started (not installed, not on `PATH`).
    #[error("cannot run bash: {0}")]
    Spawn(std::io::Error),
}

/// The version of the `bash` on `PATH` (`$BASH_VERSION`, such as `5.2.21(1)-release`).
pub fn bash_version() -> Result<String, BashError> {
    let out = Command::new("bash")
        .args(["-c", "echo $BASH_VERSION"])
        .output()
        .map_err(BashError::Spawn)?;
    if !out.status.success() {
        return Err(BashError::Exited(out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
