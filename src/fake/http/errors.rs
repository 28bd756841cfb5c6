//! How the fake's errors become responses: an [`ApiError`] is its status, its JSON body and a
//! `Retry-After` header; a file error maps onto the API error the service would give.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::fake::files::FsError;
use crate::fake::wire::ApiError;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, Json(self.body())).into_response();
        if let Some(secs) = self.retry_after_s {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

impl From<FsError> for ApiError {
    fn from(e: FsError) -> Self {
        match &e {
            FsError::NotFound { .. } => ApiError::not_found(e.to_string()),
            FsError::Outside { .. }
            | FsError::IsDir { .. }
            | FsError::Exists { .. }
            | FsError::NoParent { .. }
            | FsError::BadArchive { .. } => ApiError::invalid(e.to_string()),
            FsError::Io { .. } => ApiError::internal(e.to_string()),
        }
    }
}
