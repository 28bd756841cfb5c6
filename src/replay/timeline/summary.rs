//! How things read on one line: an event or a command with its key fields, a duration, a size,
//! a time of day. Shared by the model's rows and marks and by every renderer.

use crate::clock::format_ms;
use crate::core::{Command, Event, FailureKind, Millis, Reply, TimerKind};
use crate::replay::diff::shorten;

pub(super) fn kind_name(k: &FailureKind) -> &'static str {
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
        TimerKind::Activity => "activity",
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
        Event::SuspendRequested { request_id }
        | Event::ResumeRequested { request_id }
        | Event::CheckpointRequested { request_id } => {
            format!("{name} #{request_id}")
        }
        Event::RewindRequested { request_id, to } => format!("{name} #{request_id} to {to}"),
        Event::CheckpointUnchanged { seq } => format!("{name} #{seq} (nothing changed)"),
        Event::SettingsChanged { .. } => name.to_string(),
        Event::ForkRequested {
            request_id,
            child,
            from,
        } => format!("{name} #{request_id} → {child} from {from}"),
        Event::Forked { parent, snapshot } => format!(
            "{name} from {parent}.s{} {}",
            snapshot.seq,
            snapshot.id.as_deref().unwrap_or("?")
        ),
        Event::SnapshotReleased { held_by, .. } => format!("{name} (still held by {held_by})"),
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
            memory_killed,
        } => {
            let t = match (*timed_out, *memory_killed) {
                (true, _) => " (timed out)",
                (false, true) => " (memory limit)",
                (false, false) => "",
            };
            format!("{name} #{request_id} exit {exit_code}{t}")
        }
        Event::CommandFailed { request_id, .. } | Event::CommandNotStarted { request_id, .. } => {
            format!("{name} #{request_id}")
        }
        Event::SnapshotTaken {
            seq, size_bytes, ..
        } => format!("{name} #{seq} ({})", fmt_bytes(*size_bytes)),
        Event::SnapshotFailed { seq, .. } => format!("{name} #{seq}"),
        Event::SandboxStopped { sandbox_id, .. }
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
        Event::ProbeFailed { sandbox_id, .. } => format!("{name} {sandbox_id}"),
        Event::UsageRead { sandbox_id, usage } => match usage {
            Some(_) => format!("{name} {sandbox_id}"),
            None => format!("{name} {sandbox_id}: unknown"),
        },
        Event::ActivitySampled {
            sandbox_id,
            resources,
        } => match resources {
            Some(r) => format!("{name} {sandbox_id}: {r}"),
            None => format!("{name} {sandbox_id}: not measured"),
        },
        Event::TimerFired { timer } => format!("{name} {}", timer_name(*timer)),
        Event::Loaded | Event::Recovered => name.to_string(),
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
        Command::TakeSnapshot { seq, .. } | Command::TakeCheckpoint { seq, .. } => {
            format!("{name} #{seq}")
        }
        Command::StopSandbox { sandbox_id }
        | Command::ProbeSandbox { sandbox_id }
        | Command::ReadUsage { sandbox_id }
        | Command::SampleActivity { sandbox_id } => {
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
                    memory_killed,
                    ..
                } => {
                    if *timed_out {
                        "ran, timed out".to_string()
                    } else if *memory_killed {
                        format!("ran, exit {exit_code}, memory limit")
                    } else {
                        format!("ran, exit {exit_code}")
                    }
                }
                Reply::Suspended { .. } => "suspended".to_string(),
                Reply::Resumed { .. } => "resumed".to_string(),
                Reply::Forked { child, snapshot } => format!(
                    "forked {child} from {}",
                    snapshot.id.as_deref().unwrap_or("?")
                ),
                Reply::Checkpointed {
                    snapshot_id,
                    outcome,
                    ..
                } => format!(
                    "checkpoint {} ({})",
                    snapshot_id.as_deref().unwrap_or("none"),
                    outcome.as_str()
                ),
                Reply::Rewound { to, saved, .. } => format!(
                    "rewound to {to} (the files before: {})",
                    saved.as_deref().unwrap_or("none")
                ),
                Reply::Failed { attempts, .. } => format!("failed after {attempts} attempt(s)"),
            };
            format!("reply #{request_id} {what}")
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

pub(super) fn fmt_bytes(n: u64) -> String {
    match n {
        0..=9_999 => format!("{n} B"),
        10_000..=9_999_999 => format!("{} kB", n / 1000),
        _ => format!("{} MB", n / 1_000_000),
    }
}

/// `HH:MM:SS.mmm` of a time (the date is in the table's heading, and shown again when it
/// changes).
pub(super) fn clock_time(ms: Millis) -> String {
    let full = format_ms(ms);
    full.get(11..23).map_or(full.clone(), str::to_string)
}
