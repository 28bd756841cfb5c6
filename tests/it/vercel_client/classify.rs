//! Classification: how each HTTP status, error code and transport failure becomes a
//! `FailureKind`, and what the message tells the user.

use taskbox::core::FailureKind;
use taskbox::provider::vercel::auth::{AuthMode, OIDC_FIX};
use taskbox::provider::vercel::client::{classify, Call, HttpFailure, Missing, Replay};

use super::err_body;

fn status(code: u16, body: &str, retry_after: Option<&str>) -> HttpFailure {
    HttpFailure::Status {
        status: code,
        retry_after: retry_after.map(str::to_string),
        body: body.as_bytes().to_vec(),
    }
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
