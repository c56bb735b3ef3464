//! Watch mode over real HTTP: the resync's full diff, then a WATCH of the bound
//! namespaces through the Kubernetes API emulator (chunked `{"type","object"}` lines,
//! bookmarks, 410 Expired), with the production adapters against moto. Pods change while
//! one invocation watches, and no pod event is sent: the watch alone must act.

#[path = "support/chaos_proxy.rs"]
mod chaos_proxy;
#[path = "support/invocation.rs"]
mod invocation;
#[path = "support/moto.rs"]
mod moto;
#[path = "support/world.rs"]
mod world;

use std::time::{Duration, Instant};

use tgsync::clock::Clock as _;
use tgsync::reconcile::RunOptions;
use tgsync::testkit::{PodBuilder, set_condition};
use world::World;

fn web(name: &str, ip: &str) -> PodBuilder {
    PodBuilder::new("shop", name).label("app", "web").ip(ip)
}

fn scheduled() -> RunOptions {
    RunOptions {
        use_checkpoint: true,
        ..RunOptions::default()
    }
}

/// Waits (up to 10 s) until the group's targets are `want`; how long it took.
async fn until_targets(w: &World, arn: &str, want: &[&str]) -> Duration {
    invocation::until_targets(w, arn, want, Duration::from_secs(10)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_watching_invocation_follows_every_pod_transition() {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-1", "10.0.1.1").build());
    w.put_pod(web("web-2", "10.0.1.2").ready(false).build());
    w.put_pod(web("web-3", "10.0.1.3").build());
    let until = w.clock.now().plus(Duration::from_secs(12));
    let opts = scheduled();
    let watching = w.engine.run_scheduled(&opts, until);
    let changes = async {
        until_targets(&w, &arn, &["10.0.1.1:8080", "10.0.1.3:8080"]).await;
        let store = w.emulator.store();
        // Ready: registered.
        store.update_pod("shop", "web-2", |p| set_condition(p, "Ready", true));
        let ready = until_targets(
            &w,
            &arn,
            &["10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"],
        )
        .await;
        // NotReady: deregistered.
        store.update_pod("shop", "web-1", |p| set_condition(p, "Ready", false));
        let not_ready = until_targets(&w, &arn, &["10.0.1.2:8080", "10.0.1.3:8080"]).await;
        // Terminating: deregistered.
        store.set_terminating("shop", "web-2");
        let terminating = until_targets(&w, &arn, &["10.0.1.3:8080"]).await;
        // Deleted at once: deregistered.
        store.delete_pod("shop", "web-3");
        let deleted = until_targets(&w, &arn, &[]).await;
        eprintln!(
            "watch reacted: ready {ready:?}, not ready {not_ready:?}, terminating {terminating:?}, deleted {deleted:?}"
        );
    };
    let (report, ()) = tokio::join!(watching, changes);
    let watch = report.watch.expect("a watching run reports its watch");
    assert!(watch.events >= 4, "{watch:#?}");
    assert_eq!(watch.registered, 1, "{watch:#?}");
    assert_eq!(watch.deregistered, 3, "{watch:#?}");
    assert!(watch.errors.is_empty(), "{watch:#?}");
    assert!(w.ledger(&arn).await.is_empty());
    // Only the watch's own requests: no pod GET (that is what pod-events does).
    assert!(
        w.emulator
            .faults()
            .requests()
            .iter()
            .all(|r| r.method != "GET" || r.path().ends_with("/pods")),
        "{:?}",
        w.emulator.faults().requests()
    );
}

/// A 410 Expired in the middle of the watch (the version to resume from was compacted
/// away) makes the watch list again and reconcile the namespace: a change made while the
/// watch could not follow is not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_mid_watch_lists_again_and_converges() {
    let mut w = World::new().await;
    // Streams of 2 s, so the watch resumes within the test.
    w.engine.core.settings.watch_request = Duration::from_secs(2);
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-1", "10.0.1.1").build());
    let until = w.clock.now().plus(Duration::from_secs(10));
    let opts = scheduled();
    let watching = w.engine.run_scheduled(&opts, until);
    let changes = async {
        until_targets(&w, &arn, &["10.0.1.1:8080"]).await;
        // While the first stream is open: its resume is told the version is too old
        // (compacted away), and a pod comes meanwhile.
        w.emulator.faults().expire_next_watch();
        w.put_pod(web("web-2", "10.0.1.2").build());
        until_targets(&w, &arn, &["10.0.1.1:8080", "10.0.1.2:8080"]).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        // And after the fresh LIST, the watch follows again.
        w.emulator.store().delete_pod("shop", "web-1");
        until_targets(&w, &arn, &["10.0.1.2:8080"]).await;
    };
    let (report, ()) = tokio::join!(watching, changes);
    let watch = report.watch.expect("watch report");
    assert!(watch.relisted >= 1, "{watch:#?}");
    assert_eq!(w.ledger(&arn).await, ["10.0.1.2:8080"]);
}

/// A watch cut off mid-stream, again and again, never deregisters a target that is
/// still desired: it resumes and acts only on what the API says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_cut_off_mid_stream_deregisters_nothing_still_desired() {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    for i in 1..=4 {
        w.put_pod(web(&format!("web-{i}"), &format!("10.0.1.{i}")).build());
    }
    let all = [
        "10.0.1.1:8080",
        "10.0.1.2:8080",
        "10.0.1.3:8080",
        "10.0.1.4:8080",
    ];
    let until = w.clock.now().plus(Duration::from_secs(8));
    let opts = scheduled();
    // The first stream (opened as soon as the full diff has listed the namespace) is
    // cut after its first event; each round arms the cut for the stream after it.
    w.emulator.faults().cut_watch_after(1);
    let watching = w.engine.run_scheduled(&opts, until);
    let changes = async {
        until_targets(&w, &arn, &all).await;
        for round in 0..6 {
            w.emulator.faults().cut_watch_after(1);
            // A change that is no change for the group (an annotation), then a cut.
            w.emulator.store().update_pod("shop", "web-1", |p| {
                p.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert("round".into(), round.to_string());
            });
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(w.targets(&arn).await, all, "round {round}");
        }
    };
    let (report, ()) = tokio::join!(watching, changes);
    let watch = report.watch.expect("watch report");
    assert!(
        watch.resumed >= 1,
        "the stream was cut and resumed: {watch:#?}"
    );
    assert_eq!(watch.deregistered, 0, "{watch:#?}");
    assert_eq!(w.targets(&arn).await, all);
}

