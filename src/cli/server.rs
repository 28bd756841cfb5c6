//! `taskbox serve`, `taskbox status`, and how the commands that drive tasks reach an engine:
//! through the data dir's server ([`taskbox::client`]) or in-process, per `terminal.server`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use clap::Args;

use taskbox::client::{autostart, Client, ClientError, Health, Remote};
use taskbox::clock::format_ms;
use taskbox::config::{Config, ServerMode};
use taskbox::engine::Paths;
use taskbox::server::{ServeOptions, Server, StopReason};

use super::output::{print_json, Failure};

/// Serve the engine for this data dir on `<data>/taskbox.sock` (and TCP with --listen).
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Also listen on this TCP address (such as 127.0.0.1:7424); requires --token-file.
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// A file holding the bearer token TCP clients must send (mode 0600, at least 16
    /// characters); only with --listen.
    #[arg(long, value_name = "FILE", requires = "listen")]
    token_file: Option<PathBuf>,
    /// Ask the running server to stop (it suspends tasks with live sandboxes first).
    #[arg(long, conflicts_with_all = ["listen", "token_file", "auto"])]
    stop: bool,
    /// The store: `sqlite` (the data dir's file) or `postgres://user@host/database`, shared by
    /// a fleet of servers (overrides `terminal.store` and TASKBOX_STORE).
    #[arg(long, value_name = "URL", conflicts_with = "stop")]
    store: Option<String>,
    /// Started by the CLI: exit once idle with no live sandbox.
    #[arg(long, hide = true)]
    auto: bool,
}

/// Where a command that drives tasks goes.
pub enum Route {
    /// A one-shot engine in this process (`terminal.server = never`).
    InProcess,
    /// The data dir's server.
    Server(Client, ServerMode),
}

/// The server on another machine this process's task commands go to (`--server URL` or
/// `TASKBOX_SERVER_URL`), chosen once from the command line before dispatch
/// ([`choose_remote`]), so that every place that routes a command ([`route`], `tasks`, `show`,
/// `status`) sees the same choice without threading a flag through each of them.
static REMOTE: OnceLock<Remote> = OnceLock::new();

/// The commands that go to `--server`: the ones the server's API serves.
fn served_remotely(cmd: &super::Cmd) -> bool {
    use super::Cmd;
    matches!(
        cmd,
        Cmd::Run(_)
            | Cmd::Suspend(_)
            | Cmd::Resume(_)
            | Cmd::Fork(_)
            | Cmd::Rm(_)
            | Cmd::Tasks(_)
            | Cmd::Show(_)
            | Cmd::Gc(_)
            | Cmd::Status(_)
            | Cmd::Watch(_)
            | Cmd::Cost(_)
    )
}

/// Reads `--server URL` (else `TASKBOX_SERVER_URL`) and the token (`--token-file`, else
/// `TASKBOX_TOKEN`) for a command the server's API serves. A `--server` flag on a command that
/// works on this machine's files (`config`, `export`, `serve`…) is refused rather than
/// ignored; the environment variable leaves those commands alone.
pub fn choose_remote(
    flag: Option<&str>,
    token_file: Option<&Path>,
    cmd: &super::Cmd,
) -> Result<(), Failure> {
    let from_env = std::env::var("TASKBOX_SERVER_URL")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let Some(url) = flag.map(str::to_string).or(from_env) else {
        if token_file.is_some() {
            return Err(Failure::new("--token-file is the token of --server, and no server URL was given")
                .code("usage")
                .hint("taskbox --server http://HOST:PORT --token-file FILE COMMAND…, or set TASKBOX_SERVER_URL"));
        }
        return Ok(());
    };
    if !served_remotely(cmd) {
        if flag.is_some() {
            return Err(Failure::new(
                "--server sends task commands to another machine's server, and this command works on this machine's files",
            )
            .code("usage")
            .hint("--server works with run, suspend, resume, fork, rm, tasks, show, gc, status, watch and cost; run this command on the server's machine"));
        }
        return Ok(());
    }
    let token = match token_file {
        Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
            Failure::new(format!(
                "cannot read the token file {}: {e}",
                path.display()
            ))
            .hint("give --token-file the file holding the server's bearer token")
        })?),
        None => std::env::var("TASKBOX_TOKEN").ok(),
    };
    let remote = Remote::new(url.trim(), token.as_deref()).map_err(Failure::from_client)?;
    let _ = REMOTE.set(remote);
    Ok(())
}

/// A client of the `--server` chosen for this process, if one was.
pub fn remote_client(paths: &Paths) -> Option<Client> {
    REMOTE
        .get()
        .map(|r| Client::remote(&paths.data_dir, r.clone()))
}

/// Every task, as the remote server lists them.
pub async fn remote_tasks(client: &Client) -> Result<Vec<taskbox::core::Task>, Failure> {
    let v = call(
        client,
        ServerMode::Always,
        |c| async move { c.tasks().await },
    )
    .await?;
    serde_json::from_value(v).map_err(|e| {
        Failure::new(format!(
            "the taskbox server at {} answered a task list this CLI cannot read: {e}",
            client.endpoint()
        ))
        .hint("use the same taskbox version on both machines")
    })
}

