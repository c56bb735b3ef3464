//! The pod-events path end to end: the handler the Lambda runs, with the production
//! adapters, against moto and the Kubernetes API emulator, fed the real-shaped events in
//! `events/`.

#[path = "support/moto.rs"]
mod moto;
#[path = "support/world.rs"]
mod world;

use std::time::Duration;

use serde_json::{Value, json};
use tgsync::handlers::pod_events::handle;
use tgsync::testkit::PodBuilder;
use world::World;

/// `events/<file>` addressed to this world's cluster and the given pod.
fn event(w: &World, file: &str, pod: &str) -> Value {
    let text =
        std::fs::read_to_string(format!("{}/events/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let mut ev: Value = serde_json::from_str(&text).unwrap();
    if ev["detail"]["clusterName"] == "demo" {
        ev["detail"]["clusterName"] = json!(w.cluster);
    }
    if ev["detail"]["involvedObject"].is_object() {
        ev["detail"]["involvedObject"]["name"] = json!(pod);
    }
    ev
}

async fn send(w: &World, ev: &Value) -> Value {
    handle(&w.engine, ev, Duration::from_secs(2), None)
        .await
        .expect("handled")
}

fn web(name: &str, ip: &str) -> PodBuilder {
    PodBuilder::new("shop", name).label("app", "web").ip(ip)
}

#[tokio::test]
async fn started_event_for_a_ready_pod_registers_it() {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    let other = w.group("shop", "app=api", 8080, &[]).await;
    w.put_pod(web("web-7", "10.0.1.7").build());
    let report = send(&w, &event(&w, "pod-started.json", "web-7")).await;
    assert_eq!(report["groups"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(report["groups"][0]["registered"], json!(["10.0.1.7:8080"]));
    assert_eq!(w.targets(&arn).await, ["10.0.1.7:8080"]);
    assert_eq!(w.ledger(&arn).await, ["10.0.1.7:8080"]);
    assert!(w.targets(&other).await.is_empty());
}

#[tokio::test]
async fn killing_event_for_a_terminating_pod_deregisters_it() {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-7", "10.0.1.7").build());
    w.put_pod(web("web-8", "10.0.1.8").build());
    w.resync().await;
    w.emulator.store().set_terminating("shop", "web-7");
    let report = send(&w, &event(&w, "pod-killing.json", "web-7")).await;
    assert_eq!(
        report["groups"][0]["deregistered"],
        json!(["10.0.1.7:8080"]),
        "{report}"
    );
    assert_eq!(w.targets(&arn).await, ["10.0.1.8:8080"]);
    assert_eq!(w.ledger(&arn).await, ["10.0.1.8:8080"]);
}

#[tokio::test]
async fn event_for_a_deleted_pod_deregisters_it_through_the_ledger() {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-7", "10.0.1.7").build());
    w.resync().await;
    w.emulator.store().delete_pod("shop", "web-7");
    // The exporter could not look labels up for a pod that is gone.
    let mut ev = event(&w, "pod-killing.json", "web-7");
    ev["detail"]["involvedObject"]["labels"] = Value::Null;
    ev["detail"]["involvedObject"]["deleted"] = json!(true);
    let report = send(&w, &ev).await;
    assert_eq!(
        report["groups"][0]["deregistered"],
        json!(["10.0.1.7:8080"]),
        "{report}"
    );
    assert!(w.targets(&arn).await.is_empty());
    assert!(w.ledger(&arn).await.is_empty());
}

#[tokio::test]
async fn pod_detail_and_direct_invoke_work_too() {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-7", "10.0.1.7").build());
    let report = send(&w, &json!({"namespace": "shop", "name": "web-7"})).await;
    assert_eq!(
        report["groups"][0]["registered"],
        json!(["10.0.1.7:8080"]),
        "{report}"
    );
    w.emulator.store().set_terminating("shop", "web-7");
    let mut ev = event(&w, "pod-detail.json", "web-7");
    ev["detail"]["metadata"]["namespace"] = json!("shop");
    let report = send(&w, &ev).await;
    assert_eq!(
        report["groups"][0]["deregistered"],
        json!(["10.0.1.7:8080"]),
        "{report}"
    );
    assert!(w.targets(&arn).await.is_empty());
}

#[tokio::test]
async fn foreign_cluster_and_malformed_events_change_nothing() {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-7", "10.0.1.7").build());
    w.register_by_hand(&arn, "10.0.9.9", 8080).await;
    let items = w.table_items().await;
    for file in ["pod-foreign-cluster.json", "pod-malformed.json"] {
        let text = std::fs::read_to_string(format!("{}/events/{file}", env!("CARGO_MANIFEST_DIR")))
            .unwrap();
        let ev: Value = serde_json::from_str(&text).unwrap();
        let report = send(&w, &ev).await;
        assert_eq!(report["groups"], json!([]), "{file}: {report}");
        assert!(
            report["notes"][0]
                .as_str()
                .unwrap()
                .starts_with("ignored: "),
            "{report}"
        );
    }
    for garbage in [
        json!("Started"),
        json!({"detail": {"clusterName": w.cluster, "involvedObject": {"kind": "Node", "name": "n"}}}),
    ] {
        let report = send(&w, &garbage).await;
        assert_eq!(report["groups"], json!([]));
    }
    assert_eq!(w.targets(&arn).await, ["10.0.9.9:8080"]);
    assert_eq!(w.table_items().await, items);
    assert!(
        w.emulator.faults().requests().is_empty(),
        "the cluster was not even asked"
    );
}

#[tokio::test]
async fn unreachable_cluster_fails_the_invocation_for_retry() {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web("web-7", "10.0.1.7").build());
    w.resync().await;
    w.emulator.faults().fail_all(503);
    let err = handle(
        &w.engine,
        &event(&w, "pod-killing.json", "web-7"),
        Duration::ZERO,
        None,
    )
    .await
    .expect_err("an invocation that could not read the pod fails, so EventBridge retries");
    assert!(err.to_string().contains("web-7"), "{err}");
    assert_eq!(w.targets(&arn).await, ["10.0.1.7:8080"]);
}
