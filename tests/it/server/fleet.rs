//! `taskbox serve --store postgres://…`: the server keeps its tasks in PostgreSQL rather than
//! the data dir's SQLite file, the password never shows, and what it committed is read back by
//! the next server and by `taskbox replay`.

use super::ServerHome;
use crate::support::{ok, stderr};

#[test]
fn a_server_on_a_postgres_store_keeps_its_tasks_there() {
    let Some(db) = crate::pg::database() else {
        return;
    };
    // Trust authentication ignores the password; it is here to prove it is never shown.
    let url = db.url.replacen("taskbox@", "taskbox:s3cret-pw@", 1);
    let mut h = ServerHome::new();
    h.home.set_env("TASKBOX_SERVER", "always");
    let mut server = h.spawn_serve(&["--store", &url]);
    h.wait_for_server();
    assert_eq!(
        ok(&h
            .home
            .run(&["run", "-t", "pg1", "--", "echo kept > f; cat f"])),
        "kept\n"
    );
    ok(&h.home.run(&["serve", "--stop"]));
    let _ = server.wait();
    let log = h.serve_stderr();
    assert!(log.contains("taskbox:[redacted]@"), "{log}");
    assert!(!log.contains("s3cret-pw"), "{log}");
    assert!(
        !h.data().join("taskbox.db").exists(),
        "nothing went to the SQLite file"
    );

    // The store holds the task's journal.
    let store = taskbox::store::Store::connect(&url).expect("connect");
    let journal = store.journal("pg1").expect("journal");
    assert!(journal.len() >= 3, "{journal:?}");

    // A server started from TASKBOX_STORE (no flag) finds the task and its files.
    h.home.set_env("TASKBOX_STORE", &url);
    let mut again = h.spawn_serve(&[]);
    h.wait_for_server();
    assert_eq!(
        ok(&h.home.run(&["run", "-t", "pg1", "--", "cat f"])),
        "kept\n"
    );
    ok(&h.home.run(&["serve", "--stop"]));
    let _ = again.wait();
    let replay = h.home.run(&["replay", "--all"]);
    assert!(replay.status.success(), "{}", stderr(&replay));
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&replay.stdout),
        stderr(&replay)
    );
    assert!(!shown.contains("s3cret-pw"), "{shown}");

    // A bad store URL is refused naming the flag, without the password.
    let o = h
        .home
        .run(&["serve", "--store", "mysql://root:s3cret-pw@db/x"]);
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    assert!(stderr(&o).contains("--store"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("s3cret-pw"), "{}", stderr(&o));
}
