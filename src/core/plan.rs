//! The diff: desired × actual × owned × mode → the calls that make the group right.
//!
//! Level-based and pure: the same inputs always give the same plan, in the same order, so
//! a retried or concurrent run issues identical calls, and every invariant is checked by
//! property tests (`plan_properties`).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::binding::Mode;
use super::target::{HealthState, Target};

/// ELBv2 accepts at most this many targets per RegisterTargets / DeregisterTargets call.
pub const MAX_TARGETS_PER_CALL: usize = 200;

/// What one reconcile of a group must do. Every list is sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Desired but not present (draining counts as absent): RegisterTargets.
    pub register: Vec<Target>,
    /// Present and not desired, and ours to remove: DeregisterTargets.
    pub deregister: Vec<Target>,
    /// Ledger rows whose target is gone and not desired (removed by hand): delete the row.
    pub forget: Vec<Target>,
    /// Desired and present but not in the ledger (registered by hand or by an older
    /// ledger): record ownership so the target is removed when its pod goes, instead of
    /// being kept forever as "foreign".
    pub adopt: Vec<Target>,
    /// Present, not owned and not desired, kept because the group is shared.
    pub foreign_kept: Vec<Target>,
}

/// One mutating ELBv2 call of a plan, at most [`MAX_TARGETS_PER_CALL`] targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call<'a> {
    /// RegisterTargets with these targets.
    Register(&'a [Target]),
    /// DeregisterTargets with these targets.
    Deregister(&'a [Target]),
}

impl Plan {
    /// Nothing to call and nothing to forget.
    pub fn is_empty(&self) -> bool {
        self.register.is_empty()
            && self.deregister.is_empty()
            && self.forget.is_empty()
            && self.adopt.is_empty()
    }

    /// The mutating calls, registers first (new pods take traffic before old ones leave),
    /// each chunked to the API limit.
    pub fn calls(&self) -> impl Iterator<Item = Call<'_>> {
        self.register
            .chunks(MAX_TARGETS_PER_CALL)
            .map(Call::Register)
            .chain(
                self.deregister
                    .chunks(MAX_TARGETS_PER_CALL)
                    .map(Call::Deregister),
            )
    }
}

/// A sorted set of targets: the desired set comes as a set in tests and as a map (target →
/// origin pod) from [`desired_targets`](super::desired_targets); the diff needs only this.
pub trait TargetSet {
    /// Whether `t` is in the set.
    fn has(&self, t: &Target) -> bool;
    /// The targets in ascending order.
    fn ascending(&self) -> impl Iterator<Item = &Target>;
}

impl TargetSet for BTreeSet<Target> {
    fn has(&self, t: &Target) -> bool {
        self.contains(t)
    }
    fn ascending(&self) -> impl Iterator<Item = &Target> {
        self.iter()
    }
}

impl<V> TargetSet for BTreeMap<Target, V> {
    fn has(&self, t: &Target) -> bool {
        self.contains_key(t)
    }
    fn ascending(&self) -> impl Iterator<Item = &Target> {
        self.keys()
    }
}

