//! A blocking client of the run endpoint for `taskbox run`'s fast path (`cli/fast.rs`): plain
//! `std::os::unix::net::UnixStream`s and a small HTTP/1.1 exchange, with no async runtime.
//!
//! Why a second client: a warm `taskbox run` through a server is a short-lived process whose
//! own start is most of what it adds over the command, and building a tokio runtime, hyper's
//! connection and its tasks is a measurable part of it (ARCHITECTURE.md, "The CLI's fast
//! path"). [`Client`](super::Client) stays the client of everything else; this one speaks only
//! what a run needs — `POST /v1/tasks/{task}/run` read as NDJSON, `POST /v1/runs/{run}/cancel`
//! and `POST /v1/runs/{run}/stdin` — with the same wire types and the same errors.
//!
//! The HTTP it reads is what the server (hyper) writes: a status line, headers, and a body
//! framed by `Transfer-Encoding: chunked`, `Content-Length`, or the end of the connection.
//! Every request says `Connection: close`: one request per connection, as the async client.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use super::wire::{CancelRequest, RunEvent, RunRequest, API_PREFIX, SOCKET_FILE};
use super::{check_owner, ClientError};
use crate::ids::TaskId;
use crate::provider::CancelSignal;

/// The most a response's head may take (the server's are a few hundred bytes).
const MAX_HEAD: usize = 64 * 1024;

/// How much is read from the socket at a time.
const READ_CHUNK: usize = 64 * 1024;

/// A blocking client of one data dir's server, for runs. Holds no connection.
#[derive(Debug, Clone)]
pub struct BlockingClient {
    data_dir: PathBuf,
    socket: PathBuf,
}

impl BlockingClient {
    /// A client of the server for `data_dir` (its socket is `<data_dir>/taskbox.sock`).
    pub fn new(data_dir: &Path) -> BlockingClient {
        BlockingClient {
            data_dir: data_dir.to_path_buf(),
            socket: data_dir.join(SOCKET_FILE),
        }
    }

    /// Checks the socket's owner, then connects: [`ClientError::NoServer`] when nobody listens
    /// (no socket file, or a dead server's), [`ClientError::ForeignSocket`] when another user
    /// owns it. Nothing is sent.
    pub fn connect(&self) -> Result<UnixStream, ClientError> {
        let no_server = |source| ClientError::NoServer {
            data_dir: self.data_dir.clone(),
            source,
        };
        let meta = std::fs::symlink_metadata(&self.socket).map_err(no_server)?;
        check_owner(&self.socket, &meta)?;
        UnixStream::connect(&self.socket).map_err(no_server)
    }

    /// Sends a run request on `stream` (from [`BlockingClient::connect`]) and reads the answer's
    /// head. From the first byte written on, the run may have reached the server: nothing
    /// here is retried. A refusal (not `200`) is the server's [`ApiError`](super::ApiError).
    ///
    /// The answer's head is read by the first [`RunStream::next`], so that waiting for it can
    /// be interrupted and bounded as waiting for the output is.
    pub fn start_run(
        &self,
        stream: UnixStream,
        task: &TaskId,
        request: &RunRequest,
    ) -> Result<RunStream, ClientError> {
        let body =
            serde_json::to_vec(request).map_err(|e| self.protocol(format!("(encoding): {e}")))?;
        let mut conn = Conn::new(stream, self.socket.clone());
        conn.send(&format!("/tasks/{task}/run"), "application/json", &body)?;
        Ok(RunStream {
            conn,
            decoder: None,
            data: Vec::new(),
        })
    }

    /// After `waited` without an answer, the [`ClientError::NoAnswer`] to give up with when the
    /// server's process is stopped or a health probe on a second connection goes unanswered
    /// for `probe_ms`; `None` while the server is alive (a silent command is waited for).
    pub fn unanswered(&self, waited: std::time::Duration, probe_ms: u64) -> Option<ClientError> {
        let pid = super::server_pid(&self.data_dir);
        let stopped = pid.is_some_and(super::process_stopped);
        if !stopped && self.probe(probe_ms) {
            return None;
        }
        Some(ClientError::NoAnswer {
            data_dir: self.data_dir.clone(),
            pid,
            stopped,
            waited_secs: waited.as_secs(),
        })
    }

