//! Change tracking of a live workspace with inotify, so that the next snapshot looks only at
//! what changed since the restore that wrote its index (see [`Cas::pack_tracked`]).
//!
//! A [`Tracker`] starts right after a restore, before anything runs in the workspace: it
//! watches every directory of the index (creations, deletions, renames in and out, writes,
//! truncations, attribute changes, closes after writing) and every other entry for
//! `IN_ATTRIB` alone — a change of its link count, which no directory watch reports: a file
//! hard-linked to a name outside the workspace can then be written through that name without
//! an event here, so it is marked changed as soon as it gets the link. A thread reads the
//! events as they come (so the kernel's queue, `max_queued_events`, bounds a burst rather than
//! all the changes of a sandbox's life) and keeps three sets of workspace paths, [`Changes`]:
//! entries to look at again, directories to list again, and subtrees to walk whole (a directory
//! created or moved in: its files may be written before any watch could land on it, so no watch
//! is added below it and the snapshot walks it instead).
//!
//! Tracking stops being trustworthy — [`Tracker::finish`] then says why, and the snapshot walks
//! everything as it always did — on a queue overflow (`IN_Q_OVERFLOW`), the workspace itself
//! deleted, moved or unmounted (`IN_DELETE_SELF`, `IN_MOVE_SELF`, `IN_UNMOUNT`, `IN_IGNORED` of
//! its root), more than [`Limits::max_changes`] paths in the sets (their memory is bounded), or
//! a watch that could not be added at the start ([`Tracker::start`] fails: `ENOSPC` past
//! `max_user_watches`, `EACCES`...).
//!
//! The caller's part (the provider's): drop the tracker with its sandbox (its thread is joined
//! and the inotify descriptor closed on drop), and call [`Tracker::finish`] only once every
//! process that could write to the workspace is gone — a write through a shared mapping raises
//! no `IN_MODIFY`, but the file was opened for writing, and its `IN_CLOSE_WRITE` comes when the
//! last reference to that open file goes (its descriptor closed or its process dead, and the
//! mapping unmapped). `finish` reads the queue dry after that, so every such event is in.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::manifest::{EntryKind, Manifest};
use super::restore::Index;

/// Bounds of a [`Tracker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Paths the change sets may hold; past it tracking gives up (a full walk is then
    /// cheaper than the bookkeeping anyway).
    pub max_changes: usize,
    /// Whether a thread reads the events as they come. Without it they wait in the kernel's
    /// queue until [`Tracker::finish`], so more than `max_queued_events` of them overflow it
    /// (the tests force an overflow that way).
    pub background_reader: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_changes: 200_000,
            background_reader: true,
        }
    }
}

/// What changed in a workspace since its index was written, as paths relative to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Entries to `lstat` again (and read, if their stat fields moved).
    pub(crate) paths: HashSet<Vec<u8>>,
    /// Directories whose listing changed (an entry created, deleted or renamed).
    pub(crate) listed: HashSet<Vec<u8>>,
    /// Directories created or moved in: walked whole.
    pub(crate) trees: HashSet<Vec<u8>>,
}