/// Computes the plan for one group.
///
/// - `present` = `actual` without draining targets;
/// - `register = desired − present`;
/// - `deregister = (present ∩ owned) − desired` (shared) or `present − desired` (exclusive);
/// - `forget = owned − present − desired`;
/// - `adopt = (desired ∩ present) − owned`;
/// - `foreign_kept = present − owned − desired` (shared only).
pub fn plan<'a>(
    desired: &impl TargetSet,
    actual: impl IntoIterator<Item = (&'a Target, &'a HealthState)>,
    owned: &BTreeSet<Target>,
    mode: Mode,
) -> Plan {
    // A sorted vector and a merge walk: far cheaper than set operations at 100k targets.
    let mut present: Vec<Target> = actual
        .into_iter()
        .filter(|(_, state)| !state.is_draining())
        .map(|(t, _)| *t)
        .collect();
    present.sort_unstable();
    present.dedup();
    let mut register = Vec::new();
    let mut deregister = Vec::new();
    let mut foreign_kept = Vec::new();
    let mut adopt = Vec::new();
    let mut want = desired.ascending().peekable();
    let mut have = present.iter().peekable();
    loop {
        match (want.peek(), have.peek()) {
            (Some(w), Some(h)) if w == h => {
                if !owned.contains(h) {
                    adopt.push(**h);
                }
                want.next();
                have.next();
            }
            (Some(w), Some(h)) if w < h => {
                register.push(**w);
                want.next();
            }
            (Some(w), None) => {
                register.push(**w);
                want.next();
            }
            (_, Some(h)) => {
                if mode == Mode::Exclusive || owned.contains(h) {
                    deregister.push(**h);
                } else {
                    foreign_kept.push(**h);
                }
                have.next();
            }
            (None, None) => break,
        }
    }
    let forget = owned
        .iter()
        .filter(|t| present.binary_search(t).is_err() && !desired.has(t))
        .copied()
        .collect();
    Plan {
        register,
        deregister,
        forget,
        adopt,
        foreign_kept,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<Target> {
        items.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn actual(items: &[(&str, &str)]) -> Vec<(Target, HealthState)> {
        items
            .iter()
            .map(|(t, s)| (t.parse().unwrap(), HealthState::from_api(s)))
            .collect()
    }

    fn strs(v: &[Target]) -> Vec<String> {
        v.iter().map(Target::to_string).collect()
    }

    #[test]
    fn shared_group_with_foreign_and_hand_removed_targets() {
        let desired = set(&["10.0.0.1:80", "10.0.0.2:80"]);
        let actual = actual(&[
            ("10.0.0.2:80", "healthy"),
            ("10.0.0.3:80", "healthy"),    // ours, pod gone
            ("192.168.9.9:80", "healthy"), // hand-added
            ("10.0.0.4:80", "draining"),   // ours, already leaving
        ]);
        let owned = set(&["10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80", "10.0.0.5:80"]);
        let p = plan(
            &desired,
            actual.iter().map(|(t, s)| (t, s)),
            &owned,
            Mode::Shared,
        );
        assert_eq!(strs(&p.register), ["10.0.0.1:80"]);
        assert_eq!(strs(&p.deregister), ["10.0.0.3:80"]);
        assert_eq!(strs(&p.forget), ["10.0.0.4:80", "10.0.0.5:80"]);
        assert_eq!(strs(&p.foreign_kept), ["192.168.9.9:80"]);
    }

    #[test]
    fn exclusive_group_removes_foreign_targets() {
        let desired = set(&["10.0.0.1:80"]);
        let actual = actual(&[("10.0.0.1:80", "healthy"), ("192.168.9.9:80", "unused")]);
        let p = plan(
            &desired,
            actual.iter().map(|(t, s)| (t, s)),
            &BTreeSet::new(),
            Mode::Exclusive,
        );
        assert!(p.register.is_empty());
        assert_eq!(strs(&p.deregister), ["192.168.9.9:80"]);
        assert!(p.foreign_kept.is_empty());
    }

    #[test]
    fn draining_desired_target_is_registered_again() {
        let desired = set(&["10.0.0.1:80"]);
        let actual = actual(&[("10.0.0.1:80", "draining")]);
        let p = plan(
            &desired,
            actual.iter().map(|(t, s)| (t, s)),
            &desired,
            Mode::Shared,
        );
        assert_eq!(strs(&p.register), ["10.0.0.1:80"]);
        assert!(p.forget.is_empty(), "a desired target is never forgotten");
    }

    #[test]
    fn calls_are_chunked_registers_first() {
        let desired: BTreeSet<Target> = (0..450u32)
            .map(|i| Target::new(std::net::Ipv4Addr::from(0x0a00_0000 + i).into(), 80))
            .collect();
        let stale: Vec<(Target, HealthState)> = (0..201u32)
            .map(|i| {
                (
                    Target::new(std::net::Ipv4Addr::from(0x0b00_0000 + i).into(), 80),
                    HealthState::Healthy,
                )
            })
            .collect();
        let owned = stale.iter().map(|(t, _)| *t).collect();
        let p = plan(
            &desired,
            stale.iter().map(|(t, s)| (t, s)),
            &owned,
            Mode::Shared,
        );
        let sizes: Vec<(bool, usize)> = p
            .calls()
            .map(|c| match c {
                Call::Register(t) => (true, t.len()),
                Call::Deregister(t) => (false, t.len()),
            })
            .collect();
        assert_eq!(
            sizes,
            [
                (true, 200),
                (true, 200),
                (true, 50),
                (false, 200),
                (false, 1)
            ]
        );
    }
}
