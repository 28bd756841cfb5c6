//! A local sandbox in namespaces of its own (`terminal.local_isolation = namespaces`, the
//! default, issue 31): the attacks of the issue, run from inside a sandbox's command, fail —
//! under a root server and under one run by `nobody`; the sandbox's files, working directory,
//! snapshots and restores work as without isolation; a stop leaves nothing of the sandbox
//! running; the opt-out (`none`) warns and doctor marks it ✗. Skipped (with a line saying so)
//! where the kernel refuses user namespaces, except under `CI=true`, where that fails.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use taskbox::config::LocalIsolation;
use taskbox::core::Millis;
use taskbox::ids::{SandboxId, TaskId};
use taskbox::provider::local::isolation::{self, Limits, Settings};
use taskbox::provider::local::LocalProvider;
use taskbox::provider::{sandbox_name, ExecOutput, ExecRequest, SandboxProvider, SandboxSpec};

use crate::support::{tid, under_ci, ManualClock};

const START_MS: Millis = 1_700_000_000_000;
const INSTALLATION: &str = "inst-iso";

struct Env {
    dir: tempfile::TempDir,
    provider: LocalProvider,
}

/// An isolated provider, or `None` (skipped) where this machine cannot make namespaces.
fn env(test: &str) -> Option<Env> {
    env_with(test, Limits::default())
}

/// An isolated provider whose sandboxes have `limits`, or `None` as [`env`].
#[allow(clippy::print_stderr)] // a skip says so
fn env_with(test: &str, limits: Limits) -> Option<Env> {
    if let Err(e) = isolation::probe() {
        assert!(!under_ci(), "{test}: isolation must work under CI: {e}");
        eprintln!("SKIPPED {test}: {e}");
        return None;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock(AtomicU64::new(START_MS)));
    let provider = LocalProvider::new(dir.path().join("data/local"), INSTALLATION.into(), clock)
        .expect("provider")
        .with_isolation(Settings {
            mode: LocalIsolation::Namespaces,
            limits,
            ..Settings::default()
        });
    Some(Env { dir, provider })
}

impl Env {
    async fn create(&self, task: &str, generation: u64, source: Option<&str>) -> SandboxId {
        let spec = SandboxSpec {
            task_id: TaskId::new(task).expect("a valid task id"),
            generation,
            name: sandbox_name(INSTALLATION, task, generation),
            source_snapshot: source.map(taskbox::ids::SnapshotId::from),
            timeout_ms: 600_000,
            installation_id: INSTALLATION.to_string(),
        };
        self.provider
            .create_sandbox(&spec)
            .await
            .expect("create")
            .id
    }

    async fn run(&self, sandbox: &SandboxId, command: &str) -> ExecOutput {
        self.run_for(sandbox, command, 20_000).await
    }

    /// Runs `command` with a timeout of `timeout_ms`.
    async fn run_for(&self, sandbox: &SandboxId, command: &str, timeout_ms: u64) -> ExecOutput {
        let req = ExecRequest {
            command: command.to_string(),
            timeout_ms,
        };
        self.provider
            .exec(sandbox, &req)
            .await
            .unwrap_or_else(|e| panic!("`{command}` failed: {e}"))
    }

    /// Runs `command` and returns its stdout, asserting it exited 0.
    async fn ok(&self, sandbox: &SandboxId, command: &str) -> String {
        let out = self.run(sandbox, command).await;
        assert_eq!(out.exit_code, 0, "`{command}`: {out:?}");
        out.stdout
    }

    /// Asserts `command` fails (non-zero), and returns what it said.
    async fn fails(&self, sandbox: &SandboxId, command: &str) -> String {
        let out = self.run(sandbox, command).await;
        assert_ne!(out.exit_code, 0, "`{command}` must fail: {out:?}");
        format!("{}{}", out.stdout, out.stderr)
    }

    fn workspace(&self, sandbox: &SandboxId) -> PathBuf {
        self.provider.workspace_path(sandbox).expect("a workspace")
    }
}

/// The host processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(marker.len()).any(|w| w == marker.as_bytes()))
        })
        .collect()
}

/// The fields of `/proc/<pid>/stat` after its command name: state, ppid, pgrp, ...
fn stat_fields(pid: u32) -> Vec<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Each host process in process group `pgid` or whose parent is `pgid`: its pid, its
/// `/proc/<pid>/stat` fields, where it sleeps, and its signal masks.
fn group_state(pgid: u32) -> String {
    let Ok(procs) = fs::read_dir("/proc") else {
        return "(no /proc)".into();
    };
    let mut lines = Vec::new();
    for pid in procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        let fields = stat_fields(pid);
        let related = [fields.get(1), fields.get(2)]
            .iter()
            .any(|f| f.map(String::as_str) == Some(pgid.to_string().as_str()));
        if !related {
            continue;
        }
        let wchan = fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let signals: Vec<&str> = status
            .lines()
            .filter(|l| l.starts_with("Sig") || l.starts_with("ShdPnd"))
            .collect();
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        lines.push(format!(
            "{pid} {:?} wchan={wchan} {signals:?} {}",
            &fields[..fields.len().min(6)],
            String::from_utf8_lossy(&cmdline).replace('\0', " ")
        ));
    }
    lines.join("\n")
}

