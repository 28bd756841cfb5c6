//! The guard every API request passes: counted, delayed, authenticated (bearer token) and
//! possibly failed on purpose (injected 429s and 5xxs) before its handler runs.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Shared;
use crate::fake::endpoint::Endpoint;
use crate::fake::faults::Verdict;
use crate::fake::wire::ApiError;

/// Every API request passes here: it is counted, delayed, authenticated and possibly failed on
/// purpose before its handler runs.
pub(super) async fn guard(
    State((app, endpoint)): State<(Arc<Shared>, Endpoint)>,
    req: Request,
    next: Next,
) -> Response {
    app.stats_mut().count_request(endpoint);
    let _in_flight = InFlight::enter(&app);
    app.spawn_due();
    let latency = app.faults_state().latency_ms();
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let resp = match check_auth(app.token.as_deref(), req.headers()) {
        Err(e) => e.into_response(),
        Ok(()) => {
            let verdict = app.faults_state().decide(endpoint);
            match verdict {
                Verdict::Proceed => next.run(req).await,
                Verdict::RateLimited { retry_after_s } => {
                    app.stats_mut().injected.rate_limited += 1;
                    ApiError {
                        retry_after_s: Some(retry_after_s),
                        ..ApiError::new(
                            429,
                            "rate_limited",
                            "Too many requests (injected by taskbox fake-vercel). Retry later.",
                        )
                    }
                    .into_response()
                }
                Verdict::Error { status } => {
                    app.stats_mut().injected.errors += 1;
                    ApiError::new(
                        status,
                        "internal_server_error",
                        "An unexpected error occurred (injected by taskbox fake-vercel).",
                    )
                    .into_response()
                }
            }
        }
    };
    app.stats_mut()
        .count_response(endpoint, resp.status().as_u16());
    resp
}

/// One request counted in [`Shared::in_flight`] until it is answered or its future dropped.
struct InFlight<'a>(&'a Shared);

impl<'a> InFlight<'a> {
    fn enter(app: &'a Shared) -> Self {
        app.in_flight.fetch_add(1, Ordering::SeqCst);
        Self(app)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Bearer auth: 401 without a token; 403 with the wrong one when the fake has a token.
pub(super) fn check_auth(expected: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let Some(given) = given else {
        return Err(ApiError::new(
            401,
            "unauthorized",
            "Missing `Authorization: Bearer <token>` header.",
        ));
    };
    match expected {
        Some(token) if !constant_time_eq(given.as_bytes(), token.as_bytes()) => Err(ApiError::new(
            403,
            "forbidden",
            "Not authorized: the token is invalid or expired.",
        )),
        _ => Ok(()),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
