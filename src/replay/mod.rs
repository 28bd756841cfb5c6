//! Replay: rebuild, verify and show what happened to a task, from its journal alone.
//!
//! The journal ([`JournalEntry`]) records, for every transition, the event, the state before and
//! after, the commands emitted and the whole task after. Because the core is a pure function,
//! folding the events through [`step`] again must reproduce every recorded transition exactly;
//! [`verify`] does that and names the first entry where the record and today's code part ways.
//! It is the same idea as Temporal's workflow replayer: "would today's code make the same
//! decisions?" answered from history, without touching a sandbox.
//!
//! - [`verify`]: the pure check (no I/O), used by `taskbox replay` and the chaos runner.
//! - [`export`]: the versioned, self-describing JSONL journal file (`taskbox export`), which
//!   carries a journal to another machine; secrets are redacted on the way out ([`redact`]).
//! - [`redrive`]: runs the real event loop again against a provider that answers with the
//!   recorded outcomes, on virtual time, and checks it makes the same provider calls and replies.
//! - [`timeline`]: a table and an SVG/HTML picture of a task's life (`--timeline`).

pub mod diff;
pub mod export;
pub mod redact;
// Runs the engine on tokio's paused clock (a `ReplayClock` of its own), and names its scratch
// directory after the wall clock; without `virtual-time` there is no paused clock to run on.
#[cfg(feature = "virtual-time")]
#[allow(clippy::disallowed_methods)]
pub mod redrive;
pub mod timeline;

use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::clock::format_ms;
use crate::core::{step, Event, Millis, Task, TaskState, Transition};
use crate::ids::TaskId;
use crate::store::JournalEntry;

pub use diff::FieldDiff;

/// The outcome of verifying one or more tasks' journals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// One result per task, in the order the tasks first appear in the entries.
    pub tasks: Vec<TaskVerdict>,
}

impl Verdict {
    /// Whether every task replayed without a divergence.
    pub fn is_clean(&self) -> bool {
        self.tasks.iter().all(|t| t.divergence.is_none())
    }

    /// Every divergence (at most one per task: checking a task stops at its first).
    pub fn divergences(&self) -> impl Iterator<Item = &Divergence> {
        self.tasks.iter().filter_map(|t| t.divergence.as_ref())
    }
}

/// The outcome of verifying one task's journal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskVerdict {
    /// The task.
    pub task_id: TaskId,
    /// Journal entries given for it.
    pub entries: usize,
    /// Entries that replayed exactly before the first divergence (all of them when clean).
    pub replayed: usize,
    /// The task's state after the last entry that replayed.
    pub final_state: Option<TaskState>,
    /// The first place where the record and the recomputation part ways.
    pub divergence: Option<Divergence>,
}

/// What kind of disagreement a [`Divergence`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DivergenceKind {
    /// The first entry is not the task's creation (`settings_changed` from `idle` with a new
    /// task after it).
    Start,
    /// An entry is missing, repeated or out of order (its task sequence number is not the next).
    Sequence,
    /// `step` refuses the recorded event in the recomputed state.
    Refused,
    /// `step` accepts the event but computes a different transition than was recorded.
    Transition,
    /// Re-drive: the engine made a different provider call than the recording (or one too many,
    /// or one too few).
    ProviderCall,
    /// Re-drive: the engine answered a caller differently than the recording.
    Reply,
    /// Re-drive: the task ended in a different state than the recording.
    FinalState,
}

/// The first entry of a task's journal where the record and today's code disagree.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Divergence {
    /// The task.
    pub task_id: TaskId,
    /// The entry's sequence number within the task (1, 2, 3…). For a [`DivergenceKind::Sequence`]
    /// divergence, the first number that is missing or out of place; `seq`, `at` and `event`
    /// then describe the entry found in its place.
    pub task_seq: u64,
    /// The entry's global journal sequence number.
    pub seq: u64,
    /// When the entry was recorded.
    pub at: Millis,
    /// The recorded event's name (`snapshot_taken`, ...).
    pub event: String,
    /// What kind of disagreement.
    pub kind: DivergenceKind,
    /// One sentence saying what differs.
    pub detail: String,
    /// The differing fields, recorded vs recomputed (at most [`diff::MAX_FIELD_DIFFS`]).
    pub diffs: Vec<FieldDiff>,
    /// How many fields differ in all (may exceed `diffs.len()`).
    pub differing_fields: usize,
}

