//! ELBv2 as it behaves beyond what moto does, met by the production adapters over real
//! HTTP: moto behind the proxy of `support/chaos_proxy.rs`, whose [`Rules`] model the
//! targets quota, QUIC groups, health reasons and zonal shifts, and the zone an ALB
//! group with cross-zone load balancing off wants for an IP outside its VPC.

#[path = "support/chaos_proxy.rs"]
mod chaos_proxy;
#[path = "support/moto.rs"]
mod moto;
#[path = "support/world.rs"]
mod world;

use std::collections::BTreeMap;
use tgsync::clock::Clock;

use aws_sdk_elasticloadbalancingv2::types::{ProtocolEnum, Tag, TargetTypeEnum};
use chaos_proxy::{ChaosProxy, Fate, HealthRule};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tgsync::aws::MutationRate;
use tgsync::report::Outcome;
use tgsync::testkit::PodBuilder;
use world::World;

fn web(name: &str, ip: &str) -> PodBuilder {
    PodBuilder::new("shop", name).label("app", "web").ip(ip)
}

/// The operations of the ELBv2 mutations the proxy saw since record `from`, in order,
/// with what it did with each.
fn mutations_since(proxy: &ChaosProxy, from: usize) -> Vec<(String, Fate)> {
    proxy.records()[from..]
        .iter()
        .filter(|r| chaos_proxy::is_mutation(r))
        .map(|r| (r.operation.clone(), r.fate))
        .collect()
}

fn strings<T: ToString>(v: &[T]) -> Vec<String> {
    v.iter().map(ToString::to_string).collect()
}

/// Deregistrations go out before registrations, so the room they free counts against the
/// group's targets quota; registrations that still do not fit are reported per target
/// with ELBv2's `TooManyTargets`, the group says what to do and does not back off; until
/// its probe is due no run sends a registration beyond the capacity it learnt, and then
/// one; they go through once there is room.
#[tokio::test]
async fn deregistrations_go_first_and_a_full_group_does_not_back_off() {
    let (w, proxy) = chaos_proxy::world_behind(|r| r.quota = Some(3)).await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    for i in 1..=3 {
        w.put_pod(web(&format!("old-{i}"), &format!("10.0.1.{i}")).build());
    }
    let r = w.resync().await;
    assert_eq!(r.group(&arn).unwrap().registered.len(), 3, "{r:#?}");

    // A rollout step: two old pods gone, three new ones ready. Three targets fit.
    for i in 1..=2 {
        w.emulator.store().delete_pod("shop", &format!("old-{i}"));
    }
    for i in 1..=3 {
        w.put_pod(web(&format!("new-{i}"), &format!("10.0.2.{i}")).build());
    }
    let from = proxy.records().len();
    let r = w.resync().await;
    let g = r.group(&arn).unwrap();
    let calls = mutations_since(&proxy, from);
    let first_register = calls.iter().position(|(op, _)| op == "RegisterTargets");
    let last_deregister = calls.iter().rposition(|(op, _)| op == "DeregisterTargets");
    assert!(
        last_deregister < first_register && last_deregister.is_some(),
        "deregistrations first: {calls:?}"
    );
    assert_eq!(
        strings(&g.deregistered),
        ["10.0.1.1:8080", "10.0.1.2:8080"],
        "{r:#?}"
    );
    assert_eq!(
        strings(&g.registered),
        ["10.0.2.1:8080", "10.0.2.2:8080"],
        "what fits is registered: {r:#?}"
    );
    assert_eq!(
        w.targets(&arn).await,
        ["10.0.1.3:8080", "10.0.2.1:8080", "10.0.2.2:8080"]
    );
    assert_eq!(g.failed_targets.len(), 1, "{r:#?}");
    assert_eq!(g.failed_targets[0].target.to_string(), "10.0.2.3:8080");
    assert!(
        g.failed_targets[0].error.contains("TooManyTargets")
            && g.failed_targets[0]
                .error
                .contains("You've reached the limit on the number of targets"),
        "ELBv2's own words: {r:#?}"
    );
    assert_eq!(g.outcome, Outcome::Failed, "{r:#?}");
    let error = g.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("quota") && error.contains("split the pods"),
        "says what to do: {error}"
    );
    assert_eq!(g.next_attempt_at, None, "no backoff: {r:#?}");
    let item = w.item(&arn).await.expect("group item");
    assert!(!item.contains_key("backoff"), "no backoff stored: {item:?}");

    assert_eq!(
        strings(&g.waiting.iter().map(|w| w.target).collect::<Vec<_>>()),
        ["10.0.2.3:8080"]
    );
    assert_eq!(g.waiting[0].pod, "shop/new-3", "{r:#?}");
    let probe_at = g.waiting[0].retry_at;

    // The next run sends nothing: the group is full and its probe is not due.
    let from = proxy.records().len();
    let r = w.resync().await;
    let g = r.group(&arn).unwrap();
    assert_eq!(g.outcome, Outcome::Failed, "{r:#?}");
    assert_eq!(g.next_attempt_at, None);
    assert_eq!(mutations_since(&proxy, from), []);
    assert_eq!(g.waiting.len(), 1, "{r:#?}");

    // Due: one refused call, still without backoff of the group.
    w.clock.advance(probe_at.0.saturating_sub(w.clock.now().0));
    let from = proxy.records().len();
    let r = w.resync().await;
    let g = r.group(&arn).unwrap();
    assert_eq!(g.outcome, Outcome::Failed, "{r:#?}");
    assert_eq!(g.next_attempt_at, None);
    assert_eq!(
        mutations_since(&proxy, from),
        [("RegisterTargets".to_owned(), Fate::Refused)]
    );

    // Room again: the last old pod goes, and the waiting target goes in.
    w.emulator.store().delete_pod("shop", "old-3");
    let r = w.resync().await;
    let g = r.group(&arn).unwrap();
    assert_eq!(g.outcome, Outcome::Changed, "{r:#?}");
    assert_eq!(strings(&g.registered), ["10.0.2.3:8080"]);
    assert_eq!(
        w.targets(&arn).await,
        ["10.0.2.1:8080", "10.0.2.2:8080", "10.0.2.3:8080"]
    );
    assert!(g.error.is_none() && g.failed_targets.is_empty(), "{r:#?}");
}

