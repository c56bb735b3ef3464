//! Engine behaviour against the in-memory fakes: the design's scenarios, fast.

use std::sync::Arc;

use super::RunOptions;
use crate::clock::{Clock, ManualClock};
use crate::controller::Engine;
use crate::core::{HealthState, Target, UnixMillis};
use crate::fakes::{FakeElb, FakePods, FakeState};
use crate::faults::{CrashAt, FaultPoint};
use crate::groups::Priority;
use crate::report::Outcome;
use crate::state::{Acquire, StateStore};
use crate::testkit::{PodBuilder, bound_group};

pub(super) const TG: &str =
    "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/web/0123456789abcdef";
const TG2: &str =
    "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/api/1123456789abcdef";

pub(super) type TestEngine = Engine<FakePods, FakeElb, FakeState>;

fn engine() -> (TestEngine, ManualClock) {
    fake_engine(FakePods::default(), web_group(), 7)
}

/// Fake ELBv2 with one group, [`TG`], bound to `app=web` pods of `shop` on port 8080.
pub(super) fn web_group() -> FakeElb {
    let elb = FakeElb::default();
    elb.add_group(bound_group(TG, "demo", "shop", "app=web", 8080));
    elb
}

/// An engine of cluster `demo` on the fakes and a manual clock, never waiting for a
/// lease, with a fixed random `seed`.
pub(super) fn fake_engine(pods: FakePods, elb: FakeElb, seed: u64) -> (TestEngine, ManualClock) {
    let clock = ManualClock::new(UnixMillis(1_800_000_000_000));
    let e = Engine::new(
        "demo",
        pods,
        elb,
        FakeState::default(),
        Arc::new(clock.clone()),
    )
    .with_settings(no_waiting())
    .with_seed(seed);
    (e, clock)
}

/// Settings for tests on a manual clock: a held lease is marked dirty and left, never
/// waited on (the waiting protocol has its own tests).
pub(super) fn no_waiting() -> super::EngineSettings {
    super::EngineSettings {
        lease_wait: None,
        ..super::EngineSettings::default()
    }
}

fn t(s: &str) -> Target {
    s.parse().unwrap()
}

fn web_pod(name: &str, ip: &str) -> PodBuilder {
    PodBuilder::new("shop", name).label("app", "web").ip(ip)
}

fn seed_three(e: &TestEngine) {
    e.core.pods.put(web_pod("web-1", "10.0.1.1").build());
    e.core.pods.put(web_pod("web-2", "10.0.1.2").build());
    e.core.pods.put(web_pod("web-3", "10.0.1.3").build());
}

/// The targets of `TG`'s ledger (tombstones left out) as `ip:port`, in the ledger's
/// order.
pub(super) fn ledger_targets(e: &TestEngine) -> Vec<String> {
    e.core
        .state
        .live_ledger(TG)
        .keys()
        .map(Target::to_string)
        .collect()
}

fn live(e: &TestEngine, arn: &str) -> Vec<String> {
    e.core
        .groups
        .live_targets(arn)
        .iter()
        .map(Target::to_string)
        .collect()
}

async fn run(e: &TestEngine) -> crate::report::Report {
    e.resync(&RunOptions::default()).await
}

/// A run as the schedule makes it: the checkpoint may skip verified groups.
async fn scheduled(e: &TestEngine) -> crate::report::Report {
    e.resync(&RunOptions {
        use_checkpoint: true,
        ..RunOptions::default()
    })
    .await
}

#[tokio::test]
async fn registers_ready_pods_and_records_them() {
    let (e, _) = engine();
    seed_three(&e);
    let r = run(&e).await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.outcome, Outcome::Changed, "{r:#?}");
    assert_eq!(
        live(&e, TG),
        ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"]
    );
    let ledger = e.core.state.ledger(TG);
    assert_eq!(ledger.len(), 3);
    assert_eq!(ledger[&t("10.0.1.2:8080")].pod.name, "web-2");
    // Second run: nothing to do, one health read, no mutation.
    let before = e.core.groups.calls();
    let r = run(&e).await;
    assert_eq!(r.group(TG).unwrap().outcome, Outcome::InSync);
    let after = e.core.groups.calls();
    assert_eq!(after.get("RegisterTargets"), before.get("RegisterTargets"));
    assert_eq!(
        after["DescribeTargetHealth"],
        before["DescribeTargetHealth"] + 1
    );
}

#[tokio::test]
async fn deleted_terminating_and_unready_pods_are_deregistered() {
    let (e, _) = engine();
    seed_three(&e);
    e.core.pods.put(web_pod("web-4", "10.0.1.4").build());
    run(&e).await;
    e.core.groups.settle();
    e.core.pods.delete("shop", "web-1");
    e.core
        .pods
        .update("shop", "web-2", crate::testkit::mark_terminating);
    e.core.pods.update("shop", "web-3", |p| {
        crate::testkit::set_condition(p, "Ready", false)
    });
    let r = run(&e).await;
    let g = r.group(TG).unwrap();
    assert_eq!(
        g.deregistered,
        vec![t("10.0.1.1:8080"), t("10.0.1.2:8080"), t("10.0.1.3:8080")]
    );
    assert_eq!(live(&e, TG), ["10.0.1.4:8080"]);
    assert_eq!(e.core.state.live_ledger(TG).len(), 1);
}