/// The schedule is at-least-once and one invocation hands over to the next: two
/// watching invocations at once, with pods coming and going, must neither register a
/// deleted pod again nor register a pod twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_overlapping_watching_invocations_stay_correct() {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-0", "10.0.1.100").build());
    let second = world::build_engine(
        &w.cluster,
        &w.sdk,
        &w.emulator,
        &w.table,
        &w.clock,
        world::Creds::default().provider(),
    )
    .with_owner_prefix("resync-2");
    let until = w.clock.now().plus(Duration::from_secs(10));
    let opts = scheduled();
    let first_watch = w.engine.run_scheduled(&opts, until);
    let second_watch = second.run_scheduled(&opts, until);
    let churn = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        for i in 1..=12u32 {
            let name = format!("web-{i}");
            w.put_pod(web(&name, &format!("10.0.1.{i}")).build());
            tokio::time::sleep(Duration::from_millis(150)).await;
            if i % 2 == 0 {
                w.emulator.store().delete_pod("shop", &name);
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    };
    let (a, b, ()) = tokio::join!(first_watch, second_watch, churn);
    let mut want: Vec<String> = (1..=12u32)
        .filter(|i| i % 2 == 1)
        .map(|i| format!("10.0.1.{i}:8080"))
        .chain(std::iter::once("10.0.1.100:8080".to_owned()))
        .collect();
    want.sort();
    assert_eq!(
        w.targets(&arn).await,
        want,
        "deleted pods left or live pods missing"
    );
    assert_eq!(w.ledger(&arn).await, want);
    // No target registered twice across the two invocations (full diffs and watches).
    let mut registered: Vec<String> = Vec::new();
    for report in [&a, &b] {
        let watch = report.watch.as_ref().expect("watch report");
        // A pass that was both the full diff's look and a pod change's (a change seen
        // during discovery, or while the look waited) is in both lists: counted once.
        let changes = watch.changes.iter().filter(|c| !report.groups.contains(c));
        for g in report.groups.iter().chain(changes) {
            registered.extend(g.registered.iter().map(ToString::to_string));
        }
    }
    let total = registered.len();
    registered.sort();
    registered.dedup();
    assert_eq!(total, registered.len(), "a target was registered twice");
    let met = w.engine.core.state.leases_found_held() + second.core.state.leases_found_held();
    eprintln!("{total} registrations; the two invocations met on the lease {met} times");
}

/// How long the NLB keeps a new target `initial` in these tests (the proxy's pace).
const INITIAL_FOR: Duration = Duration::from_secs(3);

/// A world whose engine reaches ELBv2 through a proxy that keeps new targets `initial`
/// for [`INITIAL_FOR`], as an NLB does until its health checks pass.
async fn paced_world() -> (World, chaos_proxy::ChaosProxy) {
    proxied_world(
        |r| r.initial_for = Some(INITIAL_FOR),
        tgsync::reconcile::EngineSettings::default(),
    )
    .await
}

/// A world whose engine (with `settings`) reaches AWS through a fault-free proxy with
/// these `rules`.
async fn proxied_world(
    rules: impl FnOnce(&mut chaos_proxy::Rules),
    settings: tgsync::reconcile::EngineSettings,
) -> (World, chaos_proxy::ChaosProxy) {
    let mut w = World::new().await;
    let proxy = chaos_proxy::ChaosProxy::start(
        moto::endpoint(),
        chaos_proxy::Chaos {
            fault_share: 0.0,
            seed: 1,
        },
    )
    .await;
    proxy.set_rules(rules);
    w.engine = chaos_proxy::engine(
        &w,
        &chaos_proxy::sdk_config(&proxy).await,
        tgsync::aws::MutationRate::new(50, None).unwrap(),
    )
    .with_settings(settings);
    (w, proxy)
}

/// When the proxy first forwarded a RegisterTargets naming `ip`.
fn registered_at(proxy: &chaos_proxy::ChaosProxy, ip: &str) -> Option<Instant> {
    registered_in(proxy, "", ip)
}

/// When the proxy first forwarded a RegisterTargets of group `arn` naming `ip`.
fn registered_in(proxy: &chaos_proxy::ChaosProxy, arn: &str, ip: &str) -> Option<Instant> {
    proxy
        .records()
        .into_iter()
        .find(|r| {
            let body = chaos_proxy::percent_decode(&r.body);
            r.operation == "RegisterTargets" && body.contains(arn) && body.contains(ip)
        })
        .map(|r| r.at)
}

/// The DescribeTargetHealth requests the proxy forwarded from its `from`th record on:
/// when each arrived, and its form body decoded (it names the group).
fn health_reads(proxy: &chaos_proxy::ChaosProxy, from: usize) -> Vec<(Instant, String)> {
    proxy
        .records()
        .into_iter()
        .skip(from)
        .filter(|r| r.operation == "DescribeTargetHealth")
        .map(|r| (r.at, chaos_proxy::percent_decode(&r.body)))
        .collect()
}

/// How long the slower of two listeners' groups keeps a new target `initial`.
const SLOW_INITIAL: Duration = Duration::from_secs(12);

/// Two listeners' groups (8080, 8443) that select the same pods; the NLB keeps new
/// targets `initial` [`INITIAL_FOR`] in the first and [`SLOW_INITIAL`] in the second.
async fn two_listeners(w: &World, proxy: &chaos_proxy::ChaosProxy) -> (String, String) {
    let fast = w.group("shop", "app=web", 8080, &[]).await;
    let slow = w.group("shop", "app=web", 8443, &[]).await;
    let needle = slow.clone();
    proxy.set_rules(|r| r.initial_for_group = vec![(needle, SLOW_INITIAL)]);
    (fast, slow)
}

/// A gate's condition is written only when it changes: never the same condition twice
/// in a row.
fn assert_each_write_changed<T: PartialEq + std::fmt::Debug>(writes: &[T]) {
    for pair in writes.windows(2) {
        assert_ne!(
            pair[0], pair[1],
            "the same condition written twice: {writes:#?}"
        );
    }
}

