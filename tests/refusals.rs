//! A target is not its group, in watch mode over real HTTP: a target ELBv2 refuses for
//! itself backs off alone while a rolling update goes on around it, and a group over its
//! targets quota costs one refused call a probe interval while its pods and another
//! group's change. ELBv2's refusals are modelled by the test proxy (moto refuses
//! neither): an address ELBv2 will not take ([`chaos_proxy::Rules::refuse`]) and the
//! targets quota of a group ([`chaos_proxy::Rules::quota`], `TooManyTargets`).
//!
//! The world's clock is moved with real time here, as the function's wall clock moves:
//! the per-target backoff and the probe interval are wall-clock times.

#[path = "support/chaos_proxy.rs"]
mod chaos_proxy;
#[path = "support/invocation.rs"]
mod invocation;
#[path = "support/moto.rs"]
mod moto;
#[path = "support/world.rs"]
mod world;

use std::time::{Duration, Instant};

use chaos_proxy::{ChaosProxy, Fate};
use tgsync::clock::Clock as _;
use tgsync::reconcile::RunOptions;
use tgsync::testkit::{PodBuilder, set_condition};
use world::World;

fn pod(app: &str, name: &str, ip: &str) -> PodBuilder {
    PodBuilder::new("shop", name).label("app", app).ip(ip)
}

fn scheduled() -> RunOptions {
    RunOptions {
        use_checkpoint: true,
        ..RunOptions::default()
    }
}

/// Moves the world's clock with real time until dropped.
fn clock_follows_real_time(w: &World) -> tokio::task::JoinHandle<()> {
    let clock = w.clock.clone();
    tokio::spawn(async move {
        let mut last = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let now = Instant::now();
            clock.advance(now.duration_since(last).as_millis() as u64);
            last = now;
        }
    })
}

/// The RegisterTargets / DeregisterTargets requests naming `ip` (any group), with what
/// the proxy did with them.
fn calls_naming(proxy: &ChaosProxy, operation: &str, ip: &str) -> Vec<(Instant, Fate)> {
    proxy
        .records()
        .into_iter()
        .filter(|r| r.operation == operation && names(&chaos_proxy::percent_decode(&r.body), ip))
        .map(|r| (r.at, r.fate))
        .collect()
}

/// Whether a form body names `ip` as a target's `Id` (`10.0.2.1`, not `10.0.2.17`).
fn names(body: &str, ip: &str) -> bool {
    let id = format!("Id={ip}");
    body.match_indices(&id).any(|(i, _)| {
        body[i + id.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_digit() || c == '.'))
    })
}

/// A rolling update of 20 pods in which one new pod's address is refused by ELBv2: the
/// other 19 go in as fast as if it were not there, and the refused one is tried again
/// alone, a handful of times a minute at most. (When a refusal backed the whole group
/// off, the new pods after it waited for the group's doubling backoff.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_goes_on_around_a_refused_address() {
    const BAD: &str = "10.0.2.7";
    let (w, proxy) = chaos_proxy::world_behind(|r| {
        r.refuse = vec![(
            BAD.into(),
            "The IP address '10.0.2.7' is not a valid target (refused for this test)".into(),
        )]
    })
    .await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    for i in 1..=20 {
        w.put_pod(pod("web", &format!("old-{i}"), &format!("10.0.1.{i}")).build());
    }
    let r = w.resync().await;
    assert_eq!(r.group(&arn).unwrap().registered.len(), 20, "{r:#?}");
    let ticking = clock_follows_real_time(&w);
    let watch_for = Duration::from_secs(20);
    let until = w.clock.now().plus(watch_for);
    let opts = scheduled();
    let watching = w.engine.run_scheduled(&opts, until);
    let rollout = async {
        // The watch is up once a change is acted on.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut ready_at = Vec::new();
        for i in 1..=20 {
            let ip = format!("10.0.2.{i}");
            w.put_pod(pod("web", &format!("new-{i}"), &ip).build());
            ready_at.push((ip, Instant::now()));
            tokio::time::sleep(Duration::from_millis(250)).await;
            w.emulator.store().delete_pod("shop", &format!("old-{i}"));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let mut want: Vec<String> = (1..=20)
            .filter(|i| *i != 7)
            .map(|i| format!("10.0.2.{i}:8080"))
            .collect();
        want.sort();
        let want: Vec<&str> = want.iter().map(String::as_str).collect();
        invocation::until_targets(&w, &arn, &want, Duration::from_secs(10)).await;
        ready_at
    };
    let (report, ready_at) = tokio::join!(watching, rollout);
    ticking.abort();
    // Every good pod went in within a second or so of turning Ready.
    let mut waits = Vec::new();
    for (ip, at) in ready_at.iter().filter(|(ip, _)| ip != BAD) {
        let registered = calls_naming(&proxy, "RegisterTargets", ip)
            .first()
            .map(|(t, _)| *t)
            .unwrap_or_else(|| panic!("{ip} never registered"));
        waits.push((ip.clone(), registered.saturating_duration_since(*at)));
    }
    let slowest = waits.iter().map(|(_, d)| *d).max().unwrap();
    eprintln!("registration after Ready: slowest {slowest:?}; {waits:?}");
    // The refused address: the race this is about happened (it was refused while the
    // rollout went on), and it was retried alone a handful of times.
    let bad = calls_naming(&proxy, "RegisterTargets", BAD);
    let refused = bad.iter().filter(|(_, f)| *f == Fate::Refused).count();
    let bad_ready = ready_at.iter().find(|(ip, _)| ip == BAD).unwrap().1;
    let after_bad = ready_at.iter().filter(|(_, at)| *at > bad_ready).count();
    eprintln!(
        "RegisterTargets naming {BAD}: {} ({refused} refused); {after_bad} pods turned Ready after it",
        bad.len()
    );
    assert!(refused >= 1 && after_bad >= 10, "{bad:?}");
    assert!(
        slowest < Duration::from_secs(2),
        "a good pod waited {slowest:?} for its registration: {waits:?}"
    );
    // Over the ~15 s from its first refusal: tries at 0 s, ~5 s, 5-10 s later, …
    assert!(bad.len() <= 4, "{BAD} sent {} times: {bad:?}", bad.len());
    let watch = report.watch.expect("a watch report");
    assert!(watch.errors.is_empty(), "{watch:#?}");
}

