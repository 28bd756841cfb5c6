//! The documents a newcomer reads stay whole: every relative link in README.md, ARCHITECTURE.md,
//! `docs/*.md` and the Hermes backend's README points at a file that exists and, when it names
//! a heading (`#anchor`), at a heading that exists there (GitHub's anchors); the README stays
//! short and keeps its two commands.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The README's budget: what it is, the two commands, usage, today's figures and links; the
/// reference sections live in `docs/`.
const README_MAX_LINES: usize = 450;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A path as a reader of the repository names it (relative to its root when it is inside).
fn shown(path: &Path) -> String {
    let root = root();
    path.strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The Markdown files of `docs/`, sorted.
fn in_docs(root: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs
}

/// The documents whose links are checked.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("integrations/hermes/README.md"),
    ];
    docs.extend(in_docs(root));
    docs
}

/// The lines of `text` outside fenced code blocks (a fenced line is kept empty, so line
/// numbers stay those of the file).
fn outside_fences(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .map(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                ""
            } else if fenced {
                ""
            } else {
                line
            }
        })
        .collect()
}

/// GitHub's anchor of a heading's text: lower case, letters, digits, `-` and `_` kept, spaces
/// made `-`, everything else (backticks, punctuation, dashes) dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor a Markdown file's headings give, duplicates numbered as GitHub does.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in outside_fences(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim_end_matches('#'));
        let mut anchor = base.clone();
        let mut n = 0;
        while out.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        out.insert(anchor);
    }
    out
}

/// `text` with its inline code spans (one or more backticks, up to the same run again) blanked,
/// so a `[x](y)` inside code is not taken for a link.
fn without_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let n = chars[j..].iter().take_while(|&&c| c == '`').count();
                if n == run {
                    close = Some(j + n);
                    break;
                }
                j += n;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                out.push_str("code");
                i = end;
            }
            None => {
                out.extend(&chars[i..i + run]);
                i += run;
            }
        }
    }
    out
}

/// The targets of a Markdown file's inline links (`[text](target)`), outside code.
fn link_targets(text: &str) -> Vec<String> {
    let prose = without_code_spans(&outside_fences(text).join("\n"));
    let mut targets = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        targets.push(after[..end].trim().to_string());
        rest = &after[end..];
    }
    targets
}

