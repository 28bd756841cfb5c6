//! `taskbox doctor`: one ✓/✗ line per check, then the persistence note.

use std::process::ExitCode;

use serde::{Deserialize, Serialize};

use taskbox::config::{Backend, Config};
use taskbox::engine::Paths;
use taskbox::provider::local::cgroup;
use taskbox::provider::local::doctor::{bash_version, BashError};
use taskbox::provider::local::foreign;
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
    /// Works, but with something missing the detail names (printed `!`; does not fail doctor).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warning: bool,
}

impl Check {
    pub fn pass(name: &str, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            ok: true,
            detail: detail.into(),
            hint: None,
            warning: false,
        }
    }

    pub fn warn(name: &str, detail: impl Into<String>, hint: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            ok: true,
            detail: detail.into(),
            hint: Some(hint.into()),
            warning: true,
        }
    }

    pub fn fail(name: &str, detail: impl Into<String>, hint: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            ok: false,
            detail: detail.into(),
            hint: Some(hint.into()),
            warning: false,
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
            warning: c.warning,
        }
    }
}

pub const PERSISTENCE_NOTE: &str =
    "snapshots keep the filesystem only; live processes do not survive sandbox recreation";

/// `taskbox doctor`'s arguments.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Adopt the snapshot archives of another installation (a removed or moved-aside store):
    /// each of their tasks this store does not know starts its first sandbox from its newest
    /// archive.
    #[arg(long, conflicts_with = "ignore_archives")]
    pub adopt_archives: bool,
    /// Stop noting the snapshot archives of another installation (they stay on disk, and this
    /// store never uses or deletes them).
    #[arg(long)]
    pub ignore_archives: bool,
}

pub async fn run(paths: &Paths, args: DoctorArgs) -> Result<ExitCode, Failure> {
    let json = args.json;
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
                if cfg.terminal.local_isolation == taskbox::config::LocalIsolation::Namespaces {
                    checks.extend(namespace_checks());
                } else {
                    checks.push(isolation_check());
                }
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
    if let Some(check) = archives_check(paths, &args) {
        checks.push(check);
    }

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
                match (c.ok, c.warning) {
                    (false, _) => "✗",
                    (true, true) => "!",
                    (true, false) => "✓",
                },
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

/// Each layer of `terminal.local_isolation = namespaces`, found by starting a sandbox and
/// running a command in it (see `provider::local::isolation::layers`).
fn namespace_checks() -> Vec<Check> {
    taskbox::provider::local::isolation::layers()
        .into_iter()
        .map(|layer| {
            if layer.ok {
                Check::pass(layer.name, layer.detail)
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
            "move the damaged file aside; taskbox creates a new store (tasks and journal in the old file are kept there; the snapshot archives stay on disk, and `taskbox doctor` offers to adopt them)",
        ),
    }
}

/// Snapshot archives of another installation under the local root (the store was removed or
/// moved aside while they existed): listed, and adopted or ignored on request. `None` when the
/// local root does not exist.
fn archives_check(paths: &Paths, args: &DoctorArgs) -> Option<Check> {
    let root = paths.data_dir.join("local");
    if !root.is_dir() {
        return None;
    }
    let store = match Store::open(&paths.store_file()) {
        Ok(store) => store,
        // The sqlite line says why.
        Err(_) => return None,
    };
    let name = "archives";
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        Check::fail(
            name,
            format!("cannot {what}: {e}"),
            "check the data dir's permissions",
        )
    };
    let found = match foreign::scan(&root, store.installation_id()) {
        Ok(found) => found,
        Err(e) => return Some(fail("scan the snapshot archives", &e)),
    };
    if found.is_empty() {
        return Some(Check::pass(
            name,
            "no snapshot archives of another installation (other than ignored ones)",
        ));
    }
    let listing = found
        .iter()
        .map(|t| {
            format!(
                "{} ({} archive(s) of installation {}, newest {})",
                t.task_id,
                t.archives,
                t.installation_id,
                taskbox::clock::format_ms(t.created_at)
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    if args.ignore_archives {
        if let Err(e) = foreign::ignore(&root, &found) {
            return Some(fail("record the ignored installations", &e));
        }
        return Some(Check::pass(
            name,
            format!("ignoring archives of another installation (kept on disk): {listing}"),
        ));
    }
    if args.adopt_archives {
        let known = match store.task_ids() {
            Ok(ids) => ids,
            Err(e) => return Some(fail("list this store's tasks", &e)),
        };
        let (fresh, clash): (Vec<_>, Vec<_>) = found
            .into_iter()
            .partition(|t| !known.iter().any(|k| k.as_str() == t.task_id));
        let adopted = match foreign::adopt(&root, &fresh) {
            Ok(adopted) => adopted,
            Err(e) => return Some(fail("record the adoptions", &e)),
        };
        let mut detail = format!(
            "adopted: {} (each task's next sandbox starts from its newest archive)",
            if adopted.is_empty() {
                "none".to_string()
            } else {
                adopted
                    .iter()
                    .map(|t| format!("{} from {}", t.task_id, t.snapshot_id))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        if clash.is_empty() {
            return Some(Check::pass(name, detail));
        }
        let names: Vec<&str> = clash.iter().map(|t| t.task_id.as_str()).collect();
        detail.push_str(&format!(
            "; not adopted, because this store already has these tasks: {}",
            names.join(", ")
        ));
        return Some(Check {
            name: name.into(),
            ok: true,
            warning: false,
            detail,
            hint: Some(
                "their archives stay on disk untouched; `taskbox doctor --ignore-archives` stops \
                 this notice"
                    .into(),
            ),
        });
    }
    Some(Check {
        name: name.into(),
        // Nothing is broken: the archives are kept and never used or deleted by this store.
        ok: true,
        warning: false,
        detail: format!(
            "{} holds snapshot archives this store did not make (it is newer than them: was the \
             database removed or moved aside?): {listing}",
            root.join("snapshots").display()
        ),
        hint: Some(
            "they are kept and never restored or deleted by this store; `taskbox doctor \
             --adopt-archives` makes each task this store does not know start from its newest \
             archive, `taskbox doctor --ignore-archives` stops this notice"
                .into(),
        ),
    })
}
