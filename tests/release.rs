//! The way out, end to end (moto's ELBv2 and DynamoDB, the Kubernetes API emulator): a
//! group whose tags are removed or which is deleted is reported as orphaned on every
//! full resync and never touched; `{"release": [...], "dryRun": true}` shows what a
//! release would do; the release deregisters what this cluster owns, keeps every other
//! target, and deletes the group's rows. Payloads go through the resync handler, as an
//! operator's `aws lambda invoke` would.

#[path = "support/moto.rs"]
mod moto;
#[path = "support/world.rs"]
mod world;

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::{Value, json};
use tgsync::clock::Clock as _;
use tgsync::handlers::manual::Invocation;
use tgsync::logging::LambdaLevel;
use tgsync::metrics::emf_lines;
use tgsync::reconcile::START_CUTOFF;
use tgsync::report::{Outcome, Report};
use tgsync::state::{Change, Release, StateStore as _};
use tgsync::testkit::PodBuilder;
use world::World;

fn web(name: &str, ip: &str) -> PodBuilder {
    PodBuilder::new("shop", name).label("app", "web").ip(ip)
}

/// Invokes the resync handler with `payload` and returns its JSON report.
async fn invoke(w: &World, payload: Value) -> Value {
    tgsync::handlers::resync::handle(&w.engine, &payload, None, Duration::ZERO)
        .await
        .expect("the handler accepts the payload")
}

/// The groups in this cluster's index (rows `owners#<cluster>`).
async fn indexed(w: &World) -> Vec<String> {
    let out = w
        .ddb
        .query()
        .table_name(&w.table)
        .key_condition_expression("pk = :pk")
        .expression_attribute_values(":pk", AttributeValue::S(format!("owners#{}", w.cluster)))
        .consistent_read(true)
        .send()
        .await
        .expect("query the index");
    out.items()
        .iter()
        .filter_map(|i| i.get("sk")?.as_s().ok().cloned())
        .collect()
}

async fn untag(w: &World, arn: &str) {
    w.elb
        .remove_tags()
        .resource_arns(arn)
        .tag_keys("tgsync/cluster")
        .tag_keys("tgsync/namespace")
        .tag_keys("tgsync/selector")
        .send()
        .await
        .expect("tags removed");
}

/// Two pods of `shop/app=web` and a group filled with them plus a target registered by
/// hand; a resync registers the pods.
async fn filled_group(w: &World) -> String {
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-1", "10.0.1.1").build());
    w.put_pod(web("web-2", "10.0.1.2").build());
    w.register_by_hand(&arn, "10.0.200.9", 8080).await;
    let r = w.resync().await;
    assert_eq!(r.group(&arn).unwrap().outcome, Outcome::Changed, "{r:#?}");
    assert_eq!(
        w.targets(&arn).await,
        ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.200.9:8080"]
    );
    arn
}

fn orphans(r: &Report) -> Vec<(String, usize)> {
    r.orphans
        .as_ref()
        .expect("a full resync looks for orphans")
        .iter()
        .map(|o| (o.target_group_arn.clone(), o.targets))
        .collect()
}

#[tokio::test]
async fn an_untagged_group_is_reported_orphaned_until_released_and_the_release_removes_only_ours() {
    let w = World::new().await;
    let arn = filled_group(&w).await;
    let other = w.group("shop", "app=api", 9090, &[]).await;
    w.put_pod(
        PodBuilder::new("shop", "api-1")
            .label("app", "api")
            .ip("10.0.2.1")
            .build(),
    );
    w.resync().await;
    assert_eq!(indexed(&w).await.len(), 2, "both groups are in the index");

    untag(&w, &arn).await;
    // The pods go away too: an unbound group is still never touched.
    w.emulator.store().delete_pod("shop", "web-2");
    for _ in 0..2 {
        let r = w.resync().await;
        assert_eq!(orphans(&r), [(arn.clone(), 2)], "{r:#?}");
        assert_eq!(r.totals.orphaned, 1);
        assert!(
            r.group(&arn).is_none(),
            "an unbound group is not reconciled"
        );
        assert!(
            r.orphans.as_ref().unwrap()[0].action.contains("release"),
            "the report says what to do"
        );
        let metric = emf_lines(&r, LambdaLevel::Info)
            .into_iter()
            .map(|l| serde_json::from_str::<Value>(&l).unwrap())
            .find(|l| l.get("OrphanedGroups").is_some())
            .expect("an OrphanedGroups metric line");
        assert_eq!(metric["OrphanedGroups"], 1);
        assert_eq!(
            w.targets(&arn).await,
            ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.200.9:8080"],
            "never acted on without a release"
        );
        assert_eq!(w.ledger(&arn).await, ["10.0.1.1:8080", "10.0.1.2:8080"]);
    }

    // Dry run first: the plan, and nothing changed.
    let plan = invoke(&w, json!({"release": [arn], "dryRun": true})).await;
    let g = &plan["groups"][0];
    assert_eq!(g["outcome"], "planned", "{plan:#}");
    assert_eq!(
        g["plan"]["deregister"],
        json!(["10.0.1.1:8080", "10.0.1.2:8080"])
    );
    assert_eq!(g["plan"]["foreignKept"], json!(["10.0.200.9:8080"]));
    assert_eq!(w.targets(&arn).await.len(), 3, "a dry run changes nothing");
    assert_eq!(w.ledger(&arn).await.len(), 2);

    let done = invoke(&w, json!({"release": [arn]})).await;
    let g = &done["groups"][0];
    assert_eq!(g["outcome"], "released", "{done:#}");
    assert_eq!(g["deregistered"], json!(["10.0.1.1:8080", "10.0.1.2:8080"]));
    assert_eq!(done["totals"]["released"], 1);
    assert!(
        done.get("notes").is_none(),
        "not bound: no warning {done:#}"
    );
    assert_eq!(
        w.targets(&arn).await,
        ["10.0.200.9:8080"],
        "the hand-registered target stays"
    );
    assert!(w.item(&arn).await.is_none(), "the group's item is deleted");
    assert_eq!(
        indexed(&w).await,
        std::slice::from_ref(&other),
        "and its index row"
    );

    let r = w.resync().await;
    assert!(orphans(&r).is_empty(), "{r:#?}");
    assert_eq!(r.group(&other).unwrap().outcome, Outcome::InSync);
}

