//! Hand-edited journals are caught at the right entry: a changed event, a removed entry, a new
//! order, a missing creation, and an engine decision the recording lacks.

use serde_json::Value;

use taskbox::core::Event;
use taskbox::replay::redrive;
use taskbox::replay::{verify, DivergenceKind};
use taskbox::store::JournalEntry;

use super::{golden, refold};

#[test]
fn a_changed_event_is_caught_at_its_entry_with_a_field_diff() {
    let mut entries = golden("session").entries;
    let k = entries
        .iter()
        .position(|e| matches!(e.event, Event::CommandExited { .. }))
        .expect("a command exited");
    if let Event::CommandExited { exit_code, .. } = &mut entries[k].event {
        *exit_code = 7;
    }
    let verdict = verify(&entries);
    let d = verdict.divergences().next().expect("diverges").clone();
    assert_eq!(d.task_seq, entries[k].task_seq);
    assert_eq!(d.kind, DivergenceKind::Transition);
    assert_eq!(d.event, "command_exited");
    let field = d
        .diffs
        .iter()
        .find(|f| f.path == "commands[0].reply.exit_code")
        .unwrap_or_else(|| panic!("{d}"));
    assert_eq!(field.recorded, Some(Value::from(0)));
    assert_eq!(field.recomputed, Some(Value::from(7)));
    // The report reads as one short block, not two dumps.
    let text = d.to_string();
    assert!(
        text.contains(&format!("entry #{}", entries[k].task_seq)),
        "{text}"
    );
    assert!(text.lines().count() < 10, "{text}");
    assert_eq!(verdict.tasks[0].replayed, k);
}

#[test]
fn a_removed_entry_is_caught_with_its_sequence_number() {
    let entries = golden("session").entries;
    // Remove an entry that changed the task's state (one that changed nothing but timers
    // cannot be told apart from its absence once the rest is renumbered).
    let idx = entries
        .iter()
        .position(|e| e.task_seq > 3 && e.state_before != e.state_after)
        .expect("a state change after the start");
    let seq = idx as u64 + 1;
    let mut removed = entries.clone();
    removed.remove(idx);
    let d = verify(&removed)
        .divergences()
        .next()
        .expect("diverges")
        .clone();
    assert_eq!((d.task_seq, d.kind), (seq, DivergenceKind::Sequence));
    assert!(
        d.detail.contains(&format!("#{seq} is missing")),
        "{}",
        d.detail
    );

    // Removed and renumbered to hide it: the core notices what is missing.
    let mut hidden = removed;
    for (i, e) in hidden.iter_mut().enumerate() {
        e.task_seq = i as u64 + 1;
    }
    let d = verify(&hidden)
        .divergences()
        .next()
        .expect("diverges")
        .clone();
    assert_eq!(d.task_seq, seq, "{d}");
    assert!(
        matches!(d.kind, DivergenceKind::Transition | DivergenceKind::Refused),
        "{d}"
    );
}

#[test]
fn reordered_entries_are_caught_where_the_order_breaks() {
    let entries = golden("session").entries;
    let mut swapped = entries.clone();
    swapped.swap(6, 7); // entries #7 and #8
    let d = verify(&swapped)
        .divergences()
        .next()
        .expect("diverges")
        .clone();
    assert_eq!((d.task_seq, d.kind), (7, DivergenceKind::Sequence));
    assert!(d.detail.contains("out of order"), "{}", d.detail);

    // The events swapped but the numbering kept: the core sees the wrong event at #7.
    let mut events_swapped = entries;
    let (a, b) = (
        events_swapped[6].event.clone(),
        events_swapped[7].event.clone(),
    );
    events_swapped[6].event = b;
    events_swapped[7].event = a;
    let d = verify(&events_swapped)
        .divergences()
        .next()
        .expect("diverges")
        .clone();
    assert_eq!(d.task_seq, 7, "{d}");
    assert_ne!(d.kind, DivergenceKind::Sequence);
}

#[test]
fn a_journal_that_does_not_start_with_the_creation_is_refused() {
    let mut entries = golden("session").entries;
    entries.remove(0);
    let d = verify(&entries)
        .divergences()
        .next()
        .expect("diverges")
        .clone();
    assert_eq!((d.task_seq, d.kind), (1, DivergenceKind::Sequence));
    let mut renumbered = entries;
    for (i, e) in renumbered.iter_mut().enumerate() {
        e.task_seq = i as u64 + 1;
    }
    let d = verify(&renumbered)
        .divergences()
        .next()
        .expect("diverges")
        .clone();
    assert_eq!((d.task_seq, d.kind), (1, DivergenceKind::Start));
}

