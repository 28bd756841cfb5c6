//! `journal.postgres`: the store's commits on a PostgreSQL store against a raw tokio-postgres
//! INSERT of the same JSON into a one-table baseline on the same server (see the room's front).

use super::{interleave_rounds, store_commit, Rates, RawBufs, Rec, BENCH};
use crate::bench::BenchError;
use crate::core::TaskSettings;
use crate::store::Store;

/// The raw PostgreSQL baseline: the same client (tokio-postgres) and durability as the store,
/// one autocommitted INSERT per transition into a one-table baseline of its own.
struct PgRaw {
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
    insert: tokio_postgres::Statement,
}

impl PgRaw {
    // The baseline bypasses the store on purpose (clippy.toml allows the benchmark by name).
    #[allow(clippy::disallowed_methods)]
    fn open(url: &str) -> Result<PgRaw, BenchError> {
        let err = |e: tokio_postgres::Error| {
            BenchError::failed(BENCH, format!("raw PostgreSQL baseline: {e}"))
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| BenchError::failed(BENCH, format!("a runtime: {e}")))?;
        let (client, insert) = rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .map_err(err)?;
            tokio::spawn(conn);
            client
                .batch_execute(
                    "CREATE TABLE IF NOT EXISTS taskbox_bench_raw (
                         seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                         task_id TEXT NOT NULL,
                         at BIGINT NOT NULL,
                         event TEXT NOT NULL,
                         task_after TEXT NOT NULL)",
                )
                .await
                .map_err(err)?;
            let insert = client
                .prepare(
                    "INSERT INTO taskbox_bench_raw (task_id, at, event, task_after)
                     VALUES ($1, $2, $3, $4)",
                )
                .await
                .map_err(err)?;
            Ok::<_, BenchError>((client, insert))
        })?;
        Ok(PgRaw { rt, client, insert })
    }

    fn insert(&self, bufs: &mut RawBufs, recs: &[Rec]) -> Result<(), BenchError> {
        self.rt.block_on(async {
            for r in recs {
                let (event, task_after) = bufs.encode(r)?;
                let at = r.at as i64;
                self.client
                    .execute(
                        &self.insert,
                        &[&r.task_after.id.as_str(), &at, &event, &task_after],
                    )
                    .await
                    .map_err(|e| {
                        BenchError::failed(BENCH, format!("raw PostgreSQL baseline: {e}"))
                    })?;
            }
            Ok(())
        })
    }
}

/// `journal.postgres`: [`Store::commit`] on a PostgreSQL store against [`PgRaw`].
pub(super) fn measure_postgres(
    url: &str,
    rounds: usize,
    per_round: usize,
    settings: &TaskSettings,
) -> Result<Rates, BenchError> {
    let mut store = Store::connect(url).map_err(|source| BenchError::Store {
        bench: BENCH,
        action: "connecting to the PostgreSQL store".into(),
        source: Box::new(source),
    })?;
    let raw = PgRaw::open(url)?;
    let mut bufs = RawBufs::default();
    // Task ids unique to this run: the database outlives it.
    let label = format!(
        "pg{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    );
    // Fenced, as a fleet server's commits are: each task's lease is taken before its first
    // commit (once per task, inside the timed side, as a server takes it once per task), so
    // every commit goes through `taskbox_commit_fenced` (the lease row locked for share, the
    // writer recorded).
    let mut leased = std::collections::HashSet::new();
    interleave_rounds(
        &label,
        rounds,
        per_round,
        1,
        settings,
        // The server's WAL is its own, shared with whatever else it serves.
        || Ok(None),
        |recs| {
            if let Store::Postgres(pg) = &store {
                for r in recs {
                    if leased.insert(r.task_after.id.clone()) {
                        pg.acquire_lease(
                            r.task_after.id.as_str(),
                            "taskbox bench",
                            std::time::Duration::from_secs(600),
                        )
                        .map_err(|source| BenchError::Store {
                            bench: BENCH,
                            action: "taking a task's lease".into(),
                            source: Box::new(source),
                        })?;
                    }
                }
            }
            store_commit(&mut store, recs, 1)
        },
        |recs| raw.insert(&mut bufs, recs),
    )
}
