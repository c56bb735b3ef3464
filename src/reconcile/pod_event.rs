//! One pod changed: reconcile just the groups it can matter to, through the same
//! observation, leases and passes as resync. The event is only a hint for *which*
//! groups; what they should hold is read afresh, as always.
//!
//! Triage comes first and costs no Kubernetes call: an event from a namespace no group
//! is bound to is answered at once (with the namespaced RBAC the function could not even
//! read the pod there).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::{BoundGroup, Engine, RunOptions, START_CUTOFF, Scope};
use crate::controller::GATE_POLL;
use crate::core::{PodFacts, UnixMillis, contribution};
use crate::groups::TargetGroupApi;
use crate::pods::{PodSource, PodsError};
use crate::report::{Outcome, Report};
use crate::state::StateStore;

/// How often a starting pod is read again while waiting for it to turn ready.
const READY_POLL: Duration = Duration::from_millis(250);

/// A readiness wait ends this long before the invocation's deadline, so the passes that
/// follow it still start (they need [`START_CUTOFF`]) and have time to finish.
const WAIT_RESERVE: Duration = Duration::from_secs(10);

/// Event reasons of a pod that is starting: the only ones worth waiting on (no event
/// says "the pod turned Ready"). A pod that is not ready for any other reason — a failed
/// readiness probe (`Unhealthy`), a stop — is acted on at once.
const STARTING: [&str; 4] = ["Started", "Created", "Pulled", "Scheduled"];

