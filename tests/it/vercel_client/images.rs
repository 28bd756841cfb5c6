//! Images and v3 create: an image goes to `POST /v3/sandboxes`, a (deprecated) runtime to
//! `POST /v2/sandboxes`, a restore from a snapshot carries neither; the working directory a
//! stdin upload lands in is read from the session. Against the canned server (the exact
//! requests) and the fake (the whole path).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value};
use taskbox::clock::SystemClock;
use taskbox::fake::{FakeOptions, FakeServer};
use taskbox::provider::vercel::auth::Credentials;
use taskbox::provider::vercel::client::{CreateSandbox, VercelClient};
use taskbox::provider::vercel::settings::{Runtime, SandboxBase, VercelSettings};
use taskbox::provider::vercel::VercelProvider;
use taskbox::provider::{sandbox_name, ExecIo, ExecRequest, SandboxProvider, SandboxSpec};

use super::{empty_dir, env_of, vercel_config, Canned, SECRET_TOKEN};
use crate::support::tid;

const INSTALLATION: &str = "inst_i";

fn created_answer(name: &str) -> String {
    json!({
        "sandbox": {"name": name, "persistent": true, "currentSessionId": "sbx_1", "status": "running"},
        "session": {"id": "sbx_1", "status": "running", "timeout": 60000, "startedAt": 1, "cwd": "/vercel/sandbox"},
        "routes": []
    })
    .to_string()
}

fn request(base: SandboxBase, source: Option<&str>) -> CreateSandbox {
    CreateSandbox {
        name: "n".into(),
        base,
        persistent: true,
        vcpus: 1,
        timeout_ms: 60_000,
        tags: BTreeMap::new(),
        source_snapshot: source.map(str::to_string),
    }
}

#[tokio::test]
async fn an_image_creates_through_v3_a_runtime_through_v2_and_a_restore_carries_neither() {
    let canned = Canned::start().await;
    let client = canned.client();
    let image = SandboxBase::Image("vercel/sandbox/node:24".into());
    let runtime = SandboxBase::Runtime(Runtime::Python313);
    let cases = [
        (image.clone(), None, "/api/v3/sandboxes"),
        (runtime.clone(), None, "/api/v2/sandboxes"),
        (image, Some("snap_1"), "/api/v3/sandboxes"),
        (runtime, Some("snap_2"), "/api/v2/sandboxes"),
    ];
    for (base, source, _) in &cases {
        canned.push(200, &[], &created_answer("n"));
        client
            .create_sandbox(&request(base.clone(), *source))
            .await
            .expect("created");
    }
    let seen = canned.seen();
    assert_eq!(seen.len(), cases.len());
    for ((base, source, path), seen) in cases.iter().zip(seen) {
        assert_eq!(seen.uri.path(), *path, "{base:?} {source:?}");
        let body: Value = serde_json::from_slice(&seen.body).unwrap();
        assert_eq!(body["persistent"], true);
        match (source, base) {
            (Some(snap), _) => {
                assert_eq!(
                    body["source"],
                    json!({"type": "snapshot", "snapshotId": snap})
                );
                assert!(
                    body.get("image").is_none() && body.get("runtime").is_none(),
                    "{body}"
                );
            }
            (None, SandboxBase::Image(i)) => {
                assert_eq!(body["image"], json!(i));
                assert!(body.get("runtime").is_none(), "{body}");
            }
            (None, SandboxBase::Runtime(r)) => {
                assert_eq!(body["runtime"], json!(r.as_str()));
                assert!(body.get("image").is_none(), "{body}");
            }
        }
    }
}

async fn fake(tweak: impl FnOnce(&mut FakeOptions)) -> (FakeServer, tempfile::TempDir) {
    let dir = empty_dir();
    let mut opts = FakeOptions::new(dir.path().join("fake"));
    opts.snapshot_settle_ms = 50;
    tweak(&mut opts);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    (FakeServer::start(listener, opts).await.unwrap(), dir)
}

fn provider(fake: &FakeServer, env: &[(&str, &str)]) -> VercelProvider {
    let client = VercelClient::new(
        &fake.base_url(),
        Credentials::access_token(SECRET_TOKEN, "team_t", "prj_t"),
        Arc::new(SystemClock),
    )
    .unwrap();
    let settings = VercelSettings::from_config(&vercel_config(1, 2048), &env_of(env)).unwrap();
    VercelProvider::new(client, settings)
}

