//! Scale: thousands of tasks driven concurrently through one engine, on the simulated provider,
//! each through provision → command → snapshot → restore → command → snapshot.
//!
//! The engine holds two descriptors per task it is driving (its lock file and lock socket,
//! `engine::lock`), from its first request until it has nothing live and is unloaded. The
//! workload therefore ends each task suspended (nothing live), and runs at most as many tasks at
//! once as the process's open-files limit leaves room for (`in_flight`; both sides alike): on
//! a machine whose hard limit is 20,000, 10,000 tasks all in flight at once would need more.
//!
//! The engine side opens an [`Orchestrator`] with a [`SimProvider`] and a [`TokioClock`] in
//! **real time** on a two-worker runtime (like the `taskbox` binary's), with the simulated
//! platform answering every call at once (no latency): the wall time measured is the engine's
//! own work — the event loop, `step`, the SQLite journal (a real file, `synchronous = FULL`) and
//! the task locks. (Paused time would need the `virtual-time` feature, which `bench` does not
//! require: wall time is what is measured here.) The
//! baseline makes the same provider calls directly, without the engine, on the same kind of
//! runtime.
//!
//! Each side runs in a child process (`taskbox bench --child engine|direct --tasks N`), so the
//! peak resident memory it reports (`VmHWM`) is that workload's alone.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::stats::{median, percentile};
use super::{BenchError, Ctx, Measurement, Quantity, Target};
use crate::clock::TokioClock;
use crate::config::Config;
use crate::engine::Orchestrator;
use crate::provider::sim::{SimFaults, SimProvider};
use crate::provider::{ExecRequest, SandboxProvider, SandboxSpec};
use crate::retry::Jitter;
use crate::store::Store;
use crate::TaskId;

const BENCH: &str = "scale";

/// Peak memory the engine must stay under, MB.
const TARGET_PEAK_MB: f64 = 250.0;

/// The slowest task may take at most this many times the median task: more means some tasks
/// were starved while others went through.
const TARGET_SLOWEST_RATIO: f64 = 2.0;

const T0: u64 = 1_700_000_000_000;

/// The simulated platform's latency per call (virtual time).
const SIM_FAULTS: &str = "latency=0..0";

/// Which side a child process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildKind {
    /// Through the engine.
    Engine,
    /// The same provider calls, made directly.
    Direct,
}

impl ChildKind {
    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            ChildKind::Engine => "engine",
            ChildKind::Direct => "direct",
        }
    }

    /// Parses [`ChildKind::as_str`].
    pub fn parse(s: &str) -> Option<ChildKind> {
        match s {
            "engine" => Some(ChildKind::Engine),
            "direct" => Some(ChildKind::Direct),
            _ => None,
        }
    }
}

/// What one child measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleRun {
    /// The side.
    pub kind: ChildKind,
    /// Tasks driven.
    pub tasks: usize,
    /// Wall time from the first request to the last task's end.
    pub wall_ms: f64,
    /// Engine: journal entries committed. Direct: provider calls made.
    pub transitions: u64,
    /// Peak resident memory of the process (`VmHWM`), KiB.
    pub peak_rss_kib: u64,
    /// `VmHWM` before the workload started, KiB.
    pub start_rss_kib: u64,
    /// Median task latency (first request to last answer), wall ms.
    pub task_median_ms: f64,
    /// 99th percentile task latency, wall ms.
    pub task_p99_ms: f64,
    /// The slowest task's latency, wall ms.
    pub task_max_ms: f64,
    /// Virtual time the simulated world went through, ms.
    pub virtual_ms: u64,
    /// The most descriptors the process had open at once (sampled every few milliseconds
    /// while the workload ran; Linux, else 0).
    pub peak_fds: u64,
    /// Descriptors open before the workload started.
    pub start_fds: u64,
    /// The process's open-files limit (soft, after raising it to the hard one).
    pub fd_limit: u64,
    /// The most tasks in flight at once (under the open-files limit, two descriptors each).
    pub in_flight: usize,
}

