//! File endpoints: write (a gzipped tar upload), read and make a directory.

use reqwest::header::CONTENT_TYPE;
use reqwest::Method;

use super::{VercelClient, BLOCKING_CALL_TIMEOUT, CALL_TIMEOUT, MKDIR, READ_FILE, WRITE_FILES};
use crate::core::FailureKind;
use crate::provider::ProviderError;

impl VercelClient {
    /// `POST …/fs/write`: writes `files` (absolute paths → contents) as one gzipped tar
    /// extracted at `/`; parent directories are created.
    pub async fn write_files(
        &self,
        session_id: &str,
        files: &[(&str, &[u8])],
    ) -> Result<(), ProviderError> {
        let archive = tar_gz(files).map_err(|e| {
            ProviderError::new(
                FailureKind::Invalid,
                "write files",
                format!("cannot build the upload archive: {e}"),
            )
        })?;
        let rb = self
            .request(
                Method::POST,
                &["v2", "sandboxes", "sessions", session_id, "fs", "write"],
            )
            .header(CONTENT_TYPE, "application/gzip")
            .header("x-cwd", "/")
            .timeout(BLOCKING_CALL_TIMEOUT)
            .body(archive);
        self.send(WRITE_FILES, rb).await?;
        Ok(())
    }

    /// `POST …/fs/read`: the file's bytes, or `None` when it does not exist (404).
    pub async fn read_file(
        &self,
        session_id: &str,
        path: &str,
    ) -> Result<Option<Vec<u8>>, ProviderError> {
        let rb = self
            .request(
                Method::POST,
                &["v2", "sandboxes", "sessions", session_id, "fs", "read"],
            )
            .timeout(BLOCKING_CALL_TIMEOUT);
        let rb = Self::body(rb, &serde_json::json!({"path": path}));
        let Some(response) = self.send_or_404(READ_FILE, rb, true).await? else {
            return Ok(None);
        };
        self.read_body(READ_FILE, response).await.map(Some)
    }

    /// `POST …/fs/mkdir` (recursive, sent explicitly since sources disagree on the default).
    pub async fn mkdir(&self, session_id: &str, path: &str) -> Result<(), ProviderError> {
        let rb = self
            .request(
                Method::POST,
                &["v2", "sandboxes", "sessions", session_id, "fs", "mkdir"],
            )
            .timeout(CALL_TIMEOUT);
        let rb = Self::body(rb, &serde_json::json!({"path": path, "recursive": true}));
        self.send(MKDIR, rb).await?;
        Ok(())
    }
}

/// A gzipped tar of `files` with names relative to `/` (the upload's `x-cwd`).
fn tar_gz(files: &[(&str, &[u8])]) -> std::io::Result<Vec<u8>> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (path, content) in files {
        let name = path.trim_start_matches('/');
        if name.is_empty() || name.split('/').any(|c| c == "..") {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("`{path}` is not a file path inside the sandbox"),
            ));
        }
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, name, *content)?;
    }
    tar.into_inner()?.finish()
}