#[tokio::test]
async fn a_deleted_group_is_orphaned_and_its_release_deletes_the_rows() {
    let w = World::new().await;
    let arn = filled_group(&w).await;
    w.elb
        .delete_target_group()
        .target_group_arn(&arn)
        .send()
        .await
        .expect("group deleted");
    let r = w.resync().await;
    assert_eq!(orphans(&r), [(arn.clone(), 2)], "{r:#?}");

    let done = invoke(&w, json!({"release": [arn]})).await;
    let g = &done["groups"][0];
    assert_eq!(g["outcome"], "released", "{done:#}");
    assert_eq!(g["forgotten"], json!(["10.0.1.1:8080", "10.0.1.2:8080"]));
    assert!(g.get("deregistered").is_none());
    assert!(w.item(&arn).await.is_none());
    assert!(indexed(&w).await.is_empty());
    assert_eq!(w.table_items().await, 0, "nothing of the group is left");
}

#[tokio::test]
async fn releasing_a_bound_group_empties_it_and_warns_it_will_be_filled_again() {
    let w = World::new().await;
    let arn = filled_group(&w).await;
    let done = invoke(&w, json!({"release": [arn]})).await;
    assert_eq!(done["groups"][0]["outcome"], "released", "{done:#}");
    let note = done["notes"][0].as_str().expect("a note");
    assert!(
        note.contains("still tagged") && note.contains(&w.cluster),
        "{note}"
    );
    assert_eq!(w.targets(&arn).await, ["10.0.200.9:8080"]);
    // As the note says, the next run fills it again.
    let r = w.resync().await;
    assert_eq!(r.group(&arn).unwrap().outcome, Outcome::Changed, "{r:#?}");
    assert_eq!(w.targets(&arn).await.len(), 3);
    assert_eq!(indexed(&w).await, [arn]);
}

#[tokio::test]
async fn release_payloads_are_strict() {
    let w = World::new().await;
    for bad in [
        json!({"release": []}),
        json!({"release": "arn:aws:elasticloadbalancing:x:1:targetgroup/a/b"}),
        json!({"release": ["not-an-arn"]}),
        json!({"release": ["arn:aws:elasticloadbalancing:x:1:targetgroup/a/b"], "force": true}),
    ] {
        let out = tgsync::handlers::resync::handle(&w.engine, &bad, None, Duration::ZERO).await;
        assert!(out.is_err(), "{bad} must be refused");
    }
}

