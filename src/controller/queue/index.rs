//! The queue's timers: the keys ready to start, in the order they start in, per class
//! of the runner's room; the waiting keys by their time; the keys parked on a lease; a
//! count of those in flight. Each key's slot says where it stands ([`Place`]); the
//! queue moves it here on every change, so no question of the runner's scans all keys.

use std::collections::BTreeSet;

use tokio::time::Instant;

use super::Room;
use crate::core::UnixMillis;

/// The order ready keys start in: pod changes first (not changed sorts last), oldest
/// change first, then in order of arrival.
pub(super) type Rank = (bool, Option<UnixMillis>, u64);

/// Where a key stands in the index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Place {
    /// Ready to start (no wait, or its time has come): whether it takes a reaction's
    /// room (else a verification's), and its rank.
    pub ready: Option<(bool, Rank)>,
    /// Waiting until then; `true` once the time has come (it then waits for room).
    pub timer: Option<(Instant, bool)>,
    /// Parked on a lease another process holds.
    pub parked: bool,
    /// Its pass is in flight.
    pub running: bool,
}

/// The keys by where they stand.
#[derive(Debug, Default)]
pub(super) struct Index {
    /// Ready keys taking a reaction's room, in order.
    reactions: BTreeSet<(Rank, String)>,
    /// Ready keys taking a verification's room, in order.
    verifications: BTreeSet<(Rank, String)>,
    /// Waiting keys whose time has not come, by time.
    timers: BTreeSet<(Instant, String)>,
    /// Waiting keys whose time has come (also ready), by time.
    due: BTreeSet<(Instant, String)>,
    /// Keys parked on a lease.
    pub parked: BTreeSet<String>,
    /// Keys in flight.
    pub running: usize,
}

impl Index {
    /// `key` moved from `old` to `new`.
    pub fn moved(&mut self, key: &str, old: &Place, new: &Place) {
        if old == new {
            return;
        }
        if old.ready != new.ready {
            if let Some((reacts, rank)) = old.ready {
                self.lane(reacts).remove(&(rank, key.to_owned()));
            }
            if let Some((reacts, rank)) = new.ready {
                self.lane(reacts).insert((rank, key.to_owned()));
            }
        }
        if old.timer != new.timer {
            if let Some((at, due)) = old.timer {
                self.timers_of(due).remove(&(at, key.to_owned()));
            }
            if let Some((at, due)) = new.timer {
                self.timers_of(due).insert((at, key.to_owned()));
            }
        }
        if old.parked != new.parked {
            if new.parked {
                self.parked.insert(key.to_owned());
            } else {
                self.parked.remove(key);
            }
        }
        match (old.running, new.running) {
            (false, true) => self.running += 1,
            (true, false) => self.running = self.running.saturating_sub(1),
            _ => {}
        }
    }

    fn lane(&mut self, reacts: bool) -> &mut BTreeSet<(Rank, String)> {
        if reacts {
            &mut self.reactions
        } else {
            &mut self.verifications
        }
    }

    fn timers_of(&mut self, due: bool) -> &mut BTreeSet<(Instant, String)> {
        if due { &mut self.due } else { &mut self.timers }
    }

    /// The earliest waiting key whose time has come by `now`, taken off the timers.
    pub fn timer_due(&mut self, now: Instant) -> Option<(Instant, String)> {
        if self.timers.first().is_some_and(|(at, _)| *at <= now) {
            self.timers.pop_first()
        } else {
            None
        }
    }

    /// The first ready key of the classes `room` has room for.
    pub fn first_ready(&self, room: Room) -> Option<String> {
        let reaction = self.reactions.first().filter(|_| room.changes);
        let verification = self.verifications.first().filter(|_| room.verifications);
        [reaction, verification]
            .into_iter()
            .flatten()
            .min()
            .map(|(_, key)| key.clone())
    }

    /// Ready keys that never waited (or waited no more): those ready but not due.
    pub fn ready_now(&self) -> usize {
        (self.reactions.len() + self.verifications.len()).saturating_sub(self.due.len())
    }

    /// The waiting keys (due or not) whose time is `until` or earlier.
    pub fn waiting_until(&self, until: Instant) -> impl Iterator<Item = (Instant, &str)> {
        let within = move |(at, _): &&(Instant, String)| *at <= until;
        self.due
            .iter()
            .take_while(within)
            .chain(self.timers.iter().take_while(within))
            .map(|(at, key)| (*at, key.as_str()))
    }

    /// The earliest time a waiting key has (come or to come).
    pub fn next_time(&self) -> Option<Instant> {
        [self.due.first(), self.timers.first()]
            .into_iter()
            .flatten()
            .map(|(at, _)| *at)
            .min()
    }

    /// Every key the index holds, by where it stands (tests: the slots must agree).
    #[cfg(test)]
    pub fn places(&self) -> std::collections::BTreeMap<String, Place> {
        let mut places: std::collections::BTreeMap<String, Place> = Default::default();
        for (reacts, lane) in [(true, &self.reactions), (false, &self.verifications)] {
            for (rank, key) in lane {
                places.entry(key.clone()).or_default().ready = Some((reacts, *rank));
            }
        }
        for (due, timers) in [(false, &self.timers), (true, &self.due)] {
            for (at, key) in timers {
                places.entry(key.clone()).or_default().timer = Some((*at, due));
            }
        }
        for key in &self.parked {
            places.entry(key.clone()).or_default().parked = true;
        }
        places
    }
}
