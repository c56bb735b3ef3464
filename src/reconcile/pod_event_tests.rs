//! pod-events behaviour against the fakes, and the resync/pod-events race.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::RunOptions;
use super::tests::{TG, TestEngine, fake_engine, ledger_targets, web_group};
use crate::core::{HealthState, Target};
use crate::fakes::FakePods;
use crate::input::pod_event::{Parsed, parse};
use crate::report::Outcome;
use crate::testkit::{PodBuilder, bound_group, mark_terminating};

const OTHER: &str =
    "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/api/1123456789abcdef";

fn engine() -> TestEngine {
    fake_engine(FakePods::default(), engine_groups(), 3).0
}

/// The web group and the api group ([`OTHER`]) of one account.
fn engine_groups() -> crate::fakes::FakeElb {
    let elb = web_group();
    elb.add_group(bound_group(OTHER, "demo", "shop", "app=api", 8080));
    elb
}

/// An exporter event about `name`, shaped like `events/pod-started.json`.
fn exporter_event(name: &str, reason: &str, labels: Value) -> Value {
    let mut ev: Value =
        serde_json::from_str(include_str!("../../events/pod-started.json")).unwrap();
    ev["detail"]["involvedObject"]["name"] = json!(name);
    ev["detail"]["involvedObject"]["labels"] = labels;
    ev["detail"]["reason"] = json!(reason);
    ev
}

async fn handle(e: &TestEngine, ev: &Value) -> crate::report::Report {
    match parse(ev, "demo") {
        Parsed::Pod(p) => e
            .pod_event(&p, Duration::ZERO, &RunOptions::default())
            .await
            .unwrap(),
        Parsed::Ignore(why) => panic!("ignored: {why}"),
    }
}

fn live(e: &TestEngine, arn: &str) -> Vec<String> {
    e.core
        .groups
        .live_targets(arn)
        .iter()
        .map(Target::to_string)
        .collect()
}

fn web(name: &str, ip: &str) -> PodBuilder {
    PodBuilder::new("shop", name).label("app", "web").ip(ip)
}

#[tokio::test]
async fn started_registers_only_in_the_groups_it_matches() {
    let e = engine();
    e.core.pods.put(web("web-7", "10.0.1.7").build());
    let r = handle(
        &e,
        &exporter_event("web-7", "Started", json!({"app": "web"})),
    )
    .await;
    assert_eq!(r.groups.len(), 1, "{r:#?}");
    assert_eq!(r.group(TG).unwrap().outcome, Outcome::Changed);
    assert_eq!(live(&e, TG), ["10.0.1.7:8080"]);
    assert!(e.core.groups.targets(OTHER).is_empty());
    assert_eq!(
        e.core.groups.calls().get("DescribeTargetHealth"),
        Some(&1),
        "only the matching group is read, once: the pass under its lease reuses the plan's read (nothing was written in between)"
    );
    assert_eq!(
        e.core.pods.list_calls(),
        1,
        "one LIST of the namespace: the pass plans from the observation's (nothing was written in between)"
    );
}

/// The observation's LIST stands in for the pass's own only while nothing was written to
/// the group: when another process's pass wrote in between (here: while this event's
/// health read waits), the pass lists afresh and plans from what that LIST shows.
#[tokio::test]
async fn a_write_between_observation_and_lease_makes_the_pass_list_again() {
    let e = engine();
    e.core.pods.put(web("web-1", "10.0.1.1").build());
    let held = e.core.groups.hold_health(TG);
    let event = exporter_event("web-1", "Started", json!({"app": "web"}));
    let other = async {
        // The observation has listed and waits for its health read: another writer
        // changes the group, and a new pod starts meanwhile.
        while e.core.pods.list_calls() < 1 {
            tokio::task::yield_now().await;
        }
        let mut state = e.core.state.stored(TG);
        state.version += 1;
        e.core.state.put(TG, state);
        e.core.pods.put(web("web-2", "10.0.1.2").build());
        held.add_permits(100);
    };
    let (r, ()) = tokio::join!(handle(&e, &event), other);
    assert_eq!(e.core.pods.list_calls(), 2, "{r:#?}");
    assert_eq!(
        live(&e, TG),
        ["10.0.1.1:8080", "10.0.1.2:8080"],
        "the pass planned from its own LIST, which has web-2"
    );
}

