//! The checks `taskbox doctor` prints for the Vercel backend, one ✓/✗ line each: what sandboxes
//! are created from (image or deprecated runtime) and through which endpoint, resources, disk setting, API URL, auth mode (which variables are set, never their values),
//! the persistence model, and an authenticated round trip to the API.

use std::path::Path;

use super::auth::AuthReport;
use super::client::VercelClient;
use super::settings::{self, Origin, SandboxBase, API_URL_ENV, IMAGE_ENV, RUNTIME_ENV};
use crate::config::TerminalConfig;
use crate::core::{FailureKind, Millis};

pub use crate::provider::registry::Check;

/// The Vercel backend's doctor lines ([`crate::provider::registry::Entry::checks`]): config,
/// credentials (never their values) and, when those pass, an authenticated call to the API.
pub async fn checks(config: &crate::config::Config) -> Vec<Check> {
    use crate::clock::{Clock, SystemClock};
    let env = |k: &str| std::env::var(k).ok();
    let cwd = std::env::current_dir().unwrap_or_else(|_| ".".into());
    let mut checks = static_checks(&config.terminal, &env, &cwd, SystemClock.now_ms());
    if checks.iter().all(|c| c.ok) {
        match super::VercelProvider::from_config(
            &config.terminal,
            &env,
            &cwd,
            std::sync::Arc::new(SystemClock),
        ) {
            Ok(p) => checks.push(reachability(p.client()).await),
            Err(e) => checks.push(Check::fail(
                "vercel api",
                e.to_string(),
                e.hint().unwrap_or_else(|| "fix the checks above".into()),
            )),
        }
    }
    checks
}

fn origin_label(origin: Origin, key: &str, env: &str) -> String {
    match origin {
        Origin::Config => format!("from {key}"),
        Origin::Env => format!("from {env}"),
    }
}

/// The checks that need no network: config values, credentials and the persistence note.
pub fn static_checks(
    cfg: &TerminalConfig,
    env: &dyn Fn(&str) -> Option<String>,
    cwd: &Path,
    now: Millis,
) -> Vec<Check> {
    let mut checks = Vec::new();
    checks.push(match settings::check_base(cfg, env) {
        Ok((base, origin)) => {
            let from = match &base {
                SandboxBase::Image(_) => origin_label(origin, "terminal.vercel_image", IMAGE_ENV),
                SandboxBase::Runtime(_) => {
                    origin_label(origin, "terminal.vercel_runtime", RUNTIME_ENV)
                }
            };
            let mut check = Check::pass(
                "vercel create",
                format!("{} with {} ({from})", base.create_path(), base.describe()),
            );
            if let SandboxBase::Runtime(runtime) = base {
                // Still works, so a warning, not a failure; the hint says how to move to images.
                check.hint = Some(settings::runtime_deprecation(runtime, origin));
                check.warning = true;
            }
            check
        }
        Err(e) => Check::fail("vercel create", e.to_string(), e.hint()),
    });
    checks.push(match settings::check_resources(cfg) {
        Ok((cpu, mem)) => Check::pass("vercel resources", format!("{cpu} vCPU, {mem} MB memory")),
        Err(e) => Check::fail("vercel resources", e.to_string(), e.hint()),
    });
    checks.push(match settings::check_disk(cfg) {
        Ok(()) => Check::pass("disk setting", "terminal.container_disk unset"),
        Err(e) => Check::fail("disk setting", e.to_string(), e.hint()),
    });
    checks.push(match settings::check_api_url(cfg, env) {
        Ok((url, origin)) => Check::pass(
            "vercel api url",
            format!(
                "{url} ({})",
                origin_label(origin, "terminal.vercel_api_url", API_URL_ENV)
            ),
        ),
        Err(e) => Check::fail("vercel api url", e.to_string(), e.hint()),
    });
    let report = AuthReport::gather(env, cwd, now);
    checks.push(match &report.problem {
        None => Check::pass("vercel auth", report.summary()),
        Some(problem) => Check::fail("vercel auth", report.summary(), problem.hint()),
    });
    checks.push(Check::pass(
        "persistence",
        if cfg.container_persistent {
            "snapshot filesystem only; live processes do not survive sandbox recreation; sandboxes are created persistent, so a platform stop snapshots them too"
        } else {
            "off (terminal.container_persistent = false): files are discarded with each sandbox"
        },
    ));
    checks
}

/// An authenticated, cheap call (list one sandbox) that proves the URL, the token, the team
/// and the project together.
pub async fn reachability(client: &VercelClient) -> Check {
    let creds = client.credentials();
    match client.list_sandboxes(None, None, 1, None).await {
        Ok(_) => Check::pass(
            "vercel api",
            format!(
                "reached {} as team {}, project {}",
                client.base_url(),
                creds.team_id(),
                creds.project_id()
            ),
        ),
        Err(e) => {
            let hint = match e.kind {
                FailureKind::Auth => {
                    "check the credentials named above; `taskbox doctor` shows which are set"
                }
                FailureKind::Transient { .. } => {
                    "check the network and terminal.vercel_api_url, then run `taskbox doctor` again"
                }
                _ => "check terminal.vercel_api_url and that the project exists in the team",
            };
            Check::fail("vercel api", e.to_string(), hint)
        }
    }
}
