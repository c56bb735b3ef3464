//! When a scheduled resync may skip DescribeTargetHealth for a group: its desired set is
//! the one last verified, and its turn in the verification rotation has not come.
//!
//! Pod changes always change the desired fingerprint, and every change tgsync makes
//! rewrites the checkpoint, so those are acted on at once; only *external* drift (a
//! target removed or added by hand) waits for the group's turn, which the rotation
//! spreads over the account's Describe budget.

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

/// How a scheduled run spends its share of the account's Describe budget on
/// re-verifying groups that nothing has changed (the only way to find hand edits).
///
/// Groups are ranked by a stable hash of their ARN and split into `cycle` slots of at
/// most `per_run` groups; run `k` (the schedule period's index since the epoch) verifies
/// slot `k mod cycle`. So while the fleet fits the budget (`cycle` = 1) every group is
/// verified on every run, and beyond it each group is verified once every `cycle` runs
/// — the groups whose last re-verification is oldest, with no state to store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// Runs in one full cycle.
    pub cycle: u64,
    /// This run's slot.
    pub slot: u64,
}

impl Rotation {
    /// The rotation for `groups` bound groups with room for `per_run` re-verifications
    /// per run, at run index `run`.
    pub fn new(groups: usize, per_run: usize, run: u64) -> Self {
        let per_run = per_run.max(1) as u64;
        let cycle = (groups as u64).div_ceil(per_run).max(1);
        Self {
            cycle,
            slot: run % cycle,
        }
    }

    /// Whether the group of rank `rank` (its position in [`rank_order`]) is re-verified
    /// this run.
    pub fn due(&self, rank: usize) -> bool {
        rank as u64 % self.cycle == self.slot
    }

    /// How long a hand edit of an unchanged group can go unnoticed: one full cycle of
    /// schedule periods.
    pub fn detection_bound(&self, period: Duration) -> Duration {
        period.saturating_mul(u32::try_from(self.cycle).unwrap_or(u32::MAX))
    }
}

/// The order in which groups take their rotation slots: by a stable hash of the ARN, so
/// the split does not depend on discovery order and neighbours in name do not share a
/// slot.
pub fn rank_order<'a>(arns: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut ranked: Vec<&str> = arns.collect();
    ranked.sort_by_key(|a| (fingerprint_str(a), *a));
    ranked
}

/// Whether a scheduled run may leave a group's target health unread: the desired set is
/// exactly the one last verified (every change tgsync makes or learns of rewrites or
/// clears the checkpoint in the same write), and the group's rotation slot is not due.
pub fn may_skip(checkpoint: Option<&Checkpoint>, desired: u64, due: bool) -> bool {
    !due && checkpoint.is_some_and(|c| c.desired == desired)
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
    fn small_fleets_verify_every_run_and_large_ones_in_turn() {
        let small = Rotation::new(100, 120, 7);
        assert_eq!(small.cycle, 1);
        assert!((0..100).all(|r| small.due(r)));
        assert_eq!(
            small.detection_bound(Duration::from_secs(60)),
            Duration::from_secs(60)
        );
        // 1,000 groups at 120 per run: 9 runs per cycle, every group exactly once.
        let mut seen = vec![0u32; 1000];
        for run in 0..9 {
            let r = Rotation::new(1000, 120, 1_000 + run);
            let due: Vec<usize> = (0..1000).filter(|&g| r.due(g)).collect();
            assert!(due.len() <= 120, "{}", due.len());
            for g in due {
                seen[g] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
        assert_eq!(
            Rotation::new(1000, 120, 0).detection_bound(Duration::from_secs(60)),
            Duration::from_secs(540)
        );
        let cp = Checkpoint {
            desired: 7,
            verified_at: UnixMillis(0),
        };
        assert!(may_skip(Some(&cp), 7, false));
        assert!(!may_skip(Some(&cp), 7, true), "its turn");
        assert!(!may_skip(Some(&cp), 8, false), "desired changed");
        assert!(!may_skip(None, 7, false), "never verified");
        let ranked = rank_order(["b", "a", "c"].into_iter());
        assert_eq!(ranked.len(), 3);
        assert_eq!(ranked, rank_order(["c", "b", "a"].into_iter()));
    }
}
