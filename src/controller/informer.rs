//! The informer: per bound namespace, a store of pods filled by a LIST and kept current
//! by a WATCH — kube-runtime's reflector, on tgsync's lean pod reader.
//!
//! The stores outlive an invocation: they stay in the warm container, and the next
//! invocation resumes each WATCH from the last `resourceVersion` seen (the API server
//! replays what happened in between). A namespace is LISTed only when it has no store
//! yet (a cold start, a namespace newly bound), after a 410 Expired (the version was
//! compacted away: a gap), when its selection changed, or once its LIST is older than
//! the relist period (a safety net). After a gap anything may have changed; a LIST of a
//! store that was current until then is compared with it, pod by pod, and only the
//! pods it changed are told (a cold container's watch widened by discovery must not
//! ask for a pass of every group of the namespace). A stream the server ends is
//! resumed at once; errors back off exponentially with jitter, never a tight loop
//! against an API server in trouble.
//!
//! A store is *live* while its watch is known to be current — resumed in this
//! invocation and not broken since. Only a live store is handed out
//! ([`Informer::view`]); otherwise callers read the pods afresh. Its version is the
//! `resourceVersion` it is current to (the LIST's, then each event's and bookmark's):
//! passes compare it with what the group's last pass decided from.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt as _;

use crate::clock::Clock;
use crate::core::{Binding, PodFacts, Selector, UnixMillis};
use crate::pods::{PodSource, PodsError, WatchEvent};
use crate::sync::lock;

use super::queue::watch_retry;

/// One namespace's pods as the watch keeps them.
#[derive(Debug, Default)]
struct Store {
    /// The selection LIST and WATCH use (`None`: every pod of the namespace).
    selector: Option<Selector>,
    pods: BTreeMap<String, PodFacts>,
    /// The `resourceVersion` the store is current to.
    version: String,
    /// Filled by a complete LIST, and no gap since.
    listed: bool,
    /// The watch is current: resumed in this invocation and not broken since.
    live: bool,
    /// When the last LIST completed.
    listed_at: UnixMillis,
}

/// What a store change means to the controller.
#[derive(Debug)]
pub(crate) enum StoreEvent<'a> {
    /// The namespace was listed. When its store was current until then (a changed
    /// selection, the relist period), each pod the LIST changed follows as a
    /// [`StoreEvent::Pod`].
    Listed {
        /// The namespace.
        namespace: &'a str,
        /// Pod objects the LIST returned.
        pods: usize,
        /// Its store was not current (a 410, a broken watch, a frozen container):
        /// anything may have changed since.
        again: bool,
    },
    /// One pod changed (`None`: absent before, or gone now).
    Pod {
        /// The namespace.
        namespace: &'a str,
        /// The pod as the store had it.
        before: Option<&'a PodFacts>,
        /// The pod now.
        after: Option<&'a PodFacts>,
        /// When the event arrived.
        seen_at: UnixMillis,
    },
    /// The watch resumed from the store's version (no LIST needed).
    Resumed,
    /// A LIST or WATCH failed; the reflector backs off and tries again.
    Failed {
        /// The namespace.
        namespace: &'a str,
        /// What went wrong.
        error: &'a PodsError,
    },
}

/// How a reflector works.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReflectorSettings {
    /// How long one watch request asks the server to keep its stream open.
    pub watch_request: Duration,
    /// A store whose LIST is older than this is listed again (`None`: never).
    pub relist_after: Option<Duration>,
}

/// The stores of every watched namespace.
#[derive(Debug, Default)]
pub struct Informer {
    stores: Mutex<BTreeMap<String, Store>>,
    /// Signalled whenever a store is listed.
    listed: tokio::sync::Notify,
}

impl Informer {
    /// Marks every store as not yet current: at the start of an invocation nothing says
    /// how long the container was frozen; each store becomes live again when its watch
    /// resumes.
    pub(crate) fn suspend(&self) {
        for store in lock(&self.stores).values_mut() {
            store.live = false;
        }
    }

    /// Pods held in every store: what the container's memory grows with (~1.2 KiB
    /// each; see `ResyncMemorySize` in the README).
    pub(crate) fn pods_held(&self) -> usize {
        lock(&self.stores).values().map(|s| s.pods.len()).sum()
    }

    /// Drops the stores of namespaces not in `keep` (no longer bound).
    pub(crate) fn retain(&self, keep: impl Fn(&str) -> bool) {
        lock(&self.stores).retain(|ns, _| keep(ns));
    }

    /// The pods of `binding`'s namespace it selects (a superset is fine: callers apply
    /// the binding) and the version they are current to, if that namespace's store is
    /// live and holds every pod the binding selects (its selection covers the
    /// binding's: a store filtered by terms the binding lacks would miss pods, and a
    /// pass would deregister them).
    pub(crate) fn view(&self, binding: &Binding) -> Option<(Vec<PodFacts>, String)> {
        let stores = lock(&self.stores);
        let store = stores.get(&binding.namespace).filter(|s| {
            s.listed
                && s.live
                && s.selector
                    .as_ref()
                    .is_none_or(|sel| sel.covers(&binding.selector))
        })?;
        let pods = store
            .pods
            .values()
            .filter(|p| binding.selector.matches(&p.labels))
            .cloned()
            .collect();
        Some((pods, store.version.clone()))
    }

