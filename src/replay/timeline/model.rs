//! The timeline itself: one [`Timeline`] per task, built from journal entries alone — a [`Row`]
//! per entry, the state [`Band`]s back to back, and the [`Mark`]s a person looks for first.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::core::{
    Command, Event, Failure, FailureKind, FailureReason, Millis, Reply, RequestId, SnapshotReason,
    Task, TaskState, TimerKind,
};
use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::replay::diff::shorten;
use crate::store::JournalEntry;

use super::summary::{clock_time, command_summary, event_summary, fmt_bytes, fmt_dur, kind_name};

/// One task's life.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    /// The task.
    pub task_id: TaskId,
    /// The first entry's time.
    pub start: Millis,
    /// The last entry's time.
    pub end: Millis,
    /// One row per journal entry.
    pub rows: Vec<Row>,
    /// The task's states over time, in order, back to back.
    pub bands: Vec<Band>,
    /// Points (and spans, for commands) worth marking.
    pub marks: Vec<Mark>,
}

/// One journal entry, summarised.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Sequence number within the task.
    pub task_seq: u64,
    /// When.
    pub at: Millis,
    /// State before the event.
    pub state_before: TaskState,
    /// State after it.
    pub state_after: TaskState,
    /// How long the task had been in `state_before` when the event came.
    pub in_state_ms: u64,
    /// The event, with its key fields (`command_exited #3 exit 0`).
    pub event: String,
    /// The commands emitted, summarised (`create_sandbox g2 ← snap-…`).
    pub commands: Vec<String>,
    /// Snapshot ids involved (taken, restored from, deleted, kept).
    pub snapshots: Vec<String>,
    /// A failure reported by the event, or a request answered with a failure.
    pub error: Option<String>,
    /// Attempt count and pending retry of the operation in flight.
    pub retry: Option<String>,
}

impl Row {
    /// The row's notes, in the order both renderings show them: the failure, then the retry.
    pub fn notes(&self) -> Vec<&str> {
        self.error
            .iter()
            .chain(self.retry.iter())
            .map(String::as_str)
            .collect()
    }
}

/// A stretch of time in one state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Band {
    /// The state.
    pub state: TaskState,
    /// From.
    pub from: Millis,
    /// To (the next state's start, or the timeline's end).
    pub to: Millis,
}

/// What a [`Mark`] marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum MarkKind {
    /// A shell command ran (a span from start to exit).
    Command,
    /// A snapshot completed.
    Snapshot,
    /// A sandbox came up restored from a snapshot.
    Restore,
    /// A sandbox expired (deadline, or found gone).
    Expiry,
    /// A provider operation failed.
    Fault,
    /// An operation was retried.
    Retry,
    /// A caller asked to suspend or resume.
    Request,
    /// taskbox restarted and recovered the task.
    Recovery,
}

impl MarkKind {
    /// All kinds, in legend order.
    pub const ALL: [MarkKind; 8] = [
        MarkKind::Command,
        MarkKind::Snapshot,
        MarkKind::Restore,
        MarkKind::Expiry,
        MarkKind::Fault,
        MarkKind::Retry,
        MarkKind::Request,
        MarkKind::Recovery,
    ];

    /// The kind's name (also its CSS class and `data-kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            MarkKind::Command => "command",
            MarkKind::Snapshot => "snapshot",
            MarkKind::Restore => "restore",
            MarkKind::Expiry => "expiry",
            MarkKind::Fault => "fault",
            MarkKind::Retry => "retry",
            MarkKind::Request => "request",
            MarkKind::Recovery => "recovery",
        }
    }
}

/// A point (or, for commands, a span) on a task's timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mark {
    /// What.
    pub kind: MarkKind,
    /// When (a command's start).
    pub at: Millis,
    /// A command's end (`None`: a point, or a command still running when the journal ends).
    pub until: Option<Millis>,
    /// The entry it comes from.
    pub task_seq: u64,
    /// A one-line description (the tooltip).
    pub label: String,
}

/// One timeline per task, in the order the tasks first appear in `entries`.
pub fn build(entries: &[JournalEntry]) -> Vec<Timeline> {
    crate::replay::group_by_task(entries)
        .into_iter()
        .map(|(id, es)| build_task(id, &es))
        .collect()
}