#[tokio::test]
async fn foreign_targets_survive_shared_mode_and_not_exclusive() {
    let (e, _) = engine();
    seed_three(&e);
    e.core
        .groups
        .add_target(TG, t("192.168.7.7:8080"), HealthState::Healthy);
    let r = run(&e).await;
    assert_eq!(
        r.group(TG).unwrap().foreign_kept,
        vec![t("192.168.7.7:8080")]
    );
    assert!(live(&e, TG).contains(&"192.168.7.7:8080".to_string()));

    let clock = ManualClock::new(UnixMillis(1_800_000_000_000));
    let elb = FakeElb::default();
    let mut g = bound_group(TG, "demo", "shop", "app=web", 8080);
    g.tags.insert("tgsync/mode".into(), "exclusive".into());
    elb.add_group(g);
    elb.add_target(TG, t("192.168.7.7:8080"), HealthState::Healthy);
    let e = Engine::new(
        "demo",
        FakePods::default(),
        elb,
        FakeState::default(),
        Arc::new(clock),
    );
    seed_three(&e);
    let r = run(&e).await;
    assert_eq!(
        r.group(TG).unwrap().deregistered,
        vec![t("192.168.7.7:8080")]
    );
    assert!(!live(&e, TG).contains(&"192.168.7.7:8080".to_string()));
}

#[tokio::test]
async fn hand_removed_target_is_registered_again_hand_added_is_kept() {
    let (e, _) = engine();
    seed_three(&e);
    run(&e).await;
    e.core.groups.settle();
    e.core.groups.remove_target(TG, &t("10.0.1.2:8080"));
    e.core
        .groups
        .add_target(TG, t("10.9.9.9:8080"), HealthState::Healthy);
    let r = run(&e).await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.registered, vec![t("10.0.1.2:8080")]);
    assert!(g.deregistered.is_empty());
    assert_eq!(g.foreign_kept, vec![t("10.9.9.9:8080")]);
}

/// A deregistration leaves a tombstone in the ledger for the forget grace: a target
/// registered again behind it (an abandoned RegisterTargets of an earlier pass landing
/// late) is deregistered by the next pass even in shared mode, where an unclaimed
/// target would be kept; once gone, the tombstone is forgotten after the grace.
#[tokio::test]
async fn a_deregistered_target_registered_again_late_is_deregistered_again() {
    let (e, clock) = engine();
    seed_three(&e);
    run(&e).await;
    e.core.groups.settle();
    e.core.pods.delete("shop", "web-3");
    let r = run(&e).await;
    assert_eq!(r.group(TG).unwrap().deregistered, vec![t("10.0.1.3:8080")]);
    e.core.groups.settle();
    // The late landing.
    e.core
        .groups
        .add_target(TG, t("10.0.1.3:8080"), HealthState::Healthy);
    clock.advance(10_000);
    let r = run(&e).await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.deregistered, vec![t("10.0.1.3:8080")], "{g:?}");
    assert!(g.foreign_kept.is_empty(), "{g:?}");
    e.core.groups.settle();
    assert!(
        e.core.state.ledger(TG).contains_key(&t("10.0.1.3:8080")),
        "kept for the grace"
    );
    clock.advance(crate::core::FORGET_GRACE.as_millis() as u64);
    run(&e).await;
    assert!(
        !e.core.state.ledger(TG).contains_key(&t("10.0.1.3:8080")),
        "forgotten after it"
    );
}

#[tokio::test]
async fn pod_list_failure_never_deregisters() {
    let (e, _) = engine();
    seed_three(&e);
    run(&e).await;
    e.core.groups.settle();
    e.core.pods.set_failing(true);
    let r = run(&e).await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.outcome, Outcome::Failed);
    assert!(
        g.error.as_deref().unwrap().contains("listing pods"),
        "{g:?}"
    );
    assert_eq!(e.core.groups.calls().get("DeregisterTargets"), None);
    assert_eq!(live(&e, TG).len(), 3);
}

#[tokio::test]
async fn bad_tags_fail_one_group_only() {
    let (e, _) = engine();
    let mut bad = bound_group(TG2, "demo", "shop", "app!=web", 8080);
    bad.tags.insert("tgsync/port".into(), "http".into());
    e.core.groups.add_group(bad);
    seed_three(&e);
    let r = run(&e).await;
    assert_eq!(r.group(TG2).unwrap().outcome, Outcome::BindingError);
    assert!(
        r.group(TG2)
            .unwrap()
            .error
            .as_deref()
            .unwrap()
            .contains("app!=web")
    );
    assert_eq!(r.group(TG).unwrap().outcome, Outcome::Changed);
    assert!(e.core.groups.targets(TG2).is_empty());
}

#[tokio::test]
async fn dry_run_changes_nothing() {
    let (e, clock) = engine();
    seed_three(&e);
    let r = e
        .resync(&RunOptions {
            dry_run: true,
            ..Default::default()
        })
        .await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.outcome, Outcome::Planned);
    assert_eq!(g.plan.as_ref().unwrap().register.len(), 3);
    assert!(e.core.groups.targets(TG).is_empty());
    assert!(e.core.state.ledger(TG).is_empty());
    assert!(!e.core.state.lease_held(TG, clock.now()));
}

/// A resync reads a namespace's groups' states in one batch; a dry run reads each alone
/// (a batched read may record the upgrade from the earlier layout: a write).
#[tokio::test]
async fn a_resync_reads_a_namespaces_states_in_a_batch_and_a_dry_run_reads_each_alone() {
    let (e, _) = engine();
    for g in 0..5 {
        let arn = format!(
            "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/b{g}/{g:016x}"
        );
        e.core.groups.add_group(bound_group(
            &arn,
            "demo",
            "batch",
            &format!("app=b{g}"),
            8080,
        ));
    }
    e.resync(&RunOptions {
        dry_run: true,
        ..Default::default()
    })
    .await;
    let alone = e.core.state.calls().1;
    assert_eq!(e.core.state.batch_reads(), 0, "a dry run reads alone");
    assert!(alone >= 5, "{alone} reads");
    e.resync(&RunOptions::default()).await;
    assert_eq!(e.core.state.batch_reads(), 1);
    assert!(
        e.core.state.calls().1 - alone < 5,
        "the five groups were read in the batch: {} reads alone",
        e.core.state.calls().1 - alone
    );
}

