//! The fast path of `taskbox run`: a plain `taskbox run --task T [--timeout N] [--] CMD…`
//! through a running server, served before anything else in `main` — no argument parser, no
//! logging, no async runtime — by [`BlockingClient`] on a `std` Unix socket.
//!
//! A warm command through a server is a short process whose own start is most of what it adds
//! over the command (ARCHITECTURE.md, "The CLI's fast path"). This path recognises only the
//! common command line, and does exactly what the full path does for it: the same request, the
//! output printed live as the same bytes, stdin forwarded, SIGINT/SIGTERM/SIGHUP cancelling the
//! command (exit 130/143/129, giving up after [`CANCEL_WAIT`] or a second signal), the same
//! notes, failures and exit codes. Anything else — another flag (`--json`, `-v`, `--help`), a
//! command line clap would refuse, `RUST_LOG`, `terminal.server = never`, a config that does not
//! load, a task id or timeout that is refused, no server answering (the full path starts one
//! under `auto`), another user's socket — returns `None` before a byte is sent, and `main` goes
//! on to the full path, which then behaves as it always did.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Instant;

use taskbox::client::blocking::{BlockingClient, Next};
use taskbox::client::wire::{RunEvent, RunRequest};
use taskbox::client::ClientError;
use taskbox::config::{Config, ServerMode};
use taskbox::engine::Paths;
use taskbox::provider::CancelSignal;
use taskbox::TaskId;

use super::output::{fail, Failure};
use super::run_io::{self, finish_run, Printer, CANCEL_WAIT};

/// A `taskbox run` command line this path serves.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct PlainRun {
    pub(super) task: String,
    pub(super) timeout: Option<u64>,
    pub(super) command: Vec<String>,
}

/// `taskbox run` through the data dir's server when the command line is a plain one and a
/// server answers; `None` (nothing sent) sends the caller to the full path.
pub fn run() -> Option<ExitCode> {
    let args: Vec<OsString> = std::env::args_os().collect();
    let plain = parse(&args)?;
    // A server on another machine: the full path's client speaks TCP.
    if std::env::var_os("TASKBOX_SERVER_URL").is_some_and(|v| !v.is_empty()) {
        return None;
    }
    // Logging asked for: the full path sets it up.
    if std::env::var_os("RUST_LOG").is_some_and(|v| !v.is_empty()) {
        return None;
    }
    let task = TaskId::new(&plain.task).ok()?;
    if let Some(t) = plain.timeout {
        Config::check_flag("terminal.timeout", "--timeout", t).ok()?;
    }
    let paths = Paths::from_env(|k| std::env::var(k).ok());
    let config = Config::load(&paths.config_file).ok()?;
    match config.server_mode(|k| std::env::var(k).ok()).ok()? {
        ServerMode::Never => return None,
        ServerMode::Auto | ServerMode::Always => {}
    }
    let client = BlockingClient::new(&paths.data_dir);
    let stream = client.connect().ok()?;
    let signals = WakeOnSignals::install().ok()?;
    // From here on the request is sent: whatever happens is this run's outcome.
    let request = RunRequest {
        command: run_io::shell_join(&plain.command),
        timeout_secs: plain.timeout,
        stdin: run_io::stdin_waits(),
        env: Default::default(),
    };
    Some(drive(&client, stream, &task, request, &signals, &paths))
}

/// Recognises `run` with `--task T` / `-t T` / `--task=T`, `--timeout N` / `--timeout=N`, an
/// optional `--`, and at least one command word; `None` for anything else (the full path's
/// parser then answers it, usage errors included).
pub(super) fn parse(args: &[OsString]) -> Option<PlainRun> {
    let mut args = args.iter().skip(1).map(|a| a.to_str());
    if args.next()?? != "run" {
        return None;
    }
    let (mut task, mut timeout, mut command) = (None, None, Vec::new());
    let number = |v: &str| {
        (!v.is_empty() && v.len() <= 19 && v.bytes().all(|b| b.is_ascii_digit()))
            .then(|| v.parse::<u64>().ok())
            .flatten()
    };
    while let Some(arg) = args.next() {
        let arg = arg?;
        let (name, inline) = match arg.split_once('=') {
            Some((name, v)) if name.starts_with("--") => (name, Some(v)),
            _ => (arg, None),
        };
        match name {
            "--" if inline.is_none() => {
                for word in args.by_ref() {
                    command.push(word?.to_string());
                }
                break;
            }
            "--task" | "-t" if task.is_none() => {
                let v = match inline {
                    Some(v) => v,
                    None => option_value(args.next())?,
                };
                task = Some(v.to_string());
            }
            "--timeout" if timeout.is_none() => {
                let v = match inline {
                    Some(v) => v,
                    None => option_value(args.next())?,
                };
                timeout = Some(number(v)?);
            }
            flag if flag.starts_with('-') => return None,
            _ => {
                // The command: this word and every one after it, flags included.
                command.push(arg.to_string());
                for word in args.by_ref() {
                    command.push(word?.to_string());
                }
                break;
            }
        }
    }
    if command.is_empty() {
        return None;
    }
    Some(PlainRun {
        task: task?,
        timeout,
        command,
    })
}

