//! Lean decoding of the pod JSON the API server sends: a LIST page or a watch event line
//! straight into [`PodFacts`], without building k8s-openapi `Pod`s first.
//!
//! A pod as a LIST returns it is 3.5 to 5 KB of JSON (managedFields, containers with env
//! and probes, volumes, container statuses), and tgsync reads a dozen of its fields.
//! Deserializing whole `Pod`s and dropping them costs several seconds per 100,000 pods
//! (`benches/decode.rs`: 3.2 to 4.2 s for pods of 4.5 KB on two shared cores). This
//! visits only the fields [`PodFacts::take_from`] reads, borrows strings it compares
//! from the input, and lets serde_json skip everything else without allocating: 0.5 to
//! 0.7 s there, not far above serde_json reading the same bytes and keeping nothing.
//!
//! Pure: no client in scope, bytes in, facts out. The rules are those of
//! [`PodFacts::take_from`], field for field, including how k8s-openapi decodes: a field
//! given twice takes its last value, `null` is the same as absent, a missing required
//! field is its default. The unit tests check both paths agree on every fixture and on
//! generated pods. Unlike k8s-openapi, fields tgsync does not read are skipped without
//! being validated (a malformed `creationTimestamp` does not make a pod unreadable).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Unexpected, Visitor,
};
use thiserror::Error;

use crate::core::pod::{
    Addresses, EXCLUDE_ANNOTATION, QUIC_SERVER_ID_ANNOTATION, READINESS_GATE,
    SIDECAR_RESTART_POLICY,
};
use crate::core::{Labels, PodFacts, PodRef};

/// One page of a pod LIST: the pods, and the list metadata the pager needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodListPage {
    /// The page's pods, in the order the API server sent them.
    pub pods: Vec<PodFacts>,
    /// `metadata.resourceVersion`: the version the whole list is consistent at; a watch
    /// started from it misses no change.
    pub resource_version: Option<String>,
    /// `metadata.continue`: the token for the next page (absent or empty on the last).
    pub continue_token: Option<String>,
    /// `metadata.remainingItemCount`: how many pods the server says are still to come;
    /// with no continue token it means the list was cut short.
    pub remaining_item_count: Option<i64>,
}

pub use crate::pods::{WatchEvent, WatchStatus, WatchedPod};

/// Why a body could not be decoded, with serde's message and the line and column.
#[derive(Debug, Error)]
pub enum DecodeError {
    /// A LIST page is not a PodList (truncated, wrong types, no `items`).
    #[error("page {page} of the pod list is not a PodList tgsync can read: {source}")]
    ListPage {
        /// Page number, from 1.
        page: usize,
        /// serde_json's error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A LIST page is not UTF-8.
    #[error("page {page} of the pod list is not UTF-8 (invalid byte at offset {offset})")]
    ListPageUtf8 {
        /// Page number, from 1.
        page: usize,
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
    /// A watch event line is not a pod watch event.
    #[error("pod watch event is not one tgsync can read: {source}")]
    WatchEvent {
        /// serde_json's error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A watch event line is not UTF-8.
    #[error("pod watch event is not UTF-8 (invalid byte at offset {offset})")]
    WatchEventUtf8 {
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
}

impl DecodeError {
    /// Line (from 1) where JSON decoding failed; `None` for a UTF-8 error.
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::ListPage { source, .. } | Self::WatchEvent { source } => Some(source.line()),
            Self::ListPageUtf8 { .. } | Self::WatchEventUtf8 { .. } => None,
        }
    }

    /// Column (from 1) where JSON decoding failed; `None` for a UTF-8 error.
    pub fn column(&self) -> Option<usize> {
        match self {
            Self::ListPage { source, .. } | Self::WatchEvent { source } => Some(source.column()),
            Self::ListPageUtf8 { .. } | Self::WatchEventUtf8 { .. } => None,
        }
    }
}

/// Decodes page `page` (from 1, for error messages) of a pod LIST.
///
/// The body must be UTF-8, like the `String` kube made of it before. A page without
/// `items` is an error, never an empty page: "no pods" would deregister every target.
pub fn decode_pod_list(page: usize, body: &[u8]) -> Result<PodListPage, DecodeError> {
    let text = std::str::from_utf8(body).map_err(|e| DecodeError::ListPageUtf8 {
        page,
        offset: e.valid_up_to(),
    })?;
    serde_json::from_str::<PageBody>(text)
        .map(|p| p.0)
        .map_err(|source| DecodeError::ListPage { page, source })
}

/// Decodes one line of a pod watch (`?watch=1`), for the watch loop to apply.
pub fn decode_watch_event(line: &[u8]) -> Result<WatchEvent, DecodeError> {
    let text = std::str::from_utf8(line).map_err(|e| DecodeError::WatchEventUtf8 {
        offset: e.valid_up_to(),
    })?;
    serde_json::from_str::<EventBody>(text)
        .map(|e| e.0)
        .map_err(|source| DecodeError::WatchEvent { source })
}

// ---------------------------------------------------------------------------------------
// Building blocks.

/// Field names of one object, matched once; `Other` is skipped. Like k8s-openapi's own
/// field enums, so keys written with escapes match too.
macro_rules! fields {
    ($name:ident { $($key:literal => $variant:ident),+ $(,)? }) => {
        enum $name {
            $($variant,)+
            Other,
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct FieldVisitor;
                impl Visitor<'_> for FieldVisitor {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a field name")
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<$name, E> {
                        Ok(match v {
                            $($key => $name::$variant,)+
                            _ => $name::Other,
                        })
                    }
                }
                d.deserialize_identifier(FieldVisitor)
            }
        }
    };
}

/// `impl Deserialize for $ty` by a visitor that reads one map (or one sequence) with
/// `$body`: the serde boilerplate every hand-written reader below would repeat.
macro_rules! deserialize_from {
    (map, $ty:ty, $expecting:literal, |$map:ident| $body:block) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct MapVisitor;
                impl<'de> Visitor<'de> for MapVisitor {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut $map: A) -> Result<$ty, A::Error> {
                        $body
                    }
                }
                d.deserialize_map(MapVisitor)
            }
        }
    };
    (seq, $ty:ty, $expecting:literal, |$seq:ident| $body:block) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct SeqVisitor;
                impl<'de> Visitor<'de> for SeqVisitor {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, mut $seq: A) -> Result<$ty, A::Error> {
                        $body
                    }
                }
                d.deserialize_seq(SeqVisitor)
            }
        }
    };
}