impl Changes {
    /// Paths held, all sets together.
    pub fn len(&self) -> usize {
        self.paths.len() + self.listed.len() + self.trees.len()
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A tracked workspace's changes and the index they are relative to: what
/// [`Cas::pack_tracked`](super::Cas::pack_tracked) takes.
#[derive(Debug)]
pub struct Tracked {
    /// The index the tracker started from (the restore's).
    pub index: Index,
    /// What changed since.
    pub changes: Changes,
}

/// Why tracking is not trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("change tracking of the workspace is not trusted: {0}")]
pub struct Untracked(pub String);

struct State {
    /// Watch descriptor → the path it was added for, and whether that is a directory.
    watches: HashMap<i32, (Vec<u8>, bool)>,
    changes: Changes,
    broken: Option<String>,
    max_changes: usize,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // The sets stay consistent even if a holder panicked.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// A live workspace's watcher. See the module docs.
pub struct Tracker {
    /// `None` once dropped: handed to [`release`].
    inotify: Option<Arc<File>>,
    state: Arc<Mutex<State>>,
    index: Option<Index>,
    /// Closing it (dropping) tells the reader thread to drain the queue and stop.
    stop: Option<UnixStream>,
    reader: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Tracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracker")
            .field(
                "entries",
                &self.index.as_ref().map(|i| i.manifest.entries.len()),
            )
            .finish_non_exhaustive()
    }
}

const DIR_MASK: u32 = libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_CLOSE_WRITE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR
    | libc::IN_DONT_FOLLOW;

/// Files and symlinks: their link count (and mode, times) changing, whatever name did it.
const ENTRY_MASK: u32 = libc::IN_ATTRIB | libc::IN_DONT_FOLLOW;

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

impl Tracker {
    /// Watches `workspace`, whose files are those of `index` (a restore just wrote both and
    /// nothing has run in it since). Fails if any watch cannot be added.
    pub fn start(workspace: &Path, index: Index, limits: Limits) -> io::Result<Tracker> {
        // SAFETY: inotify_init1 takes flags and touches no memory of ours.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by inotify_init1, is open and owned by nobody else.
        let inotify = Arc::new(File::from(unsafe { OwnedFd::from_raw_fd(fd) }));
        let mut watches = HashMap::new();
        let mut add = |rel: &[u8], dir: bool| -> io::Result<()> {
            let wd = add_watch(&inotify, workspace, rel, dir)?;
            watches.insert(wd, (rel.to_vec(), dir));
            Ok(())
        };
        add(b"", true)?;
        for e in &index.manifest.entries {
            add(&e.path, matches!(e.kind, EntryKind::Dir))?;
        }
        let state = Arc::new(Mutex::new(State {
            watches,
            changes: Changes::default(),
            broken: None,
            max_changes: limits.max_changes,
        }));
        let (stop, reader) = if limits.background_reader {
            let (stop, wake) = UnixStream::pair()?;
            let (inotify, state) = (inotify.clone(), state.clone());
            let reader = std::thread::Builder::new()
                .name("taskbox-watch".into())
                .spawn(move || read_until_stopped(&inotify, &wake, &state))?;
            (Some(stop), Some(reader))
        } else {
            (None, None)
        };
        Ok(Tracker {
            inotify: Some(inotify),
            state,
            index: Some(index),
            stop,
            reader,
        })
    }

    /// Stops watching and returns the changes, reading every event queued so far first; or
    /// why they cannot be trusted. Call it once the workspace's writers are gone.
    pub fn finish(mut self) -> Result<Tracked, Untracked> {
        self.stop_reader();
        if let Some(inotify) = &self.inotify {
            drain(inotify, &self.state);
        }
        let mut state = lock(&self.state);
        if let Some(why) = state.broken.take() {
            return Err(Untracked(why));
        }
        let index = self.index.take().expect("finish consumes the tracker");
        Ok(Tracked {
            index,
            changes: std::mem::take(&mut state.changes),
        })
    }

    /// Hands over the changes since the index (every event queued so far read first) and goes
    /// on watching with the same watches, collecting from now on the changes since this call;
    /// or why they cannot be trusted (then drop the tracker). Call it while nothing can write
    /// to the workspace (its processes paused), then [`Tracker::rearm`] from the manifest packed
    /// from what it handed over before they resume: a checkpoint keeps watching rather than
    /// adding every watch again (about 1 µs each: tens of milliseconds of a pause on a large
    /// workspace).
    pub fn take(&mut self) -> Result<Tracked, Untracked> {
        let shared = self.state.clone();
        if let Some(inotify) = &self.inotify {
            drain(inotify, &shared);
        }
        let mut state = lock(&shared);
        if let Some(why) = state.broken.clone() {
            return Err(Untracked(why));
        }
        let Some(index) = self.index.take() else {
            return Err(Untracked(
                "the tracker was handed over without being given its new index".into(),
            ));
        };
        Ok(Tracked {
            index,
            changes: std::mem::take(&mut state.changes),
        })
    }

    /// After [`Tracker::take`], while nothing can write yet: watches every entry of `manifest`
    /// (the workspace as it is now) that `changed` (what `take` handed over) names or holds
    /// below a subtree created or moved in — the entries that may be new inodes or have moved,
    /// which the watches kept from before do not cover, or name by an old path. Every other
    /// entry is the same inode at the same path, still watched. Until [`Tracker::set_index`],
    /// the changes it collects are relative to `manifest`; a failure leaves the tracker
    /// untrustworthy (drop it).
    pub fn rearm(
        &mut self,
        workspace: &Path,
        manifest: &Manifest,
        changed: &Changes,
    ) -> io::Result<()> {
        let inotify = self
            .inotify
            .clone()
            .ok_or_else(|| io::Error::other("the tracker is released"))?;
        let below_tree = |path: &[u8]| {
            !changed.trees.is_empty()
                && (changed.trees.contains(path)
                    || path
                        .iter()
                        .enumerate()
                        .any(|(i, b)| *b == b'/' && changed.trees.contains(&path[..i])))
        };
        let mut added = Vec::new();
        for e in &manifest.entries {
            if changed.paths.contains(&e.path) || below_tree(&e.path) {
                let dir = matches!(e.kind, EntryKind::Dir);
                let wd = add_watch(&inotify, workspace, &e.path, dir)?;
                added.push((wd, (e.path.clone(), dir)));
            }
        }
        // A watch of an inode already watched comes back with its descriptor: its path is
        // the new one now (a rename), its kind the entry's.
        lock(&self.state).watches.extend(added);
        Ok(())
    }

    /// Gives a tracker [`Tracker::rearm`]ed from a manifest the index of that manifest (written
    /// after the processes resumed, stamped with a time from before: see `Index::stamp`).
    pub fn set_index(&mut self, index: Index) {
        self.index = Some(index);
    }

    /// Whether nothing changed since the index, as far as the events queued so far say (read
    /// first), and tracking is still trusted; watching goes on. Ask it only while nothing can
    /// write to the workspace (its processes paused): a checkpoint that finds nothing changed
    /// needs no snapshot.
    pub fn unchanged(&self) -> bool {
        if let Some(inotify) = &self.inotify {
            drain(inotify, &self.state);
        }
        let state = lock(&self.state);
        state.broken.is_none() && state.changes.is_empty()
    }

    fn stop_reader(&mut self) {
        drop(self.stop.take());
        if let Some(reader) = self.reader.take() {
            if reader.join().is_err() {
                lock(&self.state).broken = Some("the watcher's thread panicked".into());
            }
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.stop_reader();
        // The reader thread is joined: this holds the descriptor's last reference.
        let watches = std::mem::take(&mut lock(&self.state).watches);
        release(self.inotify.take(), watches);
    }
}

/// Watches the workspace entry `rel` (a directory's listing and contents, or a file's or
/// symlink's own attributes): its watch descriptor, the same as before if its inode is
/// watched already.
fn add_watch(inotify: &File, workspace: &Path, rel: &[u8], dir: bool) -> io::Result<i32> {
    let abs = workspace.join(std::ffi::OsStr::from_bytes(rel));
    let c = CString::new(abs.as_os_str().as_bytes())
        .map_err(|_| io::Error::other("a path with a NUL byte"))?;
    let mask = if dir { DIR_MASK } else { ENTRY_MASK };
    // SAFETY: the descriptor is open (borrowed from the caller) and `c` is a NUL-terminated
    // string that outlives the call.
    let wd = unsafe { libc::inotify_add_watch(inotify.as_raw_fd(), c.as_ptr(), mask) };
    if wd < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("watch `{}`: {e}", abs.display()),
        ));
    }
    Ok(wd)
}