/// Another process (a pod-events invocation) holding `arn`'s lease as `owner`: it
/// takes it, keeps renewing it every second (the world's clock following real time, so
/// the stored lease moves on) until `give_back` is due, then serves the request it was
/// asked for meanwhile and gives the lease back, as a live holder does. Returns its
/// renewals and whether it was asked to run again (`dirty`) before giving it back.
async fn holder(
    w: &World,
    arn: &str,
    owner: &str,
    give_back: Option<Duration>,
    run: Duration,
) -> (u32, bool) {
    let lease = Duration::from_secs(15);
    let mut version = w.hold_lease(arn, owner, lease).await.version;
    let start = std::time::Instant::now();
    let (mut last, mut renewed, mut next_renewal) = (start, 0, Duration::from_secs(1));
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let tick = last.elapsed();
        last += tick;
        w.clock
            .advance(u64::try_from(tick.as_millis()).expect("ms"));
        let elapsed = start.elapsed();
        if give_back.is_some_and(|at| elapsed >= at) {
            let asked = w
                .item(arn)
                .await
                .and_then(|i| i.get("dirty").and_then(|d| d.as_bool().ok()).copied())
                == Some(true);
            // Asked to run again: one more pass, then the lease goes back.
            for _ in 0..3 {
                let now = w.clock.now();
                match w
                    .engine
                    .core
                    .state
                    .release(
                        arn,
                        owner,
                        now,
                        version,
                        now.plus(lease),
                        &Change::default(),
                        false,
                    )
                    .await
                    .expect("release")
                {
                    Release::Released => return (renewed, asked),
                    Release::RunAgain(state) => version = state.version,
                    Release::Lost => panic!("the holder's lease was taken from it"),
                }
            }
            panic!("the holder could not give its lease back");
        }
        if elapsed >= run {
            return (renewed, false);
        }
        if elapsed >= next_renewal {
            next_renewal += Duration::from_secs(1);
            let ok = w
                .engine
                .core
                .state
                .renew(arn, owner, w.clock.now().plus(lease))
                .await
                .expect("renew");
            assert!(ok, "the holder keeps its lease");
            renewed += 1;
        }
    }
}

/// Invokes the manual function's handler with `payload`, as the release alias is
/// invoked, with `left` before the start cut-off of its deadline.
async fn invoke_manual(w: &World, payload: Value, left: Duration) -> Value {
    let invocation = Invocation {
        deadline: Some(w.clock.now().plus(START_CUTOFF + left)),
        invoked_function_arn: String::new(),
    };
    tgsync::handlers::manual::handle(&w.engine, &payload, &invocation)
        .await
        .expect("the handler accepts the payload")
}

/// A release that finds the group's lease held by another process, which keeps renewing
/// it, waits for it while the invocation lasts and then answers a failure that says
/// what to do: it released nothing, and every owned target is still in the group.
#[tokio::test]
async fn a_release_of_a_group_whose_lease_another_process_keeps_is_a_failure() {
    let w = World::new().await;
    let arn = filled_group(&w).await;
    let owner = format!("pod-events@{}#1", w.cluster);
    let left = Duration::from_secs(4);
    let started = std::time::Instant::now();
    let ((renewed, _), done) = tokio::join!(
        holder(&w, &arn, &owner, None, left + Duration::from_secs(2)),
        async {
            // The holder has its lease first.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let done = invoke_manual(&w, json!({"release": [arn]}), left).await;
            (done, started.elapsed())
        }
    );
    let (done, took) = done;
    assert!(
        renewed >= 4,
        "the holder kept renewing its lease: {renewed}"
    );
    let g = &done["groups"][0];
    assert_eq!(g["outcome"], "failed", "{done:#}");
    assert_eq!(done["totals"]["errors"], 1, "{done:#}");
    assert_eq!(done["totals"]["released"], 0);
    assert!(g["leaseUntil"].as_u64().is_some(), "{done:#}");
    let error = g["error"].as_str().expect("an error");
    assert!(error.contains("invoke the release again"), "{error}");
    assert!(
        took >= left,
        "it waited for the lease while the invocation lasted: answered after {took:?}"
    );
    assert_eq!(
        w.targets(&arn).await,
        ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.200.9:8080"],
        "nothing was released"
    );
    assert_eq!(w.ledger(&arn).await, ["10.0.1.1:8080", "10.0.1.2:8080"]);
}

/// A holder that gives the lease back while the release waits for it: the release then
/// runs, deregisters what this cluster owns and deletes the group's rows.
#[tokio::test]
async fn a_release_waits_for_a_holder_that_gives_the_lease_back() {
    let w = World::new().await;
    let arn = filled_group(&w).await;
    let owner = format!("pod-events@{}#1", w.cluster);
    let give_back = Duration::from_millis(2_500);
    let started = std::time::Instant::now();
    let ((renewed, asked), done) = tokio::join!(
        holder(&w, &arn, &owner, Some(give_back), Duration::from_secs(30)),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let done = invoke_manual(&w, json!({"release": [arn]}), Duration::from_secs(20)).await;
            (done, started.elapsed())
        }
    );
    let (done, took) = done;
    assert!(
        asked && renewed >= 2,
        "the race was staged: the release found the lease held and asked the holder ({asked}, {renewed} renewals)"
    );
    assert!(took >= give_back, "it waited: {took:?}");
    let g = &done["groups"][0];
    assert_eq!(g["outcome"], "released", "{done:#}");
    assert_eq!(g["deregistered"], json!(["10.0.1.1:8080", "10.0.1.2:8080"]));
    assert_eq!(done["totals"]["errors"], 0, "{done:#}");
    assert_eq!(w.targets(&arn).await, ["10.0.200.9:8080"]);
    assert!(w.item(&arn).await.is_none(), "the group's item is deleted");
    assert!(indexed(&w).await.is_empty(), "and its index row");
}
