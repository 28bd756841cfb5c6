//! The fleet's benchmarks (with `bench --postgres URL`; skipped, saying so, without one). Each
//! uses scratch databases of its own on that URL's server (created and dropped here; its user
//! needs CREATEDB), so nothing a server recovers at start comes from another benchmark.
//!
//! - `fleet.run_latency`: a warm `taskbox run` through a server whose store is PostgreSQL,
//!   against the same through a server on the SQLite file (local backend both), interleaved.
//! - `fleet.takeover`: tasks per second a server takes over after another is SIGKILLed (from
//!   the moment the dead server's leases have expired: one `taskbox run` per task, four at a
//!   time, each recovering the task from the journal and probing its sandbox on the fake
//!   Vercel server), against the same commands on the same tasks once that server drives them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::server::{taskbox, BenchServer};
use super::stats::{ms, Paired};
use super::{median, BenchError, Ctx, Measurement, Quantity, Target};
use crate::config::{Config, StoreSetting};
use crate::fake::{FakeOptions, FakeServer};
use crate::store::{PgStore, PgTarget};

const BENCH: &str = "fleet";
/// Client processes at once in the takeover row.
const CONCURRENCY: usize = 4;
/// The lease of the takeover row's servers (short, so a round waits little; not shorter, so
/// that a loaded machine does not see its own leases lapse).
const LEASE_SECONDS: u64 = 3;

/// A scratch database on `url`'s server, dropped when this is.
struct Scratch {
    admin: PgTarget,
    name: String,
    url: String,
}

