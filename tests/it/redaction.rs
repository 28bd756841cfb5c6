//! The redaction corpus (`redaction_corpus.txt`, issue 32 item 12): every secret form is
//! redacted to what the corpus says remains, every false-positive case stays as it is, and
//! redacting again changes nothing. The paths that use the redaction (the journal, `show`,
//! `export`) are checked end to end in `cli_input.rs` and below.

use crate::support::{ok, Home};

/// One corpus case: the input and what must remain.
struct Case {
    line: usize,
    input: String,
    expected: String,
}

fn corpus() -> Vec<Case> {
    let text = include_str!("redaction_corpus.txt");
    let mut cases = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let (input, expected) = if let Some(input) = line.strip_prefix("= ") {
            (input, input)
        } else {
            line.split_once(" ==> ").unwrap_or_else(|| {
                panic!("redaction_corpus.txt:{line_no}: neither `= INPUT` nor `INPUT ==> EXPECTED`: {line}")
            })
        };
        cases.push(Case {
            line: line_no,
            input: input.to_string(),
            expected: expected.to_string(),
        });
    }
    cases
}

#[test]
fn every_corpus_case_is_redacted_as_written() {
    let cases = corpus();
    assert!(cases.len() >= 50, "the corpus lost cases: {}", cases.len());
    let mut wrong = Vec::new();
    for c in &cases {
        let got = taskbox::redact::redact(&c.input);
        if got != c.expected {
            wrong.push(format!(
                "line {}:\n  input:    {}\n  expected: {}\n  got:      {got}",
                c.line, c.input, c.expected
            ));
        } else if taskbox::redact::redact(&got) != got {
            wrong.push(format!("line {}: redacting twice changed {got}", c.line));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The new forms through the real paths: a command holding them is journaled, shown and
/// exported without them (the command itself runs as typed, printing nothing secret).
#[test]
fn the_journal_show_and_export_redact_the_corpus_forms() {
    let secrets = [
        "Zq9xK2mP7vL4nR8t",
        "Hunter2passA",
        "Hunter2passB",
        "Hunter2passC",
        "eyJhbGciOiJIUzI1NiJ9.eyJyb2xlIjoiYWRtaW4ifQ.c2lnbmF0dXJl",
    ];
    // `:` runs nothing: the forms are only text to journal.
    let command = format!(
        ": \"Bearer {}\"; : mysql -uroot -p{} db; : curl -u admin:{} x; : sshpass -p {} ssh h; : {}; echo done",
        secrets[0], secrets[1], secrets[2], secrets[3], secrets[4]
    );
    let home = Home::new();
    assert_eq!(
        ok(&home.run(&["run", "-t", "red", "--", &command])),
        "done\n"
    );
    let show = ok(&home.run(&["show", "red", "--json", "--journal", "100"]));
    let export = ok(&home.run(&["export", "red"]));
    let text = ok(&home.run(&["show", "red"]));
    for (what, out) in [("show --json", &show), ("export", &export), ("show", &text)] {
        for s in secrets {
            assert!(!out.contains(s), "{what} prints {s}: {out}");
        }
    }
    assert!(show.contains("[redacted]"), "{show}");
    assert!(export.contains("[redacted]"), "{export}");
}
