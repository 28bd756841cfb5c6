//! [`Call`]: the one map from a core [`Command`] to a provider operation, and from that
//! operation's answer back to the [`Event`] the core expects.
//!
//! The engine performs commands through it, and re-drive lists the calls a recorded journal
//! made through it, so the two cannot drift apart. It lives with the providers because both
//! sides may depend on them: the engine and re-drive import it, it imports neither.
//!
//! A call as a provider receives it has no request id (the request an `exec` serves is the
//! engine's business): that is a [`ReceivedCall`], the same type with `()` where the engine has
//! the [`RequestId`], made from an engine's call by [`Call::received`]. Re-drive's provider
//! builds one from the arguments of each call it gets, to compare with the recording.

use serde::Serialize;

use crate::core::{Command, Event, RequestId};
use crate::ids::{SandboxId, SnapshotId, TaskId};

use super::{ExecIo, ExecOutput, ExecRequest, SandboxProvider, SandboxSpec};

/// One provider operation, built from the [`Command`] that asks for it (see
/// [`Call::from_command`]) and performed against any [`SandboxProvider`] ([`Call::perform`]).
///
/// `R` is what an `exec` knows of the request it serves: the engine's [`RequestId`] (the
/// default), or `()` for a call as the provider receives it ([`ReceivedCall`]). It serializes
/// (for re-drive's divergence reports) as the provider sees it, tagged by [`Call::name`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum Call<R = RequestId> {
    /// [`Command::CreateSandbox`]: `create_sandbox`.
    CreateSandbox {
        /// The sandbox to create (or find, if a create was already made).
        #[serde(flatten)]
        spec: SandboxSpec,
    },
    /// [`Command::RunCommand`]: `exec`.
    Exec {
        /// The request the command serves; its outcome names it (`()` once received).
        #[serde(skip)]
        request_id: R,
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The shell command and its timeout.
        #[serde(flatten)]
        request: ExecRequest,
    },
    /// [`Command::TakeSnapshot`]: `snapshot`.
    Snapshot {
        /// The task (with `seq`, the operation's idempotency key).
        task_id: TaskId,
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The snapshot sequence number.
        seq: u64,
    },
    /// [`Command::TakeCheckpoint`]: `checkpoint`.
    Checkpoint {
        /// The task (with `seq`, the operation's idempotency key).
        task_id: TaskId,
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The snapshot sequence number.
        seq: u64,
        /// The latest snapshot, which may already hold the files.
        previous: Option<SnapshotId>,
    },
    /// [`Command::StopSandbox`]: `stop_sandbox`.
    StopSandbox {
        /// The sandbox.
        sandbox_id: SandboxId,
    },
    /// [`Command::ExtendTimeout`]: `extend_timeout`.
    ExtendTimeout {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// By how much.
        duration_ms: u64,
    },
    /// [`Command::DeleteSnapshot`]: `delete_snapshot`.
    DeleteSnapshot {
        /// The snapshot.
        snapshot_id: SnapshotId,
    },
    /// [`Command::ProbeSandbox`]: `probe_sandbox`, then, when the sandbox is not running,
    /// `platform_snapshot`.
    ProbeSandbox {
        /// The task it belongs to.
        task_id: TaskId,
        /// The sandbox.
        sandbox_id: SandboxId,
    },
    /// [`Command::ReadUsage`]: `session_usage` of a session that ended.
    ReadUsage {
        /// The session.
        sandbox_id: SandboxId,
    },
    /// [`Command::SampleActivity`]: `resources` of a live sandbox.
    SampleActivity {
        /// The sandbox.
        sandbox_id: SandboxId,
    },
}

/// A [`Call`] as the provider receives it: without the request an `exec` serves.
pub type ReceivedCall = Call<()>;