/// One task's view, as the remote server shows it.
pub async fn remote_view(
    client: &Client,
    task: &taskbox::TaskId,
    journal: usize,
) -> Result<taskbox::engine::TaskView, Failure> {
    let v = call(client, ServerMode::Always, |c| {
        let task = task.clone();
        async move { c.show(&task, journal).await }
    })
    .await?;
    serde_json::from_value(v).map_err(|e| {
        Failure::new(format!(
            "the taskbox server at {} answered a task this CLI cannot read: {e}",
            client.endpoint()
        ))
        .hint("use the same taskbox version on both machines")
    })
}

/// Reads `terminal.server` (or `TASKBOX_SERVER`); a `--server` chosen for this process wins.
pub fn route(paths: &Paths) -> Result<Route, Failure> {
    if let Some(client) = remote_client(paths) {
        return Ok(Route::Server(client, ServerMode::Always));
    }
    let config = Config::load(&paths.config_file).map_err(Failure::from_config)?;
    let mode = config
        .server_mode(|k| std::env::var(k).ok())
        .map_err(Failure::from_config)?;
    Ok(match mode {
        ServerMode::Never => Route::InProcess,
        mode => Route::Server(Client::new(&paths.data_dir), mode),
    })
}

/// Calls the server; with `auto`, starts one when none answers (saying so once on stderr) and
/// calls again. Only a "no server" failure is retried: nothing was sent then.
pub async fn call<T, F, Fut>(client: &Client, mode: ServerMode, f: F) -> Result<T, Failure>
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
{
    match f(client.clone()).await {
        Err(ClientError::NoServer { .. }) if mode == ServerMode::Auto => {
            match autostart::ensure_server(client).await {
                Ok(Some(started)) => eprintln!(
                    "note: started a taskbox server in the background (pid {}, log {}); it exits once idle with no live sandbox",
                    started.pid,
                    started.log.display()
                ),
                Ok(None) => {}
                Err(e) => return Err(Failure::from_client(e)),
            }
            f(client.clone()).await.map_err(Failure::from_client)
        }
        // A fleet's server that does not drive the task names the one that does: the request
        // goes there once (nothing was done here).
        Err(ClientError::Api(e)) => match client.owner_of(&e) {
            Some(owner) => {
                eprintln!(
                    "note: the server at {} drives this task; sending the request there",
                    owner.endpoint()
                );
                f(owner).await.map_err(Failure::from_client)
            }
            None => Err(Failure::from_client(ClientError::Api(e))),
        },
        r => r.map_err(Failure::from_client),
    }
}

/// `taskbox serve`.
pub async fn serve(args: ServeArgs, paths: &Paths) -> Result<ExitCode, Failure> {
    if args.stop {
        return stop(paths).await;
    }
    let mut config = Config::load(&paths.config_file).map_err(Failure::from_config)?;
    config.terminal.store = config
        .store(|k| std::env::var(k).ok())
        .map_err(Failure::from_config)?;
    if let Some(store) = &args.store {
        config
            .set_from(
                "terminal.store",
                store,
                taskbox::config::ValueSource::Flag("--store"),
            )
            .map_err(Failure::from_config)?;
    }
    let store = match config.terminal.store.url() {
        Some(url) => format!(" (store {})", taskbox::redact::redact(url)),
        None => String::new(),
    };
    let token = match &args.token_file {
        Some(path) => Some(taskbox::server::read_token_file(path).map_err(Failure::from_server)?),
        None => None,
    };
    let server = Server::start(ServeOptions {
        data_dir: paths.data_dir.clone(),
        config,
        config_file: Some(paths.config_file.clone()),
        auto: args.auto,
        listen: args.listen.clone(),
        token,
    })
    .await
    .map_err(Failure::from_server)?;
    let tcp = server
        .tcp_addr()
        .map(|a| format!(" and http://{a} (bearer token required)"))
        .unwrap_or_default();
    eprintln!(
        "taskbox server (pid {}) serving {}{store} on {}{tcp}",
        std::process::id(),
        paths.data_dir.display(),
        server.socket().display()
    );
    let reason = server.run().await.map_err(Failure::from_server)?;
    let why = match reason {
        StopReason::Signal => "on a signal",
        StopReason::Asked => "as asked",
        StopReason::Idle => "idle, with no live sandbox",
    };
    eprintln!("taskbox server stopped ({why})");
    Ok(ExitCode::SUCCESS)
}