/// A string borrowed from the input when it has no escapes (serde's own `Cow<str>`
/// always copies), for values that are compared rather than kept.
struct Str<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct StrVisitor;
        impl<'de> Visitor<'de> for StrVisitor {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(StrVisitor)
    }
}

/// Skips the value of the current key.
fn skip<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    map.next_value::<IgnoredAny>().map(drop)
}

/// Checks a pod's `apiVersion` / `kind`, as k8s-openapi does when they are present.
fn expect_str<'de, A: MapAccess<'de>>(map: &mut A, expected: &'static str) -> Result<(), A::Error> {
    let value: Str<'de> = map.next_value()?;
    if value.0 == expected {
        Ok(())
    } else {
        Err(de::Error::invalid_value(
            Unexpected::Str(&value.0),
            &expected,
        ))
    }
}

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

// ---------------------------------------------------------------------------------------
// The LIST page.

/// A page body; the pods are converted one by one as the `items` array is read.
struct PageBody(PodListPage);

fields!(ListField {
    "metadata" => Metadata,
    "items" => Items,
});

// As kube's `ObjectList`: `metadata` optional, `items` required but `null`
// is empty, each at most once.
deserialize_from!(map, PageBody, "a PodList", |map| {
    let mut meta: Option<ListMeta> = None;
    let mut pods: Option<Vec<PodFacts>> = None;
    while let Some(key) = map.next_key::<ListField>()? {
        match key {
            ListField::Metadata if meta.is_some() => {
                return Err(de::Error::duplicate_field("metadata"));
            }
            ListField::Metadata => meta = Some(map.next_value()?),
            ListField::Items if pods.is_some() => {
                return Err(de::Error::duplicate_field("items"));
            }
            ListField::Items => {
                let items: Option<Items> = map.next_value()?;
                pods = Some(items.map(|i| i.0).unwrap_or_default());
            }
            ListField::Other => skip(&mut map)?,
        }
    }
    let pods = pods.ok_or_else(|| de::Error::missing_field("items"))?;
    let meta = meta.unwrap_or_default();
    Ok(PageBody(PodListPage {
        pods,
        resource_version: meta.resource_version,
        continue_token: meta.continue_token,
        remaining_item_count: meta.remaining_item_count,
    }))
});

/// The `metadata` of a list.
#[derive(Default)]
struct ListMeta {
    resource_version: Option<String>,
    continue_token: Option<String>,
    remaining_item_count: Option<i64>,
}

fields!(ListMetaField {
    "resourceVersion" => ResourceVersion,
    "continue" => Continue,
    "remainingItemCount" => RemainingItemCount,
});

deserialize_from!(map, ListMeta, "ListMeta", |map| {
    let mut meta = ListMeta::default();
    while let Some(key) = map.next_key::<ListMetaField>()? {
        match key {
            ListMetaField::ResourceVersion => meta.resource_version = map.next_value()?,
            ListMetaField::Continue => meta.continue_token = map.next_value()?,
            ListMetaField::RemainingItemCount => {
                meta.remaining_item_count = map.next_value()?;
            }
            ListMetaField::Other => skip(&mut map)?,
        }
    }
    Ok(meta)
});

/// The `items` array, each pod reduced to its facts as soon as it is read.
struct Items(Vec<PodFacts>);

deserialize_from!(seq, Items, "a list of pods", |seq| {
    let mut pods = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
    while let Some(pod) = seq.next_element::<LeanPod<'de>>()? {
        pods.push(pod.facts);
    }
    Ok(Items(pods))
});

// ---------------------------------------------------------------------------------------
// One pod.

/// A pod reduced to its facts, and its `metadata.resourceVersion` (borrowed; only a
/// watch event keeps it).
struct LeanPod<'de> {
    facts: PodFacts,
    resource_version: Option<Cow<'de, str>>,
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
}

fields!(SpecField {
    "containers" => Containers,
    "initContainers" => InitContainers,
    "readinessGates" => ReadinessGates,
    "hostNetwork" => HostNetwork,
    "nodeName" => NodeName,
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
                map.next_value_seed(NullIsEmpty(ContainersSeed {
                    ports: &mut spec.named_ports,
                    sidecars: false,
                }))?;
            }
            SpecField::InitContainers => {
                sidecar_ports.clear();
                map.next_value_seed(NullIsEmpty(ContainersSeed {
                    ports: &mut sidecar_ports,
                    sidecars: true,
                }))?;
            }
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

/// A sequence read by the visitor it wraps, where `null` is empty.
struct NullIsEmpty<V>(V);

impl<'de, V: Visitor<'de, Value = ()>> DeserializeSeed<'de> for NullIsEmpty<V> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, V: Visitor<'de, Value = ()>> Visitor<'de> for NullIsEmpty<V> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self.0)
    }
}

/// `spec.containers` or `spec.initContainers` (`null` is empty): appends the named
/// ports to `ports`; of init containers, only those of native sidecars.
struct ContainersSeed<'p> {
    ports: &'p mut Vec<(String, u16)>,
    sidecars: bool,
}

impl<'de> Visitor<'de> for ContainersSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of containers")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let sidecars = self.sidecars;
        while seq
            .next_element_seed(ContainerSeed {
                ports: &mut *self.ports,
                sidecars,
            })?
            .is_some()
        {}
        Ok(())
    }
}

/// One container: its named ports, dropped again for a plain init container.
struct ContainerSeed<'p> {
    ports: &'p mut Vec<(String, u16)>,
    sidecars: bool,
}

fields!(ContainerField {
    "ports" => Ports,
    "restartPolicy" => RestartPolicy,
});

impl<'de> DeserializeSeed<'de> for ContainerSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ContainerSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Container")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let start = self.ports.len();
        let mut sidecar = false;
        while let Some(key) = map.next_key::<ContainerField>()? {
            match key {
                ContainerField::Ports => {
                    // A repeated `ports` replaces the earlier one.
                    self.ports.truncate(start);
                    map.next_value_seed(NullIsEmpty(PortsSeed {
                        ports: &mut *self.ports,
                    }))?;
                }
                ContainerField::RestartPolicy => {
                    let policy: Option<Str<'de>> = map.next_value()?;
                    sidecar = policy.is_some_and(|p| p.0 == SIDECAR_RESTART_POLICY);
                }
                ContainerField::Other => skip(&mut map)?,
            }
        }
        if self.sidecars && !sidecar {
            self.ports.truncate(start);
        }
        Ok(())
    }
}

