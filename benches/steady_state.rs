//! Benchmark (not a test): DescribeTargetHealth calls per minute in the steady state, with
//! the checkpoint, for 1,000 bound groups on a 1-minute schedule, and how long external
//! drift (a target removed by hand) takes to be found. Counts, not timings: the engine
//! runs against the in-memory fakes with a manual clock, so an hour takes seconds.
//!
//! Run: `scripts/bench.sh steady-state` (`cargo bench --bench steady_state`).

use std::sync::Arc;

use tgsync::Engine;
use tgsync::clock::ManualClock;
use tgsync::core::{Target, UnixMillis};
use tgsync::fakes::{FakeElb, FakePods, FakeState};
use tgsync::reconcile::RunOptions;
use tgsync::testkit::{PodBuilder, bound_group};

const GROUPS: usize = 1_000;
const PODS_PER_GROUP: usize = 5;
const MINUTES: usize = 60;

/// The IP of pod `p` of group `g` (the one formula used to create them).
fn pod_ip(g: usize, p: usize) -> String {
    let i = g * PODS_PER_GROUP + p;
    format!("10.{}.{}.{}", 1 + i / 62_500, (i / 250) % 250, 1 + i % 250)
}

fn arn(g: usize) -> String {
    format!("arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/svc-{g}/{g:016x}")
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let clock = ManualClock::new(UnixMillis(1_800_000_000_000));
    let elb = FakeElb::default();
    let pods = FakePods::default();
    for g in 0..GROUPS {
        let ns = format!("ns-{}", g % 10);
        elb.add_group(bound_group(
            &arn(g),
            "prod",
            &ns,
            &format!("app=svc-{g}"),
            8080,
        ));
        for p in 0..PODS_PER_GROUP {
            let ip = pod_ip(g, p);
            pods.put(
                PodBuilder::new(&ns, &format!("svc-{g}-{p}"))
                    .label("app", &format!("svc-{g}"))
                    .ip(&ip)
                    .build(),
            );
        }
    }
    let engine = Engine::new(
        "prod",
        pods,
        elb,
        FakeState::default(),
        Arc::new(clock.clone()),
    );
    let scheduled = RunOptions {
        use_checkpoint: true,
        ..RunOptions::default()
    };
    let health = |e: &Engine<FakePods, FakeElb, FakeState>| {
        e.core
            .groups
            .calls()
            .get("DescribeTargetHealth")
            .copied()
            .unwrap_or(0)
    };
    let first = engine.resync(&scheduled).await;
    engine.core.groups.settle();
    println!(
        "converging run: {} groups, {} targets registered, {} DescribeTargetHealth",
        first.totals.groups,
        first.totals.registered,
        health(&engine)
    );
    let drift_at = 30;
    let victim = arn(123);
    let removed: Target = format!("{}:8080", pod_ip(123, 2)).parse().expect("target");
    let mut found_after = None;
    let mut per_minute = Vec::new();
    for minute in 1..=MINUTES {
        clock.advance(60_000);
        if minute == drift_at {
            assert!(
                engine.core.groups.live_targets(&victim).contains(&removed),
                "the victim holds {removed}"
            );
            engine.core.groups.remove_target(&victim, &removed);
        }
        let before = health(&engine);
        let r = engine.resync(&scheduled).await;
        engine.core.groups.settle();
        per_minute.push(health(&engine) - before);
        if minute >= drift_at
            && found_after.is_none()
            && r.group(&victim)
                .is_some_and(|g| g.registered.contains(&removed))
        {
            found_after = Some(minute - drift_at);
        }
    }
    let steady = &per_minute[10..];
    let max = steady.iter().max().copied().unwrap_or(0);
    let avg = steady.iter().sum::<u64>() as f64 / steady.len() as f64;
    println!("DescribeTargetHealth per minute, minutes 1-{MINUTES}: {per_minute:?}");
    println!(
        "steady state (minutes 11-{MINUTES}): average {avg:.1}/min = {:.2}/s, busiest minute {max} = {:.2}/s averaged over the minute",
        avg / 60.0,
        max as f64 / 60.0
    );
    match found_after {
        Some(m) => println!(
            "target removed by hand at minute {drift_at}: found and re-registered {m} minute(s) later"
        ),
        None => println!(
            "target removed by hand at minute {drift_at}: NOT found within {} minutes",
            MINUTES - drift_at
        ),
    }
}
