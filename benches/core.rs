//! Benchmark of the reconcile core (not a test): 100,000 pods across 1,000 bound groups,
//! from Kubernetes `Pod` objects to full plans.
//!
//! Run: `cargo bench --bench core` (add `-- --quick` for fewer rounds). Pods arrive in
//! pages of 500 as a LIST would deliver them and are reduced to `PodFacts` page by page,
//! the way the resync adapter holds them; heap use is measured with a counting allocator.

#[path = "support/heap.rs"]
mod heap;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Pod, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tgsync::core::{
    AddressFamily, Binding, Claim, GroupFacts, HealthState, PodFacts, PodIndex, Rules, Target,
    UnixMillis, desired_targets, plan,
};

#[global_allocator]
static ALLOC: heap::Counting = heap::Counting;

const PODS: usize = 100_000;
const GROUPS: usize = 1_000;
const NAMESPACES: usize = 10;
const PAGE: usize = 500;

/// Pod numbers in the order a LIST returns them: by namespace, then by name (so the
/// replicas of one workload, which share a name prefix, arrive together).
fn list_order() -> Vec<usize> {
    let mut order: Vec<(String, String, usize)> = (0..PODS)
        .map(|i| {
            let g = i % GROUPS;
            (format!("ns-{}", g % NAMESPACES), format!("svc-{g}-{i}"), i)
        })
        .collect();
    order.sort();
    order.into_iter().map(|(_, _, i)| i).collect()
}

