//! Pod changes a watch sees before discovery has bound their groups.
//!
//! A cold container watches the namespaces of this cluster's index from its first
//! second, but knows which groups select which pods only once discovery has read
//! every group's tags (at 1,000 groups, 50-odd paced Describe calls: 10 s and more).
//! A change seen meanwhile must not wait for the full diff to reach its group: it is
//! kept here, names the indexed groups whose recorded selector matches the pod (read
//! at once, ahead of discovery), and asks for its groups' passes as soon as either
//! binds them, with the time it was seen. A change made before the container's first
//! LIST of a namespace is no watch event: the LIST holds it. So each namespace's first
//! LIST is compared with the ledgers of its indexed groups, by pod and address, and a
//! group out of step with it is named as a change would name it. Pure data: the
//! controller feeds it and replays it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::core::{
    AddressFamily, Binding, GroupFacts, PodFacts, PodIndex, Selector, Target, UnixMillis,
    contribution, serving_ip,
};
use crate::reconcile::BoundGroup;
use crate::state::{IndexedGroup, LedgerEntry};

/// At most this many pod changes are kept one by one; past it, a namespace's later
/// changes ask for a pass of each of its groups (a rollout at a cold start).
pub const KEPT: usize = 5_000;

/// At most this many groups are read ahead of discovery (5 DescribeTags of 20, and a
/// DescribeTargetGroups each for rows of the earlier layout): past it, a rollout at a
/// cold start waits for discovery rather than add to its calls.
pub const READ_AHEAD: usize = 100;

/// The pod changes and relists seen before discovery.
#[derive(Debug, Default)]
pub struct Early {
    /// Each pod change: its namespace, the pod before and after, when it was seen.
    pods: Vec<(String, Option<PodFacts>, Option<PodFacts>, UnixMillis)>,
    /// Namespaces where anything may have changed (a relist after a gap, or more
    /// changes than [`KEPT`]), with when that was first seen.
    namespaces: BTreeMap<String, UnixMillis>,
    /// This cluster's index by namespace: each group with its recorded selector.
    index: BTreeMap<String, Vec<(String, Selector)>>,
    /// The indexed groups named to be read ahead of discovery.
    named: BTreeSet<String>,
    /// The name and facts the index records for each group that has them.
    described: BTreeMap<String, (String, GroupFacts)>,
    /// Groups a namespace's first LIST showed out of step with their ledgers, with
    /// when that LIST was seen.
    suspects: BTreeMap<String, UnixMillis>,
    /// Namespaces whose first LIST was handed out for comparing.
    compared: BTreeSet<String>,
}

impl Early {
    /// Learns this cluster's index (a cold start): rows whose selector no longer
    /// parses name nothing.
    pub fn index(&mut self, rows: &[IndexedGroup]) {
        for row in rows {
            if let Some(described) = &row.described {
                self.described.insert(row.group.clone(), described.clone());
            }
            if let Some(selector) = &row.selector {
                self.index
                    .entry(row.namespace.clone())
                    .or_default()
                    .push((row.group.clone(), selector.clone()));
            }
        }
    }

    /// Keeps one pod change. Returns the indexed groups it names for the first time
    /// (their recorded selector matches the pod before or after), to be read ahead of
    /// discovery: at most [`READ_AHEAD`] in all.
    pub fn pod(
        &mut self,
        namespace: &str,
        before: Option<&PodFacts>,
        after: Option<&PodFacts>,
        seen: UnixMillis,
    ) -> Vec<String> {
        let selecting: Vec<String> = self
            .index
            .get(namespace)
            .into_iter()
            .flatten()
            .filter(|(_, selector)| {
                let selects = |p: Option<&PodFacts>| p.is_some_and(|p| selector.matches(&p.labels));
                selects(before) || selects(after)
            })
            .map(|(arn, _)| arn.clone())
            .collect();
        let named = self.name(selecting);
        if self.pods.len() < KEPT {
            self.pods
                .push((namespace.to_owned(), before.cloned(), after.cloned(), seen));
        } else {
            self.anything(namespace, seen);
        }
        named
    }

