//! The CLI end to end on the real local provider: real files, real processes, real SQLite.

use std::time::Duration;

use serde_json::Value;

use crate::support::{ok, stderr, stdout, wait_for, Home};

fn show(home: &Home, task: &str) -> Value {
    serde_json::from_str(&ok(&home.run(&["show", task, "--json"]))).expect("show --json is JSON")
}

#[test]
fn the_issue_session_works_on_a_fresh_home() {
    let home = Home::new();
    let out = ok(&home.run(&[
        "run",
        "--task",
        "demo",
        "--",
        "bash",
        "-c",
        "echo hello > notes.txt; pwd",
    ]));
    assert!(
        out.trim_end().ends_with("workspace"),
        "pwd prints the workspace: {out}"
    );
    let first = show(&home, "demo");
    assert_eq!(first["task"]["state"], "running");
    let sandbox = first["task"]["sandbox"]["id"].clone();

    // Same sandbox, reused.
    assert_eq!(
        ok(&home.run(&["run", "--task", "demo", "--", "cat", "notes.txt"])),
        "hello\n"
    );
    assert_eq!(show(&home, "demo")["task"]["sandbox"]["id"], sandbox);

    // Suspend keeps the files in a snapshot and stops the sandbox.
    let o = home.run(&["suspend", "demo"]);
    ok(&o);
    assert!(stderr(&o).contains("snapshot"), "{}", stderr(&o));
    let suspended = show(&home, "demo");
    assert_eq!(suspended["task"]["state"], "expired");
    assert!(suspended["task"]["sandbox"].is_null());

    // The next command restores the latest snapshot, and says so.
    let o = home.run(&["run", "--task", "demo", "--", "cat", "notes.txt"]);
    assert_eq!(ok(&o), "hello\n");
    assert!(
        stderr(&o).contains("recreated from snapshot"),
        "{}",
        stderr(&o)
    );

    let view = show(&home, "demo");
    assert_eq!(view["task"]["state"], "running");
    assert_eq!(view["snapshots"].as_array().map(Vec::len), Some(1));
    assert!(view["journal"].as_array().is_some_and(|j| !j.is_empty()));

    let tasks = ok(&home.run(&["tasks"]));
    assert!(
        tasks.contains("demo") && tasks.contains("running"),
        "{tasks}"
    );
    let json: Value = serde_json::from_str(&ok(&home.run(&["tasks", "--json"]))).expect("JSON");
    assert_eq!(json[0]["task"], "demo");
}

#[test]
fn working_directory_is_carried_between_commands() {
    let home = Home::new();
    ok(&home.run(&["run", "-t", "cwd", "--", "mkdir -p sub/dir && cd sub/dir"]));
    let out = ok(&home.run(&["run", "-t", "cwd", "--", "pwd"]));
    assert!(out.trim_end().ends_with("workspace/sub/dir"), "{out}");
}

#[test]
fn exit_codes_pass_through_and_timeouts_exit_124() {
    let home = Home::new();
    let o = home.run(&["run", "-t", "codes", "--", "echo out; echo err >&2; exit 3"]);
    assert_eq!(o.status.code(), Some(3));
    assert_eq!(stdout(&o), "out\n");
    assert!(stderr(&o).contains("err"));

    let o = home.run(&["run", "-t", "codes", "--timeout", "1", "--", "sleep 30"]);
    assert_eq!(o.status.code(), Some(124), "{}", stderr(&o));
    assert!(stderr(&o).contains("timed out"), "{}", stderr(&o));
    // The sandbox survives a timed-out command.
    assert_eq!(
        ok(&home.run(&["run", "-t", "codes", "--", "echo still here"])),
        "still here\n"
    );
}

#[test]
fn run_json_reports_the_result() {
    let home = Home::new();
    let out = ok(&home.run(&["run", "-t", "j", "--json", "--", "printf abc"]));
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["stdout"], "abc");
    assert_eq!(v["timed_out"], false);
}

