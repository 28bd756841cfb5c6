//! Printing: human tables on stdout, JSON for scripts, and cargo-style failures on stderr.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::ExitCode;

use serde::Serialize;

use taskbox::clock::format_ms;
use taskbox::config::ConfigError;
use taskbox::core::{Event, Millis, Notice, SnapshotStatus, Task};
use taskbox::engine::{EngineError, GcItem, GcReport, TaskView};

/// Exit code for taskbox's own failures (the command's own codes pass through).
pub const EXIT_TASKBOX_ERROR: u8 = 125;

/// A taskbox failure as the user sees it: `error:`, `caused by:` lines, and a `hint:`.
#[derive(Debug)]
pub struct Failure {
    code: String,
    message: String,
    causes: Vec<String>,
    hint: Option<String>,
    /// Boxed slice rather than `Vec`: it keeps `Failure` within clippy's size for an error.
    notices: Box<[Notice]>,
    /// Sending the same request again may succeed (`"retryable": true` in `--json`, as the
    /// server's error objects say).
    retryable: bool,
}

impl Failure {
    pub fn new(message: impl Into<String>) -> Failure {
        Failure {
            code: "error".to_string(),
            message: message.into(),
            causes: Vec::new(),
            hint: None,
            notices: Box::default(),
            retryable: false,
        }
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Failure {
        self.hint = Some(hint.into());
        self
    }

    fn with_causes(mut self, err: &(dyn std::error::Error + 'static)) -> Failure {
        let mut source = err.source();
        while let Some(s) = source {
            let text = s.to_string();
            if !self.message.contains(&text) {
                self.causes.push(text);
            }
            source = s.source();
        }
        self
    }

    pub fn from_anyhow(err: anyhow::Error) -> Failure {
        let mut f = Failure::new(err.to_string());
        for cause in err.chain().skip(1) {
            f.causes.push(cause.to_string());
        }
        f
    }

    pub fn from_config(err: ConfigError) -> Failure {
        let hint = err.hint();
        let f = Failure::new(err.to_string())
            .with_causes(&err)
            .code("config");
        match hint {
            Some(h) => f.hint(h),
            None => f,
        }
    }

    pub fn from_engine(err: EngineError) -> Failure {
        let hint = err.hint();
        let notices = match &err {
            EngineError::Request { notices, .. } => notices.clone(),
            _ => Vec::new(),
        };
        let mut f = Failure::new(err.to_string()).with_causes(&err);
        f.code = err.code().to_string();
        f.notices = notices.into();
        f.retryable = err.is_retryable();
        match hint {
            Some(h) => f.hint(h),
            None => f,
        }
    }

    /// With a stable code (the `code` of the `--json` error object).
    pub fn code(mut self, code: &str) -> Failure {
        self.code = code.to_string();
        self
    }

    /// The failure with secrets redacted alike in every line ([`taskbox::redact`]).
    fn redacted(&self) -> Failure {
        let mut v = self.json();
        taskbox::redact::redact_value(&mut v);
        let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
        Failure {
            code: self.code.clone(),
            message: text(&v["message"]).unwrap_or_default(),
            causes: v["causes"]
                .as_array()
                .map(|cs| cs.iter().filter_map(text).collect())
                .unwrap_or_default(),
            hint: text(&v["hint"]),
            notices: self.notices.clone(),
            retryable: self.retryable,
        }
    }

    /// The failure as an MCP tool's error result: the text an agent reads (`error:`, `caused
    /// by:`, `note:`, `hint:` lines, as the CLI prints them) and the `--json` error object, both
    /// redacted.
    #[cfg(feature = "mcp")]
    pub fn tool_error(&self) -> (String, serde_json::Value) {
        let r = self.redacted();
        let mut text = format!("error: {}", r.message);
        for c in &r.causes {
            text.push_str(&format!("\ncaused by: {c}"));
        }
        for n in &r.notices {
            text.push_str(&format!("\nnote: {}", notice_text(n)));
        }
        if let Some(h) = &r.hint {
            text.push_str(&format!("\nhint: {h}"));
        }
        (text, r.json())
    }

    /// The `--json` error object: the same shape as the server's errors (docs/api.md).
    fn json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "code": self.code,
            "message": self.message,
        });
        if !self.causes.is_empty() {
            v["causes"] = serde_json::json!(self.causes);
        }
        if let Some(h) = &self.hint {
            v["hint"] = serde_json::json!(h);
        }
        if !self.notices.is_empty() {
            v["notices"] = serde_json::json!(self.notices);
        }
        if self.retryable {
            v["retryable"] = serde_json::json!(true);
        }
        v
    }
}

