//! `taskbox replay` (verify, re-drive and show a task's journal) and `taskbox export` (write it
//! as a portable JSONL file).
//!
//! Exit codes: 0 when everything replays as recorded, 1 on a divergence, 125 when taskbox itself
//! fails (no such task, an unreadable file...). Journals read from the store are redacted before
//! anything is printed, like exports, so secrets an agent typed never reach the terminal or JSON.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use serde::Serialize;

use taskbox::clock::{Clock, SystemClock};
use taskbox::engine::Paths;
use taskbox::replay::export::{self, ExportError};
use taskbox::replay::{self as rp, timeline, Divergence, Verdict};
use taskbox::store::{JournalEntry, Store};
use taskbox::TaskId;

use super::output::{print_json, write_ignoring_broken_pipe, Failure};

/// Exit code of a replay that found a divergence.
const EXIT_DIVERGED: u8 = 1;

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The task to replay (with --journal: default every task in the file).
    task: Option<String>,
    /// Replay every task.
    #[arg(long, conflicts_with = "task")]
    all: bool,
    /// Replay an exported journal (from `taskbox export`) instead of this installation's store.
    #[arg(long, value_name = "FILE")]
    journal: Option<PathBuf>,
    /// Also run the real engine again against the recorded provider answers, on virtual time,
    /// and check it makes the same provider calls and replies.
    #[arg(long)]
    redrive: bool,
    /// Print the task's timeline (a table; see --format) instead of the verdict, which goes to
    /// stderr.
    #[arg(long)]
    timeline: bool,
    /// Timeline format (implies --timeline): text, svg or html.
    #[arg(long, value_enum, value_name = "FORMAT")]
    format: Option<TimelineFormat>,
    /// Write the timeline to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Print JSON on stdout (the verdict, re-drive reports and, with --timeline, the timelines).
    #[arg(long, conflicts_with = "format")]
    json: bool,
}

impl ReplayArgs {
    /// Whether JSON output was asked for.
    pub fn json(&self) -> bool {
        self.json
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TimelineFormat {
    /// A table.
    Text,
    /// An SVG picture: one lane per task.
    Svg,
    /// An HTML page with the picture and the tables.
    Html,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The task to export.
    task: Option<String>,
    /// Export every task.
    #[arg(long, conflicts_with = "task")]
    all: bool,
    /// Write to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// `taskbox replay`.
pub fn replay(args: ReplayArgs, paths: &Paths) -> Result<ExitCode, Failure> {
    let timeline_format = match (args.format, args.timeline) {
        (Some(f), _) => Some(f),
        (None, true) => Some(TimelineFormat::Text),
        (None, false) => None,
    };
    if args.out.is_some() && timeline_format.is_none() {
        return Err(
            Failure::new("--out writes a timeline, and none was asked for")
                .hint("add --timeline (a table) or --format svg|html"),
        );
    }
    let entries = match &args.journal {
        Some(file) => load_file(file, args.task.as_deref())?,
        None => load_store(paths, args.task.as_deref(), args.all)?,
    };
    let verdict = rp::verify(&entries);
    let redrives = if args.redrive {
        redriving::redrive_clean(&entries, &verdict)?
    } else {
        Vec::new()
    };
    let clean = verdict.is_clean() && redrives.iter().all(|r| !redriving::diverged(r));
    let timelines = timeline_format.map(|_| timeline::build(&entries));

    if args.json {
        #[derive(Serialize)]
        struct Out<'a> {
            clean: bool,
            verdict: &'a Verdict,
            #[serde(skip_serializing_if = "Option::is_none")]
            redrive: Option<&'a [redriving::Report]>,
            #[serde(skip_serializing_if = "Option::is_none")]
            timelines: Option<&'a [timeline::Timeline]>,
        }
        let out = Out {
            clean,
            verdict: &verdict,
            redrive: args.redrive.then_some(redrives.as_slice()),
            timelines: timelines.as_deref(),
        };
        match &args.out {
            Some(path) => {
                let text = serde_json::to_string_pretty(&out)
                    .map_err(|e| Failure::new(format!("cannot encode JSON: {e}")))?;
                write_file(path, text.as_bytes())?;
            }
            None => print_json(&out)?,
        }
    } else {
        let report = verdict_text(&verdict, &redrives, args.redrive);
        match (timeline_format, &timelines) {
            (Some(format), Some(tls)) => {
                let picture = match format {
                    TimelineFormat::Text => timeline::render_text(tls),
                    TimelineFormat::Svg => timeline::render_svg(tls),
                    TimelineFormat::Html => timeline::render_html(tls),
                };
                match &args.out {
                    Some(path) => {
                        write_file(path, picture.as_bytes())?;
                        eprintln!("wrote the timeline to {}", path.display());
                    }
                    None => write_ignoring_broken_pipe(
                        &mut std::io::stdout().lock(),
                        picture.as_bytes(),
                    )?,
                }
                eprint!("{report}");
            }
            _ => write_ignoring_broken_pipe(&mut std::io::stdout().lock(), report.as_bytes())?,
        }
    }
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_DIVERGED)
    })
}

