//! Broken journal files are clear errors naming the line.

use taskbox::replay::export::{self, ExportError};

use crate::support::{stderr, Home};

use super::golden_text;

#[test]
fn broken_files_are_clear_errors_naming_the_line() {
    let text = golden_text("session");
    let lines: Vec<&str> = text.lines().collect();
    let read = |s: String| export::read_journal(std::io::Cursor::new(s.into_bytes()));

    // Cut in the middle of line 5.
    let cut = lines[..4].join("\n") + "\n" + &lines[4][..lines[4].len() / 2];
    assert!(matches!(
        read(cut),
        Err(ExportError::Truncated { line: 5, .. })
    ));

    let mut corrupt = lines.clone();
    corrupt[3] = r#"{"seq":3,,"task_id":"demo"}"#;
    assert!(matches!(
        read(corrupt.join("\n")),
        Err(ExportError::Corrupt { line: 4, .. })
    ));

    let no_header = lines[1..].join("\n");
    match read(no_header) {
        Err(e @ ExportError::MissingHeader { line: 1, .. }) => {
            assert!(e.to_string().contains("journal entry"), "{e}")
        }
        other => panic!("{other:?}"),
    }

    let v = taskbox::replay::export::VERSION;
    let newer = text.replacen(
        &format!(r#""version":{v}"#),
        &format!(r#""version":{}"#, v + 1),
        1,
    );
    match read(newer) {
        Err(e @ ExportError::NewerVersion { line: 1, found, .. }) if found == v + 1 => {
            assert!(e.to_string().contains("upgrade taskbox"), "{e}")
        }
        other => panic!("{other:?}"),
    }

    let short = lines[..lines.len() - 1].join("\n");
    assert!(matches!(
        read(short),
        Err(ExportError::Count {
            announced: 16,
            found: 15,
            ..
        })
    ));

    let mut not_entry = lines.clone();
    not_entry[2] = r#"{"hello":"world"}"#;
    assert!(matches!(
        read(not_entry.join("\n")),
        Err(ExportError::Invalid {
            line: 3,
            what: "journal entry",
            ..
        })
    ));

    assert!(matches!(
        read(r#"{"format":"something-else","version":1}"#.into()),
        Err(ExportError::WrongFormat { line: 1, .. })
    ));
    assert!(matches!(read(String::new()), Err(ExportError::Empty)));
    assert!(matches!(read("\n\n".into()), Err(ExportError::Empty)));

    // Through the CLI: exit 125, `error:` naming the file and the line, and a hint.
    let home = Home::new();
    let bad = home.path().join("cut.jsonl");
    std::fs::write(&bad, &text[..text.len() - 40]).expect("write");
    let o = home.run(&["replay", "--journal", bad.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("error:") && err.contains("line 17") && err.contains("truncated"),
        "{err}"
    );
    assert!(err.contains("hint:"), "{err}");
    let newer = home.path().join("newer.jsonl");
    let v = taskbox::replay::export::VERSION;
    std::fs::write(
        &newer,
        text.replacen(&format!(r#""version":{v}"#), r#""version":9"#, 1),
    )
    .expect("write");
    let o = home.run(&["replay", "--journal", newer.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        stderr(&o).contains("line 1: the journal is format version 9"),
        "{}",
        stderr(&o)
    );
}
