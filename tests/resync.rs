//! The resync path end to end: production adapters against moto's ELBv2/DynamoDB and the
//! Kubernetes API emulator over HTTPS with real EKS tokens. Each test is one scenario of
//! the resync issue; assertions read what an operator would see (targets in the group,
//! rows in the table, the report).

#[path = "support/moto.rs"]
mod moto;
#[path = "support/world.rs"]
mod world;

use aws_sdk_elasticloadbalancingv2::types::TargetTypeEnum;
use tgsync::core::BindingPolicy;
use tgsync::faults::{CrashAt, FaultPoint, NoFaults};
use tgsync::reconcile::RunOptions;
use tgsync::report::Outcome;
use tgsync::testkit::{PodBuilder, set_condition};
use world::World;

fn web(name: &str, ip: &str) -> PodBuilder {
    PodBuilder::new("shop", name).label("app", "web").ip(ip)
}

async fn three_pods(w: &World) -> String {
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-1", "10.0.1.1").build());
    w.put_pod(web("web-2", "10.0.1.2").build());
    w.put_pod(web("web-3", "10.0.1.3").build());
    arn
}

#[tokio::test]
async fn s1_empty_group_gets_three_ready_pods() {
    let w = World::new().await;
    let arn = three_pods(&w).await;
    let r = w.resync().await;
    let g = r.group(&arn).expect("group reported");
    assert_eq!(g.outcome, Outcome::Changed, "{r:#?}");
    let want = ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"];
    assert_eq!(w.targets(&arn).await, want);
    assert_eq!(w.ledger(&arn).await, want);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["groups"][0]["registered"], serde_json::json!(want));
    // A second run finds nothing to do.
    let r = w.resync().await;
    assert_eq!(r.group(&arn).unwrap().outcome, Outcome::InSync, "{r:#?}");
}

#[tokio::test]
async fn s2_deleted_terminating_and_unready_pods_are_deregistered() {
    let w = World::new().await;
    let arn = three_pods(&w).await;
    w.put_pod(web("web-4", "10.0.1.4").build());
    w.resync().await;
    w.emulator.store().delete_pod("shop", "web-1");
    w.emulator.store().set_terminating("shop", "web-2");
    w.emulator
        .store()
        .update_pod("shop", "web-3", |p| set_condition(p, "Ready", false));
    let r = w.resync().await;
    let g = r.group(&arn).unwrap();
    let gone: Vec<String> = g.deregistered.iter().map(|t| t.to_string()).collect();
    assert_eq!(
        gone,
        ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"],
        "{r:#?}"
    );
    assert_eq!(w.targets(&arn).await, ["10.0.1.4:8080"]);
    assert_eq!(w.ledger(&arn).await, ["10.0.1.4:8080"]);
}

#[tokio::test]
async fn s3_foreign_targets_kept_in_shared_removed_in_exclusive() {
    let w = World::new().await;
    let shared = three_pods(&w).await;
    let exclusive = w
        .group("shop", "app=web", 8080, &[("tgsync/mode", "exclusive")])
        .await;
    for arn in [&shared, &exclusive] {
        w.register_by_hand(arn, "10.0.200.9", 8080).await; // hand-added
        w.register_by_hand(arn, "10.0.77.7", 8080).await; // another cluster's pod
    }
    let r = w.resync().await;
    assert_eq!(
        w.targets(&shared).await,
        [
            "10.0.1.1:8080",
            "10.0.1.2:8080",
            "10.0.1.3:8080",
            "10.0.200.9:8080",
            "10.0.77.7:8080"
        ]
    );
    assert_eq!(r.group(&shared).unwrap().foreign_kept.len(), 2);
    assert_eq!(
        w.targets(&exclusive).await,
        ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"]
    );
    assert_eq!(r.group(&exclusive).unwrap().deregistered.len(), 2);
}

