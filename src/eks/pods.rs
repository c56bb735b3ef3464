//! [`PodSource`] over the Kubernetes API of an EKS cluster: paginated, consistent LISTs
//! decoded page by page straight into [`PodFacts`] (see [`super::decode`]), and
//! single-pod GETs.

use std::sync::Arc;
use std::time::Duration;

use futures::AsyncBufReadExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, WatchParams};
use kube::core::{Request, Status};
use kube::{Api, Resource as _};

use super::access::ClusterAccess;
use super::decode::{PodListPage, decode_pod_list, decode_watch_event};
use crate::core::{PodFacts, Selector};
use crate::pods::{Listing, PodSource, PodsError, WatchStream};

/// Default LIST page size: the apiserver's own recommendation for chunked lists, and a
/// page of full pods stays a few MB while converting.
pub const DEFAULT_PAGE_SIZE: u32 = 500;
/// How many times a LIST restarts from the beginning after its continue token expired
/// (HTTP 410) before giving up; a cluster compacting that often needs a look anyway.
pub const MAX_RESTARTS: usize = 3;
/// Consecutive pages with a continue token but no items tolerated before the listing is
/// declared incomplete (a server looping on its continue token).
pub const MAX_EMPTY_PAGES: usize = 3;

/// Reads pods through the cluster's API server.
#[derive(Clone, Debug)]
pub struct KubePods {
    access: Arc<ClusterAccess>,
    page_size: u32,
}

/// What one attempt at a whole LIST ended with.
enum Attempt {
    /// Every page, and the `resourceVersion` of the last one.
    Done(Vec<PodFacts>, String),
    /// The continue token expired mid-list; start over.
    Expired,
    /// The API server refused the token (HTTP 401): mint a new one and start over once.
    Unauthorized(kube::Error),
}

/// Whether the API server refused the bearer token: an expired or revoked token, fixed
/// by minting a new one (once; a token refused twice is an access-entry problem).
fn unauthorized(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 401)
}

impl KubePods {
    /// Pods of the cluster behind `access`, listed in pages of [`DEFAULT_PAGE_SIZE`].
    pub fn new(access: Arc<ClusterAccess>) -> Self {
        Self {
            access,
            page_size: DEFAULT_PAGE_SIZE,
        }
    }

    /// Uses pages of `page_size` pods (at least 1): smaller pages bound memory, larger
    /// ones save round trips.
    pub fn with_page_size(mut self, page_size: u32) -> Self {
        self.page_size = page_size.max(1);
        self
    }

    /// The cluster access this reads through (shared with other adapters).
    pub fn access(&self) -> &Arc<ClusterAccess> {
        &self.access
    }

    /// Every pod of `namespace` matching `selector`, like [`PodSource::list`], and the
    /// `resourceVersion` of the LIST's last page (empty if the server sent none): the
    /// version the listing is consistent at, from which a watch can continue without
    /// missing a change.
    pub async fn list_with_version(
        &self,
        namespace: &str,
        selector: Option<&Selector>,
    ) -> Result<(Vec<PodFacts>, String), PodsError> {
        let labels = selector.map(Selector::to_query).filter(|q| !q.is_empty());
        let mut restarts = 0;
        let mut reauthenticated = false;
        loop {
            let client = self.access.client().await?;
            match self
                .list_once(&client, namespace, labels.as_deref())
                .await?
            {
                Attempt::Done(facts, version) => {
                    tracing::debug!(
                        cluster = %self.access.cluster(), namespace, pods = facts.len(), restarts,
                        resource_version = %version, "listed pods"
                    );
                    return Ok((facts, version));
                }
                Attempt::Unauthorized(_) if !reauthenticated => {
                    reauthenticated = true;
                    self.reauthenticate().await;
                }
                Attempt::Unauthorized(error) => {
                    return Err(PodsError::List {
                        namespace: namespace.to_owned(),
                        reason: self.explain(&error, namespace).await,
                    });
                }
                Attempt::Expired if restarts < MAX_RESTARTS => restarts += 1,
                Attempt::Expired => {
                    return Err(PodsError::Incomplete {
                        namespace: namespace.to_owned(),
                        reason: format!(
                            "the continue token expired {} times in a row (HTTP 410); the \
                             API server compacts faster than the list completes",
                            restarts + 1
                        ),
                    });
                }
            }
        }
    }

