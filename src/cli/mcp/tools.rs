//! The MCP tools and resources: one [`ServerHandler`] that answers `tools/list`,
//! `tools/call`, `resources/list`, `resources/templates/list` and `resources/read`.
//!
//! Every failure of a tool — a bad task id, an unknown task, a path that leaves the workspace,
//! taskbox's own errors — is a tool result with `isError: true` whose text is what the CLI
//! would print (`error:`, `caused by:`, `note:`, `hint:`) and whose structured content is the
//! CLI's `--json` error object (`code`, `message`, `hint`), redacted. Only a request that names
//! no tool of this server is a protocol error.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use base64::Engine as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::schemars::JsonSchema;
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio::sync::mpsc;

use taskbox::config::{CommandEnv, Config};
use taskbox::engine::{Paths, RunResult, TaskView};
use taskbox::provider::{CancelSignal, Canceller, ExecIo};
use taskbox::TaskId;

mod checkpoint;

use super::super::output::{self, Failure};
use super::files::{self, CheckedPath};
use super::Engine;

/// The URI of a task's timeline resource.
fn timeline_uri(task: &str) -> String {
    format!("taskbox://tasks/{task}/timeline")
}

/// The task a timeline URI names.
fn timeline_task(uri: &str) -> Option<&str> {
    uri.strip_prefix("taskbox://tasks/")?
        .strip_suffix("/timeline")
}

/// The MCP server: tools over the data dir's engine (a server, or one in this process).
#[derive(Clone)]
pub struct Taskbox {
    engine: Arc<Engine>,
    paths: Arc<Paths>,
}

/// Resolves when the client cancels the tool call (`notifications/cancelled`).
type Cancelled = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A tool's answer before it becomes a [`CallToolResult`].
type Answer = Result<CallToolResult, Failure>;

// ---- arguments (their doc comments are the schema's descriptions) ----

/// `run_command`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
struct RunArgs {
    /// The task: 1 to 64 letters, digits, `-` or `_`. Its sandbox is created on first use.
    task: String,
    /// The command line, run with `bash -c` in the task's sandbox.
    command: String,
    /// Seconds after which the command is killed (default: the `terminal.timeout` setting).
    #[serde(default)]
    timeout: Option<u64>,
    /// Environment variables for the command, {"NAME": "value"}, over the `terminal.env`
    /// setting. Names are letters, digits and `_` (not starting with a digit), never
    /// `TASKBOX_*`. Values are kept secret: never journaled nor shown.
    #[serde(default)]
    #[schemars(with = "Option<std::collections::BTreeMap<String, String>>")]
    env: Option<CommandEnv>,
}

/// Arguments naming one task.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
struct TaskArgs {
    /// The task's name.
    task: String,
}

/// `show_task`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
struct ShowArgs {
    /// The task's name.
    task: String,
    /// How many of the latest journal entries to include (default 10).
    #[serde(default)]
    journal: Option<usize>,
}

/// `fork_task`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
struct ForkArgs {
    /// The task to fork.
    task: String,
    /// The new task's name (it must not exist yet).
    new_task: String,
    /// Fork from this snapshot instead of the latest: `TASK.sN` as show_task numbers them, or a snapshot id.
    #[serde(default)]
    snapshot: Option<String>,
}

/// `list_tasks` takes no arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
struct NoArgs {}

/// `read_file`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    /// The task's name.
    task: String,
    /// The file: relative to the task's workspace root, or absolute inside it.
    path: String,
    /// The byte to start at (default 0); a partial read says where to continue.
    #[serde(default)]
    offset: Option<u64>,
    /// At most this many bytes (default and maximum 40000).
    #[serde(default)]
    limit: Option<u64>,
}

/// How `write_file`'s content is given.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(rename_all = "lowercase")]
enum ContentEncoding {
    /// The content is the file's text.
    #[default]
    Text,
    /// The content is base64 of the file's bytes.
    Base64,
}

/// `write_file`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    /// The task. Its sandbox is created on first use.
    task: String,
    /// The file: relative to the task's workspace root, or absolute inside it (missing directories are created).
    path: String,
    /// The file's whole new content.
    content: String,
    /// `text` (default) or `base64` (for bytes that are not text).
    #[serde(default)]
    encoding: ContentEncoding,
}

