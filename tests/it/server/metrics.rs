//! `GET /metrics` (issue 35): a real server on its Unix socket and on `--listen` with a token,
//! tasks driven through the CLI, two scrapes parsed strictly (`crate::prom_text`), and the
//! counters between them moved by what the CLI did.

use std::io::{Read, Write};
use std::time::Duration;

use super::ServerHome;
use crate::prom_text::{parse, Exposition};
use crate::support::ok;

const TOKEN: &str = "metrics-tok-8c1f2e7a90b34d5c";

/// One `GET path` exchange with `Connection: close` over `stream`: status, headers, body.
fn get(mut stream: impl Read + Write, path: &str, token: Option<&str>) -> (u16, String, String) {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
    )
    .expect("write");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, head.to_ascii_lowercase(), body.to_string())
}

fn unix(h: &ServerHome) -> std::os::unix::net::UnixStream {
    let s =
        std::os::unix::net::UnixStream::connect(h.data().join("taskbox.sock")).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    s
}

fn tcp(addr: &str) -> std::net::TcpStream {
    let s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    s
}

/// A scrape over the socket, parsed strictly.
fn scrape(h: &ServerHome) -> Exposition {
    let (code, head, body) = get(unix(h), "/metrics", None);
    assert_eq!(code, 200, "{body}");
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    parse(&body).unwrap_or_else(|e| panic!("/metrics does not parse: {e}\n{body}"))
}

#[test]
fn metrics_parse_and_their_counters_move_as_the_cli_drives_tasks() {
    for mode in crate::support::isolation_modes(
        "metrics_parse_and_their_counters_move_as_the_cli_drives_tasks",
    ) {
        scrapes_move(mode);
    }
}

/// The test, with `terminal.local_isolation = mode`.
fn scrapes_move(mode: &str) {
    let h = ServerHome::new();
    ok(&h
        .home
        .run(&["config", "set", "terminal.local_isolation", mode]));
    let (mut serve, addr) = h.serve_tcp(TOKEN, &[]);

    let before = scrape(&h);
    for family in [
        "taskbox_tasks",
        "taskbox_sandboxes_open",
        "taskbox_commands_total",
        "taskbox_command_duration_seconds",
        "taskbox_provider_calls_total",
        "taskbox_provider_errors_total",
        "taskbox_provider_call_duration_seconds",
        "taskbox_retries_total",
        "taskbox_snapshots_taken_total",
        "taskbox_snapshot_bytes_total",
        "taskbox_snapshot_duration_seconds",
        "taskbox_snapshots_restored_total",
        "taskbox_restore_bytes_total",
        "taskbox_restore_duration_seconds",
        "taskbox_store_commit_duration_seconds",
        "taskbox_store_transitions_total",
        "taskbox_store_commit_failures_total",
        "taskbox_leases_held",
        "taskbox_leases_acquired_total",
        "taskbox_leases_lost_total",
    ] {
        let f = before.family(family);
        assert!(f.help.is_some(), "{family} has no HELP");
    }

    // Drive a task: two commands, a suspend (a snapshot), a command that restores it, and a
    // command that exits non-zero (it ran: `exited`).
    ok(&h
        .home
        .run(&["run", "-t", "m1", "--", "echo hello > notes.txt"]));
    ok(&h.home.run(&["run", "-t", "m1", "--", "cat notes.txt"]));
    ok(&h.home.run(&["suspend", "m1"]));
    let restored = ok(&h.home.run(&["run", "-t", "m1", "--", "cat notes.txt"]));
    assert!(restored.contains("hello"), "{restored}");
    let o = h.home.run(&["run", "-t", "m1", "--", "exit 3"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");

    let after = scrape(&h);
    let moved = |name: &str, labels: &[(&str, &str)]| {
        after.value(name, labels) - before.value(name, labels)
    };
    assert_eq!(
        moved("taskbox_commands_total", &[("outcome", "exited")]),
        4.0
    );
    assert_eq!(moved("taskbox_command_duration_seconds_count", &[]), 4.0);
    assert!(moved("taskbox_command_duration_seconds_sum", &[]) > 0.0);
    assert_eq!(
        moved("taskbox_provider_calls_total", &[("operation", "exec")]),
        4.0
    );
    assert_eq!(
        moved(
            "taskbox_provider_calls_total",
            &[("operation", "create_sandbox")]
        ),
        2.0,
        "a fresh sandbox and a restored one"
    );
    assert_eq!(moved("taskbox_snapshots_taken_total", &[]), 1.0);
    assert!(moved("taskbox_snapshot_bytes_total", &[]) > 0.0);
    assert_eq!(moved("taskbox_snapshot_duration_seconds_count", &[]), 1.0);
    assert_eq!(moved("taskbox_snapshots_restored_total", &[]), 1.0);
    assert_eq!(
        moved("taskbox_restore_bytes_total", &[]),
        moved("taskbox_snapshot_bytes_total", &[]),
        "the one restore was of the one snapshot"
    );
    assert!(moved("taskbox_store_transitions_total", &[]) >= 10.0);
    assert!(moved("taskbox_store_commit_duration_seconds_count", &[]) >= 5.0);
    assert_eq!(after.value("taskbox_store_commit_failures_total", &[]), 0.0);
    assert_eq!(after.value("taskbox_tasks", &[("state", "running")]), 1.0);
    let tasks: f64 = after
        .family("taskbox_tasks")
        .samples
        .iter()
        .map(|s| s.2)
        .sum();
    assert_eq!(tasks, 1.0, "one task in all");
    assert_eq!(after.value("taskbox_sandboxes_open", &[]), 1.0);
    assert_eq!(
        after.value("taskbox_leases_held", &[]),
        0.0,
        "SQLite: no leases"
    );

    // On TCP: the same text behind the token, a JSON 401 without it.
    let (code, _, body) = get(tcp(&addr), "/metrics", Some(TOKEN));
    assert_eq!(code, 200, "{body}");
    let remote = parse(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    assert_eq!(
        remote.value("taskbox_commands_total", &[("outcome", "exited")]),
        after.value("taskbox_commands_total", &[("outcome", "exited")])
    );
    for token in [None, Some("wrong")] {
        let (code, head, body) = get(tcp(&addr), "/metrics", token);
        assert_eq!(code, 401, "{body}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(!body.contains("taskbox_"), "{body}");
    }

    ok(&h.home.run(&["serve", "--stop"]));
    let _ = serve.wait();
}
