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
//!
//! The same client speaks to a server on another machine ([`Remote`], `taskbox --server URL`):
//! the same HTTP/1.1 over TCP, with the server's bearer token on every request. A fleet's
//! server that does not drive a task answers `task_elsewhere` naming the one that does
//! ([`Client::owner_of`] reads its address).

// Starting a server is spawning a process (the CLI re-executing itself) and waiting for its
// socket to answer: the client's own job, like a provider's.
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
pub mod autostart;
pub mod blocking;
pub mod body;
mod cost;
mod liveness;
mod remote;
mod watch;
pub mod wire;

use std::path::{Path, PathBuf};
use std::sync::Arc;

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
pub use liveness::{answer_wait, process_stopped, server_pid};
use remote::owner_address;
pub use remote::Remote;
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
    /// No server answers at a `--server` URL (nothing listens, or the host is unknown):
    /// nothing was sent.
    #[error("no taskbox server answers at {url}")]
    Unreachable {
        /// The URL.
        url: String,
        /// The connect error.
        #[source]
        source: std::io::Error,
    },
    /// A `--server` URL or token taskbox cannot use.
    #[error("{what}")]
    BadRemote {
        /// What is wrong (never the token).
        what: String,
        /// How to fix it.
        hint: String,
    },
    /// The exchange failed after the request was sent (the server died, or spoke nonsense).
    #[error("the taskbox server at {server} {what}")]
    Protocol {
        /// The server: its socket, or its URL.
        server: String,
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
            ClientError::Unreachable { .. } => Some(
                "check the URL, and that `taskbox serve --listen ADDR --token-file FILE` runs there and the port is reachable from here"
                    .into(),
            ),
            ClientError::BadRemote { hint, .. } => Some(hint.clone()),
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
    /// A server on another machine instead of the data dir's socket.
    remote: Option<Remote>,
    answer_wait: std::time::Duration,
}

/// A connection to a server: the Unix socket or TCP.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

impl Client {
    /// A client of the server for `data_dir` (its socket is `<data_dir>/taskbox.sock`).
    pub fn new(data_dir: &Path) -> Client {
        Client {
            data_dir: data_dir.to_path_buf(),
            socket: data_dir.join(SOCKET_FILE),
            remote: None,
            answer_wait: answer_wait(),
        }
    }

    /// A client of the server at `remote`, over TCP (no socket, never started by the CLI).
    pub fn remote(data_dir: &Path, remote: Remote) -> Client {
        Client {
            remote: Some(remote),
            ..Client::new(data_dir)
        }
    }

    /// The socket it talks to (unused for a [`Remote`] server).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The remote server it talks to, if it is one.
    pub fn remote_server(&self) -> Option<&Remote> {
        self.remote.as_ref()
    }

    /// Where it talks to, for messages: the socket's path or the server's URL.
    pub fn endpoint(&self) -> String {
        match &self.remote {
            Some(r) => r.url.clone(),
            None => self.socket.display().to_string(),
        }
    }

