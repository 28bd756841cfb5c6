//! `taskbox run`'s fast path (src/cli/fast.rs) against its full path, through one running
//! server: the same stdout bytes, stderr and exit code for a command's own exit code, output on
//! both streams (not UTF-8 too), stdin, a timeout, the notes of a restore, and a request the
//! server refuses after it was sent. A plain `run` takes the fast path; the same command line
//! with `RUST_LOG` set takes the full one (logging is the full path's), with `off` printing
//! nothing more. Which path a process took is seen from outside, while its command runs: the
//! full path's tokio runtime holds an epoll instance and the fast path has none (nor a second
//! thread). What the fast path leaves to the full path — no server, a stale or foreign socket,
//! `never`, `--json` — is covered by the tests of those (tests/it/server, cli_input) and below;
//! its signals by tests/it/live.rs, whose runs through a server take it, and below.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::server::ServerHome;
use crate::support::{ok, stderr, stdout, wait_for, Home};

/// The fast path's and the full path's runs of the same command line.
fn both(h: &ServerHome, args: &[&str], stdin: Option<&[u8]>) -> (Output, Output) {
    let run = |full: bool| {
        let mut cmd = h.home.cmd();
        cmd.args(args);
        if full {
            cmd.env("RUST_LOG", "off");
        }
        spawn_with_stdin(cmd, stdin)
    };
    (run(false), run(true))
}

fn spawn_with_stdin(mut cmd: Command, stdin: Option<&[u8]>) -> Output {
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn taskbox");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input).expect("write stdin");
    }
    child.wait_with_output().expect("wait")
}

#[track_caller]
fn same(fast: &Output, full: &Output, what: &str) {
    assert_eq!(fast.status.code(), full.status.code(), "{what}: exit codes");
    assert_eq!(fast.stdout, full.stdout, "{what}: stdout");
    assert_eq!(stderr(fast), stderr(full), "{what}: stderr");
}

#[test]
fn the_fast_path_answers_as_the_full_path_does() {
    let h = ServerHome::new();
    // The first command starts the server (the full path: no server answered).
    let first = h.home.run(&["run", "-t", "fast", "--", "true"]);
    ok(&first);
    assert!(stderr(&first).contains("started a taskbox server"));

    let (fast, full) = both(
        &h,
        &["run", "-t", "fast", "--", "echo out; echo err >&2; exit 3"],
        None,
    );
    same(&fast, &full, "exit 3");
    assert_eq!(fast.status.code(), Some(3));
    assert_eq!(stdout(&fast), "out\n");
    assert_eq!(stderr(&fast), "err\n");

    // A program and its arguments, quoted for bash; every byte value on stdout.
    let script = "for i in $(seq 0 255); do printf \"\\\\$(printf %03o $i)\"; done";
    let (fast, full) = both(&h, &["run", "--task=fast", "bash", "-c", script], None);
    same(&fast, &full, "bytes");
    assert_eq!(fast.stdout, (0..=255u8).collect::<Vec<u8>>());

    let input: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let (fast, full) = both(
        &h,
        &["run", "-t", "fast", "--", "od -An -tx1 | tail -3"],
        Some(&input),
    );
    same(&fast, &full, "stdin");
    assert!(fast.status.success(), "{}", stderr(&fast));
    assert!(!stdout(&fast).is_empty());

    let (fast, full) = both(
        &h,
        &[
            "run",
            "-t",
            "fast",
            "--timeout",
            "1",
            "--",
            "echo x; sleep 5",
        ],
        None,
    );
    same(&fast, &full, "timeout");
    assert_eq!(fast.status.code(), Some(124));
    assert!(
        stderr(&fast).contains("timed out after 1 s"),
        "{}",
        stderr(&fast)
    );

    // A suspended task's next command restores it, and says so in a note: each path's own
    // suspend, then its run.
    let mut outs = Vec::new();
    for full in [false, true] {
        ok(&h.home.run(&["suspend", "fast"]));
        let mut cmd = h.home.cmd();
        cmd.args(["run", "-t", "fast", "--", "echo back"]);
        if full {
            cmd.env("RUST_LOG", "off");
        }
        outs.push(spawn_with_stdin(cmd, None));
    }
    // Each names its own snapshot and time: the same note otherwise.
    let note = |o: &Output| {
        let e = stderr(o);
        assert!(
            e.contains(": files are back, live processes are gone\n"),
            "{e}"
        );
        e.split(" from snapshot ")
            .next()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(note(&outs[0]), note(&outs[1]), "restore: the note");
    assert_eq!(
        outs[0].status.code(),
        outs[1].status.code(),
        "restore: exit codes"
    );
    assert_eq!(stdout(&outs[0]), "back\n");
    assert_eq!(stdout(&outs[1]), "back\n");

    // Refused by the server once sent: the task was removed.
    ok(&h.home.run(&["rm", "fast"]));
    let (fast, full) = both(&h, &["run", "-t", "fast", "--", "true"], None);
    same(&fast, &full, "removed task");
    assert_eq!(fast.status.code(), Some(125));
    assert!(stderr(&fast).contains("error: "), "{}", stderr(&fast));
    assert!(stderr(&fast).contains("hint: "), "{}", stderr(&fast));
}

/// The first signal cancels the command; a second one, while the cancelled command still
/// holds out (it survives SIGINT until the server's SIGKILL 3 s later), ends `taskbox run` at
/// once with the first signal's code: the command is still alive when the CLI has exited.
#[test]
fn a_second_signal_ends_the_wait_at_once() {
    let h = ServerHome::new();
    ok(&h.home.run(&["run", "-t", "stubborn", "--", "true"]));
    let mut cmd = h.home.cmd();
    // The shell survives SIGINT (its trap says so on stdout, the signal the test waits for)
    // and keeps going until killed. Its host pid is found by the marker in its command line
    // (`$$` is a pid of its sandbox's PID namespace).
    let marker = format!("taskbox-stubborn-{}", std::process::id());
    cmd.args([
        "run",
        "-t",
        "stubborn",
        "--",
        &format!(
            "trap 'echo interrupted' INT; echo started; while :; do sleep 0.1; done; : {marker}"
        ),
    ]);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).expect("read");
    assert_eq!(line, "started\n", "the command's first line");
    let shell = outermost(&marked(&marker, child.id()));
    assert_eq!(shell.len(), 1, "one shell carries {marker}: {shell:?}");
    let shell = shell[0];
    // SAFETY: signalling the child this test spawned (not yet reaped).
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    // The cancel reached the command: its trap ran.
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).expect("read");
    assert_eq!(line, "interrupted\n", "the cancel reached the command");
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(130), "the first signal's code");
    // At once: the CLI did not wait for the server's SIGKILL of the command.
    assert!(
        alive(shell),
        "the CLI waited until the cancelled command was killed"
    );
    // The server still ends the command (its SIGKILL 3 s after the cancel); the test leaves
    // nothing running behind it.
    let survived = wait_for(Duration::from_secs(60), || (!alive(shell)).then_some(())).is_none();
    if survived {
        // SAFETY: the test's own command, so that a failure leaves nothing behind.
        unsafe { libc::kill(shell, libc::SIGKILL) };
    }
    assert!(!survived, "the server never killed the cancelled command");
}

