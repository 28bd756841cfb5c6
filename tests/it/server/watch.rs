//! `taskbox watch` and `GET /v1/tasks/{task}/watch`: a task's transitions as they are committed.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use super::ServerHome;
use crate::support::{ok, stderr};

/// A `taskbox watch` process and its stdout lines as they come.
struct Watcher {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watcher {
    fn start(h: &ServerHome, args: &[&str]) -> Watcher {
        let mut child = h
            .home
            .cmd()
            .arg("watch")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn watch");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Watcher { child, lines }
    }

    fn next(&self) -> Option<String> {
        self.lines.recv_timeout(Duration::from_secs(30)).ok()
    }

    /// JSON lines until one says the task reached `state` (all of them, that one last).
    fn until(&self, state: &str) -> Vec<Value> {
        let mut seen = Vec::new();
        while let Some(l) = self.next() {
            let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l}: {e}"));
            let done = v["to"] == state;
            seen.push(v);
            if done {
                return seen;
            }
        }
        panic!("never reached {state}: {seen:?}");
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pairs(lines: &[Value]) -> Vec<(String, String)> {
    lines
        .iter()
        .filter(|v| v["type"] == "transition")
        .map(|v| {
            (
                v["from"].as_str().unwrap_or("").to_string(),
                v["to"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn watch_streams_a_tasks_transitions_as_they_happen() {
    let h = ServerHome::new();
    ok(&h.home.run(&["run", "-t", "w", "--", "echo x > f"]));
    h.wait_for_server();
    let json = Watcher::start(&h, &["w", "--json"]);
    let text = Watcher::start(&h, &["w"]);
    let first: Value = serde_json::from_str(&json.next().expect("a first line")).expect("JSON");
    assert_eq!(first["type"], "state", "{first}");
    assert_eq!(first["task"], "w");
    assert_eq!(first["state"], "running");
    assert!(first["sandbox"].is_string(), "{first}");
    assert_eq!(
        text.next()
            .as_deref()
            .map(|l| l.starts_with("w: running (sandbox ")),
        Some(true)
    );

    ok(&h.home.run(&["suspend", "w"]));
    let seen = json.until("expired");
    assert_eq!(
        pairs(&seen),
        [("running", "snapshotting"), ("snapshotting", "expired")]
            .map(|(a, b)| (a.to_string(), b.to_string())),
        "{seen:?}"
    );
    assert_eq!(seen[0]["event"], "suspend_requested", "{seen:?}");
    assert!(seen[0]["at"].as_u64().is_some_and(|t| t > 0), "{seen:?}");

    // A command restores the task: the watcher sees it come back.
    assert_eq!(ok(&h.home.run(&["run", "-t", "w", "--", "cat f"])), "x\n");
    let seen = json.until("running");
    assert_eq!(
        pairs(&seen).first().map(|(a, b)| (a.as_str(), b.as_str())),
        Some(("expired", "restoring")),
        "{seen:?}"
    );
    let line = text.next().expect("a text line");
    assert!(
        line.contains("w: running -> snapshotting (suspend_requested)"),
        "{line}"
    );

    // Another task's transitions are not shown.
    ok(&h.home.run(&["run", "-t", "other", "--", "true"]));
    ok(&h.home.run(&["suspend", "w"]));
    let seen = json.until("expired");
    assert!(seen.iter().all(|v| v["task"] == "w"), "{seen:?}");

    // The server stopping ends the watch.
    let mut json = json;
    ok(&h.home.run(&["serve", "--stop"]));
    let ended = crate::support::wait_for(Duration::from_secs(20), || {
        json.child.try_wait().ok().flatten()
    });
    assert_eq!(
        ended.map(|s| s.success()),
        Some(true),
        "the watch did not end"
    );
}

#[test]
fn watch_refuses_an_unknown_task_and_the_never_mode() {
    let h = ServerHome::new();
    let o = h.home.run(&["watch", "nope"]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no task named `nope`"),
        "{}",
        stderr(&o)
    );
    let o = h
        .home
        .cmd()
        .args(["watch", "nope"])
        .env("TASKBOX_SERVER", "never")
        .output()
        .expect("taskbox");
    assert_eq!(o.status.code(), Some(125));
    assert!(
        stderr(&o).contains("terminal.server is `never`") && stderr(&o).contains("taskbox serve"),
        "{}",
        stderr(&o)
    );
}
