//! Replay: golden journals recorded from real runs replay and re-drive cleanly; hand-edited
//! journals are caught at the right entry; export → replay round-trips without secrets; broken
//! files are clear errors naming the line; the timeline picture is well-formed and marks what
//! happened.

use std::path::{Path, PathBuf};

use serde_json::Value;

use taskbox::core::{step, Event, Task, TaskState, Transition};
use taskbox::replay::export::{self, ExportError, JournalFile};
use taskbox::replay::redrive;
use taskbox::replay::{timeline, verify, DivergenceKind};
use taskbox::store::{JournalEntry, Store};

use crate::support::{ok, stderr, stdout, Home};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn golden(name: &str) -> JournalFile {
    let path = golden_dir().join(format!("{name}.jsonl"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    export::read_journal(std::io::BufReader::new(file))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn golden_text(name: &str) -> String {
    std::fs::read_to_string(golden_dir().join(format!("{name}.jsonl"))).expect("golden file")
}

/// Writes entries as an exported journal into `dir`.
fn write_file(dir: &Path, name: &str, entries: &[JournalEntry]) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).expect("create");
    export::write_journal(&mut f, entries, "test-installation", 1_700_000_000_000).expect("write");
    path
}

/// Rebuilds every recorded transition from the events and their times alone (what a consistent
/// journal with these events would say), renumbering the entries.
fn refold(mut entries: Vec<JournalEntry>) -> Vec<JournalEntry> {
    let mut task: Option<Task> = None;
    for (i, e) in entries.iter_mut().enumerate() {
        e.task_seq = i as u64 + 1;
        e.seq = i as u64 + 1;
        let (before, tr) = match &task {
            None => {
                let Event::SettingsChanged { settings } = &e.event else {
                    panic!("a journal starts with settings_changed");
                };
                let next = Task::new(e.task_id.clone(), settings.clone(), e.at);
                (
                    TaskState::Idle,
                    Transition {
                        next,
                        commands: Vec::new(),
                    },
                )
            }
            Some(t) => (
                t.state,
                step(t, e.event.clone(), e.at).expect("step accepts the event"),
            ),
        };
        e.state_before = before;
        e.state_after = tr.next.state;
        e.commands = tr.commands;
        e.task_after = tr.next.clone();
        task = Some(tr.next);
    }
    entries
}

/// A small XML well-formedness check: tags balance, attributes are quoted, `&` starts an entity.
fn assert_well_formed(xml: &str) {
    fn check_text(t: &str) {
        let mut rest = t;
        while let Some(p) = rest.find('&') {
            let ent = &rest[p..];
            let ok = ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"]
                .iter()
                .any(|e| ent.starts_with(e));
            assert!(ok, "bare `&` in text: {}", &ent[..ent.len().min(30)]);
            rest = &ent[1..];
        }
    }
    let mut stack: Vec<String> = Vec::new();
    let mut rest = xml;
    while let Some(lt) = rest.find('<') {
        check_text(&rest[..lt]);
        let after = &rest[lt..];
        if after.starts_with("<!--") {
            let end = after.find("-->").expect("comment closes");
            rest = &after[end + 3..];
            continue;
        }
        // Find the `>` that closes the tag, outside quoted attribute values.
        let mut quote = None;
        let mut gt = None;
        for (i, c) in after.char_indices().skip(1) {
            match (quote, c) {
                (None, '"' | '\'') => quote = Some(c),
                (Some(q), c) if c == q => quote = None,
                (None, '<') => panic!("`<` inside a tag: {}", &after[..i.min(80)]),
                (None, '>') => {
                    gt = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let gt = gt.expect("tag closes");
        let tag = &after[1..gt];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                stack.pop().as_deref(),
                Some(name.trim()),
                "closing tag matches"
            );
        } else {
            let name: String = tag
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '/')
                .collect();
            assert!(!name.is_empty(), "tag has a name: <{tag}>");
            if !tag.ends_with('/') {
                stack.push(name);
            }
        }
        rest = &after[gt + 1..];
    }
    check_text(rest);
    assert!(stack.is_empty(), "unclosed tags: {stack:?}");
}

const GOLDENS: [&str; 8] = [
    "session", "expiry", "deadline", "extend", "gone", "crash", "several", "vercel",
];

#[test]
fn golden_journals_replay_cleanly_and_redrive_identically() {
    let on_disk = std::fs::read_dir(golden_dir())
        .expect("golden dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
        })
        .count();
    assert_eq!(
        on_disk,
        GOLDENS.len(),
        "every golden journal is listed here"
    );
    for name in GOLDENS {
        let file = golden(name);
        assert_eq!(file.header.format, "taskbox-journal");
        let verdict = verify(&file.entries);
        assert!(
            verdict.is_clean(),
            "{name}: {:?}",
            verdict.divergences().next()
        );
        assert_eq!(verdict.tasks.len(), file.header.tasks.len(), "{name}");
        let reports = redrive::redrive(&file.entries)
            .unwrap_or_else(|e| panic!("{name}: {:#}", anyhow::Error::new(e)));
        for r in &reports {
            assert!(
                r.divergence.is_none(),
                "{name}: {}",
                r.divergence
                    .as_ref()
                    .map_or(String::new(), |d| d.to_string())
            );
            assert!(
                r.calls_expected > 0,
                "{name}: the recording made provider calls"
            );
            assert_eq!(r.calls_made, r.calls_expected, "{name}");
        }
    }
    // The multi-process recordings really do span several engine sessions, and the crash
    // recording has a call that never got its answer.
    let crash = redrive::redrive(&golden("crash").entries).expect("re-drive");
    assert_eq!(crash[0].sessions, 3);
    // The Vercel recording retried a rate-limited create after a jittered delay; the re-drive
    // (without jitter) still makes the same calls.
    let vercel = timeline::build(&golden("vercel").entries);
    assert!(vercel[0]
        .marks
        .iter()
        .any(|m| m.kind == timeline::MarkKind::Retry));
}

