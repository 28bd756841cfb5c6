//! The engine's metrics (`taskbox::engine::metrics`) on failures, which the live server test
//! (`server::metrics`) cannot provoke: a simulated platform that answers every call with a
//! server error makes the retry policy retry, and each failed call is counted by operation and
//! kind. The registry is the process's, shared with the tests running alongside: the checks
//! are on how much a counter moved at least.

use std::sync::Arc;
use std::time::Duration;

use taskbox::clock::TokioClock;
use taskbox::config::Config;
use taskbox::engine::Orchestrator;
use taskbox::provider::sim::{SimFaults, SimProvider};
use taskbox::retry::Jitter;
use taskbox::TaskId;

use crate::prom_text::{parse, Exposition};
use crate::support::paused_runtime;

fn scrape() -> Exposition {
    let text = taskbox::engine::metrics::global().render([], 0);
    parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn failed_calls_are_counted_by_kind_and_retries_counted() {
    paused_runtime().block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(TokioClock::starting_at(1_700_000_000_000));
        let sim = Arc::new(SimProvider::new(
            3,
            SimFaults {
                server_error: 1.0,
                ..SimFaults::none()
            },
            clock.clone(),
        ));
        let orch = Orchestrator::builder(dir.path().to_path_buf(), Config::default())
            .provider(sim.clone())
            .clock(clock.clone())
            .jitter(Jitter::None)
            .reconcile_on_start(false)
            .open()
            .await
            .expect("open orchestrator");
        let before = scrape();
        let task = TaskId::new("failing").expect("id");
        let err = orch
            .run(&task, "write f 1", None)
            .await
            .expect_err("every create fails");
        assert_eq!(err.code(), "create_failed", "{err}");
        let after = scrape();
        let moved = |name: &str, labels: &[(&str, &str)]| {
            after.value(name, labels) - before.value(name, labels)
        };
        let failed = moved(
            "taskbox_provider_errors_total",
            &[("operation", "create_sandbox"), ("kind", "transient")],
        );
        let retries = moved("taskbox_retries_total", &[]);
        assert!(failed >= 2.0, "{failed} failed creates counted");
        assert!(retries >= 1.0, "{retries} retries counted");
        assert!(
            moved(
                "taskbox_provider_calls_total",
                &[("operation", "create_sandbox")]
            ) >= failed
        );
        // The platform recovers: the next run creates a sandbox and runs its command.
        sim.set_faults(SimFaults::none());
        tokio::time::sleep(Duration::from_secs(1)).await;
        orch.run(&task, "write f 2", None).await.expect("run");
        let last = scrape();
        assert!(
            last.value("taskbox_commands_total", &[("outcome", "exited")])
                > after.value("taskbox_commands_total", &[("outcome", "exited")])
        );
        orch.shutdown().await;
    });
}
