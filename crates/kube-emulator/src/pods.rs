//! What the apiserver's pod registry does to a pod on create and update:
//! decoding, validation (a subset of `ValidatePod`), defaulting and the
//! admission defaults every cluster applies, and the update strategies of
//! `pods` (status is kept, spec mostly immutable) and `pods/status` (spec is
//! kept).

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus, Toleration};
use serde_json::Value;

use crate::selector::{is_dns_subdomain, is_label_key, is_label_value};
use crate::status::ApiError;
use crate::store::Change;

/// Which endpoint an update came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Subresource {
    /// `/pods/{name}`: spec and metadata; status changes are ignored.
    Main,
    /// `/pods/{name}/status`: status and metadata; spec changes are ignored.
    Status,
}

fn cannot_handle(detail: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!(
        "Pod in version \"v1\" cannot be handled as a Pod: {detail}"
    ))
}

/// Decodes a request body into a Pod, accepting a missing kind/apiVersion
/// (defaulted from the URL, as the apiserver does) but rejecting others.
pub(crate) fn decode_pod(body: &[u8]) -> Result<Pod, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(cannot_handle)?;
    pod_from_value(value)
}

/// Converts JSON (e.g. a patched pod) into a Pod with the same checks.
pub(crate) fn pod_from_value(mut value: Value) -> Result<Pod, ApiError> {
    let Value::Object(map) = &mut value else {
        return Err(cannot_handle("the body is not a JSON object"));
    };
    match map.get("apiVersion") {
        None => {}
        Some(Value::String(v)) if v == "v1" => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({}) does not match the expected API version (v1)",
                other.as_str().unwrap_or("?")
            )));
        }
    }
    match map.get("kind") {
        None => {}
        Some(Value::String(k)) if k == "Pod" => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({}) does not match the expected kind (Pod)",
                other.as_str().unwrap_or("?")
            )));
        }
    }
    map.remove("apiVersion");
    map.remove("kind");
    serde_json::from_value(value).map_err(cannot_handle)
}

/// Checks that the namespace (and name, for updates) in the body agree with
/// the URL, filling them in when missing.
pub(crate) fn check_identity(
    pod: &mut Pod,
    namespace: &str,
    name: Option<&str>,
) -> Result<(), ApiError> {
    match pod.metadata.namespace.as_deref() {
        None | Some("") => pod.metadata.namespace = Some(namespace.to_owned()),
        Some(ns) if ns == namespace => {}
        Some(_) => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    if let Some(name) = name {
        match pod.metadata.name.as_deref() {
            None | Some("") => pod.metadata.name = Some(name.to_owned()),
            Some(n) if n == name => {}
            Some(n) => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
        }
    }
    Ok(())
}

/// `names.SimpleNameGenerator`: generateName plus 5 random characters.
fn generate_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let prefix: String = prefix.chars().take(63 - 5).collect();
    let suffix: String = (0..5)
        .map(|_| char::from(ALPHABET[fastrand::usize(..ALPHABET.len())]))
        .collect();
    format!("{prefix}{suffix}")
}

fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && is_dns_subdomain(s)
}

fn validate_metadata(pod: &Pod, errors: &mut Vec<(String, String)>) {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if !is_dns_subdomain(name) {
        errors.push((
            "metadata.name".to_owned(),
            format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
        ));
    }
    for (key, value) in pod.metadata.labels.iter().flatten() {
        if !is_label_key(key) {
            errors.push((
                "metadata.labels".to_owned(),
                format!("Invalid value: {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"),
            ));
        }
        if !is_label_value(value) {
            errors.push((
                "metadata.labels".to_owned(),
                format!("Invalid value: {value:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"),
            ));
        }
    }
}

fn validate_containers(field: &str, containers: &[Container], errors: &mut Vec<(String, String)>) {
    let mut seen: Vec<&str> = Vec::new();
    for (i, c) in containers.iter().enumerate() {
        if c.name.is_empty() {
            errors.push((format!("{field}[{i}].name"), "Required value".to_owned()));
        } else if !is_dns_label(&c.name) {
            errors.push((
                format!("{field}[{i}].name"),
                format!("Invalid value: {:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character", c.name),
            ));
        } else if seen.contains(&c.name.as_str()) {
            errors.push((
                format!("{field}[{i}].name"),
                format!("Duplicate value: {:?}", c.name),
            ));
        }
        seen.push(&c.name);
        if c.image.as_deref().unwrap_or_default().trim().is_empty() {
            errors.push((format!("{field}[{i}].image"), "Required value".to_owned()));
        }
    }
}

