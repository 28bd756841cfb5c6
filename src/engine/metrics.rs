//! The process's Prometheus metrics (`GET /metrics`, written down one line per metric in
//! `docs/metrics.md`): counters and histograms the engine bumps where things happen, and the
//! text format they are rendered in.
//!
//! One registry per process ([`global`]), as Prometheus clients have it: every orchestrator of
//! the process counts into it (a server has one). Every child of a labelled metric is made
//! once, up front, and kept in an array indexed by its label, so that recording is an atomic
//! add or two — no lock and no map lookup on the per-command path. What is only known by
//! looking (tasks by state, open sandboxes) is set by the caller at each scrape
//! ([`Metrics::render`]).
//!
//! It knows the core's events (to classify a provider call's outcome); the engine's loop, its
//! calls and its leases record into it, the server renders it.

use std::sync::LazyLock;

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::core::{Event, FailureKind, TaskState};

/// The provider operations, as [`Call::name`](crate::provider::Call::name) names them: the
/// values of the `operation` label.
pub const OPERATIONS: [&str; 8] = [
    "create_sandbox",
    "exec",
    "snapshot",
    "stop_sandbox",
    "extend_timeout",
    "delete_snapshot",
    "probe_sandbox",
    "read_usage",
];

/// The values of the `kind` label of a provider error: how the failure was classified.
pub const ERROR_KINDS: [&str; 6] = [
    "transient",
    "sandbox_gone",
    "snapshot_gone",
    "auth",
    "invalid",
    "permanent",
];

/// The values of the `outcome` label of `taskbox_commands_total`.
const COMMAND_OUTCOMES: [&str; 4] = ["exited", "timed_out", "failed", "not_started"];

/// Every task state, the values of `taskbox_tasks`'s `state` label.
const STATES: [TaskState; 6] = [
    TaskState::Idle,
    TaskState::Provisioning,
    TaskState::Running,
    TaskState::Snapshotting,
    TaskState::Expired,
    TaskState::Restoring,
];

/// Seconds, for a command or a provider call: 5 ms to half an hour.
const CALL_BUCKETS: [f64; 15] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
];

/// Seconds, for a store commit: 100 µs to a second.
const COMMIT_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The process's metrics; see the [module docs](self).
pub struct Metrics {
    registry: Registry,
    tasks: IntGaugeVec,
    sandboxes_open: IntGauge,
    commands: [IntCounter; COMMAND_OUTCOMES.len()],
    command_seconds: Histogram,
    calls: [IntCounter; OPERATIONS.len()],
    call_seconds: [Histogram; OPERATIONS.len()],
    errors: [[IntCounter; ERROR_KINDS.len()]; OPERATIONS.len()],
    retries: IntCounter,
    snapshots_taken: IntCounter,
    snapshot_bytes: IntCounter,
    snapshot_seconds: Histogram,
    restores: IntCounter,
    restore_bytes: IntCounter,
    restore_seconds: Histogram,
    commit_seconds: Histogram,
    commit_transitions: IntCounter,
    commit_failures: IntCounter,
    leases_held: IntGauge,
    leases_acquired: IntCounter,
    leases_lost: IntCounter,
}

/// The process's metrics.
pub fn global() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

/// Registers `m` in `r`. The names are this file's constants, each registered once: a
/// failure is a bug here.
fn register<M: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: M) -> M {
    r.register(Box::new(m.clone()))
        .expect("each metric's name is registered once");
    m
}

fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    register(
        r,
        IntCounter::new(name, help).expect("a valid metric name and help"),
    )
}

fn histogram(r: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(
        r,
        Histogram::with_opts(opts).expect("a valid metric name and buckets"),
    )
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    register(
        r,
        IntGauge::new(name, help).expect("a valid metric name and help"),
    )
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        r,
        IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric name and labels"),
    )
}

