//! The simulated sandbox's command language: just enough shell for tests to write files, read
//! them back after a snapshot and a restore, and spend virtual time.
//!
//! A command string is a list of steps separated by `;` or newlines; each step is one of
//!
//! | step | effect |
//! |---|---|
//! | `write PATH CONTENT` | sets the file to CONTENT (the rest of the step, trimmed) |
//! | `append PATH CONTENT` | appends CONTENT, creating the file if missing |
//! | `cat PATH` | prints the file to stdout; exit 1 if it is missing |
//! | `rm PATH` | removes the file; exit 1 if it is missing |
//! | `sleep MS` | spends MS milliseconds of virtual time |
//! | `exit N` | stops with exit code N |
//! | `true` | does nothing |
//!
//! Like `bash -c "a; b"`, every step runs whatever the previous one returned, and the exit code
//! is the last step's. An unknown step is exit 127 with a message on stderr.

use std::collections::BTreeMap;

/// One parsed step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    Write {
        path: String,
        content: String,
    },
    Append {
        path: String,
        content: String,
    },
    Cat {
        path: String,
    },
    Rm {
        path: String,
    },
    Sleep {
        ms: u64,
    },
    Exit {
        code: i32,
    },
    True,
    /// A step that could not be parsed: it fails with this code and stderr line when reached.
    Broken {
        code: i32,
        stderr: String,
    },
}

/// Parses a command string into steps. Never fails: a bad step becomes [`Step::Broken`], so the
/// steps before it still run, as they would in a shell.
pub(crate) fn parse(command: &str) -> Vec<Step> {
    command
        .split([';', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(parse_step)
        .collect()
}

fn parse_step(step: &str) -> Step {
    let (verb, rest) = split_word(step);
    let (arg, tail) = split_word(rest);
    let usage = |text: &str| Step::Broken {
        code: 2,
        stderr: format!("{verb}: usage: {text}"),
    };
    match verb {
        "write" | "append" if arg.is_empty() => usage(&format!("{verb} PATH CONTENT")),
        "write" => Step::Write {
            path: arg.to_string(),
            content: tail.to_string(),
        },
        "append" => Step::Append {
            path: arg.to_string(),
            content: tail.to_string(),
        },
        "cat" | "rm" if arg.is_empty() || !tail.is_empty() => usage(&format!("{verb} PATH")),
        "cat" => Step::Cat {
            path: arg.to_string(),
        },
        "rm" => Step::Rm {
            path: arg.to_string(),
        },
        "sleep" => match arg.parse::<u64>() {
            Ok(ms) if tail.is_empty() => Step::Sleep { ms },
            _ => Step::Broken {
                code: 1,
                stderr: format!("sleep: invalid time interval `{rest}` (give whole milliseconds)"),
            },
        },
        "exit" if arg.is_empty() => Step::Exit { code: 0 },
        "exit" => match arg.parse::<i32>() {
            Ok(code) if tail.is_empty() => Step::Exit { code },
            _ => Step::Broken {
                code: 2,
                stderr: format!("exit: `{rest}`: numeric argument required"),
            },
        },
        "true" if rest.is_empty() => Step::True,
        _ => Step::Broken {
            code: 127,
            stderr: format!(
                "sim: `{verb}`: command not found (the simulated sandbox knows write, append, \
                 cat, rm, sleep, exit and true)"
            ),
        },
    }
}

/// Splits off the first whitespace-separated word; the rest is trimmed at the start.
fn split_word(s: &str) -> (&str, &str) {
    match s.find(char::is_whitespace) {
        Some(i) => (&s[..i], s[i..].trim_start()),
        None => (s, ""),
    }
}

/// The virtual time the steps would spend if nothing stopped them.
pub(crate) fn total_sleep_ms(steps: &[Step]) -> u64 {
    steps
        .iter()
        .map(|s| match s {
            Step::Sleep { ms } => *ms,
            _ => 0,
        })
        .fold(0u64, u64::saturating_add)
}

/// What the running program has produced so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Shell {
    pub stdout: String,
    pub stderr: String,
    /// The last step's exit code.
    pub status: i32,
}

/// Whether the program goes on after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    Exit,
}

