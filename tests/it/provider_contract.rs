//! The provider contract: the promises every sandbox provider makes to the engine, written once
//! (each promise is a function generic over a [`Subject`], a provider with the means to drive
//! it) and run against every provider: the local one (real processes and files, a manual
//! clock), the simulated one (paused virtual time, no faults unless a promise plants one) and
//! the Vercel one over real HTTP against the in-process fake Vercel server.
//!
//! A new provider implements [`Subject`] and adds one line to the `contract!` invocation at the
//! bottom; every promise then runs against it.

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use taskbox::chaos::PlantedBug;
use taskbox::clock::{Clock, SystemClock, TokioClock};
use taskbox::config::Config;
use taskbox::core::{FailureKind, Millis};
use taskbox::fake::{DropCreate, DropMode, FakeOptions, FakeServer, Faults};
use taskbox::ids::{SandboxId, SnapshotId};
use taskbox::provider::local::isolation::Settings;
use taskbox::provider::local::LocalProvider;
use taskbox::provider::sim::{SimFaults, SimProvider};
use taskbox::provider::vercel::auth::Credentials;
use taskbox::provider::vercel::client::VercelClient;
use taskbox::provider::vercel::exec::ExecOptions;
use taskbox::provider::vercel::settings::VercelSettings;
use taskbox::provider::vercel::{ProviderOptions, VercelProvider};
use taskbox::provider::{
    sandbox_name, ExecOutput, ExecRequest, ProviderError, SandboxInfo, SandboxProvider, SandboxSpec,
};

use crate::support::{paused_runtime, tid, ManualClock};

const INSTALLATION: &str = "contract";
const START_MS: Millis = 1_700_000_000_000;

/// A provider under contract, with what the promises need to drive it: the command language
/// its sandboxes speak, a way to let time pass, and a way to lose an answer.
trait Subject: Sized + 'static {
    /// Builds the subject (in the runtime it needs) and runs `promise` against it.
    fn run<F, Fut>(promise: F)
    where
        F: FnOnce(Self) -> Fut,
        Fut: Future<Output = ()>;

    /// The provider.
    fn provider(&self) -> &dyn SandboxProvider;

    /// The provider's clock.
    fn now(&self) -> Millis;

    /// Lets `ms` of the provider's time pass.
    fn pass(&self, ms: u64) -> impl Future<Output = ()>;

    /// A command that sets `path` (relative to the working directory, in a directory that may
    /// not exist yet) to exactly `content` (one word). The default speaks `bash -c`, as local
    /// and Vercel sandboxes do.
    fn write(path: &str, content: &str) -> String {
        let path = plain(path);
        format!(
            "mkdir -p \"$(dirname {path})\" && printf %s {} > {path}",
            plain(content)
        )
    }

    /// A command that prints `path` exactly, failing if it does not exist.
    fn cat(path: &str) -> String {
        format!("cat {}", plain(path))
    }

    /// A command that removes `path`.
    fn rm(path: &str) -> String {
        format!("rm {}", plain(path))
    }

    /// A command that sets `marker` and then runs for 30 s.
    fn long(marker: &str) -> String {
        format!("touch {}; sleep 30", plain(marker))
    }

    /// Makes the platform lose the answer of the next create after making the sandbox; `false`
    /// if it has no answers to lose (the local provider's calls are function calls).
    fn lose_next_create(&self) -> bool;

    /// Undoes [`Subject::lose_next_create`].
    fn heal(&self);
}

// ---------------------------------------------------------------------------------------------
// The promises

fn spec(task: &str, generation: u64, source: Option<&SnapshotId>, timeout_ms: u64) -> SandboxSpec {
    SandboxSpec::new(
        INSTALLATION,
        &tid(task),
        generation,
        source.cloned(),
        timeout_ms,
    )
}

async fn create<S: Subject>(
    s: &S,
    task: &str,
    generation: u64,
    source: Option<&SnapshotId>,
) -> SandboxInfo {
    s.provider()
        .create_sandbox(&spec(task, generation, source, 600_000))
        .await
        .unwrap_or_else(|e| panic!("create {task} g{generation}: {e}"))
}

async fn try_run<S: Subject>(
    s: &S,
    sandbox: &SandboxId,
    command: &str,
) -> Result<ExecOutput, ProviderError> {
    let req = ExecRequest {
        command: command.to_string(),
        timeout_ms: 60_000,
    };
    s.provider().exec(sandbox, &req).await
}

