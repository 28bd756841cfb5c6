//! The CLI end to end on what a task's files hold (issue 12): snapshots never confused across
//! store lifetimes, symlinks and a stable workspace path (Python virtualenvs survive a
//! restore), and unreadable entries that do not block a snapshot.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::support::{ok, stderr, Home};

/// Removes `taskbox.db` and its WAL files, as the issue did ("remove `taskbox.db*`").
fn remove_store(home: &Home) {
    let data = home.path().join("data");
    for entry in fs::read_dir(&data).expect("data dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("taskbox.db") {
            fs::remove_file(&path).expect("remove store file");
        }
    }
}

/// Issue 12 item 1, the exact sequence: a stale archive must not replace live work after the
/// store is reset.
#[test]
fn a_store_reset_never_restores_a_stale_archive_over_live_work() {
    let home = Home::new();
    ok(&home.run(&["run", "-t", "p", "--", "echo v1 > old.txt"]));
    ok(&home.run(&["suspend", "p"]));
    remove_store(&home);
    let o = home.run(&["run", "-t", "p", "--", "echo day2 > report.txt"]);
    ok(&o);
    // The new store says, once, that it found archives it did not make.
    assert!(
        stderr(&o).contains("snapshot archives of another installation (tasks: p)"),
        "{}",
        stderr(&o)
    );
    let o = home.run(&["suspend", "p"]);
    ok(&o);
    assert!(
        stderr(&o).contains("files kept in snapshot"),
        "{}",
        stderr(&o)
    );
    let o = home.run(&["run", "-t", "p", "--", "ls"]);
    assert_eq!(ok(&o), "report.txt\n", "{}", stderr(&o));
}

/// Issue 12 items 2 and 3: a virtualenv (absolute symlinks to the system Python, scripts whose
/// shebang is the absolute workspace path) works after a suspend and a restore, and the
/// working directory carried between commands survives the restore.
#[test]
fn a_python_venv_survives_suspend_and_restore() {
    let home = Home::new();
    let o = home.run(&[
        "run",
        "-t",
        "py",
        "--",
        "python3 -m venv .venv && mkdir -p src && cd src",
    ]);
    ok(&o);
    let before = ok(&home.run(&["run", "-t", "py", "--", "pwd"]));
    ok(&home.run(&["suspend", "py"]));
    let o = home.run(&[
        "run",
        "-t",
        "py",
        "--",
        "pwd; ../.venv/bin/python -V; ../.venv/bin/pip --version >/dev/null && echo pip ok",
    ]);
    let out = ok(&o);
    assert!(
        stderr(&o).contains("recreated from snapshot"),
        "{}",
        stderr(&o)
    );
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some(before.trim_end()), "{out}");
    assert!(
        lines.next().is_some_and(|l| l.starts_with("Python 3")),
        "{out}"
    );
    assert_eq!(lines.next(), Some("pip ok"), "{out}");
}

/// Issue 12 item 7, as the issue found it: a non-root user's mode-000 file and mode-300
/// directory do not block the snapshot; it lists them (in the suspend's answer, the task's
/// snapshot record and the journal) and keeps everything else.
#[test]
fn unreadable_entries_are_listed_and_do_not_block_the_snapshot() {
    let home = Home::new();
    let nobody = 65534;
    std::os::unix::fs::chown(home.path(), Some(nobody), Some(nobody)).expect("chown home");
    let taskbox = Path::new(env!("CARGO_BIN_EXE_taskbox"));
    let as_nobody = |args: &[&str]| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(taskbox)
            .args(args);
        for (k, v) in home.cmd().get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c.output().expect("spawn setpriv")
    };
    ok(&as_nobody(&[
        "run",
        "-t",
        "u",
        "--",
        "echo k > keep; echo s > secret; chmod 000 secret; mkdir locked; echo x > locked/f; \
         chmod 300 locked; id -u",
    ]));
    let o = as_nobody(&["suspend", "u"]);
    ok(&o);
    let err = stderr(&o);
    assert!(err.contains("files kept in snapshot"), "{err}");
    assert!(err.contains("secret: cannot read it"), "{err}");
    assert!(
        err.contains("locked: cannot list the contents of it"),
        "{err}"
    );

    let o = as_nobody(&["show", "u", "--json"]);
    let view: Value = serde_json::from_str(&ok(&o)).expect("JSON");
    let omitted = &view["task"]["snapshots"][0]["omitted"];
    assert_eq!(omitted.as_array().map(Vec::len), Some(2), "{view}");
    let journaled = view["journal"]
        .as_array()
        .expect("journal")
        .iter()
        .any(|e| e.to_string().contains("\"omitted\""));
    assert!(journaled, "the journal records what was left out: {view}");
    let shown = ok(&as_nobody(&["show", "u"]));
    assert!(
        shown.contains("left out: secret: cannot read it"),
        "{shown}"
    );
    // And that journal replays through the core.
    ok(&as_nobody(&["replay", "--all"]));

    // Everything else is back; the unreadable file is not (the directory is, without what it
    // held).
    let o = as_nobody(&["run", "-t", "u", "--", "cat keep; ls"]);
    assert_eq!(ok(&o), "k\nkeep\nlocked\n", "{}", stderr(&o));
    // The stored tree is the user's: make it removable for the temp dir's cleanup.
    let _ = fs::set_permissions(home.path(), fs::Permissions::from_mode(0o755));
}

