use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, ExecAction, HTTPGetAction, Lifecycle, LifecycleHandler, Pod,
    PodCondition, PodIP, PodReadinessGate, PodSpec, PodStatus, SleepAction,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::ObjectList;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::core::pod::{EXCLUDE_ANNOTATION, READINESS_GATE};
use crate::testkit::PodBuilder;

/// Every pod fixture, read from the directory so a new one is covered too.
fn fixtures() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pods");
    let mut all: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    all.sort();
    assert!(all.len() >= 12, "fixtures in {}", dir.display());
    all
}

/// A PodList page body around `items` (JSON texts of pods).
fn page_of(items: &[&str], metadata: Value) -> String {
    format!(
        r#"{{"kind":"PodList","apiVersion":"v1","metadata":{metadata},"items":[{}]}}"#,
        items.join(",")
    )
}

/// What the old path gives: kube's `ObjectList<Pod>` from the text, then `take_from`.
fn via_kube(body: &str) -> Result<Vec<PodFacts>, serde_json::Error> {
    let mut list: ObjectList<Pod> = serde_json::from_str(body)?;
    Ok(list.items.iter_mut().map(PodFacts::take_from).collect())
}

/// Asserts both paths read the pod the same, as a LIST item and as a watch event.
fn assert_agree(pod_json: &str) {
    let expected = PodFacts::from_pod(serde_json::from_str(pod_json).unwrap());
    let body = page_of(&[pod_json], json!({ "resourceVersion": "9" }));
    let page = decode_pod_list(1, body.as_bytes()).unwrap();
    assert_eq!(page.pods, std::slice::from_ref(&expected), "{pod_json}");
    assert_eq!(page.pods, via_kube(&body).unwrap(), "{pod_json}");
    let line = format!(r#"{{"type":"MODIFIED","object":{pod_json}}}"#);
    match decode_watch_event(line.as_bytes()).unwrap() {
        WatchEvent::Modified(watched) => assert_eq!(watched.facts, expected, "{pod_json}"),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
}

#[test]
fn every_fixture_decodes_as_take_from_reads_it() {
    for (name, json) in fixtures() {
        let expected = PodFacts::from_pod(serde_json::from_str(&json).unwrap());
        let body = page_of(&[&json], json!({}));
        let page = decode_pod_list(1, body.as_bytes()).unwrap();
        assert_eq!(page.pods, [expected], "fixture {name}");
        assert_agree(&json);
    }
}

#[test]
fn a_page_of_every_fixture_keeps_order_and_list_metadata() {
    let all = fixtures();
    let texts: Vec<&str> = all.iter().map(|(_, j)| j.as_str()).collect();
    let body = page_of(
        &texts,
        json!({ "resourceVersion": "48213", "continue": "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ", "remainingItemCount": 1234 }),
    );
    let page = decode_pod_list(3, body.as_bytes()).unwrap();
    assert_eq!(page.pods, via_kube(&body).unwrap());
    assert_eq!(page.pods.len(), texts.len());
    assert_eq!(page.resource_version.as_deref(), Some("48213"));
    assert_eq!(
        page.continue_token.as_deref(),
        Some("eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ")
    );
    assert_eq!(page.remaining_item_count, Some(1234));
}

#[test]
fn realistic_pods_decode_as_take_from_reads_them() {
    for i in 0..20 {
        let mut b = PodBuilder::new("shop", &format!("web-{i}"))
            .label("app", "web")
            .ip(&format!("10.0.3.{i}"))
            .ready(i % 3 != 0);
        if i % 4 == 0 {
            b = b.gated();
        }
        let mut b = b
            .realistic()
            .node(&format!("ip-10-0-3-{}.ec2.internal", i % 3));
        if i % 5 == 0 {
            b = b.annotation("tgsync/quic-server-id", &format!("0x{:016x}", 0xabc0 + i));
        }
        let json = serde_json::to_string(&b.build()).unwrap();
        assert!(json.len() > 3_000, "{} bytes", json.len());
        assert_agree(&json);
    }
}

#[test]
fn list_metadata_is_optional_but_items_are_not() {
    let page = decode_pod_list(1, br#"{"items":[]}"#).unwrap();
    assert_eq!(page, PodListPage::default());
    // `items: null` is an empty page, as kube reads it.
    let page = decode_pod_list(1, br#"{"metadata":{"continue":""},"items":null}"#).unwrap();
    assert!(page.pods.is_empty());
    assert_eq!(page.continue_token.as_deref(), Some(""));
    // No `items` at all is not a PodList: never an empty list that deregisters all.
    for body in [
        &br#"{"metadata":{"resourceVersion":"1"}}"#[..],
        br#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":500}"#,
        b"{}",
    ] {
        let err = decode_pod_list(2, body).unwrap_err();
        assert!(err.to_string().contains("missing field `items`"), "{err}");
        assert!(err.to_string().starts_with("page 2 "), "{err}");
    }
}

#[test]
fn duplicates_nulls_escapes_and_odd_order_read_as_k8s_openapi_reads_them() {
    let pods = [
        // Nulls wherever k8s-openapi allows them.
        json!({ "metadata": null, "spec": null, "status": null }),
        json!({
            "metadata": { "name": null, "labels": null, "annotations": null, "deletionTimestamp": null },
            "spec": { "containers": null, "initContainers": null, "readinessGates": null, "hostNetwork": null },
            "status": { "phase": null, "conditions": null, "podIPs": null, "podIP": null }
        }),
        json!({
            "spec": { "containers": [{ "name": "c", "ports": null },
                                     { "name": "d", "ports": [{ "name": null, "containerPort": 80 },
                                                              { "name": "p", "containerPort": null },
                                                              { "name": "big", "containerPort": 70000 },
                                                              { "name": "neg", "containerPort": -1 },
                                                              { "name": "", "containerPort": 443 }] }] },
            "status": { "conditions": [{ "type": null, "status": null }, { "type": "Ready" }],
                        "podIPs": [{ "ip": null }, { "ip": "junk" }, { "ip": "fd00::1" }, { "ip": "10.1.1.1" }, { "ip": "10.2.2.2" }],
                        "podIP": "10.9.9.9" }
        }),
        // Addresses ELBv2 never takes, beside a usable one: both decoders skip them
        // alike and keep the first for the report.
        json!({
            "status": { "podIPs": [{ "ip": "169.254.3.3" }, { "ip": "::ffff:10.0.0.1" }, { "ip": "127.0.0.1" }, { "ip": "10.3.3.3" }] }
        }),
        // Status before metadata, sidecars after containers, an IPv6-only pod.
        json!({
            "status": { "podIP": "2600:1f18::7", "phase": "Running",
                        "conditions": [{ "status": "True", "type": "tgsync/target-health" }] },
            "spec": {
                "containers": [{ "name": "app", "ports": [{ "containerPort": 8080, "name": "http" }] }],
                "initContainers": [
                    { "name": "init", "ports": [{ "name": "setup", "containerPort": 1 }], "restartPolicy": "OnFailure" },
                    { "restartPolicy": "Always", "name": "mesh", "ports": [{ "name": "mesh", "containerPort": 15001 }] },
                    { "name": "late", "ports": [{ "name": "late", "containerPort": 3 }], "restartPolicy": "always" }
                ],
                "readinessGates": [{ "conditionType": "other" }, { "conditionType": "tgsync/target-health" }]
            },
            "metadata": { "deletionTimestamp": "2026-01-01T00:00:00Z", "uid": "u", "namespace": "n" },
            "apiVersion": "v1", "kind": "Pod"
        }),
    ];
    for pod in pods {
        assert_agree(&pod.to_string());
    }
    // Repeated keys (which `json!` would merge): the last one wins, lists are
    // replaced whole.
    let repeated = r#"{
        "metadata": { "name": "a", "name": "b", "labels": { "x": "1", "a": "0", "x": "2" },
                      "annotations": { "tgsync/exclude": "true", "tgsync/exclude": "no" },
                      "deletionTimestamp": "2026-01-01T00:00:00Z", "deletionTimestamp": null },
        "metadata": { "name": "c", "labels": { "x": "1", "a": "0", "x": "2" },
                      "annotations": { "tgsync/exclude": "no", "tgsync/exclude": "true" } },
        "spec": {
            "containers": [{ "name": "gone", "ports": [{ "name": "gone", "containerPort": 9 }] }],
            "initContainers": [{ "name": "gone", "restartPolicy": "Always", "ports": [{ "name": "gone", "containerPort": 9 }] }],
            "containers": [{ "name": "c", "ports": [{ "name": "old", "containerPort": 1 }],
                             "ports": [{ "name": "new", "containerPort": 2, "containerPort": 3, "name": "newer" }] },
                           { "name": "d", "ports": [{ "name": "d", "containerPort": 4 }] }],
            "initContainers": [{ "name": "s", "restartPolicy": "Always", "restartPolicy": "Never",
                                 "ports": [{ "name": "s", "containerPort": 5 }] },
                               { "name": "t", "restartPolicy": "Never", "restartPolicy": "Always",
                                 "ports": [{ "name": "t", "containerPort": 6 }], "ports": [{ "name": "t2", "containerPort": 7 }] }],
            "hostNetwork": true, "hostNetwork": null,
            "readinessGates": [{ "conditionType": "tgsync/target-health" }], "readinessGates": [],
            "readinessGates": [{ "conditionType": "tgsync/target-health", "conditionType": "x" }]
        },
        "spec": {
            "initContainers": [{ "name": "gone", "restartPolicy": "Always", "ports": [{ "name": "gone", "containerPort": 9 }] }],
            "containers": [{ "name": "gone", "ports": [{ "name": "gone", "containerPort": 9 }] }],
            "containers": [{ "name": "c", "ports": [{ "name": "old", "containerPort": 1 }],
                             "ports": [{ "name": "new", "containerPort": 2, "containerPort": 3, "name": "newer" }] }],
            "initContainers": [{ "name": "t", "restartPolicy": "Never", "restartPolicy": "Always",
                                 "ports": [{ "name": "t", "containerPort": 6 }], "ports": [{ "name": "t2", "containerPort": 7 }] },
                               { "name": "u", "ports": [{ "name": "u", "containerPort": 8 }], "restartPolicy": "Always", "restartPolicy": null }],
            "hostNetwork": false, "hostNetwork": true,
            "readinessGates": [], "readinessGates": [{ "conditionType": "x", "conditionType": "tgsync/target-health" }]
        },
        "status": {
            "podIPs": [{ "ip": "10.0.0.1" }], "podIPs": [], "podIP": "10.0.0.2", "podIP": "10.0.0.3",
            "conditions": [{ "type": "Ready", "status": "True" }],
            "conditions": [{ "type": "ContainersReady", "status": "True" },
                           { "type": "ContainersReady", "status": "False", "status": "True" },
                           { "type": "Ready", "type": "tgsync/target-health", "status": "True" }],
            "phase": "Running", "phase": null, "phase": "Pending"
        }
    }"#;
    assert_agree(repeated);
    let body = page_of(&[repeated], json!({}));
    let facts = &decode_pod_list(1, body.as_bytes()).unwrap().pods[0];
    assert_eq!(facts.pod.name, "c");
    assert!(facts.excluded && !facts.terminating && facts.host_network);
    assert_eq!(facts.labels.get("x"), Some("2"));
    assert_eq!(
        facts.named_ports,
        [("newer".to_owned(), 3), ("t2".to_owned(), 7)]
    );
    assert_eq!(facts.ipv4, Some(std::net::Ipv4Addr::new(10, 0, 0, 3)));
    assert_eq!(
        (facts.ready, facts.containers_ready, facts.gate),
        (false, true, Some(true))
    );
    assert_eq!(facts.phase, "Pending");
    // Escapes in keys and values decode to the same text.
    assert_agree(
        r#"{"metadata":{"n\u0061me":"w\u00e9b \"1\"","labels":{"\u0061pp":"w\/eb"},
            "annotations":{"tgsync\/exclude":" TRU\u0045 "}},
           "spec":{"containers":[{"ports":[{"name":"ht\u0074p","containerPort":80}]}]},
           "status":{"conditions":[{"type":"Re\u0061dy","status":"Tru\u0065"}],
                     "podIPs":[{"ip":"10.0.0.\u0031"}]}}"#,
    );
    let odd = decode_pod_list(
        1,
        page_of(
            &[
                &json!({ "metadata": { "annotations": { "tgsync/exclude": " TRUE " } } })
                    .to_string(),
            ],
            json!({}),
        )
        .as_bytes(),
    )
    .unwrap();
    assert!(odd.pods[0].excluded);
}

#[test]
fn wrong_api_version_or_kind_is_an_error_as_in_k8s_openapi() {
    for pod in [
        json!({ "apiVersion": "v2", "metadata": { "name": "a" } }),
        json!({ "kind": "Service" }),
        json!({ "kind": null }),
    ] {
        let body = page_of(&[&pod.to_string()], json!({}));
        assert!(via_kube(&body).is_err(), "{pod}");
        assert!(decode_pod_list(1, body.as_bytes()).is_err(), "{pod}");
    }
}

#[test]
fn malformed_pages_are_errors_with_page_line_and_column() {
    let good = page_of(
        &[&serde_json::to_string(&PodBuilder::new("shop", "a").ip("10.0.0.1").build()).unwrap()],
        json!({ "resourceVersion": "5" }),
    );
    assert!(decode_pod_list(1, good.as_bytes()).is_ok());
    // Truncated anywhere.
    for end in 0..good.len() {
        let err = decode_pod_list(7, &good.as_bytes()[..end]).unwrap_err();
        assert!(
            matches!(err, DecodeError::ListPage { page: 7, .. }),
            "{err}"
        );
    }
    let bad: &[(&str, &str)] = &[
        (
            r#"{"items":{}}"#,
            "invalid type: map, expected a list of pods",
        ),
        (
            r#"{"items":[1]}"#,
            "invalid type: integer `1`, expected a Pod",
        ),
        (r#"{"items":[null]}"#, "invalid type: null, expected a Pod"),
        (r#"{"items":[],"items":[]}"#, "duplicate field `items`"),
        (
            r#"{"metadata":null,"items":[]}"#,
            "invalid type: null, expected ListMeta",
        ),
        (
            r#"{"metadata":{"continue":5},"items":[]}"#,
            "invalid type: integer `5`",
        ),
        (
            r#"{"metadata":{"remainingItemCount":1e30},"items":[]}"#,
            "invalid type: floating point",
        ),
        (
            r#"{"metadata":{"remainingItemCount":99999999999999999999},"items":[]}"#,
            "expected i64",
        ),
        (
            r#"{"items":[{"spec":{"containers":[{"ports":[{"containerPort":"80"}]}]}}]}"#,
            "expected i32",
        ),
        (
            r#"{"items":[{"spec":{"containers":[{"ports":[{"containerPort":4294967296}]}]}}]}"#,
            "expected i32",
        ),
        (
            r#"{"items":[{"spec":{"containers":[{"ports":[{"containerPort":1e999}]}]}}]}"#,
            "number out of range",
        ),
        (
            r#"{"items":[{"spec":{"hostNetwork":"yes"}}]}"#,
            "expected a boolean",
        ),
        (
            r#"{"items":[{"metadata":{"labels":{"app":7}}}]}"#,
            "invalid type: integer `7`",
        ),
        (
            r#"{"items":[{"metadata":{"labels":["app"]}}]}"#,
            "expected a map of labels",
        ),
        (
            r#"{"items":[{"metadata":{"name":"\ud800"}}]}"#,
            "unexpected end of hex escape",
        ),
        (
            r#"{"items":[{"metadata":{"name":"\uZZZZ"}}]}"#,
            "invalid escape",
        ),
        (
            r#"{"items":[{"status":{"podIPs":[{"ip":"\udc00x"}]}}]}"#,
            "surrogate in hex escape",
        ),
        (
            r#"{"items":[{"status":{"phase":"\ud83d\u0041"}}]}"#,
            "surrogate in hex escape",
        ),
        (r#"{"items":[]} trailing"#, "trailing characters"),
        ("", "EOF while parsing"),
        ("null", "invalid type: null, expected a PodList"),
    ];
    for (body, want) in bad {
        let err = decode_pod_list(4, body.as_bytes()).unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("page 4 of the pod list"), "{text}");
        assert!(text.contains(want), "{body}: {text}");
        assert!(text.contains("line 1 column"), "{text}");
        assert_eq!(err.line(), Some(1), "{text}");
        assert!(err.column().is_some(), "{text}");
    }
    // Multi-line bodies report the line.
    let err = decode_pod_list(1, b"{\n\"items\": [\n  {\"spec\": 5}\n]}").unwrap_err();
    assert_eq!((err.line(), err.column()), (Some(3), Some(12)), "{err}");
    // Not UTF-8: rejected as a whole, like the String kube made of the body.
    let err = decode_pod_list(2, b"{\"items\":[{\"metadata\":{\"name\":\"\xff\"}}]}").unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::ListPageUtf8 {
                page: 2,
                offset: 31
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.line(), None);
}

#[test]
fn deep_nesting_is_an_error_or_skipped_never_a_stack_overflow() {
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    // In a field tgsync skips: serde_json skips it without recursing.
    let body = format!(
        r#"{{"items":[{{"metadata":{{"managedFields":{}}}}}]}}"#,
        deep(100_000)
    );
    assert_eq!(decode_pod_list(1, body.as_bytes()).unwrap().pods.len(), 1);
    // Where a value is read: the recursion limit answers.
    let body = format!(
        r#"{{"items":[{{"spec":{{"containers":[{{"ports":{}}}]}}}}]}}"#,
        deep(100_000)
    );
    assert!(decode_pod_list(1, body.as_bytes()).is_err());
    let body = format!(r#"{{"items":{}}}"#, deep(100_000));
    assert!(decode_pod_list(1, body.as_bytes()).is_err());
}

#[test]
fn native_sidecar_named_ports_resolve_after_the_app_containers() {
    let pod = json!({
        "metadata": { "name": "meshed", "namespace": "shop" },
        "spec": {
            "initContainers": [
                { "name": "migrate", "ports": [{ "name": "migrate", "containerPort": 7000 }] },
                { "name": "proxy", "restartPolicy": "Always",
                  "ports": [{ "name": "proxy", "containerPort": 15001 }, { "name": "http", "containerPort": 15080 }] }
            ],
            "containers": [{ "name": "app", "ports": [{ "name": "http", "containerPort": 8080 }] }]
        }
    });
    let body = page_of(&[&pod.to_string()], json!({}));
    let facts = &decode_pod_list(1, body.as_bytes()).unwrap().pods[0];
    assert_eq!(
        facts.named_ports,
        [
            ("http".to_owned(), 8080),
            ("proxy".to_owned(), 15001),
            ("http".to_owned(), 15080)
        ]
    );
    assert_eq!(facts.named_port("http"), Some(8080));
    assert_eq!(facts.named_port("proxy"), Some(15001));
    assert_eq!(facts.named_port("migrate"), None);
    assert_agree(&pod.to_string());
}

/// The rollout check's two numbers, from the pod JSON as the API server sends it: the
/// grace period (30 s when absent), and the app containers' longest readable `preStop`
/// sleep; sidecars' and init containers' hooks are not read. Both decoders agree on
/// every case, nulls and repeated keys included.
#[test]
fn termination_reads_the_grace_period_and_the_longest_readable_sleep() {
    use crate::core::termination::{PreStop, Termination};
    let hook = |h: Value| json!({ "name": "c", "lifecycle": { "preStop": h } });
    let cases = [
        (
            json!({ "containers": [{ "name": "app" }] }),
            30,
            PreStop::None,
        ),
        (
            json!({ "terminationGracePeriodSeconds": 220,
                    "containers": [hook(json!({ "sleep": { "seconds": 190 } }))] }),
            220,
            PreStop::Sleep(190),
        ),
        (
            json!({ "terminationGracePeriodSeconds": null,
                    "containers": [hook(json!({ "exec": { "command": ["sleep", "190"] } }))] }),
            30,
            PreStop::Sleep(190),
        ),
        (
            json!({ "containers": [hook(json!({ "exec": { "command": ["/bin/sh", "-c", "sleep 70"] } }))] }),
            30,
            PreStop::Sleep(70),
        ),
        (
            json!({ "containers": [hook(json!({ "exec": { "command": ["sh", "-c", "sleep 5 && nginx -s quit"] } }))] }),
            30,
            PreStop::Unknown,
        ),
        (
            json!({ "containers": [hook(json!({ "httpGet": { "path": "/drain", "port": 8080 } }))] }),
            30,
            PreStop::Unknown,
        ),
        (
            json!({ "containers": [hook(json!({ "exec": {} }))] }),
            30,
            PreStop::Unknown,
        ),
        // `sleep: {}`: a missing required field is its default, as k8s-openapi reads it.
        (
            json!({ "containers": [hook(json!({ "sleep": {} }))] }),
            30,
            PreStop::Sleep(0),
        ),
        (
            json!({ "containers": [{ "name": "c", "lifecycle": null }, { "name": "d", "lifecycle": { "preStop": null } }] }),
            30,
            PreStop::None,
        ),
        // Several app containers: the longest readable sleep; an unreadable hook does
        // not hide it.
        (
            json!({ "terminationGracePeriodSeconds": 100,
                    "containers": [hook(json!({ "sleep": { "seconds": 20 } })),
                                   hook(json!({ "httpGet": { "port": 80 } })),
                                   hook(json!({ "exec": { "command": ["sleep", "70s"] } }))] }),
            100,
            PreStop::Sleep(70),
        ),
        // A native sidecar's or an init container's hook is not the app's.
        (
            json!({ "initContainers": [
                        { "name": "mesh", "restartPolicy": "Always", "lifecycle": { "preStop": { "sleep": { "seconds": 300 } } } },
                        { "name": "init", "lifecycle": { "preStop": { "sleep": { "seconds": 400 } } } }],
                    "containers": [{ "name": "app" }] }),
            30,
            PreStop::None,
        ),
    ];
    for (spec, grace, pre_stop) in cases {
        let pod = json!({ "metadata": { "name": "p", "namespace": "shop" }, "spec": spec });
        let body = page_of(&[&pod.to_string()], json!({}));
        let facts = &decode_pod_list(1, body.as_bytes()).unwrap().pods[0];
        assert_eq!(
            facts.termination,
            Termination {
                grace_seconds: grace,
                pre_stop
            },
            "{pod}"
        );
        assert_agree(&pod.to_string());
    }
    // Repeated keys: the last one wins, a repeated `containers` replaces the list.
    let repeated = r#"{ "metadata": { "name": "p" }, "spec": {
        "terminationGracePeriodSeconds": 10, "terminationGracePeriodSeconds": 220,
        "containers": [{ "name": "gone", "lifecycle": { "preStop": { "sleep": { "seconds": 999 } } } }],
        "containers": [{ "name": "app",
            "lifecycle": { "preStop": { "sleep": { "seconds": 5 } } },
            "lifecycle": { "preStop": { "exec": { "command": ["sleep", "1"] } },
                           "preStop": { "sleep": { "seconds": 1, "seconds": 190 } } } }]
    } }"#;
    let body = page_of(&[repeated], json!({}));
    assert_eq!(
        decode_pod_list(1, body.as_bytes()).unwrap().pods[0].termination,
        Termination {
            grace_seconds: 220,
            pre_stop: PreStop::Sleep(190)
        }
    );
    assert_eq!(
        decode_pod_list(1, body.as_bytes()).unwrap().pods,
        via_kube(&body).unwrap()
    );
}

#[test]
fn watch_events_of_every_type() {
    let pod = serde_json::to_value(
        PodBuilder::new("shop", "web-1")
            .label("app", "web")
            .ip("10.0.0.7")
            .build(),
    )
    .unwrap();
    let mut with_version = pod.clone();
    with_version["metadata"]["resourceVersion"] = json!("4711");
    let expected = PodFacts::from_pod(serde_json::from_value(pod.clone()).unwrap());
    for (ty, object) in [
        ("ADDED", &with_version),
        ("MODIFIED", &with_version),
        ("DELETED", &pod),
    ] {
        let line = json!({ "type": ty, "object": object }).to_string();
        let event = decode_watch_event(line.as_bytes()).unwrap();
        let (WatchEvent::Added(watched)
        | WatchEvent::Modified(watched)
        | WatchEvent::Deleted(watched)) = &event
        else {
            panic!("{ty}: {event:?}");
        };
        assert_eq!(watched.facts, expected, "{ty}");
        let version = object["metadata"]["resourceVersion"].as_str();
        assert_eq!(watched.resource_version.as_deref(), version, "{ty}");
        let kind_matches = matches!(
            (ty, &event),
            ("ADDED", WatchEvent::Added(_))
                | ("MODIFIED", WatchEvent::Modified(_))
                | ("DELETED", WatchEvent::Deleted(_))
        );
        assert!(kind_matches, "{ty}: {event:?}");
        // The same line as kube reads it.
        let kube_event: kube::core::WatchEvent<Pod> = serde_json::from_str(&line).unwrap();
        let (kube::core::WatchEvent::Added(p)
        | kube::core::WatchEvent::Modified(p)
        | kube::core::WatchEvent::Deleted(p)) = kube_event
        else {
            panic!("kube read {ty} differently");
        };
        assert_eq!(PodFacts::from_pod(p), expected);
    }

    let bookmark = br#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"12345","annotations":{"k8s.io/initial-events-end":"true"},"creationTimestamp":null},"spec":{"containers":null},"status":{}}}"#;
    assert_eq!(
        decode_watch_event(bookmark).unwrap(),
        WatchEvent::Bookmark {
            resource_version: "12345".into()
        }
    );
    let error = br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (4711)","reason":"Expired","code":410}}"#;
    assert_eq!(
        decode_watch_event(error).unwrap(),
        WatchEvent::Error(WatchStatus {
            code: 410,
            reason: "Expired".into(),
            message: "too old resource version: 1 (4711)".into(),
        })
    );
    assert_eq!(
        decode_watch_event(br#"{"type":"ERROR","object":{}}"#).unwrap(),
        WatchEvent::Error(WatchStatus::default())
    );
    // `object` before `type` (not what the API server sends, but valid JSON).
    let line = format!(r#"{{"object":{with_version},"type":"ADDED"}}"#);
    let WatchEvent::Added(watched) = decode_watch_event(line.as_bytes()).unwrap() else {
        panic!("not ADDED");
    };
    assert_eq!(watched.facts, expected);
    assert_eq!(watched.resource_version.as_deref(), Some("4711"));
    let line = r#"{"object":{"metadata":{"resourceVersion":"77"}},"type":"BOOKMARK"}"#;
    assert_eq!(
        decode_watch_event(line.as_bytes()).unwrap(),
        WatchEvent::Bookmark {
            resource_version: "77".into()
        }
    );
    // A trailing newline, as the stream delimits events.
    let line = format!("{}\n", json!({ "type": "ADDED", "object": pod }));
    assert!(matches!(
        decode_watch_event(line.as_bytes()),
        Ok(WatchEvent::Added(_))
    ));
}

#[test]
fn malformed_watch_events_are_errors() {
    let bad: &[(&[u8], &str)] = &[
        (
            br#"{"type":"RENAMED","object":{}}"#,
            "unknown variant `RENAMED`",
        ),
        (br#"{"type":"ADDED"}"#, "missing field `object`"),
        (br#"{"object":{}}"#, "missing field `type`"),
        (
            br#"{"type":"ADDED","type":"ADDED","object":{}}"#,
            "duplicate field `type`",
        ),
        (
            br#"{"type":"BOOKMARK","object":{"metadata":{}}}"#,
            "missing field `resourceVersion`",
        ),
        (
            br#"{"type":"ERROR","object":{"code":70000}}"#,
            "expected u16",
        ),
        (
            br#"{"type":"ADDED","object":{"kind":"Node"}}"#,
            "invalid value: string \"Node\", expected Pod",
        ),
        (
            br#"{"object":{"kind":"Node"},"type":"ADDED"}"#,
            "expected Pod",
        ),
        (
            br#"{"type":"ADDED","object":{"metadata":{"name":"\ud800"}}}"#,
            "unexpected end of hex escape",
        ),
        (br#"{"type":"ADDED","object":{"#, "EOF while parsing"),
        (b"[]", "expected a watch event"),
    ];
    for (line, want) in bad {
        let err = decode_watch_event(line).unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("pod watch event is not"), "{text}");
        assert!(
            text.contains(want),
            "{}: {text}",
            String::from_utf8_lossy(line)
        );
        assert!(err.line().is_some(), "{text}");
    }
    let err = decode_watch_event(b"{\"type\":\"ADDED\xc3\"}").unwrap_err();
    assert!(
        matches!(err, DecodeError::WatchEventUtf8 { offset: 14 }),
        "{err:?}"
    );
}

// -----------------------------------------------------------------------------------
// Generated pods.

/// Cases per property; `PROPTEST_CASES` overrides it for longer runs.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

/// Short text, sometimes with characters JSON must escape.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z0-9-]{0,10}",
        1 => "[a-z\"\\\\/ \t\u{e9}\u{2028}\u{1F600}]{0,8}",
    ]
}

fn one_of(values: &'static [&'static str]) -> impl Strategy<Value = String> {
    proptest::sample::select(values).prop_map(str::to_owned)
}

fn ip() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any::<[u8; 4]>().prop_map(|o| std::net::Ipv4Addr::from(o).to_string()),
        2 => any::<[u16; 8]>().prop_map(|s| std::net::Ipv6Addr::from(s).to_string()),
        1 => one_of(&["", "junk", "10.0.0.256", "::ffff:10.0.0.1", " 10.0.0.1", "fe80::1%eth0"]),
    ]
}

fn ports() -> impl Strategy<Value = Option<Vec<ContainerPort>>> {
    proptest::option::of(proptest::collection::vec(
        (
            proptest::option::of(prop_oneof![
                one_of(&["http", "metrics", "proxy", ""]),
                text()
            ]),
            prop_oneof![0..70_000i32, any::<i32>()],
        )
            .prop_map(|(name, container_port)| ContainerPort {
                name,
                container_port,
                protocol: Some("TCP".into()),
                ..Default::default()
            }),
        0..4,
    ))
}

/// A container's `lifecycle`: no `preStop`, a native sleep, an `exec` (a readable sleep
/// or not), an `httpGet`, or nothing set.
fn lifecycle() -> impl Strategy<Value = Option<Lifecycle>> {
    let command = prop_oneof![
        one_of(&["sleep", "/bin/sleep", "sleep s", "sleep 1.5"]).prop_flat_map(|p| {
            (0..400u32).prop_map(move |n| {
                p.split(' ')
                    .map(str::to_owned)
                    .chain([n.to_string()])
                    .collect::<Vec<_>>()
            })
        }),
        (0..400u32).prop_map(|n| vec!["sh".to_owned(), "-c".to_owned(), format!("sleep {n}")]),
        proptest::collection::vec(text(), 0..4),
    ];
    let hook = prop_oneof![
        prop_oneof![-5..400i64, any::<i64>()].prop_map(|seconds| LifecycleHandler {
            sleep: Some(SleepAction { seconds }),
            ..Default::default()
        }),
        proptest::option::of(command).prop_map(|command| LifecycleHandler {
            exec: Some(ExecAction { command }),
            ..Default::default()
        }),
        Just(LifecycleHandler {
            http_get: Some(HTTPGetAction {
                path: Some("/drain".into()),
                port: IntOrString::Int(8080),
                ..Default::default()
            }),
            ..Default::default()
        }),
        Just(LifecycleHandler::default()),
    ];
    proptest::option::of(proptest::option::of(hook).prop_map(|pre_stop| Lifecycle {
        pre_stop,
        ..Default::default()
    }))
}

fn containers(max: usize) -> impl Strategy<Value = Vec<Container>> {
    proptest::collection::vec(
        (
            text(),
            ports(),
            proptest::option::of(one_of(&["Always", "OnFailure", "Never", "always"])),
            lifecycle(),
        )
            .prop_map(|(name, ports, restart_policy, lifecycle)| Container {
                name,
                ports,
                restart_policy,
                lifecycle,
                image: Some("registry.example/app:1".into()),
                ..Default::default()
            }),
        0..max,
    )
}

fn map() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    proptest::option::of(proptest::collection::btree_map(text(), text(), 0..5))
}

