//! Re-drive: run the real event loop again over a recorded journal and check that it makes the
//! same provider calls, in the same order, and gives callers the same answers.
//!
//! [`verify`](super::verify) checks the pure core; this checks everything around it — the event
//! loop, the order in which it performs commands, timers, recovery after a restart — by running
//! an [`Orchestrator`] (in a scratch data directory) against a [`ReplayProvider`] that answers
//! each call with the outcome the journal recorded for it, on virtual time (a paused tokio clock
//! read through a [`TokioClock`]): requests are issued at their recorded times, and each answer
//! is delivered at the time its outcome was recorded, so the engine sees the same `now`s.
//!
//! A journal written by the CLI spans many processes, and a process boundary matters (a new
//! process recovers the task; timers die with the old one). The journal marks every boundary
//! that matters: loading a task commits `loaded` (older engines: `recovered`, only for a task
//! that was mid-flight), and loading it with changed settings commits `settings_changed`. The re-drive therefore runs one orchestrator
//! *session* per stretch of entries between such markers, shutting the previous one down first.
//! Outcomes are paired with the calls of their own session, first come first served by key
//! (a sandbox's generation, a request id, a snapshot's seq, an id); a call whose outcome never
//! made it into the journal (the process died) is left unanswered, as it was.
//!
//! The rooms: `call` is where a recorded outcome is paired with the call it answers (a call the
//! engine makes, [`Call`](crate::provider::Call), is compared as the provider receives it,
//! [`ReceivedCall`](crate::provider::ReceivedCall)); `plan` splits the journal into
//! sessions and lists the expected calls; `provider` is the [`ReplayProvider`] that answers
//! them; `compare` finds the first divergence between the recording and the re-driven journal;
//! `scratch` keeps the re-drive's throwaway data directories; `lineage` puts into the scratch
//! store what the other tasks of a fork did (a child's creation from its parent's snapshot,
//! the snapshots another task retained). This module runs the sessions.

mod call;
mod compare;
mod lineage;
mod plan;
mod provider;
mod scratch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::clock::{Clock, TokioClock};
use crate::config::Config;
use crate::core::{Event, TaskSettings};
use crate::engine::{EngineError, Orchestrator, STORE_FILE};
use crate::ids::TaskId;
use crate::retry::Jitter;
use crate::store::{JournalEntry, Store, StoreError};

use super::Divergence;
use compare::{call_divergence, final_state_divergence, replies_of, reply_divergence};
use plan::{plan, Expected, Session};
use scratch::{session_dir, Scratch};

pub use provider::ReplayProvider;

/// The outcome of re-driving one task.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedriveReport {
    /// The task.
    pub task_id: TaskId,
    /// Orchestrator sessions run (one per process the journal shows).
    pub sessions: usize,
    /// Provider calls in the recording.
    pub calls_expected: usize,
    /// Provider calls the engine made.
    pub calls_made: usize,
    /// Replies (answers to callers) in the recording.
    pub replies: usize,
    /// The first difference, if any.
    pub divergence: Option<Divergence>,
}

