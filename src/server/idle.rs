//! When an auto-started server may exit: no request in flight, none for
//! `terminal.server_idle_exit_seconds`, and no task with a live sandbox (a live sandbox always
//! has a live engine: its idle snapshot and its checkpoint are this server's timers).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::engine::Orchestrator;

/// Requests in flight and when the last one ended.
#[derive(Debug)]
pub struct Activity {
    in_flight: AtomicU64,
    last: Mutex<Instant>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            in_flight: AtomicU64::new(0),
            last: Mutex::new(Instant::now()),
        }
    }
}

/// One request being served; ending it (drop) marks the server active now.
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Activity {
    /// A request starts.
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.touch();
        Busy(self.clone())
    }

    /// Requests being served now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::SeqCst)
    }

    fn touch(&self) {
        if let Ok(mut last) = self.last.lock() {
            *last = Instant::now();
        }
    }

    fn idle_for(&self) -> Duration {
        if self.in_flight() > 0 {
            return Duration::ZERO;
        }
        self.last.lock().map_or(Duration::ZERO, |l| l.elapsed())
    }
}

/// Returns once the server has been idle for `limit` with no task holding a live sandbox (or
/// an operation in flight). Checks a few times per `limit`, at most every 5 s.
pub async fn wait_until_idle(activity: Arc<Activity>, orch: Orchestrator, limit: Duration) {
    let period = (limit / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        tokio::time::sleep(period).await;
        if activity.idle_for() < limit {
            continue;
        }
        match orch.loaded_tasks().await {
            Ok(tasks) => {
                let live = tasks
                    .iter()
                    .any(|t| t.sandbox.is_some() || t.state.is_transient());
                if !live {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the loaded tasks; staying up");
            }
        }
    }
}
