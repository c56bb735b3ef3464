//! Benchmark (not a test): scheduled resyncs of 20 bound groups × 10 ready pods while a
//! proxy in front of moto answers 40 % of the ELBv2 and DynamoDB requests with
//! throttling and 10 % with HTTP 500 (half of those after moto applied the call, its
//! answer lost), with the services' real error bodies; mutations held to 5/s burst 5,
//! Describe calls to 8/s evenly spaced.
//!
//! Run: `cargo bench --locked --bench throttling` (moto from `TGSYNC_TEST_AWS_ENDPOINT`,
//! or started by `tests/support/moto.rs`); `TGSYNC_TRIALS` (default 20) trials with
//! seeds from `TGSYNC_CHAOS_SEED` on. Per trial: the runs it takes to converge (the
//! manual clock is moved past the product's backoff between runs, standing in for the
//! minute between scheduled runs), the largest 1-s and 5-s windows of Describe and of
//! mutating requests as the proxy saw them (every attempt, retries included), and the
//! longest streak of runs any group was reported `leaseHeld`.

#[path = "../tests/support/chaos_proxy.rs"]
mod chaos_proxy;
#[path = "../tests/support/moto.rs"]
mod moto;
#[path = "../tests/support/world.rs"]
mod world;

use std::collections::BTreeMap;
use std::time::Duration;

use chaos_proxy::{
    Chaos, Fleet, Mix, Service, describe_rate, is_describe, max_in_window, mutation_times, times_of,
};
use tgsync::aws::MutationRate;

const GROUPS: usize = 20;
const PODS: usize = 10;
const MAX_RUNS: usize = 10;
const THROTTLE_SHARE: f64 = 0.40;
const ERROR_SHARE: f64 = 0.10;
const AFTER_APPLY: f64 = 0.5;
/// Seed of the fault decisions unless `TGSYNC_CHAOS_SEED` names another.
const DEFAULT_SEED: u64 = 20_261_121;
const RATE: u32 = 5;
const BURST: u32 = 5;

/// What one trial came to.
struct Trial {
    seed: u64,
    runs: Option<usize>,
    describe_1s: usize,
    describe_5s: usize,
    mutation_1s: usize,
    mutation_5s: usize,
    lease_held_runs: usize,
    foreign_lost: usize,
    requests: usize,
    faulted: usize,
}

