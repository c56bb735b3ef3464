//! The full diff's read-ahead of the state table: the groups it is about to look at are
//! read in batches (BatchGetItem) instead of one GetItem each, whole or as glances (the
//! items without their ledgers).
//!
//! At rest a look is decided by the group's item alone (its checkpoint, lease and
//! `dirty` flag), so per-group reads were most of a zero-drift run's requests: 1,000
//! a run at 1,000 groups, each paying its own signing, round trip and decoding. Most of
//! an item is its ledger (~120 bytes a target), which a look at rest never reads: a
//! glance brings a few hundred bytes a group. A look whose glance does not find its
//! group at rest reads the group whole, alone (see [`super::observe`]), so batches
//! glance while most looks end at rest and read whole while most go on (a first run, a
//! rollout): each look reports which with [`ReadAhead::settled`].
//!
//! The look is lease-less and the leased pass reads everything afresh before it acts. A
//! state read ahead is used only while at most [`MAX_AGE`] old: a change another process
//! made within those seconds (a lease taken, `dirty` set) is then seen by the next run,
//! as it would have been had the look come those seconds earlier. A group whose
//! read-ahead is older, failed or was left unprocessed is read alone, as before.
//!
//! A batch holds as many groups as the looks come for in [`MAX_AGE`]` / 2` at the pace
//! they came since the last batch (16 until that is known), at most 100 (BatchGetItem's
//! limit) and, read whole, at most about [`BATCH_BYTES`] of items: groups at rest are
//! read 100 at a time, groups whose looks wait for paced Describes a few at a time, so
//! that little is read twice.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::core::UnixMillis;
use crate::state::{Glance, GroupState, StateStore};
use crate::sync::lock;

/// How old a read-ahead state may be to stand for the look's own read.
pub(crate) const MAX_AGE: std::time::Duration = std::time::Duration::from_secs(5);

/// Groups per batch at most (BatchGetItem's limit).
const BATCH: usize = 100;

/// Groups in the first two batches, before the looks' pace and the items' size are
/// known: as many as the looks a run starts at once (the engine's default concurrency).
/// (The first batch's looks all start together, so the pace is measured on the second.)
const FIRST_BATCH: usize = 16;

/// About how many bytes of whole items one batch may bring: a group's item is ~120 bytes
/// a target, so a batch of 100 groups of 100 targets is ~1.2 MB, while groups of 3,000
/// targets (items near DynamoDB's 400 KB) are read 5 at a time, which keeps a 256-MB
/// function's decoded batch small. (Glances are a few hundred bytes whatever the size.)
const BATCH_BYTES: usize = 2 << 20;

/// Estimated bytes of a group's item as read: its fixed attributes and, read whole,
/// ~120 bytes a target.
fn item_bytes(read: &Ahead) -> usize {
    match read {
        Ahead::Glance(_) => 200,
        Ahead::Whole(state) => 200 + 120 * state.ledger.len(),
    }
}

/// A group's state as read ahead.
#[derive(Debug)]
pub(crate) enum Ahead {
    /// Its item without the ledger: enough for a look that finds the group at rest.
    Glance(Glance),
    /// Its item whole.
    Whole(GroupState),
}

