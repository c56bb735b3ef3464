//! The diff: desired × actual × owned × mode → the calls that make the group right.
//!
//! Level-based and pure: the same inputs always give the same plan, in the same order, so
//! a retried or concurrent run issues identical calls, and every invariant is checked by
//! property tests (`plan_properties`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::backoff::UnixMillis;
use super::binding::Mode;
use super::target::{HealthState, Target};

/// ELBv2 accepts at most this many targets per RegisterTargets / DeregisterTargets call.
pub const MAX_TARGETS_PER_CALL: usize = 200;

/// What one reconcile of a group must do. Every list is sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
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

    /// The mutating calls, deregistrations first, each chunked to the API limit: nothing
    /// delays a deregistration (a pod that stopped being ready must stop getting traffic
    /// now, not after a slow or refused registration), the room it frees counts against
    /// the group's targets quota before the registrations need it, and a QUIC target
    /// whose server ID changed leaves before it comes back with the new one.
    pub fn calls(&self) -> impl Iterator<Item = Call<'_>> {
        self.deregister
            .chunks(MAX_TARGETS_PER_CALL)
            .map(Call::Deregister)
            .chain(
                self.register
                    .chunks(MAX_TARGETS_PER_CALL)
                    .map(Call::Register),
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

/// How a ledger entry looks to the diff: whether this deployment's cluster holds it, and
/// since when (ELBv2 reads may lag a RegisterTargets, so a fresh entry is not forgotten
/// just because the target is not visible yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// Registered or adopted by this deployment (this cluster); `false` for an entry of
    /// another cluster's deployment sharing the group.
    pub mine: bool,
    /// When the entry was written, or for a tombstone when its target was deregistered.
    pub since: UnixMillis,
    /// A tombstone: the target was deregistered (see `LedgerEntry::deregistered_at`).
    /// Present, it is deregistered again (a registration landed late); desired and
    /// present, it is adopted anew; gone, it is forgotten after the grace.
    pub tombstone: bool,
}

/// The rest of the diff's inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Shared or exclusive.
    pub mode: Mode,
    /// The time the inputs were read.
    pub now: UnixMillis,
    /// How long an entry whose target is not visible is kept before it is forgotten.
    pub forget_grace: Duration,
}

impl Rules {
    /// Rules with the default grace ([`FORGET_GRACE`]).
    pub fn new(mode: Mode, now: UnixMillis) -> Self {
        Self {
            mode,
            now,
            forget_grace: FORGET_GRACE,
        }
    }
}

/// Default for [`Rules::forget_grace`]: ELBv2 shows a registration within seconds; a
/// minute leaves ample room and still forgets hand-removed targets on the next runs.
pub const FORGET_GRACE: Duration = Duration::from_secs(60);

/// What the ledger keeps of a target once its deregistration was answered at `gone`:
/// the entry stays as a tombstone since then ([`Claim::tombstone`]) for the forget
/// grace, so a registration of it that lands late (an abandoned attempt, or one of the
/// holder's own earlier attempts) is undone by the next pass; `None` would drop it.
pub fn tombstone(gone: UnixMillis) -> Option<UnixMillis> {
    Some(gone)
}

/// Computes the plan for one group.
///
/// `claims` is the ledger: every target some deployment registered or adopted. With
/// `present` = `actual` without draining targets and `mine` = this deployment's claims:
/// - `register = desired − present`;
/// - `deregister = (present ∩ mine) − desired`, plus in exclusive mode the unclaimed
///   `present − desired`; another cluster's claim is never deregistered;
/// - `adopt = (desired ∩ present) − mine`: hand-registered targets, and targets another
///   cluster's deployment claimed whose IP is now one of our ready pods (that pod is
///   live, so the other claim is stale: taking it over keeps the other deployment from
///   removing a live pod when it catches up);
/// - `forget = mine − present − desired`, once older than the grace;
/// - `foreign_kept = present − desired` that is not ours to remove.
pub fn plan<'a>(
    desired: &impl TargetSet,
    actual: impl IntoIterator<Item = (&'a Target, &'a HealthState)>,
    claims: &BTreeMap<Target, Claim>,
    rules: &Rules,
) -> Plan {
    let mine = |t: &Target| claims.get(t).is_some_and(|c| c.mine);
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
                if !mine(h) || claims.get(h).is_some_and(|c| c.tombstone) {
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
                let ours = match claims.get(h) {
                    Some(c) => c.mine,
                    None => rules.mode == Mode::Exclusive,
                };
                if ours {
                    deregister.push(**h);
                } else {
                    foreign_kept.push(**h);
                }
                have.next();
            }
            (None, None) => break,
        }
    }
    let forget = claims
        .iter()
        .filter(|(t, c)| {
            c.mine
                && present.binary_search(t).is_err()
                && !desired.has(t)
                && c.since.plus(rules.forget_grace) <= rules.now
        })
        .map(|(t, _)| *t)
        .collect();
    Plan {
        register,
        deregister,
        forget,
        adopt,
        foreign_kept,
    }
}

