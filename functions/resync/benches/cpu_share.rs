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
//! Per size, a new world of 20 groups × 50 realistic pods (~4.5 KB of JSON each; at most
//! 100 groups per namespace; `TGSYNC_CPU_SHARE_GROUPS` / `TGSYNC_CPU_SHARE_PODS` change
//! the size) and one container serving scheduled invocations, each watching for 30 s:
//! 1. cold: the container's first invocation LISTs every pod and registers the targets;
//!    while an invocation still registers, the next one continues (at 1,000 groups ×
//!    100 pods that took 12 with the whole budget, 44 with the template's resync share,
//!    `TGSYNC_BUDGET_SHARE=0.5`). Reported: invoke → the last
//!    RegisterTargets, how many groups got one, and how many invocations it took;
//! 2. warm: 15 pods (one per group) turn NotReady, one every 2 s from 0.5 s after the
//!    invocation starts, while the invocation's full diff (the verification of every
//!    group) runs in its first seconds;
//! 3. warm: the same 15 pods turn Ready again, same timing;
//! 4. a fresh container (Lambda replaced the warm one) on the world the cold phase left: its first
//!    invocation LISTs every pod, and the same 15 pods turn NotReady, same timing.
//!
//! Reaction is the time from the change in the API server (its write committed) to the
//! arrival at ELBv2 of the DeregisterTargets / RegisterTargets call that applies it,
//! split into changes made in an invocation's first 10 s (while its full diff runs) and
//! after. Also shown:
//! the function's CPU time per invocation and how often the quota throttled it, how
//! long the emulators took to answer the warm invocations' AWS requests, and the warm
//! reactions less the time they waited for those answers (moto, a Python server, does
//! its work one request at a time under its interpreter lock; when the full diff keeps
//! it busy, a reaction's five sequential requests queue behind the full diff's).
//! `TGSYNC_CPU_SHARE_TRACE=1` prints every change's requests with their answer times.

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

use common::{pct, proxy, record_for, scheduled};
use cpu_share::{cpu_time, throttled, under_share};
use futures::StreamExt;
use measure::{Reaper, env_or, ms};
use runtime_api::RuntimeApi;
use tgsync::testkit::{PodBuilder, set_condition};
use world::World;

/// Groups per namespace, as in the scale bench.
const GROUPS_PER_NAMESPACE: usize = 100;
const CHANGED: usize = 15;
const CHANGE_GAP: Duration = Duration::from_secs(2);
const FIRST_CHANGE: Duration = Duration::from_millis(500);
const DURING_DIFF: Duration = Duration::from_secs(10);
const WATCH_SECONDS: u64 = 30;

/// The world's size: groups, and ready pods per group.
#[derive(Clone, Copy)]
struct Size {
    groups: usize,
    pods: usize,
}

fn namespace(g: usize) -> String {
    format!("shop{}", g / GROUPS_PER_NAMESPACE)
}

/// Pod `p` of group `g`'s IP: unique for up to 64,000 groups of up to 250 pods.
fn ip(g: usize, p: usize) -> String {
    format!("10.{}.{}.{p}", 1 + g / 256, g % 256)
}

fn pod(g: usize, p: usize) -> PodBuilder {
    PodBuilder::new(&namespace(g), &format!("svc{g}-{p}"))
        .label("app", &format!("svc{g}"))
        .ip(&ip(g, p))
        .realistic()
}

