//! The checks `taskbox doctor` runs for the local backend: that `bash` runs, since every
//! command of a local sandbox is `bash -c`; whether a stop can kill every process of a sandbox
//! (its cgroup); and what persists across sandboxes. They live here rather than in the CLI
//! because only providers spawn processes.

use std::process::{Command, ExitStatus};

use super::cgroup;
use crate::config::Config;
use crate::provider::registry::Check;

/// The local backend's doctor lines ([`crate::provider::registry::Entry::checks`]).
pub fn checks(config: &Config) -> Vec<Check> {
    let mut checks = vec![bash_check()];
    if config.terminal.local_isolation == crate::config::LocalIsolation::Namespaces {
        checks.extend(namespace_checks(&super::isolation::Network {
            mode: config.terminal.local_network,
            pasta: config.terminal.local_pasta.clone(),
        }));
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

/// Whether a local sandbox's processes are isolated so that a stop kills them all.
fn isolation_check() -> Check {
    match cgroup::support() {
        Ok(base) => Check::pass(
            "isolation",
            format!(
                "each local sandbox runs in its own cgroup v2 (under {}); stopping it kills \
                 every process it started",
                base.display()
            ),
        ),
        Err(why) => Check::warn(
            "isolation",
            format!(
                "no cgroup v2 for local sandboxes ({why}): a stop kills the command's process \
                 group and processes carrying the sandbox's TASKBOX_WORKSPACE, but processes \
                 started with `setsid` and `env -i`, or with TASKBOX_WORKSPACE unset, survive it"
            ),
            "run taskbox as root or in a cgroup delegated to your user (systemd `Delegate=yes`) \
             on a Linux with cgroup v2",
        ),
    }
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