    /// Whether `GET /v1/health` answers on a connection of its own within `limit_ms` (its
    /// head is enough).
    pub fn probe(&self, limit_ms: u64) -> bool {
        let Ok(stream) = self.connect() else {
            return false;
        };
        let mut conn = Conn::new(stream, self.socket.clone());
        let head = format!(
            "GET {API_PREFIX}/health HTTP/1.1\r\nHost: taskbox\r\nConnection: close\r\n\r\n"
        );
        if conn.write_all(head.as_bytes()).is_err() {
            return false;
        }
        matches!(conn.wait_readable(None, Some(limit_ms)), Ok(true))
            && conn.fill().is_ok()
            && conn.buf.starts_with(b"HTTP/1.1 200")
    }

    /// Asks the server to cancel the run with `signal` (`POST /v1/runs/{run}/cancel`), on a
    /// connection of its own.
    pub fn cancel(&self, run: &str, signal: CancelSignal) -> Result<(), ClientError> {
        let body = serde_json::to_vec(&CancelRequest { signal })
            .map_err(|e| self.protocol(format!("(encoding): {e}")))?;
        let mut conn = Conn::new(self.connect()?, self.socket.clone());
        conn.send(&format!("/runs/{run}/cancel"), "application/json", &body)?;
        let head = conn.read_head()?;
        let body = conn.read_body_to_end(head.framing)?;
        match head.status {
            200 => Ok(()),
            status => Err(api_error(&self.socket, status, &body)),
        }
    }

    /// Streams `input` to the run as its stdin (`POST /v1/runs/{run}/stdin`, a chunked body
    /// whose end is the end of the command's stdin), on a connection of its own, until `input`
    /// ends or the server stops reading. Returns the bytes sent.
    pub fn upload_stdin(&self, run: &str, mut input: impl Read) -> Result<u64, ClientError> {
        let mut conn = Conn::new(self.connect()?, self.socket.clone());
        let head = format!(
            "POST {API_PREFIX}/runs/{run}/stdin HTTP/1.1\r\nHost: taskbox\r\n\
             Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\
             Connection: close\r\n\r\n"
        );
        conn.write_all(head.as_bytes())?;
        let mut buf = vec![0u8; READ_CHUNK];
        let mut sent = 0u64;
        loop {
            let n = match input.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // A closed or unreadable stdin is an ended one.
                Err(_) => break,
            };
            let mut frame = format!("{n:x}\r\n").into_bytes();
            frame.extend_from_slice(&buf[..n]);
            frame.extend_from_slice(b"\r\n");
            // The server stops reading once the command is done with its stdin.
            if conn.write_all(&frame).is_err() {
                return Ok(sent);
            }
            sent += n as u64;
        }
        conn.write_all(b"0\r\n\r\n")?;
        let head = conn.read_head()?;
        let body = conn.read_body_to_end(head.framing)?;
        match head.status {
            200 => Ok(sent),
            status => Err(api_error(&self.socket, status, &body)),
        }
    }

    fn protocol(&self, what: String) -> ClientError {
        protocol(&self.socket, what)
    }
}

fn protocol(socket: &Path, what: String) -> ClientError {
    ClientError::Protocol {
        server: socket.display().to_string(),
        what,
    }
}

/// An error answer's body as the [`ApiError`](super::ApiError) it should be (as the async client).
fn api_error(socket: &Path, status: u16, body: &[u8]) -> ClientError {
    match hyper::StatusCode::from_u16(status) {
        Ok(status) => super::api_error(&socket.display().to_string(), status, body),
        Err(_) => protocol(socket, format!("answered with the status {status}")),
    }
}

/// What [`RunStream::next`] came back with.
#[derive(Debug)]
pub enum Next {
    /// The next line of the run's answer.
    Event(RunEvent),
    /// The `wake` descriptor became readable, or the wait's limit passed; nothing was read.
    Woken,
}

/// A run's NDJSON answer as it arrives: `started`, output chunks, then `result` or `error`.
#[derive(Debug)]
pub struct RunStream {
    conn: Conn,
    /// `None` until the answer's head is read.
    decoder: Option<Decoder>,
    /// Body bytes not yet split into lines.
    data: Vec<u8>,
}

