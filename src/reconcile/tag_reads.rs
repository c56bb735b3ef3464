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

use super::pass::Stop;
use super::{BoundGroup, Failure, Reconciler};
use crate::aws::elbv2::TAGS_BATCH;
use crate::core::{Binding, UnixMillis};
use crate::groups::{ElbError, Priority, TargetGroupApi};
use crate::pods::PodSource;
use crate::report::{GroupReport, Outcome};
use crate::state::StateStore;

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Reconciler<P, G, S> {
    /// `bound`'s tags read now, in one DescribeTags with those of up to 19 other bound
    /// groups of its account (the stalest reads first), which are remembered for their
    /// own passes when they still bind their groups.
    pub(super) async fn read_tags(
        &self,
        bound: &BoundGroup,
        now: UnixMillis,
        priority: &Priority,
    ) -> Result<std::collections::BTreeMap<String, String>, ElbError> {
        let arn = &bound.group.arn;
        let known = self.index.all();
        let others = self.memory.tag_reads.companions(bound, &known, now);
        let mut arns = Vec::with_capacity(others.len() + 1);
        arns.push(arn.clone());
        arns.extend(others.iter().map(|b| b.group.arn.clone()));
        let mut read = match self.groups.tags_of(&arns, priority).await {
            // One group deleted fails the whole call: ask for this one alone, and leave
            // the others out of re-reads until discovery has dropped the deleted one.
            Err(ElbError::NotFound { .. }) if arns.len() > 1 => {
                self.memory.tag_reads.unreadable(&arns[1..], now);
                self.groups.tags_of(&arns[..1], priority).await?
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
                Some(fresh) => self.index.reread(&fresh),
                None => self.index.unbound(&other.group.arn),
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

/// The groups left out of other groups' re-reads, each until when. (The newest read of
/// each group's tags is the bound index's: see [`crate::index::BoundIndex::reread`].)
#[derive(Default)]
pub(super) struct TagReads(Mutex<HashMap<String, UnixMillis>>);

impl TagReads {
    /// Up to `TAGS_BATCH - 1` groups of `known` other than `bound`'s, of its account and
    /// region, whose newest read is the oldest: the groups a re-read of `bound`'s tags
    /// reads too.
    pub(super) fn companions<'a>(
        &self,
        bound: &BoundGroup,
        known: &'a [BoundGroup],
        now: UnixMillis,
    ) -> Vec<&'a BoundGroup> {
        let mut unreadable = crate::sync::lock(&self.0);
        unreadable.retain(|_, until| now < *until);
        let arn = &bound.group.arn;
        let mut others: Vec<&BoundGroup> = known
            .iter()
            .filter(|b| {
                let other = &b.group.arn;
                other != arn && scope(other) == scope(arn) && !unreadable.contains_key(other)
            })
            .collect();
        others.sort_by_key(|b| b.read_at);
        others.truncate(TAGS_BATCH - 1);
        others
    }

    /// Leaves `arns` out of other groups' re-reads for [`UNREADABLE_FOR`]: a re-read
    /// that named them was refused as not found.
    pub(super) fn unreadable(&self, arns: &[String], now: UnixMillis) {
        let until = now.plus(UNREADABLE_FOR);
        crate::sync::lock(&self.0).extend(arns.iter().map(|a| (a.clone(), until)));
    }
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Reconciler<P, G, S> {
    /// Re-reads the group's tags when its binding is older than `binding_max_age` (pod
    /// events and watch mode work from cached bindings), or always with `force`: what
    /// the pass changes follows tags read now. Whether they were read.
    pub(super) async fn refresh_binding(
        &self,
        bound: &mut BoundGroup,
        report: &mut GroupReport,
        force: bool,
        priority: &Priority,
    ) -> Result<bool, Stop> {
        let now = self.clock.now();
        let max_age = self.settings.binding_max_age;
        if !force {
            if now < bound.read_at.plus(max_age) {
                return Ok(false);
            }
            // Another pass of this container read them a moment ago: its read stands
            // in for this pass's (it is still not a read made *in* this pass).
            if let Some(fresh) = self.index.fresher(bound, now, max_age) {
                *bound = fresh;
                return Ok(false);
            }
        }
        let tags = match self.read_tags(bound, now, priority).await {
            Ok(tags) => tags,
            Err(e) => {
                if matches!(e, ElbError::NotFound { .. }) {
                    // Deleted: not acted on again until a discovery binds it.
                    self.index.unbound(&bound.group.arn);
                }
                return Err(Stop::Failed(Failure::TagRead(e)));
            }
        };
        match Binding::for_cluster(
            &tags,
            &bound.group.facts,
            &self.cluster,
            &self.settings.binding_policy,
        ) {
            Some(Ok(binding))
                if binding.namespace != bound.binding.namespace
                    || binding.selector != bound.binding.selector =>
            {
                // The pods in hand were listed for the old selection: acting on them
                // would be acting on partial data.
                self.index.unbound(&bound.group.arn);
                report.outcome = Outcome::Deferred;
                report.error = Some(
                    "the group's namespace or selector tag changed since discovery; the next run reconciles it with the new tags"
                        .into(),
                );
                Err(Stop::Unbound)
            }
            Some(Ok(binding)) => {
                bound.binding = binding;
                bound.group.tags = tags;
                bound.read_at = now;
                self.index.reread(bound);
                Ok(true)
            }
            other => {
                self.index.unbound(&bound.group.arn);
                report.outcome = Outcome::BindingError;
                report.error = Some(match other {
                    Some(Err(e)) => {
                        format!("{e} (tags changed since discovery; the group is left untouched)")
                    }
                    _ => format!(
                        "the group's tags no longer bind it to cluster `{}` (changed since discovery); left untouched",
                        self.cluster
                    ),
                });
                Err(Stop::Unbound)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::bound_group;

    const ARN: &str =
        "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/web/0123456789abcdef";

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
        known[1].read_at = UnixMillis(30_000);
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
}
