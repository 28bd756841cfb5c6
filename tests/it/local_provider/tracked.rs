//! Change tracking of a live workspace (`cas::Tracker`, inotify): a snapshot guided by the
//! tracked changes equals a full walk of the same tree for random edit sequences (files,
//! directories created, moved in and out and deleted, renames, chmod, utime, truncations,
//! symlinks, hard links in and out of the tree, writes through a shared mapping); a queue
//! overflow and too many changes fall back; through the provider, a process writing through a
//! mapping when the snapshot kills it is caught, and a new provider (a restart) walks fully.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;
use taskbox::provider::SandboxProvider;
use taskbox::snapshot_store::cas::{Cas, Index, Limits, Manifest, Tracked, Tracker};

use super::cas::{apply, big, build, capture, edit, restore_into, tree, unlock, Edit, Op};
use super::Env;

/// Edits beyond the content store's own test: what only a watcher can miss.
#[derive(Debug, Clone)]
enum Live {
    Plain(Edit),
    /// Rename an entry (file or directory) to another name in another directory.
    Rename {
        from: usize,
        dir: usize,
        name: usize,
    },
    /// Move a directory out of the workspace.
    MoveOut {
        dir: usize,
    },
    /// Move a directory built outside (with files) into the workspace.
    MoveIn {
        dir: usize,
        ops: Vec<Op>,
    },
    /// Delete a directory and what is below it.
    RemoveTree {
        dir: usize,
    },
    /// Make a directory and write files in it at once.
    MkdirWrite {
        dir: usize,
        files: u8,
    },
    Truncate {
        file: usize,
        len: u16,
    },
    Utime {
        file: usize,
        secs: u32,
    },
    /// Write through a shared writable mapping (no write(2): no IN_MODIFY).
    Mmap {
        file: usize,
        byte: u8,
    },
    /// Hard-link a file to a name outside the workspace, then write through that name.
    LinkOutWrite {
        file: usize,
    },
    /// Hard-link a file to another name inside the workspace.
    LinkIn {
        file: usize,
        dir: usize,
    },
    Symlink {
        dir: usize,
        target: Vec<u8>,
    },
}

fn live() -> impl Strategy<Value = Live> {
    let i = 0usize..64;
    prop_oneof![
        4 => edit().prop_map(Live::Plain),
        2 => (i.clone(), i.clone(), 0usize..6).prop_map(|(from, dir, name)| Live::Rename { from, dir, name }),
        1 => i.clone().prop_map(|dir| Live::MoveOut { dir }),
        1 => (i.clone(), tree()).prop_map(|(dir, ops)| Live::MoveIn { dir, ops }),
        1 => i.clone().prop_map(|dir| Live::RemoveTree { dir }),
        1 => (i.clone(), 1u8..5).prop_map(|(dir, files)| Live::MkdirWrite { dir, files }),
        1 => (i.clone(), 0u16..3000).prop_map(|(file, len)| Live::Truncate { file, len }),
        1 => (i.clone(), any::<u32>()).prop_map(|(file, secs)| Live::Utime { file, secs }),
        2 => (i.clone(), any::<u8>()).prop_map(|(file, byte)| Live::Mmap { file, byte }),
        1 => i.clone().prop_map(|file| Live::LinkOutWrite { file }),
        1 => (i.clone(), i.clone()).prop_map(|(file, dir)| Live::LinkIn { file, dir }),
        1 => (i, prop::sample::select(vec![b"a".to_vec(), b"../out".to_vec(), b"x/y".to_vec()]))
            .prop_map(|(dir, target)| Live::Symlink { dir, target }),
    ]
}

/// Every directory (the root first) and every regular file below `root`, in name order.
fn listing(root: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut dirs = vec![root.to_path_buf()];
    let mut files = Vec::new();
    for (rel, node) in capture(root) {
        let path = root.join(std::ffi::OsStr::from_bytes(&rel));
        match node {
            super::cas::Node::Dir { .. } => dirs.push(path),
            super::cas::Node::File { .. } => files.push(path),
            super::cas::Node::Symlink { .. } => {}
        }
    }
    (dirs, files)
}

