//! The content-addressed snapshot store: random trees (files, directories, symlinks pointing in
//! and out, hard links, sparse files, modes, odd names) packed and restored identical byte for
//! byte and metadata for metadata; a sequence of snapshots with random edits, each restored
//! exactly; corrupt and missing content detected; gc sweeping only what nothing refers to, and
//! never what a snapshot in progress is storing.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;
use taskbox::core::FailureKind;
use taskbox::provider::SandboxProvider;
use taskbox::snapshot_store::cas::{Cas, CasError, EntryKind, Index, Manifest};

use super::{assert_kind, assert_untouched, tree_state, Env};
use crate::support::snap;

// ---------------------------------------------------------------------------------------------
// The model of a tree: what a restore must reproduce

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Node {
    Dir {
        mode: u32,
        mtime: (i64, i64),
    },
    File {
        mode: u32,
        mtime: (i64, i64),
        data: Vec<u8>,
        /// The first path (in walk order) of this inode, for the second and later links.
        link_of: Option<Vec<u8>>,
        /// Whether it has holes.
        sparse: bool,
    },
    Symlink {
        target: Vec<u8>,
    },
}

/// Every path below `root` and what it is.
pub(super) fn capture(root: &Path) -> BTreeMap<Vec<u8>, Node> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut stack = vec![Vec::<u8>::new()];
    while let Some(dir) = stack.pop() {
        let abs = root.join(std::ffi::OsStr::from_bytes(&dir));
        let mut names: Vec<Vec<u8>> = fs::read_dir(&abs)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_vec())
            .collect();
        names.sort();
        for name in names {
            let rel = if dir.is_empty() {
                name
            } else {
                [dir.as_slice(), b"/", &name].concat()
            };
            let path = root.join(std::ffi::OsStr::from_bytes(&rel));
            let meta = fs::symlink_metadata(&path).unwrap();
            let mtime = (meta.mtime(), meta.mtime_nsec());
            let node = if meta.is_dir() {
                stack.push(rel.clone());
                Node::Dir {
                    mode: meta.mode() & 0o7777,
                    mtime,
                }
            } else if meta.file_type().is_symlink() {
                Node::Symlink {
                    target: fs::read_link(&path).unwrap().into_os_string().into_vec(),
                }
            } else {
                let link_of = if meta.nlink() > 1 {
                    match inodes.get(&meta.ino()) {
                        Some(first) => Some(first.clone()),
                        None => {
                            inodes.insert(meta.ino(), rel.clone());
                            None
                        }
                    }
                } else {
                    None
                };
                Node::File {
                    mode: meta.mode() & 0o7777,
                    mtime,
                    data: fs::read(&path).unwrap(),
                    link_of,
                    sparse: meta.blocks() * 512 < meta.len(),
                }
            };
            out.insert(rel, node);
        }
    }
    out
}

