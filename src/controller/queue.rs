//! The work queue: one key per target group, as kube-runtime's scheduler and runner
//! keep them. Pure data, no I/O: the runner asks it what to start and tells it what
//! ended.
//!
//! - A key is in flight at most once; a key requested while its pass runs is run again
//!   right after (the request waits, merged, until then).
//! - Requests merge: a pod change and the schedule's full diff of the same group are one
//!   pass that does both.
//! - A key can wait until a time (its registrations back off, another process holds its
//!   lease); a pod change never waits — nothing delays a deregistration.
//! - Pod changes go before the full diff's verifications, oldest change first.

use std::collections::HashMap;

use crate::core::UnixMillis;

/// What a group's next pass is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Want {
    /// Its pods changed (or may have): reconcile it now, whatever its checkpoint says.
    pub changed: bool,
    /// The schedule's full diff: look at it, verifying target health within the
    /// Describe budget.
    pub verify: bool,
    /// When the oldest pod change behind this request was seen (reaction latency).
    pub since: Option<UnixMillis>,
}

impl Want {
    /// A pod change seen at `at`.
    pub fn change(at: UnixMillis) -> Self {
        Self {
            changed: true,
            verify: false,
            since: Some(at),
        }
    }

    /// The full diff's look at a group.
    pub fn verify() -> Self {
        Self {
            changed: false,
            verify: true,
            since: None,
        }
    }

    fn merge(self, other: Self) -> Self {
        Self {
            changed: self.changed || other.changed,
            verify: self.verify || other.verify,
            since: match (self.since, other.since) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    pending: Option<Want>,
    running: bool,
    not_before: Option<UnixMillis>,
    /// Order of arrival of the pending request (FIFO among equals).
    seq: u64,
}

/// The keys and what each waits for.
#[derive(Debug, Default)]
pub struct Queue {
    slots: HashMap<String, Slot>,
    seq: u64,
}

/// Which passes the runner has room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// Passes for pod changes.
    pub changes: bool,
    /// Verifications of the full diff.
    pub verifications: bool,
}

impl Queue {
    /// Asks for a pass of `key`. A pod change clears any wait the key had.
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
        if want.changed {
            slot.not_before = None;
        }
    }

    /// The next key to start at `now`, and what it is asked to do: a key with a
    /// request, not in flight and not waiting; pod changes first (oldest first), then
    /// verifications (in order of arrival). The key is in flight from now on.
    pub fn pop(&mut self, now: UnixMillis, room: Room) -> Option<(String, Want)> {
        let key = self
            .slots
            .iter()
            .filter(|(_, s)| !s.running && s.not_before.is_none_or(|t| t <= now))
            .filter_map(|(k, s)| Some((k, s, s.pending?)))
            .filter(|(_, _, w)| {
                if w.changed {
                    room.changes
                } else {
                    room.verifications
                }
            })
            .min_by_key(|(k, s, w)| (!w.changed, w.since, s.seq, k.as_str()))
            .map(|(k, _, _)| k.clone())?;
        let slot = self.slots.get_mut(&key)?;
        slot.running = true;
        slot.not_before = None;
        slot.pending.take().map(|w| (key, w))
    }

    /// `key`'s pass ended. With `retry`, the same request comes back at that time
    /// (merged with any request made meanwhile, which does not wait unless it is only
    /// a verification).
    pub fn done(&mut self, key: &str, retry: Option<(UnixMillis, Want)>) {
        let Some(slot) = self.slots.get_mut(key) else {
            return;
        };
        slot.running = false;
        if let Some((at, want)) = retry {
            let waits = slot.pending.is_none_or(|p| !p.changed);
            slot.pending = Some(match slot.pending {
                Some(p) => p.merge(want),
                None => want,
            });
            if waits {
                slot.not_before = Some(at);
            }
        }
        if slot.pending.is_none() {
            self.slots.remove(key);
        }
    }

