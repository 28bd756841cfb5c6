//! The sandbox filesystem on the host: sandbox paths under `/vercel/sandbox` map onto a session's
//! workspace directory (a local-provider sandbox's); uploads are gzipped tars. Snapshot archives
//! are the local provider's business.
//!
//! Everything here is blocking file I/O: callers run it on the blocking pool. The fake is a test
//! double, not an isolation boundary: a symlink a command makes inside the workspace is followed.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::model::WORKSPACE_ROOT;

/// A filesystem operation that failed, with the sandbox path it concerned.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FsError {
    #[error(
        "`{path}` is outside {WORKSPACE_ROOT}: taskbox fake-vercel maps only {WORKSPACE_ROOT} \
         onto a host directory"
    )]
    Outside { path: String },
    #[error("{path} does not exist")]
    NotFound { path: String },
    #[error("{path} is a directory, not a file")]
    IsDir { path: String },
    #[error("{path} already exists")]
    Exists { path: String },
    #[error("the parent directory of {path} does not exist; send `\"recursive\": true`")]
    NoParent { path: String },
    #[error("the upload is not a usable gzipped tar archive: {reason}")]
    BadArchive { reason: String },
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> FsError {
    let path = path.to_path_buf();
    move |source| FsError::Io { op, path, source }
}

/// Creates a directory and its parents.
pub(crate) fn create_dir(path: &Path) -> Result<(), FsError> {
    fs::create_dir_all(path).map_err(io_err("create directory", path))
}

/// Removes a directory tree; a missing one is fine.
pub(crate) fn remove_dir(path: &Path) -> Result<(), FsError> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err("remove directory", path)(e)),
        _ => Ok(()),
    }
}

/// Normalizes an absolute POSIX path lexically (`.`, `..`, repeated slashes), like Node's
/// `path.posix.normalize`; `..` at the root stays at the root.
pub(crate) fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Resolves `path` against `cwd` (itself resolved against the workspace root when relative).
pub(crate) fn resolve(cwd: Option<&str>, path: &str) -> String {
    if path.starts_with('/') {
        return normalize(path);
    }
    let cwd = match cwd {
        Some(c) if c.starts_with('/') => c.to_string(),
        Some(c) => format!("{WORKSPACE_ROOT}/{c}"),
        None => WORKSPACE_ROOT.to_string(),
    };
    normalize(&format!("{cwd}/{path}"))
}

/// The host path of an absolute sandbox path, which must be under `/vercel/sandbox`.
pub(crate) fn host_path(workspace: &Path, sandbox_path: &str) -> Result<PathBuf, FsError> {
    let norm = normalize(sandbox_path);
    if norm == WORKSPACE_ROOT {
        return Ok(workspace.to_path_buf());
    }
    match norm
        .strip_prefix(WORKSPACE_ROOT)
        .and_then(|r| r.strip_prefix('/'))
    {
        Some(rest) => Ok(workspace.join(rest)),
        None => Err(FsError::Outside { path: norm }),
    }
}

/// Extracts an uploaded gzipped tar whose entry names are relative to `x_cwd`; parents are
/// created. Returns how many files were written.
pub(crate) fn extract_upload(
    workspace: &Path,
    x_cwd: &str,
    gz: impl io::Read,
) -> Result<usize, FsError> {
    let bad = |e: io::Error| FsError::BadArchive {
        reason: e.to_string(),
    };
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(gz));
    let mut files = 0;
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let name = String::from_utf8(entry.path_bytes().into_owned()).map_err(|_| {
            FsError::BadArchive {
                reason: "an entry name is not UTF-8".into(),
            }
        })?;
        let sandbox_path = resolve(Some(x_cwd), &name);
        let host = host_path(workspace, &sandbox_path)?;
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            fs::create_dir_all(&host).map_err(io_err("create directory", &host))?;
            continue;
        }
        if !(kind.is_file() || kind == tar::EntryType::Continuous) {
            return Err(FsError::BadArchive {
                reason: format!(
                    "entry {name} is a {kind:?}; only files and directories are supported"
                ),
            });
        }
        if let Some(parent) = host.parent() {
            fs::create_dir_all(parent).map_err(io_err("create directory", parent))?;
        }
        let mut out = fs::File::create(&host).map_err(io_err("create file", &host))?;
        io::copy(&mut entry, &mut out).map_err(io_err("write file", &host))?;
        if let Ok(mode) = entry.header().mode() {
            set_mode(&host, mode & 0o7777)?;
        }
        files += 1;
    }
    Ok(files)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), FsError> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", path))
}

