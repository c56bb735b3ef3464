//! Nothing is dropped at the end of a run, over real HTTP with 300 bound groups. Its own
//! test binary, on its own moto server: its 300 groups would slow every other test's
//! discovery (each lists every group of the account), and its proxy delays would slow
//! the timing tests beside it.

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

/// Nothing is dropped at the end of a run: a pod change merged into its group's pass
/// while that pass is still in flight, 0.5 s before the run's time is up, is handed on,
/// and the next invocation of the warm container serves it first: with 300 bound groups
/// (and a discovery that takes 5 s), within 3 s of its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_merged_into_a_pass_at_the_end_of_a_run_is_served_first_by_the_next() {
    moto::use_own_server();
    let mut w = World::new().await;
    let proxy = chaos_proxy::ChaosProxy::transparent().await;
    w.engine = chaos_proxy::engine(
        &w,
        &chaos_proxy::sdk_config(&proxy).await,
        tgsync::aws::MutationRate::new(50, None).unwrap(),
    )
    // Groups at rest are re-verified two a minute: the runs' passes are x's.
    .with_settings(tgsync::reconcile::EngineSettings {
        verify_describes_per_second: 2.0 / 60.0,
        schedule_period: Duration::from_secs(60),
        ..Default::default()
    });
    let x = w.group("shop", "app=x", 8080, &[]).await;
    let mut idle = Vec::new();
    for i in 0..299 {
        idle.push(w.group("shop", &format!("app=idle{i}"), 8080, &[]).await);
    }
    w.verified_empty(&idle).await;
    w.put_pod(pod("shop", "x", "x-1", "10.0.1.1").build());
    w.put_pod(pod("shop", "x", "x-2", "10.0.1.2").build());
    let store = w.emulator.store();
    let x_suffix = x.rsplit('/').next().expect("an ARN").to_owned();
    // Warm-up invocations fill x and look at every group once (a group's first read
    // records on its item that no row of the earlier layout is left to fold in).
    for run in 1.. {
        let report = invoke(&w.engine, &w.clock, Duration::from_secs(6)).await;
        let deferred = report["totals"]["deferred"].as_u64().unwrap_or(0);
        let reported = report["groups"].as_array().map_or(0, Vec::len);
        if deferred == 0 && reported == 300 && w.targets(&x).await.len() == 2 {
            break;
        }
        assert!(run < 10, "{deferred} groups deferred after {run} runs");
    }
    // An invocation of 6 s of watch: 1.5 s before its end, x-1 turns NotReady (its
    // deregistration takes 1.5 s to answer), and 0.5 s before its end, x-2: that change
    // is merged into the pass still in flight.
    let watch = Duration::from_secs(6);
    let started = Instant::now();
    let first = invoke(&w.engine, &w.clock, watch);
    let changes = async {
        until_targets(&w, &x, &["10.0.1.1:8080", "10.0.1.2:8080"], watch).await;
        let rule = x_suffix.clone();
        proxy.set_rules(|r| {
            r.delay = vec![(
                "DeregisterTargets".into(),
                rule,
                Duration::from_millis(1500),
            )];
        });
        tokio::time::sleep_until((started + watch - Duration::from_millis(1500)).into()).await;
        store.update_pod("shop", "x-1", |p| set_condition(p, "Ready", false));
        tokio::time::sleep_until((started + watch - Duration::from_millis(500)).into()).await;
        store.update_pod("shop", "x-2", |p| set_condition(p, "Ready", false));
        Instant::now()
    };
    let (first, merged_at) = tokio::join!(first, changes);
    // The race: x-2 changed while x's DeregisterTargets for x-1 was in flight.
    let deregisters: Vec<_> = proxy
        .records()
        .into_iter()
        .filter(|r| r.operation == "DeregisterTargets" && r.body.contains(&x_suffix))
        .collect();
    let in_flight = deregisters.first().expect("x-1's deregistration");
    assert!(
        in_flight.at < merged_at
            && in_flight
                .answered_after
                .is_some_and(|d| in_flight.at + d > merged_at),
        "x-2 changed outside the pass in flight: {:?}",
        deregisters
            .iter()
            .map(|r| (r.at, r.answered_after))
            .collect::<Vec<_>>()
    );
    assert_eq!(w.targets(&x).await, ["10.0.1.2:8080"], "{first:#}");
    // The next invocation of the warm container; its discovery takes 5 s.
    proxy.set_rules(|r| {
        r.delay = vec![(
            "DescribeTargetGroups".into(),
            String::new(),
            Duration::from_secs(5),
        )]
    });
    let started = Instant::now();
    let second = invoke(&w.engine, &w.clock, Duration::from_secs(8));
    let served = async { until_targets(&w, &x, &[], Duration::from_secs(8)).await };
    let (second, served) = tokio::join!(second, served);
    eprintln!("x-2 left {served:?} into the next invocation");
    assert!(
        served <= Duration::from_secs(3),
        "x-2's change, merged into a pass at the end of the first invocation, was served {:?} into the next: {second:#}",
        started.elapsed().min(served)
    );
}