#[test]
fn a_changed_event_is_caught_at_its_entry_with_a_field_diff() {
    let mut entries = golden("session").entries;
    let k = entries
        .iter()
        .position(|e| matches!(e.event, Event::CommandExited { .. }))
        .expect("a command exited");
    if let Event::CommandExited { exit_code, .. } = &mut entries[k].event {
        *exit_code = 7;
    }
    let verdict = verify(&entries);
    let d = verdict.divergences().next().expect("diverges").clone();
    assert_eq!(d.task_seq, entries[k].task_seq);
    assert_eq!(d.kind, DivergenceKind::Transition);
    assert_eq!(d.event, "command_exited");
    let field = d
        .diffs
        .iter()
        .find(|f| f.path == "commands[0].reply.exit_code")
        .unwrap_or_else(|| panic!("{d}"));
    assert_eq!(field.recorded, Some(Value::from(0)));
    assert_eq!(field.recomputed, Some(Value::from(7)));
    // The report reads as one short block, not two dumps.
    let text = d.to_string();
    assert!(
        text.contains(&format!("entry #{}", entries[k].task_seq)),
        "{text}"
    );
    assert!(text.lines().count() < 10, "{text}");
    assert_eq!(verdict.tasks[0].replayed, k);
}

#[test]
fn a_removed_entry_is_caught_with_its_sequence_number() {
    let entries = golden("session").entries;
    // Remove an entry that changed the task's state (one that changed nothing but timers
    // cannot be told apart from its absence once the rest is renumbered).
    let idx = entries
        .iter()
        .position(|e| e.task_seq > 3 && e.state_before != e.state_after)
        .expect("a state change after the start");
    let seq = idx as u64 + 1;
    let mut removed = entries.clone();
    removed.remove(idx);
    let d = verify(&removed)
        .divergences()
        .next()
        .expect("diverges")
        .clone();
    assert_eq!((d.task_seq, d.kind), (seq, DivergenceKind::Sequence));
    assert!(
        d.detail.contains(&format!("#{seq} is missing")),
        "{}",
        d.detail
    );

    // Removed and renumbered to hide it: the core notices what is missing.
    let mut hidden = removed;
    for (i, e) in hidden.iter_mut().enumerate() {
        e.task_seq = i as u64 + 1;
    }
    let d = verify(&hidden)
        .divergences()
        .next()
        .expect("diverges")
        .clone();
    assert_eq!(d.task_seq, seq, "{d}");
    assert!(
        matches!(d.kind, DivergenceKind::Transition | DivergenceKind::Refused),
        "{d}"
    );
}

#[test]
fn reordered_entries_are_caught_where_the_order_breaks() {
    let entries = golden("session").entries;
    let mut swapped = entries.clone();
    swapped.swap(6, 7); // entries #7 and #8
    let d = verify(&swapped)
        .divergences()
        .next()
        .expect("diverges")
        .clone();
    assert_eq!((d.task_seq, d.kind), (7, DivergenceKind::Sequence));
    assert!(d.detail.contains("out of order"), "{}", d.detail);

    // The events swapped but the numbering kept: the core sees the wrong event at #7.
    let mut events_swapped = entries;
    let (a, b) = (
        events_swapped[6].event.clone(),
        events_swapped[7].event.clone(),
    );
    events_swapped[6].event = b;
    events_swapped[7].event = a;
    let d = verify(&events_swapped)
        .divergences()
        .next()
        .expect("diverges")
        .clone();
    assert_eq!(d.task_seq, 7, "{d}");
    assert_ne!(d.kind, DivergenceKind::Sequence);
}

