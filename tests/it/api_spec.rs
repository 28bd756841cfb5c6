//! `docs/openapi.yaml` against the code and the prose (issue 35): every `/v1` route of the
//! router is in the spec with its method and nothing else is, and every example of
//! `docs/api.md` is valid against the spec's schema for it (`tests/api/check_examples.py`, in
//! the venv `crate::api_fuzz` makes).
//!
//! The router is read from `src/server/http.rs`'s text, as `layering.rs` reads imports: the
//! routes built into the `v1` router (`.route("/path", get(..).post(..))`) before it is nested
//! under `/v1`. Routes outside `/v1` (`/metrics`, a dashboard's pages) are not the v1 API and
//! are not held to it here (`/metrics` is in the spec and its test is `server::metrics`).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::{run_bounded, skip};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// `(METHOD, path)` of every route the `v1` router of `http.rs` adds, `/v1` prefixed.
fn router_routes() -> BTreeSet<(String, String)> {
    let code = std::fs::read_to_string(repo().join("src/server/http.rs")).expect("http.rs");
    let v1 = code
        .split_once("let v1 = Router::new()")
        .and_then(|(_, rest)| rest.split_once(';'))
        .map(|(builder, _)| builder)
        .expect("http.rs builds its routes as `let v1 = Router::new()…;`");
    let mut routes = BTreeSet::new();
    for route in v1.split(".route(").skip(1) {
        // rustfmt puts a long route's path on a line of its own.
        let path = route
            .trim_start()
            .strip_prefix('"')
            .and_then(|r| r.split_once('"'))
            .map(|(p, _)| p)
            .unwrap_or_else(|| panic!("a route whose path is not a literal: {route}"));
        let mut found = false;
        for method in METHODS {
            let mut rest = route;
            while let Some(at) = rest.find(&format!("{method}(")) {
                let before = rest[..at].chars().next_back();
                if matches!(before, Some(' ' | '.' | '(' | ',' | '\n')) {
                    routes.insert((method.to_uppercase(), format!("/v1{path}")));
                    found = true;
                }
                rest = &rest[at + method.len()..];
            }
        }
        assert!(found, "no method found for the route {path}");
    }
    routes
}

/// `(METHOD, path)` of every operation of `docs/openapi.yaml`: its `paths:` keys (two spaces
/// in) and their methods (four spaces in), as the file is written.
fn spec_operations() -> BTreeSet<(String, String)> {
    let spec = std::fs::read_to_string(repo().join("docs/openapi.yaml")).expect("openapi.yaml");
    let paths = spec
        .split_once("\npaths:\n")
        .and_then(|(_, rest)| rest.split_once("\ncomponents:\n"))
        .map(|(paths, _)| paths)
        .expect("docs/openapi.yaml has `paths:` then `components:`");
    let mut ops = BTreeSet::new();
    let mut current: Option<&str> = None;
    for line in paths.lines() {
        if let Some(p) = line.strip_prefix("  /") {
            current = Some(line[2..].trim_end_matches(':'));
            assert!(p.ends_with(':'), "{line}");
        } else if let Some(m) = line.strip_prefix("    ") {
            let m = m.trim_end_matches(':');
            if METHODS.contains(&m) {
                let path = current.expect("a method under a path");
                ops.insert((m.to_uppercase(), path.to_string()));
            }
        }
    }
    ops
}

#[test]
fn every_v1_route_is_in_the_spec_and_every_spec_operation_is_a_route() {
    let router = router_routes();
    assert!(router.len() >= 13, "{router:?}");
    let spec: BTreeSet<_> = spec_operations()
        .into_iter()
        .filter(|(_, p)| p.starts_with("/v1/"))
        .collect();
    let missing: Vec<_> = router.difference(&spec).collect();
    let extra: Vec<_> = spec.difference(&router).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/openapi.yaml lacks the routes {missing:?} and describes {extra:?}, which the \
         router has not: describe a new route in the spec (and docs/api.md)"
    );
    assert!(
        spec_operations().contains(&("GET".into(), "/metrics".into())),
        "the spec describes /metrics"
    );
}

#[test]
fn the_examples_of_docs_api_md_are_valid_against_the_spec() {
    let python = match crate::api_fuzz::python() {
        Ok(p) => p,
        Err(reason) => {
            skip(reason);
            return;
        }
    };
    let mut check = Command::new(&python);
    check
        .arg(repo().join("tests/api/check_examples.py"))
        .arg(repo().join("docs/openapi.yaml"))
        .arg(repo().join("docs/api.md"))
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let (passed, out) = run_bounded(check, Duration::from_secs(120), "check_examples.py")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        passed,
        "docs/api.md's examples against docs/openapi.yaml:\n{out}"
    );
    assert!(out.contains("examples valid"), "{out}");
}
