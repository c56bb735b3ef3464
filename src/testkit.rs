//! Builders for realistic Kubernetes pods and tagged target groups, shared by unit tests,
//! integration tests, benchmarks and the local sandbox.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Pod, PodCondition, PodIP, PodReadinessGate, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::core::{AddressFamily, GroupFacts};
use crate::groups::TargetGroup;

/// A pod as the API server would return it once the kubelet reports on it.
#[derive(Debug, Clone)]
pub struct PodBuilder {
    pod: Pod,
}

impl PodBuilder {
    /// A Running, Ready pod in `namespace` with container port `http` = 8080.
    pub fn new(namespace: &str, name: &str) -> Self {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                uid: Some(format!("uid-{namespace}-{name}")),
                labels: Some(BTreeMap::new()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("public.ecr.aws/docker/library/nginx:1.27".into()),
                    ports: Some(vec![ContainerPort {
                        name: Some("http".into()),
                        container_port: 8080,
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }],
                node_name: Some("ip-10-0-0-10.ec2.internal".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                conditions: Some(vec![
                    condition("PodScheduled", true),
                    condition("Initialized", true),
                    condition("ContainersReady", true),
                    condition("Ready", true),
                ]),
                ..Default::default()
            }),
        };
        Self { pod }
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.pod
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// Sets the pod IP(s) (`status.podIP` is the first).
    pub fn ips(mut self, ips: &[&str]) -> Self {
        let status = self.pod.status.get_or_insert_with(Default::default);
        status.pod_ip = ips.first().map(|s| s.to_string());
        status.pod_ips = Some(ips.iter().map(|ip| PodIP { ip: ip.to_string() }).collect());
        self
    }

    /// Sets one pod IP.
    pub fn ip(self, ip: &str) -> Self {
        self.ips(&[ip])
    }

    /// Sets the Ready and ContainersReady conditions.
    pub fn ready(mut self, ready: bool) -> Self {
        set_condition(&mut self.pod, "Ready", ready);
        set_condition(&mut self.pod, "ContainersReady", ready);
        self
    }

    /// Sets the phase.
    pub fn phase(mut self, phase: &str) -> Self {
        self.pod.status.get_or_insert_with(Default::default).phase = Some(phase.to_owned());
        self
    }

    /// Marks the pod terminating.
    pub fn terminating(mut self) -> Self {
        self.pod.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        self
    }

    /// Declares the `tgsync/target-health` readiness gate.
    pub fn gated(mut self) -> Self {
        if let Some(spec) = self.pod.spec.as_mut() {
            spec.readiness_gates = Some(vec![PodReadinessGate {
                condition_type: crate::core::pod::READINESS_GATE.into(),
            }]);
        }
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.pod
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// The pod.
    pub fn build(self) -> Pod {
        self.pod
    }
}

/// Marks a pod terminating in place (as `kubectl delete` does before the pod is gone).
pub fn mark_terminating(pod: &mut Pod) {
    pod.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
}

/// Sets a pod condition in place.
pub fn set_condition(pod: &mut Pod, ty: &str, value: bool) {
    let conditions = pod
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new);
    match conditions.iter_mut().find(|c| c.type_ == ty) {
        Some(c) => c.status = if value { "True" } else { "False" }.into(),
        None => conditions.push(condition(ty, value)),
    }
}

fn condition(ty: &str, value: bool) -> PodCondition {
    PodCondition {
        type_: ty.into(),
        status: if value { "True" } else { "False" }.into(),
        ..Default::default()
    }
}

/// An IP target group with binding tags, as the IaC would create it.
pub fn bound_group(
    arn: &str,
    cluster: &str,
    namespace: &str,
    selector: &str,
    port: u16,
) -> TargetGroup {
    let name = arn.rsplit('/').nth(1).unwrap_or(arn).to_owned();
    TargetGroup {
        arn: arn.to_owned(),
        name,
        facts: GroupFacts {
            target_type: "ip".into(),
            port: Some(port),
            family: AddressFamily::Ipv4,
        },
        tags: BTreeMap::from([
            ("tgsync/cluster".to_owned(), cluster.to_owned()),
            ("tgsync/namespace".to_owned(), namespace.to_owned()),
            ("tgsync/selector".to_owned(), selector.to_owned()),
        ]),
    }
}

/// The calls made between two snapshots of an adapter's `api_calls()` counters, by
/// operation (operations with no new calls are left out), for benchmarks and tests
/// that count what one run cost.
pub fn calls_since(
    after: &BTreeMap<&'static str, u64>,
    before: &BTreeMap<&'static str, u64>,
) -> BTreeMap<&'static str, u64> {
    after
        .iter()
        .map(|(k, v)| (*k, v.saturating_sub(before.get(k).copied().unwrap_or(0))))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// A fleet of bound groups for volume tests and measurements: group `g` is
/// `svc-{g}` in namespace `ns-{g % namespaces}`, selects `app=svc-{g}` on port 8080, and
/// has `pods_per_group` ready pods with distinct IPs. The same shape as the API-call and
/// log-volume measurements, so their numbers compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fleet {
    /// Bound groups.
    pub groups: usize,
    /// Namespaces the groups are spread over.
    pub namespaces: usize,
    /// Ready pods per group.
    pub pods_per_group: usize,
}

