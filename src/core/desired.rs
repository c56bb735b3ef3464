//! Pods + binding → the targets a group should hold, and why every other selected pod
//! yields none.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;

use super::binding::{Binding, PortSpec};
use super::pod::{PodFacts, PodRef};
use super::target::{AddressFamily, QuicServerId, Target};

/// Why a selected pod yields no target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "camelCase")]
pub enum SkipReason {
    /// Annotated `tgsync/exclude: "true"`.
    Excluded,
    /// `metadata.deletionTimestamp` is set: removed at once so the NLB starts draining.
    Terminating,
    /// `status.phase` is not `Running`.
    NotRunning {
        /// The phase seen (empty when unset).
        phase: String,
    },
    /// No IP of the group's family in `status.podIPs`.
    NoAddress {
        /// The family the group needs.
        family: AddressFamily,
    },
    /// The pod's address is one ELBv2 never takes (loopback, link-local, unspecified,
    /// multicast, broadcast, IPv4-mapped): never sent. A pod error.
    UnusableAddress {
        /// The address.
        address: String,
        /// What kind of address it is.
        why: &'static str,
    },
    /// The `Ready` condition is not True.
    NotReady,
    /// Gated pod whose `ContainersReady` condition is not True yet.
    ContainersNotReady,
    /// The binding's named port is not declared by any container: a pod error.
    PortNotFound {
        /// The port name looked for.
        port: String,
    },
    /// The group is QUIC or TCP_QUIC and the pod has neither a `tgsync/quic-server-id`
    /// annotation nor a UID to derive a server ID from: ELBv2 registers no target there
    /// without one. A pod error.
    QuicServerIdMissing,
    /// The pod's `tgsync/quic-server-id` annotation is not a server ID: a pod error.
    QuicServerIdInvalid {
        /// What is wrong with it.
        error: String,
    },
    /// Another selected pod already registers with the same QUIC server ID, which must
    /// be unique behind a listener: a pod error.
    DuplicateQuicServerId {
        /// The contested ID.
        id: String,
        /// The pod that kept it (`namespace/name`).
        kept_for: String,
    },
    /// Another selected pod already yields the same target: a pod error.
    DuplicateTarget {
        /// The contested target.
        target: Target,
        /// The pod that kept it (`namespace/name`).
        kept_for: String,
    },
}

impl SkipReason {
    /// Pod errors need an operator (fix the port name, the duplicate); the rest are normal
    /// lifecycle states that resolve themselves.
    pub fn is_error(&self) -> bool {
        matches!(
            self,
            Self::PortNotFound { .. }
                | Self::UnusableAddress { .. }
                | Self::DuplicateTarget { .. }
                | Self::QuicServerIdMissing
                | Self::QuicServerIdInvalid { .. }
                | Self::DuplicateQuicServerId { .. }
        )
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Excluded => f.write_str("excluded by annotation tgsync/exclude"),
            Self::Terminating => f.write_str("terminating"),
            Self::NotRunning { phase } if phase.is_empty() => f.write_str("no phase yet"),
            Self::NotRunning { phase } => write!(f, "phase is {phase}, not Running"),
            Self::NoAddress { family } => write!(f, "no {family} address in status.podIPs"),
            Self::UnusableAddress { address, why } => write!(
                f,
                "address {address} is {why}: ELBv2 never registers such an address, so it is not sent; check the pod's network (status.podIPs)"
            ),
            Self::NotReady => f.write_str("Ready condition is not True"),
            Self::ContainersNotReady => f.write_str(
                "ContainersReady condition is not True (readiness gate tgsync/target-health)",
            ),
            Self::PortNotFound { port } => write!(
                f,
                "no container declares a port named `{port}`; fix the pod spec or the tgsync/port tag"
            ),
            Self::QuicServerIdMissing => f.write_str(
                "the group is QUIC or TCP_QUIC and the pod has no UID to derive its server ID from (and no `tgsync/quic-server-id` annotation)",
            ),
            Self::QuicServerIdInvalid { error } => {
                write!(f, "annotation `tgsync/quic-server-id`: {error}")
            }
            Self::DuplicateQuicServerId { id, kept_for } => write!(
                f,
                "QUIC server ID {id} is already used by pod {kept_for}; server IDs must be unique behind a listener"
            ),
            Self::DuplicateTarget { target, kept_for } => {
                write!(f, "target {target} is already yielded by pod {kept_for}")
            }
        }
    }
}

