//! `taskbox::client`: a small client of a data dir's server (`taskbox serve`) over its Unix
//! socket, `<data>/taskbox.sock`, speaking the API of `docs/api.md`.
//!
//! It uses hyper's HTTP/1 client connection (`hyper::client::conn::http1`) on a tokio
//! `UnixStream`: hyper, hyper-util and http-body-util are already in the dependency tree through
//! reqwest (which cannot dial a Unix socket), so the client adds no crate, and it gets a
//! complete HTTP/1.1 implementation (chunked bodies, keep-alive) rather than a hand-written one.
//! One connection per request: a Unix-socket connect costs microseconds.
//!
//! [`ClientError::NoServer`] tells "no server answers" (nothing was sent, so starting a server
//! and retrying is safe) from failures after a request was sent (never retried: a `run` is not
//! idempotent). [`autostart`] starts a server in the background for `terminal.server = auto`.

// Starting a server is spawning a process (the CLI re-executing itself) and waiting for its
// socket to answer: the client's own job, like a provider's.
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
pub mod autostart;
pub mod blocking;
pub mod body;
mod watch;
pub mod wire;

use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::engine::{GcReport, ResumeResult, RunResult, SuspendResult};
use crate::ids::TaskId;
use crate::provider::live::cancel_requested;
use crate::provider::{CancelSignal, ExecIo};
pub use watch::Watch;
pub use wire::{ApiError, Health, WatchEvent, SOCKET_FILE};
use wire::{CancelRequest, GcRequest, RunEvent, RunRequest, API_PREFIX};

/// What can go wrong talking to a server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No server answers on the socket (no socket file, or nobody listening): nothing was sent.
    #[error("no taskbox server is running for {data_dir}")]
    NoServer {
        /// The data dir.
        data_dir: PathBuf,
        /// The connect error.
        #[source]
        source: std::io::Error,
    },
    /// The socket file belongs to another user: talking to it could hand commands to them.
    #[error("refusing the server socket {path}: it belongs to uid {owner}, not to uid {me}")]
    ForeignSocket {
        /// The socket.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Us.
        me: u32,
    },
    /// The server answered with an error (boxed: the error object is most of the size of a
    /// `Result` that carries it).
    #[error(transparent)]
    Api(Box<ApiError>),
    /// The exchange failed after the request was sent (the server died, or spoke nonsense).
    #[error("the taskbox server at {socket} {what}")]
    Protocol {
        /// The socket.
        socket: PathBuf,
        /// What happened.
        what: String,
    },
    /// The server took the request but does not answer: its process is stopped, or a probe
    /// on a second connection got no answer either (it is stuck or overloaded).
    #[error("the taskbox server{} for {data_dir} {}", pid.map(|p| format!(" (pid {p})")).unwrap_or_default(), if *stopped { format!("is stopped (SIGSTOP) and has not answered in {waited_secs} s") } else { format!("has not answered in {waited_secs} s, nor a health probe on a second connection") })]
    NoAnswer {
        /// The data dir.
        data_dir: PathBuf,
        /// The server's process, as its serve lock names it.
        pid: Option<u32>,
        /// Its process is stopped (state `T`).
        stopped: bool,
        /// How long the request waited.
        waited_secs: u64,
    },
    /// Starting a server failed.
    #[error("could not start a taskbox server for {data_dir}: {message}")]
    Start {
        /// The data dir.
        data_dir: PathBuf,
        /// Why.
        message: String,
        /// Where the server's log is.
        log: PathBuf,
        /// The `hint:` the server printed with its error, if it did.
        server_hint: Option<String>,
    },
}

impl From<ApiError> for ClientError {
    fn from(e: ApiError) -> ClientError {
        ClientError::Api(Box::new(e))
    }
}

