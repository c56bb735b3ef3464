//! Registrations held back target by target, apart from the group's backoff: a target
//! ELBv2 refused for itself backs off alone, and a group ELBv2 found full registers only
//! what its learnt capacity leaves room for and probes beyond it once per growing
//! interval. A target is not its group: neither holds back any other target's
//! registration, nor any deregistration.
//!
//! Pure: time and randomness come in as arguments; the state is a small value the
//! group's item stores.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::backoff::{BackoffPolicy, UnixMillis};
use super::target::Target;

/// A target ELBv2 refused for itself, and when it may be sent again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedTarget {
    /// Consecutive refusals.
    pub failures: u32,
    /// Not sent again before this time.
    pub next_attempt: UnixMillis,
    /// ELBv2's code and message, as the report shows them.
    pub reason: String,
    /// The cluster whose pod the target is: a group shared by clusters holds each
    /// one's refusals, and each settles only its own.
    pub cluster: String,
}

/// A group ELBv2 refused registrations for capacity (`TooManyTargets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Full {
    /// Targets registered when the refusal came: what the group holds at most as far as
    /// anyone knows (its quota, or its load balancer's, less what others hold).
    pub capacity: usize,
    /// Consecutive probes refused (1 after the first refusal).
    pub failures: u32,
    /// No registration beyond `capacity` before this time.
    pub next_probe: UnixMillis,
}

/// A group's registrations held back apart from its backoff.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holds {
    /// Targets refused for themselves, each backing off alone.
    pub refused: BTreeMap<Target, RefusedTarget>,
    /// The group is full, as last learnt.
    pub full: Option<Full>,
}

/// Why a registration waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// ELBv2 refused the target for itself; it is sent again at `until`.
    Refused {
        /// ELBv2's code and message.
        reason: String,
        /// When it is sent again.
        until: UnixMillis,
    },
    /// The group is full; it probes for room again at `until`.
    Full {
        /// The capacity learnt.
        capacity: usize,
        /// When the group probes again.
        until: UnixMillis,
    },
}

impl Wait {
    /// When the waiting registration is tried again.
    pub fn until(&self) -> UnixMillis {
        match self {
            Self::Refused { until, .. } | Self::Full { until, .. } => *until,
        }
    }
}

/// A pass's registrations, sorted by what holds them back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sorted {
    /// Sent as usual, in chunks: nothing holds them back.
    pub fresh: Vec<Target>,
    /// Refused before and due again: each sent in a call of its own, so a target ELBv2
    /// refuses again never shares a call with another.
    pub retries: Vec<Target>,
    /// The full group's probe: one target beyond its capacity, sent alone.
    pub probe: Option<Target>,
    /// Held back, and why.
    pub waiting: Vec<(Target, Wait)>,
}

impl Sorted {
    /// Whether anything is to be sent.
    pub fn sends(&self) -> bool {
        !self.fresh.is_empty() || !self.retries.is_empty() || self.probe.is_some()
    }

    /// When the first waiting registration is tried again.
    pub fn next_try(&self) -> Option<UnixMillis> {
        self.waiting.iter().map(|(_, w)| w.until()).min()
    }
}

impl Holds {
    /// Whether nothing is held back.
    pub fn is_empty(&self) -> bool {
        self.refused.is_empty() && self.full.is_none()
    }

    /// Sorts `register` (a plan's registrations, in order) at `now`, for a group holding
    /// `present` targets once the pass's deregistrations are done: refused targets not
    /// due wait; a full group sends what its capacity leaves room for (new targets
    /// first), one probe beyond it when the probe is due, and holds back the rest.
    pub fn sort(&self, register: &[Target], present: usize, now: UnixMillis) -> Sorted {
        let mut sorted = Sorted::default();
        for t in register {
            match self.refused.get(t) {
                Some(r) if now < r.next_attempt => sorted.waiting.push((
                    *t,
                    Wait::Refused {
                        reason: r.reason.clone(),
                        until: r.next_attempt,
                    },
                )),
                Some(_) => sorted.retries.push(*t),
                None => sorted.fresh.push(*t),
            }
        }
        let Some(full) = self.full else {
            return sorted;
        };
        let mut room = full.capacity.saturating_sub(present);
        let mut beyond = Vec::new();
        for list in [&mut sorted.fresh, &mut sorted.retries] {
            let keep = room.min(list.len());
            room -= keep;
            beyond.extend(list.drain(keep..));
        }
        let mut beyond = beyond.into_iter();
        if now >= full.next_probe {
            sorted.probe = beyond.next();
        }
        let until = if sorted.probe.is_some() {
            // If the probe is refused, the next one comes no sooner than this.
            now
        } else {
            full.next_probe
        };
        sorted.waiting.extend(beyond.map(|t| {
            (
                t,
                Wait::Full {
                    capacity: full.capacity,
                    until,
                },
            )
        }));
        sorted
    }

