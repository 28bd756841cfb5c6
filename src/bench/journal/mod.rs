//! Journal throughput: lifecycle transitions persisted per second by the real [`Store`] against a
//! raw SQLite insert loop with the same durability (WAL, `synchronous = FULL`).
//!
//! The transitions are real: each task is driven through a lifecycle (run, run, suspend, run
//! from the snapshot, suspend) by the pure [`step`] with every provider call succeeding, and the
//! records it produces — event, task before and after, commands — are what gets committed. They
//! are generated before the clock starts; only the commits are timed. Tasks are interleaved, as
//! the engine interleaves them.
//!
//! The raw baseline inserts one row per transition holding the same JSON (the event and the task
//! after it) into a one-table database beside the store's, one transaction per row
//! (`journal.commit`) or `BATCH` rows per transaction (`journal.batch`, against
//! [`Store::commit_batch`]). This module's SQL exists only to be that baseline. Both sides start
//! from the same in-memory transitions, so the baseline serializes its two JSON documents inside
//! its clock, into buffers it reuses, as the store does: a journal of transitions cannot skip
//! writing them down.
//!
//! `journal.postgres` (with `bench --postgres URL`) does the same against a PostgreSQL store:
//! [`Store::commit`] (one `taskbox_commit` statement per transition) against a raw
//! tokio-postgres INSERT of the same JSON into a one-table baseline on the same server, one
//! transaction per row, interleaved.

use std::path::Path;
use std::time::Instant;

use rusqlite::{params, Connection, TransactionBehavior};

use super::stats::{median, percentile};
use super::{BenchError, Ctx, Measurement, Quantity, Target};
use crate::config::Config;
use crate::core::{step, Command, Event, Millis, Task, TaskSettings, TaskState};
use crate::ids::TaskId;
use crate::provider::sandbox_name;
use crate::store::{Store, TransitionRecord};

mod postgres;

use postgres::measure_postgres;

const BENCH: &str = "journal";

/// Transitions per group commit in `journal.batch`.
const BATCH: usize = 50;

/// Throughput taskbox must keep, as a fraction of the raw loop's: one transition per
/// transaction (on SQLite and on PostgreSQL).
const TARGET_RATIO: f64 = 0.5;

/// The same for group commits, where the store's own work per transition is not hidden behind
/// a disk sync per transition.
const BATCH_TARGET_RATIO: f64 = 0.8;

const T0: Millis = 1_700_000_000_000;

/// One transition, ready to commit.
pub(super) struct Rec {
    at: Millis,
    event: Event,
    state_before: TaskState,
    task_after: Task,
    commands: Vec<Command>,
}

impl Rec {
    fn record(&self) -> TransitionRecord<'_> {
        TransitionRecord {
            at: self.at,
            event: &self.event,
            state_before: self.state_before,
            task_after: &self.task_after,
            commands: &self.commands,
        }
    }
}

/// The raw loop's serialization buffers, reused from one row to the next (as the store's are).
#[derive(Default)]
struct RawBufs {
    event: Vec<u8>,
    task_after: Vec<u8>,
}

impl RawBufs {
    /// The event and the task after it, as JSON text.
    fn encode(&mut self, r: &Rec) -> Result<(&str, &str), BenchError> {
        let enc =
            |e: serde_json::Error| BenchError::failed(BENCH, format!("encoding a transition: {e}"));
        self.event.clear();
        serde_json::to_writer(&mut self.event, &r.event).map_err(enc)?;
        self.task_after.clear();
        serde_json::to_writer(&mut self.task_after, &r.task_after).map_err(enc)?;
        fn text(b: &[u8]) -> &str {
            std::str::from_utf8(b).expect("serde_json writes UTF-8")
        }
        Ok((text(&self.event), text(&self.task_after)))
    }
}

