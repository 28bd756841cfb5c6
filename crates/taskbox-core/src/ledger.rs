//! The cost ledger: what a task used, folded from its journal and nothing else.
//!
//! The figures come only from journal entries — the event applied and the task after it — so
//! that a journal, exported or replayed, gives back the same ledger. What a platform reports of
//! a session (Vercel's `activeCpuDurationMs`, vCPUs, memory, start and stop, transfer) travels
//! in the event by which the engine learns that the session ended: [`Event::SnapshotTaken`]
//! (taskbox's snapshot stopped it), [`Event::SandboxProbed`] (found stopped: timed out, a
//! persistent sandbox's own snapshot, stopped by someone else) or [`Event::SandboxStopped`]
//! (taskbox stopped it without a snapshot), each as `usage`; a session that ended without the
//! platform being asked (its deadline passed while the engine watched, a command or snapshot
//! found it gone) is read afterwards ([`Event::UsageRead`]), and one the platform did not
//! answer for is counted as unknown. A session reported twice (a probe
//! during a snapshot, then the snapshot) is counted once, at its first report. Sandbox time,
//! creations and snapshot storage are read from the lifecycle itself, so they are known on
//! every backend.
//!
//! Units: memory GB are MB / 1024 (Vercel's 2048 MB per vCPU is 2 GB), byte GB are 10^9 bytes, a
//! month is 30 days. A session's usage is counted in the window where its report was journaled;
//! sandbox time and snapshot storage are clipped to the window.
//!
//! A snapshot shared by a fork is counted to every task that retains it (each task's figure is
//! what it keeps stored), and once in a total over several tasks ([`Ledger::sum`] merges the
//! spans of one snapshot id).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::types::{Event, Millis, Resources, SessionUsage, SnapshotStatus, Task};

/// An hour in milliseconds.
pub const HOUR_MS: u64 = 3_600_000;
/// A month (30 days) in milliseconds: the unit of snapshot storage.
pub const MONTH_MS: u64 = 30 * 24 * HOUR_MS;
/// Bytes in a GB of storage or transfer.
pub const BYTES_PER_GB: f64 = 1e9;
/// MB in a GB of memory.
pub const MB_PER_GB: f64 = 1024.0;

/// The time a ledger covers, `from` to `until` (both milliseconds since the epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// Start (inclusive).
    pub from: Millis,
    /// End (inclusive): usually now.
    pub until: Millis,
}

impl Window {
    /// All of time up to `until`.
    pub fn until(until: Millis) -> Window {
        Window { from: 0, until }
    }

    fn contains(&self, at: Millis) -> bool {
        at >= self.from && at <= self.until
    }

    /// `[a, b)` clipped to the window, or `None` when nothing of it is inside.
    fn clip(&self, a: Millis, b: Millis) -> Option<(Millis, Millis)> {
        let (a, b) = (a.max(self.from), b.min(self.until));
        (a < b).then_some((a, b))
    }
}

/// A time during which a task retained a snapshot on the provider, clipped to the window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotSpan {
    /// The provider's snapshot id.
    pub snapshot_id: SnapshotId,
    /// Its size.
    pub size_bytes: u64,
    /// From.
    pub from: Millis,
    /// Until.
    pub until: Millis,
}