    /// `f` of `namespace`'s pods by name, while its store is listed and live (`None`
    /// otherwise): read in place, since a namespace can hold tens of thousands.
    pub(crate) fn with_pods<R>(
        &self,
        namespace: &str,
        f: impl FnOnce(&BTreeMap<String, PodFacts>) -> R,
    ) -> Option<R> {
        let stores = lock(&self.stores);
        let store = stores.get(namespace).filter(|s| s.listed && s.live)?;
        Some(f(&store.pods))
    }

    /// Whether `namespace`'s store is listed and live.
    pub(crate) fn is_live(&self, namespace: &str) -> bool {
        lock(&self.stores)
            .get(namespace)
            .is_some_and(|s| s.listed && s.live)
    }

    /// Waits until `namespace`'s store is listed and live (or `give_up` comes).
    pub(crate) async fn wait_live(&self, namespace: &str, give_up: tokio::time::Instant) -> bool {
        loop {
            let listed = self.listed.notified();
            let mut listed = std::pin::pin!(listed);
            listed.as_mut().enable();
            if self.is_live(namespace) {
                return true;
            }
            if tokio::time::timeout_at(give_up, listed).await.is_err() {
                return self.is_live(namespace);
            }
        }
    }

    /// Keeps `namespace`'s store current with `selector`, forever (the caller drops the
    /// future to stop it): LIST when needed (see the module docs), then WATCH from the
    /// store's version, resuming a stream the server ends and backing off on errors.
    /// Every change is told to `sink`.
    pub(crate) async fn reflect<P: PodSource>(
        &self,
        pods: &P,
        clock: &dyn Clock,
        namespace: &str,
        selector: Option<Selector>,
        settings: ReflectorSettings,
        sink: &(dyn Fn(StoreEvent<'_>) + Sync),
    ) {
        let mut failures = 0u32;
        loop {
            if self.needs_list(namespace, &selector, clock.now(), settings) {
                match pods.list_versioned(namespace, selector.as_ref()).await {
                    Ok(listing) => {
                        let count = listing.pods.len();
                        let listed_at = clock.now();
                        let (again, changed) = {
                            let mut stores = lock(&self.stores);
                            let current = stores.get(namespace).map(|s| s.listed && s.live);
                            let store = stores.entry(namespace.to_owned()).or_default();
                            store.selector.clone_from(&selector);
                            let before = std::mem::replace(
                                &mut store.pods,
                                listing
                                    .pods
                                    .into_iter()
                                    .map(|p| (p.pod.name.clone(), p))
                                    .collect(),
                            );
                            store.version = listing.resource_version;
                            store.listed = true;
                            store.live = true;
                            store.listed_at = listed_at;
                            // A store current until this LIST (a changed selection, the
                            // relist period) tells exactly what changed.
                            let changed = match current {
                                Some(true) => differences(&before, &store.pods),
                                _ => Vec::new(),
                            };
                            (current == Some(false), changed)
                        };
                        self.listed.notify_waiters();
                        sink(StoreEvent::Listed {
                            namespace,
                            pods: count,
                            again,
                        });
                        for (before, after) in &changed {
                            sink(StoreEvent::Pod {
                                namespace,
                                before: before.as_ref(),
                                after: after.as_ref(),
                                seen_at: listed_at,
                            });
                        }
                        failures = 0;
                    }
                    Err(e) => {
                        tracing::warn!(namespace, error = %e, "listing pods for the watch failed; retrying after a backoff");
                        self.set_live(namespace, false);
                        sink(StoreEvent::Failed {
                            namespace,
                            error: &e,
                        });
                        failures += 1;
                        tokio::time::sleep(watch_retry(failures)).await;
                        continue;
                    }
                }
            }
            let version = self.version(namespace);
            let stream = pods
                .watch(
                    namespace,
                    selector.as_ref(),
                    &version,
                    settings.watch_request,
                )
                .await;
            let mut stream = match stream {
                Ok(s) => s,
                Err(PodsError::Expired { .. }) => {
                    self.set_gap(namespace);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(namespace, error = %e, "starting the watch failed; retrying after a backoff");
                    self.set_live(namespace, false);
                    sink(StoreEvent::Failed {
                        namespace,
                        error: &e,
                    });
                    failures += 1;
                    tokio::time::sleep(watch_retry(failures)).await;
                    continue;
                }
            };
            if !self.is_live(namespace) {
                self.set_live(namespace, true);
                self.listed.notify_waiters();
                sink(StoreEvent::Resumed);
            }
            while let Some(event) = stream.next().await {
                match event {
                    Ok(WatchEvent::Bookmark { resource_version }) => {
                        self.set_version(namespace, resource_version);
                    }
                    Ok(WatchEvent::Error(status)) if status.code == 410 => {
                        self.set_gap(namespace);
                        break;
                    }
                    Ok(WatchEvent::Error(status)) => {
                        tracing::warn!(namespace, code = status.code, message = %status.message, "the watch ended with an error; resuming after a backoff");
                        self.set_live(namespace, false);
                        failures += 1;
                        tokio::time::sleep(watch_retry(failures)).await;
                        break;
                    }
                    Ok(event) => {
                        failures = 0;
                        self.apply(namespace, event, clock.now(), sink);
                    }
                    Err(e) => {
                        tracing::info!(namespace, error = %e, "the watch stream broke off; resuming from the last version seen");
                        self.set_live(namespace, false);
                        failures += 1;
                        tokio::time::sleep(watch_retry(failures)).await;
                        break;
                    }
                }
            }
        }
    }

    /// Whether `namespace` must be listed before it is watched.
    fn needs_list(
        &self,
        namespace: &str,
        selector: &Option<Selector>,
        now: UnixMillis,
        settings: ReflectorSettings,
    ) -> bool {
        let stores = lock(&self.stores);
        let Some(store) = stores.get(namespace) else {
            return true;
        };
        let stale = settings
            .relist_after
            .is_some_and(|after| now >= store.listed_at.plus(after));
        !store.listed || store.selector != *selector || store.version.is_empty() || stale
    }

    fn version(&self, namespace: &str) -> String {
        lock(&self.stores)
            .get(namespace)
            .map(|s| s.version.clone())
            .unwrap_or_default()
    }

    fn set_version(&self, namespace: &str, version: String) {
        if let Some(store) = lock(&self.stores).get_mut(namespace) {
            store.version = version;
        }
    }

    fn set_live(&self, namespace: &str, live: bool) {
        if let Some(store) = lock(&self.stores).get_mut(namespace) {
            store.live = live;
        }
    }

    /// The watch cannot resume (410): the store has a gap and must be listed again
    /// before anyone uses it.
    fn set_gap(&self, namespace: &str) {
        if let Some(store) = lock(&self.stores).get_mut(namespace) {
            store.listed = false;
            store.live = false;
        }
    }

    /// Applies one pod event to the store and tells `sink`.
    fn apply(
        &self,
        namespace: &str,
        event: WatchEvent,
        seen_at: UnixMillis,
        sink: &(dyn Fn(StoreEvent<'_>) + Sync),
    ) {
        let (watched, deleted) = match event {
            WatchEvent::Added(p) | WatchEvent::Modified(p) => (p, false),
            WatchEvent::Deleted(p) => (p, true),
            WatchEvent::Bookmark { .. } | WatchEvent::Error(_) => return,
        };
        let name = watched.facts.pod.name.clone();
        let before = {
            let mut stores = lock(&self.stores);
            let Some(store) = stores.get_mut(namespace) else {
                return;
            };
            if let Some(v) = &watched.resource_version {
                store.version.clone_from(v);
            }
            if deleted {
                store.pods.remove(&name)
            } else {
                store.pods.insert(name, watched.facts.clone())
            }
        };
        let after = (!deleted).then_some(&watched.facts);
        sink(StoreEvent::Pod {
            namespace,
            before: before.as_ref(),
            after,
            seen_at,
        });
    }
}

/// The pods that differ between two stores' contents, each as it was and as it is
/// (`None`: absent).
fn differences(
    before: &BTreeMap<String, PodFacts>,
    after: &BTreeMap<String, PodFacts>,
) -> Vec<(Option<PodFacts>, Option<PodFacts>)> {
    let gone = before
        .iter()
        .filter(|(name, _)| !after.contains_key(*name))
        .map(|(_, was)| (Some(was.clone()), None));
    let changed = after
        .iter()
        .filter(|(name, is)| before.get(*name) != Some(*is))
        .map(|(name, is)| (before.get(name).cloned(), Some(is.clone())));
    gone.chain(changed).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relist_of_a_current_store_tells_each_pod_it_changed() {
        use crate::testkit::PodBuilder;
        let facts = |name: &str, ready: bool| {
            let pod = PodBuilder::new("shop", name).ip("10.0.0.1").ready(ready);
            (name.to_owned(), PodFacts::from_pod(pod.build()))
        };
        let before = BTreeMap::from([
            facts("same", true),
            facts("gone", true),
            facts("turned", true),
        ]);
        let after = BTreeMap::from([
            facts("same", true),
            facts("turned", false),
            facts("new", true),
        ]);
        let mut told: Vec<(Option<String>, Option<String>, bool)> = differences(&before, &after)
            .into_iter()
            .map(|(b, a)| {
                let ready = a.as_ref().is_some_and(|p| p.ready);
                let name = |p: PodFacts| p.pod.name.clone();
                (b.map(name), a.map(name), ready)
            })
            .collect();
        told.sort();
        assert_eq!(
            told,
            [
                (None, Some("new".to_owned()), true),
                (Some("gone".to_owned()), None, false),
                (Some("turned".to_owned()), Some("turned".to_owned()), false),
            ]
        );
    }
}
