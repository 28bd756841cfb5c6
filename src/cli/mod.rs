//! Argument parsing, dispatch and printing.

/// `println!` for data on stdout: a closed stdout (`taskbox show demo | head -1`) is the end of
/// the output, not a panic, as for other CLIs ([`output::out_line`]).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::output::out_line(format!($($arg)*))
    };
}

#[cfg(feature = "bench")]
mod bench;
#[cfg(feature = "chaos")]
mod chaos;
mod checkpoint;
mod commands;
mod cost;
#[cfg(feature = "server")]
mod dashboard;
mod doctor;
#[cfg(feature = "fake")]
mod fake;
#[cfg(all(feature = "server", target_os = "linux"))]
mod fast;
#[cfg(all(test, feature = "server", target_os = "linux"))]
mod fast_tests;
mod live;
#[cfg(feature = "mcp")]
mod mcp;
mod output;
mod replay;
mod run_io;
#[cfg(feature = "server")]
mod server;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use taskbox::config::Config;
use taskbox::core::ForkFrom;
use taskbox::engine::{Orchestrator, Paths, TaskView};
use taskbox::provider::{Canceller, ExecIo};
use taskbox::store::{Store, StoreError};
use taskbox::TaskId;

use commands::{config_cmd, export_snapshot, fork, no_task, rm, run};
use output::{fail, print_json, Failure};
use run_io::{finish_run, shell_join};
#[cfg(feature = "server")]
use server::{route, Route};

/// Without the `server` feature every command drives tasks in-process.
#[cfg(not(feature = "server"))]
enum Route {
    InProcess,
}

#[cfg(not(feature = "server"))]
fn route(_: &Paths) -> Result<Route, Failure> {
    Ok(Route::InProcess)
}

pub use output::EXIT_TASKBOX_ERROR;