/// The groups a full diff will look at, in the order it looks at them, and the states
/// read ahead for them.
#[derive(Debug)]
pub(crate) struct ReadAhead {
    inner: std::sync::Mutex<Inner>,
    /// One batch read at a time: the looks that need the batch being read wait for it.
    reading: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct Inner {
    order: Vec<String>,
    /// The groups of `order`.
    members: HashSet<String>,
    /// The first group of `order` not read yet.
    next: usize,
    /// Groups read ahead already (or being read): never read ahead twice.
    read: HashSet<String>,
    /// States read ahead and not taken yet, with when they were read.
    states: HashMap<String, (Ahead, UnixMillis)>,
    /// Whether the next batch glances (its groups' looks are expected to end at rest)
    /// or reads whole items (they are expected to need their ledgers).
    whole: bool,
    /// Looks served from the read-ahead since the last batch was read: how many ended
    /// at rest, and how many went on and needed the ledger.
    settled: (usize, usize),
    /// Groups a whole batch may hold for the size of the items the last one brought.
    by_bytes: usize,
    /// Batches read so far.
    batches: usize,
    /// When the last batch was read, and how many looks at groups of the order came
    /// since.
    last: Option<(UnixMillis, usize)>,
    /// A batch failed: the rest of the full diff reads each group alone (a role without
    /// BatchGetItem, a throttled table), reported once.
    failed: bool,
}

impl Inner {
    /// Whether the next batch reads whole items: when most of the looks the read-ahead
    /// served since the last batch needed their ledgers (a first run, a rollout), as the
    /// last batch did when none reported. A glance that does not end its look costs the
    /// look a read of its own; a whole item read for a group at rest, ~120 bytes a
    /// target decoded for nothing.
    fn next_is_whole(&mut self) -> bool {
        let (at_rest, moving) = std::mem::take(&mut self.settled);
        if at_rest + moving > 0 {
            self.whole = moving > at_rest;
        }
        self.whole
    }

    /// Groups for the next batch at `now`.
    fn batch_size(&self, now: UnixMillis) -> usize {
        let by_pace = match self.last {
            Some((at, looks)) if self.batches >= 2 => {
                let elapsed = now.0.saturating_sub(at.0).max(1);
                let window = MAX_AGE.as_millis() as u64 / 2;
                usize::try_from(looks as u64 * window / elapsed).unwrap_or(BATCH)
            }
            _ => FIRST_BATCH,
        };
        let by_bytes = if self.whole { self.by_bytes } else { BATCH };
        by_pace.min(by_bytes).clamp(1, BATCH)
    }
}

impl ReadAhead {
    /// A read-ahead for a full diff's looks at the groups of `order` (the order they
    /// start), but for the groups due for re-verification (each reads its health,
    /// paced, whatever its state). Batches read whole from the start when no look can
    /// end at rest (the run does not `use_checkpoint`) or when most groups are not among
    /// the run's `indexed` groups (adding one to the index depends on its ledger).
    pub(crate) fn for_looks<'a>(
        order: impl IntoIterator<Item = &'a str>,
        due: Option<&HashSet<String>>,
        indexed: Option<&BTreeSet<String>>,
        use_checkpoint: bool,
    ) -> Self {
        let order: Vec<String> = order
            .into_iter()
            .filter(|arn| due.is_none_or(|d| !d.contains(*arn)))
            .map(str::to_owned)
            .collect();
        let unindexed = indexed.map_or(0, |i| order.iter().filter(|a| !i.contains(*a)).count());
        let whole = !use_checkpoint || unindexed * 2 > order.len();
        Self::new(order, whole)
    }

    /// A read-ahead of the groups in `order` (the order they will be looked at), whose
    /// first batch reads `whole` items or glances.
    fn new(order: Vec<String>, whole: bool) -> Self {
        Self {
            inner: std::sync::Mutex::new(Inner {
                members: order.iter().cloned().collect(),
                order,
                whole,
                by_bytes: BATCH,
                ..Inner::default()
            }),
            reading: tokio::sync::Mutex::new(()),
        }
    }