#[tokio::test]
async fn killing_a_terminating_pod_deregisters_it() {
    let e = engine();
    e.core.pods.put(web("web-7", "10.0.1.7").build());
    handle(
        &e,
        &exporter_event("web-7", "Started", json!({"app": "web"})),
    )
    .await;
    e.core.pods.update("shop", "web-7", mark_terminating);
    let r = handle(
        &e,
        &exporter_event("web-7", "Killing", json!({"app": "web"})),
    )
    .await;
    assert_eq!(
        r.group(TG).unwrap().deregistered,
        vec!["10.0.1.7:8080".parse().unwrap()]
    );
    assert!(live(&e, TG).is_empty());
}

#[tokio::test]
async fn deleted_pod_without_labels_is_found_through_the_ledger() {
    let e = engine();
    e.core.pods.put(web("web-7", "10.0.1.7").build());
    handle(
        &e,
        &exporter_event("web-7", "Started", json!({"app": "web"})),
    )
    .await;
    e.core.pods.delete("shop", "web-7");
    // The exporter could not look labels up for a pod that is gone.
    let r = handle(&e, &exporter_event("web-7", "Killing", Value::Null)).await;
    assert_eq!(r.groups.len(), 1, "{r:#?}");
    assert!(live(&e, TG).is_empty());
    assert!(e.core.state.live_ledger(TG).is_empty());
}

#[tokio::test]
async fn running_pod_is_waited_for_until_ready() {
    let e = Arc::new(engine());
    e.core
        .pods
        .put(web("web-7", "10.0.1.7").ready(false).build());
    let ev = match parse(
        &exporter_event("web-7", "Started", json!({"app": "web"})),
        "demo",
    ) {
        Parsed::Pod(p) => p,
        Parsed::Ignore(w) => panic!("{w}"),
    };
    let e2 = e.clone();
    let flip = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        e2.core.pods.update("shop", "web-7", |p| {
            crate::testkit::set_condition(p, "Ready", true)
        });
    });
    // The manual clock does not move, so only readiness ends the wait.
    let r = e
        .pod_event(&ev, Duration::from_secs(30), &RunOptions::default())
        .await
        .unwrap();
    flip.await.unwrap();
    assert_eq!(r.group(TG).unwrap().registered.len(), 1, "{r:#?}");
}

#[tokio::test]
async fn foreign_cluster_and_malformed_events_touch_nothing() {
    let e = engine();
    e.core.pods.put(web("web-7", "10.0.1.7").build());
    for file in [
        include_str!("../../events/pod-foreign-cluster.json"),
        include_str!("../../events/pod-malformed.json"),
    ] {
        let ev: Value = serde_json::from_str(file).unwrap();
        let out = crate::handlers::pod_events::handle(&e, &ev, Duration::ZERO, None)
            .await
            .unwrap();
        assert_eq!(out["groups"], json!([]), "{out}");
        assert!(
            out["notes"][0].as_str().unwrap().starts_with("ignored: "),
            "{out}"
        );
    }
    assert!(
        e.core.groups.calls().is_empty(),
        "{:?}",
        e.core.groups.calls()
    );
}

/// Resync and pod-events on the same group at once, with a pod deleted between them,
/// over many seeded interleavings: no deleted pod stays registered, no foreign target is
/// removed, and the ledger ends exact.
#[test]
fn resync_and_pod_events_race_over_many_interleavings() {
    let foreign: Target = "192.168.7.7:8080".parse().unwrap();
    let mut contended_seeds = 0u32;
    for seed in 0..2000u64 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let e = engine();
            for (n, ip) in [
                ("web-1", "10.0.1.1"),
                ("web-2", "10.0.1.2"),
                ("web-3", "10.0.1.3"),
            ] {
                e.core.pods.put(web(n, ip).build());
            }
            e.core.groups.add_target(TG, foreign, HealthState::Healthy);
            e.resync(&RunOptions::default()).await;
            e.core.groups.settle();
            e.core.pods.chaos.seed(seed);
            e.core.groups.chaos.seed(seed.wrapping_mul(31));
            e.core.state.chaos.seed(seed.wrapping_mul(17));
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut gap = || if rng.bool() { 0 } else { rng.u8(0..48) };
            let (before_delete, before_event) = (gap(), gap());
            let opts = RunOptions::default();
            let resync = e.resync(&opts);
            let churn = async {
                for _ in 0..before_delete {
                    tokio::task::yield_now().await;
                }
                e.core.pods.delete("shop", "web-2");
                e.core.pods.put(web("web-4", "10.0.1.4").build());
                for _ in 0..before_event {
                    tokio::task::yield_now().await;
                }
                handle(
                    &e,
                    &exporter_event("web-2", "Killing", json!({"app": "web"})),
                )
                .await
            };
            let (r1, r2) = tokio::join!(resync, churn);
            let live = live(&e, TG);
            assert!(
                !live.contains(&"10.0.1.2:8080".to_string()),
                "seed {seed}: deleted pod left registered: {live:?}\n{r1:#?}\n{r2:#?}"
            );
            assert!(
                live.contains(&foreign.to_string()),
                "seed {seed}: foreign target removed"
            );
            let ledger = ledger_targets(&e);
            assert!(
                !ledger.contains(&"10.0.1.2:8080".to_string()),
                "seed {seed}: stale ledger {ledger:?}"
            );
            assert!(
                !e.core
                    .state
                    .lease_held(TG, crate::clock::Clock::now(&*e.core.clock)),
                "seed {seed}: lease leaked"
            );
            contended_seeds += u32::from(e.core.state.contended() > 0);
        });
    }
    // The race this test is about: the two runs met on the group's lease.
    assert!(
        contended_seeds >= 100,
        "only {contended_seeds} of 2000 interleavings met on the lease"
    );
    eprintln!("{contended_seeds} of 2000 interleavings met on the lease");
}

