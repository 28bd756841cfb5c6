//! Running one command in a session: one HTTP request when all goes well, a recovery path when
//! the stream breaks, and a timeout that kills the command but never the sandbox.
//!
//! The warm path is a single `POST …/cmd` with `wait:true, logs:true`, consumed as NDJSON up
//! to the final command record (Hermes spends an extra `GET` before every command). Streams are
//! cut in production after about five minutes, so a stream that ends before the exit code is
//! not an error: the command runs on, and a long-poll loop (`GET …/cmd/{id}?wait=true`, which
//! survives transport errors) waits for its exit, after which `GET …/logs` replays the output
//! from the start. This loop is the provider's only internal retry: the command is already
//! running, so waiting for it is not a repeat of anything.
//!
//! The live side ([`ExecIo`]): each log chunk of the stream is forwarded as it arrives (after a
//! recovery, the part of the `/logs` replay beyond what was forwarded); a cancel posts the
//! caller's signal to the command's kill endpoint (then SIGKILL after a grace), never touching
//! the session. The API has no stdin for commands, so stdin is *uploaded, then redirected*: it
//! is read to its end, written to a hidden file in the sandbox's working directory
//! (`/vercel/sandbox/.taskbox-stdin-…`, with `fs/write`), and the command runs with its stdin
//! opened on that file, which is removed before the command itself starts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::client::{NdjsonStream, RunCommand, StreamEvent, VercelClient};
use crate::core::FailureKind;
use crate::provider::live::cancel_requested;
use crate::provider::{
    bound_output, ExecIo, ExecOutput, ExecRequest, OutputChunk, OutputStream, ProviderError,
};

/// The exit code reported when taskbox's timeout killed the command (as `timeout(1)` does).
pub const TIMEOUT_EXIT_CODE: i32 = 124;

/// SIGTERM: what a timed-out command receives.
const SIGTERM: i32 = 15;

/// SIGKILL: what a cancelled command that outlived its grace receives.
const SIGKILL: i32 = 9;

/// How long a cancelled command has to exit on the caller's signal before it is killed.
const CANCEL_GRACE: Duration = Duration::from_secs(3);

/// Most stdin uploaded for one command (it is read whole before the command starts).
pub const MAX_STDIN_BYTES: usize = 64 * 1024 * 1024;

/// The script that opens the uploaded stdin (`$1`) on fd 0, removes the file, and replaces
/// itself with `bash -c` of the command (`$0`), so the command sees neither.
const STDIN_REDIRECT: &str = r#"exec 0<"$1" && rm -f -- "$1" && exec bash -c "$0""#;

/// Tuning of command execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOptions {
    /// Characters kept per stream (40 % head, 60 % tail).
    pub max_output_chars: usize,
    /// The server-side timeout is ours plus this, as a backstop should taskbox die mid-command
    /// (the server then SIGKILLs the orphan instead of letting it run for the session's life).
    pub server_timeout_grace: Duration,
    /// Bound on fetching the logs after a recovered stream.
    pub logs_timeout: Duration,
    /// Longest pause between long-poll attempts after a transport error.
    pub max_poll_delay: Duration,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            max_output_chars: crate::provider::MAX_OUTPUT_CHARS,
            server_timeout_grace: Duration::from_secs(10),
            logs_timeout: Duration::from_secs(60),
            max_poll_delay: Duration::from_secs(2),
        }
    }
}

/// Accumulates one output stream in bounded memory, producing exactly what [`bound_output`]
/// would make of the whole text: the first 40 % and the last 60 % of `max` characters.
#[derive(Debug, Clone)]
pub struct BoundedText {
    max: usize,
    /// Everything so far, until the text first exceeds `2 * max`; then only the tail.
    buf: String,
    /// The kept head, once compacted.
    head: Option<String>,
    /// Characters in `buf`.
    buf_chars: usize,
    /// Characters seen in total.
    total: usize,
}

impl BoundedText {
    /// An empty accumulator keeping `max` characters.
    pub fn new(max: usize) -> BoundedText {
        BoundedText {
            max,
            buf: String::new(),
            head: None,
            buf_chars: 0,
            total: 0,
        }
    }