/// A tool whose input schema is `T`'s (its fields' doc comments describe them; the struct's own
/// title and doc, which name Rust types, are left out).
fn tool<T: JsonSchema + 'static>(name: &'static str, description: &'static str) -> Tool {
    let mut schema = rmcp::handler::server::common::schema_for_type::<T>()
        .as_ref()
        .clone();
    schema.remove("title");
    schema.remove("description");
    if schema.get("properties").is_none() {
        // `list_tasks`: clients expect `properties` even when there are none.
        schema.insert("properties".into(), serde_json::json!({}));
    }
    Tool::new(name, description, Arc::new(schema))
}

/// Every tool, with its schema and a one-line description an agent can act on.
fn tools() -> Vec<Tool> {
    let read_only = || ToolAnnotations::new().read_only(true);
    vec![
        tool::<RunArgs>(
            "run_command",
            "Run a shell command (bash -c) in the task's own sandbox, created or restored on first use; \
             files persist across calls and suspends. Returns the exit code, stdout and stderr (each \
             bounded to 50,000 characters) and notes such as \"the sandbox was recreated\".",
        )
        .annotate(ToolAnnotations::new().destructive(true).open_world(false)),
        tool::<TaskArgs>(
            "suspend_task",
            "Snapshot the task's files and stop its sandbox (running processes end); the next \
             command or resume_task restores the files.",
        )
        .annotate(ToolAnnotations::new().destructive(false).idempotent(true)),
        tool::<TaskArgs>(
            "resume_task",
            "Bring the task's sandbox back now, restoring its latest snapshot, without running a command.",
        )
        .annotate(ToolAnnotations::new().destructive(false).idempotent(true)),
        tool::<ForkArgs>(
            "fork_task",
            "Start a new task from a snapshot of this one (the latest by default, taken now if the task \
             is live): the new task's first command restores those files; the two then diverge.",
        )
        .annotate(ToolAnnotations::new().destructive(false)),
        tool::<NoArgs>(
            "list_tasks",
            "List every task with its state, live sandbox and latest snapshot.",
        )
        .annotate(read_only()),
        tool::<ShowArgs>(
            "show_task",
            "Show one task in detail: state, sandbox, snapshots and its latest journal entries.",
        )
        .annotate(read_only()),
        tool::<ReadArgs>(
            "read_file",
            "Read a file of the task's workspace (path relative to the workspace root): up to 40,000 \
             bytes from offset, with the file's size and where to continue.",
        )
        .annotate(read_only()),
        tool::<WriteArgs>(
            "write_file",
            "Create or replace a file in the task's workspace (path relative to the workspace root; \
             missing directories are created; never writes through a symlink).",
        )
        .annotate(ToolAnnotations::new().destructive(true).idempotent(true)),
    ]
    .into_iter()
    .chain(checkpoint::tools())
    .collect()
}

/// Parses a tool's arguments; a mismatch is the tool's error, naming the tool and the field.
fn args<T: DeserializeOwned>(
    tool: &str,
    raw: Option<rmcp::model::JsonObject>,
) -> Result<T, Failure> {
    let value = serde_json::Value::Object(raw.unwrap_or_default());
    serde_json::from_value(value).map_err(|e| {
        Failure::new(format!("invalid arguments for {tool}: {e}"))
            .code("bad_request")
            .hint(format!("`tools/list` gives {tool}'s input schema"))
    })
}

fn task_id(s: &str) -> Result<TaskId, Failure> {
    super::super::task_id(s)
}

/// A successful result: `text` for the agent, `value` as structured content.
fn success(text: String, value: serde_json::Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(value);
    r
}

/// A failure as the tool's error result.
fn error_result(f: &Failure) -> CallToolResult {
    let (text, value) = f.tool_error();
    let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
    r.structured_content = Some(value);
    r
}

/// Cancels the command when the tool call goes away (the client cancelled, or the session
/// ended) before it finished.
struct CancelOnDrop(Option<Canceller>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.cancel(CancelSignal::Terminate);
        }
    }
}

impl Taskbox {
    /// The handler over `engine`, reading tasks and journals from `paths`' store.
    pub fn new(engine: Arc<Engine>, paths: Paths) -> Taskbox {
        Taskbox {
            engine,
            paths: Arc::new(paths),
        }
    }