struct Invocation {
    during_diff: Vec<Duration>,
    steady: Vec<Duration>,
    missed: usize,
    cpu: Duration,
    /// RegisterTargets calls the invocation made.
    registrations: usize,
    /// How long the emulators took to answer the invocation's AWS requests: p50 and
    /// p90 (arrival at the proxy → answer written back). When these are long, the
    /// reactions measure the emulators' queue, not the function.
    answered: (Duration, Duration),
    /// Each reaction less the time it waited for the emulators' answers.
    own: Vec<Duration>,
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
    let before = proxy.records().len();
    let id = runtime.invoke(scheduled(), Duration::from_secs(120));
    let mut changes = Vec::new();
    if let Some(ready) = ready {
        for g in 0..CHANGED {
            let at_offset = FIRST_CHANGE + CHANGE_GAP * u32::try_from(g).unwrap_or(0);
            tokio::time::sleep_until((started + at_offset).into()).await;
            let writing = Instant::now();
            w.emulator
                .store()
                .update_pod(&namespace(g), &format!("svc{g}-0"), |p| {
                    set_condition(p, "Ready", ready);
                    set_condition(p, "ContainersReady", ready);
                });
            // The change happens when the API server has committed it: the emulator's
            // write copies its whole store first (22–100 ms at 100,000 pods), which an API
            // server's write to etcd does not.
            let at = Instant::now();
            if std::env::var_os("TGSYNC_CPU_SHARE_TRACE").is_some() {
                println!(
                    "  change {}: the emulator's write took {:.0} ms",
                    ip(g, 0),
                    ms(at - writing)
                );
            }
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
    let mut answered: Vec<Duration> = records
        .iter()
        .skip(before)
        .filter(|r| r.service != chaos_proxy::Service::Other)
        .filter_map(|r| r.answered_after)
        .collect();
    answered.sort();
    let mut out = Invocation {
        answered: (pct(&answered, 0.5), pct(&answered, 0.9)),
        own: Vec::new(),
        during_diff: Vec::new(),
        steady: Vec::new(),
        missed: 0,
        cpu: cpu_time(pid).saturating_sub(cpu_before),
        registrations: records
            .iter()
            .skip(before)
            .filter(|r| r.operation == "RegisterTargets")
            .count(),
    };
    let trace = std::env::var_os("TGSYNC_CPU_SHARE_TRACE").is_some();
    for (g, at) in changes {
        let Some(chain) = chain(&records, &ip(g, 0), op, at) else {
            if trace {
                println!("  trace {}: not applied", ip(g, 0));
            }
            out.missed += 1;
            continue;
        };
        if trace {
            print_chain(&chain, &ip(g, 0), at, started);
        }
        let took = chain.applied - at;
        out.own.push(took.saturating_sub(chain.in_emulators()));
        if at - started < DURING_DIFF {
            out.during_diff.push(took);
        } else {
            out.steady.push(took);
        }
    }
    out
}

/// Where one reaction's time went: the requests on the changed pod's group from the
/// change to the call that applied it, and how many requests of any group arrived in
/// that window (the background the reaction shared the emulators with).
struct Chain<'a> {
    /// When the applying call arrived.
    applied: Instant,
    /// The group's requests, the applying call last.
    requests: Vec<&'a chaos_proxy::Record>,
    window: usize,
}

impl Chain<'_> {
    /// The part of the reaction spent waiting for the emulators' answers to the
    /// group's requests before the applying call. The rest is the function's own
    /// (the watch, its queue, pacing, CPU and the quota's waits).
    fn in_emulators(&self) -> Duration {
        let before_applying = self.requests.len().saturating_sub(1);
        self.requests[..before_applying]
            .iter()
            .filter_map(|r| r.answered_after)
            .sum()
    }
}

/// The chain of requests that applied the change of `ip` made at `at` (`op`: the call
/// that applies it).
fn chain<'a>(
    records: &'a [chaos_proxy::Record],
    ip: &str,
    op: &str,
    at: Instant,
) -> Option<Chain<'a>> {
    let applying = record_for(records, ip, op, at)?;
    let arn = group_arn(applying)?;
    // ELBv2's form bodies name the group in `TargetGroupArn`, or (DescribeTags, the
    // pass's tag re-read) in `ResourceArns.member.N`; DynamoDB's JSON has it in the
    // item's key. (A change's pass reads its item alone: a BatchGetItem naming the group
    // is the full diff's read-ahead.)
    let of_group = |r: &chaos_proxy::Record| match r.service {
        chaos_proxy::Service::Elbv2 => names_group(r, &arn),
        chaos_proxy::Service::DynamoDb => r.operation != "BatchGetItem" && r.body.contains(&arn),
        chaos_proxy::Service::Other => false,
    };
    let window: Vec<&chaos_proxy::Record> = records
        .iter()
        .filter(|r| r.at >= at && r.at <= applying.at)
        .collect();
    Some(Chain {
        applied: applying.at,
        window: window.len(),
        requests: window.into_iter().filter(|r| of_group(r)).collect(),
    })
}

/// The target group an ELBv2 request names (`TargetGroupArn=` of its form body).
fn group_arn(r: &chaos_proxy::Record) -> Option<String> {
    chaos_proxy::form_param(&r.body, "TargetGroupArn")
}

/// Whether an ELBv2 request names the group `arn` (`TargetGroupArn`, or one of the
/// `ResourceArns` a DescribeTags reads).
fn names_group(r: &chaos_proxy::Record, arn: &str) -> bool {
    group_arn(r).as_deref() == Some(arn)
        || r.body.split('&').any(|pair| {
            pair.split_once('=').is_some_and(|(k, v)| {
                k.starts_with("ResourceArns.member.") && chaos_proxy::percent_decode(v) == arn
            })
        })
}