    /// One pass over all pages; `Expired` when a continue token is gone.
    async fn list_once(
        &self,
        client: &kube::Client,
        namespace: &str,
        labels: Option<&str>,
    ) -> Result<Attempt, PodsError> {
        let incomplete = |reason: String| PodsError::Incomplete {
            namespace: namespace.to_owned(),
            reason,
        };
        // The request `Api::<Pod>::namespaced(..).list(..)` would send.
        let request = Request::new(Pod::url_path(&(), Some(namespace)));
        // One buffer for every page body: after the first page it no longer grows.
        let mut body = Vec::new();
        let mut facts = Vec::new();
        let mut continue_token: Option<String> = None;
        let mut empty_pages = 0;
        let mut pages = 0usize;
        loop {
            // No resourceVersion: a quorum read from etcd, never a possibly stale cache.
            let mut params = ListParams::default().limit(self.page_size);
            if let Some(labels) = labels {
                params = params.labels(labels);
            }
            if let Some(token) = &continue_token {
                params = params.continue_token(token);
            }
            match fetch_page(client, &request, &params, &mut body).await {
                Ok(()) => {}
                Err(kube::Error::Api(status)) if status.code == 410 && continue_token.is_some() => {
                    tracing::warn!(
                        cluster = %self.access.cluster(), namespace, pages,
                        message = %status.message,
                        "continue token expired; restarting the pod list"
                    );
                    return Ok(Attempt::Expired);
                }
                Err(error) if unauthorized(&error) => return Ok(Attempt::Unauthorized(error)),
                Err(error) => {
                    return Err(PodsError::List {
                        namespace: namespace.to_owned(),
                        reason: self.explain(&error, namespace).await,
                    });
                }
            }
            pages += 1;
            let PodListPage {
                pods,
                resource_version,
                continue_token: next,
                remaining_item_count,
            } = decode_pod_list(pages, &body).map_err(|error| PodsError::List {
                namespace: namespace.to_owned(),
                reason: format!(
                    "the Kubernetes API of cluster `{}` answered unexpectedly: {}",
                    self.access.cluster(),
                    error_chain(&error)
                ),
            })?;
            let count = pods.len();
            facts.reserve(count);
            facts.extend(pods);
            let remaining = remaining_item_count.unwrap_or(0);
            match next.filter(|t| !t.is_empty()) {
                None if remaining > 0 => {
                    return Err(incomplete(format!(
                        "page {pages} reported {remaining} more pods but no continue token"
                    )));
                }
                None => {
                    return Ok(Attempt::Done(facts, resource_version.unwrap_or_default()));
                }
                Some(next) => {
                    empty_pages = if count == 0 { empty_pages + 1 } else { 0 };
                    if empty_pages >= MAX_EMPTY_PAGES {
                        return Err(incomplete(format!(
                            "{empty_pages} pages in a row had a continue token but no pods"
                        )));
                    }
                    if continue_token.as_deref() == Some(next.as_str()) {
                        return Err(incomplete(format!(
                            "page {pages} returned the continue token it was asked with"
                        )));
                    }
                    continue_token = Some(next);
                }
            }
        }
    }

    /// Drops the cached client (and with it the token) so the next request mints a new
    /// token: what a 401 calls for.
    async fn reauthenticate(&self) {
        tracing::info!(cluster = %self.access.cluster(), "the API server refused the token; minting a new one");
        self.access.invalidate_token().await;
    }

    /// The operator-facing reason for a failed request. A transport failure (refused,
    /// timeout, TLS) also drops the cached client and endpoint, so the next call looks the
    /// endpoint and CA up again.
    async fn explain(&self, error: &kube::Error, namespace: &str) -> String {
        let cluster = self.access.cluster();
        match error {
            kube::Error::Api(status) => api_failure(cluster, namespace, status),
            kube::Error::HyperError(_) | kube::Error::Service(_) => {
                self.access.invalidate().await;
                format!(
                    "cannot reach the Kubernetes API of cluster `{cluster}`: {}; check the \
                     endpoint and network path (VPC, security groups, public access CIDRs) and \
                     that the server certificate is signed by the cluster CA",
                    error_chain(error)
                )
            }
            other => format!(
                "the Kubernetes API of cluster `{cluster}` answered unexpectedly: {}",
                error_chain(other)
            ),
        }
    }
}

