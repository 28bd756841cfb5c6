//! The engine's clock, injected so that replay and simulation run on virtual time.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::core::Millis;

/// A source of "now".
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the UNIX epoch.
    fn now_ms(&self) -> Millis;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as Millis)
            .unwrap_or(0)
    }
}

/// A clock that follows tokio's (possibly paused) time from a fixed starting point: with
/// `tokio::time::pause()` it advances only when every task is waiting on a timer.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin_ms: Millis,
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading `origin_ms` now.
    pub fn starting_at(origin_ms: Millis) -> TokioClock {
        TokioClock {
            origin_ms,
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> Millis {
        self.origin_ms + self.origin.elapsed().as_millis() as Millis
    }
}

/// Formats `ms` as an RFC 3339 UTC timestamp with milliseconds.
pub fn format_ms(ms: Millis) -> String {
    let t = UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}