async fn run<S: Subject>(s: &S, sandbox: &SandboxId, command: &str) -> ExecOutput {
    let out = try_run(s, sandbox, command)
        .await
        .unwrap_or_else(|e| panic!("`{command}`: {e}"));
    assert_eq!(out.exit_code, 0, "`{command}`: {out:?}");
    out
}

/// The file's content, or `None` if reading it fails.
async fn read<S: Subject>(s: &S, sandbox: &SandboxId, path: &str) -> Option<String> {
    let out = try_run(s, sandbox, &S::cat(path))
        .await
        .unwrap_or_else(|e| panic!("cat {path}: {e}"));
    (out.exit_code == 0).then_some(out.stdout)
}

/// `call`'s answer once its transient answers are retried (bounded, letting time pass between),
/// as the engine retries them.
async fn settled<S: Subject, T, F, Fut>(s: &S, mut call: F) -> Result<T, ProviderError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ProviderError>>,
{
    for _ in 0..50 {
        match call().await {
            Err(e) if e.is_transient() => s.pass(200).await,
            answer => return answer,
        }
    }
    call().await
}

fn kind_of<T: std::fmt::Debug>(what: &str, result: Result<T, ProviderError>) -> ProviderError {
    match result {
        Err(e) => e,
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
    }
}

/// Creating by the same name twice finds the first sandbox; another generation is another
/// sandbox; the listing shows each once.
async fn create_is_idempotent_by_name<S: Subject>(s: S) {
    let first = create(&s, "idem", 1, None).await;
    assert_eq!(first.name, sandbox_name(INSTALLATION, "idem", 1));
    run(&s, &first.id, &S::write("kept", "one")).await;
    let again = create(&s, "idem", 1, None).await;
    assert_eq!(again.id, first.id, "a second create by the same name");
    assert_eq!(
        read(&s, &again.id, "kept").await.as_deref(),
        Some("one"),
        "the second create found the first sandbox, files and all"
    );
    let other = create(&s, "idem", 2, None).await;
    assert_ne!(other.id, first.id, "another generation is another sandbox");
    let listed = s.provider().list_sandboxes(INSTALLATION).await.unwrap();
    for id in [&first.id, &other.id] {
        let n = listed.iter().filter(|r| r.id == id.as_str()).count();
        assert_eq!(n, 1, "{id} listed once: {listed:?}");
    }
    assert!(listed
        .iter()
        .filter(|r| r.id == first.id.as_str())
        .all(|r| r.live && r.task_id.as_deref() == Some("idem")));
}

/// A create whose answer was lost is retryable (or recovered inside the provider), and its
/// retry finds the sandbox it made: one sandbox, not two.
async fn a_lost_create_is_retryable_and_makes_one_sandbox<S: Subject>(s: S) {
    if !s.lose_next_create() {
        return;
    }
    let sp = spec("lost", 1, None, 600_000);
    let mut transient = 0;
    let info = loop {
        match s.provider().create_sandbox(&sp).await {
            Ok(info) => break info,
            Err(e) => {
                assert!(e.is_transient(), "a lost answer is retryable: {e}");
                transient += 1;
                assert!(
                    transient < 5,
                    "still failing after {transient} retries: {e}"
                );
                s.heal();
            }
        }
    };
    let listed = s.provider().list_sandboxes(INSTALLATION).await.unwrap();
    let mine: Vec<_> = listed
        .iter()
        .filter(|r| r.task_id.as_deref() == Some("lost") && r.live)
        .collect();
    assert_eq!(mine.len(), 1, "one sandbox for the task: {listed:?}");
    assert_eq!(mine[0].id, info.id.as_str());
    run(&s, &info.id, &S::write("f", "ok")).await;
}

/// A running sandbox probes as running until its deadline; a stopped one probes as gone, and
/// stopping it again succeeds.
async fn probe_after_stop_says_gone<S: Subject>(s: S) {
    let sb = create(&s, "probe", 1, None).await;
    assert_eq!(
        s.provider().probe_sandbox(&sb.id).await.unwrap(),
        Some(sb.deadline),
        "a running sandbox probes with its deadline"
    );
    s.provider().stop_sandbox(&sb.id).await.unwrap();
    assert_eq!(s.provider().probe_sandbox(&sb.id).await.unwrap(), None);
    s.provider()
        .stop_sandbox(&sb.id)
        .await
        .expect("stopping a stopped sandbox succeeds");
    assert_eq!(s.provider().probe_sandbox(&sb.id).await.unwrap(), None);
}

