//! Benchmark (not a test): resync of 50 bound groups × 20 ready pods while a proxy in
//! front of moto answers 30 % of the ELBv2 and DynamoDB calls itself (half throttling,
//! half HTTP 500, with the services' real error bodies), mutations held to 5/s burst 5.
//!
//! Run: `cargo bench --locked --bench throttling` (moto from `TGSYNC_TEST_AWS_ENDPOINT`,
//! or started by `tests/support/moto.rs`). Reports the runs it takes to converge (the
//! manual clock is moved past the product's backoff between runs, standing in for the
//! minute between scheduled runs), the calls per operation (forwarded vs injected), and
//! the achieved rate and largest burst of RegisterTargets / DeregisterTargets attempts
//! as the proxy saw them, against the configured rate.

#[path = "../tests/support/chaos_proxy.rs"]
mod chaos_proxy;
#[path = "../tests/support/moto.rs"]
mod moto;
#[path = "../tests/support/world.rs"]
mod world;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chaos_proxy::{
    Chaos, Fleet, Record, Service, call_ends, is_mutation, max_in_window, mutation_times, tally,
    worst_excess,
};
use tgsync::aws::MutationRate;

const GROUPS: usize = 50;
const PODS: usize = 20;
const MAX_RUNS: usize = 10;
const FAULT_SHARE: f64 = 0.30;
/// Seed of the fault decisions unless `TGSYNC_CHAOS_SEED` names another.
const DEFAULT_SEED: u64 = 20_261_121;
const RATE: u32 = 5;
const BURST: u32 = 5;
/// Transit jitter allowed between the limiter and the proxy when checking the bound.
const TRANSIT_SLACK: Duration = Duration::from_millis(100);

/// Attempts per second over the busy period (first to last). A busy period under 1 s is
/// all burst, and a rate over it would read as an excess that is not there.
fn per_second(times: &[Instant]) -> String {
    match (times.first(), times.last()) {
        (Some(a), Some(b)) if *b - *a >= Duration::from_secs(1) => {
            format!("{:.2}/s", times.len() as f64 / (*b - *a).as_secs_f64())
        }
        _ => "all within one burst".to_owned(),
    }
}

/// The worst token-bucket excess of `times`, in words.
fn excess(times: &[Instant], slack: Duration) -> String {
    match worst_excess(times, f64::from(RATE), f64::from(BURST), slack) {
        None => "within burst + rate × window".to_owned(),
        Some(e) => format!(
            "{} in {:.0} ms > {:.1} allowed ({:.2}/s over that window)",
            e.count,
            e.length.as_secs_f64() * 1e3,
            e.allowed,
            e.count as f64 / e.length.as_secs_f64().max(1e-3)
        ),
    }
}