    /// `group`'s state as read ahead, reading it with the next groups of the order
    /// when it was not read yet; `None` when its look must read it alone (it is not in
    /// the order, its state was read too long ago, or the batch failed or left it out).
    /// The look reports with [`Self::settled`] whether it ended at rest.
    pub(crate) async fn take<S: StateStore>(
        &self,
        store: &S,
        group: &str,
        clock: &dyn crate::clock::Clock,
    ) -> Option<Ahead> {
        {
            let mut inner = lock(&self.inner);
            if inner.failed || !inner.members.contains(group) {
                return None;
            }
            // The looks' pace: every look at a group of the order counts, served or not.
            if let Some((_, looks)) = inner.last.as_mut() {
                *looks += 1;
            }
        }
        if let Some(taken) = self.read_ahead(group, clock.now()) {
            return taken;
        }
        // Not read yet, or in the batch being read: batches are read under the turn.
        let _turn = self.reading.lock().await;
        if let Some(taken) = self.taken(group, clock.now()) {
            return taken;
        }
        let at = clock.now();
        let (batch, whole) = self.next_batch(group, at);
        let read: Result<Vec<(String, Ahead)>, _> = if whole {
            let states = store.load_many(&batch).await;
            states.map(|s| s.into_iter().map(|(g, s)| (g, Ahead::Whole(s))).collect())
        } else {
            let glances = store.glance_many(&batch).await;
            glances.map(|s| s.into_iter().map(|(g, s)| (g, Ahead::Glance(s))).collect())
        };
        match read {
            Ok(states) => {
                let mut inner = lock(&self.inner);
                if whole && !states.is_empty() {
                    let bytes: usize = states.iter().map(|(_, s)| item_bytes(s)).sum();
                    let mean = bytes / states.len();
                    inner.by_bytes = (BATCH_BYTES / mean.max(1)).clamp(1, BATCH);
                }
                let fresh = at.0.saturating_sub(MAX_AGE.as_millis() as u64);
                inner.states.retain(|_, (_, read)| read.0 >= fresh);
                inner
                    .states
                    .extend(states.into_iter().map(|(g, s)| (g, (s, at))));
                inner.batches += 1;
                inner.last = Some((at, 0));
            }
            Err(e) => {
                lock(&self.inner).failed = true;
                tracing::warn!(error = %e, groups = batch.len(), "reading the groups' states ahead (BatchGetItem) failed; this run reads them one by one (does the role allow dynamodb:BatchGetItem?)");
            }
        }
        self.taken(group, clock.now()).flatten()
    }

    /// Reports whether a look served from the read-ahead ended at rest with no need of
    /// its group's ledger (`true`: a glance would do), or needed the ledger: what the
    /// next batch reads.
    pub(crate) fn settled(&self, at_rest: bool) {
        let mut inner = lock(&self.inner);
        if at_rest {
            inner.settled.0 += 1;
        } else {
            inner.settled.1 += 1;
        }
    }

    /// `Some(Some(state))`: read ahead and fresh (taken out); `Some(None)`: read ahead
    /// too long ago, so read it alone; `None`: no state read ahead for it.
    #[allow(clippy::option_option)]
    fn read_ahead(&self, group: &str, now: UnixMillis) -> Option<Option<Ahead>> {
        let (state, at) = lock(&self.inner).states.remove(group)?;
        let fresh = now.0.saturating_sub(at.0) <= MAX_AGE.as_millis() as u64;
        Some(fresh.then_some(state))
    }

    /// As [`Self::read_ahead`], and `Some(None)` too for a group a batch read already
    /// (or left out): called with the turn held, so no batch is in flight.
    #[allow(clippy::option_option)]
    fn taken(&self, group: &str, now: UnixMillis) -> Option<Option<Ahead>> {
        self.read_ahead(group, now)
            .or_else(|| lock(&self.inner).read.contains(group).then_some(None))
    }

    /// `group` and the next groups of the order not read yet, up to a batch, marked
    /// read, and whether the batch reads them whole.
    fn next_batch(&self, group: &str, now: UnixMillis) -> (Vec<String>, bool) {
        let mut inner = lock(&self.inner);
        let whole = inner.next_is_whole();
        let size = inner.batch_size(now);
        let mut batch = vec![group.to_owned()];
        inner.read.insert(group.to_owned());
        while batch.len() < size && inner.next < inner.order.len() {
            let candidate = inner.order[inner.next].clone();
            inner.next += 1;
            if inner.read.insert(candidate.clone()) {
                batch.push(candidate);
            }
        }
        (batch, whole)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::fakes::FakeState;

    fn groups(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("g{i}")).collect()
    }

    fn version(ahead: &Ahead) -> u64 {
        match ahead {
            Ahead::Glance(g) => g.version,
            Ahead::Whole(s) => s.version,
        }
    }

