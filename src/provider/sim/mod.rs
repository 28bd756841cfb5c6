//! The simulated sandbox platform: an in-memory world that behaves like Vercel Sandbox and fails
//! the way it does, reproducibly from a seed (FoundationDB / TigerBeetle VOPR style).
//!
//! [`SimProvider`] holds the whole world (sandboxes with a model filesystem, snapshots, counters)
//! behind one `std::sync::Mutex` that is never held across an await. Every random decision (a
//! fault, a latency) is drawn from its own splitmix64 generator, inside a call, in the order calls
//! arrive; time is read only from the injected [`Clock`] and spent only with `tokio::time::sleep`.
//! Run on a current-thread runtime under `tokio::time::pause()` with a
//! [`TokioClock`](crate::clock::TokioClock), the same seed and the same sequence of calls give the
//! same outcomes, bit for bit, in no wall time at all. (A multi-thread runtime may reorder
//! concurrent calls, and with them the draws.)
//!
//! What the world models (see "Lifecycle facts" in the Vercel reference):
//! - A create is idempotent by name: while the sandbox named `spec.name` is alive, a create
//!   returns it. (Once it is gone, the name may be used again: a new sandbox gets a new id.)
//! - A sandbox is gone at its deadline, checked lazily against the clock at each call; a command
//!   that would run past the deadline sleeps until the deadline and fails with "sandbox gone".
//! - A snapshot copies the files and stops the sandbox; it is idempotent by (task id, seq).
//!   Creating from a deleted or expired snapshot is "snapshot gone".
//! - Commands are a tiny language (`write`, `append`, `cat`, `rm`, `sleep`, `exit`, `true`; see
//!   the `program` submodule), so tests can check that files survive a snapshot and a restore.
//!   A command's timeout kills the command (exit 124), never the sandbox.
//!
//! Faults ([`SimFaults`]) are injected per call; each one injected is counted in [`SimStats`].
//! The read-only views ([`SimProvider::live_sandboxes`], [`SimProvider::snapshots`],
//! [`SimProvider::files_of`], [`SimProvider::stats`]) are the ground truth that invariant checkers
//! compare the engine's beliefs against; they draw no randomness and cost no virtual time.

mod faults;
mod program;

use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

pub use faults::{SimFaults, SimFaultsError};

use super::{
    bound_output, ExecOutput, ExecRequest, ListedResource, ProviderError, ProviderFuture,
    SandboxInfo, SandboxProvider, SandboxSpec, SnapshotInfo, MAX_OUTPUT_CHARS,
};
use crate::clock::Clock;
use crate::core::{FailureKind, Millis};
use program::{Flow, Shell, Step};

/// A snapshot's lifetime when no fault shortens it (Vercel's v2 default: 30 days).
pub const DEFAULT_SNAPSHOT_EXPIRY_MS: u64 = 30 * 24 * 3600 * 1000;

/// The shortest creation timeout and timeout extension the platform accepts (Vercel: 1000 ms).
pub const MIN_TIMEOUT_MS: u64 = 1_000;

// Operation names, as counted in `SimStats::calls` and used in error messages.
const OP_CREATE: &str = "create sandbox";
const OP_EXEC: &str = "run command";
const OP_SNAPSHOT: &str = "snapshot";
const OP_STOP: &str = "stop sandbox";
const OP_EXTEND: &str = "extend timeout";
const OP_DELETE: &str = "delete snapshot";
const OP_PROBE: &str = "probe sandbox";
const OP_LIST_SANDBOXES: &str = "list sandboxes";
const OP_LIST_SNAPSHOTS: &str = "list snapshots";

/// Why a simulated sandbox is no longer running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SimEnd {
    /// `stop_sandbox` stopped it.
    Stopped,
    /// A snapshot stopped it.
    Snapshotted,
    /// Its deadline passed.
    Expired,
}

/// A read-only copy of one simulated sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimSandbox {
    /// Provider handle.
    pub id: String,
    /// Stable name from the create spec.
    pub name: String,
    /// The owning task.
    pub task_id: String,
    /// The installation that owns it.
    pub installation_id: String,
    /// Which creation of the task's sandbox it is.
    pub generation: u64,
    /// The snapshot its files came from.
    pub source_snapshot: Option<String>,
    /// When it was created.
    pub created_at: Millis,
    /// When the platform stops it (moved by extensions and expiry faults).
    pub deadline: Millis,
    /// Whether it is still running.
    pub alive: bool,
    /// Why and when it stopped, once it has.
    pub ended: Option<(SimEnd, Millis)>,
    /// Its filesystem (empty once it has stopped: the files are discarded).
    pub files: BTreeMap<String, String>,
    /// The commands running in it now.
    pub running: Vec<String>,
}

