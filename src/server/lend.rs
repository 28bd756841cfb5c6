//! The server's accept loop lent to taskbox's other HTTP service, `taskbox mcp --http` (issue
//! 32: it used `axum::serve`, with no deadline for a request's head and no connection cap, so
//! half-sent requests held it). It gets the limits of `conn.rs` as they are: the head and
//! keep-alive idle timeout, the bound on a body's stalls, the connection cap under the
//! open-files limit (a `503` beyond it), and hyper's parse errors answered as JSON.

use std::time::Duration;

use axum::Router;
use tokio::sync::watch;

use super::conn;

/// How long the connections open when `stop` resolves get to finish their answers; a stream
/// that never ends (an MCP client's event stream) is cut then.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` with the server's connection limits until `stop` resolves, then
/// lets the open connections finish their answers for a bounded time.
pub async fn serve_guarded(
    listener: tokio::net::TcpListener,
    app: Router,
    stop: impl std::future::Future<Output = ()>,
) {
    let app = app.layer(axum::middleware::from_fn(conn::body_idle_timeout));
    let cap = conn::tcp_cap(super::open_files_limit());
    tracing::info!(cap, "TCP connections served at once");
    let (closing_tx, closing) = watch::channel(false);
    let serving = tokio::spawn(conn::serve(listener, app, Some(cap), closing));
    stop.await;
    let _ = closing_tx.send(true);
    if tokio::time::timeout(STOP_GRACE, serving).await.is_err() {
        tracing::warn!("connections still open after the grace period were cut");
    }
}
