//! Vercel client efficiency: HTTP requests taskbox makes, counted on the server's side by the
//! fake Vercel server (`taskbox::fake`) running in this process on 127.0.0.1.
//!
//! - `vercel.per_command`: requests per command in a warm sandbox, through the engine (an
//!   [`Orchestrator`] over the real [`VercelProvider`]). Hermes calls `refresh()` (a GET) before
//!   every command; taskbox knows its sandbox's deadline and sends only the command.
//! - `vercel.cli_per_command`: the same through the CLI: one `taskbox run` process per command,
//!   talking to a running `taskbox serve` on the Vercel backend. The server knows its sandbox is
//!   live (its own timers snapshot it before the deadline), so a command lists nothing, probes
//!   nothing: one request.
//! - `vercel.lifecycle`: requests for create → command → snapshot → restore → command → stop,
//!   made through the provider.
//!
//! The baseline is the API's minimum, one request per operation: request counts are not noisy,
//! so there is nothing to measure side by side.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::server::{taskbox, BenchServer};
use super::stats::median;
use super::{BenchError, Ctx, Measurement, Quantity, Target};
use crate::clock::SystemClock;
use crate::config::Config;
use crate::engine::Orchestrator;
use crate::fake::{FakeOptions, FakeServer, Stats};
use crate::provider::vercel::VercelProvider;
use crate::provider::{ExecRequest, ProviderError, SandboxProvider, SandboxSpec};
use crate::TaskId;

const BENCH: &str = "vercel";

/// Operations in the lifecycle: create, command, snapshot, restore, command, stop.
const LIFECYCLE_OPS: f64 = 6.0;

fn config() -> Config {
    let mut c = Config::default();
    c.terminal.backend = crate::provider::vercel::BACKEND.backend();
    c.terminal.container_cpu = 1;
    c.terminal.container_memory = 2048;
    c
}

fn provider_err(action: &str) -> impl FnOnce(ProviderError) -> BenchError + '_ {
    move |e| BenchError::failed(BENCH, format!("{action}: {e}"))
}

/// "name N, name N" for the notes.
fn breakdown(stats: &Stats) -> String {
    let by: BTreeMap<&str, u64> = stats
        .requests
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    by.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

struct Counts {
    per_command: f64,
    per_command_breakdown: String,
    cli_per_command: f64,
    cli_breakdown: String,
    lifecycles: Vec<f64>,
    lifecycle_breakdown: String,
}

async fn measure(
    exe: &Path,
    dir: &Path,
    commands: usize,
    lifecycles: usize,
) -> Result<Counts, BenchError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(BenchError::io(BENCH, "listen on 127.0.0.1"))?;
    let fake = FakeServer::start(listener, FakeOptions::new(dir.join("fake")))
        .await
        .map_err(|e| BenchError::failed(BENCH, format!("start the fake Vercel server: {e}")))?;
    let url = fake.base_url();
    let env = move |k: &str| -> Option<String> {
        match k {
            "VERCEL_TOKEN" => Some("bench-token".into()),
            "VERCEL_PROJECT_ID" => Some("prj_bench".into()),
            "VERCEL_TEAM_ID" => Some("team_bench".into()),
            "TASKBOX_VERCEL_API_URL" => Some(url.clone()),
            _ => None,
        }
    };
    let cfg = config();
    let provider = Arc::new(
        VercelProvider::from_config(&cfg.terminal, &env, dir, Arc::new(SystemClock))
            .map_err(|e| BenchError::failed(BENCH, format!("set up the Vercel provider: {e}")))?,
    );
    let result = async {
        // Warm commands, through the engine.
        let orch = Orchestrator::builder(dir.join("data"), cfg)
            .provider(provider.clone())
            .reconcile_on_start(false)
            .open()
            .await
            .map_err(BenchError::engine(BENCH, "open the orchestrator"))?;
        let task = TaskId::new("bench-vercel").expect("a valid task id");
        let engine_err = |source| BenchError::Engine {
            bench: BENCH,
            action: "run a command".into(),
            source: Box::new(source),
        };
        let warm = async {
            orch.run(&task, "echo warm", None)
                .await
                .map_err(engine_err)?;
            fake.reset_stats();
            for i in 0..commands {
                let out = orch
                    .run(&task, &format!("echo {i}"), None)
                    .await
                    .map_err(engine_err)?;
                if out.stdout != format!("{i}\n") {
                    return Err(BenchError::failed(
                        BENCH,
                        format!("`echo {i}` answered {:?}", out.stdout),
                    ));
                }
            }
            Ok::<Stats, BenchError>(fake.stats())
        }
        .await;
        orch.shutdown().await;
        let warm = warm?;

        // Warm commands through the CLI and a server.
        let cli = cli_per_command(exe, dir, &fake, commands).await?;

        // Lifecycles, through the provider.
        let mut counts = Vec::new();
        let mut last = None;
        for l in 0..lifecycles {
            let task = TaskId::new(&format!("bench-life-{l}"))
                .map_err(|e| BenchError::failed(BENCH, e.to_string()))?;
            let spec = |generation, source_snapshot| {
                SandboxSpec::new("bench", &task, generation, source_snapshot, 300_000)
            };
            let exec = |command: &str| ExecRequest {
                command: command.into(),
                timeout_ms: 60_000,
            };
            fake.reset_stats();
            let sb = provider
                .create_sandbox(&spec(1, None))
                .await
                .map_err(provider_err("create"))?;
            provider
                .exec(&sb.id, &exec("echo kept > notes.txt"))
                .await
                .map_err(provider_err("command"))?;
            let snap = provider
                .snapshot(&task, &sb.id, 1)
                .await
                .map_err(provider_err("snapshot"))?;
            let sb = provider
                .create_sandbox(&spec(2, Some(snap.id)))
                .await
                .map_err(provider_err("restore"))?;
            let out = provider
                .exec(&sb.id, &exec("cat notes.txt"))
                .await
                .map_err(provider_err("command after the restore"))?;
            if out.stdout != "kept\n" {
                return Err(BenchError::failed(
                    BENCH,
                    format!("the restored file holds {:?}", out.stdout),
                ));
            }
            provider
                .stop_sandbox(&sb.id)
                .await
                .map_err(provider_err("stop"))?;
            let stats = fake.stats();
            counts.push(stats.total as f64);
            last = Some(stats);
        }
        Ok(Counts {
            per_command: warm.total as f64 / commands as f64,
            per_command_breakdown: breakdown(&warm),
            cli_per_command: cli.total as f64 / commands as f64,
            cli_breakdown: breakdown(&cli),
            lifecycles: counts,
            lifecycle_breakdown: last.as_ref().map(breakdown).unwrap_or_default(),
        })
    }
    .await;
    let _ = fake.shutdown().await;
    result
}

