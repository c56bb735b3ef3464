//! End-to-end tests of the emulator over real HTTPS.

mod common;

use common::{Call, Client, send_to};
use hyper::Method;
use k8s_openapi::api::core::v1::Pod;
use kube_emulator::{EXPIRED_CONTINUE_MESSAGE, Emulator, EmulatorConfig};
use serde_json::{Value, json};

fn pod(ns: &str, name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

async fn start() -> Emulator {
    Emulator::start(EmulatorConfig::new("prod")).await.unwrap()
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn https_is_verified_against_the_emulator_ca_only() {
    let emulator = start().await;
    assert!(emulator.url().starts_with("https://127.0.0.1:"));
    let ca = emulator.ca_pem().unwrap();
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));

    // Both SANs verify.
    for name in ["127.0.0.1", "localhost"] {
        let answer = send_to(&emulator, Some(ca), name, Call::get("/healthz"))
            .await
            .unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body, b"ok");
    }
    // Another CA, or another name, is refused by the client.
    let other = start().await;
    let err = send_to(
        &emulator,
        other.ca_pem(),
        "127.0.0.1",
        Call::get("/healthz"),
    )
    .await
    .unwrap_err();
    assert!(err.starts_with("TLS"), "{err}");
    let err = send_to(&emulator, Some(ca), "example.com", Call::get("/healthz"))
        .await
        .unwrap_err();
    assert!(err.starts_with("TLS"), "{err}");
}

#[tokio::test]
async fn authentication_is_required_and_verified() {
    let emulator = start().await;
    let mut client = Client::new(&emulator);
    assert_eq!(client.get("/api/v1/pods").await.status, 200);

    let unauthorized = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Unauthorized", "reason": "Unauthorized", "code": 401});
    client.token = None;
    let answer = client.get("/api/v1/pods").await;
    assert_eq!((answer.status, answer.json()), (401, unauthorized.clone()));
    assert_eq!(client.get("/healthz").await.status, 200);
    assert_eq!(client.get("/version").await.json()["major"], "1");
    // A token for another cluster.
    let other = Emulator::start(EmulatorConfig::new("staging"))
        .await
        .unwrap();
    client.token = Some(other.token().unwrap());
    let answer = client.get("/api/v1/namespaces/default/pods").await;
    assert_eq!((answer.status, answer.json()), (401, unauthorized.clone()));
    // A bad token fails even on public paths.
    assert_eq!(client.get("/healthz").await.status, 401);
    client.token = Some("k8s-aws-v1.garbage".to_owned());
    assert_eq!(client.get("/api/v1/pods").await.status, 401);

    let log = emulator.faults().requests();
    let authenticated: Vec<bool> = log.iter().map(|r| r.authenticated).collect();
    assert_eq!(
        authenticated,
        [true, false, false, false, false, false, false]
    );
    assert_eq!(log[0].path_and_query, "/api/v1/pods");
    assert_eq!(log[0].method, "GET");
}

