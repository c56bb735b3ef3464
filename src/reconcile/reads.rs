//! Where a pass under the lease reads its pods and target health: a LIST made under
//! the lease, pods a caller holds (the controller's store) or the LIST and health read
//! of the observation just before — never pods behind what the group's last pass
//! decided from.

use std::sync::Arc;

use super::Reconciler;
use crate::core::{Binding, PodFacts, TargetHealth};
use crate::groups::TargetGroupApi;
use crate::pods::{PodSource, PodsError};
use crate::state::{GroupState, StateStore};

/// Pods a caller holds for a binding and the `resourceVersion` they are current to
/// (`None`: none to offer).
pub(crate) type HeldPods<'a> = &'a (dyn Fn(&Binding) -> Option<(Vec<PodFacts>, String)> + Sync);

/// Where a pass under the lease reads its pods.
pub(crate) enum PodReads<'a> {
    /// A consistent LIST of the group's pods (pod-events, manual runs).
    Fresh,
    /// Pods the caller holds (the controller's store); a LIST instead when they are
    /// behind the group's recorded version.
    Held(HeldPods<'a>),
}

/// The reads an observation made just before the lease was taken: a pass may reuse them
/// when nothing was written to the group in between (its version moved only by taking
/// the lease) and they are recent.
#[derive(Debug, Clone)]
pub(crate) struct PriorRead {
    /// The group's version the observation saw.
    pub version: u64,
    /// Target health as read then.
    pub health: Vec<TargetHealth>,
    /// When it was read.
    pub at: crate::core::UnixMillis,
    /// The consistent LIST the observation planned from (a superset of the group's
    /// pods) and its `resourceVersion`, when the caller kept it (pod events: it saves
    /// the pass a second LIST of the namespace).
    pub pods: Option<Arc<(Vec<PodFacts>, String)>>,
}

/// How old a prior health read may be to stand for the pass's own.
pub(super) const PRIOR_READ_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether pods current to `version` are behind `seen` (what the group's last pass
/// decided from). Resource versions are the API server's etcd revisions, compared as
/// numbers; one that is not a number is never trusted to be new enough.
pub(crate) fn behind(version: &str, seen: Option<&String>) -> bool {
    let Some(seen) = seen else { return false };
    match (version.parse::<u64>(), seen.parse::<u64>()) {
        (Ok(v), Ok(s)) => v < s,
        _ => version != seen,
    }
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Reconciler<P, G, S> {
    /// The pods a pass plans from, and the `resourceVersion` they are current to: pods
    /// held for it — the observation's LIST in `prior`, else the caller's (`reads`) —
    /// unless they are behind what the group's last pass decided from; else a LIST.
    pub(super) async fn pass_pods(
        &self,
        binding: &Binding,
        state: &GroupState,
        reads: &PodReads<'_>,
        prior: Option<&PriorRead>,
    ) -> Result<Arc<(Vec<PodFacts>, String)>, PodsError> {
        let held = prior.and_then(|p| p.pods.clone()).or_else(|| match reads {
            PodReads::Held(view) => view(binding).map(Arc::new),
            PodReads::Fresh => None,
        });
        if let Some(held) = held {
            if !behind(&held.1, state.seen.get(&self.cluster)) {
                return Ok(held);
            }
            tracing::debug!(namespace = %binding.namespace, held = %held.1, "the pods held for this pass are behind the group's last pass; listing pods afresh");
        }
        let listing = self
            .pods
            .list_versioned(&binding.namespace, Some(&binding.selector))
            .await?;
        Ok(Arc::new((listing.pods, listing.resource_version)))
    }
}