/// The `tgsync/target-health` condition (status, reason, message) of every stored
/// version of the pod that has one, oldest first: one per write of the condition.
fn gate_writes(w: &World, name: &str) -> Vec<(String, String, String)> {
    w.emulator
        .store()
        .versions_of("shop", name)
        .into_iter()
        .filter_map(|pod| {
            pod.status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "tgsync/target-health")
                .map(|c| {
                    (
                        c.status,
                        c.reason.unwrap_or_default(),
                        c.message.unwrap_or_default(),
                    )
                })
        })
        .collect()
}

/// The name of the group `arn` (as messages show it).
fn group_name(arn: &str) -> &str {
    arn.split('/').nth(1).unwrap_or(arn)
}

/// Waits (up to 30 s) until the pod's `tgsync/target-health` condition is True.
async fn gate_open(w: &World, name: &str) -> Instant {
    let started = Instant::now();
    loop {
        let pod = w
            .emulator
            .store()
            .get_pod("shop", name)
            .expect("pod exists");
        let open = pod
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "tgsync/target-health" && c.status == "True");
        if open {
            return Instant::now();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "gate never opened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The sample `pod-started` event for pod `name` of this world's cluster.
fn pod_started(w: &World, name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(format!(
        "{}/events/pod-started.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let mut ev: serde_json::Value = serde_json::from_str(&text).unwrap();
    ev["detail"]["clusterName"] = serde_json::json!(w.cluster);
    ev["detail"]["involvedObject"]["name"] = serde_json::json!(name);
    ev
}

fn gated(name: &str, ip: &str) -> k8s_openapi::api::core::v1::Pod {
    let mut pod = web(name, ip).gated().build();
    set_condition(&mut pod, "Ready", false);
    pod
}

/// Watch mode opens a readiness gate within 5 s of the NLB reporting the target
/// healthy, never before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_mode_opens_a_gate_within_seconds_of_healthy() {
    let (w, proxy) = paced_world().await;
    w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(gated("web-g", "10.0.1.9"));
    let until = w.clock.now().plus(Duration::from_secs(12));
    let opts = scheduled();
    let watching = w.engine.run_scheduled(&opts, until);
    let timing = async {
        let opened = gate_open(&w, "web-g").await;
        let registered = registered_at(&proxy, "10.0.1.9").expect("registered");
        let healthy = registered + INITIAL_FOR;
        assert!(
            opened >= healthy,
            "the gate opened before the target was healthy"
        );
        opened - healthy
    };
    let (report, after_healthy) = tokio::join!(watching, timing);
    eprintln!("gate opened {after_healthy:?} after the target turned healthy");
    assert!(after_healthy <= Duration::from_secs(5), "{after_healthy:?}");
    let watch = report.watch.expect("watch report");
    assert_eq!(watch.gates_opened, ["shop/web-g"], "{watch:#?}");
}

/// pod-events, for a gated pod it registered, waits for the NLB and opens the gate in
/// the same invocation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_events_opens_the_gate_of_the_pod_it_registered() {
    let (w, proxy) = paced_world().await;
    w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(gated("web-g", "10.0.1.9"));
    let ev = pod_started(&w, "web-g");
    let deadline = w.clock.now().plus(Duration::from_secs(60));
    let out = tgsync::handlers::pod_events::handle(&w.engine, &ev, Duration::ZERO, Some(deadline))
        .await
        .expect("handled");
    let opened = gate_open(&w, "web-g").await;
    let healthy = registered_at(&proxy, "10.0.1.9").expect("registered") + INITIAL_FOR;
    assert!(opened >= healthy);
    assert_eq!(
        out["groups"][0]["gatesOpened"],
        serde_json::json!(["shop/web-g"]),
        "{out}"
    );
}

/// A pod behind two listeners: its gate opens only once its target is healthy in both
/// groups (not when the faster one says so), and meanwhile says what it waits for,
/// written only when that changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_waits_for_every_group_that_selects_the_pod() {
    let (w, proxy) = paced_world().await;
    let (fast, slow) = two_listeners(&w, &proxy).await;
    w.put_pod(gated("web-g", "10.0.1.9"));
    let until = w.clock.now().plus(Duration::from_secs(22));
    let opts = scheduled();
    let watching = w.engine.run_scheduled(&opts, until);
    let (report, opened) = tokio::join!(watching, gate_open(&w, "web-g"));
    let healthy_fast = registered_in(&proxy, &fast, "10.0.1.9").expect("registered") + INITIAL_FOR;
    let healthy_slow = registered_in(&proxy, &slow, "10.0.1.9").expect("registered") + SLOW_INITIAL;
    assert!(
        opened >= healthy_slow,
        "the gate opened {:?} before the target was healthy in the slower group ({:?} after the faster)",
        healthy_slow - opened,
        opened.saturating_duration_since(healthy_fast),
    );
    eprintln!(
        "gate opened {:?} after the slower group said healthy, {:?} after the faster",
        opened - healthy_slow,
        opened - healthy_fast
    );
    assert!(opened - healthy_slow <= Duration::from_secs(5));
    let watch = report.watch.expect("watch report");
    assert_eq!(watch.gates_opened, ["shop/web-g"], "{watch:#?}");
    let writes = gate_writes(&w, "web-g");
    // While it waited, the condition said why, in ELBv2's words, naming the group.
    let (fast_name, slow_name) = (group_name(&fast), group_name(&slow));
    assert!(
        writes
            .iter()
            .any(|(status, reason, message)| status == "False"
                && reason == "ElbRegistrationInProgress"
                && message.contains(&format!(
                    "10.0.1.9:8443 in {slow_name}: initial (Elb.RegistrationInProgress"
                ))
                && !message.contains(fast_name)),
        "{writes:#?}"
    );
    assert_eq!(
        writes.last().map(|w| w.0.as_str()),
        Some("True"),
        "{writes:#?}"
    );
    // Written only when it changed: never the same condition twice in a row, and a
    // handful of writes over ~15 s of polling.
    assert_each_write_changed(&writes);
    assert!(writes.len() <= 5, "{writes:#?}");
}

/// A closed gate says why: a target failing its health checks in one group keeps the
/// gate False with `Target.FailedHealthChecks`, written once, not on every poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_gate_says_why_and_is_written_only_when_that_changes() {
    let (w, proxy) = paced_world().await;
    let (_, slow) = two_listeners(&w, &proxy).await;
    proxy.set_rules(|r| r.unhealthy = vec!["10.0.1.9:8443".to_owned()]);
    w.put_pod(gated("web-g", "10.0.1.9"));
    let until = w.clock.now().plus(Duration::from_secs(10));
    let report = w.engine.run_scheduled(&scheduled(), until).await;
    let watch = report.watch.expect("watch report");
    assert!(watch.gates_opened.is_empty(), "{watch:#?}");
    let writes = gate_writes(&w, "web-g");
    let (status, reason, message) = writes.last().cloned().expect("the gate was written");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "TargetFailedHealthChecks"),
        "{writes:#?}"
    );
    assert!(
        message.contains(&format!(
            "10.0.1.9:8443 in {}: unhealthy (Target.FailedHealthChecks: Health checks failed)",
            group_name(&slow)
        )),
        "{message}"
    );
    assert_each_write_changed(&writes);
    // At most: not registered yet / registering, the faster group turning healthy, and
    // the failing one — not one per poll over the 10 s.
    assert!(writes.len() <= 4, "{writes:#?}");
    let patches = w
        .emulator
        .faults()
        .requests()
        .into_iter()
        .filter(|q| q.method == "PATCH")
        .count();
    assert_eq!(patches, writes.len(), "every PATCH wrote a change");
}

