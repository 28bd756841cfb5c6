//! The provider against the fake Vercel server (`taskbox::fake`): the whole lifecycle, idempotent
//! creates and snapshots, each error class, cut streams, timeouts and expiry.

use std::collections::BTreeMap;
use std::sync::Arc;

use taskbox::clock::SystemClock;
use taskbox::core::FailureKind;
use taskbox::fake::{
    CutMode, DropCreate, DropMode, Endpoint, FakeOptions, FakeServer, Faults, RateLimitBurst,
    StreamCut,
};
use taskbox::provider::vercel::auth::Credentials;
use taskbox::provider::vercel::client::VercelClient;
use taskbox::provider::vercel::doctor;
use taskbox::provider::vercel::exec::ExecOptions;
use taskbox::provider::vercel::settings::VercelSettings;
use taskbox::provider::vercel::{ProviderOptions, VercelProvider};
use taskbox::provider::{
    sandbox_name, ExecIo, ExecRequest, OutputStream, SandboxProvider, SandboxSpec,
};

use super::{empty_dir, env_of, vercel_config, SECRET_TOKEN};
use crate::support::{sbx, tid};

const INSTALLATION: &str = "inst_a";

struct World {
    fake: FakeServer,
    provider: VercelProvider,
    _dir: tempfile::TempDir,
}

async fn world_with(tweak: impl FnOnce(&mut FakeOptions)) -> World {
    let dir = empty_dir();
    let mut opts = FakeOptions::new(dir.path().join("fake"));
    opts.token = Some(SECRET_TOKEN.to_string());
    tweak(&mut opts);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake = FakeServer::start(listener, opts)
        .await
        .expect("fake starts");
    let provider = provider_for(&fake, SECRET_TOKEN);
    World {
        fake,
        provider,
        _dir: dir,
    }
}

async fn world() -> World {
    world_with(|_| {}).await
}

fn provider_for(fake: &FakeServer, token: &str) -> VercelProvider {
    let client = VercelClient::new(
        &fake.base_url(),
        Credentials::access_token(token, "team_t", "prj_t"),
        Arc::new(SystemClock),
    )
    .unwrap();
    let settings = VercelSettings::from_config(&vercel_config(2, 4096), &env_of(&[])).unwrap();
    VercelProvider::new(client, settings).with_options(ProviderOptions {
        start_timeout: std::time::Duration::from_secs(10),
        snapshot_expiration_ms: None,
        usage_wait: std::time::Duration::from_secs(5),
        exec: ExecOptions {
            max_poll_delay: std::time::Duration::from_millis(100),
            ..ExecOptions::default()
        },
    })
}

fn spec(task: &str, generation: u64, source: Option<&str>) -> SandboxSpec {
    SandboxSpec {
        task_id: tid(task),
        generation,
        name: sandbox_name(INSTALLATION, task, generation),
        source_snapshot: source.map(Into::into),
        timeout_ms: 300_000,
        installation_id: INSTALLATION.to_string(),
    }
}

fn run(command: &str, timeout_ms: u64) -> ExecRequest {
    ExecRequest {
        command: command.to_string(),
        timeout_ms,
    }
}