/// Reads one LIST page into `body` (cleared first) through kube's raw request API, which
/// still turns an error answer into `kube::Error::Api(Status)` as `Api::list` did, but
/// hands the body over as bytes for [`decode_pod_list`] instead of typed `Pod`s.
async fn fetch_page(
    client: &kube::Client,
    request: &Request,
    params: &ListParams,
    body: &mut Vec<u8>,
) -> Result<(), kube::Error> {
    let mut http = request.list(params).map_err(kube::Error::BuildRequest)?;
    // The same marker `Api::list` sets, for layers that label requests by verb.
    http.extensions_mut().insert("list");
    let reader = client.request_stream(http).await?;
    let mut reader = std::pin::pin!(reader);
    body.clear();
    // Chunk by chunk, as the body arrives. (`read_to_end` would zero the buffer's whole
    // spare capacity before every page: megabytes per page, ~10 % of a full LIST's CPU.)
    loop {
        let chunk = reader.fill_buf().await.map_err(body_error)?;
        if chunk.is_empty() {
            return Ok(());
        }
        body.extend_from_slice(chunk);
        let read = chunk.len();
        reader.consume_unpin(read);
    }
}

/// The kube error behind a failed body read (`request_stream` wraps it in an I/O error),
/// so a connection dropped mid-page is a transport failure as it was under `Api::list`.
fn body_error(error: std::io::Error) -> kube::Error {
    if !error.get_ref().is_some_and(|e| e.is::<kube::Error>()) {
        return kube::Error::ReadEvents(error);
    }
    match error.into_inner().map(|e| e.downcast::<kube::Error>()) {
        Some(Ok(inner)) => *inner,
        Some(Err(other)) => kube::Error::ReadEvents(std::io::Error::other(other)),
        None => kube::Error::ReadEvents(std::io::Error::other("unreadable response body")),
    }
}

/// The reason for an error answer of the API server, with what to check for the two an
/// operator can fix (401: the access entry; 403: its namespace scope).
fn api_failure(cluster: &str, namespace: &str, status: &Status) -> String {
    let message = &status.message;
    match status.code {
        401 => format!(
            "HTTP 401 Unauthorized: {message}; the cluster rejected the function's token: check \
             that the EKS access entry for the function role exists in cluster `{cluster}` (the \
             stack's CreateAccessEntries) and that the cluster's authentication mode includes API"
        ),
        403 => format!(
            "HTTP 403 Forbidden: {message}; the function role is authenticated but not allowed: \
             check that its access entry's AmazonEKSViewPolicy covers namespace `{namespace}` \
             (the stack's AllowedNamespaces) in cluster `{cluster}`, or, with \
             CreateAccessEntries=false, that your RBAC grants get/list/watch on pods there"
        ),
        code if status.reason.is_empty() => format!("HTTP {code}: {message}"),
        code => format!("HTTP {code} {}: {message}", status.reason),
    }
}

/// An error with all its causes, deduplicated (wrappers often repeat their source).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

impl KubePods {
    /// Starts a watch, minting a new token once after a 401.
    async fn start_watch(
        &self,
        namespace: &str,
        labels: Option<&str>,
        resource_version: &str,
        timeout: Duration,
    ) -> Result<WatchStream, PodsError> {
        // Bookmarks are on by default (`allowWatchBookmarks=true`).
        let mut params = WatchParams::default()
            .timeout(u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX).max(1));
        if let Some(labels) = labels {
            params = params.labels(labels);
        }
        let request = Request::new(Pod::url_path(&(), Some(namespace)));
        let mut reauthenticated = false;
        loop {
            let client = self.access.client().await?;
            let mut http =
                request
                    .watch(&params, resource_version)
                    .map_err(|e| PodsError::Watch {
                        namespace: namespace.to_owned(),
                        reason: format!("building the request: {e}"),
                    })?;
            // The same marker `Api::watch` sets, for layers that label requests by verb.
            http.extensions_mut().insert("watch");
            match client.request_stream(http).await {
                Ok(body) => return Ok(watch_events(namespace.to_owned(), body)),
                Err(error) if unauthorized(&error) && !reauthenticated => {
                    reauthenticated = true;
                    self.reauthenticate().await;
                }
                Err(kube::Error::Api(status)) if status.code == 410 => {
                    return Err(PodsError::Expired {
                        namespace: namespace.to_owned(),
                        resource_version: resource_version.to_owned(),
                    });
                }
                Err(error) => {
                    return Err(PodsError::Watch {
                        namespace: namespace.to_owned(),
                        reason: self.explain(&error, namespace).await,
                    });
                }
            }
        }
    }
}