/// The processes, but `except`, whose command line contains `marker`.
fn marked(marker: &str, except: u32) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid as u32 != except)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

/// Those of `pids` whose parent is not one of them (a shell, not the copies of it it forks
/// before each `exec`).
fn outermost(pids: &[i32]) -> Vec<i32> {
    let parent = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let (_, rest) = stat.rsplit_once(')')?;
                rest.split_whitespace().nth(1)?.parse::<i32>().ok()
            })
    };
    pids.iter()
        .copied()
        .filter(|&pid| parent(pid).is_some_and(|p| !pids.contains(&p)))
        .collect()
}

/// Whether `pid` is a live process (a zombie counts as dead).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// What a running `taskbox run` process shows of itself: whether it holds an epoll instance
/// (the full path's tokio runtime) and how many threads it has.
fn runtime_of(pid: u32) -> (bool, usize) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("list the CLI's descriptors");
    let epoll = fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| target.to_string_lossy().contains("eventpoll"))
    });
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("list the CLI's threads")
        .count();
    (epoll, threads)
}

/// A plain `run` through a running server is served without a runtime; `RUST_LOG`, `--json`
/// and `-v` are the full path's. Each process is then ended by a signal, with a shell's code
/// on either path.
#[test]
fn a_plain_run_takes_the_fast_path_and_the_rest_the_full_one() {
    let h = ServerHome::new();
    ok(&h.home.run(&["run", "-t", "which", "--", "true"]));
    /// A case: its name, the flags before `-t`, an environment variable, whether it takes the
    /// fast path, the signal that ends it and the exit code that says so.
    type Case = (
        &'static str,
        &'static [&'static str],
        Option<(&'static str, &'static str)>,
    );
    let cases: [(Case, bool, i32, i32); 4] = [
        (("plain", &[], None), true, libc::SIGTERM, 143),
        (
            ("logging", &[], Some(("RUST_LOG", "off"))),
            false,
            libc::SIGINT,
            130,
        ),
        (("json", &["--json"], None), false, libc::SIGHUP, 129),
        (("verbose", &["-v"], None), false, libc::SIGTERM, 143),
    ];
    for ((what, flags, env), fast, signal, code) in cases {
        // Made in the workspace (the sandbox's only tree the host sees), seen from outside.
        let started = h
            .data()
            .join(format!("local/tasks/which/workspace/started-{what}"));
        let mut cmd = h.home.cmd();
        cmd.arg("run")
            .args(flags)
            .args(["-t", "which", "--"])
            .arg(format!("touch started-{what}; sleep 30"));
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        assert!(
            wait_for(Duration::from_secs(30), || started.exists().then_some(())).is_some(),
            "{what}: the command never started"
        );
        let (epoll, threads) = runtime_of(child.id());
        // The front serves the fast path; for the rest it has become the engine (exec: the
        // same process, so the signal below reaches the engine).
        let image = std::fs::read_link(format!("/proc/{}/exe", child.id())).expect("exe link");
        let image = image
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if fast {
            assert!(!epoll, "{what}: the fast path holds no epoll instance");
            assert_eq!(threads, 1, "{what}: the fast path runs on one thread");
            assert_eq!(image, "taskbox", "{what}: the front serves the fast path");
        } else {
            assert!(epoll, "{what}: the full path runs a tokio runtime");
            assert_eq!(
                image, "taskbox-engine",
                "{what}: the front execs the engine"
            );
        }
        // SAFETY: signalling the child this test spawned (not yet reaped).
        unsafe { libc::kill(child.id() as i32, signal) };
        let o = child.wait_with_output().expect("wait");
        assert_eq!(o.status.code(), Some(code), "{what}: {}", stderr(&o));
    }
}

