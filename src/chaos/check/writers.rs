//! **one-writer-per-token** (`taskbox chaos --fleet`): on a store many engines share, every
//! journal entry was written under a lease's fencing token, one writer wrote at any token, and
//! no entry was written with a token older than one an earlier entry of the task carried — a
//! stale writer (a crashed, paused or partitioned owner) never wrote after a takeover.

use std::collections::BTreeMap;

use super::{Invariant, Violation};
use crate::store::JournalEntry;

/// Who wrote one journal entry: the fencing token its commit carried and the lease's owner at
/// that token (the PostgreSQL store's `journal_writers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedWrite {
    /// The task.
    pub task_id: String,
    /// The entry's place in the task's journal.
    pub task_seq: u64,
    /// The token.
    pub token: i64,
    /// The writer.
    pub owner: String,
}

/// Checks `entries` (every task's journal) against `writes`: every entry has a write, one
/// owner per token, and tokens never go back within a task.
pub fn one_writer_per_token(entries: &[JournalEntry], writes: &[FencedWrite]) -> Vec<Violation> {
    let mut out = Vec::new();
    let by_entry: BTreeMap<(&str, u64), &FencedWrite> = writes
        .iter()
        .map(|w| ((w.task_id.as_str(), w.task_seq), w))
        .collect();
    let mut per_task: BTreeMap<&str, Vec<&JournalEntry>> = BTreeMap::new();
    for e in entries {
        per_task.entry(e.task_id.as_str()).or_default().push(e);
    }
    for (task, mut list) in per_task {
        list.sort_by_key(|e| e.task_seq);
        // The newest token seen so far, and the entry that carried it.
        let mut newest: Option<(i64, u64, &str)> = None;
        let mut writers: BTreeMap<i64, &str> = BTreeMap::new();
        for e in list {
            let Some(w) = by_entry.get(&(task, e.task_seq)) else {
                out.push(Violation::new(
                    Invariant::OneWriterPerToken,
                    Some(task),
                    format!(
                        "entry {} ({}) was written without a lease's fencing token",
                        e.task_seq,
                        e.event.name()
                    ),
                ));
                continue;
            };
            match writers.get(&w.token) {
                Some(first) if *first != w.owner => out.push(Violation::new(
                    Invariant::OneWriterPerToken,
                    Some(task),
                    format!(
                        "entry {} was written at token {} by {}, which {first} wrote at too",
                        e.task_seq, w.token, w.owner
                    ),
                )),
                Some(_) => {}
                None => {
                    writers.insert(w.token, &w.owner);
                }
            }
            match newest {
                Some((token, seq, owner)) if w.token < token => out.push(Violation::new(
                    Invariant::OneWriterPerToken,
                    Some(task),
                    format!(
                        "entry {} was written at token {} by {} after entry {seq} at the newer \
                         token {token} by {owner}: a stale owner wrote after a takeover",
                        e.task_seq, w.token, w.owner
                    ),
                )),
                Some((token, _, _)) if w.token == token => {}
                _ => newest = Some((w.token, e.task_seq, &w.owner)),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Event, Task, TaskSettings, TaskState};
    use crate::ids::TaskId;

    fn entry(task_seq: u64) -> JournalEntry {
        let id = TaskId::new("t").expect("id");
        JournalEntry {
            seq: task_seq,
            task_id: id.clone(),
            task_seq,
            at: 0,
            event: Event::SuspendRequested { request_id: 1 },
            state_before: TaskState::Idle,
            state_after: TaskState::Idle,
            commands: Vec::new(),
            task_after: Task::new(id, TaskSettings::default(), 0),
        }
    }

    /// The writes of entries 1, 2, …, each at its `(token, owner)`.
    fn writes(by: &[(i64, &str)]) -> Vec<FencedWrite> {
        (1..)
            .zip(by)
            .map(|(task_seq, &(token, owner))| FencedWrite {
                task_id: "t".into(),
                task_seq,
                token,
                owner: owner.into(),
            })
            .collect()
    }

    /// The one violation of `ws` over `entries`, and that it is one-writer-per-token's.
    fn only_violation(entries: &[JournalEntry], ws: &[FencedWrite]) -> String {
        let v = one_writer_per_token(entries, ws);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].invariant, Invariant::OneWriterPerToken);
        v[0].detail.clone()
    }

    #[test]
    fn a_takeover_is_clean_and_a_stale_or_unfenced_or_shared_write_is_not() {
        let entries: Vec<_> = (1..=4).map(entry).collect();
        let clean = writes(&[(5, "a"), (5, "a"), (9, "b"), (9, "b")]);
        assert_eq!(one_writer_per_token(&entries, &clean), []);

        // A stale owner writes after the takeover.
        let stale = writes(&[(5, "a"), (9, "b"), (5, "a"), (9, "b")]);
        let detail = only_violation(&entries, &stale);
        assert!(
            detail.contains("entry 3 was written at token 5 by a"),
            "{detail}"
        );

        // Two writers at one token.
        let shared = writes(&[(5, "a"), (5, "b"), (6, "b"), (6, "b")]);
        let detail = only_violation(&entries, &shared);
        assert!(detail.contains("which a wrote at too"), "{detail}");

        // An entry nobody fenced.
        let detail = only_violation(&entries, &clean[..3]);
        assert!(detail.contains("entry 4"), "{detail}");
        assert!(
            detail.contains("without a lease's fencing token"),
            "{detail}"
        );
    }
}
