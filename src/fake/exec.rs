//! Commands that really run: one process group per command, contained in its session's local
//! sandbox (see the fake's module docs) and started in its working directory there, its output
//! kept as an append-only log that any number of readers (the `wait` stream, `/logs`,
//! `?wait=true` polls) follow from the start.
//!
//! Each command gets its own process group so that a kill, a timeout or the session's stop
//! reaches the processes it started too. Background processes a finished command left behind
//! keep running (as in the real sandbox) until the session stops; then the local provider's stop
//! ends the sandbox's PID namespace, and them with it (uncontained, by the `TASKBOX_SANDBOX`
//! variable every command inherits).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::watch;

use super::wire::CommandView;
use crate::clock::Clock;
use crate::core::Millis;
use crate::provider::local::{Contained, ContainedChild};

/// How long to keep reading a command's pipes after it exited: a background process it left
/// behind may hold them open forever.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(250);

/// What to run.
#[derive(Debug)]
pub(crate) struct SpawnSpec {
    pub id: String,
    pub session_id: String,
    pub command: String,
    pub args: Vec<String>,
    /// The working directory as the API shows it (`/vercel/sandbox/...`).
    pub cwd: String,
    /// The host directory it maps onto.
    pub host_cwd: PathBuf,
    /// `$HOME` for the command.
    pub home: PathBuf,
    pub env: BTreeMap<String, String>,
    /// SIGKILL the command after this long (exit 137).
    pub timeout: Option<Duration>,
    /// Its entry into the session's local sandbox (`cwd` and `home` are then paths inside it);
    /// `None`: it runs on the host, in `host_cwd` (a fake whose local provider does not
    /// isolate).
    pub contained: Option<Contained>,
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogStream {
    Stdout,
    Stderr,
}

impl LogStream {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LogStream::Stdout => "stdout",
            LogStream::Stderr => "stderr",
        }
    }
}

/// A run of output (arbitrary bytes, not lines), decoded as UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LogChunk {
    pub stream: LogStream,
    pub data: String,
}

/// Why a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndCause {
    Exited,
    TimedOut,
    /// Its session stopped (or was snapshotted) under it.
    SessionStopped,
}

/// A finished command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exit {
    pub code: i32,
    pub duration_ms: u64,
    pub cause: EndCause,
}

#[derive(Debug, Default)]
struct Inner {
    logs: Vec<LogChunk>,
    exit: Option<Exit>,
    /// The process group (= the leader's pid). Signalled while the leader is unreaped, so the id
    /// cannot have been reused, and once right after a signalled leader is reaped (`supervise`).
    group: Option<i32>,
    /// A signal was sent to the group (a kill request or a session stop).
    signalled: bool,
    session_stopping: bool,
}

/// One command, running or finished.
#[derive(Debug)]
pub(crate) struct CommandRun {
    pub id: String,
    pub session_id: String,
    pub name: String,
    pub args: Vec<String>,
    pub cwd: String,
    pub started_at: Millis,
    inner: Mutex<Inner>,
    changed: watch::Sender<u64>,
}

/// What a reader of a command sees next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    Logs(Vec<LogChunk>),
    Finished(Exit),
}

/// A reader's position in a command's log.
#[derive(Debug)]
pub(crate) struct Cursor {
    run: Arc<CommandRun>,
    next: usize,
    finished: bool,
    rx: watch::Receiver<u64>,
}

impl Cursor {
    /// The next output, then `Finished`, then `None`.
    pub(crate) async fn next(&mut self) -> Option<Event> {
        loop {
            {
                let inner = self.run.lock();
                if self.next < inner.logs.len() {
                    let chunks = inner.logs[self.next..].to_vec();
                    self.next = inner.logs.len();
                    return Some(Event::Logs(chunks));
                }
                if let Some(exit) = inner.exit {
                    if self.finished {
                        return None;
                    }
                    self.finished = true;
                    return Some(Event::Finished(exit));
                }
            }
            // The run owns the sender and we hold the run: the channel cannot close.
            if self.rx.changed().await.is_err() {
                return None;
            }
        }
    }
}

impl CommandRun {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves plain data behind; keep serving it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn push_log(&self, stream: LogStream, data: String) {
        self.lock().logs.push(LogChunk { stream, data });
        self.notify();
    }

    fn finish(&self, exit: Exit) {
        self.lock().exit = Some(exit);
        self.notify();
    }

