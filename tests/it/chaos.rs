//! Chaos runs (`taskbox::chaos`, `taskbox chaos`): many seeds of the real engine on the
//! simulated platform with every fault kind and engine crashes hold every invariant; a seed is
//! reproducible bit for bit; the checker catches a planted bug and prints the command that
//! reproduces it; bad fault lists are refused clearly. Plus regression tests for the engine and
//! simulator bugs that chaos found.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use taskbox::chaos::{self, check, ChaosFaults, ChaosOptions, Invariant, PlantedBug};
use taskbox::clock::TokioClock;
use taskbox::config::Config;
use taskbox::core::{Command, FailureKind, Notice, TimerKind};
use taskbox::engine::Orchestrator;
use taskbox::provider::sim::{SimFaults, SimProvider};
use taskbox::provider::{SandboxProvider, SandboxSpec};
use taskbox::retry::Jitter;
use taskbox::store::Store;
use taskbox::TaskId;

use crate::support::tid;
use crate::support::{paused_runtime, stderr, stdout, Home};

/// Options for `seeds` seeds of `tasks` tasks, data dirs in a fresh temp dir on the RAM disk
/// when there is one (the directory is removed with the returned guard).
fn options(first: u64, seeds: u64, tasks: u32) -> (ChaosOptions, tempfile::TempDir) {
    let work = tempfile::tempdir_in(chaos::default_work_dir()).expect("work dir");
    let mut opts = ChaosOptions::new(first, seeds, tasks);
    opts.work_dir = work.path().to_path_buf();
    opts.jobs = 2;
    (opts, work)
}

fn no_progress(_: &chaos::SeedReport) {}

#[test]
fn dozens_of_seeds_with_every_fault_hold_every_invariant() {
    let (opts, _work) = options(1, 36, 8);
    let report = chaos::run(&opts, &no_progress).expect("chaos run");
    assert_eq!(report.seeds_run, 36);
    let details: Vec<String> = report
        .violating_seeds
        .iter()
        .flat_map(|s| {
            s.violations
                .iter()
                .map(move |v| format!("seed {}: {v}", s.seed))
        })
        .collect();
    assert_eq!(report.totals.violations, 0, "{details:#?}");
    assert!(report.is_clean());
    // Every fault kind was injected at least once, crashes included.
    let kinds = [
        "rate_limit",
        "server_error",
        "timeout",
        "lost_create",
        "expire_mid_command",
        "snapshot_fail_permanent",
        "snapshot_fail_transient",
        "snapshot_slow",
        "snapshot_gone",
        "delete_fail",
        "crash",
    ];
    for kind in kinds {
        assert!(
            report.totals.counts.faults.get(kind).copied().unwrap_or(0) > 0,
            "fault {kind} was never injected: {:?}",
            report.totals.counts.faults
        );
    }
    // The faults had effects the journal shows.
    let j = &report.totals.counts.journal;
    assert!(j.retries > 0 && j.restores > 0 && j.recoveries > 0, "{j:?}");
    assert!(j.fallbacks > 0 && j.files_lost > 0, "{j:?}");
    // Sandboxes found gone before a command started: the command ran on a restored one
    // (issue 12), and the checker found no violation in those runs either.
    assert!(j.reruns > 0, "{j:?}");
    assert!(report.totals.counts.requests_ok > report.totals.counts.requests_failed);
}

#[test]
fn the_same_seed_gives_the_same_run_bit_for_bit() {
    let (opts, _work) = options(0, 1, 6);
    let digests: Vec<String> = [11u64, 11, 12]
        .iter()
        .map(|&seed| chaos::run_seed(seed, &opts).expect("seed").digest)
        .collect();
    assert_eq!(digests[0], digests[1], "seed 11 twice");
    assert_ne!(digests[0], digests[2], "seeds 11 and 12");
    // The summary digest of several seeds does not depend on how many run at once.
    let (mut a, _wa) = options(40, 6, 4);
    a.jobs = 1;
    let (mut b, _wb) = options(40, 6, 4);
    b.jobs = 3;
    let ra = chaos::run(&a, &no_progress).expect("run");
    let rb = chaos::run(&b, &no_progress).expect("run");
    assert_eq!(ra.digest, rb.digest);
    assert_eq!(ra.totals.counts.journal, rb.totals.counts.journal);
}

