//! Deadlines: nothing runs in a sandbox past its deadline, but its files stay until it is
//! snapshotted (a late checkpoint) or stopped; a deadline or a stop under a running command
//! kills it.

use taskbox::core::FailureKind;
use taskbox::provider::SandboxProvider;

use super::{assert_kind, wait_for, Env, START_MS};
use crate::support::tid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_past_its_deadline_runs_nothing_but_keeps_its_files() {
    let env = Env::new();
    let id = env.try_create("exp", 1, None, 1_000).await.unwrap();
    env.run(&id, "echo x > f").await;

    // Extending moves the deadline.
    let extended = env.provider.extend_timeout(&id, 500).await.unwrap();
    assert_eq!(extended, START_MS + 1_500);
    env.clock.advance(1_200);
    assert_eq!(env.run(&id, "cat f").await.stdout, "x\n");

    env.clock.advance(300);
    let refused = env.try_run(&id, "cat f", 1_000).await;
    // Refused before it started: the engine may run it again on a restored sandbox.
    assert!(
        refused.as_ref().is_err_and(|e| e.not_started),
        "{refused:?}"
    );
    let msg = assert_kind(refused, FailureKind::SandboxGone);
    assert!(msg.contains("passed its deadline"), "{msg}");
    assert_eq!(env.provider.probe_sandbox(&id).await.unwrap(), None);
    assert_kind(
        env.provider.extend_timeout(&id, 1_000).await,
        FailureKind::SandboxGone,
    );
    // Its files are still there, and a (late) snapshot keeps them.
    let workspace = env.provider.workspace_path(&id).expect("the files stay");
    assert_eq!(std::fs::read_to_string(workspace.join("f")).unwrap(), "x\n");
    let snap = env.provider.snapshot(&tid("exp"), &id, 1).await.unwrap();
    assert!(env.provider.workspace_path(&id).is_none());
    let restored = env.create("exp", 2, Some(&snap.id)).await;
    assert_eq!(env.run(&restored, "cat f").await.stdout, "x\n");
    // Creating the first generation again gives a fresh, empty workspace.
    let id = env.create("exp", 1, None).await;
    assert_eq!(env.run(&id, "ls -A").await.stdout, "");
    assert!(env.tmp_entries().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_expiring_under_a_command_kills_it() {
    let env = Env::new();
    let id = env.try_create("under", 1, None, 10_000).await.unwrap();
    let workspace = env.provider.workspace_path(&id).unwrap();
    let running = env.try_run(&id, "touch started; sleep 30", 20_000);
    let advance = async {
        wait_for("the command to start", || {
            workspace.join("started").exists()
        })
        .await;
        env.clock.advance(10_000);
    };
    let (result, ()) = tokio::join!(running, advance);
    // It had started: it must not be run again.
    assert!(result.as_ref().is_err_and(|e| !e.not_started));
    let msg = assert_kind(result, FailureKind::SandboxGone);
    assert!(
        msg.contains("passed its deadline while the command was running"),
        "{msg}"
    );
    // The command is dead, its files are not.
    assert!(workspace.join("started").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_sandbox_under_a_command_kills_the_command() {
    let env = Env::new();
    let id = env.create("stopped", 1, None).await;
    let workspace = env.provider.workspace_path(&id).unwrap();
    let running = env.try_run(&id, "touch started; sleep 30", 20_000);
    let stop = async {
        wait_for("the command to start", || {
            workspace.join("started").exists()
        })
        .await;
        env.provider.stop_sandbox(&id).await.unwrap();
    };
    let (result, ()) = tokio::join!(running, stop);
    assert_kind(result, FailureKind::SandboxGone);
}

/// A newer generation created while a past-deadline one still holds the task's directory parks
/// it with its files (a late checkpoint can still take them) instead of discarding them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_generation_parks_a_past_deadline_one_with_its_files() {
    let env = Env::new();
    let old = env.try_create("park", 1, None, 1_000).await.unwrap();
    env.run(&old, "echo kept > f").await;
    env.clock.advance(1_500);
    let new = env.create("park", 2, None).await;
    assert_eq!(env.run(&new, "ls -A").await.stdout, "");
    // The old generation's files are still there, parked, and a late snapshot keeps them.
    let parked = env.provider.workspace_path(&old).expect("the files stay");
    assert_eq!(std::fs::read_to_string(parked.join("f")).unwrap(), "kept\n");
    let snap = env.provider.snapshot(&tid("park"), &old, 1).await.unwrap();
    let restored = env.create("park", 3, Some(&snap.id)).await;
    assert_eq!(env.run(&restored, "cat f").await.stdout, "kept\n");
}
