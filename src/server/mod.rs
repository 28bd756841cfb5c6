//! `taskbox serve`: one long-lived engine per data dir, the way `dockerd` sits behind `docker`.
//!
//! The server owns the data dir's [`Orchestrator`] — its event loop, its timers, its task locks
//! — for as long as it runs, so the idle snapshot and the checkpoint before a sandbox's deadline
//! happen between commands. At start it loads every task that has a live sandbox or an
//! operation in flight (recovering it, which re-arms its timers), and reconciles orphans.
//!
//! It listens on the Unix socket `<data>/taskbox.sock` (mode 0600) and, with `--listen`, on TCP
//! behind a bearer token; both speak the HTTP/1.1 + JSON API of `docs/api.md` under `/v1`
//! (`http.rs`). One server per data dir: [`socket::lock`] takes `<data>/serve.lock` first, and a
//! socket file found after that is a dead server's and is replaced. An auto-started server
//! (`serve --auto`) exits once idle with no live sandbox ([`idle`]); on SIGTERM, SIGINT or
//! `POST /v1/shutdown` a server suspends the tasks with live sandboxes (their files go to
//! snapshots) before it exits, so that no live sandbox outlives its engine.

mod answer;
mod checkpoint;
mod conn;
mod cost;
pub mod dashboard;
mod http;
mod lend;
mod metrics;
mod reload;
mod runs;
mod watch;
// The idle clock: when the last request ended, and a periodic look at the loaded tasks.
#[allow(clippy::disallowed_methods)]
pub mod idle;
pub mod socket;

pub use http::require_token;
pub use lend::serve_guarded;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::client::SOCKET_FILE;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::core::Millis;
use crate::engine::{EngineError, Orchestrator};
use crate::ids::TaskId;
use idle::Activity;

/// What every handler shares.
#[derive(Clone)]
struct AppState {
    orch: Orchestrator,
    activity: Arc<Activity>,
    info: Arc<Info>,
    /// Asks the server to stop (`POST /v1/shutdown`).
    stop: Arc<tokio::sync::Notify>,
    /// Runs in progress (for their cancel and stdin endpoints).
    runs: Arc<runs::Runs>,
    /// Turns true when the server stops accepting requests (ends the watch streams).
    closing: tokio::sync::watch::Receiver<bool>,
    /// The config file, followed: the config the server runs with now.
    config: Arc<reload::ConfigWatch>,
    /// The dashboard's reads of whole journals, off the event loop.
    dashboard: Arc<dashboard::Reader>,
}

/// The server's fixed facts, for `GET /v1/health`.
struct Info {
    pid: u32,
    started_at: Millis,
    data_dir: String,
    auto: bool,
    idle_exit_seconds: u64,
    tcp: Option<String>,
}

/// How long in-flight HTTP requests get to finish once the server is told to stop.
const REQUEST_GRACE: Duration = Duration::from_secs(10);
/// How long suspending the tasks with live sandboxes may take at shutdown.
const DRAIN_GRACE: Duration = Duration::from_secs(120);

/// Why a server could not start (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Another server holds the data dir's serve lock.
    #[error("a taskbox server is already running for {data_dir}{}", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    AlreadyRunning {
        /// The data dir.
        data_dir: PathBuf,
        /// The holder, as it wrote itself into the lock file.
        pid: Option<u32>,
    },
    /// The socket file belongs to another user.
    #[error("{message}")]
    ForeignSocket {
        /// What was found.
        message: String,
    },
    /// `--listen` without a token.
    #[error("--listen needs a bearer token: refusing to serve TCP without one")]
    TokenRequired,
    /// The token file is unreadable, too open or too short to guard TCP.
    #[error("refusing the token file {path}: {problem}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (never the token itself).
        problem: String,
    },
    /// The TCP address could not be bound.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file or socket operation failed.
    #[error("{what}")]
    Io {
        /// What was attempted.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The engine could not be opened.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl ServerError {
    /// How to fix it, when known.
    pub fn hint(&self) -> Option<String> {
        match self {
            ServerError::AlreadyRunning { .. } => Some(
                "`taskbox status` shows it; the CLI talks to it (one server serves a data dir)"
                    .into(),
            ),
            ServerError::ForeignSocket { .. } => {
                Some("another user's server serves this data dir; use your own TASKBOX_HOME".into())
            }
            ServerError::TokenRequired => Some(TOKEN_FIX.into()),
            ServerError::TokenFile { .. } => Some(TOKEN_FIX.into()),
            ServerError::Engine(EngineError::Provider { hint, .. }) => hint.clone(),
            _ => None,
        }
    }
}

