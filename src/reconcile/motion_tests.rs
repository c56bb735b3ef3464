//! The fast path (pod events) and the safety machinery (checkpoint, backoff, lease,
//! bindings cache, ledger) meeting during rollouts and failures, against the fakes.
//! Each test is a user-visible outcome: what is in the group, what the report says.

use std::time::Duration;

use serde_json::{Value, json};

use super::RunOptions;
use super::tests::{TG, TestEngine, fake_engine, web_group};
use crate::clock::{Clock, ManualClock};
use crate::core::{HealthState, Target};
use crate::fakes::FakePods;
use crate::input::pod_event::{Parsed, parse};
use crate::report::{Outcome, Report};
use crate::testkit::{PodBuilder, mark_terminating, set_condition};

fn engine() -> (TestEngine, ManualClock) {
    fake_engine(FakePods::default(), web_group(), 11)
}

fn t(s: &str) -> Target {
    s.parse().unwrap()
}

fn web(name: &str, ip: &str) -> PodBuilder {
    PodBuilder::new("shop", name).label("app", "web").ip(ip)
}

fn live(e: &TestEngine) -> Vec<String> {
    e.core
        .groups
        .live_targets(TG)
        .iter()
        .map(Target::to_string)
        .collect()
}

fn seed_three(e: &TestEngine) {
    for (n, ip) in [
        ("web-1", "10.0.1.1"),
        ("web-2", "10.0.1.2"),
        ("web-3", "10.0.1.3"),
    ] {
        e.core.pods.put(web(n, ip).build());
    }
}

/// A run as the schedule makes it.
async fn scheduled(e: &TestEngine) -> Report {
    e.resync(&RunOptions {
        use_checkpoint: true,
        ..RunOptions::default()
    })
    .await
}

/// An exporter event about `name` with `reason`.
fn event(name: &str, reason: &str) -> crate::input::pod_event::PodEvent {
    let mut ev: Value =
        serde_json::from_str(include_str!("../../events/pod-started.json")).unwrap();
    ev["detail"]["involvedObject"]["name"] = json!(name);
    ev["detail"]["involvedObject"]["namespace"] = json!("shop");
    ev["detail"]["involvedObject"]["labels"] = json!({"app": "web"});
    ev["detail"]["reason"] = json!(reason);
    match parse(&ev, "demo") {
        Parsed::Pod(p) => p,
        Parsed::Ignore(why) => panic!("ignored: {why}"),
    }
}

async fn pod_event(e: &TestEngine, name: &str, reason: &str) -> Report {
    e.pod_event(&event(name, reason), Duration::ZERO, &RunOptions::default())
        .await
        .unwrap()
}

/// A pod deregistered by pod-events on `Unhealthy` that recovers before the next
/// schedule must be back on that schedule, not after the verification interval.
#[tokio::test]
async fn a_pod_removed_by_pod_events_is_back_on_the_next_scheduled_run() {
    let (e, clock) = engine();
    seed_three(&e);
    scheduled(&e).await;
    e.core.groups.settle();
    clock.advance(60_000);
    e.core
        .pods
        .update("shop", "web-2", |p| set_condition(p, "Ready", false));
    let r = pod_event(&e, "web-2", "Unhealthy").await;
    assert_eq!(r.group(TG).unwrap().deregistered, vec![t("10.0.1.2:8080")]);
    e.core.groups.settle();
    // It recovers; no event says so.
    e.core
        .pods
        .update("shop", "web-2", |p| set_condition(p, "Ready", true));
    clock.advance(60_000);
    let r = scheduled(&e).await;
    assert_eq!(
        r.group(TG).unwrap().registered,
        vec![t("10.0.1.2:8080")],
        "{r:#?}"
    );
    assert_eq!(
        live(&e),
        ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"]
    );
}

/// A target pod-events registered, whose deletion event was lost, must go on the next
/// schedule.
#[tokio::test]
async fn a_pod_registered_by_pod_events_whose_deletion_was_missed_goes_on_the_next_schedule() {
    let (e, clock) = engine();
    seed_three(&e);
    scheduled(&e).await;
    e.core.groups.settle();
    clock.advance(60_000);
    e.core.pods.put(web("web-4", "10.0.1.4").build());
    let r = pod_event(&e, "web-4", "Started").await;
    assert_eq!(r.group(TG).unwrap().registered, vec![t("10.0.1.4:8080")]);
    e.core.groups.settle();
    e.core.pods.delete("shop", "web-4");
    clock.advance(60_000);
    let r = scheduled(&e).await;
    assert_eq!(
        r.group(TG).unwrap().deregistered,
        vec![t("10.0.1.4:8080")],
        "{r:#?}"
    );
    assert_eq!(
        live(&e),
        ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"]
    );
}

