//! The live side of a command, passed to [`SandboxProvider::exec_live`](super::SandboxProvider::exec_live)
//! beside the request: its output as it is produced, its stdin, and a cancel. None of it is
//! part of the request the core decided on, so none of it is journaled; the bounded capture in
//! [`ExecOutput`](super::ExecOutput) stays the command's result.

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

/// Output chunks buffered between a command and a slow reader before the command's writes wait
/// (as they would on a full pipe).
pub const OUTPUT_CHANNEL_CHUNKS: usize = 64;

/// Which of a command's output streams a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    /// Its stdout.
    Stdout,
    /// Its stderr.
    Stderr,
}

/// A run of a command's output, exactly the bytes it wrote (not lines, not necessarily UTF-8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChunk {
    /// Which stream.
    pub stream: OutputStream,
    /// The bytes.
    pub data: Vec<u8>,
}

/// The signal a cancel sends to a running command (what the caller received, as a shell would
/// pass on Ctrl-C, `kill` or a closed terminal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CancelSignal {
    /// SIGINT (Ctrl-C).
    #[serde(rename = "INT")]
    Interrupt,
    /// SIGTERM.
    #[serde(rename = "TERM")]
    Terminate,
    /// SIGHUP (the terminal went away).
    #[serde(rename = "HUP")]
    Hangup,
}

impl CancelSignal {
    /// The signal's number.
    pub fn number(self) -> i32 {
        match self {
            CancelSignal::Interrupt => 2,
            CancelSignal::Terminate => 15,
            CancelSignal::Hangup => 1,
        }
    }

    /// How a shell reports a command this signal ended: 128 + its number (130, 143, 129).
    pub fn exit_code(self) -> i32 {
        128 + self.number()
    }

    /// Its short name (`INT`, `TERM`, `HUP`), as the API spells it.
    pub fn name(self) -> &'static str {
        match self {
            CancelSignal::Interrupt => "INT",
            CancelSignal::Terminate => "TERM",
            CancelSignal::Hangup => "HUP",
        }
    }
}

/// The caller's end of a cancel: [`Canceller::cancel`] signals the command (once; later calls
/// are ignored). Dropping it cancels nothing.
#[derive(Debug, Clone)]
pub struct Canceller(std::sync::Arc<watch::Sender<Option<CancelSignal>>>);

impl Canceller {
    /// A canceller and the receiver to put in [`ExecIo::cancel`].
    pub fn new() -> (Canceller, watch::Receiver<Option<CancelSignal>>) {
        let (tx, rx) = watch::channel(None);
        (Canceller(std::sync::Arc::new(tx)), rx)
    }

    /// Cancels the command with `signal` (the first cancel wins).
    pub fn cancel(&self, signal: CancelSignal) {
        self.0.send_if_modified(|s| {
            if s.is_none() {
                *s = Some(signal);
                true
            } else {
                false
            }
        });
    }
}

/// The live side of one command. [`ExecIo::default`] has none: output is only captured, stdin
/// is empty, nothing cancels.
#[derive(Debug, Default)]
pub struct ExecIo {
    /// Where output goes as it is produced, in order. A send that fails (the reader went away)
    /// stops the forwarding, never the command.
    pub output: Option<mpsc::Sender<OutputChunk>>,
    /// The command's stdin; its end (all senders dropped) is end of file. `None`: no stdin.
    pub stdin: Option<mpsc::Receiver<Vec<u8>>>,
    /// Set once to cancel the command (never the sandbox).
    pub cancel: Option<watch::Receiver<Option<CancelSignal>>>,
    /// The variables the caller passes to the command on purpose (`run --env`, the API's and
    /// MCP's `env`, with `terminal.env` under them), over the command's clean base. Secrets:
    /// they travel here, on the live side, which nothing journals or serializes.
    pub env: crate::config::CommandEnv,
}

impl ExecIo {
    /// The cancel already asked for, if any.
    pub fn cancelled(&self) -> Option<CancelSignal> {
        self.cancel.as_ref().and_then(|c| *c.borrow())
    }

