//! The controller at scale, over real HTTP (moto, the Kubernetes API emulator), alone in
//! its test binary: 1,000 bound target groups with the ELBv2 budgets the template gives
//! the resync.

#[path = "support/invocation.rs"]
mod invocation;
#[path = "support/moto.rs"]
mod moto;
#[path = "support/world.rs"]
mod world;

use std::time::Duration;

use invocation::{invoke, pod, until_targets};
use tgsync::testkit::set_condition;
use world::World;

/// At 1,000 bound groups, with the ELBv2 budgets the template gives the resync, a pod
/// that turns NotReady 4 s into a scheduled invocation of a warm container leaves its
/// group within 3 s: the watch runs from the first second, and the reaction's Describe
/// calls go before the full diff's discovery and verifications.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_a_thousand_groups_a_pod_turning_not_ready_leaves_within_3_s() {
    use futures::StreamExt as _;
    use tgsync::aws::{Elbv2TargetGroups, MutationRate};
    moto::use_own_server();
    let w = World::new().await;
    let web = w.group("shop", "app=web", 8080, &[]).await;
    // 999 more bound groups in ten namespaces, each selecting pods that do not exist.
    let others: Vec<String> = futures::stream::iter(0..999)
        .map(|i| {
            let w = &w;
            async move {
                let ns = format!("batch-{}", i % 10);
                w.group(&ns, &format!("app=job-{i}"), 9000, &[]).await
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    // They were verified empty before (a fleet at rest): a checkpoint each.
    w.verified_empty(&others).await;
    // The first run is one that does not re-verify web's group: a due group waits for
    // the run's paced re-verifications (120 Describes at 4 a second), which is not what
    // this test is about (`tests/watch.rs` shows the order of a cold full diff).
    let all: Vec<&str> = others
        .iter()
        .map(String::as_str)
        .chain([web.as_str()])
        .collect();
    w.skip_to_a_run_not_re_verifying(&web, &all, &tgsync::reconcile::EngineSettings::default());
    w.put_pod(pod("shop", "web", "web-1", "10.0.1.1").build());
    // The engine as the template deploys the resync: 50 % of the default budgets (8
    // Describe and 5 Register/Deregister calls per second), one container.
    let (mutations, describes) = MutationRate::container_shares(5, 8, 0.5, 1).expect("rates");
    let groups =
        Elbv2TargetGroups::from_sdk_config(&w.sdk, mutations).with_describe_rate(describes);
    let engine = w.engine_over(groups);
    // The container's first invocation: it discovers the fleet, lists the namespaces
    // and verifies every group it can in its time (a cold full diff of 1,000 groups is
    // paced by the Describe budget), registering web-1.
    let first = invoke(&engine, &w.clock, Duration::from_secs(75));
    let registered = until_targets(&w, &web, &["10.0.1.1:8080"], Duration::from_secs(75));
    let (first, took) = tokio::join!(first, registered);
    eprintln!("at 1,000 groups, web-1 was registered {took:?} into the first invocation");
    assert_eq!(
        first["totals"]["groups"].as_u64(),
        Some(1000),
        "{}",
        first["errors"]
    );
    // The next scheduled invocation; 4 s in, web-1 turns NotReady.
    let second = invoke(&engine, &w.clock, Duration::from_secs(10));
    let reaction = async {
        tokio::time::sleep(Duration::from_secs(4)).await;
        w.emulator
            .store()
            .update_pod("shop", "web-1", |p| set_condition(p, "Ready", false));
        until_targets(&w, &web, &[], Duration::from_secs(60)).await
    };
    let (second, left) = tokio::join!(second, reaction);
    eprintln!(
        "at 1,000 groups, web-1 left {left:?} after turning NotReady; the invocation: {}",
        second["watch"]
    );
    assert!(
        left <= Duration::from_secs(3),
        "web-1 left its group {left:?} after turning NotReady (want within 3 s)"
    );
}
