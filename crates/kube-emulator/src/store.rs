//! The pod store: a versioned map of pods with one global resourceVersion
//! (like an etcd revision) and a bounded history of snapshots, so that paged
//! LISTs are served from the snapshot of the first page (as etcd serves a
//! continued range read at the revision in the continue token) and a token
//! whose snapshot was dropped expires with 410.
//!
//! Every write also makes one batch of events (one per changed pod), kept
//! in a log that covers the same revisions as the snapshot history (like
//! the apiserver's watch cache window) and broadcast to live watchers, so a
//! watch can replay every change after a resourceVersion and then follow
//! live writes without a gap. Compaction and the history limit only bound
//! where a new watch may start; live watchers are fed by the broadcast.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::broadcast;

use crate::clock;

/// `(namespace, name)`; its ordering is the order LIST returns pods in.
pub(crate) type PodKey = (String, String);

/// An immutable view of all pods at one resourceVersion.
pub(crate) type Snapshot = Arc<BTreeMap<PodKey, Arc<Pod>>>;

/// How many past revisions are kept for continued LISTs by default.
pub const DEFAULT_HISTORY_LIMIT: usize = 1000;

/// How many writes a live watcher may fall behind before it is closed (the
/// cacher closes watchers that cannot keep up; clients then re-watch).
const WATCH_BACKLOG: usize = 4096;

/// Why a store call was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// A pod needs `metadata.name` to be stored.
    #[error("pod has no metadata.name")]
    MissingName,
}

/// Why a snapshot for a resourceVersion is not available.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SnapshotError {
    /// The revision was compacted away (older than the retained history).
    Compacted,
    /// The revision has not happened yet.
    Future { current: u64 },
}

/// What a write did to one pod, as a watch event type before selector
/// filtering (the watch turns it into ADDED/MODIFIED/DELETED per watcher).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventKind {
    /// The pod did not exist before this write.
    Added,
    /// The pod existed and was replaced.
    Modified,
    /// The pod was removed.
    Deleted,
}

/// One change of one pod, kept in the store's event log.
#[derive(Clone, Debug)]
pub(crate) struct StoreEvent {
    /// The revision of the write (shared by every pod of a bulk write).
    pub revision: u64,
    pub kind: EventKind,
    /// The pod after the write; for a deletion, its last state carrying the
    /// deletion's resourceVersion.
    pub object: Arc<Pod>,
    /// The pod before the write (`None` when it was added).
    pub prev: Option<Arc<Pod>>,
}

/// The events of one write.
#[derive(Debug)]
pub(crate) struct Batch {
    pub revision: u64,
    pub events: Vec<StoreEvent>,
}

/// Tells a live watcher of every write after it subscribed.
pub(crate) type Updates = broadcast::Receiver<Arc<Batch>>;

/// A watch asked for changes after a revision the event log no longer
/// covers; `oldest` is the oldest revision a watch can still start from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Expired {
    pub oldest: u64,
}

/// What a write closure decided to do with the pod it was shown.
#[derive(Debug)]
pub(crate) enum Change {
    /// Store this pod (its resourceVersion is set by the store).
    Put(Box<Pod>),
    /// Remove the pod.
    Delete,
    /// Leave the store unchanged (no resourceVersion bump).
    Keep,
}

struct Inner {
    revision: u64,
    current: Snapshot,
    /// State after each retained revision, keyed by that revision.
    history: BTreeMap<u64, Snapshot>,
    history_limit: usize,
    /// Every write after the oldest retained snapshot, oldest first.
    log: VecDeque<Arc<Batch>>,
    /// Hands each write to the live watchers.
    updates: broadcast::Sender<Arc<Batch>>,
}

impl Inner {
    fn commit(&mut self, next: BTreeMap<PodKey, Arc<Pod>>, events: Vec<StoreEvent>) {
        let snapshot = Arc::new(next);
        self.current = Arc::clone(&snapshot);
        self.history.insert(self.revision, snapshot);
        let batch = Arc::new(Batch {
            revision: self.revision,
            events,
        });
        self.log.push_back(Arc::clone(&batch));
        self.trim();
        // No receiver (no live watcher) is fine.
        let _ = self.updates.send(batch);
    }

    /// The oldest revision a watch can start after: the log holds every
    /// change newer than the oldest retained snapshot.
    fn oldest(&self) -> u64 {
        self.history.keys().next().copied().unwrap_or(self.revision)
    }

