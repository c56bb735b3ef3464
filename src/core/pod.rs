//! The few facts of a pod that decide whether it is a target, lifted out of the full
//! Kubernetes object.
//!
//! Converting each pod once, as its LIST page arrives, keeps the core independent of the
//! k8s-openapi shapes (the linkerd-policy style) and keeps memory flat: a `PodFacts` is a
//! fraction of a `Pod`, so a 100,000-pod cluster fits in a small Lambda.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::selector::Labels;
use super::target::AddressFamily;
use super::termination::{PreStop, Termination};

/// Annotation that takes a pod out of every group without deleting it.
pub const EXCLUDE_ANNOTATION: &str = "tgsync/exclude";
/// Annotation holding a pod's QUIC server ID (`0x` + 16 lowercase hex digits), which a
/// QUIC or TCP_QUIC group registers its target with. Written by the workload or its
/// admission policy; the app must encode it in the connection IDs it issues.
pub const QUIC_SERVER_ID_ANNOTATION: &str = "tgsync/quic-server-id";
/// Node label holding the node's Availability Zone (well-known Kubernetes label).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Readiness gate a pod declares to be registered before it is Ready and held unready
/// until its target is healthy in the NLB.
pub const READINESS_GATE: &str = "tgsync/target-health";
/// `restartPolicy` of an init container that makes it a native sidecar (Kubernetes 1.29+):
/// it keeps running beside the app containers, so its named ports can be targets.
pub const SIDECAR_RESTART_POLICY: &str = "Always";

/// Which pod a target came from; it goes into ledger rows and reports.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct PodRef {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID; tells a re-created pod of the same name from the old one.
    pub uid: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The readiness-relevant facts of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    /// Identity, shared by every target and report line the pod produces.
    pub pod: Arc<PodRef>,
    /// Labels, matched against selectors.
    pub labels: Labels,
    /// `tgsync/exclude: "true"`.
    pub excluded: bool,
    /// `status.phase` (empty when unset).
    pub phase: String,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// First IPv4 address of `status.podIPs` (or `status.podIP` when the list is absent).
    pub ipv4: Option<Ipv4Addr>,
    /// First IPv6 address of `status.podIPs` (or `status.podIP`).
    pub ipv6: Option<Ipv6Addr>,
    /// The first listed address ELBv2 could never take, and why ([`unusable`]): never
    /// the pod's address, but the pod is reported for it.
    pub unusable_ip: Option<(IpAddr, &'static str)>,
    /// The `Ready` condition is True.
    pub ready: bool,
    /// The `ContainersReady` condition is True.
    pub containers_ready: bool,
    /// `Some(current)` when the pod declares the [`READINESS_GATE`]; `current` is whether
    /// that condition is already True.
    pub gate: Option<bool>,
    /// The [`READINESS_GATE`] condition's reason and message as the pod carries them
    /// (what tgsync last said), so the condition is patched only when that changes.
    pub gate_said: Option<(String, String)>,
    /// Named container ports (name → number): those of the regular containers, then those
    /// of native sidecars (init containers with `restartPolicy: Always`), in spec order.
    pub named_ports: Vec<(String, u16)>,
    /// `spec.hostNetwork`: the pod's IP is its node's.
    pub host_network: bool,
    /// The `tgsync/quic-server-id` annotation as written (checked only for QUIC groups).
    pub quic_server_id: Option<String>,
    /// `spec.nodeName`: where the pod runs, whose zone a registration may need.
    pub node_name: Option<Arc<str>>,
    /// `spec.terminationGracePeriodSeconds` and the app containers' `preStop` sleep, as
    /// the rollout check reads them ([`super::rollout`]): two numbers, not the spec.
    pub termination: Termination,
}

/// Why ELBv2 could never take `ip` as a target, if it could not: it refuses loopback,
/// link-local, unspecified, multicast and broadcast addresses, and IPv4-mapped IPv6
/// ones, for themselves. Such an address is never sent (a refusal would cost a call and
/// tell nothing new); the pod is reported with the reason instead.
pub fn unusable(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) if v4.is_loopback() => Some("loopback"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("link-local"),
        IpAddr::V4(v4) if v4.is_unspecified() => Some("unspecified"),
        IpAddr::V4(v4) if v4.is_multicast() => Some("multicast"),
        IpAddr::V4(v4) if v4.is_broadcast() => Some("broadcast"),
        IpAddr::V6(v6) if v6.is_loopback() => Some("loopback"),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Some("link-local"),
        IpAddr::V6(v6) if v6.is_unspecified() => Some("unspecified"),
        IpAddr::V6(v6) if v6.is_multicast() => Some("multicast"),
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => Some("IPv4-mapped"),
        IpAddr::V4(_) | IpAddr::V6(_) => None,
    }
}

