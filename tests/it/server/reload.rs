//! A running server follows its config file (issue 32 item 13): `config set` of a key the
//! engine reads per command applies to the next command, with the server started before; a key
//! read only at start is named with how to restart; a file that no longer loads is answered
//! with its error while the server keeps its settings. The real binary, a real server.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::ServerHome;
use crate::support::{ok, stderr};

/// `GET path` on the server's Unix socket: the status and the body.
fn get(h: &ServerHome, path: &str) -> (u16, String) {
    let mut s = UnixStream::connect(h.data().join("taskbox.sock")).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: taskbox\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read");
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer}"));
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

/// `config set terminal.timeout 1` on a running server: the next `run -- sleep 3` is killed
/// by the new timeout (124) by the same server, which the CLI says; without the reload the
/// command ran its 3 s and exited 0.
#[test]
fn a_running_server_applies_a_changed_timeout_to_the_next_command() {
    let h = ServerHome::new();
    ok(&h.home.run(&["run", "-t", "warm", "--", "true"]));
    let pid = h.wait_for_server();

    let o = h.home.run(&["config", "set", "terminal.timeout", "1"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "the taskbox server (pid {pid}) applies the new terminal.timeout from its next command"
        )),
        "{err}"
    );
    assert!(!err.contains("restart"), "{err}");

    let started = Instant::now();
    let o = h.home.run(&["run", "-t", "warm", "--", "sleep", "3"]);
    assert_eq!(o.status.code(), Some(124), "{}", stderr(&o));
    assert!(stderr(&o).contains("timed out"), "{}", stderr(&o));
    assert_eq!(h.server_pid(), Some(pid), "the same server ran it");
    // Bounded loosely: a loaded machine starts commands slowly, and 3 s would be the sleep's.
    assert!(started.elapsed() < Duration::from_secs(30));

    // A new task gets it too, and so does a task the server had loaded before.
    let o = h.home.run(&["run", "-t", "fresh", "--", "sleep", "3"]);
    assert_eq!(o.status.code(), Some(124), "{}", stderr(&o));
    let o = h.home.run(&["show", "warm", "--json"]);
    let view: serde_json::Value = serde_json::from_str(&crate::support::stdout(&o)).expect("json");
    assert_eq!(
        view["task"]["settings"]["command_timeout_ms"], 1000,
        "{view}"
    );
}

/// A key the server reads only as it starts is named after `config set`, with the restart;
/// the server keeps running with its value meanwhile.
#[test]
fn config_set_names_a_key_that_needs_a_restart() {
    let h = ServerHome::new();
    ok(&h.home.run(&["run", "-t", "warm", "--", "true"]));
    let pid = h.wait_for_server();
    let o = h
        .home
        .run(&["config", "set", "terminal.gc_interval_seconds", "60"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "the taskbox server (pid {pid}) running for {} reads terminal.gc_interval_seconds only as it starts",
            h.data().display()
        )),
        "{err}"
    );
    assert!(err.contains("taskbox serve --stop"), "{err}");
    // The CLI's own key needs no restart: no note.
    let o = h.home.run(&["config", "set", "terminal.server", "auto"]);
    assert!(!stderr(&o).contains("restart"), "{}", stderr(&o));
    ok(&h.home.run(&["run", "-t", "warm", "--", "true"]));
    assert_eq!(h.server_pid(), Some(pid));
    let log = std::fs::read_to_string(h.data().join("serve.log")).unwrap_or_default();
    assert!(
        log.contains("terminal.gc_interval_seconds") && log.contains("restart"),
        "the server logs the key that waits for its restart: {log}"
    );
}

/// A config file edited by hand into one that does not load: requests are answered with the
/// file's error (naming the key and the fix) rather than run with half a config, `health`
/// still answers, the server keeps running; once the file is fixed, its values apply.
#[test]
fn a_config_file_that_does_not_load_is_answered_and_changes_nothing() {
    let h = ServerHome::new();
    ok(&h.home.run(&["run", "-t", "warm", "--", "true"]));
    let pid = h.wait_for_server();
    let file = h.home.path().join("config.toml");
    assert!(!file.exists(), "a fresh home has no config file");
    std::fs::write(&file, "[terminal]\nkeep_snapshots = 0\n").expect("write the config");

    let (status, body) = get(&h, "/v1/tasks");
    assert_eq!(status, 500, "{body}");
    let err: serde_json::Value = serde_json::from_str(&body).expect("a JSON error");
    assert_eq!(err["code"], "config", "{err}");
    let message = err["message"].as_str().expect("message");
    assert!(message.contains("terminal.keep_snapshots"), "{message}");
    assert!(
        message.contains("keeps running with the settings it had"),
        "{message}"
    );
    assert!(
        err["hint"]
            .as_str()
            .is_some_and(|h| h.contains("edit `keep_snapshots` under [terminal]")),
        "{err}"
    );
    let (status, body) = get(&h, "/v1/health");
    assert_eq!(status, 200, "{body}");

    std::fs::write(&file, "[terminal]\ntimeout = 1\n").expect("fix the config");
    let o = h.home.run(&["run", "-t", "warm", "--", "sleep", "3"]);
    assert_eq!(o.status.code(), Some(124), "{}", stderr(&o));
    assert_eq!(h.server_pid(), Some(pid), "the same server ran it");
}