/// pod-events, for a gated pod behind two listeners, opens the gate only once the
/// slower group says healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_events_waits_for_every_group_before_opening_the_gate() {
    let (w, proxy) = paced_world().await;
    let (_, slow) = two_listeners(&w, &proxy).await;
    w.put_pod(gated("web-g", "10.0.1.9"));
    let ev = pod_started(&w, "web-g");
    let deadline = w.clock.now().plus(Duration::from_secs(60));
    let out = tgsync::handlers::pod_events::handle(&w.engine, &ev, Duration::ZERO, Some(deadline))
        .await
        .expect("handled");
    let opened = gate_open(&w, "web-g").await;
    let healthy_slow = registered_in(&proxy, &slow, "10.0.1.9").expect("registered") + SLOW_INITIAL;
    assert!(
        opened >= healthy_slow,
        "the gate opened {:?} before the slower group said healthy: {out}",
        healthy_slow - opened
    );
    let opened_in: Vec<_> = out["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["gatesOpened"] == serde_json::json!(["shop/web-g"]))
        .collect();
    assert_eq!(opened_in.len(), 1, "{out}");
}

/// pod-events and the watching resync agree on which groups are bound: a second group
/// tagged for the same pods after pod-events' container was warm, and discovered (and
/// filled) by the next scheduled run, keeps a new gated pod's gate closed — whichever
/// function settles it — until the pod's target is healthy there too. (pod-events once
/// read its groups from a private cache refreshed every 60 s, and opened such a gate on
/// the first group alone.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_tagged_after_pod_events_started_holds_the_gate_in_every_function() {
    let (w, proxy) = paced_world().await;
    let first = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-1", "10.0.1.1").build());
    // The schedule discovers the first group; pod-events' container gets warm on it.
    let until = w.clock.now().plus(Duration::from_secs(2));
    w.engine.run_scheduled(&scheduled(), until).await;
    let pod_events = chaos_proxy::engine(
        &w,
        &chaos_proxy::sdk_config(&proxy).await,
        tgsync::aws::MutationRate::new(50, None).unwrap(),
    )
    .with_owner_prefix("pod-events");
    let deadline = || w.clock.now().plus(Duration::from_secs(60));
    let warm = tgsync::handlers::pod_events::handle(
        &pod_events,
        &pod_started(&w, "web-1"),
        Duration::ZERO,
        Some(deadline()),
    )
    .await
    .expect("handled");
    assert_eq!(warm["groups"].as_array().map(Vec::len), Some(1), "{warm}");
    // A second listener's group is tagged for the same pods; the NLB keeps its new
    // targets initial for 12 s.
    let second = w.group("shop", "app=web", 8443, &[]).await;
    let needle = second.clone();
    proxy.set_rules(|r| r.initial_for_group = vec![(needle, SLOW_INITIAL)]);
    // The next scheduled run discovers it and fills it, watching.
    let until = w.clock.now().plus(Duration::from_secs(25));
    let opts = scheduled();
    let watching = w.engine.run_scheduled(&opts, until);
    let gated_pod = async {
        while registered_in(&proxy, &second, "10.0.1.1").is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A new gated pod: both functions see it (the watch, and its Started event).
        w.put_pod(gated("web-g", "10.0.1.9"));
        let out = tgsync::handlers::pod_events::handle(
            &pod_events,
            &pod_started(&w, "web-g"),
            Duration::ZERO,
            Some(deadline()),
        )
        .await
        .expect("handled");
        let opened = gate_open(&w, "web-g").await;
        (out, opened)
    };
    let (_, (out, opened)) = tokio::join!(watching, gated_pod);
    let healthy_first =
        registered_in(&proxy, &first, "10.0.1.9").expect("registered") + INITIAL_FOR;
    let healthy_second =
        registered_in(&proxy, &second, "10.0.1.9").expect("registered") + SLOW_INITIAL;
    assert!(
        opened >= healthy_second,
        "the gate opened {:?} before the target was healthy in the second group ({:?} after the first)",
        healthy_second - opened,
        opened.saturating_duration_since(healthy_first)
    );
    eprintln!(
        "gate opened {:?} after the second group said healthy",
        opened - healthy_second
    );
    // The race: pod-events' container was warm before the second group was bound, and
    // its event acted in that group too.
    let named: Vec<&str> = out["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["targetGroupArn"].as_str())
        .collect();
    assert!(
        named.contains(&second.as_str()),
        "pod-events knew only {named:?}: {out}"
    );
}

