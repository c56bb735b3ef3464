//! The client-side rate limit for mutating ELBv2 calls.
//!
//! RegisterTargets and DeregisterTargets draw from a per-account, per-region token
//! bucket shared with every other tool in the account; one limiter shared by all
//! concurrent reconciles of a function keeps tgsync from draining it in a burst (the
//! seeds' rate-limited workqueue).

use std::num::NonZeroU32;
use std::time::Duration;

use governor::{Quota, RateLimiter};

use super::limiter::{Limiter, SlidingWindow};
use thiserror::Error;

/// Calls per second and burst for one kind of ELBv2 call (RegisterTargets /
/// DeregisterTargets, or the Describe calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MutationRate {
    per_second: NonZeroU32,
    burst: NonZeroU32,
    /// Time per call: `1 s / per_second`.
    period: Duration,
    /// A [`MutationRate::share`]: at most this many calls in any window of
    /// `window_seconds`, back to back while it has room (`None`: the token bucket of
    /// `period` and `burst`).
    window: Option<NonZeroU32>,
    /// How long a share's window is, in seconds (1 for a bucket).
    window_seconds: NonZeroU32,
}

/// The window of a container's share of the Describe budget, in seconds: two, so a
/// reaction's two Describes (the plan's health read and the tag re-read) both find a
/// slot while background work keeps the pace of a 1-s window that holds one back. A
/// container then sends at most its 2-s share within one second, so the deployment at
/// most twice its budget, and the budget on average over any 2 s: ELBv2's Describe
/// bucket holds 40 tokens and refills 10 a second (the ELB guide's request throttling
/// page), so a burst of twice the default budget of 8 stays well inside it. Mutations
/// keep 1-s windows: a reaction makes one (per direction).
pub const DESCRIBE_WINDOW_SECONDS: u32 = 2;

/// Five calls per second, burst five: well under ELBv2's documented mutation rate, so
/// other tools in the account keep their share.
const DEFAULT_PER_SECOND: NonZeroU32 = NonZeroU32::MIN.saturating_add(4);

impl Default for MutationRate {
    fn default() -> Self {
        Self {
            per_second: DEFAULT_PER_SECOND,
            burst: DEFAULT_PER_SECOND,
            period: Duration::from_secs(1) / DEFAULT_PER_SECOND.get(),
            window: None,
            window_seconds: NonZeroU32::MIN,
        }
    }
}

/// A rate-limit setting that cannot work.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum RateError {
    /// Zero calls per second would block every registration forever.
    #[error(
        "ELBv2 mutation rate must be at least 1 call per second (got 0); fix the rate-limit setting"
    )]
    ZeroRate,
    /// A zero burst would block every registration forever.
    #[error(
        "ELBv2 mutation burst must be at least 1 call (got 0); fix the burst setting or leave it unset"
    )]
    ZeroBurst,
}

impl MutationRate {
    /// `per_second` calls per second with a burst of `burst` (default: the rate), as read
    /// from configuration; zero is rejected rather than silently meaning "never".
    pub fn new(per_second: u32, burst: Option<u32>) -> Result<Self, RateError> {
        let per_second = NonZeroU32::new(per_second).ok_or(RateError::ZeroRate)?;
        let burst = match burst {
            None => per_second,
            Some(b) => NonZeroU32::new(b).ok_or(RateError::ZeroBurst)?,
        };
        Ok(Self {
            per_second,
            burst,
            period: Duration::from_secs(1) / per_second.get(),
            window: None,
            window_seconds: NonZeroU32::MIN,
        })
    }

    /// The rate of one of `containers` containers (a function's reserved concurrency)
    /// of a function that gets `fraction` (0–1) of this deployment-wide budget: at most
    /// `⌊budget × fraction / containers⌋` calls (at least one) in any second, back to
    /// back while the second has room. So the containers of every function together
    /// stay within the budget in every 1-s window, however many run at once, and a
    /// container that has been quiet sends its next few calls without waiting.
    pub fn share(self, fraction: f64, containers: u32) -> Self {
        self.share_over(fraction, containers, 1)
    }

    /// [`MutationRate::share`] over a window of `seconds` (at least one): at most
    /// `⌊budget × fraction / containers × seconds⌋` calls (at least one) in any window
    /// of that length, so the budget holds on average over it, and a container can
    /// send the whole window's calls back to back (see [`DESCRIBE_WINDOW_SECONDS`]).
    pub fn share_over(self, fraction: f64, containers: u32, seconds: u32) -> Self {
        let seconds = NonZeroU32::new(seconds).unwrap_or(NonZeroU32::MIN);
        let per_window = f64::from(self.per_second.get()) * fraction.clamp(0.0, 1.0)
            / f64::from(containers.max(1))
            * f64::from(seconds.get());
        let per_window = NonZeroU32::new(per_window.floor() as u32).unwrap_or(NonZeroU32::MIN);
        Self {
            per_second: self.per_second,
            burst: per_window,
            period: super::limiter::window(seconds.get()) / per_window.get(),
            window: Some(per_window),
            window_seconds: seconds,
        }
    }