/// Compares two captures, naming the first difference (hard links: the walk order is the
/// same on both sides, so the first link of each inode is the same path).
pub(super) fn assert_same(expected: &BTreeMap<Vec<u8>, Node>, got: &BTreeMap<Vec<u8>, Node>) {
    let names = |m: &BTreeMap<Vec<u8>, Node>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(expected)
            .iter()
            .map(|p| String::from_utf8_lossy(p).to_string())
            .collect::<Vec<_>>(),
        names(got)
            .iter()
            .map(|p| String::from_utf8_lossy(p).to_string())
            .collect::<Vec<_>>(),
        "the same paths"
    );
    for (path, node) in expected {
        let other = &got[path];
        let show = String::from_utf8_lossy(path);
        match (node, other) {
            (
                Node::File {
                    sparse: true, data, ..
                },
                Node::File {
                    sparse: restored_sparse,
                    data: restored,
                    ..
                },
            ) => {
                assert!(data == restored, "`{show}`: same bytes");
                assert!(*restored_sparse, "`{show}`: a sparse file stays sparse");
                let strip = |n: &Node| match n {
                    Node::File {
                        mode,
                        mtime,
                        link_of,
                        ..
                    } => (*mode, *mtime, link_of.clone()),
                    _ => unreachable!(),
                };
                assert_eq!(strip(node), strip(other), "`{show}`: metadata");
            }
            _ => assert!(node == other, "`{show}`: {node:?} != {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Random trees

const NAMES: &[&[u8]] = &[
    b"a",
    b"b.txt",
    b"with space",
    b"-dash",
    b".hidden",
    b"new\nline",
    b"\xff\xfe not utf-8",
    "caf\u{e9} \u{1f600}".as_bytes(),
    b"back\\slash",
    b"q'uo\"te",
    b"node_modules",
    b"x",
];

#[derive(Debug, Clone)]
pub(super) enum Op {
    Dir {
        parent: usize,
        name: usize,
        mode: u32,
    },
    File {
        parent: usize,
        name: usize,
        mode: u32,
        data: Data,
    },
    Sparse {
        parent: usize,
        name: usize,
        /// Offsets (in KiB) of the few data pieces in a 3 MiB file.
        pieces: Vec<u32>,
    },
    Symlink {
        parent: usize,
        name: usize,
        target: usize,
    },
    HardLink {
        parent: usize,
        name: usize,
        file: usize,
    },
}

#[derive(Debug, Clone)]
pub(super) enum Data {
    Small(Vec<u8>),
    /// A file larger than a chunk, from a seed.
    Big {
        len: u32,
        seed: u8,
    },
}

const TARGETS: &[&[u8]] = &[
    b"a",
    b"../b.txt",
    b"/etc/passwd",
    b"../../../../outside",
    b"dangling/nowhere",
    b".",
    b"x/../a",
];

fn data() -> impl Strategy<Value = Data> {
    prop_oneof![
        8 => proptest::collection::vec(any::<u8>(), 0..3000).prop_map(Data::Small),
        1 => ((1u32 << 20)..(5u32 << 19), any::<u8>()).prop_map(|(len, seed)| Data::Big { len, seed }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let idx = 0usize..64;
    let name = 0..NAMES.len();
    prop_oneof![
        3 => (idx.clone(), name.clone(), prop::sample::select(vec![0o755u32, 0o700, 0o750, 0o1777]))
            .prop_map(|(parent, name, mode)| Op::Dir { parent, name, mode }),
        6 => (idx.clone(), name.clone(), prop::sample::select(vec![0o644u32, 0o600, 0o755, 0o444, 0o640]), data())
            .prop_map(|(parent, name, mode, data)| Op::File { parent, name, mode, data }),
        1 => (idx.clone(), name.clone(), proptest::collection::vec(0u32..3072, 1..4))
            .prop_map(|(parent, name, pieces)| Op::Sparse { parent, name, pieces }),
        2 => (idx.clone(), name.clone(), 0..TARGETS.len())
            .prop_map(|(parent, name, target)| Op::Symlink { parent, name, target }),
        1 => (idx.clone(), name.clone(), idx)
            .prop_map(|(parent, name, file)| Op::HardLink { parent, name, file }),
    ]
}

pub(super) fn big(len: u32, seed: u8) -> Vec<u8> {
    // Compressible in places, random in others, so both codecs are used.
    let mut x = u64::from(seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|i| {
            if (i / 4096) % 2 == 0 {
                (i % 251) as u8
            } else {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            }
        })
        .collect()
}

/// Builds the tree of `ops` under `root`; returns the mtimes to set last (directories).
pub(super) fn build(root: &Path, ops: &[Op]) {
    let mut dirs: Vec<PathBuf> = vec![root.to_path_buf()];
    let mut files: Vec<PathBuf> = Vec::new();
    let mut dir_modes: Vec<(PathBuf, u32)> = Vec::new();
    let mut stamp = 1_600_000_000i64;
    let mut next_mtime = || {
        stamp += 7777;
        UNIX_EPOCH + Duration::new(stamp as u64, (stamp as u32 % 1000) * 1_000_001)
    };
    for op in ops {
        let (parent, name) = match op {
            Op::Dir { parent, name, .. }
            | Op::File { parent, name, .. }
            | Op::Sparse { parent, name, .. }
            | Op::Symlink { parent, name, .. }
            | Op::HardLink { parent, name, .. } => (*parent, *name),
        };
        let path = dirs[parent % dirs.len()].join(std::ffi::OsStr::from_bytes(NAMES[name]));
        if fs::symlink_metadata(&path).is_ok() {
            continue;
        }
        match op {
            Op::Dir { mode, .. } => {
                fs::create_dir(&path).unwrap();
                dir_modes.push((path.clone(), *mode));
                dirs.push(path);
            }
            Op::File { mode, data, .. } => {
                let bytes = match data {
                    Data::Small(b) => b.clone(),
                    Data::Big { len, seed } => big(*len, *seed),
                };
                fs::write(&path, bytes).unwrap();
                fs::set_permissions(&path, fs::Permissions::from_mode(*mode)).unwrap();
                let f = fs::File::options().write(true).open(&path);
                if let Ok(f) = f {
                    f.set_modified(next_mtime()).unwrap();
                }
                files.push(path);
            }
            Op::Sparse { pieces, .. } => {
                let f = fs::File::create(&path).unwrap();
                f.set_len(3 << 20).unwrap();
                for p in pieces {
                    use std::os::unix::fs::FileExt;
                    f.write_all_at(&[0xab; 1000], u64::from(*p) * 1024).unwrap();
                }
                f.set_modified(next_mtime()).unwrap();
                files.push(path);
            }
            Op::Symlink { target, .. } => {
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(TARGETS[*target]), &path)
                    .unwrap();
            }
            Op::HardLink { file, .. } => {
                if files.is_empty() {
                    continue;
                }
                fs::hard_link(&files[file % files.len()], &path).unwrap();
            }
        }
    }
    // Directory modes and mtimes last, deepest first.
    for (dir, mode) in dir_modes.iter().rev() {
        fs::File::open(dir)
            .unwrap()
            .set_modified(next_mtime())
            .unwrap();
        fs::set_permissions(dir, fs::Permissions::from_mode(*mode)).unwrap();
    }
}

pub(super) fn tree() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), 0..40)
}

/// A random edit of a tree that exists (by index into its files and directories).
#[derive(Debug, Clone)]
pub(super) enum Edit {
    /// Rewrite a file with other bytes.
    Rewrite {
        file: usize,
        data: Data,
    },
    /// Same length and mtime, other bytes: only the ctime says it changed.
    Sneaky {
        file: usize,
        byte: u8,
    },
    /// Append bytes.
    Append {
        file: usize,
        len: u16,
    },
    Remove {
        file: usize,
    },
    Chmod {
        file: usize,
        mode: u32,
    },
    Add(Op),
}

pub(super) fn edit() -> impl Strategy<Value = Edit> {
    let idx = 0usize..64;
    prop_oneof![
        (idx.clone(), data()).prop_map(|(file, data)| Edit::Rewrite { file, data }),
        (idx.clone(), any::<u8>()).prop_map(|(file, byte)| Edit::Sneaky { file, byte }),
        (idx.clone(), 1u16..5000).prop_map(|(file, len)| Edit::Append { file, len }),
        idx.clone().prop_map(|file| Edit::Remove { file }),
        (idx, prop::sample::select(vec![0o600u32, 0o755, 0o444]))
            .prop_map(|(file, mode)| Edit::Chmod { file, mode }),
        op().prop_map(Edit::Add),
    ]
}

pub(super) fn regular_files(root: &Path) -> Vec<PathBuf> {
    capture(root)
        .into_iter()
        .filter(|(_, n)| matches!(n, Node::File { .. }))
        .map(|(p, _)| root.join(std::ffi::OsStr::from_bytes(&p)))
        .collect()
}

pub(super) fn apply(root: &Path, edit: &Edit) {
    let files = regular_files(root);
    let pick = |i: usize| files.get(i % files.len().max(1)).cloned();
    let writable = |p: &Path| {
        let mode = fs::metadata(p).unwrap().permissions().mode();
        fs::set_permissions(p, fs::Permissions::from_mode(mode | 0o200)).unwrap();
        mode
    };
    match edit {
        Edit::Rewrite { file, data } => {
            if let Some(p) = pick(*file) {
                let mode = writable(&p);
                let bytes = match data {
                    Data::Small(b) => b.clone(),
                    Data::Big { len, seed } => big(*len, *seed),
                };
                fs::write(&p, bytes).unwrap();
                fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
            }
        }
        Edit::Sneaky { file, byte } => {
            if let Some(p) = pick(*file) {
                let meta = fs::metadata(&p).unwrap();
                if meta.len() == 0 {
                    return;
                }
                let mode = writable(&p);
                use std::os::unix::fs::FileExt;
                let f = fs::File::options().write(true).open(&p).unwrap();
                let mut b = [0u8];
                fs::File::open(&p)
                    .unwrap()
                    .read_exact_at(&mut b, 0)
                    .unwrap();
                f.write_all_at(&[b[0] ^ byte.max(&1)], 0).unwrap();
                f.set_modified(meta.modified().unwrap()).unwrap();
                fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
            }
        }
        Edit::Append { file, len } => {
            if let Some(p) = pick(*file) {
                let mode = writable(&p);
                use std::io::Write;
                fs::File::options()
                    .append(true)
                    .open(&p)
                    .unwrap()
                    .write_all(&vec![b'+'; usize::from(*len)])
                    .unwrap();
                fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
            }
        }
        Edit::Remove { file } => {
            if let Some(p) = pick(*file) {
                fs::remove_file(p).unwrap();
            }
        }
        Edit::Chmod { file, mode } => {
            if let Some(p) = pick(*file) {
                fs::set_permissions(p, fs::Permissions::from_mode(*mode)).unwrap();
            }
        }
        Edit::Add(op) => build(root, std::slice::from_ref(op)),
    }
}

/// Makes every directory below `root` writable again, so the temp dir can be removed.
pub(super) fn unlock(root: &Path) {
    let _ = std::process::Command::new("chmod")
        .args(["-R", "u+rwx"])
        .arg(root)
        .status();
}

pub(super) fn restore_into(
    cas: &Cas,
    manifest: &Manifest,
    dest: &Path,
) -> Result<Manifest, CasError> {
    fs::create_dir(dest).unwrap();
    let _lock = cas.lock(false)?;
    cas.restore(manifest, dest)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::support::proptest_cases(24, 128), ..ProptestConfig::default() })]

    /// Snapshot → restore gives the same tree, byte for byte and metadata for metadata.
    #[test]
    fn random_trees_restore_identical(ops in tree()) {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        fs::create_dir(&ws).unwrap();
        build(&ws, &ops);
        let cas = Cas::open(dir.path().join("cas")).unwrap();
        let expected = capture(&ws);
        let (manifest, stats) = {
            let _lock = cas.lock(false).unwrap();
            cas.pack(&ws, None).unwrap()
        };
        prop_assert!(stats.omitted.is_empty(), "{:?}", stats.omitted);
        let manifest = Manifest::decode(&manifest.encode()).unwrap();
        let dest = dir.path().join("restored");
        restore_into(&cas, &manifest, &dest).unwrap();
        assert_same(&expected, &capture(&dest));
        unlock(dir.path());
    }

    /// A sequence of snapshots, each after random edits of the restored previous one (with the
    /// index the restore left, so unchanged files are not read): every snapshot restores to
    /// exactly the tree it was taken of.
    #[test]
    fn snapshot_sequences_restore_each_exactly(
        ops in tree(),
        rounds in proptest::collection::vec(proptest::collection::vec(edit(), 1..6), 1..4),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let cas = Cas::open(dir.path().join("cas")).unwrap();
        let mut ws = dir.path().join("ws0");
        fs::create_dir(&ws).unwrap();
        build(&ws, &ops);
        let mut taken: Vec<(Manifest, BTreeMap<Vec<u8>, Node>)> = Vec::new();
        let mut index: Option<Index> = None;
        for (round, edits) in rounds.iter().enumerate() {
            let expected = capture(&ws);
            let (manifest, _) = {
                let _lock = cas.lock(false).unwrap();
                cas.pack(&ws, index.as_ref()).unwrap()
            };
            taken.push((manifest.clone(), expected));
            // The next sandbox: restored from it, its index written, then edited.
            let next = dir.path().join(format!("ws{}", round + 1));
            let restored = restore_into(&cas, &manifest, &next).unwrap();
            let index_path = dir.path().join(format!("index{round}"));
            Index::write(&index_path, &restored).unwrap();
            index = Index::read(&index_path);
            prop_assert!(index.is_some());
            for e in edits {
                apply(&next, e);
            }
            ws = next;
        }
        for (i, (manifest, expected)) in taken.iter().enumerate() {
            let dest = dir.path().join(format!("check{i}"));
            restore_into(&cas, manifest, &dest).unwrap();
            assert_same(expected, &capture(&dest));
        }
        unlock(dir.path());
    }
}

