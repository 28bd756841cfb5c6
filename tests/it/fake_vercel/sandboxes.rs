//! Sandboxes and sessions: the whole lifecycle, validation errors in the service's wording,
//! boot, timeout and extend, names found and listed by tag, and bearer auth.

use reqwest::StatusCode;
use serde_json::{json, Value};
use taskbox::fake::Endpoint;

use super::{
    bounded, eventually, expect_error, json_of, output_of, session_status, start, start_with, TOKEN,
};

#[tokio::test]
async fn lifecycle_create_run_snapshot_restore_stop() {
    bounded(async {
        let fake = start_with(|o| o.snapshot_settle_ms = 2000).await;
        let created = fake
            .create("life", json!({"resources": {"vcpus": 2, "memory": 4096}}))
            .await;
        assert_eq!(created["sandbox"]["name"], "life");
        assert_eq!(created["sandbox"]["memory"], 4096);
        assert_eq!(created["session"]["status"], "running");
        assert_eq!(created["session"]["cwd"], "/vercel/sandbox");
        assert_eq!(created["routes"], json!([]));
        let session = created["session"]["id"].as_str().unwrap().to_string();

        fake.write_file(&session, "/vercel/sandbox/notes/hello.txt", b"hello\n")
            .await;
        let records = fake
            .run(&session, "cat notes/hello.txt; echo warn >&2; exit 3")
            .await;
        assert_eq!(records.first().unwrap()["command"]["exitCode"], Value::Null);
        let last = &records.last().unwrap()["command"];
        assert_eq!(last["exitCode"], 3);
        assert_eq!(last["name"], "bash");
        assert_eq!(last["sessionId"], session.as_str());
        assert_eq!(output_of(&records, "stdout"), "hello\n");
        assert_eq!(output_of(&records, "stderr"), "warn\n");

        let snap = fake.snapshot(&session, json!({})).await;
        assert_eq!(snap["session"]["status"], "snapshotting");
        assert_eq!(snap["snapshot"]["status"], "created");
        assert_eq!(snap["snapshot"]["sourceSessionId"], session.as_str());
        let snap_id = snap["snapshot"]["id"].as_str().unwrap().to_string();
        // While it settles: 422; then 410.
        let resp = fake
            .post(
                &format!("/v2/sandboxes/sessions/{session}/cmd"),
                json!({"command": "true"}),
            )
            .await;
        expect_error(resp, 422, "sandbox_snapshotting").await;
        eventually("the snapshotted session to stop", || async {
            (session_status(&fake, &session).await == "stopped").then_some(())
        })
        .await;
        let resp = fake
            .post(
                &format!("/v2/sandboxes/sessions/{session}/cmd"),
                json!({"command": "true"}),
            )
            .await;
        expect_error(resp, 410, "sandbox_stopped").await;

        // Restore: no runtime with a snapshot source.
        let restored = fake
            .post(
                "/v2/sandboxes",
                json!({"projectId": "prj_1", "name": "life-2",
                       "source": {"type": "snapshot", "snapshotId": snap_id}}),
            )
            .await;
        assert_eq!(restored.status(), StatusCode::OK);
        let restored = json_of(restored).await;
        assert_eq!(restored["session"]["sourceSnapshotId"], snap_id.as_str());
        assert_eq!(restored["sandbox"]["runtime"], "node24");
        let new_session = restored["session"]["id"].as_str().unwrap().to_string();
        let read = fake.read_file(&new_session, "notes/hello.txt").await;
        assert_eq!(read.status(), StatusCode::OK);
        assert_eq!(read.headers()["content-type"], "application/octet-stream");
        assert_eq!(read.bytes().await.unwrap().as_ref(), b"hello\n");

        let stop = fake
            .post(
                &format!("/v2/sandboxes/sessions/{new_session}/stop"),
                json!({}),
            )
            .await;
        assert_eq!(stop.status(), StatusCode::OK);
        let stop = json_of(stop).await;
        assert_eq!(stop["session"]["status"], "stopped");
        assert!(stop["session"]["stoppedAt"].is_u64());
        assert_eq!(stop["sandbox"]["name"], "life-2");
        // Stopping again is fine; running is not.
        let again = fake
            .post(
                &format!("/v2/sandboxes/sessions/{new_session}/stop"),
                json!({}),
            )
            .await;
        assert_eq!(again.status(), StatusCode::OK);
        let resp = fake.read_file(&new_session, "notes/hello.txt").await;
        expect_error(resp, 410, "sandbox_stopped").await;
        fake.server.shutdown().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn validation_errors_are_400_with_the_service_wording() {
    bounded(async {
        let fake = start().await;
        let cases = [
            (
                json!({"projectId": "p", "runtime": "node24", "resources": {"vcpus": 2, "memory": 3000}}),
                "`resources.memory` must equal 2048 × `resources.vcpus` (expected 4096 for 2 vCPUs, got 3000)",
            ),
            (
                json!({"projectId": "p", "runtime": "ruby3.3"}),
                "`runtime` should be equal to one of the allowed values",
            ),
            (
                json!({"projectId": "p", "runtime": "node24",
                       "source": {"type": "snapshot", "snapshotId": "snap_x"}}),
                "`runtime` cannot be combined with a `source` of type \"snapshot\"",
            ),
            (
                json!({"projectId": "p", "runtime": "node24", "timeout": 2_700_001}),
                "`timeout` should be <= 45m.",
            ),
            (
                json!({"projectId": "p", "resources": {"vcpus": 3}}),
                "`resources.vcpus` must be 1 or an even number up to 8",
            ),
            (
                json!({"projectId": "p", "tags": {"a":"1","b":"2","c":"3","d":"4","e":"5","f":"6"}}),
                "`tags` should NOT have more than 5 properties.",
            ),
        ];
        for (body, wording) in cases {
            let msg = expect_error(fake.post("/v2/sandboxes", body.clone()).await, 400, "bad_request")
                .await;
            assert!(msg.starts_with("Invalid request: "), "{msg}");
            assert!(msg.contains(wording), "{body}: {msg}");
        }
        let v3_cases = [
            (
                json!({"projectId": "p", "runtime": "node24"}),
                "Invalid request: should NOT have additional property `runtime`.",
            ),
            (
                json!({"projectId": "p", "image": "ghcr.io/me/custom:1"}),
                "Invalid request: `image` \"ghcr.io/me/custom:1\" is not an image taskbox fake-vercel knows",
            ),
        ];
        for (body, wording) in v3_cases {
            let msg = expect_error(fake.post("/v3/sandboxes", body.clone()).await, 400, "bad_request")
                .await;
            assert!(msg.starts_with(wording), "{body}: {msg}");
        }
        let stats = fake.server.stats();
        assert_eq!(stats.requests_to(Endpoint::CreateSandbox), 8);
        assert_eq!(stats.responses_from(Endpoint::CreateSandbox, 400), 8);
    })
    .await;
}

#[tokio::test]
async fn sessions_boot_time_out_and_extend() {
    bounded(async {
        // That a timeout snapshots a persistent sandbox is unverified: the fake does it only
        // when asked (`snapshot_on_timeout`); `a_timeout_does_not_snapshot_by_default` covers
        // the default.
        let fake = start_with(|o| {
            o.boot_delay_ms = 300;
            o.snapshot_on_timeout = true;
        })
        .await;
        let created = fake
            .create("boot", json!({"timeout": 2000, "persistent": true}))
            .await;
        assert_eq!(created["session"]["status"], "pending");
        assert!(created["session"].get("startedAt").is_none());
        let session = created["session"]["id"].as_str().unwrap().to_string();
        // A command on a pending session waits for it to boot.
        let records = fake.run(&session, "echo booted").await;
        assert_eq!(output_of(&records, "stdout"), "booted\n");
        assert_eq!(session_status(&fake, &session).await, "running");
        fake.write_file(&session, "/vercel/sandbox/kept.txt", b"kept")
            .await;

        // The timeout stops it; a persistent sandbox snapshots on the way.
        eventually("the session to time out", || async {
            (session_status(&fake, &session).await == "stopped").then_some(())
        })
        .await;
        let resp = fake
            .post(
                &format!("/v2/sandboxes/sessions/{session}/cmd"),
                json!({"command": "true"}),
            )
            .await;
        expect_error(resp, 410, "sandbox_stopped").await;
        let sandbox = json_of(fake.get("/v2/sandboxes/boot?projectId=prj_1").await).await;
        assert!(
            sandbox["sandbox"]["currentSnapshotId"].is_string(),
            "{sandbox}"
        );
        let resumed = json_of(
            fake.get("/v2/sandboxes/boot?projectId=prj_1&resume=true")
                .await,
        )
        .await;
        assert_eq!(resumed["resumed"], true);
        let new_session = resumed["session"]["id"].as_str().unwrap().to_string();
        assert_ne!(new_session, session);
        // The new session has the sandbox's 2 s timeout too: extend it first.
        let extend = |id: String, ms: u64| {
            let fake = &fake;
            async move {
                fake.post(
                    &format!("/v2/sandboxes/sessions/{id}/extend-timeout"),
                    json!({"duration": ms}),
                )
                .await
            }
        };
        let extended = json_of(extend(new_session.clone(), 60_000).await).await;
        assert_eq!(extended["session"]["timeout"], 62_000);
        let read = fake.read_file(&new_session, "kept.txt").await;
        assert_eq!(read.bytes().await.unwrap().as_ref(), b"kept");
        let long = fake.create("long", json!({"timeout": 45 * 60_000})).await;
        let long = long["session"]["id"].as_str().unwrap().to_string();
        let msg = expect_error(extend(long, 60_000).await, 400, "bad_request").await;
        assert!(msg.contains("above the plan's maximum of 45m"), "{msg}");

        let other = fake.session_id("expire-me").await;
        let resp = fake
            .http
            .post(fake.admin(&format!("/expire-session/{other}")))
            .send()
            .await
            .unwrap();
        assert_eq!(json_of(resp).await["session"]["status"], "stopped");
        let resp = fake.read_file(&other, "x").await;
        expect_error(resp, 410, "sandbox_stopped").await;
    })
    .await;
}

#[tokio::test]
async fn names_are_found_listed_by_tag_and_paginated() {
    bounded(async {
        let fake = start().await;
        let first = fake.create("same", json!({"tags": {"team": "a"}})).await;
        let again = fake.create("same", json!({})).await;
        assert_eq!(
            first["session"]["id"], again["session"]["id"],
            "create finds the name"
        );
        for i in 0..3 {
            fake.create(&format!("tagged-{i}"), json!({"tags": {"team": "b"}}))
                .await;
        }
        let found = json_of(fake.get("/v2/sandboxes/same?projectId=prj_1").await).await;
        assert_eq!(found["sandbox"]["currentSessionId"], first["session"]["id"]);
        let resp = fake.get("/v2/sandboxes/nope?projectId=prj_1").await;
        expect_error(resp, 404, "not_found").await;

        let page = json_of(
            fake.get("/v2/sandboxes?project=prj_1&tags=team:b&limit=2")
                .await,
        )
        .await;
        assert_eq!(page["pagination"]["count"], 2);
        let next = page["pagination"]["next"].as_str().unwrap();
        let page2 = json_of(
            fake.get(&format!(
                "/v2/sandboxes?project=prj_1&tags=team:b&limit=2&cursor={next}"
            ))
            .await,
        )
        .await;
        let mut names: Vec<String> = page["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .chain(page2["sandboxes"].as_array().unwrap())
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["tagged-0", "tagged-1", "tagged-2"]);
        assert!(page2["pagination"]["next"].is_null());
        let resp = fake.get("/v2/sandboxes?limit=51").await;
        expect_error(resp, 400, "bad_request").await;
    })
    .await;
}

#[tokio::test]
async fn bearer_auth_is_required() {
    bounded(async {
        let fake = start_with(|o| o.token = Some(TOKEN.to_string())).await;
        let none = fake
            .http
            .get(fake.url("/v2/sandboxes"))
            .send()
            .await
            .unwrap();
        expect_error(none, 401, "unauthorized").await;
        let wrong = fake
            .http
            .get(fake.url("/v2/sandboxes"))
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap();
        let msg = expect_error(wrong, 403, "forbidden").await;
        assert!(
            !msg.contains("wrong") && !msg.contains(TOKEN),
            "no token in errors: {msg}"
        );
        assert_eq!(fake.get("/v2/sandboxes").await.status(), StatusCode::OK);
        let unknown = fake.get("/v1/sandboxes").await;
        expect_error(unknown, 404, "not_found").await;
    })
    .await;
}

#[tokio::test]
async fn a_timeout_does_not_snapshot_by_default_but_a_stop_does() {
    bounded(async {
        let fake = start().await;
        let timed = fake
            .create("timed", json!({"timeout": 1000, "persistent": true}))
            .await;
        let session = timed["session"]["id"].as_str().unwrap().to_string();
        eventually("the session to time out", || async {
            (session_status(&fake, &session).await == "stopped").then_some(())
        })
        .await;
        let sandbox = json_of(fake.get("/v2/sandboxes/timed?projectId=prj_1").await).await;
        assert!(
            sandbox["sandbox"].get("currentSnapshotId").is_none(),
            "{sandbox}"
        );

        let stopped = fake
            .create("stopped", json!({"timeout": 60_000, "persistent": true}))
            .await;
        let session = stopped["session"]["id"].as_str().unwrap().to_string();
        let answer = json_of(
            fake.post(&format!("/v2/sandboxes/sessions/{session}/stop"), json!({}))
                .await,
        )
        .await;
        let snap = answer["snapshot"]["id"]
            .as_str()
            .expect("the stop answer names a snapshot");
        assert_eq!(answer["snapshot"]["sourceSessionId"], session.as_str());
        let sandbox = json_of(fake.get("/v2/sandboxes/stopped?projectId=prj_1").await).await;
        assert_eq!(sandbox["sandbox"]["currentSnapshotId"], snap, "{sandbox}");
    })
    .await;
}