fn build_task(task_id: TaskId, entries: &[&JournalEntry]) -> Timeline {
    let start = entries.first().map_or(0, |e| e.at);
    let end = entries.last().map_or(start, |e| e.at).max(start);
    let mut tl = Timeline {
        task_id,
        start,
        end,
        rows: Vec::new(),
        bands: Vec::new(),
        marks: Vec::new(),
    };
    let mut state = entries.first().map_or(TaskState::Idle, |e| e.state_before);
    let mut entered = start;
    let mut prev_task: Option<&Task> = None;
    // request id -> (start, task_seq, command)
    let mut running: BTreeMap<u64, (Millis, u64, String)> = BTreeMap::new();
    for e in entries {
        let at = e.at.max(entered);
        tl.rows.push(row(e, prev_task, at.saturating_sub(entered)));
        mark_entry(&mut tl.marks, e, prev_task, &mut running);
        if e.state_after != state {
            tl.bands.push(Band {
                state,
                from: entered,
                to: at,
            });
            state = e.state_after;
            entered = at;
        }
        prev_task = Some(&e.task_after);
    }
    tl.bands.push(Band {
        state,
        from: entered,
        to: end,
    });
    for (request_id, (from, task_seq, command)) in running {
        tl.marks.push(Mark {
            kind: MarkKind::Command,
            at: from,
            until: None,
            task_seq,
            label: format!("#{request_id} `{command}` (no result in the journal)"),
        });
    }
    tl.marks.sort_by_key(|m| (m.at, m.task_seq, m.kind));
    tl
}

/// Whether an event was absorbed: a late or duplicate outcome that changed nothing.
fn absorbed(e: &JournalEntry, prev: Option<&Task>) -> bool {
    e.commands.is_empty() && e.state_before == e.state_after && prev == Some(&e.task_after)
}

fn row(e: &JournalEntry, prev: Option<&Task>, in_state_ms: u64) -> Row {
    let mut snapshots = Vec::new();
    let stale = if absorbed(e, prev) {
        " (late answer, absorbed)"
    } else {
        ""
    };
    let facts = Facts::of(&e.event);
    let mut error = failure_of(&e.event).map(|(kind, msg)| format!("{kind}{stale}: {msg}"));
    if let Some(id) = facts.snapshot {
        snapshots.push(id.to_string());
    }
    for c in &e.commands {
        let (snapshot, failed) = command_facts(c);
        if let Some(id) = snapshot {
            snapshots.push(id.to_string());
        }
        if let (Some((request_id, msg)), None) = (failed, &error) {
            error = Some(format!("request #{request_id} failed: {msg}"));
        }
    }
    snapshots.dedup();
    let t = &e.task_after;
    let retry = match (t.retry_at, t.attempts) {
        (Some(r), n) => Some(format!(
            "attempt {n} failed; retry in {}",
            fmt_dur(r.saturating_sub(e.at))
        )),
        (None, n) if n > 1 => Some(format!("attempt {n}")),
        (None, _) => None,
    };
    Row {
        task_seq: e.task_seq,
        at: e.at,
        state_before: e.state_before,
        state_after: e.state_after,
        in_state_ms,
        event: match (&e.event, prev) {
            (Event::SettingsChanged { settings }, Some(p)) => {
                settings_change(&p.settings, settings)
            }
            (Event::SettingsChanged { .. }, None) => "settings_changed (task created)".to_string(),
            (ev, _) => event_summary(ev, e.at),
        },
        commands: e
            .commands
            .iter()
            .map(|c| command_summary(c, e.at))
            .collect(),
        snapshots,
        error,
        retry,
    }
}

/// `settings_changed: persistent false, sandbox timeout 2.0 s` — only what changed.
fn settings_change(old: &crate::core::TaskSettings, new: &crate::core::TaskSettings) -> String {
    let mut parts = Vec::new();
    if old.persistent != new.persistent {
        parts.push(format!("persistent {}", new.persistent));
    }
    let durations = [
        (
            "sandbox timeout",
            old.sandbox_timeout_ms,
            new.sandbox_timeout_ms,
        ),
        ("idle lifetime", old.idle_lifetime_ms, new.idle_lifetime_ms),
        (
            "command timeout",
            old.command_timeout_ms,
            new.command_timeout_ms,
        ),
        (
            "checkpoint margin",
            old.checkpoint_margin_ms,
            new.checkpoint_margin_ms,
        ),
        (
            "max lifetime",
            old.max_sandbox_lifetime_ms,
            new.max_sandbox_lifetime_ms,
        ),
    ];
    for (what, a, b) in durations {
        if a != b {
            parts.push(format!("{what} {}", fmt_dur(b)));
        }
    }
    if old.keep_snapshots != new.keep_snapshots {
        parts.push(format!("keep {} snapshots", new.keep_snapshots));
    }
    if old.retry != new.retry {
        parts.push("retry policy".to_string());
    }
    if parts.is_empty() {
        "settings_changed (same settings)".to_string()
    } else {
        format!("settings_changed: {}", parts.join(", "))
    }
}

