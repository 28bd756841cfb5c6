//! Per-command overhead on the local backend: a command in a warm task (its sandbox already
//! live) against the same command spawned bare with `bash -c`, pair by pair.
//!
//! - `overhead.library`: an [`Orchestrator`] held open, as a Rust program embedding taskbox
//!   holds it; the bare command is spawned on the same tokio runtime.
//! - `overhead.cli`: one `taskbox run` process per command through a running server (`taskbox
//!   serve`, what the CLI talks to by default), against one bare `bash -c` process per command.
//! - `overhead.cli_isolated`: the same with `terminal.local_isolation = namespaces` (each
//!   command enters its sandbox's namespaces; see `provider::local::isolation`).
//! - `overhead.cli_isolated_bwrap`: isolated commands through the same server against a bare
//!   `bwrap` sandbox (fresh namespaces per command, `--unshare-all`) running the same `bash`,
//!   in a pass after the `overhead.cli_isolated` pairs (a `bwrap`'s namespace teardown slows
//!   what runs after it; a missing `bwrap` leaves the row without a baseline, saying so; under
//!   `CI` it fails the run instead).
//! - `overhead.first_command_isolated`: a new task's first command (the server creates its
//!   isolated sandbox: the init and its namespaces, the workspace, the first durable commit)
//!   against the same command spawned bare.
//! - `overhead.cli_oneshot`: the same with `terminal.server = never` (each process opens the
//!   store, takes the task's lock, recovers the task and probes its sandbox).
//! - `overhead.stored_tasks`: a warm `taskbox run` through a server whose store holds 10,000
//!   tasks, against the same through a server whose store holds 2: nothing a command does may
//!   grow with the tasks stored.
//! - `overhead.first_byte`: how long after a command wrote its first line a `taskbox run`
//!   through a server has it on its stdout (output streams live), against the same read from a
//!   bare `bash -c` process's pipe. The command prints the wall-clock time it writes at, so the
//!   figure is the sandbox's clock against the caller's read, nothing of the command's own run.
//!
//! Every row sets `terminal.local_isolation` itself, so whichever the default is, the plain
//! rows measure the unisolated sandbox and the `_isolated` rows the isolated one.

use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use super::journal::DurableProbe;
use super::server::BenchServer;
use super::stats::{median, ms, Paired};
use super::{BenchError, Ctx, Measurement, Mode, Quantity, Target};
use crate::config::{Config, LocalIsolation};
use crate::engine::Orchestrator;
use crate::provider::ExecRequest;
use crate::TaskId;

const BENCH: &str = "overhead";

/// The library path's budget (issue 11).
const TARGET_LIBRARY_ADDED_MS: f64 = 1.0;

/// A warm command with many stored tasks, at most this times the same with two.
const TARGET_STORED_RATIO: f64 = 1.05;

/// The command both sides run: cheap, with output to capture.
const COMMAND: &str = "echo ok";

/// The per-command budget the CLI may add.
const TARGET_CLI_ADDED_MS: f64 = 2.0;

/// A new isolated task's first command: at most this long (issue 31; public medians: Daytona
/// 186 ms, E2B 491 ms, Vercel 671 ms).
const TARGET_FIRST_COMMAND_MS: f64 = 50.0;

/// The bare sandbox the isolated rows are compared with: fresh namespaces of every kind, the
/// host's root read-only, then the same command as the other side.
const BWRAP_ARGS: [&str; 8] = [
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--unshare-all",
];

/// The first byte's budget (issue 11): the first line is on the caller's stdout this soon
/// after the command wrote it, whatever comes after.
const TARGET_FIRST_BYTE_MS: f64 = 100.0;

/// The first-byte command: its first line is the wall-clock time (ns) it is written at; the
/// rest comes a pause later, so a caller that waited for the end would be that late.
const FIRST_BYTE_COMMAND: &str = "date +%s%N; sleep 0.3; echo b";

/// Unpaired runs before sampling (page cache, sandbox creation, lazy init).
const WARMUP: usize = 3;

