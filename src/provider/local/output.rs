//! Output capture: each of a command's pipes is drained on its own task into a bounded head and
//! tail, so a command printing gigabytes costs constant memory and the text kept is exactly what
//! [`bound_output`] would make of the whole stream. Each chunk read is also forwarded, as it is,
//! to the command's live output (when it has one) before the next read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use super::lock;
use crate::provider::live::{bound_bytes, OutputChunk, OutputStream, Utf8Check};
use crate::provider::{bound_output, MAX_OUTPUT_CHARS};

/// How long output is still collected after a command's process ended. A background child that
/// inherited stdout keeps the pipe open; its later output is not the command's.
const OUTPUT_GRACE: Duration = Duration::from_millis(250);

/// How long a chunk may wait for a live reader that takes nothing once the command ended: then
/// the live output is given up (the capture is whole), so a stuck reader cannot hold the
/// command's result — and its task — forever.
const LIVE_STALL: Duration = Duration::from_secs(10);

/// Characters kept from the start of a stream (as `bound_output` keeps them).
const HEAD_CHARS: usize = MAX_OUTPUT_CHARS * 2 / 5;
/// Characters kept from the end of a stream.
const TAIL_CHARS: usize = MAX_OUTPUT_CHARS - HEAD_CHARS;
/// Bytes that always hold at least `HEAD_CHARS` whole characters (UTF-8 uses at most 4 bytes
/// per character; the slack covers a character cut at the boundary).
const HEAD_BYTES: usize = HEAD_CHARS * 4 + 4;
/// Bytes that always hold at least `TAIL_CHARS` whole characters.
const TAIL_BYTES: usize = TAIL_CHARS * 4 + 4;

/// A stream's first and last bytes plus counts, in bounded memory however much is written.
#[derive(Debug, Default)]
struct Capture {
    head: Vec<u8>,
    tail: Vec<u8>,
    total_bytes: u64,
    /// Characters seen, counted as bytes that do not continue a UTF-8 sequence.
    total_chars: u64,
    /// The command's result was taken: later bytes (a background job's) are drained unseen.
    detached: bool,
    utf8: Utf8Check,
}

/// One stream's capture, as the command's result carries it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Captured {
    /// The bounded text (lossy when the bytes are not UTF-8).
    pub(super) text: String,
    /// The bounded bytes, when they are not UTF-8.
    pub(super) bytes: Option<Vec<u8>>,
    /// Whether the middle was dropped.
    pub(super) truncated: bool,
}

impl Capture {
    fn push(&mut self, data: &[u8]) {
        if self.detached {
            return;
        }
        self.total_bytes += data.len() as u64;
        self.utf8.push(data);
        self.total_chars += data.iter().filter(|b| (**b & 0xC0) != 0x80).count() as u64;
        let room = HEAD_BYTES - self.head.len();
        let (to_head, rest) = data.split_at(room.min(data.len()));
        self.head.extend_from_slice(to_head);
        self.tail.extend_from_slice(rest);
        // Trim in batches so the cost stays linear in the output size.
        if self.tail.len() > 2 * TAIL_BYTES {
            self.tail.drain(..self.tail.len() - TAIL_BYTES);
        }
    }

    /// The capture: its text bounded exactly as [`bound_output`] bounds it, and, when the
    /// stream is not UTF-8, its bytes bounded by [`bound_bytes`].
    fn finish(mut self) -> Captured {
        if self.tail.len() > TAIL_BYTES {
            self.tail.drain(..self.tail.len() - TAIL_BYTES);
        }
        let max = MAX_OUTPUT_CHARS as u64;
        let kept = (self.head.len() + self.tail.len()) as u64;
        let bytes = (!self.utf8.is_utf8()).then(|| {
            if self.total_bytes == kept {
                let all = [self.head.as_slice(), self.tail.as_slice()].concat();
                if self.total_bytes <= max {
                    return all;
                }
                return bound_bytes(&all, &all, self.total_bytes, MAX_OUTPUT_CHARS);
            }
            bound_bytes(&self.head, &self.tail, self.total_bytes, MAX_OUTPUT_CHARS)
        });
        let truncated = if bytes.is_some() {
            self.total_bytes > max
        } else {
            self.total_chars > max
        };
        Captured {
            text: self.text(kept),
            bytes,
            truncated,
        }
    }