    /// Whether `namespace`'s first LIST is to be compared with its indexed groups'
    /// ledgers: once per namespace, and only where the index names a group.
    pub fn first_list(&mut self, namespace: &str) -> bool {
        self.index.contains_key(namespace) && self.compared.insert(namespace.to_owned())
    }

    /// Up to `n` of `namespace`'s indexed groups from the `from`-th on, for comparing
    /// with its first LIST: each with its recorded selector and, when its row records
    /// it, its address family.
    pub fn indexed(
        &self,
        namespace: &str,
        from: usize,
        n: usize,
    ) -> Vec<(String, Selector, Option<AddressFamily>)> {
        self.index
            .get(namespace)
            .into_iter()
            .flatten()
            .skip(from)
            .take(n)
            .map(|(arn, selector)| {
                let family = self.described.get(arn).map(|(_, f)| f.family);
                (arn.clone(), selector.clone(), family)
            })
            .collect()
    }

    /// Keeps `groups` as out of step with a first LIST seen at `seen`. Returns those
    /// named for the first time, to be read ahead of discovery (see [`Early::pod`]).
    pub fn suspect(&mut self, groups: Vec<String>, seen: UnixMillis) -> Vec<String> {
        for arn in &groups {
            self.suspects.entry(arn.clone()).or_insert(seen);
        }
        self.name(groups)
    }

    /// Those of `groups` named for the first time, to be read ahead of discovery: at
    /// most [`READ_AHEAD`] in all.
    fn name(&mut self, groups: Vec<String>) -> Vec<String> {
        let mut named = Vec::new();
        for arn in groups {
            if self.named.len() >= READ_AHEAD {
                break;
            }
            if self.named.insert(arn.clone()) {
                named.push(arn);
            }
        }
        named
    }