fn validate_spec(spec: Option<&PodSpec>, errors: &mut Vec<(String, String)>) {
    let Some(spec) = spec else {
        errors.push(("spec.containers".to_owned(), "Required value".to_owned()));
        return;
    };
    if spec.containers.is_empty() {
        errors.push(("spec.containers".to_owned(), "Required value".to_owned()));
    }
    validate_containers("spec.containers", &spec.containers, errors);
    if let Some(init) = &spec.init_containers {
        validate_containers("spec.initContainers", init, errors);
    }
}

fn invalid_if_any(pod: &Pod, errors: Vec<(String, String)>) -> Result<(), ApiError> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(
            pod.metadata.name.as_deref().unwrap_or_default(),
            errors,
        ))
    }
}

/// The defaulting of `k8s.io/kubernetes/pkg/apis/core/v1` (`SetDefaults_*`)
/// for the fields a pod client is likely to read.
pub(crate) fn apply_defaults(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.restart_policy
        .get_or_insert_with(|| "Always".to_owned());
    spec.dns_policy
        .get_or_insert_with(|| "ClusterFirst".to_owned());
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".to_owned());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.security_context.get_or_insert_with(Default::default);
    spec.enable_service_links.get_or_insert(true);
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for c in containers {
        c.termination_message_path
            .get_or_insert_with(|| "/dev/termination-log".to_owned());
        c.termination_message_policy
            .get_or_insert_with(|| "File".to_owned());
        if c.image_pull_policy.is_none() {
            let image = c.image.as_deref().unwrap_or_default();
            let last = image.rsplit('/').next().unwrap_or_default();
            let latest = !image.contains('@')
                && last.rsplit_once(':').is_none_or(|(_, tag)| tag == "latest");
            c.image_pull_policy = Some(if latest { "Always" } else { "IfNotPresent" }.to_owned());
        }
        for port in c.ports.iter_mut().flatten() {
            port.protocol.get_or_insert_with(|| "TCP".to_owned());
        }
        if let Some(resources) = c.resources.as_mut()
            && let Some(limits) = resources.limits.clone()
        {
            let requests = resources.requests.get_or_insert_with(Default::default);
            for (name, quantity) in limits {
                requests.entry(name).or_insert(quantity);
            }
        }
    }
}

/// Admission that every cluster runs on pod create: ServiceAccount (the
/// `default` account), Priority (0, `PreemptLowerPriority`) and
/// DefaultTolerationSeconds (300 s for not-ready/unreachable).
fn admit_create(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    if spec
        .service_account_name
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        spec.service_account_name = Some("default".to_owned());
    }
    spec.service_account = spec.service_account_name.clone();
    spec.priority.get_or_insert(0);
    spec.preemption_policy
        .get_or_insert_with(|| "PreemptLowerPriority".to_owned());
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let tolerated = tolerations.iter().any(|t| {
            (t.key.as_deref() == Some(key) || t.key.is_none())
                && t.effect.as_deref().is_none_or(|e| e == "NoExecute")
        });
        if !tolerated {
            tolerations.push(Toleration {
                effect: Some("NoExecute".to_owned()),
                key: Some(key.to_owned()),
                operator: Some("Exists".to_owned()),
                toleration_seconds: Some(300),
                value: None,
            });
        }
    }
}