/// Requests the fake saw during `commands` warm `taskbox run` processes through a server.
async fn cli_per_command(
    exe: &Path,
    dir: &Path,
    fake: &FakeServer,
    commands: usize,
) -> Result<Stats, BenchError> {
    let home = dir.join("cli");
    let mut cfg = config();
    cfg.terminal.vercel_api_url = fake.base_url();
    cfg.save(&home.join("config.toml"))
        .map_err(|e| BenchError::failed(BENCH, format!("write the config: {e}")))?;
    let env: Vec<(String, String)> = [
        ("VERCEL_TOKEN", "bench-token"),
        ("VERCEL_PROJECT_ID", "prj_bench"),
        ("VERCEL_TEAM_ID", "team_bench"),
        ("TASKBOX_SERVER", "always"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let server = BenchServer::start(exe, &home, &env).await?;
    let run = |cmd: String| {
        let mut c = taskbox(exe, &home, &env);
        c.args(["run", "--task", "bench-vercel-cli", &cmd]);
        let mut c = tokio::process::Command::from(c);
        async move {
            let out = c
                .output()
                .await
                .map_err(BenchError::io(BENCH, "spawn taskbox run"))?;
            if !out.status.success() {
                return Err(BenchError::failed(
                    BENCH,
                    format!(
                        "`taskbox run {cmd}` failed ({}): {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                ));
            }
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        }
    };
    let result = async {
        run("echo warm".into()).await?;
        // Let the server's start-up reconcile finish before counting.
        for _ in 0..100 {
            let before = fake.stats().total;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            if fake.stats().total == before {
                break;
            }
        }
        fake.reset_stats();
        for i in 0..commands {
            let out = run(format!("echo {i}")).await?;
            if out != format!("{i}\n") {
                return Err(BenchError::failed(
                    BENCH,
                    format!("`taskbox run echo {i}` answered {out:?}"),
                ));
            }
        }
        Ok(fake.stats())
    }
    .await;
    server.stop().await;
    result
}

pub(super) fn run(ctx: &mut Ctx<'_>) -> Result<Vec<Measurement>, BenchError> {
    let (commands, lifecycles) = ctx.opts.mode.pick((5, 1), (50, 3), (100, 5));
    ctx.say(&format!(
        "vercel: {commands} warm commands and {lifecycles} lifecycles against the fake server"
    ));
    let dir = ctx.subdir("vercel")?;
    let c = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(BenchError::io(BENCH, "start a tokio runtime"))?
        .block_on(measure(&ctx.opts.exe, &dir, commands, lifecycles))?;
    Ok(vec![
        Measurement::new(
            "vercel.per_command",
            "HTTP requests per command in a warm sandbox (engine + Vercel provider), counted by the fake",
            Quantity::new(c.per_command, "requests"),
            "the API's minimum: the command request alone (Hermes: 2, a refresh GET first)",
            Quantity::new(1.0, "requests"),
            None,
            Target::RatioAtMost { ratio: 1.0 },
            commands,
            vec![format!("requests: {}", c.per_command_breakdown)],
        ),
        Measurement::new(
            "vercel.cli_per_command",
            "HTTP requests per warm `taskbox run` (CLI → running server → Vercel provider), counted by the fake",
            Quantity::new(c.cli_per_command, "requests"),
            "the API's minimum: the command request alone",
            Quantity::new(1.0, "requests"),
            None,
            Target::RatioAtMost { ratio: 1.0 },
            commands,
            vec![format!("requests: {}", c.cli_breakdown)],
        ),
        Measurement::new(
            "vercel.lifecycle",
            "HTTP requests for create → command → snapshot → restore → command → stop",
            Quantity::new(median(&c.lifecycles), "requests"),
            "the API's minimum: one request per operation",
            Quantity::new(LIFECYCLE_OPS, "requests"),
            None,
            Target::Report,
            lifecycles,
            vec![format!("requests: {}", c.lifecycle_breakdown)],
        ),
    ])
}
