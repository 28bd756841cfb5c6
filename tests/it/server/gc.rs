//! gc runs in the server on a period, `taskbox gc` asks it for one now, and no command lists
//! the provider's resources.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::ServerHome;
use crate::support::{ok, stderr, stdout, wait_for};

/// Makes an orphan the way a crash leaves one: a live local sandbox of this installation that
/// no task holds (a copy of task `a`'s, renamed to task `ghost`). Returns its directory.
fn plant_orphan(data: &Path, live: &str) -> PathBuf {
    let sandboxes = data.join("local/sandboxes");
    let inst = live.rsplit('-').next().expect("installation in the name");
    let name = format!("taskbox-ghost-g1-{inst}");
    let dir = sandboxes.join(&name);
    std::fs::create_dir_all(dir.join("workspace")).expect("orphan dir");
    let mut meta: Value = serde_json::from_str(
        // A task's live sandbox sits at its task's stable path; a parked one under `sandboxes/`.
        &std::fs::read_to_string(data.join("local/tasks/a/meta.json"))
            .or_else(|_| std::fs::read_to_string(sandboxes.join(live).join("meta.json")))
            .expect("meta.json"),
    )
    .expect("meta is JSON");
    meta["name"] = name.clone().into();
    meta["task_id"] = "ghost".into();
    std::fs::write(dir.join("meta.json"), meta.to_string()).expect("write meta");
    dir
}

fn live_sandbox(h: &ServerHome, task: &str) -> String {
    let v: Value =
        serde_json::from_str(&stdout(&h.home.run(&["show", task, "--json"]))).expect("show");
    v["task"]["sandbox"]["id"]
        .as_str()
        .expect("a live sandbox")
        .to_string()
}

#[test]
fn the_server_runs_gc_on_its_period() {
    let h = ServerHome::new();
    ok(&h
        .home
        .run(&["config", "set", "terminal.gc_interval_seconds", "1"]));
    ok(&h.home.run(&["run", "-t", "a", "--", "true"]));
    h.wait_for_server();
    let orphan = plant_orphan(&h.data(), &live_sandbox(&h, "a"));
    // Nobody asks: the server's own gc stops it.
    let gone = wait_for(Duration::from_secs(20), || (!orphan.exists()).then_some(()));
    assert!(gone.is_some(), "the periodic gc never stopped the orphan");
    // The task's own sandbox is untouched.
    assert_eq!(
        ok(&h.home.run(&["run", "-t", "a", "--", "echo ok"])),
        "ok\n"
    );
}

#[test]
fn taskbox_gc_asks_the_server_and_commands_do_not_reconcile() {
    let h = ServerHome::new();
    ok(&h.home.run(&["run", "-t", "a", "--", "true"]));
    let pid = h.wait_for_server();
    let orphan = plant_orphan(&h.data(), &live_sandbox(&h, "a"));
    // Commands do not list the provider's sandboxes (default period: 900 s).
    for _ in 0..3 {
        ok(&h.home.run(&["run", "-t", "a", "--", "true"]));
    }
    ok(&h.home.run(&["suspend", "a"]));
    ok(&h.home.run(&["resume", "a"]));
    assert!(orphan.exists(), "a command reconciled");
    let report: Value =
        serde_json::from_str(&ok(&h.home.run(&["gc", "--json"]))).expect("gc --json");
    assert_eq!(
        report["sandboxes_stopped"][0]["task_id"], "ghost",
        "{report}"
    );
    assert!(!orphan.exists());
    assert_eq!(h.server_pid(), Some(pid), "the server ran it");

    // The one-shot engine does not reconcile per command either.
    let orphan = plant_orphan(&h.data(), &live_sandbox(&h, "a"));
    let never = |args: &[&str]| {
        h.home
            .cmd()
            .args(args)
            .env("TASKBOX_SERVER", "never")
            .output()
            .expect("taskbox")
    };
    ok(&h.home.run(&["serve", "--stop"]));
    ok(&never(&["run", "-t", "a", "--", "true"]));
    assert!(orphan.exists(), "a one-shot command reconciled");
    ok(&never(&["gc"]));
    assert!(!orphan.exists());
}

#[test]
fn the_gc_interval_is_validated() {
    let h = ServerHome::new();
    let o = h
        .home
        .run(&["config", "set", "terminal.gc_interval_seconds", "0"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        stderr(&o).contains("terminal.gc_interval_seconds") && stderr(&o).contains("from 1 to"),
        "{}",
        stderr(&o)
    );
}
