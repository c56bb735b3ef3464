//! HTTP(S) serving and routing of the emulated `core/v1` pod endpoints.
//!
//! Order of checks per request, as in the apiserver's filter chain:
//! authentication (401) → injected faults → routing (404/405) → handler.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::service::service_fn;
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIResource, APIResourceList, APIVersions, ListMeta, ServerAddressByClientCIDR,
};
use k8s_openapi::apimachinery::pkg::version::Info;
use serde::Serialize;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::auth::Verifier;
use crate::clock;
use crate::faults::{Faults, RequestRecord};
use crate::paging::{self, ListRequest};
use crate::patch;
use crate::pods::{self, Subresource};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{Change, Store};
use crate::watch::{self, EventStream, WatchCut, WatchSettings, query_bool};

/// The apiserver's default request body limit (3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// A response body: a whole JSON document, or a watch's event stream.
pub(crate) enum ApiBody {
    Full(Full<Bytes>),
    Watch(EventStream),
}

impl Body for ApiBody {
    type Data = Bytes;
    type Error = WatchCut;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, WatchCut>>> {
        match self.get_mut() {
            ApiBody::Full(full) => Pin::new(full)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            ApiBody::Watch(stream) => Pin::new(stream).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ApiBody::Full(full) => full.is_end_stream(),
            ApiBody::Watch(stream) => stream.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ApiBody::Full(full) => full.size_hint(),
            ApiBody::Watch(stream) => stream.size_hint(),
        }
    }
}

type Resp = Response<ApiBody>;

/// Everything a request handler needs.
pub(crate) struct AppState {
    pub store: Store,
    pub faults: Faults,
    pub verifier: Verifier,
    pub address: SocketAddr,
    /// Honour grace periods on DELETE (see `EmulatorConfig::graceful_delete`).
    pub graceful_delete: bool,
    pub watch: WatchSettings,
}

/// Accepts connections until the task is aborted; dropping this future
/// (abort) drops the connection set, closing every connection.
pub(crate) async fn serve(
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    state: Arc<AppState>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let acceptor = acceptor.clone();
                    let state = Arc::clone(&state);
                    connections.spawn(serve_connection(stream, acceptor, state));
                }
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    acceptor: Option<TlsAcceptor>,
    state: Arc<AppState>,
) {
    let service = service_fn(move |req| handle(Arc::clone(&state), req));
    let http = hyper::server::conn::http1::Builder::new();
    let result = match acceptor {
        Some(acceptor) => match acceptor.accept(stream).await {
            Ok(tls) => http.serve_connection(TokioIo::new(tls), service).await,
            Err(error) => {
                tracing::debug!(%error, "TLS handshake failed");
                return;
            }
        },
        None => http.serve_connection(TokioIo::new(stream), service).await,
    };
    if let Err(error) = result {
        tracing::debug!(%error, "connection ended with an error");
    }
}

/// Answers one request and records it in the request log.
pub(crate) async fn handle(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Resp, Infallible> {
    let method = req.method().clone();
    let path_and_query = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_owned(), |pq| pq.as_str().to_owned());
    let authenticated = match req.headers().get(AUTHORIZATION) {
        None => None,
        Some(value) => {
            let verdict = state
                .verifier
                .verify_authorization(value.to_str().ok(), SystemTime::now());
            match verdict {
                Ok(caller) => {
                    tracing::trace!(access_key_id = %caller.access_key_id, "authenticated");
                    Some(true)
                }
                Err(reason) => {
                    tracing::warn!(%method, path = %req.uri().path(), %reason, "rejected bearer token");
                    Some(false)
                }
            }
        }
    };
    let response = match respond(&state, req, authenticated).await {
        Ok(response) => response,
        Err(error) => error_response(&error),
    };
    tracing::debug!(%method, %path_and_query, status = response.status().as_u16(), "request");
    state.faults.record(RequestRecord {
        method: method.to_string(),
        path_and_query,
        authenticated: authenticated == Some(true),
        status: response.status().as_u16(),
    });
    Ok(response)
}

