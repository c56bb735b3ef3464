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
use crate::state::{Acquire, Change, GroupState, Release, StateError, StateStore};

/// The lease's clock settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How long a lease lasts without renewal: the most a dead holder blocks its group.
    pub duration: Duration,
    /// How often a holder renews while it works.
    pub renew_every: Duration,
    /// A holder stops writing when its lease has less than this left (an ELBv2 call
    /// started then could land after another holder took over).
    pub write_margin: Duration,
    /// How often a waiter looks at a held lease.
    pub poll: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            write_margin: Duration::from_secs(4),
            poll: Duration::from_secs(1),
        }
    }
}

/// Times a waiter goes back to taking the lease (after a holder died or gave up) before
/// it leaves the group to its holder and the next run.
const MAX_ROUNDS: u32 = 4;

/// Why no lease was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Busy {
    /// The holder was asked to run again and the wait is over (or was not allowed): it
    /// will serve the change if it is alive; otherwise the lease expires on its own.
    Asked {
        /// The holder.
        owner: String,
    },
    /// The holder ran again after our request (or a newer holder read everything
    /// afresh): our change is served.
    Served,
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
    /// next run (failed, backing off, out of time).
    GiveUp(Change),
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
    lost: AtomicBool,
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

/// Takes `group`'s lease for `owner`. When another holds it, the holder is marked
/// dirty; then, until `wait_until`, this waits: for the holder to serve the request
/// (release after a re-run, or a newer holder), or to vanish without serving it
/// (abandoned, or expired: a dead holder), in which case the lease is taken over. A
/// holder of another cluster (a group shared by clusters) cannot serve our pods, so its
/// release only frees the lease for us.
pub async fn take<'a, S: StateStore>(
    store: &'a S,
    clock: &'a dyn Clock,
    group: &str,
    owner: String,
    timings: Timings,
    cluster: &str,
    wait_until: Option<UnixMillis>,
) -> Result<Taken<'a, S>, StateError> {
    let mut rounds = 0u32;
    loop {
        rounds += 1;
        let now = clock.now();
        let until = now.plus(timings.duration);
        let holder = match store.acquire(group, &owner, now, until).await? {
            Acquire::Acquired(state) => {
                let lease = Lease {
                    store,
                    clock,
                    group: group.to_owned(),
                    owner,
                    timings,
                    until: AtomicU64::new(until.0),
                    lost: AtomicBool::new(false),
                };
                return Ok(Taken::Held(Box::new(lease), state));
            }
            Acquire::HeldElsewhere { owner: holder, .. } => holder,
        };
        let same_cluster = cluster_of(&holder) == Some(cluster);
        // Wait for the holder to serve us, or to go away without doing so: at most until
        // `wait_until`, and at most that many polls (whatever the clock says).
        let poll_ms = u64::try_from(timings.poll.as_millis()).unwrap_or(1).max(1);
        let mut polls = if rounds > MAX_ROUNDS {
            0
        } else {
            wait_until.map_or(0, |w| w.0.saturating_sub(clock.now().0) / poll_ms)
        };
        loop {
            if polls == 0 || wait_until.is_none_or(|w| clock.now().plus(timings.poll) >= w) {
                return Ok(Taken::Busy(Busy::Asked { owner: holder }));
            }
            polls -= 1;
            tokio::time::sleep(timings.poll).await;
            let state = store.peek(group).await?;
            let now = clock.now();
            match &state.lease {
                Some(l) if l.owner == holder && l.until >= now => continue,
                // Expired under its holder: a dead holder. Take over.
                Some(l) if l.owner == holder => break,
                // A newer holder of this cluster read everything after our request.
                Some(l) if l.until >= now && cluster_of(&l.owner) == Some(cluster) => {
                    return Ok(Taken::Busy(Busy::Served));
                }
                // Another cluster's holder, or an expired one: ask again.
                Some(_) => break,
                // Given up with our request unserved, or freed by another cluster.
                None if state.dirty || !same_cluster => break,
                // Released after a re-run that served our request.
                None => return Ok(Taken::Busy(Busy::Served)),
            }
        }
        tracing::info!(target_group = group, holder = %holder, "the lease holder went away without serving the request; taking over");
    }
}

