//! Who may talk to a server: the socket is its owner's (0600, and a socket of another user is
//! refused), and TCP needs the bearer token, which never shows up in logs or errors.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use super::ServerHome;
use crate::support::{ok, stderr, stdout};

#[test]
fn the_socket_is_private_and_another_users_socket_is_refused() {
    let h = ServerHome::new();
    ok(&h.home.run(&["run", "-t", "m", "--", "true"]));
    let sock = h.data().join("taskbox.sock");
    let mode = std::fs::metadata(&sock)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    super::kill_server_of(&h.data());

    // A socket file someone else owns: neither the server nor the CLI uses it.
    let path = std::ffi::CString::new(sock.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path; changes only the owner of our own test file.
    let chowned = unsafe { libc::chown(path.as_ptr(), 65534, 65534) } == 0;
    if chowned {
        let o = h.home.run(&["serve"]);
        assert_eq!(o.status.code(), Some(125));
        assert!(
            stderr(&o).contains("belongs to uid 65534"),
            "{}",
            stderr(&o)
        );
        let o = h.home.run(&["run", "-t", "m", "--", "true"]);
        assert_eq!(o.status.code(), Some(125));
        assert!(
            stderr(&o).contains("belongs to uid 65534"),
            "{}",
            stderr(&o)
        );
    } else {
        // Not root: the same check, against a user id that is not ours.
        let me = std::fs::metadata(&sock).map(|m| std::os::unix::fs::MetadataExt::uid(&m));
        let err = taskbox::client::check_owner_is(&sock, me.expect("meta") + 1, 0);
        assert!(err.is_err());
    }
}

/// One HTTP/1.1 exchange over TCP; the status code and the body.
fn http(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    http_auth(addr, method, path, auth.as_deref(), body)
}

/// [`http`] with the whole `Authorization` value.
fn http_auth(
    addr: &str,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    body: &str,
) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let auth = authorization.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
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
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (code, body)
}

#[test]
fn tcp_needs_the_bearer_token_and_never_shows_it() {
    let h = ServerHome::new();
    let token = "tok-3b7f0c9e5a1d4f8b";
    let token_file = h.home.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).expect("token");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");

    // Without a token, no TCP.
    let o = h.home.run(&["serve", "--listen", "127.0.0.1:0"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        stderr(&o).contains("needs a bearer token"),
        "{}",
        stderr(&o)
    );

    let tf = token_file.to_str().expect("utf-8");
    let mut server = h.spawn_serve(&["--listen", "127.0.0.1:0", "--token-file", tf]);
    h.wait_for_server();
    let addr = h.status().expect("status")["tcp"]
        .as_str()
        .expect("tcp address")
        .to_string();
    let run = r#"{"command": "echo hi > f"}"#;
    for bad in [None, Some("wrong"), Some("tok-3b7f0c9e5a1d4f8")] {
        let (code, body) = http(&addr, "POST", "/v1/tasks/x/run", bad, run);
        assert_eq!(code, 401, "{body}");
        assert!(body.contains(r#""code":"unauthorized""#), "{body}");
        assert!(!body.contains(token), "{body}");
    }
    // Nothing was done.
    let o = h.home.run(&["show", "x"]);
    assert_eq!(o.status.code(), Some(125), "{}", stdout(&o));

    let (code, body) = http(&addr, "POST", "/v1/tasks/x/run", Some(token), run);
    assert_eq!(code, 200, "{body}");
    // The NDJSON stream (chunked) ends with the result.
    let result = body
        .lines()
        .find(|l| l.starts_with(r#"{"type":"result""#))
        .unwrap_or_else(|| panic!("no result line in {body}"));
    let v: serde_json::Value = serde_json::from_str(result).expect("JSON");
    assert_eq!(v["exit_code"], 0);
    let (code, body) = http(&addr, "GET", "/v1/tasks/x", Some(token), "");
    assert_eq!(code, 200, "{body}");
    // The scheme's name is case-insensitive.
    let lower = format!("bearer {token}");
    let (code, body) = http_auth(&addr, "GET", "/v1/tasks/x", Some(&lower), "");
    assert_eq!(code, 200, "{body}");

    // Errors are JSON objects with a stable code, also the ones axum answers before a
    // handler runs (issue 32 item 14: 405 with an empty body, a bad query in plain text).
    for (method, path, status, code) in [
        ("GET", "/v1/tasks/x/run", 405, "method_not_allowed"),
        ("DELETE", "/v1/tasks/x", 405, "method_not_allowed"),
        ("GET", "/v1/tasks/x?journal=many", 400, "bad_request"),
    ] {
        let (got, body) = http(&addr, method, path, Some(token), "");
        assert_eq!(got, status, "{method} {path}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {body}"));
        assert_eq!(v["code"], code, "{method} {path}: {body}");
        assert!(!v["message"].as_str().unwrap_or("").is_empty(), "{body}");
    }
    // Errors are JSON objects with a stable code.
    let (code, body) = http(&addr, "POST", "/v1/tasks/..%2Fetc/run", Some(token), run);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains(r#""code":"invalid_task_id""#), "{body}");

    ok(&h.home.run(&["serve", "--stop"]));
    let _ = server.wait();
    let log = h.serve_stderr();
    assert!(log.contains("refused a TCP request"), "{log}");
    assert!(!log.contains(token), "the token leaked into the log: {log}");
}

/// `serve` refuses a token file others may read, a short token, and `--token-file` without
/// `--listen` (issue 32 item 11), each naming the file and the fix, never the token.
#[test]
fn serve_refuses_weak_token_files_and_a_token_without_listen() {
    let h = ServerHome::new();
    let file = h.home.path().join("token");
    let tf = file.to_str().expect("utf-8");
    let token = "0123456789abcdef0123";
    let write = |text: &str, mode: u32| {
        std::fs::write(&file, text).expect("token");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    for (text, mode, says) in [
        (token, 0o644, "mode is 0644"),
        (token, 0o640, "mode is 0640"),
        (token, 0o602, "mode is 0602"),
        ("x", 0o600, "1 characters; at least 16"),
        ("  0123456789abcde \n", 0o600, "15 characters"),
    ] {
        write(text, mode);
        let o = h
            .home
            .run(&["serve", "--listen", "127.0.0.1:0", "--token-file", tf]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(125), "{text:?} {mode:o}: {err}");
        assert!(err.contains("refusing the token file"), "{err}");
        assert!(err.contains(tf), "names the file: {err}");
        assert!(err.contains(says), "{says}: {err}");
        assert!(err.contains("chmod 600"), "gives the fix: {err}");
        assert!(!err.contains(token), "the token leaked: {err}");
    }
    let missing = h.home.path().join("nope");
    let o = h.home.run(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        missing.to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("cannot read it"), "{}", stderr(&o));

    // A token file without --listen guards nothing: refused rather than ignored.
    write(token, 0o600);
    let o = h.home.run(&["serve", "--token-file", tf]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    assert!(stderr(&o).contains("--listen"), "{}", stderr(&o));
    assert!(h.status().is_none(), "no server started");
}
