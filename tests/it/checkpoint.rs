//! `taskbox checkpoint` and `taskbox rewind` on the local backend, isolated and not: a
//! checkpoint pauses the sandbox's processes for the moment of the snapshot (they run on with
//! the same pid), never catches a half-done write, costs nothing when nothing changed; a
//! rewind restores exactly the snapshot named, keeps the current files first (so it is
//! undone by rewinding to them), and refuses what it cannot restore.

use std::io::Read;
use std::path::Path;

use taskbox::config::Config;
use taskbox::core::{CheckpointOutcome, RewindTo, SnapshotKind, SnapshotStatus};
use taskbox::engine::{EngineError, Orchestrator};
use taskbox::TaskId;

use crate::support::isolation_modes;

fn id(s: &str) -> TaskId {
    TaskId::new(s).expect("task id")
}

async fn open(dir: &Path, mode: &str, keep: u32, keep_checkpoints: u32) -> Orchestrator {
    let mut cfg = Config::default();
    cfg.set("terminal.local_isolation", mode).expect("mode");
    cfg.terminal.keep_snapshots = keep;
    cfg.terminal.keep_checkpoints = keep_checkpoints;
    Orchestrator::builder(dir.to_path_buf(), cfg)
        .reconcile_on_start(false)
        .open()
        .await
        .expect("open")
}

/// The files of local snapshot `snapshot_id` (data dir `dir`), by path, read through
/// `export_snapshot` (the tarball `taskbox export-snapshot` writes).
fn snapshot_files(dir: &Path, snapshot_id: &str) -> std::collections::BTreeMap<String, String> {
    let tarball =
        taskbox::provider::local::export_snapshot(&dir.join("local"), snapshot_id, Vec::new())
            .expect("export");
    let decoder = zstd::Decoder::new(&tarball[..]).expect("zstd");
    let mut archive = tar::Archive::new(decoder);
    let mut files = std::collections::BTreeMap::new();
    for entry in archive.entries().expect("entries") {
        let mut entry = entry.expect("entry");
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path().expect("path").to_string_lossy().into_owned();
        let mut text = String::new();
        entry.read_to_string(&mut text).expect("read");
        files.insert(path.trim_start_matches("./").to_string(), text);
    }
    files
}

fn number(files: &std::collections::BTreeMap<String, String>, name: &str, snap: &str) -> u64 {
    let text = files
        .get(name)
        .unwrap_or_else(|| panic!("{snap}: no file {name} in {files:?}"));
    text.trim_end_matches('\n')
        .parse()
        .unwrap_or_else(|_| panic!("{snap}: {name} holds a torn write: {text:?}"))
}

