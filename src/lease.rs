//! The lease protocol, in one place: take a group's lease (or wait for the holder to
//! serve our change, or take over from a dead one), keep it alive with a heartbeat while
//! passes run, fence every write, and end it through one exit.
//!
//! The lease is short ([`Timings::duration`], 15 s) and renewed every
//! [`Timings::renew_every`] (5 s) while work goes on — the seeds' workqueue and DynamoDB
//! lock designs — so a holder that dies (SIGKILL, a Lambda timeout) blocks its group for
//! at most one lease duration. A holder that cannot renew stops before its next write:
//! [`Lease::check`] before every ELBv2 call, and the state table's fencing condition on
//! every ledger write.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::Clock;
use crate::core::UnixMillis;
use crate::core::lease_protocol as protocol;
use crate::groups::Fence;
use crate::state::{Acquire, Change, GroupState, Release, StateError, StateStore};

pub use crate::core::lease_protocol::Timings;

/// While a renewal is due and unanswered, another attempt starts this often.
pub const RENEW_RETRY: Duration = Duration::from_millis(1000);

/// Renewal attempts in flight at once (a slow answer still counts when it comes).
const RENEW_IN_FLIGHT: usize = 3;

/// Why no lease was taken: another process holds it until `until` (its stored expiry
/// plus the takeover grace: when a waiter may take it over), and was
/// asked to run again (its `dirty` flag is set): a live holder serves the request; a dead
/// one's lease expires then. The caller's queue parks the request until the lease ends
/// or is given back, without holding a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    /// The holder.
    pub owner: String,
    /// When its lease may be taken over: the stored expiry plus the takeover grace.
    pub until: UnixMillis,
}

/// What [`take`] got.
pub enum Taken<'a, S> {
    /// The lease, and the group's state as of taking it.
    Held(Box<Lease<'a, S>>, GroupState),
    /// No lease.
    Busy(Busy),
}

/// How a pass under the lease ended.
#[derive(Debug)]
pub enum PassEnd {
    /// Done: write `change` and release (or run again if asked).
    Done(Change),
    /// Give the group up after writing `change`, leaving any pending request for the
    /// next run (failed, backing off, out of time). The pass completed: it served every
    /// request made before it started.
    GiveUp(Change),
    /// The pass was cut before it completed (the run's time is up, shutdown, the lease
    /// in trouble): write `change` (what was done so far), give the lease up and ask for
    /// another pass (`dirty`), leaving no checkpoint.
    Cut(Change),
    /// Stop dead without writing anything or releasing (an injected crash; tests).
    Abort,
}

/// How [`Lease::run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// Released cleanly.
    Released,
    /// Given up (see [`PassEnd::GiveUp`]) or out of passes.
    GivenUp,
    /// The lease was lost on the way; the new holder is responsible.
    Lost,
    /// A pass was cut (see [`PassEnd::Cut`]); another pass was asked for.
    Cut,
    /// Stopped dead (tests).
    Aborted,
}

/// A held lease. Dropping it without [`Lease::run`] leaves it to expire, as a crash would.
pub struct Lease<'a, S> {
    store: &'a S,
    clock: &'a dyn Clock,
    group: String,
    owner: String,
    timings: Timings,
    until: AtomicU64,
    /// The holder's own view of its lease's end, on the monotonic clock (from before
    /// the request that last extended it was sent): a wall clock that steps back never
    /// extends it.
    deadline: std::sync::Mutex<tokio::time::Instant>,
    /// The origin of the monotonic times the protocol's fence decides with (the
    /// take's sending).
    origin: tokio::time::Instant,
    lost: AtomicBool,
    /// Set by [`Lease::hand_over`] (the process is shutting down).
    handed_over: AtomicBool,
    /// An ELBv2 attempt under the lease was abandoned without an answer and may still
    /// land ([`Fence::abandoned`]): the lease is then given back ending now, never
    /// deleted, so the next holder waits the takeover grace.
    in_doubt: AtomicBool,
    /// The item's version as of the holder's last write (or taking): every write is
    /// conditional on it.
    version: AtomicU64,
    /// Signalled by the heartbeat on every renewal (or loss), for [`Lease::ready`].
    renewed: tokio::sync::Notify,
    /// Signalled by [`Lease::ready`] to have the heartbeat renew at once.
    renew_now: tokio::sync::Notify,
}