fn failure_of(ev: &Event) -> Option<(&'static str, &str)> {
    let f = Facts::of(ev).failure?;
    Some((kind_name(&f.kind), f.message.as_str()))
}

/// What the timeline reads of an event. [`Facts::of`] is the one match over [`Event`], with no
/// wildcard: a new event is sorted here, into what it marks or deliberately into nothing,
/// before it compiles, so it cannot vanish from timelines unseen.
#[derive(Default)]
struct Facts<'a> {
    /// The snapshot it names (taken or deleted), for the row.
    snapshot: Option<&'a SnapshotId>,
    /// The failure it reports.
    failure: Option<&'a Failure>,
    /// Whether its failure, "sandbox gone", means the sandbox died under the task.
    failure_is_death: bool,
    /// A sandbox became ready (a restore, when it takes the task from restoring to running).
    ready: Option<&'a SandboxId>,
    /// A snapshot was taken: its seq, id and size.
    taken: Option<(u64, &'a SnapshotId, u64)>,
    /// A caller's request: its id, and whether it is marked (suspend, resume).
    request: Option<(RequestId, bool)>,
    /// A load or recovery after a (re)start.
    loaded: bool,
    /// The timer that fired.
    timer: Option<TimerKind>,
    /// A probe found the sandbox gone.
    probed_gone: bool,
    /// A command exited: its request, exit code, whether its timeout killed it and whether the
    /// sandbox's memory limit killed a process of it.
    exited: Option<(RequestId, i32, bool, bool)>,
}

