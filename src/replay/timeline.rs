//! A task's life as a table and as a picture, built from its journal alone.
//!
//! [`build`] turns journal entries into a [`Timeline`] per task: one [`Row`] per entry (time,
//! state change, time spent in the state, the event, the commands, snapshot ids, errors and
//! retries), the state [`Band`]s over time, and [`Mark`]s for what a person looks for first —
//! commands, snapshots, restores, expiries, faults, retries, requests, restarts.
//! [`render_text`] prints the table; [`render_svg`] draws one lane per task with coloured state
//! bands and markers (every marker carries a `<title>` tooltip and a `data-kind`), and
//! [`render_html`] wraps the picture and the tables in a page.
//!
//! Long quiet stretches (an agent away for an hour) would squeeze everything else into a few
//! pixels on a linear axis, so gaps much longer than the activity around them are drawn at a
//! fixed width with their duration written on them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::clock::format_ms;
use crate::core::{
    Command, Event, FailureKind, Millis, Reply, SnapshotReason, Task, TaskState, TimerKind,
};
use crate::store::JournalEntry;

use super::diff::shorten;

/// One task's life.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    /// The task.
    pub task_id: String,
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
    super::group_by_task(entries)
        .into_iter()
        .map(|(id, es)| build_task(id, &es))
        .collect()
}

fn build_task(task_id: String, entries: &[&JournalEntry]) -> Timeline {
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
    let mut error = failure_of(&e.event).map(|(kind, msg)| format!("{kind}{stale}: {msg}"));
    match &e.event {
        Event::SnapshotTaken { snapshot_id, .. } | Event::SnapshotDeleted { snapshot_id } => {
            snapshots.push(snapshot_id.clone())
        }
        _ => {}
    }
    for c in &e.commands {
        match c {
            Command::CreateSandbox {
                source_snapshot: Some(id),
                ..
            }
            | Command::DeleteSnapshot { snapshot_id: id }
            | Command::Reply {
                reply:
                    Reply::Suspended {
                        snapshot_id: Some(id),
                    },
                ..
            } => snapshots.push(id.clone()),
            Command::Reply {
                request_id,
                reply: Reply::Failed { error: msg, .. },
            } if error.is_none() => error = Some(format!("request #{request_id} failed: {msg}")),
            _ => {}
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
        _ => None,
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
    let f = match ev {
        Event::CreateFailed { failure, .. }
        | Event::CommandFailed { failure, .. }
        | Event::SnapshotFailed { failure, .. }
        | Event::StopFailed { failure, .. }
        | Event::ExtendFailed { failure, .. }
        | Event::DeleteFailed { failure, .. } => failure,
        _ => return None,
    };
    Some((kind_name(&f.kind), f.message.as_str()))
}

fn kind_name(k: &FailureKind) -> &'static str {
    match k {
        FailureKind::Transient { .. } => "transient",
        FailureKind::SandboxGone => "sandbox gone",
        FailureKind::SnapshotGone => "snapshot gone",
        FailureKind::Auth => "auth",
        FailureKind::Invalid => "invalid",
        FailureKind::Permanent => "permanent",
    }
}

fn timer_name(t: TimerKind) -> &'static str {
    match t {
        TimerKind::Idle => "idle",
        TimerKind::Checkpoint => "checkpoint",
        TimerKind::Deadline => "deadline",
        TimerKind::Retry => "retry",
    }
}

/// The event with its key fields, on one line.
pub fn event_summary(ev: &Event, at: Millis) -> String {
    let name = ev.name();
    match ev {
        Event::RunRequested {
            request_id,
            command,
            ..
        } => format!("{name} #{request_id} `{}`", shorten(command, 40)),
        Event::SuspendRequested { request_id } | Event::ResumeRequested { request_id } => {
            format!("{name} #{request_id}")
        }
        Event::SettingsChanged { .. } => name.to_string(),
        Event::SandboxReady {
            generation,
            sandbox_id,
            deadline,
            ..
        } => format!(
            "{name} g{generation} {sandbox_id} (deadline in {})",
            fmt_dur(deadline.saturating_sub(at))
        ),
        Event::CreateFailed { generation, .. } => format!("{name} g{generation}"),
        Event::CommandExited {
            request_id,
            exit_code,
            timed_out,
        } => {
            let t = if *timed_out { " (timed out)" } else { "" };
            format!("{name} #{request_id} exit {exit_code}{t}")
        }
        Event::CommandFailed { request_id, .. } => format!("{name} #{request_id}"),
        Event::SnapshotTaken {
            seq, size_bytes, ..
        } => format!("{name} #{seq} ({})", fmt_bytes(*size_bytes)),
        Event::SnapshotFailed { seq, .. } => format!("{name} #{seq}"),
        Event::SandboxStopped { sandbox_id }
        | Event::StopFailed { sandbox_id, .. }
        | Event::ExtendFailed { sandbox_id, .. } => format!("{name} {sandbox_id}"),
        Event::TimeoutExtended { deadline, .. } => {
            format!(
                "{name} (deadline in {})",
                fmt_dur(deadline.saturating_sub(at))
            )
        }
        Event::SnapshotDeleted { .. } | Event::DeleteFailed { .. } => name.to_string(),
        Event::SandboxProbed { alive, .. } => match alive {
            Some(_) => format!("{name}: alive"),
            None => format!("{name}: gone"),
        },
        Event::TimerFired { timer } => format!("{name} {}", timer_name(*timer)),
        Event::Recovered => name.to_string(),
    }
}

