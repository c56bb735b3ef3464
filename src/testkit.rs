//! Builders for realistic Kubernetes pods and tagged target groups, shared by unit tests,
//! integration tests, benchmarks and the local sandbox.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, ContainerState, ContainerStateRunning,
    ContainerStatus, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction, HTTPGetAction, HostIP,
    Lifecycle, LifecycleHandler, ObjectFieldSelector, Pod, PodCondition, PodIP, PodReadinessGate,
    PodSpec, PodStatus, Probe, ResourceRequirements, SleepAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use crate::core::{AddressFamily, GroupFacts};
use crate::groups::TargetGroup;

/// A fence that never refuses: for tests that call the ELBv2 adapter's mutations
/// directly, outside any lease.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unfenced;

impl crate::groups::Fence for Unfenced {
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

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

    /// Sets `spec.terminationGracePeriodSeconds`.
    pub fn grace_period(mut self, seconds: i64) -> Self {
        if let Some(spec) = self.pod.spec.as_mut() {
            spec.termination_grace_period_seconds = Some(seconds);
        }
        self
    }

    /// Gives the `app` container the native `preStop` sleep (Kubernetes 1.30+).
    pub fn pre_stop_sleep(self, seconds: i64) -> Self {
        self.pre_stop(LifecycleHandler {
            sleep: Some(SleepAction { seconds }),
            ..Default::default()
        })
    }