/// A read-only copy of one simulated snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimSnapshot {
    /// Provider id.
    pub id: String,
    /// The task it was taken for.
    pub task_id: String,
    /// The task's sequence number for it (its idempotency key, with the task id).
    pub seq: u64,
    /// The installation that owns it.
    pub installation_id: String,
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    /// The files it holds (kept after deletion or expiry, for diagnosis).
    pub files: BTreeMap<String, String>,
    /// When it was taken.
    pub created_at: Millis,
    /// When it expires (`None`: never).
    pub expires_at: Option<Millis>,
    /// Whether `delete_snapshot` removed it.
    pub deleted: bool,
    /// Whether it has expired.
    pub expired: bool,
}

impl SimSnapshot {
    /// Whether a restore from it would succeed now.
    pub fn present(&self) -> bool {
        !self.deleted && !self.expired
    }
}

/// What the simulation has done so far: calls per operation, faults per kind, effects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimStats {
    /// Calls per operation (`create sandbox`, `run command`, ...).
    pub calls: BTreeMap<String, u64>,
    /// Faults injected per kind (the [`SimFaults`] field names).
    pub faults: BTreeMap<String, u64>,
    /// Sandboxes actually created (a create that found its sandbox by name does not count).
    pub sandboxes_created: u64,
    /// Snapshots actually taken.
    pub snapshots_taken: u64,
    /// Commands that started running.
    pub commands_run: u64,
}

impl SimStats {
    /// Faults injected in total.
    pub fn total_faults(&self) -> u64 {
        self.faults.values().sum()
    }

    fn call(&mut self, op: &'static str) {
        *self.calls.entry(op.to_string()).or_default() += 1;
    }

    fn fault(&mut self, kind: &'static str) {
        *self.faults.entry(kind.to_string()).or_default() += 1;
    }
}

/// splitmix64: tiny, fast, and good enough to decide faults; its whole state is the seed.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `p` (never for `p <= 0` or NaN, always for `p >= 1`).
    fn chance(&mut self, p: f64) -> bool {
        let x = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        x < p
    }

    /// Uniform in `[lo, hi]` (the bounds in either order).
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
        match (hi - lo).checked_add(1) {
            Some(span) => lo + self.next_u64() % span,
            None => self.next_u64(),
        }
    }
}

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
struct Plan {
    op: &'static str,
    latency_ms: u64,
    transient: Transient,
}

impl Plan {
    /// How long the call takes before it answers.
    fn wait_ms(&self) -> u64 {
        match self.transient {
            Transient::TimedOut { after_ms } => after_ms,
            _ => self.latency_ms,
        }
    }