/// `VmHWM` (peak resident set) of this process, KiB.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Open descriptors of this process now (Linux; `None` elsewhere).
fn open_fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

/// Descriptors the engine holds per task it is driving: the task's lock file and its lock's
/// abstract socket (`engine::lock`).
const FILES_PER_TASK: u64 = 2;

/// Descriptors left for everything else (the store, the runtime, the sampler, tasks unloaded
/// a moment after they finished).
const FD_RESERVE: u64 = 512;

/// How many of `tasks` may be in flight at once under the open-files limit `fd_limit`, with
/// `open` descriptors open already (at least one).
fn in_flight(tasks: usize, fd_limit: u64, open: u64) -> usize {
    let room = fd_limit.saturating_sub(open + FD_RESERVE) / FILES_PER_TASK;
    usize::try_from(room)
        .unwrap_or(usize::MAX)
        .clamp(1, tasks.max(1))
}

/// How often the descriptor count is sampled while the workload runs (counting 20,000
/// descriptors lists as many directory entries: rarely enough to stay small beside the
/// workload on two CPUs).
const FD_SAMPLE: std::time::Duration = std::time::Duration::from_millis(50);

/// Counts this process's open descriptors every [`FD_SAMPLE`] on a thread of its own until
/// dropped, keeping the largest count.
struct FdPeak {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl FdPeak {
    fn start() -> FdPeak {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("taskbox-bench-fds".into())
            .spawn(move || {
                let mut peak = 0;
                loop {
                    peak = peak.max(open_fds().unwrap_or(0));
                    if flag.load(std::sync::atomic::Ordering::Relaxed) {
                        return peak;
                    }
                    std::thread::sleep(FD_SAMPLE);
                }
            })
            .ok();
        FdPeak { stop, thread }
    }

    /// The largest count seen, including one taken now.
    fn finish(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let sampled = self.thread.take().and_then(|t| t.join().ok()).unwrap_or(0);
        sampled.max(open_fds().unwrap_or(0))
    }
}

impl Drop for FdPeak {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Raises the soft open-files limit to the hard one, as `taskbox serve` does, and returns it.
/// The hard limit is the machine's: the benchmark runs within it (a task the engine is not
/// driving holds no descriptor).
fn raise_fd_limit() -> Result<u64, BenchError> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the `rlimit` it is given, and `lim` is a valid one that we
    // hold exclusively for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(BenchError::io(BENCH, "read the open-files limit")(
            std::io::Error::last_os_error(),
        ));
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit only reads the `rlimit` it is given, and `lim` is a valid,
        // initialised one that outlives the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(BenchError::io(BENCH, "raise the open-files limit")(
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(lim.rlim_cur)
}

fn sim(clock: &Arc<TokioClock>) -> Result<Arc<SimProvider>, BenchError> {
    let faults = SimFaults::parse_list(SIM_FAULTS)
        .map_err(|e| BenchError::failed(BENCH, format!("sim faults: {e}")))?;
    Ok(Arc::new(SimProvider::new(7, faults, clock.clone())))
}

fn latencies(mut lat: Vec<f64>) -> (f64, f64, f64) {
    lat.sort_by(f64::total_cmp);
    (
        median(&lat),
        percentile(&lat, 99.0),
        lat.last().copied().unwrap_or(f64::NAN),
    )
}

/// The child process's work: see the module docs.
pub(super) fn child(kind: ChildKind, tasks: usize, dir: &Path) -> Result<ScaleRun, BenchError> {
    let fd_limit = raise_fd_limit()?;
    // Two workers, like the `taskbox` binary.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(BenchError::io(BENCH, "start a tokio runtime"))?;
    let start_rss_kib = peak_rss_kib().unwrap_or(0);
    let start_fds = open_fds().unwrap_or(0);
    let at_once = in_flight(tasks, fd_limit, start_fds);
    let fds = FdPeak::start();
    let mut run = rt.block_on(async {
        match kind {
            ChildKind::Engine => engine(tasks, at_once, dir, start_rss_kib).await,
            ChildKind::Direct => direct(tasks, at_once, start_rss_kib).await,
        }
    })?;
    run.peak_fds = fds.finish();
    run.start_fds = start_fds;
    run.fd_limit = fd_limit;
    Ok(run)
}

