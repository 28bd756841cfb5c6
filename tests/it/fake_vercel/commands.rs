//! Commands and files in a session: reads, writes and mkdir, detached commands polled, logged
//! and killed, and no process surviving a stop.

use std::path::Path;

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

#[tokio::test]
async fn no_process_survives_a_stop() {
    bounded(async {
        let fake = start().await;
        let session = fake.session_id("leftovers").await;
        // A finished command that left a background process behind, and one still running.
        let records = fake
            .run(&session, "setsid sleep 300 >/dev/null 2>&1 & echo $!")
            .await;
        let pid: u32 = output_of(&records, "stdout").trim().parse().unwrap();
        let running = json_of(
            fake.post(
                &format!("/v2/sandboxes/sessions/{session}/cmd"),
                json!({"command": "sleep", "args": ["300"]}),
            )
            .await,
        )
        .await;
        assert_eq!(running["command"]["exitCode"], Value::Null);
        let proc_dir = format!("/proc/{pid}");
        assert!(Path::new(&proc_dir).exists(), "the background process runs");
        let stop = fake
            .post(&format!("/v2/sandboxes/sessions/{session}/stop"), json!({}))
            .await;
        assert_eq!(stop.status(), StatusCode::OK);
        eventually("the background process to die", || async {
            let stat = std::fs::read_to_string(format!("{proc_dir}/stat")).unwrap_or_default();
            // Gone, or a zombie waiting for its parent (init) to reap it.
            (stat.is_empty() || stat.contains(") Z ")).then_some(())
        })
        .await;
    })
    .await;
}
