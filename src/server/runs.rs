//! The run endpoint and the live side of each run: `POST /v1/tasks/{task}/run` answers NDJSON
//! (`started`, the command's output as it is produced, then its `result` or an `error`), and
//! while it runs `POST /v1/runs/{run}/stdin` streams its stdin and `POST /v1/runs/{run}/cancel`
//! signals it.
//!
//! The command runs in a task of its own, not in the request's future: a caller that goes away
//! (its connection closes, say the CLI was SIGKILLed) leaves the command to the server, which
//! still applies its timeout; its output is then drained and dropped, never left to block it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::BodyExt;
use tokio::sync::mpsc;

use super::answer::{engine_failure, failure, json_object, task_id, Failure};
use super::AppState;
use crate::client::body::ChannelBody;
use crate::client::wire::{ApiError, CancelRequest, RunEvent, RunRequest};
use crate::provider::live::OUTPUT_CHANNEL_CHUNKS;
use crate::provider::{Canceller, ExecIo};

/// The runs in progress, by id.
#[derive(Default)]
pub(super) struct Runs {
    next: AtomicU64,
    live: Mutex<HashMap<String, Live>>,
}

/// What a caller can still do to a run in progress.
struct Live {
    cancel: Canceller,
    /// Taken by the (one) stdin upload.
    stdin: Option<mpsc::Sender<Vec<u8>>>,
}

impl Runs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        // Plain data: a panic elsewhere leaves nothing half-changed worth refusing.
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Removes a run from [`Runs`] when its task ends, however it ends.
struct Registered(Arc<Runs>, String);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.lock().remove(&self.1);
    }
}

fn line(event: &RunEvent) -> Bytes {
    let mut v = serde_json::to_vec(event).expect("run events serialize");
    v.push(b'\n');
    Bytes::from(v)
}

pub(super) async fn run(
    State(st): State<AppState>,
    Path(task): Path<String>,
    bytes: Bytes,
) -> Result<Response, Failure> {
    let busy = st.activity.begin();
    let task = task_id(&task)?;
    let req: RunRequest = json_object(&bytes).map_err(|e| {
        failure(
            StatusCode::BAD_REQUEST,
            ApiError::new("bad_request", format!("the request body is not valid: {e}"))
                .hint(r#"send {"command": "…", "timeout_secs": N, "env": {"NAME": "value"}}"#),
        )
    })?;
    // The same bounds as terminal.timeout, from the config's table.
    if let Some(t) = req.timeout_secs {
        crate::config::Config::check_flag("terminal.timeout", "timeout_secs", t).map_err(|e| {
            let hint = e.hint();
            let mut err = ApiError::new("config", e.to_string());
            err.hint = hint;
            failure(StatusCode::BAD_REQUEST, err)
        })?;
    }
    let timeout = req.timeout_secs.map(std::time::Duration::from_secs);

    let id = format!("r{}", st.runs.next.fetch_add(1, Ordering::Relaxed) + 1);
    let (cancel, cancel_rx) = Canceller::new();
    let (stdin_tx, stdin_rx) = if req.stdin {
        let (tx, rx) = mpsc::channel(16);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let (out_tx, mut out_rx) = mpsc::channel(OUTPUT_CHANNEL_CHUNKS);
    let io = ExecIo {
        output: Some(out_tx),
        stdin: stdin_rx,
        cancel: Some(cancel_rx),
        env: req.env.clone(),
    };
    st.runs.lock().insert(
        id.clone(),
        Live {
            cancel,
            stdin: stdin_tx,
        },
    );
    let registered = Registered(st.runs.clone(), id.clone());
    let (body_tx, body) = ChannelBody::new(OUTPUT_CHANNEL_CHUNKS);
    let _ = body_tx.try_send(line(&RunEvent::Started { run: id }));

    let orch = st.orch.clone();
    tokio::spawn(async move {
        let _busy = busy;
        let _registered = registered;
        // `None` once the caller went away: output is then drained and dropped.
        let mut to_caller = Some(body_tx);
        let send = |to_caller: &mut Option<mpsc::Sender<Bytes>>, bytes: Bytes| {
            let tx = to_caller.clone();
            async move {
                match tx {
                    Some(tx) => tx.send(bytes).await.is_ok(),
                    None => false,
                }
            }
        };
        let run = orch.run_live(&task, &req.command, timeout, io);
        tokio::pin!(run);
        let result = loop {
            tokio::select! {
                res = &mut run => break res,
                Some(chunk) = out_rx.recv() => {
                    if !send(&mut to_caller, line(&RunEvent::output(chunk))).await {
                        to_caller = None;
                    }
                }
            }
        };
        // Every chunk was sent before the result: pass on what is still buffered.
        while let Ok(chunk) = out_rx.try_recv() {
            if !send(&mut to_caller, line(&RunEvent::output(chunk))).await {
                to_caller = None;
            }
        }
        let last = match result {
            Ok(res) => RunEvent::Result(res),
            Err(e) => RunEvent::Error(*engine_failure(e).1),
        };
        let _ = send(&mut to_caller, line(&last)).await;
    });

    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::new(body),
    )
        .into_response())
}

fn no_run(run: &str) -> Failure {
    failure(
        StatusCode::NOT_FOUND,
        ApiError::new("not_found", format!("no run `{run}` in progress")).hint(
            "a run's id is the `run` of its `started` line; it is gone once its result was sent",
        ),
    )
}

pub(super) async fn cancel(
    State(st): State<AppState>,
    Path(run): Path<String>,
    bytes: Bytes,
) -> Result<Json<serde_json::Value>, Failure> {
    let req: CancelRequest = json_object(&bytes).map_err(|e| {
        failure(
            StatusCode::BAD_REQUEST,
            ApiError::new("bad_request", format!("the request body is not valid: {e}"))
                .hint(r#"send {"signal": "INT"} (or "TERM", "HUP")"#),
        )
    })?;
    let runs = st.runs.lock();
    let live = runs.get(&run).ok_or_else(|| no_run(&run))?;
    live.cancel.cancel(req.signal);
    tracing::info!(
        run,
        signal = req.signal.name(),
        "run cancelled by its caller"
    );
    Ok(Json(
        serde_json::json!({ "cancelled": true, "signal": req.signal }),
    ))
}

pub(super) async fn stdin(
    State(st): State<AppState>,
    Path(run): Path<String>,
    body: Body,
) -> Result<Json<serde_json::Value>, Failure> {
    let tx = {
        let mut runs = st.runs.lock();
        let live = runs.get_mut(&run).ok_or_else(|| no_run(&run))?;
        live.stdin.take().ok_or_else(|| {
            failure(
                StatusCode::BAD_REQUEST,
                ApiError::new(
                    "bad_request",
                    format!("run `{run}` takes no stdin, or its stdin was already sent"),
                )
                .hint(r#"ask for stdin with "stdin": true in the run request, and send it once"#),
            )
        })?
    };
    let mut body = body;
    let mut bytes = 0u64;
    // The end of the body (or the caller going away) is the end of the command's stdin.
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data() {
            bytes += data.len() as u64;
            if tx.send(data.to_vec()).await.is_err() {
                break; // the command is done with its stdin
            }
        }
    }
    Ok(Json(serde_json::json!({ "bytes": bytes })))
}
