//! One group under its lease: passes of health read → plan → write-ahead apply, backoff
//! bookkeeping, and the release / run-again protocol.

use std::collections::BTreeSet;

use super::{BoundGroup, Engine, RunOptions};
use crate::core::checkpoint;
use crate::core::{
    Checkpoint, Desired, Gate, HealthState, MAX_TARGETS_PER_CALL, PodIndex, Target,
    desired_targets, plan,
};
use crate::faults::FaultPoint;
use crate::groups::TargetGroupApi;
use crate::pods::{PodSource, PodsError};
use crate::report::{FailedTarget, GroupReport, Outcome, PodError};
use crate::state::{Acquire, GroupState, LedgerRow, Release, StateStore};

/// A group whose lease we hold (or a dry run, which takes none) and whose state is read.
pub(super) struct Held {
    pub(super) bound: BoundGroup,
    /// Lease owner id; `None` in a dry run.
    owner: Option<String>,
    state: GroupState,
}

/// After preparation: either a final report, or a group ready to reconcile.
pub(super) enum Prepared {
    Done(GroupReport),
    Held(Held),
}

/// The report's word for a group left to the next run.
const DEFERRED: &str = "the invocation is near its deadline; the next run reconciles this group";

/// Why a pass stopped.
enum PassError {
    /// The group could not be reconciled; it backs off.
    Failed(String),
    /// An injected fault: stop dead, as a crash would.
    Aborted(FaultPoint),
}

impl From<FaultPoint> for PassError {
    fn from(p: FaultPoint) -> Self {
        Self::Aborted(p)
    }
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    /// Lease (unless dry run) → state → backoff gate.
    pub(super) async fn prepare(&self, bound: BoundGroup, opts: &RunOptions) -> Prepared {
        let arn = bound.group.arn.clone();
        let name = bound.group.group_name();
        let done = |outcome, error: String| {
            Prepared::Done(GroupReport::with_error(&arn, &name, outcome, error))
        };
        if self.past_start_deadline(opts) {
            return done(Outcome::Deferred, DEFERRED.to_owned());
        }
        let owner = if opts.dry_run {
            None
        } else {
            let owner = self.new_owner();
            match self
                .state
                .acquire(&arn, &owner, self.clock.now(), self.lease_until(opts))
                .await
            {
                Ok(Acquire::Acquired) => Some(owner),
                Ok(Acquire::HeldElsewhere) => {
                    let mut r = GroupReport::new(&arn, &name, Outcome::LeaseHeld);
                    r.error =
                        Some("another reconcile holds the lease; it was asked to run again".into());
                    return Prepared::Done(r);
                }
                Err(e) => return done(Outcome::Failed, format!("taking the lease failed: {e}")),
            }
        };
        if let Err(point) = self.faults.check(FaultPoint::AfterLeaseAcquired) {
            return done(Outcome::Aborted, format!("aborted at {point}"));
        }
        let state = match self.state.load(&arn).await {
            Ok(s) => s,
            Err(e) => {
                self.release_quietly(&arn, owner.as_deref()).await;
                return done(
                    Outcome::Failed,
                    format!("reading the state table failed: {e}"),
                );
            }
        };
        let now = self.clock.now();
        if let Gate::Wait { until } =
            self.settings
                .backoff
                .gate(state.backoff.as_ref(), now, opts.force)
        {
            self.release_quietly(&arn, owner.as_deref()).await;
            let mut r = GroupReport::new(&arn, &name, Outcome::BackingOff);
            r.next_attempt_at = Some(until);
            r.error = Some(format!(
                "backing off after {} consecutive failures; invoke resync with \"force\": true to retry now",
                state.backoff.map_or(0, |b| b.failures)
            ));
            return Prepared::Done(r);
        }
        Prepared::Held(Held {
            bound,
            owner,
            state,
        })
    }