#[tokio::test]
async fn paged_list_is_consistent_over_http() {
    let emulator = start().await;
    for name in ["web-4", "web-2", "web-5", "web-1", "web-3"] {
        emulator
            .store()
            .put_pod(pod("default", name, json!({"app": "web"})))
            .unwrap();
    }
    emulator
        .store()
        .put_pod(pod("default", "db-1", json!({"app": "db"})))
        .unwrap();
    emulator
        .store()
        .put_pod(pod("kube-system", "web-9", json!({"app": "web"})))
        .unwrap();
    let client = Client::new(&emulator);

    let base = "/api/v1/namespaces/default/pods?labelSelector=app%3Dweb&limit=2";
    let first = client.get(base).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.headers["content-type"], "application/json");
    let first = first.json();
    assert_eq!(first["kind"], "PodList");
    assert_eq!(first["apiVersion"], "v1");
    assert_eq!(names(&first), ["web-1", "web-2"]);
    // Items carry no kind/apiVersion, as from the real apiserver.
    assert!(first["items"][0].get("kind").is_none());
    assert!(first["items"][0].get("apiVersion").is_none());
    let rv = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    emulator
        .store()
        .put_pod(pod("default", "web-10", json!({"app": "web"})))
        .unwrap();
    emulator.store().delete_pod("default", "web-3");

    let mut seen = names(&first);
    let mut token = first["metadata"]["continue"].as_str().unwrap().to_owned();
    loop {
        let page = client.get(&format!("{base}&continue={token}")).await.json();
        assert_eq!(page["metadata"]["resourceVersion"], rv.as_str());
        seen.extend(names(&page));
        match page["metadata"]["continue"].as_str() {
            Some(next) if !next.is_empty() => token = next.to_owned(),
            _ => break,
        }
    }
    assert_eq!(seen, ["web-1", "web-2", "web-3", "web-4", "web-5"]);

    // All namespaces, sorted by namespace then name; remainingItemCount without selectors.
    let all = client.get("/api/v1/pods?limit=6").await.json();
    assert_eq!(
        names(&all),
        ["db-1", "web-1", "web-10", "web-2", "web-4", "web-5"]
    );
    assert_eq!(all["metadata"]["remainingItemCount"], 1);

    // Field selector and set-based selectors.
    let one = client
        .get("/api/v1/pods?fieldSelector=metadata.name%3Dweb-9")
        .await
        .json();
    assert_eq!(names(&one), ["web-9"]);
    let not_web = client
        .get("/api/v1/namespaces/default/pods?labelSelector=app%20notin%20(web)")
        .await
        .json();
    assert_eq!(names(&not_web), ["db-1"]);

    // Every LIST above was a consistent read (no resourceVersion=0).
    let lists: Vec<_> = emulator
        .faults()
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET")
        .collect();
    assert!(
        lists
            .iter()
            .all(|r| r.query_param("resourceVersion").is_none())
    );
}

#[tokio::test]
async fn list_errors_have_status_bodies() {
    let emulator = start().await;
    for i in 0..5 {
        emulator
            .store()
            .put_pod(pod("default", &format!("web-{i}"), json!({})))
            .unwrap();
    }
    let client = Client::new(&emulator);

    let bad = client.get("/api/v1/pods?labelSelector=app%3D%3D%3D").await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["reason"], "BadRequest");

    let bad = client
        .get("/api/v1/pods?limit=2&continue=not-a-token")
        .await;
    assert_eq!(
        (bad.status, bad.json()["reason"].clone()),
        (400, json!("BadRequest"))
    );

    let first = client.get("/api/v1/pods?limit=2").await.json();
    let token = first["metadata"]["continue"].as_str().unwrap().to_owned();
    emulator.faults().expire_continue_tokens();
    let expired = client
        .get(&format!("/api/v1/pods?limit=2&continue={token}"))
        .await;
    assert_eq!(expired.status, 410);
    let body = expired.json();
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["status"], "Failure");
    assert_eq!(body["reason"], "Expired");
    assert_eq!(body["code"], 410);
    assert_eq!(body["message"], EXPIRED_CONTINUE_MESSAGE);
    // The fault is one-shot.
    assert_eq!(
        client
            .get(&format!("/api/v1/pods?limit=2&continue={token}"))
            .await
            .status,
        200
    );

    // Compaction expires tokens for real.
    emulator
        .store()
        .put_pod(pod("default", "web-9", json!({})))
        .unwrap();
    emulator.store().compact();
    assert_eq!(
        client
            .get(&format!("/api/v1/pods?limit=2&continue={token}"))
            .await
            .status,
        410
    );

    emulator.faults().fail_list_page(2, 500);
    let first = client.get("/api/v1/pods?limit=2").await;
    assert_eq!(first.status, 200);
    let token = first.json()["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_owned();
    let failed = client
        .get(&format!("/api/v1/pods?limit=2&continue={token}"))
        .await;
    assert_eq!(
        (failed.status, failed.json()["reason"].clone()),
        (500, json!("InternalError"))
    );
    assert_eq!(
        client
            .get(&format!("/api/v1/pods?limit=2&continue={token}"))
            .await
            .status,
        200
    );

    emulator.faults().fail_all(503);
    let down = client.get("/api/v1/pods").await;
    assert_eq!(down.status, 503);
    assert_eq!(down.headers["retry-after"], "1");
    assert_eq!(down.json()["reason"], "ServiceUnavailable");
    emulator.faults().clear();
    assert_eq!(client.get("/api/v1/pods").await.status, 200);

    let missing = client.get("/api/v1/namespaces/default/pods/web-77").await;
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "pods \"web-77\" not found", "reason": "NotFound",
               "details": {"name": "web-77", "kind": "pods"}, "code": 404})
    );
    let unknown = client.get("/api/v1/services").await;
    assert_eq!(
        (unknown.status, unknown.json()["reason"].clone()),
        (404, json!("NotFound"))
    );
    let wrong_verb = client
        .send(Method::DELETE, "/api/v1/pods", None, None)
        .await;
    assert_eq!(wrong_verb.status, 405);
}

