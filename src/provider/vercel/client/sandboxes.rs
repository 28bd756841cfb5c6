//! Sandbox endpoints: create, get by name, delete and list named sandboxes.

use reqwest::Method;
use serde_json::Value;

use super::{
    VercelClient, CALL_TIMEOUT, CREATE_SANDBOX, DELETE_SANDBOX, GET_SANDBOX, LIST_SANDBOXES,
    MAX_PAGE,
};
use crate::core::FailureKind;
use crate::provider::vercel::settings::SandboxBase;
use crate::provider::vercel::wire::{
    CreateSandbox, Page, Sandbox, SandboxAndSession, SandboxesPage,
};
use crate::provider::ProviderError;

impl VercelClient {
    /// `POST /v3/sandboxes` with an `image`, or the legacy `POST /v2/sandboxes` with a
    /// `runtime` ([`SandboxBase`]); a create from a snapshot carries neither, on the same
    /// endpoint. Not retried here; [`Self::get_sandbox`] by name finds a sandbox whose create
    /// response was lost.
    pub async fn create_sandbox(
        &self,
        spec: &CreateSandbox,
    ) -> Result<SandboxAndSession, ProviderError> {
        let mut body = serde_json::json!({
            "projectId": self.creds.project_id(),
            "name": spec.name,
            "resources": {"vcpus": spec.vcpus},
            "timeout": spec.timeout_ms,
            "ports": [],
            "env": {},
            "tags": spec.tags,
            "persistent": spec.persistent,
        });
        match (&spec.source_snapshot, &spec.base) {
            (Some(id), _) => {
                body["source"] = serde_json::json!({"type": "snapshot", "snapshotId": id})
            }
            (None, SandboxBase::Image(image)) => body["image"] = Value::String(image.clone()),
            (None, SandboxBase::Runtime(r)) => {
                body["runtime"] = Value::String(r.as_str().to_string())
            }
        }
        let version = match spec.base {
            SandboxBase::Image(_) => "v3",
            SandboxBase::Runtime(_) => "v2",
        };
        let rb = self
            .request(Method::POST, &[version, "sandboxes"])
            .timeout(CALL_TIMEOUT);
        self.json(CREATE_SANDBOX, Self::body(rb, &body)).await
    }

    /// `GET /v2/sandboxes/{name}`; `None` when no sandbox has that name.
    pub async fn get_sandbox(
        &self,
        name: &str,
    ) -> Result<Option<SandboxAndSession>, ProviderError> {
        let rb = self
            .request(Method::GET, &["v2", "sandboxes", name])
            .query(&[("projectId", self.creds.project_id())])
            .timeout(CALL_TIMEOUT);
        match self.send_or_404(GET_SANDBOX, rb, true).await? {
            Some(r) => self.read_json(GET_SANDBOX, r).await.map(Some),
            None => Ok(None),
        }
    }

    /// `DELETE /v2/sandboxes/{name}`; a missing sandbox counts as deleted.
    pub async fn delete_sandbox(&self, name: &str) -> Result<(), ProviderError> {
        let rb = self
            .request(Method::DELETE, &["v2", "sandboxes", name])
            .query(&[("projectId", self.creds.project_id())])
            .timeout(CALL_TIMEOUT);
        match self.send_or_404(DELETE_SANDBOX, rb, true).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind == FailureKind::SandboxGone => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// One page of `GET /v2/sandboxes`, filtered by one tag and/or a name prefix.
    pub async fn list_sandboxes(
        &self,
        tag: Option<(&str, &str)>,
        name_prefix: Option<&str>,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<Sandbox>, ProviderError> {
        let mut query: Vec<(&str, String)> = vec![
            ("project", self.creds.project_id().to_string()),
            ("limit", limit.clamp(1, MAX_PAGE).to_string()),
        ];
        if let Some((k, v)) = tag {
            query.push(("tags", format!("{k}:{v}")));
        }
        if let Some(p) = name_prefix {
            query.push(("namePrefix", p.to_string()));
        }
        if let Some(c) = cursor {
            query.push(("cursor", c.to_string()));
        }
        let rb = self
            .request(Method::GET, &["v2", "sandboxes"])
            .query(&query)
            .timeout(CALL_TIMEOUT);
        let page: SandboxesPage = self.json(LIST_SANDBOXES, rb).await?;
        Ok(Page {
            next: page.pagination.and_then(|p| p.cursor()),
            items: page.sandboxes,
        })
    }

    /// Every sandbox carrying the tag `key:value` (all pages).
    pub async fn list_all_sandboxes(
        &self,
        tag: (&str, &str),
    ) -> Result<Vec<Sandbox>, ProviderError> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = self
                .list_sandboxes(Some(tag), None, MAX_PAGE, cursor.as_deref())
                .await?;
            all.extend(page.items);
            match page.next {
                // A server that repeats a cursor would loop forever; stop instead.
                Some(next) if Some(&next) != cursor.as_ref() => cursor = Some(next),
                _ => return Ok(all),
            }
        }
    }
}
