//! `taskbox mcp`: taskbox as a Model Context Protocol server, so that any MCP client (a coding
//! agent) gets a sandbox per task as tools. Built on the official Rust SDK (`rmcp`).
//!
//! It speaks MCP over stdio (the client spawns `taskbox mcp`), or with `--http ADDR` streamable
//! HTTP at `http://ADDR/mcp`, behind a bearer token (`--token-file`; it refuses to start
//! without one, as `serve --listen` does). Like the CLI it is a front end, not an engine of its
//! own: its tools go to the data dir's server (`terminal.server = auto` starts one), or, under
//! `terminal.server = never`, to one engine it opens in this process for as long as it runs.
//! What only reads — `list_tasks`, `show_task`, the timeline resources — reads the store
//! directly, as `taskbox tasks`, `show` and `replay --timeline` do.
//!
//! The protocol owns stdout (rmcp writes it); this module prints nothing there. A note (a server
//! auto-started) goes to stderr, which MCP clients keep as the server's log.

mod files;
mod lines;
mod tools;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use rmcp::ServiceExt as _;

use taskbox::config::{Config, ServerMode};
use taskbox::core::ForkFrom;
use taskbox::engine::{ForkResult, Orchestrator, Paths, ResumeResult, RunResult, SuspendResult};
use taskbox::provider::ExecIo;
use taskbox::TaskId;

use super::output::Failure;
use super::server::{self, route, Route};

/// Serve MCP on stdio (or streamable HTTP with --http).
#[derive(Args, Debug)]
pub struct McpArgs {
    /// Serve streamable HTTP at http://ADDR/mcp (such as 127.0.0.1:7425) instead of stdio;
    /// requires --token-file.
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// A file holding the bearer token HTTP clients must send (`Authorization: Bearer ...`).
    #[arg(long, value_name = "FILE", requires = "http")]
    token_file: Option<PathBuf>,
}

/// Where the tools' requests go.
pub enum Engine {
    /// One engine in this process, for as long as `taskbox mcp` runs (`terminal.server = never`).
    InProcess(Orchestrator),
    /// The data dir's server (started when needed under `auto`).
    Server(taskbox::client::Client, ServerMode),
}

impl Engine {
    /// Routes as the CLI does (`terminal.server`, `TASKBOX_SERVER`).
    async fn open(paths: &Paths) -> Result<Engine, Failure> {
        Ok(match route(paths)? {
            Route::InProcess => {
                let config = Config::load(&paths.config_file).map_err(Failure::from_config)?;
                let orch = Orchestrator::builder(paths.data_dir.clone(), config)
                    .reconcile_on_start(false)
                    .open()
                    .await
                    .map_err(Failure::from_engine)?;
                Engine::InProcess(orch)
            }
            Route::Server(client, mode) => Engine::Server(client, mode),
        })
    }

    /// Runs `command` with its live side `io` (stdin, cancel).
    async fn run(
        &self,
        task: &TaskId,
        command: &str,
        timeout: Option<u64>,
        io: ExecIo,
    ) -> Result<RunResult, Failure> {
        match self {
            Engine::InProcess(orch) => orch
                .run_live(task, command, timeout.map(Duration::from_secs), io)
                .await
                .map_err(Failure::from_engine),
            Engine::Server(client, mode) => {
                // Shared so that a retry after starting a server gets the same live side.
                let io = Arc::new(tokio::sync::Mutex::new(io));
                server::call(client, *mode, |c| {
                    let (task, command, io) = (task.clone(), command.to_string(), io.clone());
                    async move {
                        let mut io = io.lock().await;
                        c.run_live(&task, &command, timeout, &mut io).await
                    }
                })
                .await
            }
        }
    }

    async fn suspend(&self, task: &TaskId) -> Result<SuspendResult, Failure> {
        match self {
            Engine::InProcess(orch) => orch.suspend(task).await.map_err(Failure::from_engine),
            Engine::Server(client, mode) => {
                server::call(client, *mode, |c| {
                    let task = task.clone();
                    async move { c.suspend(&task).await }
                })
                .await
            }
        }
    }

    async fn resume(&self, task: &TaskId) -> Result<ResumeResult, Failure> {
        match self {
            Engine::InProcess(orch) => orch.resume(task).await.map_err(Failure::from_engine),
            Engine::Server(client, mode) => {
                server::call(client, *mode, |c| {
                    let task = task.clone();
                    async move { c.resume(&task).await }
                })
                .await
            }
        }
    }

