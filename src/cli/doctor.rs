//! `taskbox doctor`: one ✓/✗ line per check, then the persistence note.

use std::process::ExitCode;

use serde::{Deserialize, Serialize};

use taskbox::config::Config;
use taskbox::engine::Paths;
use taskbox::provider::registry::{self, Foreign};
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

impl From<taskbox::provider::registry::Check> for Check {
    fn from(c: taskbox::provider::registry::Check) -> Check {
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
        match taskbox::provider::registry::resolve(&cfg.terminal.backend) {
            Ok(backend) => {
                checks.push(Check::pass("backend", backend.name()));
                checks.extend((backend.checks)(cfg).await.into_iter().map(Check::from));
            }
            Err(e) => checks.push(Check::fail("backend", e.to_string(), e.hint())),
        }
    }
    checks.push(data_dir_check(paths));
    checks.push(sqlite_check(paths));
    for foreign in registry::BACKENDS.iter().filter_map(|b| b.foreign) {
        if let Some(check) = archives_check(foreign, paths, &args) {
            checks.push(check);
        }
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

/// Snapshot archives of another installation that a backend keeps under the data dir (the
/// store was removed or moved aside while they existed): listed, and adopted or ignored on
/// request. `None` when the backend keeps no files there.
fn archives_check(foreign: &Foreign, paths: &Paths, args: &DoctorArgs) -> Option<Check> {
    let data_dir = &paths.data_dir;
    let archives = (foreign.archives)(data_dir)?;
    let store = match Store::open(&paths.store_file()) {
        Ok(store) => store,
        // The sqlite line says why.
        Err(_) => return None,
    };
    let name = "archives";
    // The error names what could not be done (`scan the snapshot archives: ...`).
    let fail = |e: &dyn std::fmt::Display| {
        Check::fail(
            name,
            format!("cannot {e}"),
            "check the data dir's permissions",
        )
    };
    let found = match (foreign.scan)(data_dir, store.installation_id()) {
        Ok(found) => found,
        Err(e) => return Some(fail(&e)),
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
        if let Err(e) = (foreign.ignore)(data_dir, &found) {
            return Some(fail(&e));
        }
        return Some(Check::pass(
            name,
            format!("ignoring archives of another installation (kept on disk): {listing}"),
        ));
    }
    if args.adopt_archives {
        let known = match store.task_ids() {
            Ok(ids) => ids,
            Err(e) => return Some(fail(&format!("list this store's tasks: {e}"))),
        };
        let (fresh, clash): (Vec<_>, Vec<_>) = found
            .into_iter()
            .partition(|t| !known.iter().any(|k| k.as_str() == t.task_id));
        let adopted = match (foreign.adopt)(data_dir, &fresh) {
            Ok(adopted) => adopted,
            Err(e) => return Some(fail(&e)),
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
            archives.display()
        ),
        hint: Some(
            "they are kept and never restored or deleted by this store; `taskbox doctor \
             --adopt-archives` makes each task this store does not know start from its newest \
             archive, `taskbox doctor --ignore-archives` stops this notice"
                .into(),
        ),
    })
}