    /// Passes until the lease is released cleanly (or the dry run is planned).
    pub(super) async fn run_held(
        &self,
        mut held: Held,
        first: Result<&PodIndex<'_>, &PodsError>,
        opts: &RunOptions,
    ) -> GroupReport {
        let arn = held.bound.group.arn.clone();
        let name = held.bound.group.group_name();
        // Leases are taken for a whole namespace before its LIST; a group whose turn
        // comes after the cut-off gives its lease back rather than run into the timeout
        // (a killed invocation would keep the group locked until the lease expires).
        if self.past_start_deadline(opts) {
            self.release_quietly(&arn, held.owner.as_deref()).await;
            return GroupReport::with_error(&arn, &name, Outcome::Deferred, DEFERRED);
        }
        let mut report = GroupReport::new(&arn, &name, Outcome::InSync);
        loop {
            report.passes += 1;
            let result = if report.passes == 1 {
                self.pass(&held, first, &mut report, opts).await
            } else {
                self.fresh_pass(&mut held, &mut report, opts).await
            };
            let failed = match result {
                Ok(verified) => {
                    if let Some(point) = self.record_checkpoint(&held, verified, opts).await {
                        report.outcome = Outcome::Aborted;
                        report.error = Some(format!("aborted at {point}"));
                        return report;
                    }
                    None
                }
                Err(PassError::Aborted(point)) => {
                    report.outcome = Outcome::Aborted;
                    report.error = Some(format!("aborted at {point}"));
                    return report;
                }
                Err(PassError::Failed(msg)) => {
                    if held.owner.is_some() && held.state.checkpoint.is_some() {
                        // Something is off: verify fully next time.
                        if let Err(e) = self.state.set_checkpoint(&arn, None).await {
                            tracing::warn!(target_group = %arn, error = %e, "clearing the checkpoint failed");
                        }
                    }
                    Some(msg)
                }
            };
            let Some(owner) = held.owner.clone() else {
                // Dry run: no lease, no state writes.
                if let Some(msg) = failed {
                    report.outcome = Outcome::Failed;
                    report.error = Some(msg);
                }
                return report;
            };
            if let Err(point) = self
                .record_backoff(&arn, &held.state, failed.as_deref(), &mut report)
                .await
            {
                report.outcome = Outcome::Aborted;
                report.error = Some(format!("aborted at {point}"));
                return report;
            }
            if let Err(point) = self.faults.check(FaultPoint::BeforeLeaseRelease) {
                report.outcome = Outcome::Aborted;
                report.error = Some(format!("aborted at {point}"));
                return report;
            }
            let release = self
                .state
                .release(&arn, &owner, self.lease_until(opts))
                .await;
            let again = matches!(release, Ok(Release::RunAgain));
            if let Err(e) = &release {
                tracing::warn!(target_group = %arn, error = %e, "lease release failed; it expires on its own");
            }
            if failed.is_some() {
                // A failed group does not retry at once, dirty or not: backoff decides.
                if again {
                    self.release_quietly(&arn, Some(&owner)).await;
                }
                break;
            }
            if !again {
                break;
            }
            if report.passes >= self.settings.max_passes {
                self.release_quietly(&arn, Some(&owner)).await;
                report.error = Some(format!(
                    "still being changed after {} passes; the next run picks it up",
                    report.passes
                ));
                break;
            }
            tracing::info!(target_group = %arn, pass = report.passes, "lease was marked dirty; reconciling again");
        }
        if report.outcome != Outcome::Failed {
            report.outcome = if report.registered.is_empty()
                && report.deregistered.is_empty()
                && report.forgotten.is_empty()
            {
                Outcome::InSync
            } else {
                Outcome::Changed
            };
        }
        report
    }

    /// A later pass: the group changed while we held it, so read state and pods afresh.
    async fn fresh_pass(
        &self,
        held: &mut Held,
        report: &mut GroupReport,
        opts: &RunOptions,
    ) -> Result<Option<u64>, PassError> {
        held.state = self
            .state
            .load(&held.bound.group.arn)
            .await
            .map_err(|e| PassError::Failed(format!("reading the state table failed: {e}")))?;
        let binding = &held.bound.binding;
        let pods = self
            .pods
            .list(&binding.namespace, Some(&binding.selector))
            .await;
        let index = pods.as_ref().map(|p| PodIndex::new(p));
        self.pass(held, index.as_ref().map_err(|e| *e), report, opts)
            .await
    }