/// The re-drive's side of `taskbox replay`. It runs the engine on virtual time (tokio's paused
/// clock, the `virtual-time` feature); a build without that feature refuses `--redrive` here.
#[cfg(feature = "virtual-time")]
mod redriving {
    use taskbox::replay::redrive;
    pub use taskbox::replay::redrive::RedriveReport as Report;
    use taskbox::replay::Verdict;
    use taskbox::store::JournalEntry;

    use super::{divergence_text, Failure};

    /// Re-drives the tasks whose journal verified (a journal that does not even match the core
    /// has nothing to teach the re-drive).
    pub fn redrive_clean(
        entries: &[JournalEntry],
        verdict: &Verdict,
    ) -> Result<Vec<Report>, Failure> {
        let clean: Vec<JournalEntry> = entries
            .iter()
            .filter(|e| {
                verdict
                    .tasks
                    .iter()
                    .any(|t| t.task_id == e.task_id && t.divergence.is_none())
            })
            .cloned()
            .collect();
        redrive::redrive(&clean).map_err(|e| {
            let hint = match &e {
                redrive::RedriveError::Unsupported { .. } => {
                    "`taskbox replay` without --redrive still checks the journal against the core"
                }
                _ => "this is a bug in taskbox; please report it with the exported journal",
            };
            Failure::from_anyhow(anyhow::Error::new(e)).hint(hint)
        })
    }

    pub fn task_id(r: &Report) -> &str {
        &r.task_id
    }

    pub fn diverged(r: &Report) -> bool {
        r.divergence.is_some()
    }

    /// The re-drive's lines for a task whose journal has `entries` entries.
    pub fn text(s: &mut String, r: &Report, entries: usize) {
        match &r.divergence {
            None => s.push_str(&format!(
                "{}: re-drive matches — {} session{}, {} provider calls and {} replies as recorded\n",
                r.task_id,
                r.sessions,
                if r.sessions == 1 { "" } else { "s" },
                r.calls_made,
                r.replies
            )),
            Some(d) => {
                s.push_str(&format!("{}: re-drive differs from the recording\n", r.task_id));
                divergence_text(s, d, entries, None);
            }
        }
    }
}

/// A build without virtual time cannot re-drive: `--redrive` is refused, so no report exists.
#[cfg(not(feature = "virtual-time"))]
mod redriving {
    use serde::Serialize;

    use taskbox::replay::Verdict;
    use taskbox::store::JournalEntry;

    use super::Failure;

    /// No re-drive report can be made in this build.
    #[derive(Debug, Serialize)]
    pub enum Report {}

    pub fn redrive_clean(_: &[JournalEntry], _: &Verdict) -> Result<Vec<Report>, Failure> {
        Err(Failure::new(
            "this taskbox was built without re-drive (the cargo feature `virtual-time` is off)",
        )
        .hint("`taskbox replay` without --redrive still checks the journal against the core"))
    }

    pub fn task_id(r: &Report) -> &str {
        match *r {}
    }

    pub fn diverged(r: &Report) -> bool {
        match *r {}
    }

