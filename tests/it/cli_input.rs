//! The CLI's answers to bad input and its machine-readable output (issue 12, items 9 and 15):
//! taskbox's own failures, usage errors included, exit 125 with a JSON error object under
//! `--json`; config values are bounded whatever their source.

use serde_json::Value;

use crate::support::{ok, stderr, stdout, Home};

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Usage errors exit 125 (not clap's 2, which a command's own exit 2 would be mistaken for);
/// `--help` and `--version` still exit 0; under `--json` a failure is an error object on stdout.
#[test]
fn usage_errors_exit_125_and_json_failures_are_error_objects() {
    let home = Home::new();
    let o = home.run(&["run", "-t", "u", "--timeout", "abc", "--", "true"]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    assert!(stderr(&o).contains("--timeout"), "{}", stderr(&o));
    let o = home.run(&["run", "-t", "u"]);
    assert_eq!(
        o.status.code(),
        Some(125),
        "a missing command: {}",
        stderr(&o)
    );
    let o = home.run(&["no-such-subcommand"]);
    assert_eq!(o.status.code(), Some(125));
    for args in [&["--help"][..], &["--version"], &["run", "--help"]] {
        let o = home.run(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}");
        assert!(!stdout(&o).is_empty(), "{args:?} prints");
    }

    // --json: usage errors and taskbox's own failures print {code, message, hint} on stdout.
    let o = home.run(&["run", "-t", "u", "--json", "--timeout", "abc", "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    let e = json(&stdout(&o));
    assert_eq!(e["code"], "usage");
    assert!(
        e["message"].as_str().is_some_and(|m| m.contains("abc")),
        "{e}"
    );
    assert!(e["hint"].is_string(), "{e}");
    let o = home.run(&["show", "nosuch", "--json"]);
    assert_eq!(o.status.code(), Some(125));
    let e = json(&stdout(&o));
    assert_eq!(e["code"], "no_such_task", "{e}");
    assert!(e["hint"].is_string(), "{e}");

    // A command's own exit 2 still passes through as 2.
    let o = home.run(&["run", "-t", "u", "--", "exit 2"]);
    assert_eq!(o.status.code(), Some(2));
}

/// `run --json` names the task; `show --json` writes times as RFC 3339, like `tasks --json`.
#[test]
fn json_output_names_the_task_and_writes_rfc3339_times() {
    let home = Home::new();
    let v = json(&ok(
        &home.run(&["run", "-t", "named", "--json", "--", "true"])
    ));
    assert_eq!(v["task"], "named");
    let show = json(&ok(&home.run(&["show", "named", "--json"])));
    let rfc3339 = |v: &Value| {
        v.as_str()
            .is_some_and(|s| s.len() >= 20 && s.ends_with('Z') && s.as_bytes()[10] == b'T')
    };
    for time in [
        &show["task"]["created_at"],
        &show["task"]["last_activity"],
        &show["task"]["sandbox"]["deadline"],
        &show["sandboxes"][0]["created_at"],
        &show["journal"][0]["at"],
    ] {
        assert!(rfc3339(time), "not RFC 3339: {time} in {show}");
    }
    let tasks = json(&ok(&home.run(&["tasks", "--json"])));
    assert!(rfc3339(&tasks[0]["last_activity"]), "{tasks}");
}

/// A sandbox long past its deadline, with nothing driving its task, is not shown `running`.
#[test]
fn tasks_does_not_call_a_sandbox_past_its_deadline_running() {
    let home = Home::new();
    ok(&home.run(&["run", "-t", "late", "--", "true"]));
    let tasks = ok(&home.run(&["tasks"]));
    assert!(tasks.contains("running"), "{tasks}");
    // The store as a process that died long ago left it: running, deadline in the past (its
    // last transition committed as if the deadline had moved there).
    let mut store = taskbox::store::Store::open(&home.path().join("data").join("taskbox.db"))
        .expect("open the store");
    let mut task = store.load_task("late").expect("load").expect("the task");
    let sandbox = task.sandbox.as_mut().expect("a sandbox");
    sandbox.deadline = 1000;
    let event = taskbox::core::Event::TimeoutExtended {
        sandbox_id: sandbox.id.clone(),
        deadline: 1000,
    };
    store
        .commit(&taskbox::store::TransitionRecord {
            at: task.last_activity,
            event: &event,
            state_before: task.state,
            task_after: &task,
            commands: &[],
        })
        .expect("commit");
    drop(store);
    let o = home.run(&["tasks"]);
    let table = ok(&o);
    let row = table
        .lines()
        .find(|l| l.starts_with("late"))
        .expect("a row");
    assert!(
        !row.contains("running") && row.contains("expired"),
        "{table}"
    );
    assert!(stderr(&o).contains("passed its deadline"), "{}", stderr(&o));
    let v = json(&ok(&home.run(&["tasks", "--json"])));
    assert_eq!(v[0]["state"], "expired", "{v}");
    assert_eq!(v[0]["recorded_state"], "running", "{v}");
    assert_eq!(v[0]["deadline_passed"], true, "{v}");
}

/// One validation for every source, with bounds from the key table: the file, `config set` and
/// flags get the same bounds, and the error names the key, the source, the bound and the fix.
#[test]
fn config_values_are_bounded_whatever_their_source() {
    let home = Home::new();
    // A flag: a timeout that would overflow milliseconds is refused, not wrapped.
    let o = home.run(&[
        "run",
        "-t",
        "b",
        "--timeout",
        "18446744073709552",
        "--",
        "true",
    ]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("terminal.timeout")
            && e.contains("--timeout")
            && e.contains("18000")
            && e.contains("hint:"),
        "{e}"
    );
    let o = home.run(&["run", "-t", "b", "--timeout", "0", "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    // `config set`: above the platform's maximum lifetime.
    let o = home.run(&[
        "config",
        "set",
        "terminal.sandbox_timeout_seconds",
        "9223372036854775",
    ]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("18000"), "{}", stderr(&o));
    // The file: each value `set` refuses is refused there too, naming the file and the fix.
    let config = home.path().join("config.toml");
    for (key, bad) in [
        ("sandbox_timeout_seconds", "0"),
        ("sandbox_timeout_seconds", "9223372036854775"),
        ("keep_snapshots", "0"),
        ("max_concurrent_creates", "0"),
        ("timeout", "18446744073709552"),
    ] {
        std::fs::write(&config, format!("[terminal]\n{key} = {bad}\n")).expect("write");
        let o = home.run(&["run", "-t", "b", "--", "true"]);
        assert_eq!(o.status.code(), Some(125), "{key} = {bad}");
        let e = stderr(&o);
        assert!(
            e.contains(&format!("terminal.{key}"))
                && e.contains("config.toml")
                && e.contains("hint:"),
            "{key} = {bad}: {e}"
        );
        // Nothing was created on the way.
        assert!(
            !home.path().join("data").join("taskbox.db").exists(),
            "{key} = {bad} created a store"
        );
    }
    // `config set` repairs the file the others refuse.
    ok(&home.run(&["config", "set", "terminal.timeout", "60"]));
    ok(&home.run(&["run", "-t", "b", "--", "true"]));
    // The environment: a bad TASKBOX_SERVER names the variable.
    let mut env_home = Home::new();
    env_home.set_env("TASKBOX_SERVER", "sometimes");
    let o = env_home.run(&["run", "-t", "b", "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("TASKBOX_SERVER"), "{}", stderr(&o));
}

/// Only `run` creates a task: `suspend`, `resume` (and `show`, `replay`) on an unknown name
/// fail with 125, a "did you mean" hint, and create nothing — in-process and through a server.
#[test]
fn only_run_creates_a_task_in_process_and_through_the_server() {
    let local = Home::new();
    let served = crate::server::ServerHome::new();
    for home in [&local, &served.home] {
        ok(&home.run(&["run", "-t", "build-api", "--", "true"]));
        for verb in ["suspend", "resume"] {
            let o = home.run(&[verb, "buid-api"]);
            assert_eq!(o.status.code(), Some(125), "{verb}: {}", stderr(&o));
            let e = stderr(&o);
            assert!(
                e.contains("no task named `buid-api`") && e.contains("did you mean `build-api`"),
                "{verb}: {e}"
            );
            let o = home.run(&[verb, "buid-api", "--json"]);
            assert_eq!(o.status.code(), Some(125));
            assert_eq!(json(&stdout(&o))["code"], "no_such_task");
        }
        let o = home.run(&["replay", "buid-api"]);
        assert_eq!(o.status.code(), Some(125));
        assert!(
            stderr(&o).contains("did you mean `build-api`"),
            "{}",
            stderr(&o)
        );
        // Nothing was created.
        let tasks = json(&ok(&home.run(&["tasks", "--json"])));
        let names: Vec<&str> = tasks
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(|t| t["task"].as_str())
            .collect();
        assert_eq!(names, ["build-api"]);
        let o = home.run(&["show", "buid-api"]);
        assert_eq!(o.status.code(), Some(125));
    }
}

/// Every file under the home, as bytes: the store, its WAL, locks, the server's log.
fn every_file(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        let ft = entry.file_type().expect("file type");
        if ft.is_dir() {
            // The sandbox's files and their snapshots are the user's data (the command wrote
            // the secret into tok.txt): the workspaces, a stopped one's files being removed
            // (`trash`), the snapshot manifests and the content store they refer to (`cas`).
            if path.file_name().is_some_and(|n| {
                n == "sandboxes"
                    || n == "workspace"
                    || n == "snapshots"
                    || n == "cas"
                    || n == "trash"
            }) {
                continue;
            }
            every_file(&path, out);
        } else if ft.is_file() {
            out.push((path.clone(), std::fs::read(&path).unwrap_or_default()));
        }
    }
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// A secret typed into a command runs as typed but is journaled redacted: it is in no file of
/// taskbox's (store, WAL, logs), not in `show --json`, and the journal still verifies and
/// re-drives — in-process and through the server. `doctor` does not print a password in the
/// API URL.
#[test]
fn secrets_typed_into_commands_are_journaled_and_shown_redacted() {
    const SECRET: &str = "s3cr3tVALUE2931";
    let local = Home::new();
    let served = crate::server::ServerHome::new();
    for home in [&local, &served.home] {
        let cmd =
            format!("export API_TOKEN={SECRET}; printf %s \"$API_TOKEN\" > tok.txt; cat tok.txt");
        assert_eq!(
            ok(&home.run(&["run", "-t", "sec", "--", &cmd])),
            SECRET,
            "ran as typed"
        );
        let cmd = format!("curl -s -H 'Authorization: Bearer {SECRET}' http://127.0.0.1:9 || true");
        ok(&home.run(&["run", "-t", "sec", "--", &cmd]));
        ok(&home.run(&["suspend", "sec"]));
        assert_eq!(
            ok(&home.run(&["run", "-t", "sec", "--", "cat tok.txt"])),
            SECRET
        );
        let show = ok(&home.run(&["show", "sec", "--json", "--journal", "100"]));
        assert!(
            !show.contains(SECRET),
            "show --json prints the secret: {show}"
        );
        assert!(show.contains("API_TOKEN=[redacted]"), "{show}");
        // The journal replays as recorded.
        ok(&home.run(&["replay", "sec"]));
        ok(&home.run(&["replay", "sec", "--redrive"]));
        // Stop any server so its log and the store's WAL are complete.
        if std::ptr::eq(home, &served.home) {
            ok(&home.run(&["serve", "--stop"]));
        }
        let mut files = Vec::new();
        every_file(home.path(), &mut files);
        assert!(files.iter().any(|(p, _)| p.ends_with("taskbox.db")));
        for (path, bytes) in &files {
            assert!(
                !contains(bytes, SECRET),
                "{} holds the secret in plaintext",
                path.display()
            );
        }
    }

    let home = Home::new();
    ok(&home.run(&["config", "set", "terminal.backend", "vercel_sandbox"]));
    ok(&home.run(&[
        "config",
        "set",
        "terminal.vercel_api_url",
        "http://me:hunter2pw@127.0.0.1:9",
    ]));
    for args in [&["doctor"][..], &["doctor", "--json"]] {
        let o = home.run(args);
        let all = format!("{}{}", stdout(&o), stderr(&o));
        assert!(all.contains("127.0.0.1:9"), "doctor names the URL: {all}");
        assert!(
            !all.contains("hunter2pw"),
            "doctor prints the password: {all}"
        );
    }
}

fn files_under(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.flatten().count())
}

/// `taskbox rm`: stops the sandbox, deletes the snapshots (unless kept, and then gc keeps them
/// too), keeps the journal for replay, and the name is refused afterwards — in-process and
/// through the server.
#[test]
fn rm_removes_a_task_and_keeps_its_journal() {
    let local = Home::new();
    let served = crate::server::ServerHome::new();
    for home in [&local, &served.home] {
        let snapshots = |task: &str| {
            files_under(
                &home
                    .path()
                    .join("data")
                    .join("local")
                    .join("snapshots")
                    .join(task),
            )
        };
        for task in ["gone", "kept"] {
            ok(&home.run(&["run", "-t", task, "--", "echo x > f"]));
            ok(&home.run(&["suspend", task]));
            ok(&home.run(&["run", "-t", task, "--", "echo y > g"]));
            assert_eq!(snapshots(task), 1, "{task} has its snapshot");
        }
        let o = home.run(&["rm", "gone", "--json"]);
        let v = json(&ok(&o));
        assert_eq!(v["task"], "gone");
        assert!(v["sandbox_stopped"].is_string(), "{v}");
        assert_eq!(
            v["snapshots_deleted"].as_array().map(Vec::len),
            Some(1),
            "{v}"
        );
        assert_eq!(snapshots("gone"), 0, "the snapshot is deleted");
        let o = home.run(&["rm", "kept", "--keep-snapshots"]);
        ok(&o);
        assert!(stderr(&o).contains("kept snapshots"), "{}", stderr(&o));
        assert_eq!(snapshots("kept"), 1);
        // Nothing of theirs is live; gc leaves the kept snapshot alone.
        let gc = json(&ok(&home.run(&["gc", "--json"])));
        assert_eq!(
            gc["sandboxes_stopped"].as_array().map(Vec::len),
            Some(0),
            "{gc}"
        );
        assert_eq!(
            gc["snapshots_deleted"].as_array().map(Vec::len),
            Some(0),
            "{gc}"
        );
        assert_eq!(snapshots("kept"), 1);
        // The journal is kept and still verifies.
        ok(&home.run(&["replay", "gone"]));
        let show = json(&ok(&home.run(&["show", "gone", "--json"])));
        assert!(show["marks"]["removed_at"].is_string(), "{show}");
        assert_eq!(show["marks"]["backend"], "local", "{show}");
        // The name is refused from now on, with the reason.
        for args in [
            &["run", "-t", "gone", "--", "true"][..],
            &["resume", "gone"],
            &["rm", "gone"],
        ] {
            let o = home.run(args);
            assert_eq!(o.status.code(), Some(125), "{args:?}");
            assert!(
                stderr(&o).contains("was removed"),
                "{args:?}: {}",
                stderr(&o)
            );
        }
        let tasks = json(&ok(&home.run(&["tasks", "--json"])));
        assert!(
            tasks
                .as_array()
                .expect("list")
                .iter()
                .all(|t| t["state"] == "removed"),
            "{tasks}"
        );
        let o = home.run(&["rm", "nosuch", "--json"]);
        assert_eq!(o.status.code(), Some(125));
        assert_eq!(json(&stdout(&o))["code"], "no_such_task");
    }
}

/// A task remembers its backend: under another one, every command for it fails naming both
/// and the way out, instead of sending a local snapshot id to Vercel (or the reverse).
#[test]
fn a_task_is_refused_under_another_backend() {
    let mut home = Home::new();
    for (k, v) in [
        ("VERCEL_TOKEN", "tok"),
        ("VERCEL_TEAM_ID", "team_t"),
        ("VERCEL_PROJECT_ID", "prj_t"),
    ] {
        home.set_env(k, v);
    }
    let fake = crate::vercel_engine::spawn_fake(&home);
    ok(&home.run(&["run", "-t", "loc", "--", "echo l > f"]));
    ok(&home.run(&["suspend", "loc"]));
    ok(&home.run(&["config", "set", "terminal.backend", "vercel_sandbox"]));
    ok(&home.run(&["config", "set", "terminal.container_memory", "2048"]));
    ok(&home.run(&["config", "set", "terminal.vercel_api_url", &fake.url]));
    for args in [
        &["run", "-t", "loc", "--", "cat f"][..],
        &["resume", "loc"],
        &["suspend", "loc"],
        &["rm", "loc"],
    ] {
        let o = home.run(args);
        assert_eq!(o.status.code(), Some(125), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains("belongs to the local backend")
                && e.contains("vercel_sandbox")
                && e.contains("taskbox config set terminal.backend local"),
            "{args:?}: {e}"
        );
    }
    let o = home.run(&["run", "-t", "loc", "--json", "--", "cat f"]);
    assert_eq!(json(&stdout(&o))["code"], "wrong_backend");
    ok(&home.run(&["run", "-t", "ver", "--", "echo v > g"]));
    ok(&home.run(&["suspend", "ver"]));
    ok(&home.run(&["config", "set", "terminal.backend", "local"]));
    let o = home.run(&["run", "-t", "ver", "--", "cat g"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        stderr(&o).contains("belongs to the vercel_sandbox backend"),
        "{}",
        stderr(&o)
    );
    // Back where they belong, both work.
    assert_eq!(ok(&home.run(&["run", "-t", "loc", "--", "cat f"])), "l\n");
    ok(&home.run(&["config", "set", "terminal.backend", "vercel_sandbox"]));
    assert_eq!(ok(&home.run(&["run", "-t", "ver", "--", "cat g"])), "v\n");
}

/// A journal written before commands were journaled redacted (a plaintext secret in a command)
/// still re-drives identically: the engine journals the command redacted, and the re-drive
/// redacts the recording the same way before comparing.
#[test]
fn a_journal_with_a_plaintext_secret_still_redrives() {
    let home = Home::new();
    let golden = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/crash.jsonl"),
    )
    .expect("golden journal");
    // Both a command that ran and one whose interruption the journal quotes.
    let old = golden
        .replace(
            "echo before > f.txt",
            "export API_TOKEN=abcd1234xyz9; echo before > f.txt",
        )
        .replace("sleep 3", "export API_TOKEN=abcd1234xyz9; sleep 3");
    assert_ne!(old, golden);
    let file = home.path().join("old.jsonl");
    std::fs::write(&file, old).expect("write");
    let o = home.run(&[
        "replay",
        "--journal",
        file.to_str().expect("utf-8"),
        "--redrive",
    ]);
    let out = ok(&o);
    assert!(out.contains("re-drive matches"), "{out}{}", stderr(&o));
    assert!(!out.contains("abcd1234xyz9"), "{out}");
}
