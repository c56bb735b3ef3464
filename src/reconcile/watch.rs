//! Watch mode, in one place: beside its full diff, the scheduled resync keeps a WATCH on
//! the pods of every bound namespace (each from the moment the full diff has listed it)
//! until shortly before its next run, and reconciles a group as soon as one of its pods
//! changes in a way that can change the group — the reaction time of an in-cluster
//! controller, from outside the cluster, also while a large fleet's full diff is still
//! paced through its Describe budget.
//!
//! The watch is only a hint of *which* groups to look at: each is reconciled through the
//! same observation, lease, fresh LIST and diff as everything else (a pass it starts may
//! meet the full diff's on the group's lease, as pod-events' would). It resumes from the
//! full diff's LIST (so nothing in between is missed), resumes a stream that simply ends
//! (a server timeout or a cut connection) from the last version seen, and on a 410 lists
//! again and reconciles the namespace's groups; nothing is ever decided from an event
//! alone. While a gated pod's target is registered and not yet healthy, its group's
//! target health is read every few seconds and the gate opened as soon as the NLB says
//! healthy.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use super::{BoundGroup, Engine, RunOptions, Scope};
use crate::core::{HealthState, PodFacts, Selector, Target, UnixMillis, contribution};
use crate::groups::TargetGroupApi;
use crate::pods::{Listing, PodSource, PodsError, WatchEvent};
use crate::report::{GroupReport, Outcome, WatchReport};
use crate::state::StateStore;
use futures::StreamExt as _;

/// How long one watch request asks the server to keep the stream open: under the
/// client's 30 s read timeout, so a quiet namespace ends its stream cleanly and resumes.
pub const WATCH_REQUEST: Duration = Duration::from_secs(25);
/// Events arriving within this of each other are reconciled in one batch.
const DEBOUNCE: Duration = Duration::from_millis(20);
/// How often target health of groups with a gate waiting is read.
pub const GATE_POLL: Duration = Duration::from_secs(1);
/// Pause before resuming a watch that failed to start or broke off.
const RETRY: Duration = Duration::from_millis(500);

/// What the watchers share: every watched pod's last state, the groups to reconcile,
/// and the groups with a gate waiting for a healthy target.
struct Shared {
    pods: Mutex<BTreeMap<(String, String), PodFacts>>,
    dirty: Mutex<BTreeSet<String>>,
    gated: Mutex<BTreeSet<String>>,
    wake: tokio::sync::Notify,
    report: Mutex<WatchReport>,
}

impl Shared {
    /// Makes `listed` the whole of `namespace`'s pod states.
    fn replace_pods(&self, namespace: &str, listed: Vec<PodFacts>) {
        let mut pods = lock(&self.pods);
        pods.retain(|(ns, _), _| ns != namespace);
        for p in listed {
            pods.insert((namespace.to_owned(), p.pod.name.clone()), p);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the full diff hands to the watch that runs beside it: the bound groups once
/// discovered, and each namespace's LIST as soon as it is read, so a namespace is
/// watched from its LIST on while the full diff still works through the other groups.
#[derive(Default)]
pub(crate) struct Seeds {
    state: Mutex<SeedState>,
    changed: tokio::sync::Notify,
}

#[derive(Default)]
struct SeedState {
    bound: Option<Vec<BoundGroup>>,
    listings: BTreeMap<String, Listing>,
    finished: bool,
}

impl std::fmt::Debug for Seeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seeds").finish_non_exhaustive()
    }
}

impl Seeds {
    /// Discovery is done: these groups are bound.
    pub(crate) fn set_bound(&self, bound: Vec<BoundGroup>) {
        lock(&self.state).bound = Some(bound);
        self.changed.notify_waiters();
    }

    /// The full diff listed `namespace`.
    pub(crate) fn listed(&self, namespace: &str, listing: &Listing) {
        lock(&self.state)
            .listings
            .insert(namespace.to_owned(), listing.clone());
        self.changed.notify_waiters();
    }

    /// The full diff is over: whatever was not handed over will not be.
    pub(crate) fn finish(&self) {
        lock(&self.state).finished = true;
        self.changed.notify_waiters();
    }

    /// Waits until `take` finds what it wants, or the full diff is over (`None`).
    async fn wait<T>(&self, take: impl Fn(&mut SeedState) -> Option<T>) -> Option<T> {
        loop {
            let notified = self.changed.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = lock(&self.state);
                if let Some(v) = take(&mut state) {
                    return Some(v);
                }
                if state.finished {
                    return None;
                }
            }
            notified.await;
        }
    }
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    /// The scheduled resync in watch mode: the full diff, and beside it, from the moment
    /// the groups are discovered, a watch of the bound namespaces until `until` (see the
    /// module docs).
    pub async fn resync_and_watch(
        &self,
        opts: &RunOptions,
        until: UnixMillis,
    ) -> crate::report::Report {
        let seeds = Seeds::default();
        let watch = async {
            match seeds.wait(|s| s.bound.take()).await {
                Some(bound) => self.watch(bound, &seeds, opts, until).await,
                None => WatchReport::default(),
            }
        };
        let ((mut report, _), watch) =
            futures::join!(self.resync_scoped(opts, Some(&seeds)), watch);
        report.watch = Some(watch);
        report.finish(self.clock.now())
    }

