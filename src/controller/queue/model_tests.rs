//! The queue's timers against the queue's slots: random runs of requests, starts, pass
//! ends of every kind, lease looks, forgets and the passing of time, checking after each
//! step that the index holds exactly what the slots say, and that every answer the
//! runner asks for (which key starts, when to wake, whether a one-shot run has work
//! left, which keys are parked) is the one a scan of every slot gives — the answers of
//! the queue before it kept timers.

use proptest::prelude::*;

use super::*;
use crate::reconcile::Failure;
use crate::state::StateError;

/// What a scan of every slot answers (the queue before its index).
mod scan {
    use super::*;

    pub fn first(q: &Queue, now: Instant, room: Room) -> Option<String> {
        q.slots
            .iter()
            .filter(|(_, s)| !s.running && s.not_before.is_none_or(|t| t <= now))
            .filter_map(|(k, s)| Some((k, s, s.pending?)))
            .filter(|(_, _, w)| {
                if w.reacts() {
                    room.changes
                } else {
                    room.verifications
                }
            })
            .min_by_key(|(k, s, w)| (!w.changed, w.since, s.seq, k.as_str()))
            .map(|(k, _, _)| k.clone())
    }

    pub fn has_work(q: &Queue, leases: Instant, gates: Instant) -> bool {
        q.slots.values().any(|s| {
            s.running
                || (s.pending.is_some()
                    && match (s.not_before, s.wait) {
                        (None, _) => true,
                        (Some(t), Wait::Lease) => t <= leases,
                        (Some(t), Wait::Gates) => t <= gates,
                        (Some(_), Wait::Time | Wait::Retry | Wait::Backoff) => false,
                    })
        })
    }

    pub fn next_wake(q: &Queue) -> Option<Instant> {
        q.slots
            .values()
            .filter(|s| !s.running && s.pending.is_some())
            .filter_map(|s| s.not_before)
            .min()
    }

    pub fn parked(q: &Queue) -> Vec<String> {
        let mut keys: Vec<String> = q
            .slots
            .iter()
            .filter(|(_, s)| s.wait == Wait::Lease && !s.running)
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort_unstable();
        keys
    }
}

/// One step of a run.
#[derive(Debug, Clone)]
enum Step {
    Request(usize, u8),
    Pop(bool, bool),
    Done(usize, u8, u64),
    Unpark(usize),
    LeaseSeen(usize, Option<u64>),
    Forget(usize),
    KeepReactions,
    Advance(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..6usize, 0..4u8).prop_map(|(k, w)| Step::Request(k, w)),
        4 => (any::<bool>(), any::<bool>()).prop_map(|(c, v)| Step::Pop(c, v)),
        4 => (0..6usize, 0..8u8, 0..3_000u64).prop_map(|(k, r, ms)| Step::Done(k, r, ms)),
        1 => (0..6usize).prop_map(Step::Unpark),
        1 => (0..6usize, proptest::option::of(0..3_000u64)).prop_map(|(k, u)| Step::LeaseSeen(k, u)),
        1 => (0..6usize).prop_map(Step::Forget),
        1 => Just(Step::KeepReactions),
        3 => (0..1_500u64).prop_map(Step::Advance),
    ]
}

/// A pass's end of kind `kind`, with a time `ms` after `now`'s wall clock.
fn result(kind: u8, ms: u64, now: Now) -> Reconciled {
    let until = UnixMillis(now.wall.0 + ms);
    match kind {
        0 => Ok(Action::Done),
        1 => Ok(Action::GatesPending),
        2 => Ok(Action::BackOff { until }),
        3 => Ok(Action::LeaseHeld { until }),
        4 => Err(PassError::Cut),
        5 => Err(PassError::Yielded),
        6 => Err(PassError::BackingOff {
            cause: Failure::Changes(1),
            until,
        }),
        _ => Err(PassError::Failed(Failure::StateRead(StateError::Dynamo {
            operation: "GetItem",
            message: "InternalServerError".into(),
        }))),
    }
}

/// The index holds exactly what the slots say.
fn agrees(q: &Queue) -> Result<(), TestCaseError> {
    let placed: std::collections::BTreeMap<String, Place> = q
        .slots
        .iter()
        .map(|(k, s)| {
            prop_assert_eq!(
                &s.placed,
                &s.place(),
                "{} is placed where its slot is not",
                k
            );
            let mut p = s.place();
            p.running = false;
            Ok((k.clone(), p))
        })
        .collect::<Result<Vec<_>, TestCaseError>>()?
        .into_iter()
        .filter(|(_, p)| *p != Place::default())
        .collect();
    prop_assert_eq!(q.index.places(), placed);
    prop_assert_eq!(
        q.index.running,
        q.slots.values().filter(|s| s.running).count()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_timers_answer_as_a_scan_of_every_key_does(steps in proptest::collection::vec(step(), 1..80)) {
        let origin = Instant::now();
        let mut t = 0u64;
        let mut q = Queue::default();
        let mut running: Vec<(String, Want)> = Vec::new();
        for step in steps {
            let now = Now {
                instant: origin + Duration::from_millis(t),
                wall: UnixMillis(1_000_000 + t),
            };
            match step {
                Step::Request(k, w) => {
                    let want = match w {
                        0 => Want::change(UnixMillis(t)),
                        1 => Want::verify(),
                        2 => Want::gates(),
                        _ => Want::change(UnixMillis(t / 2)),
                    };
                    q.request(&format!("k{k}"), want);
                }
                Step::Pop(changes, verifications) => {
                    let room = Room { changes, verifications };
                    let expected = scan::first(&q, now.instant, room);
                    let popped = q.pop(now.instant, room);
                    prop_assert_eq!(popped.as_ref().map(|(k, _)| k.clone()), expected);
                    running.extend(popped);
                }
                Step::Done(k, kind, ms) => {
                    if !running.is_empty() {
                        let (key, want) = running.remove(k % running.len());
                        q.done(&key, want, &result(kind, ms, now), now);
                    }
                }
                Step::Unpark(k) => q.unpark(&format!("k{k}")),
                Step::LeaseSeen(k, until) => q.lease_seen(
                    &format!("k{k}"),
                    until.map(|ms| UnixMillis(now.wall.0 + ms)),
                    now,
                ),
                Step::Forget(k) => q.forget(&format!("k{k}")),
                Step::KeepReactions => q.keep_reactions(),
                Step::Advance(ms) => t += ms,
            }
            agrees(&q)?;
            prop_assert_eq!(q.next_wake(), scan::next_wake(&q));
            let mut parked = q.parked();
            parked.sort_unstable();
            prop_assert_eq!(parked, scan::parked(&q));
            for (leases, gates) in [(0, 0), (500, 0), (0, 1_500), (3_000, 3_000)] {
                let (leases, gates) = (
                    origin + Duration::from_millis(t + leases),
                    origin + Duration::from_millis(t + gates),
                );
                prop_assert_eq!(q.has_work(leases, gates), scan::has_work(&q, leases, gates));
            }
        }
    }
}