    /// One level-based pass: desired → (checkpoint) → health → plan → apply. Returns the
    /// desired fingerprint when target health was read and the group made right (what a
    /// checkpoint may record), `None` when the read was skipped or it was a dry run.
    async fn pass(
        &self,
        held: &Held,
        pods: Result<&PodIndex<'_>, &PodsError>,
        report: &mut GroupReport,
        opts: &RunOptions,
    ) -> Result<Option<u64>, PassError> {
        let BoundGroup { group, binding } = &held.bound;
        let arn = group.arn.as_str();
        let dry_run = opts.dry_run;
        let pods = pods.map_err(|e| PassError::Failed(e.to_string()))?;
        let desired = desired_targets(pods.candidates(binding), binding);
        report.desired = desired.targets.len();
        let fingerprint = checkpoint::fingerprint(desired.targets.keys());
        let gates_pending = desired.targets.values().any(|d| d.gate == Some(false));
        if let Some(interval) = self.settings.verify_interval
            && opts.use_checkpoint
            && !dry_run
            && !gates_pending
            && checkpoint::may_skip(
                held.state.checkpoint.as_ref(),
                fingerprint,
                arn,
                self.clock.now(),
                interval,
            )
        {
            report.verification_skipped = true;
            return Ok(None);
        }
        let actual = self
            .groups
            .health(arn)
            .await
            .map_err(|e| PassError::Failed(format!("reading target health failed: {e}")))?;
        report.pod_errors = desired
            .skipped
            .iter()
            .filter(|s| s.reason.is_error())
            .map(|s| PodError {
                pod: s.pod.to_string(),
                error: s.reason.to_string(),
            })
            .collect();
        let owned: BTreeSet<Target> = held.state.ledger.keys().copied().collect();
        let plan = plan(
            &desired.targets,
            actual.iter().map(|(t, s)| (t, s)),
            &owned,
            binding.mode,
        );
        report.foreign_kept.clone_from(&plan.foreign_kept);
        if dry_run {
            report.outcome = Outcome::Planned;
            report.plan = Some(plan);
            return Ok(None);
        }
        let now = self.clock.now();
        let row = |t: &Target| {
            desired.targets.get(t).map(|d| LedgerRow {
                target: *t,
                pod: d.pod.as_ref().clone(),
                registered_at: now,
            })
        };
        let mut failures = 0usize;
        // Adopt: ownership only, no ELBv2 call.
        if !plan.adopt.is_empty() {
            let rows: Vec<LedgerRow> = plan.adopt.iter().filter_map(row).collect();
            if let Err(e) = self.state.record(arn, &rows).await {
                return Err(PassError::Failed(format!(
                    "recording adopted targets failed: {e}"
                )));
            }
        }
        for chunk in plan.register.chunks(MAX_TARGETS_PER_CALL) {
            let rows: Vec<LedgerRow> = chunk.iter().filter_map(row).collect();
            // Write-ahead: never register a target the ledger does not know.
            if let Err(e) = self.state.record(arn, &rows).await {
                failures += fail(
                    report,
                    chunk,
                    "register",
                    format!("ledger write failed, not registered: {e}"),
                );
                continue;
            }
            self.faults.check(FaultPoint::AfterLedgerWrite)?;
            match self.groups.register(arn, chunk).await {
                Ok(()) => report.registered.extend_from_slice(chunk),
                Err(e) => failures += fail(report, chunk, "register", e.to_string()),
            }
            self.faults.check(FaultPoint::AfterRegisterChunk)?;
        }
        for chunk in plan.deregister.chunks(MAX_TARGETS_PER_CALL) {
            if let Err(e) = self.groups.deregister(arn, chunk).await {
                failures += fail(report, chunk, "deregister", e.to_string());
                continue;
            }
            report.deregistered.extend_from_slice(chunk);
            self.faults.check(FaultPoint::AfterDeregisterChunk)?;
            // Only after the target is gone: a crash before this leaves a stale row, which
            // the next run forgets; never an owned target without a row.
            if let Err(e) = self.state.remove(arn, chunk).await {
                tracing::warn!(target_group = %arn, error = %e, "ledger delete failed; the next run forgets the rows");
                failures += 1;
            }
            self.faults.check(FaultPoint::AfterLedgerDelete)?;
        }
        for chunk in plan.forget.chunks(MAX_TARGETS_PER_CALL) {
            match self.state.remove(arn, chunk).await {
                Ok(()) => report.forgotten.extend_from_slice(chunk),
                Err(e) => {
                    tracing::warn!(target_group = %arn, error = %e, "forgetting ledger rows failed");
                    failures += 1;
                }
            }
            self.faults.check(FaultPoint::AfterLedgerDelete)?;
        }
        self.open_gates(&desired, &actual, report).await;
        if failures > 0 {
            return Err(PassError::Failed(format!(
                "{failures} change(s) failed; see failedTargets"
            )));
        }
        report.verification_skipped = false;
        Ok(Some(fingerprint))
    }

