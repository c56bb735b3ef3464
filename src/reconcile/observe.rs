//! Looking at a group without its lease: state, desired targets, target health, plan.
//! Most runs end here — the group is right, so nothing is written and no lease taken —
//! and only a group whose plan is not empty goes on to [`super::pass`], which takes the
//! lease and reads everything afresh before acting. A group whose item shows its lease
//! held by another process is parked before its health is read ([`super::elsewhere`]).

use super::notes::{note_backoff, pod_errors};
use super::read_ahead::Ahead;
use super::refusals::{waiting, waiting_error};
use super::{Action, Failure, PassError, Reconciled};
use super::{BoundGroup, Reconciler, RunOptions, Scope};
use crate::core::checkpoint::{fingerprint, may_skip};
use crate::core::{
    Checkpoint, Desired, Gate, Labels, PodIndex, Rules, TargetHealth, desired_targets, holding,
    plan,
};
use crate::groups::{ElbError, TargetGroupApi};
use crate::pods::PodSource;
use crate::report::{GroupReport, Outcome};
use crate::state::StateStore;

/// What looking at a group found.
pub(crate) enum Observed {
    /// Nothing to change (or nothing possible now); the report says which, and what
    /// should happen next.
    Done(GroupReport, Reconciled),
    /// Not the business of the pod event that asked (no report).
    Irrelevant,
    /// Something to change: take the lease. The report so far, and the health read
    /// the plan came from (a pass may reuse it).
    Change(GroupReport, super::reads::PriorRead),
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Reconciler<P, G, S> {
    /// Observes `bound` against `pods` (one consistent LIST of its namespace, or the
    /// controller's store), and checks its pods for the rollout (see
    /// [`super::rollout`]; the group's attributes are read only by a look that
    /// verified the group and has nothing to change).
    pub(crate) async fn observe(
        &self,
        bound: &BoundGroup,
        pods: &PodIndex<'_>,
        opts: &RunOptions,
        scope: &Scope<'_>,
    ) -> Observed {
        match self.observe_group(bound, pods, opts, scope).await {
            Observed::Done(mut report, action) => {
                let may_read = super::rollout::look_may_read(&report);
                self.check_rollout(bound, pods, opts, &mut report, may_read)
                    .await;
                Observed::Done(report, action)
            }
            Observed::Change(mut report, prior) => {
                self.check_rollout(bound, pods, opts, &mut report, false)
                    .await;
                Observed::Change(report, prior)
            }
            Observed::Irrelevant => Observed::Irrelevant,
        }
    }

    /// The look proper.
    async fn observe_group(
        &self,
        bound: &BoundGroup,
        pods: &PodIndex<'_>,
        opts: &RunOptions,
        scope: &Scope<'_>,
    ) -> Observed {
        let arn = bound.group.arn.as_str();
        let mut report = GroupReport::new(arn, &bound.group.group_name(), Outcome::InSync);
        // A full diff reads its groups' states ahead, whole or as glances (the items but
        // their ledgers); a look whose glance does not find the group at rest, like any
        // look not served ahead, reads the group whole.
        let (mut wanted, mut whole) = (None, None);
        // A group not in the index may hold this cluster's entries: adding it (below)
        // depends on its ledger, so a glance cannot end its look.
        let indexed = scope.indexed.is_none_or(|i| i.contains(arn));
        if let Some(ahead) = scope.ahead
            && !opts.dry_run
            && scope.focus.is_none()
        {
            match ahead.take(&self.state, arn, &*self.clock).await {
                Some(Ahead::Glance(glance)) => {
                    let (desired, fp) = wanted_targets(bound, pods, &mut report);
                    let now = self.clock.now();
                    // Someone is at work on the group, or asked for a pass nobody served.
                    let busy = glance.held_by_other(None, now) || glance.dirty;
                    let cp = glance.checkpoint.as_ref();
                    let rest = indexed && at_rest(arn, &desired, fp, cp, busy, opts, scope);
                    ahead.settled(rest);
                    if rest {
                        report.verification_skipped = true;
                        return Observed::Done(report, Ok(Action::Done));
                    }
                    wanted = Some((desired, fp));
                }
                Some(Ahead::Whole(state)) => whole = Some((ahead, state)),
                None => {}
            }
        }
        // The read-ahead a whole state came from hears how its look ended.
        let (whole_from, read) = match whole {
            Some((ahead, state)) => (Some(ahead), Ok(state)),
            None if opts.dry_run => (None, self.state.peek(arn).await),
            None => (None, self.state.load(arn).await),
        };
        let state = match read {
            Ok(s) => s,
            Err(e) => {
                let error = PassError::Failed(Failure::StateRead(e));
                report.outcome = Outcome::Failed;
                report.error = Some(error.to_string());
                return Observed::Done(report, Err(error));
            }
        };
        if !opts.dry_run
            && let Some(indexed) = scope.indexed
            && !indexed.contains(arn)
            && state.ledger.values().any(|e| e.cluster == self.cluster)
            && let Err(e) = self.record_bound(bound).await
        {
            tracing::warn!(target_group = arn, error = %e, "adding the group to the state table's index failed; tried again next run");
        }
        if let Some(event) = scope.focus {
            let selected = event
                .labels
                .as_ref()
                .is_some_and(|l| bound.binding.selector.matches(&Labels::from(l.clone())));
            let held = state
                .ledger
                .values()
                .any(|e| e.pod.namespace == event.namespace && e.pod.name == event.name);
            if !selected && !held {
                return Observed::Irrelevant;
            }
        }
        let (desired, fp) = wanted.unwrap_or_else(|| wanted_targets(bound, pods, &mut report));
        let now = self.clock.now();
        let gate = self
            .settings
            .backoff
            .gate(state.backoff.as_ref(), now, opts.force);
        let busy = state.held_by_other(None, now) || state.dirty;
        // (A dry run writes nothing, and asks no holder.)
        let elsewhere = if opts.dry_run {
            None
        } else {
            self.memory
                .leases
                .elsewhere(arn, state.lease.as_ref(), now, &self.settings.lease)
        };
        // A request for a pass that no holder serves (its holder gave up, or a run
        // handed it on): this pass takes the lease, which clears it, even if nothing is
        // to change, and records the checkpoint the flag kept it from.
        let unserved = state.dirty && !state.held_by_other(None, now) && !opts.dry_run;
        let rest = at_rest(
            arn,
            &desired,
            fp,
            state.checkpoint.as_ref(),
            busy,
            opts,
            scope,
        );
        if let Some(ahead) = whole_from {
            ahead.settled(rest && indexed);
        }
        if rest {
            report.verification_skipped = true;
            return Observed::Done(report, Ok(Action::Done));
        }
        if opts.use_checkpoint
            && state.checkpoint.as_ref().map(|c| c.desired) != Some(fp)
            && let Some(promotion) = opts.priority.yielding()
        {
            // Not a re-verification of a group at rest: its pods differ from those last
            // verified (or none were), so its Describe goes ahead of those.
            promotion.found_change();
        }
        if let Gate::Wait { until } = gate
            && !opts.dry_run
            && !unserved
            && crate::state::owned_by(&state.ledger, &self.cluster)
                .iter()
                .all(|t| desired.targets.contains_key(t))
        {
            // Only registrations are due, and they wait: no need to read health.
            report.outcome = Outcome::BackingOff;
            note_backoff(&mut report, until, state.backoff.as_ref());
            return Observed::Done(report, Ok(Action::BackOff { until }));
        }
        // Another process holds the lease: this group cannot be written now, so no
        // health is read only to learn that (see `elsewhere`).
        if let Some(held) = elsewhere
            && held.parks(opts.use_checkpoint, &self.settings.lease)
            && let Some(action) = self.park(arn, &held, now, &mut report).await
        {
            return Observed::Done(report, action);
        }
        let actual = match self.read_health(arn, &opts.priority).await {
            Ok(a) => a,
            Err(e) => {
                if matches!(e, ElbError::NotFound { .. }) {
                    // Deleted: not acted on again until a discovery binds it.
                    self.index.unbound(arn);
                }
                let error = PassError::Failed(Failure::HealthRead(e));
                report.outcome = Outcome::Failed;
                report.error = Some(error.to_string());
                return Observed::Done(report, Err(error));
            }
        };
        let plan = plan(
            &desired.targets,
            actual.iter().map(TargetHealth::pair),
            &crate::state::claims(&state.ledger, &self.cluster),
            &Rules::new(bound.binding.mode, now),
        );
        report.foreign_kept.clone_from(&plan.foreign_kept);
        report.note_health(&actual);
        if opts.dry_run {
            report.outcome = Outcome::Planned;
            if let Gate::Wait { until } = gate {
                note_backoff(&mut report, until, state.backoff.as_ref());
            }
            report.plan = Some(plan);
            return Observed::Done(report, Ok(Action::Done));
        }
        // Gates of pods registered here, and of pods this group selects but cannot
        // hold (the others wait for this group's pass).
        let registered =
            pods.candidates(&bound.binding)
                .filter(|p| match holding(p, &bound.binding) {
                    Some(Ok(t)) => actual.iter().any(|h| h.target == t),
                    Some(Err(_)) => true,
                    None => false,
                });
        self.gates()
            .settle_selected(bound, registered, &mut report)
            .await;
        let backing_off = matches!(gate, Gate::Wait { .. });
        // Registrations held back target by target (refused targets, a full group)
        // need no lease until they are due.
        let present = actual
            .iter()
            .filter(|h| !h.state.is_draining() && !plan.deregister.contains(&h.target))
            .count();
        let sorted = state.held.sort(&plan.register, present, now);
        let nothing_to_do = plan.deregister.is_empty()
            && plan.forget.is_empty()
            && plan.adopt.is_empty()
            && (!sorted.sends() || backing_off)
            && !state.held.stale(&self.cluster, &plan.register)
            && !unserved;
        if !nothing_to_do {
            let prior = super::reads::PriorRead {
                version: state.version,
                health: actual,
                at: now,
                pods: None,
            };
            return Observed::Change(report, prior);
        }
        if let Gate::Wait { until } = gate {
            report.outcome = Outcome::BackingOff;
            note_backoff(&mut report, until, state.backoff.as_ref());
            return Observed::Done(report, Ok(Action::BackOff { until }));
        }
        if let Some(until) = sorted.next_try() {
            report.waiting = waiting(&state.held, &plan.register, present, &desired, now);
            report.outcome = Outcome::Failed;
            report.error = Some(waiting_error(&report.waiting, &state.held));
            return Observed::Done(report, Ok(Action::BackOff { until }));
        }
        // Right as it is. A scheduled run remembers that when the desired set is new to
        // the checkpoint (a write only when something changed since the last one).
        if opts.use_checkpoint
            && !busy
            && state.checkpoint.map(|c| c.desired) != Some(fp)
            && let Err(e) = self
                .state
                .record_verified(
                    arn,
                    state.version,
                    crate::lease::expired_before(now, &self.settings.lease),
                    Checkpoint {
                        desired: fp,
                        verified_at: now,
                    },
                )
                .await
        {
            tracing::warn!(target_group = %arn, error = %e, "writing the checkpoint failed; the next run verifies again");
        }
        Observed::Done(report, Ok(Action::Done))
    }
}

/// The group's desired targets in `pods` (noted in `report`) and their fingerprint.
fn wanted_targets(
    bound: &BoundGroup,
    pods: &PodIndex<'_>,
    report: &mut GroupReport,
) -> (Desired, u64) {
    let desired = desired_targets(pods.candidates(&bound.binding), &bound.binding);
    report.desired = desired.targets.len();
    report.pod_errors = pod_errors(&desired);
    let fp = fingerprint(desired.targets.keys());
    (desired, fp)
}

/// Whether a look may end without reading health: the group's desired targets are those
/// its checkpoint verified, it is not due for re-verification, nobody is at work on it
/// (`busy`) and no readiness gate waits for it.
fn at_rest(
    arn: &str,
    desired: &Desired,
    fp: u64,
    checkpoint: Option<&Checkpoint>,
    busy: bool,
    opts: &RunOptions,
    scope: &Scope<'_>,
) -> bool {
    let gates_pending = desired.targets.values().any(|d| d.gate == Some(false));
    let due = scope.due.is_none_or(|d| d.contains(arn));
    opts.use_checkpoint && !opts.dry_run && !gates_pending && !busy && may_skip(checkpoint, fp, due)
}
