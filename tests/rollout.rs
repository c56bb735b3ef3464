//! A rolling update as a Deployment with `maxSurge: 1, maxUnavailable: 0` makes it, in
//! watch mode over real HTTP, against an NLB whose pace the test proxy models (moto marks
//! targets healthy at once): a new target stays `initial` for [`INITIAL_FOR`] after its
//! registration, in the second listener's group for [`SLOW_INITIAL`]
//! ([`chaos_proxy::Rules::initial_for`]). The test plays the Deployment controller and the
//! kubelet: a new gated pod starts; it turns Ready only once its `tgsync/target-health`
//! gate is True; only then is the next old pod deleted.
//!
//! What a user must see: each new pod was healthy in every group before its gate opened
//! (so the rollout went no faster than the load balancer accepted new pods), and each old
//! pod's target left every group within a second of its `deletionTimestamp`.

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
use tgsync::testkit::set_condition;
use world::World;

/// How long the NLB keeps a new target `initial` in the first listener's group.
const INITIAL_FOR: Duration = Duration::from_secs(2);

/// How long the NLB keeps a new target `initial` in the second listener's group.
const SLOW_INITIAL: Duration = Duration::from_secs(4);

/// Pods replaced.
const PODS: usize = 3;

/// How soon an old pod's target must leave every group after its `deletionTimestamp`.
const DEREGISTERED_WITHIN: Duration = Duration::from_secs(1);

/// A gated pod of app `web`, its containers and the pod `ready` or not, its gate as
/// `ready` says.
fn gated(name: &str, ip: &str, ready: bool) -> k8s_openapi::api::core::v1::Pod {
    let mut pod = invocation::pod("shop", "web", name, ip).gated().build();
    set_condition(&mut pod, "ContainersReady", ready);
    set_condition(&mut pod, "Ready", ready);
    set_condition(&mut pod, "tgsync/target-health", ready);
    pod
}

/// The `tgsync/target-health` condition's status of every stored version of the pod
/// that has one, oldest first.
fn gate_statuses(w: &World, name: &str) -> Vec<String> {
    w.emulator
        .store()
        .versions_of("shop", name)
        .into_iter()
        .filter_map(|p| {
            p.status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "tgsync/target-health")
                .map(|c| c.status)
        })
        .collect()
}

