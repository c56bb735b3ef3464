//! The controller against the in-memory fakes: what its queue and runner do with the
//! ways a pass can end.

use super::*;
use discovery::{Priority, visit_order};

use crate::clock::Clock as _;

#[test]
fn the_full_diff_starts_with_the_groups_looked_at_longest_ago_new_first_due_last() {
    let bound: Vec<String> = (0..50).map(|i| format!("g{i:02}")).collect();
    // The last run (3) looked at g00–g39; run 2 at g40–g44; g45–g49 never.
    let mut looked: HashMap<String, u64> = HashMap::new();
    for (i, arn) in bound.iter().enumerate().take(45) {
        looked.insert(arn.clone(), if i < 40 { 3 } else { 2 });
    }
    let indexed: BTreeSet<String> = bound
        .iter()
        .filter(|a| !["g47", "g48"].contains(&a.as_str()))
        .cloned()
        .collect();
    let due: HashSet<String> = ["g03", "g43", "g49"].map(String::from).into();
    let mut rng = fastrand::Rng::with_seed(7);
    let order = visit_order(
        bound.iter().map(String::as_str),
        &looked,
        &Priority {
            indexed: Some(&indexed),
            due: &due,
        },
        &mut rng,
    );
    let part = |r: std::ops::Range<usize>| {
        let mut p: Vec<&str> = order[r].to_vec();
        p.sort_unstable();
        p
    };
    assert_eq!(part(0..2), ["g47", "g48"], "never looked at, not indexed");
    assert_eq!(part(2..4), ["g45", "g46"], "never looked at");
    assert_eq!(order[4], "g49", "never looked at, due");
    assert_eq!(part(5..9), ["g40", "g41", "g42", "g44"], "run 2");
    assert_eq!(order[9], "g43", "run 2, due");
    assert_eq!(order[49], "g03", "run 3, due");
    let mut all = order.clone();
    all.sort_unstable();
    assert_eq!(all, bound.iter().map(String::as_str).collect::<Vec<_>>());
    // Ties are not in discovery order, so the groups a short run leaves differ from
    // run to run even in a fresh container.
    let rest: Vec<&str> = order[10..49].to_vec();
    let mut sorted = rest.clone();
    sorted.sort_unstable();
    assert_ne!(rest, sorted);
}

mod fakes {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::Engine;
    use crate::clock::{Clock as _, ManualClock};
    use crate::core::UnixMillis;
    use crate::fakes::{FakeElb, FakePods, FakeState};
    use crate::reconcile::{EngineSettings, RunOptions};
    use crate::report::Report;
    use crate::testkit::{PodBuilder, bound_group, set_condition};

    pub(super) const TG: &str =
        "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/web/0123456789abcdef";

    pub(super) type TestEngine = Engine<FakePods, FakeElb, FakeState>;

    /// An engine of cluster `demo` on the fakes and a manual clock, with one group,
    /// [`TG`], bound to `app=web` pods of `shop` on port 8080.
    pub(super) fn engine() -> (TestEngine, ManualClock) {
        let elb = FakeElb::default();
        elb.add_group(bound_group(TG, "demo", "shop", "app=web", 8080));
        let clock = ManualClock::new(UnixMillis(1_800_000_000_000));
        let e = Engine::new(
            "demo",
            FakePods::default(),
            elb,
            FakeState::default(),
            Arc::new(clock.clone()),
        )
        .with_settings(EngineSettings::default())
        .with_seed(3);
        (e, clock)
    }

    pub(super) fn web(name: &str, ip: &str) -> PodBuilder {
        PodBuilder::new("shop", name).label("app", "web").ip(ip)
    }

