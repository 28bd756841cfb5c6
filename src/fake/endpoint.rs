//! The API endpoints the fake serves, by the names that fault specs and request statistics use.

use std::fmt;
use std::str::FromStr;

/// One endpoint of the Vercel Sandbox v2 API (method + path), as fault specs and statistics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Endpoint {
    /// `POST /v2/sandboxes` (and `POST /v3/sandboxes`, the SDK's create without a runtime)
    CreateSandbox,
    /// `GET /v2/sandboxes`
    ListSandboxes,
    /// `GET /v2/sandboxes/{name}`
    GetSandbox,
    /// `DELETE /v2/sandboxes/{name}`
    DeleteSandbox,
    /// `GET /v2/sandboxes/sessions`
    ListSessions,
    /// `GET /v2/sandboxes/sessions/{id}`
    GetSession,
    /// `POST /v2/sandboxes/sessions/{id}/stop`
    StopSession,
    /// `POST /v2/sandboxes/sessions/{id}/extend-timeout`
    ExtendTimeout,
    /// `POST /v2/sandboxes/sessions/{id}/cmd`
    RunCommand,
    /// `GET /v2/sandboxes/sessions/{id}/cmd/{cmdId}`
    GetCommand,
    /// `GET /v2/sandboxes/sessions/{id}/cmd/{cmdId}/logs`
    CommandLogs,
    /// `POST /v2/sandboxes/sessions/{id}/cmd/{cmdId}/kill`
    KillCommand,
    /// `POST /v2/sandboxes/sessions/{id}/fs/write`
    WriteFiles,
    /// `POST /v2/sandboxes/sessions/{id}/fs/read`
    ReadFile,
    /// `POST /v2/sandboxes/sessions/{id}/fs/mkdir`
    MakeDir,
    /// `POST /v2/sandboxes/sessions/{id}/snapshot`
    CreateSnapshot,
    /// `GET /v2/sandboxes/snapshots`
    ListSnapshots,
    /// `GET /v2/sandboxes/snapshots/{id}`
    GetSnapshot,
    /// `DELETE /v2/sandboxes/snapshots/{id}`
    DeleteSnapshot,
}

impl Endpoint {
    /// Every endpoint, in declaration order.
    pub const ALL: [Endpoint; 19] = [
        Endpoint::CreateSandbox,
        Endpoint::ListSandboxes,
        Endpoint::GetSandbox,
        Endpoint::DeleteSandbox,
        Endpoint::ListSessions,
        Endpoint::GetSession,
        Endpoint::StopSession,
        Endpoint::ExtendTimeout,
        Endpoint::RunCommand,
        Endpoint::GetCommand,
        Endpoint::CommandLogs,
        Endpoint::KillCommand,
        Endpoint::WriteFiles,
        Endpoint::ReadFile,
        Endpoint::MakeDir,
        Endpoint::CreateSnapshot,
        Endpoint::ListSnapshots,
        Endpoint::GetSnapshot,
        Endpoint::DeleteSnapshot,
    ];

    /// The snake_case name used in fault specs and `/_admin/stats`.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::CreateSandbox => "create_sandbox",
            Endpoint::ListSandboxes => "list_sandboxes",
            Endpoint::GetSandbox => "get_sandbox",
            Endpoint::DeleteSandbox => "delete_sandbox",
            Endpoint::ListSessions => "list_sessions",
            Endpoint::GetSession => "get_session",
            Endpoint::StopSession => "stop_session",
            Endpoint::ExtendTimeout => "extend_timeout",
            Endpoint::RunCommand => "run_command",
            Endpoint::GetCommand => "get_command",
            Endpoint::CommandLogs => "command_logs",
            Endpoint::KillCommand => "kill_command",
            Endpoint::WriteFiles => "write_files",
            Endpoint::ReadFile => "read_file",
            Endpoint::MakeDir => "make_dir",
            Endpoint::CreateSnapshot => "create_snapshot",
            Endpoint::ListSnapshots => "list_snapshots",
            Endpoint::GetSnapshot => "get_snapshot",
            Endpoint::DeleteSnapshot => "delete_snapshot",
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An endpoint name that is not one of [`Endpoint::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown endpoint `{0}`; known endpoints: {known}", known = known_names())]
pub struct UnknownEndpoint(pub String);

fn known_names() -> String {
    Endpoint::ALL
        .iter()
        .map(|e| e.name())
        .collect::<Vec<_>>()
        .join(", ")
}

impl FromStr for Endpoint {
    type Err = UnknownEndpoint;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Endpoint::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| UnknownEndpoint(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for e in Endpoint::ALL {
            assert_eq!(e.name().parse::<Endpoint>(), Ok(e));
            assert!(seen.insert(e.name()), "duplicate name {}", e.name());
        }
        let err = "nope".parse::<Endpoint>().unwrap_err().to_string();
        assert!(err.contains("run_command"), "{err}");
    }
}
