//! What a runner asks of the engine that owns its queue: the engine's settings, clock
//! and shutdown, and the I/O the runner does not do itself — reading the leases that
//! park keys, and handing on what a run could not serve. The runner only decides; the
//! owner does.

use std::future::Future;

use super::Engine;
use super::queue::Now;
use crate::core::UnixMillis;
use crate::groups::TargetGroupApi;
use crate::pods::PodSource;
use crate::reconcile::Stop;
use crate::state::{StateError, StateStore};

/// The owner of a runner's queue.
pub(crate) trait Owner: Sync {
    /// Passes of each class (reactions, verifications) that may run at once.
    fn cap(&self) -> usize;

    /// Now, on the queue's two clocks.
    fn now(&self) -> Now;

    /// Whether the process is shutting down, and the passes in flight the shutdown
    /// hook waits for (a run counts itself as one while it hands on).
    fn stop(&self) -> &Stop;

    /// When the lease parking each of `keys` may be taken (its expiry plus the
    /// takeover grace; `None`: given back or expired), from one batched read; `None`
    /// when the read failed (the keys then wait until those leases would expire).
    fn lease_ends(
        &self,
        keys: &[String],
    ) -> impl Future<Output = Option<Vec<(String, Option<UnixMillis>)>>> + Send;

    /// Hands on the requests a run could not serve: each group's `dirty` flag, so that
    /// whoever holds or next takes its lease serves it, and the index's record of
    /// requests, so that the next run serves them first (see
    /// `StateStore::request_passes`). A failure is logged and returned: whoever ran the
    /// run answers it (the next full diff finds the groups by their pods).
    fn hand_on(&self, groups: &[String]) -> impl Future<Output = Result<(), StateError>> + Send;
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Owner for Engine<P, G, S> {
    fn cap(&self) -> usize {
        self.core.settings.concurrency.max(1)
    }

    fn now(&self) -> Now {
        Now::of(self.core.clock.as_ref())
    }

    fn stop(&self) -> &Stop {
        &self.core.stop
    }

    async fn lease_ends(&self, keys: &[String]) -> Option<Vec<(String, Option<UnixMillis>)>> {
        let glances = match self.core.state.glance_many(keys).await {
            Ok(glances) => glances,
            Err(e) => {
                tracing::debug!(error = %e, groups = keys.len(), "reading the leases that park requests failed; they wait until those leases would expire");
                return None;
            }
        };
        // An expired lease is taken over only a grace after its expiry.
        let grace = self.core.settings.lease.takeover_grace;
        Some(
            glances
                .into_iter()
                .map(|(key, glance)| {
                    let ends = glance.lease.as_ref().map(|l| l.until.plus(grace));
                    (key, ends)
                })
                .collect(),
        )
    }

    async fn hand_on(&self, groups: &[String]) -> Result<(), StateError> {
        if groups.is_empty() {
            return Ok(());
        }
        tracing::info!(
            groups = groups.len(),
            "handing on the requests this run could not serve"
        );
        self.core.state
            .request_passes(&self.core.cluster, groups)
            .await
            .inspect_err(|e| tracing::warn!(error = %e, groups = groups.len(), "handing on the requests this run could not serve failed; the next full diff finds them by their pods"))
    }
}