/// Gives every agent task its own sandbox: runs each command in the task's sandbox, creating it
/// on first use, and keeps the task's files in snapshots across sandboxes.
#[derive(Parser, Debug)]
// `bin_name`: usage lines say `taskbox` whichever binary parses them (the engine, run by the
// front with argv[0] kept, or directly as `taskbox-engine`).
#[command(name = "taskbox", bin_name = "taskbox", version, about, long_about = None)]
struct Cli {
    /// More logging on stderr (-v info, -vv debug, -vvv trace). `RUST_LOG` overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Send the task commands to the server at this URL (`taskbox serve --listen ADDR` on
    /// another machine, as http://HOST:PORT) instead of this data dir's. Also
    /// TASKBOX_SERVER_URL. The token: TASKBOX_TOKEN, or --token-file.
    #[cfg(feature = "server")]
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// With --server: a file holding the server's bearer token (instead of TASKBOX_TOKEN).
    #[cfg(feature = "server")]
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a command in a task's sandbox (created or restored as needed).
    ///
    /// Prints the command's stdout and stderr and exits with its exit code; a timeout exits 124.
    Run(RunArgs),
    /// Snapshot a task's files (when terminal.container_persistent) and stop its sandbox.
    Suspend(TaskArgs),
    /// Restore a task's latest snapshot into a live sandbox now, without running anything.
    Resume(TaskArgs),
    /// Make a new task from one of a task's snapshots (the latest by default; a live task is
    /// snapshotted first). The new task starts expired: its first command restores the
    /// snapshot into a sandbox of its own. Nothing is copied; the snapshot is shared.
    Fork(ForkArgs),
    /// Snapshot a task's live sandbox without stopping it: its processes are paused for the
    /// moment and run on (on a backend that cannot, the snapshot stops the sandbox and says so).
    Checkpoint(checkpoint::CheckpointArgs),
    /// Put a task's files back as one of its snapshots held them: the current files are kept
    /// in a checkpoint first (rewinding to it undoes this), then the snapshot is restored into
    /// a new sandbox (live processes end).
    Rewind(checkpoint::RewindArgs),
    /// Remove a task: stop its sandbox, delete its snapshots (unless --keep-snapshots) and mark
    /// it removed. Its journal is kept for `taskbox replay`; its name is not reused.
    Rm(RmArgs),
    /// List every task with its state.
    Tasks(TasksArgs),
    /// Show a task: state, sandbox, snapshots and recent journal.
    Show(ShowArgs),
    /// What tasks used, from their journals: sandbox time, creations, snapshot storage, and on
    /// Vercel active CPU, memory and an estimate at list price (`cost.*` keys).
    Cost(cost::CostArgs),
    /// Read and change the configuration (Hermes-style `terminal.*` keys).
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Check the configuration, credentials, data dir and store: one line per check.
    Doctor(doctor::DoctorArgs),
    /// Stop this installation's orphaned sandboxes and delete snapshots no task retains.
    Gc(GcArgs),
    /// Run many tasks against a simulated, fault-injecting platform (with engine crashes) on
    /// virtual time, and check taskbox's invariants after every seed.
    #[cfg(feature = "chaos")]
    Chaos(chaos::ChaosArgs),
    /// Serve a local fake of the Vercel Sandbox API (for offline tests of agents and taskbox).
    #[cfg(feature = "fake")]
    FakeVercel(fake::FakeArgs),
    /// Run the engine for this data dir as a server (the CLI starts one itself when needed).
    #[cfg(feature = "server")]
    Serve(server::ServeArgs),
    /// Is a server running for this data dir: since when, its pid, tasks with live sandboxes.
    ///
    /// Exits 1 when no server runs.
    #[cfg(feature = "server")]
    Status(JsonArg),
    /// Follow a task's transitions as the server commits them (its state now, then one line
    /// per change), until the server stops.
    #[cfg(feature = "server")]
    Watch(TaskArgs),
    /// Serve the dashboard of this data dir's server on a loopback port (a login token is
    /// printed), until Ctrl-C: the tasks live, each task's timeline, the fork tree.
    #[cfg(feature = "server")]
    Dashboard(dashboard::DashboardArgs),
    /// Serve taskbox to MCP clients (coding agents): tools to run commands in a task's sandbox,
    /// suspend and resume it, list and show tasks, read and write its files.
    ///
    /// Speaks MCP over stdio (the client starts `taskbox mcp`), or streamable HTTP at
    /// http://ADDR/mcp with --http ADDR --token-file FILE.
    #[cfg(feature = "mcp")]
    Mcp(mcp::McpArgs),
    /// Check a task's journal against today's code (exit 1 on a divergence); show its timeline.
    Replay(replay::ReplayArgs),
    /// Write a task's journal as portable JSONL (secrets redacted), for `replay --journal`.
    Export(replay::ExportArgs),
    /// Write a task's local snapshot (its latest complete one, or SNAPSHOT) as a plain
    /// zstd-compressed tarball on stdout: `taskbox export-snapshot TASK > files.tar.zst`.
    ExportSnapshot(ExportSnapshotArgs),
    /// Measure taskbox's overhead against baselines run side by side (see docs/performance.md).
    #[cfg(feature = "bench")]
    Bench(bench::BenchArgs),
}