/// The command with its key fields, on one line.
pub fn command_summary(c: &Command, at: Millis) -> String {
    let name = c.name();
    match c {
        Command::CreateSandbox {
            generation,
            source_snapshot,
            ..
        } => match source_snapshot {
            Some(s) => format!("{name} g{generation} ← {s}"),
            None => format!("{name} g{generation}"),
        },
        Command::RunCommand { request_id, .. } => format!("{name} #{request_id}"),
        Command::TakeSnapshot { seq, .. } => format!("{name} #{seq}"),
        Command::StopSandbox { sandbox_id } | Command::ProbeSandbox { sandbox_id } => {
            format!("{name} {sandbox_id}")
        }
        Command::ExtendTimeout { duration_ms, .. } => format!("{name} +{}", fmt_dur(*duration_ms)),
        Command::DeleteSnapshot { snapshot_id } => format!("{name} {snapshot_id}"),
        Command::ScheduleTimer { timer, at: when } => {
            format!(
                "timer {} in {}",
                timer_name(*timer),
                fmt_dur(when.saturating_sub(at))
            )
        }
        Command::Reply { request_id, reply } => {
            let what = match reply {
                Reply::Ran {
                    exit_code,
                    timed_out,
                    ..
                } => {
                    if *timed_out {
                        "ran, timed out".to_string()
                    } else {
                        format!("ran, exit {exit_code}")
                    }
                }
                Reply::Suspended { .. } => "suspended".to_string(),
                Reply::Resumed { .. } => "resumed".to_string(),
                Reply::Failed { attempts, .. } => format!("failed after {attempts} attempt(s)"),
            };
            format!("reply #{request_id} {what}")
        }
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
            .map_or_else(|| "the sandbox".to_string(), |s| s.id.clone())
    };
    match &e.event {
        Event::SandboxReady { sandbox_id, .. }
            if from == TaskState::Restoring && to == TaskState::Running =>
        {
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
                .map(|s| {
                    format!(
                        " (#{}, taken {}: the latest complete snapshot)",
                        s.seq,
                        clock_time(s.created_at.unwrap_or(s.started_at))
                    )
                })
                .unwrap_or_default();
            mark(
                MarkKind::Restore,
                format!("{sandbox_id} restored from snapshot {source}{why}"),
            );
        }
        Event::SnapshotTaken {
            seq,
            snapshot_id,
            size_bytes,
            ..
        } if from == TaskState::Snapshotting && to != TaskState::Snapshotting => {
            let why = match prev.and_then(|t| t.snapshot_reason) {
                Some(SnapshotReason::Suspend { .. }) => "suspend",
                Some(SnapshotReason::IdleReap) => "idle reap",
                Some(SnapshotReason::Checkpoint) => "checkpoint before the deadline",
                None => "snapshot",
            };
            mark(
                MarkKind::Snapshot,
                format!(
                    "snapshot #{seq} {snapshot_id} ({}, {why})",
                    fmt_bytes(*size_bytes)
                ),
            );
        }
        Event::SuspendRequested { request_id } | Event::ResumeRequested { request_id } => mark(
            MarkKind::Request,
            format!("{} #{request_id}", e.event.name()),
        ),
        Event::Recovered => mark(
            MarkKind::Recovery,
            format!("taskbox (re)started and recovered the task in state {from}"),
        ),
        Event::TimerFired {
            timer: TimerKind::Retry,
        } if !e.commands.is_empty() => mark(
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
        ),
        _ => {}
    }
    // The sandbox died under the task: it leaves the live states because of a deadline, a
    // probe that found it gone, or an operation that answered "sandbox gone".
    let live = |s: TaskState| matches!(s, TaskState::Running | TaskState::Snapshotting);
    let died = match &e.event {
        Event::TimerFired {
            timer: TimerKind::Deadline,
        }
        | Event::SandboxProbed { alive: None, .. } => true,
        Event::CommandFailed { failure, .. } | Event::SnapshotFailed { failure, .. } => {
            failure.kind == FailureKind::SandboxGone
        }
        _ => false,
    };
    let expired = died && live(from) && !live(to);
    if expired {
        let after = match to {
            TaskState::Idle | TaskState::Provisioning => "no snapshot holds its files",
            _ => "its files are in the latest snapshot",
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
    let finished: Vec<(u64, String)> = match &e.event {
        Event::CommandExited {
            request_id,
            exit_code,
            timed_out,
        } => vec![(
            *request_id,
            if *timed_out {
                "timed out".to_string()
            } else {
                format!("exit {exit_code}")
            },
        )],
        _ => e
            .commands
            .iter()
            .filter_map(|c| match c {
                Command::Reply {
                    request_id,
                    reply: Reply::Failed { .. },
                } => Some((*request_id, "failed".to_string())),
                _ => None,
            })
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

/// `850 ms`, `4.2 s`, `3m 05s`, `2h 03m`, `1d 04h`.
pub fn fmt_dur(ms: u64) -> String {
    let s = ms / 1000;
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        let tenths = (ms % 1000) / 100;
        format!("{s}.{tenths} s")
    } else if s < 3600 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else if s < 86_400 {
        format!("{}h {:02}m", s / 3600, (s % 3600) / 60)
    } else {
        format!("{}d {:02}h", s / 86_400, (s % 86_400) / 3600)
    }
}

fn fmt_bytes(n: u64) -> String {
    match n {
        0..=9_999 => format!("{n} B"),
        10_000..=9_999_999 => format!("{} kB", n / 1000),
        _ => format!("{} MB", n / 1_000_000),
    }
}

/// `HH:MM:SS.mmm` of a time (the date is in the table's heading, and shown again when it
/// changes).
fn clock_time(ms: Millis) -> String {
    let full = format_ms(ms);
    full.get(11..23).map_or(full.clone(), str::to_string)
}

/// The table: a heading line per task, then one line per entry.
pub fn render_text(timelines: &[Timeline]) -> String {
    let mut s = String::new();
    for (i, tl) in timelines.iter().enumerate() {
        if i > 0 {
            s.push('\n');
        }
        let _ = writeln!(
            s,
            "task {}: {} entries, {} → {} ({})",
            tl.task_id,
            tl.rows.len(),
            format_ms(tl.start),
            format_ms(tl.end),
            fmt_dur(tl.end - tl.start)
        );
        let _ = writeln!(
            s,
            "{:>5}  {:<12}  {:<27}  {:>8}  {:<40}  {:<44}  {:<22}  ERRORS / RETRIES",
            "#", "TIME", "STATE", "IN STATE", "EVENT", "COMMANDS", "SNAPSHOTS"
        );
        let mut day = String::new();
        for r in &tl.rows {
            let date = format_ms(r.at).get(..10).unwrap_or_default().to_string();
            if date != day {
                if !day.is_empty() {
                    let _ = writeln!(s, "       ── {date} ──");
                }
                day = date;
            }
            let state = if r.state_before == r.state_after {
                r.state_after.to_string()
            } else {
                format!("{} → {}", r.state_before, r.state_after)
            };
            let commands: Vec<&str> = r
                .commands
                .iter()
                .map(String::as_str)
                .filter(|c| !c.starts_with("timer "))
                .collect();
            let timers = r.commands.len() - commands.len();
            let mut cmd_text = commands.join(", ");
            if timers > 0 {
                if !cmd_text.is_empty() {
                    cmd_text.push_str(", ");
                }
                let _ = write!(
                    cmd_text,
                    "{timers} timer{}",
                    if timers == 1 { "" } else { "s" }
                );
            }
            if cmd_text.is_empty() {
                cmd_text.push('-');
            }
            let notes: Vec<&str> = r
                .error
                .iter()
                .chain(r.retry.iter())
                .map(String::as_str)
                .collect();
            let _ = writeln!(
                s,
                "{:>5}  {:<12}  {:<27}  {:>8}  {:<40}  {:<44}  {:<22}  {}",
                r.task_seq,
                clock_time(r.at),
                state,
                if r.task_seq == 1 {
                    "-".to_string()
                } else {
                    fmt_dur(r.in_state_ms)
                },
                shorten(&r.event, 40),
                shorten(&cmd_text, 44),
                shorten(&r.snapshots.join(", "), 22),
                shorten(&notes.join("; "), 120),
            );
        }
    }
    s
}

/// The fill colour of a state band.
pub fn state_colour(s: TaskState) -> &'static str {
    match s {
        TaskState::Idle => "#cfd4dc",
        TaskState::Provisioning => "#f2c14e",
        TaskState::Running => "#4caf7a",
        TaskState::Snapshotting => "#4a90d9",
        TaskState::Expired => "#b39ddb",
        TaskState::Restoring => "#2bb5b5",
    }
}

/// Escapes text for XML/HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut s = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => s.push_str("&amp;"),
            '<' => s.push_str("&lt;"),
            '>' => s.push_str("&gt;"),
            '"' => s.push_str("&quot;"),
            '\'' => s.push_str("&#39;"),
            // Control characters are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => s.push(' '),
            c => s.push(c),
        }
    }
    s
}