pub(super) fn run(ctx: &mut Ctx<'_>) -> Result<Vec<Measurement>, BenchError> {
    let n = ctx.opts.mode.pick(20, 200, 400);
    let mut rows = Vec::new();
    if ctx.wants("overhead.library") {
        ctx.say(&format!("overhead.library: {n} commands each side"));
        let dir = ctx.subdir("overhead-library")?;
        let (p, sync, provider) = library(&dir, n)?;
        let mut m = row(
            "overhead.library",
            "`echo ok` in a warm task, Orchestrator held open (local backend)",
            &p,
            &sync,
            TARGET_LIBRARY_ADDED_MS,
        );
        m.notes.push(format!(
            "LocalProvider::exec alone (its wrapper script and working-directory bookkeeping) adds {} ms over bare bash (median of pairs measured alongside)",
            super::fmt_num(provider.added_median()),
        ));
        rows.push(m);
    }
    let exe = ctx.opts.exe.clone();
    if ctx.wants("overhead.cli") {
        ctx.say(&format!(
            "overhead.cli: {n} `taskbox run` processes through a server, each side"
        ));
        let home = ctx.subdir("overhead-cli")?;
        write_config(&home, LocalIsolation::None)?;
        let (p, sync) = with_servers(&exe, &[&home], || cli(&exe, &home, n, &[]))?;
        let mut m = row(
            "overhead.cli",
            "`taskbox run --task T 'echo ok'` through a running server, one process per command (local backend)",
            &p,
            &sync,
            TARGET_CLI_ADDED_MS,
        );
        m.notes.truncate(1);
        m.notes.push(format!(
            "the server waits for no disk sync per warm command, as the library path (a sync costs {} ms on this disk)",
            super::fmt_num(median(&sync))
        ));
        rows.push(m);
    }
    if ctx.wants("overhead.cli_isolated") || ctx.wants("overhead.cli_isolated_bwrap") {
        let bwrap = bwrap_available()?;
        ctx.say(&format!(
            "overhead.cli_isolated: {n} `taskbox run` processes through a server, \
             terminal.local_isolation = namespaces, each side{}",
            if bwrap { " and bare `bwrap`" } else { "" }
        ));
        let home = ctx.subdir("overhead-cli-isolated")?;
        write_config(&home, LocalIsolation::Namespaces)?;
        let (p, sync, b) = with_servers(&exe, &[&home], || cli_isolated(&exe, &home, n, bwrap))?;
        let mut m = row(
            "overhead.cli_isolated",
            "`taskbox run --task T 'echo ok'` through a running server, each sandbox in its own namespaces (terminal.local_isolation = namespaces)",
            &p,
            &sync,
            TARGET_CLI_ADDED_MS,
        );
        m.notes.truncate(1);
        rows.push(m);
        rows.push(bwrap_row(&b));
    }
    if ctx.wants("overhead.first_command_isolated") {
        let n = ctx.opts.mode.pick(5, 30, 60);
        ctx.say(&format!(
            "overhead.first_command_isolated: {n} new tasks' first `taskbox run` through a server, \
             terminal.local_isolation = namespaces, each side"
        ));
        let home = ctx.subdir("overhead-first-command")?;
        write_config(&home, LocalIsolation::Namespaces)?;
        let p = with_servers(&exe, &[&home], || first_commands(&exe, &home, n))?;
        rows.push(Measurement::paired_ms(
            "overhead.first_command_isolated",
            "a new task's first `taskbox run --task NEW 'echo ok'` through a running server: its isolated sandbox created (init, namespaces, workspace), the command run",
            "`bash -c 'echo ok'` spawned bare",
            &p,
            Target::Below {
                value: TARGET_FIRST_COMMAND_MS,
            },
            vec!["each sample a task never seen before; the task is removed (`taskbox rm`) after its sample, outside the time".to_string()],
        ));
    }
    if ctx.wants("overhead.cli_oneshot") {
        ctx.say(&format!(
            "overhead.cli_oneshot: {n} one-shot `taskbox run` processes each side"
        ));
        let home = ctx.subdir("overhead-cli-oneshot")?;
        write_config(&home, LocalIsolation::None)?;
        let never = [("TASKBOX_SERVER".to_string(), "never".to_string())];
        let (p, sync) = cli(&exe, &home, n, &never)?;
        let mut m = row(
            "overhead.cli_oneshot",
            "`taskbox run` with terminal.server = never: each process is a one-shot engine (local backend)",
            &p,
            &sync,
            TARGET_CLI_ADDED_MS,
        );
        m.target = Target::Report;
        m.target_text = Target::Report.describe("ms");
        m.met = None;
        rows.push(m);
    }
    if ctx.wants("overhead.stored_tasks") {
        let stored = match ctx.opts.mode {
            Mode::Quick => 1_000,
            Mode::Standard | Mode::Full => 10_000,
        };
        ctx.say(&format!(
            "overhead.stored_tasks: {n} warm `taskbox run` each, {stored} stored tasks vs 2"
        ));
        let many = ctx.subdir("overhead-stored-many")?;
        let few = ctx.subdir("overhead-stored-few")?;
        write_config(&many, LocalIsolation::None)?;
        write_config(&few, LocalIsolation::None)?;
        super::server::store_idle_tasks(&many, stored - 1)?;
        super::server::store_idle_tasks(&few, 1)?;
        let p = with_servers(&exe, &[&many, &few], || stored_pairs(&exe, &many, &few, n))?;
        rows.push(Measurement::paired_ms(
            "overhead.stored_tasks",
            format!("a warm `taskbox run` through a server, {stored} tasks stored"),
            "the same, 2 tasks stored",
            &p,
            Target::RatioAtMost {
                ratio: TARGET_STORED_RATIO,
            },
            vec![],
        ));
    }
    if ctx.wants("overhead.first_byte") {
        let n = ctx.opts.mode.pick(3, 20, 40);
        ctx.say(&format!(
            "overhead.first_byte: {n} `taskbox run` processes through a server, each side"
        ));
        let home = ctx.subdir("overhead-first-byte")?;
        write_config(&home, LocalIsolation::None)?;
        let p = with_servers(&exe, &[&home], || first_byte_pairs(&exe, &home, n))?;
        rows.push(Measurement::paired_ms(
            "overhead.first_byte",
            format!(
                "the first line of `{FIRST_BYTE_COMMAND}` on a `taskbox run`'s stdout through a running server (local backend), after it was written"
            ),
            "the same line read from a bare `bash -c` process's stdout pipe",
            &p,
            Target::Below {
                value: TARGET_FIRST_BYTE_MS,
            },
            vec!["the rest of the output comes 300 ms later: a caller that got the output only at the end would be 300 ms late".to_string()],
        ));
    }
    Ok(rows)
}

