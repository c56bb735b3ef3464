//! The two shapes a [`super::MutationRate`] can take on the wire.
//!
//! A rate set outright (`per_second`, `burst`) is a token bucket (governor's GCRA). A
//! container's share of the deployment's budget ([`super::MutationRate::share`]) is a
//! sliding window instead: at most `calls` in any window (1 s, or 2 s for Describes:
//! [`super::DESCRIBE_WINDOW_SECONDS`]), and back to back while the window has room.
//! Both keep the deployment within its budget; the window does it without spacing a
//! container's calls evenly, so a reaction's two Describe calls (target health, then
//! tags) go out together instead of a period apart. Background work keeps an even pace
//! under the window and leaves the last slot of each second to reactions: `calls - 1`
//! a 1-s window, `calls - 2` a 2-s one, so a reaction's two Describes both find one.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use governor::DefaultDirectRateLimiter;

use crate::sync::lock;

/// The window of a share of `seconds`, with 10 ms to spare: a closed window of that
/// length then holds at most `calls`, also with a few milliseconds of difference
/// between the calls' transit times.
pub(crate) fn window(seconds: u32) -> Duration {
    Duration::from_secs(u64::from(seconds)) + Duration::from_millis(10)
}

/// What one kind of ELBv2 call waits on.
#[derive(Debug)]
pub(crate) enum Limiter {
    /// A token bucket.
    Bucket(DefaultDirectRateLimiter),
    /// At most so many calls in any [`WINDOW`].
    Window(SlidingWindow),
}

impl Limiter {
    /// Takes a slot if one is free now, else says how long until one is. Background
    /// work (discovery, verifications) under a window of more than one call leaves the
    /// window's last slot free and spaces its calls evenly, so a reaction finds a slot
    /// at once and the next frees soon; a bucket treats every caller alike.
    pub(crate) fn check(&self, background: bool) -> Option<Duration> {
        match self {
            Self::Bucket(bucket) => {
                use governor::clock::Clock as _;
                // The limiter's own clock: a new `DefaultClock` probes the CPU (CPUID, a
                // VM exit on virtual machines such as Lambda's) every time it is made.
                bucket
                    .check()
                    .err()
                    .map(|not_until| not_until.wait_time_from(bucket.clock().now()))
            }
            Self::Window(window) => window.check(background, tokio::time::Instant::now()),
        }
    }

    /// Waits for a slot on the runtime's own timer. (governor's `until_ready` waits on
    /// a timer thread of its own: two thread wake-ups per paced call, which on a
    /// Lambda's fraction of a CPU is time taken from the calls.)
    pub(crate) async fn ready(&self) {
        while let Some(wait) = self.check(false) {
            tokio::time::sleep(wait).await;
        }
    }
}

/// At most `calls` calls in any [`window`]: the times of the last `calls` granted.
#[derive(Debug)]
pub(crate) struct SlidingWindow {
    calls: usize,
    span: Duration,
    /// Slots background work leaves free for reactions: one a second while the
    /// window holds two calls a second, else one while it holds more than one.
    keep: usize,
    granted: Mutex<VecDeque<tokio::time::Instant>>,
}

impl SlidingWindow {
    /// A window of `calls` (at least one) in `seconds` (at least one).
    pub(crate) fn new(calls: u32, seconds: u32) -> Self {
        let calls = usize::try_from(calls).unwrap_or(usize::MAX).max(1);
        let seconds = seconds.max(1);
        let per_window = usize::try_from(seconds).unwrap_or(usize::MAX);
        let keep = match calls {
            1 => 0,
            calls if calls >= 2 * per_window => per_window,
            _ => 1,
        };
        Self {
            calls,
            span: window(seconds),
            keep,
            granted: Mutex::new(VecDeque::with_capacity(calls)),
        }
    }