#[cfg(feature = "server")]
impl Failure {
    /// A failure of the server or of talking to it: the server's error object as it is (its
    /// message, causes, hint and notices), or what went wrong on the way.
    pub fn from_client(err: taskbox::client::ClientError) -> Failure {
        use taskbox::client::ClientError;
        match err {
            ClientError::Api(e) => {
                let e = *e;
                Failure {
                    code: e.code,
                    message: e.message,
                    causes: e.causes,
                    hint: e.hint,
                    notices: e.notices.into(),
                    retryable: e.retryable,
                }
            }
            other => {
                let hint = other.hint();
                let f = Failure::new(other.to_string())
                    .with_causes(&other)
                    .code("server");
                match hint {
                    Some(h) => f.hint(h),
                    None => f,
                }
            }
        }
    }

    /// A server that could not start or run.
    pub fn from_server(err: taskbox::server::ServerError) -> Failure {
        let hint = err.hint();
        let f = Failure::new(err.to_string()).with_causes(&err);
        match hint {
            Some(h) => f.hint(h),
            None => f,
        }
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        Failure::new(format!("cannot write output: {e}"))
    }
}

/// What `taskbox` says at once when a task it was asked to drive is another process's: who
/// holds it, that it waits, for how long at most, and how to stop waiting.
pub fn lock_wait_text(w: &taskbox::engine::LockWait) -> String {
    let who = match (w.holder, w.holder_is_server) {
        (Some(pid), true) => format!("the taskbox server (pid {pid})"),
        (Some(pid), false) => format!("another taskbox process (pid {pid})"),
        (None, _) => "another taskbox process".to_string(),
    };
    format!(
        "waiting: {who} is driving task {}; this waits until it lets go (at most {} s; Ctrl-C stops waiting)",
        w.task,
        w.limit.as_secs()
    )
}

/// Whether the failure has the stable code `code`.
pub fn has_code(f: &Failure, code: &str) -> bool {
    f.code == code
}

/// Prints a failure on stderr (and, with `json`, its error object on stdout) and returns exit
/// code 125.
pub fn fail(f: &Failure, json: bool) -> ExitCode {
    // No secret reaches the terminal through an error (a password in a URL being refused...).
    let f = &f.redacted();
    if json {
        let mut text = serde_json::to_string_pretty(&f.json()).unwrap_or_default();
        text.push('\n');
        let _ = write_ignoring_broken_pipe(&mut std::io::stdout().lock(), text.as_bytes());
    }
    print_notices(&f.notices);
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "error: {}", f.message);
    for c in &f.causes {
        let _ = writeln!(err, "  caused by: {c}");
    }
    if let Some(h) = &f.hint {
        let _ = writeln!(err, "hint: {h}");
    }
    ExitCode::from(EXIT_TASKBOX_ERROR)
}

/// Writes to stdout; a closed pipe (`taskbox tasks | head -1`) is not an error.
pub fn write_ignoring_broken_pipe(out: &mut impl Write, bytes: &[u8]) -> Result<(), Failure> {
    match out.write_all(bytes) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(Failure::from),
    }
}

/// Writes `line` and a newline to stdout ([`outln!`]): a closed stdout is the end of the output
/// (ignored, like the rest of it); another write error ends taskbox with it (exit 125).
pub fn out_line(mut line: String) {
    line.push('\n');
    if let Err(f) = write_ignoring_broken_pipe(&mut std::io::stdout().lock(), line.as_bytes()) {
        let _ = fail(&f, false);
        std::process::exit(i32::from(EXIT_TASKBOX_ERROR));
    }
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &impl Serialize) -> Result<(), Failure> {
    let mut text = serde_json::to_string_pretty(value)
        .map_err(|e| Failure::new(format!("cannot encode JSON: {e}")))?;
    text.push('\n');
    write_ignoring_broken_pipe(&mut std::io::stdout().lock(), text.as_bytes())
}