/// A pod's addresses as its status lists them: the first usable one of each family,
/// and the first one ELBv2 could never take (with why). Both pod decoders (the typed
/// pod here and the LIST decoder) read addresses through it, so they agree.
#[derive(Debug, Default, Clone, Copy)]
pub struct Addresses {
    /// The first usable IPv4 address.
    pub ipv4: Option<Ipv4Addr>,
    /// The first usable IPv6 address.
    pub ipv6: Option<Ipv6Addr>,
    /// The first unusable address and why ([`unusable`]).
    pub unusable: Option<(IpAddr, &'static str)>,
}

impl Addresses {
    /// Takes one listed address (an unparsable one is ignored).
    pub fn offer(&mut self, ip: &str) {
        let Ok(ip) = ip.parse::<IpAddr>() else {
            return;
        };
        if let Some(why) = unusable(ip) {
            self.unusable.get_or_insert((ip, why));
            return;
        }
        match ip {
            IpAddr::V4(v4) if self.ipv4.is_none() => self.ipv4 = Some(v4),
            IpAddr::V6(v6) if self.ipv6.is_none() => self.ipv6 = Some(v6),
            IpAddr::V4(_) | IpAddr::V6(_) => {}
        }
    }
}

/// One container's `preStop` hook as the rollout check reads it (see
/// [`super::rollout`]): its native sleep, an `exec` of a sleep, or unknown.
fn container_pre_stop(c: &k8s_openapi::api::core::v1::Container) -> PreStop {
    let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) else {
        return PreStop::None;
    };
    if let Some(sleep) = &hook.sleep {
        return PreStop::native_sleep(sleep.seconds);
    }
    match hook.exec.as_ref().and_then(|e| e.command.as_deref()) {
        Some(command) => PreStop::exec(command),
        None => PreStop::Unknown,
    }
}

impl PodFacts {
    /// Extracts the facts from a Kubernetes pod. Never fails: missing fields simply make
    /// the pod not desired, with a reason.
    pub fn from_pod(mut pod: Pod) -> Self {
        Self::take_from(&mut pod)
    }

    /// Like [`PodFacts::from_pod`], but moves the strings it keeps out of `pod` in place.
    /// A `Pod` is over 2 KB inline, so adapters walking a LIST page use this through
    /// `iter_mut()` instead of moving every pod (measurably faster at 100,000 pods).
    pub fn take_from(pod: &mut Pod) -> Self {
        let meta = &mut pod.metadata;
        let mut ips = Addresses::default();
        let mut gate_said = None;
        let (mut phase, mut ready, mut containers_ready, mut gate_open) =
            (String::new(), false, false, false);
        if let Some(status) = pod.status.as_mut() {
            phase = status.phase.take().unwrap_or_default();
            for c in status.conditions.iter().flatten() {
                let is_true = c.status == "True";
                match c.type_.as_str() {
                    "Ready" => ready = is_true,
                    "ContainersReady" => containers_ready = is_true,
                    READINESS_GATE => {
                        gate_open = is_true;
                        gate_said = Some((
                            c.reason.clone().unwrap_or_default(),
                            c.message.clone().unwrap_or_default(),
                        ));
                    }
                    _ => {}
                }
            }
            let listed = status.pod_ips.as_deref().unwrap_or_default();
            let single = status.pod_ip.as_deref().filter(|_| listed.is_empty());
            for ip in listed.iter().map(|p| p.ip.as_str()).chain(single) {
                ips.offer(ip);
            }
        }
        let (mut gated, mut host_network, mut named_ports) = (false, false, Vec::new());
        let mut node_name = None;
        let mut termination = Termination::default();
        if let Some(spec) = pod.spec.as_mut() {
            node_name = spec.node_name.take().map(Arc::from);
            termination = Termination {
                grace_seconds: Termination::grace(spec.termination_grace_period_seconds),
                pre_stop: spec
                    .containers
                    .iter()
                    .map(container_pre_stop)
                    .fold(PreStop::None, PreStop::longest),
            };
            gated = spec
                .readiness_gates
                .iter()
                .flatten()
                .any(|g| g.condition_type == READINESS_GATE);
            host_network = spec.host_network.unwrap_or(false);
            // Regular containers first, then native sidecars: init containers with
            // `restartPolicy: Always` keep running beside the app and can serve traffic
            // (a mesh proxy, an auth sidecar). Plain init containers have exited by then.
            let sidecars = spec
                .init_containers
                .iter_mut()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some(SIDECAR_RESTART_POLICY));
            named_ports = spec
                .containers
                .iter_mut()
                .chain(sidecars)
                .flat_map(|c| c.ports.iter_mut().flatten())
                .filter_map(|p| Some((p.name.take()?, u16::try_from(p.container_port).ok()?)))
                .collect();
        }
        let excluded = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(EXCLUDE_ANNOTATION))
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let quic_server_id = meta
            .annotations
            .as_mut()
            .and_then(|a| a.remove(QUIC_SERVER_ID_ANNOTATION));
        Self {
            pod: Arc::new(PodRef {
                namespace: meta.namespace.take().unwrap_or_default(),
                name: meta.name.take().unwrap_or_default(),
                uid: meta.uid.take().unwrap_or_default(),
            }),
            labels: meta.labels.take().map(Labels::from).unwrap_or_default(),
            excluded,
            terminating: meta.deletion_timestamp.is_some(),
            ipv4: ips.ipv4,
            ipv6: ips.ipv6,
            unusable_ip: ips.unusable,
            ready,
            containers_ready,
            gate: gated.then_some(gate_open),
            gate_said,
            named_ports,
            host_network,
            quic_server_id,
            node_name,
            phase,
            termination,
        }
    }

    /// The pod's address in `family`, if it has one.
    pub fn ip(&self, family: AddressFamily) -> Option<IpAddr> {
        match family {
            AddressFamily::Ipv4 => self.ipv4.map(IpAddr::V4),
            AddressFamily::Ipv6 => self.ipv6.map(IpAddr::V6),
        }
    }

    /// The number behind a named container port, if any container (or native sidecar)
    /// declares it; the first declaration wins.
    pub fn named_port(&self, name: &str) -> Option<u16> {
        self.named_ports
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| *p)
    }
}
