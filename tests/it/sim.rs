//! The simulated platform driven through `dyn SandboxProvider`, the way the engine drives it: a
//! naive retrying client under heavy faults must never see two live sandboxes for one task nor
//! lose a file, and ten thousand tasks must fit in a moment of wall time.

use std::sync::Arc;
use std::time::Duration;

use crate::support::tid;
use taskbox::clock::{Clock, TokioClock};
use taskbox::core::FailureKind;
use taskbox::ids::SnapshotId;
use taskbox::provider::sim::{SimFaults, SimProvider};
use taskbox::provider::{sandbox_name, ExecRequest, ProviderError, SandboxProvider, SandboxSpec};

const T0: u64 = 1_700_000_000_000;
const INSTALLATION: &str = "inst-it";

fn spec(task: &str, generation: u64, source: Option<SnapshotId>) -> SandboxSpec {
    SandboxSpec {
        task_id: tid(task),
        generation,
        name: sandbox_name(INSTALLATION, task, generation),
        source_snapshot: source,
        timeout_ms: 600_000,
        installation_id: INSTALLATION.into(),
    }
}

/// Retries `op` while it fails transiently, sleeping at least the provider's retry-after hint.
async fn retry<T, F, Fut>(mut op: F) -> Result<T, ProviderError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ProviderError>>,
{
    let mut attempts = 0;
    loop {
        attempts += 1;
        match op().await {
            Err(e) if e.is_transient() && attempts < 100 => {
                let hint = match e.kind {
                    FailureKind::Transient { retry_after_ms } => retry_after_ms.unwrap_or(0),
                    _ => 0,
                };
                tokio::time::sleep(Duration::from_millis(hint.max(100))).await;
            }
            other => return other,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_retrying_client_under_faults_keeps_one_sandbox_per_task_and_every_file() {
    let faults = SimFaults::parse_list(
        "transient=0.3,lost_create=0.3,snapshot_fail_transient=0.2,snapshot_slow=0.1,\
         delete_fail=0.3,latency=1..100",
    )
    .expect("a valid fault list");
    let sim = Arc::new(SimProvider::new(
        2024,
        faults,
        Arc::new(TokioClock::starting_at(T0)),
    ));
    let provider: Arc<dyn SandboxProvider> = sim.clone();
    assert_eq!(provider.name(), "sim");

    let mut tasks = Vec::new();
    for t in 0..40 {
        let provider = Arc::clone(&provider);
        let sim = Arc::clone(&sim);
        tasks.push(tokio::spawn(async move {
            let task = tid(&format!("task-{t}"));
            let mut source: Option<SnapshotId> = None;
            for generation in 1..=4u64 {
                let sp = spec(&task, generation, source.clone());
                let sb = retry(|| provider.create_sandbox(&sp))
                    .await
                    .expect("create succeeds in the end");
                let live: Vec<_> = sim
                    .live_sandboxes()
                    .into_iter()
                    .filter(|s| s.task_id == task.as_str())
                    .collect();
                assert_eq!(live.len(), 1, "{task}: one live sandbox, got {live:?}");
                assert_eq!(live[0].id, sb.id);

                let req = ExecRequest {
                    command: format!("append log g{generation};"),
                    timeout_ms: 10_000,
                };
                let out = retry(|| provider.exec(&sb.id, &req)).await.expect("runs");
                assert_eq!(out.exit_code, 0);

                let snap = retry(|| provider.snapshot(&task, &sb.id, generation))
                    .await
                    .expect("snapshot succeeds in the end");
                if let Some(old) = source.replace(snap.id) {
                    retry(|| provider.delete_snapshot(&old))
                        .await
                        .expect("delete succeeds in the end");
                }
            }
            let sp = spec(&task, 5, source.clone());
            let sb = retry(|| provider.create_sandbox(&sp))
                .await
                .expect("restore");
            let cat = ExecRequest {
                command: "cat log".into(),
                timeout_ms: 10_000,
            };
            let out = retry(|| provider.exec(&sb.id, &cat)).await.expect("runs");
            // Every append ran exactly once: a failed exec never ran, and snapshots retried
            // under the same key returned the one already taken.
            assert_eq!(out.stdout, "g1g2g3g4", "{task}");
        }));
    }
    for t in tasks {
        t.await.expect("no task panicked");
    }

    let stats = sim.stats();
    for kind in [
        "rate_limit",
        "server_error",
        "timeout",
        "lost_create",
        "delete_fail",
    ] {
        assert!(
            stats.faults.get(kind).copied().unwrap_or(0) > 0,
            "{kind} was injected: {stats:?}"
        );
    }
    assert_eq!(sim.live_sandboxes().len(), 40);
    assert_eq!(stats.snapshots_taken, 40 * 4);
    assert_eq!(
        stats.sandboxes_created,
        40 * 5,
        "no create made a second sandbox"
    );
    let present = sim.snapshots().into_iter().filter(|s| s.present()).count();
    assert_eq!(present, 40, "superseded snapshots were deleted");

    let listed = retry(|| provider.list_snapshots(INSTALLATION))
        .await
        .expect("lists");
    assert_eq!(listed.iter().filter(|r| r.live).count(), 40);
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_tasks_run_in_virtual_time() {
    let clock = Arc::new(TokioClock::starting_at(T0));
    let faults = SimFaults::parse_list("latency=50..500").expect("valid");
    let sim = Arc::new(SimProvider::new(7, faults, clock.clone()));
    let wall = std::time::Instant::now();
    let mut tasks = Vec::with_capacity(10_000);
    for t in 0..10_000 {
        let sim = Arc::clone(&sim);
        tasks.push(tokio::spawn(async move {
            let task = tid(&format!("task-{t}"));
            let sb = sim
                .create_sandbox(&spec(&task, 1, None))
                .await
                .expect("create");
            let req = ExecRequest {
                command: format!("write id {t}; sleep 1000; cat id"),
                timeout_ms: 5_000,
            };
            let out = sim.exec(&sb.id, &req).await.expect("runs");
            assert_eq!(out.stdout, t.to_string());
            sim.snapshot(&task, &sb.id, 1).await.expect("snapshot");
        }));
    }
    for t in tasks {
        t.await.expect("no task panicked");
    }
    let virtual_ms = clock.now_ms() - T0;
    assert!(
        (1_150..=2_500).contains(&virtual_ms),
        "three calls and a one-second command each, run side by side: {virtual_ms} ms"
    );
    assert!(sim.live_sandboxes().is_empty());
    assert_eq!(sim.stats().snapshots_taken, 10_000);
    assert!(
        wall.elapsed() < Duration::from_secs(30),
        "10,000 tasks took {:?} of wall time",
        wall.elapsed()
    );
}
