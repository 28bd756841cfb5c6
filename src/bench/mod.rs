//! `taskbox bench`: how much taskbox costs, as ratios against baselines measured in the same run.
//!
//! taskbox sits between an agent and every command it runs, so its figures only mean something
//! next to what the same work costs without it. Every benchmark here therefore measures a
//! *subject* (taskbox doing the work) and a *baseline* (the same work done bare) in one run, on one
//! machine, interleaving their samples so that a neighbour's compile slows both alike, and reports
//! medians and their ratio:
//!
//! | group | subject | baseline |
//! |---|---|---|
//! | `overhead` | a command in a warm task (library path; CLI through a running server, unisolated and isolated; one-shot CLI); a new isolated task's first command | `bash -c` spawned bare; for the isolated CLI also a bare `bwrap --unshare-all` |
//! | `overhead.stored_tasks` | a warm CLI command through a server with 10,000 tasks stored | the same with 2 stored |
//! | `overhead.first_byte` | a command's first line of output reaching a `taskbox run` through a server, after it was written | the same through a bare `bash -c` pipe |
//! | `journal` | `Store::commit` / `commit_batch` of lifecycle transitions | raw SQLite inserts, same durability |
//! | `scale` | 10,000 tasks through the engine on the simulated provider: wall time, peak memory and peak descriptors | the same calls made directly |
//! | `snapshot` | local snapshot and restore (content-addressed), the next snapshot after small changes, storage of ten; the snapshot and restore of an isolated sandbox | `tar \| zstd -1 -T1` and `zstd -d \| tar -x`, the first snapshot, one full archive; the same of an unisolated sandbox |
//! | `vercel` | HTTP requests per command (engine; CLI through a server) and per lifecycle, counted by the fake | the API's minimum |
//! | `fleet` (with `--postgres`) | a warm `taskbox run` through a server on PostgreSQL; tasks per second a server takes over after another's SIGKILL | the same through a server on SQLite; the same commands once it drives them |
//!
//! Speed targets live here, in the benchmark output, never in timed unit tests.
//!
//! The module breaks two of the crate's layering rules on purpose, because a baseline has to be
//! the bare thing: `journal` runs its own SQL (a raw insert loop) beside the store's, and
//! `overhead` and `snapshot` spawn processes (`bash`, `tar`, `zstd`, the `taskbox` binary, and
//! `taskbox serve` for the CLI rows: `server.rs`) beside the local provider's. Nothing here prints: progress goes to a callback, results are returned.
//!
//! Peak memory is a per-process figure, so the scale benchmark runs in a child process (the
//! `taskbox` binary given in [`Options::exe`], with the hidden `bench --child` arguments) where
//! nothing else has touched the heap; see [`run_child`].

mod checkpoint;
mod fleet;
mod journal;
mod overhead;
mod scale;
mod server;
mod snapshot;
mod stats;
mod vercel;
mod workspace;

use std::path::PathBuf;
use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use scale::{ChildKind, ScaleRun};
pub use stats::median;
pub use workspace::{generate_workspace, TreeSpec, TreeStats};

/// How long and how big the run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Small samples and a small workspace: checks that everything runs (CI, debug builds).
    Quick,
    /// The figures: 200 commands per path, 10,000 tasks, a ~60 MB workspace.
    Standard,
    /// More repetitions and the ~185 MB workspace (23,000 files).
    Full,
}

impl Mode {
    /// `quick`, `standard` or `full`, as this mode is (a sample size, a workload).
    pub fn pick<T>(self, quick: T, standard: T, full: T) -> T {
        match self {
            Mode::Quick => quick,
            Mode::Standard => standard,
            Mode::Full => full,
        }
    }