/// The host file to read for `path` (relative to `cwd`): it must exist and be a file.
pub(crate) fn readable_file(
    workspace: &Path,
    cwd: Option<&str>,
    path: &str,
) -> Result<PathBuf, FsError> {
    let sandbox_path = resolve(cwd, path);
    let host = host_path(workspace, &sandbox_path)?;
    match fs::metadata(&host) {
        Ok(m) if m.is_dir() => Err(FsError::IsDir { path: sandbox_path }),
        Ok(_) => Ok(host),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(FsError::NotFound { path: sandbox_path })
        }
        Err(e) => Err(io_err("stat", &host)(e)),
    }
}

/// Creates a directory; without `recursive` its parent must exist and it must not.
pub(crate) fn make_dir(
    workspace: &Path,
    cwd: Option<&str>,
    path: &str,
    recursive: bool,
) -> Result<(), FsError> {
    let sandbox_path = resolve(cwd, path);
    let host = host_path(workspace, &sandbox_path)?;
    if recursive {
        return fs::create_dir_all(&host).map_err(io_err("create directory", &host));
    }
    match fs::create_dir(&host) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            Err(FsError::Exists { path: sandbox_path })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(FsError::NoParent { path: sandbox_path })
        }
        Err(e) => Err(io_err("create directory", &host)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_normalize_like_node() {
        assert_eq!(normalize("/vercel//sandbox/./a/../b"), "/vercel/sandbox/b");
        assert_eq!(normalize("/../x"), "/x");
        assert_eq!(resolve(None, "a.txt"), "/vercel/sandbox/a.txt");
        assert_eq!(
            resolve(Some("/tmp"), "../vercel/sandbox/x"),
            "/vercel/sandbox/x"
        );
        assert_eq!(resolve(Some("sub"), "f"), "/vercel/sandbox/sub/f");
        assert_eq!(
            resolve(Some("/x"), "/vercel/sandbox/y"),
            "/vercel/sandbox/y"
        );
    }

    #[test]
    fn only_the_workspace_maps() {
        let ws = Path::new("/data/s1/workspace");
        assert_eq!(host_path(ws, "/vercel/sandbox").unwrap(), ws);
        assert_eq!(
            host_path(ws, "/vercel/sandbox/a/b").unwrap(),
            ws.join("a/b")
        );
        assert!(matches!(
            host_path(ws, "/vercel/sandbox/../../etc/passwd"),
            Err(FsError::Outside { .. })
        ));
        assert!(matches!(
            host_path(ws, "/vercel/sandboxes"),
            Err(FsError::Outside { .. })
        ));
    }

    fn tar_gz(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        for (name, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o640);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn upload_read_and_mkdir() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("workspace");
        create_dir(&ws).unwrap();
        let upload = tar_gz(&[
            ("vercel/sandbox/dir/f.txt", b"hello"),
            ("vercel/sandbox/g", b""),
        ]);
        assert_eq!(extract_upload(&ws, "/", upload.as_slice()).unwrap(), 2);
        assert_eq!(fs::read(ws.join("dir/f.txt")).unwrap(), b"hello");
        let relative = tar_gz(&[("h.txt", b"x")]);
        extract_upload(&ws, "/vercel/sandbox/dir", relative.as_slice()).unwrap();
        assert!(ws.join("dir/h.txt").is_file());
        let outside = tar_gz(&[("etc/x", b"no")]);
        assert!(matches!(
            extract_upload(&ws, "/", outside.as_slice()),
            Err(FsError::Outside { .. })
        ));
        assert!(matches!(
            extract_upload(&ws, "/", &b"not gzip"[..]),
            Err(FsError::BadArchive { .. })
        ));

        let file = readable_file(&ws, Some("/vercel/sandbox/dir"), "f.txt").unwrap();
        assert_eq!(fs::read(file).unwrap(), b"hello");
        assert!(matches!(
            readable_file(&ws, None, "missing"),
            Err(FsError::NotFound { .. })
        ));
        assert!(matches!(
            readable_file(&ws, None, "dir"),
            Err(FsError::IsDir { .. })
        ));
        assert!(matches!(
            make_dir(&ws, None, "x/y", false),
            Err(FsError::NoParent { .. })
        ));
        make_dir(&ws, None, "x/y", true).unwrap();
        assert!(matches!(
            make_dir(&ws, None, "x", false),
            Err(FsError::Exists { .. })
        ));
        remove_dir(&ws).unwrap();
        remove_dir(&ws).unwrap();
        assert!(!ws.exists());
    }
}
