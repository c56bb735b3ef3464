//! The newest read of each bound group's tags in this container. Pod events and watch
//! passes start from bindings discovered up to a minute earlier; a pass that changes a
//! group re-reads its tags first when its copy is older than `binding_max_age`. Without
//! this memory every later pass of that minute would find the same old copy and read
//! the tags again: one paced ELBv2 Describe call per event, which is most of what a
//! pod event waits for once the discovery is a few seconds old.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::BoundGroup;
use crate::core::UnixMillis;

/// Per group ARN, the binding as its tags were last read (successfully, still binding
/// the group to this cluster).
#[derive(Default)]
pub(super) struct TagReads(Mutex<HashMap<String, BoundGroup>>);

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
        reads.retain(|_, r| now < r.read_at.plus(max_age));
        reads.insert(bound.group.arn.clone(), bound.clone());
    }

    /// Forgets `arn`'s read: its tags no longer bind it as remembered.
    pub(super) fn forget(&self, arn: &str) {
        crate::sync::lock(&self.0).remove(arn);
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