impl<R> Call<R> {
    /// The operation's name (`create_sandbox`, `exec`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Call::CreateSandbox { .. } => "create_sandbox",
            Call::Exec { .. } => "exec",
            Call::Snapshot { .. } => "snapshot",
            Call::Checkpoint { .. } => "checkpoint",
            Call::StopSandbox { .. } => "stop_sandbox",
            Call::ExtendTimeout { .. } => "extend_timeout",
            Call::DeleteSnapshot { .. } => "delete_snapshot",
            Call::ProbeSandbox { .. } => "probe_sandbox",
            Call::ReadUsage { .. } => "read_usage",
            Call::SampleActivity { .. } => "sample_activity",
        }
    }

    /// The call as the provider receives it: the same operation and arguments, without the
    /// request id.
    pub fn received(&self) -> ReceivedCall {
        match self {
            Call::CreateSandbox { spec } => Call::CreateSandbox { spec: spec.clone() },
            Call::Exec {
                sandbox_id,
                request,
                ..
            } => Call::Exec {
                request_id: (),
                sandbox_id: sandbox_id.clone(),
                request: request.clone(),
            },
            Call::Snapshot {
                task_id,
                sandbox_id,
                seq,
            } => Call::Snapshot {
                task_id: task_id.clone(),
                sandbox_id: sandbox_id.clone(),
                seq: *seq,
            },
            Call::Checkpoint {
                task_id,
                sandbox_id,
                seq,
                previous,
            } => Call::Checkpoint {
                task_id: task_id.clone(),
                sandbox_id: sandbox_id.clone(),
                seq: *seq,
                previous: previous.clone(),
            },
            Call::StopSandbox { sandbox_id } => Call::StopSandbox {
                sandbox_id: sandbox_id.clone(),
            },
            Call::ExtendTimeout {
                sandbox_id,
                duration_ms,
            } => Call::ExtendTimeout {
                sandbox_id: sandbox_id.clone(),
                duration_ms: *duration_ms,
            },
            Call::DeleteSnapshot { snapshot_id } => Call::DeleteSnapshot {
                snapshot_id: snapshot_id.clone(),
            },
            Call::ProbeSandbox {
                task_id,
                sandbox_id,
            } => Call::ProbeSandbox {
                task_id: task_id.clone(),
                sandbox_id: sandbox_id.clone(),
            },
            Call::ReadUsage { sandbox_id } => Call::ReadUsage {
                sandbox_id: sandbox_id.clone(),
            },
            Call::SampleActivity { sandbox_id } => Call::SampleActivity {
                sandbox_id: sandbox_id.clone(),
            },
        }
    }
}

impl Call {
    /// The call an engine of installation `installation_id` makes to perform `command` for
    /// `task_id`; `None` for the commands that are not provider calls (timers and replies, which
    /// the engine performs itself).
    pub fn from_command(
        installation_id: &str,
        task_id: &TaskId,
        command: &Command,
    ) -> Option<Call> {
        Some(match command {
            Command::CreateSandbox {
                generation,
                source_snapshot,
                timeout_ms,
            } => Call::CreateSandbox {
                spec: SandboxSpec::new(
                    installation_id,
                    task_id,
                    *generation,
                    source_snapshot.clone(),
                    *timeout_ms,
                ),
            },
            Command::RunCommand {
                request_id,
                sandbox_id,
                command,
                timeout_ms,
            } => Call::Exec {
                request_id: *request_id,
                sandbox_id: sandbox_id.clone(),
                request: ExecRequest {
                    command: command.clone(),
                    timeout_ms: *timeout_ms,
                },
            },
            Command::TakeSnapshot { sandbox_id, seq } => Call::Snapshot {
                task_id: task_id.clone(),
                sandbox_id: sandbox_id.clone(),
                seq: *seq,
            },
            Command::TakeCheckpoint {
                sandbox_id,
                seq,
                previous,
            } => Call::Checkpoint {
                task_id: task_id.clone(),
                sandbox_id: sandbox_id.clone(),
                seq: *seq,
                previous: previous.clone(),
            },
            Command::StopSandbox { sandbox_id } => Call::StopSandbox {
                sandbox_id: sandbox_id.clone(),
            },
            Command::ExtendTimeout {
                sandbox_id,
                duration_ms,
            } => Call::ExtendTimeout {
                sandbox_id: sandbox_id.clone(),
                duration_ms: *duration_ms,
            },
            Command::DeleteSnapshot { snapshot_id } => Call::DeleteSnapshot {
                snapshot_id: snapshot_id.clone(),
            },
            Command::ProbeSandbox { sandbox_id } => Call::ProbeSandbox {
                task_id: task_id.clone(),
                sandbox_id: sandbox_id.clone(),
            },
            Command::ReadUsage { sandbox_id } => Call::ReadUsage {
                sandbox_id: sandbox_id.clone(),
            },
            Command::SampleActivity { sandbox_id } => Call::SampleActivity {
                sandbox_id: sandbox_id.clone(),
            },
            Command::ScheduleTimer { .. } | Command::Reply { .. } => return None,
        })
    }

    /// Makes the call once (retries are the core's decision, taken on the outcome) and returns
    /// its outcome as the event the core expects, with the captured output of a command that
    /// ran. Every failure becomes its operation's failure event, classified where it arose
    /// ([`ProviderError::to_failure`](super::ProviderError::to_failure)).
    pub async fn perform(&self, p: &dyn SandboxProvider) -> (Event, Option<ExecOutput>) {
        self.perform_live(p, ExecIo::default()).await
    }