/// Closes a finished tracker's inotify descriptor and frees its table of watches on a thread
/// of their own. Closing the descriptor removes every watch, one by one in the kernel (about
/// 1 µs each: 17–33 ms for a workspace of 17,000 entries, measured), and the table is freed entry
/// by entry: neither is work a snapshot or a stop should wait for, and nothing reads the
/// descriptor any more (the events still queued in it, such as those of the workspace's
/// removal, are dropped with it). If no thread can be started, it is done here.
fn release(inotify: Option<Arc<File>>, watches: HashMap<i32, (Vec<u8>, bool)>) {
    let work = move || {
        drop(inotify);
        drop(watches);
    };
    // A failed spawn drops the closure, and with it the descriptor and the table, here.
    let _ = std::thread::Builder::new()
        .name("taskbox-unwatch".into())
        .spawn(work);
}

/// The reader thread: waits for events or the stop signal (its peer closed), handles them.
fn read_until_stopped(inotify: &File, wake: &UnixStream, state: &Mutex<State>) {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: inotify.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the whole call, its length is
        // passed, and both descriptors are open (borrowed from the caller).
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            lock(state).broken = Some(format!("waiting for events failed: {e}"));
            return;
        }
        if fds[0].revents != 0 {
            drain(inotify, state);
        }
        if fds[1].revents != 0 {
            return; // the tracker drains once more itself
        }
    }
}