/// In a deployment small enough for the Describe budget, a target removed by hand is
/// restored on the very next scheduled run.
#[tokio::test]
async fn a_hand_removed_target_is_restored_on_the_very_next_scheduled_run() {
    let (e, clock) = engine();
    seed_three(&e);
    scheduled(&e).await;
    e.core.groups.settle();
    for _ in 0..3 {
        clock.advance(60_000);
        scheduled(&e).await;
    }
    e.core.groups.remove_target(TG, &t("10.0.1.1:8080"));
    clock.advance(60_000);
    let r = scheduled(&e).await;
    assert_eq!(
        r.group(TG).unwrap().registered,
        vec![t("10.0.1.1:8080")],
        "{r:#?}"
    );
}

/// One failed registration puts the group in backoff; a pod that terminates meanwhile
/// must still leave the group at once.
#[tokio::test]
async fn a_group_in_backoff_still_deregisters_a_terminating_pod() {
    let (e, _) = engine();
    seed_three(&e);
    e.resync(&RunOptions::default()).await;
    e.core.groups.settle();
    e.core.pods.put(web("web-4", "10.0.1.4").build());
    e.core.groups.set_failing_mutations(true);
    let r = e.resync(&RunOptions::default()).await;
    assert_eq!(r.group(TG).unwrap().outcome, Outcome::Failed);
    e.core.groups.set_failing_mutations(false);
    e.core.pods.update("shop", "web-2", mark_terminating);
    let r = pod_event(&e, "web-2", "Killing").await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.deregistered, vec![t("10.0.1.2:8080")], "{r:#?}");
    assert!(
        g.registered.is_empty(),
        "registration still backs off: {r:#?}"
    );
    assert_eq!(live(&e), ["10.0.1.1:8080", "10.0.1.3:8080"]);
}

/// A pod that is still not ready when its wait ends must not cost the group its pass;
/// everything else pending in the group is still done.
#[tokio::test]
async fn a_pod_that_stays_unready_leaves_the_pass_its_time() {
    let (e, clock) = engine();
    seed_three(&e);
    e.resync(&RunOptions::default()).await;
    e.core.groups.settle();
    // web-1 went away without an event; web-7 starts and never turns ready.
    e.core.pods.delete("shop", "web-1");
    e.core
        .pods
        .put(web("web-7", "10.0.1.7").ready(false).build());
    e.core.pods.slow_gets(&clock, 5_000);
    let opts = RunOptions {
        deadline: Some(clock.now().plus(Duration::from_secs(60))),
        ..RunOptions::default()
    };
    let r = e
        .pod_event(&event("web-7", "Started"), Duration::from_secs(60), &opts)
        .await
        .unwrap();
    let g = r.group(TG).unwrap();
    assert_ne!(g.outcome, Outcome::Deferred, "{r:#?}");
    assert_eq!(g.deregistered, vec![t("10.0.1.1:8080")], "{r:#?}");
}

/// A pod that turned unhealthy is deregistered at once, never waited on.
#[tokio::test]
async fn an_unhealthy_pod_is_deregistered_without_waiting() {
    let (e, clock) = engine();
    seed_three(&e);
    e.resync(&RunOptions::default()).await;
    e.core.groups.settle();
    e.core
        .pods
        .update("shop", "web-2", |p| set_condition(p, "Ready", false));
    e.core.pods.slow_gets(&clock, 1_000);
    let before = clock.now();
    let r = e
        .pod_event(
            &event("web-2", "Unhealthy"),
            Duration::from_secs(20),
            &RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.group(TG).unwrap().deregistered, vec![t("10.0.1.2:8080")]);
    assert!(
        e.core.pods.get_calls() <= 1,
        "{} GETs: the unready pod was polled",
        e.core.pods.get_calls()
    );
    assert!(clock.now().0 - before.0 <= 1_000, "waited");
}

/// The warm container's bindings say `exclusive`; the group was switched to `shared`
/// since. Its foreign target must survive the next pod event.
#[tokio::test]
async fn a_group_switched_to_shared_keeps_its_foreign_target_despite_warm_bindings() {
    let (e, clock) = engine();
    e.core.groups.set_tag(TG, "tgsync/mode", Some("exclusive"));
    e.core.pods.put(web("web-1", "10.0.1.1").build());
    pod_event(&e, "web-1", "Started").await;
    // Seconds later, the operator makes the group shared and adds a target of its own.
    clock.advance(2_000);
    e.core.groups.set_tag(TG, "tgsync/mode", Some("shared"));
    e.core
        .groups
        .add_target(TG, t("192.168.7.7:8080"), HealthState::Healthy);
    e.core.pods.put(web("web-2", "10.0.1.2").build());
    let r = pod_event(&e, "web-2", "Started").await;
    assert!(
        live(&e).contains(&"192.168.7.7:8080".to_owned()),
        "foreign target removed: {r:#?}"
    );
    assert_eq!(r.group(TG).unwrap().registered, vec![t("10.0.1.2:8080")]);
}

