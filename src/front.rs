//! `taskbox`, the front: the command users run. It serves a plain `taskbox run` through a
//! running server itself (src/cli/fast.rs) and hands every other command line to the engine,
//! `taskbox-engine`, installed next to it — by `exec`, so that the engine is this same process
//! (the same pid, signals, stdin, stdout, stderr and exit code) with the same arguments.
//!
//! Why two binaries: a warm `taskbox run` is a short process whose own start is most of what
//! it adds over the command, and a process's start grows with its image (the dynamic loader
//! relocates every pointer in it and pages it in). This binary compiles only the fast path's
//! modules — `fast`, `run_io`, `output` — so the linker keeps the blocking client and the few
//! checks they reach, and none of clap, tokio, the engine or the providers (ARCHITECTURE.md,
//! "The CLI's fast path").

// Only the CLI prints (ARCHITECTURE.md); these are the CLI's own modules, compiled here too.
#[cfg(all(feature = "server", target_os = "linux"))]
#[allow(clippy::print_stdout, clippy::print_stderr)]
#[path = "cli/fast.rs"]
mod fast;
// The full CLI uses the rest of `output` (its tables and JSON); the front, only `fail`.
#[cfg(all(feature = "server", target_os = "linux"))]
#[allow(clippy::print_stdout, clippy::print_stderr, dead_code)]
#[path = "cli/output.rs"]
mod output;
#[cfg(all(feature = "server", target_os = "linux"))]
#[allow(clippy::print_stdout, clippy::print_stderr)]
#[path = "cli/run_io.rs"]
mod run_io;

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// The engine's file name: the full `taskbox`, next to this binary.
const ENGINE: &str = "taskbox-engine";

/// Exit code for taskbox's own failures (as `cli::output::EXIT_TASKBOX_ERROR`).
const EXIT_TASKBOX_ERROR: u8 = 125;

fn main() -> ExitCode {
    #[cfg(all(feature = "server", target_os = "linux"))]
    if let Some(code) = fast::run() {
        return code;
    }
    let engine = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name(ENGINE),
        Err(e) => {
            return failed(
                &format!(
                    "cannot find the taskbox binary's own path (to run {ENGINE} next to it): {e}"
                ),
                &format!("run {ENGINE} directly, with the same arguments"),
            )
        }
    };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| OsString::from("taskbox"));
    let err = exec(&engine, arg0, args);
    failed(
        &format!("cannot run the taskbox engine {}: {err}", engine.display()),
        &format!(
            "`taskbox` runs every command but a plain `taskbox run` through `{ENGINE}`, which must \
             be an executable next to it: install both (`cargo install --path .` does), or copy \
             {ENGINE} from the same build into {}",
            engine.parent().unwrap_or(Path::new("/")).display()
        ),
    )
}

/// Replaces this process with the engine, argv[0] kept (so that it still names itself as the
/// user called it); returns only when that failed.
// Becoming the engine is the front's one job besides the fast path: no process is spawned.
#[allow(clippy::disallowed_types)]
fn exec(engine: &Path, arg0: OsString, args: std::env::ArgsOs) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    std::process::Command::new(engine)
        .arg0(arg0)
        .args(args)
        .exec()
}

/// Prints `error:` and `hint:` lines as the CLI does (src/cli/output.rs) and returns 125.
#[allow(clippy::print_stderr)]
fn failed(message: &str, hint: &str) -> ExitCode {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "error: {message}");
    let _ = writeln!(err, "hint: {hint}");
    ExitCode::from(EXIT_TASKBOX_ERROR)
}
