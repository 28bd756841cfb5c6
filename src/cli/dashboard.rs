//! `taskbox dashboard [--port N] [--json]`: the data dir's server's dashboard on a loopback port
//! (`taskbox::server::dashboard::proxy`), until Ctrl-C.
//!
//! A loopback port is reachable by every user of the machine, so the dashboard is behind a
//! login: a fresh random token, written to `<data>/dashboard-PORT.token` (mode 0600, removed on
//! exit) and printed on the terminal (not with `--json`, which names the file: the token is a
//! secret). The browser posts it once in the login form and gets a session cookie; the token is
//! never in the URL.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use taskbox::engine::Paths;
use taskbox::server::dashboard::{auth, proxy};

use super::output::{print_json, Failure};
use super::server::{self as srv, route, Route};

#[derive(Args, Debug)]
pub struct DashboardArgs {
    /// The loopback port to serve on (0: any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Print the address and the token file as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: DashboardArgs, paths: &Paths) -> Result<ExitCode, Failure> {
    let (client, mode) = match route(paths)? {
        Route::Server(client, _) if client.remote_server().is_some() => {
            return Err(Failure::new(
                "`taskbox dashboard` serves the dashboard of this machine's server, not of --server",
            )
            .hint("a remote server serves its dashboard itself: open http://HOST:PORT/ (its --listen address) and log in with its token"))
        }
        Route::Server(client, mode) => (client, mode),
        Route::InProcess => {
            return Err(Failure::new(
                "`taskbox dashboard` needs a server, and terminal.server is `never`",
            )
            .hint("start one with `taskbox serve`, or set terminal.server to auto"))
        }
    };
    // Starts the server when none runs (as every command does), and says so.
    srv::call(&client, mode, |c| async move { c.health().await }).await?;

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await
        .map_err(|e| {
            failed(e, format!("cannot listen on 127.0.0.1:{}", args.port))
                .hint("pick another --port, or 0 for any free one")
        })?;
    let addr = listener
        .local_addr()
        .map_err(|e| failed(e, "cannot read the address listened on".into()))?;
    let token = auth::random_hex(24).map_err(|e| failed(e, "cannot draw a login token".into()))?;
    let token_file = paths
        .data_dir
        .join(format!("dashboard-{}.token", addr.port()));
    write_token(&token_file, &token)?;
    let guard =
        auth::Guard::new(&token).map_err(|e| failed(e, "cannot draw a session key".into()))?;
    let url = format!("http://{addr}/");
    if args.json {
        print_json(&serde_json::json!({
            "url": url,
            "token_file": token_file.display().to_string(),
        }))?;
    } else {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "dashboard: {url}");
        let _ = writeln!(out, "log in with the token: {token}");
        let _ = writeln!(
            out,
            "(also in {}, readable by you only; Ctrl-C stops the dashboard)",
            token_file.display()
        );
    }
    let _ = std::io::stdout().flush();

    let (closing_tx, closing) = tokio::sync::watch::channel(false);
    let served = tokio::spawn(proxy::serve(
        listener,
        paths.data_dir.clone(),
        guard,
        closing,
    ));
    stop_signal().await;
    let _ = closing_tx.send(true);
    // Open event streams end with the process; the answers in flight get a moment.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), served).await;
    let _ = std::fs::remove_file(&token_file);
    Ok(ExitCode::SUCCESS)
}

/// Writes the token to a file only this user may read.
fn write_token(path: &Path, token: &str) -> Result<(), Failure> {
    let fail = |e| {
        failed(
            e,
            format!("cannot write the login token to {}", path.display()),
        )
    };
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(fail)?;
    writeln!(f, "{token}").map_err(fail)
}

/// Ctrl-C, SIGTERM or SIGHUP.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut hup = signal(SignalKind::hangup()).ok();
    let term = async {
        match term.as_mut() {
            Some(s) => s.recv().await,
            None => std::future::pending().await,
        }
    };
    let hup = async {
        match hup.as_mut() {
            Some(s) => s.recv().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
        _ = hup => {}
    }
}

/// `error: what` / `caused by: e`.
fn failed(e: std::io::Error, what: String) -> Failure {
    Failure::from_anyhow(anyhow::Error::new(e).context(what))
}
