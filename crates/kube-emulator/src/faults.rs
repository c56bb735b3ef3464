//! Fault injection and the request log, for tests that check how a client
//! behaves when the apiserver misbehaves, and what requests it made.

use std::sync::{Arc, Mutex, MutexGuard};

/// One request the emulator answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// HTTP method, e.g. `GET`.
    pub method: String,
    /// Path and query exactly as sent, e.g. `/api/v1/pods?limit=500`.
    pub path_and_query: String,
    /// Whether the request carried a bearer token that verified.
    pub authenticated: bool,
    /// The HTTP status answered.
    pub status: u16,
}

impl RequestRecord {
    /// The decoded value of a query parameter, if present.
    pub fn query_param(&self, name: &str) -> Option<String> {
        let (_, query) = self.path_and_query.split_once('?')?;
        url::form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    }

    /// The path without the query.
    pub fn path(&self) -> &str {
        self.path_and_query
            .split_once('?')
            .map_or(self.path_and_query.as_str(), |(p, _)| p)
    }

    /// Whether this was a WATCH: a GET whose `watch` parameter is true to
    /// the apiserver (present and neither `0` nor `false`). The log records
    /// a watch once, when its response starts streaming.
    pub fn is_watch(&self) -> bool {
        self.method == "GET"
            && self
                .query_param("watch")
                .is_some_and(|w| !(w == "0" || w.eq_ignore_ascii_case("false")))
    }
}

/// The faults the next WATCH request takes on (each one-shot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WatchFaults {
    /// Abort the stream after this many events.
    pub cut_after: Option<usize>,
    /// Answer with the 410 Expired ERROR event, whatever the resourceVersion.
    pub expire: bool,
}

#[derive(Default)]
struct FaultState {
    /// `(page number, status)` armed by `fail_list_page`.
    list_page: Option<(usize, u16)>,
    /// Page number of the LIST sequence in progress since arming.
    pages_seen: usize,
    expire_continue: bool,
    fail_all: Option<u16>,
    watch: WatchFaults,
    log: Vec<RequestRecord>,
}

/// Shared handle to inject faults and read the request log.
#[derive(Clone, Default)]
pub struct Faults {
    inner: Arc<Mutex<FaultState>>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Faults")
            .field("list_page", &s.list_page)
            .field("expire_continue", &s.expire_continue)
            .field("fail_all", &s.fail_all)
            .field("watch", &s.watch)
            .field("requests", &s.log.len())
            .finish()
    }
}

impl Faults {
    fn lock(&self) -> MutexGuard<'_, FaultState> {
        // Fault state stays consistent across a panic (plain field writes).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes page `n` (1 = the first page) of the next paged LIST answer
    /// `status` with a real `Status` body. The next LIST without a continue
    /// token is page 1; each following LIST with a continue token is the next
    /// page. One-shot: the page after (or a retry) is served normally.
    pub fn fail_list_page(&self, n: usize, status: u16) {
        let mut s = self.lock();
        s.list_page = Some((n.max(1), status));
        s.pages_seen = 0;
    }

    /// Makes the next request carrying a continue token fail with 410 Gone,
    /// reason `Expired`, as after an etcd compaction. One-shot.
    pub fn expire_continue_tokens(&self) {
        self.lock().expire_continue = true;
    }

    /// Makes every request (including `/healthz`) answer `status` until
    /// [`Faults::clear`].
    pub fn fail_all(&self, status: u16) {
        self.lock().fail_all = Some(status);
    }

    /// Makes the next WATCH stream break after `events` events (0: before
    /// the first): the connection is dropped without the final chunk, so the
    /// client sees an incomplete chunked body, as when an apiserver or a load
    /// balancer in front of it goes away mid-watch. One-shot.
    pub fn cut_watch_after(&self, events: usize) {
        self.lock().watch.cut_after = Some(events);
    }

