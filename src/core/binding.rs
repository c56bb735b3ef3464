//! Target-group tags → [`Binding`]: which pods of which cluster fill a group.
//!
//! The binding lives on the target group itself (set by whatever IaC created it), so no
//! Kubernetes object is needed and the binding outlives the cluster. Every way the tags
//! can be wrong is a typed [`BindingError`] that names the tag and the fix; a bad binding
//! stops only its own group.
//!
//! Tags are an authority: whoever may tag a target group may point pods at it, and with
//! `tgsync/mode=exclusive` have tgsync remove everything else in it. A deployment limits
//! what tags may ask for with a [`BindingPolicy`]; a binding outside it is a binding
//! error like any other, so the group is left untouched.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;
use thiserror::Error;

use super::selector::{Selector, SelectorError};
use super::target::AddressFamily;

/// Tag naming the EKS cluster(s) whose pods fill the group, space separated.
pub const TAG_CLUSTER: &str = "tgsync/cluster";
/// Tag naming the namespace of the pods.
pub const TAG_NAMESPACE: &str = "tgsync/namespace";
/// Tag holding the space-separated equality selector.
pub const TAG_SELECTOR: &str = "tgsync/selector";
/// Optional tag: container port number or name (default: the group's port).
pub const TAG_PORT: &str = "tgsync/port";
/// Optional tag: `shared` (default) or `exclusive`.
pub const TAG_MODE: &str = "tgsync/mode";

/// How much of the group tgsync may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Deregister only targets tgsync registered; anything else in the group is left be.
    Shared,
    /// The group belongs to this cluster alone: any target that is not desired is removed.
    Exclusive,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Shared => "shared",
            Self::Exclusive => "exclusive",
        })
    }
}

/// Which port of a pod receives traffic.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PortSpec {
    /// A fixed port number (the `tgsync/port` number, or the group's own port).
    Number(u16),
    /// A named container port, resolved per pod.
    Name(String),
}

impl fmt::Display for PortSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Name(n) => f.write_str(n),
        }
    }
}

/// What tgsync needs to know about a target group besides its tags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupFacts {
    /// `TargetType` (`ip`, `instance`, `lambda`, `alb`); only `ip` can be bound.
    pub target_type: String,
    /// The group's port, the default target port (absent for some group types).
    pub port: Option<u16>,
    /// `IpAddressType` of the group.
    pub family: AddressFamily,
    /// The group's protocol is QUIC or TCP_QUIC: every target needs a QUIC server ID.
    pub quic: bool,
}

impl GroupFacts {
    /// Whether a group of this `Protocol` (ELBv2's string) registers targets with a QUIC
    /// server ID.
    pub fn is_quic_protocol(protocol: Option<&str>) -> bool {
        matches!(protocol, Some("QUIC" | "TCP_QUIC"))
    }
}

/// A valid set of binding tags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// Clusters whose pods fill the group (more than one for a group shared by clusters).
    pub clusters: Vec<String>,
    /// Namespace of the pods.
    pub namespace: String,
    /// Label selector within the namespace.
    pub selector: Selector,
    /// Which pod port is registered.
    pub port: PortSpec,
    /// Whether foreign targets are left alone.
    pub mode: Mode,
    /// The group's address family: which pod IP is registered.
    pub family: AddressFamily,
    /// A QUIC or TCP_QUIC group: each target carries its pod's QUIC server ID.
    pub quic: bool,
}

/// What this deployment lets target-group tags ask for (`TGSYNC_ALLOWED_NAMESPACES`,
/// `TGSYNC_ALLOW_EXCLUSIVE`). Checked on every binding read, at discovery and when a
/// pass re-reads the tags, so a tag changed later cannot get around it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BindingPolicy {
    /// Namespaces groups may be filled from; `None`: any namespace.
    pub allowed_namespaces: Option<BTreeSet<String>>,
    /// Whether a group may ask for `tgsync/mode=exclusive` (removing every target tgsync
    /// did not register). The deployment default is no: one tag should not be enough to
    /// empty a group of targets someone else put there.
    pub allow_exclusive: bool,
}

impl BindingPolicy {
    /// No limits: any namespace, exclusive mode allowed (the tag table alone decides).
    pub fn unrestricted() -> Self {
        Self {
            allowed_namespaces: None,
            allow_exclusive: true,
        }
    }

