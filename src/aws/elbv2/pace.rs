//! How fast tgsync sends ELBv2 requests: every attempt — first tries and retries alike —
//! waits for the shared client-side limit of its kind (mutations, Describes: a token
//! bucket, or a container's window of the deployment's budget; see `limiter`), and
//! a throttled answer slows every caller of that kind down further until answers come
//! back clean (adaptive), instead of the SDK retrying on its own outside the bucket.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_runtime_api::http::Response as HttpResponse;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use super::super::{
    INITIAL_BACKOFF, MAX_ATTEMPTS, MAX_BACKOFF, MUTATION_ATTEMPT_DEADLINE, credentials_failure,
    is_throttling_code,
};
use super::MutationRate;
use super::limiter::Limiter;
use crate::groups::{Fence, Priority};

/// Largest extra wait per attempt while ELBv2 keeps throttling.
const MAX_PENALTY_MS: u64 = 5_000;
/// First extra wait after a throttled answer.
const FIRST_PENALTY_MS: u64 = 250;

/// The pace of one kind of ELBv2 call, shared by every clone of the adapter (so by every
/// concurrent reconcile of a container).
///
/// Background work ([`Priority::Background`]: discovery, the full diff's
/// verifications) takes a slot only when no other request is waiting for one, and only
/// one background request waits at a time: a reaction waits for at most one slot,
/// however many verifications are queued. Under a share's window, background work also
/// leaves the window's last slot free, so a reaction's first call finds one at once.
/// Background work that found a change ([`crate::groups::Promotion::found_change`])
/// waits in a lane of its own, ahead of the rest of the background. Requests for
/// reactions take their slots in arrival order.
#[derive(Debug)]
pub(crate) struct Pace {
    limiter: Option<Limiter>,
    /// Extra wait before each attempt, doubled by a throttled answer and halved by a
    /// clean one.
    penalty_ms: AtomicU64,
    /// Requests (not background) waiting for a slot.
    urgent_waiting: AtomicUsize,
    /// Lets one of them at a time wait on the bucket, the others in arrival order
    /// (tokio's mutex is FIFO): each slot then wakes one task, not every waiter.
    urgent_turn: tokio::sync::Mutex<()>,
    /// Lets one background request at a time wait for a slot.
    background: tokio::sync::Semaphore,
    /// Background requests that found a change, waiting for a slot (queued included).
    ahead_waiting: AtomicUsize,
    /// Lets one of them at a time wait for a slot.
    ahead: tokio::sync::Semaphore,
    /// Throttled answers so far.
    throttles: AtomicU64,
    /// Retried attempts so far.
    retries: AtomicU64,
}

/// Counts a waiting request for as long as it waits (also when its future is dropped).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How often a background request looks again while requests for reactions wait.
const YIELD_POLL: Duration = Duration::from_millis(20);

impl Pace {
    /// A pace held to `rate` (`None`: no client-side bucket, only the adaptive wait).
    pub(crate) fn new(rate: Option<MutationRate>) -> Self {
        Self {
            limiter: rate.map(|r| r.limiter()),
            penalty_ms: AtomicU64::new(0),
            urgent_waiting: AtomicUsize::new(0),
            urgent_turn: tokio::sync::Mutex::new(()),
            background: tokio::sync::Semaphore::new(1),
            ahead_waiting: AtomicUsize::new(0),
            ahead: tokio::sync::Semaphore::new(1),
            throttles: AtomicU64::new(0),
            retries: AtomicU64::new(0),
        }
    }

    /// Throttled answers and retried attempts so far.
    pub(crate) fn pressure(&self) -> crate::report::ElbPressure {
        crate::report::ElbPressure {
            throttles: self.throttles.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
        }
    }

    /// The current extra wait.
    #[cfg(test)]
    fn penalty(&self) -> Duration {
        Duration::from_millis(self.penalty_ms.load(Ordering::Relaxed))
    }

