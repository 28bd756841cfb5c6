//! The idle-reaped check: a live sandbox left idle is snapshotted (or, for a task that keeps
//! nothing, stopped) by its idle lifetime plus some slack — checked by walking each task's
//! journal, so an engine that never arms the Idle timer, or a core that lets the timer pass
//! without reaping, shows as a sandbox idle for longer than its lifetime.

use std::collections::BTreeMap;

use crate::core::{Millis, Task, TaskState};
use crate::store::JournalEntry;

use super::{Invariant, Violation};

/// Whether `t` holds a live sandbox with nothing to do: running, no command, nothing queued,
/// no retry or recovery probe pending — what the Idle timer is for.
fn idle_live(t: &Task) -> bool {
    t.state == TaskState::Running
        && t.sandbox.is_some()
        && t.running.is_none()
        && t.queue.is_empty()
        && !t.probing
        && t.retry_at.is_none()
}

/// Every time a task's journal leaves it idle with a live sandbox and its next entry comes
/// later than `last_activity + idle_lifetime + slack_ms` (or, when that deadline had passed
/// already, later than the entry plus `slack_ms`): the idle reaper missed it. A gap
/// in which the engine died (one of `crashes`, engine death times) is not judged: a dead
/// engine fires no timers, and a restarted one loads the task when it next hears of it. A
/// journal's last entry is not judged either (the run ends with its final commands).
pub fn idle_reaped(
    entries: &[JournalEntry],
    crashes: &[Millis],
    slack_ms: Millis,
) -> Vec<Violation> {
    let mut by_task: BTreeMap<&str, Vec<&JournalEntry>> = BTreeMap::new();
    for e in entries {
        by_task.entry(&e.task_id).or_default().push(e);
    }
    let mut out = Vec::new();
    for (task, mut es) in by_task {
        es.sort_by_key(|e| e.task_seq);
        for pair in es.windows(2) {
            let (e, next) = (pair[0], pair[1]);
            let t = &e.task_after;
            if !idle_live(t) {
                continue;
            }
            let due = t.last_activity.saturating_add(t.settings.idle_lifetime_ms);
            // A deadline already past when the task became idle-live (a recovery probe
            // after a restart) is due at once.
            let bound = due.max(e.at).saturating_add(slack_ms);
            if next.at <= bound || crashes.iter().any(|c| (e.at..=next.at).contains(c)) {
                continue;
            }
            out.push(Violation::new(
                Invariant::IdleReaped,
                Some(task),
                format!(
                    "entry {} ({}) left sandbox {} idle since {} with a lifetime of {} ms; \
                     nothing happened until entry {} ({}) at {}, {} ms past the idle deadline \
                     (slack {} ms)",
                    e.task_seq,
                    e.event.name(),
                    t.sandbox.as_ref().map_or("?", |s| s.id.as_str()),
                    t.last_activity,
                    t.settings.idle_lifetime_ms,
                    next.task_seq,
                    next.event.name(),
                    next.at,
                    next.at - due.max(e.at),
                    slack_ms
                ),
            ));
        }
    }
    out
}