fn response(status: u16, content_type: &'static str, body: Vec<u8>) -> Resp {
    let mut resp = Response::new(ApiBody::Full(Full::new(Bytes::from(body))));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    resp
}

fn json_response(status: u16, value: &impl Serialize) -> Result<Resp, ApiError> {
    let body = serde_json::to_vec(value).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(response(status, "application/json", body))
}

fn error_response(error: &ApiError) -> Resp {
    let body = serde_json::to_vec(&error.to_status()).unwrap_or_default();
    let mut resp = response(error.code, "application/json", body);
    if let Some(seconds) = error.retry_after {
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    resp
}

/// Splits a query string into its parameters; the first value wins, as
/// with Go's `url.Values.Get`.
fn parse_query(query: Option<&str>) -> HashMap<String, String> {
    let mut params = HashMap::new();
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        params
            .entry(k.into_owned())
            .or_insert_with(|| v.into_owned());
    }
    params
}

/// The routes this emulator serves.
enum Route<'a> {
    Health,
    Version,
    ApiVersions,
    ApiResources,
    AllPods,
    NamespacePods(&'a str),
    Pod(&'a str, &'a str),
    PodStatus(&'a str, &'a str),
    Node(&'a str),
}

impl Route<'_> {
    fn is_public(&self) -> bool {
        matches!(self, Route::Health | Route::Version)
    }
}

fn route(path: &str) -> Option<Route<'_>> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    Some(match segments.as_slice() {
        ["healthz" | "livez" | "readyz"] => Route::Health,
        ["version"] => Route::Version,
        ["api"] => Route::ApiVersions,
        ["api", "v1"] => Route::ApiResources,
        ["api", "v1", "pods"] => Route::AllPods,
        ["api", "v1", "nodes", name] if !name.is_empty() => Route::Node(name),
        ["api", "v1", "namespaces", ns, "pods"] if !ns.is_empty() => Route::NamespacePods(ns),
        ["api", "v1", "namespaces", ns, "pods", name] if !ns.is_empty() && !name.is_empty() => {
            Route::Pod(ns, name)
        }
        ["api", "v1", "namespaces", ns, "pods", name, "status"]
            if !ns.is_empty() && !name.is_empty() =>
        {
            Route::PodStatus(ns, name)
        }
        _ => return None,
    })
}

async fn respond(
    state: &AppState,
    req: Request<Incoming>,
    authenticated: Option<bool>,
) -> Result<Resp, ApiError> {
    let path = req.uri().path().to_owned();
    let route = route(&path);
    let public = route.as_ref().is_some_and(Route::is_public);
    // Authentication runs first: a bad token is 401 everywhere, no token is
    // 401 everywhere but the public health and version endpoints.
    match authenticated {
        Some(true) => {}
        Some(false) => return Err(ApiError::unauthorized()),
        None if public => {}
        None => return Err(ApiError::unauthorized()),
    }
    if let Some(code) = state.faults.fail_all_status() {
        return Err(ApiError::generic(code));
    }
    let Some(route) = route else {
        return Err(ApiError::path_not_found());
    };
    let method = req.method().clone();
    let query = parse_query(req.uri().query());
    let headers = req.headers().clone();
    match (route, method) {
        (Route::Health, Method::GET) => {
            Ok(response(200, "text/plain; charset=utf-8", b"ok".to_vec()))
        }
        (Route::Version, Method::GET) => json_response(200, &version_info()),
        (Route::ApiVersions, Method::GET) => json_response(200, &api_versions(state.address)),
        (Route::ApiResources, Method::GET) => json_response(200, &api_resources()),
        (Route::AllPods, Method::GET) => list_pods(state, None, &query),
        (Route::Node(name), Method::GET) => {
            let node = state
                .store
                .get_node(name)
                .ok_or_else(|| ApiError::node_not_found(name))?;
            json_response(200, &node)
        }
        (Route::NamespacePods(ns), Method::GET) => list_pods(state, Some(ns), &query),
        (Route::NamespacePods(ns), Method::POST) => {
            let body = read_body(req).await?;
            create_pod(state, ns, &body)
        }
        (Route::Pod(ns, name), Method::GET) | (Route::PodStatus(ns, name), Method::GET) => {
            get_pod(state, ns, name)
        }
        (Route::Pod(ns, name), Method::PUT) => {
            let body = read_body(req).await?;
            replace_pod(state, ns, name, &body, Subresource::Main)
        }
        (Route::PodStatus(ns, name), Method::PUT) => {
            let body = read_body(req).await?;
            replace_pod(state, ns, name, &body, Subresource::Status)
        }
        (Route::Pod(ns, name), Method::PATCH) => {
            let body = read_body(req).await?;
            patch_pod(state, ns, name, &headers, &body, Subresource::Main)
        }
        (Route::PodStatus(ns, name), Method::PATCH) => {
            let body = read_body(req).await?;
            patch_pod(state, ns, name, &headers, &body, Subresource::Status)
        }
        (Route::Pod(ns, name), Method::DELETE) => {
            let body = read_body(req).await?;
            delete_pod(state, ns, name, &body, &query)
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, ApiError> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error)
            if error
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError::too_large())
        }
        Err(error) => Err(ApiError::bad_request(format!(
            "error reading the request body: {error}"
        ))),
    }
}