impl Fleet {
    /// The namespace of group `g`.
    pub fn namespace(&self, g: usize) -> String {
        format!("ns-{}", g % self.namespaces.max(1))
    }

    /// The selector tag of group `g`.
    pub fn selector(&self, g: usize) -> String {
        format!("app=svc-{g}")
    }

    /// The ARN of group `g` in the in-memory fakes.
    pub fn arn(&self, g: usize) -> String {
        format!("arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/svc-{g}/{g:016x}")
    }

    /// Pod `p` of group `g`: ready, labelled for the group, with its own IP.
    pub fn pod(&self, g: usize, p: usize) -> Pod {
        let i = g * self.pods_per_group + p;
        PodBuilder::new(&self.namespace(g), &format!("svc-{g}-{p}"))
            .label("app", &format!("svc-{g}"))
            .ip(&format!("10.1.{}.{}", i / 250, 1 + i % 250))
            .build()
    }

    /// An engine for cluster `demo` over the in-memory fakes holding the whole fleet
    /// (groups tagged, pods ready, nothing registered yet), on `clock`.
    pub fn fake_engine(
        &self,
        clock: crate::clock::ManualClock,
    ) -> crate::reconcile::Engine<
        crate::fakes::FakePods,
        crate::fakes::FakeElb,
        crate::fakes::FakeState,
    > {
        let elb = crate::fakes::FakeElb::default();
        let pods = crate::fakes::FakePods::default();
        for g in 0..self.groups {
            elb.add_group(bound_group(
                &self.arn(g),
                "demo",
                &self.namespace(g),
                &self.selector(g),
                8080,
            ));
            for p in 0..self.pods_per_group {
                pods.put(self.pod(g, p));
            }
        }
        crate::reconcile::Engine::new(
            "demo",
            pods,
            elb,
            crate::fakes::FakeState::default(),
            std::sync::Arc::new(clock),
        )
    }
}

/// Everything a log subscriber writes, kept in memory: pass it (cloned) as the writer of
/// `tgsync::logging::init_with`, then [`LogCapture::take`] what was written.
#[derive(Debug, Clone, Default)]
pub struct LogCapture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogCapture {
    type Writer = LogCapture;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl LogCapture {
    /// Takes the log lines written so far (empty lines and EMF metric lines, which carry
    /// `"_aws"`, left out: metrics are not log lines).
    pub fn take(&self) -> Vec<String> {
        let text = self
            .0
            .lock()
            .map(|mut b| String::from_utf8_lossy(&std::mem::take(&mut *b)).into_owned())
            .unwrap_or_default();
        text.lines()
            .filter(|l| !l.trim().is_empty() && !l.contains("\"_aws\""))
            .map(str::to_owned)
            .collect()
    }
}
