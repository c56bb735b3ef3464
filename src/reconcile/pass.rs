//! One group under its lease: passes of (fresh tags) → pods → health → plan →
//! write-ahead apply, with backoff holding back registrations only, and everything the
//! pass learned written in the write that ends it.

use super::observe::{note_backoff, pod_errors};
use super::refusals::{Settled, capacity_error};
use super::{BoundGroup, Engine, RunOptions};
use crate::core::checkpoint::fingerprint;
use crate::core::{
    Binding, Checkpoint, Gate, MAX_TARGETS_PER_CALL, PodIndex, Rules, Target, TargetHealth,
    desired_targets, plan,
};
use crate::faults::FaultPoint;
use crate::groups::{ElbError, TargetGroupApi};
use crate::lease::{Lease, PassEnd};
use crate::pods::{PodSource, PodsError};
use crate::report::{FailedTarget, GroupReport, Outcome};
use crate::state::{Change, GroupState, LedgerEntry, StateError, StateStore};

/// Why a pass stopped early.
enum Stop {
    /// The group could not be reconciled; it backs off.
    Failed(String),
    /// The lease is gone: stop without writing anything more.
    LeaseLost,
    /// The group's tags changed since discovery and no longer make a binding for this
    /// cluster: leave it untouched (not a failure of the group; no backoff).
    Unbound,
    /// An injected fault: stop dead, as a crash would.
    Aborted,
}

impl From<FaultPoint> for Stop {
    fn from(_: FaultPoint) -> Self {
        Self::Aborted
    }
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    /// One pass under the lease. `pods` were listed after the lease was taken.
    pub(super) async fn pass(
        &self,
        bound: &mut BoundGroup,
        state: GroupState,
        pods: Result<&PodIndex<'_>, &PodsError>,
        lease: &Lease<'_, S>,
        report: &mut GroupReport,
        opts: &RunOptions,
    ) -> PassEnd {
        report.passes += 1;
        if report.outcome == Outcome::Failed && report.next_attempt_at.is_none() {
            // An earlier pass ended over capacity (no backoff): this one says anew.
            report.outcome = Outcome::InSync;
            report.error = None;
        }
        let mut ledger = state.ledger.clone();
        let result = self
            .pass_inner(bound, &state, &mut ledger, pods, lease, report, opts)
            .await;
        let now = self.clock.now();
        let mut change = Change {
            ledger: (ledger != state.ledger).then_some(ledger),
            ..Change::default()
        };
        match result {
            Ok(verified) => {
                if state.backoff.is_some() && verified.is_some() {
                    change.backoff = Some(None);
                }
                change.checkpoint = match verified {
                    Some(desired) => Some(Some(Checkpoint {
                        desired,
                        verified_at: now,
                    })),
                    None => state.checkpoint.is_some().then_some(None),
                };
                if self.fault(FaultPoint::BeforeLeaseRelease).is_err() {
                    return PassEnd::Abort;
                }
                if report.outcome == Outcome::BackingOff {
                    PassEnd::GiveUp(change)
                } else {
                    PassEnd::Done(change)
                }
            }
            Err(Stop::Aborted) => PassEnd::Abort,
            Err(Stop::Unbound) => PassEnd::GiveUp(Change::default()),
            Err(Stop::LeaseLost) => {
                report.outcome = Outcome::Failed;
                report.error = Some(
                    StateError::LeaseLost {
                        group: bound.group.arn.clone(),
                    }
                    .to_string(),
                );
                PassEnd::Done(Change::default())
            }
            Err(Stop::Failed(msg)) => {
                let next =
                    self.settings
                        .backoff
                        .on_failure(state.backoff, now, &mut self.jitter_rng());
                report.outcome = Outcome::Failed;
                report.error = Some(msg);
                report.next_attempt_at = Some(next.next_attempt);
                change.backoff = Some(Some(next));
                if state.checkpoint.is_some() {
                    // Something is off: verify fully next time.
                    change.checkpoint = Some(None);
                }
                if self.fault(FaultPoint::BeforeLeaseRelease).is_err() {
                    return PassEnd::Abort;
                }
                PassEnd::GiveUp(change)
            }
        }
    }

