//! Benchmark (not a test): how fast the release `tgsync-resync` binary reacts when it
//! gets only Lambda's share of a CPU. Lambda gives a function CPU in proportion to its
//! memory, a full vCPU at 1,769 MB: 0.072 vCPU at 128 MB, 0.145 at 256 MB, 0.289 at
//! 512 MB. The binary runs under `scripts/bench/cpu-share.sh MB`, a cgroup CPU quota of
//! `100 ms × MB / 1769` per 100 ms period (cgroup v1 `cpu.cfs_quota_us`, or v2 `cpu.max`);
//! moto, the proxy and the Kubernetes API emulator stay outside it, on the full machine.
//!
//! Run: `scripts/bench.sh cpu-share` (needs root for the cgroup; moto from
//! `TGSYNC_TEST_AWS_ENDPOINT` or started by `tests/support/moto.rs`).
//! `TGSYNC_CPU_SHARE_SIZES` (default `full,512,256,128`) picks the memory sizes,
//! `TGSYNC_CPU_SHARE_RUNS` (default 3) how many fresh worlds each size gets (the
//! reactions of all runs are pooled; the other figures are medians over the runs), and
//! `TGSYNC_RESYNC_BIN` other builds of the binary, comma-separated (a before/after in
//! one sitting; their runs alternate).
//!
//! Per size, a new world of 20 groups × 50 realistic pods (~4.5 KB of JSON each) and
//! one container serving three scheduled invocations, each watching for 30 s:
//! 1. cold: the container's first invocation LISTs every pod and registers the 1,000
//!    targets (reported: invoke → the last RegisterTargets);
//! 2. warm: 15 pods (one per group) turn NotReady, one every 2 s from 0.5 s after the
//!    invocation starts, while the invocation's full diff (the verification of every
//!    group) runs in its first seconds;
//! 3. warm: the same 15 pods turn Ready again, same timing.
//!
//! Reaction is the time from the change in the API server to the arrival at ELBv2 of
//! the DeregisterTargets / RegisterTargets call that applies it, split into changes
//! made in an invocation's first 10 s (while its full diff runs) and after. Also shown:
//! the function's CPU time per invocation and how often the quota throttled it.

#[path = "../../../tests/support/chaos_proxy.rs"]
mod chaos_proxy;
mod common;
#[path = "../../../benches/support/cpu_share.rs"]
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

use common::{call_for, pct, proxy, scheduled};
use cpu_share::{cpu_time, throttled, under_share};
use measure::{Reaper, env_or, ms};
use runtime_api::RuntimeApi;
use tgsync::testkit::{PodBuilder, set_condition};
use world::World;

const GROUPS: usize = 20;
const PODS: usize = 50;
const CHANGED: usize = 15;
const CHANGE_GAP: Duration = Duration::from_secs(2);
const FIRST_CHANGE: Duration = Duration::from_millis(500);
const DURING_DIFF: Duration = Duration::from_secs(10);
const WATCH_SECONDS: u64 = 30;

fn pod(g: usize, p: usize) -> PodBuilder {
    PodBuilder::new("shop", &format!("svc{g}-{p}"))
        .label("app", &format!("svc{g}"))
        .ip(&format!("10.1.{g}.{p}"))
        .realistic()
}

struct Invocation {
    during_diff: Vec<Duration>,
    steady: Vec<Duration>,
    missed: usize,
    cpu: Duration,
}

/// One invocation: changes `CHANGED` pods to `ready` on the schedule above and
/// measures each one's reaction.
async fn invocation(
    w: &World,
    runtime: &RuntimeApi,
    proxy: &chaos_proxy::ChaosProxy,
    pid: u32,
    polls: usize,
    ready: Option<bool>,
) -> Invocation {
    assert!(
        runtime.polled(polls, Duration::from_secs(120)).await,
        "the function never asked for invocation {polls}"
    );
    let cpu_before = cpu_time(pid);
    let started = Instant::now();
    let id = runtime.invoke(scheduled(), Duration::from_secs(120));
    let mut changes = Vec::new();
    if let Some(ready) = ready {
        for g in 0..CHANGED {
            let at_offset = FIRST_CHANGE + CHANGE_GAP * u32::try_from(g).unwrap_or(0);
            tokio::time::sleep_until((started + at_offset).into()).await;
            let at = Instant::now();
            w.emulator
                .store()
                .update_pod("shop", &format!("svc{g}-0"), |p| {
                    set_condition(p, "Ready", ready);
                    set_condition(p, "ContainersReady", ready);
                });
            changes.push((g, at));
        }
    }
    let answer = runtime.answer(&id, Duration::from_secs(120)).await;
    assert!(answer.is_some(), "invocation {polls} never answered");
    let op = if ready == Some(true) {
        "RegisterTargets"
    } else {
        "DeregisterTargets"
    };
    let records = proxy.records();
    let mut out = Invocation {
        during_diff: Vec::new(),
        steady: Vec::new(),
        missed: 0,
        cpu: cpu_time(pid).saturating_sub(cpu_before),
    };
    for (g, at) in changes {
        match call_for(&records, &format!("10.1.{g}.0"), op, at) {
            Some(call) if at - started < DURING_DIFF => out.during_diff.push(call - at),
            Some(call) => out.steady.push(call - at),
            None => out.missed += 1,
        }
    }
    out
}

/// What one run of one size measured.
struct Run {
    init: Duration,
    registered: Option<Duration>,
    cold_cpu: Duration,
    during: Vec<Duration>,
    steady: Vec<Duration>,
    missed: usize,
    warm_cpu: Vec<Duration>,
    throttled: (u64, Duration),
}

