//! The checks made by walking each task's journal: journal-order, retry-policy, and the
//! restored-latest and snapshot-kept rules as the engine's requests show them; with the
//! [`JournalCounts`] of what happened.

use std::collections::BTreeMap;

use crate::core::retention;
use crate::core::{
    Command, Event, FailureKind, Notice, Reply, RetryDecision, SnapshotStatus, Task, TaskState,
    TimerKind,
};
use crate::store::JournalEntry;

use super::{Invariant, JournalCounts, Violation};

/// Checks and counts every task's journal (entries of several tasks, in any order).
pub fn journal(entries: &[JournalEntry]) -> (JournalCounts, Vec<Violation>) {
    let mut by_task: BTreeMap<&str, Vec<&JournalEntry>> = BTreeMap::new();
    for e in entries {
        by_task.entry(&e.task_id).or_default().push(e);
    }
    let mut counts = JournalCounts::default();
    let mut out = Vec::new();
    for (task, mut es) in by_task {
        es.sort_by_key(|e| e.task_seq);
        task_journal(task, &es, &mut counts, &mut out);
    }
    (counts, out)
}

fn task_journal(
    task: &str,
    es: &[&JournalEntry],
    counts: &mut JournalCounts,
    out: &mut Vec<Violation>,
) {
    let mut prev: Option<&Task> = None;
    let mut reported_order = false;
    for (i, e) in es.iter().enumerate() {
        counts.entries += 1;
        let t = &e.task_after;
        let v = |inv: Invariant, detail: String| {
            Violation::new(
                inv,
                Some(task),
                format!("entry {} ({}): {detail}", e.task_seq, e.event.name()),
            )
        };
        // ---- order ----
        if !reported_order {
            let expected_seq = i as u64 + 1;
            let expected_state = prev.map_or(TaskState::Idle, |p| p.state);
            if e.task_seq != expected_seq
                || e.state_before != expected_state
                || t.state != e.state_after
            {
                out.push(v(
                    Invariant::JournalOrder,
                    format!(
                        "expected task_seq {expected_seq} starting in {expected_state}, found \
                         task_seq {} from {} to {} (task says {})",
                        e.task_seq, e.state_before, e.state_after, t.state
                    ),
                ));
                reported_order = true;
            }
        }
        // ---- counts ----
        let prev_attempts = prev.map_or(0, |p| p.attempts);
        if matches!(
            e.event,
            Event::TimerFired {
                timer: TimerKind::Retry
            }
        ) && t.attempts > prev_attempts
        {
            counts.retries += 1;
        }
        if matches!(e.event, Event::Loaded | Event::Recovered) && !e.commands.is_empty() {
            counts.recoveries += 1;
        }
        if matches!(e.event, Event::SandboxReady { .. })
            && e.state_before == TaskState::Restoring
            && e.state_after == TaskState::Running
        {
            counts.restores += 1;
        }
        if matches!(e.event, Event::Forked { .. }) {
            counts.forks += 1;
        }
        if let Event::CreateFailed { failure, .. } = &e.event {
            if failure.kind == FailureKind::SnapshotGone && e.state_before == TaskState::Restoring {
                counts.fallbacks += 1;
            }
        }
        if let Event::CommandNotStarted { failure, .. } = &e.event {
            if failure.kind == FailureKind::SandboxGone && e.state_before == TaskState::Running {
                counts.reruns += 1;
            }
        }
        let lost = |ns: &[Notice]| {
            ns.iter()
                .filter(|n| matches!(n, Notice::FilesLost { .. }))
                .count() as u64
        };
        let replied: u64 = e
            .commands
            .iter()
            .map(|c| match c {
                Command::Reply { reply, .. } => match reply {
                    Reply::Ran { notices, .. }
                    | Reply::Resumed { notices, .. }
                    | Reply::Rewound { notices, .. }
                    | Reply::Failed { notices, .. } => lost(notices),
                    Reply::Suspended { .. } | Reply::Forked { .. } | Reply::Checkpointed { .. } => {
                        0
                    }
                },
                _ => 0,
            })
            .sum();
        counts.files_lost +=
            (lost(&t.notices) + replied).saturating_sub(prev.map_or(0, |p| lost(&p.notices)));

        // ---- retry policy ----
        let policy = &t.settings.retry;
        if t.attempts > policy.max_attempts && t.state != TaskState::Snapshotting {
            out.push(v(
                Invariant::RetryPolicy,
                format!(
                    "{} attempts in {} exceed the policy's {} (only an unknown-outcome snapshot \
                     may keep trying)",
                    t.attempts, t.state, policy.max_attempts
                ),
            ));
        }
        if matches!(
            e.event,
            Event::TimerFired {
                timer: TimerKind::Retry
            }
        ) && t.attempts > prev_attempts
        {
            if let Some(due) = prev.and_then(|p| p.retry_at) {
                if e.at < due {
                    out.push(v(
                        Invariant::RetryPolicy,
                        format!(
                            "retried at {}, {} ms before the retry was due at {due}",
                            e.at,
                            due - e.at
                        ),
                    ));
                }
            }
        }
        let hint = match &e.event {
            Event::CreateFailed { failure, .. }
            | Event::CommandFailed { failure, .. }
            | Event::CommandNotStarted { failure, .. }
            | Event::SnapshotFailed { failure, .. }
            | Event::ProbeFailed { failure, .. } => match failure.kind {
                FailureKind::Transient { retry_after_ms } => Some(retry_after_ms),
                _ => None,
            },
            _ => None,
        };
        for c in &e.commands {
            let Command::ScheduleTimer {
                timer: TimerKind::Retry,
                at,
            } = c
            else {
                continue;
            };
            let Some(retry_after_ms) = hint else {
                // Re-arming a retry already due (after a restart) schedules nothing new.
                if !matches!(e.event, Event::Loaded | Event::Recovered) {
                    out.push(v(
                        Invariant::RetryPolicy,
                        format!("a retry was scheduled at {at} without a transient failure"),
                    ));
                }
                continue;
            };
            let delay = at.saturating_sub(e.at);
            let expected = match policy.decide(t.attempts, retry_after_ms) {
                RetryDecision::RetryAfter(d) => Some(d),
                // keep_trying_snapshot: the longest delay, or the provider's longer hint.
                RetryDecision::GiveUp if t.state == TaskState::Snapshotting => {
                    Some(policy.max_delay_ms.max(retry_after_ms.unwrap_or(0)))
                }
                RetryDecision::GiveUp => None,
            };
            match expected {
                Some(d) if d == delay => {}
                Some(d) => out.push(v(
                    Invariant::RetryPolicy,
                    format!(
                        "retry {} scheduled {delay} ms after the failure; the policy says {d} ms \
                         (retry-after {:?})",
                        t.attempts + 1,
                        retry_after_ms
                    ),
                )),
                None => out.push(v(
                    Invariant::RetryPolicy,
                    format!(
                        "a retry was scheduled after attempt {} of at most {}",
                        t.attempts, policy.max_attempts
                    ),
                )),
            }
        }

        // ---- retention: a snapshot is retired only behind `keep_snapshots` newer ones ----
        if let Some(p) = prev {
            for rec in &t.snapshots {
                let was_complete = p
                    .snapshots
                    .iter()
                    .any(|o| o.seq == rec.seq && o.status == SnapshotStatus::Complete);
                if was_complete && rec.status == SnapshotStatus::Deleting {
                    let newer = retention::newer_complete(&t.snapshots, rec.seq);
                    let keep = retention::keep_count(&t.settings);
                    if newer < keep {
                        out.push(v(
                            Invariant::SnapshotKept,
                            format!(
                                "retires snapshot seq {} with only {newer} newer complete \
                                 snapshot(s); it keeps {keep}",
                                rec.seq
                            ),
                        ));
                    }
                }
            }
        }

        // ---- restore decisions and deletes ----
        for c in &e.commands {
            match c {
                Command::CreateSandbox {
                    source_snapshot,
                    generation,
                    ..
                } => {
                    // The restore point: the latest complete snapshot, or the one the files
                    // were rewound to while no newer one holds them.
                    let latest = if t.settings.persistent {
                        t.restore_point().and_then(|s| s.id.clone())
                    } else {
                        None
                    };
                    if *source_snapshot != latest {
                        out.push(v(
                            Invariant::RestoredLatest,
                            format!(
                                "generation {generation} is created from {}, but the latest \
                                 complete snapshot is {}",
                                source_snapshot.as_deref().unwrap_or("nothing"),
                                latest.as_deref().unwrap_or("none")
                            ),
                        ));
                    }
                }
                Command::DeleteSnapshot { snapshot_id } => {
                    let complete = t.snapshots.iter().any(|s| {
                        s.id.as_deref() == Some(snapshot_id.as_str())
                            && s.status == SnapshotStatus::Complete
                    });
                    if complete {
                        out.push(v(
                            Invariant::SnapshotKept,
                            format!(
                                "deletes snapshot {snapshot_id}, which it still calls complete"
                            ),
                        ));
                    }
                }
                _ => {}
            }
        }
        prev = Some(t);
    }
}