/// Why a journal could not be re-driven at all (as opposed to re-driving and diverging).
#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    /// The journal has a shape the re-drive cannot reproduce.
    #[error("task {task}: cannot re-drive the journal: {why}")]
    Unsupported {
        /// The task.
        task: TaskId,
        /// Why, naming the entries involved.
        why: String,
    },
    /// The engine failed to start or stop.
    #[error("task {task}: the re-driven engine failed")]
    Engine {
        /// The task.
        task: TaskId,
        /// The cause (boxed: engine errors are large, and this one is rare).
        #[source]
        source: Box<EngineError>,
    },
    /// The re-driven journal could not be read back.
    #[error("task {task}: cannot read the re-driven journal")]
    Store {
        /// The task.
        task: TaskId,
        /// The cause (boxed, like the engine's).
        #[source]
        source: Box<StoreError>,
    },
    /// No scratch directory could be made for the re-drive's store.
    #[error("cannot create a scratch directory under {}", path.display())]
    Scratch {
        /// Where.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The virtual-time runtime could not be built.
    #[error("cannot start the re-drive's runtime")]
    Runtime(#[source] std::io::Error),
    /// The re-drive thread panicked (a bug in the engine or the re-drive).
    #[error("task {task}: the re-drive panicked: {message}")]
    Panicked {
        /// The task.
        task: TaskId,
        /// The panic message.
        message: String,
    },
}

/// Re-drives every task in `entries` (each task on its own, in the order they first appear).
/// Runs on its own thread and virtual-time runtime, so it may be called from anywhere,
/// including from inside another tokio runtime.
///
/// The engine journals a command with its secrets redacted ([`crate::redact`]), and a reply
/// quoting the command quotes it so; a journal written before it did holds them in plaintext.
/// Each task's recording is redacted the same way first ([`super::redact::redact_entries`],
/// which a redacted journal passes unchanged), so both sides compare alike.
pub fn redrive(entries: &[JournalEntry]) -> Result<Vec<RedriveReport>, RedriveError> {
    super::group_by_task(entries)
        .into_iter()
        .map(|(id, es)| {
            let es: Vec<JournalEntry> = es.into_iter().cloned().collect();
            let (es, _) =
                super::redact::redact_entries(&es).map_err(|e| RedriveError::Unsupported {
                    task: id.clone(),
                    why: format!("its journal cannot be redacted: {e}"),
                })?;
            redrive_task(&id, es)
        })
        .collect()
}

/// The entries up to a `taskbox rm`: the removal stops the live sandbox outside the event loop
/// and journals that stop last (the one [`Event::SandboxStopped`] of the sandbox the task still
/// held, which no command of the lifecycle makes), so the re-drive, which drives the event
/// loop, stops before it.
fn before_removal(mut entries: Vec<JournalEntry>) -> Vec<JournalEntry> {
    let removal = match entries.as_slice() {
        [.., held, last] => matches!(
            (&last.event, &held.task_after.sandbox),
            (Event::SandboxStopped { sandbox_id, .. }, Some(sb)) if *sandbox_id == sb.id
        ),
        _ => false,
    };
    if removal {
        entries.pop();
    }
    entries
}

fn redrive_task(
    task_id: &TaskId,
    entries: Vec<JournalEntry>,
) -> Result<RedriveReport, RedriveError> {
    let entries = before_removal(entries);
    let task = task_id.clone();
    let scratch = Scratch::new()?;
    let root = scratch.path.clone();
    let scratch_err = |source| RedriveError::Scratch {
        path: root.clone(),
        source,
    };
    // The engine names sandboxes after its installation, and the scratch store's installation
    // cannot be the recording's: expect the names the engine makes in this one.
    let first_dir = session_dir(&root, 0).map_err(scratch_err)?;
    let store_err = |source| RedriveError::Store {
        task: task_id.clone(),
        source: Box::new(source),
    };
    let mut store = Store::open(&first_dir.join(STORE_FILE)).map_err(store_err)?;
    let installation_id = store.installation_id().to_string();
    let (sessions, expected) = plan(&installation_id, task_id, &entries)?;
    lineage::seed(&mut store, task_id, &entries).map_err(store_err)?;
    drop(store);
    let task_name = task_id.clone();
    let joined = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .map_err(RedriveError::Runtime)?;
            rt.block_on(drive(task, &entries, sessions, expected, root))
        })
        .join()
    });
    let outcome = joined.map_err(|panic| RedriveError::Panicked {
        task: task_name.clone(),
        message: panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into()),
    })??;
    drop(scratch);
    Ok(outcome)
}

/// The engine's settings come from a [`Config`] (and `late_checkpoint` and `reports_usage` from
/// the provider, set on the [`ReplayProvider`]); this is the config that yields `settings`.
fn config_for(task: &TaskId, settings: &TaskSettings) -> Result<Config, RedriveError> {
    let secs = |ms: u64| ms / 1000;
    let mut c = Config::default();
    let t = &mut c.terminal;
    t.container_persistent = settings.persistent;
    t.timeout = secs(settings.command_timeout_ms);
    t.lifetime_seconds = secs(settings.idle_lifetime_ms);
    t.sandbox_timeout_seconds = secs(settings.sandbox_timeout_ms);
    t.max_sandbox_lifetime_seconds = secs(settings.max_sandbox_lifetime_ms);
    t.checkpoint_margin_seconds = secs(settings.checkpoint_margin_ms);
    t.keep_snapshots = settings.keep_snapshots;
    t.max_busy_seconds = secs(settings.max_busy_ms);
    t.keep_checkpoints = settings.keep_checkpoints;
    t.checkpoint = match settings.checkpoint {
        crate::core::AutoCheckpoint::Off => crate::config::CheckpointSetting::Off,
        crate::core::AutoCheckpoint::EveryCommand => crate::config::CheckpointSetting::EveryCommand,
        crate::core::AutoCheckpoint::Interval { ms } => {
            crate::config::CheckpointSetting::Seconds(secs(ms))
        }
    };
    let mut yields = c.task_settings();
    yields.late_checkpoint = settings.late_checkpoint;
    yields.reports_usage = settings.reports_usage;
    yields.live_checkpoint = settings.live_checkpoint;
    yields.record_kinds = settings.record_kinds;
    if yields != *settings {
        return Err(RedriveError::Unsupported {
            task: task.clone(),
            why: format!(
                "its settings cannot be expressed as a taskbox configuration, so the engine \
                 cannot be started with them: {settings:?}"
            ),
        });
    }
    Ok(c)
}

/// Lets every task that is ready at the current virtual instant run (timers due now included:
/// `yield_now` defers to after the runtime has polled its timers) before time moves on.
async fn settle() {
    for _ in 0..32 {
        tokio::task::yield_now().await;
    }
}