/// A selected pod that yields no target, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// The pod.
    pub pod: Arc<PodRef>,
    /// Why.
    #[serde(flatten)]
    pub reason: SkipReason,
}

/// The targets a group should hold and the selected pods that yield none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Desired targets, each with the pod it comes from (sorted by target).
    pub targets: BTreeMap<Target, DesiredTarget>,
    /// Selected pods that yield no target, in input order.
    pub skipped: Vec<Skipped>,
}

/// A desired target's origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredTarget {
    /// The pod it comes from.
    pub pod: Arc<PodRef>,
    /// `Some(open)` when the pod carries the `tgsync/target-health` readiness gate.
    pub gate: Option<bool>,
    /// The pod's node (`spec.nodeName`), whose zone a registration outside the group's
    /// VPC may need.
    pub node: Option<Arc<str>>,
}

/// Computes the desired targets of one bound group from candidate pods.
///
/// Pods outside the binding's namespace or selector are ignored without a reason (they
/// are not this group's business); callers may pass any superset of the selected pods.
pub fn desired_targets<'a>(
    pods: impl IntoIterator<Item = &'a PodFacts>,
    binding: &Binding,
) -> Desired {
    let mut out = Desired::default();
    // QUIC server IDs taken so far (QUIC groups only), and by which pod.
    let mut server_ids: BTreeMap<QuicServerId, Arc<PodRef>> = BTreeMap::new();
    for pod in pods {
        if pod.pod.namespace != binding.namespace || !binding.selector.matches(&pod.labels) {
            continue;
        }
        match target_of(pod, binding) {
            Ok(target) => {
                let same_address = out
                    .targets
                    .range(Target::new(target.ip, target.port)..)
                    .next()
                    .filter(|(t, _)| t.ip == target.ip && t.port == target.port);
                if let Some((_, existing)) = same_address {
                    let kept_for = existing.pod.to_string();
                    out.skipped.push(Skipped {
                        pod: pod.pod.clone(),
                        reason: SkipReason::DuplicateTarget { target, kept_for },
                    });
                } else if let Some(id) = target.quic_server_id
                    && let Some(holder) = server_ids.get(&id)
                {
                    out.skipped.push(Skipped {
                        pod: pod.pod.clone(),
                        reason: SkipReason::DuplicateQuicServerId {
                            id: id.to_string(),
                            kept_for: holder.to_string(),
                        },
                    });
                } else {
                    if let Some(id) = target.quic_server_id {
                        server_ids.insert(id, pod.pod.clone());
                    }
                    out.targets.insert(
                        target,
                        DesiredTarget {
                            pod: pod.pod.clone(),
                            gate: pod.gate,
                            node: pod.node_name.clone(),
                        },
                    );
                }
            }
            Err(reason) => out.skipped.push(Skipped {
                pod: pod.pod.clone(),
                reason,
            }),
        }
    }
    out
}

/// What one pod contributes to a bound group: its target and, for a gated pod, whether
/// its gate is open; `None` when the binding does not select it or it yields no target.
/// Two states of a pod with the same contribution make no difference to the group (the
/// watch loop uses this to tell which pod changes need a pass).
pub fn contribution(pod: &PodFacts, binding: &Binding) -> Option<(Target, Option<bool>)> {
    if pod.pod.namespace != binding.namespace || !binding.selector.matches(&pod.labels) {
        return None;
    }
    target_of(pod, binding).ok().map(|t| (t, pod.gate))
}

/// What a bound group's binding means for a gated pod's gate: `None` when it does not
/// select the pod, or the pod is not ready to be judged yet (not running, terminating,
/// containers not ready: the same for every group); `Some(Ok(target))` when the group
/// holds the pod as `target`; `Some(Err(why))` when it selects the pod but can never
/// hold it as it is (a pod error, or no address of the group's family): the gate
/// waits for such a group too, and says why.
pub fn holding(pod: &PodFacts, binding: &Binding) -> Option<Result<Target, SkipReason>> {
    if pod.pod.namespace != binding.namespace || !binding.selector.matches(&pod.labels) {
        return None;
    }
    match target_of(pod, binding) {
        Ok(target) => Some(Ok(target)),
        Err(why) if why.is_error() || matches!(why, SkipReason::NoAddress { .. }) => Some(Err(why)),
        Err(_) => None,
    }
}

