//! Per-command overhead on the local backend: a command in a warm task (its sandbox already
//! live) against the same command spawned bare with `bash -c`, pair by pair.
//!
//! - `overhead.library`: an [`Orchestrator`] held open, as a Rust program embedding taskbox
//!   holds it; the bare command is spawned on the same tokio runtime.
//! - `overhead.cli`: one `taskbox run` process per command (what an agent that shells out pays:
//!   process start, store open, task lock, two durable commits, the command), against one bare
//!   `bash -c` process per command.

use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use super::journal::DurableProbe;
use super::stats::{median, ms, Paired};
use super::{BenchError, Ctx, Measurement, Mode, Quantity, Target};
use crate::config::Config;
use crate::engine::Orchestrator;
use crate::provider::ExecRequest;
use crate::TaskId;

const BENCH: &str = "overhead";

/// The command both sides run: cheap, with output to capture.
const COMMAND: &str = "echo ok";

/// The per-command budget taskbox may add.
const TARGET_ADDED_MS: f64 = 2.0;

/// Unpaired runs before sampling (page cache, sandbox creation, lazy init).
const WARMUP: usize = 3;

pub(super) fn run(ctx: &mut Ctx<'_>) -> Result<Vec<Measurement>, BenchError> {
    let n = match ctx.opts.mode {
        Mode::Quick => 20,
        Mode::Standard => 200,
        Mode::Full => 400,
    };
    let mut rows = Vec::new();
    if ctx.wants("overhead.library") {
        ctx.say(&format!("overhead.library: {n} commands each side"));
        let dir = ctx.subdir("overhead-library")?;
        let (p, sync, provider) = library(&dir, n)?;
        let mut m = row(
            "overhead.library",
            "`echo ok` in a warm task, Orchestrator held open (local backend)",
            &p,
            n,
            &sync,
        );
        m.notes.push(format!(
            "LocalProvider::exec alone (its wrapper script and working-directory bookkeeping) adds {} ms over bare bash (median of pairs measured alongside)",
            super::fmt_num(provider.added_median()),
        ));
        rows.push(m);
    }
    if ctx.wants("overhead.cli") {
        ctx.say(&format!(
            "overhead.cli: {n} `taskbox run` processes each side"
        ));
        let home = ctx.subdir("overhead-cli")?;
        let (p, sync) = cli(&ctx.opts.exe, &home, n)?;
        rows.push(row(
            "overhead.cli",
            "`taskbox run --task T 'echo ok'`, one process per command (local backend)",
            &p,
            n,
            &sync,
        ));
    }
    Ok(rows)
}

/// Durable journal commits a command in a warm task makes: `run_requested` (write-ahead of the
/// command) and `command_exited` (its result).
const COMMITS_PER_COMMAND: f64 = 2.0;

fn row(name: &str, subject_is: &str, p: &Paired, n: usize, sync: &[f64]) -> Measurement {
    let sync_ms = median(sync);
    let added = p.added_median();
    Measurement::new(
        name,
        subject_is,
        Quantity::new(p.subject_median(), "ms"),
        "`bash -c 'echo ok'` spawned bare",
        Quantity::new(p.baseline_median(), "ms"),
        Some(Quantity::new(p.added_median(), "ms")),
        Target::AddedAtMost {
            value: TARGET_ADDED_MS,
            unit: "ms",
        },
        n,
        vec![
            p.spread("ms"),
            format!(
                "a durable SQLite commit (WAL, synchronous=FULL) costs {} ms on this disk (median, measured alongside); \
                 a command makes {COMMITS_PER_COMMAND}, so {} ms of the {} ms added are disk syncs and {} ms the rest",
                super::fmt_num(sync_ms),
                super::fmt_num(COMMITS_PER_COMMAND * sync_ms),
                super::fmt_num(added),
                super::fmt_num(added - COMMITS_PER_COMMAND * sync_ms),
            ),
        ],
    )
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
    // Two workers, like the `taskbox` binary.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(BenchError::io(BENCH, "start a tokio runtime"))
}

/// The subject and baseline, the durable-commit probe, and the local provider's exec alone
/// (paired with the same baseline samples).
fn library(dir: &Path, n: usize) -> Result<(Paired, Vec<f64>, Paired), BenchError> {
    let mut probe = DurableProbe::open(&dir.join("probe.db"))?;
    runtime()?.block_on(async {
        let orch = Orchestrator::builder(dir.to_path_buf(), Config::default())
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

fn cli(exe: &Path, home: &Path, n: usize) -> Result<(Paired, Vec<f64>), BenchError> {
    let mut probe = DurableProbe::open(&home.join("probe.db"))?;
    let subject = || -> Result<f64, BenchError> {
        let mut cmd = std::process::Command::new(exe);
        cmd.args(["run", "--task", "bench-overhead", COMMAND])
            .env("TASKBOX_HOME", home)
            .stdin(Stdio::null());
        for var in [
            "RUST_LOG",
            "VERCEL_TOKEN",
            "VERCEL_OIDC_TOKEN",
            "VERCEL_PROJECT_ID",
            "VERCEL_TEAM_ID",
            "TERMINAL_VERCEL_RUNTIME",
            "TASKBOX_VERCEL_API_URL",
        ] {
            cmd.env_remove(var);
        }
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
    };
    for _ in 0..WARMUP {
        subject()?;
        bare_sync()?;
    }
    let mut p = Paired::default();
    let mut sync = Vec::with_capacity(n);
    for i in 0..n {
        let (s, b) = if i % 2 == 0 {
            let s = subject()?;
            (s, bare_sync()?)
        } else {
            let b = bare_sync()?;
            (subject()?, b)
        };
        p.subject.push(s);
        p.baseline.push(b);
        sync.push(probe.commit_one()?);
    }
    Ok((p, sync))
}