/// One line per notice, on stderr.
pub fn print_notices(notices: &[Notice]) {
    for n in notices {
        eprintln!("note: {}", notice_text(n));
    }
}

pub fn notice_text(n: &Notice) -> String {
    match n {
        Notice::Recreated {
            from_snapshot: Some(id),
            taken_at,
            changes_lost: false,
        } => format!(
            "the sandbox was recreated from snapshot {id}{}: files are back, live processes are \
             gone",
            taken(*taken_at)
        ),
        Notice::Recreated {
            from_snapshot: Some(id),
            taken_at,
            changes_lost: true,
        } => format!(
            "the sandbox was recreated from snapshot {id}{}: changes made after that snapshot \
             are gone, and so are live processes",
            taken(*taken_at)
        ),
        Notice::Recreated {
            from_snapshot: None,
            ..
        } => "the sandbox was recreated fresh: live processes are gone".to_string(),
        Notice::LateCheckpoint {
            snapshot_id,
            deadline,
        } => format!(
            "the sandbox passed its deadline at {} with its files still there; they were kept in \
             snapshot {snapshot_id} (a late checkpoint)",
            format_ms(*deadline)
        ),
        Notice::SandboxExpired { at } => {
            format!("the previous sandbox expired at {}", format_ms(*at))
        }
        Notice::FilesLost { reason } => format!("files were lost: {reason}"),
    }
}

/// ` taken at <time>`, when the time is known (journals before it was recorded lack it).
fn taken(at: Option<Millis>) -> String {
    at.map(|at| format!(" taken at {}", format_ms(at)))
        .unwrap_or_default()
}

fn snapshot_summary(t: &Task) -> String {
    let complete = t
        .snapshots
        .iter()
        .filter(|s| s.status == SnapshotStatus::Complete)
        .count();
    match t.latest_complete().and_then(|s| s.id.as_deref()) {
        Some(id) => format!("{complete} (latest {id})"),
        None => "0".to_string(),
    }
}

/// The tasks `taskbox rm` removed.
pub type Removed = std::collections::HashSet<taskbox::TaskId>;

/// The state `tasks` shows (`removed` for a removed task): a sandbox past its platform deadline is not `running` whatever the
/// store last recorded (nothing drove the task when the deadline came; the platform has stopped
/// it, and the next command restores the latest snapshot). The second value says whether the
/// recorded state was overruled so.
pub fn shown_state(t: &Task, now: Millis, removed: &Removed) -> (&'static str, bool) {
    if removed.contains(t.id.as_str()) {
        return ("removed", false);
    }
    match &t.sandbox {
        Some(sb) if sb.deadline <= now => ("expired", true),
        _ => (t.state.as_str(), false),
    }
}

pub fn tasks_json(tasks: &[Task], now: Millis, removed: &Removed) -> serde_json::Value {
    serde_json::Value::Array(tasks.iter().map(|t| task_json(t, now, removed)).collect())
}

fn task_json(t: &Task, now: Millis, removed: &Removed) -> serde_json::Value {
    let (state, passed) = shown_state(t, now, removed);
    serde_json::json!({
        "task": t.id,
        "state": state,
        "recorded_state": t.state,
        "deadline_passed": passed,
        "sandbox": t.sandbox.as_ref().map(|s| &s.id),
        "deadline": t.sandbox.as_ref().map(|s| format_ms(s.deadline)),
        "latest_snapshot": t.latest_complete().and_then(|s| s.id.as_deref()),
        "snapshots": t.snapshots.iter().filter(|s| s.status == SnapshotStatus::Complete).count(),
        "last_activity": format_ms(t.last_activity),
        "parent": t.lineage.as_ref().map(|l| &l.parent),
        "forked_from": t.lineage.as_ref().map(|l| serde_json::json!({
            "task": l.parent,
            "seq": l.parent_seq,
            "snapshot_id": l.snapshot,
            "at": format_ms(l.forked_at),
        })),
    })
}

/// Puts each task's `cost` (by task id) into the objects of a `tasks --json` listing, forks
/// (`--tree`'s `forks`) included.
pub fn add_costs(v: &mut serde_json::Value, costs: &BTreeMap<String, serde_json::Value>) {
    let Some(items) = v.as_array_mut() else {
        return;
    };
    for item in items {
        let id = item["task"].as_str().map(str::to_string);
        if let Some(cost) = id.and_then(|id| costs.get(&id)) {
            item["cost"] = cost.clone();
        }
        if let Some(forks) = item.get_mut("forks") {
            add_costs(forks, costs);
        }
    }
}

