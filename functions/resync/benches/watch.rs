//! Benchmark (not a test): watch mode of the built `tgsync-resync` binary, against moto
//! (through a proxy that records when each ELBv2 call arrives and keeps new targets
//! `initial` for a while, as an NLB does until its health checks pass) and the Kubernetes
//! API emulator. The binary runs one scheduled invocation in watch mode through a Lambda
//! Runtime API stand-in, exactly as deployed.
//!
//! Run: `scripts/bench.sh watch` (or `cargo bench -p tgsync-resync --bench watch`; moto
//! from `TGSYNC_TEST_AWS_ENDPOINT`, or started by `tests/support/moto.rs`).
//!
//! 1. **Reaction**: 40 pod changes (a pod turning Ready, then NotReady, in turn), 700 ms
//!    apart: time from the change in the API server to the RegisterTargets /
//!    DeregisterTargets call that applies it arriving at ELBv2. Goal p50 < 1 s, p99 < 2 s.
//! 2. **Gated rolling update**: 20 gated pods replaced one at a time, the way a
//!    Deployment with `maxSurge: 1, maxUnavailable: 0` does it: a new pod starts (its
//!    containers ready after `POD_START`), and only when it is Ready — which needs its
//!    `tgsync/target-health` gate True, which tgsync sets when the NLB reports the target
//!    healthy, `INITIAL_FOR` after registration — is the old pod deleted and the next
//!    started. Reports the time from a target turning healthy to its gate opening (goal
//!    p50 < 5 s) and the whole update against the floor of 20 × (`POD_START` +
//!    `INITIAL_FOR`) (goal within 15 %). `TGSYNC_ROLLING_PODS` and
//!    `TGSYNC_INITIAL_SECONDS` shrink it for a quick look.
//!
//! `TGSYNC_CPU_SHARE_MB=256` runs the binary inside Lambda's CPU share for that memory
//! size (`scripts/bench/cpu-share.sh`, root; moto, the proxy and the emulator stay
//! outside it): reaction and gate latency where the function is deployed.

#[path = "../../../tests/support/chaos_proxy.rs"]
mod chaos_proxy;
mod common;
#[path = "../../../benches/support/cpu_share.rs"]
#[allow(dead_code)]
mod cpu_share;
#[path = "../../../benches/support/measure.rs"]
mod measure;
#[path = "../../../tests/support/moto.rs"]
mod moto;
#[path = "../../../tests/support/runtime_api.rs"]
mod runtime_api;
#[path = "../../../tests/support/world.rs"]
mod world;

use std::time::{Duration, Instant};

use common::{call_for, pct, proxy, scheduled, start_function};
use measure::{env_or, ms};
use runtime_api::RuntimeApi;
use tgsync::testkit::{PodBuilder, set_condition};
use world::World;

const CHANGES: usize = 40;
const CHANGE_GAP: Duration = Duration::from_millis(700);
/// A new pod's containers are ready this long after it is created.
const POD_START: Duration = Duration::from_secs(1);

fn web(name: &str, ip: &str) -> PodBuilder {
    PodBuilder::new("shop", name).label("app", "web").ip(ip)
}

fn gate_is_open(w: &World, name: &str) -> bool {
    common::gate_is_open(w, "shop", name)
}

/// Part 1: pod change → the ELBv2 call that applies it.
async fn reaction() {
    let w = World::new().await;
    w.group("shop", "app=web", 8080, &[]).await;
    for i in 0..4 {
        w.put_pod(
            web(&format!("web-{i}"), &format!("10.0.2.{i}"))
                .ready(false)
                .build(),
        );
    }
    let proxy = proxy(None).await;
    let runtime = RuntimeApi::start().await;
    let _function = start_function(&w, &proxy, &runtime, 120);
    runtime.invoke(scheduled(), Duration::from_secs(180));
    // The full diff runs first; give it a moment, then change pods one at a time.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut samples = Vec::new();
    let mut missed = 0;
    for n in 0..CHANGES {
        let pod = n % 4;
        let (name, ip) = (format!("web-{pod}"), format!("10.0.2.{pod}"));
        // Each pod: Ready on its first change, NotReady on its second, and so on.
        let ready = (n / 4) % 2 == 0;
        let at = Instant::now();
        w.emulator.store().update_pod("shop", &name, |p| {
            set_condition(p, "Ready", ready);
            set_condition(p, "ContainersReady", ready);
        });
        tokio::time::sleep(CHANGE_GAP).await;
        let op = if ready {
            "RegisterTargets"
        } else {
            "DeregisterTargets"
        };
        match call_for(&proxy.records(), &ip, op, at) {
            Some(call) => samples.push(call - at),
            None => missed += 1,
        }
    }
    samples.sort();
    println!(
        "reaction, pod change in the API server -> the ELBv2 call applying it ({} changes, {missed} not applied within {} ms):\n  p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        samples.len(),
        CHANGE_GAP.as_millis(),
        ms(pct(&samples, 0.5)),
        ms(pct(&samples, 0.9)),
        ms(pct(&samples, 0.99)),
        ms(samples.last().copied().unwrap_or_default()),
    );
}

