//! Output capture: each of a command's pipes is drained on its own task into a bounded head and
//! tail, so a command printing gigabytes costs constant memory and the text kept is exactly what
//! [`bound_output`] would make of the whole stream.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use super::lock;
use crate::provider::{bound_output, MAX_OUTPUT_CHARS};

/// How long output is still collected after a command's process ended. A background child that
/// inherited stdout keeps the pipe open; its later output is not the command's.
const OUTPUT_GRACE: Duration = Duration::from_millis(250);

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
}

impl Capture {
    fn push(&mut self, data: &[u8]) {
        if self.detached {
            return;
        }
        self.total_bytes += data.len() as u64;
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

    /// The captured text, bounded exactly as [`bound_output`] bounds it.
    fn finish(mut self) -> String {
        if self.tail.len() > TAIL_BYTES {
            self.tail.drain(..self.tail.len() - TAIL_BYTES);
        }
        let kept = (self.head.len() + self.tail.len()) as u64;
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
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Pump {
    pub(super) fn start<R: AsyncRead + Unpin + Send + 'static>(pipe: Option<R>) -> Pump {
        let capture = Arc::new(Mutex::new(Capture::default()));
        let task = pipe.map(|mut pipe| {
            let capture = capture.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match pipe.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => lock(&capture).push(&buf[..n]),
                    }
                }
            })
        });
        Pump { capture, task }
    }

    /// Waits for the pipe to close and returns the bounded text. A background job that
    /// inherited the pipe keeps it open: after [`OUTPUT_GRACE`] the text is taken as it is, and
    /// the task goes on draining the pipe unseen (closing it would kill the job with SIGPIPE on
    /// its next write) until the job exits or the sandbox is stopped.
    pub(super) async fn finish(mut self) -> String {
        if let Some(mut task) = self.task.take() {
            if tokio::time::timeout(OUTPUT_GRACE, &mut task).await.is_err() {
                tracing::debug!("a background job holds the command's output open; detached");
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
                capture.finish(),
                bound_output(&text, MAX_OUTPUT_CHARS),
                "input of {} bytes",
                text.len()
            );
        }
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