fn pod() -> impl Strategy<Value = Pod> {
    let meta = (
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::option::of(text()),
        map(),
        map(),
        proptest::option::of(one_of(&["true", " TRUE ", "True", "false", "yes", ""])),
        any::<bool>(),
        proptest::option::of("[0-9]{1,8}"),
    )
        .prop_map(
            |(name, namespace, uid, labels, mut annotations, exclude, terminating, version)| {
                if let Some(v) = exclude {
                    annotations
                        .get_or_insert_with(BTreeMap::new)
                        .insert(EXCLUDE_ANNOTATION.to_owned(), v);
                }
                ObjectMeta {
                    name,
                    namespace,
                    uid,
                    labels,
                    annotations,
                    deletion_timestamp: terminating
                        .then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                    resource_version: version,
                    ..Default::default()
                }
            },
        );
    let spec = proptest::option::of(
        (
            containers(4),
            proptest::option::of(containers(3)),
            proptest::option::of(proptest::collection::vec(
                one_of(&[READINESS_GATE, "example.com/other"]),
                0..3,
            )),
            proptest::option::of(any::<bool>()),
            proptest::option::of(prop_oneof![-5..400i64, any::<i64>()]),
        )
            .prop_map(
                |(containers, init_containers, gates, host_network, grace)| PodSpec {
                    containers,
                    init_containers,
                    readiness_gates: gates.map(|g| {
                        g.into_iter()
                            .map(|condition_type| PodReadinessGate { condition_type })
                            .collect()
                    }),
                    host_network,
                    termination_grace_period_seconds: grace,
                    ..Default::default()
                },
            ),
    );
    let condition = (
        one_of(&[
            "Ready",
            "ContainersReady",
            READINESS_GATE,
            "PodScheduled",
            "ready",
        ]),
        one_of(&["True", "False", "Unknown", "true"]),
    )
        .prop_map(|(type_, status)| PodCondition {
            type_,
            status,
            ..Default::default()
        });
    let status = proptest::option::of(
        (
            proptest::option::of(one_of(&["Running", "Pending", "Succeeded", "Failed", ""])),
            proptest::option::of(proptest::collection::vec(condition, 0..6)),
            proptest::option::of(ip()),
            proptest::option::of(proptest::collection::vec(ip(), 0..4)),
        )
            .prop_map(|(phase, conditions, pod_ip, pod_ips)| PodStatus {
                phase,
                conditions,
                pod_ip,
                pod_ips: pod_ips.map(|l| l.into_iter().map(|ip| PodIP { ip }).collect()),
                ..Default::default()
            }),
    );
    (meta, spec, status).prop_map(|(metadata, spec, status)| Pod {
        metadata,
        spec,
        status,
    })
}