impl<'a> Facts<'a> {
    fn of(ev: &'a Event) -> Facts<'a> {
        let none = Facts::default();
        let failed = |failure, failure_is_death| Facts {
            failure: Some(failure),
            failure_is_death,
            ..Facts::default()
        };
        match ev {
            Event::RunRequested { request_id, .. } => Facts {
                request: Some((*request_id, false)),
                ..none
            },
            Event::SuspendRequested { request_id }
            | Event::ResumeRequested { request_id }
            | Event::CheckpointRequested { request_id }
            | Event::RewindRequested { request_id, .. } => Facts {
                request: Some((*request_id, true)),
                ..none
            },
            Event::ForkRequested { .. } | Event::Forked { .. } | Event::SettingsChanged { .. } => {
                none
            }
            Event::SandboxReady { sandbox_id, .. } => Facts {
                ready: Some(sandbox_id),
                ..none
            },
            Event::CommandExited {
                request_id,
                exit_code,
                timed_out,
                memory_killed,
            } => Facts {
                exited: Some((*request_id, *exit_code, *timed_out, *memory_killed)),
                ..none
            },
            Event::CommandFailed { failure, .. }
            | Event::CommandNotStarted { failure, .. }
            | Event::SnapshotFailed { failure, .. } => failed(failure, true),
            Event::CreateFailed { failure, .. }
            | Event::StopFailed { failure, .. }
            | Event::ExtendFailed { failure, .. }
            | Event::DeleteFailed { failure, .. } => failed(failure, false),
            Event::SnapshotTaken {
                seq,
                snapshot_id,
                size_bytes,
                ..
            } => Facts {
                snapshot: Some(snapshot_id),
                taken: Some((*seq, snapshot_id, *size_bytes)),
                ..none
            },
            Event::SnapshotDeleted { snapshot_id } => Facts {
                snapshot: Some(snapshot_id),
                ..none
            },
            // A release, a stop, an extension and a usage reading change no mark; a failed
            // probe is retried and shows in its row.
            Event::SnapshotReleased { .. }
            | Event::SandboxStopped { .. }
            | Event::TimeoutExtended { .. }
            | Event::UsageRead { .. }
            | Event::ActivitySampled { .. }
            | Event::CheckpointUnchanged { .. }
            | Event::ProbeFailed { .. } => none,
            Event::SandboxProbed { alive, .. } => Facts {
                probed_gone: alive.is_none(),
                ..none
            },
            Event::TimerFired { timer } => Facts {
                timer: Some(*timer),
                ..none
            },
            Event::Loaded | Event::Recovered => Facts {
                loaded: true,
                ..none
            },
        }
    }
}

/// What the timeline reads of a command: the snapshot it names (a restore's source, a delete,
/// a suspend's answer) and a failed request's id and reason. One match, no wildcard.
fn command_facts(c: &Command) -> (Option<&SnapshotId>, Option<(RequestId, &FailureReason)>) {
    match c {
        Command::CreateSandbox {
            source_snapshot, ..
        } => (source_snapshot.as_ref(), None),
        Command::DeleteSnapshot { snapshot_id } => (Some(snapshot_id), None),
        Command::Reply { request_id, reply } => match reply {
            Reply::Suspended { snapshot_id, .. } => (snapshot_id.as_ref(), None),
            Reply::Failed { reason, .. } => (None, Some((*request_id, reason))),
            Reply::Checkpointed { snapshot_id, .. } => (snapshot_id.as_ref(), None),
            Reply::Rewound { to, .. } => (Some(to), None),
            Reply::Ran { .. } | Reply::Forked { .. } | Reply::Resumed { .. } => (None, None),
        },
        Command::RunCommand { .. }
        | Command::TakeSnapshot { .. }
        | Command::TakeCheckpoint { .. }
        | Command::StopSandbox { .. }
        | Command::ExtendTimeout { .. }
        | Command::ProbeSandbox { .. }
        | Command::ReadUsage { .. }
        | Command::SampleActivity { .. }
        | Command::ScheduleTimer { .. } => (None, None),
    }
}

fn mark_entry(
    marks: &mut Vec<Mark>,
    e: &JournalEntry,
    prev: Option<&Task>,
    running: &mut BTreeMap<u64, (Millis, u64, String)>,
) {
    let mut mark = |kind, label: String| {
        marks.push(Mark {
            kind,
            at: e.at,
            until: None,
            task_seq: e.task_seq,
            label,
        })
    };
    let from = e.state_before;
    let to = e.state_after;
    let sandbox_of = |t: Option<&Task>| {
        t.and_then(|t| t.sandbox.as_ref())
            .map_or_else(|| "the sandbox".to_string(), |s| s.id.to_string())
    };
    let facts = Facts::of(&e.event);
    let restored = from == TaskState::Restoring && to == TaskState::Running;
    let snapshotted = from == TaskState::Snapshotting && to != TaskState::Snapshotting;
    let rewinding = prev.and_then(|t| t.rewinding.as_ref());
    if let Some(sandbox_id) = facts.ready.filter(|_| restored) {
        let source = e
            .task_after
            .sandbox
            .as_ref()
            .and_then(|s| s.source_snapshot.clone())
            .unwrap_or_else(|| "a snapshot".into());
        let why = e
            .task_after
            .snapshots
            .iter()
            .find(|s| s.id.as_deref() == Some(source.as_str()))
            .map(
                |s| match rewinding.filter(|r| r.to.as_str() == source.as_str()) {
                    Some(r) => format!(
                        " (#{}, taken {}: a rewind; the files before it are kept in {})",
                        s.seq,
                        clock_time(s.created_at.unwrap_or(s.started_at)),
                        r.saved.as_deref().unwrap_or("no snapshot")
                    ),
                    None => format!(
                        " (#{}, taken {}: the latest complete snapshot)",
                        s.seq,
                        clock_time(s.created_at.unwrap_or(s.started_at))
                    ),
                },
            )
            .unwrap_or_default();
        mark(
            MarkKind::Restore,
            format!("{sandbox_id} restored from snapshot {source}{why}"),
        );
    } else if let Some((seq, snapshot_id, size_bytes)) = facts.taken.filter(|_| snapshotted) {
        let why = match prev.and_then(|t| t.snapshot_reason) {
            Some(SnapshotReason::Suspend { .. }) => "suspend",
            Some(SnapshotReason::Fork { .. }) => "fork",
            Some(SnapshotReason::IdleReap) => "idle reap",
            Some(SnapshotReason::BusyCap) => "busy cap (processes still busy at max_busy_seconds)",
            Some(SnapshotReason::Checkpoint) => "checkpoint before the deadline",
            Some(SnapshotReason::LateCheckpoint { .. }) => "late checkpoint after the deadline",
            Some(SnapshotReason::Checkpointing { live: true, .. }) => {
                "checkpoint, sandbox kept running"
            }
            Some(SnapshotReason::Checkpointing { live: false, .. }) => {
                "checkpoint, sandbox stopped"
            }
            Some(SnapshotReason::Rewind { .. }) => "the files kept before a rewind",
            None => "snapshot",
        };
        mark(
            MarkKind::Snapshot,
            format!(
                "snapshot #{seq} {snapshot_id} ({}, {why})",
                fmt_bytes(size_bytes)
            ),
        );
    } else if let Some((request_id, true)) = facts.request {
        mark(
            MarkKind::Request,
            format!("{} #{request_id}", e.event.name()),
        );
    } else if facts.loaded && !e.commands.is_empty() {
        // Every process that drives the task journals `loaded`; only a load that found
        // something to recover (as every older `recovered` did) is marked.
        mark(
            MarkKind::Recovery,
            format!("taskbox (re)started and recovered the task in state {from}"),
        );
    } else if facts.timer == Some(TimerKind::Retry) && !e.commands.is_empty() {
        mark(
            MarkKind::Retry,
            format!(
                "retry: attempt {} ({})",
                e.task_after.attempts,
                e.commands
                    .iter()
                    .map(|c| c.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    // The sandbox died under the task: it leaves the live states because of a deadline, a
    // probe that found it gone, an operation that answered "sandbox gone", or a request that
    // came after the recorded deadline (taskbox was not running when it passed).
    let live = |s: TaskState| matches!(s, TaskState::Running | TaskState::Snapshotting);
    let past_deadline = || {
        prev.and_then(|p| p.sandbox.as_ref())
            .is_some_and(|sb| e.at >= sb.deadline)
    };
    let died = facts.timer == Some(TimerKind::Deadline)
        || facts.probed_gone
        || (facts.failure_is_death
            && facts
                .failure
                .is_some_and(|f| f.kind == FailureKind::SandboxGone))
        || (facts.request.is_some() && past_deadline());
    let expired = died && live(from) && !live(to);
    // Where the provider keeps the files past a deadline, the sandbox is snapshotted first.
    let late_checkpoint = died
        && from == TaskState::Running
        && to == TaskState::Snapshotting
        && matches!(
            e.task_after.snapshot_reason,
            Some(SnapshotReason::LateCheckpoint { .. })
        );
    if late_checkpoint {
        mark(
            MarkKind::Expiry,
            format!(
                "{} passed its deadline ({}); a late checkpoint keeps its files",
                sandbox_of(prev),
                e.event.name()
            ),
        );
    } else if expired {
        let after = match to {
            TaskState::Idle | TaskState::Provisioning => "no snapshot holds its files",
            TaskState::Running
            | TaskState::Snapshotting
            | TaskState::Expired
            | TaskState::Restoring => "its files are in the latest snapshot",
        };
        mark(
            MarkKind::Expiry,
            format!("{} expired ({}); {after}", sandbox_of(prev), e.event.name()),
        );
    } else if let Some((kind, msg)) = failure_of(&e.event).filter(|_| !absorbed(e, prev)) {
        mark(
            MarkKind::Fault,
            format!("{}: {kind}: {}", e.event.name(), shorten(msg, 160)),
        );
    }
    for c in &e.commands {
        if let Command::RunCommand {
            request_id,
            command,
            ..
        } = c
        {
            running
                .entry(*request_id)
                .or_insert((e.at, e.task_seq, shorten(command, 80)));
        }
    }
    let finished: Vec<(u64, String)> = match facts.exited {
        Some((request_id, exit_code, timed_out, memory_killed)) => vec![(
            request_id,
            if timed_out {
                "timed out".to_string()
            } else if memory_killed {
                format!("exit {exit_code}, memory limit")
            } else {
                format!("exit {exit_code}")
            },
        )],
        None => e
            .commands
            .iter()
            .filter_map(|c| command_facts(c).1)
            .map(|(request_id, _)| (request_id, "failed".to_string()))
            .collect(),
    };
    for (request_id, how) in finished {
        if let Some((from_at, task_seq, command)) = running.remove(&request_id) {
            marks.push(Mark {
                kind: MarkKind::Command,
                at: from_at,
                until: Some(e.at),
                task_seq,
                label: format!(
                    "#{request_id} `{command}`: {how} after {}",
                    fmt_dur(e.at.saturating_sub(from_at))
                ),
            });
        }
    }
}