/// A scheduled run at rest glances at its groups (their items without ledgers) and
/// reads none of them alone but the one due for re-verification; a group whose pods
/// changed is then read whole.
#[tokio::test]
async fn a_run_at_rest_glances_at_its_groups_and_reads_whole_what_changed() {
    let (e, clock) = engine();
    // One re-verification a run.
    let e = e.with_settings(super::EngineSettings {
        verify_describes_per_second: 1.0 / 60.0,
        ..no_waiting()
    });
    let arn = |g: usize| {
        format!("arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/w{g}/{g:016x}")
    };
    let pod = |g: usize, i: usize| {
        PodBuilder::new("shop", &format!("w{g}-{i}"))
            .label("app", &format!("w{g}"))
            .ip(&format!("10.0.{g}.{i}"))
            .build()
    };
    for g in 0..6 {
        e.core.groups.add_group(bound_group(
            &arn(g),
            "demo",
            "shop",
            &format!("app=w{g}"),
            8080,
        ));
        e.core.pods.put(pod(g, 1));
    }
    let r = scheduled(&e).await;
    assert_eq!(r.totals.registered, 6, "{r:#?}");
    e.core.groups.settle();
    let reads = |e: &TestEngine| {
        (0..6)
            .map(|g| e.core.state.reads_of(&arn(g)))
            .collect::<Vec<_>>()
    };
    // At rest: one batch of glances; only the group due reads its item alone.
    clock.advance(60_000);
    let (before, glances) = (reads(&e), e.core.state.glance_batches());
    let r = scheduled(&e).await;
    assert_eq!(e.core.state.glance_batches(), glances + 1);
    let skipped: Vec<bool> = (0..6)
        .map(|g| r.group(&arn(g)).unwrap().verification_skipped)
        .collect();
    assert_eq!(skipped.iter().filter(|s| !**s).count(), 1, "{r:#?}");
    for (g, (after, before)) in reads(&e).iter().zip(&before).enumerate() {
        assert_eq!(after - before, u64::from(!skipped[g]), "w{g}");
    }
    // A new pod for w3: its glance does not end its look, which reads it whole.
    e.core.pods.put(pod(3, 2));
    clock.advance(60_000);
    let before = reads(&e);
    let r = scheduled(&e).await;
    assert_eq!(r.group(&arn(3)).unwrap().registered.len(), 1, "{r:#?}");
    let read_alone: Vec<usize> = (0..6).filter(|g| reads(&e)[*g] > before[*g]).collect();
    assert!(read_alone.contains(&3), "{read_alone:?}");
    assert!(
        read_alone.len() <= 2,
        "w3 and the group due: {read_alone:?}"
    );
}

#[tokio::test]
async fn held_lease_marks_dirty_and_the_holder_runs_again() {
    let (e, clock) = engine();
    seed_three(&e);
    let now = clock.now();
    let until = now.plus(std::time::Duration::from_secs(60));
    let Acquire::Acquired(taken) = e.core.state.acquire(TG, "other", now, until).await.unwrap()
    else {
        panic!("free");
    };
    let r = run(&e).await;
    assert_eq!(r.group(TG).unwrap().outcome, Outcome::LeaseHeld);
    assert!(e.core.groups.targets(TG).is_empty());
    // The holder is told to run again when it releases.
    let none = crate::state::Change::default();
    assert!(matches!(
        e.core
            .state
            .release(TG, "other", now, taken.version, until, &none, false)
            .await
            .unwrap(),
        crate::state::Release::RunAgain(_)
    ));
    assert_eq!(
        e.core
            .state
            .release(TG, "other", now, taken.version, until, &none, false)
            .await
            .unwrap(),
        crate::state::Release::Released
    );
}

/// `TG` as discovery binds it.
async fn bound_web(e: &TestEngine) -> super::BoundGroup {
    let found = e.core.bindings(&Priority::Reaction).await.unwrap();
    found.bound.into_iter().find(|b| b.group.arn == TG).unwrap()
}

/// One look at `bound` from the fakes' pods, as the schedule's full diff makes it
/// (`verification`) or as a pod change's pass does.
async fn look(
    e: &TestEngine,
    bound: &super::BoundGroup,
    verification: bool,
) -> (crate::report::GroupReport, super::Action) {
    use crate::pods::PodSource as _;
    let listing = e.core.pods.list_versioned("shop", None).await.unwrap();
    let pods = crate::core::PodIndex::new(&listing.pods);
    let opts = RunOptions {
        use_checkpoint: verification,
        ..RunOptions::default()
    };
    match e
        .core
        .observe(bound, &pods, &opts, &super::Scope::default())
        .await
    {
        super::Observed::Done(report, action) => (report, action.expect("the look finished")),
        super::Observed::Change(report, _) => (report, super::Action::Done),
        super::Observed::Irrelevant => panic!("the look is the group's"),
    }
}

/// A group whose item shows another process's live lease is parked before any ELBv2
/// read: its holder is asked for a pass (`dirty`) and the key waits until the lease may
/// be taken over, whether the look verifies the group or serves a pod change. (Before,
/// each look read the group's target health only to learn that it could not write.)
#[tokio::test]
async fn a_lease_held_elsewhere_parks_the_look_before_any_elbv2_read() {
    let (e, clock) = engine();
    seed_three(&e);
    run(&e).await;
    // A pod the holder has not served yet: the look would have a change.
    e.core.pods.put(web_pod("web-4", "10.0.1.4").build());
    let now = clock.now();
    let until = now.plus(std::time::Duration::from_secs(15));
    let Acquire::Acquired(taken) = e
        .core
        .state
        .acquire(TG, "resync@demo#other", now, until)
        .await
        .unwrap()
    else {
        panic!("the other holder takes the lease");
    };
    let grace = e.core.settings.lease.takeover_grace;
    let bound = bound_web(&e).await;
    for verification in [true, false] {
        let before = e.core.groups.calls();
        let (report, action) = look(&e, &bound, verification).await;
        assert_eq!(
            action,
            super::Action::LeaseHeld {
                until: until.plus(grace)
            },
            "verification: {verification}; {report:#?}"
        );
        assert_eq!(report.outcome, Outcome::LeaseHeld);
        assert_eq!(report.lease_until, Some(until.plus(grace)));
        assert_eq!(
            e.core.groups.calls(),
            before,
            "an ELBv2 call for a group it cannot write"
        );
        assert!(
            e.core.state.stored(TG).dirty,
            "the holder was asked for a pass"
        );
        // The holder serves the request when it releases.
        let none = crate::state::Change::default();
        assert!(matches!(
            e.core
                .state
                .release(
                    TG,
                    "resync@demo#other",
                    now,
                    taken.version,
                    until,
                    &none,
                    false
                )
                .await
                .unwrap(),
            crate::state::Release::RunAgain(_)
        ));
    }
}

