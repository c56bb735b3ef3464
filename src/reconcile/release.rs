//! The way out: `release` takes this cluster's deployment out of target groups, bound or
//! not (tags removed, group deleted), and the orphan report that finds the groups that
//! need it. A release deregisters every target this cluster owns in the group (never
//! another's, never a foreign one), deletes its ledger entries under the group's lease,
//! and drops the group from the cluster's index; a dry run shows the same first.

use std::collections::{BTreeMap, BTreeSet};

use super::notes::fail;
use super::{Action, Failure, PassError, Reconciled, Reconciler, RunOptions};
use crate::core::binding::TAG_CLUSTER;
use crate::core::{MAX_TARGETS_PER_CALL, release_plan};
use crate::groups::{ElbError, Priority, TargetGroupApi};
use crate::lease::{self, PassEnd, RunEnd, Taken};
use crate::pods::PodSource;
use crate::report::{GroupReport, Orphan, Outcome};
use crate::state::{Change, GroupState, StateStore};

/// A release's group with no time left to start it.
const NOT_STARTED: &str = "the invocation is near its deadline; nothing was released";

/// The name in a target group ARN (`…:targetgroup/<name>/<id>`).
fn name_of(arn: &str) -> String {
    arn.rsplit('/').nth(1).unwrap_or(arn).to_owned()
}

