//! Per-group exponential backoff with jitter, so one broken group (bad IAM, a deleted
//! target group, a throttled account) is retried ever less often instead of burning the
//! ELBv2 token bucket every minute — the seeds' rate-limited workqueue, made stateless.
//!
//! Time and randomness come in as arguments; the state is a small value the ledger stores.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch: what the state table stores and the clock reads.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    /// `self + d`, saturating.
    pub fn plus(self, d: Duration) -> Self {
        Self(
            self.0
                .saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    /// Whole seconds, for DynamoDB TTL attributes.
    pub fn as_secs(self) -> u64 {
        self.0 / 1000
    }
}

/// The delay range: the first retry after about `min`, doubling to at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// Smallest delay (1 s by default).
    pub min: Duration,
    /// Largest delay (1000 s by default, as the seeds' workqueue).
    pub max: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            min: Duration::from_secs(1),
            max: Duration::from_secs(1000),
        }
    }
}

/// A group's failure record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackoffState {
    /// Consecutive failed reconciles.
    pub failures: u32,
    /// No automatic attempt before this time.
    pub next_attempt: UnixMillis,
}

/// Whether a reconcile may run now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Go ahead.
    Proceed,
    /// Backing off until this time.
    Wait {
        /// When the next attempt is allowed.
        until: UnixMillis,
    },
}

impl BackoffPolicy {
    /// The delay after `failures` consecutive failures (≥ 1): the ceiling
    /// `min · 2^(failures−1)` capped at `max`, jittered uniformly into its upper half
    /// ("equal jitter") and never below `min`, so retries of many groups spread out but
    /// still grow.
    pub fn delay(&self, failures: u32, rng: &mut fastrand::Rng) -> Duration {
        let min = self.min.as_millis() as u64;
        let max = (self.max.as_millis() as u64).max(min);
        let exp = failures.saturating_sub(1).min(63);
        let ceiling = min.saturating_mul(1u64 << exp).min(max);
        let low = (ceiling / 2).max(min);
        Duration::from_millis(rng.u64(low..=ceiling.max(low)))
    }

    /// The state after one more failure at `now`.
    pub fn on_failure(
        &self,
        previous: Option<BackoffState>,
        now: UnixMillis,
        rng: &mut fastrand::Rng,
    ) -> BackoffState {
        let failures = previous.map_or(0, |s| s.failures).saturating_add(1);
        BackoffState {
            failures,
            next_attempt: now.plus(self.delay(failures, rng)),
        }
    }

    /// Whether to reconcile now; `force` (a manual resync) ignores the backoff.
    pub fn gate(&self, state: Option<&BackoffState>, now: UnixMillis, force: bool) -> Gate {
        match state {
            Some(s) if !force && s.failures > 0 && now < s.next_attempt => Gate::Wait {
                until: s.next_attempt,
            },
            _ => Gate::Proceed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_and_stay_within_bounds() {
        let p = BackoffPolicy::default();
        let mut rng = fastrand::Rng::with_seed(7);
        for failures in 1..=40 {
            for _ in 0..50 {
                let d = p.delay(failures, &mut rng);
                assert!(d >= Duration::from_secs(1), "{failures}: {d:?}");
                assert!(d <= Duration::from_secs(1000), "{failures}: {d:?}");
                let ceiling = Duration::from_secs(1u64 << (failures - 1).min(20))
                    .min(Duration::from_secs(1000));
                assert!(d <= ceiling && d >= ceiling / 2, "{failures}: {d:?}");
            }
        }
        assert_eq!(p.delay(1, &mut rng), Duration::from_secs(1));
        assert!(p.delay(11, &mut rng) >= Duration::from_secs(500));
    }

    #[test]
    fn seeded_randomness_is_reproducible() {
        let p = BackoffPolicy::default();
        let a: Vec<_> = {
            let mut r = fastrand::Rng::with_seed(42);
            (1..10).map(|f| p.delay(f, &mut r)).collect()
        };
        let b: Vec<_> = {
            let mut r = fastrand::Rng::with_seed(42);
            (1..10).map(|f| p.delay(f, &mut r)).collect()
        };
        assert_eq!(a, b);
    }

    #[test]
    fn gate_follows_the_injected_clock_and_force() {
        let p = BackoffPolicy::default();
        let mut rng = fastrand::Rng::with_seed(1);
        let t0 = UnixMillis(1_000_000);
        let s1 = p.on_failure(None, t0, &mut rng);
        assert_eq!(s1.failures, 1);
        assert_eq!(s1.next_attempt, UnixMillis(1_001_000));
        assert_eq!(
            p.gate(Some(&s1), t0, false),
            Gate::Wait {
                until: s1.next_attempt
            }
        );
        assert_eq!(p.gate(Some(&s1), t0, true), Gate::Proceed);
        assert_eq!(p.gate(Some(&s1), s1.next_attempt, false), Gate::Proceed);
        let s2 = p.on_failure(Some(s1), s1.next_attempt, &mut rng);
        assert_eq!(s2.failures, 2);
        assert!(s2.next_attempt.0 - s1.next_attempt.0 >= 1000);
        // Success is the absence of state (or zero failures): reset.
        assert_eq!(p.gate(None, t0, false), Gate::Proceed);
        assert_eq!(
            p.gate(Some(&BackoffState::default()), t0, false),
            Gate::Proceed
        );
    }
}
