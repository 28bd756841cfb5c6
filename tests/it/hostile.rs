//! Issue 12's hangs and wedges, end to end on the real binary, real files and real processes:
//! a lock file deleted under its holder, a full disk under the journal, a create loop.

use std::process::Stdio;
use std::time::Duration;

use crate::support::{ok, stderr, Home};

/// A lock file unlinked while its holder drives the task must not let a second process drive
/// the task too: the second `taskbox run` waits until the first has finished.
#[test]
fn deleting_the_lock_file_does_not_let_two_processes_drive_one_task() {
    let home = Home::new();
    ok(&home.run(&["run", "-t", "t", "--", "true"]));
    // Both commands mark and look in the task's workspace (the sandbox's only shared tree).
    let mut first = home
        .cmd()
        .args([
            "run",
            "-t",
            "t",
            "--",
            "echo holding; sleep 2; touch first-done",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the first taskbox");
    // The first process holds the task's lock once its command runs: wait for the line the
    // command prints (bounded: a reader thread, a channel with a timeout).
    let (tx, rx) = std::sync::mpsc::channel();
    let first_out = first.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(first_out)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the first command runs");
    assert_eq!(line, "holding");
    let lock = find_file(home.path(), "t.lock").expect("the task's lock file");
    std::fs::remove_file(&lock).expect("unlink the lock file");
    let probe = "if [ -e first-done ]; then echo after; else echo overlap; fi";
    let second_out = home
        .cmd()
        .args(["run", "-t", "t", "--", probe])
        .output()
        .expect("run the second taskbox");
    let first_status = first.wait().expect("wait for the first taskbox");
    assert!(first_status.success(), "the first run failed");
    assert_eq!(
        ok(&second_out).trim(),
        "after",
        "the second process drove the task while the first still held it"
    );
}

fn find_file(dir: &std::path::Path, name: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if entry.file_name() == name {
            return Some(path);
        }
        if entry.file_type().ok()?.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        }
    }
    None
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`mount -o size=`), or says why it cannot.
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { dir })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Runs `cmd` and kills it if it has not finished within `limit`: `None` means it hung.
fn output_within(mut cmd: std::process::Command, limit: Duration) -> Option<std::process::Output> {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn taskbox");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => Some(out.expect("wait for taskbox")),
        Err(_) => {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
            None
        }
    }
}

/// A command fills the disk that holds the store: the transition after it cannot be journaled.
/// `taskbox run` must answer (exit 125, "no space left on device", the store's path and a hint)
/// instead of waiting forever, and once space is back the task carries on with its files.
#[test]
fn a_full_disk_answers_the_caller_and_the_task_recovers_once_space_is_back() {
    let fs = match Tmpfs::mount("16m") {
        Ok(fs) => fs,
        Err(why) => {
            crate::support::skip(format!("{why} (needs root to mount a tmpfs)"));
            return;
        }
    };
    let mut home = Home::new();
    let home_dir = fs.dir.path().join("home");
    std::fs::create_dir(&home_dir).expect("home on the tmpfs");
    home.set_env("TASKBOX_HOME", home_dir.to_str().expect("utf-8 path"));
    ok(&home.run(&["run", "-t", "full", "--", "echo kept > kept.txt"]));

    let mut cmd = home.cmd();
    cmd.args([
        "run",
        "-t",
        "full",
        "--",
        "head -c 64m /dev/zero > big.bin 2>/dev/null; true",
    ]);
    let out = output_within(cmd, Duration::from_secs(60))
        .expect("`taskbox run` hung when the journal could not be written (disk full)");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(125), "stderr:\n{err}");
    assert!(err.contains("no space left on device"), "stderr:\n{err}");
    assert!(
        err.contains("taskbox.db"),
        "the store's path is named:\n{err}"
    );
    assert!(
        err.contains("hint: free space"),
        "a hint says what to do:\n{err}"
    );

    // Space comes back: the task goes on, with the files written before.
    let big = find_file(&home_dir, "big.bin").expect("the command's file");
    std::fs::remove_file(&big).expect("free the space");
    let out = ok(&home.run(&["run", "-t", "full", "--", "cat kept.txt"]));
    assert_eq!(out.trim(), "kept");
    ok(&home.run(&["suspend", "full"]));
    let out = ok(&home.run(&["run", "-t", "full", "--", "cat kept.txt"]));
    assert_eq!(out.trim(), "kept");
}

fn find_files_ending(dir: &std::path::Path, suffix: &str, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            find_files_ending(&path, suffix, found);
        } else if entry.file_name().to_string_lossy().ends_with(suffix) {
            found.push(path);
        }
    }
}

