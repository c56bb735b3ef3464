//! The fast path and the safety machinery under the failures that live in I/O order:
//! ELBv2 refusing one target of a chunk, a lease write whose answer is lost, events from
//! namespaces tgsync has no business in, and two clusters' deployments sharing a group.
//! Production adapters against moto (through a rule-driven proxy where ELBv2's or
//! DynamoDB's behaviour is needed) and the Kubernetes API emulator.

#[path = "support/chaos_proxy.rs"]
mod chaos_proxy;
#[path = "support/moto.rs"]
mod moto;
#[path = "support/world.rs"]
mod world;

use std::time::Duration;

use chaos_proxy::{ChaosProxy, Fate};
use kube_emulator::{Emulator, EmulatorConfig};
use serde_json::{Value, json};
use tgsync::aws::MutationRate;
use tgsync::reconcile::RunOptions;
use tgsync::report::Outcome;
use tgsync::testkit::PodBuilder;
use world::World;

fn web(name: &str, ip: &str) -> PodBuilder {
    PodBuilder::new("shop", name).label("app", "web").ip(ip)
}

/// A proxy in front of moto that only applies [`chaos_proxy::Rules`] (no random faults).
async fn rules_proxy() -> ChaosProxy {
    ChaosProxy::transparent().await
}

/// ELBv2 refuses a whole RegisterTargets call for one target. The others in the chunk
/// are still registered, the refused one is reported with ELBv2's reason, and an IP
/// outside the group's VPC (a peered VPC, a hybrid node) is registered with
/// `AvailabilityZone=all`, as ELBv2 requires.
#[tokio::test]
async fn one_refused_target_does_not_block_its_chunk() {
    let mut w = World::new().await;
    let proxy = rules_proxy().await;
    proxy.set_rules(|r| {
        r.vpc = Some(("10.0.0.0".parse().unwrap(), 16));
        r.refuse = vec![(
            "10.0.1.66".into(),
            "The IP address '10.0.1.66' cannot be registered (refused for this test)".into(),
        )];
    });
    w.engine = chaos_proxy::engine(
        &w,
        &chaos_proxy::sdk_config(&proxy).await,
        MutationRate::new(50, None).unwrap(),
    );
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-1", "10.0.1.1").build());
    w.put_pod(web("web-2", "192.168.5.5").build());
    w.put_pod(web("web-3", "10.0.1.66").build());
    w.put_pod(web("web-4", "10.0.1.4").build());
    let r = w.resync().await;
    let g = r.group(&arn).unwrap();
    assert_eq!(
        w.targets(&arn).await,
        ["10.0.1.1:8080", "10.0.1.4:8080", "192.168.5.5:8080"],
        "{r:#?}"
    );
    assert_eq!(g.failed_targets.len(), 1, "{r:#?}");
    assert_eq!(g.failed_targets[0].target.to_string(), "10.0.1.66:8080");
    assert!(
        g.failed_targets[0].error.contains("refused for this test"),
        "{r:#?}"
    );
    // The outside address went with AvailabilityZone=all, the inside ones without.
    let registers: Vec<String> = proxy
        .records()
        .into_iter()
        .filter(|r| r.operation == "RegisterTargets" && r.fate == Fate::Forwarded)
        .map(|r| r.body)
        .collect();
    assert!(
        registers
            .iter()
            .any(|b| b.contains("192.168.5.5") && b.contains("AvailabilityZone=all")),
        "{registers:#?}"
    );
    assert!(
        registers
            .iter()
            .filter(|b| b.contains("10.0.1.1"))
            .all(|b| !b.contains("AvailabilityZone")),
        "{registers:#?}"
    );
}