#[derive(Args, Debug)]
struct GcArgs {
    /// Only report what would be stopped or deleted.
    #[arg(long)]
    dry_run: bool,
    /// Print JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The task whose sandbox runs the command.
    #[arg(long, short = 't')]
    task: String,
    /// Per-command timeout in seconds (default: terminal.timeout).
    #[arg(long)]
    timeout: Option<u64>,
    /// Print a JSON result on stdout instead of the command's output.
    #[arg(long)]
    json: bool,
    /// A variable for the command: NAME=VALUE, or NAME for its value in this environment
    /// (repeatable; over terminal.env). Values are secrets: never journaled nor shown.
    #[arg(long = "env", short = 'e', value_name = "NAME[=VALUE]")]
    env: Vec<String>,
    /// The command: one shell string, or a program and its arguments (quoted for `bash -c`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct TaskArgs {
    /// The task.
    task: String,
    /// Print JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ForkArgs {
    /// The task to fork.
    task: String,
    /// The new task's name.
    new_task: String,
    /// Fork from this snapshot instead of the latest: `TASK.sN` (as `taskbox show` numbers
    /// them) or a provider snapshot id.
    #[arg(long)]
    snapshot: Option<String>,
    /// Print JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct TasksArgs {
    /// Show forks under the task they were forked from.
    #[arg(long)]
    tree: bool,
    /// Print JSON on stdout (with --tree: each task's forks nested under `forks`).
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct RmArgs {
    /// The task.
    task: String,
    /// Keep the task's snapshots (they stay listed by `taskbox show`, and gc keeps them).
    #[arg(long)]
    keep_snapshots: bool,
    /// Print JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct JsonArg {
    /// Print JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ExportSnapshotArgs {
    /// The task.
    task: String,
    /// The snapshot: its id or its sequence number (default: the latest complete one).
    snapshot: Option<String>,
}

#[derive(Args, Debug)]
struct ShowArgs {
    /// The task.
    task: String,
    /// Journal entries to include.
    #[arg(long, default_value_t = 20)]
    journal: usize,
    /// Print JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum ConfigCmd {
    /// Print one key's value.
    Get {
        /// A key such as terminal.backend.
        key: String,
    },
    /// Set one key.
    Set {
        /// A key such as terminal.backend.
        key: String,
        /// Its new value.
        value: String,
    },
    /// Print every key with its value.
    Show(JsonArg),
    /// Print the config file's path.
    Path,
}

/// Parses arguments, runs, and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    // A plain `taskbox run` through a running server, before any of the rest is set up.
    #[cfg(all(feature = "server", target_os = "linux"))]
    if let Some(code) = fast::run() {
        return code;
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    let json = cli.cmd.json();
    // A server logs what it does (to its terminal, or to serve.log when auto-started).
    #[cfg(feature = "server")]
    let verbose = if matches!(cli.cmd, Cmd::Serve(_)) {
        cli.verbose.max(1)
    } else {
        cli.verbose
    };
    #[cfg(not(feature = "server"))]
    let verbose = cli.verbose;
    init_logging(verbose);
    let paths = Paths::from_env(|k| std::env::var(k).ok());
    #[cfg(feature = "server")]
    if let Err(failure) =
        server::choose_remote(cli.server.as_deref(), cli.token_file.as_deref(), &cli.cmd)
    {
        return fail(&failure, json);
    }
    // A command that only talks to a server, or only reads, needs no worker threads (starting
    // them is a measurable part of a warm `taskbox run`); an engine, a server or a fake gets two.
    let mut builder = if engine_in_process(&cli.cmd, &paths) {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(2);
        b
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(&Failure::from_anyhow(anyhow::Error::new(e)), json),
    };
    match runtime.block_on(dispatch(cli.cmd, &paths)) {
        Ok(code) => code,
        Err(failure) => fail(&failure, json),
    }
}

/// A command line clap refused: exit 125 like every failure of taskbox's own (a command's own
/// exit 2 stays unambiguous), with the error object on stdout when `--json` was asked for.
/// `--help` and `--version` print and exit 0.
fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let rendered = e.render().to_string();
    let message = rendered
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("invalid command line")
        .trim_start_matches("error: ")
        .to_string();
    // Before `--`, as the command after it is the user's.
    let json = std::env::args()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json");
    if json {
        let _ = print_json(&serde_json::json!({
            "code": "usage",
            "message": message,
            "hint": "`taskbox help` or `taskbox COMMAND --help` shows the usage",
        }));
    }
    let _ = e.print();
    ExitCode::from(EXIT_TASKBOX_ERROR)
}

impl Cmd {
    /// Whether the command was asked for JSON output (failures then print an error object).
    fn json(&self) -> bool {
        match self {
            Cmd::Run(a) => a.json,
            Cmd::Suspend(a) | Cmd::Resume(a) => a.json,
            Cmd::Rm(a) => a.json,
            Cmd::Fork(a) => a.json,
            Cmd::Checkpoint(a) => a.json(),
            Cmd::Rewind(a) => a.json(),
            Cmd::Tasks(a) => a.json,
            Cmd::Doctor(a) => a.json,
            Cmd::Show(a) => a.json,
            Cmd::Cost(a) => a.json,
            Cmd::Config(ConfigCmd::Show(a)) => a.json,
            Cmd::Config(_) => false,
            Cmd::Gc(a) => a.json,
            #[cfg(feature = "server")]
            Cmd::Status(a) => a.json,
            #[cfg(feature = "server")]
            Cmd::Watch(a) => a.json,
            #[cfg(feature = "server")]
            Cmd::Dashboard(a) => a.json,
            #[cfg(feature = "server")]
            Cmd::Serve(_) => false,
            #[cfg(feature = "mcp")]
            Cmd::Mcp(_) => false,
            #[cfg(feature = "chaos")]
            Cmd::Chaos(a) => a.json(),
            #[cfg(feature = "fake")]
            Cmd::FakeVercel(_) => false,
            #[cfg(feature = "bench")]
            Cmd::Bench(a) => a.json(),
            Cmd::Replay(a) => a.json(),
            Cmd::Export(_) | Cmd::ExportSnapshot(_) => false,
        }
    }
}

