//! [`Leases`]: a fleet server's ownership of the tasks it drives, on a PostgreSQL store.
//!
//! A request for a task first takes the task's lease (`PgStore::acquire_lease`: free, expired,
//! or already this server's) and only then reaches the event loop, which loads the task from the
//! store — after a takeover, that is the recovery a restart does (`Event::Loaded`: probe the
//! sandbox, re-issue the operation in flight by its key). The token goes into the fences the
//! event loop's store shares, so every commit of the task is fenced by it.
//!
//! A lease another live server holds is not waited for: the request is answered at once with
//! [`StoreError::LeaseHeld`](crate::store::StoreError::LeaseHeld) (code `task_elsewhere`, retryable), which names the owner and how
//! long its lease runs unless renewed. A timer renews every held lease in one statement each
//! third of the lease; a lease found taken over is reported to the loop
//! ([`Msg::LeaseLost`]), which stops driving the task and answers its callers with
//! [`StoreError::LeaseLost`](crate::store::StoreError::LeaseLost) (code `task_moved`, retryable). The renewals run on a connection of
//! their own, so a busy event loop cannot starve them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::event_loop::Msg;
use super::fence::Fence;
use super::EngineError;
use crate::ids::TaskId;
use crate::store::{Lease, PgStore};

/// One lease this server holds, and until when it is fresh by this server's monotonic clock.
struct Held {
    lease: Lease,
    /// The start of the acquire or renewal that last succeeded plus the lease length, less a
    /// margin: the database's expiry is at least that far (its `now()` came later).
    fresh_until: Instant,
}

/// The leases one orchestrator holds on a PostgreSQL store; see the [module docs](self).
pub(crate) struct Leases {
    /// A connection of its own, sharing the event loop store's fences.
    store: Arc<PgStore>,
    owner: String,
    ttl: Duration,
    held: Mutex<HashMap<TaskId, Held>>,
    renewer: Mutex<Option<JoinHandle<()>>>,
    /// Set by [`Leases::release_all`] (a stop or a crash): from then on no lease is taken, so
    /// a request reaching a stopped server cannot hold a task nobody drives (the caller gets
    /// [`EngineError::Stopped`] and the task stays free for the other servers).
    closed: AtomicBool,
}

impl Leases {
    /// Opens the leases' own connection to `loop_store`'s database (its commits then carry the
    /// tokens taken here) and starts renewing every `ttl / 3`; a lease found lost is sent to the
    /// loop on `tx`.
    pub(super) fn start(
        loop_store: &PgStore,
        owner: String,
        ttl: Duration,
        tx: mpsc::UnboundedSender<Msg>,
    ) -> Result<Arc<Leases>, EngineError> {
        let mut store = PgStore::open(loop_store.target())?;
        store.share_fences(loop_store.fences());
        let leases = Arc::new(Leases {
            store: Arc::new(store),
            owner,
            ttl,
            held: Mutex::new(HashMap::new()),
            renewer: Mutex::new(None),
            closed: AtomicBool::new(false),
        });
        let handle = tokio::spawn(renew(Arc::downgrade(&leases), tx));
        *leases.renewer.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        Ok(leases)
    }

