//! Malicious archives: hand-made tar files that try to write outside the workspace are refused
//! and write nothing, while well-formed archives with inner links are accepted.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use taskbox::core::FailureKind;
use taskbox::provider::{sandbox_name, SandboxProvider};
use taskbox::snapshot_store::archive::{self, ArchiveHeader};

use super::{assert_kind, assert_untouched, tree_state, Env, INSTALLATION, START_MS};

/// One raw tar entry, written without the `tar` crate's own path checks.
struct Raw<'a> {
    kind: tar::EntryType,
    path: &'a [u8],
    link: Option<&'a [u8]>,
    data: &'a [u8],
}

fn file<'a>(path: &'a str, data: &'a str) -> Raw<'a> {
    Raw {
        kind: tar::EntryType::Regular,
        path: path.as_bytes(),
        link: None,
        data: data.as_bytes(),
    }
}

fn link<'a>(kind: tar::EntryType, path: &'a str, target: &'a str) -> Raw<'a> {
    Raw {
        kind,
        path: path.as_bytes(),
        link: Some(target.as_bytes()),
        data: b"",
    }
}

fn dir(path: &str) -> Raw<'_> {
    Raw {
        kind: tar::EntryType::Directory,
        path: path.as_bytes(),
        link: None,
        data: b"",
    }
}