impl ClientError {
    /// How to fix it, when known.
    pub fn hint(&self) -> Option<String> {
        match self {
            ClientError::NoServer { .. } => Some(
                "start one with `taskbox serve`, or `taskbox config set terminal.server auto` to let the CLI start one"
                    .into(),
            ),
            ClientError::ForeignSocket { path, .. } => Some(format!(
                "another user's process owns {}; stop it or remove the file",
                path.display()
            )),
            ClientError::Api(e) => e.hint.clone(),
            ClientError::Protocol { .. } => Some(
                "`taskbox status` says whether a server runs; its log is <data>/serve.log".into(),
            ),
            ClientError::NoAnswer {
                pid: Some(pid),
                stopped: true,
                ..
            } => Some(format!(
                "`kill -CONT {pid}` lets it go on; `kill {pid}` stops it (the next command starts a new one under terminal.server = auto)"
            )),
            ClientError::NoAnswer { pid: Some(pid), .. } => Some(format!(
                "its log is <data>/serve.log; `kill {pid}` stops it (the next command starts a new one under terminal.server = auto); TASKBOX_ANSWER_WAIT=SECONDS waits longer"
            )),
            ClientError::NoAnswer { pid: None, .. } => Some(
                "its log is <data>/serve.log; TASKBOX_ANSWER_WAIT=SECONDS waits longer".into(),
            ),
            ClientError::Start {
                log,
                server_hint: Some(hint),
                ..
            } => Some(format!("{hint} (the server's log: {})", log.display())),
            ClientError::Start { log, .. } => Some(format!("see {}", log.display())),
        }
    }
}

/// A client of one data dir's server. Cheap to clone; holds no connection.
#[derive(Debug, Clone)]
pub struct Client {
    data_dir: PathBuf,
    socket: PathBuf,
    answer_wait: std::time::Duration,
}

impl Client {
    /// A client of the server for `data_dir` (its socket is `<data_dir>/taskbox.sock`).
    pub fn new(data_dir: &Path) -> Client {
        Client {
            data_dir: data_dir.to_path_buf(),
            socket: data_dir.join(SOCKET_FILE),
            answer_wait: answer_wait(),
        }
    }