    /// [`Limiter::check`] at `now`.
    fn check(&self, background: bool, now: tokio::time::Instant) -> Option<Duration> {
        let (keep, spacing) = match self.keep {
            keep if background && keep > 0 => {
                let spaced = u32::try_from(self.calls - keep).unwrap_or(u32::MAX);
                (keep, self.span / spaced)
            }
            _ => (0, Duration::ZERO),
        };
        let span = self.span;
        let mut granted = lock(&self.granted);
        while granted
            .front()
            .is_some_and(|&at| now.saturating_duration_since(at) >= span)
        {
            granted.pop_front();
        }
        // Enough of the oldest grants must leave the window to make room (`keep` is
        // below `calls`, so that grant is in the window)...
        let taken = granted.len() + keep;
        let by_count = (taken >= self.calls)
            .then(|| granted.get(taken - self.calls).map_or(now, |&at| at) + span);
        // ...and background work waits its spacing after the last grant.
        let by_spacing = granted.back().map(|&last| last + spacing);
        match by_count.max(by_spacing) {
            Some(at) if at > now => Some(at - now),
            _ => {
                granted.push_back(now);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    const WINDOW: Duration = Duration::from_millis(1010);

    #[test]
    fn a_window_lets_its_calls_go_back_to_back_then_waits_for_the_oldest() {
        let w = SlidingWindow::new(3, 1);
        let t0 = tokio::time::Instant::now();
        assert_eq!(w.check(false, t0), None);
        assert_eq!(w.check(false, t0 + ms(10)), None);
        assert_eq!(w.check(false, t0 + ms(20)), None);
        // Full: the next slot is the first grant's, one window later.
        assert_eq!(w.check(false, t0 + ms(30)), Some(WINDOW - ms(30)));
        assert_eq!(w.check(false, t0 + WINDOW), None);
        assert_eq!(w.check(false, t0 + WINDOW), Some(ms(10)));
    }

    #[test]
    fn background_leaves_a_reaction_its_slot_and_spaces_its_calls() {
        let w = SlidingWindow::new(3, 1);
        let t0 = tokio::time::Instant::now();
        assert_eq!(w.check(true, t0), None);
        // Background calls are spaced half a window apart (two of the three slots).
        assert_eq!(w.check(true, t0 + ms(5)), Some(WINDOW / 2 - ms(5)));
        assert_eq!(w.check(false, t0 + ms(100)), None);
        // With a reaction's call in the window, background keeps the last slot free:
        // it waits for the first grant to leave.
        assert_eq!(w.check(true, t0 + WINDOW / 2), Some(WINDOW - WINDOW / 2));
        // A reaction takes it at once.
        assert_eq!(w.check(false, t0 + WINDOW / 2), None);
        assert_eq!(w.check(false, t0 + ms(600)), Some(WINDOW - ms(600)));
        // A window of one keeps nothing back (background would never get a slot).
        let one = SlidingWindow::new(1, 1);
        assert_eq!(one.check(true, t0), None);
        assert_eq!(one.check(true, t0 + ms(1)), Some(WINDOW - ms(1)));
    }

    /// Under a 2-s window of 8 (the template's resync share of the Describe budget),
    /// background work keeps its pace of 3 a second and leaves two slots: a reaction's
    /// two calls both go at once. A reaction's second call under the 1-s window of 4
    /// waits for the oldest background grant to leave.
    #[test]
    fn a_two_second_window_leaves_a_reaction_both_its_calls() {
        let t0 = tokio::time::Instant::now();
        let saturate = |w: &SlidingWindow| {
            let mut at = Duration::ZERO;
            let mut grants = Vec::new();
            while at < ms(3000) {
                match w.check(true, t0 + at) {
                    None => grants.push(at),
                    Some(wait) => at += wait,
                }
            }
            grants
        };
        let two = SlidingWindow::new(8, 2);
        let grants = saturate(&two);
        // Evenly spaced, 6 a window of 2.01 s: as many a second as the 1-s window's 3.
        assert_eq!(grants.len(), 9, "{grants:?}");
        assert_eq!(grants[1], window(2) / 6);
        let reaction = t0 + ms(3000);
        assert_eq!(two.check(false, reaction), None);
        assert_eq!(two.check(false, reaction + ms(5)), None);
        // Background then waits for room again.
        assert!(two.check(true, reaction + ms(10)).is_some());

        let one = SlidingWindow::new(4, 1);
        let grants = saturate(&one);
        assert_eq!(grants.len(), 9, "{grants:?}");
        assert_eq!(one.check(false, reaction), None);
        let second = one.check(false, reaction + ms(5));
        assert!(
            second.is_some_and(|wait| wait > Duration::ZERO && wait <= WINDOW / 3),
            "{second:?}"
        );
    }

    /// Whatever the callers ask, no closed window holds more than `calls` grants.
    #[test]
    fn no_window_holds_more_than_its_calls() {
        for (calls, seconds) in (1..=6u32).flat_map(|c| [(c, 1), (c, 2), (2 * c, 2)]) {
            let w = SlidingWindow::new(calls, seconds);
            let span = Duration::from_secs(u64::from(seconds));
            let t0 = tokio::time::Instant::now();
            let mut grants = Vec::new();
            let mut rng = fastrand::Rng::with_seed(u64::from(calls));
            let mut at = Duration::ZERO;
            while at < Duration::from_secs(20) {
                match w.check(rng.bool(), t0 + at) {
                    None => grants.push(at),
                    Some(wait) => {
                        assert!(wait > Duration::ZERO && wait <= window(seconds), "{wait:?}");
                        // Callers come back when told, or sooner.
                        at += if rng.bool() { wait } else { wait / 2 };
                        continue;
                    }
                }
                at += ms(rng.u64(0..50));
            }
            let most = grants
                .iter()
                .map(|&from| {
                    grants
                        .iter()
                        .filter(|&&g| g >= from && g <= from + span)
                        .count()
                })
                .max()
                .unwrap_or(0);
            assert_eq!(
                most, calls as usize,
                "{calls} a window of {seconds} s: {most} in one"
            );
        }
    }
}
