//! The backend registry: what the rest of taskbox asks of a backend, by the name
//! `terminal.backend` gives it and the journal records a task under. Building the provider,
//! `doctor`'s lines, whether `cost` prices its sessions and whether `export-snapshot` can read
//! its snapshots are answered by the backend's [`Entry`], never by matching on its name.
//!
//! A new backend is its folder under `src/provider/` (a [`Platform`](super::Platform), an
//! [`Entry`] named `BACKEND`), one line in [`BACKENDS`], and its name in
//! [`config::Backend`](crate::config::Backend) (the config sits below the providers, so the
//! names it accepts are its own).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use super::{ProviderError, SandboxProvider};
use crate::clock::Clock;
use crate::config::{Backend, Config};
use crate::ids::SnapshotId;

/// Every backend, one line each.
pub const BACKENDS: &[&Entry] = &[&super::local::BACKEND, &super::vercel::BACKEND];

/// What taskbox asks of one backend.
#[derive(Debug)]
pub struct Entry {
    /// The configuration's name for it (`terminal.backend`).
    pub backend: Backend,
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
        self.backend.as_str()
    }
}

/// The entry of `backend`.
pub fn entry(backend: Backend) -> &'static Entry {
    BACKENDS
        .iter()
        .copied()
        .find(|e| e.backend == backend)
        .expect("every configurable backend is registered (a unit test lists them)")
}

/// The entry of the backend named `name` (as a task's journal records it); `None` for a name no
/// backend has (a simulated or replayed run's, or an older taskbox's).
pub fn named(name: &str) -> Option<&'static Entry> {
    BACKENDS.iter().copied().find(|e| e.name() == name)
}

/// Builds the provider `config` names (`terminal.backend`), rooted in `data_dir`.
pub fn from_config(
    config: &Config,
    data_dir: &Path,
    installation_id: &str,
    clock: Arc<dyn Clock>,
) -> Result<Arc<dyn SandboxProvider>, SetupError> {
    (entry(config.terminal.backend).build)(config, data_dir, installation_id, clock)
}

/// Why a provider could not be built from the configuration: its backend's own error, which
/// it displays as, and how to fix it if the backend knows.
#[derive(Debug)]
pub struct SetupError {
    /// The backend that could not be built.
    pub backend: &'static str,
    error: Box<dyn std::error::Error + Send + Sync>,
    hint: Option<String>,
}

impl SetupError {
    /// `backend` could not be built because of `error`; `hint` says how to fix it.
    pub fn new(
        backend: &'static str,
        error: impl std::error::Error + Send + Sync + 'static,
        hint: Option<String>,
    ) -> SetupError {
        SetupError {
            backend,
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
    fn every_configurable_backend_is_registered_once_under_its_name() {
        for backend in Backend::ALL {
            assert_eq!(entry(backend).backend, backend);
            assert_eq!(named(backend.as_str()).map(|e| e.backend), Some(backend));
        }
        assert_eq!(BACKENDS.len(), Backend::ALL.len());
        assert!(BACKENDS.iter().all(|e| Backend::ALL.contains(&e.backend)));
        assert!(named("sim").is_none());
        assert!(named("replay").is_none());
    }
}
