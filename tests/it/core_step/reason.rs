//! The typed failure reason in replies: its stored form, and journals from before it.

use taskbox::core::{Command, Failure, FailureKind, FailureReason, Reply};

/// A reply as a journal written before reasons were typed holds it (from tests/golden/crash.jsonl).
const OLD_REPLY: &str = r#"{"type":"reply","request_id":2,"reply":{"kind":"failed","error":"interrupted: taskbox restarted while `sleep 3` was running","attempts":1,"notices":[]}}"#;

#[test]
fn an_old_journal_reply_with_a_text_error_still_loads() {
    let cmd: Command = serde_json::from_str(OLD_REPLY).expect("the old form reads");
    let Command::Reply {
        reply: Reply::Failed {
            reason, attempts, ..
        },
        ..
    } = &cmd
    else {
        panic!("a failed reply: {cmd:?}");
    };
    assert_eq!(*attempts, 1);
    assert_eq!(
        reason,
        &FailureReason::Recorded {
            message: "interrupted: taskbox restarted while `sleep 3` was running".into()
        }
    );
    assert_eq!(reason.code(), "failed");
    // The same failure as today's `step` builds it: equal, so the old journal replays.
    assert_eq!(
        reason,
        &FailureReason::InterruptedCommand {
            command: "sleep 3".into()
        }
    );
}

#[test]
fn a_typed_reason_is_stored_with_its_code_and_reads_back_typed() {
    let reply = Reply::Failed {
        reason: FailureReason::CommandFailed {
            command: "make".into(),
            attempts: 6,
            failure: Failure::new(FailureKind::Auth, "401 Unauthorized"),
        },
        attempts: 6,
        notices: Vec::new(),
    };
    let json = serde_json::to_string(&reply).expect("serializes");
    assert!(
        json.contains(r#""reason":{"code":"command_failed","command":"make""#),
        "{json}"
    );
    let back: Reply = serde_json::from_str(&json).expect("reads back");
    let Reply::Failed { reason, .. } = &back else {
        panic!("{back:?}")
    };
    assert!(
        matches!(reason, FailureReason::CommandFailed { .. }),
        "{reason:?}"
    );
    assert_eq!(back, reply);
    assert_eq!(
        reason.to_string(),
        "could not run `make` after 6 attempts: 401 Unauthorized"
    );
    assert!(reason.hint().is_some_and(|h| h.contains("credentials")));
}
