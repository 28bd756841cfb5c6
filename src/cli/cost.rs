//! `taskbox cost [TASK] [--since 7d] [--json]`: what tasks used, from their journals.
//!
//! Read-only and straight from the store, like `tasks` and `show` (no server, no provider, no
//! credentials): the ledger is a fold over the journal (`taskbox::core::ledger`), which SQLite's
//! WAL lets a reader see consistently while a server writes.

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::Args;
use taskbox::config::Config;
use taskbox::core::ledger::{Ledger, Prices};
use taskbox::engine::cost::{self, ESTIMATE_BASIS};
use taskbox::engine::Paths;
use taskbox::store::StoreError;
use taskbox::TaskId;

use super::output::{print_json, Failure};
use super::{existing_store, no_task, task_id};

#[derive(Args, Debug)]
pub struct CostArgs {
    /// The task (all tasks when left out).
    task: Option<String>,
    /// Only what was used in this last stretch of time: a number and s, m, h, d or w (`7d`).
    #[arg(long)]
    since: Option<String>,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: CostArgs, paths: &Paths) -> Result<ExitCode, Failure> {
    let since_ms = match &args.since {
        Some(s) => Some(cost::parse_since(s).map_err(|e| {
            let hint = e.hint();
            Failure::new(e.to_string()).code("invalid_since").hint(hint)
        })?),
        None => None,
    };
    let task = args.task.as_deref().map(task_id).transpose()?;
    let prices = Config::load(&paths.config_file)
        .map_err(Failure::from_config)?
        .prices();
    let now = taskbox::clock::Clock::now_ms(&taskbox::clock::SystemClock);
    let window = cost::window(since_ms, now);
    let store_err = |e: StoreError| Failure::from_engine(e.into());
    let store = existing_store(paths).map_err(store_err)?;
    let ids: Vec<TaskId> = match (&task, &store) {
        (Some(t), Some(s)) if s.load_task(t.as_str()).map_err(store_err)?.is_some() => {
            vec![t.clone()]
        }
        (Some(t), _) => return Err(no_task(paths, t)),
        (None, Some(s)) => s.task_ids().map_err(store_err)?,
        (None, None) => Vec::new(),
    };
    let mut rows: Vec<(TaskId, Ledger, Option<String>)> = Vec::new();
    if let Some(store) = &store {
        for id in ids {
            let (ledger, backend) =
                cost::task_ledger(store, &id, window).map_err(Failure::from_engine)?;
            rows.push((id, ledger, backend));
        }
    }
    // Tasks that used nothing in the window are left out of a listing of all tasks.
    if task.is_none() {
        rows.retain(|(_, l, _)| *l != Ledger::default());
    }
    let since_text = args.since.as_deref().map(str::trim);
    let totals = totals(&rows);
    if args.json {
        let tasks: Vec<serde_json::Value> = rows
            .iter()
            .map(|(id, l, b)| {
                let mut v = cost::ledger_json(l, b.as_deref(), &prices);
                v["task"] = id.as_str().into();
                v
            })
            .collect();
        let mut out = serde_json::json!({
            "since": since_text,
            "from": taskbox::clock::format_ms(window.from),
            "until": taskbox::clock::format_ms(window.until),
            "tasks": tasks,
        });
        if task.is_none() {
            out["totals"] = totals
                .iter()
                .map(|(b, l)| (b.clone(), cost::ledger_json(l, Some(b), &prices)))
                .collect::<serde_json::Map<_, _>>()
                .into();
        }
        print_json(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let period = match since_text {
        Some(s) => format!("the last {s}"),
        None => "all time".to_string(),
    };
    if rows.is_empty() {
        outln!("no task used anything in {period}");
        return Ok(ExitCode::SUCCESS);
    }
    for (id, l, b) in &rows {
        outln!(
            "{id} ({}), {period}:",
            b.as_deref().unwrap_or("no backend yet")
        );
        print_ledger(l, b.as_deref(), &prices);
    }
    if task.is_none() && rows.len() > 1 {
        for (b, l) in &totals {
            outln!("total on {b} ({} task(s)), {period}:", count(&rows, b));
            print_ledger(l, Some(b), &prices);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn count(rows: &[(TaskId, Ledger, Option<String>)], backend: &str) -> usize {
    rows.iter()
        .filter(|(_, _, b)| b.as_deref().unwrap_or("unknown") == backend)
        .count()
}

/// The rows' totals by backend (a snapshot shared by forks counted once).
fn totals(rows: &[(TaskId, Ledger, Option<String>)]) -> BTreeMap<String, Ledger> {
    let mut by: BTreeMap<String, Vec<&Ledger>> = BTreeMap::new();
    for (_, l, b) in rows {
        by.entry(b.clone().unwrap_or_else(|| "unknown".into()))
            .or_default()
            .push(l);
    }
    by.into_iter().map(|(b, ls)| (b, Ledger::sum(ls))).collect()
}

fn print_ledger(l: &Ledger, backend: Option<&str>, prices: &Prices) {
    outln!(
        "  sandbox time       {} ({:.4} h)",
        human_ms(l.sandbox_ms),
        l.sandbox_hours()
    );
    outln!("  creations          {}", l.creations);
    let priced = cost::is_priced(backend);
    if priced {
        outln!(
            "  sessions reported  {} (usage the platform reported as the sessions ended)",
            l.sessions_reported
        );
        if l.sessions_unknown > 0 {
            outln!(
                "  usage unknown      {} session(s): the platform did not answer when asked, so \
                 their CPU, memory and transfer are missing below",
                l.sessions_unknown
            );
        }
        outln!("  active CPU         {:.6} vCPU-hours", l.vcpu_hours());
        outln!("  memory             {:.6} GB-hours", l.memory_gb_hours());
        outln!("  transfer           {:.6} GB", l.transfer_gb());
    }
    outln!(
        "  snapshots kept     {} in {} snapshot(s)",
        human_bytes(l.snapshot_bytes_kept()),
        l.snapshots_kept.len()
    );
    outln!(
        "  snapshot storage   {:.9} GB-months",
        l.snapshot_gb_months()
    );
    if priced {
        let e = l.estimate(prices);
        outln!(
            "  {ESTIMATE_BASIS}: ${:.6} (CPU ${:.6}, memory ${:.6}, creations ${:.6}, transfer ${:.6}, snapshots ${:.6}; prices: cost.* keys)",
            e.total, e.active_cpu, e.memory, e.creations, e.transfer, e.snapshots
        );
    } else {
        outln!("  no price: the local backend runs on this machine (figures are resource units)");
    }
}

fn human_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, (s % 3600) / 60),
    }
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1000.0 && i < UNITS.len() - 1 {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}
