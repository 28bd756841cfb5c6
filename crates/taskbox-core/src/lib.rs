//! The pure core: the task lifecycle as data and one transition function.
//!
//! Nothing in this crate performs I/O, reads a clock or draws a random number: time comes in as
//! an argument (`now`, milliseconds since the UNIX epoch) and effects go out as [`Command`]s. This
//! is what makes the journal replayable (`taskbox replay`) and the lifecycle property-testable.
//!
//! # The purity rule
//!
//! - **No I/O**: no files, sockets, processes or environment variables. Effects are
//!   [`Command`]s for the caller to perform; their outcomes come back as [`Event`]s.
//! - **No clock**: every `now` is a [`Millis`] argument.
//! - **No randomness**: retry jitter is added by the executor, outside; the core computes the
//!   deterministic delay ([`RetryPolicy`]).
//! - **Only `serde` and `thiserror`** as dependencies: data has to be persisted and errors typed,
//!   nothing more. Adding a dependency means arguing here why it keeps the crate pure.
//!
//! # Why a crate of its own
//!
//! Inside the `taskbox` crate the rule was a convention: tokio, rusqlite, reqwest and the
//! injected clock were one `use` away, and only a review could catch a slip. As a separate crate
//! whose dependency list is the two above, reaching any of them is a compile error. What the
//! compiler cannot refuse is `std` itself (`std::fs`, `std::net`, `std::process`,
//! `std::time::SystemTime::now`, `std::env`): those stay a rule for review, with `taskbox replay`
//! as the backstop (its verify step re-runs [`step`] over a recorded journal and would show a
//! transition that no longer comes out the same).
//!
//! The `taskbox` crate re-exports this one as `taskbox::core`, and its [`ids`] as `taskbox::ids`,
//! so callers see the same paths as before.
//!
//! The lifecycle of one task:
//!
//! ```text
//!  idle ──run──▶ provisioning ──ready──▶ running ──suspend/idle/checkpoint──▶ snapshotting
//!   ▲                                      │  ▲                                   │
//!   │                       expiry, no snapshot                               snapshot taken
//!   └──────────────────────────────────────┘  └──ready── restoring ◀──run── expired ◀┘
//! ```

pub mod ids;
pub mod ledger;
pub mod reason;
pub mod retention;
mod step;
mod types;

pub use ids::{SandboxId, SnapshotId, TaskId, TaskIdError};
pub use reason::FailureReason;
pub use step::{step, StepError, Transition};
pub use types::*;