impl RunStream {
    /// The next line of the answer, waiting for it as long as it takes — unless `wake` becomes
    /// readable (a signal arrived: the caller has something to do) or `limit_ms` passes
    /// (`None`: no limit), which answer [`Next::Woken`]. An answer that ends before its
    /// `result` or `error` is a [`ClientError::Protocol`].
    pub fn next(
        &mut self,
        wake: Option<BorrowedFd<'_>>,
        limit_ms: Option<u64>,
    ) -> Result<Next, ClientError> {
        loop {
            let Some(decoder) = &mut self.decoder else {
                match self.conn.head()? {
                    Some(head) if head.status != 200 => {
                        let body = self.conn.read_body_to_end(head.framing)?;
                        return Err(api_error(&self.conn.socket, head.status, &body));
                    }
                    Some(head) => self.decoder = Some(Decoder::new(head.framing)),
                    None => {
                        if !self.conn.wait_readable(wake, limit_ms)? {
                            return Ok(Next::Woken);
                        }
                        self.conn.fill()?;
                    }
                }
                continue;
            };
            // What arrived (with the head, or since) first.
            decoder
                .decode(&mut self.conn.buf, &mut self.data)
                .map_err(|e| self.conn.protocol(format!("cut its answer short: {e}")))?;
            let done = decoder.done();
            if let Some(event) = self.line()? {
                return Ok(Next::Event(event));
            }
            if done || self.conn.eof {
                return Err(self
                    .conn
                    .protocol("ended its answer before the command's result".into()));
            }
            if !self.conn.wait_readable(wake, limit_ms)? {
                return Ok(Next::Woken);
            }
            self.conn.fill()?;
        }
    }

    /// The next complete non-blank line, parsed.
    fn line(&mut self) -> Result<Option<RunEvent>, ClientError> {
        while let Some(end) = self.data.iter().position(|b| *b == b'\n') {
            let rest = self.data.split_off(end + 1);
            let text = std::mem::replace(&mut self.data, rest);
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return serde_json::from_slice(&text).map(Some).map_err(|e| {
                self.conn
                    .protocol(format!("answered with an unexpected line: {e}"))
            });
        }
        Ok(None)
    }
}

/// One connection: the stream, what was read and not yet used, and whether it ended.
#[derive(Debug)]
struct Conn {
    stream: UnixStream,
    socket: PathBuf,
    buf: Vec<u8>,
    eof: bool,
}

/// A response's status and how its body is framed.
struct Head {
    status: u16,
    framing: Framing,
}

impl Conn {
    fn new(stream: UnixStream, socket: PathBuf) -> Conn {
        Conn {
            stream,
            socket,
            buf: Vec::new(),
            eof: false,
        }
    }

    fn protocol(&self, what: String) -> ClientError {
        protocol(&self.socket, what)
    }

    fn write_all(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream
            .write_all(bytes)
            .map_err(|e| self.protocol(format!("closed the connection before answering: {e}")))
    }