/// Waits (up to 30 s) for `name`'s gate to be True; when it was seen True.
async fn gate_open(w: &World, name: &str) -> Instant {
    let started = Instant::now();
    loop {
        if gate_statuses(w, name).last().is_some_and(|s| s == "True") {
            return Instant::now();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the gate of {name} never opened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// When the proxy first forwarded an `operation` of group `arn` naming `ip` at or after
/// `since`.
fn call_in(
    proxy: &chaos_proxy::ChaosProxy,
    operation: &str,
    arn: &str,
    ip: &str,
    since: Instant,
) -> Option<Instant> {
    let id = format!("Id={ip}&");
    proxy
        .records()
        .into_iter()
        .find(|r| {
            let body = chaos_proxy::percent_decode(&r.body) + "&";
            r.operation == operation && r.at >= since && body.contains(arn) && body.contains(&id)
        })
        .map(|r| r.at)
}

/// Waits (up to 10 s) until the proxy has forwarded an `operation` of `arn` naming `ip`
/// since `since`; when it did.
async fn until_call(
    proxy: &chaos_proxy::ChaosProxy,
    operation: &str,
    arn: &str,
    ip: &str,
    since: Instant,
) -> Instant {
    loop {
        if let Some(at) = call_in(proxy, operation, arn, ip, since) {
            return at;
        }
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "no {operation} of {ip} in {arn} within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_waits_for_the_load_balancer_and_drops_old_pods_at_once() {
    let (w, proxy) = chaos_proxy::world_behind(|r| r.initial_for = Some(INITIAL_FOR)).await;
    let fast = w.group("shop", "app=web", 8080, &[]).await;
    let slow = w.group("shop", "app=web", 8443, &[]).await;
    let needle = slow.clone();
    proxy.set_rules(|r| r.initial_for_group = vec![(needle, SLOW_INITIAL)]);
    let groups = [(&fast, INITIAL_FOR), (&slow, SLOW_INITIAL)];
    let old_ip = |i: usize| format!("10.0.1.{}", i + 1);
    let new_ip = |i: usize| format!("10.0.2.{}", i + 1);
    for i in 0..PODS {
        w.put_pod(gated(&format!("old-{i}"), &old_ip(i), true));
    }
    let r = w.resync().await;
    for (arn, _) in &groups {
        assert_eq!(
            r.group(arn).map(|g| g.registered.len()),
            Some(PODS),
            "{r:#?}"
        );
    }
    // Long enough for the rollout (about 5 s a pod: its start, the slower group's pace,
    // the gate's poll) on a loaded machine.
    let until = w.clock.now().plus(Duration::from_secs(40));
    let opts = RunOptions {
        use_checkpoint: true,
        ..RunOptions::default()
    };
    let watching = w.engine.run_scheduled(&opts, until);
    let rollout = async {
        // The watch is up once the full diff has run.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut gate_after_healthy = Vec::new();
        let mut deregistered_after = Vec::new();
        for i in 0..PODS {
            // maxSurge 1: a new pod is created; its containers start a moment later.
            let (name, ip) = (format!("new-{i}"), new_ip(i));
            let created = Instant::now();
            w.put_pod(gated(&name, &ip, false));
            tokio::time::sleep(Duration::from_millis(300)).await;
            w.emulator
                .store()
                .update_pod("shop", &name, |p| set_condition(p, "ContainersReady", true));
            // maxUnavailable 0: the old pod goes only once the new one is Ready, which
            // the kubelet makes it once the gate is True.
            let opened = gate_open(&w, &name).await;
            for (arn, initial) in &groups {
                let registered = call_in(&proxy, "RegisterTargets", arn, &ip, created)
                    .unwrap_or_else(|| panic!("{ip} was never registered in {arn}"));
                let healthy = registered + *initial;
                assert!(
                    opened >= healthy,
                    "the gate of {name} opened {:?} before its target was healthy in {arn}",
                    healthy - opened
                );
                gate_after_healthy.push(opened - healthy);
            }
            // The race this is about happened: the gate held the pod back (False while
            // its targets were `initial`) before it opened.
            let statuses = gate_statuses(&w, &name);
            assert!(
                statuses.iter().any(|s| s == "False"),
                "the gate of {name} never held it back: {statuses:?}"
            );
            w.emulator
                .store()
                .update_pod("shop", &name, |p| set_condition(p, "Ready", true));
            // The Deployment deletes an old pod: deletionTimestamp first, the kubelet's
            // preStop and grace period, then the object goes.
            let old = format!("old-{i}");
            let terminating = Instant::now();
            w.emulator.store().set_terminating("shop", &old);
            for (arn, _) in &groups {
                let at =
                    until_call(&proxy, "DeregisterTargets", arn, &old_ip(i), terminating).await;
                deregistered_after.push(at - terminating);
            }
            w.emulator.store().delete_pod("shop", &old);
        }
        for (arn, _) in &groups {
            let mut want: Vec<String> = (0..PODS).map(|i| format!("{}:8080", new_ip(i))).collect();
            if *arn == &slow {
                want = (0..PODS).map(|i| format!("{}:8443", new_ip(i))).collect();
            }
            want.sort();
            let want: Vec<&str> = want.iter().map(String::as_str).collect();
            invocation::until_targets(&w, arn, &want, Duration::from_secs(10)).await;
        }
        (gate_after_healthy, deregistered_after)
    };
    let (report, (gate_after_healthy, deregistered_after)) = tokio::join!(watching, rollout);
    eprintln!(
        "gate opened after the target was healthy in the group: {gate_after_healthy:?}; \
         old target deregistered after its deletionTimestamp: {deregistered_after:?}"
    );
    for (n, after) in deregistered_after.iter().enumerate() {
        assert!(
            *after <= DEREGISTERED_WITHIN,
            "an old pod's target left its group {after:?} after its deletionTimestamp (deregistration {n})"
        );
    }
    let watch = report.watch.expect("a watch report");
    let mut opened = watch.gates_opened.clone();
    opened.sort();
    opened.dedup();
    assert_eq!(
        opened,
        (0..PODS)
            .map(|i| format!("shop/new-{i}"))
            .collect::<Vec<_>>(),
        "{watch:#?}"
    );
}
