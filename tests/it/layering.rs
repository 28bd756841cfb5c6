//! The library's rooms import only downward (ARCHITECTURE.md, "no import upward, no cycle"):
//! every `crate::<room>` a room's code names (imports and paths, not comments or its unit tests)
//! must be one of the rooms below it in [`LAYERS`]. A table that allows only lower layers has no
//! cycle by construction.

use std::collections::{BTreeMap, BTreeSet};
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

/// A module of `src/` by its path (`["engine", "batch"]`; a `mod.rs` is its folder's module,
/// `lib.rs` and `main.rs` the root `[]`).
type Module = Vec<String>;

fn module_of(src: &Path, file: &Path) -> Option<Module> {
    let rel = file.strip_prefix(src).ok()?.with_extension("");
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") || parts == ["lib"] || parts == ["main"] {
        parts.pop();
    }
    Some(parts)
}

/// `code` without comments and its `#[cfg(test)]` module, as [`rooms_named`] reads it.
fn code_only(code: &str) -> String {
    let code = code
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    code.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The tokens of a `use` tree: `::`, `,`, `{`, `}` and names (an `as` rename dropped).
fn use_tokens(tree: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut chars = tree.chars().peekable();
    let mut skip_next_name = false;
    while let Some(c) = chars.next() {
        let token = match c {
            ':' if chars.peek() == Some(&':') => {
                chars.next();
                "::".to_string()
            }
            ',' | '{' | '}' => c.to_string(),
            c if c.is_alphanumeric() || c == '_' || c == '*' => {
                let mut name = c.to_string();
                while let Some(&n) = chars.peek() {
                    if !(n.is_alphanumeric() || n == '_') {
                        break;
                    }
                    name.push(n);
                    chars.next();
                }
                name
            }
            _ => continue,
        };
        if token == "as" {
            skip_next_name = true;
        } else if skip_next_name {
            skip_next_name = false;
        } else {
            out.push(token);
        }
    }
    out
}

/// The paths a `use` tree names, its braces expanded (`super::{a::B, c}` → `super::a::B`,
/// `super::c`).
fn expand_use(tokens: &[String], at: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    while *at < tokens.len() {
        let t = tokens[*at].as_str();
        *at += 1;
        match t {
            "{" => {
                expand_use(tokens, at, &path, out);
                path = prefix.to_vec();
            }
            "}" => break,
            "," => {
                if path.len() > prefix.len() {
                    out.push(std::mem::replace(&mut path, prefix.to_vec()));
                }
                path = prefix.to_vec();
            }
            "::" => {}
            name => path.push(name.to_string()),
        }
    }
    if path.len() > prefix.len() {
        out.push(path);
    }
}

/// The paths `code` names: every `use` tree, and every `crate::`, `super::` or `self::` path
/// outside one.
fn paths_named(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let is_name = |c: char| c.is_alphanumeric() || c == '_';
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "use ".len()..];
        if before.is_some_and(|c| is_name(c) || c == ':') {
            continue;
        }
        let end = rest.find(';').unwrap_or(rest.len());
        expand_use(&use_tokens(&rest[..end]), &mut 0, &[], &mut out);
    }
    for start in ["crate::", "super::", "self::"] {
        let mut rest = code;
        while let Some(at) = rest.find(start) {
            let before = rest[..at].chars().next_back();
            let tail = &rest[at..];
            rest = &rest[at + start.len()..];
            if before.is_some_and(|c| is_name(c) || c == ':') {
                continue;
            }
            let chain: String = tail
                .chars()
                .take_while(|c| is_name(*c) || *c == ':')
                .collect();
            out.push(
                chain
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
            );
        }
    }
    out
}

