//! The bound groups: one index, one owner.
//!
//! Which target groups are bound to this cluster, with what binding, is held here and
//! nowhere else in a container. It is fed by discovery (every bound group of every
//! account, which also writes the state table's index of bound groups and bumps its
//! generation), by the state table's index (a namespace's groups, for pod-events, which
//! never discovers every group of the account on its own), by reads of groups ahead of
//! discovery (a cold container's first changes) and by the tag re-reads of passes. The
//! watch, the full diff, pod-events, the manual runs and the gates all read it. A
//! function that did not discover itself compares the generation it holds with the state
//! table's before it trusts a namespace's groups, so no function acts on a view older
//! than the last discovery.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use crate::core::{Binding, Selector, UnixMillis};
use crate::groups::TargetGroup;
use crate::sync::lock;

/// A namespace's bound groups and the selection they all share ([`Selector::common`]):
/// what one LIST or WATCH of the namespace reads for them.
pub struct Namespace<'a> {
    /// Its groups.
    pub groups: Vec<&'a BoundGroup>,
    /// Their common selection (`None`: all the namespace's pods).
    pub selector: Option<Selector>,
}

/// `bound` by namespace.
pub fn by_namespace<'a>(
    bound: impl IntoIterator<Item = &'a BoundGroup>,
) -> BTreeMap<&'a str, Namespace<'a>> {
    let mut groups: BTreeMap<&str, Vec<&BoundGroup>> = BTreeMap::new();
    for b in bound {
        groups.entry(&b.binding.namespace).or_default().push(b);
    }
    groups
        .into_iter()
        .map(|(ns, groups)| {
            let selector = Selector::common(groups.iter().map(|b| &b.binding.selector));
            (ns, Namespace { groups, selector })
        })
        .collect()
}

/// A target group with a valid binding for this cluster.
#[derive(Debug, Clone)]
pub struct BoundGroup {
    /// The group.
    pub group: TargetGroup,
    /// Its binding.
    pub binding: Binding,
    /// When the binding's tags were read.
    pub read_at: UnixMillis,
}

impl TargetGroup {
    /// The name, or the ARN when discovery had none.
    pub fn group_name(&self) -> String {
        if self.name.is_empty() {
            self.arn.clone()
        } else {
            self.name.clone()
        }
    }
}

/// The bound groups this container knows, and how far it knows them.
#[derive(Debug, Default)]
pub struct BoundIndex {
    inner: Mutex<Inner>,
}

/// The bound groups by ARN, shared with readers as they were when they looked (a
/// write copies the map only while a reader still holds it).
pub type Snapshot = Arc<BTreeMap<String, BoundGroup>>;

#[derive(Debug, Default)]
struct Inner {
    groups: Snapshot,
    known: Known,
    /// The generation of the state table's index of bound groups this view matches
    /// (0: none read or written).
    generation: u64,
}

/// How much of the bound groups the index holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
enum Known {
    /// Nothing for sure (groups read ahead of discovery may be there).
    #[default]
    Nothing,
    /// Every bound group of these namespaces, as the state table's index had them.
    Namespaces(BTreeSet<String>),
    /// Every bound group: a discovery filled it.
    All,
}

impl BoundIndex {
    /// The bound group `arn`, if known.
    pub fn get(&self, arn: &str) -> Option<BoundGroup> {
        lock(&self.inner).groups.get(arn).cloned()
    }

    /// Whether `arn` is a known bound group.
    pub fn contains(&self, arn: &str) -> bool {
        lock(&self.inner).groups.contains_key(arn)
    }

    /// Every known bound group.
    pub fn all(&self) -> Vec<BoundGroup> {
        lock(&self.inner).groups.values().cloned().collect()
    }

    /// Every known bound group by ARN, as it is now (cheap: shared until the next
    /// write).
    pub fn snapshot(&self) -> Snapshot {
        lock(&self.inner).groups.clone()
    }

    /// The known bound groups of `namespace`.
    pub fn in_namespace(&self, namespace: &str) -> Vec<BoundGroup> {
        lock(&self.inner)
            .groups
            .values()
            .filter(|b| b.binding.namespace == namespace)
            .cloned()
            .collect()
    }

