//! Session endpoints: get a session, wait for it to run, stop it and extend its timeout.

use std::time::Duration;

use reqwest::Method;

use super::{
    VercelClient, BLOCKING_CALL_TIMEOUT, CALL_TIMEOUT, EXTEND_TIMEOUT, GET_SESSION, STOP_SESSION,
};
use crate::provider::vercel::wire::{Session, SessionBody, SessionStatus, StopAnswer};
use crate::provider::ProviderError;

impl VercelClient {
    /// `GET /v2/sandboxes/sessions/{id}`.
    pub async fn get_session(&self, session_id: &str) -> Result<Session, ProviderError> {
        let rb = self
            .request(Method::GET, &["v2", "sandboxes", "sessions", session_id])
            .timeout(CALL_TIMEOUT);
        let body: SessionBody = self.json(GET_SESSION, rb).await?;
        Ok(body.session)
    }

    /// Polls the session until it runs (a create may answer `pending`). A session that ends in
    /// a terminal state, or is still pending after `max_wait`, is a transient failure: the
    /// engine's next create finds the named sandbox and replaces its dead session.
    pub async fn wait_until_running(
        &self,
        session: Session,
        max_wait: Duration,
    ) -> Result<Session, ProviderError> {
        let give_up = tokio::time::Instant::now() + max_wait;
        let mut delay = Duration::from_millis(50);
        let mut session = session;
        loop {
            match session.status {
                SessionStatus::Running => return Ok(session),
                s if s.is_terminal() => {
                    return Err(ProviderError::transient(
                        "start session",
                        format!("session {} ended as {s:?} while starting", session.id),
                        None,
                    ))
                }
                _ => {}
            }
            if tokio::time::Instant::now() + delay > give_up {
                return Err(ProviderError::transient(
                    "start session",
                    format!(
                        "session {} still {:?} after {} s",
                        session.id,
                        session.status,
                        max_wait.as_secs()
                    ),
                    None,
                ));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
            session = self.get_session(&session.id).await?;
        }
    }

    /// Reads the session until it has ended (stopped, failed or aborted), for what it used: a
    /// session found past its deadline may still be running or stopping for a moment, and its
    /// figures (stop time, active CPU) are final only once it has stopped. After `max_wait`,
    /// the session as last read (its figures so far).
    pub async fn wait_until_ended(
        &self,
        session_id: &str,
        max_wait: Duration,
    ) -> Result<Session, ProviderError> {
        let give_up = tokio::time::Instant::now() + max_wait;
        let mut delay = Duration::from_millis(50);
        loop {
            let session = self.get_session(session_id).await?;
            if session.status.is_terminal() || tokio::time::Instant::now() + delay > give_up {
                return Ok(session);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    /// `POST …/stop` (blocks until stopped); a persistent sandbox's answer names the snapshot
    /// the platform took of it.
    pub async fn stop_session(&self, session_id: &str) -> Result<StopAnswer, ProviderError> {
        let rb = self
            .request(
                Method::POST,
                &["v2", "sandboxes", "sessions", session_id, "stop"],
            )
            .timeout(BLOCKING_CALL_TIMEOUT)
            .body("{}");
        self.json(STOP_SESSION, rb).await
    }

    /// `POST …/extend-timeout` by `duration_ms` (≥ 1000).
    pub async fn extend_timeout(
        &self,
        session_id: &str,
        duration_ms: u64,
    ) -> Result<Session, ProviderError> {
        let rb = self
            .request(
                Method::POST,
                &["v2", "sandboxes", "sessions", session_id, "extend-timeout"],
            )
            .timeout(CALL_TIMEOUT);
        let rb = Self::body(rb, &serde_json::json!({"duration": duration_ms.max(1000)}));
        let body: SessionBody = self.json(EXTEND_TIMEOUT, rb).await?;
        Ok(body.session)
    }
}