impl<S: StateStore> Lease<'_, S> {
    /// The owner id.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Whether a write may start now: the lease is not known lost and has more than the
    /// write margin left. Call before every ELBv2 mutation.
    pub fn check(&self) -> Result<(), StateError> {
        let until = UnixMillis(self.until.load(Ordering::SeqCst));
        if self.lost.load(Ordering::SeqCst)
            || self.clock.now().plus(self.timings.write_margin) > until
        {
            self.lost.store(true, Ordering::SeqCst);
            return Err(StateError::LeaseLost {
                group: self.group.clone(),
            });
        }
        Ok(())
    }

    /// A fenced write of `change`.
    pub async fn write(&self, change: &Change) -> Result<(), StateError> {
        self.check()?;
        let result = self
            .store
            .write(&self.group, &self.owner, self.clock.now(), change)
            .await;
        if matches!(result, Err(StateError::LeaseLost { .. })) {
            self.lost.store(true, Ordering::SeqCst);
        }
        result
    }

    /// Runs passes under the lease, renewing it meanwhile, until one ends it: the one
    /// exit of the protocol. Each pass gets the group's state (as of taking the lease or
    /// of the last release that asked for another pass) and ends with a [`PassEnd`]. At
    /// most `max_passes` run; `more_time` is asked before each pass (the lease is given
    /// back untouched when there is none).
    pub async fn run(
        self,
        first: GroupState,
        max_passes: u32,
        more_time: impl Fn() -> bool,
        mut pass: impl AsyncFnMut(GroupState, &Self) -> PassEnd,
    ) -> RunEnd {
        let mut state = first;
        let mut passes = 0u32;
        loop {
            if !more_time() {
                let now = self.clock.now();
                if let Err(e) = self
                    .store
                    .abandon(&self.group, &self.owner, now, &Change::default())
                    .await
                {
                    tracing::warn!(target_group = %self.group, error = %e, "giving the lease up failed; it expires on its own");
                }
                return RunEnd::GivenUp;
            }
            passes += 1;
            let end = self.hold(pass(state, &self)).await;
            let (change, give_up) = match end {
                PassEnd::Abort => return RunEnd::Aborted,
                PassEnd::Done(change) => (change, false),
                PassEnd::GiveUp(change) => (change, true),
            };
            if self.lost.load(Ordering::SeqCst) {
                tracing::warn!(target_group = %self.group, "lease lost during the pass");
                return RunEnd::Lost;
            }
            let now = self.clock.now();
            if give_up || passes >= max_passes {
                return match self
                    .store
                    .abandon(&self.group, &self.owner, now, &change)
                    .await
                {
                    Ok(()) => RunEnd::GivenUp,
                    Err(e) => {
                        tracing::warn!(target_group = %self.group, error = %e, "giving the lease up failed; it expires on its own");
                        RunEnd::GivenUp
                    }
                };
            }
            let until = now.plus(self.timings.duration);
            match self
                .store
                .release(&self.group, &self.owner, now, until, &change)
                .await
            {
                Ok(Release::Released) => return RunEnd::Released,
                Ok(Release::RunAgain(s)) => {
                    self.until.store(until.0, Ordering::SeqCst);
                    tracing::info!(target_group = %self.group, pass = passes, "asked to run again while holding the lease");
                    state = s;
                }
                Ok(Release::Lost) => {
                    tracing::warn!(target_group = %self.group, owner = %self.owner, "lease was lost before its release (expired or taken over)");
                    return RunEnd::Lost;
                }
                Err(e) => {
                    tracing::warn!(target_group = %self.group, error = %e, "lease release failed; it expires on its own");
                    return RunEnd::GivenUp;
                }
            }
        }
    }

    /// Drives `work` while renewing the lease every `renew_every`. If renewal fails for
    /// good the lease is marked lost, and `work` stops at its next [`Lease::check`] or
    /// fenced write.
    async fn hold<F: Future>(&self, work: F) -> F::Output {
        let heartbeat = async {
            loop {
                tokio::time::sleep(self.timings.renew_every).await;
                let now = self.clock.now();
                let until = now.plus(self.timings.duration);
                match self.store.renew(&self.group, &self.owner, now, until).await {
                    Ok(true) => self.until.store(until.0, Ordering::SeqCst),
                    Ok(false) => {
                        tracing::warn!(target_group = %self.group, "lease renewal refused: lost");
                        self.lost.store(true, Ordering::SeqCst);
                        return;
                    }
                    Err(e) => {
                        // Keep trying while the lease lasts; `check` stops writes in time.
                        tracing::warn!(target_group = %self.group, error = %e, "lease renewal failed");
                    }
                }
            }
        };
        let work = std::pin::pin!(work);
        let heartbeat = std::pin::pin!(heartbeat);
        match futures::future::select(work, heartbeat).await {
            futures::future::Either::Left((out, _)) => out,
            futures::future::Either::Right(((), work)) => work.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_ids_name_their_cluster() {
        let id = owner_id("pod-events", "prod-1", 0xabc);
        assert_eq!(id, "pod-events@prod-1#0000000000000abc");
        assert_eq!(cluster_of(&id), Some("prod-1"));
        assert_eq!(cluster_of("old-style-owner"), None);
    }
}
