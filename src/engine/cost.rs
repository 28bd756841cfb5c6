//! `taskbox cost`: a task's ledger read from its journal in the store (read-only, like `show`
//! and `tasks`: no provider, no lock, no server), and its JSON form, shared by `cost --json`,
//! `show --json` and `tasks --json`.
//!
//! The ledger itself is [`crate::core::ledger`]: a pure fold over journal entries, so a replayed
//! or exported journal gives the same figures. Prices apply to the Vercel backend only; the
//! local backend's ledger is in resource units.

use crate::core::ledger::{Ledger, LedgerBuilder, Prices, Window};
use crate::core::retention;
use crate::core::{Millis, Resources};
use crate::ids::TaskId;
use crate::store::{JournalEntry, Store};

use super::EngineError;

/// Whether the ledger of a task on `backend` (as its journal names it) is priced: its
/// backend's registry entry says so ([`Entry::priced`](crate::provider::registry::Entry::priced)).
pub fn is_priced(backend: Option<&str>) -> bool {
    backend
        .and_then(crate::provider::registry::named)
        .is_some_and(|entry| entry.priced)
}

/// What the output says of an estimate.
pub const ESTIMATE_BASIS: &str = "estimate at list price";

/// The ledger of journal entries (one task's, oldest first).
pub fn ledger_of(entries: &[JournalEntry], window: Window) -> Ledger {
    Ledger::of(
        window,
        entries.iter().map(|e| (e.at, &e.event, &e.task_after)),
    )
}

/// One task's ledger over `window`, from its journal in `store` and its removal mark, with its
/// backend (`None` when no engine recorded one yet).
pub fn task_ledger(
    store: &Store,
    task: &TaskId,
    window: Window,
) -> Result<(Ledger, Option<String>), EngineError> {
    let entries = store.journal(task.as_str())?;
    let marks = store.task_marks(task.as_str())?.unwrap_or_default();
    // A task `taskbox rm` removed without keeping its snapshots retains none after its removal,
    // whatever its journal's last record of them says.
    let mut b = LedgerBuilder::new(window).retention_ends(retention::retention_ends(
        marks.removed_at,
        marks.kept_snapshots,
    ));
    for e in &entries {
        b.apply(e.at, &e.event, &e.task_after);
    }
    Ok((b.finish(), marks.backend))
}

/// Reads a `--since` duration: a whole number and a unit, `s`, `m`, `h`, `d` or `w` (`7d`,
/// `12h`), in milliseconds.
pub fn parse_since(text: &str) -> Result<u64, SinceError> {
    let t = text.trim();
    let bad = |why: &str| SinceError {
        given: text.to_string(),
        why: why.to_string(),
    };
    let split = t
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| bad("it has no unit"))?;
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(bad("it does not start with a number"));
    }
    let n: u64 = num.parse().map_err(|_| bad("the number is too large"))?;
    let unit_ms: u64 = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "w" => 7 * 86_400_000,
        _ => return Err(bad(&format!("`{unit}` is not a unit"))),
    };
    if n == 0 {
        return Err(bad("it is zero"));
    }
    n.checked_mul(unit_ms).ok_or_else(|| bad("it is too long"))
}

/// A `--since` that does not read as a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid --since `{given}`: {why}")]
pub struct SinceError {
    /// What was given.
    pub given: String,
    /// What is wrong with it.
    pub why: String,
}

impl SinceError {
    /// How to write one.
    pub fn hint(&self) -> &'static str {
        "give a whole number and a unit: s, m, h, d or w (e.g. --since 7d, --since 12h)"
    }
}

/// The window of `--since` (milliseconds back from `now`), or all time.
pub fn window(since_ms: Option<u64>, now: Millis) -> Window {
    Window {
        from: since_ms.map_or(0, |s| now.saturating_sub(s)),
        until: now,
    }
}

/// The figures of [`Resources`] as JSON: CPU seconds, peak memory and IO bytes, each `null`
/// where not measured.
fn figures_json(r: &Resources) -> serde_json::Value {
    serde_json::json!({
        "cpu_seconds": r.cpu_usec.map(|us| us as f64 / 1e6),
        "memory_peak_bytes": r.memory_peak_bytes,
        "io_bytes": r.io_bytes,
    })
}

