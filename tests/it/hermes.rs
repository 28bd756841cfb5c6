//! The Hermes Agent backend (`integrations/hermes`), driven by its pytest tests through Hermes's
//! real `BaseEnvironment.execute()` against this build's `taskbox`.
//!
//! On a fresh clone nothing Python is installed yet: the test makes a venv in the git-ignored
//! target dir (`target/hermes-venv`, under a file lock so parallel test processes do not install
//! it twice at once) and `pip install`s `hermes-agent==0.19.0`, pytest and the plugin (editable,
//! so a change to the plugin needs no reinstall). Without `python3` (and its `venv` module) or
//! PyPI the test says it is skipped and why — except under `CI=true`, where it fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::{install_lock, run_bounded, skip};

/// What the venv holds; a change (or a change of the plugin's pyproject) reinstalls.
const REQUIREMENTS: [&str; 2] = ["hermes-agent==0.19.0", "pytest"];
/// The longest the install or the tests may take.
const LIMIT: Duration = Duration::from_secs(900);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The cargo target dir (the binary is `<target>/<profile>/taskbox`).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_taskbox"))
        .parent()
        .and_then(Path::parent)
        .expect("the taskbox binary lives in <target>/<profile>/")
        .to_path_buf()
}

/// The first lines of a tool's output that say what went wrong.
fn head(text: &str, lines: usize) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(lines)
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Makes sure the venv has Hermes, pytest and the plugin; `Err` says why it cannot.
fn ensure_venv(venv: &Path) -> Result<(), String> {
    let plugin = repo().join("integrations/hermes");
    let pyproject = std::fs::read_to_string(plugin.join("pyproject.toml"))
        .map_err(|e| format!("cannot read integrations/hermes/pyproject.toml: {e}"))?;
    let stamp = format!("{}\n{pyproject}", REQUIREMENTS.join(" "));
    let marker = venv.join(".taskbox-ready");
    let ready = || std::fs::read_to_string(&marker).is_ok_and(|s| s == stamp);
    if ready() {
        return Ok(());
    }
    let lock_path = venv.with_extension("lock");
    let _lock_file = install_lock(&lock_path)?;
    // Another test process may have installed it while this one waited for the lock.
    if ready() {
        return Ok(());
    }
    match Command::new("python3").arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => return Err("`python3` is not installed (the test needs Python >= 3.11)".into()),
    }
    let python = venv.join("bin/python");
    if !python.is_file() {
        let mut cmd = Command::new("python3");
        cmd.arg("-m").arg("venv").arg(venv);
        let (ok, out) = run_bounded(cmd, Duration::from_secs(120), "`python3 -m venv`")?;
        if !ok {
            return Err(format!(
                "`python3 -m venv` failed (on Debian: apt-get install python3-venv): {}",
                head(&out, 3)
            ));
        }
    }
    let mut cmd = Command::new(&python);
    cmd.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--quiet",
    ])
    .args(REQUIREMENTS)
    .arg("-e")
    .arg(&plugin)
    // A registry that does not answer must not hang the test run.
    .env("PIP_DEFAULT_TIMEOUT", "60")
    .env("PIP_RETRIES", "1");
    let (ok, out) = run_bounded(cmd, LIMIT, "`pip install`")?;
    if !ok {
        return Err(format!(
            "`pip install hermes-agent==0.19.0 pytest -e integrations/hermes` failed (is PyPI reachable?): {}",
            head(&out, 4)
        ));
    }
    std::fs::write(&marker, stamp).map_err(|e| format!("cannot write {}: {e}", marker.display()))
}

#[test]
fn hermes_backend_passes_its_pytest_suite() {
    let venv = target_dir().join("hermes-venv");
    if let Err(reason) = ensure_venv(&venv) {
        skip(format!("{reason} (see integrations/hermes/README.md)"));
        return;
    }
    let scratch = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp"])
        .arg(scratch.path().join("pytest"))
        .arg("tests")
        .current_dir(repo().join("integrations/hermes"))
        .env("TASKBOX_BIN", env!("CARGO_BIN_EXE_taskbox"))
        .env("HERMES_HOME", scratch.path().join("hermes"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("TASKBOX_HOME")
        .env_remove("TASKBOX_DATA_DIR")
        .env_remove("TASKBOX_SERVER")
        .env_remove("RUST_LOG")
        .env_remove("VERCEL_TOKEN")
        .env_remove("VERCEL_OIDC_TOKEN")
        .env_remove("VERCEL_PROJECT_ID")
        .env_remove("VERCEL_TEAM_ID")
        .env_remove("TERMINAL_VERCEL_RUNTIME")
        .env_remove("TASKBOX_VERCEL_API_URL");
    let (ok, out) = run_bounded(cmd, LIMIT, "pytest").unwrap_or_else(|e| panic!("{e}"));
    assert!(ok, "the Hermes backend's pytest suite failed:\n{out}");
    eprint!("{out}");
}