fn writable(p: &Path) {
    if let Ok(meta) = fs::symlink_metadata(p) {
        let mode = meta.permissions().mode();
        let _ = fs::set_permissions(p, fs::Permissions::from_mode(mode | 0o700));
    }
}

/// Writes `byte` at offset 0 of `path` through a shared writable mapping, then unmaps and
/// closes it.
fn mmap_write(path: &Path, byte: u8) {
    use std::os::fd::AsRawFd;
    let file = fs::File::options()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let len = file.metadata().unwrap().len() as usize;
    if len == 0 {
        return;
    }
    // SAFETY: a fresh shared mapping of `len` bytes of a file open for reading and writing;
    // nothing else maps it in this process, and it is unmapped before the file is closed.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        *(p as *mut u8) ^= byte.max(1);
        libc::munmap(p, len);
    }
}

fn apply_live(ws: &Path, outside: &Path, edit: &Live, n: usize) {
    let (dirs, files) = listing(ws);
    let pick_file = |i: usize| files.get(i % files.len().max(1)).cloned();
    let pick_dir = |i: usize| dirs[i % dirs.len()].clone();
    match edit {
        Live::Plain(e) => apply(ws, e),
        Live::Rename { from, dir, name } => {
            let all: Vec<PathBuf> = dirs[1..].iter().chain(files.iter()).cloned().collect();
            if all.is_empty() {
                return;
            }
            let from = &all[from % all.len()];
            let to = pick_dir(*dir).join(format!("renamed{name}"));
            if to.starts_with(from) {
                return;
            }
            if let Some(parent) = from.parent() {
                writable(parent);
            }
            writable(to.parent().unwrap());
            let _ = fs::rename(from, &to);
        }
        Live::MoveOut { dir } => {
            if dirs.len() > 1 {
                let d = &dirs[1 + dir % (dirs.len() - 1)];
                writable(d.parent().unwrap());
                fs::rename(d, outside.join(format!("out{n}"))).unwrap();
            }
        }
        Live::MoveIn { dir, ops } => {
            let built = outside.join(format!("in{n}"));
            fs::create_dir(&built).unwrap();
            build(&built, ops);
            let to = pick_dir(*dir).join(format!("movedin{n}"));
            writable(to.parent().unwrap());
            fs::rename(&built, &to).unwrap();
        }
        Live::RemoveTree { dir } => {
            if dirs.len() > 1 {
                let d = &dirs[1 + dir % (dirs.len() - 1)];
                writable(d.parent().unwrap());
                unlock(d);
                fs::remove_dir_all(d).unwrap();
            }
        }
        Live::MkdirWrite { dir, files } => {
            let d = pick_dir(*dir).join(format!("made{n}"));
            writable(d.parent().unwrap());
            fs::create_dir(&d).unwrap();
            fs::create_dir(d.join("sub")).unwrap();
            for i in 0..*files {
                fs::write(
                    d.join("sub").join(format!("f{i}")),
                    big(100 + u32::from(i), i),
                )
                .unwrap();
            }
        }
        Live::Truncate { file, len } => {
            if let Some(p) = pick_file(*file) {
                writable(&p);
                fs::File::options()
                    .write(true)
                    .open(&p)
                    .unwrap()
                    .set_len(u64::from(*len))
                    .unwrap();
            }
        }
        Live::Utime { file, secs } => {
            if let Some(p) = pick_file(*file) {
                writable(&p);
                fs::File::options()
                    .write(true)
                    .open(&p)
                    .unwrap()
                    .set_modified(UNIX_EPOCH + Duration::from_secs(u64::from(*secs)))
                    .unwrap();
            }
        }
        Live::Mmap { file, byte } => {
            if let Some(p) = pick_file(*file) {
                writable(&p);
                mmap_write(&p, *byte);
            }
        }
        Live::LinkOutWrite { file } => {
            if let Some(p) = pick_file(*file) {
                writable(&p);
                let other = outside.join(format!("link{n}"));
                fs::hard_link(&p, &other).unwrap();
                use std::io::Write;
                fs::OpenOptions::new()
                    .append(true)
                    .open(&other)
                    .unwrap()
                    .write_all(b"written through another name")
                    .unwrap();
            }
        }
        Live::LinkIn { file, dir } => {
            if let Some(p) = pick_file(*file) {
                let to = pick_dir(*dir).join(format!("linked{n}"));
                writable(to.parent().unwrap());
                fs::hard_link(&p, &to).unwrap();
            }
        }
        Live::Symlink { dir, target } => {
            let to = pick_dir(*dir).join(format!("sym{n}"));
            writable(to.parent().unwrap());
            std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), &to).unwrap();
        }
    }
}