/// The events of a watch response body, one JSON object per line. A line that cannot be
/// decoded, or a body that breaks off, ends the stream with an error.
fn watch_events(
    namespace: String,
    body: impl futures::AsyncBufRead + Send + 'static,
) -> WatchStream {
    let lines = futures::AsyncBufReadExt::lines(body);
    let namespace = Arc::<str>::from(namespace);
    futures::StreamExt::boxed(futures::StreamExt::map(lines, move |line| {
        let broken = |reason: String| PodsError::Watch {
            namespace: namespace.to_string(),
            reason,
        };
        let line = line.map_err(|e| broken(format!("the stream broke off: {e}")))?;
        decode_watch_event(line.as_bytes()).map_err(|e| broken(e.to_string()))
    }))
}

impl PodSource for KubePods {
    async fn list_versioned(
        &self,
        namespace: &str,
        selector: Option<&Selector>,
    ) -> Result<Listing, PodsError> {
        let (pods, resource_version) = self.list_with_version(namespace, selector).await?;
        Ok(Listing {
            pods,
            resource_version,
        })
    }

    async fn watch(
        &self,
        namespace: &str,
        selector: Option<&Selector>,
        resource_version: &str,
        timeout: Duration,
    ) -> Result<WatchStream, PodsError> {
        let labels = selector.map(Selector::to_query).filter(|q| !q.is_empty());
        self.start_watch(namespace, labels.as_deref(), resource_version, timeout)
            .await
    }

    async fn list(
        &self,
        namespace: &str,
        selector: Option<&Selector>,
    ) -> Result<Vec<PodFacts>, PodsError> {
        self.list_with_version(namespace, selector)
            .await
            .map(|(facts, _)| facts)
    }

    async fn get(&self, namespace: &str, name: &str) -> Result<Option<Pod>, PodsError> {
        let mut reauthenticated = false;
        let result = loop {
            let client = self.access.client().await?;
            let api: Api<Pod> = Api::namespaced(client, namespace);
            match api.get_opt(name).await {
                Err(error) if unauthorized(&error) && !reauthenticated => {
                    reauthenticated = true;
                    self.reauthenticate().await;
                }
                other => break other,
            }
        };
        match result {
            Ok(pod) => Ok(pod),
            Err(error) => Err(PodsError::Get {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                reason: self.explain(&error, namespace).await,
            }),
        }
    }

    async fn node_zone(&self, name: &str) -> Result<Option<String>, PodsError> {
        self.zone_of_node(name).await
    }