/// Issue 12, item 20: a seed's run must not depend on what other threads of the process do.
/// Here another thread keeps forking children that linger before they exec — as the test
/// harness does when other tests spawn processes — so each child holds copies of every open
/// descriptor, the task locks' `flock`s included, for a moment. A task lock found held after an
/// engine crash used to be waited for on the virtual clock, which moved simulated time and
/// changed the run.
#[test]
fn a_seed_does_not_depend_on_children_forked_by_other_threads() {
    use std::os::unix::process::CommandExt;
    let (opts, _work) = options(0, 1, 6);
    let quiet = chaos::run_seed(11, &opts).expect("seed").digest;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let storm = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut c = std::process::Command::new("true");
                // SAFETY: the closure runs in the forked child and only sleeps (nanosleep is
                // async-signal-safe; nothing is allocated or locked).
                unsafe {
                    c.pre_exec(|| {
                        let t = libc::timespec {
                            tv_sec: 0,
                            tv_nsec: 2_000_000,
                        };
                        libc::nanosleep(&t, std::ptr::null_mut());
                        Ok(())
                    });
                }
                let _ = c.status();
            }
        })
    };
    let mut stormy = Vec::new();
    for _ in 0..4 {
        stormy.push(chaos::run_seed(11, &opts).expect("seed").digest);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    storm.join().expect("the forking thread");
    for d in &stormy {
        assert_eq!(d, &quiet, "seed 11 changed while another thread forked");
    }
}

#[test]
fn the_checker_catches_a_planted_bug_and_says_how_to_reproduce_it() {
    let (mut opts, _work) = options(1, 8, 6);
    opts.planted_bug = Some(PlantedBug::OldestRestore);
    let report = chaos::run(&opts, &no_progress).expect("chaos run");
    assert!(
        report.totals.violations > 0,
        "the planted bug went unnoticed"
    );
    let first = &report.violating_seeds[0];
    assert!(
        first
            .violations
            .iter()
            .any(|v| v.invariant == Invariant::RestoredLatest),
        "{:?}",
        first.violations
    );
    assert!(
        first.repro.starts_with(&format!(
            "taskbox chaos --seed {} --tasks 6 --faults '",
            first.seed
        )) && first.repro.ends_with("' --planted-bug oldest-restore"),
        "{}",
        first.repro
    );
    let home = first
        .home
        .as_ref()
        .expect("a violating seed keeps its data");
    assert!(home.join("data").join("taskbox.db").is_file());
    // ... but not on the RAM disk, where it would hold memory until a reboot.
    if opts.work_dir.starts_with("/dev/shm") {
        assert!(!home.starts_with("/dev/shm"), "{}", home.display());
        assert!(home.starts_with(std::env::temp_dir()), "{}", home.display());
        let left: Vec<_> = std::fs::read_dir(&opts.work_dir)
            .expect("read work dir")
            .collect();
        assert!(left.is_empty(), "left on /dev/shm: {left:?}");
    }
    let journal = first.journal_file.as_ref().expect("a journal file");
    assert!(
        journal.starts_with(home) && journal.is_file(),
        "{journal:?}"
    );
    for s in &report.violating_seeds {
        if let Some(h) = &s.home {
            let _ = std::fs::remove_dir_all(h);
        }
    }
    // The same engine without the planted bug is clean on the same seeds.
    opts.planted_bug = None;
    let clean = chaos::run(&opts, &no_progress).expect("chaos run");
    assert_eq!(clean.totals.violations, 0, "{:?}", clean.violating_seeds);
}