fn version_info() -> Info {
    Info {
        major: "1".to_owned(),
        minor: "33".to_owned(),
        git_version: "v1.33.0-eks-kube-emulator".to_owned(),
        git_commit: "0000000000000000000000000000000000000000".to_owned(),
        git_tree_state: "clean".to_owned(),
        build_date: "2025-01-01T00:00:00Z".to_owned(),
        go_version: "go1.24.0".to_owned(),
        compiler: "gc".to_owned(),
        platform: "linux/amd64".to_owned(),
        ..Info::default()
    }
}

fn api_versions(address: SocketAddr) -> APIVersions {
    APIVersions {
        server_address_by_client_cidrs: vec![ServerAddressByClientCIDR {
            client_cidr: "0.0.0.0/0".to_owned(),
            server_address: address.to_string(),
        }],
        versions: vec!["v1".to_owned()],
    }
}

fn api_resources() -> APIResourceList {
    let verbs = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
    APIResourceList {
        group_version: "v1".to_owned(),
        resources: vec![
            APIResource {
                kind: "Pod".to_owned(),
                name: "pods".to_owned(),
                namespaced: true,
                short_names: Some(vec!["po".to_owned()]),
                singular_name: "pod".to_owned(),
                verbs: verbs(&[
                    "create", "delete", "get", "list", "patch", "update", "watch",
                ]),
                ..APIResource::default()
            },
            APIResource {
                kind: "Node".to_owned(),
                name: "nodes".to_owned(),
                namespaced: false,
                short_names: Some(vec!["no".to_owned()]),
                singular_name: "node".to_owned(),
                verbs: verbs(&["get"]),
                ..APIResource::default()
            },
            APIResource {
                kind: "Pod".to_owned(),
                name: "pods/status".to_owned(),
                namespaced: true,
                singular_name: String::new(),
                verbs: verbs(&["get", "patch", "update"]),
                ..APIResource::default()
            },
        ],
    }
}

/// A pod as a list item: no per-item `kind`/`apiVersion`, as the apiserver
/// sends them.
fn list_item(pod: &Pod) -> Result<Value, ApiError> {
    let mut value = serde_json::to_value(pod).map_err(|e| ApiError::internal(e.to_string()))?;
    if let Value::Object(map) = &mut value {
        map.remove("kind");
        map.remove("apiVersion");
    }
    Ok(value)
}

#[derive(Serialize)]
struct PodListBody {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: ListMeta,
    items: Vec<Value>,
}

