//! `read_file` and `write_file`: a file of the task's workspace, read or written by a short
//! `bash` script run in the task's sandbox like any command (so it works on every backend, and a
//! sandbox that expired is restored first).
//!
//! The path is checked twice. Here, lexically: not empty, no NUL, and a relative path may not
//! climb out with `..`. In the sandbox, against the filesystem: the workspace root is
//! `$TASKBOX_WORKSPACE` where the backend sets it (local) and otherwise the directory commands
//! start in (Vercel: `/vercel/sandbox`); an absolute path must lie under it; a read may follow a
//! symlink only to a file that is still inside the workspace (`realpath`); a write never goes
//! through a symlink — every directory on the way must be a real directory, the file itself must
//! not be a symlink (the user's symlinks are data: they are refused, not replaced) — and lands by
//! renaming a temporary file in the same directory, so a symlink put there meanwhile is replaced
//! rather than written through.

use taskbox::engine::RunResult;
use taskbox::shell::quote;

/// What a read returns at most per call: below the run capture's bound (50,000 characters per
/// stream), so a read is never cut in its middle by the capture.
pub const MAX_READ_BYTES: u64 = 40_000;

/// The largest content `write_file` takes (it travels as the command's stdin).
pub const MAX_WRITE_BYTES: usize = 16 * 1024 * 1024;

/// The exit code the scripts use for a refusal (their message is on stderr after [`MARK`]).
const REFUSED: i32 = 97;
/// The prefix of the scripts' own lines on stderr.
const MARK: &str = "taskbox-mcp:";
/// The prefix of the line that reports the file's size.
const SIZE: &str = "taskbox-mcp-size ";

/// A path the lexical check let through: relative (no `..` left) or absolute (normalised).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedPath(String);

impl CheckedPath {
    /// The normalised path as given to the sandbox.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Checks `path` lexically and normalises it (`a/./b//c` → `a/b/c`, `a/../b` → `b`).
pub fn check_path(path: &str) -> Result<CheckedPath, String> {
    if path.trim().is_empty() {
        return Err("the path is empty: give a file path relative to the task's workspace".into());
    }
    if path.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    let absolute = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(format!(
                        "`{path}` leads out of the task's workspace (`..` above its root); \
                         read_file and write_file reach only files inside it"
                    ));
                }
            }
            c => parts.push(c),
        }
    }
    if parts.is_empty() && !absolute {
        return Err(format!(
            "`{path}` is the workspace itself, a directory: name a file in it"
        ));
    }
    let joined = parts.join("/");
    Ok(CheckedPath(if absolute {
        format!("/{joined}")
    } else {
        joined
    }))
}

/// The start of both scripts: `root` (the workspace, physical) and `rel` (the path below it).
fn prelude(tool: &str, path: &CheckedPath) -> String {
    format!(
        r#"# taskbox mcp {tool}: {shown}
fail() {{ printf '{MARK} %s\n' "$1" >&2; exit {REFUSED}; }}
given_root=${{TASKBOX_WORKSPACE:-$(builtin pwd -P)}}
root=$(builtin cd -- "$given_root" 2>/dev/null && builtin pwd -P) || fail "the task's workspace $given_root is missing"
p={quoted}
case $p in
  /*)
    if [[ $p == "$root" || $p == "$given_root" ]]; then rel=
    elif [[ $p == "$root"/* ]]; then rel=${{p#"$root"/}}
    elif [[ $p == "${{given_root%/}}"/* ]]; then rel=${{p#"${{given_root%/}}"/}}
    else fail "$p is outside the task's workspace ($root): give a path inside it, or relative to it"
    fi ;;
  *) rel=$p ;;
esac
[[ -n $rel ]] || fail "$p is the workspace itself, a directory: name a file in it"
"#,
        shown = path.as_str().replace('\n', "?"),
        quoted = quote(path.as_str()),
    )
}

/// The script that prints bytes `offset..offset+limit` of the file on stdout (and its size on
/// stderr).
pub fn read_script(path: &CheckedPath, offset: u64, limit: u64) -> String {
    let mut s = prelude("read_file", path);
    s.push_str(&format!(
        r#"real=$(realpath -e -- "$root/$rel" 2>/dev/null) || fail "no such file: $rel"
[[ $real == "$root"/* ]] || fail "$rel resolves to $real, outside the task's workspace ($root)"
[[ -d $real ]] && fail "$rel is a directory: list it with run_command (ls)"
[[ -f $real ]] || fail "$rel is not a regular file"
[[ -r $real ]] || fail "$rel is not readable"
size=$(stat -c %s -- "$real") || fail "cannot read the size of $rel"
printf '{SIZE}%s\n' "$size" >&2
tail -c +{start} -- "$real" | head -c {limit}
"#,
        start = offset.saturating_add(1),
    ));
    s
}

/// The script that writes its stdin to the file (creating missing directories) and reports the
/// size written on stderr.
pub fn write_script(path: &CheckedPath) -> String {
    let mut s = prelude("write_file", path);
    s.push_str(&format!(
        r#"d=$root
rest=$rel
while [[ $rest == */* ]]; do
  c=${{rest%%/*}}; rest=${{rest#*/}}
  d=$d/$c
  if [[ -L $d ]]; then fail "${{d#"$root"/}} is a symlink: write_file does not write through symlinks (write to the path it points to)"
  elif [[ ! -e $d ]]; then mkdir -- "$d" 2>/dev/null || fail "cannot create the directory ${{d#"$root"/}}"
  elif [[ ! -d $d ]]; then fail "${{d#"$root"/}} is not a directory"
  fi
