//! `taskbox fake-vercel`: the local fake of the Vercel Sandbox API, for offline agent tests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use taskbox::fake::{
    DropCreate, EndpointRate, FakeOptions, FakeServer, Faults, RateLimitBurst, StreamCut,
};

use super::output::Failure;

/// Serve a local fake of the Vercel Sandbox v2 API (commands really run, in local workspaces).
#[derive(Args, Debug)]
pub struct FakeArgs {
    /// Address to listen on (port 0 picks a free port; the URL is printed on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where session workspaces and snapshots live (default: `fake-vercel` under the data dir).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Require this bearer token (403 otherwise); any token passes when unset.
    #[arg(long, env = "TASKBOX_FAKE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Largest sandbox timeout a create accepts, ms.
    #[arg(long)]
    max_timeout_ms: Option<u64>,
    /// Largest total timeout extensions may reach, ms.
    #[arg(long)]
    max_total_timeout_ms: Option<u64>,
    /// How long a new session stays `pending`, ms.
    #[arg(long)]
    boot_delay_ms: Option<u64>,
    /// How long a snapshotted session answers 422 before it is `stopped`, ms.
    #[arg(long)]
    snapshot_settle_ms: Option<u64>,
    /// The working directory image-based (v3) sessions report and run commands in (under
    /// /vercel/sandbox; default /vercel/sandbox).
    #[arg(long)]
    image_cwd: Option<String>,
    /// A persistent sandbox also snapshots itself when it times out (unverified on the real
    /// service: only a stop is documented to snapshot).
    #[arg(long)]
    snapshot_on_timeout: bool,
    /// Seed of the generator that picks failing requests.
    #[arg(long, default_value_t = 1)]
    fault_seed: u64,
    /// Latency added to every request, ms.
    #[arg(long, default_value_t = 0)]
    fault_latency_ms: u64,
    /// Error rate: `ENDPOINT=P` or `P` for every endpoint (repeatable).
    #[arg(long)]
    fault_error_rate: Vec<EndpointRate>,
    /// Status of injected errors (500-599).
    #[arg(long, default_value_t = 500)]
    fault_error_status: u16,
    /// A burst of 429s: `COUNT[:RETRY_AFTER_S[:ENDPOINT]]`.
    #[arg(long)]
    fault_rate_limit: Option<RateLimitBurst>,
    /// Lose the response of the next creates: `COUNT[:close|error]`.
    #[arg(long)]
    fault_drop_create: Option<DropCreate>,
    /// Cut command streams after a while: `MS[:abort|error_record]`.
    #[arg(long)]
    fault_cut_streams: Option<StreamCut>,
}

pub async fn run(args: FakeArgs, default_data_dir: PathBuf) -> Result<ExitCode, Failure> {
    let mut opts = FakeOptions::new(args.data_dir.unwrap_or(default_data_dir));
    opts.token = args.token;
    if let Some(v) = args.max_timeout_ms {
        opts.max_timeout_ms = v;
    }
    if let Some(v) = args.max_total_timeout_ms {
        opts.max_total_timeout_ms = v;
    }
    if let Some(v) = args.boot_delay_ms {
        opts.boot_delay_ms = v;
    }
    if let Some(v) = args.snapshot_settle_ms {
        opts.snapshot_settle_ms = v;
    }
    opts.snapshot_on_timeout = args.snapshot_on_timeout;
    if let Some(v) = args.image_cwd {
        opts.image_cwd = v;
    }
    let mut faults = Faults {
        seed: args.fault_seed,
        latency_ms: args.fault_latency_ms,
        error_status: args.fault_error_status,
        rate_limit: args.fault_rate_limit,
        drop_create: args.fault_drop_create,
        cut_streams: args.fault_cut_streams,
        ..Faults::default()
    };
    for r in args.fault_error_rate {
        faults.error_rate.insert(r.endpoint, r.rate);
    }
    faults.validate().map_err(|e| {
        Failure::new(format!("invalid fault: {e}")).hint("see `taskbox fake-vercel --help`")
    })?;
    opts.faults = faults;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| {
            Failure::new(format!("cannot listen on {}: {e}", args.listen))
                .hint("pick another address or port 0")
        })?;
    let server = FakeServer::start(listener, opts)
        .await
        .map_err(|e| Failure::new(format!("cannot start the fake: {e}")))?;
    outln!("{}", server.base_url());
    eprintln!(
        "fake-vercel listening on {} (admin: {}); point taskbox at it with\n  taskbox config set terminal.vercel_api_url {}\nctrl-c stops it",
        server.base_url(),
        server.admin_url(),
        server.base_url()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Failure::new(format!("cannot wait for signals: {e}")))?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    server
        .shutdown()
        .await
        .map_err(|e| Failure::new(format!("fake-vercel did not shut down cleanly: {e}")))?;
    Ok(ExitCode::SUCCESS)
}