    /// Whether `binding` stays within the policy; the error names the tag, its value and
    /// the setting to change.
    pub fn check(&self, binding: &Binding) -> Result<(), BindingError> {
        if let Some(allowed) = &self.allowed_namespaces
            && !allowed.contains(&binding.namespace)
        {
            return Err(BindingError::NamespaceNotAllowed {
                namespace: binding.namespace.clone(),
                allowed: allowed.iter().cloned().collect::<Vec<_>>().join(" "),
            });
        }
        if binding.mode == Mode::Exclusive && !self.allow_exclusive {
            return Err(BindingError::ExclusiveNotAllowed);
        }
        Ok(())
    }
}

impl Binding {
    /// A fingerprint of everything the binding says (FNV-1a over its canonical text):
    /// equal for equal bindings, so the state table's index of bound groups records
    /// which binding each row was written for, and a change of any binding tag is a
    /// change of the index.
    pub fn fingerprint(&self) -> u64 {
        let mut clusters = self.clusters.clone();
        clusters.sort_unstable();
        let text = format!(
            "{}\n{}\n{}\n{}\n{}\n{:?}\n{}",
            clusters.join(" "),
            self.namespace,
            self.selector,
            self.port,
            self.mode,
            self.family,
            self.quic
        );
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in text.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        hash
    }

    /// Whether this binding names `cluster`, so that cluster's tgsync should manage it.
    pub fn binds_cluster(&self, cluster: &str) -> bool {
        self.clusters.iter().any(|c| c == cluster)
    }

    /// Reads the binding from a group's tags, within `policy`; `None` when the group does
    /// not name `cluster` at all (it is someone else's, not an error).
    pub fn for_cluster(
        tags: &BTreeMap<String, String>,
        group: &GroupFacts,
        cluster: &str,
        policy: &BindingPolicy,
    ) -> Option<Result<Self, BindingError>> {
        let named = tags
            .get(TAG_CLUSTER)?
            .split_whitespace()
            .any(|c| c == cluster);
        named.then(|| {
            let binding = Self::parse(tags, group)?;
            policy.check(&binding)?;
            Ok(binding)
        })
    }

    /// Reads the binding from a group's tags and facts, enforcing every rule of the
    /// design's tag table.
    pub fn parse(
        tags: &BTreeMap<String, String>,
        group: &GroupFacts,
    ) -> Result<Self, BindingError> {
        if group.target_type != "ip" {
            return Err(BindingError::UnsupportedTargetType(
                group.target_type.clone(),
            ));
        }
        let clusters: Vec<String> = required(tags, TAG_CLUSTER)?
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        for c in &clusters {
            if !is_cluster_name(c) {
                return Err(BindingError::BadClusterName(c.clone()));
            }
        }
        let namespace = required(tags, TAG_NAMESPACE)?.trim().to_owned();
        if !is_dns_label(&namespace) {
            return Err(BindingError::BadNamespace(namespace));
        }
        let selector =
            Selector::parse(required(tags, TAG_SELECTOR)?).map_err(BindingError::Selector)?;
        let port = match tags.get(TAG_PORT).map(|v| v.trim()) {
            Some(v) => parse_port(v)?,
            None => PortSpec::Number(group.port.ok_or(BindingError::NoDefaultPort)?),
        };
        let mode = match tags.get(TAG_MODE).map(|v| v.trim()) {
            None | Some("shared") => Mode::Shared,
            Some("exclusive") => Mode::Exclusive,
            Some(other) => return Err(BindingError::UnknownMode(other.to_owned())),
        };
        if mode == Mode::Exclusive && clusters.len() > 1 {
            return Err(BindingError::ExclusiveAcrossClusters(clusters.join(" ")));
        }
        Ok(Self {
            clusters,
            namespace,
            selector,
            port,
            mode,
            family: group.family,
            quic: group.quic,
        })
    }
}

