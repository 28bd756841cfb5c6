//! [`LocalError`], the local provider's one error type, and how each failure is classified for
//! the engine (invalid, gone, transient or permanent).

use std::io;
use std::path::PathBuf;

use crate::core::FailureKind;
use crate::ids::TaskIdError;
use crate::provider::ProviderError;
use crate::snapshot_store::archive::ArchiveError;
use crate::snapshot_store::cas::CasError;
pub use crate::snapshot_store::IoContext;

/// A local-provider failure, with the task, sandbox, snapshot or path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// A task id that is not a safe name.
    #[error(transparent)]
    TaskId(#[from] TaskIdError),
    /// A sandbox id that is not `taskbox-<task id>-g<generation>-<installation>`.
    #[error("invalid sandbox id `{id}`: {reason} (expected `taskbox-<task id>-g<generation>-<installation>`)")]
    SandboxId {
        /// The id given (escaped).
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A snapshot id that is not `<task id>.s<seq>`.
    #[error("invalid snapshot id `{id}`: {reason} (expected `<task id>.s<seq>`)")]
    SnapshotId {
        /// The id given (escaped).
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The spec's name is not the one [`sandbox_name`](crate::provider::sandbox_name) gives for
    /// its task and generation.
    #[error("sandbox name `{name}` does not match task `{task_id}` generation {generation} (expected `{expected}`)")]
    SpecName {
        /// The name in the spec.
        name: String,
        /// The spec's task.
        task_id: String,
        /// The spec's generation.
        generation: u64,
        /// The name it should have.
        expected: String,
    },
    /// A command string that cannot be passed to a process.
    #[error("the command for sandbox `{sandbox}` contains a NUL byte")]
    BadCommand {
        /// The sandbox.
        sandbox: String,
    },
    /// The sandbox belongs to another task or installation.
    #[error("sandbox `{sandbox}` belongs to {what} `{owner}`, not `{expected}`")]
    Ownership {
        /// The sandbox.
        sandbox: String,
        /// `task` or `installation`.
        what: &'static str,
        /// Who owns it.
        owner: String,
        /// Who asked.
        expected: String,
    },
    /// The sandbox does not exist (any more).
    #[error("sandbox `{sandbox}` is gone: {reason}")]
    SandboxGone {
        /// The sandbox.
        sandbox: String,
        /// Why (expired, stopped, never created).
        reason: String,
    },
    /// A command was refused before it started (its sandbox was found stopped or past its
    /// deadline): it provably never ran. See [`ProviderError::before_start`].
    #[error(transparent)]
    NotStarted(Box<LocalError>),
    /// The snapshot's archive does not exist (any more).
    #[error("snapshot `{snapshot}` is gone (no archive at `{path}`)")]
    SnapshotGone {
        /// The snapshot id.
        snapshot: String,
        /// Where its archive was.
        path: PathBuf,
    },
    /// The snapshot's archive could not be written, read or restored.
    #[error("snapshot `{snapshot}` (archive `{path}`)")]
    Archive {
        /// The snapshot id.
        snapshot: String,
        /// The archive file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: ArchiveError,
    },
    /// The snapshot's contents could not be stored, read or restored (content store).
    #[error("snapshot `{snapshot}` (manifest `{path}`)")]
    Content {
        /// The snapshot id.
        snapshot: String,
        /// The manifest file.
        path: PathBuf,
        /// What went wrong (boxed: it is large and rare).
        #[source]
        source: Box<CasError>,
    },
    /// The archive under a snapshot's name holds another task's or sequence's files.
    #[error("archive `{path}` of snapshot `{snapshot}` holds task `{found_task}` snapshot {found_seq}, not what its name says")]
    ArchiveMismatch {
        /// The snapshot id.
        snapshot: String,
        /// The archive file.
        path: PathBuf,
        /// The task in its header.
        found_task: String,
        /// The sequence number in its header.
        found_seq: u64,
    },
    /// A file-system operation failed.
    #[error(transparent)]
    Io(#[from] IoContext),
    /// A sandbox's `meta.json` is not readable as ours.
    #[error("sandbox meta file `{path}` is not valid")]
    Meta {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The sandbox's namespaces could not be made (`terminal.local_isolation = namespaces`):
    /// nothing ran, and nothing runs unisolated instead (fail closed).
    #[error("cannot isolate sandbox `{sandbox}`")]
    Isolation {
        /// The sandbox.
        sandbox: String,
        /// What failed, with the fix where known.
        #[source]
        source: super::isolation::InitError,
    },
    /// `bash` could not be started.
    #[error("cannot start `bash` in sandbox `{sandbox}` ({})", spawn_hint(source))]
    Spawn {
        /// The sandbox.
        sandbox: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A checkpoint could not pause (or resume) the sandbox's processes: no freezer where its
    /// cgroups are, or the kernel did not freeze them in time. Nothing was taken; the
    /// processes run on.
    #[error("cannot pause the processes of sandbox `{sandbox}` for a checkpoint: {reason}")]
    Freeze {
        /// The sandbox.
        sandbox: String,
        /// Why, with the fix where known.
        reason: String,
    },
    /// A blocking helper task panicked or was cancelled.
    #[error("background work to {operation} did not finish: {message}")]
    Background {
        /// What it was doing.
        operation: &'static str,
        /// The join error.
        message: String,
    },
}

impl LocalError {
    pub(super) fn io(
        operation: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> Self {
        IoContext::wrap(operation, path)
    }

    /// How the engine must treat this failure.
    pub fn kind(&self) -> FailureKind {
        match self {
            LocalError::TaskId(_)
            | LocalError::SandboxId { .. }
            | LocalError::SnapshotId { .. }
            | LocalError::SpecName { .. }
            | LocalError::BadCommand { .. }
            | LocalError::Ownership { .. } => FailureKind::Invalid,
            LocalError::Freeze { .. } => FailureKind::Permanent,
            LocalError::SandboxGone { .. } => FailureKind::SandboxGone,
            LocalError::NotStarted(inner) => inner.kind(),
            LocalError::SnapshotGone { .. } => FailureKind::SnapshotGone,
            LocalError::Archive { source, .. } => match source.io_error() {
                Some(e) => io_kind(e),
                None => FailureKind::Permanent,
            },
            // Only content definitely not there is "snapshot gone"; corrupt content keeps the
            // snapshot (a permanent failure of this restore).
            LocalError::Content { source, .. } => match &**source {
                CasError::ContentMissing { .. } => FailureKind::SnapshotGone,
                other => other.io_error().map_or(FailureKind::Permanent, io_kind),
            },
            LocalError::Io(IoContext { source, .. }) | LocalError::Spawn { source, .. } => {
                io_kind(source)
            }
            LocalError::ArchiveMismatch { .. } | LocalError::Meta { .. } => FailureKind::Permanent,
            LocalError::Background { .. } => FailureKind::Permanent,
            LocalError::Isolation { .. } => FailureKind::Permanent,
        }
    }

    /// The provider-level error for `operation`, with the whole cause chain in its message.
    pub fn into_provider(self, operation: &'static str) -> ProviderError {
        if let LocalError::NotStarted(inner) = self {
            return inner.into_provider(operation).before_start();
        }
        let mut message = self.to_string();
        let mut source = std::error::Error::source(&self);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        ProviderError::new(self.kind(), operation, message)
    }
}

impl crate::provider::PlatformError for LocalError {
    fn into_provider(self, operation: &'static str) -> ProviderError {
        LocalError::into_provider(self, operation)
    }
}

/// Why `bash` may not have started, from the spawn's error: a missing program is the usual
/// reason, but a process out of descriptors or the system out of processes is not helped by
/// looking for bash.
fn spawn_hint(e: &io::Error) -> &'static str {
    match os_error(e) {
        Some(libc::EMFILE) => {
            "the engine's process has as many files open as its limit allows: raise its \
             open-files limit (`ulimit -n` where `taskbox serve` starts) and restart it"
        }
        Some(libc::ENFILE) => "the system's table of open files is full",
        Some(libc::EAGAIN) => {
            "the system or this user has too many processes, or an isolated sandbox is at its \
             process limit (`terminal.container_pids`)"
        }
        Some(libc::ENOMEM) => "out of memory",
        _ => "is bash installed and on PATH?",
    }
}

/// The errno of `e`, or of the first I/O error among its causes (an isolated command's spawn
/// names the step that failed, with the errno beneath).
fn os_error(e: &io::Error) -> Option<i32> {
    if let Some(errno) = e.raw_os_error() {
        return Some(errno);
    }
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(errno) = c
            .downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
        {
            return Some(errno);
        }
        cause = c.source();
    }
    None
}

/// I/O errors are permanent unless they are clearly about momentary resource pressure.
fn io_kind(e: &io::Error) -> FailureKind {
    let transient = matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ) || matches!(
        os_error(e),
        Some(libc::EAGAIN | libc::EMFILE | libc::ENFILE | libc::EBUSY | libc::ENOMEM)
    );
    if transient {
        FailureKind::Transient {
            retry_after_ms: None,
        }
    } else if e.kind() == io::ErrorKind::InvalidInput {
        FailureKind::Invalid
    } else {
        FailureKind::Permanent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spawn that failed for lack of descriptors names the limit, not a missing bash; one
    /// whose program is missing still asks about bash.
    #[test]
    fn a_spawn_error_says_why_bash_did_not_start() {
        let spawn = |errno| LocalError::Spawn {
            sandbox: "taskbox-t-g1-abc".into(),
            source: io::Error::from_raw_os_error(errno),
        };
        let emfile = spawn(libc::EMFILE).to_string();
        assert!(
            emfile.contains("open-files limit") && !emfile.contains("is bash installed"),
            "{emfile}"
        );
        let missing = spawn(libc::ENOENT).to_string();
        assert!(
            missing.contains("is bash installed and on PATH?"),
            "{missing}"
        );
        assert!(matches!(
            spawn(libc::EMFILE).kind(),
            FailureKind::Transient { .. }
        ));
    }
}
