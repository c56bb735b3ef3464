//! Leases held elsewhere, as the look before the lease finds them in a group's item.
//! Such a group cannot be written now, so its look reads no target health only to learn
//! that: the holder is asked for a pass (`dirty`, served if it is alive) and the
//! group's key is parked until the lease may be taken over, holding no worker slot
//! ([`super::Action::LeaseHeld`]). The ELBv2 budget stays with the groups that can be
//! served.
//!
//! Two leases are not "elsewhere": one of this container's own passes (the same
//! process's other pass of the group; the lease protocol orders the two), and one a
//! verification has found held for longer than a dead holder could keep it: a look
//! that finds nothing to change needs no lease, so a holder that keeps renewing never
//! starves the group's verification — it reads health as a look without a lease does.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use crate::core::UnixMillis;
use crate::lease::{Busy, Timings};
use crate::report::{GroupReport, Outcome};
use crate::state::LeaseView;
use crate::sync::lock;

use super::{Action, Failure, PassError, Reconciled, Reconciler};
use crate::groups::TargetGroupApi;
use crate::pods::PodSource;
use crate::state::StateStore;

/// What this container knows of its groups' leases beyond their items.
#[derive(Debug, Default)]
pub(crate) struct Leases {
    /// Owner ids of the leases this container's passes hold now.
    ours: Mutex<HashSet<String>>,
    /// Since when looks have found each group's lease held elsewhere, for as long as
    /// they keep finding it so.
    held_since: Mutex<HashMap<String, UnixMillis>>,
}

/// Counts a lease as this container's for as long as it lives.
pub(crate) struct Ours<'a> {
    leases: &'a Leases,
    owner: String,
}

impl Drop for Ours<'_> {
    fn drop(&mut self) {
        lock(&self.leases.ours).remove(&self.owner);
    }
}

/// A lease held elsewhere, as a look found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Elsewhere {
    /// The holder, and when its lease may be taken over (its expiry plus the grace).
    pub(crate) busy: Busy,
    /// How long looks have found the group's lease held elsewhere.
    pub(crate) held_for: Duration,
}

impl Elsewhere {
    /// Whether a look asked to do `verification_only` (the schedule's look, which needs
    /// no lease when it finds nothing to change) parks on this lease: always but for a
    /// verification that has found it held longer than a dead holder could keep it
    /// (`timings`: its duration and the takeover grace).
    pub(crate) fn parks(&self, verification_only: bool, timings: &Timings) -> bool {
        !verification_only || self.held_for < timings.duration + timings.takeover_grace
    }
}

impl Leases {
    /// Counts `owner`'s lease as this container's until the guard is dropped.
    pub(crate) fn ours(&self, owner: &str) -> Ours<'_> {
        lock(&self.ours).insert(owner.to_owned());
        Ours {
            leases: self,
            owner: owner.to_owned(),
        }
    }

    /// The lease in group `arn`'s item (`lease`), as a look sees it at `now`: `Some`
    /// when another process holds it — live, or expired less than the takeover grace
    /// ago (nobody may take it over yet), and not one of this container's passes.
    /// Remembers since when looks find it so (and forgets it when they do not).
    pub(crate) fn elsewhere(
        &self,
        arn: &str,
        lease: Option<&LeaseView>,
        now: UnixMillis,
        timings: &Timings,
    ) -> Option<Elsewhere> {
        let held = lease
            .map(|l| Busy {
                owner: l.owner.clone(),
                until: l.until.plus(timings.takeover_grace),
            })
            .filter(|b| b.until >= now && !lock(&self.ours).contains(&b.owner));
        let mut since = lock(&self.held_since);
        let Some(busy) = held else {
            since.remove(arn);
            return None;
        };
        let first = *since.entry(arn.to_owned()).or_insert(now);
        Some(Elsewhere {
            busy,
            held_for: Duration::from_millis(now.0.saturating_sub(first.0)),
        })
    }
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Reconciler<P, G, S> {
    /// Parks the look at group `arn`, whose lease is `held` elsewhere at `now`: asks the
    /// holder for a pass and notes in `report` what the queue does with the group (a
    /// failed ask: retried after a backoff). `None` when the holder no longer holds
    /// the lease (given back or taken over since the read): the look goes on.
    pub(super) async fn park(
        &self,
        arn: &str,
        held: &Elsewhere,
        now: UnixMillis,
        report: &mut GroupReport,
    ) -> Option<Reconciled> {
        let grace = u64::try_from(self.settings.lease.takeover_grace.as_millis()).unwrap_or(0);
        let held_after = UnixMillis(now.0.saturating_sub(grace));
        match self
            .state
            .ask_holder(arn, &held.busy.owner, held_after)
            .await
        {
            Ok(true) => Some(Ok(lease_held(report, &held.busy))),
            Ok(false) => None,
            Err(e) => {
                let error = PassError::Failed(Failure::AskHolder(e));
                report.outcome = Outcome::Failed;
                report.error = Some(error.to_string());
                Some(Err(error))
            }
        }
    }
}