/// Part 2: a rolling update of gated pods against an NLB that keeps new targets
/// `initial` for `initial_for`.
async fn rolling_update(pods: usize, initial_for: Duration) {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    let gated = |name: &str, ip: &str, ready: bool| {
        let mut pod = web(name, ip).gated().build();
        set_condition(&mut pod, "ContainersReady", true);
        set_condition(&mut pod, "Ready", ready);
        set_condition(&mut pod, "tgsync/target-health", ready);
        pod
    };
    for i in 0..pods {
        w.put_pod(gated(&format!("old-{i}"), &format!("10.0.3.{i}"), true));
    }
    let proxy = proxy(Some(initial_for)).await;
    let runtime = RuntimeApi::start().await;
    let floor = (POD_START + initial_for) * u32::try_from(pods).unwrap_or(u32::MAX);
    let watch = floor.as_secs() * 3 / 2 + 60;
    let _function = start_function(&w, &proxy, &runtime, watch.min(840));
    runtime.invoke(scheduled(), Duration::from_secs(900));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = Instant::now();
    let mut gate_after_healthy = Vec::new();
    for i in 0..pods {
        let (name, ip) = (format!("new-{i}"), format!("10.0.4.{i}"));
        // The pod is scheduled; its containers start.
        let mut pod = web(&name, &ip).gated().build();
        set_condition(&mut pod, "ContainersReady", false);
        set_condition(&mut pod, "Ready", false);
        w.put_pod(pod);
        tokio::time::sleep(POD_START).await;
        w.emulator
            .store()
            .update_pod("shop", &name, |p| set_condition(p, "ContainersReady", true));
        // The kubelet turns it Ready once the gate is True (polling as a kubelet's
        // status sync would, every 50 ms).
        let waited = Instant::now();
        while !gate_is_open(&w, &name) {
            assert!(
                waited.elapsed() < initial_for + Duration::from_secs(60),
                "the gate of {name} never opened"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let opened = Instant::now();
        if let Some(registered) = call_for(&proxy.records(), &ip, "RegisterTargets", started) {
            gate_after_healthy.push(opened.saturating_duration_since(registered + initial_for));
        }
        w.emulator
            .store()
            .update_pod("shop", &name, |p| set_condition(p, "Ready", true));
        // Then the old pod goes.
        w.emulator
            .store()
            .set_terminating("shop", &format!("old-{i}"));
        w.emulator.store().delete_pod("shop", &format!("old-{i}"));
    }
    let total = started.elapsed();
    gate_after_healthy.sort();
    println!(
        "gated rolling update, {pods} pods, targets initial for {} s after registration, pods start in {} s:\n  \
         target healthy -> gate True: p50 {:.0} ms, p90 {:.0} ms, max {:.0} ms\n  \
         total {:.1} s against the floor of {pods} x ({} s + {} s) = {:.1} s: {:+.1} %",
        initial_for.as_secs(),
        POD_START.as_secs(),
        ms(pct(&gate_after_healthy, 0.5)),
        ms(pct(&gate_after_healthy, 0.9)),
        ms(gate_after_healthy.last().copied().unwrap_or_default()),
        total.as_secs_f64(),
        POD_START.as_secs(),
        initial_for.as_secs(),
        floor.as_secs_f64(),
        (total.as_secs_f64() / floor.as_secs_f64() - 1.0) * 100.0,
    );
    // Every old pod is out, every new one in (the last deletion a moment ago).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut want: Vec<String> = (0..pods).map(|i| format!("10.0.4.{i}:8080")).collect();
    want.sort();
    let have = w.targets(&arn).await;
    println!(
        "  targets at the end: {} new of {pods}, {} in all",
        have.iter().filter(|t| want.contains(t)).count(),
        have.len()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    tgsync::app::install_crypto_provider();
    let pods = env_or("TGSYNC_ROLLING_PODS", 20usize);
    let initial_for = Duration::from_secs(env_or("TGSYNC_INITIAL_SECONDS", 30u64));
    println!(
        "the function's CPU: {}",
        match common::cpu_share_mb().as_str() {
            "full" => "the full machine".to_owned(),
            mb => format!("Lambda's share at {mb} MB"),
        }
    );
    reaction().await;
    rolling_update(pods, initial_for).await;
}
