//! The engine and the CLI on the `vercel_sandbox` backend, against the fake Vercel server over
//! real sockets: the first issue's session unchanged, two installations sharing one account,
//! and a burst of tasks under the creation bound.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};
use taskbox::clock::SystemClock;
use taskbox::config::Config;
use taskbox::engine::Orchestrator;
use taskbox::fake::{FakeOptions, FakeServer, Faults, RateLimitBurst};
use taskbox::provider::vercel::auth::Credentials;
use taskbox::provider::vercel::client::VercelClient;
use taskbox::provider::vercel::settings::VercelSettings;
use taskbox::provider::vercel::VercelProvider;
use taskbox::provider::{Decorator, ProviderFuture, SandboxInfo, SandboxProvider, SandboxSpec};
use taskbox::TaskId;

use crate::support::tid;
use crate::support::{ok, stderr, wait_for, Home};

pub(crate) fn vercel_config(url: &str) -> Config {
    let mut c = Config::default();
    c.terminal.backend = taskbox::provider::vercel::BACKEND.backend();
    c.terminal.container_cpu = 1;
    c.terminal.container_memory = 2048;
    c.terminal.vercel_api_url = url.to_string();
    c
}

fn provider(fake: &FakeServer, cfg: &Config) -> Arc<VercelProvider> {
    let client = VercelClient::new(
        &fake.base_url(),
        Credentials::access_token("tok", "team_t", "prj_t"),
        Arc::new(SystemClock),
    )
    .expect("client");
    let settings = VercelSettings::from_config(&cfg.terminal, &|_| None).expect("settings");
    Arc::new(VercelProvider::new(client, settings))
}

pub(crate) async fn start_fake(dir: &std::path::Path, faults: Faults) -> FakeServer {
    let mut opts = FakeOptions::new(dir.join("fake"));
    opts.faults = faults;
    opts.snapshot_settle_ms = 50;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    FakeServer::start(listener, opts)
        .await
        .expect("fake starts")
}

pub(crate) async fn open(dir: &std::path::Path, fake: &FakeServer, cfg: &Config) -> Orchestrator {
    Orchestrator::builder(dir.to_path_buf(), cfg.clone())
        .provider(provider(fake, cfg))
        .reconcile_on_start(false)
        .open()
        .await
        .expect("open")
}