    /// One container's shares of the deployment's two budgets (calls per second), as
    /// the functions take them: `(mutations, describes)`, the mutations over 1-s
    /// windows, the Describes over [`DESCRIBE_WINDOW_SECONDS`].
    pub fn container_shares(
        mutations: u32,
        describes: u32,
        fraction: f64,
        containers: u32,
    ) -> Result<(Self, Self), RateError> {
        Ok((
            Self::new(mutations, None)?.share(fraction, containers),
            Self::new(describes, None)?.share_over(fraction, containers, DESCRIBE_WINDOW_SECONDS),
        ))
    }

    /// How long the window of [`MutationRate::per_window`] is, in seconds.
    pub fn window_seconds(&self) -> u32 {
        self.window_seconds.get()
    }

    /// The most calls this rate lets out in any window of
    /// [`MutationRate::window_seconds`] (both ends included).
    pub fn per_window(&self) -> u32 {
        if let Some(calls) = self.window {
            return calls.get();
        }
        let calls = (1.0 / self.period.as_secs_f64()).floor() as u32;
        calls + self.burst.get()
    }

    /// Calls per second this rate allows when busy (fractional for a share).
    pub fn calls_per_second(&self) -> f64 {
        1.0 / self.period.as_secs_f64()
    }

    /// Calls per second, for logs and reports.
    pub fn per_second(&self) -> u32 {
        self.per_second.get()
    }

    /// Calls allowed back to back, for logs and reports.
    pub fn burst(&self) -> u32 {
        self.burst.get()
    }

    /// The limiter all calls of its kind of one adapter (and its clones) wait on.
    pub(crate) fn limiter(&self) -> Limiter {
        if let Some(calls) = self.window {
            return Limiter::Window(SlidingWindow::new(calls.get(), self.window_seconds.get()));
        }
        let quota = Quota::with_period(self.period)
            .unwrap_or_else(|| Quota::per_second(self.per_second))
            .allow_burst(self.burst);
        Limiter::Bucket(RateLimiter::direct(quota))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_defaults_to_rate_and_zero_is_rejected() {
        let r = MutationRate::new(7, None).unwrap();
        assert_eq!((r.per_second(), r.burst()), (7, 7));
        assert_eq!(MutationRate::new(0, None), Err(RateError::ZeroRate));
        assert_eq!(MutationRate::new(3, Some(0)), Err(RateError::ZeroBurst));
        assert_eq!(MutationRate::default().per_second(), 5);
    }

    #[test]
    fn shares_of_a_budget_stay_within_it_in_every_second() {
        // The template's split: 50 % for the one resync container, 30 % for two
        // pod-events containers, 20 % for the one manual container.
        for budget in [5, 8, 20, 100] {
            let whole = MutationRate::new(budget, None).unwrap();
            let (resync, pod_events, manual) = (
                whole.share(0.5, 1),
                whole.share(0.3, 2),
                whole.share(0.2, 1),
            );
            let worst = resync.per_window() + 2 * pod_events.per_window() + manual.per_window();
            assert!(worst <= budget, "{budget}: {worst} in one second");
            assert!(
                resync.per_window() >= 2,
                "{budget}: the resync is not starved"
            );
        }
        let five = MutationRate::new(5, None).unwrap();
        assert_eq!(five.share(0.5, 1).per_window(), 2);
        assert_eq!(five.share(0.3, 2).per_window(), 1);
        assert_eq!(five.share(0.2, 1).per_window(), 1);
        assert_eq!(MutationRate::new(8, Some(1)).unwrap().per_window(), 9);
    }

    #[test]
    fn a_share_over_two_seconds_holds_two_seconds_of_calls() {
        for budget in [5, 8, 20, 100] {
            let whole = MutationRate::new(budget, None).unwrap();
            let over = |fraction, containers| {
                whole.share_over(fraction, containers, DESCRIBE_WINDOW_SECONDS)
            };
            let (resync, pod_events, manual) = (over(0.5, 1), over(0.3, 2), over(0.2, 1));
            let worst = resync.per_window() + 2 * pod_events.per_window() + manual.per_window();
            assert!(worst <= 2 * budget, "{budget}: {worst} in two seconds");
            assert_eq!(resync.window_seconds(), 2);
        }
        let eight = MutationRate::new(8, None).unwrap();
        assert_eq!(eight.share_over(0.5, 1, 2).per_window(), 8);
        assert_eq!(eight.share_over(0.3, 2, 2).per_window(), 2);
        assert_eq!(eight.share_over(0.2, 1, 2).per_window(), 3);
        assert_eq!(
            eight.share_over(0.5, 1, 0).per_window(),
            4,
            "at least one second"
        );
    }

    #[tokio::test]
    async fn limiter_allows_a_burst_then_waits() {
        let limiter = MutationRate::new(20, Some(2)).unwrap().limiter();
        let start = std::time::Instant::now();
        for _ in 0..4 {
            limiter.ready().await;
        }
        // Two immediately, then two more at 50 ms intervals.
        assert!(start.elapsed() >= std::time::Duration::from_millis(90));
    }
}