fn list_pods(
    state: &AppState,
    namespace: Option<&str>,
    query: &HashMap<String, String>,
) -> Result<Resp, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if query.get("watch").is_some_and(|w| query_bool(w)) {
        let stream = watch::watch_pods(
            &state.store,
            state.watch,
            &state.faults,
            namespace,
            labels,
            fields,
            query,
        )?;
        let mut resp = Response::new(ApiBody::Watch(stream));
        let headers = resp.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
        return Ok(resp);
    }
    let limit = match query.get("limit").filter(|l| !l.is_empty()) {
        None => None,
        Some(l) => Some(l.parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!("strconv.ParseInt: parsing {l:?}: invalid syntax"))
        })?),
    };
    let continue_token = query.get("continue").filter(|c| !c.is_empty()).cloned();
    let has_continue = continue_token.is_some();
    let request = ListRequest {
        namespace: namespace.map(str::to_owned),
        labels,
        fields,
        limit,
        continue_token,
        resource_version: query.get("resourceVersion").cloned(),
        resource_version_match: query.get("resourceVersionMatch").cloned(),
    };
    if let Some(code) = state.faults.list_page_fault(has_continue) {
        return Err(ApiError::generic(code));
    }
    let expire = state.faults.take_expire(has_continue);
    let page = paging::list(&state.store, &request, expire)?;
    let items = page
        .items
        .iter()
        .map(|p| list_item(p))
        .collect::<Result<Vec<_>, _>>()?;
    json_response(
        200,
        &PodListBody {
            kind: "PodList",
            api_version: "v1",
            metadata: ListMeta {
                continue_: page.continue_token,
                remaining_item_count: page.remaining_item_count,
                resource_version: Some(page.resource_version.to_string()),
                self_link: None,
            },
            items,
        },
    )
}

fn get_pod(state: &AppState, namespace: &str, name: &str) -> Result<Resp, ApiError> {
    let pod = state
        .store
        .get_pod(namespace, name)
        .ok_or_else(|| ApiError::pod_not_found(name))?;
    json_response(200, &pod)
}

fn create_pod(state: &AppState, namespace: &str, body: &[u8]) -> Result<Resp, ApiError> {
    let pod = pods::prepare_create(pods::decode_pod(body)?, namespace)?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let stored = state.store.modify(namespace, &name, |old| match old {
        Some(_) => Err(ApiError::already_exists(&name)),
        None => Ok(Change::Put(Box::new(pod))),
    })?;
    let stored = stored.ok_or_else(|| ApiError::internal("the created pod was not stored"))?;
    json_response(201, &stored)
}

fn replace_pod(
    state: &AppState,
    namespace: &str,
    name: &str,
    body: &[u8],
    sub: Subresource,
) -> Result<Resp, ApiError> {
    let mut pod = pods::decode_pod(body)?;
    pods::check_identity(&mut pod, namespace, Some(name))?;
    let stored = state.store.modify(namespace, name, |old| {
        let old = old.ok_or_else(|| ApiError::pod_not_found(name))?;
        pods::check_uid_precondition(old, &pod, namespace)?;
        pods::prepare_update(old, pod, sub)
    })?;
    let stored = stored.ok_or_else(|| ApiError::pod_not_found(name))?;
    json_response(200, &stored)
}

#[derive(Clone, Copy)]
enum PatchType {
    Json,
    Merge,
    Strategic,
}