    /// Appends a chunk.
    pub fn push(&mut self, s: &str) {
        let n = s.chars().count();
        self.buf.push_str(s);
        self.buf_chars += n;
        self.total += n;
        let limit = self.max.saturating_mul(2).max(1);
        if self.buf_chars > limit {
            let head_n = self.max * 2 / 5;
            let tail_n = self.max - head_n;
            if self.head.is_none() {
                self.head = Some(self.buf.chars().take(head_n).collect());
            }
            let skip = self.buf_chars - tail_n;
            let cut = self
                .buf
                .char_indices()
                .nth(skip)
                .map(|(i, _)| i)
                .unwrap_or(self.buf.len());
            self.buf.drain(..cut);
            self.buf_chars = tail_n;
        }
    }

    /// Whether the text seen so far is longer than what is kept.
    pub fn truncated(&self) -> bool {
        self.total > self.max
    }

    /// The bounded text.
    pub fn finish(self) -> String {
        match self.head {
            None => bound_output(&self.buf, self.max),
            Some(head) => {
                // Same shape as `bound_output`, with the counts of the whole stream.
                let head_n = self.max * 2 / 5;
                let tail_n = self.max - head_n;
                let tail: String = self.buf.chars().skip(self.buf_chars - tail_n).collect();
                format!(
                    "{head}\n[taskbox: output truncated, {} of {} characters omitted]\n{tail}",
                    self.total - head_n - tail_n,
                    self.total
                )
            }
        }
    }
}

struct Captured {
    stdout: BoundedText,
    stderr: BoundedText,
}

impl Captured {
    fn new(max: usize) -> Captured {
        Captured {
            stdout: BoundedText::new(max),
            stderr: BoundedText::new(max),
        }
    }

    fn into_output(self, exit_code: i32, timed_out: bool, started: Instant) -> ExecOutput {
        ExecOutput {
            exit_code,
            timed_out,
            stdout_truncated: self.stdout.truncated(),
            stderr_truncated: self.stderr.truncated(),
            stdout: self.stdout.finish(),
            stderr: self.stderr.finish(),
            duration_ms: started.elapsed().as_millis() as u64,
            ..ExecOutput::default()
        }
    }
}

/// Forwards log chunks to the caller as they arrive, counting what was forwarded per stream so
/// that a replay from the start forwards only the rest.
struct Live {
    tx: Option<mpsc::Sender<OutputChunk>>,
    /// Bytes forwarded (or skipped by a replay) of stdout and stderr.
    sent: [usize; 2],
}

impl Live {
    fn index(stream: OutputStream) -> usize {
        match stream {
            OutputStream::Stdout => 0,
            OutputStream::Stderr => 1,
        }
    }

    /// Forwards `data`, which starts at byte `at` of its stream, from the first byte not yet
    /// forwarded.
    async fn forward(&mut self, stream: OutputStream, at: usize, data: &str) {
        let i = Self::index(stream);
        let end = at + data.len();
        if end <= self.sent[i] {
            return;
        }
        let from = self.sent[i].saturating_sub(at);
        self.sent[i] = end;
        if let Some(tx) = &self.tx {
            let chunk = OutputChunk {
                stream,
                data: data.as_bytes()[from..].to_vec(),
            };
            if tx.send(chunk).await.is_err() {
                self.tx = None;
            }
        }
    }

    /// Forwards the next chunk of the live stream.
    async fn push(&mut self, stream: OutputStream, data: &str) {
        let at = self.sent[Self::index(stream)];
        self.forward(stream, at, data).await;
    }
}

/// Reads the caller's stdin to its end (bounded), for the upload.
async fn read_stdin(rx: &mut mpsc::Receiver<Vec<u8>>) -> Result<Vec<u8>, ProviderError> {
    let mut data = Vec::new();
    while let Some(chunk) = rx.recv().await {
        data.extend_from_slice(&chunk);
        if data.len() > MAX_STDIN_BYTES {
            return Err(ProviderError::new(
                FailureKind::Invalid,
                "run command",
                format!(
                    "stdin is larger than {} MiB: the Vercel backend uploads a command's stdin whole before running it",
                    MAX_STDIN_BYTES / (1024 * 1024)
                ),
            ));
        }
    }
    Ok(data)
}