/// Sandboxes listed on the platform, per installation tag.
async fn live_sandboxes(fake: &FakeServer, cfg: &Config, installation: &str) -> Vec<String> {
    provider(fake, cfg)
        .list_sandboxes(installation)
        .await
        .expect("list")
        .into_iter()
        .filter(|s| s.live)
        .map(|s| s.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_installations_share_one_account_and_gc_only_touches_its_own() {
    let dir = tempfile::tempdir().expect("dir");
    let fake = start_fake(dir.path(), Faults::default()).await;
    let cfg = vercel_config(&fake.base_url());
    let a = open(&dir.path().join("a"), &fake, &cfg).await;
    let b = open(&dir.path().join("b"), &fake, &cfg).await;
    assert_ne!(a.installation_id(), b.installation_id());
    let task = TaskId::new("demo").expect("id");
    // The same task id in both installations: two distinct sandboxes.
    a.run(&task, "echo from-a > f", None).await.expect("a runs");
    b.run(&task, "echo from-b > f", None).await.expect("b runs");
    assert_eq!(
        a.run(&task, "cat f", None).await.expect("a").stdout,
        "from-a\n"
    );
    assert_eq!(
        b.run(&task, "cat f", None).await.expect("b").stdout,
        "from-b\n"
    );

    // An orphan of A's: a sandbox created under A's tags that no task of A holds (as a crash
    // between create and journal would leave).
    let spec = taskbox::provider::SandboxSpec {
        task_id: tid("ghost"),
        generation: 1,
        name: taskbox::provider::sandbox_name(a.installation_id(), "ghost", 1),
        source_snapshot: None,
        timeout_ms: 300_000,
        installation_id: a.installation_id().to_string(),
    };
    let orphan = a
        .provider()
        .create_sandbox(&spec)
        .await
        .expect("orphan created")
        .id;
    assert_eq!(
        live_sandboxes(&fake, &cfg, a.installation_id()).await.len(),
        2
    );

    // B's gc sees nothing of A's.
    let rb = b.gc(false).await.expect("gc b");
    assert!(
        rb.sandboxes_stopped.is_empty() && rb.snapshots_deleted.is_empty(),
        "{rb:?}"
    );
    // A's gc stops exactly its orphan.
    let ra = a.gc(false).await.expect("gc a");
    let stopped: Vec<&str> = ra.sandboxes_stopped.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(stopped, vec![orphan.as_str()]);
    assert_eq!(
        live_sandboxes(&fake, &cfg, a.installation_id()).await.len(),
        1
    );
    assert_eq!(
        live_sandboxes(&fake, &cfg, b.installation_id()).await.len(),
        1
    );
    assert_eq!(
        b.run(&task, "cat f", None).await.expect("b").stdout,
        "from-b\n"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_100_tasks_completes_without_failures_or_duplicates() {
    let dir = tempfile::tempdir().expect("dir");
    // The platform answers a burst of 429s to creates; the engine backs off and retries.
    let faults = Faults {
        rate_limit: Some(RateLimitBurst {
            count: 20,
            retry_after_s: 1,
            endpoint: Some("create_sandbox".into()),
        }),
        latency_ms: 20,
        ..Faults::default()
    };
    let fake = start_fake(dir.path(), faults).await;
    let cfg = vercel_config(&fake.base_url());
    assert_eq!(cfg.terminal.max_concurrent_creates, 8);
    let counting = Arc::new(CountingCreates {
        inner: provider(&fake, &cfg),
        inflight: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
    });
    let orch = Orchestrator::builder(dir.path().join("data"), cfg.clone())
        .provider(counting.clone())
        .reconcile_on_start(false)
        .open()
        .await
        .expect("open");
    let mut jobs = Vec::new();
    for i in 0..100 {
        let orch = orch.clone();
        jobs.push(tokio::spawn(async move {
            let task = TaskId::new(&format!("burst-{i}")).expect("id");
            orch.run(&task, &format!("echo {i}"), None).await
        }));
    }
    let mut failures = Vec::new();
    for (i, j) in jobs.into_iter().enumerate() {
        match j.await.expect("join") {
            Ok(out) => assert_eq!(out.stdout, format!("{i}\n")),
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(failures.is_empty(), "failed tasks: {failures:?}");
    let live = live_sandboxes(&fake, &cfg, orch.installation_id()).await;
    assert_eq!(live.len(), 100, "one sandbox per task, no duplicates");
    let stats = fake.stats();
    assert!(stats.injected.rate_limited > 0, "the burst did hit 429s");
    let most = counting.most.load(Ordering::SeqCst);
    assert!(
        most <= 8,
        "at most terminal.max_concurrent_creates creations in flight, saw {most}"
    );
    assert!(most >= 2, "creations did overlap (saw {most})");
    orch.shutdown().await;
}

/// Delegates to a provider and records the most creations it ever saw in flight at once.
struct CountingCreates {
    inner: Arc<VercelProvider>,
    inflight: AtomicUsize,
    most: AtomicUsize,
}

impl Decorator for CountingCreates {
    fn inner(&self) -> &dyn SandboxProvider {
        &*self.inner
    }
    fn create_sandbox<'a>(&'a self, spec: &'a SandboxSpec) -> ProviderFuture<'a, SandboxInfo> {
        Box::pin(async move {
            let now = self.inflight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            let r = self.inner.create_sandbox(spec).await;
            self.inflight.fetch_sub(1, Ordering::SeqCst);
            r
        })
    }
}

pub struct FakeProcess {
    child: Child,
    pub url: String,
}

impl FakeProcess {
    /// Waits until the fake answers no API request (its `/_admin/stats`' `in_flight` is 0): a
    /// killed engine's last request may still be under way, and a command it asked for may start
    /// only after its caller died.
    pub fn wait_quiet(&self) {
        let stats = format!("{}/_admin/stats", self.url.trim_end_matches("/api"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let quiet = wait_for(Duration::from_secs(60), || {
            let v: serde_json::Value = rt.block_on(async {
                reqwest::Client::new()
                    .get(&stats)
                    .bearer_auth("tok")
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()
            })?;
            (v["in_flight"] == 0).then_some(())
        });
        quiet.expect("the fake's requests in flight end");
    }
}

impl Drop for FakeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `taskbox fake-vercel` as a process of its own (killed when dropped).
pub fn spawn_fake(home: &Home) -> FakeProcess {
    spawn_fake_with(home, &[])
}

/// [`spawn_fake`] with more `fake-vercel` flags.
pub fn spawn_fake_with(home: &Home, flags: &[&str]) -> FakeProcess {
    let mut child = home
        .cmd()
        .args(["fake-vercel", "--listen", "127.0.0.1:0"])
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fake-vercel");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the fake prints its URL");
    FakeProcess {
        child,
        url: line.trim().to_string(),
    }
}

/// The first issue's session works unchanged with `terminal.backend = vercel_sandbox`.
#[test]
fn the_cli_session_works_on_the_vercel_backend() {
    let home = Home::new();
    let fake = spawn_fake(&home);
    assert!(fake.url.starts_with("http://127.0.0.1:"), "{}", fake.url);
    ok(&home.run(&["config", "set", "terminal.backend", "vercel_sandbox"]));
    ok(&home.run(&["config", "set", "terminal.container_memory", "2048"]));
    ok(&home.run(&["config", "set", "terminal.vercel_api_url", &fake.url]));
    let env: BTreeMap<&str, &str> = [
        ("VERCEL_TOKEN", "tok"),
        ("VERCEL_TEAM_ID", "team_t"),
        ("VERCEL_PROJECT_ID", "prj_t"),
    ]
    .into();
    let run = |args: &[&str]| home.cmd().envs(&env).args(args).output().expect("taskbox");
    ok(&run(&[
        "run",
        "--task",
        "demo",
        "--",
        "bash",
        "-c",
        "echo hello > notes.txt; pwd",
    ]));
    assert_eq!(
        ok(&run(&["run", "--task", "demo", "--", "cat", "notes.txt"])),
        "hello\n"
    );
    ok(&run(&["suspend", "demo"]));
    let o = run(&["run", "--task", "demo", "--", "cat", "notes.txt"]);
    assert_eq!(ok(&o), "hello\n");
    assert!(
        stderr(&o).contains("recreated from snapshot snap_"),
        "{}",
        stderr(&o)
    );
    let o = run(&["run", "-t", "demo", "--timeout", "1", "--", "sleep 30"]);
    assert_eq!(o.status.code(), Some(124));
    assert_eq!(
        ok(&run(&["run", "-t", "demo", "--", "echo alive"])),
        "alive\n",
        "the sandbox survives a timeout"
    );
    let doctor = run(&["doctor"]);
    assert!(
        doctor.status.success(),
        "{}",
        String::from_utf8_lossy(&doctor.stdout)
    );
    // Secrets never reach output.
    for o in [&doctor, &run(&["show", "demo", "--json"])] {
        assert!(!String::from_utf8_lossy(&o.stdout).contains("tok\""));
    }
    // Without credentials: a clear error naming what is missing, exit 125.
    let o = home.run(&["run", "-t", "demo", "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("VERCEL_TOKEN"), "{}", stderr(&o));
}

/// A Vercel sandbox stopped before its deadline (the dashboard, a platform restart, out of
/// memory): the next command's run request is answered 410, so the command provably never
/// started. It runs on a restored sandbox, transparently, and the note says the sandbox was
/// recreated — instead of failing with "the sandbox expired while `cat f` was running".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_never_started_on_an_early_stopped_sandbox_runs_on_a_restored_one() {
    use taskbox::core::Notice;

    let dir = tempfile::tempdir().expect("temp dir");
    let fake = start_fake(dir.path(), Faults::default()).await;
    let cfg = vercel_config(&fake.base_url());
    let orch = open(dir.path(), &fake, &cfg).await;
    let task = TaskId::new("early").expect("task id");
    orch.run(&task, "echo v1 > f", None).await.expect("run");
    orch.suspend(&task).await.expect("suspend");
    let out = orch.run(&task, "cat f", None).await.expect("restore");
    assert_eq!(out.stdout, "v1\n");
    let session = crate::support::live_sandbox(&orch, &task).await;

    // The platform stops the session early, over the fake's admin endpoint.
    let resp = reqwest::Client::new()
        .post(format!("{}/expire-session/{session}", fake.admin_url()))
        .send()
        .await
        .expect("admin request");
    assert!(resp.status().is_success(), "{}", resp.status());

    let out = orch
        .run(&task, "cat f", None)
        .await
        .expect("the command runs on a restored sandbox");
    assert_eq!(out.exit_code, 0);
    assert_eq!(out.stdout, "v1\n");
    assert!(
        out.notices.iter().any(|n| matches!(
            n,
            Notice::Recreated {
                from_snapshot: Some(_),
                ..
            }
        )),
        "{:?}",
        out.notices
    );
    assert_ne!(crate::support::live_sandbox(&orch, &task).await, session);
    orch.shutdown().await;
}

/// An engine dies with a live persistent sandbox holding files newer than the task's last
/// snapshot, and the platform stops that sandbox (which snapshots itself). A gc before the
/// next command must not delete the platform's snapshot as retained by no task: the task's
/// recovery probe adopts it and the files come back as last written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_before_the_probe_keeps_the_platforms_snapshot_for_the_task_to_adopt() {
    let dir = tempfile::tempdir().expect("dir");
    let fake = start_fake(dir.path(), Faults::default()).await;
    let cfg = vercel_config(&fake.base_url());
    let task = TaskId::new("net").expect("id");
    let orch = open(dir.path(), &fake, &cfg).await;
    orch.run(&task, "echo v1 > f", None).await.expect("run");
    orch.suspend(&task).await.expect("suspend");
    orch.run(&task, "echo v2 > f", None).await.expect("run");
    let session = crate::support::live_sandbox(&orch, &task).await;
    // The engine dies; the platform stops the sandbox while none watches.
    orch.abort().await;
    drop(orch);
    let answer: serde_json::Value = reqwest::Client::new()
        .post(format!(
            "{}/v2/sandboxes/sessions/{session}/stop?teamId=team_t",
            fake.base_url()
        ))
        .bearer_auth("tok")
        .send()
        .await
        .expect("stop")
        .json()
        .await
        .expect("the stop answer");
    let platform = answer["snapshot"]["id"]
        .as_str()
        .expect("a persistent sandbox snapshots itself as it stops")
        .to_string();

    let orch = open(dir.path(), &fake, &cfg).await;
    let report = orch.gc(false).await.expect("gc");
    assert!(
        report.snapshots_deleted.iter().all(|i| i.id != platform),
        "{report:?}"
    );
    let out = orch.run(&task, "cat f", None).await.expect("run");
    assert_eq!(out.stdout, "v2\n");
    let view = orch.show(&task, 0).await.expect("show").expect("the task");
    let latest = view.task.latest_complete().expect("a snapshot").clone();
    assert_eq!(latest.id.as_deref(), Some(platform.as_str()));
    assert_eq!(
        latest.taken_by,
        Some(taskbox::core::SnapshotTaker::Platform)
    );
}
