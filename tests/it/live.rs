//! `taskbox run`'s live side end to end, with the built binary, real processes and (through the
//! auto-started server) a real socket: output arrives as it is produced and byte for byte,
//! stdin reaches the command, and SIGINT/SIGTERM/SIGHUP cancel the command — not its sandbox —
//! with a shell's exit codes. Each on the local backend both in-process and through the server,
//! and on the fake Vercel through the server.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;

use crate::server::ServerHome;
use crate::support::{ok, process_running, stderr, stdout, wait_for, Home};
use crate::vercel_engine::{spawn_fake, FakeProcess};

/// A home driving tasks one way: in-process, through the auto-started server, or through the
/// server on the fake Vercel.
struct Setup {
    server: ServerHome,
    _fake: Option<FakeProcess>,
}

impl Setup {
    fn in_process() -> Setup {
        let mut server = ServerHome::new();
        server.home.set_env("TASKBOX_SERVER", "never");
        Setup {
            server,
            _fake: None,
        }
    }

    fn through_server() -> Setup {
        Setup {
            server: ServerHome::new(),
            _fake: None,
        }
    }

    fn vercel_through_server() -> Setup {
        let mut server = ServerHome::new();
        for (k, v) in [
            ("VERCEL_TOKEN", "tok"),
            ("VERCEL_TEAM_ID", "team_t"),
            ("VERCEL_PROJECT_ID", "prj_t"),
        ] {
            server.home.set_env(k, v);
        }
        let fake = spawn_fake(&server.home);
        let home = &server.home;
        ok(&home.run(&["config", "set", "terminal.backend", "vercel_sandbox"]));
        ok(&home.run(&["config", "set", "terminal.container_memory", "2048"]));
        ok(&home.run(&["config", "set", "terminal.vercel_api_url", &fake.url]));
        Setup {
            server,
            _fake: Some(fake),
        }
    }

    fn home(&self) -> &Home {
        &self.server.home
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        self.home().run(args)
    }

    fn cmd(&self) -> Command {
        self.home().cmd()
    }
}

/// Spawns `taskbox ARGS` with piped stdout, and a thread that reports every chunk it prints
/// with the time it arrived.
fn spawn_reading(mut cmd: Command) -> (Child, mpsc::Receiver<(Instant, Vec<u8>)>) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn taskbox");
    let mut out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 || tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Collects chunks until `want` has been printed (or `limit` passes); when each byte arrived.
fn read_until(
    rx: &mpsc::Receiver<(Instant, Vec<u8>)>,
    seen: &mut Vec<(Instant, u8)>,
    want: &[u8],
    limit: Duration,
) -> bool {
    let end = Instant::now() + limit;
    loop {
        let bytes: Vec<u8> = seen.iter().map(|(_, b)| *b).collect();
        if bytes.windows(want.len()).any(|w| w == want) {
            return true;
        }
        let Some(left) = end.checked_duration_since(Instant::now()) else {
            return false;
        };
        match rx.recv_timeout(left) {
            Ok((at, chunk)) => seen.extend(chunk.into_iter().map(|b| (at, b))),
            Err(_) => return false,
        }
    }
}

/// `echo a`, then wait for the test's go, then `echo b`: `a` reaches the caller while the
/// command still runs — the test gives the go only once it has read `a`, so output printed
/// only at the end would never arrive (no timing involved).
fn output_arrives_as_it_is_produced(s: &Setup) {
    ok(&s.run(&["run", "-t", "live", "--", "true"]));
    // The command runs in a sandbox of this machine (the local one's or the fake platform's),
    // whose workspace is the one directory it shares with the host: the go is a file `go` put
    // into every workspace under the test's home.
    let mut cmd = s.cmd();
    let script = "echo a; for i in $(seq 600); do [ -e go ] && break; sleep 0.05; done; echo b";
    cmd.args(["run", "-t", "live", "--", script]);
    let (mut child, rx) = spawn_reading(cmd);
    let mut seen = Vec::new();
    assert!(
        read_until(&rx, &mut seen, b"a\n", Duration::from_secs(30)),
        "`a` was not passed on while the command ran"
    );
    assert!(!seen.iter().any(|(_, b)| *b == b'b'), "`b` before the go");
    let given = give_go(s.home().path(), 8);
    assert!(
        given > 0,
        "no workspace under {}",
        s.home().path().display()
    );
    assert!(
        read_until(&rx, &mut seen, b"b\n", Duration::from_secs(60)),
        "`b` was never printed"
    );
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    let bytes: Vec<u8> = seen.iter().map(|(_, b)| *b).collect();
    assert_eq!(bytes, b"a\nb\n", "exactly the command's output, in order");
}

