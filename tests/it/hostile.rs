//! Issue 12's hangs and wedges, end to end on the real binary, real files and real processes:
//! a lock file deleted under its holder, a full disk under the journal, a create loop.

use std::process::Stdio;
use std::time::Duration;

use crate::support::{ok, wait_for, Home};

/// A lock file unlinked while its holder drives the task must not let a second process drive
/// the task too: the second `taskbox run` waits until the first has finished.
#[test]
fn deleting_the_lock_file_does_not_let_two_processes_drive_one_task() {
    let home = Home::new();
    let out = tempfile::tempdir().expect("temp dir");
    let first_done = out.path().join("first-done");
    let second = out.path().join("second");
    ok(&home.run(&["run", "-t", "t", "--", "true"]));
    let mut first = home
        .cmd()
        .args([
            "run",
            "-t",
            "t",
            "--",
            &format!("sleep 2; touch '{}'", first_done.display()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the first taskbox");
    // The lock file exists since the first run; give the second process time to take it.
    let lock = wait_for(Duration::from_secs(10), || find_file(home.path(), "t.lock"))
    .expect("the first process took the task lock");
    std::thread::sleep(Duration::from_millis(500));
    std::fs::remove_file(&lock).expect("unlink the lock file");
    let probe = format!(
        "if [ -e '{d}' ]; then echo after > '{s}'; else echo overlap > '{s}'; fi",
        d = first_done.display(),
        s = second.display()
    );
    let second_out = home
        .cmd()
        .args(["run", "-t", "t", "--", &probe])
        .output()
        .expect("run the second taskbox");
    let first_status = first.wait().expect("wait for the first taskbox");
    assert!(first_status.success(), "the first run failed");
    ok(&second_out);
    let seen = std::fs::read_to_string(&second).expect("the second command ran");
    assert_eq!(
        seen.trim(),
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

