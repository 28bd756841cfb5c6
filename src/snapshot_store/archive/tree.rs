//! The extraction's model of what it created: every path of an archive and what it is, so that
//! an entry is only ever created inside directories this extraction made (never below a symlink
//! or a file), whatever happens to exist on the host.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What a path in the archive is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Node {
    Dir,
    File,
    Symlink,
}

/// Every path of an archive (relative, `/`-joined, no `.` or `..`) and what it is.
#[derive(Debug, Default)]
pub(super) struct Tree {
    nodes: HashMap<Vec<u8>, Node>,
}

impl Tree {
    pub(super) fn get(&self, path: &[u8]) -> Option<Node> {
        self.nodes.get(path).copied()
    }

    pub(super) fn insert(&mut self, path: Vec<u8>, node: Node) {
        self.nodes.insert(path, node);
    }
}

/// A path from an archive, printable and free of control characters.
pub(super) fn show(path: &[u8]) -> String {
    String::from_utf8_lossy(path).escape_debug().to_string()
}

pub(super) fn os(path: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(path))
}