    async fn set_gate(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        verdict: &crate::core::gate::GateVerdict,
        transition: bool,
    ) -> Result<(), PodsError> {
        let client = self.access.client().await?;
        let api: Api<Pod> = Api::namespaced(client, namespace);
        let now = k8s_openapi::jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let patch =
            kube::api::Patch::Strategic(crate::pods::gate_patch(&now, uid, verdict, transition));
        let mut result = api
            .patch_status(name, &kube::api::PatchParams::default(), &patch)
            .await;
        if let Err(error) = &result
            && unauthorized(error)
        {
            self.reauthenticate().await;
            let client = self.access.client().await?;
            let api: Api<Pod> = Api::namespaced(client, namespace);
            result = api
                .patch_status(name, &kube::api::PatchParams::default(), &patch)
                .await;
        }
        match result {
            Ok(_) => Ok(()),
            Err(error) => Err(PodsError::Patch {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                reason: self.explain(&error, namespace).await,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use url::Url;

    use super::*;
    use crate::eks::access::Overrides;
    use crate::eks::test_server::{self, CLOSED, Reply, Scripted};

    fn page(names: &[&str], continue_token: Option<&str>, remaining: Option<i64>) -> Reply {
        let items: Vec<_> = names
            .iter()
            .map(|n| json!({ "metadata": { "name": n, "namespace": "shop", "uid": format!("uid-{n}") } }))
            .collect();
        let mut metadata = json!({ "resourceVersion": "42" });
        if let Some(token) = continue_token {
            metadata["continue"] = json!(token);
        }
        if let Some(remaining) = remaining {
            metadata["remainingItemCount"] = json!(remaining);
        }
        let body =
            json!({ "kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items });
        (200, body.to_string())
    }

    fn status(code: u16, reason: &str, message: &str) -> Reply {
        let body = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code,
        });
        (code, body.to_string())
    }

    fn expired() -> Reply {
        status(410, "Expired", "The provided continue parameter is too old")
    }

    fn pods_over(server: &Scripted) -> KubePods {
        pods_at(server.url().clone()).with_page_size(2)
    }

    /// Pods of an API server at `url`, over plain HTTP.
    fn pods_at(url: Url) -> KubePods {
        let access = test_server::access(
            CLOSED,
            Overrides {
                endpoint: Some(url),
                ca_pem: None,
            },
        );
        KubePods::new(Arc::new(access))
    }

    fn names(facts: &[PodFacts]) -> Vec<&str> {
        facts.iter().map(|f| f.pod.name.as_str()).collect()
    }

    fn query_of(request_line: &str) -> Vec<(String, String)> {
        let target = request_line.split(' ').nth(1).unwrap();
        let url = Url::parse(&format!("http://x{target}")).unwrap();
        url.query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }

    #[tokio::test]
    async fn pages_are_followed_with_limit_selector_and_no_resource_version() {
        let server = Scripted::start(vec![
            page(&["a", "b"], Some("t1"), Some(1)),
            page(&["c"], None, None),
        ])
        .await;
        let selector = Selector::parse("app=web tier").unwrap();
        let facts = pods_over(&server)
            .list("shop", Some(&selector))
            .await
            .unwrap();
        assert_eq!(names(&facts), ["a", "b", "c"]);
        let requests = server.requests();
        assert_eq!(requests.len(), 2);
        assert!(
            requests[0].starts_with("GET /api/v1/namespaces/shop/pods?"),
            "{requests:?}"
        );
        let first = query_of(&requests[0]);
        let second = query_of(&requests[1]);
        let get = |q: &[(String, String)], k: &str| {
            q.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone())
        };
        assert_eq!(get(&first, "limit").as_deref(), Some("2"));
        assert_eq!(
            get(&first, "labelSelector").as_deref(),
            Some("app=web,tier")
        );
        assert_eq!(get(&first, "continue"), None);
        assert_eq!(get(&second, "continue").as_deref(), Some("t1"));
        assert_eq!(
            get(&second, "labelSelector").as_deref(),
            Some("app=web,tier")
        );
        for q in [&first, &second] {
            assert_eq!(get(q, "resourceVersion"), None, "{requests:?}");
            assert_eq!(get(q, "resourceVersionMatch"), None, "{requests:?}");
        }
    }

    #[tokio::test]
    async fn remaining_items_without_continue_token_is_incomplete() {
        let server = Scripted::start(vec![page(&["a", "b"], None, Some(5))]).await;
        let err = pods_over(&server).list("shop", None).await.unwrap_err();
        assert!(matches!(err, PodsError::Incomplete { .. }), "{err}");
        assert!(err.to_string().contains("5 more pods"), "{err}");
    }

    #[tokio::test]
    async fn repeated_empty_pages_are_incomplete() {
        let server = Scripted::start(vec![
            page(&[], Some("t1"), None),
            page(&[], Some("t2"), None),
            page(&[], Some("t3"), None),
        ])
        .await;
        let err = pods_over(&server).list("shop", None).await.unwrap_err();
        assert!(matches!(err, PodsError::Incomplete { .. }), "{err}");

        // Fewer empty pages than the limit are fine.
        let server = Scripted::start(vec![
            page(&[], Some("t1"), None),
            page(&[], Some("t2"), None),
            page(&["a"], None, None),
        ])
        .await;
        let facts = pods_over(&server).list("shop", None).await.unwrap();
        assert_eq!(names(&facts), ["a"]);
    }

    #[tokio::test]
    async fn a_continue_token_that_does_not_advance_is_incomplete() {
        let server = Scripted::start(vec![
            page(&["a", "b"], Some("same"), None),
            page(&["c", "d"], Some("same"), None),
        ])
        .await;
        let err = pods_over(&server).list("shop", None).await.unwrap_err();
        assert!(matches!(err, PodsError::Incomplete { .. }), "{err}");
    }

    #[tokio::test]
    async fn expired_continue_restarts_from_the_first_page() {
        let server = Scripted::start(vec![
            page(&["a", "b"], Some("t1"), None),
            expired(),
            page(&["a", "b"], Some("t2"), None),
            page(&["c"], None, None),
        ])
        .await;
        let facts = pods_over(&server).list("shop", None).await.unwrap();
        assert_eq!(
            names(&facts),
            ["a", "b", "c"],
            "no duplicates from the aborted pass"
        );
        let restarted = query_of(&server.requests()[2]);
        assert!(
            restarted.iter().all(|(k, _)| k != "continue"),
            "{restarted:?}"
        );
    }

    #[tokio::test]
    async fn gives_up_after_three_restarts() {
        let mut script = Vec::new();
        for _ in 0..=MAX_RESTARTS {
            script.push(page(&["a", "b"], Some("t1"), None));
            script.push(expired());
        }
        let server = Scripted::start(script).await;
        let err = pods_over(&server).list("shop", None).await.unwrap_err();
        assert!(matches!(err, PodsError::Incomplete { .. }), "{err}");
        assert!(err.to_string().contains("410"), "{err}");
        assert_eq!(server.requests().len(), 2 * (MAX_RESTARTS + 1));
    }

    #[tokio::test]
    async fn gone_on_the_first_page_is_a_list_error() {
        let server = Scripted::start(vec![expired()]).await;
        let err = pods_over(&server).list("shop", None).await.unwrap_err();
        assert!(matches!(err, PodsError::List { .. }), "{err}");
        assert_eq!(server.requests().len(), 1);
    }

    #[tokio::test]
    async fn errors_tell_the_operator_what_to_check() {
        let server = Scripted::start(vec![
            page(&["a", "b"], Some("t1"), None),
            status(500, "InternalError", "etcdserver: request timed out"),
            status(
                403,
                "Forbidden",
                "pods is forbidden: User \"tgsync\" cannot list resource \"pods\"",
            ),
            status(401, "Unauthorized", "Unauthorized"),
            // The one retry with a new token.
            status(401, "Unauthorized", "Unauthorized"),
        ])
        .await;
        let pods = pods_over(&server);
        let err = pods.list("shop", None).await.unwrap_err();
        let PodsError::List { reason, .. } = &err else {
            panic!("expected a list error, got {err:?}");
        };
        assert!(
            reason.contains("HTTP 500") && reason.contains("etcdserver"),
            "{reason}"
        );
        let err = pods.list("shop", None).await.unwrap_err().to_string();
        assert!(
            err.contains("403") && err.contains("AllowedNamespaces"),
            "{err}"
        );
        let err = pods.get("shop", "a").await.unwrap_err();
        assert!(matches!(err, PodsError::Get { .. }), "{err}");
        assert!(err.to_string().contains("EKS access entry"), "{err}");
    }

    #[tokio::test]
    async fn a_401_mints_a_new_token_and_retries_once() {
        let server = Scripted::start(vec![
            status(401, "Unauthorized", "Unauthorized"),
            page(&["a"], None, None),
            status(401, "Unauthorized", "Unauthorized"),
            status(401, "Unauthorized", "Unauthorized"),
        ])
        .await;
        let pods = pods_over(&server);
        let facts = pods.list("shop", None).await.unwrap();
        assert_eq!(names(&facts), ["a"]);
        assert_eq!(server.requests().len(), 2);
        // A token the cluster keeps refusing is an error after one retry, not a loop.
        let err = pods.list("shop", None).await.unwrap_err().to_string();
        assert!(err.contains("401"), "{err}");
        assert_eq!(server.requests().len(), 4);
    }

    #[tokio::test]
    async fn get_returns_none_for_a_missing_pod() {
        let pod = json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "a", "namespace": "shop" } });
        let server = Scripted::start(vec![
            status(404, "NotFound", "pods \"gone\" not found"),
            (200, pod.to_string()),
        ])
        .await;
        let pods = pods_over(&server);
        assert!(pods.get("shop", "gone").await.unwrap().is_none());
        let found = pods.get("shop", "a").await.unwrap().unwrap();
        assert_eq!(found.metadata.name.as_deref(), Some("a"));
        assert!(server.requests()[0].starts_with("GET /api/v1/namespaces/shop/pods/gone "));
    }