/// The outcome a provider that always succeeds would report for `cmd`.
fn outcome(task: &str, cmd: &Command, now: Millis) -> Option<Event> {
    Some(match cmd {
        Command::CreateSandbox {
            generation,
            timeout_ms,
            ..
        } => Event::SandboxReady {
            generation: *generation,
            sandbox_id: format!("sb-{task}-{generation}").into(),
            name: sandbox_name("bench", task, *generation),
            deadline: now + timeout_ms,
        },
        Command::RunCommand { request_id, .. } => Event::CommandExited {
            request_id: *request_id,
            exit_code: 0,
            timed_out: false,
            memory_killed: false,
        },
        Command::TakeSnapshot { seq, .. } | Command::TakeCheckpoint { seq, .. } => {
            Event::SnapshotTaken {
                seq: *seq,
                snapshot_id: format!("snap-{task}-{seq}").into(),
                size_bytes: 48 << 20,
                expires_at: Some(now + 30 * 86_400_000),
                omitted: Vec::new(),
                usage: None,
                resources: None,
            }
        }
        Command::StopSandbox { sandbox_id } => Event::SandboxStopped {
            sandbox_id: sandbox_id.clone(),
            usage: None,
        },
        Command::ReadUsage { sandbox_id } => Event::UsageRead {
            sandbox_id: sandbox_id.clone(),
            usage: None,
        },
        Command::SampleActivity { sandbox_id } => Event::ActivitySampled {
            sandbox_id: sandbox_id.clone(),
            resources: None,
        },
        Command::ExtendTimeout {
            sandbox_id,
            duration_ms,
        } => Event::TimeoutExtended {
            sandbox_id: sandbox_id.clone(),
            deadline: now + duration_ms,
        },
        Command::DeleteSnapshot { snapshot_id } => Event::SnapshotDeleted {
            snapshot_id: snapshot_id.clone(),
        },
        Command::ProbeSandbox { sandbox_id } => Event::SandboxProbed {
            sandbox_id: sandbox_id.clone(),
            alive: Some(now + 300_000),
            platform_snapshot: None,
            usage: None,
        },
        Command::ScheduleTimer { .. } | Command::Reply { .. } => return None,
    })
}

/// The transitions of one task's lifecycle, as the engine would commit them.
pub(super) fn lifecycle(id: &str, settings: &TaskSettings) -> Result<Vec<Rec>, BenchError> {
    let mut now = T0;
    let task_id = TaskId::new(id).map_err(|e| BenchError::failed(BENCH, e.to_string()))?;
    let mut task = Task::new(task_id, settings.clone(), now);
    // A new task's first record, as the engine writes it when it loads an unknown task.
    let mut recs = vec![Rec {
        at: now,
        event: Event::SettingsChanged {
            settings: settings.clone(),
        },
        state_before: task.state,
        task_after: task.clone(),
        commands: Vec::new(),
    }];
    let requests: [Option<&str>; 5] = [
        Some("npm test"),
        Some("git status --short"),
        None,
        Some("cat notes.txt"),
        None,
    ];
    for (i, req) in requests.into_iter().enumerate() {
        let request_id = i as u64 + 1;
        let mut pending = std::collections::VecDeque::from([match req {
            Some(command) => Event::RunRequested {
                request_id,
                command: command.to_string(),
                timeout_ms: 180_000,
            },
            None => Event::SuspendRequested { request_id },
        }]);
        while let Some(event) = pending.pop_front() {
            now += 10;
            let tr = step(&task, event.clone(), now)
                .map_err(|e| BenchError::failed(BENCH, format!("generating transitions: {e}")))?;
            pending.extend(tr.commands.iter().filter_map(|c| outcome(id, c, now)));
            recs.push(Rec {
                at: now,
                event,
                state_before: task.state,
                task_after: tr.next.clone(),
                commands: tr.commands,
            });
            task = tr.next;
        }
    }
    Ok(recs)
}

/// `tasks` lifecycles, interleaved one transition per task in turn.
fn interleaved(
    prefix: &str,
    tasks: usize,
    settings: &TaskSettings,
) -> Result<Vec<Rec>, BenchError> {
    let mut lives: Vec<std::vec::IntoIter<Rec>> = (0..tasks)
        .map(|t| lifecycle(&format!("{prefix}-{t}"), settings).map(Vec::into_iter))
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    loop {
        let before = out.len();
        for life in &mut lives {
            if let Some(r) = life.next() {
                out.push(r);
            }
        }
        if out.len() == before {
            return Ok(out);
        }
    }
}