/// The address a pod serves on in a group of `family`, by every readiness rule but the
/// port's (which the group's tags give): `None` when it yields no target whatever the
/// port. A cold container compares a LIST with the groups' ledgers by it before it
/// has read any tags.
pub fn serving_ip(pod: &PodFacts, family: AddressFamily) -> Option<IpAddr> {
    serving(pod, family).ok()
}

/// The design's readiness rules up to the port, in the order an operator would want
/// them reported.
fn serving(pod: &PodFacts, family: AddressFamily) -> Result<IpAddr, SkipReason> {
    if pod.excluded {
        return Err(SkipReason::Excluded);
    }
    if pod.terminating {
        return Err(SkipReason::Terminating);
    }
    if pod.phase != "Running" {
        return Err(SkipReason::NotRunning {
            phase: pod.phase.clone(),
        });
    }
    let Some(ip) = pod.ip(family) else {
        return Err(match pod.unusable_ip {
            Some((ip, why)) if AddressFamily::of(ip) == family => SkipReason::UnusableAddress {
                address: ip.to_string(),
                why,
            },
            _ => SkipReason::NoAddress { family },
        });
    };
    match pod.gate {
        Some(_) if !pod.containers_ready => Err(SkipReason::ContainersNotReady),
        None if !pod.ready => Err(SkipReason::NotReady),
        Some(_) | None => Ok(ip),
    }
}

/// The design's readiness rules, in the order an operator would want them reported.
fn target_of(pod: &PodFacts, binding: &Binding) -> Result<Target, SkipReason> {
    let ip = serving(pod, binding.family)?;
    let port = match &binding.port {
        PortSpec::Number(n) => *n,
        PortSpec::Name(name) => pod
            .named_port(name)
            .ok_or_else(|| SkipReason::PortNotFound { port: name.clone() })?,
    };
    let target = Target::new(ip, port);
    if !binding.quic {
        // Other protocols never send a server ID, whatever the pod says.
        return Ok(target);
    }
    // The annotation wins; without it, the ID derived from the pod's UID.
    let id = match pod.quic_server_id.as_deref() {
        Some(written) => {
            written
                .parse::<QuicServerId>()
                .map_err(|e| SkipReason::QuicServerIdInvalid {
                    error: e.to_string(),
                })?
        }
        None if !pod.pod.uid.is_empty() => QuicServerId::from_uid(&pod.pod.uid),
        None => return Err(SkipReason::QuicServerIdMissing),
    };
    Ok(target.with_quic_server_id(id))
}

#[cfg(test)]
mod tests {
    use super::super::test_fixtures::{binding, fixture, shop_web};
    use super::*;

    fn reason_of(name: &str, b: &Binding) -> Option<SkipReason> {
        let facts = PodFacts::from_pod(fixture(name));
        let d = desired_targets([&facts], b);
        d.skipped.first().map(|s| s.reason.clone())
    }

    fn target_of_fixture(name: &str, b: &Binding) -> Option<String> {
        let facts = PodFacts::from_pod(fixture(name));
        let d = desired_targets([&facts], b);
        d.targets.keys().next().map(Target::to_string)
    }

    #[test]
    fn running_ready_pod_is_a_target_on_the_group_port() {
        let b = shop_web(8080);
        assert_eq!(
            target_of_fixture("running", &b).as_deref(),
            Some("10.0.1.10:8080")
        );
    }

    #[test]
    fn lifecycle_states_give_their_reasons() {
        let b = shop_web(8080);
        assert_eq!(
            reason_of("pending", &b),
            Some(SkipReason::NotRunning {
                phase: "Pending".into()
            })
        );
        assert_eq!(reason_of("terminating", &b), Some(SkipReason::Terminating));
        assert_eq!(reason_of("not-ready", &b), Some(SkipReason::NotReady));
        assert_eq!(reason_of("excluded", &b), Some(SkipReason::Excluded));
        assert_eq!(
            reason_of("missing-ip", &b),
            Some(SkipReason::NoAddress {
                family: AddressFamily::Ipv4
            })
        );
        assert_eq!(
            reason_of("succeeded", &b),
            Some(SkipReason::NotRunning {
                phase: "Succeeded".into()
            })
        );
    }