impl Shell {
    /// Runs one instantaneous step against `files`. A [`Step::Sleep`] is the caller's to run (it
    /// needs the clock); here it only counts as a successful step.
    pub(crate) fn apply(&mut self, step: &Step, files: &mut BTreeMap<String, String>) -> Flow {
        self.status = 0;
        match step {
            Step::Write { path, content } => {
                files.insert(path.clone(), content.clone());
            }
            Step::Append { path, content } => {
                files.entry(path.clone()).or_default().push_str(content);
            }
            Step::Cat { path } => match files.get(path) {
                Some(content) => self.stdout.push_str(content),
                None => self.fail(1, format!("cat: {path}: No such file or directory")),
            },
            Step::Rm { path } => {
                if files.remove(path).is_none() {
                    self.fail(
                        1,
                        format!("rm: cannot remove '{path}': No such file or directory"),
                    );
                }
            }
            Step::Sleep { .. } | Step::True => {}
            Step::Exit { code } => {
                self.status = *code;
                return Flow::Exit;
            }
            Step::Broken { code, stderr } => self.fail(*code, stderr.clone()),
        }
        Flow::Continue
    }

    fn fail(&mut self, code: i32, line: String) {
        self.status = code;
        self.stderr.push_str(&line);
        self.stderr.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(command: &str, files: &mut BTreeMap<String, String>) -> Shell {
        let mut sh = Shell::default();
        for step in parse(command) {
            if sh.apply(&step, files) == Flow::Exit {
                break;
            }
        }
        sh
    }

    #[test]
    fn parses_steps_and_keeps_content_spaces() {
        assert_eq!(
            parse("write a/b.txt hello  big world ;cat a/b.txt\nsleep 250; exit 3;true"),
            vec![
                Step::Write {
                    path: "a/b.txt".into(),
                    content: "hello  big world".into()
                },
                Step::Cat {
                    path: "a/b.txt".into()
                },
                Step::Sleep { ms: 250 },
                Step::Exit { code: 3 },
                Step::True,
            ]
        );
        assert_eq!(parse(" ; ;\n"), vec![]);
        assert_eq!(total_sleep_ms(&parse("sleep 5; sleep 7; true")), 12);
    }

    #[test]
    fn files_are_written_appended_read_and_removed() {
        let mut files = BTreeMap::new();
        let sh = run(
            "write f one; append f  two; append g x; cat f; cat g",
            &mut files,
        );
        assert_eq!(sh.stdout, "onetwox");
        assert_eq!(sh.status, 0);
        assert_eq!(files.get("f").map(String::as_str), Some("onetwo"));

        let sh = run("rm f; cat f", &mut files);
        assert_eq!(sh.status, 1);
        assert!(sh.stderr.contains("cat: f: No such file"), "{}", sh.stderr);
        let sh = run("rm f", &mut files);
        assert_eq!(sh.status, 1);
        let sh = run("cat nothing; true", &mut files);
        assert_eq!(sh.status, 0, "the last step decides the exit code");
    }

    #[test]
    fn exit_stops_and_unknown_steps_are_127() {
        let mut files = BTreeMap::new();
        let sh = run("write a 1; exit 7; write b 2", &mut files);
        assert_eq!(sh.status, 7);
        assert!(files.contains_key("a") && !files.contains_key("b"));

        let sh = run("ls -la", &mut files);
        assert_eq!(sh.status, 127);
        assert!(
            sh.stderr.contains("`ls`: command not found"),
            "{}",
            sh.stderr
        );

        let sh = run("ls; write c 3", &mut files);
        assert_eq!(sh.status, 0, "a shell goes on after a failed step");
        assert!(files.contains_key("c"));

        for (bad, code) in [
            ("sleep soon", 1),
            ("exit x", 2),
            ("write", 2),
            ("cat", 2),
            ("cat a b", 2),
            ("true false", 127),
        ] {
            let sh = run(bad, &mut files);
            assert_eq!(sh.status, code, "{bad}");
            assert!(!sh.stderr.is_empty(), "{bad}");
        }
        assert_eq!(run("exit", &mut files).status, 0);
    }
}
