//! Commands another room spawns itself in a local sandbox — the fake Vercel's, whose API needs
//! an executable with arguments, streamed output and signals rather than
//! `SandboxProvider::exec`'s bounded `bash -c` — contained as the local provider's own are:
//! they start in the sandbox's namespaces ([`Contained::spawn`]), so they see only its
//! workspace (also at [`isolation::Settings::workspace_alias`]) and the read-only system, run as
//! uid [`isolation::UID`] under its limits, and die with its stop.

use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::process::ExitStatus;

use tokio::io::AsyncRead;

use super::isolation;
use super::kill::kill_group;
use super::names::SandboxName;
use super::spawn::{Proc, Spec, Started};
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
        let (init, _note) = self.sandbox_init(&name, &slot, &workspace, &run_dir)?;
        let enter = isolation::Enter::new(init, cwd, None).map_err(|source| LocalError::Spawn {
            sandbox: name.name.clone(),
            source,
        })?;
        Ok(Some(Contained { enter }))
    }
}

impl Contained {
    /// Starts `program` with `args` in the sandbox, as the local provider starts its own
    /// commands (see `isolation::enter`): this process's child, in its own process group, with
    /// exactly the environment `env` (nothing of the server's should be in it; `program` is
    /// found on its `PATH` inside), its stdin `/dev/null`, its stdout and stderr pipes. Must be
    /// called within a tokio runtime. `Err`: nothing runs (`NotFound` when `program` is not
    /// found inside).
    pub fn spawn(
        self,
        program: &str,
        args: &[String],
        env: &[(String, String)],
    ) -> std::io::Result<ContainedChild> {
        let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        let env: Vec<(&str, &OsStr)> = env
            .iter()
            .map(|(k, v)| (k.as_str(), OsStr::new(v)))
            .collect();
        let spec = Spec {
            program,
            args: &args,
            cwd: Path::new(isolation::WORKSPACE),
            env: &env,
            stdin_piped: false,
        };
        let Started {
            proc,
            stdin: _,
            stdout,
            stderr,
        } = self.enter.spawn(&spec)?;
        Ok(ContainedChild {
            proc,
            stdout,
            stderr,
        })
    }
}

/// A command [`Contained::spawn`] started: its pid (its process group's id, while it is not
/// reaped), its output pipes and its exit. Dropped before it was waited for to the end, its
/// process group is killed (and it is reaped).
pub struct ContainedChild {
    proc: Proc,
    /// Its stdout, until taken.
    pub stdout: Option<Box<dyn AsyncRead + Unpin + Send>>,
    /// Its stderr, until taken.
    pub stderr: Option<Box<dyn AsyncRead + Unpin + Send>>,
}

impl std::fmt::Debug for ContainedChild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainedChild")
            .field("pid", &self.proc.id())
            .finish_non_exhaustive()
    }
}

impl ContainedChild {
    /// Its pid in this process's PID namespace, until it is reaped.
    pub fn id(&self) -> Option<u32> {
        self.proc.id()
    }

    /// Waits for it to exit and reaps it (cancel-safe).
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.proc.wait().await
    }
}

impl Drop for ContainedChild {
    fn drop(&mut self) {
        // Not reaped, so the group's id is still its own.
        if let Some(pgid) = self.proc.id() {
            kill_group(pgid);
        }
    }
}
