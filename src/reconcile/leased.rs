//! One group under its lease: take the lease (or leave the change to its holder, whose
//! lease parks the request), then run passes until the lease is released or given up,
//! and say what should happen next.
//!
//! The pass under the lease reads pods afresh (or takes pods the caller holds that are
//! at least as new as what the group's last pass decided from): a pod-events reconcile
//! that finished just before cannot be undone by pods this run read earlier (a deleted
//! pod registered again); an event that arrives later finds the lease held, sets
//! `dirty`, and the group is reconciled again.

use super::pass::Verdict;
use super::reads::{PodReads, PriorRead};
use super::{
    Action, BoundGroup, CUT, DEFERRED, Failure, PassError, Reconciled, Reconciler, RunOptions,
};
use crate::groups::TargetGroupApi;
use crate::lease::{self, RunEnd, Taken};
use crate::pods::PodSource;
use crate::report::{GroupReport, Outcome};
use crate::state::{GroupState, StateStore};

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Reconciler<P, G, S> {
    /// Takes the group's lease (or leaves the change to its holder) and runs passes,
    /// with pods from `reads` and, for the first pass, the observation's health read;
    /// the report and what should happen next.
    pub(crate) async fn reconcile_leased(
        &self,
        bound: BoundGroup,
        mut report: GroupReport,
        opts: &RunOptions,
        reads: &PodReads<'_>,
        prior: Option<PriorRead>,
    ) -> (GroupReport, Reconciled) {
        if self.past_start_deadline(opts) {
            report.outcome = Outcome::Deferred;
            report.error = Some(DEFERRED.into());
            return (report, Err(PassError::Deferred));
        }
        let taken = self.take_lease(&bound.group.arn).await;
        match taken {
            Ok(Taken::Held(lease, state)) => {
                self.run_leased(bound, *lease, state, report, opts, reads, prior)
                    .await
            }
            Ok(Taken::Busy(busy)) => {
                let action = super::elsewhere::lease_held(&mut report, &busy);
                (report, Ok(action))
            }
            Err(e) => {
                let error = PassError::Failed(Failure::LeaseTake(e));
                report.outcome = Outcome::Failed;
                report.error = Some(error.to_string());
                (report, Err(error))
            }
        }
    }

    /// Passes under a held lease until it is released (or given up), then the outcome
    /// and what should happen next.
    #[allow(clippy::too_many_arguments)]
    async fn run_leased(
        &self,
        mut bound: BoundGroup,
        lease: lease::Lease<'_, S>,
        state: GroupState,
        mut report: GroupReport,
        opts: &RunOptions,
        reads: &PodReads<'_>,
        prior: Option<PriorRead>,
    ) -> (GroupReport, Reconciled) {
        let _holding = self.holding();
        // A look of this container at the group meanwhile does not take it for a lease
        // held elsewhere.
        let _ours = self.leases.ours(lease.owner());
        // The observation's counts are redone by the passes.
        report.passes = 0;
        report.gates_opened.clear();
        let mut prior = prior;
        let mut verdict = Verdict::Stopped;
        let end = lease
            .run(
                state,
                self.settings.max_passes,
                || !self.past_start_deadline(opts) && !self.cut_due(opts),
                self.shutting_down(),
                async |state, lease| {
                    // Only the first pass may reuse the observation's health read.
                    let prior = prior.take();
                    // Boxed: a pass's state (its ELBv2 and DynamoDB calls) is large, and
                    // would otherwise sit inline in every caller's.
                    let (end, said) = Box::pin(self.pass(
                        &mut bound,
                        state,
                        reads,
                        prior.as_ref(),
                        lease,
                        &mut report,
                        opts,
                    ))
                    .await;
                    verdict = said;
                    end
                },
            )
            .await;
        let mut stopped = None;
        match end {
            RunEnd::Aborted => {
                report.outcome = Outcome::Aborted;
                report.error = Some("aborted at an injected fault".into());
                return (report, Ok(Action::Done));
            }
            RunEnd::Lost => {
                if report.error.is_none() {
                    report.error = Some(PassError::LeaseLost.to_string());
                }
                stopped = Some(PassError::LeaseLost);
            }
            RunEnd::Cut => {
                if report.error.is_none() {
                    report.error = Some(CUT.into());
                }
                stopped = Some(PassError::Cut);
            }
            RunEnd::GivenUp if report.passes == 0 => {
                report.outcome = Outcome::Deferred;
                report.error = Some(DEFERRED.into());
                return (report, Err(PassError::Deferred));
            }
            RunEnd::GivenUp
                if report.passes >= self.settings.max_passes && report.error.is_none() =>
            {
                report.error = Some(format!(
                    "still being changed after {} passes; the next run picks it up",
                    report.passes
                ));
            }
            _ => {}
        }
        if matches!(report.outcome, Outcome::InSync | Outcome::Changed) {
            report.outcome = if report.registered.is_empty()
                && report.deregistered.is_empty()
                && report.forgotten.is_empty()
            {
                Outcome::InSync
            } else {
                Outcome::Changed
            };
        }
        // Failed or backing off under the lease: the stored backoff says until when;
        // registrations waiting target by target, their first retry.
        let result = match (stopped, verdict) {
            (Some(stopped), _) => Err(stopped),
            (None, Verdict::Failed { cause, until }) => Err(PassError::BackingOff { cause, until }),
            (
                None,
                Verdict::Settled {
                    retry_at: Some(until),
                },
            ) => Ok(Action::BackOff { until }),
            (None, Verdict::Settled { retry_at: None } | Verdict::Stopped) => Ok(Action::Done),
        };
        (report, result)
    }
}