    pub fn text(_: &mut String, r: &Report, _: usize) {
        match *r {}
    }
}

fn divergence_text(s: &mut String, d: &Divergence, entries: usize, replayed: Option<usize>) {
    s.push_str(&format!(
        "{}: DIVERGED at entry #{} of {} ({}, event {})\n  {}\n",
        d.task_id,
        d.task_seq,
        entries,
        taskbox::clock::format_ms(d.at),
        d.event,
        d.detail
    ));
    for f in &d.diffs {
        s.push_str(&format!("    {}\n", f.line()));
    }
    if d.differing_fields > d.diffs.len() {
        s.push_str(&format!(
            "    … and {} more differing fields\n",
            d.differing_fields - d.diffs.len()
        ));
    }
    if let Some(n) = replayed {
        s.push_str(&format!("  the {n} entries before it replay as recorded\n"));
    }
}

fn verdict_text(verdict: &Verdict, redrives: &[redriving::Report], redrove: bool) -> String {
    let mut s = String::new();
    for t in &verdict.tasks {
        match &t.divergence {
            None => s.push_str(&format!(
                "{}: replays cleanly — {} entries, final state {}\n",
                t.task_id,
                t.entries,
                t.final_state.map_or("-".to_string(), |st| st.to_string())
            )),
            Some(d) => divergence_text(&mut s, d, t.entries, Some(t.replayed)),
        }
        if let Some(r) = redrives
            .iter()
            .find(|r| redriving::task_id(r) == t.task_id.as_str())
        {
            redriving::text(&mut s, r, t.entries);
        } else if redrove && t.divergence.is_some() {
            s.push_str(&format!(
                "{}: not re-driven (the journal already diverges from the core)\n",
                t.task_id
            ));
        }
    }
    if verdict.tasks.len() > 1 {
        let diverged = verdict
            .tasks
            .iter()
            .filter(|t| t.divergence.is_some())
            .count()
            + redrives.iter().filter(|r| redriving::diverged(r)).count();
        s.push_str(&format!(
            "{} tasks: {}\n",
            verdict.tasks.len(),
            if diverged == 0 {
                "all replay cleanly".to_string()
            } else {
                format!(
                    "{diverged} divergence{}",
                    if diverged == 1 { "" } else { "s" }
                )
            }
        ));
    }
    s
}

