//! The dashboard's own connection to the store, for the reads that cover whole journals (a
//! task's snapshots with what made them, its timeline, every task's cost) and a fleet's leases.
//!
//! They run on a blocking thread against this connection, never as queries of the event loop
//! that commits the commands' transitions: however long a page's read takes, no command waits
//! behind it. SQLite's WAL lets this reader see committed transitions while the server writes
//! (as `taskbox cost` does from another process); on PostgreSQL it is one more connection,
//! opened on the first page that needs it and opened again after an error.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;

use super::super::answer::{engine_failure, failure, Failure};
use crate::client::wire::ApiError;
use crate::config::Config;
use crate::core::ledger::Prices;
use crate::engine::{store_file, EngineError};
use crate::store::Store;

/// A lazily opened store connection of the dashboard's.
pub struct Reader {
    location: Option<String>,
    file: PathBuf,
    /// The list prices of the cost column (`cost.*`).
    pub prices: Prices,
    store: Mutex<Option<Store>>,
}

impl Reader {
    /// The reader of the store the server of `data_dir` with `config` writes.
    pub fn new(data_dir: &std::path::Path, config: &Config) -> Reader {
        Reader {
            location: config.terminal.store.url().map(str::to_string),
            file: store_file(data_dir),
            prices: config.prices(),
            store: Mutex::new(None),
        }
    }

    /// Runs `f` on the store, on a blocking thread; its error as the API answers it.
    pub(in crate::server) async fn with<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Store) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<T, Failure> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut slot = me.store.lock().unwrap_or_else(|p| p.into_inner());
            let store = match slot.take() {
                Some(s) => s,
                None => Store::open_location(me.location.as_deref(), &me.file, false)?,
            };
            let out = f(&store);
            // A failed read may have been a lost connection: the next read opens a new one.
            if out.is_ok() {
                *slot = Some(store);
            }
            out
        })
        .await
        .map_err(|e| {
            failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                ApiError::new("internal", format!("a dashboard read failed: {e}")),
            )
        })?
        .map_err(engine_failure)
    }
}
