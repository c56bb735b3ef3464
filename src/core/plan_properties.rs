//! Property tests of the diff's invariants. Each one fails if the corresponding rule of
//! the design is broken in `plan`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use proptest::prelude::*;

use super::backoff::UnixMillis;
use super::binding::Mode;
use super::plan::{Call, Claim, MAX_TARGETS_PER_CALL, Plan, Rules, plan};
use super::target::{HealthState, QuicServerId, Target};

/// A target from a universe of `n` addresses on two ports, small enough that desired,
/// actual and owned overlap often. In a QUIC universe every target carries one of three
/// server IDs, so the same address often comes with another ID (a pod whose ID changed).
fn target(n: u32, quic: bool) -> impl Strategy<Value = Target> {
    (0..n, prop_oneof![Just(80u16), Just(8080u16)], 1..=3u8).prop_map(move |(i, port, id)| {
        let t = Target::new(Ipv4Addr::from(0x0a00_0000 + i).into(), port);
        if quic {
            t.with_quic_server_id(QuicServerId::from_bytes([0, 0, 0, 0, 0, 0, 0, id]))
        } else {
            t
        }
    })
}

fn state() -> impl Strategy<Value = HealthState> {
    prop_oneof![
        4 => Just(HealthState::Healthy),
        1 => Just(HealthState::Initial),
        1 => Just(HealthState::Unhealthy),
        1 => Just(HealthState::Unused),
        2 => Just(HealthState::Draining),
        1 => Just(HealthState::UnhealthyDraining),
    ]
}

#[derive(Debug, Clone)]
struct Inputs {
    desired: BTreeSet<Target>,
    actual: BTreeMap<Target, HealthState>,
    /// This deployment's ledger entries.
    owned: BTreeSet<Target>,
    /// Entries of another cluster's deployment sharing the group (disjoint from `owned`).
    theirs: BTreeSet<Target>,
    mode: Mode,
}

/// The time of every plan: entries are either old (written at 0) or fresh.
const NOW: UnixMillis = UnixMillis(10_000_000);

fn inputs() -> impl Strategy<Value = Inputs> {
    // Mostly small universes (dense overlaps), sometimes large ones (many chunks).
    // A QUIC group now and then: targets are (ip, port, server id).
    (
        prop_oneof![3 => Just(40u32), 1 => Just(2_000u32)],
        prop_oneof![3 => Just(false), 1 => Just(true)],
    )
        .prop_flat_map(|(n, quic)| {
            let max = if n > 100 { 900 } else { 60 };
            (
                prop::collection::btree_set(target(n, quic), 0..max),
                prop::collection::btree_map(target(n, quic), state(), 0..max),
                prop::collection::btree_set(target(n, quic), 0..max),
                prop::collection::btree_set(target(n, quic), 0..max / 4),
                prop_oneof![Just(Mode::Shared), Just(Mode::Exclusive)],
            )
                .prop_map(|(desired, actual, owned, theirs, mode)| Inputs {
                    desired,
                    theirs: theirs.difference(&owned).copied().collect(),
                    actual,
                    owned,
                    mode,
                })
        })
}

fn claims(i: &Inputs) -> BTreeMap<Target, Claim> {
    let claim = |mine| Claim {
        mine,
        since: UnixMillis(0),
        tombstone: false,
    };
    i.owned
        .iter()
        .map(|t| (*t, claim(true)))
        .chain(i.theirs.iter().map(|t| (*t, claim(false))))
        .collect()
}

fn run(i: &Inputs) -> Plan {
    plan(
        &i.desired,
        i.actual.iter(),
        &claims(i),
        &Rules::new(i.mode, NOW),
    )
}

fn present(actual: &BTreeMap<Target, HealthState>) -> BTreeSet<Target> {
    actual
        .iter()
        .filter(|(_, s)| !s.is_draining())
        .map(|(t, _)| *t)
        .collect()
}

/// What ELBv2 and the ledger look like after the plan's calls succeed: registered
/// targets start `initial`, deregistered ones drain, the ledger gains and loses rows.
fn apply(i: &Inputs, p: &Plan) -> Inputs {
    let mut actual = i.actual.clone();
    for t in &p.deregister {
        actual.insert(*t, HealthState::Draining);
    }
    for t in &p.register {
        actual.insert(*t, HealthState::Initial);
    }
    let mut owned = i.owned.clone();
    let mut theirs = i.theirs.clone();
    owned.extend(p.register.iter().copied());
    owned.extend(p.adopt.iter().copied());
    for t in p.register.iter().chain(&p.adopt) {
        theirs.remove(t);
    }
    for t in p.deregister.iter().chain(&p.forget) {
        owned.remove(t);
    }
    Inputs {
        desired: i.desired.clone(),
        actual,
        owned,
        theirs,
        mode: i.mode,
    }
}