/// A process writes a counter to two files, `a` then `b`, each as a whole number put in place
/// by a rename, as fast as it can: at every instant `a` is `b` or `b + 1`. Fifty checkpoints
/// of it: each holds complete numbers in that relation (a snapshot not taken at one instant —
/// `a` read, then `b` read later — would find `b` ahead of `a`), the counters never go back,
/// and afterwards the same process runs on, still counting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_checkpoints_of_a_process_writing_keep_it_running_and_never_catch_a_half_write() {
    for mode in isolation_modes("fifty_checkpoints") {
        let dir = tempfile::tempdir().expect("temp dir");
        let orch = open(dir.path(), mode, 2, 60).await;
        let t = id("counter");
        let started = orch
            .run(
                &t,
                "(n=0; while :; do n=$((n+1)); echo $n > a.tmp; mv a.tmp a; echo $n > b.tmp; \
                 mv b.tmp b; done) > /dev/null 2>&1 & echo $!",
                None,
            )
            .await
            .expect("start the writer");
        let pid = started.stdout.trim().to_string();
        assert!(!pid.is_empty(), "{mode}: {started:?}");
        let mut last = 0;
        let mut made = 0;
        let mut taken = Vec::new();
        for i in 0..50 {
            let res = orch.checkpoint(&t).await.expect("checkpoint");
            let snap = res.snapshot_id.expect("a snapshot").to_string();
            match res.outcome {
                CheckpointOutcome::Taken => made += 1,
                // The writer did not get to run since the last one (a loaded machine): the
                // latest snapshot holds the files still.
                CheckpointOutcome::Unchanged => continue,
                other => panic!("{mode}: checkpoint {i}: {other:?}"),
            }
            let files = snapshot_files(dir.path(), &snap);
            if !files.contains_key("a") {
                // The writer had not put its first number in place yet.
                assert!(!files.contains_key("b"), "{mode}: {snap}: {files:?}");
                continue;
            }
            // `b` comes second: before its first rename there is none (the count 0).
            let a = number(&files, "a", &snap);
            let b = match files.contains_key("b") {
                true => number(&files, "b", &snap),
                false => 0,
            };
            assert!(
                a == b || a == b + 1,
                "{mode}: {snap} is not one instant: a = {a}, b = {b}"
            );
            assert!(b >= last, "{mode}: {snap}: b went back from {last} to {b}");
            last = b;
            taken.push(snap);
        }
        assert!(last > 0, "{mode}: the writer never counted: {taken:?}");
        // The same process, still counting.
        let after = orch
            .run(
                &t,
                &format!(
                    "kill -0 {pid} && echo alive; x=$(cat b); sleep 0.2; y=$(cat b); \
                     [ \"$y\" -gt \"$x\" ] && echo counting; kill {pid}"
                ),
                None,
            )
            .await
            .expect("look at the writer");
        assert_eq!(after.stdout, "alive\ncounting\n", "{mode}: {after:?}");
        // Every checkpoint made is recorded as one, and all were kept (keep_checkpoints 60).
        let view = orch.show(&t, 0).await.expect("show").expect("task");
        let kept = view
            .task
            .snapshots
            .iter()
            .filter(|s| s.status == SnapshotStatus::Complete)
            .filter(|s| s.kind == Some(SnapshotKind::Checkpoint))
            .count();
        assert_eq!(kept, made, "{mode}");
        assert!(
            made >= 10,
            "{mode}: only {made} of 50 checkpoints saw the writer's changes"
        );
        assert!(view.task.sandbox.is_some(), "{mode}: the sandbox lives on");
        orch.shutdown().await;
    }
}

/// A checkpoint that finds nothing changed makes no snapshot and writes nothing to the
/// content store; one after a small change writes only that change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_with_nothing_changed_writes_nothing() {
    for mode in isolation_modes("a_checkpoint_with_nothing_changed") {
        let dir = tempfile::tempdir().expect("temp dir");
        let orch = open(dir.path(), mode, 2, 20).await;
        let t = id("quiet");
        orch.run(
            &t,
            "mkdir -p src && seq 1 20000 > src/big && echo 1 > small",
            None,
        )
        .await
        .expect("run");
        let first = orch.checkpoint(&t).await.expect("checkpoint");
        assert_eq!(first.outcome, CheckpointOutcome::Taken, "{mode}");
        let store = |p: &Path| -> Vec<(String, u64)> {
            let mut all = Vec::new();
            for sub in ["cas/packs", &format!("snapshots/{t}")] {
                if let Ok(rd) = std::fs::read_dir(p.join("local").join(sub)) {
                    for e in rd.flatten() {
                        let len = e.metadata().map(|m| m.len()).unwrap_or(0);
                        all.push((e.file_name().to_string_lossy().into_owned(), len));
                    }
                }
            }
            all.sort();
            all
        };
        let before = store(dir.path());
        let again = orch.checkpoint(&t).await.expect("checkpoint");
        assert_eq!(again.outcome, CheckpointOutcome::Unchanged, "{mode}");
        assert_eq!(again.snapshot_id, first.snapshot_id, "{mode}");
        assert_eq!(store(dir.path()), before, "{mode}: nothing written");
        // A command that changed nothing: still no snapshot.
        orch.run(&t, "cat small > /dev/null", None)
            .await
            .expect("run");
        let quiet = orch.checkpoint(&t).await.expect("checkpoint");
        assert_eq!(quiet.outcome, CheckpointOutcome::Unchanged, "{mode}");
        // A small change: a new checkpoint, holding it.
        orch.run(&t, "echo 2 > small", None).await.expect("run");
        let changed = orch.checkpoint(&t).await.expect("checkpoint");
        assert_eq!(changed.outcome, CheckpointOutcome::Taken, "{mode}");
        let files = snapshot_files(dir.path(), changed.snapshot_id.as_deref().expect("id"));
        assert_eq!(
            files.get("small").map(String::as_str),
            Some("2\n"),
            "{mode}"
        );
        orch.shutdown().await;
    }
}