/// The plan of a `release`: take this deployment out of a group. Every present target
/// this deployment owns (`owned`) is deregistered, an owned target already gone (or
/// draining) is only forgotten, and everything else present is kept: a release never
/// removes a target it does not own, whatever the group's mode.
pub fn release_plan<'a>(
    owned: &BTreeSet<Target>,
    actual: impl IntoIterator<Item = (&'a Target, &'a HealthState)>,
) -> Plan {
    let present: BTreeSet<Target> = actual
        .into_iter()
        .filter(|(_, state)| !state.is_draining())
        .map(|(t, _)| *t)
        .collect();
    Plan {
        deregister: owned.intersection(&present).copied().collect(),
        forget: owned.difference(&present).copied().collect(),
        foreign_kept: present.difference(owned).copied().collect(),
        ..Plan::default()
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

    /// This deployment's claims on `owned`, all old enough to be forgotten.
    fn mine(owned: &BTreeSet<Target>) -> BTreeMap<Target, Claim> {
        owned
            .iter()
            .map(|t| {
                (
                    *t,
                    Claim {
                        mine: true,
                        since: UnixMillis(0),
                        tombstone: false,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_release_deregisters_only_what_it_owns() {
        let owned = set(&["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]);
        let actual = actual(&[
            ("10.0.0.1:80", "healthy"),
            ("10.0.0.3:80", "draining"),
            ("10.0.9.9:80", "healthy"),
        ]);
        let p = release_plan(&owned, actual.iter().map(|(t, s)| (t, s)));
        assert_eq!(p.deregister, vec!["10.0.0.1:80".parse().unwrap()]);
        assert_eq!(
            p.forget,
            vec![
                "10.0.0.2:80".parse().unwrap(),
                "10.0.0.3:80".parse().unwrap()
            ]
        );
        assert_eq!(p.foreign_kept, vec!["10.0.9.9:80".parse().unwrap()]);
        assert!(p.register.is_empty() && p.adopt.is_empty());
    }

    fn rules(mode: Mode) -> Rules {
        Rules::new(mode, UnixMillis(1_000_000))
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
            &mine(&owned),
            &rules(Mode::Shared),
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
            &BTreeMap::new(),
            &rules(Mode::Exclusive),
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
            &mine(&desired),
            &rules(Mode::Shared),
        );
        assert_eq!(strs(&p.register), ["10.0.0.1:80"]);
        assert!(p.forget.is_empty(), "a desired target is never forgotten");
    }

    #[test]
    fn another_clusters_claim_is_never_deregistered_and_a_fresh_one_never_forgotten() {
        let desired = set(&["10.0.0.1:80"]);
        let actual = actual(&[("10.0.0.1:80", "healthy"), ("10.0.0.2:80", "healthy")]);
        let now = UnixMillis(1_000_000);
        let claims = BTreeMap::from([
            // Theirs, IP now one of our ready pods: taken over.
            (
                t("10.0.0.1:80"),
                Claim {
                    mine: false,
                    since: UnixMillis(0),
                    tombstone: false,
                },
            ),
            // Theirs, not desired by us: kept even in exclusive mode.
            (
                t("10.0.0.2:80"),
                Claim {
                    mine: false,
                    since: UnixMillis(0),
                    tombstone: false,
                },
            ),
            // Ours, registered a second ago and not visible yet: kept.
            (
                t("10.0.0.3:80"),
                Claim {
                    mine: true,
                    since: UnixMillis(999_000),
                    tombstone: false,
                },
            ),
            // Ours, long gone: forgotten.
            (
                t("10.0.0.4:80"),
                Claim {
                    mine: true,
                    since: UnixMillis(0),
                    tombstone: false,
                },
            ),
        ]);
        for mode in [Mode::Shared, Mode::Exclusive] {
            let p = plan(
                &desired,
                actual.iter().map(|(t, s)| (t, s)),
                &claims,
                &Rules::new(mode, now),
            );
            assert_eq!(strs(&p.adopt), ["10.0.0.1:80"]);
            assert!(p.deregister.is_empty(), "{mode}: {p:?}");
            assert_eq!(strs(&p.foreign_kept), ["10.0.0.2:80"]);
            assert_eq!(strs(&p.forget), ["10.0.0.4:80"]);
        }
    }

    fn t(s: &str) -> Target {
        s.parse().unwrap()
    }

    #[test]
    fn a_changed_quic_server_id_is_deregister_then_register() {
        let desired = set(&["10.0.0.1:443@0x0000000000000002"]);
        let actual = actual(&[
            ("10.0.0.1:443@0x0000000000000001", "healthy"),
            ("10.0.0.2:443@0x0000000000000003", "healthy"),
        ]);
        let owned = set(&[
            "10.0.0.1:443@0x0000000000000001",
            "10.0.0.2:443@0x0000000000000003",
        ]);
        let p = plan(
            &desired,
            actual.iter().map(|(t, s)| (t, s)),
            &mine(&owned),
            &rules(Mode::Shared),
        );
        assert_eq!(
            strs(&p.deregister),
            [
                "10.0.0.1:443@0x0000000000000001",
                "10.0.0.2:443@0x0000000000000003"
            ]
        );
        assert_eq!(strs(&p.register), ["10.0.0.1:443@0x0000000000000002"]);
        assert!(matches!(p.calls().next(), Some(Call::Deregister(_))));
    }

    #[test]
    fn calls_are_chunked_deregistrations_first() {
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
            &mine(&owned),
            &rules(Mode::Shared),
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
                (false, 200),
                (false, 1),
                (true, 200),
                (true, 200),
                (true, 50),
            ]
        );
    }
}