#[test]
fn redrive_catches_an_engine_decision_the_recording_lacks() {
    // The `extend` recording: a long command during which the engine's checkpoint timer fired
    // twice and extended the sandbox's timeout. Drop those four entries and rebuild the rest
    // consistently: the pure core is satisfied (the events still make sense), but the engine
    // arms its checkpoint timer and extends the timeout, which this recording never did.
    let entries = golden("extend").entries;
    assert!(matches!(entries[3].event, Event::TimerFired { .. }));
    let edited: Vec<JournalEntry> = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| !(3..=6).contains(i))
        .map(|(_, e)| e.clone())
        .collect();
    let edited = refold(edited);
    assert!(verify(&edited).is_clean());
    // (The refold itself is faithful: it reproduces an untouched recording exactly.)
    assert_eq!(refold(entries.clone()), entries);

    let reports = redrive::redrive(&edited).expect("re-drive runs");
    let d = reports[0].divergence.clone().expect("the re-drive differs");
    assert_eq!(d.kind, DivergenceKind::ProviderCall, "{d}");
    assert!(d.detail.contains("extend_timeout"), "{d}");
    // Without the extensions the command exits after the sandbox's recorded deadline, so the
    // refolded recording takes a late checkpoint there: the engine's extension comes first.
    assert_eq!(d.event, "command_exited", "{d}");
    let call = d
        .diffs
        .iter()
        .find(|f| f.path == "call.call")
        .and_then(|f| f.recomputed.clone())
        .expect("the call made");
    assert_eq!(call, "extend_timeout");
}

/// The live engine's timers are sleeps that may wake after their time (a busy loop, a loaded
/// machine, a retry's jitter), while a re-drive's virtual clock fires them exactly on time. An
/// event of the task handled in between must not overtake a timer whose time has passed, or
/// the journal's order depends on how late the sleep woke and its re-drive diverges (seen with
/// `chaos --http`, where requests and outcomes arrive in real time). Here the engine's clock
/// runs ahead of its sleeps: the idle lifetime passes by the clock while the idle timer's sleep
/// (30 s of real time) has not woken, and a request arrives. The idle timer is applied first —
/// the idle snapshot, then the request restores it — and the journal re-drives identically.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_whose_time_passed_goes_before_a_later_request_and_redrives() {
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    use taskbox::clock::{Clock, SystemClock};
    use taskbox::engine::{store_file, Orchestrator};

    let dir = tempfile::tempdir().expect("dir");
    // Starts at the real time: the local sandbox's deadline is the system clock's.
    let clock = Arc::new(crate::support::ManualClock(AtomicU64::new(
        SystemClock.now_ms(),
    )));
    let mut cfg = taskbox::config::Config::default();
    cfg.terminal.lifetime_seconds = 30;
    // The idle rule without activity sampling: its timer takes the snapshot itself (with
    // sampling, the samples' answers race the request the jump lets in).
    cfg.terminal.max_busy_seconds = 0;
    let orch = Orchestrator::builder(dir.path().to_path_buf(), cfg)
        .clock(clock.clone())
        .open()
        .await
        .expect("open");
    let task = crate::support::tid("late");
    orch.run(&task, "echo v1 > f", None).await.expect("run");
    clock.advance(31_000);
    let out = orch.run(&task, "cat f", None).await.expect("run");
    assert_eq!(out.stdout, "v1\n");
    orch.shutdown().await;

    let store = taskbox::store::Store::open_existing(&store_file(dir.path())).expect("store");
    let journal = store.journal("late").expect("journal");
    assert!(verify(&journal).is_clean());
    let recorded = journal.clone();
    let reports = tokio::task::spawn_blocking(move || redrive::redrive(&recorded))
        .await
        .expect("re-drive thread")
        .expect("re-drive runs");
    assert!(reports[0].divergence.is_none(), "{:?}", reports[0]);
    let pos = |pick: &dyn Fn(&Event) -> bool| {
        journal
            .iter()
            .position(|e| pick(&e.event))
            .unwrap_or_else(|| panic!("{journal:#?}"))
    };
    let idle = pos(&|e| {
        matches!(
            e,
            Event::TimerFired {
                timer: taskbox::core::TimerKind::Idle
            }
        )
    });
    let second = pos(&|e| matches!(e, Event::RunRequested { request_id: 2, .. }));
    assert!(idle < second, "the idle timer goes first: {journal:#?}");
    assert!(
        journal[idle]
            .commands
            .iter()
            .any(|c| matches!(c, taskbox::core::Command::TakeSnapshot { .. })),
        "the idle snapshot: {:#?}",
        journal[idle]
    );
}
