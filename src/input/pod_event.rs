//! The pod-events function's input, in every shape it accepts:
//!
//! - kubernetes-event-exporter's EventBridge sink: `detail` is a core/v1 Event whose
//!   `involvedObject` names the pod (with `labels` when the exporter looked them up, and
//!   `deleted`), plus `clusterName`;
//! - an EventBridge `detail` that is a whole core/v1 Pod (other bridges);
//! - a direct invoke `{"namespace": "...", "name": "..."}`.
//!
//! The EventBridge shapes are read through `aws_lambda_events`' envelope (see
//! `eventbridge`): a field EventBridge does not send is named and the event ignored.
//!
//! Anything else is [`Parsed::Ignore`] with one line saying why, never an error: an error
//! would make EventBridge retry garbage. Parsing is total: no input panics.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::Value;

use super::eventbridge;
pub use crate::reconcile::PodEvent;

/// The result of reading an invocation payload.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// Reconcile the groups this pod touches.
    Pod(PodEvent),
    /// Nothing to do; the reason is logged and reported.
    Ignore(String),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DirectInvoke {
    namespace: String,
    name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InvolvedObject {
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    deleted: bool,
}

/// Reads a pod-events payload for the cluster `cluster`.
pub fn parse(payload: &Value, cluster: &str) -> Parsed {
    let Value::Object(map) = payload else {
        return Parsed::Ignore(format!(
            "payload is not a JSON object ({})",
            kind_of(payload)
        ));
    };
    if map.contains_key("detail") || map.contains_key("detail-type") {
        let Some(detail) = map.get("detail").filter(|d| d.is_object()) else {
            return Parsed::Ignore("EventBridge event without an object `detail`".into());
        };
        if let Some(Some(theirs)) = detail.get("clusterName").map(Value::as_str)
            && theirs != cluster
        {
            return Parsed::Ignore(format!("event for cluster `{theirs}`, this is `{cluster}`"));
        }
        let parsed = if let Some(involved) = detail.get("involvedObject") {
            from_exporter(detail, involved)
        } else if detail.get("kind").and_then(Value::as_str) == Some("Pod") {
            from_pod_detail(detail)
        } else {
            return Parsed::Ignore(
                "`detail` is neither a core/v1 Event (involvedObject) nor a Pod".into(),
            );
        };
        // An event about another cluster or kind is ignored whatever its envelope; one
        // that would be acted on must be an EventBridge event as EventBridge sends it.
        if let Parsed::Pod(_) = &parsed
            && let Err(e) = eventbridge::parse::<Value>(payload)
        {
            return Parsed::Ignore(format!("not an EventBridge event: {e}"));
        }
        return parsed;
    }
    match serde_json::from_value::<DirectInvoke>(payload.clone()) {
        Ok(d) => checked(PodEvent {
            namespace: d.namespace,
            name: d.name,
            uid: None,
            labels: None,
            deleted: false,
            reason: "invoke".into(),
        }),
        Err(e) => Parsed::Ignore(format!(
            "not an EventBridge pod event nor {{\"namespace\", \"name\"}}: {e}"
        )),
    }
}

fn from_exporter(detail: &Value, involved: &Value) -> Parsed {
    if detail.get("clusterName").and_then(Value::as_str).is_none() {
        return Parsed::Ignore(
            "event has no clusterName; set clusterName in kubernetes-event-exporter's config"
                .into(),
        );
    }
    let obj: InvolvedObject = match serde_json::from_value(involved.clone()) {
        Ok(o) => o,
        Err(e) => return Parsed::Ignore(format!("involvedObject is malformed: {e}")),
    };
    match obj.kind.as_deref() {
        Some("Pod") => {}
        Some(other) => return Parsed::Ignore(format!("event about a {other}, not a Pod")),
        None => return Parsed::Ignore("involvedObject has no kind".into()),
    }
    let (Some(namespace), Some(name)) = (obj.namespace, obj.name) else {
        return Parsed::Ignore("involvedObject lacks namespace or name".into());
    };
    checked(PodEvent {
        namespace,
        name,
        uid: obj.uid,
        labels: obj.labels,
        deleted: obj.deleted,
        reason: detail
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_owned(),
    })
}

fn from_pod_detail(detail: &Value) -> Parsed {
    let pod: Pod = match serde_json::from_value(detail.clone()) {
        Ok(p) => p,
        Err(e) => return Parsed::Ignore(format!("detail is not a valid Pod: {e}")),
    };
    let meta = pod.metadata;
    let (Some(namespace), Some(name)) = (meta.namespace, meta.name) else {
        return Parsed::Ignore("Pod detail lacks metadata.namespace or metadata.name".into());
    };
    checked(PodEvent {
        namespace,
        name,
        uid: meta.uid,
        labels: meta.labels,
        deleted: meta.deletion_timestamp.is_some(),
        reason: "pod".into(),
    })
}

/// Refuses names that cannot be Kubernetes object names, before they reach a URL.
fn checked(ev: PodEvent) -> Parsed {
    let ok = |s: &str, max: usize| {
        !s.is_empty()
            && s.len() <= max
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    if !ok(&ev.namespace, 63) {
        return Parsed::Ignore(format!("{:?} is not a namespace name", ev.namespace));
    }
    if !ok(&ev.name, 253) {
        return Parsed::Ignore(format!("{:?} is not a pod name", ev.name));
    }
    Parsed::Pod(ev)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(file: &str) -> Value {
        let text = match file {
            "started" => include_str!("../../events/pod-started.json"),
            "killing" => include_str!("../../events/pod-killing.json"),
            "unhealthy" => include_str!("../../events/pod-unhealthy.json"),
            "pod" => include_str!("../../events/pod-detail.json"),
            "foreign" => include_str!("../../events/pod-foreign-cluster.json"),
            "malformed" => include_str!("../../events/pod-malformed.json"),
            "invoke" => include_str!("../../events/pod-invoke.json"),
            other => panic!("{other}"),
        };
        serde_json::from_str(text).unwrap()
    }

    fn pod(p: Parsed) -> PodEvent {
        match p {
            Parsed::Pod(e) => e,
            Parsed::Ignore(why) => panic!("ignored: {why}"),
        }
    }

    #[test]
    fn exporter_events() {
        let e = pod(parse(&event("started"), "demo"));
        assert_eq!(
            (e.namespace.as_str(), e.name.as_str(), e.reason.as_str()),
            ("shop", "web-7", "Started")
        );
        assert_eq!(e.labels.unwrap()["app"], "web");
        assert_eq!(pod(parse(&event("killing"), "demo")).reason, "Killing");
        assert_eq!(pod(parse(&event("unhealthy"), "demo")).reason, "Unhealthy");
    }

    #[test]
    fn pod_detail_and_direct_invoke() {
        let e = pod(parse(&event("pod"), "demo"));
        assert_eq!((e.namespace.as_str(), e.name.as_str()), ("shop", "web-7"));
        assert_eq!(
            e.uid.as_deref(),
            Some("0b7c2f0e-3c1f-4f43-9a55-2d5e7b0f8a11")
        );
        let e = pod(parse(&event("invoke"), "demo"));
        assert_eq!((e.namespace.as_str(), e.name.as_str()), ("shop", "web-7"));
    }

    #[test]
    fn foreign_malformed_and_other_kinds_are_ignored() {
        for (payload, why) in [
            (event("foreign"), "cluster `other`"),
            (event("malformed"), "involvedObject"),
            (event("started"), "this is `prod`"),
            (
                json!({"detail": {"clusterName": "demo", "involvedObject": {"kind": "Node", "name": "n"}}}),
                "Node",
            ),
            (json!({"namespace": "shop"}), "name"),
            (
                json!({"namespace": "shop", "name": "../../etc"}),
                "not a pod name",
            ),
            (
                json!({"namespace": "shop", "name": "a", "extra": 1}),
                "unknown field",
            ),
            (json!([1]), "not a JSON object"),
            (json!({"detail": "x"}), "object `detail`"),
        ] {
            let cluster = if why.contains("prod") { "prod" } else { "demo" };
            match parse(&payload, cluster) {
                Parsed::Ignore(reason) => {
                    assert!(reason.contains(why), "{reason} should mention {why}")
                }
                Parsed::Pod(e) => panic!("{payload} parsed as {e:?}"),
            }
        }
    }

    #[test]
    fn a_pod_event_needs_the_envelope_eventbridge_sends() {
        for (key, value, why) in [
            (
                "dryRun",
                json!(true),
                "field `dryRun` is not one EventBridge sends",
            ),
            ("time", json!("yesterday"), "field `time`"),
            ("detail-type", json!(7), "field `detail-type`"),
        ] {
            for file in ["started", "pod"] {
                let mut ev = event(file);
                ev[key] = value.clone();
                match parse(&ev, "demo") {
                    Parsed::Ignore(reason) => assert!(reason.contains(why), "{reason}"),
                    Parsed::Pod(e) => panic!("{key}={value} parsed as {e:?}"),
                }
            }
        }
        let mut ev = event("started");
        ev.as_object_mut().unwrap().remove("source");
        match parse(&ev, "demo") {
            Parsed::Ignore(reason) => assert!(reason.contains("`source`"), "{reason}"),
            Parsed::Pod(e) => panic!("parsed as {e:?}"),
        }
    }
}