/// The raw baseline's database: one table, WAL, `synchronous = FULL`, like the store's file.
fn raw_open(path: &Path) -> Result<Connection, BenchError> {
    let sql = |e: rusqlite::Error| BenchError::failed(BENCH, format!("raw SQLite baseline: {e}"));
    let conn = Connection::open(path).map_err(sql)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(sql)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(BenchError::failed(
            BENCH,
            format!("{} refused WAL mode (got {mode})", path.display()),
        ));
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(sql)?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS journal (
             seq INTEGER PRIMARY KEY,
             task_id TEXT NOT NULL,
             at INTEGER NOT NULL,
             event TEXT NOT NULL,
             task_after TEXT NOT NULL
         )",
    )
    .map_err(sql)?;
    Ok(conn)
}

/// A raw durable commit of one small row, for other benchmarks to say what the disk's sync costs.
pub(super) struct DurableProbe {
    conn: Connection,
}

impl DurableProbe {
    /// A one-table database at `path`, WAL and `synchronous = FULL`.
    pub(super) fn open(path: &Path) -> Result<DurableProbe, BenchError> {
        Ok(DurableProbe {
            conn: raw_open(path)?,
        })
    }

    /// Commits one row in its own transaction; returns the time it took, ms.
    pub(super) fn commit_one(&mut self) -> Result<f64, BenchError> {
        let sql =
            |e: rusqlite::Error| BenchError::failed(BENCH, format!("raw SQLite baseline: {e}"));
        let t = Instant::now();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql)?;
        tx.prepare_cached(INSERT_RAW)
            .and_then(|mut stmt| stmt.execute(params!["probe", 0, "{}", "{}"]))
            .map_err(sql)?;
        tx.commit().map_err(sql)?;
        Ok(t.elapsed().as_secs_f64() * 1000.0)
    }
}

const INSERT_RAW: &str =
    "INSERT INTO journal (task_id, at, event, task_after) VALUES (?1, ?2, ?3, ?4)";

/// Inserts a row per transition of `recs`, `per_tx` rows per transaction.
fn raw_insert(
    conn: &mut Connection,
    bufs: &mut RawBufs,
    recs: &[Rec],
    per_tx: usize,
) -> Result<(), BenchError> {
    let sql = |e: rusqlite::Error| BenchError::failed(BENCH, format!("raw SQLite baseline: {e}"));
    for chunk in recs.chunks(per_tx) {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql)?;
        {
            let mut stmt = tx.prepare_cached(INSERT_RAW).map_err(sql)?;
            for r in chunk {
                let (event, task_after) = bufs.encode(r)?;
                stmt.execute(params![r.task_after.id.as_str(), r.at, event, task_after])
                    .map_err(sql)?;
            }
        }
        tx.commit().map_err(sql)?;
    }
    Ok(())
}

fn store_commit(store: &mut Store, recs: &[Rec], per_tx: usize) -> Result<(), BenchError> {
    let err = |source| BenchError::Store {
        bench: BENCH,
        action: "committing a transition".into(),
        source: Box::new(source),
    };
    if per_tx == 1 {
        for r in recs {
            store.commit(&r.record()).map_err(err)?;
        }
    } else {
        for chunk in recs.chunks(per_tx) {
            let batch: Vec<TransitionRecord<'_>> = chunk.iter().map(Rec::record).collect();
            store.commit_batch(&batch).map_err(err)?;
        }
    }
    Ok(())
}

/// Per-round rates (transitions per second) of both sides.
struct Rates {
    subject: Vec<f64>,
    baseline: Vec<f64>,
    /// Subject's time per transaction, ms (for the notes).
    per_tx_ms: Vec<f64>,
    /// Unmeasured rounds before the measured ones.
    warmup: usize,
    /// Whether the files settled before the measured rounds ([`WalWatch`]); `None`: there
    /// were none to watch.
    settled: Option<bool>,
}

