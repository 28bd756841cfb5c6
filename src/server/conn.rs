//! The server's connections: its own accept loops over hyper's HTTP/1 connection, rather than
//! `axum::serve`, for what a server facing slow or hostile clients needs and `axum::serve` does
//! not offer (issue 32, items 5 and 14):
//!
//! - a deadline for a request's head ([`HEAD_TIMEOUT`]), which is also how long a kept-alive
//!   connection may sit idle: a client that sends half a request is closed, not waited for;
//! - a cap on the TCP listener's connections ([`tcp_cap`], a share of the open-files limit),
//!   beyond which a connection is answered `503` at once and closed, so that TCP clients cannot
//!   take the descriptors the Unix socket, the tasks and the journal need — the Unix socket has
//!   no cap and its own accept loop, and is served whatever TCP does;
//! - a bound on a request body's stalls ([`BODY_IDLE_TIMEOUT`], not for a run's stdin);
//! - the answers hyper writes by itself when a request cannot be parsed (`400`, `414`, `431`,
//!   with no body and no hook to give them one) made the API's JSON error, by
//!   [`JsonParseErrors`] on the connection's writing side.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::client::wire::ApiError;

/// How long a client has to send a request's head, counted from the connection's start or the
/// end of its previous answer (so also how long a kept-alive connection may idle). A client
/// that speaks HTTP sends its head in one write.
pub(super) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request's body may stall (no byte arriving) before the request fails (`400`):
/// a client that sends a head and then half a body is not waited for either. The stdin of a
/// run is exempt: a command's input may pause for as long as whoever types it.
pub(super) const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// The most a request's head may take; beyond it the answer is `431` (a JSON error).
pub(super) const MAX_HEAD: usize = 64 * 1024;

/// The most TCP connections (`--listen`) served at once, whatever the open-files limit.
const TCP_CONNECTIONS_MAX: usize = 1024;

/// The share of the open-files limit the TCP listener's connections may hold: a quarter, so
/// that the rest stays for the Unix socket's clients, the tasks' sandboxes and the journal.
const TCP_SHARE_OF_FDS: u64 = 4;

/// The TCP listener's connection cap under the process's open-files limit `nofile` (its soft
/// limit, once raised): a quarter of it, at least 8, at most [`TCP_CONNECTIONS_MAX`].
pub(super) fn tcp_cap(nofile: Option<u64>) -> usize {
    let share = nofile.map_or(TCP_CONNECTIONS_MAX as u64, |n| n / TCP_SHARE_OF_FDS);
    (share.clamp(8, TCP_CONNECTIONS_MAX as u64)) as usize
}

/// The layer that bounds a request body's stalls by [`BODY_IDLE_TIMEOUT`] (every endpoint's
/// but a run's stdin).
pub(super) async fn body_idle_timeout(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if req.uri().path().ends_with("/stdin") {
        return next.run(req).await;
    }
    let req = req.map(|body| axum::body::Body::new(IdleBody::new(body, BODY_IDLE_TIMEOUT)));
    next.run(req).await
}

/// A request body that fails once no frame arrived for `idle`.
struct IdleBody {
    inner: axum::body::Body,
    idle: Duration,
    stall: Pin<Box<tokio::time::Sleep>>,
}

impl IdleBody {
    // The stall clock is the server's own wait on a peer, like hyper's head timeout.
    #[allow(clippy::disallowed_methods)]
    fn new(inner: axum::body::Body, idle: Duration) -> IdleBody {
        IdleBody {
            inner,
            idle,
            stall: Box::pin(tokio::time::sleep(idle)),
        }
    }
}

impl axum::body::HttpBody for IdleBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    // As `new`: the stall clock restarts at each frame.
    #[allow(clippy::disallowed_methods)]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let next = tokio::time::Instant::now() + this.idle;
                this.stall.as_mut().reset(next);
                Poll::Ready(frame)
            }
            Poll::Pending => match this.stall.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(format!(
                    "no byte of the request body arrived for {} s",
                    this.idle.as_secs()
                ))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A listener this module accepts from.
