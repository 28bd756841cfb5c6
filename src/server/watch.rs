//! `GET /v1/tasks/{task}/watch`: a task's transitions as NDJSON, as they are committed — first
//! the task's state now, then one line per state change. The stream ends when the client goes
//! away or the server stops; a watcher that falls behind gets a `lagged` line and the state
//! again.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use tokio::sync::{broadcast, mpsc};

use super::answer::{engine_failure, failure, task_id, Failure};
use super::AppState;
use crate::client::wire::{ApiError, WatchEvent};
use crate::core::Task;
use crate::engine::{Orchestrator, StateChange};
use crate::ids::TaskId;

/// Lines buffered for a slow reader before the watcher waits for it.
const BUFFERED_LINES: usize = 64;

/// A channel of lines as a response body (the dashboard's event stream uses it too).
pub(super) struct LineStream(pub(super) mpsc::Receiver<Bytes>);

impl futures_core::Stream for LineStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|l| l.map(Ok))
    }
}

pub(super) fn line(ev: &WatchEvent) -> Bytes {
    let mut v = serde_json::to_vec(ev).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn state_of(t: &Task) -> WatchEvent {
    WatchEvent::State {
        task: t.id.to_string(),
        state: t.state.as_str().to_string(),
        sandbox: t.sandbox.as_ref().map(|s| s.id.to_string()),
    }
}

pub(super) fn transition(c: &StateChange) -> WatchEvent {
    WatchEvent::Transition {
        task: c.task_id.to_string(),
        from: c.from.as_str().to_string(),
        to: c.to.as_str().to_string(),
        event: c.event.to_string(),
        at: c.at,
    }
}

pub(super) async fn watch(
    State(st): State<AppState>,
    Path(task): Path<String>,
) -> Result<Response, Failure> {
    let task = task_id(&task)?;
    let Some((current, rx)) = st.orch.watch_task(&task).await.map_err(engine_failure)? else {
        return Err(failure(
            StatusCode::NOT_FOUND,
            ApiError::new("not_found", format!("no task named `{task}`")).hint(
                "`taskbox tasks` lists the tasks; `taskbox run --task NAME -- CMD` creates one",
            ),
        ));
    };
    let (tx, lines) = mpsc::channel(BUFFERED_LINES);
    let _ = tx.try_send(line(&state_of(&current)));
    tokio::spawn(forward(st.orch.clone(), task, rx, tx, st.closing.clone()));
    let mut resp = Response::new(Body::from_stream(LineStream(lines)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(resp)
}

/// Sends the task's changes to the client until it goes away or the server stops.
async fn forward(
    orch: Orchestrator,
    task: TaskId,
    mut rx: broadcast::Receiver<StateChange>,
    tx: mpsc::Sender<Bytes>,
    mut closing: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let next = tokio::select! {
            c = rx.recv() => c,
            _ = tx.closed() => return,
            _ = closing.wait_for(|v| *v) => return,
        };
        let out = match next {
            Ok(c) if c.task_id == task.as_str() => vec![line(&transition(&c))],
            Ok(_) => continue,
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                let mut out = vec![line(&WatchEvent::Lagged { missed })];
                if let Ok(Some(view)) = orch.show(&task, 0).await {
                    out.push(line(&state_of(&view.task)));
                }
                out
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        for l in out {
            if tx.send(l).await.is_err() {
                return;
            }
        }
    }
}