fn patch_pod(
    state: &AppState,
    namespace: &str,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
    sub: Subresource,
) -> Result<Resp, ApiError> {
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let media_type = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let patch_type = match media_type.as_str() {
        "application/json-patch+json" => PatchType::Json,
        "application/merge-patch+json" => PatchType::Merge,
        "application/strategic-merge-patch+json" => PatchType::Strategic,
        _ => return Err(ApiError::unsupported_patch_type(content_type)),
    };
    let patch: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let stored = state.store.modify(namespace, name, |old| {
        let old = old.ok_or_else(|| ApiError::pod_not_found(name))?;
        let mut doc = serde_json::to_value(old).map_err(|e| ApiError::internal(e.to_string()))?;
        let applied = match patch_type {
            PatchType::Json => patch::json_patch(&mut doc, &patch),
            PatchType::Merge => {
                patch::merge_patch(&mut doc, &patch);
                Ok(())
            }
            PatchType::Strategic => patch::strategic_merge_patch(&mut doc, &patch),
        };
        applied.map_err(|e| ApiError::invalid(name, vec![("patch".to_owned(), e)]))?;
        let mut new = pods::pod_from_value(doc)?;
        pods::check_identity(&mut new, namespace, Some(name))?;
        pods::prepare_update(old, new, sub)
    })?;
    let stored = stored.ok_or_else(|| ApiError::pod_not_found(name))?;
    json_response(200, &stored)
}

/// What a DELETE asked for: `DeleteOptions` from the body, or from the
/// query when the body is empty (`handlers/delete.go`).
struct DeleteRequest {
    grace_period_seconds: Option<i64>,
    uid: Option<String>,
    resource_version: Option<String>,
}

impl DeleteRequest {
    fn parse(body: &[u8], query: &HashMap<String, String>) -> Result<Self, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            let grace_period_seconds = match query.get("gracePeriodSeconds") {
                None => None,
                Some(g) => Some(g.parse::<i64>().map_err(|_| {
                    ApiError::bad_request(format!(
                        "strconv.ParseInt: parsing {g:?}: invalid syntax"
                    ))
                })?),
            };
            return Ok(Self {
                grace_period_seconds,
                uid: None,
                resource_version: None,
            });
        }
        let options: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
        let precondition = |field: &str| {
            options
                .get("preconditions")
                .and_then(|p| p.get(field))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let grace_period_seconds = match options.get("gracePeriodSeconds") {
            None | Some(Value::Null) => None,
            Some(g) => Some(g.as_i64().ok_or_else(|| {
                ApiError::bad_request(format!(
                    "error decoding DeleteOptions: gracePeriodSeconds must be an integer, got {g}"
                ))
            })?),
        };
        Ok(Self {
            grace_period_seconds,
            uid: precondition("uid"),
            resource_version: precondition("resourceVersion"),
        })
    }
}

/// `rest.BeforeDelete` with the pod strategy's `CheckGracefulDelete`:
/// whether this DELETE removes the pod now, marks it terminating, shortens
/// its grace period, or leaves an ongoing graceful deletion alone.
fn graceful_delete(old: &Pod, grace_period_seconds: Option<i64>) -> Change {
    // Negative grace periods count as one second on the delete path.
    let requested = grace_period_seconds.map(|g| if g < 0 { 1 } else { g });
    if let Some(deletion_timestamp) = &old.metadata.deletion_timestamp {
        let current = old.metadata.deletion_grace_period_seconds.unwrap_or(0);
        if current == 0 {
            return Change::Delete;
        }
        return match requested {
            // Only a shorter grace period may be given.
            Some(period) if period < current => {
                if period == 0 {
                    return Change::Delete;
                }
                let mut pod = old.clone();
                pod.metadata.deletion_timestamp =
                    Some(clock::shift(deletion_timestamp, period - current));
                pod.metadata.deletion_grace_period_seconds = Some(period);
                Change::Put(Box::new(pod))
            }
            _ => Change::Keep,
        };
    }
    let spec = old.spec.as_ref();
    let mut period = requested
        .or_else(|| spec.and_then(|s| s.termination_grace_period_seconds))
        .unwrap_or(0);
    // An unscheduled pod, or one that has already terminated, goes at once.
    if spec
        .and_then(|s| s.node_name.as_deref())
        .is_none_or(str::is_empty)
    {
        period = 0;
    }
    if matches!(
        old.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        period = 0;
    }
    if period < 0 {
        period = 1;
    }
    if period == 0 {
        return Change::Delete;
    }
    let mut pod = old.clone();
    pod.metadata.deletion_timestamp = Some(clock::k8s_time_after(period));
    pod.metadata.deletion_grace_period_seconds = Some(period);
    if let Some(generation) = pod.metadata.generation.filter(|g| *g > 0) {
        pod.metadata.generation = Some(generation + 1);
    }
    Change::Put(Box::new(pod))
}