    /// Makes the next WATCH answer as if its resourceVersion had been
    /// compacted away: HTTP 200 with a single ERROR event carrying a 410
    /// `Expired` Status, then the end of the stream. One-shot.
    pub fn expire_next_watch(&self) {
        self.lock().watch.expire = true;
    }

    /// Removes every injected fault (the request log is kept).
    pub fn clear(&self) {
        let mut s = self.lock();
        s.list_page = None;
        s.pages_seen = 0;
        s.expire_continue = false;
        s.fail_all = None;
        s.watch = WatchFaults::default();
    }

    /// Every request answered so far, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.lock().log.clone()
    }

    /// Empties the request log.
    pub fn clear_requests(&self) {
        self.lock().log.clear();
    }

    pub(crate) fn record(&self, record: RequestRecord) {
        self.lock().log.push(record);
    }

    pub(crate) fn fail_all_status(&self) -> Option<u16> {
        self.lock().fail_all
    }

    /// Counts a LIST page and says whether it must fail, and with what.
    pub(crate) fn list_page_fault(&self, has_continue: bool) -> Option<u16> {
        let mut s = self.lock();
        let (n, status) = s.list_page?;
        s.pages_seen = if has_continue { s.pages_seen + 1 } else { 1 };
        if s.pages_seen == n {
            s.list_page = None;
            s.pages_seen = 0;
            Some(status)
        } else {
            None
        }
    }

    /// The faults armed for the next WATCH (consumes them).
    pub(crate) fn take_watch_faults(&self) -> WatchFaults {
        std::mem::take(&mut self.lock().watch)
    }

    /// Whether this continued LIST must fail with 410 (consumes the fault).
    pub(crate) fn take_expire(&self, has_continue: bool) -> bool {
        let mut s = self.lock();
        if has_continue && s.expire_continue {
            s.expire_continue = false;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_page_fault_counts_pages_of_the_next_list() {
        let f = Faults::default();
        assert_eq!(f.list_page_fault(false), None);
        f.fail_list_page(2, 500);
        assert_eq!(f.list_page_fault(false), None);
        assert_eq!(f.list_page_fault(true), Some(500));
        // One-shot: the retry of page 2 succeeds.
        assert_eq!(f.list_page_fault(true), None);

        f.fail_list_page(1, 503);
        assert_eq!(f.list_page_fault(false), Some(503));
        assert_eq!(f.list_page_fault(false), None);
    }

    #[test]
    fn expire_is_one_shot_and_only_for_continued_lists() {
        let f = Faults::default();
        f.expire_continue_tokens();
        assert!(!f.take_expire(false));
        assert!(f.take_expire(true));
        assert!(!f.take_expire(true));
        f.fail_all(503);
        assert_eq!(f.fail_all_status(), Some(503));
        f.clear();
        assert_eq!(f.fail_all_status(), None);
    }

    #[test]
    fn watch_faults_are_one_shot_and_cleared() {
        let f = Faults::default();
        assert_eq!(f.take_watch_faults(), WatchFaults::default());
        f.cut_watch_after(3);
        f.expire_next_watch();
        assert_eq!(
            f.take_watch_faults(),
            WatchFaults {
                cut_after: Some(3),
                expire: true
            }
        );
        assert_eq!(f.take_watch_faults(), WatchFaults::default());
        f.cut_watch_after(0);
        f.clear();
        assert_eq!(f.take_watch_faults(), WatchFaults::default());
    }

    #[test]
    fn records_expose_query_params() {
        let r = RequestRecord {
            method: "GET".into(),
            path_and_query: "/api/v1/pods?limit=2&labelSelector=app%3Dweb".into(),
            authenticated: true,
            status: 200,
        };
        assert_eq!(r.query_param("labelSelector").as_deref(), Some("app=web"));
        assert_eq!(r.query_param("resourceVersion"), None);
        assert_eq!(r.path(), "/api/v1/pods");
        assert!(!r.is_watch());
        let w = RequestRecord {
            path_and_query: "/api/v1/pods?watch=true&resourceVersion=7".into(),
            ..r
        };
        assert!(w.is_watch());
    }
}