    /// Writes a request with a complete body.
    fn send(&mut self, path: &str, content_type: &str, body: &[u8]) -> Result<(), ClientError> {
        let mut req = format!(
            "POST {API_PREFIX}{path} HTTP/1.1\r\nHost: taskbox\r\nContent-Type: {content_type}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        self.write_all(&req)
    }

    /// Reads more into `buf`; sets `eof` when the server closed its side.
    ///
    /// The read lands in `buf`'s spare capacity, which is not zeroed first: zeroing 64 KiB for
    /// an answer of a few hundred bytes wrote 16 fresh pages (page faults that were a
    /// measurable part of a short `taskbox run`); the kernel touches only what it writes.
    fn fill(&mut self) -> Result<(), ClientError> {
        self.buf.reserve(READ_CHUNK);
        let spare = self.buf.spare_capacity_mut();
        let read = loop {
            // SAFETY: reads at most `spare.len()` bytes into `buf`'s spare capacity, memory
            // `buf` owns and that nothing else refers to; the descriptor is our open socket.
            let n = unsafe {
                libc::read(
                    self.stream.as_raw_fd(),
                    spare.as_mut_ptr().cast(),
                    spare.len(),
                )
            };
            if n >= 0 {
                break Ok(n as usize);
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                break Err(err);
            }
        };
        match read {
            Ok(n) => {
                // SAFETY: the read above initialised the first `n` bytes past the length.
                unsafe { self.buf.set_len(self.buf.len() + n) };
                self.eof = n == 0;
                Ok(())
            }
            Err(e) => Err(self.protocol(format!("cut its answer short: {e}"))),
        }
    }

    /// Waits until the socket has something to read (`true`), or `wake` is readable or
    /// `limit_ms` passed (`false`). A signal that interrupts the wait is the caller's `wake`
    /// (its handler writes there), so the wait is simply resumed.
    fn wait_readable(
        &self,
        wake: Option<BorrowedFd<'_>>,
        limit_ms: Option<u64>,
    ) -> Result<bool, ClientError> {
        let mut fds = [
            libc::pollfd {
                fd: self.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.map_or(-1, |w| w.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let timeout = limit_ms.map_or(-1, |ms| ms.min(i32::MAX as u64) as i32);
        loop {
            // SAFETY: `fds` is a valid array of two `pollfd`s for the duration of the call (a
            // negative fd is ignored by poll), and its length is passed with it.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    // Woken by a signal: its handler has written to `wake`; look again.
                    continue;
                }
                return Err(self.protocol(format!("cannot be waited for: {err}")));
            }
            if n == 0 || fds[1].revents != 0 {
                return Ok(false);
            }
            return Ok(true);
        }
    }

    /// Reads up to the end of the response's head and parses it.
    fn read_head(&mut self) -> Result<Head, ClientError> {
        loop {
            if let Some(head) = self.head()? {
                return Ok(head);
            }
            self.fill()?;
        }
    }

    /// The response's head, parsed, once `buf` holds all of it (`None`: read more first).
    fn head(&mut self) -> Result<Option<Head>, ClientError> {
        let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            if self.eof {
                return Err(self.protocol("closed the connection before answering".into()));
            }
            if self.buf.len() > MAX_HEAD {
                return Err(self.protocol("answered with a head of more than 64 KiB".into()));
            }
            return Ok(None);
        };
        let rest = self.buf.split_off(end + 4);
        let head = std::mem::replace(&mut self.buf, rest);
        let text = String::from_utf8_lossy(&head[..end]);
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .filter(|_| status_line.starts_with("HTTP/1."))
            .ok_or_else(|| {
                self.protocol(format!(
                    "answered with something other than HTTP/1.1: {status_line:?}"
                ))
            })?;
        let mut framing = Framing::Close;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let (name, value) = (name.trim(), value.trim());
            if name.eq_ignore_ascii_case("transfer-encoding")
                && value.to_ascii_lowercase().ends_with("chunked")
            {
                framing = Framing::Chunked;
            } else if name.eq_ignore_ascii_case("content-length")
                && !matches!(framing, Framing::Chunked)
            {
                let len = value.parse::<usize>().map_err(|_| {
                    self.protocol(format!("answered with a bad Content-Length: {value:?}"))
                })?;
                framing = Framing::Length(len);
            }
        }
        Ok(Some(Head { status, framing }))
    }

    /// The whole body of a response whose head was read.
    fn read_body_to_end(&mut self, framing: Framing) -> Result<Vec<u8>, ClientError> {
        let mut decoder = Decoder::new(framing);
        let mut body = Vec::new();
        loop {
            decoder
                .decode(&mut self.buf, &mut body)
                .map_err(|e| self.protocol(format!("cut its answer short: {e}")))?;
            if decoder.done() || (self.eof && decoder.ends_at_close()) {
                return Ok(body);
            }
            if self.eof {
                return Err(
                    self.protocol("cut its answer short: the connection closed mid-answer".into())
                );
            }
            self.fill()?;
        }
    }
}

/// How a response's body ends.
#[derive(Debug, Clone, Copy)]
enum Framing {
    Chunked,
    Length(usize),
    /// At the end of the connection.
    Close,
}

/// Where a chunked body's decoding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Before a chunk's size line.
    Size,
    /// In a chunk's data, this much left.
    Data(usize),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer lines up to an empty one.
    Trailers,
    Done,
}

/// Decodes a body's framing incrementally: what arrived in, the body's bytes out.
#[derive(Debug)]
enum Decoder {
    Chunked(Chunk),
    Length(usize),
    Close,
}

impl Decoder {
    fn new(framing: Framing) -> Decoder {
        match framing {
            Framing::Chunked => Decoder::Chunked(Chunk::Size),
            Framing::Length(n) => Decoder::Length(n),
            Framing::Close => Decoder::Close,
        }
    }

    fn done(&self) -> bool {
        matches!(self, Decoder::Chunked(Chunk::Done) | Decoder::Length(0))
    }

    fn ends_at_close(&self) -> bool {
        matches!(self, Decoder::Close)
    }

