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
    // A fork spans tasks; the others' part is given (see `lineage`): a child's creation as a
    // fork is committed before the first session, and only there can it be.
    let lineage = super::lineage::lineage_len(entries);
    if let Some((i, e)) = entries
        .iter()
        .enumerate()
        .find(|(i, e)| *i >= lineage && matches!(e.event, Event::Forked { .. }))
    {
        return Err(unsupported(format!(
            "entry #{} (forked) is not the second entry of the task, where a fork's lineage \
             begins (entry {})",
            e.task_seq,
            i + 1
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
            | Event::ResumeRequested { .. }
            | Event::ForkRequested { .. }
            | Event::CheckpointRequested { .. }
            | Event::RewindRequested { .. } => s.requests.push(i),
            _ => {}
        }
    }
    // A later process that made no request of the task only loaded it (a request that failed
    // before it was journaled, such as a fork to a name in use; a server loading the tasks
    // with live sandboxes at start): the re-drive loads it the same way.
    let mut expected: Vec<Expected> = Vec::new();
    for s in &sessions {
        let open_from = expected.len();
        for (i, e) in entries.iter().enumerate().take(s.last + 1).skip(s.first) {
            if let Some(key) = outcome_key(&e.event) {
                let slot = expected[open_from..]
                    .iter()
                    .position(|x| x.answer.is_none() && x.key == key)
                    .map(|k| open_from + k);
                match slot {
                    // Released because another task retained the snapshot: the engine answered
                    // the delete itself, and the provider never saw a call.
                    Some(k) if matches!(e.event, Event::SnapshotReleased { .. }) => {
                        expected.remove(k);
                    }
                    Some(k) => expected[k].answer = Some((e.at, e.event.clone())),
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