    /// The command as the API shows it.
    pub(crate) fn view(&self) -> CommandView {
        let exit = self.lock().exit;
        CommandView {
            id: self.id.clone(),
            name: self.name.clone(),
            args: self.args.clone(),
            cwd: self.cwd.clone(),
            session_id: self.session_id.clone(),
            exit_code: exit.map(|e| e.code),
            duration_ms: exit.map(|e| e.duration_ms),
            started_at: self.started_at,
        }
    }

    pub(crate) fn exit(&self) -> Option<Exit> {
        self.lock().exit
    }

    /// A reader from the start of the log.
    pub(crate) fn cursor(self: &Arc<Self>) -> Cursor {
        Cursor {
            run: Arc::clone(self),
            next: 0,
            finished: false,
            rx: self.changed.subscribe(),
        }
    }

    /// Waits for the command to end.
    pub(crate) async fn wait(self: &Arc<Self>) -> Exit {
        let mut cursor = self.cursor();
        loop {
            match cursor.next().await {
                Some(Event::Finished(exit)) => return exit,
                Some(Event::Logs(_)) => {}
                None => {
                    return self.exit().unwrap_or(Exit {
                        code: 137,
                        duration_ms: 0,
                        cause: EndCause::SessionStopped,
                    })
                }
            }
        }
    }

    /// Sends `signal` to the command's process group if the command still runs.
    pub(crate) fn signal(&self, signal: i32) {
        let mut inner = self.lock();
        if inner.exit.is_none() {
            if let Some(pgid) = inner.group {
                inner.signalled = true;
                signal_group(pgid, signal);
            }
        }
    }

    /// Kills the command's process group because its session stops (the command then ends as
    /// [`EndCause::SessionStopped`]).
    pub(crate) fn kill_for_session_stop(&self) {
        let mut inner = self.lock();
        inner.session_stopping = true;
        if inner.exit.is_none() {
            if let Some(pgid) = inner.group {
                inner.signalled = true;
                signal_group(pgid, libc::SIGKILL);
            }
        }
    }
}

fn signal_group(pgid: i32, signal: i32) {
    if pgid > 1 {
        // SAFETY: kill(2) has no memory-safety preconditions; a negative pid addresses the group.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

/// Decodes output as UTF-8 across chunk boundaries: an incomplete trailing sequence waits for
/// the next chunk instead of becoming a replacement character.
#[derive(Debug, Default)]
struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[..valid])
                            .expect("valid_up_to marks a UTF-8 prefix"),
                    );
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                    }
                }
            }
        }
    }

    fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

/// The environment every command starts from (the fake's own environment is not passed on, so
/// the host's secrets stay out of the sandbox); a `contained` command's `PATH` is the system's,
/// not the fake's (whose directories the sandbox may not have).
fn base_env(home: &std::path::Path, contained: bool) -> Vec<(String, String)> {
    let path = match std::env::var("PATH") {
        Ok(path) if !contained => path,
        _ => "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
    };
    let mut env = vec![
        ("PATH".to_string(), path),
        ("HOME".to_string(), home.display().to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
    ];
    if !contained {
        for key in ["USER", "LOGNAME"] {
            if let Ok(v) = std::env::var(key) {
                env.push((key.to_string(), v));
            }
        }
    }
    env
}

/// Starts a command. A command that cannot start still becomes a finished command (exit 127
/// when not found, 126 otherwise, with the reason on stderr), as a shell would report it.
pub(crate) fn spawn(spec: SpawnSpec, clock: Arc<dyn Clock>) -> Arc<CommandRun> {
    let started_at = clock.now_ms();
    let (changed, _) = watch::channel(0);
    let run = Arc::new(CommandRun {
        id: spec.id.clone(),
        session_id: spec.session_id.clone(),
        name: spec.command.clone(),
        args: spec.args.clone(),
        cwd: spec.cwd.clone(),
        started_at,
        inner: Mutex::new(Inner::default()),
        changed,
    });
    // The command's whole environment, the request's variables over the base.
    let mut env: BTreeMap<String, String> = base_env(&spec.home, spec.contained.is_some())
        .into_iter()
        .collect();
    env.extend(spec.env);
    let started = match spec.contained {
        // Started in the session's sandbox as the local provider starts its own commands.
        Some(contained) => {
            let env: Vec<(String, String)> = env.into_iter().collect();
            contained
                .spawn(&spec.command, &spec.args, &env)
                .map(Child::Contained)
        }
        None => {
            let mut cmd = tokio::process::Command::new(&spec.command);
            cmd.args(&spec.args)
                .current_dir(&spec.host_cwd)
                .env_clear()
                .envs(&env)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .kill_on_drop(true);
            cmd.spawn().map(Child::Host)
        }
    };
    match started {
        Ok(child) => {
            let pid = child.id().and_then(|p| i32::try_from(p).ok());
            run.lock().group = pid;
            tokio::spawn(supervise(Arc::clone(&run), child, spec.timeout, clock));
        }
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            let mut why = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                why.push_str(&format!(": {c}"));
                cause = c.source();
            }
            run.push_log(
                LogStream::Stderr,
                format!(
                    "taskbox fake-vercel: cannot run `{}`: {why}\n",
                    spec.command
                ),
            );
            run.finish(Exit {
                code,
                duration_ms: 0,
                cause: EndCause::Exited,
            });
        }
    }
    run
}