/// A scheduled run whose full diff has no time to look at every group leaves the rest
/// to the next run, and the next run of the warm container starts with them. Here each
/// DescribeTargetHealth takes 0.4 s and the groups are looked at one at a time, so a 2-s
/// run reaches a few of the 12 groups: every run must leave fewer groups without their
/// pod than the run before, until none is (in one fixed order, the same first groups
/// would be looked at every run and the last ones never).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_diff_cut_short_goes_on_where_it_stopped_in_the_next_run() {
    let (w, _proxy) = proxied_world(
        |r| {
            r.delay = vec![(
                "DescribeTargetHealth".into(),
                String::new(),
                Duration::from_millis(400),
            )];
        },
        tgsync::reconcile::EngineSettings {
            concurrency: 1,
            ..Default::default()
        },
    )
    .await;
    let mut arns = Vec::new();
    for i in 0..12u8 {
        arns.push(w.group("shop", &format!("app=svc{i}"), 8080, &[]).await);
        w.put_pod(
            PodBuilder::new("shop", &format!("svc{i}"))
                .label("app", &format!("svc{i}"))
                .ip(&format!("10.0.7.{i}"))
                .build(),
        );
    }
    let opts = scheduled();
    let mut cut_short = 0;
    let mut before = arns.len();
    for run in 1..=15 {
        let until = w.clock.now().plus(Duration::from_secs(2));
        let report = w.engine.run_scheduled(&opts, until).await;
        let deferred = report
            .groups
            .iter()
            .filter(|g| g.outcome == tgsync::report::Outcome::Deferred)
            .count();
        cut_short += usize::from(deferred > 0);
        let mut empty = 0;
        for (i, arn) in arns.iter().enumerate() {
            empty += usize::from(w.targets(arn).await != [format!("10.0.7.{i}:8080")]);
        }
        eprintln!("run {run}: {deferred} groups deferred, {empty} still without their pod");
        assert!(
            empty < before,
            "run {run} reached no group it had not reached before ({empty} still without their pod)"
        );
        before = empty;
        if empty == 0 {
            // The race this is about happened: a run ran out of time before its full diff
            // had looked at every group.
            assert!(
                cut_short > 0,
                "no run was cut short; the test proves nothing"
            );
            return;
        }
    }
    panic!("after 15 runs some groups were still never looked at");
}

/// A cold container's full diff serves a just-bound group (its pod never registered)
/// before it re-verifies the fleet at rest: the re-verifications due this run each wait
/// for a Describe, while a group not due costs one state read, so the groups not due go
/// first (with the due ones first, the new group waited for every due Describe: at
/// 1,000 groups and the template's budgets, a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_just_bound_group_is_served_before_the_fleets_re_verifications() {
    let period = Duration::from_secs(60);
    let settings = tgsync::reconcile::EngineSettings {
        concurrency: 1,
        // Six re-verifications per run.
        verify_describes_per_second: 6.0 / period.as_secs_f64(),
        schedule_period: period,
        ..Default::default()
    };
    let (w, proxy) = proxied_world(
        |r| {
            r.delay = vec![(
                "DescribeTargetHealth".into(),
                String::new(),
                Duration::from_millis(300),
            )];
        },
        settings.clone(),
    )
    .await;
    let mut at_rest = Vec::new();
    for i in 0..17u8 {
        at_rest.push(w.group("shop", &format!("app=idle{i}"), 8080, &[]).await);
    }
    w.verified_empty(&at_rest).await;
    let web = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(
        PodBuilder::new("shop", "web-1")
            .label("app", "web")
            .ip("10.0.1.1")
            .build(),
    );
    // A run in which the new group is not due for re-verification itself.
    let all: Vec<&str> = at_rest
        .iter()
        .map(String::as_str)
        .chain([web.as_str()])
        .collect();
    let due_now = w.skip_to_a_run_not_re_verifying(&web, &all, &settings);
    let until = w.clock.now().plus(Duration::from_secs(6));
    let report = w.engine.run_scheduled(&scheduled(), until).await;
    let registered = registered_in(&proxy, &web, "10.0.1.1").expect("web-1 was registered");
    let describes = health_reads(&proxy, 0);
    let re_verified = |before: bool| {
        describes
            .iter()
            .filter(|(at, body)| {
                (*at < registered) == before && due_now.iter().any(|arn| body.contains(arn))
            })
            .count()
    };
    eprintln!(
        "due this run: {}; re-verified before web-1's registration: {}, after: {}",
        due_now.len(),
        re_verified(true),
        re_verified(false)
    );
    // The race this is about: the run did re-verify the due groups.
    assert_eq!(
        re_verified(true) + re_verified(false),
        due_now.len(),
        "the due groups were not all re-verified: {}",
        report.totals.verification_skipped
    );
    assert_eq!(
        re_verified(true),
        0,
        "web-1 waited for re-verifications of groups at rest"
    );
}

/// A pod change for a group whose full-diff verification waits for its first Describe
/// makes that verification stand down: the change's pass reads the group's health once,
/// for the pods as they are now, and is the full diff's look at the group. (Promoted
/// instead, the verification read the health for the pods as they were, and the
/// change's pass read it again, a paced call later.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_during_its_groups_queued_verification_reads_health_once() {
    const GROUPS: usize = 24;
    let settings = tgsync::reconcile::EngineSettings {
        // Every group's verification in flight at once, waiting for the paced Describes.
        concurrency: 64,
        ..Default::default()
    };
    let (w, proxy) = proxied_world(|_| {}, settings).await;
    let mut arns = Vec::new();
    for i in 0..GROUPS {
        let app = format!("svc{i}");
        arns.push(w.group("shop", &format!("app={app}"), 8080, &[]).await);
        w.put_pod(
            PodBuilder::new("shop", &format!("{app}-0"))
                .label("app", &app)
                .ip(&format!("10.0.2.{i}"))
                .build(),
        );
    }
    let first = w.engine.resync(&RunOptions::default()).await;
    assert_eq!(first.totals.registered, GROUPS, "{first:#?}");
    let before = proxy.records().len();
    let until = w.clock.now().plus(Duration::from_secs(8));
    let opts = scheduled();
    let watching = w.engine.run_scheduled(&opts, until);
    let change = async {
        // Once the full diff has read two groups' health, a group it has not read yet.
        let started = Instant::now();
        let (i, arn) = loop {
            let read = health_reads(&proxy, before);
            if read.len() >= 2 {
                let unread = arns
                    .iter()
                    .enumerate()
                    .find(|(_, arn)| read.iter().all(|(_, body)| !body.contains(arn.as_str())));
                break unread.expect("a group not read yet");
            }
            assert!(started.elapsed() < Duration::from_secs(10), "no full diff");
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        w.emulator
            .store()
            .update_pod("shop", &format!("svc{i}-0"), |p| {
                set_condition(p, "Ready", false)
            });
        let changed_at = Instant::now();
        until_targets(&w, arn, &[]).await;
        (arn.clone(), changed_at)
    };
    let (report, (arn, changed_at)) = tokio::join!(watching, change);
    let read = health_reads(&proxy, before);
    let of_group: Vec<Instant> = read
        .iter()
        .filter(|(_, body)| body.contains(arn.as_str()))
        .map(|(at, _)| *at)
        .collect();
    let others_after = read
        .iter()
        .filter(|(at, body)| *at > changed_at && !body.contains(arn.as_str()))
        .count();
    eprintln!(
        "{} health reads in the run; the changed group's at {:?} after the change; {others_after} of other groups after it",
        read.len(),
        of_group
            .iter()
            .map(|at| at.saturating_duration_since(changed_at))
            .collect::<Vec<_>>()
    );
    // The race this is about: the change came while the full diff still read health,
    // before the group's own read.
    assert!(others_after > 0, "the full diff was over before the change");
    assert!(
        of_group.iter().all(|at| *at > changed_at),
        "the group's health was read before the change"
    );
    assert_eq!(
        of_group.len(),
        1,
        "the group's health was read {} times for one change",
        of_group.len()
    );
    // ...and the change's pass was the full diff's look at the group.
    let looked = report
        .groups
        .iter()
        .find(|g| g.target_group_arn == arn)
        .expect("the full diff reports the changed group");
    assert_eq!(looked.deregistered.len(), 1, "{looked:#?}");
    assert_eq!(report.totals.deferred, 0, "{report:#?}");
    assert_eq!(report.groups.len(), GROUPS, "{report:#?}");
}

