//! Starting a data dir's server in the background (`terminal.server = auto`): the CLI
//! re-executes itself as `taskbox serve --auto`, detached (its own session, stdin from
//! `/dev/null`, output appended to `<data>/serve.log`), and waits for the socket to answer.
//!
//! Ten CLIs racing to start one: each takes `<data>/autostart.lock` in turn, and whoever gets it
//! first asks the socket again before starting anything, so one server starts and the others
//! find it. The server's own lock (`<data>/serve.lock`) is what guarantees one server per data
//! dir; this lock only spares the losers a pointless start.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Client, ClientError};

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
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| start_err(format!("cannot open {}: {e}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(|e| start_err(format!("cannot open {}: {e}", log.display())))?;
    let mut cmd = Command::new(exe);
    cmd.args(["serve", "--auto", "-v"])
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
    let mut child = cmd
        .spawn()
        .map_err(|e| start_err(format!("cannot start `taskbox serve`: {e}")))?;
    let pid = child.id();
    let started = Instant::now();
    loop {
        if answers(client).await? {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            // It lost a race with a server started without this lock (`taskbox serve` by
            // hand): that one is as good.
            if answers(client).await? {
                return Ok(None);
            }
            return Err(start_err(format!("`taskbox serve` exited ({status})")));
        }
        if started.elapsed() > START_WAIT {
            return Err(start_err(format!(
                "its socket did not answer within {} s",
                START_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(lock);
    Ok(Some(Started { pid, log }))
}

/// Whether a server answers on the socket (`Err` only for a socket of another user).
async fn answers(client: &Client) -> Result<bool, ClientError> {
    match client.health().await {
        Ok(_) => Ok(true),
        Err(e @ ClientError::ForeignSocket { .. }) => Err(e),
        Err(_) => Ok(false),
    }
}

/// Takes an exclusive advisory lock without blocking; `Ok(false)` if another holder has it.
fn try_flock(file: &File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: `flock` takes a descriptor and two flags and touches no memory of ours; `file` is
    // borrowed for the whole call, so its descriptor stays open until `flock` returns.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}
