//! `KubePods` against the local Kubernetes API emulator over real HTTPS: the cluster CA,
//! a token minted by `tgsync::eks::token` and verified by signature, paginated LISTs and
//! the failures the safety rules care about.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use k8s_openapi::api::core::v1::Pod;
use kube_emulator::{
    EXAMPLE_ACCESS_KEY_ID, EXAMPLE_SECRET_ACCESS_KEY, Emulator, EmulatorConfig, RequestRecord,
};
use serde_json::json;
use tgsync::core::Selector;
use tgsync::eks::{ClusterAccess, KubePods, Overrides};
use tgsync::pods::{PodSource, PodsError};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use url::Url;

const CLUSTER: &str = "prod";
const NAMESPACE: &str = "shop";
const REGION: &str = "us-east-1";
const SELECTED: usize = 1_203;

fn pod(namespace: &str, name: &str, app: &str, n: usize) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": namespace, "labels": { "app": app, "tier": "web" } },
        "spec": { "containers": [{ "name": "main", "image": "nginx",
                                   "ports": [{ "name": "http", "containerPort": 8080 }] }] },
        "status": {
            "phase": "Running",
            "podIP": format!("10.{}.{}.{}", n / 65536, (n / 256) % 256, n % 256),
            "conditions": [{ "type": "Ready", "status": "True" },
                           { "type": "ContainersReady", "status": "True" }]
        }
    }))
    .unwrap()
}

/// An HTTPS emulator holding 1,203 selected pods, 150 others in the same namespace and 40
/// selected-looking pods in another namespace.
async fn emulator() -> Emulator {
    let emulator = Emulator::start(EmulatorConfig::new(CLUSTER)).await.unwrap();
    let store = emulator.store();
    for n in 0..SELECTED {
        store
            .put_pod(pod(NAMESPACE, &format!("web-{n:05}"), "web", n))
            .unwrap();
    }
    for n in 0..150 {
        store
            .put_pod(pod(NAMESPACE, &format!("db-{n:03}"), "db", n))
            .unwrap();
    }
    for n in 0..40 {
        store
            .put_pod(pod("other", &format!("web-{n:03}"), "web", n))
            .unwrap();
    }
    emulator
}

fn credentials(secret: &str) -> SharedCredentialsProvider {
    SharedCredentialsProvider::new(Credentials::new(
        EXAMPLE_ACCESS_KEY_ID,
        secret,
        None,
        None,
        "integration-test",
    ))
}

/// An EKS client that must not be called when both overrides are given: it points at a
/// closed port, without retries, so a stray DescribeCluster fails at once.
fn eks_client(endpoint: &str) -> aws_sdk_eks::Client {
    let config = aws_sdk_eks::Config::builder()
        .behavior_version(aws_sdk_eks::config::BehaviorVersion::latest())
        .region(aws_sdk_eks::config::Region::new(REGION))
        .credentials_provider(aws_sdk_eks::config::Credentials::new(
            EXAMPLE_ACCESS_KEY_ID,
            EXAMPLE_SECRET_ACCESS_KEY,
            None,
            None,
            "integration-test",
        ))
        .endpoint_url(endpoint)
        .retry_config(aws_sdk_eks::config::retry::RetryConfig::disabled())
        .build();
    aws_sdk_eks::Client::from_conf(config)
}

fn sts() -> Url {
    tgsync::eks::sts_endpoint(REGION, |_| None).unwrap()
}

fn pods_with(emulator: &Emulator, ca_pem: &str, secret: &str) -> KubePods {
    let access = ClusterAccess::new(
        CLUSTER,
        eks_client("http://127.0.0.1:9"),
        credentials(secret),
        REGION,
        sts(),
        Overrides {
            endpoint: Some(Url::parse(emulator.url()).unwrap()),
            ca_pem: Some(ca_pem.as_bytes().to_vec()),
        },
    );
    KubePods::new(Arc::new(access))
}

fn pods(emulator: &Emulator) -> KubePods {
    pods_with(
        emulator,
        emulator.ca_pem().unwrap(),
        EXAMPLE_SECRET_ACCESS_KEY,
    )
}