    /// The name used in output.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Quick => "quick",
            Mode::Standard => "standard",
            Mode::Full => "full",
        }
    }

    /// The flag that selects it (empty for the default).
    pub fn flag(self) -> &'static str {
        match self {
            Mode::Quick => " --quick",
            Mode::Standard => "",
            Mode::Full => " --full",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Sample sizes.
    pub mode: Mode,
    /// Run only the benchmarks whose group or name is one of these (all when empty).
    pub only: Vec<String>,
    /// The `taskbox` binary: spawned for the CLI path and the scale child. A program embedding
    /// the library passes the path of a built `taskbox`.
    pub exe: PathBuf,
    /// Where to put data dirs and workspaces (a fresh directory is made inside and removed at
    /// the end); the system temporary directory when `None`.
    pub scratch: Option<PathBuf>,
    /// A PostgreSQL database for `journal.postgres` and the `fleet` group (skipped when
    /// `None`). `journal.postgres` adds its tasks and one table of its own
    /// (`taskbox_bench_raw`) there; the `fleet` rows make scratch databases on its server (its
    /// user needs CREATEDB) and drop them.
    pub postgres: Option<String>,
}

/// The benchmark groups, in run order.
pub const GROUPS: [&str; 7] = [
    "overhead",
    "journal",
    "scale",
    "snapshot",
    "checkpoint",
    "vercel",
    "fleet",
];

/// Every benchmark (row) name, group first.
pub const NAMES: [&str; 31] = [
    "overhead.library",
    "overhead.cli",
    "overhead.cli_isolated",
    "overhead.cli_isolated_bwrap",
    "overhead.first_command_isolated",
    "overhead.cli_oneshot",
    "overhead.stored_tasks",
    "overhead.first_byte",
    "journal.commit",
    "journal.batch",
    "journal.postgres",
    "scale.wall",
    "scale.peak_memory",
    "scale.slowest_task",
    "scale.peak_descriptors",
    "snapshot.create",
    "snapshot.second_small",
    "snapshot.second_append",
    "snapshot.restore",
    "snapshot.storage",
    "snapshot.create_isolated",
    "snapshot.restore_isolated",
    "checkpoint.pause",
    "checkpoint.unchanged",
    "checkpoint.every_command",
    "checkpoint.rewind",
    "vercel.per_command",
    "vercel.cli_per_command",
    "vercel.lifecycle",
    "fleet.run_latency",
    "fleet.takeover",
];

/// A benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// `--only` named nothing known.
    #[error("unknown benchmark `{name}`")]
    UnknownName {
        /// The name given.
        name: String,
    },
    /// A filesystem or process operation failed.
    #[error("bench {bench}: cannot {action}")]
    Io {
        /// The benchmark group.
        bench: &'static str,
        /// What was being done, with the path or program.
        action: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A tool a baseline needs is missing.
    #[error("bench {bench}: `{tool}` is not installed or not on PATH")]
    MissingTool {
        /// The benchmark group.
        bench: &'static str,
        /// The program.
        tool: &'static str,
    },
    /// The engine failed while being measured.
    #[error("bench {bench}: {action}")]
    Engine {
        /// The benchmark group.
        bench: &'static str,
        /// What was being done.
        action: String,
        /// The cause.
        #[source]
        source: Box<crate::engine::EngineError>,
    },
    /// The store failed while being measured.
    #[error("bench {bench}: {action}")]
    Store {
        /// The benchmark group.
        bench: &'static str,
        /// What was being done.
        action: String,
        /// The cause.
        #[source]
        source: Box<crate::store::StoreError>,
    },
    /// Anything else: a wrong answer, a failed child, a provider error.
    #[error("bench {bench}: {message}")]
    Failed {
        /// The benchmark group.
        bench: &'static str,
        /// What went wrong.
        message: String,
    },
}

impl BenchError {
    /// A mapper from an engine error while `bench` did `action`.
    pub(crate) fn engine(
        bench: &'static str,
        action: impl Into<String>,
    ) -> impl FnOnce(crate::engine::EngineError) -> BenchError {
        let action = action.into();
        move |source| BenchError::Engine {
            bench,
            action,
            source: Box::new(source),
        }
    }
}

