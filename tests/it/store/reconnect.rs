//! PostgreSQL going away under an open store: calls during the outage fail with a retryable
//! error that names the store without its password, nothing committed is lost, and the store
//! reconnects by itself once the server is back.

use taskbox::store::Store;

use super::lifecycle;

#[test]
fn a_restarted_postgres_is_reconnected_and_nothing_committed_is_lost() {
    let Some(server) = crate::pg::private_server() else {
        return;
    };
    let cluster = server.cluster().expect("a cluster of this test's own");
    let db = server.database();
    // Trust authentication ignores the password; it is here to prove it is never shown.
    let url = db.url.replacen("taskbox@", "taskbox:s3cret-pw@", 1);
    let mut store = Store::connect(&url).expect("connect");
    assert!(!format!("{store:?}").contains("s3cret-pw"));
    assert!(
        store.location().contains("taskbox:[redacted]@"),
        "{}",
        store.location()
    );
    let steps = lifecycle("a", 1_000);
    for step in &steps[..2] {
        store.commit(&step.rec()).expect("commit");
    }

    cluster.stop();
    let err = store
        .commit(&steps[2].rec())
        .expect_err("the server is down");
    assert!(err.is_retryable(), "{err:?}");
    let shown = format!("{err} {err:?} {}", err.hint().unwrap_or_default());
    assert!(!shown.contains("s3cret-pw"), "{shown}");
    assert!(shown.contains("taskbox:[redacted]@"), "{shown}");
    let err = store.load_task("a").expect_err("still down");
    assert!(err.is_retryable(), "{err:?}");

    cluster.start();
    store
        .commit(&steps[2].rec())
        .expect("the store reconnects by itself");
    store.commit(&steps[3].rec()).expect("commit");
    let journal = store.journal("a").expect("journal");
    assert_eq!(
        journal.iter().map(|e| e.task_seq).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert_eq!(
        store.load_task("a").expect("load"),
        Some(steps[3].task.clone())
    );
}
