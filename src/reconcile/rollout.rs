//! The rollout check of a look (see [`crate::core::rollout`]): the group's pods against
//! tgsync's deregistration latency and the group's load balancer, in the group's report.
//!
//! The group's side (protocol, health check, deregistration delay, connection
//! termination: [`TargetGroupApi::attributes`], two Describe calls) rarely changes, so
//! each container caches it per group for [`ATTRIBUTES_MAX_AGE`] (a failed read for
//! [`FAILED_READ_RETRY`]). It is read only where nothing waits for it and the group's
//! ELBv2 reads are budgeted already: a look that verified the group (read its target
//! health, within the schedule's verification budget) and found nothing to change, or a
//! dry run (`tgsync status`). A pass for a pod change never reads it: it checks with
//! what the container has (a cached read, even an old one), or says the group's side is
//! not read yet. On top of that, a container's reads are held to half of the
//! verification budget (`TGSYNC_VERIFY_DESCRIBES_PER_SECOND`), a run's worth at a time,
//! so a fleet that a cold container has never read is read over several runs rather
//! than all in its first (dry runs, which an operator asks for, are not held).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::{BoundGroup, Reconciler, RunOptions};
use crate::core::rollout::{GroupAttributes, check};
use crate::core::{PodIndex, UnixMillis};
use crate::groups::{ElbError, TargetGroupApi};
use crate::pods::PodSource;
use crate::report::{GroupReport, Outcome};
use crate::state::StateStore;
use crate::sync::lock;

/// How long a group's attributes read stand (they change when someone edits the group).
pub(crate) const ATTRIBUTES_MAX_AGE: Duration = Duration::from_secs(3600);
/// How long a failed read stands before the next look that may read tries again.
pub(crate) const FAILED_READ_RETRY: Duration = Duration::from_secs(600);
/// Describe calls one read of a group's attributes makes.
const CALLS_PER_READ: f64 = 2.0;

/// Why the check has no group side yet.
const NOT_READ: &str =
    "the group's attributes are not read yet: the next look that verifies the group reads them";

/// One group's attributes as last read, and until when the read stands.
#[derive(Debug, Clone)]
struct Read {
    until: UnixMillis,
    attributes: Result<GroupAttributes, String>,
}

impl Read {
    /// A read made at `at`: a success stands [`ATTRIBUTES_MAX_AGE`], a failure
    /// [`FAILED_READ_RETRY`].
    fn new(at: UnixMillis, attributes: Result<GroupAttributes, String>) -> Self {
        let age = if attributes.is_ok() {
            ATTRIBUTES_MAX_AGE
        } else {
            FAILED_READ_RETRY
        };
        Self {
            until: at.plus(age),
            attributes,
        }
    }

    /// Whether the read still stands at `now`.
    fn fresh(&self, now: UnixMillis) -> bool {
        now < self.until
    }
}

/// The container's reads of groups' attributes, and the budget of new ones.
#[derive(Debug, Default)]
pub(crate) struct AttributeReads(Mutex<Reads>);

#[derive(Debug, Default)]
struct Reads {
    groups: HashMap<String, Read>,
    /// Reads the budget allows now (see the module docs); `None` before the first.
    tokens: Option<f64>,
    /// When `tokens` was last topped up.
    topped_at: UnixMillis,
}

impl AttributeReads {
    /// The last read of `arn`, if any.
    fn get(&self, arn: &str) -> Option<Read> {
        lock(&self.0).groups.get(arn).cloned()
    }

    /// Records a read of `arn`.
    fn put(&self, arn: &str, read: Read) {
        lock(&self.0).groups.insert(arn.to_owned(), read);
    }

    /// Forgets `arn` (deleted).
    fn forget(&self, arn: &str) {
        lock(&self.0).groups.remove(arn);
    }

