//! `taskbox serve --store postgres://…`: the server keeps its tasks in PostgreSQL rather than
//! the data dir's SQLite file, the password never shows, and what it committed is read back by
//! the next server and by `taskbox replay`.

use std::process::Child;
use std::time::Duration;

use serde_json::Value;

use super::ServerHome;
use crate::support::{ok, stderr, stdout, wait_for, Home};
use crate::vercel_engine::{spawn_fake, FakeProcess};

#[test]
fn a_server_on_a_postgres_store_keeps_its_tasks_there() {
    let Some(db) = crate::pg::database() else {
        return;
    };
    // Trust authentication ignores the password; it is here to prove it is never shown.
    let url = db.url.replacen("taskbox@", "taskbox:s3cret-pw@", 1);
    let mut h = ServerHome::new();
    h.home.set_env("TASKBOX_SERVER", "always");
    let mut server = h.spawn_serve(&["--store", &url]);
    h.wait_for_server();
    assert_eq!(
        ok(&h
            .home
            .run(&["run", "-t", "pg1", "--", "echo kept > f; cat f"])),
        "kept\n"
    );
    ok(&h.home.run(&["serve", "--stop"]));
    let _ = server.wait();
    let log = h.serve_stderr();
    assert!(log.contains("taskbox:[redacted]@"), "{log}");
    assert!(!log.contains("s3cret-pw"), "{log}");
    assert!(
        !h.data().join("taskbox.db").exists(),
        "nothing went to the SQLite file"
    );

    // The store holds the task's journal.
    let store = taskbox::store::Store::connect(&url).expect("connect");
    let journal = store.journal("pg1").expect("journal");
    assert!(journal.len() >= 3, "{journal:?}");

    // A server started from TASKBOX_STORE (no flag) finds the task and its files.
    h.home.set_env("TASKBOX_STORE", &url);
    let mut again = h.spawn_serve(&[]);
    h.wait_for_server();
    assert_eq!(
        ok(&h.home.run(&["run", "-t", "pg1", "--", "cat f"])),
        "kept\n"
    );
    ok(&h.home.run(&["serve", "--stop"]));
    let _ = again.wait();
    let replay = h.home.run(&["replay", "--all"]);
    assert!(replay.status.success(), "{}", stderr(&replay));
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&replay.stdout),
        stderr(&replay)
    );
    assert!(!shown.contains("s3cret-pw"), "{shown}");

    // A bad store URL is refused naming the flag, without the password.
    let o = h
        .home
        .run(&["serve", "--store", "mysql://root:s3cret-pw@db/x"]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    assert!(stderr(&o).contains("--store"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("s3cret-pw"), "{}", stderr(&o));
}

/// One server of a fleet: its own home (data dir, socket) on the shared PostgreSQL store and
/// the shared fake Vercel, leases of `lease_seconds`, its `serve` process started.
fn fleet_server(url: &str, fake: &FakeProcess, lease_seconds: u64) -> (ServerHome, Child) {
    let mut h = ServerHome::new();
    h.home.set_env("TASKBOX_SERVER", "always");
    h.home.set_env("TASKBOX_STORE", url);
    h.home.set_env("VERCEL_TOKEN", "tok");
    h.home.set_env("VERCEL_TEAM_ID", "team_t");
    h.home.set_env("VERCEL_PROJECT_ID", "prj_t");
    let lease = lease_seconds.to_string();
    for (k, v) in [
        ("terminal.backend", "vercel_sandbox"),
        ("terminal.container_memory", "2048"),
        ("terminal.vercel_api_url", fake.url.as_str()),
        ("terminal.lease_seconds", lease.as_str()),
    ] {
        ok(&h.home.run(&["config", "set", k, v]));
    }
    let server = h.spawn_serve(&[]);
    h.wait_for_server();
    (h, server)
}

/// `taskbox run --json -t TASK -- CMD` through `h`'s server: its stdout on success, else the
/// error object's code and message.
fn run_json(h: &ServerHome, task: &str, cmd: &str) -> Result<String, (String, String)> {
    let o = h.home.run(&["run", "--json", "-t", task, "--", cmd]);
    let out: Value = serde_json::from_str(&stdout(&o)).unwrap_or(Value::Null);
    if o.status.success() {
        return Ok(out["stdout"].as_str().unwrap_or_default().to_string());
    }
    Err((
        out["code"].as_str().unwrap_or("").to_string(),
        format!("{out} {}", stderr(&o)),
    ))
}

/// Two servers on one PostgreSQL and one (fake) Vercel: a task started through A is answered
/// by B with where it lives while A's lease is fresh; once A is SIGKILLed and its lease expired,
/// B takes the task over, recovers it (probing the sandbox A left) and the file is there.
#[test]
fn a_task_started_through_one_server_continues_through_another_after_a_sigkill() {
    let Some(db) = crate::pg::database() else {
        return;
    };
    let fake_home = Home::new();
    let fake = spawn_fake(&fake_home);
    let (a, mut a_serve) = fleet_server(&db.url, &fake, 3);
    let (b, mut b_serve) = fleet_server(&db.url, &fake, 3);
    assert_eq!(
        run_json(&a, "moving", "echo hello > f; cat f"),
        Ok("hello\n".to_string())
    );
    // A drives it: B says where it lives (a retryable answer, A's name in it).
    let (code, message) = run_json(&b, "moving", "cat f").expect_err("A holds the lease");
    assert_eq!(code, "task_elsewhere", "{message}");
    assert!(
        message.contains(&format!("pid {}", a_serve.id())),
        "{message}"
    );

    // A dies. Once its lease expires, B takes the task over and finds the file.
    a_serve.kill().expect("SIGKILL A");
    let _ = a_serve.wait();
    // Ten times the 3 s lease: on two busy cores the takeover may be slow, never stuck.
    let out = wait_for(Duration::from_secs(30), || {
        match run_json(&b, "moving", "cat f") {
            Ok(out) => Some(out),
            Err((code, message)) => {
                assert_eq!(code, "task_elsewhere", "{message}");
                std::thread::sleep(Duration::from_millis(200));
                None
            }
        }
    })
    .expect("B takes the task over once A's lease expired");
    assert_eq!(out, "hello\n");
    // B drives it from now on, in the same journal.
    assert_eq!(run_json(&b, "moving", "cat f"), Ok("hello\n".to_string()));
    ok(&b.home.run(&["serve", "--stop"]));
    let _ = b_serve.wait();
    let replay = b.home.run(&["replay", "--all"]);
    assert!(replay.status.success(), "{}", stderr(&replay));
    drop(a);
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: signalling a server process this test started.
    let rc = unsafe { libc::kill(pid as i32, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

/// A server paused (SIGSTOP) past its lease while a command of a task runs: another server
/// takes the task over, and once resumed the paused one cannot commit (fencing) — its waiting
/// caller gets the retryable "moved to another server" error, a later request to it is told
/// where the task lives, and the journal replays clean.
#[test]
fn a_server_paused_past_its_lease_cannot_commit_and_answers_task_moved() {
    let Some(db) = crate::pg::database() else {
        return;
    };
    let fake_home = Home::new();
    let fake = spawn_fake(&fake_home);
    let (a, a_serve) = fleet_server(&db.url, &fake, 2);
    let (b, mut b_serve) = fleet_server(&db.url, &fake, 2);
    assert_eq!(
        run_json(&a, "paused", "echo one > f; cat f"),
        Ok("one\n".to_string())
    );
    // A caller waits on A for a command that outlasts A's pause; the command is seen running
    // in the host's process list (the fake platform contains it in a sandbox of this machine,
    // where no host path is in sight), by a `sleep` argument only the shell's expansion makes,
    // so that the command lines of `taskbox run` and of the shell do not match.
    let (stem, tail) = ("3.0", std::process::id().to_string());
    let marker = format!("sleep\0{stem}{tail}");
    let command = format!("m={tail}; sleep {stem}${{m}}; echo late > g");
    let waiting = a
        .home
        .cmd()
        .args(["run", "--json", "-t", "paused", "--", &command])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the waiting run");
    wait_for(Duration::from_secs(30), || {
        crate::support::process_running(&marker).then_some(())
    })
    .expect("A's command started");
    signal(a_serve.id(), libc::SIGSTOP);
    // Once A's lease (2 s) is past, B takes the task over at a request.
    let out = wait_for(Duration::from_secs(30), || {
        match run_json(&b, "paused", "cat f") {
            Ok(out) => Some(out),
            Err((code, message)) => {
                assert_eq!(code, "task_elsewhere", "{message}");
                std::thread::sleep(Duration::from_millis(200));
                None
            }
        }
    });
    signal(a_serve.id(), libc::SIGCONT);
    assert_eq!(out.as_deref(), Some("one\n"), "B took the task over");

    // A's caller: the retryable "moved" error, not a result A could not commit.
    let o = waiting.wait_with_output().expect("the waiting run ends");
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let err: Value = serde_json::from_str(&stdout(&o)).unwrap_or(Value::Null);
    assert_eq!(err["code"], "task_moved", "{err} {}", stderr(&o));
    assert!(
        err["message"]
            .as_str()
            .is_some_and(|m| m.contains("moved to another server")),
        "{err}"
    );
    // A no longer drives it: a request there is told where it lives.
    let (code, message) = run_json(&a, "paused", "cat f").expect_err("B holds it");
    assert_eq!(code, "task_elsewhere", "{message}");
    assert!(
        message.contains(&format!("pid {}", b_serve.id())),
        "{message}"
    );
    // B still drives it; nothing diverged.
    assert_eq!(run_json(&b, "paused", "cat f"), Ok("one\n".to_string()));
    ok(&b.home.run(&["serve", "--stop"]));
    let _ = b_serve.wait();
    let replay = b.home.run(&["replay", "--all"]);
    assert!(replay.status.success(), "{}", stderr(&replay));
    // Every journal entry A wrote came before B's takeover: one writer per fencing token.
    drop(a);
}

/// gc runs on one server of a fleet at a time: while another holds the installation's gc
/// lock (here: a store of the test's own), a server's gc does nothing and says so; once it is
/// released, the server's gc runs.
#[test]
fn gc_runs_on_one_server_of_a_fleet_at_a_time() {
    let Some(db) = crate::pg::database() else {
        return;
    };
    let fake_home = Home::new();
    let fake = spawn_fake(&fake_home);
    let (a, _a_serve) = fleet_server(&db.url, &fake, 5);
    let taskbox::store::Store::Postgres(other) =
        taskbox::store::Store::connect(&db.url).expect("connect")
    else {
        panic!("a PostgreSQL store");
    };
    // The server's own gc at start may hold the lock for a moment.
    let held = wait_for(Duration::from_secs(20), || {
        other.try_job("gc").expect("try_job").then_some(())
    });
    assert!(held.is_some(), "the gc lock is taken");
    let gc = |h: &ServerHome| -> Value {
        let o = h.home.run(&["gc", "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str(&stdout(&o)).expect("gc --json")
    };
    assert_eq!(gc(&a)["held_elsewhere"], true);
    let o = a.home.run(&["gc"]);
    assert!(stdout(&o).contains("another server"), "{}", stdout(&o));
    other.release_job("gc").expect("release");
    let report = gc(&a);
    assert!(report.get("held_elsewhere").is_none(), "{report}");
    assert_eq!(report["dry_run"], false, "{report}");
}

/// PostgreSQL restarted under load: three callers keep running commands through a server
/// while the cluster stops and starts again. The server reconnects by itself; a caller sees a
/// retryable error at worst (and sees one while the database is down); every line a command
/// appended and answered for is still in its task's file afterwards (nothing committed is
/// lost); the journal replays clean.
#[test]
fn a_postgres_restarted_under_load_loses_nothing_and_callers_see_retryable_errors() {
    let Some(server) = crate::pg::private_server() else {
        return;
    };
    let cluster = server.cluster().expect("a cluster of this test's own");
    let db = server.database();
    let fake_home = Home::new();
    let fake = spawn_fake(&fake_home);
    let (a, mut a_serve) = fleet_server(&db.url, &fake, 10);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let tasks = ["load0", "load1", "load2"];
    // Per task: the lines answered as appended, and the error codes seen.
    let outcomes: Vec<(Vec<String>, Vec<String>)> = std::thread::scope(|s| {
        let callers: Vec<_> = tasks
            .iter()
            .map(|task| {
                let (a, stop) = (&a, &stop);
                s.spawn(move || {
                    let mut appended = Vec::new();
                    let mut errors = Vec::new();
                    let mut k = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        k += 1;
                        let line = format!("{task}-{k}");
                        let o = a.home.run(&[
                            "run",
                            "--json",
                            "-t",
                            task,
                            "--",
                            &format!("echo {line} >> f; tail -n 1 f"),
                        ]);
                        let out: Value = serde_json::from_str(&stdout(&o)).unwrap_or(Value::Null);
                        if o.status.success() {
                            assert_eq!(out["stdout"], format!("{line}\n"), "{out}");
                            appended.push(line);
                        } else {
                            assert_eq!(out["retryable"], true, "{out} {}", stderr(&o));
                            errors.push(out["code"].as_str().unwrap_or("").to_string());
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                    (appended, errors)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(2_500));
        cluster.stop();
        std::thread::sleep(Duration::from_millis(2_000));
        cluster.start();
        std::thread::sleep(Duration::from_millis(4_000));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        callers
            .into_iter()
            .map(|c| c.join().expect("caller"))
            .collect()
    });
    let errors: Vec<&String> = outcomes.iter().flat_map(|(_, e)| e).collect();
    assert!(
        !errors.is_empty(),
        "the callers ran through the outage without an error"
    );
    for (task, (appended, _)) in tasks.iter().zip(&outcomes) {
        assert!(appended.len() >= 2, "{task}: {appended:?}");
        // After the restart the server answers again, and every answered line is there.
        let file = wait_for(Duration::from_secs(30), || {
            run_json(&a, task, "cat f").ok().or_else(|| {
                std::thread::sleep(Duration::from_millis(200));
                None
            })
        })
        .expect("the server answers after PostgreSQL is back");
        let lines: Vec<&str> = file.lines().collect();
        for line in appended {
            assert!(
                lines.contains(&line.as_str()),
                "{task}: {line} lost: {file}"
            );
        }
    }
    ok(&a.home.run(&["serve", "--stop"]));
    let _ = a_serve.wait();
    let replay = a.home.run(&["replay", "--all"]);
    assert!(replay.status.success(), "{}", stderr(&replay));
    eprintln!("errors seen during the restart: {errors:?}");
}