/// Tags are an authority, bounded by the deployment: a group tagged for a namespace
/// outside `TGSYNC_ALLOWED_NAMESPACES`, or asking for exclusive mode without
/// `TGSYNC_ALLOW_EXCLUSIVE`, is a binding error and nothing in it changes — not its
/// foreign targets, not even the targets tgsync registered there before the limit —
/// while a group within the limits converges as usual.
#[tokio::test]
async fn s3b_binding_policy_leaves_out_of_bounds_groups_untouched() {
    let mut w = World::new().await;
    let allowed = three_pods(&w).await;
    // A group filled from kube-system while no limit was set: its pod is registered.
    let system = w.group("kube-system", "app=dns", 53, &[]).await;
    w.put_pod(
        PodBuilder::new("kube-system", "dns-1")
            .label("app", "dns")
            .ip("10.0.3.1")
            .build(),
    );
    w.register_by_hand(&system, "10.0.200.9", 53).await;
    let r = w.resync().await;
    assert_eq!(
        r.group(&system).unwrap().outcome,
        Outcome::Changed,
        "{r:#?}"
    );
    assert_eq!(w.targets(&system).await, ["10.0.200.9:53", "10.0.3.1:53"]);

    // The deployment now allows only `shop`, and no exclusive mode (the default).
    w.engine.core.settings.binding_policy = BindingPolicy {
        allowed_namespaces: Some(["shop".to_owned()].into()),
        allow_exclusive: false,
    };
    let exclusive = w
        .group("shop", "app=web", 8080, &[("tgsync/mode", "exclusive")])
        .await;
    w.register_by_hand(&exclusive, "10.0.77.7", 8080).await;
    // kube-system's pod goes away: without the limit, its target would be deregistered.
    w.emulator.store().delete_pod("kube-system", "dns-1");
    w.put_pod(web("web-4", "10.0.1.4").build());

    let r = w.resync().await;
    let g = r.group(&system).expect("reported");
    assert_eq!(g.outcome, Outcome::BindingError, "{r:#?}");
    let error = g.error.as_deref().unwrap();
    assert!(
        error.contains("tgsync/namespace")
            && error.contains("kube-system")
            && error.contains("TGSYNC_ALLOWED_NAMESPACES"),
        "{error}"
    );
    assert_eq!(w.targets(&system).await, ["10.0.200.9:53", "10.0.3.1:53"]);
    assert_eq!(w.ledger(&system).await, ["10.0.3.1:53"]);

    let g = r.group(&exclusive).expect("reported");
    assert_eq!(g.outcome, Outcome::BindingError, "{r:#?}");
    let error = g.error.as_deref().unwrap();
    assert!(
        error.contains("tgsync/mode") && error.contains("TGSYNC_ALLOW_EXCLUSIVE"),
        "{error}"
    );
    assert_eq!(
        w.targets(&exclusive).await,
        ["10.0.77.7:8080"],
        "no pod registered, the foreign target kept"
    );
    assert!(w.ledger(&exclusive).await.is_empty());

    let g = r.group(&allowed).expect("reported");
    assert_eq!(g.outcome, Outcome::Changed, "{r:#?}");
    let want = [
        "10.0.1.1:8080",
        "10.0.1.2:8080",
        "10.0.1.3:8080",
        "10.0.1.4:8080",
    ];
    assert_eq!(w.targets(&allowed).await, want);
    assert_eq!(w.ledger(&allowed).await, want);
    assert_eq!(r.totals.errors, 2);
}

#[tokio::test]
async fn s4_hand_removed_owned_target_returns_hand_added_stays() {
    let w = World::new().await;
    let arn = three_pods(&w).await;
    w.resync().await;
    w.deregister_by_hand(&arn, "10.0.1.2", 8080).await;
    w.register_by_hand(&arn, "10.0.200.9", 8080).await;
    let r = w.resync().await;
    let g = r.group(&arn).unwrap();
    assert_eq!(
        g.registered
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>(),
        ["10.0.1.2:8080"]
    );
    assert!(g.deregistered.is_empty());
    assert_eq!(
        w.targets(&arn).await,
        [
            "10.0.1.1:8080",
            "10.0.1.2:8080",
            "10.0.1.3:8080",
            "10.0.200.9:8080"
        ]
    );
    assert_eq!(
        w.ledger(&arn).await,
        ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"]
    );
}

#[tokio::test]
async fn s5_crash_between_ledger_write_and_register_converges() {
    let mut w = World::new().await;
    let arn = three_pods(&w).await;
    let crash = std::sync::Arc::new(CrashAt::first(FaultPoint::AfterLedgerWrite));
    w.engine.core.faults = crash.clone();
    let r = w.resync().await;
    assert!(crash.fired());
    assert_eq!(r.group(&arn).unwrap().outcome, Outcome::Aborted);
    // The write-ahead ledger knows all three; ELBv2 has none; the lease is still held.
    assert_eq!(w.ledger(&arn).await.len(), 3);
    assert!(w.targets(&arn).await.is_empty());
    w.engine.core.faults = std::sync::Arc::new(NoFaults);
    let r = w.resync().await;
    assert_eq!(
        r.group(&arn).unwrap().outcome,
        Outcome::LeaseHeld,
        "lease survives the crash"
    );
    w.clock.advance(10 * 60 * 1000);
    let r = w.resync().await;
    assert_eq!(r.group(&arn).unwrap().outcome, Outcome::Changed, "{r:#?}");
    let want = ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"];
    assert_eq!(w.targets(&arn).await, want);
    assert_eq!(w.ledger(&arn).await, want);
}

