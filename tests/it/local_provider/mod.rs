//! The local provider against real files and real processes, one concern a file: sandboxes and
//! command semantics (cwd, exit codes, timeouts, output bounds) in `commands`, deadlines in
//! `deadlines`, processes that try to outlive their sandbox in `escapes`, snapshots in `snapshots`, the archive extraction's refusals in `archives`, and
//! ids, listing and sweeping in `listing`. The test environment they share lives here.

mod archives;
mod cas;
mod commands;
mod deadlines;
mod escapes;
mod listing;
mod metadata;
mod snapshots;
mod tracked;

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use taskbox::core::{FailureKind, Millis};
use taskbox::provider::local::LocalProvider;
use taskbox::provider::{
    sandbox_name, ExecOutput, ExecRequest, ProviderError, SandboxProvider, SandboxSpec,
};

use crate::support::ManualClock;
use taskbox::ids::{SandboxId, SnapshotId, TaskId};

const START_MS: Millis = 1_700_000_000_000;
const INSTALLATION: &str = "inst-a";

struct Env {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    provider: LocalProvider,
}

impl Env {
    fn new() -> Env {
        Env::with_installation(INSTALLATION)
    }

    fn with_installation(installation: &str) -> Env {
        let dir = tempfile::tempdir().expect("temp dir");
        fs::create_dir(dir.path().join("outside")).expect("outside dir");
        let clock = Arc::new(ManualClock(AtomicU64::new(START_MS)));
        let provider = LocalProvider::new(
            dir.path().join("data/local"),
            installation.to_string(),
            clock.clone(),
        )
        .expect("provider");
        Env {
            dir,
            clock,
            provider,
        }
    }

    /// An environment whose provider isolates its sandboxes (`terminal.local_isolation =
    /// namespaces`); `None` (skipped, said on stderr) where this machine cannot, except under
    /// CI, where that fails.
    #[allow(clippy::print_stderr)] // a skip says so
    fn isolated(test: &str) -> Option<Env> {
        if let Err(e) = taskbox::provider::local::isolation::probe() {
            assert!(
                !crate::support::under_ci(),
                "{test}: isolation must work under CI: {e}"
            );
            eprintln!("SKIPPED {test}: {e}");
            return None;
        }
        let Env {
            dir,
            clock,
            provider,
        } = Env::new();
        let provider = provider.with_isolation(taskbox::provider::local::isolation::Settings {
            mode: taskbox::config::LocalIsolation::Namespaces,
            ..Default::default()
        });
        Some(Env {
            dir,
            clock,
            provider,
        })
    }

    /// A second provider (another installation) over the same root.
    fn sibling(&self, installation: &str) -> LocalProvider {
        LocalProvider::new(
            self.dir.path().join("data/local"),
            installation.to_string(),
            self.clock.clone(),
        )
        .expect("sibling provider")
    }

    fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }

    fn root(&self) -> PathBuf {
        self.provider.root().to_path_buf()
    }

    async fn create(&self, task: &str, generation: u64, source: Option<&str>) -> SandboxId {
        self.try_create(task, generation, source, 600_000)
            .await
            .expect("create sandbox")
    }

    async fn try_create(
        &self,
        task: &str,
        generation: u64,
        source: Option<&str>,
        timeout_ms: u64,
    ) -> Result<SandboxId, ProviderError> {
        let info = self
            .provider
            .create_sandbox(&spec(task, generation, source, timeout_ms))
            .await?;
        assert_eq!(info.name, sandbox_name(INSTALLATION, task, generation));
        Ok(info.id)
    }

    async fn run(&self, sandbox: &SandboxId, command: &str) -> ExecOutput {
        self.try_run(sandbox, command, 10_000)
            .await
            .unwrap_or_else(|e| panic!("`{command}` failed: {e}"))
    }

    async fn try_run(
        &self,
        sandbox: &SandboxId,
        command: &str,
        timeout_ms: u64,
    ) -> Result<ExecOutput, ProviderError> {
        let req = ExecRequest {
            command: command.to_string(),
            timeout_ms,
        };
        self.provider.exec(sandbox, &req).await
    }

    /// Leftovers of operations under `tmp/` (there must be none after an operation ends).
    fn tmp_entries(&self) -> Vec<PathBuf> {
        fs::read_dir(self.root().join("tmp"))
            .expect("tmp dir")
            .map(|e| e.expect("entry").path())
            .collect()
    }
}

fn spec(task: &str, generation: u64, source: Option<&str>, timeout_ms: u64) -> SandboxSpec {
    SandboxSpec {
        task_id: TaskId::new(task).expect("a valid task id"),
        generation,
        name: sandbox_name(INSTALLATION, task, generation),
        source_snapshot: source.map(SnapshotId::from),
        timeout_ms,
        installation_id: INSTALLATION.to_string(),
    }
}

/// Whether the process has exited (a zombie counts: it runs no more; this sandbox's PID 1 may
/// not reap it).
fn pid_gone(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
    }
}

/// Waits (bounded) until `condition` holds.
async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn assert_kind<T: std::fmt::Debug>(result: Result<T, ProviderError>, kind: FailureKind) -> String {
    match result {
        Err(e) => {
            assert_eq!(e.kind, kind, "unexpected error: {e}");
            e.to_string()
        }
        Ok(v) => panic!("expected {kind:?}, got {v:?}"),
    }
}

/// What every path below `root` is — a file's mode, mtime, size and bytes; a symlink's target;
/// a directory's mode — leaving out the subtrees in `skip`. Taken before and after a refused
/// restore, it shows whether anything appeared or changed outside the target, whatever the
/// error said. (A directory's mtime is left out: the provider's temporaries come and go.)
fn tree_state(root: &std::path::Path, skip: &[PathBuf]) -> BTreeMap<PathBuf, String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("read a directory of the test's tree") {
            let path = entry.expect("a directory entry").path();
            if skip.iter().any(|s| path.starts_with(s)) {
                continue;
            }
            let meta = fs::symlink_metadata(&path).expect("stat a path of the test's tree");
            let what = if meta.file_type().is_symlink() {
                format!(
                    "symlink -> {}",
                    fs::read_link(&path).expect("readlink").display()
                )
            } else if meta.is_dir() {
                stack.push(path.clone());
                format!("dir {:o}", meta.mode() & 0o7777)
            } else if meta.is_file() {
                format!(
                    "file {:o} mtime {}.{} {} bytes {:?}",
                    meta.mode() & 0o7777,
                    meta.mtime(),
                    meta.mtime_nsec(),
                    meta.len(),
                    String::from_utf8_lossy(&fs::read(&path).expect("read a file"))
                )
            } else {
                format!("special {:o}", meta.mode())
            };
            out.insert(path, what);
        }
    }
    out
}

/// Asserts that `after` has the same paths as `before` with the same contents, naming each
/// path that appeared, vanished or changed.
fn assert_untouched(
    case: &str,
    before: &BTreeMap<PathBuf, String>,
    after: &BTreeMap<PathBuf, String>,
) {
    let mut diff = Vec::new();
    for (path, was) in before {
        match after.get(path) {
            None => diff.push(format!("vanished: {}", path.display())),
            Some(now) if now != was => {
                diff.push(format!("changed: {} ({was} -> {now})", path.display()))
            }
            Some(_) => {}
        }
    }
    for (path, now) in after {
        if !before.contains_key(path) {
            diff.push(format!("appeared: {} ({now})", path.display()));
        }
    }
    assert!(
        diff.is_empty(),
        "{case}: files outside the target changed:\n{}",
        diff.join("\n")
    );
}
