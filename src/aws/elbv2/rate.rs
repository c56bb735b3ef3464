//! The client-side rate limit for mutating ELBv2 calls.
//!
//! RegisterTargets and DeregisterTargets draw from a per-account, per-region token
//! bucket shared with every other tool in the account; one limiter shared by all
//! concurrent reconciles of a function keeps tgsync from draining it in a burst (the
//! seeds' rate-limited workqueue).

use std::num::NonZeroU32;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use thiserror::Error;

/// Calls per second and burst for RegisterTargets / DeregisterTargets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MutationRate {
    per_second: NonZeroU32,
    burst: NonZeroU32,
}

/// Five calls per second, burst five: well under ELBv2's documented mutation rate, so
/// other tools in the account keep their share.
const DEFAULT_PER_SECOND: NonZeroU32 = NonZeroU32::MIN.saturating_add(4);

impl Default for MutationRate {
    fn default() -> Self {
        Self {
            per_second: DEFAULT_PER_SECOND,
            burst: DEFAULT_PER_SECOND,
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
        Ok(Self { per_second, burst })
    }

    /// Calls per second, for logs and reports.
    pub fn per_second(&self) -> u32 {
        self.per_second.get()
    }

    /// Calls allowed back to back, for logs and reports.
    pub fn burst(&self) -> u32 {
        self.burst.get()
    }

    /// The limiter all mutating calls of one adapter (and its clones) wait on.
    pub(crate) fn limiter(&self) -> DefaultDirectRateLimiter {
        RateLimiter::direct(Quota::per_second(self.per_second).allow_burst(self.burst))
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

    #[tokio::test]
    async fn limiter_allows_a_burst_then_waits() {
        let limiter = MutationRate::new(20, Some(2)).unwrap().limiter();
        let start = std::time::Instant::now();
        for _ in 0..4 {
            limiter.until_ready().await;
        }
        // Two immediately, then two more at 50 ms intervals.
        assert!(start.elapsed() >= std::time::Duration::from_millis(90));
    }
}
