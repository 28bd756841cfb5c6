//! The backend registry: what the rest of taskbox asks of a backend, by the name
//! `terminal.backend` gives it and the journal records a task under. Building the provider,
//! `doctor`'s lines, whether `cost` prices its sessions and whether `export-snapshot` can read
//! its snapshots are answered by the backend's [`Entry`], never by matching on its name.
//!
//! A new backend is its folder under `src/provider/` (a [`Platform`](super::Platform), an
//! [`Entry`] named `BACKEND`) and one line in [`BACKENDS`] (`provider/mod.rs`); one that keeps
//! snapshot archives under the data dir (a [`Foreign`]) also has a line in [`FOREIGN_NOTES`]. The config keeps
//! `terminal.backend` as a well-spelled [`Backend`] name; [`resolve`] says which backend it
//! names, and an unknown name is refused with the list of [`BACKENDS`] (by `taskbox config set`
//! through [`check`], and where the config becomes a provider through [`from_config`]).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use super::{ProviderError, SandboxProvider};
use crate::clock::Clock;
use crate::config::{Backend, Config, ConfigError, ValueSource};
use crate::ids::SnapshotId;

/// Every backend, one line each (listed in the room's front, `provider/mod.rs`).
pub use super::BACKENDS;

/// What taskbox asks of one backend.
#[derive(Debug)]
pub struct Entry {
    /// The configuration's name for it (`terminal.backend`), which the journal records its
    /// tasks under.
    pub name: &'static str,
    /// Other names `terminal.backend` may give it (`taskbox config set` writes [`Entry::name`]
    /// instead).
    pub aliases: &'static [&'static str],
    /// Builds the provider for the installation `installation_id`, its files (if it keeps
    /// any) under the data dir.
    pub build: Build,
    /// Its lines of `taskbox doctor`, including what it keeps across sandboxes.
    pub checks: Checks,
    /// Whether `taskbox cost` prices its sessions (at Vercel's published prices).
    pub priced: bool,
    /// Writes one of its snapshots as a plain tarball (`taskbox export-snapshot`); `None` if
    /// its snapshots are not kept where taskbox can read them.
    pub export_snapshot: Option<Export>,
    /// What it does with snapshot archives of another installation it keeps under the data
    /// dir; `None` if it keeps none there.
    pub foreign: Option<&'static Foreign>,
}

/// Snapshot archives of another installation that a backend keeps under the data dir (the
/// store was removed or moved aside while they existed): noted once by `taskbox run` and the
/// MCP `run` tool, listed by `taskbox doctor`, which offers to adopt or ignore them. Each
/// function takes the data dir; where under it the backend keeps them is its own business.
#[derive(Debug)]
pub struct Foreign {
    /// Where its snapshot archives are, as doctor names them; `None` while it keeps no files
    /// under the data dir (doctor then says nothing).
    pub archives: fn(data_dir: &Path) -> Option<std::path::PathBuf>,
    /// The tasks with archives of installations other than `installation_id` (and not
    /// ignored), each with its newest archive, in task order.
    pub scan: fn(data_dir: &Path, installation_id: &str) -> Result<Vec<ForeignTask>, ProviderError>,
    /// Stops noting these tasks' installations; their archives stay on disk.
    pub ignore: fn(data_dir: &Path, tasks: &[ForeignTask]) -> Result<(), ProviderError>,
    /// Makes each task's first sandbox start from its newest archive (the caller passes only
    /// tasks the store does not know); returns the adopted tasks.
    pub adopt:
        fn(data_dir: &Path, tasks: &[ForeignTask]) -> Result<Vec<ForeignTask>, ProviderError>,
    // Its note, taken once by `taskbox run`, is its line of `FOREIGN_NOTES` (provider/mod.rs),
    // not a field here: the fast path must not name the entries.
}

/// The note about a backend's archives of another installation under the data dir, once (then
/// it is gone); `None` when there is none. One per backend with a [`Foreign`], in
/// [`FOREIGN_NOTES`].
pub type TakeNote = fn(data_dir: &Path) -> Option<String>;

/// The notes' list (listed in the room's front, `provider/mod.rs`).
pub use super::FOREIGN_NOTES;

/// The newest archive of one task of another installation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ForeignTask {
    /// The task.
    pub task_id: String,
    /// The installation that took its archives.
    pub installation_id: String,
    /// Its newest archive's snapshot id.
    pub snapshot_id: String,
    /// When that archive was taken.
    pub created_at: crate::core::Millis,
    /// How many archives of the task that installation left.
    pub archives: usize,
}