/// How to make a token file `serve --listen` accepts.
const TOKEN_FIX: &str = "write a long random token to a file only you can read: \
     `openssl rand -hex 32 > FILE && chmod 600 FILE`, then pass --token-file FILE";

/// The fewest characters a bearer token may have: guessing it must be out of reach.
pub const MIN_TOKEN_LEN: usize = 16;

/// Reads the bearer token of `serve --listen` from `path`: the file must be a regular file
/// that neither its group nor others may read or write (mode 0600 or stricter), holding at
/// least [`MIN_TOKEN_LEN`] characters once surrounding whitespace is trimmed. A world-readable
/// token guards nothing against the machine's other users, and a short one against nobody.
pub fn read_token_file(path: &Path) -> Result<String, ServerError> {
    use std::os::unix::fs::PermissionsExt;
    let refuse = |problem: String| ServerError::TokenFile {
        path: path.to_path_buf(),
        problem,
    };
    let meta = std::fs::metadata(path).map_err(|e| refuse(format!("cannot read it: {e}")))?;
    if !meta.is_file() {
        return Err(refuse("it is not a regular file".into()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(refuse(format!(
            "its mode is {mode:04o}, so other users may read it (it must be 0600 or stricter)"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| refuse(format!("cannot read it: {e}")))?;
    let token = text.trim();
    let len = token.chars().count();
    if len < MIN_TOKEN_LEN {
        return Err(refuse(format!(
            "the token has {len} characters; at least {MIN_TOKEN_LEN} are needed"
        )));
    }
    Ok(token.to_string())
}

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The data dir.
    pub data_dir: PathBuf,
    /// The configuration as the server starts (with the overrides of its flags and
    /// environment).
    pub config: Config,
    /// The file `config` was read from: the server follows it, applying the keys that need no
    /// restart to the next request (`reload.rs`). `None`: no file is followed.
    pub config_file: Option<PathBuf>,
    /// Started by the CLI: exit once idle with no live sandbox.
    pub auto: bool,
    /// Also listen on this TCP address (then `token` is required).
    pub listen: Option<String>,
    /// The bearer token TCP clients must send.
    pub token: Option<String>,
}

/// Why a server stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// SIGTERM, SIGINT or SIGHUP.
    Signal,
    /// `POST /v1/shutdown`.
    Asked,
    /// Auto-started, idle, and no live sandbox.
    Idle,
}

/// A started server: the lock held, the sockets bound, the engine open.
pub struct Server {
    opts: ServeOptions,
    lock: socket::ServeLock,
    unix: tokio::net::UnixListener,
    tcp: Option<(tokio::net::TcpListener, Arc<dashboard::auth::Guard>)>,
    orch: Orchestrator,
    started_at: crate::core::Millis,
}

impl Server {
    /// Takes the data dir's serve lock, binds the socket (and TCP), opens the engine and starts
    /// loading the tasks with live sandboxes.
    pub async fn start(opts: ServeOptions) -> Result<Server, ServerError> {
        match raise_open_files_limit() {
            Ok(Some((from, to))) => tracing::info!(from, to, "raised the open-files limit"),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "could not raise the open-files limit"),
        }
        let token = match (&opts.listen, &opts.token) {
            (Some(_), None) => return Err(ServerError::TokenRequired),
            (Some(_), Some(t)) if t.trim().is_empty() => return Err(ServerError::TokenRequired),
            (_, t) => t.as_ref().map(|t| Arc::new(t.trim().to_string())),
        };
        let lock = socket::lock(&opts.data_dir)?;
        let unix = socket::bind(&opts.data_dir, &lock)?;
        let tcp = match (&opts.listen, token) {
            (Some(addr), Some(token)) => {
                let l = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| ServerError::Listen {
                        addr: addr.clone(),
                        source,
                    })?;
                // The bearer token, or the dashboard's session cookie for reading
                // (`dashboard::auth`).
                let guard =
                    dashboard::auth::Guard::new(&token).map_err(|source| ServerError::Io {
                        what: "cannot draw the dashboard's session key from /dev/urandom".into(),
                        source,
                    })?;
                Some((l, Arc::new(guard)))
            }
            _ => None,
        };
        // On a fleet's store, callers of a task another server drives are told this name.
        let advertised = tcp
            .as_ref()
            .and_then(|(l, _)| l.local_addr().ok())
            .map(|a| a.to_string());
        let orch = Orchestrator::builder(opts.data_dir.clone(), opts.config.clone())
            .owner(crate::engine::owner_name(advertised.as_deref()))
            .open()
            .await?;
        tokio::spawn(load_live_tasks(orch.clone()));
        Ok(Server {
            opts,
            lock,
            unix,
            tcp,
            orch,
            started_at: SystemClock.now_ms(),
        })
    }

    /// The Unix socket's path.
    pub fn socket(&self) -> PathBuf {
        self.opts.data_dir.join(SOCKET_FILE)
    }

    /// The TCP address actually bound, if any.
    pub fn tcp_addr(&self) -> Option<std::net::SocketAddr> {
        self.tcp.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// Serves until a signal, `POST /v1/shutdown` or (auto-started) idleness; then suspends
    /// the tasks with live sandboxes, stops the engine and removes the socket.
    pub async fn run(self) -> Result<StopReason, ServerError> {
        let Server {
            opts,
            lock,
            unix,
            tcp,
            orch,
            started_at,
        } = self;
        let activity = Arc::new(idle::Activity::default());
        let stop = Arc::new(tokio::sync::Notify::new());
        let tcp_addr = tcp
            .as_ref()
            .and_then(|(l, _)| l.local_addr().ok())
            .map(|a| a.to_string());
        let (closing_tx, closing) = tokio::sync::watch::channel(false);
        let config = Arc::new(
            reload::ConfigWatch::start(opts.config_file.clone(), orch.clone(), opts.config.clone())
                .await,
        );
        let state = AppState {
            config: config.clone(),
            runs: Default::default(),
            orch: orch.clone(),
            activity: activity.clone(),
            info: Arc::new(Info {
                pid: std::process::id(),
                started_at,
                data_dir: opts.data_dir.display().to_string(),
                auto: opts.auto,
                idle_exit_seconds: opts.config.terminal.server_idle_exit_seconds,
                tcp: tcp_addr,
            }),
            stop: stop.clone(),
            closing: closing.clone(),
            dashboard: Arc::new(dashboard::Reader::new(&opts.data_dir, &opts.config)),
        };
        let app = http::router(state).layer(axum::middleware::from_fn_with_state(
            config,
            reload::follow_config,
        ));
        let mut servers = Vec::new();
        // The Unix socket has an accept loop of its own and no cap: it is served whatever the
        // TCP listener's clients do.
        servers.push(tokio::spawn(conn::serve(
            unix,
            app.clone(),
            None,
            closing.clone(),
        )));
        if let Some((listener, guard)) = tcp {
            // The bearer token, or the dashboard's session cookie for reading (`dashboard::auth`).
            let guarded = app.layer(axum::middleware::from_fn_with_state(
                guard,
                dashboard::auth::guard,
            ));
            let cap = conn::tcp_cap(open_files_limit());
            tracing::info!(cap, "TCP connections served at once");
            servers.push(tokio::spawn(conn::serve(
                listener,
                guarded,
                Some(cap),
                closing.clone(),
            )));
        }
        tracing::info!(socket = %opts.data_dir.join(SOCKET_FILE).display(), auto = opts.auto, "serving");

        let idle_limit = Duration::from_secs(opts.config.terminal.server_idle_exit_seconds);
        let idle = async {
            if opts.auto {
                idle::wait_until_idle(activity.clone(), orch.clone(), idle_limit).await
            } else {
                std::future::pending::<()>().await
            }
        };
        let gc = tokio::spawn(periodic_gc(
            orch.clone(),
            Duration::from_secs(opts.config.terminal.gc_interval_seconds),
        ));
        let reason = tokio::select! {
            _ = signals() => StopReason::Signal,
            _ = stop.notified() => StopReason::Asked,
            _ = idle => StopReason::Idle,
        };
        tracing::info!(?reason, "stopping");
        gc.abort();
        let _ = closing_tx.send(true);
        for s in servers {
            let _ = tokio::time::timeout(REQUEST_GRACE, s).await;
        }
        if reason != StopReason::Idle {
            drain(&orch).await;
        }
        orch.shutdown().await;
        socket::unbind(&opts.data_dir);
        drop(lock);
        Ok(reason)
    }
}

/// Raises this process's soft limit on open files to its hard limit; the limits before and
/// after when it raised it. A server holds two descriptors per task it has driven (the task's
/// lock file and its lock socket, `engine::lock`) besides its connections and the commands'
/// pipes, so the common soft limit of 1,024 would stop it with EMFILE near 500 tasks while the
/// hard limit (often 524,288) allows far more. Commands inherit the raised limit, as they
/// would inside a container whose limit is high.
fn raise_open_files_limit() -> std::io::Result<Option<(u64, u64)>> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the `rlimit` it is given, a valid one held for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let from = lim.rlim_cur;
    if from >= lim.rlim_max {
        return Ok(None);
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: setrlimit only reads the `rlimit` it is given, valid and initialised above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Some((from, lim.rlim_cur)))
}

/// This process's soft limit on open files, when it can be read.
fn open_files_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the `rlimit` it is given, a valid one held for the call.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0).then_some(lim.rlim_cur)
}