/// `show`'s one line of cost totals (from [`taskbox::engine::cost::ledger_json`]).
pub fn cost_line(cost: &serde_json::Value) -> String {
    let f = |k: &str| cost[k].as_f64().unwrap_or(0.0);
    let mut s = format!(
        "cost:        {} creation(s), sandbox time {:.4} h, {} snapshot byte(s) kept, {:.9} GB-months",
        cost["creations"],
        f("sandbox_hours"),
        cost["snapshot_bytes_kept"],
        f("snapshot_gb_months"),
    );
    if let Some(total) = cost["estimate_usd"]["total"].as_f64() {
        s.push_str(&format!(
            "; {:.6} vCPU-hours, {:.6} memory GB-hours; estimate at list price ${total:.6} (`taskbox cost` for more)",
            f("vcpu_hours"),
            f("memory_gb_hours"),
        ));
    }
    let r = &cost["resources"];
    if r.is_object() {
        s.push_str(&format!("\nresources:   {}", resources_text(r)));
        for g in r["generations"].as_array().into_iter().flatten() {
            s.push_str(&format!(
                "\n  g{:<4} {}{}",
                g["generation"],
                resources_text(g),
                if g["ended"] == true {
                    ""
                } else {
                    " (live, as last sampled)"
                }
            ));
        }
    }
    s
}

/// `cpu 0.41 s, peak memory 52.4 MB, io 0.0 MB` from [`cost_line`]'s figures, each `not
/// measured` where null.
fn resources_text(r: &serde_json::Value) -> String {
    let mb = |k: &str| {
        r[k].as_u64().map_or("not measured".to_string(), |b| {
            format!("{:.1} MB", b as f64 / 1e6)
        })
    };
    let cpu = r["cpu_seconds"]
        .as_f64()
        .map_or("not measured".to_string(), |s| format!("{s:.2} s"));
    format!(
        "cpu {cpu}, peak memory {}, io {}",
        mb("memory_peak_bytes"),
        mb("io_bytes")
    )
}

/// The tasks as a forest: each task once, its forks under it (a fork whose parent is not in
/// the store is a root). Roots and forks in store order.
fn forest(tasks: &[Task]) -> (Vec<&Task>, BTreeMap<&str, Vec<&Task>>) {
    let known: BTreeSet<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
    let mut roots = Vec::new();
    let mut forks: BTreeMap<&str, Vec<&Task>> = BTreeMap::new();
    for t in tasks {
        match t.lineage.as_ref().map(|l| l.parent.as_str()) {
            Some(p) if known.contains(p) && p != t.id.as_str() => {
                forks.entry(p).or_default().push(t)
            }
            _ => roots.push(t),
        }
    }
    (roots, forks)
}

/// `tasks --tree --json`: each root task's row with its forks nested under `forks`.
pub fn tasks_tree_json(tasks: &[Task], now: Millis, removed: &Removed) -> serde_json::Value {
    fn node(
        t: &Task,
        forks: &BTreeMap<&str, Vec<&Task>>,
        now: Millis,
        removed: &Removed,
    ) -> serde_json::Value {
        let mut v = task_json(t, now, removed);
        let children: Vec<_> = forks
            .get(t.id.as_str())
            .map(|c| c.iter().map(|c| node(c, forks, now, removed)).collect())
            .unwrap_or_default();
        v["forks"] = serde_json::Value::Array(children);
        v
    }
    let (roots, forks) = forest(tasks);
    serde_json::Value::Array(
        roots
            .iter()
            .map(|t| node(t, &forks, now, removed))
            .collect(),
    )
}