/// A scheduled run's full diff reads its groups' states ahead in batches (up to 100 to
/// a BatchGetItem), not one GetItem per group: at rest those reads were most of a run's
/// requests (one per group per minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_full_diff_reads_the_groups_states_in_batches() {
    let period = Duration::from_secs(60);
    let settings = tgsync::reconcile::EngineSettings {
        // Two re-verifications per run: the rest skip on their checkpoints.
        verify_describes_per_second: 2.0 / period.as_secs_f64(),
        schedule_period: period,
        ..Default::default()
    };
    let (w, proxy) = proxied_world(|_| {}, settings).await;
    let mut at_rest = Vec::new();
    for i in 0..150u8 {
        at_rest.push(w.group("shop", &format!("app=idle{i}"), 8080, &[]).await);
    }
    w.verified_empty(&at_rest).await;
    // A first run reads each group alone once: its first read records on the item that
    // there is nothing of the earlier table layout to fold in (a batch leaves such
    // items out). A run ends its full diff at its deadline, and the groups it deferred
    // would read alone in the run measured: the first runs go on until one has looked at
    // them all. The deadlines are generous: on a loaded machine (two cores shared with
    // the other tests and moto) a run looked at only 32 of the 150 groups in 4 s.
    // (A run whose discovery did not end in time reports no group at all.)
    let long_run = Duration::from_secs(12);
    for first in 1.. {
        let until = w.clock.now().plus(long_run);
        let report = w.engine.run_scheduled(&scheduled(), until).await;
        let (deferred, looked) = (report.totals.deferred, report.groups.len());
        eprintln!("first run {first}: {looked} groups reported, {deferred} deferred");
        if deferred == 0 && looked == at_rest.len() {
            break;
        }
        assert!(
            first < 8,
            "{deferred} groups still deferred after {first} runs"
        );
    }
    let before = proxy.records().len();
    let until = w.clock.now().plus(long_run);
    let report = w.engine.run_scheduled(&scheduled(), until).await;
    // Reads of the groups' items (a run also reads its cluster's index meta item once).
    let reads = |op: &str| {
        proxy.records()[before..]
            .iter()
            .filter(|r| r.service == chaos_proxy::Service::DynamoDb && r.operation == op)
            .filter(|r| r.body.contains("tg#"))
            .map(|r| r.at)
            .collect::<Vec<_>>()
    };
    let in_sync = report
        .groups
        .iter()
        .filter(|g| g.outcome == tgsync::report::Outcome::InSync)
        .count();
    assert_eq!(in_sync, at_rest.len(), "{report:#?}");
    // 16, 16, then as many as the looks take in 2.5 s: at rest on a quiet machine all
    // the rest, 3 to 6 reads; at a loaded machine's pace of ~8 looks a second, ~20 a
    // batch. Read one by one, it would be 148. The groups due for re-verification read
    // their own.
    let (batched, alone) = (reads("BatchGetItem"), reads("GetItem"));
    let span = match (batched.first(), batched.last()) {
        (Some(first), Some(last)) => last.duration_since(*first),
        _ => Duration::ZERO,
    };
    eprintln!(
        "state reads: {} batched over {span:?}, {} alone",
        batched.len(),
        alone.len()
    );
    assert!(
        (3..=15).contains(&batched.len()) && alone.len() <= 2,
        "150 groups' states in {} batched reads and {} reads alone",
        batched.len(),
        alone.len()
    );
}

/// What a cold container did with a pod change made while discovery read the tags.
struct ColdChange {
    report: tgsync::report::Report,
    /// When web-1 turned NotReady.
    changed_at: Instant,
    /// When discovery's last DescribeTags (one naming more than web's group) was answered.
    discovered: Instant,
    /// When web-1's DeregisterTargets reached the proxy.
    left: Instant,
    /// The proxy's records of the cold container's run.
    records: Vec<chaos_proxy::Record>,
    /// web's group ARN.
    group: String,
    /// web's group's row in the cluster's index after the run.
    row: Option<tgsync::state::IndexedGroup>,
}

impl ColdChange {
    /// The run's requests of `operation` that name web's group.
    fn naming<'a>(&'a self, operation: &'a str) -> impl Iterator<Item = &'a chaos_proxy::Record> {
        let suffix = self.group.rsplit('/').next().expect("an ARN");
        self.records
            .iter()
            .filter(move |r| r.operation == operation && r.body.contains(suffix))
    }
}

/// When web-1 turns NotReady in [`cold_change`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    /// Once the cold container's watch is up: a watch event.
    Watched,
    /// Before the cold container starts: its first LIST holds the change.
    BeforeList,
}