/// First-byte latencies through `taskbox run` (a server runs for `home`) and through a bare
/// `bash -c`, alternating which goes first: (subject, baseline) pairs.
fn first_byte_pairs(exe: &Path, home: &Path, n: usize) -> Result<Paired, BenchError> {
    let always = [("TASKBOX_SERVER".to_string(), "always".to_string())];
    let mut subject = || {
        let mut cmd = super::server::taskbox(exe, home, &always);
        cmd.args(["run", "--task", "bench-first-byte", FIRST_BYTE_COMMAND]);
        first_byte_of(cmd, "taskbox run")
    };
    let mut bare = || {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg("-c").arg(FIRST_BYTE_COMMAND).stdin(Stdio::null());
        first_byte_of(cmd, "bash -c")
    };
    // The task's sandbox is made by the first run, outside the samples.
    subject()?;
    bare()?;
    let mut p = Paired::default();
    for i in 0..n {
        p.take(i, &mut subject, &mut bare)?;
    }
    Ok(p)
}

/// Runs `cmd` (which prints `FIRST_BYTE_COMMAND`'s output) and returns how long after the
/// time its first line states that line was read here, in ms; checks the rest of the output.
fn first_byte_of(mut cmd: std::process::Command, what: &str) -> Result<f64, BenchError> {
    use std::io::{BufRead, Read};
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(BenchError::io(BENCH, format!("spawn {what}")))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut reader = std::io::BufReader::new(stdout);
    let mut first = String::new();
    let read = reader.read_line(&mut first);
    let seen = std::time::SystemTime::now();
    let mut rest = String::new();
    let rest_read = reader.read_to_string(&mut rest);
    let out = child
        .wait_with_output()
        .map_err(BenchError::io(BENCH, format!("wait for {what}")))?;
    read.map_err(BenchError::io(BENCH, format!("read {what}'s output")))?;
    rest_read.map_err(BenchError::io(BENCH, format!("read {what}'s output")))?;
    let written_ns: Option<u128> = first.trim().parse().ok();
    let (Some(written_ns), true, "b\n") = (written_ns, out.status.success(), rest.as_str()) else {
        return Err(BenchError::failed(
            BENCH,
            format!(
                "{what} `{FIRST_BYTE_COMMAND}` answered {:?} then {rest:?} ({}): {}",
                first,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    };
    let seen_ns = seen
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| BenchError::failed(BENCH, "the system clock is before 1970"))?
        .as_nanos();
    // Both clocks are this machine's wall clock; a step of it during a sample shows as 0.
    Ok(seen_ns.saturating_sub(written_ns) as f64 / 1e6)
}

/// Runs `f` with a `taskbox serve` running for each home, stopping them afterwards.
fn with_servers<T>(
    exe: &Path,
    homes: &[&Path],
    f: impl FnOnce() -> Result<T, BenchError>,
) -> Result<T, BenchError> {
    let rt = runtime()?;
    let mut servers = Vec::new();
    for home in homes {
        servers.push(rt.block_on(BenchServer::start(exe, home, &[]))?);
    }
    let result = f();
    for s in servers {
        rt.block_on(s.stop());
    }
    result
}

/// Warm commands in two homes, alternating which goes first: (many, few) pairs.
fn stored_pairs(exe: &Path, many: &Path, few: &Path, n: usize) -> Result<Paired, BenchError> {
    let always = [("TASKBOX_SERVER".to_string(), "always".to_string())];
    for _ in 0..WARMUP {
        cli_once(exe, many, &always)?;
        cli_once(exe, few, &always)?;
    }
    let mut p = Paired::default();
    for i in 0..n {
        p.take(i, &mut || cli_once(exe, many, &always), &mut || {
            cli_once(exe, few, &always)
        })?;
    }
    Ok(p)
}

/// Disk syncs a command in a warm task waits for: none. Its start (`run_requested` in a
/// sandbox that ran a command before) and its result (`command_exited`) are committed without
/// waiting for the sync; the next synced commit covers both (see `engine::batch`). A sandbox's
/// first command waits for one.
const COMMITS_PER_COMMAND: f64 = 0.0;

fn row(
    name: &str,
    subject_is: &str,
    p: &Paired,
    sync: &[f64],
    target_added_ms: f64,
) -> Measurement {
    let sync_ms = median(sync);
    let added = p.added_median();
    let syncs = format!(
        "a durable SQLite commit (WAL, synchronous=FULL) costs {} ms on this disk (median, measured alongside); \
         a warm command waits for {COMMITS_PER_COMMAND} (its start and its result ride on the next synced commit), so {} ms of the {} ms added are disk syncs",
        super::fmt_num(sync_ms),
        super::fmt_num(COMMITS_PER_COMMAND * sync_ms),
        super::fmt_num(added),
    );
    let target = Target::AddedAtMost {
        value: target_added_ms,
        unit: "ms",
    };
    let bare = "`bash -c 'echo ok'` spawned bare";
    Measurement::paired_ms(name, subject_is, bare, p, target, vec![syncs])
}

/// Runs the bare baseline once and checks its answer.
async fn bare_async() -> Result<f64, BenchError> {
    let t = Instant::now();
    let out = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(COMMAND)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .map_err(BenchError::io(BENCH, "spawn bash"))?;
    let took = ms(t.elapsed());
    check_output(out.status.success(), &out.stdout, "bash -c")?;
    Ok(took)
}

fn bare_sync() -> Result<f64, BenchError> {
    let t = Instant::now();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(COMMAND)
        .stdin(Stdio::null())
        .output()
        .map_err(BenchError::io(BENCH, "spawn bash"))?;
    let took = ms(t.elapsed());
    check_output(out.status.success(), &out.stdout, "bash -c")?;
    Ok(took)
}

fn check_output(ok: bool, stdout: &[u8], what: &str) -> Result<(), BenchError> {
    if ok && stdout == b"ok\n" {
        return Ok(());
    }
    Err(BenchError::failed(
        BENCH,
        format!(
            "{what} `{COMMAND}` answered {:?} (exit ok: {ok}), expected \"ok\\n\"",
            String::from_utf8_lossy(stdout)
        ),
    ))
}

fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    super::runtime(BENCH)
}

/// The subject and baseline, the durable-commit probe, and the local provider's exec alone
/// (paired with the same baseline samples).
fn library(dir: &Path, n: usize) -> Result<(Paired, Vec<f64>, Paired), BenchError> {
    let mut probe = DurableProbe::open(&dir.join("probe.db"))?;
    runtime()?.block_on(async {
        let orch = Orchestrator::builder(dir.to_path_buf(), config(LocalIsolation::None))
            .reconcile_on_start(false)
            .open()
            .await
            .map_err(BenchError::engine(
                BENCH,
                format!("open an orchestrator on {}", dir.display()),
            ))?;
        let task = TaskId::new("bench-overhead").expect("a valid task id");
        let result =
            async {
                let subject = || async {
                    let t = Instant::now();
                    let out = orch.run(&task, COMMAND, None).await.map_err(|source| {
                        BenchError::Engine {
                            bench: BENCH,
                            action: "run a command".into(),
                            source: Box::new(source),
                        }
                    })?;
                    let took = ms(t.elapsed());
                    check_output(out.exit_code == 0, out.stdout.as_bytes(), "taskbox")?;
                    Ok::<f64, BenchError>(took)
                };
                for _ in 0..WARMUP {
                    subject().await?;
                    bare_async().await?;
                }
                let view = orch
                    .show(&task, 0)
                    .await
                    .map_err(BenchError::engine(BENCH, "look up the task's sandbox"))?;
                let sandbox = view
                    .and_then(|v| v.task.sandbox)
                    .ok_or_else(|| BenchError::failed(BENCH, "the warm task has no live sandbox"))?
                    .id;
                let provider = orch.provider();
                let request = ExecRequest {
                    command: COMMAND.into(),
                    timeout_ms: 60_000,
                };
                let provider_only = || async {
                    let t = Instant::now();
                    let out = provider.exec(&sandbox, &request).await.map_err(|e| {
                        BenchError::failed(BENCH, format!("LocalProvider::exec: {e}"))
                    })?;
                    let took = ms(t.elapsed());
                    check_output(
                        out.exit_code == 0,
                        out.stdout.as_bytes(),
                        "LocalProvider::exec",
                    )?;
                    Ok::<f64, BenchError>(took)
                };
                let mut p = Paired::default();
                let mut alone = Paired::default();
                let mut sync = Vec::with_capacity(n);
                for i in 0..n {
                    // Alternate which side goes first, so neither always follows the other.
                    let (s, b) = if i % 2 == 0 {
                        let s = subject().await?;
                        (s, bare_async().await?)
                    } else {
                        let b = bare_async().await?;
                        (subject().await?, b)
                    };
                    p.subject.push(s);
                    p.baseline.push(b);
                    alone.subject.push(provider_only().await?);
                    alone.baseline.push(b);
                    sync.push(probe.commit_one()?);
                }
                Ok((p, sync, alone))
            }
            .await;
        orch.shutdown().await;
        result
    })
}

/// One `taskbox run` of the warm task in `home`; its wall time.
fn cli_once(exe: &Path, home: &Path, env: &[(String, String)]) -> Result<f64, BenchError> {
    run_once(exe, home, env, "bench-overhead")
}

/// One `taskbox run --task task` in `home`; its wall time.
fn run_once(
    exe: &Path,
    home: &Path,
    env: &[(String, String)],
    task: &str,
) -> Result<f64, BenchError> {
    let mut cmd = super::server::taskbox(exe, home, env);
    cmd.args(["run", "--task", task, COMMAND]);
    let t = Instant::now();
    let out = cmd
        .output()
        .map_err(BenchError::io(BENCH, format!("spawn {}", exe.display())))?;
    let took = ms(t.elapsed());
    if !out.status.success() {
        return Err(BenchError::failed(
            BENCH,
            format!(
                "`{} run` failed ({}): {}",
                exe.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    check_output(true, &out.stdout, "taskbox run")?;
    Ok(took)
}

/// `taskbox run` processes against bare `bash -c` ones, alternating; with `env` (a server
/// runs for `home` unless `env` says `never`).
fn cli(
    exe: &Path,
    home: &Path,
    n: usize,
    env: &[(String, String)],
) -> Result<(Paired, Vec<f64>), BenchError> {
    let mut probe = DurableProbe::open(&home.join("probe.db"))?;
    let mut env = env.to_vec();
    if env.is_empty() {
        env.push(("TASKBOX_SERVER".into(), "always".into()));
    }
    let mut subject = || cli_once(exe, home, &env);
    for _ in 0..WARMUP {
        subject()?;
        bare_sync()?;
    }
    let mut p = Paired::default();
    let mut sync = Vec::with_capacity(n);
    for i in 0..n {
        p.take(i, &mut subject, &mut bare_sync)?;
        sync.push(probe.commit_one()?);
    }
    Ok((p, sync))
}

/// The default configuration with `terminal.local_isolation = mode`.
fn config(mode: LocalIsolation) -> Config {
    let mut config = Config::default();
    config.terminal.local_isolation = mode;
    config
}

/// Writes `home`'s `config.toml`: the defaults with `terminal.local_isolation = mode`.
fn write_config(home: &Path, mode: LocalIsolation) -> Result<(), BenchError> {
    let path = home.join("config.toml");
    config(mode).save(&path).map_err(|e| {
        BenchError::failed(
            BENCH,
            format!("cannot write the config {}: {e}", path.display()),
        )
    })
}

/// Whether `bwrap` can be run here. Missing, the bwrap row says so; under `CI` (set, not
/// `0`/`false`) a missing `bwrap` fails the run instead, so CI always measures it.
fn bwrap_available() -> Result<bool, BenchError> {
    let found = std::process::Command::new("bwrap")
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match found {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let ci = std::env::var("CI")
                .is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "FALSE" | "False"));
            if ci {
                Err(BenchError::MissingTool {
                    bench: BENCH,
                    tool: "bubblewrap",
                })
            } else {
                Ok(false)
            }
        }
        Err(e) => Err(BenchError::io(BENCH, "run bwrap --version")(e)),
    }
}

/// One bare `bwrap … bash -c 'echo ok'`; its wall time.
fn bwrap_once() -> Result<f64, BenchError> {
    let t = Instant::now();
    let out = std::process::Command::new("bwrap")
        .args(BWRAP_ARGS)
        .args(["bash", "-c", COMMAND])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(BenchError::io(BENCH, "spawn bwrap"))?;
    let took = ms(t.elapsed());
    if !out.status.success() {
        return Err(BenchError::failed(
            BENCH,
            format!(
                "`bwrap {} bash -c '{COMMAND}'` failed ({}): {}",
                BWRAP_ARGS.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    check_output(true, &out.stdout, "bwrap")?;
    Ok(took)
}

/// Isolated `taskbox run` processes (a server runs for `home`) against bare `bash -c` ones, then,
/// with `bwrap`, against bare `bwrap` ones in a pass of their own (each pass alternating which
/// goes first): the (taskbox, bash) pairs, the disk-sync probe, and the (taskbox, bwrap) pairs
/// (empty without `bwrap`).
///
/// Why two passes: a `bwrap --unshare-all` leaves the kernel tearing its network namespace down
/// after it exits (a workqueue's, on a 2-CPU machine beside whatever runs next). Interleaved with
/// the pairs, every `bwrap` slowed the commands measured after it, and the old rotation put the
/// taskbox command right after one in two of three rounds and the bare shell never: measured
/// side by side, a warm isolated command took +1.9–2.0 ms over bare `bash -c` with no `bwrap` in
/// the loop and +2.3 ms with one per round (docs/performance.md, session 34).
fn cli_isolated(
    exe: &Path,
    home: &Path,
    n: usize,
    bwrap: bool,
) -> Result<(Paired, Vec<f64>, Paired), BenchError> {
    let mut probe = DurableProbe::open(&home.join("probe.db"))?;
    let env = [("TASKBOX_SERVER".to_string(), "always".to_string())];
    let mut subject = || cli_once(exe, home, &env);
    for _ in 0..WARMUP {
        subject()?;
        bare_sync()?;
    }
    let mut p = Paired::default();
    let mut sync = Vec::with_capacity(n);
    for i in 0..n {
        p.take(i, &mut subject, &mut bare_sync)?;
        sync.push(probe.commit_one()?);
    }
    let mut b = Paired::default();
    if bwrap {
        let mut sandboxed = bwrap_once;
        for _ in 0..WARMUP {
            sandboxed()?;
        }
        for i in 0..n {
            b.take(i, &mut subject, &mut sandboxed)?;
        }
    }
    Ok((p, sync, b))
}

/// The row of isolated commands against bare `bwrap` (its pairs empty: `bwrap` is missing).
fn bwrap_row(b: &Paired) -> Measurement {
    let bwrap = format!(
        "`bwrap {} bash -c '{COMMAND}'` spawned bare",
        BWRAP_ARGS.join(" ")
    );
    let subject_is =
        "isolated `taskbox run` commands through the `overhead.cli_isolated` server, in a pass of their own";
    if b.subject.is_empty() {
        return Measurement::new(
            "overhead.cli_isolated_bwrap",
            subject_is,
            Quantity::new(f64::NAN, "ms"),
            bwrap,
            Quantity::new(f64::NAN, "ms"),
            None,
            Target::Report,
            0,
            vec!["not measured: `bwrap` is not installed (Debian/Ubuntu: `apt-get install bubblewrap`)".to_string()],
        );
    }
    let why = "bwrap makes every namespace afresh per command; taskbox enters its sandbox's (made once, at its first command) and runs the command through the server";
    let name = "overhead.cli_isolated_bwrap";
    Measurement::paired_ms(name, subject_is, bwrap, b, Target::Report, vec![why.into()])
}

/// New tasks' first `taskbox run` (a server runs for `home`) against bare `bash -c`,
/// alternating; each task is removed after its sample, outside the time.
fn first_commands(exe: &Path, home: &Path, n: usize) -> Result<Paired, BenchError> {
    let env = [("TASKBOX_SERVER".to_string(), "always".to_string())];
    let mut next = 0;
    let mut subject = || {
        next += 1;
        let task = format!("bench-first-{next}");
        let took = run_once(exe, home, &env, &task)?;
        let mut rm = super::server::taskbox(exe, home, &env);
        let out = rm
            .args(["rm", &task])
            .output()
            .map_err(BenchError::io(BENCH, format!("spawn {} rm", exe.display())))?;
        if !out.status.success() {
            return Err(BenchError::failed(
                BENCH,
                format!(
                    "`taskbox rm {task}` failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            ));
        }
        Ok::<f64, BenchError>(took)
    };
    // The server's first sandbox pays for its lazy start (the store, the runtime's threads).
    subject()?;
    bare_sync()?;
    let mut p = Paired::default();
    for i in 0..n {
        p.take(i, &mut subject, &mut bare_sync)?;
    }
    Ok(p)
}