fn spec(task: &str, generation: u64, source: Option<&str>) -> SandboxSpec {
    SandboxSpec {
        task_id: tid(task),
        generation,
        name: sandbox_name(INSTALLATION, task, generation),
        source_snapshot: source.map(Into::into),
        timeout_ms: 300_000,
        installation_id: INSTALLATION.to_string(),
    }
}

fn run(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.to_string(),
        timeout_ms: 20_000,
    }
}

/// The fake's view of a named sandbox.
async fn sandbox_json(fake: &FakeServer, name: &str) -> Value {
    let url = format!(
        "{}/v2/sandboxes/{name}?projectId=prj_t&teamId=team_t",
        fake.base_url()
    );
    reqwest::Client::new()
        .get(url)
        .bearer_auth(SECRET_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn against_the_fake_the_image_is_the_default_a_runtime_wins_and_restores_keep_the_snapshots_base(
) {
    let (fake, _dir) = fake(|_| {}).await;

    // The default: the universal image, through v3.
    let p = provider(&fake, &[]);
    let sb = p.create_sandbox(&spec("img", 0, None)).await.unwrap();
    let view = sandbox_json(&fake, &sb.name).await;
    assert_eq!(
        view["sandbox"]["image"], "vercel/sandbox/universal",
        "{view}"
    );
    assert!(view["sandbox"].get("runtime").is_none(), "{view}");
    assert_eq!(view["sandbox"]["persistent"], true, "{view}");
    p.exec(&sb.id, &run("echo kept > f")).await.unwrap();
    let snap = p.snapshot(&tid("img"), &sb.id, 1).await.unwrap();

    // A restore under another configured image carries none: the snapshot's image stays.
    let other = provider(
        &fake,
        &[("TERMINAL_VERCEL_IMAGE", "vercel/sandbox/python:3.14")],
    );
    let sb1 = other
        .create_sandbox(&spec("img", 1, Some(&snap.id)))
        .await
        .unwrap();
    let view = sandbox_json(&fake, &sb1.name).await;
    assert_eq!(
        view["sandbox"]["image"], "vercel/sandbox/universal",
        "{view}"
    );
    assert_eq!(
        other.exec(&sb1.id, &run("cat f")).await.unwrap().stdout,
        "kept\n"
    );

    // A set runtime wins, through v2 (which the fake refuses an image on).
    let legacy = provider(&fake, &[("TERMINAL_VERCEL_RUNTIME", "node22")]);
    let sb2 = legacy.create_sandbox(&spec("rt", 0, None)).await.unwrap();
    let view = sandbox_json(&fake, &sb2.name).await;
    assert_eq!(view["sandbox"]["runtime"], "node22", "{view}");
    assert!(view["sandbox"].get("image").is_none(), "{view}");

    // An image the platform does not know is refused, naming it.
    let unknown = provider(&fake, &[("TERMINAL_VERCEL_IMAGE", "example.com/nope:1")]);
    let err = unknown
        .create_sandbox(&spec("bad", 0, None))
        .await
        .expect_err("an unknown image");
    assert!(err.to_string().contains("example.com/nope:1"), "{err}");
}

/// Runs `command` with `stdin` through the provider's live side.
async fn with_stdin(
    p: &VercelProvider,
    id: &taskbox::ids::SandboxId,
    command: &str,
    stdin: &[u8],
) -> String {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(stdin.to_vec()).await.unwrap();
    drop(tx);
    let io = ExecIo {
        stdin: Some(rx),
        ..ExecIo::default()
    };
    let out = p.exec_live(id, &run(command), io).await.unwrap();
    assert_eq!(out.exit_code, 0, "{out:?}");
    out.stdout
}

#[tokio::test]
async fn stdin_is_uploaded_into_the_working_directory_the_session_reports() {
    // Image-based sessions of this fake start in a subdirectory, as Vercel's images may.
    let (fake, _dir) = fake(|o| o.image_cwd = "/vercel/sandbox/work".into()).await;
    let p = provider(&fake, &[]);
    let sb = p.create_sandbox(&spec("cwd", 0, None)).await.unwrap();
    assert_eq!(
        with_stdin(&p, &sb.id, "cat; basename \"$PWD\"", b"hello\n").await,
        "hello\nwork\n"
    );
    // A provider that did not create the session (an engine restarted) reads it from the
    // session.
    let restarted = provider(&fake, &[]);
    assert_eq!(
        with_stdin(&restarted, &sb.id, "wc -c", b"abc").await.trim(),
        "3"
    );
    // No upload is left behind.
    let left = p.exec(&sb.id, &run("ls -A")).await.unwrap().stdout;
    assert_eq!(left, "", "{left}");
}
