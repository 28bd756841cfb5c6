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

    fn write(task_seq: u64, token: i64, owner: &str) -> FencedWrite {
        FencedWrite {
            task_id: "t".into(),
            task_seq,
            token,
            owner: owner.into(),
        }
    }

    #[test]
    fn a_takeover_is_clean_and_a_stale_or_unfenced_or_shared_write_is_not() {
        let entries: Vec<_> = (1..=4).map(entry).collect();
        let clean = [
            write(1, 5, "a"),
            write(2, 5, "a"),
            write(3, 9, "b"),
            write(4, 9, "b"),
        ];
        assert_eq!(one_writer_per_token(&entries, &clean), []);

        // A stale owner writes after the takeover.
        let stale = [
            write(1, 5, "a"),
            write(2, 9, "b"),
            write(3, 5, "a"),
            write(4, 9, "b"),
        ];
        let v = one_writer_per_token(&entries, &stale);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].invariant, Invariant::OneWriterPerToken);
        assert!(
            v[0].detail.contains("entry 3 was written at token 5 by a"),
            "{v:?}"
        );

        // Two writers at one token.
        let shared = [
            write(1, 5, "a"),
            write(2, 5, "b"),
            write(3, 6, "b"),
            write(4, 6, "b"),
        ];
        let v = one_writer_per_token(&entries, &shared);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].detail.contains("which a wrote at too"), "{v:?}");

        // An entry nobody fenced.
        let v = one_writer_per_token(&entries, &clean[..3]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].detail.contains("entry 4"), "{v:?}");
        assert!(
            v[0].detail.contains("without a lease's fencing token"),
            "{v:?}"
        );
    }
}
