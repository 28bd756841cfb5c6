//! Vercel's own SDK run against the fake (`tests/sdk/conformance.mjs`).
//!
//! On a fresh clone the SDK is not installed yet: the test runs `npm ci --prefix tests/sdk`
//! itself (under a file lock, so that parallel test processes do not install it twice at once).
//! When Node.js, npm or the registry is not there, the test says it is skipped and why — except
//! under `CI=true`, where it fails: CI must run it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use taskbox::fake::Endpoint;

use super::{bounded, start_with, TOKEN};
use crate::support::{install_lock, skip};

/// The file that says the SDK is installed.
const SDK_MARKER: &str = "node_modules/@vercel/sandbox/package.json";

/// Makes sure the SDK is installed in `sdk_dir`, installing it with `npm ci` if it is not.
/// `Err` says why it cannot be (no Node.js or npm, no registry, a failed install).
fn ensure_sdk(sdk_dir: &Path) -> Result<(), String> {
    if sdk_dir.join(SDK_MARKER).is_file() {
        return Ok(());
    }
    let lock_path = sdk_dir.join(".npm-ci.lock");
    let _lock_file = install_lock(&lock_path)?;
    // Another test process may have installed it while this one waited for the lock.
    if sdk_dir.join(SDK_MARKER).is_file() {
        return Ok(());
    }
    for tool in ["node", "npm"] {
        match Command::new(tool).arg("--version").output() {
            Ok(o) if o.status.success() => {}
            _ => {
                return Err(format!(
                    "`{tool}` is not installed (the test needs Node.js >= 20.18 and npm)"
                ))
            }
        }
    }
    let out = Command::new("npm")
        .args([
            "ci",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            "--prefix",
        ])
        .arg(sdk_dir)
        // A registry that does not answer must not hang the test run.
        .env("npm_config_fetch_retries", "1")
        .env("npm_config_fetch_timeout", "60000")
        .output()
        .map_err(|e| format!("cannot run `npm ci`: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        // npm's first lines name the error (`code ECONNREFUSED`, the request that failed).
        let head: Vec<&str> = err
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .take(4)
            .collect();
        return Err(format!(
            "`npm ci --prefix tests/sdk` failed (is the npm registry reachable?): {}",
            head.join(" | ")
        ));
    }
    if !sdk_dir.join(SDK_MARKER).is_file() {
        return Err(format!("`npm ci` ran but {SDK_MARKER} is still missing"));
    }
    Ok(())
}

#[tokio::test]
async fn the_official_sdk_conforms() {
    let sdk_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk");
    let dir = sdk_dir.clone();
    let ready = tokio::time::timeout(
        Duration::from_secs(600),
        tokio::task::spawn_blocking(move || ensure_sdk(&dir)),
    )
    .await
    .map_err(|_| "`npm ci --prefix tests/sdk` took more than 10 minutes".to_string())
    .and_then(|joined| joined.map_err(|e| format!("the install panicked: {e}")))
    .and_then(|r| r);
    if let Err(reason) = ready {
        skip(format!("{reason} (run `npm ci --prefix tests/sdk`)"));
        return;
    }
    bounded(async {
        let fake = start_with(|o| o.token = Some(TOKEN.to_string())).await;
        let mut node = tokio::process::Command::new("node");
        node.arg(sdk_dir.join("conformance.mjs"))
            .env("TASKBOX_FAKE_VERCEL_URL", fake.server.base_url())
            .env("TASKBOX_FAKE_VERCEL_TOKEN", TOKEN)
            .kill_on_drop(true);
        let out = node.output().await.unwrap_or_else(|e| {
            panic!("cannot run `node` for the SDK conformance test ({e}); install Node.js >= 20.18")
        });
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the SDK disagrees with the fake:\n{stdout}{stderr}"
        );
        assert!(stdout.contains("conformance: ok"), "{stdout}{stderr}");
        eprint!("{stdout}");
        let stats = fake.server.stats();
        assert!(stats.requests_to(Endpoint::CreateSnapshot) >= 1);
        fake.server.shutdown().await.unwrap();
    })
    .await;
}