/// A rewind keeps the current files first, restores exactly the snapshot named into a new
/// sandbox (live processes end), is undone by rewinding to the kept files, counts `--back`
/// from the files it holds, and refuses — the files unchanged — what it cannot restore.
/// Checkpoints are retained apart from the suspend snapshots, and what a rewind restored is
/// retained whatever the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_restores_the_snapshot_named_and_is_undone_by_the_one_it_kept() {
    for mode in isolation_modes("a_rewind_restores_the_snapshot_named") {
        let dir = tempfile::tempdir().expect("temp dir");
        let orch = open(dir.path(), mode, 1, 2).await;
        let t = id("undo");
        let cat = |out: taskbox::engine::RunResult| out.stdout;
        orch.run(&t, "echo v1 > f", None).await.expect("run");
        orch.suspend(&t).await.expect("suspend");
        orch.run(&t, "echo v2 > f", None).await.expect("run");
        let s_v2 = orch.checkpoint(&t).await.expect("checkpoint");
        // `/proc/<pid>/cmdline` separates the arguments with NULs.
        let secs = format!("{}{}", 7000 + std::process::id() % 1000, mode.len());
        let marker = format!("sleep\0{secs}\0");
        orch.run(
            &t,
            &format!("echo v3 > f; sleep {secs} > /dev/null 2>&1 &"),
            None,
        )
        .await
        .expect("run");
        let running = crate::support::wait_for(std::time::Duration::from_secs(20), || {
            crate::support::process_running(&marker).then_some(())
        });
        assert!(running.is_some(), "{mode}: sleep {secs} never ran");
        let s_v3 = orch.checkpoint(&t).await.expect("checkpoint");
        orch.run(&t, "rm f", None)
            .await
            .expect("the agent's damage");
        // Back to v2: the current files (no f) are kept first.
        let r = orch
            .rewind(
                &t,
                RewindTo::Seq {
                    seq: s_v2.seq.expect("seq"),
                },
            )
            .await
            .expect("rewind");
        assert_eq!(Some(&r.to), s_v2.snapshot_id.as_ref(), "{mode}");
        let saved = r.saved.clone().expect("the files before are kept");
        assert_ne!(
            Some(&saved),
            s_v3.snapshot_id.as_ref(),
            "{mode}: f was removed since"
        );
        let out = orch.run(&t, "cat f", None).await.expect("run");
        assert_eq!(cat(out), "v2\n", "{mode}");
        let ended = crate::support::wait_for(std::time::Duration::from_secs(20), || {
            (!crate::support::process_running(&marker)).then_some(())
        });
        assert!(
            ended.is_some(),
            "{mode}: the old sandbox's process outlived the rewind"
        );
        // Undo: rewind to the files kept before.
        let undo = orch
            .rewind(
                &t,
                RewindTo::Id {
                    snapshot_id: saved.clone(),
                },
            )
            .await
            .expect("undo");
        assert_eq!(undo.to, saved, "{mode}");
        let out = orch
            .run(&t, "cat f 2>&1 || echo gone", None)
            .await
            .expect("run");
        assert!(out.stdout.ends_with("gone\n"), "{mode}: {out:?}");
        // Refusals leave the files as they are.
        let err = orch
            .rewind(&t, RewindTo::Seq { seq: 99 })
            .await
            .expect_err("unknown");
        assert_eq!(code(&err), "unknown_snapshot", "{mode}: {err}");
        let err = orch
            .rewind(&t, RewindTo::Back { n: 50 })
            .await
            .expect_err("too far");
        assert_eq!(code(&err), "rewind_too_far", "{mode}: {err}");
        // A newer checkpoint: the files are its now, so retention may retire the older ones
        // (until then it kept what the last rewind restored and the files it kept before).
        orch.run(&t, "echo v5 > g", None).await.expect("run");
        orch.checkpoint(&t).await.expect("checkpoint");
        let view = orch.show(&t, 0).await.expect("show").expect("task");
        // A checkpoint retention retired cannot be restored.
        let retired = view
            .task
            .snapshots
            .iter()
            .find(|s| s.status != SnapshotStatus::Complete)
            .map(|s| s.seq)
            .expect("keep_checkpoints 2 retired one of the checkpoints");
        let err = orch
            .rewind(&t, RewindTo::Seq { seq: retired })
            .await
            .expect_err("retired");
        assert_eq!(code(&err), "snapshot_unusable", "{mode}: {err}");
        let complete: Vec<_> = view
            .task
            .snapshots
            .iter()
            .filter(|s| s.status == SnapshotStatus::Complete)
            .map(|s| (s.seq, s.kind))
            .collect();
        // keep_snapshots 1 keeps the suspend's; keep_checkpoints 2 the newest two checkpoints
        // (the kept-before-rewind ones count as checkpoints), and the one rewound to stays.
        assert!(
            complete.contains(&(1, Some(SnapshotKind::Suspend))),
            "{mode}: a checkpoint pushed the suspend's snapshot out: {complete:?}"
        );
        assert!(
            complete
                .iter()
                .any(|(_, k)| *k == Some(SnapshotKind::Rewind)),
            "{mode}: {complete:?}"
        );
        let out = orch.run(&t, "ls", None).await.expect("run");
        assert!(!out.stdout.contains("f\n"), "{mode}: {out:?}");
        orch.shutdown().await;
    }
}

