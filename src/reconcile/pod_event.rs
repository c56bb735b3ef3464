//! One pod changed: reconcile just the groups it touches, through the same leases and
//! passes as resync. The event is only a hint for *which* groups; what they should hold
//! is read afresh, as always.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::{BoundGroup, Engine, RunOptions};
use crate::core::{Labels, PodFacts, UnixMillis};
use crate::groups::TargetGroupApi;
use crate::input::pod_event::PodEvent;
use crate::pods::{PodSource, PodsError};
use crate::report::Report;
use crate::state::StateStore;

/// How often a not-yet-ready pod is read again while waiting.
const READY_POLL: Duration = Duration::from_millis(250);

/// Why a pod event could not be handled; the invocation fails so EventBridge retries it.
#[derive(Debug, thiserror::Error)]
pub enum PodEventError {
    /// The pod could not be read.
    #[error(transparent)]
    Pods(#[from] PodsError),
    /// Target groups could not be discovered.
    #[error("discovering target groups failed: {0}")]
    Discovery(#[from] crate::groups::ElbError),
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    /// Reconciles the groups `event`'s pod touches. `ready_wait` bounds the wait for a
    /// Running pod to turn ready (no event says "pod became Ready").
    pub async fn pod_event(
        &self,
        event: &PodEvent,
        ready_wait: Duration,
        opts: &RunOptions,
    ) -> Result<Report, PodEventError> {
        let started = self.clock.now();
        let mut report = Report::new("pod-events", &self.cluster, opts.dry_run, started);
        let live = self
            .wait_until_ready(event, ready_wait, opts.deadline)
            .await?;
        let gone = live
            .as_ref()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            || event.deleted;
        let labels: Option<Labels> = live
            .as_ref()
            .and_then(|p| p.metadata.labels.clone())
            .or_else(|| event.labels.clone())
            .map(Labels::from);
        let bound = self.cached_bindings().await?;
        let mut affected: Vec<BoundGroup> = Vec::new();
        for b in bound
            .iter()
            .filter(|b| b.binding.namespace == event.namespace)
        {
            let selected = labels
                .as_ref()
                .is_some_and(|l| b.binding.selector.matches(l));
            if selected || (gone && self.ledger_holds(&b.group.arn, event).await) {
                affected.push(b.clone());
            }
        }
        report.notes.push(format!(
            "pod {}/{} ({}{}): {} group(s) affected",
            event.namespace,
            event.name,
            event.reason,
            if live.is_none() {
                ", gone"
            } else if gone {
                ", terminating"
            } else {
                ""
            },
            affected.len()
        ));
        report.groups = self.reconcile_groups(affected, opts).await;
        if report
            .groups
            .iter()
            .any(|g| g.error.as_deref().is_some_and(|e| e.contains("not found")))
        {
            self.forget_bindings().await;
        }
        Ok(report.finish(self.clock.now()))
    }

    /// Reads the pod; while it is Running but not ready, re-reads it until it is ready,
    /// gone, terminating, or the wait (bounded by the invocation deadline) is over.
    async fn wait_until_ready(
        &self,
        event: &PodEvent,
        ready_wait: Duration,
        deadline: Option<UnixMillis>,
    ) -> Result<Option<Pod>, PodsError> {
        let now = self.clock.now();
        let mut until = now.plus(ready_wait);
        // A deadline that is not in the future is not a real one (`cargo lambda watch`
        // sends a duration there); ignore it, as `lease_until` does.
        if let Some(d) = deadline.filter(|d| *d > now) {
            // Leave time to reconcile after waiting.
            until = until.min(UnixMillis(d.0.saturating_sub(15_000)));
        }
        loop {
            let pod = self.pods.get(&event.namespace, &event.name).await?;
            let Some(p) = &pod else { return Ok(None) };
            let facts = PodFacts::from_pod(p.clone());
            let waiting = facts.phase == "Running"
                && !facts.terminating
                && !facts.excluded
                && !(if facts.gate.is_some() {
                    facts.containers_ready
                } else {
                    facts.ready
                });
            if !waiting || self.clock.now() >= until {
                return Ok(pod);
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// Whether the group's ledger holds a target of this pod (by namespace and name).
    async fn ledger_holds(&self, arn: &str, event: &PodEvent) -> bool {
        match self.state.load(arn).await {
            Ok(state) => state
                .ledger
                .values()
                .any(|row| row.pod.namespace == event.namespace && row.pod.name == event.name),
            Err(e) => {
                tracing::warn!(target_group = %arn, error = %e, "ledger lookup failed; the group is reconciled anyway");
                true
            }
        }
    }

    /// Bound groups, cached per container for `discovery_ttl`: pod events are frequent,
    /// binding tags change rarely, and discovery costs ELBv2 Describe calls.
    async fn cached_bindings(&self) -> Result<Arc<Vec<BoundGroup>>, crate::groups::ElbError> {
        let now = self.clock.now();
        let mut cache = self.bindings_cache.lock().await;
        if let Some((at, bound)) = cache.as_ref()
            && now < at.plus(self.settings.discovery_ttl)
        {
            return Ok(bound.clone());
        }
        let bound = Arc::new(self.bindings().await?.bound);
        *cache = Some((now, bound.clone()));
        Ok(bound)
    }

    /// Drops the cached bindings (a group vanished).
    async fn forget_bindings(&self) {
        *self.bindings_cache.lock().await = None;
    }
}
