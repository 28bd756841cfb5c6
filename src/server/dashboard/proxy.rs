//! `taskbox dashboard`: the dashboard of a data dir's server on a loopback TCP port, for a
//! browser (which cannot speak HTTP over a Unix socket).
//!
//! Each request the [`Guard`] lets through is sent on to the server's socket as it came (its
//! cookie and `Authorization` header removed: the socket needs neither), and the answer streams
//! back, the event stream included. A loopback port is open to every user of the machine, so it
//! is guarded like `serve --listen`: the caller makes a token only its user can read (a file of
//! mode 0600 in the data dir) and the browser logs in with it once; the token never appears in a
//! URL.
//!
//! An auto-started server exits once idle. A page's request then starts one again (as every
//! CLI command does), except the event stream's: a page left open does not keep a server alive.

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::TokioIo;

use super::auth::{self, Guard};
use crate::client::wire::ApiError;
use crate::client::{autostart, Client};

/// The most connections the proxy serves at once (a browser opens six).
const CONNECTIONS: usize = 64;

/// Where requests go.
struct Upstream {
    data_dir: PathBuf,
    socket: PathBuf,
}

/// Serves the dashboard of `data_dir`'s server on `listener`, behind `guard`, until `closing`
/// turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    data_dir: PathBuf,
    guard: Guard,
    closing: tokio::sync::watch::Receiver<bool>,
) {
    let upstream = Arc::new(Upstream {
        socket: super::super::socket_path(&data_dir),
        data_dir,
    });
    let app = Router::new().fallback(forward).with_state(upstream).layer(
        axum::middleware::from_fn_with_state(Arc::new(guard), auth::guard),
    );
    super::super::conn::serve(listener, app, Some(CONNECTIONS), closing).await;
}

/// Sends `req` to the server and its answer back; a server that is gone is started again for
/// any request but the event stream.
async fn forward(State(up): State<Arc<Upstream>>, mut req: Request) -> Response {
    let h = req.headers_mut();
    h.remove(header::COOKIE);
    h.remove(header::AUTHORIZATION);
    h.insert(header::HOST, HeaderValue::from_static("taskbox"));
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    if let Ok(uri) = path.parse::<Uri>() {
        *req.uri_mut() = uri;
    }
    let stream = match tokio::net::UnixStream::connect(&up.socket).await {
        Ok(s) => s,
        Err(_) if req.uri().path() != "/dashboard/events" => {
            let client = Client::new(&up.data_dir);
            if let Err(e) = autostart::ensure_server(&client).await {
                return unreachable(&up, &e.to_string());
            }
            match tokio::net::UnixStream::connect(&up.socket).await {
                Ok(s) => s,
                Err(e) => return unreachable(&up, &e.to_string()),
            }
        }
        Err(e) => return unreachable(&up, &e.to_string()),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(e) => return unreachable(&up, &e.to_string()),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "a dashboard connection to the server ended");
        }
    });
    match sender.send_request(req).await {
        Ok(resp) => resp.map(Body::new),
        Err(e) => unreachable(&up, &e.to_string()),
    }
}

/// 502: the server did not answer.
fn unreachable(up: &Upstream, why: &str) -> Response {
    let err = ApiError::new(
        "no_server",
        format!(
            "the taskbox server of {} did not answer on {}: {why}",
            up.data_dir.display(),
            up.socket.display()
        ),
    )
    .hint("`taskbox status` says whether it runs; its log is in the data dir");
    (StatusCode::BAD_GATEWAY, axum::Json(err)).into_response()
}
