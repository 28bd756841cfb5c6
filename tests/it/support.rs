//! Shared helpers for the integration tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use taskbox::clock::Clock;
use taskbox::core::Millis;

/// A fresh `TASKBOX_HOME` in a temporary directory.
pub struct Home {
    pub dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl Home {
    pub fn new() -> Home {
        Home {
            dir: tempfile::tempdir().expect("temp dir"),
            env: Vec::new(),
        }
    }

    /// Sets an environment variable for every command of this home.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.push((key.to_string(), value.to_string()));
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The `taskbox` binary (the front) with this home.
    pub fn cmd(&self) -> Command {
        self.cmd_of(Path::new(env!("CARGO_BIN_EXE_taskbox")))
    }

    /// `exe` (a copy of the front, or the engine) with this home.
    pub fn cmd_of(&self, exe: &Path) -> Command {
        let mut c = Command::new(exe);
        c.env("TASKBOX_HOME", self.path())
            .env_remove("RUST_LOG")
            .env_remove("VERCEL_TOKEN")
            .env_remove("VERCEL_OIDC_TOKEN")
            .env_remove("VERCEL_PROJECT_ID")
            .env_remove("VERCEL_TEAM_ID")
            .env_remove("TERMINAL_VERCEL_RUNTIME")
            .env_remove("TASKBOX_VERCEL_API_URL")
            // One-shot engines, as these tests were written for (a SIGKILL of the CLI kills the
            // engine); tests/it/server sets `auto` and cleans up its servers.
            .env("TASKBOX_SERVER", "never")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// Runs `taskbox ARGS` to completion.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().expect("spawn taskbox")
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts success and returns stdout.
#[track_caller]
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "taskbox failed ({:?})\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

/// Polls `f` until it returns `Some`, for at most `limit`.
pub fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A clock the test moves by hand.
#[derive(Debug)]
pub struct ManualClock(pub AtomicU64);

impl ManualClock {
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }
}

/// A single-threaded runtime whose clock starts paused, so timers advance only when every task
/// waits (the simulator and the engine run on it deterministically).
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime")
}

/// A task id for a test: the literal must be a valid one (the tests of the validation itself
/// call `TaskId::new` directly).
pub fn tid(id: &str) -> taskbox::TaskId {
    taskbox::TaskId::new(id).expect("a valid task id")
}

/// A sandbox id for a test (provider ids are opaque, never validated).
pub fn sbx(id: &str) -> taskbox::ids::SandboxId {
    taskbox::ids::SandboxId::from(id)
}

/// A snapshot id for a test.
pub fn snap(id: &str) -> taskbox::ids::SnapshotId {
    taskbox::ids::SnapshotId::from(id)
}

/// Whether this is a CI run (`CI` set to anything but empty, `0` or `false`), which must not
/// skip a test for want of a tool, a privilege or the network. The one place the suite decides
/// "CI": every skip goes through [`skip`].
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "FALSE" | "False"))
}

/// The `terminal.local_isolation` modes a test of both local paths runs: `none`, and
/// `namespaces` unless the kernel refuses them outside CI (then skipped with a line saying so;
/// under CI that fails).
#[allow(clippy::print_stderr)] // a skip says so
pub fn isolation_modes(test: &str) -> Vec<&'static str> {
    match taskbox::provider::local::isolation::probe() {
        Ok(()) => vec!["none", "namespaces"],
        Err(e) => {
            assert!(!under_ci(), "{test}: isolation must work under CI: {e}");
            eprintln!("SKIPPED {test} (namespaces): {e}");
            vec!["none"]
        }
    }
}

/// Whether any process runs a command line containing `marker` (a zombie's is empty).
pub fn process_running(marker: &str) -> bool {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten().any(|e| {
                std::fs::read(e.path().join("cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).contains(marker))
                    .unwrap_or(false)
            })
        })
        .unwrap_or(false)
}

/// How many cases a property test runs: `PROPTEST_CASES` when it is set (proptest's own
/// variable, which the tests' explicit case counts would otherwise hide — e.g.
/// `PROPTEST_CASES=2000 cargo test --test it cas::` for a long local run), else `ci` under CI
/// ([`under_ci`]), else `local` (a quick everyday run).
pub fn proptest_cases(local: u32, ci: u32) -> u32 {
    match std::env::var("PROPTEST_CASES") {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().unwrap_or_else(|_| {
            panic!(
                "PROPTEST_CASES={v:?} is not a number of cases: set it to e.g. 1000, or unset it"
            )
        }),
        _ if under_ci() => ci,
        _ => local,
    }
}

/// The cargo target dir (the binary is `<target>/<profile>/taskbox`).
pub fn target_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_BIN_EXE_taskbox"))
        .parent()
        .and_then(Path::parent)
        .expect("the taskbox binary lives in <target>/<profile>/")
        .to_path_buf()
}

/// The file every skip of the integration tests is appended to (one line each).
pub fn skips_file() -> std::path::PathBuf {
    target_dir().join("taskbox-skipped-tests.txt")
}

/// Says that the calling test skips, and why: the caller returns right after. Under CI
/// ([`under_ci`]) a skip is a failure, so this panics. Otherwise it writes one line,
/// `SKIPPED <test>: <why>`, straight to the process's stderr — libtest captures only the
/// `print!`/`eprint!` macros, so the line shows in a plain `cargo test` too, between the
/// `test … ok` lines — and appends it to [`skips_file`] for a look after the run.
pub fn skip(why: impl std::fmt::Display) {
    use std::io::Write;
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    assert!(
        !under_ci(),
        "{test} would skip, and CI never skips (unset CI to allow it): {why}"
    );
    let line = format!("SKIPPED {test}: {why}\n");
    // A test that cannot print its skip still skips: both writes are best effort.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(skips_file())
        .and_then(|mut f| f.write_all(line.as_bytes()));
}