pub(super) trait Accept: Send + 'static {
    /// A connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection.
    fn accept(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;
    /// Refuses a connection over the cap: a `503` written if the socket takes it at once, then
    /// closed (never waited on: a refusal must cost nothing).
    fn refuse(io: Self::Io);
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept(&self) -> io::Result<Self::Io> {
        tokio::net::UnixListener::accept(self).await.map(|(s, _)| s)
    }
    fn refuse(io: Self::Io) {
        let _ = io.try_write(&over_cap_answer());
    }
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&self) -> io::Result<Self::Io> {
        let (s, _) = tokio::net::TcpListener::accept(self).await?;
        // Output chunks of a run are small writes that must leave at once (no Nagle delay).
        let _ = s.set_nodelay(true);
        Ok(s)
    }
    fn refuse(io: Self::Io) {
        let _ = io.try_write(&over_cap_answer());
    }
}

/// The answer to a connection over the TCP cap.
fn over_cap_answer() -> Vec<u8> {
    let err = ApiError::new(
        "too_many_connections",
        "the server serves as many TCP connections as it may at once",
    )
    .hint("try again in a moment; the server's Unix socket is not capped");
    json_answer(503, "Service Unavailable", &err)
}

/// A complete `connection: close` answer with `err` as its JSON body.
fn json_answer(status: u16, reason: &str, err: &ApiError) -> Vec<u8> {
    let body = serde_json::to_vec(err).expect("an ApiError serializes");
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Serves `app` on every connection `listener` accepts until `closing` turns true, then lets
/// the connections finish their answers (no new request on them) and returns once all are
/// closed. `cap`: the most connections served at once; beyond it a connection is refused.
// A failed accept (out of descriptors) is retried after a pause, as `axum::serve` does: the
// server's own wait, like its idle clock.
#[allow(clippy::disallowed_methods)]
pub(super) async fn serve<L: Accept>(
    listener: L,
    app: Router,
    cap: Option<usize>,
    mut closing: watch::Receiver<bool>,
) {
    let permits = cap.map(|n| Arc::new(Semaphore::new(n)));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let io = tokio::select! {
            () = closed(&mut closing) => break,
            io = listener.accept() => io,
        };
        while conns.try_join_next().is_some() {}
        let io = match io {
            Ok(io) => io,
            Err(e) => {
                // EMFILE/ENFILE, or a connection reset before it was taken: the listener is
                // fine; pause so that a lack of descriptors does not spin.
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = match &permits {
            None => None,
            Some(p) => match p.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    tracing::warn!(
                        cap = cap.unwrap_or_default(),
                        "refused a TCP connection over the cap"
                    );
                    L::refuse(io);
                    continue;
                }
            },
        };
        conns.spawn(connection(io, app.clone(), permit, closing.clone()));
    }
    while conns.join_next().await.is_some() {}
}

/// Waits until `closing` turns true (or its sender is gone).
async fn closed(closing: &mut watch::Receiver<bool>) {
    let _ = closing.wait_for(|v| *v).await;
}

/// One connection, served until it closes; on `closing`, it finishes the answer in progress.
async fn connection<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: I,
    app: Router,
    _permit: Option<OwnedSemaphorePermit>,
    mut closing: watch::Receiver<bool>,
) {
    // A `Router` serves any request body, hyper's `Incoming` included.
    let service = TowerToHyperService::new(app);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        // One buffer per write, so that the head of hyper's own error answer is seen whole.
        .writev(false);
    let conn = builder.serve_connection(TokioIo::new(JsonParseErrors::new(io)), service);
    let mut conn = std::pin::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = closed(&mut closing) => {
            conn.as_mut().graceful_shutdown();
            conn.as_mut().await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "a connection ended with an error");
    }
}

