//! The newest read of each bound group's tags in this container. Pod events and watch
//! passes start from bindings discovered up to a minute earlier; a pass that changes a
//! group re-reads its tags first when its copy is older than `binding_max_age`. Without
//! this memory every later pass of that minute would find the same old copy and read
//! the tags again: one paced ELBv2 Describe call per event, which is most of what a
//! pod event waits for once the discovery is a few seconds old.
//!
//! The re-read is one DescribeTags, which names up to 20 groups for the same price: it
//! also reads the tags of the container's other bound groups of that account whose
//! reads are oldest, so the next passes of those groups (the changes of a rollout, the
//! full diff's verifications) find a fresh read here instead of waiting for a Describe
//! of their own. Each is held to the same rule as the pass's own read.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::{BoundGroup, Engine};
use crate::aws::elbv2::TAGS_BATCH;
use crate::core::UnixMillis;
use crate::groups::{ElbError, TargetGroupApi};
use crate::pods::PodSource;
use crate::state::StateStore;

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    /// `bound`'s tags read now, in one DescribeTags with those of up to 19 other bound
    /// groups of its account (the stalest reads first), which are remembered for their
    /// own passes when they still bind their groups.
    pub(super) async fn read_tags(
        &self,
        bound: &BoundGroup,
        now: UnixMillis,
        max_age: Duration,
    ) -> Result<std::collections::BTreeMap<String, String>, ElbError> {
        let arn = &bound.group.arn;
        let known = self.known_bindings();
        let others = self.tag_reads.companions(bound, &known, now);
        let mut arns = Vec::with_capacity(others.len() + 1);
        arns.push(arn.clone());
        arns.extend(others.iter().map(|b| b.group.arn.clone()));
        let mut read = match self.groups.tags_of(&arns).await {
            // One group deleted fails the whole call: ask for this one alone, and leave
            // the others out of re-reads until discovery has dropped the deleted one.
            Err(ElbError::NotFound { .. }) if arns.len() > 1 => {
                self.tag_reads.unreadable(&arns[1..], now);
                self.groups.tags_of(&arns[..1]).await?
            }
            read => read?,
        };
        for other in others {
            // Held to the pass's own rule: still bound (a read for another selection
            // is never used, see `fresher`), or forgotten so its pass reads and reports.
            let fresh = read.remove(&other.group.arn).and_then(|tags| {
                let mut group = other.group.clone();
                group.tags = tags;
                self.bind(group, now)?.ok()
            });
            match fresh {
                Some(fresh) => self.tag_reads.remember(&fresh, now, max_age),
                None => self.tag_reads.forget(&other.group.arn),
            }
        }
        crate::groups::take_tags(&mut read, arn)
    }
}

/// The part of a group's ARN that names its partition, region and account: one
/// DescribeTags reads groups of one account and region.
fn scope(arn: &str) -> &str {
    arn.rsplit_once(':').map_or(arn, |(scope, _)| scope)
}

/// How long a group named in a re-read that ELBv2 refused as not found is left out of
/// the re-reads of other groups: one deleted group fails the whole call, and discovery
/// (every scheduled run) drops it within this.
const UNREADABLE_FOR: Duration = Duration::from_secs(60);

/// Per group ARN, the binding as its tags were last read (successfully, still binding
/// the group to this cluster), and the groups left out of other groups' re-reads.
#[derive(Default)]
pub(super) struct TagReads(Mutex<Reads>);

#[derive(Default)]
struct Reads {
    newest: HashMap<String, BoundGroup>,
    /// Until when each group is left out of other groups' re-reads.
    unreadable: HashMap<String, UnixMillis>,
}

impl TagReads {
    /// A read of `bound`'s group made after `bound`'s own and younger than `max_age`,
    /// for the same namespace and selector (the pods a pass holds were listed for
    /// those; a different selection is the pass's own read to find).
    pub(super) fn fresher(
        &self,
        bound: &BoundGroup,
        now: UnixMillis,
        max_age: Duration,
    ) -> Option<BoundGroup> {
        let reads = crate::sync::lock(&self.0);
        reads
            .newest
            .get(&bound.group.arn)
            .filter(|r| {
                r.read_at > bound.read_at
                    && now < r.read_at.plus(max_age)
                    && r.binding.namespace == bound.binding.namespace
                    && r.binding.selector == bound.binding.selector
            })
            .cloned()
    }

    /// Remembers a read just made (and drops reads too old to be used again).
    pub(super) fn remember(&self, bound: &BoundGroup, now: UnixMillis, max_age: Duration) {
        let mut reads = crate::sync::lock(&self.0);
        reads.newest.retain(|_, r| now < r.read_at.plus(max_age));
        reads.newest.insert(bound.group.arn.clone(), bound.clone());
    }