    #[tokio::test]
    async fn unreachable_server_is_a_list_error_that_names_the_cause() {
        let server = Scripted::start(vec![]).await;
        let url = server.url().clone();
        drop(server);
        let err = pods_at(url).list("shop", None).await.unwrap_err();
        let PodsError::List { reason, .. } = &err else {
            panic!("expected a list error, got {err:?}");
        };
        assert!(
            reason.contains("cannot reach the Kubernetes API"),
            "{reason}"
        );
    }

    #[tokio::test]
    async fn list_with_version_gives_the_resource_version_of_the_last_page() {
        let versioned = |reply: Reply, version: &str| {
            let mut body: serde_json::Value = serde_json::from_str(&reply.1).unwrap();
            body["metadata"]["resourceVersion"] = json!(version);
            (reply.0, body.to_string())
        };
        let server = Scripted::start(vec![
            versioned(page(&["a", "b"], Some("t1"), None), "41"),
            versioned(page(&["c"], None, None), "43"),
            page(&["d"], None, None),
        ])
        .await;
        let pods = pods_over(&server);
        let (facts, version) = pods.list_with_version("shop", None).await.unwrap();
        assert_eq!(names(&facts), ["a", "b", "c"]);
        assert_eq!(version, "43");
        let (facts, version) = pods.list_with_version("shop", None).await.unwrap();
        assert_eq!(names(&facts), ["d"]);
        assert_eq!(version, "42");
    }

