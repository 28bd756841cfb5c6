//! Every fault knob: error rates, latency, 429 bursts, seeded failures, dropped create responses
//! and cut streams.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use taskbox::fake::{CutMode, Faults, StreamCut};

use super::{bounded, expect_error, json_of, ndjson, output_of, start, start_with, TOKEN};

#[tokio::test]
async fn fault_error_rate_latency_and_429_bursts() {
    bounded(async {
        let fake = start().await;
        let session = fake.session_id("faults").await;
        let get_session = format!("/v2/sandboxes/sessions/{session}");

        fake.set_faults(json!({"error_rate": {"get_session": 1.0}, "error_status": 503}))
            .await;
        let resp = fake.get(&get_session).await;
        expect_error(resp, 503, "internal_server_error").await;
        assert_eq!(fake.get("/v2/sandboxes").await.status(), StatusCode::OK);

        fake.set_faults(json!({"latency_ms": 300})).await;
        let t = Instant::now();
        assert_eq!(fake.get(&get_session).await.status(), StatusCode::OK);
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );

        fake.set_faults(json!({"rate_limit": {"count": 2, "retry_after_s": 7}}))
            .await;
        for _ in 0..2 {
            let resp = fake.get(&get_session).await;
            assert_eq!(resp.headers()["retry-after"], "7");
            expect_error(resp, 429, "rate_limited").await;
        }
        assert_eq!(fake.get(&get_session).await.status(), StatusCode::OK);
        let faults = json_of(fake.http.get(fake.admin("/faults")).send().await.unwrap()).await;
        assert_eq!(faults["rate_limit"]["count"], 0, "the burst is used up");

        let bad = fake
            .http
            .post(fake.admin("/faults"))
            .json(&json!({"error_rate": {"get_sesion": 0.5}}))
            .send()
            .await
            .unwrap();
        let msg = expect_error(bad, 400, "bad_request").await;
        assert!(msg.contains("unknown endpoint `get_sesion`"), "{msg}");

        let stats = fake.stats().await;
        assert_eq!(stats["injected"]["errors"], 1);
        assert_eq!(stats["injected"]["rate_limited"], 2);
        assert_eq!(stats["requests"]["get_session"], 5);
        assert_eq!(stats["responses"]["get_session"]["429"], 2);
        assert_eq!(stats["requests"]["create_sandbox"], 1);
        let reset = fake.http.delete(fake.admin("/stats")).send().await.unwrap();
        assert_eq!(json_of(reset).await["total"], 0);
    })
    .await;
}

#[tokio::test]
async fn the_same_seed_fails_the_same_requests() {
    bounded(async {
        let mut runs = Vec::new();
        for _ in 0..2 {
            let fake = start_with(|o| {
                o.faults = Faults {
                    seed: 42,
                    error_rate: [("list_sandboxes".to_string(), 0.5)].into(),
                    ..Faults::default()
                }
            })
            .await;
            let mut statuses = Vec::new();
            for _ in 0..24 {
                statuses.push(fake.get("/v2/sandboxes").await.status().as_u16());
            }
            runs.push(statuses);
        }
        assert_eq!(runs[0], runs[1]);
        assert!(
            runs[0].contains(&500) && runs[0].contains(&200),
            "{:?}",
            runs[0]
        );
    })
    .await;
}

#[tokio::test]
async fn fault_dropped_create_responses_leave_the_sandbox() {
    bounded(async {
        let fake = start().await;
        fake.set_faults(json!({"drop_create": {"count": 1, "mode": "close"}}))
            .await;
        let body = json!({"projectId": "prj_1", "name": "dropped", "runtime": "node24"});
        let lost = fake
            .http
            .post(fake.url("/v2/sandboxes"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await;
        let err = lost.expect_err("the connection closes before any response");
        assert!(!err.is_timeout(), "{err}");
        let found = fake.get("/v2/sandboxes/dropped").await;
        assert_eq!(found.status(), StatusCode::OK, "the sandbox exists");
        let found = json_of(found).await;
        let retried = json_of(fake.post("/v2/sandboxes", body.clone()).await).await;
        assert_eq!(retried["session"]["id"], found["session"]["id"]);

        fake.set_faults(json!({"drop_create": {"count": 1, "mode": "error"}}))
            .await;
        let body = json!({"projectId": "prj_1", "name": "dropped-500", "runtime": "node24"});
        let resp = fake.post("/v2/sandboxes", body).await;
        expect_error(resp, 500, "internal_server_error").await;
        assert_eq!(
            fake.get("/v2/sandboxes/dropped-500").await.status(),
            StatusCode::OK
        );
        let stats = fake.server.stats();
        assert_eq!(stats.injected.dropped_creates, 2);
    })
    .await;
}

#[tokio::test]
async fn fault_cut_streams() {
    bounded(async {
        let fake = start().await;
        let session = fake.session_id("cut").await;
        let cmd_path = format!("/v2/sandboxes/sessions/{session}/cmd");
        fake.server
            .set_faults(Faults {
                cut_streams: Some(StreamCut {
                    after_ms: 300,
                    mode: CutMode::Abort,
                }),
                ..Faults::default()
            })
            .unwrap();
        let script = json!({"command": "bash", "args": ["-c", "echo started; sleep 30"],
                            "wait": true, "logs": true});
        let resp = fake.post(&cmd_path, script.clone()).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.text().await.is_err(), "the stream is aborted mid-body");

        let detached = json_of(
            fake.post(&cmd_path, json!({"command": "sleep", "args": ["30"]}))
                .await,
        )
        .await;
        let id = detached["command"]["id"].as_str().unwrap();
        let poll = fake
            .http
            .get(fake.url(&format!("{cmd_path}/{id}?wait=true")))
            .bearer_auth(TOKEN)
            .send()
            .await;
        assert!(poll.is_err(), "the long poll's connection is dropped");

        fake.set_faults(json!({"cut_streams": {"after_ms": 300, "mode": "error_record"}}))
            .await;
        let resp = fake.post(&cmd_path, script).await;
        let records = ndjson(&resp.text().await.unwrap());
        assert_eq!(output_of(&records, "stdout"), "started\n");
        let last = records.last().unwrap();
        assert_eq!(last["stream"], "error");
        assert_eq!(last["data"]["code"], "sandbox_stream_closed");
        assert_eq!(fake.server.stats().injected.cut_streams, 3);

        // Stopping the session ends a running command's stream with an in-band error.
        fake.server.set_faults(Faults::default()).unwrap();
        let stream = fake
            .post(
                &cmd_path,
                json!({"command": "sleep", "args": ["30"], "wait": true, "logs": true}),
            )
            .await;
        let stop = fake
            .post(&format!("/v2/sandboxes/sessions/{session}/stop"), json!({}))
            .await;
        assert_eq!(stop.status(), StatusCode::OK);
        let records = ndjson(&stream.text().await.unwrap());
        assert_eq!(records.last().unwrap()["data"]["code"], "sandbox_stopped");
        fake.server.shutdown().await.unwrap();
    })
    .await;
}