    /// Waits until an attempt may go out: the adaptive wait first, then the bucket, so
    /// the request leaves right when the bucket grants it (never bunched behind a wait).
    async fn slot(&self, priority: &Priority) {
        let penalty = self.penalty_ms.load(Ordering::Relaxed);
        if penalty > 0 {
            tokio::time::sleep(Duration::from_millis(fastrand::u64(penalty / 2..=penalty))).await;
        }
        let granted = match (&self.limiter, priority.yielding()) {
            (Some(limiter), Some(promotion)) => self.background_slot(limiter, promotion).await,
            _ => false,
        };
        // Background work that stands down stops here: before its call, and before it
        // would wait for a reaction's slot.
        priority.sending().await;
        let Some(limiter) = &self.limiter else {
            return;
        };
        if granted {
            return;
        }
        let _waiting = Waiting::new(&self.urgent_waiting);
        // Without the turn, every waiter sleeps until the same next slot: all wake, one
        // takes it and the rest sleep again (N wake-ups per slot for N waiters).
        let _turn = self.urgent_turn.lock().await;
        limiter.ready().await;
    }

    /// A slot for background work: one background request of its lane waits at a time,
    /// and takes a slot only while no reaction waits for one (nor, in the lane of
    /// re-verifications, a request that found a change). `false` when the work is
    /// promoted (or stands down) meanwhile: it then waits as a reaction does.
    async fn background_slot(
        &self,
        limiter: &Limiter,
        promotion: &crate::groups::Promotion,
    ) -> bool {
        let ahead = promotion.has_change();
        let _counted = ahead.then(|| Waiting::new(&self.ahead_waiting));
        let lane = if ahead { &self.ahead } else { &self.background };
        let _turn = tokio::select! {
            turn = lane.acquire() => turn,
            () = promotion.promoted() => return false,
        };
        loop {
            let before = self.urgent_waiting.load(Ordering::SeqCst)
                + if ahead {
                    0
                } else {
                    self.ahead_waiting.load(Ordering::SeqCst)
                };
            let wait = if before > 0 {
                YIELD_POLL
            } else {
                match limiter.check(true) {
                    None => return true,
                    Some(wait) => wait.min(YIELD_POLL.max(wait / 2)),
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = promotion.promoted() => return false,
            }
        }
    }

    fn throttled(&self) {
        let _ = self
            .penalty_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                Some((p * 2).clamp(FIRST_PENALTY_MS, MAX_PENALTY_MS))
            });
    }

    fn answered(&self) {
        let _ = self
            .penalty_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                Some(if p < FIRST_PENALTY_MS { 0 } else { p / 2 })
            });
    }

    /// Sends one request (`send` builds it with the SDK's own retries off) until it
    /// succeeds, fails for good, or [`MAX_ATTEMPTS`] attempts went out; every attempt
    /// waits for a slot at `priority`, and retries back off exponentially with full
    /// jitter.
    pub(crate) async fn attempts<T, E, Fut>(
        &self,
        priority: &Priority,
        send: impl FnMut() -> Fut,
    ) -> Result<T, SdkError<E, HttpResponse>>
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
    {
        match self.attempts_at(priority, None, send).await {
            Ok(out) => Ok(out),
            Err(Stopped::Failed(err)) => Err(err),
            // Unreachable without a fence; answered as a transport failure would be.
            Err(Stopped::Fenced(reason)) => Err(SdkError::construction_failure(reason)),
        }
    }

    /// [`Pace::attempts`], asking `fence` right before every attempt goes out (after its
    /// slot: the wait for it can be long): once it refuses, nothing more is sent. A
    /// fenced attempt is abandoned at [`MUTATION_ATTEMPT_DEADLINE`] (credentials and
    /// connecting included), a timeout retried like any other, so none outlives the
    /// fence's margin.
    /// A change's attempts take their slots as a reaction's do.
    pub(crate) async fn fenced_attempts<T, E, Fut>(
        &self,
        fence: Option<&dyn Fence>,
        send: impl FnMut() -> Fut,
    ) -> Result<T, Stopped<SdkError<E, HttpResponse>>>
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
    {
        self.attempts_at(&Priority::Reaction, fence, send).await
    }

    /// The attempts of one request, each after its slot at `priority`, fenced by
    /// `fence` when there is one.
    async fn attempts_at<T, E, Fut>(
        &self,
        priority: &Priority,
        fence: Option<&dyn Fence>,
        mut send: impl FnMut() -> Fut,
    ) -> Result<T, Stopped<SdkError<E, HttpResponse>>>
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
    {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            self.slot(priority).await;
            let sent = match fence {
                Some(fence) => {
                    fence.check().map_err(Stopped::Fenced)?;
                    // Boxed: an SDK send future is large, and this one sits in every
                    // pass's state.
                    let sent = match tokio::time::timeout(
                        MUTATION_ATTEMPT_DEADLINE,
                        Box::pin(send()),
                    )
                    .await
                    {
                        Ok(sent) => sent,
                        Err(_) => Err(SdkError::timeout_error(format!(
                            "the attempt was abandoned after {} s, before the lease's write margin ends",
                            MUTATION_ATTEMPT_DEADLINE.as_secs()
                        ))),
                    };
                    // No answer: the request may have left and may still land.
                    if matches!(
                        sent,
                        Err(SdkError::TimeoutError(_) | SdkError::DispatchFailure(_))
                    ) {
                        fence.abandoned();
                    }
                    sent
                }
                None => send().await,
            };
            let err = match sent {
                Ok(out) => {
                    self.answered();
                    return Ok(out);
                }
                Err(err) => err,
            };
            if throttled(&err) {
                self.throttled();
                self.throttles.fetch_add(1, Ordering::Relaxed);
            }
            if !retryable(&err) || attempt >= MAX_ATTEMPTS {
                return Err(Stopped::Failed(err));
            }
            self.retries.fetch_add(1, Ordering::Relaxed);
            let ceiling = INITIAL_BACKOFF
                .saturating_mul(1 << (attempt - 1).min(16))
                .min(MAX_BACKOFF);
            let ceiling_ms = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
            tokio::time::sleep(Duration::from_millis(fastrand::u64(0..=ceiling_ms))).await;
        }
    }
}