impl Divergence {
    fn at_entry(e: &JournalEntry, kind: DivergenceKind, detail: impl Into<String>) -> Divergence {
        Divergence {
            task_id: e.task_id.clone(),
            task_seq: e.task_seq,
            seq: e.seq,
            at: e.at,
            event: e.event.name().to_string(),
            kind,
            detail: detail.into(),
            diffs: Vec::new(),
            differing_fields: 0,
        }
    }

    fn with_diffs(mut self, (diffs, total): (Vec<FieldDiff>, usize)) -> Divergence {
        self.diffs = diffs;
        self.differing_fields = total;
        self
    }
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "task {} diverges at entry #{} ({}, event {}): {}",
            self.task_id,
            self.task_seq,
            format_ms(self.at),
            self.event,
            self.detail
        )?;
        for d in &self.diffs {
            writeln!(f, "    {}", d.line())?;
        }
        if self.differing_fields > self.diffs.len() {
            writeln!(
                f,
                "    … and {} more differing fields",
                self.differing_fields - self.diffs.len()
            )?;
        }
        Ok(())
    }
}

/// Checks journal entries against the pure core: for each task (entries may mix tasks; each
/// task's entries must be in their recorded order), folds its events through [`step`] from the
/// creation entry and compares every recorded transition — state before and after, commands,
/// task after — with what `step` computes now. Stops at a task's first divergence.
///
/// Pure: no I/O, no clock. Entries of a task are never re-sorted, so a reordered journal is
/// caught rather than silently repaired.
pub fn verify(entries: &[JournalEntry]) -> Verdict {
    Verdict {
        tasks: group_by_task(entries)
            .into_iter()
            .map(|(id, es)| verify_task(&id, &es))
            .collect(),
    }
}

/// Splits entries by task, keeping each task's entries in the order given and the tasks in the
/// order they first appear.
pub fn group_by_task(entries: &[JournalEntry]) -> Vec<(TaskId, Vec<&JournalEntry>)> {
    let mut groups: Vec<(TaskId, Vec<&JournalEntry>)> = Vec::new();
    for e in entries {
        match groups.iter_mut().find(|(id, _)| *id == e.task_id) {
            Some((_, es)) => es.push(e),
            None => groups.push((e.task_id.clone(), vec![e])),
        }
    }
    groups
}

fn verify_task(task_id: &TaskId, entries: &[&JournalEntry]) -> TaskVerdict {
    let mut verdict = TaskVerdict {
        task_id: task_id.clone(),
        entries: entries.len(),
        replayed: 0,
        final_state: None,
        divergence: None,
    };
    let mut task: Option<Task> = None;
    let mut last_seq: Option<u64> = None;
    for (i, e) in entries.iter().enumerate() {
        let result = check_order(entries, i, last_seq).and_then(|()| match &task {
            None => check_creation(e),
            Some(t) => check_step(t, e),
        });
        match result {
            Ok(next) => {
                verdict.replayed += 1;
                verdict.final_state = Some(next.state);
                task = Some(next);
                last_seq = Some(e.seq);
            }
            Err(d) => {
                verdict.divergence = Some(*d);
                break;
            }
        }
    }
    verdict
}