/// An unchanged file restored from a snapshot is not read again by the next one; a changed one
/// (even with the same size and mtime) is.
#[test]
fn the_index_skips_unchanged_files_and_catches_sneaky_changes() {
    let dir = tempfile::tempdir().unwrap();
    let cas = Cas::open(dir.path().join("cas")).unwrap();
    let ws = dir.path().join("ws");
    fs::create_dir(&ws).unwrap();
    for i in 0..50 {
        fs::write(ws.join(format!("f{i}")), format!("file {i}")).unwrap();
    }
    let (m1, s1) = cas.pack(&ws, None).unwrap();
    assert_eq!(s1.files_read, 50);
    let next = dir.path().join("next");
    let restored = restore_into(&cas, &m1, &next).unwrap();
    // Past the timestamp tick of the restore, so no entry is racy.
    std::thread::sleep(Duration::from_millis(30));
    Index::write(&dir.path().join("index"), &restored).unwrap();
    let index = Index::read(&dir.path().join("index")).unwrap();
    let (m2, s2) = cas.pack(&next, Some(&index)).unwrap();
    assert_eq!((s2.files_read, s2.objects_written), (0, 0));
    assert_eq!(m2.entries.len(), m1.entries.len());
    // Same length, same mtime, other bytes: the ctime gives it away.
    let f = next.join("f7");
    let mtime = fs::metadata(&f).unwrap().modified().unwrap();
    fs::write(&f, "file X").unwrap();
    fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let (m3, s3) = cas.pack(&next, Some(&index)).unwrap();
    assert_eq!(s3.files_read, 1);
    let again = dir.path().join("again");
    restore_into(&cas, &m3, &again).unwrap();
    assert_eq!(fs::read(again.join("f7")).unwrap(), b"file X");
}