/// The import circles inside rooms: module files that name each other through their siblings
/// (or descendants), each circle once, as `a -> b -> a`. A module naming its own ancestors
/// (`super::Item` from the room's front, `mod.rs`) does not count: the front is below the
/// files it declares, and what several of them share belongs there or in a lower sibling.
fn circles(modules: &BTreeMap<Module, String>) -> Vec<String> {
    let mut edges: BTreeMap<&Module, BTreeSet<&Module>> = BTreeMap::new();
    for (m, code) in modules {
        let targets = edges.entry(m).or_default();
        for path in paths_named(&code_only(code)) {
            let resolved: Module = match path.first().map(String::as_str) {
                Some("crate") => path[1..].to_vec(),
                Some("super" | "self") => {
                    let mut base = m.clone();
                    let mut i = 0;
                    while i < path.len() && (path[i] == "super" || path[i] == "self") {
                        if path[i] == "super" {
                            base.pop();
                        }
                        i += 1;
                    }
                    base.extend(path[i..].iter().cloned());
                    base
                }
                Some(first) => {
                    let mut child = m.clone();
                    child.push(first.to_string());
                    if !modules.contains_key(&child) {
                        continue;
                    }
                    m.iter().chain(&path).cloned().collect()
                }
                None => continue,
            };
            let Some((target, _)) = (1..=resolved.len())
                .rev()
                .find_map(|k| modules.get_key_value(&resolved[..k]))
            else {
                continue;
            };
            let ancestor = m.starts_with(target);
            let same_room = !m.is_empty() && m.first() == target.first();
            if !ancestor && same_room {
                targets.insert(target);
            }
        }
    }
    // Depth-first: an edge back to a module on the current path closes a circle.
    fn visit<'a>(
        m: &'a Module,
        edges: &BTreeMap<&'a Module, BTreeSet<&'a Module>>,
        path: &mut Vec<&'a Module>,
        done: &mut BTreeSet<&'a Module>,
        out: &mut Vec<String>,
    ) {
        path.push(m);
        for &next in edges.get(m).into_iter().flatten() {
            if let Some(i) = path.iter().position(|p| *p == next) {
                let names: Vec<String> = path[i..]
                    .iter()
                    .chain([&next])
                    .map(|p| p.join("/"))
                    .collect();
                out.push(names.join(" -> "));
            } else if !done.contains(next) {
                visit(next, edges, path, done, out);
            }
        }
        path.pop();
        done.insert(m);
    }
    let mut out = Vec::new();
    let mut done = BTreeSet::new();
    for m in edges.keys() {
        if !done.contains(*m) {
            visit(m, &edges, &mut Vec::new(), &mut done, &mut out);
        }
    }
    out
}

#[test]
fn no_import_circles_inside_a_room() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeMap<Module, String> = files
        .iter()
        .filter_map(|f| {
            let code = std::fs::read_to_string(f).expect("read a source file");
            Some((module_of(&src, f)?, code))
        })
        .collect();
    let found = circles(&modules);
    assert!(
        found.is_empty(),
        "import circles inside rooms (move what both sides share to the lower module, or to \
         the room's mod.rs):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_an_import_circle() {
    let module = |s: &str| -> Module { s.split('/').map(str::to_string).collect() };
    let mut modules = BTreeMap::from([
        (module("engine"), "mod a;\nmod b;\nmod c;\n".to_string()),
        (
            module("engine/a"),
            "use super::{b::Staged, EngineError};\n".to_string(),
        ),
        (
            module("engine/b"),
            "pub(super) fn f() { crate::engine::c::g() }\n".to_string(),
        ),
        (
            module("engine/c"),
            "use super::a::{self as alpha, X};\n// use super::b::Y;\n".to_string(),
        ),
    ]);
    assert_eq!(
        circles(&modules),
        ["engine/a -> engine/b -> engine/c -> engine/a"]
    );
    // Naming the room's front (`super::EngineError`) or another room is no circle.
    modules.insert(
        module("engine/c"),
        "use super::EngineError;\nuse crate::store::a::X;\n".into(),
    );
    assert!(circles(&modules).is_empty());
}