#[tokio::test]
async fn the_whole_lifecycle() {
    let w = world().await;
    let p = &w.provider;

    let sb = p.create_sandbox(&spec("life", 0, None)).await.unwrap();
    assert_eq!(sb.name, "taskbox-life-g0-insta");
    let deadline = p.probe_sandbox(&sb.id).await.unwrap().expect("running");
    assert_eq!(deadline, sb.deadline);

    let out = p
        .exec(
            &sb.id,
            &run("echo hi > f.txt; echo out; echo err >&2; exit 3", 10_000),
        )
        .await
        .unwrap();
    assert_eq!((out.exit_code, out.timed_out), (3, false));
    assert_eq!(
        (out.stdout.as_str(), out.stderr.as_str()),
        ("out\n", "err\n")
    );

    // A warm command is one HTTP request.
    w.fake.reset_stats();
    let out = p.exec(&sb.id, &run("cat f.txt", 10_000)).await.unwrap();
    assert_eq!(out.stdout, "hi\n");
    assert_eq!(w.fake.stats().total, 1, "{:?}", w.fake.stats());

    let extended = p.extend_timeout(&sb.id, 60_000).await.unwrap();
    assert_eq!(extended, sb.deadline + 60_000);

    // Snapshot: idempotent, and it stops the session.
    let mut snap = p.snapshot(&tid("life"), &sb.id, 1).await.unwrap();
    let mut again = p.snapshot(&tid("life"), &sb.id, 1).await.unwrap();
    // Both carry the session's usage (the repeat reads it from the session, which may have
    // settled to `stopped` meanwhile and then reports its `stoppedAt` too).
    let (u1, u2) = (snap.usage.take().unwrap(), again.usage.take().unwrap());
    assert_eq!(
        (u1.started_at, u1.vcpus, u1.memory_mb, u1.active_cpu_ms),
        (u2.started_at, u2.vcpus, u2.memory_mb, u2.active_cpu_ms)
    );
    assert_eq!(snap, again);
    assert_eq!(w.fake.stats().requests_to(Endpoint::CreateSnapshot), 1);
    assert_eq!(p.probe_sandbox(&sb.id).await.unwrap(), None);

    // Restore into the next generation: the file is back (and the create omitted
    // `runtime`, which the fake refuses next to a snapshot source).
    let sb1 = p
        .create_sandbox(&spec("life", 1, Some(&snap.id)))
        .await
        .unwrap();
    assert_ne!(sb1.id, sb.id);
    let out = p.exec(&sb1.id, &run("cat f.txt", 10_000)).await.unwrap();
    assert_eq!(out.stdout, "hi\n");

    // Reconciler views: only this installation's resources, with their tasks.
    let listed = p.list_sandboxes(INSTALLATION).await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    let live: Vec<_> = listed.iter().filter(|r| r.live).collect();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].id, sb1.id);
    assert!(listed.iter().all(|r| r.task_id.as_deref() == Some("life")));
    let snaps = p.list_snapshots(INSTALLATION).await.unwrap();
    assert_eq!(snaps.len(), 1);
    assert_eq!(
        (
            snaps[0].id.as_str(),
            snaps[0].task_id.as_deref(),
            snaps[0].live
        ),
        (snap.id.as_str(), Some("life"), true)
    );
    assert!(p.list_sandboxes("someone_else").await.unwrap().is_empty());
    assert!(p.list_snapshots("someone_else").await.unwrap().is_empty());

    // Stop and delete are idempotent. Sandboxes are created persistent
    // (terminal.container_persistent), so the stop leaves the platform's own snapshot of the
    // session, which the provider finds for the task.
    p.stop_sandbox(&sb1.id).await.unwrap();
    p.stop_sandbox(&sb1.id).await.unwrap();
    assert_eq!(p.probe_sandbox(&sb1.id).await.unwrap(), None);
    let platform = p
        .platform_snapshot(&tid("life"), &sb1.id)
        .await
        .unwrap()
        .expect("the persistent sandbox snapshotted itself as it stopped");
    assert_ne!(platform.snapshot_id, snap.id);
    assert!(platform.size_bytes > 0);
    for id in [&snap.id, &snap.id, &platform.snapshot_id] {
        p.delete_snapshot(id).await.unwrap();
    }
    assert!(p.list_snapshots(INSTALLATION).await.unwrap().is_empty());
    // A deleted snapshot is never offered.
    assert_eq!(
        p.platform_snapshot(&tid("life"), &sb1.id).await.unwrap(),
        None
    );
}

#[tokio::test]
async fn a_repeated_create_finds_the_first_sandbox() {
    let w = world().await;
    let a = w
        .provider
        .create_sandbox(&spec("twice", 0, None))
        .await
        .unwrap();
    let b = w
        .provider
        .create_sandbox(&spec("twice", 0, None))
        .await
        .unwrap();
    assert_eq!(a, b);
    assert_eq!(w.fake.stats().requests_to(Endpoint::CreateSandbox), 1);
    assert_eq!(
        w.provider.list_sandboxes(INSTALLATION).await.unwrap().len(),
        1
    );
}

