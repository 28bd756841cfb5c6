//! `taskbox --server URL` (issue 32 item 19): the CLI of one machine drives the tasks of a
//! server on another — here a real server on `--listen 127.0.0.1:0`, and a CLI with a home of
//! its own (no data dir, no server of its own). Live output, stdin and Ctrl-C work as on the
//! Unix socket; a wrong token and a dead URL are clear errors (exit 125) that never show a token.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::ServerHome;
use crate::support::{ok, process_running, stderr, stdout, wait_for, Home};
use crate::vercel_engine::{spawn_fake, FakeProcess};

const TOKEN: &str = "remote-tok-5e2b7c1d9a0f4e6b";

/// A server listening on TCP with [`TOKEN`], and a client home that has none of its own.
struct Remote {
    server: ServerHome,
    _serve: KillOnDrop,
    url: String,
    client: Home,
}

impl Remote {
    fn start() -> Remote {
        Remote::serve(ServerHome::new())
    }

    /// `server` serving TCP with [`TOKEN`] (its config and environment as the caller set them).
    fn serve(server: ServerHome) -> Remote {
        let (serve, addr) = server.serve_tcp(TOKEN, &[]);
        Remote {
            server,
            _serve: KillOnDrop(serve),
            url: format!("http://{addr}"),
            client: Home::new(),
        }
    }