    /// Runs `command` in the task's sandbox with `stdin` (if any) as its input, cancelling it
    /// (SIGTERM to its process group) if `ct` fires or this future is dropped first.
    async fn run(
        &self,
        task: &TaskId,
        command: String,
        timeout: Option<u64>,
        stdin: Option<Vec<u8>>,
        env: CommandEnv,
        ct: Cancelled,
    ) -> Result<RunResult, Failure> {
        if let Some(t) = timeout {
            Config::check_flag("terminal.timeout", "timeout", t).map_err(Failure::from_config)?;
        }
        let (canceller, cancel_rx) = Canceller::new();
        let stdin = stdin.map(|bytes| {
            let (tx, rx) = mpsc::channel(1);
            // Room for one chunk; dropping `tx` then ends the input.
            let _ = tx.try_send(bytes);
            rx
        });
        let io = ExecIo {
            output: None,
            stdin,
            cancel: Some(cancel_rx),
            env,
        };
        // On a task of its own, so that a cancel reaches the run even when this future is
        // dropped (the run then ends by the cancel, or by its timeout).
        let engine = self.engine.clone();
        let t = task.clone();
        let mut handle = tokio::spawn(async move { engine.run(&t, &command, timeout, io).await });
        let mut guard = CancelOnDrop(Some(canceller.clone()));
        let res = tokio::select! {
            res = &mut handle => res,
            () = ct => {
                canceller.cancel(CancelSignal::Terminate);
                handle.await
            }
        };
        guard.0 = None;
        res.map_err(|e| Failure::new(format!("the command's run failed: {e}")))?
    }

    async fn run_command(&self, a: RunArgs, ct: Cancelled) -> Answer {
        let task = task_id(&a.task)?;
        let env = a.env.unwrap_or_default();
        let res = self.run(&task, a.command, a.timeout, None, env, ct).await?;
        let mut notes = notes(&res, a.timeout);
        // Once, on the first run of a store that is new while archives of another installation
        // exist (as `taskbox run` says).
        notes.extend(taskbox::provider::registry::take_foreign_notes(
            &self.paths.data_dir,
        ));
        let mut text = if res.timed_out {
            format!("exit code: {} (timed out)\n", res.exit_code)
        } else if res.memory_killed {
            format!(
                "exit code: {} (killed by the memory limit)\n",
                res.exit_code
            )
        } else {
            format!("exit code: {}\n", res.exit_code)
        };
        for n in &notes {
            text.push_str(&format!("note: {n}\n"));
        }
        stream_section(
            &mut text,
            "stdout",
            &res.stdout_bytes(),
            res.stdout_truncated,
        );
        stream_section(
            &mut text,
            "stderr",
            &res.stderr_bytes(),
            res.stderr_truncated,
        );
        let mut value = serde_json::to_value(&res)
            .map_err(|e| Failure::new(format!("cannot encode the result: {e}")))?;
        value["task"] = task.as_str().into();
        value["notes"] = serde_json::json!(notes);
        Ok(success(text, value))
    }

    async fn suspend_task(&self, a: TaskArgs) -> Answer {
        let task = task_id(&a.task)?;
        let res = self.engine.suspend(&task).await?;
        let mut text = match &res.snapshot_id {
            Some(id) => format!("suspended {task}: its files are kept in snapshot {id}; the next command restores them"),
            None => format!(
                "suspended {task}: no snapshot kept (terminal.container_persistent is false, or nothing ran)"
            ),
        };
        if !res.omitted.is_empty() {
            text.push_str(&format!(
                "\nnote: {} path(s) could not be read and are not in the snapshot (everything else is):",
                res.omitted.len()
            ));
            for what in &res.omitted {
                text.push_str(&format!("\n  {what}"));
            }
        }
        Ok(success(
            text,
            serde_json::json!({
                "task": task.as_str(), "snapshot_id": res.snapshot_id, "omitted": res.omitted,
            }),
        ))
    }

    async fn resume_task(&self, a: TaskArgs) -> Answer {
        let task = task_id(&a.task)?;
        let res = self.engine.resume(&task).await?;
        let mut text = String::new();
        for n in &res.notices {
            text.push_str(&format!("note: {}\n", output::notice_text(n)));
        }
        text.push_str(&format!(
            "resumed {task}: sandbox {} is live",
            res.sandbox_id
        ));
        Ok(success(
            text,
            serde_json::json!({
                "task": task.as_str(), "sandbox_id": res.sandbox_id, "notices": res.notices,
            }),
        ))
    }