    /// The known bound groups of `arns` (those of them that are).
    pub fn of<'a>(&self, arns: impl IntoIterator<Item = &'a str>) -> Vec<BoundGroup> {
        let inner = lock(&self.inner);
        arns.into_iter()
            .filter_map(|arn| inner.groups.get(arn).cloned())
            .collect()
    }

    /// Whether a discovery filled the index (every bound group is in it).
    pub fn is_discovered(&self) -> bool {
        lock(&self.inner).known == Known::All
    }

    /// Whether every bound group of `namespace` is known as of the state table's index
    /// at `generation`.
    pub fn knows(&self, namespace: &str, generation: u64) -> bool {
        let inner = lock(&self.inner);
        inner.generation == generation
            && match &inner.known {
                Known::All => true,
                Known::Namespaces(ns) => ns.contains(namespace),
                Known::Nothing => false,
            }
    }

    /// The generation of the state table's index this view matches.
    pub fn generation(&self) -> u64 {
        lock(&self.inner).generation
    }

    /// A discovery found `bound` (every bound group), and the state table's index is at
    /// `generation` after it (`None`: not known to have moved).
    pub fn discovered(&self, bound: &[BoundGroup], generation: Option<u64>) {
        let mut inner = lock(&self.inner);
        inner.groups = Arc::new(
            bound
                .iter()
                .map(|b| (b.group.arn.clone(), b.clone()))
                .collect(),
        );
        inner.known = Known::All;
        if let Some(g) = generation {
            inner.generation = g;
        }
    }

    /// `namespace`'s bound groups are `bound`, read from the state table's index at
    /// `generation`. Groups of other namespaces known as of an older generation are
    /// forgotten: the index moved since they were read.
    pub fn learned_namespace(&self, namespace: &str, bound: Vec<BoundGroup>, generation: u64) {
        let mut inner = lock(&self.inner);
        if inner.generation != generation {
            inner.groups = Snapshot::default();
            inner.known = Known::Nothing;
            inner.generation = generation;
        }
        let groups = Arc::make_mut(&mut inner.groups);
        groups.retain(|_, b| b.binding.namespace != namespace);
        groups.extend(bound.into_iter().map(|b| (b.group.arn.clone(), b)));
        match &mut inner.known {
            Known::All => {}
            Known::Namespaces(ns) => {
                ns.insert(namespace.to_owned());
            }
            known @ Known::Nothing => {
                *known = Known::Namespaces(BTreeSet::from([namespace.to_owned()]))
            }
        }
    }

    /// Groups read ahead of discovery (a cold container's first changes): bound as
    /// read, until discovery says otherwise.
    pub fn bound_ahead(&self, bound: impl IntoIterator<Item = BoundGroup>) {
        let mut inner = lock(&self.inner);
        let groups = Arc::make_mut(&mut inner.groups);
        for b in bound {
            groups.entry(b.group.arn.clone()).or_insert(b);
        }
    }

    /// A pass read `bound`'s tags afresh: it replaces the known binding when it selects
    /// the same pods (a changed selection is discovery's, which also changes the
    /// watch's).
    pub fn reread(&self, bound: &BoundGroup) {
        let mut inner = lock(&self.inner);
        let replaces = inner.groups.get(&bound.group.arn).is_some_and(|known| {
            known.binding.namespace == bound.binding.namespace
                && known.binding.selector == bound.binding.selector
                && known.read_at <= bound.read_at
        });
        if replaces {
            Arc::make_mut(&mut inner.groups).insert(bound.group.arn.clone(), bound.clone());
        }
    }

    /// A read of `bound`'s group made after `bound`'s own and younger than `max_age` at
    /// `now`, for the same namespace and selector (the pods a pass holds were listed
    /// for those; a different selection is the pass's own read to find): another pass
    /// of this container read the tags a moment ago, and its read stands in.
    pub fn fresher(
        &self,
        bound: &BoundGroup,
        now: UnixMillis,
        max_age: std::time::Duration,
    ) -> Option<BoundGroup> {
        lock(&self.inner)
            .groups
            .get(&bound.group.arn)
            .filter(|r| {
                r.read_at > bound.read_at
                    && now < r.read_at.plus(max_age)
                    && r.binding.namespace == bound.binding.namespace
                    && r.binding.selector == bound.binding.selector
            })
            .cloned()
    }

    /// A pass found `arn` no longer bound as it was (deleted, untagged, or its
    /// selection changed): it is not acted on until discovery binds it again.
    pub fn unbound(&self, arn: &str) {
        let mut inner = lock(&self.inner);
        if inner.groups.contains_key(arn) {
            Arc::make_mut(&mut inner.groups).remove(arn);
        }
    }

    /// The state table's index moved to `generation` by this container's own write of
    /// a row for a group it holds already: the view still matches it.
    pub fn wrote(&self, previous: u64, generation: u64) {
        let mut inner = lock(&self.inner);
        if inner.generation == previous {
            inner.generation = generation;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::bound_group;

    const A: &str = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/a/1";
    const B: &str = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/b/2";
    const C: &str = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/c/3";

    fn bound(arn: &str, namespace: &str, selector: &str, at: u64) -> BoundGroup {
        let group = bound_group(arn, "demo", namespace, selector, 8080);
        let binding = Binding::for_cluster(
            &group.tags,
            &group.facts,
            "demo",
            &crate::core::BindingPolicy::unrestricted(),
        )
        .unwrap()
        .unwrap();
        BoundGroup {
            group,
            binding,
            read_at: UnixMillis(at),
        }
    }

    #[test]
    fn a_namespace_read_from_the_table_is_known_only_at_its_generation() {
        let index = BoundIndex::default();
        assert!(!index.knows("shop", 0));
        index.learned_namespace("shop", vec![bound(A, "shop", "app=a", 1)], 4);
        assert!(index.knows("shop", 4));
        assert!(
            !index.knows("shop", 5),
            "a discovery moved the table's index"
        );
        assert!(!index.knows("other", 4));
        index.learned_namespace("other", vec![bound(C, "other", "app=c", 1)], 4);
        assert_eq!(index.all().len(), 2);
        // The table's index moved: what was read before it is forgotten.
        index.learned_namespace(
            "shop",
            vec![bound(A, "shop", "app=a", 2), bound(B, "shop", "app=b", 2)],
            5,
        );
        assert!(index.knows("shop", 5) && !index.knows("other", 5));
        assert_eq!(index.in_namespace("shop").len(), 2);
        assert!(index.in_namespace("other").is_empty());
        // This container's own write of a row it holds keeps the view current.
        index.wrote(5, 6);
        assert!(index.knows("shop", 6));
        index.wrote(5, 7);
        assert!(!index.knows("shop", 7), "another write came between");
    }

    #[test]
    fn discovery_knows_every_group_and_a_reread_never_changes_a_selection() {
        let index = BoundIndex::default();
        index.bound_ahead([bound(A, "shop", "app=a", 1)]);
        assert!(!index.is_discovered() && index.contains(A));
        index.discovered(&[bound(B, "shop", "app=b", 2)], Some(3));
        assert!(index.is_discovered() && index.knows("anything", 3));
        assert!(!index.contains(A), "discovery replaces groups read ahead");
        // A fresher read of the same selection replaces it; another selection does not.
        index.reread(&bound(B, "shop", "app=b", 5));
        assert_eq!(index.get(B).unwrap().read_at, UnixMillis(5));
        index.reread(&bound(B, "shop", "app=other", 6));
        assert_eq!(index.get(B).unwrap().binding.selector.to_string(), "app=b");
        index.reread(&bound(B, "shop", "app=b", 4));
        assert_eq!(
            index.get(B).unwrap().read_at,
            UnixMillis(5),
            "not an older read"
        );
        index.unbound(B);
        assert!(index.get(B).is_none());
    }

    #[test]
    fn a_newer_read_stands_in_until_it_is_old_itself() {
        const AGE: std::time::Duration = std::time::Duration::from_secs(5);
        let index = BoundIndex::default();
        index.discovered(&[bound(A, "shop", "app=a", 0)], None);
        index.reread(&bound(A, "shop", "app=a", 10_000));
        let stale = bound(A, "shop", "app=a", 0);
        let got = index
            .fresher(&stale, UnixMillis(14_999), AGE)
            .expect("fresh");
        assert_eq!(got.read_at, UnixMillis(10_000));
        assert!(index.fresher(&stale, UnixMillis(15_000), AGE).is_none());
        // Never older than the caller's own copy, never another selection's.
        assert!(
            index
                .fresher(&bound(A, "shop", "app=a", 12_000), UnixMillis(13_000), AGE)
                .is_none()
        );
        assert!(
            index
                .fresher(&bound(A, "other", "app=a", 0), UnixMillis(11_000), AGE)
                .is_none()
        );
    }
}