    /// The pass proper; `ledger` is the working copy, stored ahead of registrations and
    /// at the end. Returns the desired set's fingerprint when the group was made exactly
    /// right (what a checkpoint may record).
    #[allow(clippy::too_many_arguments)]
    async fn pass_inner(
        &self,
        bound: &mut BoundGroup,
        state: &GroupState,
        ledger: &mut std::collections::BTreeMap<Target, LedgerEntry>,
        pods: Result<&PodIndex<'_>, &PodsError>,
        lease: &Lease<'_, S>,
        report: &mut GroupReport,
        opts: &RunOptions,
    ) -> Result<Option<u64>, Stop> {
        self.fault(FaultPoint::AfterLeaseAcquired)?;
        let mut refreshed = self.refresh_binding(bound, report, false).await?;
        let arn = bound.group.arn.clone();
        let pods = pods.map_err(|e| Stop::Failed(e.to_string()))?;
        let actual = self.groups.health(&arn).await.map_err(|e| {
            report.gone = matches!(e, ElbError::NotFound { .. });
            Stop::Failed(format!("reading target health failed: {e}"))
        })?;
        report.note_health(&actual);
        let now = self.clock.now();
        let (desired, mut plan) = loop {
            let desired = desired_targets(pods.candidates(&bound.binding), &bound.binding);
            let plan = plan(
                &desired.targets,
                actual.iter().map(TargetHealth::pair),
                &self.claims(ledger),
                &Rules::new(bound.binding.mode, now),
            );
            // Removing a target nobody's ledger holds (exclusive mode) follows tags read
            // in this pass, never a cached binding: the group may have been made shared.
            let removes_foreign = plan.deregister.iter().any(|t| !ledger.contains_key(t));
            if removes_foreign && !refreshed {
                refreshed = self.refresh_binding(bound, report, true).await?;
                continue;
            }
            break (desired, plan);
        };
        report.desired = desired.targets.len();
        report.pod_errors = pod_errors(&desired);
        let fp = fingerprint(desired.targets.keys());
        report.foreign_kept.clone_from(&plan.foreign_kept);
        let gate = self
            .settings
            .backoff
            .gate(state.backoff.as_ref(), now, opts.force);
        let held_back = if let Gate::Wait { until } = gate
            && !plan.register.is_empty()
        {
            report.outcome = Outcome::BackingOff;
            note_backoff(report, until, state.backoff.as_ref());
            std::mem::take(&mut plan.register)
        } else {
            Vec::new()
        };
        let entry = |t: &Target| {
            desired.targets.get(t).map(|d| LedgerEntry {
                target: *t,
                pod: d.pod.as_ref().clone(),
                cluster: self.cluster.clone(),
                registered_at: now,
            })
        };
        let mut failures = 0usize;
        // Deregistrations first: nothing delays one (not a ledger write, not a slow or
        // refused registration), the room they free counts against the group's targets
        // quota before the registrations need it, and a QUIC target whose server ID
        // changed leaves before it comes back with the new one.
        for chunk in plan.deregister.chunks(MAX_TARGETS_PER_CALL) {
            lease.check().map_err(|_| Stop::LeaseLost)?;
            if let Err(e) = self.groups.deregister(&arn, chunk).await {
                failures += fail(report, chunk, "deregister", &e.to_string());
                continue;
            }
            report.deregistered.extend_from_slice(chunk);
            // Removed from the ledger only now, and stored with the next ledger write (or
            // at the end of the pass): a crash before that leaves a stale entry, which a
            // later pass forgets; never an owned target without one.
            for t in chunk {
                ledger.remove(t);
            }
            self.fault(FaultPoint::AfterDeregisterChunk)?;
        }
        if (!plan.adopt.is_empty() || !plan.register.is_empty()) && self.mine(ledger).is_empty() {
            // The group's first entry of this cluster: index it first, so a resync finds
            // the ledger if the group is ever unbound (the orphan report).
            self.state.index(&arn, &self.cluster).await.map_err(|e| {
                Stop::Failed(format!(
                    "indexing the group in the state table failed, nothing registered: {e}"
                ))
            })?;
        }
        // Adopt (and take over other clusters' stale claims on our live pods' IPs):
        // ownership only, stored with the first write.
        let mut adopted = false;
        for t in &plan.adopt {
            if let Some(e) = entry(t) {
                ledger.insert(*t, e);
                adopted = true;
            }
        }
        if adopted && plan.register.is_empty() {
            self.store_ledger(lease, ledger, &state.ledger).await?;
        }
        let mut settled = Settled::default();
        for chunk in plan.register.chunks(MAX_TARGETS_PER_CALL) {
            // Write-ahead: never register a target the ledger does not know.
            let mut next = ledger.clone();
            next.extend(chunk.iter().filter_map(|t| entry(t).map(|e| (*t, e))));
            match self.store_ledger(lease, &next, ledger).await {
                Ok(()) => *ledger = next,
                Err(Stop::Failed(e)) => {
                    failures += fail(report, chunk, "register", &e);
                    continue;
                }
                Err(stop) => return Err(stop),
            }
            self.fault(FaultPoint::AfterLedgerWrite)?;
            lease.check().map_err(|_| Stop::LeaseLost)?;
            match self.groups.register(&arn, chunk).await {
                Ok(()) => report.registered.extend_from_slice(chunk),
                Err(ElbError::Rejected { targets, .. }) => {
                    report.registered.extend(
                        chunk
                            .iter()
                            .filter(|t| !targets.iter().any(|r| r.target == **t)),
                    );
                    settled += self.settle_refusals(&arn, targets, &desired, report).await;
                }
                Err(e) => failures += fail(report, chunk, "register", &e.to_string()),
            }
            self.fault(FaultPoint::AfterRegisterChunk)?;
        }
        for t in &plan.forget {
            ledger.remove(t);
        }
        report.forgotten.extend_from_slice(&plan.forget);
        self.open_gates(&desired, &actual, report).await;
        failures += settled.failures;
        if failures > 0 {
            return Err(Stop::Failed(format!(
                "{failures} change(s) failed; see failedTargets"
            )));
        }
        if settled.over_capacity > 0 {
            // Not right, yet no backoff: only capacity can fix it (and no checkpoint).
            report.outcome = Outcome::Failed;
            report.error = Some(capacity_error(settled.over_capacity));
            return Ok(None);
        }
        Ok(held_back.is_empty().then_some(fp))
    }

