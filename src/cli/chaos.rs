//! `taskbox chaos`: deterministic chaos runs against the simulated platform, with an invariant
//! check after every seed (see `taskbox::chaos`).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use taskbox::chaos::{self, ChaosFaults, ChaosOptions, ChaosReport, PlantedBug, SeedReport};

use super::output::{print_json, Failure};

/// Exit code of a chaos run that found violations.
const EXIT_VIOLATIONS: u8 = 1;

#[derive(Args, Debug)]
pub struct ChaosArgs {
    /// How many seeds to run (default 100, or 3 with --http; 1 when only --seed is given).
    #[arg(long)]
    seeds: Option<u64>,
    /// The first seed (runs seeds S, S+1, ...; default 1).
    #[arg(long)]
    seed: Option<u64>,
    /// Tasks per seed, driven concurrently (default 8, or 3 with --http).
    #[arg(long)]
    tasks: Option<u32>,
    /// Faults as `name=rate,...` (e.g. `transient=0.1,lost_create=0.05,crash=0.02`; `none`).
    /// Default: every kind at a moderate rate.
    #[arg(long)]
    faults: Option<String>,
    /// Seeds run at once (default: the number of CPUs, or 1 with --http).
    #[arg(long)]
    jobs: Option<usize>,
    /// Drive the real Vercel client against an in-process fake Vercel server (real sockets,
    /// real time, a few seconds per seed) instead of the simulated platform.
    #[arg(long)]
    http: bool,
    /// Run N engines (2 or 3) sharing one PostgreSQL store, as a fleet of servers does, with
    /// engine crashes and lease expiries among the faults (real time, a few seconds per seed;
    /// needs --store).
    #[arg(long, value_name = "N", conflicts_with = "http")]
    fleet: Option<u32>,
    /// With --fleet: a PostgreSQL server whose user may create databases
    /// (`postgres://user@host/db`); each seed runs in a scratch database of its own there.
    #[arg(long, value_name = "URL", requires = "fleet")]
    store: Option<String>,
    /// Where each seed's data dir is made (default: /dev/shm if writable, else the temp dir).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Keep every seed's data dir where it was made (violating seeds' are always kept, moved off /dev/shm to the temp dir)
    #[arg(long)]
    keep: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Plant a known bug, to show that the checker catches it (`oldest-restore`, `ignore-platform-snapshot`, `rewind-latest`).
    #[arg(long, hide = true)]
    planted_bug: Option<String>,
}

impl ChaosArgs {
    /// Whether JSON output was asked for.
    pub fn json(&self) -> bool {
        self.json
    }
}

pub async fn run(args: ChaosArgs) -> Result<ExitCode, Failure> {
    let opts = options(&args)?;
    let json = args.json;
    let report = tokio::task::spawn_blocking(move || {
        let long = opts.seeds >= 1000;
        let every = (opts.seeds / 10).max(1);
        let done = std::sync::atomic::AtomicU64::new(0);
        chaos::run(&opts, &|r: &SeedReport| {
            let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if !r.violations.is_empty() {
                eprintln!(
                    "seed {}: {} violation(s); reproduce with: {}",
                    r.seed,
                    r.violations.len(),
                    r.repro
                );
            }
            if long && n.is_multiple_of(every) {
                eprintln!("chaos: {n}/{} seeds", opts.seeds);
            }
        })
        // Boxed here: the error type is large, and it crosses a thread.
        .map_err(anyhow::Error::new)
    })
    .await
    .map_err(|e| Failure::new(format!("the chaos run panicked: {e}")))?
    .map_err(Failure::from_anyhow)?;
    if json {
        print_json(&report)?;
    } else {
        super::output::write_ignoring_broken_pipe(
            &mut std::io::stdout().lock(),
            table(&report).as_bytes(),
        )?;
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VIOLATIONS)
    })
}

fn options(args: &ChaosArgs) -> Result<ChaosOptions, Failure> {
    let faults = match &args.faults {
        None => ChaosFaults::moderate(),
        Some(list) => ChaosFaults::parse_list(list).map_err(|e| {
            Failure::new(format!("invalid --faults: {e}")).hint(
                "give `name=rate` items separated by commas, e.g. \
                 `--faults transient=0.1,lost_create=0.05,crash=0.02`, or `none`",
            )
        })?,
    };
    let real_time = args.http || args.fleet.is_some();
    let faults = match (&args.faults, args.fleet) {
        (None, Some(_)) => ChaosFaults::moderate_fleet(),
        _ => faults,
    };
    let fleet = match (args.fleet, &args.store) {
        (None, _) => None,
        (Some(n), _) if !(2..=8).contains(&n) => {
            return Err(Failure::new(format!("invalid --fleet {n}"))
                .hint("give 2 or 3 engines (at most 8): a takeover needs another engine"))
        }
        (Some(_), None) => {
            return Err(Failure::new("--fleet needs --store postgres://…").hint(
                "the engines share a PostgreSQL store (leases and fencing tokens live there): \
                 give a server's URL whose user may create databases, e.g. \
                 `--store postgres://taskbox@127.0.0.1:5432/postgres`",
            ))
        }
        (Some(n), Some(url)) => {
            if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
                return Err(Failure::new(format!(
                    "invalid --store {}",
                    taskbox::redact::redact(url)
                ))
                .hint("give a PostgreSQL URL, postgres://user@host/database"));
            }
            Some(chaos::FleetOptions {
                engines: n,
                store: url.clone(),
            })
        }
    };
    let tasks = args.tasks.unwrap_or(if real_time { 3 } else { 8 });
    if tasks == 0 {
        return Err(Failure::new("invalid --tasks 0").hint("give at least 1 task per seed"));
    }
    if args.seeds == Some(0) {
        return Err(Failure::new("invalid --seeds 0").hint("give at least 1 seed"));
    }
    let planted_bug = match &args.planted_bug {
        None => None,
        Some(name) => Some(
            name.parse::<PlantedBug>()
                .map_err(|e| Failure::new(format!("invalid --planted-bug: {e}")))?,
        ),
    };
    let seeds = args
        .seeds
        .unwrap_or(match (args.seed.is_some(), real_time) {
            (true, _) => 1,
            (false, true) => 3,
            (false, false) => 100,
        });
    let mut opts = ChaosOptions::new(args.seed.unwrap_or(1), seeds, tasks);
    opts.http = args.http;
    opts.fleet = fleet;
    opts.faults = faults;
    opts.planted_bug = planted_bug;
    opts.jobs = match args.jobs {
        Some(j) => j,
        // Real-time seeds share the CPU badly; one at a time keeps them faithful.
        None if real_time => 1,
        None => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    };
    if opts.jobs == 0 {
        return Err(Failure::new("invalid --jobs 0").hint("give at least 1 job"));
    }
    if let Some(dir) = &args.work_dir {
        opts.work_dir = dir.clone();
    }
    opts.keep_all = args.keep;
    Ok(opts)
}

