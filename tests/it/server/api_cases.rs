//! The cases schemathesis found against `docs/openapi.yaml` (`tests/it/api_fuzz.rs`), kept as
//! plain requests over the real Unix socket of a real server: each was a server answer the
//! spec does not allow, and is fixed.

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::Value;

use super::ServerHome;
use crate::support::ok;

/// One `METHOD path` exchange with a JSON `body` over the data dir's socket: status and body.
fn exchange(h: &ServerHome, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s =
        std::os::unix::net::UnixStream::connect(h.data().join("taskbox.sock")).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return (code, body.to_string());
    }
    // A streamed answer (NDJSON): its chunks' data, in order.
    let mut rest = body;
    let mut data = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
        if size == 0 {
            break;
        }
        data.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
    (code, data)
}

/// A body that is JSON but not an object was taken as the request's fields in order — serde's
/// derived structs read an array too: `POST /v1/gc` with `[]` ran a gc, `["echo hi"]` ran a
/// command (schemathesis's negative_data_rejection, `-d '[]'`). Every body is an object now,
/// else 400 `bad_request` saying what it was.
#[test]
fn a_body_that_is_not_a_json_object_is_a_400() {
    let h = ServerHome::new();
    ok(&h.home.run(&["run", "-t", "cases", "--", "true"]));
    h.wait_for_server();
    for (path, body) in [
        ("/v1/gc", "[]"),
        ("/v1/gc", "[true]"),
        ("/v1/tasks/cases/run", r#"["echo ran > ran.txt"]"#),
        ("/v1/tasks/cases/run", r#""echo ran > ran.txt""#),
        ("/v1/tasks/cases/fork", r#"["child"]"#),
        ("/v1/tasks/cases/remove", "[true]"),
        ("/v1/tasks/cases/remove", "7"),
        ("/v1/runs/r1/cancel", r#"["INT"]"#),
    ] {
        let (code, answer) = exchange(&h, "POST", path, body);
        assert_eq!(code, 400, "{path} {body}: {answer}");
        let v: Value = serde_json::from_str(&answer).expect("a JSON error");
        assert_eq!(v["code"], "bad_request", "{path} {body}: {v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap_or("")
                .contains("not a JSON object"),
            "{path} {body}: {v}"
        );
    }
    // Nothing of them ran: no command, no removal.
    let o = ok(&h
        .home
        .run(&["run", "-t", "cases", "--", "ls ran.txt 2>&1 || echo none"]));
    assert!(o.contains("none"), "{o}");
    // An object still works, and an empty body is still the defaults.
    let (code, answer) = exchange(&h, "POST", "/v1/gc", r#"{"dry_run": true}"#);
    assert_eq!(code, 200, "{answer}");
    let (code, answer) = exchange(&h, "POST", "/v1/gc", "");
    assert_eq!(code, 200, "{answer}");
    ok(&h.home.run(&["serve", "--stop"]));
}

/// `"timeout_secs": null` in a run request is the default timeout (the spec said integer; the
/// server took null as absent — the spec now says so), as `"snapshot": null` in a fork is the
/// latest snapshot.
#[test]
fn a_null_timeout_is_the_default_and_a_null_snapshot_the_latest() {
    let h = ServerHome::new();
    ok(&h
        .home
        .run(&["run", "-t", "nulls", "--", "echo kept > f.txt"]));
    h.wait_for_server();
    let (code, answer) = exchange(
        &h,
        "POST",
        "/v1/tasks/nulls/run",
        r#"{"command": "cat f.txt", "timeout_secs": null}"#,
    );
    assert_eq!(code, 200, "{answer}");
    let last: Value = serde_json::from_str(answer.lines().last().expect("a result line"))
        .expect("an NDJSON line");
    assert_eq!(last["type"], "result", "{answer}");
    assert_eq!(last["stdout"], "kept\n", "{answer}");
    let (code, answer) = exchange(
        &h,
        "POST",
        "/v1/tasks/nulls/fork",
        r#"{"child": "nulls-child", "snapshot": null}"#,
    );
    assert_eq!(code, 200, "{answer}");
    let v: Value = serde_json::from_str(&answer).expect("JSON");
    assert_eq!(v["task"], "nulls-child", "{v}");
    ok(&h.home.run(&["serve", "--stop"]));
}
