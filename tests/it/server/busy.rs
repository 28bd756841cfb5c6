//! Activity-aware idle and the resources of a sandbox, end to end through the server's own
//! timers: a sandbox whose processes keep working is not snapshotted for idleness (until
//! `terminal.max_busy_seconds`), one whose processes sleep is, as before; `show --json` reports
//! what its processes used. Each runs with isolation on and off.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::ServerHome;
use crate::support::{ok, stderr, stdout, wait_for};

fn show(h: &ServerHome, task: &str) -> Value {
    serde_json::from_str(&stdout(&h.home.run(&["show", task, "--json"]))).unwrap_or(Value::Null)
}

fn millis(v: &Value) -> u64 {
    let text = v.as_str().unwrap_or_else(|| panic!("a time: {v}"));
    let t = humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    t.duration_since(SystemTime::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as u64
}

/// The journal entry that began the task's snapshot: (its time, the task's last command's time,
/// the rule that fired).
fn snapshot_began(shown: &Value) -> Option<(u64, u64, String)> {
    let journal = shown["journal"].as_array()?;
    let e = journal
        .iter()
        .rev()
        .find(|e| e["state_after"] == "snapshotting" && e["state_before"] == "running")?;
    let t = &e["task_after"];
    Some((
        millis(&e["at"]),
        millis(&t["last_activity"]),
        t["snapshot_reason"]["kind"].as_str()?.to_string(),
    ))
}

/// The test: a background `yes` keeps its sandbox past `terminal.lifetime_seconds` up
/// to `terminal.max_busy_seconds`, then the busy cap snapshots it; a background `sleep` does
/// not keep its sandbox (the idle rule snapshots it after the lifetime).
#[test]
fn a_busy_sandbox_lives_past_its_lifetime_up_to_max_busy_and_a_sleeping_one_does_not() {
    let lifetime_ms = 2_000;
    let max_busy_ms = 8_000;
    for mode in crate::support::isolation_modes("a_busy_sandbox_lives_past_its_lifetime") {
        let h = ServerHome::new();
        for (k, v) in [
            ("terminal.local_isolation", mode),
            ("terminal.lifetime_seconds", "2"),
            ("terminal.max_busy_seconds", "8"),
            // Deadlines far away: only the idle rules may fire.
            ("terminal.sandbox_timeout_seconds", "120"),
            ("terminal.max_sandbox_lifetime_seconds", "240"),
        ] {
            ok(&h.home.run(&["config", "set", k, v]));
        }
        ok(&h.home.run(&[
            "run",
            "-t",
            "busy",
            "--",
            "timeout 30 yes > /dev/null 2>&1 &",
        ]));
        ok(&h
            .home
            .run(&["run", "-t", "sleepy", "--", "sleep 30 > /dev/null 2>&1 &"]));
        let snapshotted = |task: &str| {
            wait_for(Duration::from_secs(60), || {
                let shown = show(&h, task);
                (shown["task"]["state"] == "expired")
                    .then(|| snapshot_began(&shown))
                    .flatten()
            })
            .unwrap_or_else(|| panic!("{mode}: {task} was never snapshotted: {}", show(&h, task)))
        };
        let (at, last_command, rule) = snapshotted("sleepy");
        assert_eq!(rule, "idle_reap", "{mode}: a sleeping sandbox is idle");
        let idle_for = at - last_command;
        assert!(
            (lifetime_ms..max_busy_ms).contains(&idle_for),
            "{mode}: the sleeping sandbox was snapshotted {idle_for} ms after its command"
        );
        let (at, last_command, rule) = snapshotted("busy");
        assert_eq!(rule, "busy_cap", "{mode}: the busy cap fired");
        let kept = at - last_command;
        // At the cap, not at the lifetime, and not once `yes` ended (30 s) and idle followed.
        assert!(
            (max_busy_ms..max_busy_ms + 10_000).contains(&kept),
            "{mode}: the busy sandbox was snapshotted {kept} ms after its command"
        );
        // The samples are in the journals, which replay as they were recorded.
        for task in ["busy", "sleepy"] {
            let o = h.home.run(&["replay", task]);
            assert!(
                ok(&o).contains("replays cleanly") || stderr(&o).contains("replays cleanly"),
                "{mode}: {task}: {}{}",
                stdout(&o),
                stderr(&o)
            );
        }
    }
}

/// A command that burns CPU and allocates memory shows both in `show --json` once its sandbox
/// generation ended (read from its cgroups just before its snapshot stopped its processes, and
/// journaled with it), and `cost --json` reports the same; with isolation off the machine's
/// cgroup v2 may account CPU time only, and memory is then said not measured (`null`).
#[test]
fn show_and_cost_report_the_cpu_time_and_peak_memory_of_a_sandbox_generation() {
    for mode in crate::support::isolation_modes("show_and_cost_report_the_cpu_time") {
        let h = ServerHome::new();
        ok(&h
            .home
            .run(&["config", "set", "terminal.local_isolation", mode]));
        // 0.4 s of CPU at least (a busy loop), and 50 MB held at once by one shell.
        let burn = "end=$(( $(date +%s%N) + 400000000 )); \
                    while [ $(date +%s%N) -lt $end ]; do :; done; \
                    v=$(head -c 50000000 /dev/zero | tr '\\0' x); echo ${#v}";
        let out = ok(&h.home.run(&["run", "-t", "burn", "--", burn]));
        assert_eq!(out.trim(), "50000000", "{mode}");
        ok(&h.home.run(&["suspend", "burn"]));
        let shown = show(&h, "burn");
        let r = &shown["cost"]["resources"];
        let cpu = r["cpu_seconds"]
            .as_f64()
            .unwrap_or_else(|| panic!("{mode}: {shown}"));
        assert!(cpu >= 0.2, "{mode}: cpu {cpu} s: {r}");
        match r["memory_peak_bytes"].as_u64() {
            Some(peak) => assert!(peak >= 40_000_000, "{mode}: peak {peak}: {r}"),
            None => assert_eq!(
                mode, "none",
                "an isolated sandbox's memory is measured: {r}"
            ),
        }
        let generation = &r["generations"][0];
        assert_eq!(generation["generation"], 1, "{mode}: {r}");
        assert_eq!(generation["ended"], true, "{mode}: {r}");
        // The human view says it too, and `cost --json` has the same figures.
        let text = stdout(&h.home.run(&["show", "burn"]));
        assert!(text.contains("resources:   cpu "), "{mode}: {text}");
        let cost: Value =
            serde_json::from_str(&stdout(&h.home.run(&["cost", "burn", "--json"]))).expect("json");
        let found = serde_json::to_string(&cost).expect("json");
        assert!(
            found.contains(&format!("\"cpu_seconds\":{cpu}")),
            "{mode}: {found}"
        );
    }
}