    /// The live side of a platform that has none: forwards `out`'s captured output to
    /// [`ExecIo::output`] once the command has run (stdin stays unread, a cancel unseen).
    pub async fn forward_capture(self, out: &super::ExecOutput) {
        let Some(tx) = self.output else { return };
        for (stream, text) in [
            (OutputStream::Stdout, &out.stdout),
            (OutputStream::Stderr, &out.stderr),
        ] {
            if !text.is_empty() {
                let data = text.as_bytes().to_vec();
                let _ = tx.send(OutputChunk { stream, data }).await;
            }
        }
    }
}

/// Waits until `cancel` asks for a signal; never returns when there is no cancel or its sender
/// went away without cancelling.
pub async fn cancel_requested(
    cancel: &mut Option<watch::Receiver<Option<CancelSignal>>>,
) -> CancelSignal {
    if let Some(rx) = cancel {
        loop {
            if let Some(signal) = *rx.borrow_and_update() {
                return signal;
            }
            if rx.changed().await.is_err() {
                break;
            }
        }
    }
    std::future::pending().await
}

/// Tells, chunk by chunk, whether a byte stream is valid UTF-8 (a character may be split
/// between chunks).
#[derive(Debug, Clone, Default)]
pub struct Utf8Check {
    pending: Vec<u8>,
    invalid: bool,
}

impl Utf8Check {
    /// Takes the next chunk.
    pub fn push(&mut self, data: &[u8]) {
        if self.invalid || data.is_empty() {
            return;
        }
        let joined;
        let bytes = if self.pending.is_empty() {
            data
        } else {
            joined = [self.pending.as_slice(), data].concat();
            &joined
        };
        match std::str::from_utf8(bytes) {
            Ok(_) => self.pending.clear(),
            // Cut in the middle of a character: keep its start for the next chunk.
            Err(e) if e.error_len().is_none() => {
                self.pending = bytes[e.valid_up_to()..].to_vec();
            }
            Err(_) => self.invalid = true,
        }
    }

    /// Whether everything pushed so far was UTF-8, with no character left unfinished.
    pub fn is_utf8(&self) -> bool {
        !self.invalid && self.pending.is_empty()
    }
}

/// Bounds a byte stream that is not UTF-8 the way [`bound_output`](super::bound_output) bounds
/// text, counting bytes: the first 40 % and the last 60 % of `max` bytes, with a line between
/// saying how many were cut. `head` and `tail` are the stream's first and last bytes (at least
/// that many each), `total` its length.
pub fn bound_bytes(head: &[u8], tail: &[u8], total: u64, max: usize) -> Vec<u8> {
    let head_n = max * 2 / 5;
    let tail_n = max - head_n;
    let mut out = head[..head_n.min(head.len())].to_vec();
    out.extend_from_slice(
        format!(
            "\n[taskbox: output truncated, {} of {total} bytes omitted]\n",
            total.saturating_sub((head_n + tail_n) as u64)
        )
        .as_bytes(),
    );
    out.extend_from_slice(&tail[tail.len().saturating_sub(tail_n)..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_between_chunks_is_still_utf8() {
        let text = "a€𝄞é".as_bytes();
        for cut in 0..text.len() {
            let mut check = Utf8Check::default();
            check.push(&text[..cut]);
            check.push(&text[cut..]);
            assert!(check.is_utf8(), "cut at {cut}");
        }
        let mut check = Utf8Check::default();
        check.push(b"ok\xff");
        assert!(!check.is_utf8());
        let mut unfinished = Utf8Check::default();
        unfinished.push(&"€".as_bytes()[..2]);
        assert!(!unfinished.is_utf8());
    }

    #[test]
    fn a_cancel_is_seen_once_and_the_first_wins() {
        let (c, rx) = Canceller::new();
        c.cancel(CancelSignal::Terminate);
        c.cancel(CancelSignal::Interrupt);
        assert_eq!(*rx.borrow(), Some(CancelSignal::Terminate));
        assert_eq!(CancelSignal::Interrupt.exit_code(), 130);
        assert_eq!(CancelSignal::Terminate.exit_code(), 143);
        assert_eq!(CancelSignal::Hangup.exit_code(), 129);
    }
}