#[tokio::test]
async fn writes_follow_registry_semantics() {
    let emulator = start().await;
    let client = Client::new(&emulator);
    let path = "/api/v1/namespaces/default/pods";
    let body = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-1", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]},
        "status": {"phase": "Running"}});

    let created = client
        .send(
            Method::POST,
            path,
            Some("application/json"),
            Some(body.clone()),
        )
        .await;
    assert_eq!(created.status, 201);
    let created = created.json();
    assert_eq!(created["kind"], "Pod");
    assert_eq!(
        created["status"]["phase"], "Pending",
        "status comes from the kubelet, not the client"
    );
    assert!(created["metadata"]["uid"].is_string());
    let rv1 = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    let again = client
        .send(Method::POST, path, Some("application/json"), Some(body))
        .await;
    assert_eq!(
        (again.status, again.json()["reason"].clone()),
        (409, json!("AlreadyExists"))
    );
    let invalid = client
        .send(
            Method::POST,
            path,
            Some("application/json"),
            Some(json!({"metadata": {"name": "x"}})),
        )
        .await;
    assert_eq!(
        (invalid.status, invalid.json()["reason"].clone()),
        (422, json!("Invalid"))
    );
    let not_json = send_to(
        &emulator,
        emulator.ca_pem(),
        "127.0.0.1",
        Call {
            method: Method::POST,
            path,
            token: client.token.as_deref(),
            content_type: Some("application/json"),
            body: Some(b"{nope".to_vec()),
        },
    )
    .await
    .unwrap();
    assert_eq!(not_json.status, 400);

    // Strategic merge patch of status merges conditions by type.
    let status_path = format!("{path}/web-1/status");
    let patched = client
        .send(
            Method::PATCH,
            &status_path,
            Some("application/strategic-merge-patch+json"),
            Some(
                json!({"status": {"phase": "Running", "podIP": "10.0.0.7", "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "False"}]}}),
            ),
        )
        .await;
    assert_eq!(patched.status, 200);
    let patched = client
        .send(
            Method::PATCH,
            &status_path,
            Some("application/strategic-merge-patch+json"),
            Some(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
        )
        .await
        .json();
    let conditions = patched["status"]["conditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 2);
    assert_eq!(conditions[1], json!({"type": "Ready", "status": "True"}));
    assert_eq!(patched["status"]["podIP"], "10.0.0.7");
    let rv2 = patched["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(rv1, rv2);

    // Merge patch replaces the list.
    let merged = client
        .send(
            Method::PATCH,
            &status_path,
            Some("application/merge-patch+json"),
            Some(json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})),
        )
        .await
        .json();
    assert_eq!(
        merged["status"]["conditions"],
        json!([{"type": "Ready", "status": "False"}])
    );

    let unsupported = client
        .send(
            Method::PATCH,
            &status_path,
            Some("application/apply-patch+yaml"),
            Some(json!({})),
        )
        .await;
    assert_eq!(
        (unsupported.status, unsupported.json()["reason"].clone()),
        (415, json!("UnsupportedMediaType"))
    );

    // Stale resourceVersion → 409 Conflict; current → 200.
    let mut stale = created.clone();
    stale["metadata"]["labels"]["app"] = json!("db");
    let conflict = client
        .send(
            Method::PUT,
            &format!("{path}/web-1"),
            Some("application/json"),
            Some(stale.clone()),
        )
        .await;
    assert_eq!(
        (conflict.status, conflict.json()["reason"].clone()),
        (409, json!("Conflict"))
    );
    let current = client.get(&format!("{path}/web-1")).await.json();
    let mut update = current.clone();
    update["metadata"]["labels"]["app"] = json!("db");
    update["status"]["phase"] = json!("Failed");
    let updated = client
        .send(
            Method::PUT,
            &format!("{path}/web-1"),
            Some("application/json"),
            Some(update),
        )
        .await;
    assert_eq!(updated.status, 200);
    let updated = updated.json();
    assert_eq!(updated["metadata"]["labels"]["app"], "db");
    assert_eq!(
        updated["status"]["phase"], "Running",
        "PUT of the pod ignores status"
    );

    // Status PUT.
    let mut status_update = updated.clone();
    status_update["status"]["phase"] = json!("Succeeded");
    let done = client
        .send(
            Method::PUT,
            &status_path,
            Some("application/json"),
            Some(status_update),
        )
        .await;
    assert_eq!(
        (done.status, done.json()["status"]["phase"].clone()),
        (200, json!("Succeeded"))
    );

    // Delete returns the object; a second delete is 404.
    let deleted = client
        .send(Method::DELETE, &format!("{path}/web-1"), None, None)
        .await;
    assert_eq!(
        (deleted.status, deleted.json()["metadata"]["name"].clone()),
        (200, json!("web-1"))
    );
    assert_eq!(
        client
            .send(Method::DELETE, &format!("{path}/web-1"), None, None)
            .await
            .status,
        404
    );
    assert!(emulator.store().pods().is_empty());
}

#[tokio::test]
async fn store_helpers_are_visible_over_http() {
    let emulator = start().await;
    emulator
        .store()
        .put_pod(pod("default", "web-1", json!({"app": "web"})))
        .unwrap();
    emulator
        .store()
        .set_terminating("default", "web-1")
        .unwrap();
    let client = Client::new(&emulator);
    let got = client
        .get("/api/v1/namespaces/default/pods/web-1")
        .await
        .json();
    assert!(got["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(got["metadata"]["deletionGracePeriodSeconds"], 30);
    emulator.shutdown();
    let mut stopped = false;
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let answer = send_to(
            &emulator,
            emulator.ca_pem(),
            "127.0.0.1",
            Call::get("/healthz"),
        )
        .await;
        if answer.is_err() {
            stopped = true;
            break;
        }
    }
    assert!(stopped, "a stopped emulator does not answer");
}

#[tokio::test]
async fn plain_http_mode() {
    let mut config = EmulatorConfig::new("prod");
    config.tls = false;
    let emulator = Emulator::start(config).await.unwrap();
    assert!(emulator.url().starts_with("http://127.0.0.1:"));
    assert!(emulator.ca_pem().is_none());
    let client = Client::new(&emulator);
    assert_eq!(client.get("/api/v1/pods").await.status, 200);
}

#[tokio::test]
async fn patches_preconditions_and_discovery() {
    let emulator = start().await;
    emulator
        .store()
        .put_pod(pod("default", "web-1", json!({"app": "web"})))
        .unwrap();
    let client = Client::new(&emulator);
    let path = "/api/v1/namespaces/default/pods/web-1";

    // JSON patch on the main resource changes labels.
    let patched = client
        .send(
            Method::PATCH,
            path,
            Some("application/json-patch+json"),
            Some(json!([{"op": "add", "path": "/metadata/labels/tier", "value": "front"}])),
        )
        .await;
    assert_eq!(patched.status, 200);
    let patched = patched.json();
    assert_eq!(
        patched["metadata"]["labels"],
        json!({"app": "web", "tier": "front"})
    );

    // A patch that names a stale resourceVersion conflicts.
    let stale = client
        .send(
            Method::PATCH,
            path,
            Some("application/merge-patch+json"),
            Some(json!({"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}})),
        )
        .await;
    assert_eq!(
        (stale.status, stale.json()["reason"].clone()),
        (409, json!("Conflict"))
    );

    // A no-op patch does not bump the resourceVersion.
    let rv = emulator.store().resource_version();
    let noop = client
        .send(
            Method::PATCH,
            path,
            Some("application/merge-patch+json"),
            Some(json!({"metadata": {"labels": {"app": "web"}}})),
        )
        .await;
    assert_eq!(noop.status, 200);
    assert_eq!(emulator.store().resource_version(), rv);

    // Bad patch JSON is 400; a JSON patch that fails is 422.
    let call = Call {
        method: Method::PATCH,
        path,
        token: client.token.as_deref(),
        content_type: Some("application/merge-patch+json"),
        body: Some(b"{".to_vec()),
    };
    assert_eq!(
        send_to(&emulator, emulator.ca_pem(), "127.0.0.1", call)
            .await
            .unwrap()
            .status,
        400
    );
    let failing = client
        .send(
            Method::PATCH,
            path,
            Some("application/json-patch+json"),
            Some(json!([{"op": "remove", "path": "/nope"}])),
        )
        .await;
    assert_eq!(failing.status, 422);

    // Delete preconditions.
    let wrong = client
        .send(
            Method::DELETE,
            path,
            Some("application/json"),
            Some(json!({"preconditions": {"uid": "nope"}})),
        )
        .await;
    assert_eq!(
        (wrong.status, wrong.json()["reason"].clone()),
        (409, json!("Conflict"))
    );
    assert_eq!(emulator.store().pods().len(), 1);

    // generateName.
    let made = client
        .send(
            Method::POST,
            "/api/v1/namespaces/default/pods",
            Some("application/json"),
            Some(json!({"metadata": {"generateName": "job-"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}})),
        )
        .await;
    assert_eq!(made.status, 201);
    let name = made.json()["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(name.starts_with("job-") && name.len() == 9, "{name}");

    // Discovery.
    let resources = client.get("/api/v1").await.json();
    assert_eq!(resources["kind"], "APIResourceList");
    assert_eq!(resources["resources"][0]["name"], "pods");
    assert_eq!(client.get("/api").await.json()["versions"], json!(["v1"]));

    // resourceVersion=0 lists are served and recorded as such.
    assert_eq!(
        client.get("/api/v1/pods?resourceVersion=0").await.status,
        200
    );
    let last = emulator.faults().requests().pop().unwrap();
    assert_eq!(last.query_param("resourceVersion").as_deref(), Some("0"));

    // Oversized bodies are refused.
    let huge =
        json!({"metadata": {"name": "big", "annotations": {"a": "x".repeat(4 * 1024 * 1024)}}});
    let too_big = client
        .send(
            Method::POST,
            "/api/v1/namespaces/default/pods",
            Some("application/json"),
            Some(huge),
        )
        .await;
    assert_eq!(too_big.status, 413);
}

#[tokio::test]
async fn a_node_is_read_by_name_and_a_missing_one_is_a_404_status() {
    let emulator = start().await;
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": {"name": "ip-10-0-1-7.ec2.internal",
                     "labels": {"topology.kubernetes.io/zone": "us-east-1a"}}
    }))
    .unwrap();
    emulator.store().put_node(node);
    let client = Client::new(&emulator);

    let found = client.get("/api/v1/nodes/ip-10-0-1-7.ec2.internal").await;
    assert_eq!(found.status, 200);
    let body = found.json();
    assert_eq!(body["kind"], "Node");
    assert_eq!(
        body["metadata"]["labels"]["topology.kubernetes.io/zone"],
        "us-east-1a"
    );

    let missing = client.get("/api/v1/nodes/ip-10-0-9-9.ec2.internal").await;
    assert_eq!(missing.status, 404);
    let body = missing.json();
    assert_eq!(body["reason"], "NotFound");
    assert_eq!(
        body["message"],
        "nodes \"ip-10-0-9-9.ec2.internal\" not found"
    );
    assert_eq!(body["details"]["kind"], "nodes");
}