async fn engine(
    tasks: usize,
    at_once: usize,
    dir: &Path,
    start_rss_kib: u64,
) -> Result<ScaleRun, BenchError> {
    let clock = Arc::new(TokioClock::starting_at(T0));
    let sim = sim(&clock)?;
    let orch = Orchestrator::builder(dir.to_path_buf(), Config::default())
        .provider(sim.clone())
        .clock(clock.clone())
        .jitter(Jitter::None)
        .reconcile_on_start(false)
        .open()
        .await
        .map_err(BenchError::engine(BENCH, "open the orchestrator"))?;
    let wall = Instant::now();
    let permits = Arc::new(tokio::sync::Semaphore::new(at_once));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..tasks {
        let orch = orch.clone();
        let permits = permits.clone();
        set.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let id = TaskId::new(&format!("task-{i}")).expect("a valid task id");
            let t = Instant::now();
            let fail = |action: &str, source| BenchError::Engine {
                bench: BENCH,
                action: format!("{id}: {action}"),
                source: Box::new(source),
            };
            orch.run(&id, &format!("write f {i}"), None)
                .await
                .map_err(|e| fail("first command", e))?;
            orch.suspend(&id)
                .await
                .map_err(|e| fail("suspend (snapshot)", e))?;
            let out = orch
                .run(&id, "cat f", None)
                .await
                .map_err(|e| fail("command after the restore", e))?;
            if out.stdout != i.to_string() {
                return Err(BenchError::failed(
                    BENCH,
                    format!("{id}: the restored file holds {:?}, not {i}", out.stdout),
                ));
            }
            orch.suspend(&id)
                .await
                .map_err(|e| fail("the last suspend", e))?;
            Ok::<f64, BenchError>(t.elapsed().as_secs_f64() * 1000.0)
        });
    }
    let mut lat = Vec::with_capacity(tasks);
    let mut first_error = None;
    while let Some(done) = set.join_next().await {
        match done {
            Ok(Ok(ms)) => lat.push(ms),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error
                    .get_or_insert(BenchError::failed(BENCH, format!("a task panicked: {e}")));
            }
        }
    }
    let wall_ms = wall.elapsed().as_secs_f64() * 1000.0;
    let peak_rss_kib = peak_rss_kib().unwrap_or(0);
    let virtual_ms = clock_ms(&clock) - T0;
    orch.shutdown().await;
    if let Some(e) = first_error {
        return Err(e);
    }
    // Every transition is one journal row; their global sequence numbers have no gaps.
    let store = Store::open(&dir.join("taskbox.db")).map_err(|source| BenchError::Store {
        bench: BENCH,
        action: "reopen the store to count transitions".into(),
        source: Box::new(source),
    })?;
    let mut transitions = 0;
    for i in 0..tasks {
        let tail = store
            .journal_tail(&format!("task-{i}"), 1)
            .map_err(|source| BenchError::Store {
                bench: BENCH,
                action: "read the journal".into(),
                source: Box::new(source),
            })?;
        transitions = tail.iter().map(|e| e.seq).fold(transitions, u64::max);
    }
    let (task_median_ms, task_p99_ms, task_max_ms) = latencies(lat);
    Ok(ScaleRun {
        kind: ChildKind::Engine,
        tasks,
        wall_ms,
        transitions,
        peak_rss_kib,
        start_rss_kib,
        task_median_ms,
        task_p99_ms,
        task_max_ms,
        virtual_ms,
        peak_fds: 0,
        start_fds: 0,
        fd_limit: 0,
        in_flight: at_once,
    })
}

fn clock_ms(clock: &TokioClock) -> u64 {
    use crate::clock::Clock;
    clock.now_ms()
}

