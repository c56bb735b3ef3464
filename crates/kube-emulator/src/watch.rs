//! WATCH of pods, served the way the apiserver's watch cache serves it
//! (`staging/src/k8s.io/apiserver/pkg/storage/cacher`, streamed by
//! `endpoints/handlers/watch.go`): one JSON object per line,
//! `{"type":…,"object":…}`, in a chunked HTTP 200 body.
//!
//! - `resourceVersion` unset or `"0"`: synthetic ADDED events for the
//!   matching pods of the current state, then every later change.
//! - `resourceVersion=N`: every change after N, replayed from the retained
//!   history, then live. If N is older than the history, the answer is
//!   still HTTP 200 with one ERROR event carrying a 410 `Expired` Status
//!   (`too old resource version: N (M)`), and the stream ends: once a
//!   watch has passed authentication, admission and parameter parsing,
//!   the cacher turns such errors into an ERROR event rather than an HTTP
//!   error (`cacher.go`: "other errors must fail with a watch event of type
//!   ERROR"; `watch_cache.go` `getAllEventsSinceLocked` words the message).
//!   A LIST at a compacted resourceVersion answers 410 directly instead.
//! - Selectors are applied per event as `cacheWatcher.convertToWatchEvent`
//!   does: a pod that starts matching is ADDED, one that keeps matching is
//!   MODIFIED, and one that stops matching (or is deleted) is DELETED with
//!   its previous state and the event's resourceVersion.
//! - `allowWatchBookmarks=true`: BOOKMARK events carrying only the current
//!   resourceVersion, periodically and once more when the watch times out.
//! - `sendInitialEvents=true` (with `resourceVersionMatch=NotOlderThan` and
//!   bookmarks, as validation demands): the current state as ADDED events,
//!   then a BOOKMARK annotated `k8s.io/initial-events-end: "true"`.
//! - `timeoutSeconds`: the stream ends cleanly after that long; without it
//!   after a random time between the server's minimum request timeout and
//!   twice that (`handlers/get.go`).

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, SizeHint};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior, Sleep};

use crate::faults::Faults;
use crate::paging::invalid_list_options;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{Batch, EventKind, Expired, Snapshot, Store, StoreEvent, Updates};

/// The annotation of the bookmark that ends the initial events of a
/// `sendInitialEvents=true` watch (`metav1.InitialEventsAnnotationKey`).
pub const INITIAL_EVENTS_END_ANNOTATION: &str = "k8s.io/initial-events-end";

/// Events buffered between the watcher task and the connection.
const CHANNEL_CAPACITY: usize = 64;

/// How long a cut stream waits after its last event before breaking the
/// connection, so the events before the cut reach the client first.
const CUT_FLUSH_DELAY: Duration = Duration::from_millis(50);

/// How the server paces and bounds watches.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WatchSettings {
    pub bookmark_interval: Duration,
    pub min_request_timeout: Duration,
}

/// The error a cut watch body ends with: the connection is dropped without
/// the final chunk.
#[derive(Debug, thiserror::Error)]
#[error("watch stream cut by an injected fault")]
pub(crate) struct WatchCut;

enum Message {
    Line(Bytes),
    Cut,
}

/// A chunked response body fed by a watcher task.
pub(crate) struct EventStream {
    rx: mpsc::Receiver<Message>,
    cut: Option<Pin<Box<Sleep>>>,
}