/// A release's group as the invocation ends with it: one still waiting for a lease
/// another process holds, or never started for want of time, released nothing and
/// is a failure that says what to do (the outcomes tell which: nothing here reads
/// a message).
pub(crate) fn unreleased(report: &mut GroupReport) {
    let error = match report.outcome {
        Outcome::LeaseHeld => {
            "nothing was released: another process held the group's lease for as long as this invocation could wait; invoke the release again (a holder that died frees the group at leaseUntil)"
        }
        Outcome::Deferred => {
            "nothing was released: the invocation was too close to its deadline to start it; invoke the release again"
        }
        _ => return,
    };
    report.outcome = Outcome::Failed;
    report.error = Some(error.into());
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Reconciler<P, G, S> {
    /// One group's release: the report, a note when the group is still bound (it would
    /// be filled again), and what should happen next (a lease held elsewhere parks it)
    /// or why it did not finish.
    pub(crate) async fn release_group(
        &self,
        arn: &str,
        opts: &RunOptions,
    ) -> (GroupReport, Option<String>, Reconciled) {
        let mut report = GroupReport::new(arn, &name_of(arn), Outcome::Released);
        let note = match self.groups.tags(arn, &Priority::Reaction).await {
            Ok(tags) => tags
                .get(TAG_CLUSTER)
                .is_some_and(|v| v.split_whitespace().any(|c| c == self.cluster))
                .then(|| format!(
                    "{arn} is still tagged {TAG_CLUSTER}={}: the next resync or pod event fills it again; remove this cluster from the tag (or every tgsync/* tag) to keep it released",
                    self.cluster
                )),
            Err(ElbError::NotFound { .. }) => None,
            Err(e) => Some(format!(
                "could not read the tags of {arn} ({e}); if it is still bound to `{}`, the next resync fills it again",
                self.cluster
            )),
        };
        if opts.dry_run {
            self.plan_release(arn, &mut report).await;
            return (report, note, Ok(Action::Done));
        }
        if self.past_start_deadline(opts) {
            report.outcome = Outcome::Deferred;
            report.error = Some(NOT_STARTED.into());
            return (report, note, Err(PassError::Deferred));
        }
        let (lease, state) = match self.take_lease(arn).await {
            Ok(Taken::Held(lease, state)) => (lease, state),
            Ok(Taken::Busy(busy)) => {
                report.outcome = Outcome::LeaseHeld;
                report.lease_until = Some(busy.until);
                report.error = Some(format!(
                    "another process ({}) holds the group's lease; nothing was released yet: the release waits for it while the invocation lasts",
                    busy.owner
                ));
                return (report, note, Ok(Action::LeaseHeld { until: busy.until }));
            }
            Err(e) => {
                report.outcome = Outcome::Failed;
                report.error = Some(format!(
                    "taking the lease failed, nothing was released: {e}; invoke the release again"
                ));
                // Tried again while the invocation lasts, unless no retry can help.
                return (report, note, Err(PassError::Failed(Failure::LeaseTake(e))));
            }
        };
        let holding = self.stop.holding();
        // A look of this container at the group meanwhile does not take it for a lease
        // held elsewhere.
        let ours = self.memory.leases.ours(lease.owner());
        let end = lease
            .run(
                state,
                self.settings.max_passes,
                || !self.past_start_deadline(opts) && !self.cut_due(opts),
                self.stop.shutting_down(),
                async |state, lease| self.release_pass(arn, state, lease, &mut report).await,
            )
            .await;
        drop((ours, holding));
        let result = match end {
            RunEnd::Released => {
                self.retire_released(arn, &mut report).await;
                Ok(Action::Done)
            }
            // No time was left for a pass: nothing was released.
            RunEnd::GivenUp if report.passes == 0 => {
                report.outcome = Outcome::Deferred;
                report.error = Some(NOT_STARTED.into());
                Err(PassError::Deferred)
            }
            // The pass failed (its report says how): an operator's to look at now.
            RunEnd::GivenUp => Ok(Action::Done),
            // The lease was lost or the pass cut before it finished: again while the
            // invocation lasts (a new holder parks it).
            RunEnd::Lost | RunEnd::Cut => {
                let error = PassError::Failed(Failure::ReleaseInterrupted);
                if report.error.is_none() {
                    report.outcome = Outcome::Failed;
                    report.error = Some(error.to_string());
                }
                Err(error)
            }
            RunEnd::Aborted => {
                report.outcome = Outcome::Aborted;
                report.error = Some("aborted at an injected fault".into());
                Ok(Action::Done)
            }
        };
        (report, note, result)
    }

    /// Dry run: what a release of `arn` would do.
    async fn plan_release(&self, arn: &str, report: &mut GroupReport) {
        report.outcome = Outcome::Planned;
        let state = match self.state.peek(arn).await {
            Ok(s) => s,
            Err(e) => {
                report.outcome = Outcome::Failed;
                report.error = Some(format!("reading the state table failed: {e}"));
                return;
            }
        };
        let Some(actual) = self.release_health(arn, report).await else {
            return;
        };
        let plan = release_plan(
            &crate::state::owned_by(&state.ledger, &self.cluster),
            actual.iter(),
        );
        report.foreign_kept.clone_from(&plan.foreign_kept);
        report.plan = Some(plan);
    }

    /// Target health for a release: a deleted group holds nothing (`gone`); `None` and
    /// the report failed on any other error.
    async fn release_health(
        &self,
        arn: &str,
        report: &mut GroupReport,
    ) -> Option<BTreeMap<crate::core::Target, crate::core::HealthState>> {
        match self.groups.health(arn, &Priority::Reaction).await {
            Ok(actual) => Some(actual.into_iter().map(|h| (h.target, h.state)).collect()),
            Err(ElbError::NotFound { .. }) => {
                // Deleted: not acted on again until a discovery binds it.
                self.index.unbound(arn);
                Some(BTreeMap::new())
            }
            Err(e) => {
                report.outcome = Outcome::Failed;
                report.error = Some(format!(
                    "reading target health failed, nothing was released: {e}"
                ));
                None
            }
        }
    }

    /// One pass of a release under the lease: deregister what this cluster owns and is
    /// present, forget what is gone, and store the ledger without them.
    async fn release_pass(
        &self,
        arn: &str,
        state: GroupState,
        lease: &lease::Lease<'_, S>,
        report: &mut GroupReport,
    ) -> PassEnd {
        report.passes += 1;
        let Some(actual) = self.release_health(arn, report).await else {
            return PassEnd::GiveUp(Change::default());
        };
        let plan = release_plan(
            &crate::state::owned_by(&state.ledger, &self.cluster),
            actual.iter(),
        );
        let mut ledger = state.ledger.clone();
        let mut failures = 0usize;
        for chunk in plan.deregister.chunks(MAX_TARGETS_PER_CALL) {
            if let Err(e) = lease.ready().await {
                report.outcome = Outcome::Failed;
                report.error = Some(format!("{e}; invoke the release again"));
                return PassEnd::Cut(Change::default());
            }
            match self.groups.deregister(arn, chunk, lease).await {
                Ok(()) => {
                    report.deregistered.extend_from_slice(chunk);
                    for t in chunk {
                        ledger.remove(t);
                    }
                }
                Err(e) => failures += fail(report, chunk, "deregister", &e.to_string()),
            }
        }
        for t in &plan.forget {
            ledger.remove(t);
        }
        report.forgotten.extend_from_slice(&plan.forget);
        report.foreign_kept.clone_from(&plan.foreign_kept);
        let change = Change {
            ledger: (ledger != state.ledger).then_some(ledger),
            backoff: state.backoff.is_some().then_some(None),
            held: (!state.held.is_empty()).then(Default::default),
            checkpoint: state.checkpoint.is_some().then_some(None),
            seen: None,
        };
        if failures > 0 {
            report.outcome = Outcome::Failed;
            report.error = Some(format!(
                "{failures} deregistration call(s) failed (see failedTargets); what went through is out of the ledger; invoke the release again"
            ));
            return PassEnd::GiveUp(change);
        }
        PassEnd::Done(change)
    }

    /// After a clean release: out of the index, and the item deleted when nothing else
    /// is in it (another cluster's entries stay).
    async fn retire_released(&self, arn: &str, report: &mut GroupReport) {
        let retired = match self.state.peek(arn).await {
            Ok(state) if crate::state::owned_by(&state.ledger, &self.cluster).is_empty() => {
                self.state
                    .retire(
                        arn,
                        &self.cluster,
                        state.version,
                        crate::lease::expired_before(self.clock.now(), &self.settings.lease),
                        state.ledger.is_empty(),
                    )
                    .await
            }
            Ok(_) => Ok(false),
            Err(e) => Err(e),
        };
        match retired {
            Ok(true) => {}
            Ok(false) => {
                report.error = Some(
                    "released, but the group changed right after (is it still bound?); it stays in the orphan index until released again".into(),
                );
            }
            Err(e) => {
                report.error = Some(format!(
                    "released, but removing it from the state table's index failed ({e}); invoke the release again to tidy up"
                ));
            }
        }
    }

    /// This cluster's index as the orphan report reads it: the groups of accounts that
    /// could be read (`None` when an account of unknown name could not, or the index
    /// could not be read: that failure goes to `errors`).
    pub(crate) async fn indexed_for_orphans(
        &self,
        accounts_failed: &[crate::groups::AccountError],
        errors: &mut Vec<String>,
    ) -> Option<BTreeSet<String>> {
        let unread: BTreeSet<&str> = accounts_failed
            .iter()
            .map(|f| f.account.as_deref())
            .collect::<Option<_>>()?;
        match self.state.indexed_groups(&self.cluster).await {
            Ok(mut indexed) => {
                indexed.retain(|arn| {
                    crate::core::arn::arn_account(arn).is_none_or(|a| !unread.contains(a))
                });
                Some(indexed)
            }
            Err(e) => {
                errors.push(format!(
                    "reading this cluster's index in the state table failed, so orphaned groups were not looked for: {e}"
                ));
                None
            }
        }
    }

    /// The orphan report of a full resync: the groups in this cluster's index that are
    /// not tagged for it any more and whose ledger still holds its targets. Never acted
    /// on; a group in the index with nothing of ours left is dropped from it (not in a
    /// dry run).
    pub(crate) async fn orphans(
        &self,
        indexed: &BTreeSet<String>,
        tagged: &BTreeSet<&str>,
        dry_run: bool,
        errors: &mut Vec<String>,
    ) -> Vec<Orphan> {
        let mut orphans = Vec::new();
        for arn in indexed.iter().filter(|a| !tagged.contains(a.as_str())) {
            let state = match self.state.peek(arn).await {
                Ok(s) => s,
                Err(e) => {
                    errors.push(format!(
                        "reading the state of unbound group {arn} failed: {e}"
                    ));
                    continue;
                }
            };
            // The targets this cluster holds there: a tombstone (a target it
            // deregistered, kept for the forget grace) is not one.
            let targets = state
                .ledger
                .values()
                .filter(|e| e.cluster == self.cluster && e.deregistered_at.is_none())
                .count();
            if targets > 0 {
                orphans.push(Orphan {
                    target_group_arn: arn.clone(),
                    targets,
                    action: format!(
                        "no longer bound to cluster `{}` (tags removed, or the group deleted); its targets stay as they are until you release it (`tgsync release {arn}`, or the manual function's release alias with {{\"release\": [\"{arn}\"]}}) or tag it again",
                        self.cluster
                    ),
                });
            } else if !dry_run
                && let Err(e) = self
                    .state
                    .retire(
                        arn,
                        &self.cluster,
                        state.version,
                        crate::lease::expired_before(self.clock.now(), &self.settings.lease),
                        false,
                    )
                    .await
            {
                tracing::debug!(target_group = %arn, error = %e, "dropping a group with nothing of ours from the index failed; tried again next run");
            }
        }
        orphans
    }
}