/// What one task (or, summed, several) used in a window.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// Sandboxes created (fresh or restored).
    pub creations: u64,
    /// Wall time with a live sandbox, ms.
    pub sandbox_ms: u64,
    /// Sessions whose usage the platform reported.
    pub sessions_reported: u64,
    /// Sessions that ended without the platform reporting their usage when asked
    /// ([`Event::UsageRead`] with none): their CPU, memory and transfer are missing from the
    /// figures. Absent (0) in ledgers serialized before it existed.
    #[serde(default)]
    pub sessions_unknown: u64,
    /// Active CPU the platform reported, ms.
    pub active_cpu_ms: u64,
    /// Provisioned memory times session wall time, MB·ms.
    pub memory_mb_ms: u64,
    /// Network transfer the platform reported, bytes.
    pub transfer_bytes: u64,
    /// The snapshots retained and when.
    pub snapshot_spans: Vec<SnapshotSpan>,
    /// The snapshots still retained at the end of the window, by id, with their sizes.
    pub snapshots_kept: BTreeMap<SnapshotId, u64>,
    /// What each sandbox generation's processes used, oldest first: as its snapshot ended it
    /// (the [`Event::SnapshotTaken`]'s `resources`), else as last sampled
    /// ([`Event::ActivitySampled`]), or on Vercel the active CPU its session reported. Absent
    /// (empty) where nothing was measured, and in ledgers serialized before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<GenerationResources>,
}

/// What one sandbox generation's processes used (see [`Resources`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationResources {
    /// The task it belongs to (several when ledgers are summed).
    pub task_id: TaskId,
    /// Which creation of the task's sandbox.
    pub generation: u64,
    /// The sandbox.
    pub sandbox_id: SandboxId,
    /// What it used.
    pub resources: Resources,
    /// When that was read.
    pub read_at: Millis,
    /// The generation had ended when it was read (its final figures); else it is live and may
    /// use more.
    pub ended: bool,
}

impl Ledger {
    /// The figures of every generation together: CPU time and IO added, the highest peak.
    pub fn resources_total(&self) -> Resources {
        let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, b) => a.or(b),
        };
        self.resources
            .iter()
            .fold(Resources::default(), |t, g| Resources {
                cpu_usec: add(t.cpu_usec, g.resources.cpu_usec),
                memory_peak_bytes: t.memory_peak_bytes.max(g.resources.memory_peak_bytes),
                io_bytes: add(t.io_bytes, g.resources.io_bytes),
            })
    }
}

/// Folds a task's journal entries, oldest first, into its [`Ledger`].
#[derive(Clone, Debug)]
pub struct LedgerBuilder {
    window: Window,
    ledger: Ledger,
    live: Option<(SandboxId, Millis)>,
    held: BTreeMap<SnapshotId, (u64, Millis)>,
    /// The sessions whose usage was counted (or reported before the window): each once.
    reported: BTreeSet<SandboxId>,
    /// When the task stopped retaining snapshots for good
    /// ([`retention_ends`](crate::retention::retention_ends)).
    retention_ends: Option<Millis>,
}

impl LedgerBuilder {
    /// An empty ledger over `window`.
    pub fn new(window: Window) -> LedgerBuilder {
        LedgerBuilder {
            window,
            ledger: Ledger::default(),
            live: None,
            held: BTreeMap::new(),
            reported: BTreeSet::new(),
            retention_ends: None,
        }
    }

    /// The builder of a task that stopped retaining snapshots at `end` (a `taskbox rm` that did
    /// not keep them: [`retention_ends`](crate::retention::retention_ends)): the journal keeps
    /// the records as they were before the removal, and no snapshot storage is counted after it.
    pub fn retention_ends(mut self, end: Option<Millis>) -> LedgerBuilder {
        self.retention_ends = end;
        self
    }