/// A verification needs no lease when it finds nothing to change: one that keeps
/// finding the lease held for longer than a dead holder could keep it reads health
/// after all and ends in sync, while a pod change's look still waits for the holder.
#[tokio::test]
async fn a_verification_is_not_parked_forever_on_a_lease_that_keeps_being_renewed() {
    let (e, clock) = engine();
    seed_three(&e);
    run(&e).await;
    let now = clock.now();
    let timings = e.core.settings.lease;
    let owner = "resync@demo#other";
    let until = now.plus(timings.duration);
    assert!(matches!(
        e.core.state.acquire(TG, owner, now, until).await.unwrap(),
        Acquire::Acquired(_)
    ));
    let bound = bound_web(&e).await;
    let (_, first) = look(&e, &bound, true).await;
    assert!(
        matches!(first, super::Action::LeaseHeld { .. }),
        "{first:?}"
    );
    // The holder keeps renewing, past the longest a dead holder could keep the group.
    clock.advance((timings.duration + timings.takeover_grace).as_millis() as u64);
    assert!(
        e.core
            .state
            .renew(TG, owner, clock.now().plus(timings.duration))
            .await
            .unwrap()
    );
    let before = e.core.groups.calls();
    let (report, action) = look(&e, &bound, true).await;
    assert_eq!(action, super::Action::Done, "{report:#?}");
    assert_eq!(report.outcome, Outcome::InSync);
    assert_eq!(
        e.core.groups.calls()["DescribeTargetHealth"],
        before["DescribeTargetHealth"] + 1
    );
    let (_, change) = look(&e, &bound, false).await;
    assert!(
        matches!(change, super::Action::LeaseHeld { .. }),
        "{change:?}"
    );
}

#[tokio::test]
async fn failures_back_off_and_force_overrides() {
    let (e, clock) = engine();
    seed_three(&e);
    e.core.groups.set_failing_mutations(true);
    let r = run(&e).await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.outcome, Outcome::Failed);
    assert_eq!(g.failed_targets.len(), 3);
    assert_eq!(e.core.state.backoff(TG).unwrap().failures, 1);
    // Ledger rows were written ahead: a superset of what is registered.
    assert_eq!(e.core.state.ledger(TG).len(), 3);
    e.core.groups.set_failing_mutations(false);
    let r = run(&e).await;
    assert_eq!(r.group(TG).unwrap().outcome, Outcome::BackingOff);
    let r = e
        .resync(&RunOptions {
            force: true,
            ..Default::default()
        })
        .await;
    assert_eq!(r.group(TG).unwrap().outcome, Outcome::Changed);
    assert_eq!(e.core.state.backoff(TG), None, "success resets backoff");
    assert_eq!(live(&e, TG).len(), 3);
    let _ = clock;
}

/// Kill the reconcile at every fault point, in a run that registers, deregisters and
/// forgets at once; the next run (after the lease expires) must converge.
#[tokio::test]
async fn crash_at_any_fault_point_then_converge() {
    for point in FaultPoint::ALL {
        let (mut e, clock) = engine();
        seed_three(&e);
        e.core
            .groups
            .add_target(TG, t("192.168.7.7:8080"), HealthState::Healthy);
        scheduled(&e).await;
        e.core.groups.settle();
        // Changes: web-1 gone (deregister), web-4 new (register), web-2 removed by hand
        // and its pod gone too (forget), a backoff row to clear.
        e.core.pods.delete("shop", "web-1");
        e.core.pods.delete("shop", "web-2");
        e.core.groups.remove_target(TG, &t("10.0.1.2:8080"));
        e.core.pods.put(web_pod("web-4", "10.0.1.4").build());
        let mut stored = e.core.state.stored(TG);
        stored.backoff = Some(crate::core::BackoffState {
            failures: 1,
            next_attempt: UnixMillis(0),
        });
        e.core.state.put(TG, stored);
        let crash = Arc::new(CrashAt::first(point));
        e.core.faults = crash.clone();
        let r = scheduled(&e).await;
        assert!(crash.fired(), "{point} never reached: {r:#?}");
        assert_eq!(r.group(TG).unwrap().outcome, Outcome::Aborted);
        // A killed Lambda leaves its lease until expiry.
        e.core.faults = Arc::new(crate::faults::NoFaults);
        clock.advance(200_000);
        let r = scheduled(&e).await;
        assert_ne!(
            r.group(TG).unwrap().outcome,
            Outcome::Failed,
            "{point}: {r:#?}"
        );
        e.core.groups.settle();
        let r = scheduled(&e).await;
        assert_eq!(
            r.group(TG).unwrap().outcome,
            Outcome::InSync,
            "{point}: {r:#?}"
        );
        assert_eq!(
            live(&e, TG),
            ["10.0.1.3:8080", "10.0.1.4:8080", "192.168.7.7:8080"],
            "{point}"
        );
        let ledger = ledger_targets(&e);
        assert_eq!(
            ledger,
            ["10.0.1.3:8080", "10.0.1.4:8080"],
            "{point}: stale ledger rows"
        );
        assert_eq!(e.core.state.backoff(TG), None, "{point}");
    }
}