impl Body for EventStream {
    type Data = Bytes;
    type Error = WatchCut;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, WatchCut>>> {
        let this = self.get_mut();
        loop {
            if let Some(delay) = this.cut.as_mut() {
                // Returning Pending first lets the connection flush what it
                // has buffered; the error then drops the connection.
                ready!(delay.as_mut().poll(cx));
                return Poll::Ready(Some(Err(WatchCut)));
            }
            match ready!(this.rx.poll_recv(cx)) {
                Some(Message::Line(line)) => return Poll::Ready(Some(Ok(Frame::data(line)))),
                Some(Message::Cut) => {
                    this.cut = Some(Box::pin(tokio::time::sleep(CUT_FLUSH_DELAY)));
                }
                None => return Poll::Ready(None),
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// What a watch was asked for, from the query.
#[derive(Debug)]
struct WatchOptions {
    resource_version: String,
    resource_version_match: String,
    allow_bookmarks: bool,
    send_initial_events: Option<bool>,
    timeout_seconds: Option<i64>,
}

/// `Convert_Slice_string_To_bool` of the apiserver's query decoding: any
/// value but `0` and `false` (any case) is true, even an empty one.
pub(crate) fn query_bool(value: &str) -> bool {
    !(value == "0" || value.eq_ignore_ascii_case("false"))
}

impl WatchOptions {
    fn parse(query: &HashMap<String, String>) -> Result<Self, ApiError> {
        let timeout_seconds = match query.get("timeoutSeconds") {
            None => None,
            Some(t) => Some(t.parse::<i64>().map_err(|_| {
                ApiError::bad_request(format!("strconv.ParseInt: parsing {t:?}: invalid syntax"))
            })?),
        };
        let options = Self {
            resource_version: query.get("resourceVersion").cloned().unwrap_or_default(),
            resource_version_match: query
                .get("resourceVersionMatch")
                .cloned()
                .unwrap_or_default(),
            allow_bookmarks: query
                .get("allowWatchBookmarks")
                .is_some_and(|v| query_bool(v)),
            send_initial_events: query.get("sendInitialEvents").map(|v| query_bool(v)),
            timeout_seconds,
        };
        options.validate()?;
        Ok(options)
    }

    /// `validateWatchOptions` of `metainternalversion/validation` (with the
    /// WatchList feature on, as in 1.33): 422 on the first failure.
    fn validate(&self) -> Result<(), ApiError> {
        let rv_match = self.resource_version_match.as_str();
        if self.send_initial_events.is_some() {
            if rv_match != "NotOlderThan" {
                return Err(invalid_list_options(
                    "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            if !self.allow_bookmarks {
                return Err(invalid_list_options(
                    "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
                ));
            }
        }
        if !rv_match.is_empty() {
            if self.send_initial_events.is_none() {
                return Err(invalid_list_options(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            if rv_match != "NotOlderThan" {
                return Err(invalid_list_options(&format!(
                    "resourceVersionMatch: Unsupported value: \"{rv_match}\": supported values: \"NotOlderThan\""
                )));
            }
        }
        Ok(())
    }

    /// The parsed resourceVersion (`""` counts as 0). A malformed one fails
    /// as the cacher's `ParseResourceVersion` does: a storage error the
    /// handler cannot map, hence 500 with the field error as message.
    fn parsed_resource_version(&self) -> Result<u64, ApiError> {
        let rv = self.resource_version.as_str();
        if rv.is_empty() {
            return Ok(0);
        }
        rv.parse::<u64>().map_err(|_| ApiError {
            code: 500,
            reason: "",
            message: format!(
                "resourceVersion: Invalid value: {rv:?}: strconv.ParseUint: parsing {rv:?}: invalid syntax"
            ),
            details: None,
            list_continue: None,
            retry_after: None,
        })
    }

    fn timeout(&self, settings: WatchSettings) -> Duration {
        match self.timeout_seconds {
            Some(seconds) if seconds != 0 => {
                Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
            }
            // `handlers/get.go`: minRequestTimeout × (1 + rand[0,1)).
            _ => settings.min_request_timeout.mul_f64(1.0 + fastrand::f64()),
        }
    }
}

/// Which pods a watcher is interested in.
#[derive(Clone, Debug)]
struct Filter {
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn matches(&self, pod: &Pod) -> bool {
        let in_namespace = self
            .namespace
            .as_deref()
            .is_none_or(|ns| pod.metadata.namespace.as_deref() == Some(ns));
        in_namespace
            && (self.labels.is_empty() || {
                let empty = BTreeMap::new();
                self.labels
                    .matches(pod.metadata.labels.as_ref().unwrap_or(&empty))
            })
            && self.fields.matches(pod)
    }

    /// `cacheWatcher.convertToWatchEvent`: the event this watcher sees for
    /// a change, if any.
    fn convert(&self, event: &StoreEvent) -> Option<(&'static str, Arc<Pod>)> {
        let current = event.kind != EventKind::Deleted && self.matches(&event.object);
        let previous = event.prev.as_deref().is_some_and(|p| self.matches(p));
        match (current, previous) {
            (true, false) => Some(("ADDED", Arc::clone(&event.object))),
            (true, true) => Some(("MODIFIED", Arc::clone(&event.object))),
            (false, true) => {
                // The previous content, with the event's resourceVersion.
                let mut old = event.prev.as_deref().cloned()?;
                old.metadata.resource_version = Some(event.revision.to_string());
                Some(("DELETED", Arc::new(old)))
            }
            (false, false) => None,
        }
    }
}

#[derive(Serialize)]
struct WatchEventBody<'a, T: Serialize> {
    #[serde(rename = "type")]
    type_: &'a str,
    object: &'a T,
}

fn line(type_: &str, object: &impl Serialize) -> Result<Bytes, ApiError> {
    let mut bytes = serde_json::to_vec(&WatchEventBody { type_, object })
        .map_err(|e| ApiError::internal(e.to_string()))?;
    bytes.push(b'\n');
    Ok(Bytes::from(bytes))
}

/// A bookmark: a Pod carrying only `metadata.resourceVersion` (and the
/// initial-events-end annotation when it closes the initial events).
fn bookmark_pod(revision: u64, initial_events_end: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            resource_version: Some(revision.to_string()),
            annotations: initial_events_end.then(|| {
                BTreeMap::from([(INITIAL_EVENTS_END_ANNOTATION.to_owned(), "true".to_owned())])
            }),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

/// Where a watch begins.
enum Start {
    /// One ERROR event, then the end of the stream.
    Error(ApiError),
    /// ADDED events for the matching pods of a state, then changes after it.
    State {
        revision: u64,
        snapshot: Snapshot,
        /// Close the initial events with an annotated bookmark.
        end_bookmark: bool,
    },
    /// These changes, then changes after `revision`.
    Replay {
        events: Vec<StoreEvent>,
        revision: u64,
    },
}

/// Answers a WATCH: validates it (errors before streaming are HTTP
/// errors), takes the armed watch faults, decides where it starts, and
/// spawns the task that streams it.
pub(crate) fn watch_pods(
    store: &Store,
    settings: WatchSettings,
    faults: &Faults,
    namespace: Option<&str>,
    labels: LabelSelector,
    fields: FieldSelector,
    query: &HashMap<String, String>,
) -> Result<EventStream, ApiError> {
    let options = WatchOptions::parse(query)?;
    let requested = options.parsed_resource_version()?;
    let filter = Filter {
        namespace: namespace.map(str::to_owned),
        labels,
        fields,
    };
    let timeout = options.timeout(settings);
    // Only a watch that passed validation consumes the faults.
    let faults = faults.take_watch_faults();
    let (start, updates) = if faults.expire {
        let (revision, _, updates) = store.watch_current();
        (
            Start::Error(ApiError::watch_expired(requested, revision)),
            updates,
        )
    } else {
        choose_start(store, &options, requested)
    };
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    let watcher = Watcher {
        filter,
        tx,
        allow_bookmarks: options.allow_bookmarks,
        bookmark_interval: settings.bookmark_interval,
        deadline: Instant::now() + timeout,
        cut_after: faults.cut_after,
        sent: 0,
        seen: 0,
    };
    tokio::spawn(watcher.run(start, updates));
    Ok(EventStream { rx, cut: None })
}

fn choose_start(store: &Store, options: &WatchOptions, requested: u64) -> (Start, Updates) {
    let from_state = |end_bookmark: bool| {
        let (revision, snapshot, updates) = store.watch_current();
        (
            Start::State {
                revision,
                snapshot,
                end_bookmark,
            },
            updates,
        )
    };
    let replay = |after: u64| match store.watch_after(after) {
        Ok((events, revision, updates)) => (
            Start::Replay {
                events,
                revision: revision.max(after),
            },
            updates,
        ),
        Err(Expired { oldest }) => {
            let (_, _, updates) = store.watch_current();
            (
                Start::Error(ApiError::watch_expired(after, oldest)),
                updates,
            )
        }
    };
    match options.send_initial_events {
        // Legacy semantics: "" and "0" both start with the current state.
        None if requested == 0 => from_state(false),
        None => replay(requested),
        Some(true) => {
            let current = store.resource_version();
            if requested > current {
                // `waitUntilFreshAndBlock` gives up with this after 3 s.
                let (_, _, updates) = store.watch_current();
                (
                    Start::Error(ApiError::too_large_resource_version(requested, current)),
                    updates,
                )
            } else {
                from_state(true)
            }
        }
        // No initial events: "" and "0" start at the current revision.
        Some(false) if requested == 0 => replay(store.resource_version()),
        Some(false) => replay(requested),
    }
}

/// The client went away, or the stream was cut or ended on purpose.
struct Stop;

struct Watcher {
    filter: Filter,
    tx: mpsc::Sender<Message>,
    allow_bookmarks: bool,
    bookmark_interval: Duration,
    deadline: Instant,
    cut_after: Option<usize>,
    sent: usize,
    /// Every change up to this revision has been looked at.
    seen: u64,
}

impl Watcher {
    async fn run(mut self, start: Start, updates: Updates) {
        if self.stream(start, updates).await.is_ok() {
            tracing::debug!(events = self.sent, "watch ended");
        }
    }

    async fn stream(&mut self, start: Start, mut updates: Updates) -> Result<(), Stop> {
        if self.cut_after == Some(0) {
            return self.cut().await;
        }
        match start {
            Start::Error(error) => {
                let status = error.to_status();
                return self.emit_value("ERROR", &status).await;
            }
            Start::State {
                revision,
                snapshot,
                end_bookmark,
            } => {
                for pod in snapshot.values() {
                    if self.filter.matches(pod) {
                        self.emit_value("ADDED", &**pod).await?;
                    }
                }
                self.seen = revision;
                if end_bookmark {
                    self.emit_value("BOOKMARK", &bookmark_pod(revision, true))
                        .await?;
                }
            }
            Start::Replay { events, revision } => {
                self.emit_events(&events).await?;
                self.seen = revision;
            }
        }

        let closed = self.tx.clone();
        let deadline = tokio::time::sleep_until(self.deadline);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval_at(
            Instant::now() + self.bookmark_interval,
            self.bookmark_interval,
        );
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = closed.closed() => return Err(Stop),
                () = &mut deadline => {
                    if self.allow_bookmarks {
                        // The cacher sends a last bookmark just before the
                        // deadline, so the client resumes from close to now.
                        self.drain(&mut updates).await?;
                        self.bookmark().await?;
                    }
                    return Ok(());
                }
                batch = updates.recv() => match batch {
                    Ok(batch) => self.apply(&batch).await?,
                    Err(RecvError::Lagged(missed)) => return Self::lagged(missed),
                    Err(RecvError::Closed) => return Ok(()),
                },
                _ = ticker.tick(), if self.allow_bookmarks => {
                    self.drain(&mut updates).await?;
                    self.bookmark().await?;
                }
            }
        }
    }

    /// Streams the writes already announced, so a bookmark that follows
    /// covers every change up to its resourceVersion.
    async fn drain(&mut self, updates: &mut Updates) -> Result<(), Stop> {
        loop {
            match updates.try_recv() {
                Ok(batch) => self.apply(&batch).await?,
                Err(TryRecvError::Lagged(missed)) => return Self::lagged(missed),
                Err(TryRecvError::Empty | TryRecvError::Closed) => return Ok(()),
            }
        }
    }

    /// A watcher that fell too far behind: the cacher closes such a
    /// watcher (the stream ends), and its client resumes with a new watch.
    fn lagged(missed: u64) -> Result<(), Stop> {
        tracing::warn!(missed, "watcher fell too far behind; closing it");
        Err(Stop)
    }

    async fn apply(&mut self, batch: &Batch) -> Result<(), Stop> {
        // Writes up to `seen` were in the replay, or are before a
        // resourceVersion the client has not reached yet.
        if batch.revision > self.seen {
            self.emit_events(&batch.events).await?;
            self.seen = batch.revision;
        }
        Ok(())
    }

    async fn emit_events(&mut self, events: &[StoreEvent]) -> Result<(), Stop> {
        for event in events {
            if let Some((type_, object)) = self.filter.convert(event) {
                self.emit_value(type_, &*object).await?;
            }
        }
        Ok(())
    }

    async fn bookmark(&mut self) -> Result<(), Stop> {
        let pod = bookmark_pod(self.seen, false);
        self.emit_value("BOOKMARK", &pod).await
    }

    async fn emit_value(&mut self, type_: &str, object: &impl Serialize) -> Result<(), Stop> {
        let bytes = match line(type_, object) {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::error!(message = %error.message, "cannot encode a watch event");
                return Err(Stop);
            }
        };
        self.tx.send(Message::Line(bytes)).await.map_err(|_| Stop)?;
        self.sent += 1;
        if self.cut_after == Some(self.sent) {
            return self.cut().await;
        }
        Ok(())
    }

    async fn cut(&mut self) -> Result<(), Stop> {
        tracing::info!(
            events = self.sent,
            "cutting the watch stream (injected fault)"
        );
        let _ = self.tx.send(Message::Cut).await;
        Err(Stop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, app: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "labels": {"app": app}}
        }))
        .unwrap()
    }

    fn filter(selector: &str) -> Filter {
        Filter {
            namespace: Some("default".to_owned()),
            labels: LabelSelector::parse(selector).unwrap(),
            fields: FieldSelector::default(),
        }
    }

    fn event(kind: EventKind, object: Pod, prev: Option<Pod>, revision: u64) -> StoreEvent {
        StoreEvent {
            revision,
            kind,
            object: Arc::new(object),
            prev: prev.map(Arc::new),
        }
    }

    #[test]
    fn selector_transitions_follow_the_cacher() {
        let web = filter("app=web");
        let added = event(EventKind::Added, pod("a", "web"), None, 5);
        assert_eq!(web.convert(&added).unwrap().0, "ADDED");
        let other = event(EventKind::Added, pod("b", "db"), None, 5);
        assert!(web.convert(&other).is_none());

        let still = event(
            EventKind::Modified,
            pod("a", "web"),
            Some(pod("a", "web")),
            6,
        );
        assert_eq!(web.convert(&still).unwrap().0, "MODIFIED");

        let mut relabelled = pod("a", "db");
        relabelled.metadata.resource_version = Some("7".into());
        let mut before = pod("a", "web");
        before.metadata.resource_version = Some("6".into());
        let leaves = event(EventKind::Modified, relabelled, Some(before), 7);
        let (type_, object) = web.convert(&leaves).unwrap();
        assert_eq!(type_, "DELETED");
        // The previous content, with the event's resourceVersion.
        assert_eq!(object.metadata.labels.as_ref().unwrap()["app"], "web");
        assert_eq!(object.metadata.resource_version.as_deref(), Some("7"));

        let joins = event(
            EventKind::Modified,
            pod("b", "web"),
            Some(pod("b", "db")),
            8,
        );
        assert_eq!(web.convert(&joins).unwrap().0, "ADDED");

        let gone = event(
            EventKind::Deleted,
            pod("a", "web"),
            Some(pod("a", "web")),
            9,
        );
        assert_eq!(web.convert(&gone).unwrap().0, "DELETED");
        let gone_other = event(EventKind::Deleted, pod("b", "db"), Some(pod("b", "db")), 9);
        assert!(web.convert(&gone_other).is_none());

        let mut elsewhere = pod("c", "web");
        elsewhere.metadata.namespace = Some("other".into());
        assert!(
            web.convert(&event(EventKind::Added, elsewhere, None, 10))
                .is_none()
        );
    }

    #[test]
    fn options_are_validated_like_the_apiserver() {
        let query = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert!(WatchOptions::parse(&query(&[])).is_ok());
        let ok = WatchOptions::parse(&query(&[
            ("sendInitialEvents", "true"),
            ("resourceVersionMatch", "NotOlderThan"),
            ("allowWatchBookmarks", "1"),
        ]))
        .unwrap();
        assert_eq!(ok.send_initial_events, Some(true));
        assert!(ok.allow_bookmarks);
        for bad in [
            &[("sendInitialEvents", "true")][..],
            &[
                ("sendInitialEvents", "true"),
                ("resourceVersionMatch", "NotOlderThan"),
            ],
            &[("resourceVersionMatch", "NotOlderThan")],
            &[
                ("sendInitialEvents", "false"),
                ("resourceVersionMatch", "Exact"),
                ("allowWatchBookmarks", "true"),
            ],
        ] {
            assert_eq!(
                WatchOptions::parse(&query(bad)).unwrap_err().code,
                422,
                "{bad:?}"
            );
        }
        assert_eq!(
            WatchOptions::parse(&query(&[("timeoutSeconds", "soon")]))
                .unwrap_err()
                .code,
            400
        );
        let bad_rv = WatchOptions::parse(&query(&[("resourceVersion", "abc")])).unwrap();
        assert_eq!(bad_rv.parsed_resource_version().unwrap_err().code, 500);
        assert!(query_bool("") && query_bool("yes") && query_bool("1"));
        assert!(!query_bool("0") && !query_bool("False"));
    }

    #[test]
    fn default_timeout_is_between_one_and_two_minimums() {
        let settings = WatchSettings {
            bookmark_interval: Duration::from_secs(1),
            min_request_timeout: Duration::from_secs(10),
        };
        let options = WatchOptions {
            resource_version: String::new(),
            resource_version_match: String::new(),
            allow_bookmarks: false,
            send_initial_events: None,
            timeout_seconds: None,
        };
        for _ in 0..50 {
            let t = options.timeout(settings);
            assert!(
                t >= Duration::from_secs(10) && t < Duration::from_secs(20),
                "{t:?}"
            );
        }
        let explicit = WatchOptions {
            timeout_seconds: Some(3),
            ..options
        };
        assert_eq!(explicit.timeout(settings), Duration::from_secs(3));
    }
}