    /// `n` groups with stored states (group `gi` at version `i + 1`), a read-ahead over
    /// them in order, and a clock.
    fn world(n: usize) -> (FakeState, ManualClock, ReadAhead) {
        let store = FakeState::default();
        for (i, g) in groups(n).iter().enumerate() {
            store.put(
                g,
                GroupState {
                    version: i as u64 + 1,
                    ..GroupState::default()
                },
            );
        }
        (
            store,
            ManualClock::new(UnixMillis(1_000)),
            ReadAhead::new(groups(n), false),
        )
    }

    #[tokio::test]
    async fn groups_looked_at_in_order_cost_one_batch_per_hundred_and_no_read_of_their_own() {
        let (store, clock, ahead) = world(216);
        for (i, g) in groups(216).iter().enumerate() {
            let state = ahead.take(&store, g, &clock).await;
            assert_eq!(state.map(|s| version(&s)), Some(i as u64 + 1), "{g}");
        }
        assert_eq!(
            store.batch_reads(),
            4,
            "16 and 16, then 100 and the last 84"
        );
        assert_eq!(store.calls(), (0, 0), "no write, no read of one group");
    }

    #[tokio::test]
    async fn looks_that_wait_for_paced_describes_get_small_batches() {
        let (store, clock, ahead) = world(60);
        // One look every 250 ms (a Describe pace of 4 a second).
        for g in groups(60) {
            assert!(ahead.take(&store, &g, &clock).await.is_some(), "{g}");
            clock.advance(250);
        }
        // 16, 16, then 2.5 s at 4 a second: 10 at a time.
        assert_eq!(store.batch_reads(), 5, "16, 16, 10, 10, 8");
    }

    /// Takes `groups` in order, each look reporting `at_rest`; whether each was served
    /// whole (`None`: read alone).
    async fn looks(
        store: &FakeState,
        clock: &ManualClock,
        ahead: &ReadAhead,
        groups: &[String],
        at_rest: bool,
    ) -> Vec<Option<bool>> {
        let mut served = Vec::new();
        for g in groups {
            let taken = ahead.take(store, g, clock).await;
            if taken.is_some() {
                ahead.settled(at_rest);
            }
            served.push(taken.map(|a| matches!(a, Ahead::Whole(_))));
        }
        served
    }

    #[tokio::test]
    async fn batches_glance_while_looks_end_at_rest_and_read_whole_while_they_need_ledgers() {
        let (store, clock, ahead) = world(200);
        let all = groups(200);
        // A first run: no group at rest. The first batch glances (nothing known yet),
        // and since its looks needed their ledgers the next ones read whole.
        let served = looks(&store, &clock, &ahead, &all[..32], false).await;
        assert_eq!(served[..16], [Some(false); 16], "glanced at");
        assert_eq!(served[16..], [Some(true); 16], "read whole");
        // Groups at rest again: after one more whole batch (of 100: the looks come at
        // once) served them, batches glance.
        let served = looks(&store, &clock, &ahead, &all[32..], true).await;
        assert_eq!(served[..100], [Some(true); 100], "read whole");
        assert_eq!(served[100..], [Some(false); 68], "glanced at");
        assert_eq!((store.batch_reads(), store.glance_batches()), (4, 2));
        assert_eq!(store.calls(), (0, 0), "no write, no read of one group");
    }

    #[tokio::test]
    async fn groups_of_large_items_are_read_whole_fewer_at_a_time() {
        let (store, clock) = (FakeState::default(), ManualClock::new(UnixMillis(1_000)));
        // 3,000 targets: an item of ~360 KB, near DynamoDB's 400 KB.
        let ledger: std::collections::BTreeMap<_, _> = (0..3_000u32)
            .map(|i| {
                let target = crate::core::Target::new(
                    std::net::Ipv4Addr::from(0x0a00_0000 + i).into(),
                    8080,
                );
                let entry = crate::state::LedgerEntry {
                    target,
                    pod: crate::core::PodRef {
                        namespace: "shop".into(),
                        name: format!("web-{i}"),
                        uid: format!("uid-{i}"),
                    },
                    cluster: "demo".into(),
                    registered_at: UnixMillis(1),
                    deregistered_at: None,
                };
                (target, entry)
            })
            .collect();
        for g in groups(60) {
            store.put(
                &g,
                GroupState {
                    ledger: ledger.clone(),
                    ..GroupState::default()
                },
            );
        }
        let ahead = ReadAhead::new(groups(60), false);
        let served = looks(&store, &clock, &ahead, &groups(60), false).await;
        assert!(served.iter().all(Option::is_some));
        // Glances (16, whatever the items' size), then whole: 16 (no size known yet),
        // then 2 MB / ~360 KB = 5 at a time.
        assert_eq!((store.batch_reads(), store.glance_batches()), (2 + 6, 1));
        assert_eq!(lock(&ahead.inner).by_bytes, 5);
    }