#[tokio::test]
async fn gated_pod_is_registered_then_its_gate_opens_once_healthy() {
    let (e, _) = engine();
    let mut pod = web_pod("web-g", "10.0.1.9").gated().build();
    crate::testkit::set_condition(&mut pod, "Ready", false); // held by the gate
    e.core.pods.put(pod);
    let r = run(&e).await;
    let g = r.group(TG).unwrap();
    assert_eq!(
        g.registered,
        vec![t("10.0.1.9:8080")],
        "registered on ContainersReady"
    );
    assert!(g.gates_opened.is_empty(), "target not healthy yet");
    e.core.groups.settle(); // the NLB's health checks pass
    let r = run(&e).await;
    assert_eq!(
        r.group(TG).unwrap().gates_opened,
        vec!["shop/web-g".to_string()]
    );
    let pod = crate::pods::PodSource::get(&e.core.pods, "shop", "web-g")
        .await
        .unwrap()
        .unwrap();
    let facts = crate::core::PodFacts::from_pod(pod);
    assert_eq!(facts.gate, Some(true));
    let r = run(&e).await;
    assert!(r.group(TG).unwrap().gates_opened.is_empty(), "opened once");
}

/// Beyond the Describe budget, unchanged groups are re-verified in turn: each run reads
/// the health of the groups whose turn has come (plus every group whose desired set
/// changed), and a hand edit is found within the stated bound.
#[tokio::test]
async fn beyond_the_budget_unchanged_groups_are_verified_in_turn() {
    let (e, clock) = engine();
    // One re-verification per 60-second run; three groups: a cycle of three runs.
    let e = e.with_settings(super::EngineSettings {
        verify_describes_per_second: 1.0 / 60.0,
        ..no_waiting()
    });
    e.core
        .groups
        .add_group(bound_group(TG2, "demo", "shop", "app=web", 9090));
    let tg3 =
        "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/adm/2123456789abcdef";
    e.core
        .groups
        .add_group(bound_group(tg3, "demo", "shop", "app=web", 7070));
    seed_three(&e);
    let r = scheduled(&e).await;
    assert_eq!(r.totals.changed, 3, "{r:#?}");
    let v = r
        .verification
        .expect("a scheduled run states its verification");
    assert_eq!((v.budget_per_run, v.cycle_runs), (1, 3));
    assert_eq!(v.detection_bound_seconds, 180);
    e.core.groups.settle();
    let health = |e: &TestEngine| {
        e.core
            .groups
            .calls()
            .get("DescribeTargetHealth")
            .copied()
            .unwrap_or(0)
    };
    // Unchanged: one group's health read per run, each group once per cycle.
    let mut verified = std::collections::BTreeMap::<String, u32>::new();
    for _ in 0..3 {
        clock.advance(60_000);
        let before = health(&e);
        let r = scheduled(&e).await;
        assert_eq!(health(&e), before + 1, "{r:#?}");
        for g in r.groups.iter().filter(|g| !g.verification_skipped) {
            *verified.entry(g.target_group_arn.clone()).or_default() += 1;
        }
    }
    assert_eq!(verified.len(), 3, "{verified:?}");
    // A pod change changes the desired set of every group: all read at once.
    e.core.pods.put(web_pod("web-4", "10.0.1.4").build());
    clock.advance(60_000);
    let r = scheduled(&e).await;
    assert_eq!(r.totals.registered, 3, "{r:#?}");
    e.core.groups.settle();
    // External drift waits for the group's turn, within the bound.
    e.core.groups.remove_target(TG, &t("10.0.1.1:8080"));
    let mut runs = 0;
    loop {
        clock.advance(60_000);
        runs += 1;
        let r = scheduled(&e).await;
        if !r.group(TG).unwrap().registered.is_empty() {
            break;
        }
        assert!(runs <= 3, "drift not found within the detection bound");
    }
    assert!(live(&e, TG).contains(&"10.0.1.1:8080".to_string()));
    // `force` never skips.
    let before = health(&e);
    e.resync(&RunOptions {
        force: true,
        ..RunOptions::default()
    })
    .await;
    assert_eq!(health(&e), before + 3);
}

/// Options of a scheduled run whose invocation ends `secs` from now.
fn ending_in(clock: &ManualClock, secs: u64) -> RunOptions {
    RunOptions {
        deadline: Some(clock.now().plus(std::time::Duration::from_secs(secs))),
        use_checkpoint: true,
        ..RunOptions::default()
    }
}

#[tokio::test]
async fn a_run_too_close_to_its_deadline_starts_nothing() {
    let (e, clock) = engine();
    seed_three(&e);
    let r = e.resync(&ending_in(&clock, 15)).await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.outcome, Outcome::Deferred, "{r:#?}");
    assert!(g.error.as_deref().unwrap().contains("next run"));
    assert!(live(&e, TG).is_empty());
    assert_eq!(
        e.core.pods.list_calls(),
        0,
        "no LIST for groups that were not started"
    );
    assert!(!e.core.state.lease_held(TG, clock.now()));
    // The next run, with time to spare, does the work.
    let r = e.resync(&ending_in(&clock, 120)).await;
    assert_eq!(r.group(TG).unwrap().outcome, Outcome::Changed, "{r:#?}");
    assert_eq!(live(&e, TG).len(), 3);
}

