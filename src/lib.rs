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

#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "chaos")]
pub mod chaos;
pub mod clock;
pub mod config;
pub mod core;
pub mod engine;
#[cfg(feature = "fake")]
pub mod fake;
pub mod ids;
pub mod provider;
pub mod replay;
pub mod retry;
pub mod rng;
pub mod shell;
pub mod store;

pub use ids::{TaskId, TaskIdError};