fn measure(
    dir: &Path,
    label: &str,
    rounds: usize,
    per_round: usize,
    per_tx: usize,
    settings: &TaskSettings,
) -> Result<Rates, BenchError> {
    let mut store = Store::open(&dir.join(format!("{label}-taskbox.db"))).map_err(|source| {
        BenchError::Store {
            bench: BENCH,
            action: "opening the store".into(),
            source: Box::new(source),
        }
    })?;
    let mut raw = raw_open(&dir.join(format!("{label}-raw.db")))?;
    let mut bufs = RawBufs::default();
    let mut wals = WalWatch::new([
        dir.join(format!("{label}-taskbox.db-wal")),
        dir.join(format!("{label}-raw.db-wal")),
    ]);
    interleave_rounds(
        label,
        rounds,
        per_round,
        per_tx,
        settings,
        || wals.settled().map(Some),
        |recs| store_commit(&mut store, recs, per_tx),
        |recs| raw_insert(&mut raw, &mut bufs, recs, per_tx),
    )
}

/// Whether both sides' write-ahead logs have reached the size they keep.
///
/// SQLite does not shrink a WAL after a checkpoint: the next commits overwrite it from its
/// start. So a long-running engine's commits rewrite a file of a settled size, while a fresh
/// file's first cycle (up to the first automatic checkpoint, 1,000 pages) extends the file at
/// every commit, which makes each disk sync also allocate blocks and write the file's size:
/// measured here, a round of the raw loop took 0.82–1.06 ms while its WAL grew and 0.58–0.77 ms
/// after (medians of a run's rounds, 2 CPUs, load under 1). The two sides fill their logs at different speeds (they write different pages), so
/// rounds measured from a fresh file compare one side's growing log with the other's settled
/// one for part of the run, and the ratio moved with that (0.69–0.86× for one build). The
/// measured rounds start once neither log grew during a whole round.
struct WalWatch {
    paths: [std::path::PathBuf; 2],
    sizes: [Option<u64>; 2],
}

impl WalWatch {
    fn new(paths: [std::path::PathBuf; 2]) -> WalWatch {
        WalWatch {
            paths,
            sizes: [None, None],
        }
    }

    /// Whether neither log grew since the last call (and both exist).
    fn settled(&mut self) -> Result<bool, BenchError> {
        let mut settled = true;
        for (path, last) in self.paths.iter().zip(&mut self.sizes) {
            let size = std::fs::metadata(path)
                .map_err(BenchError::io(BENCH, format!("stat {}", path.display())))?
                .len();
            settled &= *last == Some(size);
            *last = Some(size);
        }
        Ok(settled)
    }
}

/// Unmeasured rounds at most, waiting for [`WalWatch::settled`]: a log fills its 1,000 pages in
/// about 30 rounds here.
const MAX_WARMUP_ROUNDS: usize = 400;

/// Runs `rounds` measured rounds of `per_round` fresh transitions on each side, alternating
/// which side goes first, after unmeasured ones: at least one (file creation, page cache,
/// statement cache), then as many as it takes for `settled` to say the files are as a
/// long-running store's are ([`WalWatch`]; `None`: nothing to wait for), up to
/// [`MAX_WARMUP_ROUNDS`].
#[allow(clippy::too_many_arguments)]
fn interleave_rounds(
    label: &str,
    rounds: usize,
    per_round: usize,
    per_tx: usize,
    settings: &TaskSettings,
    mut settled: impl FnMut() -> Result<Option<bool>, BenchError>,
    mut subject_run: impl FnMut(&[Rec]) -> Result<(), BenchError>,
    mut baseline_run: impl FnMut(&[Rec]) -> Result<(), BenchError>,
) -> Result<Rates, BenchError> {
    let per_task = lifecycle("probe", settings)?.len();
    let mut rates = Rates {
        subject: Vec::new(),
        baseline: Vec::new(),
        per_tx_ms: Vec::new(),
        warmup: 0,
        settled: Some(false),
    };
    let mut round = 0;
    let mut warming = true;
    while rates.subject.len() < rounds {
        let mut recs = interleaved(
            &format!("{label}{round}"),
            per_round.div_ceil(per_task),
            settings,
        )?;
        recs.truncate(per_round);
        let mut subject = || -> Result<f64, BenchError> {
            let t = Instant::now();
            subject_run(&recs)?;
            Ok(t.elapsed().as_secs_f64())
        };
        let mut baseline = || -> Result<f64, BenchError> {
            let t = Instant::now();
            baseline_run(&recs)?;
            Ok(t.elapsed().as_secs_f64())
        };
        let (s, b) = if round % 2 == 0 {
            let s = subject()?;
            (s, baseline()?)
        } else {
            let b = baseline()?;
            (subject()?, b)
        };
        round += 1;
        if warming {
            // The first round is never measured: it set the files up. Nor is the one that
            // showed them settled.
            rates.settled = if round > 1 { settled()? } else { Some(false) };
            warming = rates.settled == Some(false) && round < MAX_WARMUP_ROUNDS;
            rates.warmup = round;
            continue;
        }
        let n = recs.len() as f64;
        rates.subject.push(n / s);
        rates.baseline.push(n / b);
        rates
            .per_tx_ms
            .push(s * 1000.0 / recs.len().div_ceil(per_tx) as f64);
    }
    Ok(rates)
}

