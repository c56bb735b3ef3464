//! One group under its lease: passes of (fresh tags) → pods → health → plan →
//! write-ahead apply, with backoff holding back registrations only, and everything the
//! pass learned written in the write that ends it.
//!
//! Pods come from a consistent LIST made under the lease, or from pods a caller holds
//! (the controller's store, or the LIST the pod event's observation just made while
//! nothing was written to the group since) when they are at least as new as what the
//! group's last pass decided from (its recorded `resourceVersion`): so no pass undoes a
//! newer pass of another process with older reads. Every write records the version this
//! pass decided from. The lease is made ready (renewed if it runs low) before every write
//! and ELBv2 call, and fences every ELBv2 attempt.

use super::notes::{fail, note_backoff, pod_errors};
use super::reads::{PRIOR_READ_MAX_AGE, PodReads, PriorRead};
use super::refusals::{waiting, waiting_error};
use super::{BoundGroup, CUT, Failure, Reconciler, RunOptions};
use crate::core::checkpoint::fingerprint;
use crate::core::{
    Checkpoint, Gate, Holds, MAX_TARGETS_PER_CALL, PodIndex, Rules, Target, TargetHealth,
    UnixMillis, Wait, desired_targets, plan,
};
use crate::faults::FaultPoint;
use crate::groups::{ElbError, TargetGroupApi};
use crate::lease::{Lease, PassEnd};
use crate::pods::{PodSource, PodsError};
use crate::report::{GroupReport, Outcome};
use crate::state::{Change, GroupState, LedgerEntry, StateError, StateStore};

/// Why a pass stopped early.
pub(super) enum Stop {
    /// The group could not be reconciled; it backs off.
    Failed(Failure),
    /// The lease is gone: stop without writing anything more.
    LeaseLost,
    /// The group's tags changed since discovery and no longer make a binding for this
    /// cluster: leave it untouched (not a failure of the group; no backoff).
    Unbound,
    /// The run's time is up (or the process is shutting down): stop before the next
    /// change, write what was done, and ask for another pass.
    Cut,
    /// An injected fault: stop dead, as a crash would.
    Aborted,
}

impl Stop {
    /// A pass that may not write under its lease any more: cut when the process is
    /// shutting down and handed the lease over, otherwise the lease is lost.
    fn from_lease(e: StateError) -> Self {
        match e {
            StateError::HandedOver { .. } => Stop::Cut,
            _ => Stop::LeaseLost,
        }
    }
}

/// How a pass under the lease left its group: what the leased run decides the next
/// step from (the report only says it).
#[derive(Debug, Clone)]
pub(super) enum Verdict {
    /// It ran to its end: the group is right, or right but for registrations that wait
    /// until `retry_at` (held back by the group's backoff, or refused target by target).
    Settled {
        /// When waiting registrations are due, if any wait.
        retry_at: Option<UnixMillis>,
    },
    /// It failed; the group's stored backoff holds registrations until `until`.
    Failed {
        /// What failed.
        cause: Failure,
        /// The stored backoff's end.
        until: UnixMillis,
    },
    /// It stopped before it finished, wrote nothing more, or found the group unbound:
    /// the lease's run end says what follows.
    Stopped,
}

