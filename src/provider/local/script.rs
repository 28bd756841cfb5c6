//! The shell a command runs in: its `bash -c` script (the user's command behind the cgroup join
//! and the working-directory trap), its clean environment, its process.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::process::Stdio;

use super::cgroup::Join;
use super::isolation;

/// The clean base of an unisolated command's environment: the server user's `PATH`, `HOME`,
/// `USER`, `LOGNAME`, `LANG`, `LC_ALL`, `TZ` and `TMPDIR` where set (it runs as that user, on
/// the host's filesystem), `PATH` and `LANG` else the isolated sandbox's, `TERM` else `dumb`,
/// and the `TASKBOX_*` variables in `taskbox`. Nothing else of the server's environment —
/// tokens, the variables of whoever started it — reaches a command.
pub(super) fn host_environment<'a>(
    taskbox: &'a [(&'a str, &'a OsStr)],
) -> Vec<(&'a str, OsString)> {
    let mut env: Vec<(&str, OsString)> = isolation::environment(&[])
        .into_iter()
        .filter(|(k, _)| *k != "HOME")
        .map(|(k, v)| {
            (
                k,
                std::env::var_os(k).filter(|v| !v.is_empty()).unwrap_or(v),
            )
        })
        .collect();
    for key in ["HOME", "USER", "LOGNAME", "LC_ALL", "TZ", "TMPDIR"] {
        if let Some(v) = std::env::var_os(key) {
            env.push((key, v));
        }
    }
    env.extend(taskbox.iter().map(|(k, v)| (*k, v.to_os_string())));
    env
}

/// Where a command's EXIT trap writes its final working directory.
#[derive(Debug, Clone, Copy)]
pub(super) enum Report<'a> {
    /// The report pipe's path, opened for writing (`/proc/<server>/fd/<n>`).
    Path(&'a Path),
    /// The report pipe's write end, which the shell inherited at this descriptor (an isolated
    /// command's: no path of the server's is visible inside its sandbox).
    Fd(std::os::fd::RawFd),
}

/// The script `bash -c` runs: the user's command, preceded (on the same line, so its line
/// numbers are unchanged) by the join of the sandbox's cgroup ([`Join::script`], when there is
/// one) and an EXIT trap that writes the final working directory to `report` (`cwd_file` when
/// that cannot be written) and exits with the command's own status — unless the shell's `$PWD`
/// is still `start`, where it began: most commands never `cd`, and the caller then keeps the
/// directory it had (a rename of the directory under the shell, or a `PWD` the command set to
/// that value by hand, goes unnoticed). The trap also runs on `exit N`; it writes nothing to
/// the command's stdout or stderr. (Subshells do not inherit the trap, so only the command's own
/// shell reports.)
pub(super) fn wrap_command(
    command: &str,
    report: Report<'_>,
    cwd_file: &Path,
    start: &Path,
    cgroup: Option<&Join>,
) -> OsString {
    let q = |p: &Path| crate::shell::quote_bytes(p.as_os_str().as_bytes());
    // `builtin` in case the command defined functions of these names; `>|` in case it set
    // noclobber; `|| true` in case it set errexit and its directory was deleted meanwhile;
    // `${PWD-}` in case it set nounset and unset PWD.
    let mut trap_body = b"__taskbox_status=$?; [[ ${PWD-} == ".to_vec();
    trap_body.extend_from_slice(&q(start));
    trap_body.extend_from_slice(b" ]] || { builtin pwd -P ");
    match report {
        Report::Path(path) => {
            trap_body.extend_from_slice(b">| ");
            trap_body.extend_from_slice(&q(path));
        }
        Report::Fd(fd) => trap_body.extend_from_slice(format!(">&{fd}").as_bytes()),
    }
    trap_body.extend_from_slice(b"; } 2>/dev/null || { builtin pwd -P >| ");
    trap_body.extend_from_slice(&q(cwd_file));
    trap_body.extend_from_slice(b"; } 2>/dev/null || true; builtin exit $__taskbox_status");
    let mut script = cgroup.map(|c| c.script(cwd_file)).unwrap_or_default();
    script.extend_from_slice(b"trap ");
    script.extend_from_slice(&crate::shell::quote_bytes(&trap_body));
    script.extend_from_slice(b" EXIT; ");
    script.extend_from_slice(command.as_bytes());
    OsString::from_vec(script)
}

/// `bash -c SCRIPT` with piped output (and stdin when the caller has some), a clean
/// environment of `env` only (nothing of the server's reaches the command) and a process group
/// of its own (a timeout or a cancel kills everything the command started).
pub(super) fn bash_command(
    script: OsString,
    stdin: bool,
    env: &[(&str, &OsStr)],
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("bash");
    command
        .arg("-c")
        .arg(script)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_clear()
        .envs(env.iter().copied())
        .process_group(0);
    command
}