    /// Watches the namespaces of `bound`, each from the LIST the full diff hands over in
    /// `seeds` (or from a LIST of its own), until `until`.
    async fn watch(
        &self,
        bound: Vec<BoundGroup>,
        seeds: &Seeds,
        opts: &RunOptions,
        until: UnixMillis,
    ) -> WatchReport {
        let started = self.clock.now();
        let remaining = Duration::from_millis(until.0.saturating_sub(started.0));
        let shared = Shared {
            pods: Mutex::new(BTreeMap::new()),
            dirty: Mutex::new(BTreeSet::new()),
            gated: Mutex::new(BTreeSet::new()),
            wake: tokio::sync::Notify::new(),
            report: Mutex::new(WatchReport::default()),
        };
        let mut by_namespace: BTreeMap<String, Vec<&BoundGroup>> = BTreeMap::new();
        for b in &bound {
            by_namespace
                .entry(b.binding.namespace.clone())
                .or_default()
                .push(b);
        }
        lock(&shared.report).namespaces = by_namespace.len();
        let readers = futures::future::join_all(by_namespace.iter().map(|(ns, groups)| {
            let shared = &shared;
            async move {
                let version = match seeds.wait(|s| s.listings.remove(ns.as_str())).await {
                    Some(listing) => {
                        self.seed_namespace(ns, groups, listing.pods, shared);
                        listing.resource_version
                    }
                    // Not listed by the full diff (failed, or deferred): list here.
                    None => String::new(),
                };
                self.read_namespace(ns, groups, version, shared).await;
            }
        }));
        let work = async {
            futures::join!(
                readers,
                self.reconcile_dirty(&bound, &shared, opts),
                self.poll_gates(&bound, &shared)
            )
        };
        // The one exit: the watch ends when its time is up, whatever is in flight.
        let _ = tokio::time::timeout(remaining, work).await;
        let mut report = shared
            .report
            .into_inner()
            .unwrap_or_else(|p| p.into_inner());
        report.watched_ms = self.clock.now().0.saturating_sub(started.0);
        report
    }

    /// Takes the full diff's view of a namespace's pods as the watch's starting point,
    /// and notes its groups with a gate waiting.
    fn seed_namespace(
        &self,
        namespace: &str,
        groups: &[&BoundGroup],
        listed: Vec<PodFacts>,
        shared: &Shared,
    ) {
        shared.replace_pods(namespace, listed);
        for b in groups {
            if self.gate_pending(b, shared) {
                lock(&shared.gated).insert(b.group.arn.clone());
            }
        }
    }

