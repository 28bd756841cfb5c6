//! The Vercel backend, one concern a file: settings validation (`settings`), auth resolution
//! and redaction (`auth`), the static doctor checks (`doctor`), error classification
//! (`classify`), the client over real sockets (a canned axum server in `http`, split NDJSON
//! streams in `ndjson`), and the whole provider lifecycle against the fake Vercel server
//! (`taskbox::fake`, in `against_the_fake`). The helpers they share live here.

mod against_the_fake;
mod auth;
mod classify;
mod doctor;
mod http;
mod images;
mod ndjson;
mod settings;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;

use taskbox::clock::SystemClock;
use taskbox::config::TerminalConfig;
use taskbox::provider::vercel::auth::Credentials;
use taskbox::provider::vercel::client::VercelClient;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// An environment made of `pairs` only.
fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k: &str| map.get(k).cloned()
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

/// An unsigned JWT with `claims` as its payload.
fn jwt(claims: &serde_json::Value) -> String {
    format!(
        "{}.{}.c2lnbmF0dXJl",
        b64(r#"{"alg":"RS256","typ":"JWT"}"#),
        b64(&claims.to_string())
    )
}

const NOW: u64 = 1_800_000_000_000;
const SECRET_TOKEN: &str = "tok_SUPER_SECRET_value_123";

fn vercel_config(cpu: u32, memory: u32) -> TerminalConfig {
    TerminalConfig {
        backend: taskbox::provider::vercel::BACKEND.backend(),
        container_cpu: cpu,
        container_memory: memory,
        ..TerminalConfig::default()
    }
}

fn empty_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// A loopback listener that never accepts: any connection attempt completes in the kernel's
/// backlog, where a non-blocking `accept` finds it.
struct RecordingListener {
    listener: std::net::TcpListener,
}

impl RecordingListener {
    fn bind() -> RecordingListener {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        listener.set_nonblocking(true).expect("non-blocking");
        RecordingListener { listener }
    }

    fn url(&self) -> String {
        format!("http://{}/api", self.listener.local_addr().unwrap())
    }

    fn connections(&self) -> usize {
        let mut n = 0;
        while self.listener.accept().is_ok() {
            n += 1;
        }
        n
    }
}

fn err_body(code: &str, message: &str) -> String {
    serde_json::json!({"error": {"code": code, "message": message}}).to_string()
}

/// One request as the canned server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

/// A scripted answer: status, headers, body.
type Answer = (u16, Vec<(&'static str, String)>, String);

/// A loopback HTTP server answering from a script, recording every request.
struct Canned {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    script: Arc<Mutex<VecDeque<Answer>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Canned {
    async fn start() -> Canned {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let script: Arc<Mutex<VecDeque<Answer>>> = Arc::default();
        let (s1, s2) = (seen.clone(), script.clone());
        let app = axum::Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let (seen, script) = (s1.clone(), s2.clone());
                async move {
                    seen.lock().unwrap().push(Seen {
                        method,
                        uri,
                        headers,
                        body,
                    });
                    let (status, headers, body) = script.lock().unwrap().pop_front().unwrap_or((
                        599,
                        vec![],
                        "script exhausted".into(),
                    ));
                    let mut resp: Response = body.into_response();
                    *resp.status_mut() = StatusCode::from_u16(status).unwrap();
                    for (k, v) in headers {
                        resp.headers_mut().insert(k, v.parse().unwrap());
                    }
                    resp
                }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Canned {
            addr,
            seen,
            script,
            _task: task,
        }
    }

    fn push(&self, status: u16, headers: &[(&'static str, &str)], body: &str) {
        self.script.lock().unwrap().push_back((
            status,
            headers.iter().map(|(k, v)| (*k, v.to_string())).collect(),
            body.to_string(),
        ));
    }

    fn client(&self) -> VercelClient {
        VercelClient::new(
            &format!("http://{}/api", self.addr),
            Credentials::access_token(SECRET_TOKEN, "team_t", "prj_t"),
            Arc::new(SystemClock),
        )
        .unwrap()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}