#[test]
fn a_journal_that_does_not_start_with_the_creation_is_refused() {
    let mut entries = golden("session").entries;
    entries.remove(0);
    let d = verify(&entries)
        .divergences()
        .next()
        .expect("diverges")
        .clone();
    assert_eq!((d.task_seq, d.kind), (1, DivergenceKind::Sequence));
    let mut renumbered = entries;
    for (i, e) in renumbered.iter_mut().enumerate() {
        e.task_seq = i as u64 + 1;
    }
    let d = verify(&renumbered)
        .divergences()
        .next()
        .expect("diverges")
        .clone();
    assert_eq!((d.task_seq, d.kind), (1, DivergenceKind::Start));
}

#[test]
fn redrive_catches_an_engine_decision_the_recording_lacks() {
    // The `extend` recording: a long command during which the engine's checkpoint timer fired
    // twice and extended the sandbox's timeout. Drop those four entries and rebuild the rest
    // consistently: the pure core is satisfied (the events still make sense), but the engine
    // arms its checkpoint timer and extends the timeout, which this recording never did.
    let entries = golden("extend").entries;
    assert!(matches!(entries[3].event, Event::TimerFired { .. }));
    let edited: Vec<JournalEntry> = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| !(3..=6).contains(i))
        .map(|(_, e)| e.clone())
        .collect();
    let edited = refold(edited);
    assert!(verify(&edited).is_clean());
    // (The refold itself is faithful: it reproduces an untouched recording exactly.)
    assert_eq!(refold(entries.clone()), entries);

    let reports = redrive::redrive(&edited).expect("re-drive runs");
    let d = reports[0].divergence.clone().expect("the re-drive differs");
    assert_eq!(d.kind, DivergenceKind::ProviderCall, "{d}");
    assert!(d.detail.contains("extend_timeout"), "{d}");
    assert_eq!(d.event, "timer_fired", "{d}");
    let call = d.diffs[0].recomputed.clone().expect("the call made");
    assert_eq!(call["call"], "extend_timeout");
}