/// A tree packed, restored into `ws1` with its index kept, and a tracker started on it.
fn restored(dir: &Path, cas: &Cas, ops: &[Op], limits: Limits) -> (PathBuf, Index, Tracker) {
    let ws0 = dir.join("ws0");
    fs::create_dir(&ws0).unwrap();
    build(&ws0, ops);
    let (manifest, _) = {
        let _lock = cas.lock(false).unwrap();
        cas.pack(&ws0, None).unwrap()
    };
    let ws1 = dir.join("ws1");
    let restored = restore_into(cas, &manifest, &ws1).unwrap();
    let index = Index::write_kept(&dir.join("index"), restored).unwrap();
    let tracker = Tracker::start(&ws1, index.clone(), limits).unwrap();
    (ws1, index, tracker)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::support::proptest_cases(32, 32), failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/tracked.txt"))), ..ProptestConfig::default() })]

    /// For random trees and random live edits, the snapshot guided by the tracked changes is
    /// the manifest a full walk gives (which the content store's own tests show restores the
    /// tree exactly), and it restores the tree exactly.
    #[test]
    fn a_tracked_snapshot_equals_a_full_walk(
        ops in tree(),
        edits in proptest::collection::vec(live(), 0..8),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let cas = Cas::open(dir.path().join("cas")).unwrap();
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let (ws, index, tracker) = restored(dir.path(), &cas, &ops, Limits::default());
        for (n, e) in edits.iter().enumerate() {
            apply_live(&ws, &outside, e, n);
        }
        let tracked = tracker.finish().unwrap();
        let _lock = cas.lock(false).unwrap();
        let (got, stats) = cas.pack_tracked(&ws, &tracked).unwrap();
        let (full, full_stats) = cas.pack(&ws, Some(&index)).unwrap();
        prop_assert!(stats.tracked || stats.fell_back.is_some());
        prop_assert_eq!(&stats.omitted, &full_stats.omitted);
        prop_assert!(got == full, "tracked {:#?}\nfull {:#?}\nchanges {:?}", got, full, tracked.changes);
        if stats.fell_back.is_none() {
            prop_assert!(stats.entries_looked_at <= full_stats.entries_looked_at);
        }
        let expected = capture(&ws);
        let dest = dir.path().join("check");
        restore_into(&cas, &Manifest::decode(&got.encode()).unwrap(), &dest).unwrap();
        super::cas::assert_same(&expected, &capture(&dest));
        unlock(dir.path());
    }
}

