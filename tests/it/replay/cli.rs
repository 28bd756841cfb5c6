//! The `replay` and `export` commands: a divergent journal exits 1 and names the entry, export
//! then replay round-trips without secrets, and what they cannot do is refused.

use serde_json::Value;

use taskbox::core::Event;
use taskbox::replay::export;
use taskbox::store::Store;

use crate::support::{ok, stderr, stdout, Home};

use super::{golden, golden_dir, write_file};

#[test]
fn a_divergent_journal_exits_1_and_names_the_entry() {
    let home = Home::new();
    let mut entries = golden("session").entries;
    let k = entries
        .iter()
        .position(|e| matches!(e.event, Event::SnapshotTaken { .. }))
        .expect("a snapshot");
    let mut recorded = String::new();
    if let Event::SnapshotTaken { snapshot_id, .. } = &mut entries[k].event {
        // Archives are named `<task>.s<seq>.<nonce>`: the recorded id is read, not assumed.
        recorded = snapshot_id.to_string();
        *snapshot_id = "demo.s9".into();
    }
    assert!(recorded.starts_with("demo.s1."), "{recorded}");
    let seq = entries[k].task_seq;
    let path = write_file(home.path(), "edited.jsonl", &entries);
    let file = path.to_str().expect("utf-8");

    let o = home.run(&["replay", "--journal", file]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains(&format!("DIVERGED at entry #{seq} of 16")),
        "{out}"
    );
    assert!(out.contains("snapshot_taken"), "{out}");
    assert!(
        out.contains(&format!(r#"recorded "{recorded}", recomputed "demo.s9""#)),
        "{out}"
    );

    let o = home.run(&["replay", "--journal", file, "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert_eq!(v["clean"], false);
    let d = &v["verdict"]["tasks"][0]["divergence"];
    assert_eq!(d["task_seq"], seq);
    assert_eq!(d["kind"], "transition");

    // --redrive does not re-drive a journal the core already rejects, and says so.
    let o = home.run(&["replay", "--journal", file, "--redrive"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("not re-driven"), "{}", stdout(&o));
}

#[test]
fn export_then_replay_round_trips_without_secrets() {
    let home = Home::new();
    let token = "ghp_0123456789abcdefghijABCDEFGHIJ012345";
    let bearer = "tok3nV4lue123xyz";
    ok(&home.run(&["run", "-t", "rt", "--", "echo one > f.txt"]));
    ok(&home.run(&[
        "run",
        "-t",
        "rt",
        "--",
        &format!("export GITHUB_TOKEN={token}; cat f.txt"),
    ]));
    ok(&home.run(&["suspend", "rt"]));
    ok(&home.run(&[
        "run",
        "-t",
        "rt",
        "--",
        &format!("echo 'Authorization: Bearer {bearer}' > /dev/null; cat f.txt"),
    ]));
    ok(&home.run(&["run", "-t", "other", "--", "true"]));

    let file = home.path().join("rt.jsonl");
    let o = home.run(&["export", "rt", "--out", file.to_str().expect("utf-8")]);
    ok(&o);
    // The engine journaled the commands redacted already (export's redaction finds nothing
    // left); what is asserted is that no secret is in the file.
    let text = std::fs::read_to_string(&file).expect("exported");
    assert!(
        !text.contains(token) && !text.contains(bearer),
        "a secret leaked: {text}"
    );
    assert!(text.contains("[redacted]"));
    for forbidden in [
        "TASKBOX_HOME",
        "PATH=",
        home.path().to_str().expect("utf-8"),
    ] {
        assert!(!text.contains(forbidden), "{forbidden} in the export");
    }

    let exported = export::read_journal(std::io::BufReader::new(
        std::fs::File::open(&file).expect("open"),
    ))
    .expect("reads back");
    let h = &exported.header;
    assert_eq!((h.format.as_str(), h.version), ("taskbox-journal", 3));
    assert_eq!(h.taskbox_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(h.tasks, vec!["rt".to_string()]);
    assert!(!h.installation_id.is_empty() && h.exported_at.ends_with('Z'));

    // The same entries as the store holds: the engine journaled the commands redacted.
    let store = Store::open(&home.path().join("data/taskbox.db")).expect("store");
    assert_eq!(h.installation_id, store.installation_id());
    let stored = store.journal("rt").expect("journal");
    assert_eq!(exported.entries.len(), stored.len());
    for (a, b) in exported.entries.iter().zip(&stored) {
        let (a, b) = (
            serde_json::to_string(a).expect("json"),
            serde_json::to_string(b).expect("json"),
        );
        assert!(
            !b.contains(token) && !b.contains(bearer),
            "the store holds a secret"
        );
        assert_eq!(a, b);
    }

    // The redacted export replays and re-drives cleanly, as does the store itself.
    let o = home.run(&[
        "replay",
        "--journal",
        file.to_str().expect("utf-8"),
        "--redrive",
    ]);
    let out = ok(&o);
    assert!(out.contains("rt: replays cleanly"), "{out}");
    assert!(out.contains("rt: re-drive matches"), "{out}");
    let out = ok(&home.run(&["replay", "rt", "--json", "--redrive"]));
    assert!(
        !out.contains(token) && !out.contains(bearer),
        "a secret reached the JSON output"
    );
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["clean"], true);
    assert_eq!(v["redrive"][0]["divergence"], Value::Null);

    // Every task: exported together, replayed together.
    let all = home.path().join("all.jsonl");
    ok(&home.run(&["export", "--all", "--out", all.to_str().expect("utf-8")]));
    let out = ok(&home.run(&["replay", "--journal", all.to_str().expect("utf-8")]));
    assert!(
        out.contains("rt: replays cleanly") && out.contains("other: replays cleanly"),
        "{out}"
    );
    assert!(out.contains("2 tasks: all replay cleanly"), "{out}");
    let out = ok(&home.run(&["replay", "--journal", all.to_str().expect("utf-8"), "other"]));
    assert!(!out.contains("rt:"), "{out}");
    let out = ok(&home.run(&["replay", "--all"]));
    assert!(out.contains("2 tasks: all replay cleanly"), "{out}");

    // The timeline table shows the restore, and no secret.
    let out = ok(&home.run(&["replay", "rt", "--timeline"]));
    assert!(
        out.contains("restoring → running") && out.contains("snapshot_taken"),
        "{out}"
    );
    assert!(!out.contains(token));
}

#[test]
fn replay_and_export_refuse_what_they_cannot_do() {
    let home = Home::new();
    let o = home.run(&["replay", "demo"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("no taskbox data"), "{}", stderr(&o));
    ok(&home.run(&["run", "-t", "demo", "--", "true"]));
    for (args, says) in [
        (vec!["replay", "nosuch"], "no task named `nosuch`"),
        (vec!["replay"], "which task?"),
        (vec!["export"], "which task?"),
        (
            vec!["replay", "demo", "--out", "x.svg"],
            "--out writes a timeline",
        ),
        (vec!["replay", "bad/id"], "task id"),
    ] {
        let o = home.run(&args);
        assert_eq!(o.status.code(), Some(125), "{args:?}");
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    let o = home.run(&["replay", "--journal", "/nonexistent/j.jsonl"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        stderr(&o).contains("cannot open /nonexistent/j.jsonl"),
        "{}",
        stderr(&o)
    );
    let file = golden_dir().join("session.jsonl");
    let o = home.run(&[
        "replay",
        "--journal",
        file.to_str().expect("utf-8"),
        "ghost",
    ]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("it holds: demo"), "{}", stderr(&o));
}