    /// Applies one journal entry: at `at`, `event` left the task as `after`. Entries must come
    /// oldest first; one after the window's end is ignored.
    pub fn apply(&mut self, at: Millis, event: &Event, after: &Task) {
        let w = self.window;
        // The ledger is of the task as it stood at the window's end: later entries are not in it.
        if at > w.until {
            return;
        }
        if matches!(event, Event::SandboxReady { .. }) && w.contains(at) {
            self.ledger.creations += 1;
        }
        // A session's usage, once, from the first event that reported it.
        let reported = match event {
            Event::SnapshotTaken {
                seq,
                usage: Some(u),
                ..
            } => Some((
                after
                    .snapshots
                    .iter()
                    .find(|s| s.seq == *seq)
                    .map(|s| &s.sandbox_id),
                u,
            )),
            Event::SandboxProbed {
                sandbox_id,
                usage: Some(u),
                ..
            }
            | Event::SandboxStopped {
                sandbox_id,
                usage: Some(u),
            }
            | Event::UsageRead {
                sandbox_id,
                usage: Some(u),
            } => Some((Some(sandbox_id), u)),
            // Asked, and the platform did not say: unknown, unless reported before.
            Event::UsageRead {
                sandbox_id,
                usage: None,
            } => {
                if self.reported.insert(sandbox_id.clone()) && w.contains(at) {
                    self.ledger.sessions_unknown += 1;
                }
                None
            }
            _ => None,
        };
        if let Some((session, u)) = reported {
            let first = session.is_none_or(|id| self.reported.insert(id.clone()));
            if first && w.contains(at) {
                self.count_usage(at, u);
                if let (Some(id), Some(cpu_ms)) = (session, u.active_cpu_ms) {
                    let cpu = Resources {
                        cpu_usec: Some(cpu_ms.saturating_mul(1000)),
                        ..Resources::default()
                    };
                    self.record_resources(after, id, cpu, at, true);
                }
            }
        }
        self.fold_resources(at, event, after);
        // Sandbox time: from the entry that made a sandbox the task's to the one that ended it.
        let now_live = after.sandbox.as_ref().map(|s| &s.id);
        if self.live.as_ref().map(|(id, _)| id) != now_live {
            self.close_sandbox(at);
            self.live = now_live.map(|id| (id.clone(), at));
        }
        // Snapshot storage: while the task retains the snapshot on the provider, and never
        // after its retention ended (entries journaled after a removal still list the records).
        let ended = self.retention_ends.filter(|end| at >= *end);
        let retained: BTreeMap<&SnapshotId, u64> = after
            .snapshots
            .iter()
            .filter(|s| {
                ended.is_none()
                    && matches!(
                        s.status,
                        SnapshotStatus::Complete | SnapshotStatus::Deleting
                    )
            })
            .filter_map(|s| s.id.as_ref().map(|id| (id, s.size_bytes)))
            .collect();
        let dropped: Vec<SnapshotId> = self
            .held
            .keys()
            .filter(|id| !retained.contains_key(id))
            .cloned()
            .collect();
        for id in dropped {
            if let Some((size, from)) = self.held.remove(&id) {
                self.push_span(id, size, from, ended.unwrap_or(at));
            }
        }
        for (id, size) in retained {
            self.held.entry(id.clone()).or_insert((size, at));
        }
    }

    /// A generation's resources from the entry: the snapshot that ended it, or a sample.
    fn fold_resources(&mut self, at: Millis, event: &Event, after: &Task) {
        match event {
            Event::SnapshotTaken {
                resources: Some(r), ..
            } => {
                // The sandbox it ended was the task's until this entry.
                if let Some(id) = self.live.as_ref().map(|(id, _)| id.clone()) {
                    self.record_resources(after, &id, *r, at, true);
                }
            }
            Event::ActivitySampled { .. } => {
                if let Some(sb) = after.sandbox.as_ref() {
                    if let Some(a) = sb.activity {
                        let id = sb.id.clone();
                        self.record_resources(after, &id, a.resources, a.sampled_at, false);
                    }
                }
            }
            _ => {}
        }
    }

    fn record_resources(
        &mut self,
        task: &Task,
        sandbox_id: &SandboxId,
        resources: Resources,
        read_at: Millis,
        ended: bool,
    ) {
        let list = &mut self.ledger.resources;
        let generation = match task.sandbox.as_ref().filter(|s| &s.id == sandbox_id) {
            Some(sb) => sb.generation,
            None => list
                .iter()
                .find(|g| &g.sandbox_id == sandbox_id)
                .map_or(task.generation, |g| g.generation),
        };
        let g = GenerationResources {
            task_id: task.id.clone(),
            generation,
            sandbox_id: sandbox_id.clone(),
            resources,
            read_at,
            ended,
        };
        match list.iter_mut().find(|g| &g.sandbox_id == sandbox_id) {
            Some(found) if !found.ended => *found = g,
            // A final figure stays final; a later report only adds what it lacked.
            Some(found) => found.resources = found.resources.merge(resources),
            None => list.push(g),
        }
    }