    /// [`Call::perform`], with the live side of a command (`io`, used by an exec only; see
    /// [`SandboxProvider::exec_live`]). The live side changes nothing the core sees.
    pub async fn perform_live(
        &self,
        p: &dyn SandboxProvider,
        io: ExecIo,
    ) -> (Event, Option<ExecOutput>) {
        let event = match self {
            Call::CreateSandbox { spec } => match p.create_sandbox(spec).await {
                Ok(info) => Event::SandboxReady {
                    generation: spec.generation,
                    sandbox_id: info.id,
                    name: info.name,
                    deadline: info.deadline,
                },
                Err(e) => Event::CreateFailed {
                    generation: spec.generation,
                    failure: e.to_failure(),
                },
            },
            Call::Exec {
                request_id,
                sandbox_id,
                request,
            } => {
                return match p.exec_live(sandbox_id, request, io).await {
                    Ok(out) => (
                        Event::CommandExited {
                            request_id: *request_id,
                            exit_code: out.exit_code,
                            timed_out: out.timed_out,
                            memory_killed: out.memory_killed,
                        },
                        Some(out),
                    ),
                    Err(e) if e.not_started => (
                        Event::CommandNotStarted {
                            request_id: *request_id,
                            failure: e.to_failure(),
                        },
                        None,
                    ),
                    Err(e) => (
                        Event::CommandFailed {
                            request_id: *request_id,
                            failure: e.to_failure(),
                        },
                        None,
                    ),
                }
            }
            Call::Snapshot {
                task_id,
                sandbox_id,
                seq,
            } => match p.snapshot(task_id, sandbox_id, *seq).await {
                Ok(info) => Event::SnapshotTaken {
                    seq: *seq,
                    snapshot_id: info.id,
                    size_bytes: info.size_bytes,
                    expires_at: info.expires_at,
                    omitted: info.omitted,
                    usage: info.usage,
                    resources: info.resources,
                },
                Err(e) => Event::SnapshotFailed {
                    seq: *seq,
                    failure: e.to_failure(),
                },
            },
            Call::Checkpoint {
                task_id,
                sandbox_id,
                seq,
                previous,
            } => match p
                .checkpoint(task_id, sandbox_id, *seq, previous.as_ref())
                .await
            {
                Ok(Some(info)) => Event::SnapshotTaken {
                    seq: *seq,
                    snapshot_id: info.id,
                    size_bytes: info.size_bytes,
                    expires_at: info.expires_at,
                    omitted: info.omitted,
                    usage: info.usage,
                    resources: info.resources,
                },
                Ok(None) => Event::CheckpointUnchanged { seq: *seq },
                Err(e) => Event::SnapshotFailed {
                    seq: *seq,
                    failure: e.to_failure(),
                },
            },
            Call::StopSandbox { sandbox_id } => match p.stop_sandbox(sandbox_id).await {
                Ok(()) => Event::SandboxStopped {
                    sandbox_id: sandbox_id.clone(),
                    usage: usage_of(p, sandbox_id).await,
                },
                Err(e) => Event::StopFailed {
                    sandbox_id: sandbox_id.clone(),
                    failure: e.to_failure(),
                },
            },
            Call::ExtendTimeout {
                sandbox_id,
                duration_ms,
            } => match p.extend_timeout(sandbox_id, *duration_ms).await {
                Ok(deadline) => Event::TimeoutExtended {
                    sandbox_id: sandbox_id.clone(),
                    deadline,
                },
                Err(e) => Event::ExtendFailed {
                    sandbox_id: sandbox_id.clone(),
                    failure: e.to_failure(),
                },
            },
            Call::DeleteSnapshot { snapshot_id } => match p.delete_snapshot(snapshot_id).await {
                Ok(()) => Event::SnapshotDeleted {
                    snapshot_id: snapshot_id.clone(),
                },
                Err(e) => Event::DeleteFailed {
                    snapshot_id: snapshot_id.clone(),
                    failure: e.to_failure(),
                },
            },
            Call::ProbeSandbox {
                task_id,
                sandbox_id,
            } => {
                let probed = match p.probe_sandbox(sandbox_id).await {
                    Ok(Some(deadline)) => Ok((Some(deadline), None, None)),
                    // Not running: did the platform keep its files in a snapshot of its own,
                    // and what did the session that ended use?
                    Ok(None) => match p.platform_snapshot(task_id, sandbox_id).await {
                        Ok(found) => Ok((None, found, usage_of(p, sandbox_id).await)),
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                match probed {
                    Ok((alive, platform_snapshot, usage)) => Event::SandboxProbed {
                        sandbox_id: sandbox_id.clone(),
                        alive,
                        platform_snapshot,
                        usage,
                    },
                    Err(e) => Event::ProbeFailed {
                        sandbox_id: sandbox_id.clone(),
                        failure: e.to_failure(),
                    },
                }
            }
            // A failure to read it is journaled as unknown usage: it never holds the task up.
            Call::ReadUsage { sandbox_id } => Event::UsageRead {
                sandbox_id: sandbox_id.clone(),
                usage: usage_of(p, sandbox_id).await,
            },
            // A sample that cannot be read counts as idle: it never fails the task.
            Call::SampleActivity { sandbox_id } => Event::ActivitySampled {
                sandbox_id: sandbox_id.clone(),
                resources: match p.resources(sandbox_id).await {
                    Ok(resources) => resources,
                    Err(e) => {
                        tracing::debug!(sandbox = %sandbox_id, error = %e, "no activity sample");
                        None
                    }
                },
            },
        };
        (event, None)
    }
}

/// What the platform reports of a session that ended ([`SandboxProvider::session_usage`]);
/// none when it cannot be read — the usage is for the cost ledger, and a failure to read it
/// must not fail the operation that ended the session.
async fn usage_of(
    p: &dyn SandboxProvider,
    sandbox_id: &SandboxId,
) -> Option<crate::core::SessionUsage> {
    match p.session_usage(sandbox_id).await {
        Ok(usage) => usage,
        Err(e) => {
            tracing::debug!(sandbox = %sandbox_id, error = %e, "no usage for a session that ended");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Failure, FailureKind, Millis, TimerKind};
    use crate::provider::sandbox_name;
    use crate::provider::{
        ListedResource, ProviderError, ProviderFuture, SandboxInfo, SnapshotInfo,
    };

    /// A platform that is down: every call fails transiently.
    struct Down;

    fn down<'a, T: Send + 'a>(operation: &'static str) -> ProviderFuture<'a, T> {
        Box::pin(async move { Err(ProviderError::transient(operation, "503", Some(7))) })
    }

    impl SandboxProvider for Down {
        fn name(&self) -> &'static str {
            "down"
        }
        fn create_sandbox<'a>(&'a self, _: &'a SandboxSpec) -> ProviderFuture<'a, SandboxInfo> {
            down("create sandbox")
        }
        fn exec_live<'a>(
            &'a self,
            _: &'a SandboxId,
            _: &'a ExecRequest,
            _: ExecIo,
        ) -> ProviderFuture<'a, ExecOutput> {
            down("run command")
        }
        fn snapshot<'a>(
            &'a self,
            _: &'a TaskId,
            _: &'a SandboxId,
            _: u64,
        ) -> ProviderFuture<'a, SnapshotInfo> {
            down("take snapshot")
        }
        fn stop_sandbox<'a>(&'a self, _: &'a SandboxId) -> ProviderFuture<'a, ()> {
            down("stop sandbox")
        }
        fn extend_timeout<'a>(&'a self, _: &'a SandboxId, _: u64) -> ProviderFuture<'a, Millis> {
            down("extend timeout")
        }
        fn delete_snapshot<'a>(&'a self, _: &'a SnapshotId) -> ProviderFuture<'a, ()> {
            down("delete snapshot")
        }
        fn probe_sandbox<'a>(&'a self, _: &'a SandboxId) -> ProviderFuture<'a, Option<Millis>> {
            down("probe sandbox")
        }
        fn list_sandboxes<'a>(&'a self, _: &'a str) -> ProviderFuture<'a, Vec<ListedResource>> {
            down("list sandboxes")
        }
        fn list_snapshots<'a>(&'a self, _: &'a str) -> ProviderFuture<'a, Vec<ListedResource>> {
            down("list snapshots")
        }
    }

    fn demo() -> TaskId {
        TaskId::new("demo").expect("a valid id")
    }

    fn failure(operation: &str) -> Failure {
        Failure::new(
            FailureKind::Transient {
                retry_after_ms: Some(7),
            },
            format!("{operation}: 503"),
        )
    }

    /// Each provider command's call, and the failure event it comes back as: the event names
    /// what the command named, so the core pairs it with the operation in flight.
    #[test]
    fn every_provider_command_maps_to_its_call_and_back_to_its_event() {
        let s = || SandboxId::from("sbx");
        let cases = [
            (
                Command::CreateSandbox {
                    generation: 3,
                    source_snapshot: Some("snap".into()),
                    timeout_ms: 60_000,
                },
                "create_sandbox",
                Event::CreateFailed {
                    generation: 3,
                    failure: failure("create sandbox"),
                },
            ),
            (
                Command::RunCommand {
                    request_id: 9,
                    sandbox_id: s(),
                    command: "ls".into(),
                    timeout_ms: 5,
                },
                "exec",
                Event::CommandFailed {
                    request_id: 9,
                    failure: failure("run command"),
                },
            ),
            (
                Command::TakeSnapshot {
                    sandbox_id: s(),
                    seq: 2,
                },
                "snapshot",
                Event::SnapshotFailed {
                    seq: 2,
                    failure: failure("take snapshot"),
                },
            ),
            (
                Command::StopSandbox { sandbox_id: s() },
                "stop_sandbox",
                Event::StopFailed {
                    sandbox_id: s(),
                    failure: failure("stop sandbox"),
                },
            ),
            (
                Command::ExtendTimeout {
                    sandbox_id: s(),
                    duration_ms: 1,
                },
                "extend_timeout",
                Event::ExtendFailed {
                    sandbox_id: s(),
                    failure: failure("extend timeout"),
                },
            ),
            (
                Command::DeleteSnapshot {
                    snapshot_id: "snap".into(),
                },
                "delete_snapshot",
                Event::DeleteFailed {
                    snapshot_id: "snap".into(),
                    failure: failure("delete snapshot"),
                },
            ),
            (
                Command::ProbeSandbox { sandbox_id: s() },
                "probe_sandbox",
                Event::ProbeFailed {
                    sandbox_id: s(),
                    failure: failure("probe sandbox"),
                },
            ),
            // A platform that measures nothing answers no sample: the sandbox counts as idle.
            (
                Command::SampleActivity { sandbox_id: s() },
                "sample_activity",
                Event::ActivitySampled {
                    sandbox_id: s(),
                    resources: None,
                },
            ),
        ];
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        for (command, name, event) in cases {
            let call = Call::from_command("inst0001", &demo(), &command).expect("a provider call");
            assert_eq!(call.name(), name);
            assert_eq!(rt.block_on(call.perform(&Down)), (event, None), "{name}");
        }
    }

    #[test]
    fn a_create_is_named_and_tagged_for_its_installation() {
        let command = Command::CreateSandbox {
            generation: 2,
            source_snapshot: None,
            timeout_ms: 60_000,
        };
        let Some(Call::CreateSandbox { spec }) = Call::from_command("inst0001", &demo(), &command)
        else {
            panic!("a create");
        };
        assert_eq!(spec.name, sandbox_name("inst0001", "demo", 2));
        assert_eq!(spec.installation_id, "inst0001");
        assert_eq!(spec.task_id.as_str(), "demo");
    }

    #[test]
    fn timers_and_replies_are_no_provider_calls() {
        let timer = Command::ScheduleTimer {
            timer: TimerKind::Idle,
            at: 1,
        };
        assert_eq!(Call::from_command("i", &demo(), &timer), None);
        let reply = Command::Reply {
            request_id: 1,
            reply: crate::core::Reply::Suspended {
                snapshot_id: None,
                omitted: Vec::new(),
            },
        };
        assert_eq!(Call::from_command("i", &demo(), &reply), None);
    }

    /// What re-drive compares: the engine's call, as the provider receives it, equals the call
    /// rebuilt from the provider's arguments, and reads (in a divergence report) as the
    /// provider's arguments, tagged by name, with no request id.
    #[test]
    fn a_received_call_drops_only_the_request_id() {
        let command = Command::RunCommand {
            request_id: 9,
            sandbox_id: SandboxId::from("sbx"),
            command: "ls".into(),
            timeout_ms: 5,
        };
        let call = Call::from_command("i", &demo(), &command).expect("a provider call");
        let received: ReceivedCall = Call::Exec {
            request_id: (),
            sandbox_id: SandboxId::from("sbx"),
            request: ExecRequest {
                command: "ls".into(),
                timeout_ms: 5,
            },
        };
        assert_eq!(call.received(), received);
        assert_eq!(
            serde_json::to_value(&received).expect("serializes"),
            serde_json::json!({"call": "exec", "sandbox_id": "sbx", "command": "ls", "timeout_ms": 5})
        );
        let create = Command::CreateSandbox {
            generation: 2,
            source_snapshot: None,
            timeout_ms: 60_000,
        };
        let create = Call::from_command("inst0001", &demo(), &create).expect("a create");
        let json = serde_json::to_value(create.received()).expect("serializes");
        assert_eq!(json["call"], "create_sandbox");
        assert_eq!(json["generation"], 2);
        assert_eq!(json["name"], sandbox_name("inst0001", "demo", 2));
    }
}
