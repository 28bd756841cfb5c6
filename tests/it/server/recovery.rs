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

fn spawn(h: &ServerHome, args: &[&str]) -> Child {
    h.home
        .cmd()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn taskbox")
}

/// A task whose workspace is big enough (128 MB, and 5,000 files: a restore reuses file
/// contents, but makes every file anew) that its snapshot and restore take a while, with
/// `marker` holding `1`.
fn big_task(h: &ServerHome, task: &str) -> i32 {
    ok(&h.home.run(&[
        "run",
        "-t",
        task,
        "--",
        "echo 1 > marker; head -c 128000000 /dev/urandom > blob.bin; \
         (mkdir many && cd many && seq 1 5000 | xargs -n 500 touch)",
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
    // The live sandbox came from the latest complete snapshot: restored by this run (which
    // then says so), or by the killed server's restore if that got as far as the sandbox
    // before the kill (the new server finds it and keeps it).
    let from = view["task"]["sandbox"]["source_snapshot"].as_str();
    assert_eq!(
        from,
        Some(id),
        "the latest snapshot ({id}) is not what the sandbox came from: {}",
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

/// Runs `args` through the server and SIGKILLs the server while `task` is in `state`, then
/// checks the recovery. A state lasts a fraction of a second and each look at it is a CLI
/// process: on a loaded machine the look may miss it, or the kill may land after the work was
/// done. Such an attempt proves nothing and is made again after `prepare` (through the server
/// the next CLI call starts); only a kill that cut the call short (125) counts.
fn kill_the_server_while(h: &ServerHome, task: &str, state: &str, prepare: &[&str], args: &[&str]) {
    for _attempt in 0..10 {
        if !prepare.is_empty() {
            ok(&h.home.run(prepare));
        }
        let pid = h.wait_for_server();
        let mut cli = spawn(h, args);
        let start = Instant::now();
        let mut seen = false;
        while start.elapsed() < Duration::from_secs(30) {
            if show(h, task)["task"]["state"] == state {
                seen = true;
                break;
            }
            if cli.try_wait().expect("poll the CLI").is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if seen {
            sigkill(pid);
        }
        let o = cli.wait_with_output().expect("wait");
        if !seen || o.status.code() == Some(0) {
            // Missed: the work was over before the look or the kill.
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
            continue;
        }
        assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
        recovers(h, task, pid);
        return;
    }
    panic!("no attempt of ten caught the server while {task} was {state}");
}

#[test]
fn a_server_killed_mid_snapshot_is_replaced_and_recovers_the_task() {
    let h = ServerHome::new();
    big_task(&h, "snap");
    // Each new attempt needs a live sandbox to snapshot again.
    kill_the_server_while(
        &h,
        "snap",
        "snapshotting",
        &["run", "-t", "snap", "--", "echo 1 > marker"],
        &["suspend", "snap"],
    );
}

#[test]
fn a_server_killed_mid_restore_is_replaced_and_recovers_the_task() {
    let h = ServerHome::new();
    big_task(&h, "rest");
    // Each attempt suspends the task anew, so that the run has a snapshot to restore.
    kill_the_server_while(
        &h,
        "rest",
        "restoring",
        &["suspend", "rest"],
        &["run", "-t", "rest", "--", "cat marker"],
    );
}

/// A command does not outlive the server killed under it (issue 32, item 7): a writer loop with
/// `--timeout 5`, its server SIGKILLed; the next CLI call's server recovers the task, records
/// the command as interrupted, and from then on the file grows no more — not after the
/// recovery, not past the timeout. Unisolated, the restarted server kills the sandbox's
/// processes before anything else; isolated, the sandbox ended with its server.
#[test]
fn a_command_does_not_outlive_the_server_killed_under_it() {
    for mode in
        crate::support::isolation_modes("a_command_does_not_outlive_the_server_killed_under_it")
    {
        let h = ServerHome::new();
        ok(&h
            .home
            .run(&["config", "set", "terminal.local_isolation", mode]));
        ok(&h.home.run(&["run", "-t", "w", "--", "echo ready"]));
        let pid = h.wait_for_server();
        let grow = h.data().join("local/tasks/w/workspace/grow");
        let cli = spawn(
            &h,
            &[
                "run",
                "-t",
                "w",
                "--timeout",
                "5",
                "--",
                "while :; do echo x >> grow; sleep 0.05; done",
            ],
        );
        let size = || std::fs::metadata(&grow).map_or(0, |m| m.len());
        let writing =
            crate::support::wait_for(Duration::from_secs(30), || (size() > 0).then_some(()));
        assert!(writing.is_some(), "{mode}: the writer never wrote");
        sigkill(pid);
        let o = cli.wait_with_output().expect("wait");
        assert_eq!(o.status.code(), Some(125), "{mode}: {}", stderr(&o));
        let killed_at = Instant::now();

        // The next call starts a server, which recovers the task first.
        let o = h.home.run(&["run", "-t", "w", "--", "echo after"]);
        assert_eq!(ok(&o), "after\n", "{mode}: {}", stderr(&o));
        assert_ne!(h.wait_for_server(), pid);
        let v = show(&h, "w");
        assert!(
            v["journal"].to_string().contains("\"interrupted_command\""),
            "{mode}: the command is recorded as interrupted: {v}"
        );
        // From the recovery on, nothing writes: the size holds still while the writer would
        // have written dozens of lines, and past its 5 s timeout.
        let settled = size();
        let watch_until =
            (killed_at + Duration::from_secs(7)).max(Instant::now() + Duration::from_secs(2));
        while Instant::now() < watch_until {
            assert_eq!(
                size(),
                settled,
                "{mode}: the interrupted command still writes after the recovery"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