/// A snapshot holds exactly the files the sandbox had (written, overwritten, removed, nested),
/// a second snapshot call with the same key returns the same snapshot, and a sandbox restored
/// from it has exactly those files.
async fn snapshot_then_restore_is_exact<S: Subject>(s: S) {
    let task = tid("exact");
    let sb = create(&s, "exact", 1, None).await;
    run(&s, &sb.id, &S::write("a", "first")).await;
    run(&s, &sb.id, &S::write("a", "second")).await;
    run(&s, &sb.id, &S::write("dir/deep/b", "nested")).await;
    run(&s, &sb.id, &S::write("gone", "soon")).await;
    run(&s, &sb.id, &S::rm("gone")).await;
    let snap = s.provider().snapshot(&task, &sb.id, 1).await.unwrap();
    assert_eq!(
        s.provider().probe_sandbox(&sb.id).await.unwrap(),
        None,
        "a snapshot stops its sandbox"
    );
    let again = s.provider().snapshot(&task, &sb.id, 1).await.unwrap();
    assert_eq!(again.id, snap.id, "a snapshot is idempotent by (task, seq)");

    let restored = create(&s, "exact", 2, Some(&snap.id)).await;
    assert_ne!(restored.id, sb.id);
    assert_eq!(read(&s, &restored.id, "a").await.as_deref(), Some("second"));
    assert_eq!(
        read(&s, &restored.id, "dir/deep/b").await.as_deref(),
        Some("nested")
    );
    assert_eq!(
        read(&s, &restored.id, "gone").await,
        None,
        "a removed file stays removed"
    );

    // A later snapshot of the restored sandbox holds its later files, and the first snapshot
    // still holds the first ones.
    run(&s, &restored.id, &S::write("a", "third")).await;
    let later = s.provider().snapshot(&task, &restored.id, 2).await.unwrap();
    assert_ne!(later.id, snap.id);
    let from_later = create(&s, "exact", 3, Some(&later.id)).await;
    assert_eq!(
        read(&s, &from_later.id, "a").await.as_deref(),
        Some("third")
    );
    let from_first = create(&s, "exact", 4, Some(&snap.id)).await;
    assert_eq!(
        read(&s, &from_first.id, "a").await.as_deref(),
        Some("second")
    );
}

/// Stopping a sandbox ends the command running in it, at once: the stop is not a polite wait
/// for the command to finish.
async fn a_stop_kills_what_runs<S: Subject>(s: S) {
    let sb = create(&s, "kill", 1, None).await;
    let provider = s.provider();
    let long = S::long("started");
    let running = try_run(&s, &sb.id, &long);
    let stop = async {
        // Wait (bounded) until the command has started.
        let mut polls = 0;
        while read(&s, &sb.id, "started").await.is_none() {
            polls += 1;
            assert!(polls < 500, "the long command never started");
            s.pass(20).await;
        }
        provider.stop_sandbox(&sb.id).await.unwrap();
    };
    let (result, ()) = tokio::join!(tokio::time::timeout(Duration::from_secs(15), running), stop);
    let result = result.expect("the command ended well before its 30 s were up");
    match result {
        Err(e) => {
            assert_eq!(e.kind, FailureKind::SandboxGone, "{e}");
            assert!(!e.not_started, "it had started: {e}");
        }
        Ok(out) => assert_ne!(
            out.exit_code, 0,
            "a killed command did not succeed: {out:?}"
        ),
    }
    let after = kind_of(
        "exec after stop",
        try_run(&s, &sb.id, &S::cat("started")).await,
    );
    assert_eq!(after.kind, FailureKind::SandboxGone, "{after}");
    assert_eq!(provider.probe_sandbox(&sb.id).await.unwrap(), None);
}

