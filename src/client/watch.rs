//! [`Watch`]: the client's side of `GET /v1/tasks/{task}/watch`, NDJSON lines read as they
//! arrive.

use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::wire::WatchEvent;
use super::{Client, ClientError};

/// A task's transitions as the server sends them; see [`Client::watch`].
pub struct Watch {
    client: Client,
    body: Incoming,
    buf: Vec<u8>,
    driver: tokio::task::JoinHandle<Result<(), hyper::Error>>,
}

impl Watch {
    pub(super) fn new(
        client: Client,
        body: Incoming,
        driver: tokio::task::JoinHandle<Result<(), hyper::Error>>,
    ) -> Watch {
        Watch {
            client,
            body,
            buf: Vec::new(),
            driver,
        }
    }

    /// The next line: `None` once the server has ended the stream (it stopped).
    pub async fn next(&mut self) -> Result<Option<WatchEvent>, ClientError> {
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(&line).map(Some).map_err(|e| {
                    self.client
                        .protocol(format!("sent a watch line that is not JSON: {e}"))
                });
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    return Err(self
                        .client
                        .protocol(format!("cut the watch stream short: {e}")))
                }
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.driver.abort();
    }
}
