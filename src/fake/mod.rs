//! `taskbox fake-vercel`: a local fake of the Vercel Sandbox v2 REST API.
//!
//! This machine (and a user's laptop on a plane) cannot reach Vercel, so the Vercel provider is
//! proven against this fake, and the fake is proven against Vercel's own SDK
//! (`tests/sdk/conformance.mjs` runs `@vercel/sandbox` against it). It is a real HTTP server:
//! statuses, error bodies, NDJSON streams, 410/422 lifecycle answers and `Retry-After` behave
//! like the service's, and commands really run, in a host directory per session that stands in
//! for `/vercel/sandbox`.
//!
//! Layout:
//! - `model` — the world as pure data (time passed in), one room per resource: `sandbox`,
//!   `session`, `snapshot`, and `list` for list queries and pages;
//! - `validate` — request bodies checked with the service's wording;
//! - `wire` — the JSON shapes the SDK's zod schemas expect;
//! - `exec` — command processes and their replayable logs;
//! - `files` — sandbox paths and uploads;
//! - `faults` — the fault configuration and its seeded generator;
//! - `http` — the axum edge: the router, `shared` state and the effects of the world's plans,
//!   the `guard`, the handlers grouped by resource (`sandboxes`, `sessions`, `commands`, `fs`,
//!   `snapshots`) and `admin` for `/_admin`;
//! - `conn` — connections a fault can cut.
//!
//! The base URL is `http://HOST:PORT/api` (the SDK's `https://vercel.com/api` rewritten). The
//! admin endpoints live beside it under `/_admin`, behind the same bearer token as the API when
//! the fake has one ([`FakeOptions::token`]; open otherwise):
//! - `GET /_admin/faults`, `POST /_admin/faults` (a [`Faults`] JSON object, replacing the
//!   current one);
//! - `GET /_admin/stats` ([`Stats`], with the API requests in flight now), `DELETE /_admin/stats`
//!   (reset);
//! - `POST /_admin/expire-session/{sessionId}` (times the session out now and waits for it to
//!   stop), `POST /_admin/expire-snapshot/{snapshotId}`.
//!
//! Workspaces and snapshots are the local provider's ([`LocalProvider`]): each session is a local
//! sandbox (its workspace is what `/vercel/sandbox` maps onto) and each snapshot one of its
//! versioned archives, under `<data_dir>/local`. Commands do not go through
//! `SandboxProvider::exec`, which runs a `bash -c` string to completion and returns bounded
//! output: the API needs an executable with arguments and environment, output streamed while the
//! command runs, and signals. The fake spawns them itself, contained as taskbox's own local
//! commands are (`LocalProvider::contain`): each session's local sandbox has namespaces of its
//! own, where its workspace is at `/vercel/sandbox`; a command enters them, so it sees that
//! workspace and the read-only system and nothing else of the host's (no other session, no
//! data dir, no home), runs as uid 1000, has its sandbox's loopback only for a network, and
//! dies with the session's stop. Where the kernel refuses the namespaces, a command fails with
//! a 500 naming the cause rather than run on the host.
//!
//! Every error answer is the service's JSON error object, the router's own included (405 for a
//! wrong method, with `Allow`; 413 `payload_too_large` for a body over the limit). Uploads
//! (`fs/write`, up to 1 GiB) are extracted as they arrive, never held whole in memory.
//!
//! The API state lives in memory: a restarted fake has forgotten its sandboxes (and leaves their
//! archives behind in the data directory).
//!
//! Known differences from the service: commands run as uid 1000 in a sandbox of the host's
//! kernel, not a microVM (`sudo` is accepted and ignored); `HOME` is `/vercel/sandbox`, whose
//! tree is also at `/workspace`; the system is the host's, read-only; commands have no network
//! but their loopback; the file API reaches only `/vercel/sandbox`; ports get routes but nothing
//! serves them; `git`/`tarball` sources, network policies, drives, `PATCH` and the rest of v3
//! (beyond `POST /v3/sandboxes`) are not implemented.

mod conn;
mod endpoint;
mod exec;
mod faults;
mod files;
mod http;
mod model;
mod stats;
mod validate;
mod wire;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use endpoint::{Endpoint, UnknownEndpoint};
pub use faults::{
    CutMode, DropCreate, DropMode, EndpointRate, FaultSpecError, Faults, RateLimitBurst, StreamCut,
};
pub use stats::{Injected, Stats};

