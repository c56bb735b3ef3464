//! The scheduled resync as a controller, over real HTTP (moto, the Kubernetes API
//! emulator), driven through the resync handler exactly as the Lambda runtime calls it:
//! groups never wait for one another, the watch starts before discovery is done, and a
//! warm container resumes its watches instead of listing the world again.

#[path = "support/chaos_proxy.rs"]
mod chaos_proxy;
#[path = "support/invocation.rs"]
mod invocation;
#[path = "support/moto.rs"]
mod moto;
#[path = "support/world.rs"]
mod world;

use std::time::{Duration, Instant};

use invocation::{invoke, pod, until_targets};
use tgsync::testkit::set_condition;
use world::World;

/// LIST requests for pods the emulator answered (watches not counted).
fn pod_lists(w: &World) -> usize {
    w.emulator
        .faults()
        .requests()
        .iter()
        .filter(|r| {
            r.method == "GET" && r.path().ends_with("/pods") && r.query_param("watch").is_none()
        })
        .count()
}

/// One group's wait never holds another's deregistration: while group A's pass cannot
/// get A's lease (another process holds it for 15 s), group B's pod turns NotReady and
/// B's target leaves within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_waiting_for_its_lease_never_delays_another_groups_deregistration() {
    let w = World::new().await;
    let a = w.group("shop", "app=a", 8080, &[]).await;
    let b = w.group("shop", "app=b", 8080, &[]).await;
    w.put_pod(pod("shop", "a", "a-1", "10.0.1.1").build());
    w.put_pod(pod("shop", "b", "b-1", "10.0.2.1").build());
    let invocation = invoke(&w.engine, &w.clock, Duration::from_secs(25));
    let changes = async {
        until_targets(&w, &a, &["10.0.1.1:8080"], Duration::from_secs(10)).await;
        until_targets(&w, &b, &["10.0.2.1:8080"], Duration::from_secs(10)).await;
        // Another process takes A's lease (and would keep it 15 s).
        w.hold_lease(&a, "pod-events@other#1", Duration::from_secs(15))
            .await;
        // A's pod turns NotReady: A's pass now needs that lease.
        let store = w.emulator.store();
        store.update_pod("shop", "a-1", |p| set_condition(p, "Ready", false));
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Then B's pod turns NotReady.
        store.update_pod("shop", "b-1", |p| set_condition(p, "Ready", false));
        let b_left = until_targets(&w, &b, &[], Duration::from_secs(20)).await;
        let a_still = w.targets(&a).await;
        eprintln!("B's target left {b_left:?} after its pod turned NotReady");
        (b_left, a_still)
    };
    let (_, (b_left, a_still)) = tokio::join!(invocation, changes);
    assert_eq!(
        a_still,
        ["10.0.1.1:8080"],
        "the race was staged: A's pass was still kept from its lease when B's ran"
    );
    assert!(
        b_left <= Duration::from_secs(1),
        "B's NotReady pod left its group after {b_left:?} (want within 1 s)"
    );
}

