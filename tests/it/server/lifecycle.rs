//! What the server is for: files survive pauses, one server however many CLIs race, and a
//! killed server is replaced by one that recovers its tasks.

use std::time::Duration;

use serde_json::Value;

use super::{sigkill, ServerHome};
use crate::support::{ok, stderr, stdout, wait_for};

fn show(h: &ServerHome, task: &str) -> Value {
    serde_json::from_str(&stdout(&h.home.run(&["show", task, "--json"]))).unwrap_or(Value::Null)
}

#[test]
fn the_first_command_starts_a_server_and_says_so_once() {
    let h = ServerHome::new();
    let o = h.home.run(&[
        "run",
        "--task",
        "demo",
        "--",
        "bash",
        "-c",
        "echo hello > notes.txt; cat notes.txt",
    ]);
    assert_eq!(ok(&o), "hello\n");
    assert!(
        stderr(&o).contains("started a taskbox server"),
        "{}",
        stderr(&o)
    );
    let pid = h.wait_for_server();
    let o = h.home.run(&["run", "-t", "demo", "--", "cat", "notes.txt"]);
    assert_eq!(ok(&o), "hello\n");
    assert!(!stderr(&o).contains("started"), "{}", stderr(&o));
    assert_eq!(h.server_pid(), Some(pid), "the same server answered");
    let status = h.status().expect("status");
    assert_eq!(status["live_tasks"][0]["task"], "demo");
    assert_eq!(status["auto"], true);
    // suspend, resume and gc go through it too.
    ok(&h.home.run(&["suspend", "demo"]));
    ok(&h.home.run(&["resume", "demo"]));
    ok(&h.home.run(&["gc"]));
    assert_eq!(h.server_pid(), Some(pid));
}