/// On the local backend nothing dies at a deadline: files written in a sandbox that passed its
/// deadline while taskbox was not running are kept by a late checkpoint, not discarded.
#[test]
fn files_still_on_disk_at_a_local_expiry_are_kept_by_a_late_checkpoint() {
    let home = Home::new();
    for (key, value) in [
        ("terminal.sandbox_timeout_seconds", "2"),
        ("terminal.max_sandbox_lifetime_seconds", "2"),
        ("terminal.checkpoint_margin_seconds", "1"),
    ] {
        ok(&home.run(&["config", "set", key, value]));
    }
    ok(&home.run(&["run", "-t", "late", "--", "echo a > a.txt"]));
    ok(&home.run(&["suspend", "late"]));
    ok(&home.run(&["run", "-t", "late", "--", "echo b > b.txt"]));
    std::thread::sleep(Duration::from_millis(2_500));
    let out = home.run(&["run", "-t", "late", "--", "cat a.txt b.txt"]);
    let text = ok(&out);
    assert_eq!(text, "a\nb\n", "stderr:\n{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("late checkpoint"), "{err}");
    assert!(err.contains("files are back"), "{err}");
    assert!(!err.contains("lost") && !err.contains("gone,"), "{err}");
}

/// A restore that falls back to an older snapshot names it, says when it was taken and that
/// the changes after it are gone — never "files are back".
#[test]
fn a_fallback_restore_note_says_changes_after_the_snapshot_are_gone() {
    let home = Home::new();
    ok(&home.run(&["run", "-t", "fb", "--", "echo v1 > f"]));
    ok(&home.run(&["suspend", "fb"]));
    ok(&home.run(&["run", "-t", "fb", "--", "echo v2 > f"]));
    ok(&home.run(&["suspend", "fb"]));
    // The newest archive vanishes behind taskbox's back.
    let mut archives = Vec::new();
    find_files_ending(home.path(), ".tbx", &mut archives);
    archives.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    let newest = archives.last().expect("an archive");
    std::fs::remove_file(newest).expect("remove the newest archive");
    let out = home.run(&["run", "-t", "fb", "--", "cat f"]);
    assert_eq!(ok(&out), "v1\n");
    let err = stderr(&out);
    assert!(
        // Archives are named `<task>.s<seq>.<nonce>`.
        err.contains("recreated from snapshot fb.s1.")
            && err.contains(" taken at 20")
            && err.contains("changes made after that snapshot are gone"),
        "{err}"
    );
    assert!(!err.contains("files are back"), "{err}");
}

/// gc removes every local sandbox dir that no task holds, past its deadline or not (a sandbox
/// dir holds files until it is stopped), and leaves the ones tasks hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_sweeps_every_local_sandbox_dir_no_task_holds() {
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    use taskbox::config::Config;
    use taskbox::engine::Orchestrator;
    use taskbox::provider::{sandbox_name, SandboxSpec};
    use taskbox::TaskId;

    use crate::support::ManualClock;

    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock(AtomicU64::new(1_700_000_000_000)));
    let orch = Orchestrator::builder(dir.path().to_path_buf(), Config::default())
        .clock(clock.clone())
        .reconcile_on_start(false)
        .open()
        .await
        .expect("open");
    let held = TaskId::new("held").expect("task id");
    orch.run(&held, "echo x > f", None).await.expect("run");
    let p = orch.provider();
    let inst = orch.installation_id().to_string();
    // Leaked creations of a task (as a create loop left them): nothing refers to them.
    let mut leaked = Vec::new();
    for generation in 1..=3 {
        let info = p
            .create_sandbox(&SandboxSpec {
                task_id: TaskId::new("leak").expect("task id"),
                generation,
                name: sandbox_name(&inst, "leak", generation),
                source_snapshot: None,
                timeout_ms: 1_000,
                installation_id: inst.clone(),
            })
            .await
            .expect("create");
        leaked.push(info.id);
    }
    clock.advance(2_000); // every leaked one is past its deadline
    let report = orch.gc(false).await.expect("gc");
    let mut stopped: Vec<String> = report
        .sandboxes_stopped
        .iter()
        .map(|i| i.id.clone())
        .collect();
    stopped.sort();
    assert_eq!(stopped, leaked, "{report:?}");
    let left: Vec<String> = p
        .list_sandboxes(&inst)
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(left, vec![sandbox_name(&inst, "held", 1)]);
    orch.shutdown().await;
}

/// A command with a NUL byte can never run (an argument ends there): it is refused before the
/// task or a sandbox is made, with a stable code (issue 32 item 15).
#[tokio::test]
async fn a_command_with_a_nul_is_refused_before_anything_is_made() {
    use taskbox::config::Config;
    use taskbox::engine::{EngineError, Orchestrator};
    use taskbox::TaskId;

    let dir = tempfile::tempdir().expect("temp dir");
    let orch = Orchestrator::builder(dir.path().to_path_buf(), Config::default())
        .reconcile_on_start(false)
        .open()
        .await
        .expect("open");
    let task = TaskId::new("nul").expect("task id");
    let err = orch
        .run(&task, "echo a\0b", None)
        .await
        .expect_err("a NUL is refused");
    assert!(matches!(err, EngineError::InvalidCommand { .. }), "{err:?}");
    assert_eq!(err.code(), "invalid_command");
    assert!(err.to_string().contains("NUL byte at byte 6"), "{err}");
    assert!(orch.show(&task, 0).await.expect("show").is_none());
    assert!(orch.tasks().await.expect("tasks").is_empty());
    orch.shutdown().await;
}