/// Pod churn: hundreds of pods created and deleted (each followed by its event) while
/// scheduled resyncs keep running, over seeded interleavings. At the end the group holds
/// exactly the live ready pods plus the foreign target, and the ledger exactly the pods.
#[test]
fn churn_with_both_functions_running_ends_exact() {
    let foreign: Target = "192.168.7.7:8080".parse().unwrap();
    for seed in 0..25u64 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let e = engine();
            e.core.groups.add_target(TG, foreign, HealthState::Healthy);
            for i in 0..40u32 {
                e.core
                    .pods
                    .put(web(&format!("web-{i}"), &format!("10.0.2.{i}")).build());
            }
            e.resync(&RunOptions::default()).await;
            e.core.pods.chaos.seed(seed);
            e.core.groups.chaos.seed(seed.wrapping_mul(31));
            e.core.state.chaos.seed(seed.wrapping_mul(17));
            let done = std::cell::Cell::new(false);
            let resyncs = async {
                let opts = RunOptions::default();
                while !done.get() {
                    e.resync(&opts).await;
                    e.core.groups.settle();
                }
            };
            let churn = async {
                let mut rng = fastrand::Rng::with_seed(seed);
                let mut alive: Vec<u32> = (0..40).collect();
                let mut next = 40u32;
                for _ in 0..300 {
                    let (name, reason) = if alive.is_empty() || rng.bool() {
                        let i = next;
                        next += 1;
                        alive.push(i);
                        e.core.pods.put(
                            web(
                                &format!("web-{i}"),
                                &format!("10.0.{}.{}", 2 + i / 250, i % 250),
                            )
                            .build(),
                        );
                        (format!("web-{i}"), "Started")
                    } else {
                        let i = alive.swap_remove(rng.usize(0..alive.len()));
                        e.core.pods.delete("shop", &format!("web-{i}"));
                        (format!("web-{i}"), "Killing")
                    };
                    for _ in 0..rng.u8(0..6) {
                        tokio::task::yield_now().await;
                    }
                    handle(&e, &exporter_event(&name, reason, json!({"app": "web"}))).await;
                }
                done.set(true);
                alive
            };
            let ((), alive) = tokio::join!(resyncs, churn);
            // No lease may be left behind (a holder that gives up must let go), so the
            // next scheduled run can always act; it is the backstop for changes a holder
            // left pending after its pass limit.
            assert!(
                !e.core
                    .state
                    .lease_held(TG, crate::clock::Clock::now(&*e.core.clock)),
                "seed {seed}: lease left held"
            );
            e.resync(&RunOptions::default()).await;
            e.core.groups.settle();
            let mut want: Vec<String> = alive
                .iter()
                .map(|i| format!("10.0.{}.{}:8080", 2 + i / 250, i % 250))
                .collect();
            let owned = want.clone();
            want.push(foreign.to_string());
            want.sort();
            let mut have = live(&e, TG);
            have.sort();
            assert_eq!(have, want, "seed {seed}: group differs from the live pods");
            let mut ledger = ledger_targets(&e);
            ledger.sort();
            let mut owned = owned;
            owned.sort();
            assert_eq!(ledger, owned, "seed {seed}: ledger differs");
        });
    }
}

/// Pod `name` (label `app=<app>`, IP `ip`) started and its event handled: the
/// DescribeTags calls the handling made, and its report.
async fn started(e: &TestEngine, app: &str, name: &str, ip: &str) -> (u64, crate::report::Report) {
    let reads = || {
        e.core
            .groups
            .calls()
            .get("DescribeTags")
            .copied()
            .unwrap_or(0)
    };
    let pod = PodBuilder::new("shop", name).label("app", app).ip(ip);
    e.core.pods.put(pod.build());
    let before = reads();
    let report = handle(e, &exporter_event(name, "Started", json!({"app": app}))).await;
    (reads() - before, report)
}

