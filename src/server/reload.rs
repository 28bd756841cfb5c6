//! A running server follows its config file (issue 32 item 13: `config set terminal.timeout 1`
//! changed nothing until a restart).
//!
//! Before each request the server stats the file (one `stat`: device, inode, size, mtime and
//! ctime); when any of them changed, it reads the file again and applies its live keys
//! (`config::live`) through [`Orchestrator::reconfigure`] before the request goes on, so the
//! command that follows `config set` runs with the new value. A key that needs a restart keeps
//! its running value, and the server logs which ones wait for it. A file that no longer loads
//! changes nothing: every request but `health` and `shutdown` is answered with the file's error
//! (it names the key or the line, and how to fix it) until the file is fixed, and the server
//! keeps running with the settings it had.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Mutex;

use super::answer::engine_failure;
use crate::client::wire::API_PREFIX;
use crate::config::live::reload;
use crate::config::{Config, ConfigError};
use crate::engine::{EngineError, Orchestrator};

/// What identifies one version of the file without reading it: a rename (`config set` writes a
/// temporary file and renames it) changes the inode, an edit in place the size or the times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    /// The file's stamp; `None` when there is no file (the defaults apply).
    fn of(path: &std::path::Path) -> std::io::Result<Option<Stamp>> {
        match std::fs::metadata(path) {
            Ok(m) => Ok(Some(Stamp {
                dev: m.dev(),
                ino: m.ino(),
                size: m.size(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The server's view of its config file.
pub(super) struct ConfigWatch {
    /// The file; `None` for a server given its config in code, which follows no file.
    path: Option<PathBuf>,
    orch: Orchestrator,
    seen: Mutex<Seen>,
}

struct Seen {
    /// The stamp of the file last read (`None`: no file).
    stamp: Option<Stamp>,
    /// The file as last read, to tell which restart keys a change touched.
    file: Config,
    /// The config the server runs with: its start's, with the live keys of the file.
    running: Config,
    /// The last version of the file that did not load, and why; answered until it changes.
    refused: Option<(Option<Stamp>, Arc<ConfigError>)>,
}

impl ConfigWatch {
    /// Watches `path` for a server running with `running` (its config as it started, with the
    /// overrides of its flags and environment). The file is read again now, and a live key
    /// changed since the server's own read is applied at once.
    pub(super) async fn start(
        path: Option<PathBuf>,
        orch: Orchestrator,
        running: Config,
    ) -> ConfigWatch {
        let watch = ConfigWatch {
            path,
            orch,
            seen: Mutex::new(Seen {
                stamp: None,
                file: running.clone(),
                running,
                refused: None,
            }),
        };
        if let Some(path) = &watch.path {
            // A file that does not load now is answered at the first request.
            let _ = watch
                .read(path, Stamp::of(path).ok().flatten(), false)
                .await;
        }
        watch
    }

    /// The config the server runs with now.
    pub(super) async fn running(&self) -> Config {
        self.seen.lock().await.running.clone()
    }

    /// Applies the file's live keys when it changed since it was last read; the file's error
    /// when it does not load.
    async fn refresh(&self) -> Result<(), Arc<ConfigError>> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let stamp = Stamp::of(path).map_err(|source| {
            Arc::new(ConfigError::Io {
                action: "read",
                path: path.clone(),
                source,
            })
        })?;
        if self.seen.lock().await.stamp == stamp {
            return Ok(());
        }
        self.read(path, stamp, true).await
    }

    /// Reads the file (whose stamp was `stamp` just before) and applies its live keys; with
    /// `changed`, logs the restart keys the change touched (at start, the server's own flags
    /// and environment make its config differ from the file's on purpose).
    async fn read(
        &self,
        path: &std::path::Path,
        stamp: Option<Stamp>,
        changed: bool,
    ) -> Result<(), Arc<ConfigError>> {
        let mut seen = self.seen.lock().await;
        if seen.stamp == stamp && seen.refused.is_none() {
            // Another request read this version meanwhile.
            return Ok(());
        }
        if let Some((at, err)) = &seen.refused {
            if *at == stamp {
                return Err(err.clone());
            }
        }
        let file = match Config::load(path) {
            Ok(file) => file,
            Err(e) => {
                let e = Arc::new(e);
                tracing::warn!(error = %e, "the config file changed and does not load; the server keeps its settings");
                seen.refused = Some((stamp, e.clone()));
                return Err(e);
            }
        };
        let next = reload(&seen.running, &file);
        let waiting: Vec<&str> = reload(&seen.file, &file).restart;
        if changed && !waiting.is_empty() {
            tracing::warn!(
                keys = %waiting.join(", "),
                "the config file changed keys the server reads only as it starts: they apply once it restarts (`taskbox serve --stop`)"
            );
        }
        if next.config != seen.running {
            if let Err(e) = self.orch.reconfigure(&next.config).await {
                // The engine is stopping: the request gets its own answer from it.
                tracing::warn!(error = %e, "cannot apply the changed config");
                return Ok(());
            }
            tracing::info!(path = %path.display(), "applied the changed config");
            seen.running = next.config;
        }
        seen.stamp = stamp;
        seen.file = file;
        seen.refused = None;
        Ok(())
    }
}

/// The middleware: [`ConfigWatch::refresh`] before every request; a file that does not load
/// is the answer, except for `health` and `shutdown` (a server must stay observable and
/// stoppable whatever its file says).
pub(super) async fn follow_config(
    State(watch): State<Arc<ConfigWatch>>,
    req: Request,
    next: Next,
) -> Response {
    let Err(e) = watch.refresh().await else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    let exempt = [
        format!("{API_PREFIX}/health"),
        format!("{API_PREFIX}/shutdown"),
    ];
    if exempt.iter().any(|p| p == path) {
        return next.run(req).await;
    }
    refused(&e).into_response()
}

/// The answer while the file does not load: the file's error, with how to fix it, and that
/// nothing changed.
fn refused(e: &ConfigError) -> Response {
    let hint = e.hint();
    let mut answer = engine_failure(EngineError::Config(clone_error(e)));
    answer.1.message = format!(
        "the config file changed and the server cannot use it ({}); it keeps running with the settings it had, and answers nothing else until the file is fixed",
        answer.1.message
    );
    if hint.is_none() {
        answer.1.hint =
            Some("fix the file, or `taskbox config set KEY VALUE`, which checks values".into());
    }
    answer.into_response()
}

/// A copy of `e` for an answer (`ConfigError` holds an `io::Error`, which does not clone).
fn clone_error(e: &ConfigError) -> ConfigError {
    match e {
        ConfigError::UnknownKey { key } => ConfigError::UnknownKey { key: key.clone() },
        ConfigError::InvalidValue {
            key,
            value,
            expected,
            source_,
        } => ConfigError::InvalidValue {
            key: key.clone(),
            value: value.clone(),
            expected: expected.clone(),
            source_: source_.clone(),
        },
        ConfigError::Io {
            action,
            path,
            source,
        } => ConfigError::Io {
            action,
            path: path.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        ConfigError::Parse { path, message } => ConfigError::Parse {
            path: path.clone(),
            message: message.clone(),
        },
    }
}