/// Mutation attempts of a slice of the log: count, faulted ones, busy period, attempts
/// per second over it, the most in any 1 s window, and the worst token-bucket excess.
/// Mutations run with the SDK's retries off and are retried by the adapter, which waits
/// on the limiter before every attempt, so every attempt is a first SDK attempt here.
fn mutation_stats(records: &[Record]) -> String {
    let all = mutation_times(records, false);
    if all.is_empty() {
        return "no mutation attempts".to_owned();
    }
    let faulted = records
        .iter()
        .filter(|r| is_mutation(r) && r.fate.injected())
        .count();
    let sdk_retries = all.len() - mutation_times(records, true).len();
    format!(
        "{} attempts ({faulted} faulted and retried by the adapter, {sdk_retries} SDK retries) over {:.2} s busy\n\
         \x20   {}, largest 1 s window {}, bound: {} (no transit slack: {})",
        all.len(),
        (all[all.len() - 1] - all[0]).as_secs_f64(),
        per_second(&all),
        max_in_window(&all, Duration::from_secs(1)),
        excess(&all, TRANSIT_SLACK),
        excess(&all, Duration::ZERO),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rate = MutationRate::new(RATE, Some(BURST)).expect("valid rate");
    let chaos = Chaos {
        fault_share: FAULT_SHARE,
        seed: std::env::var("TGSYNC_CHAOS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(DEFAULT_SEED),
    };
    let setup = Instant::now();
    let fleet = Fleet::build(GROUPS, PODS, chaos, rate).await;
    println!(
        "setup: {GROUPS} groups x {PODS} pods, {} foreign and {} stale targets, in {:.1} s",
        fleet.groups.iter().map(|g| g.foreign.len()).sum::<usize>(),
        fleet.groups.iter().map(|g| g.stale.len()).sum::<usize>(),
        setup.elapsed().as_secs_f64()
    );
    println!(
        "faults: {:.0} % of ELBv2 and DynamoDB requests (half Throttling 400, half 500), seed {}; \
         mutations limited to {RATE}/s burst {BURST}",
        chaos.fault_share * 100.0,
        chaos.seed
    );
    let mut converged = None;
    for run in 1..=MAX_RUNS {
        let mark = fleet.proxy.records().len();
        let started = Instant::now();
        let report = fleet.world.resync().await;
        let wall = started.elapsed();
        let records = fleet.proxy.records();
        let new = &records[mark..];
        let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
        for g in &report.groups {
            *outcomes.entry(format!("{:?}", g.outcome)).or_default() += 1;
        }
        println!(
            "run {run}: {:.1} s, {} requests ({} faulted), outcomes {outcomes:?}, run errors {:?}",
            wall.as_secs_f64(),
            new.len(),
            new.iter().filter(|r| r.fate.injected()).count(),
            report.errors
        );
        for g in report.groups.iter().filter(|g| g.error.is_some()) {
            println!(
                "  {:?} {}: {}",
                g.outcome,
                g.name,
                g.error.as_deref().unwrap_or("")
            );
        }
        println!("  mutations: {}", mutation_stats(new));
        let check = fleet.check().await;
        if !check.foreign_lost.is_empty() {
            println!("  FOREIGN TARGETS REMOVED: {:?}", check.foreign_lost);
        }
        if check.diverged.is_empty() {
            converged = Some(run);
            break;
        }
        println!("  {} group(s) not yet converged", check.diverged.len());
        fleet.advance_past_backoff(&report);
    }
    match converged {
        Some(runs) => println!("converged after {runs} run(s)"),
        None => println!("NOT converged after {MAX_RUNS} runs"),
    }

    let records = fleet.proxy.records();
    let elb = fleet.world.engine.groups.api_calls();
    let ddb = fleet.world.engine.state.api_calls();
    println!("\n| API | calls by tgsync | attempts seen | forwarded | throttled (400) | 500 |");
    println!("|---|---|---|---|---|---|");
    for ((service, op), [fwd, thr, err]) in tally(&records) {
        let logical = match service {
            Service::Elbv2 => elb.get(op.as_str()).map(u64::to_string),
            Service::DynamoDb => ddb.get(op.as_str()).map(u64::to_string),
            Service::Other => None,
        };
        println!(
            "| {service}:{op} | {} | {} | {fwd} | {thr} | {err} |",
            logical.unwrap_or_else(|| "–".to_owned()),
            fwd + thr + err
        );
    }
    let mut attempts: BTreeMap<u32, usize> = BTreeMap::new();
    for r in records.iter().filter(|r| r.service != Service::Other) {
        *attempts.entry(r.attempt.unwrap_or(0)).or_default() += 1;
    }
    println!("\nELBv2 + DynamoDB requests by SDK attempt number: {attempts:?}");
    // Mutation attempts are separate SDK calls (the adapter retries them), so how calls
    // ended is told for the other operations, whose retries are the SDK's.
    let others: Vec<Record> = records
        .iter()
        .filter(|r| !is_mutation(r))
        .cloned()
        .collect();
    let ends = call_ends(&others, tgsync::aws::MAX_ATTEMPTS);
    println!(
        "calls other than Register/DeregisterTargets: {} succeeded, {} answered with an error by moto, {} gave up after {} faulted attempts, \
         {} stopped retrying early {:?}, {} retried after moto answered {:?}",
        ends.succeeded,
        ends.moto_errors,
        ends.exhausted,
        tgsync::aws::MAX_ATTEMPTS,
        ends.stopped_early.len(),
        ends.stopped_early,
        ends.retried_after_forwarding.len(),
        ends.retried_after_forwarding,
    );
    println!("all runs, mutations: {}", mutation_stats(&records));
}
