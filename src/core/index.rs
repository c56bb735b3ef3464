//! An index of pods by namespace and label, so that computing the desired targets of a
//! thousand groups does not scan every pod a thousand times.

use rustc_hash::FxHashMap as HashMap;

use super::binding::Binding;
use super::pod::PodFacts;
use super::selector::{Selector, Term};

/// Pods grouped by namespace and by `(namespace, label key, label value)`.
///
/// Borrowing the pods keeps the index allocation-light: its keys point into the pods.
/// (Fx hashing: the keys are label strings of our own cluster, not attacker-chosen
/// input that would call for DoS-resistant hashing.)
#[derive(Debug)]
pub struct PodIndex<'a> {
    pods: Vec<&'a PodFacts>,
    by_namespace: HashMap<&'a str, Vec<u32>>,
    by_label: HashMap<(&'a str, &'a str, &'a str), Vec<u32>>,
}

impl<'a> PodIndex<'a> {
    /// Indexes `pods` (at most `u32::MAX` of them; more are ignored).
    pub fn new(pods: &'a [PodFacts]) -> Self {
        Self::of(pods.iter())
    }

    /// Indexes pods held elsewhere (a watch's store, read in place).
    pub fn of(pods: impl Iterator<Item = &'a PodFacts>) -> Self {
        let pods: Vec<&'a PodFacts> = pods.take(u32::MAX as usize).collect();
        let mut by_namespace: HashMap<&str, Vec<u32>> = HashMap::default();
        let mut by_label: HashMap<(&str, &str, &str), Vec<u32>> = HashMap::default();
        for (i, pod) in pods.iter().copied().enumerate() {
            let i = i as u32;
            let ns = pod.pod.namespace.as_str();
            by_namespace.entry(ns).or_default().push(i);
            for (k, v) in pod.labels.iter() {
                by_label.entry((ns, k, v)).or_default().push(i);
            }
        }
        Self {
            pods,
            by_namespace,
            by_label,
        }
    }

    /// A superset of the pods `binding` selects, usually exact: the shortest posting list
    /// among the selector's equality terms, or the namespace when it has none.
    pub fn candidates<'s>(
        &'s self,
        binding: &'s Binding,
    ) -> impl Iterator<Item = &'a PodFacts> + use<'s, 'a> {
        self.select(&binding.namespace, &binding.selector)
    }

    /// As [`PodIndex::candidates`], for a selector in `namespace` without a binding (a
    /// cold container's index rows record only the selector).
    pub fn select<'s>(
        &'s self,
        namespace: &'s str,
        selector: &'s Selector,
    ) -> impl Iterator<Item = &'a PodFacts> + use<'s, 'a> {
        let ns = namespace;
        let mut best: Option<&'s Vec<u32>> = None;
        let mut empty = false;
        for term in selector.terms() {
            if let Term::Equals { key, value } = term {
                match self.by_label.get(&(ns, key.as_str(), value.as_str())) {
                    Some(list) if best.is_none_or(|b| list.len() < b.len()) => best = Some(list),
                    Some(_) => {}
                    None => empty = true,
                }
            }
        }
        let list: &'s [u32] = if empty {
            &[]
        } else {
            best.or_else(|| self.by_namespace.get(ns))
                .map(Vec::as_slice)
                .unwrap_or(&[])
        };
        let pods = &self.pods;
        list.iter().map(move |&i| pods[i as usize])
    }

    /// Namespaces that hold at least one pod.
    pub fn namespaces(&self) -> impl Iterator<Item = &&'a str> {
        self.by_namespace.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::super::binding::PortSpec;
    use super::super::desired::desired_targets;
    use super::super::pod::PodRef;
    use super::super::test_fixtures::binding;
    use super::*;
    use std::sync::Arc;

    fn pod(ns: &str, name: &str, labels: &[(&str, &str)]) -> PodFacts {
        PodFacts {
            pod: Arc::new(PodRef {
                namespace: ns.into(),
                name: name.into(),
                uid: name.into(),
            }),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            excluded: false,
            phase: "Running".into(),
            terminating: false,
            ipv4: Some(format!("10.0.0.{}", name.len()).parse().unwrap()),
            ipv6: None,
            unusable_ip: None,
            ready: true,
            containers_ready: true,
            gate: None,
            gate_said: None,
            named_ports: vec![],
            host_network: false,
            quic_server_id: None,
            node_name: None,
            termination: Default::default(),
        }
    }

    #[test]
    fn candidates_agree_with_a_full_scan() {
        let pods = vec![
            pod("a", "p1", &[("app", "web"), ("tier", "fe")]),
            pod("a", "p22", &[("app", "web")]),
            pod("a", "p333", &[("app", "api"), ("tier", "fe")]),
            pod("b", "p4444", &[("app", "web"), ("tier", "fe")]),
        ];
        let index = PodIndex::new(&pods);
        for (ns, sel) in [
            ("a", "app=web"),
            ("a", "app=web tier=fe"),
            ("a", "tier"),
            ("b", "app=web tier"),
            ("a", "app=nope"),
            ("c", "app=web"),
        ] {
            let b = binding(ns, sel, PortSpec::Number(80));
            let via_index = desired_targets(index.candidates(&b), &b);
            let via_scan = desired_targets(&pods, &b);
            assert_eq!(via_index, via_scan, "{ns} {sel}");
        }
    }
}