/// Writes a hand-made archive as snapshot `<task>.s1` of `env`.
fn plant_archive(env: &Env, task: &str, entries: &[Raw<'_>]) {
    plant_archive_version(env, task, entries, archive::TAR_VERSION);
}

/// Writes a hand-made archive of format `version` as snapshot `<task>.s1` of `env`.
fn plant_archive_version(env: &Env, task: &str, entries: &[Raw<'_>], version: u32) {
    let mut tar = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(entry.kind);
        header.set_size(entry.data.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        let gnu = header.as_gnu_mut().unwrap();
        gnu.name[..entry.path.len()].copy_from_slice(entry.path);
        if let Some(target) = entry.link {
            gnu.linkname[..target.len()].copy_from_slice(target);
        }
        header.set_cksum();
        tar.append(&header, entry.data).unwrap();
    }
    let tar = tar.into_inner().unwrap();
    let mut bytes = Vec::new();
    archive::write_prefix(
        &mut bytes,
        &ArchiveHeader {
            task_id: task.to_string(),
            seq: 1,
            installation_id: INSTALLATION.to_string(),
            created_at: START_MS,
            source_sandbox: sandbox_name(INSTALLATION, task, 1),
            generation: Some(1),
            instance: None,
            nonce: None,
            cwd: None,
        },
    )
    .unwrap();
    bytes[8..12].copy_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(&zstd::encode_all(tar.as_slice(), 3).unwrap());
    let dir = env.root().join("snapshots").join(task);
    fs::create_dir_all(&dir).unwrap();
    fs::File::create(dir.join("1.tbx"))
        .and_then(|mut f| f.write_all(&bytes))
        .unwrap();
}

/// Every file below `dir`, symlinks not followed.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if fs::symlink_metadata(&path).unwrap().is_dir() {
                stack.push(path.clone());
            }
            found.push(path);
        }
    }
    found.sort();
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_archives_are_refused_and_write_nothing_outside() {
    use tar::EntryType::{Block, Char, Directory, Fifo, Link, Symlink};
    let env = Env::new();
    let outside = env.outside();
    let outside_str = outside.to_str().unwrap().to_string();
    let through_abs = format!("{outside_str}/evil");
    // Something outside to overwrite: a write through a link must leave it as it is.
    fs::write(outside.join("victim"), "original").unwrap();
    let before = tree(env.dir.path());
    let cases: Vec<(&str, Vec<Raw<'_>>, &str)> = vec![
        (
            "dotdot",
            vec![file("ok", "x"), file("../evil", "x")],
            "../evil",
        ),
        (
            "dotdot-deep",
            vec![file("a/../../evil", "x")],
            "a/../../evil",
        ),
        ("absolute", vec![file(&through_abs, "x")], "evil"),
        (
            "abs-symlink-then-write",
            vec![link(Symlink, "etc", &outside_str), file("etc/evil", "x")],
            "etc",
        ),
        (
            "abs-symlink-then-overwrite",
            vec![
                link(Symlink, "etc", &outside_str),
                file("etc/victim", "overwritten"),
            ],
            "etc",
        ),
        (
            // `..` from the workspace is the provider's own directory of workspaces.
            "parent-symlink-then-write",
            vec![link(Symlink, "up", ".."), file("up/evil", "x")],
            "up",
        ),
        (
            "mid-path-parent-symlink",
            vec![
                dir("a"),
                link(Symlink, "a/b", "../.."),
                file("a/b/evil", "x"),
            ],
            "a/b",
        ),
        (
            "inner-symlink-then-write",
            vec![dir("sub"), link(Symlink, "s", "sub"), file("s/evil", "x")],
            "s/evil",
        ),
        (
            "dot-symlink-then-write",
            vec![link(Symlink, "here", "."), file("here/evil", "x")],
            "here/evil",
        ),
        (
            // A symlink in the middle of a path: nothing may be created below it.
            "mid-path-symlink",
            vec![
                dir("a"),
                link(Symlink, "a/b", &outside_str),
                file("a/b/c/evil", "x"),
            ],
            "a/b",
        ),
        (
            "mid-path-symlink-dir-entry",
            vec![dir("a"), link(Symlink, "a/b", &outside_str), dir("a/b/c")],
            "a/b",
        ),
        (
            "symlink-then-hardlink-below",
            vec![
                file("f", "x"),
                link(Symlink, "d", &outside_str),
                link(Link, "d/h", "f"),
            ],
            "d",
        ),
        (
            "hardlink-out",
            vec![link(Link, "h", "../../../../../../etc/passwd")],
            "h",
        ),
        ("hardlink-abs", vec![link(Link, "h", "/etc/passwd")], "h"),
        (
            "hardlink-through-symlink",
            vec![
                link(Symlink, "l", "."),
                file("f", "x"),
                link(Link, "h", "l/f"),
            ],
            "h",
        ),
        (
            "fifo",
            vec![Raw {
                kind: Fifo,
                path: b"pipe",
                link: None,
                data: b"",
            }],
            "pipe",
        ),
        (
            "char-device",
            vec![Raw {
                kind: Char,
                path: b"null",
                link: None,
                data: b"",
            }],
            "null",
        ),
        (
            "block-device",
            vec![Raw {
                kind: Block,
                path: b"sda",
                link: None,
                data: b"",
            }],
            "sda",
        ),
        (
            "duplicate",
            vec![file("f", "one"), link(Symlink, "f", "/etc/passwd")],
            "f",
        ),
        (
            "file-then-dir-through-it",
            vec![
                file("f", "x"),
                Raw {
                    kind: Directory,
                    path: b"f/d",
                    link: None,
                    data: b"",
                },
            ],
            "f/d",
        ),
    ];
    let snapshots = env.root().join("snapshots");
    for (task, entries, named) in &cases {
        plant_archive(&env, task, entries);
        let untouched = tree_state(env.dir.path(), std::slice::from_ref(&snapshots));
        let result = env
            .try_create(task, 2, Some(&format!("{task}.s1")), 60_000)
            .await;
        // First what the refusal did to the files (whatever the error says): nothing.
        assert_untouched(
            task,
            &untouched,
            &tree_state(env.dir.path(), std::slice::from_ref(&snapshots)),
        );
        let msg = assert_kind(result, FailureKind::Permanent);
        assert!(msg.contains("refused archive entry"), "{task}: {msg}");
        assert!(msg.contains(named), "{task}: `{named}` not named in: {msg}");
        assert!(
            env.provider
                .workspace_path(&sandbox_name(INSTALLATION, task, 2))
                .is_none(),
            "{task}: a sandbox was created"
        );
        assert!(env.tmp_entries().is_empty(), "{task}: temporaries left");
    }
    // Nothing appeared anywhere outside the provider's own directories.
    let after: Vec<PathBuf> = tree(env.dir.path())
        .into_iter()
        .filter(|p| !p.starts_with(env.root().join("snapshots")))
        .collect();
    let before: Vec<PathBuf> = before
        .into_iter()
        .filter(|p| !p.starts_with(env.root().join("snapshots")))
        .collect();
    assert_eq!(after, before);
    assert_eq!(
        fs::read_to_string(outside.join("victim")).unwrap(),
        "original"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn well_formed_foreign_archives_with_inner_links_are_accepted() {
    use tar::EntryType::{Link, Symlink};
    let env = Env::new();
    plant_archive(
        &env,
        "fine",
        &[
            file("bin/tool", "#!/bin/sh\n"),
            link(Symlink, "node_modules/.bin/tool", "../../bin/tool"),
            link(Symlink, "up", "bin/.."),
            link(Link, "copy", "bin/tool"),
            file("./nested/deep/file", "deep"),
        ],
    );
    let id = env.create("fine", 2, Some("fine.s1")).await;
    let ws = env.provider.workspace_path(&id).unwrap();
    assert_eq!(
        fs::read_to_string(ws.join("node_modules/.bin/tool")).unwrap(),
        "#!/bin/sh\n"
    );
    assert_eq!(fs::read_to_string(ws.join("copy")).unwrap(), "#!/bin/sh\n");
    assert_eq!(
        fs::read_to_string(ws.join("nested/deep/file")).unwrap(),
        "deep"
    );
    assert!(ws.join("up/bin/tool").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_symlinks_are_restored_verbatim_and_never_written_through() {
    use tar::EntryType::Symlink;
    let env = Env::new();
    let outside = env.outside();
    let outside_str = outside.to_str().unwrap().to_string();
    fs::write(outside.join("victim"), "original").unwrap();
    plant_archive(
        &env,
        "links",
        &[
            link(Symlink, "up", ".."),
            link(Symlink, "abs", &outside_str),
            dir("a"),
            link(Symlink, "a/root", ".."),
            link(Symlink, "escape", "a/root/.."),
            link(Symlink, "p", "q"),
            link(Symlink, "q", "p"),
            link(Symlink, "dangling", "no/such/file"),
            // Files after the links, below real directories of the same names' parents.
            file("a/after", "kept"),
        ],
    );
    let snapshots = env.root().join("snapshots");
    let untouched = tree_state(env.dir.path(), std::slice::from_ref(&snapshots));
    let id = env.create("links", 2, Some("links.s1")).await;
    let ws = env.provider.workspace_path(&id).unwrap();
    for (link, target) in [
        ("up", ".."),
        ("abs", outside_str.as_str()),
        ("a/root", ".."),
        ("escape", "a/root/.."),
        ("p", "q"),
        ("q", "p"),
        ("dangling", "no/such/file"),
    ] {
        assert_eq!(
            fs::read_link(ws.join(link)).unwrap(),
            Path::new(target),
            "`{link}` is restored verbatim"
        );
    }
    assert_eq!(fs::read_to_string(ws.join("a/after")).unwrap(), "kept");
    // Nothing was written through any of them: outside the new sandbox's own directory (its
    // workspace and records), every path is as it was.
    let own = env.root().join("tasks/links");
    assert!(ws.starts_with(&own), "{}", ws.display());
    let after = tree_state(env.dir.path(), &[snapshots.clone(), own.clone()]);
    let before: BTreeMap<PathBuf, String> = untouched
        .into_iter()
        .filter(|(p, _)| !p.starts_with(&own))
        .collect();
    assert_untouched("links", &before, &after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_archive_still_restores() {
    use tar::EntryType::Symlink;
    let env = Env::new();
    plant_archive_version(
        &env,
        "old",
        &[
            file("bin/tool", "#!/bin/sh\n"),
            link(Symlink, "node_modules/.bin/tool", "../../bin/tool"),
        ],
        1,
    );
    let id = env.create("old", 2, Some("old.s1")).await;
    let ws = env.provider.workspace_path(&id).unwrap();
    assert_eq!(
        fs::read_to_string(ws.join("node_modules/.bin/tool")).unwrap(),
        "#!/bin/sh\n"
    );
    // And an id without a nonce keeps naming it, for delete as for restore.
    env.provider
        .delete_snapshot(&crate::support::snap("old.s1"))
        .await
        .unwrap();
    assert!(!env.root().join("snapshots/old/1.tbx").exists());
}
