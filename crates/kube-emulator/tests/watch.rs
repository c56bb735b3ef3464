//! WATCH of pods, graceful deletion and update preconditions over real
//! HTTPS, read event by event from the chunked body.

mod common;

use std::time::{Duration, Instant};

use common::{Client, WatchEnd};
use hyper::Method;
use k8s_openapi::api::core::v1::Pod;
use kube_emulator::{Emulator, EmulatorConfig, INITIAL_EVENTS_END_ANNOTATION};
use serde_json::{Value, json};

/// Long enough for an event that must come on a loaded 2-core machine.
const SOON: Duration = Duration::from_secs(5);
/// How long to listen to be fairly sure nothing else comes.
const QUIET: Duration = Duration::from_millis(300);

fn pod(ns: &str, name: &str, app: &str, node: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}],
                 "nodeName": node, "terminationGracePeriodSeconds": 30},
        "status": {"phase": "Running", "podIP": "10.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

async fn start() -> Emulator {
    Emulator::start(EmulatorConfig::new("prod")).await.unwrap()
}

async fn start_with(configure: impl FnOnce(&mut EmulatorConfig)) -> Emulator {
    let mut config = EmulatorConfig::new("prod");
    configure(&mut config);
    Emulator::start(config).await.unwrap()
}

fn rv_of(pod: &Pod) -> String {
    pod.metadata.resource_version.clone().unwrap()
}

/// `(type, namespace/name, resourceVersion)` of an event.
fn summary(event: &Value) -> (String, String, String) {
    let meta = &event["object"]["metadata"];
    (
        event["type"].as_str().unwrap().to_owned(),
        format!(
            "{}/{}",
            meta["namespace"].as_str().unwrap_or_default(),
            meta["name"].as_str().unwrap_or_default()
        ),
        meta["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

fn ev(type_: &str, key: &str, rv: impl ToString) -> (String, String, String) {
    (type_.to_owned(), key.to_owned(), rv.to_string())
}

#[tokio::test]
async fn watch_from_zero_sends_the_current_state_then_changes() {
    let emulator = start().await;
    let store = emulator.store();
    let web1 = store.put_pod(pod("default", "web-1", "web", None)).unwrap();
    let web2 = store.put_pod(pod("default", "web-2", "web", None)).unwrap();
    store.put_pod(pod("other", "web-9", "web", None)).unwrap();
    let client = Client::new(&emulator);

    let mut watch = client
        .watch("/api/v1/namespaces/default/pods?watch=1&resourceVersion=0")
        .await;
    assert_eq!(watch.status, 200);
    assert_eq!(watch.headers["content-type"], "application/json");
    assert_eq!(watch.headers["transfer-encoding"], "chunked");
    let first = watch.next(SOON).await;
    assert_eq!(first["object"]["kind"], "Pod");
    assert_eq!(first["object"]["apiVersion"], "v1");
    assert_eq!(summary(&first), ev("ADDED", "default/web-1", rv_of(&web1)));
    assert_eq!(
        summary(&watch.next(SOON).await),
        ev("ADDED", "default/web-2", rv_of(&web2))
    );
    assert_eq!(watch.next_within(QUIET).await, Ok(None));

    // Live changes through the API, each with its own resourceVersion.
    let created = client
        .send(
            Method::POST,
            "/api/v1/namespaces/default/pods",
            Some("application/json"),
            Some(
                json!({"metadata": {"name": "web-3", "labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]}}),
            ),
        )
        .await
        .json();
    let added = watch.next(SOON).await;
    assert_eq!(
        summary(&added),
        ev(
            "ADDED",
            "default/web-3",
            created["metadata"]["resourceVersion"].as_str().unwrap()
        )
    );
    assert_eq!(added["object"]["status"]["phase"], "Pending");
    let patched = client
        .send(
            Method::PATCH,
            "/api/v1/namespaces/default/pods/web-3/status",
            Some("application/strategic-merge-patch+json"),
            Some(json!({"status": {"phase": "Running", "podIP": "10.0.0.3"}})),
        )
        .await
        .json();
    let modified = watch.next(SOON).await;
    assert_eq!(
        summary(&modified),
        ev(
            "MODIFIED",
            "default/web-3",
            patched["metadata"]["resourceVersion"].as_str().unwrap()
        )
    );
    assert_eq!(modified["object"]["status"]["podIP"], "10.0.0.3");
    // Another namespace is not this watch's business.
    store
        .update_pod("other", "web-9", |p| {
            p.metadata.labels = Some([("app".to_owned(), "db".to_owned())].into());
        })
        .unwrap();
    let deleted = client
        .send(
            Method::DELETE,
            "/api/v1/namespaces/default/pods/web-3",
            None,
            None,
        )
        .await;
    assert_eq!(deleted.status, 200);
    let deletion_rv = store.resource_version().to_string();
    let gone = watch.next(SOON).await;
    assert_eq!(summary(&gone), ev("DELETED", "default/web-3", &deletion_rv));
    assert_eq!(gone["object"]["status"]["podIP"], "10.0.0.3");
    assert_eq!(
        deleted.json()["metadata"]["resourceVersion"],
        deletion_rv.as_str()
    );
    assert_eq!(watch.next_within(QUIET).await, Ok(None));

    // Unset resourceVersion, all namespaces: the current state too.
    let mut all = client.watch("/api/v1/pods?watch=true").await;
    let initial: Vec<_> = [
        all.next(SOON).await,
        all.next(SOON).await,
        all.next(SOON).await,
    ]
    .iter()
    .map(|e| (summary(e).0, summary(e).1))
    .collect();
    assert_eq!(
        initial,
        [
            ("ADDED".to_owned(), "default/web-1".to_owned()),
            ("ADDED".to_owned(), "default/web-2".to_owned()),
            ("ADDED".to_owned(), "other/web-9".to_owned()),
        ]
    );
    assert_eq!(all.next_within(QUIET).await, Ok(None));

    // The request log records each watch once, as answered with 200.
    let watches: Vec<_> = emulator
        .faults()
        .requests()
        .into_iter()
        .filter(|r| r.is_watch())
        .collect();
    assert_eq!(watches.len(), 2);
    assert!(watches.iter().all(|r| r.status == 200 && r.authenticated));
    assert_eq!(watches[1].path_and_query, "/api/v1/pods?watch=true");
}

#[tokio::test]
async fn watch_from_a_resource_version_replays_then_follows() {
    let emulator = start().await;
    let store = emulator.store();
    store.put_pod(pod("default", "a", "web", None)).unwrap();
    let rv0 = store.resource_version();
    store.put_pod(pod("default", "b", "web", None)).unwrap();
    store
        .update_pod("default", "a", |p| {
            p.metadata.labels = Some([("app".to_owned(), "web2".to_owned())].into());
        })
        .unwrap();
    store.delete_pod("default", "b").unwrap();
    // A bulk write: one revision for both pods.
    store
        .put_pods([
            pod("default", "c", "web", None),
            pod("default", "d", "web", None),
        ])
        .unwrap();
    let client = Client::new(&emulator);

    let mut watch = client
        .watch(&format!(
            "/api/v1/namespaces/default/pods?watch=1&resourceVersion={rv0}"
        ))
        .await;
    let mut replayed = Vec::new();
    for _ in 0..5 {
        replayed.push(summary(&watch.next(SOON).await));
    }
    assert_eq!(
        replayed,
        [
            ev("ADDED", "default/b", rv0 + 1),
            ev("MODIFIED", "default/a", rv0 + 2),
            ev("DELETED", "default/b", rv0 + 3),
            ev("ADDED", "default/c", rv0 + 4),
            ev("ADDED", "default/d", rv0 + 4),
        ]
    );
    assert_eq!(watch.next_within(QUIET).await, Ok(None));
    store.put_pod(pod("default", "e", "web", None)).unwrap();
    assert_eq!(
        summary(&watch.next(SOON).await),
        ev("ADDED", "default/e", rv0 + 5)
    );

    // From the current revision: nothing to replay, and no initial state.
    let now = store.resource_version();
    let mut current = client
        .watch(&format!("/api/v1/pods?watch=1&resourceVersion={now}"))
        .await;
    assert_eq!(current.next_within(QUIET).await, Ok(None));

    // From a revision not reached yet: only changes after it arrive.
    let mut future = client
        .watch(&format!("/api/v1/pods?watch=1&resourceVersion={}", now + 2))
        .await;
    for name in ["f", "g", "h"] {
        store.put_pod(pod("default", name, "web", None)).unwrap();
    }
    assert_eq!(
        summary(&future.next(SOON).await),
        ev("ADDED", "default/h", now + 3)
    );
    assert_eq!(future.next_within(QUIET).await, Ok(None));
    let seen: Vec<_> = [
        current.next(SOON).await,
        current.next(SOON).await,
        current.next(SOON).await,
    ]
    .iter()
    .map(|e| summary(e).1)
    .collect();
    assert_eq!(seen, ["default/f", "default/g", "default/h"]);
}

#[tokio::test]
async fn too_old_resource_version_gets_an_expired_error_event() {
    let emulator = start().await;
    let store = emulator.store();
    store.set_history_limit(3);
    let rv0 = store.resource_version();
    for i in 0..5 {
        store
            .put_pod(pod("default", &format!("p{i}"), "web", None))
            .unwrap();
    }
    let oldest = store.oldest_watchable_resource_version();
    assert!(oldest > rv0);
    let client = Client::new(&emulator);

    let mut watch = client
        .watch(&format!("/api/v1/pods?watch=1&resourceVersion={rv0}"))
        .await;
    assert_eq!(
        watch.status, 200,
        "a watch fails in-band, not with HTTP 410"
    );
    let (events, end) = watch.until_end(SOON).await;
    assert_eq!(end, WatchEnd::Clean);
    assert_eq!(
        events,
        [json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {rv0} ({oldest})"),
            "reason": "Expired", "code": 410}})]
    );
    // The oldest retained revision still works.
    let mut ok = client
        .watch(&format!("/api/v1/pods?watch=1&resourceVersion={oldest}"))
        .await;
    assert_eq!(summary(&ok.next(SOON).await).0, "ADDED");

    // A LIST at a compacted revision answers 410 directly instead.
    let list = client
        .get(&format!(
            "/api/v1/pods?resourceVersion={rv0}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(
        (list.status, list.json()["reason"].clone()),
        (410, json!("Expired"))
    );

    // After a compaction only the current revision can be resumed from.
    store.compact();
    let now = store.resource_version();
    let mut old = client
        .watch(&format!("/api/v1/pods?watch=1&resourceVersion={}", now - 1))
        .await;
    let (events, end) = old.until_end(SOON).await;
    assert_eq!((events.len(), end), (1, WatchEnd::Clean));
    assert_eq!(events[0]["object"]["code"], 410);
    let mut fresh = client
        .watch(&format!("/api/v1/pods?watch=1&resourceVersion={now}"))
        .await;
    assert_eq!(fresh.next_within(QUIET).await, Ok(None));

    // The injected fault expires the next watch, whatever it asks for.
    emulator.faults().expire_next_watch();
    // A watch refused before streaming does not use the fault up.
    let refused = client
        .get("/api/v1/pods?watch=1&resourceVersionMatch=NotOlderThan")
        .await;
    assert_eq!(refused.status, 422);
    let mut forced = client.watch("/api/v1/pods?watch=1").await;
    let (events, end) = forced.until_end(SOON).await;
    assert_eq!(end, WatchEnd::Clean);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["reason"], "Expired");
    let mut normal = client.watch("/api/v1/pods?watch=1").await;
    assert_eq!(normal.next(SOON).await["type"], "ADDED");
}

#[tokio::test]
async fn live_watches_outlive_compaction() {
    let emulator = start().await;
    let store = emulator.store();
    store.set_history_limit(1);
    let client = Client::new(&emulator);
    let mut watch = client
        .watch(&format!(
            "/api/v1/pods?watch=1&resourceVersion={}",
            store.resource_version()
        ))
        .await;
    for i in 0..5 {
        store
            .put_pod(pod("default", &format!("p{i}"), "web", None))
            .unwrap();
        store.compact();
    }
    for i in 0..5 {
        assert_eq!(summary(&watch.next(SOON).await).1, format!("default/p{i}"));
    }
    assert_eq!(watch.next_within(QUIET).await, Ok(None));
}

#[tokio::test]
async fn selector_transitions_are_added_and_deleted() {
    let emulator = start().await;
    let store = emulator.store();
    store
        .put_pod(pod("default", "web-1", "web", Some("node-1")))
        .unwrap();
    store
        .put_pod(pod("default", "db-1", "db", Some("node-2")))
        .unwrap();
    let client = Client::new(&emulator);
    let relabel = |app: &'static str| {
        move |p: &mut Pod| {
            p.metadata.labels = Some([("app".to_owned(), app.to_owned())].into());
        }
    };

    let mut web = client
        .watch("/api/v1/namespaces/default/pods?watch=1&labelSelector=app%3Dweb")
        .await;
    let mut on_node = client
        .watch("/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3Dnode-2")
        .await;
    assert_eq!(summary(&web.next(SOON).await).1, "default/web-1");
    assert_eq!(summary(&on_node.next(SOON).await).1, "default/db-1");
    assert_eq!(web.next_within(QUIET).await, Ok(None));

    // Stops matching: DELETED with the state it had while it matched, at
    // the revision of the change.
    let left = store.update_pod("default", "web-1", relabel("db")).unwrap();
    let deleted = web.next(SOON).await;
    assert_eq!(
        summary(&deleted),
        ev("DELETED", "default/web-1", rv_of(&left))
    );
    assert_eq!(deleted["object"]["metadata"]["labels"]["app"], "web");
    // Starts matching: ADDED.
    let joined = store.update_pod("default", "db-1", relabel("web")).unwrap();
    assert_eq!(
        summary(&web.next(SOON).await),
        ev("ADDED", "default/db-1", rv_of(&joined))
    );
    // Keeps matching: MODIFIED.
    let changed = store
        .update_pod("default", "db-1", |p| {
            p.status.as_mut().unwrap().pod_ip = Some("10.0.0.2".to_owned());
        })
        .unwrap();
    assert_eq!(
        summary(&web.next(SOON).await),
        ev("MODIFIED", "default/db-1", rv_of(&changed))
    );
    // Never matched: nothing.
    store.put_pod(pod("default", "db-2", "db", None)).unwrap();
    let removed = store.delete_pod("default", "db-1").unwrap();
    assert_eq!(
        summary(&web.next(SOON).await),
        ev("DELETED", "default/db-1", rv_of(&removed))
    );
    assert_eq!(web.next_within(QUIET).await, Ok(None));

    // The field-selected watch saw db-1 through all of it.
    let types: Vec<_> = [
        on_node.next(SOON).await,
        on_node.next(SOON).await,
        on_node.next(SOON).await,
    ]
    .iter()
    .map(|e| summary(e).0)
    .collect();
    assert_eq!(types, ["MODIFIED", "MODIFIED", "DELETED"]);
    assert_eq!(on_node.next_within(QUIET).await, Ok(None));
}

#[tokio::test]
async fn bookmarks_arrive_only_when_allowed() {
    let emulator = start_with(|c| c.bookmark_interval = Duration::from_millis(200)).await;
    let store = emulator.store();
    store.put_pod(pod("default", "web-1", "web", None)).unwrap();
    let rv = store.resource_version();
    let client = Client::new(&emulator);

    let mut with = client
        .watch(&format!(
            "/api/v1/pods?watch=1&allowWatchBookmarks=true&resourceVersion={rv}"
        ))
        .await;
    let mut without = client
        .watch(&format!("/api/v1/pods?watch=1&resourceVersion={rv}"))
        .await;
    let bookmark = with.next(SOON).await;
    assert_eq!(
        bookmark,
        json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"resourceVersion": rv.to_string()}}})
    );
    // A change the watcher does not select still moves its bookmarks on.
    let mut filtered = client
        .watch(&format!(
            "/api/v1/pods?watch=1&allowWatchBookmarks=1&labelSelector=app%3Dnone&resourceVersion={rv}"
        ))
        .await;
    store.put_pod(pod("default", "web-2", "web", None)).unwrap();
    let mut next = with.next(SOON).await;
    while next["type"] == "BOOKMARK" {
        next = with.next(SOON).await;
    }
    assert_eq!(summary(&next), ev("ADDED", "default/web-2", rv + 1));
    let later = with.next(SOON).await;
    assert_eq!(summary(&later), ev("BOOKMARK", "/", rv + 1));
    let mut moved = false;
    let new_rv = (rv + 1).to_string();
    for _ in 0..20 {
        let event = filtered.next(SOON).await;
        assert_eq!(event["type"], "BOOKMARK");
        if event["object"]["metadata"]["resourceVersion"] == new_rv.as_str() {
            moved = true;
            break;
        }
    }
    assert!(
        moved,
        "the filtered watch's bookmark reached the new revision"
    );

    assert_eq!(
        summary(&without.next(SOON).await),
        ev("ADDED", "default/web-2", rv + 1)
    );
    assert_eq!(
        without.next_within(Duration::from_millis(700)).await,
        Ok(None)
    );
}