async fn direct(tasks: usize, at_once: usize, start_rss_kib: u64) -> Result<ScaleRun, BenchError> {
    let clock = Arc::new(TokioClock::starting_at(T0));
    let sim = sim(&clock)?;
    let wall = Instant::now();
    let permits = Arc::new(tokio::sync::Semaphore::new(at_once));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..tasks {
        let sim = sim.clone();
        let permits = permits.clone();
        set.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let task = TaskId::new(&format!("task-{i}"))
                .map_err(|e| BenchError::failed(BENCH, e.to_string()))?;
            let t = Instant::now();
            let fail = |e: crate::provider::ProviderError| {
                BenchError::failed(BENCH, format!("{task}: {e}"))
            };
            let spec = |generation, source_snapshot| {
                SandboxSpec::new("bench", &task, generation, source_snapshot, 300_000)
            };
            let exec = |command: String| ExecRequest {
                command,
                timeout_ms: 180_000,
            };
            let sb = sim.create_sandbox(&spec(1, None)).await.map_err(fail)?;
            sim.exec(&sb.id, &exec(format!("write f {i}")))
                .await
                .map_err(fail)?;
            let snap = sim.snapshot(&task, &sb.id, 1).await.map_err(fail)?;
            let sb = sim
                .create_sandbox(&spec(2, Some(snap.id)))
                .await
                .map_err(fail)?;
            let out = sim
                .exec(&sb.id, &exec("cat f".into()))
                .await
                .map_err(fail)?;
            if out.stdout != i.to_string() {
                return Err(BenchError::failed(
                    BENCH,
                    format!("{task}: the restored file holds {:?}", out.stdout),
                ));
            }
            sim.snapshot(&task, &sb.id, 2).await.map_err(fail)?;
            Ok::<f64, BenchError>(t.elapsed().as_secs_f64() * 1000.0)
        });
    }
    let mut lat = Vec::with_capacity(tasks);
    while let Some(done) = set.join_next().await {
        match done {
            Ok(r) => lat.push(r?),
            Err(e) => return Err(BenchError::failed(BENCH, format!("a task panicked: {e}"))),
        }
    }
    let wall_ms = wall.elapsed().as_secs_f64() * 1000.0;
    let (task_median_ms, task_p99_ms, task_max_ms) = latencies(lat);
    Ok(ScaleRun {
        kind: ChildKind::Direct,
        tasks,
        wall_ms,
        transitions: tasks as u64 * 6,
        peak_rss_kib: peak_rss_kib().unwrap_or(0),
        start_rss_kib,
        task_median_ms,
        task_p99_ms,
        task_max_ms,
        virtual_ms: clock_ms(&clock) - T0,
        peak_fds: 0,
        start_fds: 0,
        fd_limit: 0,
        in_flight: at_once,
    })
}

