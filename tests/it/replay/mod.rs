//! Replay, one concern a file: golden journals recorded from real runs replay and re-drive
//! cleanly (`golden`); hand-edited journals are caught at the right entry (`divergence`); broken
//! files are clear errors naming the line (`files`); the `replay` and `export` commands exit on
//! purpose and round-trip without secrets (`cli`); the timeline picture is well-formed and marks
//! what happened (`timeline`). The golden journals and the helpers they share live here.

mod cli;
mod divergence;
mod files;
mod golden;
mod timeline;

use std::path::{Path, PathBuf};

use crate::support::tid;
use taskbox::core::{step, Event, Task, TaskState, Transition};
use taskbox::replay::export::{self, JournalFile};
use taskbox::store::JournalEntry;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn golden(name: &str) -> JournalFile {
    let path = golden_dir().join(format!("{name}.jsonl"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    export::read_journal(std::io::BufReader::new(file))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn golden_text(name: &str) -> String {
    std::fs::read_to_string(golden_dir().join(format!("{name}.jsonl"))).expect("golden file")
}

/// Writes entries as an exported journal into `dir`.
fn write_file(dir: &Path, name: &str, entries: &[JournalEntry]) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).expect("create");
    export::write_journal(&mut f, entries, "test-installation", 1_700_000_000_000).expect("write");
    path
}

/// Rebuilds every recorded transition from the events and their times alone (what a consistent
/// journal with these events would say), renumbering the entries.
fn refold(mut entries: Vec<JournalEntry>) -> Vec<JournalEntry> {
    let mut task: Option<Task> = None;
    for (i, e) in entries.iter_mut().enumerate() {
        e.task_seq = i as u64 + 1;
        e.seq = i as u64 + 1;
        let (before, tr) = match &task {
            None => {
                let Event::SettingsChanged { settings } = &e.event else {
                    panic!("a journal starts with settings_changed");
                };
                let next = Task::new(tid(&e.task_id), settings.clone(), e.at);
                (
                    TaskState::Idle,
                    Transition {
                        next,
                        commands: Vec::new(),
                    },
                )
            }
            Some(t) => (
                t.state,
                step(t, e.event.clone(), e.at).expect("step accepts the event"),
            ),
        };
        e.state_before = before;
        e.state_after = tr.next.state;
        e.commands = tr.commands;
        e.task_after = tr.next.clone();
        task = Some(tr.next);
    }
    entries
}