#[tokio::test]
async fn timeouts_end_the_stream_cleanly() {
    let emulator = start_with(|c| c.min_request_timeout = Duration::from_secs(1)).await;
    emulator
        .store()
        .put_pod(pod("default", "web-1", "web", None))
        .unwrap();
    let rv = emulator.store().resource_version();
    let client = Client::new(&emulator);

    let started = Instant::now();
    let mut watch = client
        .watch(&format!(
            "/api/v1/pods?watch=1&timeoutSeconds=1&resourceVersion={rv}"
        ))
        .await;
    let (events, end) = watch.until_end(SOON).await;
    let took = started.elapsed();
    assert_eq!((events, end), (vec![], WatchEnd::Clean));
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );

    // With bookmarks: a last one just before the end.
    let mut watch = client
        .watch(&format!(
            "/api/v1/pods?watch=1&timeoutSeconds=1&allowWatchBookmarks=true&resourceVersion={rv}"
        ))
        .await;
    let (events, end) = watch.until_end(SOON).await;
    assert_eq!(end, WatchEnd::Clean);
    assert_eq!(
        events.iter().map(summary).collect::<Vec<_>>(),
        [ev("BOOKMARK", "/", rv)]
    );

    // Without timeoutSeconds: the server's own, between one and two
    // minimum request timeouts.
    let started = Instant::now();
    let mut watch = client.watch("/api/v1/pods?watch=1").await;
    let (events, end) = watch.until_end(SOON).await;
    let took = started.elapsed();
    assert_eq!(end, WatchEnd::Clean);
    assert_eq!(events.len(), 1, "the initial ADDED");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