impl From<FaultPoint> for Stop {
    fn from(_: FaultPoint) -> Self {
        Self::Aborted
    }
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Reconciler<P, G, S> {
    /// One pass under the lease: pods from `reads` (see [`Reconciler::pass_pods`]), health
    /// from `prior` when it may stand for a fresh read.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn pass(
        &self,
        bound: &mut BoundGroup,
        state: GroupState,
        reads: &PodReads<'_>,
        prior: Option<&PriorRead>,
        lease: &Lease<'_, S>,
        report: &mut GroupReport,
        opts: &RunOptions,
    ) -> (PassEnd, Verdict) {
        report.passes += 1;
        if report.outcome == Outcome::Failed && report.next_attempt_at.is_none() {
            // An earlier pass ended with registrations waiting (no backoff): this one
            // says anew.
            report.outcome = Outcome::InSync;
            report.error = None;
        }
        report.waiting.clear();
        let mut ledger = state.ledger.clone();
        let mut holds = state.held.clone();
        let prior = prior.filter(|p| {
            state.version == p.version + 1 && self.clock.now() < p.at.plus(PRIOR_READ_MAX_AGE)
        });
        // The observation's LIST stands for the pass's own like its health read does.
        let listed = self.pass_pods(&bound.binding, &state, reads, prior).await;
        let (pods, version) = match &listed {
            Ok(listed) => (Ok(&listed.0), Some(listed.1.clone())),
            Err(e) => (Err(e), None),
        };
        let index = pods.map(|p| PodIndex::new(p));
        // What every write of this pass records: the version it decided from.
        let seen = version.map(|v| {
            let mut seen = state.seen.clone();
            seen.insert(self.cluster.clone(), v);
            seen
        });
        let ctx = PassContext {
            state: &state,
            pods: index.as_ref().map_err(|e| *e),
            seen: seen.as_ref(),
            prior,
            lease,
            opts,
        };
        let result = self
            .pass_inner(bound, &ctx, &mut ledger, &mut holds, report)
            .await;
        let now = self.clock.now();
        let mut change = Change {
            ledger: (ledger != state.ledger).then_some(ledger),
            held: (holds != state.held).then_some(holds),
            seen: seen.filter(|s| *s != state.seen),
            ..Change::default()
        };
        match result {
            Ok(passed) => {
                if state.backoff.is_some() && passed.verified.is_some() {
                    change.backoff = Some(None);
                }
                change.checkpoint = match passed.verified {
                    Some(desired) => Some(Some(Checkpoint {
                        desired,
                        verified_at: now,
                    })),
                    None => state.checkpoint.is_some().then_some(None),
                };
                if self.fault(FaultPoint::BeforeLeaseRelease).is_err() {
                    return (PassEnd::Abort, Verdict::Stopped);
                }
                let verdict = Verdict::Settled {
                    retry_at: passed.held_back.or(passed.waiting),
                };
                if passed.held_back.is_some() {
                    (PassEnd::GiveUp(change), verdict)
                } else {
                    (PassEnd::Done(change), verdict)
                }
            }
            Err(Stop::Aborted) => (PassEnd::Abort, Verdict::Stopped),
            Err(Stop::Unbound) => (PassEnd::GiveUp(Change::default()), Verdict::Stopped),
            Err(Stop::Cut) => {
                report.error = Some(CUT.into());
                (PassEnd::Cut(change), Verdict::Stopped)
            }
            Err(Stop::LeaseLost) => {
                report.outcome = Outcome::Failed;
                report.error = Some(
                    StateError::LeaseLost {
                        group: bound.group.arn.clone(),
                    }
                    .to_string(),
                );
                (PassEnd::Cut(Change::default()), Verdict::Stopped)
            }
            Err(Stop::Failed(cause)) => {
                let next =
                    self.settings
                        .backoff
                        .on_failure(state.backoff, now, &mut self.jitter_rng());
                report.outcome = Outcome::Failed;
                report.error = Some(cause.to_string());
                report.next_attempt_at = Some(next.next_attempt);
                change.backoff = Some(Some(next));
                if state.checkpoint.is_some() {
                    // Something is off: verify fully next time.
                    change.checkpoint = Some(None);
                }
                if self.fault(FaultPoint::BeforeLeaseRelease).is_err() {
                    return (PassEnd::Abort, Verdict::Stopped);
                }
                let verdict = Verdict::Failed {
                    cause,
                    until: next.next_attempt,
                };
                (PassEnd::GiveUp(change), verdict)
            }
        }
    }