/// The human report: one row per figure, then every violating seed with its repro command.
fn table(r: &ChaosReport) -> String {
    let t = &r.totals;
    let mut s = String::new();
    let last = r.first_seed.saturating_add(r.seeds_run.saturating_sub(1));
    let _ = writeln!(
        s,
        "chaos{}: seeds {}..={last}, {} tasks each{}",
        match r.fleet {
            Some(n) => format!(" on a fleet of {n} engines sharing PostgreSQL (real time)"),
            None if r.http => " over HTTP (fake Vercel server, real time)".to_string(),
            None => String::new(),
        },
        r.first_seed,
        r.tasks_per_seed,
        r.planted_bug
            .map_or(String::new(), |b| format!(", planted bug {b}"))
    );
    let _ = writeln!(s, "faults: {}", r.faults);
    let _ = writeln!(s);
    let mut row = |name: &str, value: String| {
        let _ = writeln!(s, "  {name:<34} {value:>12}");
    };
    row("seeds", r.seeds_run.to_string());
    row("tasks", t.tasks.to_string());
    row("workload steps", t.counts.steps.to_string());
    row("requests answered", t.counts.requests_ok.to_string());
    row(
        "requests failed (reported)",
        t.counts.requests_failed.to_string(),
    );
    row(
        "requests cut off by a crash",
        t.counts.requests_interrupted.to_string(),
    );
    if r.fleet.is_some() {
        row(
            "requests answered task_moved",
            t.counts.requests_moved.to_string(),
        );
        row("takeovers (newer token)", t.counts.takeovers.to_string());
    }
    row("provider calls", t.counts.provider_calls.to_string());
    row("journal entries", t.counts.journal.entries.to_string());
    if r.http || r.fleet.is_some() {
        row("time", format!("{:.1} s", t.virtual_ms as f64 / 1000.0));
    } else {
        row(
            "virtual time",
            format!("{:.1} h", t.virtual_ms as f64 / 3_600_000.0),
        );
    }
    row(
        "faults injected",
        t.counts.faults.values().sum::<u64>().to_string(),
    );
    for (kind, n) in &t.counts.faults {
        row(&format!("  {kind}"), n.to_string());
    }
    row("retries", t.counts.journal.retries.to_string());
    row("restores", t.counts.journal.restores.to_string());
    row(
        "fallbacks (snapshot gone)",
        t.counts.journal.fallbacks.to_string(),
    );
    row(
        "files-lost notices",
        t.counts.journal.files_lost.to_string(),
    );
    row(
        "commands re-run (sandbox gone before they started)",
        t.counts.journal.reruns.to_string(),
    );
    row(
        "snapshots expired by the platform",
        t.snapshots_expired.to_string(),
    );
    row(
        "stale sandboxes (reconciled)",
        t.stale_sandboxes.to_string(),
    );
    row(
        "recoveries after a crash",
        t.counts.journal.recoveries.to_string(),
    );
    row("tasks forked", t.counts.journal.forks.to_string());
    if r.fleet.is_none() {
        row("checkpoints answered", t.counts.checkpoints.to_string());
        row(
            "rewinds answered (files checked)",
            format!("{} ({})", t.counts.rewinds, t.counts.rewinds_checked),
        );
    }
    row("violations", t.violations.to_string());
    let _ = writeln!(s);
    if !r.digest.is_empty() {
        let _ = writeln!(s, "digest {}", r.digest);
    }
    let _ = writeln!(s, "wall time {:.1} s", r.wall_ms as f64 / 1000.0);
    for v in &r.violating_seeds {
        let _ = writeln!(s);
        let _ = writeln!(s, "seed {}: {} violation(s)", v.seed, v.violations.len());
        for x in &v.violations {
            let _ = writeln!(s, "  {x}");
        }
        let _ = writeln!(s, "  reproduce: {}", v.repro);
        if let Some(home) = &v.home {
            let _ = writeln!(
                s,
                "  data kept: {} (TASKBOX_HOME={} taskbox tasks)",
                home.display(),
                home.display()
            );
        }
        if let Some(file) = &v.journal_file {
            let _ = writeln!(
                s,
                "  journal: taskbox replay --all --journal {}",
                file.display()
            );
        }
    }
    s
}