    /// Gives the `app` container a `preStop` hook that execs `command`.
    pub fn pre_stop_exec(self, command: &[&str]) -> Self {
        self.pre_stop(LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(command.iter().map(|w| (*w).to_owned()).collect()),
            }),
            ..Default::default()
        })
    }

    /// Gives the `app` container `hook` as its `preStop`.
    pub fn pre_stop(mut self, hook: LifecycleHandler) -> Self {
        if let Some(app) = self
            .pod
            .spec
            .as_mut()
            .and_then(|s| s.containers.first_mut())
        {
            app.lifecycle = Some(Lifecycle {
                pre_stop: Some(hook),
                ..Default::default()
            });
        }
        self
    }

    /// Puts the pod on node `name` (`spec.nodeName`).
    pub fn node(mut self, name: &str) -> Self {
        if let Some(spec) = self.pod.spec.as_mut() {
            spec.node_name = Some(name.to_owned());
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

    /// Fills in the rest of what a LIST returns for a pod of a typical Deployment, so
    /// benchmarks decode what a real cluster sends (about 4.5 KB of JSON rather than a few
    /// hundred bytes): three `managedFields` entries, an owner reference, annotations, a
    /// second container (the `app` container keeps its ports and gains a `metrics` port,
    /// ten env vars, resources, a mount and a probe), volumes, and a
    /// kubelet-reported status with container statuses. tgsync reads none of it; the
    /// facts of the pod stay what the other builder calls set. Values vary with the
    /// pod's name, as in a real list.
    pub fn realistic(mut self) -> Self {
        let name = self.pod.metadata.name.clone().unwrap_or_default();
        let seed = fnv(&name);
        let hex = |salt: u64| format!("{:016x}", fnv_step(seed ^ salt));
        let app = self
            .pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .cloned()
            .unwrap_or_else(|| "web".to_owned());
        let hash = hex(1)[..10].to_owned();
        let replica_set = format!("{app}-{hash}");
        let created = 1_790_000_000 + (seed % 86_400) as i64;
        let time = |offset: i64| {
            Time(Timestamp::from_second(created + offset).unwrap_or(Timestamp::UNIX_EPOCH))
        };
        let registry = "123456789012.dkr.ecr.us-east-1.amazonaws.com";
        let images = [
            format!("{registry}/{app}:1.42.{}", seed % 7),
            "public.ecr.aws/aws-observability/aws-for-fluent-bit:2.32.2".to_owned(),
        ];
        let node = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();

        let meta = &mut self.pod.metadata;
        meta.generate_name = Some(format!("{replica_set}-"));
        meta.resource_version = Some((40_000_000 + seed % 1_000_000).to_string());
        meta.creation_timestamp = Some(time(0));
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .entry("pod-template-hash".to_owned())
            .or_insert_with(|| hash.clone());
        let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
        for (k, v) in [
            ("kubectl.kubernetes.io/restartedAt", "2026-09-14T08:12:44Z"),
            ("prometheus.io/scrape", "true"),
        ] {
            annotations
                .entry(k.to_owned())
                .or_insert_with(|| v.to_owned());
        }
        let owner_uid = format!("{}-{}-4{}", &hex(3)[..8], &hex(4)[..4], &hex(5)[..3]);
        meta.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: replica_set,
            uid: owner_uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        let fields = |manager: &str, subresource: Option<&str>, at: i64, v: serde_json::Value| {
            ManagedFieldsEntry {
                api_version: Some("v1".into()),
                fields_type: Some("FieldsV1".into()),
                fields_v1: Some(FieldsV1(v)),
                manager: Some(manager.into()),
                operation: Some("Update".into()),
                subresource: subresource.map(str::to_owned),
                time: Some(time(at)),
            }
        };
        meta.managed_fields = Some(vec![
            fields(
                "kube-controller-manager",
                None,
                0,
                json!({
                    "f:metadata": {
                        "f:generateName": {},
                        "f:labels": { ".": {}, "f:app": {}, "f:pod-template-hash": {} },
                        "f:ownerReferences": { ".": {}, format!("k:{{\"uid\":\"{owner_uid}\"}}"): {} }
                    },
                    "f:spec": {
                        "f:containers": { "k:{\"name\":\"app\"}": { ".": {}, "f:env": {}, "f:image": {} } }
                    }
                }),
            ),
            fields(
                "kubelet",
                Some("status"),
                9,
                json!({
                    "f:status": {
                        "f:conditions": { "k:{\"type\":\"Ready\"}": { ".": {}, "f:status": {}, "f:type": {} } },
                        "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {}, "f:podIP": {}, "f:startTime": {}
                    }
                }),
            ),
            fields(
                "kubectl-annotate",
                None,
                60,
                json!({ "f:metadata": { "f:annotations": { "f:prometheus.io/scrape": {} } } }),
            ),
        ]);

        let env = |pairs: &[(&str, &str)]| -> Vec<EnvVar> {
            pairs
                .iter()
                .map(|(k, v)| EnvVar {
                    name: (*k).to_owned(),
                    value: Some((*v).to_owned()),
                    value_from: None,
                })
                .collect()
        };
        let resources = |cpu: &str, memory: &str| ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity(memory.to_owned()),
            )])),
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity(cpu.to_owned())),
                ("memory".to_owned(), Quantity(memory.to_owned())),
            ])),
            ..Default::default()
        };
        let mount = |name: &str, path: &str| VolumeMount {
            name: name.to_owned(),
            mount_path: path.to_owned(),
            read_only: Some(true),
            ..Default::default()
        };
        let probe = |path: &str, period: i32| Probe {
            http_get: Some(HTTPGetAction {
                path: Some(path.to_owned()),
                port: IntOrString::String("http".into()),
                scheme: Some("HTTP".into()),
                ..Default::default()
            }),
            period_seconds: Some(period),
            failure_threshold: Some(3),
            ..Default::default()
        };
        let spec = self.pod.spec.get_or_insert_with(Default::default);
        if let Some(main) = spec.containers.first_mut() {
            main.image = Some(images[0].clone());
            main.ports.get_or_insert_with(Vec::new).push(ContainerPort {
                name: Some("metrics".into()),
                container_port: 9090,
                protocol: Some("TCP".into()),
                ..Default::default()
            });
            let mut vars = env(&[
                ("LOG_LEVEL", "info"),
                ("HTTP_PORT", "8080"),
                ("METRICS_PORT", "9090"),
                ("DB_HOST", "orders-db.shop.svc"),
                ("DB_POOL_SIZE", "20"),
                ("CACHE_URL", "redis://cache:6379/0"),
                ("OTEL_SERVICE_NAME", &app),
                ("AWS_REGION", "us-east-1"),
                ("GOMAXPROCS", "2"),
            ]);
            vars.push(EnvVar {
                name: "POD_NAME".into(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        api_version: Some("v1".into()),
                        field_path: "metadata.name".into(),
                    }),
                    ..Default::default()
                }),
            });
            main.env = Some(vars);
            main.resources = Some(resources("250m", "512Mi"));
            main.volume_mounts = Some(vec![mount("config", "/etc/app")]);
            main.readiness_probe = Some(probe("/ready", 5));
            main.image_pull_policy = Some("IfNotPresent".into());
        }
        spec.containers.push(Container {
            name: "log-router".into(),
            image: Some(images[1].clone()),
            env: Some(env(&[
                ("FLB_LOG_LEVEL", "warn"),
                ("LOG_GROUP", "/eks/prod"),
            ])),
            resources: Some(resources("50m", "64Mi")),
            volume_mounts: Some(vec![mount("logs", "/var/log/app")]),
            image_pull_policy: Some("IfNotPresent".into()),
            ..Default::default()
        });
        spec.volumes = Some(vec![
            Volume {
                name: "config".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: format!("{app}-config"),
                    ..Default::default()
                }),
                ..Default::default()
            },
            Volume {
                name: "logs".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            },
        ]);
        spec.restart_policy = Some("Always".into());
        spec.termination_grace_period_seconds = Some(30);
        spec.dns_policy = Some("ClusterFirst".into());
        spec.service_account_name = Some(app.clone());
        spec.scheduler_name = Some("default-scheduler".into());
        spec.priority = Some(0);

        let host_ip = node
            .strip_prefix("ip-")
            .and_then(|n| n.split('.').next())
            .map(|n| n.replace('-', "."))
            .unwrap_or_else(|| "10.0.0.10".to_owned());
        let statuses = ["app", "log-router"]
            .iter()
            .zip(&images)
            .enumerate()
            .map(|(i, (container, image))| {
                let salt = 10 * i as u64;
                let digest = format!(
                    "{}{}{}{}",
                    hex(salt),
                    hex(salt + 1),
                    hex(salt + 2),
                    hex(salt + 3)
                );
                let repository = image.split(':').next().unwrap_or(image);
                ContainerStatus {
                    name: (*container).to_owned(),
                    image: image.clone(),
                    image_id: format!("{repository}@sha256:{digest}"),
                    container_id: Some(format!("containerd://{}{}", hex(salt + 4), hex(salt + 5))),
                    ready: true,
                    started: Some(true),
                    restart_count: 0,
                    state: Some(ContainerState {
                        running: Some(ContainerStateRunning {
                            started_at: Some(time(3 + i as i64)),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            })
            .collect();
        let status = self.pod.status.get_or_insert_with(Default::default);
        status.host_ip = Some(host_ip.clone());
        status.host_ips = Some(vec![HostIP { ip: host_ip }]);
        status.start_time = Some(time(0));
        status.qos_class = Some("Burstable".into());
        status.container_statuses = Some(statuses);
        for c in status.conditions.iter_mut().flatten() {
            c.last_transition_time = Some(time(if c.type_ == "PodScheduled" { 0 } else { 9 }));
        }
        self
    }

    /// The pod.
    pub fn build(self) -> Pod {
        self.pod
    }
}

/// FNV-1a of `s`: a stable seed for the values [`PodBuilder::realistic`] varies by pod.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// One more mixing step, for several values from one seed.
fn fnv_step(h: u64) -> u64 {
    (h ^ (h >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ (h >> 32)
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

/// Sets the `tgsync/target-health` condition as a gate patch does (status, reason and
/// message).
pub fn set_gate_condition(pod: &mut Pod, open: bool, reason: &str, message: &str) {
    set_condition(pod, crate::core::pod::READINESS_GATE, open);
    if let Some(c) = pod
        .status
        .as_mut()
        .and_then(|s| s.conditions.as_mut())
        .and_then(|cs| {
            cs.iter_mut()
                .find(|c| c.type_ == crate::core::pod::READINESS_GATE)
        })
    {
        c.reason = Some(reason.to_owned());
        c.message = Some(message.to_owned());
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
            quic: false,
        },
        tags: BTreeMap::from([
            ("tgsync/cluster".to_owned(), cluster.to_owned()),
            ("tgsync/namespace".to_owned(), namespace.to_owned()),
            ("tgsync/selector".to_owned(), selector.to_owned()),
        ]),
    }
}

/// The binding [`bound_group`]'s tags make (cluster `cluster`, group port `port`).
pub fn binding(cluster: &str, namespace: &str, selector: &str, port: u16) -> crate::core::Binding {
    crate::core::Binding {
        clusters: vec![cluster.to_owned()],
        namespace: namespace.to_owned(),
        selector: crate::core::Selector::parse(selector).unwrap_or_else(|e| panic!("{e}")),
        port: crate::core::PortSpec::Number(port),
        mode: crate::core::Mode::Shared,
        family: AddressFamily::Ipv4,
        quic: false,
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
    ) -> crate::controller::Engine<
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
        crate::controller::Engine::new(
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