    /// Whether these holds keep a refusal of `cluster`'s that the plan's registrations
    /// (`register`) no longer need: its target is not to be registered (its pod went; a
    /// new pod may come with its address). A pass then settles them.
    pub fn stale(&self, cluster: &str, register: &[Target]) -> bool {
        self.refused
            .iter()
            .any(|(t, r)| r.cluster == cluster && !register.contains(t))
    }

    /// Records that ELBv2 refused `target` for itself at `now`; when it may be sent again.
    pub fn refuse(
        &mut self,
        target: Target,
        reason: &str,
        cluster: &str,
        now: UnixMillis,
        policy: &BackoffPolicy,
        rng: &mut fastrand::Rng,
    ) -> UnixMillis {
        let failures = self
            .refused
            .get(&target)
            .map_or(0, |r| r.failures)
            .saturating_add(1);
        let next_attempt = now.plus(policy.delay(failures, rng));
        self.refused.insert(
            target,
            RefusedTarget {
                failures,
                next_attempt,
                reason: reason.to_owned(),
                cluster: cluster.to_owned(),
            },
        );
        next_attempt
    }

    /// Records that the group took `target`: it is no longer refused.
    pub fn took(&mut self, target: &Target) {
        self.refused.remove(target);
    }

    /// Records that ELBv2 refused a registration for capacity with `present` targets
    /// registered at `now`; when the group probes again (the interval grows with each
    /// refused probe).
    pub fn filled(
        &mut self,
        present: usize,
        now: UnixMillis,
        policy: &BackoffPolicy,
        rng: &mut fastrand::Rng,
    ) -> UnixMillis {
        let failures = self.full.map_or(0, |f| f.failures).saturating_add(1);
        let next_probe = now.plus(policy.delay(failures, rng));
        self.full = Some(Full {
            capacity: present,
            failures,
            next_probe,
        });
        next_probe
    }

    /// Records that the group took the probe: it holds more than was learnt, so its
    /// capacity is unknown again (the next refusal learns it anew). Nothing else forgets
    /// a full group: a probe long due is sent as soon as a registration goes beyond the
    /// capacity, so a group that shrank and grows again loses no time to it.
    pub fn probe_taken(&mut self) {
        self.full = None;
    }