/// A value clap would take for an option: present, UTF-8, and not like a flag.
fn option_value(v: Option<Option<&str>>) -> Option<&str> {
    v.flatten().filter(|v| !v.starts_with('-'))
}

/// Runs the request to its end, printing its output as it arrives and cancelling the command
/// on the first SIGINT, SIGTERM or SIGHUP, as `live::drive` does for the full path.
// The bound on waiting for a cancelled run is the CLI's own (real time, nothing to replay).
#[allow(clippy::disallowed_methods)]
fn drive(
    client: &BlockingClient,
    stream: std::os::unix::net::UnixStream,
    task: &TaskId,
    request: RunRequest,
    signals: &WakeOnSignals,
    paths: &Paths,
) -> ExitCode {
    let stdin = request.stdin;
    let timeout = request.timeout_secs;
    let mut printer = Printer::default();
    let mut cancelled: Option<CancelSignal> = None;
    let mut give_up: Option<Instant> = None;
    let mut run_id: Option<String> = None;
    // Each `answer_wait` without a line from the server, the server is looked at: a stopped or
    // unanswering one ends the wait with an error naming it; a live one's silent command is
    // waited for.
    let answer_wait = taskbox::client::answer_wait();
    let mut quiet_since = Instant::now();
    let outcome = match client.start_run(stream, task, &request) {
        Err(e) => Some(Err(e)),
        Ok(mut answer) => 'answer: loop {
            let now = Instant::now();
            let look_at = quiet_since + answer_wait;
            let mut until = look_at;
            if let Some(at) = give_up {
                if at <= now {
                    break None;
                }
                until = until.min(at);
            }
            let limit = until.saturating_duration_since(now).as_millis() as u64 + 1;
            match answer.next(Some(signals.fd.as_fd()), Some(limit)) {
                Err(e) => break Some(Err(e)),
                Ok(Next::Woken) => {
                    let arrived = signals.take();
                    if arrived.is_empty() && Instant::now() >= look_at {
                        let waited = quiet_since.elapsed();
                        let probe_ms = answer_wait.as_millis() as u64;
                        if let Some(e) = client.unanswered(waited, probe_ms) {
                            break Some(Err(e));
                        }
                        quiet_since = Instant::now();
                    }
                    for signal in arrived {
                        if run_id.is_none() {
                            // The server has not answered: there is no run to cancel, and
                            // nothing to wait for.
                            cancelled = Some(signal);
                            eprintln!(
                                "note: the server had not answered yet; the command may still run when it does (`taskbox show {task}`)"
                            );
                            break 'answer None;
                        }
                        if cancelled.is_some() {
                            break 'answer None;
                        }
                        cancelled = Some(signal);
                        give_up = Some(Instant::now() + CANCEL_WAIT);
                        if let Some(run) = &run_id {
                            cancel_in_background(client, run, signal);
                        }
                    }
                }
                Ok(Next::Event(event)) => {
                    quiet_since = Instant::now();
                    match event {
                        RunEvent::Started { run } => {
                            if stdin {
                                let (client, run) = (client.clone(), run.clone());
                                // Ends with our stdin, or with the process.
                                let _ = std::thread::Builder::new()
                                    .name("taskbox-stdin".into())
                                    .spawn(move || {
                                        let _ = client.upload_stdin(&run, std::io::stdin().lock());
                                    });
                            }
                            if let Some(signal) = cancelled {
                                cancel_in_background(client, &run, signal);
                            }
                            run_id = Some(run);
                        }
                        RunEvent::Result(result) => break Some(Ok(result)),
                        RunEvent::Error(e) => break Some(Err(ClientError::from(e))),
                        output @ RunEvent::Output { .. } => {
                            if let Some(chunk) = output.into_chunk() {
                                printer.print(&chunk);
                            }
                        }
                    }
                }
            }
        },
    };
    let Some(outcome) = outcome else {
        // Cancelled, and the run did not come back in time: exit now, as a shell would (the
        // server finishes the cancel).
        let signal = cancelled.unwrap_or(CancelSignal::Interrupt);
        let _ = std::io::stdout().flush();
        std::process::exit(signal.exit_code());
    };
    let finished = outcome
        .map_err(Failure::from_client)
        .and_then(|res| finish_run(res, task, false, timeout, cancelled, paths));
    match finished {
        Ok(code) => code,
        Err(failure) => fail(&failure, false),
    }
}