/// A file long enough to be read in parts (by both threads) restores byte for byte with its
/// chunks in order; appending to it stores only the new chunks, and so does the same file in
/// another workspace.
#[test]
fn a_file_read_in_parts_restores_in_order_and_an_append_stores_only_new_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let cas = Cas::open(dir.path().join("cas")).unwrap();
    let ws = dir.path().join("ws");
    fs::create_dir(&ws).unwrap();
    // 19.5 MiB: two whole parts of 8 MiB and a tail; every MiB differs.
    let mut data = Vec::new();
    for mib in 0..19u32 {
        data.extend(big(1 << 20, mib as u8 + 1));
    }
    data.extend(big(1 << 19, 99));
    fs::write(ws.join("large"), &data).unwrap();
    fs::write(ws.join("small"), "s").unwrap();
    let (m1, s1) = cas.pack(&ws, None).unwrap();
    assert_eq!(s1.files_read, 2, "a file read in parts counts once");
    assert_eq!(s1.bytes_read, data.len() as u64 + 1);
    assert_eq!(s1.objects_written, 21);
    let chunks = m1
        .entries
        .iter()
        .find_map(|e| match &e.kind {
            EntryKind::File { chunks, .. } if e.path == b"large" => Some(chunks.clone()),
            _ => None,
        })
        .unwrap();
    let offsets: Vec<u64> = chunks.iter().map(|c| c.offset).collect();
    let expected: Vec<u64> = (0..20u64).map(|i| i << 20).collect();
    assert_eq!(offsets, expected);
    let back = dir.path().join("back");
    restore_into(&cas, &m1, &back).unwrap();
    assert_eq!(fs::read(back.join("large")).unwrap(), data);

    let mut more = big(1 << 20, 200);
    fs::OpenOptions::new()
        .append(true)
        .open(ws.join("large"))
        .unwrap()
        .write_all(&more)
        .unwrap();
    let (m2, s2) = cas.pack(&ws, None).unwrap();
    // The old tail chunk grew, and one new chunk follows it.
    assert_eq!(s2.objects_written, 2, "{s2:?}");
    data.append(&mut more);
    let again = dir.path().join("again");
    restore_into(&cas, &m2, &again).unwrap();
    assert_eq!(fs::read(again.join("large")).unwrap(), data);
}

