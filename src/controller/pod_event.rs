//! The pod-events function's run: one pod changed, so its groups are reconciled —
//! only those it can matter to — through a one-shot run of the same queue and runner as
//! every other function (see `one_pass`).
//!
//! Triage comes first and costs no Kubernetes call: an event from a namespace no group
//! is bound to is answered at once (with the namespaced RBAC the function could not even
//! read the pod there).

use std::collections::BTreeMap;
use std::time::Duration;

use super::Engine;
use crate::core::{PodFacts, UnixMillis};
use crate::groups::{Priority, TargetGroupApi};
use crate::pods::{PodSource, PodsError};
use crate::reconcile::{BoundGroup, PodEvent, PodEventError, RunOptions, START_CUTOFF, Scope};
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
        let started = self.core.clock.now();
        let mut report = Report::new("pod-events", &self.core.cluster, opts.dry_run, started);
        let (bound, accounts_failed) = self.bound_in(&event.namespace).await?;
        // An account that could not be read may hold groups this pod belongs in: say so
        // in every report until it can be read again.
        report.errors.extend(accounts_failed.iter().cloned());
        if bound.is_empty() {
            tracing::info!(namespace = %event.namespace, pod = %event.name, "no target group is bound to this namespace; ignored");
            report.notes.push(format!(
                "ignored: no target group is bound to namespace `{}` for cluster `{}` \
                 (as of the last discovery, recorded in the state table's index of bound \
                 groups; a group tagged since is bound by the next scheduled run)",
                event.namespace, self.core.cluster
            ));
            return Ok(report.finish(self.core.clock.now()));
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
        let (groups, unserved) = self.one_pass(bound, opts, &scope, gated.as_ref()).await;
        report.groups = groups;
        // A change neither applied nor handed on is an error: Lambda retries the event
        // (and the dead-letter queue keeps it when it keeps failing).
        if let Some(source) = unserved.error.filter(|_| !unserved.groups.is_empty()) {
            return Err(PodEventError::NotHandedOn {
                groups: unserved.groups,
                source,
            });
        }
        report.handed_on = unserved.groups;
        report.notes.push(format!(
            "pod {}/{} ({}): {} group(s) affected",
            event.namespace,
            event.name,
            event.reason,
            report.groups.len()
        ));
        Ok(report.finish(self.core.clock.now()))
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
        let now = self.core.clock.now();
        let mut until = now.plus(ready_wait);
        // A deadline that is not in the future is not a real one (`cargo lambda watch`
        // sends a duration there); ignore it.
        if let Some(d) = deadline.filter(|d| *d > now) {
            let reserve = u64::try_from((START_CUTOFF + WAIT_RESERVE).as_millis()).unwrap_or(0);
            until = until.min(UnixMillis(d.0.saturating_sub(reserve)));
        }
        loop {
            let Some(pod) = self.core.pods.get(&event.namespace, &event.name).await? else {
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
            if !starting || self.core.clock.now() >= until {
                return Ok(Some((labels, facts)));
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// The groups bound in `namespace` as of the last discovery (whichever function
    /// made it), and the accounts a discovery could not read when this one had to
    /// discover. The bound index holds them as of a generation of the state table's
    /// index of bound groups: one consistent read of that generation tells whether they
    /// still are the last discovery's; when it moved (or the namespace is not known
    /// yet), the namespace's rows are read and their groups' tags with one DescribeTags
    /// per 20 — not every group of the account (53 Describe calls at 1,000 groups, at a
    /// share of a Describe or two a second). Only when the state table has no index yet
    /// (or it cannot be read) does pod-events discover every group itself.
    async fn bound_in(
        &self,
        namespace: &str,
    ) -> Result<(Vec<BoundGroup>, Vec<String>), crate::groups::ElbError> {
        let now = self.core.clock.now();
        match self.core.state.index_meta(&self.core.cluster).await {
            Ok(meta) if meta.generation > 0 => {
                if self.core.index.knows(namespace, meta.generation) {
                    return Ok((self.core.index.in_namespace(namespace), Vec::new()));
                }
                match self.core.state.indexed_selections(&self.core.cluster).await {
                    Ok(rows) => {
                        let rows: Vec<IndexedGroup> = rows
                            .into_iter()
                            .filter(|r| r.namespace == namespace && r.bound)
                            .collect();
                        match self.read_indexed(namespace, &rows, now).await {
                            Ok(bound) => {
                                self.core.index.learned_namespace(
                                    namespace,
                                    bound.clone(),
                                    meta.generation,
                                );
                                return Ok((bound, Vec::new()));
                            }
                            Err(e) => {
                                tracing::debug!(namespace, error = %e, "reading the namespace's indexed groups failed; discovering every group instead");
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "reading this cluster's index failed; discovering every group instead");
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "reading this cluster's index failed; discovering every group instead");
            }
        }
        let bindings = self.core.bindings(&Priority::Reaction).await?;
        self.core.index.discovered(&bindings.bound, None);
        self.core.publish_bindings(&bindings).await;
        let failed = bindings
            .accounts_failed
            .iter()
            .map(ToString::to_string)
            .collect();
        let found = bindings
            .bound
            .into_iter()
            .filter(|b| b.binding.namespace == namespace)
            .collect();
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
            let (groups, _) = self.core.read_groups(batch).await?;
            bound.extend(
                groups
                    .into_iter()
                    .filter_map(|g| self.core.bind(g, now)?.ok())
                    .filter(|b| b.binding.namespace == namespace),
            );
        }
        Ok(bound)
    }
}