/// Every backend's note about archives of another installation under `data_dir`, once each.
pub fn take_foreign_notes(data_dir: &Path) -> Vec<String> {
    FOREIGN_NOTES
        .iter()
        .filter_map(|take| take(data_dir))
        .collect()
}

/// [`Entry::build`].
pub type Build = fn(
    config: &Config,
    data_dir: &Path,
    installation_id: &str,
    clock: Arc<dyn Clock>,
) -> Result<Arc<dyn SandboxProvider>, SetupError>;

/// [`Entry::checks`].
pub type Checks = for<'a> fn(config: &'a Config) -> ChecksFuture<'a>;

/// What [`Entry::checks`] returns.
pub type ChecksFuture<'a> = Pin<Box<dyn Future<Output = Vec<Check>> + Send + 'a>>;

/// [`Entry::export_snapshot`]: the snapshot `id`, kept under `data_dir`, as a tarball on `out`.
pub type Export =
    fn(data_dir: &Path, id: &SnapshotId, out: &mut dyn std::io::Write) -> Result<(), ProviderError>;

impl Entry {
    /// The name the configuration and the journal use.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// [`Entry::name`] as the configuration holds it.
    pub fn backend(&self) -> Backend {
        Backend::new(self.name).expect("a registered name is well spelled (the registry's test)")
    }
}

/// The entry of the backend named `name` (as a task's journal records it); `None` for a name no
/// backend has (a simulated or replayed run's, or an older taskbox's).
pub fn named(name: &str) -> Option<&'static Entry> {
    BACKENDS.iter().copied().find(|e| e.name == name)
}

/// The entry `backend` names, by its name or an alias.
pub fn resolve(backend: &Backend) -> Result<&'static Entry, UnknownBackend> {
    let name = backend.as_str();
    BACKENDS
        .iter()
        .copied()
        .find(|e| e.name == name || e.aliases.contains(&name))
        .ok_or_else(|| UnknownBackend {
            name: name.to_string(),
        })
}

/// Every backend's name, as an error lists them: `local, vercel_sandbox`.
pub fn names() -> String {
    BACKENDS
        .iter()
        .map(|e| e.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks `config`'s `terminal.backend` against the registry, as `taskbox config set` does
/// (`source` says where the value came from): an alias is replaced by the backend's name; a
/// name no backend has is refused with the list of backends.
pub fn check(config: &mut Config, source: ValueSource) -> Result<&'static Entry, ConfigError> {
    let entry = resolve(&config.terminal.backend).map_err(|e| ConfigError::InvalidValue {
        key: "terminal.backend".into(),
        value: e.name,
        expected: format!("one of: {}", names()),
        source_: source,
    })?;
    config.terminal.backend = entry.backend();
    Ok(entry)
}

/// Builds the provider `config` names (`terminal.backend`), rooted in `data_dir`.
pub fn from_config(
    config: &Config,
    data_dir: &Path,
    installation_id: &str,
    clock: Arc<dyn Clock>,
) -> Result<Arc<dyn SandboxProvider>, SetupError> {
    let entry = resolve(&config.terminal.backend).map_err(|e| {
        let hint = e.hint();
        SetupError::new(config.terminal.backend.as_str(), e, Some(hint))
    })?;
    (entry.build)(config, data_dir, installation_id, clock)
}

/// `terminal.backend` names no backend this taskbox has.
#[derive(Debug, thiserror::Error)]
#[error(
    "no backend is named `{name}`: terminal.backend is one of: {}",
    names()
)]
pub struct UnknownBackend {
    /// The name given.
    pub name: String,
}

impl UnknownBackend {
    /// How to fix it.
    pub fn hint(&self) -> String {
        format!(
            "choose one with `taskbox config set terminal.backend NAME`, NAME one of: {}",
            names()
        )
    }
}

/// Why a provider could not be built from the configuration: its backend's own error, which
/// it displays as, and how to fix it if the backend knows.
#[derive(Debug)]
pub struct SetupError {
    /// The backend that could not be built.
    pub backend: String,
    error: Box<dyn std::error::Error + Send + Sync>,
    hint: Option<String>,
}