/// Creates `path` and holds an exclusive `flock` on it (waiting for another holder) while the
/// returned file lives: the lock around a one-time install that parallel tests share.
pub fn install_lock(path: &std::path::Path) -> Result<std::fs::File, String> {
    let file = std::fs::File::create(path)
        .map_err(|e| format!("cannot create the install lock {}: {e}", path.display()))?;
    lock(&file).map_err(|e| format!("cannot lock {}: {e}", path.display()))?;
    Ok(file)
}

/// Takes an exclusive `flock` on `file`, waiting for another holder.
pub fn lock(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: `flock` takes a descriptor and flags and touches no memory of ours; `file` is
        // borrowed for the whole call, so its descriptor is open (and not reused) until it
        // returns. A bad descriptor would only make it fail with EBADF, reported below.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A child in a process group of its own, killed (the whole group) when dropped — on every
/// path, panics included.
pub struct Group(pub std::process::Child);

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: `kill` takes a pid and a signal and touches no memory; the negative pid names
        // the child's own process group (it was spawned with `process_group(0)`), so nothing
        // outside the group is signalled.
        unsafe {
            libc::kill(-(self.0.id() as i32), libc::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to completion within `limit`: (success, stdout and stderr) or why it could not.
pub fn run_bounded(
    mut cmd: Command,
    limit: Duration,
    what: &str,
) -> Result<(bool, String), String> {
    let out_file = tempfile::tempfile().map_err(|e| format!("temp file: {e}"))?;
    let err_file = out_file
        .try_clone()
        .map_err(|e| format!("temp file: {e}"))?;
    let mut reader = out_file
        .try_clone()
        .map_err(|e| format!("temp file: {e}"))?;
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    cmd.stdin(Stdio::null())
        .stdout(out_file)
        .stderr(err_file)
        .process_group(0);
    let mut child = Group(cmd.spawn().map_err(|e| format!("cannot run {what}: {e}"))?);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().map_err(|e| format!("{what}: {e}"))? {
            break status;
        }
        if started.elapsed() > limit {
            return Err(format!("{what} took more than {} s", limit.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(child);
    use std::io::Seek;
    reader.rewind().map_err(|e| format!("{what}: {e}"))?;
    let mut text = String::new();
    reader
        .read_to_string(&mut text)
        .map_err(|e| format!("{what}: {e}"))?;
    Ok((status.success(), text))
}

/// The id of `task`'s live sandbox as the engine shows it (a Vercel session id); panics when
/// the task has none.
pub async fn live_sandbox(
    orch: &taskbox::engine::Orchestrator,
    task: &taskbox::TaskId,
) -> taskbox::ids::SandboxId {
    orch.show(task, 0)
        .await
        .expect("show")
        .expect("the task")
        .task
        .sandbox
        .expect("a live sandbox")
        .id
}

/// The first lines of a failed tool's stderr, for a skip message.
pub fn head(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(4)
        .collect::<Vec<_>>()
        .join(" | ")
}

/// The python of the venv `target/<name>` (under the target dir, so it is git-ignored and goes
/// with `cargo clean`) with the repository's `requirements` file installed, making and
/// installing it if needed, one test process at a time (`target/<name>.lock`). `Err` says why
/// it cannot (no `python3`, no `venv` module, no PyPI, a failed install); `needs` names the
/// Python the requirements need.
pub fn python_venv(name: &str, requirements: &str, needs: &str) -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target dir")
        .join(name);
    let venv = venv.as_path();
    let requirements_file = requirements;
    let requirements = Path::new(env!("CARGO_MANIFEST_DIR")).join(requirements_file);
    let wanted = std::fs::read_to_string(&requirements)
        .map_err(|e| format!("cannot read {}: {e}", requirements.display()))?;
    let python = venv.join("bin/python");
    let stamp = venv.join("taskbox-requirements.txt");
    let installed = || std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted);
    if installed() && python.is_file() {
        return Ok(python);
    }
    let parent = venv.parent().expect("the venv has a parent");
    std::fs::create_dir_all(parent)
        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    let lock_path = parent.join(format!("{name}.lock"));
    let _lock_file = install_lock(&lock_path)?;
    // Another test process may have installed it while this one waited for the lock.
    if installed() && python.is_file() {
        return Ok(python);
    }
    match Command::new("python3").arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => {
            return Err(format!(
                "`python3` is not installed (the test needs {needs})"
            ))
        }
    }
    if !python.is_file() {
        let out = Command::new("python3")
            .args(["-m", "venv"])
            .arg(venv)
            .output()
            .map_err(|e| format!("cannot run `python3 -m venv`: {e}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(venv);
            return Err(format!(
                "`python3 -m venv` failed (on Debian: apt-get install python3-venv): {}",
                head(&out.stderr)
            ));
        }
    }
    let out = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--retries", "1", "--timeout", "60", "-r"])
        .arg(&requirements)
        .output()
        .map_err(|e| format!("cannot run pip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`pip install -r {requirements_file}` failed (is PyPI reachable?): {}",
            head(&out.stderr)
        ));
    }
    std::fs::write(&stamp, &wanted)
        .map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    Ok(python)
}