/// Why a group's tags do not make a binding. Each message names the tag and what to write.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BindingError {
    /// Only IP target groups can hold pods.
    #[error(
        "target type `{0}` is not supported; tgsync fills only target groups of target type `ip`"
    )]
    UnsupportedTargetType(String),
    /// A required tag is absent.
    #[error("tag `{0}` is missing; add it to the target group")]
    MissingTag(&'static str),
    /// A required tag is present but blank.
    #[error("tag `{0}` is empty; give it a value")]
    EmptyTag(&'static str),
    /// A cluster name is not a valid EKS cluster name.
    #[error(
        "tag `tgsync/cluster` names `{0}`, which is not a valid EKS cluster name (letters, digits, `-` and `_`, starting with a letter or digit, at most 100)"
    )]
    BadClusterName(String),
    /// The namespace is not a valid Kubernetes namespace name.
    #[error(
        "tag `tgsync/namespace` is `{0}`, which is not a valid namespace name (lowercase letters, digits and `-`, at most 63)"
    )]
    BadNamespace(String),
    /// The selector tag does not parse.
    #[error("tag `tgsync/selector`: {0}")]
    Selector(SelectorError),
    /// The port tag is neither a port number nor a port name.
    #[error("tag `tgsync/port` is `{value}`: {reason}")]
    BadPort {
        /// The tag value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// No `tgsync/port` and the group has no port to default to.
    #[error(
        "the target group has no port; set tag `tgsync/port` to a container port number or name"
    )]
    NoDefaultPort,
    /// Exclusive mode on a group several clusters fill: each cluster would remove the
    /// others' targets.
    #[error(
        "tag `tgsync/mode` is `exclusive` but `tgsync/cluster` names several clusters ({0}); use `shared` for a group filled by more than one cluster"
    )]
    ExclusiveAcrossClusters(String),
    /// The mode tag is not a known mode.
    #[error("tag `tgsync/mode` is `{0}`; use `shared` (default) or `exclusive`")]
    UnknownMode(String),
    /// The namespace tag names a namespace this deployment may not fill groups from.
    #[error(
        "tag `tgsync/namespace` is `{namespace}`, which this deployment may not serve (allowed: {allowed}); add it to TGSYNC_ALLOWED_NAMESPACES (template parameter AllowedNamespaces) or fix the tag"
    )]
    NamespaceNotAllowed {
        /// The tag value.
        namespace: String,
        /// The allowed namespaces, space separated.
        allowed: String,
    },
    /// The mode tag asks for exclusive mode, which this deployment does not allow.
    #[error(
        "tag `tgsync/mode` is `exclusive`, which this deployment does not allow (it removes every target tgsync did not register); set TGSYNC_ALLOW_EXCLUSIVE=true (template parameter AllowExclusive) or use `shared`"
    )]
    ExclusiveNotAllowed,
}

fn required<'a>(
    tags: &'a BTreeMap<String, String>,
    key: &'static str,
) -> Result<&'a str, BindingError> {
    let value = tags.get(key).ok_or(BindingError::MissingTag(key))?;
    if value.trim().is_empty() {
        return Err(BindingError::EmptyTag(key));
    }
    Ok(value)
}

fn parse_port(value: &str) -> Result<PortSpec, BindingError> {
    let bad = |reason| BindingError::BadPort {
        value: value.to_owned(),
        reason,
    };
    if value.is_empty() {
        return Err(bad("give a port number (1-65535) or a container port name"));
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        return match value.parse::<u16>() {
            Ok(n) if n > 0 => Ok(PortSpec::Number(n)),
            _ => Err(bad("port numbers run from 1 to 65535")),
        };
    }
    if is_port_name(value) {
        Ok(PortSpec::Name(value.to_owned()))
    } else {
        Err(bad(
            "a port name has at most 15 lowercase letters, digits and single `-`, with at least one letter",
        ))
    }
}

/// Kubernetes `IANA_SVC_NAME`: what a container port name may be.
fn is_port_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 15
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.iter().any(|c| c.is_ascii_lowercase())
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && !s.contains("--")
}

/// Whether `s` is a valid Kubernetes namespace name (an RFC 1123 DNS label), as the
/// `tgsync/namespace` tag and `TGSYNC_ALLOWED_NAMESPACES` must hold.
pub fn is_namespace_name(s: &str) -> bool {
    is_dns_label(s)
}

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