/// Posts the cancel on a thread of its own, so that the answer's output keeps being read.
fn cancel_in_background(client: &BlockingClient, run: &str, signal: CancelSignal) {
    let (client, run) = (client.clone(), run.to_string());
    let _ = std::thread::Builder::new()
        .name("taskbox-cancel".into())
        .spawn(move || {
            // As the full path: a cancel that could not be posted leaves the run to its end.
            let _ = client.cancel(&run, signal);
        });
}

/// The write end of the pipe the signal handler writes to (-1: none yet).
static WAKE_WRITE: AtomicI32 = AtomicI32::new(-1);

/// The signals that cancel a run.
const CAUGHT: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// SIGINT, SIGTERM and SIGHUP caught from now on, each written as a byte to a pipe whose read
/// end wakes the wait for the answer (the self-pipe trick: the handler does nothing else).
struct WakeOnSignals {
    fd: OwnedFd,
    _write: OwnedFd,
}

extern "C" fn on_signal(signal: libc::c_int) {
    let fd = WAKE_WRITE.load(Ordering::Relaxed);
    let byte = signal as u8;
    // SAFETY: `write` is async-signal-safe; it writes one byte from a live local to the pipe
    // (non-blocking, so a full pipe drops the byte rather than blocking the handler, and the
    // reader has wakes enough then). errno is saved and restored around it, so the code the
    // signal interrupted sees its own.
    unsafe {
        let errno = *libc::__errno_location();
        libc::write(fd, (&byte as *const u8).cast(), 1);
        *libc::__errno_location() = errno;
    }
}

impl WakeOnSignals {
    fn install() -> std::io::Result<WakeOnSignals> {
        let mut fds = [-1 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded: both descriptors are open and owned by nothing else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        WAKE_WRITE.store(write.as_raw_fd(), Ordering::Relaxed);
        for signal in CAUGHT {
            // SAFETY: a zeroed `sigaction` is a valid value (no flags, empty mask) before its
            // fields are set; `on_signal` has the handler's signature and only does
            // async-signal-safe work; the pointers passed are to live locals.
            let res = unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut())
            };
            if res != 0 {
                let err = std::io::Error::last_os_error();
                restore_default_handlers();
                return Err(err);
            }
        }
        Ok(WakeOnSignals {
            fd: read,
            _write: write,
        })
    }

    /// The signals that arrived since the last look, in order.
    fn take(&self) -> Vec<CancelSignal> {
        let mut buf = [0u8; 64];
        let mut signals = Vec::new();
        loop {
            // SAFETY: reads into a live local buffer of the length passed; the descriptor is
            // ours and non-blocking.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return signals;
            }
            signals.extend(
                buf[..n as usize]
                    .iter()
                    .filter_map(|b| match *b as libc::c_int {
                        libc::SIGINT => Some(CancelSignal::Interrupt),
                        libc::SIGTERM => Some(CancelSignal::Terminate),
                        libc::SIGHUP => Some(CancelSignal::Hangup),
                        _ => None,
                    }),
            );
        }
    }
}

fn restore_default_handlers() {
    for signal in CAUGHT {
        // SAFETY: resetting a signal's disposition to its default touches no memory of ours.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
    }
}