/// `tasks --tree`: forks indented under the task they were forked from, with the snapshot.
pub fn print_tasks_tree(tasks: &[Task], now: Millis, removed: &Removed) -> Result<(), Failure> {
    fn line(
        s: &mut String,
        t: &Task,
        depth: usize,
        forks: &BTreeMap<&str, Vec<&Task>>,
        now: Millis,
        removed: &Removed,
    ) {
        let (state, _) = shown_state(t, now, removed);
        let indent = if depth == 0 {
            String::new()
        } else {
            format!("{}└─ ", "   ".repeat(depth - 1))
        };
        let from = t
            .lineage
            .as_ref()
            .map(|l| format!("  (from {}.s{} {})", l.parent, l.parent_seq, l.snapshot))
            .unwrap_or_default();
        s.push_str(&format!("{indent}{}  {state}{from}\n", t.id));
        for c in forks.get(t.id.as_str()).into_iter().flatten() {
            line(s, c, depth + 1, forks, now, removed);
        }
    }
    if tasks.is_empty() {
        eprintln!("no tasks yet: `taskbox run --task NAME -- CMD` creates one");
        return Ok(());
    }
    let (roots, forks) = forest(tasks);
    let mut s = String::new();
    for t in roots {
        line(&mut s, t, 0, &forks, now, removed);
    }
    write_ignoring_broken_pipe(&mut std::io::stdout().lock(), s.as_bytes())
}

pub fn print_tasks(tasks: &[Task], now: Millis, removed: &Removed) -> Result<(), Failure> {
    let mut s = String::new();
    if tasks.is_empty() {
        eprintln!("no tasks yet: `taskbox run --task NAME -- CMD` creates one");
        return Ok(());
    }
    let w = tasks.iter().map(|t| t.id.len()).max().unwrap_or(4).max(4);
    let sw = tasks
        .iter()
        .filter_map(|t| t.sandbox.as_ref().map(|s| s.id.as_str().len()))
        .max()
        .unwrap_or(7)
        .max(7);
    s.push_str(&format!(
        "{:<w$}  {:<12}  {:<sw$}  SNAPSHOTS\n",
        "TASK", "STATE", "SANDBOX"
    ));
    let mut passed = Vec::new();
    for t in tasks {
        let sandbox = t.sandbox.as_ref().map_or("-", |s| s.id.as_str());
        let (state, overruled) = shown_state(t, now, removed);
        if overruled {
            passed.push(t);
        }
        s.push_str(&format!(
            "{:<w$}  {:<12}  {:<sw$}  {}\n",
            t.id,
            state,
            sandbox,
            snapshot_summary(t)
        ));
    }
    write_ignoring_broken_pipe(&mut std::io::stdout().lock(), s.as_bytes())?;
    for t in passed {
        let deadline = t.sandbox.as_ref().map_or(0, |s| s.deadline);
        eprintln!(
            "note: task {}'s sandbox passed its deadline at {} while it was recorded {}; the next command for it restores its latest snapshot",
            t.id,
            format_ms(deadline),
            t.state
        );
    }
    Ok(())
}

/// Field names whose integer values are times (ms since the epoch) in the task, journal, sandbox
/// and snapshot records.
const TIME_FIELDS: &[&str] = &[
    "at",
    "alive",
    "created_at",
    "deadline",
    "expires_at",
    "forked_at",
    "last_activity",
    "released_at",
    "removed_at",
    "retry_at",
    "started_at",
];

/// `value` with every time field written as RFC 3339 (as `tasks --json` writes them).
pub fn rfc3339_times(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                match v {
                    serde_json::Value::Number(n) if TIME_FIELDS.contains(&k.as_str()) => {
                        if let Some(ms) = n.as_u64() {
                            *v = serde_json::Value::String(format_ms(ms));
                        }
                    }
                    other => rfc3339_times(other),
                }
            }
        }
        serde_json::Value::Array(xs) => xs.iter_mut().for_each(rfc3339_times),
        _ => {}
    }
}

/// `show --json`: the task view with RFC 3339 times and no secrets.
pub fn view_json(v: &TaskView) -> Result<serde_json::Value, Failure> {
    let mut value = v
        .to_redacted_json()
        .map_err(|e| Failure::new(format!("cannot encode JSON: {e}")))?;
    rfc3339_times(&mut value);
    Ok(value)
}