/// "Gone" is its own answer, never a retryable one: a command in a stopped sandbox (refused
/// before it started), a restore from a deleted snapshot. Deleting twice succeeds.
async fn gone_is_not_retryable<S: Subject>(s: S) {
    let task = tid("gone");
    let sb = create(&s, "gone", 1, None).await;
    run(&s, &sb.id, &S::write("f", "x")).await;
    let snap = s.provider().snapshot(&task, &sb.id, 1).await.unwrap();

    // A platform may still be settling the stop (Vercel: "being snapshotted and stopping"), a
    // retryable answer; once settled, the answer is "gone".
    let exec = kind_of(
        "exec in a stopped sandbox",
        settled(&s, || try_run(&s, &sb.id, "true")).await,
    );
    assert_eq!(exec.kind, FailureKind::SandboxGone, "{exec}");
    assert!(
        exec.not_started,
        "a refused command provably never ran: {exec}"
    );

    s.provider().delete_snapshot(&snap.id).await.unwrap();
    s.provider()
        .delete_snapshot(&snap.id)
        .await
        .expect("deleting a deleted snapshot succeeds");
    let restore = kind_of(
        "restore from a deleted snapshot",
        s.provider()
            .create_sandbox(&spec("gone", 2, Some(&snap.id), 600_000))
            .await,
    );
    assert_eq!(restore.kind, FailureKind::SnapshotGone, "{restore}");
    assert!(!restore.is_transient());
}

/// A sandbox's deadline is its creation plus its timeout; extending moves it; past it, the
/// sandbox probes as gone and runs nothing.
async fn deadlines_hold<S: Subject>(s: S) {
    const TIMEOUT_MS: u64 = 1_000;
    const SLACK_MS: u64 = 1_000;
    let before = s.now();
    let sb = s
        .provider()
        .create_sandbox(&spec("deadline", 1, None, TIMEOUT_MS))
        .await
        .unwrap();
    let after = s.now();
    assert!(
        sb.deadline + SLACK_MS >= before + TIMEOUT_MS
            && sb.deadline <= after + TIMEOUT_MS + SLACK_MS,
        "deadline {} is creation ({before}..{after}) + {TIMEOUT_MS} ms",
        sb.deadline
    );
    let extended = s.provider().extend_timeout(&sb.id, 1_000).await.unwrap();
    assert!(
        extended > sb.deadline,
        "extending moved {} to {extended}",
        sb.deadline
    );
    assert_eq!(
        s.provider().probe_sandbox(&sb.id).await.unwrap(),
        Some(extended)
    );
    run(&s, &sb.id, &S::write("f", "before")).await;
    s.pass(extended.saturating_sub(s.now()) + 1_500).await;
    assert_eq!(
        s.provider().probe_sandbox(&sb.id).await.unwrap(),
        None,
        "past its deadline a sandbox probes as gone"
    );
    let late = kind_of("exec past the deadline", try_run(&s, &sb.id, "true").await);
    assert_eq!(late.kind, FailureKind::SandboxGone, "{late}");
}

/// A sandbox of another task created from a snapshot starts with the snapshot's files; what it
/// changes is its own, and the snapshot is unchanged.
async fn a_fork_starts_from_the_snapshot<S: Subject>(s: S) {
    let parent = create(&s, "parent", 1, None).await;
    run(&s, &parent.id, &S::write("shared", "from-parent")).await;
    let snap = s
        .provider()
        .snapshot(&tid("parent"), &parent.id, 1)
        .await
        .unwrap();

    let child = create(&s, "child", 1, Some(&snap.id)).await;
    assert_eq!(
        read(&s, &child.id, "shared").await.as_deref(),
        Some("from-parent")
    );
    run(&s, &child.id, &S::write("shared", "from-child")).await;
    let child_snap = s
        .provider()
        .snapshot(&tid("child"), &child.id, 1)
        .await
        .unwrap();
    assert_ne!(child_snap.id, snap.id);

    let parent_again = create(&s, "parent", 2, Some(&snap.id)).await;
    assert_eq!(
        read(&s, &parent_again.id, "shared").await.as_deref(),
        Some("from-parent"),
        "the fork's change did not reach the parent's snapshot"
    );
    let child_again = create(&s, "child", 2, Some(&child_snap.id)).await;
    assert_eq!(
        read(&s, &child_again.id, "shared").await.as_deref(),
        Some("from-child")
    );
}

// ---------------------------------------------------------------------------------------------
// The subjects

/// A word the tests' commands use as it is: no quoting needed in `bash` or the sim's language.
fn plain(word: &str) -> &str {
    assert!(
        word.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c)),
        "a plain word: {word}"
    );
    word
}

/// A runtime on real time with two workers, for providers of real processes and sockets.
fn real_time_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The local provider: real processes and files under a temporary data dir, on a manual clock;
/// unisolated (the bare `LocalProvider::new`).
struct Local {
    _dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    provider: LocalProvider,
}