async fn pump(run: Arc<CommandRun>, pipe: Option<impl AsyncRead + Unpin>, stream: LogStream) {
    let Some(mut pipe) = pipe else { return };
    let mut buf = vec![0u8; 16 * 1024];
    let mut carry = Utf8Carry::default();
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let text = carry.push(&buf[..n]);
                if !text.is_empty() {
                    run.push_log(stream, text);
                }
            }
        }
    }
    let rest = carry.finish();
    if !rest.is_empty() {
        run.push_log(stream, rest);
    }
}

/// A running command: on the host (a fake whose local provider does not isolate), or in its
/// session's sandbox.
enum Child {
    Host(tokio::process::Child),
    Contained(ContainedChild),
}

impl Child {
    fn id(&self) -> Option<u32> {
        match self {
            Child::Host(c) => c.id(),
            Child::Contained(c) => c.id(),
        }
    }

    fn take_stdout(&mut self) -> Option<Box<dyn AsyncRead + Unpin + Send>> {
        match self {
            Child::Host(c) => c
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn AsyncRead + Unpin + Send>),
            Child::Contained(c) => c.stdout.take(),
        }
    }

    fn take_stderr(&mut self) -> Option<Box<dyn AsyncRead + Unpin + Send>> {
        match self {
            Child::Host(c) => c
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn AsyncRead + Unpin + Send>),
            Child::Contained(c) => c.stderr.take(),
        }
    }

    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self {
            Child::Host(c) => c.wait().await,
            Child::Contained(c) => c.wait().await,
        }
    }
}

