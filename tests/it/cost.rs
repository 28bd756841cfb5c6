//! `taskbox cost`: the ledger is folded from the journal alone — on Vercel from the session
//! usage the platform reports (the fake's `activeCpuDurationMs`, vCPUs, memory, start), on the
//! local backend in resource units — `--since` windows it, `show`/`tasks --json` carry it, an
//! exported journal gives the same ledger, and a fork's shared snapshot is counted once in a
//! total.

use std::collections::BTreeMap;

use serde_json::Value;
use taskbox::core::ledger::{Ledger, LedgerBuilder, Prices, Window};
use taskbox::engine::cost::{ledger_of, parse_since};
use taskbox::engine::{store_file, Paths};
use taskbox::store::Store;

use crate::support::{ok, stderr, stdout, Home};
use crate::vercel_engine::spawn_fake;

fn json(o: &std::process::Output) -> Value {
    serde_json::from_str(&ok(o)).expect("JSON on stdout")
}

fn store(home: &Home) -> Store {
    Store::open_existing(&store_file(&Paths::under(home.path()).data_dir)).expect("store")
}

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"))
}

/// Vercel: the usage the fake reports as the snapshot stops the session travels in the journal
/// and becomes vCPU-hours, memory GB-hours and an estimate at list price, the `cost.*` keys
/// reprice it, and an exported journal gives the same ledger.
#[test]
fn vercel_cost_comes_from_the_reported_session_usage_in_the_journal() {
    let home = Home::new();
    let fake = spawn_fake(&home);
    ok(&home.run(&["config", "set", "terminal.backend", "vercel_sandbox"]));
    ok(&home.run(&["config", "set", "terminal.container_memory", "2048"]));
    ok(&home.run(&["config", "set", "terminal.vercel_api_url", &fake.url]));
    let env: BTreeMap<&str, &str> = [
        ("VERCEL_TOKEN", "tok"),
        ("VERCEL_TEAM_ID", "team_t"),
        ("VERCEL_PROJECT_ID", "prj_t"),
    ]
    .into();
    let run = |args: &[&str]| home.cmd().envs(&env).args(args).output().expect("taskbox");
    ok(&run(&["run", "-t", "demo", "--", "sleep 1; echo data > f"]));
    ok(&run(&["suspend", "demo"]));

    let v = json(&home.run(&["cost", "demo", "--json"]));
    let t = &v["tasks"][0];
    assert_eq!(t["task"], "demo", "{v}");
    assert_eq!(t["backend"], "vercel_sandbox", "{v}");
    assert_eq!(t["creations"], 1, "{v}");
    assert_eq!(t["sessions_reported"], 1, "{v}");
    // The fake counts a command's wall time as active CPU: at least the second slept.
    assert!(f(t, "vcpu_hours") >= 1000.0 / 3.6e6, "{v}");
    // 2048 MB = 2 GB provisioned for at least that second.
    assert!(f(t, "memory_gb_hours") >= 2.0 / 3600.0, "{v}");
    assert!(t["snapshot_bytes_kept"].as_u64().unwrap_or(0) > 0, "{v}");
    assert_eq!(t["snapshots_kept"], 1, "{v}");
    let est = &t["estimate_usd"];
    assert_eq!(est["basis"], "estimate at list price", "{v}");
    let p = Prices::default();
    let expect_cpu = f(t, "vcpu_hours") * p.active_cpu_hour;
    assert!((f(est, "active_cpu") - expect_cpu).abs() < 1e-12, "{v}");
    assert!((f(est, "creations") - 0.6e-6).abs() < 1e-15, "{v}");
    let parts: f64 = ["active_cpu", "memory", "creations", "transfer", "snapshots"]
        .iter()
        .map(|k| f(est, k))
        .sum();
    assert!((f(est, "total") - parts).abs() < 1e-12, "{v}");
    let text = ok(&home.run(&["cost", "demo"]));
    assert!(text.contains("estimate at list price: $"), "{text}");
    assert!(text.contains("vCPU-hours"), "{text}");

    // The price is the config's: ten times the CPU price, ten times that part.
    ok(&home.run(&["config", "set", "cost.active_cpu_hour_usd", "1.28"]));
    let v2 = json(&home.run(&["cost", "demo", "--json"]));
    let cpu2 = f(&v2["tasks"][0]["estimate_usd"], "active_cpu");
    assert!((cpu2 - 10.0 * f(est, "active_cpu")).abs() < 1e-9, "{v2}");
    let bad = home.run(&["config", "set", "cost.active_cpu_hour_usd", "--", "-1"]);
    assert_eq!(bad.status.code(), Some(125));
    assert!(
        stderr(&bad).contains("cost.active_cpu_hour_usd"),
        "{}",
        stderr(&bad)
    );

    // `show` and `tasks --json` carry the same totals.
    let show = json(&home.run(&["show", "demo", "--json"]));
    assert_eq!(show["cost"]["sessions_reported"], 1, "{show}");
    assert_eq!(show["cost"]["creations"], 1, "{show}");
    let tasks = json(&home.run(&["tasks", "--json"]));
    assert_eq!(tasks[0]["cost"]["sessions_reported"], 1, "{tasks}");
    let shown = ok(&home.run(&["show", "demo"]));
    assert!(shown.contains("estimate at list price"), "{shown}");

    // The usage is in the journal, so the exported journal gives the same ledger and replays.
    let out = home.path().join("demo.jsonl");
    ok(&home.run(&["export", "demo", "--out", out.to_str().expect("utf-8")]));
    let file = taskbox::replay::export::read_journal(std::io::BufReader::new(
        std::fs::File::open(&out).expect("exported"),
    ))
    .expect("reads back");
    assert!(taskbox::replay::verify(&file.entries).is_clean());
    let window = Window::until(u64::MAX / 2);
    let stored = ledger_of(&store(&home).journal("demo").expect("journal"), window);
    let replayed = ledger_of(&file.entries, window);
    assert_eq!(stored.sessions_reported, 1);
    assert_eq!(stored, replayed);
}

