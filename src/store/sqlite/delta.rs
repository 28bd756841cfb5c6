//! Journal rows that store what changed: a row's `task_after` is either the whole task (a
//! keyframe) or a delta against the row before it in the task's journal: the top-level members
//! whose value changed, as a JSON object, in the task's member order.
//!
//! Most transitions change a few small members (the state, the queue, the command running, a
//! timestamp) and leave the large ones (the settings, the snapshot records) alone, so a delta is
//! a fraction of the task. The store writes a keyframe for a task's first row this connection
//! writes, every [`KEYFRAME_EVERY`] rows, and when the members' names differ from the row
//! before (a member that appears or disappears); `task_key`
//! names the keyframe a delta's chain starts from, so a reader of the last rows knows where to
//! start. [`apply`] rebuilds the row's whole task text byte for byte as it was serialized, so
//! readers decode it exactly as they decode a keyframe.
//!
//! The scanner is not a JSON validator: it finds the boundaries of the top-level members (and
//! rejects text without them); the rebuilt text is decoded by serde, which reports anything
//! else.

use std::ops::Range;

/// A keyframe at least every this many rows of a task: a reader of a task's last rows decodes
/// at most this many rows it was not asked for.
pub(super) const KEYFRAME_EVERY: u64 = 32;

/// One top-level member of a JSON object: its name (with the quotes) and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Member {
    pub(super) key: Range<usize>,
    pub(super) value: Range<usize>,
}

/// Finds the top-level members of the JSON object `text` into `out` (cleared first).
pub(super) fn members(text: &[u8], out: &mut Vec<Member>) -> Result<(), &'static str> {
    out.clear();
    let mut i = skip_ws(text, 0);
    if text.get(i) != Some(&b'{') {
        return Err("not a JSON object");
    }
    i = skip_ws(text, i + 1);
    if text.get(i) == Some(&b'}') {
        return end(text, i + 1);
    }
    loop {
        if text.get(i) != Some(&b'"') {
            return Err("expected a member name");
        }
        let key = i..skip_string(text, i)?;
        i = skip_ws(text, key.end);
        if text.get(i) != Some(&b':') {
            return Err("expected ':' after a member name");
        }
        let start = skip_ws(text, i + 1);
        let value = start..skip_value(text, start)?;
        i = skip_ws(text, value.end);
        out.push(Member { key, value });
        match text.get(i) {
            Some(b',') => i = skip_ws(text, i + 1),
            Some(b'}') => return end(text, i + 1),
            _ => return Err("expected ',' or '}' after a member"),
        }
    }
}

fn end(text: &[u8], i: usize) -> Result<(), &'static str> {
    if skip_ws(text, i) == text.len() {
        Ok(())
    } else {
        Err("text after the object")
    }
}

fn skip_ws(text: &[u8], mut i: usize) -> usize {
    while matches!(text.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// `text[i]` is `"`: the index after the closing quote.
fn skip_string(text: &[u8], i: usize) -> Result<usize, &'static str> {
    let mut j = i + 1;
    loop {
        match text.get(j) {
            None => return Err("unterminated string"),
            Some(b'\\') => j += 2,
            Some(b'"') => return Ok(j + 1),
            Some(_) => j += 1,
        }
    }
}

/// The index after the value starting at `i`.
fn skip_value(text: &[u8], i: usize) -> Result<usize, &'static str> {
    match text.get(i) {
        None => Err("expected a value"),
        Some(b'"') => skip_string(text, i),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match text.get(j) {
                    None => return Err("unterminated object or array"),
                    Some(b'"') => j = skip_string(text, j)?,
                    Some(b'{' | b'[') => {
                        depth += 1;
                        j += 1;
                    }
                    Some(b'}' | b']') => {
                        depth -= 1;
                        j += 1;
                        if depth == 0 {
                            return Ok(j);
                        }
                    }
                    Some(_) => j += 1,
                }
            }
        }
        Some(_) => {
            let mut j = i;
            while !matches!(
                text.get(j),
                None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            ) {
                j += 1;
            }
            if j == i {
                Err("expected a value")
            } else {
                Ok(j)
            }
        }
    }
}

/// Writes into `out` the delta that turns `prev` into `cur` (their members found by
/// [`members`]): `cur`'s members whose value differs from `prev`'s, in order. `false` (and `out`
/// unspecified) when the two do not have the same member names in the same order: only a
/// keyframe can say that. (The store compares tasks field by field instead, without serializing
/// them; this is what its tests hold it to.)
#[cfg(test)]
pub(super) fn encode(
    prev: &[u8],
    prev_members: &[Member],
    cur: &[u8],
    cur_members: &[Member],
    out: &mut Vec<u8>,
) -> bool {
    if prev_members.len() != cur_members.len() {
        return false;
    }
    out.clear();
    out.push(b'{');
    for (p, c) in prev_members.iter().zip(cur_members) {
        let key = &cur[c.key.clone()];
        if prev[p.key.clone()] != *key {
            return false;
        }
        let value = &cur[c.value.clone()];
        if prev[p.value.clone()] != *value {
            if out.len() > 1 {
                out.push(b',');
            }
            out.extend_from_slice(key);
            out.push(b':');
            out.extend_from_slice(value);
        }
    }
    out.push(b'}');
    true
}