    /// Takes one read from the budget at `now`: `rate` reads a second, at most `burst`
    /// saved up (the first call finds it full).
    fn take(&self, now: UnixMillis, rate: f64, burst: f64) -> bool {
        let mut reads = lock(&self.0);
        let elapsed = now.0.saturating_sub(reads.topped_at.0) as f64 / 1000.0;
        let tokens = reads
            .tokens
            .map_or(burst, |t| (t + elapsed * rate).min(burst));
        reads.topped_at = now;
        if tokens >= 1.0 {
            reads.tokens = Some(tokens - 1.0);
            true
        } else {
            reads.tokens = Some(tokens);
            false
        }
    }
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Reconciler<P, G, S> {
    /// Checks `bound`'s pods (from `pods`) for the rollout and puts the result in
    /// `report`. `may_read`: the look may read the group's attributes when its
    /// container's read is missing or old (see the module docs).
    pub(super) async fn check_rollout(
        &self,
        bound: &BoundGroup,
        pods: &PodIndex<'_>,
        opts: &RunOptions,
        report: &mut GroupReport,
        may_read: bool,
    ) {
        let arn = bound.group.arn.as_str();
        let now = self.clock.now();
        let cached = self.memory.attribute_reads.get(arn);
        let read = match cached {
            Some(read) if read.fresh(now) => Some(read),
            stale if may_read && (opts.dry_run || self.may_read_attributes(now)) => {
                let read = match self.groups.attributes(arn, &opts.priority).await {
                    Ok(attributes) => Read::new(now, Ok(attributes)),
                    Err(ElbError::NotFound { .. }) => {
                        // Deleted meanwhile: the next look finds it gone.
                        self.memory.attribute_reads.forget(arn);
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(target_group = arn, error = %e, "reading the group's attributes for the rollout check failed");
                        match stale.filter(|s| s.attributes.is_ok()) {
                            // An older read still says more than the failure; it stands
                            // until the failure's retry.
                            Some(old) => Read {
                                until: now.plus(FAILED_READ_RETRY),
                                attributes: old.attributes,
                            },
                            None => Read::new(
                                now,
                                Err(format!("reading the group's attributes failed: {e}")),
                            ),
                        }
                    }
                };
                self.memory.attribute_reads.put(arn, read.clone());
                Some(read)
            }
            // Not read now: what the container has, however old.
            stale => stale,
        };
        let attributes = read.as_ref().map_or(Err(NOT_READ), |r| {
            r.attributes.as_ref().map_err(String::as_str)
        });
        report.rollout = Some(check(
            pods.candidates(&bound.binding),
            self.settings.rollout.latency,
            attributes,
            self.settings.rollout.allowances,
            opts.dry_run,
        ));
    }

    /// Whether the container's budget of attribute reads has one left (see the module
    /// docs): half the verification budget, in reads of two Describe calls, saving up
    /// at most one schedule period's worth.
    fn may_read_attributes(&self, now: UnixMillis) -> bool {
        let rate = self.settings.verify_describes_per_second / 2.0 / CALLS_PER_READ;
        let burst = (rate * self.settings.schedule_period.as_secs_f64()).max(1.0);
        self.memory.attribute_reads.take(now, rate, burst)
    }
}

/// Whether a look that ended with `report` may read the group's attributes: it read the
/// group's target health (a verification, or a dry run) and found nothing to change and
/// nothing failing.
pub(super) fn look_may_read(report: &GroupReport) -> bool {
    !report.verification_skipped && matches!(report.outcome, Outcome::InSync | Outcome::Planned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_held_to_their_budget() {
        let reads = AttributeReads::default();
        let t = |s: u64| UnixMillis(1_000_000 + s * 1000);
        // Full at first: the burst, then nothing until it refills.
        assert!((0..3).all(|_| reads.take(t(0), 0.5, 3.0)));
        assert!(!reads.take(t(0), 0.5, 3.0));
        assert!(!reads.take(t(1), 0.5, 3.0));
        assert!(reads.take(t(2), 0.5, 3.0));
        // Saving up stops at the burst.
        assert!((0..3).all(|_| reads.take(t(100), 0.5, 3.0)));
        assert!(!reads.take(t(100), 0.5, 3.0));
    }

    #[test]
    fn a_read_stands_an_hour_and_a_failure_ten_minutes() {
        let at = UnixMillis(1_000_000);
        let ok = Read::new(at, Ok(GroupAttributes::default()));
        assert!(ok.fresh(at.plus(ATTRIBUTES_MAX_AGE - Duration::from_millis(1))));
        assert!(!ok.fresh(at.plus(ATTRIBUTES_MAX_AGE)));
        let failed = Read::new(at, Err("denied".into()));
        assert!(failed.fresh(at.plus(Duration::from_secs(599))));
        assert!(!failed.fresh(at.plus(FAILED_READ_RETRY)));
    }
}
