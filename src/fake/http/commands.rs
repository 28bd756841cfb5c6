//! Command handlers: run (detached, or streamed as NDJSON with `wait`), get (long-polling
//! with `wait=true`), logs and kill, and the NDJSON stream that follows a running command
//! (where injected stream cuts happen).

use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::shared::lock;
use super::{pairs, param, App, Pairs, Shared};
use crate::fake::conn::{channel_body, BodySender, ConnHandle};
use crate::fake::exec::{self, CommandRun, EndCause, Event, SpawnSpec};
use crate::fake::faults::CutMode;
use crate::fake::files;
use crate::fake::model::WORKSPACE_ROOT;
use crate::fake::validate;
use crate::fake::wire::ApiError;

/// The content type of command streams; the SDK compares it exactly.
const NDJSON: &str = "application/x-ndjson";

pub(super) async fn run_command(
    State(app): App,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req = validate::run_request(&body)?;
    app.ready(&id).await?;
    let session_cwd = app.world().session(&id).map(|s| s.cwd.clone());
    let session_cwd = session_cwd.as_deref().unwrap_or(WORKSPACE_ROOT);
    let cwd = files::resolve(Some(session_cwd), req.cwd.as_deref().unwrap_or(session_cwd));
    let workspace = app.workspace(&id)?;
    let host_cwd = files::host_path(&workspace, &cwd)?;
    if !host_cwd.is_dir() {
        return Err(ApiError::invalid(format!(
            "`cwd` {cwd} is not a directory in the sandbox."
        )));
    }
    let mut env = app
        .world()
        .session(&id)
        .map(|s| s.env.clone())
        .unwrap_or_default();
    env.extend(req.env);
    // Contained in the session's local sandbox (its namespaces, where `/vercel/sandbox` is the
    // workspace), as the local provider's own commands are, where it isolates; a fake that
    // cannot make namespaces fails the command rather than run it on the host.
    let contained = app
        .local
        .contain(
            &super::shared::local_sandbox(&id),
            std::path::Path::new(&cwd),
        )
        .await
        .map_err(|e| ApiError::internal(format!("cannot contain the command: {e}")))?;
    let (home, workspace_seen) = match contained {
        Some(_) => (PathBuf::from(WORKSPACE_ROOT), WORKSPACE_ROOT.to_string()),
        None => (app.home(&id), workspace.display().to_string()),
    };
    // The local provider's stop finds the processes an unisolated session left behind by
    // `TASKBOX_SANDBOX` (its local sandbox's name); an isolated one's die with its namespaces.
    env.insert("TASKBOX_WORKSPACE".to_string(), workspace_seen);
    env.insert(
        "TASKBOX_SANDBOX".to_string(),
        super::shared::local_sandbox(&id),
    );
    let n = app.next_cmd.fetch_add(1, Ordering::SeqCst) + 1;
    let spec = SpawnSpec {
        id: format!("cmd_{}{n:05}", app.nonce),
        session_id: id.clone(),
        command: req.command,
        args: req.args,
        cwd,
        host_cwd,
        home,
        env,
        timeout: req.timeout_ms.map(Duration::from_millis),
        contained,
    };
    let run = exec::spawn(spec, Arc::clone(&app.clock));
    lock(&app.commands).insert(run.id.clone(), Arc::clone(&run));
    // A stop that began between `ready` and the insert did not see this command.
    let now = app.now();
    let still = app.world().access(&id, now);
    if let Err(e) = still {
        run.kill_for_session_stop();
        return Err(e);
    }
    if !req.wait {
        return Ok(Json(json!({ "command": run.view() })).into_response());
    }
    Ok(command_stream(&app, run, true, req.logs))
}

fn ndjson_line(value: &Value) -> Bytes {
    let mut line = value.to_string().into_bytes();
    line.push(b'\n');
    Bytes::from(line)
}

async fn send_line(tx: &BodySender, value: Value) -> bool {
    tx.send(Ok(ndjson_line(&value))).await.is_ok()
}