    fn count_usage(&mut self, at: Millis, u: &SessionUsage) {
        let l = &mut self.ledger;
        l.sessions_reported += 1;
        l.active_cpu_ms = l.active_cpu_ms.saturating_add(u.active_cpu_ms.unwrap_or(0));
        let wall = u.stopped_at.unwrap_or(at).saturating_sub(u.started_at);
        l.memory_mb_ms = l
            .memory_mb_ms
            .saturating_add(u64::from(u.memory_mb).saturating_mul(wall));
        l.transfer_bytes = l
            .transfer_bytes
            .saturating_add(u.transfer_bytes.unwrap_or(0));
    }

    fn close_sandbox(&mut self, at: Millis) {
        if let Some((_, from)) = self.live.take() {
            if let Some((a, b)) = self.window.clip(from, at) {
                self.ledger.sandbox_ms = self.ledger.sandbox_ms.saturating_add(b - a);
            }
        }
    }

    fn push_span(&mut self, snapshot_id: SnapshotId, size_bytes: u64, from: Millis, to: Millis) {
        if let Some((from, until)) = self.window.clip(from, to) {
            self.ledger.snapshot_spans.push(SnapshotSpan {
                snapshot_id,
                size_bytes,
                from,
                until,
            });
        }
    }

    /// The ledger, with what is still live or retained counted up to the window's end.
    pub fn finish(mut self) -> Ledger {
        let until = self.window.until;
        self.close_sandbox(until);
        let ended = self.retention_ends.filter(|end| *end <= until);
        for (id, (size, from)) in std::mem::take(&mut self.held) {
            if ended.is_none() {
                self.ledger.snapshots_kept.insert(id.clone(), size);
            }
            self.push_span(id, size, from, ended.unwrap_or(until));
        }
        self.ledger
    }
}