/// A warm container's next scheduled invocation lists no namespace: its watches resume
/// from the stores' versions and a change made between the two invocations is applied
/// within 2 s of the start. A 410 between two invocations (the version compacted away)
/// makes the next one list again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_invocation_resumes_the_watch_and_lists_nothing() {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(pod("shop", "web", "web-1", "10.0.1.1").build());
    w.put_pod(pod("shop", "web", "web-2", "10.0.1.2").ready(false).build());
    let first = invoke(&w.engine, &w.clock, Duration::from_secs(5)).await;
    assert_eq!(w.targets(&arn).await, ["10.0.1.1:8080"], "{first:#}");
    assert!(
        first["watch"]["listedPods"].as_u64().unwrap_or(0) >= 2,
        "{first:#}"
    );
    // Between the two invocations (a frozen container in Lambda): web-2 turns Ready.
    w.emulator
        .store()
        .update_pod("shop", "web-2", |p| set_condition(p, "Ready", true));
    let lists_before = pod_lists(&w);
    let started = Instant::now();
    let second = invoke(&w.engine, &w.clock, Duration::from_secs(4));
    let applied = async {
        until_targets(
            &w,
            &arn,
            &["10.0.1.1:8080", "10.0.1.2:8080"],
            Duration::from_secs(4),
        )
        .await;
        started.elapsed()
    };
    let (second, applied) = tokio::join!(second, applied);
    assert!(
        applied <= Duration::from_secs(2),
        "the change made between the invocations was applied {applied:?} after the start"
    );
    assert_eq!(
        pod_lists(&w),
        lists_before,
        "the second invocation listed pods: {:?}",
        w.emulator.faults().requests()
    );
    assert_eq!(second["watch"]["listedPods"], 0, "{second:#}");
    assert_eq!(
        (
            first["watch"]["storedPods"].as_u64(),
            second["watch"]["storedPods"].as_u64()
        ),
        (Some(2), Some(2)),
        "both of shop's pods held in the store, listed or not"
    );
    assert!(
        second["watch"]["resumed"].as_u64().unwrap_or(0) >= 1,
        "{second:#}"
    );
    // The version is compacted away before the next invocation: it lists again, and a
    // change made meanwhile is still applied.
    w.emulator.faults().expire_next_watch();
    w.emulator.store().delete_pod("shop", "web-1");
    let lists_before = pod_lists(&w);
    let third = invoke(&w.engine, &w.clock, Duration::from_secs(4)).await;
    assert!(pod_lists(&w) > lists_before, "a 410 makes it list again");
    assert!(
        third["watch"]["relisted"].as_u64().unwrap_or(0) >= 1,
        "{third:#}"
    );
    assert_eq!(w.targets(&arn).await, ["10.0.1.2:8080"], "{third:#}");
}

/// A pass still running when the watch's time is up finishes (its ELBv2 call is slow
/// here), gives its lease back, and is in the invocation's report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_running_at_the_watchs_end_finishes_and_is_reported() {
    let (w, proxy) = chaos_proxy::world_behind(|_| {}).await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(pod("shop", "web", "web-1", "10.0.1.1").ready(false).build());
    let invocation = invoke(&w.engine, &w.clock, Duration::from_secs(4));
    let change = async {
        // After the full diff has read the group (nothing to do: the pod is not ready)
        // and the watch runs, so the change is the watch's.
        let started = std::time::Instant::now();
        while !(proxy
            .records()
            .iter()
            .any(|r| r.operation == "DescribeTargetHealth")
            && w.emulator.faults().requests().iter().any(|q| q.is_watch()))
        {
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "no full diff and watch"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The registration this change calls for takes 4 s to answer: it is still in
        // flight when the watch's time is up.
        proxy.set_rules(|r| {
            r.delay = vec![(
                "RegisterTargets".into(),
                String::new(),
                Duration::from_secs(4),
            )];
        });
        w.emulator
            .store()
            .update_pod("shop", "web-1", |p| set_condition(p, "Ready", true));
    };
    let (report, ()) = tokio::join!(invocation, change);
    assert_eq!(w.targets(&arn).await, ["10.0.1.1:8080"], "{report:#}");
    assert_eq!(report["watch"]["registered"], 1, "{report:#}");
    assert!(!w.lease_recorded(&arn).await, "the lease was given back");
}