    /// `taskbox --server URL ARGS` from the client home, with the token in TASKBOX_TOKEN.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = self.client.cmd();
        c.env("TASKBOX_TOKEN", TOKEN)
            .args(["--server", &self.url])
            .args(args);
        c
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        self.cmd(args).output().expect("taskbox")
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `cmd` with piped stdin and stdout; a thread passes on each stdout line.
fn spawn_lines(mut cmd: Command) -> (Child, mpsc::Receiver<String>) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn taskbox");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Waits (bounded) for a process to exit; its output.
fn wait_bounded(mut child: Child, limit: Duration) -> std::process::Output {
    let end = Instant::now() + limit;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            panic!("taskbox did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// The command's first line reaches the CLI while the command still runs (it waits on its
/// stdin, which the test writes only once it has read that line), and the stdin the CLI reads
/// reaches the command; every task command goes to the remote server.
#[test]
fn a_remote_server_runs_commands_with_live_output_and_stdin() {
    let r = Remote::start();
    let (mut child, lines) = spawn_lines(r.cmd(&[
        "run",
        "-t",
        "far",
        "--",
        "echo first; read -r line; echo \"got $line\"",
    ]));
    let first = lines.recv_timeout(Duration::from_secs(60));
    assert_eq!(first.as_deref(), Ok("first"), "the first line arrived live");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"hello\n").expect("write stdin");
    drop(stdin);
    let got = lines.recv_timeout(Duration::from_secs(60));
    assert_eq!(got.as_deref(), Ok("got hello"));
    let o = wait_bounded(child, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // The task is the server's: its data dir has it, the client's home has nothing.
    assert!(ok(&r.server.home.run(&["tasks"])).contains("far"));
    assert!(
        !r.client.path().join("data").exists(),
        "the client made a data dir"
    );
    let tasks = ok(&r.run(&["tasks", "--json"]));
    assert!(tasks.contains(r#""far""#), "{tasks}");
    assert!(ok(&r.run(&["tasks"])).contains("far"));
    let show = ok(&r.run(&["show", "far"]));
    assert!(show.contains("task:        far"), "{show}");
    let show = ok(&r.run(&["show", "far", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&show).expect("JSON");
    assert_eq!(v["task"]["id"], "far", "{show}");
    let status = ok(&r.run(&["status"]));
    assert!(status.contains(&format!("server:   {}", r.url)), "{status}");

    // The other task commands, through the same server; the token from a file this time.
    let token_file = r.client.path().join("tok");
    std::fs::write(&token_file, TOKEN).expect("token");
    let with_file = |args: &[&str]| {
        let mut c = r.client.cmd();
        c.args(["--server", &r.url, "--token-file"])
            .arg(&token_file)
            .args(args);
        c.output().expect("taskbox")
    };
    ok(&with_file(&["run", "-t", "far", "--", "echo kept > f.txt"]));
    ok(&with_file(&["suspend", "far"]));
    ok(&with_file(&["resume", "far"]));
    ok(&with_file(&["fork", "far", "far-copy"]));
    assert_eq!(
        ok(&with_file(&["run", "-t", "far-copy", "--", "cat f.txt"])),
        "kept\n"
    );
    ok(&with_file(&["rm", "far-copy"]));
    ok(&with_file(&["gc", "--dry-run"]));

    // TASKBOX_SERVER_URL alone sends a plain `taskbox run` there too (past the fast path).
    let o = r
        .client
        .cmd()
        .env("TASKBOX_SERVER_URL", &r.url)
        .env("TASKBOX_TOKEN", TOKEN)
        .args(["run", "-t", "far", "--", "cat f.txt"])
        .output()
        .expect("taskbox");
    assert_eq!(ok(&o), "kept\n");
    assert!(
        !r.client.path().join("data").exists(),
        "the client made a data dir"
    );
}

/// SIGINT to the CLI cancels the command on the remote server (exit 130, as a shell), and the
/// task is free at once for the next command.
#[test]
fn ctrl_c_cancels_the_remote_command() {
    let r = Remote::start();
    let marker = format!("7{}.5", std::process::id());
    let (child, lines) = spawn_lines(r.cmd(&[
        "run",
        "-t",
        "cut",
        "--",
        &format!("echo started; sleep {marker}; echo never"),
    ]));
    assert_eq!(
        lines.recv_timeout(Duration::from_secs(60)).as_deref(),
        Ok("started")
    );
    assert!(process_running(&marker), "the command runs");
    // SAFETY: signalling the child this test spawned (not yet reaped).
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = wait_bounded(child, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    assert!(!stdout(&o).contains("never"));
    assert!(
        wait_for(Duration::from_secs(30), || (!process_running(&marker))
            .then_some(()))
        .is_some(),
        "the cancelled command still runs"
    );
    assert_eq!(
        ok(&r.run(&["run", "-t", "cut", "--", "echo next"])),
        "next\n"
    );
}

/// A wrong token and a dead URL are clear errors, exit 125, and no token shows anywhere.
#[test]
fn a_wrong_token_or_a_dead_server_is_a_clear_error() {
    let r = Remote::start();
    let wrong = "wrong-tok-1c9d8e7f6a5b4c3d";
    for json in [false, true] {
        let mut c = r.client.cmd();
        c.env("TASKBOX_TOKEN", wrong)
            .args(["--server", &r.url, "run", "-t", "w"]);
        if json {
            c.arg("--json");
        }
        let o = c.args(["--", "true"]).output().expect("taskbox");
        let all = format!("{}{}", stdout(&o), stderr(&o));
        assert_eq!(o.status.code(), Some(125), "{all}");
        assert!(all.contains("bearer token"), "{all}");
        assert!(
            !all.contains(wrong) && !all.contains(TOKEN),
            "a token leaked: {all}"
        );
        if json {
            let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
            assert_eq!(v["code"], "unauthorized", "{all}");
        }
    }
    // Nothing was done.
    let o = r.server.home.run(&["show", "w"]);
    assert_eq!(o.status.code(), Some(125), "{}", stdout(&o));

    // Nobody listens there: a port that was just free.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_url = format!("http://{}", dead.local_addr().expect("addr"));
    drop(dead);
    let mut c = r.client.cmd();
    let o = c
        .env("TASKBOX_TOKEN", TOKEN)
        .args(["--server", &dead_url, "run", "-t", "w", "--", "true"])
        .output()
        .expect("taskbox");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(
        err.contains(&format!("no taskbox server answers at {dead_url}")),
        "{err}"
    );
    assert!(!err.contains(TOKEN), "{err}");

    // No token, a bad URL, --server on a command that is not the server's: refused with the fix.
    for (env_token, args, says) in [
        (
            None,
            vec!["--server", r.url.as_str(), "tasks"],
            "TASKBOX_TOKEN",
        ),
        (
            Some(TOKEN),
            vec!["--server", "https://h:1", "tasks"],
            "plain HTTP",
        ),
        (
            Some(TOKEN),
            vec!["--server", r.url.as_str(), "config", "path"],
            "this machine's files",
        ),
        (
            Some(TOKEN),
            vec!["--token-file", "/nonexistent", "tasks"],
            "no server URL",
        ),
    ] {
        let mut c = r.client.cmd();
        if let Some(t) = env_token {
            c.env("TASKBOX_TOKEN", t);
        }
        let o = c.args(&args).output().expect("taskbox");
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(125), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains(TOKEN), "{err}");
    }
}

/// One server of a fleet on the shared PostgreSQL store and fake Vercel, listening on TCP.
fn fleet_server(url: &str, fake: &FakeProcess) -> Remote {
    let mut h = ServerHome::new();
    h.home.set_env("TASKBOX_SERVER", "always");
    h.home.set_env("TASKBOX_STORE", url);
    h.home.set_env("VERCEL_TOKEN", "tok");
    h.home.set_env("VERCEL_TEAM_ID", "team_t");
    h.home.set_env("VERCEL_PROJECT_ID", "prj_t");
    for (k, v) in [
        ("terminal.backend", "vercel_sandbox"),
        ("terminal.container_memory", "2048"),
        ("terminal.vercel_api_url", fake.url.as_str()),
    ] {
        ok(&h.home.run(&["config", "set", k, v]));
    }
    Remote::serve(h)
}

/// A fleet's server that does not drive the task answers `task_elsewhere` naming the owner's
/// address; `taskbox --server` sends the request there once, says so, and gets the answer.
#[test]
fn a_task_elsewhere_answer_is_followed_to_the_owner() {
    let Some(db) = crate::pg::database() else {
        return;
    };
    let fake_home = Home::new();
    let fake = spawn_fake(&fake_home);
    let a = fleet_server(&db.url, &fake);
    let b = fleet_server(&db.url, &fake);
    assert_eq!(
        ok(&a.run(&["run", "-t", "moving", "--", "echo hello > f; cat f"])),
        "hello\n"
    );
    // B is asked; A drives the task (its lease is fresh): the CLI follows B's answer to A.
    let o = b.run(&["run", "-t", "moving", "--", "cat f"]);
    assert_eq!(ok(&o), "hello\n", "{}", stderr(&o));
    let note = format!("note: the server at {} drives this task", a.url);
    assert!(stderr(&o).contains(&note), "{}", stderr(&o));
    // Reads need no lease: any server of the fleet shows the task from the shared store.
    assert!(ok(&b.run(&["show", "moving", "--json"])).contains(r#""moving""#));
}

/// `taskbox --server URL cost` (issue 32 item 19): the remote server's `GET /v1/cost` is the
/// report `cost` prints on the server's machine — the same tasks and figures in `--json`, the
/// same text without — and its refusals (an unknown task, a bad `--since`) are clear errors.
#[test]
fn cost_over_the_server_is_the_servers_report() {
    let r = Remote::start();
    ok(&r.run(&["run", "-t", "priced", "--", "echo kept > f.txt"]));
    ok(&r.run(&["run", "-t", "other", "--", "true"]));
    ok(&r.run(&["suspend", "priced"]));
    ok(&r.run(&["suspend", "other"]));

    // Both suspended: nothing runs, so the figures hold still between the two reads — but
    // storage, which grows with the time snapshots are kept.
    let report = |o: std::process::Output| {
        let mut v: serde_json::Value = serde_json::from_str(&ok(&o)).expect("JSON");
        for t in v["tasks"].as_array_mut().expect("tasks") {
            t["snapshot_gb_months"].take();
        }
        for (_, t) in v["totals"].as_object_mut().expect("totals").iter_mut() {
            t["snapshot_gb_months"].take();
        }
        v
    };
    let local = report(r.server.home.run(&["cost", "--json"]));
    let remote = report(r.run(&["cost", "--json"]));
    assert_eq!(remote["tasks"], local["tasks"], "{remote}\n{local}");
    assert_eq!(remote["totals"], local["totals"], "{remote}\n{local}");
    let names: Vec<&str> = remote["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter_map(|t| t["task"].as_str())
        .collect();
    assert_eq!(names, ["other", "priced"], "{remote}");
    assert_eq!(remote["tasks"][1]["creations"], 1, "{remote}");
    assert!(
        remote["tasks"][1]["snapshot_bytes_kept"].as_u64() > Some(0),
        "{remote}"
    );

    // The text is the server machine's, and one task alone has no totals.
    let text = ok(&r.run(&["cost", "priced", "--since", "1h"]));
    assert_eq!(
        text,
        ok(&r.server.home.run(&["cost", "priced", "--since", "1h"])),
        "{text}"
    );
    assert!(text.starts_with("priced (local), the last 1h:"), "{text}");
    let one: serde_json::Value =
        serde_json::from_str(&ok(&r.run(&["cost", "priced", "--json"]))).expect("JSON");
    assert!(one.get("totals").is_none(), "{one}");

    // TASKBOX_SERVER_URL alone sends it there too; the client has no data dir.
    let o = r
        .client
        .cmd()
        .env("TASKBOX_SERVER_URL", &r.url)
        .env("TASKBOX_TOKEN", TOKEN)
        .args(["cost", "--json"])
        .output()
        .expect("taskbox");
    assert!(ok(&o).contains(r#""priced""#));
    assert!(!r.client.path().join("data").exists());

    let o = r.run(&["cost", "nope"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no task named `nope`"),
        "{}",
        stderr(&o)
    );
    let o = r.run(&["cost", "--since", "7x"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("invalid --since `7x`"),
        "{}",
        stderr(&o)
    );
    // The server answers a bad `since` itself too (a client that skips the CLI's check).
    let o = r
        .client
        .cmd()
        .env("TASKBOX_TOKEN", TOKEN)
        .args(["--server", &r.url, "cost", "--json", "--since", "0d"])
        .output()
        .expect("taskbox");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("it is zero"), "{}", stderr(&o));
}