    async fn fork_task(&self, a: ForkArgs) -> Answer {
        let task = task_id(&a.task)?;
        let child = task_id(&a.new_task)?;
        let res = self
            .engine
            .fork(&task, &child, a.snapshot.as_deref())
            .await?;
        let taken = res
            .taken_at
            .map(|at| format!(", taken {}", taskbox::clock::format_ms(at)))
            .unwrap_or_default();
        let text = format!(
            "forked {} from {}.s{} (snapshot {}{taken}): its first command restores those files",
            res.task, res.parent, res.parent_seq, res.snapshot_id
        );
        let value = serde_json::to_value(&res)
            .map_err(|e| Failure::new(format!("cannot encode the result: {e}")))?;
        Ok(success(text, value))
    }

    fn list_tasks(&self) -> Answer {
        // Read-only, as `taskbox tasks`: straight from the store, no provider.
        let store_err = |e: taskbox::store::StoreError| Failure::from_engine(e.into());
        let store = super::super::existing_store(&self.paths).map_err(store_err)?;
        let (tasks, removed) = super::super::stored_tasks(store.as_ref())?;
        drop(store);
        let now = taskbox::clock::Clock::now_ms(&taskbox::clock::SystemClock);
        let rows = output::tasks_json(&tasks, now, &removed);
        let mut text = String::new();
        if tasks.is_empty() {
            text.push_str("no tasks yet: run_command with a new task name creates one");
        }
        for row in rows.as_array().into_iter().flatten() {
            let s = |k: &str| row[k].as_str().unwrap_or("-").to_string();
            text.push_str(&format!(
                "{}  state={}  sandbox={}  latest_snapshot={}  last_activity={}\n",
                s("task"),
                s("state"),
                s("sandbox"),
                s("latest_snapshot"),
                s("last_activity"),
            ));
        }
        Ok(success(
            text.trim_end().to_string(),
            serde_json::json!({ "tasks": rows }),
        ))
    }

    fn show_task(&self, a: ShowArgs) -> Answer {
        let task = task_id(&a.task)?;
        let view = self.view(&task, a.journal.unwrap_or(10))?;
        let value = output::view_json(&view)?;
        let text = serde_json::to_string_pretty(&value)
            .map_err(|e| Failure::new(format!("cannot encode the task: {e}")))?;
        Ok(success(text, serde_json::json!({ "task": value })))
    }

    /// The task's view from the store, or the CLI's "no such task" failure.
    fn view(&self, task: &TaskId, journal: usize) -> Result<TaskView, Failure> {
        let store = super::super::existing_store(&self.paths)
            .map_err(|e| Failure::from_engine(e.into()))?;
        let view = match store {
            Some(store) => {
                TaskView::load(&store, task, journal, None).map_err(Failure::from_engine)?
            }
            None => None,
        };
        view.ok_or_else(|| super::super::no_task(&self.paths, task))
    }

    async fn read_file(&self, a: ReadArgs, ct: Cancelled) -> Answer {
        let task = task_id(&a.task)?;
        let path = checked(&a.path)?;
        // Reading never creates a task.
        self.view(&task, 0)?;
        let offset = a.offset.unwrap_or(0);
        let limit = a.limit.unwrap_or(files::MAX_READ_BYTES);
        if limit == 0 || limit > files::MAX_READ_BYTES {
            return Err(Failure::new(format!(
                "limit {limit} is out of bounds: read_file reads 1 to {} bytes per call",
                files::MAX_READ_BYTES
            ))
            .code("bad_request")
            .hint("read a larger file in parts: offset, then the next_offset it answers"));
        }
        let script = files::read_script(&path, offset, limit);
        let res = self
            .run(&task, script, None, None, CommandEnv::new(), ct)
            .await?;
        let size = files::outcome("read_file", &res).map_err(refused)?.size;
        if res.stdout_truncated {
            return Err(Failure::new(
                "read_file's output was cut by the capture bound; read fewer bytes (limit)",
            ));
        }
        let bytes = res.stdout_bytes();
        let (encoding, content, used) = match files::text_of(&bytes) {
            Some(text) => ("text", text.to_string(), text.len() as u64),
            None => (
                "base64",
                base64::engine::general_purpose::STANDARD.encode(&bytes),
                bytes.len() as u64,
            ),
        };
        let end = offset.saturating_add(used);
        let next_offset = (end < size).then_some(end);
        let mut text = match encoding {
            "text" => content.clone(),
            _ => format!(
                "({} bytes that are not UTF-8 text, as base64:)\n{content}",
                bytes.len()
            ),
        };
        if let Some(next) = next_offset {
            text.push_str(&format!(
                "\n[bytes {offset}..{end} of {size}; read_file with offset={next} continues]"
            ));
        } else if offset > 0 || used < size {
            text.push_str(&format!(
                "\n[bytes {offset}..{end} of {size}: the end of the file]"
            ));
        }
        Ok(success(
            text,
            serde_json::json!({
                "task": task.as_str(), "path": path.as_str(), "size": size, "offset": offset,
                "length": used, "next_offset": next_offset, "encoding": encoding,
                "content": content,
            }),
        ))
    }

