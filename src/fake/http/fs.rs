//! File handlers (`fs/write`, `fs/read`, `fs/mkdir`): uploads extracted, files streamed back,
//! directories made, all inside the session's workspace.

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_core::Stream;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

use super::shared::blocking;
use super::{App, UPLOAD_LIMIT};
use crate::fake::conn::channel_body;
use crate::fake::files;
use crate::fake::validate;
use crate::fake::wire::ApiError;

/// `fs/write`: the gzipped tar is extracted as it arrives — the body streams through a small
/// bounded channel into the extractor on the blocking pool — so an upload of any size holds a
/// few chunks in memory, never the whole body. Past [`UPLOAD_LIMIT`] bytes it is refused with a
/// JSON 413 (before reading, when `content-length` says so).
pub(super) async fn write_files(
    State(app): App,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let x_cwd = headers
        .get("x-cwd")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("/")
        .to_string();
    if !x_cwd.starts_with('/') {
        return Err(ApiError::invalid(format!(
            "the `x-cwd` header should be an absolute path (got {x_cwd:?})."
        )));
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > UPLOAD_LIMIT) {
        return Err(ApiError::too_large(UPLOAD_LIMIT));
    }
    app.ready(&id).await?;
    let ws = app.workspace(&id)?;
    let (tx, rx) = tokio::sync::mpsc::channel(UPLOAD_CHUNKS_IN_FLIGHT);
    let extract = tokio::task::spawn_blocking(move || {
        files::extract_upload(&ws, &x_cwd, ChannelReader::new(rx))
    });
    let mut stream = body.into_data_stream();
    let mut received: u64 = 0;
    let mut too_large = false;
    loop {
        let next = std::future::poll_fn(|cx| std::pin::Pin::new(&mut stream).poll_next(cx)).await;
        let chunk = match next {
            None => break,
            Some(Ok(chunk)) => chunk,
            Some(Err(e)) => {
                let _ = tx
                    .send(Err(std::io::Error::other(format!(
                        "the upload broke off: {e}"
                    ))))
                    .await;
                break;
            }
        };
        received += chunk.len() as u64;
        if received > UPLOAD_LIMIT {
            too_large = true;
            let _ = tx
                .send(Err(std::io::Error::other(
                    "the upload is larger than the limit",
                )))
                .await;
            break;
        }
        if tx.send(Ok(chunk)).await.is_err() {
            // The extractor stopped early (a bad archive): its error is the answer.
            break;
        }
    }
    drop(tx);
    let extracted = extract.await.unwrap_or_else(|e| {
        Err(files::FsError::Io {
            op: "extract the upload",
            path: std::path::PathBuf::new(),
            source: std::io::Error::other(e.to_string()),
        })
    });
    if too_large {
        return Err(ApiError::too_large(UPLOAD_LIMIT));
    }
    extracted?;
    Ok(Json(json!({})))
}

/// Upload chunks queued between the connection and the extractor (hyper's chunks are at most a
/// few hundred KiB, so a few MiB at most are held).
const UPLOAD_CHUNKS_IN_FLIGHT: usize = 8;

/// A blocking [`Read`](std::io::Read) over the chunks of a request body sent through a channel
/// (for the extractor, which runs on the blocking pool).
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
    current: Bytes,
}

impl ChannelReader {
    fn new(rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>) -> ChannelReader {
        ChannelReader {
            rx,
            current: Bytes::new(),
        }
    }
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(e)) => return Err(e),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

pub(super) async fn read_file(
    State(app): App,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req = validate::path_request(&body)?;
    app.ready(&id).await?;
    let ws = app.workspace(&id)?;
    let path = blocking(move || files::readable_file(&ws, req.cwd.as_deref(), &req.path)).await?;
    let mut file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| ApiError::internal(format!("open {}: {e}", path.display())))?;
    let (tx, body) = channel_body();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match file.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => {
                    if tx
                        .send(Ok(Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
    });
    let mut resp = body.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(resp)
}

pub(super) async fn make_dir(
    State(app): App,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req = validate::path_request(&body)?;
    app.ready(&id).await?;
    let ws = app.workspace(&id)?;
    blocking(move || files::make_dir(&ws, req.cwd.as_deref(), &req.path, req.recursive)).await?;
    Ok(Json(json!({})))
}