fn web() -> Selector {
    Selector::parse("app=web").unwrap()
}

fn pod_lists(emulator: &Emulator) -> Vec<RequestRecord> {
    emulator
        .faults()
        .requests()
        .into_iter()
        .filter(|r| r.path() == format!("/api/v1/namespaces/{NAMESPACE}/pods"))
        .collect()
}

fn assert_exactly_the_selected(facts: &[tgsync::core::PodFacts]) {
    assert_eq!(facts.len(), SELECTED);
    let names: BTreeSet<&str> = facts.iter().map(|f| f.pod.name.as_str()).collect();
    let expected: BTreeSet<String> = (0..SELECTED).map(|n| format!("web-{n:05}")).collect();
    assert_eq!(names.len(), SELECTED, "no duplicates");
    assert!(names.iter().all(|n| expected.contains(*n)));
    assert!(
        facts
            .iter()
            .all(|f| f.pod.namespace == NAMESPACE && f.ready && f.ipv4.is_some())
    );
}

fn assert_no_resource_version(emulator: &Emulator) {
    for record in emulator.faults().requests() {
        assert_eq!(record.query_param("resourceVersion"), None, "{record:?}");
        assert_eq!(
            record.query_param("resourceVersionMatch"),
            None,
            "{record:?}"
        );
    }
}

#[tokio::test]
async fn lists_every_selected_pod_in_pages_of_500_over_verified_tls() {
    let emulator = emulator().await;
    let facts = pods(&emulator).list(NAMESPACE, Some(&web())).await.unwrap();
    assert_exactly_the_selected(&facts);

    let lists = pod_lists(&emulator);
    assert_eq!(lists.len(), 3, "{lists:?}");
    for (i, record) in lists.iter().enumerate() {
        assert!(record.authenticated, "token verified: {record:?}");
        assert_eq!(record.status, 200);
        assert_eq!(record.query_param("limit").as_deref(), Some("500"));
        assert_eq!(
            record.query_param("labelSelector").as_deref(),
            Some("app=web")
        );
        assert_eq!(
            record.query_param("continue").is_some(),
            i > 0,
            "{record:?}"
        );
    }
    assert_no_resource_version(&emulator);
}

#[tokio::test]
async fn a_failed_page_is_an_error_never_a_partial_list() {
    let emulator = emulator().await;
    emulator.faults().fail_list_page(2, 500);
    let err = pods(&emulator)
        .list(NAMESPACE, Some(&web()))
        .await
        .unwrap_err();
    let PodsError::List { namespace, reason } = &err else {
        panic!("expected a list error, got {err:?}");
    };
    assert_eq!(namespace, NAMESPACE);
    assert!(reason.contains("HTTP 500"), "{reason}");
    assert_eq!(pod_lists(&emulator).len(), 2, "stopped at the failed page");
}

#[tokio::test]
async fn an_expired_continue_token_restarts_the_list() {
    let emulator = emulator().await;
    emulator.faults().expire_continue_tokens();
    let facts = pods(&emulator).list(NAMESPACE, Some(&web())).await.unwrap();
    assert_exactly_the_selected(&facts);

    let lists = pod_lists(&emulator);
    let statuses: Vec<u16> = lists.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 410, 200, 200, 200], "{lists:?}");
    assert_eq!(
        lists[2].query_param("continue"),
        None,
        "restarted from the top"
    );
    assert_no_resource_version(&emulator);
}

#[tokio::test]
async fn a_continue_token_that_keeps_expiring_is_incomplete() {
    let emulator = emulator().await;
    let store = emulator.store().clone();
    // Keep one revision only and write continuously, as a busy cluster compacting often:
    // every continued page finds its snapshot gone.
    store.set_history_limit(1);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                store.update_pod("other", "web-000", |p| {
                    p.metadata
                        .annotations
                        .get_or_insert_default()
                        .insert("tick".to_owned(), n.to_string());
                });
                n += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let result = pods(&emulator).list(NAMESPACE, Some(&web())).await;
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();

    let err = result.unwrap_err();
    assert!(matches!(err, PodsError::Incomplete { .. }), "{err}");
    let gone = pod_lists(&emulator)
        .iter()
        .filter(|r| r.status == 410)
        .count();
    assert_eq!(gone, 4, "one try and three restarts");
}

