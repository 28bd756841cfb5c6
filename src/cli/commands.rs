//! The CLI commands with a body of their own: `run` (live output, stdin, signals), `fork`,
//! `rm`, `config`, `export-snapshot`, and the notes and errors they share. `mod.rs` parses and
//! dispatches.

use super::*;
use taskbox::config::{Backend, CommandEnv};
use taskbox::provider::registry;

pub(super) async fn run(args: RunArgs, paths: &Paths) -> Result<ExitCode, Failure> {
    let task = task_id(&args.task)?;
    let command = shell_join(&args.command);
    // The same bounds as terminal.timeout, from the same table.
    if let Some(t) = args.timeout {
        Config::check_flag("terminal.timeout", "--timeout", t).map_err(Failure::from_config)?;
    }
    // Output streams to our stdout and stderr as it is produced; `--json` prints the result
    // (with the bounded capture) instead.
    let (output_tx, output_rx) = match args.json {
        true => (None, None),
        false => {
            let (tx, rx) = live::output_channel();
            (Some(tx), Some(rx))
        }
    };
    let mut env = CommandEnv::new();
    for arg in &args.env {
        env.assign(arg, |k| std::env::var(k).ok()).map_err(|e| {
            Failure::new(format!("--env: {e}"))
                .code("invalid_env")
                .hint(e.hint())
        })?;
    }
    let (canceller, cancel_rx) = Canceller::new();
    let io = ExecIo {
        output: output_tx,
        stdin: live::stdin_source(),
        cancel: Some(cancel_rx),
        env,
    };
    let mut signals = live::Signals::catch()?;
    let run = async {
        match route(paths)? {
            Route::InProcess => {
                let orch = open(paths).await?;
                let timeout = args.timeout.map(Duration::from_secs);
                let res = orch.run_live(&task, &command, timeout, io).await;
                orch.shutdown().await;
                res.map_err(Failure::from_engine)
            }
            #[cfg(feature = "server")]
            Route::Server(client, mode) => {
                let timeout = args.timeout;
                // Shared so that a retry after starting a server gets the same live side
                // (the client takes its parts only once a server answered).
                let io = std::sync::Arc::new(tokio::sync::Mutex::new(io));
                server::call(&client, mode, |c| {
                    let (task, command, io) = (task.clone(), command.clone(), io.clone());
                    async move {
                        let mut io = io.lock().await;
                        c.run_live(&task, &command, timeout, &mut io).await
                    }
                })
                .await
            }
        }
    };
    let (res, cancelled) = live::drive(run, output_rx, &canceller, &mut signals).await;
    let Some(res) = res else {
        // Cancelled, and the run did not come back: exit now, as a shell would. (Through the
        // server nothing is lost: the server finishes the cancel. In-process, the command was
        // signalled and is SIGKILLed 3 s later; the journal recovers whatever was in flight.)
        // `exit`, not a return: the runtime may be blocked waiting for a task lock.
        let signal = cancelled.expect("only a cancel gives up on the run");
        let _ = std::io::stdout().flush();
        std::process::exit(signal.exit_code());
    };
    if let (Err(f), Some(signal)) = (&res, cancelled) {
        // Cancelled while the task was another process's: nothing ran; the exit says which
        // signal ended the wait, as for a command.
        if output::has_code(f, "interrupted") {
            output::fail(f, args.json);
            return Ok(ExitCode::from(signal.exit_code() as u8));
        }
    }
    finish_run(res?, &task, args.json, args.timeout, cancelled, paths)
}

