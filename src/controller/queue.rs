//! The work queue: one key per target group, as kube-runtime's scheduler and runner
//! keep them, and the one place that answers "when is this group tried again". Pure
//! data, no I/O: the runner asks it what to start and tells it how each pass ended.
//!
//! - A key is in flight at most once; a key requested while its pass runs is run again
//!   right after (the request waits, merged, until then).
//! - Requests merge: a pod change and the schedule's full diff of the same group are one
//!   pass that does both.
//! - Pod changes go before the full diff's verifications, oldest change first.
//! - A pass ends with an [`Action`] or a [`PassError`]; [`Queue::done`], the one error
//!   policy, turns either into a delay, by the policy below. A pod change never waits
//!   for a delay of its key (its registrations' backoff, a retry after a failure):
//!   nothing delays a deregistration. Only a lease another process holds parks a key
//!   until the holder's lease ends or it is handed back ([`Queue::unpark`]); a parked
//!   key holds no slot meanwhile.
//! - It keeps timers, as kube-runtime's scheduler does: the keys ready to start in
//!   order, the waiting ones by their time ([`index`]), so starting a key, waking for
//!   the next time and asking whether a run has work left never look at every key.

use std::collections::HashMap;

use index::{Index, Place};
use std::time::Duration;

use tokio::time::Instant;

use crate::core::{BackoffPolicy, UnixMillis};
use crate::reconcile::{Action, PassError, Reconciled};

mod index;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;
mod want;

pub use want::Want;

/// How soon a gated pod's group is looked at again while its gate waits for a healthy
/// target.
pub const GATE_POLL: Duration = Duration::from_secs(1);

/// A key parked on a lease another process holds comes back this long after the
/// holder's lease would expire (the holder is asked to serve the request meanwhile;
/// a dead one frees the group then).
pub const LEASE_RECHECK_SLACK: Duration = Duration::from_millis(500);

/// How often the leases that park keys are looked at (one batched read of their
/// groups' items): a lease given back ends its keys' wait within this.
pub const LEASE_POLL: Duration = Duration::from_secs(1);

/// Retries of a key whose pass failed before its lease (the state, target health or
/// pods could not be read): from 1 s, doubling, with jitter, to 5 minutes; reset by a
/// pass that gets further. (A failure under the lease is the group's stored backoff:
/// [`PassError::BackingOff`].)
pub const FAILED_RETRY: BackoffPolicy = BackoffPolicy {
    min: Duration::from_secs(1),
    max: Duration::from_secs(300),
};

/// Retries of a namespace's LIST or WATCH that failed: from 800 ms, doubling, with
/// jitter over the upper half, to 30 s (never a tight loop against an API server in
/// trouble; many containers that lost it at once do not come back in step).
pub const WATCH_RETRY: BackoffPolicy = BackoffPolicy {
    min: Duration::from_millis(800),
    max: Duration::from_secs(30),
};

/// The wait before attempt `failures + 1` of a namespace's LIST or WATCH.
pub fn watch_retry(failures: u32) -> Duration {
    WATCH_RETRY.delay(failures.max(1), &mut fastrand::Rng::new())
}

/// What a waiting key waits for.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// Nothing (or the time only: a pass cut short).
    #[default]
    Time,
    /// A lease another process holds: a pod change does not end the wait (the holder
    /// was asked to serve it), only [`Queue::unpark`] or the time.
    Lease,
    /// A gated pod's target to turn healthy.
    Gates,
    /// A retry after a failure before the lease.
    Retry,
    /// The end of the group's backoff (its registrations; its pass ran).
    Backoff,
}

#[derive(Debug, Default)]
struct Slot {
    pending: Option<Want>,
    running: bool,
    not_before: Option<Instant>,
    /// `not_before` has come: the key waits only for room (set by [`Queue::pop`]).
    due: bool,
    /// What `not_before` waits for.
    wait: Wait,
    /// Consecutive passes that failed before the lease.
    failures: u32,
    /// Order of arrival of the pending request (FIFO among equals).
    seq: u64,
    /// Where the index has it.
    placed: Place,
}

impl Slot {
    /// Where the index should have it (see [`Place`]).
    fn place(&self) -> Place {
        let mut place = Place {
            running: self.running,
            parked: self.wait == Wait::Lease && !self.running,
            ..Place::default()
        };
        let Some(want) = self.pending.filter(|_| !self.running) else {
            return place;
        };
        if let Some(at) = self.not_before {
            place.timer = Some((at, self.due));
        }
        if self.not_before.is_none() || self.due {
            place.ready = Some((want.reacts(), (!want.changed, want.since, self.seq)));
        }
        place
    }

    /// Waits until `at` for `wait`.
    fn wait_until(&mut self, at: Instant, wait: Wait) {
        self.not_before = Some(at);
        self.due = false;
        self.wait = wait;
    }

    /// Waits no more.
    fn ready(&mut self) {
        self.not_before = None;
        self.due = false;
        self.wait = Wait::Time;
    }
}