#[tokio::test]
async fn a_wrong_secret_is_rejected_with_a_hint_about_the_access_entry() {
    let emulator = emulator().await;
    let pods = pods_with(&emulator, emulator.ca_pem().unwrap(), "not-the-secret");
    let err = pods.list(NAMESPACE, Some(&web())).await.unwrap_err();
    let PodsError::List { reason, .. } = &err else {
        panic!("expected a list error, got {err:?}");
    };
    assert!(reason.contains("401"), "{reason}");
    assert!(reason.contains("EKS access entry"), "{reason}");
    assert!(
        !reason.contains("k8s-aws-v1."),
        "no token in errors: {reason}"
    );
    assert!(
        !reason.contains("not-the-secret"),
        "no secret in errors: {reason}"
    );
    let records = emulator.faults().requests();
    assert!(
        records.iter().all(|r| !r.authenticated && r.status == 401),
        "{records:?}"
    );
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_fails_the_handshake() {
    let emulator = emulator().await;
    let impostor_ca = Emulator::start(EmulatorConfig::new(CLUSTER))
        .await
        .unwrap()
        .ca_pem()
        .unwrap()
        .to_owned();
    let pods = pods_with(&emulator, &impostor_ca, EXAMPLE_SECRET_ACCESS_KEY);
    let err = pods.list(NAMESPACE, Some(&web())).await.unwrap_err();
    let PodsError::List { reason, .. } = &err else {
        panic!("expected a list error, got {err:?}");
    };
    assert!(reason.to_lowercase().contains("certificate"), "{reason}");
    assert!(
        emulator.faults().requests().is_empty(),
        "no request got through"
    );
}

#[tokio::test]
async fn get_returns_the_pod_or_none() {
    let emulator = emulator().await;
    let pods = pods(&emulator);
    let found = pods.get(NAMESPACE, "web-00007").await.unwrap().unwrap();
    assert_eq!(found.metadata.name.as_deref(), Some("web-00007"));
    assert!(pods.get(NAMESPACE, "no-such-pod").await.unwrap().is_none());
    assert!(emulator.faults().requests().iter().all(|r| r.authenticated));
}

/// Answers `GET /clusters/{name}` like eks:DescribeCluster, with the emulator's endpoint
/// and CA, and counts the calls.
async fn fake_eks(
    endpoint: String,
    ca_pem: String,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use base64::Engine as _;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let body = json!({ "cluster": {
        "name": CLUSTER, "status": "ACTIVE", "endpoint": endpoint,
        "certificateAuthority": { "data": base64::engine::general_purpose::STANDARD.encode(ca_pem) },
    }})
    .to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let ok = head.starts_with(format!("GET /clusters/{CLUSTER} ").as_bytes());
            counter.fetch_add(1, Ordering::SeqCst);
            let (status, body) = if ok {
                (200, body.as_str())
            } else {
                (404, "{}")
            };
            let response = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    });
    (url, calls)
}

#[tokio::test]
async fn without_overrides_the_endpoint_and_ca_come_from_describe_cluster_once() {
    let emulator = emulator().await;
    let (eks, calls) = fake_eks(
        emulator.url().to_owned(),
        emulator.ca_pem().unwrap().to_owned(),
    )
    .await;
    let access = ClusterAccess::new(
        CLUSTER,
        eks_client(&eks),
        credentials(EXAMPLE_SECRET_ACCESS_KEY),
        REGION,
        sts(),
        Overrides::default(),
    );
    let pods = KubePods::new(Arc::new(access));
    let facts = pods.list(NAMESPACE, Some(&web())).await.unwrap();
    assert_exactly_the_selected(&facts);
    assert!(pods.get(NAMESPACE, "web-00001").await.unwrap().is_some());
    assert_eq!(calls.load(Ordering::SeqCst), 1, "DescribeCluster is cached");
}
