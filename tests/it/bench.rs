//! `taskbox bench`: the quick run completes and reports every benchmark with a baseline measured
//! beside it and a ratio. No timing is asserted here — speed targets live in the benchmark's own
//! output (and debug builds say little about speed).

use std::collections::BTreeSet;

use crate::support::{ok, stderr, stdout, Home};

fn number(v: &serde_json::Value, what: &str) -> f64 {
    let n = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is a number, got {v}"));
    assert!(n.is_finite(), "{what} is finite, got {n}");
    n
}

#[test]
fn the_quick_run_reports_every_benchmark_with_a_baseline_and_a_ratio() {
    let home = Home::new();
    let scratch = home.path().join("scratch");
    // `journal.postgres` and the `fleet` rows run against the test PostgreSQL (skipped without
    // one, except under CI).
    let pg = crate::pg::database();
    let mut cmd = home.cmd();
    cmd.args(["bench", "--quick", "--json", "--scratch"])
        .arg(&scratch);
    if let Some(db) = &pg {
        cmd.args(["--postgres", &db.url]);
    }
    let out = cmd.output().expect("spawn taskbox");
    let text = ok(&out);
    let report: serde_json::Value = serde_json::from_str(&text).expect("JSON on stdout");
    assert_eq!(report["mode"], "quick");
    let command = match &pg {
        Some(db) => format!("taskbox bench --quick --postgres {}", db.url),
        None => "taskbox bench --quick".to_string(),
    };
    assert_eq!(report["command"], command.as_str());

    let rows = report["benchmarks"]
        .as_array()
        .expect("a list of benchmarks");
    let names: BTreeSet<&str> = rows
        .iter()
        .map(|r| r["name"].as_str().expect("a name"))
        .collect();
    let expected: BTreeSet<&str> = taskbox::bench::NAMES
        .into_iter()
        .filter(|n| pg.is_some() || !(*n == "journal.postgres" || n.starts_with("fleet.")))
        .collect();
    assert_eq!(names, expected, "every benchmark, once");
    assert_eq!(rows.len(), expected.len());

    // Without `bwrap` (outside CI) its row says so and has no figures.
    let bwrap = std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok();
    for r in rows {
        let name = r["name"].as_str().unwrap_or_default();
        if name == "overhead.cli_isolated_bwrap" && !bwrap {
            assert!(r["baseline"]["value"].is_null(), "{r}");
            assert!(
                r["notes"][0]
                    .as_str()
                    .is_some_and(|n| n.contains("`bwrap` is not installed")),
                "{r}"
            );
            continue;
        }
        let subject = number(&r["subject"]["value"], &format!("{name} subject"));
        let baseline = number(&r["baseline"]["value"], &format!("{name} baseline"));
        assert!(baseline > 0.0, "{name}: a baseline was measured: {r}");
        assert!(subject >= 0.0, "{name}: {r}");
        let ratio = number(&r["ratio"], &format!("{name} ratio"));
        assert!(
            (ratio - subject / baseline).abs() <= 1e-9 * ratio.abs().max(1.0),
            "{name}: the ratio is subject / baseline: {r}"
        );
        for key in ["subject_is", "baseline_is", "target_text"] {
            assert!(
                !r[key].as_str().unwrap_or_default().is_empty(),
                "{name}: {key} says what was measured: {r}"
            );
        }
        assert_eq!(
            r["subject"]["unit"], r["baseline"]["unit"],
            "{name}: both sides in one unit"
        );
        assert!(r["samples"].as_u64().unwrap_or(0) >= 1, "{name}: {r}");
        // `met` is true or false for a target, null for a reported figure.
        match r["target"]["kind"].as_str() {
            Some("report") => assert!(r["met"].is_null(), "{name}: {r}"),
            Some(_) => assert!(r["met"].is_boolean(), "{name}: {r}"),
            None => panic!("{name}: no target: {r}"),
        }
    }

    // The per-command rows carry the paired difference the target is about.
    let mut per_command = vec![
        "overhead.library",
        "overhead.cli",
        "overhead.cli_isolated",
        "overhead.first_command_isolated",
    ];
    if bwrap {
        per_command.push("overhead.cli_isolated_bwrap");
    }
    for name in per_command {
        let r = rows.iter().find(|r| r["name"] == name).expect("present");
        number(&r["added"]["value"], &format!("{name} added"));
    }
    // The scale child stayed under its open-files limit, the target of its descriptor row.
    let fds = rows
        .iter()
        .find(|r| r["name"] == "scale.peak_descriptors")
        .expect("present");
    assert_eq!(fds["met"], true, "{fds}");
    assert!(
        number(&fds["subject"]["value"], "descriptors") >= 1.0,
        "{fds}"
    );
    // Request counts come from the fake server's side and are exact.
    let per_command = rows
        .iter()
        .find(|r| r["name"] == "vercel.per_command")
        .expect("present");
    assert!(number(&per_command["subject"]["value"], "requests") >= 1.0);

    let env = &report["environment"];
    assert!(env["cpus"].as_u64().unwrap_or(0) >= 1);
    assert!(env["build"] == "debug" || env["build"] == "release");
    // Progress went to stderr, and the scratch data is gone.
    assert!(stderr(&out).contains("bench: scale"), "{}", stderr(&out));
    let left: Vec<_> = std::fs::read_dir(&scratch)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "scratch directories were removed: {left:?}"
    );
}

