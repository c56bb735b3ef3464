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
        let _holding = self.stop.holding();
        // A look of this container at the group meanwhile does not take it for a lease
        // held elsewhere.
        let _ours = self.memory.leases.ours(lease.owner());
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
                self.stop.shutting_down(),
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
        match end {
            RunEnd::Aborted => {
                report.outcome = Outcome::Aborted;
                report.error = Some("aborted at an injected fault".into());
                return (report, Ok(Action::Done));
            }
            RunEnd::Lost if report.error.is_none() => {
                report.error = Some(LEASE_LOST.into());
            }
            RunEnd::Cut if report.error.is_none() => {
                report.error = Some(CUT.into());
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
        (report, next_step(end, verdict))
    }
}

/// The report's words for a leased run whose lease was lost.
const LEASE_LOST: &str =
    "the lease was lost (expired or taken over); the new holder finishes the group";

/// What follows a leased run that ended with `end` (not stopped dead, and not given up
/// before its first pass), its last pass having said `verdict`: a cut run again as soon
/// as a run can; a failure, the group's stored backoff; registrations waiting, their
/// first retry — also when the lease was lost on the way (a lost lease is a new
/// holder's, if there is one; the request still comes back at its time); else nothing.
fn next_step(end: RunEnd, verdict: Verdict) -> Reconciled {
    match (end, verdict) {
        (RunEnd::Cut, _) => Err(PassError::Cut),
        (_, Verdict::Failed { cause, until }) => Err(PassError::BackingOff { cause, until }),
        (
            _,
            Verdict::Settled {
                retry_at: Some(until),
            },
        ) => Ok(Action::BackOff { until }),
        (_, Verdict::Settled { retry_at: None } | Verdict::Stopped) => Ok(Action::Done),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::UnixMillis;

    /// A pass that failed, or left registrations waiting, and then lost its lease at the
    /// write that ends it comes back at its time (and a gate still waiting is looked at
    /// again: the job sees `Done`), as before the typed result; a cut pass runs again.
    #[test]
    fn a_lost_lease_keeps_what_the_pass_said_of_its_next_step() {
        let until = UnixMillis(5_000);
        let failed = Verdict::Failed {
            cause: super::super::Failure::Changes(1),
            until,
        };
        assert!(matches!(
            next_step(RunEnd::Lost, failed.clone()),
            Err(PassError::BackingOff { until: u, .. }) if u == until
        ));
        let waiting = Verdict::Settled {
            retry_at: Some(until),
        };
        assert_eq!(
            next_step(RunEnd::Lost, waiting).ok(),
            Some(Action::BackOff { until })
        );
        assert_eq!(
            next_step(RunEnd::Lost, Verdict::Stopped).ok(),
            Some(Action::Done)
        );
        assert!(matches!(
            next_step(RunEnd::Cut, failed),
            Err(PassError::Cut)
        ));
        assert_eq!(
            next_step(RunEnd::Released, Verdict::Settled { retry_at: None }).ok(),
            Some(Action::Done)
        );
    }
}