/// Entry `i` must be the task's entry #`i + 1`, and global sequence numbers must grow. A
/// sequence divergence names the first number that is out of place (`task_seq`), with the entry
/// found in its place.
fn check_order(
    entries: &[&JournalEntry],
    i: usize,
    last_seq: Option<u64>,
) -> Result<(), Box<Divergence>> {
    let e = entries[i];
    let expected = i as u64 + 1;
    if e.task_seq != expected {
        let later = entries[i + 1..].iter().any(|x| x.task_seq == expected);
        let detail = if later {
            format!(
                "entries are out of order: #{} comes where #{expected} belongs, and #{expected} comes later",
                e.task_seq
            )
        } else if e.task_seq > expected {
            format!(
                "entry #{expected} is missing: the journal goes from #{} to #{}",
                expected - 1,
                e.task_seq
            )
        } else {
            format!(
                "entry #{} comes again where #{expected} belongs",
                e.task_seq
            )
        };
        let mut d = Divergence::at_entry(e, DivergenceKind::Sequence, detail);
        d.task_seq = expected;
        return Err(Box::new(d));
    }
    if let Some(prev) = last_seq {
        if e.seq <= prev {
            return Err(Box::new(Divergence::at_entry(
                e,
                DivergenceKind::Sequence,
                format!(
                    "its global sequence number {} does not follow the previous entry's {prev}",
                    e.seq
                ),
            )));
        }
    }
    Ok(())
}

/// The first entry must create the task: `settings_changed` from `idle`, no commands, and a
/// brand-new task with those settings after it (see the engine's `ensure_loaded`).
fn check_creation(e: &JournalEntry) -> Result<Task, Box<Divergence>> {
    let Event::SettingsChanged { settings } = &e.event else {
        return Err(Box::new(Divergence::at_entry(
            e,
            DivergenceKind::Start,
            format!(
                "a task's journal starts with its creation (settings_changed), not {}",
                e.event.name()
            ),
        )));
    };
    let id = TaskId::new(&e.task_id).map_err(|err| {
        Box::new(Divergence::at_entry(
            e,
            DivergenceKind::Start,
            err.to_string(),
        ))
    })?;
    let created = Task::new(id, settings.clone(), e.at);
    let expected = Transition {
        next: created,
        commands: Vec::new(),
    };
    compare(e, TaskState::Idle, &expected).map_err(|diffs| {
        Box::new(
            Divergence::at_entry(
                e,
                DivergenceKind::Start,
                "the creation entry does not hold a new task with the recorded settings",
            )
            .with_diffs(diffs),
        )
    })?;
    Ok(expected.next)
}

fn check_step(before: &Task, e: &JournalEntry) -> Result<Task, Box<Divergence>> {
    let tr = step(before, e.event.clone(), e.at).map_err(|err| {
        Box::new(Divergence::at_entry(
            e,
            DivergenceKind::Refused,
            format!(
                "step refuses the recorded event in state {}: {err}",
                before.state
            ),
        ))
    })?;
    compare(e, before.state, &tr).map_err(|diffs| {
        let what = if diffs.0.iter().any(|d| d.path.starts_with("state_")) {
            "the recorded state change is not what step computes now"
        } else if diffs.0.iter().any(|d| d.path.starts_with("commands")) {
            "the recorded commands are not what step computes now"
        } else {
            "the recorded task after the event is not what step computes now"
        };
        Box::new(Divergence::at_entry(e, DivergenceKind::Transition, what).with_diffs(diffs))
    })?;
    Ok(tr.next)
}

/// Compares a recorded transition with a recomputed one; `Err` holds the differing fields.
fn compare(
    e: &JournalEntry,
    state_before: TaskState,
    tr: &Transition,
) -> Result<(), (Vec<FieldDiff>, usize)> {
    let same = e.state_before == state_before
        && e.state_after == tr.next.state
        && e.commands == tr.commands
        && e.task_after == tr.next;
    if same {
        return Ok(());
    }
    let recorded = transition_json(e.state_before, e.state_after, &e.commands, &e.task_after);
    let recomputed = transition_json(state_before, tr.next.state, &tr.commands, &tr.next);
    let diffs = diff::diff("", &recorded, &recomputed);
    if diffs.1 == 0 {
        // Equal as JSON but not as values can only mean a serialisation that loses
        // information; say so rather than report a divergence without a field.
        return Err((
            vec![FieldDiff {
                path: "(transition)".into(),
                recorded: None,
                recomputed: None,
            }],
            1,
        ));
    }
    Err(diffs)
}

fn transition_json(
    state_before: TaskState,
    state_after: TaskState,
    commands: &[crate::core::Command],
    task_after: &Task,
) -> Value {
    serde_json::json!({
        "state_before": state_before,
        "state_after": state_after,
        "commands": commands,
        "task_after": task_after,
    })
}