#[tokio::test]
async fn s6_bad_tags_fail_one_group_others_converge() {
    let w = World::new().await;
    let good = three_pods(&w).await;
    let cluster = w.cluster.clone();
    let no_ns = w
        .raw_group(
            TargetTypeEnum::Ip,
            8080,
            &[("tgsync/cluster", &cluster), ("tgsync/selector", "app=web")],
        )
        .await;
    let bad_mode = w
        .group("shop", "app=web", 8080, &[("tgsync/mode", "mine")])
        .await;
    let instance = w
        .raw_group(
            TargetTypeEnum::Instance,
            8080,
            &[
                ("tgsync/cluster", &cluster),
                ("tgsync/namespace", "shop"),
                ("tgsync/selector", "app=web"),
            ],
        )
        .await;
    let r = w.resync().await;
    let err = |arn: &str| r.group(arn).unwrap().error.clone().unwrap_or_default();
    assert_eq!(r.group(&no_ns).unwrap().outcome, Outcome::BindingError);
    assert!(
        err(&no_ns).contains("tgsync/namespace` is missing"),
        "{}",
        err(&no_ns)
    );
    assert!(err(&bad_mode).contains("`mine`"), "{}", err(&bad_mode));
    assert!(
        err(&instance).contains("target type `instance`"),
        "{}",
        err(&instance)
    );
    assert_eq!(r.group(&good).unwrap().outcome, Outcome::Changed);
    assert_eq!(w.targets(&good).await.len(), 3);
    for arn in [&no_ns, &bad_mode, &instance] {
        assert!(w.targets(arn).await.is_empty());
    }
}

#[tokio::test]
async fn s7_unreachable_or_failing_api_never_deregisters() {
    let w = World::new().await;
    let arn = three_pods(&w).await;
    // Enough pods for several LIST pages (page size 100 in tests).
    for i in 0..250 {
        w.put_pod(
            web(
                &format!("bulk-{i}"),
                &format!("10.0.{}.{}", 2 + i / 200, 1 + i % 200),
            )
            .build(),
        );
    }
    w.resync().await;
    let before = w.targets(&arn).await;
    assert_eq!(before.len(), 253);
    // 500 on the second LIST page.
    w.emulator.store().delete_pod("shop", "web-1");
    w.emulator.faults().fail_list_page(2, 500);
    let r = w.resync().await;
    assert_eq!(r.group(&arn).unwrap().outcome, Outcome::Failed, "{r:#?}");
    assert!(r.group(&arn).unwrap().deregistered.is_empty());
    assert_eq!(w.targets(&arn).await, before);
    // API answering 500 to everything.
    w.emulator.faults().fail_all(500);
    w.clock.advance(3_600_000); // past any backoff
    let r = w.resync().await;
    assert_eq!(r.group(&arn).unwrap().outcome, Outcome::Failed);
    assert_eq!(w.targets(&arn).await, before);
    // API gone entirely.
    w.emulator.faults().clear();
    w.emulator.shutdown();
    w.clock.advance(3_600_000);
    let r = w.resync().await;
    assert_eq!(r.group(&arn).unwrap().outcome, Outcome::Failed);
    assert_eq!(w.targets(&arn).await, before);
    assert_eq!(
        w.engine
            .core
            .groups
            .api_calls()
            .get("DeregisterTargets")
            .copied()
            .unwrap_or(0),
        0
    );
}