/// Reads every queued event (the descriptor is non-blocking) into the state.
fn drain(mut inotify: &File, state: &Mutex<State>) {
    // Room for many events per read (an event is 16 bytes and its NUL-padded name).
    let mut buf = vec![0u8; 64 * 1024];
    // Held across the reads too: a batch read by one caller is in the state before another
    // sees the queue empty. Otherwise a checkpoint draining while the reader thread holds a
    // batch it read but has not handled yet would find no change and miss that batch.
    let mut state = lock(state);
    loop {
        let n = match inotify.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                state.broken = Some(format!("reading events failed: {e}"));
                return;
            }
        };
        let mut at = 0;
        while at + 16 <= n {
            let field = |i: usize| {
                let b = &buf[at + 4 * i..at + 4 * i + 4];
                u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
            };
            let (wd, mask, len) = (field(0) as i32, field(1), field(3) as usize);
            let name_bytes = &buf[(at + 16).min(n)..(at + 16 + len).min(n)];
            let name = &name_bytes[..name_bytes
                .iter()
                .position(|b| *b == 0)
                .unwrap_or(name_bytes.len())];
            state.event(wd, mask, name);
            at += 16 + len;
        }
    }
}

impl State {
    fn event(&mut self, wd: i32, mask: u32, name: &[u8]) {
        if self.broken.is_some() {
            return;
        }
        if mask & libc::IN_Q_OVERFLOW != 0 {
            return self.fail("the event queue overflowed (more changes than max_queued_events)");
        }
        if mask & libc::IN_UNMOUNT != 0 {
            return self.fail("the file system holding the workspace was unmounted");
        }
        let Some((path, is_dir)) = self.watches.get(&wd).cloned() else {
            return; // a watch already removed
        };
        if mask & libc::IN_IGNORED != 0 {
            self.watches.remove(&wd);
            if path.is_empty() {
                self.fail("the workspace's watch was removed");
            }
            return;
        }
        if !is_dir {
            // A file's or symlink's own watch: its link count, mode or times changed.
            self.changes.paths.insert(path);
            return self.check();
        }
        if name.is_empty() {
            // The directory itself.
            if mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0 {
                if path.is_empty() {
                    self.fail("the workspace itself was deleted or moved");
                }
                // Below the root its parent reports it (a deletion or a rename).
                return;
            }
            if !path.is_empty() {
                self.changes.paths.insert(path);
            }
            return self.check();
        }
        let rel = join(&path, name);
        if mask & (libc::IN_CREATE | libc::IN_DELETE | libc::IN_MOVED_FROM | libc::IN_MOVED_TO) != 0
        {
            self.changes.listed.insert(path.clone());
            if !path.is_empty() {
                self.changes.paths.insert(path); // its mtime moved
            }
            if mask & libc::IN_ISDIR != 0 && mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
                self.changes.trees.insert(rel.clone());
            }
        }
        self.changes.paths.insert(rel);
        self.check()
    }

    fn check(&mut self) {
        if self.changes.len() > self.max_changes {
            let max = self.max_changes;
            self.fail(&format!("more than {max} paths changed"));
        }
    }

    fn fail(&mut self, why: &str) {
        self.broken = Some(why.to_string());
        self.changes = Changes::default();
    }
}
