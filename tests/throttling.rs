//! Throttling and 5xx from ELBv2 and DynamoDB: the production adapters behind a proxy
//! that answers 30 % of their calls itself (half throttling, half HTTP 500, with the
//! services' real error bodies), against moto's server and the Kubernetes API emulator.
//!
//! Behaviour only, never wall-clock time: the fleet converges within three scheduled
//! runs (the world's manual clock is moved past the product's own backoff between runs,
//! standing in for the minute between them), no foreign target is touched, the ledger
//! matches the targets; and every RegisterTargets / DeregisterTargets attempt that left
//! the client (the proxy's log, faulted ones included) stays within the client-side
//! token bucket's bound.

#[path = "support/chaos_proxy.rs"]
mod chaos_proxy;
#[path = "support/moto.rs"]
mod moto;
#[path = "support/world.rs"]
mod world;

use std::time::Duration;

use chaos_proxy::{
    Chaos, Fate, Fleet, Record, Service, call_ends, describe_rate, is_describe, is_mutation,
    max_in_window, mutation_times, tally, times_of, worst_excess,
};
use tgsync::aws::MutationRate;
use tgsync::report::Outcome;

const GROUPS: usize = 20;
const PODS: usize = 10;
const MAX_RUNS: usize = 3;
const CHAOS: Chaos = Chaos {
    fault_share: 0.30,
    seed: 20_261_121,
};

/// Transit jitter allowed between the client's limiter handing out a permit and the
/// proxy reading the request (signing, connection pool, a loaded 2-core machine). It
/// only widens the bound; at 5/s it is worth half a call.
const TRANSIT_SLACK: Duration = Duration::from_millis(100);

/// The production default: 5 mutations per second, burst 5.
fn rate() -> MutationRate {
    MutationRate::default()
}

/// Prints what a run did: requests and faults, outcomes, and for groups that failed or
/// found their lease held, why (with the group's lease calls as the proxy saw them).
fn print_run(run: usize, report: &tgsync::report::Report, records: &[Record], before: usize) {
    let new = &records[before..];
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for g in &report.groups {
        *outcomes.entry(format!("{:?}", g.outcome)).or_default() += 1;
    }
    println!(
        "run {run}: {} requests, {} answered with a fault; outcomes {outcomes:?}; errors {:?}",
        new.len(),
        new.iter().filter(|r| r.fate.injected()).count(),
        report.errors
    );
    for g in &report.groups {
        if g.outcome == Outcome::Failed {
            println!("  failed {}: {}", g.name, g.error.as_deref().unwrap_or(""));
            for f in &g.failed_targets {
                println!("    {} {}: {}", f.operation, f.target, f.error);
            }
        }
        let lease_trouble = g.outcome == Outcome::LeaseHeld
            || g.error.as_deref().is_some_and(|e| e.contains("lease"));
        if lease_trouble {
            println!("  lease calls of {} so far:", g.name);
            for r in records.iter().filter(|r| {
                r.service == Service::DynamoDb
                    && r.body.contains(&g.target_group_arn)
                    && r.body.contains("lease")
            }) {
                println!(
                    "    {} attempt {:?}: {:?}, status {:?} after {:?}, delivered {}",
                    r.operation, r.attempt, r.fate, r.status, r.answered_after, r.delivered
                );
            }
        }
    }
}

/// Runs resync until the fleet matches its goal (at most `MAX_RUNS`), checking after
/// every run that no foreign target was removed and no wanted target deregistered.
/// Returns the number of runs it took, or the divergence left after `MAX_RUNS`.
async fn converge(fleet: &Fleet) -> Result<usize, Vec<String>> {
    for run in 1..=MAX_RUNS {
        let before = fleet.proxy.records().len();
        let report = fleet.world.resync().await;
        print_run(run, &report, &fleet.proxy.records(), before);
        // Only stale targets are ever deregistered.
        for g in &report.groups {
            let fg = fleet
                .groups
                .iter()
                .find(|fg| fg.arn == g.target_group_arn)
                .expect("only fleet groups are bound");
            for t in &g.deregistered {
                assert!(
                    fg.stale.contains(&t.to_string()),
                    "run {run} deregistered {t} from {}, which is not stale",
                    g.name
                );
            }
        }
        let check = fleet.check().await;
        assert!(
            check.foreign_lost.is_empty(),
            "run {run} removed foreign targets: {:?}",
            check.foreign_lost
        );
        if check.diverged.is_empty() {
            return Ok(run);
        }
        if run == MAX_RUNS {
            return Err(check.diverged);
        }
        fleet.advance_past_backoff(&report);
    }
    unreachable!("the loop returns")
}