    async fn write_file(&self, a: WriteArgs, ct: Cancelled) -> Answer {
        let task = task_id(&a.task)?;
        let path = checked(&a.path)?;
        let bytes = match a.encoding {
            ContentEncoding::Text => a.content.into_bytes(),
            ContentEncoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(a.content.trim())
                .map_err(|e| {
                    Failure::new(format!("content is not valid base64: {e}"))
                        .code("bad_request")
                        .hint("send text with encoding \"text\" (the default), or standard base64")
                })?,
        };
        if bytes.len() > files::MAX_WRITE_BYTES {
            return Err(Failure::new(format!(
                "the content is {} bytes; write_file takes at most {} MiB",
                bytes.len(),
                files::MAX_WRITE_BYTES / (1024 * 1024)
            ))
            .code("bad_request")
            .hint(
                "write it in the sandbox with run_command instead (download or generate it there)",
            ));
        }
        let len = bytes.len();
        let script = files::write_script(&path);
        let res = self
            .run(&task, script, None, Some(bytes), CommandEnv::new(), ct)
            .await?;
        let size = files::outcome("write_file", &res).map_err(refused)?.size;
        if size != len as u64 {
            return Err(Failure::new(format!(
                "write_file wrote {size} bytes of {len} to {}",
                path.as_str()
            )));
        }
        let notes: Vec<String> = res.notices.iter().map(output::notice_text).collect();
        let mut text = format!("wrote {len} bytes to {}", path.as_str());
        for n in &notes {
            text.push_str(&format!("\nnote: {n}"));
        }
        Ok(success(
            text,
            serde_json::json!({
                "task": task.as_str(), "path": path.as_str(), "size": size, "notes": notes,
            }),
        ))
    }

    async fn call(&self, req: CallToolRequestParams, ct: Cancelled) -> Option<Answer> {
        let name = req.name.as_ref();
        let raw = req.arguments;
        Some(match name {
            "run_command" => match args(name, raw) {
                Ok(a) => self.run_command(a, ct).await,
                Err(f) => Err(f),
            },
            "suspend_task" => match args(name, raw) {
                Ok(a) => self.suspend_task(a).await,
                Err(f) => Err(f),
            },
            "resume_task" => match args(name, raw) {
                Ok(a) => self.resume_task(a).await,
                Err(f) => Err(f),
            },
            "fork_task" => match args(name, raw) {
                Ok(a) => self.fork_task(a).await,
                Err(f) => Err(f),
            },
            "checkpoint_task" => match args(name, raw) {
                Ok(a) => self.checkpoint_task(a).await,
                Err(f) => Err(f),
            },
            "rewind_task" => match args(name, raw) {
                Ok(a) => self.rewind_task(a).await,
                Err(f) => Err(f),
            },
            "list_tasks" => args::<NoArgs>(name, raw).and_then(|_| self.list_tasks()),
            "show_task" => args(name, raw).and_then(|a| self.show_task(a)),
            "read_file" => match args(name, raw) {
                Ok(a) => self.read_file(a, ct).await,
                Err(f) => Err(f),
            },
            "write_file" => match args(name, raw) {
                Ok(a) => self.write_file(a, ct).await,
                Err(f) => Err(f),
            },
            _ => return None,
        })
    }

