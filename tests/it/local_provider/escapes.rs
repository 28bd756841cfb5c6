//! Issue 12, item 16: processes that leave the sandbox's process group (`setsid`), clear their
//! environment (`env -i`) or unset `TASKBOX_WORKSPACE` do not survive a suspend: each local
//! sandbox's commands run in its own cgroup v2, killed whole on stop.
//!
//! The subject is the *unisolated* local sandbox's cgroup (an isolated sandbox needs none: its
//! PID namespace ends with it; `isolation::a_snapshot_ends_every_process_and_restores_at_the_same_path`
//! holds it to the same promise), so every home here sets `terminal.local_isolation = none`.

use std::time::Duration;

use taskbox::provider::local::cgroup;

use crate::support::{skip, stderr, stdout, under_ci, Home};

/// A home whose sandboxes run unisolated (`terminal.local_isolation = none`), the mode whose
/// cgroup these tests are about.
fn unisolated_home() -> Home {
    let home = Home::new();
    let out = home.run(&["config", "set", "terminal.local_isolation", "none"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    home
}

/// Whether `pid` is a live process (a zombie waiting for its parent counts as dead).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

#[test]
fn processes_that_leave_the_process_group_do_not_survive_suspend() {
    if !cgroups_or_skip() {
        return;
    }
    let home = unisolated_home();
    let pids = home.path().join("pids");
    let pids_arg = pids.to_str().expect("utf-8 path");
    // Three escapes: a new session, a new session with an empty environment, and a
    // double-forked process without TASKBOX_WORKSPACE.
    let script = format!(
        "setsid bash -c 'echo $$ >> {pids_arg}; exec sleep 1000' >/dev/null 2>&1 & \
         env -i /usr/bin/env setsid bash -c 'echo $$ >> {pids_arg}; exec sleep 1000' >/dev/null 2>&1 & \
         (unset TASKBOX_WORKSPACE; bash -c 'echo $$ >> {pids_arg}; exec sleep 1000' >/dev/null 2>&1 &) ; \
         for i in $(seq 100); do [ \"$(wc -l < {pids_arg} 2>/dev/null)\" = 3 ] && break; sleep 0.05; done; \
         echo started"
    );
    let out = home.run(&["run", "-t", "escape", "--", &script]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("started"), "{}", stdout(&out));
    let started: Vec<u32> = std::fs::read_to_string(&pids)
        .expect("pid file")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert_eq!(started.len(), 3, "{started:?}");
    // The command has returned; its escapes live on until the sandbox stops.
    assert!(started.iter().all(|p| alive(*p)), "{started:?}");
    let out = home.run(&["suspend", "escape"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut left: Vec<u32> = started.clone();
    for _ in 0..100 {
        left.retain(|p| alive(*p));
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in &left {
        // SAFETY: kill(2) takes two integers; `p` is a process this test started. Cleanup only.
        unsafe {
            libc::kill(*p as libc::pid_t, libc::SIGKILL);
        }
    }
    assert!(left.is_empty(), "processes survived the suspend: {left:?}");
    // doctor says which isolation is in force: none, a ✗, whose detail names the cgroup that
    // still ends every process on a stop.
    let doctor = home.run(&["doctor", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&stdout(&doctor)).expect("doctor json");
    let check = json["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "isolation"))
        .cloned()
        .expect("an isolation check");
    assert_eq!(check["ok"], false, "{check}");
    assert!(
        check["detail"]
            .as_str()
            .is_some_and(|d| d.contains("cgroup v2")),
        "{check}"
    );
}

/// Skips (with a message, [`skip`]) where the sandbox cgroups are not available; under CI
/// that is a failure.
fn cgroups_or_skip() -> bool {
    match cgroup::support() {
        Ok(_) => true,
        Err(why) => {
            skip(format!("the sandbox cgroups are not available: {why}"));
            false
        }
    }
}

/// The cgroup a command's shell runs in, from its `/proc/self/cgroup` (`0::/path`).
fn own_cgroup(out: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("a cgroup v2 line in {out:?}"))
        .trim()
        .to_string()
}

/// The command's shell is born in the sandbox's cgroup (`clone3` into it, not a join in its
/// script): it is in the cgroup the sandbox records, the cgroup stays between commands, a
/// command finds it again after a sweep removed it, and a suspend removes it.
#[test]
fn every_command_runs_in_the_sandbox_cgroup_which_lives_until_the_sandbox_stops() {
    if !cgroups_or_skip() {
        return;
    }
    let home = unisolated_home();
    // The shell's own script: without a join, it was born in the cgroup (`clone3`).
    let show = "cat /proc/self/cgroup; tr '\\0' ' ' < /proc/$$/cmdline";
    let out = home.run(&["run", "-t", "cg", "--", show]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let joined = own_cgroup(&stdout(&out));
    // Linux 5.7+ clones into a cgroup; CI's kernel is newer.
    if under_ci() {
        assert!(
            !stdout(&out).contains("cgroup.procs"),
            "the shell joined its cgroup instead of being born in it: {}",
            stdout(&out)
        );
    }
    let record = home.path().join("data/local/tasks/cg/cgroup");
    let recorded = std::fs::read_to_string(&record).expect("the sandbox records its cgroup");
    assert!(
        recorded.trim().ends_with(&joined),
        "the command ran in {joined}, the sandbox records {recorded}"
    );
    assert!(
        joined
            .rsplit('/')
            .next()
            .is_some_and(|n| n.starts_with("taskbox-")),
        "{joined}"
    );
    let dir = std::path::PathBuf::from(recorded.trim());
    assert!(
        dir.is_dir(),
        "the cgroup stays between commands: {}",
        dir.display()
    );
    // A sweep removes empty cgroups; the next command makes it again and joins it.
    std::fs::remove_dir(&dir).expect("remove the empty cgroup, as the sweep does");
    let out = home.run(&["run", "-t", "cg", "--", show]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(own_cgroup(&stdout(&out)), joined);
    if under_ci() {
        assert!(!stdout(&out).contains("cgroup.procs"), "{}", stdout(&out));
    }
    let out = home.run(&["suspend", "cg"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        !dir.exists(),
        "a stop removes the cgroup: {}",
        dir.display()
    );
}

/// gc removes the empty cgroups of its own installation's sandboxes, never another data dir's
/// (tests running side by side each have their own: one's gc used to take every `taskbox-*`).
#[test]
fn gc_removes_only_its_own_installations_empty_cgroups() {
    if !cgroups_or_skip() {
        return;
    }
    let (a, b) = (unisolated_home(), unisolated_home());
    let out = a.run(&["run", "-t", "mine", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let record = a.path().join("data/local/tasks/mine/cgroup");
    let recorded = std::fs::read_to_string(&record).expect("the sandbox records its cgroup");
    let dir = std::path::PathBuf::from(recorded.trim());
    assert!(dir.is_dir(), "{}", dir.display());
    let out = b.run(&["gc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        dir.is_dir(),
        "another installation's gc removed {}",
        dir.display()
    );
    let out = a.run(&["gc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!dir.exists(), "its own gc left {}", dir.display());
}

/// A command that cannot join its sandbox's cgroup runs nothing and fails with an error that
/// names the cgroup, rather than running outside it.
#[test]
fn a_command_that_cannot_join_the_cgroup_runs_nothing() {
    if !cgroups_or_skip() {
        return;
    }
    let home = unisolated_home();
    let out = home.run(&["run", "-t", "nocg", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let record = home.path().join("data/local/tasks/nocg/cgroup");
    let recorded = std::fs::read_to_string(&record).expect("the sandbox records its cgroup");
    let name = std::path::Path::new(recorded.trim())
        .file_name()
        .expect("a cgroup name")
        .to_owned();
    // The same name under a directory that is no cgroup (and does not exist): nothing can join.
    let elsewhere = home.path().join("not-a-cgroup").join(name);
    std::fs::write(&record, elsewhere.as_os_str().as_encoded_bytes()).expect("rewrite the record");
    let out = home.run(&["run", "-t", "nocg", "--", "touch ran"]);
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("could not join the sandbox's cgroup"), "{err}");
    assert!(
        !home
            .path()
            .join("data/local/tasks/nocg/workspace/ran")
            .exists(),
        "the command ran outside the cgroup"
    );
}