    #[tokio::test]
    async fn a_state_read_too_long_ago_is_not_used() {
        let (store, clock, ahead) = world(3);
        assert!(ahead.take(&store, "g0", &clock).await.is_some());
        clock.advance(MAX_AGE.as_millis() as u64 + 1);
        assert!(
            ahead.take(&store, "g1", &clock).await.is_none(),
            "read alone: its read-ahead is stale"
        );
        assert!(
            ahead.take(&store, "g1", &clock).await.is_none(),
            "and never read ahead again"
        );
        assert_eq!(store.batch_reads(), 1);
    }

    #[tokio::test]
    async fn a_group_out_of_order_starts_a_batch_with_the_next_ones() {
        let (store, clock, ahead) = world(150);
        assert_eq!(
            ahead
                .take(&store, "g120", &clock)
                .await
                .map(|s| version(&s)),
            Some(121)
        );
        // The first batch was g120 and g0..g14.
        for g in ["g0", "g14"] {
            assert!(ahead.take(&store, g, &clock).await.is_some(), "{g}");
        }
        assert_eq!(store.batch_reads(), 1);
        for g in groups(150)
            .iter()
            .filter(|g| !["g0", "g14", "g120"].contains(&g.as_str()))
        {
            assert!(ahead.take(&store, g, &clock).await.is_some(), "{g}");
        }
        assert!(
            ahead.take(&store, "g120", &clock).await.is_none(),
            "taken once"
        );
        assert!(
            ahead.take(&store, "g150", &clock).await.is_none(),
            "not in the order: read alone"
        );
        assert_eq!(store.batch_reads(), 4, "16, 16, 100, 18");
    }

    #[tokio::test]
    async fn groups_a_batch_leaves_out_still_pace_the_next_batches() {
        let (store, clock, ahead) = world(100);
        // Every group left out (their items must be upgraded by a read alone).
        store.leave_out_of_batches(true);
        for g in groups(100) {
            assert!(ahead.take(&store, &g, &clock).await.is_none(), "{g}");
        }
        // The looks came at once, served by a batch or not: 16, 16, then the 68 left.
        assert_eq!(store.batch_reads(), 3);
    }

    #[tokio::test]
    async fn a_failed_batch_leaves_each_group_to_its_own_read() {
        let (store, clock, ahead) = world(40);
        store.set_failing_batches(true);
        for g in groups(40) {
            assert!(ahead.take(&store, &g, &clock).await.is_none(), "{g}");
        }
        assert_eq!(
            store.batch_reads(),
            1,
            "one failed batch, not one per batch"
        );
    }

    #[tokio::test]
    async fn looks_that_start_while_their_batch_is_read_wait_for_it() {
        let (store, clock, ahead) = world(16);
        // The batch takes real time, so the other looks start while it is in flight.
        store.slow_reads(&clock, 1);
        let looks = groups(16);
        let first = ahead.take(&store, "g0", &clock);
        let mut first = std::pin::pin!(first);
        assert!(
            futures::poll!(first.as_mut()).is_pending(),
            "the batch is in flight"
        );
        assert_eq!(store.batch_reads(), 0, "counted when it is answered");
        let rest =
            futures::future::join_all(looks[1..].iter().map(|g| ahead.take(&store, g, &clock)));
        let (first, rest) = futures::join!(first, rest);
        assert!(first.is_some() && rest.iter().all(Option::is_some));
        assert_eq!(store.batch_reads(), 1);
        assert_eq!(store.calls(), (0, 0), "no group read alone");
    }
}