/// A Vercel session that ends without a taskbox snapshot is in the ledger too: a persistent
/// sandbox the platform stops (and snapshots) while no engine watches is reported by the
/// recovery probe that adopts the platform's snapshot, and a sandbox taskbox stops without a
/// snapshot (not persistent) by the stop. Each session is counted once, and the exported
/// journal gives the same ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vercel_sessions_that_end_without_a_taskbox_snapshot_are_in_the_ledger() {
    use crate::support::tid;
    use crate::vercel_engine::{open, start_fake, vercel_config};
    use taskbox::core::Event;

    let dir = tempfile::tempdir().expect("dir");
    let fake = start_fake(dir.path(), taskbox::fake::Faults::default()).await;
    let cfg = vercel_config(&fake.base_url());
    let task = tid("gone");
    let engine_dir = dir.path().join("persistent");
    let orch = open(&engine_dir, &fake, &cfg).await;
    orch.run(&task, "sleep 1; echo v1 > f", None)
        .await
        .expect("run");
    let session = crate::support::live_sandbox(&orch, &task).await;
    // The engine dies; the platform stops the sandbox, which snapshots itself.
    orch.abort().await;
    drop(orch);
    let stopped = reqwest::Client::new()
        .post(format!(
            "{}/v2/sandboxes/sessions/{session}/stop?teamId=team_t",
            fake.base_url()
        ))
        .bearer_auth("tok")
        .send()
        .await
        .expect("stop");
    assert!(stopped.status().is_success(), "{}", stopped.status());
    let orch = open(&engine_dir, &fake, &cfg).await;
    let out = orch.run(&task, "cat f", None).await.expect("run");
    assert_eq!(out.stdout, "v1\n", "restored from the platform's snapshot");
    orch.suspend(&task).await.expect("suspend");
    orch.shutdown().await;

    let s = Store::open_existing(&store_file(&engine_dir)).expect("store");
    let journal = s.journal("gone").expect("journal");
    let probed = journal
        .iter()
        .find_map(|e| match &e.event {
            Event::SandboxProbed {
                sandbox_id,
                alive: None,
                platform_snapshot: Some(_),
                usage,
            } if *sandbox_id == session => Some(usage.clone()),
            _ => None,
        })
        .expect("the probe found the platform's snapshot")
        .expect("and journaled what the session used");
    assert!(probed.active_cpu_ms.unwrap_or(0) >= 1000, "{probed:?}");
    assert!(probed.stopped_at.is_some(), "{probed:?}");
    assert_eq!(probed.memory_mb, 2048, "{probed:?}");
    let window = Window::until(u64::MAX / 2);
    let l = ledger_of(&journal, window);
    // Two sessions, each ended: the platform's stop (by the probe) and the suspend's snapshot.
    assert_eq!((l.creations, l.sessions_reported), (2, 2), "{l:?}");
    assert!(l.active_cpu_ms >= 1000, "{l:?}");
    let mut buf = Vec::new();
    taskbox::replay::export::write_journal(&mut buf, &journal, s.installation_id(), 0)
        .expect("export");
    let file = taskbox::replay::export::read_journal(buf.as_slice()).expect("reads back");
    assert!(taskbox::replay::verify(&file.entries).is_clean());
    assert_eq!(ledger_of(&file.entries, window), l);

    // Not persistent: a suspend stops the sandbox without a snapshot; the stop reports it.
    let mut plain = cfg.clone();
    plain.terminal.container_persistent = false;
    let plain_dir = dir.path().join("plain");
    let orch = open(&plain_dir, &fake, &plain).await;
    let t2 = tid("plain");
    orch.run(&t2, "sleep 1", None).await.expect("run");
    orch.suspend(&t2).await.expect("suspend");
    orch.shutdown().await;
    let s = Store::open_existing(&store_file(&plain_dir)).expect("store");
    let journal = s.journal("plain").expect("journal");
    assert!(
        journal.iter().any(|e| matches!(
            &e.event,
            Event::SandboxStopped { usage: Some(u), .. } if u.active_cpu_ms.unwrap_or(0) >= 1000
        )),
        "the stop journals the session's usage"
    );
    let l = ledger_of(&journal, window);
    assert_eq!((l.creations, l.sessions_reported), (1, 1), "{l:?}");
    assert!(
        l.active_cpu_ms >= 1000 && l.snapshots_kept.is_empty(),
        "{l:?}"
    );
}

