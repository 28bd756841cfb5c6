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
//!
//! The rooms: `view` holds the read-only copies handed to checkers, `world` the state behind the
//! mutex and the random draws, `ops` the platform operations and `exec` the running of a
//! command; this module holds the [`SimProvider`] itself and its [`SandboxProvider`](crate::provider::SandboxProvider) face.

mod exec;
mod faults;
mod ops;
mod program;
mod view;
mod world;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use faults::{SimFaults, SimFaultsError};
pub use view::{SimEnd, SimSandbox, SimSnapshot, SimStats};

use super::ProviderError;
use crate::clock::Clock;
use crate::core::Millis;
use world::{Plan, SplitMix64, World};

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
                rng: SplitMix64::new(seed),
                faults,
                max_lifetime_ms: None,
                sandboxes: BTreeMap::new(),
                by_name: BTreeMap::new(),
                snapshots: BTreeMap::new(),
                snapshot_keys: BTreeMap::new(),
                snapshotting: BTreeMap::new(),
                next_sandbox: 0,
                next_snapshot: 0,
                next_order: 0,
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

    /// Plans a call of `op` and, in the same turn of the world, draws its own fault `pick`.
    fn plan_and_draw(&self, op: &'static str, pick: fn(&SimFaults) -> f64) -> (Plan, bool) {
        let mut w = self.world();
        let plan = w.plan(op);
        let drawn = w.chance(pick);
        (plan, drawn)
    }

    /// Waits out `plan`'s latency, then fails the call if the plan rejects it (an answer the
    /// plan loses is lost after the call took effect: the caller returns that last).
    async fn admitted(plan: &Plan) -> Result<(), ProviderError> {
        Self::pause(plan.wait_ms()).await;
        plan.rejection().map_or(Ok(()), Err)
    }

    /// Waits out `plan`'s latency, then fails the call whole if the plan rejects it or loses
    /// its answer: for calls with nothing to do before the answer is lost (reads, and an exec,
    /// which must not run unseen).
    async fn answered(plan: &Plan) -> Result<(), ProviderError> {
        Self::pause(plan.wait_ms()).await;
        plan.rejection()
            .or_else(|| plan.lost_answer())
            .map_or(Ok(()), Err)
    }

    async fn pause(ms: u64) {
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}

// The simulated operations are inherent methods (in `ops.rs` and `exec.rs`) whose errors are
// already provider errors.
impl super::Platform for SimProvider {
    type Error = ProviderError;

    fn name(&self) -> &'static str {
        "sim"
    }

    async fn create_sandbox(
        &self,
        spec: &super::SandboxSpec,
    ) -> Result<super::SandboxInfo, ProviderError> {
        self.create(spec).await
    }

    async fn exec_live(
        &self,
        sandbox_id: &crate::ids::SandboxId,
        req: &super::ExecRequest,
        io: super::ExecIo,
    ) -> Result<super::ExecOutput, ProviderError> {
        let out = SimProvider::exec(self, sandbox_id, req).await?;
        io.forward_capture(&out).await;
        Ok(out)
    }

    async fn snapshot(
        &self,
        task_id: &crate::ids::TaskId,
        sandbox_id: &crate::ids::SandboxId,
        seq: u64,
    ) -> Result<super::SnapshotInfo, ProviderError> {
        SimProvider::snapshot(self, task_id, sandbox_id, seq).await
    }

    async fn stop_sandbox(&self, sandbox_id: &crate::ids::SandboxId) -> Result<(), ProviderError> {
        self.stop(sandbox_id).await
    }

    async fn extend_timeout(
        &self,
        sandbox_id: &crate::ids::SandboxId,
        duration_ms: u64,
    ) -> Result<Millis, ProviderError> {
        self.extend(sandbox_id, duration_ms).await
    }

    async fn delete_snapshot(
        &self,
        snapshot_id: &crate::ids::SnapshotId,
    ) -> Result<(), ProviderError> {
        self.delete_snapshot_op(snapshot_id).await
    }

    async fn probe_sandbox(
        &self,
        sandbox_id: &crate::ids::SandboxId,
    ) -> Result<Option<Millis>, ProviderError> {
        self.probe(sandbox_id).await
    }

    async fn list_sandboxes(
        &self,
        installation_id: &str,
    ) -> Result<Vec<super::ListedResource>, ProviderError> {
        self.list_sandboxes_op(installation_id).await
    }

    async fn list_snapshots(
        &self,
        installation_id: &str,
    ) -> Result<Vec<super::ListedResource>, ProviderError> {
        self.list_snapshots_op(installation_id).await
    }
}

#[cfg(test)]
mod tests;