/// Leases are taken before the namespace's LIST; when the LIST is slow enough to pass
/// the cut-off (20 s before the deadline), the groups give their leases back and are
/// deferred instead of running into the function timeout, which would leave them
/// locked (and pod events for them ignored) until the lease expires.
#[tokio::test]
async fn groups_whose_turn_comes_after_the_cut_off_release_their_leases() {
    let (e, clock) = engine();
    e.core
        .groups
        .add_group(bound_group(TG2, "demo", "shop", "app=web", 9090));
    seed_three(&e);
    e.core.pods.slow_lists(&clock, 45_000);
    let r = e.resync(&ending_in(&clock, 60)).await;
    for arn in [TG, TG2] {
        let g = r.group(arn).unwrap();
        assert_eq!(g.outcome, Outcome::Deferred, "{r:#?}");
        assert!(
            live(&e, arn).is_empty(),
            "nothing registered after the cut-off"
        );
        assert!(
            !e.core.state.lease_held(arn, clock.now()),
            "{arn}: the lease was given back"
        );
    }
    assert_eq!(
        e.core.pods.list_calls(),
        1,
        "the leases were taken, then the LIST ran"
    );
    // A pod event right after finds the group free.
    assert!(matches!(
        e.core
            .state
            .acquire(
                TG,
                "pod-events",
                clock.now(),
                clock.now().plus(std::time::Duration::from_secs(60))
            )
            .await
            .unwrap(),
        Acquire::Acquired(_)
    ));
}

/// When every run runs out of time, the groups it leaves for the next run change from
/// run to run, so no group is starved: here each run has time for about two of four
/// namespaces, and within a few runs every group holds its pod.
#[tokio::test]
async fn deferred_groups_are_not_the_same_every_run() {
    let (e, clock) = engine();
    // One call at a time, so the fake's slow LISTs add up as they would in real time.
    let e = e.with_settings(super::EngineSettings {
        concurrency: 1,
        ..no_waiting()
    });
    let arns: Vec<String> = (0..4)
        .map(|i| {
            format!(
                "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/ns{i}/{i:016x}"
            )
        })
        .collect();
    for (i, arn) in arns.iter().enumerate() {
        let ns = format!("ns-{i}");
        e.core
            .groups
            .add_group(bound_group(arn, "demo", &ns, "app=web", 8080));
        e.core.pods.put(
            PodBuilder::new(&ns, "web")
                .label("app", "web")
                .ip(&format!("10.0.9.{}", i + 1))
                .build(),
        );
    }
    e.core.pods.slow_lists(&clock, 8_000);
    let mut runs = 0;
    let mut deferred_sets = std::collections::BTreeSet::new();
    while arns.iter().any(|arn| live(&e, arn).is_empty()) {
        runs += 1;
        assert!(runs <= 12, "some group never got its turn in 12 runs");
        let r = e.resync(&ending_in(&clock, 60)).await;
        let deferred: Vec<&str> = r
            .groups
            .iter()
            .filter(|g| g.outcome == Outcome::Deferred)
            .map(|g| g.target_group_arn.as_str())
            .collect();
        assert!(!deferred.is_empty(), "each run is short of time: {r:#?}");
        deferred_sets.insert(deferred.join(","));
        clock.advance(60_000);
    }
    assert!(
        deferred_sets.len() > 1,
        "the deferred groups changed between runs"
    );
}

/// With a slow state table, taking every group's lease before any group runs would use
/// the whole invocation and defer everything, every run. Namespaces are admitted a few
/// at a time, so a run finishes what it admitted and defers the rest without leases.
#[tokio::test]
async fn a_slow_state_table_still_lets_each_run_finish_some_groups() {
    let (e, clock) = engine();
    let e = e.with_settings(super::EngineSettings {
        concurrency: 4,
        ..no_waiting()
    });
    let mut arns = Vec::new();
    for n in 0..20 {
        let ns = format!("ns-{n}");
        for g in 0..4 {
            let arn = format!(
                "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/g{n}{g}/{n:08x}{g:08x}"
            );
            let app = format!("app-{g}");
            e.core
                .groups
                .add_group(bound_group(&arn, "demo", &ns, &format!("app={app}"), 8080));
            e.core.pods.put(
                PodBuilder::new(&ns, &app)
                    .label("app", &app)
                    .ip(&format!("10.0.{n}.{}", g + 1))
                    .build(),
            );
            arns.push(arn);
        }
    }
    // One batched read of each namespace's groups and one of the fixture's group: 21
    // reads at 3 s each would take 63 s; the invocation has 60 s (cut-off at 40 s).
    e.core.state.slow_reads(&clock, 3_000);
    let r = e.resync(&ending_in(&clock, 60)).await;
    let changed = r
        .groups
        .iter()
        .filter(|g| g.outcome == Outcome::Changed)
        .count();
    let deferred = r
        .groups
        .iter()
        .filter(|g| g.outcome == Outcome::Deferred)
        .count();
    assert!(changed >= 8, "the admitted namespaces finished: {r:#?}");
    assert!(deferred > 0, "the run ran out of time: {r:#?}");
    // The engine's fixture group in `shop` makes 81.
    assert_eq!(changed + deferred, r.groups.len(), "{r:#?}");
    for arn in &arns {
        assert!(
            !e.core.state.lease_held(arn, clock.now()),
            "{arn}: lease left held"
        );
    }
}

/// A `dirty` flag no holder serves (its holder gave up, or a run handed a change on and
/// no run took it) is served by the next scheduled run that can take the lease: its pass
/// clears it and records the checkpoint the flag kept from the group (without one, every
/// run reads the group's health outside the verification budget).
#[tokio::test]
async fn a_dirty_flag_with_no_holder_is_served_by_the_next_run() {
    let (e, clock) = engine();
    seed_three(&e);
    scheduled(&e).await;
    e.core.groups.settle();
    clock.advance(60_000);
    scheduled(&e).await;
    assert!(
        e.core.state.stored(TG).checkpoint.is_some(),
        "verified at rest"
    );
    // A flag left set, with no lease on the item.
    let mut left = e.core.state.stored(TG);
    left.dirty = true;
    left.checkpoint = None;
    e.core.state.put(TG, left);
    clock.advance(60_000);
    scheduled(&e).await;
    let served = e.core.state.stored(TG);
    assert!(!served.dirty, "the flag is still set: {served:?}");
    assert!(
        served.checkpoint.is_some(),
        "no checkpoint recorded: {served:?}"
    );
}