impl Metrics {
    fn new() -> Metrics {
        let r = Registry::new();
        let tasks = register(
            &r,
            IntGaugeVec::new(
                Opts::new(
                    "taskbox_tasks",
                    "Tasks by state (every task of the store, read at the scrape).",
                ),
                &["state"],
            )
            .expect("a valid metric name and labels"),
        );
        let commands = counter_vec(
            &r,
            "taskbox_commands_total",
            "Commands run in sandboxes, by outcome (exited, timed_out, failed, not_started).",
            &["outcome"],
        );
        let calls = counter_vec(
            &r,
            "taskbox_provider_calls_total",
            "Provider calls made, by operation.",
            &["operation"],
        );
        let errors = counter_vec(
            &r,
            "taskbox_provider_errors_total",
            "Provider calls that failed, by operation and by the kind the failure was classified as.",
            &["operation", "kind"],
        );
        let call_seconds = register(
            &r,
            prometheus::HistogramVec::new(
                HistogramOpts::new(
                    "taskbox_provider_call_duration_seconds",
                    "How long provider calls took, by operation.",
                )
                .buckets(CALL_BUCKETS.to_vec()),
                &["operation"],
            )
            .expect("a valid metric name, labels and buckets"),
        );
        Metrics {
            sandboxes_open: gauge(
                &r,
                "taskbox_sandboxes_open",
                "Sandboxes live now (tasks loaded with a sandbox, read at the scrape).",
            ),
            commands: COMMAND_OUTCOMES.map(|o| commands.with_label_values(&[o])),
            command_seconds: histogram(
                &r,
                "taskbox_command_duration_seconds",
                "How long the commands that ran took, in their sandbox.",
                &CALL_BUCKETS,
            ),
            calls: OPERATIONS.map(|op| calls.with_label_values(&[op])),
            call_seconds: OPERATIONS.map(|op| call_seconds.with_label_values(&[op])),
            errors: OPERATIONS.map(|op| ERROR_KINDS.map(|k| errors.with_label_values(&[op, k]))),
            retries: counter(
                &r,
                "taskbox_retries_total",
                "Retries of a failed provider operation scheduled by the retry policy.",
            ),
            snapshots_taken: counter(&r, "taskbox_snapshots_taken_total", "Snapshots taken."),
            snapshot_bytes: counter(
                &r,
                "taskbox_snapshot_bytes_total",
                "Bytes of the snapshots taken, as the provider reported their sizes.",
            ),
            snapshot_seconds: histogram(
                &r,
                "taskbox_snapshot_duration_seconds",
                "How long taking a snapshot took (the snapshot call, stopping the sandbox).",
                &CALL_BUCKETS,
            ),
            restores: counter(
                &r,
                "taskbox_snapshots_restored_total",
                "Sandboxes created from a snapshot.",
            ),
            restore_bytes: counter(
                &r,
                "taskbox_restore_bytes_total",
                "Bytes of the snapshots restored, as recorded when they were taken.",
            ),
            restore_seconds: histogram(
                &r,
                "taskbox_restore_duration_seconds",
                "How long creating a sandbox from a snapshot took.",
                &CALL_BUCKETS,
            ),
            commit_seconds: histogram(
                &r,
                "taskbox_store_commit_duration_seconds",
                "How long a commit of the journal took (one batch of transitions, or one alone).",
                &COMMIT_BUCKETS,
            ),
            commit_transitions: counter(
                &r,
                "taskbox_store_transitions_total",
                "Transitions committed to the journal.",
            ),
            commit_failures: counter(
                &r,
                "taskbox_store_commit_failures_total",
                "Commits of the journal that failed.",
            ),
            leases_held: gauge(
                &r,
                "taskbox_leases_held",
                "Task leases this server holds (a fleet on PostgreSQL; 0 on SQLite).",
            ),
            leases_acquired: counter(
                &r,
                "taskbox_leases_acquired_total",
                "Task leases this server took (free, expired or taken over from a dead server).",
            ),
            leases_lost: counter(
                &r,
                "taskbox_leases_lost_total",
                "Task leases another server took over from this one.",
            ),
            tasks,
            registry: r,
        }
    }

    /// A provider call `operation` ([`OPERATIONS`]) answered `outcome` after `secs`;
    /// `restored_bytes` is the size of the snapshot a `create_sandbox` restored (`None`: a fresh
    /// sandbox).
    pub fn call_done(
        &self,
        operation: &str,
        outcome: &Event,
        secs: f64,
        restored_bytes: Option<u64>,
    ) {
        let Some(op) = OPERATIONS.iter().position(|o| *o == operation) else {
            return;
        };
        self.calls[op].inc();
        self.call_seconds[op].observe(secs);
        match outcome {
            Event::CommandExited { timed_out, .. } => {
                self.commands[usize::from(*timed_out)].inc();
                self.command_seconds.observe(secs);
            }
            Event::CommandFailed { .. } => self.commands[2].inc(),
            Event::CommandNotStarted { .. } => self.commands[3].inc(),
            Event::SnapshotTaken { size_bytes, .. } => {
                self.snapshots_taken.inc();
                self.snapshot_bytes.inc_by(*size_bytes);
                self.snapshot_seconds.observe(secs);
            }
            Event::SandboxReady { .. } => {
                if let Some(bytes) = restored_bytes {
                    self.restores.inc();
                    self.restore_bytes.inc_by(bytes);
                    self.restore_seconds.observe(secs);
                }
            }
            _ => {}
        }
        if let Some(kind) = failure_kind(outcome) {
            self.errors[op][kind].inc();
        }
    }