    fn text(self, kept: u64) -> String {
        if self.total_bytes == kept {
            let mut all = self.head;
            all.extend_from_slice(&self.tail);
            return bound_output(&String::from_utf8_lossy(&all), MAX_OUTPUT_CHARS);
        }
        // The middle was never kept. The text is what `bound_output` would make of the whole
        // stream (the same format), built from the parts kept.
        let head: String = String::from_utf8_lossy(&self.head)
            .chars()
            .take(HEAD_CHARS)
            .collect();
        let start = self
            .tail
            .iter()
            .position(|b| (*b & 0xC0) != 0x80)
            .unwrap_or(self.tail.len());
        let tail_text = String::from_utf8_lossy(&self.tail[start..]).into_owned();
        let tail_len = tail_text.chars().count();
        let tail: String = tail_text
            .chars()
            .skip(tail_len.saturating_sub(TAIL_CHARS))
            .collect();
        let total = self.total_chars;
        let omitted = total.saturating_sub((HEAD_CHARS + TAIL_CHARS) as u64);
        format!(
            "{head}\n[taskbox: output truncated, {omitted} of {total} characters omitted]\n{tail}"
        )
    }
}

/// Reads one of the command's pipes into a [`Capture`] on its own task, so stdout and stderr
/// drain concurrently and neither can fill up and block the command.
pub(super) struct Pump {
    capture: Arc<Mutex<Capture>>,
    /// Set while a chunk waits for the live output's reader: the pipe is not idle then.
    forwarding: Arc<AtomicBool>,
    /// Chunks forwarded so far (to tell a slow reader from a stuck one).
    forwarded: Arc<AtomicU64>,
    /// Gives up the live output (a chunk waiting for the reader is dropped).
    give_up: Arc<tokio::sync::Notify>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// The most a pump reads from its pipe at once.
const PUMP_READ: usize = 64 * 1024;

impl Pump {
    /// Drains `pipe`, forwarding each chunk to `live` (until its reader goes away).
    pub(super) fn start<R: AsyncRead + Unpin + Send + 'static>(
        pipe: Option<R>,
        stream: OutputStream,
        live: Option<mpsc::Sender<OutputChunk>>,
    ) -> Pump {
        let capture = Arc::new(Mutex::new(Capture::default()));
        let forwarding = Arc::new(AtomicBool::new(false));
        let forwarded = Arc::new(AtomicU64::new(0));
        let give_up = Arc::new(tokio::sync::Notify::new());
        let task = pipe.map(|mut pipe| {
            let capture = capture.clone();
            let forwarding = forwarding.clone();
            let forwarded = forwarded.clone();
            let give_up = give_up.clone();
            let mut live = live;
            tokio::spawn(async move {
                // Read into the spare capacity (`read_buf`), not a zeroed buffer: two pumps a
                // command, and a `vec![0; 64 KiB]` each wrote and faulted in 128 KiB on the
                // command's path for output that is usually a line.
                let mut buf = Vec::with_capacity(PUMP_READ);
                loop {
                    buf.clear();
                    match pipe.read_buf(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let detached = {
                                let mut capture = lock(&capture);
                                capture.push(&buf[..n]);
                                capture.detached
                            };
                            if detached {
                                live = None;
                            }
                            if let Some(tx) = &live {
                                forwarding.store(true, Ordering::SeqCst);
                                let chunk = OutputChunk {
                                    stream,
                                    data: buf[..n].to_vec(),
                                };
                                tokio::select! {
                                    sent = tx.send(chunk) => match sent {
                                        Ok(()) => {
                                            forwarded.fetch_add(1, Ordering::SeqCst);
                                        }
                                        Err(_) => live = None,
                                    },
                                    () = give_up.notified() => live = None,
                                }
                                forwarding.store(false, Ordering::SeqCst);
                            }
                        }
                    }
                }
            })
        });
        Pump {
            capture,
            forwarding,
            forwarded,
            give_up,
            task,
        }
    }

    /// Waits for the pipe to close and returns the bounded capture. A background job that
    /// inherited the pipe keeps it open: once the pipe was idle for [`OUTPUT_GRACE`] (a chunk
    /// still on its way to a slow live reader does not count as idle, one stuck for
    /// [`LIVE_STALL`] gives the live output up) the capture is taken as it is, and the task goes
    /// on draining the pipe unseen (closing it would kill the job with SIGPIPE on its next
    /// write) until the job exits or the sandbox is stopped.
    pub(super) async fn finish(mut self) -> Captured {
        if let Some(mut task) = self.task.take() {
            let mut seen = self.forwarded.load(Ordering::SeqCst);
            let mut stalled = Duration::ZERO;
            loop {
                match tokio::time::timeout(OUTPUT_GRACE, &mut task).await {
                    Ok(_) => break,
                    Err(_) if self.forwarding.load(Ordering::SeqCst) => {
                        let now = self.forwarded.load(Ordering::SeqCst);
                        stalled = if now == seen {
                            stalled + OUTPUT_GRACE
                        } else {
                            Duration::ZERO
                        };
                        seen = now;
                        if stalled >= LIVE_STALL {
                            tracing::warn!(
                                "the live output's reader took nothing for {LIVE_STALL:?}; the rest of the output is only captured"
                            );
                            self.give_up.notify_one();
                            break;
                        }
                    }
                    Err(_) => {
                        tracing::debug!(
                            "a background job holds the command's output open; detached"
                        );
                        break;
                    }
                }
            }
        }
        let mut capture = lock(&self.capture);
        let taken = std::mem::take(&mut *capture);
        capture.detached = true;
        drop(capture);
        taken.finish()
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        // Still set only when the exec was cancelled before `finish`: its group is being killed.
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn capture_matches_bound_output_whether_or_not_it_drops_the_middle() {
        for text in [
            "short".to_string(),
            "é".repeat(60_000),
            "0123456789\n".repeat(100_000),
            "ab€𝄞".repeat(90_000),
        ] {
            let mut capture = Capture::default();
            for chunk in text.as_bytes().chunks(7_777) {
                capture.push(chunk);
            }
            assert_eq!(
                capture.finish().text,
                bound_output(&text, MAX_OUTPUT_CHARS),
                "input of {} bytes",
                text.len()
            );
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_are_kept_as_they_are_and_bounded_by_bytes() {
        let small: Vec<u8> = (0..=255u8).cycle().take(3_000).collect();
        let mut capture = Capture::default();
        for chunk in small.chunks(333) {
            capture.push(chunk);
        }
        let c = capture.finish();
        assert_eq!(c.bytes.as_deref(), Some(small.as_slice()));
        assert!(!c.truncated);

        let big: Vec<u8> = (0..=255u8).cycle().take(1_000_000).collect();
        let mut capture = Capture::default();
        for chunk in big.chunks(65_536) {
            capture.push(chunk);
        }
        let c = capture.finish();
        let bytes = c.bytes.expect("not UTF-8");
        assert!(c.truncated);
        let head = MAX_OUTPUT_CHARS * 2 / 5;
        let tail = MAX_OUTPUT_CHARS - head;
        assert_eq!(&bytes[..head], &big[..head]);
        assert_eq!(&bytes[bytes.len() - tail..], &big[big.len() - tail..]);
    }

    #[test]
    fn capture_memory_stays_bounded() {
        let mut capture = Capture::default();
        let chunk = vec![b'y'; 65_536];
        for _ in 0..200 {
            capture.push(&chunk);
            assert!(capture.head.len() + capture.tail.len() <= HEAD_BYTES + 2 * TAIL_BYTES);
        }
    }
}