/// `TGSYNC_CPU_SHARE_TRACE`: prints `chain` of a change made at `at`.
fn print_chain(chain: &Chain<'_>, ip: &str, at: Instant, started: Instant) {
    println!(
        "  trace {ip}: changed {:.0} ms into the invocation, applied {:.0} ms later ({:.0} ms of it waiting for the emulators); {} requests arrived meanwhile",
        ms(at - started),
        ms(chain.applied - at),
        ms(chain.in_emulators()),
        chain.window
    );
    for r in &chain.requests {
        println!(
            "    +{:>6.0} ms {:?} {} answered after {:.0} ms",
            ms(r.at - at),
            r.service,
            r.operation,
            r.answered_after.map(ms).unwrap_or(f64::NAN),
        );
    }
}

/// What one run of one size measured.
struct Run {
    init: Duration,
    registered: Option<Duration>,
    cold_invocations: usize,
    /// Groups the cold invocations registered targets in.
    groups_registered: usize,
    cold_cpu: Duration,
    /// The invocation after those: nothing to register, no pod change.
    quiet_cpu: Duration,
    during: Vec<Duration>,
    steady: Vec<Duration>,
    missed: usize,
    warm_cpu: Vec<Duration>,
    /// The emulators' answer time in the warm invocations (p50, p90 of each).
    warm_answered: Vec<(Duration, Duration)>,
    /// The warm reactions less their waits for the emulators' answers.
    own: Vec<Duration>,
    throttled: (u64, Duration),
    /// The function's peak resident set (`VmHWM`), bytes.
    peak_rss: u64,
    /// A fresh container's first invocation: reactions in its first 10 s and after.
    fresh: Vec<Duration>,
    fresh_after: Vec<Duration>,
    fresh_missed: usize,
    fresh_cpu: Duration,
    fresh_rss: u64,
}

/// A process's peak resident set size from `/proc/PID/status`, bytes (0 if unreadable).
fn peak_rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        })
        .unwrap_or(0)
}

/// Cold invocations at most, before the run gives up on registering everything: 40, and
/// one more per 20 groups (at the template's resync share the cold phase's
/// RegisterTargets go at about one a second, so 1,000 groups take ~35 invocations).
fn max_cold(groups: usize) -> usize {
    40 + groups / 20
}

async fn run(mb: &str, bin: &str, size: Size) -> Run {
    let w = World::new().await;
    // Concurrently: 1,000 groups one by one take moto minutes.
    futures::stream::iter(0..size.groups)
        .for_each_concurrent(16, |g| {
            let w = &w;
            async move {
                w.group(&namespace(g), &format!("app=svc{g}"), 8080, &[])
                    .await;
            }
        })
        .await;
    // One write (pod by pod, the store copies its whole map per pod).
    w.emulator
        .store()
        .put_pods((0..size.groups).flat_map(|g| (0..size.pods).map(move |p| pod(g, p).build())))
        .expect("pods stored");
    let proxy = proxy(None).await;
    let container = |runtime: &RuntimeApi| {
        let mut base = w.function(bin, "tgsync-resync", runtime.address(), proxy.url());
        base.env("TGSYNC_WATCH_SECONDS", WATCH_SECONDS.to_string())
            .env("AWS_LAMBDA_LOG_LEVEL", "WARN")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", common::memory_size(mb));
        let child = under_share(mb, &base).spawn().expect("function starts");
        (child.id(), Reaper(child))
    };
    let runtime = RuntimeApi::start().await;
    // The cgroup outlives earlier runs: its counters are read as a difference.
    let throttled_before = throttled(mb);
    let spawned = Instant::now();
    let (pid, function) = container(&runtime);
    assert!(runtime.polled(1, Duration::from_secs(60)).await, "no init");
    let init = spawned.elapsed();

    // 1. Cold: invocations until one registers nothing more.
    let mut polls = 0;
    let mut cold_cpu = Duration::ZERO;
    let quiet_cpu;
    loop {
        polls += 1;
        let cold = invocation(&w, &runtime, &proxy, pid, polls, None).await;
        if cold.registrations == 0 {
            quiet_cpu = cold.cpu;
            break;
        }
        cold_cpu += cold.cpu;
        let most = max_cold(size.groups);
        assert!(polls < most, "still registering after {most} invocations");
    }
    let records = proxy.records();
    let registrations = || records.iter().filter(|r| r.operation == "RegisterTargets");
    let registered = registrations()
        .map(|r| r.at)
        .max()
        .map(|last| last.saturating_duration_since(spawned + init));
    // Groups that got a RegisterTargets at all (`TargetGroupArn=` of the form body).
    let groups_registered = registrations()
        .filter_map(group_arn)
        .collect::<std::collections::HashSet<_>>()
        .len();
    if groups_registered < size.groups {
        eprintln!(
            "warning: the cold phase ended with {groups_registered} of {} groups registered; the warm phases run on that world",
            size.groups
        );
    }
    // 2 and 3. Warm: pods leave, then come back.
    let left = invocation(&w, &runtime, &proxy, pid, polls + 1, Some(false)).await;
    let back = invocation(&w, &runtime, &proxy, pid, polls + 2, Some(true)).await;
    let ((n1, t1), (n0, t0)) = (throttled(mb), throttled_before);
    let warm_rss = peak_rss(pid);
    drop(function);
    // 4. Lambda replaced the container: a fresh one on the converged world LISTs every
    // pod before its store can react. The same pods leave again.
    let runtime = RuntimeApi::start().await;
    let (pid, _function) = container(&runtime);
    assert!(runtime.polled(1, Duration::from_secs(60)).await, "no init");
    let fresh = invocation(&w, &runtime, &proxy, pid, 1, Some(false)).await;
    Run {
        init,
        registered,
        cold_invocations: polls - 1,
        groups_registered,
        cold_cpu,
        quiet_cpu,
        during: [left.during_diff, back.during_diff].concat(),
        steady: [left.steady, back.steady].concat(),
        missed: left.missed + back.missed,
        warm_cpu: vec![left.cpu, back.cpu],
        warm_answered: vec![left.answered, back.answered],
        own: [left.own, back.own].concat(),
        throttled: (n1.saturating_sub(n0), t1.saturating_sub(t0)),
        peak_rss: warm_rss,
        fresh_rss: peak_rss(pid),
        fresh: fresh.during_diff,
        fresh_after: fresh.steady,
        fresh_missed: fresh.missed,
        fresh_cpu: fresh.cpu,
    }
}

