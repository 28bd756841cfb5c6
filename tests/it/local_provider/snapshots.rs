//! Snapshots: what a snapshot keeps (files, modes, links) and leaves out, gone sandboxes and
//! snapshots, unknown archive versions and cut or corrupted archives.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use taskbox::core::FailureKind;
use taskbox::provider::{SandboxProvider, SnapshotInfo};
use taskbox::snapshot_store::archive::{self, ArchiveError};

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
    assert!(info.id.starts_with("snap.s1."), "{}", info.id);
    assert!(info.omitted.is_empty(), "{:?}", info.omitted);
    // The size is the file data the snapshot keeps (what `taskbox cost` reports as kept):
    // 6 + 19 + 2 bytes, the hard-linked file once, links and directories none.
    assert_eq!(info.size_bytes, 27);
    assert_eq!(info.expires_at, None);
    // A snapshot stops the sandbox.
    assert!(env.provider.workspace_path(&id).is_none());
    assert_kind(
        env.try_run(&id, "true", 1_000).await,
        FailureKind::SandboxGone,
    );

    // Idempotent by seq: the same answer, even though the sandbox is gone now (but for what
    // its processes used, read by the first answer as it stopped them, and gone with them).
    let again = env.provider.snapshot(&tid("snap"), &id, 1).await.unwrap();
    assert_eq!(again.resources, None);
    assert_eq!(
        again,
        SnapshotInfo {
            resources: None,
            ..info.clone()
        }
    );

    let restored = env.create("snap", 2, Some(info.id.as_str())).await;
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
    // A restored sandbox starts where the last command ended (`cd d`), and its files work.
    let out = env.run(&restored, "pwd; ../run.sh; cat ../link").await;
    assert_eq!(out.stdout, format!("{}/d\nran\nhello\n", ws.display()));
    assert!(env.tmp_entries().is_empty());

    let listed = env.provider.list_snapshots(INSTALLATION).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, info.id);
    assert_eq!(listed[0].task_id.as_deref(), Some("snap"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_keeps_every_symlink_verbatim_and_never_follows_one() {
    let env = Env::new();
    let id = env.create("venv", 1, None).await;
    let outside = env.outside();
    fs::write(outside.join("secret"), "outside").unwrap();
    env.run(
        &id,
        &format!(
            "ln -s /usr/bin/env python && ln -s '{}' ext && ln -s ../.. escape && echo k > keep \
             && ln -s nowhere dangling && mkfifo pipe",
            outside.display()
        ),
    )
    .await;
    let info = env.provider.snapshot(&tid("venv"), &id, 1).await.unwrap();
    // The fifo cannot be kept, and says so; everything else is in the snapshot.
    assert_eq!(info.omitted.len(), 1, "{:?}", info.omitted);
    assert!(info.omitted[0].starts_with("pipe: "), "{:?}", info.omitted);
    let restored = env.create("venv", 2, Some(info.id.as_str())).await;
    let ws = env.provider.workspace_path(&restored).unwrap();
    assert_eq!(fs::read_to_string(ws.join("keep")).unwrap(), "k\n");
    let outside_str = outside.display().to_string();
    for (link, target) in [
        ("python", "/usr/bin/env"),
        ("ext", outside_str.as_str()),
        ("escape", "../.."),
        ("dangling", "nowhere"),
    ] {
        assert_eq!(fs::read_link(ws.join(link)).unwrap(), Path::new(target));
    }
    assert!(fs::symlink_metadata(ws.join("pipe")).is_err());
    // The link was stored, not what it points to.
    assert!(!ws.join("secret").exists());
    assert_eq!(
        fs::read_to_string(ws.join("ext/secret")).unwrap(),
        "outside"
    );
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
    // Past its deadline a sandbox's files are still there: a late snapshot keeps them; once
    // it is stopped they are gone.
    let id = env.try_create("late", 1, None, 100).await.unwrap();
    env.run(&id, "echo late > f").await;
    env.clock.advance(100);
    env.provider.snapshot(&tid("late"), &id, 1).await.unwrap();
    assert!(env.provider.workspace_path(&id).is_none());
    let id = env.try_create("late", 2, None, 100).await.unwrap();
    env.provider.stop_sandbox(&id).await.unwrap();
    assert_kind(
        env.provider.snapshot(&tid("late"), &id, 2).await,
        FailureKind::SandboxGone,
    );
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
    let info = env.provider.snapshot(&tid("del"), &id, 1).await.unwrap();
    env.provider.delete_snapshot(&info.id).await.unwrap();
    env.provider.delete_snapshot(&info.id).await.unwrap(); // idempotent
    let msg = assert_kind(
        env.try_create("del", 2, Some(info.id.as_str()), 60_000)
            .await,
        FailureKind::SnapshotGone,
    );
    assert!(msg.contains(info.id.as_str()), "{msg}");
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
            supported: archive::VERSION,
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
    let info = env.provider.snapshot(&tid("cut"), &id, 1).await.unwrap();
    let nonce = info.id.rsplit('.').next().unwrap();
    let path = env.root().join(format!("snapshots/cut/1.{nonce}.tbx"));
    let bytes = fs::read(&path).unwrap();

    fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert_kind(
        env.try_create("cut", 2, Some(info.id.as_str()), 60_000)
            .await,
        FailureKind::Permanent,
    );
    // Only the zstd checksum at the very end is wrong.
    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0xff;
    fs::write(&path, &flipped).unwrap();
    assert_kind(
        env.try_create("cut", 2, Some(info.id.as_str()), 60_000)
            .await,
        FailureKind::Permanent,
    );
    assert!(env
        .provider
        .workspace_path("taskbox-cut-g2-insta")
        .is_none());
    assert!(env.tmp_entries().is_empty());

    // The intact archive still restores.
    fs::write(&path, &bytes).unwrap();
    let restored = env.create("cut", 2, Some(info.id.as_str())).await;
    assert_eq!(env.run(&restored, "ls | wc -l").await.stdout, "200\n");
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Issue 12 item 1 at the provider: an archive left by an earlier store (another installation,
/// or the same installation and sequence number but another sandbox instance) is never taken
/// for the snapshot asked for now, which would discard the live workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_archive_is_never_taken_for_a_new_snapshot() {
    let env = Env::new();
    let first = env.create("p", 1, None).await;
    env.run(&first, "echo v1 > old.txt").await;
    let old = env.provider.snapshot(&tid("p"), &first, 1).await.unwrap();
    // A repeated call of the same operation finds its archive (what the processes used was
    // read by the first answer, as it stopped them).
    let old = SnapshotInfo {
        resources: None,
        ..old
    };
    assert_eq!(
        env.provider.snapshot(&tid("p"), &first, 1).await.unwrap(),
        old
    );

    // The same installation starting over (a database restored from a backup): generation 1
    // and snapshot 1 again, but another sandbox instance.
    let again = env.create("p", 1, None).await;
    assert_eq!(again, first);
    env.run(&again, "echo day2 > report.txt").await;
    let new = env.provider.snapshot(&tid("p"), &again, 1).await.unwrap();
    assert_ne!(new.id, old.id);
    let restored = env.create("p", 2, Some(new.id.as_str())).await;
    assert_eq!(env.run(&restored, "ls").await.stdout, "report.txt\n");
    env.provider.stop_sandbox(&restored).await.unwrap();
    // The old archive is untouched and still names its own files.
    let restored = env.create("p", 3, Some(old.id.as_str())).await;
    assert_eq!(env.run(&restored, "ls").await.stdout, "old.txt\n");
    env.provider.stop_sandbox(&restored).await.unwrap();

    // A new installation over the same root (the database removed): its own archive too.
    let other = env.sibling("inst-b");
    let spec = taskbox::provider::SandboxSpec {
        installation_id: "inst-b".into(),
        name: taskbox::provider::sandbox_name("inst-b", "p", 1),
        ..super::spec("p", 1, None, 60_000)
    };
    let theirs = other.create_sandbox(&spec).await.unwrap();
    other
        .exec(
            &theirs.id,
            &taskbox::provider::ExecRequest {
                command: "echo fresh > fresh.txt".into(),
                timeout_ms: 10_000,
            },
        )
        .await
        .unwrap();
    let fresh = other.snapshot(&tid("p"), &theirs.id, 1).await.unwrap();
    assert!(fresh.id != old.id && fresh.id != new.id);
    // Every archive is still there, each under its own name.
    assert_eq!(
        fs::read_dir(env.root().join("snapshots/p"))
            .unwrap()
            .count(),
        3
    );
    let restored = other
        .create_sandbox(&taskbox::provider::SandboxSpec {
            generation: 2,
            name: taskbox::provider::sandbox_name("inst-b", "p", 2),
            source_snapshot: Some(fresh.id.clone()),
            ..spec
        })
        .await
        .unwrap();
    let ls = other
        .exec(
            &restored.id,
            &taskbox::provider::ExecRequest {
                command: "ls".into(),
                timeout_ms: 10_000,
            },
        )
        .await
        .unwrap();
    assert_eq!(ls.stdout, "fresh.txt\n");
}

/// Issue 12 item 6: a sparse file keeps its holes through a snapshot and a restore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_files_keep_their_holes() {
    let env = Env::new();
    let id = env.create("sparse", 1, None).await;
    env.run(
        &id,
        "truncate -s 1G big && printf middle | dd of=big bs=1 seek=500000000 conv=notrunc \
         status=none && printf tail | dd of=big bs=1 seek=1073741820 conv=notrunc status=none",
    )
    .await;
    let info = env.provider.snapshot(&tid("sparse"), &id, 1).await.unwrap();
    assert!(
        info.size_bytes < 1 << 20,
        "archive of {} bytes",
        info.size_bytes
    );
    let restored = env.create("sparse", 2, Some(info.id.as_str())).await;
    let big = env.provider.workspace_path(&restored).unwrap().join("big");
    let meta = fs::metadata(&big).unwrap();
    assert_eq!(meta.len(), 1 << 30);
    assert!(
        meta.blocks() * 512 < 1 << 20,
        "restored with {} bytes allocated",
        meta.blocks() * 512
    );
    let out = env
        .run(
            &restored,
            "dd if=big bs=1 skip=500000000 count=6 status=none; \
             dd if=big bs=1 skip=1073741820 count=4 status=none; \
             dd if=big bs=1 skip=1000 count=3 status=none | od -An -tx1",
        )
        .await;
    assert_eq!(out.stdout, "middletail 00 00 00\n");
}

/// Issue 12 item 7: what cannot be read (here a path longer than PATH_MAX, which not even root
/// can open by path) is left out and listed; the snapshot keeps everything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_entry_is_left_out_and_listed_not_fatal() {
    let env = Env::new();
    let id = env.create("deep", 1, None).await;
    env.run(
        &id,
        "echo k > keep; d=$(printf 'x%.0s' $(seq 200)); for i in $(seq 25); do mkdir $d && cd $d; \
         done; echo lost > f; cd \"$TASKBOX_WORKSPACE\"",
    )
    .await;
    let info = env.provider.snapshot(&tid("deep"), &id, 1).await.unwrap();
    assert_eq!(info.omitted.len(), 1, "{:?}", info.omitted);
    assert!(info.omitted[0].contains("PATH_MAX"), "{:?}", info.omitted);
    let restored = env.create("deep", 2, Some(info.id.as_str())).await;
    assert_eq!(env.run(&restored, "cat keep").await.stdout, "k\n");
}

/// Issue 12 item 3 at the provider: every generation of a task has the same workspace path,
/// so a script holding its absolute path still runs after a restore, in the directory the last
/// command ended in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workspace_path_is_stable_across_generations() {
    let env = Env::new();
    let first = env.create("stable", 1, None).await;
    let ws1 = env.provider.workspace_path(&first).unwrap();
    env.run(
        &first,
        "mkdir -p sub && printf '#!/bin/sh\\necho from %s\\n' \"$PWD\" > sub/where \
         && printf '#!%s/sub/where\\n' \"$PWD\" > tool && chmod +x sub/where tool && cd sub",
    )
    .await;
    let info = env
        .provider
        .snapshot(&tid("stable"), &first, 1)
        .await
        .unwrap();
    let second = env.create("stable", 2, Some(info.id.as_str())).await;
    let ws2 = env.provider.workspace_path(&second).unwrap();
    assert_eq!(ws1, ws2);
    let out = env.run(&second, "pwd; ../tool").await;
    assert_eq!(
        out.stdout,
        format!("{}/sub\nfrom {}\n", ws2.display(), ws2.display()),
        "{}",
        out.stderr
    );

    // A newer generation created while an older one is alive parks the older one: its files
    // and commands are kept, only its path changes; the newer one takes the stable path.
    let third = env.create("stable", 3, None).await;
    assert_eq!(env.provider.workspace_path(&third).unwrap(), ws1);
    let parked = env.provider.workspace_path(&second).unwrap();
    assert_ne!(parked, ws1);
    assert_eq!(
        env.run(&second, "cat ../tool").await.stdout,
        format!("#!{}/sub/where\n", ws1.display())
    );
    assert_eq!(env.run(&third, "ls").await.stdout, "");
    let listed = env.provider.list_sandboxes(INSTALLATION).await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    env.provider.stop_sandbox(&second).await.unwrap();
    assert_eq!(
        env.run(&third, "pwd").await.stdout,
        format!("{}\n", ws1.display())
    );
}
