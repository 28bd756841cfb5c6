//! The Vercel backend: settings validation, auth resolution and redaction, error classification
//! over real sockets (a canned axum server), and the whole provider lifecycle against the fake
//! Vercel server (`taskbox::fake`).

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;

use taskbox::clock::{Clock, SystemClock};
use taskbox::config::{Backend, TerminalConfig};
use taskbox::core::FailureKind;
use taskbox::provider::vercel::auth::{
    decode_oidc_claims, AuthError, AuthMode, AuthReport, Credentials, OIDC_FIX,
};
use taskbox::provider::vercel::client::{
    classify, Call, HttpFailure, Missing, Replay, VercelClient,
};
use taskbox::provider::vercel::doctor;
use taskbox::provider::vercel::settings::{Origin, Runtime, VercelConfigError, VercelSettings};
use taskbox::provider::vercel::{VercelProvider, VercelSetupError};

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

/// A clock the test moves by hand.
#[derive(Debug)]
struct ManualClock(AtomicU64);

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

const NOW: u64 = 1_800_000_000_000;
const SECRET_TOKEN: &str = "tok_SUPER_SECRET_value_123";

fn vercel_config(cpu: u32, memory: u32) -> TerminalConfig {
    TerminalConfig {
        backend: Backend::VercelSandbox,
        container_cpu: cpu,
        container_memory: memory,
        ..TerminalConfig::default()
    }
}

fn empty_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

// ---------------------------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------------------------

#[test]
fn hermes_default_memory_is_refused_naming_both_values_and_the_valid_pair() {
    // Hermes's generic default: 1 vCPU, 5120 MB.
    let err = VercelSettings::from_config(&TerminalConfig::default(), &env_of(&[]))
        .expect_err("5120 MB with 1 vCPU is not a Vercel shape");
    assert_eq!(
        err,
        VercelConfigError::MemoryMismatch {
            cpu: 1,
            memory: 5120,
            expected: 2048
        }
    );
    assert_eq!(
        err.to_string(),
        "terminal.container_memory is 5120 but Vercel Sandbox allocates 2048 MB per vCPU: with terminal.container_cpu = 1 it must be 2048"
    );
    assert_eq!(
        err.hint(),
        "set terminal.container_memory to 2048 (2048 MB per vCPU), or pick another valid pair such as cpu 2 / memory 4096"
    );
}

#[test]
fn two_vcpus_need_4096_mb() {
    let err = VercelSettings::from_config(&vercel_config(2, 5120), &env_of(&[]))
        .expect_err("5120 MB with 2 vCPUs");
    assert_eq!(
        err.to_string(),
        "terminal.container_memory is 5120 but Vercel Sandbox allocates 2048 MB per vCPU: with terminal.container_cpu = 2 it must be 4096"
    );
    assert_eq!(
        err.hint(),
        "set terminal.container_memory to 4096 (2048 MB per vCPU), or pick another valid pair such as cpu 1 / memory 2048"
    );
    let ok = VercelSettings::from_config(&vercel_config(2, 4096), &env_of(&[])).expect("valid");
    assert_eq!((ok.vcpus, ok.memory_mb), (2, 4096));
    assert_eq!(ok.runtime, Runtime::Node24);
    assert_eq!(ok.api_url, "https://vercel.com/api");
}

#[test]
fn odd_or_too_many_vcpus_are_refused_with_a_valid_pair() {
    let err = VercelSettings::from_config(&vercel_config(3, 6144), &env_of(&[])).unwrap_err();
    assert!(
        err.to_string().contains("terminal.container_cpu is 3"),
        "{err}"
    );
    assert_eq!(
        err.hint(),
        "set terminal.container_cpu to 4 and terminal.container_memory to 8192 (2048 MB per vCPU)"
    );
    let err = VercelSettings::from_config(&vercel_config(16, 32768), &env_of(&[])).unwrap_err();
    assert!(
        err.hint().contains("terminal.container_cpu to 8"),
        "{}",
        err.hint()
    );
}

#[test]
fn a_disk_size_is_refused_with_the_command_that_unsets_it() {
    let mut t = vercel_config(1, 2048);
    t.container_disk = Some(51200);
    let err = VercelSettings::from_config(&t, &env_of(&[])).unwrap_err();
    assert_eq!(err, VercelConfigError::DiskUnsupported { disk: 51200 });
    assert!(
        err.to_string()
            .contains("custom disk sizes are not supported on Vercel Sandbox"),
        "{err}"
    );
    assert_eq!(
        err.hint(),
        "unset it: taskbox config set terminal.container_disk none"
    );
}

#[test]
fn the_runtime_env_var_overrides_the_config_and_bad_values_name_their_source() {
    let mut t = vercel_config(1, 2048);
    t.vercel_runtime = "node22".into();
    let s = VercelSettings::from_config(&t, &env_of(&[])).unwrap();
    assert_eq!(
        (s.runtime, s.runtime_origin),
        (Runtime::Node22, Origin::Config)
    );

    let env = env_of(&[("TERMINAL_VERCEL_RUNTIME", "python3.13")]);
    let s = VercelSettings::from_config(&t, &env).unwrap();
    assert_eq!(
        (s.runtime, s.runtime_origin),
        (Runtime::Python313, Origin::Env)
    );

    let env = env_of(&[("TERMINAL_VERCEL_RUNTIME", "node18")]);
    let err = VercelSettings::from_config(&t, &env).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("TERMINAL_VERCEL_RUNTIME is `node18`"),
        "{err}"
    );
    assert!(
        err.hint().contains("node24, node22, python3.13"),
        "{}",
        err.hint()
    );

    t.vercel_runtime = "ruby".into();
    let err = VercelSettings::from_config(&t, &env_of(&[])).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("terminal.vercel_runtime is `ruby`"),
        "{err}"
    );
}