const WIDTH: f64 = 1200.0;
const LABEL_W: f64 = 170.0;
const RIGHT_PAD: f64 = 30.0;
const TOP: f64 = 78.0;
const LANE_H: f64 = 78.0;
const BAND_H: f64 = 24.0;
const GAP_W: f64 = 44.0;

/// A time axis that is linear except for long quiet gaps, each drawn [`GAP_W`] wide.
struct Scale {
    segs: Vec<Seg>,
    /// Pixels per millisecond on the linear parts.
    k: f64,
}

struct Seg {
    t0: Millis,
    t1: Millis,
    x0: f64,
    x1: f64,
    gap: bool,
}

impl Scale {
    fn new(mut times: Vec<Millis>, x0: f64, x1: f64) -> Scale {
        times.sort_unstable();
        times.dedup();
        let (first, last) = match (times.first(), times.last()) {
            (Some(&f), Some(&l)) if l > f => (f, l),
            (Some(&f), _) => {
                return Scale {
                    segs: vec![Seg {
                        t0: f,
                        t1: f + 1,
                        x0,
                        x1,
                        gap: false,
                    }],
                    k: (x1 - x0),
                }
            }
            (None, _) => {
                return Scale {
                    segs: vec![Seg {
                        t0: 0,
                        t1: 1,
                        x0,
                        x1,
                        gap: false,
                    }],
                    k: (x1 - x0),
                }
            }
        };
        let span = last - first;
        let threshold = (span / 8).max(2_000);
        let pairs: Vec<(Millis, Millis)> = times.windows(2).map(|w| (w[0], w[1])).collect();
        let gaps = pairs.iter().filter(|(a, b)| b - a > threshold).count();
        let linear: u64 = pairs
            .iter()
            .filter(|(a, b)| b - a <= threshold)
            .map(|(a, b)| b - a)
            .sum();
        let width = x1 - x0;
        // Compress only when it leaves most of the width to the activity.
        let compress = gaps > 0 && linear > 0 && (gaps as f64) * GAP_W < width * 0.5;
        if !compress {
            return Scale {
                segs: vec![Seg {
                    t0: first,
                    t1: last,
                    x0,
                    x1,
                    gap: false,
                }],
                k: width / span as f64,
            };
        }
        let k = (width - gaps as f64 * GAP_W) / linear as f64;
        let mut segs = Vec::new();
        let mut x = x0;
        for (a, b) in pairs {
            let gap = b - a > threshold;
            let w = if gap { GAP_W } else { (b - a) as f64 * k };
            segs.push(Seg {
                t0: a,
                t1: b,
                x0: x,
                x1: x + w,
                gap,
            });
            x += w;
        }
        Scale { segs, k }
    }

