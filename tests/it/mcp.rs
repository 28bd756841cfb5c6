//! `taskbox mcp` driven by the official MCP Python SDK (`mcp` on PyPI) as its client:
//! `tests/mcp/test_mcp.py`, run with pytest against the debug binary.
//!
//! On a fresh clone the SDK is not installed: the test makes a venv at `target/py-mcp` and
//! installs `tests/mcp/requirements.txt` into it itself (under a file lock, so that parallel
//! test processes do not install at once; again when the requirements change). When
//! `python3`, its `venv` module or PyPI is missing, the test says it is skipped and why —
//! except under `CI=true`, where it fails: CI must run it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::{install_lock, run_bounded, skip};

/// How long pytest may take (every test in it is bounded by itself, too).
const PYTEST_LIMIT: Duration = Duration::from_secs(600);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The venv: under the target dir, so it is git-ignored and goes with `cargo clean`.
fn venv_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target dir")
        .join("py-mcp")
}

/// The first lines of a failed tool's stderr, for the skip message.
fn head(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(4)
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Makes sure the venv has the requirements, creating and installing it if not. `Err` says why
/// it cannot (no `python3`, no `venv` module, no PyPI, a failed install).
fn ensure_venv(venv: &Path) -> Result<PathBuf, String> {
    let requirements = repo().join("tests/mcp/requirements.txt");
    let wanted = std::fs::read_to_string(&requirements)
        .map_err(|e| format!("cannot read {}: {e}", requirements.display()))?;
    let python = venv.join("bin/python");
    let stamp = venv.join("taskbox-requirements.txt");
    let installed = || std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted);
    if installed() && python.is_file() {
        return Ok(python);
    }
    let parent = venv.parent().expect("the venv has a parent");
    std::fs::create_dir_all(parent)
        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    let lock_path = parent.join("py-mcp.lock");
    let _lock_file = install_lock(&lock_path)?;
    // Another test process may have installed it while this one waited for the lock.
    if installed() && python.is_file() {
        return Ok(python);
    }
    match Command::new("python3").arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => return Err("`python3` is not installed (the test needs Python >= 3.10)".into()),
    }
    if !python.is_file() {
        let out = Command::new("python3")
            .args(["-m", "venv"])
            .arg(venv)
            .output()
            .map_err(|e| format!("cannot run `python3 -m venv`: {e}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(venv);
            return Err(format!(
                "`python3 -m venv` failed (on Debian: apt-get install python3-venv): {}",
                head(&out.stderr)
            ));
        }
    }
    let out = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--retries", "1", "--timeout", "60", "-r"])
        .arg(&requirements)
        .output()
        .map_err(|e| format!("cannot run pip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`pip install -r tests/mcp/requirements.txt` failed (is PyPI reachable?): {}",
            head(&out.stderr)
        ));
    }
    std::fs::write(&stamp, &wanted)
        .map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    Ok(python)
}

#[test]
fn the_official_python_sdk_drives_taskbox_mcp() {
    let python = match ensure_venv(&venv_dir()) {
        Ok(p) => p,
        Err(reason) => {
            skip(reason);
            return;
        }
    };
    let mut pytest = Command::new(&python);
    pytest
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-x"])
        .arg(repo().join("tests/mcp"))
        .env("TASKBOX_BIN", env!("CARGO_BIN_EXE_taskbox"))
        .env_remove("TASKBOX_HOME")
        .env_remove("TASKBOX_SERVER")
        .env_remove("VERCEL_TOKEN")
        .env_remove("VERCEL_OIDC_TOKEN")
        .env("PYTHONDONTWRITEBYTECODE", "1");
    // In a process group of its own, killed whole on every path out (a timeout, a panic).
    let (ok, out) =
        run_bounded(pytest, PYTEST_LIMIT, "pytest tests/mcp").unwrap_or_else(|e| panic!("{e}"));
    assert!(ok, "pytest tests/mcp failed:\n{out}");
    eprint!("{out}");
}