/// A group with more ready pods than its quota while one of its pods flaps, beside a
/// group whose pods turn NotReady: the full group makes at most one refused call a probe
/// interval, and the other group's NotReady pods leave within a second. (When a full
/// group tried again on every pass, each flap cost a run of refused calls.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_group_costs_one_refused_call_a_probe_interval() {
    let (w, proxy) = chaos_proxy::world_behind(|r| r.quota = Some(5)).await;
    let full = w.group("shop", "app=web", 8080, &[]).await;
    let other = w.group("shop", "app=api", 9090, &[]).await;
    for i in 1..=15 {
        w.put_pod(pod("web", &format!("web-{i}"), &format!("10.0.1.{i}")).build());
    }
    for i in 1..=3 {
        w.put_pod(pod("api", &format!("api-{i}"), &format!("10.0.3.{i}")).build());
    }
    let r = w.resync().await;
    let g = r.group(&full).unwrap();
    assert_eq!(g.registered.len(), 5, "{r:#?}");
    assert_eq!(g.waiting.len(), 10, "{r:#?}");
    let first_probe = g.waiting[0].retry_at;
    let ticking = clock_follows_real_time(&w);
    let started = Instant::now();
    let from = proxy.records().len();
    let watch_for = Duration::from_secs(24);
    let until = w.clock.now().plus(watch_for);
    let opts = scheduled();
    let watching = w.engine.run_scheduled(&opts, until);
    let registered: Vec<String> = w.targets(&full).await;
    let flapping = registered[0].trim_end_matches(":8080").to_owned();
    let flapping_pod = format!("web-{}", flapping.rsplit('.').next().unwrap());
    let churn = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut left = Vec::new();
        for round in 0..8 {
            // One of the full group's pods flaps.
            w.emulator.store().update_pod("shop", &flapping_pod, |p| {
                set_condition(p, "Ready", round % 2 == 1)
            });
            // One of the other group's pods turns NotReady, and back after a while.
            let api = format!("api-{}", round % 3 + 1);
            let ip = format!("10.0.3.{}", round % 3 + 1);
            w.emulator
                .store()
                .update_pod("shop", &api, |p| set_condition(p, "Ready", false));
            let at = Instant::now();
            tokio::time::sleep(Duration::from_millis(1200)).await;
            let gone = calls_naming(&proxy, "DeregisterTargets", &ip)
                .into_iter()
                .map(|(t, _)| t)
                .find(|t| *t > at);
            left.push((ip, gone.map(|t| t.duration_since(at))));
            w.emulator
                .store()
                .update_pod("shop", &api, |p| set_condition(p, "Ready", true));
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        left
    };
    let (report, left) = tokio::join!(watching, churn);
    ticking.abort();
    let watched = started.elapsed();
    let refused: Vec<Instant> = proxy.records()[from..]
        .iter()
        .filter(|r| r.operation == "RegisterTargets" && r.fate == Fate::Refused)
        .map(|r| r.at)
        .collect();
    let passes = report.watch.as_ref().map_or(0, |w| w.passes);
    eprintln!(
        "{} refused RegisterTargets in {watched:?} ({passes} passes); first probe due {} ms after the watch began; NotReady left after {left:?}",
        refused.len(),
        first_probe.0 as i64 - (until.0 - watch_for.as_millis() as u64) as i64
    );
    // Probes 15 s, then 15-30 s apart: at most two in the watch.
    assert!(
        refused.len() <= 2,
        "{} refused calls in {watched:?}",
        refused.len()
    );
    for (ip, after) in &left {
        let after = after.unwrap_or_else(|| panic!("{ip} never left its group: {left:?}"));
        assert!(
            after < Duration::from_secs(1),
            "{ip} left after {after:?}: {left:?}"
        );
    }
    assert_eq!(
        w.targets(&other).await,
        ["10.0.3.1:9090", "10.0.3.2:9090", "10.0.3.3:9090"]
    );
    // The full group still says which pods wait, and why.
    let g = report.group(&full).expect("the full group in the report");
    assert!(
        g.waiting.iter().all(|w| w.reason.contains("full")) && !g.waiting.is_empty(),
        "{g:#?}"
    );
}
