//! When a scheduled resync may skip DescribeTargetHealth for a group: its desired set is
//! unchanged since the last full verification, and that verification is recent enough.
//!
//! Pod changes always change the desired fingerprint, so they are acted on at once; only
//! *external* drift (a target removed or added by hand) waits, at most one verification
//! interval plus one schedule period. The interval is shortened by up to half per group,
//! deterministically, so groups that converged together do not re-verify together.

use std::time::Duration;

use super::backoff::UnixMillis;
use super::target::Target;

/// The last full verification of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// [`fingerprint`] of the desired set that was verified.
    pub desired: u64,
    /// When target health was last read and found (or made) right.
    pub verified_at: UnixMillis,
}

/// FNV-1a 64 over the sorted `ip:port` forms: stable across processes and versions, so a
/// checkpoint written by one function is understood by the other.
pub fn fingerprint<'a>(targets: impl Iterator<Item = &'a Target>) -> u64 {
    let mut sorted: Vec<&Target> = targets.collect();
    sorted.sort_unstable();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for t in sorted {
        for byte in t.to_string().bytes().chain(std::iter::once(b'\n')) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// When `group`'s checkpoint is due for a new verification.
pub fn due_at(checkpoint: &Checkpoint, group: &str, interval: Duration) -> UnixMillis {
    let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    let spread = if interval_ms < 2 {
        0
    } else {
        fingerprint_str(group) % (interval_ms / 2)
    };
    UnixMillis(
        checkpoint
            .verified_at
            .0
            .saturating_add(interval_ms - spread),
    )
}

/// Whether the health read may be skipped now.
pub fn may_skip(
    checkpoint: Option<&Checkpoint>,
    desired: u64,
    group: &str,
    now: UnixMillis,
    interval: Duration,
) -> bool {
    checkpoint.is_some_and(|c| c.desired == desired && now < due_at(c, group, interval))
}

fn fingerprint_str(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Target {
        s.parse().unwrap()
    }

    #[test]
    fn fingerprint_ignores_order_and_sees_every_change() {
        let a = [t("10.0.0.1:80"), t("10.0.0.2:80")];
        let b = [t("10.0.0.2:80"), t("10.0.0.1:80")];
        assert_eq!(fingerprint(a.iter()), fingerprint(b.iter()));
        assert_ne!(fingerprint(a.iter()), fingerprint(a[..1].iter()));
        assert_ne!(
            fingerprint(a.iter()),
            fingerprint([t("10.0.0.1:80"), t("10.0.0.2:81")].iter())
        );
        assert_ne!(fingerprint(std::iter::empty()), fingerprint(a[..1].iter()));
        // Pinned (FNV-1a 64 of "10.0.0.1:80\n", computed independently): the value is
        // stored in DynamoDB and must not change between versions.
        assert_eq!(
            fingerprint([t("10.0.0.1:80")].iter()),
            0xa46c_7d1b_5827_2b7d
        );
    }

    #[test]
    fn skipping_is_bounded_by_the_interval_and_spread_per_group() {
        let interval = Duration::from_secs(600);
        let cp = Checkpoint {
            desired: 7,
            verified_at: UnixMillis(1_000_000),
        };
        let mut dues = std::collections::BTreeSet::new();
        for g in 0..200 {
            let group = format!("arn:aws:elasticloadbalancing:us-east-1:1:targetgroup/g{g}/x");
            let due = due_at(&cp, &group, interval);
            assert!(
                due.0 > 1_000_000 + 300_000 && due.0 <= 1_000_000 + 600_000,
                "{due:?}"
            );
            assert!(may_skip(
                Some(&cp),
                7,
                &group,
                UnixMillis(due.0 - 1),
                interval
            ));
            assert!(!may_skip(Some(&cp), 7, &group, due, interval));
            assert!(
                !may_skip(Some(&cp), 8, &group, UnixMillis(1_000_001), interval),
                "desired changed"
            );
            dues.insert(due.0 / 60_000);
        }
        assert!(
            dues.len() >= 5,
            "due times spread over the window: {dues:?}"
        );
        assert!(!may_skip(None, 7, "g", UnixMillis(0), interval));
    }
}