/// One round of a checkpoint's tracker hand-over (as the local provider's checkpoint does it):
/// the changes taken, the tracked snapshot checked against a full walk and restored, then the
/// tracker re-armed from it (or started anew where the walk fell back) and given its index.
fn checkpoint_round(dir: &Path, cas: &Cas, ws: &Path, tracker: &mut Tracker, round: usize) {
    let tracked = tracker.take().unwrap();
    let _lock = cas.lock(false).unwrap();
    let (got, stats) = cas.pack_tracked(ws, &tracked).unwrap();
    let (full, _) = cas.pack(ws, Some(&tracked.index)).unwrap();
    assert!(
        got == full,
        "round {round}: tracked {got:#?}\nfull {full:#?}\nchanges {:?}",
        tracked.changes
    );
    let dest = dir.join(format!("check{round}"));
    restore_into(cas, &got, &dest).unwrap();
    super::cas::assert_same(&capture(ws), &capture(&dest));
    let index_path = dir.join("index");
    if stats.fell_back.is_some() {
        let index = Index::write_kept(&index_path, got).unwrap();
        *tracker = Tracker::start(ws, index, Limits::default()).unwrap();
    } else {
        tracker.rearm(ws, &got, &tracked.changes).unwrap();
        let stamp = Index::stamp(&index_path).unwrap();
        let body = got.encode();
        tracker.set_index(stamp.write(got, &body).unwrap());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::support::proptest_cases(24, 24), failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/tracked_rounds.txt"))), ..ProptestConfig::default() })]

    /// A tracker handed over from checkpoint to checkpoint (`take`, `rearm`, `set_index`)
    /// rather than started anew each time: after every round of random live edits, the tracked
    /// snapshot is the full walk's and restores the tree exactly — edits in what an earlier
    /// round created or moved (a new directory's files, a renamed one's) included.
    #[test]
    fn a_tracker_carried_over_checkpoints_misses_nothing(
        ops in tree(),
        rounds in proptest::collection::vec(proptest::collection::vec(live(), 0..5), 1..4),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let cas = Cas::open(dir.path().join("cas")).unwrap();
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let (ws, _, mut tracker) = restored(dir.path(), &cas, &ops, Limits::default());
        for (round, edits) in rounds.iter().enumerate() {
            for (n, e) in edits.iter().enumerate() {
                apply_live(&ws, &outside, e, round * 100 + n);
            }
            checkpoint_round(dir.path(), &cas, &ws, &mut tracker, round);
        }
        unlock(dir.path());
    }
}

/// The entries a checkpoint made new are watched from the next one on: a directory created
/// (and one renamed) before a checkpoint, then written into after it — by a file written, one
/// created and one renamed into it — is in the next checkpoint. Without the re-arming, the
/// new directory has no watch and those writes are missed.
#[test]
fn what_a_checkpoint_made_new_is_watched_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let cas = Cas::open(dir.path().join("cas")).unwrap();
    let (ws, _, mut tracker) = restored(dir.path(), &cas, &twelve_dirs(), Limits::default());
    let mut tops: Vec<PathBuf> = fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    tops.sort();
    fs::create_dir_all(ws.join("new/deeper")).unwrap();
    fs::write(ws.join("new/deeper/f"), "one").unwrap();
    fs::write(tops[0].join("kept"), "in a directory about to move").unwrap();
    fs::rename(&tops[0], ws.join("moved")).unwrap();
    checkpoint_round(dir.path(), &cas, &ws, &mut tracker, 0);
    fs::write(ws.join("new/deeper/f"), "two").unwrap();
    fs::write(ws.join("new/deeper/g"), "created").unwrap();
    fs::write(ws.join("moved/kept"), "written after the move").unwrap();
    fs::write(tops[1].join("h"), "elsewhere").unwrap();
    fs::rename(tops[1].join("h"), ws.join("moved/h")).unwrap();
    let tracked = tracker.take().unwrap();
    assert!(!tracked.changes.is_empty());
    checkpoint_round_after(dir.path(), &cas, &ws, &mut tracker, tracked);
}

/// [`checkpoint_round`]'s checks for changes already taken.
fn checkpoint_round_after(
    dir: &Path,
    cas: &Cas,
    ws: &Path,
    tracker: &mut Tracker,
    tracked: Tracked,
) {
    let _lock = cas.lock(false).unwrap();
    let (got, _) = cas.pack_tracked(ws, &tracked).unwrap();
    let dest = dir.join("check-after");
    restore_into(cas, &got, &dest).unwrap();
    super::cas::assert_same(&capture(ws), &capture(&dest));
    tracker.rearm(ws, &got, &tracked.changes).unwrap();
}

/// Twelve directories at the top of the workspace.
fn twelve_dirs() -> Vec<Op> {
    (0..12)
        .map(|name| Op::Dir {
            parent: 0,
            name,
            mode: 0o755,
        })
        .collect()
}