    fn x(&self, t: Millis) -> f64 {
        let first = &self.segs[0];
        if t <= first.t0 {
            return first.x0;
        }
        for s in &self.segs {
            if t <= s.t1 {
                let f = (t - s.t0) as f64 / (s.t1 - s.t0).max(1) as f64;
                return s.x0 + f * (s.x1 - s.x0);
            }
        }
        self.segs.last().map_or(first.x1, |s| s.x1)
    }
}

const TICK_STEPS: [u64; 26] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000,
    120_000, 300_000, 600_000, 900_000, 1_800_000, 3_600_000, 7_200_000, 21_600_000, 43_200_000,
    86_400_000,
];

/// An axis label: the offset from the start, as precise as the tick step needs.
fn fmt_offset(ms: u64, step: u64) -> String {
    if ms == 0 {
        "0".to_string()
    } else if ms < 1000 {
        format!("+{ms}ms")
    } else if ms < 60_000 || step < 1000 {
        let decimals = match step {
            0..=9 => 3,
            10..=99 => 2,
            100..=999 => 1,
            _ => 0,
        };
        format!("+{:.*}s", decimals, ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("+{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000)
    } else {
        format!("+{}h{:02}m", ms / 3_600_000, (ms % 3_600_000) / 60_000)
    }
}

/// The picture: one lane per task with coloured state bands, markers, a time axis and a legend.
pub fn render_svg(timelines: &[Timeline]) -> String {
    let mut times: Vec<Millis> = Vec::new();
    for tl in timelines {
        times.extend(tl.bands.iter().flat_map(|b| [b.from, b.to]));
        times.extend(
            tl.marks
                .iter()
                .flat_map(|m| [Some(m.at), m.until])
                .flatten(),
        );
    }
    let start = times.iter().copied().min().unwrap_or(0);
    let end = times.iter().copied().max().unwrap_or(start);
    let x0 = LABEL_W;
    let x1 = WIDTH - RIGHT_PAD;
    let scale = Scale::new(times, x0, x1);
    let lanes_bottom = TOP + LANE_H * timelines.len().max(1) as f64;
    let legend_y = lanes_bottom + 34.0;
    let height = legend_y + 74.0;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">"#
    );
    s.push_str(concat!(
        "<style>",
        ".axis{stroke:#9aa3ad;stroke-width:1}",
        ".tick{fill:#55606b;font-size:11px}",
        ".lane-label{fill:#1f2933;font-size:13px;font-weight:bold}",
        ".lane-sub{fill:#55606b;font-size:11px}",
        ".band{stroke:#ffffff;stroke-width:0.5}",
        ".gap{fill:#f3f4f6}",
        ".gap-label{fill:#6b7280;font-size:10px}",
        ".title{fill:#111827;font-size:16px;font-weight:bold}",
        ".sub{fill:#55606b;font-size:11px}",
        "</style>\n"
    ));
    let _ = writeln!(
        s,
        r##"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>"##
    );
    let names: Vec<&str> = timelines.iter().map(|t| t.task_id.as_str()).collect();
    let _ = writeln!(
        s,
        r#"<text class="title" x="16" y="26">taskbox timeline — {}</text>"#,
        escape(&shorten(&names.join(", "), 90))
    );
    let _ = writeln!(
        s,
        r#"<text class="sub" x="16" y="44">from {} to {} ({}); times on the axis are offsets from the start</text>"#,
        escape(&format_ms(start)),
        escape(&format_ms(end)),
        escape(&fmt_dur(end - start))
    );

    // Compressed gaps: a light stripe across every lane, with the quiet time written on it.
    for seg in scale.segs.iter().filter(|g| g.gap) {
        let _ = writeln!(
            s,
            r#"<rect class="gap" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"/>"#,
            seg.x0,
            TOP - 12.0,
            seg.x1 - seg.x0,
            lanes_bottom - TOP + 12.0
        );
        let mid = (seg.x0 + seg.x1) / 2.0;
        let _ = writeln!(
            s,
            r#"<text class="gap-label" x="{mid:.1}" y="{:.1}" text-anchor="middle">⋯ {} ⋯</text>"#,
            lanes_bottom + 10.0,
            escape(&fmt_dur(seg.t1 - seg.t0))
        );
    }

    // Axis and ticks.
    let _ = writeln!(
        s,
        r#"<line class="axis" x1="{x0:.1}" y1="{:.1}" x2="{x1:.1}" y2="{:.1}"/>"#,
        TOP - 8.0,
        TOP - 8.0
    );
    let step = TICK_STEPS
        .iter()
        .copied()
        .find(|st| *st as f64 * scale.k >= 90.0)
        .unwrap_or(86_400_000);
    let gap_edges: Vec<f64> = scale
        .segs
        .iter()
        .filter(|g| g.gap)
        .flat_map(|g| [g.x0, g.x1])
        .collect();
    let mut last_tick_x = f64::NEG_INFINITY;
    for seg in scale.segs.iter().filter(|g| !g.gap) {
        let first = (seg.t0 - start).div_ceil(step) * step;
        let mut off = first;
        while start + off <= seg.t1 {
            let x = scale.x(start + off);
            let clear = gap_edges.iter().all(|g| (x - g).abs() >= 30.0);
            if x - last_tick_x >= 60.0 && clear {
                let _ = writeln!(
                    s,
                    r#"<line class="axis" x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}"/><text class="tick" x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                    TOP - 12.0,
                    TOP - 4.0,
                    TOP - 24.0,
                    escape(&fmt_offset(off, step))
                );
                last_tick_x = x;
            }
            off += step;
        }
    }

    for (i, tl) in timelines.iter().enumerate() {
        let lane_top = TOP + LANE_H * i as f64;
        lane(&mut s, tl, &scale, lane_top, x1);
    }
    legend(&mut s, legend_y);
    s.push_str("</svg>\n");
    s
}

fn lane(s: &mut String, tl: &Timeline, scale: &Scale, top: f64, x_end: f64) {
    let band_y = top + 20.0;
    let final_state = tl.bands.last().map_or(TaskState::Idle, |b| b.state);
    let _ = writeln!(s, r#"<g class="lane" data-task="{}">"#, escape(&tl.task_id));
    let _ = writeln!(
        s,
        r#"<text class="lane-label" x="16" y="{:.1}">{}</text><text class="lane-sub" x="16" y="{:.1}">{} entries · now {}</text>"#,
        band_y + 10.0,
        escape(&shorten(&tl.task_id, 20)),
        band_y + 25.0,
        tl.rows.len(),
        final_state
    );
    let last = tl.bands.len().saturating_sub(1);
    for (j, b) in tl.bands.iter().enumerate() {
        let bx0 = scale.x(b.from);
        // The last band reaches the end of the axis: the task is still in that state.
        let bx1 = if j == last { x_end } else { scale.x(b.to) };
        let w = (bx1 - bx0).max(1.5);
        let _ = writeln!(
            s,
            r#"<rect class="band state-{st}" data-state="{st}" x="{bx0:.1}" y="{band_y:.1}" width="{w:.1}" height="{BAND_H}" fill="{fill}"><title>{st}: {} → {} ({})</title></rect>"#,
            escape(&format_ms(b.from)),
            escape(&format_ms(b.to)),
            escape(&fmt_dur(b.to - b.from)),
            st = b.state,
            fill = state_colour(b.state),
        );
        if w > 70.0 {
            // Leave room for an expiry marker drawn where the band starts.
            let marked = tl
                .marks
                .iter()
                .any(|m| m.kind == MarkKind::Expiry && (scale.x(m.at) - bx0).abs() < 10.0);
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#1f2933" pointer-events="none">{}</text>"##,
                bx0 + if marked { 13.0 } else { 4.0 },
                band_y + 15.0,
                b.state
            );
        }
    }
    let above = band_y - 9.0;
    let below = band_y + BAND_H;
    for m in &tl.marks {
        let x = scale.x(m.at);
        let title = format!("#{} {} — {}", m.task_seq, clock_time(m.at), m.label);
        let _ = write!(
            s,
            r#"<g class="mark {k}" data-kind="{k}" data-seq="{}"><title>{}</title>"#,
            m.task_seq,
            escape(&title),
            k = m.kind.as_str()
        );
        match m.kind {
            MarkKind::Command => {
                let xe = m.until.map_or(x_end, |u| scale.x(u));
                let _ = write!(
                    s,
                    r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="7" rx="2" fill="#374151"/>"##,
                    below + 4.0,
                    (xe - x).max(3.0)
                );
            }
            MarkKind::Snapshot => {
                let _ = write!(
                    s,
                    r##"<path d="M{x:.1} {:.1} l6 6 l-6 6 l-6 -6 z" fill="#1d4ed8" stroke="#ffffff" stroke-width="1"/>"##,
                    above - 6.0
                );
            }
            MarkKind::Restore => {
                let _ = write!(
                    s,
                    r##"<path d="M{x:.1} {:.1} l7 12 l-14 0 z" fill="#0f766e" stroke="#ffffff" stroke-width="1"/>"##,
                    above - 7.0
                );
            }
            MarkKind::Expiry => {
                let cy = band_y + BAND_H / 2.0;
                let _ = write!(
                    s,
                    r##"<circle cx="{x:.1}" cy="{cy:.1}" r="9" fill="#ffffff" stroke="#b91c1c" stroke-width="2"/><path d="M{:.1} {:.1} l10 10 M{:.1} {:.1} l-10 10" stroke="#b91c1c" stroke-width="2.5"/>"##,
                    x - 5.0,
                    cy - 5.0,
                    x + 5.0,
                    cy - 5.0
                );
            }
            MarkKind::Fault => {
                let cy = below + 20.0;
                let _ = write!(
                    s,
                    r##"<circle cx="{x:.1}" cy="{cy:.1}" r="6" fill="#dc2626"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="10" font-weight="bold" fill="#ffffff">!</text>"##,
                    cy + 3.5
                );
            }
            MarkKind::Retry => {
                let cy = below + 20.0;
                let _ = write!(
                    s,
                    r##"<circle cx="{x:.1}" cy="{cy:.1}" r="5" fill="none" stroke="#ea580c" stroke-width="2.5" stroke-dasharray="22 9"/>"##
                );
            }
            MarkKind::Request => {
                let _ = write!(
                    s,
                    r##"<path d="M{:.1} {:.1} l10 0 l-5 8 z" fill="#6b7280"/>"##,
                    x - 5.0,
                    above - 5.0
                );
            }
            MarkKind::Recovery => {
                let _ = write!(
                    s,
                    r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#7c3aed" stroke-width="2" stroke-dasharray="3 2"/><circle cx="{x:.1}" cy="{:.1}" r="3" fill="#7c3aed"/>"##,
                    band_y - 4.0,
                    band_y + BAND_H + 4.0,
                    band_y - 6.0
                );
            }
        }
        s.push_str("</g>\n");
    }
    s.push_str("</g>\n");
}

fn legend(s: &mut String, y: f64) {
    let _ = writeln!(s, r#"<g class="legend">"#);
    let _ = writeln!(
        s,
        r##"<text x="16" y="{:.1}" font-weight="bold" fill="#1f2933">states</text>"##,
        y + 4.0
    );
    let mut x = LABEL_W;
    for st in TaskState::ALL {
        let _ = writeln!(
            s,
            r##"<rect x="{x:.1}" y="{:.1}" width="22" height="12" fill="{}"/><text x="{:.1}" y="{:.1}" fill="#1f2933">{st}</text>"##,
            y - 6.0,
            state_colour(st),
            x + 28.0,
            y + 4.0
        );
        x += 120.0;
    }
    let y2 = y + 30.0;
    let _ = writeln!(
        s,
        r##"<text x="16" y="{:.1}" font-weight="bold" fill="#1f2933">markers</text>"##,
        y2 + 4.0
    );
    let mut x = LABEL_W;
    for k in MarkKind::ALL {
        let label = match k {
            MarkKind::Command => "command ran",
            MarkKind::Snapshot => "snapshot taken",
            MarkKind::Restore => "restored",
            MarkKind::Expiry => "sandbox expired",
            MarkKind::Fault => "provider fault",
            MarkKind::Retry => "retry",
            MarkKind::Request => "suspend/resume",
            MarkKind::Recovery => "restart",
        };
        let cx = x + 8.0;
        let shape = match k {
            MarkKind::Command => format!(
                r##"<rect x="{:.1}" y="{:.1}" width="18" height="7" rx="2" fill="#374151"/>"##,
                x,
                y2 - 4.0
            ),
            MarkKind::Snapshot => format!(
                r##"<path d="M{cx:.1} {:.1} l6 6 l-6 6 l-6 -6 z" fill="#1d4ed8"/>"##,
                y2 - 6.0
            ),
            MarkKind::Restore => format!(
                r##"<path d="M{cx:.1} {:.1} l7 12 l-14 0 z" fill="#0f766e"/>"##,
                y2 - 6.0
            ),
            MarkKind::Expiry => format!(
                r##"<circle cx="{cx:.1}" cy="{y2:.1}" r="7" fill="#ffffff" stroke="#b91c1c" stroke-width="2"/><path d="M{:.1} {:.1} l8 8 M{:.1} {:.1} l-8 8" stroke="#b91c1c" stroke-width="2"/>"##,
                cx - 4.0,
                y2 - 4.0,
                cx + 4.0,
                y2 - 4.0
            ),
            MarkKind::Fault => {
                format!(r##"<circle cx="{cx:.1}" cy="{y2:.1}" r="6" fill="#dc2626"/>"##)
            }
            MarkKind::Retry => format!(
                r##"<circle cx="{cx:.1}" cy="{y2:.1}" r="5" fill="none" stroke="#ea580c" stroke-width="2.5" stroke-dasharray="22 9"/>"##
            ),
            MarkKind::Request => format!(
                r##"<path d="M{:.1} {:.1} l10 0 l-5 8 z" fill="#6b7280"/>"##,
                cx - 5.0,
                y2 - 4.0
            ),
            MarkKind::Recovery => format!(
                r##"<line x1="{cx:.1}" y1="{:.1}" x2="{cx:.1}" y2="{:.1}" stroke="#7c3aed" stroke-width="2" stroke-dasharray="3 2"/>"##,
                y2 - 8.0,
                y2 + 8.0
            ),
        };
        let _ = writeln!(
            s,
            r##"<g class="legend-item" data-kind="{}">{shape}<text x="{:.1}" y="{:.1}" fill="#1f2933">{label}</text></g>"##,
            k.as_str(),
            x + 24.0,
            y2 + 4.0
        );
        x += 125.0;
    }
    s.push_str("</g>\n");
}

/// A self-contained HTML page: the picture, then each task's table.
pub fn render_html(timelines: &[Timeline]) -> String {
    let mut s = String::new();
    let names: Vec<&str> = timelines.iter().map(|t| t.task_id.as_str()).collect();
    let _ = writeln!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>taskbox timeline — {}</title>",
        escape(&shorten(&names.join(", "), 90))
    );
    s.push_str(concat!(
        "<style>body{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;margin:16px;color:#1f2933}",
        "table{border-collapse:collapse;font-size:12px;margin-bottom:24px}",
        "th,td{border-bottom:1px solid #e5e7eb;padding:3px 8px;text-align:left;vertical-align:top}",
        "th{background:#f3f4f6}td.num{text-align:right;white-space:nowrap}td.t{white-space:nowrap}td.err{color:#b91c1c}",
        ".sw{display:inline-block;width:10px;height:10px;margin-right:4px}</style></head><body>\n"
    ));
    s.push_str(&render_svg(timelines));
    for tl in timelines {
        let _ = writeln!(
            s,
            "<h2>task {}</h2>\n<table><tr><th>#</th><th>time</th><th>state</th><th>in state</th><th>event</th><th>commands</th><th>snapshots</th><th>errors / retries</th></tr>",
            escape(&tl.task_id)
        );
        for r in &tl.rows {
            let state = if r.state_before == r.state_after {
                format!(
                    "<span class=\"sw\" style=\"background:{}\"></span>{}",
                    state_colour(r.state_after),
                    r.state_after
                )
            } else {
                format!(
                    "{} → <span class=\"sw\" style=\"background:{}\"></span>{}",
                    r.state_before,
                    state_colour(r.state_after),
                    r.state_after
                )
            };
            let notes: Vec<&str> = r
                .error
                .iter()
                .chain(r.retry.iter())
                .map(String::as_str)
                .collect();
            let _ = writeln!(
                s,
                "<tr><td class=\"num\">{}</td><td class=\"t\">{}</td><td>{state}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"err\">{}</td></tr>",
                r.task_seq,
                escape(&format_ms(r.at)),
                escape(&fmt_dur(r.in_state_ms)),
                escape(&r.event),
                escape(&r.commands.join(", ")),
                escape(&r.snapshots.join(", ")),
                escape(&notes.join("; ")),
            );
        }
        s.push_str("</table>\n");
    }
    s.push_str("</body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(fmt_dur(850), "850 ms");
        assert_eq!(fmt_dur(4_250), "4.2 s");
        assert_eq!(fmt_dur(185_000), "3m 05s");
        assert_eq!(fmt_dur(7_380_000), "2h 03m");
        assert_eq!(fmt_dur(100_800_000), "1d 04h");
        assert_eq!(fmt_offset(1_500, 500), "+1.5s");
        assert_eq!(fmt_offset(3_350, 50), "+3.35s");
        assert_eq!(fmt_offset(4_000, 1_000), "+4s");
    }

    #[test]
    fn long_quiet_gaps_are_compressed_but_order_is_kept() {
        // Activity at 0-3 s, then nothing for an hour, then 2 s more.
        let times = vec![0, 1_000, 3_000, 3_603_000, 3_605_000];
        let sc = Scale::new(times.clone(), 100.0, 1100.0);
        let xs: Vec<f64> = times.iter().map(|&t| sc.x(t)).collect();
        assert!(xs.windows(2).all(|w| w[0] < w[1]), "{xs:?}");
        assert!((xs[3] - xs[2] - GAP_W).abs() < 0.01, "{xs:?}");
        assert!((xs[4] - 1100.0).abs() < 0.01);
        // Without a dominant gap the axis is linear.
        let lin = Scale::new(vec![0, 500, 1_000], 0.0, 100.0);
        assert!((lin.x(500) - 50.0).abs() < 0.01);
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(escape("a<b & \"c\"'"), "a&lt;b &amp; &quot;c&quot;&#39;");
    }
}