fn pod(i: usize) -> Pod {
    let group = i % GROUPS;
    let ns = format!("ns-{}", group % NAMESPACES);
    let ip = Ipv4Addr::from(0x0a00_0000u32 + i as u32).to_string();
    let cond = |t: &str, s: &str| PodCondition {
        type_: t.into(),
        status: s.into(),
        ..Default::default()
    };
    let ready = if i.is_multiple_of(20) {
        "False"
    } else {
        "True"
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("svc-{group}-{i}")),
            namespace: Some(ns),
            uid: Some(format!("00000000-0000-4000-8000-{i:012}")),
            labels: Some(BTreeMap::from([
                ("app".to_string(), format!("svc-{group}")),
                ("pod-template-hash".to_string(), "7d9f8c6b5".to_string()),
                ("tier".to_string(), "backend".to_string()),
            ])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                ports: Some(vec![
                    ContainerPort {
                        name: Some("http".into()),
                        container_port: 8080,
                        ..Default::default()
                    },
                    ContainerPort {
                        name: Some("metrics".into()),
                        container_port: 9090,
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(ip.clone()),
            pod_ips: Some(vec![PodIP { ip }]),
            conditions: Some(vec![
                cond("Initialized", "True"),
                cond("Ready", ready),
                cond("ContainersReady", ready),
                cond("PodScheduled", "True"),
            ]),
            ..Default::default()
        }),
    }
}

fn bindings() -> Vec<Binding> {
    let facts = GroupFacts {
        target_type: "ip".into(),
        port: Some(8080),
        family: AddressFamily::Ipv4,
        quic: false,
    };
    (0..GROUPS)
        .map(|g| {
            let tags = BTreeMap::from([
                ("tgsync/cluster".to_string(), "prod".to_string()),
                (
                    "tgsync/namespace".to_string(),
                    format!("ns-{}", g % NAMESPACES),
                ),
                (
                    "tgsync/selector".to_string(),
                    format!("app=svc-{g} tier=backend"),
                ),
                ("tgsync/port".to_string(), "http".to_string()),
            ]);
            Binding::parse(&tags, &facts).expect("bench tags are valid")
        })
        .collect()
}

/// Target-group state with a little drift: each group misses its first desired target,
/// still holds one deleted pod of ours, and one foreign target.
fn actual_and_owned(g: usize, desired: &BTreeSet<Target>) -> GroupState {
    let gone = Target::new(Ipv4Addr::from(0x0b00_0000u32 + g as u32).into(), 8080);
    let foreign = Target::new(Ipv4Addr::from(0xc0a8_0000u32 + g as u32).into(), 8080);
    let mut actual: Vec<(Target, HealthState)> = desired
        .iter()
        .skip(1)
        .map(|t| (*t, HealthState::Healthy))
        .collect();
    actual.push((gone, HealthState::Healthy));
    actual.push((foreign, HealthState::Healthy));
    let mut owned: BTreeSet<Target> = desired.iter().skip(1).copied().collect();
    owned.insert(gone);
    let claims = owned
        .into_iter()
        .map(|t| {
            (
                t,
                Claim {
                    mine: true,
                    since: UnixMillis(0),
                    tombstone: false,
                },
            )
        })
        .collect();
    (actual, claims)
}

/// One group's target health and ledger, as the I/O layer would hand them to the core.
type GroupState = (Vec<(Target, HealthState)>, BTreeMap<Target, Claim>);

struct Round {
    convert: Duration,
    core: Duration,
    peak_bytes: isize,
    register: usize,
    deregister: usize,
    desired: usize,
}

fn round(order: &[usize], bindings: &[Binding], states: &[GroupState]) -> Round {
    let base = heap::restart_peak();
    // Pods arrive page by page; only facts are kept.
    let mut facts = Vec::with_capacity(PODS);
    let mut convert = Duration::ZERO;
    for chunk in order.chunks(PAGE) {
        let mut page: Vec<Pod> = chunk.iter().map(|&i| pod(i)).collect();
        let t = Instant::now();
        facts.extend(page.iter_mut().map(PodFacts::take_from));
        drop(page);
        convert += t.elapsed();
    }
    let t = Instant::now();
    let index = PodIndex::new(&facts);
    let index_time = t.elapsed();
    let (mut register, mut deregister, mut desired_total) = (0, 0, 0);
    for (b, (actual, owned)) in bindings.iter().zip(states) {
        let d = desired_targets(index.candidates(b), b);
        let p = plan(
            &d.targets,
            actual.iter().map(|(t, s)| (t, s)),
            owned,
            &Rules::new(b.mode, UnixMillis(1_000_000)),
        );
        register += p.register.len();
        deregister += p.deregister.len();
        desired_total += d.targets.len();
    }
    let core = t.elapsed();
    if std::env::var_os("BENCH_PHASES").is_some() {
        eprintln!("index {:?} total {:?}", index_time, core);
    }
    let peak_bytes = heap::peak() - base;
    drop(index);
    drop(facts);
    Round {
        convert,
        core,
        peak_bytes,
        register,
        deregister,
        desired: desired_total,
    }
}

fn main() {
    heap::set_counting(false);
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 3 } else { 15 };
    let bindings = bindings();
    let order = list_order();
    // Precompute each group's target-group state once (it is I/O in real life).
    let states: Vec<_> = {
        let facts: Vec<PodFacts> = (0..PODS).map(|i| PodFacts::from_pod(pod(i))).collect();
        let index = PodIndex::new(&facts);
        bindings
            .iter()
            .enumerate()
            .map(|(g, b)| {
                let d = desired_targets(index.candidates(b), b);
                actual_and_owned(g, &d.targets.keys().copied().collect())
            })
            .collect()
    };
    // Timing rounds run without allocation counting (its atomics would skew them); one
    // more round counts every byte it allocates and frees, from a zero base.
    let mut results: Vec<Round> = (0..rounds)
        .map(|_| round(&order, &bindings, &states))
        .collect();
    heap::zero();
    heap::set_counting(true);
    let counted = round(&order, &bindings, &states);
    heap::set_counting(false);
    let r0 = &results[0];
    println!(
        "core bench: {PODS} pods, {GROUPS} groups, {} desired, {} to register, {} to deregister per pass",
        r0.desired, r0.register, r0.deregister
    );
    results.sort_by_key(|r| r.core);
    let med = &results[results.len() / 2];
    let best = &results[0];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "index+desired+plan (facts -> plans): median {:.1} ms, best {:.1} ms",
        ms(med.core),
        ms(best.core)
    );
    results.sort_by_key(|r| r.convert);
    let med_c = &results[results.len() / 2];
    println!(
        "Pod -> PodFacts (incl. freeing Pods): median {:.1} ms, best {:.1} ms",
        ms(med_c.convert),
        ms(results[0].convert)
    );
    let peak = counted.peak_bytes;
    println!(
        "peak heap during a pass (pages of {PAGE} Pods + facts + index + plans): {:.1} MiB",
        peak as f64 / (1024.0 * 1024.0)
    );
}