    /// The socket it talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Who serves, since when, and the tasks with live sandboxes.
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.call(Method::GET, "/health", None::<&()>).await
    }

    /// Runs `command` in the task's sandbox; see [`crate::engine::Orchestrator::run`].
    pub async fn run(
        &self,
        task: &TaskId,
        command: &str,
        timeout_secs: Option<u64>,
    ) -> Result<RunResult, ClientError> {
        self.run_live(task, command, timeout_secs, &mut ExecIo::default())
            .await
    }

    /// Runs `command` with its live side, as [`crate::engine::Orchestrator::run_live`] does
    /// in-process: output chunks go to `io.output` as the server streams them, `io.stdin` is
    /// uploaded to the run as it is read, and a cancel through `io.cancel` is posted to the
    /// run's cancel endpoint. The parts of `io` are taken only once the server answers, so after
    /// [`ClientError::NoServer`] the same `io` can be used again.
    pub async fn run_live(
        &self,
        task: &TaskId,
        command: &str,
        timeout_secs: Option<u64>,
        io: &mut ExecIo,
    ) -> Result<RunResult, ClientError> {
        let proto = |what: String| ClientError::Protocol {
            socket: self.socket.clone(),
            what,
        };
        let body = RunRequest {
            command: command.to_string(),
            timeout_secs,
            stdin: io.stdin.is_some(),
        };
        let (status, mut body, driver) = self
            .send(Method::POST, &format!("/tasks/{task}/run"), Some(&body))
            .await?;
        // The connection is driven until this returns, however it returns.
        let _driver = AbortOnDrop(driver);
        if status != StatusCode::OK {
            let bytes = body
                .collect()
                .await
                .map_err(|e| proto(format!("cut its answer short: {e}")))?
                .to_bytes();
            return Err(self.api_error(status, &bytes));
        }
        let output = io.output.take();
        let mut stdin = io.stdin.take();
        let mut cancel = io.cancel.take();
        let mut run_id: Option<String> = None;
        let mut pending: Option<CancelSignal> = None;
        let mut uploads = tokio::task::JoinSet::new();
        let mut line = Vec::new();
        loop {
            let frame = tokio::select! {
                frame = body.frame() => frame,
                signal = cancel_requested(&mut cancel), if pending.is_none() => {
                    pending = Some(signal);
                    if let Some(run) = &run_id {
                        uploads.spawn(self.clone().cancel_run(run.clone(), signal));
                    }
                    continue;
                }
            };
            let data = match frame {
                None => return Err(proto("ended its answer before the command's result".into())),
                Some(Err(e)) => return Err(proto(format!("cut its answer short: {e}"))),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => data,
                    Err(_) => continue,
                },
            };
            line.extend_from_slice(&data);
            while let Some(end) = line.iter().position(|b| *b == b'\n') {
                let rest = line.split_off(end + 1);
                let text = std::mem::replace(&mut line, rest);
                if text.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let event: RunEvent = serde_json::from_slice(&text)
                    .map_err(|e| proto(format!("answered with an unexpected line: {e}")))?;
                match event {
                    RunEvent::Started { run } => {
                        if let Some(rx) = stdin.take() {
                            uploads.spawn(self.clone().upload_stdin(run.clone(), rx));
                        }
                        if let Some(signal) = pending {
                            uploads.spawn(self.clone().cancel_run(run.clone(), signal));
                        }
                        run_id = Some(run);
                    }
                    RunEvent::Result(result) => {
                        uploads.abort_all();
                        return Ok(result);
                    }
                    RunEvent::Error(e) => {
                        uploads.abort_all();
                        return Err(ClientError::Api(Box::new(e)));
                    }
                    out @ RunEvent::Output { .. } => {
                        if let (Some(tx), Some(chunk)) = (&output, out.into_chunk()) {
                            let _ = tx.send(chunk).await;
                        }
                    }
                }
            }
        }
    }

    /// Streams `stdin` to the run (`POST /v1/runs/{run}/stdin`) on a connection of its own;
    /// the end of `stdin` is the end of the body, which the server passes on as end of file.
    async fn upload_stdin(self, run: String, mut stdin: tokio::sync::mpsc::Receiver<Vec<u8>>) {
        let (tx, body) = body::ChannelBody::new(16);
        let forward = async move {
            while let Some(data) = stdin.recv().await {
                if tx.send(Bytes::from(data)).await.is_err() {
                    break;
                }
            }
        };
        let send = async {
            let stream = self.connect().await.ok()?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .ok()?;
            let driver = tokio::spawn(conn);
            let req = Request::builder()
                .method(Method::POST)
                .uri(format!("{API_PREFIX}/runs/{run}/stdin"))
                .header(hyper::header::HOST, "taskbox")
                .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
                .body(body)
                .ok()?;
            let resp = sender.send_request(req).await.ok();
            driver.abort();
            resp
        };
        let (_, resp) = tokio::join!(forward, send);
        if let Some(resp) = resp.filter(|r| r.status() != StatusCode::OK) {
            tracing::debug!(status = %resp.status(), "the server refused the command's stdin");
        }
    }

    /// Asks the server to cancel the run with `signal`.
    async fn cancel_run(self, run: String, signal: CancelSignal) {
        let res: Result<serde_json::Value, _> = self
            .call(
                Method::POST,
                &format!("/runs/{run}/cancel"),
                Some(&CancelRequest { signal }),
            )
            .await;
        if let Err(e) = res {
            tracing::debug!(error = %e, "could not cancel the run");
        }
    }

    /// Suspends the task; see [`crate::engine::Orchestrator::suspend`].
    pub async fn suspend(&self, task: &TaskId) -> Result<SuspendResult, ClientError> {
        self.call(Method::POST, &format!("/tasks/{task}/suspend"), None::<&()>)
            .await
    }

    /// Resumes the task; see [`crate::engine::Orchestrator::resume`].
    pub async fn resume(&self, task: &TaskId) -> Result<ResumeResult, ClientError> {
        self.call(Method::POST, &format!("/tasks/{task}/resume"), None::<&()>)
            .await
    }

    /// Forks the task into `child`; see [`crate::engine::Orchestrator::fork`]. `snapshot` as
    /// [`crate::core::ForkFrom::parse`] reads it (`None`: the latest).
    pub async fn fork(
        &self,
        task: &TaskId,
        child: &TaskId,
        snapshot: Option<&str>,
    ) -> Result<crate::engine::ForkResult, ClientError> {
        let body = wire::ForkRequest {
            child: child.to_string(),
            snapshot: snapshot.map(str::to_string),
        };
        self.call(Method::POST, &format!("/tasks/{task}/fork"), Some(&body))
            .await
    }

    /// Removes the task; see [`crate::engine::Orchestrator::remove`].
    pub async fn remove(
        &self,
        task: &TaskId,
        keep_snapshots: bool,
    ) -> Result<crate::engine::RemoveResult, ClientError> {
        let body = wire::RemoveRequest { keep_snapshots };
        self.call(Method::POST, &format!("/tasks/{task}/remove"), Some(&body))
            .await
    }

    /// Runs a gc in the server now; see [`crate::engine::Orchestrator::gc`].
    pub async fn gc(&self, dry_run: bool) -> Result<GcReport, ClientError> {
        self.call(Method::POST, "/gc", Some(&GcRequest { dry_run }))
            .await
    }

    /// Every task with its state, as JSON (`GET /v1/tasks`).
    pub async fn tasks(&self) -> Result<serde_json::Value, ClientError> {
        self.call(Method::GET, "/tasks", None::<&()>).await
    }

    /// One task's view, as JSON (`GET /v1/tasks/{task}`).
    pub async fn show(
        &self,
        task: &TaskId,
        journal: usize,
    ) -> Result<serde_json::Value, ClientError> {
        self.call(
            Method::GET,
            &format!("/tasks/{task}?journal={journal}"),
            None::<&()>,
        )
        .await
    }

    /// Follows the task's transitions (`GET /v1/tasks/{task}/watch`): the task's state now,
    /// then each state change as the server commits it.
    pub async fn watch(&self, task: &TaskId) -> Result<Watch, ClientError> {
        let (status, body, driver) = self
            .send(Method::GET, &format!("/tasks/{task}/watch"), None::<&()>)
            .await?;
        if status != StatusCode::OK {
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            driver.abort();
            return Err(self.api_error(status, &body));
        }
        Ok(Watch::new(self.clone(), body, driver))
    }

    /// Asks the server to stop (it suspends tasks with live sandboxes first).
    pub async fn shutdown(&self) -> Result<serde_json::Value, ClientError> {
        self.call(Method::POST, "/shutdown", None::<&()>).await
    }

    /// Checks the socket's owner, then connects. `NoServer` when nobody listens.
    async fn connect(&self) -> Result<tokio::net::UnixStream, ClientError> {
        let no_server = |source| ClientError::NoServer {
            data_dir: self.data_dir.clone(),
            source,
        };
        let meta = std::fs::symlink_metadata(&self.socket).map_err(no_server)?;
        check_owner(&self.socket, &meta)?;
        tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(no_server)
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let (status, body, driver) = self.send(method, path, body).await?;
        let body = body
            .collect()
            .await
            .map_err(|e| self.protocol(format!("cut its answer short: {e}")))?
            .to_bytes();
        driver.abort();
        if status == StatusCode::OK {
            return serde_json::from_slice(&body)
                .map_err(|e| self.protocol(format!("answered with unexpected JSON: {e}")));
        }
        Err(self.api_error(status, &body))
    }

    fn protocol(&self, what: String) -> ClientError {
        ClientError::Protocol {
            socket: self.socket.clone(),
            what,
        }
    }

    /// An error answer's body as the [`ApiError`] it should be.
    fn api_error(&self, status: StatusCode, body: &[u8]) -> ClientError {
        api_error(&self.socket, status, body)
    }

    /// Connects, sends one request and returns the answer's status and body as they arrive,
    /// with the task driving the connection (abort it once done).
    async fn send<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<
        (
            StatusCode,
            hyper::body::Incoming,
            tokio::task::JoinHandle<Result<(), hyper::Error>>,
        ),
        ClientError,
    > {
        let stream = self.connect().await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.protocol(format!("refused the connection: {e}")))?;
        // The connection is driven alongside the request; it ends when the answer is read.
        let driver = tokio::spawn(conn);
        let bytes = match body {
            Some(b) => {
                serde_json::to_vec(b).map_err(|e| self.protocol(format!("(encoding): {e}")))?
            }
            None => Vec::new(),
        };
        let req = Request::builder()
            .method(method)
            .uri(format!("{API_PREFIX}{path}"))
            .header(hyper::header::HOST, "taskbox")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| self.protocol(format!("(request): {e}")))?;
        let resp = self
            .answered(sender.send_request(req))
            .await?
            .map_err(|e| self.protocol(format!("closed the connection before answering: {e}")))?;
        let status = resp.status();
        Ok((status, resp.into_body(), driver))
    }
}