/// What a write made without the lease (a verification, the index's retirement) passes
/// as the time a lease must have expired before to count as free at `now`: one takeover
/// grace before it, as a waiter takes it over (an ELBv2 attempt of its holder may land
/// until then).
pub fn expired_before(now: UnixMillis, timings: &Timings) -> UnixMillis {
    UnixMillis(protocol::expired_before(now.0, timings))
}

/// A lease owner id: the function, the cluster and a random part
/// (`pod-events@prod#0123456789abcdef`).
pub fn owner_id(function: &str, cluster: &str, random: u64) -> String {
    format!("{function}@{cluster}#{random:016x}")
}

/// The cluster named in an owner id (`None` for ids of other shapes).
pub fn cluster_of(owner: &str) -> Option<&str> {
    owner.split_once('@')?.1.rsplit_once('#').map(|(c, _)| c)
}

/// Takes `group`'s lease for `owner` if it is free, expired, or already `owner`'s (see
/// [`StateStore::acquire`]); otherwise the holder is asked to run again (`dirty`) and
/// this returns [`Taken::Busy`] at once: nobody waits here for another holder. (A holder
/// of another cluster, of a group shared by clusters, cannot serve our pods: its lease
/// only delays the request until it ends.)
pub async fn take<'a, S: StateStore>(
    store: &'a S,
    clock: &'a dyn Clock,
    group: &str,
    owner: String,
    timings: Timings,
) -> Result<Taken<'a, S>, StateError> {
    let now = clock.now();
    let sent = tokio::time::Instant::now();
    // Another holder's lease is taken over only a grace after its expiry.
    let (expired_before, until) = protocol::take_times(now.0, &timings);
    let (expired_before, until) = (UnixMillis(expired_before), UnixMillis(until));
    match store.acquire(group, &owner, expired_before, until).await? {
        Acquire::Acquired(state) => {
            let lease = Lease {
                store,
                clock,
                group: group.to_owned(),
                owner,
                timings,
                until: AtomicU64::new(until.0),
                deadline: std::sync::Mutex::new(sent + timings.duration),
                origin: sent,
                lost: AtomicBool::new(false),
                handed_over: AtomicBool::new(false),
                in_doubt: AtomicBool::new(false),
                version: AtomicU64::new(state.version),
                renewed: tokio::sync::Notify::new(),
                renew_now: tokio::sync::Notify::new(),
            };
            Ok(Taken::Held(Box::new(lease), state))
        }
        Acquire::HeldElsewhere { owner, until } => Ok(Taken::Busy(Busy {
            owner,
            until: UnixMillis(protocol::busy_until(until.0, &timings)),
        })),
    }
}