/// An isolated command's shell is the server's own child (no copy of the server waits between
/// them, see `isolation::enter`), leads its own process group, and starts with no signal
/// blocked and `SIGPIPE` at its default (though the server ignores it); a signal to its group
/// from outside ends it with the signal's exit code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_command_is_the_servers_own_child() {
    let Some(env) = env("own-child") else {
        return;
    };
    let env = Arc::new(env);
    let id = env.create("own-child", 1, None).await;
    let out = env
        .ok(
            &id,
            "grep -E '^SigBlk:' /proc/self/status; yes | head -c1 >/dev/null; \
             echo pipe=${PIPESTATUS[0]}",
        )
        .await;
    assert_eq!(out, "SigBlk:\t0000000000000000\npipe=141\n");
    let marker = "taskbox-own-child-marker";
    let running = {
        let (env, id) = (env.clone(), id.clone());
        tokio::spawn(async move { env.run(&id, &format!("sleep 30 # {marker}")).await })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let shell = loop {
        if let [pid] = processes_with(marker)[..] {
            break pid;
        }
        assert!(std::time::Instant::now() < deadline, "the shell never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let fields = stat_fields(shell);
    assert_eq!(
        fields.get(1).map(String::as_str),
        Some(std::process::id().to_string().as_str()),
        "the shell's parent is this process (the server): {fields:?}"
    );
    assert_eq!(
        fields.get(2).map(String::as_str),
        Some(shell.to_string().as_str()),
        "the shell leads its own group: {fields:?}"
    );
    // SAFETY: killpg(2) takes two integers; the group is the running shell's, whose exec has
    // not returned (so it is not reaped and the id is still its own).
    unsafe {
        libc::killpg(shell as libc::pid_t, libc::SIGTERM);
    }
    let mut running = running;
    let Ok(out) = tokio::time::timeout(Duration::from_secs(20), &mut running).await else {
        // What still runs, for a failure that says why (the shell, what it started).
        panic!(
            "the command did not end on the signal in 20 s; its group and the shell's \
             children:\n{}",
            group_state(shell)
        );
    };
    let out = out.expect("the command's task");
    assert_eq!(out.exit_code, 128 + libc::SIGTERM, "{out:?}");
}

/// Who a command is, where it is, what it may do, and what it sees of its environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_runs_unprivileged_in_the_workspace_with_a_clean_environment() {
    let Some(env) = env("identity") else { return };
    let id = env.create("ident", 1, None).await;
    let out = env
        .ok(
            &id,
            "id -u; id -g; pwd; echo $TASKBOX_WORKSPACE; echo $HOME; hostname",
        )
        .await;
    assert_eq!(
        out,
        "1000\n1000\n/workspace\n/workspace\n/workspace\ntaskbox\n"
    );
    // no_new_privs and the seccomp filter, always.
    let status = env
        .ok(&id, "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status")
        .await;
    assert_eq!(status, "NoNewPrivs:\t1\nSeccomp:\t2\n", "{status}");
    // No capability survives the exec (uid 1000 inside, not root).
    let caps = env.ok(&id, "grep CapEff /proc/self/status").await;
    assert_eq!(caps.trim(), "CapEff:\t0000000000000000");
    // The environment is PATH, HOME, LANG, TERM and TASKBOX_*, nothing of this process's.
    let vars = env.ok(&id, "env | cut -d= -f1 | sort").await;
    for var in vars.lines() {
        assert!(
            matches!(
                var,
                "PATH" | "HOME" | "LANG" | "TERM" | "PWD" | "SHLVL" | "_"
            ) || var.starts_with("TASKBOX_"),
            "the server's environment reached the command: {var}\n{vars}"
        );
    }
    // A file written inside is in the host's workspace; the working directory is kept.
    env.ok(&id, "mkdir -p sub && echo hi > sub/f && cd sub")
        .await;
    assert_eq!(
        fs::read_to_string(env.workspace(&id).join("sub/f")).unwrap(),
        "hi\n"
    );
    assert_eq!(env.ok(&id, "pwd").await, "/workspace/sub\n");
    // Denied system calls: new namespaces, mounts, ptrace.
    let said = env.fails(&id, "unshare -U true").await;
    assert!(said.contains("Operation not permitted"), "{said}");
    env.fails(&id, "mount -t tmpfs x /tmp").await;
}

/// The issue's attacks on the host, another task and the server: each fails from inside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attacks_on_the_host_and_other_tasks_fail() {
    let Some(env) = env("attacks") else { return };
    let outside = env.dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), "host secret").unwrap();
    let root = env.provider.root().to_path_buf();
    // A listener on the host's loopback, and a server socket in the data dir.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let socket = root.join("serve.sock");
    let _unix = std::os::unix::net::UnixListener::bind(&socket).unwrap();

    let victim = env.create("victim", 1, None).await;
    env.ok(&victim, "echo mine > v.txt").await;
    let victim_ws = env.workspace(&victim);
    let id = env.create("attacker", 1, None).await;
    let q = |p: &Path| taskbox::shell::quote(&p.to_string_lossy());

    // Secrets of the host: /etc/shadow is empty, a file outside is not there.
    assert_eq!(env.ok(&id, "cat /etc/shadow; cat /etc/gshadow").await, "");
    env.fails(&id, &format!("cat {}", q(&outside.join("secret"))))
        .await;
    env.fails(&id, "ls /root").await;
    if Path::new("/etc/ssl/private").is_dir() {
        assert_eq!(env.ok(&id, "ls -A /etc/ssl/private").await, "");
    }
    env.fails(&id, "ls /home/*/").await;
    // Writing outside the workspace.
    for target in ["/usr/x", "/etc/x", "/x", "/bin/x"] {
        env.fails(&id, &format!("touch {target}")).await;
    }
    env.fails(&id, &format!("touch {}", q(&outside.join("x"))))
        .await;
    assert!(!outside.join("x").exists());
    // The data dir: another task's workspace, the snapshot store, the journal, the socket.
    env.fails(&id, &format!("ls {}", q(&root))).await;
    env.fails(&id, &format!("echo evil > {}", q(&victim_ws.join("v.txt"))))
        .await;
    env.fails(&id, "echo evil > ../../victim/workspace/v.txt")
        .await;
    assert_eq!(
        fs::read_to_string(victim_ws.join("v.txt")).unwrap(),
        "mine\n"
    );
    env.fails(&id, &format!("test -e {}", q(&socket))).await;
    // The init's memory and environment are a copy of the server's: unreadable.
    env.fails(&id, "cat /proc/1/environ").await;
    env.fails(&id, "head -c1 /proc/1/mem").await;
    // Signalling the server: its pid is not in the sandbox.
    env.fails(&id, &format!("kill -0 {}", std::process::id()))
        .await;
    // Host processes: only the sandbox's own are visible (its init, this shell, `ls`...).
    let pids = env.ok(&id, "ls /proc | grep -c '^[0-9]'").await;
    let visible: u32 = pids.trim().parse().unwrap();
    assert!(visible <= 4, "{visible} processes visible");
    // The host's loopback services.
    let said = env
        .fails(&id, &format!("exec 3<>/dev/tcp/127.0.0.1/{port}"))
        .await;
    assert!(
        said.contains("refused") || said.contains("unreachable"),
        "{said}"
    );
    // Its own loopback works.
    env.ok(
        &id,
        "test \"$(cat /sys/class/net/lo/operstate 2>/dev/null || echo up)\" != down",
    )
    .await;
    // Moving itself out of its cgroup: no cgroup file system to write to.
    env.fails(&id, "echo $$ > /sys/fs/cgroup/cgroup.procs")
        .await;
    // The kernel's knobs (checked against the global root's uid, which the sandbox's is when
    // the server runs as root): read-only or masked. `test -w` asks without writing.
    for knob in [
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/vm/drop_caches",
        "/proc/sys/kernel/hostname",
    ] {
        env.fails(&id, &format!("test -w {knob}")).await;
    }
    // Masked where the kernel has them (`/dev/null` bound over each).
    for file in ["/proc/sysrq-trigger", "/proc/kcore", "/proc/timer_list"] {
        env.ok(&id, &format!("test ! -e {file} || test -c {file}"))
            .await;
    }
    // The kernel's interfaces that could reach the host.
    env.fails(&id, "test -e /sys/kernel").await;
    env.fails(
        &id,
        "test -e /dev/sda || test -e /dev/nvme0n1 || test -e /dev/vda && false",
    )
    .await;
    drop(listener);
}

/// A stop ends every process the sandbox started, however it detached; after a snapshot the
/// sandbox's files restore into a new generation, at the same path inside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_ends_every_process_and_restores_at_the_same_path() {
    let Some(env) = env("stop") else { return };
    let id = env.create("writer", 1, None).await;
    let marker = format!("taskbox-writer-{}", std::process::id());
    env.ok(
        &id,
        &format!(
            "setsid bash -c 'while :; do echo x >> /workspace/log; sleep 0.05; done; : {marker}' \
             </dev/null >/dev/null 2>&1 & echo '#!/bin/sh' > tool && chmod +x tool"
        ),
    )
    .await;
    let ws = env.workspace(&id);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !ws.join("log").exists() || processes_with(&marker).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the writer never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let info = env.provider.snapshot(&tid("writer"), &id, 1).await.unwrap();
    assert_eq!(
        processes_with(&marker),
        Vec::<u32>::new(),
        "a process of the sandbox outlived its snapshot"
    );
    let restored = env.create("writer", 2, Some(&info.id)).await;
    assert_eq!(
        env.ok(
            &restored,
            "test -x /workspace/tool && pwd && cat log | head -1"
        )
        .await,
        "/workspace\nx\n"
    );
}