/// The front (`taskbox`, src/front.rs) serves a plain run itself: a copy of it alone in a
/// directory, with no engine next to it, runs commands through a running server (their output
/// on both streams, stdin, exit codes), and every command line it does not serve fails with
/// exit 125, naming the engine it looked for and the fix — as does an engine that is there but
/// cannot be executed.
#[test]
fn the_front_serves_a_plain_run_without_the_engine() {
    let h = ServerHome::new();
    // Through the installed pair: no server answers yet, so the engine starts one.
    ok(&h.home.run(&["run", "-t", "alone", "--", "true"]));
    let dir = tempfile::tempdir().expect("temp dir");
    let front = dir.path().join("taskbox");
    std::fs::copy(env!("CARGO_BIN_EXE_taskbox"), &front).expect("copy the front");
    let alone = |args: &[&str], stdin: Option<&[u8]>| {
        let mut cmd = h.home.cmd_of(&front);
        cmd.args(args);
        spawn_with_stdin(cmd, stdin)
    };
    let o = alone(
        &["run", "-t", "alone", "--", "echo out; echo err >&2; exit 7"],
        None,
    );
    assert_eq!(
        (o.status.code(), stdout(&o).as_str(), stderr(&o).as_str()),
        (Some(7), "out\n", "err\n")
    );
    let o = alone(&["run", "-t", "alone", "cat"], Some(b"piped\n"));
    assert_eq!((o.status.code(), stdout(&o).as_str()), (Some(0), "piped\n"));

    let engine = dir.path().join("taskbox-engine");
    let refused = |why: &str| {
        for args in [
            &["tasks"][..],
            &["run", "--json", "-t", "alone", "--", "true"],
            &["run", "-t", "alone"],
            &["--version"],
        ] {
            let o = alone(args, None);
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(125), "{args:?}: {err}");
            assert!(o.stdout.is_empty(), "{args:?}: {}", stdout(&o));
            let head = format!(
                "error: cannot run the taskbox engine {}: ",
                engine.display()
            );
            assert!(
                err.starts_with(&head) && err.contains(why),
                "{args:?}: {err}"
            );
            assert!(
                err.contains("\nhint: ") && err.contains("cargo install --path ."),
                "{err}"
            );
        }
    };
    refused("No such file or directory");
    std::fs::write(&engine, "not a program").expect("write");
    std::fs::set_permissions(&engine, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    refused("Permission denied");
}

