//! The client over a real socket, against a canned axum server: what every request carries,
//! each status classified, answers that are not errors, and pagination.

use std::sync::Arc;

use axum::http::Method;

use taskbox::clock::SystemClock;
use taskbox::core::FailureKind;
use taskbox::provider::vercel::auth::Credentials;
use taskbox::provider::vercel::client::VercelClient;

use super::{err_body, Canned, RecordingListener, SECRET_TOKEN};
use crate::support::sbx;

#[tokio::test]
async fn every_request_carries_team_bearer_json_and_user_agent() {
    let server = Canned::start().await;
    let client = server.client();
    let session =
        r#"{"session":{"id":"sess_1","status":"running","timeout":300000,"startedAt":1000}}"#;
    server.push(200, &[], session);
    let s = client.get_session("sess_1").await.unwrap();
    assert_eq!(s.deadline(), Some(301_000));
    server.push(
        200,
        &[],
        r#"{"sandboxes":[],"pagination":{"count":0,"next":null}}"#,
    );
    client
        .list_sandboxes(Some(("taskbox-task", "t1")), None, 1, None)
        .await
        .unwrap();
    server.push(200, &[], "{}");
    client
        .write_files("sess_1", &[("/vercel/sandbox/a.txt", b"hi")])
        .await
        .unwrap();

    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    for req in &seen {
        assert!(
            req.uri.query().unwrap_or("").contains("teamId=team_t"),
            "{}",
            req.uri
        );
        assert_eq!(
            req.headers["authorization"],
            format!("Bearer {SECRET_TOKEN}").as_str()
        );
        assert!(req.headers["user-agent"]
            .to_str()
            .unwrap()
            .starts_with("taskbox/"));
    }
    assert_eq!(seen[0].method, Method::GET);
    assert_eq!(seen[0].uri.path(), "/api/v2/sandboxes/sessions/sess_1");
    assert_eq!(seen[0].headers["content-type"], "application/json");
    assert_eq!(seen[1].uri.path(), "/api/v2/sandboxes");
    let q = seen[1].uri.query().unwrap();
    assert!(
        q.contains("project=prj_t")
            && q.contains("tags=taskbox-task%3At1")
            && q.contains("limit=1"),
        "{q}"
    );
    assert_eq!(
        seen[2].uri.path(),
        "/api/v2/sandboxes/sessions/sess_1/fs/write"
    );
    assert_eq!(seen[2].headers["content-type"], "application/gzip");
    assert_eq!(seen[2].headers["x-cwd"], "/");
    // The upload is a gzipped tar with names relative to `/` and sizes in bytes.
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&seen[2].body[..]));
    let entries: Vec<(String, u64)> = archive
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.path().unwrap().display().to_string(), e.size())
        })
        .collect();
    assert_eq!(entries, vec![("vercel/sandbox/a.txt".to_string(), 2)]);
}