/// The server's timers take the idle snapshot between two CLI calls: a pause longer than the
/// sandbox's lifetime loses nothing.
#[test]
fn files_survive_a_pause_longer_than_the_sandbox_lifetime() {
    let h = ServerHome::new();
    for (k, v) in [
        ("terminal.lifetime_seconds", "1"),
        ("terminal.sandbox_timeout_seconds", "3"),
        ("terminal.max_sandbox_lifetime_seconds", "3"),
        ("terminal.checkpoint_margin_seconds", "1"),
    ] {
        ok(&h.home.run(&["config", "set", k, v]));
    }
    let start = std::time::Instant::now();
    ok(&h.home.run(&["run", "-t", "p", "--", "echo kept > f"]));
    // Nobody runs a command now; the server snapshots the idle sandbox by itself.
    let expired = wait_for(Duration::from_secs(30), || {
        (show(&h, "p")["task"]["state"] == "expired").then_some(())
    });
    assert!(expired.is_some(), "the idle sandbox was never snapshotted");
    // And the pause outlasts the sandbox's platform lifetime (3 s) too.
    wait_for(Duration::from_secs(10), || {
        (start.elapsed() > Duration::from_secs(4)).then_some(())
    })
    .expect("time passes");
    let o = h.home.run(&["run", "-t", "p", "--", "cat f"]);
    assert_eq!(ok(&o), "kept\n", "{}", stderr(&o));
    assert!(
        stderr(&o).contains("recreated from snapshot"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn ten_clis_at_once_start_one_server() {
    let h = ServerHome::new();
    let children: Vec<_> = (0..10)
        .map(|i| {
            h.home
                .cmd()
                .args(["run", "-t", &format!("t{i}"), "--", &format!("echo {i}")])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect();
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(ok(o), format!("{i}\n"));
    }
    let notes = outs
        .iter()
        .filter(|o| stderr(o).contains("started a taskbox server"))
        .count();
    assert_eq!(notes, 1, "one CLI started the server");
    let log = std::fs::read_to_string(h.data().join("serve.log")).expect("serve.log");
    assert_eq!(
        log.matches("taskbox server (pid").count(),
        1,
        "one server started: {log}"
    );
    let status = h.status().expect("status");
    assert_eq!(status["live_tasks"].as_array().map(Vec::len), Some(10));
}

#[test]
fn a_second_server_on_one_data_dir_refuses() {
    let h = ServerHome::new();
    let mut first = h.spawn_serve(&[]);
    let pid = h.wait_for_server();
    assert_eq!(pid as u32, first.id());
    let o = h.home.run(&["serve"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        stderr(&o).contains("already running") && stderr(&o).contains(&pid.to_string()),
        "{}",
        stderr(&o)
    );
    // The first still serves.
    assert_eq!(
        ok(&h.home.run(&["run", "-t", "a", "--", "echo ok"])),
        "ok\n"
    );
    ok(&h.home.run(&["serve", "--stop"]));
    let _ = first.wait();
    assert!(!h.data().join("taskbox.sock").exists());
}

#[test]
fn a_stale_socket_file_is_replaced() {
    let h = ServerHome::new();
    std::fs::create_dir_all(h.data()).expect("data dir");
    // A dead server's socket: the file stays, nobody listens.
    drop(std::os::unix::net::UnixListener::bind(h.data().join("taskbox.sock")).expect("bind"));
    assert!(h.data().join("taskbox.sock").exists());
    let o = h.home.run(&["status"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let mut server = h.spawn_serve(&[]);
    h.wait_for_server();
    assert_eq!(
        ok(&h.home.run(&["run", "-t", "s", "--", "echo ok"])),
        "ok\n"
    );
    sigkill(server.id() as i32);
    let _ = server.wait();
    // Killed: its socket is stale in turn, and the next command replaces it.
    assert!(h.data().join("taskbox.sock").exists());
    assert_eq!(
        ok(&h.home.run(&["run", "-t", "s", "--", "echo again"])),
        "again\n"
    );
}

/// SIGKILL of the server in the middle of a command: the next CLI call starts a new server,
/// which recovers the task (the command is reported interrupted; the files are there).
#[test]
fn a_server_killed_mid_command_is_replaced_and_recovers_the_task() {
    let h = ServerHome::new();
    ok(&h.home.run(&["run", "-t", "k", "--", "echo before > f"]));
    let pid = h.wait_for_server();
    let cli = h
        .home
        .cmd()
        .args(["run", "-t", "k", "--", "echo during >> f; sleep 60"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    // The command has written its line (not only started: the server may be killed between
    // the start of a command and its first write, and then "during" is rightly never written).
    let f = h.data().join("local/tasks/k/workspace/f");
    let running = wait_for(Duration::from_secs(20), || {
        std::fs::read_to_string(&f)
            .is_ok_and(|t| t.contains("during"))
            .then_some(())
    });
    assert!(running.is_some(), "the command never wrote its line");
    sigkill(pid);
    let o = cli.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let o = h.home.run(&["run", "-t", "k", "--", "cat f"]);
    assert_eq!(ok(&o), "before\nduring\n", "{}", stderr(&o));
    assert!(
        stderr(&o).contains("started a taskbox server"),
        "{}",
        stderr(&o)
    );
    let new = h.wait_for_server();
    assert_ne!(new, pid);
    let v = show(&h, "k");
    assert_eq!(v["task"]["state"], "running", "{v}");
}

/// An auto-started server exits once idle with no live sandbox.
#[test]
fn an_idle_auto_server_exits_once_no_sandbox_lives() {
    let h = ServerHome::new();
    ok(&h
        .home
        .run(&["config", "set", "terminal.server_idle_exit_seconds", "1"]));
    ok(&h.home.run(&["run", "-t", "i", "--", "echo x > f"]));
    h.wait_for_server();
    // While the sandbox lives, the server lives.
    let still = wait_for(Duration::from_secs(3), || {
        h.status().is_none().then_some(())
    });
    assert!(still.is_none(), "the server left a live sandbox behind");
    ok(&h.home.run(&["suspend", "i"]));
    let gone = wait_for(Duration::from_secs(20), || {
        (!h.data().join("taskbox.sock").exists()).then_some(())
    });
    assert!(gone.is_some(), "the idle server did not exit");
    assert_eq!(h.home.run(&["status"]).status.code(), Some(1));
}

/// `terminal.server = always` never starts a server: with none running, a command fails with a
/// hint to start one (and its error object under `--json`), and nothing was run or started.
#[test]
fn always_fails_with_a_hint_when_no_server_runs() {
    let mut h = ServerHome::new();
    h.home.set_env("TASKBOX_SERVER", "always");
    let o = h.home.run(&["run", "-t", "nope", "--", "touch", "ran"]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("hint:") && err.contains("taskbox serve"),
        "a hint to start a server: {err}"
    );
    assert!(!err.contains("started a taskbox server"), "{err}");
    let o = h.home.run(&["suspend", "nope", "--json"]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("an error object on stdout");
    assert!(v["code"].is_string() && v["hint"].is_string(), "{v}");
    assert!(
        !h.data().join("taskbox.sock").exists(),
        "no server was started"
    );
    assert!(h.server_pid().is_none(), "no server answers");
    assert!(
        !h.data().join("local/tasks/nope/workspace/ran").exists(),
        "nothing ran"
    );
}

/// A server started under a low soft limit on open files raises it to the hard limit: it holds
/// two descriptors per task it has driven (the task's lock file and its lock socket), so under
/// a soft limit of 64 it used to fail the 22nd new task with EMFILE. Forty tasks each run a
/// command through it.
#[test]
fn a_server_raises_a_low_open_files_limit() {
    use std::os::unix::process::CommandExt;
    let h = ServerHome::new();
    let log = std::fs::File::create(h.home.path().join("serve.stderr")).expect("log");
    let mut cmd = h.home.cmd();
    cmd.arg("serve")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    // SAFETY: the hook only calls getrlimit and setrlimit, which are async-signal-safe, on a
    // `rlimit` of its own.
    unsafe {
        cmd.pre_exec(|| {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            lim.rlim_cur = 64.min(lim.rlim_max);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut server = cmd.spawn().expect("spawn serve");
    let pid = h.wait_for_server();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let open_files: Vec<&str> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("the open-files line")
        .split_whitespace()
        .collect();
    // "Max open files <soft> <hard> files"
    assert_eq!(
        open_files[3], open_files[4],
        "soft raised to hard: {limits}"
    );
    for n in 1..=40 {
        let task = format!("t{n}");
        assert_eq!(
            ok(&h.home.run(&["run", "-t", &task, "--", "echo ok"])),
            "ok\n",
            "task {task}"
        );
    }
    assert!(
        h.serve_stderr().contains("raised the open-files limit"),
        "{}",
        h.serve_stderr()
    );
    ok(&h.home.run(&["serve", "--stop"]));
    let _ = server.wait();
}