impl Client {
    /// Waits for `answer` (a request's answer head) as long as the server is alive: each
    /// [`answer_wait`] without it, the server is looked at — its process stopped, or a health
    /// probe on a second connection unanswered within the same bound, is
    /// [`ClientError::NoAnswer`]. A slow answer of a live server (a suspend snapshotting
    /// gigabytes) is waited for.
    async fn answered<F: std::future::Future>(&self, answer: F) -> Result<F::Output, ClientError> {
        tokio::pin!(answer);
        let mut waited = std::time::Duration::ZERO;
        loop {
            match tokio::time::timeout(self.answer_wait, &mut answer).await {
                Ok(out) => return Ok(out),
                Err(_) => waited += self.answer_wait,
            }
            let pid = server_pid(&self.data_dir);
            let stopped = pid.is_some_and(process_stopped);
            let alive = !stopped
                && tokio::time::timeout(self.answer_wait, self.probe())
                    .await
                    .unwrap_or(false);
            if !alive {
                return Err(ClientError::NoAnswer {
                    data_dir: self.data_dir.clone(),
                    pid,
                    stopped,
                    waited_secs: waited.as_secs(),
                });
            }
        }
    }

    /// Whether `GET /v1/health` answers on a connection of its own.
    async fn probe(&self) -> bool {
        let probe = async {
            let stream = self.connect().await.ok()?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .ok()?;
            let driver = AbortOnDrop(tokio::spawn(conn));
            let req = Request::builder()
                .method(Method::GET)
                .uri(format!("{API_PREFIX}/health"))
                .header(hyper::header::HOST, "taskbox")
                .body(Full::new(Bytes::new()))
                .ok()?;
            let resp = sender.send_request(req).await.ok()?;
            drop(driver);
            Some(resp.status() == StatusCode::OK)
        };
        probe.await.unwrap_or(false)
    }
}