#[tokio::test]
async fn each_status_is_classified_over_a_real_socket() {
    let server = Canned::start().await;
    let client = server.client();
    type Case<'a> = (u16, Vec<(&'static str, &'a str)>, String, FailureKind);
    let cases: Vec<Case> = vec![
        (
            429,
            vec![("retry-after", "3")],
            err_body("too_many_requests", "limit"),
            FailureKind::Transient {
                retry_after_ms: Some(3000),
            },
        ),
        (
            503,
            vec![],
            "upstream".into(),
            FailureKind::Transient {
                retry_after_ms: None,
            },
        ),
        (
            422,
            vec![],
            err_body("sandbox_snapshotting", "busy"),
            FailureKind::Transient {
                retry_after_ms: None,
            },
        ),
        (
            410,
            vec![],
            err_body("sandbox_stopped", "stopped"),
            FailureKind::SandboxGone,
        ),
        (
            410,
            vec![],
            err_body("snapshot_not_found", "gone"),
            FailureKind::SnapshotGone,
        ),
        (
            403,
            vec![],
            err_body("forbidden", "Not authorized"),
            FailureKind::Auth,
        ),
        (
            400,
            vec![],
            err_body(
                "bad_request",
                "Invalid request: `duration` should be >= 1000.",
            ),
            FailureKind::Invalid,
        ),
        (
            409,
            vec![],
            err_body("conflict", "x"),
            FailureKind::Permanent,
        ),
    ];
    for (code, headers, body, expected) in cases {
        server.push(code, &headers, &body);
        let err = client
            .extend_timeout(&sbx("sess_1"), 60_000)
            .await
            .unwrap_err();
        assert_eq!(err.kind, expected, "status {code}: {err}");
        assert_eq!(err.operation, "extend timeout");
        assert!(!err.to_string().contains(SECRET_TOKEN));
        if code == 400 {
            assert!(
                err.message.contains("`duration` should be >= 1000."),
                "{err}"
            );
        }
        if code == 403 {
            assert!(err.message.contains("VERCEL_TOKEN"), "{err}");
        }
    }
    // A malformed success body is permanent, not a panic.
    server.push(200, &[], "{\"nope\":1}");
    let err = client
        .extend_timeout(&sbx("sess_1"), 60_000)
        .await
        .unwrap_err();
    assert_eq!(err.kind, FailureKind::Permanent);
    // A refused connection is transient.
    drop(server);
    let closed = RecordingListener::bind();
    let url = closed.url();
    drop(closed);
    let client = VercelClient::new(
        &url,
        Credentials::access_token(SECRET_TOKEN, "t", "p"),
        Arc::new(SystemClock),
    )
    .unwrap();
    let err = client.get_session("sess_1").await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(!err.to_string().contains(SECRET_TOKEN));
}

#[tokio::test]
async fn a_missing_file_and_an_unknown_sandbox_name_are_answers_not_errors() {
    let server = Canned::start().await;
    let client = server.client();
    server.push(404, &[], &err_body("not_found", "no such file"));
    assert_eq!(client.read_file("sess_1", "/nope").await.unwrap(), None);
    server.push(
        200,
        &[("content-type", "application/octet-stream")],
        "bytes!",
    );
    assert_eq!(
        client.read_file("sess_1", "/yes").await.unwrap(),
        Some(b"bytes!".to_vec())
    );
    server.push(404, &[], &err_body("not_found", "no sandbox"));
    assert_eq!(client.get_sandbox("taskbox-x-g1").await.unwrap(), None);
    let seen = server.seen();
    assert_eq!(seen[2].uri.path(), "/api/v2/sandboxes/taskbox-x-g1");
    assert!(seen[2].uri.query().unwrap().contains("projectId=prj_t"));
    let body: serde_json::Value = serde_json::from_slice(&seen[0].body).unwrap();
    assert_eq!(body, serde_json::json!({"path": "/nope"}));
}

#[tokio::test]
async fn listing_follows_the_cursor_to_the_last_page() {
    let server = Canned::start().await;
    let client = server.client();
    let sb = |name: &str| serde_json::json!({"name": name, "currentSessionId": format!("s_{name}"), "status": "running", "tags": {"taskbox-installation": "inst"}});
    server.push(200, &[], &serde_json::json!({"sandboxes": [sb("a"), sb("b")], "pagination": {"count": 2, "next": "cur_2"}}).to_string());
    server.push(
        200,
        &[],
        &serde_json::json!({"sandboxes": [sb("c")], "pagination": {"count": 1, "next": null}})
            .to_string(),
    );
    let all = client
        .list_all_sandboxes(("taskbox-installation", "inst"))
        .await
        .unwrap();
    let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(!seen[0].uri.query().unwrap().contains("cursor="));
    assert!(seen[1].uri.query().unwrap().contains("cursor=cur_2"));
    assert!(seen[1].uri.query().unwrap().contains("limit=50"));
}