    #[test]
    fn gated_pod_is_registered_on_containers_ready_before_ready() {
        let b = shop_web(8080);
        let facts = PodFacts::from_pod(fixture("gated"));
        assert!(!facts.ready && facts.containers_ready);
        let d = desired_targets([&facts], &b);
        let (target, origin) = d.targets.iter().next().expect("gated pod is desired");
        assert_eq!(target.to_string(), "10.0.1.14:8080");
        assert_eq!(origin.gate, Some(false));
        assert_eq!(origin.pod.name, "web-gated");
    }

    #[test]
    fn gated_pod_waits_for_containers_ready() {
        let b = shop_web(8080);
        assert_eq!(
            reason_of("gated-starting", &b),
            Some(SkipReason::ContainersNotReady)
        );
    }

    #[test]
    fn ipv6_group_takes_the_ipv6_address_of_a_dual_stack_pod() {
        let mut b = shop_web(8080);
        assert_eq!(
            target_of_fixture("dual-stack", &b).as_deref(),
            Some("10.0.1.15:8080")
        );
        b.family = AddressFamily::Ipv6;
        assert_eq!(
            target_of_fixture("dual-stack", &b).as_deref(),
            Some("[2600:1f18:abcd:1::f]:8080")
        );
        assert_eq!(
            reason_of("running", &b),
            Some(SkipReason::NoAddress {
                family: AddressFamily::Ipv6
            })
        );
    }

    #[test]
    fn host_network_pod_registers_its_node_ip() {
        let b = shop_web(8080);
        let facts = PodFacts::from_pod(fixture("host-network"));
        assert!(facts.host_network);
        assert_eq!(
            target_of_fixture("host-network", &b).as_deref(),
            Some("10.0.0.21:8080")
        );
    }

    #[test]
    fn named_ports_resolve_per_pod_or_give_a_pod_error() {
        let b = binding("shop", "app=web", PortSpec::Name("metrics".into()));
        assert_eq!(
            target_of_fixture("running", &b).as_deref(),
            Some("10.0.1.10:9090")
        );
        let b = binding("shop", "app=web", PortSpec::Name("admin".into()));
        let reason = reason_of("running", &b).expect("port missing");
        assert_eq!(
            reason,
            SkipReason::PortNotFound {
                port: "admin".into()
            }
        );
        assert!(reason.is_error());
        assert!(reason.to_string().contains("tgsync/port"));
    }

    #[test]
    fn named_ports_of_native_sidecars_resolve_but_not_those_of_init_containers() {
        let b = binding("shop", "app=web", PortSpec::Name("proxy".into()));
        assert_eq!(
            target_of_fixture("native-sidecar", &b).as_deref(),
            Some("10.0.1.16:15001")
        );
        // The app container's `http` comes before the sidecar's `http`.
        let b = binding("shop", "app=web", PortSpec::Name("http".into()));
        assert_eq!(
            target_of_fixture("native-sidecar", &b).as_deref(),
            Some("10.0.1.16:8080")
        );
        // `setup` belongs to a plain init container, which has exited by then.
        let b = binding("shop", "app=web", PortSpec::Name("setup".into()));
        assert_eq!(
            reason_of("native-sidecar", &b),
            Some(SkipReason::PortNotFound {
                port: "setup".into()
            })
        );
        let facts = PodFacts::from_pod(fixture("native-sidecar"));
        assert_eq!(
            facts.named_ports,
            [
                ("http".to_owned(), 8080),
                ("metrics".to_owned(), 9090),
                ("proxy".to_owned(), 15001),
                ("http".to_owned(), 15080),
            ]
        );
    }

    #[test]
    fn unselected_pods_are_ignored_silently() {
        let other_ns = binding("billing", "app=web", PortSpec::Number(80));
        let facts = PodFacts::from_pod(fixture("running"));
        let d = desired_targets([&facts], &other_ns);
        assert!(d.targets.is_empty() && d.skipped.is_empty());
        let other_app = binding("shop", "app=api", PortSpec::Number(80));
        let d = desired_targets([&facts], &other_app);
        assert!(d.targets.is_empty() && d.skipped.is_empty());
    }

