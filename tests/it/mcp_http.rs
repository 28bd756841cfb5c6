//! `taskbox mcp --http` against slow clients (issue 32): it served with `axum::serve`, which
//! has no deadline for a request's head and no connection cap, so half-sent requests stayed
//! open for as long as their senders liked. It now runs on the server's own accept loop: a
//! real client is answered while 200 half-sent requests hang, and those are closed by the head
//! timeout (10 s). The real binary, a real TCP port.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::support::Home;

const TOKEN: &str = "mcp-tok-3f9a1c7e5b2d4a6c";

/// `taskbox mcp --http 127.0.0.1:0` with a token file; the child and its address.
fn serve_mcp(home: &Home) -> (Child, String) {
    let token_file = home.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let mut child = home
        .cmd()
        .args(["mcp", "--http", "127.0.0.1:0", "--token-file"])
        .arg(&token_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn taskbox mcp");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("taskbox mcp says where it serves")
            .expect("read stderr");
        if let Some(rest) = line.split("at http://").nth(1) {
            break rest.split('/').next().expect("an address").to_string();
        }
    };
    // Keep reading its stderr so that it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, addr)
}

/// An MCP `initialize` with the token: the status line of the answer.
fn initialize(addr: &str) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"it","version":"0"}}}"#;
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut head = String::new();
    BufReader::new(s).read_line(&mut head).expect("an answer");
    head.trim().to_string()
}

#[test]
fn half_sent_requests_neither_hold_mcp_http_nor_keep_a_client_waiting() {
    let home = Home::new();
    let (mut child, addr) = serve_mcp(&home);
    let started = Instant::now();
    let mut open = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(&addr).expect("connect");
        s.write_all(b"POST /mcp HTTP/1.1\r\nHost: x\r\n")
            .expect("write half a request");
        open.push(s);
    }
    // A real client is answered while they hang.
    let t = Instant::now();
    let status = initialize(&addr);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "initialize took {:?}",
        t.elapsed()
    );
    // Every half-sent request is closed by the head timeout (10 s); `axum::serve` held them.
    for s in &mut open {
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
    }
    let all_closed = started.elapsed();
    assert!(
        all_closed < Duration::from_secs(40),
        "the half-sent requests were closed only after {all_closed:?}"
    );
    // And it still serves.
    let status = initialize(&addr);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let _ = child.kill();
    let _ = child.wait();
}