/// The median of `v` (the upper one of an even count; the default for none).
fn median<T: Ord + Copy + Default>(mut v: Vec<T>) -> T {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

async fn size(mb: &str, runs: usize, bins: &[String], size: Size) {
    // Runs of the binaries alternate, so a drift over the sitting (moto holds the
    // groups of every earlier run) weighs on each alike.
    let mut by_bin: Vec<Vec<Run>> = bins.iter().map(|_| Vec::with_capacity(runs)).collect();
    for _ in 0..runs {
        for (bin, out) in bins.iter().zip(&mut by_bin) {
            out.push(run(mb, bin, size).await);
        }
    }
    for (bin, all_runs) in bins.iter().zip(by_bin) {
        report(mb, bin, &all_runs, size);
    }
}

fn report(mb: &str, bin: &str, all_runs: &[Run], size: Size) {
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
    println!(
        "{mb} MB, {bin}, {} groups x {} pods ({runs} runs; medians over the runs, reactions pooled):",
        size.groups, size.pods
    );
    println!(
        "  init (spawn -> first Runtime API poll) {:.0} ms; cold: {} of {} groups registered, the last {:.1} s after the first invoke, in {} invocation(s), CPU {:.2} s",
        ms(of(|r| r.init)),
        median(all_runs.iter().map(|r| r.groups_registered).collect()),
        size.groups,
        of(|r| r.registered.unwrap_or(Duration::MAX)).as_secs_f64(),
        median(all_runs.iter().map(|r| r.cold_invocations).collect()),
        of(|r| r.cold_cpu).as_secs_f64(),
    );
    println!(
        "  the next invocation (nothing to change): CPU {:.2} s; the function's peak RSS {:.0} MiB",
        of(|r| r.quiet_cpu).as_secs_f64(),
        median(all_runs.iter().map(|r| r.peak_rss).collect()) as f64 / (1024.0 * 1024.0),
    );
    line("reaction, first 10 s", &during);
    line("reaction, after", &steady);
    line("reaction, all", &all);
    line("  less the emulators' answers", &pooled(|r| &r.own));
    let answered = |f: fn(&(Duration, Duration)) -> Duration| {
        ms(median(
            all_runs
                .iter()
                .flat_map(|r| r.warm_answered.iter().map(f))
                .collect(),
        ))
    };
    println!(
        "  the emulators' answer time to the warm invocations' AWS requests: p50 {:.0} ms, p90 {:.0} ms (medians over the invocations)",
        answered(|a| a.0),
        answered(|a| a.1),
    );
    line("fresh container, first 10 s", &pooled(|r| &r.fresh));
    line("fresh container, after", &pooled(|r| &r.fresh_after));
    println!(
        "  fresh container: not applied {}, CPU of its first invocation {:.2} s, peak RSS {:.0} MiB",
        all_runs.iter().map(|r| r.fresh_missed).sum::<usize>(),
        of(|r| r.fresh_cpu).as_secs_f64(),
        median(all_runs.iter().map(|r| r.fresh_rss).collect()) as f64 / (1024.0 * 1024.0),
    );
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
    let world = Size {
        groups: env_or("TGSYNC_CPU_SHARE_GROUPS", 20usize).max(CHANGED),
        pods: env_or("TGSYNC_CPU_SHARE_PODS", 50usize).clamp(1, 250),
    };
    for mb in sizes.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        size(mb, runs, &bins, world).await;
    }
}
