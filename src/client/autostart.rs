//! Starting a data dir's server in the background (`terminal.server = auto`): the CLI
//! re-executes itself as `taskbox serve --auto`, detached (its own session, stdin from
//! `/dev/null`, output appended to `<data>/serve.log`), and waits for the socket to answer.
//!
//! Ten CLIs racing to start one: each takes `<data>/autostart.lock` in turn, and whoever gets it
//! first asks the socket again before starting anything, so one server starts and the others
//! find it. The server's own lock (`<data>/serve.lock`) is what guarantees one server per data
//! dir; this lock only spares the losers a pointless start.
//!
//! The server takes from its starter's environment only what it reads ([`server_environment`]):
//! whoever happened to start it does not hand it, say, their shell's tokens.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Client, ClientError};
use crate::engine::try_flock;

/// The server's log in a data dir.
pub const LOG_FILE: &str = "serve.log";

/// How long to wait for a started server's socket to answer.
const START_WAIT: Duration = Duration::from_secs(60);

/// A server this call started.
#[derive(Debug, Clone)]
pub struct Started {
    /// Its process id.
    pub pid: u32,
    /// Its log.
    pub log: PathBuf,
}

/// Makes sure a server answers for the client's data dir: `None` if one already did (perhaps
/// started by a concurrent CLI), `Some` if this call started it.
pub async fn ensure_server(client: &Client) -> Result<Option<Started>, ClientError> {
    let data_dir = client.data_dir.clone();
    let log = data_dir.join(LOG_FILE);
    let start_err = |message: String| ClientError::Start {
        data_dir: data_dir.clone(),
        message,
        log: log.clone(),
        server_hint: None,
    };
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| start_err(format!("cannot create the data dir: {e}")))?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(data_dir.join("autostart.lock"))
        .map_err(|e| start_err(format!("cannot open autostart.lock: {e}")))?;
    let started = Instant::now();
    while !try_flock(&lock).map_err(|e| start_err(format!("cannot lock autostart.lock: {e}")))? {
        if started.elapsed() > START_WAIT {
            return Err(start_err(
                "another taskbox process has been starting a server for over 60 s".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Holding the lock: a concurrent CLI may have started one while we waited.
    if answers(client).await? {
        return Ok(None);
    }
    let exe = std::env::current_exe()
        .map_err(|e| start_err(format!("cannot find the taskbox binary: {e}")))?;
    let started = Instant::now();
    let mut child: Option<std::process::Child> = None;
    let mut pid = 0;
    let mut last_exit = None;
    let mut log_from = 0;
    loop {
        if child.is_none() {
            // What this server writes to the log starts here.
            log_from = std::fs::metadata(&log).map_or(0, |m| m.len());
            let c = spawn_server(&exe, &log).map_err(|e| start_err(e.to_string()))?;
            pid = c.id();
            child = Some(c);
        }
        if answers(client).await? {
            break;
        }
        if let Some(Ok(Some(status))) = child.as_mut().map(|c| c.try_wait()) {
            let said = ServerSaid::read(&log, log_from);
            // A server that is still stopping holds the serve lock: start another once it is
            // gone. Any other failure (a config the server refuses…) would only repeat: it is
            // the answer, with the server's own words.
            if !said.already_running && !said.error.is_empty() {
                return Err(ClientError::Start {
                    data_dir: data_dir.clone(),
                    message: format!("`taskbox serve` exited ({status}): {}", said.error),
                    log: log.clone(),
                    server_hint: said.hint,
                });
            }
            last_exit = Some(status);
            child = None;
        }
        if started.elapsed() > START_WAIT {
            return Err(start_err(match last_exit {
                Some(status) => format!("`taskbox serve` exited ({status})"),
                None => format!(
                    "its socket did not answer within {} s",
                    START_WAIT.as_secs()
                ),
            }));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(lock);
    Ok(Some(Started { pid, log }))
}

/// The variables an auto-started server takes from its starter's environment, by name: where
/// its files are (`HOME`, `XDG_CONFIG_HOME`, `XDG_DATA_HOME`, `TMPDIR`), how it runs programs
/// and prints (`PATH`, `USER`, `LOGNAME`, `LANG`, `LC_ALL`, `LC_CTYPE`, `TERM`, `TZ`,
/// `RUST_LOG`, `RUST_BACKTRACE`, `NO_COLOR`, `HOSTNAME`), how it reaches Vercel (the
/// `VERCEL_*` credentials and ids it reads, `TERMINAL_VERCEL_*`, the proxies and CA
/// certificates of its HTTP client) — plus every `TASKBOX_*` (its own settings).
pub const SERVER_VARIABLES: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TZ",
    "TMPDIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "RUST_LOG",
    "RUST_BACKTRACE",
    "NO_COLOR",
    "HOSTNAME",
    "VERCEL_TOKEN",
    "VERCEL_OIDC_TOKEN",
    "VERCEL_TEAM_ID",
    "VERCEL_PROJECT_ID",
    "TERMINAL_VERCEL_IMAGE",
    "TERMINAL_VERCEL_RUNTIME",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

/// Of `vars` (a starter's environment), what an auto-started server gets: the
/// [`SERVER_VARIABLES`] and the `TASKBOX_*`, nothing else.
pub fn server_environment(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    vars.into_iter()
        .filter(|(k, _)| {
            k.to_str().is_some_and(|k| {
                SERVER_VARIABLES.contains(&k) || k.starts_with(crate::config::RESERVED_PREFIX)
            })
        })
        .collect()
}

/// What a server that exited wrote to its log: its `error:` line with its `caused by:` lines,
/// and its `hint:`.
#[derive(Debug, Default)]
struct ServerSaid {
    error: String,
    hint: Option<String>,
    already_running: bool,
}

/// The most of a log read back for a server's error (its own lines are a few hundred bytes).
const LOG_TAIL_MAX: u64 = 64 * 1024;

impl ServerSaid {
    /// The error lines in `log` from byte `from` on (what the last server started wrote).
    fn read(log: &std::path::Path, from: u64) -> ServerSaid {
        use std::io::{Read, Seek, SeekFrom};
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(log) {
            let len = f.metadata().map_or(0, |m| m.len());
            let from = from.max(len.saturating_sub(LOG_TAIL_MAX));
            if f.seek(SeekFrom::Start(from)).is_ok() {
                let mut bytes = Vec::new();
                let _ = f.take(LOG_TAIL_MAX).read_to_end(&mut bytes);
                text = String::from_utf8_lossy(&bytes).into_owned();
            }
        }
        ServerSaid::parse(&text)
    }

    fn parse(text: &str) -> ServerSaid {
        let mut said = ServerSaid::default();
        let mut in_error = false;
        for line in text.lines() {
            if let Some(e) = line.strip_prefix("error: ") {
                said.error = e.trim().to_string();
                said.already_running = e.contains("already running");
                in_error = true;
            } else if let (true, Some(c)) = (in_error, line.strip_prefix("  caused by: ")) {
                said.error.push_str(": ");
                said.error.push_str(c.trim());
            } else if let (true, Some(h)) = (in_error, line.strip_prefix("hint: ")) {
                said.hint = Some(h.trim().to_string());
            } else {
                in_error = false;
            }
        }
        said
    }
}

/// Starts `taskbox serve --auto` detached, its output appended to `log`.
fn spawn_server(
    exe: &std::path::Path,
    log: &std::path::Path,
) -> std::io::Result<std::process::Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let err = out.try_clone()?;
    let mut cmd = Command::new(exe);
    cmd.args(["serve", "--auto"])
        .env_clear()
        .envs(server_environment(std::env::vars_os()))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: `setsid` is async-signal-safe and touches no memory; between fork and exec it
    // detaches the server from the CLI's session and terminal, so Ctrl-C or closing the
    // terminal does not reach it. It fails only if the child already leads a process group,
    // which a freshly forked child does not.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Whether a server answers on the socket (`Err` only for a socket of another user).
async fn answers(client: &Client) -> Result<bool, ClientError> {
    match client.health().await {
        Ok(_) => Ok(true),
        Err(e @ ClientError::ForeignSocket { .. }) => Err(e),
        Err(_) => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_server_takes_only_what_it_reads() {
        let vars = [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/u"),
            ("TASKBOX_HOME", "/t"),
            ("VERCEL_TOKEN", "tok"),
            ("FIRST_CALLER_SECRET", "s3cret"),
            ("AWS_SECRET_ACCESS_KEY", "k"),
            ("LD_PRELOAD", "/x.so"),
        ]
        .map(|(k, v)| (k.into(), v.into()));
        let kept: Vec<String> = server_environment(vars)
            .into_iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert_eq!(kept, ["PATH", "HOME", "TASKBOX_HOME", "VERCEL_TOKEN"]);
    }

    #[test]
    fn the_servers_error_and_hint_are_read_from_its_log() {
        let log = "2026-12-06T03:44:52Z  INFO removing the socket file\n\
                   error: vercel_sandbox backend: memory is 5120 but 2048 MB per vCPU\n\
                   hint: set terminal.container_memory to 2048\n";
        let said = ServerSaid::parse(log);
        assert_eq!(
            said.error,
            "vercel_sandbox backend: memory is 5120 but 2048 MB per vCPU"
        );
        assert_eq!(
            said.hint.as_deref(),
            Some("set terminal.container_memory to 2048")
        );
        assert!(!said.already_running);
        let said = ServerSaid::parse(
            "error: a taskbox server is already running for /d (pid 7)\n  caused by: x\n",
        );
        assert!(said.already_running);
        assert_eq!(
            said.error,
            "a taskbox server is already running for /d (pid 7): x"
        );
        assert!(ServerSaid::parse("  INFO serving\n").error.is_empty());
    }
}
