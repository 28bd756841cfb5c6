//! A readable difference between two JSON values: one line per differing leaf, named by its
//! path (`task_after.snapshots[0].status`), instead of two dumps to compare by eye.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

/// How many differing fields one comparison reports before it stops listing them; the rest are
/// counted. A divergence is read by a person, and the first few fields say what happened.
pub const MAX_FIELD_DIFFS: usize = 40;

/// One field that differs between what the journal recorded and what was recomputed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldDiff {
    /// Where, e.g. `commands[1].reply.exit_code`.
    pub path: String,
    /// The recorded value (`None`: the field or element is absent from the record).
    pub recorded: Option<Value>,
    /// The recomputed value (`None`: absent from what was recomputed).
    pub recomputed: Option<Value>,
}

impl FieldDiff {
    /// `path: recorded X, recomputed Y` on one line, long values shortened.
    pub fn line(&self) -> String {
        format!(
            "{}: recorded {}, recomputed {}",
            self.path,
            show(self.recorded.as_ref()),
            show(self.recomputed.as_ref())
        )
    }
}

/// A compact rendering of an optional value, cut at 160 characters.
pub fn show(v: Option<&Value>) -> String {
    match v {
        None => "<absent>".to_string(),
        Some(v) => {
            let text = v.to_string();
            shorten(&text, 160)
        }
    }
}

/// Cuts `text` to at most `max` characters, marking the cut.
pub fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
    s.push('…');
    s
}

/// The differing leaves of `recorded` and `recomputed`, below `root` (a path prefix, possibly
/// empty), at most [`MAX_FIELD_DIFFS`] of them; the second value counts every difference.
pub fn diff(root: &str, recorded: &Value, recomputed: &Value) -> (Vec<FieldDiff>, usize) {
    let mut out = Vec::new();
    let mut total = 0;
    walk(
        &mut root.to_string(),
        Some(recorded),
        Some(recomputed),
        &mut out,
        &mut total,
    );
    (out, total)
}

fn walk(
    path: &mut String,
    a: Option<&Value>,
    b: Option<&Value>,
    out: &mut Vec<FieldDiff>,
    total: &mut usize,
) {
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let keys = x.keys().chain(y.keys().filter(|k| !x.contains_key(*k)));
            for k in keys {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                walk(path, x.get(k), y.get(k), out, total);
                path.truncate(len);
            }
        }
        (Some(Value::Array(x)), Some(Value::Array(y))) => {
            for i in 0..x.len().max(y.len()) {
                let len = path.len();
                let _ = write!(path, "[{i}]");
                walk(path, x.get(i), y.get(i), out, total);
                path.truncate(len);
            }
        }
        (a, b) if a == b => {}
        (a, b) => {
            *total += 1;
            if out.len() < MAX_FIELD_DIFFS {
                out.push(FieldDiff {
                    path: if path.is_empty() {
                        "(whole value)".to_string()
                    } else {
                        path.clone()
                    },
                    recorded: a.cloned(),
                    recomputed: b.cloned(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_each_differing_leaf_by_path() {
        let a = json!({"state": "running", "snaps": [{"id": "a", "n": 1}], "x": 1});
        let b = json!({"state": "expired", "snaps": [{"id": "a", "n": 2}, {"id": "b"}], "y": 2});
        let (d, total) = diff("task", &a, &b);
        let lines: Vec<String> = d.iter().map(FieldDiff::line).collect();
        assert_eq!(total, 5);
        assert_eq!(
            lines,
            vec![
                // Object keys come in serde_json's (sorted) order.
                "task.snaps[0].n: recorded 1, recomputed 2",
                r#"task.snaps[1]: recorded <absent>, recomputed {"id":"b"}"#,
                r#"task.state: recorded "running", recomputed "expired""#,
                "task.x: recorded 1, recomputed <absent>",
                "task.y: recorded <absent>, recomputed 2",
            ]
        );
        assert!(diff("", &a, &a).0.is_empty());
    }

    #[test]
    fn caps_the_list_but_counts_everything() {
        let a = Value::Array((0..100).map(Value::from).collect());
        let b = Value::Array((100..200).map(Value::from).collect());
        let (d, total) = diff("v", &a, &b);
        assert_eq!(d.len(), MAX_FIELD_DIFFS);
        assert_eq!(total, 100);
        assert_eq!(shorten("abcdef", 4), "abc…");
    }
}