    /// For a `task_elsewhere` answer of a remote server (a fleet): a client of the server that
    /// drives the task, when the answer names its TCP address (`… at HOST:PORT`) and that
    /// address is one a client can dial (not `0.0.0.0`). `None` otherwise.
    pub fn owner_of(&self, error: &ApiError) -> Option<Client> {
        let remote = self.remote.as_ref()?;
        let addr = owner_address(error)?;
        (addr != remote.authority).then(|| Client::remote(&self.data_dir, remote.at(&addr)))
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
    /// run's cancel endpoint. The parts of `io` are taken only once the server answers, and
    /// given back when it refuses the run before its command printed anything, so after
    /// [`ClientError::NoServer`] or a refusal such as `task_elsewhere` the same `io` can be
    /// used again.
    pub async fn run_live(
        &self,
        task: &TaskId,
        command: &str,
        timeout_secs: Option<u64>,
        io: &mut ExecIo,
    ) -> Result<RunResult, ClientError> {
        let proto = |what: String| self.protocol(what);
        let body = RunRequest {
            command: command.to_string(),
            timeout_secs,
            stdin: io.stdin.is_some(),
            env: io.env.clone(),
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
        // Shared with the upload, so that a run refused before its command started gives its
        // stdin back whole but for what the upload had already sent.
        let stdin = io
            .stdin
            .take()
            .map(|rx| Arc::new(tokio::sync::Mutex::new(rx)));
        let mut cancel = io.cancel.take();
        let mut output_seen = false;
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
                        if let Some(rx) = &stdin {
                            uploads.spawn(self.clone().upload_stdin(run.clone(), rx.clone()));
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
                        if !output_seen {
                            // Refused before the command printed anything (`task_elsewhere`
                            // is answered before anything runs): the live side goes back to
                            // `io`, for the same request sent elsewhere.
                            while uploads.join_next().await.is_some() {}
                            io.stdin = stdin
                                .and_then(|rx| Arc::try_unwrap(rx).ok())
                                .map(tokio::sync::Mutex::into_inner);
                            (io.output, io.cancel) = (output, cancel);
                        }
                        return Err(ClientError::Api(Box::new(e)));
                    }
                    out @ RunEvent::Output { .. } => {
                        output_seen = true;
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
    async fn upload_stdin(
        self,
        run: String,
        stdin: Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<Vec<u8>>>>,
    ) {
        let (tx, body) = body::ChannelBody::new(16);
        let forward = async move {
            let mut stdin = stdin.lock().await;
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
            let req = self
                .request(Method::POST, &format!("/runs/{run}/stdin"))
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

    /// Checkpoints the task; see [`crate::engine::Orchestrator::checkpoint`].
    pub async fn checkpoint(
        &self,
        task: &TaskId,
    ) -> Result<crate::engine::CheckpointResult, ClientError> {
        self.call(
            Method::POST,
            &format!("/tasks/{task}/checkpoint"),
            None::<&()>,
        )
        .await
    }

    /// Rewinds the task to `to` (as [`crate::engine::rewind_to`] reads it) or `back`
    /// snapshots; see [`crate::engine::Orchestrator::rewind`].
    pub async fn rewind(
        &self,
        task: &TaskId,
        to: Option<&str>,
        back: Option<u64>,
    ) -> Result<crate::engine::RewindResult, ClientError> {
        let body = wire::RewindRequest {
            to: to.map(str::to_string),
            back,
        };
        self.call(Method::POST, &format!("/tasks/{task}/rewind"), Some(&body))
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

    /// Checks the socket's owner, then connects. `NoServer` when nobody listens; for a remote
    /// server, connects over TCP (`Unreachable` when nobody answers there).
    async fn connect(&self) -> Result<Box<dyn Io>, ClientError> {
        if let Some(remote) = &self.remote {
            let stream = tokio::net::TcpStream::connect(&remote.authority)
                .await
                .map_err(|source| ClientError::Unreachable {
                    url: remote.url.clone(),
                    source,
                })?;
            // Requests are small and answers stream: no batching of a cancel or an output line.
            let _ = stream.set_nodelay(true);
            return Ok(Box::new(stream));
        }
        let no_server = |source| ClientError::NoServer {
            data_dir: self.data_dir.clone(),
            source,
        };
        let meta = std::fs::symlink_metadata(&self.socket).map_err(no_server)?;
        check_owner(&self.socket, &meta)?;
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(no_server)?;
        Ok(Box::new(stream))
    }

    /// A request to `/v1{path}` with the headers every request carries: `Host`, and for a
    /// remote server its bearer token.
    fn request(&self, method: Method, path: &str) -> hyper::http::request::Builder {
        let builder = Request::builder()
            .method(method)
            .uri(format!("{API_PREFIX}{path}"));
        match &self.remote {
            Some(r) => builder
                .header(hyper::header::HOST, r.authority.as_str())
                .header(
                    hyper::header::AUTHORIZATION,
                    format!("Bearer {}", r.token.as_str()),
                ),
            None => builder.header(hyper::header::HOST, "taskbox"),
        }
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
            server: self.endpoint(),
            what,
        }
    }

    /// An error answer's body as the [`ApiError`] it should be.
    fn api_error(&self, status: StatusCode, body: &[u8]) -> ClientError {
        api_error(&self.endpoint(), status, body)
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
        let req = self
            .request(method, path)
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

/// An error answer's body (from the server at `server`) as the [`ApiError`] it should be.
fn api_error(server: &str, status: StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<ApiError>(body) {
        Ok(e) => ClientError::Api(Box::new(e)),
        Err(_) => ClientError::Protocol {
            server: server.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_urls_are_plain_http_to_a_host_and_need_a_token() {
        let r = Remote::new("http://worker-a:7424/", Some("t0ken-0123456789\n")).expect("valid");
        assert_eq!(
            (r.url(), r.authority.as_str()),
            ("http://worker-a:7424", "worker-a:7424")
        );
        assert_eq!(r.token.as_str(), "t0ken-0123456789");
        assert_eq!(
            Remote::new("http://10.0.0.5", Some("t"))
                .expect("valid")
                .authority,
            "10.0.0.5:80"
        );
        assert_eq!(
            Remote::new("http://[::1]:7424", Some("t"))
                .expect("valid")
                .authority,
            "[::1]:7424"
        );
        for (url, says) in [
            ("https://w:7424", "plain HTTP"),
            ("w:7424", "not an http:// URL"),
            ("http://me:pw@w:7424", "no user, path or query"),
            ("http://w:7424/v1", "no user, path or query"),
            ("http://w:port", "no valid port"),
            ("http://", "no user, path or query"),
        ] {
            let e = Remote::new(url, Some("tok")).expect_err(url);
            assert!(e.to_string().contains(says), "{url}: {e}");
            assert!(e.hint().is_some(), "{url}");
        }
        for token in [None, Some(""), Some(" \n")] {
            let e = Remote::new("http://w:7424", token).expect_err("no token");
            assert!(e.to_string().contains("bearer token"), "{e}");
            assert!(e.hint().expect("hint").contains("TASKBOX_TOKEN"), "{e:?}");
        }
        // The token shows in no Debug.
        let c = Client::remote(
            Path::new("/d"),
            Remote::new("http://w:1", Some("s3cr3t-tok")).expect("valid"),
        );
        assert!(!format!("{c:?}").contains("s3cr3t"), "{c:?}");
    }

    #[test]
    fn a_task_elsewhere_answer_names_the_owner_to_follow() {
        let elsewhere = |owner: &str| {
            ApiError::new(
                "task_elsewhere",
                format!("task `t1` is driven by another server (`{owner}`, its lease runs for 9000 ms more); send the request to that server"),
            )
        };
        let here = Client::remote(
            Path::new("/d"),
            Remote::new("http://w-a:7424", Some("tok")).expect("valid"),
        );
        let next = here
            .owner_of(&elsewhere(
                "w-b pid 42 since 2026-12-06T03:00:00Z at 10.0.0.7:7424",
            ))
            .expect("follows");
        assert_eq!(next.endpoint(), "http://10.0.0.7:7424");
        assert_eq!(next.remote.as_ref().expect("remote").token.as_str(), "tok");
        for owner in [
            "w-b pid 42 since 2026-12-06T03:00:00Z",
            "w-b pid 42 since T at 0.0.0.0:7424",
            "w-b pid 42 since T at w-a:7424",
        ] {
            assert!(here.owner_of(&elsewhere(owner)).is_none(), "{owner}");
        }
        let other = ApiError::new("busy", "task `t1` is driven (`x at 10.0.0.7:7424`)");
        assert!(here.owner_of(&other).is_none());
        // The socket's client never follows: a local server has no fleet address to go to.
        assert!(Client::new(Path::new("/d"))
            .owner_of(&elsewhere("w-b pid 42 since T at 10.0.0.7:7424"))
            .is_none());
    }
}
