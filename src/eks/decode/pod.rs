//! One pod: what tgsync reads of its `metadata`, `spec` and `status`, by the rules of
//! [`PodFacts::take_from`].

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::container::{ContainersSeed, NullIsEmpty};
use super::{Str, expect_str, skip};
use crate::core::pod::{Addresses, EXCLUDE_ANNOTATION, QUIC_SERVER_ID_ANNOTATION, READINESS_GATE};
use crate::core::termination::{PreStop, Termination};
use crate::core::{Labels, PodFacts, PodRef};

/// The pod's addresses ([`Addresses`]) and how many strings were offered.
#[derive(Default, Clone, Copy)]
struct FirstIps {
    ips: Addresses,
    /// How many strings were offered (parsable or not): `status.podIP` counts only
    /// when `status.podIPs` is empty.
    offered: usize,
}

impl FirstIps {
    fn offer(&mut self, ip: &str) {
        self.offered += 1;
        self.ips.offer(ip);
    }
}

/// A pod reduced to its facts, and its `metadata.resourceVersion` (borrowed; only a
/// watch event keeps it).
pub(super) struct LeanPod<'de> {
    pub(super) facts: PodFacts,
    pub(super) resource_version: Option<Cow<'de, str>>,
}

fields!(PodField {
    "apiVersion" => ApiVersion,
    "kind" => Kind,
    "metadata" => Metadata,
    "spec" => Spec,
    "status" => Status,
});

deserialize_from!(map, LeanPod<'de>, "a Pod", |map| {
    let mut meta: Option<Meta<'de>> = None;
    let mut spec: Option<Spec> = None;
    let mut status: Option<Status> = None;
    while let Some(key) = map.next_key::<PodField>()? {
        match key {
            PodField::ApiVersion => expect_str(&mut map, "v1")?,
            PodField::Kind => expect_str(&mut map, "Pod")?,
            PodField::Metadata => meta = map.next_value()?,
            PodField::Spec => spec = map.next_value()?,
            PodField::Status => status = map.next_value()?,
            PodField::Other => skip(&mut map)?,
        }
    }
    Ok(assemble(
        meta.unwrap_or_default(),
        spec.unwrap_or_default(),
        status.unwrap_or_default(),
    ))
});

/// The facts, by the rules of [`PodFacts::take_from`].
fn assemble<'de>(meta: Meta<'de>, spec: Spec, status: Status) -> LeanPod<'de> {
    let facts = PodFacts {
        pod: Arc::new(PodRef {
            namespace: meta.namespace.unwrap_or_default(),
            name: meta.name.unwrap_or_default(),
            uid: meta.uid.unwrap_or_default(),
        }),
        labels: meta.labels.unwrap_or_default(),
        excluded: meta.excluded,
        phase: status.phase,
        terminating: meta.terminating,
        ipv4: status.ips.ips.ipv4,
        ipv6: status.ips.ips.ipv6,
        unusable_ip: status.ips.ips.unusable,
        ready: status.ready,
        containers_ready: status.containers_ready,
        gate: spec.gated.then_some(status.gate_open),
        gate_said: status.gate_said,
        named_ports: spec.named_ports,
        host_network: spec.host_network,
        quic_server_id: meta.quic_server_id,
        node_name: spec.node_name,
        termination: Termination {
            grace_seconds: Termination::grace(spec.grace),
            pre_stop: spec.pre_stop,
        },
    };
    LeanPod {
        facts,
        resource_version: meta.resource_version,
    }
}

/// What tgsync reads of `metadata`.
#[derive(Default)]
struct Meta<'de> {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    labels: Option<Labels>,
    excluded: bool,
    quic_server_id: Option<String>,
    terminating: bool,
    resource_version: Option<Cow<'de, str>>,
}

fields!(MetaField {
    "name" => Name,
    "namespace" => Namespace,
    "uid" => Uid,
    "labels" => Labels,
    "annotations" => Annotations,
    "deletionTimestamp" => DeletionTimestamp,
    "resourceVersion" => ResourceVersion,
});

deserialize_from!(map, Meta<'de>, "ObjectMeta", |map| {
    let mut meta = Meta::default();
    while let Some(key) = map.next_key::<MetaField>()? {
        match key {
            MetaField::Name => meta.name = map.next_value()?,
            MetaField::Namespace => meta.namespace = map.next_value()?,
            MetaField::Uid => meta.uid = map.next_value()?,
            MetaField::Labels => {
                let labels: Option<LabelEntries> = map.next_value()?;
                meta.labels = labels.map(|l| l.0);
            }
            MetaField::Annotations => {
                let ours: Option<Annotations> = map.next_value()?;
                let ours = ours.unwrap_or_default();
                meta.excluded = ours.excluded;
                meta.quic_server_id = ours.quic_server_id;
            }
            MetaField::DeletionTimestamp => {
                // Any value but null: k8s-openapi would also parse the time.
                let at: Option<IgnoredAny> = map.next_value()?;
                meta.terminating = at.is_some();
            }
            MetaField::ResourceVersion => {
                let version: Option<Str<'de>> = map.next_value()?;
                meta.resource_version = version.map(|v| v.0);
            }
            MetaField::Other => skip(&mut map)?,
        }
    }
    Ok(meta)
});