#[test]
fn the_cli_reports_violations_with_a_repro_command_that_reproduces_them() {
    let home = Home::new();
    let work = tempfile::tempdir_in(chaos::default_work_dir()).expect("work dir");
    let work_dir = work.path().to_str().expect("utf-8 path");
    let out = home.run(&[
        "chaos",
        "--seeds",
        "4",
        "--tasks",
        "5",
        "--work-dir",
        work_dir,
        "--planted-bug",
        "oldest-restore",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("violations"), "{text}");
    assert!(text.contains("[restored-latest]"), "{text}");
    let repro = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("reproduce: "))
        .expect("a repro line")
        .to_string();
    assert!(text.contains("data kept: "), "{text}");
    // The kept journal replays cleanly: the planted bug is in the platform, not in the core.
    let journal = text
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("journal: taskbox replay --all --journal ")
        })
        .expect("a journal line");
    assert!(journal.ends_with("journal.jsonl"), "{journal}");
    let replayed = home.run(&["replay", "--all", "--journal", journal]);
    assert_eq!(replayed.status.code(), Some(0), "{}", stderr(&replayed));
    // Run the printed command (its --faults value is single-quoted) and get the same seed's
    // violations again.
    let (head, rest) = repro.split_once(" --faults '").expect("faults argument");
    let (faults, tail) = rest.split_once('\'').expect("closing quote");
    let mut args: Vec<&str> = head.split_whitespace().skip(1).collect();
    args.extend(["--faults", faults]);
    args.extend(tail.split_whitespace());
    args.extend(["--json", "--work-dir", work_dir]);
    let again = home.run(&args);
    assert_eq!(again.status.code(), Some(1), "{}", stderr(&again));
    let json: Value = serde_json::from_str(&stdout(&again)).expect("json report");
    assert_eq!(json["seeds_run"], 1);
    let seed = &json["violating_seeds"][0];
    assert_eq!(seed["repro"].as_str(), Some(repro.as_str()));
    assert!(seed["violations"].as_array().is_some_and(|v| !v.is_empty()));
    // The kept data moved off the RAM disk; remove it.
    for json_home in [&json["violating_seeds"][0]["home"]] {
        if let Some(h) = json_home.as_str() {
            let _ = std::fs::remove_dir_all(h);
        }
    }
    for line in text.lines() {
        if let Some(h) = line.trim().strip_prefix("data kept: ") {
            let h = h.split_whitespace().next().unwrap_or(h);
            let _ = std::fs::remove_dir_all(h);
        }
    }
}

#[test]
fn the_cli_runs_clean_seeds_and_prints_json() {
    let home = Home::new();
    let work = tempfile::tempdir_in(chaos::default_work_dir()).expect("work dir");
    let args = [
        "chaos",
        "--seed",
        "7",
        "--seeds",
        "3",
        "--tasks",
        "4",
        "--json",
        "--work-dir",
        work.path().to_str().expect("utf-8 path"),
    ];
    let a = home.run(&args);
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    let b = home.run(&args);
    let ja: Value = serde_json::from_str(&stdout(&a)).expect("json");
    let jb: Value = serde_json::from_str(&stdout(&b)).expect("json");
    assert_eq!(ja["digest"], jb["digest"]);
    assert_eq!(ja["first_seed"], 7);
    assert_eq!(ja["seeds_run"], 3);
    assert_eq!(ja["totals"]["violations"], 0);
    assert!(ja["totals"]["faults"]
        .as_object()
        .is_some_and(|f| !f.is_empty()));
    // Clean seeds leave nothing behind.
    assert_eq!(
        std::fs::read_dir(work.path())
            .expect("read work dir")
            .count(),
        0
    );
}