#[tokio::test]
async fn injected_cut_breaks_the_stream_after_k_events() {
    let emulator = start().await;
    let store = emulator.store();
    for name in ["web-1", "web-2", "web-3"] {
        store.put_pod(pod("default", name, "web", None)).unwrap();
    }
    let client = Client::new(&emulator);

    emulator.faults().cut_watch_after(2);
    let mut cut = client.watch("/api/v1/pods?watch=1").await;
    assert_eq!(cut.status, 200);
    let (events, end) = cut.until_end(SOON).await;
    assert_eq!(events.len(), 2);
    assert!(matches!(end, WatchEnd::Broken(_)), "{end:?}");

    // One-shot: the next watch is whole.
    let mut whole = client.watch("/api/v1/pods?watch=1").await;
    for _ in 0..3 {
        assert_eq!(whole.next(SOON).await["type"], "ADDED");
    }

    // Cut during the live part, and before anything at all.
    let rv = store.resource_version();
    emulator.faults().cut_watch_after(1);
    let mut live = client
        .watch(&format!("/api/v1/pods?watch=1&resourceVersion={rv}"))
        .await;
    assert_eq!(live.next_within(QUIET).await, Ok(None));
    store.delete_pod("default", "web-1").unwrap();
    let (events, end) = live.until_end(SOON).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "DELETED");
    assert!(matches!(end, WatchEnd::Broken(_)), "{end:?}");
    emulator.faults().cut_watch_after(0);
    let mut at_once = client.watch("/api/v1/pods?watch=1").await;
    let (events, end) = at_once.until_end(SOON).await;
    assert!(events.is_empty());
    assert!(matches!(end, WatchEnd::Broken(_)), "{end:?}");
}