/// `metadata.labels`, without building a map.
struct LabelEntries(Labels);

deserialize_from!(map, LabelEntries, "a map of labels", |map| {
    let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(4).min(64));
    while let Some(entry) = map.next_entry::<String, String>()? {
        entries.push(entry);
    }
    Ok(LabelEntries(Labels::from_object_entries(entries)))
});

/// tgsync's annotations of `metadata.annotations`: whether it holds
/// `tgsync/exclude: "true"` (case-insensitive, trimmed), and `tgsync/quic-server-id` as
/// written; other annotations, often large, are skipped unread.
#[derive(Default)]
struct Annotations {
    excluded: bool,
    quic_server_id: Option<String>,
}

deserialize_from!(map, Annotations, "a map of annotations", |map| {
    let mut ours = Annotations::default();
    while let Some(key) = map.next_key::<Str<'de>>()? {
        if key.0 == EXCLUDE_ANNOTATION {
            let value: Str<'de> = map.next_value()?;
            ours.excluded = value.0.trim().eq_ignore_ascii_case("true");
        } else if key.0 == QUIC_SERVER_ID_ANNOTATION {
            let value: Str<'de> = map.next_value()?;
            ours.quic_server_id = Some(value.0.into_owned());
        } else {
            skip(&mut map)?;
        }
    }
    Ok(ours)
});

/// What tgsync reads of `spec`.
#[derive(Default)]
struct Spec {
    gated: bool,
    host_network: bool,
    named_ports: Vec<(String, u16)>,
    node_name: Option<Arc<str>>,
    /// `terminationGracePeriodSeconds`.
    grace: Option<i64>,
    /// The app containers' `preStop`, combined.
    pre_stop: PreStop,
}

fields!(SpecField {
    "containers" => Containers,
    "initContainers" => InitContainers,
    "readinessGates" => ReadinessGates,
    "hostNetwork" => HostNetwork,
    "nodeName" => NodeName,
    "terminationGracePeriodSeconds" => Grace,
});

deserialize_from!(map, Spec, "PodSpec", |map| {
    let mut spec = Spec::default();
    // The API server sends `initContainers` before `containers`; sidecar
    // ports are kept apart and appended after the regular ones.
    let mut sidecar_ports = Vec::new();
    while let Some(key) = map.next_key::<SpecField>()? {
        match key {
            SpecField::Containers => {
                spec.named_ports.clear();
                spec.pre_stop = PreStop::None;
                map.next_value_seed(NullIsEmpty(ContainersSeed {
                    ports: &mut spec.named_ports,
                    sidecars: false,
                    pre_stop: &mut spec.pre_stop,
                }))?;
            }
            SpecField::InitContainers => {
                sidecar_ports.clear();
                map.next_value_seed(NullIsEmpty(ContainersSeed {
                    ports: &mut sidecar_ports,
                    sidecars: true,
                    pre_stop: &mut PreStop::None,
                }))?;
            }
            SpecField::Grace => spec.grace = map.next_value()?,
            SpecField::ReadinessGates => {
                let gates: Option<GateDeclared> = map.next_value()?;
                spec.gated = gates.is_some_and(|g| g.0);
            }
            SpecField::HostNetwork => {
                let host: Option<bool> = map.next_value()?;
                spec.host_network = host.unwrap_or(false);
            }
            SpecField::NodeName => {
                let node: Option<Str<'de>> = map.next_value()?;
                spec.node_name = node.map(|n| Arc::from(n.0.as_ref()));
            }
            SpecField::Other => skip(&mut map)?,
        }
    }
    spec.named_ports.append(&mut sidecar_ports);
    Ok(spec)
});

/// Whether `spec.readinessGates` declares [`READINESS_GATE`].
struct GateDeclared(bool);

fields!(GateField {
    "conditionType" => ConditionType,
});

deserialize_from!(seq, GateDeclared, "a list of readiness gates", |seq| {
    let mut declared = false;
    while let Some(gate) = seq.next_element::<Gate<'de>>()? {
        declared |= gate.0.as_deref() == Some(READINESS_GATE);
    }
    Ok(GateDeclared(declared))
});

/// One `PodReadinessGate`: its `conditionType`.
struct Gate<'de>(Option<Cow<'de, str>>);

deserialize_from!(map, Gate<'de>, "PodReadinessGate", |map| {
    let mut condition_type = None;
    while let Some(key) = map.next_key::<GateField>()? {
        match key {
            GateField::ConditionType => {
                let ty: Option<Str<'de>> = map.next_value()?;
                condition_type = ty.map(|t| t.0);
            }
            GateField::Other => skip(&mut map)?,
        }
    }
    Ok(Gate(condition_type))
});

