//! LIST with `limit`/`continue` and `resourceVersion` semantics of the
//! apiserver's etcd3 storage: pages in key order (`namespace/name`), a
//! continue token in the apiserver's own format (base64url of
//! `{"v":"meta.k8s.io/v1","rv":N,"start":"<key>\u0000"}`), continued pages
//! served from the snapshot at the first page's resourceVersion, and 410
//! Expired once that snapshot is gone.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{Snapshot, SnapshotError, Store};

const TOKEN_VERSION: &str = "meta.k8s.io/v1";

#[derive(Debug, Serialize, Deserialize)]
struct ContinueToken {
    #[serde(rename = "v")]
    version: String,
    #[serde(rename = "rv")]
    resource_version: i64,
    #[serde(rename = "start")]
    start_key: String,
}

/// Encodes a continue token that resumes at `start_key` (inclusive) at
/// `resource_version` (-1: at the latest revision).
pub(crate) fn encode_continue(start_key: &str, resource_version: i64) -> String {
    let token = ContinueToken {
        version: TOKEN_VERSION.to_owned(),
        resource_version,
        start_key: start_key.to_owned(),
    };
    // Serializing a struct of strings and an integer cannot fail.
    let json = serde_json::to_vec(&token).unwrap_or_default();
    URL_SAFE_NO_PAD.encode(json)
}

/// Decodes a continue token into `(start key, resourceVersion)`, with the
/// checks of `storage.DecodeContinue`.
pub(crate) fn decode_continue(token: &str) -> Result<(String, i64), String> {
    let invalid = |detail: String| format!("continue key is not valid: {detail}");
    let bytes = URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|e| invalid(e.to_string()))?;
    let token: ContinueToken =
        serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    if token.version != TOKEN_VERSION {
        return Err(invalid(format!(
            "server does not recognize this encoded version {}",
            token.version
        )));
    }
    if token.resource_version == 0 {
        return Err(invalid(format!(
            "incorrect encoded start resourceVersion (version {TOKEN_VERSION})"
        )));
    }
    if token.start_key.is_empty() {
        return Err(invalid(format!(
            "encoded start key empty (version {TOKEN_VERSION})"
        )));
    }
    if !is_clean_key(&token.start_key) {
        return Err(invalid(format!("invalid key: {}", token.start_key)));
    }
    Ok((token.start_key, token.resource_version))
}