/// What is wrong with the relative links of the document at `path` (empty: nothing).
fn broken_links(path: &Path) -> Vec<String> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let dir = path.parent().expect("a document has a directory");
    let mut broken = Vec::new();
    for target in link_targets(&text) {
        if target.is_empty() {
            broken.push(format!("{}: an empty link target", shown(path)));
            continue;
        }
        if ["http://", "https://", "mailto:"]
            .iter()
            .any(|scheme| target.starts_with(scheme))
        {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((file, anchor)) => (file, Some(anchor)),
            None => (target.as_str(), None),
        };
        let linked = if file.is_empty() {
            path.to_path_buf()
        } else {
            dir.join(file)
        };
        if !linked.exists() {
            broken.push(format!(
                "{}: `{target}` names {}, which does not exist",
                shown(path),
                shown(&linked)
            ));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if linked.extension().is_none_or(|e| e != "md") {
            broken.push(format!(
                "{}: `{target}` names a heading in a file that is not Markdown",
                shown(path)
            ));
            continue;
        }
        let headings = anchors(&std::fs::read_to_string(&linked).expect("read a linked document"));
        if !headings.contains(anchor) {
            broken.push(format!(
                "{}: `{target}`: {} has no heading `#{anchor}` (it has: {})",
                shown(path),
                shown(&linked),
                headings.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    broken
}

#[test]
fn every_relative_link_points_at_a_file_and_heading_that_exist() {
    let root = root();
    let docs = documents(&root);
    assert!(
        docs.len() > 4,
        "expected the README, ARCHITECTURE.md and docs/*.md: {docs:?}"
    );
    let broken: Vec<String> = docs.iter().flat_map(|d| broken_links(d)).collect();
    assert!(
        broken.is_empty(),
        "broken links (fix the link, or the heading it names):\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_readme_is_short_and_keeps_its_two_commands() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("read README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move reference sections to docs/"
    );
    let two = readme
        .split("\n## Two commands\n")
        .nth(1)
        .expect("README.md has a \"## Two commands\" section")
        .split("\n## ")
        .next()
        .expect("a section");
    for command in [
        "cargo run -- run --task demo -- bash -c 'echo hello > notes.txt; cat notes.txt'",
        "cargo test",
    ] {
        assert!(
            two.lines().any(|l| l == command),
            "README.md's \"Two commands\" lacks `{command}` on a line of its own"
        );
    }
}

#[test]
fn every_document_in_docs_opens_with_a_title_and_a_purpose() {
    let docs = in_docs(&root());
    assert!(!docs.is_empty(), "docs/ holds no Markdown file");
    for doc in &docs {
        let text = std::fs::read_to_string(doc).expect("read a document");
        let mut lines = text.lines();
        let title = lines.next().unwrap_or_default();
        assert!(
            title.starts_with("# "),
            "{} must open with a `# ` title, not {title:?}",
            doc.display()
        );
        assert_eq!(
            lines.next(),
            Some(""),
            "{}: a blank line after the title",
            doc.display()
        );
        assert!(
            lines
                .next()
                .is_some_and(|l| !l.is_empty() && !l.starts_with('#')),
            "{} must say its purpose in the line after its title",
            doc.display()
        );
    }
}

#[test]
fn the_checker_finds_a_missing_file_a_missing_heading_and_ignores_code() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("other.md"),
        "# Other\n\n## `taskbox gc` — and more\n\n```sh\n# not a heading\n```\n",
    )
    .expect("write other.md");
    let doc = dir.path().join("doc.md");
    std::fs::write(
        &doc,
        "# Doc\n\n## Same file\n\n\
         [ok](other.md#taskbox-gc--and-more) [ok](#same-file) [web](https://example.com/x#y)\n\
         [gone](missing.md) [no heading](other.md#not-a-heading) [here](#nowhere)\n\
         `[in code](missing-too.md)` and ``[in `code`](missing-three.md)``\n\n\
         ```md\n[fenced](missing-four.md)\n```\n",
    )
    .expect("write doc.md");
    let broken = broken_links(&doc);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken[0].contains("`missing.md`"), "{}", broken[0]);
    assert!(broken[1].contains("#not-a-heading"), "{}", broken[1]);
    assert!(broken[2].contains("#nowhere"), "{}", broken[2]);
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(slug("Two commands"), "two-commands");
    assert_eq!(
        slug("An offline Vercel: `taskbox fake-vercel`"),
        "an-offline-vercel-taskbox-fake-vercel"
    );
    assert_eq!(slug("`POST /v1/tasks/{task}/run`"), "post-v1taskstaskrun");
    assert_eq!(
        slug("`crates/taskbox-core` — the pure lifecycle"),
        "cratestaskbox-core--the-pure-lifecycle"
    );
    let a = anchors("# A\n## Notes\n### Notes\n");
    assert!(a.contains("notes") && a.contains("notes-1"), "{a:?}");
}

#[test]
fn every_docs_file_is_linked_from_the_readme() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read README.md");
    let linked = link_targets(&readme);
    for doc in in_docs(&root) {
        let name = format!(
            "docs/{}",
            doc.file_name().expect("a file").to_string_lossy()
        );
        assert!(
            linked
                .iter()
                .any(|t| t == &name || t.starts_with(&format!("{name}#"))),
            "README.md links nowhere to {name}: add it to its \"Documentation\" list"
        );
    }
}

#[test]
fn the_codemap_has_a_line_for_every_room() {
    let root = root();
    let architecture =
        std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let codemap = architecture
        .split("\n## Codemap\n")
        .nth(1)
        .expect("ARCHITECTURE.md has a \"## Codemap\" section")
        .split("\n## ")
        .next()
        .expect("a section");
    let mut rooms = vec!["crates/taskbox-core".to_string()];
    for entry in std::fs::read_dir(root.join("src")).expect("read src/") {
        let path = entry.expect("src/ entry").path();
        let name = path
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        rooms.push(match name.strip_suffix(".rs") {
            // The crate root only re-exports the rooms.
            Some("lib") => continue,
            Some(_) => format!("src/{name}"),
            None => format!("src/{name}/"),
        });
    }
    let missing: Vec<&String> = rooms
        .iter()
        .filter(|room| !codemap.contains(&format!("`{room}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's codemap has no line for {missing:?}: add one (what it owns, what it \
         must not do)"
    );
}