/// What tgsync reads of `status`.
#[derive(Default)]
struct Status {
    phase: String,
    ready: bool,
    containers_ready: bool,
    gate_open: bool,
    gate_said: Option<(String, String)>,
    ips: FirstIps,
}

fields!(StatusField {
    "phase" => Phase,
    "conditions" => Conditions,
    "podIP" => PodIp,
    "podIPs" => PodIps,
});

deserialize_from!(map, Status, "PodStatus", |map| {
    let mut phase: Option<String> = None;
    let mut conditions = Conditions::default();
    let mut listed = FirstIps::default();
    let mut single: Option<Str<'de>> = None;
    while let Some(key) = map.next_key::<StatusField>()? {
        match key {
            StatusField::Phase => phase = map.next_value()?,
            StatusField::Conditions => {
                let read: Option<Conditions> = map.next_value()?;
                conditions = read.unwrap_or_default();
            }
            StatusField::PodIps => {
                let read: Option<PodIps> = map.next_value()?;
                listed = read.map(|l| l.0).unwrap_or_default();
            }
            StatusField::PodIp => single = map.next_value()?,
            StatusField::Other => skip(&mut map)?,
        }
    }
    let mut ips = listed;
    if listed.offered == 0
        && let Some(ip) = single
    {
        ips.offer(&ip.0);
    }
    Ok(Status {
        phase: phase.unwrap_or_default(),
        ready: conditions.ready,
        containers_ready: conditions.containers_ready,
        gate_open: conditions.gate_open,
        gate_said: conditions.gate_said,
        ips,
    })
});

/// `status.conditions`, reduced to the three tgsync reads (the last of a type wins),
/// and the gate's reason and message.
#[derive(Default)]
struct Conditions {
    ready: bool,
    containers_ready: bool,
    gate_open: bool,
    gate_said: Option<(String, String)>,
}

deserialize_from!(seq, Conditions, "a list of pod conditions", |seq| {
    let mut c = Conditions::default();
    while let Some(condition) = seq.next_element::<Condition<'de>>()? {
        let is_true = condition.status.as_deref() == Some("True");
        match condition.type_.as_deref().unwrap_or_default() {
            "Ready" => c.ready = is_true,
            "ContainersReady" => c.containers_ready = is_true,
            READINESS_GATE => {
                c.gate_open = is_true;
                c.gate_said = Some((
                    condition.reason.map(|r| r.into_owned()).unwrap_or_default(),
                    condition
                        .message
                        .map(|m| m.into_owned())
                        .unwrap_or_default(),
                ));
            }
            _ => {}
        }
    }
    Ok(c)
});

/// One `PodCondition`: its `type`, `status`, `reason` and `message`.
struct Condition<'de> {
    type_: Option<Cow<'de, str>>,
    status: Option<Cow<'de, str>>,
    reason: Option<Cow<'de, str>>,
    message: Option<Cow<'de, str>>,
}

fields!(ConditionField {
    "type" => Type,
    "status" => Status,
    "reason" => Reason,
    "message" => Message,
});

deserialize_from!(map, Condition<'de>, "PodCondition", |map| {
    let mut c = Condition {
        type_: None,
        status: None,
        reason: None,
        message: None,
    };
    while let Some(key) = map.next_key::<ConditionField>()? {
        match key {
            ConditionField::Type => {
                let ty: Option<Str<'de>> = map.next_value()?;
                c.type_ = ty.map(|t| t.0);
            }
            ConditionField::Status => {
                let status: Option<Str<'de>> = map.next_value()?;
                c.status = status.map(|s| s.0);
            }
            ConditionField::Reason => {
                let reason: Option<Str<'de>> = map.next_value()?;
                c.reason = reason.map(|r| r.0);
            }
            ConditionField::Message => {
                let message: Option<Str<'de>> = map.next_value()?;
                c.message = message.map(|m| m.0);
            }
            ConditionField::Other => skip(&mut map)?,
        }
    }
    Ok(c)
});

/// `status.podIPs`, reduced to the first address of each family.
struct PodIps(FirstIps);

fields!(PodIpField {
    "ip" => Ip,
});

deserialize_from!(seq, PodIps, "a list of pod IPs", |seq| {
    let mut ips = FirstIps::default();
    while let Some(entry) = seq.next_element::<PodIpEntry<'de>>()? {
        ips.offer(entry.0.as_deref().unwrap_or_default());
    }
    Ok(PodIps(ips))
});

/// One `PodIP`: its `ip`.
struct PodIpEntry<'de>(Option<Cow<'de, str>>);

deserialize_from!(map, PodIpEntry<'de>, "PodIP", |map| {
    let mut ip = None;
    while let Some(key) = map.next_key::<PodIpField>()? {
        match key {
            PodIpField::Ip => {
                let read: Option<Str<'de>> = map.next_value()?;
                ip = read.map(|i| i.0);
            }
            PodIpField::Other => skip(&mut map)?,
        }
    }
    Ok(PodIpEntry(ip))
});