/// A connection's stream that swaps the answers hyper writes by itself for a request it cannot
/// parse — a status line (`400`, `414` or `431`) and headers with no body and no content type;
/// an answer of the API always has a JSON body — for the same status with an [`ApiError`] body
/// and `connection: close` (hyper closes the connection after them anyway).
struct JsonParseErrors<I> {
    inner: I,
    /// A replacement being written: its bytes, how many are written, and the length of the
    /// write it replaces (reported written once it is all out).
    swap: Option<(Vec<u8>, usize, usize)>,
}

impl<I> JsonParseErrors<I> {
    fn new(inner: I) -> Self {
        JsonParseErrors { inner, swap: None }
    }
}

/// The JSON answer for a bodiless answer of hyper's own, or `None` for anything else.
fn parse_error_answer(buf: &[u8]) -> Option<Vec<u8>> {
    let rest = buf.strip_prefix(b"HTTP/1.1 ")?;
    let head_len = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    if head_len != buf.len() {
        return None;
    }
    let head = String::from_utf8_lossy(buf).to_ascii_lowercase();
    if head.contains("\r\ncontent-type:") || !head.contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    let (status, reason, err) = match rest.get(..4)? {
        b"400 " => (
            400,
            "Bad Request",
            ApiError::new(
                "bad_request",
                "the request is not HTTP/1.1 this server can read",
            )
            .hint("docs/api.md describes the API: HTTP/1.1 with JSON bodies under /v1"),
        ),
        b"414 " => (
            414,
            "URI Too Long",
            ApiError::new(
                "uri_too_long",
                "the request's path is over the server's limit",
            ),
        ),
        b"431 " => (
            431,
            "Request Header Fields Too Large",
            ApiError::new(
                "headers_too_large",
                format!(
                    "the request's head is over the server's limit of {} KiB",
                    MAX_HEAD / 1024
                ),
            )
            .hint("send fewer or shorter headers"),
        ),
        _ => return None,
    };
    Some(json_answer(status, reason, &err))
}

impl<I: AsyncRead + Unpin> AsyncRead for JsonParseErrors<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for JsonParseErrors<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.swap.is_none() {
            match parse_error_answer(buf) {
                None => return Pin::new(&mut this.inner).poll_write(cx, buf),
                Some(answer) => this.swap = Some((answer, 0, buf.len())),
            }
        }
        let (answer, written, replaces) = this.swap.as_mut().expect("set above");
        while *written < answer.len() {
            match Pin::new(&mut this.inner).poll_write(cx, &answer[*written..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        let replaces = *replaces;
        this.swap = None;
        Poll::Ready(Ok(replaces))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bodiless_answers_of_hypers_own_are_swapped() {
        let hyper_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Sun, 06 Dec 2026 03:00:00 GMT\r\n\r\n";
        let swapped = parse_error_answer(hyper_431).expect("swapped");
        let text = String::from_utf8(swapped).unwrap();
        assert!(text.starts_with("HTTP/1.1 431 "), "{text}");
        assert!(text.contains("\"code\":\"headers_too_large\""), "{text}");
        let hyper_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        assert!(parse_error_answer(hyper_400).is_some());
        // The API's own errors have a JSON body; successes are left alone.
        let api = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        assert!(parse_error_answer(api).is_none());
        let head_only = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n";
        assert!(parse_error_answer(head_only).is_none());
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert!(parse_error_answer(ok).is_none());
    }

    #[test]
    fn the_tcp_cap_is_a_share_of_the_descriptors() {
        assert_eq!(tcp_cap(Some(128)), 32);
        assert_eq!(tcp_cap(Some(16)), 8);
        assert_eq!(tcp_cap(Some(1 << 20)), TCP_CONNECTIONS_MAX);
        assert_eq!(tcp_cap(None), TCP_CONNECTIONS_MAX);
    }
}