    /// Records a successful verification on the scheduled path, so the next runs may
    /// skip the health read while nothing changes. `Some(point)` on an injected fault.
    async fn record_checkpoint(
        &self,
        held: &Held,
        verified: Option<u64>,
        opts: &RunOptions,
    ) -> Option<FaultPoint> {
        let (Some(desired), Some(_)) = (verified, held.owner.as_ref()) else {
            return None;
        };
        if !opts.use_checkpoint || self.settings.verify_interval.is_none() {
            return None;
        }
        let checkpoint = Checkpoint {
            desired,
            verified_at: self.clock.now(),
        };
        if let Err(e) = self
            .state
            .set_checkpoint(&held.bound.group.arn, Some(checkpoint))
            .await
        {
            tracing::warn!(target_group = %held.bound.group.arn, error = %e, "writing the checkpoint failed; the next run verifies again");
        }
        self.faults.check(FaultPoint::AfterCheckpointWrite).err()
    }

    /// Opens the readiness gate of gated pods whose target the NLB reports healthy, so
    /// a rollout proceeds only as fast as the NLB accepts new pods. A failed patch is a
    /// pod error (usually RBAC: `patch` on `pods/status`); the targets are still right.
    async fn open_gates(
        &self,
        desired: &Desired,
        actual: &[(Target, HealthState)],
        report: &mut GroupReport,
    ) {
        let healthy: BTreeSet<Target> = actual
            .iter()
            .filter(|(_, s)| *s == HealthState::Healthy)
            .map(|(t, _)| *t)
            .collect();
        for pod in desired.gates_to_open(|t| healthy.contains(t)) {
            match self.pods.open_gate(&pod.namespace, &pod.name).await {
                Ok(()) => report.gates_opened.push(pod.to_string()),
                Err(e) => report.pod_errors.push(PodError {
                    pod: pod.to_string(),
                    error: e.to_string(),
                }),
            }
        }
    }

    /// Writes the backoff row: a new failure, or a reset after success.
    async fn record_backoff(
        &self,
        arn: &str,
        state: &GroupState,
        failed: Option<&str>,
        report: &mut GroupReport,
    ) -> Result<(), FaultPoint> {
        let write = match failed {
            Some(msg) => {
                let now = self.clock.now();
                let next =
                    self.settings
                        .backoff
                        .on_failure(state.backoff, now, &mut self.jitter_rng());
                report.outcome = Outcome::Failed;
                report.error = Some(msg.to_owned());
                report.next_attempt_at = Some(next.next_attempt);
                Some(Some(next))
            }
            None if state.backoff.is_some() => Some(None),
            None => None,
        };
        if let Some(value) = write {
            if let Err(e) = self.state.set_backoff(arn, value).await {
                tracing::warn!(target_group = %arn, error = %e, "writing backoff state failed");
            }
            self.faults.check(FaultPoint::AfterBackoffWrite)?;
        }
        Ok(())
    }

    /// Gives the lease up on a path that already has an outcome (failed, backing off,
    /// out of passes), dirty or not; failures only log (the lease then expires).
    async fn release_quietly(&self, arn: &str, owner: Option<&str>) {
        let Some(owner) = owner else { return };
        if let Err(e) = self.state.abandon(arn, owner).await {
            tracing::warn!(target_group = %arn, error = %e, "lease release failed; it expires on its own");
        }
    }
}

/// Records a failed chunk in the report; returns 1 for counting.
fn fail(
    report: &mut GroupReport,
    chunk: &[Target],
    operation: &'static str,
    error: String,
) -> usize {
    tracing::warn!(operation, targets = chunk.len(), error = %error, "ELBv2 change failed");
    report
        .failed_targets
        .extend(chunk.iter().map(|t| FailedTarget {
            target: *t,
            operation,
            error: error.clone(),
        }));
    1
}