/// A manifest entry that would escape or write through a symlink is refused before anything
/// is created.
#[test]
fn hostile_manifests_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cas = Cas::open(dir.path().join("cas")).unwrap();
    // Something outside the target to write into or over: it must stay as it is.
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("victim"), "original").unwrap();
    let outside_bytes = outside.as_os_str().as_bytes().to_vec();
    let symlink = |target: &[u8]| EntryKind::Symlink {
        target: target.to_vec(),
    };
    let entry = |path: &[u8], kind: EntryKind| taskbox::snapshot_store::cas::Entry {
        path: path.to_vec(),
        mode: 0o644,
        mtime_ns: 0,
        meta: None,
        kind,
    };
    let file = || EntryKind::File {
        size: 0,
        stat: Default::default(),
        chunks: Vec::new(),
    };
    let cases: Vec<Vec<taskbox::snapshot_store::cas::Entry>> = vec![
        vec![entry(b"../evil", file())],
        vec![entry(b"/etc/evil", file())],
        vec![entry(b"a/./b", file())],
        vec![
            entry(b"l", symlink(&outside_bytes)),
            entry(b"l/evil", file()),
        ],
        vec![
            entry(b"l", symlink(&outside_bytes)),
            entry(b"l/victim", file()),
        ],
        // `..` from the target is the directory that holds it (and `outside`).
        vec![entry(b"up", symlink(b"..")), entry(b"up/evil", file())],
        vec![
            entry(b"up", symlink(b"..")),
            entry(b"up/outside/victim", file()),
        ],
        vec![
            entry(b"a", EntryKind::Dir),
            entry(b"a/b", symlink(b"../..")),
            entry(b"a/b/evil", file()),
        ],
        vec![entry(b"nodir/evil", file())],
        vec![entry(b"f", file()), entry(b"f", file())],
        vec![entry(
            b"h",
            EntryKind::HardLink {
                target: b"/etc/passwd".to_vec(),
            },
        )],
    ];
    for (i, entries) in cases.into_iter().enumerate() {
        let dest = dir.path().join(format!("d{i}"));
        // The target, and the store's lock file (made on first use).
        let own = [dest.clone(), dir.path().join("cas/lock")];
        let untouched = tree_state(dir.path(), &own);
        let result = restore_into(
            &cas,
            &Manifest {
                root: None,
                entries,
            },
            &dest,
        );
        // First what the refusal did to the files around the target (whatever the error
        // says): nothing. The target itself is left empty.
        assert_untouched(
            &format!("case {i}"),
            &untouched,
            &tree_state(dir.path(), &own),
        );
        assert_eq!(
            fs::read_dir(&dest).unwrap().count(),
            0,
            "case {i}: nothing created"
        );
        match result {
            Err(CasError::UnsafeEntry { .. }) => {}
            other => panic!("case {i}: expected a refusal, got {other:?}"),
        }
    }
    assert_eq!(
        fs::read_to_string(outside.join("victim")).unwrap(),
        "original"
    );
}

