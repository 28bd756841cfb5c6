//! `taskbox doctor`: one ✓/✗ line per check, then the persistence note.

use std::process::ExitCode;

use serde::{Deserialize, Serialize};

use taskbox::config::{Backend, Config};
use taskbox::engine::Paths;
use taskbox::provider::local::doctor::{bash_version, BashError};
use taskbox::store::Store;

use super::output::{print_json, Failure};

/// One check's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl Check {
    pub fn pass(name: &str, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            ok: true,
            detail: detail.into(),
            hint: None,
        }
    }

    pub fn fail(name: &str, detail: impl Into<String>, hint: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            ok: false,
            detail: detail.into(),
            hint: Some(hint.into()),
        }
    }
}

impl From<taskbox::provider::vercel::doctor::Check> for Check {
    fn from(c: taskbox::provider::vercel::doctor::Check) -> Check {
        Check {
            name: c.name,
            ok: c.ok,
            detail: c.detail,
            hint: c.hint,
        }
    }
}

pub const PERSISTENCE_NOTE: &str =
    "snapshots keep the filesystem only; live processes do not survive sandbox recreation";

pub async fn run(paths: &Paths, json: bool) -> Result<ExitCode, Failure> {
    let mut checks = Vec::new();
    let config = match Config::load(&paths.config_file) {
        Ok(c) => {
            checks.push(Check::pass(
                "config",
                format!("{} is valid", paths.config_file.display()),
            ));
            Some(c)
        }
        Err(e) => {
            checks.push(Check::fail(
                "config",
                e.to_string(),
                "fix the file, or remove it to use the defaults (`taskbox config set` rewrites it)",
            ));
            None
        }
    };
    if let Some(cfg) = &config {
        checks.push(Check::pass("backend", cfg.terminal.backend.as_str()));
        match cfg.terminal.backend {
            Backend::Local => {
                checks.push(bash_check());
                checks.push(Check::pass(
                    "persistence",
                    if cfg.terminal.container_persistent {
                        "terminal.container_persistent = true: files are kept in snapshots across sandboxes"
                    } else {
                        "terminal.container_persistent = false: every new sandbox starts fresh"
                    },
                ));
            }
            // The Vercel checks include the persistence line.
            Backend::VercelSandbox => checks.extend(super::vercel_checks(cfg).await),
        }
    }
    checks.push(data_dir_check(paths));
    checks.push(sqlite_check(paths));

    // Secrets (a password in the API URL, a token quoted in an error) are redacted alike in
    // every line, with the one redaction the journal and export use.
    let mut value = serde_json::to_value(&checks)
        .map_err(|e| Failure::new(format!("cannot encode JSON: {e}")))?;
    taskbox::redact::redact_value(&mut value);
    let checks: Vec<Check> = serde_json::from_value(value)
        .map_err(|e| Failure::new(format!("cannot encode JSON: {e}")))?;
    let all_ok = checks.iter().all(|c| c.ok);
    if json {
        print_json(
            &serde_json::json!({ "ok": all_ok, "checks": checks, "note": PERSISTENCE_NOTE }),
        )?;
    } else {
        let mut out = String::new();
        for c in &checks {
            out.push_str(&format!(
                "{} {}: {}\n",
                if c.ok { "✓" } else { "✗" },
                c.name,
                c.detail
            ));
            if let Some(h) = &c.hint {
                out.push_str(&format!("    hint: {h}\n"));
            }
        }
        out.push_str(&format!("note: {PERSISTENCE_NOTE}\n"));
        super::output::write_ignoring_broken_pipe(&mut std::io::stdout().lock(), out.as_bytes())?;
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
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

fn data_dir_check(paths: &Paths) -> Check {
    let dir = &paths.data_dir;
    let probe = dir.join(".doctor-probe");
    let res = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&probe, b"ok"))
        .and_then(|_| std::fs::remove_file(&probe));
    match res {
        Ok(()) => Check::pass("data dir", format!("{} is writable", dir.display())),
        Err(e) => Check::fail(
            "data dir",
            format!("{} is not writable: {e}", dir.display()),
            "set TASKBOX_HOME to a writable directory",
        ),
    }
}

fn sqlite_check(paths: &Paths) -> Check {
    let db = paths.store_file();
    match Store::open(&db).and_then(|s| s.integrity_check().map(|_| s)) {
        Ok(s) => Check::pass(
            "sqlite",
            format!("{} passes integrity_check (installation {})", db.display(), s.installation_id()),
        ),
        Err(e) => Check::fail(
            "sqlite",
            format!("{}: {e}", db.display()),
            "move the damaged file aside; taskbox creates a new store (tasks and journal in the old file are kept there)",
        ),
    }
}
