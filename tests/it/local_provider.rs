//! The local provider against real files and real processes: lifecycle, command semantics
//! (cwd, exit codes, timeouts, output bounds), snapshots and the archive extraction's refusals.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use taskbox::clock::Clock;
use taskbox::core::{FailureKind, Millis};
use taskbox::provider::local::archive::{self, ArchiveError, ArchiveHeader};
use taskbox::provider::local::LocalProvider;
use taskbox::provider::{
    sandbox_name, ExecOutput, ExecRequest, ProviderError, SandboxProvider, SandboxSpec,
};

const START_MS: Millis = 1_700_000_000_000;
const INSTALLATION: &str = "inst-a";

/// A clock the test moves by hand.
#[derive(Debug)]
struct TestClock(AtomicU64);

impl TestClock {
    fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for TestClock {
    fn now_ms(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }
}

struct Env {
    dir: tempfile::TempDir,
    clock: Arc<TestClock>,
    provider: LocalProvider,
}

impl Env {
    fn new() -> Env {
        Env::with_installation(INSTALLATION)
    }

    fn with_installation(installation: &str) -> Env {
        let dir = tempfile::tempdir().expect("temp dir");
        fs::create_dir(dir.path().join("outside")).expect("outside dir");
        let clock = Arc::new(TestClock(AtomicU64::new(START_MS)));
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

    async fn create(&self, task: &str, generation: u64, source: Option<&str>) -> String {
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
    ) -> Result<String, ProviderError> {
        let info = self
            .provider
            .create_sandbox(&spec(task, generation, source, timeout_ms))
            .await?;
        assert_eq!(info.name, sandbox_name(task, generation));
        Ok(info.id)
    }

    async fn run(&self, sandbox: &str, command: &str) -> ExecOutput {
        self.try_run(sandbox, command, 10_000)
            .await
            .unwrap_or_else(|e| panic!("`{command}` failed: {e}"))
    }

    async fn try_run(
        &self,
        sandbox: &str,
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
        task_id: task.to_string(),
        generation,
        name: sandbox_name(task, generation),
        source_snapshot: source.map(str::to_string),
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

// ---------------------------------------------------------------------------------------------
// Sandboxes and commands

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_exec_and_reuse() {
    let env = Env::new();
    let id = env.create("t1", 1, None).await;
    assert_eq!(id, "taskbox-t1-g1");
    let workspace = env.provider.workspace_path(&id).expect("workspace exists");

    let out = env
        .run(
            &id,
            "echo hi; echo oops >&2; echo \"$TASKBOX_TASK_ID $TASKBOX_SANDBOX\"; echo data > f",
        )
        .await;
    assert_eq!(out.exit_code, 0);
    assert!(!out.timed_out);
    assert_eq!(out.stdout, "hi\nt1 taskbox-t1-g1\n");
    assert_eq!(out.stderr, "oops\n");
    assert_eq!(fs::read_to_string(workspace.join("f")).unwrap(), "data\n");

    // A second create finds the same sandbox (same deadline, files kept).
    let again = env
        .provider
        .create_sandbox(&spec("t1", 1, None, 600_000))
        .await
        .unwrap();
    assert_eq!(again.deadline, START_MS + 600_000);
    assert_eq!(env.run(&id, "cat f").await.stdout, "data\n");
    assert_eq!(
        env.provider.probe_sandbox(&id).await.unwrap(),
        Some(START_MS + 600_000)
    );
    assert!(env.tmp_entries().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn working_directory_is_carried_between_commands() {
    let env = Env::new();
    let id = env.create("cwd", 1, None).await;
    let workspace = env.provider.workspace_path(&id).unwrap();

    env.run(&id, "mkdir -p sub/deeper && cd sub").await;
    assert_eq!(
        env.run(&id, "pwd").await.stdout,
        format!("{}\n", workspace.join("sub").display())
    );
    // `exit N` still records the directory, and keeps its code.
    let out = env.run(&id, "cd deeper; exit 5").await;
    assert_eq!(out.exit_code, 5);
    assert_eq!(
        env.run(&id, "pwd").await.stdout,
        format!("{}\n", workspace.join("sub/deeper").display())
    );
    // The recorded directory disappears: the next command starts at the workspace root.
    env.run(&id, "rm -rf ../deeper").await;
    assert_eq!(
        env.run(&id, "pwd").await.stdout,
        format!("{}\n", workspace.display())
    );
    // Leaving the workspace is not carried over either.
    env.run(&id, "cd /").await;
    assert_eq!(
        env.run(&id, "pwd").await.stdout,
        format!("{}\n", workspace.display())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_and_streams_are_preserved_exactly() {
    let env = Env::new();
    let id = env.create("codes", 1, None).await;
    for (command, code, stdout) in [
        ("echo out; exit 3", 3, "out\n"),
        ("false", 1, ""),
        ("(exit 42)", 42, ""),
        ("true", 0, ""),
        ("kill -9 $$", 137, ""),
        ("printf 'no newline'", 0, "no newline"),
    ] {
        let out = env.run(&id, command).await;
        assert_eq!(out.exit_code, code, "`{command}`");
        assert_eq!(out.stdout, stdout, "`{command}`");
        assert_eq!(out.stderr, "", "`{command}`");
    }
    // The bookkeeping after the command survives errexit, noclobber and shadowing functions.
    for command in [
        "set -e; mkdir -p gone && cd gone && rmdir ../gone; exit 3",
        "set -C; pwd() { echo fake; }; exit 3",
        "exit() { echo no; }; builtin exit 3",
    ] {
        let out = env.run(&id, command).await;
        assert_eq!((out.exit_code, out.stderr.as_str()), (3, ""), "`{command}`");
    }
    // A syntax error is bash's, with bash's code and message.
    let out = env.run(&id, "if then").await;
    assert_eq!(out.exit_code, 2);
    assert!(out.stderr.contains("syntax error"), "{}", out.stderr);
    // Invalid UTF-8 is converted lossily.
    let out = env.run(&id, "printf 'a\\377b'").await;
    assert_eq!(out.stdout, "a\u{fffd}b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_whole_process_group() {
    let env = Env::new();
    let id = env.create("slow", 1, None).await;
    let out = env
        .try_run(&id, "sleep 100 & echo $!; sleep 30", 1_500)
        .await
        .unwrap();
    assert_eq!(out.exit_code, 124);
    assert!(out.timed_out);
    assert!(out.duration_ms < 5_000, "took {} ms", out.duration_ms);
    let pid: u32 = out.stdout.trim().parse().expect("background pid printed");
    wait_for("the background sleep to die", || pid_gone(pid)).await;
    // The sandbox itself survives a command timeout.
    assert_eq!(env.run(&id, "echo alive").await.stdout, "alive\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_command_may_leave_a_background_job_until_the_sandbox_stops() {
    let env = Env::new();
    let id = env.create("bg", 1, None).await;
    // The job keeps stdout open; the command still returns promptly.
    let out = env.run(&id, "sleep 100 & echo $!").await;
    assert!(out.duration_ms < 5_000);
    let pid: u32 = out.stdout.trim().parse().unwrap();
    assert!(
        !pid_gone(pid),
        "the background job outlives its command, as on a VM"
    );
    env.provider.stop_sandbox(&id).await.unwrap();
    wait_for("the stop to kill the background job", || pid_gone(pid)).await;
    assert!(env.provider.workspace_path(&id).is_none());
    // Stopping again succeeds.
    env.provider.stop_sandbox(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_job_writing_after_its_command_returned_keeps_running() {
    let env = Env::new();
    let id = env.create("server", 1, None).await;
    // The job writes to the command's stdout after the command has returned; closing the pipe
    // would kill it with SIGPIPE before it writes the marker.
    let out = env
        .run(
            &id,
            "(sleep 0.6; echo late; echo late >&2; sleep 0.2; touch marker) & echo started",
        )
        .await;
    assert_eq!(out.stdout, "started\n");
    let marker = env.provider.workspace_path(&id).unwrap().join("marker");
    wait_for("the background job to finish its work", || marker.exists()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_output_keeps_head_and_tail_and_says_what_was_cut() {
    let env = Env::new();
    let id = env.create("loud", 1, None).await;
    let out = env.run(&id, "yes | head -c 5000000; echo done >&2").await;
    assert_eq!(out.exit_code, 0);
    assert!(out.stdout.starts_with("y\ny\ny\n"));
    assert!(out.stdout.ends_with("y\ny\n"));
    assert!(
        out.stdout
            .contains("\n[taskbox: output truncated, 4950000 of 5000000 characters omitted]\n"),
        "{}",
        &out.stdout[19_990..20_100]
    );
    assert!(out.stdout.len() < 50_100, "{} bytes", out.stdout.len());
    assert_eq!(out.stderr, "done\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_in_different_sandboxes_run_concurrently() {
    let env = Env::new();
    let a = env.create("conc-a", 1, None).await;
    let b = env.create("conc-b", 1, None).await;
    let flag = env.outside().join("flag");
    let waiter = format!(
        "while [ ! -e '{}' ]; do sleep 0.01; done; echo seen",
        flag.display()
    );
    let toucher = format!("touch '{}'", flag.display());
    // If B waited for A to finish, A would wait for the flag until its timeout.
    let (out_a, out_b) = tokio::join!(env.try_run(&a, &waiter, 5_000), async {
        env.run(&b, &toucher).await
    });
    let out_a = out_a.unwrap();
    assert_eq!((out_a.exit_code, out_a.stdout.as_str()), (0, "seen\n"));
    assert_eq!(out_b.exit_code, 0);
}

// ---------------------------------------------------------------------------------------------
// Deadlines

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_sandbox_is_gone_and_its_workspace_discarded() {
    let env = Env::new();
    let id = env.try_create("exp", 1, None, 1_000).await.unwrap();
    env.run(&id, "echo x > f").await;

    // Extending moves the deadline.
    let extended = env.provider.extend_timeout(&id, 500).await.unwrap();
    assert_eq!(extended, START_MS + 1_500);
    env.clock.advance(1_200);
    assert_eq!(env.run(&id, "cat f").await.stdout, "x\n");

    env.clock.advance(300);
    let msg = assert_kind(
        env.try_run(&id, "cat f", 1_000).await,
        FailureKind::SandboxGone,
    );
    assert!(msg.contains("expired"), "{msg}");
    assert!(env.provider.workspace_path(&id).is_none());
    assert_eq!(env.provider.probe_sandbox(&id).await.unwrap(), None);
    assert_kind(
        env.provider.extend_timeout(&id, 1_000).await,
        FailureKind::SandboxGone,
    );
    // Creating it again gives a fresh, empty workspace.
    let id = env.create("exp", 1, None).await;
    assert_eq!(env.run(&id, "ls -A").await.stdout, "");
    assert!(env.tmp_entries().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_expiring_under_a_command_kills_it() {
    let env = Env::new();
    let id = env.try_create("under", 1, None, 10_000).await.unwrap();
    let workspace = env.provider.workspace_path(&id).unwrap();
    let running = env.try_run(&id, "touch started; sleep 30", 20_000);
    let advance = async {
        wait_for("the command to start", || {
            workspace.join("started").exists()
        })
        .await;
        env.clock.advance(10_000);
    };
    let (result, ()) = tokio::join!(running, advance);
    let msg = assert_kind(result, FailureKind::SandboxGone);
    assert!(
        msg.contains("expired while the command was running"),
        "{msg}"
    );
    assert!(env.provider.workspace_path(&id).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_sandbox_under_a_command_kills_the_command() {
    let env = Env::new();
    let id = env.create("stopped", 1, None).await;
    let workspace = env.provider.workspace_path(&id).unwrap();
    let running = env.try_run(&id, "touch started; sleep 30", 20_000);
    let stop = async {
        wait_for("the command to start", || {
            workspace.join("started").exists()
        })
        .await;
        env.provider.stop_sandbox(&id).await.unwrap();
    };
    let (result, ()) = tokio::join!(running, stop);
    assert_kind(result, FailureKind::SandboxGone);
}

// ---------------------------------------------------------------------------------------------
// Snapshots

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_stops_the_sandbox_and_restores_files_modes_and_links() {
    let env = Env::new();
    let id = env.create("snap", 1, None).await;
    env.run(
        &id,
        "mkdir -p d/e empty && echo hello > d/e/f && printf '#!/bin/sh\\necho ran\\n' > run.sh \
         && chmod 755 run.sh && echo s > secret && chmod 600 secret && ln -s d/e/f link \
         && ln -s .. d/up && ln run.sh hard && mkdir ro && chmod 555 ro && cd d",
    )
    .await;

    let info = env.provider.snapshot("snap", &id, 1).await.unwrap();
    assert_eq!(info.id, "snap.s1");
    assert!(info.size_bytes > 0);
    assert_eq!(info.expires_at, None);
    // A snapshot stops the sandbox.
    assert!(env.provider.workspace_path(&id).is_none());
    assert_kind(
        env.try_run(&id, "true", 1_000).await,
        FailureKind::SandboxGone,
    );

    // Idempotent by seq: the same answer, even though the sandbox is gone now.
    let again = env.provider.snapshot("snap", &id, 1).await.unwrap();
    assert_eq!(again, info);

    let restored = env.create("snap", 2, Some("snap.s1")).await;
    let ws = env.provider.workspace_path(&restored).unwrap();
    assert_eq!(fs::read_to_string(ws.join("d/e/f")).unwrap(), "hello\n");
    assert_eq!(mode(&ws.join("run.sh")), 0o755);
    assert_eq!(mode(&ws.join("secret")), 0o600);
    assert_eq!(mode(&ws.join("ro")), 0o555);
    assert!(ws.join("empty").is_dir());
    assert_eq!(fs::read_link(ws.join("link")).unwrap(), Path::new("d/e/f"));
    assert_eq!(fs::read_link(ws.join("d/up")).unwrap(), Path::new(".."));
    assert_eq!(
        fs::metadata(ws.join("hard")).unwrap().ino(),
        fs::metadata(ws.join("run.sh")).unwrap().ino()
    );
    // A restored sandbox starts at its root, and its files work.
    let out = env.run(&restored, "pwd; ./run.sh; cat link").await;
    assert_eq!(out.stdout, format!("{}\nran\nhello\n", ws.display()));
    assert!(env.tmp_entries().is_empty());

    let listed = env.provider.list_snapshots(INSTALLATION).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, "snap.s1");
    assert_eq!(listed[0].task_id.as_deref(), Some("snap"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_leaves_out_what_a_restore_would_refuse_and_never_follows_links() {
    let env = Env::new();
    let id = env.create("venv", 1, None).await;
    let outside = env.outside();
    fs::write(outside.join("secret"), "outside").unwrap();
    env.run(
        &id,
        &format!(
            "ln -s /usr/bin/env python && ln -s '{}' ext && ln -s ../.. escape && echo k > keep \
             && mkfifo pipe",
            outside.display()
        ),
    )
    .await;
    env.provider.snapshot("venv", &id, 1).await.unwrap();
    let restored = env.create("venv", 2, Some("venv.s1")).await;
    let ws = env.provider.workspace_path(&restored).unwrap();
    assert_eq!(fs::read_to_string(ws.join("keep")).unwrap(), "k\n");
    for gone in ["python", "ext", "escape", "pipe"] {
        assert!(
            fs::symlink_metadata(ws.join(gone)).is_err(),
            "`{gone}` must not be restored"
        );
    }
    assert!(!ws.join("secret").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_of_a_gone_sandbox_is_sandbox_gone() {
    let env = Env::new();
    assert_kind(
        env.provider.snapshot("ghost", "taskbox-ghost-g1", 1).await,
        FailureKind::SandboxGone,
    );
    let id = env.try_create("late", 1, None, 100).await.unwrap();
    env.clock.advance(100);
    assert_kind(
        env.provider.snapshot("late", &id, 1).await,
        FailureKind::SandboxGone,
    );
    assert!(env.provider.workspace_path(&id).is_none());
    // Another task's sandbox is refused.
    let other = env.create("mine", 1, None).await;
    assert_kind(
        env.provider.snapshot("theirs", &other, 1).await,
        FailureKind::Invalid,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restoring_a_deleted_snapshot_is_snapshot_gone() {
    let env = Env::new();
    let msg = assert_kind(
        env.try_create("del", 1, Some("del.s9"), 60_000).await,
        FailureKind::SnapshotGone,
    );
    assert!(msg.contains("del.s9"), "{msg}");

    let id = env.create("del", 1, None).await;
    env.run(&id, "echo x > f").await;
    env.provider.snapshot("del", &id, 1).await.unwrap();
    env.provider.delete_snapshot("del.s1").await.unwrap();
    env.provider.delete_snapshot("del.s1").await.unwrap(); // idempotent
    let msg = assert_kind(
        env.try_create("del", 2, Some("del.s1"), 60_000).await,
        FailureKind::SnapshotGone,
    );
    assert!(msg.contains("del.s1"), "{msg}");
    assert!(env.provider.workspace_path("taskbox-del-g2").is_none());
    assert!(env.tmp_entries().is_empty());
    assert_kind(
        env.provider.delete_snapshot("../del.s1").await,
        FailureKind::Invalid,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archive_of_an_unknown_version_is_a_typed_error() {
    let env = Env::new();
    let dir = env.root().join("snapshots/vers");
    fs::create_dir_all(&dir).unwrap();
    let mut bytes = archive::MAGIC.to_vec();
    bytes.extend_from_slice(&7u32.to_le_bytes());
    bytes.extend_from_slice(&[0; 32]);
    fs::write(dir.join("1.tbx"), &bytes).unwrap();

    match archive::read_prefix(&mut bytes.as_slice()) {
        Err(ArchiveError::UnknownVersion {
            found: 7,
            supported: 1,
        }) => {}
        other => panic!("expected UnknownVersion, got {other:?}"),
    }
    let msg = assert_kind(
        env.try_create("vers", 1, Some("vers.s1"), 60_000).await,
        FailureKind::Permanent,
    );
    assert!(msg.contains("version 7"), "{msg}");
    // A snapshot whose archive is not ours at all.
    fs::write(dir.join("2.tbx"), b"PK\x03\x04 a zip file").unwrap();
    let msg = assert_kind(
        env.try_create("vers", 2, Some("vers.s2"), 60_000).await,
        FailureKind::Permanent,
    );
    assert!(msg.contains("not a taskbox snapshot archive"), "{msg}");
    assert!(env.tmp_entries().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_or_corrupted_archive_is_refused_not_half_restored() {
    let env = Env::new();
    let id = env.create("cut", 1, None).await;
    env.run(
        &id,
        "for i in $(seq 1 200); do head -c 3000 /dev/urandom > f$i; done",
    )
    .await;
    env.provider.snapshot("cut", &id, 1).await.unwrap();
    let path = env.root().join("snapshots/cut/1.tbx");
    let bytes = fs::read(&path).unwrap();

    fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert_kind(
        env.try_create("cut", 2, Some("cut.s1"), 60_000).await,
        FailureKind::Permanent,
    );
    // Only the zstd checksum at the very end is wrong.
    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0xff;
    fs::write(&path, &flipped).unwrap();
    assert_kind(
        env.try_create("cut", 2, Some("cut.s1"), 60_000).await,
        FailureKind::Permanent,
    );
    assert!(env.provider.workspace_path("taskbox-cut-g2").is_none());
    assert!(env.tmp_entries().is_empty());

    // The intact archive still restores.
    fs::write(&path, &bytes).unwrap();
    let restored = env.create("cut", 2, Some("cut.s1")).await;
    assert_eq!(env.run(&restored, "ls | wc -l").await.stdout, "200\n");
}

// ---------------------------------------------------------------------------------------------
// Malicious archives

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
            source_sandbox: sandbox_name(task, 1),
        },
    )
    .unwrap();
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
            "inner-symlink-then-write",
            vec![dir("sub"), link(Symlink, "s", "sub"), file("s/evil", "x")],
            "s/evil",
        ),
        (
            "dot-symlink-then-write",
            vec![link(Symlink, "here", "."), file("here/evil", "x")],
            "here/evil",
        ),
        ("symlink-up", vec![link(Symlink, "up", "..")], "up"),
        (
            "symlink-chain",
            vec![
                dir("a"),
                link(Symlink, "a/root", ".."),
                link(Symlink, "escape", "a/root/.."),
            ],
            "escape",
        ),
        (
            "symlink-chain-2",
            vec![
                dir("x"),
                dir("x/y"),
                link(Symlink, "x/y/l", "../.."),
                link(Symlink, "m", "x/y/l/x/y/l/.."),
            ],
            "m",
        ),
        (
            "symlink-loop",
            vec![link(Symlink, "p", "q"), link(Symlink, "q", "p")],
            "p",
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
    for (task, entries, named) in &cases {
        plant_archive(&env, task, entries);
        let result = env
            .try_create(task, 2, Some(&format!("{task}.s1")), 60_000)
            .await;
        let msg = assert_kind(result, FailureKind::Permanent);
        assert!(msg.contains("refused archive entry"), "{task}: {msg}");
        assert!(msg.contains(named), "{task}: `{named}` not named in: {msg}");
        assert!(
            env.provider
                .workspace_path(&sandbox_name(task, 2))
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
    assert!(fs::read_dir(&outside).unwrap().next().is_none());
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

// ---------------------------------------------------------------------------------------------
// Ids, listing, sweeping

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ids_are_refused() {
    let env = Env::new();
    env.create("good", 1, None).await;
    for id in [
        "../x",
        "taskbox-../../etc-g1",
        "taskbox-good-g01",
        "taskbox-good",
        "",
    ] {
        assert_kind(env.try_run(id, "true", 1_000).await, FailureKind::Invalid);
        assert_kind(env.provider.stop_sandbox(id).await, FailureKind::Invalid);
        assert_kind(env.provider.probe_sandbox(id).await, FailureKind::Invalid);
        assert_kind(
            env.provider.extend_timeout(id, 1).await,
            FailureKind::Invalid,
        );
        assert!(env.provider.workspace_path(id).is_none());
    }
    assert_kind(
        env.try_create("../x", 1, None, 1_000).await,
        FailureKind::Invalid,
    );
    assert_kind(
        env.try_create("good", 1, Some("../../x.s1"), 1_000).await,
        FailureKind::Invalid,
    );
    let mut mismatched = spec("good", 1, None, 1_000);
    mismatched.name = "taskbox-other-g1".into();
    assert_kind(
        env.provider.create_sandbox(&mismatched).await,
        FailureKind::Invalid,
    );
    assert_kind(
        env.provider.snapshot("a/b", "taskbox-good-g1", 1).await,
        FailureKind::Invalid,
    );
    for id in ["x", "x.1", "x.s01", "../x.s1", "x.s1/.."] {
        assert_kind(env.provider.delete_snapshot(id).await, FailureKind::Invalid);
    }
    assert_kind(
        env.try_run("taskbox-good-g1", "echo a\0b", 1_000).await,
        FailureKind::Invalid,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_returns_only_this_installations_resources() {
    let env = Env::new();
    let other = env.sibling("inst-b");
    let mine = env.create("mine", 1, None).await;
    env.try_create("short", 1, None, 10).await.unwrap();
    let theirs = other
        .create_sandbox(&SandboxSpec {
            installation_id: "inst-b".into(),
            ..spec("theirs", 1, None, 60_000)
        })
        .await
        .unwrap();
    env.run(&mine, "echo m > f").await;
    env.provider.snapshot("mine", &mine, 1).await.unwrap();
    other.snapshot("theirs", &theirs.id, 4).await.unwrap();
    let kept = env.create("kept", 1, None).await;
    env.clock.advance(10);

    let sandboxes = env.provider.list_sandboxes(INSTALLATION).await.unwrap();
    let summary: Vec<(String, Option<String>, bool)> = sandboxes
        .into_iter()
        .map(|r| (r.id, r.task_id, r.live))
        .collect();
    assert_eq!(
        summary,
        vec![
            (kept, Some("kept".into()), true),
            ("taskbox-short-g1".into(), Some("short".into()), false),
        ]
    );
    let snapshots = env.provider.list_snapshots(INSTALLATION).await.unwrap();
    assert_eq!(snapshots.len(), 1);
    assert_eq!(snapshots[0].id, "mine.s1");
    let theirs = other.list_snapshots("inst-b").await.unwrap();
    assert_eq!(theirs.len(), 1);
    assert_eq!(theirs[0].id, "theirs.s4");
    assert!(theirs[0].live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_removes_stale_temporaries_only() {
    let env = Env::new();
    // A pid that is certainly dead: a child we waited for.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let root = env.root();
    let half = root.join(format!("tmp/create.{dead}.0.taskbox-x-g1"));
    fs::create_dir_all(half.join("workspace/deep")).unwrap();
    fs::set_permissions(half.join("workspace"), fs::Permissions::from_mode(0o500)).unwrap();
    fs::create_dir_all(root.join("snapshots/x")).unwrap();
    fs::write(
        root.join(format!("snapshots/x/3.tbx.{dead}.1.tmp")),
        b"half",
    )
    .unwrap();
    fs::write(root.join("snapshots/x/3.tbx"), b"complete").unwrap();
    fs::write(root.join("tmp/not-ours"), b"?").unwrap();
    // Our own pid, but no operation of ours is using it: stale too.
    let mine = root.join(format!(
        "tmp/trash.{}.999999.taskbox-y-g1",
        std::process::id()
    ));
    fs::create_dir_all(&mine).unwrap();

    assert_eq!(env.provider.sweep_temporaries().unwrap(), 3);
    assert!(!half.exists());
    assert!(!mine.exists());
    assert!(root.join("snapshots/x/3.tbx").exists());
    assert!(root.join("tmp/not-ours").exists());
    assert_eq!(env.provider.sweep_temporaries().unwrap(), 0);
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}