    /// Drops snapshots over the limit and the events they no longer anchor.
    fn trim(&mut self) {
        while self.history.len() > self.history_limit.max(1) {
            self.history.pop_first();
        }
        let oldest = self.oldest();
        while self.log.front().is_some_and(|b| b.revision <= oldest) {
            self.log.pop_front();
        }
    }

    /// Every event with a revision above `after` (`after` must be covered).
    fn events_after(&self, after: u64) -> Result<Vec<StoreEvent>, Expired> {
        let oldest = self.oldest();
        if after < oldest {
            return Err(Expired { oldest });
        }
        let first = self.log.partition_point(|b| b.revision <= after);
        Ok(self
            .log
            .range(first..)
            .flat_map(|b| b.events.iter().cloned())
            .collect())
    }
}

/// Shared handle to the emulator's pods. Tests use it to seed and mutate
/// state directly, without HTTP; every mutation is a write that bumps the
/// global resourceVersion exactly as an API write would.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Mutex<Inner>>,
    /// Nodes by name: only read (`GET /api/v1/nodes/{name}`), so kept apart from the
    /// versioned pod history.
    nodes: Arc<Mutex<BTreeMap<String, k8s_openapi::api::core::v1::Node>>>,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("Store")
            .field("resource_version", &inner.revision)
            .field("pods", &inner.current.len())
            .finish()
    }
}

fn key_of(pod: &Pod) -> Option<PodKey> {
    let name = pod.metadata.name.clone()?;
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    Some((namespace, name))
}

/// A replaced pod keeps its `uid` and `creationTimestamp` unless the new one sets them.
fn keep_identity(pod: &mut Pod, old: Option<&Pod>) {
    let Some(old) = old else { return };
    if pod.metadata.uid.is_none() {
        pod.metadata.uid.clone_from(&old.metadata.uid);
    }
    if pod.metadata.creation_timestamp.is_none() {
        pod.metadata
            .creation_timestamp
            .clone_from(&old.metadata.creation_timestamp);
    }
}

/// Sets what the apiserver owns on a write: name and namespace from the key, a new
/// `uid` and `creationTimestamp` when missing, and the write's resourceVersion.
fn stamp(pod: &mut Pod, (namespace, name): &PodKey, revision: u64) {
    pod.metadata.name = Some(name.clone());
    pod.metadata.namespace = Some(namespace.clone());
    if pod.metadata.uid.is_none() {
        pod.metadata.uid = Some(new_uid());
    }
    if pod.metadata.creation_timestamp.is_none() {
        pod.metadata.creation_timestamp = Some(clock::k8s_now());
    }
    pod.metadata.resource_version = Some(revision.to_string());
}