/// Issue 12 item 1, the offer: `doctor` lists the archives of a removed store, and adopts them
/// for tasks the new store does not know (or ignores them), never over a task it has.
#[test]
fn doctor_lists_adopts_and_ignores_the_archives_of_a_removed_store() {
    let home = Home::new();
    ok(&home.run(&["run", "-t", "p", "--", "echo old-p > p.txt"]));
    ok(&home.run(&["suspend", "p"]));
    ok(&home.run(&["run", "-t", "q", "--", "echo old-q > q.txt"]));
    ok(&home.run(&["suspend", "q"]));
    let archives = |task: &str| -> Vec<String> {
        let mut names: Vec<String> =
            fs::read_dir(home.path().join("data/local/snapshots").join(task))
                .map(|it| {
                    it.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
        names.sort();
        names
    };
    let (old_p, old_q) = (archives("p"), archives("q"));
    assert_eq!((old_p.len(), old_q.len()), (1, 1));
    remove_store(&home);
    ok(&home.run(&["run", "-t", "p", "--", "echo new-p > p.txt"]));
    // The note is printed once only.
    let o = home.run(&["run", "-t", "p", "--", "true"]);
    assert!(
        !stderr(&o).contains("another installation"),
        "{}",
        stderr(&o)
    );

    let doctor = |args: &[&str]| -> Value {
        let mut all = vec!["doctor", "--json"];
        all.extend_from_slice(args);
        let o = home.run(&all);
        let v: Value = serde_json::from_str(&crate::support::stdout(&o)).expect("JSON");
        v["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["name"] == "archives")
            .cloned()
            .expect("an archives line")
    };
    let line = doctor(&[]);
    let detail = line["detail"].as_str().unwrap();
    assert!(
        detail.contains("p (1 archive(s)") && detail.contains("q (1 archive(s)"),
        "{line}"
    );
    assert!(
        line["hint"].as_str().unwrap().contains("--adopt-archives"),
        "{line}"
    );

    let line = doctor(&["--adopt-archives"]);
    let detail = line["detail"].as_str().unwrap();
    assert!(detail.contains("adopted: q from q.s1."), "{line}");
    assert!(detail.contains("already has these tasks: p"), "{line}");
    // q starts from its archive; p keeps the new store's files.
    let o = home.run(&["run", "-t", "q", "--", "cat q.txt"]);
    assert_eq!(ok(&o), "old-q\n", "{}", stderr(&o));
    assert_eq!(
        ok(&home.run(&["run", "-t", "p", "--", "cat p.txt"])),
        "new-p\n"
    );
    // Adopted once: q's next sandbox after a suspend is its own latest snapshot.
    ok(&home.run(&["run", "-t", "q", "--", "echo more >> q.txt"]));
    ok(&home.run(&["suspend", "q"]));
    assert_eq!(
        ok(&home.run(&["run", "-t", "q", "--", "cat q.txt"])),
        "old-q\nmore\n"
    );

    let line = doctor(&["--ignore-archives"]);
    assert!(
        line["detail"].as_str().unwrap().contains("ignoring"),
        "{line}"
    );
    let line = doctor(&[]);
    assert!(
        line["detail"]
            .as_str()
            .unwrap()
            .starts_with("no snapshot archives"),
        "{line}"
    );
    // Ignored or adopted, never deleted: every archive of the old store is still on disk.
    assert!(archives("p").contains(&old_p[0]));
    assert!(archives("q").contains(&old_q[0]));
}

/// `taskbox export-snapshot TASK [SNAP]` writes a plain zstd-compressed tarball of a snapshot
/// (the latest by default, or the one named), symlinks verbatim, holes as zeros; an unknown
/// snapshot is a clear error naming the ones there are.
#[test]
fn export_snapshot_writes_a_plain_tarball() {
    let home = Home::new();
    ok(&home.run(&[
        "run",
        "-t",
        "ex",
        "--",
        "mkdir d; echo one > d/f; ln -s /etc/passwd out; ln d/f hard; truncate -s 3M sparse",
    ]));
    ok(&home.run(&["suspend", "ex"]));
    ok(&home.run(&["run", "-t", "ex", "--", "echo two > d/f"]));
    ok(&home.run(&["suspend", "ex"]));
    let read = |args: &[&str]| -> Vec<(String, tar::EntryType, Vec<u8>, Option<String>)> {
        let out = home.run(args);
        assert!(out.status.success(), "{}", stderr(&out));
        let tar = zstd::decode_all(out.stdout.as_slice()).expect("a zstd stream");
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut entries = Vec::new();
        for e in archive.entries().unwrap() {
            let mut e = e.unwrap();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            let link = e
                .link_name()
                .unwrap()
                .map(|l| l.to_string_lossy().to_string());
            entries.push((
                e.path().unwrap().to_string_lossy().to_string(),
                e.header().entry_type(),
                data,
                link,
            ));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries
    };
    let latest = read(&["export-snapshot", "ex"]);
    let names: Vec<&str> = latest.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names, ["d", "d/f", "hard", "out", "sparse"]);
    let by = |name: &str| latest.iter().find(|e| e.0 == name).unwrap().clone();
    // `d` sorts first, so `d/f`'s inode was met first through `hard`: one of the two is a link.
    let (f, hard) = (by("d/f"), by("hard"));
    assert!(f.2 == b"two\n" || hard.2 == b"two\n", "{f:?} {hard:?}");
    assert_eq!(by("out").3.as_deref(), Some("/etc/passwd"));
    assert_eq!(by("sparse").2, vec![0u8; 3 << 20]);
    let first = read(&["export-snapshot", "ex", "1"]);
    let f1 = first
        .iter()
        .find(|e| e.0 == "d/f" || e.0 == "hard")
        .unwrap();
    assert!(
        first.iter().any(|e| e.2 == b"one\n"),
        "snapshot 1 holds the first contents: {f1:?}"
    );
    let out = home.run(&["export-snapshot", "ex", "7"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr(&out).contains("no complete snapshot `7`") && stderr(&out).contains("ex.s2"),
        "{}",
        stderr(&out)
    );
}

/// `terminal.server = never` (issue 32, item 18): nothing runs between commands, so a sandbox's
/// deadline passes unwatched. What happens, as docs/running.md says: unisolated, a background
/// process the command left runs on past the deadline, writing, until the task is next used;
/// isolated, it ended with the CLI that started it. Either way the next command finds the
/// workspace past its deadline, keeps its files in a late checkpoint — writes made after the
/// deadline included — and restores from it, and nothing of the old sandbox runs any more.
#[test]
fn never_mode_keeps_files_written_past_an_unwatched_deadline_in_a_late_checkpoint() {
    for mode in crate::support::isolation_modes(
        "never_mode_keeps_files_written_past_an_unwatched_deadline_in_a_late_checkpoint",
    ) {
        let home = Home::new();
        ok(&home.run(&["config", "set", "terminal.local_isolation", mode]));
        ok(&home.run(&["config", "set", "terminal.sandbox_timeout_seconds", "3"]));
        ok(&home.run(&[
            "run",
            "-t",
            "b",
            "--",
            "echo first > f; (while :; do echo x >> bg; sleep 0.1; done) >/dev/null 2>&1 &",
        ]));
        let bg = home.path().join("data/local/tasks/b/workspace/bg");
        let lines = || fs::read(&bg).map_or(0, |b| b.len() / 2);
        let passed = crate::support::wait_for(std::time::Duration::from_secs(60), || {
            let o = home.run(&["tasks", "--json"]);
            let v: Value = serde_json::from_str(&ok(&o)).ok()?;
            (v[0]["deadline_passed"] == true).then_some(())
        });
        assert!(passed.is_some(), "{mode}: the deadline never passed");
        let at_deadline = lines();
        assert!(at_deadline > 0, "{mode}: the background loop never wrote");
        if mode == "none" {
            let grew = crate::support::wait_for(std::time::Duration::from_secs(20), || {
                (lines() > at_deadline).then_some(())
            });
            assert!(
                grew.is_some(),
                "{mode}: the background process runs on past the deadline"
            );
        } else {
            std::thread::sleep(std::time::Duration::from_millis(500));
            assert_eq!(
                lines(),
                at_deadline,
                "{mode}: the background process ended with its CLI"
            );
        }
        let before = lines();
        let o = home.run(&["run", "-t", "b", "--", "wc -l < bg; cat f"]);
        let out = ok(&o);
        assert!(
            stderr(&o).contains("late checkpoint"),
            "{mode}: {}",
            stderr(&o)
        );
        let (count, rest) = out.split_once('\n').expect("two lines");
        let count: usize = count.trim().parse().expect("a count");
        assert!(
            count >= before,
            "{mode}: the writes past the deadline are kept: {out}"
        );
        assert_eq!(rest, "first\n", "{mode}");
        // The late checkpoint stopped the old sandbox: nothing writes any more.
        let settled = lines();
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert_eq!(
            lines(),
            settled,
            "{mode}: the old sandbox's process still runs"
        );
    }
}