/// A pass that re-read a group's tags (its cached binding was older than
/// `binding_max_age`) leaves that read for the events after it: one event's pass costs
/// no Describe call for tags that were read a second ago.
#[tokio::test]
async fn a_tag_read_made_for_one_event_serves_the_next() {
    let (e, clock) = super::tests::fake_engine(FakePods::default(), web_group(), 3);
    started(&e, "web", "web-1", "10.0.1.1").await;
    clock.advance(6_000);
    assert_eq!(
        started(&e, "web", "web-2", "10.0.1.2").await.0,
        1,
        "the discovery is 6 s old: the pass re-reads the tags before it changes the group"
    );
    clock.advance(1_000);
    assert_eq!(
        started(&e, "web", "web-3", "10.0.1.3").await.0,
        0,
        "the previous event's read is 1 s old and stands in for this pass's"
    );
    assert_eq!(
        live(&e, TG),
        ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"]
    );
}

/// A re-read of one group's tags names the container's other bound groups of its
/// account in the same DescribeTags: a pass of another group a second later finds their
/// read fresh and acts without a Describe of its own; a group whose tags changed
/// meanwhile is never served from that read: the read lets it go from the bound index
/// (until a discovery binds it again), so its pods are not acted on.
#[tokio::test]
async fn a_tag_read_for_one_group_serves_the_other_groups_of_its_account() {
    let elb = engine_groups();
    let third = OTHER.replace("api/1", "db/2");
    elb.add_group(bound_group(&third, "demo", "shop", "app=db", 8080));
    let (e, clock) = super::tests::fake_engine(FakePods::default(), elb, 3);
    started(&e, "web", "web-1", "10.0.1.1").await;
    clock.advance(6_000);
    // The third group is unbound by hand after discovery.
    e.core.groups.set_tag(&third, "tgsync/cluster", None);
    assert_eq!(
        started(&e, "web", "web-2", "10.0.1.2").await.0,
        1,
        "one DescribeTags for the three groups"
    );
    clock.advance(1_000);
    assert_eq!(
        started(&e, "api", "api-1", "10.0.2.1").await.0,
        0,
        "the web group's re-read a second ago read the api group's tags too"
    );
    assert_eq!(live(&e, OTHER), ["10.0.2.1:8080"]);
    let (reads, report) = started(&e, "db", "db-1", "10.0.3.1").await;
    assert_eq!(
        reads, 0,
        "a group the re-read found unbound is not read again"
    );
    assert!(live(&e, &third).is_empty(), "the unbound group was changed");
    assert!(
        report.group(&third).is_none(),
        "the unbound group is no longer among the bound: {report:?}"
    );
}

/// One deleted group fails a DescribeTags that names it: the re-read asks for its own
/// group alone, and leaves the groups it named out of later re-reads, so the deleted
/// group costs one extra call, not one per re-read until discovery drops it.
#[tokio::test]
async fn a_deleted_group_costs_a_re_read_one_extra_call() {
    let (e, clock) = super::tests::fake_engine(FakePods::default(), engine_groups(), 3);
    started(&e, "web", "web-1", "10.0.1.1").await;
    e.core.groups.delete_group(OTHER);
    for (i, want) in [(2, 2), (3, 1)] {
        clock.advance(6_000);
        let (name, ip) = (format!("web-{i}"), format!("10.0.1.{i}"));
        let reads = started(&e, "web", &name, &ip).await.0;
        assert_eq!(reads, want, "DescribeTags for {name}'s pass");
    }
    assert_eq!(
        live(&e, TG),
        ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"]
    );
}