#[tokio::test]
async fn graceful_delete_terminates_then_the_kubelet_removes() {
    let emulator = start_with(|c| c.graceful_delete = true).await;
    let store = emulator.store();
    store
        .put_pod(pod("default", "web-1", "web", Some("node-1")))
        .unwrap();
    store
        .put_pod(pod("default", "web-2", "web", Some("node-1")))
        .unwrap();
    store
        .put_pod(pod("default", "web-3", "web", Some("node-1")))
        .unwrap();
    store
        .put_pod(pod("default", "pending", "web", None))
        .unwrap();
    let rv = store.resource_version();
    let client = Client::new(&emulator);
    let mut watch = client
        .watch(&format!("/api/v1/pods?watch=1&resourceVersion={rv}"))
        .await;
    let path = "/api/v1/namespaces/default/pods";

    let deleted = client
        .send(Method::DELETE, &format!("{path}/web-1"), None, None)
        .await;
    assert_eq!(deleted.status, 200);
    let terminating = deleted.json();
    assert!(terminating["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(terminating["metadata"]["deletionGracePeriodSeconds"], 30);
    assert!(store.get_pod("default", "web-1").is_some());
    let modified = watch.next(SOON).await;
    assert_eq!(summary(&modified), ev("MODIFIED", "default/web-1", rv + 1));
    assert_eq!(
        modified["object"]["metadata"]["deletionTimestamp"],
        terminating["metadata"]["deletionTimestamp"]
    );

    // Deleting again while it terminates changes nothing.
    let again = client
        .send(Method::DELETE, &format!("{path}/web-1"), None, None)
        .await;
    assert_eq!(again.status, 200);
    assert_eq!(store.resource_version(), rv + 1);

    // The kubelet finishes: DELETED.
    let removed = store.finish_deletion("default", "web-1").unwrap();
    assert_eq!(rv_of(&removed), (rv + 2).to_string());
    let gone = watch.next(SOON).await;
    assert_eq!(summary(&gone), ev("DELETED", "default/web-1", rv + 2));
    assert!(gone["object"]["metadata"]["deletionTimestamp"].is_string());

    // gracePeriodSeconds=0 (query) deletes at once; so does deleting an
    // unscheduled pod; a grace period in the body is honoured.
    let now = client
        .send(
            Method::DELETE,
            &format!("{path}/web-2?gracePeriodSeconds=0"),
            None,
            None,
        )
        .await;
    assert_eq!(now.status, 200);
    assert_eq!(
        summary(&watch.next(SOON).await),
        ev("DELETED", "default/web-2", rv + 3)
    );
    client
        .send(Method::DELETE, &format!("{path}/pending"), None, None)
        .await;
    assert_eq!(
        summary(&watch.next(SOON).await),
        ev("DELETED", "default/pending", rv + 4)
    );
    let short = client
        .send(
            Method::DELETE,
            &format!("{path}/web-3"),
            Some("application/json"),
            Some(json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 5})),
        )
        .await
        .json();
    assert_eq!(short["metadata"]["deletionGracePeriodSeconds"], 5);
    assert_eq!(summary(&watch.next(SOON).await).0, "MODIFIED");
    // A force delete of a terminating pod removes it.
    client
        .send(
            Method::DELETE,
            &format!("{path}/web-3"),
            Some("application/json"),
            Some(json!({"gracePeriodSeconds": 0})),
        )
        .await;
    assert_eq!(summary(&watch.next(SOON).await).0, "DELETED");
    assert!(store.pods().is_empty());
}

