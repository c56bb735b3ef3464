//! The queue's delay policy, one behaviour per test.

use super::*;

/// A failure before the lease (a state read that failed).
fn failed() -> PassError {
    PassError::Failed(crate::reconcile::Failure::StateRead(
        crate::state::StateError::Dynamo {
            operation: "GetItem",
            message: "InternalServerError".into(),
        },
    ))
}

const ALL: Room = Room {
    changes: true,
    verifications: true,
};

fn at(ms: u64) -> UnixMillis {
    UnixMillis(ms)
}

/// The queue's clocks `ms` after a common origin.
struct Clocks(Instant);

impl Clocks {
    fn new() -> Self {
        Self(Instant::now())
    }
    fn now(&self, ms: u64) -> Now {
        Now {
            instant: self.0 + Duration::from_millis(ms),
            wall: UnixMillis(1_000_000 + ms),
        }
    }
    fn i(&self, ms: u64) -> Instant {
        self.0 + Duration::from_millis(ms)
    }
    fn wall(&self, ms: u64) -> UnixMillis {
        UnixMillis(1_000_000 + ms)
    }
}

#[test]
fn one_pass_per_key_and_a_change_during_it_runs_it_again() {
    let c = Clocks::new();
    let mut q = Queue::default();
    q.request("a", Want::change(at(1)));
    let (k, w) = q.pop(c.i(1), ALL).unwrap();
    assert_eq!((k.as_str(), w.changed), ("a", true));
    // Changed again while in flight: not started twice.
    q.request("a", Want::change(at(2)));
    assert_eq!(q.pop(c.i(2), ALL), None);
    q.done("a", w, &Ok(Action::Done), c.now(2));
    let (k, w) = q.pop(c.i(3), ALL).unwrap();
    assert_eq!((k.as_str(), w.since), ("a", Some(at(2))));
    q.done("a", w, &Ok(Action::Done), c.now(3));
    assert!(q.is_idle());
}

#[test]
fn requests_merge_and_changes_go_first_oldest_first() {
    let c = Clocks::new();
    let mut q = Queue::default();
    q.request("v", Want::verify());
    q.request("b", Want::change(at(5)));
    q.request("a", Want::change(at(3)));
    q.request("b", Want::verify());
    let order: Vec<(String, Want)> = std::iter::from_fn(|| q.pop(c.i(9), ALL)).collect();
    assert_eq!(order[0].0, "a");
    assert_eq!(order[1].0, "b");
    assert!(order[1].1.changed && order[1].1.verify, "merged");
    assert_eq!(order[2].0, "v");
}

#[test]
fn a_backing_off_key_waits_but_a_pod_change_does_not() {
    let c = Clocks::new();
    let mut q = Queue::default();
    q.request("a", Want::verify());
    let (_, w) = q.pop(c.i(0), ALL).unwrap();
    // Its registrations back off until 100.
    q.done(
        "a",
        w,
        &Ok(Action::BackOff { until: c.wall(100) }),
        c.now(0),
    );
    assert_eq!(q.pop(c.i(50), ALL), None);
    assert_eq!(q.next_wake(), Some(c.i(100)));
    let (_, w) = q.pop(c.i(100), ALL).unwrap();
    q.done(
        "a",
        w,
        &Ok(Action::BackOff { until: c.wall(200) }),
        c.now(100),
    );
    // A pod changes meanwhile (a deregistration may be due): now.
    q.request("a", Want::change(at(60)));
    assert!(q.pop(c.i(101), ALL).is_some());
}

#[test]
fn a_change_made_while_the_pass_runs_is_not_held_by_its_retry() {
    let c = Clocks::new();
    let mut q = Queue::default();
    q.request("a", Want::change(at(1)));
    let (_, w) = q.pop(c.i(1), ALL).unwrap();
    q.request("a", Want::change(at(2)));
    q.done(
        "a",
        w,
        &Ok(Action::BackOff {
            until: c.wall(1_000),
        }),
        c.now(1),
    );
    assert!(q.pop(c.i(3), ALL).is_some(), "the newer change runs now");
}

#[test]
fn a_failure_before_the_lease_is_retried_later_and_later() {
    let c = Clocks::new();
    let mut q = Queue::default();
    q.request("a", Want::change(at(1)));
    let mut last = Duration::ZERO;
    let mut t = 0;
    for failures in 1..=6u32 {
        let (_, w) = q.pop(c.i(t), ALL).expect("the request is kept");
        assert!(w.changed, "the same request comes back");
        q.done("a", w, &Err(failed()), c.now(t));
        let wake = q.next_wake().expect("a retry time");
        let delay = wake - c.i(t);
        let ceiling = FAILED_RETRY.min * 2u32.pow(failures - 1);
        assert!(
            delay <= ceiling && delay >= ceiling / 2,
            "{failures}: {delay:?}"
        );
        assert!(delay >= last / 2);
        last = delay;
        assert_eq!(q.pop(wake - Duration::from_millis(1), ALL), None);
        t = u64::try_from((wake - c.0).as_millis()).unwrap();
    }
    // A pass that gets further resets the count.
    let (_, w) = q.pop(c.i(t), ALL).unwrap();
    q.done("a", w, &Ok(Action::Done), c.now(t));
    assert!(q.is_idle());
}