/// Writes an empty `go` into every directory named `workspace` under `dir` (at most `depth`
/// levels down); how many.
fn give_go(dir: &std::path::Path, depth: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut given = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if entry.file_name() == "workspace" {
            given += usize::from(std::fs::write(path.join("go"), "").is_ok());
        } else if depth > 0 {
            given += give_go(&path, depth - 1);
        }
    }
    given
}

/// Every byte value, through stdout unchanged; `--json` carries it as base64 and says so.
fn bytes_pass_through_unchanged(s: &Setup, exact: bool) {
    let script =
        "for i in $(seq 0 255); do printf \"\\\\$(printf %03o $i)\"; done; printf 'é\\n' >&2";
    let o = s.run(&["run", "-t", "bytes", "--", script]);
    assert!(o.status.success(), "{}", stderr(&o));
    let all: Vec<u8> = (0..=255u8).collect();
    if exact {
        assert_eq!(o.stdout, all, "stdout is the command's bytes, unchanged");
    } else {
        // The platform's log stream carries text: bytes that are not UTF-8 arrive replaced.
        assert_eq!(
            o.stdout,
            String::from_utf8_lossy(&all).as_bytes(),
            "stdout is the platform's text, unchanged"
        );
    }
    assert!(stderr(&o).contains("é\n"), "{}", stderr(&o));

    let o = s.run(&["run", "-t", "bytes", "--json", "--", script]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("--json is JSON");
    assert_eq!(v["stdout_truncated"], false);
    assert_eq!(v["stderr"], "é\n");
    assert!(v.get("stderr_encoding").is_none(), "{v}");
    if exact {
        assert_eq!(v["stdout_encoding"], "base64", "{v}");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(v["stdout"].as_str().expect("a string"))
            .expect("base64");
        assert_eq!(decoded, all);
    }

    // More than the capture keeps: the live output has every byte, `--json` says it was cut.
    let o = s.run(&["run", "-t", "bytes", "--", "head -c 300000 /dev/zero"]);
    assert_eq!(o.stdout.len(), 300_000, "{}", stderr(&o));
    let o = s.run(&[
        "run",
        "-t",
        "bytes",
        "--json",
        "--",
        "head -c 300000 /dev/zero | tr '\\0' x",
    ]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("--json is JSON");
    assert_eq!(v["stdout_truncated"], true, "{}", stderr(&o));
}

/// `echo hi | taskbox run -- cat` prints `hi`; with stdin on /dev/null, `cat` ends at once.
fn stdin_is_forwarded(s: &Setup) {
    let mut child = s
        .cmd()
        .args(["run", "-t", "stdin", "--", "cat; echo done"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(b"hi\n").expect("write stdin");
    drop(input);
    let o = child.wait_with_output().expect("wait");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "hi\ndone\n");

    // A lot of it, more than any buffer on the way.
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    let mut child = s
        .cmd()
        .args(["run", "-t", "stdin", "--", "cksum"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut input = child.stdin.take().expect("stdin");
    let feeder = {
        let data = data.clone();
        std::thread::spawn(move || {
            let _ = input.write_all(&data);
        })
    };
    let o = child.wait_with_output().expect("wait");
    feeder.join().expect("feeder");
    let mut cksum = Command::new("cksum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("cksum");
    cksum
        .stdin
        .take()
        .expect("stdin")
        .write_all(&data)
        .expect("write");
    let want = cksum.wait_with_output().expect("cksum");
    assert_eq!(stdout(&o), String::from_utf8_lossy(&want.stdout));

    // No stdin: nothing waits for one.
    let started = Instant::now();
    let o = s.run(&["run", "-t", "stdin", "--", "cat; echo done"]);
    assert_eq!(ok(&o), "done\n");
    // Loose (ten times what it takes on a busy machine): a `cat` waiting for input would
    // hang until the command's timeout.
    assert!(started.elapsed() < Duration::from_secs(50));
}

fn sandbox_of(s: &Setup, task: &str) -> Value {
    let v: Value = serde_json::from_str(&ok(&s.run(&["show", task, "--json"]))).expect("JSON");
    v["task"]["sandbox"]["id"].clone()
}

/// A signal on `taskbox run` cancels the command (its processes are gone), exits like a shell,
/// and leaves the sandbox and its files as they were.
fn a_signal_cancels_the_command_not_the_sandbox(s: &Setup, signal: i32, code: i32) {
    let task = format!("sig{signal}");
    // Unique per call and per test process, so neither parallel tests (the in-process, server
    // and fake Vercel ones run in the same process, with the same signal) nor a leftover of an
    // earlier run can be mistaken for this one.
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let marker = format!("6{signal}.4{}{call}{signal}7", std::process::id());
    ok(&s.run(&["run", "-t", &task, "--", "echo before > kept.txt"]));
    let sandbox = sandbox_of(s, &task);
    let mut cmd = s.cmd();
    cmd.args([
        "run",
        "-t",
        &task,
        "--",
        &format!("echo during >> kept.txt; echo started; sleep {marker}; echo never"),
    ]);
    let (child, rx) = spawn_reading(cmd);
    let mut seen = Vec::new();
    assert!(
        read_until(&rx, &mut seen, b"started\n", Duration::from_secs(30)),
        "the command never started"
    );
    assert!(process_running(&marker), "the command runs");
    // SAFETY: signalling the child this test spawned (not yet reaped).
    unsafe { libc::kill(child.id() as i32, signal) };
    let o = child.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(code), "{}", stderr(&o));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("never"));
    assert!(
        wait_for(Duration::from_secs(15), || (!process_running(&marker))
            .then_some(()))
        .is_some(),
        "the cancelled command still runs"
    );
    // The sandbox lives on, with its files.
    assert_eq!(sandbox_of(s, &task), sandbox, "the sandbox is the same one");
    assert_eq!(
        ok(&s.run(&["run", "-t", &task, "--", "cat kept.txt"])),
        "before\nduring\n"
    );
    assert_eq!(sandbox_of(s, &task), sandbox, "no new sandbox was needed");
}

#[test]
fn output_streams_in_process() {
    output_arrives_as_it_is_produced(&Setup::in_process());
}

#[test]
fn output_streams_through_the_server() {
    output_arrives_as_it_is_produced(&Setup::through_server());
}

#[test]
fn output_streams_from_the_fake_vercel() {
    output_arrives_as_it_is_produced(&Setup::vercel_through_server());
}

#[test]
fn bytes_pass_through_unchanged_in_process() {
    bytes_pass_through_unchanged(&Setup::in_process(), true);
}

#[test]
fn bytes_pass_through_unchanged_through_the_server() {
    bytes_pass_through_unchanged(&Setup::through_server(), true);
}

#[test]
fn stdin_is_forwarded_in_process() {
    stdin_is_forwarded(&Setup::in_process());
}

#[test]
fn stdin_is_forwarded_through_the_server() {
    stdin_is_forwarded(&Setup::through_server());
}

#[test]
fn stdin_is_uploaded_to_the_fake_vercel() {
    stdin_is_forwarded(&Setup::vercel_through_server());
}

#[test]
fn sigint_cancels_the_command_in_process() {
    a_signal_cancels_the_command_not_the_sandbox(&Setup::in_process(), libc::SIGINT, 130);
}

#[test]
fn sigint_sigterm_sighup_cancel_the_command_through_the_server() {
    let s = Setup::through_server();
    a_signal_cancels_the_command_not_the_sandbox(&s, libc::SIGINT, 130);
    a_signal_cancels_the_command_not_the_sandbox(&s, libc::SIGTERM, 143);
    a_signal_cancels_the_command_not_the_sandbox(&s, libc::SIGHUP, 129);
}

#[test]
fn sigint_cancels_the_command_on_the_fake_vercel() {
    a_signal_cancels_the_command_not_the_sandbox(
        &Setup::vercel_through_server(),
        libc::SIGINT,
        130,
    );
}

/// SIGKILL of `taskbox run` (nothing can be cancelled then) leaves the command to the server:
/// it runs on, and its timeout kills it — not the sandbox.
#[test]
fn a_sigkilled_cli_leaves_the_command_to_the_server_and_its_timeout() {
    let s = Setup::through_server();
    ok(&s.run(&["run", "-t", "orphan", "--", "echo before > kept.txt"]));
    let sandbox = sandbox_of(&s, "orphan");
    let marker = &format!("73.9{}17", std::process::id());
    let mut cmd = s.cmd();
    cmd.args([
        "run",
        "-t",
        "orphan",
        "--timeout",
        "4",
        "--",
        &format!("echo started; sleep {marker}; echo late >> kept.txt"),
    ]);
    let (mut child, rx) = spawn_reading(cmd);
    let mut seen = Vec::new();
    assert!(
        read_until(&rx, &mut seen, b"started\n", Duration::from_secs(30)),
        "the command never started"
    );
    child.kill().expect("SIGKILL the CLI");
    child.wait().expect("wait");
    let killed = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        process_running(marker),
        "the command runs on without its caller"
    );
    assert!(
        wait_for(Duration::from_secs(40), || (!process_running(marker))
            .then_some(()))
        .is_some(),
        "the command outlived its timeout"
    );
    // Loose: about ten times the command's 4 s timeout.
    assert!(killed.elapsed() < Duration::from_secs(45));
    assert_eq!(sandbox_of(&s, "orphan"), sandbox, "the sandbox lives on");
    assert_eq!(
        ok(&s.run(&["run", "-t", "orphan", "--", "cat kept.txt"])),
        "before\n"
    );
}

/// A signal while `taskbox run` still waits for its command to start (here for the task's lock,
/// which another process holds) ends it promptly, as a shell's Ctrl-C would, without running
/// the command.
#[test]
fn a_signal_while_waiting_for_the_task_ends_the_wait() {
    let s = Setup::in_process();
    ok(&s.run(&["run", "-t", "held", "--", "true"]));
    let mut holder = s.cmd();
    holder.args(["run", "-t", "held", "--", "echo holding; sleep 59.731"]);
    let (holder, rx) = spawn_reading(holder);
    let mut seen = Vec::new();
    assert!(
        read_until(&rx, &mut seen, b"holding\n", Duration::from_secs(30)),
        "the first command never started"
    );
    let mut waiter = s.cmd();
    // `-v`: the engine says on stderr when it starts waiting for the other process.
    waiter.args(["-v", "run", "-t", "held", "--", "echo ran > waiter.txt"]);
    let (mut waiter, _rx) = spawn_reading(waiter);
    let log = waiter.stderr.take().expect("stderr");
    let (tx, said) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(log)).map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let waiting = std::iter::from_fn(|| said.recv_timeout(Duration::from_secs(30)).ok())
        .any(|line| line.contains("waiting for another taskbox process"));
    assert!(waiting, "the second run never said it waits for the task");
    let signalled = Instant::now();
    // SAFETY: signalling children this test spawned (not yet reaped).
    unsafe { libc::kill(waiter.id() as i32, libc::SIGINT) };
    let o = waiter.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    // Promptly: long before the holder's command (a minute) would have let go.
    assert!(
        signalled.elapsed() < Duration::from_secs(30),
        "exited only after {:?}",
        signalled.elapsed()
    );
    // SAFETY: as above; the holder is our child, not yet reaped.
    unsafe { libc::kill(holder.id() as i32, libc::SIGINT) };
    let o = holder.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let o = s.run(&["run", "-t", "held", "--", "cat waiter.txt || echo absent"]);
    assert_eq!(ok(&o), "absent\n", "the cancelled command never ran");
}
