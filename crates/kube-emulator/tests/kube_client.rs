//! The `kube` crate's client (the one tgsync uses) against the emulator:
//! its watch parses our event stream — ADDED/MODIFIED/DELETED, bookmarks,
//! the initial-events bookmark, the 410 ERROR event — and the stream ends
//! when the server times the watch out.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube_emulator::{Emulator, EmulatorConfig, INITIAL_EVENTS_END_ANNOTATION};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::json;

const SOON: Duration = Duration::from_secs(5);

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}], "nodeName": "node-1"},
        "status": {"phase": "Running", "podIP": "10.0.0.1"}
    }))
    .unwrap()
}

fn client(emulator: &Emulator) -> kube::Client {
    let mut config = kube::Config::new(emulator.url().parse().unwrap());
    let ca = emulator.ca_pem().unwrap();
    config.root_cert = Some(
        CertificateDer::pem_slice_iter(ca.as_bytes())
            .map(|c| c.unwrap().to_vec())
            .collect(),
    );
    config.auth_info.token = Some(secrecy::SecretString::from(emulator.token().unwrap()));
    kube::Client::try_from(config).unwrap()
}

fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap()
}

#[tokio::test]
async fn kube_watch_reads_the_emulator_stream() {
    let mut config = EmulatorConfig::new("prod");
    config.bookmark_interval = Duration::from_millis(200);
    let emulator = Emulator::start(config).await.unwrap();
    let store = emulator.store();
    store.put_pod(pod("web-1")).unwrap();
    store.put_pod(pod("web-2")).unwrap();
    let pods: Api<Pod> = Api::namespaced(client(&emulator), "default");

    let list = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 2);
    let rv = list.metadata.resource_version.unwrap();

    // From the list's resourceVersion: changes only, then bookmarks.
    let params = WatchParams::default().timeout(3);
    let mut stream = pods.watch(&params, &rv).await.unwrap().boxed();
    let next =
        async |stream: &mut futures::stream::BoxStream<'_, kube::Result<WatchEvent<Pod>>>| {
            tokio::time::timeout(SOON, stream.try_next())
                .await
                .expect("an event in time")
                .expect("a well-formed event")
        };
    pods.patch_status(
        "web-1",
        &PatchParams::default(),
        &Patch::Strategic(json!({"status": {"podIP": "10.0.0.7"}})),
    )
    .await
    .unwrap();
    pods.delete("web-2", &DeleteParams::default())
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match next(&mut stream).await {
            Some(WatchEvent::Modified(p)) => seen.push(format!("MODIFIED {}", name(&p))),
            Some(WatchEvent::Deleted(p)) => seen.push(format!("DELETED {}", name(&p))),
            Some(WatchEvent::Bookmark(b)) => {
                if seen.len() == 2 {
                    assert_eq!(
                        b.metadata.resource_version,
                        store.resource_version().to_string()
                    );
                    seen.push("BOOKMARK".to_owned());
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["MODIFIED web-1", "DELETED web-2", "BOOKMARK"]);
    // The server ends the watch at its timeout; kube's stream ends with it.
    let rest: Vec<_> = tokio::time::timeout(SOON, stream.collect::<Vec<_>>())
        .await
        .expect("the stream ends after timeoutSeconds");
    assert!(
        rest.iter()
            .all(|e| matches!(e, Ok(WatchEvent::Bookmark(_))))
    );

    // sendInitialEvents: the state, then the annotated bookmark.
    let initial = WatchParams::default().initial_events().timeout(2);
    let mut stream = pods.watch(&initial, "").await.unwrap().boxed();
    assert!(matches!(next(&mut stream).await, Some(WatchEvent::Added(p)) if name(&p) == "web-1"));
    match next(&mut stream).await {
        Some(WatchEvent::Bookmark(b)) => {
            assert_eq!(
                b.metadata
                    .annotations
                    .get(INITIAL_EVENTS_END_ANNOTATION)
                    .map(String::as_str),
                Some("true")
            );
        }
        other => panic!("expected the initial-events bookmark, got {other:?}"),
    }

    // A compacted resourceVersion: kube surfaces the ERROR event's Status.
    store.compact();
    let mut stream = pods.watch(&params, &rv).await.unwrap().boxed();
    match next(&mut stream).await {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            assert!(
                status.message.starts_with("too old resource version"),
                "{status:?}"
            );
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(
        next(&mut stream).await.is_none(),
        "the stream ends after the error"
    );
}
