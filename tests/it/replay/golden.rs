//! Golden journals recorded from real runs replay cleanly and re-drive identically.

use taskbox::replay::redrive;
use taskbox::replay::{timeline, verify};

use super::{golden, golden_dir};

const GOLDENS: [&str; 9] = [
    "session", "expiry", "deadline", "extend", "gone", "crash", "several", "vercel", "fork",
];

#[test]
fn golden_journals_replay_cleanly_and_redrive_identically() {
    let on_disk = std::fs::read_dir(golden_dir())
        .expect("golden dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
        })
        .count();
    assert_eq!(
        on_disk,
        GOLDENS.len(),
        "every golden journal is listed here"
    );
    for name in GOLDENS {
        let file = golden(name);
        assert_eq!(file.header.format, "taskbox-journal");
        let verdict = verify(&file.entries);
        assert!(
            verdict.is_clean(),
            "{name}: {:?}",
            verdict.divergences().next()
        );
        assert_eq!(verdict.tasks.len(), file.header.tasks.len(), "{name}");
        let reports = redrive::redrive(&file.entries)
            .unwrap_or_else(|e| panic!("{name}: {:#}", anyhow::Error::new(e)));
        for r in &reports {
            assert!(
                r.divergence.is_none(),
                "{name}: {}",
                r.divergence
                    .as_ref()
                    .map_or(String::new(), |d| d.to_string())
            );
            assert!(
                r.calls_expected > 0,
                "{name}: the recording made provider calls"
            );
            assert_eq!(r.calls_made, r.calls_expected, "{name}");
        }
    }
    // The fork recording: each of its three tasks re-drives on its own — the parent's fork
    // requests (the first snapshots it), the children restoring the parent's snapshot, the
    // parent releasing the snapshot a child retains and that child deleting it as its last
    // holder — with the calls the recording made.
    let fork = redrive::redrive(&golden("fork").entries).expect("re-drive");
    let by_task: std::collections::BTreeMap<&str, &redrive::RedriveReport> =
        fork.iter().map(|r| (r.task_id.as_str(), r)).collect();
    assert_eq!(
        by_task.keys().copied().collect::<Vec<_>>(),
        ["demo", "demo-alt", "demo-new"]
    );
    // demo: two creates, two runs, two snapshots and no delete (it released its first
    // snapshot to demo-alt); demo-alt: a restore, a run, a snapshot, a resumed run and the
    // delete of the shared snapshot; demo-new: a restore and a run.
    assert_eq!(by_task["demo"].calls_expected, 8, "{:?}", by_task["demo"]);
    assert_eq!(
        by_task["demo-alt"].calls_expected, 7,
        "{:?}",
        by_task["demo-alt"]
    );
    assert_eq!(
        by_task["demo-new"].calls_expected, 2,
        "{:?}",
        by_task["demo-new"]
    );
    // The multi-process recordings really do span several engine sessions, and the crash
    // recording has a call that never got its answer.
    let crash = redrive::redrive(&golden("crash").entries).expect("re-drive");
    assert_eq!(crash[0].sessions, 3);
    // The Vercel recording retried a rate-limited create after a jittered delay; the re-drive
    // (without jitter) still makes the same calls.
    let vercel = timeline::build(&golden("vercel").entries);
    assert!(vercel[0]
        .marks
        .iter()
        .any(|m| m.kind == timeline::MarkKind::Retry));
}