use crate::clock::{Clock, SystemClock};
use crate::provider::local::{LocalError, LocalProvider};

/// How often timeouts and snapshot expiries are checked when no request comes in.
const REAP_EVERY: Duration = Duration::from_millis(100);
/// How long `shutdown` waits for open connections before dropping them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// How the fake behaves.
#[derive(Clone)]
pub struct FakeOptions {
    /// Where session workspaces and snapshot archives go (created if missing).
    pub data_dir: PathBuf,
    /// Faults in force from the start.
    pub faults: Faults,
    /// If set, requests must carry `Authorization: Bearer <token>` with exactly this token
    /// (403 `forbidden` otherwise). Any bearer token passes when unset; none at all is a 401.
    pub token: Option<String>,
    /// Largest `timeout` a create accepts (default 45 minutes, the Hobby plan's).
    pub max_timeout_ms: u64,
    /// Largest total session timeout extensions may reach (default 45 minutes).
    pub max_total_timeout_ms: u64,
    /// Largest `resources.vcpus` (default 8).
    pub max_vcpus: u32,
    /// How long a new session stays `pending` (default 0: created sessions are `running`).
    pub boot_delay_ms: u64,
    /// How long a snapshotted session answers 422 `sandbox_snapshotting` before it is
    /// `stopped` (default 500 ms).
    pub snapshot_settle_ms: u64,
    /// Snapshot expiry when a snapshot call gives none (default 30 days; 0: never).
    pub default_snapshot_expiration_ms: u64,
    /// The region sessions report (default `iad1`).
    pub region: String,
    /// The working directory image-based (v3) sessions report and run commands in (default
    /// `/vercel/sandbox`, like the legacy runtimes; it must lie under it, the only directory
    /// the fake maps).
    pub image_cwd: String,
    /// Whether a persistent sandbox snapshots itself when its session times out, as it does
    /// when stopped (default `false`). **Unverified**: Vercel's changelog says a persistent
    /// sandbox snapshots when it stops; that a timeout counts is not confirmed by the SDK or
    /// the docs, so it is off unless a test asks for it.
    pub snapshot_on_timeout: bool,
    /// The clock for timestamps, timeouts and expiries.
    pub clock: Arc<dyn Clock>,
}

impl FakeOptions {
    /// The defaults, storing files under `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> FakeOptions {
        FakeOptions {
            data_dir: data_dir.into(),
            faults: Faults::default(),
            token: None,
            max_timeout_ms: 45 * 60_000,
            max_total_timeout_ms: 45 * 60_000,
            max_vcpus: 8,
            boot_delay_ms: 0,
            snapshot_settle_ms: 500,
            default_snapshot_expiration_ms: 30 * 86_400_000,
            region: "iad1".to_string(),
            image_cwd: model::WORKSPACE_ROOT.to_string(),
            snapshot_on_timeout: false,
            clock: Arc::new(SystemClock),
        }
    }
}