    fn margin(&self) -> Duration {
        self.ttl / 10
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the task's lease unless this server holds it; [`StoreError::LeaseHeld`](crate::store::StoreError::LeaseHeld) while
    /// another server's is fresh.
    pub(super) async fn acquire(self: &Arc<Self>, task: &TaskId) -> Result<(), EngineError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(EngineError::Stopped);
        }
        if self.held().contains_key(task) {
            return Ok(());
        }
        let me = self.clone();
        let id = task.clone();
        let started = Instant::now();
        let lease = tokio::task::spawn_blocking(move || {
            me.store.acquire_lease(id.as_str(), &me.owner, me.ttl)
        })
        .await
        .map_err(|_| EngineError::Stopped)??;
        tracing::debug!(task = %task, token = lease.token, "lease taken");
        let fresh_until = started + self.ttl - self.margin();
        let held = {
            let mut held = self.held();
            // Stopped while the lease was being taken (`release_all` drains under this lock):
            // let it go rather than hold it for nobody.
            if self.closed.load(Ordering::SeqCst) {
                drop(held);
                let store = self.store.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    if let Err(e) = store.release_lease(&lease) {
                        tracing::warn!(task = %lease.task_id, error = %e,
                            "could not release a lease taken while stopping (it expires by itself)");
                    }
                })
                .await;
                return Err(EngineError::Stopped);
            }
            held.insert(task.clone(), Held { lease, fresh_until });
            held.len()
        };
        crate::engine::metrics::global().lease_acquired(held);
        Ok(())
    }

    /// Stops renewing; with `release`, lets every lease go so another server may take the
    /// tasks at once (a clean stop), otherwise leaves them to expire (as a crash would).
    pub(super) async fn release_all(&self, release: bool) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(h) = self
            .renewer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            h.abort();
        }
        let leases: Vec<Lease> = self.held().drain().map(|(_, h)| h.lease).collect();
        crate::engine::metrics::global().leases_held(0);
        if !release || leases.is_empty() {
            return;
        }
        let store = self.store.clone();
        let released = tokio::task::spawn_blocking(move || {
            for lease in &leases {
                if let Err(e) = store.release_lease(lease) {
                    tracing::warn!(task = %lease.task_id, error = %e,
                        "could not release a lease (it expires by itself)");
                }
            }
        });
        let _ = released.await;
    }

    /// Runs `job` while this server holds the installation-wide advisory lock `name`; `None`
    /// when another server holds it (it runs the job now).
    pub(super) async fn exclusive<T, F>(&self, name: &str, job: F) -> Result<Option<T>, EngineError>
    where
        F: Future<Output = Result<T, EngineError>>,
    {
        let store = self.store.clone();
        let n = name.to_string();
        let taken = tokio::task::spawn_blocking(move || store.try_job(&n))
            .await
            .map_err(|_| EngineError::Stopped)??;
        if !taken {
            return Ok(None);
        }
        let result = job.await;
        let store = self.store.clone();
        let n = name.to_string();
        let released = tokio::task::spawn_blocking(move || store.release_job(&n)).await;
        if let Ok(Err(e)) = released {
            // The lock goes with the connection at the latest.
            tracing::warn!(job = name, error = %e, "could not release a job's advisory lock");
        }
        result.map(Some)
    }
}

impl Fence for Leases {
    fn may_act(&self, task: &TaskId) -> bool {
        self.held()
            .get(task)
            .is_some_and(|h| Instant::now() < h.fresh_until)
    }

    fn lost(&self, task: &TaskId) {
        let mut held = self.held();
        held.remove(task);
        crate::engine::metrics::global().leases_held(held.len());
    }
}

/// Renews every held lease each third of the lease length, until the leases are dropped.
async fn renew(leases: std::sync::Weak<Leases>, tx: mpsc::UnboundedSender<Msg>) {
    let every = match leases.upgrade() {
        Some(l) => (l.ttl / 3).max(Duration::from_millis(50)),
        None => return,
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(me) = leases.upgrade() else { return };
        let batch: Vec<Lease> = me.held().values().map(|h| h.lease.clone()).collect();
        if batch.is_empty() {
            continue;
        }
        let started = Instant::now();
        let store = me.store.clone();
        let ttl = me.ttl;
        let sent = batch.clone();
        let answer = tokio::task::spawn_blocking(move || store.renew_leases(&sent, ttl)).await;
        let lost = match answer {
            Ok(Ok(lost)) => lost,
            Ok(Err(e)) => {
                // The database may be restarting: the leases stay ours until they expire, and
                // a commit made after that is refused if another server took a task meanwhile.
                tracing::warn!(error = %e, leases = batch.len(), "could not renew the leases");
                continue;
            }
            Err(_) => return,
        };
        let fresh_until = started + me.ttl - me.margin();
        let mut gone = Vec::new();
        {
            let mut held = me.held();
            for lease in &batch {
                let Ok(id) = TaskId::new(&lease.task_id) else {
                    continue;
                };
                let is_lost = lost.iter().any(|(t, _)| *t == lease.task_id);
                // Only the lease that was renewed (or found lost): the task may have been given
                // up and taken again meanwhile, with another token.
                let ours = held.get(&id).is_some_and(|h| h.lease.token == lease.token);
                if !ours {
                    continue;
                }
                if is_lost {
                    held.remove(&id);
                    crate::engine::metrics::global().lease_lost(held.len());
                    gone.push(id);
                } else if let Some(h) = held.get_mut(&id) {
                    h.fresh_until = fresh_until;
                }
            }
        }
        for id in gone {
            let owner = lost
                .iter()
                .find(|(t, _)| t == id.as_str())
                .and_then(|(_, o)| o.clone());
            tracing::warn!(task = %id, owner = owner.as_deref().unwrap_or("none"),
                "the task's lease was taken over; this server stops driving it");
            let _ = tx.send(Msg::LeaseLost { task: id, owner });
        }
    }
}