/// The keys, what each waits for, and the index of both.
#[derive(Debug)]
pub struct Queue {
    slots: HashMap<String, Slot>,
    index: Index,
    seq: u64,
    rng: fastrand::Rng,
}

impl Default for Queue {
    fn default() -> Self {
        Self {
            slots: HashMap::new(),
            index: Index::default(),
            seq: 0,
            rng: fastrand::Rng::new(),
        }
    }
}

/// Which passes the runner has room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// Passes for pod changes (and gates).
    pub changes: bool,
    /// Verifications of the full diff.
    pub verifications: bool,
}

/// A moment on both clocks: the monotonic one the queue waits on, and the wall clock
/// the state table's times (a lease's expiry, a backoff's end) are stored in.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// Monotonic.
    pub instant: Instant,
    /// Wall clock (the engine's clock).
    pub wall: UnixMillis,
}

impl Now {
    /// Now, on both clocks (`clock`: the engine's wall clock).
    pub fn of(clock: &dyn crate::clock::Clock) -> Self {
        Self {
            instant: Instant::now(),
            wall: clock.now(),
        }
    }

    /// The monotonic instant of wall time `at` (now, if it has passed).
    fn instant_of(self, at: UnixMillis) -> Instant {
        self.instant + Duration::from_millis(at.0.saturating_sub(self.wall.0))
    }
}

impl Queue {
    /// Asks for a pass of `key`. A pod change ends any wait the key had but a parked
    /// one's.
    pub fn request(&mut self, key: &str, want: Want) {
        self.seq += 1;
        let seq = self.seq;
        let slot = self.slots.entry(key.to_owned()).or_default();
        slot.pending = Some(match slot.pending {
            Some(p) => p.merge(want),
            None => {
                slot.seq = seq;
                want
            }
        });
        if want.changed && slot.wait != Wait::Lease {
            slot.ready();
        }
        self.settle(key);
    }

    /// The next key to start at `now`, and what it is asked to do: a key with a
    /// request, not in flight and not waiting; pod changes first (oldest first), then
    /// verifications (in order of arrival). The key is in flight from now on.
    pub fn pop(&mut self, now: Instant, room: Room) -> Option<(String, Want)> {
        // The keys whose time has come wait for room with the ready ones.
        while let Some((at, key)) = self.index.timer_due(now) {
            if let Some(slot) = self
                .slots
                .get_mut(&key)
                .filter(|s| s.not_before == Some(at))
            {
                slot.due = true;
            }
            self.settle(&key);
        }
        let key = self.index.first_ready(room)?;
        let slot = self.slots.get_mut(&key)?;
        slot.running = true;
        slot.ready();
        let want = slot.pending.take();
        self.settle(&key);
        want.map(|w| (key, w))
    }

    /// `key`'s pass, asked to do `ran`, ended with `result` at `now`: the one delay
    /// and error policy.
    /// - [`Action::Done`]: nothing more (a request made meanwhile runs now).
    /// - [`PassError::Cut`], [`PassError::Deferred`], [`PassError::Yielded`]: again now.
    /// - [`Action::GatesPending`]: again after [`GATE_POLL`].
    /// - [`Action::BackOff`], [`PassError::BackingOff`]: again when the backoff ends; a
    ///   pod change runs now.
    /// - [`PassError::Failed`]: again after [`FAILED_RETRY`]'s delay for the key's
    ///   consecutive failures; a pod change runs now.
    /// - [`Action::LeaseHeld`]: parked until [`LEASE_RECHECK_SLACK`] after the holder's
    ///   lease expires, or until [`Queue::unpark`]; pod changes meanwhile wait with it.
    pub fn done(&mut self, key: &str, ran: Want, result: &Reconciled, now: Now) {
        let Some(slot) = self.slots.get_mut(key) else {
            return;
        };
        slot.running = false;
        slot.failures = if matches!(result, Err(PassError::Failed(_))) {
            slot.failures.saturating_add(1)
        } else {
            0
        };
        let next = match result {
            Err(PassError::Failed(_)) => Some((
                now.instant + FAILED_RETRY.delay(slot.failures, &mut self.rng),
                Wait::Retry,
            )),
            Ok(Action::Done) => None,
            Err(PassError::Cut | PassError::Deferred | PassError::Yielded) => {
                Some((now.instant, Wait::Time))
            }
            Ok(Action::GatesPending) => Some((now.instant + GATE_POLL, Wait::Gates)),
            Ok(Action::BackOff { until }) | Err(PassError::BackingOff { until, .. }) => {
                Some((now.instant_of(*until), Wait::Backoff))
            }
            Ok(Action::LeaseHeld { until }) => Some((
                now.instant_of(until.plus(LEASE_RECHECK_SLACK))
                    .max(now.instant),
                Wait::Lease,
            )),
        };
        if let Some((at, wait)) = next {
            // A pod change asked for meanwhile does not wait, unless for a lease.
            let waits = wait == Wait::Lease || slot.pending.is_none_or(|p| !p.changed);
            // A gate is looked at again; anything else is asked for again as it was.
            let again = match result {
                Ok(Action::GatesPending) => Want::gates(),
                _ => ran,
            };
            slot.pending = Some(match slot.pending {
                Some(p) => p.merge(again),
                None => again,
            });
            if waits {
                slot.wait_until(at, wait);
            }
        }
        self.settle(key);
    }