/// How long the last session may take to wind down in virtual time (costs no real time).
const FINAL_GRACE_MS: u64 = 3_600_000;

async fn drive(
    task: TaskId,
    entries: &[JournalEntry],
    sessions: Vec<Session>,
    expected: Vec<Expected>,
    root: PathBuf,
) -> Result<RedriveReport, RedriveError> {
    let task_id = task.clone();
    let engine_err = |source| RedriveError::Engine {
        task: task_id.clone(),
        source: Box::new(source),
    };
    let clock = TokioClock::starting_at(entries[0].at);
    let calls_expected = expected.len();
    let provider = Arc::new(ReplayProvider::new(expected, clock, task.clone()));
    let mut sessions_run: usize = 0;
    for (si, s) in sessions.iter().enumerate() {
        if provider.diverged() {
            break;
        }
        clock.sleep_until(entries[s.first].at).await;
        let data_dir = if si == 0 {
            root.join("session-0")
        } else {
            session_dir(&root, si).map_err(|source| RedriveError::Scratch {
                path: root.clone(),
                source,
            })?
        };
        provider.set_keeps_files_after_deadline(s.settings.late_checkpoint);
        provider.set_reports_usage(s.settings.reports_usage);
        provider.set_checkpoints_live(s.settings.live_checkpoint);
        let orch = Orchestrator::builder(data_dir, config_for(&task_id, &s.settings)?)
            .record_kinds(s.settings.record_kinds)
            .provider(provider.clone())
            .clock(Arc::new(clock))
            .jitter(Jitter::None)
            .open()
            .await
            .map_err(engine_err)?;
        sessions_run += 1;
        if s.requests.is_empty() && si > 0 {
            // A process that only loaded the task (see `plan`).
            clock.sleep_until(entries[s.first].at).await;
            settle().await;
            orch.load(&task).await.map_err(engine_err)?;
            settle().await;
        }
        let mut callers = Vec::new();
        for &ri in &s.requests {
            clock.sleep_until(entries[ri].at).await;
            settle().await;
            if provider.diverged() {
                break;
            }
            let orch = orch.clone();
            let task = task.clone();
            let event = entries[ri].event.clone();
            // Callers wait for their reply concurrently, as the recorded callers did.
            callers.push(tokio::spawn(async move {
                match event {
                    Event::RunRequested {
                        command,
                        timeout_ms,
                        ..
                    } => {
                        let timeout = Some(Duration::from_millis(timeout_ms));
                        orch.run(&task, &command, timeout).await.map(drop)
                    }
                    Event::SuspendRequested { .. } => orch.suspend(&task).await.map(drop),
                    Event::ForkRequested { child, from, .. } => {
                        let forked = orch.fork(&task, &child, from).await.map(drop);
                        if forked.is_ok() {
                            // The child is re-driven on its own; here it would retain what the
                            // recording's child let go of (see `lineage`).
                            orch.remove(&child, false).await.map(drop)?;
                        }
                        forked
                    }
                    Event::CheckpointRequested { .. } => orch.checkpoint(&task).await.map(drop),
                    Event::RewindRequested { to, .. } => orch.rewind(&task, to).await.map(drop),
                    _ => orch.resume(&task).await.map(drop),
                }
            }));
            settle().await;
        }
        clock.sleep_until(entries[s.last].at).await;
        settle().await;
        let grace = match sessions.get(si + 1) {
            Some(next) => entries[next.first].at.saturating_sub(clock.now_ms()).max(1),
            None => FINAL_GRACE_MS,
        };
        orch.shutdown_within(Duration::from_millis(grace)).await;
        for c in callers {
            match c.await {
                // A caller's own answer (a reply, a failed request, or "stopped" when the
                // recording's process ended first) is compared through the journal.
                Ok(Ok(()))
                | Ok(Err(EngineError::Request { .. }))
                | Ok(Err(EngineError::Stopped)) => {}
                // Anything else means the re-drive itself could not do what the recording did.
                Ok(Err(e)) => return Err(engine_err(e)),
                Err(join) => {
                    return Err(RedriveError::Panicked {
                        task: task_id.clone(),
                        message: join.to_string(),
                    })
                }
            }
        }
    }
    let store_err = |source| RedriveError::Store {
        task: task_id.clone(),
        source: Box::new(source),
    };
    let last = root.join(format!("session-{}", sessions_run.saturating_sub(1)));
    let store = Store::open(&last.join(STORE_FILE)).map_err(store_err)?;
    let redriven = store.journal(&task_id).map_err(store_err)?;
    let st = provider.state();
    let replies = replies_of(entries).len();
    let divergence = call_divergence(entries, &redriven, &st)
        .or_else(|| reply_divergence(entries, &redriven))
        .or_else(|| final_state_divergence(entries, &redriven));
    Ok(RedriveReport {
        task_id,
        sessions: sessions_run,
        calls_expected,
        calls_made: st.received.len(),
        replies,
        divergence,
    })
}
