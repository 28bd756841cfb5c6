//! What both paths of `taskbox run` share — the full one (`commands::run`, `live`) and the
//! fast one (`fast`) — and with them the front binary (src/front.rs), which compiles this
//! module, `fast` and `output` as its own: the exit codes, the command joined for bash, its
//! output printed as it arrives, whether stdin is forwarded, and the run's end (notes, exit
//! code). Nothing here needs clap, tokio or logging, so that the front links none of them.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use taskbox::engine::Paths;
use taskbox::provider::{OutputChunk, OutputStream};
use taskbox::TaskId;

use super::output::{self, print_json, Failure};

/// Exit code of a command killed by its timeout.
pub const EXIT_TIMEOUT: u8 = 124;

/// Joins a program and its arguments into one `bash -c` string; a single argument is taken as
/// a shell string as it is (`taskbox run --task t -- 'ls | wc -l'`).
pub fn shell_join(args: &[String]) -> String {
    if args.len() == 1 {
        return args[0].clone();
    }
    args.iter()
        .map(|a| taskbox::shell::quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether our stdin is one to forward: not a terminal, `/dev/null` or closed.
pub fn stdin_waits() -> bool {
    !(std::io::stdin().is_terminal() || stdin_is_empty())
}

/// Whether our stdin is `/dev/null` or closed.
fn stdin_is_empty() -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(ours) = std::fs::metadata("/dev/stdin") else {
        return true;
    };
    let null = std::fs::metadata("/dev/null");
    ours.file_type().is_char_device() && null.is_ok_and(|n| n.rdev() == ours.rdev())
}

/// Prints output chunks exactly as they came, flushing each; a closed stdout (`| head`) stops
/// stdout only.
#[derive(Default)]
pub struct Printer {
    stdout_closed: bool,
}

impl Printer {
    pub fn print(&mut self, chunk: &OutputChunk) {
        match chunk.stream {
            OutputStream::Stdout if !self.stdout_closed => {
                let mut out = std::io::stdout().lock();
                if out
                    .write_all(&chunk.data)
                    .and_then(|()| out.flush())
                    .is_err()
                {
                    self.stdout_closed = true;
                }
            }
            OutputStream::Stdout => {}
            OutputStream::Stderr => {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(&chunk.data).and_then(|()| err.flush());
            }
        }
    }
}

/// How long `taskbox run` waits for a cancelled command's result before it exits anyway: the
/// cancel's own escalation (SIGKILL after 3 s) has ended the command by then, and a run that
/// is still waiting (for another process's lock, for a sandbox) has nothing running to report.
pub const CANCEL_WAIT: Duration = Duration::from_secs(6);

/// A run's result as `taskbox run` reports it (the full path's and the fast path's): the
/// notes, the result under `--json`, and the exit code — the signal's that cancelled it, 124
/// for a timeout, else the command's own.
pub fn finish_run(
    res: taskbox::engine::RunResult,
    task: &TaskId,
    json: bool,
    timeout: Option<u64>,
    cancelled: Option<taskbox::provider::CancelSignal>,
    paths: &Paths,
) -> Result<ExitCode, Failure> {
    // Once, on the first run of a store that is new while archives of another installation
    // exist (the database was removed or moved aside).
    for note in taskbox::provider::registry::take_foreign_notes(&paths.data_dir) {
        eprintln!("note: {note}");
    }
    if json {
        let mut v = serde_json::to_value(&res)
            .map_err(|e| Failure::new(format!("cannot encode JSON: {e}")))?;
        v["task"] = task.as_str().into();
        print_json(&v)?;
    } else {
        output::print_notices(&res.notices);
    }
    if let Some(signal) = cancelled {
        // As a shell reports a command its signal ended: 130, 143, 129.
        return Ok(ExitCode::from(signal.exit_code() as u8));
    }
    if res.timed_out {
        let secs = timeout.map_or_else(|| "terminal.timeout".to_string(), |s| format!("{s} s"));
        eprintln!(
            "note: the command timed out after {secs} and was killed (the sandbox keeps running)"
        );
        return Ok(ExitCode::from(EXIT_TIMEOUT));
    }
    Ok(ExitCode::from(res.exit_code.clamp(0, 255) as u8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_arguments_for_bash() {
        let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(shell_join(&v(&["cat", "notes.txt"])), "cat notes.txt");
        assert_eq!(
            shell_join(&v(&["bash", "-c", "echo hello > notes.txt; pwd"])),
            "bash -c 'echo hello > notes.txt; pwd'"
        );
        assert_eq!(shell_join(&v(&["echo", "it's"])), r"echo 'it'\''s'");
        assert_eq!(shell_join(&v(&["ls | wc -l"])), "ls | wc -l");
    }
}