/// Once the state table's index records this cluster's bound groups (the first event's
/// discovery wrote it), a later event takes its namespace's groups from the bound index
/// as of that index's generation instead of discovering every group of the account
/// again; its pass re-reads the tags it acts on (one DescribeTags). A bound group that
/// holds none of this cluster's targets yet is in the index too: its pod is registered
/// at once, not left to the schedule.
#[tokio::test]
async fn an_event_reads_its_namespaces_groups_from_the_index_of_bound_groups() {
    let elb = engine_groups();
    for i in 0..60 {
        let arn = OTHER.replace("api/1", &format!("other-{i}/2"));
        elb.add_group(bound_group(&arn, "demo", &format!("ns-{i}"), "app=x", 8080));
    }
    let (e, clock) = super::tests::fake_engine(FakePods::default(), elb, 3);
    let calls = |name| e.core.groups.calls().get(name).copied().unwrap_or(0);
    // The index is empty: the first event discovers, and records every bound group.
    started(&e, "web", "web-1", "10.0.1.1").await;
    assert_eq!(calls("DescribeTargetGroups"), 1);
    clock.advance(61_000);
    let (tags, report) = started(&e, "web", "web-2", "10.0.1.2").await;
    assert_eq!(report.group(TG).map(|g| g.outcome), Some(Outcome::Changed));
    assert_eq!(
        calls("DescribeTargetGroups"),
        1,
        "no second discovery: the index names the namespace's groups"
    );
    assert_eq!(
        tags, 1,
        "one DescribeTags: the pass re-read the web group's tags"
    );
    assert_eq!(live(&e, TG), ["10.0.1.1:8080", "10.0.1.2:8080"]);
    let before = e.core.groups.calls();
    let pod = PodBuilder::new("ns-7", "x-1")
        .label("app", "x")
        .ip("10.0.9.1");
    e.core.pods.put(pod.build());
    let mut ev = exporter_event("x-1", "Started", json!({"app": "x"}));
    ev["detail"]["involvedObject"]["namespace"] = json!("ns-7");
    let report = handle(&e, &ev).await;
    let other7 = OTHER.replace("api/1", "other-7/2");
    assert_eq!(
        report.group(&other7).map(|g| g.outcome),
        Some(Outcome::Changed),
        "{report:#?}"
    );
    assert_eq!(live(&e, &other7), ["10.0.9.1:8080"]);
    assert_eq!(
        calls("DescribeTargetGroups"),
        before.get("DescribeTargetGroups").copied().unwrap_or(0),
        "a bound group that held no targets yet is served without a discovery"
    );
}

/// A group deleted while still in the index fails its companions' DescribeTags: the
/// event is served (the re-read asks for its own group alone), not failed, and without
/// a discovery.
#[tokio::test]
async fn a_deleted_group_in_the_index_falls_back_to_discovery() {
    let (e, clock) = super::tests::fake_engine(FakePods::default(), engine_groups(), 3);
    let calls = |name| e.core.groups.calls().get(name).copied().unwrap_or(0);
    started(&e, "web", "web-1", "10.0.1.1").await;
    started(&e, "api", "api-1", "10.0.2.1").await;
    e.core.groups.delete_group(OTHER);
    clock.advance(61_000);
    let (_, report) = started(&e, "web", "web-2", "10.0.1.2").await;
    assert_eq!(
        report.group(TG).map(|g| g.outcome),
        Some(Outcome::Changed),
        "{report:#?}"
    );
    assert_eq!(calls("DescribeTargetGroups"), 1, "no second discovery");
    assert_eq!(live(&e, TG), ["10.0.1.1:8080", "10.0.1.2:8080"]);
}

/// A pod event whose change is not applied when the invocation ends (its registration
/// failed, so the group backs off) hands the change on: the group's `dirty` flag and
/// the cluster index's record of requests, which the next watching run serves first.
#[tokio::test]
async fn a_change_not_applied_is_handed_on() {
    let e = engine();
    e.core.pods.put(web("web-7", "10.0.1.7").build());
    e.core.groups.set_failing_mutations(true);
    let r = handle(
        &e,
        &exporter_event("web-7", "Started", json!({"app": "web"})),
    )
    .await;
    assert!(live(&e, TG).is_empty(), "the registration failed");
    assert_eq!(r.handed_on, [TG], "{r:#?}");
    let meta = crate::state::StateStore::index_meta(&e.core.state, "demo")
        .await
        .unwrap();
    assert!(
        meta.requested.contains(TG),
        "the next run is asked to serve the group first: {meta:?}"
    );
    assert!(
        e.core.state.stored(TG).dirty,
        "whoever next holds the lease serves it"
    );
}

/// A pod event whose change was neither applied nor handed on (the state table cannot
/// be read or written) answers an error, so Lambda retries the event and the dead-letter
/// queue keeps it when it keeps failing.
#[tokio::test]
async fn a_change_neither_applied_nor_handed_on_is_an_error() {
    let e = engine();
    e.core.pods.put(web("web-7", "10.0.1.7").build());
    e.core.state.set_failing(true);
    let Parsed::Pod(p) = parse(
        &exporter_event("web-7", "Started", json!({"app": "web"})),
        "demo",
    ) else {
        panic!("not a pod event");
    };
    let answer = e
        .pod_event(&p, Duration::ZERO, &RunOptions::default())
        .await;
    assert!(live(&e, TG).is_empty());
    let err = answer.expect_err("the event must be retried");
    assert!(err.to_string().contains(TG), "{err}");
}
