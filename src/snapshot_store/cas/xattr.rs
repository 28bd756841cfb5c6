//! A path's own metadata beyond its mode and mtime — owner and extended attributes (`user.*`,
//! `trusted.*`, `security.*`, and POSIX ACLs, which Linux keeps as the `system.posix_acl_*`
//! attributes) — read without following a symlink, and set back on restore.
//!
//! Reading takes what this process can read: an unprivileged one is not shown `trusted.*`.
//! Setting is what this process may set: as root everything; unprivileged, an owner other than
//! itself and the `trusted.*` attributes are refused by the kernel, and left as the restore
//! made them (its own user, no such attribute) — never a failed restore.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::manifest::Meta;

/// The largest attribute value read (the kernel's `XATTR_SIZE_MAX`).
const MAX_VALUE: usize = 64 * 1024;

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

/// The names of `path`'s extended attributes (of the link itself, for a symlink), sorted.
fn names(c: &CString) -> io::Result<Vec<Vec<u8>>> {
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: `c` is a NUL-terminated path; the kernel writes at most `buf.len()` bytes
        // into `buf`, which is ours and that long.
        let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            buf.truncate(n as usize);
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) => buf.resize(buf.len() * 4, 0),
            // A file system without extended attributes has none.
            Some(libc::ENOTSUP) => return Ok(Vec::new()),
            _ => return Err(e),
        }
    }
    let mut names: Vec<Vec<u8>> = buf
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    names.sort();
    Ok(names)
}

fn value(c: &CString, name: &[u8]) -> io::Result<Option<Vec<u8>>> {
    let cname = CString::new(name).map_err(io::Error::other)?;
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: both pointers are NUL-terminated strings of ours; the kernel writes at most
        // `buf.len()` bytes into `buf`.
        let n = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                cname.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(Some(buf));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) if buf.len() < MAX_VALUE => buf.resize(MAX_VALUE, 0),
            // Removed since it was listed.
            Some(libc::ENODATA) => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// `path`'s owner (`uid`, `gid` from its `lstat`) and extended attributes, sorted by name.
pub(crate) fn read(path: &Path, uid: u32, gid: u32) -> io::Result<Meta> {
    let c = c_path(path)?;
    let mut xattrs = Vec::new();
    for name in names(&c)? {
        if let Some(v) = value(&c, &name)? {
            xattrs.push((name, v));
        }
    }
    Ok(Meta { uid, gid, xattrs })
}

/// Sets `meta` on `path` (the link itself, for a symlink): owner first, then the attributes.
/// What this process may not set (another owner, `trusted.*` unprivileged; an attribute a
/// symlink cannot carry) is left as it is. A chown clears set-id bits: the caller sets the
/// mode after this.
pub(crate) fn apply(path: &Path, meta: &Meta) -> io::Result<()> {
    let c = c_path(path)?;
    // SAFETY: `c` is a NUL-terminated path of ours; lchown(2) reads nothing else of ours.
    let rc = unsafe { libc::lchown(c.as_ptr(), meta.uid, meta.gid) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EPERM) {
            return Err(e);
        }
    }
    for (name, value) in &meta.xattrs {
        let cname = CString::new(name.as_slice()).map_err(io::Error::other)?;
        // SAFETY: the pointers are a NUL-terminated path and name of ours and `value`, of
        // `value.len()` bytes, which the kernel only reads.
        let rc = unsafe {
            libc::lsetxattr(
                c.as_ptr(),
                cname.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EPERM | libc::EACCES | libc::ENOTSUP) => {}
                _ => return Err(e),
            }
        }
    }
    Ok(())
}

/// Sets `path`'s mtime (`ns` since the epoch) without following a symlink, its atime left.
pub(crate) fn set_mtime_nofollow(path: &Path, ns: i64) -> io::Result<()> {
    let c = c_path(path)?;
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: ns.div_euclid(1_000_000_000),
            tv_nsec: ns.rem_euclid(1_000_000_000),
        },
    ];
    // SAFETY: `c` is a NUL-terminated path of ours and `times` two timespecs, as utimensat(2)
    // expects; it reads both and writes nothing of ours.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
