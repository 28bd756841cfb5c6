//! Everything the [`SimProvider`](super::SimProvider)'s mutex guards: the sandboxes and snapshots,
//! the counters, and the random stream every fault and latency is drawn from, in call order.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::Notify;

use super::{SimEnd, SimFaults, SimSandbox, SimSnapshot, SimStats};
use crate::core::Millis;
use crate::provider::{ProviderError, SandboxInfo, SnapshotInfo};
pub(super) use crate::rng::SplitMix64;

/// The transient fault (if any) drawn for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transient {
    None,
    /// 429 before the call takes effect.
    RateLimited {
        retry_after_ms: u64,
    },
    /// 5xx before the call takes effect.
    ServerError,
    /// The caller gave up waiting; see [`SimFaults::timeout`] for whether it took effect.
    TimedOut {
        after_ms: u64,
    },
}

/// What was drawn for one call at its start.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    op: &'static str,
    latency_ms: u64,
    transient: Transient,
}

impl Plan {
    /// How long the call takes before it answers.
    pub(super) fn wait_ms(&self) -> u64 {
        match self.transient {
            Transient::TimedOut { after_ms } => after_ms,
            _ => self.latency_ms,
        }
    }

    /// The error of a fault that strikes before the call takes effect.
    pub(super) fn rejection(&self) -> Option<ProviderError> {
        match self.transient {
            Transient::RateLimited { retry_after_ms } => Some(ProviderError::transient(
                self.op,
                format!("429 too many requests (simulated); retry after {retry_after_ms} ms"),
                Some(retry_after_ms),
            )),
            Transient::ServerError => Some(ProviderError::transient(
                self.op,
                "503 service unavailable (simulated)",
                None,
            )),
            Transient::TimedOut { .. } | Transient::None => None,
        }
    }

    /// The error of a timeout, whose call has taken effect by the time it is reported.
    pub(super) fn lost_answer(&self) -> Option<ProviderError> {
        match self.transient {
            Transient::TimedOut { after_ms } => Some(ProviderError::transient(
                self.op,
                format!("no answer within {after_ms} ms (simulated timeout)"),
                None,
            )),
            _ => None,
        }
    }
}

/// One sandbox in the world.
#[derive(Debug)]
pub(super) struct SandboxState {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) task_id: String,
    pub(super) installation_id: String,
    pub(super) generation: u64,
    pub(super) source_snapshot: Option<String>,
    pub(super) created_at: Millis,
    /// Its place in the platform's order of creations (see [`World::next_order`]).
    pub(super) order: u64,
    pub(super) deadline: Millis,
    pub(super) ended: Option<(SimEnd, Millis)>,
    pub(super) files: BTreeMap<String, String>,
    pub(super) running: BTreeMap<u64, String>,
    /// Woken whenever the sandbox stops or its deadline moves, so a command sleeping in it
    /// re-checks at once instead of at its own wake-up time.
    pub(super) changed: Arc<Notify>,
}

impl SandboxState {
    /// Marks the sandbox expired if its deadline has passed by `now`; returns whether it runs.
    pub(super) fn settle(&mut self, now: Millis) -> bool {
        if self.ended.is_none() && now >= self.deadline {
            self.end(SimEnd::Expired, self.deadline);
        }
        self.ended.is_none()
    }

    pub(super) fn end(&mut self, why: SimEnd, at: Millis) {
        if self.ended.is_none() {
            self.ended = Some((why, at));
            self.files.clear();
            self.changed.notify_waiters();
        }
    }

    pub(super) fn info(&self) -> SandboxInfo {
        SandboxInfo {
            id: self.id.as_str().into(),
            name: self.name.clone(),
            deadline: self.deadline,
        }
    }

    pub(super) fn view(&self) -> SimSandbox {
        SimSandbox {
            id: self.id.clone(),
            name: self.name.clone(),
            task_id: self.task_id.clone(),
            installation_id: self.installation_id.clone(),
            generation: self.generation,
            source_snapshot: self.source_snapshot.clone(),
            created_at: self.created_at,
            order: self.order,
            deadline: self.deadline,
            alive: self.ended.is_none(),
            ended: self.ended,
            files: self.files.clone(),
            running: self.running.values().cloned().collect(),
        }
    }
}

/// One snapshot in the world.
#[derive(Debug)]
pub(super) struct SnapshotState {
    pub(super) id: String,
    pub(super) task_id: String,
    pub(super) seq: u64,
    pub(super) installation_id: String,
    pub(super) sandbox_id: String,
    pub(super) files: BTreeMap<String, String>,
    pub(super) created_at: Millis,
    /// Its place in the platform's order of creations (see [`World::next_order`]).
    pub(super) order: u64,
    pub(super) expires_at: Option<Millis>,
    pub(super) deleted: bool,
}

