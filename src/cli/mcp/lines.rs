//! The lines between an MCP client and rmcp on stdio. rmcp ignores a line that is not JSON and
//! drops a line over its limit, silently both (on purpose: the other SDKs do so too), which
//! leaves a client waiting for an answer that never comes (issue 32 item 14). JSON-RPC 2.0 has
//! an answer for both, so this layer gives it: every line the client sends is read here with a
//! bound, a line that is not JSON is answered `-32700` (parse error, `id` null), a line over
//! [`MAX_LINE`] is answered `-32600` (with the request's `id` when its start names one), and
//! every other line goes on to rmcp unchanged. rmcp's own lines and these answers reach stdout
//! through one writer, a whole line at a time, so they never interleave.

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::mpsc;

/// The most one line (one JSON-RPC message) may take: rmcp's own limit.
pub(super) const MAX_LINE: usize = 16 * 1024 * 1024;

/// How much of an oversized line's start is kept to find its `id`.
const ID_PREFIX: usize = 4096;

/// The duplex pipes buffer this much between this layer and rmcp.
const PIPE: usize = 64 * 1024;

/// The tasks that carry the stdio session's lines between the client and rmcp.
pub(super) struct Guarded {
    reader: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
}

impl Guarded {
    /// Puts the layer between `input`/`output` (the process's stdin and stdout) and rmcp; the
    /// streams rmcp reads (the client's lines that are JSON) and writes (passed on to stdout a
    /// whole line at a time).
    pub(super) fn new<R, W>(input: R, output: W) -> (Guarded, (DuplexStream, DuplexStream))
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (read, to_rmcp) = tokio::io::duplex(PIPE);
        let (from_rmcp, write) = tokio::io::duplex(PIPE);
        let (lines, rx) = mpsc::channel::<Vec<u8>>(64);
        let reader = tokio::spawn(read_client(input, to_rmcp, lines.clone()));
        let writer = tokio::spawn(async move {
            let forward = tokio::spawn(forward_rmcp(from_rmcp, lines));
            write_client(output, rx).await;
            forward.abort();
        });
        (Guarded { reader, writer }, (read, write))
    }

    /// Once rmcp is done (its streams dropped): stops reading the client and lets every line
    /// already answered reach stdout (bounded, should stdout not be read).
    pub(super) async fn finish(self) {
        self.reader.abort();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), self.writer).await;
    }
}

/// Reads the client's lines with a bound; see the module's doc.
async fn read_client<R: AsyncRead + Unpin>(
    input: R,
    mut to_rmcp: DuplexStream,
    answers: mpsc::Sender<Vec<u8>>,
) {
    let mut input = BufReader::new(input);
    let mut line = Vec::new();
    // Set while an oversized line is skipped: the start of it, to find its id.
    let mut oversized: Option<Vec<u8>> = None;
    loop {
        let buf = match input.fill_buf().await {
            Ok([]) | Err(_) => return,
            Ok(buf) => buf,
        };
        let (take, ends) = match buf.iter().position(|b| *b == b'\n') {
            Some(at) => (at + 1, true),
            None => (buf.len(), false),
        };
        let chunk = &buf[..take];
        match &mut oversized {
            Some(start) => {
                let room = ID_PREFIX.saturating_sub(start.len()).min(chunk.len());
                start.extend_from_slice(&chunk[..room]);
            }
            None if line.len() + chunk.len() > MAX_LINE => {
                let mut start = std::mem::take(&mut line);
                start.truncate(ID_PREFIX);
                let room = ID_PREFIX.saturating_sub(start.len()).min(chunk.len());
                start.extend_from_slice(&chunk[..room]);
                oversized = Some(start);
            }
            None => line.extend_from_slice(chunk),
        }
        input.consume(take);
        if !ends {
            continue;
        }
        if let Some(start) = oversized.take() {
            let answer = error(
                request_id(&start),
                -32600,
                &format!(
                    "Invalid Request: the message is over taskbox mcp's limit of {} MiB a line; it was not read",
                    MAX_LINE / (1024 * 1024)
                ),
            );
            if answers.send(answer).await.is_err() {
                return;
            }
            continue;
        }
        let text = trim_line(&line);
        if !text.is_empty() {
            if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(text) {
                let answer = error(
                    serde_json::Value::Null,
                    -32700,
                    &format!("Parse error: the line is not JSON ({e})"),
                );
                if answers.send(answer).await.is_err() {
                    return;
                }
                line.clear();
                continue;
            }
            if to_rmcp.write_all(&line).await.is_err() {
                return;
            }
        }
        line.clear();
    }
}

/// rmcp's output, a whole line at a time, to the writer.
async fn forward_rmcp(from_rmcp: DuplexStream, lines: mpsc::Sender<Vec<u8>>) {
    let mut from_rmcp = BufReader::new(from_rmcp);
    loop {
        let mut line = Vec::new();
        match from_rmcp.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if lines.send(line).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Writes each line to stdout, flushed, until every sender is gone.
async fn write_client<W: AsyncWrite + Unpin>(mut output: W, mut lines: mpsc::Receiver<Vec<u8>>) {
    while let Some(line) = lines.recv().await {
        if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
            return;
        }
    }
}

/// A line without its `\n` or `\r\n`, and blank-trimmed.
fn trim_line(line: &[u8]) -> &[u8] {
    line.trim_ascii()
}

/// The `id` a message's start names (`"id": 7` or `"id": "x"`), or null.
fn request_id(start: &[u8]) -> serde_json::Value {
    let Some(at) = start.windows(4).position(|w| w == b"\"id\"") else {
        return serde_json::Value::Null;
    };
    let rest = start[at + 4..].trim_ascii_start();
    let Some(rest) = rest.strip_prefix(b":") else {
        return serde_json::Value::Null;
    };
    let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<serde_json::Value>();
    match values.next() {
        Some(Ok(v @ (serde_json::Value::Number(_) | serde_json::Value::String(_)))) => v,
        _ => serde_json::Value::Null,
    }
}

/// A JSON-RPC 2.0 error response line.
fn error(id: serde_json::Value, code: i64, message: &str) -> Vec<u8> {
    let mut line = serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message},
    }))
    .expect("a JSON value serializes");
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::request_id;
    use serde_json::json;

    #[test]
    fn an_oversized_requests_id_is_read_from_its_start() {
        assert_eq!(
            request_id(br#"{"jsonrpc":"2.0","id":7,"method":"x","params":{"#),
            json!(7)
        );
        assert_eq!(request_id(br#"{"id" : "a-1", "params": "#), json!("a-1"));
        assert_eq!(request_id(br#"{"method":"x","params":{"aaaa"#), json!(null));
        assert_eq!(request_id(br#"{"id": {"no": 1}}"#), json!(null));
    }
}