impl Ledger {
    /// The ledger of one task's journal entries (`(at, event, task after)`, oldest first).
    pub fn of<'a>(
        window: Window,
        entries: impl IntoIterator<Item = (Millis, &'a Event, &'a Task)>,
    ) -> Ledger {
        let mut b = LedgerBuilder::new(window);
        for (at, event, after) in entries {
            b.apply(at, event, after);
        }
        b.finish()
    }

    /// The total of several tasks' ledgers: counters add up, a snapshot several tasks retain
    /// (a fork's) is counted once.
    pub fn sum<'a>(ledgers: impl IntoIterator<Item = &'a Ledger>) -> Ledger {
        let mut t = Ledger::default();
        for l in ledgers {
            t.creations += l.creations;
            t.sandbox_ms = t.sandbox_ms.saturating_add(l.sandbox_ms);
            t.sessions_reported += l.sessions_reported;
            t.sessions_unknown += l.sessions_unknown;
            t.active_cpu_ms = t.active_cpu_ms.saturating_add(l.active_cpu_ms);
            t.memory_mb_ms = t.memory_mb_ms.saturating_add(l.memory_mb_ms);
            t.transfer_bytes = t.transfer_bytes.saturating_add(l.transfer_bytes);
            t.snapshot_spans.extend(l.snapshot_spans.iter().cloned());
            t.snapshots_kept
                .extend(l.snapshots_kept.iter().map(|(k, v)| (k.clone(), *v)));
            t.resources.extend(l.resources.iter().cloned());
        }
        t
    }

    /// Sandbox time, hours.
    pub fn sandbox_hours(&self) -> f64 {
        self.sandbox_ms as f64 / HOUR_MS as f64
    }

    /// Active CPU, vCPU-hours.
    pub fn vcpu_hours(&self) -> f64 {
        self.active_cpu_ms as f64 / HOUR_MS as f64
    }

    /// Provisioned memory, GB-hours.
    pub fn memory_gb_hours(&self) -> f64 {
        self.memory_mb_ms as f64 / MB_PER_GB / HOUR_MS as f64
    }

    /// Network transfer, GB.
    pub fn transfer_gb(&self) -> f64 {
        self.transfer_bytes as f64 / BYTES_PER_GB
    }

    /// Bytes of snapshots retained at the end of the window.
    pub fn snapshot_bytes_kept(&self) -> u64 {
        self.snapshots_kept.values().sum()
    }

    /// Snapshot storage, GB-months: each snapshot's size times the time some task retained it
    /// (spans of one id merged, so a shared snapshot counts once).
    pub fn snapshot_gb_months(&self) -> f64 {
        let mut by_id: BTreeMap<&SnapshotId, Vec<&SnapshotSpan>> = BTreeMap::new();
        for s in &self.snapshot_spans {
            by_id.entry(&s.snapshot_id).or_default().push(s);
        }
        let mut byte_ms = 0f64;
        for spans in by_id.values_mut() {
            spans.sort_by_key(|s| s.from);
            let mut cur: Option<(Millis, Millis, u64)> = None;
            for s in spans.iter() {
                cur = match cur {
                    Some((a, b, size)) if s.from <= b => Some((a, b.max(s.until), size)),
                    Some((a, b, size)) => {
                        byte_ms += size as f64 * (b - a) as f64;
                        Some((s.from, s.until, s.size_bytes))
                    }
                    None => Some((s.from, s.until, s.size_bytes)),
                };
            }
            if let Some((a, b, size)) = cur {
                byte_ms += size as f64 * (b - a) as f64;
            }
        }
        byte_ms / BYTES_PER_GB / MONTH_MS as f64
    }

    /// What it costs at `prices`.
    pub fn estimate(&self, prices: &Prices) -> Estimate {
        let active_cpu = self.vcpu_hours() * prices.active_cpu_hour;
        let memory = self.memory_gb_hours() * prices.memory_gb_hour;
        let creations = self.creations as f64 / 1e6 * prices.creations_per_million;
        let transfer = self.transfer_gb() * prices.transfer_gb;
        let snapshots = self.snapshot_gb_months() * prices.snapshot_gb_month;
        Estimate {
            active_cpu,
            memory,
            creations,
            transfer,
            snapshots,
            total: active_cpu + memory + creations + transfer + snapshots,
        }
    }
}

/// List prices in USD (the `cost.*` config keys).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prices {
    /// Per hour of active CPU.
    pub active_cpu_hour: f64,
    /// Per GB-hour of provisioned memory.
    pub memory_gb_hour: f64,
    /// Per million sandbox creations.
    pub creations_per_million: f64,
    /// Per GB of network transfer.
    pub transfer_gb: f64,
    /// Per GB-month of snapshot storage.
    pub snapshot_gb_month: f64,
}

impl Default for Prices {
    /// Vercel's published Pro list prices (2025–26).
    fn default() -> Self {
        Prices {
            active_cpu_hour: 0.128,
            memory_gb_hour: 0.0212,
            creations_per_million: 0.60,
            transfer_gb: 0.15,
            snapshot_gb_month: 0.08,
        }
    }
}

/// A ledger priced, USD.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Active CPU.
    pub active_cpu: f64,
    /// Provisioned memory.
    pub memory: f64,
    /// Creations.
    pub creations: f64,
    /// Network transfer.
    pub transfer: f64,
    /// Snapshot storage.
    pub snapshots: f64,
    /// The sum.
    pub total: f64,
}