impl Local {
    /// A provider isolating its sandboxes as `isolation` says (none: unisolated).
    fn open(isolation: Option<Settings>) -> Local {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(ManualClock(AtomicU64::new(START_MS)));
        let mut provider = LocalProvider::new(
            dir.path().join("local"),
            INSTALLATION.to_string(),
            clock.clone(),
        )
        .expect("provider");
        if let Some(settings) = isolation {
            provider = provider.with_isolation(settings);
        }
        Local {
            _dir: dir,
            clock,
            provider,
        }
    }
}

impl Subject for Local {
    fn run<F, Fut>(promise: F)
    where
        F: FnOnce(Self) -> Fut,
        Fut: Future<Output = ()>,
    {
        real_time_runtime().block_on(promise(Local::open(None)));
    }

    fn provider(&self) -> &dyn SandboxProvider {
        &self.provider
    }

    fn now(&self) -> Millis {
        self.clock.now_ms()
    }

    async fn pass(&self, ms: u64) {
        self.clock.advance(ms);
        // Real processes run in real time: give them a moment to get where the test waits.
        tokio::time::sleep(Duration::from_millis(ms.min(20))).await;
    }

    fn lose_next_create(&self) -> bool {
        false
    }

    fn heal(&self) {}
}

/// The local provider as the default configuration makes it: each sandbox in namespaces of its
/// own (`terminal.local_isolation = namespaces`, its network through pasta), its limits.
struct LocalIsolated(Local);

impl Subject for LocalIsolated {
    fn run<F, Fut>(promise: F)
    where
        F: FnOnce(Self) -> Fut,
        Fut: Future<Output = ()>,
    {
        let settings = Settings::of(&Config::default().terminal);
        assert!(settings.namespaces(), "isolation is the default");
        real_time_runtime().block_on(promise(LocalIsolated(Local::open(Some(settings)))));
    }

    fn provider(&self) -> &dyn SandboxProvider {
        self.0.provider()
    }

    fn now(&self) -> Millis {
        self.0.now()
    }

    async fn pass(&self, ms: u64) {
        self.0.pass(ms).await;
    }

    fn lose_next_create(&self) -> bool {
        false
    }

    fn heal(&self) {}
}

/// The simulated provider on paused virtual time, without faults.
struct Sim {
    clock: Arc<TokioClock>,
    provider: Arc<SimProvider>,
}

impl Subject for Sim {
    fn run<F, Fut>(promise: F)
    where
        F: FnOnce(Self) -> Fut,
        Fut: Future<Output = ()>,
    {
        paused_runtime().block_on(async {
            let clock = Arc::new(TokioClock::starting_at(START_MS));
            let provider = Arc::new(SimProvider::new(7, SimFaults::none(), clock.clone()));
            promise(Sim { clock, provider }).await;
        });
    }

    fn provider(&self) -> &dyn SandboxProvider {
        &*self.provider
    }

    fn now(&self) -> Millis {
        self.clock.now_ms()
    }

    async fn pass(&self, ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    fn write(path: &str, content: &str) -> String {
        format!("write {path} {content}")
    }

    fn cat(path: &str) -> String {
        format!("cat {path}")
    }

    fn rm(path: &str) -> String {
        format!("rm {path}")
    }

    fn long(marker: &str) -> String {
        format!("write {marker} 1; sleep 30000")
    }

    fn lose_next_create(&self) -> bool {
        self.provider.set_faults(SimFaults {
            lost_create: 1.0,
            ..SimFaults::none()
        });
        true
    }

    fn heal(&self) {
        self.provider.set_faults(SimFaults::none());
    }
}

/// The Vercel provider over real HTTP against the fake Vercel server, in real time.
struct Vercel {
    _dir: tempfile::TempDir,
    fake: FakeServer,
    provider: VercelProvider,
}

impl Subject for Vercel {
    fn run<F, Fut>(promise: F)
    where
        F: FnOnce(Self) -> Fut,
        Fut: Future<Output = ()>,
    {
        let rt = real_time_runtime();
        rt.block_on(async {
            const TOKEN: &str = "contract-token";
            let dir = tempfile::tempdir().expect("temp dir");
            let mut opts = FakeOptions::new(dir.path().join("fake"));
            opts.token = Some(TOKEN.to_string());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("loopback");
            let fake = FakeServer::start(listener, opts)
                .await
                .expect("the fake starts");
            let client = VercelClient::new(
                &fake.base_url(),
                Credentials::access_token(TOKEN, "team_t", "prj_t"),
                Arc::new(SystemClock),
            )
            .expect("client");
            let config = taskbox::config::TerminalConfig {
                backend: taskbox::provider::vercel::BACKEND.backend(),
                container_cpu: 2,
                container_memory: 4096,
                ..taskbox::config::TerminalConfig::default()
            };
            let settings = VercelSettings::from_config(&config, &|_: &str| None).expect("settings");
            let provider = VercelProvider::new(client, settings).with_options(ProviderOptions {
                start_timeout: Duration::from_secs(10),
                snapshot_expiration_ms: None,
                usage_wait: Duration::from_secs(5),
                exec: ExecOptions {
                    max_poll_delay: Duration::from_millis(100),
                    ..ExecOptions::default()
                },
            });
            promise(Vercel {
                _dir: dir,
                fake,
                provider,
            })
            .await;
        });
    }

