//! Who may drive a task: this process alone, while it holds the task's ownership.
//!
//! - On the SQLite store (one machine), the per-task `flock` of [`TaskLocks`], released by the
//!   OS when the process dies — unchanged, and the only cost on that path is one enum match.
//! - On a PostgreSQL store that a fleet of servers shares, a lease per task ([`Leases`],
//!   feature `postgres`): a row with an owner, an expiry on the database's clock and a fencing
//!   token, renewed while the server drives the task. Every commit of the task carries the token
//!   and is refused once another server took the lease over.
//!
//! The event loop sees the lease side only through [`Fence`]: whether it may still call the
//! provider for a task, and that a commit found the lease lost.

use std::sync::Arc;

use super::fence::Fence;
use super::lock::TaskLocks;
use super::EngineError;
use crate::ids::TaskId;

#[cfg(feature = "postgres")]
pub(super) use super::lease::Leases;

/// A caller's hold on a task's ownership until it is answered: under the `flock`s, the lock
/// is not released while a claim is held ([`lock::Claim`](super::lock::Claim)); a fleet's
/// leases are kept by their renewal.
pub(super) struct Claim {
    _lock: Option<super::lock::Claim>,
}

/// The ownership of tasks one orchestrator takes before driving them.
pub(super) enum Ownership {
    /// The SQLite store: per-task `flock`s under the data dir.
    Locks(Arc<TaskLocks>),
    /// A PostgreSQL store: leases with fencing tokens.
    #[cfg(feature = "postgres")]
    Leases(Arc<Leases>),
}

impl Ownership {
    /// Takes the task's ownership (once per orchestrator, until lost or, under the `flock`s,
    /// until the task is unloaded and its last claim dropped). Keep the claim until the
    /// caller is answered.
    pub(super) async fn acquire(&self, task: &TaskId) -> Result<Claim, EngineError> {
        match self {
            Ownership::Locks(l) => Ok(Claim {
                _lock: Some(l.acquire(task).await?),
            }),
            #[cfg(feature = "postgres")]
            Ownership::Leases(l) => {
                l.acquire(task).await?;
                Ok(Claim { _lock: None })
            }
        }
    }

    /// The `flock`s, which the event loop tells when it loads and unloads a task (`None`: a
    /// fleet's leases, held while the server drives the task).
    pub(super) fn locks(&self) -> Option<Arc<TaskLocks>> {
        match self {
            Ownership::Locks(l) => Some(l.clone()),
            #[cfg(feature = "postgres")]
            Ownership::Leases(_) => None,
        }
    }

    /// Lets go of every task: a clean stop (`release`: leases expire at once, so another
    /// server may take the tasks without waiting) or a crash-like one (leases left to expire).
    pub(super) async fn release_all(&self, release: bool) {
        match self {
            Ownership::Locks(l) => l.release_all(),
            #[cfg(feature = "postgres")]
            Ownership::Leases(l) => l.release_all(release).await,
        }
        let _ = release;
    }

    /// The fence the event loop consults (`None`: nothing can lapse).
    pub(super) fn fence(&self) -> Option<Arc<dyn Fence>> {
        match self {
            Ownership::Locks(_) => None,
            #[cfg(feature = "postgres")]
            Ownership::Leases(l) => Some(l.clone() as Arc<dyn Fence>),
        }
    }

    /// Runs the installation-wide job `name` (gc) only if no other server of the fleet runs it
    /// now: `Ok(None)` when another holds it. On the SQLite store there is one server.
    pub(super) async fn exclusive<T, F>(&self, name: &str, job: F) -> Result<Option<T>, EngineError>
    where
        F: std::future::Future<Output = Result<T, EngineError>>,
    {
        match self {
            Ownership::Locks(_) => {
                let _ = name;
                job.await.map(Some)
            }
            #[cfg(feature = "postgres")]
            Ownership::Leases(l) => l.exclusive(name, job).await,
        }
    }
}

/// A name for this process in the `leases` table, shown to a caller whose task it drives:
/// the host, the process id and its start time (so a restarted process with a reused pid is
/// another owner), and `at ADDR` when the server also listens on TCP.
pub fn owner_name(listen: Option<&str>) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_string());
    let since = crate::clock::Clock::now_ms(&crate::clock::SystemClock);
    let mut name = format!("{host} pid {} since {since}", std::process::id());
    if let Some(addr) = listen {
        name.push_str(" at ");
        name.push_str(addr);
    }
    name
}