    /// Reads one namespace's watch forever (the caller's timeout ends it): applies each
    /// event to the pod states, marks the groups it can change, and resumes or lists
    /// again as the stream requires.
    async fn read_namespace(
        &self,
        namespace: &str,
        groups: &[&BoundGroup],
        mut version: String,
        shared: &Shared,
    ) {
        let selector = Selector::common(groups.iter().map(|b| &b.binding.selector));
        let mut need_list = version.is_empty();
        loop {
            if need_list {
                match self.pods.list_versioned(namespace, selector.as_ref()).await {
                    Ok(listing) => {
                        self.replace_namespace(namespace, groups, listing.pods, shared);
                        version = listing.resource_version;
                        need_list = false;
                        lock(&shared.report).relisted += 1;
                    }
                    Err(e) => {
                        tracing::warn!(namespace, error = %e, "listing pods for the watch failed; retrying");
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                }
            }
            let stream = self
                .pods
                .watch(
                    namespace,
                    selector.as_ref(),
                    &version,
                    self.settings.watch_request,
                )
                .await;
            let mut stream = match stream {
                Ok(s) => s,
                Err(PodsError::Expired { .. }) => {
                    need_list = true;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(namespace, error = %e, "starting the watch failed; retrying");
                    lock(&shared.report).errors.push(e.to_string());
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            while let Some(event) = stream.next().await {
                match event {
                    Ok(WatchEvent::Bookmark { resource_version }) => version = resource_version,
                    Ok(WatchEvent::Error(status)) if status.code == 410 => {
                        need_list = true;
                        break;
                    }
                    Ok(WatchEvent::Error(status)) => {
                        tracing::warn!(namespace, code = status.code, message = %status.message, "the watch ended with an error; resuming");
                        break;
                    }
                    Ok(event) => {
                        if let Some(v) = self.apply(namespace, groups, event, shared) {
                            version = v;
                        }
                    }
                    Err(e) => {
                        tracing::info!(namespace, error = %e, "the watch stream broke off; resuming from the last version seen");
                        tokio::time::sleep(RETRY).await;
                        break;
                    }
                }
            }
            lock(&shared.report).resumed += 1;
        }
    }

    /// Applies one pod event; returns its resource version.
    fn apply(
        &self,
        namespace: &str,
        groups: &[&BoundGroup],
        event: WatchEvent,
        shared: &Shared,
    ) -> Option<String> {
        let (watched, deleted) = match event {
            WatchEvent::Added(p) | WatchEvent::Modified(p) => (p, false),
            WatchEvent::Deleted(p) => (p, true),
            WatchEvent::Bookmark { .. } | WatchEvent::Error(_) => return None,
        };
        let key = (namespace.to_owned(), watched.facts.pod.name.clone());
        let before = {
            let mut pods = lock(&shared.pods);
            if deleted {
                pods.remove(&key)
            } else {
                pods.insert(key, watched.facts.clone())
            }
        };
        let after = (!deleted).then_some(&watched.facts);
        let mut marked = false;
        for b in groups {
            let was = before.as_ref().and_then(|p| contribution(p, &b.binding));
            let is = after.and_then(|p| contribution(p, &b.binding));
            // A pod never seen before may be one the full diff did not see either.
            if was != is || (before.is_none() && is.is_some()) {
                lock(&shared.dirty).insert(b.group.arn.clone());
                marked = true;
            }
        }
        {
            let mut report = lock(&shared.report);
            report.events += 1;
            report.relevant_events += u64::from(marked);
        }
        if marked {
            shared.wake.notify_one();
        }
        watched.resource_version
    }

    /// After a fresh LIST: the namespace's pod states are replaced and every group in it
    /// is reconciled (what changed while the watch could not follow is unknown).
    fn replace_namespace(
        &self,
        namespace: &str,
        groups: &[&BoundGroup],
        listed: Vec<PodFacts>,
        shared: &Shared,
    ) {
        shared.replace_pods(namespace, listed);
        lock(&shared.dirty).extend(groups.iter().map(|b| b.group.arn.clone()));
        shared.wake.notify_one();
    }

    /// Reconciles the groups marked dirty, in batches, as they come.
    async fn reconcile_dirty(&self, bound: &[BoundGroup], shared: &Shared, opts: &RunOptions) {
        let opts = RunOptions {
            dry_run: false,
            force: false,
            only: None,
            deadline: opts.deadline,
            use_checkpoint: false,
        };
        loop {
            shared.wake.notified().await;
            tokio::time::sleep(DEBOUNCE).await;
            let dirty = std::mem::take(&mut *lock(&shared.dirty));
            if dirty.is_empty() {
                continue;
            }
            let groups: Vec<BoundGroup> = bound
                .iter()
                .filter(|b| dirty.contains(&b.group.arn))
                .cloned()
                .collect();
            let reports = self
                .reconcile_scoped(groups, &opts, &Scope::default())
                .await;
            let mut report = lock(&shared.report);
            report.passes += reports.len() as u64;
            for r in reports {
                report.registered += r.registered.len();
                report.deregistered += r.deregistered.len();
                report.gates_opened.extend(r.gates_opened.iter().cloned());
                let eventful = !r.registered.is_empty()
                    || !r.deregistered.is_empty()
                    || !r.gates_opened.is_empty()
                    || matches!(r.outcome, Outcome::Failed | Outcome::BindingError);
                if eventful {
                    report.changes.push(r);
                }
            }
            drop(report);
            for b in bound.iter().filter(|b| dirty.contains(&b.group.arn)) {
                if self.gate_pending(b, shared) {
                    lock(&shared.gated).insert(b.group.arn.clone());
                }
            }
        }
    }

    /// Whether a gated pod of `b` waits for its gate (as the watch last saw the pods).
    fn gate_pending(&self, b: &BoundGroup, shared: &Shared) -> bool {
        lock(&shared.pods)
            .values()
            .any(|p| matches!(contribution(p, &b.binding), Some((_, Some(false)))))
    }

    /// Every [`GATE_POLL`], reads the target health of the groups with a gate waiting and
    /// opens the gates of pods whose target is healthy (no lease: the patch carries the
    /// pod's UID, and opening a gate changes no target).
    async fn poll_gates(&self, bound: &[BoundGroup], shared: &Shared) {
        loop {
            tokio::time::sleep(GATE_POLL).await;
            let gated = lock(&shared.gated).clone();
            for b in bound.iter().filter(|b| gated.contains(&b.group.arn)) {
                let waiting: Vec<(Target, PodFacts)> = lock(&shared.pods)
                    .values()
                    .filter_map(|p| match contribution(p, &b.binding) {
                        Some((t, Some(false))) => Some((t, p.clone())),
                        _ => None,
                    })
                    .collect();
                if waiting.is_empty() {
                    lock(&shared.gated).remove(&b.group.arn);
                    continue;
                }
                let Ok(health) = self.groups.health(&b.group.arn).await else {
                    continue;
                };
                for (target, pod) in waiting {
                    let healthy = health
                        .iter()
                        .any(|h| h.target == target && h.state == HealthState::Healthy);
                    if !healthy {
                        continue;
                    }
                    let mut r =
                        GroupReport::new(&b.group.arn, &b.group.group_name(), Outcome::InSync);
                    self.open_gate(&pod.pod, &mut r).await;
                    let mut report = lock(&shared.report);
                    if r.pod_errors.is_empty() {
                        report.gates_opened.append(&mut r.gates_opened);
                    } else {
                        report.changes.push(r);
                    }
                }
            }
        }
    }
}