impl<S: StateStore> Lease<'_, S> {
    /// The owner id.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Whether a write may start now: the lease is not known lost and has more than the
    /// write margin left. Synchronous, for the ELBv2 adapter's check before every attempt
    /// ([`Fence`]); a pass calls [`Lease::ready`] first, which waits for a renewal instead
    /// of failing when the lease is merely close to its end.
    pub fn check(&self) -> Result<(), StateError> {
        if self.lost.load(Ordering::SeqCst) || !self.fresh() {
            return Err(StateError::LeaseLost {
                group: self.group.clone(),
            });
        }
        Ok(())
    }

    /// More than the write margin left (by this holder's last successful renewal), on
    /// the monotonic clock and on the wall clock the stored lease is judged by.
    /// The protocol's fence decides ([`protocol::may_write`]).
    fn fresh(&self) -> bool {
        let until = self.until.load(Ordering::SeqCst);
        let deadline = *crate::sync::lock(&self.deadline);
        protocol::may_write(
            self.clock.now().0,
            until,
            self.mono_ms(tokio::time::Instant::now(), true),
            self.mono_ms(deadline, false),
            &self.timings,
        )
    }

    /// A monotonic instant in milliseconds since [`Lease::origin`], rounded up (`ceil`:
    /// a reading of now) or down (a deadline), so the fence is never less strict.
    fn mono_ms(&self, at: tokio::time::Instant, ceil: bool) -> u64 {
        let d = at.saturating_duration_since(self.origin);
        let ms = protocol::ms(d);
        if ceil && d > Duration::from_millis(ms) {
            ms.saturating_add(1)
        } else {
            ms
        }
    }

    /// Records that a request sent at `sent` extended the lease by a duration.
    fn extended(&self, sent: tokio::time::Instant) {
        let mut deadline = crate::sync::lock(&self.deadline);
        *deadline = (*deadline).max(sent + self.timings.duration);
    }

    /// Waits until a write may start: at once when the lease has more than the write
    /// margin left; otherwise the heartbeat is asked to renew now (re-taking a lease that
    /// expired but that nobody else took) and this waits for it, at most
    /// [`Timings::ready_wait`] of real time. So a slow CPU or a slow state table costs time, not
    /// the pass; only a lease another holder took (or one that could not be renewed for
    /// that long) is lost. Call it (inside [`Lease::run`]'s pass) before every ELBv2
    /// mutation and fenced write.
    pub async fn ready(&self) -> Result<(), StateError> {
        let lost = || StateError::LeaseLost {
            group: self.group.clone(),
        };
        let give_up = tokio::time::Instant::now() + self.timings.ready_wait;
        loop {
            let renewed = self.renewed.notified();
            let mut renewed = std::pin::pin!(renewed);
            renewed.as_mut().enable();
            if self.lost.load(Ordering::SeqCst) {
                return Err(lost());
            }
            if self.handed_over.load(Ordering::SeqCst) {
                return Err(StateError::HandedOver {
                    group: self.group.clone(),
                });
            }
            if self.fresh() {
                return Ok(());
            }
            self.renew_now.notify_one();
            if tokio::time::timeout_at(give_up, renewed).await.is_err() {
                tracing::warn!(target_group = %self.group, "the lease could not be renewed in time; stopping before the next write");
                self.lost.store(true, Ordering::SeqCst);
                return Err(lost());
            }
        }
    }

    /// A fenced write of `change`: waits for the lease to be fresh ([`Lease::ready`]),
    /// and the state table refuses it if the lease is no longer ours.
    pub async fn write(&self, change: &Change) -> Result<(), StateError> {
        self.ready().await?;
        let version = self.version.load(Ordering::SeqCst);
        let result = self
            .store
            .write(&self.group, &self.owner, self.clock.now(), version, change)
            .await;
        match result {
            Ok(version) => {
                self.version.store(version, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => {
                if matches!(e, StateError::LeaseLost { .. }) {
                    self.lost.store(true, Ordering::SeqCst);
                }
                Err(e)
            }
        }
    }

    /// Runs passes under the lease, renewing it meanwhile, until one ends it: the one
    /// exit of the protocol. Each pass gets the group's state (as of taking the lease or
    /// of the last release that asked for another pass) and ends with a [`PassEnd`]. At
    /// most `max_passes` run; `more_time` is asked before each pass and before each
    /// release (with no time left the lease is given back instead of released, so a
    /// request for another pass is never cleared by a holder that would not serve it).
    /// When `shutdown` completes (the process is shutting down) the lease is handed over
    /// at once ([`Lease::hand_over`]) while the pass finishes its call in flight.
    ///
    /// A request for a pass (`dirty`) is cleared only by taking the lease or by a release
    /// that asks for another pass, and it is *owed* until a pass that started after it
    /// completes: every exit that leaves it unserved (out of time, a cut pass, a lost
    /// lease) sets `dirty` again for the next holder.
    pub async fn run(
        self,
        first: GroupState,
        max_passes: u32,
        more_time: impl Fn() -> bool,
        shutdown: impl Future<Output = ()>,
        mut pass: impl AsyncFnMut(GroupState, &Self) -> PassEnd,
    ) -> RunEnd {
        let mut shutdown = std::pin::pin!(futures::FutureExt::fuse(shutdown));
        let mut state = first;
        let mut passes = 0u32;
        // Taking the lease cleared any pending request: our first pass owes it.
        let mut owed = true;
        loop {
            if !more_time() {
                self.give_up(&Change::default(), owed).await;
                return RunEnd::GivenUp;
            }
            passes += 1;
            let end = self.hold(pass(state, &self), shutdown.as_mut()).await;
            let (change, next) = match end {
                PassEnd::Abort => return RunEnd::Aborted,
                PassEnd::Done(change) => {
                    owed = false;
                    (change, RunEnd::Released)
                }
                PassEnd::GiveUp(change) => {
                    owed = false;
                    (change, RunEnd::GivenUp)
                }
                PassEnd::Cut(change) => (change, RunEnd::Cut),
            };
            if self.lost.load(Ordering::SeqCst) {
                tracing::warn!(target_group = %self.group, "lease lost during the pass");
                // Whoever takes the lease next serves what this holder still owed.
                self.give_up(&Change::default(), owed).await;
                return RunEnd::Lost;
            }
            let out_of_time = passes >= max_passes || !more_time();
            if next != RunEnd::Released || out_of_time {
                self.give_up(&change, owed).await;
                return if next == RunEnd::Released {
                    RunEnd::GivenUp
                } else {
                    next
                };
            }
            let now = self.clock.now();
            let sent = tokio::time::Instant::now();
            let until = now.plus(self.timings.duration);
            match self
                .store
                .release(
                    &self.group,
                    &self.owner,
                    now,
                    self.version.load(Ordering::SeqCst),
                    until,
                    &change,
                    self.in_doubt.load(Ordering::SeqCst),
                )
                .await
            {
                Ok(Release::Released) => return RunEnd::Released,
                Ok(Release::RunAgain(s)) => {
                    self.until.fetch_max(until.0, Ordering::SeqCst);
                    self.extended(sent);
                    tracing::info!(target_group = %self.group, pass = passes, "asked to run again while holding the lease");
                    owed = true;
                    self.version.store(s.version, Ordering::SeqCst);
                    state = s;
                }
                Ok(Release::Lost) => {
                    tracing::warn!(target_group = %self.group, owner = %self.owner, "lease was lost before its release (expired or taken over)");
                    // The pass's result was not recorded: ask for another pass.
                    self.give_up(&Change::default(), true).await;
                    return RunEnd::Lost;
                }
                Err(e) => {
                    tracing::warn!(target_group = %self.group, error = %e, "lease release failed; it expires on its own");
                    return RunEnd::GivenUp;
                }
            }
        }
    }

    /// Gives the lease back with `change` written (if the lease is still ours), setting
    /// `dirty` when a request is still `owed`; a failure only leaves the lease to expire.
    async fn give_up(&self, change: &Change, owed: bool) {
        let now = self.clock.now();
        if let Err(e) = self
            .store
            .abandon(
                &self.group,
                &self.owner,
                now,
                self.version.load(Ordering::SeqCst),
                change,
                owed,
                self.in_doubt.load(Ordering::SeqCst),
            )
            .await
        {
            tracing::warn!(target_group = %self.group, error = %e, "giving the lease up failed; it expires on its own");
        }
    }

    /// Drives `work` while the heartbeat renews the lease (see [`Lease::heartbeat`]),
    /// until `shutdown` completes: then the lease is handed over while `work` finishes,
    /// and not renewed again.
    async fn hold<F: Future>(
        &self,
        work: F,
        shutdown: std::pin::Pin<&mut impl futures::future::FusedFuture<Output = ()>>,
    ) -> F::Output {
        let mut work = std::pin::pin!(work);
        if self.handed_over.load(Ordering::SeqCst) {
            return work.await;
        }
        let heartbeat = std::pin::pin!(self.heartbeat());
        tokio::select! {
            out = &mut work => out,
            () = heartbeat => work.await,
            () = shutdown => futures::join!(work, self.hand_over()).0,
        }
    }

    /// The process is shutting down (Lambda kills it 500 ms after SIGTERM): shortens
    /// the lease to one write margin from now and asks for another pass, at once, while
    /// the pass waits for its call in flight. If the pass cannot give the lease back
    /// before the process ends, the next holder waits one write margin (the time a call
    /// already sent may take to land) instead of up to a lease duration, and runs a
    /// pass. From here on no write starts under the lease ([`Lease::ready`]) and the
    /// heartbeat no longer renews it.
    async fn hand_over(&self) {
        self.handed_over.store(true, Ordering::SeqCst);
        let wall = self.clock.now();
        let until = wall.plus(self.timings.write_margin);
        {
            // The holder's views, shortened by the protocol ([`protocol::handed_over`]).
            let mut deadline = crate::sync::lock(&self.deadline);
            let now = tokio::time::Instant::now();
            let (view, mono) = protocol::handed_over(
                self.until.load(Ordering::SeqCst),
                self.mono_ms(*deadline, false),
                wall.0,
                self.mono_ms(now, true),
                &self.timings,
            );
            self.until.fetch_min(view, Ordering::SeqCst);
            *deadline = (*deadline).min(self.origin + Duration::from_millis(mono));
        }
        // A pass waiting in `ready` for a renewal stops waiting.
        self.renewed.notify_waiters();
        match self.store.hand_over(&self.group, &self.owner, until).await {
            Ok(true) => {
                tracing::info!(target_group = %self.group, until = until.0, "shutting down: the lease ends within the write margin unless given back first; another pass is asked for");
            }
            // Given back or lost meanwhile: nothing to hand over.
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(target_group = %self.group, error = %e, "handing the lease over at shutdown failed; unless given back it expires on its own");
            }
        }
    }

    /// Keeps the lease alive while a pass runs: a renewal is due [`Timings::renew_every`]
    /// after the last one that succeeded (or at once when [`Lease::ready`] asks), and
    /// while it is not answered another attempt starts every [`RENEW_RETRY`], up to
    /// [`RENEW_IN_FLIGHT`] at a time: a slow answer still counts when it comes, a hung
    /// one is dropped after one lease duration, and neither holds the next attempt back.
    /// A renewal is conditional only on the lease still being ours, so a lease that
    /// expired under a slow holder but that nobody else took is taken back. Returns once
    /// the lease is known lost (refused).
    async fn heartbeat(&self) {
        use futures::stream::{FuturesUnordered, StreamExt as _};
        let mut in_flight = FuturesUnordered::new();
        let mut last_start: Option<tokio::time::Instant> = None;
        // When the lease was last extended (acquired, asked to run again, or renewed).
        let mut confirmed = UnixMillis(
            self.until
                .load(Ordering::SeqCst)
                .saturating_sub(u64::try_from(self.timings.duration.as_millis()).unwrap_or(0)),
        );
        loop {
            let now = self.clock.now();
            let due = now >= confirmed.plus(self.timings.renew_every);
            let spaced = last_start.is_none_or(|t| t.elapsed() >= RENEW_RETRY);
            if due && spaced && in_flight.len() < RENEW_IN_FLIGHT {
                let until = now.plus(self.timings.duration);
                let started = tokio::time::Instant::now();
                last_start = Some(started);
                in_flight.push(async move {
                    let renewed = tokio::time::timeout(
                        self.timings.duration,
                        self.store.renew(&self.group, &self.owner, until),
                    )
                    .await;
                    (now, started, until, renewed)
                });
                continue;
            }
            let wait = if due {
                RENEW_RETRY
            } else {
                Duration::from_millis(
                    confirmed
                        .plus(self.timings.renew_every)
                        .0
                        .saturating_sub(now.0)
                        .max(1),
                )
            };
            tokio::select! {
                Some((sent, started, until, renewed)) = in_flight.next(), if !in_flight.is_empty() => {
                    match renewed {
                        Ok(Ok(true)) => {
                            self.until.fetch_max(until.0, Ordering::SeqCst);
                            self.extended(started);
                            confirmed = confirmed.max(sent);
                            self.renewed.notify_waiters();
                        }
                        Ok(Ok(false)) => {
                            tracing::warn!(target_group = %self.group, "lease renewal refused: another holder has it");
                            self.lost.store(true, Ordering::SeqCst);
                            self.renewed.notify_waiters();
                            return;
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(target_group = %self.group, error = %e, "lease renewal failed; trying again");
                        }
                        Err(_) => {
                            tracing::warn!(target_group = %self.group, "lease renewal got no answer within a lease duration; trying again");
                        }
                    }
                }
                () = self.renew_now.notified() => {
                    // `ready` wants a renewal: make it due now.
                    confirmed = UnixMillis(0);
                }
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

impl<S: StateStore> Fence for Lease<'_, S> {
    fn check(&self) -> Result<(), String> {
        Lease::check(self).map_err(|e| e.to_string())
    }

    fn abandoned(&self) {
        self.in_doubt.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::clock::ManualClock;
    use crate::fakes::FakeState;

    const T0: UnixMillis = UnixMillis(1_800_000_000_000);

    async fn taken<'a>(
        store: &'a FakeState,
        clock: &'a ManualClock,
        owner: &str,
    ) -> Taken<'a, FakeState> {
        take(store, clock, "g", owner.to_owned(), Timings::default())
            .await
            .expect("take")
    }

    #[test]
    fn no_attempt_outlives_the_margin_or_the_grace() {
        let t = Timings::default();
        assert!(
            crate::aws::MUTATION_ATTEMPT_DEADLINE < t.write_margin,
            "{t:?}"
        );
        assert!(
            crate::aws::MUTATION_ATTEMPT_DEADLINE < t.takeover_grace,
            "{t:?}"
        );
        assert!(t.renew_every + t.write_margin < t.duration, "{t:?}");
    }

    #[tokio::test]
    async fn a_waiter_takes_over_only_a_grace_after_the_expiry() {
        let store = FakeState::default();
        let clock = ManualClock::new(T0);
        let Taken::Held(first, _) = taken(&store, &clock, "a").await else {
            panic!("free");
        };
        let t = Timings::default();
        // Expired, but within the grace: still the holder's.
        clock.advance(t.duration.as_millis() as u64 + 1);
        let Taken::Busy(busy) = taken(&store, &clock, "b").await else {
            panic!("taken over within the grace");
        };
        assert_eq!(busy.until, T0.plus(t.duration).plus(t.takeover_grace));
        // Past the grace: taken over.
        clock.advance(t.takeover_grace.as_millis() as u64);
        assert!(matches!(taken(&store, &clock, "b").await, Taken::Held(..)));
        drop(first);
    }

    #[tokio::test(start_paused = true)]
    async fn the_holders_view_of_its_lease_runs_on_the_monotonic_clock() {
        let store = FakeState::default();
        let clock = ManualClock::new(T0);
        let Taken::Held(lease, _) = taken(&store, &clock, "a").await else {
            panic!("free");
        };
        assert!(lease.check().is_ok());
        // The wall clock stands still (or stepped back); time passes all the same.
        let t = Timings::default();
        tokio::time::advance(t.duration - t.write_margin).await;
        assert!(
            lease.check().is_err(),
            "a lease with the margin left on the monotonic clock is not fresh, whatever the wall clock says"
        );
    }

    /// An ELBv2 attempt abandoned at its deadline may still land: however the lease
    /// ends after one (released, given up, cut), a taker waits the takeover grace, as
    /// after an expiry, instead of taking it at once.
    #[tokio::test]
    async fn a_lease_ended_after_an_abandoned_attempt_is_taken_only_after_the_grace() {
        let t = Timings::default();
        let ends: [fn() -> PassEnd; 3] = [
            || PassEnd::Done(Change::default()),
            || PassEnd::GiveUp(Change::default()),
            || PassEnd::Cut(Change::default()),
        ];
        for (i, end) in ends.into_iter().enumerate() {
            let store = FakeState::default();
            let clock = ManualClock::new(T0);
            let Taken::Held(lease, state) = taken(&store, &clock, "a").await else {
                panic!("free");
            };
            let ended = lease
                .run(
                    state,
                    2,
                    || true,
                    std::future::pending(),
                    async |_, lease| {
                        Fence::abandoned(lease);
                        end()
                    },
                )
                .await;
            assert_ne!(ended, RunEnd::Aborted);
            let Taken::Busy(busy) = taken(&store, &clock, "b").await else {
                panic!("end {i}: taken at once after an abandoned attempt");
            };
            assert_eq!(busy.until, T0.plus(t.takeover_grace), "end {i}");
            clock.advance(t.grace_ms() + 1);
            assert!(
                matches!(taken(&store, &clock, "b").await, Taken::Held(..)),
                "end {i}: not taken after the grace"
            );
        }
        // Every attempt answered: given back for anyone to take at once.
        let store = FakeState::default();
        let clock = ManualClock::new(T0);
        let Taken::Held(lease, state) = taken(&store, &clock, "a").await else {
            panic!("free");
        };
        let done = lease
            .run(
                state,
                2,
                || true,
                std::future::pending(),
                async |_, _| PassEnd::Done(Change::default()),
            )
            .await;
        assert_eq!(done, RunEnd::Released);
        assert!(matches!(taken(&store, &clock, "b").await, Taken::Held(..)));
    }

    /// A renewal sent earlier and delivered after a later one never shortens the lease
    /// (the holder, believing the later one, would write past the stored expiry).
    #[tokio::test]
    async fn renewals_delivered_out_of_order_only_extend_the_lease() {
        let store = FakeState::default();
        let clock = ManualClock::new(T0);
        let Taken::Held(lease, _) = taken(&store, &clock, "a").await else {
            panic!("free");
        };
        let later = T0.plus(Duration::from_secs(25));
        assert!(store.renew("g", "a", later).await.expect("renew"));
        // The earlier one lands now: refused, yet the lease is still ours, as long.
        let earlier = T0.plus(Duration::from_secs(20));
        assert!(store.renew("g", "a", earlier).await.expect("renew"));
        let stored = store.stored("g").lease.expect("held");
        assert_eq!((stored.owner.as_str(), stored.until), ("a", later));
        drop(lease);
    }

    /// Every write of a holder is conditional on the item's version: an older write
    /// delivered late (an SDK retry of a whole-ledger write) cannot overwrite a newer
    /// one, and a retry of a write that had landed still counts as written.
    #[tokio::test]
    async fn a_late_duplicate_of_an_older_write_never_overwrites_a_newer_one() {
        let store = FakeState::default();
        let clock = ManualClock::new(T0);
        let Taken::Held(lease, state) = taken(&store, &clock, "a").await else {
            panic!("free");
        };
        let backoff = |failures| Change {
            backoff: Some(Some(crate::core::BackoffState {
                failures,
                next_attempt: T0,
            })),
            ..Change::default()
        };
        let v = state.version;
        assert_eq!(
            store
                .write("g", "a", T0, v, &backoff(1))
                .await
                .expect("first"),
            v + 1
        );
        // The first write's retry, its answer lost: landed already, so written.
        assert_eq!(
            store
                .write("g", "a", T0, v, &backoff(1))
                .await
                .expect("retry"),
            v + 1
        );
        assert_eq!(
            store
                .write("g", "a", T0, v + 1, &backoff(2))
                .await
                .expect("second"),
            v + 2
        );
        // Another copy of the first, delivered last: refused.
        assert!(store.write("g", "a", T0, v, &backoff(1)).await.is_err());
        assert_eq!(store.stored("g").backoff.map(|b| b.failures), Some(2));
        drop(lease);
    }

    #[test]
    fn owner_ids_name_their_cluster() {
        let id = owner_id("pod-events", "prod-1", 0xabc);
        assert_eq!(id, "pod-events@prod-1#0000000000000abc");
        assert_eq!(cluster_of(&id), Some("prod-1"));
        assert_eq!(cluster_of("old-style-owner"), None);
    }
}
