//! Snapshots: what a snapshot keeps (files, modes, links) and leaves out, gone sandboxes and
//! snapshots, unknown archive versions and cut or corrupted archives.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use taskbox::core::FailureKind;
use taskbox::provider::local::archive::{self, ArchiveError};
use taskbox::provider::SandboxProvider;

use super::{assert_kind, Env, INSTALLATION};
use crate::support::{sbx, snap, tid};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_stops_the_sandbox_and_restores_files_modes_and_links() {
    let env = Env::new();
    let id = env.create("snap", 1, None).await;
    env.run(
        &id,
        "mkdir -p d/e empty && echo hello > d/e/f && printf '#!/bin/sh\\necho ran\\n' > run.sh \
         && chmod 755 run.sh && echo s > secret && chmod 600 secret && ln -s d/e/f link \
         && ln -s .. d/up && ln run.sh hard && mkdir ro && chmod 555 ro && cd d",
    )
    .await;

    let info = env.provider.snapshot(&tid("snap"), &id, 1).await.unwrap();
    assert_eq!(info.id, "snap.s1");
    assert!(info.size_bytes > 0);
    assert_eq!(info.expires_at, None);
    // A snapshot stops the sandbox.
    assert!(env.provider.workspace_path(&id).is_none());
    assert_kind(
        env.try_run(&id, "true", 1_000).await,
        FailureKind::SandboxGone,
    );

    // Idempotent by seq: the same answer, even though the sandbox is gone now.
    let again = env.provider.snapshot(&tid("snap"), &id, 1).await.unwrap();
    assert_eq!(again, info);

    let restored = env.create("snap", 2, Some("snap.s1")).await;
    let ws = env.provider.workspace_path(&restored).unwrap();
    assert_eq!(fs::read_to_string(ws.join("d/e/f")).unwrap(), "hello\n");
    assert_eq!(mode(&ws.join("run.sh")), 0o755);
    assert_eq!(mode(&ws.join("secret")), 0o600);
    assert_eq!(mode(&ws.join("ro")), 0o555);
    assert!(ws.join("empty").is_dir());
    assert_eq!(fs::read_link(ws.join("link")).unwrap(), Path::new("d/e/f"));
    assert_eq!(fs::read_link(ws.join("d/up")).unwrap(), Path::new(".."));
    assert_eq!(
        fs::metadata(ws.join("hard")).unwrap().ino(),
        fs::metadata(ws.join("run.sh")).unwrap().ino()
    );
    // A restored sandbox starts at its root, and its files work.
    let out = env.run(&restored, "pwd; ./run.sh; cat link").await;
    assert_eq!(out.stdout, format!("{}\nran\nhello\n", ws.display()));
    assert!(env.tmp_entries().is_empty());

    let listed = env.provider.list_snapshots(INSTALLATION).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, "snap.s1");
    assert_eq!(listed[0].task_id.as_deref(), Some("snap"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_leaves_out_what_a_restore_would_refuse_and_never_follows_links() {
    let env = Env::new();
    let id = env.create("venv", 1, None).await;
    let outside = env.outside();
    fs::write(outside.join("secret"), "outside").unwrap();
    env.run(
        &id,
        &format!(
            "ln -s /usr/bin/env python && ln -s '{}' ext && ln -s ../.. escape && echo k > keep \
             && mkfifo pipe",
            outside.display()
        ),
    )
    .await;
    env.provider.snapshot(&tid("venv"), &id, 1).await.unwrap();
    let restored = env.create("venv", 2, Some("venv.s1")).await;
    let ws = env.provider.workspace_path(&restored).unwrap();
    assert_eq!(fs::read_to_string(ws.join("keep")).unwrap(), "k\n");
    for gone in ["python", "ext", "escape", "pipe"] {
        assert!(
            fs::symlink_metadata(ws.join(gone)).is_err(),
            "`{gone}` must not be restored"
        );
    }
    assert!(!ws.join("secret").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_of_a_gone_sandbox_is_sandbox_gone() {
    let env = Env::new();
    assert_kind(
        env.provider
            .snapshot(&tid("ghost"), &sbx("taskbox-ghost-g1-insta"), 1)
            .await,
        FailureKind::SandboxGone,
    );
    let id = env.try_create("late", 1, None, 100).await.unwrap();
    env.clock.advance(100);
    assert_kind(
        env.provider.snapshot(&tid("late"), &id, 1).await,
        FailureKind::SandboxGone,
    );
    assert!(env.provider.workspace_path(&id).is_none());
    // Another task's sandbox is refused.
    let other = env.create("mine", 1, None).await;
    assert_kind(
        env.provider.snapshot(&tid("theirs"), &other, 1).await,
        FailureKind::Invalid,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restoring_a_deleted_snapshot_is_snapshot_gone() {
    let env = Env::new();
    let msg = assert_kind(
        env.try_create("del", 1, Some("del.s9"), 60_000).await,
        FailureKind::SnapshotGone,
    );
    assert!(msg.contains("del.s9"), "{msg}");

    let id = env.create("del", 1, None).await;
    env.run(&id, "echo x > f").await;
    env.provider.snapshot(&tid("del"), &id, 1).await.unwrap();
    env.provider.delete_snapshot(&snap("del.s1")).await.unwrap();
    env.provider.delete_snapshot(&snap("del.s1")).await.unwrap(); // idempotent
    let msg = assert_kind(
        env.try_create("del", 2, Some("del.s1"), 60_000).await,
        FailureKind::SnapshotGone,
    );
    assert!(msg.contains("del.s1"), "{msg}");
    assert!(env
        .provider
        .workspace_path("taskbox-del-g2-insta")
        .is_none());
    assert!(env.tmp_entries().is_empty());
    assert_kind(
        env.provider.delete_snapshot(&snap("../del.s1")).await,
        FailureKind::Invalid,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archive_of_an_unknown_version_is_a_typed_error() {
    let env = Env::new();
    let dir = env.root().join("snapshots/vers");
    fs::create_dir_all(&dir).unwrap();
    let mut bytes = archive::MAGIC.to_vec();
    bytes.extend_from_slice(&7u32.to_le_bytes());
    bytes.extend_from_slice(&[0; 32]);
    fs::write(dir.join("1.tbx"), &bytes).unwrap();

    match archive::read_prefix(&mut bytes.as_slice()) {
        Err(ArchiveError::UnknownVersion {
            found: 7,
            supported: 1,
        }) => {}
        other => panic!("expected UnknownVersion, got {other:?}"),
    }
    let msg = assert_kind(
        env.try_create("vers", 1, Some("vers.s1"), 60_000).await,
        FailureKind::Permanent,
    );
    assert!(msg.contains("version 7"), "{msg}");
    // A snapshot whose archive is not ours at all.
    fs::write(dir.join("2.tbx"), b"PK\x03\x04 a zip file").unwrap();
    let msg = assert_kind(
        env.try_create("vers", 2, Some("vers.s2"), 60_000).await,
        FailureKind::Permanent,
    );
    assert!(msg.contains("not a taskbox snapshot archive"), "{msg}");
    assert!(env.tmp_entries().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_or_corrupted_archive_is_refused_not_half_restored() {
    let env = Env::new();
    let id = env.create("cut", 1, None).await;
    env.run(
        &id,
        "for i in $(seq 1 200); do head -c 3000 /dev/urandom > f$i; done",
    )
    .await;
    env.provider.snapshot(&tid("cut"), &id, 1).await.unwrap();
    let path = env.root().join("snapshots/cut/1.tbx");
    let bytes = fs::read(&path).unwrap();

    fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert_kind(
        env.try_create("cut", 2, Some("cut.s1"), 60_000).await,
        FailureKind::Permanent,
    );
    // Only the zstd checksum at the very end is wrong.
    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0xff;
    fs::write(&path, &flipped).unwrap();
    assert_kind(
        env.try_create("cut", 2, Some("cut.s1"), 60_000).await,
        FailureKind::Permanent,
    );
    assert!(env
        .provider
        .workspace_path("taskbox-cut-g2-insta")
        .is_none());
    assert!(env.tmp_entries().is_empty());

    // The intact archive still restores.
    fs::write(&path, &bytes).unwrap();
    let restored = env.create("cut", 2, Some("cut.s1")).await;
    assert_eq!(env.run(&restored, "ls | wc -l").await.stdout, "200\n");
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}