/// Where the kernel refuses user namespaces (here: a user namespace whose
/// `max_user_namespaces` is 0, as a restrictive host would have it), `taskbox run` with the
/// default config (isolation is the default: nothing is set) fails closed: exit 125, the cause
/// and the fix named, and nothing ran — not even unisolated.
#[test]
fn run_fails_closed_where_user_namespaces_are_refused() {
    let Some(_) = env("fail-closed") else { return };
    let home = crate::support::Home::new();
    let cmd = home.cmd();
    let taskbox = cmd.get_program().to_owned();
    let mut restricted = std::process::Command::new("unshare");
    restricted
        .args(["-U", "-r", "sh", "-c"])
        .arg("echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" \"$@\"")
        .arg(&taskbox)
        .args(["run", "--task", "closed", "--", "touch ran"]);
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => restricted.env(k, v),
            None => restricted.env_remove(k),
        };
    }
    restricted.env("TASKBOX_SERVER", "never");
    let out = match restricted.output() {
        Ok(out) => out,
        Err(e) => {
            assert!(!under_ci(), "unshare is needed under CI: {e}");
            return;
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("cannot isolate sandbox"), "{stderr}");
    assert!(stderr.contains("CLONE_NEWUSER"), "{stderr}");
    assert!(
        stderr.contains("terminal.local_isolation = none"),
        "the opt-out is named: {stderr}"
    );
    let ran = walkdir(home.path()).into_iter().any(|p| p.ends_with("ran"));
    assert!(
        !ran,
        "the command ran although its sandbox could not be isolated"
    );
    drop(cmd);
}

/// Every path under `dir`.
fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

/// Through the CLI (a one-shot engine, as the CLI tests run it): the engine's environment (a
/// token) never reaches a command, and the command sees only its sandbox.
#[test]
fn an_engine_started_with_a_token_does_not_hand_it_to_commands() {
    let Some(_) = env("server-env") else { return };
    let mut home = crate::support::Home::new();
    home.set_env("VERCEL_TOKEN", "tbx-secret-token-value");
    // Isolated by default: nothing is set.
    let out = crate::support::ok(&home.run(&[
        "run",
        "--task",
        "s",
        "--",
        "env; id -u; pwd; ls /proc | grep -c '^[0-9]'",
    ]));
    assert!(!out.contains("tbx-secret-token-value"), "{out}");
    assert!(out.contains("\n1000\n/workspace\n"), "{out}");
    crate::support::ok(&home.run(&["rm", "s"]));
}

/// The limits' cgroups exist where this machine allows them (both hierarchies are probed; under
/// `CI=true` a machine without them fails), else the test is skipped.
#[allow(clippy::print_stderr)] // a skip says so
fn limits_env(test: &str, limits: Limits) -> Option<Env> {
    let env = env_with(test, limits)?;
    if let Err(why) = isolation::limits_support() {
        assert!(!under_ci(), "{test}: limits must work under CI: {why}");
        eprintln!("SKIPPED {test}: {why}");
        return None;
    }
    Some(env)
}

/// A cgroup file's number (`pids.current`, ...).
fn cgroup_number(dir: &Path, file: &str) -> u64 {
    fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()))
        .trim()
        .parse()
        .expect("a number")
}

