//! `taskbox cost [TASK] [--since 7d] [--json]`: what tasks used, from their journals.
//!
//! Read-only and straight from the store, like `tasks` and `show` (no server, no provider, no
//! credentials): the ledger is a fold over the journal (`taskbox::core::ledger`), which SQLite's
//! WAL lets a reader see consistently while a server writes. With `--server URL` (or
//! `TASKBOX_SERVER_URL`) the report is the remote server's `GET /v1/cost`, printed the same way:
//! both are `cost --json`'s object, and the text is made from it.

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;
use taskbox::config::Config;
use taskbox::core::ledger::Ledger;
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
    let since = args.since.as_deref().map(str::trim);
    let since_ms = match since {
        Some(s) => Some(cost::parse_since(s).map_err(since_failure)?),
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
    let mut rows: Vec<cost::CostRow> = Vec::new();
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
    let report = cost::report_json(&rows, &prices, since, window, task.is_none());
    print(&report, args.json)
}

/// `taskbox --server URL cost`: the remote server's `GET /v1/cost`, printed as a local report
/// is (its prices are the server's `cost.*` keys).
#[cfg(feature = "server")]
pub async fn remote(args: CostArgs, paths: &Paths) -> Result<ExitCode, Failure> {
    let Some(client) = super::server::remote_client(paths) else {
        return run(args, paths);
    };
    let since = args.since.as_deref().map(str::trim);
    // Refused here as locally, before a request is sent.
    if let Some(s) = since {
        cost::parse_since(s).map_err(since_failure)?;
    }
    let task = args.task.as_deref().map(task_id).transpose()?;
    let report = super::server::call(&client, taskbox::config::ServerMode::Always, |c| {
        let task = task.clone();
        let since = since.map(str::to_string);
        async move { c.cost(task.as_ref(), since.as_deref()).await }
    })
    .await?;
    print(&report, args.json)
}

fn since_failure(e: cost::SinceError) -> Failure {
    let hint = e.hint();
    Failure::new(e.to_string()).code("invalid_since").hint(hint)
}

/// Prints a report (`cost --json`'s object, made here or by a server): as it is with `json`,
/// else one block per task, then the totals per backend when it lists several tasks.
fn print(report: &Value, json: bool) -> Result<ExitCode, Failure> {
    if json {
        print_json(report)?;
        return Ok(ExitCode::SUCCESS);
    }
    let period = match report["since"].as_str() {
        Some(s) => format!("the last {s}"),
        None => "all time".to_string(),
    };
    let empty = Vec::new();
    let tasks = report["tasks"].as_array().unwrap_or(&empty);
    if tasks.is_empty() {
        outln!("no task used anything in {period}");
        return Ok(ExitCode::SUCCESS);
    }
    for t in tasks {
        outln!(
            "{} ({}), {period}:",
            t["task"].as_str().unwrap_or("?"),
            t["backend"].as_str().unwrap_or("no backend yet")
        );
        print_ledger(t);
    }
    if let (Some(totals), true) = (report["totals"].as_object(), tasks.len() > 1) {
        for (b, l) in totals {
            let count = tasks
                .iter()
                .filter(|t| t["backend"].as_str().unwrap_or("unknown") == b)
                .count();
            outln!("total on {b} ({count} task(s)), {period}:");
            print_ledger(l);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A number of a ledger's JSON (`ledger_json`), 0 when missing.
fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(0.0)
}

/// A whole number of a ledger's JSON, 0 when missing.
fn count(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

fn print_ledger(l: &Value) {
    outln!(
        "  sandbox time       {} ({:.4} h)",
        human_ms(count(l, "sandbox_seconds").saturating_mul(1000)),
        num(l, "sandbox_hours")
    );
    outln!("  creations          {}", count(l, "creations"));
    let estimate = &l["estimate_usd"];
    let priced = estimate.is_object();
    if priced {
        outln!(
            "  sessions reported  {} (usage the platform reported as the sessions ended)",
            count(l, "sessions_reported")
        );
        let unknown = count(l, "sessions_unknown");
        if unknown > 0 {
            outln!(
                "  usage unknown      {unknown} session(s): the platform did not answer when asked, so \
                 their CPU, memory and transfer are missing below"
            );
        }
        outln!(
            "  active CPU         {:.6} vCPU-hours",
            num(l, "vcpu_hours")
        );
        outln!(
            "  memory             {:.6} GB-hours",
            num(l, "memory_gb_hours")
        );
        outln!("  transfer           {:.6} GB", num(l, "transfer_gb"));
    }
    outln!(
        "  snapshots kept     {} in {} snapshot(s)",
        human_bytes(count(l, "snapshot_bytes_kept")),
        count(l, "snapshots_kept")
    );
    outln!(
        "  snapshot storage   {:.9} GB-months",
        num(l, "snapshot_gb_months")
    );
    if priced {
        let e = |k: &str| num(estimate, k);
        outln!(
            "  {ESTIMATE_BASIS}: ${:.6} (CPU ${:.6}, memory ${:.6}, creations ${:.6}, transfer ${:.6}, snapshots ${:.6}; prices: cost.* keys)",
            e("total"), e("active_cpu"), e("memory"), e("creations"), e("transfer"), e("snapshots")
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
