//! Ids, listing, sweeping: bad ids are refused, each installation lists only its own
//! resources, and the sweep removes only stale temporaries.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use taskbox::core::FailureKind;
use taskbox::provider::{sandbox_name, SandboxProvider, SandboxSpec};

use super::{assert_kind, spec, Env, INSTALLATION};
use crate::support::{sbx, snap, tid};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ids_are_refused() {
    let env = Env::new();
    env.create("good", 1, None).await;
    for id in [
        "../x",
        "taskbox-../../etc-g1",
        "taskbox-good-g01",
        "taskbox-good",
        "",
    ] {
        assert_kind(
            env.try_run(&sbx(id), "true", 1_000).await,
            FailureKind::Invalid,
        );
        assert_kind(
            env.provider.stop_sandbox(&sbx(id)).await,
            FailureKind::Invalid,
        );
        assert_kind(
            env.provider.probe_sandbox(&sbx(id)).await,
            FailureKind::Invalid,
        );
        assert_kind(
            env.provider.extend_timeout(&sbx(id), 1).await,
            FailureKind::Invalid,
        );
        assert!(env.provider.workspace_path(id).is_none());
    }
    // A task id that could name a path cannot even be made: the provider never sees one.
    assert!(taskbox::TaskId::new("../x").is_err());
    assert!(taskbox::TaskId::new("a/b").is_err());
    assert_kind(
        env.try_create("good", 1, Some("../../x.s1"), 1_000).await,
        FailureKind::Invalid,
    );
    let mut mismatched = spec("good", 1, None, 1_000);
    mismatched.name = "taskbox-other-g1".into();
    assert_kind(
        env.provider.create_sandbox(&mismatched).await,
        FailureKind::Invalid,
    );
    for id in ["x", "x.1", "x.s01", "../x.s1", "x.s1/.."] {
        assert_kind(
            env.provider.delete_snapshot(&snap(id)).await,
            FailureKind::Invalid,
        );
    }
    assert_kind(
        env.try_run(&sbx("taskbox-good-g1-insta"), "echo a\0b", 1_000)
            .await,
        FailureKind::Invalid,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_returns_only_this_installations_resources() {
    let env = Env::new();
    let other = env.sibling("inst-b");
    let mine = env.create("mine", 1, None).await;
    env.try_create("short", 1, None, 10).await.unwrap();
    let theirs = other
        .create_sandbox(&SandboxSpec {
            installation_id: "inst-b".into(),
            name: sandbox_name("inst-b", "theirs", 1),
            ..spec("theirs", 1, None, 60_000)
        })
        .await
        .unwrap();
    env.run(&mine, "echo m > f").await;
    let mine_snap = env.provider.snapshot(&tid("mine"), &mine, 1).await.unwrap();
    let theirs_snap = other.snapshot(&tid("theirs"), &theirs.id, 4).await.unwrap();
    let kept = env.create("kept", 1, None).await;
    env.clock.advance(10);

    let sandboxes = env.provider.list_sandboxes(INSTALLATION).await.unwrap();
    let summary: Vec<(String, Option<String>, bool)> = sandboxes
        .into_iter()
        .map(|r| (r.id, r.task_id, r.live))
        .collect();
    assert_eq!(
        summary,
        vec![
            (kept.to_string(), Some("kept".into()), true),
            ("taskbox-short-g1-insta".into(), Some("short".into()), false),
        ]
    );
    let snapshots = env.provider.list_snapshots(INSTALLATION).await.unwrap();
    assert_eq!(snapshots.len(), 1);
    assert_eq!(snapshots[0].id, mine_snap.id);
    let theirs = other.list_snapshots("inst-b").await.unwrap();
    assert_eq!(theirs.len(), 1);
    assert_eq!(theirs[0].id, theirs_snap.id);
    assert!(theirs[0].live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_removes_stale_temporaries_only() {
    let env = Env::new();
    // A pid that is certainly dead: a child we waited for.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let root = env.root();
    let half = root.join(format!("tmp/create.{dead}.0.taskbox-x-g1"));
    fs::create_dir_all(half.join("workspace/deep")).unwrap();
    fs::set_permissions(half.join("workspace"), fs::Permissions::from_mode(0o500)).unwrap();
    fs::create_dir_all(root.join("snapshots/x")).unwrap();
    fs::write(
        root.join(format!("snapshots/x/3.tbx.{dead}.1.tmp")),
        b"half",
    )
    .unwrap();
    fs::write(root.join("snapshots/x/3.tbx"), b"complete").unwrap();
    fs::write(root.join("tmp/not-ours"), b"?").unwrap();
    // Our own pid, but no operation of ours is using it: stale too.
    let mine = root.join(format!(
        "tmp/trash.{}.999999.taskbox-y-g1",
        std::process::id()
    ));
    fs::create_dir_all(&mine).unwrap();

    assert_eq!(env.provider.sweep_temporaries().unwrap(), 3);
    assert!(!half.exists());
    assert!(!mine.exists());
    assert!(root.join("snapshots/x/3.tbx").exists());
    assert!(root.join("tmp/not-ours").exists());
    assert_eq!(env.provider.sweep_temporaries().unwrap(), 0);
}
