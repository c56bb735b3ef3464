//! The deployment's binding policy holds on every path a binding is read, not only at
//! discovery: a pass that re-reads a group's tags under the lease (pod-events and watch
//! mode work from cached bindings) applies it too, so retagging a group after it was
//! discovered cannot get around `TGSYNC_ALLOW_EXCLUSIVE` or `TGSYNC_ALLOWED_NAMESPACES`.
//! Runs the engine over the in-memory fakes. (The moto + emulator scenario is
//! `s3b_binding_policy_leaves_out_of_bounds_groups_untouched` in tests/resync.rs.)

use std::sync::Arc;

use tgsync::Engine;
use tgsync::clock::ManualClock;
use tgsync::core::{BindingPolicy, HealthState, Target, UnixMillis};
use tgsync::fakes::{FakeElb, FakePods, FakeState};
use tgsync::reconcile::{EngineSettings, RunOptions};
use tgsync::report::Outcome;
use tgsync::testkit::{PodBuilder, bound_group};

const TG: &str =
    "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/web/0123456789abcdef";

fn target(s: &str) -> Target {
    s.parse().expect("a target")
}

fn engine(policy: BindingPolicy) -> (Engine<FakePods, FakeElb, FakeState>, ManualClock) {
    let clock = ManualClock::new(UnixMillis(1_800_000_000_000));
    let elb = FakeElb::default();
    elb.add_group(bound_group(TG, "demo", "shop", "app=web", 8080));
    elb.add_target(TG, target("10.0.200.9:8080"), HealthState::Healthy);
    let pods = FakePods::default();
    pods.put(
        PodBuilder::new("shop", "web-1")
            .label("app", "web")
            .ip("10.0.1.1")
            .build(),
    );
    let engine = Engine::new(
        "demo",
        pods,
        elb,
        FakeState::default(),
        Arc::new(clock.clone()),
    )
    .with_settings(EngineSettings {
        lease_wait: None,
        binding_policy: policy,
        ..EngineSettings::default()
    });
    (engine, clock)
}

/// Discovered as `shared`, retagged `exclusive` before the pass: the pass re-reads the
/// tags under the lease and finds a binding the deployment does not allow, so the
/// group is left as it is (the foreign target stays, the new pod is not registered).
#[tokio::test]
async fn retagging_to_exclusive_after_discovery_is_refused_under_the_lease() {
    let (engine, clock) = engine(BindingPolicy::default());
    let bound = engine
        .core
        .bindings(&tgsync::groups::Priority::Reaction)
        .await
        .expect("discovery")
        .bound;
    assert_eq!(bound.len(), 1);
    engine
        .core
        .groups
        .set_tag(TG, "tgsync/mode", Some("exclusive"));
    clock.advance(60_000); // the cached binding is now old enough to be re-read
    let reports = engine.reconcile_groups(bound, &RunOptions::default()).await;
    let g = &reports[0];
    assert_eq!(g.outcome, Outcome::BindingError, "{g:#?}");
    assert!(
        g.error
            .as_deref()
            .is_some_and(|e| e.contains("TGSYNC_ALLOW_EXCLUSIVE")),
        "{g:#?}"
    );
    assert_eq!(
        engine.core.groups.live_targets(TG),
        [target("10.0.200.9:8080")],
        "untouched"
    );
    assert!(engine.core.state.ledger(TG).is_empty());
}

/// The same retagging with exclusive mode allowed is honoured: the foreign target goes.
#[tokio::test]
async fn retagging_to_exclusive_is_honoured_when_allowed() {
    let (engine, clock) = engine(BindingPolicy::unrestricted());
    let bound = engine
        .core
        .bindings(&tgsync::groups::Priority::Reaction)
        .await
        .expect("discovery")
        .bound;
    engine
        .core
        .groups
        .set_tag(TG, "tgsync/mode", Some("exclusive"));
    clock.advance(60_000);
    let reports = engine.reconcile_groups(bound, &RunOptions::default()).await;
    assert_eq!(reports[0].outcome, Outcome::Changed, "{:#?}", reports[0]);
    assert_eq!(
        engine.core.groups.live_targets(TG),
        [target("10.0.1.1:8080")]
    );
}

/// A namespace limit set while a group is bound to another namespace: discovery reports
/// it as a binding error and it never reaches a pass.
#[tokio::test]
async fn discovery_reports_a_namespace_outside_the_limit() {
    let (engine, _) = engine(BindingPolicy {
        allowed_namespaces: Some(["kafka".to_owned()].into()),
        allow_exclusive: false,
    });
    let found = engine
        .core
        .bindings(&tgsync::groups::Priority::Reaction)
        .await
        .expect("discovery");
    assert!(found.bound.is_empty());
    assert_eq!(found.errors.len(), 1);
    assert_eq!(found.errors[0].outcome, Outcome::BindingError);
    let r = engine.resync(&RunOptions::default()).await;
    assert_eq!(r.totals.errors, 1);
    assert_eq!(
        engine.core.groups.live_targets(TG),
        [target("10.0.200.9:8080")]
    );
}
