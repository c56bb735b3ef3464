//! Pod changes a watch sees before discovery has bound their groups.
//!
//! A cold container watches the namespaces of this cluster's index from its first
//! second, but knows which groups select which pods only once discovery has read
//! every group's tags (at 1,000 groups, 50-odd paced Describe calls: 10 s and more).
//! A change seen meanwhile must not wait for the full diff to reach its group: it is
//! kept here and asks for its groups' passes as soon as discovery binds them, with the
//! time it was seen. Pure data: the controller feeds it and replays it.

use std::collections::BTreeMap;

use crate::core::{Binding, PodFacts, UnixMillis, contribution};
use crate::reconcile::BoundGroup;

/// At most this many pod changes are kept one by one; past it, a namespace's later
/// changes ask for a pass of each of its groups (a rollout at a cold start).
pub const KEPT: usize = 5_000;

/// The pod changes and relists seen before discovery.
#[derive(Debug, Default)]
pub struct Early {
    /// Each pod change: its namespace, the pod before and after, when it was seen.
    pods: Vec<(String, Option<PodFacts>, Option<PodFacts>, UnixMillis)>,
    /// Namespaces where anything may have changed (a relist after a gap, or more
    /// changes than [`KEPT`]), with when that was first seen.
    namespaces: BTreeMap<String, UnixMillis>,
}

impl Early {
    /// Keeps one pod change.
    pub fn pod(
        &mut self,
        namespace: &str,
        before: Option<&PodFacts>,
        after: Option<&PodFacts>,
        seen: UnixMillis,
    ) {
        if self.pods.len() < KEPT {
            self.pods
                .push((namespace.to_owned(), before.cloned(), after.cloned(), seen));
        } else {
            self.anything(namespace, seen);
        }
    }

    /// Keeps that anything may have changed in `namespace`.
    pub fn anything(&mut self, namespace: &str, seen: UnixMillis) {
        self.namespaces.entry(namespace.to_owned()).or_insert(seen);
    }

    /// The groups of `bound` these changes can change, each with when its oldest such
    /// change was seen. Groups bound the same way in `already` are left out: their
    /// changes were asked for as they came.
    pub fn marks(
        &self,
        bound: &BTreeMap<String, BoundGroup>,
        already: &BTreeMap<String, BoundGroup>,
    ) -> BTreeMap<String, UnixMillis> {
        let mut marks: BTreeMap<String, UnixMillis> = BTreeMap::new();
        let mut mark = |arn: &str, seen: UnixMillis| {
            marks
                .entry(arn.to_owned())
                .and_modify(|t| *t = (*t).min(seen))
                .or_insert(seen);
        };
        let new = bound.values().filter(|b| {
            already
                .get(&b.group.arn)
                .is_none_or(|a| a.binding != b.binding)
        });
        for b in new {
            let ns = &b.binding.namespace;
            if let Some(seen) = self.namespaces.get(ns) {
                mark(&b.group.arn, *seen);
            }
            for (_, before, after, seen) in self.pods.iter().filter(|(n, ..)| n == ns) {
                if changes(&b.binding, before.as_ref(), after.as_ref()) {
                    mark(&b.group.arn, *seen);
                }
            }
        }
        marks
    }
}

/// Whether a pod's change from `before` to `after` can change `binding`'s targets (a
/// pod never seen before may be one the group's last pass did not see).
pub fn changes(binding: &Binding, before: Option<&PodFacts>, after: Option<&PodFacts>) -> bool {
    let was = before.and_then(|p| contribution(p, binding));
    let is = after.and_then(|p| contribution(p, binding));
    was != is || (before.is_none() && is.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{PodBuilder, binding, bound_group};

    fn facts(name: &str, app: &str, ready: bool) -> PodFacts {
        let pod = PodBuilder::new("shop", name)
            .label("app", app)
            .ip("10.0.0.1")
            .ready(ready);
        PodFacts::from_pod(pod.build())
    }

    /// Two groups in `shop` (app=web, app=api), one in `bank` (app=web).
    fn bound() -> BTreeMap<String, BoundGroup> {
        [
            ("arn:web", "shop", "app=web"),
            ("arn:api", "shop", "app=api"),
            ("arn:other", "bank", "app=web"),
        ]
        .into_iter()
        .map(|(arn, ns, selector)| {
            let b = BoundGroup {
                group: bound_group(arn, "c", ns, selector, 8080),
                binding: binding("c", ns, selector, 8080),
                read_at: UnixMillis(0),
            };
            (arn.to_owned(), b)
        })
        .collect()
    }

    #[test]
    fn a_change_marks_only_the_groups_it_can_change_with_its_oldest_time() {
        let bound = bound();
        let mut early = Early::default();
        let (ready, not_ready) = (facts("w", "web", true), facts("w", "web", false));
        early.pod("shop", Some(&ready), Some(&not_ready), UnixMillis(10));
        early.pod("shop", Some(&not_ready), Some(&ready), UnixMillis(20));
        let marks = early.marks(&bound, &BTreeMap::new());
        assert_eq!(
            marks,
            BTreeMap::from([("arn:web".to_owned(), UnixMillis(10))])
        );
        // Bound the same way before discovery: asked for as it came.
        assert!(early.marks(&bound, &bound).is_empty());
    }

    #[test]
    fn past_the_bound_a_namespace_marks_each_of_its_groups() {
        let bound = bound();
        let mut early = Early::default();
        let pod = facts("x", "none", true);
        for i in 0..=KEPT as u64 {
            early.pod("shop", None, Some(&pod), UnixMillis(i));
        }
        let marks = early.marks(&bound, &BTreeMap::new());
        assert_eq!(
            marks,
            BTreeMap::from([
                ("arn:api".to_owned(), UnixMillis(KEPT as u64)),
                ("arn:web".to_owned(), UnixMillis(KEPT as u64)),
            ])
        );
    }
}