    /// A task's timeline, as `taskbox replay TASK --timeline` prints it (redacted).
    fn timeline(&self, uri: &str) -> Result<String, McpError> {
        let not_found = |m: String| McpError::resource_not_found(m, None);
        let task = timeline_task(uri).ok_or_else(|| {
            not_found(format!(
                "no resource {uri}: taskbox's resources are taskbox://tasks/TASK/timeline"
            ))
        })?;
        let task = TaskId::new(task).map_err(|e| not_found(e.to_string()))?;
        let store = super::super::existing_store(&self.paths)
            .map_err(|e| McpError::internal_error(format!("cannot read the store: {e}"), None))?
            .ok_or_else(|| not_found(format!("no task `{task}` (this home has no tasks yet)")))?;
        let entries = store
            .journal(task.as_str())
            .map_err(|e| McpError::internal_error(format!("cannot read the journal: {e}"), None))?;
        if entries.is_empty() {
            return Err(not_found(format!("no task `{task}`")));
        }
        let (entries, _) = taskbox::replay::redact::redact_entries(&entries).map_err(|e| {
            McpError::internal_error(format!("cannot prepare the journal: {e}"), None)
        })?;
        Ok(taskbox::replay::timeline::render_text(
            &taskbox::replay::timeline::build(&entries),
        ))
    }
}

/// The path check's refusal as the tool's failure.
fn checked(path: &str) -> Result<CheckedPath, Failure> {
    files::check_path(path).map_err(|m| {
        Failure::new(m)
            .code("bad_path")
            .hint("paths are relative to the task's workspace root (where its commands start)")
    })
}

/// The sandbox-side check's refusal (or the script's failure) as the tool's failure.
fn refused(message: String) -> Failure {
    Failure::new(message).code("bad_path")
}

/// What the agent should know about a command's result, one line each.
fn notes(res: &RunResult, timeout: Option<u64>) -> Vec<String> {
    let mut notes: Vec<String> = res.notices.iter().map(output::notice_text).collect();
    if res.timed_out {
        let secs = timeout.map_or_else(|| "terminal.timeout".to_string(), |s| format!("{s} s"));
        notes.push(format!(
            "the command timed out after {secs} and was killed (the sandbox keeps running)"
        ));
    }
    notes
}

/// Appends `--- name ---` and the stream's text (lossy when it is not UTF-8), saying when its
/// middle was dropped.
fn stream_section(text: &mut String, name: &str, bytes: &[u8], truncated: bool) {
    if bytes.is_empty() {
        return;
    }
    text.push_str(&format!("--- {name} ---\n"));
    text.push_str(&String::from_utf8_lossy(bytes));
    if !text.ends_with('\n') {
        text.push('\n');
    }
    if truncated {
        text.push_str(&format!(
            "[{name} was longer than 50,000 characters: its middle was dropped]\n"
        ));
    }
}

impl ServerHandler for Taskbox {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(
            Implementation::new("taskbox", env!("CARGO_PKG_VERSION"))
                .with_title("taskbox: a persistent sandbox per task"),
        )
        .with_instructions(
            "Each task (a name you choose) has its own sandbox. run_command runs shell commands \
             there; files persist across calls, suspends and sandbox expiry (restored from \
             snapshots), live processes do not. read_file and write_file reach files of the \
             task's workspace. Suspend a task you pause; resources taskbox://tasks/TASK/timeline \
             show a task's history.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let ct = context.ct.clone();
        let cancelled: Cancelled = Box::pin(async move { ct.cancelled().await });
        match self.call(request, cancelled).await {
            Some(Ok(r)) => Ok(r.into()),
            Some(Err(f)) => Ok(error_result(&f).into()),
            None => Err(McpError::invalid_params(
                format!(
                    "no tool named `{name}`: taskbox's tools are {}",
                    tools()
                        .iter()
                        .map(|t| t.name.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None,
            )),
        }
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let ids = match super::super::existing_store(&self.paths) {
            Ok(Some(store)) => store.task_ids().map_err(|e| {
                McpError::internal_error(format!("cannot list the tasks: {e}"), None)
            })?,
            Ok(None) => Vec::new(),
            Err(e) => {
                return Err(McpError::internal_error(
                    format!("cannot read the store: {e}"),
                    None,
                ))
            }
        };
        Ok(ListResourcesResult::with_all_items(
            ids.iter()
                .map(|id| {
                    Resource::new(timeline_uri(id), format!("{id} timeline"))
                        .with_description(format!(
                            "Task {id}'s history: each transition of its sandbox and snapshots, and the commands it ran"
                        ))
                        .with_mime_type("text/plain")
                })
                .collect(),
        ))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new(timeline_uri("{task}"), "task timeline")
                .with_description("A task's history as a text table (taskbox replay --timeline)")
                .with_mime_type("text/plain"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let text = self.timeline(&request.uri)?;
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(text, request.uri.clone()).with_mime_type("text/plain")
        ])
        .into())
    }
}