    #[test]
    fn duplicate_targets_keep_the_first_and_report_the_second() {
        let b = shop_web(8080);
        let a = PodFacts::from_pod(fixture("running"));
        let mut twin = a.clone();
        twin.pod = Arc::new(PodRef {
            namespace: "shop".into(),
            name: "web-twin".into(),
            uid: "u2".into(),
        });
        let d = desired_targets([&a, &twin], &b);
        assert_eq!(d.targets.len(), 1);
        assert_eq!(d.skipped.len(), 1);
        assert!(d.skipped[0].reason.is_error());
    }

    /// Addresses ELBv2 can never take are never sent: the pod is a pod error naming the
    /// address and why, whichever decoder read it (the typed pod or the LIST decoder's
    /// shared [`Addresses`](super::super::pod::Addresses)).
    #[test]
    fn an_address_elbv2_never_takes_is_a_pod_error_not_a_target() {
        let b = shop_web(8080);
        for (ip, why) in [
            ("127.0.0.1", "loopback"),
            ("169.254.10.20", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("224.0.0.5", "multicast"),
            ("255.255.255.255", "broadcast"),
        ] {
            let mut pod = fixture("running");
            let status = pod.status.as_mut().unwrap();
            status.pod_ip = Some(ip.into());
            status.pod_ips = None;
            let facts = PodFacts::from_pod(pod);
            let d = desired_targets([&facts], &b);
            assert!(d.targets.is_empty(), "{ip} was made a target");
            let reason = &d.skipped[0].reason;
            assert!(reason.is_error(), "{ip}: {reason}");
            let said = reason.to_string();
            assert!(said.contains(ip) && said.contains(why), "{ip}: {said}");
        }
        let mut v6 = b.clone();
        v6.family = AddressFamily::Ipv6;
        for (ip, why) in [
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("::", "unspecified"),
            ("ff02::1", "multicast"),
            ("::ffff:10.0.1.10", "IPv4-mapped"),
        ] {
            let mut pod = fixture("running");
            let status = pod.status.as_mut().unwrap();
            status.pod_ip = Some(ip.into());
            status.pod_ips = None;
            let facts = PodFacts::from_pod(pod);
            let d = desired_targets([&facts], &v6);
            assert!(d.targets.is_empty(), "{ip} was made a target");
            let said = d.skipped[0].reason.to_string();
            assert!(said.contains(why), "{ip}: {said}");
        }
        // A usable address beside an unusable one is the pod's.
        let mut pod = fixture("running");
        let status = pod.status.as_mut().unwrap();
        status.pod_ips = Some(vec![
            k8s_openapi::api::core::v1::PodIP {
                ip: "169.254.1.1".into(),
            },
            k8s_openapi::api::core::v1::PodIP {
                ip: "10.0.1.10".into(),
            },
        ]);
        let facts = PodFacts::from_pod(pod);
        let d = desired_targets([&facts], &b);
        assert_eq!(d.targets.len(), 1, "{d:?}");
    }

    fn quic(mut b: Binding) -> Binding {
        b.quic = true;
        b
    }

    fn with_id(name: &str, id: Option<&str>) -> PodFacts {
        let mut facts = PodFacts::from_pod(fixture(name));
        facts.quic_server_id = id.map(str::to_owned);
        facts
    }

    #[test]
    fn a_quic_group_takes_the_server_id_from_the_annotation() {
        let b = quic(shop_web(443));
        let d = desired_targets([&with_id("running", Some("0x0123456789abcdef"))], &b);
        let t = d.targets.keys().next().expect("a target");
        assert_eq!(t.to_string(), "10.0.1.10:443@0x0123456789abcdef");
        // Other protocols never send one, whatever the pod says.
        let d = desired_targets(
            [&with_id("running", Some("0x0123456789abcdef"))],
            &shop_web(443),
        );
        assert_eq!(d.targets.keys().next().unwrap().quic_server_id, None);
    }

    #[test]
    fn a_quic_pod_without_a_valid_server_id_is_a_pod_error() {
        let b = quic(shop_web(443));
        for (id, expect) in [
            (Some("0x0123"), "exactly 16 hex digits"),
            (Some("0x0123456789ABCDEF"), "lowercase"),
            (Some("123456789abcdef01"), "`0x`"),
        ] {
            let d = desired_targets([&with_id("running", id)], &b);
            assert!(d.targets.is_empty(), "{id:?}");
            let reason = &d.skipped[0].reason;
            assert!(reason.is_error(), "{id:?}");
            assert!(reason.to_string().contains(expect), "{id:?}: {reason}");
        }
        // A pod that is not ready is not ready, whatever its annotation.
        let d = desired_targets([&with_id("not-ready", None)], &b);
        assert_eq!(d.skipped[0].reason, SkipReason::NotReady);
    }

    /// Nothing in the cluster need write a server ID: a pod without the annotation
    /// takes `0x` and the first 16 hex digits of SHA-256 of its UID (the app computes
    /// the same from `metadata.uid`); the annotation still wins; a pod with neither is a
    /// pod error; two pods whose IDs collide keep the first.
    #[test]
    fn a_quic_pod_without_the_annotation_takes_the_id_of_its_uid() {
        let b = quic(shop_web(443));
        let mut pod = with_id("running", None);
        pod.pod = Arc::new(PodRef {
            namespace: "shop".into(),
            name: "web-1".into(),
            uid: "9f0c2d4e-1b7a-4c3e-8d2f-5a6b7c8d9e0f".into(),
        });
        let d = desired_targets([&pod], &b);
        let t = d.targets.keys().next().expect("a target");
        // printf %s 9f0c2d4e-1b7a-4c3e-8d2f-5a6b7c8d9e0f | sha256sum | cut -c1-16
        assert_eq!(t.to_string(), "10.0.1.10:443@0x63842863fc2f30ab");
        let mut written = pod.clone();
        written.quic_server_id = Some("0x0123456789abcdef".into());
        let d = desired_targets([&written], &b);
        let t = d.targets.keys().next().expect("a target");
        assert_eq!(t.to_string(), "10.0.1.10:443@0x0123456789abcdef");
        let mut no_uid = pod.clone();
        no_uid.pod = Arc::new(PodRef {
            namespace: "shop".into(),
            name: "web-1".into(),
            uid: String::new(),
        });
        let d = desired_targets([&no_uid], &b);
        assert!(d.targets.is_empty());
        assert!(d.skipped[0].reason.is_error());
        assert!(
            d.skipped[0].reason.to_string().contains("no UID"),
            "{}",
            d.skipped[0].reason
        );
        // Another pod (another address) given web-1's derived ID by hand: a collision.
        let mut twin = with_id("running", Some("0x63842863fc2f30ab"));
        twin.ipv4 = Some("10.0.1.11".parse().unwrap());
        let d = desired_targets([&pod, &twin], &b);
        assert_eq!(d.targets.len(), 1);
        assert!(matches!(
            d.skipped[0].reason,
            SkipReason::DuplicateQuicServerId { .. }
        ));
    }

    #[test]
    fn server_ids_are_unique_and_one_address_is_one_target_whatever_its_id() {
        let b = quic(shop_web(443));
        let a = with_id("running", Some("0x0000000000000001"));
        let mut same_id = with_id("gated", Some("0x0000000000000001"));
        same_id.pod = Arc::new(PodRef {
            namespace: "shop".into(),
            name: "web-same-id".into(),
            uid: "u3".into(),
        });
        let mut same_ip = with_id("running", Some("0x0000000000000002"));
        same_ip.pod = Arc::new(PodRef {
            namespace: "shop".into(),
            name: "web-same-ip".into(),
            uid: "u4".into(),
        });
        let d = desired_targets([&a, &same_id, &same_ip], &b);
        assert_eq!(d.targets.len(), 1);
        assert!(matches!(
            d.skipped[0].reason,
            SkipReason::DuplicateQuicServerId { .. }
        ));
        assert!(matches!(
            d.skipped[1].reason,
            SkipReason::DuplicateTarget { .. }
        ));
        assert!(d.skipped.iter().all(|s| s.reason.is_error()));
    }

    #[test]
    fn every_fixture_yields_a_target_or_a_reason() {
        let b = shop_web(8080);
        for name in super::super::test_fixtures::ALL {
            let facts = PodFacts::from_pod(fixture(name));
            let d = desired_targets([&facts], &b);
            assert_eq!(d.targets.len() + d.skipped.len(), 1, "{name}");
        }
    }
}
