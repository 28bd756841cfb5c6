//! Archives of another installation under this root: what a store that is new while archives
//! exist (its database removed or moved aside) finds, says, and offers to do with them.
//!
//! Such archives are never restored or deleted by this installation on their own (snapshot ids
//! carry a nonce and gc lists by installation). On the first open of a new installation over a
//! root that holds them, [`LocalProvider::new`](super::LocalProvider::new) records a note
//! (`foreign-archives.json`) that the CLI prints once ([`take_note`]); `taskbox doctor` lists
//! them ([`scan`]) and offers to [`adopt`] them (each task this store does not know starts its
//! first sandbox from its newest archive, `adopt/<task>`) or to [`ignore`] them
//! (`ignored-installations`: no more notes; the files stay on disk).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::LocalError;
use super::fsutil::write_synced;
use super::names::SnapshotRef;
use super::snapshot::{archives, Unreadable};
use crate::ids::TaskId;

/// The installation that last opened this root.
const INSTALLATION_FILE: &str = "installation";
/// The pending note about archives of another installation.
const NOTE_FILE: &str = "foreign-archives.json";
/// Installations whose archives the user chose to ignore, one per line.
const IGNORED_FILE: &str = "ignored-installations";
/// Adoptions waiting for their task's first sandbox: `adopt/<task>` holds a snapshot id.
pub(super) const ADOPT_DIR: &str = "adopt";

pub use crate::provider::registry::ForeignTask;

/// The note [`LocalProvider::new`](super::LocalProvider::new) leaves for the CLI.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Note {
    installation_id: String,
    tasks: Vec<ForeignTask>,
}

/// The tasks with archives of installations other than `installation_id` (and not ignored),
/// each with its newest archive, in task order.
pub fn scan(root: &Path, installation_id: &str) -> Result<Vec<ForeignTask>, LocalError> {
    let ignored = ignored(root)?;
    let mut found: BTreeMap<(String, String), ForeignTask> = BTreeMap::new();
    archives(root, Unreadable::Skip, |task, snap, header| {
        let Ok(header) = header else {
            return;
        };
        if header.installation_id == installation_id
            || ignored.contains(&header.installation_id)
            || header.task_id != task.as_str()
        {
            return;
        }
        let key = (task.to_string(), header.installation_id.clone());
        let entry = found.entry(key).or_insert_with(|| ForeignTask {
            task_id: task.to_string(),
            installation_id: header.installation_id.clone(),
            snapshot_id: snap.id(),
            created_at: header.created_at,
            archives: 0,
        });
        entry.archives += 1;
        if header.created_at >= entry.created_at {
            entry.created_at = header.created_at;
            entry.snapshot_id = snap.id();
        }
    })?;
    Ok(found.into_values().collect())
}

/// Called when a provider opens `root` for `installation_id`: the first time an installation
/// does, if archives of other installations are there, it leaves a note for the CLI.
pub(super) fn on_open(root: &Path, installation_id: &str) -> Result<(), LocalError> {
    let marker = root.join(INSTALLATION_FILE);
    match fs::read_to_string(&marker) {
        Ok(last) if last.trim() == installation_id => return Ok(()),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(LocalError::io("read", &marker)(e)),
    }
    let tasks = scan(root, installation_id)?;
    if !tasks.is_empty() {
        tracing::info!(tasks = tasks.len(),
            "snapshot archives of another installation found (was the store reset?); see `taskbox doctor`");
        let note = Note {
            installation_id: installation_id.to_string(),
            tasks,
        };
        let bytes = serde_json::to_vec_pretty(&note).expect("a note always serialises");
        write_synced(&root.join(NOTE_FILE), &bytes)?;
    }
    write_synced(&marker, installation_id.as_bytes())
}

/// The note about archives of another installation, once: the text to print, and the note is
/// gone afterwards. `None` when there is none (or it is for another installation).
pub fn take_note(root: &Path) -> Option<String> {
    let path = root.join(NOTE_FILE);
    let note: Note = serde_json::from_slice(&fs::read(&path).ok()?).ok()?;
    fs::remove_file(&path).ok()?;
    let mut tasks: Vec<&str> = note.tasks.iter().map(|t| t.task_id.as_str()).collect();
    tasks.dedup();
    Some(format!(
        "this store is new, but {} has snapshot archives of another installation (tasks: {}); \
         they are kept and never used by this store. `taskbox doctor` lists them and offers to \
         adopt them (`taskbox doctor --adopt-archives`) or ignore them (`--ignore-archives`)",
        root.join("snapshots").display(),
        tasks.join(", ")
    ))
}

/// The installations whose archives are ignored.
fn ignored(root: &Path) -> Result<Vec<String>, LocalError> {
    let path = root.join(IGNORED_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => Ok(text.lines().map(|l| l.trim().to_string()).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(LocalError::io("read", &path)(e)),
    }
}

/// Stops noting the archives of these tasks' installations; the archives stay on disk.
pub fn ignore(root: &Path, tasks: &[ForeignTask]) -> Result<(), LocalError> {
    let mut all = ignored(root)?;
    for t in tasks {
        if !all.contains(&t.installation_id) {
            all.push(t.installation_id.clone());
        }
    }
    let mut text = all.join("\n");
    text.push('\n');
    write_synced(&root.join(IGNORED_FILE), text.as_bytes())?;
    let _ = fs::remove_file(root.join(NOTE_FILE));
    Ok(())
}

/// Makes the first sandbox of each task in `tasks` start from its newest archive (the caller
/// passes only tasks the store does not know). Returns the adopted tasks.
pub fn adopt(root: &Path, tasks: &[ForeignTask]) -> Result<Vec<ForeignTask>, LocalError> {
    let dir = root.join(ADOPT_DIR);
    fs::create_dir_all(&dir).map_err(LocalError::io("create directory", &dir))?;
    // The newest archive per task, whichever installation left it.
    let mut newest: BTreeMap<&str, &ForeignTask> = BTreeMap::new();
    for t in tasks {
        match newest.get(t.task_id.as_str()) {
            Some(prev) if prev.created_at >= t.created_at => {}
            _ => {
                newest.insert(&t.task_id, t);
            }
        }
    }
    let mut adopted = Vec::new();
    for (task, t) in newest {
        write_synced(&dir.join(task), t.snapshot_id.as_bytes())?;
        adopted.push(t.clone());
    }
    let _ = fs::remove_file(root.join(NOTE_FILE));
    Ok(adopted)
}

/// The archive a task's first sandbox starts from, if it was adopted.
pub(super) fn adopted(root: &Path, task: &TaskId) -> Option<SnapshotRef> {
    let text = fs::read_to_string(root.join(ADOPT_DIR).join(task.as_str())).ok()?;
    SnapshotRef::parse(text.trim())
        .ok()
        .filter(|s| s.task == *task)
}

/// Done with a task's adoption (its first sandbox holds the files now).
pub(super) fn adoption_done(root: &Path, task: &TaskId) {
    let _ = fs::remove_file(root.join(ADOPT_DIR).join(task.as_str()));
}