#[test]
fn the_table_shows_subject_baseline_ratio_target_and_result() {
    let home = Home::new();
    let out = home
        .cmd()
        .args(["bench", "--quick", "--only", "vercel", "--scratch"])
        .arg(home.path())
        .output()
        .expect("spawn taskbox");
    let text = ok(&out);
    let header = text.lines().next().unwrap_or_default();
    for col in [
        "benchmark",
        "subject",
        "baseline",
        "ratio",
        "target",
        "result",
    ] {
        assert!(header.contains(col), "{col} in {header:?}");
    }
    let row = text
        .lines()
        .find(|l| l.starts_with("vercel.per_command "))
        .unwrap_or_else(|| panic!("a vercel.per_command row in:\n{text}"));
    assert!(row.contains("requests") && row.contains('×'), "{row}");
    assert!(text.lines().any(|l| l.starts_with("vercel.lifecycle ")));
    assert!(
        !text.contains("overhead."),
        "--only ran only the vercel group:\n{text}"
    );
    assert!(text.contains("reproduce: taskbox bench --quick --only vercel"));
}

#[test]
fn an_unknown_benchmark_name_is_refused_with_the_known_ones() {
    let home = Home::new();
    let out = home.run(&["bench", "--quick", "--only", "speed"]);
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(stdout(&out).is_empty());
    let err = stderr(&out);
    assert!(err.contains("error: unknown benchmark `speed`"), "{err}");
    assert!(
        err.contains("hint:") && err.contains("overhead.cli") && err.contains("snapshot"),
        "{err}"
    );
}

/// The scale child runs more tasks than its open-files limit would hold all at once (two
/// descriptors per task the engine drives): it keeps fewer in flight and finishes them all.
#[test]
fn the_scale_child_keeps_its_tasks_in_flight_under_the_open_files_limit() {
    let home = Home::new();
    let scratch = home.path().join("scratch");
    std::fs::create_dir_all(&scratch).expect("make the scratch directory");
    let exe = env!("CARGO_BIN_EXE_taskbox");
    let mut cmd = home.cmd_of(std::path::Path::new("bash"));
    // Bounded: a child that ran out of descriptors would wait at the limit.
    cmd.args(["-c", "ulimit -n 1024 && exec timeout 300 \"$0\" \"$@\""])
        .arg(exe)
        .args(["bench", "--child", "engine", "--tasks", "700", "--scratch"])
        .arg(&scratch);
    let out = cmd.output().expect("spawn bash");
    let run: serde_json::Value = serde_json::from_str(&ok(&out)).expect("JSON on stdout");
    assert_eq!(run["tasks"], 700, "{run}");
    assert_eq!(run["fd_limit"], 1024, "{run}");
    let in_flight = run["in_flight"].as_u64().expect("a count");
    assert!((1..350).contains(&in_flight), "{run}");
    let peak = run["peak_fds"].as_u64().expect("a count");
    assert!(peak >= 2 * in_flight.min(50) && peak < 1024, "{run}");
    // Six transitions a task at least: made, two commands, two suspends, a restore.
    assert!(run["transitions"].as_u64().unwrap_or(0) >= 6 * 700, "{run}");
}