impl Scratch {
    fn create(url: &str, what: &str) -> Result<Scratch, BenchError> {
        let fail = |e: crate::store::StoreError| BenchError::Store {
            bench: BENCH,
            action: format!(
                "create a scratch database (the --postgres user needs CREATEDB): {what}"
            ),
            source: Box::new(e),
        };
        let admin = PgTarget::parse(url).map_err(fail)?;
        let name = format!("taskbox_bench_{what}_{}", std::process::id());
        let (_, db_url) = PgTarget::url_with_database(url, &name).map_err(fail)?;
        // A database left by an earlier run that was killed goes first.
        PgStore::scratch_database(&admin, &name, false).map_err(fail)?;
        PgStore::scratch_database(&admin, &name, true).map_err(fail)?;
        Ok(Scratch {
            admin,
            name,
            url: db_url,
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = PgStore::scratch_database(&self.admin, &self.name, false);
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    super::runtime(BENCH)
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One `taskbox run --task TASK CMD` for `home`: its wall time and stdout, or its `--json`
/// error code (`Err(Ok(code))`), or a failure to run it at all.
fn run_once(
    exe: &Path,
    home: &Path,
    env: &[(String, String)],
    task: &str,
    cmd: &str,
) -> Result<Result<(f64, String), String>, BenchError> {
    let mut c = taskbox(exe, home, env);
    c.args(["run", "--json", "--task", task, cmd]);
    let t = Instant::now();
    let out = c
        .output()
        .map_err(BenchError::io(BENCH, format!("spawn {}", exe.display())))?;
    let took = ms(t.elapsed());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    if out.status.success() {
        Ok(Ok((
            took,
            v["stdout"].as_str().unwrap_or_default().to_string(),
        )))
    } else {
        Ok(Err(format!(
            "{}: {}",
            v["code"].as_str().unwrap_or("?"),
            v["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&out.stderr).trim().to_string())
        )))
    }
}

/// [`run_once`] that must succeed with `expect` on stdout.
fn run_ok(
    exe: &Path,
    home: &Path,
    env: &[(String, String)],
    task: &str,
    cmd: &str,
    expect: &str,
) -> Result<f64, BenchError> {
    match run_once(exe, home, env, task, cmd)? {
        Ok((took, out)) if out == expect => Ok(took),
        Ok((_, out)) => Err(BenchError::failed(
            BENCH,
            format!("`taskbox run --task {task} {cmd}` answered {out:?}, not {expect:?}"),
        )),
        Err(e) => Err(BenchError::failed(
            BENCH,
            format!("`taskbox run --task {task} {cmd}` failed: {e}"),
        )),
    }
}

pub(super) fn run(ctx: &mut Ctx<'_>) -> Result<Vec<Measurement>, BenchError> {
    let Some(url) = ctx.opts.postgres.clone() else {
        for name in ["fleet.run_latency", "fleet.takeover"] {
            if ctx.wants(name) {
                ctx.say(&format!(
                    "{name}: skipped (no --postgres URL: it needs a PostgreSQL server whose user may create databases)"
                ));
            }
        }
        return Ok(Vec::new());
    };
    let mut rows = Vec::new();
    if ctx.wants("fleet.run_latency") {
        let n = ctx.opts.mode.pick(10, 200, 400);
        ctx.say(&format!(
            "fleet.run_latency: {n} warm `taskbox run` through a server on each store"
        ));
        let dir = ctx.subdir("fleet-latency")?;
        rows.push(run_latency(&ctx.opts.exe, &dir, &url, n)?);
    }
    if ctx.wants("fleet.takeover") {
        let (tasks, rounds) = ctx.opts.mode.pick((4, 1), (40, 3), (100, 5));
        ctx.say(&format!(
            "fleet.takeover: {rounds} round(s) of {tasks} tasks taken over after a SIGKILL"
        ));
        let dir = ctx.subdir("fleet-takeover")?;
        rows.push(takeover(&ctx.opts.exe, &dir, &url, tasks, rounds)?);
    }
    Ok(rows)
}

fn run_latency(exe: &Path, dir: &Path, url: &str, n: usize) -> Result<Measurement, BenchError> {
    let db = Scratch::create(url, "latency")?;
    let pg_home = dir.join("postgres");
    let sqlite_home = dir.join("sqlite");
    for h in [&pg_home, &sqlite_home] {
        std::fs::create_dir_all(h)
            .map_err(BenchError::io(BENCH, format!("create {}", h.display())))?;
    }
    let pg_env = env(&[("TASKBOX_SERVER", "always"), ("TASKBOX_STORE", &db.url)]);
    let sqlite_env = env(&[("TASKBOX_SERVER", "always")]);
    let rt = runtime()?;
    let pg = rt.block_on(BenchServer::start(exe, &pg_home, &pg_env))?;
    let sqlite = rt.block_on(BenchServer::start(exe, &sqlite_home, &sqlite_env))?;
    let measured = (|| {
        let task = "bench-fleet";
        for _ in 0..3 {
            run_ok(exe, &pg_home, &pg_env, task, "echo ok", "ok\n")?;
            run_ok(exe, &sqlite_home, &sqlite_env, task, "echo ok", "ok\n")?;
        }
        let mut p = Paired::default();
        let mut pg_run = || run_ok(exe, &pg_home, &pg_env, task, "echo ok", "ok\n");
        let mut sqlite_run = || run_ok(exe, &sqlite_home, &sqlite_env, task, "echo ok", "ok\n");
        for i in 0..n {
            p.take(i, &mut pg_run, &mut sqlite_run)?;
        }
        Ok::<_, BenchError>(p)
    })();
    rt.block_on(pg.stop());
    rt.block_on(sqlite.stop());
    drop(db);
    let p = measured?;
    Ok(Measurement::paired_ms(
        "fleet.run_latency",
        "a warm `taskbox run --task T 'echo ok'` through a server whose store is PostgreSQL (local backend; the database on this machine, durable commits)",
        "the same through a server on the SQLite file (WAL, synchronous=FULL)",
        &p,
        Target::Report,
        vec!["a command waits for one durable commit (its request) on either store; on PostgreSQL it is a round trip and the server's WAL flush, and the lease taken once per task".to_string()],
    ))
}

/// The takeover row's servers: the fake Vercel server's URL, the store, a lease of
/// [`LEASE_SECONDS`].
fn fleet_home(home: &Path, fake_url: &str) -> Result<(), BenchError> {
    std::fs::create_dir_all(home)
        .map_err(BenchError::io(BENCH, format!("create {}", home.display())))?;
    let mut c = Config::default();
    c.terminal.backend = crate::provider::vercel::BACKEND.backend();
    c.terminal.container_cpu = 1;
    c.terminal.container_memory = 2048;
    c.terminal.vercel_api_url = fake_url.to_string();
    c.terminal.lease_seconds = LEASE_SECONDS;
    // The store comes from TASKBOX_STORE (the URL holds what a config file should not).
    c.terminal.store = StoreSetting::default();
    c.save(&home.join("config.toml"))
        .map_err(|e| BenchError::failed(BENCH, format!("write the config: {e}")))
}

/// Runs `cat f` in every task of `tasks` through `home`'s server, [`CONCURRENCY`] processes at
/// once, sending a request again while it is answered retryably (`task_elsewhere`: the dead
/// server's lease not yet expired; `task_moved`: the server gave the task up, its own lease
/// lapsed on a loaded machine) — for at most 30 s per task, as a client of a fleet does.
/// Returns the wall time of the whole batch.
fn batch(
    exe: &Path,
    home: &Path,
    env: &[(String, String)],
    tasks: &[String],
) -> Result<f64, BenchError> {
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    let results: Vec<Result<(), BenchError>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..CONCURRENCY)
            .map(|_| {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(task) = tasks.get(i) else {
                        return Ok(());
                    };
                    let expect = format!("{task}\n");
                    let first = Instant::now();
                    loop {
                        match run_once(exe, home, env, task, "cat f")? {
                            Ok((_, out)) if out == expect => break,
                            Ok((_, out)) => {
                                return Err(BenchError::failed(
                                    BENCH,
                                    format!("task {task} answered {out:?} after the takeover"),
                                ))
                            }
                            Err(e)
                                if (e.starts_with("task_elsewhere")
                                    || e.starts_with("task_moved"))
                                    && first.elapsed() < Duration::from_secs(30) =>
                            {
                                std::thread::sleep(Duration::from_millis(50));
                            }
                            Err(e) => {
                                return Err(BenchError::failed(
                                    BENCH,
                                    format!("task {task}: `taskbox run cat f` failed: {e}"),
                                ))
                            }
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(BenchError::failed(BENCH, "a client thread panicked")))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    Ok(ms(started.elapsed()))
}

fn takeover(
    exe: &Path,
    dir: &Path,
    url: &str,
    tasks: usize,
    rounds: usize,
) -> Result<Measurement, BenchError> {
    let db = Scratch::create(url, "takeover")?;
    let rt = runtime()?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .map_err(BenchError::io(BENCH, "bind a loopback port for the fake"))?;
    let fake = rt
        .block_on(FakeServer::start(
            listener,
            FakeOptions::new(dir.join("fake")),
        ))
        .map_err(|e| BenchError::failed(BENCH, format!("start the fake Vercel server: {e}")))?;
    let server_env = env(&[
        ("VERCEL_TOKEN", "bench-token"),
        ("VERCEL_PROJECT_ID", "prj_bench"),
        ("VERCEL_TEAM_ID", "team_bench"),
        ("TASKBOX_SERVER", "always"),
        ("TASKBOX_STORE", &db.url),
    ]);
    let b_home = dir.join("b");
    fleet_home(&b_home, &fake.base_url())?;
    let b = rt.block_on(BenchServer::start(exe, &b_home, &server_env))?;
    let mut taken = Vec::new();
    let mut warm = Vec::new();
    let measured = (|| {
        for round in 0..rounds {
            let a_home: PathBuf = dir.join(format!("a{round}"));
            fleet_home(&a_home, &fake.base_url())?;
            let a = rt.block_on(BenchServer::start(exe, &a_home, &server_env))?;
            let names: Vec<String> = (0..tasks).map(|i| format!("r{round}-t{i}")).collect();
            for t in &names {
                run_ok(
                    exe,
                    &a_home,
                    &server_env,
                    t,
                    &format!("echo {t} > f; cat f"),
                    &format!("{t}\n"),
                )?;
            }
            a.kill();
            // Past the dead server's last renewal plus its lease: from here, any server may
            // take its tasks.
            std::thread::sleep(Duration::from_millis(LEASE_SECONDS * 1000 + 300));
            let took = batch(exe, &b_home, &server_env, &names)?;
            let again = batch(exe, &b_home, &server_env, &names)?;
            taken.push(tasks as f64 / (took / 1000.0));
            warm.push(tasks as f64 / (again / 1000.0));
        }
        Ok::<_, BenchError>(())
    })();
    rt.block_on(b.stop());
    let _ = rt.block_on(fake.shutdown());
    drop(db);
    measured?;
    Ok(Measurement::new(
        "fleet.takeover",
        format!(
            "tasks per second one server takes over after another is SIGKILLed: a `taskbox run` per task ({CONCURRENCY} at a time), each recovering the task from the journal and probing its sandbox (fake Vercel server), from the moment the dead server's leases expired"
        ),
        Quantity::new(median(&taken), "tasks/s"),
        "the same commands on the same tasks once that server drives them (warm)",
        Quantity::new(median(&warm), "tasks/s"),
        None,
        Target::Report,
        rounds,
        vec![format!(
            "{tasks} tasks per round, median of {rounds} round(s); before any takeover a dead server's tasks wait for its lease ({LEASE_SECONDS} s here, terminal.lease_seconds, 15 s by default)"
        )],
    ))
}
