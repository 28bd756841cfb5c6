//! The `taskbox` command line. The only code that prints: data on stdout (with `--json` for
//! scripts), everything else on stderr; `error:` / `caused by:` / `hint:` lines like cargo's.

// Only the CLI prints (ARCHITECTURE.md); the library's lints refuse `println!` elsewhere.
#[allow(clippy::print_stdout, clippy::print_stderr)]
mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