    #[tokio::test]
    async fn realistic_pods_are_read_as_take_from_reads_them() {
        let built: Vec<Pod> = (0..5)
            .map(|i| {
                crate::testkit::PodBuilder::new("shop", &format!("web-{i}"))
                    .label("app", "web")
                    .ip(&format!("10.0.0.{i}"))
                    .ready(i != 2)
                    .realistic()
                    .build()
            })
            .collect();
        let body = json!({ "kind": "PodList", "apiVersion": "v1",
                           "metadata": { "resourceVersion": "7" }, "items": built });
        let server = Scripted::start(vec![(200, body.to_string())]).await;
        let (facts, version) = pods_over(&server)
            .list_with_version("shop", None)
            .await
            .unwrap();
        let expected: Vec<PodFacts> = built.into_iter().map(PodFacts::from_pod).collect();
        assert_eq!(facts, expected);
        assert_eq!(version, "7");
    }

    #[tokio::test]
    async fn a_page_that_is_not_a_pod_list_is_a_list_error_naming_the_page() {
        let server = Scripted::start(vec![
            (
                200,
                r#"{"kind":"Status","apiVersion":"v1","code":200}"#.to_owned(),
            ),
            page(&["a", "b"], Some("t1"), None),
            (200, r#"{"items":[{"metadata":{"name":"c"}}"#.to_owned()),
        ])
        .await;
        let pods = pods_over(&server);
        let err = pods.list("shop", None).await.unwrap_err();
        let PodsError::List { reason, .. } = &err else {
            panic!("expected a list error, got {err:?}");
        };
        assert!(
            reason.contains("answered unexpectedly")
                && reason.contains("page 1")
                && reason.contains("missing field `items`"),
            "{reason}"
        );
        let err = pods.list("shop", None).await.unwrap_err().to_string();
        assert!(
            err.contains("page 2") && err.contains("EOF while parsing"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_body_cut_short_is_a_transport_failure() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head).await.unwrap();
            let partial = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                           content-length: 1000\r\n\r\n{\"items\":[";
            stream.write_all(partial.as_bytes()).await.unwrap();
            stream.shutdown().await.unwrap();
        });
        let err = pods_at(url).list("shop", None).await.unwrap_err();
        server.await.unwrap();
        let PodsError::List { reason, .. } = &err else {
            panic!("expected a list error, got {err:?}");
        };
        assert!(
            reason.contains("cannot reach the Kubernetes API"),
            "{reason}"
        );
    }

    #[test]
    fn error_chain_skips_repeats() {
        let inner = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        let outer = kube::Error::Service(Box::new(inner));
        let text = error_chain(&outer);
        assert_eq!(text.matches("UnknownIssuer").count(), 1, "{text}");
    }
}
