//! The pure core: a model-based property test of `step` (in `model`), and table tests of chosen
//! transitions (in `transitions`) of recovery after a restart (in `recovery`) and of deadlines, late checkpoints, restore notes and the create bound (in `deadlines`). The start
//! time and the task settings they share live here.

mod busy;
mod checkpoints;
mod deadlines;
mod model;
mod reason;
mod recovery;
mod transitions;

use taskbox::core::{Millis, RetryPolicy, TaskSettings};

const T0: Millis = 1_000_000;

fn settings() -> TaskSettings {
    TaskSettings {
        persistent: true,
        sandbox_timeout_ms: 300_000,
        idle_lifetime_ms: 120_000,
        command_timeout_ms: 10_000,
        keep_snapshots: 2,
        checkpoint_margin_ms: 30_000,
        max_sandbox_lifetime_ms: 600_000,
        max_busy_ms: 0,
        retry: RetryPolicy {
            max_attempts: 3,
            initial_delay_ms: 100,
            max_delay_ms: 1_000,
            multiplier: 2,
        },
        late_checkpoint: false,
        reports_usage: false,
        live_checkpoint: false,
        record_kinds: false,
        checkpoint: taskbox::core::AutoCheckpoint::Off,
        keep_checkpoints: 0,
    }
}