fn is_cluster_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 100
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip_group(port: Option<u16>) -> GroupFacts {
        GroupFacts {
            target_type: "ip".into(),
            port,
            family: AddressFamily::Ipv4,
            quic: false,
        }
    }

    fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn base() -> BTreeMap<String, String> {
        tags(&[
            (TAG_CLUSTER, "prod-a prod-b"),
            (TAG_NAMESPACE, "shop"),
            (TAG_SELECTOR, "app.kubernetes.io/name=web tier=frontend"),
        ])
    }

    #[test]
    fn minimal_tags_default_to_group_port_and_shared() {
        let b = Binding::parse(&base(), &ip_group(Some(8080))).unwrap();
        assert_eq!(b.clusters, vec!["prod-a", "prod-b"]);
        assert_eq!(b.namespace, "shop");
        assert_eq!(b.port, PortSpec::Number(8080));
        assert_eq!(b.mode, Mode::Shared);
        assert!(b.binds_cluster("prod-b") && !b.binds_cluster("prod"));
    }

    #[test]
    fn port_and_mode_tags() {
        let mut t = base();
        t.insert(TAG_CLUSTER.into(), "prod-a".into());
        t.insert(TAG_PORT.into(), "http-alt".into());
        t.insert(TAG_MODE.into(), "exclusive".into());
        let b = Binding::parse(&t, &ip_group(None)).unwrap();
        assert_eq!(b.port, PortSpec::Name("http-alt".into()));
        assert_eq!(b.mode, Mode::Exclusive);
        t.insert(TAG_PORT.into(), "9092".into());
        assert_eq!(
            Binding::parse(&t, &ip_group(None)).unwrap().port,
            PortSpec::Number(9092)
        );
    }

    #[test]
    fn each_bad_tag_has_its_own_error() {
        let g = ip_group(Some(80));
        let cases: Vec<(BTreeMap<String, String>, BindingError)> = vec![
            (
                tags(&[(TAG_NAMESPACE, "a"), (TAG_SELECTOR, "x")]),
                BindingError::MissingTag(TAG_CLUSTER),
            ),
            (
                tags(&[(TAG_CLUSTER, "c"), (TAG_SELECTOR, "x")]),
                BindingError::MissingTag(TAG_NAMESPACE),
            ),
            (
                tags(&[(TAG_CLUSTER, "c"), (TAG_NAMESPACE, "a")]),
                BindingError::MissingTag(TAG_SELECTOR),
            ),
            (
                tags(&[
                    (TAG_CLUSTER, "c"),
                    (TAG_NAMESPACE, "a"),
                    (TAG_SELECTOR, "  "),
                ]),
                BindingError::EmptyTag(TAG_SELECTOR),
            ),
            (
                tags(&[
                    (TAG_CLUSTER, "c"),
                    (TAG_NAMESPACE, "Shop"),
                    (TAG_SELECTOR, "x"),
                ]),
                BindingError::BadNamespace("Shop".into()),
            ),
            (
                tags(&[
                    (TAG_CLUSTER, "c,d"),
                    (TAG_NAMESPACE, "a"),
                    (TAG_SELECTOR, "x"),
                ]),
                BindingError::BadClusterName("c,d".into()),
            ),
        ];
        for (t, want) in cases {
            assert_eq!(Binding::parse(&t, &g), Err(want));
        }
        let mut t = base();
        t.insert(TAG_SELECTOR.into(), "app!=web".into());
        assert!(matches!(
            Binding::parse(&t, &g),
            Err(BindingError::Selector(SelectorError::BadTerm { .. }))
        ));
        for bad_port in [
            "0",
            "65536",
            "-1",
            "HTTP",
            "a_b",
            "sixteen-chars-xx",
            "80a-",
        ] {
            let mut t = base();
            t.insert(TAG_PORT.into(), bad_port.into());
            assert!(
                matches!(Binding::parse(&t, &g), Err(BindingError::BadPort { .. })),
                "{bad_port}"
            );
        }
        let mut t = base();
        t.insert(TAG_MODE.into(), "exclusive".into());
        assert_eq!(
            Binding::parse(&t, &g),
            Err(BindingError::ExclusiveAcrossClusters(
                "prod-a prod-b".into()
            ))
        );
        let mut t = base();
        t.insert(TAG_MODE.into(), "Exclusive".into());
        assert_eq!(
            Binding::parse(&t, &g),
            Err(BindingError::UnknownMode("Exclusive".into()))
        );
        assert_eq!(
            Binding::parse(&base(), &ip_group(None)),
            Err(BindingError::NoDefaultPort)
        );
    }

    #[test]
    fn a_quic_group_binds_for_targets_with_server_ids() {
        assert!(GroupFacts::is_quic_protocol(Some("QUIC")));
        assert!(GroupFacts::is_quic_protocol(Some("TCP_QUIC")));
        for other in [
            None,
            Some("TCP"),
            Some("UDP"),
            Some("TCP_UDP"),
            Some("quic"),
        ] {
            assert!(!GroupFacts::is_quic_protocol(other), "{other:?}");
        }
        let mut g = ip_group(Some(443));
        assert!(!Binding::parse(&base(), &g).unwrap().quic);
        g.quic = true;
        assert!(Binding::parse(&base(), &g).unwrap().quic);
    }

    #[test]
    fn only_ip_groups_bind() {
        let g = GroupFacts {
            target_type: "instance".into(),
            port: Some(80),
            family: AddressFamily::Ipv4,
            quic: false,
        };
        let err = Binding::parse(&base(), &g).unwrap_err();
        assert_eq!(err, BindingError::UnsupportedTargetType("instance".into()));
        assert!(err.to_string().contains("target type `ip`"));
    }

    #[test]
    fn a_binding_fingerprint_changes_with_any_binding_tag() {
        let facts = GroupFacts {
            target_type: "ip".into(),
            port: Some(8080),
            family: AddressFamily::Ipv4,
            quic: false,
        };
        let bind = |extra: &[(&str, &str)]| {
            let mut t = tags(&[
                ("tgsync/cluster", "demo"),
                ("tgsync/namespace", "shop"),
                ("tgsync/selector", "app=web"),
            ]);
            for (k, v) in extra {
                t.insert((*k).to_owned(), (*v).to_owned());
            }
            Binding::for_cluster(&t, &facts, "demo", &BindingPolicy::unrestricted())
                .unwrap()
                .unwrap()
                .fingerprint()
        };
        let base = bind(&[]);
        assert_eq!(base, bind(&[("other", "tag")]), "other tags do not bind");
        for changed in [
            ("tgsync/port", "9090"),
            ("tgsync/mode", "exclusive"),
            ("tgsync/selector", "app=web tier=fe"),
            ("tgsync/namespace", "bank"),
            ("tgsync/cluster", "demo other"),
        ] {
            assert_ne!(base, bind(&[changed]), "{changed:?}");
        }
    }

    #[test]
    fn for_cluster_ignores_groups_of_other_clusters() {
        let g = ip_group(Some(80));
        let any = BindingPolicy::unrestricted();
        assert!(Binding::for_cluster(&base(), &g, "prod-a", &any).is_some());
        assert!(Binding::for_cluster(&base(), &g, "staging", &any).is_none());
        assert!(Binding::for_cluster(&BTreeMap::new(), &g, "prod-a", &any).is_none());
        let mut bad = base();
        bad.remove(TAG_NAMESPACE);
        assert!(matches!(
            Binding::for_cluster(&bad, &g, "prod-a", &any),
            Some(Err(BindingError::MissingTag(TAG_NAMESPACE)))
        ));
        // Another cluster's group is not this deployment's business, whatever it asks.
        let strict = BindingPolicy {
            allowed_namespaces: Some(BTreeSet::from(["other".to_owned()])),
            allow_exclusive: false,
        };
        assert!(Binding::for_cluster(&base(), &g, "staging", &strict).is_none());
    }

    fn policy(namespaces: Option<&[&str]>, allow_exclusive: bool) -> BindingPolicy {
        BindingPolicy {
            allowed_namespaces: namespaces.map(|n| n.iter().map(|s| (*s).to_owned()).collect()),
            allow_exclusive,
        }
    }

    fn single_cluster(mode: Option<&str>) -> BTreeMap<String, String> {
        let mut t = base();
        t.insert(TAG_CLUSTER.into(), "prod-a".into());
        if let Some(m) = mode {
            t.insert(TAG_MODE.into(), m.into());
        }
        t
    }

    #[test]
    fn a_namespace_outside_the_allowed_list_is_a_binding_error() {
        let g = ip_group(Some(80));
        let tags = single_cluster(None);
        let only_kafka = policy(Some(&["kafka", "payments"]), false);
        let err = Binding::for_cluster(&tags, &g, "prod-a", &only_kafka)
            .expect("names the cluster")
            .unwrap_err();
        assert_eq!(
            err,
            BindingError::NamespaceNotAllowed {
                namespace: "shop".into(),
                allowed: "kafka payments".into(),
            }
        );
        let msg = err.to_string();
        for needle in [
            "tgsync/namespace",
            "`shop`",
            "TGSYNC_ALLOWED_NAMESPACES",
            "AllowedNamespaces",
        ] {
            assert!(msg.contains(needle), "{needle} in {msg}");
        }
        // Listed: bound. No list: any namespace.
        let with_shop = policy(Some(&["kafka", "shop"]), false);
        assert!(matches!(
            Binding::for_cluster(&tags, &g, "prod-a", &with_shop),
            Some(Ok(_))
        ));
        assert!(matches!(
            Binding::for_cluster(&tags, &g, "prod-a", &BindingPolicy::default()),
            Some(Ok(_))
        ));
    }

    #[test]
    fn exclusive_mode_needs_the_deployment_to_allow_it() {
        let g = ip_group(Some(80));
        let exclusive = single_cluster(Some("exclusive"));
        // The deployment default: any namespace, no exclusive mode.
        let defaults = BindingPolicy::default();
        assert_eq!(defaults.allowed_namespaces, None);
        assert!(!defaults.allow_exclusive);
        let err = Binding::for_cluster(&exclusive, &g, "prod-a", &defaults)
            .expect("names the cluster")
            .unwrap_err();
        assert_eq!(err, BindingError::ExclusiveNotAllowed);
        let msg = err.to_string();
        for needle in [
            "tgsync/mode",
            "`exclusive`",
            "TGSYNC_ALLOW_EXCLUSIVE",
            "AllowExclusive",
        ] {
            assert!(msg.contains(needle), "{needle} in {msg}");
        }
        // Shared mode is never limited by it; exclusive is fine once allowed.
        let shared = single_cluster(Some("shared"));
        assert!(matches!(
            Binding::for_cluster(&shared, &g, "prod-a", &defaults),
            Some(Ok(_))
        ));
        let b = Binding::for_cluster(&exclusive, &g, "prod-a", &policy(None, true))
            .expect("names the cluster")
            .expect("allowed");
        assert_eq!(b.mode, Mode::Exclusive);
        // A malformed tag is reported as such before the policy is consulted.
        let unknown = single_cluster(Some("Exclusive"));
        assert_eq!(
            Binding::for_cluster(&unknown, &g, "prod-a", &defaults),
            Some(Err(BindingError::UnknownMode("Exclusive".into())))
        );
    }

    #[test]
    fn namespace_names_are_dns_labels() {
        assert!(is_namespace_name("kube-system") && is_namespace_name("a1"));
        for bad in ["", "Shop", "-a", "a-", "a_b", "a.b", &"x".repeat(64)] {
            assert!(!is_namespace_name(bad), "{bad}");
        }
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            ".{0,40}",
            "[a-z0-9=/. _-]{0,30}",
            Just(String::new()),
            Just("app=web tier".to_owned()),
            Just("65536".to_owned()),
            Just("exclusive".to_owned()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000)
        ))]

        /// Any tag values and group facts: no panic; an error is one line that names the
        /// tag (or the target type) to fix.
        #[test]
        fn any_tags_parse_or_fail_clearly(
            cluster in value(), namespace in value(), selector in value(),
            port in proptest::option::of(value()), mode in proptest::option::of(value()),
            group_port in proptest::option::of(any::<u16>()), ip in any::<bool>(),
        ) {
            let mut tags = BTreeMap::from([
                (TAG_CLUSTER.to_owned(), cluster),
                (TAG_NAMESPACE.to_owned(), namespace),
                (TAG_SELECTOR.to_owned(), selector),
            ]);
            if let Some(p) = port { tags.insert(TAG_PORT.to_owned(), p); }
            if let Some(m) = mode { tags.insert(TAG_MODE.to_owned(), m); }
            let facts = GroupFacts {
                target_type: if ip { "ip".into() } else { "instance".into() },
                port: group_port,
                family: AddressFamily::Ipv4,
                quic: false,
            };
            match Binding::parse(&tags, &facts) {
                Ok(b) => {
                    prop_assert!(!b.clusters.is_empty() && !b.selector.terms().is_empty());
                    prop_assert!(ip);
                }
                Err(e) => {
                    let msg = e.to_string();
                    prop_assert!(!msg.contains('\n'), "{msg}");
                    prop_assert!(msg.contains("tgsync/") || msg.contains("target type"), "{msg}");
                }
            }
            // Within a strict policy: never a binding the policy forbids, and any error
            // still names the tag to fix.
            let strict = BindingPolicy {
                allowed_namespaces: Some(BTreeSet::from(["shop".to_owned()])),
                allow_exclusive: false,
            };
            let cluster = tags[TAG_CLUSTER].split_whitespace().next().unwrap_or("").to_owned();
            if let Some(result) = Binding::for_cluster(&tags, &facts, &cluster, &strict) {
                match result {
                    Ok(b) => prop_assert!(b.namespace == "shop" && b.mode == Mode::Shared),
                    Err(e) => {
                        let msg = e.to_string();
                        prop_assert!(!msg.contains('\n'), "{msg}");
                        prop_assert!(msg.contains("tgsync/") || msg.contains("target type"), "{msg}");
                    }
                }
            }
        }
    }
}