    pub(super) fn live(e: &TestEngine) -> Vec<String> {
        e.core
            .groups
            .live_targets(TG)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// A scheduled invocation that watches for `watch` (real time).
    pub(super) async fn watching(e: &TestEngine, clock: &ManualClock, watch: Duration) -> Report {
        let opts = RunOptions {
            use_checkpoint: true,
            ..RunOptions::default()
        };
        e.run_scheduled(&opts, clock.now().plus(watch)).await
    }

    /// Waits (real time, up to `limit`) until the group holds `want`; how long it took.
    pub(super) async fn until_live(e: &TestEngine, want: &[&str], limit: Duration) -> Duration {
        let started = tokio::time::Instant::now();
        loop {
            if live(e) == want {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < limit,
                "targets {:?}, waited {limit:?} for {want:?}",
                live(e)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Turns `name`'s Ready condition to `ready`.
    pub(super) fn set_ready(e: &TestEngine, name: &str, ready: bool) {
        e.core
            .pods
            .update("shop", name, |p| set_condition(p, "Ready", ready));
    }
}

/// A change whose pass cannot read the group's state (the table throttled) is not
/// forgotten: the queue tries it again after a backoff, and the NotReady pod leaves its
/// group once the table answers, within the same invocation.
#[tokio::test]
async fn a_change_whose_state_read_fails_before_the_lease_is_retried() {
    use std::time::Duration;

    use fakes::*;

    let (e, clock) = engine();
    e.core.pods.put(web("web-1", "10.0.1.1").build());
    e.core.pods.put(web("web-2", "10.0.1.2").build());
    let staged = async {
        until_live(
            &e,
            &["10.0.1.1:8080", "10.0.1.2:8080"],
            Duration::from_secs(5),
        )
        .await;
        let (_, reads) = e.core.state.calls();
        e.core.state.set_failing(true);
        set_ready(&e, "web-1", false);
        // The change's pass reads the group's state, and fails.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let (_, failed_reads) = e.core.state.calls();
        assert!(
            failed_reads > reads,
            "the change's pass read the state while it failed"
        );
        assert_eq!(
            live(&e),
            ["10.0.1.1:8080", "10.0.1.2:8080"],
            "nothing changed blind"
        );
        e.core.state.set_failing(false);
        until_live(&e, &["10.0.1.2:8080"], Duration::from_secs(4)).await
    };
    let (_, recovered) = tokio::join!(watching(&e, &clock, Duration::from_secs(8)), staged);
    eprintln!("deregistered {recovered:?} after the table answered again");
}

/// A gates-only request is a reaction: it takes the runner's room for reactions (as the
/// queue admits it), not a verification's. With one slot of each, a pod change that
/// arrives while a gate is looked at waits for it, and a verification runs beside it.
#[tokio::test]
async fn a_gate_look_takes_a_reactions_slot_not_a_verifications() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use fakes::*;
    use queue::{Queue, Want};
    use runner::{Ending, Runner};

    let (e, clock) = engine();
    let e = e.with_settings(crate::reconcile::EngineSettings {
        concurrency: 1,
        ..crate::reconcile::EngineSettings::default()
    });
    let queue = Mutex::new(Queue::default());
    {
        let mut q = lock(&queue);
        q.request("gate", Want::gates());
        q.request("verify", Want::verify());
    }
    let wake = tokio::sync::Notify::new();
    let (reactions, max_reactions) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let (verifications, beside) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let far = tokio::time::Instant::now() + Duration::from_secs(60);
    Runner::new(&e, &queue, &wake)
        .run(
            Ending::Idle {
                leases: far,
                gates: far,
            },
            |key, want| {
                let (reactions, max_reactions) = (&reactions, &max_reactions);
                let (verifications, beside) = (&verifications, &beside);
                let (queue, wake, clock) = (&queue, &wake, &clock);
                async move {
                    let counter = if want.reacts() {
                        reactions
                    } else {
                        verifications
                    };
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    if want.reacts() {
                        max_reactions.fetch_max(n, Ordering::SeqCst);
                    }
                    if want.gates_only() {
                        // A pod change of another group arrives while the gate is looked at.
                        lock(queue).request("change", Want::change(clock.now()));
                        wake.notify_one();
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if reactions.load(Ordering::SeqCst) > 0
                        && verifications.load(Ordering::SeqCst) > 0
                    {
                        beside.fetch_add(1, Ordering::SeqCst);
                    }
                    counter.fetch_sub(1, Ordering::SeqCst);
                    (key, want, Ok(Action::Done))
                }
            },
        )
        .await;
    assert_eq!(
        max_reactions.load(Ordering::SeqCst),
        1,
        "a gate look and a pod change ran at once with one slot for reactions"
    );
    assert!(
        beside.load(Ordering::SeqCst) > 0,
        "the verification waited for the gate look's slot"
    );
}

/// A one-shot run plans each pass from the container's one index of bound groups: a
/// group unbound while its request waits (here, parked on a lease another process
/// holds) is not filled from the run's earlier view of its binding.
#[tokio::test]
async fn a_one_shot_run_plans_from_the_index_as_it_is_at_each_pass() {
    use std::time::Duration;

    use crate::reconcile::{EngineSettings, RunOptions};
    use crate::state::{GroupState, LeaseView};
    use fakes::*;

    let (e, clock) = engine();
    let e = e.with_settings(EngineSettings {
        lease_wait: Some(Duration::from_secs(10)),
        ..EngineSettings::default()
    });
    e.core.pods.put(web("web-1", "10.0.1.1").build());
    e.core.state.put(
        TG,
        GroupState {
            lease: Some(LeaseView {
                owner: "pod-events-demo-other".into(),
                until: clock.now().plus(Duration::from_secs(2)),
            }),
            ..GroupState::default()
        },
    );
    let unbind = async {
        // The run's first look finds the lease held, asks the holder for another pass
        // (`dirty`) and parks the group.
        let started = tokio::time::Instant::now();
        while !e.core.state.stored(TG).dirty {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the run never found the lease held"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Meanwhile its tags are removed and re-read (the index lets it go), and the
        // holder gives the lease back.
        e.core
            .groups
            .set_tag(TG, crate::core::binding::TAG_CLUSTER, None);
        e.core.index.unbound(TG);
        e.core.state.put(TG, GroupState::default());
    };
    let opts = RunOptions::default();
    let (report, ()) = tokio::join!(e.resync(&opts), unbind);
    assert!(
        live(&e).is_empty(),
        "a group no longer bound was filled: {:?}\n{report:#?}",
        live(&e)
    );
    let group = report.group(TG).expect("the group is reported");
    assert_eq!(
        group.outcome,
        crate::report::Outcome::BindingError,
        "{group:#?}"
    );
}

/// At SIGTERM the process ends ~400 ms later, long before a slow pass in flight may
/// end: the requests still queued are handed on first (their groups' `dirty` flags and
/// the index's record), then the passes in flight drain.
#[tokio::test]
async fn at_shutdown_queued_requests_are_handed_on_before_the_passes_in_flight_drain() {
    use std::time::Duration;

    use crate::reconcile::Action;
    use crate::state::StateStore as _;
    use queue::{Queue, Want};

    let (e, clock) = fakes::engine();
    let e = e.with_settings(crate::reconcile::EngineSettings {
        concurrency: 1,
        ..crate::reconcile::EngineSettings::default()
    });
    let queue = Mutex::new(Queue::default());
    let wake = tokio::sync::Notify::new();
    {
        let mut q = crate::sync::lock(&queue);
        q.request("slow", Want::change(clock.now()));
        q.request("queued", Want::change(clock.now()));
    }
    let runner = runner::Runner::new(&e, &queue, &wake);
    let run = runner.run(
        runner::Ending::At(tokio::time::Instant::now() + Duration::from_secs(60)),
        |key, want| async move {
            // A pass whose call in flight takes its whole deadline.
            tokio::time::sleep(Duration::from_secs(5)).await;
            (key, want, Ok(Action::Done))
        },
    );
    let signal = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        e.core.stop.shut_down();
        // The shutdown hook's grace.
        tokio::time::sleep(Duration::from_millis(400)).await;
        e.core
            .state
            .index_meta("demo")
            .await
            .expect("meta")
            .requested
    };
    let (handed, requested) = tokio::join!(run, signal);
    assert!(
        requested.contains("queued"),
        "not handed on within the shutdown grace: {requested:?}"
    );
    assert!(e.core.state.stored("queued").dirty);
    assert!(
        handed.groups.contains(&"queued".to_owned()),
        "{:?}",
        handed.groups
    );
}
