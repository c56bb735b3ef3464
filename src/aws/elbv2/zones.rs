//! Which `AvailabilityZone` a target's description carries in RegisterTargets and
//! DeregisterTargets.
//!
//! An IP in the group's VPC carries none: ELBv2 finds its zone from its subnet. An IP
//! outside the VPC (a peered VPC, a hybrid node) must carry one: `all`, except in an ALB
//! group with cross-zone load balancing off, which refuses `all` and wants a zone of the
//! VPC — then each target goes in its pod's node's zone, which only the caller knows
//! (see [`crate::groups::Refusal::ZoneRequired`]). What ELBv2 taught this container is
//! kept here, shared by every clone of the adapter, keyed by target group ARN (which
//! names the account).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use crate::core::Target;

/// The zone of a target outside the VPC whose zone is not known: every enabled zone.
pub(super) const ALL: &str = "all";

/// What is known of the zones of targets outside their group's VPC.
#[derive(Debug, Default)]
pub(super) struct Zones {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Targets outside their group's VPC, and the zone to send for each (`all`, or the
    /// zone it was registered in or is described in).
    outside: HashMap<(String, Target), String>,
    /// Groups that refused `all` (an ALB with cross-zone load balancing off): their
    /// registrations need a named zone, and their targets' described zones are kept.
    named: HashSet<String>,
}

impl Zones {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        crate::sync::lock(&self.inner)
    }

    /// The zone to send for `target` of `arn`: `None` for an IP in the VPC (as far as
    /// this container knows).
    pub(super) fn zone(&self, arn: &str, target: &Target) -> Option<String> {
        self.lock().outside.get(&(arn.to_owned(), *target)).cloned()
    }

    /// Records that these targets of `arn` are outside its VPC (zone `all` unless one is
    /// known); whether any was new (a second refusal for the same IP is not an
    /// out-of-VPC problem).
    pub(super) fn mark_outside(&self, arn: &str, targets: &[Target]) -> bool {
        let mut inner = self.lock();
        let mut added = false;
        for t in targets {
            if let std::collections::hash_map::Entry::Vacant(e) =
                inner.outside.entry((arn.to_owned(), *t))
            {
                e.insert(ALL.to_owned());
                added = true;
            }
        }
        added
    }

    /// Records the zone `target` of `arn` is (to be) registered in.
    pub(super) fn set(&self, arn: &str, target: &Target, zone: &str) {
        self.lock()
            .outside
            .insert((arn.to_owned(), *target), zone.to_owned());
    }

    /// Whether `arn` wants a named zone for targets outside its VPC.
    pub(super) fn wants_named(&self, arn: &str) -> bool {
        self.lock().named.contains(arn)
    }

    /// Records that `arn` refused `all`; whether that is news.
    pub(super) fn mark_wants_named(&self, arn: &str) -> bool {
        self.lock().named.insert(arn.to_owned())
    }

    /// Takes in what DescribeTargetHealth says of `target`'s zone: `all` marks it
    /// outside the VPC; in a group that wants named zones, the zone it is described in
    /// is the one its deregistration sends.
    pub(super) fn described(&self, arn: &str, target: &Target, zone: Option<&str>) {
        let Some(zone) = zone else { return };
        let mut inner = self.lock();
        let key = (arn.to_owned(), *target);
        if zone == ALL || inner.named.contains(arn) || inner.outside.contains_key(&key) {
            inner.outside.insert(key, zone.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Target {
        s.parse().unwrap()
    }

    #[test]
    fn outside_targets_send_all_until_a_zone_is_known() {
        let z = Zones::default();
        let a = t("192.168.0.1:80");
        assert_eq!(z.zone("g", &a), None);
        assert!(z.mark_outside("g", &[a]));
        assert!(!z.mark_outside("g", &[a]), "a second mark is no news");
        assert_eq!(z.zone("g", &a).as_deref(), Some(ALL));
        assert_eq!(z.zone("other", &a), None, "per group");
        z.set("g", &a, "eu-west-1b");
        assert!(!z.mark_outside("g", &[a]));
        assert_eq!(z.zone("g", &a).as_deref(), Some("eu-west-1b"));
    }

    #[test]
    fn described_zones_are_kept_only_where_they_matter() {
        let z = Zones::default();
        let (inside, outside) = (t("10.0.0.1:80"), t("192.168.0.1:80"));
        z.described("g", &inside, Some("eu-west-1a"));
        z.described("g", &outside, Some(ALL));
        assert_eq!(z.zone("g", &inside), None, "an IP of the VPC sends no zone");
        assert_eq!(z.zone("g", &outside).as_deref(), Some(ALL));
        assert!(z.mark_wants_named("g"));
        assert!(!z.mark_wants_named("g"));
        assert!(z.wants_named("g") && !z.wants_named("h"));
        z.described("g", &outside, Some("eu-west-1c"));
        assert_eq!(z.zone("g", &outside).as_deref(), Some("eu-west-1c"));
    }
}