/// Which pod an event is about, and what the event already tells.
#[derive(Debug, Clone, PartialEq)]
pub struct PodEvent {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID when the event carries one.
    pub uid: Option<String>,
    /// Labels from the event (the exporter looks them up; absent for a pod gone).
    pub labels: Option<BTreeMap<String, String>>,
    /// The event says the pod was deleted.
    pub deleted: bool,
    /// Event reason (`Started`, `Killing`, ...), `pod` for a Pod detail, `invoke` for a
    /// direct invoke.
    pub reason: String,
}

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
    /// Reconciles the groups `event`'s pod can matter to. `ready_wait` bounds the wait
    /// for a starting pod to turn ready.
    pub async fn pod_event(
        &self,
        event: &PodEvent,
        ready_wait: Duration,
        opts: &RunOptions,
    ) -> Result<Report, PodEventError> {
        let started = self.clock.now();
        let mut report = Report::new("pod-events", &self.cluster, opts.dry_run, started);
        let (bound, accounts_failed) = self.cached_bindings().await?;
        // An account that could not be read may hold groups this pod belongs in: say so
        // in every report until it can be read again.
        report.errors.extend(accounts_failed.iter().cloned());
        let in_namespace: Vec<BoundGroup> = bound
            .iter()
            .filter(|b| b.binding.namespace == event.namespace)
            .cloned()
            .collect();
        if in_namespace.is_empty() {
            tracing::info!(namespace = %event.namespace, pod = %event.name, "no target group is bound to this namespace; ignored");
            report.notes.push(format!(
                "ignored: no target group is bound to namespace `{}` for cluster `{}`",
                event.namespace, self.cluster
            ));
            return Ok(report.finish(self.clock.now()));
        }
        // The pod's current labels (they decide which groups select it); a starting pod
        // is also given a bounded time to turn ready. A pod the event says is deleted is
        // found through the ledgers instead.
        let mut focus = event.clone();
        let mut live = None;
        if !event.deleted {
            let wait = if STARTING.contains(&event.reason.as_str()) {
                ready_wait
            } else {
                Duration::ZERO
            };
            if let Some((labels, facts)) = self.wait_until_ready(event, wait, opts.deadline).await?
            {
                focus.labels = labels;
                live = Some(facts);
            }
        }
        let scope = Scope {
            focus: Some(&focus),
            ..Scope::default()
        };
        report.groups = self
            .reconcile_scoped(in_namespace.clone(), opts, &scope)
            .await;
        if let Some(pod) = live.filter(|p| p.gate == Some(false))
            && !opts.dry_run
        {
            self.open_gate_when_healthy(&pod, &in_namespace, &mut report, opts.deadline)
                .await;
        }
        report.notes.push(format!(
            "pod {}/{} ({}): {} group(s) affected",
            event.namespace,
            event.name,
            event.reason,
            report.groups.len()
        ));
        if report.groups.iter().any(|g| g.gone) {
            self.forget_bindings().await;
        }
        Ok(report.finish(self.clock.now()))
    }

    /// Reads the pod; while it is starting (Running, not yet ready), again until it is
    /// ready (or no longer Running, or gone), at most until `ready_wait` ends — and
    /// always early enough that the passes that follow have their time. Returns the
    /// pod's labels when it was found.
    async fn wait_until_ready(
        &self,
        event: &PodEvent,
        ready_wait: Duration,
        deadline: Option<UnixMillis>,
    ) -> Result<Option<(Option<BTreeMap<String, String>>, PodFacts)>, PodsError> {
        let now = self.clock.now();
        let mut until = now.plus(ready_wait);
        // A deadline that is not in the future is not a real one (`cargo lambda watch`
        // sends a duration there); ignore it.
        if let Some(d) = deadline.filter(|d| *d > now) {
            let reserve = u64::try_from((START_CUTOFF + WAIT_RESERVE).as_millis()).unwrap_or(0);
            until = until.min(UnixMillis(d.0.saturating_sub(reserve)));
        }
        loop {
            let Some(pod) = self.pods.get(&event.namespace, &event.name).await? else {
                return Ok(None);
            };
            let labels = pod.metadata.labels.clone();
            let facts = PodFacts::from_pod(pod);
            let starting = facts.phase == "Running"
                && !facts.terminating
                && !facts.excluded
                && !(if facts.gate.is_some() {
                    facts.containers_ready
                } else {
                    facts.ready
                });
            if !starting || self.clock.now() >= until {
                return Ok(Some((labels, facts)));
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// For a gated pod this event registered: settles its gate every [`GATE_POLL`] —
    /// opened once its target is healthy in every bound group that selects it, closed
    /// with ELBv2's reason meanwhile — for as long as the invocation allows (the
    /// schedule's controller does it otherwise).
    async fn open_gate_when_healthy(
        &self,
        pod: &PodFacts,
        groups: &[BoundGroup],
        report: &mut Report,
        deadline: Option<UnixMillis>,
    ) {
        let now = self.clock.now();
        let Some(until) = deadline.filter(|d| *d > now).map(|d| {
            UnixMillis(d.0.saturating_sub(u64::try_from(START_CUTOFF.as_millis()).unwrap_or(0)))
        }) else {
            return;
        };
        // The report of the first group that selects the pod and was not failing.
        let Some(arn) = groups
            .iter()
            .filter(|b| matches!(contribution(pod, &b.binding), Some((_, Some(false)))))
            .map(|b| b.group.arn.clone())
            .find(|arn| {
                report
                    .group(arn)
                    .is_some_and(|g| !matches!(g.outcome, Outcome::Failed | Outcome::BindingError))
            })
        else {
            return;
        };
        let name = pod.pod.to_string();
        if report.groups.iter().any(|g| g.gates_opened.contains(&name)) {
            return;
        }
        // At most as many polls as fit before `until` (whatever the clock says later).
        let poll_ms = u64::try_from(GATE_POLL.as_millis()).unwrap_or(1).max(1);
        let polls = until.0.saturating_sub(now.0) / poll_ms;
        // The target turned healthy after the last verdict that found it not so.
        let mut closed_at = now;
        for _ in 0..polls {
            if self.clock.now().plus(GATE_POLL) >= until {
                return;
            }
            tokio::time::sleep(GATE_POLL).await;
            let Some(g) = report.groups.iter_mut().find(|g| g.target_group_arn == arn) else {
                return;
            };
            let verdict_at = self.clock.now();
            match self.settle_gate(pod, g).await {
                super::gates::Settled::Opened => {
                    let latency = self.clock.now().0.saturating_sub(closed_at.0);
                    self.gate_done(Duration::from_millis(latency));
                    return;
                }
                super::gates::Settled::Failed => return,
                super::gates::Settled::Closed | super::gates::Settled::Unchanged => {
                    closed_at = verdict_at;
                }
            }
        }
    }

    /// Bound groups, cached per container for `discovery_ttl`: pod events are frequent,
    /// binding tags change rarely, and discovery costs ELBv2 Describe calls. (A pass
    /// that changes a group re-reads its tags first; see `pass::refresh_binding`.)
    /// The accounts whose discovery failed are cached with them (their errors are
    /// reported by every event meanwhile; retrying a role that cannot be assumed on every
    /// event would only spend STS and ELBv2 calls).
    async fn cached_bindings(&self) -> Result<super::CachedBindings, crate::groups::ElbError> {
        let now = self.clock.now();
        let mut cache = self.bindings_cache.lock().await;
        if let Some((at, cached)) = cache.as_ref()
            && now < at.plus(self.settings.discovery_ttl)
        {
            return Ok(cached.clone());
        }
        let bindings = self.bindings().await?;
        let cached = (
            Arc::new(bindings.bound),
            Arc::new(
                bindings
                    .accounts_failed
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            ),
        );
        *cache = Some((now, cached.clone()));
        Ok(cached)
    }

    /// Drops the cached bindings (a group vanished or its tags changed).
    async fn forget_bindings(&self) {
        *self.bindings_cache.lock().await = None;
    }
}