/// The conditional write that takes a lease lands, but its answer is lost, so the SDK
/// sends it again. The retry must find the lease already ours, not someone else's.
#[tokio::test]
async fn a_lease_write_whose_answer_was_lost_is_still_ours() {
    let mut w = World::new().await;
    let proxy = rules_proxy().await;
    proxy.set_rules(|r| r.lose_answer = vec![(String::new(), "leaseUntil".into())]);
    w.engine = chaos_proxy::engine(
        &w,
        &chaos_proxy::sdk_config(&proxy).await,
        MutationRate::new(50, None).unwrap(),
    );
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-1", "10.0.1.1").build());
    let r = w.resync().await;
    assert!(
        proxy.records().iter().any(|r| r.fate == Fate::AnswerLost),
        "the lost answer was never served"
    );
    assert_eq!(r.group(&arn).unwrap().outcome, Outcome::Changed, "{r:#?}");
    assert_eq!(w.targets(&arn).await, ["10.0.1.1:8080"]);
    // Nothing is left locked: a pod event right after is acted on.
    w.put_pod(web("web-2", "10.0.1.2").build());
    let r = w.resync().await;
    assert_eq!(r.group(&arn).unwrap().outcome, Outcome::Changed, "{r:#?}");
}

/// An event about a pod in a namespace no group is bound to is triaged away before any
/// Kubernetes call (the namespaced RBAC would answer 403 and the event would be retried
/// into the dead-letter queue).
#[tokio::test]
async fn an_event_from_an_unbound_namespace_costs_no_kubernetes_call() {
    let w = World::new().await;
    w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(PodBuilder::new("billing", "inv-1").ip("10.0.3.1").build());
    let text = std::fs::read_to_string(format!(
        "{}/events/pod-started.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let mut ev: Value = serde_json::from_str(&text).unwrap();
    ev["detail"]["clusterName"] = json!(w.cluster);
    ev["detail"]["involvedObject"]["namespace"] = json!("billing");
    ev["detail"]["involvedObject"]["name"] = json!("inv-1");
    w.emulator.faults().clear_requests();
    // The namespaced RBAC: the function may not read pods in `billing`.
    w.emulator.faults().fail_all(403);
    let out = tgsync::handlers::pod_events::handle(&w.engine, &ev, Duration::from_secs(2), None)
        .await
        .expect("an unbound namespace is not an error");
    assert_eq!(out["groups"], json!([]), "{out}");
    assert!(
        w.emulator.faults().requests().is_empty(),
        "{:?}",
        w.emulator.faults().requests()
    );
}

/// Two clusters fill one group (`tgsync/cluster: blue green`), each deployment with its
/// own tgsync, sharing the table. A pod IP of green's is reused by a blue pod while
/// green lags; when green catches up it must not remove blue's live pod.
#[tokio::test]
async fn a_target_taken_over_by_one_cluster_is_never_deregistered_by_the_other() {
    let blue = World::new().await;
    let green_name = moto::unique("green");
    let mut config = EmulatorConfig::new(green_name.clone());
    config.credentials = vec![("testing".into(), "testing".into())];
    config.allowed_sts_hosts = vec![moto::endpoint().trim_start_matches("http://").to_owned()];
    let green_api = Emulator::start(config).await.expect("emulator starts");
    let green = world::build_engine(
        &green_name,
        &blue.sdk,
        &green_api,
        &blue.table,
        &blue.clock,
        world::Creds::default().provider(),
    );
    let clusters = format!("{} {green_name}", blue.cluster);
    let arn = blue
        .raw_group(
            aws_sdk_elasticloadbalancingv2::types::TargetTypeEnum::Ip,
            8080,
            &[
                ("tgsync/cluster", clusters.as_str()),
                ("tgsync/namespace", "shop"),
                ("tgsync/selector", "app=web"),
            ],
        )
        .await;
    // Green's pod gets 10.0.1.50 and is registered by green.
    green_api
        .store()
        .put_pod(web("green-1", "10.0.1.50").build())
        .unwrap();
    green.resync(&RunOptions::default()).await;
    assert_eq!(blue.targets(&arn).await, ["10.0.1.50:8080"]);
    // Green's pod goes; green does not run. Blue's new pod gets the same IP.
    green_api.store().delete_pod("shop", "green-1");
    blue.put_pod(web("blue-1", "10.0.1.50").build());
    blue.resync().await;
    // Green catches up.
    let r = green.resync(&RunOptions::default()).await;
    assert_eq!(
        blue.targets(&arn).await,
        ["10.0.1.50:8080"],
        "blue's live pod was removed by green: {r:#?}"
    );
    let r = blue.resync().await;
    assert_eq!(blue.targets(&arn).await, ["10.0.1.50:8080"], "{r:#?}");
    // And when blue's pod goes, blue removes it.
    blue.emulator.store().delete_pod("shop", "blue-1");
    blue.resync().await;
    assert!(blue.targets(&arn).await.is_empty());
}

/// No ELBv2 attempt goes out after the lease is lost: a RegisterTargets that ELBv2 keeps
/// throttling (the adapter retries it) when another process takes the group over sends
/// nothing more.
#[tokio::test]
async fn no_elbv2_attempt_is_sent_after_the_lease_was_lost() {
    use tgsync::clock::Clock as _;
    use tgsync::state::{Acquire, StateStore as _};
    let mut w = World::new().await;
    let proxy = rules_proxy().await;
    proxy.set_rules(|r| r.throttle = vec![("RegisterTargets".into(), 50)]);
    w.engine = chaos_proxy::engine(
        &w,
        &chaos_proxy::sdk_config(&proxy).await,
        MutationRate::new(50, None).unwrap(),
    );
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-1", "10.0.1.1").build());
    let registers = |proxy: &ChaosProxy| {
        proxy
            .records()
            .into_iter()
            .filter(|r| r.operation == "RegisterTargets")
            .collect::<Vec<_>>()
    };
    let run = w.resync();
    let take_over = async {
        while registers(&proxy).is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The holder's lease runs out while its call is being retried, and another
        // process takes the group.
        w.clock.advance(20_000);
        let now = w.clock.now();
        let taken = w
            .engine
            .core
            .state
            .acquire(
                &arn,
                "pod-events@other#1",
                now,
                now.plus(Duration::from_secs(15)),
            )
            .await
            .expect("acquire");
        assert!(matches!(taken, Acquire::Acquired(_)), "{taken:?}");
        std::time::Instant::now()
    };
    let (report, taken_at) = tokio::join!(run, take_over);
    let all = registers(&proxy);
    let late: Vec<_> = all.iter().filter(|r| r.at > taken_at).collect();
    assert!(
        all.iter().all(|r| r.fate == Fate::Throttled),
        "the race was staged: every attempt was being throttled and retried"
    );
    assert!(
        late.is_empty(),
        "{} RegisterTargets attempt(s) sent after the lease was taken over: {late:#?}",
        late.len()
    );
    let g = report.group(&arn).unwrap();
    assert_eq!(g.outcome, Outcome::Failed, "{report:#?}");
    assert!(w.targets(&arn).await.is_empty());
}

/// A lease survives a slow state table: every UpdateItem (taking the lease, renewing
/// it, the write-ahead ledger write, the release) takes 6 s — longer than the renewal
/// period — on the real clock, and the pass of a 120-target group still completes under
/// its lease, with nobody else wanting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_survives_a_slow_state_table() {
    let mut w = World::new().await;
    let proxy = rules_proxy().await;
    proxy.set_rules(|r| {
        r.delay = vec![("UpdateItem".into(), String::new(), Duration::from_secs(6))];
    });
    w.engine = chaos_proxy::engine_on(
        &w,
        &chaos_proxy::sdk_config(&proxy).await,
        MutationRate::new(50, None).unwrap(),
        std::sync::Arc::new(tgsync::clock::SystemClock),
    );
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    for i in 0..120u32 {
        w.put_pod(web(&format!("web-{i}"), &format!("10.0.1.{}", i + 1)).build());
    }
    let r = w.resync().await;
    let g = r.group(&arn).unwrap();
    assert_eq!(g.outcome, Outcome::Changed, "{r:#?}");
    assert_eq!(g.error, None, "{r:#?}");
    assert_eq!(g.registered.len(), 120);
    assert_eq!(w.targets(&arn).await.len(), 120);
    assert_eq!(w.ledger(&arn).await.len(), 120);
    assert!(!w.lease_recorded(&arn).await, "released");
}