    /// Drops `key`'s request (its group is no longer bound), unless its pass is running.
    pub fn forget(&mut self, key: &str) {
        if self.slots.get(key).is_some_and(|s| !s.running) {
            self.slots.remove(key);
        }
    }

    /// The earliest time a waiting key becomes ready (`None`: none waits).
    pub fn next_wake(&self) -> Option<UnixMillis> {
        self.slots
            .values()
            .filter(|s| !s.running && s.pending.is_some())
            .filter_map(|s| s.not_before)
            .min()
    }

    /// Keys with a pass in flight.
    pub fn running(&self) -> usize {
        self.slots.values().filter(|s| s.running).count()
    }

    /// Whether nothing is pending or in flight.
    pub fn is_idle(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether `key` has a pass in flight or a request (for tests and reports).
    pub fn contains(&self, key: &str) -> bool {
        self.slots.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: Room = Room {
        changes: true,
        verifications: true,
    };

    fn at(ms: u64) -> UnixMillis {
        UnixMillis(ms)
    }

    #[test]
    fn one_pass_per_key_and_a_change_during_it_runs_it_again() {
        let mut q = Queue::default();
        q.request("a", Want::change(at(1)));
        let (k, w) = q.pop(at(1), ALL).unwrap();
        assert_eq!((k.as_str(), w.changed), ("a", true));
        // Changed again while in flight: not started twice.
        q.request("a", Want::change(at(2)));
        assert_eq!(q.pop(at(2), ALL), None);
        q.done("a", None);
        let (k, w) = q.pop(at(3), ALL).unwrap();
        assert_eq!((k.as_str(), w.since), ("a", Some(at(2))));
        q.done("a", None);
        assert!(q.is_idle());
    }

    #[test]
    fn requests_merge_and_changes_go_first_oldest_first() {
        let mut q = Queue::default();
        q.request("v", Want::verify());
        q.request("b", Want::change(at(5)));
        q.request("a", Want::change(at(3)));
        q.request("b", Want::verify());
        let order: Vec<(String, Want)> = std::iter::from_fn(|| q.pop(at(9), ALL)).collect();
        assert_eq!(order[0].0, "a");
        assert_eq!(order[1].0, "b");
        assert!(order[1].1.changed && order[1].1.verify, "merged");
        assert_eq!(order[2].0, "v");
    }

    #[test]
    fn a_waiting_key_waits_but_a_pod_change_does_not() {
        let mut q = Queue::default();
        q.request("a", Want::verify());
        let (_, w) = q.pop(at(0), ALL).unwrap();
        // Its registrations back off until 100.
        q.done("a", Some((at(100), w)));
        assert_eq!(q.pop(at(50), ALL), None);
        assert_eq!(q.next_wake(), Some(at(100)));
        assert!(q.pop(at(100), ALL).is_some());
        q.done("a", Some((at(200), Want::verify())));
        // A pod changes meanwhile (a deregistration may be due): now.
        q.request("a", Want::change(at(60)));
        assert!(q.pop(at(61), ALL).is_some());
    }

    #[test]
    fn a_change_made_while_the_pass_runs_is_not_held_by_its_retry() {
        let mut q = Queue::default();
        q.request("a", Want::change(at(1)));
        let (_, w) = q.pop(at(1), ALL).unwrap();
        q.request("a", Want::change(at(2)));
        q.done("a", Some((at(1_000), w)));
        assert!(q.pop(at(3), ALL).is_some(), "the newer change runs now");
    }

    #[test]
    fn room_is_per_class() {
        let mut q = Queue::default();
        q.request("v", Want::verify());
        q.request("c", Want::change(at(1)));
        let only_verify = Room {
            changes: false,
            verifications: true,
        };
        assert_eq!(q.pop(at(2), only_verify).unwrap().0, "v");
        let none = Room {
            changes: false,
            verifications: false,
        };
        assert_eq!(q.pop(at(2), none), None);
        assert_eq!(q.running(), 1);
        q.forget("c");
        assert!(!q.contains("c"));
    }
}