/// An NDJSON response following a command: its log chunks (if `logs`), framed by its command
/// record before and after (if `records`). A session stopping under it ends the stream with an
/// in-band error record; a configured cut ends it early.
fn command_stream(app: &Arc<Shared>, run: Arc<CommandRun>, records: bool, logs: bool) -> Response {
    let (tx, body) = channel_body();
    let app = Arc::clone(app);
    let cut = app.stream_cut();
    tokio::spawn(async move {
        if records {
            let mut first = run.view();
            first.exit_code = None;
            first.duration_ms = None;
            if !send_line(&tx, json!({ "command": first })).await {
                return;
            }
        }
        let deadline = cut
            .as_ref()
            .map(|c| tokio::time::Instant::now() + Duration::from_millis(c.after_ms));
        let mut cursor = run.cursor();
        loop {
            let event = match deadline {
                Some(at) => tokio::select! {
                    ev = cursor.next() => ev,
                    () = tokio::time::sleep_until(at) => {
                        app.count_cut();
                        let mode = cut.as_ref().map_or(CutMode::Abort, |c| c.mode);
                        match mode {
                            CutMode::Abort => {
                                let _ = tx.send(Err(io::Error::other("stream cut by fault injection"))).await;
                            }
                            CutMode::ErrorRecord => {
                                send_line(&tx, json!({"stream": "error", "data": {
                                    "code": "sandbox_stream_closed",
                                    "message": "The command stream was closed (injected by taskbox fake-vercel); poll the command instead.",
                                }})).await;
                            }
                        }
                        return;
                    }
                },
                None => cursor.next().await,
            };
            let ok = match event {
                Some(Event::Logs(chunks)) if logs => {
                    let mut ok = true;
                    for c in chunks {
                        ok = ok
                            && send_line(&tx, json!({"stream": c.stream.as_str(), "data": c.data}))
                                .await;
                    }
                    ok
                }
                Some(Event::Logs(_)) => true,
                Some(Event::Finished(exit)) => {
                    if exit.cause == EndCause::SessionStopped {
                        send_line(&tx, json!({"stream": "error", "data": {
                            "code": "sandbox_stopped",
                            "message": format!("The sandbox session {} stopped while the command was running.", run.session_id),
                        }}))
                        .await;
                    } else if records {
                        send_line(&tx, json!({ "command": run.view() })).await;
                    }
                    return;
                }
                None => return,
            };
            if !ok {
                return;
            }
        }
    });
    let mut resp = body.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON));
    resp
}

pub(super) async fn get_command(
    State(app): App,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    Path((id, cmd)): Path<(String, String)>,
    query: Pairs,
) -> Result<Json<Value>, ApiError> {
    let pairs = pairs(query)?;
    let now = app.now();
    app.world().readable(&id, now)?;
    let run = app.command(&id, &cmd)?;
    if param(&pairs, "wait") == Some("true") {
        let exit = match app.stream_cut() {
            Some(cut) => tokio::select! {
                exit = run.wait() => exit,
                () = tokio::time::sleep(Duration::from_millis(cut.after_ms)) => {
                    // A long poll has sent nothing yet: cutting it drops the connection.
                    app.count_cut();
                    conn.kill();
                    return Err(ApiError::internal("long poll cut by fault injection"));
                }
            },
            None => run.wait().await,
        };
        if exit.cause == EndCause::SessionStopped {
            return Err(ApiError::sandbox_stopped(&id));
        }
    }
    Ok(Json(json!({ "command": run.view() })))
}

pub(super) async fn command_logs(
    State(app): App,
    Path((id, cmd)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let now = app.now();
    app.world().readable(&id, now)?;
    let run = app.command(&id, &cmd)?;
    Ok(command_stream(&app, run, false, true))
}

pub(super) async fn kill_command(
    State(app): App,
    Path((id, cmd)): Path<(String, String)>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let signal = validate::kill_request(&body)?;
    let now = app.now();
    app.world().readable(&id, now)?;
    let run = app.command(&id, &cmd)?;
    run.signal(signal);
    Ok(Json(json!({ "command": run.view() })))
}