/// A fork bomb in one sandbox stops at its process limit (`terminal.container_pids`), while a
/// command in another task's sandbox still answers promptly; the bombed sandbox answers too once
/// the bomb is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fork_bomb_stops_at_the_pids_limit_and_other_tasks_answer() {
    const PIDS: u32 = 64;
    let limits = Limits {
        pids: PIDS,
        ..Limits::default()
    };
    let Some(env) = limits_env("fork-bomb", limits) else {
        return;
    };
    let env = Arc::new(env);
    let bombed = env.create("bombed", 1, None).await;
    let other = env.create("bystander", 1, None).await;
    env.ok(&bombed, "echo before > f").await;
    env.ok(&other, "true").await;
    let dirs = env.provider.limit_cgroups(&bombed);
    let pids_dir = dirs
        .iter()
        .find(|d| d.join("pids.max").exists())
        .expect("a cgroup with pids.max")
        .clone();
    assert_eq!(
        fs::read_to_string(pids_dir.join("pids.max"))
            .unwrap()
            .trim(),
        PIDS.to_string()
    );
    // The bomb runs until its timeout kills its group: its shell stays (a `wait` alone returns
    // as soon as the first pipeline's shells have started theirs, leaving the bomb to starve
    // out by bash's fork retries — a minute or more on a loaded machine).
    let bomb = {
        let env = env.clone();
        let bombed = bombed.clone();
        tokio::spawn(async move {
            env.run_for(&bombed, "b() { b | b & }; b; sleep 60", 6_000)
                .await
        })
    };
    // Wait for the bomb to reach the limit (a fork refused), bounded.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let refused = |d: &Path| {
        fs::read_to_string(d.join("pids.events"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("max ")?.trim().parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    while refused(&pids_dir) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the bomb never reached the limit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(cgroup_number(&pids_dir, "pids.current") <= u64::from(PIDS));
    let started = std::time::Instant::now();
    assert_eq!(env.ok(&other, "echo answered").await, "answered\n");
    let latency = started.elapsed();
    eprintln!("a command in another task answered in {latency:?} during a fork bomb");
    assert!(latency < Duration::from_secs(10), "{latency:?}");
    assert!(cgroup_number(&pids_dir, "pids.current") <= u64::from(PIDS));
    // Ended by its timeout, which kills its whole group (every process of the bomb).
    let out = bomb.await.expect("the bomb's task");
    assert!(out.timed_out, "{out:?}");
    // The bombed sandbox and its files live on: it answers once the bomb is gone (until the
    // group's processes are reaped a command may not start: the limit refuses its fork, and
    // says so).
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let req = ExecRequest {
        command: "cat f".into(),
        timeout_ms: 20_000,
    };
    loop {
        match env.provider.exec(&bombed, &req).await {
            Ok(out) if out.exit_code == 0 => {
                assert_eq!(out.stdout, "before\n");
                break;
            }
            // Started, but its own fork refused.
            Ok(out) => assert!(out.stderr.contains("fork"), "{out:?}"),
            Err(e) => {
                let text = format!("{e:#}");
                assert!(text.contains("terminal.container_pids"), "{text}");
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the bombed sandbox never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A command over the memory limit (`terminal.container_memory`) is killed and said to be;
/// the sandbox and its files live on. After a snapshot (what `suspend` does) the limits'
/// cgroups are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_is_killed_and_reported_and_the_cgroups_go_with_the_sandbox() {
    let limits = Limits {
        memory_mb: 64,
        ..Limits::default()
    };
    let Some(env) = limits_env("memory", limits) else {
        return;
    };
    let id = env.create("hog", 1, None).await;
    env.ok(&id, "echo kept > f").await;
    let dirs = env.provider.limit_cgroups(&id);
    assert!(!dirs.is_empty());
    assert!(dirs.iter().all(|d| d.is_dir()), "{dirs:?}");
    // Each limit as configured, v2's files or v1's.
    let value = |files: &[&str]| -> String {
        dirs.iter()
            .flat_map(|d| files.iter().map(move |f| d.join(f)))
            .find_map(|p| fs::read_to_string(p).ok())
            .unwrap_or_else(|| panic!("none of {files:?} in {dirs:?}"))
            .trim()
            .to_string()
    };
    assert_eq!(
        value(&["memory.max", "memory.limit_in_bytes"]),
        (64u64 << 20).to_string()
    );
    assert_eq!(value(&["pids.max"]), Limits::default().pids.to_string());
    let cpu = value(&["cpu.max", "cpu.cfs_quota_us"]);
    assert!(cpu == "100000 100000" || cpu == "100000", "{cpu}");
    // `tail` keeps a newline-free stream whole: 512 MB against a 64 MB limit.
    let out = env
        .run(&id, "head -c 512M /dev/zero | tail; echo after")
        .await;
    assert_eq!(out.stdout, "after\n", "{out:?}");
    assert!(
        out.stderr.contains("killed by its sandbox's memory limit")
            && out.stderr.contains("terminal.container_memory = 64 MB"),
        "{out:?}"
    );
    let out = env.run(&id, "head -c 512M /dev/zero | tail").await;
    assert_eq!(out.exit_code, 137, "{out:?}");
    assert!(
        out.stderr.contains("memory limit") && out.memory_killed,
        "{out:?}"
    );
    // A command within the limit is not noted.
    let out = env.run(&id, "head -c 8M /dev/zero | tail | wc -c").await;
    assert_eq!(
        (out.exit_code, out.stdout.as_str()),
        (0, "8388608\n"),
        "{out:?}"
    );
    assert!(
        !out.stderr.contains("memory limit") && !out.memory_killed,
        "{out:?}"
    );
    assert_eq!(env.ok(&id, "cat f").await, "kept\n");
    env.provider.snapshot(&tid("hog"), &id, 1).await.unwrap();
    for dir in &dirs {
        assert!(
            !dir.exists(),
            "{} outlived the sandbox's snapshot",
            dir.display()
        );
    }
    assert!(env.provider.limit_cgroups(&id).is_empty());
}

/// Through the CLI: the configured limits reach the sandbox (`terminal.container_memory`), a
/// memory-limit kill is said on stderr with the shell's exit code, and `doctor` shows the
/// `cgroup limits` layer with ✓.
#[test]
fn the_configured_memory_limit_reaches_the_sandbox_and_doctor_shows_the_layer() {
    let Some(_) = limits_env("cli-limits", Limits::default()) else {
        return;
    };
    let home = crate::support::Home::new();
    crate::support::ok(&home.run(&["config", "set", "terminal.local_isolation", "namespaces"]));
    crate::support::ok(&home.run(&["config", "set", "terminal.container_memory", "32"]));
    let doctor = home.run(&["doctor"]);
    let text = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("✓ cgroup limits") && l.contains("container_pids")),
        "{text}"
    );
    let out = home.run(&[
        "run",
        "--task",
        "m",
        "--",
        "echo kept > f; head -c 256M /dev/zero | tail",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{stderr}");
    assert!(
        stderr.contains("killed by its sandbox's memory limit (terminal.container_memory = 32 MB)"),
        "{stderr}"
    );
    // `--json` says so too.
    let out = home.run(&[
        "run",
        "--json",
        "--task",
        "m",
        "--",
        "head -c 256M /dev/zero | tail",
    ]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["memory_killed"], true, "{json}");
    assert_eq!(json["exit_code"], 137, "{json}");
    let out = crate::support::ok(&home.run(&["run", "--json", "--task", "m", "--", "true"]));
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert!(json.get("memory_killed").is_none(), "{json}");
    let kept = crate::support::ok(&home.run(&["run", "--task", "m", "--", "cat f"]));
    assert_eq!(kept, "kept\n");
    // The journal records the kill (the command's exit event, and its reply), for `show`, the
    // API's task view, and replay: two kills, then the `true` and the `cat` that were not.
    let shown = crate::support::ok(&home.run(&["show", "--json", "m"]));
    let view: serde_json::Value = serde_json::from_str(&shown).expect("JSON");
    let exits: Vec<bool> = view["journal"]
        .as_array()
        .expect("a journal")
        .iter()
        .filter(|e| e["event"]["type"] == "command_exited")
        .map(|e| e["event"]["memory_killed"] == true)
        .collect();
    assert_eq!(exits, [true, true, false, false], "{shown}");
    let shown = crate::support::ok(&home.run(&["show", "m"]));
    assert_eq!(
        shown
            .matches("exit 137: the sandbox's memory limit killed a process of the command")
            .count(),
        2,
        "{shown}"
    );
    let replay = home.run(&["replay", "m", "--redrive", "--timeline"]);
    let timeline = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(
        replay.status.code(),
        Some(0),
        "{timeline}{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    assert!(
        timeline.contains("ran, exit 137, memory limit"),
        "{timeline}"
    );
    crate::support::ok(&home.run(&["rm", "m"]));
}

// ---- a full disk (issue 31's Limits: "one task fills the disk") ----

/// A small tmpfs mounted on a directory for the life of the value (a data dir whose disk a
/// test may fill without filling the machine's); unmounted on drop, also when the test fails.
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    /// Mounts a tmpfs of `mb` MB on `dir`, or says why not (not root, no mount).
    fn mount(dir: &Path, mb: u32) -> Result<SmallDisk, String> {
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mb}m,mode=0755"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cannot mount a tmpfs on {} (root is needed): {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(SmallDisk {
            dir: dir.to_path_buf(),
        })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazily: a process of a failed test may still hold a file there.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status();
    }
}

/// One task fills the data dir's disk (`dd` until ENOSPC); another keeps running commands,
/// committing and snapshotting (suspend, then restore, and its files are there); nothing
/// committed is lost (the full task's earlier files come back from its snapshot, both journals
/// replay); once the full task deletes its big file it runs and snapshots again, and the
/// store's reserve is made again. Isolated (as in production) and without isolation.
#[test]
#[allow(clippy::print_stderr)] // a skip says so
fn one_task_filling_the_disk_does_not_stop_the_others() {
    for mode in
        crate::support::isolation_modes("one_task_filling_the_disk_does_not_stop_the_others")
    {
        let home = crate::support::Home::new();
        let disk = match SmallDisk::mount(home.path(), 48) {
            Ok(d) => d,
            Err(why) => {
                assert!(!under_ci(), "the full-disk test must run under CI: {why}");
                eprintln!("SKIPPED one_task_filling_the_disk_does_not_stop_the_others: {why}");
                return;
            }
        };
        full_disk_round(&home, mode);
        drop(disk);
    }
}

