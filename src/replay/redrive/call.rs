//! The Command → provider call → Event mapping, as re-drive needs it: which [`ProviderCall`] the
//! engine makes to perform a [`Command`], and which call a recorded outcome [`Event`] answers
//! (the [`Key`] both share). The other direction — a recorded outcome turned back into the
//! provider's answer — is in `provider`.

use serde::Serialize;

use crate::core::{Command, Event, RequestId};
use crate::provider::sandbox_name;

/// One provider call, as the engine makes it (the arguments that decide what happens).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum ProviderCall {
    /// `create_sandbox`.
    CreateSandbox {
        /// The task.
        task_id: String,
        /// The generation.
        generation: u64,
        /// The sandbox name.
        name: String,
        /// The snapshot to restore.
        source_snapshot: Option<String>,
        /// Platform timeout.
        timeout_ms: u64,
    },
    /// `exec`.
    Exec {
        /// The sandbox.
        sandbox_id: String,
        /// The shell command.
        command: String,
        /// Its timeout.
        timeout_ms: u64,
    },
    /// `snapshot`.
    Snapshot {
        /// The task.
        task_id: String,
        /// The sandbox.
        sandbox_id: String,
        /// The snapshot sequence number.
        seq: u64,
    },
    /// `stop_sandbox`.
    StopSandbox {
        /// The sandbox.
        sandbox_id: String,
    },
    /// `extend_timeout`.
    ExtendTimeout {
        /// The sandbox.
        sandbox_id: String,
        /// By how much.
        duration_ms: u64,
    },
    /// `delete_snapshot`.
    DeleteSnapshot {
        /// The snapshot.
        snapshot_id: String,
    },
    /// `probe_sandbox`.
    ProbeSandbox {
        /// The sandbox.
        sandbox_id: String,
    },
}

impl ProviderCall {
    /// The call an engine of installation `installation_id` makes to perform `command` for
    /// `task_id` (`None` for commands that are not provider calls: timers and replies).
    pub fn from_command(
        installation_id: &str,
        task_id: &str,
        command: &Command,
    ) -> Option<ProviderCall> {
        Some(match command {
            Command::CreateSandbox {
                generation,
                source_snapshot,
                timeout_ms,
            } => ProviderCall::CreateSandbox {
                task_id: task_id.to_string(),
                generation: *generation,
                name: sandbox_name(installation_id, task_id, *generation),
                source_snapshot: source_snapshot.clone(),
                timeout_ms: *timeout_ms,
            },
            Command::RunCommand {
                sandbox_id,
                command,
                timeout_ms,
                ..
            } => ProviderCall::Exec {
                sandbox_id: sandbox_id.clone(),
                command: command.clone(),
                timeout_ms: *timeout_ms,
            },
            Command::TakeSnapshot { sandbox_id, seq } => ProviderCall::Snapshot {
                task_id: task_id.to_string(),
                sandbox_id: sandbox_id.clone(),
                seq: *seq,
            },
            Command::StopSandbox { sandbox_id } => ProviderCall::StopSandbox {
                sandbox_id: sandbox_id.clone(),
            },
            Command::ExtendTimeout {
                sandbox_id,
                duration_ms,
            } => ProviderCall::ExtendTimeout {
                sandbox_id: sandbox_id.clone(),
                duration_ms: *duration_ms,
            },
            Command::DeleteSnapshot { snapshot_id } => ProviderCall::DeleteSnapshot {
                snapshot_id: snapshot_id.clone(),
            },
            Command::ProbeSandbox { sandbox_id } => ProviderCall::ProbeSandbox {
                sandbox_id: sandbox_id.clone(),
            },
            Command::ScheduleTimer { .. } | Command::Reply { .. } => return None,
        })
    }

    /// The operation's name (`create_sandbox`, `exec`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            ProviderCall::CreateSandbox { .. } => "create_sandbox",
            ProviderCall::Exec { .. } => "exec",
            ProviderCall::Snapshot { .. } => "snapshot",
            ProviderCall::StopSandbox { .. } => "stop_sandbox",
            ProviderCall::ExtendTimeout { .. } => "extend_timeout",
            ProviderCall::DeleteSnapshot { .. } => "delete_snapshot",
            ProviderCall::ProbeSandbox { .. } => "probe_sandbox",
        }
    }
}

/// What pairs a call with its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Key {
    Create(u64),
    Run(RequestId),
    Snapshot(u64),
    Stop(String),
    Extend(String),
    Delete(String),
    Probe(String),
}

pub(super) fn command_key(c: &Command) -> Option<Key> {
    Some(match c {
        Command::CreateSandbox { generation, .. } => Key::Create(*generation),
        Command::RunCommand { request_id, .. } => Key::Run(*request_id),
        Command::TakeSnapshot { seq, .. } => Key::Snapshot(*seq),
        Command::StopSandbox { sandbox_id } => Key::Stop(sandbox_id.clone()),
        Command::ExtendTimeout { sandbox_id, .. } => Key::Extend(sandbox_id.clone()),
        Command::DeleteSnapshot { snapshot_id } => Key::Delete(snapshot_id.clone()),
        Command::ProbeSandbox { sandbox_id } => Key::Probe(sandbox_id.clone()),
        Command::ScheduleTimer { .. } | Command::Reply { .. } => return None,
    })
}

pub(super) fn outcome_key(e: &Event) -> Option<Key> {
    Some(match e {
        Event::SandboxReady { generation, .. } | Event::CreateFailed { generation, .. } => {
            Key::Create(*generation)
        }
        Event::CommandExited { request_id, .. } | Event::CommandFailed { request_id, .. } => {
            Key::Run(*request_id)
        }
        Event::SnapshotTaken { seq, .. } | Event::SnapshotFailed { seq, .. } => Key::Snapshot(*seq),
        Event::SandboxStopped { sandbox_id } | Event::StopFailed { sandbox_id, .. } => {
            Key::Stop(sandbox_id.clone())
        }
        Event::TimeoutExtended { sandbox_id, .. } | Event::ExtendFailed { sandbox_id, .. } => {
            Key::Extend(sandbox_id.clone())
        }
        Event::SnapshotDeleted { snapshot_id } | Event::DeleteFailed { snapshot_id, .. } => {
            Key::Delete(snapshot_id.clone())
        }
        Event::SandboxProbed { sandbox_id, .. } | Event::ProbeFailed { sandbox_id, .. } => {
            Key::Probe(sandbox_id.clone())
        }
        Event::RunRequested { .. }
        | Event::SuspendRequested { .. }
        | Event::ResumeRequested { .. }
        | Event::SettingsChanged { .. }
        | Event::TimerFired { .. }
        | Event::Loaded
        | Event::Recovered => return None,
    })
}