#[tokio::test]
async fn update_preconditions_fail_as_on_a_real_apiserver() {
    let emulator = start().await;
    let stored = emulator
        .store()
        .put_pod(pod("default", "web-1", "web", Some("node-1")))
        .unwrap();
    let uid = stored.metadata.uid.clone().unwrap();
    let client = Client::new(&emulator);
    let status_path = "/api/v1/namespaces/default/pods/web-1/status";
    let ready = |uid: &str| {
        json!({"metadata": {"uid": uid},
               "status": {"conditions": [{"type": "example.com/gate", "status": "True"}]}})
    };

    // The kubelet's guard: a status patch naming the pod's UID.
    let other = "00000000-0000-4000-8000-000000000000";
    let rv = emulator.store().resource_version();
    let refused = client
        .send(
            Method::PATCH,
            status_path,
            Some("application/strategic-merge-patch+json"),
            Some(ready(other)),
        )
        .await;
    assert_eq!(refused.status, 422);
    let body = refused.json();
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(
        body["message"],
        format!(
            "Pod \"web-1\" is invalid: metadata.uid: Invalid value: \"{other}\": field is immutable"
        )
    );
    assert_eq!(emulator.store().resource_version(), rv, "nothing written");
    let accepted = client
        .send(
            Method::PATCH,
            status_path,
            Some("application/strategic-merge-patch+json"),
            Some(ready(&uid)),
        )
        .await;
    assert_eq!(accepted.status, 200);

    // A stale resourceVersion in a patch: 409.
    let stale = client
        .send(
            Method::PATCH,
            status_path,
            Some("application/merge-patch+json"),
            Some(json!({"metadata": {"resourceVersion": rv.to_string()},
                        "status": {"phase": "Running"}})),
        )
        .await;
    assert_eq!(stale.status, 409);
    assert_eq!(
        stale.json()["message"],
        "Operation cannot be fulfilled on pods \"web-1\": the object has been modified; please apply your changes to the latest version and try again"
    );

    // A PUT naming another UID fails its storage precondition: 409.
    let mut current = client
        .get("/api/v1/namespaces/default/pods/web-1")
        .await
        .json();
    current["metadata"]["uid"] = json!(other);
    let put = client
        .send(
            Method::PUT,
            status_path,
            Some("application/json"),
            Some(current),
        )
        .await;
    assert_eq!(put.status, 409);
    let body = put.json();
    assert_eq!(body["reason"], "Conflict");
    assert_eq!(
        body["message"],
        format!(
            "Operation cannot be fulfilled on pods \"web-1\": StorageError: invalid object, Code: 4, Key: /registry/pods/default/web-1, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: {other}, UID in object meta: {uid}"
        )
    );

    // A DELETE precondition, in rest.BeforeDelete's words.
    let delete = client
        .send(
            Method::DELETE,
            "/api/v1/namespaces/default/pods/web-1",
            Some("application/json"),
            Some(json!({"preconditions": {"uid": other}})),
        )
        .await;
    assert_eq!(delete.status, 409);
    assert_eq!(
        delete.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("Operation cannot be fulfilled on Pod \"web-1\": the UID in the precondition ({other}) does not match the UID in record ({uid}). The object might have been deleted and then recreated"),
            "reason": "Conflict", "details": {"name": "web-1", "kind": "Pod"}, "code": 409})
    );
}