    /// The name and facts `group`'s index row records, if it does.
    pub fn described(&self, group: &str) -> Option<&(String, GroupFacts)> {
        self.described.get(group)
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
            if let Some(seen) = self.suspects.get(&b.group.arn) {
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

/// Whether the watches, each namespace's with its selection, hold every pod `binding`
/// selects: a group read ahead of discovery is bound only then (a pass on a store
/// filtered by terms its binding lacks would miss pods, and deregister them).
pub fn watched(namespaces: &BTreeMap<String, Option<Selector>>, binding: &Binding) -> bool {
    namespaces
        .get(&binding.namespace)
        .is_some_and(|s| s.as_ref().is_none_or(|s| s.covers(&binding.selector)))
}

/// A namespace's pods as listed: each by name, and a superset of those a selector
/// selects (an index by label, so that comparing a hundred groups does not scan every
/// pod a hundred times).
pub struct ListedPods<'a> {
    /// The namespace.
    pub namespace: &'a str,
    /// Its pods by name.
    pub by_name: HashMap<&'a str, &'a PodFacts>,
    /// Its pods by label.
    pub index: PodIndex<'a>,
}

impl<'a> ListedPods<'a> {
    /// Indexes `pods`, all of `namespace`, where they are (a watch's store).
    pub fn new(namespace: &'a str, pods: impl Iterator<Item = &'a PodFacts> + Clone) -> Self {
        Self {
            namespace,
            by_name: pods.clone().map(|p| (p.pod.name.as_str(), p)).collect(),
            index: PodIndex::of(pods),
        }
    }
}

/// Whether a namespace's pods as listed differ from what `ledger` holds for `cluster`,
/// by pod and address, ports aside (the port comes from the group's tags): a pod the
/// ledger holds that is gone, re-created, no longer selected or no longer serving, or a
/// serving pod `selector` matches that the ledger lacks. Before any tag is read this
/// is a hint, not a plan: the pass it asks for decides.
pub fn out_of_step(
    selector: &Selector,
    family: Option<AddressFamily>,
    pods: &ListedPods<'_>,
    ledger: &BTreeMap<Target, LedgerEntry>,
    cluster: &str,
) -> bool {
    let namespace = pods.namespace;
    let mut held = HashSet::new();
    let ours = ledger.iter().filter(|(_, e)| {
        e.cluster == cluster && e.pod.namespace == namespace && e.deregistered_at.is_none()
    });
    for (target, entry) in ours {
        let Some(pod) = pods.by_name.get(entry.pod.name.as_str()) else {
            return true;
        };
        let serving = serving_ip(pod, target.family()) == Some(target.ip);
        if pod.pod.uid != entry.pod.uid || !selector.matches(&pod.labels) || !serving {
            return true;
        }
        held.insert(entry.pod.uid.as_str());
    }
    let family = family
        .or_else(|| ledger.keys().next().map(Target::family))
        .unwrap_or(AddressFamily::Ipv4);
    pods.index.select(namespace, selector).any(|p| {
        selector.matches(&p.labels)
            && serving_ip(p, family).is_some()
            && !held.contains(p.pod.uid.as_str())
    })
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
        let _ = early.pod("shop", Some(&ready), Some(&not_ready), UnixMillis(10));
        let _ = early.pod("shop", Some(&not_ready), Some(&ready), UnixMillis(20));
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
            let _ = early.pod("shop", None, Some(&pod), UnixMillis(i));
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

    #[test]
    fn a_change_names_each_indexed_group_selecting_it_once_up_to_the_bound() {
        let row = |group: &str, namespace: &str, selector: Option<&str>| IndexedGroup {
            group: group.to_owned(),
            namespace: namespace.to_owned(),
            selector: selector.and_then(|s| Selector::parse(s).ok()),
            described: None,
            binding: None,
            bound: true,
        };
        let mut early = Early::default();
        early.index(&[
            row("arn:web", "shop", Some("app=web")),
            row("arn:api", "shop", Some("app=api")),
            row("arn:other", "bank", Some("app=web")),
            row("arn:unreadable", "shop", None),
        ]);
        let (web, api) = (facts("w", "web", true), facts("a", "api", true));
        assert_eq!(
            early.pod("shop", None, Some(&web), UnixMillis(1)),
            ["arn:web"]
        );
        assert!(
            early
                .pod("shop", Some(&web), None, UnixMillis(2))
                .is_empty(),
            "named once"
        );
        assert_eq!(
            early.pod("shop", Some(&api), None, UnixMillis(3)),
            ["arn:api"],
            "a pod that is gone names the groups it was in"
        );

        let mut many = Early::default();
        let rows: Vec<IndexedGroup> = (0..=READ_AHEAD)
            .map(|i| row(&format!("arn:{i}"), "shop", Some("app=web")))
            .collect();
        many.index(&rows);
        assert_eq!(
            many.pod("shop", None, Some(&web), UnixMillis(1)).len(),
            READ_AHEAD
        );
        assert!(many.pod("shop", None, Some(&web), UnixMillis(2)).is_empty());
    }

    /// `shop`'s pods, each with its name, app, IP and readiness.
    fn listed(pods: &[(&str, &str, &str, bool)]) -> Vec<PodFacts> {
        pods.iter()
            .map(|(name, app, ip, ready)| {
                let pod = PodBuilder::new("shop", name)
                    .label("app", app)
                    .ip(ip)
                    .ready(*ready);
                PodFacts::from_pod(pod.build())
            })
            .collect()
    }

    /// A ledger holding `w1` at 10.0.0.1:8080 for `cluster`.
    fn ledger_of(cluster: &str) -> BTreeMap<Target, LedgerEntry> {
        let target = Target::new("10.0.0.1".parse().expect("an IP"), 8080);
        let entry = LedgerEntry {
            target,
            pod: crate::core::PodRef {
                namespace: "shop".into(),
                name: "w1".into(),
                uid: "uid-shop-w1".into(),
            },
            cluster: cluster.into(),
            registered_at: UnixMillis(0),
            deregistered_at: None,
        };
        BTreeMap::from([(target, entry)])
    }

    #[test]
    fn a_first_list_is_out_of_step_with_a_ledger_by_pod_and_address() {
        let web = Selector::parse("app=web").expect("a selector");
        let ours = ledger_of("c");
        let step = |pods: &[PodFacts], ledger: &BTreeMap<Target, LedgerEntry>| {
            out_of_step(
                &web,
                None,
                &ListedPods::new("shop", pods.iter()),
                ledger,
                "c",
            )
        };
        let w1 = ("w1", "web", "10.0.0.1", true);
        assert!(!step(&listed(&[w1]), &ours), "in step");
        assert!(
            !step(&listed(&[w1, ("a1", "api", "10.0.0.9", true)]), &ours),
            "another group's pod"
        );
        assert!(
            step(&listed(&[("w1", "web", "10.0.0.1", false)]), &ours),
            "no longer ready"
        );
        assert!(step(&listed(&[]), &ours), "gone");
        assert!(
            step(&listed(&[("w1", "web", "10.0.0.7", true)]), &ours),
            "another address"
        );
        assert!(
            step(&listed(&[("w1", "api", "10.0.0.1", true)]), &ours),
            "no longer selected"
        );
        assert!(
            step(&listed(&[w1, ("w2", "web", "10.0.0.2", true)]), &ours),
            "a ready pod the ledger lacks"
        );
        assert!(
            !step(&listed(&[w1, ("w2", "web", "10.0.0.2", false)]), &ours),
            "a pod not ready yet"
        );
        let mut recreated = listed(&[w1]);
        for p in &mut recreated {
            p.pod = std::sync::Arc::new(crate::core::PodRef {
                uid: "uid-new".into(),
                ..(*p.pod).clone()
            });
        }
        assert!(step(&recreated, &ours), "re-created under the same name");
        assert!(
            !step(&listed(&[]), &ledger_of("other")),
            "another cluster's entry is not ours to compare"
        );
    }

    #[test]
    fn a_first_list_names_out_of_step_groups_once_and_marks_them_when_bound() {
        let row = |group: &str, namespace: &str| IndexedGroup {
            group: group.to_owned(),
            namespace: namespace.to_owned(),
            selector: Selector::parse("app=web").ok(),
            described: None,
            binding: None,
            bound: true,
        };
        let mut early = Early::default();
        early.index(&[row("arn:web", "shop"), row("arn:other", "bank")]);
        assert!(early.first_list("shop"));
        let groups: Vec<String> = early
            .indexed("shop", 0, 10)
            .into_iter()
            .map(|(arn, ..)| arn)
            .collect();
        assert_eq!(groups, ["arn:web"]);
        assert!(early.indexed("shop", 1, 10).is_empty());
        assert!(!early.first_list("shop"), "compared once");
        assert!(!early.first_list("hr"), "no group indexed there");
        assert_eq!(
            early.suspect(vec!["arn:web".into()], UnixMillis(7)),
            ["arn:web"]
        );
        assert!(
            early
                .suspect(vec!["arn:web".into()], UnixMillis(9))
                .is_empty(),
            "named once"
        );
        let marks = early.marks(&bound(), &BTreeMap::new());
        assert_eq!(
            marks,
            BTreeMap::from([("arn:web".to_owned(), UnixMillis(7))])
        );
    }

    #[test]
    fn a_group_read_ahead_is_bound_only_where_the_watch_holds_all_its_pods() {
        let web = binding("c", "shop", "app=web", 8080);
        let selection = |s: &str| Selector::parse(s).ok();
        let watching = |ns: &str, s: Option<Selector>| BTreeMap::from([(ns.to_owned(), s)]);
        assert!(
            watched(&watching("shop", None), &web),
            "the whole namespace"
        );
        assert!(watched(&watching("shop", selection("app=web")), &web));
        assert!(
            !watched(&watching("shop", selection("app=web tier=fe")), &web),
            "the index recorded a narrower selector than the tags now give"
        );
        assert!(!watched(&watching("bank", None), &web), "another namespace");
    }
}
