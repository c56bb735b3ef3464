//! The runner: runs a queue's keys, each key's pass on its own, until its run ends —
//! kube-runtime's runner. Every function uses it; they differ only in where requests
//! come from (the schedule's full diff and watch, a pod event, an operator) and in how
//! the run ends ([`Ending`]).
//!
//! At most `cap` passes for pod changes and `cap` verifications run at once. A pass
//! returns an [`Action`] or a [`PassError`], which the queue turns into a delay. Keys
//! parked on a lease another process holds take no slot: every [`LEASE_POLL`] the owner
//! reads their groups' leases in one batched read, and a lease given back or expired
//! ends their wait. The runner itself does no I/O: reading leases and handing on what a
//! run could not serve are its owner's ([`Owner`]).

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::FusedFuture as _;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;

use super::hooks::Owner;
use super::queue::{LEASE_POLL, Queue, Room, Want};
use crate::core::lease_protocol::{self as protocol, Wind};
use crate::reconcile::{Action, PassError, Reconciled};
use crate::sync::lock;

/// How a run ends.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ending {
    /// At this time, whatever is still queued (the watching run: until shortly before
    /// the next tick). The pod changes it could not serve are handed on; the warm
    /// container keeps the rest of its queue.
    At(Instant),
    /// Once nothing is left to run (a one-shot run: a manual run, a pod event, a
    /// release). A key waiting for a lease another process holds is waited for while it
    /// comes back by `leases`, a key waiting for a gate while it comes back by `gates`;
    /// one that failed, was cut or backs off is not run again: every request the run
    /// could not serve is handed on to the next run.
    Idle {
        /// The last time a key parked on a lease may come back.
        leases: Instant,
        /// The last time a key waiting for a gate may come back.
        gates: Instant,
    },
    /// Once nothing asked for is left, or at `until` once no key is ready (a release:
    /// each named group released or failed for good, or the invocation out of time). Until
    /// then a key parked on a lease another process holds waits for it to be given back
    /// (or to expire), and one that failed is tried again after [`PassError::Failed`]'s
    /// delay; a backoff or a cut pass is left to the next run.
    Drain {
        /// When waiting ends.
        until: Instant,
    },
}

impl Ending {
    /// What the run keeps of a pass's `result` for `key`, asked to do `want`: a
    /// one-shot run waits for a lease or a gate, and leaves a backoff, a retry or a pass
    /// that did not finish to the next run — each such request (but a look at gates)
    /// goes to `left`, to be handed on. A release drops a failure no retry can help
    /// ([`crate::reconcile::Failure::retryable`]): its report says it failed.
    fn keeps(
        self,
        result: Reconciled,
        want: Want,
        key: &str,
        left: &mut Vec<String>,
    ) -> Reconciled {
        let unfinished = matches!(
            result,
            Ok(Action::BackOff { .. })
                | Err(PassError::Cut
                    | PassError::Deferred
                    | PassError::Yielded
                    | PassError::BackingOff { .. })
        );
        match self {
            Self::Idle { .. } if unfinished || matches!(result, Err(PassError::Failed(_))) => {
                if !want.gates_only() {
                    left.push(key.to_owned());
                }
                Ok(Action::Done)
            }
            // A release's request is a release, which no reconcile pass would serve: it
            // is not handed on (its report says what it could not release).
            Self::Drain { .. }
                if unfinished || matches!(&result, Err(PassError::Failed(f)) if !f.retryable()) =>
            {
                Ok(Action::Done)
            }
            _ => result,
        }
    }

    /// What is still queued when the run ends and must be handed on: a watching run's
    /// pod changes (the warm container keeps the rest of its queue), a one-shot run's
    /// every request (parked on a lease, say) but looks at gates.
    fn left_in(self, queue: &Queue) -> Vec<String> {
        match self {
            Self::At(_) => queue.pending_changes(),
            Self::Idle { .. } => queue.pending_requests(),
            Self::Drain { .. } => Vec::new(),
        }
    }

    /// Whether what the run could not serve is handed on.
    fn hands_on(self) -> bool {
        !matches!(self, Self::Drain { .. })
    }
}

impl Unserved {
    /// Records what the run could not serve in its `report`: the groups handed on, or
    /// an error naming them when handing them on failed.
    pub(crate) fn record(self, report: &mut crate::report::Report) {
        match self.error {
            Some(e) if !self.groups.is_empty() => report.errors.push(format!(
                "{} group(s) the run could not serve were not handed on to the next run ({e}); the next full diff finds them: {}",
                self.groups.len(),
                self.groups.join(", ")
            )),
            _ => report.handed_on = self.groups,
        }
    }
}