/// 12 idle groups and web's in `shop`; a first container registers web-1 (and records
/// web's group in the cluster's index, with its name and facts unless `earlier_row`:
/// then the row is left as the earlier layout wrote it); then a fresh engine (a cold
/// container) runs through the proxy, one pass at a time, with each DescribeTargetHealth
/// taking 0.3 s and the delays `delays(web's, idle0's ARN suffix)` gives, and web-1
/// turns NotReady `when` says.
async fn cold_change(
    earlier_row: bool,
    when: When,
    delays: impl FnOnce(&str, &str) -> Vec<(String, String, Duration)>,
) -> ColdChange {
    let settings = tgsync::reconcile::EngineSettings {
        concurrency: 1,
        ..Default::default()
    };
    let (w, proxy) = proxied_world(|_| {}, settings.clone()).await;
    let mut idle = Vec::new();
    for i in 0..12u8 {
        idle.push(w.group("shop", &format!("app=idle{i}"), 8080, &[]).await);
    }
    let group = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-1", "10.0.1.1").build());
    // On a loaded machine a 3-s run can end before its full diff reaches web's group:
    // the next run serves it.
    for first in 1.. {
        let until = w.clock.now().plus(Duration::from_secs(3));
        w.engine.run_scheduled(&scheduled(), until).await;
        if w.targets(&group).await == ["10.0.1.1:8080"] {
            break;
        }
        assert!(first < 5, "web-1 not registered after {first} runs");
    }
    if earlier_row {
        use aws_sdk_dynamodb::types::AttributeValue::S;
        w.ddb
            .update_item()
            .table_name(&w.table)
            .key("pk", S(format!("owners#{}", w.cluster)))
            .key("sk", S(group.clone()))
            .update_expression("REMOVE #n, #t, #p, #i, #q, #b, #bound")
            .expression_attribute_names("#n", "tgName")
            .expression_attribute_names("#t", "targetType")
            .expression_attribute_names("#p", "port")
            .expression_attribute_names("#i", "ipType")
            .expression_attribute_names("#q", "quic")
            .expression_attribute_names("#b", "binding")
            .expression_attribute_names("#bound", "bound")
            .send()
            .await
            .expect("the row as the earlier layout wrote it");
        // The earlier layout had rows only for the groups holding the cluster's entries.
        for arn in &idle {
            w.ddb
                .delete_item()
                .table_name(&w.table)
                .key("pk", S(format!("owners#{}", w.cluster)))
                .key("sk", S(arn.clone()))
                .send()
                .await
                .expect("no row for a group holding no entries");
        }
    }

    let suffix = |arn: &str| arn.rsplit('/').next().expect("an ARN").to_owned();
    let mut rules = delays(&suffix(&group), &suffix(&idle[0]));
    rules.push((
        "DescribeTargetHealth".into(),
        String::new(),
        Duration::from_millis(300),
    ));
    proxy.set_rules(|r| r.delay = rules);
    let cold = chaos_proxy::engine(
        &w,
        &chaos_proxy::sdk_config(&proxy).await,
        tgsync::aws::MutationRate::new(50, None).unwrap(),
    )
    .with_settings(settings);
    let watches = || {
        w.emulator
            .faults()
            .requests()
            .iter()
            .filter(|r| r.query_param("watch").is_some())
            .count()
    };
    let make_change = || {
        let store = w.emulator.store();
        store.update_pod("shop", "web-1", |p| set_condition(p, "Ready", false));
        Instant::now()
    };
    let unwatched = (when == When::BeforeList).then(make_change);
    let (watched, before) = (watches(), proxy.records().len());
    let (opts, until) = (scheduled(), w.clock.now().plus(Duration::from_secs(8)));
    let run = cold.run_scheduled(&opts, until);
    let change = async {
        if let Some(at) = unwatched {
            return at;
        }
        // The cold container watches the index's namespaces from its start.
        let started = Instant::now();
        while watches() == watched {
            assert!(started.elapsed() < Duration::from_secs(5), "no watch");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        make_change()
    };
    let (report, changed_at) = tokio::join!(run, change);
    let records = proxy.records()[before..].to_vec();
    let discovered = records
        .iter()
        .filter(|r| r.operation == "DescribeTags")
        .filter(|r| r.body.matches("ResourceArns.member.").count() > 1)
        .filter_map(|r| Some(r.at + r.answered_after?))
        .max()
        .expect("discovery read tags");
    let left = records
        .iter()
        .find(|r| {
            r.operation == "DeregisterTargets"
                && chaos_proxy::percent_decode(&r.body).contains("10.0.1.1")
        })
        .unwrap_or_else(|| {
            let ops: Vec<(Duration, &str)> = records
                .iter()
                .map(|r| (r.at - changed_at, r.operation.as_str()))
                .collect();
            panic!("web-1 was not deregistered: {ops:?}\n{report:#?}")
        })
        .at;
    eprintln!(
        "changed {:?} before discovery ended; deregistered {:?} after the change",
        discovered - changed_at,
        left - changed_at
    );
    // The race these tests are about: the change came while discovery was reading tags.
    assert!(changed_at < discovered, "the change came after discovery");
    let row = tgsync::state::StateStore::indexed_selections(&w.engine.core.state, &w.cluster)
        .await
        .expect("the cluster's index")
        .into_iter()
        .find(|r| r.group == group);
    ColdChange {
        report,
        changed_at,
        discovered,
        left,
        records,
        group,
        row,
    }
}

/// A cold container acts on a pod change its watch sees while discovery is still
/// reading the groups' tags as on any pod change, not when the full diff's turn comes
/// to its group (at 1,000 groups discovery takes 10 s and more, and the full diff's
/// looks as long again: such changes waited 14–27 s, and some were not applied within
/// the invocation). Here each DescribeTags naming web's group takes 1.5 s and reading
/// the group ahead of discovery stalls (its index row is of the earlier layout, so that
/// read describes the group, and the proxy holds that call), so the change waits for
/// discovery to bind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_container_acts_on_a_change_seen_during_discovery() {
    let c = cold_change(true, When::Watched, |web, _| {
        vec![
            // Only the calls naming web's group: the table is shared with other tests.
            (
                "DescribeTags".into(),
                web.to_owned(),
                Duration::from_millis(1500),
            ),
            (
                "DescribeTargetGroups".into(),
                web.to_owned(),
                Duration::from_secs(30),
            ),
        ]
    })
    .await;
    let watch = c.report.watch.expect("a watch report");
    assert_eq!(
        watch.deregistered, 1,
        "the change was not acted on as a pod change: {watch:#?}"
    );
    assert!(
        c.left > c.discovered && c.left - c.discovered < Duration::from_secs(1),
        "web-1 left {:?} after discovery",
        c.left.saturating_duration_since(c.discovered)
    );
    // The index knew only web's selection; discovery widened the watch to the whole
    // namespace (the idle groups select other pods), which lists it again. That LIST
    // changed no pod the store had, so it asks for no pass: the idle groups are looked
    // at by the full diff, on their checkpoints, not each re-verified as a change.
    assert_eq!(watch.relisted, 2, "{watch:#?}");
    assert_eq!(
        watch.passes, 1,
        "a relist of a current store asked for passes of groups no pod of which changed"
    );
}