fn row(
    name: &str,
    subject_is: &str,
    baseline_is: &str,
    r: &Rates,
    rounds: usize,
    target: f64,
) -> Measurement {
    Measurement::new(
        name,
        subject_is,
        Quantity::new(median(&r.subject), "transitions/s"),
        baseline_is,
        Quantity::new(median(&r.baseline), "transitions/s"),
        None,
        Target::RatioAtLeast { ratio: target },
        rounds,
        vec![
            format!(
                "subject {} ms per transaction (median; p90 {} ms); rates are medians of {rounds} interleaved rounds",
                super::fmt_num(median(&r.per_tx_ms)),
                super::fmt_num(percentile(&r.per_tx_ms, 90.0)),
            ),
            warmup_note(r),
        ],
    )
}

/// How the measured rounds were preceded.
fn warmup_note(r: &Rates) -> String {
    match r.settled {
        None => format!("measured after {} unmeasured rounds", r.warmup),
        Some(true) => format!(
            "measured after {} unmeasured rounds, once neither side's SQLite WAL grew during a round (as a long-running store's does not)",
            r.warmup
        ),
        Some(false) => format!(
            "measured after {} unmeasured rounds, the most allowed, while a SQLite WAL was still growing: part of a side's rounds paid for extending its file",
            r.warmup
        ),
    }
}

/// What the journal rows of the `label` databases hold per transition: the store's JSON (the
/// event, the commands, the task after it: whole or what changed) against the raw rows' (the
/// event and the whole task).
fn json_bytes(dir: &Path, label: &str) -> Result<String, BenchError> {
    let average = |file: String, columns: &str| -> Result<f64, BenchError> {
        let sql =
            |e: rusqlite::Error| BenchError::failed(BENCH, format!("reading back {file}: {e}"));
        let conn = Connection::open(dir.join(&file)).map_err(sql)?;
        conn.query_row(
            &format!("SELECT COALESCE(AVG({columns}), 0) FROM journal"),
            [],
            |r| r.get(0),
        )
        .map_err(sql)
    };
    let store = average(
        format!("{label}-taskbox.db"),
        "length(event) + length(commands) + length(task_after)",
    )?;
    let raw = average(
        format!("{label}-raw.db"),
        "length(event) + length(task_after)",
    )?;
    Ok(format!(
        "journal rows: {} bytes of JSON per transition (event, commands, the task or what of it changed) against the raw rows' {} (event, task)",
        super::fmt_num(store),
        super::fmt_num(raw),
    ))
}

