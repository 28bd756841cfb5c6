//! `taskbox fake-vercel` over real sockets: the lifecycle, the service's error answers, every
//! fault knob, and Vercel's own SDK run against it (`tests/sdk/conformance.mjs`).

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use taskbox::fake::{CutMode, Endpoint, FakeOptions, FakeServer, Faults, StreamCut};
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
        let stats = fake.server.stats();
        assert_eq!(stats.requests_to(Endpoint::CreateSandbox), 6);
        assert_eq!(stats.responses_from(Endpoint::CreateSandbox, 400), 6);
    })
    .await;
}

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
async fn deleted_and_expired_snapshots_answer_410() {
    bounded(async {
        let fake = start_with(|o| o.snapshot_settle_ms = 0).await;
        let restore = |snap: String, name: &'static str| {
            fake.post(
                "/v2/sandboxes",
                json!({"projectId": "prj_1", "name": name,
                       "source": {"type": "snapshot", "snapshotId": snap}}),
            )
        };

        let s1 = fake.session_id("snap-a").await;
        let snap = fake.snapshot(&s1, json!({"expiration": 0})).await;
        assert!(snap["snapshot"].get("expiresAt").is_none(), "never expires");
        let id = snap["snapshot"]["id"].as_str().unwrap().to_string();
        let deleted = json_of(fake.delete(&format!("/v2/sandboxes/snapshots/{id}")).await).await;
        assert_eq!(deleted["snapshot"]["status"], "deleted");
        let resp = fake.get(&format!("/v2/sandboxes/snapshots/{id}")).await;
        expect_error(resp, 410, "snapshot_not_found").await;
        expect_error(
            restore(id.clone(), "from-deleted").await,
            410,
            "snapshot_not_found",
        )
        .await;

        let s2 = fake.session_id("snap-b").await;
        let snap = fake.snapshot(&s2, json!({"expiration": 86_400_000})).await;
        assert!(snap["snapshot"]["expiresAt"].is_u64());
        let id = snap["snapshot"]["id"].as_str().unwrap().to_string();
        let listed = json_of(fake.get("/v2/sandboxes/snapshots?name=snap-b").await).await;
        assert_eq!(listed["snapshots"][0]["id"], id.as_str());
        let resp = fake
            .http
            .post(fake.admin(&format!("/expire-snapshot/{id}")))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let resp = fake.get(&format!("/v2/sandboxes/snapshots/{id}")).await;
        expect_error(resp, 410, "snapshot_not_found").await;
        expect_error(restore(id, "from-expired").await, 410, "snapshot_not_found").await;
        let listed = json_of(fake.get("/v2/sandboxes/snapshots?name=snap-b").await).await;
        assert_eq!(listed["snapshots"], json!([]));
        let resp = fake.get("/v2/sandboxes/snapshots/snap_never").await;
        expect_error(resp, 404, "not_found").await;
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

#[tokio::test]
async fn sessions_boot_time_out_and_extend() {
    bounded(async {
        let fake = start_with(|o| o.boot_delay_ms = 300).await;
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

#[tokio::test]
async fn the_official_sdk_conforms() {
    let sdk_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk");
    assert!(
        sdk_dir
            .join("node_modules/@vercel/sandbox/package.json")
            .is_file(),
        "Vercel's SDK is not installed for the conformance test: run `npm ci --prefix tests/sdk` \
         (needs Node.js >= 20.18 and the npm registry)"
    );
    bounded(async {
        let fake = start_with(|o| o.token = Some(TOKEN.to_string())).await;
        let mut node = tokio::process::Command::new("node");
        node.arg(sdk_dir.join("conformance.mjs"))
            .env("TASKBOX_FAKE_VERCEL_URL", fake.server.base_url())
            .env("TASKBOX_FAKE_VERCEL_TOKEN", TOKEN)
            .kill_on_drop(true);
        let out = node.output().await.unwrap_or_else(|e| {
            panic!("cannot run `node` for the SDK conformance test ({e}); install Node.js >= 20.18")
        });
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the SDK disagrees with the fake:\n{stdout}{stderr}"
        );
        assert!(stdout.contains("conformance: ok"), "{stdout}{stderr}");
        eprint!("{stdout}");
        let stats = fake.server.stats();
        assert!(stats.requests_to(Endpoint::CreateSnapshot) >= 1);
        fake.server.shutdown().await.unwrap();
    })
    .await;
}