async fn supervise(
    run: Arc<CommandRun>,
    mut child: Child,
    timeout: Option<Duration>,
    clock: Arc<dyn Clock>,
) {
    let out = tokio::spawn(pump(
        Arc::clone(&run),
        child.take_stdout(),
        LogStream::Stdout,
    ));
    let err = tokio::spawn(pump(
        Arc::clone(&run),
        child.take_stderr(),
        LogStream::Stderr,
    ));
    let (out_abort, err_abort) = (out.abort_handle(), err.abort_handle());
    let mut timed_out = false;
    let status = match timeout {
        Some(limit) => tokio::select! {
            status = child.wait() => status,
            () = tokio::time::sleep(limit) => {
                timed_out = true;
                run.signal(libc::SIGKILL);
                child.wait().await
            }
        },
        None => child.wait().await,
    };
    // A signalled shell may exit while a process it started missed the signal (one sent as bash
    // forks it is lost) or ignores it, and would run on: a signalled command ends with its
    // leader, so what is left of its group is killed. The group's id cannot have been reused
    // while a member of the group lives, and with none left the kill reaches nothing.
    {
        let inner = run.lock();
        if let (true, Some(pgid)) = (inner.signalled, inner.group) {
            signal_group(pgid, libc::SIGKILL);
        }
    }
    // Reaped: from here on its pid may be reused, so it must not be signalled any more.
    run.lock().group = None;
    let drained = tokio::time::timeout(DRAIN_AFTER_EXIT, async {
        let _ = out.await;
        let _ = err.await;
    })
    .await;
    if drained.is_err() {
        out_abort.abort();
        err_abort.abort();
    }
    let code = match &status {
        Ok(s) => {
            use std::os::unix::process::ExitStatusExt;
            s.code()
                .unwrap_or_else(|| 128 + s.signal().unwrap_or(libc::SIGKILL))
        }
        Err(_) => 137,
    };
    let session_stopping = run.lock().session_stopping;
    let cause = if session_stopping {
        EndCause::SessionStopped
    } else if timed_out {
        EndCause::TimedOut
    } else {
        EndCause::Exited
    };
    let duration_ms = clock.now_ms().saturating_sub(run.started_at);
    run.finish(Exit {
        code: if timed_out { 137 } else { code },
        duration_ms,
        cause,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;

    #[test]
    fn utf8_split_across_chunks_is_kept_whole() {
        let mut c = Utf8Carry::default();
        let bytes = "héllo→".as_bytes();
        let mut out = String::new();
        for b in bytes {
            out.push_str(&c.push(&[*b]));
        }
        out.push_str(&c.finish());
        assert_eq!(out, "héllo→");
        assert_eq!(c.push(&[0xff, b'a']), "\u{FFFD}a");
        assert_eq!(c.push(&[0xe2, 0x86]), "");
        assert_eq!(c.finish(), "\u{FFFD}");
    }

    fn spec(dir: &std::path::Path, command: &str, args: &[&str]) -> SpawnSpec {
        SpawnSpec {
            id: "cmd_1".into(),
            session_id: "sbx_1".into(),
            command: command.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            cwd: "/vercel/sandbox".into(),
            host_cwd: dir.to_path_buf(),
            home: dir.to_path_buf(),
            env: BTreeMap::from([("GREETING".to_string(), "hi".to_string())]),
            timeout: None,
            contained: None,
        }
    }

    #[tokio::test]
    async fn runs_in_the_workspace_with_the_env_and_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let run = spawn(
            spec(
                dir.path(),
                "bash",
                &["-c", "echo $GREETING; pwd; echo oops >&2; exit 3"],
            ),
            Arc::new(SystemClock),
        );
        let exit = tokio::time::timeout(Duration::from_secs(10), run.wait())
            .await
            .unwrap();
        assert_eq!((exit.code, exit.cause), (3, EndCause::Exited));
        let mut cursor = run.cursor();
        let mut stdout = String::new();
        let mut stderr = String::new();
        while let Some(Event::Logs(chunks)) = cursor.next().await {
            for c in chunks {
                match c.stream {
                    LogStream::Stdout => stdout.push_str(&c.data),
                    LogStream::Stderr => stderr.push_str(&c.data),
                }
            }
        }
        let real = dir.path().canonicalize().unwrap();
        assert_eq!(stdout, format!("hi\n{}\n", real.display()));
        assert_eq!(stderr, "oops\n");
        assert_eq!(run.view().exit_code, Some(3));
    }

    #[tokio::test]
    async fn timeout_kills_with_137_and_missing_commands_exit_127() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = spec(dir.path(), "sleep", &["30"]);
        s.timeout = Some(Duration::from_millis(100));
        let run = spawn(s, Arc::new(SystemClock));
        let exit = tokio::time::timeout(Duration::from_secs(10), run.wait())
            .await
            .unwrap();
        assert_eq!((exit.code, exit.cause), (137, EndCause::TimedOut));

        let missing = spawn(
            spec(dir.path(), "taskbox-no-such-command", &[]),
            Arc::new(SystemClock),
        );
        assert_eq!(missing.exit().unwrap().code, 127);
    }

    #[tokio::test]
    async fn signal_reaches_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let run = spawn(
            spec(dir.path(), "bash", &["-c", "sleep 30 & wait"]),
            Arc::new(SystemClock),
        );
        run.signal(libc::SIGTERM);
        let exit = tokio::time::timeout(Duration::from_secs(10), run.wait())
            .await
            .unwrap();
        assert_eq!(exit.code, 128 + libc::SIGTERM);
    }

    /// Whether a process whose command line holds `marker` runs (zombies do not count).
    fn running(marker: &str) -> bool {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
            !zombie
                && std::fs::read(e.path().join("cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
    }

    #[tokio::test]
    async fn a_signalled_command_ends_with_its_shell_and_takes_what_outlived_it() {
        let dir = tempfile::tempdir().unwrap();
        let marker = format!("61.{}3", std::process::id());
        // The child ignores SIGTERM and outlives its shell, which exits on it.
        let script = format!("(trap '' TERM; exec sleep {marker}) & trap 'exit 143' TERM; wait");
        let run = spawn(
            spec(dir.path(), "bash", &["-c", &script]),
            Arc::new(SystemClock),
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !running(&marker) {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never started"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The shell's trap is set once the child runs: give bash the moment it needs to get there.
        tokio::time::sleep(Duration::from_millis(200)).await;
        run.signal(libc::SIGTERM);
        let exit = tokio::time::timeout(Duration::from_secs(10), run.wait())
            .await
            .unwrap();
        assert_eq!(exit.code, 143);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while running(&marker) {
            assert!(
                std::time::Instant::now() < deadline,
                "the child that ignored the signal outlived its command"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