    /// The pass proper; `ledger` is the working copy, stored ahead of registrations and
    /// at the end, `holds` the registrations held back target by target, stored at the
    /// end. Returns how it left the group (see [`Passed`]).
    async fn pass_inner(
        &self,
        bound: &mut BoundGroup,
        ctx: &PassContext<'_, '_, '_, S>,
        ledger: &mut std::collections::BTreeMap<Target, LedgerEntry>,
        holds: &mut Holds,
        report: &mut GroupReport,
    ) -> Result<Passed, Stop> {
        let (state, lease, opts) = (ctx.state, ctx.lease, ctx.opts);
        self.fault(FaultPoint::AfterLeaseAcquired)?;
        let mut refreshed = self
            .refresh_binding(bound, report, false, &opts.priority)
            .await?;
        let arn = bound.group.arn.clone();
        let pods = ctx
            .pods
            .map_err(|e| Stop::Failed(Failure::Pods(e.clone())))?;
        let actual = match ctx.prior {
            Some(prior) => prior.health.clone(),
            None => self.read_health(&arn, &opts.priority).await.map_err(|e| {
                if matches!(e, ElbError::NotFound { .. }) {
                    // Deleted: not acted on again until a discovery binds it.
                    self.index.unbound(&arn);
                }
                Stop::Failed(Failure::HealthRead(e))
            })?,
        };
        report.note_health(&actual);
        let now = self.clock.now();
        let (desired, mut plan) = loop {
            let desired = desired_targets(pods.candidates(&bound.binding), &bound.binding);
            let plan = plan(
                &desired.targets,
                actual.iter().map(TargetHealth::pair),
                &crate::state::claims(ledger, &self.cluster),
                &Rules::new(bound.binding.mode, now),
            );
            // Removing a target nobody's ledger holds (exclusive mode) follows tags read
            // in this pass, never a cached binding: the group may have been made shared.
            let removes_foreign = plan.deregister.iter().any(|t| !ledger.contains_key(t));
            if removes_foreign && !refreshed {
                refreshed = self
                    .refresh_binding(bound, report, true, &opts.priority)
                    .await?;
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
        let (held_back, held_until) = if let Gate::Wait { until } = gate
            && !plan.register.is_empty()
        {
            report.outcome = Outcome::BackingOff;
            note_backoff(report, until, state.backoff.as_ref());
            (std::mem::take(&mut plan.register), Some(until))
        } else {
            (Vec::new(), None)
        };
        let entry = |t: &Target| {
            desired.targets.get(t).map(|d| LedgerEntry {
                target: *t,
                pod: d.pod.as_ref().clone(),
                cluster: self.cluster.clone(),
                registered_at: now,
                deregistered_at: None,
            })
        };
        let mut failures = 0usize;
        // Deregistrations first: nothing delays one (not a ledger write, not a slow or
        // refused registration), the room they free counts against the group's targets
        // quota before the registrations need it, and a QUIC target whose server ID
        // changed leaves before it comes back with the new one.
        for chunk in plan.deregister.chunks(MAX_TARGETS_PER_CALL) {
            self.cut_point(opts)?;
            if let Err(e) = self
                .mutate(lease, &arn, chunk, Mutation::Deregister)
                .await?
            {
                failures += fail(report, chunk, "deregister", &e.to_string());
                continue;
            }
            report.applied_at.get_or_insert_with(|| self.clock.now());
            report.deregistered.extend_from_slice(chunk);
            // A tombstone only now, stored with the next ledger write (or at the end of
            // the pass): a crash before that leaves a live entry, which a later pass
            // forgets; never an owned target without one. The tombstone stays for the
            // forget grace, so a registration of it landing late is undone.
            let gone = self.clock.now();
            for t in chunk {
                match crate::core::plan::tombstone(gone) {
                    Some(at) => {
                        if let Some(e) = ledger.get_mut(t) {
                            e.deregistered_at = Some(at);
                        }
                    }
                    None => {
                        ledger.remove(t);
                    }
                }
            }
            self.fault(FaultPoint::AfterDeregisterChunk)?;
        }
        if (!plan.adopt.is_empty() || !plan.register.is_empty())
            && crate::state::owned_by(ledger, &self.cluster).is_empty()
        {
            // The group's first entry of this cluster: index it first, so a resync finds
            // the ledger if the group is ever unbound (the orphan report).
            self.record_bound(bound)
                .await
                .map_err(|e| Stop::Failed(Failure::Index(e)))?;
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
            self.store_ledger(ctx, ledger, &state.ledger).await?;
        }
        // Registrations, sorted by what holds them back (see `refusals`): fresh ones in
        // chunks, each due retry of a refused target alone, a full group's probe alone.
        let present = actual
            .iter()
            .filter(|h| !h.state.is_draining() && !report.deregistered.contains(&h.target))
            .count();
        let registered_before = report.registered.len();
        let sorted = holds.sort(&plan.register, present, now);
        let mut calls: std::collections::VecDeque<(Vec<Target>, Send)> = sorted
            .fresh
            .chunks(MAX_TARGETS_PER_CALL)
            .map(|c| (c.to_vec(), Send::Fresh))
            .chain(sorted.retries.iter().map(|t| (vec![*t], Send::Retry)))
            .chain(sorted.probe.map(|t| (vec![t], Send::Probe)))
            .collect();
        let mut full = false;
        while let Some((chunk, kind)) = calls.pop_front() {
            if full {
                // ELBv2 just refused a registration for capacity: the rest wait.
                continue;
            }
            self.cut_point(opts)?;
            // Write-ahead: never register a target the ledger does not know.
            let mut next = ledger.clone();
            next.extend(chunk.iter().filter_map(|t| entry(t).map(|e| (*t, e))));
            match self.store_ledger(ctx, &next, ledger).await {
                Ok(()) => *ledger = next,
                Err(Stop::Failed(e)) => {
                    failures += fail(report, &chunk, "register", &e.to_string());
                    continue;
                }
                Err(stop) => return Err(stop),
            }
            self.fault(FaultPoint::AfterLedgerWrite)?;
            let result = self.mutate(lease, &arn, &chunk, Mutation::Register).await?;
            if matches!(result, Ok(()) | Err(ElbError::Rejected { .. })) {
                report.applied_at.get_or_insert_with(|| self.clock.now());
            }
            match result {
                Ok(()) => {
                    report.registered.extend_from_slice(&chunk);
                    chunk.iter().for_each(|t| holds.took(t));
                    if kind == Send::Probe {
                        // Room beyond what was learnt: the rest go now.
                        holds.probe_taken();
                        let rest: Vec<Target> = sorted
                            .waiting
                            .iter()
                            .filter(|(t, w)| {
                                matches!(w, Wait::Full { .. }) && !holds.refused.contains_key(t)
                            })
                            .map(|(t, _)| *t)
                            .collect();
                        calls.extend(
                            rest.chunks(MAX_TARGETS_PER_CALL)
                                .map(|c| (c.to_vec(), Send::Fresh)),
                        );
                    }
                }
                Err(ElbError::Rejected { targets, .. }) => {
                    let took: Vec<Target> = chunk
                        .iter()
                        .filter(|t| !targets.iter().any(|r| r.target == **t))
                        .copied()
                        .collect();
                    took.iter().for_each(|t| holds.took(t));
                    report.registered.extend(took);
                    let settled = self
                        .settle_refusals(&arn, targets, &desired, report, lease, holds)
                        .await;
                    failures += settled.failures;
                    if settled.full {
                        full = true;
                        let holding = present + report.registered.len() - registered_before;
                        holds.filled(
                            holding,
                            self.clock.now(),
                            &self.settings.full_probe,
                            &mut self.jitter_rng(),
                        );
                    }
                }
                Err(e) => failures += fail(report, &chunk, "register", &e.to_string()),
            }
            self.fault(FaultPoint::AfterRegisterChunk)?;
        }
        let holding = present + report.registered.len() - registered_before;
        let unsent: Vec<Target> = plan
            .register
            .iter()
            .filter(|t| !report.registered.contains(t))
            .copied()
            .collect();
        let still = waiting(holds, &unsent, holding, &desired, self.clock.now());
        // When the first waiting registration is due: the next step's time.
        let first_retry = still.iter().map(|w| w.retry_at).min();
        report.waiting = still;
        // Refusals of targets this pass still wants (waiting, or held back by the
        // group's backoff) are kept; the others are forgotten.
        holds.settle(&self.cluster, |t| {
            unsent.contains(t) || held_back.contains(t)
        });
        for t in &plan.forget {
            ledger.remove(t);
        }
        report.forgotten.extend_from_slice(&plan.forget);
        let present = actual.iter().filter(|h| !h.state.is_draining()).count();
        report.registered_targets =
            Some((present + report.registered.len()).saturating_sub(report.deregistered.len()));
        report.healthy_targets = Some(
            actual
                .iter()
                .filter(|h| {
                    h.state == crate::core::HealthState::Healthy
                        && !report.deregistered.contains(&h.target)
                })
                .count(),
        );
        // What ELBv2 reports right after these changes: the gates' verdicts read it.
        let mut after: Vec<TargetHealth> = actual
            .iter()
            .filter(|h| !report.deregistered.contains(&h.target))
            .cloned()
            .collect();
        after.extend(report.registered.iter().map(|t| {
            TargetHealth::new(*t, crate::core::HealthState::Initial).with_reason(
                "Elb.RegistrationInProgress",
                Some("Target registration is in progress"),
            )
        }));
        self.memory.gates.remember_health(&arn, after);
        self.gates()
            .settle_selected(bound, pods.candidates(&bound.binding), report)
            .await;
        if failures > 0 {
            return Err(Stop::Failed(Failure::Changes(failures)));
        }
        if let Some(first) = first_retry {
            // Not right, yet no backoff of the group: the waiting targets are tried
            // again on their own (and no checkpoint).
            report.outcome = Outcome::Failed;
            report.error = Some(waiting_error(&report.waiting, holds));
            return Ok(Passed {
                verified: None,
                held_back: held_until,
                waiting: Some(first),
            });
        }
        Ok(Passed {
            verified: held_back.is_empty().then_some(fp),
            held_back: held_until,
            waiting: None,
        })
    }

    /// Stops the pass here if its run's time is up or the process is shutting down.
    fn cut_point(&self, opts: &RunOptions) -> Result<(), Stop> {
        if self.cut_due(opts) {
            return Err(Stop::Cut);
        }
        Ok(())
    }

    /// One Register/DeregisterTargets under the lease: the lease made ready first, every
    /// attempt fenced by it; when the fence stops a call because the lease ran low, the
    /// call is sent again once the lease is renewed. `Err` only when the lease is lost.
    async fn mutate(
        &self,
        lease: &Lease<'_, S>,
        arn: &str,
        chunk: &[Target],
        kind: Mutation,
    ) -> Result<Result<(), ElbError>, Stop> {
        loop {
            lease.ready().await.map_err(Stop::from_lease)?;
            let result = match kind {
                Mutation::Register => self.groups.register(arn, chunk, lease).await,
                Mutation::Deregister => self.groups.deregister(arn, chunk, lease).await,
            };
            match result {
                Err(ElbError::Fenced { .. }) => continue,
                other => return Ok(other),
            }
        }
    }

    /// Stores `next` as the ledger (fenced by the lease, with the pods' version the pass
    /// decided from) unless it equals `stored`.
    async fn store_ledger(
        &self,
        ctx: &PassContext<'_, '_, '_, S>,
        next: &std::collections::BTreeMap<Target, LedgerEntry>,
        stored: &std::collections::BTreeMap<Target, LedgerEntry>,
    ) -> Result<(), Stop> {
        if next == stored {
            return Ok(());
        }
        let change = Change {
            ledger: Some(next.clone()),
            seen: ctx.seen.cloned(),
            ..Change::default()
        };
        match ctx.lease.write(&change).await {
            Ok(()) => Ok(()),
            Err(e @ (StateError::LeaseLost { .. } | StateError::HandedOver { .. })) => {
                Err(Stop::from_lease(e))
            }
            Err(e) => Err(Stop::Failed(Failure::Ledger(e))),
        }
    }
}

/// What a pass works with besides the group: the state as of taking the lease, the
/// pods (indexed) or why they could not be read, the version map every write records,
/// a prior health read that may stand for the pass's own, the lease and the run's
/// options.
struct PassContext<'p, 'a, 'l, S> {
    state: &'p GroupState,
    pods: Result<&'p PodIndex<'a>, &'p PodsError>,
    seen: Option<&'p std::collections::BTreeMap<String, String>>,
    prior: Option<&'p PriorRead>,
    lease: &'p Lease<'l, S>,
    opts: &'p RunOptions,
}

/// How a pass that ran to its end left the group.
struct Passed {
    /// The desired set's fingerprint when the group was made exactly right (what a
    /// checkpoint may record).
    verified: Option<u64>,
    /// Registrations the group's backoff holds back until then.
    held_back: Option<UnixMillis>,
    /// Registrations waiting target by target, the first due then.
    waiting: Option<UnixMillis>,
}

/// What a registration call is, for what its answer teaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Send {
    /// Registrations nothing holds back.
    Fresh,
    /// A refused target's due retry, alone.
    Retry,
    /// A full group's probe for room, alone.
    Probe,
}

/// The two ELBv2 mutations.
#[derive(Debug, Clone, Copy)]
enum Mutation {
    Register,
    Deregister,
}