#[tokio::test]
async fn a_lost_create_response_does_not_make_a_second_sandbox() {
    for mode in [DropMode::Close, DropMode::Error] {
        let w = world().await;
        w.fake
            .set_faults(Faults {
                drop_create: Some(DropCreate { count: 1, mode }),
                ..Faults::default()
            })
            .unwrap();
        let sb = w
            .provider
            .create_sandbox(&spec("lost", 0, None))
            .await
            .unwrap();
        assert_eq!(w.fake.stats().injected.dropped_creates, 1);
        let listed = w.provider.list_sandboxes(INSTALLATION).await.unwrap();
        assert_eq!(listed.len(), 1, "{mode:?}: {listed:?}");
        assert_eq!(listed[0].id, sb.id);
        let out = w
            .provider
            .exec(&sb.id, &run("echo ok", 10_000))
            .await
            .unwrap();
        assert_eq!(out.stdout, "ok\n");
    }
}

#[tokio::test]
async fn a_dead_sandbox_under_the_same_name_is_replaced() {
    let w = world().await;
    let first = w
        .provider
        .create_sandbox(&spec("dead", 0, None))
        .await
        .unwrap();
    w.fake.expire_session(&first.id).await.unwrap();
    assert_eq!(w.provider.probe_sandbox(&first.id).await.unwrap(), None);
    let second = w
        .provider
        .create_sandbox(&spec("dead", 0, None))
        .await
        .unwrap();
    assert_ne!(first.id, second.id);
    assert!(w
        .provider
        .probe_sandbox(&second.id)
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn a_name_owned_by_another_installation_is_not_adopted() {
    let w = world().await;
    w.provider
        .create_sandbox(&spec("shared", 0, None))
        .await
        .unwrap();
    let mut other = spec("shared", 0, None);
    other.installation_id = "inst_b".into();
    let err = w.provider.create_sandbox(&other).await.unwrap_err();
    assert_eq!(err.kind, FailureKind::Permanent);
    assert!(
        err.message.contains("another taskbox installation"),
        "{err}"
    );
}

#[tokio::test]
async fn each_error_class_from_the_fake() {
    let w = world_with(|o| o.snapshot_settle_ms = 60_000).await;
    let p = &w.provider;
    let sb = p.create_sandbox(&spec("errs", 0, None)).await.unwrap();

    // 429 with Retry-After.
    w.fake
        .set_faults(Faults {
            rate_limit: Some(RateLimitBurst {
                count: 1,
                retry_after_s: 7,
                endpoint: Some("get_session".into()),
            }),
            ..Faults::default()
        })
        .unwrap();
    let err = p.probe_sandbox(&sb.id).await.unwrap_err();
    assert_eq!(
        err.kind,
        FailureKind::Transient {
            retry_after_ms: Some(7000)
        },
        "{err}"
    );
    assert!(
        p.probe_sandbox(&sb.id).await.unwrap().is_some(),
        "the burst is over"
    );

    // 5xx.
    w.fake
        .set_faults(Faults {
            error_rate: BTreeMap::from([("extend_timeout".to_string(), 1.0)]),
            error_status: 503,
            ..Faults::default()
        })
        .unwrap();
    let err = p.extend_timeout(&sb.id, 10_000).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    w.fake.set_faults(Faults::default()).unwrap();

    // Wrong token: 403 → Auth, with the fix and without the token.
    let intruder = provider_for(&w.fake, "tok_wrong_guess");
    let err = intruder.probe_sandbox(&sb.id).await.unwrap_err();
    assert_eq!(err.kind, FailureKind::Auth, "{err}");
    assert!(!err.to_string().contains("tok_wrong_guess"));

    // 422 while a snapshot settles, then 410 once stopped.
    let snap = p.snapshot(&tid("errs"), &sb.id, 1).await.unwrap();
    let err = p.exec(&sb.id, &run("true", 5_000)).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(err.message.contains("sandbox_snapshotting"), "{err}");

    let sb2 = p
        .create_sandbox(&spec("errs", 1, Some(&snap.id)))
        .await
        .unwrap();
    p.stop_sandbox(&sb2.id).await.unwrap();
    let err = p.exec(&sb2.id, &run("true", 5_000)).await.unwrap_err();
    assert_eq!(err.kind, FailureKind::SandboxGone, "{err}");

    // 410 snapshot_not_found on restore from an expired snapshot.
    w.fake.expire_snapshot(&snap.id).await.unwrap();
    let err = p
        .create_sandbox(&spec("errs", 2, Some(&snap.id)))
        .await
        .unwrap_err();
    assert_eq!(err.kind, FailureKind::SnapshotGone, "{err}");
    // Deleting a gone snapshot succeeds.
    p.delete_snapshot(&snap.id).await.unwrap();

    // An unknown session is gone, not an error.
    assert_eq!(
        p.probe_sandbox(&sbx("sess_does_not_exist")).await.unwrap(),
        None
    );
}

#[tokio::test]
async fn a_stream_cut_mid_command_still_gets_exit_code_and_output() {
    for mode in [CutMode::Abort, CutMode::ErrorRecord] {
        let w = world().await;
        let sb = w
            .provider
            .create_sandbox(&spec("cut", 0, None))
            .await
            .unwrap();
        w.fake
            .set_faults(Faults {
                cut_streams: Some(StreamCut {
                    after_ms: 300,
                    mode,
                }),
                ..Faults::default()
            })
            .unwrap();
        // The live output gets what the stream delivered, then the rest of the `/logs` replay:
        // every byte once.
        let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
        let io = ExecIo {
            output: Some(tx),
            ..ExecIo::default()
        };
        let req = run(
            "echo before; echo e1 >&2; sleep 1; echo after; exit 7",
            20_000,
        );
        let out = w.provider.exec_live(&sb.id, &req, io).await.unwrap();
        assert_eq!((out.exit_code, out.timed_out), (7, false), "{mode:?}");
        assert_eq!(out.stdout, "before\nafter\n", "{mode:?}");
        assert_eq!(out.stderr, "e1\n", "{mode:?}");
        let mut live = [Vec::new(), Vec::new()];
        while let Ok(chunk) = rx.try_recv() {
            live[(chunk.stream == OutputStream::Stderr) as usize].extend(chunk.data);
        }
        assert_eq!(live[0], b"before\nafter\n", "{mode:?}");
        assert_eq!(live[1], b"e1\n", "{mode:?}");
        let stats = w.fake.stats();
        assert!(stats.injected.cut_streams >= 1, "{stats:?}");
        assert!(stats.requests_to(Endpoint::GetCommand) >= 1, "{stats:?}");
        assert_eq!(
            stats.requests_to(Endpoint::RunCommand),
            1,
            "never re-run: {stats:?}"
        );
    }
}

#[tokio::test]
async fn a_timeout_kills_the_command_but_the_sandbox_keeps_working() {
    let w = world().await;
    let p = &w.provider;
    let sb = p.create_sandbox(&spec("slow", 0, None)).await.unwrap();
    let out = p
        .exec(&sb.id, &run("echo started; sleep 30; echo never", 700))
        .await
        .unwrap();
    assert_eq!((out.exit_code, out.timed_out), (124, true));
    assert_eq!(out.stdout, "started\n");
    assert!(
        out.duration_ms >= 700 && out.duration_ms < 10_000,
        "{}",
        out.duration_ms
    );
    let stats = w.fake.stats();
    assert_eq!(stats.requests_to(Endpoint::KillCommand), 1, "{stats:?}");
    assert_eq!(
        stats.requests_to(Endpoint::StopSession),
        0,
        "the sandbox is not stopped"
    );
    assert!(p.probe_sandbox(&sb.id).await.unwrap().is_some());
    let out = p.exec(&sb.id, &run("echo alive", 10_000)).await.unwrap();
    assert_eq!((out.exit_code, out.stdout.as_str()), (0, "alive\n"));
}

#[tokio::test]
async fn a_snapshot_whose_answer_was_lost_is_found_again_after_a_restart() {
    let w = world().await;
    let sb = w
        .provider
        .create_sandbox(&spec("snap", 0, None))
        .await
        .unwrap();
    w.provider
        .exec(&sb.id, &run("echo data > keep.txt", 10_000))
        .await
        .unwrap();
    // The snapshot was taken but taskbox never saw the answer (crash, lost response)...
    let taken = w
        .provider
        .client()
        .create_snapshot(&sb.id, None)
        .await
        .unwrap();
    // ...and a new process (no memory of names) asks again for the same snapshot.
    let restarted = provider_for(&w.fake, SECRET_TOKEN);
    let info = restarted.snapshot(&tid("snap"), &sb.id, 1).await.unwrap();
    assert_eq!(info.id, taken.snapshot.id);
    assert_eq!(w.fake.stats().requests_to(Endpoint::CreateSnapshot), 1);
}

#[tokio::test]
async fn long_output_is_bounded() {
    let w = world().await;
    let sb = w
        .provider
        .create_sandbox(&spec("big", 0, None))
        .await
        .unwrap();
    let out = w
        .provider
        .exec(
            &sb.id,
            &run("head -c 120000 /dev/zero | tr '\\0' x; printf END", 20_000),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0);
    assert!(out.stdout.chars().count() < 50_200, "{}", out.stdout.len());
    assert!(out.stdout.ends_with("xEND"));
    assert!(out.stdout.contains("characters omitted"));
}

#[tokio::test]
async fn doctor_reaches_the_api_or_says_why_not() {
    let w = world().await;
    let check = doctor::reachability(w.provider.client()).await;
    assert!(check.ok, "{check:?}");
    assert!(
        check.detail.contains("team team_t, project prj_t"),
        "{}",
        check.detail
    );
    let intruder = provider_for(&w.fake, "tok_wrong_guess");
    let check = doctor::reachability(intruder.client()).await;
    assert!(!check.ok);
    assert!(check.hint.is_some());
    assert!(!format!("{check:?}").contains("tok_wrong_guess"));
}

/// Waits (bounded) until the fake has seen `n` requests to `endpoint`.
async fn until_requests(fake: &FakeServer, endpoint: Endpoint, n: u64) {
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while fake.stats().requests_to(endpoint) < n {
        assert!(
            std::time::Instant::now() < give_up,
            "no {endpoint:?} request came"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_sandbox_that_expires_under_a_command_is_gone() {
    let w = world().await;
    let sb = w
        .provider
        .create_sandbox(&spec("expiry", 0, None))
        .await
        .unwrap();
    let req = run("echo working; sleep 30", 20_000);
    let (result, ()) = tokio::join!(w.provider.exec(&sb.id, &req), async {
        until_requests(&w.fake, Endpoint::RunCommand, 1).await;
        w.fake.expire_session(&sb.id).await.unwrap();
    });
    let err = result.unwrap_err();
    assert_eq!(err.kind, FailureKind::SandboxGone, "{err}");
    assert_eq!(w.provider.probe_sandbox(&sb.id).await.unwrap(), None);
}

#[tokio::test]
async fn a_pending_session_is_polled_until_running() {
    let w = world_with(|o| o.boot_delay_ms = 300).await;
    let sb = w
        .provider
        .create_sandbox(&spec("boot", 0, None))
        .await
        .unwrap();
    assert!(w.fake.stats().requests_to(Endpoint::GetSession) >= 1);
    let out = w
        .provider
        .exec(&sb.id, &run("echo up", 10_000))
        .await
        .unwrap();
    assert_eq!(out.stdout, "up\n");
}

/// A run's variables (`run --env`, `terminal.env`) go in the run-command request's `env`, over
/// the sandbox's own environment; the fake's own environment reaches no command.
#[tokio::test]
async fn a_runs_variables_reach_the_command_in_the_requests_env() {
    let w = world().await;
    let sb = w
        .provider
        .create_sandbox(&spec("env", 0, None))
        .await
        .unwrap();
    let mut env = taskbox::config::CommandEnv::new();
    env.set("PASSED", "passed value").unwrap();
    env.set("LANG", "C").unwrap();
    let io = ExecIo {
        env,
        ..ExecIo::default()
    };
    let out = w
        .provider
        .exec_live(
            &sb.id,
            &run(r#"echo "$PASSED|$LANG|${TASKBOX_HOME-unset}""#, 10_000),
            io,
        )
        .await
        .unwrap();
    assert_eq!(out.stdout, "passed value|C|unset\n", "{out:?}");
    // Without variables, the sandbox's own environment.
    let out = w
        .provider
        .exec(&sb.id, &run(r#"echo "${PASSED-unset}|$LANG""#, 10_000))
        .await
        .unwrap();
    assert_eq!(out.stdout, "unset|C.UTF-8\n", "{out:?}");
}