async fn run(mb: &str, bin: &str) -> Run {
    let w = World::new().await;
    for g in 0..GROUPS {
        w.group("shop", &format!("app=svc{g}"), 8080, &[]).await;
    }
    for g in 0..GROUPS {
        for p in 0..PODS {
            w.put_pod(pod(g, p).build());
        }
    }
    let proxy = proxy(None).await;
    let runtime = RuntimeApi::start().await;
    let mut base = w.function(bin, "tgsync-resync", runtime.address(), proxy.url());
    base.env("TGSYNC_WATCH_SECONDS", WATCH_SECONDS.to_string())
        .env("AWS_LAMBDA_LOG_LEVEL", "WARN")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", common::memory_size(mb));
    // The cgroup outlives earlier runs: its counters are read as a difference.
    let throttled_before = throttled(mb);
    let spawned = Instant::now();
    let child = under_share(mb, &base).spawn().expect("function starts");
    let pid = child.id();
    let _function = Reaper(child);
    assert!(runtime.polled(1, Duration::from_secs(60)).await, "no init");
    let init = spawned.elapsed();

    // 1. Cold: everything is registered.
    let cold = invocation(&w, &runtime, &proxy, pid, 1, None).await;
    let registered = proxy
        .records()
        .iter()
        .filter(|r| r.operation == "RegisterTargets")
        .map(|r| r.at)
        .max()
        .map(|last| last.saturating_duration_since(spawned + init));
    // 2 and 3. Warm: pods leave, then come back.
    let left = invocation(&w, &runtime, &proxy, pid, 2, Some(false)).await;
    let back = invocation(&w, &runtime, &proxy, pid, 3, Some(true)).await;
    let ((n1, t1), (n0, t0)) = (throttled(mb), throttled_before);
    Run {
        init,
        registered,
        cold_cpu: cold.cpu,
        during: [left.during_diff, back.during_diff].concat(),
        steady: [left.steady, back.steady].concat(),
        missed: left.missed + back.missed,
        warm_cpu: vec![left.cpu, back.cpu],
        throttled: (n1.saturating_sub(n0), t1.saturating_sub(t0)),
    }
}

/// The median of `v` (the upper one of an even count; the default for none).
fn median<T: Ord + Copy + Default>(mut v: Vec<T>) -> T {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

async fn size(mb: &str, runs: usize, bins: &[String]) {
    // Runs of the binaries alternate, so a drift over the sitting (moto holds the
    // groups of every earlier run) weighs on each alike.
    let mut by_bin: Vec<Vec<Run>> = bins.iter().map(|_| Vec::with_capacity(runs)).collect();
    for _ in 0..runs {
        for (bin, out) in bins.iter().zip(&mut by_bin) {
            out.push(run(mb, bin).await);
        }
    }
    for (bin, all_runs) in bins.iter().zip(by_bin) {
        report(mb, bin, &all_runs);
    }
}

fn report(mb: &str, bin: &str, all_runs: &[Run]) {
    let runs = all_runs.len();
    let pooled = |f: fn(&Run) -> &Vec<Duration>| {
        let mut v: Vec<Duration> = all_runs.iter().flat_map(|r| f(r).iter().copied()).collect();
        v.sort();
        v
    };
    let during = pooled(|r| &r.during);
    let steady = pooled(|r| &r.steady);
    let mut all: Vec<Duration> = during.iter().chain(&steady).copied().collect();
    all.sort();
    let line = |what: &str, s: &[Duration]| {
        println!(
            "  {what:<28} n={:<3} p50 {:>5.0} ms  p99 {:>5.0} ms  max {:>5.0} ms",
            s.len(),
            ms(pct(s, 0.5)),
            ms(pct(s, 0.99)),
            ms(s.last().copied().unwrap_or_default()),
        );
    };
    let of = |f: fn(&Run) -> Duration| median(all_runs.iter().map(f).collect());
    println!("{mb} MB, {bin} ({runs} runs; medians over the runs, reactions pooled):");
    println!(
        "  init (spawn -> first Runtime API poll) {:.0} ms; cold invocation: the 1,000 targets registered {:.1} s after invoke, CPU {:.2} s",
        ms(of(|r| r.init)),
        of(|r| r.registered.unwrap_or(Duration::MAX)).as_secs_f64(),
        of(|r| r.cold_cpu).as_secs_f64(),
    );
    line("reaction, first 10 s", &during);
    line("reaction, after", &steady);
    line("reaction, all", &all);
    println!(
        "  not applied: {}; warm invocation ({WATCH_SECONDS} s): CPU {:.2} s; quota throttled {} periods ({:.1} s) per run",
        all_runs.iter().map(|r| r.missed).sum::<usize>(),
        median(
            all_runs
                .iter()
                .flat_map(|r| r.warm_cpu.iter().copied())
                .collect()
        )
        .as_secs_f64(),
        median(all_runs.iter().map(|r| r.throttled.0).collect()),
        of(|r| r.throttled.1).as_secs_f64(),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    tgsync::app::install_crypto_provider();
    let sizes =
        std::env::var("TGSYNC_CPU_SHARE_SIZES").unwrap_or_else(|_| "full,512,256,128".into());
    let runs = env_or("TGSYNC_CPU_SHARE_RUNS", 3usize).max(1);
    // `TGSYNC_RESYNC_BIN`: other builds of the function, comma-separated (a before/after
    // in one sitting).
    let bins: Vec<String> = std::env::var("TGSYNC_RESYNC_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_tgsync-resync").to_owned())
        .split(',')
        .map(|b| b.trim().to_owned())
        .filter(|b| !b.is_empty())
        .collect();
    for mb in sizes.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        size(mb, runs, &bins).await;
    }
}