#[tokio::test]
async fn s8_dry_run_reports_the_plan_and_changes_nothing() {
    let w = World::new().await;
    let arn = three_pods(&w).await;
    let items = w.table_items().await;
    let r = w
        .resync_with(RunOptions {
            dry_run: true,
            ..Default::default()
        })
        .await;
    assert!(r.dry_run);
    let g = r.group(&arn).unwrap();
    assert_eq!(g.outcome, Outcome::Planned);
    let plan: Vec<String> = g
        .plan
        .as_ref()
        .unwrap()
        .register
        .iter()
        .map(|t| t.to_string())
        .collect();
    assert_eq!(plan, ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"]);
    assert!(w.targets(&arn).await.is_empty());
    assert_eq!(w.table_items().await, items, "dry run wrote to DynamoDB");
    let calls = w.engine.core.groups.api_calls();
    assert_eq!(calls.get("RegisterTargets").copied().unwrap_or(0), 0);
}

#[tokio::test]
async fn s9_bad_token_refused_real_token_accepted() {
    let w = World::with_secret("not-the-secret").await;
    let arn = three_pods(&w).await;
    let r = w.resync().await;
    let g = r.group(&arn).unwrap();
    assert_eq!(g.outcome, Outcome::Failed);
    let err = g.error.clone().unwrap();
    assert!(err.contains("401"), "{err}");
    assert!(
        !err.contains("k8s-aws-v1."),
        "token leaked into report: {err}"
    );
    assert!(w.targets(&arn).await.is_empty());
    assert!(
        w.emulator
            .faults()
            .requests()
            .iter()
            .all(|q| !q.authenticated)
    );
    // The same world with the right secret.
    let good = World::new().await;
    let arn = three_pods(&good).await;
    let r = good.resync().await;
    assert_eq!(r.group(&arn).unwrap().outcome, Outcome::Changed);
    let requests = good.emulator.faults().requests();
    assert!(!requests.is_empty() && requests.iter().all(|q| q.authenticated));
    assert!(
        requests.iter().all(|q| q
            .query_param("resourceVersion")
            .is_none_or(|v| v.is_empty())),
        "every LIST must be a consistent read"
    );
}

#[tokio::test]
async fn s11_readiness_gate_opens_when_the_target_is_healthy() {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    let mut pod = web("web-g", "10.0.1.9").gated().build();
    set_condition(&mut pod, "Ready", false);
    w.put_pod(pod);
    let r = w.resync().await;
    assert_eq!(w.targets(&arn).await, ["10.0.1.9:8080"], "{r:#?}");
    // Right after its registration the gate says what it waits for.
    let gate = gate_condition(&w, "web-g").expect("gate condition set");
    assert_eq!(
        (gate.status.as_str(), gate.reason.as_deref()),
        ("False", Some("ElbRegistrationInProgress"))
    );
    assert!(
        gate.message
            .as_deref()
            .is_some_and(|m| m.contains("10.0.1.9:8080 in tg-")),
        "{gate:?}"
    );
    // moto reports registered targets healthy at once; the next pass opens the gate.
    let r = w.resync().await;
    assert_eq!(
        r.group(&arn).unwrap().gates_opened,
        ["shop/web-g"],
        "{r:#?}"
    );
    let gate = gate_condition(&w, "web-g").expect("gate condition set");
    assert_eq!(
        (gate.status.as_str(), gate.reason.as_deref()),
        ("True", Some("TargetHealthy"))
    );
    let patches: Vec<_> = w
        .emulator
        .faults()
        .requests()
        .into_iter()
        .filter(|q| q.method == "PATCH")
        .collect();
    // One write while the target registers (False, saying so), one when it is healthy.
    assert_eq!(patches.len(), 2);
    assert!(
        patches
            .iter()
            .all(|p| p.path() == "/api/v1/namespaces/shop/pods/web-g/status")
    );
}

/// The pod's `tgsync/target-health` condition as stored.
fn gate_condition(w: &World, name: &str) -> Option<k8s_openapi::api::core::v1::PodCondition> {
    w.emulator
        .store()
        .get_pod("shop", name)?
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "tgsync/target-health")
}