/// Why [`Pace::fenced_attempts`] stopped: the last attempt's error (`E`: the SDK's), or
/// the fence's refusal.
pub(crate) enum Stopped<E> {
    /// The last attempt failed for good (or was the last allowed).
    Failed(E),
    /// The fence refused the next attempt, with its reason.
    Fenced(String),
}

impl<E> Stopped<E> {
    /// Maps the failure, keeping a refusal.
    pub(crate) fn map<F>(self, f: impl FnOnce(E) -> F) -> Stopped<F> {
        match self {
            Self::Failed(e) => Stopped::Failed(f(e)),
            Self::Fenced(reason) => Stopped::Fenced(reason),
        }
    }
}

/// Whether ELBv2 answered with throttling.
fn throttled<E: ProvideErrorMetadata>(err: &SdkError<E, HttpResponse>) -> bool {
    matches!(err, SdkError::ServiceError(ctx) if ctx.err().code().is_some_and(is_throttling_code))
}

/// Whether a failed call is worth another attempt: throttling, a 5xx, a timeout or a
/// transport failure (what the SDK's standard retry classifier retries) — but not a call
/// that had no credentials (a role that cannot be assumed): the SDK reports that as a
/// dispatch failure too, and the provider's STS client has already retried it.
pub(super) fn retryable<E>(err: &SdkError<E, HttpResponse>) -> bool
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    if credentials_failure(err).is_some() {
        return false;
    }
    match err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(ctx) => {
            ctx.raw().status().as_u16() >= 500 || ctx.err().code().is_some_and(is_throttling_code)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Open(AtomicUsize);

    impl Fence for Open {
        fn check(&self) -> Result<(), String> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fenced_attempt_is_abandoned_at_its_deadline() {
        use aws_sdk_elasticloadbalancingv2::operation::register_targets::RegisterTargetsError;
        let pace = Pace::new(None);
        let fence = Open(AtomicUsize::new(0));
        let started = tokio::time::Instant::now();
        let mut starts = Vec::new();
        let out = pace
            .fenced_attempts(Some(&fence), || {
                starts.push(tokio::time::Instant::now());
                // An attempt that never ends (a connection or a credentials provider
                // that hangs).
                std::future::pending::<Result<(), SdkError<RegisterTargetsError, HttpResponse>>>()
            })
            .await;
        assert!(matches!(
            out,
            Err(Stopped::Failed(SdkError::TimeoutError(_)))
        ));
        assert_eq!(starts.len(), MAX_ATTEMPTS as usize);
        assert_eq!(
            fence.0.load(Ordering::SeqCst),
            MAX_ATTEMPTS as usize,
            "the fence asked before each"
        );
        // Each attempt ended at its deadline, before the next was fenced.
        for pair in starts.windows(2) {
            assert!(pair[1] - pair[0] >= MUTATION_ATTEMPT_DEADLINE);
            assert!(
                pair[1] - pair[0]
                    <= MUTATION_ATTEMPT_DEADLINE + MAX_BACKOFF + Duration::from_secs(1)
            );
        }
        assert!(started.elapsed() >= MUTATION_ATTEMPT_DEADLINE * MAX_ATTEMPTS);
    }

    #[test]
    fn throttling_slows_every_caller_and_clean_answers_recover() {
        let pace = Pace::new(None);
        assert_eq!(pace.penalty(), Duration::ZERO);
        pace.throttled();
        assert_eq!(pace.penalty(), Duration::from_millis(250));
        for _ in 0..10 {
            pace.throttled();
        }
        assert_eq!(pace.penalty(), Duration::from_millis(MAX_PENALTY_MS));
        for _ in 0..5 {
            pace.answered();
        }
        assert_eq!(pace.penalty(), Duration::from_millis(156));
        pace.answered();
        assert_eq!(pace.penalty(), Duration::ZERO);
    }

    /// Names of this process's threads.
    fn thread_names() -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .map(|tasks| {
                tasks
                    .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                    .map(|name| name.trim().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn paced_requests_wait_on_the_runtime_timer_not_a_timer_thread() {
        let pace = Pace::new(Some(MutationRate::new(20, Some(1)).expect("rate")));
        let started = std::time::Instant::now();
        for _ in 0..3 {
            pace.slot(&Priority::Reaction).await;
        }
        // The second and third requests waited for the bucket (50 ms each)...
        assert!(
            started.elapsed() >= Duration::from_millis(90),
            "{:?}",
            started.elapsed()
        );
        // ...and no thread of governor's timer was started to wake them.
        let names = thread_names();
        assert!(!names.is_empty(), "threads are listed");
        assert!(
            !names.iter().any(|n| n == "futures-timer"),
            "a timer thread was started: {names:?}"
        );
    }

    /// Counts the polls of a future: each one after the first is a wake-up.
    struct Polls<F> {
        inner: std::pin::Pin<Box<F>>,
        count: std::sync::Arc<AtomicUsize>,
    }

    impl<F: Future> Future for Polls<F> {
        type Output = F::Output;
        fn poll(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<F::Output> {
            self.count.fetch_add(1, Ordering::Relaxed);
            self.inner.as_mut().poll(cx)
        }
    }

    /// Many reactions waiting at once (a rollout) each wake about once for their slot,
    /// not once for every slot granted before theirs.
    #[tokio::test]
    async fn waiting_reactions_wake_once_for_their_slot_not_for_every_slot() {
        const WAITERS: usize = 16;
        let pace = Pace::new(Some(MutationRate::new(100, Some(1)).expect("rate")));
        let polls = std::sync::Arc::new(AtomicUsize::new(0));
        let started = std::time::Instant::now();
        // FuturesUnordered polls only the waiters that were woken (`join_all` would poll
        // them all whenever one is).
        let waits: futures::stream::FuturesUnordered<_> = (0..WAITERS)
            .map(|_| Polls {
                inner: Box::pin(async {
                    pace.slot(&Priority::Reaction).await;
                    started.elapsed()
                }),
                count: polls.clone(),
            })
            .collect();
        let mut waits = std::pin::pin!(futures::StreamExt::collect::<Vec<_>>(waits));
        assert!(futures::poll!(waits.as_mut()).is_pending());
        // The race: all but the first (which took the free slot) wait at once.
        assert_eq!(pace.urgent_waiting.load(Ordering::SeqCst), WAITERS - 1);
        let done = waits.await;
        // One slot every 10 ms: the last waited for 15 of them.
        let last = done.iter().max().copied().unwrap_or_default();
        assert!(last >= Duration::from_millis(140), "{done:?}");
        // Each waiter: its first poll, a wake-up for its turn, one for its slot (and a
        // spare for a timer that fires early). Waking every waiter at every slot would be
        // ~WAITERS²/2 = 128 polls.
        let polls = polls.load(Ordering::Relaxed);
        assert!(polls <= 4 * WAITERS, "{polls} polls for {WAITERS} waiters");
    }

    /// A verification waiting behind other background requests jumps the queue once a
    /// pod change for its group promotes it (the change waits for it to end).
    #[tokio::test]
    async fn promoted_background_work_stops_yielding() {
        let pace = Pace::new(Some(MutationRate::new(5, Some(1)).expect("rate")));
        let start = std::time::Instant::now();
        let promotions: Vec<crate::groups::Promotion> = (0..4)
            .map(|_| crate::groups::Promotion::default())
            .collect();
        let pace = &pace;
        let waits = promotions.iter().map(|p| async move {
            let priority = Priority::Background(p.clone());
            crate::groups::until_stood_down(p.clone(), async move {
                pace.slot(&priority).await;
                start.elapsed()
            })
            .await
            .expect("promoted, not stood down")
        });
        let promote_last = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            promotions[3].promote();
        };
        let (done, ()) = tokio::join!(futures::future::join_all(waits), promote_last);
        // One slot every 200 ms: the first waiter takes the one there is, the promoted
        // fourth the next, the second and third after it.
        let promoted = done[3];
        assert!(
            promoted < done[1] && promoted < done[2],
            "the promoted request got its slot at {promoted:?}, the others at {done:?}"
        );
        assert!(promoted < Duration::from_millis(350), "{done:?}");
    }

    /// A pod change for the group of background work that has sent nothing yet makes
    /// it stand down where it waits, taking no slot; work that has sent a call is
    /// promoted instead and goes on.
    #[tokio::test]
    async fn work_that_has_sent_nothing_stands_down_when_its_groups_change_arrives() {
        let pace = Pace::new(Some(MutationRate::new(2, Some(1)).expect("rate")));
        let start = std::time::Instant::now();
        let (sent, waiting) = (
            crate::groups::Promotion::default(),
            crate::groups::Promotion::default(),
        );
        let calls = AtomicUsize::new(0);
        let work = |p: &crate::groups::Promotion, n: usize| {
            let (pace, calls) = (&pace, &calls);
            let priority = Priority::Background(p.clone());
            crate::groups::until_stood_down(p.clone(), async move {
                for _ in 0..n {
                    pace.slot(&priority).await;
                    calls.fetch_add(1, Ordering::SeqCst);
                }
                start.elapsed()
            })
        };
        // The first work takes the slot there is and waits for a second; the other
        // waits behind it for its first. 50 ms in, a change arrives for each.
        let changes = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            sent.change_arrived();
            waiting.change_arrived();
            start.elapsed()
        };
        let (went_on, stood_down, changed) =
            tokio::join!(work(&sent, 2), work(&waiting, 1), changes);
        assert_eq!(stood_down, None, "the work that had sent nothing went on");
        let went_on = went_on.expect("the work that had sent a call was dropped");
        // One slot every 500 ms: the promoted work's second call takes the next one
        // (500 ms), the next call after it the one after (1 s), and the work that stood
        // down took none (it would have pushed that call to 1.5 s).
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert!(went_on < Duration::from_millis(750), "{went_on:?}");
        let reaction = async {
            pace.slot(&Priority::Reaction).await;
            start.elapsed()
        };
        let reacted = reaction.await;
        assert!(
            reacted < Duration::from_millis(1_250),
            "a slot was taken for the work that stood down: the next call went at {reacted:?} (change at {changed:?})"
        );
    }

    /// Under the template's resync share of the Describe budget (8 calls in 2 s),
    /// queued verifications take three slots a second, evenly spaced, and leave two a
    /// window: a reaction's two calls (health, then tags) go out at once, though
    /// verifications were still waiting.
    #[tokio::test]
    async fn under_a_share_verifications_leave_a_reaction_its_slots() {
        let rate = MutationRate::new(8, None).expect("rate").share_over(
            0.5,
            1,
            super::super::DESCRIBE_WINDOW_SECONDS,
        );
        assert_eq!(rate.per_window(), 8);
        let pace = Pace::new(Some(rate));
        let start = std::time::Instant::now();
        let verifications = futures::future::join_all((0..12).map(|_| async {
            pace.slot(&Priority::background()).await;
            start.elapsed()
        }));
        let reaction = async {
            // Just after a verification took its slot: under a 1-s window of 4, the
            // second call would wait ~300 ms for the oldest of them to leave.
            tokio::time::sleep(Duration::from_millis(1030)).await;
            let asked = start.elapsed();
            pace.slot(&Priority::Reaction).await;
            let first = start.elapsed();
            pace.slot(&Priority::Reaction).await;
            (asked, first, start.elapsed())
        };
        let (verified, (asked, first, second)) = tokio::join!(verifications, reaction);
        let before = |t: Duration| verified.iter().filter(|&&v| v < t).count();
        assert_eq!(before(Duration::from_millis(1000)), 3, "{verified:?}");
        assert!(
            verified.iter().filter(|&&v| v > asked).count() >= 6,
            "the verifications were done before the reaction came: {verified:?}"
        );
        assert!(
            first - asked < Duration::from_millis(50),
            "the reaction waited {:?} for its first call; verifications at {verified:?}",
            first - asked
        );
        assert!(
            second - first < Duration::from_millis(50),
            "the reaction's second call waited {:?}; verifications at {verified:?}",
            second - first
        );
    }

    /// Background work that found a change goes ahead of queued re-verifications, and
    /// still yields to a reaction.
    #[tokio::test]
    async fn background_work_that_found_a_change_goes_ahead_of_re_verifications() {
        let pace = Pace::new(Some(MutationRate::new(10, Some(1)).expect("rate")));
        let start = std::time::Instant::now();
        let background = |change: bool, after: u64| {
            let promotion = crate::groups::Promotion::default();
            if change {
                promotion.found_change();
            }
            let pace = &pace;
            async move {
                let priority = Priority::Background(promotion.clone());
                crate::groups::until_stood_down(promotion, async move {
                    tokio::time::sleep(Duration::from_millis(after)).await;
                    pace.slot(&priority).await;
                    start.elapsed()
                })
                .await
                .expect("never promoted")
            }
        };
        // Five re-verifications queue first; 30 ms later a verification that found a
        // change, and 60 ms later a reaction.
        let at_rest = futures::future::join_all((0..5).map(|_| background(false, 0)));
        let change = background(true, 30);
        let reaction = async {
            tokio::time::sleep(Duration::from_millis(60)).await;
            pace.slot(&Priority::Reaction).await;
            start.elapsed()
        };
        let (at_rest, change, reaction) = tokio::join!(at_rest, change, reaction);
        // One slot every 100 ms: the first re-verification takes the one there is, the
        // reaction the next, the change the one after; the other four come after it.
        let mut later: Vec<Duration> = at_rest[1..].to_vec();
        later.sort_unstable();
        assert!(
            reaction < change && change < later[0],
            "reaction {reaction:?}, change {change:?}, re-verifications {at_rest:?}"
        );
    }
}
