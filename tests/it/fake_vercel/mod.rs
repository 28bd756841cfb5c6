//! `taskbox fake-vercel` over real sockets, one concern a file: sandboxes and sessions (the
//! lifecycle, validation, boot, timeout and extend, names and listing, auth) in `sandboxes`,
//! commands and files in `commands`, snapshots in `snapshots`, every fault knob in `faults`, and
//! Vercel's own SDK run against it (`tests/sdk/conformance.mjs`) in `sdk`. The HTTP helpers they
//! share live here.

mod commands;
mod edge;
mod faults;
mod recipe;
mod sandboxes;
mod sdk;
mod snapshots;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use taskbox::fake::{FakeOptions, FakeServer};
use tempfile::TempDir;
use tokio::net::TcpListener;

/// Every test body runs under this bound.
const BOUND: Duration = Duration::from_secs(30);
const TOKEN: &str = "test-token";

struct Fake {
    server: FakeServer,
    http: reqwest::Client,
    _dir: TempDir,
}

async fn start_with(configure: impl FnOnce(&mut FakeOptions)) -> Fake {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut opts = FakeOptions::new(dir.path());
    configure(&mut opts);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let server = FakeServer::start(listener, opts).await.expect("start fake");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    Fake {
        server,
        http,
        _dir: dir,
    }
}

async fn start() -> Fake {
    start_with(|_| {}).await
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(BOUND, f)
        .await
        .expect("test exceeded its time bound")
}

impl Fake {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.base_url())
    }

    fn admin(&self, path: &str) -> String {
        format!("{}{path}", self.server.admin_url())
    }

    async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .query(&[("teamId", "team_1")])
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .expect("send")
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .query(&[("teamId", "team_1")])
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("send")
    }

    async fn delete(&self, path: &str) -> reqwest::Response {
        self.http
            .delete(self.url(path))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("send")
    }

    async fn set_faults(&self, faults: Value) {
        let resp = self
            .http
            .post(self.admin("/faults"))
            .bearer_auth(TOKEN)
            .json(&faults)
            .send()
            .await
            .expect("send");
        assert_eq!(
            resp.status(),
            StatusCode::OK,
            "{}",
            resp.text().await.unwrap()
        );
    }

    async fn stats(&self) -> Value {
        json_of(
            self.http
                .get(self.admin("/stats"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .expect("send"),
        )
        .await
    }

    /// Creates a sandbox; returns the create answer.
    async fn create(&self, name: &str, extra: Value) -> Value {
        let mut body = json!({"projectId": "prj_1", "name": name, "runtime": "node24",
            "resources": {"vcpus": 2}, "timeout": 120_000, "persistent": false});
        merge(&mut body, extra);
        let resp = self.post("/v2/sandboxes", body).await;
        assert_eq!(resp.status(), StatusCode::OK);
        json_of(resp).await
    }

    async fn session_id(&self, name: &str) -> String {
        let created = self.create(name, json!({})).await;
        created["session"]["id"].as_str().unwrap().to_string()
    }

    /// Runs `bash -c script` and waits, returning the NDJSON records.
    async fn run(&self, session: &str, script: &str) -> Vec<Value> {
        let resp = self
            .post(
                &format!("/v2/sandboxes/sessions/{session}/cmd"),
                json!({"command": "bash", "args": ["-c", script], "wait": true, "logs": true}),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
        ndjson(&resp.text().await.expect("stream"))
    }

    async fn write_file(&self, session: &str, path: &str, data: &[u8]) {
        let resp = self
            .http
            .post(self.url(&format!("/v2/sandboxes/sessions/{session}/fs/write")))
            .bearer_auth(TOKEN)
            .header("content-type", "application/gzip")
            .header("x-cwd", "/")
            .body(tar_gz(&[(path.trim_start_matches('/'), data)]))
            .send()
            .await
            .expect("send");
        assert_eq!(
            resp.status(),
            StatusCode::OK,
            "{}",
            resp.text().await.unwrap()
        );
    }

    async fn read_file(&self, session: &str, path: &str) -> reqwest::Response {
        self.post(
            &format!("/v2/sandboxes/sessions/{session}/fs/read"),
            json!({"path": path, "cwd": "/vercel/sandbox"}),
        )
        .await
    }

    async fn snapshot(&self, session: &str, body: Value) -> Value {
        let resp = self
            .post(&format!("/v2/sandboxes/sessions/{session}/snapshot"), body)
            .await;
        assert_eq!(resp.status(), StatusCode::CREATED);
        json_of(resp).await
    }
}

fn merge(base: &mut Value, extra: Value) {
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        for (k, v) in e {
            b.insert(k, v);
        }
    }
}

async fn json_of(resp: reqwest::Response) -> Value {
    let text = resp.text().await.expect("body");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

async fn expect_error(resp: reqwest::Response, status: u16, code: &str) -> String {
    assert_eq!(resp.status().as_u16(), status);
    let body = json_of(resp).await;
    assert_eq!(body["error"]["code"], code, "{body}");
    body["error"]["message"].as_str().unwrap().to_string()
}

fn ndjson(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad NDJSON line {l:?}: {e}")))
        .collect()
}

fn output_of(records: &[Value], stream: &str) -> String {
    records
        .iter()
        .filter(|r| r["stream"] == stream)
        .map(|r| r["data"].as_str().unwrap())
        .collect()
}

fn tar_gz(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for (name, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

/// Polls `f` until it returns `Some`, within the test bound.
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < give_up, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn session_status(fake: &Fake, session: &str) -> String {
    let body = json_of(fake.get(&format!("/v2/sandboxes/sessions/{session}")).await).await;
    body["session"]["status"].as_str().unwrap().to_string()
}