    /// The retry policy scheduled another attempt of a failed operation.
    pub fn retry_scheduled(&self) {
        self.retries.inc();
    }

    /// A commit of `transitions` transitions took `secs`, and `ok` says whether it landed.
    pub fn commit_done(&self, secs: f64, transitions: usize, ok: bool) {
        self.commit_seconds.observe(secs);
        if ok {
            self.commit_transitions.inc_by(transitions as u64);
        } else {
            self.commit_failures.inc();
        }
    }

    /// This server took a task's lease; it now holds `held`.
    pub fn lease_acquired(&self, held: usize) {
        self.leases_acquired.inc();
        self.leases_held.set(held as i64);
    }

    /// Another server took over one of this server's leases; it now holds `held`.
    pub fn lease_lost(&self, held: usize) {
        self.leases_lost.inc();
        self.leases_held.set(held as i64);
    }

    /// This server now holds `held` leases (one let go, or all at a stop).
    pub fn leases_held(&self, held: usize) {
        self.leases_held.set(held as i64);
    }

    /// The text format (version 0.0.4) of every metric, with what is read at the scrape:
    /// the state of each task in `states`, and `open_sandboxes`.
    pub fn render(
        &self,
        states: impl IntoIterator<Item = TaskState>,
        open_sandboxes: usize,
    ) -> String {
        let mut counts = [0i64; STATES.len()];
        for s in states {
            if let Some(i) = STATES.iter().position(|x| *x == s) {
                counts[i] += 1;
            }
        }
        for (s, n) in STATES.iter().zip(counts) {
            self.tasks.with_label_values(&[s.as_str()]).set(n);
        }
        self.sandboxes_open.set(open_sandboxes as i64);
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("the text encoder writes to memory");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The index in [`ERROR_KINDS`] of the failure an outcome carries, if it is one.
fn failure_kind(outcome: &Event) -> Option<usize> {
    let failure = match outcome {
        Event::CreateFailed { failure, .. }
        | Event::CommandFailed { failure, .. }
        | Event::CommandNotStarted { failure, .. }
        | Event::SnapshotFailed { failure, .. }
        | Event::StopFailed { failure, .. }
        | Event::ExtendFailed { failure, .. }
        | Event::DeleteFailed { failure, .. }
        | Event::ProbeFailed { failure, .. } => failure,
        _ => return None,
    };
    Some(match failure.kind {
        FailureKind::Transient { .. } => 0,
        FailureKind::SandboxGone => 1,
        FailureKind::SnapshotGone => 2,
        FailureKind::Auth => 3,
        FailureKind::Invalid => 4,
        FailureKind::Permanent => 5,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Failure;

    /// A labelled child is made for every operation and kind, so the arrays and the label
    /// lists cannot drift: every combination renders.
    #[test]
    fn every_label_renders() {
        let m = Metrics::new();
        m.call_done(
            "exec",
            &Event::CommandFailed {
                request_id: 1,
                failure: Failure::new(FailureKind::Auth, "no"),
            },
            0.1,
            None,
        );
        let text = m.render([TaskState::Running, TaskState::Running], 1);
        assert!(
            text.contains("taskbox_provider_errors_total{kind=\"auth\",operation=\"exec\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("taskbox_commands_total{outcome=\"failed\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("taskbox_tasks{state=\"running\"} 2"),
            "{text}"
        );
        assert!(text.contains("taskbox_sandboxes_open 1"), "{text}");
        for op in OPERATIONS {
            for k in ERROR_KINDS {
                let line =
                    format!("taskbox_provider_errors_total{{kind=\"{k}\",operation=\"{op}\"}}");
                assert!(text.contains(&line), "{line} missing");
            }
        }
    }
}