/// A container's `ports` (`null` is empty): appends `(name, number)` of every named
/// port whose number fits a `u16`.
struct PortsSeed<'p> {
    ports: &'p mut Vec<(String, u16)>,
}

impl<'de> Visitor<'de> for PortsSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of container ports")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(port) = seq.next_element::<Port>()? {
            if let (Some(name), Ok(number)) = (port.name, u16::try_from(port.number)) {
                self.ports.push((name, number));
            }
        }
        Ok(())
    }
}

/// One `ContainerPort`.
struct Port {
    name: Option<String>,
    /// `containerPort`, 0 when absent (k8s-openapi's default for a required field).
    number: i32,
}

fields!(PortField {
    "name" => Name,
    "containerPort" => ContainerPort,
});

deserialize_from!(map, Port, "ContainerPort", |map| {
    let mut name = None;
    let mut number: Option<i32> = None;
    while let Some(key) = map.next_key::<PortField>()? {
        match key {
            PortField::Name => name = map.next_value()?,
            PortField::ContainerPort => number = map.next_value()?,
            PortField::Other => skip(&mut map)?,
        }
    }
    Ok(Port {
        name,
        number: number.unwrap_or_default(),
    })
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

// ---------------------------------------------------------------------------------------
// Watch events.

/// A watch event line.
struct EventBody(WatchEvent);

fields!(EventField {
    "type" => Type,
    "object" => Object,
});

/// The event types, as kube's `WatchEvent` names them.
const EVENT_TYPES: &[&str] = &["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"];

#[derive(Clone, Copy)]
enum EventType {
    Added,
    Modified,
    Deleted,
    Bookmark,
    Error,
}

impl EventType {
    fn parse<E: de::Error>(name: &str) -> Result<Self, E> {
        Ok(match name {
            "ADDED" => Self::Added,
            "MODIFIED" => Self::Modified,
            "DELETED" => Self::Deleted,
            "BOOKMARK" => Self::Bookmark,
            "ERROR" => Self::Error,
            other => return Err(de::Error::unknown_variant(other, EVENT_TYPES)),
        })
    }
}

/// The `object` of an event whose `type` came first (as the API server sends it), or
/// kept as a `Value` until the type is known.
enum EventObject {
    Decoded(Box<WatchEvent>),
    Pending(serde_json::Value),
}

deserialize_from!(map, EventBody, "a watch event", |map| {
    let mut ty: Option<EventType> = None;
    let mut object: Option<EventObject> = None;
    while let Some(key) = map.next_key::<EventField>()? {
        match key {
            EventField::Type if ty.is_some() => {
                return Err(de::Error::duplicate_field("type"));
            }
            EventField::Type => {
                let name: Str<'de> = map.next_value()?;
                ty = Some(EventType::parse(&name.0)?);
            }
            EventField::Object if object.is_some() => {
                return Err(de::Error::duplicate_field("object"));
            }
            EventField::Object => {
                object = Some(match ty {
                    Some(ty) => EventObject::Decoded(Box::new(map.next_value_seed(ty)?)),
                    None => EventObject::Pending(map.next_value()?),
                });
            }
            EventField::Other => skip(&mut map)?,
        }
    }
    let ty = ty.ok_or_else(|| de::Error::missing_field("type"))?;
    match object {
        Some(EventObject::Decoded(event)) => Ok(EventBody(*event)),
        Some(EventObject::Pending(value)) => ty
            .deserialize(value)
            .map(EventBody)
            .map_err(de::Error::custom),
        None => Err(de::Error::missing_field("object")),
    }
});

/// Decodes an event's `object` by its type.
impl<'de> DeserializeSeed<'de> for EventType {
    type Value = WatchEvent;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<WatchEvent, D::Error> {
        let watched = |pod: LeanPod<'_>| WatchedPod {
            facts: pod.facts,
            resource_version: pod.resource_version.map(Cow::into_owned),
        };
        Ok(match self {
            Self::Added => WatchEvent::Added(watched(LeanPod::deserialize(d)?)),
            Self::Modified => WatchEvent::Modified(watched(LeanPod::deserialize(d)?)),
            Self::Deleted => WatchEvent::Deleted(watched(LeanPod::deserialize(d)?)),
            Self::Bookmark => WatchEvent::Bookmark {
                resource_version: BookmarkObject::deserialize(d)?.metadata.resource_version,
            },
            Self::Error => {
                let status = StatusObject::deserialize(d)?;
                WatchEvent::Error(WatchStatus {
                    code: status.code,
                    reason: status.reason,
                    message: status.message,
                })
            }
        })
    }
}

/// A bookmark's object: only `metadata.resourceVersion` matters (and is required).
#[derive(Deserialize)]
struct BookmarkObject {
    metadata: BookmarkMeta,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BookmarkMeta {
    resource_version: String,
}

/// The `Status` of an error event, as kube's `Status` reads it.
#[derive(Deserialize)]
struct StatusObject {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        Container, ContainerPort, Pod, PodCondition, PodIP, PodReadinessGate, PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use kube::core::ObjectList;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use crate::testkit::PodBuilder;

    /// Every pod fixture, read from the directory so a new one is covered too.
    fn fixtures() -> Vec<(String, String)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pods");
        let mut all: Vec<(String, String)> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .map(|p| {
                let name = p.file_stem().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read_to_string(&p).unwrap())
            })
            .collect();
        all.sort();
        assert!(all.len() >= 12, "fixtures in {}", dir.display());
        all
    }

    /// A PodList page body around `items` (JSON texts of pods).
    fn page_of(items: &[&str], metadata: Value) -> String {
        format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{metadata},"items":[{}]}}"#,
            items.join(",")
        )
    }

    /// What the old path gives: kube's `ObjectList<Pod>` from the text, then `take_from`.
    fn via_kube(body: &str) -> Result<Vec<PodFacts>, serde_json::Error> {
        let mut list: ObjectList<Pod> = serde_json::from_str(body)?;
        Ok(list.items.iter_mut().map(PodFacts::take_from).collect())
    }

    /// Asserts both paths read the pod the same, as a LIST item and as a watch event.
    fn assert_agree(pod_json: &str) {
        let expected = PodFacts::from_pod(serde_json::from_str(pod_json).unwrap());
        let body = page_of(&[pod_json], json!({ "resourceVersion": "9" }));
        let page = decode_pod_list(1, body.as_bytes()).unwrap();
        assert_eq!(page.pods, std::slice::from_ref(&expected), "{pod_json}");
        assert_eq!(page.pods, via_kube(&body).unwrap(), "{pod_json}");
        let line = format!(r#"{{"type":"MODIFIED","object":{pod_json}}}"#);
        match decode_watch_event(line.as_bytes()).unwrap() {
            WatchEvent::Modified(watched) => assert_eq!(watched.facts, expected, "{pod_json}"),
            other => panic!("expected MODIFIED, got {other:?}"),
        }
    }

    #[test]
    fn every_fixture_decodes_as_take_from_reads_it() {
        for (name, json) in fixtures() {
            let expected = PodFacts::from_pod(serde_json::from_str(&json).unwrap());
            let body = page_of(&[&json], json!({}));
            let page = decode_pod_list(1, body.as_bytes()).unwrap();
            assert_eq!(page.pods, [expected], "fixture {name}");
            assert_agree(&json);
        }
    }

    #[test]
    fn a_page_of_every_fixture_keeps_order_and_list_metadata() {
        let all = fixtures();
        let texts: Vec<&str> = all.iter().map(|(_, j)| j.as_str()).collect();
        let body = page_of(
            &texts,
            json!({ "resourceVersion": "48213", "continue": "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ", "remainingItemCount": 1234 }),
        );
        let page = decode_pod_list(3, body.as_bytes()).unwrap();
        assert_eq!(page.pods, via_kube(&body).unwrap());
        assert_eq!(page.pods.len(), texts.len());
        assert_eq!(page.resource_version.as_deref(), Some("48213"));
        assert_eq!(
            page.continue_token.as_deref(),
            Some("eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ")
        );
        assert_eq!(page.remaining_item_count, Some(1234));
    }

    #[test]
    fn realistic_pods_decode_as_take_from_reads_them() {
        for i in 0..20 {
            let mut b = PodBuilder::new("shop", &format!("web-{i}"))
                .label("app", "web")
                .ip(&format!("10.0.3.{i}"))
                .ready(i % 3 != 0);
            if i % 4 == 0 {
                b = b.gated();
            }
            let mut b = b
                .realistic()
                .node(&format!("ip-10-0-3-{}.ec2.internal", i % 3));
            if i % 5 == 0 {
                b = b.annotation("tgsync/quic-server-id", &format!("0x{:016x}", 0xabc0 + i));
            }
            let json = serde_json::to_string(&b.build()).unwrap();
            assert!(json.len() > 3_000, "{} bytes", json.len());
            assert_agree(&json);
        }
    }

    #[test]
    fn list_metadata_is_optional_but_items_are_not() {
        let page = decode_pod_list(1, br#"{"items":[]}"#).unwrap();
        assert_eq!(page, PodListPage::default());
        // `items: null` is an empty page, as kube reads it.
        let page = decode_pod_list(1, br#"{"metadata":{"continue":""},"items":null}"#).unwrap();
        assert!(page.pods.is_empty());
        assert_eq!(page.continue_token.as_deref(), Some(""));
        // No `items` at all is not a PodList: never an empty list that deregisters all.
        for body in [
            &br#"{"metadata":{"resourceVersion":"1"}}"#[..],
            br#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":500}"#,
            b"{}",
        ] {
            let err = decode_pod_list(2, body).unwrap_err();
            assert!(err.to_string().contains("missing field `items`"), "{err}");
            assert!(err.to_string().starts_with("page 2 "), "{err}");
        }
    }

    #[test]
    fn duplicates_nulls_escapes_and_odd_order_read_as_k8s_openapi_reads_them() {
        let pods = [
            // Nulls wherever k8s-openapi allows them.
            json!({ "metadata": null, "spec": null, "status": null }),
            json!({
                "metadata": { "name": null, "labels": null, "annotations": null, "deletionTimestamp": null },
                "spec": { "containers": null, "initContainers": null, "readinessGates": null, "hostNetwork": null },
                "status": { "phase": null, "conditions": null, "podIPs": null, "podIP": null }
            }),
            json!({
                "spec": { "containers": [{ "name": "c", "ports": null },
                                         { "name": "d", "ports": [{ "name": null, "containerPort": 80 },
                                                                  { "name": "p", "containerPort": null },
                                                                  { "name": "big", "containerPort": 70000 },
                                                                  { "name": "neg", "containerPort": -1 },
                                                                  { "name": "", "containerPort": 443 }] }] },
                "status": { "conditions": [{ "type": null, "status": null }, { "type": "Ready" }],
                            "podIPs": [{ "ip": null }, { "ip": "junk" }, { "ip": "fd00::1" }, { "ip": "10.1.1.1" }, { "ip": "10.2.2.2" }],
                            "podIP": "10.9.9.9" }
            }),
            // Addresses ELBv2 never takes, beside a usable one: both decoders skip them
            // alike and keep the first for the report.
            json!({
                "status": { "podIPs": [{ "ip": "169.254.3.3" }, { "ip": "::ffff:10.0.0.1" }, { "ip": "127.0.0.1" }, { "ip": "10.3.3.3" }] }
            }),
            // Status before metadata, sidecars after containers, an IPv6-only pod.
            json!({
                "status": { "podIP": "2600:1f18::7", "phase": "Running",
                            "conditions": [{ "status": "True", "type": "tgsync/target-health" }] },
                "spec": {
                    "containers": [{ "name": "app", "ports": [{ "containerPort": 8080, "name": "http" }] }],
                    "initContainers": [
                        { "name": "init", "ports": [{ "name": "setup", "containerPort": 1 }], "restartPolicy": "OnFailure" },
                        { "restartPolicy": "Always", "name": "mesh", "ports": [{ "name": "mesh", "containerPort": 15001 }] },
                        { "name": "late", "ports": [{ "name": "late", "containerPort": 3 }], "restartPolicy": "always" }
                    ],
                    "readinessGates": [{ "conditionType": "other" }, { "conditionType": "tgsync/target-health" }]
                },
                "metadata": { "deletionTimestamp": "2026-01-01T00:00:00Z", "uid": "u", "namespace": "n" },
                "apiVersion": "v1", "kind": "Pod"
            }),
        ];
        for pod in pods {
            assert_agree(&pod.to_string());
        }
        // Repeated keys (which `json!` would merge): the last one wins, lists are
        // replaced whole.
        let repeated = r#"{
            "metadata": { "name": "a", "name": "b", "labels": { "x": "1", "a": "0", "x": "2" },
                          "annotations": { "tgsync/exclude": "true", "tgsync/exclude": "no" },
                          "deletionTimestamp": "2026-01-01T00:00:00Z", "deletionTimestamp": null },
            "metadata": { "name": "c", "labels": { "x": "1", "a": "0", "x": "2" },
                          "annotations": { "tgsync/exclude": "no", "tgsync/exclude": "true" } },
            "spec": {
                "containers": [{ "name": "gone", "ports": [{ "name": "gone", "containerPort": 9 }] }],
                "initContainers": [{ "name": "gone", "restartPolicy": "Always", "ports": [{ "name": "gone", "containerPort": 9 }] }],
                "containers": [{ "name": "c", "ports": [{ "name": "old", "containerPort": 1 }],
                                 "ports": [{ "name": "new", "containerPort": 2, "containerPort": 3, "name": "newer" }] },
                               { "name": "d", "ports": [{ "name": "d", "containerPort": 4 }] }],
                "initContainers": [{ "name": "s", "restartPolicy": "Always", "restartPolicy": "Never",
                                     "ports": [{ "name": "s", "containerPort": 5 }] },
                                   { "name": "t", "restartPolicy": "Never", "restartPolicy": "Always",
                                     "ports": [{ "name": "t", "containerPort": 6 }], "ports": [{ "name": "t2", "containerPort": 7 }] }],
                "hostNetwork": true, "hostNetwork": null,
                "readinessGates": [{ "conditionType": "tgsync/target-health" }], "readinessGates": [],
                "readinessGates": [{ "conditionType": "tgsync/target-health", "conditionType": "x" }]
            },
            "spec": {
                "initContainers": [{ "name": "gone", "restartPolicy": "Always", "ports": [{ "name": "gone", "containerPort": 9 }] }],
                "containers": [{ "name": "gone", "ports": [{ "name": "gone", "containerPort": 9 }] }],
                "containers": [{ "name": "c", "ports": [{ "name": "old", "containerPort": 1 }],
                                 "ports": [{ "name": "new", "containerPort": 2, "containerPort": 3, "name": "newer" }] }],
                "initContainers": [{ "name": "t", "restartPolicy": "Never", "restartPolicy": "Always",
                                     "ports": [{ "name": "t", "containerPort": 6 }], "ports": [{ "name": "t2", "containerPort": 7 }] },
                                   { "name": "u", "ports": [{ "name": "u", "containerPort": 8 }], "restartPolicy": "Always", "restartPolicy": null }],
                "hostNetwork": false, "hostNetwork": true,
                "readinessGates": [], "readinessGates": [{ "conditionType": "x", "conditionType": "tgsync/target-health" }]
            },
            "status": {
                "podIPs": [{ "ip": "10.0.0.1" }], "podIPs": [], "podIP": "10.0.0.2", "podIP": "10.0.0.3",
                "conditions": [{ "type": "Ready", "status": "True" }],
                "conditions": [{ "type": "ContainersReady", "status": "True" },
                               { "type": "ContainersReady", "status": "False", "status": "True" },
                               { "type": "Ready", "type": "tgsync/target-health", "status": "True" }],
                "phase": "Running", "phase": null, "phase": "Pending"
            }
        }"#;
        assert_agree(repeated);
        let body = page_of(&[repeated], json!({}));
        let facts = &decode_pod_list(1, body.as_bytes()).unwrap().pods[0];
        assert_eq!(facts.pod.name, "c");
        assert!(facts.excluded && !facts.terminating && facts.host_network);
        assert_eq!(facts.labels.get("x"), Some("2"));
        assert_eq!(
            facts.named_ports,
            [("newer".to_owned(), 3), ("t2".to_owned(), 7)]
        );
        assert_eq!(facts.ipv4, Some(std::net::Ipv4Addr::new(10, 0, 0, 3)));
        assert_eq!(
            (facts.ready, facts.containers_ready, facts.gate),
            (false, true, Some(true))
        );
        assert_eq!(facts.phase, "Pending");
        // Escapes in keys and values decode to the same text.
        assert_agree(
            r#"{"metadata":{"n\u0061me":"w\u00e9b \"1\"","labels":{"\u0061pp":"w\/eb"},
                "annotations":{"tgsync\/exclude":" TRU\u0045 "}},
               "spec":{"containers":[{"ports":[{"name":"ht\u0074p","containerPort":80}]}]},
               "status":{"conditions":[{"type":"Re\u0061dy","status":"Tru\u0065"}],
                         "podIPs":[{"ip":"10.0.0.\u0031"}]}}"#,
        );
        let odd = decode_pod_list(
            1,
            page_of(
                &[
                    &json!({ "metadata": { "annotations": { "tgsync/exclude": " TRUE " } } })
                        .to_string(),
                ],
                json!({}),
            )
            .as_bytes(),
        )
        .unwrap();
        assert!(odd.pods[0].excluded);
    }

    #[test]
    fn wrong_api_version_or_kind_is_an_error_as_in_k8s_openapi() {
        for pod in [
            json!({ "apiVersion": "v2", "metadata": { "name": "a" } }),
            json!({ "kind": "Service" }),
            json!({ "kind": null }),
        ] {
            let body = page_of(&[&pod.to_string()], json!({}));
            assert!(via_kube(&body).is_err(), "{pod}");
            assert!(decode_pod_list(1, body.as_bytes()).is_err(), "{pod}");
        }
    }

    #[test]
    fn malformed_pages_are_errors_with_page_line_and_column() {
        let good = page_of(
            &[
                &serde_json::to_string(&PodBuilder::new("shop", "a").ip("10.0.0.1").build())
                    .unwrap(),
            ],
            json!({ "resourceVersion": "5" }),
        );
        assert!(decode_pod_list(1, good.as_bytes()).is_ok());
        // Truncated anywhere.
        for end in 0..good.len() {
            let err = decode_pod_list(7, &good.as_bytes()[..end]).unwrap_err();
            assert!(
                matches!(err, DecodeError::ListPage { page: 7, .. }),
                "{err}"
            );
        }
        let bad: &[(&str, &str)] = &[
            (
                r#"{"items":{}}"#,
                "invalid type: map, expected a list of pods",
            ),
            (
                r#"{"items":[1]}"#,
                "invalid type: integer `1`, expected a Pod",
            ),
            (r#"{"items":[null]}"#, "invalid type: null, expected a Pod"),
            (r#"{"items":[],"items":[]}"#, "duplicate field `items`"),
            (
                r#"{"metadata":null,"items":[]}"#,
                "invalid type: null, expected ListMeta",
            ),
            (
                r#"{"metadata":{"continue":5},"items":[]}"#,
                "invalid type: integer `5`",
            ),
            (
                r#"{"metadata":{"remainingItemCount":1e30},"items":[]}"#,
                "invalid type: floating point",
            ),
            (
                r#"{"metadata":{"remainingItemCount":99999999999999999999},"items":[]}"#,
                "expected i64",
            ),
            (
                r#"{"items":[{"spec":{"containers":[{"ports":[{"containerPort":"80"}]}]}}]}"#,
                "expected i32",
            ),
            (
                r#"{"items":[{"spec":{"containers":[{"ports":[{"containerPort":4294967296}]}]}}]}"#,
                "expected i32",
            ),
            (
                r#"{"items":[{"spec":{"containers":[{"ports":[{"containerPort":1e999}]}]}}]}"#,
                "number out of range",
            ),
            (
                r#"{"items":[{"spec":{"hostNetwork":"yes"}}]}"#,
                "expected a boolean",
            ),
            (
                r#"{"items":[{"metadata":{"labels":{"app":7}}}]}"#,
                "invalid type: integer `7`",
            ),
            (
                r#"{"items":[{"metadata":{"labels":["app"]}}]}"#,
                "expected a map of labels",
            ),
            (
                r#"{"items":[{"metadata":{"name":"\ud800"}}]}"#,
                "unexpected end of hex escape",
            ),
            (
                r#"{"items":[{"metadata":{"name":"\uZZZZ"}}]}"#,
                "invalid escape",
            ),
            (
                r#"{"items":[{"status":{"podIPs":[{"ip":"\udc00x"}]}}]}"#,
                "surrogate in hex escape",
            ),
            (
                r#"{"items":[{"status":{"phase":"\ud83d\u0041"}}]}"#,
                "surrogate in hex escape",
            ),
            (r#"{"items":[]} trailing"#, "trailing characters"),
            ("", "EOF while parsing"),
            ("null", "invalid type: null, expected a PodList"),
        ];
        for (body, want) in bad {
            let err = decode_pod_list(4, body.as_bytes()).unwrap_err();
            let text = err.to_string();
            assert!(text.starts_with("page 4 of the pod list"), "{text}");
            assert!(text.contains(want), "{body}: {text}");
            assert!(text.contains("line 1 column"), "{text}");
            assert_eq!(err.line(), Some(1), "{text}");
            assert!(err.column().is_some(), "{text}");
        }
        // Multi-line bodies report the line.
        let err = decode_pod_list(1, b"{\n\"items\": [\n  {\"spec\": 5}\n]}").unwrap_err();
        assert_eq!((err.line(), err.column()), (Some(3), Some(12)), "{err}");
        // Not UTF-8: rejected as a whole, like the String kube made of the body.
        let err =
            decode_pod_list(2, b"{\"items\":[{\"metadata\":{\"name\":\"\xff\"}}]}").unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::ListPageUtf8 {
                    page: 2,
                    offset: 31
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.line(), None);
    }

    #[test]
    fn deep_nesting_is_an_error_or_skipped_never_a_stack_overflow() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        // In a field tgsync skips: serde_json skips it without recursing.
        let body = format!(
            r#"{{"items":[{{"metadata":{{"managedFields":{}}}}}]}}"#,
            deep(100_000)
        );
        assert_eq!(decode_pod_list(1, body.as_bytes()).unwrap().pods.len(), 1);
        // Where a value is read: the recursion limit answers.
        let body = format!(
            r#"{{"items":[{{"spec":{{"containers":[{{"ports":{}}}]}}}}]}}"#,
            deep(100_000)
        );
        assert!(decode_pod_list(1, body.as_bytes()).is_err());
        let body = format!(r#"{{"items":{}}}"#, deep(100_000));
        assert!(decode_pod_list(1, body.as_bytes()).is_err());
    }

    #[test]
    fn native_sidecar_named_ports_resolve_after_the_app_containers() {
        let pod = json!({
            "metadata": { "name": "meshed", "namespace": "shop" },
            "spec": {
                "initContainers": [
                    { "name": "migrate", "ports": [{ "name": "migrate", "containerPort": 7000 }] },
                    { "name": "proxy", "restartPolicy": "Always",
                      "ports": [{ "name": "proxy", "containerPort": 15001 }, { "name": "http", "containerPort": 15080 }] }
                ],
                "containers": [{ "name": "app", "ports": [{ "name": "http", "containerPort": 8080 }] }]
            }
        });
        let body = page_of(&[&pod.to_string()], json!({}));
        let facts = &decode_pod_list(1, body.as_bytes()).unwrap().pods[0];
        assert_eq!(
            facts.named_ports,
            [
                ("http".to_owned(), 8080),
                ("proxy".to_owned(), 15001),
                ("http".to_owned(), 15080)
            ]
        );
        assert_eq!(facts.named_port("http"), Some(8080));
        assert_eq!(facts.named_port("proxy"), Some(15001));
        assert_eq!(facts.named_port("migrate"), None);
        assert_agree(&pod.to_string());
    }

    #[test]
    fn watch_events_of_every_type() {
        let pod = serde_json::to_value(
            PodBuilder::new("shop", "web-1")
                .label("app", "web")
                .ip("10.0.0.7")
                .build(),
        )
        .unwrap();
        let mut with_version = pod.clone();
        with_version["metadata"]["resourceVersion"] = json!("4711");
        let expected = PodFacts::from_pod(serde_json::from_value(pod.clone()).unwrap());
        for (ty, object) in [
            ("ADDED", &with_version),
            ("MODIFIED", &with_version),
            ("DELETED", &pod),
        ] {
            let line = json!({ "type": ty, "object": object }).to_string();
            let event = decode_watch_event(line.as_bytes()).unwrap();
            let (WatchEvent::Added(watched)
            | WatchEvent::Modified(watched)
            | WatchEvent::Deleted(watched)) = &event
            else {
                panic!("{ty}: {event:?}");
            };
            assert_eq!(watched.facts, expected, "{ty}");
            let version = object["metadata"]["resourceVersion"].as_str();
            assert_eq!(watched.resource_version.as_deref(), version, "{ty}");
            let kind_matches = matches!(
                (ty, &event),
                ("ADDED", WatchEvent::Added(_))
                    | ("MODIFIED", WatchEvent::Modified(_))
                    | ("DELETED", WatchEvent::Deleted(_))
            );
            assert!(kind_matches, "{ty}: {event:?}");
            // The same line as kube reads it.
            let kube_event: kube::core::WatchEvent<Pod> = serde_json::from_str(&line).unwrap();
            let (kube::core::WatchEvent::Added(p)
            | kube::core::WatchEvent::Modified(p)
            | kube::core::WatchEvent::Deleted(p)) = kube_event
            else {
                panic!("kube read {ty} differently");
            };
            assert_eq!(PodFacts::from_pod(p), expected);
        }

        let bookmark = br#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"12345","annotations":{"k8s.io/initial-events-end":"true"},"creationTimestamp":null},"spec":{"containers":null},"status":{}}}"#;
        assert_eq!(
            decode_watch_event(bookmark).unwrap(),
            WatchEvent::Bookmark {
                resource_version: "12345".into()
            }
        );
        let error = br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (4711)","reason":"Expired","code":410}}"#;
        assert_eq!(
            decode_watch_event(error).unwrap(),
            WatchEvent::Error(WatchStatus {
                code: 410,
                reason: "Expired".into(),
                message: "too old resource version: 1 (4711)".into(),
            })
        );
        assert_eq!(
            decode_watch_event(br#"{"type":"ERROR","object":{}}"#).unwrap(),
            WatchEvent::Error(WatchStatus::default())
        );
        // `object` before `type` (not what the API server sends, but valid JSON).
        let line = format!(r#"{{"object":{with_version},"type":"ADDED"}}"#);
        let WatchEvent::Added(watched) = decode_watch_event(line.as_bytes()).unwrap() else {
            panic!("not ADDED");
        };
        assert_eq!(watched.facts, expected);
        assert_eq!(watched.resource_version.as_deref(), Some("4711"));
        let line = r#"{"object":{"metadata":{"resourceVersion":"77"}},"type":"BOOKMARK"}"#;
        assert_eq!(
            decode_watch_event(line.as_bytes()).unwrap(),
            WatchEvent::Bookmark {
                resource_version: "77".into()
            }
        );
        // A trailing newline, as the stream delimits events.
        let line = format!("{}\n", json!({ "type": "ADDED", "object": pod }));
        assert!(matches!(
            decode_watch_event(line.as_bytes()),
            Ok(WatchEvent::Added(_))
        ));
    }

    #[test]
    fn malformed_watch_events_are_errors() {
        let bad: &[(&[u8], &str)] = &[
            (
                br#"{"type":"RENAMED","object":{}}"#,
                "unknown variant `RENAMED`",
            ),
            (br#"{"type":"ADDED"}"#, "missing field `object`"),
            (br#"{"object":{}}"#, "missing field `type`"),
            (
                br#"{"type":"ADDED","type":"ADDED","object":{}}"#,
                "duplicate field `type`",
            ),
            (
                br#"{"type":"BOOKMARK","object":{"metadata":{}}}"#,
                "missing field `resourceVersion`",
            ),
            (
                br#"{"type":"ERROR","object":{"code":70000}}"#,
                "expected u16",
            ),
            (
                br#"{"type":"ADDED","object":{"kind":"Node"}}"#,
                "invalid value: string \"Node\", expected Pod",
            ),
            (
                br#"{"object":{"kind":"Node"},"type":"ADDED"}"#,
                "expected Pod",
            ),
            (
                br#"{"type":"ADDED","object":{"metadata":{"name":"\ud800"}}}"#,
                "unexpected end of hex escape",
            ),
            (br#"{"type":"ADDED","object":{"#, "EOF while parsing"),
            (b"[]", "expected a watch event"),
        ];
        for (line, want) in bad {
            let err = decode_watch_event(line).unwrap_err();
            let text = err.to_string();
            assert!(text.starts_with("pod watch event is not"), "{text}");
            assert!(
                text.contains(want),
                "{}: {text}",
                String::from_utf8_lossy(line)
            );
            assert!(err.line().is_some(), "{text}");
        }
        let err = decode_watch_event(b"{\"type\":\"ADDED\xc3\"}").unwrap_err();
        assert!(
            matches!(err, DecodeError::WatchEventUtf8 { offset: 14 }),
            "{err:?}"
        );
    }

    // -----------------------------------------------------------------------------------
    // Generated pods.

    /// Cases per property; `PROPTEST_CASES` overrides it for longer runs.
    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(500)
    }

    /// Short text, sometimes with characters JSON must escape.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "[a-z0-9-]{0,10}",
            1 => "[a-z\"\\\\/ \t\u{e9}\u{2028}\u{1F600}]{0,8}",
        ]
    }

    fn one_of(values: &'static [&'static str]) -> impl Strategy<Value = String> {
        proptest::sample::select(values).prop_map(str::to_owned)
    }

    fn ip() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => any::<[u8; 4]>().prop_map(|o| std::net::Ipv4Addr::from(o).to_string()),
            2 => any::<[u16; 8]>().prop_map(|s| std::net::Ipv6Addr::from(s).to_string()),
            1 => one_of(&["", "junk", "10.0.0.256", "::ffff:10.0.0.1", " 10.0.0.1", "fe80::1%eth0"]),
        ]
    }

    fn ports() -> impl Strategy<Value = Option<Vec<ContainerPort>>> {
        proptest::option::of(proptest::collection::vec(
            (
                proptest::option::of(prop_oneof![
                    one_of(&["http", "metrics", "proxy", ""]),
                    text()
                ]),
                prop_oneof![0..70_000i32, any::<i32>()],
            )
                .prop_map(|(name, container_port)| ContainerPort {
                    name,
                    container_port,
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }),
            0..4,
        ))
    }

    fn containers(max: usize) -> impl Strategy<Value = Vec<Container>> {
        proptest::collection::vec(
            (
                text(),
                ports(),
                proptest::option::of(one_of(&["Always", "OnFailure", "Never", "always"])),
            )
                .prop_map(|(name, ports, restart_policy)| Container {
                    name,
                    ports,
                    restart_policy,
                    image: Some("registry.example/app:1".into()),
                    ..Default::default()
                }),
            0..max,
        )
    }

    fn map() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
        proptest::option::of(proptest::collection::btree_map(text(), text(), 0..5))
    }

    fn pod() -> impl Strategy<Value = Pod> {
        let meta = (
            proptest::option::of(text()),
            proptest::option::of(text()),
            proptest::option::of(text()),
            map(),
            map(),
            proptest::option::of(one_of(&["true", " TRUE ", "True", "false", "yes", ""])),
            any::<bool>(),
            proptest::option::of("[0-9]{1,8}"),
        )
            .prop_map(
                |(name, namespace, uid, labels, mut annotations, exclude, terminating, version)| {
                    if let Some(v) = exclude {
                        annotations
                            .get_or_insert_with(BTreeMap::new)
                            .insert(EXCLUDE_ANNOTATION.to_owned(), v);
                    }
                    ObjectMeta {
                        name,
                        namespace,
                        uid,
                        labels,
                        annotations,
                        deletion_timestamp: terminating
                            .then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                        resource_version: version,
                        ..Default::default()
                    }
                },
            );
        let spec = proptest::option::of(
            (
                containers(4),
                proptest::option::of(containers(3)),
                proptest::option::of(proptest::collection::vec(
                    one_of(&[READINESS_GATE, "example.com/other"]),
                    0..3,
                )),
                proptest::option::of(any::<bool>()),
            )
                .prop_map(|(containers, init_containers, gates, host_network)| {
                    PodSpec {
                        containers,
                        init_containers,
                        readiness_gates: gates.map(|g| {
                            g.into_iter()
                                .map(|condition_type| PodReadinessGate { condition_type })
                                .collect()
                        }),
                        host_network,
                        ..Default::default()
                    }
                }),
        );
        let condition = (
            one_of(&[
                "Ready",
                "ContainersReady",
                READINESS_GATE,
                "PodScheduled",
                "ready",
            ]),
            one_of(&["True", "False", "Unknown", "true"]),
        )
            .prop_map(|(type_, status)| PodCondition {
                type_,
                status,
                ..Default::default()
            });
        let status = proptest::option::of(
            (
                proptest::option::of(one_of(&["Running", "Pending", "Succeeded", "Failed", ""])),
                proptest::option::of(proptest::collection::vec(condition, 0..6)),
                proptest::option::of(ip()),
                proptest::option::of(proptest::collection::vec(ip(), 0..4)),
            )
                .prop_map(|(phase, conditions, pod_ip, pod_ips)| PodStatus {
                    phase,
                    conditions,
                    pod_ip,
                    pod_ips: pod_ips.map(|l| l.into_iter().map(|ip| PodIP { ip }).collect()),
                    ..Default::default()
                }),
        );
        (meta, spec, status).prop_map(|(metadata, spec, status)| Pod {
            metadata,
            spec,
            status,
        })
    }

    /// Replaces `count` bytes of `text` with JSON-ish bytes at positions from `rng`.
    fn mutate(text: &str, seed: u64, count: usize) -> Vec<u8> {
        const ALPHABET: &[u8] = b"{}[]\",:0123456789eE.-+ntrufalse\\/u \n";
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut bytes = text.as_bytes().to_vec();
        for _ in 0..count {
            if bytes.is_empty() {
                break;
            }
            let at = rng.usize(..bytes.len());
            match rng.u8(0..3) {
                0 => bytes[at] = ALPHABET[rng.usize(..ALPHABET.len())],
                1 => {
                    bytes.remove(at);
                }
                _ => bytes.insert(at, ALPHABET[rng.usize(..ALPHABET.len())]),
            }
        }
        bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        /// Generated pods: the lean decoder and k8s-openapi + `take_from` agree, in a
        /// LIST page and in a watch event.
        #[test]
        fn generated_pods_decode_as_take_from_reads_them(
            pods in proptest::collection::vec(pod(), 0..5),
            version in proptest::option::of("[0-9]{1,9}"),
            token in proptest::option::of("[A-Za-z0-9=]{0,16}"),
            remaining in proptest::option::of(any::<i64>()),
        ) {
            let texts: Vec<String> = pods.iter().map(|p| serde_json::to_string(p).unwrap()).collect();
            let mut metadata = json!({});
            if let Some(v) = &version { metadata["resourceVersion"] = json!(v); }
            if let Some(t) = &token { metadata["continue"] = json!(t); }
            if let Some(r) = remaining { metadata["remainingItemCount"] = json!(r); }
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let body = page_of(&refs, metadata);
            let page = decode_pod_list(1, body.as_bytes()).unwrap();
            let expected: Vec<PodFacts> = pods.into_iter().map(PodFacts::from_pod).collect();
            prop_assert_eq!(&page.pods, &expected);
            prop_assert_eq!(&page.pods, &via_kube(&body).unwrap());
            prop_assert_eq!(page.resource_version, version);
            prop_assert_eq!(page.continue_token, token);
            prop_assert_eq!(page.remaining_item_count, remaining);
            for (text, facts) in texts.iter().zip(&expected) {
                let line = format!(r#"{{"type":"ADDED","object":{text}}}"#);
                let WatchEvent::Added(watched) = decode_watch_event(line.as_bytes()).unwrap() else {
                    panic!("not ADDED");
                };
                prop_assert_eq!(&watched.facts, facts);
                let json: Value = serde_json::from_str(text).unwrap();
                prop_assert_eq!(
                    watched.resource_version.as_deref(),
                    json["metadata"]["resourceVersion"].as_str()
                );
            }
        }

        /// Arbitrary bytes never panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
            let _ = decode_pod_list(1, &bytes);
            let _ = decode_watch_event(&bytes);
        }

        /// Mutated real pages never panic, and whenever kube still reads the page, the
        /// lean decoder reads it too and gives the same facts.
        #[test]
        fn mutated_pages_never_panic_and_agree_when_kube_reads_them(
            which in 0..12usize, seed in any::<u64>(), count in 1usize..6,
        ) {
            let all = fixtures();
            let (_, json) = &all[which % all.len()];
            let body = page_of(&[json], json!({ "resourceVersion": "1" }));
            let mutated = mutate(&body, seed, count);
            let lean = decode_pod_list(1, &mutated);
            if let Ok(text) = std::str::from_utf8(&mutated)
                && let Ok(kube) = via_kube(text)
            {
                prop_assert_eq!(lean.unwrap().pods, kube);
            }
            let line = format!(r#"{{"type":"DELETED","object":{json}}}"#);
            let _ = decode_watch_event(&mutate(&line, seed, count));
        }
    }
}
