//! taskbox gives every agent task its own sandbox.
//!
//! A coding agent runs terminal commands; taskbox runs each of them inside the sandbox that
//! belongs to the task (a local workspace by default, a Vercel Sandbox microVM in production),
//! creates it on the first command, reuses it, and when it expires or the task pauses keeps the
//! task's files in a filesystem snapshot and restores the latest one when the task resumes.
//!
//! See `ARCHITECTURE.md` for the map. The entry point for a Rust program is
//! [`engine::Orchestrator`].
//!
//! The tooling — `fake`, `chaos`, `bench` and the re-drive in [`replay`] — is behind cargo
//! features that are on by default; `default-features = false` leaves the library without axum
//! and without tokio's test clock.
//!
//! `clippy.toml` disallows reading the clock, sleeping, spawning processes and opening SQLite
//! connections; a module whose job that is allows it where it is declared, and says why.

// Measuring is the benchmark's job, and its baselines must bypass taskbox: it reads the wall
// clock, spawns `bash`, `tar`, `zstd` and `taskbox`, and opens its own SQLite file (see
// ARCHITECTURE.md's invariants).
#[cfg(feature = "bench")]
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
pub mod bench;
#[cfg(feature = "chaos")]
pub mod chaos;
#[cfg(feature = "server")]
pub mod client;
// The one place that reads the wall clock and tokio's clock; everything else gets a `Clock`.
#[allow(clippy::disallowed_methods)]
pub mod clock;
pub mod config;
pub use taskbox_core as core;
pub mod engine;
// A fake platform: it runs commands in local workspaces and keeps its own time, like Vercel.
#[cfg(feature = "fake")]
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
pub mod fake;
pub use taskbox_core::ids;
pub mod provider;
pub mod redact;
pub mod replay;
pub mod retry;
pub mod rng;
#[cfg(feature = "server")]
pub mod server;
pub mod shell;
// The snapshot store works on files: it spawns no process and reads no clock.
pub mod snapshot_store;
pub mod store;

pub use ids::{TaskId, TaskIdError};