/// How long the CLI waits for a server's answer before it looks whether the server is alive:
/// `TASKBOX_ANSWER_WAIT` seconds (at least 1), else 20 s.
pub fn answer_wait() -> std::time::Duration {
    let secs = std::env::var("TASKBOX_ANSWER_WAIT")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(20);
    std::time::Duration::from_secs(secs)
}

/// The pid of the server of `data_dir`, as it wrote itself into its serve lock.
pub fn server_pid(data_dir: &Path) -> Option<u32> {
    std::fs::read_to_string(data_dir.join("serve.lock"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether the process `pid` is stopped (`T`, by SIGSTOP or a debugger: `t`), from
/// `/proc/PID/stat`; false when it cannot be read.
pub fn process_stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command's name, which is in parentheses and may hold any byte.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .is_some_and(|state| state == 'T' || state == 't')
}

/// An error answer's body (from the server at `socket`) as the [`ApiError`] it should be.
fn api_error(socket: &Path, status: StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<ApiError>(body) {
        Ok(e) => ClientError::Api(Box::new(e)),
        Err(_) => ClientError::Protocol {
            socket: socket.to_path_buf(),
            what: format!("answered {status}: {}", String::from_utf8_lossy(body)),
        },
    }
}

/// Refuses a socket file that belongs to another user: its owner would see every command.
pub fn check_owner(path: &Path, meta: &std::fs::Metadata) -> Result<(), ClientError> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: `geteuid` takes no arguments, touches no memory and cannot fail.
    let me = unsafe { libc::geteuid() };
    check_owner_is(path, meta.uid(), me)
}

/// [`check_owner`] against a given user id (testable without a second account).
pub fn check_owner_is(path: &Path, owner: u32, me: u32) -> Result<(), ClientError> {
    if owner == me {
        Ok(())
    } else {
        Err(ClientError::ForeignSocket {
            path: path.to_path_buf(),
            owner,
            me,
        })
    }
}

/// Aborts the task driving a connection when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<Result<(), hyper::Error>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