    /// Forgets `cluster`'s refusals of targets no longer to be registered (`wanted` is
    /// false: the pod is gone, or the target is registered), at the end of its pass.
    pub fn settle(&mut self, cluster: &str, wanted: impl Fn(&Target) -> bool) {
        self.refused
            .retain(|t, r| r.cluster != cluster || wanted(t));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(i: u8) -> Target {
        format!("10.0.0.{i}:80").parse().unwrap()
    }

    fn targets(n: u8) -> Vec<Target> {
        (1..=n).map(t).collect()
    }

    const NOW: UnixMillis = UnixMillis(100_000);

    #[test]
    fn nothing_held_sends_everything_fresh() {
        let s = Holds::default().sort(&targets(3), 0, NOW);
        assert_eq!(s.fresh, targets(3));
        assert!(s.retries.is_empty() && s.probe.is_none() && s.waiting.is_empty());
    }

    #[test]
    fn a_refused_target_waits_alone_and_is_retried_alone_when_due() {
        let mut h = Holds::default();
        let policy = BackoffPolicy {
            min: std::time::Duration::from_secs(5),
            max: std::time::Duration::from_secs(60),
        };
        let mut rng = fastrand::Rng::with_seed(1);
        let until = h.refuse(t(2), "InvalidTarget: no", "c", NOW, &policy, &mut rng);
        assert!(until >= NOW.plus(std::time::Duration::from_secs(5)));
        let s = h.sort(&targets(3), 0, NOW);
        assert_eq!(s.fresh, [t(1), t(3)]);
        assert_eq!(s.waiting.len(), 1);
        assert_eq!(s.waiting[0].0, t(2));
        assert_eq!(s.next_try(), Some(until));
        let s = h.sort(&targets(3), 0, until);
        assert_eq!((s.fresh, s.retries), (vec![t(1), t(3)], vec![t(2)]));
        // Refused again: the delay grows.
        let again = h.refuse(t(2), "InvalidTarget: no", "c", until, &policy, &mut rng);
        assert_eq!(h.refused[&t(2)].failures, 2);
        assert!(again.0 - until.0 >= 5_000);
        h.took(&t(2));
        assert!(h.is_empty());
    }

    #[test]
    fn a_full_group_sends_what_fits_and_probes_once_when_due() {
        let mut h = Holds::default();
        let policy = BackoffPolicy {
            min: std::time::Duration::from_secs(15),
            max: std::time::Duration::from_secs(300),
        };
        let mut rng = fastrand::Rng::with_seed(2);
        let probe_at = h.filled(5, NOW, &policy, &mut rng);
        // Four present: room for one; the rest wait for the probe.
        let s = h.sort(&targets(4), 4, NOW);
        assert_eq!(s.fresh, [t(1)]);
        assert_eq!(s.probe, None);
        assert_eq!(s.waiting.len(), 3);
        assert!(
            s.waiting
                .iter()
                .all(|(_, w)| matches!(w, Wait::Full { capacity: 5, until } if *until == probe_at))
        );
        // Full: nothing is sent until the probe is due, then exactly one.
        let s = h.sort(&targets(4), 5, NOW);
        assert!(!s.sends());
        let s = h.sort(&targets(4), 5, probe_at);
        assert_eq!(s.probe, Some(t(1)));
        assert!(s.fresh.is_empty() && s.waiting.len() == 3);
        // The probe refused: the interval grows.
        let next = h.filled(5, probe_at, &policy, &mut rng);
        assert_eq!(h.full.unwrap().failures, 2);
        assert!(next.0 - probe_at.0 >= 15_000);
        // Taken: capacity unknown again.
        h.probe_taken();
        assert_eq!(h.sort(&targets(4), 5, next).fresh, targets(4));
    }

    #[test]
    fn room_goes_to_new_targets_before_retries() {
        let mut h = Holds::default();
        let policy = BackoffPolicy::default();
        let mut rng = fastrand::Rng::with_seed(3);
        let due = h.refuse(t(1), "x", "c", NOW, &policy, &mut rng);
        let later = BackoffPolicy {
            min: std::time::Duration::from_secs(60),
            max: std::time::Duration::from_secs(60),
        };
        h.filled(3, NOW, &later, &mut rng);
        let s = h.sort(&targets(3), 2, due);
        assert_eq!(s.fresh, [t(2)]);
        assert!(s.retries.is_empty());
        assert_eq!(
            s.waiting.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            [t(3), t(1)]
        );
    }

    #[test]
    fn settling_forgets_only_the_clusters_own_refusals_of_targets_not_wanted() {
        let mut h = Holds::default();
        let policy = BackoffPolicy::default();
        let mut rng = fastrand::Rng::with_seed(4);
        h.refuse(t(1), "x", "c", NOW, &policy, &mut rng);
        h.refuse(t(2), "x", "c", NOW, &policy, &mut rng);
        h.refuse(t(3), "x", "other", NOW, &policy, &mut rng);
        h.filled(3, NOW, &policy, &mut rng);
        let register = [t(2), t(4)];
        assert!(h.stale("c", &register), "t(1) is not to be registered");
        assert!(!h.stale("other", &[t(3)]), "t(3) is, by the other cluster");
        h.settle("c", |x| register.contains(x));
        assert_eq!(h.refused.keys().copied().collect::<Vec<_>>(), [t(2), t(3)]);
        assert!(!h.stale("c", &register));
        assert!(h.full.is_some(), "only a probe taken forgets a full group");
        h.settle("c", |_| false);
        h.settle("other", |_| false);
        h.probe_taken();
        assert!(h.is_empty());
    }
}