fn full_disk_round(home: &crate::support::Home, mode: &str) {
    use crate::support::{ok, stderr};
    let run = |task: &str, command: &str| home.run(&["run", "--task", task, "--", command]);
    ok(&home.run(&["config", "set", "terminal.local_isolation", mode]));
    ok(&home.run(&["config", "set", "terminal.store_reserve_mb", "8"]));
    let reserve = home
        .path()
        .join("data")
        .join(taskbox::store::reserve::FILE_NAME);
    ok(&run("a", "echo a1 > a1"));
    ok(&run("b", "echo b1 > b1"));
    let len = fs::metadata(&reserve).expect("the reserve is made").len();
    assert_eq!(len, 8 << 20, "{mode}");
    // A's files so far are committed in a snapshot.
    ok(&home.run(&["suspend", "a"]));
    // A fills the disk.
    let filled = run("a", "dd if=/dev/zero of=big bs=1M");
    let why = stderr(&filled);
    assert_eq!(filled.status.code(), Some(1), "{mode}: {why}");
    assert!(why.contains("No space left on device"), "{mode}: {why}");
    assert!(
        why.contains("the disk holding the workspace is full"),
        "{mode}: the note names the disk: {why}"
    );
    assert!(!reserve.exists(), "{mode}: the reserve was given back");
    // B keeps running, committing and snapshotting, and its files come back.
    for i in 0..3 {
        let out = ok(&run("b", &format!("cat b1 && echo b{i} >> log")));
        assert_eq!(out, "b1\n", "{mode}");
    }
    ok(&home.run(&["suspend", "b"]));
    assert_eq!(ok(&run("b", "cat b1 log")), "b1\nb0\nb1\nb2\n", "{mode}");
    ok(&home.run(&["suspend", "b"]));
    // A recovers once it frees the space: it runs, snapshots, and its files come back.
    assert_eq!(ok(&run("a", "rm big && cat a1")), "a1\n", "{mode}");
    ok(&home.run(&["suspend", "a"]));
    assert_eq!(ok(&run("a", "ls; cat a1")), "a1\na1\n", "{mode}");
    ok(&home.run(&["suspend", "a"]));
    // There is room again: the next commit made the reserve again.
    assert_eq!(
        fs::metadata(&reserve).map(|m| m.len()).ok(),
        Some(8 << 20),
        "{mode}"
    );
    // Nothing committed was lost: both journals replay as recorded.
    for task in ["a", "b"] {
        ok(&home.run(&["replay", task]));
    }
    ok(&home.run(&["rm", "a"]));
    ok(&home.run(&["rm", "b"]));
}

/// `terminal.local_network` (issue 31's Network paragraph): `isolated` reaches the host's
/// non-loopback address through `pasta` (it stands for "outbound": there is no internet here)
/// and nothing on the host's loopback; `none` reaches neither; `host` is the host's network;
/// `isolated` without `pasta` falls back to loopback only and says so; `pasta` ends with the
/// sandbox.
mod network {
    use std::net::{Ipv4Addr, TcpListener};
    use std::time::Instant;

    use taskbox::config::LocalNetwork;
    use taskbox::provider::local::isolation::Network;

    use super::*;

    /// An isolated provider with the network `mode` (and `pasta`), or `None` as [`env`].
    fn net_env(test: &str, mode: LocalNetwork, pasta: &str) -> Option<Env> {
        net_env_with(test, mode, pasta, None)
    }

    /// As [`net_env`], with the resolver configuration `resolv_conf` (else the host's).
    fn net_env_with(
        test: &str,
        mode: LocalNetwork,
        pasta: &str,
        resolv_conf: Option<&Path>,
    ) -> Option<Env> {
        let mut env = env(test)?;
        let clock = Arc::new(ManualClock(AtomicU64::new(START_MS)));
        env.provider = LocalProvider::new(
            env.dir.path().join("data/local"),
            INSTALLATION.into(),
            clock,
        )
        .expect("provider")
        .with_isolation(Settings {
            mode: LocalIsolation::Namespaces,
            network: Network {
                mode,
                pasta: pasta.into(),
                resolv_conf: resolv_conf
                    .map_or_else(|| Network::default().resolv_conf, Path::to_path_buf),
            },
            ..Settings::default()
        });
        Some(env)
    }

    /// Whether `pasta` is installed; a test that needs it skips (saying so) where it is not,
    /// except under `CI=true`, where that fails.
    #[allow(clippy::print_stderr)] // a skip says so
    fn have_pasta(test: &str) -> bool {
        match isolation::find_pasta("pasta") {
            Ok(_) => true,
            Err(e) => {
                assert!(!under_ci(), "{test}: pasta must be installed under CI: {e}");
                eprintln!("SKIPPED {test}: {e} (apt-get install passt)");
                false
            }
        }
    }

