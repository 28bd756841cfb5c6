//! Connections the server can cut: a listener whose connections carry a kill switch, so a
//! handler can make its own connection close before any response byte is written (the
//! "response lost after the work was done" fault), and a streaming body fed from a channel.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// A handle on one accepted connection (axum's `ConnectInfo`).
#[derive(Debug, Clone)]
pub(crate) struct ConnHandle {
    killed: Arc<AtomicBool>,
}

impl ConnHandle {
    /// From now on the connection fails every read and write, so hyper drops it without sending
    /// whatever the handler returns.
    pub(crate) fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
    }
}

/// A TCP listener whose connections can be killed through their [`ConnHandle`].
#[derive(Debug)]
pub(crate) struct KillableListener {
    inner: TcpListener,
}

impl KillableListener {
    pub(crate) fn new(inner: TcpListener) -> Self {
        KillableListener { inner }
    }
}

impl Listener for KillableListener {
    type Io = KillableStream;
    type Addr = ConnHandle;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // TcpListener's own accept retries transient errors (EMFILE and the like).
        let (stream, _) = Listener::accept(&mut self.inner).await;
        // A command's log stream is small writes that must leave as they happen (without it,
        // Nagle and delayed ACKs hold each chunk back ~40 ms).
        let _ = stream.set_nodelay(true);
        let killed = Arc::new(AtomicBool::new(false));
        (
            KillableStream {
                stream,
                killed: Arc::clone(&killed),
            },
            ConnHandle { killed },
        )
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        // Only used for logging by axum; a fresh handle is harmless.
        self.inner.local_addr().map(|_| ConnHandle {
            killed: Arc::new(AtomicBool::new(false)),
        })
    }
}

impl Connected<IncomingStream<'_, KillableListener>> for ConnHandle {
    fn connect_info(stream: IncomingStream<'_, KillableListener>) -> Self {
        stream.remote_addr().clone()
    }
}

/// A TCP stream that fails once killed.
#[derive(Debug)]
pub(crate) struct KillableStream {
    stream: TcpStream,
    killed: Arc<AtomicBool>,
}

impl KillableStream {
    fn check(&self) -> io::Result<()> {
        if self.killed.load(Ordering::SeqCst) {
            Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "connection cut by fault injection",
            ))
        } else {
            Ok(())
        }
    }
}

impl AsyncRead for KillableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check()?;
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check()?;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check()?;
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The sending half of a streaming body: each `Ok` is a chunk, an `Err` aborts the connection
/// mid-body (a transport error for the client).
pub(crate) type BodySender = mpsc::Sender<Result<Bytes, io::Error>>;

struct ChannelStream(mpsc::Receiver<Result<Bytes, io::Error>>);

impl futures_core::Stream for ChannelStream {
    type Item = Result<Bytes, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// A body fed by a task through the returned sender; it ends when the sender is dropped.
pub(crate) fn channel_body() -> (BodySender, Body) {
    let (tx, rx) = mpsc::channel(16);
    (tx, Body::from_stream(ChannelStream(rx)))
}