    /// Moves what of `input` it can decode into `out` (the rest stays in `input`).
    fn decode(&mut self, input: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<(), String> {
        let mut at = 0;
        let res = self.decode_from(input, &mut at, out);
        input.drain(..at);
        res
    }

    fn decode_from(
        &mut self,
        input: &[u8],
        at: &mut usize,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        loop {
            let left = &input[*at..];
            match self {
                Decoder::Close => {
                    out.extend_from_slice(left);
                    *at = input.len();
                    return Ok(());
                }
                Decoder::Length(n) => {
                    let take = (*n).min(left.len());
                    out.extend_from_slice(&left[..take]);
                    *at += take;
                    *n -= take;
                    return Ok(());
                }
                Decoder::Chunked(state) => match *state {
                    Chunk::Done => return Ok(()),
                    Chunk::Size | Chunk::Trailers => {
                        let Some(end) = left.windows(2).position(|w| w == b"\r\n") else {
                            if left.len() > MAX_HEAD {
                                return Err("a chunk's size line is too long".into());
                            }
                            return Ok(());
                        };
                        let line = &left[..end];
                        *at += end + 2;
                        if *state == Chunk::Trailers {
                            if line.is_empty() {
                                *state = Chunk::Done;
                            }
                            continue;
                        }
                        let text = String::from_utf8_lossy(line);
                        let size = text.split(';').next().unwrap_or_default().trim();
                        let size = usize::from_str_radix(size, 16)
                            .map_err(|_| format!("a bad chunk size line {text:?}"))?;
                        *state = if size == 0 {
                            Chunk::Trailers
                        } else {
                            Chunk::Data(size)
                        };
                    }
                    Chunk::Data(n) => {
                        if left.is_empty() {
                            return Ok(());
                        }
                        let take = n.min(left.len());
                        out.extend_from_slice(&left[..take]);
                        *at += take;
                        *state = if take == n {
                            Chunk::DataEnd
                        } else {
                            Chunk::Data(n - take)
                        };
                    }
                    Chunk::DataEnd => {
                        if left.len() < 2 {
                            return Ok(());
                        }
                        if &left[..2] != b"\r\n" {
                            return Err("a chunk's data is not followed by CRLF".into());
                        }
                        *at += 2;
                        *state = Chunk::Size;
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(framing: Framing, pieces: &[&[u8]]) -> (Vec<u8>, bool) {
        let mut d = Decoder::new(framing);
        let mut input = Vec::new();
        let mut out = Vec::new();
        for p in pieces {
            input.extend_from_slice(p);
            d.decode(&mut input, &mut out).expect("decodes");
        }
        (out, d.done())
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_pieces() {
        let body =
            b"5\r\nhello\r\n1;ext=1\r\n \r\na\r\n{\"a\":\"b\"}\n\r\n0\r\nx-trailer: 1\r\n\r\n";
        let (whole, done) = decode_all(Framing::Chunked, &[body]);
        assert_eq!(whole, b"hello {\"a\":\"b\"}\n");
        assert!(done);
        // Byte by byte: the same bytes, and done only at the very end.
        let pieces: Vec<&[u8]> = body.chunks(1).collect();
        let mut d = Decoder::new(Framing::Chunked);
        let (mut input, mut out) = (Vec::new(), Vec::new());
        for (i, p) in pieces.iter().enumerate() {
            input.extend_from_slice(p);
            d.decode(&mut input, &mut out).expect("decodes");
            assert_eq!(d.done(), i == pieces.len() - 1, "done at byte {i}");
        }
        assert_eq!(out, whole);
    }

    #[test]
    fn bad_chunks_are_refused() {
        let mut d = Decoder::new(Framing::Chunked);
        let mut out = Vec::new();
        assert!(d.decode(&mut b"zz\r\n".to_vec(), &mut out).is_err());
        let mut d = Decoder::new(Framing::Chunked);
        assert!(d.decode(&mut b"2\r\nabXY".to_vec(), &mut out).is_err());
    }

    #[test]
    fn length_bodies_stop_at_their_length() {
        let mut d = Decoder::new(Framing::Length(3));
        let mut input = b"abcdef".to_vec();
        let mut out = Vec::new();
        d.decode(&mut input, &mut out).expect("decodes");
        assert_eq!(out, b"abc");
        assert_eq!(input, b"def");
        assert!(d.done());
    }
}