/// Replaces `count` bytes of `text` with JSON-ish bytes at positions from `rng`.
fn mutate(text: &str, seed: u64, count: usize) -> Vec<u8> {
    const ALPHABET: &[u8] = b"{}[]\",:0123456789eE.-+ntrufalse\\/u \n";
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut bytes = text.as_bytes().to_vec();
    for _ in 0..count {
        if bytes.is_empty() {
            break;
        }
        let at = rng.usize(..bytes.len());
        match rng.u8(0..3) {
            0 => bytes[at] = ALPHABET[rng.usize(..ALPHABET.len())],
            1 => {
                bytes.remove(at);
            }
            _ => bytes.insert(at, ALPHABET[rng.usize(..ALPHABET.len())]),
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Generated pods: the lean decoder and k8s-openapi + `take_from` agree, in a
    /// LIST page and in a watch event.
    #[test]
    fn generated_pods_decode_as_take_from_reads_them(
        pods in proptest::collection::vec(pod(), 0..5),
        version in proptest::option::of("[0-9]{1,9}"),
        token in proptest::option::of("[A-Za-z0-9=]{0,16}"),
        remaining in proptest::option::of(any::<i64>()),
    ) {
        let texts: Vec<String> = pods.iter().map(|p| serde_json::to_string(p).unwrap()).collect();
        let mut metadata = json!({});
        if let Some(v) = &version { metadata["resourceVersion"] = json!(v); }
        if let Some(t) = &token { metadata["continue"] = json!(t); }
        if let Some(r) = remaining { metadata["remainingItemCount"] = json!(r); }
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let body = page_of(&refs, metadata);
        let page = decode_pod_list(1, body.as_bytes()).unwrap();
        let expected: Vec<PodFacts> = pods.into_iter().map(PodFacts::from_pod).collect();
        prop_assert_eq!(&page.pods, &expected);
        prop_assert_eq!(&page.pods, &via_kube(&body).unwrap());
        prop_assert_eq!(page.resource_version, version);
        prop_assert_eq!(page.continue_token, token);
        prop_assert_eq!(page.remaining_item_count, remaining);
        for (text, facts) in texts.iter().zip(&expected) {
            let line = format!(r#"{{"type":"ADDED","object":{text}}}"#);
            let WatchEvent::Added(watched) = decode_watch_event(line.as_bytes()).unwrap() else {
                panic!("not ADDED");
            };
            prop_assert_eq!(&watched.facts, facts);
            let json: Value = serde_json::from_str(text).unwrap();
            prop_assert_eq!(
                watched.resource_version.as_deref(),
                json["metadata"]["resourceVersion"].as_str()
            );
        }
    }

    /// Arbitrary bytes never panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let _ = decode_pod_list(1, &bytes);
        let _ = decode_watch_event(&bytes);
    }

    /// Mutated real pages never panic, and whenever kube still reads the page, the
    /// lean decoder reads it too and gives the same facts.
    #[test]
    fn mutated_pages_never_panic_and_agree_when_kube_reads_them(
        which in 0..12usize, seed in any::<u64>(), count in 1usize..6,
    ) {
        let all = fixtures();
        let (_, json) = &all[which % all.len()];
        let body = page_of(&[json], json!({ "resourceVersion": "1" }));
        let mutated = mutate(&body, seed, count);
        let lean = decode_pod_list(1, &mutated);
        if let Ok(text) = std::str::from_utf8(&mutated)
            && let Ok(kube) = via_kube(text)
        {
            prop_assert_eq!(lean.unwrap().pods, kube);
        }
        let line = format!(r#"{{"type":"DELETED","object":{json}}}"#);
        let _ = decode_watch_event(&mutate(&line, seed, count));
    }
}