/// A lease take that failed for a reason no retry of the same call can help (the table
/// is missing) is still tried again by the queue, later and later: an operator may
/// create the table meanwhile, and the watching run goes on (only a release gives up
/// on it, in its `Ending`).
#[test]
fn a_failure_no_retry_can_help_is_still_tried_again_later() {
    let c = Clocks::new();
    let mut q = Queue::default();
    q.request("a", Want::change(at(1)));
    let (_, w) = q.pop(c.i(0), ALL).unwrap();
    let missing = PassError::Failed(crate::reconcile::Failure::LeaseTake(
        crate::state::StateError::NoTable { table: "t".into() },
    ));
    q.done("a", w, &Err(missing), c.now(0));
    let wake = q.next_wake().expect("a retry time");
    assert!(wake - c.i(0) >= FAILED_RETRY.min / 2, "{:?}", wake - c.i(0));
    let (_, w) = q.pop(wake, ALL).expect("the request is kept");
    assert!(w.changed, "the same request comes back");
}

#[test]
fn a_key_parked_on_a_lease_holds_its_changes_until_the_lease_ends_or_is_handed_back() {
    let c = Clocks::new();
    let mut q = Queue::default();
    q.request("a", Want::change(at(1)));
    let (_, w) = q.pop(c.i(1), ALL).unwrap();
    q.done(
        "a",
        w,
        &Ok(Action::LeaseHeld {
            until: c.wall(5_000),
        }),
        c.now(1),
    );
    assert_eq!(q.parked(), ["a"]);
    // Another change: the holder was asked, it does not wake the key.
    q.request("a", Want::change(at(2)));
    assert_eq!(q.pop(c.i(10), ALL), None);
    assert_eq!(q.next_wake(), Some(c.i(5_000) + LEASE_RECHECK_SLACK));
    // The holder hands the lease back.
    q.unpark("a");
    let (_, w) = q.pop(c.i(11), ALL).unwrap();
    assert_eq!(w.since, Some(at(1)), "both changes, merged");
    assert!(q.parked().is_empty());
}

#[test]
fn gates_come_back_after_the_poll_and_a_cut_pass_at_once() {
    let c = Clocks::new();
    let mut q = Queue::default();
    q.request("g", Want::verify());
    let (_, w) = q.pop(c.i(0), ALL).unwrap();
    q.done("g", w, &Ok(Action::GatesPending), c.now(0));
    assert_eq!(q.next_wake(), Some(c.i(0) + GATE_POLL));
    assert!(q.has_work(c.i(0), c.i(0) + GATE_POLL));
    assert!(!q.has_work(c.i(0) + GATE_POLL, c.i(999)));
    let (_, w) = q.pop(c.i(0) + GATE_POLL, ALL).unwrap();
    assert!(w.gates_only(), "only the gates are looked at again: {w:?}");
    q.done("g", w, &Ok(Action::Done), c.now(1_000));
    q.request("c", Want::change(at(0)));
    let (_, w) = q.pop(c.i(0), ALL).unwrap();
    q.done("c", w, &Err(PassError::Cut), c.now(0));
    assert_eq!(q.pop(c.i(0), ALL).unwrap().0, "c");
}

#[test]
fn room_is_per_class() {
    let c = Clocks::new();
    let mut q = Queue::default();
    q.request("v", Want::verify());
    q.request("c", Want::change(at(1)));
    let only_verify = Room {
        changes: false,
        verifications: true,
    };
    assert_eq!(q.pop(c.i(2), only_verify).unwrap().0, "v");
    let none = Room {
        changes: false,
        verifications: false,
    };
    assert_eq!(q.pop(c.i(2), none), None);
    assert_eq!(q.running(), 1);
    q.forget("c");
    assert!(!q.contains("c"));
}

#[test]
fn watch_retries_grow_with_jitter_and_are_bounded() {
    for failures in 1..40 {
        let d = watch_retry(failures);
        let ceiling = WATCH_RETRY
            .min
            .saturating_mul(1u32 << (failures - 1).min(16))
            .min(WATCH_RETRY.max);
        assert!(d <= ceiling && d >= ceiling / 2, "{failures}: {d:?}");
    }
    assert!(watch_retry(1) <= Duration::from_millis(800));
    assert!(watch_retry(30) >= Duration::from_secs(15));
}