impl fmt::Debug for FakeOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeOptions")
            .field("data_dir", &self.data_dir)
            .field("faults", &self.faults)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("max_timeout_ms", &self.max_timeout_ms)
            .field("max_total_timeout_ms", &self.max_total_timeout_ms)
            .field("max_vcpus", &self.max_vcpus)
            .field("boot_delay_ms", &self.boot_delay_ms)
            .field("snapshot_settle_ms", &self.snapshot_settle_ms)
            .field(
                "default_snapshot_expiration_ms",
                &self.default_snapshot_expiration_ms,
            )
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// Why the fake could not start, serve or answer an admin call.
#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding failed.
        #[source]
        source: io::Error,
    },
    /// The data directory could not be created.
    #[error("cannot use the data directory {}: {source}", path.display())]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Why it could not be used.
        #[source]
        source: io::Error,
    },
    /// The options make no sense.
    #[error("invalid fake-vercel option: {0}")]
    Options(String),
    /// The local sandbox store (workspaces and snapshot archives) could not be set up.
    #[error("cannot set up the fake's sandbox store: {0}")]
    Local(#[source] LocalError),
    /// A fault spec makes no sense.
    #[error(transparent)]
    Faults(#[from] FaultSpecError),
    /// The server stopped with an error.
    #[error("the fake-vercel server failed: {0}")]
    Serve(#[source] io::Error),
    /// Waiting for ctrl-c failed.
    #[error("cannot wait for ctrl-c: {0}")]
    Signal(#[source] io::Error),
    /// An admin call was refused (unknown session or snapshot).
    #[error("{message} (HTTP {status})")]
    Admin {
        /// The HTTP status the admin API answered.
        status: u16,
        /// Its message.
        message: String,
    },
}

impl From<wire::ApiError> for FakeError {
    fn from(e: wire::ApiError) -> Self {
        FakeError::Admin {
            status: e.status,
            message: e.message,
        }
    }
}

/// A running fake. Dropping it stops the server and kills its commands; [`FakeServer::shutdown`]
/// also waits for connections and removes the workspaces.
pub struct FakeServer {
    addr: SocketAddr,
    shared: Arc<http::Shared>,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<io::Result<()>>>,
    reaper: JoinHandle<()>,
}

impl fmt::Debug for FakeServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Makes ids unique across servers sharing a data directory (and across servers in one process).
fn nonce(clock: &dyn Clock) -> String {
    static STARTS: AtomicU64 = AtomicU64::new(0);
    let n = clock.now_ms() % 36u64.pow(6) * 100 + STARTS.fetch_add(1, Ordering::SeqCst) % 100;
    let mut digits = Vec::new();
    let mut v = n;
    loop {
        let d = (v % 36) as u8;
        digits.push(if d < 10 { b'0' + d } else { b'a' + d - 10 });
        v /= 36;
        if v == 0 {
            break;
        }
    }
    digits.reverse();
    String::from_utf8(digits).expect("base-36 digits are ASCII")
}

impl FakeServer {
    /// Starts serving on `listener` (bind `127.0.0.1:0` for a free port).
    pub async fn start(listener: TcpListener, opts: FakeOptions) -> Result<FakeServer, FakeError> {
        opts.faults.validate()?;
        if opts.max_total_timeout_ms < opts.max_timeout_ms {
            return Err(FakeError::Options(format!(
                "max_total_timeout_ms ({}) is below max_timeout_ms ({}); a create could exceed \
                 the plan's maximum",
                opts.max_total_timeout_ms, opts.max_timeout_ms
            )));
        }
        if opts.max_vcpus == 0 {
            return Err(FakeError::Options("max_vcpus must be at least 1".into()));
        }
        let image_cwd = files::normalize(&opts.image_cwd);
        if !(image_cwd == model::WORKSPACE_ROOT
            || image_cwd.starts_with(&format!("{}/", model::WORKSPACE_ROOT)))
        {
            return Err(FakeError::Options(format!(
                "image_cwd {} is not under {}, the only directory the fake maps onto the host",
                opts.image_cwd,
                model::WORKSPACE_ROOT
            )));
        }
        let addr = listener.local_addr().map_err(FakeError::Serve)?;
        let homes_dir = opts.data_dir.join("homes");
        tokio::fs::create_dir_all(&homes_dir)
            .await
            .map_err(|source| FakeError::DataDir {
                path: homes_dir.clone(),
                source,
            })?;
        let local = LocalProvider::new(
            opts.data_dir.join("local"),
            "fake-vercel".to_string(),
            Arc::clone(&opts.clock),
        )
        .map_err(FakeError::Local)?
        .with_isolation(sandbox_isolation());
        // What an earlier run left half-done (this process has nothing in flight yet).
        local.sweep_temporaries().map_err(FakeError::Local)?;
        let storage = http::Storage {
            local,
            // Longer than any session can live, so the fake alone decides when sessions end.
            local_timeout_ms: opts
                .max_total_timeout_ms
                .saturating_add(opts.boot_delay_ms)
                .saturating_add(60_000),
            homes_dir,
        };
        let limits = validate::Limits {
            max_timeout_ms: opts.max_timeout_ms,
            max_total_timeout_ms: opts.max_total_timeout_ms,
            max_vcpus: opts.max_vcpus,
        };
        let nonce = nonce(opts.clock.as_ref());
        let world = model::World::new(
            model::Settings {
                limits: limits.clone(),
                region: opts.region.clone(),
                boot_delay_ms: opts.boot_delay_ms,
                snapshot_settle_ms: opts.snapshot_settle_ms,
                default_snapshot_expiration_ms: opts.default_snapshot_expiration_ms,
                image_cwd: opts.image_cwd.clone(),
                snapshot_on_timeout: opts.snapshot_on_timeout,
            },
            nonce.clone(),
        );
        let shared = Arc::new(http::Shared::new(
            world,
            opts.faults,
            opts.token,
            limits,
            opts.clock,
            storage,
            nonce,
        ));
        let app = http::router(Arc::clone(&shared))
            .into_make_service_with_connect_info::<conn::ConnHandle>();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            axum::serve(conn::KillableListener::new(listener), app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        let reaper_shared = Arc::clone(&shared);
        let reaper = tokio::spawn(async move {
            let mut every = tokio::time::interval(REAP_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                reaper_shared.spawn_due();
            }
        });
        tracing::info!(%addr, "fake-vercel listening");
        Ok(FakeServer {
            addr,
            shared,
            stop: Some(stop),
            server: Some(server),
            reaper,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The API base URL, e.g. `http://127.0.0.1:PORT/api`.
    pub fn base_url(&self) -> String {
        format!("http://{}/api", self.addr)
    }

    /// The admin base URL, e.g. `http://127.0.0.1:PORT/_admin`.
    pub fn admin_url(&self) -> String {
        format!("http://{}/_admin", self.addr)
    }

    /// Request counts so far.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Zeroes the request counts.
    pub fn reset_stats(&self) {
        self.shared.reset_stats();
    }

    /// The faults in force (bursts show what is left of them).
    pub fn faults(&self) -> Faults {
        self.shared.faults()
    }

    /// Replaces the faults in force (and reseeds the generator).
    pub fn set_faults(&self, faults: Faults) -> Result<(), FakeError> {
        faults.validate()?;
        self.shared.set_faults(faults);
        Ok(())
    }

    /// Times a session out now; returns once it has stopped.
    pub async fn expire_session(&self, session_id: &str) -> Result<(), FakeError> {
        self.shared.expire_session(session_id).await?;
        Ok(())
    }

    /// Expires a snapshot now: it answers 410 `snapshot_not_found` from then on.
    pub async fn expire_snapshot(&self, snapshot_id: &str) -> Result<(), FakeError> {
        self.shared.expire_snapshot(snapshot_id).await?;
        Ok(())
    }

    /// Stops serving: no new connections, commands killed, open connections given a few seconds,
    /// workspaces removed (snapshot archives stay in the data directory).
    pub async fn shutdown(mut self) -> Result<(), FakeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.reaper.abort();
        self.shared.shutdown_sessions().await;
        let Some(mut server) = self.server.take() else {
            return Ok(());
        };
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(FakeError::Serve(e)),
            Ok(Err(join)) => Err(FakeError::Serve(io::Error::other(join.to_string()))),
            Err(_) => {
                server.abort();
                Ok(())
            }
        }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.reaper.abort();
        self.shared.kill_all_now();
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

/// Binds `listen` and serves until ctrl-c.
pub async fn serve(listen: SocketAddr, opts: FakeOptions) -> Result<(), FakeError> {
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| FakeError::Bind {
            addr: listen,
            source,
        })?;
    let server = FakeServer::start(listener, opts).await?;
    tokio::signal::ctrl_c().await.map_err(FakeError::Signal)?;
    tracing::info!("ctrl-c: shutting down fake-vercel");
    server.shutdown().await
}

/// How the fake contains a session's commands: each session's local sandbox in namespaces of
/// its own (as `terminal.local_isolation = namespaces` makes taskbox's), its workspace at
/// `/vercel/sandbox` inside as well, with its loopback only for a network (a test double needs
/// none, and no `pasta` per session).
fn sandbox_isolation() -> crate::provider::local::isolation::Settings {
    use crate::provider::local::isolation::{Network, Settings};
    Settings {
        mode: crate::config::LocalIsolation::Namespaces,
        network: Network {
            mode: crate::config::LocalNetwork::None,
            ..Network::default()
        },
        workspace_alias: Some(model::WORKSPACE_ROOT.into()),
        ..Settings::default()
    }
}
