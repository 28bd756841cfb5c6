//! What the recording says should happen: the journal split into orchestrator [`Session`]s (one
//! per process), and every provider call it made paired with the outcome it got ([`Expected`]).

use crate::core::{Event, Millis, TaskSettings};
use crate::ids::TaskId;
use crate::provider::{Call, ReceivedCall};
use crate::store::JournalEntry;

use super::call::{command_key, outcome_key, Key};
use super::RedriveError;

/// A call the recording made, and the outcome it got (if the journal has one).
#[derive(Debug, Clone)]
pub(super) struct Expected {
    pub(super) call: ReceivedCall,
    pub(super) key: Key,
    /// Index of the entry that emitted the command.
    pub(super) entry: usize,
    /// When and what the provider answered.
    pub(super) answer: Option<(Millis, Event)>,
}

/// The entries one process committed (as far as the journal tells).
#[derive(Debug, Clone)]
pub(super) struct Session {
    pub(super) first: usize,
    pub(super) last: usize,
    pub(super) settings: TaskSettings,
    pub(super) requests: Vec<usize>,
}

fn is_load_marker(e: &JournalEntry) -> bool {
    matches!(
        e.event,
        Event::Loaded | Event::Recovered | Event::SettingsChanged { .. }
    )
}

/// Splits the journal into sessions and pairs each recorded call with its outcome.
pub(super) fn plan(
    installation_id: &str,
    task_id: &TaskId,
    entries: &[JournalEntry],
) -> Result<(Vec<Session>, Vec<Expected>), RedriveError> {
    let unsupported = |why: String| RedriveError::Unsupported {
        task: task_id.clone(),
        why,
    };
    let Some(first) = entries.first() else {
        return Err(unsupported("the journal is empty".into()));
    };
    let Event::SettingsChanged { settings } = &first.event else {
        return Err(unsupported(format!(
            "entry #{} is {}, not the task's creation (run `taskbox replay` without --redrive to see why)",
            first.task_seq,
            first.event.name()
        )));
    };
    // A fork spans two tasks (the parent's request names the snapshot, the child starts from
    // it, a release depends on who else retains it): the re-drive drives one task alone.
    if let Some(e) = entries.iter().find(|e| {
        matches!(
            e.event,
            Event::ForkRequested { .. } | Event::Forked { .. } | Event::SnapshotReleased { .. }
        )
    }) {
        return Err(unsupported(format!(
            "entry #{} ({}) involves another task (a fork), and the re-drive drives one task \
             alone; `taskbox replay` without --redrive checks the journal",
            e.task_seq,
            e.event.name()
        )));
    }
    let mut sessions: Vec<Session> = vec![Session {
        first: 0,
        last: 0,
        settings: settings.clone(),
        requests: Vec::new(),
    }];
    for (i, e) in entries.iter().enumerate().skip(1) {
        if is_load_marker(e) && !is_load_marker(&entries[i - 1]) {
            sessions.push(Session {
                first: i,
                last: i,
                settings: entries[i - 1].task_after.settings.clone(),
                requests: Vec::new(),
            });
        }
        let s = sessions
            .last_mut()
            .expect("there is always a first session");
        s.last = i;
        match &e.event {
            Event::SettingsChanged { settings } => s.settings = settings.clone(),
            Event::RunRequested { .. }
            | Event::SuspendRequested { .. }
            | Event::ResumeRequested { .. } => s.requests.push(i),
            _ => {}
        }
    }
    if let Some(s) = sessions
        .iter()
        .find(|s| s.requests.is_empty() && s.first > 0)
    {
        return Err(unsupported(format!(
            "entries #{}–#{} were committed by a process that made no request, and the \
             re-drive can only load a task through a request",
            entries[s.first].task_seq, entries[s.last].task_seq
        )));
    }
    let mut expected: Vec<Expected> = Vec::new();
    for s in &sessions {
        let open_from = expected.len();
        for (i, e) in entries.iter().enumerate().take(s.last + 1).skip(s.first) {
            if let Some(key) = outcome_key(&e.event) {
                let slot = expected[open_from..]
                    .iter_mut()
                    .find(|x| x.answer.is_none() && x.key == key);
                match slot {
                    Some(x) => x.answer = Some((e.at, e.event.clone())),
                    None => {
                        return Err(unsupported(format!(
                        "entry #{} ({}) answers no provider call made earlier by the same process",
                        e.task_seq,
                        e.event.name()
                    )))
                    }
                }
            }
            for c in &e.commands {
                if let (Some(call), Some(key)) = (
                    Call::from_command(installation_id, task_id, c),
                    command_key(c),
                ) {
                    expected.push(Expected {
                        call: call.received(),
                        key,
                        entry: i,
                        answer: None,
                    });
                }
            }
        }
    }
    Ok((sessions, expected))
}