#[test]
fn the_api_url_env_var_wins_and_must_be_http() {
    let t = vercel_config(1, 2048);
    let env = env_of(&[("TASKBOX_VERCEL_API_URL", "http://127.0.0.1:9/api/")]);
    let s = VercelSettings::from_config(&t, &env).unwrap();
    assert_eq!(s.api_url, "http://127.0.0.1:9/api");
    assert_eq!(s.api_url_origin, Origin::Env);
    let env = env_of(&[("TASKBOX_VERCEL_API_URL", "ftp://x")]);
    let err = VercelSettings::from_config(&t, &env).unwrap_err();
    assert!(err.to_string().contains("TASKBOX_VERCEL_API_URL"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Auth
// ---------------------------------------------------------------------------------------------

#[test]
fn jwt_payload_is_decoded_without_verification() {
    let token = jwt(&serde_json::json!({
        "owner_id": "team_abc", "project_id": "prj_xyz", "exp": 1_800_000_100, "sub": "x"
    }));
    let c = decode_oidc_claims(&token).unwrap();
    assert_eq!(c.owner_id, "team_abc");
    assert_eq!(c.project_id.as_deref(), Some("prj_xyz"));
    assert_eq!(c.expires_at_ms, Some(1_800_000_100_000));

    // Padding some tools add is tolerated.
    let padded = {
        let mut parts: Vec<String> = token.split('.').map(str::to_string).collect();
        while parts[1].len() % 4 != 0 {
            parts[1].push('=');
        }
        parts.join(".")
    };
    assert_eq!(decode_oidc_claims(&padded).unwrap(), c);
}

#[test]
fn malformed_oidc_tokens_are_refused_without_quoting_them() {
    let not_json = format!("{}.{}.sig", b64("{}"), b64("SECRETPAYLOAD not json"));
    let no_owner = jwt(&serde_json::json!({"project_id": "prj", "exp": 2_000_000_000}));
    for (token, reason) in [
        ("SECRETPLAINTOKEN", "three dot-separated parts"),
        ("SECRET.PARTS", "three dot-separated parts"),
        ("aaa.!!SECRET!!.ccc", "not base64url"),
        (not_json.as_str(), "not a JSON object"),
        (no_owner.as_str(), "owner_id"),
    ] {
        let env = env_of(&[("VERCEL_OIDC_TOKEN", token)]);
        let err = Credentials::resolve(&env, empty_dir().path(), NOW).unwrap_err();
        assert!(matches!(err, AuthError::MalformedOidc { .. }), "{err:?}");
        let text = format!("{err} {err:?} {}", err.hint());
        assert!(text.contains(reason), "{text}");
        assert!(!text.contains("SECRET"), "the token leaked: {text}");
    }
}

#[test]
fn an_expired_oidc_token_is_refused_with_the_fix() {
    let token = jwt(
        &serde_json::json!({"owner_id": "team_a", "project_id": "prj_a", "exp": 1_700_000_000}),
    );
    let env = env_of(&[("VERCEL_OIDC_TOKEN", &token)]);
    let err = Credentials::resolve(&env, empty_dir().path(), NOW).unwrap_err();
    assert_eq!(
        err,
        AuthError::OidcExpired {
            expired_at_ms: 1_700_000_000_000
        }
    );
    assert!(
        err.to_string()
            .contains("VERCEL_OIDC_TOKEN expired at 2023-11-14"),
        "{err}"
    );
    assert_eq!(
        err.hint(),
        "run `vercel env pull` in the linked project and export the fresh token; for long-running processes use access-token auth: VERCEL_TOKEN, VERCEL_PROJECT_ID, VERCEL_TEAM_ID"
    );
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

#[tokio::test]
async fn an_expired_oidc_token_sends_no_request() {
    let listener = RecordingListener::bind();
    let expired = jwt(
        &serde_json::json!({"owner_id": "team_a", "project_id": "prj_a", "exp": 1_700_000_000}),
    );
    let url = listener.url();
    let env = env_of(&[
        ("VERCEL_OIDC_TOKEN", &expired),
        ("TASKBOX_VERCEL_API_URL", &url),
    ]);
    let clock = Arc::new(ManualClock(AtomicU64::new(NOW)));
    let err = VercelProvider::from_config(&vercel_config(1, 2048), &env, empty_dir().path(), clock)
        .expect_err("expired token");
    assert!(
        matches!(err, VercelSetupError::Auth(AuthError::OidcExpired { .. })),
        "{err:?}"
    );
    assert!(err.hint().unwrap().contains("vercel env pull"));

    // A token that expires while the process runs: the client refuses before connecting.
    let valid = jwt(
        &serde_json::json!({"owner_id": "team_a", "project_id": "prj_a", "exp": NOW / 1000 + 60}),
    );
    let env = env_of(&[
        ("VERCEL_OIDC_TOKEN", &valid),
        ("TASKBOX_VERCEL_API_URL", &url),
    ]);
    let clock = Arc::new(ManualClock(AtomicU64::new(NOW)));
    let provider = VercelProvider::from_config(
        &vercel_config(1, 2048),
        &env,
        empty_dir().path(),
        clock.clone(),
    )
    .expect("valid for another minute");
    clock.0.store(NOW + 61_000, Ordering::SeqCst);
    let err = provider
        .client()
        .get_session("sess_1")
        .await
        .expect_err("expired by now");
    assert_eq!(err.kind, FailureKind::Auth);
    assert!(err.message.contains(OIDC_FIX), "{err}");
    assert_eq!(listener.connections(), 0, "no request may be sent");

    // The listener does record connections: a live token connects.
    clock.0.store(NOW, Ordering::SeqCst);
    let call = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        provider.client().get_session("sess_1"),
    )
    .await;
    assert!(call.is_err(), "the listener never answers");
    assert_eq!(listener.connections(), 1);
}

#[test]
fn access_token_auth_names_the_missing_variables() {
    let dir = empty_dir();
    type Vars<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Vars, &[&str]); 4] = [
        (
            &[("VERCEL_TOKEN", SECRET_TOKEN)],
            &["VERCEL_PROJECT_ID", "VERCEL_TEAM_ID"],
        ),
        (
            &[("VERCEL_TOKEN", SECRET_TOKEN), ("VERCEL_PROJECT_ID", "prj")],
            &["VERCEL_TEAM_ID"],
        ),
        (
            &[("VERCEL_PROJECT_ID", "prj")],
            &["VERCEL_TOKEN", "VERCEL_TEAM_ID"],
        ),
        (
            &[
                ("VERCEL_TOKEN", ""),
                ("VERCEL_TEAM_ID", "team"),
                ("VERCEL_PROJECT_ID", "prj"),
            ],
            &["VERCEL_TOKEN"],
        ),
    ];
    for (vars, missing) in cases {
        let err = Credentials::resolve(&env_of(vars), dir.path(), NOW).unwrap_err();
        match &err {
            AuthError::MissingAccessTokenVars { missing: m, .. } => assert_eq!(m, missing),
            other => panic!("expected missing vars, got {other:?}"),
        }
        let text = format!("{err}; hint: {}", err.hint());
        for m in missing {
            assert!(text.contains(m), "{text}");
        }
        assert!(!text.contains(SECRET_TOKEN));
    }
    let err = Credentials::resolve(&env_of(&[]), dir.path(), NOW).unwrap_err();
    assert_eq!(err, AuthError::NoCredentials);
    assert!(err
        .hint()
        .contains("VERCEL_TOKEN, VERCEL_PROJECT_ID and VERCEL_TEAM_ID"));
}

#[test]
fn project_and_team_default_from_the_nearest_project_json() {
    let root = empty_dir();
    std::fs::create_dir_all(root.path().join(".vercel")).unwrap();
    std::fs::write(
        root.path().join(".vercel/project.json"),
        r#"{"projectId":"prj_linked","orgId":"team_linked"}"#,
    )
    .unwrap();
    let deep = root.path().join("a/b/c");
    std::fs::create_dir_all(&deep).unwrap();

    let env = env_of(&[("VERCEL_TOKEN", SECRET_TOKEN)]);
    let c = Credentials::resolve(&env, &deep, NOW).unwrap();
    assert_eq!(c.mode(), AuthMode::AccessToken);
    assert_eq!((c.team_id(), c.project_id()), ("team_linked", "prj_linked"));

    // Variables win over the file.
    let env = env_of(&[
        ("VERCEL_TOKEN", SECRET_TOKEN),
        ("VERCEL_TEAM_ID", "team_env"),
    ]);
    let c = Credentials::resolve(&env, &deep, NOW).unwrap();
    assert_eq!((c.team_id(), c.project_id()), ("team_env", "prj_linked"));

    // A nearer project.json shadows the outer one.
    std::fs::create_dir_all(root.path().join("a/.vercel")).unwrap();
    std::fs::write(
        root.path().join("a/.vercel/project.json"),
        r#"{"projectId":"prj_inner","orgId":"team_inner"}"#,
    )
    .unwrap();
    let c = Credentials::resolve(&env_of(&[("VERCEL_TOKEN", SECRET_TOKEN)]), &deep, NOW).unwrap();
    assert_eq!((c.team_id(), c.project_id()), ("team_inner", "prj_inner"));

    // A broken file is named when it is needed.
    std::fs::write(root.path().join("a/.vercel/project.json"), "{not json").unwrap();
    let err =
        Credentials::resolve(&env_of(&[("VERCEL_TOKEN", SECRET_TOKEN)]), &deep, NOW).unwrap_err();
    assert!(matches!(err, AuthError::ProjectJson { .. }), "{err:?}");
    assert!(err.to_string().contains("a/.vercel/project.json"), "{err}");
}

#[test]
fn the_access_token_wins_over_oidc_and_oidc_takes_team_and_project_from_the_token() {
    let oidc = jwt(
        &serde_json::json!({"owner_id": "team_o", "project_id": "prj_o", "exp": NOW / 1000 + 3600}),
    );
    let both = env_of(&[
        ("VERCEL_OIDC_TOKEN", &oidc),
        ("VERCEL_TOKEN", SECRET_TOKEN),
        ("VERCEL_PROJECT_ID", "prj_t"),
        ("VERCEL_TEAM_ID", "team_t"),
    ]);
    let c = Credentials::resolve(&both, empty_dir().path(), NOW).unwrap();
    assert_eq!(c.mode(), AuthMode::AccessToken);
    assert_eq!((c.team_id(), c.project_id()), ("team_t", "prj_t"));

    let only_oidc = env_of(&[("VERCEL_OIDC_TOKEN", &oidc)]);
    let c = Credentials::resolve(&only_oidc, empty_dir().path(), NOW).unwrap();
    assert_eq!(c.mode(), AuthMode::Oidc);
    assert_eq!((c.team_id(), c.project_id()), ("team_o", "prj_o"));
    assert_eq!(c.expires_at_ms(), Some((NOW / 1000 + 3600) * 1000));
}

#[test]
fn nothing_that_holds_a_token_prints_it() {
    let oidc = jwt(
        &serde_json::json!({"owner_id": "team_o", "project_id": "prj_o", "exp": NOW / 1000 + 3600}),
    );
    for env in [
        env_of(&[
            ("VERCEL_TOKEN", SECRET_TOKEN),
            ("VERCEL_PROJECT_ID", "prj"),
            ("VERCEL_TEAM_ID", "team"),
        ]),
        env_of(&[("VERCEL_OIDC_TOKEN", &oidc)]),
    ] {
        let dir = empty_dir();
        let creds = Credentials::resolve(&env, dir.path(), NOW).unwrap();
        let token_text = if creds.mode() == AuthMode::Oidc {
            oidc.as_str()
        } else {
            SECRET_TOKEN
        };
        let client = VercelClient::new(
            "http://127.0.0.1:9/api",
            creds.clone(),
            Arc::new(SystemClock),
        )
        .unwrap();
        let report = AuthReport::gather(&env, dir.path(), NOW);
        let checks = doctor::static_checks(&vercel_config(1, 2048), &env, dir.path(), NOW);
        let printed = format!(
            "{creds} {creds:?} {client:?} {report:?} {} {checks:?}",
            report.summary()
        );
        assert!(!printed.contains(token_text), "a token leaked: {printed}");
        assert!(printed.contains("[redacted]"));
    }
}

#[test]
fn the_auth_report_names_variables_and_the_mode_never_values() {
    let dir = empty_dir();
    let oidc = jwt(
        &serde_json::json!({"owner_id": "team_o", "project_id": "prj_o", "exp": NOW / 1000 + 3600}),
    );
    let env = env_of(&[("VERCEL_OIDC_TOKEN", &oidc), ("VERCEL_PROJECT_ID", "prj_x")]);
    let report = AuthReport::gather(&env, dir.path(), NOW);
    assert_eq!(report.mode, Some(AuthMode::Oidc));
    assert_eq!(
        report.variables,
        vec![
            ("VERCEL_OIDC_TOKEN", true),
            ("VERCEL_TOKEN", false),
            ("VERCEL_PROJECT_ID", true),
            ("VERCEL_TEAM_ID", false)
        ]
    );
    assert_eq!(report.oidc_expires_at_ms, Some((NOW / 1000 + 3600) * 1000));
    let s = report.summary();
    assert!(
        s.starts_with("OIDC token (team team_o, project prj_o)"),
        "{s}"
    );
    assert!(
        s.contains("set: VERCEL_OIDC_TOKEN, VERCEL_PROJECT_ID"),
        "{s}"
    );
    assert!(s.contains("unset: VERCEL_TOKEN, VERCEL_TEAM_ID"), "{s}");
    assert!(s.contains("OIDC token expires 2027-01-15T09:00:00"), "{s}");
}

// ---------------------------------------------------------------------------------------------
// Doctor (static)
// ---------------------------------------------------------------------------------------------

#[test]
fn doctor_static_checks_show_every_problem_at_once() {
    // 1 vCPU / 5120 MB (invalid for Vercel) and a disk size.
    let t = TerminalConfig {
        container_disk: Some(10_000),
        ..TerminalConfig::default()
    };
    let checks = doctor::static_checks(&t, &env_of(&[]), empty_dir().path(), NOW);
    let by_name = |n: &str| checks.iter().find(|c| c.name == n).expect(n).clone();
    assert!(by_name("vercel runtime").ok);
    assert_eq!(
        by_name("vercel runtime").detail,
        "node24 (from terminal.vercel_runtime)"
    );
    let res = by_name("vercel resources");
    assert!(!res.ok);
    assert!(res.detail.contains("5120") && res.hint.as_deref().unwrap().contains("2048"));
    let disk = by_name("disk setting");
    assert!(!disk.ok);
    assert_eq!(
        disk.hint.as_deref(),
        Some("unset it: taskbox config set terminal.container_disk none")
    );
    let auth = by_name("vercel auth");
    assert!(!auth.ok);
    assert!(
        auth.detail.contains("no Vercel credentials"),
        "{}",
        auth.detail
    );
    let persistence = by_name("persistence");
    assert_eq!(
        persistence.detail,
        "snapshot filesystem only; live processes do not survive sandbox recreation"
    );
}

// ---------------------------------------------------------------------------------------------
// Classification
// ---------------------------------------------------------------------------------------------

fn status(code: u16, body: &str, retry_after: Option<&str>) -> HttpFailure {
    HttpFailure::Status {
        status: code,
        retry_after: retry_after.map(str::to_string),
        body: body.as_bytes().to_vec(),
    }
}

fn err_body(code: &str, message: &str) -> String {
    serde_json::json!({"error": {"code": code, "message": message}}).to_string()
}

#[test]
fn classification_table() {
    let call = Call::new("get session", Replay::Safe, Missing::SandboxGone);
    let mode = AuthMode::AccessToken;
    let kind = |f| classify(call, f, mode).kind;
    assert_eq!(
        kind(status(
            429,
            &err_body("too_many_requests", "slow down"),
            Some("7")
        )),
        FailureKind::Transient {
            retry_after_ms: Some(7000)
        }
    );
    assert_eq!(
        kind(status(429, "", Some("1.5"))),
        FailureKind::Transient {
            retry_after_ms: Some(1500)
        }
    );
    assert_eq!(
        kind(status(429, "", Some("Wed, 21 Oct 2015 07:28:00 GMT"))),
        FailureKind::Transient {
            retry_after_ms: None
        }
    );
    for s in [500, 502, 503, 504] {
        assert!(matches!(
            kind(status(s, "oops", None)),
            FailureKind::Transient { .. }
        ));
    }
    for code in ["sandbox_snapshotting", "sandbox_stopping"] {
        assert_eq!(
            kind(status(422, &err_body(code, "settling"), None)),
            FailureKind::Transient {
                retry_after_ms: None
            }
        );
    }
    assert_eq!(
        kind(status(422, &err_body("other", "x"), None)),
        FailureKind::Permanent
    );
    assert_eq!(
        kind(status(410, &err_body("sandbox_stopped", "x"), None)),
        FailureKind::SandboxGone
    );
    assert_eq!(
        kind(status(410, &err_body("snapshot_not_found", "x"), None)),
        FailureKind::SnapshotGone
    );
    assert_eq!(kind(status(401, "", None)), FailureKind::Auth);
    assert_eq!(
        kind(status(403, &err_body("forbidden", "no"), None)),
        FailureKind::Auth
    );
    assert_eq!(
        kind(status(
            400,
            &err_body("bad_request", "Invalid request: x"),
            None
        )),
        FailureKind::Invalid
    );
    assert_eq!(
        kind(status(402, &err_body("payment_required", "quota"), None)),
        FailureKind::Permanent
    );
    assert_eq!(kind(status(418, "", None)), FailureKind::Permanent);
    // A 404 means what the call says it means.
    assert_eq!(
        kind(status(404, &err_body("not_found", "x"), None)),
        FailureKind::SandboxGone
    );
    let snap = Call::new("get snapshot", Replay::Safe, Missing::SnapshotGone);
    assert_eq!(
        classify(snap, status(404, "", None), mode).kind,
        FailureKind::SnapshotGone
    );
    let list = Call::new("list sandboxes", Replay::Safe, Missing::Permanent);
    assert_eq!(
        classify(list, status(404, "", None), mode).kind,
        FailureKind::Permanent
    );
    // Transport errors are transient, except after a non-idempotent request went out.
    let transport = |connect| HttpFailure::Transport {
        connect,
        message: "connection reset".into(),
    };
    assert!(classify(call, transport(false), mode).is_transient());
    let run = Call::new("run command", Replay::Unsafe, Missing::SandboxGone);
    assert!(classify(run, transport(true), mode).is_transient());
    let e = classify(run, transport(false), mode);
    assert_eq!(e.kind, FailureKind::Permanent);
    assert!(e.message.contains("may have been carried out"), "{e}");
    // Auth messages carry the fix for the mode in use.
    let e = classify(
        call,
        status(403, &err_body("forbidden", "Not authorized"), None),
        AuthMode::Oidc,
    );
    assert!(e.message.contains(OIDC_FIX), "{e}");
    let e = classify(
        call,
        status(
            400,
            &err_body("bad_request", "Invalid request: `timeout` should be <= 45m"),
            None,
        ),
        mode,
    );
    assert!(e.message.contains("`timeout` should be <= 45m"), "{e}");
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
        let err = client.extend_timeout("sess_1", 60_000).await.unwrap_err();
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
    let err = client.extend_timeout("sess_1", 60_000).await.unwrap_err();
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

/// Serves one HTTP/1.1 response on a raw socket, writing `chunks` as separate chunked-encoding
/// chunks (each flushed on its own) so that records and UTF-8 characters arrive split.
async fn serve_chunks_once(chunks: Vec<Vec<u8>>) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        sock.set_nodelay(true).unwrap();
        // Read the request head and its body (content-length).
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        let head_end = loop {
            let n = sock.read(&mut buf).await.unwrap();
            req.extend_from_slice(&buf[..n]);
            if let Some(p) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
        };
        let head = String::from_utf8_lossy(&req[..head_end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        while req.len() < head_end + len {
            let n = sock.read(&mut buf).await.unwrap();
            req.extend_from_slice(&buf[..n]);
        }
        sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        for c in chunks {
            sock.write_all(format!("{:x}\r\n", c.len()).as_bytes())
                .await
                .unwrap();
            sock.write_all(&c).await.unwrap();
            sock.write_all(b"\r\n").await.unwrap();
            sock.flush().await.unwrap();
        }
        sock.write_all(b"0\r\n\r\n").await.unwrap();
        sock.flush().await.unwrap();
    });
    addr
}

#[tokio::test]
async fn ndjson_records_split_across_chunks_are_reassembled() {
    let stream = "{\"command\":{\"id\":\"cmd_1\",\"exitCode\":null}}\n{\"stream\":\"stdout\",\"data\":\"caf\u{e9}\"}\n{\"command\":{\"id\":\"cmd_1\",\"exitCode\":0}}\n";
    let bytes = stream.as_bytes();
    let e_acute = bytes.iter().position(|&b| b == 0xc3).unwrap();
    // Cut mid-record, right inside the two bytes of `é`, and mid-line again.
    let cuts = [7, e_acute + 1, bytes.len() - 5];
    let mut chunks = Vec::new();
    let mut last = 0;
    for c in cuts {
        chunks.push(bytes[last..c].to_vec());
        last = c;
    }
    chunks.push(bytes[last..].to_vec());
    let addr = serve_chunks_once(chunks).await;
    let client = VercelClient::new(
        &format!("http://{addr}/api"),
        Credentials::access_token(SECRET_TOKEN, "team_t", "prj_t"),
        Arc::new(SystemClock),
    )
    .unwrap();
    let cmd = taskbox::provider::vercel::client::RunCommand {
        command: "bash".into(),
        args: vec!["-c".into(), "printf café".into()],
        cwd: None,
        env: BTreeMap::new(),
        sudo: false,
        timeout_ms: None,
    };
    let mut stream = client.run_command_streaming("sess_1", &cmd).await.unwrap();
    use taskbox::provider::vercel::client::StreamEvent as E;
    let mut events = Vec::new();
    while let Some(e) = stream.next().await.unwrap() {
        events.push(e);
    }
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[1], E::Stdout("café".into()));
    assert!(matches!(&events[2], E::Command(c) if c.exit_code == Some(0)));
}