/// Kill the reconcile at every fault point (between every pair of side effects), against
/// moto and the emulator, in a run that registers, deregisters, forgets, clears backoff
/// and writes a checkpoint; then run again: no leaked target, no foreign target touched,
/// no stale ledger row.
#[tokio::test]
async fn s10_crash_at_every_fault_point_then_converge() {
    let scheduled = RunOptions {
        use_checkpoint: true,
        ..RunOptions::default()
    };
    for point in FaultPoint::ALL {
        let mut w = World::new().await;
        let arn = three_pods(&w).await;
        w.register_by_hand(&arn, "10.0.200.9", 8080).await;
        w.resync_with(scheduled.clone()).await;
        w.emulator.store().delete_pod("shop", "web-1");
        w.emulator.store().delete_pod("shop", "web-2");
        w.deregister_by_hand(&arn, "10.0.1.2", 8080).await;
        w.put_pod(web("web-4", "10.0.1.4").build());
        let backoff = tgsync::core::BackoffState {
            failures: 1,
            next_attempt: tgsync::core::UnixMillis(0),
        };
        w.set_backoff(&arn, backoff).await;
        let crash = std::sync::Arc::new(CrashAt::first(point));
        w.engine.core.faults = crash.clone();
        let r = w.resync_with(scheduled.clone()).await;
        assert!(crash.fired(), "{point} not reached: {r:#?}");
        w.engine.core.faults = std::sync::Arc::new(NoFaults);
        w.clock.advance(10 * 60 * 1000);
        w.resync_with(scheduled.clone()).await;
        let r = w.resync_with(RunOptions::default()).await;
        assert_eq!(
            r.group(&arn).unwrap().outcome,
            Outcome::InSync,
            "{point}: {r:#?}"
        );
        assert_eq!(
            w.targets(&arn).await,
            ["10.0.1.3:8080", "10.0.1.4:8080", "10.0.200.9:8080"],
            "{point}"
        );
        assert_eq!(
            w.ledger(&arn).await,
            ["10.0.1.3:8080", "10.0.1.4:8080"],
            "{point}: ledger"
        );
    }
    println!("fault points covered: {}", FaultPoint::ALL.len());
}

/// An application load balancer's IP target group (protocol HTTP, behind an ALB
/// listener) is bound and filled exactly like a network load balancer's: tgsync needs
/// target type `ip`, and ALB or NLB makes no difference to it.
#[tokio::test]
async fn s12_alb_ip_target_group_is_filled_like_an_nlb_one() {
    use aws_sdk_elasticloadbalancingv2::types::{
        Action, ActionTypeEnum, LoadBalancerSchemeEnum, LoadBalancerTypeEnum, ProtocolEnum, Tag,
    };
    let w = World::new().await;
    let name = |prefix: &str| {
        moto::unique(prefix)
            .chars()
            .take(32)
            .collect::<String>()
            .trim_end_matches('-')
            .to_owned()
    };
    let tags = [
        ("tgsync/cluster", w.cluster.as_str()),
        ("tgsync/namespace", "shop"),
        ("tgsync/selector", "app=web"),
    ];
    let tg = w
        .elb
        .create_target_group()
        .name(name("alb"))
        .protocol(ProtocolEnum::Http)
        .port(8080)
        .vpc_id(moto::vpc_id())
        .target_type(TargetTypeEnum::Ip)
        .health_check_path("/healthz")
        .set_tags(Some(
            tags.iter()
                .map(|(k, v)| Tag::builder().key(*k).value(*v).build())
                .collect(),
        ))
        .send()
        .await
        .expect("ALB target group created");
    let arn = tg.target_groups()[0].target_group_arn().unwrap().to_owned();
    let alb = w
        .elb
        .create_load_balancer()
        .name(name("alb"))
        .r#type(LoadBalancerTypeEnum::Application)
        .scheme(LoadBalancerSchemeEnum::Internal)
        .set_subnets(Some(moto::subnet_ids().to_vec()))
        .send()
        .await
        .expect("application load balancer created");
    w.elb
        .create_listener()
        .load_balancer_arn(alb.load_balancers()[0].load_balancer_arn().unwrap())
        .protocol(ProtocolEnum::Http)
        .port(80)
        .default_actions(
            Action::builder()
                .r#type(ActionTypeEnum::Forward)
                .target_group_arn(&arn)
                .build(),
        )
        .send()
        .await
        .expect("HTTP listener forwarding to the group");
    w.put_pod(web("web-1", "10.0.1.1").build());
    w.put_pod(web("web-2", "10.0.1.2").build());
    let r = w.resync().await;
    assert_eq!(r.group(&arn).unwrap().outcome, Outcome::Changed, "{r:#?}");
    let want = ["10.0.1.1:8080", "10.0.1.2:8080"];
    assert_eq!(w.targets(&arn).await, want);
    assert_eq!(w.ledger(&arn).await, want);
    w.emulator.store().delete_pod("shop", "web-1");
    w.resync().await;
    assert_eq!(w.targets(&arn).await, ["10.0.1.2:8080"]);
}
