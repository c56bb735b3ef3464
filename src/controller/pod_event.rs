//! The pod-events function's run: one pod changed, so its groups are reconciled —
//! only those it can matter to — through a one-shot run of the same queue and runner as
//! every other function (see `one_pass`).
//!
//! Triage comes first and costs no Kubernetes call: an event from a namespace no group
//! is bound to is answered at once (with the namespaced RBAC the function could not even
//! read the pod there).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::core::{PodFacts, UnixMillis};
use crate::groups::TargetGroupApi;
use crate::pods::{PodSource, PodsError};
use crate::reconcile::{
    BoundGroup, Engine, PodEvent, PodEventError, RunOptions, START_CUTOFF, Scope,
};
use crate::report::Report;
use crate::state::{IndexedGroup, StateStore};

/// How often a starting pod is read again while waiting for it to turn ready.
const READY_POLL: Duration = Duration::from_millis(250);

/// A readiness wait ends this long before the invocation's deadline, so the passes that
/// follow it still start (they need [`START_CUTOFF`]) and have time to finish.
const WAIT_RESERVE: Duration = Duration::from_secs(10);

/// Event reasons of a pod that is starting: the only ones worth waiting on (no event
/// says "the pod turned Ready"). A pod that is not ready for any other reason — a failed
/// readiness probe (`Unhealthy`), a stop — is acted on at once.
const STARTING: [&str; 4] = ["Started", "Created", "Pulled", "Scheduled"];

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
        let (bound, accounts_failed) = self.bound_in(&event.namespace).await?;
        // An account that could not be read may hold groups this pod belongs in: say so
        // in every report until it can be read again.
        report.errors.extend(accounts_failed.iter().cloned());
        if bound.is_empty() {
            tracing::info!(namespace = %event.namespace, pod = %event.name, "no target group is bound to this namespace; ignored");
            report.notes.push(format!(
                "ignored: no target group is bound to namespace `{}` for cluster `{}` \
                 (pod-events knows the groups holding this cluster's targets, and every \
                 group at a discovery; the schedule fills a group's first targets)",
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
        // A gated pod's gate is settled as its groups' passes register it, then looked
        // at every second while the invocation allows (the schedule's controller does
        // it otherwise).
        let gated = live.filter(|p| p.gate == Some(false));
        report.groups = self
            .one_pass(bound.to_vec(), opts, &scope, gated.as_ref())
            .await;
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

    /// The groups bound in `namespace`, and the accounts a discovery could not read,
    /// each cached per container for `discovery_ttl`: pod events are frequent, binding
    /// tags change rarely, and discovery costs ELBv2 Describe calls (a pass that
    /// changes a group re-reads its tags first; see `pass::refresh_binding`). Once the
    /// state table's index names this cluster's groups, a namespace's groups are read
    /// from their rows with one DescribeTags per 20, not by discovering every group of
    /// the account (53 Describe calls at 1,000 groups, at a share of a Describe or two a
    /// second). A group not in the index holds none of this cluster's targets yet: the
    /// schedule fills it, and a discovery (when the index is empty or cannot be read)
    /// finds it. The accounts whose discovery failed are cached with the groups (their
    /// errors are reported by every event meanwhile; retrying a role that cannot be
    /// assumed on every event would only spend STS and ELBv2 calls).
    async fn bound_in(&self, namespace: &str) -> Result<CachedBindings, crate::groups::ElbError> {
        let now = self.clock.now();
        let ttl = self.settings.discovery_ttl;
        let fresh = |at: UnixMillis| now < at.plus(ttl);
        let mut cache = self.bindings_cache.lock().await;
        if let Some((at, bound)) = cache.namespaces.get(namespace)
            && fresh(*at)
        {
            return Ok((bound.clone(), Arc::default()));
        }
        if let Some((at, (bound, failed))) = &cache.discovered
            && fresh(*at)
        {
            return Ok((in_namespace(bound, namespace), failed.clone()));
        }
        let index = match &cache.index {
            Some((at, index)) if fresh(*at) => Some(index.clone()),
            _ => match self.state.indexed_selections(&self.cluster).await {
                Ok(rows) if !rows.is_empty() => {
                    let mut index = IndexByNamespace::new();
                    for row in rows {
                        index.entry(row.namespace.clone()).or_default().push(row);
                    }
                    let index = Arc::new(index);
                    cache.index = Some((now, index.clone()));
                    Some(index)
                }
                Ok(_) => None,
                Err(e) => {
                    tracing::debug!(error = %e, "reading this cluster's index failed; discovering every group instead");
                    None
                }
            },
        };
        if let Some(index) = index {
            let rows = index.get(namespace).map(Vec::as_slice).unwrap_or_default();
            match self.read_indexed(namespace, rows, now).await {
                Ok(bound) => {
                    let bound = Arc::new(bound);
                    self.know_namespace(namespace, &bound);
                    cache
                        .namespaces
                        .insert(namespace.to_owned(), (now, bound.clone()));
                    return Ok((bound, Arc::default()));
                }
                Err(e) => {
                    tracing::debug!(namespace, error = %e, "reading the namespace's indexed groups failed; discovering every group instead");
                }
            }
        }
        let bindings = self.bindings().await?;
        let failed: Arc<Vec<String>> = Arc::new(
            bindings
                .accounts_failed
                .iter()
                .map(ToString::to_string)
                .collect(),
        );
        let bound = Arc::new(bindings.bound);
        let found = in_namespace(&bound, namespace);
        cache.discovered = Some((now, (bound, failed.clone())));
        Ok((found, failed))
    }

    /// The groups of `rows` (index rows of `namespace`) still bound there, their tags
    /// read at `now`.
    async fn read_indexed(
        &self,
        namespace: &str,
        rows: &[IndexedGroup],
        now: UnixMillis,
    ) -> Result<Vec<BoundGroup>, crate::groups::ElbError> {
        let mut bound = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(crate::aws::elbv2::TAGS_BATCH) {
            let batch = chunk
                .iter()
                .map(|r| (r.group.clone(), r.described.clone()))
                .collect();
            let (groups, _) = self.read_groups(batch).await?;
            bound.extend(
                groups
                    .into_iter()
                    .filter_map(|g| self.bind(g, now)?.ok())
                    .filter(|b| b.binding.namespace == namespace),
            );
        }
        Ok(bound)
    }

    /// Drops the cached bindings (a group vanished or its tags changed).
    async fn forget_bindings(&self) {
        *self.bindings_cache.lock().await = BindingsCache::default();
    }
}

/// The groups of `bound` bound in `namespace`.
fn in_namespace(bound: &[BoundGroup], namespace: &str) -> Arc<Vec<BoundGroup>> {
    Arc::new(
        bound
            .iter()
            .filter(|b| b.binding.namespace == namespace)
            .cloned()
            .collect(),
    )
}

/// This cluster's index rows, by namespace.
type IndexByNamespace = BTreeMap<String, Vec<IndexedGroup>>;

/// What pod-events reuses between events: the bound groups, and the accounts whose
/// discovery failed (reported with every event until the next discovery).
type CachedBindings = (Arc<Vec<BoundGroup>>, Arc<Vec<String>>);

/// What pod-events reuses between events, each for `discovery_ttl`.
#[derive(Default)]
pub struct BindingsCache {
    /// This cluster's index rows by namespace (none while the index names no group).
    index: Option<(UnixMillis, Arc<IndexByNamespace>)>,
    /// Each namespace's groups, read from its index rows.
    namespaces: HashMap<String, (UnixMillis, Arc<Vec<BoundGroup>>)>,
    /// Every bound group, from a discovery, and the accounts it could not read.
    discovered: Option<(UnixMillis, CachedBindings)>,
}