    /// Up to `TAGS_BATCH - 1` groups of `known` other than `bound`'s, of its account and
    /// region, whose newest read is the oldest: the groups a re-read of `bound`'s tags
    /// reads too.
    pub(super) fn companions<'a>(
        &self,
        bound: &BoundGroup,
        known: &'a [BoundGroup],
        now: UnixMillis,
    ) -> Vec<&'a BoundGroup> {
        let mut reads = crate::sync::lock(&self.0);
        reads.unreadable.retain(|_, until| now < *until);
        let reads = &*reads;
        let newest = |b: &BoundGroup| {
            reads
                .newest
                .get(&b.group.arn)
                .map_or(b.read_at, |r| r.read_at.max(b.read_at))
        };
        let arn = &bound.group.arn;
        let mut others: Vec<(UnixMillis, &BoundGroup)> = known
            .iter()
            .filter(|b| {
                let other = &b.group.arn;
                other != arn && scope(other) == scope(arn) && !reads.unreadable.contains_key(other)
            })
            .map(|b| (newest(b), b))
            .collect();
        others.sort_by_key(|(at, _)| *at);
        others.truncate(TAGS_BATCH - 1);
        others.into_iter().map(|(_, b)| b).collect()
    }

    /// Leaves `arns` out of other groups' re-reads for [`UNREADABLE_FOR`]: a re-read
    /// that named them was refused as not found.
    pub(super) fn unreadable(&self, arns: &[String], now: UnixMillis) {
        let until = now.plus(UNREADABLE_FOR);
        let mut reads = crate::sync::lock(&self.0);
        reads
            .unreadable
            .extend(arns.iter().map(|a| (a.clone(), until)));
    }

    /// Forgets `arn`'s read: its tags no longer bind it as remembered.
    pub(super) fn forget(&self, arn: &str) {
        crate::sync::lock(&self.0).newest.remove(arn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::bound_group;

    const ARN: &str =
        "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/web/0123456789abcdef";
    const AGE: Duration = Duration::from_secs(5);

    fn read_at(ms: u64) -> BoundGroup {
        let group = bound_group(ARN, "demo", "shop", "app=web", 8080);
        let binding = crate::core::Binding::for_cluster(
            &group.tags,
            &group.facts,
            "demo",
            &crate::core::BindingPolicy::default(),
        )
        .expect("bound")
        .expect("valid");
        BoundGroup {
            group,
            binding,
            read_at: UnixMillis(ms),
        }
    }

    #[test]
    fn a_newer_read_stands_in_until_it_is_old_itself() {
        let reads = TagReads::default();
        reads.remember(&read_at(10_000), UnixMillis(10_000), AGE);
        let stale = read_at(0);
        let got = reads
            .fresher(&stale, UnixMillis(14_999), AGE)
            .expect("fresh");
        assert_eq!(got.read_at, UnixMillis(10_000));
        assert!(reads.fresher(&stale, UnixMillis(15_000), AGE).is_none());
        // Never older than the caller's own copy.
        assert!(
            reads
                .fresher(&read_at(12_000), UnixMillis(13_000), AGE)
                .is_none()
        );
    }

    #[test]
    fn a_re_read_names_the_stalest_other_groups_of_its_account_only() {
        let reads = TagReads::default();
        let group = |account: &str, i: usize, at: u64| {
            let mut g = read_at(at);
            g.group.arn = format!(
                "arn:aws:elasticloadbalancing:us-east-1:{account}:targetgroup/g{i}/0123456789abcdef"
            );
            g
        };
        let own = group("123456789012", 0, 0);
        let mut known = vec![own.clone()];
        // 25 others of its account discovered at 0..24 s, and one of another account.
        known.extend((1..=25).map(|i| group("123456789012", i, 1_000 * i as u64)));
        known.push(group("210987654321", 26, 0));
        // Group 1 was re-read since (at 30 s): it is the freshest now.
        let mut fresh = known[1].clone();
        fresh.read_at = UnixMillis(30_000);
        reads.remember(&fresh, UnixMillis(30_000), AGE);
        let names = |now: u64| -> Vec<String> {
            reads
                .companions(&own, &known, UnixMillis(now))
                .iter()
                .filter_map(|b| b.group.arn.split('/').nth(1).map(str::to_owned))
                .collect()
        };
        let want: Vec<String> = (2..=20).map(|i| format!("g{i}")).collect();
        assert_eq!(names(31_000), want, "19, stalest first, own account only");
        reads.unreadable(&[known[2].group.arn.clone()], UnixMillis(31_000));
        let mut want: Vec<String> = (3..=21).map(|i| format!("g{i}")).collect();
        assert_eq!(names(32_000), want, "an unreadable group is left out");
        want = (2..=20).map(|i| format!("g{i}")).collect();
        assert_eq!(names(91_000), want, "for a minute");
    }

    #[test]
    fn a_read_for_another_selection_or_a_forgotten_one_is_not_used() {
        let reads = TagReads::default();
        let mut other = read_at(10_000);
        other.binding.namespace = "other".into();
        reads.remember(&other, UnixMillis(10_000), AGE);
        assert!(
            reads
                .fresher(&read_at(0), UnixMillis(11_000), AGE)
                .is_none()
        );
        reads.remember(&read_at(10_000), UnixMillis(10_000), AGE);
        reads.forget(ARN);
        assert!(
            reads
                .fresher(&read_at(0), UnixMillis(11_000), AGE)
                .is_none()
        );
    }
}
