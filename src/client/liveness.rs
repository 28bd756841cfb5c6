//! Whether a server that has not answered yet is alive: its process stopped (`/proc`), or a
//! health probe on a second connection unanswered ([`Client::answered`]).

use std::path::Path;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

use super::wire::API_PREFIX;
use super::{AbortOnDrop, Client, ClientError};

impl Client {
    /// Waits for `answer` (a request's answer head) as long as the server is alive: each
    /// [`answer_wait`] without it, the server is looked at — its process stopped, or a health
    /// probe on a second connection unanswered within the same bound, is
    /// [`ClientError::NoAnswer`]. A slow answer of a live server (a suspend snapshotting
    /// gigabytes) is waited for.
    pub(super) async fn answered<F: std::future::Future>(
        &self,
        answer: F,
    ) -> Result<F::Output, ClientError> {
        tokio::pin!(answer);
        let mut waited = std::time::Duration::ZERO;
        loop {
            match tokio::time::timeout(self.answer_wait, &mut answer).await {
                Ok(out) => return Ok(out),
                Err(_) => waited += self.answer_wait,
            }
            // A remote server's process is not this machine's to look at: only the probe.
            let pid = match self.remote {
                Some(_) => None,
                None => server_pid(&self.data_dir),
            };
            let stopped = pid.is_some_and(process_stopped);
            let alive = !stopped
                && tokio::time::timeout(self.answer_wait, self.probe())
                    .await
                    .unwrap_or(false);
            if !alive {
                return Err(ClientError::NoAnswer {
                    data_dir: self.data_dir.clone(),
                    pid,
                    stopped,
                    waited_secs: waited.as_secs(),
                });
            }
        }
    }

    /// Whether `GET /v1/health` answers on a connection of its own.
    async fn probe(&self) -> bool {
        let probe = async {
            let stream = self.connect().await.ok()?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .ok()?;
            let driver = AbortOnDrop(tokio::spawn(conn));
            let req = Request::builder()
                .method(Method::GET)
                .uri(format!("{API_PREFIX}/health"))
                .header(hyper::header::HOST, "taskbox")
                .body(Full::new(Bytes::new()))
                .ok()?;
            let resp = sender.send_request(req).await.ok()?;
            drop(driver);
            Some(resp.status() == StatusCode::OK)
        };
        probe.await.unwrap_or(false)
    }
}

/// How long the CLI waits for a server's answer before it looks whether the server is alive:
/// `TASKBOX_ANSWER_WAIT` seconds (at least 1), else 20 s.
pub fn answer_wait() -> std::time::Duration {
    let secs = std::env::var("TASKBOX_ANSWER_WAIT")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(20);
    std::time::Duration::from_secs(secs)
}

/// The pid of the server of `data_dir`, as it wrote itself into its serve lock.
pub fn server_pid(data_dir: &Path) -> Option<u32> {
    std::fs::read_to_string(data_dir.join("serve.lock"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether the process `pid` is stopped (`T`, by SIGSTOP or a debugger: `t`), from
/// `/proc/PID/stat`; false when it cannot be read.
pub fn process_stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command's name, which is in parentheses and may hold any byte.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .is_some_and(|state| state == 'T' || state == 't')
}
