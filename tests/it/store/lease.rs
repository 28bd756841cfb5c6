//! Leases and fencing on the PostgreSQL store: one owner at a time, a token that grows with
//! each new owner, a commit refused (and nothing of it written) once its token is stale, and
//! installation-wide jobs (gc, the reaper) held by one server at a time.

use std::time::Duration;

use taskbox::store::{Store, StoreError};

use super::{lifecycle, Kind, TestDb};

fn pg(store: &Store) -> &taskbox::store::PgStore {
    match store {
        Store::Postgres(s) => s,
        Store::Sqlite(_) => panic!("a PostgreSQL store"),
    }
}

#[test]
fn a_stale_owner_cannot_commit_after_another_took_the_lease() {
    let Some(db) = TestDb::new(Kind::Postgres) else {
        return;
    };
    let (mut a, mut b) = (db.open(), db.open());
    let ttl = Duration::from_millis(400);
    let steps = lifecycle("t", 1_000);

    let la = pg(&a)
        .acquire_lease("t", "server-a", ttl)
        .expect("a takes it");
    // Renewing by the owner keeps the token.
    assert_eq!(
        pg(&a).acquire_lease("t", "server-a", ttl).expect("again"),
        la
    );
    match pg(&b).acquire_lease("t", "server-b", ttl) {
        Err(StoreError::LeaseHeld { owner, task_id, .. }) => {
            assert_eq!((owner.as_str(), task_id.as_str()), ("server-a", "t"));
        }
        other => panic!("expected LeaseHeld, got {other:?}"),
    }
    for step in &steps[..2] {
        a.commit(&step.rec()).expect("the owner commits");
    }
    pg(&a).renew_lease(&la, ttl).expect("renew");

    // A stops renewing (paused, partitioned); after expiry B takes over with a greater token.
    std::thread::sleep(ttl + Duration::from_millis(200));
    let lb = pg(&b)
        .acquire_lease("t", "server-b", ttl)
        .expect("b takes over");
    assert!(lb.token > la.token, "{lb:?} after {la:?}");

    let before = db.counts();
    let err = a.commit(&steps[2].rec()).expect_err("a's token is stale");
    assert!(
        matches!(&err, StoreError::LeaseLost { task_id, owner: Some(o) }
            if task_id == "t" && o == "server-b"),
        "{err:?}"
    );
    assert!(err.to_string().contains("moved to another server"), "{err}");
    assert_eq!(
        db.counts(),
        before,
        "nothing of the refused commit was written"
    );
    assert!(matches!(
        pg(&a).renew_lease(&la, ttl),
        Err(StoreError::LeaseLost { .. })
    ));
    // In a batch, the stale record undoes the others.
    let other = lifecycle("u", 1_000);
    let err = a
        .commit_batch(&[other[0].rec(), steps[2].rec()])
        .expect_err("stale in a batch");
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");
    assert_eq!(a.load_task("u").expect("load"), None);

    // The new owner continues the task where the journal left it.
    b.commit(&steps[2].rec()).expect("b commits");
    b.commit(&steps[3].rec()).expect("b commits");
    let journal = b.journal("t").expect("journal");
    assert_eq!(
        journal.iter().map(|e| e.task_seq).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );

    // Released, the lease is free at once, and the next owner's token is greater still.
    pg(&b).release_lease(&lb).expect("release");
    let la2 = pg(&a).acquire_lease("t", "server-a", ttl).expect("a again");
    assert!(la2.token > lb.token);
}

#[test]
fn an_installation_job_runs_on_one_server_at_a_time() {
    let Some(db) = TestDb::new(Kind::Postgres) else {
        return;
    };
    let (a, b) = (db.open(), db.open());
    assert!(pg(&a).try_job("gc").expect("a"));
    assert!(!pg(&b).try_job("gc").expect("b"), "a holds gc");
    assert!(pg(&b).try_job("reaper").expect("another job is free"));
    pg(&a).release_job("gc").expect("release");
    assert!(pg(&b).try_job("gc").expect("b now"));
    // A holder that goes away (its connection closes) lets go.
    // (The server notices the closed connection a moment later.)
    drop(b);
    let taken = (0..100).any(|_| {
        let got = pg(&a).try_job("gc").expect("a after b is gone");
        if !got {
            std::thread::sleep(Duration::from_millis(50));
        }
        got
    });
    assert!(taken, "b's advisory lock outlived its connection");
}

/// A stopped server takes no lease: a request reaching it after its stop (a client's retry, a
/// load balancer that has not noticed yet) is answered "stopped" and leaves the task free, so
/// another server drives it at once. (Found by the fleet chaos run: such a request took the
/// lease before it found the event loop gone, and held the task for nobody until the lease
/// expired — each retry taking it again.)
#[test]
fn a_stopped_server_takes_no_lease() {
    use std::sync::Arc;
    use taskbox::clock::SystemClock;
    use taskbox::config::{Config, StoreSetting};
    use taskbox::engine::{EngineError, Orchestrator};
    use taskbox::provider::sim::{SimFaults, SimProvider};
    use taskbox::TaskId;

    let Some(db) = crate::pg::database() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(SystemClock);
        let sim = Arc::new(SimProvider::new(7, SimFaults::none(), clock.clone()));
        let mut config = Config::default();
        config.terminal.store = StoreSetting::postgres(&db.url);
        // Long enough that only a release, never an expiry, frees the task within the test.
        config.terminal.lease_seconds = 60;
        let open = |name: &str| {
            Orchestrator::builder(dir.path().join(name), config.clone())
                .provider(sim.clone())
                .clock(clock.clone())
                .owner(name.to_string())
                .reconcile_on_start(false)
                .open()
        };
        let (a, b) = (
            open("a").await.expect("open a"),
            open("b").await.expect("open b"),
        );
        let task = TaskId::new("t").expect("id");
        a.run(&task, "write f 1", None).await.expect("a runs");
        a.shutdown().await;
        match a.run(&task, "write f 2", None).await {
            Err(EngineError::Stopped) => {}
            other => panic!("a stopped server answered {other:?}"),
        }
        let out = b
            .run(&task, "cat f", None)
            .await
            .expect("the task is free for another server at once");
        assert_eq!(out.stdout, "1");
        b.shutdown().await;
    });
}