/// A cold container reads the groups its index says a pod change concerns ahead of
/// discovery and acts on the change then: here discovery's tags take 3 s, and web-1
/// leaves well before. The index row records the group's name and facts, so reading it
/// is one DescribeTags naming it (in a container's first second, one call of its
/// Describe window instead of two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_container_reads_ahead_of_discovery_the_groups_a_change_names() {
    let c = cold_change(false, When::Watched, slow_discovery).await;
    // Ahead of discovery (later, the rollout check may read the group's attributes,
    // a DescribeTargetGroups naming it, once the full diff has verified it).
    assert!(
        !c.naming("DescribeTargetGroups")
            .any(|r| r.at < c.discovered),
        "web's group was described though its index row records its facts"
    );
    let read_ahead = c
        .naming("DescribeTags")
        .find(|r| r.body.matches("ResourceArns.member.").count() == 1)
        .expect("web's group's tags were read ahead of discovery");
    read_ahead_acted(&c, read_ahead);
}

/// A pod that changed while no container watched (before a cold container's first
/// LIST) is no watch event: the LIST holds it. The cold container compares that LIST
/// with the ledgers of the groups its index names there and reads web's group ahead of
/// discovery, as for a change its watch saw, so web-1 leaves before discovery ends
/// (its tags take 3 s here). Without the comparison only the full diff, after
/// discovery, acted on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_container_acts_on_a_change_made_before_its_first_list() {
    let c = cold_change(false, When::BeforeList, slow_discovery).await;
    let suffix = c.group.rsplit('/').next().expect("an ARN");
    let alone = |r: &&chaos_proxy::Record| {
        r.operation == "DescribeTags" && r.body.matches("ResourceArns.member.").count() == 1
    };
    let read_ahead: Vec<_> = c.records.iter().filter(alone).collect();
    assert!(
        read_ahead.len() == 1 && read_ahead[0].body.contains(suffix),
        "only web's group is read ahead of discovery (the idle groups' empty ledgers match \
         the LIST): {:?}",
        read_ahead.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
    assert!(
        c.left < c.discovered,
        "web-1 left {:?} after discovery ended",
        c.left - c.discovered
    );
    // The race this is about: the group was read before discovery had bound it.
    assert!(
        read_ahead[0].at < c.discovered,
        "the read ahead came after discovery"
    );
    let watch = c.report.watch.as_ref().expect("a watch report");
    assert_eq!(watch.deregistered, 1, "{watch:#?}");
    assert_eq!(watch.passes, 1, "{watch:#?}");
}

/// A namespace's first LIST is compared with its groups' ledgers beside the read-ahead
/// of the changes the watch sees, not before it: here the comparison's read of the
/// ledgers takes 3 s, and web-1's change, seen meanwhile, is read ahead and applied
/// while that read still waits. (Taking turns, a fresh container at 1,000 groups × 100
/// pods held its watched changes until discovery ended.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_first_list_comparison_does_not_hold_up_a_watched_change() {
    let c = cold_change(false, When::Watched, |web, idle| {
        let mut delays = slow_discovery(web, idle);
        delays.push((
            "BatchGetItem".into(),
            web.to_owned(),
            Duration::from_secs(3),
        ));
        delays
    })
    .await;
    let comparison = c
        .naming("BatchGetItem")
        .next()
        .expect("the first LIST's comparison read web's ledger");
    let compared = comparison.at + comparison.answered_after.expect("answered");
    // The race this is about: the change came before the comparison's read was
    // answered (the comparison was asked for when the LIST ended, before the watch).
    assert!(
        c.changed_at < compared,
        "the change came {:?} after the comparison's read was answered",
        c.changed_at - compared
    );
    assert!(
        c.left < compared,
        "web-1 left {:?} after the comparison's read was answered",
        c.left - compared
    );
    let watch = c.report.watch.as_ref().expect("a watch report");
    assert_eq!(watch.deregistered, 1, "{watch:#?}");
}

/// Discovery's tags take 3 s (those of the calls naming idle0's group).
fn slow_discovery(_: &str, idle: &str) -> Vec<(String, String, Duration)> {
    vec![(
        "DescribeTags".into(),
        idle.to_owned(),
        Duration::from_secs(3),
    )]
}

/// A cold container whose index row is of the earlier layout (no name or facts) reads
/// the group ahead of discovery as discovery does (one DescribeTargetGroups and one
/// DescribeTags naming it), and records its name and facts in the row, so that the
/// next cold container reads it with DescribeTags alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_container_records_the_facts_an_earlier_index_row_lacks() {
    let c = cold_change(true, When::Watched, slow_discovery).await;
    let read_ahead = c
        .naming("DescribeTargetGroups")
        .next()
        .expect("web's group was read ahead of discovery");
    read_ahead_acted(&c, read_ahead);
    let row = c.row.as_ref().expect("web's group's index row");
    let (name, facts) = row.described.as_ref().expect("the row records the facts");
    assert!(c.group.contains(&format!("/{name}/")), "{row:?}");
    assert_eq!(
        (facts.target_type.as_str(), facts.port, facts.quic),
        ("ip", Some(8080), false)
    );
}

/// web-1 left before discovery ended, soon after the change, and `read_ahead` (the
/// read of web's group ahead of discovery) came between the change and discovery's end.
fn read_ahead_acted(c: &ColdChange, read_ahead: &chaos_proxy::Record) {
    assert!(
        c.left < c.discovered,
        "web-1 left {:?} after discovery ended",
        c.left - c.discovered
    );
    assert!(
        c.left - c.changed_at < Duration::from_millis(1500),
        "web-1 left {:?} after the change",
        c.left - c.changed_at
    );
    // The race this is about: web's group was read while discovery was reading tags.
    assert!(
        c.changed_at < read_ahead.at && read_ahead.at < c.discovered,
        "the read ahead came after discovery"
    );
    let watch = c.report.watch.as_ref().expect("a watch report");
    assert_eq!(watch.deregistered, 1, "{watch:#?}");
    // Discovery bound the group as read ahead: the change is not asked for again.
    assert_eq!(watch.passes, 1, "{watch:#?}");
}