/// A lease that ended less than the takeover grace ago (its holder's abandoned attempt
/// may still land) is not free: a verification made without the lease records no
/// checkpoint then, and records one once the grace has passed.
#[tokio::test]
async fn a_verification_records_nothing_within_a_leases_takeover_grace() {
    let (e, clock) = engine();
    seed_three(&e);
    scheduled(&e).await;
    e.core.groups.settle();
    let mut ended = e.core.state.stored(TG);
    ended.checkpoint = None;
    ended.lease = Some(crate::state::LeaseView {
        owner: "other".into(),
        until: clock.now(),
    });
    e.core.state.put(TG, ended);
    clock.advance(1_000);
    scheduled(&e).await;
    assert_eq!(
        e.core.state.stored(TG).checkpoint,
        None,
        "recorded within the grace"
    );
    clock.advance(e.core.settings.lease.grace_ms());
    scheduled(&e).await;
    assert!(
        e.core.state.stored(TG).checkpoint.is_some(),
        "not recorded after it"
    );
}

/// A gate counts every bound group whose binding selects the pod: a group that selects
/// it but cannot hold it (here its `tgsync/port` names a port the pod does not declare)
/// keeps the gate False with a reason naming the group and the cause, and a pod no
/// group can hold gets a reason too.
#[tokio::test]
async fn a_group_that_selects_a_gated_pod_but_cannot_hold_it_keeps_its_gate_closed() {
    let (e, _) = engine();
    let mut named = bound_group(TG2, "demo", "shop", "app=web", 8080);
    named
        .tags
        .insert("tgsync/port".to_owned(), "metrics".to_owned());
    e.core.groups.add_group(named);
    let mut pod = web_pod("web-g", "10.0.1.9").gated().build();
    crate::testkit::set_condition(&mut pod, "Ready", false);
    e.core.pods.put(pod);
    run(&e).await;
    e.core.groups.settle();
    let r = run(&e).await;
    assert!(
        r.groups.iter().all(|g| g.gates_opened.is_empty()),
        "the gate opened on the group that can hold the pod alone: {r:#?}"
    );
    let pod = crate::pods::PodSource::get(&e.core.pods, "shop", "web-g")
        .await
        .unwrap()
        .unwrap();
    let facts = crate::core::PodFacts::from_pod(pod);
    assert_eq!(facts.gate, Some(false));
    let (reason, message) = facts.gate_said.expect("the gate says why");
    assert!(
        message.contains("api") && message.contains("metrics"),
        "{reason}: {message}"
    );
    // A pod only that group selects: no group can hold it, and it is told so.
    let mut other = web_pod("solo", "10.0.1.8").gated().build();
    other.metadata.labels = Some(std::collections::BTreeMap::from([(
        "app".to_owned(),
        "solo".to_owned(),
    )]));
    crate::testkit::set_condition(&mut other, "Ready", false);
    e.core.pods.put(other);
    let tg3 =
        "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/solo/3123456789abcdef";
    let mut solo = bound_group(tg3, "demo", "shop", "app=solo", 8080);
    solo.tags
        .insert("tgsync/port".to_owned(), "metrics".to_owned());
    e.core.groups.add_group(solo);
    run(&e).await;
    let pod = crate::pods::PodSource::get(&e.core.pods, "shop", "solo")
        .await
        .unwrap()
        .unwrap();
    let facts = crate::core::PodFacts::from_pod(pod);
    let (reason, message) = facts
        .gate_said
        .expect("a pod no group can hold is told why");
    assert!(message.contains("metrics"), "{reason}: {message}");
}

/// What a sink is told, as the functions would print it: each pass's metric lines.
#[derive(Default)]
struct Lines(std::sync::Mutex<Vec<serde_json::Value>>);

impl crate::metrics::Sink for Lines {
    fn pass(&self, pass: &crate::metrics::PassDone<'_>) {
        let lines = crate::metrics::pass_lines(pass, crate::logging::LambdaLevel::Info);
        self.0
            .lock()
            .unwrap()
            .extend(lines.iter().map(|l| serde_json::from_str(l).unwrap()));
    }

    fn gate(&self, _: &str, _: &str, _: UnixMillis, _: std::time::Duration) {}
}

/// Two pods of the Kubernetes default template (30-s grace, no preStop, no gate) and
/// one of the documented template (190-s preStop sleep, 220-s grace, the gate).
fn seed_templates(e: &TestEngine) {
    e.core.pods.put(web_pod("web-1", "10.0.1.1").build());
    e.core.pods.put(web_pod("web-2", "10.0.1.2").build());
    e.core.pods.put(
        web_pod("web-3", "10.0.1.3")
            .gated()
            .grace_period(220)
            .pre_stop_sleep(190)
            .build(),
    );
}

