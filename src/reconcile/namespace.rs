//! One namespace at a time: one consistent pod LIST to observe its groups; then, for
//! each group with something to change, its lease, a fresh LIST of its pods, and the
//! passes.
//!
//! The second LIST comes *after* the lease so that a pod-events reconcile that finished
//! just before cannot be undone by pods this run read earlier (a deleted pod registered
//! again); an event that arrives later finds the lease held, sets `dirty`, and the group
//! is reconciled again with a fresh list.

use std::sync::Arc;

use futures::future::join_all;
use tokio::sync::Semaphore;

use super::observe::Observed;
use super::pass::{CUT, PodReads, PriorRead};
use super::read_ahead::ReadAhead;
use super::{Action, BoundGroup, Engine, RunOptions, Scope};
use crate::core::{PodIndex, Selector};
use crate::groups::TargetGroupApi;
use crate::lease::{self, Busy, RunEnd, Taken};
use crate::pods::PodSource;
use crate::report::{GroupReport, Outcome};
use crate::state::{GroupState, StateStore};

/// The report's word for a group left to the next run.
pub(crate) const DEFERRED: &str =
    "the invocation is near its deadline; the next run reconciles this group";

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    pub(super) async fn reconcile_namespace(
        &self,
        namespace: String,
        groups: Vec<BoundGroup>,
        opts: &RunOptions,
        scope: &Scope<'_>,
        permits: Arc<Semaphore>,
    ) -> Vec<GroupReport> {
        let deferred = |b: &BoundGroup| {
            GroupReport::with_error(
                &b.group.arn,
                &b.group.group_name(),
                Outcome::Deferred,
                DEFERRED,
            )
        };
        if self.past_start_deadline(opts) {
            return groups.iter().map(deferred).collect();
        }
        let selector = Selector::common(groups.iter().map(|b| &b.binding.selector));
        let pods = match self
            .pods
            .list_versioned(&namespace, selector.as_ref())
            .await
        {
            Ok(listing) => Arc::new((listing.pods, listing.resource_version)),
            Err(e) => {
                // Never act on partial data: the error is every group's outcome.
                tracing::error!(namespace = %namespace, error = %e, "pod list failed; groups in this namespace are left untouched");
                return groups
                    .iter()
                    .map(|b| {
                        GroupReport::with_error(
                            &b.group.arn,
                            &b.group.group_name(),
                            Outcome::Failed,
                            &e,
                        )
                    })
                    .collect();
            }
        };
        let index = PodIndex::new(&pods.0);
        // A resync reads the namespace's groups' states ahead in batches, in the order its
        // looks start (the permits are FIFO); a pod event's few groups each read theirs.
        let ahead =
            (scope.focus.is_none() && scope.ahead.is_none() && !opts.dry_run && groups.len() > 1)
                .then(|| {
                    ReadAhead::for_looks(
                        groups.iter().map(|b| b.group.arn.as_str()),
                        scope.due,
                        scope.indexed,
                        opts.use_checkpoint,
                    )
                });
        let scope = &Scope {
            due: scope.due,
            focus: scope.focus,
            indexed: scope.indexed,
            ahead: ahead.as_ref().or(scope.ahead),
        };
        let observed = join_all(groups.into_iter().map(|bound| {
            let permits = permits.clone();
            let index = &index;
            async move {
                let _permit = permits.acquire().await;
                if self.past_start_deadline(opts) {
                    return (Observed::Done(deferred(&bound), Action::Requeue), bound);
                }
                (self.observe(&bound, index, opts, scope).await, bound)
            }
        }))
        .await;
        drop(index);
        // A pod event's passes plan from this LIST when nothing was written since (see
        // `PriorRead`); a resync frees it now (a namespace can hold many pods).
        let pods = scope.focus.is_some().then_some(pods);
        let mut reports = Vec::new();
        let mut changed = Vec::new();
        for (observed, bound) in observed {
            match observed {
                Observed::Done(report, _) => {
                    self.pass_done(&report, opts.dry_run, None);
                    reports.push(report);
                }
                Observed::Irrelevant => {}
                Observed::Change(report, mut prior) => {
                    prior.pods.clone_from(&pods);
                    changed.push((report, prior, bound));
                }
            }
        }
        if changed.is_empty() {
            return reports;
        }
        // The groups with something to do, each under its lease.
        let runs = changed.into_iter().map(|(report, prior, bound)| {
            let permits = permits.clone();
            async move {
                let _permit = permits.acquire().await;
                let (report, _) = self
                    .reconcile_leased(bound, report, opts, &PodReads::Fresh, Some(prior))
                    .await;
                self.pass_done(&report, opts.dry_run, None);
                report
            }
        });
        reports.extend(join_all(runs).await);
        reports
    }

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
    ) -> (GroupReport, Action) {
        if self.past_start_deadline(opts) {
            report.outcome = Outcome::Deferred;
            report.error = Some(DEFERRED.into());
            return (report, Action::Requeue);
        }
        let taken = self.take_lease(&bound.group.arn, opts).await;
        match taken {
            Ok(Taken::Held(lease, state)) => {
                self.run_leased(bound, *lease, state, report, opts, reads, prior)
                    .await
            }
            Ok(Taken::Busy(busy)) => {
                report.outcome = Outcome::LeaseHeld;
                report.error = Some(match &busy {
                    Busy::Asked { owner, .. } => format!(
                        "another reconcile ({owner}) holds the lease; it was asked to run again"
                    ),
                    Busy::Served => {
                        "another reconcile held the lease and ran again after this change".into()
                    }
                });
                match busy {
                    Busy::Asked { until, .. } => {
                        report.lease_until = Some(until);
                        (report, Action::LeaseHeld { until })
                    }
                    Busy::Served => (report, Action::Done),
                }
            }
            Err(e) => {
                report.outcome = Outcome::Failed;
                report.error = Some(format!("taking the lease failed: {e}"));
                (report, Action::Failed)
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
    ) -> (GroupReport, Action) {
        let _holding = self.holding();
        // The observation's counts are redone by the passes.
        report.passes = 0;
        report.gates_opened.clear();
        let mut prior = prior;
        let end = lease
            .run(
                state,
                self.settings.max_passes,
                || !self.past_start_deadline(opts) && !self.cut_due(opts),
                self.shutting_down(),
                async |state, lease| {
                    // Only the first pass may reuse the observation's health read.
                    let prior = prior.take();
                    self.pass(
                        &mut bound,
                        state,
                        reads,
                        prior.as_ref(),
                        lease,
                        &mut report,
                        opts,
                    )
                    .await
                },
            )
            .await;
        let mut action = Action::Done;
        match end {
            RunEnd::Aborted => {
                report.outcome = Outcome::Aborted;
                report.error = Some("aborted at an injected fault".into());
                return (report, Action::Done);
            }
            RunEnd::Lost if report.error.is_none() => {
                report.error = Some(
                    "the lease was lost (expired or taken over); the new holder finishes the group"
                        .into(),
                );
            }
            RunEnd::Cut => {
                if report.error.is_none() {
                    report.error = Some(CUT.into());
                }
                action = Action::Requeue;
            }
            RunEnd::GivenUp if report.passes == 0 => {
                report.outcome = Outcome::Deferred;
                report.error = Some(DEFERRED.into());
                return (report, Action::Requeue);
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
        // Failed or backing off under the lease: the stored backoff says until when.
        if action == Action::Done
            && let (Outcome::BackingOff | Outcome::Failed, Some(until)) =
                (report.outcome, report.next_attempt_at)
        {
            action = Action::BackOff { until };
        }
        (report, action)
    }
}