/// ELBv2 reads can lag a RegisterTargets: a ledger row whose target is not visible yet
/// must not be forgotten, or the target leaks as foreign when it shows up.
#[tokio::test]
async fn a_target_not_yet_visible_after_registration_is_not_forgotten() {
    let (e, clock) = engine();
    e.core.groups.lag_reads(2);
    e.core.pods.put(web("web-1", "10.0.1.1").build());
    e.resync(&RunOptions::default()).await;
    e.core.pods.delete("shop", "web-1");
    for _ in 0..4 {
        clock.advance(5_000);
        e.resync(&RunOptions::default()).await;
    }
    e.core.groups.settle();
    assert!(live(&e).is_empty(), "leaked: {:?}", live(&e));
    assert!(e.core.state.live_ledger(TG).is_empty());
}

/// A dry run always shows the plan, backoff or not.
#[tokio::test]
async fn a_dry_run_in_backoff_shows_its_plan() {
    let (e, _) = engine();
    seed_three(&e);
    e.core.groups.set_failing_mutations(true);
    e.resync(&RunOptions::default()).await;
    let r = e
        .resync(&RunOptions {
            dry_run: true,
            ..RunOptions::default()
        })
        .await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.outcome, Outcome::Planned, "{r:#?}");
    assert_eq!(g.plan.as_ref().unwrap().register.len(), 3);
}

/// Pod errors need an operator; they are reported on every run, also when the health
/// read was skipped.
#[tokio::test]
async fn pod_errors_are_reported_on_every_run() {
    let (e, clock) = engine();
    e.core.groups.set_tag(TG, "tgsync/port", Some("http"));
    seed_three(&e);
    e.core.pods.update("shop", "web-3", |p| {
        if let Some(spec) = p.spec.as_mut() {
            spec.containers[0].ports = None;
        }
    });
    for run in 0..3 {
        let r = scheduled(&e).await;
        e.core.groups.settle();
        clock.advance(60_000);
        let g = r.group(TG).unwrap();
        assert_eq!(g.pod_errors.len(), 1, "run {run}: {r:#?}");
        assert_eq!(g.pod_errors[0].pod, "shop/web-3");
    }
}

/// The readiness-gate patch is for the pod that was read: a namesake created since (a
/// StatefulSet pod re-created) must not have its gate opened by the old pod's target.
#[tokio::test]
async fn a_gate_is_never_opened_on_a_namesake() {
    let (e, _) = engine();
    e.core
        .pods
        .put(web("web-0", "10.0.1.1").gated().ready(false).build());
    e.core.pods.update("shop", "web-0", |p| {
        set_condition(p, "ContainersReady", true)
    });
    e.resync(&RunOptions::default()).await;
    e.core.groups.settle();
    e.core.pods.before_next_gate(|p| {
        p.metadata.uid = Some("uid-of-the-namesake".into());
    });
    e.resync(&RunOptions::default()).await;
    let facts = crate::core::PodFacts::from_pod(
        e.core
            .pods
            .get("shop", "web-0")
            .await
            .unwrap()
            .expect("the namesake exists"),
    );
    assert_eq!(facts.pod.uid, "uid-of-the-namesake");
    assert_eq!(facts.gate, Some(false), "the namesake's gate was opened");
}

use crate::pods::PodSource as _;

/// A holder that cannot renew its lease (the state table throttles every renewal) stops
/// before its next write once the lease runs low: no further ELBv2 call, no ledger write;
/// it gives the lease back with a request for another pass.
#[tokio::test]
async fn a_holder_whose_renewals_fail_makes_no_further_write() {
    let (e, clock) = engine();
    let mut settings = super::tests::no_waiting();
    // Renew (and fail) all the time; 6 s per ELBv2 call on the manual clock, so the
    // 15 s lease runs low during the second RegisterTargets. The pass waits for a
    // renewal that never comes for a short while only.
    settings.lease.renew_every = Duration::from_millis(5);
    settings.lease.ready_wait = Duration::from_millis(300);
    let e = e.with_settings(settings);
    for i in 0..450u32 {
        e.core.pods.put(
            web(
                &format!("web-{i}"),
                &format!("10.0.{}.{}", 10 + i / 200, i % 200),
            )
            .build(),
        );
    }
    e.core.groups.slow_mutations(&clock, 6_000);
    e.core.state.set_failing_renewals(true);
    let (writes_before, _) = e.core.state.calls();
    let r = e.resync(&RunOptions::default()).await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.outcome, Outcome::Failed, "{r:#?}");
    assert!(g.error.as_deref().unwrap_or("").contains("lease"), "{r:#?}");
    let calls = e.core.groups.calls();
    assert_eq!(calls.get("RegisterTargets"), Some(&2), "{calls:?}");
    assert_eq!(g.registered.len(), 400);
    // Writes: the lease, the group's index row, two write-ahead ledger writes, the
    // failed renewals, and giving the lease back; nothing after the lease ran low (no
    // third write-ahead, no release with the ledger).
    let stored = e.core.state.stored(TG);
    assert_eq!(stored.ledger.len(), 400, "the ledger stops with the calls");
    assert!(
        stored.lease.is_none(),
        "the lost lease is given back at once"
    );
    assert!(stored.dirty, "with a request for another pass");
    let (writes_after, _) = e.core.state.calls();
    let renewals = writes_after - writes_before - 5;
    assert!(renewals > 0, "the heartbeat tried to renew");
    // Once the lease expired, the next run finishes the job.
    e.core.state.set_failing_renewals(false);
    e.core.groups.slow_mutations(&clock, 0);
    clock.advance(30_000);
    let r = e.resync(&RunOptions::default()).await;
    assert_eq!(r.group(TG).unwrap().registered.len(), 50, "{r:#?}");
    assert_eq!(e.core.groups.live_targets(TG).len(), 450);
}