/// A random RFC 4122 version-4 UUID, the form the apiserver uses for `uid`.
pub(crate) fn new_uid() -> String {
    let mut bytes = [0u8; 16];
    for b in &mut bytes {
        *b = fastrand::u8(..);
    }
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

impl Store {
    /// An empty store at resourceVersion 1.
    pub fn new() -> Self {
        let empty: Snapshot = Arc::new(BTreeMap::new());
        let mut history = BTreeMap::new();
        history.insert(1, Arc::clone(&empty));
        Self {
            inner: Arc::new(Mutex::new(Inner {
                revision: 1,
                current: empty,
                history,
                history_limit: DEFAULT_HISTORY_LIMIT,
                log: VecDeque::new(),
                updates: broadcast::Sender::new(WATCH_BACKLOG),
            })),
            nodes: Arc::default(),
        }
    }

    /// Creates or replaces a node (by `metadata.name`), as the kubelet registers it.
    pub fn put_node(&self, node: k8s_openapi::api::core::v1::Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, node);
    }

    /// A node by name.
    pub fn get_node(&self, name: &str) -> Option<k8s_openapi::api::core::v1::Node> {
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-made write (each
        // write swaps in a finished snapshot), so a poisoned lock is usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates or replaces a pod (namespace defaults to `default`). Assigns
    /// `uid` and `creationTimestamp` when missing (keeping those of the pod
    /// it replaces), and always sets `metadata.resourceVersion` to the new
    /// global resourceVersion. Returns the pod as stored.
    pub fn put_pod(&self, pod: Pod) -> Result<Pod, StoreError> {
        let (namespace, name) = key_of(&pod).ok_or(StoreError::MissingName)?;
        let stored = self.modify(&namespace, &name, |old| {
            let mut pod = pod;
            keep_identity(&mut pod, old);
            Ok::<_, std::convert::Infallible>(Change::Put(Box::new(pod)))
        });
        match stored {
            Ok(Some(pod)) => Ok(pod),
            Ok(None) | Err(_) => Err(StoreError::MissingName),
        }
    }

    /// Stores many pods in one write, like one etcd transaction: a single new
    /// resourceVersion shared by every pod and a single snapshot (seeding a large
    /// cluster pod by pod copies the whole map per pod). Identity is kept as by
    /// `put_pod`. Nothing is stored if any pod has no name. Returns how many were.
    pub fn put_pods(&self, pods: impl IntoIterator<Item = Pod>) -> Result<usize, StoreError> {
        let pods: Vec<Pod> = pods.into_iter().collect();
        let keys = pods
            .iter()
            .map(|pod| key_of(pod).ok_or(StoreError::MissingName))
            .collect::<Result<Vec<_>, _>>()?;
        let mut inner = self.lock();
        let mut next = BTreeMap::clone(&inner.current);
        let count = pods.len();
        inner.revision += 1;
        let revision = inner.revision;
        let mut events = Vec::with_capacity(count);
        for (mut pod, key) in pods.into_iter().zip(keys) {
            let prev = next.get(&key).cloned();
            keep_identity(&mut pod, prev.as_deref());
            stamp(&mut pod, &key, revision);
            let pod = Arc::new(pod);
            events.push(StoreEvent {
                revision,
                kind: if prev.is_some() {
                    EventKind::Modified
                } else {
                    EventKind::Added
                },
                object: Arc::clone(&pod),
                prev,
            });
            next.insert(key, pod);
        }
        inner.commit(next, events);
        Ok(count)
    }

    /// The pod `namespace/name`, if present.
    pub fn get_pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        let inner = self.lock();
        inner
            .current
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|p| Pod::clone(p))
    }

    /// Removes a pod at once (no grace period). Returns the removed pod.
    pub fn delete_pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.modify(namespace, name, |old| {
            Ok::<_, std::convert::Infallible>(if old.is_some() {
                Change::Delete
            } else {
                Change::Keep
            })
        })
        .ok()
        .flatten()
    }

    /// Marks a pod as terminating, as a graceful DELETE does: sets
    /// `metadata.deletionTimestamp` to now + the grace period and
    /// `metadata.deletionGracePeriodSeconds` to the pod's
    /// `spec.terminationGracePeriodSeconds` (default 30). A pod already
    /// terminating is left as it is. Returns the pod, if present.
    pub fn set_terminating(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.modify(namespace, name, |old| {
            let Some(old) = old else {
                return Ok::<_, std::convert::Infallible>(Change::Keep);
            };
            if old.metadata.deletion_timestamp.is_some() {
                return Ok(Change::Keep);
            }
            let mut pod = old.clone();
            let grace = pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30);
            pod.metadata.deletion_timestamp = Some(clock::k8s_time_after(grace));
            pod.metadata.deletion_grace_period_seconds = Some(grace);
            Ok(Change::Put(Box::new(pod)))
        })
        .ok()
        .flatten()
    }

    /// Removes a terminating pod, as the kubelet does once its containers
    /// have stopped (its final DELETE with a zero grace period). Watchers see
    /// DELETED. Returns the removed pod (carrying the deletion's
    /// resourceVersion), or `None` if the pod is absent or not terminating
    /// (no `metadata.deletionTimestamp`).
    pub fn finish_deletion(&self, namespace: &str, name: &str) -> Option<Pod> {
        let mut removed = false;
        let pod = self
            .modify(namespace, name, |old| {
                Ok::<_, std::convert::Infallible>(match old {
                    Some(pod) if pod.metadata.deletion_timestamp.is_some() => {
                        removed = true;
                        Change::Delete
                    }
                    _ => Change::Keep,
                })
            })
            .ok()
            .flatten();
        // `Keep` hands back the untouched pod: only a removal counts.
        pod.filter(|_| removed)
    }

    /// Applies `f` to a stored pod and writes the result (one resourceVersion
    /// bump). Returns the pod as stored, or `None` if there is no such pod.
    pub fn update_pod(&self, namespace: &str, name: &str, f: impl FnOnce(&mut Pod)) -> Option<Pod> {
        self.modify(namespace, name, |old| {
            let Some(old) = old else {
                return Ok::<_, std::convert::Infallible>(Change::Keep);
            };
            let mut pod = old.clone();
            f(&mut pod);
            pod.metadata.name = Some(name.to_owned());
            pod.metadata.namespace = Some(namespace.to_owned());
            Ok(Change::Put(Box::new(pod)))
        })
        .ok()
        .flatten()
    }

    /// All pods, sorted by namespace then name.
    pub fn pods(&self) -> Vec<Pod> {
        let inner = self.lock();
        inner.current.values().map(|p| Pod::clone(p)).collect()
    }

    /// Every stored version of one pod the event log still holds (its last
    /// [`DEFAULT_HISTORY_LIMIT`] writes by default), oldest first: one per write,
    /// so a test can tell what each PATCH changed.
    pub fn versions_of(&self, namespace: &str, name: &str) -> Vec<Pod> {
        let inner = self.lock();
        inner
            .log
            .iter()
            .flat_map(|batch| batch.events.iter())
            .filter(|e| {
                e.object.metadata.namespace.as_deref() == Some(namespace)
                    && e.object.metadata.name.as_deref() == Some(name)
            })
            .map(|e| Pod::clone(&e.object))
            .collect()
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().revision
    }

    /// Drops every retained snapshot but the current one, as an etcd
    /// compaction does: continue tokens issued before now then get 410, and
    /// so do watches from any older resourceVersion.
    pub fn compact(&self) {
        let mut inner = self.lock();
        let revision = inner.revision;
        inner.history.retain(|rv, _| *rv == revision);
        inner.trim();
    }

    /// Sets how many past revisions are kept for continued LISTs and for
    /// watches that resume from a resourceVersion.
    pub fn set_history_limit(&self, limit: usize) {
        let mut inner = self.lock();
        inner.history_limit = limit.max(1);
        inner.trim();
    }

    /// The oldest resourceVersion a watch can still resume from: a watch
    /// from an older one gets a 410 Expired ERROR event.
    pub fn oldest_watchable_resource_version(&self) -> u64 {
        self.lock().oldest()
    }

    /// The current revision and pods, and a receiver of every later write,
    /// taken atomically so no write falls between the state and the
    /// subscription.
    pub(crate) fn watch_current(&self) -> (u64, Snapshot, Updates) {
        let inner = self.lock();
        (
            inner.revision,
            Arc::clone(&inner.current),
            inner.updates.subscribe(),
        )
    }

    /// Every change after `after` plus the current revision, and a receiver
    /// of every later write, taken atomically.
    pub(crate) fn watch_after(
        &self,
        after: u64,
    ) -> Result<(Vec<StoreEvent>, u64, Updates), Expired> {
        let inner = self.lock();
        let events = inner.events_after(after)?;
        Ok((events, inner.revision, inner.updates.subscribe()))
    }

    /// Every change after `after`, and the current revision.
    #[cfg(test)]
    pub(crate) fn events_after(&self, after: u64) -> Result<(Vec<StoreEvent>, u64), Expired> {
        let inner = self.lock();
        let events = inner.events_after(after)?;
        Ok((events, inner.revision))
    }

    /// The current revision and pods.
    pub(crate) fn current(&self) -> (u64, Snapshot) {
        let inner = self.lock();
        (inner.revision, Arc::clone(&inner.current))
    }

    /// The pods as they were at `revision`.
    pub(crate) fn snapshot_at(&self, revision: u64) -> Result<Snapshot, SnapshotError> {
        let inner = self.lock();
        if revision > inner.revision {
            return Err(SnapshotError::Future {
                current: inner.revision,
            });
        }
        let oldest = inner
            .history
            .keys()
            .next()
            .copied()
            .unwrap_or(inner.revision);
        if revision < oldest {
            return Err(SnapshotError::Compacted);
        }
        inner
            .history
            .range(..=revision)
            .next_back()
            .map(|(_, s)| Arc::clone(s))
            .ok_or(SnapshotError::Compacted)
    }

    /// Runs one atomic read-modify-write of `namespace/name`. `f` sees the
    /// current pod and decides the change; a `Put` gets the next
    /// resourceVersion. Returns the stored pod for `Put`, the removed pod
    /// (carrying the deletion's resourceVersion) for `Delete`, and the
    /// current pod for `Keep`.
    pub(crate) fn modify<E>(
        &self,
        namespace: &str,
        name: &str,
        f: impl FnOnce(Option<&Pod>) -> Result<Change, E>,
    ) -> Result<Option<Pod>, E> {
        let mut inner = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        let old = inner.current.get(&key).cloned();
        match f(old.as_deref())? {
            Change::Keep => Ok(old.map(|p| Pod::clone(&p))),
            Change::Delete => {
                let Some(old) = old else { return Ok(None) };
                inner.revision += 1;
                let revision = inner.revision;
                let mut next = BTreeMap::clone(&inner.current);
                next.remove(&key);
                let mut removed = Pod::clone(&old);
                removed.metadata.resource_version = Some(revision.to_string());
                let event = StoreEvent {
                    revision,
                    kind: EventKind::Deleted,
                    object: Arc::new(removed.clone()),
                    prev: Some(old),
                };
                inner.commit(next, vec![event]);
                Ok(Some(removed))
            }
            Change::Put(mut pod) => {
                inner.revision += 1;
                let revision = inner.revision;
                stamp(&mut pod, &key, revision);
                let stored = Arc::new(Pod::clone(&pod));
                let event = StoreEvent {
                    revision,
                    kind: if old.is_some() {
                        EventKind::Modified
                    } else {
                        EventKind::Added
                    },
                    object: Arc::clone(&stored),
                    prev: old,
                };
                let mut next = BTreeMap::clone(&inner.current);
                next.insert(key, stored);
                inner.commit(next, vec![event]);
                Ok(Some(*pod))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns}
        }))
        .unwrap()
    }

    #[test]
    fn writes_bump_resource_version_and_fill_metadata() {
        let store = Store::new();
        let rv0 = store.resource_version();
        let a = store.put_pod(pod("default", "a")).unwrap();
        assert_eq!(store.resource_version(), rv0 + 1);
        assert_eq!(a.metadata.resource_version, Some((rv0 + 1).to_string()));
        let uid = a.metadata.uid.clone().unwrap();
        assert_eq!(uid.len(), 36);
        assert!(a.metadata.creation_timestamp.is_some());

        // Replacing keeps uid and creationTimestamp.
        let a2 = store.put_pod(pod("default", "a")).unwrap();
        assert_eq!(a2.metadata.uid.as_deref(), Some(uid.as_str()));
        assert_eq!(
            a2.metadata.creation_timestamp,
            a.metadata.creation_timestamp
        );
        assert_eq!(store.resource_version(), rv0 + 2);

        let t = store.set_terminating("default", "a").unwrap();
        assert!(t.metadata.deletion_timestamp.is_some());
        assert_eq!(t.metadata.deletion_grace_period_seconds, Some(30));

        let removed = store.delete_pod("default", "a").unwrap();
        assert_eq!(
            removed.metadata.resource_version,
            Some((rv0 + 4).to_string())
        );
        assert!(store.pods().is_empty());
        assert!(store.delete_pod("default", "a").is_none());
        assert_eq!(store.resource_version(), rv0 + 4);
        assert_eq!(store.put_pod(Pod::default()), Err(StoreError::MissingName));
    }

    #[test]
    fn snapshots_and_compaction() {
        let store = Store::new();
        store.put_pod(pod("default", "a")).unwrap();
        let rv = store.resource_version();
        store.put_pod(pod("default", "b")).unwrap();
        assert_eq!(store.snapshot_at(rv).unwrap().len(), 1);
        assert_eq!(store.current().1.len(), 2);
        assert_eq!(
            store.snapshot_at(rv + 5),
            Err(SnapshotError::Future { current: rv + 1 })
        );
        store.compact();
        assert_eq!(store.snapshot_at(rv), Err(SnapshotError::Compacted));
        assert_eq!(store.snapshot_at(rv + 1).unwrap().len(), 2);
    }

    #[test]
    fn history_limit_drops_old_snapshots() {
        let store = Store::new();
        store.set_history_limit(2);
        for i in 0..5 {
            store.put_pod(pod("default", &format!("p{i}"))).unwrap();
        }
        let rv = store.resource_version();
        assert!(store.snapshot_at(rv - 1).is_ok());
        assert_eq!(store.snapshot_at(rv - 2), Err(SnapshotError::Compacted));
    }

    fn kinds(events: &[StoreEvent]) -> Vec<(u64, EventKind, String)> {
        events
            .iter()
            .map(|e| {
                (
                    e.revision,
                    e.kind,
                    e.object.metadata.name.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    #[test]
    fn every_write_path_logs_events() {
        let store = Store::new();
        let (rv0, _, mut updates) = store.watch_current();
        store.put_pod(pod("default", "a")).unwrap();
        let batch = updates.try_recv().unwrap();
        assert_eq!((batch.revision, batch.events.len()), (rv0 + 1, 1));
        store
            .put_pods([pod("default", "a"), pod("ns", "b")])
            .unwrap();
        store.update_pod("ns", "b", |p| {
            p.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
        });
        store.set_terminating("ns", "b").unwrap();
        assert!(
            store.finish_deletion("default", "a").is_none(),
            "not terminating"
        );
        let removed = store.finish_deletion("ns", "b").unwrap();
        store.delete_pod("default", "a").unwrap();
        assert!(store.finish_deletion("ns", "b").is_none(), "already gone");

        let (events, current) = store.events_after(rv0).unwrap();
        assert_eq!(current, rv0 + 6);
        assert_eq!(
            kinds(&events),
            [
                (rv0 + 1, EventKind::Added, "a".to_owned()),
                (rv0 + 2, EventKind::Modified, "a".to_owned()),
                (rv0 + 2, EventKind::Added, "b".to_owned()),
                (rv0 + 3, EventKind::Modified, "b".to_owned()),
                (rv0 + 4, EventKind::Modified, "b".to_owned()),
                (rv0 + 5, EventKind::Deleted, "b".to_owned()),
                (rv0 + 6, EventKind::Deleted, "a".to_owned()),
            ]
        );
        // A deletion carries the last state with the deletion's revision.
        let deleted = &events[5];
        assert_eq!(
            deleted.object.metadata.resource_version,
            Some((rv0 + 5).to_string())
        );
        assert_eq!(
            removed.metadata.resource_version,
            Some((rv0 + 5).to_string())
        );
        assert!(deleted.object.metadata.deletion_timestamp.is_some());
        assert_eq!(
            deleted.prev.as_ref().unwrap().metadata.resource_version,
            Some((rv0 + 4).to_string())
        );
        // Events after a revision are exactly the later ones.
        let (later, _) = store.events_after(rv0 + 4).unwrap();
        assert_eq!(later.len(), 2);
        let (none, _) = store.events_after(rv0 + 6).unwrap();
        assert!(none.is_empty());
        // Writes that change nothing log nothing.
        assert!(store.delete_pod("default", "zzz").is_none());
        assert_eq!(store.resource_version(), rv0 + 6);
    }

    #[test]
    fn event_log_follows_the_history_window() {
        let store = Store::new();
        store.set_history_limit(3);
        for i in 0..6 {
            store.put_pod(pod("default", &format!("p{i}"))).unwrap();
        }
        let rv = store.resource_version();
        let oldest = store.oldest_watchable_resource_version();
        assert_eq!(oldest, rv - 2);
        assert_eq!(store.events_after(oldest).unwrap().0.len(), 2);
        assert_eq!(
            store.events_after(oldest - 1).unwrap_err(),
            Expired { oldest }
        );
        let (events, _, _) = store.watch_after(oldest).unwrap();
        assert_eq!(events.len(), 2);
        store.compact();
        assert_eq!(store.oldest_watchable_resource_version(), rv);
        assert!(store.events_after(rv - 1).is_err());
        assert!(store.events_after(rv).unwrap().0.is_empty());
        // A revision in the future is not expired: nothing has happened yet.
        assert!(store.events_after(rv + 10).unwrap().0.is_empty());
    }

    #[test]
    fn bulk_put_is_one_write() {
        let store = Store::new();
        let first = store.put_pod(pod("default", "a")).unwrap();
        let rv = store.resource_version();
        let uid = first.metadata.uid.clone().unwrap();
        let stored = store
            .put_pods([pod("default", "a"), pod("ns", "b"), pod("ns", "c")])
            .unwrap();
        assert_eq!(stored, 3);
        assert_eq!(store.resource_version(), rv + 1);
        let a = store.get_pod("default", "a").unwrap();
        assert_eq!(a.metadata.uid.as_deref(), Some(uid.as_str()));
        for (ns, name) in [("default", "a"), ("ns", "b"), ("ns", "c")] {
            let p = store.get_pod(ns, name).unwrap();
            assert_eq!(p.metadata.resource_version, Some((rv + 1).to_string()));
        }
        assert_eq!(store.snapshot_at(rv).unwrap().len(), 1);
        assert_eq!(store.snapshot_at(rv + 1).unwrap().len(), 3);
        // All or nothing.
        assert_eq!(
            store.put_pods([pod("ns", "d"), Pod::default()]),
            Err(StoreError::MissingName)
        );
        assert!(store.get_pod("ns", "d").is_none());
        assert_eq!(store.resource_version(), rv + 1);
    }
}