/// `taskbox serve --stop`: asks, then waits for the socket to go away.
// Polling the socket until the server is gone is the waiting this command exists for.
#[allow(clippy::disallowed_methods)]
async fn stop(paths: &Paths) -> Result<ExitCode, Failure> {
    let client = Client::new(&paths.data_dir);
    let health = client.health().await.map_err(Failure::from_client)?;
    client.shutdown().await.map_err(Failure::from_client)?;
    // The socket file goes last, once the engine has stopped.
    for _ in 0..1500 {
        if !client.socket().exists() {
            eprintln!("stopped the taskbox server (pid {})", health.pid);
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Failure::new(format!(
        "the taskbox server (pid {}) did not stop within 150 s",
        health.pid
    ))
    .hint("it may be suspending many tasks; `taskbox status` shows whether it still runs"))
}

/// `taskbox status`: exit 0 with the server's facts, or 1 when no server runs.
pub async fn status(paths: &Paths, json: bool) -> Result<ExitCode, Failure> {
    if let Some(client) = remote_client(paths) {
        let health = client.health().await.map_err(Failure::from_client)?;
        return print_health(&health, &client, json);
    }
    let client = Client::new(&paths.data_dir);
    let health = match client.health().await {
        Ok(h) => h,
        Err(ClientError::NoServer { .. }) => {
            if json {
                print_json(&serde_json::json!({
                    "running": false,
                    "data_dir": paths.data_dir.display().to_string(),
                }))?;
            } else {
                eprintln!(
                    "no taskbox server is running for {}",
                    paths.data_dir.display()
                );
            }
            return Ok(ExitCode::from(1));
        }
        Err(e) => return Err(Failure::from_client(e)),
    };
    print_health(&health, &client, json)
}

fn print_health(health: &Health, client: &Client, json: bool) -> Result<ExitCode, Failure> {
    if json {
        let mut v = serde_json::to_value(health)
            .map_err(|e| Failure::new(format!("cannot encode JSON: {e}")))?;
        v["running"] = serde_json::Value::Bool(true);
        match client.remote_server() {
            Some(r) => v["server"] = r.url().into(),
            None => v["socket"] = client.socket().display().to_string().into(),
        }
        print_json(&v)?;
    } else {
        print_status(health, client)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_status(h: &Health, client: &Client) -> Result<(), Failure> {
    let mut s = String::new();
    let how = if h.auto {
        format!(
            "started by the CLI; exits after {} s idle with no live sandbox",
            h.idle_exit_seconds
        )
    } else {
        "started with `taskbox serve`".to_string()
    };
    s.push_str(&format!(
        "server:   running, pid {}, since {} ({how})\n",
        h.pid,
        format_ms(h.started_at)
    ));
    s.push_str(&format!("data dir: {}\n", h.data_dir));
    match client.remote_server() {
        Some(r) => s.push_str(&format!("server:   {}\n", r.url())),
        None => s.push_str(&format!("socket:   {}\n", client.socket().display())),
    }
    if let Some(tcp) = &h.tcp {
        s.push_str(&format!("tcp:      {tcp} (bearer token)\n"));
    }
    s.push_str(&format!("version:  {}\n", h.version));
    if h.live_tasks.is_empty() {
        s.push_str("live sandboxes: none\n");
    } else {
        s.push_str("live sandboxes:\n");
        for t in &h.live_tasks {
            s.push_str(&format!(
                "  {:<20} {:<12} {:<28} expires {}\n",
                t.task,
                t.state,
                t.sandbox,
                format_ms(t.deadline)
            ));
        }
    }
    super::output::write_ignoring_broken_pipe(&mut std::io::stdout().lock(), s.as_bytes())
}

/// `taskbox watch TASK`: the task's state now, then each transition as the server commits it,
/// until the server stops (or the reader goes away).
pub async fn watch(paths: &Paths, task: &taskbox::TaskId, json: bool) -> Result<ExitCode, Failure> {
    use std::io::Write;
    use taskbox::client::WatchEvent;
    let (client, mode) = match route(paths)? {
        Route::Server(client, mode) => (client, mode),
        Route::InProcess => {
            return Err(Failure::new(
                "`taskbox watch` follows a running server's transitions, and terminal.server is `never`",
            )
            .hint("run `taskbox serve` and set terminal.server to auto or always (or TASKBOX_SERVER=auto)"))
        }
    };
    let mut stream = call(&client, mode, |c| {
        let task = task.clone();
        async move { c.watch(&task).await }
    })
    .await?;
    loop {
        let Some(ev) = stream.next().await.map_err(Failure::from_client)? else {
            eprintln!("the taskbox server stopped; the watch ends");
            return Ok(ExitCode::SUCCESS);
        };
        let text = if json {
            serde_json::to_string(&ev)
                .map_err(|e| Failure::new(format!("cannot encode JSON: {e}")))?
        } else {
            match &ev {
                WatchEvent::State {
                    task,
                    state,
                    sandbox,
                } => match sandbox {
                    Some(sb) => format!("{task}: {state} (sandbox {sb})"),
                    None => format!("{task}: {state}"),
                },
                WatchEvent::Transition {
                    task,
                    from,
                    to,
                    event,
                    at,
                } => format!("{}  {task}: {from} -> {to} ({event})", format_ms(*at)),
                WatchEvent::Lagged { missed } => {
                    format!("(fell behind: {missed} transitions not shown)")
                }
            }
        };
        let mut out = std::io::stdout().lock();
        // A reader that went away (`| head`) ends the watch quietly.
        if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
            return Ok(ExitCode::SUCCESS);
        }
    }
}