    /// Stores `next` as the ledger (fenced by the lease) unless it equals `stored`.
    async fn store_ledger(
        &self,
        lease: &Lease<'_, S>,
        next: &std::collections::BTreeMap<Target, LedgerEntry>,
        stored: &std::collections::BTreeMap<Target, LedgerEntry>,
    ) -> Result<(), Stop> {
        if next == stored {
            return Ok(());
        }
        let change = Change {
            ledger: Some(next.clone()),
            ..Change::default()
        };
        match lease.write(&change).await {
            Ok(()) => Ok(()),
            Err(StateError::LeaseLost { .. }) => Err(Stop::LeaseLost),
            Err(e) => Err(Stop::Failed(format!(
                "ledger write failed, not registered: {e}"
            ))),
        }
    }

    /// Re-reads the group's tags when its binding is older than `binding_max_age` (pod
    /// events and watch mode work from cached bindings), or always with `force`: what
    /// the pass changes follows tags read now. Whether they were read.
    async fn refresh_binding(
        &self,
        bound: &mut BoundGroup,
        report: &mut GroupReport,
        force: bool,
    ) -> Result<bool, Stop> {
        let now = self.clock.now();
        if !force && now < bound.read_at.plus(self.settings.binding_max_age) {
            return Ok(false);
        }
        let tags = match self.groups.tags(&bound.group.arn).await {
            Ok(tags) => tags,
            Err(e) => {
                report.gone = matches!(e, ElbError::NotFound { .. });
                return Err(Stop::Failed(format!(
                    "reading the group's tags failed: {e}"
                )));
            }
        };
        match Binding::for_cluster(
            &tags,
            &bound.group.facts,
            &self.cluster,
            &self.settings.binding_policy,
        ) {
            Some(Ok(binding))
                if binding.namespace != bound.binding.namespace
                    || binding.selector != bound.binding.selector =>
            {
                // The pods in hand were listed for the old selection: acting on them
                // would be acting on partial data.
                report.gone = true;
                report.outcome = Outcome::Deferred;
                report.error = Some(
                    "the group's namespace or selector tag changed since discovery; the next run reconciles it with the new tags"
                        .into(),
                );
                Err(Stop::Unbound)
            }
            Some(Ok(binding)) => {
                bound.binding = binding;
                bound.group.tags = tags;
                bound.read_at = now;
                Ok(true)
            }
            other => {
                report.gone = true;
                report.outcome = Outcome::BindingError;
                report.error = Some(match other {
                    Some(Err(e)) => {
                        format!("{e} (tags changed since discovery; the group is left untouched)")
                    }
                    _ => format!(
                        "the group's tags no longer bind it to cluster `{}` (changed since discovery); left untouched",
                        self.cluster
                    ),
                });
                Err(Stop::Unbound)
            }
        }
    }
}

/// Records a failed chunk in the report; returns 1 for counting.
pub(super) fn fail(
    report: &mut GroupReport,
    chunk: &[Target],
    operation: &'static str,
    error: &str,
) -> usize {
    tracing::warn!(operation, targets = chunk.len(), error = %error, "ELBv2 change failed");
    report
        .failed_targets
        .extend(chunk.iter().map(|t| FailedTarget {
            target: *t,
            operation,
            error: error.to_owned(),
        }));
    1
}