fn code(err: &EngineError) -> &'static str {
    match err {
        EngineError::Request { reason, .. } => reason.code(),
        _ => "other",
    }
}

/// `taskbox checkpoint` and `taskbox rewind` end to end, in a one-shot engine and through an
/// auto-started server (the CLI as a client of `POST /v1/tasks/{task}/checkpoint` and
/// `/rewind`): `--json`, what `show` lists, and the refusals with their codes.
#[test]
fn cli_checkpoint_and_rewind_through_a_server() {
    use crate::support::{ok, stderr, Home};
    let json = |s: &str| -> serde_json::Value {
        serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
    };
    for server in ["never", "auto"] {
        let mut home = Home::new();
        home.set_env("TASKBOX_SERVER", server);
        ok(&home.run(&["run", "--task", "cli", "--", "echo one > f"]));
        let first = json(&ok(&home.run(&["checkpoint", "cli", "--json"])));
        assert_eq!(first["outcome"], "taken", "{first}");
        let again = json(&ok(&home.run(&["checkpoint", "cli", "--json"])));
        assert_eq!(again["outcome"], "unchanged", "{again}");
        ok(&home.run(&["run", "--task", "cli", "--", "echo two > f"]));
        let back = json(&ok(&home.run(&["rewind", "cli", "--back", "1", "--json"])));
        assert_eq!(back["to"], first["snapshot_id"], "{back}");
        assert_eq!(
            ok(&home.run(&["run", "--task", "cli", "--", "cat f"])),
            "one\n"
        );
        let show = ok(&home.run(&["show", "cli"]));
        assert!(show.contains("checkpoint"), "{show}");
        assert!(show.contains("(rewound to)"), "{show}");
        for (args, code) in [
            (vec!["rewind", "cli", "--to", "other.s1"], "bad_request"),
            (vec!["rewind", "cli", "--back", "9"], "rewind_too_far"),
            (vec!["rewind", "cli", "--to", "cli.s99"], "unknown_snapshot"),
            (vec!["rewind", "cli"], "bad_request"),
        ] {
            let mut with_json = args.clone();
            with_json.push("--json");
            let out = home.run(&with_json);
            assert!(!out.status.success(), "{args:?} succeeded");
            let err = json(&String::from_utf8_lossy(&out.stdout));
            assert_eq!(err["code"], code, "{args:?}: {err} {}", stderr(&out));
        }
        home.run(&["serve", "--stop"]);
    }
}
