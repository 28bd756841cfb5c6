//! The tree model shared by packing and extraction: every path of an archive and what it is, so
//! that a symlink's target is judged against the archive itself, the same way by the packer (which
//! leaves out what a restore would refuse) and by the extractor (which refuses it).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// How many symlinks one path may go through before it is refused (the kernel's limit).
const MAX_SYMLINK_HOPS: usize = 40;

/// What a path in the archive is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Node {
    Dir,
    File,
    Symlink(Vec<u8>),
}

/// Every path of an archive (relative, `/`-joined, no `.` or `..`) and what it is. Symlink
/// targets are resolved against this model, never against the real file system, so the verdict
/// does not depend on what happens to exist on the host.
#[derive(Debug, Default)]
pub(super) struct Tree {
    nodes: HashMap<Vec<u8>, Node>,
}

impl Tree {
    pub(super) fn get(&self, path: &[u8]) -> Option<&Node> {
        self.nodes.get(path)
    }

    pub(super) fn insert(&mut self, path: Vec<u8>, node: Node) {
        self.nodes.insert(path, node);
    }

    /// Checks that the symlink at `link` (a tree path) with `target` resolves inside the tree's
    /// root, following the tree's other symlinks. A target through a missing path is resolved
    /// lexically from there on, which is the strict reading (the path could be created later).
    pub(super) fn check_symlink(&self, link: &[u8], target: &[u8]) -> Result<(), String> {
        if target.is_empty() {
            return Err("its target is empty".into());
        }
        if target[0] == b'/' {
            return Err(format!(
                "it points to the absolute path `{}`, outside the workspace",
                show(target)
            ));
        }
        let mut cur: Vec<&[u8]> = split_path(link);
        cur.pop(); // resolution starts in the link's directory
        let mut pending: Vec<&[u8]> = split_path(target).into_iter().rev().collect();
        let mut hops = 0;
        while let Some(component) = pending.pop() {
            match component {
                b"" | b"." => {}
                b".." => {
                    if cur.pop().is_none() {
                        return Err(format!(
                            "its target `{}` resolves outside the workspace",
                            show(target)
                        ));
                    }
                }
                name => {
                    cur.push(name);
                    if let Some(Node::Symlink(next)) = self.get(&cur.join(&b'/')) {
                        hops += 1;
                        if hops > MAX_SYMLINK_HOPS {
                            return Err(format!(
                                "its target `{}` goes through more than {MAX_SYMLINK_HOPS} \
                                 symlinks (a loop)",
                                show(target)
                            ));
                        }
                        if next.first() == Some(&b'/') {
                            return Err(format!(
                                "its target `{}` goes through `{}`, a symlink to the absolute \
                                 path `{}`",
                                show(target),
                                show(&cur.join(&b'/')),
                                show(next)
                            ));
                        }
                        cur.pop();
                        pending.extend(split_path(next).into_iter().rev());
                    }
                }
            }
        }
        Ok(())
    }
}

fn split_path(path: &[u8]) -> Vec<&[u8]> {
    path.split(|b| *b == b'/').collect()
}

/// A path from an archive, printable and free of control characters.
pub(super) fn show(path: &[u8]) -> String {
    String::from_utf8_lossy(path).escape_debug().to_string()
}

pub(super) fn os(path: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    fn tree(entries: &[(&str, Option<&str>)]) -> Tree {
        let mut tree = Tree::default();
        for (path, link) in entries {
            let node = match link {
                Some(t) => Node::Symlink(t.as_bytes().to_vec()),
                None if path.ends_with('/') => Node::Dir,
                None => Node::File,
            };
            tree.insert(path.trim_end_matches('/').as_bytes().to_vec(), node);
        }
        tree
    }

    #[test]
    fn symlinks_inside_the_tree_are_accepted() {
        let t = tree(&[
            ("a/", None),
            ("a/b/", None),
            ("a/b/f", None),
            ("a/up", Some("..")),
            ("a/b/l", Some("../../a/b/f")),
        ]);
        assert_eq!(t.check_symlink(b"a/b/l", b"../../a/b/f"), Ok(()));
        assert_eq!(t.check_symlink(b"a/up", b".."), Ok(()));
        assert_eq!(t.check_symlink(b"x", b"a/up/a/b/f"), Ok(()));
        assert_eq!(t.check_symlink(b"x", b"dangling/file"), Ok(()));
    }

    #[test]
    fn symlinks_leaving_the_tree_are_refused() {
        let t = tree(&[
            ("a/", None),
            ("a/up", Some("..")),
            ("a/abs", Some("/etc")),
            ("loop1", Some("loop2")),
            ("loop2", Some("loop1")),
        ]);
        assert!(t.check_symlink(b"l", b"/etc").is_err());
        assert!(t.check_symlink(b"l", b"..").is_err());
        assert!(t.check_symlink(b"a/l", b"../..").is_err());
        assert!(t.check_symlink(b"l", b"").is_err());
        // Lexically `a/up/..` is `a`, but `a/up` is the root, so this is the root's parent.
        assert!(t.check_symlink(b"l", b"a/up/..").is_err());
        assert!(t.check_symlink(b"l", b"a/up/a/up/../..").is_err());
        assert!(t.check_symlink(b"l", b"a/abs/passwd").is_err());
        assert!(t.check_symlink(b"l", b"loop1").is_err());
        // A missing component is resolved lexically, strictly.
        assert!(t.check_symlink(b"l", b"missing/../..").is_err());
    }
}