/// Creates a UDP target group (moto has no QUIC; the proxy describes it as QUIC) on
/// `port` bound to this world's cluster, and returns its ARN.
async fn udp_group(w: &World, port: i32) -> String {
    let name: String = moto::unique("quic").chars().take(32).collect();
    let out = w
        .elb
        .create_target_group()
        .name(name.trim_end_matches('-'))
        .protocol(ProtocolEnum::Udp)
        .port(port)
        .vpc_id(moto::vpc_id())
        .target_type(TargetTypeEnum::Ip)
        .set_tags(Some(
            [
                ("tgsync/cluster", w.cluster.as_str()),
                ("tgsync/namespace", "shop"),
                ("tgsync/selector", "app=web"),
            ]
            .iter()
            .map(|(k, v)| Tag::builder().key(*k).value(*v).build())
            .collect(),
        ))
        .send()
        .await
        .expect("UDP target group created");
    out.target_groups()[0]
        .target_group_arn()
        .unwrap()
        .to_owned()
}

const QUIC_ID: &str = "tgsync/quic-server-id";

/// A QUIC group registers each pod with the server ID of its annotation, or without one
/// with the ID derived from its UID (`0x` + the first 16 hex digits of its SHA-256); a
/// pod with an invalid one is a pod error and never registered; a changed ID is a deregistration and
/// a registration (ELBv2 cannot change it in place); the ID is part of the target in
/// the ledger; and a group of another protocol never sends one.
#[tokio::test]
async fn quic_targets_carry_their_pods_server_ids() {
    let mut w = World::new().await;
    let proxy = ChaosProxy::transparent().await;
    let quic = udp_group(&w, 443).await;
    let tcp = w.group("shop", "app=web", 8080, &[]).await;
    proxy.set_rules(|r| r.quic = vec![quic.clone()]);
    w.engine = chaos_proxy::engine(
        &w,
        &chaos_proxy::sdk_config(&proxy).await,
        MutationRate::new(50, None).unwrap(),
    );
    w.put_pod(
        web("web-1", "10.0.1.1")
            .annotation(QUIC_ID, "0x00000000000000a1")
            .build(),
    );
    w.put_pod(web("web-2", "10.0.1.2").build());
    w.put_pod(
        web("web-3", "10.0.1.3")
            .annotation(QUIC_ID, "0x00000000000000A3")
            .build(),
    );
    let r = w.resync().await;
    let g = r.group(&quic).unwrap();
    // web-2's UID is uid-shop-web-2:
    // printf %s uid-shop-web-2 | sha256sum | cut -c1-16 → 1dadb1884e684c2c
    assert_eq!(
        strings(&g.registered),
        [
            "10.0.1.1:443@0x00000000000000a1",
            "10.0.1.2:443@0x1dadb1884e684c2c"
        ],
        "{r:#?}"
    );
    assert_eq!(
        proxy.held(&quic),
        BTreeMap::from([
            (
                "10.0.1.1:443".to_owned(),
                (None, Some("0x00000000000000a1".to_owned()))
            ),
            (
                "10.0.1.2:443".to_owned(),
                (None, Some("0x1dadb1884e684c2c".to_owned()))
            )
        ])
    );
    let errors: BTreeMap<&str, &str> = g
        .pod_errors
        .iter()
        .map(|e| (e.pod.as_str(), e.error.as_str()))
        .collect();
    assert!(!errors.contains_key("shop/web-2"), "{errors:?}");
    assert!(errors["shop/web-3"].contains("lowercase"), "{errors:?}");
    assert_eq!(
        w.ledger(&quic).await,
        [
            "10.0.1.1:443@0x00000000000000a1",
            "10.0.1.2:443@0x1dadb1884e684c2c"
        ],
        "the ledger keys the target with its ID"
    );
    // The TCP group takes all three pods, without an ID (the proxy refuses one there).
    let t = r.group(&tcp).unwrap();
    assert_eq!(t.registered.len(), 3, "{r:#?}");
    assert!(
        t.pod_errors.is_empty() && t.failed_targets.is_empty(),
        "{r:#?}"
    );
    assert!(proxy.held(&tcp).values().all(|(_, id)| id.is_none()));

    // The IDs ELBv2 reports are the ones registered: nothing to do.
    let r = w.resync().await;
    assert_eq!(r.group(&quic).unwrap().outcome, Outcome::InSync, "{r:#?}");

    // web-1's ID changes (a new server instance): deregistered, then registered anew.
    w.emulator.store().update_pod("shop", "web-1", |p| {
        p.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(QUIC_ID.into(), "0x00000000000000b1".into());
    });
    let from = proxy.records().len();
    let r = w.resync().await;
    let g = r.group(&quic).unwrap();
    assert_eq!(
        strings(&g.deregistered),
        ["10.0.1.1:443@0x00000000000000a1"],
        "{r:#?}"
    );
    assert_eq!(strings(&g.registered), ["10.0.1.1:443@0x00000000000000b1"]);
    assert!(g.failed_targets.is_empty(), "{r:#?}");
    assert_eq!(
        proxy.held(&quic)["10.0.1.1:443"].1.as_deref(),
        Some("0x00000000000000b1")
    );
    let calls: Vec<String> = mutations_since(&proxy, from)
        .into_iter()
        .map(|(op, _)| op)
        .collect();
    assert_eq!(calls, ["DeregisterTargets", "RegisterTargets"]);
    assert_eq!(
        w.ledger(&quic).await,
        [
            "10.0.1.1:443@0x00000000000000b1",
            "10.0.1.2:443@0x1dadb1884e684c2c"
        ]
    );
}