/// One small change in a tree of many files: the tracked snapshot looks at that file and its
/// directory, not at the rest, and reads one file.
#[test]
fn a_tracked_snapshot_looks_only_at_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let cas = Cas::open(dir.path().join("cas")).unwrap();
    let ops = twelve_dirs();
    let (ws, _index, tracker) = restored(dir.path(), &cas, &ops, Limits::default());
    for d in fs::read_dir(&ws).unwrap() {
        let d = d.unwrap().path();
        for i in 0..50 {
            fs::write(d.join(format!("f{i}")), format!("{i}")).unwrap();
        }
    }
    // Those files are new to the index: restore them once more, tracked from there.
    let (m, _) = cas.pack(&ws, None).unwrap();
    drop(tracker);
    let ws2 = dir.path().join("ws2");
    let restored = restore_into(&cas, &m, &ws2).unwrap();
    // The index written past the restore's timestamp tick, so no entry is racy.
    std::thread::sleep(Duration::from_millis(20));
    let index = Index::write_kept(&dir.path().join("index2"), restored).unwrap();
    let tracker = Tracker::start(&ws2, index, Limits::default()).unwrap();
    let victim = fs::read_dir(&ws2)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("f7");
    fs::write(&victim, "changed").unwrap();
    let tracked = tracker.finish().unwrap();
    let (got, stats) = cas.pack_tracked(&ws2, &tracked).unwrap();
    assert!(stats.tracked && stats.fell_back.is_none(), "{stats:?}");
    assert_eq!(stats.files_read, 1, "{stats:?}");
    assert_eq!(stats.entries_looked_at, 1, "{stats:?}");
    assert_eq!(got.entries.len(), 12 + 600);
    unlock(dir.path());
}

/// More events than the kernel queues (`max_queued_events`) while nothing reads them: the
/// tracker reports the overflow and is not trusted; so is one past its own bound of changes.
#[test]
fn an_overflow_or_too_many_changes_is_not_trusted() {
    let queued: usize = fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cas = Cas::open(dir.path().join("cas")).unwrap();
    let ops: Vec<Op> = (0..8)
        .map(|name| Op::File {
            parent: 0,
            name,
            mode: 0o644,
            data: super::cas::Data::Small(vec![1, 2, 3]),
        })
        .collect();
    let limits = Limits {
        background_reader: false,
        ..Limits::default()
    };
    let (ws, _, tracker) = restored(dir.path(), &cas, &ops, limits);
    let files: Vec<PathBuf> = fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    // Alternating files and modes: no two consecutive events are alike (the kernel merges those).
    for i in 0..queued + 16 {
        let mode = if i % 2 == 0 { 0o600 } else { 0o644 };
        fs::set_permissions(&files[i % files.len()], fs::Permissions::from_mode(mode)).unwrap();
    }
    let why = tracker.finish().unwrap_err();
    assert!(why.to_string().contains("overflow"), "{why}");

    let dir = tempfile::tempdir().unwrap();
    let cas = Cas::open(dir.path().join("cas")).unwrap();
    let limits = Limits {
        max_changes: 20,
        ..Limits::default()
    };
    let (ws, _, tracker) = restored(dir.path(), &cas, &ops, limits);
    for i in 0..30 {
        fs::write(ws.join(format!("new{i}")), "x").unwrap();
    }
    let why = tracker.finish().unwrap_err();
    assert!(why.to_string().contains("more than 20"), "{why}");
}

/// The workspace itself moved away or deleted: not trusted.
#[test]
fn the_workspace_moved_or_deleted_is_not_trusted() {
    for delete in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let cas = Cas::open(dir.path().join("cas")).unwrap();
        let (ws, _, tracker) = restored(dir.path(), &cas, &[], Limits::default());
        if delete {
            fs::remove_dir(&ws).unwrap();
        } else {
            fs::rename(&ws, dir.path().join("elsewhere")).unwrap();
        }
        let why = tracker.finish().unwrap_err();
        assert!(why.to_string().contains("workspace"), "{why}");
    }
}

