//! `taskbox run`'s live side in the terminal: the command's output printed as it arrives (the
//! same bytes, on our stdout and stderr), our stdin forwarded to the command, and SIGINT,
//! SIGTERM and SIGHUP turned into a cancel of the command (never of its sandbox).

use std::future::Future;
use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;

use taskbox::provider::live::OUTPUT_CHANNEL_CHUNKS;
use taskbox::provider::{CancelSignal, Canceller, OutputChunk, OutputStream};

use super::output::Failure;

/// The signals that cancel a run, caught for as long as it runs.
pub struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    /// Catches SIGINT, SIGTERM and SIGHUP from now on.
    pub fn catch() -> Result<Signals, Failure> {
        let catch =
            |kind| signal(kind).map_err(|e| Failure::new(format!("cannot catch signals: {e}")));
        Ok(Signals {
            int: catch(SignalKind::interrupt())?,
            term: catch(SignalKind::terminate())?,
            hup: catch(SignalKind::hangup())?,
        })
    }

    async fn recv(&mut self) -> CancelSignal {
        tokio::select! {
            _ = self.int.recv() => CancelSignal::Interrupt,
            _ = self.term.recv() => CancelSignal::Terminate,
            _ = self.hup.recv() => CancelSignal::Hangup,
        }
    }
}

/// The command's output channel: the sender for the run, the receiver for [`drive`].
pub fn output_channel() -> (mpsc::Sender<OutputChunk>, mpsc::Receiver<OutputChunk>) {
    mpsc::channel(OUTPUT_CHANNEL_CHUNKS)
}

/// Our stdin as the command's, read on a thread of its own (a blocking read must not hold up
/// the runtime, nor its shutdown). `None` when there is none to forward: a terminal (an
/// interactive user is not typing input for a command in a sandbox, and nothing should wait for
/// them), `/dev/null`, or a closed stdin — the command's stdin is then empty from the start,
/// and nothing is uploaded.
pub fn stdin_source() -> Option<mpsc::Receiver<Vec<u8>>> {
    if !stdin_waits() {
        return None;
    }
    let (tx, rx) = mpsc::channel(16);
    std::thread::Builder::new()
        .name("taskbox-stdin".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            let mut stdin = std::io::stdin().lock();
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if tx.blocking_send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // A closed or unreadable stdin is an empty one.
                    Err(_) => break,
                }
            }
        })
        .ok()?;
    Some(rx)
}

/// Whether our stdin is one to forward: not a terminal, `/dev/null` or closed.
pub fn stdin_waits() -> bool {
    !(std::io::stdin().is_terminal() || stdin_is_empty())
}

/// Whether our stdin is `/dev/null` or closed.
fn stdin_is_empty() -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(ours) = std::fs::metadata("/dev/stdin") else {
        return true;
    };
    let null = std::fs::metadata("/dev/null");
    ours.file_type().is_char_device() && null.is_ok_and(|n| n.rdev() == ours.rdev())
}

/// Prints output chunks exactly as they came, flushing each; a closed stdout (`| head`) stops
/// stdout only.
#[derive(Default)]
pub struct Printer {
    stdout_closed: bool,
}

impl Printer {
    pub fn print(&mut self, chunk: &OutputChunk) {
        match chunk.stream {
            OutputStream::Stdout if !self.stdout_closed => {
                let mut out = std::io::stdout().lock();
                if out
                    .write_all(&chunk.data)
                    .and_then(|()| out.flush())
                    .is_err()
                {
                    self.stdout_closed = true;
                }
            }
            OutputStream::Stdout => {}
            OutputStream::Stderr => {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(&chunk.data).and_then(|()| err.flush());
            }
        }
    }
}

/// How long `taskbox run` waits for a cancelled command's result before it exits anyway: the
/// cancel's own escalation (SIGKILL after 3 s) has ended the command by then, and a run that
/// is still waiting (for another process's lock, for a sandbox) has nothing running to report.
pub const CANCEL_WAIT: Duration = Duration::from_secs(6);

/// Runs `run` to its end, printing `output` as it arrives and cancelling through `canceller`
/// on the first SIGINT, SIGTERM or SIGHUP. Returns the run's outcome — `None` when it did not
/// come within [`CANCEL_WAIT`] of the cancel, or a second signal came first — and the signal
/// that cancelled it, if one did.
// The bound on waiting for a cancelled run is the CLI's own (real time, nothing to replay).
#[allow(clippy::disallowed_methods)]
pub async fn drive<T>(
    run: impl Future<Output = Result<T, Failure>>,
    mut output: Option<mpsc::Receiver<OutputChunk>>,
    canceller: &Canceller,
    signals: &mut Signals,
) -> (Option<Result<T, Failure>>, Option<CancelSignal>) {
    let mut printer = Printer::default();
    let mut cancelled = None;
    let give_up = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(run, give_up);
    let res = loop {
        tokio::select! {
            res = &mut run => break Some(res),
            chunk = recv(&mut output) => match chunk {
                Some(chunk) => printer.print(&chunk),
                None => output = None,
            },
            signal = signals.recv() => {
                if cancelled.is_some() {
                    break None;
                }
                cancelled = Some(signal);
                canceller.cancel(signal);
                give_up.as_mut().reset(tokio::time::Instant::now() + CANCEL_WAIT);
            }
            () = &mut give_up, if cancelled.is_some() => break None,
        }
    };
    // Every chunk was sent before the result.
    if let Some(rx) = &mut output {
        while let Ok(chunk) = rx.try_recv() {
            printer.print(&chunk);
        }
    }
    (res, cancelled)
}

async fn recv(output: &mut Option<mpsc::Receiver<OutputChunk>>) -> Option<OutputChunk> {
    match output {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