/// Whether `cmd` runs an engine (or a server, or a fake) in this process.
#[cfg_attr(not(feature = "server"), allow(unused_variables))]
fn engine_in_process(cmd: &Cmd, paths: &Paths) -> bool {
    match cmd {
        #[cfg(feature = "server")]
        Cmd::Run(_)
        | Cmd::Suspend(_)
        | Cmd::Resume(_)
        | Cmd::Gc(_)
        | Cmd::Fork(_)
        | Cmd::Checkpoint(_)
        | Cmd::Rewind(_) => !matches!(route(paths), Ok(Route::Server(..))),
        Cmd::Tasks(_)
        | Cmd::Show(_)
        | Cmd::Cost(_)
        | Cmd::Config(_)
        | Cmd::Export(_)
        | Cmd::ExportSnapshot(_) => false,
        #[cfg(feature = "server")]
        Cmd::Status(_) | Cmd::Watch(_) | Cmd::Dashboard(_) => false,
        _ => true,
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // No colour codes in a file (an auto-started server's serve.log).
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// `$op` (`suspend`, `resume`) of `$task` as [`route`] says: on an orchestrator opened in this
/// process (and shut down after), or through the server.
macro_rules! routed {
    ($paths:expr, $task:expr, $op:ident) => {
        match route($paths)? {
            Route::InProcess => {
                let orch = open($paths).await?;
                let res = orch.$op(&$task).await;
                orch.shutdown().await;
                res.map_err(Failure::from_engine)?
            }
            #[cfg(feature = "server")]
            Route::Server(client, mode) => {
                server::call(&client, mode, |c| {
                    let task = $task.clone();
                    async move { c.$op(&task).await }
                })
                .await?
            }
        }
    };
}

async fn dispatch(cmd: Cmd, paths: &Paths) -> Result<ExitCode, Failure> {
    match cmd {
        Cmd::Run(args) => run(args, paths).await,
        Cmd::Suspend(args) => {
            let task = task_id(&args.task)?;
            let res = routed!(paths, task, suspend);
            if args.json {
                print_json(&serde_json::json!({
                    "task": task.as_str(),
                    "snapshot_id": res.snapshot_id,
                    "omitted": res.omitted,
                }))?;
            } else {
                match &res.snapshot_id {
                    Some(id) => eprintln!("suspended {task}: files kept in snapshot {id}"),
                    None => eprintln!("suspended {task}: no snapshot kept (terminal.container_persistent is false or nothing ran)"),
                }
                if !res.omitted.is_empty() {
                    eprintln!(
                        "note: {} path(s) could not be read and are not in the snapshot (everything else is):",
                        res.omitted.len()
                    );
                    for what in &res.omitted {
                        eprintln!("  {what}");
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Resume(args) => {
            let task = task_id(&args.task)?;
            let res = routed!(paths, task, resume);
            if args.json {
                print_json(&serde_json::json!({
                    "task": task.as_str(), "sandbox_id": res.sandbox_id, "notices": res.notices,
                }))?;
            } else {
                output::print_notices(&res.notices);
                eprintln!("resumed {task}: sandbox {} is live", res.sandbox_id);
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Rm(args) => rm(args, paths).await,
        Cmd::Fork(args) => fork(args, paths).await,
        Cmd::Checkpoint(args) => checkpoint::checkpoint(args, paths).await,
        Cmd::Rewind(args) => checkpoint::rewind(args, paths).await,
        #[cfg(feature = "server")]
        Cmd::Tasks(args) if server::remote_client(paths).is_some() => {
            let client = server::remote_client(paths).expect("checked by the guard");
            let tasks = server::remote_tasks(&client).await?;
            let removed = output::Removed::new();
            let now = taskbox::clock::Clock::now_ms(&taskbox::clock::SystemClock);
            match (args.json, args.tree) {
                (true, false) => print_json(&output::tasks_json(&tasks, now, &removed))?,
                (true, true) => print_json(&output::tasks_tree_json(&tasks, now, &removed))?,
                (false, false) => output::print_tasks(&tasks, now, &removed)?,
                (false, true) => output::print_tasks_tree(&tasks, now, &removed)?,
            }
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(feature = "server")]
        Cmd::Show(args) if server::remote_client(paths).is_some() => {
            let client = server::remote_client(paths).expect("checked by the guard");
            let task = task_id(&args.task)?;
            let view = server::remote_view(&client, &task, args.journal).await?;
            if args.json {
                print_json(&output::view_json(&view)?)?;
            } else {
                output::print_view(&view)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Tasks(args) => {
            // Read-only: straight from the store, with no provider (and so no credentials).
            let store_err = |e: StoreError| Failure::from_engine(e.into());
            let store = existing_store(paths).map_err(store_err)?;
            let (tasks, removed) = stored_tasks(store.as_ref())?;
            let now = taskbox::clock::Clock::now_ms(&taskbox::clock::SystemClock);
            // `--json` carries each task's cost totals (all time), read from its journal.
            let costs = |tasks: &[taskbox::core::Task]| -> Result<_, Failure> {
                let mut costs = std::collections::BTreeMap::new();
                if let Some(store) = &store {
                    let prices = Config::load(&paths.config_file)
                        .map_err(Failure::from_config)?
                        .prices();
                    let window = taskbox::engine::cost::window(None, now);
                    for t in tasks {
                        let (l, b) = taskbox::engine::cost::task_ledger(store, &t.id, window)
                            .map_err(Failure::from_engine)?;
                        costs.insert(
                            t.id.to_string(),
                            taskbox::engine::cost::ledger_json(&l, b.as_deref(), &prices),
                        );
                    }
                }
                Ok(costs)
            };
            match (args.json, args.tree) {
                (true, false) => {
                    let mut v = output::tasks_json(&tasks, now, &removed);
                    output::add_costs(&mut v, &costs(&tasks)?);
                    print_json(&v)?
                }
                (true, true) => {
                    let mut v = output::tasks_tree_json(&tasks, now, &removed);
                    output::add_costs(&mut v, &costs(&tasks)?);
                    print_json(&v)?
                }
                (false, false) => output::print_tasks(&tasks, now, &removed)?,
                (false, true) => output::print_tasks_tree(&tasks, now, &removed)?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Show(args) => {
            let task = task_id(&args.task)?;
            let store = existing_store(paths).map_err(|e| Failure::from_engine(e.into()))?;
            let view = match &store {
                Some(store) => TaskView::load(store, &task, args.journal, None)
                    .map_err(Failure::from_engine)?,
                None => None,
            };
            let (Some(view), Some(store)) = (view, store) else {
                return Err(no_task(paths, &task));
            };
            // The task's cost totals (all time), from its journal, as `taskbox cost TASK`.
            let now = taskbox::clock::Clock::now_ms(&taskbox::clock::SystemClock);
            let prices = Config::load(&paths.config_file)
                .map_err(Failure::from_config)?
                .prices();
            let (ledger, backend) = taskbox::engine::cost::task_ledger(
                &store,
                &task,
                taskbox::engine::cost::window(None, now),
            )
            .map_err(Failure::from_engine)?;
            let cost = taskbox::engine::cost::ledger_json(&ledger, backend.as_deref(), &prices);
            if args.json {
                let mut v = output::view_json(&view)?;
                v["cost"] = cost;
                print_json(&v)?;
            } else {
                output::print_view(&view)?;
                outln!("{}", output::cost_line(&cost));
            }
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(feature = "server")]
        Cmd::Cost(args) if server::remote_client(paths).is_some() => {
            cost::remote(args, paths).await
        }
        Cmd::Cost(args) => cost::run(args, paths),
        Cmd::Config(cmd) => config_cmd(cmd, paths),
        Cmd::ExportSnapshot(args) => export_snapshot(paths, &args),
        #[cfg(feature = "bench")]
        Cmd::Bench(args) => bench::run(args),
        Cmd::Doctor(args) => doctor::run(paths, args).await,
        #[cfg(feature = "chaos")]
        Cmd::Chaos(args) => chaos::run(args).await,
        #[cfg(feature = "fake")]
        Cmd::FakeVercel(args) => fake::run(args, paths.data_dir.join("fake-vercel")).await,
        #[cfg(feature = "server")]
        Cmd::Serve(args) => server::serve(args, paths).await,
        #[cfg(feature = "server")]
        Cmd::Status(args) => server::status(paths, args.json).await,
        #[cfg(feature = "mcp")]
        Cmd::Mcp(args) => mcp::run(args, paths).await,
        #[cfg(feature = "server")]
        Cmd::Watch(args) => server::watch(paths, &task_id(&args.task)?, args.json).await,
        #[cfg(feature = "server")]
        Cmd::Dashboard(args) => dashboard::run(args, paths).await,
        Cmd::Gc(args) => {
            let report = match route(paths)? {
                Route::InProcess => {
                    let orch = open_with(paths, false).await?;
                    let report = orch.gc(args.dry_run).await;
                    orch.shutdown().await;
                    report.map_err(Failure::from_engine)?
                }
                #[cfg(feature = "server")]
                Route::Server(client, mode) => {
                    let dry_run = args.dry_run;
                    server::call(&client, mode, |c| async move { c.gc(dry_run).await }).await?
                }
            };
            if args.json {
                print_json(&report)?;
            } else {
                output::print_gc(&report)?;
            }
            Ok(if report.errors.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_TASKBOX_ERROR)
            })
        }
        Cmd::Replay(args) => replay::replay(args, paths),
        Cmd::Export(args) => replay::export(args, paths),
    }
}

fn task_id(s: &str) -> Result<TaskId, Failure> {
    // The engine's error, so the code (`invalid_task_id`) and hint are the server's too.
    TaskId::new(s).map_err(|e| Failure::from_engine(e.into()))
}

/// Opens the store for a command that only reads it: `None` when this home has no store yet,
/// so that reading never creates one.
fn existing_store(paths: &Paths) -> Result<Option<Store>, StoreError> {
    // The configured store (`terminal.store` / TASKBOX_STORE); a config that cannot be read
    // leaves the data dir's file, as before.
    let location = Config::load(&paths.config_file)
        .ok()
        .and_then(|c| c.store(|k| std::env::var(k).ok()).ok())
        .and_then(|s| s.url().map(str::to_string));
    match Store::open_location(location.as_deref(), &paths.store_file(), false) {
        Ok(store) => Ok(Some(store)),
        Err(StoreError::Missing { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The tasks in `store` and the ids of its removed ones (none without a store), read straight
/// from it: `taskbox tasks` and the MCP `list_tasks`.
fn stored_tasks(
    store: Option<&Store>,
) -> Result<(Vec<taskbox::core::Task>, output::Removed), Failure> {
    let store_err = |e: StoreError| Failure::from_engine(e.into());
    let Some(store) = store else {
        return Ok((Vec::new(), output::Removed::new()));
    };
    let mut tasks = store.load_tasks().map_err(store_err)?;
    let removed: std::collections::HashMap<_, _> = store
        .removed_tasks()
        .map_err(store_err)?
        .into_iter()
        .collect();
    // A removed task's snapshots as they stand after the removal, not as its journal last
    // recorded them.
    for t in &mut tasks {
        if let Some(marks) = removed.get(t.id.as_str()) {
            taskbox::engine::as_removed(store, t, marks).map_err(Failure::from_engine)?;
        }
    }
    Ok((tasks, removed.into_keys().collect()))
}

/// Opens the one-shot orchestrator of a command that drives tasks under `terminal.server =
/// never`. It does not reconcile at start: that lists every sandbox and snapshot of the
/// installation, which no command may pay for; `taskbox gc` (or a server) does it.
async fn open(paths: &Paths) -> Result<Orchestrator, Failure> {
    open_with(paths, false).await
}

async fn open_with(paths: &Paths, reconcile: bool) -> Result<Orchestrator, Failure> {
    let mut config = Config::load(&paths.config_file).map_err(Failure::from_config)?;
    config.terminal.store = config
        .store(|k| std::env::var(k).ok())
        .map_err(Failure::from_config)?;
    Orchestrator::builder(paths.data_dir.clone(), config)
        .reconcile_on_start(reconcile)
        .on_lock_wait(|w| eprintln!("{}", output::lock_wait_text(w)))
        .open()
        .await
        .map_err(Failure::from_engine)
}