done
t=$d/$rest
[[ -L $t ]] && fail "$rel is a symlink: write_file does not write through symlinks (write to the path it points to)"
[[ -d $t ]] && fail "$rel is a directory"
tmp=$d/.taskbox-write.$$.$RANDOM
cat >| "$tmp" || {{ rm -f -- "$tmp"; fail "cannot write $rel"; }}
[[ -e $t ]] && chmod --reference="$t" -- "$tmp" 2>/dev/null
mv -f -T -- "$tmp" "$t" 2>/dev/null || {{ rm -f -- "$tmp"; fail "cannot write $rel"; }}
printf '{SIZE}%s\n' "$(stat -c %s -- "$t")" >&2
"#
    ));
    s
}

/// What the scripts report.
#[derive(Debug)]
pub struct Reported {
    /// The file's size in bytes.
    pub size: u64,
}

/// Reads a script's outcome: `Ok` with the size it reported, or `Err` with its refusal (or
/// what else went wrong, with its stderr).
pub fn outcome(tool: &str, res: &RunResult) -> Result<Reported, String> {
    let stderr = String::from_utf8_lossy(&res.stderr_bytes()).into_owned();
    if res.timed_out {
        return Err(format!("{tool} timed out (the sandbox may be overloaded)"));
    }
    if res.exit_code == REFUSED {
        if let Some(line) = stderr.lines().rev().find_map(|l| l.strip_prefix(MARK)) {
            return Err(line.trim().to_string());
        }
    }
    let size = stderr
        .lines()
        .find_map(|l| l.strip_prefix(SIZE))
        .and_then(|s| s.trim().parse::<u64>().ok());
    match (res.exit_code, size) {
        (0, Some(size)) => Ok(Reported { size }),
        (code, _) => Err(format!(
            "{tool} failed in the sandbox (exit {code}): {}",
            stderr.trim()
        )),
    }
}

/// A read's bytes as text: the longest UTF-8 prefix when only a character cut at the end
/// breaks it (the next read starts there), or `None` when the bytes are not text.
pub fn text_of(bytes: &[u8]) -> Option<&str> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Some(s),
        // `error_len() == None`: an incomplete character at the very end (cut by the limit).
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => {
            std::str::from_utf8(&bytes[..e.valid_up_to()]).ok()
        }
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_and_escapes_refused() {
        assert_eq!(check_path("a/./b//c.txt").unwrap().as_str(), "a/b/c.txt");
        assert_eq!(check_path("a/../b").unwrap().as_str(), "b");
        assert_eq!(
            check_path("/vercel/sandbox/x").unwrap().as_str(),
            "/vercel/sandbox/x"
        );
        assert!(check_path("/a/../../b").unwrap_err().contains("out of"));
        assert!(check_path("../etc/passwd").unwrap_err().contains("out of"));
        assert!(check_path("a/../../x").is_err());
        assert!(check_path("").is_err());
        assert!(check_path(".").is_err());
        assert!(check_path("a\0b").is_err());
    }

    #[test]
    fn a_character_cut_at_the_end_is_left_for_the_next_read() {
        let s = "héllo".as_bytes();
        assert_eq!(text_of(&s[..2]), Some("h"));
        assert_eq!(text_of(s), Some("héllo"));
        assert_eq!(text_of(&[0xff, b'a']), None);
    }
}
