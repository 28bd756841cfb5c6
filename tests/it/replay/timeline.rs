//! The timeline picture (SVG, and the HTML page around it) is well-formed and marks restores and
//! expiries.

use taskbox::replay::timeline;

use crate::support::{ok, stderr, Home};

use super::{golden, golden_dir};

/// A small XML well-formedness check: tags balance, attributes are quoted, `&` starts an entity.
fn assert_well_formed(xml: &str) {
    fn check_text(t: &str) {
        let mut rest = t;
        while let Some(p) = rest.find('&') {
            let ent = &rest[p..];
            let ok = ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"]
                .iter()
                .any(|e| ent.starts_with(e));
            assert!(ok, "bare `&` in text: {}", &ent[..ent.len().min(30)]);
            rest = &ent[1..];
        }
    }
    let mut stack: Vec<String> = Vec::new();
    let mut rest = xml;
    while let Some(lt) = rest.find('<') {
        check_text(&rest[..lt]);
        let after = &rest[lt..];
        if after.starts_with("<!--") {
            let end = after.find("-->").expect("comment closes");
            rest = &after[end + 3..];
            continue;
        }
        // Find the `>` that closes the tag, outside quoted attribute values.
        let mut quote = None;
        let mut gt = None;
        for (i, c) in after.char_indices().skip(1) {
            match (quote, c) {
                (None, '"' | '\'') => quote = Some(c),
                (Some(q), c) if c == q => quote = None,
                (None, '<') => panic!("`<` inside a tag: {}", &after[..i.min(80)]),
                (None, '>') => {
                    gt = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let gt = gt.expect("tag closes");
        let tag = &after[1..gt];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                stack.pop().as_deref(),
                Some(name.trim()),
                "closing tag matches"
            );
        } else {
            let name: String = tag
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '/')
                .collect();
            assert!(!name.is_empty(), "tag has a name: <{tag}>");
            if !tag.ends_with('/') {
                stack.push(name);
            }
        }
        rest = &after[gt + 1..];
    }
    check_text(rest);
    assert!(stack.is_empty(), "unclosed tags: {stack:?}");
}

#[test]
fn the_svg_timeline_is_well_formed_and_marks_restores_and_expiries() {
    let file = golden("expiry");
    let tls = timeline::build(&file.entries);
    let svg = timeline::render_svg(&tls);
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_well_formed(&svg);
    assert!(svg.contains(r#"<g class="lane" data-task="expiry">"#));
    for kind in [
        "restore", "expiry", "snapshot", "command", "recovery", "request",
    ] {
        assert!(
            svg.contains(&format!(r#"<g class="mark {kind}" data-kind="{kind}""#)),
            "no {kind} marker"
        );
    }
    for state in [
        "idle",
        "provisioning",
        "running",
        "snapshotting",
        "expired",
        "restoring",
    ] {
        assert!(
            svg.contains(&format!("data-state=\"{state}\"")),
            "no {state} band"
        );
    }
    // The legend names every state and marker.
    assert!(svg.contains(r#"<g class="legend">"#) && svg.contains("sandbox expired"));

    // The restore marker says which snapshot, and that it was the latest complete one.
    let restore = tls[0]
        .marks
        .iter()
        .find(|m| m.kind == timeline::MarkKind::Restore)
        .expect("a restore");
    assert!(
        restore.label.contains("expiry.s1") && restore.label.contains("latest complete"),
        "{}",
        restore.label
    );

    // A recording without faults has no fault marker; one with a vanished snapshot has one.
    assert!(
        !svg.contains(r#"class="mark fault""#),
        "the absorbed late answer is no fault"
    );
    let gone = timeline::render_svg(&timeline::build(&golden("gone").entries));
    assert_well_formed(&gone);
    assert!(gone.contains(r#"class="mark fault""#));

    // Several tasks: one lane each.
    let several = timeline::render_svg(&timeline::build(&golden("several").entries));
    assert_well_formed(&several);
    assert_eq!(several.matches(r#"<g class="lane""#).count(), 2);

    // Through the CLI, to a file and as HTML.
    let home = Home::new();
    let journal = golden_dir().join("expiry.jsonl");
    let out = home.path().join("t.svg");
    let o = home.run(&[
        "replay",
        "--journal",
        journal.to_str().expect("utf-8"),
        "--format",
        "svg",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    ok(&o);
    assert!(
        stderr(&o).contains("replays cleanly"),
        "the verdict goes to stderr"
    );
    assert_eq!(std::fs::read_to_string(&out).expect("svg written"), svg);
    let html = ok(&home.run(&[
        "replay",
        "--journal",
        journal.to_str().expect("utf-8"),
        "--format",
        "html",
    ]));
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    let inner = &html[html.find("<svg").expect("svg")..html.find("</svg>").expect("svg end") + 6];
    assert_well_formed(inner);
    assert!(html.contains("<table>") && html.contains("sandbox_probed: gone"));
}