/// `path.Clean("/" + key) == "/" + key`: the key cannot climb out of the
/// listed prefix.
fn is_clean_key(key: &str) -> bool {
    let key = key.strip_prefix('/').unwrap_or(key);
    if key.is_empty() {
        return true;
    }
    key.split('/')
        .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

/// What a LIST asked for.
#[derive(Clone, Debug, Default)]
pub(crate) struct ListRequest {
    /// `Some(ns)` for `/namespaces/{ns}/pods`, `None` for all namespaces.
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// `limit` (values <= 0 mean no limit).
    pub limit: Option<i64>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
}

/// One page of a LIST answer.
#[derive(Clone, Debug)]
pub(crate) struct ListPage {
    pub resource_version: u64,
    pub items: Vec<Arc<Pod>>,
    pub continue_token: Option<String>,
    pub remaining_item_count: Option<i64>,
}

/// The key a pod has relative to the listed prefix (`name` within a
/// namespace, `namespace/name` across namespaces), as etcd orders it.
fn relative_key(namespace: Option<&str>, pod_ns: &str, pod_name: &str) -> String {
    match namespace {
        Some(_) => pod_name.to_owned(),
        None => format!("{pod_ns}/{pod_name}"),
    }
}

/// 422 for `ListOptions` the apiserver's validation refuses.
pub(crate) fn invalid_list_options(message: &str) -> ApiError {
    ApiError {
        code: 422,
        reason: "Invalid",
        message: format!("ListOptions.meta.k8s.io \"\" is invalid: {message}"),
        details: Some(Box::new(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::StatusDetails {
                group: Some("meta.k8s.io".to_owned()),
                kind: Some("ListOptions".to_owned()),
                ..Default::default()
            },
        )),
        list_continue: None,
        retry_after: None,
    }
}

/// Picks the snapshot the request reads and the resourceVersion it reports.
fn choose_snapshot(
    store: &Store,
    req: &ListRequest,
    expire_continue: bool,
) -> Result<(Snapshot, u64, String), ApiError> {
    let rv_param = req.resource_version.as_deref().unwrap_or("");
    let rv_match = req.resource_version_match.as_deref().unwrap_or("");
    if !matches!(rv_match, "" | "NotOlderThan" | "Exact") {
        return Err(invalid_list_options(&format!(
            "resourceVersionMatch: Unsupported value: \"{rv_match}\": supported values: \"Exact\", \"NotOlderThan\", \"\""
        )));
    }
    if !rv_match.is_empty() && rv_param.is_empty() {
        return Err(invalid_list_options(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    if !rv_match.is_empty() && req.continue_token.is_some() {
        return Err(invalid_list_options(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided",
        ));
    }

    if let Some(token) = &req.continue_token {
        if !rv_param.is_empty() && rv_param != "0" {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let (start, token_rv) = decode_continue(token)
            .map_err(|e| ApiError::bad_request(format!("invalid continue token: {e}")))?;
        if expire_continue {
            return Err(ApiError::continue_expired(Some(encode_continue(
                &start, -1,
            ))));
        }
        if token_rv < 0 {
            let (rv, snapshot) = store.current();
            return Ok((snapshot, rv, start));
        }
        let rv = u64::try_from(token_rv).unwrap_or(0);
        return match store.snapshot_at(rv) {
            Ok(snapshot) => Ok((snapshot, rv, start)),
            Err(SnapshotError::Compacted) => Err(ApiError::continue_expired(Some(
                encode_continue(&start, -1),
            ))),
            Err(SnapshotError::Future { .. }) => Err(ApiError::bad_request(format!(
                "invalid continue token: continue key is not valid: resourceVersion {rv} is in the future"
            ))),
        };
    }

    if rv_param.is_empty() || rv_param == "0" {
        // Unset/"": consistent read of the latest state. "0": any state is
        // acceptable, and the latest is one.
        let (rv, snapshot) = store.current();
        return Ok((snapshot, rv, String::new()));
    }
    let requested: u64 = rv_param.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resource version: strconv.ParseUint: parsing {rv_param:?}: invalid syntax"
        ))
    })?;
    let limited = req.limit.is_some_and(|l| l > 0);
    let exact = rv_match == "Exact" || (rv_match.is_empty() && limited);
    if exact {
        return match store.snapshot_at(requested) {
            Ok(snapshot) => Ok((snapshot, requested, String::new())),
            Err(SnapshotError::Compacted) => Err(ApiError::resource_version_expired()),
            Err(SnapshotError::Future { current }) => {
                Err(ApiError::too_large_resource_version(requested, current))
            }
        };
    }
    let (rv, snapshot) = store.current();
    if requested > rv {
        return Err(ApiError::too_large_resource_version(requested, rv));
    }
    Ok((snapshot, rv, String::new()))
}

/// Serves one LIST page. `expire_continue` makes a continued request fail
/// with 410 as if its snapshot had been compacted.
pub(crate) fn list(
    store: &Store,
    req: &ListRequest,
    expire_continue: bool,
) -> Result<ListPage, ApiError> {
    let (snapshot, rv, start) = choose_snapshot(store, req, expire_continue)?;
    let namespace = req.namespace.as_deref();
    let mut candidates: Vec<(String, &Arc<Pod>)> = snapshot
        .iter()
        .filter(|((ns, _), _)| namespace.is_none_or(|want| want == ns))
        .map(|((ns, name), pod)| (relative_key(namespace, ns, name), pod))
        .filter(|(key, _)| key.as_str() >= start.as_str())
        .collect();
    candidates.sort_by(|a, b| a.0.cmp(&b.0));

    let limit = req
        .limit
        .filter(|l| *l > 0)
        .and_then(|l| usize::try_from(l).ok());
    let unfiltered = req.labels.is_empty() && req.fields.is_empty();
    let mut items = Vec::new();
    let mut continue_token = None;
    let mut remaining_item_count = None;
    for (index, (key, pod)) in candidates.iter().enumerate() {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        if req.labels.matches(&labels) && req.fields.matches(pod) {
            items.push(Arc::clone(pod));
        }
        if limit.is_some_and(|l| items.len() >= l) {
            let remaining = candidates.len() - index - 1;
            if remaining > 0 {
                let rv_i64 = i64::try_from(rv).unwrap_or(i64::MAX);
                continue_token = Some(encode_continue(&format!("{key}\u{0}"), rv_i64));
                if unfiltered {
                    remaining_item_count = i64::try_from(remaining).ok();
                }
            }
            break;
        }
    }
    Ok(ListPage {
        resource_version: rv,
        items,
        continue_token,
        remaining_item_count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, labels: &[(&str, &str)]) -> Pod {
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "labels": labels}
        }))
        .unwrap()
    }

    fn names(page: &ListPage) -> Vec<String> {
        page.items
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect()
    }

    fn seeded() -> Store {
        let store = Store::new();
        for name in ["web-3", "web-1", "web-5", "web-2", "web-4"] {
            store
                .put_pod(pod("default", name, &[("app", "web")]))
                .unwrap();
        }
        store
            .put_pod(pod("other", "web-0", &[("app", "web")]))
            .unwrap();
        store
    }

    fn request(limit: i64, token: Option<String>) -> ListRequest {
        ListRequest {
            namespace: Some("default".to_owned()),
            limit: Some(limit),
            continue_token: token,
            ..ListRequest::default()
        }
    }

    #[test]
    fn token_round_trip_and_format() {
        let token = encode_continue("web-2\u{0}", 12);
        let json = String::from_utf8(URL_SAFE_NO_PAD.decode(&token).unwrap()).unwrap();
        assert_eq!(
            json,
            r#"{"v":"meta.k8s.io/v1","rv":12,"start":"web-2\u0000"}"#
        );
        assert_eq!(
            decode_continue(&token).unwrap(),
            ("web-2\u{0}".to_owned(), 12)
        );
    }

    #[test]
    fn invalid_tokens_are_rejected() {
        let enc = |s: &str| URL_SAFE_NO_PAD.encode(s);
        for bad in [
            "!!!".to_owned(),
            enc("not json"),
            enc(r#"{"v":"meta.k8s.io/v2","rv":1,"start":"a"}"#),
            enc(r#"{"v":"meta.k8s.io/v1","rv":0,"start":"a"}"#),
            enc(r#"{"v":"meta.k8s.io/v1","rv":3,"start":""}"#),
            enc(r#"{"v":"meta.k8s.io/v1","rv":3,"start":"../kube-system/x"}"#),
        ] {
            assert!(decode_continue(&bad).is_err(), "{bad}");
        }
        let store = seeded();
        let err = list(&store, &request(2, Some("garbage".into())), false).unwrap_err();
        assert_eq!(err.code, 400);
        assert!(
            err.message.starts_with("invalid continue token"),
            "{}",
            err.message
        );
    }

    #[test]
    fn three_pages_of_two_without_gaps_or_duplicates() {
        let store = seeded();
        let first = list(&store, &request(2, None), false).unwrap();
        assert_eq!(names(&first), ["web-1", "web-2"]);
        assert_eq!(first.remaining_item_count, Some(3));
        let rv = first.resource_version;
        assert_eq!(rv, store.resource_version());

        // Writes between pages are not seen by the continued list.
        store
            .put_pod(pod("default", "web-25", &[("app", "web")]))
            .unwrap();
        store.delete_pod("default", "web-4");

        let second = list(&store, &request(2, first.continue_token.clone()), false).unwrap();
        assert_eq!(names(&second), ["web-3", "web-4"]);
        assert_eq!(second.resource_version, rv);
        assert_eq!(second.remaining_item_count, Some(1));

        let third = list(&store, &request(2, second.continue_token.clone()), false).unwrap();
        assert_eq!(names(&third), ["web-5"]);
        assert!(third.continue_token.is_none());
        assert!(third.remaining_item_count.is_none());
        assert_eq!(third.resource_version, rv);

        // A fresh list sees the new state.
        let fresh = list(&store, &request(0, None), false).unwrap();
        assert_eq!(
            names(&fresh),
            ["web-1", "web-2", "web-25", "web-3", "web-5"]
        );
        assert!(fresh.continue_token.is_none());
        assert!(fresh.resource_version > rv);
    }

    #[test]
    fn all_namespaces_are_ordered_by_namespace_then_name() {
        let store = seeded();
        let mut req = request(4, None);
        req.namespace = None;
        let first = list(&store, &req, false).unwrap();
        assert_eq!(names(&first), ["web-1", "web-2", "web-3", "web-4"]);
        req.continue_token = first.continue_token;
        let second = list(&store, &req, false).unwrap();
        assert_eq!(names(&second), ["web-5", "web-0"]);
        assert_eq!(second.items[1].metadata.namespace.as_deref(), Some("other"));
        assert!(second.continue_token.is_none());
    }

    #[test]
    fn exact_page_boundary_has_no_continue() {
        let store = seeded();
        let first = list(&store, &request(5, None), false).unwrap();
        assert_eq!(first.items.len(), 5);
        assert!(first.continue_token.is_none());
        assert!(first.remaining_item_count.is_none());
    }

    #[test]
    fn selectors_filter_pages_and_hide_remaining_count() {
        let store = seeded();
        store
            .put_pod(pod("default", "web-2", &[("app", "db")]))
            .unwrap();
        let mut req = request(2, None);
        req.labels = LabelSelector::parse("app=web").unwrap();
        let first = list(&store, &req, false).unwrap();
        assert_eq!(names(&first), ["web-1", "web-3"]);
        assert!(first.continue_token.is_some());
        assert!(first.remaining_item_count.is_none());
        req.continue_token = first.continue_token;
        let second = list(&store, &req, false).unwrap();
        assert_eq!(names(&second), ["web-4", "web-5"]);
        assert!(second.continue_token.is_none());
    }

    #[test]
    fn expired_tokens_give_410_with_a_fresh_token() {
        let store = seeded();
        let first = list(&store, &request(2, None), false).unwrap();
        let token = first.continue_token.clone();

        // Injected expiry.
        let err = list(&store, &request(2, token.clone()), true).unwrap_err();
        assert_eq!((err.code, err.reason), (410, "Expired"));
        assert_eq!(err.message, crate::status::EXPIRED_CONTINUE_MESSAGE);

        // Real compaction.
        store.put_pod(pod("default", "web-0", &[])).unwrap();
        store.compact();
        let err = list(&store, &request(2, token), false).unwrap_err();
        assert_eq!(err.code, 410);
        // The token in the 410 continues inconsistently at the latest state.
        let latest = list(&store, &request(2, err.list_continue.clone()), false).unwrap();
        assert_eq!(names(&latest), ["web-3", "web-4"]);
        assert_eq!(latest.resource_version, store.resource_version());
    }

    #[test]
    fn resource_version_semantics() {
        let store = seeded();
        let rv = store.resource_version();
        store.put_pod(pod("default", "web-6", &[])).unwrap();

        // Exact (legacy: rv with limit) reads the old snapshot.
        let mut req = request(10, None);
        req.resource_version = Some(rv.to_string());
        assert_eq!(list(&store, &req, false).unwrap().items.len(), 5);

        // NotOlderThan reads the latest.
        req.resource_version_match = Some("NotOlderThan".into());
        assert_eq!(list(&store, &req, false).unwrap().items.len(), 6);

        // Too new.
        req.resource_version = Some((rv + 100).to_string());
        assert_eq!(list(&store, &req, false).unwrap_err().code, 504);

        // resourceVersionMatch without resourceVersion.
        let mut bad = request(0, None);
        bad.resource_version_match = Some("Exact".into());
        assert_eq!(list(&store, &bad, false).unwrap_err().code, 422);

        // resourceVersion with continue.
        let first = list(&store, &request(2, None), false).unwrap();
        let mut cont = request(2, first.continue_token);
        cont.resource_version = Some(rv.to_string());
        assert_eq!(list(&store, &cont, false).unwrap_err().code, 400);

        // Compacted exact read.
        store.compact();
        let mut old = request(0, None);
        old.resource_version = Some(rv.to_string());
        old.resource_version_match = Some("Exact".into());
        assert_eq!(list(&store, &old, false).unwrap_err().code, 410);
    }
}
