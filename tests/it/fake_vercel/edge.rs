//! The fake's edge (issue 12, item 18): the admin endpoints take `--token`, wrong methods and
//! bodies over the limit answer the service's JSON errors, and an upload is streamed (a 300 MB
//! upload leaves the server's memory where it was, measured on a `taskbox fake-vercel` process).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{bounded, json_of, start_with, TOKEN};

/// The `{"error":{"code","message"}}` body of a response, checked to be JSON.
async fn error_of(resp: reqwest::Response) -> (StatusCode, String, String) {
    let status = resp.status();
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let text = resp.text().await.expect("body");
    assert!(
        ct.starts_with("application/json"),
        "{status} {ct}: {text:?}"
    );
    let v: Value = serde_json::from_str(&text).expect("a JSON error body");
    let code = v["error"]["code"].as_str().expect("error.code").to_string();
    let message = v["error"]["message"]
        .as_str()
        .expect("error.message")
        .to_string();
    (status, code, message)
}

#[tokio::test]
async fn admin_endpoints_take_the_token() {
    bounded(async {
        let fake = start_with(|o| o.token = Some(TOKEN.to_string())).await;
        for (method, path) in [
            (reqwest::Method::GET, "/stats"),
            (reqwest::Method::DELETE, "/stats"),
            (reqwest::Method::GET, "/faults"),
            (reqwest::Method::POST, "/faults"),
            (reqwest::Method::POST, "/expire-session/sess_nosuch"),
            (reqwest::Method::POST, "/expire-snapshot/snap_nosuch"),
        ] {
            let url = fake.admin(path);
            let none = fake
                .http
                .request(method.clone(), &url)
                .send()
                .await
                .unwrap();
            let (status, code, _) = error_of(none).await;
            assert_eq!(
                (status, code.as_str()),
                (StatusCode::UNAUTHORIZED, "unauthorized"),
                "{method} {path}"
            );
            let wrong = fake
                .http
                .request(method.clone(), &url)
                .bearer_auth("not-the-token")
                .send()
                .await
                .unwrap();
            let (status, code, _) = error_of(wrong).await;
            assert_eq!(
                (status, code.as_str()),
                (StatusCode::FORBIDDEN, "forbidden"),
                "{method} {path}"
            );
        }
        // The faults were not changed by the refused POST; with the token everything works.
        let ok = fake
            .http
            .get(fake.admin("/faults"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        fake.set_faults(json!({"latency_ms": 0})).await;
        assert!(fake.stats().await.is_object());
        fake.server.shutdown().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn wrong_methods_and_large_bodies_answer_json_errors() {
    bounded(async {
        let fake = start_with(|o| o.token = Some(TOKEN.to_string())).await;
        let put = fake
            .http
            .put(fake.url("/v2/sandboxes"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        let allow = put.headers().get("allow").cloned();
        let (status, code, message) = error_of(put).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(code, "method_not_allowed");
        assert!(
            message.contains("PUT") && message.contains("/api/v2/sandboxes"),
            "{message}"
        );
        assert!(allow.is_some(), "the Allow header is kept");
        let admin = fake
            .http
            .put(fake.admin("/stats"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(error_of(admin).await.0, StatusCode::METHOD_NOT_ALLOWED);

        // A 50 MB body to a JSON endpoint.
        let big = vec![b' '; 50 << 20];
        let resp = fake
            .http
            .post(fake.url("/v2/sandboxes"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(big)
            .send()
            .await
            .unwrap();
        let (status, code, message) = error_of(resp).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(code, "payload_too_large");
        assert!(message.contains("bytes"), "{message}");
        // A malformed JSON body: the extractor's rejection is JSON too.
        let resp = fake
            .http
            .post(fake.url("/v2/sandboxes/sessions/sess_x/fs/read"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body("{not json")
            .send()
            .await
            .unwrap();
        let (status, _, _) = error_of(resp).await;
        assert!(status.is_client_error(), "{status}");
        fake.server.shutdown().await.unwrap();
    })
    .await;
}

/// A `taskbox fake-vercel` process, killed on drop.
struct FakeProcess {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl FakeProcess {
    fn start() -> FakeProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut child = Command::new(env!("CARGO_BIN_EXE_taskbox"))
            .args([
                "fake-vercel",
                "--listen",
                "127.0.0.1:0",
                "--token",
                TOKEN,
                "--data-dir",
            ])
            .arg(dir.path())
            .env("TASKBOX_HOME", dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn taskbox fake-vercel");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the base URL");
        FakeProcess {
            child,
            base: line.trim().to_string(),
            _dir: dir,
        }
    }

    /// A field of `/proc/PID/status` (`VmRSS`, `VmHWM`), in bytes.
    fn status_bytes(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc/PID/status");
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc/PID/status"));
        kb * 1024
    }
}

impl Drop for FakeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A gzipped tar holding one file of `size` zero bytes, stored (not compressed), so the body is
/// as large as the file.
fn stored_upload(size: usize) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(size + (1 << 20)),
        flate2::Compression::none(),
    );
    let mut h = tar::Header::new_gnu();
    h.set_size(size as u64);
    h.set_mode(0o644);
    h.set_path("big.bin").unwrap();
    h.set_cksum();
    gz.write_all(h.as_bytes()).unwrap();
    let zeros = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(zeros.len());
        gz.write_all(&zeros[..n]).unwrap();
        left -= n;
    }
    let pad = (512 - size % 512) % 512;
    gz.write_all(&vec![0u8; pad + 1024]).unwrap();
    gz.finish().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_300_mb_upload_is_streamed_not_held() {
    const SIZE: usize = 300 << 20;
    let fake = FakeProcess::start();
    let http = reqwest::Client::new();
    let url = |p: &str| format!("{}{p}", fake.base);
    let created = http
        .post(url("/v2/sandboxes"))
        .query(&[("teamId", "team_1")])
        .bearer_auth(TOKEN)
        .json(
            &json!({"projectId": "prj_1", "name": "big", "runtime": "node24",
            "resources": {"vcpus": 2}, "timeout": 120_000, "persistent": false}),
        )
        .send()
        .await
        .expect("create");
    let created = json_of(created).await;
    let session = created["session"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no session id: {created}"))
        .to_string();
    // A small upload first, so that what every upload allocates once is in the baseline.
    let small = http
        .post(url(&format!("/v2/sandboxes/sessions/{session}/fs/write")))
        .bearer_auth(TOKEN)
        .header("content-type", "application/gzip")
        .header("x-cwd", "/vercel/sandbox")
        .body(stored_upload(1 << 20))
        .send()
        .await
        .expect("small upload");
    assert_eq!(
        small.status(),
        StatusCode::OK,
        "{}",
        small.text().await.unwrap_or_default()
    );
    let rss_before = fake.status_bytes("VmRSS");
    let body = stored_upload(SIZE);
    let resp = http
        .post(url(&format!("/v2/sandboxes/sessions/{session}/fs/write")))
        .bearer_auth(TOKEN)
        .header("content-type", "application/gzip")
        .header("x-cwd", "/vercel/sandbox")
        .body(body)
        .send()
        .await
        .expect("big upload");
    assert_eq!(
        resp.status(),
        StatusCode::OK,
        "{}",
        resp.text().await.unwrap_or_default()
    );
    let rss_after = fake.status_bytes("VmRSS");
    let peak = fake.status_bytes("VmHWM");
    eprintln!(
        "fake-vercel RSS: {} MiB before, {} MiB after a {} MiB upload, peak {} MiB",
        rss_before >> 20,
        rss_after >> 20,
        SIZE >> 20,
        peak >> 20
    );
    assert!(
        rss_after < rss_before + (64 << 20),
        "the upload stayed resident: {} MiB before, {} MiB after",
        rss_before >> 20,
        rss_after >> 20
    );
    assert!(
        peak < rss_before + (128 << 20),
        "the upload was held whole while it ran: peak {} MiB, {} MiB before",
        peak >> 20,
        rss_before >> 20
    );
    // The file arrived whole.
    let read = http
        .post(url(&format!("/v2/sandboxes/sessions/{session}/cmd")))
        .bearer_auth(TOKEN)
        .json(
            &json!({"command": "bash", "args": ["-c", "stat -c %s big.bin"],
            "wait": true, "logs": true}),
        )
        .send()
        .await
        .expect("stat");
    let text = read.text().await.unwrap_or_default();
    assert!(text.contains(&SIZE.to_string()), "{text}");
}