/// Notes in `report` that another process holds the group's lease (`busy`), which was
/// asked to run again; what the queue does with the group.
pub(crate) fn lease_held(report: &mut GroupReport, busy: &Busy) -> Action {
    report.outcome = Outcome::LeaseHeld;
    report.error = Some(format!(
        "another reconcile ({}) holds the lease; it was asked to run again",
        busy.owner
    ));
    report.lease_until = Some(busy.until);
    Action::LeaseHeld { until: busy.until }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: UnixMillis = UnixMillis(1_800_000_000_000);

    fn lease(owner: &str, until: UnixMillis) -> Option<LeaseView> {
        Some(LeaseView {
            owner: owner.to_owned(),
            until,
        })
    }

    #[test]
    fn a_lease_is_held_elsewhere_until_its_grace_ends_and_never_when_it_is_ours() {
        let t = Timings::default();
        let leases = Leases::default();
        let other = lease("resync@c#1", T0);
        let seen = leases.elsewhere("g", other.as_ref(), T0, &t).expect("held");
        assert_eq!(seen.busy.until, T0.plus(t.takeover_grace));
        // Expired, within the grace: nobody may take it yet.
        let within = T0.plus(t.takeover_grace);
        assert!(leases.elsewhere("g", other.as_ref(), within, &t).is_some());
        let past = within.plus(Duration::from_millis(1));
        assert_eq!(leases.elsewhere("g", other.as_ref(), past, &t), None);
        // One of this container's passes holds it: not elsewhere, while it does.
        let ours = leases.ours("resync@c#1");
        assert_eq!(leases.elsewhere("g", other.as_ref(), T0, &t), None);
        drop(ours);
        assert!(leases.elsewhere("g", other.as_ref(), T0, &t).is_some());
        assert_eq!(leases.elsewhere("g", None, T0, &t), None);
    }

    #[test]
    fn a_verification_stops_parking_once_the_lease_outlasted_a_dead_holder() {
        let t = Timings::default();
        let leases = Leases::default();
        let bound = t.duration + t.takeover_grace;
        let at = |ms: u128| T0.plus(Duration::from_millis(ms as u64));
        let renewed = |now: UnixMillis| lease("resync@c#1", now.plus(t.duration));
        let first = leases
            .elsewhere("g", renewed(T0).as_ref(), T0, &t)
            .expect("held");
        assert!(first.parks(true, &t) && first.parks(false, &t));
        let later = at(bound.as_millis());
        let still = leases
            .elsewhere("g", renewed(later).as_ref(), later, &t)
            .expect("held");
        assert_eq!(still.held_for, bound);
        assert!(!still.parks(true, &t), "the verification goes on");
        assert!(still.parks(false, &t), "a change still needs the lease");
        // Given back: the next holder's lease counts from when it is first seen.
        assert_eq!(leases.elsewhere("g", None, later, &t), None);
        let again = leases
            .elsewhere("g", renewed(later).as_ref(), later, &t)
            .expect("held");
        assert!(again.parks(true, &t));
    }
}