/// Issue 12, item 21: a fault list without latency puts a snapshot, the sandbox restored from
/// it and the next snapshot in one virtual millisecond; the checker orders them by the
/// platform's record (the engine was right), so the documented commands are clean.
#[test]
fn zero_latency_fault_lists_hold_every_invariant() {
    let home = Home::new();
    let work = tempfile::tempdir_in(chaos::default_work_dir()).expect("work dir");
    let work_dir = work.path().to_str().expect("utf-8 path");
    let out = home.run(&[
        "chaos",
        "--seeds",
        "50",
        "--faults",
        "none",
        "--json",
        "--work-dir",
        work_dir,
    ]);
    let json: Value = serde_json::from_str(&stdout(&out)).expect("json report");
    assert_eq!(json["seeds_run"], 50);
    assert_eq!(
        json["totals"]["violations"], 0,
        "{:#}",
        json["violating_seeds"]
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = home.run(&[
        "chaos",
        "--seed",
        "42",
        "--tasks",
        "8",
        "--faults",
        "transient=0.1,lost_create=0.05,crash=0.02",
        "--json",
        "--work-dir",
        work_dir,
    ]);
    let json: Value = serde_json::from_str(&stdout(&out)).expect("json report");
    assert_eq!(
        json["totals"]["violations"], 0,
        "{:#}",
        json["violating_seeds"]
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_dir(work.path())
            .expect("read work dir")
            .count(),
        0
    );
}

/// The same-millisecond rule of the restore check, both ways: a snapshot taken in the very
/// millisecond a sandbox is created counts only if the platform made it first.
#[test]
fn the_restore_check_orders_one_millisecond_by_the_platform() {
    use std::collections::BTreeMap;
    use taskbox::chaos::check::{PlatformSandbox, PlatformSnapshot};
    let sandbox = |id: &str, order, source: Option<&str>| PlatformSandbox {
        id: id.into(),
        task_id: "t".into(),
        generation: Some(1),
        source_snapshot: source.map(Into::into),
        created_at: 1_000,
        order: Some(order),
        live: false,
    };
    let snap = PlatformSnapshot {
        id: "snap-1".into(),
        task_id: "t".into(),
        created_at: 1_000,
        order: Some(2),
        expires_at: None,
        deleted: false,
        expired: false,
    };
    let none = BTreeMap::new();
    // Made before the snapshot (which was taken of it): fresh is right, the snapshot is wrong.
    assert!(check::restores(
        &[sandbox("a", 1, None)],
        std::slice::from_ref(&snap),
        &none,
        "t"
    )
    .is_empty());
    assert_eq!(
        check::restores(
            &[sandbox("a", 1, Some("snap-1"))],
            std::slice::from_ref(&snap),
            &none,
            "t"
        )
        .len(),
        1
    );
    // Made after it in the same millisecond: it must restore the snapshot.
    assert!(check::restores(
        &[sandbox("b", 3, Some("snap-1"))],
        std::slice::from_ref(&snap),
        &none,
        "t"
    )
    .is_empty());
    let v = check::restores(
        &[sandbox("b", 3, None)],
        std::slice::from_ref(&snap),
        &none,
        "t",
    );
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].invariant, Invariant::RestoredLatest);
}

