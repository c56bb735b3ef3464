//! Release and the orphan index against the in-memory fakes: what the moto tests cannot
//! stage cheaply (another cluster's entries, a held lease, a ledger older than the index).

use super::RunOptions;
use super::tests::{TG, TestEngine, fake_engine, web_group};
use crate::clock::{Clock, ManualClock};
use crate::core::{HealthState, PodRef, Target, UnixMillis};
use crate::fakes::FakePods;
use crate::report::Outcome;
use crate::state::{Acquire, GroupState, LedgerEntry, StateStore};
use crate::testkit::PodBuilder;

fn engine() -> (TestEngine, ManualClock) {
    let pods = FakePods::default();
    pods.put(
        PodBuilder::new("shop", "web-1")
            .label("app", "web")
            .ip("10.0.1.1")
            .build(),
    );
    fake_engine(pods, web_group(), 3)
}

fn t(s: &str) -> Target {
    s.parse().unwrap()
}

fn entry(target: &str, cluster: &str, pod: &str) -> LedgerEntry {
    LedgerEntry {
        target: t(target),
        pod: PodRef {
            namespace: "shop".into(),
            name: pod.into(),
            uid: format!("uid-{pod}"),
        },
        cluster: cluster.into(),
        registered_at: UnixMillis(1),
        deregistered_at: None,
    }
}

fn release_of(arns: &[&str], dry_run: bool) -> (Vec<String>, RunOptions) {
    (
        arns.iter().map(|a| (*a).to_owned()).collect(),
        RunOptions {
            dry_run,
            ..RunOptions::default()
        },
    )
}

#[tokio::test]
async fn a_release_leaves_another_clusters_targets_entries_and_item() {
    let (e, _) = engine();
    e.resync(&RunOptions::default()).await;
    assert!(
        e.core.state.indexed("demo", TG),
        "the first registration indexes the group"
    );
    // Another cluster's deployment shares the group and owns 10.0.9.1.
    e.core
        .groups
        .add_target(TG, t("10.0.9.1:8080"), HealthState::Healthy);
    let mut state = e.core.state.stored(TG);
    state
        .ledger
        .insert(t("10.0.9.1:8080"), entry("10.0.9.1:8080", "other", "x-1"));
    e.core.state.put(TG, state);

    let (arns, opts) = release_of(&[TG], false);
    let r = e.release(&arns, &opts).await;
    let g = r.group(TG).unwrap();
    assert_eq!(g.outcome, Outcome::Released, "{r:#?}");
    assert_eq!(g.deregistered, [t("10.0.1.1:8080")]);
    assert_eq!(e.core.groups.live_targets(TG), [t("10.0.9.1:8080")]);
    let ledger = e.core.state.ledger(TG);
    assert_eq!(
        ledger.keys().copied().collect::<Vec<_>>(),
        [t("10.0.9.1:8080")]
    );
    assert!(
        e.core.state.has_item(TG),
        "the other cluster's entries keep the item"
    );
    assert!(!e.core.state.indexed("demo", TG));
}

#[tokio::test]
async fn a_release_never_runs_beside_a_lease_holder() {
    let (e, clock) = engine();
    e.resync(&RunOptions::default()).await;
    let now = clock.now();
    let held = e
        .core
        .state
        .acquire(
            TG,
            "pod-events@demo#1",
            now,
            now.plus(std::time::Duration::from_secs(15)),
        )
        .await
        .unwrap();
    assert!(matches!(held, Acquire::Acquired(_)));
    let (arns, opts) = release_of(&[TG], false);
    let r = e.release(&arns, &opts).await;
    // It released nothing: a failure that says when the holder's lease ends and what
    // to do, not a `leaseHeld` that counts as no error.
    let g = r.group(TG).unwrap();
    assert_eq!(g.outcome, Outcome::Failed, "{r:#?}");
    assert_eq!(r.totals.errors, 1);
    assert!(g.lease_until.is_some());
    assert!(
        g.error
            .as_deref()
            .is_some_and(|e| e.contains("invoke the release again")),
        "{g:#?}"
    );
    assert_eq!(
        e.core.groups.live_targets(TG),
        [t("10.0.1.1:8080")],
        "untouched"
    );
    assert_eq!(e.core.state.ledger(TG).len(), 1);
}

/// A lease take that fails (the state table in trouble) is tried again, by the queue's
/// retry policy, while the invocation lasts: the release goes through once the table
/// answers again.
#[tokio::test]
async fn a_failed_lease_take_is_tried_again_while_the_invocation_lasts() {
    let (e, clock) = engine();
    e.resync(&RunOptions::default()).await;
    let (arns, mut opts) = release_of(&[TG], false);
    opts.deadline = Some(
        clock
            .now()
            .plus(super::START_CUTOFF + std::time::Duration::from_secs(10)),
    );
    e.core.state.set_failing(true);
    let recover = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        e.core.state.set_failing(false);
    };
    let (r, ()) = tokio::join!(e.release(&arns, &opts), recover);
    let g = r.group(TG).unwrap();
    assert_eq!(g.outcome, Outcome::Released, "{r:#?}");
    assert_eq!(g.deregistered, [t("10.0.1.1:8080")]);
    assert!(e.core.groups.live_targets(TG).is_empty());
    assert!(!e.core.state.has_item(TG), "its item is deleted");
}