/// A pod LIST that fails close to the deadline is reported as the API's error, not as
/// a deferral.
#[tokio::test]
async fn a_list_that_fails_near_the_deadline_reports_its_error() {
    let (e, clock) = engine();
    seed_three(&e);
    e.core.pods.slow_lists(&clock, 25_000);
    e.core.pods.set_failing(true);
    let opts = RunOptions {
        deadline: Some(clock.now().plus(Duration::from_secs(40))),
        use_checkpoint: true,
        ..RunOptions::default()
    };
    let r = e.resync(&opts).await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.outcome, Outcome::Failed, "{r:#?}");
    assert!(
        g.error.as_deref().unwrap_or("").contains("503"),
        "the API's error: {r:#?}"
    );
}

/// A pass cut after its deregistration (a crash, a Lambda timeout) must not leave a
/// checkpoint that lets the schedule skip the group: here the pod comes back, the
/// desired set equals the one last verified, and the group is not due for
/// re-verification — it must still be read and the pod registered again.
#[tokio::test]
async fn a_pass_cut_after_a_deregistration_leaves_no_checkpoint_that_skips_the_group() {
    use crate::core::checkpoint::{Rotation, rank_order};
    use crate::faults::{CrashAt, FaultPoint};
    const OTHER: &str =
        "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/api/1123456789abcdef";
    let elb = web_group();
    elb.add_group(crate::testkit::bound_group(
        OTHER, "demo", "shop", "app=api", 9090,
    ));
    let (e, clock) = fake_engine(FakePods::default(), elb, 13);
    // One re-verification per run: with two groups, each is verified every other run.
    let mut settings = super::tests::no_waiting();
    settings.verify_describes_per_second = 1.0 / 60.0;
    let mut e = e.with_settings(settings);
    let period = 60_000u64;
    let rank = rank_order([TG, OTHER].into_iter())
        .iter()
        .position(|a| *a == TG)
        .unwrap();
    // Moves the clock to the start of the next period whose run does (or does not)
    // re-verify TG.
    let to_run = |due: bool| {
        let mut run = clock.now().0 / period + 1;
        while Rotation::new(2, 1, run).due(rank) != due {
            run += 1;
        }
        clock.advance(run * period - clock.now().0);
    };
    e.core.pods.put(web("web-1", "10.0.1.1").build());
    e.core.pods.put(web("web-2", "10.0.1.2").build());
    to_run(true);
    let r = scheduled(&e).await;
    assert_eq!(live(&e), ["10.0.1.1:8080", "10.0.1.2:8080"], "{r:#?}");
    assert!(e.core.state.stored(TG).checkpoint.is_some(), "verified");
    // web-2 turns NotReady; the pass that deregisters it dies right after the call.
    e.core
        .pods
        .update("shop", "web-2", |p| set_condition(p, "Ready", false));
    let crash = std::sync::Arc::new(CrashAt::first(FaultPoint::AfterDeregisterChunk));
    e.core.faults = crash.clone();
    let r = pod_event(&e, "web-2", "Unhealthy").await;
    assert!(crash.fired(), "the crash was staged: {r:#?}");
    assert_eq!(live(&e), ["10.0.1.1:8080"]);
    e.core.faults = std::sync::Arc::new(crate::faults::NoFaults);
    // web-2 recovers; the next run does not re-verify TG by rotation.
    e.core
        .pods
        .update("shop", "web-2", |p| set_condition(p, "Ready", true));
    to_run(false);
    let r = scheduled(&e).await;
    assert_eq!(
        live(&e),
        ["10.0.1.1:8080", "10.0.1.2:8080"],
        "the schedule skipped the group on a checkpoint the cut pass left: {r:#?}"
    );
}