    /// The error of a fault that strikes before the call takes effect.
    fn rejection(&self) -> Option<ProviderError> {
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
    fn lost_answer(&self) -> Option<ProviderError> {
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
struct SandboxState {
    id: String,
    name: String,
    task_id: String,
    installation_id: String,
    generation: u64,
    source_snapshot: Option<String>,
    created_at: Millis,
    deadline: Millis,
    ended: Option<(SimEnd, Millis)>,
    files: BTreeMap<String, String>,
    running: BTreeMap<u64, String>,
    /// Woken whenever the sandbox stops or its deadline moves, so a command sleeping in it
    /// re-checks at once instead of at its own wake-up time.
    changed: Arc<Notify>,
}

impl SandboxState {
    /// Marks the sandbox expired if its deadline has passed by `now`; returns whether it runs.
    fn settle(&mut self, now: Millis) -> bool {
        if self.ended.is_none() && now >= self.deadline {
            self.end(SimEnd::Expired, self.deadline);
        }
        self.ended.is_none()
    }

    fn end(&mut self, why: SimEnd, at: Millis) {
        if self.ended.is_none() {
            self.ended = Some((why, at));
            self.files.clear();
            self.changed.notify_waiters();
        }
    }

    fn info(&self) -> SandboxInfo {
        SandboxInfo {
            id: self.id.clone(),
            name: self.name.clone(),
            deadline: self.deadline,
        }
    }

    fn view(&self) -> SimSandbox {
        SimSandbox {
            id: self.id.clone(),
            name: self.name.clone(),
            task_id: self.task_id.clone(),
            installation_id: self.installation_id.clone(),
            generation: self.generation,
            source_snapshot: self.source_snapshot.clone(),
            created_at: self.created_at,
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
struct SnapshotState {
    id: String,
    task_id: String,
    seq: u64,
    installation_id: String,
    sandbox_id: String,
    files: BTreeMap<String, String>,
    created_at: Millis,
    expires_at: Option<Millis>,
    deleted: bool,
}

impl SnapshotState {
    fn expired(&self, now: Millis) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }

    fn present(&self, now: Millis) -> bool {
        !self.deleted && !self.expired(now)
    }

    fn size_bytes(&self) -> u64 {
        self.files
            .iter()
            .map(|(p, c)| (p.len() + c.len()) as u64)
            .sum()
    }

    fn info(&self) -> SnapshotInfo {
        SnapshotInfo {
            id: self.id.clone(),
            size_bytes: self.size_bytes(),
            expires_at: self.expires_at,
        }
    }

    fn view(&self, now: Millis) -> SimSnapshot {
        SimSnapshot {
            id: self.id.clone(),
            task_id: self.task_id.clone(),
            seq: self.seq,
            installation_id: self.installation_id.clone(),
            sandbox_id: self.sandbox_id.clone(),
            files: self.files.clone(),
            created_at: self.created_at,
            expires_at: self.expires_at,
            deleted: self.deleted,
            expired: self.expired(now),
        }
    }
}

/// Everything the mutex guards.
#[derive(Debug)]
struct World {
    rng: SplitMix64,
    faults: SimFaults,
    max_lifetime_ms: Option<u64>,
    sandboxes: BTreeMap<String, SandboxState>,
    /// The latest sandbox created under each name.
    by_name: BTreeMap<String, String>,
    snapshots: BTreeMap<String, SnapshotState>,
    /// (task id, seq) → snapshot id: the snapshot operation's idempotency key.
    snapshot_keys: BTreeMap<(String, u64), String>,
    next_sandbox: u64,
    next_snapshot: u64,
    next_command: u64,
    stats: SimStats,
}

impl World {
    /// Counts the call and draws its latency and transient fault, always in the same order so
    /// that the random stream depends only on the sequence of calls.
    fn plan(&mut self, op: &'static str) -> Plan {
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
    fn chance(&mut self, pick: fn(&SimFaults) -> f64) -> bool {
        let p = pick(&self.faults);
        self.rng.chance(p)
    }

    /// The sandbox `id` if it is still running at `now`.
    fn live_sandbox(&mut self, id: &str, now: Millis) -> Option<&mut SandboxState> {
        self.sandboxes
            .get_mut(id)
            .and_then(|sb| if sb.settle(now) { Some(sb) } else { None })
    }

    fn gone(op: &'static str, id: &str, sb: Option<&SandboxState>) -> ProviderError {
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

/// Takes a command off its sandbox's running list when the command ends, or when the caller
/// drops the call's future part-way (the engine cancelling it).
struct RunningGuard<'a> {
    provider: &'a SimProvider,
    sandbox_id: &'a str,
    command_no: u64,
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        if let Some(sb) = self.provider.world().sandboxes.get_mut(self.sandbox_id) {
            sb.running.remove(&self.command_no);
        }
    }
}

/// A deterministic, fault-injecting, in-memory sandbox platform. Cheap to share: wrap it in an
/// `Arc` and hand the same one to the engine and to the invariant checker.
pub struct SimProvider {
    clock: Arc<dyn Clock>,
    world: Mutex<World>,
}

impl std::fmt::Debug for SimProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimProvider").finish_non_exhaustive()
    }
}

impl SimProvider {
    /// A world with nothing in it, whose every random decision follows from `seed`.
    pub fn new(seed: u64, faults: SimFaults, clock: Arc<dyn Clock>) -> SimProvider {
        SimProvider {
            clock,
            world: Mutex::new(World {
                rng: SplitMix64(seed),
                faults,
                max_lifetime_ms: None,
                sandboxes: BTreeMap::new(),
                by_name: BTreeMap::new(),
                snapshots: BTreeMap::new(),
                snapshot_keys: BTreeMap::new(),
                next_sandbox: 0,
                next_snapshot: 0,
                next_command: 0,
                stats: SimStats::default(),
            }),
        }
    }

    /// Caps a sandbox's total lifetime (creation timeout plus extensions), as a plan does:
    /// beyond it, a create or an extension is refused as invalid. No cap by default.
    pub fn with_max_lifetime_ms(self, max_lifetime_ms: u64) -> SimProvider {
        self.world().max_lifetime_ms = Some(max_lifetime_ms);
        self
    }

    /// Replaces the fault rates from now on (e.g. a chaos run's fault-free recovery phase).
    pub fn set_faults(&self, faults: SimFaults) {
        self.world().faults = faults;
    }

    /// The fault rates in force.
    pub fn faults(&self) -> SimFaults {
        self.world().faults.clone()
    }

    /// The sandboxes running now, ordered by task id then sandbox id.
    pub fn live_sandboxes(&self) -> Vec<SimSandbox> {
        let mut v: Vec<SimSandbox> = self
            .all_sandboxes()
            .into_iter()
            .filter(|s| s.alive)
            .collect();
        v.sort_by(|a, b| (&a.task_id, &a.id).cmp(&(&b.task_id, &b.id)));
        v
    }

    /// Every sandbox ever created, running or not, in creation order.
    pub fn all_sandboxes(&self) -> Vec<SimSandbox> {
        let now = self.clock.now_ms();
        let mut w = self.world();
        w.sandboxes
            .values_mut()
            .map(|sb| {
                sb.settle(now);
                sb.view()
            })
            .collect()
    }

    /// Every snapshot ever taken, in creation order, with its deleted and expired flags.
    pub fn snapshots(&self) -> Vec<SimSnapshot> {
        let now = self.clock.now_ms();
        self.world()
            .snapshots
            .values()
            .map(|s| s.view(now))
            .collect()
    }

    /// The files of a running sandbox (`None` if it is unknown or no longer running).
    pub fn files_of(&self, sandbox_id: &str) -> Option<BTreeMap<String, String>> {
        let now = self.clock.now_ms();
        self.world()
            .live_sandbox(sandbox_id, now)
            .map(|sb| sb.files.clone())
    }

    /// Calls and faults so far.
    pub fn stats(&self) -> SimStats {
        self.world().stats.clone()
    }

    /// Makes a snapshot expire now (a restore from it will be "snapshot gone"). Returns whether
    /// the snapshot exists.
    pub fn expire_snapshot_now(&self, snapshot_id: &str) -> bool {
        let now = self.clock.now_ms();
        match self.world().snapshots.get_mut(snapshot_id) {
            Some(s) => {
                if !s.expired(now) {
                    s.expires_at = Some(now);
                }
                true
            }
            None => false,
        }
    }

    /// Makes a sandbox reach its deadline now; a command running in it fails at once. Returns
    /// whether the sandbox was running.
    pub fn expire_sandbox_now(&self, sandbox_id: &str) -> bool {
        let now = self.clock.now_ms();
        match self.world().live_sandbox(sandbox_id, now) {
            Some(sb) => {
                sb.deadline = now;
                sb.end(SimEnd::Expired, now);
                true
            }
            None => false,
        }
    }

    fn world(&self) -> MutexGuard<'_, World> {
        // A panic while the world was locked can only come from a bug in this module; the world
        // is still the best record of what happened, so keep serving it.
        self.world
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now(&self) -> Millis {
        self.clock.now_ms()
    }

    fn plan(&self, op: &'static str) -> Plan {
        self.world().plan(op)
    }

    async fn pause(ms: u64) {
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, ProviderError> {
        let (plan, lose) = {
            let mut w = self.world();
            let plan = w.plan(OP_CREATE);
            let lose = w.chance(|f| f.lost_create);
            (plan, lose)
        };
        Self::pause(plan.wait_ms()).await;
        if let Some(e) = plan.rejection() {
            return Err(e);
        }
        let now = self.now();
        let mut w = self.world();
        let w = &mut *w;
        if spec.name.is_empty() {
            return Err(ProviderError::new(
                FailureKind::Invalid,
                OP_CREATE,
                "400 bad_request: the sandbox name is empty",
            ));
        }
        if spec.timeout_ms < MIN_TIMEOUT_MS {
            return Err(ProviderError::new(
                FailureKind::Invalid,
                OP_CREATE,
                format!(
                    "400 bad_request: `timeout` should be >= {MIN_TIMEOUT_MS} ms, got {}",
                    spec.timeout_ms
                ),
            ));
        }
        if let Some(max) = w.max_lifetime_ms.filter(|max| spec.timeout_ms > *max) {
            return Err(ProviderError::new(
                FailureKind::Invalid,
                OP_CREATE,
                format!(
                    "400 bad_request: `timeout` should be <= {max} ms (the plan's maximum), got {}",
                    spec.timeout_ms
                ),
            ));
        }
        let existing = w.by_name.get(&spec.name).cloned();
        let found = existing.and_then(|id| w.live_sandbox(&id, now).map(|sb| sb.info()));
        let info = match found {
            Some(info) => info,
            None => {
                let files = match &spec.source_snapshot {
                    None => BTreeMap::new(),
                    Some(snap_id) => match w.snapshots.get(snap_id) {
                        Some(s) if s.present(now) => s.files.clone(),
                        Some(s) => {
                            let why = if s.deleted { "was deleted" } else { "expired" };
                            return Err(ProviderError::snapshot_gone(
                                OP_CREATE,
                                format!("410 snapshot_not_found: snapshot {snap_id} {why}"),
                            ));
                        }
                        None => {
                            return Err(ProviderError::snapshot_gone(
                                OP_CREATE,
                                format!("410 snapshot_not_found: no snapshot {snap_id}"),
                            ))
                        }
                    },
                };
                w.next_sandbox += 1;
                let sb = SandboxState {
                    id: format!("sim-sbx-{:06}", w.next_sandbox),
                    name: spec.name.clone(),
                    task_id: spec.task_id.clone(),
                    installation_id: spec.installation_id.clone(),
                    generation: spec.generation,
                    source_snapshot: spec.source_snapshot.clone(),
                    created_at: now,
                    deadline: now.saturating_add(spec.timeout_ms),
                    ended: None,
                    files,
                    running: BTreeMap::new(),
                    changed: Arc::new(Notify::new()),
                };
                let info = sb.info();
                w.stats.sandboxes_created += 1;
                w.by_name.insert(sb.name.clone(), sb.id.clone());
                w.sandboxes.insert(sb.id.clone(), sb);
                info
            }
        };
        if let Some(e) = plan.lost_answer() {
            return Err(e);
        }
        if lose {
            w.stats.fault("lost_create");
            return Err(ProviderError::transient(
                OP_CREATE,
                format!(
                    "connection reset before the answer arrived (simulated; sandbox {} exists)",
                    spec.name
                ),
                None,
            ));
        }
        Ok(info)
    }

    async fn exec(&self, sandbox_id: &str, req: &ExecRequest) -> Result<ExecOutput, ProviderError> {
        let steps = program::parse(&req.command);
        // Every random value is drawn here, at the call's start, so the stream follows the order
        // calls arrive in. `cut`: where the deadline falls inside the command, if it is cut short.
        let (plan, cut) = {
            let mut w = self.world();
            let plan = w.plan(OP_EXEC);
            let cut_short = w.chance(|f| f.expire_mid_command);
            let needed = program::total_sleep_ms(&steps).min(req.timeout_ms);
            let cut = cut_short.then(|| w.rng.between(0, needed));
            (plan, cut)
        };
        Self::pause(plan.wait_ms()).await;
        if let Some(e) = plan.rejection().or_else(|| plan.lost_answer()) {
            // A timed-out exec never reached the sandbox: commands are not idempotent, and a
            // command that ran unseen would make "files survive" impossible to check.
            return Err(e);
        }
        let start = self.now();
        let timeout_end = start.saturating_add(req.timeout_ms);
        let (changed, command_no) = {
            let mut w = self.world();
            let w = &mut *w;
            let command_no = w.next_command;
            let Some(sb) = w.live_sandbox(sandbox_id, start) else {
                return Err(World::gone(
                    OP_EXEC,
                    sandbox_id,
                    w.sandboxes.get(sandbox_id),
                ));
            };
            let pulled = match cut {
                Some(cut) if start.saturating_add(cut) < sb.deadline => {
                    sb.deadline = start.saturating_add(cut);
                    true
                }
                _ => false,
            };
            if pulled {
                w.stats.fault("expire_mid_command");
            }
            let Some(sb) = w.live_sandbox(sandbox_id, start) else {
                return Err(World::gone(
                    OP_EXEC,
                    sandbox_id,
                    w.sandboxes.get(sandbox_id),
                ));
            };
            sb.running.insert(command_no, req.command.clone());
            let changed = sb.changed.clone();
            w.next_command += 1;
            w.stats.commands_run += 1;
            (changed, command_no)
        };
        let _running = RunningGuard {
            provider: self,
            sandbox_id,
            command_no,
        };
        let (shell, timed_out) = self
            .run_steps(sandbox_id, &steps, start, timeout_end, &changed)
            .await?;
        let end = self.now();
        Ok(ExecOutput {
            exit_code: if timed_out { 124 } else { shell.status },
            timed_out,
            stdout: bound_output(&shell.stdout, MAX_OUTPUT_CHARS),
            stderr: bound_output(&shell.stderr, MAX_OUTPUT_CHARS),
            duration_ms: end.saturating_sub(start),
        })
    }

    /// Runs the steps: instantaneous ones under the lock, `sleep`s on virtual time, stopping at
    /// the command timeout (`Ok` with `timed_out`) or when the sandbox goes (`Err`).
    async fn run_steps(
        &self,
        sandbox_id: &str,
        steps: &[Step],
        start: Millis,
        timeout_end: Millis,
        changed: &Notify,
    ) -> Result<(Shell, bool), ProviderError> {
        let mut shell = Shell::default();
        let mut next = 0;
        // Virtual time this command has provably reached: a sleep to `limit` ends at `limit`
        // even if the clock reads a rounding step behind.
        let mut reached = start;
        loop {
            // Run every step up to the next sleep (or the end) at one instant.
            let sleep_until = {
                let now = self.now().max(reached);
                let mut w = self.world();
                let Some(sb) = w.live_sandbox(sandbox_id, now) else {
                    return Err(World::gone(
                        OP_EXEC,
                        sandbox_id,
                        w.sandboxes.get(sandbox_id),
                    ));
                };
                loop {
                    let Some(step) = steps.get(next) else {
                        return Ok((shell, false));
                    };
                    if let Step::Sleep { ms } = step {
                        shell.status = 0;
                        break now.saturating_add(*ms);
                    }
                    next += 1;
                    if shell.apply(step, &mut sb.files) == Flow::Exit {
                        return Ok((shell, false));
                    }
                }
            };
            // Sleep, waking early if the sandbox stops or its deadline moves.
            loop {
                let mut notified = pin!(changed.notified());
                let (now, limit) = {
                    let now = self.now().max(reached);
                    let mut w = self.world();
                    let Some(sb) = w.live_sandbox(sandbox_id, now) else {
                        return Err(World::gone(
                            OP_EXEC,
                            sandbox_id,
                            w.sandboxes.get(sandbox_id),
                        ));
                    };
                    // Registered while the world is locked, so no change can slip in between
                    // this check and the wait.
                    notified.as_mut().enable();
                    if now >= sleep_until {
                        break;
                    }
                    if now >= timeout_end {
                        return Ok((shell, true));
                    }
                    (now, sleep_until.min(timeout_end).min(sb.deadline))
                };
                tokio::select! {
                    () = Self::pause(limit - now) => reached = limit,
                    () = notified => {}
                }
            }
            next += 1;
        }
    }

    async fn snapshot(
        &self,
        task_id: &str,
        sandbox_id: &str,
        seq: u64,
    ) -> Result<SnapshotInfo, ProviderError> {
        let (plan, fail_permanent, fail_transient, slow, gone_soon) = {
            let mut w = self.world();
            let plan = w.plan(OP_SNAPSHOT);
            let fail_permanent = w.chance(|f| f.snapshot_fail_permanent);
            let fail_transient = w.chance(|f| f.snapshot_fail_transient);
            let slow = w.chance(|f| f.snapshot_slow);
            // How soon the snapshot expires, if it is one that is later gone.
            let gone_soon = w.chance(|f| f.snapshot_gone).then(|| {
                let max = w.faults.snapshot_gone_after_ms.max(1);
                w.rng.between(1, max)
            });
            (plan, fail_permanent, fail_transient, slow, gone_soon)
        };
        Self::pause(plan.wait_ms()).await;
        if let Some(e) = plan.rejection() {
            return Err(e);
        }
        let key = (task_id.to_string(), seq);
        let taken = self.world().snapshot_keys.contains_key(&key);
        if slow && !taken {
            let slow_ms = {
                let mut w = self.world();
                w.stats.fault("snapshot_slow");
                w.faults.snapshot_slow_ms
            };
            Self::pause(slow_ms).await;
        }
        let now = self.now();
        let mut w = self.world();
        let w = &mut *w;
        let info = if let Some(id) = w.snapshot_keys.get(&key) {
            let s = w
                .snapshots
                .get(id)
                .expect("every snapshot key points at a stored snapshot");
            if !s.present(now) {
                return Err(ProviderError::snapshot_gone(
                    OP_SNAPSHOT,
                    format!(
                        "410 snapshot_not_found: snapshot {id} (task {task_id}, seq {seq}) is gone"
                    ),
                ));
            }
            s.info()
        } else {
            let Some(sb) = w.live_sandbox(sandbox_id, now) else {
                return Err(World::gone(
                    OP_SNAPSHOT,
                    sandbox_id,
                    w.sandboxes.get(sandbox_id),
                ));
            };
            if sb.task_id != task_id {
                return Err(ProviderError::new(
                    FailureKind::Invalid,
                    OP_SNAPSHOT,
                    format!(
                        "sandbox {sandbox_id} belongs to task {}, not to task {task_id}",
                        sb.task_id
                    ),
                ));
            }
            if fail_transient {
                w.stats.fault("snapshot_fail_transient");
                return Err(ProviderError::transient(
                    OP_SNAPSHOT,
                    format!("422 sandbox_snapshotting: snapshot of {sandbox_id} did not complete (simulated); try again"),
                    None,
                ));
            }
            if fail_permanent {
                w.stats.fault("snapshot_fail_permanent");
                return Err(ProviderError::new(
                    FailureKind::Permanent,
                    OP_SNAPSHOT,
                    format!("snapshot of {sandbox_id} failed (simulated)"),
                ));
            }
            let files = std::mem::take(&mut sb.files);
            let installation_id = sb.installation_id.clone();
            sb.end(SimEnd::Snapshotted, now);
            let expires_at = if let Some(after) = gone_soon {
                w.stats.fault("snapshot_gone");
                now.saturating_add(after)
            } else {
                now.saturating_add(DEFAULT_SNAPSHOT_EXPIRY_MS)
            };
            w.next_snapshot += 1;
            let s = SnapshotState {
                id: format!("sim-snap-{:06}", w.next_snapshot),
                task_id: task_id.to_string(),
                seq,
                installation_id,
                sandbox_id: sandbox_id.to_string(),
                files,
                created_at: now,
                expires_at: Some(expires_at),
                deleted: false,
            };
            let info = s.info();
            w.stats.snapshots_taken += 1;
            w.snapshot_keys.insert(key, s.id.clone());
            w.snapshots.insert(s.id.clone(), s);
            info
        };
        if let Some(e) = plan.lost_answer() {
            return Err(e);
        }
        Ok(info)
    }

    async fn stop(&self, sandbox_id: &str) -> Result<(), ProviderError> {
        let plan = self.plan(OP_STOP);
        Self::pause(plan.wait_ms()).await;
        if let Some(e) = plan.rejection() {
            return Err(e);
        }
        let now = self.now();
        if let Some(sb) = self.world().live_sandbox(sandbox_id, now) {
            sb.end(SimEnd::Stopped, now);
        }
        plan.lost_answer().map_or(Ok(()), Err)
    }

    async fn extend(&self, sandbox_id: &str, duration_ms: u64) -> Result<Millis, ProviderError> {
        let plan = self.plan(OP_EXTEND);
        Self::pause(plan.wait_ms()).await;
        if let Some(e) = plan.rejection() {
            return Err(e);
        }
        let now = self.now();
        let mut w = self.world();
        let w = &mut *w;
        if duration_ms < MIN_TIMEOUT_MS {
            return Err(ProviderError::new(
                FailureKind::Invalid,
                OP_EXTEND,
                format!("400 bad_request: `duration` should be >= {MIN_TIMEOUT_MS} ms, got {duration_ms}"),
            ));
        }
        let max = w.max_lifetime_ms;
        let Some(sb) = w.live_sandbox(sandbox_id, now) else {
            return Err(World::gone(
                OP_EXTEND,
                sandbox_id,
                w.sandboxes.get(sandbox_id),
            ));
        };
        let deadline = sb.deadline.saturating_add(duration_ms);
        if let Some(max) = max.filter(|max| deadline - sb.created_at > *max) {
            return Err(ProviderError::new(
                FailureKind::Invalid,
                OP_EXTEND,
                format!(
                    "400 bad_request: extending {sandbox_id} by {duration_ms} ms would exceed the plan's \
                     maximum lifetime of {max} ms"
                ),
            ));
        }
        sb.deadline = deadline;
        sb.changed.notify_waiters();
        plan.lost_answer().map_or(Ok(deadline), Err)
    }

    async fn delete_snapshot_op(&self, snapshot_id: &str) -> Result<(), ProviderError> {
        let (plan, fail) = {
            let mut w = self.world();
            let plan = w.plan(OP_DELETE);
            let fail = w.chance(|f| f.delete_fail);
            (plan, fail)
        };
        Self::pause(plan.wait_ms()).await;
        if let Some(e) = plan.rejection() {
            return Err(e);
        }
        let mut w = self.world();
        if fail {
            w.stats.fault("delete_fail");
            return Err(ProviderError::transient(
                OP_DELETE,
                format!(
                    "500 internal_server_error: deleting snapshot {snapshot_id} failed (simulated)"
                ),
                None,
            ));
        }
        // Unknown, deleted and expired snapshots are all "gone", and deleting a gone snapshot
        // succeeds (a 404 on the platform).
        if let Some(s) = w.snapshots.get_mut(snapshot_id) {
            s.deleted = true;
        }
        plan.lost_answer().map_or(Ok(()), Err)
    }

    async fn probe(&self, sandbox_id: &str) -> Result<Option<Millis>, ProviderError> {
        let plan = self.plan(OP_PROBE);
        Self::pause(plan.wait_ms()).await;
        if let Some(e) = plan.rejection().or_else(|| plan.lost_answer()) {
            return Err(e);
        }
        let now = self.now();
        Ok(self
            .world()
            .live_sandbox(sandbox_id, now)
            .map(|sb| sb.deadline))
    }

    async fn list_sandboxes_op(
        &self,
        installation_id: &str,
    ) -> Result<Vec<ListedResource>, ProviderError> {
        let plan = self.plan(OP_LIST_SANDBOXES);
        Self::pause(plan.wait_ms()).await;
        if let Some(e) = plan.rejection().or_else(|| plan.lost_answer()) {
            return Err(e);
        }
        let now = self.now();
        let mut w = self.world();
        Ok(w.sandboxes
            .values_mut()
            .filter(|sb| sb.installation_id == installation_id)
            .map(|sb| ListedResource {
                live: sb.settle(now),
                id: sb.id.clone(),
                task_id: Some(sb.task_id.clone()),
            })
            .collect())
    }

    async fn list_snapshots_op(
        &self,
        installation_id: &str,
    ) -> Result<Vec<ListedResource>, ProviderError> {
        let plan = self.plan(OP_LIST_SNAPSHOTS);
        Self::pause(plan.wait_ms()).await;
        if let Some(e) = plan.rejection().or_else(|| plan.lost_answer()) {
            return Err(e);
        }
        let now = self.now();
        let w = self.world();
        Ok(w.snapshots
            .values()
            .filter(|s| s.installation_id == installation_id)
            .map(|s| ListedResource {
                id: s.id.clone(),
                task_id: Some(s.task_id.clone()),
                live: s.present(now),
            })
            .collect())
    }
}

impl SandboxProvider for SimProvider {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn create_sandbox<'a>(&'a self, spec: &'a SandboxSpec) -> ProviderFuture<'a, SandboxInfo> {
        Box::pin(self.create(spec))
    }

    fn exec<'a>(
        &'a self,
        sandbox_id: &'a str,
        req: &'a ExecRequest,
    ) -> ProviderFuture<'a, ExecOutput> {
        Box::pin(SimProvider::exec(self, sandbox_id, req))
    }

    fn snapshot<'a>(
        &'a self,
        task_id: &'a str,
        sandbox_id: &'a str,
        seq: u64,
    ) -> ProviderFuture<'a, SnapshotInfo> {
        Box::pin(SimProvider::snapshot(self, task_id, sandbox_id, seq))
    }

    fn stop_sandbox<'a>(&'a self, sandbox_id: &'a str) -> ProviderFuture<'a, ()> {
        Box::pin(self.stop(sandbox_id))
    }

    fn extend_timeout<'a>(
        &'a self,
        sandbox_id: &'a str,
        duration_ms: u64,
    ) -> ProviderFuture<'a, Millis> {
        Box::pin(self.extend(sandbox_id, duration_ms))
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> ProviderFuture<'a, ()> {
        Box::pin(self.delete_snapshot_op(snapshot_id))
    }

    fn probe_sandbox<'a>(&'a self, sandbox_id: &'a str) -> ProviderFuture<'a, Option<Millis>> {
        Box::pin(self.probe(sandbox_id))
    }

    fn list_sandboxes<'a>(
        &'a self,
        installation_id: &'a str,
    ) -> ProviderFuture<'a, Vec<ListedResource>> {
        Box::pin(self.list_sandboxes_op(installation_id))
    }

    fn list_snapshots<'a>(
        &'a self,
        installation_id: &'a str,
    ) -> ProviderFuture<'a, Vec<ListedResource>> {
        Box::pin(self.list_snapshots_op(installation_id))
    }
}

#[cfg(test)]
mod tests;
