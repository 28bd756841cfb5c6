//! Calls as re-drive pairs them: a [`Key`] pairs a recorded outcome [`Event`] with the
//! [`Command`] whose call it answers. Which call a command makes is
//! [`Call::from_command`](crate::provider::Call::from_command), the engine's own map, compared
//! as the provider receives it ([`ReceivedCall`](crate::provider::ReceivedCall)); the other
//! direction — a recorded outcome turned back into the provider's answer — is in `provider`.

use crate::core::{Command, Event, RequestId};
use crate::ids::{SandboxId, SnapshotId};

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
    Usage(SandboxId),
    Activity(SandboxId),
}

pub(super) fn command_key(c: &Command) -> Option<Key> {
    Some(match c {
        Command::CreateSandbox { generation, .. } => Key::Create(*generation),
        Command::RunCommand { request_id, .. } => Key::Run(*request_id),
        Command::TakeSnapshot { seq, .. } | Command::TakeCheckpoint { seq, .. } => {
            Key::Snapshot(*seq)
        }
        Command::StopSandbox { sandbox_id } => Key::Stop(sandbox_id.clone()),
        Command::ExtendTimeout { sandbox_id, .. } => Key::Extend(sandbox_id.clone()),
        Command::DeleteSnapshot { snapshot_id } => Key::Delete(snapshot_id.clone()),
        Command::ProbeSandbox { sandbox_id } => Key::Probe(sandbox_id.clone()),
        Command::ReadUsage { sandbox_id } => Key::Usage(sandbox_id.clone()),
        Command::SampleActivity { sandbox_id } => Key::Activity(sandbox_id.clone()),
        Command::ScheduleTimer { .. } | Command::Reply { .. } => return None,
    })
}

pub(super) fn outcome_key(e: &Event) -> Option<Key> {
    Some(match e {
        Event::SandboxReady { generation, .. } | Event::CreateFailed { generation, .. } => {
            Key::Create(*generation)
        }
        Event::CommandExited { request_id, .. }
        | Event::CommandFailed { request_id, .. }
        | Event::CommandNotStarted { request_id, .. } => Key::Run(*request_id),
        Event::SnapshotTaken { seq, .. }
        | Event::SnapshotFailed { seq, .. }
        | Event::CheckpointUnchanged { seq } => Key::Snapshot(*seq),
        Event::SandboxStopped { sandbox_id, .. } | Event::StopFailed { sandbox_id, .. } => {
            Key::Stop(sandbox_id.clone())
        }
        Event::TimeoutExtended { sandbox_id, .. } | Event::ExtendFailed { sandbox_id, .. } => {
            Key::Extend(sandbox_id.clone())
        }
        Event::SnapshotDeleted { snapshot_id }
        | Event::DeleteFailed { snapshot_id, .. }
        | Event::SnapshotReleased { snapshot_id, .. } => Key::Delete(snapshot_id.clone()),
        Event::SandboxProbed { sandbox_id, .. } | Event::ProbeFailed { sandbox_id, .. } => {
            Key::Probe(sandbox_id.clone())
        }
        Event::UsageRead { sandbox_id, .. } => Key::Usage(sandbox_id.clone()),
        Event::ActivitySampled { sandbox_id, .. } => Key::Activity(sandbox_id.clone()),
        Event::RunRequested { .. }
        | Event::SuspendRequested { .. }
        | Event::ResumeRequested { .. }
        | Event::ForkRequested { .. }
        | Event::CheckpointRequested { .. }
        | Event::RewindRequested { .. }
        | Event::Forked { .. }
        | Event::SettingsChanged { .. }
        | Event::TimerFired { .. }
        | Event::Loaded
        | Event::Recovered => return None,
    })
}
