//! A `taskbox serve` process for the benchmarks that go through the CLI: started in a home of
//! its own, asked to stop at the end; and the stored tasks the scaling row needs.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::BenchError;
use crate::client::Client;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::core::{Event, Task};
use crate::engine::store_file;
use crate::ids::TaskId;
use crate::store::{Store, TransitionRecord};

const BENCH: &str = "server";

/// How long a server may take to answer, and to stop.
const WAIT: Duration = Duration::from_secs(60);

/// Environment variables a benchmark's `taskbox` processes must not inherit.
pub(super) const SCRUBBED_ENV: [&str; 8] = [
    "RUST_LOG",
    "VERCEL_TOKEN",
    "VERCEL_OIDC_TOKEN",
    "VERCEL_PROJECT_ID",
    "VERCEL_TEAM_ID",
    "TERMINAL_VERCEL_RUNTIME",
    "TASKBOX_VERCEL_API_URL",
    "TASKBOX_SERVER",
];

/// `taskbox` with `TASKBOX_HOME=home`, a scrubbed environment plus `env`.
pub(super) fn taskbox(exe: &Path, home: &Path, env: &[(String, String)]) -> std::process::Command {
    let mut cmd = std::process::Command::new(exe);
    cmd.env("TASKBOX_HOME", home).stdin(Stdio::null());
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd
}

/// A `taskbox serve` process (foreground, not auto: it never exits by itself).
pub(super) struct BenchServer {
    child: Option<Child>,
    client: Client,
    log: PathBuf,
}

impl BenchServer {
    /// Starts `taskbox serve` for `home` and waits until it answers.
    pub(super) async fn start(
        exe: &Path,
        home: &Path,
        env: &[(String, String)],
    ) -> Result<BenchServer, BenchError> {
        let log = home.join("serve.stderr");
        let out = std::fs::File::create(&log)
            .map_err(BenchError::io(BENCH, format!("create {}", log.display())))?;
        let child = taskbox(exe, home, env)
            .arg("serve")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .map_err(BenchError::io(
                BENCH,
                format!("spawn {} serve", exe.display()),
            ))?;
        let mut server = BenchServer {
            child: Some(child),
            client: Client::new(&home.join("data")),
            log,
        };
        let started = Instant::now();
        loop {
            if server.client.health().await.is_ok() {
                return Ok(server);
            }
            let exited = server
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || started.elapsed() > WAIT {
                let log = std::fs::read_to_string(&server.log).unwrap_or_default();
                return Err(BenchError::failed(
                    BENCH,
                    format!(
                        "`taskbox serve` did not answer ({exited:?}): {}",
                        log.trim()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Asks the server to stop (it suspends the live sandboxes) and waits for it.
    pub(super) async fn stop(mut self) {
        let _ = self.client.shutdown().await;
        let started = Instant::now();
        if let Some(mut child) = self.child.take() {
            while started.elapsed() < WAIT {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl BenchServer {
    /// Kills the server with SIGKILL, as a crash would: it releases nothing (a fleet's leases
    /// are left to expire).
    pub(super) fn kill(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for BenchServer {
    /// A benchmark that failed half-way leaves no server behind.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Stores `n` idle tasks (created, never run) in `home`'s data dir, as the engine stores a new
/// task: one journaled transition each, committed in batches.
pub(super) fn store_idle_tasks(home: &Path, n: usize) -> Result<(), BenchError> {
    let data = home.join("data");
    std::fs::create_dir_all(&data)
        .map_err(BenchError::io(BENCH, format!("create {}", data.display())))?;
    let store_err = |action: &str| {
        let action = action.to_string();
        move |source| BenchError::Store {
            bench: BENCH,
            action,
            source: Box::new(source),
        }
    };
    let mut store = Store::open(&store_file(&data)).map_err(store_err("open the store"))?;
    let settings = Config::default().task_settings();
    let now = SystemClock.now_ms();
    let event = Event::SettingsChanged {
        settings: settings.clone(),
    };
    let ids: Vec<usize> = (0..n).collect();
    for chunk in ids.chunks(1000) {
        let tasks: Vec<Task> = chunk
            .iter()
            .map(|i| {
                let id = TaskId::new(&format!("stored-{i}")).expect("a valid task id");
                Task::new(id, settings.clone(), now)
            })
            .collect();
        let records: Vec<TransitionRecord<'_>> = tasks
            .iter()
            .map(|t| TransitionRecord {
                at: now,
                event: &event,
                state_before: t.state,
                task_after: t,
                commands: &[],
            })
            .collect();
        store
            .commit_batch(&records)
            .map_err(store_err("store the idle tasks"))?;
    }
    Ok(())
}