fn delete_pod(
    state: &AppState,
    namespace: &str,
    name: &str,
    body: &[u8],
    query: &HashMap<String, String>,
) -> Result<Resp, ApiError> {
    let request = DeleteRequest::parse(body, query)?;
    let result = state.store.modify(namespace, name, |old| {
        let old = old.ok_or_else(|| ApiError::pod_not_found(name))?;
        let uid = old.metadata.uid.clone().unwrap_or_default();
        let rv = old.metadata.resource_version.clone().unwrap_or_default();
        // `rest.BeforeDelete` checks the preconditions first, in its words.
        if let Some(want) = request.uid.as_ref().filter(|w| **w != uid) {
            return Err(ApiError::delete_precondition_failed(
                name,
                &format!("the UID in the precondition ({want}) does not match the UID in record ({uid}). The object might have been deleted and then recreated"),
            ));
        }
        if let Some(want) = request.resource_version.as_ref().filter(|w| **w != rv) {
            return Err(ApiError::delete_precondition_failed(
                name,
                &format!("the ResourceVersion in the precondition ({want}) does not match the ResourceVersion in record ({rv}). The object might have been modified"),
            ));
        }
        if state.graceful_delete {
            Ok(graceful_delete(old, request.grace_period_seconds))
        } else {
            Ok(Change::Delete)
        }
    })?;
    // The removed pod, or the pod as it now is while it terminates.
    let pod = result.ok_or_else(|| ApiError::pod_not_found(name))?;
    json_response(200, &pod)
}
#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: Option<&str>, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "default", "generation": 1},
            "spec": {"containers": [{"name": "app", "image": "nginx"}],
                     "nodeName": node, "terminationGracePeriodSeconds": 30},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn terminating(change: Change) -> Pod {
        match change {
            Change::Put(pod) => *pod,
            other => panic!("expected a write, got {other:?}"),
        }
    }

    #[test]
    fn graceful_delete_follows_before_delete() {
        let running = pod(Some("node-1"), "Running");
        let marked = terminating(graceful_delete(&running, None));
        assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));
        assert_eq!(marked.metadata.generation, Some(2));
        let at = marked.metadata.deletion_timestamp.clone().unwrap();

        // An explicit grace period wins; negative counts as one second.
        let quick = terminating(graceful_delete(&running, Some(5)));
        assert_eq!(quick.metadata.deletion_grace_period_seconds, Some(5));
        let negative = terminating(graceful_delete(&running, Some(-3)));
        assert_eq!(negative.metadata.deletion_grace_period_seconds, Some(1));

        // Zero, unscheduled and finished pods go at once.
        assert!(matches!(graceful_delete(&running, Some(0)), Change::Delete));
        assert!(matches!(
            graceful_delete(&pod(None, "Pending"), None),
            Change::Delete
        ));
        assert!(matches!(
            graceful_delete(&pod(Some("node-1"), "Succeeded"), None),
            Change::Delete
        ));

        // While terminating: a longer or equal period changes nothing, a
        // shorter one moves the deadline earlier, zero deletes.
        assert!(matches!(graceful_delete(&marked, None), Change::Keep));
        assert!(matches!(graceful_delete(&marked, Some(60)), Change::Keep));
        let shorter = terminating(graceful_delete(&marked, Some(10)));
        assert_eq!(shorter.metadata.deletion_grace_period_seconds, Some(10));
        assert_eq!(
            shorter.metadata.deletion_timestamp,
            Some(clock::shift(&at, -20))
        );
        assert!(matches!(graceful_delete(&marked, Some(0)), Change::Delete));
        let mut zero = marked.clone();
        zero.metadata.deletion_grace_period_seconds = Some(0);
        assert!(matches!(graceful_delete(&zero, None), Change::Delete));
    }
}