/// What a run could not serve when it ended.
#[derive(Debug, Default)]
pub(crate) struct Unserved {
    /// The groups, sorted: handed on (each group's `dirty` flag and the cluster index's
    /// record of requests), unless `error` says that failed or the run hands nothing on.
    pub groups: Vec<String>,
    /// Handing them on failed: nothing but a later full diff (or a retry of the
    /// invocation) serves them.
    pub error: Option<crate::state::StateError>,
}

/// Runs the keys of a queue; its owner does the I/O ([`Owner`]).
pub(crate) struct Runner<'a, O> {
    owner: &'a O,
    queue: &'a Mutex<Queue>,
    /// Signalled when the queue gets a request.
    wake: &'a tokio::sync::Notify,
}

impl<'a, O: Owner> Runner<'a, O> {
    /// A runner of `queue` for `owner`'s passes; `wake` is signalled by whoever adds a
    /// request.
    pub(crate) fn new(
        owner: &'a O,
        queue: &'a Mutex<Queue>,
        wake: &'a tokio::sync::Notify,
    ) -> Self {
        Self { owner, queue, wake }
    }

    /// Runs the queue until `ending` (or the process shuts down): each key's pass is
    /// `job(key, want)`, whose result the queue turns into a delay. When the run
    /// ends, the passes in flight finish (a run's options cut them cleanly at its
    /// `cut_at`); what is still queued stays in the queue, and every request the run
    /// could not serve is handed on ([`Owner::hand_on`]; see [`Ending`]) — at shutdown,
    /// what is queued or parked before the passes in flight drain. Returns what it could
    /// not serve.
    pub(crate) async fn run<F, Fut>(&self, ending: Ending, job: F) -> Unserved
    where
        F: Fn(String, Want) -> Fut,
        Fut: Future<Output = (String, Want, Reconciled)>,
    {
        let owner = self.owner;
        let cap = owner.cap();
        let mut in_flight = FuturesUnordered::new();
        let (mut changes, mut verifications) = (0usize, 0usize);
        let mut next_lease_look = Instant::now() + LEASE_POLL;
        let mut looking = std::pin::pin!(futures::future::Fuse::terminated());
        // Requests whose pass a one-shot run left to the next run.
        let mut left = Vec::new();
        loop {
            let woken = self.wake.notified();
            let mut woken = std::pin::pin!(woken);
            woken.as_mut().enable();
            let shutdown = owner.stop().notified();
            let mut shutdown = std::pin::pin!(shutdown);
            shutdown.as_mut().enable();
            let now = Instant::now();
            let over = match ending {
                Ending::At(until) => now >= until,
                Ending::Idle { leases, gates, .. } => {
                    in_flight.is_empty() && !lock(self.queue).has_work(leases, gates)
                }
                Ending::Drain { until } => {
                    let queue = lock(self.queue);
                    in_flight.is_empty()
                        && (queue.is_idle() || (now >= until && !queue.has_work(now, now)))
                }
            };
            if over || owner.stop().is_shutting_down() {
                break;
            }
            loop {
                let room = Room {
                    changes: changes < cap,
                    verifications: verifications < cap,
                };
                let Some((key, want)) = lock(self.queue).pop(now, room) else {
                    break;
                };
                // The room the queue admitted it under: a reaction's (a pod change, a
                // gate) or a verification's.
                if want.reacts() {
                    changes += 1;
                } else {
                    verifications += 1;
                }
                in_flight.push(job(key, want));
            }
            // What to wake for besides a pass ending or a request: a waiting key's time
            // (one ready now waits for room, that is for a pass to end), the next look at
            // the leases that park keys, the end of the run.
            let (next, parked) = {
                let queue = lock(self.queue);
                (queue.next_wake().filter(|t| *t > now), queue.has_parked())
            };
            let look = (parked && looking.is_terminated()).then_some(next_lease_look);
            let end = match ending {
                Ending::At(until) => Some(until),
                Ending::Drain { until } => Some(until).filter(|u| *u > now),
                Ending::Idle { .. } => None,
            };
            let sleep_until = [next, look, end].into_iter().flatten().min();
            let sleep = async {
                match sleep_until {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some((key, want, result)) = in_flight.next(), if !in_flight.is_empty() => {
                    if want.reacts() { changes -= 1 } else { verifications -= 1 }
                    let kept = ending.keeps(result, want, &key, &mut left);
                    lock(self.queue).done(&key, want, &kept, owner.now());
                }
                () = &mut looking, if !looking.is_terminated() => {
                    next_lease_look = Instant::now() + LEASE_POLL;
                }
                () = &mut woken => {}
                () = &mut shutdown => {}
                () = sleep => {
                    if look.is_some_and(|at| Instant::now() >= at) {
                        looking.set(futures::FutureExt::fuse(Box::pin(self.look_at_leases())));
                    }
                }
            }
        }
        // The time is up: no new pass; those in flight finish or are cut cleanly, and
        // what they leave is handed on (counted as a pass in flight, so the shutdown
        // hook waits for it). At shutdown the process ends ~400 ms after the signal,
        // before a pass whose call is in flight may end: what is queued or parked is
        // handed on first, then the passes drain (each hands its own lease over), in
        // the protocol's order (`lease_protocol::winding_up`, which the model check
        // explores).
        let _holding = owner.stop().holding();
        let mut unserved: Vec<String> = Vec::new();
        let mut error = None;
        for wind in protocol::winding_up(owner.stop().is_shutting_down()) {
            match wind {
                Wind::Drain => {
                    while let Some((key, want, result)) = in_flight.next().await {
                        let kept = ending.keeps(result, want, &key, &mut left);
                        lock(self.queue).done(&key, want, &kept, owner.now());
                    }
                }
                Wind::HandOn => {
                    let mut groups = std::mem::take(&mut left);
                    groups.extend(ending.left_in(&lock(self.queue)));
                    groups.sort_unstable();
                    groups.dedup();
                    groups.retain(|g| unserved.binary_search(g).is_err());
                    if ending.hands_on()
                        && let Err(e) = owner.hand_on(&groups).await
                    {
                        error = Some(e);
                    }
                    unserved.extend(groups);
                    unserved.sort_unstable();
                }
            }
        }
        Unserved {
            groups: unserved,
            error,
        }
    }

    /// Reads the leases that park keys (through the owner: one batched read) and tells
    /// the queue what each is now: a lease given back or expired (and past its takeover
    /// grace) ends its keys' wait, a renewed or handed-over one moves it. A read that
    /// fails leaves them parked until the leases they saw would expire.
    async fn look_at_leases(&self) {
        let parked = lock(self.queue).parked();
        if parked.is_empty() {
            return;
        }
        let Some(ends) = self.owner.lease_ends(&parked).await else {
            return;
        };
        let now = self.owner.now();
        let mut queue = lock(self.queue);
        for (key, until) in ends {
            queue.lease_seen(&key, until, now);
        }
    }
}

/// The monotonic instant `after` from now, or far in the future when there is none.
pub(crate) fn within(after: Option<Duration>) -> Instant {
    let now = Instant::now();
    after.map_or(now + Duration::from_secs(86_400 * 365), |d| now + d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::Failure;
    use crate::state::StateError;

    /// A release gives up on a failure no retry can help (its report says the group
    /// failed) but waits out one that may pass; a one-shot run hands both on.
    #[test]
    fn a_release_gives_up_only_on_a_failure_no_retry_can_help() {
        let drain = Ending::Drain {
            until: Instant::now(),
        };
        let missing = || {
            Err(PassError::Failed(Failure::LeaseTake(StateError::NoTable {
                table: "t".into(),
            })))
        };
        let busy = || {
            Err(PassError::Failed(Failure::LeaseTake(StateError::Dynamo {
                operation: "PutItem",
                message: "ThrottlingException".into(),
            })))
        };
        let mut left = Vec::new();
        assert_eq!(
            drain.keeps(missing(), Want::verify(), "a", &mut left).ok(),
            Some(Action::Done)
        );
        assert!(matches!(
            drain.keeps(busy(), Want::verify(), "a", &mut left),
            Err(PassError::Failed(_))
        ));
        assert!(left.is_empty(), "a release hands nothing on");
        let once = Ending::Idle {
            leases: Instant::now(),
            gates: Instant::now(),
        };
        for result in [missing(), busy()] {
            assert_eq!(
                once.keeps(result, Want::verify(), "a", &mut left).ok(),
                Some(Action::Done)
            );
        }
        assert_eq!(left, ["a", "a"], "a one-shot run hands each on");
    }
}
