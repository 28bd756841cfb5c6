//! The pure core: the task lifecycle as data and one transition function.
//!
//! Nothing in this crate performs I/O, reads a clock or draws a random number: time comes in as
//! an argument (`now`, milliseconds since the UNIX epoch) and effects go out as [`Command`]s. This
//! is what makes the journal replayable (`taskbox replay`) and the lifecycle property-testable.
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
mod step;
mod types;

pub use ids::{TaskId, TaskIdError};
pub use step::{step, StepError, Transition};
pub use types::*;