/// What the sandboxes' processes used: the total (CPU and IO added, the highest peak) and
/// each generation's.
fn resources_json(ledger: &Ledger) -> serde_json::Value {
    let mut v = figures_json(&ledger.resources_total());
    v["generations"] = ledger
        .resources
        .iter()
        .map(|g| {
            let mut one = figures_json(&g.resources);
            one["task"] = g.task_id.as_str().into();
            one["generation"] = g.generation.into();
            one["sandbox_id"] = g.sandbox_id.as_str().into();
            one["read_at"] = g.read_at.into();
            one["ended"] = g.ended.into();
            one
        })
        .collect();
    v
}

/// A ledger as JSON: the resource figures, and for the Vercel backend the estimate at `prices`.
pub fn ledger_json(ledger: &Ledger, backend: Option<&str>, prices: &Prices) -> serde_json::Value {
    let priced = is_priced(backend);
    let mut v = serde_json::json!({
        "backend": backend,
        "sandbox_seconds": ledger.sandbox_ms / 1000,
        "sandbox_hours": ledger.sandbox_hours(),
        "creations": ledger.creations,
        "snapshot_bytes_kept": ledger.snapshot_bytes_kept(),
        "snapshots_kept": ledger.snapshots_kept.len(),
        "snapshot_gb_months": ledger.snapshot_gb_months(),
    });
    if !ledger.resources.is_empty() {
        v["resources"] = resources_json(ledger);
    }
    if priced {
        let e = ledger.estimate(prices);
        v["sessions_reported"] = ledger.sessions_reported.into();
        v["sessions_unknown"] = ledger.sessions_unknown.into();
        v["vcpu_hours"] = ledger.vcpu_hours().into();
        v["memory_gb_hours"] = ledger.memory_gb_hours().into();
        v["transfer_gb"] = ledger.transfer_gb().into();
        v["estimate_usd"] = serde_json::json!({
            "basis": ESTIMATE_BASIS,
            "active_cpu": e.active_cpu,
            "memory": e.memory,
            "creations": e.creations,
            "transfer": e.transfer,
            "snapshots": e.snapshots,
            "total": e.total,
        });
    }
    v
}

/// One task's row of a cost report: the task, its ledger over the window, its backend.
pub type CostRow = (TaskId, Ledger, Option<String>);

impl super::Orchestrator {
    /// The ledgers `taskbox cost` reports, read on the event loop from the store (as `show`
    /// reads): `task`'s alone ([`EngineError::NoTask`] when there is no such task), or every
    /// task that used something in `window`.
    pub async fn ledgers(
        &self,
        task: Option<TaskId>,
        window: Window,
    ) -> Result<Vec<CostRow>, EngineError> {
        self.query(move |lp| {
            let all = task.is_none();
            let ids = match task {
                Some(t) if lp.store.load_task(t.as_str())?.is_some() => vec![t],
                Some(t) => {
                    let names = lp.store.task_ids()?;
                    return Err(EngineError::NoTask {
                        suggestion: super::closest(t.as_str(), names.iter().map(TaskId::as_str)),
                        task: t,
                    });
                }
                None => lp.store.task_ids()?,
            };
            let mut rows = Vec::with_capacity(ids.len());
            for id in ids {
                let (ledger, backend) = task_ledger(&lp.store, &id, window)?;
                rows.push((id, ledger, backend));
            }
            if all {
                rows.retain(|(_, l, _)| *l != Ledger::default());
            }
            Ok(rows)
        })
        .await
    }
}

/// `taskbox cost --json` (and `GET /v1/cost`): each row's ledger as [`ledger_json`] with its
/// task, the window, and with `totals` (one ledger per backend, a snapshot shared by forks
/// counted once) when the report is of every task (`all`).
pub fn report_json(
    rows: &[CostRow],
    prices: &Prices,
    since: Option<&str>,
    window: Window,
    all: bool,
) -> serde_json::Value {
    let tasks: Vec<serde_json::Value> = rows
        .iter()
        .map(|(id, l, b)| {
            let mut v = ledger_json(l, b.as_deref(), prices);
            v["task"] = id.as_str().into();
            v
        })
        .collect();
    let mut out = serde_json::json!({
        "since": since,
        "from": crate::clock::format_ms(window.from),
        "until": crate::clock::format_ms(window.until),
        "tasks": tasks,
    });
    if all {
        let mut by: std::collections::BTreeMap<String, Vec<&Ledger>> = Default::default();
        for (_, l, b) in rows {
            by.entry(b.clone().unwrap_or_else(|| "unknown".into()))
                .or_default()
                .push(l);
        }
        out["totals"] = by
            .into_iter()
            .map(|(b, ls)| {
                let v = ledger_json(&Ledger::sum(ls), Some(&b), prices);
                (b, v)
            })
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    out
}