#[test]
fn bad_input_is_a_clear_error_with_exit_125() {
    let home = Home::new();
    for bad in ["../etc", "a/b", "", "x y"] {
        let o = home.run(&["run", "--task", bad, "--", "true"]);
        assert_eq!(o.status.code(), Some(125), "task id {bad:?}");
        let e = stderr(&o);
        assert!(
            e.contains("error: invalid task id") && e.contains("hint:"),
            "{e}"
        );
    }
    let o = home.run(&["config", "set", "terminal.nope", "1"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        stderr(&o).contains("unknown config key `terminal.nope`"),
        "{}",
        stderr(&o)
    );
    let o = home.run(&["config", "set", "terminal.container_persistent", "maybe"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("true or false"), "{}", stderr(&o));
    let o = home.run(&["show", "nosuchtask"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("no task named"), "{}", stderr(&o));
    // A config file that is not valid is named, and `config set` does not lose it.
    std::fs::write(
        home.path().join("config.toml"),
        "[terminal]\ntimeout = \"x\"\n",
    )
    .expect("write");
    let o = home.run(&["run", "-t", "x", "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("config.toml"), "{}", stderr(&o));
}

/// `terminal.backend` names a backend of the provider registry: `config set` refuses another
/// name at once with the list, takes the short name `vercel` as `vercel_sandbox`, and a file
/// edited by hand to a name no backend has is refused where the config becomes a provider, with
/// the list and the fix.
#[test]
fn an_unknown_backend_is_refused_with_the_registrys_names() {
    let home = Home::new();
    let o = home.run(&["config", "set", "terminal.backend", "nope"]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("invalid value `nope` for `terminal.backend`")
            && e.contains("one of: local, vercel_sandbox")
            && e.contains("hint:"),
        "{e}"
    );
    assert_eq!(
        ok(&home.run(&["config", "get", "terminal.backend"])),
        "local\n",
        "a refused value is not stored"
    );
    let o = home.run(&["config", "set", "terminal.backend", "Not A Name"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("lowercase letters"), "{}", stderr(&o));
    ok(&home.run(&["config", "set", "terminal.backend", "vercel"]));
    assert_eq!(
        ok(&home.run(&["config", "get", "terminal.backend"])),
        "vercel_sandbox\n"
    );
    std::fs::write(
        home.path().join("config.toml"),
        "[terminal]\nbackend = \"docker\"\n",
    )
    .expect("write");
    let o = home.run(&["run", "-t", "x", "--", "true"]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("no backend is named `docker`")
            && e.contains("one of: local, vercel_sandbox")
            && e.contains("taskbox config set terminal.backend"),
        "{e}"
    );
    let o = home.run(&["doctor"]);
    assert_ne!(o.status.code(), Some(0));
    let said = format!("{}{}", stdout(&o), stderr(&o));
    assert!(said.contains("no backend is named `docker`"), "{said}");
}

#[test]
fn config_get_set_show_round_trip() {
    let home = Home::new();
    assert_eq!(
        ok(&home.run(&["config", "get", "terminal.backend"])),
        "local\n"
    );
    ok(&home.run(&["config", "set", "terminal.backend", "vercel_sandbox"]));
    ok(&home.run(&["config", "set", "terminal.container_cpu", "2"]));
    ok(&home.run(&["config", "set", "terminal.container_memory", "4096"]));
    assert_eq!(
        ok(&home.run(&["config", "get", "terminal.backend"])),
        "vercel_sandbox\n"
    );
    let shown = ok(&home.run(&["config", "show"]));
    assert!(
        shown.contains("terminal.container_memory = 4096"),
        "{shown}"
    );
    let json: Value =
        serde_json::from_str(&ok(&home.run(&["config", "show", "--json"]))).expect("JSON");
    assert_eq!(json["terminal.container_cpu"], "2");
}

#[test]
fn config_show_notes_a_set_runtime_as_deprecated_and_the_default_sets_none() {
    let mut home = Home::new();
    let o = home.run(&["config", "show"]);
    let shown = ok(&o);
    assert!(shown.contains("terminal.vercel_runtime = none"), "{shown}");
    assert!(
        shown.contains("terminal.vercel_image = vercel/sandbox/universal"),
        "{shown}"
    );
    assert!(!stderr(&o).contains("deprecated"), "{}", stderr(&o));
    ok(&home.run(&["config", "set", "terminal.vercel_runtime", "node22"]));
    let o = home.run(&["config", "show"]);
    ok(&o);
    assert!(
        stderr(&o).contains("note: terminal.vercel_runtime = node22 is deprecated")
            && stderr(&o).contains("taskbox config set terminal.vercel_runtime none"),
        "{}",
        stderr(&o)
    );
    ok(&home.run(&["config", "set", "terminal.vercel_runtime", "none"]));
    home.set_env("TERMINAL_VERCEL_RUNTIME", "python3.13");
    let o = home.run(&["config", "show"]);
    assert!(
        stderr(&o).contains("TERMINAL_VERCEL_RUNTIME = python3.13 is deprecated")
            && stderr(&o).contains("unset TERMINAL_VERCEL_RUNTIME"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn non_persistent_tasks_start_fresh_after_suspend() {
    let home = Home::new();
    ok(&home.run(&["config", "set", "terminal.container_persistent", "false"]));
    ok(&home.run(&["run", "-t", "np", "--", "echo x > f"]));
    ok(&home.run(&["suspend", "np"]));
    assert_eq!(show(&home, "np")["task"]["state"], "idle");
    let o = home.run(&["run", "-t", "np", "--", "cat f"]);
    assert_eq!(o.status.code(), Some(1), "the file is gone: {}", stderr(&o));
}

#[test]
fn resume_restores_without_running_anything() {
    let home = Home::new();
    ok(&home.run(&["run", "-t", "r", "--", "echo kept > f"]));
    ok(&home.run(&["suspend", "r"]));
    let o = home.run(&["resume", "r", "--json"]);
    let v: Value = serde_json::from_str(&ok(&o)).expect("JSON");
    assert!(v["sandbox_id"]
        .as_str()
        .is_some_and(|s| s.starts_with("taskbox-r-g")));
    assert_eq!(show(&home, "r")["task"]["state"], "running");
    assert_eq!(ok(&home.run(&["run", "-t", "r", "--", "cat f"])), "kept\n");
}

/// SIGKILL in the middle of a snapshot, then run again: nothing is lost.
#[test]
fn sigkill_mid_snapshot_loses_nothing() {
    let home = Home::new();
    ok(&home.run(&["run", "-t", "k", "--", "echo v1 > notes.txt"]));
    ok(&home.run(&["suspend", "k"]));
    // v2, plus enough incompressible data that the snapshot takes a while.
    ok(&home.run(&[
        "run",
        "-t",
        "k",
        "--",
        "echo v2 > notes.txt; head -c 64000000 /dev/urandom > big.bin",
    ]));
    let mut child = home.cmd().args(["suspend", "k"]).spawn().expect("spawn");
    let caught = wait_for(Duration::from_secs(20), || {
        let o = home.run(&["show", "k", "--json"]);
        let v: Value = serde_json::from_str(&stdout(&o)).ok()?;
        (v["task"]["state"] == "snapshotting").then_some(())
    });
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    assert!(caught.is_some(), "never saw the task snapshotting");
    // Recovery re-issues the interrupted snapshot (idempotent by sequence number): the
    // workspace is discarded only after its archive is complete, so v2 is never lost.
    let o = home.run(&[
        "run",
        "-t",
        "k",
        "--",
        "cat notes.txt; test -s big.bin && echo big",
    ]);
    assert_eq!(ok(&o), "v2\nbig\n", "files after the crash: {}", stderr(&o));
    let v = show(&home, "k");
    let statuses: Vec<String> = v["task"]["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .map(|s| s["status"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(statuses.iter().all(|s| s != "pending"), "{statuses:?}");
}

#[test]
fn bounded_output_keeps_head_and_tail() {
    let home = Home::new();
    // The capture (`--json`, the library's result) is bounded...
    let o = home.run(&["run", "-t", "big", "--json", "--", "seq 1 200000"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&o)).expect("JSON");
    let out = v["stdout"].as_str().expect("text");
    assert!(out.starts_with("1\n2\n"), "head kept");
    assert!(out.trim_end().ends_with("200000"), "tail kept");
    assert!(out.contains("output truncated"), "cut noted");
    assert!(out.len() < 60_000, "bounded: {}", out.len());
    assert_eq!(v["stdout_truncated"], true);
    // ...the live output is all of it.
    let o = home.run(&["run", "-t", "big", "--", "seq 1 200000"]);
    let expected: String = (1..=200_000).map(|i| format!("{i}\n")).collect();
    assert!(ok(&o) == expected, "every line, in order");
}

#[test]
fn gc_removes_what_interrupted_operations_left_behind() {
    let home = Home::new();
    ok(&home.run(&["run", "-t", "g", "--", "echo x > f"]));
    // A half-written archive of a process that died mid-snapshot.
    let mut child = std::process::Command::new("true").spawn().expect("spawn");
    let dead = child.id();
    child.wait().expect("wait");
    let dir = home.path().join("data/local/snapshots/g");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let half = dir.join(format!("7.tbx.{dead}.1.tmp"));
    std::fs::write(&half, b"half an archive").expect("write");
    let v: Value = serde_json::from_str(&ok(&home.run(&["gc", "--json"]))).expect("JSON");
    assert_eq!(v["temporaries_removed"], 1, "{v}");
    assert!(!half.exists());
    // The task's own files are untouched.
    assert_eq!(ok(&home.run(&["run", "-t", "g", "--", "cat f"])), "x\n");
}

/// `taskbox tasks` lines its columns up whatever the names' lengths (issue 32 item 17: a task
/// id ignored the column's width).
#[test]
fn tasks_columns_line_up() {
    let home = Home::new();
    for task in ["a", "a-much-longer-task-name"] {
        ok(&home.run(&["run", "-t", task, "--", "true"]));
    }
    let table = ok(&home.run(&["tasks"]));
    let columns: Vec<Vec<usize>> = table
        .lines()
        .map(|line| {
            // Where each column starts: after a run of two spaces or more.
            let b = line.as_bytes();
            (2..b.len())
                .filter(|&i| b[i] != b' ' && b[i - 1] == b' ' && b[i - 2] == b' ')
                .collect()
        })
        .collect();
    assert_eq!(columns.len(), 3, "{table}");
    assert!(
        columns.iter().all(|c| *c == columns[0]),
        "every column starts at one offset on every line:\n{table}"
    );
}

/// A closed stdout (`taskbox show demo | head -1`) is the end of the output: every command
/// that prints data exits as usual, without a panic (issue 32 item 16: exit 101 and a
/// backtrace). Its stdout is a pipe whose reader is gone before it writes a byte.
#[test]
fn a_closed_stdout_ends_the_output_without_a_panic() {
    let home = Home::new();
    ok(&home.run(&["run", "-t", "demo", "--", "echo hi"]));
    for args in [
        &["show", "demo"][..],
        &["show", "demo", "--json"],
        &["tasks"],
        &["tasks", "--tree"],
        &["tasks", "--json"],
        &["cost"],
        &["cost", "demo"],
        &["config", "show"],
        &["config", "path"],
        &["config", "get", "terminal.timeout"],
        &["run", "-t", "demo", "--", "echo hi"],
        &["run", "-t", "demo", "--json", "--", "echo hi"],
    ] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let o = home
            .cmd()
            .args(args)
            .stdout(writer)
            .output()
            .expect("run taskbox");
        assert!(
            o.status.code() == Some(0) && !stderr(&o).contains("panicked"),
            "taskbox {args:?}: {:?}\n{}",
            o.status,
            stderr(&o)
        );
    }
}

/// A command that can never run — over the argument limit of `bash -c` — is refused before
/// anything is made, and the refusal does not echo it (issue 32 item 15: a 200 KB command made
/// a task and a live sandbox, and its 200 KB were in the message and the journal).
#[test]
fn a_command_over_the_argument_limit_is_refused_before_anything_is_made() {
    let home = Home::new();
    let word = "x".repeat(99);
    let mut args = vec!["run", "-t", "big", "--", "echo"];
    args.extend(std::iter::repeat_n(word.as_str(), 2_000));
    let o = home.run(&args);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("over the 131071 bytes") && err.len() < 2_000,
        "{} bytes: {}",
        err.len(),
        &err[..err.len().min(2_000)]
    );
    let o = home.run(&["show", "big"]);
    assert!(stderr(&o).contains("no task named"), "{}", stderr(&o));
    args.insert(3, "--json");
    let o = home.run(&args);
    assert_eq!(o.status.code(), Some(125));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("JSON error");
    assert_eq!(v["code"], "invalid_command", "{v}");
}

/// The data dir is its owner's alone (0700) and the journal's files 0600, whatever the umask
/// (issue 32 item 11: 0755 and 0644 under umask 022, readable by every local user).
#[test]
fn the_data_dir_is_private_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let home = Home::new();
    let mut cmd = home.cmd();
    cmd.args(["run", "-t", "p", "--", "echo hi"]);
    // SAFETY: between fork and exec the child only calls `umask`, which is async-signal-safe
    // and cannot fail.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
    ok(&cmd.output().expect("run taskbox"));
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let data = home.path().join("data");
    assert_eq!(mode(&data), 0o700, "the data dir");
    assert_eq!(mode(&data.join("taskbox.db")), 0o600, "the journal");
}

// ---- Variables for commands (issue 31 "Environment", issue 32 item 10) ----
//
// Each test runs with the local sandbox unisolated and, where this machine makes namespaces
// (always under CI), isolated: a command's environment is built from scratch on both paths.

/// The `NAME=VALUE` lines of `env`'s output, by name.
fn env_lines(out: &str) -> std::collections::BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Every byte under `dir` (the data dir: the journal, its WAL, the server's log, snapshots).
fn all_bytes(dir: &std::path::Path, out: &mut Vec<u8>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            all_bytes(&path, out);
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.extend(bytes);
        }
    }
}

#[test]
fn run_env_and_terminal_env_reach_the_command_and_nothing_of_the_callers_does() {
    for mode in crate::support::isolation_modes("run_env_and_terminal_env_reach_the_command") {
        let home = Home::new();
        ok(&home.run(&["config", "set", "terminal.local_isolation", mode]));
        ok(&home.run(&[
            "config",
            "set",
            "terminal.env",
            r#"{"FROM_CONFIG": "config-value", "SHARED": "from-config"}"#,
        ]));
        // The CLI's own environment: one variable passed by name, one never passed.
        let o = home
            .cmd()
            .env("FROM_CALLER", "caller-value")
            .env("CALLER_ONLY_SECRET", "must-not-leak")
            .args([
                "run",
                "-t",
                "env",
                "--env",
                "ONE=1=2",
                "-e",
                "SHARED=from-run",
            ])
            .args(["--env", "FROM_CALLER", "--env", "EMPTY=", "--", "env"])
            .output()
            .expect("run taskbox");
        let vars = env_lines(&ok(&o));
        let got = |k: &str| vars.get(k).map(String::as_str);
        assert_eq!(got("ONE"), Some("1=2"), "{mode}: {vars:?}");
        assert_eq!(
            got("SHARED"),
            Some("from-run"),
            "{mode}: a run's variable wins"
        );
        assert_eq!(got("FROM_CONFIG"), Some("config-value"), "{mode}");
        assert_eq!(got("FROM_CALLER"), Some("caller-value"), "{mode}");
        assert_eq!(got("EMPTY"), Some(""), "{mode}");
        assert_eq!(
            got("CALLER_ONLY_SECRET"),
            None,
            "{mode}: the caller's leaked"
        );
        // The in-process engine's own environment reaches no command either.
        assert_eq!(got("TASKBOX_HOME"), None, "{mode}: {vars:?}");
        assert_eq!(got("TASKBOX_SERVER"), None, "{mode}: {vars:?}");
        assert_eq!(got("TASKBOX_TASK_ID"), Some("env"), "{mode}");
        assert!(got("PATH").is_some() && got("HOME").is_some(), "{mode}");
        // The next command, without --env, sees terminal.env only.
        let vars = env_lines(&ok(&home.run(&["run", "-t", "env", "--", "env"])));
        assert_eq!(vars.get("ONE"), None, "{mode}");
        assert_eq!(
            vars.get("SHARED").map(String::as_str),
            Some("from-config"),
            "{mode}"
        );
    }
}

#[test]
fn passed_values_are_secrets_never_journaled_shown_or_echoed_in_errors() {
    let home = Home::new();
    let secret = "sk-test-Zq9xPassedValue4711";
    ok(&home.run(&[
        "config",
        "set",
        "terminal.env",
        &format!(r#"{{"CONFIG_TOKEN": "{secret}-cfg"}}"#),
    ]));
    let get = ok(&home.run(&["config", "get", "terminal.env"]));
    assert!(!get.contains(secret), "config get shows a value: {get}");
    assert!(get.contains("CONFIG_TOKEN"), "{get}");
    let shown = ok(&home.run(&["config", "show"]));
    assert!(
        !shown.contains(secret),
        "config show shows a value: {shown}"
    );

    let token = format!("TOKEN={secret}");
    // The command checks the values without naming them (its text is journaled).
    let check = r#"echo "${#TOKEN} ${TOKEN:0:8} ${#CONFIG_TOKEN}""#;
    let out = ok(&home.run(&["run", "-t", "s", "--json", "--env", &token, "--", check]));
    let v: Value = serde_json::from_str(&out).expect("JSON");
    let expected = format!("{} sk-test- {}\n", secret.len(), secret.len() + 4);
    assert_eq!(v["stdout"], expected.as_str(), "{v}");
    assert!(!out.contains("Zq9x"), "run --json shows a value: {out}");
    ok(&home.run(&["run", "-t", "s", "-e", &token, "--", "true"]));
    ok(&home.run(&["suspend", "s"]));
    let shown = ok(&home.run(&["show", "s", "--json"]));
    assert!(
        !shown.contains("Zq9x"),
        "show --json holds a value: {shown}"
    );
    // Nor its names: the command's text names them (as typed), no record lists them.
    assert!(
        !shown.contains("TOKEN=") && !shown.contains("\"env\""),
        "the journal records the variables: {shown}"
    );
    let mut bytes = Vec::new();
    all_bytes(&home.path().join("data"), &mut bytes);
    let found = bytes.windows(4).filter(|w| w == b"Zq9x").count();
    assert_eq!(
        found, 0,
        "a value reached the data dir (journal, log or snapshot)"
    );

    // Refused variables: exit 125, naming the variable and the rule, never the value.
    for (arg, says) in [
        ("TASKBOX_WORKSPACE=/tmp", "taskbox's own"),
        ("BAD NAME=sk-test-Zq9xRefused", "not a variable name"),
        ("1X=sk-test-Zq9xRefused", "not a variable name"),
        ("NOT_IN_THE_CALLERS_ENV", "not set in this environment"),
    ] {
        let o = home.run(&["run", "-t", "s", "--env", arg, "--", "true"]);
        assert_eq!(o.status.code(), Some(125), "{arg}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains(says) && err.contains("hint:"), "{arg}: {err}");
        assert!(
            !err.contains("Zq9xRefused"),
            "{arg}: the value is shown: {err}"
        );
    }
    let o = home.run(&[
        "config",
        "set",
        "terminal.env",
        r#"{"TASKBOX_TASK_ID": "sk-test-Zq9xRefused"}"#,
    ]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    assert!(!stderr(&o).contains("Zq9xRefused"), "{}", stderr(&o));
    assert!(stderr(&o).contains("terminal.env"), "{}", stderr(&o));
}

/// Issue 32 item 10: the CLI that happens to start the server does not hand its environment to
/// the server, nor through it to every later command.
#[test]
fn an_auto_started_server_keeps_no_variable_of_its_starter_from_commands() {
    for mode in
        crate::support::isolation_modes("an_auto_started_server_keeps_no_variable_of_its_starter")
    {
        let h = crate::server::ServerHome::new();
        ok(&h
            .home
            .run(&["config", "set", "terminal.local_isolation", mode]));
        ok(&h.home.run(&[
            "config",
            "set",
            "terminal.env",
            r#"{"FROM_CONFIG": "config-value"}"#,
        ]));
        // The first caller starts the server.
        let o = h
            .home
            .cmd()
            .env("FIRST_CALLER_SECRET", "first-caller-s3cret")
            .env("VERCEL_TOKEN", "first-caller-vercel-token")
            .args(["run", "-t", "first", "--", "true"])
            .output()
            .expect("run taskbox");
        ok(&o);
        let pid = h.wait_for_server();
        let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("the server's env");
        let environ = String::from_utf8_lossy(&environ);
        assert!(
            !environ.contains("FIRST_CALLER_SECRET"),
            "{mode}: the server took a variable it does not read"
        );
        assert!(environ.contains("TASKBOX_HOME="), "{mode}: {environ}");

        // A later caller, and its command.
        let o = h
            .home
            .cmd()
            .args([
                "run",
                "-t",
                "later",
                "--env",
                "FROM_RUN=run-value",
                "--",
                "env",
            ])
            .output()
            .expect("run taskbox");
        let vars = env_lines(&ok(&o));
        let got = |k: &str| vars.get(k).map(String::as_str);
        assert_eq!(got("FIRST_CALLER_SECRET"), None, "{mode}: {vars:?}");
        assert_eq!(
            got("VERCEL_TOKEN"),
            None,
            "{mode}: the server's token leaked"
        );
        assert_eq!(got("TASKBOX_HOME"), None, "{mode}: {vars:?}");
        assert_eq!(got("FROM_RUN"), Some("run-value"), "{mode}: {vars:?}");
        assert_eq!(got("FROM_CONFIG"), Some("config-value"), "{mode}: {vars:?}");
        ok(&h.home.run(&["serve", "--stop"]));
    }
}

/// One HTTP/1.1 exchange over the data dir's Unix socket: the status code and the raw body.
fn socket_http(data: &std::path::Path, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s =
        std::os::unix::net::UnixStream::connect(data.join("taskbox.sock")).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

/// The API's run request takes `env`; a refused variable is a 400 naming it, never its value.
#[test]
fn the_apis_run_request_takes_env_and_refuses_a_bad_one_without_echoing_it() {
    let h = crate::server::ServerHome::new();
    ok(&h.home.run(&["run", "-t", "api", "--", "true"]));
    h.wait_for_server();
    let (code, body) = socket_http(
        &h.data(),
        "/v1/tasks/api/run",
        r#"{"command": "echo \"got=$API_VAR\"", "env": {"API_VAR": "api-value"}}"#,
    );
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(r#"got=api-value"#), "{body}");
    for bad in [
        r#"{"command": "true", "env": {"TASKBOX_SANDBOX": "sk-test-Zq9xRefused"}}"#,
        r#"{"command": "true", "env": {"NOT-A-NAME": "sk-test-Zq9xRefused"}}"#,
        r#"{"command": "true", "env": {"NUL": "sk-test-Zq9xRefused\u0000"}}"#,
    ] {
        let (code, body) = socket_http(&h.data(), "/v1/tasks/api/run", bad);
        assert_eq!(code, 400, "{bad}: {body}");
        let v: Value = serde_json::from_str(&body).expect("a JSON error");
        assert_eq!(v["code"], "bad_request", "{v}");
        assert!(!body.contains("Zq9x"), "the value is echoed: {body}");
    }
    let shown = ok(&h.home.run(&["show", "api", "--json"]));
    assert!(!shown.contains("api-value"), "{shown}");
    ok(&h.home.run(&["serve", "--stop"]));
}