#[tokio::test]
async fn ndjson_blank_lines_unknown_records_and_a_missing_final_newline_are_handled() {
    let server = Canned::start().await;
    let client = server.client();
    let body = concat!(
        "{\"command\":{\"id\":\"cmd_1\",\"exitCode\":null}}\n",
        "{\"stream\":\"stdout\",\"data\":\"par\"}\n",
        "{\"stream\":\"stdout\",\"data\":\"tial\\n\"}\n\n",
        "{\"stream\":\"stderr\",\"data\":\"é\"}\n",
        "{\"stream\":\"mystery\",\"data\":1}\n",
        "{\"command\":{\"id\":\"cmd_1\",\"exitCode\":3}}"
    );
    server.push(200, &[("content-type", "application/x-ndjson")], body);
    let out = client
        .run_command_streaming(
            "sess_1",
            &taskbox::provider::vercel::client::RunCommand {
                command: "bash".into(),
                args: vec!["-c".into(), "x".into()],
                cwd: None,
                env: BTreeMap::new(),
                sudo: false,
                timeout_ms: Some(1000),
            },
        )
        .await;
    let mut stream = out.unwrap();
    use taskbox::provider::vercel::client::StreamEvent as E;
    let mut events = Vec::new();
    while let Some(e) = stream.next().await.unwrap() {
        events.push(e);
    }
    assert_eq!(events.len(), 5);
    assert_eq!(events[1], E::Stdout("par".into()));
    assert_eq!(events[3], E::Stderr("é".into()));
    assert!(matches!(&events[4], E::Command(c) if c.exit_code == Some(3)));
    let seen = server.seen();
    let sent: serde_json::Value = serde_json::from_slice(&seen[0].body).unwrap();
    assert_eq!(
        sent,
        serde_json::json!({"command":"bash","args":["-c","x"],"env":{},"sudo":false,
                           "timeout":1000,"wait":true,"logs":true})
    );
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

// ---------------------------------------------------------------------------------------------
// The provider against the fake Vercel server
// ---------------------------------------------------------------------------------------------

mod against_the_fake {
    use super::*;

    use taskbox::fake::{
        CutMode, DropCreate, DropMode, Endpoint, FakeOptions, FakeServer, Faults, RateLimitBurst,
        StreamCut,
    };
    use taskbox::provider::vercel::exec::ExecOptions;
    use taskbox::provider::vercel::ProviderOptions;
    use taskbox::provider::{sandbox_name, ExecRequest, SandboxProvider, SandboxSpec};

    const INSTALLATION: &str = "inst_a";

    struct World {
        fake: FakeServer,
        provider: VercelProvider,
        _dir: tempfile::TempDir,
    }

    async fn world_with(tweak: impl FnOnce(&mut FakeOptions)) -> World {
        let dir = empty_dir();
        let mut opts = FakeOptions::new(dir.path().join("fake"));
        opts.token = Some(SECRET_TOKEN.to_string());
        tweak(&mut opts);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = FakeServer::start(listener, opts)
            .await
            .expect("fake starts");
        let provider = provider_for(&fake, SECRET_TOKEN);
        World {
            fake,
            provider,
            _dir: dir,
        }
    }

    async fn world() -> World {
        world_with(|_| {}).await
    }

    fn provider_for(fake: &FakeServer, token: &str) -> VercelProvider {
        let client = VercelClient::new(
            &fake.base_url(),
            Credentials::access_token(token, "team_t", "prj_t"),
            Arc::new(SystemClock),
        )
        .unwrap();
        let settings = VercelSettings::from_config(&vercel_config(2, 4096), &env_of(&[])).unwrap();
        VercelProvider::new(client, settings).with_options(ProviderOptions {
            start_timeout: std::time::Duration::from_secs(10),
            snapshot_expiration_ms: None,
            exec: ExecOptions {
                max_poll_delay: std::time::Duration::from_millis(100),
                ..ExecOptions::default()
            },
        })
    }

    fn spec(task: &str, generation: u64, source: Option<&str>) -> SandboxSpec {
        SandboxSpec {
            task_id: task.to_string(),
            generation,
            name: sandbox_name(task, generation),
            source_snapshot: source.map(str::to_string),
            timeout_ms: 300_000,
            installation_id: INSTALLATION.to_string(),
        }
    }

    fn run(command: &str, timeout_ms: u64) -> ExecRequest {
        ExecRequest {
            command: command.to_string(),
            timeout_ms,
        }
    }

    #[tokio::test]
    async fn the_whole_lifecycle() {
        let w = world().await;
        let p = &w.provider;

        let sb = p.create_sandbox(&spec("life", 0, None)).await.unwrap();
        assert_eq!(sb.name, "taskbox-life-g0");
        let deadline = p.probe_sandbox(&sb.id).await.unwrap().expect("running");
        assert_eq!(deadline, sb.deadline);

        let out = p
            .exec(
                &sb.id,
                &run("echo hi > f.txt; echo out; echo err >&2; exit 3", 10_000),
            )
            .await
            .unwrap();
        assert_eq!((out.exit_code, out.timed_out), (3, false));
        assert_eq!(
            (out.stdout.as_str(), out.stderr.as_str()),
            ("out\n", "err\n")
        );

        // A warm command is one HTTP request.
        w.fake.reset_stats();
        let out = p.exec(&sb.id, &run("cat f.txt", 10_000)).await.unwrap();
        assert_eq!(out.stdout, "hi\n");
        assert_eq!(w.fake.stats().total, 1, "{:?}", w.fake.stats());

        let extended = p.extend_timeout(&sb.id, 60_000).await.unwrap();
        assert_eq!(extended, sb.deadline + 60_000);

        // Snapshot: idempotent, and it stops the session.
        let snap = p.snapshot("life", &sb.id, 1).await.unwrap();
        let again = p.snapshot("life", &sb.id, 1).await.unwrap();
        assert_eq!(snap, again);
        assert_eq!(w.fake.stats().requests_to(Endpoint::CreateSnapshot), 1);
        assert_eq!(p.probe_sandbox(&sb.id).await.unwrap(), None);

        // Restore into the next generation: the file is back (and the create omitted
        // `runtime`, which the fake refuses next to a snapshot source).
        let sb1 = p
            .create_sandbox(&spec("life", 1, Some(&snap.id)))
            .await
            .unwrap();
        assert_ne!(sb1.id, sb.id);
        let out = p.exec(&sb1.id, &run("cat f.txt", 10_000)).await.unwrap();
        assert_eq!(out.stdout, "hi\n");

        // Reconciler views: only this installation's resources, with their tasks.
        let listed = p.list_sandboxes(INSTALLATION).await.unwrap();
        assert_eq!(listed.len(), 2, "{listed:?}");
        let live: Vec<_> = listed.iter().filter(|r| r.live).collect();
        assert_eq!(live.len(), 1);
        assert_eq!(live[0].id, sb1.id);
        assert!(listed.iter().all(|r| r.task_id.as_deref() == Some("life")));
        let snaps = p.list_snapshots(INSTALLATION).await.unwrap();
        assert_eq!(snaps.len(), 1);
        assert_eq!(
            (
                snaps[0].id.as_str(),
                snaps[0].task_id.as_deref(),
                snaps[0].live
            ),
            (snap.id.as_str(), Some("life"), true)
        );
        assert!(p.list_sandboxes("someone_else").await.unwrap().is_empty());
        assert!(p.list_snapshots("someone_else").await.unwrap().is_empty());

        // Stop and delete are idempotent.
        p.stop_sandbox(&sb1.id).await.unwrap();
        p.stop_sandbox(&sb1.id).await.unwrap();
        assert_eq!(p.probe_sandbox(&sb1.id).await.unwrap(), None);
        p.delete_snapshot(&snap.id).await.unwrap();
        p.delete_snapshot(&snap.id).await.unwrap();
        assert!(p.list_snapshots(INSTALLATION).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_repeated_create_finds_the_first_sandbox() {
        let w = world().await;
        let a = w
            .provider
            .create_sandbox(&spec("twice", 0, None))
            .await
            .unwrap();
        let b = w
            .provider
            .create_sandbox(&spec("twice", 0, None))
            .await
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(w.fake.stats().requests_to(Endpoint::CreateSandbox), 1);
        assert_eq!(
            w.provider.list_sandboxes(INSTALLATION).await.unwrap().len(),
            1
        );
    }

    #[tokio::test]
    async fn a_lost_create_response_does_not_make_a_second_sandbox() {
        for mode in [DropMode::Close, DropMode::Error] {
            let w = world().await;
            w.fake
                .set_faults(Faults {
                    drop_create: Some(DropCreate { count: 1, mode }),
                    ..Faults::default()
                })
                .unwrap();
            let sb = w
                .provider
                .create_sandbox(&spec("lost", 0, None))
                .await
                .unwrap();
            assert_eq!(w.fake.stats().injected.dropped_creates, 1);
            let listed = w.provider.list_sandboxes(INSTALLATION).await.unwrap();
            assert_eq!(listed.len(), 1, "{mode:?}: {listed:?}");
            assert_eq!(listed[0].id, sb.id);
            let out = w
                .provider
                .exec(&sb.id, &run("echo ok", 10_000))
                .await
                .unwrap();
            assert_eq!(out.stdout, "ok\n");
        }
    }

    #[tokio::test]
    async fn a_dead_sandbox_under_the_same_name_is_replaced() {
        let w = world().await;
        let first = w
            .provider
            .create_sandbox(&spec("dead", 0, None))
            .await
            .unwrap();
        w.fake.expire_session(&first.id).await.unwrap();
        assert_eq!(w.provider.probe_sandbox(&first.id).await.unwrap(), None);
        let second = w
            .provider
            .create_sandbox(&spec("dead", 0, None))
            .await
            .unwrap();
        assert_ne!(first.id, second.id);
        assert!(w
            .provider
            .probe_sandbox(&second.id)
            .await
            .unwrap()
            .is_some());
    }

    #[tokio::test]
    async fn a_name_owned_by_another_installation_is_not_adopted() {
        let w = world().await;
        w.provider
            .create_sandbox(&spec("shared", 0, None))
            .await
            .unwrap();
        let mut other = spec("shared", 0, None);
        other.installation_id = "inst_b".into();
        let err = w.provider.create_sandbox(&other).await.unwrap_err();
        assert_eq!(err.kind, FailureKind::Permanent);
        assert!(
            err.message.contains("another taskbox installation"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn each_error_class_from_the_fake() {
        let w = world_with(|o| o.snapshot_settle_ms = 60_000).await;
        let p = &w.provider;
        let sb = p.create_sandbox(&spec("errs", 0, None)).await.unwrap();

        // 429 with Retry-After.
        w.fake
            .set_faults(Faults {
                rate_limit: Some(RateLimitBurst {
                    count: 1,
                    retry_after_s: 7,
                    endpoint: Some("get_session".into()),
                }),
                ..Faults::default()
            })
            .unwrap();
        let err = p.probe_sandbox(&sb.id).await.unwrap_err();
        assert_eq!(
            err.kind,
            FailureKind::Transient {
                retry_after_ms: Some(7000)
            },
            "{err}"
        );
        assert!(
            p.probe_sandbox(&sb.id).await.unwrap().is_some(),
            "the burst is over"
        );

        // 5xx.
        w.fake
            .set_faults(Faults {
                error_rate: BTreeMap::from([("extend_timeout".to_string(), 1.0)]),
                error_status: 503,
                ..Faults::default()
            })
            .unwrap();
        let err = p.extend_timeout(&sb.id, 10_000).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        w.fake.set_faults(Faults::default()).unwrap();

        // Wrong token: 403 → Auth, with the fix and without the token.
        let intruder = provider_for(&w.fake, "tok_wrong_guess");
        let err = intruder.probe_sandbox(&sb.id).await.unwrap_err();
        assert_eq!(err.kind, FailureKind::Auth, "{err}");
        assert!(!err.to_string().contains("tok_wrong_guess"));

        // 422 while a snapshot settles, then 410 once stopped.
        let snap = p.snapshot("errs", &sb.id, 1).await.unwrap();
        let err = p.exec(&sb.id, &run("true", 5_000)).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(err.message.contains("sandbox_snapshotting"), "{err}");

        let sb2 = p
            .create_sandbox(&spec("errs", 1, Some(&snap.id)))
            .await
            .unwrap();
        p.stop_sandbox(&sb2.id).await.unwrap();
        let err = p.exec(&sb2.id, &run("true", 5_000)).await.unwrap_err();
        assert_eq!(err.kind, FailureKind::SandboxGone, "{err}");

        // 410 snapshot_not_found on restore from an expired snapshot.
        w.fake.expire_snapshot(&snap.id).await.unwrap();
        let err = p
            .create_sandbox(&spec("errs", 2, Some(&snap.id)))
            .await
            .unwrap_err();
        assert_eq!(err.kind, FailureKind::SnapshotGone, "{err}");
        // Deleting a gone snapshot succeeds.
        p.delete_snapshot(&snap.id).await.unwrap();

        // An unknown session is gone, not an error.
        assert_eq!(p.probe_sandbox("sess_does_not_exist").await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_stream_cut_mid_command_still_gets_exit_code_and_output() {
        for mode in [CutMode::Abort, CutMode::ErrorRecord] {
            let w = world().await;
            let sb = w
                .provider
                .create_sandbox(&spec("cut", 0, None))
                .await
                .unwrap();
            w.fake
                .set_faults(Faults {
                    cut_streams: Some(StreamCut {
                        after_ms: 300,
                        mode,
                    }),
                    ..Faults::default()
                })
                .unwrap();
            let out = w
                .provider
                .exec(
                    &sb.id,
                    &run(
                        "echo before; echo e1 >&2; sleep 1; echo after; exit 7",
                        20_000,
                    ),
                )
                .await
                .unwrap();
            assert_eq!((out.exit_code, out.timed_out), (7, false), "{mode:?}");
            assert_eq!(out.stdout, "before\nafter\n", "{mode:?}");
            assert_eq!(out.stderr, "e1\n", "{mode:?}");
            let stats = w.fake.stats();
            assert!(stats.injected.cut_streams >= 1, "{stats:?}");
            assert!(stats.requests_to(Endpoint::GetCommand) >= 1, "{stats:?}");
            assert_eq!(
                stats.requests_to(Endpoint::RunCommand),
                1,
                "never re-run: {stats:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_timeout_kills_the_command_but_the_sandbox_keeps_working() {
        let w = world().await;
        let p = &w.provider;
        let sb = p.create_sandbox(&spec("slow", 0, None)).await.unwrap();
        let out = p
            .exec(&sb.id, &run("echo started; sleep 30; echo never", 700))
            .await
            .unwrap();
        assert_eq!((out.exit_code, out.timed_out), (124, true));
        assert_eq!(out.stdout, "started\n");
        assert!(
            out.duration_ms >= 700 && out.duration_ms < 10_000,
            "{}",
            out.duration_ms
        );
        let stats = w.fake.stats();
        assert_eq!(stats.requests_to(Endpoint::KillCommand), 1, "{stats:?}");
        assert_eq!(
            stats.requests_to(Endpoint::StopSession),
            0,
            "the sandbox is not stopped"
        );
        assert!(p.probe_sandbox(&sb.id).await.unwrap().is_some());
        let out = p.exec(&sb.id, &run("echo alive", 10_000)).await.unwrap();
        assert_eq!((out.exit_code, out.stdout.as_str()), (0, "alive\n"));
    }

    #[tokio::test]
    async fn a_snapshot_whose_answer_was_lost_is_found_again_after_a_restart() {
        let w = world().await;
        let sb = w
            .provider
            .create_sandbox(&spec("snap", 0, None))
            .await
            .unwrap();
        w.provider
            .exec(&sb.id, &run("echo data > keep.txt", 10_000))
            .await
            .unwrap();
        // The snapshot was taken but taskbox never saw the answer (crash, lost response)...
        let taken = w
            .provider
            .client()
            .create_snapshot(&sb.id, None)
            .await
            .unwrap();
        // ...and a new process (no memory of names) asks again for the same snapshot.
        let restarted = provider_for(&w.fake, SECRET_TOKEN);
        let info = restarted.snapshot("snap", &sb.id, 1).await.unwrap();
        assert_eq!(info.id, taken.snapshot.id);
        assert_eq!(w.fake.stats().requests_to(Endpoint::CreateSnapshot), 1);
    }

    #[tokio::test]
    async fn long_output_is_bounded() {
        let w = world().await;
        let sb = w
            .provider
            .create_sandbox(&spec("big", 0, None))
            .await
            .unwrap();
        let out = w
            .provider
            .exec(
                &sb.id,
                &run("head -c 120000 /dev/zero | tr '\\0' x; printf END", 20_000),
            )
            .await
            .unwrap();
        assert_eq!(out.exit_code, 0);
        assert!(out.stdout.chars().count() < 50_200, "{}", out.stdout.len());
        assert!(out.stdout.ends_with("xEND"));
        assert!(out.stdout.contains("characters omitted"));
    }

    #[tokio::test]
    async fn doctor_reaches_the_api_or_says_why_not() {
        let w = world().await;
        let check = doctor::reachability(w.provider.client()).await;
        assert!(check.ok, "{check:?}");
        assert!(
            check.detail.contains("team team_t, project prj_t"),
            "{}",
            check.detail
        );
        let intruder = provider_for(&w.fake, "tok_wrong_guess");
        let check = doctor::reachability(intruder.client()).await;
        assert!(!check.ok);
        assert!(check.hint.is_some());
        assert!(!format!("{check:?}").contains("tok_wrong_guess"));
    }

    /// Waits (bounded) until the fake has seen `n` requests to `endpoint`.
    async fn until_requests(fake: &FakeServer, endpoint: Endpoint, n: u64) {
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while fake.stats().requests_to(endpoint) < n {
            assert!(
                std::time::Instant::now() < give_up,
                "no {endpoint:?} request came"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_sandbox_that_expires_under_a_command_is_gone() {
        let w = world().await;
        let sb = w
            .provider
            .create_sandbox(&spec("expiry", 0, None))
            .await
            .unwrap();
        let req = run("echo working; sleep 30", 20_000);
        let (result, ()) = tokio::join!(w.provider.exec(&sb.id, &req), async {
            until_requests(&w.fake, Endpoint::RunCommand, 1).await;
            w.fake.expire_session(&sb.id).await.unwrap();
        });
        let err = result.unwrap_err();
        assert_eq!(err.kind, FailureKind::SandboxGone, "{err}");
        assert_eq!(w.provider.probe_sandbox(&sb.id).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_pending_session_is_polled_until_running() {
        let w = world_with(|o| o.boot_delay_ms = 300).await;
        let sb = w
            .provider
            .create_sandbox(&spec("boot", 0, None))
            .await
            .unwrap();
        assert!(w.fake.stats().requests_to(Endpoint::GetSession) >= 1);
        let out = w
            .provider
            .exec(&sb.id, &run("echo up", 10_000))
            .await
            .unwrap();
        assert_eq!(out.stdout, "up\n");
    }
}