#[test]
fn bad_fault_lists_are_refused_clearly() {
    let home = Home::new();
    let out = home.run(&["chaos", "--faults", "transient=0.1,cosmic_ray=0.5"]);
    assert_eq!(out.status.code(), Some(125));
    let err = stderr(&out);
    assert!(err.contains("invalid --faults"), "{err}");
    assert!(err.contains("`cosmic_ray`"), "{err}");
    assert!(
        err.contains("crash") && err.contains("lost_create"),
        "{err}"
    );
    assert!(err.contains("hint:"), "{err}");
    for bad in ["crash=2", "timeout=lots", "lost_create"] {
        let out = home.run(&["chaos", "--faults", bad]);
        assert_eq!(out.status.code(), Some(125), "{bad}");
        assert!(stderr(&out).contains("invalid --faults"), "{bad}");
    }
    let out = home.run(&["chaos", "--tasks", "0"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("--tasks"), "{}", stderr(&out));

    // The list form reads back to the same faults, crash rate included.
    let f = ChaosFaults::parse_list("all=0.2,crash=0.05,latency=1..9").expect("valid");
    assert_eq!(f.crash, 0.05);
    assert_eq!(f.sim.snapshot_gone, 0.2);
    assert_eq!(
        ChaosFaults::parse_list(&f.to_list()).expect("reads back"),
        f
    );
    assert_eq!(
        ChaosFaults::parse_list("none").expect("none"),
        ChaosFaults::none()
    );
    assert_eq!(
        ChaosFaults::parse_list("all=0.3").expect("all").crash,
        0.3,
        "all= sets the crash rate too"
    );
}

/// The journal checks fail on a journal that breaks the retry policy: take a real journal and
/// tamper with it.
#[test]
fn the_journal_checks_catch_a_broken_retry_policy() {
    let (mut opts, work) = options(0, 1, 8);
    opts.keep_all = true;
    let mut report = chaos::run_seed(3, &opts).expect("seed");
    let home = report.home.take().expect("kept");
    let store = Store::open(&home.join("data").join("taskbox.db")).expect("store");
    let mut entries = Vec::new();
    for id in store.task_ids().expect("ids") {
        entries.extend(store.journal(&id).expect("journal"));
    }
    let (counts, violations) = check::journal(&entries);
    assert!(violations.is_empty(), "{violations:?}");
    assert!(counts.retries > 0, "seed 3 retries something");

    // A retry scheduled 1 ms sooner than the policy says.
    let mut early = entries.clone();
    let e = early
        .iter_mut()
        .find(|e| {
            e.commands.iter().any(|c| {
                matches!(
                    c,
                    Command::ScheduleTimer {
                        timer: TimerKind::Retry,
                        ..
                    }
                )
            }) && !matches!(
                e.event,
                taskbox::core::Event::Loaded | taskbox::core::Event::Recovered
            )
        })
        .expect("a retry in the journal");
    for c in &mut e.commands {
        if let Command::ScheduleTimer {
            timer: TimerKind::Retry,
            at,
        } = c
        {
            *at -= 1;
        }
    }
    let (_, v) = check::journal(&early);
    assert!(
        v.iter().any(|v| v.invariant == Invariant::RetryPolicy),
        "{v:?}"
    );

    // More attempts than the policy allows, outside a snapshot.
    let mut over = entries.clone();
    let e = over
        .iter_mut()
        .find(|e| e.task_after.state == taskbox::core::TaskState::Running)
        .expect("a running entry");
    e.task_after.attempts = e.task_after.settings.retry.max_attempts + 1;
    let (_, v) = check::journal(&over);
    assert!(
        v.iter().any(|v| v.invariant == Invariant::RetryPolicy),
        "{v:?}"
    );

    // A gap in a task's journal.
    let mut gap = entries.clone();
    let victim = gap[3].task_id.clone();
    let pos = gap
        .iter()
        .position(|e| e.task_id == victim && e.task_seq == 2)
        .expect("second entry");
    gap.remove(pos);
    let (_, v) = check::journal(&gap);
    assert!(
        v.iter().any(|v| v.invariant == Invariant::JournalOrder),
        "{v:?}"
    );
    drop(work);
}

/// Regression (found by chaos): after a restart, a task whose recorded sandbox deadline had
/// passed sent the next command to the dead sandbox, and the command failed with "the sandbox
/// expired while ... was running". Now the command restores the files and runs.
#[test]
fn a_command_after_a_restart_past_the_deadline_restores_instead_of_failing() {
    paused_runtime().block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(TokioClock::starting_at(1_700_000_000_000));
        let sim = Arc::new(SimProvider::new(5, SimFaults::none(), clock.clone()));
        let mut config = Config::default();
        config.terminal.sandbox_timeout_seconds = 300;
        config.terminal.lifetime_seconds = 3600;
        config.terminal.max_sandbox_lifetime_seconds = 300;
        let open = || {
            Orchestrator::builder(dir.path().to_path_buf(), config.clone())
                .provider(sim.clone())
                .clock(clock.clone())
                .jitter(Jitter::None)
                .reconcile_on_start(false)
                .open()
        };
        let task = TaskId::new("late").expect("id");
        let orch = open().await.expect("open");
        orch.run(&task, "write f kept", None).await.expect("run");
        orch.suspend(&task).await.expect("suspend");
        orch.run(&task, "write g lost", None)
            .await
            .expect("restore");
        orch.shutdown().await;
        // taskbox is not running when the sandbox reaches its deadline.
        tokio::time::sleep(Duration::from_secs(400)).await;
        assert!(sim.live_sandboxes().is_empty());
        let orch = open().await.expect("reopen");
        let out = orch
            .run(&task, "cat f", None)
            .await
            .expect("the command restores and runs");
        assert_eq!(out.stdout, "kept");
        assert!(
            out.notices
                .iter()
                .any(|n| matches!(n, Notice::SandboxExpired { .. })),
            "{:?}",
            out.notices
        );
        assert!(
            out.notices.iter().any(|n| matches!(
                n,
                Notice::Recreated {
                    from_snapshot: Some(_),
                    ..
                }
            )),
            "{:?}",
            out.notices
        );
        orch.shutdown().await;
    });
}

