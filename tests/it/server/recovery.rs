//! SIGKILL of the server in the middle of a snapshot and of a restore: the next CLI call starts
//! a new server, which recovers the task as the crash harness (`tests/it/crash.rs`) expects —
//! the files intact, no snapshot left pending, the latest complete snapshot restored, no orphan
//! after a gc, and a journal that replays cleanly.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{sigkill, ServerHome};
use crate::support::{ok, stderr, stdout};

fn show(h: &ServerHome, task: &str) -> Value {
    serde_json::from_str(&stdout(&h.home.run(&["show", task, "--json"]))).unwrap_or(Value::Null)
}

/// Polls (tightly: the state lasts a fraction of a second) until the task is in `state`.
fn wait_for_state(h: &ServerHome, task: &str, state: &str) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if show(h, task)["task"]["state"] == state {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

fn spawn(h: &ServerHome, args: &[&str]) -> Child {
    h.home
        .cmd()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn taskbox")
}

/// A task whose workspace is big enough (128 MB) that its snapshot and restore take a while,
/// with `marker` holding `1`.
fn big_task(h: &ServerHome, task: &str) -> i32 {
    ok(&h.home.run(&[
        "run",
        "-t",
        task,
        "--",
        "echo 1 > marker; head -c 128000000 /dev/urandom > blob.bin",
    ]));
    h.wait_for_server()
}

/// What the crash harness checks after a kill, with the next command starting a new server.
fn recovers(h: &ServerHome, task: &str, old_pid: i32) {
    let o = h
        .home
        .run(&["run", "-t", task, "--", "cat marker; wc -c < blob.bin"]);
    assert_eq!(ok(&o), "1\n128000000\n", "{}", stderr(&o));
    assert!(
        stderr(&o).contains("started a taskbox server"),
        "{}",
        stderr(&o)
    );
    let new = h.wait_for_server();
    assert_ne!(new, old_pid);
    let view = show(h, task);
    let snaps = view["task"]["snapshots"].as_array().expect("snapshots");
    for s in snaps {
        assert_ne!(s["status"], "pending", "a snapshot was left pending: {s}");
    }
    let latest = snaps
        .iter()
        .filter(|s| s["status"] == "complete")
        .max_by_key(|s| s["seq"].as_u64())
        .expect("a complete snapshot");
    let id = latest["id"].as_str().expect("its id");
    assert!(
        stderr(&o).contains(&format!("recreated from snapshot {id}")),
        "the latest snapshot ({id}) was not the one restored: {}",
        stderr(&o)
    );
    // Reconcile: no workspace other than the task's own is left.
    ok(&h.home.run(&["gc"]));
    let held = show(h, task)["task"]["sandbox"]["id"]
        .as_str()
        .map(str::to_string);
    let left: Vec<String> = std::fs::read_dir(h.data().join("local/sandboxes"))
        .expect("sandboxes")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|d| Some(d.as_str()) != held.as_deref())
        .collect();
    assert!(left.is_empty(), "orphaned sandboxes after gc: {left:?}");
    let tmp: Vec<_> = std::fs::read_dir(h.data().join("local/tmp"))
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        tmp.is_empty(),
        "half-done temporaries left: {tmp:?}; old server: {:?}",
        std::fs::read_to_string(format!("/proc/{old_pid}/stat"))
    );
    let tmp_archives: Vec<_> = std::fs::read_dir(h.data().join("local/snapshots").join(task))
        .expect("the task's snapshots")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(
        tmp_archives.is_empty(),
        "half-written archives left: {tmp_archives:?}"
    );
    let replay = h.home.run(&["replay", "--all"]);
    assert!(replay.status.success(), "replay: {}", stderr(&replay));
}

#[test]
fn a_server_killed_mid_snapshot_is_replaced_and_recovers_the_task() {
    let h = ServerHome::new();
    let pid = big_task(&h, "snap");
    let cli = spawn(&h, &["suspend", "snap"]);
    assert!(
        wait_for_state(&h, "snap", "snapshotting"),
        "the snapshot never started"
    );
    sigkill(pid);
    let o = cli.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    recovers(&h, "snap", pid);
}

#[test]
fn a_server_killed_mid_restore_is_replaced_and_recovers_the_task() {
    let h = ServerHome::new();
    big_task(&h, "rest");
    ok(&h.home.run(&["suspend", "rest"]));
    let pid = h.wait_for_server();
    let cli = spawn(&h, &["run", "-t", "rest", "--", "cat marker"]);
    assert!(
        wait_for_state(&h, "rest", "restoring"),
        "the restore never started"
    );
    sigkill(pid);
    let o = cli.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    recovers(&h, "rest", pid);
}
