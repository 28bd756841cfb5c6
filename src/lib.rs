//! taskbox gives every agent task its own sandbox.
//!
//! A coding agent runs terminal commands; taskbox runs each of them inside the sandbox that
//! belongs to the task (a local workspace by default, a Vercel Sandbox microVM in production),
//! creates it on the first command, reuses it, and when it expires or the task pauses keeps the
//! task's files in a filesystem snapshot and restores the latest one when the task resumes.
//!
//! See `ARCHITECTURE.md` for the map. The entry point for a Rust program is
//! [`engine::Orchestrator`].

pub mod bench;
pub mod chaos;
pub mod clock;
pub mod config;
pub mod core;
pub mod engine;
pub mod fake;
pub mod ids;
pub mod provider;
pub mod replay;
pub mod retry;
pub mod rng;
pub mod shell;
pub mod store;

pub use ids::{TaskId, TaskIdError};
