//! The engine's clock, injected so that replay and simulation run on virtual time.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::core::Millis;

/// A source of "now".
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the UNIX epoch.
    fn now_ms(&self) -> Millis;

    /// Whether this is the virtual clock of a simulation ([`TokioClock`]): waits in real time
    /// (a task lock held for a moment) must then keep the order of events as well as the time.
    fn is_virtual(&self) -> bool {
        false
    }
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
///
/// The one virtual clock: simulation, chaos runs and benchmarks read it, and re-drive also
/// converts journal times to tokio instants with it ([`TokioClock::instant`],
/// [`TokioClock::sleep_until`]) so that it can wait for a recorded time.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin_ms: Millis,
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading `origin_ms` now (call inside the runtime whose time it follows).
    pub fn starting_at(origin_ms: Millis) -> TokioClock {
        TokioClock {
            origin_ms,
            origin: tokio::time::Instant::now(),
        }
    }

    /// The tokio instant at which this clock reads `ms` (its origin, for earlier times).
    pub fn instant(&self, ms: Millis) -> tokio::time::Instant {
        self.origin + std::time::Duration::from_millis(ms.saturating_sub(self.origin_ms))
    }

    /// Waits until the clock reads `ms`.
    pub async fn sleep_until(&self, ms: Millis) {
        tokio::time::sleep_until(self.instant(ms)).await
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> Millis {
        self.origin_ms + self.origin.elapsed().as_millis() as Millis
    }

    fn is_virtual(&self) -> bool {
        true
    }
}

/// Formats `ms` as an RFC 3339 UTC timestamp with milliseconds.
pub fn format_ms(ms: Millis) -> String {
    let t = UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// A real-time measure of how long something took, for `/metrics` only (`crate::engine::metrics`):
/// what it reads never reaches the core, the journal or a decision, so it is not the engine's
/// (possibly virtual) clock.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(std::time::Instant);

impl Stopwatch {
    /// Starts measuring now.
    pub fn start() -> Stopwatch {
        Stopwatch(std::time::Instant::now())
    }

    /// Seconds since [`Stopwatch::start`].
    pub fn elapsed_secs(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}
