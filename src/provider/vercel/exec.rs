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

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::client::{NdjsonStream, RunCommand, StreamEvent, VercelClient};
use crate::core::FailureKind;
use crate::provider::{bound_output, ExecOutput, ExecRequest, ProviderError};

/// The exit code reported when taskbox's timeout killed the command (as `timeout(1)` does).
pub const TIMEOUT_EXIT_CODE: i32 = 124;

/// SIGTERM: what a timed-out command receives.
const SIGTERM: i32 = 15;

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

/// Runs `req` in `session_id`.
pub async fn exec(
    client: &VercelClient,
    session_id: &str,
    req: &ExecRequest,
    opts: &ExecOptions,
) -> Result<ExecOutput, ProviderError> {
    let started = Instant::now();
    // Checked: a timeout too large for the clock never wraps or panics; it means "no deadline
    // this side of the far future".
    let deadline = started
        .checked_add(Duration::from_millis(req.timeout_ms))
        .unwrap_or_else(|| started + Duration::from_secs(100 * 365 * 24 * 3600));
    let cmd = RunCommand {
        command: "bash".into(),
        args: vec!["-c".into(), req.command.clone()],
        cwd: None,
        env: BTreeMap::new(),
        sudo: false,
        timeout_ms: Some(
            req.timeout_ms
                .saturating_add(opts.server_timeout_grace.as_millis() as u64),
        ),
    };
    let mut out = Captured::new(opts.max_output_chars);
    let mut cmd_id: Option<String> = None;

    let waited = tokio::time::timeout_at(deadline, async {
        // A refused run request (the session is stopped: 410) never started the command.
        let mut stream = client
            .run_command_streaming(session_id, &cmd)
            .await
            .map_err(|e| match e.kind {
                FailureKind::SandboxGone => e.before_start(),
                _ => e,
            })?;
        match consume(&mut stream, &mut out, &mut cmd_id).await {
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
    })
    .await;

    match waited {
        Ok(Ok((code, recovered))) => {
            if recovered {
                if let Some(id) = &cmd_id {
                    replay_logs(client, session_id, id, opts, &mut out).await;
                }
            }
            Ok(ExecOutput {
                exit_code: code,
                timed_out: false,
                stdout: out.stdout.finish(),
                stderr: out.stderr.finish(),
                duration_ms: started.elapsed().as_millis() as u64,
            })
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
            Ok(ExecOutput {
                exit_code: TIMEOUT_EXIT_CODE,
                timed_out: true,
                stdout: out.stdout.finish(),
                stderr: out.stderr.finish(),
                duration_ms: started.elapsed().as_millis() as u64,
            })
        }
    }
}

/// Reads the `wait:true` stream until the final record or a break. (A break before the first
/// record leaves no command id to recover with; the caller reports that.)
async fn consume(
    stream: &mut NdjsonStream,
    out: &mut Captured,
    cmd_id: &mut Option<String>,
) -> StreamEnd {
    let why = loop {
        match stream.next().await {
            Ok(Some(StreamEvent::Command(c))) => {
                if cmd_id.is_none() {
                    *cmd_id = Some(c.id.clone());
                }
                if let Some(code) = c.exit_code {
                    return StreamEnd::Exited(code);
                }
            }
            Ok(Some(StreamEvent::Stdout(d))) => out.stdout.push(&d),
            Ok(Some(StreamEvent::Stderr(d))) => out.stderr.push(&d),
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
/// prefix of the same output) is kept.
async fn replay_logs(
    client: &VercelClient,
    session_id: &str,
    cmd_id: &str,
    opts: &ExecOptions,
    out: &mut Captured,
) {
    for attempt in 1..=3 {
        let fetched = tokio::time::timeout(opts.logs_timeout, async {
            let mut stream = client.command_logs(session_id, cmd_id).await?;
            let mut fresh = Captured::new(opts.max_output_chars);
            loop {
                match stream.next().await {
                    Ok(Some(StreamEvent::Stdout(d))) => fresh.stdout.push(&d),
                    Ok(Some(StreamEvent::Stderr(d))) => fresh.stderr.push(&d),
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
