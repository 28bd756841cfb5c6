//! A provider decorator that notes *when* the platform deleted each snapshot.
//!
//! Neither the simulated platform nor the Vercel API records the time of a deletion, and the
//! restore check needs it: a snapshot deleted before a sandbox was created was not a restore
//! candidate then. A delete takes effect by the time the platform answers; on the simulator it
//! takes effect at the very instant the call returns (also for a timed-out call, whose answer
//! is lost), so with the simulator's records at hand the time is exact. Every delete goes
//! through the engine's provider (pruning and `gc` alike), so this sees them all.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::clock::Clock;
use crate::core::Millis;
use crate::ids::SnapshotId;
use crate::provider::sim::SimProvider;
use crate::provider::{Decorator, ProviderFuture, SandboxProvider};

/// Forwards every call to `inner`, and records deletion times (from `sim`'s records when
/// given, from successful answers otherwise).
pub(crate) struct Witness {
    inner: Arc<dyn SandboxProvider>,
    sim: Option<Arc<SimProvider>>,
    clock: Arc<dyn Clock>,
    deleted_at: Mutex<BTreeMap<String, Millis>>,
}

impl Witness {
    pub(crate) fn new(
        inner: Arc<dyn SandboxProvider>,
        sim: Option<Arc<SimProvider>>,
        clock: Arc<dyn Clock>,
    ) -> Witness {
        Witness {
            inner,
            sim,
            clock,
            deleted_at: Mutex::new(BTreeMap::new()),
        }
    }

    /// When each deleted snapshot was deleted.
    pub(crate) fn deleted_at(&self) -> BTreeMap<String, Millis> {
        self.deleted_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Decorator for Witness {
    fn inner(&self) -> &dyn SandboxProvider {
        &*self.inner
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a SnapshotId) -> ProviderFuture<'a, ()> {
        Box::pin(async move {
            let result = self.inner.delete_snapshot(snapshot_id).await;
            // No await between the platform's answer and this check: the virtual clock has not
            // moved since the deletion took effect.
            let now = self.clock.now_ms();
            let deleted = match &self.sim {
                Some(sim) => sim
                    .snapshots()
                    .iter()
                    .any(|s| s.id == snapshot_id.as_str() && s.deleted),
                None => result.is_ok(),
            };
            if deleted {
                self.deleted_at
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(snapshot_id.to_string())
                    .or_insert(now);
            }
            result
        })
    }
}
