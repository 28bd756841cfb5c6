//! The checks `taskbox doctor` runs for the local backend: that `bash` runs, since every
//! command of a local sandbox is `bash -c`; whether a stop can kill every process of a sandbox
//! (its cgroup); each layer of its isolation, or a ✗ where it was turned off; and what
//! persists across sandboxes. They live here rather than in the CLI because only providers
//! spawn processes.

use std::process::{Command, ExitStatus};

use super::cgroup;
use crate::config::Config;
use crate::provider::registry::Check;

/// The local backend's doctor lines ([`crate::provider::registry::Entry::checks`]).
pub fn checks(config: &Config) -> Vec<Check> {
    let mut checks = vec![bash_check()];
    if config.terminal.local_isolation == crate::config::LocalIsolation::Namespaces {
        checks.extend(namespace_checks(
            &super::isolation::Settings::of(&config.terminal).network,
        ));
    } else {
        checks.push(isolation_check());
    }
    checks.push(Check::pass(
        "persistence",
        if config.terminal.container_persistent {
            "terminal.container_persistent = true: files are kept in snapshots across sandboxes"
        } else {
            "terminal.container_persistent = false: every new sandbox starts fresh"
        },
    ));
    checks
}

/// Each layer of `terminal.local_isolation = namespaces`, found by starting a sandbox and
/// running a command in it (see [`super::isolation::layers`]).
fn namespace_checks(network: &super::isolation::Network) -> Vec<Check> {
    super::isolation::layers(network)
        .into_iter()
        .map(|layer| {
            if layer.ok {
                Check::pass(layer.name, layer.detail)
            } else if let Some(fix) = layer.fix {
                if layer.required {
                    Check::fail(layer.name, layer.detail, fix)
                } else {
                    Check::warn(layer.name, layer.detail, fix)
                }
            } else if !layer.required {
                Check::warn(
                    layer.name,
                    layer.detail,
                    "not built yet for isolated sandboxes (issue 31)",
                )
            } else {
                Check::fail(
                    layer.name,
                    layer.detail,
                    "see the README's Isolation section; `terminal.local_isolation = none` opts \
                     out on purpose",
                )
            }
        })
        .collect()
}

fn bash_check() -> Check {
    match bash_version() {
        Ok(version) => Check::pass(
            "bash",
            format!("bash {version} runs the local backend's commands"),
        ),
        Err(e @ BashError::Exited(_)) => Check::fail("bash", e.to_string(), "install bash"),
        Err(e @ BashError::Spawn(_)) => Check::fail(
            "bash",
            e.to_string(),
            "install bash (the local backend runs commands with `bash -c`)",
        ),
    }
}

/// `terminal.local_isolation = none`, said on purpose: a ✗, whatever else holds — commands
/// reach everything the server's user can. Its detail also says whether a stop can still kill
/// every process a sandbox started (its cgroup v2).
fn isolation_check() -> Check {
    let stop = match cgroup::support() {
        Ok(base) => format!(
            "a stop still kills every process a sandbox started (its cgroup v2 under {})",
            base.display()
        ),
        Err(why) => format!(
            "and without a cgroup v2 ({why}) a stop kills the command's process group and \
             processes carrying the sandbox's TASKBOX_WORKSPACE only: processes started with \
             `setsid` and `env -i` survive it"
        ),
    };
    Check::fail(
        "isolation",
        format!(
            "terminal.local_isolation = none: commands run unisolated, as this user in the \
             host's namespaces (your files, other tasks and \
             taskbox's data are theirs to read and write); {stop}"
        ),
        "remove `terminal.local_isolation = none` from the config (namespaces is the default) \
         unless running unisolated is what you mean",
    )
}

/// Why `bash` could not report its version.
#[derive(Debug, thiserror::Error)]
pub enum BashError {
    /// bash started and failed.
    #[error("bash exited with {0}")]
    Exited(ExitStatus),
    /// bash could not be started (not installed, not on `PATH`).
    #[error("cannot run bash: {0}")]
    Spawn(std::io::Error),
}

/// The version of the `bash` on `PATH` (`$BASH_VERSION`, such as `5.2.21(1)-release`).
pub fn bash_version() -> Result<String, BashError> {
    let out = Command::new("bash")
        .args(["-c", "echo $BASH_VERSION"])
        .output()
        .map_err(BashError::Spawn)?;
    if !out.status.success() {
        return Err(BashError::Exited(out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
