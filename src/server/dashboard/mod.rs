//! The operator's dashboard (`docs/dashboard.md`): a few pages of plain HTML, CSS and vanilla
//! JavaScript embedded in the binary (`assets/`, no build step, nothing fetched from elsewhere),
//! served at `/` on the server's Unix socket and, behind the bearer token, on `--listen`.
//!
//! The pages read the `/v1` API from the browser (`GET /v1/tasks`, `GET /v1/tasks/{task}`,
//! `GET /v1/health`); what the API does not give is here, under `/dashboard/`, read-only:
//!
//! - `events`: every task's transitions as NDJSON, as they are committed, so that the tasks
//!   table follows a whole server on one connection (a browser opens at most six to a host, and
//!   `/v1/tasks/{task}/watch` follows one task and never sees a new one);
//! - `tasks/{task}/timeline.svg`: the picture of `taskbox replay --format svg`, redacted;
//! - `tasks/{task}/snapshots`: the task's snapshots with what made each (suspend, idle, deadline);
//! - `costs`: every task's ledger, as `taskbox cost --json` prints it;
//! - `fleet`: on a PostgreSQL store, every task's lease (who holds it, its token, how long it
//!   runs), the fleet's servers as far as their leases show them.
//!
//! Nothing here is on a command's path: the pages only read, and the event stream subscribes to
//! the broadcast the event loop sends to whether anyone listens or not.

pub mod auth;
pub mod proxy;
mod reader;

pub use reader::Reader;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::sync::{broadcast, mpsc};

use super::answer::{engine_failure, failure, task_id, Failure};
use super::watch::{line, transition, LineStream};
use super::AppState;
use crate::client::wire::{ApiError, WatchEvent};
use crate::clock::{Clock, SystemClock};
use crate::engine::{cost, EngineError, StateChange, TaskView};
use crate::ids::TaskId;
use crate::replay::redact::redact_entries;
use crate::replay::timeline;

/// The page: one document whose script draws every view (`#/`, `#/task/NAME`, `#/forks`,
/// `#/fleet`).
pub const INDEX_HTML: &str = include_str!("assets/index.html");
/// The views' script.
pub const APP_JS: &str = include_str!("assets/app.js");
/// The style of the pages and of the login form.
pub const STYLE_CSS: &str = include_str!("assets/style.css");

/// Where the assets are served (public: they hold no data).
pub const ASSETS: &str = "/dashboard/assets/";

/// The most journal entries drawn in a task's timeline (the newest; a longer life is cut).
const TIMELINE_ENTRIES: usize = 5_000;

/// Lines buffered for a slow page before the stream waits for it.
const BUFFERED_LINES: usize = 64;

/// The dashboard's routes, merged into the server's router.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/dashboard/assets/app.js", get(app_js))
        .route("/dashboard/assets/style.css", get(style_css))
        .route("/dashboard/events", get(events))
        .route("/dashboard/costs", get(costs))
        .route("/dashboard/fleet", get(fleet))
        .route("/dashboard/tasks/{task}/timeline.svg", get(timeline_svg))
        .route("/dashboard/tasks/{task}/snapshots", get(snapshots))
        // On the Unix socket there is nothing to log into: the form's target goes home.
        .route(auth::LOGIN, get(home).post(home))
        .route(auth::LOGOUT, post(home))
}

fn asset(kind: &'static str, text: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(kind)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        text,
    )
        .into_response()
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style_css() -> Response {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

async fn home() -> Redirect {
    Redirect::to("/")
}

/// `GET /dashboard/events`: the `transition` lines of `/v1/tasks/{task}/watch` for every task,
/// after a first `{"type":"hello"}` line that says the subscription is in place (a page reads
/// the tasks after it, so that no change falls between the two); `lagged` when the page fell
/// behind (it reads the tasks again).
async fn events(State(st): State<AppState>) -> Response {
    let rx = st.orch.watch();
    let (tx, lines) = mpsc::channel(BUFFERED_LINES);
    let _ = tx.try_send(Bytes::from_static(b"{\"type\":\"hello\"}\n"));
    tokio::spawn(forward(rx, tx, st.closing.clone()));
    let mut resp = Response::new(Body::from_stream(LineStream(lines)));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Sends every change to the page until it goes away or the server stops.
async fn forward(
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
            Ok(c) => line(&transition(&c)),
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                line(&WatchEvent::Lagged { missed })
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if tx.send(out).await.is_err() {
            return;
        }
    }
}

/// The task's view as the store has it, with its last `entries` journal entries, or the API's
/// 404; read by the dashboard's own connection, off the event loop.
async fn view(st: &AppState, task: TaskId, entries: usize) -> Result<TaskView, Failure> {
    let id = task.clone();
    let found = st
        .dashboard
        .with(move |store| TaskView::load(store, &id, entries, None))
        .await?;
    found.ok_or_else(|| {
        engine_failure(EngineError::NoTask {
            task,
            suggestion: None,
        })
    })
}

fn encode_failure(what: &str, e: impl std::fmt::Display) -> Failure {
    failure(
        StatusCode::INTERNAL_SERVER_ERROR,
        ApiError::new("encode", format!("cannot encode {what}: {e}")),
    )
}

/// `GET /dashboard/tasks/{task}/timeline.svg`: the task's timeline, secrets redacted.
async fn timeline_svg(
    State(st): State<AppState>,
    Path(task): Path<String>,
) -> Result<Response, Failure> {
    let task = task_id(task.trim_end_matches(".svg"))?;
    let v = view(&st, task, TIMELINE_ENTRIES).await?;
    let (entries, _) = redact_entries(&v.journal).map_err(|e| encode_failure("the journal", e))?;
    let svg = timeline::render_svg(&timeline::build(&entries));
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("image/svg+xml"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        svg,
    )
        .into_response())
}

