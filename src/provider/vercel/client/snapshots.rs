//! Snapshot endpoints: create (which stops the session), get, delete and list.

use reqwest::Method;

use super::{
    VercelClient, BLOCKING_CALL_TIMEOUT, CALL_TIMEOUT, CREATE_SNAPSHOT, DELETE_SNAPSHOT,
    GET_SNAPSHOT, LIST_SNAPSHOTS, MAX_PAGE,
};
use crate::provider::vercel::wire::{
    Page, Snapshot, SnapshotAndSession, SnapshotBody, SnapshotsPage,
};
use crate::provider::ProviderError;

impl VercelClient {
    /// `POST …/snapshot` (201): snapshots the filesystem; **the session stops**.
    /// `expiration_ms`: `None` for the platform default, `Some(0)` for never.
    pub async fn create_snapshot(
        &self,
        session_id: &str,
        expiration_ms: Option<u64>,
    ) -> Result<SnapshotAndSession, ProviderError> {
        let rb = self
            .request(
                Method::POST,
                &["v2", "sandboxes", "sessions", session_id, "snapshot"],
            )
            .timeout(BLOCKING_CALL_TIMEOUT);
        let body = match expiration_ms {
            Some(ms) => serde_json::json!({"expiration": ms}),
            None => serde_json::json!({}),
        };
        self.json(CREATE_SNAPSHOT, Self::body(rb, &body)).await
    }

    /// `GET /v2/sandboxes/snapshots/{id}`.
    pub async fn get_snapshot(&self, snapshot_id: &str) -> Result<Snapshot, ProviderError> {
        let rb = self
            .request(Method::GET, &["v2", "sandboxes", "snapshots", snapshot_id])
            .timeout(CALL_TIMEOUT);
        let body: SnapshotBody = self.json(GET_SNAPSHOT, rb).await?;
        Ok(body.snapshot)
    }

    /// `DELETE /v2/sandboxes/snapshots/{id}`.
    pub async fn delete_snapshot(&self, snapshot_id: &str) -> Result<Snapshot, ProviderError> {
        let rb = self
            .request(
                Method::DELETE,
                &["v2", "sandboxes", "snapshots", snapshot_id],
            )
            .timeout(CALL_TIMEOUT);
        let body: SnapshotBody = self.json(DELETE_SNAPSHOT, rb).await?;
        Ok(body.snapshot)
    }

    /// One page of `GET /v2/sandboxes/snapshots`, optionally of one sandbox (by name).
    pub async fn list_snapshots(
        &self,
        sandbox_name: Option<&str>,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<Snapshot>, ProviderError> {
        let mut query: Vec<(&str, String)> = vec![
            ("project", self.creds.project_id().to_string()),
            ("limit", limit.clamp(1, MAX_PAGE).to_string()),
        ];
        if let Some(n) = sandbox_name {
            query.push(("name", n.to_string()));
        }
        if let Some(c) = cursor {
            query.push(("cursor", c.to_string()));
        }
        let rb = self
            .request(Method::GET, &["v2", "sandboxes", "snapshots"])
            .query(&query)
            .timeout(CALL_TIMEOUT);
        let page: SnapshotsPage = self.json(LIST_SNAPSHOTS, rb).await?;
        Ok(Page {
            next: page.pagination.and_then(|p| p.cursor()),
            items: page.snapshots,
        })
    }

    /// Every snapshot of the sandbox named `sandbox_name` (all pages).
    pub async fn list_all_snapshots(
        &self,
        sandbox_name: &str,
    ) -> Result<Vec<Snapshot>, ProviderError> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = self
                .list_snapshots(Some(sandbox_name), MAX_PAGE, cursor.as_deref())
                .await?;
            all.extend(page.items);
            match page.next {
                Some(next) if Some(&next) != cursor.as_ref() => cursor = Some(next),
                _ => return Ok(all),
            }
        }
    }
}
