//! Deadlines: an expired sandbox is gone with its workspace, and an expiry or a stop under a
//! running command kills it.

use taskbox::core::FailureKind;
use taskbox::provider::SandboxProvider;

use super::{assert_kind, wait_for, Env, START_MS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_sandbox_is_gone_and_its_workspace_discarded() {
    let env = Env::new();
    let id = env.try_create("exp", 1, None, 1_000).await.unwrap();
    env.run(&id, "echo x > f").await;

    // Extending moves the deadline.
    let extended = env.provider.extend_timeout(&id, 500).await.unwrap();
    assert_eq!(extended, START_MS + 1_500);
    env.clock.advance(1_200);
    assert_eq!(env.run(&id, "cat f").await.stdout, "x\n");

    env.clock.advance(300);
    let msg = assert_kind(
        env.try_run(&id, "cat f", 1_000).await,
        FailureKind::SandboxGone,
    );
    assert!(msg.contains("expired"), "{msg}");
    assert!(env.provider.workspace_path(&id).is_none());
    assert_eq!(env.provider.probe_sandbox(&id).await.unwrap(), None);
    assert_kind(
        env.provider.extend_timeout(&id, 1_000).await,
        FailureKind::SandboxGone,
    );
    // Creating it again gives a fresh, empty workspace.
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
    let msg = assert_kind(result, FailureKind::SandboxGone);
    assert!(
        msg.contains("expired while the command was running"),
        "{msg}"
    );
    assert!(env.provider.workspace_path(&id).is_none());
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