    /// Ends the wait of `key` parked on a lease (its holder gave it back, or it
    /// expired).
    pub fn unpark(&mut self, key: &str) {
        if let Some(slot) = self.slots.get_mut(key).filter(|s| s.wait == Wait::Lease) {
            slot.ready();
            self.settle(key);
        }
    }

    /// What a look at the lease parking `key` found: gone or expired (`None`): the wait
    /// ends; held until `until` (renewed, or shortened by a holder shutting down): the
    /// key comes back [`LEASE_RECHECK_SLACK`] after that.
    pub fn lease_seen(&mut self, key: &str, until: Option<UnixMillis>, now: Now) {
        match until.filter(|u| *u >= now.wall) {
            None => self.unpark(key),
            Some(until) => {
                if let Some(slot) = self.slots.get_mut(key).filter(|s| s.wait == Wait::Lease) {
                    slot.wait_until(now.instant_of(until.plus(LEASE_RECHECK_SLACK)), Wait::Lease);
                    self.settle(key);
                }
            }
        }
    }

    /// Keys parked on a lease another process holds.
    pub fn parked(&self) -> Vec<String> {
        self.index.parked.iter().cloned().collect()
    }

    /// Whether a key is parked on a lease another process holds.
    pub fn has_parked(&self) -> bool {
        !self.index.parked.is_empty()
    }

    /// The keys with a pod change asked for and not served yet (queued, waiting, or
    /// merged into a pass in flight) — but those whose pass ran and whose
    /// registrations now wait for their backoff: what a run that ends hands on.
    pub fn pending_changes(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .slots
            .iter()
            .filter(|(_, s)| s.pending.is_some_and(|p| p.changed) && s.wait != Wait::Backoff)
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort_unstable();
        keys
    }

    /// The keys with any request not served yet but a look at gates (queued, waiting,
    /// parked on a lease, or merged into a pass in flight): what a one-shot run that
    /// ends hands on.
    pub fn pending_requests(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .slots
            .iter()
            .filter(|(_, s)| s.pending.is_some_and(|p| !p.gates_only()))
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort_unstable();
        keys
    }

    /// What a warm container keeps between invocations: the reactions (pod changes,
    /// gates); a full diff's looks are the next run's discovery's to ask for again.
    pub fn keep_reactions(&mut self) {
        let keys: Vec<String> = self.slots.keys().cloned().collect();
        for key in keys {
            if let Some(slot) = self.slots.get_mut(&key) {
                if let Some(p) = &mut slot.pending {
                    p.verify = false;
                }
                if !slot.running && !slot.pending.is_some_and(Want::reacts) {
                    slot.pending = None;
                }
            }
            self.settle(&key);
        }
    }

    /// Drops `key`'s request (its group is no longer bound), unless its pass is running.
    pub fn forget(&mut self, key: &str) {
        if let Some(slot) = self.slots.get_mut(key).filter(|s| !s.running) {
            slot.pending = None;
            self.settle(key);
        }
    }

    /// Whether a one-shot run has work left: a key in flight or ready, or one that
    /// becomes ready in time — by `leases` when it waits for a lease another process
    /// holds, by `gates` when it waits for a gate. (A one-shot run waits for no
    /// backoff, retry or cut pass: the next run does those.)
    pub fn has_work(&self, leases: Instant, gates: Instant) -> bool {
        self.index.running > 0
            || self.index.ready_now() > 0
            || self.index.waiting_until(leases.max(gates)).any(|(t, key)| {
                match self.slots.get(key).map(|s| s.wait) {
                    Some(Wait::Lease) => t <= leases,
                    Some(Wait::Gates) => t <= gates,
                    _ => false,
                }
            })
    }

    /// The earliest time a waiting key becomes ready (`None`: none waits).
    pub fn next_wake(&self) -> Option<Instant> {
        self.index.next_time()
    }

    /// Keys with a pass in flight.
    pub fn running(&self) -> usize {
        self.index.running
    }

    /// Whether nothing is pending or in flight.
    pub fn is_idle(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether `key` has a pass in flight or a request (for tests and reports).
    pub fn contains(&self, key: &str) -> bool {
        self.slots.contains_key(key)
    }

    /// Brings the index in line with `key`'s slot after a change, and drops the slot
    /// once it asks for nothing and runs nothing.
    fn settle(&mut self, key: &str) {
        let Some(slot) = self.slots.get_mut(key) else {
            return;
        };
        let place = if !slot.running && slot.pending.is_none() {
            Place::default()
        } else {
            slot.place()
        };
        self.index.moved(key, &slot.placed, &place);
        if place == Place::default() {
            self.slots.remove(key);
        } else {
            slot.placed = place;
        }
    }
}
