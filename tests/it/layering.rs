//! The library's rooms import only downward (ARCHITECTURE.md, "no import upward, no cycle"):
//! every `crate::<room>` a room's code names (imports and paths, not comments or its unit tests)
//! must be one of the rooms below it in [`LAYERS`]. A table that allows only lower layers has no
//! cycle by construction.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The library's top-level rooms, lowest first; a room may use those of earlier layers only.
/// `core` and `ids` are the `taskbox-core` crate (its own crate: it can import nothing here).
const LAYERS: &[&[&str]] = &[
    &["core", "ids"],
    // The one redaction of secrets: the store and the config show URLs through it.
    &["redact"],
    &["store", "clock", "config", "rng", "shell"],
    // The snapshot store (files only) sits below every provider that keeps snapshots in it.
    &["retry", "snapshot_store"],
    &["provider"],
    &["fake", "engine"],
    &["replay", "client"],
    &["server"],
    &["chaos", "bench"],
];

fn layer_of(room: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&room))
}

/// The room a file of `src/` belongs to (`None`: the crate root and the binaries).
fn room_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let room = first.strip_suffix(".rs").unwrap_or(first);
    match room {
        "lib" | "main" | "front" | "cli" => None,
        _ => Some(room.to_string()),
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The rooms `code` names as `crate::<room>`, outside comments and its `#[cfg(test)]` module.
fn rooms_named(code: &str) -> BTreeSet<String> {
    let code = code
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    let mut named = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or_default();
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + "crate::".len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // `taskbox_crate::`, not ours
            }
            let room: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !room.is_empty() {
                named.insert(room);
            }
        }
    }
    named
}

#[test]
fn rooms_import_only_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut upward = Vec::new();
    let mut unknown = BTreeSet::new();
    for file in &files {
        let Some(room) = room_of(&src, file) else {
            continue;
        };
        let Some(own) = layer_of(&room) else {
            unknown.insert(room);
            continue;
        };
        let code = std::fs::read_to_string(file).expect("read a source file");
        for used in rooms_named(&code) {
            if used == room || used.chars().next().is_some_and(char::is_uppercase) {
                continue; // itself, or a re-exported item (`crate::TaskId`)
            }
            match layer_of(&used) {
                Some(l) if l < own => {}
                Some(_) => upward.push(format!(
                    "{} ({room}) uses crate::{used}",
                    file.strip_prefix(&src).unwrap_or(file).display()
                )),
                None => {
                    unknown.insert(used);
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "rooms missing from LAYERS (place each in ARCHITECTURE.md's layering and here): {unknown:?}"
    );
    assert!(
        upward.is_empty(),
        "imports upward or sideways (ARCHITECTURE.md's layering):\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_check_sees_an_upward_import() {
    let code = "use crate::engine::Orchestrator; // a provider must not\nfn f() {}\n";
    assert_eq!(rooms_named(code), BTreeSet::from(["engine".to_string()]));
    let commented = "//! see [`crate::engine`]\n/// [`crate::server`]\nfn f() {}\n";
    assert!(rooms_named(commented).is_empty());
    let in_tests = "fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::engine::X;\n}\n";
    assert!(rooms_named(in_tests).is_empty());
    assert!(layer_of("engine") > layer_of("provider"));
}