pub(super) async fn fork(args: ForkArgs, paths: &Paths) -> Result<ExitCode, Failure> {
    let task = task_id(&args.task)?;
    let child = task_id(&args.new_task)?;
    let from = args
        .snapshot
        .as_deref()
        .map_or(ForkFrom::Latest, |s| ForkFrom::parse(&task, s));
    let res = match route(paths)? {
        Route::InProcess => {
            let orch = open(paths).await?;
            let res = orch.fork(&task, &child, from).await;
            orch.shutdown().await;
            res.map_err(Failure::from_engine)?
        }
        #[cfg(feature = "server")]
        Route::Server(client, mode) => {
            server::call(&client, mode, |c| {
                let (task, child, snapshot) = (task.clone(), child.clone(), args.snapshot.clone());
                async move { c.fork(&task, &child, snapshot.as_deref()).await }
            })
            .await?
        }
    };
    if args.json {
        print_json(&res)?;
    } else {
        let taken = res
            .taken_at
            .map(|at| format!(", taken {}", taskbox::clock::format_ms(at)))
            .unwrap_or_default();
        eprintln!(
            "forked {} from {}.s{} (snapshot {}{taken}): `taskbox run --task {} -- CMD` restores it",
            res.task, res.parent, res.parent_seq, res.snapshot_id, res.task
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn rm(args: RmArgs, paths: &Paths) -> Result<ExitCode, Failure> {
    let task = task_id(&args.task)?;
    let keep = args.keep_snapshots;
    let res = match route(paths)? {
        Route::InProcess => {
            let orch = open_with(paths, false).await?;
            let res = orch.remove(&task, keep).await;
            orch.shutdown().await;
            res.map_err(Failure::from_engine)?
        }
        #[cfg(feature = "server")]
        Route::Server(client, mode) => {
            server::call(&client, mode, |c| {
                let task = task.clone();
                async move { c.remove(&task, keep).await }
            })
            .await?
        }
    };
    if args.json {
        print_json(&res)?;
    } else {
        let mut parts = Vec::new();
        if let Some(sb) = &res.sandbox_stopped {
            parts.push(format!("stopped sandbox {sb}"));
        }
        if !res.snapshots_deleted.is_empty() {
            parts.push(format!(
                "deleted snapshots {}",
                res.snapshots_deleted.join(", ")
            ));
        }
        if !res.snapshots_kept.is_empty() {
            parts.push(format!("kept snapshots {}", res.snapshots_kept.join(", ")));
        }
        let done = if parts.is_empty() {
            String::new()
        } else {
            format!(": {}", parts.join("; "))
        };
        eprintln!("removed {task}{done} (its journal is kept for `taskbox replay`)");
        for e in &res.errors {
            eprintln!("error: {e}");
        }
        if !res.errors.is_empty() {
            eprintln!("hint: the task is removed; `taskbox gc` stops and deletes what is left");
        }
    }
    Ok(if res.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_TASKBOX_ERROR)
    })
}

pub(super) fn config_cmd(cmd: ConfigCmd, paths: &Paths) -> Result<ExitCode, Failure> {
    let path = &paths.config_file;
    match cmd {
        ConfigCmd::Get { key } => {
            let cfg = Config::load(path).map_err(Failure::from_config)?;
            outln!("{}", cfg.get(&key).map_err(Failure::from_config)?);
            note_env_override(&key);
        }
        ConfigCmd::Set { key, value } => {
            // Unchecked, so that `config set` can repair a value the file got by hand; the
            // rest of the file is checked once the new value is in.
            let mut cfg = Config::load_unchecked(path).map_err(Failure::from_config)?;
            cfg.set(&key, &value).map_err(Failure::from_config)?;
            // Which backends exist is the registry's to say (an alias becomes the name).
            registry::check(&mut cfg, taskbox::config::ValueSource::Set)
                .map_err(Failure::from_config)?;
            cfg.save(path).map_err(Failure::from_config)?;
            cfg.validate(taskbox::config::ValueSource::File(path.clone()))
                .map_err(Failure::from_config)?;
            eprintln!(
                "set {key} = {} in {}",
                cfg.get(&key).map_err(Failure::from_config)?,
                path.display()
            );
            note_env_override(&key);
            #[cfg(feature = "server")]
            note_running_server(&key, paths);
        }
        ConfigCmd::Show(args) => {
            let cfg = Config::load(path).map_err(Failure::from_config)?;
            let pairs: Vec<(String, String)> = taskbox::config::KEYS
                .iter()
                .map(|k| (k.name.to_string(), k.value(&cfg)))
                .collect();
            if args.json {
                let map: serde_json::Map<String, serde_json::Value> = pairs
                    .into_iter()
                    .map(|(k, v)| (k, serde_json::Value::String(v)))
                    .collect();
                print_json(&map)?;
            } else {
                for (k, v) in pairs {
                    outln!("{k} = {v}");
                }
            }
            for k in taskbox::config::KEYS {
                note_env_override(k.name);
            }
            note_runtime_deprecation(&cfg);
        }
        ConfigCmd::Path => outln!("{}", path.display()),
    }
    Ok(ExitCode::SUCCESS)
}

/// Says on stderr when a legacy Vercel runtime is set (file or `TERMINAL_VERCEL_RUNTIME`): it
/// still wins over `terminal.vercel_image`, but is deprecated.
fn note_runtime_deprecation(cfg: &Config) {
    use taskbox::provider::vercel::settings;
    let env = |k: &str| std::env::var(k).ok();
    if let Ok(Some((runtime, origin))) = settings::check_runtime(&cfg.terminal, &env) {
        eprintln!("note: {}", settings::runtime_deprecation(runtime, origin));
    }
}

/// Says on stderr when an environment variable overrides the file's value of `key`, so the
/// value printed is not mistaken for the one in use.
fn note_env_override(key: &str) {
    let Ok(k) = taskbox::config::Key::find(key) else {
        return;
    };
    // Blank counts as unset, as where the variables are read.
    if let Some(var) = k
        .env
        .filter(|v| std::env::var(v).is_ok_and(|x| !x.trim().is_empty()))
    {
        eprintln!("note: {var} is set and overrides {key} where it is used");
    }
}

/// After `config set`, says what a running server makes of the new value: it applies a live key
/// (`config::live`) from its next request, and reads any other key only as it starts — then
/// this names the key and how to restart the server (issue 32 item 13: a changed
/// `terminal.timeout` went unapplied, silently). `terminal.server` is the CLI's own, read at
/// every command.
#[cfg(feature = "server")]
fn note_running_server(key: &str, paths: &Paths) {
    use taskbox::client::blocking::BlockingClient;
    if key == "terminal.server" || !BlockingClient::new(&paths.data_dir).probe(2_000) {
        return;
    }
    let pid = taskbox::client::server_pid(&paths.data_dir)
        .map(|p| format!(" (pid {p})"))
        .unwrap_or_default();
    if taskbox::config::live::applies_live(key) {
        eprintln!("note: the taskbox server{pid} applies the new {key} from its next command");
        return;
    }
    eprintln!(
        "note: the taskbox server{pid} running for {} reads {key} only as it starts: the new value applies once it restarts",
        paths.data_dir.display()
    );
    eprintln!(
        "hint: restart it with `taskbox serve --stop` (its live sandboxes are snapshotted first); the next command starts one with the new value"
    );
}

/// The failure for a task that does not exist, with the closest existing name as a hint.
pub(super) fn no_task(paths: &Paths, task: &TaskId) -> Failure {
    let names = existing_store(paths)
        .ok()
        .flatten()
        .and_then(|s| s.task_ids().ok())
        .unwrap_or_default();
    Failure::from_engine(taskbox::engine::EngineError::NoTask {
        task: task.clone(),
        suggestion: taskbox::engine::closest(task.as_str(), names.iter().map(TaskId::as_str)),
    })
}

/// `taskbox export-snapshot`: a task's local snapshot as a plain tarball on stdout.
pub(super) fn export_snapshot(
    paths: &Paths,
    args: &ExportSnapshotArgs,
) -> Result<ExitCode, Failure> {
    use taskbox::core::SnapshotStatus;
    let task = task_id(&args.task)?;
    let view = match existing_store(paths).map_err(|e| Failure::from_engine(e.into()))? {
        Some(store) => TaskView::load(&store, &task, 0, None).map_err(Failure::from_engine)?,
        None => None,
    };
    let Some(view) = view else {
        return Err(no_task(paths, &task));
    };
    // The task's backend, as its marks record it, says whether its snapshots can be read here;
    // one not recorded yet is read as the default backend's, as it always was.
    let default = Backend::default();
    let backend = view.marks.backend.as_deref().unwrap_or(default.as_str());
    let Some(export) = registry::named(backend).and_then(|b| b.export_snapshot) else {
        let readable: Vec<&str> = registry::BACKENDS
            .iter()
            .filter(|b| b.export_snapshot.is_some())
            .map(|b| b.name())
            .collect();
        return Err(Failure::new(format!(
            "task `{task}` keeps its snapshots on the `{backend}` backend; export-snapshot reads \
             {} snapshots only",
            readable.join(", ")
        ))
        .code("invalid"));
    };
    let complete: Vec<_> = view
        .task
        .snapshots
        .iter()
        .filter(|s| s.status == SnapshotStatus::Complete)
        .filter_map(|s| s.id.as_ref().map(|id| (s.seq, id.clone())))
        .collect();
    let chosen = match &args.snapshot {
        None => complete.iter().max_by_key(|(seq, _)| *seq),
        Some(want) => complete
            .iter()
            .find(|(seq, id)| id.as_str() == want || seq.to_string() == *want),
    };
    let Some((_, id)) = chosen else {
        let listed: Vec<String> = complete
            .iter()
            .map(|(seq, id)| format!("{seq} ({id})"))
            .collect();
        return Err(match &args.snapshot {
            None => Failure::new(format!("task `{task}` has no complete snapshot to export"))
                .hint(format!("`taskbox suspend {task}` takes one")),
            Some(want) => Failure::new(format!(
                "task `{task}` has no complete snapshot `{}`",
                want.escape_debug()
            ))
            .hint(if listed.is_empty() {
                "it has no complete snapshot".to_string()
            } else {
                format!("its complete snapshots: {}", listed.join(", "))
            }),
        }
        .code("snapshot_not_found"));
    };
    let stdout = std::io::stdout();
    if std::io::IsTerminal::is_terminal(&stdout) {
        return Err(
            Failure::new("refusing to write a tarball to a terminal").hint(format!(
                "redirect it: `taskbox export-snapshot {task} > files.tar.zst`"
            )),
        );
    }
    let mut out = std::io::BufWriter::with_capacity(256 * 1024, stdout.lock());
    export(&paths.data_dir, id, &mut out).map_err(|e| {
        let code = match e.kind {
            taskbox::core::FailureKind::SnapshotGone => "snapshot_not_found",
            _ => "error",
        };
        Failure::new(e.to_string()).code(code)
    })?;
    let _ = out
        .into_inner()
        .map_err(|e| Failure::new(format!("cannot write the tarball: {}", e.error())))?;
    Ok(ExitCode::SUCCESS)
}