/// Regression (found by chaos): a snapshot call while another snapshot of the same sandbox is
/// under way answers 422 `sandbox_snapshotting` (transient), as Vercel does, instead of failing
/// for good while the first goes on to take the snapshot.
#[test]
fn the_simulator_answers_422_to_a_second_snapshot_under_way() {
    paused_runtime().block_on(async {
        let clock = Arc::new(TokioClock::starting_at(1_700_000_000_000));
        let faults = SimFaults {
            snapshot_slow: 1.0,
            snapshot_slow_ms: 20_000,
            ..SimFaults::none()
        };
        let sim = Arc::new(SimProvider::new(1, faults, clock.clone()));
        let spec = SandboxSpec {
            task_id: tid("t"),
            generation: 1,
            name: "taskbox-t-g1".into(),
            source_snapshot: None,
            timeout_ms: 300_000,
            installation_id: "inst".into(),
        };
        let sb = sim.create_sandbox(&spec).await.expect("create");
        let first = {
            let sim = sim.clone();
            let id = sb.id.clone();
            tokio::spawn(async move { sim.snapshot(&tid("t"), &id, 1).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        sim.set_faults(SimFaults {
            snapshot_fail_permanent: 1.0,
            ..SimFaults::none()
        });
        let err = sim
            .snapshot(&tid("t"), &sb.id, 1)
            .await
            .expect_err("a snapshot is under way");
        assert!(matches!(err.kind, FailureKind::Transient { .. }), "{err:?}");
        assert!(err.message.contains("sandbox_snapshotting"), "{err}");
        let snap = first.await.expect("join").expect("the first completes");
        let again = sim.snapshot(&tid("t"), &sb.id, 1).await.expect("same key");
        assert_eq!(again.id, snap.id);
        let ids: BTreeSet<String> = sim.snapshots().into_iter().map(|s| s.id).collect();
        assert_eq!(ids.len(), 1);
    });
}

/// Over HTTP, the platform stops a live sandbox while the engine is dead after a crash (a
/// persistent sandbox snapshots itself as it stops): the restarted engine restores the newest
/// files from the platform's snapshot. Clean as it is; with the platform's snapshot ignored
/// (a planted bug), the restore check catches the older restore.
#[test]
fn over_http_files_come_back_from_the_platforms_snapshot_after_an_engine_death() {
    let (mut opts, _work) = options(11, 3, 3);
    opts.http = true;
    opts.jobs = 1;
    opts.faults = ChaosFaults::none();
    opts.faults.crash = 0.5;
    let report = chaos::run(&opts, &no_progress).expect("http chaos run");
    assert_eq!(report.totals.violations, 0, "{:#?}", report.violating_seeds);
    let stops = report
        .totals
        .counts
        .faults
        .get("platform_stop_while_dead")
        .copied()
        .unwrap_or(0);
    assert!(stops > 0, "{:?}", report.totals.counts.faults);

    opts.planted_bug = Some(PlantedBug::IgnorePlatformSnapshot);
    let report = chaos::run(&opts, &no_progress).expect("http chaos run");
    assert!(
        report.violating_seeds.iter().any(|s| s
            .violations
            .iter()
            .any(|v| v.invariant == Invariant::RestoredLatest)),
        "ignoring the platform's snapshot went unnoticed: {:?}",
        report.totals
    );
    for s in &report.violating_seeds {
        if let Some(h) = &s.home {
            let _ = std::fs::remove_dir_all(h);
        }
    }
}

/// Forks over HTTP: the workload forks tasks (and runs a command in each fork, restoring the
/// parent's snapshot through the real client), under every fault and crashes, and the
/// fork-source and deleted-while-referenced checks hold against the fake server's records.
/// Every journal re-drives identically although requests and outcomes came in real time (a
/// timer whose time passed goes before them), the sessions' usage reads included.
#[test]
fn over_http_forks_restore_their_parents_snapshot_and_no_shared_snapshot_is_deleted() {
    let (mut opts, work) = options(1, 3, 6);
    opts.http = true;
    opts.jobs = 1;
    opts.keep_all = true;
    let report = chaos::run(&opts, &no_progress).expect("http chaos run");
    assert_eq!(report.totals.violations, 0, "{:#?}", report.violating_seeds);
    assert!(
        report.totals.counts.journal.forks > 0,
        "the workload forked no task: {:?}",
        report.totals.counts
    );
    assert!(
        report.totals.counts.journal.restores > 0,
        "{:?}",
        report.totals
    );
    let (journals, tasks, forks) = redrive_every_journal(work.path());
    assert_eq!(journals, 3, "every seed's journal was kept");
    assert!(
        forks > 0 && tasks >= 3 * 6 + forks,
        "{tasks} tasks, {forks} forks"
    );
}

/// Re-drives every task of every seed's journal kept under `work`, each identically (every
/// call made as recorded); returns how many journals, tasks and forks.
fn redrive_every_journal(work: &std::path::Path) -> (usize, usize, usize) {
    let mut journals = 0;
    let mut forks = 0;
    let mut tasks = 0;
    for dir in std::fs::read_dir(work).expect("work dir") {
        let path = dir.expect("entry").path().join("journal.jsonl");
        if !path.exists() {
            continue;
        }
        journals += 1;
        let file = taskbox::replay::export::read_journal(std::io::BufReader::new(
            std::fs::File::open(&path).expect("journal"),
        ))
        .expect("reads");
        let reports = taskbox::replay::redrive::redrive(&file.entries)
            .unwrap_or_else(|e| panic!("{}: {:#}", path.display(), anyhow::Error::new(e)));
        for r in &reports {
            assert!(
                r.divergence.is_none(),
                "{} {}: {}",
                path.display(),
                r.task_id,
                r.divergence
                    .as_ref()
                    .map_or(String::new(), |d| d.to_string())
            );
            assert_eq!(r.calls_made, r.calls_expected, "{}", r.task_id);
        }
        tasks += reports.len();
        forks += file
            .entries
            .iter()
            .filter(|e| matches!(e.event, taskbox::core::Event::Forked { .. }))
            .count();
    }
    (journals, tasks, forks)
}

/// `replay --redrive` takes a chaos run's journals, forks included: every task of every seed
/// re-drives identically, one at a time (a child from its recorded lineage, a parent's fork
/// requests re-driven, a snapshot released to a fork released again without a call), under
/// faults and crashes. On the simulator, whose virtual time the re-drive's clock reproduces.
#[test]
fn simulated_journals_with_forks_redrive_identically() {
    let (mut opts, work) = options(1, 4, 6);
    opts.keep_all = true;
    let report = chaos::run(&opts, &no_progress).expect("chaos run");
    assert_eq!(report.totals.violations, 0, "{:#?}", report.violating_seeds);
    let (journals, tasks, forks) = redrive_every_journal(work.path());
    assert_eq!(journals, 4, "every seed's journal was kept");
    assert!(forks > 0, "no fork was re-driven");
    assert_eq!(
        forks as u64, report.totals.counts.journal.forks,
        "the forks the report counts are the ones re-driven"
    );
    assert!(tasks >= 4 * 6 + forks, "every task and fork was re-driven");
}

/// The same faults one level down: the real Vercel client against an in-process fake Vercel
/// server, real sockets and real time (a few seconds per seed). Clean without a planted bug,
/// caught with one.
#[test]
fn over_http_the_vercel_client_holds_the_invariants_and_the_planted_bug_is_caught() {
    let (mut opts, _work) = options(1, 1, 3);
    opts.http = true;
    opts.jobs = 1;
    let report = chaos::run(&opts, &no_progress).expect("http chaos run");
    assert!(report.http);
    assert!(report.digest.is_empty(), "real time has no digest");
    assert_eq!(report.totals.violations, 0, "{:#?}", report.violating_seeds);
    assert!(report.totals.counts.provider_calls > 0 && report.totals.counts.journal.entries > 0);
    assert!(
        report.totals.counts.faults.values().sum::<u64>() > 0,
        "{:?}",
        report.totals.counts.faults
    );
    assert!(
        report.totals.counts.journal.restores > 0,
        "{:?}",
        report.totals
    );

    // Without faults, so that nothing but the planted bug can interfere; seed 3, whose
    // workload restores a task that has two snapshots to choose from (where the oldest is not
    // the newest).
    opts.faults = ChaosFaults::none();
    opts.first_seed = 3;
    opts.planted_bug = Some(PlantedBug::OldestRestore);
    let report = chaos::run(&opts, &no_progress).expect("http chaos run");
    assert!(
        report.totals.violations > 0,
        "the planted bug went unnoticed"
    );
    let seed = &report.violating_seeds[0];
    assert!(
        seed.violations
            .iter()
            .any(|v| v.invariant == Invariant::RestoredLatest),
        "{:?}",
        seed.violations
    );
    assert!(seed.repro.contains(" --http"), "{}", seed.repro);
    // The kept data moved off the RAM disk; remove it.
    for s in &report.violating_seeds {
        if let Some(h) = &s.home {
            let _ = std::fs::remove_dir_all(h);
        }
    }
}

/// `taskbox chaos --fleet`: three engines sharing one PostgreSQL store, with crashes and lease
/// expiries (the database expiring an engine's leases behind its back while another engine is
/// asked for the task): every invariant holds, one-writer-per-token among them, tasks are taken
/// over with newer tokens, and the seed's scratch database is dropped once it is clean.
#[test]
fn a_fleet_of_engines_on_one_postgres_holds_every_invariant_with_takeovers() {
    let Some(db) = crate::pg::database() else {
        return;
    };
    let (mut opts, _work) = options(1, 2, 4);
    opts.jobs = 1;
    opts.faults = ChaosFaults::moderate_fleet();
    opts.faults.crash = 0.1;
    opts.faults.lease_expiry = 0.3;
    opts.fleet = Some(chaos::FleetOptions {
        engines: 3,
        store: db.url.clone(),
    });
    let report = chaos::run(&opts, &no_progress).expect("run");
    assert!(report.is_clean(), "{:#?}", report.violating_seeds);
    assert_eq!(report.seeds_run, 2);
    assert_eq!(report.fleet, Some(3));
    let t = &report.totals.counts;
    assert!(t.takeovers > 0, "{t:?}");
    assert!(
        t.faults.get("lease_expiry").copied().unwrap_or(0) > 0,
        "{t:?}"
    );
    assert!(t.journal.entries > 0, "{t:?}");
    assert!(report.digest.is_empty(), "real time: no digest");

    // Nothing left behind: the seeds' scratch databases are dropped.
    let left = crate::pg::query_text(
        &db.url,
        &format!(
            "SELECT count(*)::text FROM pg_database WHERE datname LIKE 'taskbox_chaos_{}_%'",
            std::process::id()
        ),
    );
    assert_eq!(left.as_deref(), Some("0"));

    // The CLI: --fleet needs a PostgreSQL --store, and says so.
    let home = Home::new();
    let out = home.run(&["chaos", "--fleet", "3"]);
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--store postgres://"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("hint:"), "{}", stderr(&out));
    let out = home.run(&["chaos", "--fleet", "1", "--store", &db.url]);
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("invalid --fleet 1"),
        "{}",
        stderr(&out)
    );
    // A repro command names the fleet and the store, without a password.
    opts.fleet = Some(chaos::FleetOptions {
        engines: 3,
        store: "postgres://tb:s3cret@db/x".into(),
    });
    let repro = opts.repro_command(7);
    assert!(repro.contains("--fleet 3 --store"), "{repro}");
    assert!(repro.contains("lease_expiry=0.3"), "{repro}");
    assert!(!repro.contains("s3cret"), "{repro}");
}

/// Checkpoints and rewinds are among the workload's operations (issue 34): on the simulated
/// platform each checkpoint stops the sandbox (`stopped`), and after each rewind the next
/// command sees exactly the files of the snapshot rewound to (the platform's record), the
/// snapshot it saved holds the files from before, and a rewind to that one gives them back.
/// A planted "rewind restores the latest snapshot instead of the one named" is caught by
/// rewind-restores, and the same seeds are clean without it.
#[test]
fn a_rewind_restores_exactly_the_snapshot_named_and_a_planted_latest_restore_is_caught() {
    let (mut opts, _work) = options(1, 8, 6);
    let clean = chaos::run(&opts, &no_progress).expect("chaos run");
    assert_eq!(clean.totals.violations, 0, "{:#?}", clean.violating_seeds);
    let counts = &clean.totals.counts;
    assert!(
        counts.checkpoints > 0 && counts.rewinds > 0 && counts.rewinds_checked > 0,
        "the workload checkpointed or rewound nothing, or checked no rewind: {counts:?}"
    );

    opts.planted_bug = Some(PlantedBug::RewindLatest);
    let report = chaos::run(&opts, &no_progress).expect("chaos run");
    let caught: Vec<_> = report
        .violating_seeds
        .iter()
        .flat_map(|s| &s.violations)
        .filter(|v| v.invariant == Invariant::RewindRestores)
        .collect();
    assert!(
        !caught.is_empty(),
        "the planted bug went unnoticed: {:#?}",
        report.violating_seeds
    );
    assert!(
        caught[0].detail.contains("but the next command saw")
            || caught[0].detail.contains("which an earlier rewind saved"),
        "{}",
        caught[0].detail
    );
    let first = &report.violating_seeds[0];
    assert!(
        first.repro.ends_with("' --planted-bug rewind-latest"),
        "{}",
        first.repro
    );
    for s in &report.violating_seeds {
        if let Some(h) = &s.home {
            let _ = std::fs::remove_dir_all(h);
        }
    }
    assert_eq!(
        "rewind-latest".parse::<PlantedBug>(),
        Ok(PlantedBug::RewindLatest)
    );
}
