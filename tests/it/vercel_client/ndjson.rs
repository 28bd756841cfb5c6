//! Streamed command output: NDJSON records split across chunks and inside UTF-8 characters,
//! blank lines, unknown records and a missing final newline.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use taskbox::clock::SystemClock;
use taskbox::provider::vercel::auth::Credentials;
use taskbox::provider::vercel::client::VercelClient;

use super::{Canned, SECRET_TOKEN};

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