/// Through the provider: a background process keeps writing through a shared mapping of a
/// restored file until the snapshot kills it (its IN_CLOSE_WRITE comes only then); the
/// snapshot holds its last write. Then a new provider on the same root (a restart: no tracker)
/// snapshots a sandbox the first one restored, after a change, and keeps the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_writes_until_the_kill_and_a_restart_are_kept() {
    let env = Env::new();
    let task = taskbox::ids::TaskId::new("t").unwrap();
    let sb = env.create("t", 1, None).await;
    env.run(&sb, "head -c 4096 /dev/zero > mapped; echo one > plain")
        .await;
    let s1 = env.provider.snapshot(&task, &sb, 1).await.unwrap();
    let sb = env.create("t", 2, Some(s1.id.as_str())).await;
    let ws = env.provider.workspace_path(&sb).unwrap();
    // A writer that maps the file, writes, and keeps running (and mapping) until killed.
    let script = r#"python3 - <<'EOF' &
import mmap, os, time
f = open("mapped", "r+b")
m = mmap.mmap(f.fileno(), 4096)
f.close()
m[0:7] = b"mmapped"
open("ready", "w").close()
time.sleep(600)
EOF
for i in $(seq 1 500); do [ -e ready ] && break; sleep 0.01; done; test -e ready"#;
    let out = env.run(&sb, script).await;
    assert_eq!(out.exit_code, 0, "{out:?}");
    let s2 = env.provider.snapshot(&task, &sb, 2).await.unwrap();
    let sb = env.create("t", 3, Some(s2.id.as_str())).await;
    let ws3 = env.provider.workspace_path(&sb).unwrap();
    assert_eq!(&fs::read(ws3.join("mapped")).unwrap()[..7], b"mmapped");
    drop(ws);

    // A restart: this sandbox's tracker lives in the old provider, not in the new one.
    let restarted = env.sibling(super::INSTALLATION);
    fs::write(ws3.join("plain"), "two\n").unwrap();
    let s3 = restarted.snapshot(&task, &sb, 3).await.unwrap();
    let sb = restarted
        .create_sandbox(&super::spec("t", 4, Some(s3.id.as_str()), 60_000))
        .await
        .unwrap()
        .id;
    let ws4 = restarted.workspace_path(&sb).unwrap();
    assert_eq!(fs::read_to_string(ws4.join("plain")).unwrap(), "two\n");
    restarted.stop_sandbox(&sb).await.unwrap();
}

/// Whether a descriptor of this process is an inotify instance watching the inode `ino` (from
/// `/proc/self/fdinfo`: one `inotify wd:… ino:<hex> …` line per watch).
fn watched_by_this_process(ino: u64) -> bool {
    let needle = format!(" ino:{ino:x} ");
    fs::read_dir("/proc/self/fdinfo")
        .unwrap()
        .flatten()
        .any(|fd| {
            fs::read_to_string(fd.path()).is_ok_and(|info| {
                info.lines()
                    .any(|l| l.starts_with("inotify") && l.contains(&needle))
            })
        })
}

/// A tracker that finished, or was dropped, lets go of its watches: its descriptor is closed
/// (on a thread of its own, so the snapshot does not wait for the kernel to remove them).
#[test]
fn a_finished_or_dropped_tracker_lets_go_of_its_watches() {
    use std::os::unix::fs::MetadataExt;
    let ops = twelve_dirs();
    for finish in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let cas = Cas::open(dir.path().join("cas")).unwrap();
        let (ws, _, tracker) = restored(dir.path(), &cas, &ops, Limits::default());
        let ino = fs::metadata(&ws).unwrap().ino();
        assert!(watched_by_this_process(ino), "the tracker watches nothing");
        if finish {
            tracker.finish().unwrap();
        } else {
            drop(tracker);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while watched_by_this_process(ino) {
            assert!(
                std::time::Instant::now() < deadline,
                "the tracker's watches are still there 20 s after it {}",
                if finish { "finished" } else { "was dropped" }
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        unlock(dir.path());
    }
}