/// SIGTERM, SIGINT or SIGHUP.
async fn signals() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut streams = Vec::new();
    for kind in [
        SignalKind::terminate(),
        SignalKind::interrupt(),
        SignalKind::hangup(),
    ] {
        match signal(kind) {
            Ok(s) => streams.push(s),
            Err(e) => tracing::warn!(error = %e, "cannot watch a signal"),
        }
    }
    if streams.is_empty() {
        return std::future::pending().await;
    }
    let waits = streams.iter_mut().map(|s| Box::pin(s.recv()));
    let _ = futures_select_all(waits.collect()).await;
}

/// Waits for the first of several futures (a tiny `select_all`, to avoid a dependency).
async fn futures_select_all<F: std::future::Future + Unpin>(mut futs: Vec<F>) -> F::Output {
    std::future::poll_fn(move |cx| {
        for f in futs.iter_mut() {
            if let std::task::Poll::Ready(v) = std::pin::Pin::new(f).poll(cx) {
                return std::task::Poll::Ready(v);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Loads every task that a previous process left with a sandbox or an operation in flight, so
/// that recovery runs and its timers are armed now rather than at the next request naming it.
async fn load_live_tasks(orch: Orchestrator) {
    let tasks = match orch.tasks().await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the tasks to load at start");
            return;
        }
    };
    for t in tasks {
        let live = t.sandbox.is_some()
            || t.state.is_transient()
            || !t.queue.is_empty()
            || t.state == crate::core::TaskState::Running;
        if !live {
            continue;
        }
        let Ok(id) = TaskId::new(t.id.as_str()) else {
            continue;
        };
        match orch.load(&id).await {
            Ok(()) => tracing::info!(task = %id, state = %t.state, "loaded at start"),
            // Its record keeps the state it had when `taskbox rm` removed it.
            Err(crate::engine::EngineError::Removed { .. }) => {
                tracing::debug!(task = %id, "removed; not loaded")
            }
            // A fleet: another live server drives it (its lease is fresh).
            Err(crate::engine::EngineError::Store(crate::store::StoreError::LeaseHeld {
                owner,
                ..
            })) => tracing::debug!(task = %id, owner = %owner, "driven by another server"),
            Err(e) => tracing::warn!(task = %id, error = %e, "cannot load at start"),
        }
    }
}

/// Runs gc every `every` (the engine reconciled once at start already): the one place that
/// lists all of the provider's sandboxes and snapshots, so that no command has to.
// A periodic timer of the server's, like the idle clock.
#[allow(clippy::disallowed_methods)]
async fn periodic_gc(orch: Orchestrator, every: Duration) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match orch.gc(false).await {
            Ok(r) if r.held_elsewhere => {
                tracing::debug!("gc: another server of the fleet is running it")
            }
            Ok(r) => {
                let acted = r.sandboxes_stopped.len() + r.snapshots_deleted.len();
                if acted > 0 || r.temporaries_removed > 0 {
                    tracing::info!(
                        sandboxes_stopped = r.sandboxes_stopped.len(),
                        snapshots_deleted = r.snapshots_deleted.len(),
                        temporaries_removed = r.temporaries_removed,
                        "gc"
                    );
                }
                for e in &r.errors {
                    tracing::warn!(error = %e, "gc: an operation failed (the next gc tries again)");
                }
            }
            Err(e) => tracing::warn!(error = %e, "gc did not complete (the next one tries again)"),
        }
    }
}

/// Suspends every task with a live sandbox (files to a snapshot when persistent), so that none
/// outlives the engine that takes its snapshots.
async fn drain(orch: &Orchestrator) {
    let Ok(tasks) = orch.loaded_tasks().await else {
        return;
    };
    let live: Vec<TaskId> = tasks
        .iter()
        .filter(|t| t.sandbox.is_some())
        .filter_map(|t| TaskId::new(t.id.as_str()).ok())
        .collect();
    if live.is_empty() {
        return;
    }
    tracing::info!(
        tasks = live.len(),
        "suspending the tasks with live sandboxes"
    );
    let mut all = tokio::task::JoinSet::new();
    for id in live {
        let orch = orch.clone();
        all.spawn(async move {
            if let Err(e) = orch.suspend(&id).await {
                tracing::warn!(task = %id, error = %e, "could not suspend at shutdown");
            }
        });
    }
    let joined = async { while all.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_GRACE, joined).await.is_err() {
        tracing::warn!("suspending at shutdown took too long; recovery will finish it");
    }
}

/// The data dir a server for `data_dir` listens in (its socket path).
pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join(SOCKET_FILE)
}
