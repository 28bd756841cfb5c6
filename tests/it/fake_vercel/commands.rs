//! Commands and files in a session: reads, writes and mkdir, detached commands polled, logged
//! and killed, and no process surviving a stop.

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{bounded, eventually, expect_error, json_of, ndjson, output_of, start};

#[tokio::test]
async fn files_missing_read_404_and_mkdir() {
    bounded(async {
        let fake = start().await;
        let session = fake.session_id("files").await;
        let resp = fake.read_file(&session, "nope.txt").await;
        expect_error(resp, 404, "not_found").await;
        let resp = fake.read_file(&session, "/etc/passwd").await;
        let msg = expect_error(resp, 400, "bad_request").await;
        assert!(msg.contains("maps only /vercel/sandbox"), "{msg}");
        let mkdir_path = format!("/v2/sandboxes/sessions/{session}/fs/mkdir");
        let mkdir = |path: &'static str, recursive: bool| {
            fake.post(&mkdir_path, json!({"path": path, "recursive": recursive}))
        };
        expect_error(mkdir("a/b", false).await, 400, "bad_request").await;
        assert_eq!(mkdir("a/b", true).await.status(), StatusCode::OK);
        // Commands start in the workspace, so relative paths reach what the API wrote.
        let records = fake.run(&session, "test -d a/b && echo yes").await;
        assert_eq!(output_of(&records, "stdout"), "yes\n");
    })
    .await;
}

#[tokio::test]
async fn detached_commands_poll_logs_and_kill() {
    bounded(async {
        let fake = start().await;
        let session = fake.session_id("detached").await;
        let cmd_path = format!("/v2/sandboxes/sessions/{session}/cmd");
        let started = json_of(
            fake.post(
                &cmd_path,
                json!({"command": "bash", "args": ["-c", "echo one; sleep 0.2; echo two"],
                       "env": {"X": "1"}}),
            )
            .await,
        )
        .await;
        assert_eq!(started["command"]["exitCode"], Value::Null);
        let id = started["command"]["id"].as_str().unwrap().to_string();
        let polled = json_of(fake.get(&format!("{cmd_path}/{id}?wait=true")).await).await;
        assert_eq!(polled["command"]["exitCode"], 0);
        assert!(polled["command"]["durationMs"].is_u64());
        let logs = fake.get(&format!("{cmd_path}/{id}/logs")).await;
        assert_eq!(logs.headers()["content-type"], "application/x-ndjson");
        let records = ndjson(&logs.text().await.unwrap());
        assert_eq!(output_of(&records, "stdout"), "one\ntwo\n");
        assert!(records.iter().all(|r| r.get("command").is_none()));

        let sleeper = json_of(
            fake.post(&cmd_path, json!({"command": "sleep", "args": ["30"]}))
                .await,
        )
        .await;
        let sid = sleeper["command"]["id"].as_str().unwrap().to_string();
        let killed = fake
            .post(&format!("{cmd_path}/{sid}/kill"), json!({"signal": 15}))
            .await;
        assert_eq!(killed.status(), StatusCode::OK);
        let polled = json_of(fake.get(&format!("{cmd_path}/{sid}?wait=true")).await).await;
        assert_eq!(polled["command"]["exitCode"], 143);

        let timed = fake
            .post(
                &cmd_path,
                json!({"command": "sleep", "args": ["30"], "timeout": 200, "wait": true}),
            )
            .await;
        let records = ndjson(&timed.text().await.unwrap());
        assert_eq!(records.last().unwrap()["command"]["exitCode"], 137);

        let missing = fake.run(&session, "exit 0").await;
        assert_eq!(missing.len(), 2, "no output: just the two command records");
        let resp = fake.get(&format!("{cmd_path}/cmd_nope")).await;
        expect_error(resp, 404, "not_found").await;
    })
    .await;
}

/// The host pids of processes whose command line contains `marker` (a contained command's `$!`
/// is a pid of its sandbox's PID namespace, not the host's).
fn host_pids_with(marker: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // A zombie waiting for its parent to reap it has ended.
            String::from_utf8_lossy(&cmdline).contains(marker) && !stat.contains(") Z ")
        })
        .collect()
}

#[tokio::test]
async fn no_process_survives_a_stop() {
    bounded(async {
        let fake = start().await;
        let session = fake.session_id("leftovers").await;
        // A finished command that left a background process behind, and one still running.
        let marker = format!("30{}.5", std::process::id());
        let records = fake
            .run(
                &session,
                &format!("setsid sleep {marker} >/dev/null 2>&1 & echo started"),
            )
            .await;
        assert_eq!(output_of(&records, "stdout"), "started\n");
        let running = json_of(
            fake.post(
                &format!("/v2/sandboxes/sessions/{session}/cmd"),
                json!({"command": "sleep", "args": [marker]}),
            )
            .await,
        )
        .await;
        assert_eq!(running["command"]["exitCode"], Value::Null);
        eventually("both processes to run", || async {
            (host_pids_with(&marker).len() == 2).then_some(())
        })
        .await;
        let stop = fake
            .post(&format!("/v2/sandboxes/sessions/{session}/stop"), json!({}))
            .await;
        assert_eq!(stop.status(), StatusCode::OK);
        eventually("the background process to die", || async {
            host_pids_with(&marker).is_empty().then_some(())
        })
        .await;
    })
    .await;
}

/// A command through the fake runs contained in its session's sandbox (issue 31: a sandbox
/// contains what runs in it on every backend): it sees `/vercel/sandbox` (the workspace the
/// file API writes), runs as uid 1000, and cannot read or write the host's files outside it,
/// nor see the host's processes or the fake's environment.
#[tokio::test]
async fn a_command_is_contained_in_its_sandbox() {
    bounded(async {
        if taskbox::provider::local::isolation::probe().is_err() && !crate::support::under_ci() {
            return; // This machine cannot make namespaces (the isolation tests say so).
        }
        let fake = start().await;
        let session = fake.session_id("contained").await;
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret.txt");
        std::fs::write(&secret, "host secret").unwrap();
        // Readable by anyone: only the sandbox's walls keep it out.
        let open = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755);
        std::fs::set_permissions(outside.path(), open).unwrap();
        fake.write_file(&session, "/vercel/sandbox/api.txt", b"from the API")
            .await;
        let script = format!(
            "pwd; id -u; cat /vercel/sandbox/api.txt; echo; \
             cat {secret} 2>/dev/null || echo no-secret; \
             touch {dir}/made 2>/dev/null || echo no-write; \
             test $(ls /proc | grep -c '^[0-9]') -lt 10 && echo few-processes; \
             env | grep -q '^CARGO' || echo clean-env",
            secret = secret.display(),
            dir = outside.path().display(),
        );
        let records = fake.run(&session, &script).await;
        assert_eq!(
            output_of(&records, "stdout"),
            "/vercel/sandbox\n1000\nfrom the API\nno-secret\nno-write\nfew-processes\nclean-env\n",
            "{records:?}"
        );
        assert!(!outside.path().join("made").exists());
        // What it writes is in the workspace the API reads.
        fake.run(&session, "echo inside > out.txt").await;
        let back = fake.read_file(&session, "/vercel/sandbox/out.txt").await;
        assert_eq!(back.text().await.unwrap(), "inside\n");
    })
    .await;
}