/// A lease another process holds parks the request and holds no slot: with 16 groups'
/// leases held elsewhere (as pod-events holds them during a rollout) and a pod of each
/// changing, a NotReady pod of a 17th group still leaves its group within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_whose_leases_are_held_elsewhere_hold_no_slot() {
    let w = World::new().await;
    let mut arns = Vec::new();
    for i in 0..17 {
        let app = format!("app{i}");
        arns.push(w.group("shop", &format!("app={app}"), 8080, &[]).await);
        w.put_pod(pod("shop", &app, &format!("{app}-1"), &format!("10.0.{i}.1")).build());
    }
    let invocation = invoke(&w.engine, &w.clock, Duration::from_secs(12));
    let changes = async {
        for (i, arn) in arns.iter().enumerate() {
            until_targets(
                &w,
                arn,
                &[&format!("10.0.{i}.1:8080")],
                Duration::from_secs(10),
            )
            .await;
        }
        // Another process takes 16 groups' leases (and would keep them 15 s).
        for (i, arn) in arns[..16].iter().enumerate() {
            w.hold_lease(
                arn,
                &format!("pod-events@other#{i}"),
                Duration::from_secs(15),
            )
            .await;
        }
        // Their pods turn NotReady: each of their passes needs a held lease.
        let store = w.emulator.store();
        for i in 0..16 {
            store.update_pod("shop", &format!("app{i}-1"), |p| {
                set_condition(p, "Ready", false)
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Then the 17th group's pod.
        store.update_pod("shop", "app16-1", |p| set_condition(p, "Ready", false));
        let left = until_targets(&w, &arns[16], &[], Duration::from_secs(20)).await;
        eprintln!("the 17th group's target left {left:?} after its pod turned NotReady");
        let mut asked = 0;
        for (i, arn) in arns[..16].iter().enumerate() {
            assert_eq!(w.targets(arn).await, [format!("10.0.{i}.1:8080")], "{arn}");
            let dirty = w
                .item(arn)
                .await
                .and_then(|item| item.get("dirty").and_then(|d| d.as_bool().ok()).copied());
            asked += usize::from(dirty == Some(true));
        }
        (left, asked)
    };
    let (_, (left, asked)) = tokio::join!(invocation, changes);
    assert_eq!(
        asked, 16,
        "the race was staged: every held group's pass met its lease and asked the holder"
    );
    assert!(
        left <= Duration::from_secs(1),
        "the 17th group's NotReady pod left after {left:?} (want within 1 s)"
    );
}

/// A group whose item shows a lease held elsewhere is parked before any ELBv2 read. At
/// the template's settings (the resync's half of 8 Describe calls a second, over 2-s
/// windows), 20 groups' leases are held by another process that keeps renewing them
/// while each of them has a pod to register; the watching invocation of a warm
/// container sees those 20 changes, and then a pod of a 21st group turns NotReady: its
/// target leaves within a second. (Before, each held group's pass read its target
/// health only to learn that it could not write, and those 20 reads filled the
/// Describe budget ahead of the 21st group's: 3.2 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_whose_leases_are_held_elsewhere_read_no_target_health() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use tgsync::aws::{Elbv2TargetGroups, MutationRate};
    use tgsync::state::StateStore as _;
    const HELD: usize = 20;
    let w = World::new().await;
    let mut arns = Vec::new();
    for i in 0..=HELD {
        let app = format!("app{i}");
        arns.push(w.group("shop", &format!("app={app}"), 8080, &[]).await);
        w.put_pod(pod("shop", &app, &format!("{app}-1"), &format!("10.0.{i}.1")).build());
    }
    let (held, web) = (&arns[..HELD], &arns[HELD]);
    // Every group holds its pod's target (set up unpaced).
    let setup = w.resync().await;
    assert_eq!(setup.totals.registered, HELD + 1, "{setup:#?}");
    // The engine as the template deploys the resync, its ELBv2 calls counted by a proxy.
    let proxy = chaos_proxy::ChaosProxy::transparent().await;
    let (mutations, describes) = MutationRate::container_shares(5, 8, 0.5, 1).expect("rates");
    let groups =
        Elbv2TargetGroups::from_sdk_config(&chaos_proxy::sdk_config(&proxy).await, mutations)
            .with_describe_rate(describes);
    let engine = w.engine_over(groups);
    // A warm container: its first invocation lists and watches the namespace.
    invoke(&engine, &w.clock, Duration::from_secs(3)).await;
    // Another process of the deployment takes the 20 groups' leases and keeps renewing
    // them; each of those groups gets a new pod, a change the holder would serve.
    let holder = format!("resync@{}#elsewhere", w.cluster);
    for arn in held {
        w.hold_lease(arn, &holder, Duration::from_secs(15)).await;
    }
    let (renewing, renewals, refused) = (
        Arc::new(AtomicBool::new(true)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let renewer = {
        let (state, clock, held) = (w.engine.core.state.clone(), w.clock.clone(), held.to_vec());
        let (renewing, renewals, refused, holder) = (
            renewing.clone(),
            renewals.clone(),
            refused.clone(),
            holder.clone(),
        );
        tokio::spawn(async move {
            while renewing.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(500)).await;
                for arn in &held {
                    let until = tgsync::clock::Clock::now(&clock).plus(Duration::from_secs(15));
                    match state.renew(arn, &holder, until).await {
                        Ok(true) => renewals.fetch_add(1, Ordering::SeqCst),
                        _ => refused.fetch_add(1, Ordering::SeqCst),
                    };
                }
            }
        })
    };
    for i in 0..HELD {
        let app = format!("app{i}");
        w.put_pod(pod("shop", &app, &format!("{app}-2"), &format!("10.0.{i}.2")).build());
    }
    let (records_before, requests_before) =
        (proxy.records().len(), w.emulator.faults().requests().len());
    let invocation = invoke(&engine, &w.clock, Duration::from_secs(8));
    let change = async {
        // Once the invocation's watch has resumed (and seen the 20 new pods), the 21st
        // group's pod turns NotReady.
        let started = Instant::now();
        while !w.emulator.faults().requests()[requests_before..]
            .iter()
            .any(|q| q.is_watch())
        {
            assert!(started.elapsed() < Duration::from_secs(5), "no watch");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        w.emulator
            .store()
            .update_pod("shop", &format!("app{HELD}-1"), |p| {
                set_condition(p, "Ready", false)
            });
        until_targets(&w, web, &[], Duration::from_secs(20)).await
    };
    let (report, left) = tokio::join!(invocation, change);
    renewing.store(false, Ordering::SeqCst);
    renewer.await.expect("the renewals");
    let read_held = proxy.records()[records_before..]
        .iter()
        .filter(|r| r.operation == "DescribeTargetHealth")
        .filter(|r| {
            let body = chaos_proxy::percent_decode(&r.body);
            held.iter().any(|arn| body.contains(arn.as_str()))
        })
        .count();
    let mut asked = 0;
    for (i, arn) in held.iter().enumerate() {
        let item = w.item(arn).await.expect("an item");
        assert_eq!(
            item.get("owner").and_then(|o| o.as_s().ok()),
            Some(&holder),
            "{arn}: the lease stayed the other process's"
        );
        asked += usize::from(item.get("dirty").and_then(|d| d.as_bool().ok()) == Some(&true));
        assert_eq!(w.targets(arn).await, [format!("10.0.{i}.1:8080")], "{arn}");
    }
    eprintln!(
        "the 21st group's target left {left:?} after its pod turned NotReady; {read_held} health reads of the held groups; {} renewals; watch: {}",
        renewals.load(Ordering::SeqCst),
        report["watch"]
    );
    // The race this is about: the leases were held and renewed throughout the
    // invocation, and every held group's pass met its lease and asked the holder.
    assert_eq!(refused.load(Ordering::SeqCst), 0, "a renewal was refused");
    assert!(
        renewals.load(Ordering::SeqCst) >= 4 * HELD,
        "the holder kept renewing"
    );
    assert_eq!(
        asked, HELD,
        "every held group's holder was asked for a pass"
    );
    assert_eq!(
        read_held, 0,
        "target health of groups whose leases were held elsewhere was read"
    );
    assert!(
        left < Duration::from_secs(1),
        "the 21st group's NotReady pod left after {left:?} (want under 1 s)"
    );
}