fn flatten_calls(p: &Plan) -> (Vec<Target>, Vec<Target>, Vec<usize>) {
    let mut reg = Vec::new();
    let mut dereg = Vec::new();
    let mut sizes = Vec::new();
    for call in p.calls() {
        match call {
            Call::Register(ts) => {
                sizes.push(ts.len());
                reg.extend_from_slice(ts)
            }
            Call::Deregister(ts) => {
                sizes.push(ts.len());
                dereg.extend_from_slice(ts)
            }
        }
    }
    (reg, dereg, sizes)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// 1. In shared mode no target outside `owned` is ever deregistered, and in any mode
    /// no target another cluster's deployment claims is.
    #[test]
    fn shared_mode_never_deregisters_foreign_targets(mut i in inputs()) {
        let p = run(&i);
        for t in &p.deregister {
            prop_assert!(!i.theirs.contains(t), "deregistered another cluster's {t}");
        }
        i.mode = Mode::Shared;
        let p = run(&i);
        for t in &p.deregister {
            prop_assert!(i.owned.contains(t), "deregistered foreign target {t}");
        }
    }

    /// 2. Applying the plan yields `desired ∪ foreign` (shared) or `desired` (exclusive).
    #[test]
    fn applying_the_plan_reaches_the_desired_state(i in inputs()) {
        let p = run(&i);
        let after = present(&apply(&i, &p).actual);
        let mut expected = i.desired.clone();
        let kept = if i.mode == Mode::Shared { present(&i.actual) } else { i.theirs.clone() };
        expected.extend(
            present(&i.actual)
                .intersection(&kept)
                .filter(|t| !i.owned.contains(t)),
        );
        prop_assert_eq!(after, expected);
    }

    /// 3. Planning again after applying yields an empty plan.
    #[test]
    fn planning_after_applying_is_a_no_op(i in inputs()) {
        let p = run(&i);
        let again = run(&apply(&i, &p));
        prop_assert!(again.is_empty(), "second plan not empty: {again:?}");
    }

    /// 4. Chunks never exceed 200 and together cover exactly the planned sets.
    #[test]
    fn chunks_are_bounded_and_cover_the_plan(i in inputs()) {
        let p = run(&i);
        let (reg, dereg, sizes) = flatten_calls(&p);
        prop_assert!(sizes.iter().all(|&n| n > 0 && n <= MAX_TARGETS_PER_CALL));
        prop_assert_eq!(&reg, &p.register);
        prop_assert_eq!(&dereg, &p.deregister);
        let planned: BTreeSet<_> = p.register.iter().chain(&p.deregister).collect();
        prop_assert_eq!(planned.len(), reg.len() + dereg.len(), "a target planned twice");
    }

    /// 4b. Every deregistration goes out before any registration: nothing delays a
    /// deregistration, and a QUIC target whose server ID changed leaves before it comes
    /// back with the new one.
    #[test]
    fn deregistrations_go_first(i in inputs()) {
        let p = run(&i);
        let kinds: Vec<bool> = p.calls().map(|c| matches!(c, Call::Register(_))).collect();
        // Once a registration went out, no deregistration follows.
        prop_assert!(kinds.windows(2).all(|w| !w[0] || w[1]), "{kinds:?}");
    }

    /// 4c. A target of ours whose address is desired with another QUIC server ID (or
    /// without one) is deregistered, and the desired one registered: the server ID is
    /// part of the identity, never changed in place.
    #[test]
    fn a_changed_server_id_is_deregister_and_register(i in inputs()) {
        let p = run(&i);
        let present = present(&i.actual);
        for t in &present {
            let replaced = i.desired.iter().any(|d| {
                d.ip == t.ip && d.port == t.port && d.quic_server_id != t.quic_server_id
            });
            if replaced && i.owned.contains(t) && !i.desired.contains(t) {
                prop_assert!(p.deregister.contains(t), "{t} kept beside its new ID");
            }
        }
        for d in &i.desired {
            if !present.contains(d) {
                prop_assert!(p.register.contains(d), "{d} not registered");
            }
        }
    }

    /// 5. The same inputs, in any order, give the same calls in the same order.
    #[test]
    fn same_inputs_give_same_calls(i in inputs(), seed in any::<u64>()) {
        let p1 = run(&i);
        let mut shuffled: Vec<(Target, HealthState)> = i.actual.clone().into_iter().collect();
        fastrand::Rng::with_seed(seed).shuffle(&mut shuffled);
        let p2 = plan(
            &i.desired,
            shuffled.iter().map(|(t, s)| (t, s)),
            &claims(&i),
            &Rules::new(i.mode, NOW),
        );
        prop_assert_eq!(flatten_calls(&p1), flatten_calls(&p2));
        prop_assert_eq!(p1, p2);
    }
}

// Adopted targets are exactly the desired, present, unowned ones, so the ledger ends up
// owning every desired target.
proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// 6. Every desired target is owned after applying (adoption).
    #[test]
    fn every_desired_target_ends_up_owned(i in inputs()) {
        let p = run(&i);
        let after = apply(&i, &p);
        for t in &i.desired {
            prop_assert!(after.owned.contains(t), "desired {t} not owned after apply");
        }
        for t in &p.adopt {
            prop_assert!(i.desired.contains(t) && !i.owned.contains(t));
        }
    }

    /// 7. An entry of ours is forgotten only when its target is absent, undesired and
    /// older than the grace; a fresh one (ELBv2 reads lag a registration) never is.
    #[test]
    fn only_old_absent_undesired_entries_are_forgotten(i in inputs(), fresh in any::<bool>()) {
        let since = if fresh { UnixMillis(NOW.0 - 1_000) } else { UnixMillis(0) };
        let claims: BTreeMap<Target, Claim> = i
            .owned
            .iter()
            .map(|t| (*t, Claim { mine: true, since, tombstone: false }))
            .collect();
        let p = plan(&i.desired, i.actual.iter(), &claims, &Rules::new(i.mode, NOW));
        let present = present(&i.actual);
        for t in &p.forget {
            prop_assert!(!fresh, "forgot {t} a second after it was written");
            prop_assert!(i.owned.contains(t) && !present.contains(t) && !i.desired.contains(t));
        }
        if !fresh {
            let expected: BTreeSet<Target> = i
                .owned
                .iter()
                .filter(|t| !present.contains(t) && !i.desired.contains(t))
                .copied()
                .collect();
            prop_assert_eq!(p.forget.iter().copied().collect::<BTreeSet<_>>(), expected);
        }
    }
}
