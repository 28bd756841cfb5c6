//! [`Fence`]: what the event loop asks of a task's ownership, below both the loop and the
//! leases that implement it (`owner.rs` says who may drive a task).

use crate::ids::TaskId;

/// What the event loop asks of a task's ownership (`None` on the SQLite store, where the
/// `flock` cannot lapse while the process lives).
pub(super) trait Fence: Send + Sync {
    /// Whether this server's lease on `task` is still fresh by its own clock, with a margin:
    /// a provider call is made only then, so that a server paused past its lease does not
    /// act on the strength of a decision it committed before the pause.
    fn may_act(&self, task: &TaskId) -> bool;

    /// A commit of `task` was refused for a stale token (or the loop gave the task up): the
    /// lease is no longer held; the next request takes it again, or learns who holds it.
    fn lost(&self, task: &TaskId);
}