#[tokio::test]
async fn watch_parameters_are_checked_and_initial_events_are_bookmarked() {
    let emulator = start().await;
    let store = emulator.store();
    store.put_pod(pod("default", "web-1", "web", None)).unwrap();
    store.put_pod(pod("default", "web-2", "web", None)).unwrap();
    let mut client = Client::new(&emulator);

    for (query, status, reason) in [
        ("sendInitialEvents=true", 422, "Invalid"),
        (
            "sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
            422,
            "Invalid",
        ),
        ("resourceVersionMatch=NotOlderThan", 422, "Invalid"),
        ("labelSelector=app%3D%3D%3D", 400, "BadRequest"),
        ("timeoutSeconds=soon", 400, "BadRequest"),
    ] {
        let answer = client.get(&format!("/api/v1/pods?watch=1&{query}")).await;
        assert_eq!(
            (answer.status, answer.json()["reason"].clone()),
            (status, json!(reason)),
            "{query}"
        );
    }
    let bad_rv = client.get("/api/v1/pods?watch=1&resourceVersion=abc").await;
    assert_eq!(bad_rv.status, 500);

    // sendInitialEvents: the state, then a bookmark that marks its end.
    let rv = store.resource_version();
    let mut initial = client
        .watch("/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
        .await;
    assert_eq!(summary(&initial.next(SOON).await).0, "ADDED");
    assert_eq!(summary(&initial.next(SOON).await).0, "ADDED");
    let end = initial.next(SOON).await;
    assert_eq!(summary(&end), ev("BOOKMARK", "/", rv));
    assert_eq!(
        end["object"]["metadata"]["annotations"][INITIAL_EVENTS_END_ANNOTATION],
        "true"
    );
    // sendInitialEvents=false: no state, changes only.
    let mut changes = client
        .watch("/api/v1/pods?watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion=0")
        .await;
    assert_eq!(changes.next_within(QUIET).await, Ok(None));
    store.delete_pod("default", "web-1").unwrap();
    assert_eq!(
        summary(&changes.next(SOON).await),
        ev("DELETED", "default/web-1", rv + 1)
    );
    assert_eq!(
        summary(&initial.next(SOON).await),
        ev("DELETED", "default/web-1", rv + 1)
    );

    // Injected failures and authentication apply to watches too.
    emulator.faults().fail_all(503);
    assert_eq!(client.get("/api/v1/pods?watch=1").await.status, 503);
    emulator.faults().clear();
    client.token = None;
    assert_eq!(client.get("/api/v1/pods?watch=1").await.status, 401);

    // Discovery says pods can be watched.
    let client = Client::new(&emulator);
    let resources = client.get("/api/v1").await.json();
    assert!(
        resources["resources"][0]["verbs"]
            .as_array()
            .unwrap()
            .contains(&json!("watch"))
    );
}
