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

    for r in rows {
        let name = r["name"].as_str().unwrap_or_default();
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
    for name in ["overhead.library", "overhead.cli"] {
        let r = rows.iter().find(|r| r["name"] == name).expect("present");
        number(&r["added"]["value"], &format!("{name} added"));
    }
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