fn print_tally(records: &[Record]) {
    for ((service, op), [fwd, thr, err]) in tally(records) {
        if service != Service::Other {
            println!("  {service}:{op}: {fwd} forwarded, {thr} throttled, {err} 500");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_converges_within_three_runs_with_30_percent_faults() {
    let fleet = Fleet::build(GROUPS, PODS, CHAOS, rate()).await;
    let runs = converge(&fleet).await;
    let records = fleet.proxy.records();
    print_tally(&records);
    println!(
        "  calls: {:?}",
        call_ends(&records, tgsync::aws::MAX_ATTEMPTS)
    );
    let runs = runs.unwrap_or_else(|diverged| {
        panic!(
            "not converged after {MAX_RUNS} runs:\n{}",
            diverged.join("\n")
        )
    });
    println!("converged after {runs} run(s) of resync");

    // The faults really hit both services, both kinds, and the mutations.
    for service in [Service::Elbv2, Service::DynamoDb] {
        for fate in [Fate::Throttled, Fate::ServerError] {
            assert!(
                records
                    .iter()
                    .any(|r| r.service == service && r.fate == fate),
                "no {fate:?} injected for {service}"
            );
        }
    }
    assert!(
        records.iter().any(|r| is_mutation(r) && r.fate.injected()),
        "no RegisterTargets/DeregisterTargets attempt was faulted"
    );
}

/// Every ELBv2 Describe attempt — first tries and retries alike — waits for the
/// client-side bucket (8/s, burst 8): the SDK's own retries would not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_describe_attempt_stays_within_the_client_rate_limit() {
    let rate = describe_rate();
    let fleet = Fleet::build(GROUPS, PODS, CHAOS, self::rate()).await;
    let _ = converge(&fleet).await;
    let records = fleet.proxy.records();
    let times = times_of(&records, is_describe, false);
    let faulted = records
        .iter()
        .filter(|r| is_describe(r) && r.fate.injected())
        .count();
    println!(
        "{} Describe attempts ({faulted} faulted); largest 1-s window {}, 5-s window {}, against {}/s burst {}",
        times.len(),
        max_in_window(&times, Duration::from_secs(1)),
        max_in_window(&times, Duration::from_secs(5)),
        rate.per_second(),
        rate.burst()
    );
    assert!(faulted > 0, "no Describe attempt was faulted");
    let (per_second, burst) = (f64::from(rate.per_second()), f64::from(rate.burst()));
    if let Some(excess) = worst_excess(&times, per_second, burst, TRANSIT_SLACK) {
        panic!(
            "{} Describe attempts left the client within {:?} (starting {:?} after the first); \
             a bucket of {}/s burst {} allows {:.1} there",
            excess.count,
            excess.length,
            excess.from,
            rate.per_second(),
            rate.burst(),
            excess.allowed
        );
    }
    // Every attempt is a first attempt to the SDK: tgsync retries, through the bucket.
    assert!(
        records
            .iter()
            .filter(|r| r.service == Service::Elbv2)
            .all(|r| r.attempt.is_none_or(|a| a <= 1)),
        "the SDK retried an ELBv2 call on its own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mutation_attempt_stays_within_the_client_rate_limit() {
    let rate = rate();
    let fleet = Fleet::build(GROUPS, PODS, CHAOS, rate).await;
    let _ = converge(&fleet).await;
    let records = fleet.proxy.records();
    println!(
        "  calls: {:?}",
        call_ends(&records, tgsync::aws::MAX_ATTEMPTS)
    );
    let attempts: Vec<&Record> = records.iter().filter(|r| is_mutation(r)).collect();
    let times = mutation_times(&records, false);
    let first_tries = mutation_times(&records, true);
    let retries = times.len() - first_tries.len();
    let (per_second, burst) = (f64::from(rate.per_second()), f64::from(rate.burst()));
    println!(
        "{} RegisterTargets/DeregisterTargets attempts ({} faulted, {retries} SDK retries) against {}/s burst {}",
        attempts.len(),
        attempts.iter().filter(|r| r.fate.injected()).count(),
        rate.per_second(),
        rate.burst()
    );
    assert!(
        attempts.len() > rate.burst() as usize,
        "too few mutations to test the limit"
    );
    if let Some(excess) = worst_excess(&times, per_second, burst, TRANSIT_SLACK) {
        let first = worst_excess(&first_tries, per_second, burst, TRANSIT_SLACK);
        panic!(
            "{} mutation attempts left the client within {:?} (starting {:?} after the first); \
             a bucket of {}/s burst {} allows {:.1} there (with {TRANSIT_SLACK:?} transit slack). \
             First attempts alone (the calls that waited on the limiter): {}. \
             SDK retries (attempt >= 2) among the attempts: {retries}.",
            excess.count,
            excess.length,
            excess.from,
            rate.per_second(),
            rate.burst(),
            excess.allowed,
            match first {
                None => "within the bound".to_owned(),
                Some(e) => format!(
                    "{} within {:?}, over the bound too ({:.1})",
                    e.count, e.length, e.allowed
                ),
            },
        );
    }
}

/// The SDK's standard retries draw on a quota per service and region that a throttling
/// storm empties (5 tokens a retry out of 500, 1 back per success) and that outlives the
/// storm, shared by every client of the process: from then on a call gives up at its
/// first fault. tgsync paces and bounds its attempts itself, so after a storm of 150
/// throttled retries a call that meets one fault must still be retried and succeed.
#[tokio::test(flavor = "multi_thread")]
async fn a_throttling_storm_leaves_later_calls_their_retries() {
    use chaos_proxy::{ChaosProxy, Mix};
    use tgsync::aws::DynamoState;
    use tgsync::state::StateStore;

    let w = world::World::new().await;
    let proxy = ChaosProxy::transparent().await;
    let sdk = chaos_proxy::sdk_config(&proxy).await;
    let state = DynamoState::from_sdk_config(&sdk, w.table.as_str(), w.cluster.as_str());
    let group = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/storm/0";
    // The storm: every DynamoDB request throttled; each of these reads gives up after
    // all its attempts.
    proxy.set_mix(Mix {
        throttle: 1.0,
        error: 0.0,
        after_apply: 0.0,
    });
    let storm = futures::future::join_all((0..25).map(|_| state.load(group))).await;
    assert!(
        storm.iter().all(Result::is_err),
        "every read in the storm failed"
    );
    let retries = proxy
        .records()
        .iter()
        .filter(|r| r.service == Service::DynamoDb && r.attempt.is_some_and(|a| a > 1))
        .count();
    assert!(
        retries >= 100,
        "the storm must be large enough to empty the SDK's default retry quota (500 tokens, 5 a retry): {retries} retries"
    );
    // After it: one read whose first answer is lost to a 500.
    proxy.set_mix(Mix {
        throttle: 0.0,
        error: 0.0,
        after_apply: 0.0,
    });
    proxy.set_rules(|r| r.lose_answer = vec![("GetItem".into(), String::new())]);
    let before = proxy.records().len();
    let read = state.load(group).await;
    let after: Vec<(String, Fate)> = proxy.records()[before..]
        .iter()
        .map(|r| (r.operation.clone(), r.fate))
        .collect();
    assert!(
        read.is_ok(),
        "the read is retried after the storm: {read:?} ({after:?})"
    );
    assert_eq!(
        after[..2],
        [
            ("GetItem".to_owned(), Fate::AnswerLost),
            ("GetItem".to_owned(), Fate::Forwarded)
        ],
        "one lost answer, then the retry"
    );
}
