//! The event loop, and [`Orchestrator`]: the public API for programs that drive tasks.
//!
//! One tokio task owns every loaded [`Task`] and the [`Store`]. Everything that happens reaches
//! it as a message on one channel: caller requests, provider outcomes (from spawned futures that
//! only perform one provider call and send its result back), timers and queries. For each event
//! the loop calls the pure [`step`], commits the transition (state, journal entry and the
//! commands to perform) in one SQLite transaction, and only then performs the commands.
//!
//! A task is driven by one process at a time: before a task is loaded the orchestrator takes an
//! exclusive `flock` on `<data dir>/locks/<task>.lock`, which the OS releases if the process dies
//! — or, on a PostgreSQL store that a fleet of servers shares, the task's lease, whose fencing
//! token every commit of the task carries (`owner`, `lease`, `fleet`).
//! The first time a process loads a task from the store, it applies [`Event::Loaded`], and the
//! core decides what to recover: it re-issues the operation in flight (every provider operation
//! but `exec` is idempotent by key), or probes the sandbox and holds requests until the answer;
//! with nothing in flight, nothing happens.
//!
//! The rooms: `api` (the [`Orchestrator`] and its builder), `results` (what requests return),
//! `error` ([`EngineError`]), `event_loop` (the loop and its messages), `perform` (commands to
//! provider calls and back to events), `gc`, `owner` (who may drive a task: `lock`, the per-task
//! `flock` of the SQLite store, or `lease`, a fleet's leases on a PostgreSQL store, with
//! `fleet` the loop's side of them), `paths` (where taskbox keeps its files) and `metrics` (the
//! process's Prometheus counters, which the loop, its calls and its leases bump).
//!
//! [`Task`]: crate::core::Task
//! [`Store`]: crate::store::Store
//! [`step`]: crate::core::step
//! [`Event::Loaded`]: crate::core::Event::Loaded

mod api;
mod batch;
mod checkpoint;
pub mod cost;
mod error;
mod event_loop;
mod fence;
mod fleet;
mod gc;
pub mod metrics;
// A lease's freshness is measured on this process's monotonic clock (`Instant`), and renewals
// are paced by a tokio sleep: a fleet server's own timers, never a simulation's.
#[cfg(feature = "postgres")]
#[allow(clippy::disallowed_methods)]
mod lease;
// Polling for a task lock held by another process: tokio's clock bounds the wait and a tokio
// sleep paces it, so both follow a paused clock in simulation.
#[allow(clippy::disallowed_methods)]
mod lock;
mod new_task;
mod owner;
mod paths;
mod reconfigure;
mod unload;
// Timers are tokio sleeps, so they follow a paused clock in simulation.
#[allow(clippy::disallowed_methods)]
mod perform;
mod results;

pub use api::{Orchestrator, OrchestratorBuilder};
pub use checkpoint::{rewind_to, CheckpointResult, RewindResult};
pub use error::{closest, EngineError};
pub use gc::{GcItem, GcReport};
#[cfg(feature = "server")]
pub(crate) use lock::try_flock;
pub use lock::LockWait;
pub use owner::owner_name;
pub use paths::{store_file, Paths, DATA_DIR_ENV, STORE_FILE};
pub use results::{
    as_removed, Encoding, ForkResult, RemoveResult, ResumeResult, RunResult, StateChange,
    SuspendResult, TaskView,
};