/// `GET /dashboard/tasks/{task}/snapshots`: the task's snapshots, newest first, each with
/// `made_by`: why it was taken (the task's `snapshot_reason` in the transition that asked for
/// it, e.g. `suspend`, `idle_reap`, `checkpoint`), or `fork` / `platform` / `unknown`.
async fn snapshots(
    State(st): State<AppState>,
    Path(task): Path<String>,
) -> Result<Json<serde_json::Value>, Failure> {
    let task = task_id(&task)?;
    let v = view(&st, task, usize::MAX).await?;
    let mut rows = Vec::new();
    for s in v.snapshots.iter().rev() {
        let made_by = made_by(&v, s.seq);
        let mut row = serde_json::to_value(s).map_err(|e| encode_failure("a snapshot", e))?;
        row["made_by"] = made_by.into();
        rows.push(row);
    }
    let mut out = serde_json::Value::Array(rows);
    crate::redact::redact_value(&mut out);
    Ok(Json(out))
}

/// Why snapshot `seq` of the task was taken, from the journal.
fn made_by(v: &TaskView, seq: u64) -> String {
    let asked = v.journal.iter().find(|e| {
        e.commands
            .iter()
            .any(|c| matches!(c, crate::core::Command::TakeSnapshot { seq: s, .. } if *s == seq))
    });
    if let Some(e) = asked {
        return match &e.task_after.snapshot_reason {
            Some(r) => serde_json::to_value(r)
                .ok()
                .and_then(|v| reason_name(&v))
                .unwrap_or_else(|| "unknown".into()),
            None => e.event.name().to_string(),
        };
    }
    let Some(rec) = v.task.snapshots.iter().find(|s| s.seq == seq) else {
        return "unknown".into();
    };
    let forked_from = v.task.lineage.as_ref().map(|l| &l.snapshot);
    if rec.taken_by.is_some() {
        "platform".into()
    } else if rec.id.is_some() && rec.id.as_ref() == forked_from {
        "fork".into()
    } else {
        "unknown".into()
    }
}

/// A serde-tagged enum's variant name: `"idle_reap"` or `{"suspend": {...}}`.
fn reason_name(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(m) => m
            .get("kind")
            .and_then(|k| k.as_str().map(str::to_string))
            .or_else(|| m.keys().next().cloned()),
        _ => None,
    }
}

/// `GET /dashboard/costs`: every task's ledger over its whole journal, as `taskbox cost --json`
/// prints a task's (`task` added). Read on a page's load and after changes settle, never on a
/// command's path.
async fn costs(State(st): State<AppState>) -> Result<Json<serde_json::Value>, Failure> {
    let window = cost::window(None, SystemClock.now_ms());
    let prices = st.dashboard.prices;
    let rows = st
        .dashboard
        .with(move |store| {
            let mut out = Vec::new();
            for id in store.task_ids()? {
                let (ledger, backend) = cost::task_ledger(store, &id, window)?;
                let mut row = cost::ledger_json(&ledger, backend.as_deref(), &prices);
                row["task"] = id.as_str().into();
                out.push(row);
            }
            Ok(out)
        })
        .await?;
    Ok(Json(serde_json::Value::Array(rows)))
}

/// `GET /dashboard/fleet`: `{"store": "postgres", "leases": [LeaseRow…]}` on a fleet's store;
/// `{"store": "sqlite", "leases": null}` on a data dir's file, which no other server shares.
async fn fleet(State(st): State<AppState>) -> Result<Json<serde_json::Value>, Failure> {
    let leases = st.dashboard.with(leases).await?;
    Ok(Json(match leases {
        Some(rows) => serde_json::json!({ "store": "postgres", "leases": rows }),
        None => serde_json::json!({ "store": "sqlite", "leases": null }),
    }))
}

#[cfg(feature = "postgres")]
fn leases(store: &crate::store::Store) -> Result<Option<Vec<crate::store::LeaseRow>>, EngineError> {
    match store {
        crate::store::Store::Postgres(pg) => Ok(Some(pg.leases()?)),
        _ => Ok(None),
    }
}

#[cfg(not(feature = "postgres"))]
fn leases(_: &crate::store::Store) -> Result<Option<Vec<serde_json::Value>>, EngineError> {
    Ok(None)
}
