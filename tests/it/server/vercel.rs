//! The server on the Vercel backend, against `taskbox fake-vercel` over a real socket: the
//! server's timers keep files across a pause longer than the sandbox's lifetime, and a warm
//! command costs one HTTP request.

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::Value;

use super::ServerHome;
use crate::support::{ok, stderr, stdout, wait_for};
use crate::vercel_engine::{spawn_fake, FakeProcess};

/// A server home on the Vercel backend, served by a fake of its own.
fn vercel_home() -> (ServerHome, FakeProcess) {
    let mut h = ServerHome::new();
    h.home.set_env("VERCEL_TOKEN", "tok");
    h.home.set_env("VERCEL_TEAM_ID", "team_t");
    h.home.set_env("VERCEL_PROJECT_ID", "prj_t");
    let fake = spawn_fake(&h.home);
    for (k, v) in [
        ("terminal.backend", "vercel_sandbox"),
        ("terminal.container_memory", "2048"),
        ("terminal.vercel_api_url", fake.url.as_str()),
    ] {
        ok(&h.home.run(&["config", "set", k, v]));
    }
    (h, fake)
}

/// `METHOD /_admin/stats` on the fake (plain HTTP/1.1 over a TCP socket).
fn admin_stats(fake: &FakeProcess, method: &str) -> Value {
    let addr = fake
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/api")
        .to_string();
    let mut s = std::net::TcpStream::connect(&addr).expect("connect to the fake");
    write!(
        s,
        "{method} /_admin/stats HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read");
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{answer}: {e}"))
}

#[test]
fn files_survive_a_pause_longer_than_the_sandbox_lifetime_on_the_fake_vercel() {
    let (h, _fake) = vercel_home();
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
    let show = || -> Value {
        serde_json::from_str(&stdout(&h.home.run(&["show", "p", "--json"]))).unwrap_or(Value::Null)
    };
    // Nobody runs a command now; the server snapshots the idle sandbox by itself.
    let expired = wait_for(Duration::from_secs(30), || {
        (show()["task"]["state"] == "expired").then_some(())
    });
    assert!(expired.is_some(), "the idle sandbox was never snapshotted");
    // The pause outlasts the sandbox's platform lifetime (3 s) too: the fake has timed the
    // session out by now.
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

/// Through the CLI and the server, a command in a warm sandbox is one request to the platform:
/// no gc listing, no session probe, no snapshot listing per command.
#[test]
fn a_warm_command_through_the_server_is_one_request() {
    let (h, fake) = vercel_home();
    ok(&h.home.run(&["run", "-t", "w", "--", "echo warm"]));
    h.wait_for_server();
    // The server's start-up reconcile may still be listing: wait until it has listed both the
    // sandboxes and the snapshots (on Vercel a snapshot listing starts with a sandbox listing
    // of its own, so two in all) and every request has its answer, before counting.
    wait_for(Duration::from_secs(30), || {
        let stats = admin_stats(&fake, "GET");
        let answered = |endpoint: &str| -> u64 {
            stats["responses"][endpoint]
                .as_object()
                .map_or(0, |by_status| {
                    by_status.values().filter_map(Value::as_u64).sum()
                })
        };
        let all_answered = stats["requests"].as_object().is_some_and(|requests| {
            requests
                .iter()
                .all(|(endpoint, n)| n.as_u64() == Some(answered(endpoint)))
        });
        (answered("list_sandboxes") >= 2 && all_answered).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the server's start-up reconcile never finished listing: {}",
            admin_stats(&fake, "GET")
        )
    });
    admin_stats(&fake, "DELETE");
    for i in 0..5 {
        assert_eq!(
            ok(&h.home.run(&["run", "-t", "w", "--", &format!("echo {i}")])),
            format!("{i}\n")
        );
    }
    let stats = admin_stats(&fake, "GET");
    assert_eq!(stats["total"], 5, "requests per warm command: {stats}");
    assert_eq!(stats["requests"]["run_command"], 5, "{stats}");
}

/// A command does not outlive the server that ran it on Vercel either (issue 32 item 7): the
/// command's timeout is sent to the platform with it (plus a grace for taskbox's own kill), so
/// a server SIGKILLed under `--timeout 2 -- sleep 3600` leaves a command the platform kills
/// by itself well before its hour; the restarted server records it as interrupted and runs
/// the next command in the same sandbox.
#[test]
fn a_command_does_not_outlive_its_killed_server_on_the_fake_vercel() {
    let (h, _fake) = vercel_home();
    ok(&h.home.run(&["run", "-t", "v", "--", "true"]));
    let pid = h.wait_for_server();
    let marker = format!("36{}.5", std::process::id());
    let cli = h
        .home
        .cmd()
        .args([
            "run",
            "-t",
            "v",
            "--timeout",
            "2",
            "--",
            &format!("sleep {marker}"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn taskbox");
    // The sandbox's command: a process naming the marker other than the CLI that sent it.
    let cli_pid = cli.id();
    let command_runs = || {
        std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .any(|e| {
                e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) != Some(cli_pid)
                    && std::fs::read(e.path().join("cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&marker))
            })
    };
    let running = wait_for(Duration::from_secs(60), || command_runs().then_some(()));
    assert!(running.is_some(), "the command never started");
    let started = std::time::Instant::now();
    super::sigkill(pid);
    let mut cli = cli;
    let _ = cli.wait();

    // Its 2 s timeout and the 10 s grace, not its hour: the platform kills it.
    let gone = wait_for(Duration::from_secs(60), || (!command_runs()).then_some(()));
    assert!(
        gone.is_some(),
        "the command still runs {:?} after its server died",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "the command ran {:?} past its server",
        started.elapsed()
    );

    // A new server recovers the task: the command is recorded as interrupted, and the task
    // runs on.
    let o = h.home.run(&["run", "-t", "v", "--", "echo after"]);
    assert_eq!(stdout(&o), "after\n", "{}", stderr(&o));
    assert_ne!(h.wait_for_server(), pid);
    let show = ok(&h.home.run(&["show", "v", "--json"]));
    assert!(show.contains("\"interrupted_command\""), "{show}");
}