    /// The host's first non-loopback IPv4 address (what stands for "outbound" here).
    fn host_address() -> Option<Ipv4Addr> {
        let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: getifaddrs fills `addrs` with a list freed below.
        if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
            return None;
        }
        let mut found = None;
        let mut cur = addrs;
        while !cur.is_null() {
            // SAFETY: `cur` is a node of the list getifaddrs returned.
            let ifa = unsafe { &*cur };
            // SAFETY: a non-null `ifa_addr` points to a sockaddr of the list.
            let family = (!ifa.ifa_addr.is_null()).then(|| unsafe { (*ifa.ifa_addr).sa_family });
            if family.map(i32::from) == Some(libc::AF_INET) {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !ip.is_loopback() && found.is_none() {
                    found = Some(ip);
                }
            }
            cur = ifa.ifa_next;
        }
        // SAFETY: the list getifaddrs returned, freed once.
        unsafe { libc::freeifaddrs(addrs) };
        found
    }

    /// The host's address, or `None` (skipped, failing under CI) on a machine without one.
    #[allow(clippy::print_stderr)] // a skip says so
    fn host_address_or_skip(test: &str) -> Option<Ipv4Addr> {
        let found = host_address();
        if found.is_none() {
            assert!(
                !under_ci(),
                "{test}: CI's machine has a non-loopback IPv4 address"
            );
            eprintln!("SKIPPED {test}: this machine has no non-loopback IPv4 address");
        }
        found
    }

    /// A listener on the host's `127.0.0.1` and one on its address `ip`, with their ports.
    /// Connections complete in their backlogs: nothing needs to accept them.
    fn listeners(ip: Ipv4Addr) -> (TcpListener, u16, TcpListener, u16) {
        let loopback = TcpListener::bind("127.0.0.1:0").unwrap();
        let lo_port = loopback.local_addr().unwrap().port();
        let outside = TcpListener::bind((ip, 0)).unwrap();
        let out_port = outside.local_addr().unwrap().port();
        (loopback, lo_port, outside, out_port)
    }

    /// A command connecting to `ip:port` within 3 s (a refused or dropped connection fails).
    fn connect(ip: &str, port: u16) -> String {
        format!("timeout 3 bash -c 'exec 3<>/dev/tcp/{ip}/{port}'")
    }

    /// What marks the `pasta` of the sandbox `id` (its `--pid` file, in the sandbox's run dir).
    fn pasta_marker(env: &Env, id: &SandboxId) -> String {
        let ws = env.workspace(id);
        let run = ws.parent().expect("a sandbox dir").join("run");
        format!("{}/pasta.pid", run.display())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn isolated_reaches_the_host_address_but_nothing_on_its_loopback_and_pasta_ends_with_it()
    {
        let test = "net-isolated";
        let Some(env) = net_env(test, LocalNetwork::Isolated, "pasta") else {
            return;
        };
        if !have_pasta(test) {
            return;
        }
        let Some(ip) = host_address_or_skip(test) else {
            return;
        };
        let (loopback, lo_port, outside, out_port) = listeners(ip);
        let id = env.create("net", 1, None).await;
        let first = env.run(&id, "true").await;
        assert_eq!(first.exit_code, 0, "{first:?}");
        assert!(
            !first.stderr.contains("local_network"),
            "pasta was found, yet: {}",
            first.stderr
        );
        // Its own interface and default route, through pasta.
        let routes = env
            .ok(&id, "awk '$2 == \"00000000\" { print $1 }' /proc/net/route")
            .await;
        assert!(!routes.trim().is_empty(), "no default route inside");
        let addr = env.ok(&id, "cat /proc/net/fib_trie").await;
        assert!(addr.contains(isolation::ADDRESS), "{addr}");
        // The host's non-loopback address: reachable.
        env.ok(&id, &connect(&ip.to_string(), out_port)).await;
        // Nothing bound to the host's loopback: not through 127.0.0.1 (the sandbox's own), the
        // gateway (not mapped to the host), or the host's own address.
        for target in ["127.0.0.1", isolation::GATEWAY, &ip.to_string()] {
            env.fails(&id, &connect(target, lo_port)).await;
        }
        // DNS: the host's resolv.conf (its nameservers are reached through pasta like any
        // address).
        let resolv = env
            .ok(&id, "cat /etc/resolv.conf 2>/dev/null || true")
            .await;
        let host = fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        assert_eq!(resolv, host);

        // One pasta per sandbox, not per command; gone with the sandbox's stop.
        env.ok(&id, "true").await;
        let marker = pasta_marker(&env, &id);
        assert_eq!(
            processes_with(&marker).len(),
            1,
            "one pasta for the sandbox"
        );
        env.provider.stop_sandbox(&id).await.expect("stop");
        // Killed by the stop, reaped beside it (its exit takes tens of milliseconds).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !processes_with(&marker).is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            processes_with(&marker),
            Vec::<u32>::new(),
            "pasta outlived its sandbox's stop by 5 s"
        );
        drop((loopback, outside));
    }

    /// A DNS server of the test's on the host's loopback: a real UDP socket at `ip:53` that
    /// answers every `A` query for `example.test` with `192.0.2.7` and anything else with no
    /// record, until the returned flag is set. `None` where port 53 cannot be bound (not root,
    /// or taken).
    fn dns_server(ip: Ipv4Addr) -> Option<(Arc<std::sync::atomic::AtomicBool>, Arc<AtomicU64>)> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let socket = std::net::UdpSocket::bind((ip, 53)).ok()?;
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let (done, queries) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (stop, count) = (done.clone(), queries.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !stop.load(Ordering::Relaxed) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                count.fetch_add(1, Ordering::Relaxed);
                let query = &buf[..n];
                // The question: labels up to a zero byte, then its type and class.
                let mut end = 12;
                while end < n && query[end] != 0 {
                    end += usize::from(query[end]) + 1;
                }
                if end + 5 > n {
                    continue;
                }
                let question = &query[12..end + 5];
                let qtype = u16::from_be_bytes([query[end + 1], query[end + 2]]);
                let name_ok = question[..end - 12 + 1] == *b"\x07example\x04test\x00";
                let answer = name_ok && qtype == 1;
                let mut reply = Vec::new();
                reply.extend_from_slice(&query[..2]);
                reply.extend_from_slice(&[0x81, 0x80, 0, 1, 0, u8::from(answer), 0, 0, 0, 0]);
                reply.extend_from_slice(question);
                if answer {
                    reply.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
                    reply.extend_from_slice(&[192, 0, 2, 7]);
                }
                let _ = socket.send_to(&reply, from);
            }
        });
        Some((done, queries))
    }

    /// `terminal.local_network = isolated` where the host's resolver is on its loopback (as
    /// systemd-resolved's 127.0.0.53 is): the sandbox resolves through it (the relay of
    /// `isolation::dns`), while a TCP listener on the same loopback stays out of reach.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(clippy::print_stderr)] // a skip says so
    async fn isolated_resolves_through_a_resolver_on_the_host_loopback_which_stays_closed() {
        let test = "net-dns";
        if !have_pasta(test) {
            return;
        }
        // An address of the loopback of its own, so that no other resolver or test is in the
        // way.
        let resolver = Ipv4Addr::new(127, 53, (std::process::id() % 250) as u8, 9);
        let Some((done, queries)) = dns_server(resolver) else {
            // SAFETY: geteuid cannot fail.
            let root = unsafe { libc::geteuid() } == 0;
            assert!(
                !(under_ci() && root),
                "{test}: CI runs as root: {resolver}:53 must be free"
            );
            eprintln!("SKIPPED {test}: cannot bind {resolver}:53 (not root, or taken)");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("resolv.conf");
        fs::write(
            &conf,
            format!("nameserver {resolver}\noptions timeout:2 attempts:3\n"),
        )
        .unwrap();
        let Some(env) = net_env_with(test, LocalNetwork::Isolated, "pasta", Some(&conf)) else {
            return;
        };
        let (lo_tcp, lo_port) = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            (l, port)
        };
        let near = TcpListener::bind((resolver, 0)).unwrap();
        let near_port = near.local_addr().unwrap().port();
        let id = env.create("dns", 1, None).await;
        let first = env.run(&id, "cat /etc/resolv.conf").await;
        assert_eq!(first.exit_code, 0, "{first:?}");
        assert!(
            first.stdout.contains(&format!("nameserver {resolver}")),
            "the sandbox's resolv.conf is the configured one: {first:?}"
        );
        let resolved = env.ok(&id, "getent hosts example.test").await;
        assert!(
            resolved.split_whitespace().next() == Some("192.0.2.7"),
            "{resolved:?}"
        );
        assert!(queries.load(std::sync::atomic::Ordering::Relaxed) >= 1);
        // A name it does not know: no answer, and the command says so (exit 2).
        env.fails(&id, "getent hosts other.test").await;
        // The resolver's file is read-only inside.
        env.fails(&id, "echo nameserver 10.9.9.9 > /etc/resolv.conf")
            .await;
        // Nothing else of the host's loopback: not its 127.0.0.1, not the resolver's own
        // address on another port, not its TCP port 53 (the relay is UDP, to one address).
        env.fails(&id, &connect("127.0.0.1", lo_port)).await;
        env.fails(&id, &connect(&resolver.to_string(), near_port))
            .await;
        env.fails(&id, &connect(&resolver.to_string(), 53)).await;
        env.provider.stop_sandbox(&id).await.expect("stop");
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        drop((lo_tcp, near));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn none_reaches_only_its_own_loopback_and_host_reaches_the_hosts() {
        let test = "net-none-host";
        let Some(env) = net_env(test, LocalNetwork::None, "pasta") else {
            return;
        };
        let Some(ip) = host_address_or_skip(test) else {
            return;
        };
        let (loopback, lo_port, outside, out_port) = listeners(ip);
        let id = env.create("none", 1, None).await;
        let first = env.run(&id, "true").await;
        assert_eq!(first.stderr, "", "`none` is said on purpose: no note");
        env.fails(&id, &connect(&ip.to_string(), out_port)).await;
        env.fails(&id, &connect("127.0.0.1", lo_port)).await;
        // Its own loopback works.
        env.ok(&id, "(exec 4<>/dev/tcp/127.0.0.1/1) 2>&1 | grep -q refused")
            .await;
        assert!(
            processes_with(&pasta_marker(&env, &id)).is_empty(),
            "no pasta with `none`"
        );

        // `host`: the host's network, its loopback included (which is why doctor flags it).
        let Some(host) = net_env("net-host", LocalNetwork::Host, "pasta") else {
            return;
        };
        let id = host.create("host", 1, None).await;
        // Its first command says so, once per sandbox (as `local_isolation = none` does).
        let first = host.run(&id, "echo out; echo err >&2").await;
        assert_eq!(first.exit_code, 0, "{first:?}");
        assert_eq!(first.stdout, "out\n");
        assert_eq!(
            first.stderr,
            format!("{}err\n", isolation::HOST_NETWORK_NOTE)
        );
        assert_eq!(host.run(&id, "echo err >&2").await.stderr, "err\n");
        host.ok(&id, &connect("127.0.0.1", lo_port)).await;
        host.ok(&id, &connect(&ip.to_string(), out_port)).await;
        // Everything else of the isolation holds: its own PID namespace, uid 1000.
        assert_eq!(host.ok(&id, "id -u").await, "1000\n");
        drop((loopback, outside));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn isolated_without_pasta_falls_back_to_loopback_and_its_first_command_says_so() {
        let test = "net-degraded";
        let Some(env) = net_env(test, LocalNetwork::Isolated, "/nonexistent/pasta") else {
            return;
        };
        let Some(ip) = host_address_or_skip(test) else {
            return;
        };
        let outside = TcpListener::bind((ip, 0)).unwrap();
        let out_port = outside.local_addr().unwrap().port();
        let id = env.create("degraded", 1, None).await;
        let first = env.run(&id, "echo out; echo err >&2").await;
        assert_eq!(first.exit_code, 0, "{first:?}");
        assert_eq!(first.stdout, "out\n");
        let note = isolation::degraded_note("/nonexistent/pasta is not an executable file");
        assert_eq!(first.stderr, format!("{note}err\n"));
        // Less access, never more: the host's address is not reachable.
        env.fails(&id, &connect(&ip.to_string(), out_port)).await;
        // Said once per sandbox.
        let next = env.run(&id, "true").await;
        assert_eq!(next.stderr, "");
        drop(outside);
    }

    /// The first command of a new task (create + `true`), with and without pasta: pasta starts
    /// once per sandbox; its cost is printed (median of 10, this build).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(clippy::print_stderr)] // the figures are this test's output
    async fn the_first_command_with_pasta_is_timed() {
        let test = "net-timing";
        if !have_pasta(test) {
            return;
        }
        let mut medians = Vec::new();
        for mode in [LocalNetwork::None, LocalNetwork::Isolated] {
            let Some(env) = net_env(test, mode, "pasta") else {
                return;
            };
            let mut times = Vec::new();
            for i in 0..10 {
                let task = format!("t{i}");
                let started = Instant::now();
                let id = env.create(&task, 1, None).await;
                let out = env.run(&id, "true").await;
                times.push(started.elapsed());
                assert_eq!((out.exit_code, out.stderr.as_str()), (0, ""), "{out:?}");
                env.provider.stop_sandbox(&id).await.expect("stop");
            }
            times.sort();
            let median = times[times.len() / 2];
            eprintln!(
                "first command of a new task, local_network = {}: median {:.1} ms (min {:.1}, \
                 max {:.1}) over 10",
                mode.as_str(),
                median.as_secs_f64() * 1e3,
                times[0].as_secs_f64() * 1e3,
                times[9].as_secs_f64() * 1e3
            );
            medians.push(median);
        }
        // A generous bound: pasta must not make a new sandbox take seconds.
        assert!(
            medians[1] < medians[0] + Duration::from_secs(2),
            "pasta costs {:?} over {:?}",
            medians[1],
            medians[0]
        );
    }

    /// A SIGKILLed taskbox takes its sandboxes' `pasta` with it (its parent-death signal): no
    /// process is left behind however the server ends.
    #[test]
    fn pasta_dies_with_a_killed_taskbox() {
        let test = "net-killed";
        let Some(_) = env(test) else { return };
        if !have_pasta(test) {
            return;
        }
        let home = crate::support::Home::new();
        crate::support::ok(&home.run(&["config", "set", "terminal.local_isolation", "namespaces"]));
        let mut run = home
            .cmd()
            .args(["run", "--task", "k", "--", "echo started > s; sleep 60"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn taskbox");
        let marker = format!("{}/", home.path().display());
        let pasta = || -> Vec<u32> {
            processes_with(&marker)
                .into_iter()
                .filter(|pid| {
                    fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| c.windows(9).any(|w| w == b"pasta.pid"))
                })
                .collect()
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while pasta().is_empty() {
            assert!(
                Instant::now() < deadline,
                "the sandbox's pasta never started"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        run.kill().expect("SIGKILL taskbox");
        run.wait().expect("reap taskbox");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !pasta().is_empty() {
            assert!(
                Instant::now() < deadline,
                "pasta outlived its killed taskbox: {:?}",
                pasta()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Through the CLI: the key is validated, and `doctor` names pasta (✓ with `isolated`),
    /// flags `host` with ✗, and warns where pasta is missing.
    #[test]
    fn the_key_is_checked_and_doctor_shows_the_network_layer() {
        let Some(_) = env("net-doctor") else { return };
        let home = crate::support::Home::new();
        let bad = home.run(&["config", "set", "terminal.local_network", "open"]);
        assert!(!bad.status.success());
        let said = crate::support::stderr(&bad);
        assert!(said.contains("isolated, none, host"), "{said}");
        let bad = home.run(&["config", "set", "terminal.local_pasta", "bin/pasta"]);
        assert!(!bad.status.success());
        assert!(crate::support::stderr(&bad).contains("absolute path"));
        crate::support::ok(&home.run(&["config", "set", "terminal.local_isolation", "namespaces"]));
        let doctor = |home: &crate::support::Home| {
            String::from_utf8_lossy(&home.run(&["doctor"]).stdout).into_owned()
        };
        let network_line = |text: &str| {
            text.lines()
                .find(|l| l.contains(" network"))
                .unwrap_or_else(|| panic!("no network line in {text}"))
                .to_string()
        };
        if isolation::find_pasta("pasta").is_ok() || under_ci() {
            let text = doctor(&home);
            let line = network_line(&text);
            assert!(
                line.starts_with("✓ network") && line.contains("pasta"),
                "{text}"
            );
        }
        crate::support::ok(&home.run(&["config", "set", "terminal.local_network", "host"]));
        let text = doctor(&home);
        let line = network_line(&text);
        assert!(
            line.starts_with("✗ network") && line.contains("loopback"),
            "{text}"
        );
        crate::support::ok(&home.run(&["config", "set", "terminal.local_network", "isolated"]));
        crate::support::ok(&home.run(&[
            "config",
            "set",
            "terminal.local_pasta",
            "/nonexistent/pasta",
        ]));
        let text = doctor(&home);
        let line = network_line(&text);
        assert!(
            line.starts_with("! network") && line.contains("/nonexistent/pasta"),
            "{text}"
        );
    }
}

/// The uid and gid of `nobody`, whom the unprivileged server below runs as.
const NOBODY: &str = "65534";

/// `taskbox ARGS` as `nobody` (`setpriv --reuid --regid --clear-groups`), with `home`'s
/// environment and the home's auto-started server; `None` where `setpriv` cannot be run.
fn as_nobody(home: &crate::support::Home, args: &[&str]) -> Option<std::process::Output> {
    let cmd = home.cmd();
    let mut setpriv = std::process::Command::new("setpriv");
    setpriv
        .arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"))
        .arg("--clear-groups")
        .arg(cmd.get_program())
        .args(args);
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => setpriv.env(k, v),
            None => setpriv.env_remove(k),
        };
    }
    setpriv.env("TASKBOX_SERVER", "auto");
    setpriv.output().ok()
}

/// The attacks again, with the server an unprivileged user's (`nobody`, through `setpriv`, its
/// own data dir) as the issue asks "where CI can": reading a file placed outside the workspace
/// (one `nobody` itself may read) and `/etc/shadow`, writing outside, another task's workspace
/// (by the relative and the host path), the data dir and signalling the server all fail from
/// inside. Needs root to drop to `nobody` (skipped otherwise, said on stderr); as root under
/// `CI=true` it fails rather than skip.
#[test]
#[allow(clippy::print_stderr)] // a skip says so
fn the_attacks_fail_under_a_server_run_by_an_unprivileged_user() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: `geteuid` has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED unprivileged-server: dropping to nobody needs root");
        return;
    }
    let Some(_) = env("unprivileged-server") else {
        return;
    };
    let exe = Path::new(env!("CARGO_BIN_EXE_taskbox"));
    // `nobody` must reach the binary: every directory above it searchable by others.
    let reachable = exe
        .ancestors()
        .skip(1)
        .all(|d| fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
    if !reachable {
        assert!(
            !under_ci(),
            "nobody cannot reach {} under CI: make its directories searchable",
            exe.display()
        );
        eprintln!(
            "SKIPPED unprivileged-server: nobody cannot reach {}",
            exe.display()
        );
        return;
    }
    let home = crate::support::Home::new();
    let outside = home.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), "nobody's secret").unwrap();
    let chown = std::process::Command::new("chown")
        .args(["-R", &format!("{NOBODY}:{NOBODY}")])
        .arg(home.path())
        .status()
        .expect("run chown");
    assert!(chown.success(), "chown the home to nobody");
    let run = |task: &str, command: &str| {
        let Some(out) = as_nobody(&home, &["run", "--task", task, "--", command]) else {
            panic!("setpriv is needed to run a server as nobody (util-linux)");
        };
        out
    };
    // The server, auto-started by nobody's first command, is nobody's.
    let first = run("victim", "echo mine > v.txt; id -u; pwd");
    assert_eq!(
        crate::support::ok(&first),
        "1000\n/workspace\n",
        "an isolated command under nobody's server"
    );
    let data = home.path().join("data");
    let server: u32 = fs::read_to_string(data.join("serve.lock"))
        .expect("the server's lock")
        .trim()
        .parse()
        .expect("a pid in the serve lock");
    let status = fs::read_to_string(format!("/proc/{server}/status")).unwrap_or_default();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(NOBODY)),
        "the server runs as nobody: {status}"
    );
    let victim_ws = walkdir(&data)
        .into_iter()
        .find(|p| p.ends_with("workspace/v.txt"))
        .expect("the victim's workspace on the host");
    let q = |p: &Path| taskbox::shell::quote(&p.to_string_lossy());
    let fails = |command: &str| {
        let out = run("attacker", command);
        assert!(
            !out.status.success(),
            "`{command}` succeeded under nobody's server: {}",
            crate::support::stdout(&out)
        );
    };
    assert_eq!(crate::support::ok(&run("attacker", "cat /etc/shadow")), "");
    fails(&format!("cat {}", q(&outside.join("secret"))));
    fails(&format!("touch {}", q(&outside.join("x"))));
    fails("touch /etc/x");
    fails(&format!("ls {}", q(&data)));
    fails(&format!("echo evil > {}", q(&victim_ws)));
    fails("echo evil > ../../victim/workspace/v.txt");
    fails(&format!("kill -0 {server}"));
    assert!(!outside.join("x").exists());
    assert_eq!(fs::read_to_string(&victim_ws).unwrap(), "mine\n");
    assert_eq!(crate::support::ok(&run("victim", "cat v.txt")), "mine\n");
    let stop = as_nobody(&home, &["serve", "--stop"]).expect("setpriv");
    crate::support::ok(&stop);
    crate::server::kill_server_of(&data);
}

/// `terminal.local_isolation = none`, said on purpose: each sandbox's first command starts its
/// stderr with the warning (the task's first, and the first after a restore; not the second),
/// its output is the command's own otherwise, and `doctor` shows `isolation` with ✗ (exit 1).
#[test]
fn unisolated_on_purpose_warns_on_each_sandboxes_first_command_and_doctor_shows_a_cross() {
    use crate::support::{ok, stderr, stdout};
    let home = crate::support::Home::new();
    ok(&home.run(&["config", "set", "terminal.local_isolation", "none"]));
    let warning = "taskbox: warning: terminal.local_isolation = none: this sandbox's commands run \
                   unisolated";
    let first = home.run(&["run", "--task", "u", "--", "echo out; echo err >&2"]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert_eq!(stdout(&first), "out\n");
    let said = stderr(&first);
    assert!(
        said.starts_with(warning),
        "the first command warns first: {said}"
    );
    assert!(
        said.ends_with("\nerr\n"),
        "then the command's own stderr: {said}"
    );
    let second = home.run(&["run", "--task", "u", "--", "echo err >&2"]);
    assert_eq!(stderr(&second), "err\n", "the second command does not warn");
    // A new sandbox (restored after a suspend) warns again, once.
    ok(&home.run(&["suspend", "u"]));
    let restored = home.run(&["run", "--task", "u", "--", "true"]);
    assert_eq!(restored.status.code(), Some(0), "{}", stderr(&restored));
    assert!(stderr(&restored).contains(warning), "{}", stderr(&restored));
    assert!(
        !stdout(&restored).contains("warning"),
        "{}",
        stdout(&restored)
    );
    // `--json` carries it in the command's stderr.
    let json = ok(&home.run(&["run", "--json", "--task", "j", "--", "true"]));
    assert!(json.contains(warning), "{json}");
    let doctor = home.run(&["doctor"]);
    assert_eq!(doctor.status.code(), Some(1), "{}", stdout(&doctor));
    let listed = stdout(&doctor);
    assert!(
        listed.contains("✗ isolation: terminal.local_isolation = none"),
        "{listed}"
    );
    assert!(!listed.contains("✓ isolation"), "{listed}");
}