impl BenchError {
    /// How to fix it, if known.
    pub fn hint(&self) -> Option<String> {
        match self {
            BenchError::UnknownName { .. } => Some(format!(
                "--only takes a group ({}) or a benchmark name ({})",
                GROUPS.join(", "),
                NAMES.join(", ")
            )),
            BenchError::MissingTool { tool, .. } => Some(format!(
                "install it (Debian/Ubuntu: `apt-get install {tool}`); the baseline runs it"
            )),
            _ => None,
        }
    }

    pub(crate) fn io(
        bench: &'static str,
        action: impl Into<String>,
    ) -> impl FnOnce(std::io::Error) -> BenchError {
        let action = action.into();
        move |source| BenchError::Io {
            bench,
            action,
            source,
        }
    }

    pub(crate) fn failed(bench: &'static str, message: impl Into<String>) -> BenchError {
        BenchError::Failed {
            bench,
            message: message.into(),
        }
    }
}

/// A measured quantity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Quantity {
    /// The value, in `unit`.
    pub value: f64,
    /// `ms`, `s`, `MB`, `transitions/s`, `requests`...
    pub unit: &'static str,
}

impl Quantity {
    /// `value` in `unit`.
    pub fn new(value: f64, unit: &'static str) -> Quantity {
        Quantity { value, unit }
    }

    /// Formats with a precision that suits the magnitude.
    pub fn display(&self) -> String {
        format!("{} {}", fmt_num(self.value), self.unit)
    }
}

/// A tokio runtime of two workers, like the `taskbox` binary's, for the benchmark `bench`.
fn runtime(bench: &'static str) -> Result<tokio::runtime::Runtime, BenchError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(BenchError::io(bench, "start a tokio runtime"))
}

/// Formats a number with about three significant digits and thousands separators.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let a = v.abs();
    let s = if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a == 0.0 {
        "0".to_string()
    } else {
        format!("{v:.3}")
    };
    // Thousands separators on the integer part.
    let (int, frac) = match s.find('.') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s.as_str(), ""),
    };
    let (sign, digits) = match int.strip_prefix('-') {
        Some(d) => ("-", d),
        None => ("", int),
    };
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    format!("{sign}{grouped}{frac}")
}

/// What a benchmark should reach.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Target {
    /// `added` (the median of paired subject − baseline differences) at most `value` `unit`.
    AddedAtMost {
        /// The bound.
        value: f64,
        /// Its unit (the subject's).
        unit: &'static str,
    },
    /// subject / baseline at least this (throughput).
    RatioAtLeast {
        /// The bound.
        ratio: f64,
    },
    /// subject / baseline at most this (time, size, requests).
    RatioAtMost {
        /// The bound.
        ratio: f64,
    },
    /// The subject itself below this, in its unit.
    Below {
        /// The bound.
        value: f64,
    },
    /// No target: the figure is reported.
    Report,
}

impl Target {
    /// The target as the table shows it.
    pub fn describe(&self, subject_unit: &str) -> String {
        match self {
            Target::AddedAtMost { value, unit } => format!("≤ {} {unit} added", fmt_num(*value)),
            Target::RatioAtLeast { ratio } => format!("≥ {:.0} % of baseline", ratio * 100.0),
            Target::RatioAtMost { ratio } => format!("≤ {}× baseline", fmt_num(*ratio)),
            Target::Below { value } => format!("< {} {subject_unit}", fmt_num(*value)),
            Target::Report => "(reported)".to_string(),
        }
    }

    /// Whether `m` meets it (`None` for [`Target::Report`]).
    fn check(&self, subject: f64, ratio: f64, added: Option<f64>) -> Option<bool> {
        match self {
            Target::AddedAtMost { value, .. } => added.map(|a| a <= *value),
            Target::RatioAtLeast { ratio: r } => Some(ratio >= *r),
            Target::RatioAtMost { ratio: r } => Some(ratio <= *r),
            Target::Below { value } => Some(subject < *value),
            Target::Report => None,
        }
    }
}