impl SetupError {
    /// `backend` could not be built because of `error`; `hint` says how to fix it.
    pub fn new(
        backend: &str,
        error: impl std::error::Error + Send + Sync + 'static,
        hint: Option<String>,
    ) -> SetupError {
        SetupError {
            backend: backend.to_string(),
            error: Box::new(error),
            hint,
        }
    }

    /// How to fix it, if known.
    pub fn hint(&self) -> Option<String> {
        self.hint.clone()
    }
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for SetupError {
    // The backend's error stands in for this one (as `#[error(transparent)]` would have it):
    // its cause is this one's.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

/// One line of the doctor report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What is checked (`bash`, `vercel auth`, ...).
    pub name: String,
    /// Whether it passed.
    pub ok: bool,
    /// What was found. Never contains a secret.
    pub detail: String,
    /// How to fix a failure (or move off a deprecated setting).
    pub hint: Option<String>,
    /// Works, but deprecated or incomplete: printed `!`, does not fail doctor.
    pub warning: bool,
}

impl Check {
    /// A passed check.
    pub fn pass(name: &str, detail: impl Into<String>) -> Check {
        Check {
            name: name.to_string(),
            ok: true,
            detail: detail.into(),
            hint: None,
            warning: false,
        }
    }

    /// A check that passes with a warning and a hint.
    pub fn warn(name: &str, detail: impl Into<String>, hint: impl Into<String>) -> Check {
        Check {
            name: name.to_string(),
            ok: true,
            detail: detail.into(),
            hint: Some(hint.into()),
            warning: true,
        }
    }

    /// A failed check and how to fix it.
    pub fn fail(name: &str, detail: impl Into<String>, hint: impl Into<String>) -> Check {
        Check {
            name: name.to_string(),
            ok: false,
            detail: detail.into(),
            hint: Some(hint.into()),
            warning: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_is_registered_once_under_a_well_spelled_name() {
        for entry in BACKENDS {
            assert_eq!(entry.backend().as_str(), entry.name);
            // (Entries are consts, so they are compared by name, not by address.)
            assert_eq!(named(entry.name).map(Entry::name), Some(entry.name));
            assert_eq!(
                resolve(&entry.backend()).map(Entry::name).ok(),
                Some(entry.name)
            );
            for alias in entry.aliases {
                let by_alias = resolve(&Backend::new(alias).expect("well spelled")).expect("alias");
                assert_eq!(by_alias.name, entry.name, "{alias}");
                assert!(named(alias).is_none(), "an alias is not a name: {alias}");
            }
        }
        let mut all: Vec<&str> = BACKENDS
            .iter()
            .flat_map(|e| std::iter::once(e.name).chain(e.aliases.iter().copied()))
            .collect();
        let count = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), count, "a name or alias names one backend");
        // The config's default is a registered backend.
        assert!(resolve(&Backend::default()).is_ok());
        assert!(named("sim").is_none());
        assert!(named("replay").is_none());
    }

    #[test]
    fn every_backend_that_keeps_foreign_archives_has_its_note() {
        // `FOREIGN_NOTES` is a list apart (the fast path must not name the entries): one line
        // for each backend with a `Foreign`, none for another.
        let keeping = BACKENDS.iter().filter(|e| e.foreign.is_some()).count();
        assert_eq!(FOREIGN_NOTES.len(), keeping);
        // With no archives there is no note, and taking the notes leaves nothing behind.
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(take_foreign_notes(dir.path()).is_empty());
        assert_eq!(std::fs::read_dir(dir.path()).expect("read").count(), 0);
    }

    #[test]
    fn an_unknown_name_is_refused_with_the_list_of_backends() {
        let mut config = Config::default();
        config.terminal.backend = Backend::new("docker").expect("well spelled");
        let err = check(&mut config, ValueSource::Set).expect_err("no such backend");
        assert_eq!(
            err.to_string(),
            format!(
                "invalid value `docker` for `terminal.backend` given to `taskbox config set`: \
                 expected one of: {}",
                names()
            )
        );
        let setup = from_config(
            &config,
            Path::new("/nonexistent"),
            "inst",
            Arc::new(crate::clock::SystemClock),
        )
        .err()
        .expect("no such backend");
        assert_eq!(setup.backend, "docker");
        assert!(setup.to_string().contains(&names()), "{setup}");
        assert!(setup
            .hint()
            .expect("hint")
            .contains("taskbox config set terminal.backend"));
    }
}