/// Runs one child and parses its answer.
fn spawn_child(ctx: &Ctx<'_>, kind: ChildKind, tasks: usize) -> Result<ScaleRun, BenchError> {
    let exe = &ctx.opts.exe;
    let out = std::process::Command::new(exe)
        .args(["bench", "--child", kind.as_str(), "--tasks"])
        .arg(tasks.to_string())
        .arg("--scratch")
        .arg(&ctx.dir)
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(BenchError::io(BENCH, format!("spawn {}", exe.display())))?;
    if !out.status.success() {
        return Err(BenchError::failed(
            BENCH,
            format!(
                "the {} child ({} bench --child {}) failed ({}): {}",
                kind.as_str(),
                exe.display(),
                kind.as_str(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        BenchError::failed(
            BENCH,
            format!(
                "the {} child printed no result ({e}): {}",
                kind.as_str(),
                String::from_utf8_lossy(&out.stdout).trim()
            ),
        )
    })
}

pub(super) fn run(ctx: &mut Ctx<'_>) -> Result<Vec<Measurement>, BenchError> {
    let (tasks, reps) = ctx.opts.mode.pick((300, 1), (10_000, 1), (10_000, 3));
    let mut engine = Vec::new();
    let mut direct = Vec::new();
    for rep in 0..reps {
        let order = if rep % 2 == 0 {
            [ChildKind::Engine, ChildKind::Direct]
        } else {
            [ChildKind::Direct, ChildKind::Engine]
        };
        for kind in order {
            ctx.say(&format!(
                "scale: {tasks} tasks, {} side (run {} of {reps})",
                kind.as_str(),
                rep + 1
            ));
            let r = spawn_child(ctx, kind, tasks)?;
            match kind {
                ChildKind::Engine => engine.push(r),
                ChildKind::Direct => direct.push(r),
            }
        }
    }
    // The median run by wall time stands for the side.
    let pick = |runs: &mut Vec<ScaleRun>| -> ScaleRun {
        runs.sort_by(|a, b| a.wall_ms.total_cmp(&b.wall_ms));
        runs[runs.len() / 2].clone()
    };
    let e = pick(&mut engine);
    let d = pick(&mut direct);
    let rate = e.transitions as f64 / (e.wall_ms / 1000.0);
    let clock_note = format!(
        "real time, two-worker runtime, simulated calls answer at once; {} s of clock time",
        super::fmt_num(e.virtual_ms as f64 / 1000.0),
    );
    let mb = |kib: u64| kib as f64 / 1024.0;
    Ok(vec![
        Measurement::new(
            "scale.wall",
            format!(
                "{} tasks through the engine (SimProvider): provision, command, snapshot, restore, command, snapshot", super::fmt_num(tasks as f64)
            ),
            Quantity::new(e.wall_ms / 1000.0, "s"),
            "the same provider calls made directly, no engine",
            Quantity::new(d.wall_ms / 1000.0, "s"),
            None,
            Target::Report,
            reps,
            vec![
                format!(
                    "{} transitions journaled, {} transitions/s",
                    super::fmt_num(e.transitions as f64),
                    super::fmt_num(rate)
                ),
                clock_note,
                format!(
                    "at most {} tasks in flight at once (both sides; the open-files limit of {} leaves room for that many at {FILES_PER_TASK} descriptors each)",
                    super::fmt_num(e.in_flight as f64),
                    super::fmt_num(e.fd_limit as f64),
                ),
            ],
        ),
        Measurement::new(
            "scale.peak_memory",
            format!("peak resident memory (VmHWM) of a process driving {} tasks", super::fmt_num(tasks as f64)),
            Quantity::new(mb(e.peak_rss_kib), "MB"),
            "the direct-calls process's peak",
            Quantity::new(mb(d.peak_rss_kib), "MB"),
            None,
            Target::Below {
                value: TARGET_PEAK_MB,
            },
            reps,
            vec![format!(
                "{} MB before the workload",
                super::fmt_num(mb(e.start_rss_kib))
            )],
        ),
        Measurement::new(
            "scale.slowest_task",
            format!("slowest of {} tasks, first request to last answer", super::fmt_num(tasks as f64)),
            Quantity::new(e.task_max_ms / 1000.0, "s"),
            "the median task of the same run",
            Quantity::new(e.task_median_ms / 1000.0, "s"),
            None,
            Target::RatioAtMost {
                ratio: TARGET_SLOWEST_RATIO,
            },
            reps,
            vec![format!(
                "every task finished; p99 {} s",
                super::fmt_num(e.task_p99_ms / 1000.0)
            )],
        ),
        Measurement::new(
            "scale.peak_descriptors",
            format!("most descriptors open at once in the process driving {} tasks", super::fmt_num(tasks as f64)),
            Quantity::new(e.peak_fds as f64, "descriptors"),
            "the direct-calls process's peak",
            Quantity::new(d.peak_fds as f64, "descriptors"),
            None,
            Target::Below {
                value: e.fd_limit as f64,
            },
            reps,
            vec![format!(
                "{} open before the workload; the limit is the machine's hard open-files limit ({}), which the child does not raise; sampled every {} ms",
                super::fmt_num(e.start_fds as f64),
                super::fmt_num(e.fd_limit as f64),
                FD_SAMPLE.as_millis()
            )],
        ),
    ])
}
