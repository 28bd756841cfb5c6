//! The fast path's reading of a command line (`fast::parse`), checked against clap's. A module
//! of the full CLI rather than of `fast`: the front binary compiles `fast` too, without clap.

use std::ffi::OsString;

use super::fast::{parse, PlainRun};

/// This path's reading of a command line, checked against the full path's (clap's) where
/// it recognises one: the same task, timeout and command, and nothing else asked for.
fn parsed(args: &[&str]) -> Option<PlainRun> {
    let mut v: Vec<OsString> = vec!["taskbox".into()];
    v.extend(args.iter().map(OsString::from));
    let plain = parse(&v)?;
    let cli = <super::Cli as clap::Parser>::try_parse_from(&v)
        .unwrap_or_else(|e| panic!("clap refuses {args:?}, the fast path took it: {e}"));
    let super::Cmd::Run(run) = cli.cmd else {
        panic!("clap reads {args:?} as another command");
    };
    assert_eq!(cli.verbose, 0, "{args:?}");
    assert!(!run.json, "{args:?}");
    assert_eq!(
        (&run.task, run.timeout, &run.command),
        (&plain.task, plain.timeout, &plain.command),
        "clap reads {args:?} otherwise"
    );
    Some(plain)
}

fn plain(task: &str, timeout: Option<u64>, command: &[&str]) -> Option<PlainRun> {
    Some(PlainRun {
        task: task.into(),
        timeout,
        command: command.iter().map(|s| s.to_string()).collect(),
    })
}

#[test]
fn plain_run_command_lines_are_recognised() {
    assert_eq!(
        parsed(&["run", "--task", "t", "--", "echo", "ok"]),
        plain("t", None, &["echo", "ok"])
    );
    assert_eq!(
        parsed(&["run", "-t", "t", "echo ok"]),
        plain("t", None, &["echo ok"])
    );
    assert_eq!(
        parsed(&["run", "--task=t", "--timeout=5", "--", "ls", "--json"]),
        plain("t", Some(5), &["ls", "--json"])
    );
    assert_eq!(
        parsed(&["run", "--timeout", "7", "-t", "t", "cat", "-n", "--", "x"]),
        plain("t", Some(7), &["cat", "-n", "--", "x"])
    );
    assert_eq!(
        parsed(&[
            "run",
            "-t",
            "t",
            "--timeout",
            "05",
            "x",
            "--task",
            "y",
            "--json"
        ]),
        plain("t", Some(5), &["x", "--task", "y", "--json"])
    );
    // After `--`, everything is the command, `--` included.
    assert_eq!(
        parsed(&["run", "-t", "t", "--", "--", "x"]),
        plain("t", None, &["--", "x"])
    );
}

#[test]
fn anything_else_goes_to_the_full_path() {
    for args in [
        &["run", "--task", "t", "--json", "--", "true"][..],
        &["-v", "run", "--task", "t", "true"],
        &["run", "-tt", "true"],
        &["run", "--task", "t"],
        &["run", "--task", "t", "--"],
        &["run", "true"],
        &["run", "--task", "--", "true"],
        &["run", "--task", "a", "--task", "b", "true"],
        &["run", "--task", "t", "--timeout", "x", "true"],
        &["run", "--task", "t", "--timeout", "-1", "true"],
        &[
            "run",
            "--task",
            "t",
            "--timeout",
            "99999999999999999999",
            "true",
        ],
        &["run", "--task", "t", "--help"],
        &["run", "--task", "t", "-h", "true"],
        &["suspend", "t"],
        &[],
    ] {
        assert_eq!(parsed(args), None, "{args:?}");
    }
    use std::os::unix::ffi::OsStringExt;
    let bad = OsString::from_vec(vec![b't', 0xff]);
    assert_eq!(
        parse(&[
            "taskbox".into(),
            "run".into(),
            "-t".into(),
            bad,
            "true".into()
        ]),
        None
    );
}