/// What DescribeTargetHealth says beyond the state reaches the report: targets that are
/// registered but get no traffic (`unused` with ELBv2's reason), and targets under a
/// zonal shift, which stay registered and whose gates open. The health read names no
/// target (so no zone either).
#[tokio::test]
async fn unused_targets_and_zonal_shifts_are_reported_and_nothing_is_deregistered() {
    let (w, proxy) = chaos_proxy::world_behind(|r| {
        r.health = vec![
            (
                "10.0.1.1".into(),
                HealthRule {
                    state: Some("unused".into()),
                    reason: Some("Target.NotInUse".into()),
                    description: Some(
                        "Target group is not configured to receive traffic from the load balancer"
                            .into(),
                    ),
                    zonal_shift: false,
                },
            ),
            (
                "10.0.1.2".into(),
                HealthRule {
                    state: Some("unused".into()),
                    reason: Some("Target.InvalidState".into()),
                    description: Some("Target is in the stopped or terminated state".into()),
                    zonal_shift: false,
                },
            ),
            (
                "10.0.1.3".into(),
                HealthRule {
                    zonal_shift: true,
                    ..HealthRule::default()
                },
            ),
        ];
    })
    .await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-1", "10.0.1.1").build());
    w.put_pod(web("web-2", "10.0.1.2").build());
    let mut gated = web("web-3", "10.0.1.3").gated().build();
    tgsync::testkit::set_condition(&mut gated, "Ready", false);
    w.put_pod(gated);
    let r = w.resync().await;
    assert_eq!(r.group(&arn).unwrap().registered.len(), 3, "{r:#?}");

    let r = w.resync().await;
    let g = r.group(&arn).unwrap();
    assert!(
        g.deregistered.is_empty() && g.registered.is_empty(),
        "nothing to change for an unused or shifted target: {r:#?}"
    );
    assert_eq!(w.targets(&arn).await.len(), 3);
    assert_eq!(
        g.gates_opened,
        ["shop/web-3"],
        "healthy under a zonal shift"
    );
    let json = serde_json::to_value(&r).unwrap();
    let group = json["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["targetGroupArn"] == arn.as_str())
        .unwrap();
    assert_eq!(
        group["unusedTargets"],
        serde_json::json!([
            {
                "target": "10.0.1.1:8080",
                "state": "unused",
                "reason": "Target.NotInUse",
                "description": "Target group is not configured to receive traffic from the load balancer"
            },
            {
                "target": "10.0.1.2:8080",
                "state": "unused",
                "reason": "Target.InvalidState",
                "description": "Target is in the stopped or terminated state"
            }
        ]),
        "{group:#}"
    );
    assert_eq!(
        group["administrativeOverrides"],
        serde_json::json!([{
            "target": "10.0.1.3:8080",
            "state": "healthy",
            "administrativeOverride": {
                "state": "zonal_shift_active",
                "reason": "AdministrativeOverride.ZonalShiftActive",
                "description": "Target is in an Availability Zone that has traffic shifted away from it"
            }
        }]),
        "{group:#}"
    );
    assert!(g.is_eventful(), "a group with idle targets gets its line");
    // The health reads named no target, so never a zone ELBv2 may record otherwise.
    let filtered: Vec<String> = proxy
        .records()
        .into_iter()
        .filter(|r| r.operation == "DescribeTargetHealth" && r.body.contains("Targets.member"))
        .map(|r| r.body)
        .collect();
    assert!(filtered.is_empty(), "{filtered:?}");
}

fn node(name: &str, zone: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: zone.map(|z| {
                BTreeMap::from([("topology.kubernetes.io/zone".to_owned(), z.to_owned())])
            }),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

/// An ALB group with cross-zone load balancing off refuses `AvailabilityZone=all` for an
/// IP outside its VPC: each target is registered in the zone of its pod's node instead,
/// later registrations go there at once, and a pod whose node has no zone label is
/// reported with what to do.
#[tokio::test]
async fn outside_the_vpc_with_cross_zone_off_targets_go_in_their_nodes_zones() {
    let mut w = World::new().await;
    let proxy = ChaosProxy::transparent().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    proxy.set_rules(|r| {
        r.vpc = Some(("10.0.0.0".parse().unwrap(), 16));
        r.cross_zone_off = vec![arn.clone()];
        r.zones = vec!["us-east-1a".into(), "us-east-1b".into()];
    });
    w.engine = chaos_proxy::engine(
        &w,
        &chaos_proxy::sdk_config(&proxy).await,
        MutationRate::new(50, None).unwrap(),
    );
    let nodes = w.emulator.store();
    nodes.put_node(node("node-a", Some("us-east-1a")));
    nodes.put_node(node("node-b", Some("us-east-1b")));
    nodes.put_node(node("node-c", None));
    w.put_pod(web("web-1", "192.168.0.1").node("node-a").build());
    w.put_pod(web("web-2", "192.168.0.2").node("node-b").build());
    w.put_pod(web("web-3", "10.0.1.3").node("node-a").build());
    w.put_pod(web("web-4", "192.168.0.4").node("node-c").build());
    let r = w.resync().await;
    let g = r.group(&arn).unwrap();
    assert_eq!(
        strings(&g.registered),
        ["10.0.1.3:8080", "192.168.0.1:8080", "192.168.0.2:8080"],
        "{r:#?}"
    );
    let held = proxy.held(&arn);
    assert_eq!(held["192.168.0.1:8080"].0.as_deref(), Some("us-east-1a"));
    assert_eq!(held["192.168.0.2:8080"].0.as_deref(), Some("us-east-1b"));
    assert_eq!(g.failed_targets.len(), 1, "{r:#?}");
    assert_eq!(g.failed_targets[0].target.to_string(), "192.168.0.4:8080");
    assert!(
        g.failed_targets[0]
            .error
            .contains("node `node-c` has no `topology.kubernetes.io/zone` label"),
        "{r:#?}"
    );

    // The group is known to want zones: a new pod goes in its zone with no refused call
    // (`force`: the unlabelled node's failure put the group's registrations in backoff).
    w.emulator.store().delete_pod("shop", "web-4");
    w.put_pod(web("web-5", "192.168.0.5").node("node-b").build());
    let from = proxy.records().len();
    let r = w
        .resync_with(tgsync::reconcile::RunOptions {
            force: true,
            ..Default::default()
        })
        .await;
    let g = r.group(&arn).unwrap();
    assert_eq!(strings(&g.registered), ["192.168.0.5:8080"], "{r:#?}");
    assert_eq!(
        proxy.held(&arn)["192.168.0.5:8080"].0.as_deref(),
        Some("us-east-1b")
    );
    assert_eq!(
        mutations_since(&proxy, from),
        [("RegisterTargets".to_owned(), Fate::Forwarded)]
    );

    // And one leaves as any other.
    w.emulator.store().delete_pod("shop", "web-1");
    let r = w.resync().await;
    assert_eq!(
        strings(&r.group(&arn).unwrap().deregistered),
        ["192.168.0.1:8080"],
        "{r:#?}"
    );
    assert_eq!(
        w.targets(&arn).await,
        ["10.0.1.3:8080", "192.168.0.2:8080", "192.168.0.5:8080"]
    );
}