/// One row of the result table.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// `group.name`, e.g. `overhead.library`.
    pub name: String,
    /// What the subject is.
    pub subject_is: String,
    /// The subject's figure (a median, unless `notes` says otherwise).
    pub subject: Quantity,
    /// What the baseline is.
    pub baseline_is: String,
    /// The baseline's figure.
    pub baseline: Quantity,
    /// subject / baseline.
    pub ratio: f64,
    /// For per-operation times: the median of paired (subject − baseline) differences.
    pub added: Option<Quantity>,
    /// The target.
    pub target: Target,
    /// The target as text.
    pub target_text: String,
    /// Whether the target is met (`None`: nothing to meet).
    pub met: Option<bool>,
    /// Samples per side.
    pub samples: usize,
    /// Other figures worth knowing (spread, counts, sizes).
    pub notes: Vec<String>,
}

impl Measurement {
    /// A row of paired samples in milliseconds: their medians, the median added, the spread
    /// first among the `notes`.
    pub(crate) fn paired_ms(
        name: &str,
        subject_is: impl Into<String>,
        baseline_is: impl Into<String>,
        p: &stats::Paired,
        target: Target,
        notes: Vec<String>,
    ) -> Measurement {
        Measurement::new(
            name,
            subject_is,
            Quantity::new(p.subject_median(), "ms"),
            baseline_is,
            Quantity::new(p.baseline_median(), "ms"),
            Some(Quantity::new(p.added_median(), "ms")),
            target,
            p.subject.len(),
            std::iter::once(p.spread("ms")).chain(notes).collect(),
        )
    }

    /// A row; `ratio` and `met` are computed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: &str,
        subject_is: impl Into<String>,
        subject: Quantity,
        baseline_is: impl Into<String>,
        baseline: Quantity,
        added: Option<Quantity>,
        target: Target,
        samples: usize,
        notes: Vec<String>,
    ) -> Measurement {
        let ratio = if baseline.value != 0.0 {
            subject.value / baseline.value
        } else {
            f64::NAN
        };
        let met = target.check(subject.value, ratio, added.map(|a| a.value));
        Measurement {
            name: name.to_string(),
            subject_is: subject_is.into(),
            subject,
            baseline_is: baseline_is.into(),
            baseline,
            ratio,
            added,
            target,
            target_text: target.describe(subject.unit),
            met,
            samples,
            notes,
        }
    }
}

/// The machine and build the figures come from.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    /// Logical CPUs.
    pub cpus: usize,
    /// 1-minute load average when the run started and when it ended (Linux).
    pub load_start: Option<f64>,
    /// See `load_start`.
    pub load_end: Option<f64>,
    /// `release` or `debug`: debug figures are not meaningful for speed.
    pub build: &'static str,
    /// taskbox's version.
    pub version: &'static str,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Sample sizes used.
    pub mode: Mode,
    /// The command that reproduces the run.
    pub command: String,
    /// Where the figures come from.
    pub environment: Environment,
    /// Wall time of the whole run.
    pub elapsed_s: f64,
    /// The rows, in run order.
    pub benchmarks: Vec<Measurement>,
}

impl Report {
    /// Rows whose target was missed.
    pub fn missed(&self) -> impl Iterator<Item = &Measurement> {
        self.benchmarks.iter().filter(|m| m.met == Some(false))
    }
}

/// Progress, for the caller to show (the library prints nothing).
pub type Progress<'a> = &'a mut dyn FnMut(&str);

/// What every group needs while it runs.
pub(crate) struct Ctx<'a> {
    pub opts: &'a Options,
    pub dir: PathBuf,
    progress: Progress<'a>,
    selected: Vec<String>,
}

impl Ctx<'_> {
    pub fn say(&mut self, msg: &str) {
        (self.progress)(msg);
    }

    /// Whether the row `name` (`group.row`) was asked for.
    pub fn wants(&self, name: &str) -> bool {
        self.selected.is_empty()
            || self
                .selected
                .iter()
                .any(|s| s == name || name.split('.').next().is_some_and(|group| group == s))
    }

    /// Whether any row of `group` was asked for.
    fn wants_group(&self, group: &str) -> bool {
        NAMES
            .iter()
            .filter(|n| n.starts_with(&format!("{group}.")))
            .any(|n| self.wants(n))
    }

    /// A fresh directory for one group.
    pub fn subdir(&self, name: &str) -> Result<PathBuf, BenchError> {
        let d = self.dir.join(name);
        std::fs::create_dir_all(&d)
            .map_err(BenchError::io("scratch", format!("create {}", d.display())))?;
        Ok(d)
    }
}

