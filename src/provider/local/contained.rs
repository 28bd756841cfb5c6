//! Commands another room spawns itself in a local sandbox — the fake Vercel's, whose API needs
//! an executable with arguments, streamed output and signals rather than
//! `SandboxProvider::exec`'s bounded `bash -c` — contained as the local provider's own are:
//! they enter the sandbox's namespaces ([`Contained::install`]), so they see only its
//! workspace (also at [`isolation::Settings::workspace_alias`]) and the read-only system, run as
//! uid [`isolation::UID`] under its limits, and die with its stop.

use std::fs;
use std::path::Path;

use super::isolation;
use super::names::SandboxName;
use super::{LocalError, LocalProvider};

/// A prepared entry into one sandbox's namespaces, for one command.
pub struct Contained {
    enter: isolation::Enter,
}

impl std::fmt::Debug for Contained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Contained").finish_non_exhaustive()
    }
}

impl LocalProvider {
    /// An entry into the sandbox `sandbox_id`'s namespaces (made now if its first command
    /// comes this way), for a command starting in `cwd` (a path inside it); `None` where this
    /// provider does not isolate (`terminal.local_isolation = none`, or a bare provider).
    pub async fn contain(
        &self,
        sandbox_id: &str,
        cwd: &Path,
    ) -> Result<Option<Contained>, LocalError> {
        if !self.isolation.namespaces() {
            return Ok(None);
        }
        let name = SandboxName::parse(sandbox_id)?;
        let slot = self.slot(&name);
        let _guard = slot.lock.lock().await;
        let (dir, _) = self.live_located(&name, &slot).await?;
        let (workspace, run_dir) = (dir.join("workspace"), dir.join("run"));
        for dir in [&workspace, &run_dir] {
            fs::create_dir_all(dir).map_err(LocalError::io("create directory", dir))?;
        }
        let (init, _note) =
            super::run_blocking_ref(|| self.sandbox_init(&name, &slot, &workspace, &run_dir))?;
        let enter = isolation::Enter::new(init, cwd, None).map_err(|source| LocalError::Spawn {
            sandbox: name.name.clone(),
            source,
        })?;
        Ok(Some(Contained { enter }))
    }
}

impl Contained {
    /// Makes `command` enter the sandbox before its exec (its environment stays the caller's
    /// to set: nothing of the server's should be in it).
    pub fn install(self, command: &mut tokio::process::Command) {
        let enter = self.enter;
        // SAFETY: `Enter::run` makes only async-signal-safe system calls on what `Enter::new`
        // prepared (see `isolation::enter`).
        unsafe {
            command.pre_exec(move || enter.run());
        }
    }
}