/// One trial: a fresh fleet, the fault mix, scheduled runs until it converges.
async fn trial(seed: u64, rate: MutationRate, mix: Mix, verbose: bool) -> Trial {
    let chaos = Chaos {
        fault_share: 0.0,
        seed,
    };
    let fleet = Fleet::build(GROUPS, PODS, chaos, rate).await;
    fleet.proxy.set_mix(mix);
    let mut converged = None;
    let mut foreign_lost = 0;
    // Consecutive runs each group was reported leaseHeld, and the longest such streak.
    let mut streaks: BTreeMap<String, usize> = BTreeMap::new();
    let mut longest = 0;
    for run in 1..=MAX_RUNS {
        let report = fleet.world.resync().await;
        for g in &report.groups {
            let streak = streaks.entry(g.target_group_arn.clone()).or_default();
            if g.outcome == tgsync::report::Outcome::LeaseHeld {
                *streak += 1;
                longest = longest.max(*streak);
            } else {
                *streak = 0;
            }
        }
        if verbose {
            let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
            for g in &report.groups {
                *outcomes.entry(format!("{:?}", g.outcome)).or_default() += 1;
            }
            println!("  seed {seed} run {run}: outcomes {outcomes:?}");
            for g in report.groups.iter().filter(|g| g.error.is_some()) {
                println!(
                    "    {:?} {}: {}",
                    g.outcome,
                    g.name,
                    g.error.as_deref().unwrap_or_default()
                );
                for f in &g.failed_targets {
                    println!("      {} {}: {}", f.operation, f.target, f.error);
                }
            }
        }
        let check = fleet.check().await;
        foreign_lost += check.foreign_lost.len();
        if check.diverged.is_empty() {
            converged = Some(run);
            break;
        }
        fleet.advance_past_backoff(&report);
    }
    let records = fleet.proxy.records();
    let describes = times_of(&records, is_describe, false);
    let mutations = mutation_times(&records, false);
    Trial {
        seed,
        runs: converged,
        describe_1s: max_in_window(&describes, Duration::from_secs(1)),
        describe_5s: max_in_window(&describes, Duration::from_secs(5)),
        mutation_1s: max_in_window(&mutations, Duration::from_secs(1)),
        mutation_5s: max_in_window(&mutations, Duration::from_secs(5)),
        lease_held_runs: longest,
        foreign_lost,
        requests: records
            .iter()
            .filter(|r| r.service != Service::Other)
            .count(),
        faulted: records.iter().filter(|r| r.fate.injected()).count(),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rate = MutationRate::new(RATE, Some(BURST)).expect("valid rate");
    let describes = describe_rate();
    let trials: u64 = std::env::var("TGSYNC_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let base = std::env::var("TGSYNC_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    let mix = Mix {
        throttle: THROTTLE_SHARE,
        error: ERROR_SHARE,
        after_apply: AFTER_APPLY,
    };
    println!(
        "{trials} trials of {GROUPS} groups x {PODS} pods; faults on ELBv2 and DynamoDB: {:.0} % throttling, \
         {:.0} % HTTP 500 (half of them after the call was applied); mutations {RATE}/s burst {BURST}, \
         Describe calls {}/s burst {}; at most {MAX_RUNS} runs per trial\n",
        THROTTLE_SHARE * 100.0,
        ERROR_SHARE * 100.0,
        describes.per_second(),
        describes.burst()
    );
    println!(
        "| seed | runs to converge | Describe max 1 s / 5 s | mutations max 1 s / 5 s | longest leaseHeld (runs) | requests (faulted) |"
    );
    println!("|---|---|---|---|---|---|");
    let verbose = std::env::var_os("TGSYNC_VERBOSE").is_some();
    let mut all = Vec::new();
    for n in 0..trials {
        let t = trial(base + n, rate, mix, verbose).await;
        println!(
            "| {} | {} | {} / {} | {} / {} | {} | {} ({}) |",
            t.seed,
            t.runs
                .map_or_else(|| format!("not within {MAX_RUNS}"), |r| r.to_string()),
            t.describe_1s,
            t.describe_5s,
            t.mutation_1s,
            t.mutation_5s,
            t.lease_held_runs,
            t.requests,
            t.faulted
        );
        all.push(t);
    }
    let worst_runs = all
        .iter()
        .map(|t| t.runs.unwrap_or(usize::MAX))
        .max()
        .unwrap_or(0);
    println!(
        "\nsummary: runs to converge max {} (trials within 3 runs: {}/{}); Describe largest 1 s window {} (5 s: {}) \
         against {}/s; mutations largest 1 s window {} (5 s: {}) against {RATE}/s burst {BURST}; \
         longest leaseHeld streak {} run(s); foreign targets removed {}",
        if worst_runs == usize::MAX {
            format!("> {MAX_RUNS}")
        } else {
            worst_runs.to_string()
        },
        all.iter()
            .filter(|t| t.runs.is_some_and(|r| r <= 3))
            .count(),
        all.len(),
        all.iter().map(|t| t.describe_1s).max().unwrap_or(0),
        all.iter().map(|t| t.describe_5s).max().unwrap_or(0),
        describes.per_second(),
        all.iter().map(|t| t.mutation_1s).max().unwrap_or(0),
        all.iter().map(|t| t.mutation_5s).max().unwrap_or(0),
        all.iter().map(|t| t.lease_held_runs).max().unwrap_or(0),
        all.iter().map(|t| t.foreign_lost).sum::<usize>(),
    );
}