/// `taskbox export`.
pub fn export(args: ExportArgs, paths: &Paths) -> Result<ExitCode, Failure> {
    if args.task.is_none() && !args.all {
        return Err(Failure::new("which task? give a task id or --all")
            .hint("`taskbox tasks` lists the tasks"));
    }
    let store = open_store(paths)?;
    let mut entries = store_entries(&store, args.task.as_deref())?;
    // Commit order, so the file reads as what happened across tasks.
    entries.sort_by_key(|e| e.seq);
    let now = SystemClock.now_ms();
    let header = match &args.out {
        Some(path) => {
            let file = File::create(path)
                .map_err(|e| Failure::new(format!("cannot create {}: {e}", path.display())))?;
            let mut w = BufWriter::new(file);
            export::write_journal(&mut w, &entries, store.installation_id(), now)
                .map_err(export_failure)?
        }
        None => {
            let mut w = BufWriter::new(std::io::stdout().lock());
            match export::write_journal(&mut w, &entries, store.installation_id(), now) {
                Ok(h) => h,
                Err(ExportError::Write(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    return Ok(ExitCode::SUCCESS)
                }
                Err(e) => return Err(export_failure(e)),
            }
        }
    };
    let to = args
        .out
        .as_ref()
        .map_or_else(|| "stdout".to_string(), |p| p.display().to_string());
    eprintln!(
        "exported {} entries of {} task{} to {to}{}",
        header.entries,
        header.tasks.len(),
        if header.tasks.len() == 1 { "" } else { "s" },
        match header.redacted_values {
            0 => String::new(),
            n => format!(
                " ({n} secret value{} redacted)",
                if n == 1 { "" } else { "s" }
            ),
        }
    );
    Ok(ExitCode::SUCCESS)
}

fn export_failure(e: ExportError) -> Failure {
    Failure::from_anyhow(anyhow::Error::new(e))
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    std::fs::write(path, bytes)
        .map_err(|e| Failure::new(format!("cannot write {}: {e}", path.display())))
}

fn open_store(paths: &Paths) -> Result<Store, Failure> {
    super::existing_store(paths)
        .map_err(|e| Failure::from_anyhow(anyhow::Error::new(e)))?
        .ok_or_else(|| {
            Failure::new(format!(
                "no taskbox data in {} (no journal to read)",
                paths.data_dir.display()
            ))
            .hint(
                "`taskbox run --task NAME -- CMD` creates a task; TASKBOX_HOME selects another home",
            )
        })
}

fn store_entries(store: &Store, task: Option<&str>) -> Result<Vec<JournalEntry>, Failure> {
    let store_err = |e| Failure::from_anyhow(anyhow::Error::new(e));
    let ids = match task {
        Some(t) => {
            let id = TaskId::new(t).map_err(|e| {
                Failure::new(e.to_string()).hint(
                    "a task id is 1 to 64 letters, digits, `-` or `_`, starting with a letter or digit",
                )
            })?;
            vec![id]
        }
        None => store.task_ids().map_err(store_err)?,
    };
    let mut entries = Vec::new();
    for id in &ids {
        let journal = store.journal(id.as_str()).map_err(store_err)?;
        if journal.is_empty() && task.is_some() {
            let names = store.task_ids().map_err(store_err)?;
            return Err(Failure::from_engine(taskbox::engine::EngineError::NoTask {
                task: id.clone(),
                suggestion: taskbox::engine::closest(id.as_str(), names.iter().map(TaskId::as_str)),
            }));
        }
        entries.extend(journal);
    }
    if entries.is_empty() {
        return Err(Failure::new("no tasks yet: the journal is empty")
            .hint("`taskbox run --task NAME -- CMD` creates one"));
    }
    Ok(entries)
}

fn load_store(paths: &Paths, task: Option<&str>, all: bool) -> Result<Vec<JournalEntry>, Failure> {
    if task.is_none() && !all {
        return Err(
            Failure::new("which task? give a task id, --all, or --journal FILE")
                .hint("`taskbox tasks` lists the tasks"),
        );
    }
    let store = open_store(paths)?;
    let entries = store_entries(&store, task)?;
    // Redact exactly as an export would, so nothing printed carries a secret.
    let (entries, _) = rp::redact::redact_entries(&entries)
        .map_err(|e| Failure::new(format!("cannot prepare the journal for display: {e}")))?;
    Ok(entries)
}

fn load_file(path: &Path, task: Option<&str>) -> Result<Vec<JournalEntry>, Failure> {
    let file = File::open(path)
        .map_err(|e| Failure::new(format!("cannot open {}: {e}", path.display())))?;
    let journal = export::read_journal(BufReader::new(file)).map_err(|e| {
        let hint = match &e {
            ExportError::NewerVersion { .. } => Some("upgrade taskbox to read this journal"),
            ExportError::Truncated { .. } | ExportError::Count { .. } => {
                Some("export the journal again (`taskbox export TASK > FILE`) and copy it whole")
            }
            ExportError::MissingHeader { .. }
            | ExportError::WrongFormat { .. }
            | ExportError::Empty => Some("--journal reads files written by `taskbox export`"),
            _ => None,
        };
        let f = Failure::new(format!("{}: {e}", path.display()));
        match hint {
            Some(h) => f.hint(h),
            None => f,
        }
    })?;
    let entries = match task {
        None => journal.entries,
        Some(t) => {
            let mine: Vec<JournalEntry> = journal
                .entries
                .into_iter()
                .filter(|e| e.task_id == t)
                .collect();
            if mine.is_empty() {
                return Err(
                    Failure::new(format!("{} holds no task named `{t}`", path.display()))
                        .hint(format!("it holds: {}", journal.header.tasks.join(", "))),
                );
            }
            mine
        }
    };
    if entries.is_empty() {
        return Err(Failure::new(format!(
            "{} holds no journal entries",
            path.display()
        )));
    }
    Ok(entries)
}