/// Rebuilds into `out` the task text a delta row stood for: `prev` (the row before's whole
/// text) with the members `delta` names replaced by its values. Fails, saying why, when either
/// is not an object or the delta names a member `prev` does not have (in `prev`'s order).
pub(super) fn apply(prev: &str, delta: &str, out: &mut String) -> Result<(), String> {
    let (mut pm, mut dm) = (Vec::new(), Vec::new());
    members(prev.as_bytes(), &mut pm).map_err(|e| format!("the row before: {e}"))?;
    members(delta.as_bytes(), &mut dm).map_err(|e| format!("the delta: {e}"))?;
    out.clear();
    out.reserve(prev.len() + delta.len());
    out.push('{');
    let mut changes = dm.iter().peekable();
    for (n, p) in pm.iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        let key = &prev[p.key.clone()];
        out.push_str(key);
        out.push(':');
        match changes.peek() {
            Some(d) if delta[d.key.clone()] == *key => {
                out.push_str(&delta[d.value.clone()]);
                changes.next();
            }
            _ => out.push_str(&prev[p.value.clone()]),
        }
    }
    if let Some(d) = changes.next() {
        return Err(format!(
            "the delta changes the member {}, which the row before does not have (or not \
             in that order)",
            &delta[d.key.clone()]
        ));
    }
    out.push('}');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn split(text: &str) -> Vec<Member> {
        let mut m = Vec::new();
        members(text.as_bytes(), &mut m).expect("an object");
        m
    }

    fn delta(prev: &str, cur: &str) -> Option<String> {
        let mut out = Vec::new();
        encode(
            prev.as_bytes(),
            &split(prev),
            cur.as_bytes(),
            &split(cur),
            &mut out,
        )
        .then(|| String::from_utf8(out).expect("UTF-8 in, UTF-8 out"))
    }

    fn rebuilt(prev: &str, delta: &str) -> String {
        let mut out = String::new();
        apply(prev, delta, &mut out).expect("applies");
        out
    }

    #[test]
    fn a_delta_holds_the_changed_members_and_rebuilds_the_text_exactly() {
        let prev = r#"{"id":"a","state":"idle","q":[{"x":"}]\"{"}],"n":1,"s":null}"#;
        let cur = r#"{"id":"a","state":"running","q":[],"n":1,"s":{"k":[1,2]}}"#;
        let d = delta(prev, cur).expect("same members");
        assert_eq!(d, r#"{"state":"running","q":[],"s":{"k":[1,2]}}"#);
        assert_eq!(rebuilt(prev, &d), cur);
        assert_eq!(delta(cur, cur).as_deref(), Some("{}"));
        assert_eq!(rebuilt(cur, "{}"), cur);
    }

    #[test]
    fn different_member_names_need_a_keyframe() {
        assert_eq!(delta(r#"{"a":1,"b":2}"#, r#"{"a":1,"b":2,"c":3}"#), None);
        assert_eq!(delta(r#"{"a":1,"b":2}"#, r#"{"a":1,"c":2}"#), None);
        assert_eq!(delta(r#"{"a":1,"b":2}"#, r#"{"b":2,"a":1}"#), None);
    }

    #[test]
    fn bad_text_is_refused_with_a_reason() {
        let mut out = String::new();
        for (prev, d) in [
            ("[1]", "{}"),
            (r#"{"a":1}"#, r#"{"b":2}"#),
            (r#"{"a":1,"b":2}"#, r#"{"b":3,"a":4}"#),
            (r#"{"a":1"#, "{}"),
            (r#"{"a":"x}"#, "{}"),
            (r#"{"a":1} x"#, "{}"),
            (r#"{"a":}"#, "{}"),
            (r#"{"a":1}"#, "null"),
        ] {
            assert!(apply(prev, d, &mut out).is_err(), "{prev} + {d}");
        }
    }

    #[test]
    fn whitespace_around_members_is_read() {
        let prev = " { \"a\" : [ 1 , 2 ] ,\n\"b\":\"x\" } ";
        assert_eq!(rebuilt(prev, r#"{"b":"y"}"#), r#"{"a":[ 1 , 2 ],"b":"y"}"#);
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            ".{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(".{0,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// A chain of objects with the same member names: every delta rebuilds its object's
        /// serialization byte for byte, and is never longer than it by more than the braces.
        #[test]
        fn chains_rebuild_every_row(
            names in prop::collection::btree_set("[a-z\"\\\\]{1,6}", 1..8),
            rows in prop::collection::vec(prop::collection::vec((any::<bool>(), value()), 8), 1..8),
        ) {
            let names: Vec<String> = names.into_iter().collect();
            let mut current: Vec<Value> = vec![Value::Null; names.len()];
            let mut prev: Option<String> = None;
            for row in rows {
                for (slot, (change, v)) in current.iter_mut().zip(row) {
                    if change {
                        *slot = v;
                    }
                }
                let mut map = serde_json::Map::new();
                for (n, v) in names.iter().zip(&current) {
                    map.insert(n.clone(), v.clone());
                }
                let text = serde_json::to_string(&Value::Object(map)).expect("serializes");
                if let Some(p) = &prev {
                    let d = delta(p, &text).expect("same member names");
                    prop_assert!(d.len() <= text.len());
                    prop_assert_eq!(rebuilt(p, &d), text.clone());
                }
                prev = Some(text);
            }
        }
    }
}