/// A ledger written before the index existed (an upgrade) is indexed by the next full
/// resync while its group is bound, so it is reported when the group is unbound later.
#[tokio::test]
async fn a_ledger_older_than_the_index_is_indexed_and_then_reported_orphaned() {
    let (e, _) = engine();
    e.core
        .groups
        .add_target(TG, t("10.0.1.1:8080"), HealthState::Healthy);
    e.core.state.put(
        TG,
        GroupState {
            ledger: [(t("10.0.1.1:8080"), entry("10.0.1.1:8080", "demo", "web-1"))].into(),
            version: 4,
            ..GroupState::default()
        },
    );
    assert!(!e.core.state.indexed("demo", TG));
    let r = e.resync(&RunOptions::default()).await;
    assert_eq!(r.group(TG).unwrap().outcome, Outcome::InSync, "{r:#?}");
    assert!(e.core.state.indexed("demo", TG), "indexed on the way");

    e.core.groups.set_tag(TG, "tgsync/cluster", None);
    let r = e.resync(&RunOptions::default()).await;
    let orphans = r.orphans.unwrap();
    assert_eq!(orphans.len(), 1, "{orphans:#?}");
    assert_eq!(
        (orphans[0].target_group_arn.as_str(), orphans[0].targets),
        (TG, 1)
    );
    assert_eq!(
        e.core.groups.live_targets(TG),
        [t("10.0.1.1:8080")],
        "not acted on"
    );
}

/// An unbound group with nothing of ours left leaves the index, but not while someone
/// holds its lease: that holder may be about to write our first entry.
#[tokio::test]
async fn an_index_row_is_dropped_only_when_nobody_holds_the_lease() {
    let (e, clock) = engine();
    let b = crate::testkit::binding("demo", "shop", "app=web", 8080);
    let g = crate::testkit::bound_group(TG, "demo", "shop", "app=web", 8080);
    e.core
        .state
        .index(TG, "demo", &b, (&g.name, &g.facts))
        .await
        .unwrap();
    e.core.groups.set_tag(TG, "tgsync/cluster", None);
    let now = clock.now();
    e.core
        .state
        .acquire(
            TG,
            "pod-events@demo#1",
            now,
            now.plus(std::time::Duration::from_secs(15)),
        )
        .await
        .unwrap();
    let r = e.resync(&RunOptions::default()).await;
    assert_eq!(
        r.orphans.as_deref(),
        Some(&[][..]),
        "nothing of ours: no orphan"
    );
    assert!(
        e.core.state.indexed("demo", TG),
        "kept while the lease is held"
    );
    // A dry run only looks.
    clock.advance(16_000);
    e.resync(&RunOptions {
        dry_run: true,
        ..RunOptions::default()
    })
    .await;
    assert!(e.core.state.indexed("demo", TG));
    // Expired, but within its takeover grace: still counted as held.
    e.resync(&RunOptions::default()).await;
    assert!(e.core.state.indexed("demo", TG), "dropped within the grace");
    clock.advance(e.core.settings.lease.grace_ms());
    e.resync(&RunOptions::default()).await;
    assert!(
        !e.core.state.indexed("demo", TG),
        "dropped once the lease expired and its grace passed"
    );
}

/// An orphan's count is of the targets this cluster holds in it: the tombstone of a
/// target it deregistered (kept for the forget grace) is not one.
#[tokio::test]
async fn an_orphans_count_leaves_out_tombstones() {
    let (e, clock) = engine();
    e.core
        .groups
        .add_target(TG, t("10.0.1.1:8080"), HealthState::Healthy);
    let mut gone = entry("10.0.1.2:8080", "demo", "web-2");
    gone.deregistered_at = Some(clock.now());
    e.core.state.put(
        TG,
        GroupState {
            ledger: [
                (t("10.0.1.1:8080"), entry("10.0.1.1:8080", "demo", "web-1")),
                (t("10.0.1.2:8080"), gone),
            ]
            .into(),
            version: 4,
            ..GroupState::default()
        },
    );
    e.resync(&RunOptions::default()).await;
    assert!(e.core.state.indexed("demo", TG), "indexed on the way");
    e.core.groups.set_tag(TG, "tgsync/cluster", None);
    let r = e.resync(&RunOptions::default()).await;
    let orphans = r.orphans.unwrap();
    assert_eq!(
        orphans
            .iter()
            .map(|o| (o.target_group_arn.as_str(), o.targets))
            .collect::<Vec<_>>(),
        [(TG, 1)],
        "{orphans:#?}"
    );
}
