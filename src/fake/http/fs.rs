//! File handlers (`fs/write`, `fs/read`, `fs/mkdir`): uploads extracted, files streamed back,
//! directories made, all inside the session's workspace.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

use super::shared::blocking;
use super::App;
use crate::fake::conn::channel_body;
use crate::fake::files;
use crate::fake::validate;
use crate::fake::wire::ApiError;

pub(super) async fn write_files(
    State(app): App,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
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
    app.ready(&id).await?;
    let ws = app.workspace(&id)?;
    blocking(move || files::extract_upload(&ws, &x_cwd, &body)).await?;
    Ok(Json(json!({})))
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