#[test]
fn broken_files_are_clear_errors_naming_the_line() {
    let text = golden_text("session");
    let lines: Vec<&str> = text.lines().collect();
    let read = |s: String| export::read_journal(std::io::Cursor::new(s.into_bytes()));

    // Cut in the middle of line 5.
    let cut = lines[..4].join("\n") + "\n" + &lines[4][..lines[4].len() / 2];
    assert!(matches!(
        read(cut),
        Err(ExportError::Truncated { line: 5, .. })
    ));

    let mut corrupt = lines.clone();
    corrupt[3] = r#"{"seq":3,,"task_id":"demo"}"#;
    assert!(matches!(
        read(corrupt.join("\n")),
        Err(ExportError::Corrupt { line: 4, .. })
    ));

    let no_header = lines[1..].join("\n");
    match read(no_header) {
        Err(e @ ExportError::MissingHeader { line: 1, .. }) => {
            assert!(e.to_string().contains("journal entry"), "{e}")
        }
        other => panic!("{other:?}"),
    }

    let newer = text.replacen(r#""version":1"#, r#""version":2"#, 1);
    match read(newer) {
        Err(
            e @ ExportError::NewerVersion {
                line: 1, found: 2, ..
            },
        ) => {
            assert!(e.to_string().contains("upgrade taskbox"), "{e}")
        }
        other => panic!("{other:?}"),
    }

    let short = lines[..lines.len() - 1].join("\n");
    assert!(matches!(
        read(short),
        Err(ExportError::Count {
            announced: 15,
            found: 14,
            ..
        })
    ));

    let mut not_entry = lines.clone();
    not_entry[2] = r#"{"hello":"world"}"#;
    assert!(matches!(
        read(not_entry.join("\n")),
        Err(ExportError::Invalid {
            line: 3,
            what: "journal entry",
            ..
        })
    ));

    assert!(matches!(
        read(r#"{"format":"something-else","version":1}"#.into()),
        Err(ExportError::WrongFormat { line: 1, .. })
    ));
    assert!(matches!(read(String::new()), Err(ExportError::Empty)));
    assert!(matches!(read("\n\n".into()), Err(ExportError::Empty)));

    // Through the CLI: exit 125, `error:` naming the file and the line, and a hint.
    let home = Home::new();
    let bad = home.path().join("cut.jsonl");
    std::fs::write(&bad, &text[..text.len() - 40]).expect("write");
    let o = home.run(&["replay", "--journal", bad.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("error:") && err.contains("line 16") && err.contains("truncated"),
        "{err}"
    );
    assert!(err.contains("hint:"), "{err}");
    let newer = home.path().join("newer.jsonl");
    std::fs::write(&newer, text.replacen(r#""version":1"#, r#""version":9"#, 1)).expect("write");
    let o = home.run(&["replay", "--journal", newer.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        stderr(&o).contains("line 1: the journal is format version 9"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_divergent_journal_exits_1_and_names_the_entry() {
    let home = Home::new();
    let mut entries = golden("session").entries;
    let k = entries
        .iter()
        .position(|e| matches!(e.event, Event::SnapshotTaken { .. }))
        .expect("a snapshot");
    if let Event::SnapshotTaken { snapshot_id, .. } = &mut entries[k].event {
        *snapshot_id = "demo.s9".into();
    }
    let seq = entries[k].task_seq;
    let path = write_file(home.path(), "edited.jsonl", &entries);
    let file = path.to_str().expect("utf-8");

    let o = home.run(&["replay", "--journal", file]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains(&format!("DIVERGED at entry #{seq} of 15")),
        "{out}"
    );
    assert!(out.contains("snapshot_taken"), "{out}");
    assert!(
        out.contains(r#"recorded "demo.s1", recomputed "demo.s9""#),
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
    assert!(
        stderr(&o).contains("2 secret values redacted"),
        "{}",
        stderr(&o)
    );
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
    assert_eq!((h.format.as_str(), h.version), ("taskbox-journal", 1));
    assert_eq!(h.taskbox_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(h.tasks, vec!["rt".to_string()]);
    assert!(!h.installation_id.is_empty() && h.exported_at.ends_with('Z'));

    // The same entries as the store holds, but for the redacted strings.
    let store = Store::open(&home.path().join("data/taskbox.db")).expect("store");
    assert_eq!(h.installation_id, store.installation_id());
    let stored = store.journal("rt").expect("journal");
    assert_eq!(exported.entries.len(), stored.len());
    for (a, b) in exported.entries.iter().zip(&stored) {
        let (a, b) = (
            serde_json::to_string(a).expect("json"),
            serde_json::to_string(b).expect("json"),
        );
        assert_eq!(
            a.replace("[redacted]", ""),
            b.replace(token, "").replace(bearer, "")
        );
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

#[test]
fn the_svg_timeline_is_well_formed_and_marks_restores_and_expiries() {
    let file = golden("expiry");
    let tls = timeline::build(&file.entries);
    let svg = timeline::render_svg(&tls);
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_well_formed(&svg);
    assert!(svg.contains(r#"<g class="lane" data-task="expiry">"#));
    for kind in [
        "restore", "expiry", "snapshot", "command", "recovery", "request",
    ] {
        assert!(
            svg.contains(&format!(r#"<g class="mark {kind}" data-kind="{kind}""#)),
            "no {kind} marker"
        );
    }
    for state in [
        "idle",
        "provisioning",
        "running",
        "snapshotting",
        "expired",
        "restoring",
    ] {
        assert!(
            svg.contains(&format!("data-state=\"{state}\"")),
            "no {state} band"
        );
    }
    // The legend names every state and marker.
    assert!(svg.contains(r#"<g class="legend">"#) && svg.contains("sandbox expired"));

    // The restore marker says which snapshot, and that it was the latest complete one.
    let restore = tls[0]
        .marks
        .iter()
        .find(|m| m.kind == timeline::MarkKind::Restore)
        .expect("a restore");
    assert!(
        restore.label.contains("expiry.s1") && restore.label.contains("latest complete"),
        "{}",
        restore.label
    );

    // A recording without faults has no fault marker; one with a vanished snapshot has one.
    assert!(
        !svg.contains(r#"class="mark fault""#),
        "the absorbed late answer is no fault"
    );
    let gone = timeline::render_svg(&timeline::build(&golden("gone").entries));
    assert_well_formed(&gone);
    assert!(gone.contains(r#"class="mark fault""#));

    // Several tasks: one lane each.
    let several = timeline::render_svg(&timeline::build(&golden("several").entries));
    assert_well_formed(&several);
    assert_eq!(several.matches(r#"<g class="lane""#).count(), 2);

    // Through the CLI, to a file and as HTML.
    let home = Home::new();
    let journal = golden_dir().join("expiry.jsonl");
    let out = home.path().join("t.svg");
    let o = home.run(&[
        "replay",
        "--journal",
        journal.to_str().expect("utf-8"),
        "--format",
        "svg",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    ok(&o);
    assert!(
        stderr(&o).contains("replays cleanly"),
        "the verdict goes to stderr"
    );
    assert_eq!(std::fs::read_to_string(&out).expect("svg written"), svg);
    let html = ok(&home.run(&[
        "replay",
        "--journal",
        journal.to_str().expect("utf-8"),
        "--format",
        "html",
    ]));
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    let inner = &html[html.find("<svg").expect("svg")..html.find("</svg>").expect("svg end") + 6];
    assert_well_formed(inner);
    assert!(html.contains("<table>") && html.contains("sandbox_probed: gone"));
}