/// Checks `--only` names against [`GROUPS`] and [`NAMES`].
pub fn validate_only(only: &[String]) -> Result<(), BenchError> {
    for name in only {
        if !GROUPS.contains(&name.as_str()) && !NAMES.contains(&name.as_str()) {
            return Err(BenchError::UnknownName { name: name.clone() });
        }
    }
    Ok(())
}

/// Runs the selected benchmarks and returns their rows. Blocking: it builds its own tokio
/// runtimes, so call it from a plain thread, not from inside a runtime.
pub fn run(opts: &Options, progress: Progress<'_>) -> Result<Report, BenchError> {
    validate_only(&opts.only)?;
    let started = Instant::now();
    let load_start = load_average();
    let scratch = opts.scratch.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&scratch).map_err(BenchError::io(
        "scratch",
        format!("create {}", scratch.display()),
    ))?;
    let dir = tempdir_in(&scratch)?;
    let mut ctx = Ctx {
        opts,
        dir: dir.path.clone(),
        progress,
        selected: opts.only.clone(),
    };
    let mut rows = Vec::new();
    for group in GROUPS {
        if !ctx.wants_group(group) {
            continue;
        }
        let t = Instant::now();
        ctx.say(&format!("{group}: running"));
        let got = match group {
            "overhead" => overhead::run(&mut ctx)?,
            "journal" => journal::run(&mut ctx)?,
            "scale" => scale::run(&mut ctx)?,
            "snapshot" => snapshot::run(&mut ctx)?,
            "checkpoint" => checkpoint::run(&mut ctx)?,
            "vercel" => vercel::run(&mut ctx)?,
            "fleet" => fleet::run(&mut ctx)?,
            _ => unreachable!("GROUPS lists the groups matched here"),
        };
        ctx.say(&format!(
            "{group}: done in {:.1} s",
            t.elapsed().as_secs_f64()
        ));
        rows.extend(got.into_iter().filter(|m| ctx.wants(&m.name)));
    }
    let mut command = format!("taskbox bench{}", opts.mode.flag());
    for o in &opts.only {
        command.push_str(&format!(" --only {o}"));
    }
    if let Some(url) = &opts.postgres {
        command.push_str(&format!(" --postgres {}", crate::redact::redact(url)));
    }
    Ok(Report {
        mode: opts.mode,
        command,
        environment: Environment {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            load_start,
            load_end: load_average(),
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            version: env!("CARGO_PKG_VERSION"),
        },
        elapsed_s: started.elapsed().as_secs_f64(),
        benchmarks: rows,
    })
}

/// The child side of a benchmark that must run in its own process (see the module docs):
/// runs `kind` over `tasks` tasks and returns what it measured.
pub fn run_child(
    kind: ChildKind,
    tasks: usize,
    scratch: Option<PathBuf>,
) -> Result<ScaleRun, BenchError> {
    let scratch = scratch.unwrap_or_else(std::env::temp_dir);
    let dir = tempdir_in(&scratch)?;
    scale::child(kind, tasks, &dir.path)
}

/// The 1-minute load average, from `/proc/loadavg`.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A directory removed on drop.
pub(crate) struct TempDir {
    pub path: PathBuf,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Makes a fresh, uniquely named directory under `parent`.
pub(crate) fn tempdir_in(parent: &std::path::Path) -> Result<TempDir, BenchError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for _ in 0..100 {
        let path = parent.join(format!(
            "taskbox-bench-{}-{nanos:x}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        match std::fs::create_dir(&path) {
            Ok(()) => return Ok(TempDir { path }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(BenchError::io(
                    "scratch",
                    format!("create {}", path.display()),
                )(e))
            }
        }
    }
    Err(BenchError::failed(
        "scratch",
        format!("no free directory name under {}", parent.display()),
    ))
}
