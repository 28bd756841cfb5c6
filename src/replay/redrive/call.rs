//! Calls as re-drive compares them: a [`ProviderCall`] is a [`Call`] as the provider receives it,
//! and a [`Key`] pairs a recorded outcome [`Event`] with the [`Command`] whose call it answers.
//! Which call a command makes is [`Call::from_command`], the engine's own map; the other
//! direction — a recorded outcome turned back into the provider's answer — is in `provider`.

use serde::Serialize;

use crate::core::{Command, Event, RequestId};
use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::provider::Call;

/// One provider call as the provider receives it: the arguments that decide what happens. A
/// [`Call`] without what only the engine knows (the request an `exec` serves, the installation a
/// create is tagged with), because this is also what the [`ReplayProvider`](super::ReplayProvider)
/// rebuilds from the arguments of each call it receives, to compare with the recording.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum ProviderCall {
    /// `create_sandbox`.
    CreateSandbox {
        /// The task.
        task_id: TaskId,
        /// The generation.
        generation: u64,
        /// The sandbox name.
        name: String,
        /// The snapshot to restore.
        source_snapshot: Option<SnapshotId>,
        /// Platform timeout.
        timeout_ms: u64,
    },
    /// `exec`.
    Exec {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The shell command.
        command: String,
        /// Its timeout.
        timeout_ms: u64,
    },
    /// `snapshot`.
    Snapshot {
        /// The task.
        task_id: TaskId,
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The snapshot sequence number.
        seq: u64,
    },
    /// `stop_sandbox`.
    StopSandbox {
        /// The sandbox.
        sandbox_id: SandboxId,
    },
    /// `extend_timeout`.
    ExtendTimeout {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// By how much.
        duration_ms: u64,
    },
    /// `delete_snapshot`.
    DeleteSnapshot {
        /// The snapshot.
        snapshot_id: SnapshotId,
    },
    /// `probe_sandbox`.
    ProbeSandbox {
        /// The sandbox.
        sandbox_id: SandboxId,
    },
}

impl From<&Call> for ProviderCall {
    fn from(call: &Call) -> ProviderCall {
        match call {
            Call::CreateSandbox { spec } => ProviderCall::CreateSandbox {
                task_id: spec.task_id.clone(),
                generation: spec.generation,
                name: spec.name.clone(),
                source_snapshot: spec.source_snapshot.clone(),
                timeout_ms: spec.timeout_ms,
            },
            Call::Exec {
                sandbox_id,
                request,
                ..
            } => ProviderCall::Exec {
                sandbox_id: sandbox_id.clone(),
                command: request.command.clone(),
                timeout_ms: request.timeout_ms,
            },
            Call::Snapshot {
                task_id,
                sandbox_id,
                seq,
            } => ProviderCall::Snapshot {
                task_id: task_id.clone(),
                sandbox_id: sandbox_id.clone(),
                seq: *seq,
            },
            Call::StopSandbox { sandbox_id } => ProviderCall::StopSandbox {
                sandbox_id: sandbox_id.clone(),
            },
            Call::ExtendTimeout {
                sandbox_id,
                duration_ms,
            } => ProviderCall::ExtendTimeout {
                sandbox_id: sandbox_id.clone(),
                duration_ms: *duration_ms,
            },
            Call::DeleteSnapshot { snapshot_id } => ProviderCall::DeleteSnapshot {
                snapshot_id: snapshot_id.clone(),
            },
            Call::ProbeSandbox { sandbox_id } => ProviderCall::ProbeSandbox {
                sandbox_id: sandbox_id.clone(),
            },
        }
    }
}

impl ProviderCall {
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
    Stop(SandboxId),
    Extend(SandboxId),
    Delete(SnapshotId),
    Probe(SandboxId),
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
