//! `taskbox bench`: runs `taskbox::bench` and prints its table (or JSON) on stdout, progress on
//! stderr. Missed targets are reported, not failures: the exit code says whether the benchmarks
//! ran.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use taskbox::bench::{self, fmt_num, ChildKind, Mode, Options, Report};

use super::output::{print_json, write_ignoring_broken_pipe, Failure};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Small samples and a small workspace: checks that every benchmark runs (CI).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// More repetitions and the ~185 MB, 23,000-file workspace.
    #[arg(long)]
    full: bool,
    /// Print the results as JSON on stdout.
    #[arg(long, conflicts_with = "markdown")]
    json: bool,
    /// Print the results as a Markdown table (as docs/performance.md shows them).
    #[arg(long)]
    markdown: bool,
    /// Run only this group (overhead, journal, scale, snapshot, vercel, fleet) or benchmark (such as
    /// overhead.cli); repeatable.
    #[arg(long, value_name = "NAME")]
    only: Vec<String>,
    /// Where to put the benchmarks' scratch data (default: the system temporary directory).
    #[arg(long, value_name = "DIR")]
    scratch: Option<PathBuf>,
    /// A PostgreSQL database for `journal.postgres` (taskbox's commits against raw INSERTs
    /// through the same client) and the `fleet` rows (scratch databases on its server: its
    /// user needs CREATEDB); those rows are skipped without it.
    #[arg(long, value_name = "URL")]
    postgres: Option<String>,
    /// Internal: run one side of a benchmark that needs its own process, print its JSON.
    #[arg(long, hide = true, value_name = "KIND")]
    child: Option<String>,
    /// Internal: tasks for `--child`.
    #[arg(long, hide = true, default_value_t = 0)]
    tasks: usize,
}

impl BenchArgs {
    /// Whether JSON output was asked for.
    pub fn json(&self) -> bool {
        self.json
    }
}

fn failure(e: bench::BenchError) -> Failure {
    let hint = e.hint();
    let f = Failure::from_anyhow(anyhow::Error::new(e));
    match hint {
        Some(h) => f.hint(h),
        None => f,
    }
}

/// Runs the benchmarks on a plain thread: they build their own runtimes.
pub fn run(args: BenchArgs) -> Result<ExitCode, Failure> {
    std::thread::spawn(move || run_blocking(args))
        .join()
        .unwrap_or_else(|_| Err(Failure::new("the benchmark thread panicked")))
}

fn run_blocking(args: BenchArgs) -> Result<ExitCode, Failure> {
    if let Some(kind) = &args.child {
        let kind = ChildKind::parse(kind)
            .ok_or_else(|| Failure::new(format!("unknown bench child `{kind}`")))?;
        let r = bench::run_child(kind, args.tasks, args.scratch).map_err(failure)?;
        print_json(&r)?;
        return Ok(ExitCode::SUCCESS);
    }
    let engine = std::env::current_exe()
        .map_err(|e| Failure::new(format!("cannot find the taskbox executable: {e}")))?;
    // The CLI runs measured are the user's: the front (`taskbox`) next to this engine, which
    // execs back here for all but a plain `run`; an engine run alone measures itself.
    let front = engine.with_file_name("taskbox");
    let exe = if front.is_file() { front } else { engine };
    let opts = Options {
        mode: if args.quick {
            Mode::Quick
        } else if args.full {
            Mode::Full
        } else {
            Mode::Standard
        },
        only: args.only,
        exe,
        scratch: args.scratch,
        postgres: args.postgres,
    };
    bench::validate_only(&opts.only).map_err(failure)?;
    if cfg!(debug_assertions) && opts.mode != Mode::Quick {
        eprintln!("note: this is a debug build; its figures say little about speed (use `cargo build --release`)");
    }
    let report = bench::run(&opts, &mut |msg| eprintln!("bench: {msg}")).map_err(failure)?;
    if args.json {
        print_json(&report)?;
    } else {
        let text = if args.markdown {
            markdown(&report)
        } else {
            table(&report)
        };
        write_ignoring_broken_pipe(&mut std::io::stdout().lock(), text.as_bytes())?;
    }
    let missed: Vec<&str> = report.missed().map(|m| m.name.as_str()).collect();
    if !missed.is_empty() {
        eprintln!("note: target missed: {}", missed.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}

const HEADER: [&str; 6] = [
    "benchmark",
    "subject",
    "baseline",
    "ratio",
    "target",
    "result",
];

/// An added time with its sign: `+2.82`, or `−1.23` for a subject faster than its baseline.
fn signed(value: f64) -> String {
    let sign = if value < 0.0 { "−" } else { "+" };
    format!("{sign}{}", fmt_num(value.abs()))
}

/// The cells of each row, in [`HEADER`] order.
fn cells(r: &Report) -> Vec<[String; 6]> {
    r.benchmarks
        .iter()
        .map(|m| {
            let subject = match m.added {
                Some(a) => format!("{} ({} {})", m.subject.display(), signed(a.value), a.unit),
                None => m.subject.display(),
            };
            [
                m.name.clone(),
                subject,
                m.baseline.display(),
                format!("{}×", fmt_num(m.ratio)),
                m.target_text.clone(),
                match m.met {
                    Some(true) => "met".to_string(),
                    Some(false) => "MISSED".to_string(),
                    None => "-".to_string(),
                },
            ]
        })
        .collect()
}

fn footer(r: &Report) -> String {
    let env = &r.environment;
    let load = |l: Option<f64>| l.map_or("?".to_string(), |v| format!("{v:.2}"));
    format!(
        "{} build, {} CPUs, load {} → {}, {:.0} s; reproduce: {}",
        env.build,
        env.cpus,
        load(env.load_start),
        load(env.load_end),
        r.elapsed_s,
        r.command
    )
}

/// The Markdown table, then what each side was and the notes, as a list.
pub fn markdown(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", HEADER.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(HEADER.len()));
    for mut row in cells(r) {
        row[0] = format!("`{}`", row[0]);
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    let _ = writeln!(out);
    for m in &r.benchmarks {
        let _ = write!(out, "- `{}`: {} vs {}", m.name, m.subject_is, m.baseline_is);
        for n in &m.notes {
            let _ = write!(out, "; {n}");
        }
        let _ = writeln!(out, ".");
    }
    let _ = writeln!(out, "\n{}", footer(r));
    out
}

/// The human table: one row per benchmark, then what each side was and the notes.
pub fn table(r: &Report) -> String {
    let header = HEADER;
    let rows = cells(r);
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
            .collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    };
    line(&mut out, &header.map(String::from));
    line(&mut out, &widths.map(|w| "-".repeat(w)));
    for row in &rows {
        line(&mut out, row);
    }
    let _ = writeln!(out);
    for m in &r.benchmarks {
        let _ = writeln!(out, "{}: {} vs {}", m.name, m.subject_is, m.baseline_is);
        for n in &m.notes {
            let _ = writeln!(out, "    {n}");
        }
    }
    let _ = writeln!(out, "\n{}", footer(r));
    out
}

#[cfg(test)]
mod tests {
    use super::signed;

    #[test]
    fn an_added_time_keeps_its_sign() {
        assert_eq!(signed(2.823), "+2.82");
        assert_eq!(signed(-1.234), "−1.23");
        assert_eq!(signed(0.0), "+0");
    }
}