/// The rollout check is in every group's report with the numbers it used: tgsync's
/// latency (watch mode's 5 s by default), the NLB's 180-s allowance, the pods too short
/// and without the gate. The group's attributes are read by a look that verified the
/// group and found nothing to change (never by the pass that registers: it reports
/// them as not read yet), once, and again when the read is an hour old.
#[tokio::test]
async fn the_report_carries_the_rollout_check_with_the_numbers_it_used() {
    let (e, clock) = engine();
    seed_templates(&e);
    let r = run(&e).await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.outcome, Outcome::Changed);
    let c = g.rollout.as_ref().expect("a rollout check");
    assert!(
        c.unchecked
            .as_deref()
            .is_some_and(|u| u.contains("not read yet")),
        "{c:#?}"
    );
    assert_eq!((c.pods, c.without_gate, c.too_short), (3, 2, 0));
    assert_eq!(
        e.core.groups.calls().get("DescribeTargetGroupAttributes"),
        None
    );
    // The next look verifies the group, finds it right, and reads the attributes.
    let r = run(&e).await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.outcome, Outcome::InSync);
    let c = g.rollout.as_ref().unwrap();
    assert_eq!(c.unchecked, None, "{c:#?}");
    assert_eq!(
        c.load_balancer,
        Some(crate::core::rollout::LoadBalancerType::Nlb)
    );
    assert_eq!(c.mode, crate::core::rollout::Reaction::Watch);
    assert_eq!(
        (
            c.latency_seconds,
            c.allowance_seconds,
            c.pre_stop_needed_seconds
        ),
        (5, Some(180), Some(185))
    );
    assert_eq!(
        (c.pods, c.covered, c.too_short, c.unknown, c.without_gate),
        (3, 1, 2, 0, 2)
    );
    assert_eq!(c.terminations.len(), 2);
    assert_eq!(
        (c.terminations[0].grace_seconds, c.terminations[0].pods),
        (30, 2)
    );
    assert!(
        c.terminations[0]
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("no preStop")),
        "{c:#?}"
    );
    assert_eq!(
        (
            c.terminations[1].grace_seconds,
            c.terminations[1].pre_stop_seconds
        ),
        (220, Some(190))
    );
    let group = c.group.as_ref().unwrap();
    assert_eq!(group.deregistration_delay_seconds, Some(300));
    assert_eq!(group.connection_termination, Some(false));
    assert!(c.findings.is_empty(), "pods are named in dry runs only");
    // In the JSON report, as an operator reads it.
    let json = serde_json::to_value(g).unwrap();
    assert_eq!(json["rollout"]["tooShort"], 2);
    assert_eq!(json["rollout"]["withoutGate"], 2);
    assert_eq!(json["rollout"]["loadBalancer"], "NLB");
    assert_eq!(json["rollout"]["allowanceSeconds"], 180);
    assert_eq!(e.core.groups.calls()["DescribeTargetGroupAttributes"], 1);
    // Cached: the next looks read nothing more, until the read is an hour old.
    run(&e).await;
    assert_eq!(e.core.groups.calls()["DescribeTargetGroupAttributes"], 1);
    clock.advance(3_600_000);
    let r = run(&e).await;
    assert_eq!(e.core.groups.calls()["DescribeTargetGroupAttributes"], 2);
    assert_eq!(r.group(TG).unwrap().rollout.as_ref().unwrap().too_short, 2);
}

/// A pass that acts on a pod change writes its metric line, and the line counts the
/// group's pods whose termination is too short (`TerminationTooShort`); a quiet pass
/// writes no line for it.
#[tokio::test]
async fn a_changing_pass_counts_the_pods_terminating_too_soon() {
    let (e, _) = engine();
    let lines = Arc::new(Lines::default());
    let e = e.with_sink(lines.clone());
    seed_templates(&e);
    run(&e).await;
    run(&e).await;
    e.core.groups.settle();
    lines.0.lock().unwrap().clear();
    run(&e).await;
    assert!(
        lines.0.lock().unwrap().is_empty(),
        "a quiet run writes no line for the check"
    );
    // The rollout begins: a pod of the old template goes.
    e.core
        .pods
        .update("shop", "web-1", crate::testkit::mark_terminating);
    let r = run(&e).await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.deregistered, [t("10.0.1.1:8080")]);
    let c = g.rollout.as_ref().unwrap();
    assert_eq!(
        (c.pods, c.too_short),
        (3, 2),
        "the terminating pod counts too"
    );
    let lines = lines.0.lock().unwrap();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!(lines[0]["TerminationTooShort"], 2);
    assert_eq!(lines[0]["Deregistered"], 1);
}

/// A dry run (what `tgsync status` runs) reads the attributes it has not read, whatever
/// the budget, and names each pod too short with why; a group whose attributes cannot be
/// read (a role without `elasticloadbalancing:DescribeTargetGroupAttributes`) is
/// reconciled as usual, its check saying why it is unchecked. An ALB group takes the
/// ALB's allowance, as set.
#[tokio::test]
async fn a_dry_run_names_the_pods_too_short_and_an_unreadable_group_is_unchecked() {
    let (e, _) = engine();
    let mut settings = no_waiting();
    settings.rollout.allowances.alb_seconds = 100;
    let e = e.with_settings(settings);
    let api = bound_group(TG2, "demo", "shop", "app=web", 8080);
    e.core.groups.add_group(api);
    e.core.groups.set_attributes(
        TG2,
        crate::core::rollout::GroupAttributes {
            protocol: Some("HTTP".into()),
            ..Default::default()
        },
    );
    e.core.groups.refuse_attributes(
        TG,
        "AccessDenied: not authorized to perform elasticloadbalancing:DescribeTargetGroupAttributes",
    );
    seed_templates(&e);
    let r = e
        .resync(&RunOptions {
            dry_run: true,
            ..RunOptions::default()
        })
        .await;
    let web = r.group(TG).unwrap();
    assert_eq!(web.outcome, Outcome::Planned);
    let c = web.rollout.as_ref().unwrap();
    assert!(
        c.unchecked
            .as_deref()
            .is_some_and(|u| u.contains("DescribeTargetGroupAttributes")),
        "{c:#?}"
    );
    assert_eq!((c.too_short, c.without_gate), (0, 2));
    let api = r.group(TG2).unwrap();
    let c = api.rollout.as_ref().unwrap();
    assert_eq!(
        (c.allowance_seconds, c.pre_stop_needed_seconds),
        (Some(100), Some(105))
    );
    // The documented NLB template covers an ALB's 105 s too.
    assert_eq!((c.covered, c.too_short), (1, 2));
    let named: Vec<&str> = c.findings.iter().map(|p| p.pod.as_str()).collect();
    assert_eq!(named, ["shop/web-1", "shop/web-2"]);
    assert!(
        c.findings[0]
            .reason
            .contains("at least 105 s (watch 5 s + ALB 100 s)"),
        "{:?}",
        c.findings
    );
    assert!(
        c.findings[0]
            .reason
            .ends_with(crate::core::rollout::NO_GATE),
        "{:?}",
        c.findings
    );
    // Each dry run is asked for: no budget holds its reads back.
    assert_eq!(e.core.groups.calls()["DescribeTargetGroupAttributes"], 2);
}