/// Every command line the front does not serve reaches the engine with the same arguments: the
/// same exit code, stdout and stderr as the engine run directly — a command's own code on the
/// full path (`never`, `--json`), a usage error, an unknown command, `--version`.
#[test]
fn the_front_hands_everything_else_to_the_engine() {
    let engine = Path::new(env!("CARGO_BIN_EXE_taskbox")).with_file_name("taskbox-engine");
    // `never`: no server, the run is in-process (the engine's), through the front or not.
    let home = Home::new();
    let script = "echo out; echo err >&2; exit 3";
    ok(&home
        .cmd_of(&engine)
        .args(["run", "-t", "e", "--", "true"])
        .output()
        .expect("run"));
    let h = ServerHome::new();
    ok(&h.home.run(&["run", "-t", "e", "--", "true"]));
    let cases: [(&Home, &[&str]); 5] = [
        (&home, &["run", "-t", "e", "--", script]),
        (&h.home, &["run", "-t"]),
        (&h.home, &["no-such-command"]),
        (&h.home, &["--version"]),
        (&h.home, &["tasks"]),
    ];
    for (home, args) in cases {
        let front = home.cmd().args(args).output().expect("spawn the front");
        let direct = home
            .cmd_of(&engine)
            .args(args)
            .output()
            .expect("spawn the engine");
        same(&front, &direct, &format!("{args:?}"));
    }
    let o = home.run(&["run", "-t", "e", "--", script]);
    assert_eq!((o.status.code(), stdout(&o).as_str()), (Some(3), "out\n"));
    // `--json` (the full path, through the server): the command's code, its result on stdout.
    let o = h.home.run(&["run", "--json", "-t", "e", "--", script]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("run --json");
    assert_eq!(
        (v["exit_code"].as_i64(), v["task"].as_str()),
        (Some(3), Some("e"))
    );
}

/// The front stays small: the loader relocates every pointer of a PIE at each start, which was
/// most of what a warm `taskbox run` added over its command (docs/performance.md), so the front
/// links only the fast path — not the providers, the HTTP client or the async runtime the
/// engine holds. At c19a242 it had 5 % of the engine's relocations; naming the backend
/// registry's entries from the fast path (7a55a34's foreign-archive note) took it to 37 %.
#[test]
fn the_front_links_a_small_share_of_the_engines_relocations() {
    let front = Path::new(env!("CARGO_BIN_EXE_taskbox"));
    let engine = front.with_file_name("taskbox-engine");
    let (f, e) = (relative_relocations(front), relative_relocations(&engine));
    assert!(
        f * 5 < e,
        "the front {} has {f} relative relocations, the engine {} {e}: the front must stay \
         under a fifth of the engine (see what the fast path's modules name: a table of \
         function pointers, such as provider::BACKENDS, links everything it points at)",
        front.display(),
        engine.display()
    );
}

/// Neither binary loads `libgcc_s.so` at its start: `build.rs` links the unwinder statically,
/// and a `DT_NEEDED` entry for it would name the library in the binary.
#[test]
fn neither_binary_loads_libgcc_s_at_its_start() {
    let front = Path::new(env!("CARGO_BIN_EXE_taskbox"));
    for bin in [front.to_path_buf(), front.with_file_name("taskbox-engine")] {
        let elf = std::fs::read(&bin).expect("read the binary");
        assert!(
            !elf.windows(13).any(|w| w == b"libgcc_s.so.1"),
            "{} needs libgcc_s.so.1: build.rs should link the unwinder (libgcc_eh) into it",
            bin.display()
        );
    }
}

/// An ELF64 little-endian executable's `DT_RELACOUNT`: the relative relocations the loader
/// applies at each start (what `readelf -d` prints as `RELACOUNT`).
fn relative_relocations(path: &Path) -> u64 {
    const PT_DYNAMIC: u32 = 2;
    const DT_NULL: u64 = 0;
    const DT_RELACOUNT: u64 = 0x6fff_fff9;
    let elf = std::fs::read(path).expect("read the binary");
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().expect("2 bytes"));
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().expect("8 bytes"));
    assert_eq!(
        (&elf[..4], elf[4], elf[5]),
        (&b"\x7fELF"[..], 2, 1),
        "{}: an ELF64 little-endian file",
        path.display()
    );
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    let dynamic = (0..usize::from(phnum))
        .map(|i| phoff + i * usize::from(phentsize))
        .find(|&h| u32_at(h) == PT_DYNAMIC)
        .map(|h| (u64_at(h + 8) as usize, u64_at(h + 32) as usize))
        .unwrap_or_else(|| panic!("{}: no dynamic section (a PIE has one)", path.display()));
    let (offset, size) = dynamic;
    (offset..offset + size)
        .step_by(16)
        .map(|at| (u64_at(at), u64_at(at + 8)))
        .take_while(|&(tag, _)| tag != DT_NULL)
        .find(|&(tag, _)| tag == DT_RELACOUNT)
        .map(|(_, count)| count)
        .unwrap_or_else(|| panic!("{}: no DT_RELACOUNT", path.display()))
}
