//! Where the re-drive and the recording part ways: the first provider call, reply to a caller or
//! final state that differs, as a [`Divergence`].

use crate::core::{Command, TaskState};
use crate::replay::{diff, Divergence, DivergenceKind};
use crate::store::JournalEntry;

use crate::provider::ReceivedCall;

use super::call::command_key;
use super::provider::ReplayState;

fn call_json(c: &ReceivedCall) -> serde_json::Value {
    serde_json::to_value(c).unwrap_or(serde_json::Value::Null)
}

/// Where in the re-driven journal the `n`-th provider call was emitted.
fn redriven_call_entry(redriven: &[JournalEntry], n: usize) -> Option<&JournalEntry> {
    redriven
        .iter()
        .flat_map(|e| {
            e.commands
                .iter()
                .filter(|c| command_key(c).is_some())
                .map(move |_| e)
        })
        .nth(n)
}

pub(super) fn call_divergence(
    entries: &[JournalEntry],
    redriven: &[JournalEntry],
    st: &ReplayState,
) -> Option<Divergence> {
    let n = match st.mismatch {
        Some(n) => n,
        None if st.next < st.expected.len() => st.next,
        None => return None,
    };
    match (st.expected.get(n), st.received.get(n)) {
        (Some(exp), Some(got)) => {
            let e = &entries[exp.entry];
            let detail = if exp.call.name() == got.name() {
                format!(
                    "provider call {} differs: the engine now calls {} with other arguments",
                    n + 1,
                    got.name()
                )
            } else {
                format!(
                    "provider call {}: the recording called {} here, the engine now calls {}",
                    n + 1,
                    exp.call.name(),
                    got.name()
                )
            };
            Some(
                Divergence::at_entry(e, DivergenceKind::ProviderCall, detail)
                    .with_diffs(diff::diff("call", &call_json(&exp.call), &call_json(got))),
            )
        }
        (Some(exp), None) => {
            let e = &entries[exp.entry];
            Some(
                Divergence::at_entry(
                    e,
                    DivergenceKind::ProviderCall,
                    format!(
                        "provider call {}: the recording called {} here, the engine never did",
                        n + 1,
                        exp.call.name()
                    ),
                )
                .with_diffs((
                    vec![diff::FieldDiff {
                        path: "call".into(),
                        recorded: Some(call_json(&exp.call)),
                        recomputed: None,
                    }],
                    1,
                )),
            )
        }
        (None, Some(got)) => {
            let at = redriven_call_entry(redriven, n)
                .or(entries.last())
                .expect("a journal with a call has entries");
            Some(
                Divergence::at_entry(
                    at,
                    DivergenceKind::ProviderCall,
                    format!(
                        "provider call {}: the engine now calls {} (at its entry #{}), the recording made no more calls",
                        n + 1,
                        got.name(),
                        at.task_seq
                    ),
                )
                .with_diffs((
                    vec![diff::FieldDiff {
                        path: "call".into(),
                        recorded: None,
                        recomputed: Some(call_json(got)),
                    }],
                    1,
                )),
            )
        }
        (None, None) => None,
    }
}

pub(super) fn replies_of(entries: &[JournalEntry]) -> Vec<(&JournalEntry, &Command)> {
    entries
        .iter()
        .flat_map(|e| {
            e.commands
                .iter()
                .filter(|c| matches!(c, Command::Reply { .. }))
                .map(move |c| (e, c))
        })
        .collect()
}

pub(super) fn reply_divergence(
    entries: &[JournalEntry],
    redriven: &[JournalEntry],
) -> Option<Divergence> {
    let recorded = replies_of(entries);
    let again = replies_of(redriven);
    for i in 0..recorded.len().max(again.len()) {
        let (r, a) = (recorded.get(i), again.get(i));
        if r.map(|x| x.1) == a.map(|x| x.1) {
            continue;
        }
        let at = r.or(a).map(|x| x.0).expect("one side has reply i");
        let json = |c: Option<&(&JournalEntry, &Command)>| {
            c.map(|(_, c)| serde_json::to_value(c).unwrap_or(serde_json::Value::Null))
        };
        let (rj, aj) = (json(r), json(a));
        let diffs = match (&rj, &aj) {
            (Some(x), Some(y)) => diff::diff("reply", x, y),
            _ => (
                vec![diff::FieldDiff {
                    path: "reply".into(),
                    recorded: rj.clone(),
                    recomputed: aj.clone(),
                }],
                1,
            ),
        };
        let detail = match (r, a) {
            (Some(_), Some(_)) => format!("reply {} to a caller differs", i + 1),
            (Some(_), None) => format!(
                "the recording answered a caller here (reply {}), the engine never did",
                i + 1
            ),
            _ => format!(
                "the engine now answers a caller (reply {}) the recording did not",
                i + 1
            ),
        };
        return Some(Divergence::at_entry(at, DivergenceKind::Reply, detail).with_diffs(diffs));
    }
    None
}

pub(super) fn final_state_divergence(
    entries: &[JournalEntry],
    redriven: &[JournalEntry],
) -> Option<Divergence> {
    let last = entries.last()?;
    let now: Option<TaskState> = redriven.last().map(|e| e.state_after);
    if now == Some(last.state_after) {
        return None;
    }
    Some(
        Divergence::at_entry(
            last,
            DivergenceKind::FinalState,
            "the re-driven task ends in another state than the recording",
        )
        .with_diffs((
            vec![diff::FieldDiff {
                path: "state".into(),
                recorded: Some(serde_json::json!(last.state_after)),
                recomputed: now.map(|s| serde_json::json!(s)),
            }],
            1,
        )),
    )
}