/// `qos.GetPodQOS` for cpu and memory.
fn qos_class(spec: &PodSpec) -> &'static str {
    let containers: Vec<&Container> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    let compute = |c: &Container, limits: bool| {
        c.resources
            .as_ref()
            .and_then(|r| {
                if limits {
                    r.limits.clone()
                } else {
                    r.requests.clone()
                }
            })
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k == "cpu" || k == "memory")
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let any = containers
        .iter()
        .any(|c| !compute(c, true).is_empty() || !compute(c, false).is_empty());
    if !any {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        let limits = compute(c, true);
        let requests = compute(c, false);
        limits.len() == 2 && requests.iter().all(|(k, v)| limits.get(k) == Some(v))
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// Turns a POSTed pod into the pod the registry stores: generated name,
/// validation, defaults, admission, fresh server-set metadata, and the
/// initial status (`Pending`) — a created pod's status comes from the
/// kubelet, never from the client.
pub(crate) fn prepare_create(mut pod: Pod, namespace: &str) -> Result<Pod, ApiError> {
    check_identity(&mut pod, namespace, None)?;
    if pod.metadata.name.as_deref().unwrap_or_default().is_empty() {
        match pod.metadata.generate_name.as_deref() {
            Some(prefix) if !prefix.is_empty() => {
                pod.metadata.name = Some(generate_name(prefix));
            }
            _ => {
                return Err(ApiError::invalid(
                    "",
                    vec![(
                        "metadata.name".to_owned(),
                        "Required value: name or generateName is required".to_owned(),
                    )],
                ));
            }
        }
    }
    let mut errors = Vec::new();
    validate_metadata(&pod, &mut errors);
    validate_spec(pod.spec.as_ref(), &mut errors);
    invalid_if_any(&pod, errors)?;

    apply_defaults(&mut pod);
    admit_create(&mut pod);
    let meta = &mut pod.metadata;
    meta.uid = None;
    meta.resource_version = None;
    meta.creation_timestamp = None;
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.generation = Some(1);
    meta.self_link = None;
    let qos = pod.spec.as_ref().map(qos_class).unwrap_or("BestEffort");
    pod.status = Some(PodStatus {
        phase: Some("Pending".to_owned()),
        qos_class: Some(qos.to_owned()),
        ..PodStatus::default()
    });
    Ok(pod)
}

/// `ValidatePodUpdate`: a pod's spec may only change container images,
/// `activeDeadlineSeconds`, additions to tolerations and removals of
/// scheduling gates.
fn spec_update_allowed(old: &PodSpec, new: &PodSpec) -> bool {
    let mut allowed = old.clone();
    if old.containers.len() != new.containers.len() {
        return false;
    }
    for (a, n) in allowed.containers.iter_mut().zip(&new.containers) {
        a.image.clone_from(&n.image);
    }
    match (
        allowed.init_containers.as_mut(),
        new.init_containers.as_ref(),
    ) {
        (Some(a), Some(n)) if a.len() == n.len() => {
            for (a, n) in a.iter_mut().zip(n) {
                a.image.clone_from(&n.image);
            }
        }
        (None, None) => {}
        _ => return false,
    }
    allowed.active_deadline_seconds = new.active_deadline_seconds;
    let old_tolerations = old.tolerations.clone().unwrap_or_default();
    let new_tolerations = new.tolerations.clone().unwrap_or_default();
    if old_tolerations.iter().all(|t| new_tolerations.contains(t)) {
        allowed.tolerations.clone_from(&new.tolerations);
    }
    let old_gates = old.scheduling_gates.clone().unwrap_or_default();
    let new_gates = new.scheduling_gates.clone().unwrap_or_default();
    if new_gates.iter().all(|g| old_gates.contains(g)) {
        allowed.scheduling_gates.clone_from(&new.scheduling_gates);
    }
    allowed == *new
}

fn is_terminal(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// The storage precondition of a PUT: a body naming a `metadata.uid` makes
/// the update conditional on it (`rest.defaultUpdatedObjectInfo.Preconditions`),
/// and etcd3's `GuaranteedUpdate` refuses another pod with this 409, worded
/// as `storage.Preconditions.Check` and `storeerr.InterpretUpdateError` do.
pub(crate) fn check_uid_precondition(
    old: &Pod,
    new: &Pod,
    namespace: &str,
) -> Result<(), ApiError> {
    let Some(uid) = new.metadata.uid.as_deref().filter(|u| !u.is_empty()) else {
        return Ok(());
    };
    let stored = old.metadata.uid.as_deref().unwrap_or_default();
    if uid == stored {
        return Ok(());
    }
    let name = old.metadata.name.as_deref().unwrap_or_default();
    Err(ApiError::conflict_with(
        name,
        &format!(
            "StorageError: invalid object, Code: 4, Key: /registry/pods/{namespace}/{name}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: {uid}, UID in object meta: {stored}"
        ),
    ))
}

/// Applies an update to `old` the way the registry's update strategy for
/// `subresource` does, with optimistic concurrency on
/// `metadata.resourceVersion` (an empty one means an unconditional update).
/// A write that changes nothing is not a write (no resourceVersion bump).
pub(crate) fn prepare_update(
    old: &Pod,
    mut new: Pod,
    subresource: Subresource,
) -> Result<Change, ApiError> {
    let name = old.metadata.name.clone().unwrap_or_default();
    if let Some(rv) = new
        .metadata
        .resource_version
        .as_deref()
        .filter(|rv| !rv.is_empty())
        && Some(rv) != old.metadata.resource_version.as_deref()
    {
        return Err(ApiError::conflict(&name));
    }
    // A patch carrying another `metadata.uid` reaches `rest.BeforeUpdate`,
    // whose `ValidateObjectMetaUpdate` refuses the change: 422, not 409 (a
    // patch has no storage precondition; a PUT's UID is checked earlier by
    // `check_uid_precondition`).
    if let Some(uid) = new.metadata.uid.as_deref().filter(|u| !u.is_empty())
        && Some(uid) != old.metadata.uid.as_deref()
    {
        return Err(ApiError::invalid(
            &name,
            vec![(
                "metadata.uid".to_owned(),
                format!("Invalid value: {uid:?}: field is immutable"),
            )],
        ));
    }
    let meta = &mut new.metadata;
    meta.uid.clone_from(&old.metadata.uid);
    meta.creation_timestamp
        .clone_from(&old.metadata.creation_timestamp);
    meta.deletion_timestamp
        .clone_from(&old.metadata.deletion_timestamp);
    meta.deletion_grace_period_seconds = old.metadata.deletion_grace_period_seconds;
    meta.generation = old.metadata.generation;
    meta.generate_name.clone_from(&old.metadata.generate_name);
    meta.resource_version
        .clone_from(&old.metadata.resource_version);

    let mut errors = Vec::new();
    validate_metadata(&new, &mut errors);
    match subresource {
        Subresource::Main => {
            new.status.clone_from(&old.status);
            apply_defaults(&mut new);
            let mut old_defaulted = old.clone();
            apply_defaults(&mut old_defaulted);
            let allowed = match (old_defaulted.spec.as_ref(), new.spec.as_ref()) {
                (Some(o), Some(n)) => spec_update_allowed(o, n),
                (None, None) => true,
                _ => false,
            };
            if allowed && new.spec != old_defaulted.spec {
                // KEP-5067: spec changes bump metadata.generation.
                new.metadata.generation = old.metadata.generation.map(|g| g + 1);
            }
            if !allowed {
                errors.push((
                    "spec".to_owned(),
                    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)".to_owned(),
                ));
            }
        }
        Subresource::Status => {
            new.spec.clone_from(&old.spec);
            new.metadata
                .owner_references
                .clone_from(&old.metadata.owner_references);
            // The QoS class is immutable; a status without one keeps the old.
            let old_qos = old.status.as_ref().and_then(|s| s.qos_class.clone());
            if let Some(status) = new.status.as_mut()
                && status.qos_class.as_deref().unwrap_or_default().is_empty()
            {
                status.qos_class = old_qos;
            }
            let old_phase = old.status.as_ref().and_then(|s| s.phase.as_deref());
            let new_phase = new.status.as_ref().and_then(|s| s.phase.as_deref());
            if is_terminal(old_phase) && new_phase != old_phase {
                errors.push((
                    "status.phase".to_owned(),
                    format!(
                        "Forbidden: cannot transition from a terminated phase {:?} to {:?}",
                        old_phase.unwrap_or_default(),
                        new_phase.unwrap_or_default()
                    ),
                ));
            }
        }
    }
    invalid_if_any(&new, errors)?;
    if new == *old {
        return Ok(Change::Keep);
    }
    Ok(Change::Put(Box::new(new)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    fn new_pod() -> Pod {
        decode_pod(&body(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.9"}
        })))
        .unwrap()
    }

    #[test]
    fn decode_checks_kind_and_version() {
        assert!(decode_pod(b"{").is_err());
        assert!(decode_pod(b"[]").is_err());
        assert!(decode_pod(&body(json!({"kind": "Service"}))).is_err());
        assert!(decode_pod(&body(json!({"apiVersion": "apps/v1"}))).is_err());
        assert!(decode_pod(&body(json!({"metadata": {"name": "x"}}))).is_ok());
    }

    #[test]
    fn create_resets_status_and_defaults() {
        let pod = prepare_create(new_pod(), "default").unwrap();
        let status = pod.status.unwrap();
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
        assert!(status.pod_ip.is_none());
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.service_account_name.as_deref(), Some("default"));
        assert_eq!(spec.tolerations.unwrap().len(), 2);
        let c = &spec.containers[0];
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(
            c.ports.as_ref().unwrap()[0].protocol.as_deref(),
            Some("TCP")
        );
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
    }

    #[test]
    fn create_validates() {
        let mut p = new_pod();
        p.metadata.name = None;
        assert_eq!(prepare_create(p.clone(), "default").unwrap_err().code, 422);
        p.metadata.generate_name = Some("web-".into());
        let made = prepare_create(p, "default").unwrap();
        assert!(made.metadata.name.unwrap().starts_with("web-"));

        let mut p = new_pod();
        p.spec.as_mut().unwrap().containers[0].image = None;
        assert_eq!(prepare_create(p, "default").unwrap_err().code, 422);
        let mut p = new_pod();
        p.metadata.name = Some("Web_1".into());
        assert_eq!(prepare_create(p, "default").unwrap_err().code, 422);
        let mut p = new_pod();
        p.metadata.namespace = Some("other".into());
        assert_eq!(prepare_create(p, "default").unwrap_err().code, 400);
    }

    fn stored() -> Pod {
        let mut p = prepare_create(new_pod(), "default").unwrap();
        p.metadata.resource_version = Some("7".into());
        p.metadata.uid = Some("uid-1".into());
        p
    }

    #[test]
    fn main_update_keeps_status_and_guards_spec() {
        let old = stored();
        let mut new = old.clone();
        new.metadata.labels = Some([("app".to_owned(), "db".to_owned())].into());
        new.status.as_mut().unwrap().phase = Some("Running".into());
        let Change::Put(updated) = prepare_update(&old, new, Subresource::Main).unwrap() else {
            panic!("expected a write");
        };
        assert_eq!(updated.status, old.status);
        assert_eq!(updated.metadata.labels.unwrap()["app"], "db");

        let mut image = old.clone();
        image.spec.as_mut().unwrap().containers[0].image = Some("nginx:1.28".into());
        assert!(matches!(
            prepare_update(&old, image, Subresource::Main),
            Ok(Change::Put(_))
        ));

        let mut node = old.clone();
        node.spec.as_mut().unwrap().node_name = Some("n1".into());
        assert_eq!(
            prepare_update(&old, node, Subresource::Main)
                .unwrap_err()
                .code,
            422
        );

        let mut stale = old.clone();
        stale.metadata.resource_version = Some("6".into());
        assert_eq!(
            prepare_update(&old, stale, Subresource::Main)
                .unwrap_err()
                .code,
            409
        );

        let mut unconditional = old.clone();
        unconditional.metadata.resource_version = None;
        assert!(matches!(
            prepare_update(&old, unconditional, Subresource::Main),
            Ok(Change::Keep)
        ));
    }

    #[test]
    fn uid_changes_are_refused_as_the_apiserver_does() {
        let old = stored();
        let mut other = old.clone();
        other.metadata.uid = Some("uid-2".into());
        // A patch that names another UID: 422 from ValidateObjectMetaUpdate.
        let err = prepare_update(&old, other.clone(), Subresource::Status).unwrap_err();
        assert_eq!((err.code, err.reason), (422, "Invalid"));
        assert_eq!(
            err.message,
            "Pod \"web-1\" is invalid: metadata.uid: Invalid value: \"uid-2\": field is immutable"
        );
        // A stale resourceVersion is checked first: 409.
        other.metadata.resource_version = Some("6".into());
        assert_eq!(
            prepare_update(&old, other.clone(), Subresource::Status)
                .unwrap_err()
                .code,
            409
        );
        // A PUT's UID is a storage precondition: 409 Conflict.
        let err = check_uid_precondition(&old, &other, "default").unwrap_err();
        assert_eq!((err.code, err.reason), (409, "Conflict"));
        assert_eq!(
            err.message,
            "Operation cannot be fulfilled on pods \"web-1\": StorageError: invalid object, Code: 4, Key: /registry/pods/default/web-1, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: uid-2, UID in object meta: uid-1"
        );
        assert!(check_uid_precondition(&old, &old, "default").is_ok());
        let mut no_uid = old.clone();
        no_uid.metadata.uid = None;
        assert!(check_uid_precondition(&old, &no_uid, "default").is_ok());
    }

    #[test]
    fn status_update_keeps_spec() {
        let old = stored();
        let mut new = old.clone();
        new.spec.as_mut().unwrap().node_name = Some("ignored".into());
        new.status.as_mut().unwrap().phase = Some("Running".into());
        let Change::Put(updated) = prepare_update(&old, new, Subresource::Status).unwrap() else {
            panic!("expected a write");
        };
        assert_eq!(updated.spec, old.spec);
        assert_eq!(
            updated.status.as_ref().unwrap().phase.as_deref(),
            Some("Running")
        );

        let mut failed = Pod::clone(&updated);
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let Change::Put(failed) = prepare_update(&updated, failed, Subresource::Status).unwrap()
        else {
            panic!("expected a write");
        };
        let mut revived = Pod::clone(&failed);
        revived.status.as_mut().unwrap().phase = Some("Running".into());
        assert_eq!(
            prepare_update(&failed, revived, Subresource::Status)
                .unwrap_err()
                .code,
            422
        );
    }
}
