//! Auth: OIDC tokens decoded without verification, access-token variables, `.vercel/project.json`
//! defaults, expiry refused before any request, and no token ever printed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use taskbox::clock::SystemClock;
use taskbox::core::FailureKind;
use taskbox::provider::vercel::auth::{
    decode_oidc_claims, AuthError, AuthMode, AuthReport, Credentials, OIDC_FIX,
};
use taskbox::provider::vercel::client::VercelClient;
use taskbox::provider::vercel::doctor;
use taskbox::provider::vercel::{VercelProvider, VercelSetupError};

use crate::support::ManualClock;

use super::{b64, empty_dir, env_of, jwt, vercel_config, RecordingListener, NOW, SECRET_TOKEN};

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
        while !parts[1].len().is_multiple_of(4) {
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