    /// Forks `task` into `child` from `snapshot` (`None`: the latest), as `taskbox fork` does.
    async fn fork(
        &self,
        task: &TaskId,
        child: &TaskId,
        snapshot: Option<&str>,
    ) -> Result<ForkResult, Failure> {
        match self {
            Engine::InProcess(orch) => {
                let from = snapshot.map_or(ForkFrom::Latest, |s| ForkFrom::parse(task, s));
                orch.fork(task, child, from)
                    .await
                    .map_err(Failure::from_engine)
            }
            Engine::Server(client, mode) => {
                server::call(client, *mode, |c| {
                    let (task, child) = (task.clone(), child.clone());
                    let snapshot = snapshot.map(str::to_string);
                    async move { c.fork(&task, &child, snapshot.as_deref()).await }
                })
                .await
            }
        }
    }

    async fn shutdown(&self) {
        if let Engine::InProcess(orch) = self {
            orch.shutdown().await;
        }
    }
}

/// `taskbox mcp`.
pub async fn run(args: McpArgs, paths: &Paths) -> Result<ExitCode, Failure> {
    // Refused before anything is opened: HTTP without a token would hand the sandboxes to
    // whoever reaches the port.
    let http = match (&args.http, &args.token_file) {
        (None, _) => None,
        (Some(addr), token_file) => Some((addr.clone(), read_token(token_file.as_deref())?)),
    };
    let engine = Arc::new(Engine::open(paths).await?);
    let handler = tools::Taskbox::new(engine.clone(), paths.clone());
    let res = match http {
        None => stdio(handler).await,
        Some((addr, token)) => serve_http(handler, &addr, token).await,
    };
    engine.shutdown().await;
    res
}

/// The bearer token from `--token-file`, or the refusal to serve HTTP without one.
fn read_token(file: Option<&std::path::Path>) -> Result<Arc<String>, Failure> {
    let hint =
        "write a long random token to a file readable only by you and pass --token-file FILE \
                (clients send `Authorization: Bearer <token>`)";
    let Some(file) = file else {
        return Err(Failure::new(
            "--http needs a bearer token: refusing to serve MCP over HTTP without one",
        )
        .hint(hint));
    };
    let text = std::fs::read_to_string(file).map_err(|e| {
        Failure::new(format!(
            "cannot read the token file {}: {e}",
            file.display()
        ))
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(Failure::new(format!(
            "the token file {} is empty: refusing to serve MCP over HTTP without a token",
            file.display()
        ))
        .hint(hint));
    }
    Ok(Arc::new(token.to_string()))
}

/// Serves one MCP session on stdin/stdout until the client closes it (or a signal comes).
async fn stdio(handler: tools::Taskbox) -> Result<ExitCode, Failure> {
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    let (guarded, streams) = lines::Guarded::new(stdin, stdout);
    let service = handler
        .serve(streams)
        .await
        .map_err(|e| Failure::new(format!("the MCP session could not start: {e}")))?;
    let stop = service.cancellation_token();
    let res = tokio::select! {
        res = service.waiting() => {
            res.map(|_| ()).map_err(|e| Failure::new(format!("the MCP session failed: {e}")))
        }
        () = signals() => {
            stop.cancel();
            Ok(())
        }
    };
    guarded.finish().await;
    res.map(|()| ExitCode::SUCCESS)
}

/// Serves streamable HTTP at `http://addr/mcp` until a signal, every request checked for the
/// bearer token before the MCP service sees it.
async fn serve_http(
    handler: tools::Taskbox,
    addr: &str,
    token: Arc<String>,
) -> Result<ExitCode, Failure> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::new(format!("cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::new(format!("cannot listen on {addr}: {e}")))?;
    // The bearer token is the guard; the Host allow-list (against DNS rebinding of a tokenless
    // local server) would only refuse a client that reached the port by another name.
    let config = StreamableHttpServerConfig::default().disable_allowed_hosts();
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let app = axum::Router::new().route_service("/mcp", service).layer(
        axum::middleware::from_fn_with_state(token, taskbox::server::require_token),
    );
    eprintln!(
        "taskbox mcp (pid {}) serving MCP over streamable HTTP at http://{bound}/mcp (bearer token required)",
        std::process::id()
    );
    // The server's own accept loop: a deadline for a request's head (a half-sent request is
    // closed), a bound on a body's stalls and a connection cap.
    taskbox::server::serve_guarded(listener, app, signals()).await;
    Ok(ExitCode::SUCCESS)
}

/// SIGTERM, SIGINT or SIGHUP.
async fn signals() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        _ = hup.recv() => {}
    }
}