/// Where the legacy runtimes' commands start; used only when a session reports no `cwd`.
pub(crate) const LEGACY_SANDBOX_ROOT: &str = "/vercel/sandbox";

/// A file name (relative to the session's working directory, where commands start: no `cwd` is
/// sent) no other command's upload uses.
fn stdin_file() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        ".taskbox-stdin-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Waits for a cancel, then sends its signal to the command once its id is known (and SIGKILL
/// after [`CANCEL_GRACE`]). Never returns: it runs beside the command until the exec is done.
async fn cancel_when_asked(
    client: &VercelClient,
    session_id: &str,
    cancel: &mut Option<watch::Receiver<Option<crate::provider::CancelSignal>>>,
    mut cmd_id: watch::Receiver<Option<String>>,
) {
    let signal = cancel_requested(cancel).await;
    let id = loop {
        if let Some(id) = cmd_id.borrow_and_update().clone() {
            break id;
        }
        if cmd_id.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    if let Err(e) = client.kill_command(session_id, &id, signal.number()).await {
        tracing::warn!(session_id, cmd_id = %id, error = %e, "could not cancel a command");
    }
    tokio::time::sleep(CANCEL_GRACE).await;
    if let Err(e) = client.kill_command(session_id, &id, SIGKILL).await {
        tracing::debug!(session_id, cmd_id = %id, error = %e, "could not kill a cancelled command");
    }
    std::future::pending::<()>().await;
}

/// How the stream phase ended.
enum StreamEnd {
    /// The final record arrived.
    Exited(i32),
    /// The stream broke before the final record; recover by long-polling if the command id
    /// is known.
    Cut(String),
    /// The session stopped under the command (in-band `sandbox_stopped`).
    SandboxGone(String),
}

/// Runs `req` in `session_id`, with its live side `io` (see the module docs). `cwd` is the
/// session's working directory, as the session reports it, where a stdin upload is placed
/// (`None`: `/vercel/sandbox`, the legacy runtimes' directory).
pub async fn exec(
    client: &VercelClient,
    session_id: &str,
    req: &ExecRequest,
    opts: &ExecOptions,
    io: ExecIo,
    cwd: Option<&str>,
) -> Result<ExecOutput, ProviderError> {
    let ExecIo {
        output,
        stdin,
        mut cancel,
        env,
    } = io;
    let mut args = vec!["-c".to_string(), req.command.clone()];
    if let Some(mut rx) = stdin {
        let data = tokio::select! {
            data = read_stdin(&mut rx) => data?,
            signal = cancel_requested(&mut cancel) => {
                return Ok(ExecOutput { exit_code: signal.exit_code(), ..ExecOutput::default() });
            }
        };
        if !data.is_empty() {
            let file = stdin_file();
            let root = cwd.unwrap_or(LEGACY_SANDBOX_ROOT).trim_end_matches('/');
            let path = format!("{root}/{file}");
            client.write_files(session_id, &[(&path, &data)]).await?;
            args = vec![
                "-c".to_string(),
                STDIN_REDIRECT.to_string(),
                req.command.clone(),
                file,
            ];
        }
    }
    if let Some(signal) = cancel.as_ref().and_then(|c| *c.borrow()) {
        return Ok(ExecOutput {
            exit_code: signal.exit_code(),
            ..ExecOutput::default()
        });
    }
    let started = Instant::now();
    // Checked: a timeout too large for the clock never wraps or panics; it means "no deadline
    // this side of the far future".
    let deadline = started
        .checked_add(Duration::from_millis(req.timeout_ms))
        .unwrap_or_else(|| started + Duration::from_secs(100 * 365 * 24 * 3600));
    let cmd = RunCommand {
        command: "bash".into(),
        args,
        cwd: None,
        // The variables passed on purpose, over the sandbox's own environment.
        env: env.to_map(),
        sudo: false,
        timeout_ms: Some(
            req.timeout_ms
                .saturating_add(opts.server_timeout_grace.as_millis() as u64),
        ),
    };
    let mut out = Captured::new(opts.max_output_chars);
    let mut live = Live {
        tx: output,
        sent: [0, 0],
    };
    let mut cmd_id: Option<String> = None;
    let (id_tx, id_rx) = watch::channel(None);

    let run = tokio::time::timeout_at(deadline, async {
        // A refused run request (the session is stopped: 410) never started the command.
        let mut stream = client
            .run_command_streaming(session_id, &cmd)
            .await
            .map_err(|e| match e.kind {
                FailureKind::SandboxGone => e.before_start(),
                _ => e,
            })?;
        match consume(&mut stream, &mut out, &mut live, &mut cmd_id, &id_tx).await {
            StreamEnd::Exited(code) => Ok((code, false)),
            StreamEnd::SandboxGone(why) => Err(ProviderError::sandbox_gone(
                "run command",
                format!("the sandbox stopped while the command was running ({why})"),
            )),
            StreamEnd::Cut(why) => {
                let Some(id) = cmd_id.clone() else {
                    return Err(ProviderError::new(
                        FailureKind::Permanent,
                        "run command",
                        format!("the command stream broke before the command was identified ({why}); it may have started, so it is not retried automatically"),
                    ));
                };
                tracing::info!(session_id, cmd_id = %id, why, "command stream cut; long-polling");
                let code = long_poll(client, session_id, &id, opts).await?;
                Ok((code, true))
            }
        }
    });
    let waited = tokio::select! {
        waited = run => waited,
        () = cancel_when_asked(client, session_id, &mut cancel, id_rx) => unreachable!("it never returns"),
    };

    match waited {
        Ok(Ok((code, recovered))) => {
            if recovered {
                if let Some(id) = &cmd_id {
                    replay_logs(client, session_id, id, opts, &mut out, &mut live).await;
                }
            }
            Ok(out.into_output(code, false, started))
        }
        Ok(Err(e)) => Err(e),
        Err(_elapsed) => {
            if let Some(id) = &cmd_id {
                // Cancel the command, not the VM: the sandbox and its files stay usable.
                match client.kill_command(session_id, id, SIGTERM).await {
                    Ok(_) => {}
                    Err(e) if e.kind == FailureKind::SandboxGone => return Err(e),
                    Err(e) => {
                        tracing::warn!(session_id, cmd_id = %id, error = %e, "could not kill a timed-out command")
                    }
                }
            }
            Ok(out.into_output(TIMEOUT_EXIT_CODE, true, started))
        }
    }
}

/// Reads the `wait:true` stream until the final record or a break. (A break before the first
/// record leaves no command id to recover with; the caller reports that.)
async fn consume(
    stream: &mut NdjsonStream,
    out: &mut Captured,
    live: &mut Live,
    cmd_id: &mut Option<String>,
    id_tx: &watch::Sender<Option<String>>,
) -> StreamEnd {
    let why = loop {
        match stream.next().await {
            Ok(Some(StreamEvent::Command(c))) => {
                if cmd_id.is_none() {
                    *cmd_id = Some(c.id.clone());
                    id_tx.send_replace(Some(c.id.clone()));
                }
                if let Some(code) = c.exit_code {
                    return StreamEnd::Exited(code);
                }
            }
            Ok(Some(StreamEvent::Stdout(d))) => {
                out.stdout.push(&d);
                live.push(OutputStream::Stdout, &d).await;
            }
            Ok(Some(StreamEvent::Stderr(d))) => {
                out.stderr.push(&d);
                live.push(OutputStream::Stderr, &d).await;
            }
            Ok(Some(StreamEvent::Error { code, message })) if code == "sandbox_stopped" => {
                return StreamEnd::SandboxGone(format!("{code}: {message}"))
            }
            // `sandbox_stream_closed` and anything else: the command may still be running;
            // the long-poll finds out (and reports a stopped sandbox as gone).
            Ok(Some(StreamEvent::Error { code, message })) => {
                break format!("in-band error {code}: {message}")
            }
            Ok(None) => break "the stream ended before the exit code".to_string(),
            Err(cut) => break cut.0,
        }
    };
    StreamEnd::Cut(why)
}

/// Waits for the command to exit with `GET …?wait=true`, again and again: transport errors and
/// transient statuses are expected (the long-poll holds a connection open for as long as the
/// command runs), anything else is final. The caller bounds the whole loop by the timeout.
async fn long_poll(
    client: &VercelClient,
    session_id: &str,
    cmd_id: &str,
    opts: &ExecOptions,
) -> Result<i32, ProviderError> {
    let mut delay = Duration::from_millis(50);
    loop {
        match client.get_command(session_id, cmd_id, true).await {
            Ok(c) => match c.exit_code {
                Some(code) => return Ok(code),
                // An early answer without an exit code: ask again straight away.
                None => delay = Duration::from_millis(50),
            },
            Err(e) => match e.kind {
                FailureKind::Transient { retry_after_ms } => {
                    let wait = retry_after_ms
                        .map(Duration::from_millis)
                        .unwrap_or(delay)
                        .min(opts.max_poll_delay);
                    tracing::debug!(session_id, cmd_id, error = %e, "long-poll failed; again");
                    tokio::time::sleep(wait).await;
                    delay = (delay * 2).min(opts.max_poll_delay);
                }
                _ => return Err(e),
            },
        }
    }
}

/// Replaces the captured output with the full replay from `/logs`. The replay starts from the
/// beginning, so it is used only when read to its end; otherwise what the stream delivered (a
/// prefix of the same output) is kept. The live output gets the part of the replay beyond what
/// it was already sent.
async fn replay_logs(
    client: &VercelClient,
    session_id: &str,
    cmd_id: &str,
    opts: &ExecOptions,
    out: &mut Captured,
    live: &mut Live,
) {
    for attempt in 1..=3 {
        let fetched = tokio::time::timeout(opts.logs_timeout, async {
            let mut stream = client.command_logs(session_id, cmd_id).await?;
            let mut fresh = Captured::new(opts.max_output_chars);
            let mut at = [0usize; 2];
            loop {
                match stream.next().await {
                    Ok(Some(StreamEvent::Stdout(d))) => {
                        fresh.stdout.push(&d);
                        live.forward(OutputStream::Stdout, at[0], &d).await;
                        at[0] += d.len();
                    }
                    Ok(Some(StreamEvent::Stderr(d))) => {
                        fresh.stderr.push(&d);
                        live.forward(OutputStream::Stderr, at[1], &d).await;
                        at[1] += d.len();
                    }
                    Ok(Some(StreamEvent::Command(_))) => {}
                    Ok(Some(StreamEvent::Error { code, message })) => {
                        return Err(ProviderError::transient(
                            "command logs",
                            format!("in-band error {code}: {message}"),
                            None,
                        ))
                    }
                    Ok(None) => return Ok(fresh),
                    Err(cut) => return Err(ProviderError::transient("command logs", cut.0, None)),
                }
            }
        })
        .await;
        match fetched {
            Ok(Ok(fresh)) => {
                *out = fresh;
                return;
            }
            Ok(Err(e)) if !e.is_transient() => {
                tracing::warn!(session_id, cmd_id, error = %e, "cannot read command logs; keeping the streamed prefix");
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(session_id, cmd_id, attempt, error = %e, "command logs failed")
            }
            Err(_) => tracing::debug!(session_id, cmd_id, attempt, "command logs timed out"),
        }
    }
    tracing::warn!(
        session_id,
        cmd_id,
        "cannot read command logs; keeping the streamed prefix"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Chunked accumulation gives exactly what `bound_output` gives for the whole text.
        #[test]
        fn bounded_text_matches_bound_output(
            chunks in proptest::collection::vec("[a-zé€\n]{0,40}", 0..40),
            max in 1usize..60,
        ) {
            let mut acc = BoundedText::new(max);
            for c in &chunks {
                acc.push(c);
            }
            let whole: String = chunks.concat();
            prop_assert_eq!(acc.finish(), bound_output(&whole, max));
        }
    }
}