pub(super) fn run(ctx: &mut Ctx<'_>) -> Result<Vec<Measurement>, BenchError> {
    // Short rounds, many of them: the two sides alternate every few disk syncs, so a burst of
    // a neighbour's I/O hits both alike.
    let (rounds, per_round, batch_per_round) =
        ctx.opts
            .mode
            .pick((5, 10, 2 * BATCH), (41, 10, 2 * BATCH), (81, 10, 2 * BATCH));
    let dir = ctx.subdir("journal")?;
    let settings = Config::default().task_settings();
    let per_task = lifecycle("probe", &settings)?.len();
    let mut rows = Vec::new();
    if ctx.wants("journal.commit") {
        ctx.say(&format!(
            "journal.commit: {rounds} rounds of {per_round} transitions each side ({per_task} per task lifecycle)"
        ));
        let r = measure(&dir, "commit", rounds, per_round, 1, &settings)?;
        rows.push(row(
            "journal.commit",
            "Store::commit, one durable transaction per transition",
            "raw rusqlite INSERT of the same JSON, WAL + synchronous=FULL, one transaction per row",
            &r,
            rounds,
            TARGET_RATIO,
        ));
    }
    if ctx.wants("journal.batch") {
        ctx.say(&format!(
            "journal.batch: {rounds} rounds of {batch_per_round} transitions in groups of {BATCH}"
        ));
        let r = measure(&dir, "batch", rounds, batch_per_round, BATCH, &settings)?;
        rows.push(row(
            "journal.batch",
            &format!("Store::commit_batch, {BATCH} transitions per transaction"),
            &format!("raw rusqlite INSERTs, {BATCH} rows per transaction, same durability"),
            &r,
            rounds,
            BATCH_TARGET_RATIO,
        ));
        if let Some(last) = rows.last_mut() {
            last.notes.push(json_bytes(&dir, "batch")?);
        }
    }
    if ctx.wants("journal.postgres") {
        match ctx.opts.postgres.clone() {
            None => ctx.say("journal.postgres: skipped (no --postgres URL)"),
            Some(url) => {
                ctx.say(&format!(
                    "journal.postgres: {rounds} rounds of {per_round} transitions each side"
                ));
                let r = measure_postgres(&url, rounds, per_round, &settings)?;
                rows.push(row(
                    "journal.postgres",
                    "Store::commit on a PostgreSQL store, fenced by the task's lease as a fleet server's commits are (the lease taken once per task, counted), one durable transaction per transition",
                    "raw tokio-postgres INSERT of the same JSON, same server, one transaction per row",
                    &r,
                    rounds,
                    TARGET_RATIO,
                ));
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wal_settles_once_a_checkpoint_has_wrapped_it() {
        let dir = super::super::tempdir_in(&std::env::temp_dir()).unwrap();
        let paths = ["a.db", "b.db"].map(|n| dir.path.join(n));
        let mut probes = paths.clone().map(|p| DurableProbe::open(&p).unwrap());
        // A short cycle, so the test does not wait for 1,000 pages.
        for p in &probes {
            p.conn.pragma_update(None, "wal_autocheckpoint", 8).unwrap();
        }
        let mut watch = WalWatch::new(paths.map(|p| p.with_extension("db-wal")));
        let mut rounds = 0;
        let mut settled_at = None;
        while settled_at.is_none() && rounds < 200 {
            for p in &mut probes {
                for _ in 0..3 {
                    p.commit_one().unwrap();
                }
            }
            rounds += 1;
            if watch.settled().unwrap() {
                settled_at = Some(rounds);
            }
        }
        // Growing at first (a round appends pages), settled once the log is rewritten.
        let at = settled_at.expect("the logs settled");
        assert!(at > 2, "settled after {at} rounds");
        // Settled stays settled: the next rounds rewrite the log in place.
        for _ in 0..5 {
            for p in &mut probes {
                for _ in 0..3 {
                    p.commit_one().unwrap();
                }
            }
            assert!(watch.settled().unwrap());
        }
        // A missing log is an error naming it.
        let mut gone = WalWatch::new([dir.path.join("none-wal"), dir.path.join("a.db-wal")]);
        let err = gone.settled().unwrap_err().to_string();
        assert!(err.contains("none-wal"), "{err}");
    }

    #[test]
    fn a_lifecycle_provisions_runs_snapshots_and_restores() {
        let recs = lifecycle("t", &Config::default().task_settings()).unwrap();
        let names: Vec<&str> = recs.iter().map(|r| r.event.name()).collect();
        for expected in [
            "settings_changed",
            "run_requested",
            "sandbox_ready",
            "command_exited",
            "suspend_requested",
            "snapshot_taken",
        ] {
            assert!(names.contains(&expected), "{expected} in {names:?}");
        }
        // The second run after a suspend restores from the snapshot.
        assert!(recs.iter().any(|r| r.commands.iter().any(|c| matches!(
            c,
            Command::CreateSandbox {
                source_snapshot: Some(_),
                ..
            }
        ))));
        // Each record starts where the previous one of the task ended.
        for w in recs.windows(2) {
            assert_eq!(w[1].state_before, w[0].task_after.state);
        }
    }
}
