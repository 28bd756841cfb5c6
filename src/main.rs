//! The `taskbox` command line. The only code that prints: data on stdout (with `--json` for
//! scripts), everything else on stderr; `error:` / `caused by:` / `hint:` lines like cargo's.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