/// Through the provider: a corrupt content fails the restore (permanently, the manifest kept);
/// a missing one is "snapshot gone"; gc keeps what a retained snapshot refers to and sweeps the
/// rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_content_fails_the_restore_and_missing_content_is_gone() {
    let env = Env::new();
    let sb = env.create("c", 1, None).await;
    env.run(
        &sb,
        "echo precious > keep.txt; head -c 300000 /dev/urandom > blob",
    )
    .await;
    let s1 = env
        .provider
        .snapshot(&taskbox::ids::TaskId::new("c").unwrap(), &sb, 1)
        .await
        .unwrap();
    let manifest_file = env
        .root()
        .join("snapshots/c")
        .join(format!("1.{}.tbx", s1.id.rsplit('.').next().unwrap()));
    assert!(manifest_file.exists());
    let cas = Cas::open(env.root().join("cas")).unwrap();
    assert_eq!(cas.catalog().unwrap().len(), 2, "one chunk per file");
    // One pack (two threads, but the small file may land in either): flip a byte inside the
    // blob's stored bytes (random data, stored raw), which is most of the packs' bytes.
    let packs: Vec<PathBuf> = fs::read_dir(env.root().join("cas/packs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pack"))
        .collect();
    let blob = packs
        .iter()
        .max_by_key(|p| fs::metadata(p).unwrap().len())
        .unwrap()
        .clone();
    let mut bytes = fs::read(&blob).unwrap();
    let n = bytes.len();
    bytes[n - 100] ^= 0x40;
    fs::write(&blob, &bytes).unwrap();
    let msg = assert_kind(
        env.try_create("c", 2, Some(s1.id.as_str()), 60_000).await,
        FailureKind::Permanent,
    );
    assert!(msg.contains("corrupt"), "{msg}");
    assert!(manifest_file.exists(), "the snapshot record is kept");
    assert!(env.tmp_entries().is_empty(), "nothing half-restored left");
    // Missing: definitely gone.
    for pack in &packs {
        fs::remove_file(pack).unwrap();
    }
    let msg = assert_kind(
        env.try_create("c", 2, Some(s1.id.as_str()), 60_000).await,
        FailureKind::SnapshotGone,
    );
    assert!(msg.contains("missing"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_gc_sweeps_only_what_no_snapshot_refers_to() {
    let env = Env::new();
    let task = taskbox::ids::TaskId::new("g").unwrap();
    let sb = env.create("g", 1, None).await;
    // The chunk that dies is most of its pack's bytes, whichever pack it shares: swept either
    // way (a pack mostly live is kept whole until it is mostly dead).
    env.run(
        &sb,
        "echo shared > shared; head -c 100000 /dev/urandom > only-first",
    )
    .await;
    let s1 = env.provider.snapshot(&task, &sb, 1).await.unwrap();
    let sb = env.create("g", 2, Some(s1.id.as_str())).await;
    env.run(&sb, "rm only-first; echo second > only-second")
        .await;
    let s2 = env.provider.snapshot(&task, &sb, 2).await.unwrap();
    let count = |root: &Path| {
        Cas::open(root.join("cas"))
            .unwrap()
            .catalog()
            .unwrap()
            .len()
    };
    assert_eq!(count(&env.root()), 3);
    // Nothing is swept while both are retained.
    assert_eq!(env.provider.gc_content().unwrap().swept, 0);
    env.provider.delete_snapshot(&snap(&s1.id)).await.unwrap();
    let stats = env.provider.gc_content().unwrap();
    assert_eq!((stats.swept, count(&env.root())), (1, 2));
    let sb = env.create("g", 3, Some(s2.id.as_str())).await;
    let out = env.run(&sb, "cat shared only-second").await;
    assert_eq!(out.stdout, "shared\nsecond\n");
}

/// A content stored by a snapshot whose manifest is not written yet is never swept: gc waits
/// for the store's lock, which the snapshot holds shared until its manifest is in place.
#[test]
fn gc_waits_for_a_snapshot_in_progress() {
    let dir = tempfile::tempdir().unwrap();
    let cas = Cas::open(dir.path().join("cas")).unwrap();
    let ws = dir.path().join("ws");
    fs::create_dir(&ws).unwrap();
    fs::write(ws.join("f"), "in flight").unwrap();
    let writer = cas.lock(false).unwrap();
    let (manifest, _) = cas.pack(&ws, None).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let cas2 = cas.clone();
    let gc = std::thread::spawn(move || {
        // Marks nothing: the manifest is not anywhere gc looks.
        let stats = cas2.gc(|_| Ok(())).unwrap();
        tx.send(stats).unwrap();
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "gc must wait for the snapshot"
    );
    // The snapshot "writes its manifest" (here: restores from it) before letting go.
    let dest = dir.path().join("dest");
    fs::create_dir(&dest).unwrap();
    cas.restore(&manifest, &dest).unwrap();
    drop(writer);
    let stats = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    gc.join().unwrap();
    assert_eq!(stats.swept, 1, "unreferenced once the writer is done");
    assert_eq!(fs::read(dest.join("f")).unwrap(), b"in flight");
}

/// A damaged pack index neither blocks new snapshots nor lets gc delete its pack, and the
/// restore that needs its chunks fails as corrupt (the snapshot kept), not as "gone".
#[test]
fn an_unreadable_pack_index_is_kept_and_never_taken_for_missing_content() {
    let dir = tempfile::tempdir().unwrap();
    let cas = Cas::open(dir.path().join("cas")).unwrap();
    let ws = dir.path().join("ws");
    fs::create_dir(&ws).unwrap();
    fs::write(ws.join("f"), "precious").unwrap();
    let (m1, _) = cas.pack(&ws, None).unwrap();
    let idx: Vec<PathBuf> = fs::read_dir(dir.path().join("cas/packs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "idx"))
        .collect();
    assert_eq!(idx.len(), 1);
    let mut bytes = fs::read(&idx[0]).unwrap();
    bytes.pop();
    fs::write(&idx[0], &bytes).unwrap();
    match restore_into(&cas, &m1, &dir.path().join("r1")) {
        Err(CasError::ContentCorrupt { reason, .. }) => {
            assert!(reason.contains("unreadable"), "{reason}")
        }
        other => panic!("expected corrupt, got {other:?}"),
    }
    // Snapshots still work (the content is stored again), and gc keeps the damaged pack.
    fs::write(ws.join("g"), "more").unwrap();
    let (m2, _) = cas.pack(&ws, None).unwrap();
    let stats = cas.gc(|live| {
        live.extend(m2.hashes().copied());
        Ok(())
    });
    assert!(stats.is_ok(), "{stats:?}");
    let pack = idx[0].with_extension("pack");
    assert!(pack.exists(), "the pack of an unreadable index is kept");
    restore_into(&cas, &m2, &dir.path().join("r2")).unwrap();
    assert_eq!(fs::read(dir.path().join("r2/f")).unwrap(), b"precious");
}