    fn provider(&self) -> &dyn SandboxProvider {
        &self.provider
    }

    fn now(&self) -> Millis {
        SystemClock.now_ms()
    }

    async fn pass(&self, ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    fn lose_next_create(&self) -> bool {
        self.fake
            .set_faults(Faults {
                drop_create: Some(DropCreate {
                    count: 1,
                    mode: DropMode::Close,
                }),
                ..Faults::default()
            })
            .expect("valid faults");
        true
    }

    fn heal(&self) {
        self.fake.set_faults(Faults::default()).expect("no faults");
    }
}

/// The simulated provider behind the chaos run's planted bug `oldest-restore` (every restore
/// uses the task's oldest snapshot): a provider that breaks a promise, for the suite to fail.
struct Planted {
    sim: Sim,
    broken: Arc<dyn SandboxProvider>,
}

impl Subject for Planted {
    fn run<F, Fut>(promise: F)
    where
        F: FnOnce(Self) -> Fut,
        Fut: Future<Output = ()>,
    {
        Sim::run(|sim| {
            let broken = PlantedBug::OldestRestore.wrap(sim.provider.clone());
            promise(Planted { sim, broken })
        });
    }

    fn provider(&self) -> &dyn SandboxProvider {
        &*self.broken
    }

    fn now(&self) -> Millis {
        self.sim.now()
    }

    async fn pass(&self, ms: u64) {
        self.sim.pass(ms).await;
    }

    fn write(path: &str, content: &str) -> String {
        Sim::write(path, content)
    }

    fn cat(path: &str) -> String {
        Sim::cat(path)
    }

    fn rm(path: &str) -> String {
        Sim::rm(path)
    }

    fn long(marker: &str) -> String {
        Sim::long(marker)
    }

    fn lose_next_create(&self) -> bool {
        self.sim.lose_next_create()
    }

    fn heal(&self) {
        self.sim.heal();
    }
}

/// The suite can fail: against a provider that restores a stale snapshot, "snapshot then restore
/// is exact" does (and the promises that restore no second snapshot still hold).
#[test]
fn the_suite_fails_a_provider_that_restores_a_stale_snapshot() {
    let broken = std::panic::catch_unwind(|| {
        Planted::run(snapshot_then_restore_is_exact::<Planted>);
    });
    assert!(
        broken.is_err(),
        "snapshot_then_restore_is_exact passed against a provider that restores the oldest snapshot"
    );
    Planted::run(probe_after_stop_says_gone::<Planted>);
}

/// The tests of one provider: one per promise, `provider_contract::<module>::<promise>`.
/// Every promise is listed here once.
macro_rules! contract {
    ($subject:ident, $module:ident) => {
        mod $module {
            promises!(
                $subject;
                create_is_idempotent_by_name,
                a_lost_create_is_retryable_and_makes_one_sandbox,
                probe_after_stop_says_gone,
                snapshot_then_restore_is_exact,
                a_stop_kills_what_runs,
                gone_is_not_retryable,
                deadlines_hold,
                a_fork_starts_from_the_snapshot,
            );
        }
    };
}

macro_rules! promises {
    ($subject:ident; $($promise:ident),* $(,)?) => {
        $(
            #[test]
            fn $promise() {
                <super::$subject as super::Subject>::run(super::$promise::<super::$subject>);
            }
        )*
    };
}

contract!(Local, local);
contract!(LocalIsolated, local_isolated);
contract!(Sim, sim);
contract!(Vercel, vercel);
