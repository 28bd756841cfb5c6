//! Where a sandbox lives on disk: its task's directory `tasks/<task>/` when it holds it (the
//! stable path), else parked under `sandboxes/<name>/`; the workspace its commands see, its
//! `meta.json`, and the working directory a command starts in (recorded relative to the
//! workspace). Both locations are derived here from its validated name.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::LocalError;
use super::fsutil::write_synced;
use super::names::SandboxName;
use super::LocalProvider;
use crate::core::Millis;
use crate::ids::TaskId;

/// Version of `meta.json`.
pub(super) const META_FORMAT: u32 = 1;

/// What the provider records about a sandbox, in `meta.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct SandboxMeta {
    pub(super) format: u32,
    pub(super) name: String,
    pub(super) task_id: String,
    pub(super) installation_id: String,
    pub(super) generation: u64,
    /// Unique per creation: a command that started in an earlier sandbox of the same name must
    /// not write its working directory into this one.
    pub(super) instance: String,
    pub(super) created_at: Millis,
    pub(super) deadline: Millis,
    pub(super) source_snapshot: Option<String>,
    /// The working directory for the next command, relative to the workspace (`""`: its root).
    pub(super) cwd: String,
    pub(super) status: SandboxStatus,
}

/// Where a sandbox is in its life (a stopped sandbox has no meta: it is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum SandboxStatus {
    /// Accepting commands.
    Running,
    /// Its processes were stopped and its files are being archived.
    Snapshotting,
}

impl LocalProvider {
    /// The workspace directory of a live-on-disk sandbox, if `sandbox_id` is valid and exists.
    pub fn workspace_path(&self, sandbox_id: &str) -> Option<PathBuf> {
        let name = SandboxName::parse(sandbox_id).ok()?;
        let path = self.workspace_dir(&name);
        path.is_dir().then_some(path)
    }

    /// The limit cgroups of an isolated sandbox's running init in this process (empty when it
    /// has none: not isolated, no command yet, stopped, or no hierarchy allows limits).
    pub fn limit_cgroups(&self, sandbox_id: &str) -> Vec<PathBuf> {
        let Ok(name) = SandboxName::parse(sandbox_id) else {
            return Vec::new();
        };
        let slot = self.slot(&name);
        let init = super::lock(&slot.init);
        init.as_ref()
            .and_then(|i| i.cgroups())
            .map(|c| c.dirs().to_vec())
            .unwrap_or_default()
    }

    /// The directory of `task`'s current sandbox: `tasks/<task>`, a stable path.
    pub(super) fn task_dir(&self, task: &TaskId) -> PathBuf {
        self.root.join("tasks").join(task.as_str())
    }

    /// The directory a parked sandbox lives in.
    pub(super) fn parked_dir(&self, name: &SandboxName) -> PathBuf {
        self.root.join("sandboxes").join(&name.name)
    }

    /// The name of the sandbox holding `task`'s directory, if any (`Err`: a directory without
    /// a readable meta).
    pub(super) fn holder(&self, task: &TaskId) -> Result<Option<SandboxMeta>, LocalError> {
        read_meta_at(&self.task_dir(task).join("meta.json"))
    }

    /// Where sandbox `name` lives: its task's directory if that holds it, else its parked
    /// directory (which may not exist: then the sandbox does not).
    pub(super) fn sandbox_dir(&self, name: &SandboxName) -> PathBuf {
        match self.holder(&name.task) {
            Ok(Some(meta)) if meta.name == name.name => self.task_dir(&name.task),
            _ => self.parked_dir(name),
        }
    }

    pub(super) fn workspace_dir(&self, name: &SandboxName) -> PathBuf {
        self.sandbox_dir(name).join("workspace")
    }

    pub(super) fn read_meta(&self, name: &SandboxName) -> Result<Option<SandboxMeta>, LocalError> {
        Ok(self.locate(name)?.map(|(_, meta)| meta))
    }

    /// The sandbox's directory (as [`sandbox_dir`](Self::sandbox_dir) decides) and its meta,
    /// reading the holder's meta once (`None`: the sandbox does not exist).
    pub(super) fn locate(
        &self,
        name: &SandboxName,
    ) -> Result<Option<(PathBuf, SandboxMeta)>, LocalError> {
        match self.holder(&name.task) {
            Ok(Some(meta)) if meta.name == name.name => Ok(Some((self.task_dir(&name.task), meta))),
            _ => {
                let dir = self.parked_dir(name);
                Ok(read_meta_at(&dir.join("meta.json"))?.map(|meta| (dir, meta)))
            }
        }
    }

    /// Writes `meta.json` into `sandbox_dir` atomically (temporary file, fsync, rename).
    pub(super) fn write_meta(
        &self,
        sandbox_dir: &Path,
        meta: &SandboxMeta,
    ) -> Result<(), LocalError> {
        let path = sandbox_dir.join("meta.json");
        let tmp = sandbox_dir.join(format!("meta.json.{}.tmp", self.unique()));
        let bytes = serde_json::to_vec_pretty(meta).expect("sandbox meta always serialises");
        let result = write_synced(&tmp, &bytes)
            .and_then(|()| fs::rename(&tmp, &path).map_err(LocalError::io("replace", &path)));
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }
}

/// Reads a `meta.json` (`None`: there is none).
pub(super) fn read_meta_at(path: &Path) -> Result<Option<SandboxMeta>, LocalError> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| LocalError::Meta {
                path: path.to_path_buf(),
                source,
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(LocalError::io("read", path)(e)),
    }
}

/// The directory a command starts in: the recorded one if it still exists inside the
/// workspace, else the workspace root.
pub(super) fn resolve_cwd(workspace: &Path, recorded: &str) -> PathBuf {
    if recorded.is_empty() {
        return workspace.to_path_buf();
    }
    match fs::canonicalize(workspace.join(recorded)) {
        Ok(real) if real.starts_with(workspace) && real.is_dir() => real,
        _ => workspace.to_path_buf(),
    }
}

/// The recorded form of the directory a command ended in: relative to the workspace, or `""`
/// (the root) when it is outside the workspace or not representable.
pub(super) fn relative_cwd(workspace: &Path, reported: &[u8]) -> String {
    let reported = reported.strip_suffix(b"\n").unwrap_or(reported);
    let path = Path::new(std::ffi::OsStr::from_bytes(reported));
    path.strip_prefix(workspace)
        .ok()
        .and_then(|rel| rel.to_str())
        .map(str::to_string)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn cwd_is_recorded_relative_to_the_workspace_only() {
        let ws = Path::new("/data/local/sandboxes/taskbox-t-g1/workspace");
        assert_eq!(
            relative_cwd(ws, b"/data/local/sandboxes/taskbox-t-g1/workspace/a/b\n"),
            "a/b"
        );
        assert_eq!(
            relative_cwd(ws, b"/data/local/sandboxes/taskbox-t-g1/workspace\n"),
            ""
        );
        assert_eq!(relative_cwd(ws, b"/tmp\n"), "");
        assert_eq!(
            relative_cwd(ws, b"/data/local/sandboxes/taskbox-t-g1/workspace2\n"),
            ""
        );
    }
}