impl SnapshotState {
    pub(super) fn expired(&self, now: Millis) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }

    pub(super) fn present(&self, now: Millis) -> bool {
        !self.deleted && !self.expired(now)
    }

    pub(super) fn size_bytes(&self) -> u64 {
        self.files
            .iter()
            .map(|(p, c)| (p.len() + c.len()) as u64)
            .sum()
    }

    pub(super) fn info(&self) -> SnapshotInfo {
        SnapshotInfo {
            id: self.id.as_str().into(),
            size_bytes: self.size_bytes(),
            expires_at: self.expires_at,
            omitted: Vec::new(),
            usage: None,
            resources: None,
        }
    }

    pub(super) fn view(&self, now: Millis) -> SimSnapshot {
        SimSnapshot {
            id: self.id.clone(),
            task_id: self.task_id.clone(),
            seq: self.seq,
            installation_id: self.installation_id.clone(),
            sandbox_id: self.sandbox_id.clone(),
            files: self.files.clone(),
            created_at: self.created_at,
            order: self.order,
            expires_at: self.expires_at,
            deleted: self.deleted,
            expired: self.expired(now),
        }
    }
}

/// Everything the mutex guards.
#[derive(Debug)]
pub(super) struct World {
    pub(super) rng: SplitMix64,
    pub(super) faults: SimFaults,
    pub(super) max_lifetime_ms: Option<u64>,
    pub(super) sandboxes: BTreeMap<String, SandboxState>,
    /// The latest sandbox created under each name.
    pub(super) by_name: BTreeMap<String, String>,
    pub(super) snapshots: BTreeMap<String, SnapshotState>,
    /// (task id, seq) → snapshot id: the snapshot operation's idempotency key.
    pub(super) snapshot_keys: BTreeMap<(String, u64), String>,
    /// Snapshot calls under way (that will reach the platform), per sandbox: while one is, the
    /// sandbox is "snapshotting" and another snapshot call gets 422, as on Vercel.
    pub(super) snapshotting: BTreeMap<String, u32>,
    pub(super) next_sandbox: u64,
    pub(super) next_snapshot: u64,
    /// Sandboxes and snapshots made so far, together: the platform's total order of creations,
    /// which tells apart two made in the same millisecond.
    pub(super) next_order: u64,
    pub(super) next_command: u64,
    pub(super) stats: SimStats,
}

impl World {
    /// Counts the call and draws its latency and transient fault, always in the same order so
    /// that the random stream depends only on the sequence of calls.
    pub(super) fn plan(&mut self, op: &'static str) -> Plan {
        self.stats.call(op);
        let f = &self.faults;
        let latency_ms = self.rng.between(f.latency_min_ms, f.latency_max_ms);
        let rate_limited = self.rng.chance(f.rate_limit);
        let server_error = self.rng.chance(f.server_error);
        let timed_out = self.rng.chance(f.timeout);
        let transient = if rate_limited {
            self.stats.fault("rate_limit");
            Transient::RateLimited {
                retry_after_ms: self.rng.between(1, f.retry_after_ms.max(1)),
            }
        } else if server_error {
            self.stats.fault("server_error");
            Transient::ServerError
        } else if timed_out {
            self.stats.fault("timeout");
            Transient::TimedOut {
                after_ms: f.timeout_ms,
            }
        } else {
            Transient::None
        };
        Plan {
            op,
            latency_ms,
            transient,
        }
    }

    /// Draws one fault decision at the rate `pick` chooses.
    pub(super) fn chance(&mut self, pick: fn(&SimFaults) -> f64) -> bool {
        let p = pick(&self.faults);
        self.rng.chance(p)
    }

    /// The sandbox `id` if it is still running at `now`.
    pub(super) fn live_sandbox(&mut self, id: &str, now: Millis) -> Option<&mut SandboxState> {
        self.sandboxes
            .get_mut(id)
            .and_then(|sb| if sb.settle(now) { Some(sb) } else { None })
    }

    /// The sandbox `id` if it is still running at `now`, or the `op` failure that says how it
    /// is gone.
    pub(super) fn live_or_gone(
        &mut self,
        op: &'static str,
        id: &str,
        now: Millis,
    ) -> Result<&mut SandboxState, ProviderError> {
        match self.sandboxes.get_mut(id) {
            Some(sb) => {
                if sb.settle(now) {
                    Ok(sb)
                } else {
                    Err(World::gone(op, id, Some(sb)))
                }
            }
            None => Err(World::gone(op, id, None)),
        }
    }

    pub(super) fn gone(op: &'static str, id: &str, sb: Option<&SandboxState>) -> ProviderError {
        let why = match sb.and_then(|s| s.ended) {
            Some((SimEnd::Stopped, at)) => format!("sandbox {id} was stopped at {at}"),
            Some((SimEnd::Snapshotted, at)) => {
                format!("sandbox {id} stopped at {at} when it was snapshotted")
            }
            Some((SimEnd::Expired, at)) => format!("sandbox {id} expired at its deadline {at}"),
            None => format!("no sandbox {id}"),
        };
        ProviderError::sandbox_gone(op, format!("410 sandbox_stopped: {why}"))
    }
}