pub fn print_view(v: &TaskView) -> Result<(), Failure> {
    let t = &v.task;
    let mut s = String::new();
    s.push_str(&format!("task:        {}\n", t.id));
    match v.marks.removed_at {
        Some(at) => s.push_str(&format!(
            "state:       removed at {} (was {})\n",
            format_ms(at),
            t.state
        )),
        None => s.push_str(&format!("state:       {}\n", t.state)),
    }
    if let Some(b) = &v.marks.backend {
        s.push_str(&format!("backend:     {b}\n"));
    }
    s.push_str(&format!("persistent:  {}\n", t.settings.persistent));
    if let Some(l) = &t.lineage {
        s.push_str(&format!(
            "forked from: {} at snapshot {}.s{} ({}), {}\n",
            l.parent,
            l.parent,
            l.parent_seq,
            l.snapshot,
            format_ms(l.forked_at)
        ));
    }
    match &t.sandbox {
        Some(sb) => s.push_str(&format!(
            "sandbox:     {} (generation {}, expires {})\n",
            sb.id,
            sb.generation,
            format_ms(sb.deadline)
        )),
        None => s.push_str("sandbox:     -\n"),
    }
    s.push_str("snapshots:\n");
    if t.snapshots.is_empty() {
        s.push_str("  (none)\n");
    }
    for snap in &t.snapshots {
        // What made it (journals from before kinds were recorded say nothing: `-`), and the
        // one a rewind restored while no newer snapshot holds the files.
        let kind = match (snap.kind, snap.taken_by) {
            (Some(k), _) => k.as_str(),
            (None, Some(taskbox::core::SnapshotTaker::Platform)) => "platform",
            (None, None) => "-",
        };
        let rewound = if snap.id.is_some() && snap.id == t.rewound_to {
            "  (rewound to)"
        } else {
            ""
        };
        s.push_str(&format!(
            "  #{:<3} {:<9} {:<24} {:>10} bytes  {}  {kind}{rewound}\n",
            snap.seq,
            snap.status.as_str(),
            snap.id.as_deref().unwrap_or("-"),
            snap.size_bytes,
            format_ms(snap.created_at.unwrap_or(snap.started_at)),
        ));
        // What the snapshot could not keep (everything else is in it).
        for what in &snap.omitted {
            s.push_str(&format!("       left out: {what}\n"));
        }
    }
    s.push_str("journal (latest last):\n");
    for e in &v.journal {
        let cmds: Vec<&str> = e.commands.iter().map(|c| c.name()).collect();
        s.push_str(&format!(
            "  {:>5}  {}  {:<18} {:>12} -> {:<12} {}\n",
            e.task_seq,
            format_ms(e.at),
            e.event.name(),
            e.state_before.as_str(),
            e.state_after.as_str(),
            cmds.join(", ")
        ));
        // The one outcome of a command the journal keeps beside its exit code that the line
        // above cannot show.
        if let Event::CommandExited {
            exit_code,
            memory_killed: true,
            ..
        } = &e.event
        {
            s.push_str(&format!(
                "         exit {exit_code}: the sandbox's memory limit killed a process of the \
                 command (terminal.container_memory)\n"
            ));
        }
    }
    write_ignoring_broken_pipe(&mut std::io::stdout().lock(), s.as_bytes())
}

pub fn print_gc(r: &GcReport) -> Result<(), Failure> {
    let verb = |done: &str, would: &str| {
        if r.dry_run {
            would.to_string()
        } else {
            done.to_string()
        }
    };
    if r.held_elsewhere {
        return write_ignoring_broken_pipe(
            &mut std::io::stdout().lock(),
            b"another server of the fleet is running gc for this installation now; nothing done\n",
        );
    }
    let mut s = String::new();
    let mut line = |what: String, i: &GcItem| {
        s.push_str(&format!(
            "{what} {} (task {}): {}\n",
            i.id,
            i.task_id.as_deref().unwrap_or("?"),
            i.reason
        ))
    };
    for i in &r.sandboxes_stopped {
        line(format!("{} sandbox", verb("stopped", "would stop")), i);
    }
    for i in &r.snapshots_deleted {
        line(format!("{} snapshot", verb("deleted", "would delete")), i);
    }
    for i in &r.skipped {
        line("skipped".to_string(), i);
    }
    if r.temporaries_removed > 0 {
        s.push_str(&format!(
            "removed {} leftover(s) of interrupted operations\n",
            r.temporaries_removed
        ));
    }
    for e in &r.errors {
        s.push_str(&format!("error: {e}\n"));
    }
    if s.is_empty() {
        s.push_str(
            "nothing to collect: every sandbox and snapshot of this installation is referenced\n",
        );
    }
    write_ignoring_broken_pipe(&mut std::io::stdout().lock(), s.as_bytes())
}