/// Local: the same ledger in resource units and no price; `--since` clips sandbox time and
/// leaves out creations before the window, while a snapshot still kept is still counted.
#[test]
fn local_cost_is_in_resource_units_and_since_windows_it() {
    let home = Home::new();
    ok(&home.run(&["run", "-t", "demo", "--", "sleep 1; echo data > f"]));
    ok(&home.run(&["suspend", "demo"]));
    let v = json(&home.run(&["cost", "--json"]));
    let t = &v["tasks"][0];
    assert_eq!(t["backend"], "local", "{v}");
    assert_eq!(t["creations"], 1, "{v}");
    assert!(t["sandbox_seconds"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert!(t["snapshot_bytes_kept"].as_u64().unwrap_or(0) > 0, "{v}");
    assert!(t.get("estimate_usd").is_none(), "no price on local: {v}");
    assert!(t.get("vcpu_hours").is_none(), "{v}");
    assert_eq!(v["totals"]["local"]["creations"], 1, "{v}");
    let text = ok(&home.run(&["cost", "demo"]));
    assert!(text.contains("no price"), "{text}");
    assert!(!text.contains('$'), "{text}");

    std::thread::sleep(std::time::Duration::from_millis(1500));
    let recent = json(&home.run(&["cost", "--since", "1s", "--json"]));
    let r = &recent["tasks"][0];
    assert_eq!(recent["since"], "1s", "{recent}");
    assert_eq!(r["creations"], 0, "{recent}");
    assert_eq!(r["sandbox_seconds"], 0, "{recent}");
    assert_eq!(
        r["snapshots_kept"], 1,
        "the snapshot is still kept: {recent}"
    );
    // All time still has everything.
    let all = json(&home.run(&["cost", "demo", "--since", "1w", "--json"]));
    assert_eq!(all["tasks"][0]["creations"], 1, "{all}");

    let o = home.run(&["cost", "nope"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("nope"), "{}", stderr(&o));
}

/// `--since` reads a number and a unit; anything else is a clear error (exit 125, the
/// `invalid_since` code under `--json`) naming what was given and how to write it.
#[test]
fn since_is_a_number_and_a_unit_and_bad_input_says_how_to_write_it() {
    assert_eq!(parse_since("7d"), Ok(7 * 86_400_000));
    assert_eq!(parse_since("12h"), Ok(12 * 3_600_000));
    assert_eq!(parse_since("30m"), Ok(30 * 60_000));
    assert_eq!(parse_since("45s"), Ok(45_000));
    assert_eq!(parse_since("2w"), Ok(14 * 86_400_000));
    for bad in [
        "",
        "7",
        "d",
        "7x",
        "0d",
        "-1d",
        "1.5h",
        "7 d",
        "99999999999999999999d",
        "999999999999999w",
    ] {
        assert!(parse_since(bad).is_err(), "{bad:?} must be refused");
    }
    let home = Home::new();
    let o = home.run(&["cost", "--since", "7x"]);
    assert_eq!(o.status.code(), Some(125));
    let err = stderr(&o);
    assert!(err.contains("invalid --since `7x`"), "{err}");
    assert!(err.contains("`x` is not a unit"), "{err}");
    assert!(err.contains("hint:") && err.contains("--since 7d"), "{err}");
    let o = home.run(&["cost", "--since", "soon", "--json"]);
    assert_eq!(o.status.code(), Some(125));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("an error object");
    assert_eq!(v["code"], "invalid_since", "{v}");
    // Nothing stored: an empty report, not an error.
    assert!(ok(&home.run(&["cost"])).contains("no task used anything"));
}

/// A fork's inherited snapshot is counted to the fork as well as to its parent (each retains
/// it), and once in the total; the fork's own creations are its own.
#[test]
fn a_forks_shared_snapshot_counts_to_each_holder_and_once_in_the_total() {
    let home = Home::new();
    ok(&home.run(&["run", "-t", "demo", "--", "head -c 100000 /dev/urandom > f"]));
    ok(&home.run(&["suspend", "demo"]));
    ok(&home.run(&["fork", "demo", "demo-alt"]));
    let s = store(&home);
    let until = taskbox::clock::Clock::now_ms(&taskbox::clock::SystemClock) + 3_600_000;
    let window = Window { from: 0, until };
    let parent = ledger_of(&s.journal("demo").expect("journal"), window);
    let child = ledger_of(&s.journal("demo-alt").expect("journal"), window);
    assert_eq!(parent.creations, 1);
    assert_eq!(
        parent.snapshot_bytes_kept(),
        100_000,
        "a local snapshot keeps the file data it refers to"
    );
    assert_eq!(child.creations, 0, "a fork's costs are its own");
    assert_eq!(
        parent.snapshots_kept, child.snapshots_kept,
        "the same snapshot"
    );
    assert!(child.snapshot_gb_months() > 0.0);
    let total = Ledger::sum([&parent, &child]);
    assert_eq!(total.snapshot_bytes_kept(), parent.snapshot_bytes_kept());
    let (p, t) = (parent.snapshot_gb_months(), total.snapshot_gb_months());
    assert!((t - p).abs() <= p * 1e-9, "counted once: {t} vs {p}");
    assert!(t < parent.snapshot_gb_months() + child.snapshot_gb_months());
    let v = json(&home.run(&["cost", "--json"]));
    assert_eq!(
        v["totals"]["local"]["snapshot_bytes_kept"].as_u64(),
        Some(parent.snapshot_bytes_kept()),
        "{v}"
    );
}

/// `taskbox rm` ends a task's snapshots for `show`, `tasks` and `cost`: the removed task lists
/// none `complete` (`deleted` where the removal deleted it, `released` where a fork still holds
/// it), counts no bytes kept, and its GB-months stop growing; `rm --keep-snapshots` keeps them
/// counted; a fork that shares a removed parent's snapshot still counts it.
#[test]
fn rm_ends_the_removed_tasks_snapshots_in_show_tasks_and_cost() {
    let home = Home::new();
    for t in ["solo", "kept", "demo"] {
        ok(&home.run(&["run", "-t", t, "--", "head -c 100000 /dev/urandom > f"]));
        ok(&home.run(&["suspend", t]));
    }
    ok(&home.run(&["fork", "demo", "demo-alt"]));
    ok(&home.run(&["rm", "solo"]));
    ok(&home.run(&["rm", "kept", "--keep-snapshots"]));
    ok(&home.run(&["rm", "demo"]));

    let statuses = |task: &str| -> Vec<String> {
        let v = json(&home.run(&["show", task, "--json"]));
        let from_task: Vec<String> = v["task"]["snapshots"]
            .as_array()
            .unwrap_or_else(|| panic!("snapshots in {v}"))
            .iter()
            .map(|s| s["status"].as_str().expect("a status").to_string())
            .collect();
        let rows: Vec<String> = v["snapshots"]
            .as_array()
            .unwrap_or_else(|| panic!("snapshot rows in {v}"))
            .iter()
            .map(|s| s["status"].as_str().expect("a status").to_string())
            .collect();
        assert_eq!(from_task, rows, "the record and the rows agree: {v}");
        from_task
    };
    assert_eq!(statuses("solo"), ["deleted"]);
    assert_eq!(statuses("demo"), ["released"], "the fork still holds it");
    assert_eq!(statuses("kept"), ["complete"]);
    assert_eq!(statuses("demo-alt"), ["complete"]);
    let text = ok(&home.run(&["show", "solo"]));
    assert!(
        text.contains("deleted") && !text.contains("complete"),
        "{text}"
    );

    let tasks = json(&home.run(&["tasks", "--json"]));
    let count = |task: &str| {
        tasks
            .as_array()
            .expect("an array")
            .iter()
            .find(|t| t["task"] == task)
            .unwrap_or_else(|| panic!("{task} in {tasks}"))["snapshots"]
            .as_u64()
    };
    assert_eq!(count("solo"), Some(0), "{tasks}");
    assert_eq!(count("demo"), Some(0), "{tasks}");
    assert_eq!(count("kept"), Some(1), "{tasks}");
    assert_eq!(count("demo-alt"), Some(1), "{tasks}");

    let v = json(&home.run(&["cost", "--json"]));
    let cost = |task: &str| {
        v["tasks"]
            .as_array()
            .expect("tasks")
            .iter()
            .find(|t| t["task"] == task)
            .unwrap_or_else(|| panic!("{task} in {v}"))
            .clone()
    };
    for gone in ["solo", "demo"] {
        assert_eq!(cost(gone)["snapshot_bytes_kept"], 0, "{v}");
        assert_eq!(cost(gone)["snapshots_kept"], 0, "{v}");
    }
    assert_eq!(cost("kept")["snapshots_kept"], 1, "{v}");
    assert_eq!(cost("demo-alt")["snapshot_bytes_kept"], 100_000, "{v}");
    assert_eq!(
        v["totals"]["local"]["snapshot_bytes_kept"], 200_000,
        "kept and demo-alt: {v}"
    );

    // Storage stops growing at the removal: a ledger read a year later is the same.
    let s = store(&home);
    let now = taskbox::clock::Clock::now_ms(&taskbox::clock::SystemClock);
    let year = 365 * 86_400_000;
    let ledger = |task: &str, until: u64| {
        taskbox::engine::cost::task_ledger(
            &s,
            &crate::support::tid(task),
            Window { from: 0, until },
        )
        .expect("ledger")
        .0
    };
    for gone in ["solo", "demo"] {
        let (a, b) = (ledger(gone, now), ledger(gone, now + year));
        assert!(
            a.snapshot_gb_months() > 0.0,
            "counted until the removal: {a:?}"
        );
        assert_eq!(a.snapshot_gb_months(), b.snapshot_gb_months(), "{gone}");
    }
    let (a, b) = (ledger("kept", now), ledger("kept", now + year));
    assert!(
        b.snapshot_gb_months() > a.snapshot_gb_months(),
        "kept: still stored"
    );
}

/// The fold's arithmetic on a journal written by hand: sandbox time from the entry that made the
/// sandbox the task's to the one that ended it, the reported usage in vCPU-hours, memory
/// GB-hours and transfer, storage in GB-months, the estimate at the published prices, and a
/// window that clips sandbox time and leaves out a creation before it.
#[test]
fn the_ledger_folds_a_journal_into_units_and_prices() {
    use taskbox::core::{
        Event, SandboxRecord, SessionUsage, SnapshotRecord, SnapshotStatus, Task, TaskSettings,
    };
    const H: u64 = 3_600_000;
    let t0 = 1_000;
    let idle = Task::new(crate::support::tid("t"), TaskSettings::default(), t0);
    let mut live = idle.clone();
    live.sandbox = Some(SandboxRecord {
        id: crate::support::sbx("sbx_1"),
        name: "n".into(),
        generation: 1,
        created_at: t0,
        deadline: t0 + 5 * H,
        source_snapshot: None,
        used: true,
        activity: None,
        sampling: false,
    });
    let mut kept = idle.clone();
    kept.snapshots.push(SnapshotRecord {
        seq: 1,
        id: Some(crate::support::snap("snap_1")),
        status: SnapshotStatus::Complete,
        size_bytes: 1_000_000_000,
        sandbox_id: crate::support::sbx("sbx_1"),
        started_at: t0 + H,
        created_at: Some(t0 + H),
        expires_at: None,
        omitted: Vec::new(),
        taken_by: None,
        kind: None,
    });
    let ready = Event::SandboxReady {
        generation: 1,
        sandbox_id: crate::support::sbx("sbx_1"),
        name: "n".into(),
        deadline: t0 + 5 * H,
    };
    let taken = Event::SnapshotTaken {
        seq: 1,
        snapshot_id: crate::support::snap("snap_1"),
        size_bytes: 1_000_000_000,
        expires_at: None,
        omitted: Vec::new(),
        usage: Some(SessionUsage {
            started_at: t0,
            stopped_at: Some(t0 + H),
            vcpus: 2,
            memory_mb: 4096,
            active_cpu_ms: Some(H / 2),
            transfer_bytes: Some(2_000_000_000),
        }),
        resources: None,
    };
    let entries = [(t0, &ready, &live), (t0 + H, &taken, &kept)];
    let month = 30 * 24 * H;
    let l = Ledger::of(Window::until(t0 + H + month), entries);
    assert_eq!(l.creations, 1);
    assert_eq!(l.sandbox_ms, H);
    assert_eq!(l.sessions_reported, 1);
    assert!((l.vcpu_hours() - 0.5).abs() < 1e-12);
    assert!(
        (l.memory_gb_hours() - 4.0).abs() < 1e-12,
        "4096 MB for an hour"
    );
    assert!((l.transfer_gb() - 2.0).abs() < 1e-12);
    assert!(
        (l.snapshot_gb_months() - 1.0).abs() < 1e-12,
        "1 GB for 30 days"
    );
    assert_eq!(l.snapshot_bytes_kept(), 1_000_000_000);
    let e = l.estimate(&Prices::default());
    let expect = 0.5 * 0.128 + 4.0 * 0.0212 + 0.6e-6 + 2.0 * 0.15 + 0.08;
    assert!((e.total - expect).abs() < 1e-12, "{e:?}");

    // A `taskbox rm` that did not keep the snapshots, half a month in: storage ends there for
    // good — an entry journaled after the removal (the stop of its sandbox) still lists the
    // record `complete`, and counts nothing — and nothing is kept at the window's end.
    let removed_at = t0 + H + month / 2;
    let after_rm = Event::SandboxStopped {
        sandbox_id: crate::support::sbx("sbx_1"),
        usage: None,
    };
    let with_stop = [
        (t0, &ready, &live),
        (t0 + H, &taken, &kept),
        (removed_at + 10, &after_rm, &kept),
    ];
    for window_end in [t0 + H + month, t0 + H + 12 * month] {
        let mut b = LedgerBuilder::new(Window::until(window_end)).retention_ends(
            taskbox::core::retention::retention_ends(Some(removed_at), false),
        );
        for (at, event, after) in with_stop {
            b.apply(at, event, after);
        }
        let l = b.finish();
        assert!(
            (l.snapshot_gb_months() - 0.5).abs() < 1e-12,
            "half a month, however late the ledger is read: {l:?}"
        );
        assert_eq!(l.snapshot_bytes_kept(), 0, "{l:?}");
    }
    // `rm --keep-snapshots`: the snapshot is still kept, and counted to the window's end.
    let mut b = LedgerBuilder::new(Window::until(t0 + H + month)).retention_ends(
        taskbox::core::retention::retention_ends(Some(removed_at), true),
    );
    for (at, event, after) in with_stop {
        b.apply(at, event, after);
    }
    let l = b.finish();
    assert!((l.snapshot_gb_months() - 1.0).abs() < 1e-12, "{l:?}");
    assert_eq!(l.snapshot_bytes_kept(), 1_000_000_000);

    // From half an hour in: half the sandbox time, no creation, the usage reported in the
    // window, storage from the snapshot on.
    let w = Window {
        from: t0 + H / 2,
        until: t0 + H + month,
    };
    let l = Ledger::of(w, entries);
    assert_eq!(l.creations, 0);
    assert_eq!(l.sandbox_ms, H / 2);
    assert_eq!(l.sessions_reported, 1);
    assert!((l.snapshot_gb_months() - 1.0).abs() < 1e-12);
    // Ending before the snapshot: none of it.
    let l = Ledger::of(
        Window {
            from: 0,
            until: t0 + H / 2,
        },
        entries,
    );
    assert_eq!(
        (l.creations, l.sandbox_ms, l.sessions_reported),
        (1, H / 2, 0)
    );
    assert_eq!(l.snapshot_gb_months(), 0.0);
    assert!(l.snapshots_kept.is_empty());

    // A session reported twice — a probe found it stopped while its snapshot was being taken,
    // then the snapshot — is counted once, at its first report; another session's stop counts.
    let Event::SnapshotTaken { usage: Some(u), .. } = &taken else {
        unreachable!("built above with usage")
    };
    let probed = Event::SandboxProbed {
        sandbox_id: crate::support::sbx("sbx_1"),
        alive: None,
        platform_snapshot: None,
        usage: Some(u.clone()),
    };
    let stopped = Event::SandboxStopped {
        sandbox_id: crate::support::sbx("sbx_2"),
        usage: Some(SessionUsage {
            active_cpu_ms: Some(H),
            ..u.clone()
        }),
    };
    let entries = [
        (t0, &ready, &live),
        (t0 + H, &probed, &live),
        (t0 + H, &taken, &kept),
        (t0 + 2 * H, &stopped, &kept),
    ];
    let l = Ledger::of(Window::until(t0 + 3 * H), entries);
    assert_eq!(l.sessions_reported, 2);
    assert!((l.vcpu_hours() - 1.5).abs() < 1e-12, "{l:?}");
}

/// Waits (bounded) until `task`'s journal, as `show` reads it, has an entry `pick` finds.
async fn journaled<T>(
    orch: &taskbox::engine::Orchestrator,
    task: &taskbox::TaskId,
    mut pick: impl FnMut(&taskbox::core::Event) -> Option<T>,
) -> T {
    for _ in 0..300 {
        let view = orch
            .show(task, 1000)
            .await
            .expect("show")
            .expect("the task");
        if let Some(found) = view.journal.iter().find_map(|e| pick(&e.event)) {
            return found;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{task}: the journal never had the entry looked for");
}

/// The ledger of `task`'s stored journal: it has vCPU-hours and memory GB-hours for every
/// session, and the exported journal replays cleanly, gives the same ledger and re-drives
/// (the engine makes the same calls, the usage read among them).
async fn ledger_reproduced(data: &std::path::Path, task: &str, sessions: u64) -> Ledger {
    let s = Store::open_existing(&store_file(data)).expect("store");
    let journal = s.journal(task).expect("journal");
    let window = Window::until(u64::MAX / 2);
    let l = ledger_of(&journal, window);
    assert_eq!(l.sessions_reported, sessions, "{task}: {l:?}");
    assert_eq!(l.sessions_unknown, 0, "{task}: {l:?}");
    // The fake bills a command's wall time as active CPU: each session ran `sleep 1`.
    assert!(l.active_cpu_ms >= 1000 * sessions, "{task}: {l:?}");
    assert!(
        l.vcpu_hours() > 0.0 && l.memory_gb_hours() > 0.0,
        "{task}: {l:?}"
    );
    let mut buf = Vec::new();
    taskbox::replay::export::write_journal(&mut buf, &journal, s.installation_id(), 0)
        .expect("export");
    let file = taskbox::replay::export::read_journal(buf.as_slice()).expect("reads back");
    assert!(taskbox::replay::verify(&file.entries).is_clean(), "{task}");
    assert_eq!(ledger_of(&file.entries, window), l, "{task}");
    let entries = file.entries.clone();
    let reports = tokio::task::spawn_blocking(move || taskbox::replay::redrive::redrive(&entries))
        .await
        .expect("re-drive thread")
        .expect("re-drive runs");
    for r in &reports {
        assert!(r.divergence.is_none(), "{task}: {r:?}");
    }
    l
}

/// Sessions that end without the platform being asked have their usage read afterwards
/// (`read_usage`, answered by `usage_read` in the journal): (a) the deadline passes while the
/// engine watches, (b) a command is answered "sandbox gone" (the platform stopped the session
/// early), (c) `taskbox rm` stops the sandbox. In each the ledger gets vCPU-hours and memory
/// GB-hours for the session, and replay and re-drive reproduce it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vercel_sessions_that_end_unasked_have_their_usage_read() {
    use crate::support::{live_sandbox, tid};
    use crate::vercel_engine::{open, start_fake, vercel_config};
    use taskbox::core::Event;

    let dir = tempfile::tempdir().expect("dir");
    let fake = start_fake(dir.path(), taskbox::fake::Faults::default()).await;
    let cfg = vercel_config(&fake.base_url());
    let usage_read = |session: taskbox::ids::SandboxId| {
        move |e: &Event| match e {
            Event::UsageRead { sandbox_id, usage } if *sandbox_id == session => Some(usage.clone()),
            _ => None,
        }
    };

    // (a) Not persistent, a 2 s timeout the plan cannot extend: the deadline timer ends it.
    let mut short = cfg.clone();
    short.terminal.container_persistent = false;
    short.terminal.sandbox_timeout_seconds = 2;
    short.terminal.max_sandbox_lifetime_seconds = 2;
    let a_dir = dir.path().join("deadline");
    let orch = open(&a_dir, &fake, &short).await;
    let a = tid("deadline");
    orch.run(&a, "sleep 1", None).await.expect("run");
    let session = live_sandbox(&orch, &a).await;
    let read = journaled(&orch, &a, usage_read(session.clone()))
        .await
        .expect("the platform answered what the session used");
    assert_eq!(read.memory_mb, 2048, "{read:?}");
    assert!(read.active_cpu_ms.unwrap_or(0) >= 1000, "{read:?}");
    orch.shutdown().await;
    ledger_reproduced(&a_dir, "deadline", 1).await;

    // (b) The platform stops the session early; the next command's run request is answered
    // "gone" (410): the command runs on a new sandbox, and the gone session's usage is read.
    let b_dir = dir.path().join("gone");
    let orch = open(&b_dir, &fake, &cfg).await;
    let b = tid("gone");
    orch.run(&b, "sleep 1", None).await.expect("run");
    let session = live_sandbox(&orch, &b).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/expire-session/{session}", fake.admin_url()))
        .send()
        .await
        .expect("admin request");
    assert!(resp.status().is_success(), "{}", resp.status());
    orch.run(&b, "sleep 1", None)
        .await
        .expect("runs on a new sandbox");
    let read = journaled(&orch, &b, usage_read(session.clone()))
        .await
        .expect("the platform answered what the session used");
    assert!(read.stopped_at.is_some(), "{read:?}");
    orch.suspend(&b).await.expect("suspend");
    orch.shutdown().await;
    // The gone session (read) and the second one (stopped by the suspend's snapshot).
    ledger_reproduced(&b_dir, "gone", 2).await;

    // (c) `rm` stops the live sandbox: the stop's usage is journaled in the removed task's
    // record, and its sandbox time ends there.
    let c_dir = dir.path().join("rm");
    let orch = open(&c_dir, &fake, &cfg).await;
    let c = tid("removed");
    orch.run(&c, "sleep 1", None).await.expect("run");
    let session = live_sandbox(&orch, &c).await;
    let removed = orch.remove(&c, false).await.expect("rm");
    assert_eq!(
        removed.sandbox_stopped.as_ref(),
        Some(&session),
        "{removed:?}"
    );
    assert!(removed.errors.is_empty(), "{removed:?}");
    orch.shutdown().await;
    let s = Store::open_existing(&store_file(&c_dir)).expect("store");
    let journal = s.journal("removed").expect("journal");
    let last = journal.last().expect("entries");
    assert!(
        matches!(&last.event, Event::SandboxStopped { sandbox_id, usage: Some(_) } if *sandbox_id == session),
        "{:?}",
        last.event
    );
    assert!(last.task_after.sandbox.is_none(), "{:?}", last.task_after);
    let l = ledger_reproduced(&c_dir, "removed", 1).await;
    // Sandbox time ended with the stop, not at the window's end.
    assert!(l.sandbox_ms < 60_000, "{l:?}");
}

/// A usage read the platform did not answer counts the session as unknown (once, and not after
/// the session was reported); an answered read counts like any report, once per session; the
/// text and JSON say how many are unknown.
#[test]
fn an_unanswered_usage_read_counts_the_session_as_unknown() {
    use taskbox::core::{Event, SessionUsage, Task, TaskSettings};
    use taskbox::engine::cost::ledger_json;

    let idle = Task::new(crate::support::tid("t"), TaskSettings::default(), 0);
    let read = |id: &str, usage: Option<SessionUsage>| Event::UsageRead {
        sandbox_id: crate::support::sbx(id),
        usage,
    };
    let used = SessionUsage {
        started_at: 0,
        stopped_at: Some(3_600_000),
        vcpus: 1,
        memory_mb: 2048,
        active_cpu_ms: Some(1_800_000),
        transfer_bytes: None,
    };
    let unknown = read("sbx_1", None);
    let again = read("sbx_1", None);
    let answered = read("sbx_2", Some(used.clone()));
    let twice = read("sbx_2", None);
    let entries = [
        (10, &unknown, &idle),
        (20, &again, &idle),
        (30, &answered, &idle),
        (40, &twice, &idle),
    ];
    let l = Ledger::of(Window::until(100), entries);
    assert_eq!((l.sessions_reported, l.sessions_unknown), (1, 1), "{l:?}");
    assert!((l.vcpu_hours() - 0.5).abs() < 1e-12, "{l:?}");
    assert!((l.memory_gb_hours() - 2.0).abs() < 1e-12, "{l:?}");
    let v = ledger_json(&l, Some("vercel_sandbox"), &Prices::default());
    assert_eq!(v["sessions_unknown"], 1, "{v}");
    // Summed over tasks, unknown sessions add up.
    assert_eq!(Ledger::sum([&l, &l]).sessions_unknown, 2);
}
