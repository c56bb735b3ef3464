//! The controller inside the scheduled resync: kube-runtime's Controller, from outside
//! the cluster.
//!
//! ```text
//!   informer (LIST once, WATCH always; stores kept in the warm container)
//!      │ pod changes, relists                discovery (tags) ─┐
//!      ▼                                                        ▼
//!   queue (one key per target group: dedupe, re-run if changed, wait until a time)
//!      │                                     ▲ the full diff: every bound group
//!      ▼                                     │
//!   runner (each key's pass on its own: nothing waits for another group)
//!      │
//!      ▼
//!   one group's pass (`reconcile`: observe → lease → pods → health → plan → apply)
//! ```
//!
//! One scheduled invocation runs the controller until shortly before the next tick:
//! the watches start at once — from the bindings the warm container holds, or the
//! state table's index on a cold start — while discovery reads every group's tags
//! beside them; every bound group is then enqueued for the full diff (verified against
//! ELBv2 within the Describe budget), and every pod change for the groups it can
//! change (a change seen before discovery has bound its groups, as soon as the groups
//! the index names for it are read ahead of discovery, or discovery binds them; a
//! change made before a cold container's first LIST, likewise, once that LIST is
//! compared with the indexed groups' ledgers: see `early`). A group's pass knows
//! nothing of watches: it gets pods the store holds (or
//! reads them afresh when the store is behind the group's last pass) and runs under
//! the group's lease like any other pass. A pass that waits — for a lease another
//! process holds, for its backoff — gives its turn back to the queue with a time to
//! come back, so no group ever waits for another.

mod early;
pub mod informer;
mod one_pass;
pub mod pod_event;
pub mod queue;
mod runner;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;

use crate::core::checkpoint::rank_order;
use crate::core::{PodIndex, Selector, UnixMillis, contribution};
use crate::groups::TargetGroupApi;
use crate::index::Snapshot;
use crate::pods::PodSource;
use crate::reconcile::{Action, BoundGroup, Engine, PodReads, RunOptions};
use crate::report::{GroupReport, Outcome, Report, WatchReport};
use crate::state::StateStore;
use crate::sync::lock;
use early::Early;
use informer::{Informer, ReflectorSettings, StoreEvent};
use queue::{Queue, Want};

pub use queue::GATE_POLL;

/// How long one watch request asks the server to keep the stream open: under the
/// client's 30 s read timeout, so a quiet namespace ends its stream cleanly and resumes.
pub const WATCH_REQUEST: Duration = Duration::from_secs(25);

/// The default relist period (`TGSYNC_RELIST_MINUTES`, 120): a safety net only — the
/// watch protocol itself guarantees no gap (a 410 or an error relists at once) — priced
/// so that at 100,000 pods (a ~430 MiB LIST) it costs under 1 % of a LIST per minute on
/// average.
pub const RELIST_AFTER: Duration = Duration::from_secs(120 * 60);

/// A watching run discovers the bound groups again this often: a group tagged (or
/// untagged) while it watches is bound (or let go) within this.
pub const DISCOVERY_EVERY: Duration = Duration::from_secs(60);

/// How long passes still running when the controller's time is up may take to finish
/// (they are cut, cleanly, at the end of it).
const DRAIN: Duration = Duration::from_secs(5);

/// How long a job waits for its namespace's store to be listed before it reads the
/// group's pods itself.
const STORE_WAIT: Duration = Duration::from_secs(30);

/// Groups whose ledgers one comparison with a first LIST reads at a time (BatchGetItem's
/// limit; at ~120 bytes a target, about 1.2 MB at 100 targets a group).
const COMPARE_BATCH: usize = 100;

/// A namespace's first LIST in a cold container, to compare with the ledgers of the
/// groups its index rows name (see `early`).
#[derive(Debug)]
struct FirstList {
    namespace: String,
    /// When the LIST was seen.
    seen: UnixMillis,
}

/// What the controller keeps in the warm container between invocations.
#[derive(Debug, Default)]
pub struct Controller {
    /// The pod stores.
    pub informer: Informer,
    /// The work queue: the requests one invocation could not serve are the next one's
    /// first (they are handed on to the state table too, should another container run).
    pub queue: Mutex<Queue>,
    /// The full diffs this container ran, and the last of them that looked at each
    /// group: the next full diff starts with the groups looked at longest ago.
    looked: Mutex<Looked>,
}

/// When each group last had its full-diff look in this container.
#[derive(Debug, Default)]
struct Looked {
    /// Full diffs started (the current one's number).
    runs: u64,
    /// Group ARN → the number of the last full diff that looked at it.
    at: HashMap<String, u64>,
}

/// One invocation's controller state.
struct Run<'e, P, G, S> {
    engine: &'e Engine<P, G, S>,
    /// Options of every pass (never a dry run).
    opts: RunOptions,
    /// Signalled when the queue gets a request.
    wake: tokio::sync::Notify,
    /// The namespaces to watch, each with the selection its groups share.
    namespaces: tokio::sync::watch::Sender<BTreeMap<String, Option<Selector>>>,
    /// The pod changes seen until discovery binds the groups (then replayed for the
    /// groups the watch did not know yet; `None` after).
    early: Mutex<Option<Early>>,
    /// Indexed groups a pod change named before discovery, to read ahead of it
    /// (`read_ahead`).
    to_read: Mutex<Vec<String>>,
    /// First LISTs of a cold container to compare with the ledgers (`compare_lists`).
    to_compare: Mutex<std::collections::VecDeque<FirstList>>,
    /// Signalled when `to_read` gets a group, and when discovery is done.
    read_wake: tokio::sync::Notify,
    /// Signalled when `to_compare` gets a LIST, and when discovery is done.
    compare_wake: tokio::sync::Notify,
    /// The full diff's verification plan, once discovery is done.
    verify: Mutex<Verify>,
    /// Signalled when a group of the full diff has had its look.
    verified: tokio::sync::Notify,
    /// The full diff's read-ahead of the groups' states, in its visit order.
    ahead: std::sync::OnceLock<crate::reconcile::ReadAhead>,
    /// The verifications in flight, stood down or promoted when a pod change of their
    /// group arrives (the change waits for them: one pass per group at a time).
    promotions: Mutex<HashMap<String, crate::groups::Promotion>>,
    /// What happened, for the report.
    out: Mutex<Outcomes>,
}

/// The full diff's verification plan.
#[derive(Debug, Default)]
struct Verify {
    /// Groups whose re-verification turn has come.
    due: Option<HashSet<String>>,
    /// This cluster's index, as read at the start (shared: every look borrows it).
    indexed: Option<Arc<BTreeSet<String>>>,
    /// Groups the full diff has not looked at yet.
    remaining: HashSet<String>,
}

/// What the passes of one invocation did.
#[derive(Debug, Default)]
struct Outcomes {
    /// The full diff's report of each group (its last verification pass).
    full: BTreeMap<String, GroupReport>,
    watch: WatchReport,
    /// Reaction latencies (pod change seen → its pass answered), ms.
    reactions: Vec<u64>,
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    /// The scheduled resync as a controller (see the module docs): watches, the full
    /// diff of every bound group, and every pod change acted on, until `until`; passes
    /// still running then finish (or are cut cleanly and ask for another pass).
    pub async fn run_scheduled(&self, opts: &RunOptions, until: UnixMillis) -> Report {
        let started = self.clock.now();
        let real_until =
            tokio::time::Instant::now() + Duration::from_millis(until.0.saturating_sub(started.0));
        let mut report = Report::new("resync", &self.cluster, false, started);
        let pressure = self.groups.pressure();
        self.controller.informer.suspend();
        let drain_end = until.plus(DRAIN);
        let run = Run {
            engine: self,
            opts: RunOptions {
                dry_run: false,
                force: false,
                only: None,
                deadline: opts.deadline,
                use_checkpoint: true,
                cut_at: Some(match opts.deadline {
                    Some(d) if d > started => drain_end.min(UnixMillis(d.0.saturating_sub(3_000))),
                    _ => drain_end,
                }),
            },
            wake: tokio::sync::Notify::new(),
            namespaces: tokio::sync::watch::Sender::new(BTreeMap::new()),
            early: Mutex::new(Some(Early::default())),
            to_read: Mutex::new(Vec::new()),
            to_compare: Mutex::default(),
            read_wake: tokio::sync::Notify::new(),
            compare_wake: tokio::sync::Notify::new(),
            verify: Mutex::new(Verify::default()),
            verified: tokio::sync::Notify::new(),
            ahead: std::sync::OnceLock::new(),
            promotions: Mutex::new(HashMap::new()),
            out: Mutex::new(Outcomes::default()),
        };
        // Watch first: the namespaces known now, before discovery.
        // A warm container knows its last discovery's groups: the next invocation
        // watches their namespaces and reacts for them from its first second.
        if self.index.is_discovered() {
            run.set_bound(&Snapshot::default(), &self.index.all());
        } else {
            run.watch_indexed().await;
        }
        // The pod changes earlier runs handed on go first.
        run.take_handed_on().await;
        let full_diff = async {
            let outcome = run.discover(&mut report).await;
            if let Some((tagged, indexed, found)) = outcome {
                // The state table's index follows the discovery while the full diff runs.
                futures::join!(run.wait_full_diff(), self.publish_bindings(&found));
                if let Some(indexed) = indexed {
                    let tagged = tagged.iter().map(String::as_str).collect();
                    let orphans = self
                        .orphans(&indexed, &tagged, false, &mut report.errors)
                        .await;
                    report.orphans = Some(orphans);
                }
            }
            // A group tagged while the run watches is bound within a discovery interval.
            loop {
                tokio::time::sleep(DISCOVERY_EVERY).await;
                run.rediscover().await;
            }
        };
        // Boxed: the full diff, watches and passes make a large future (28 KB in a debug
        // build), which would otherwise sit on the caller's stack.
        let background = Box::pin(async {
            futures::join!(
                full_diff,
                run.reflectors(),
                run.read_ahead(),
                run.compare_lists()
            );
        });
        // The one exit: the runner ends the invocation (at `until`, after draining);
        // the watches, discovery and gate polls end with it.
        let runner = runner::Runner::new(self, &self.controller.queue, &run.wake);
        let running = Box::pin(runner.run(runner::Ending::At(real_until), |arn, want| {
            run.job(arn, want)
        }));
        let handed_on = tokio::select! {
            handed_on = running => handed_on,
            () = background => Vec::new(),
        };
        // The warm container keeps the reactions it could not serve for its next
        // invocation (they are handed on too, should another container run it).
        lock(&self.controller.queue).keep_reactions();
        let Outcomes {
            full,
            mut watch,
            reactions: _,
        } = run.out.into_inner().unwrap_or_else(|p| p.into_inner());
        watch.watched_ms = self.clock.now().0.saturating_sub(started.0);
        watch.namespaces = run.namespaces.borrow().len();
        watch.stored_pods = self.controller.informer.pods_held() as u64;
        report.groups.extend(full.into_values());
        report.elb = pressure.since(self.groups.pressure());
        // Groups the full diff did not reach before the end: the next run does them.
        let verify = run.verify.into_inner().unwrap_or_else(|p| p.into_inner());
        let bound = self.index.snapshot();
        report
            .groups
            .extend(verify.remaining.iter().filter_map(|arn| {
                let b = bound.get(arn)?;
                Some(GroupReport::with_error(
                    arn,
                    &b.group.group_name(),
                    Outcome::Deferred,
                    crate::reconcile::DEFERRED,
                ))
            }));
        watch.handed_on = handed_on;
        report.watch = Some(watch);
        report.finish(self.clock.now())
    }
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Run<'_, P, G, S> {
    /// Watches the namespaces of `bound` (the index's groups now), and forgets the
    /// requests of the groups of `previous` no longer among them.
    fn set_bound(&self, previous: &Snapshot, bound: &[BoundGroup]) {
        let by_arn: BTreeSet<&str> = bound.iter().map(|b| b.group.arn.as_str()).collect();
        let mut namespaces: BTreeMap<String, Vec<&BoundGroup>> = BTreeMap::new();
        for b in bound {
            namespaces
                .entry(b.binding.namespace.clone())
                .or_default()
                .push(b);
        }
        let selections: BTreeMap<String, Option<Selector>> = namespaces
            .into_iter()
            .map(|(ns, groups)| {
                let common = Selector::common(groups.iter().map(|b| &b.binding.selector));
                (ns, common)
            })
            .collect();
        {
            let mut queue = lock(&self.engine.controller.queue);
            for arn in previous.keys() {
                if !by_arn.contains(arn.as_str()) {
                    queue.forget(arn);
                }
            }
        }
        self.engine
            .controller
            .informer
            .retain(|ns| selections.contains_key(ns));
        self.namespaces.send_replace(selections);
    }

    /// Asks for the passes of the groups whose pod changes an earlier run (of this
    /// container or another) handed on, before anything else: a group this container
    /// knows bound at once, any other once it is bound (read ahead of discovery, as a
    /// group a first LIST shows out of step is). Their `dirty` flags stay set until a
    /// pass serves them; a read that fails leaves them to those flags.
    async fn take_handed_on(&self) {
        let engine = self.engine;
        let requested: Vec<String> = match engine.state.index_meta(&engine.cluster).await {
            Ok(meta) => meta.requested.into_iter().collect(),
            Err(e) => {
                tracing::debug!(error = %e, "reading the requests earlier runs handed on failed; their groups' dirty flags stay set");
                return;
            }
        };
        if requested.is_empty() {
            return;
        }
        let seen = engine.clock.now();
        let (bound, unknown): (Vec<&String>, Vec<&String>) =
            requested.iter().partition(|arn| engine.index.contains(arn));
        tracing::info!(
            groups = requested.len(),
            "serving first the pod changes earlier runs handed on"
        );
        if !unknown.is_empty() {
            let named = match lock(&self.early).as_mut() {
                Some(early) => early.suspect(unknown.into_iter().cloned().collect(), seen),
                None => Vec::new(),
            };
            lock(&self.to_read).extend(named);
            self.read_wake.notify_one();
        }
        self.ask_changes(bound.iter().map(|arn| (arn.as_str(), seen)));
        if let Err(e) = engine
            .state
            .take_requests(&engine.cluster, &requested)
            .await
        {
            tracing::debug!(error = %e, "taking the handed-on requests failed; the next run asks for them again");
        }
    }

    /// A cold start: watches the namespaces recorded in this cluster's index (each with
    /// the selection its rows share) before discovery has read a single tag.
    async fn watch_indexed(&self) {
        let rows = match self
            .engine
            .state
            .indexed_selections(&self.engine.cluster)
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "reading this cluster's index failed; the watch starts after discovery");
                return;
            }
        };
        // Rows of groups the last discovery found no longer bound are not watched.
        let rows: Vec<_> = rows.into_iter().filter(|r| r.bound).collect();
        if let Some(early) = lock(&self.early).as_mut() {
            early.index(&rows);
        }
        let mut namespaces: BTreeMap<String, Vec<Option<Selector>>> = BTreeMap::new();
        for row in rows {
            namespaces
                .entry(row.namespace)
                .or_default()
                .push(row.selector);
        }
        let selections = namespaces
            .into_iter()
            .map(|(ns, selectors)| {
                let common = if selectors.iter().all(Option::is_some) {
                    Selector::common(selectors.iter().flatten())
                } else {
                    None
                };
                (ns, common)
            })
            .collect();
        self.namespaces.send_replace(selections);
    }

    /// Discovery, beside the watches: the bound groups replace the warm ones, and
    /// every one is enqueued for the full diff. Binding and run errors go into
    /// `report`. Returns the groups tagged for this cluster and the index as read (for
    /// the orphan report) and what discovery found (for the state table's index), or
    /// `None` when discovery failed.
    #[allow(clippy::type_complexity)]
    async fn discover(
        &self,
        report: &mut Report,
    ) -> Option<(
        BTreeSet<String>,
        Option<BTreeSet<String>>,
        crate::reconcile::Bindings,
    )> {
        let engine = self.engine;
        let started = engine.clock.now();
        let bindings = match crate::groups::in_background(engine.bindings()).await {
            Ok(b) => b,
            Err(e) => {
                report
                    .errors
                    .push(format!("discovering target groups failed: {e}"));
                *lock(&self.early) = None;
                self.read_wake.notify_one();
                self.compare_wake.notify_one();
                return None;
            }
        };
        report
            .errors
            .extend(bindings.accounts_failed.iter().map(ToString::to_string));
        let tagged: BTreeSet<String> = bindings
            .bound
            .iter()
            .map(|b| b.group.arn.clone())
            .chain(bindings.errors.iter().map(|e| e.target_group_arn.clone()))
            .collect();
        let unread: Option<BTreeSet<&str>> = bindings
            .accounts_failed
            .iter()
            .map(|f| f.account.as_deref())
            .collect();
        let indexed = match unread {
            Some(unread) => match engine.state.indexed_groups(&engine.cluster).await {
                Ok(mut indexed) => {
                    indexed.retain(|arn| {
                        crate::groups::arn_account(arn).is_none_or(|a| !unread.contains(a))
                    });
                    Some(indexed)
                }
                Err(e) => {
                    report.errors.push(format!(
                        "reading this cluster's index in the state table failed, so orphaned groups were not looked for: {e}"
                    ));
                    None
                }
            },
            None => None,
        };
        let bound = bindings.bound;
        let found = crate::reconcile::Bindings {
            bound: bound.clone(),
            errors: Vec::new(),
            accounts_failed: bindings.accounts_failed,
        };
        // The changes seen so far, for the groups the watch did not know when they came
        // (all of them in a cold container); later ones find the groups bound.
        let early = {
            let mut early = lock(&self.early);
            let known = engine.index.snapshot();
            engine.index.discovered(&bound, None);
            self.set_bound(&known, &bound);
            let now = engine.index.snapshot();
            early
                .take()
                .map(|e| e.marks(&now, &known))
                .unwrap_or_default()
        };
        self.read_wake.notify_one();
        self.compare_wake.notify_one();
        let rotation = engine.rotation(bound.len(), started);
        let ranked = rank_order(bound.iter().map(|b| b.group.arn.as_str()));
        let due: HashSet<String> = ranked
            .iter()
            .enumerate()
            .filter(|(rank, _)| rotation.due(*rank))
            .map(|(_, arn)| (*arn).to_owned())
            .collect();
        report.verification = Some(crate::report::Verification {
            budget_per_run: engine.verify_budget_per_run(),
            cycle_runs: rotation.cycle,
            detection_bound_seconds: rotation
                .detection_bound(engine.settings.schedule_period)
                .as_secs(),
        });
        for e in &bindings.errors {
            engine.pass_done(e, false, None);
        }
        report.groups.extend(bindings.errors);
        let order = {
            let mut looked = lock(&engine.controller.looked);
            looked.runs += 1;
            let keep: HashSet<&str> = bound.iter().map(|b| b.group.arn.as_str()).collect();
            looked.at.retain(|arn, _| keep.contains(arn.as_str()));
            visit_order(
                bound.iter().map(|b| b.group.arn.as_str()),
                &looked.at,
                &Priority {
                    indexed: indexed.as_ref(),
                    due: &due,
                },
                &mut engine.jitter_rng(),
            )
        };
        let _ = self.ahead.set(crate::reconcile::ReadAhead::for_looks(
            order.iter().copied(),
            Some(&due),
            indexed.as_ref(),
            self.opts.use_checkpoint,
        ));
        {
            let mut verify = lock(&self.verify);
            verify.due = Some(due);
            verify.indexed = indexed.clone().map(Arc::new);
            verify.remaining = bound.iter().map(|b| b.group.arn.clone()).collect();
        }
        {
            let mut queue = lock(&self.engine.controller.queue);
            for arn in order {
                queue.request(arn, Want::verify());
            }
            for (arn, seen) in &early {
                queue.request(arn, Want::change(*seen));
            }
        }
        self.wake.notify_one();
        Some((tagged, indexed, found))
    }

    /// Discovery again, while the run watches: the index takes the bound groups found,
    /// the watch their namespaces, and a group bound since (or bound otherwise) gets a
    /// look of the full diff. A discovery that fails leaves the groups as they were.
    async fn rediscover(&self) {
        let engine = self.engine;
        let bindings = match crate::groups::in_background(engine.bindings()).await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "discovering target groups again failed; the groups bound so far stay");
                return;
            }
        };
        for e in &bindings.errors {
            engine.pass_done(e, false, None);
        }
        let previous = engine.index.snapshot();
        engine.index.discovered(&bindings.bound, None);
        self.set_bound(&previous, &bindings.bound);
        {
            let mut queue = lock(&self.engine.controller.queue);
            let mut verify = lock(&self.verify);
            for b in &bindings.bound {
                let arn = &b.group.arn;
                if previous.get(arn).is_none_or(|p| p.binding != b.binding) {
                    verify.remaining.insert(arn.clone());
                    queue.request(arn, Want::verify());
                }
            }
        }
        self.wake.notify_one();
        engine.publish_bindings(&bindings).await;
    }

    /// Until discovery is done, reads the groups pod changes named (`to_read`, 20 at a
    /// time) and binds those whose tags bind them in a watched namespace, each asking
    /// for a pass if a change kept so far can change it: a cold container's first
    /// changes are acted on without waiting for discovery's every page. Discovery's
    /// bindings replace these when it is done. A read that fails leaves its groups to
    /// discovery. (First LISTs are compared with the ledgers beside it:
    /// `compare_lists`.)
    async fn read_ahead(&self) {
        let engine = self.engine;
        loop {
            let woken = self.read_wake.notified();
            let mut woken = std::pin::pin!(woken);
            woken.as_mut().enable();
            if lock(&self.early).is_none() {
                return;
            }
            let batch: Vec<String> = {
                let mut to_read = lock(&self.to_read);
                let n = to_read.len().min(crate::aws::elbv2::TAGS_BATCH);
                to_read.drain(..n).collect()
            };
            if batch.is_empty() {
                woken.await;
                continue;
            }
            let read_at = engine.clock.now();
            let batch = {
                let early = lock(&self.early);
                batch
                    .into_iter()
                    .map(|arn| {
                        let described = early.as_ref().and_then(|e| e.described(&arn)).cloned();
                        (arn, described)
                    })
                    .collect()
            };
            let (groups, undescribed) = match engine.read_groups(batch).await {
                Ok(read) => read,
                Err(e) => {
                    tracing::debug!(error = %e, "reading groups ahead of discovery failed; discovery binds them");
                    continue;
                }
            };
            let watched = self.namespaces.borrow().clone();
            let mut found: BTreeMap<String, BoundGroup> = groups
                .into_iter()
                .filter_map(|g| engine.bind(g, read_at)?.ok())
                .filter(|b| early::watched(&watched, &b.binding))
                .map(|b| (b.group.arn.clone(), b))
                .collect();
            let marks = {
                let early = lock(&self.early);
                let Some(early) = early.as_ref() else {
                    return;
                };
                found.retain(|arn, _| !engine.index.contains(arn));
                engine.index.bound_ahead(found.values().cloned());
                early.marks(&found, &BTreeMap::new())
            };
            self.ask_changes(marks.iter().map(|(arn, seen)| (arn.as_str(), *seen)));
            // Rows of the earlier layout learn their groups' names and facts, so the
            // next cold container reads these groups with DescribeTags alone.
            for b in found
                .values()
                .filter(|b| undescribed.contains(&b.group.arn))
            {
                let recorded = engine.record_bound(b).await;
                if let Err(e) = recorded {
                    tracing::debug!(target_group = %b.group.arn, error = %e, "recording the group's facts in this cluster's index failed; the next cold start describes it again");
                }
            }
        }
    }

    /// Until discovery is done, compares each namespace's first LIST with its groups'
    /// ledgers, beside [`Self::read_ahead`]: a comparison (a BatchGetItem of up to 100
    /// ledgers, ~1.2 MB at 100 targets each, then matching them with the LIST) never
    /// holds up the read-ahead of a change the watch saw. (Taking turns with it, the
    /// comparisons of 10 namespaces held a fresh container's watched changes until
    /// discovery ended at 1,000 groups × 100 pods.)
    async fn compare_lists(&self) {
        loop {
            let woken = self.compare_wake.notified();
            let mut woken = std::pin::pin!(woken);
            woken.as_mut().enable();
            if lock(&self.early).is_none() {
                return;
            }
            // The oldest LIST first: its namespace has gone longest without a look.
            let first = lock(&self.to_compare).pop_front();
            match first {
                Some(first) => self.compare_first_list(&first).await,
                None => woken.await,
            }
        }
    }

    /// Compares a cold container's first LIST of a namespace with the ledgers of the
    /// groups its index names there (read in batches; no ELBv2 call), and names those
    /// out of step to be read ahead of discovery, as a change its watch saw would: a
    /// pod that changed while no container watched is then acted on without waiting
    /// for the full diff. A group already bound is asked for at once. A read that
    /// fails leaves the namespace to the full diff.
    async fn compare_first_list(&self, first: &FirstList) {
        let engine = self.engine;
        for from in (0..).step_by(COMPARE_BATCH) {
            // Looked up batch by batch: `early`'s lock is not held across the reads.
            let chunk = match lock(&self.early).as_ref() {
                Some(early) => early.indexed(&first.namespace, from, COMPARE_BATCH),
                None => return,
            };
            if chunk.is_empty() {
                return;
            }
            let arns: Vec<String> = chunk.iter().map(|(arn, ..)| arn.clone()).collect();
            let states = match engine.state.load_many(&arns).await {
                Ok(states) => states,
                Err(e) => {
                    tracing::debug!(namespace = %first.namespace, error = %e, "reading ledgers to compare with a first LIST failed; the full diff compares them");
                    return;
                }
            };
            let ledgers: HashMap<&str, &crate::state::GroupState> =
                states.iter().map(|(arn, s)| (arn.as_str(), s)).collect();
            // In place, under the store's lock: a namespace may hold tens of thousands.
            let stepped = engine
                .controller
                .informer
                .with_pods(&first.namespace, |pods| {
                    let listed = early::ListedPods::new(&first.namespace, pods.values());
                    chunk
                        .iter()
                        .filter(|(arn, selector, family)| {
                            ledgers.get(arn.as_str()).is_some_and(|s| {
                                let ledger = &s.ledger;
                                early::out_of_step(
                                    selector,
                                    *family,
                                    &listed,
                                    ledger,
                                    &engine.cluster,
                                )
                            })
                        })
                        .map(|(arn, ..)| arn.clone())
                        .collect::<Vec<_>>()
                });
            let Some(stepped) = stepped.filter(|s| !s.is_empty()) else {
                continue;
            };
            tracing::debug!(namespace = %first.namespace, groups = stepped.len(), "a first LIST differs from these groups' ledgers; reading them ahead of discovery");
            let bound: Vec<String> = stepped
                .iter()
                .filter(|arn| engine.index.contains(arn))
                .cloned()
                .collect();
            let named = {
                let mut early = lock(&self.early);
                let Some(early) = early.as_mut() else {
                    return;
                };
                early.suspect(stepped, first.seen)
            };
            lock(&self.to_read).extend(named);
            self.read_wake.notify_one();
            self.ask_changes(bound.iter().map(|arn| (arn.as_str(), first.seen)));
        }
    }

    /// Asks for a change pass of each group, with when its change was seen, and tells
    /// its verification in flight (which the change waits for) to stand down or hurry.
    fn ask_changes<'a>(&self, changes: impl Iterator<Item = (&'a str, UnixMillis)> + Clone) {
        if changes.clone().next().is_none() {
            return;
        }
        {
            let mut queue = lock(&self.engine.controller.queue);
            for (arn, seen) in changes.clone() {
                queue.request(arn, Want::change(seen));
            }
        }
        {
            let promotions = lock(&self.promotions);
            for p in changes.filter_map(|(arn, _)| promotions.get(arn)) {
                p.change_arrived();
            }
        }
        self.wake.notify_one();
    }

    /// Waits until the full diff has looked at every bound group.
    async fn wait_full_diff(&self) {
        loop {
            let verified = self.verified.notified();
            let mut verified = std::pin::pin!(verified);
            verified.as_mut().enable();
            if lock(&self.verify).remaining.is_empty() {
                return;
            }
            verified.await;
        }
    }

    /// Keeps one reflector per namespace to watch, started and stopped as the set
    /// changes.
    async fn reflectors(&self) {
        let engine = self.engine;
        let sink = |event: StoreEvent<'_>| self.store_event(event);
        let mut wanted = self.namespaces.subscribe();
        let mut running: BTreeMap<String, (Option<Selector>, futures::future::AbortHandle)> =
            BTreeMap::new();
        let mut tasks = FuturesUnordered::new();
        let settings = ReflectorSettings {
            watch_request: engine.settings.watch_request,
            relist_after: engine.settings.relist_after,
        };
        loop {
            let target = wanted.borrow_and_update().clone();
            running.retain(|ns, (selector, handle)| {
                let keep = target.get(ns).is_some_and(|s| s == selector);
                if !keep {
                    handle.abort();
                }
                keep
            });
            for (ns, selector) in &target {
                if running.contains_key(ns) {
                    continue;
                }
                let (handle, registration) = futures::future::AbortHandle::new_pair();
                running.insert(ns.clone(), (selector.clone(), handle));
                let ns = ns.clone();
                let selector = selector.clone();
                let sink = &sink;
                tasks.push(futures::future::Abortable::new(
                    async move {
                        engine
                            .controller
                            .informer
                            .reflect(
                                &engine.pods,
                                engine.clock.as_ref(),
                                &ns,
                                selector,
                                settings,
                                sink,
                            )
                            .await;
                    },
                    registration,
                ));
            }
            tokio::select! {
                changed = wanted.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                Some(_) = tasks.next(), if !tasks.is_empty() => {}
            }
        }
    }

    /// What the informer saw: a pod change asks for a pass of every group whose target
    /// set it can change; a (re)list, of every group of the namespace.
    fn store_event(&self, event: StoreEvent<'_>) {
        // Under `early`'s lock, so no change falls between it and the bound groups.
        let bound = {
            let mut early = lock(&self.early);
            if let Some(early) = early.as_mut() {
                match &event {
                    StoreEvent::Listed {
                        namespace,
                        again: true,
                        ..
                    } => early.anything(namespace, self.engine.clock.now()),
                    StoreEvent::Listed {
                        namespace,
                        again: false,
                        ..
                    } if early.first_list(namespace) => {
                        lock(&self.to_compare).push_back(FirstList {
                            namespace: (*namespace).to_owned(),
                            seen: self.engine.clock.now(),
                        });
                        self.compare_wake.notify_one();
                    }
                    StoreEvent::Pod {
                        namespace,
                        before,
                        after,
                        seen_at,
                    } => {
                        let named = early.pod(namespace, *before, *after, *seen_at);
                        if !named.is_empty() {
                            lock(&self.to_read).extend(named);
                            self.read_wake.notify_one();
                        }
                    }
                    _ => {}
                }
            }
            self.engine.index.snapshot()
        };
        let mut seen = self.engine.clock.now();
        let mut marked = Vec::new();
        {
            let mut out = lock(&self.out);
            match event {
                StoreEvent::Listed {
                    namespace,
                    pods,
                    again,
                } => {
                    out.watch.relisted += 1;
                    out.watch.listed_pods += pods as u64;
                    // A first LIST is the full diff's business; a LIST after a gap may
                    // hide any change.
                    if again {
                        marked.extend(
                            bound
                                .values()
                                .filter(|b| b.binding.namespace == namespace)
                                .map(|b| b.group.arn.clone()),
                        );
                    }
                }
                StoreEvent::Resumed => out.watch.resumed += 1,
                StoreEvent::Failed { namespace, error } => {
                    let text = format!("namespace `{namespace}`: {error}");
                    if !out.watch.errors.contains(&text) {
                        out.watch.errors.push(text);
                    }
                }
                StoreEvent::Pod {
                    namespace,
                    before,
                    after,
                    seen_at,
                } => {
                    seen = seen_at;
                    out.watch.events += 1;
                    marked.extend(
                        bound
                            .values()
                            .filter(|b| b.binding.namespace == namespace)
                            .filter(|b| early::changes(&b.binding, before, after))
                            .map(|b| b.group.arn.clone()),
                    );
                    out.watch.relevant_events += u64::from(!marked.is_empty());
                }
            }
        }
        self.ask_changes(marked.iter().map(|arn| (arn.as_str(), seen)));
    }

    /// One key's pass: observe the group from the store's pods, and under its lease
    /// change what must change. Returns what should happen next (the queue decides
    /// when).
    async fn job(&self, arn: String, want: Want) -> (String, Want, Action) {
        let Some(bound) = self.engine.index.get(&arn) else {
            self.finished(&arn, want, None);
            return (arn, want, Action::Done);
        };
        if want.gates_only() {
            let action = self.settle_waiting_gates(&bound).await;
            return (arn, want, action);
        }
        let (report, action) = if want.verify && !want.changed {
            let promotion = crate::groups::Promotion::default();
            lock(&self.promotions).insert(arn.clone(), promotion.clone());
            let looked =
                crate::groups::in_background_until_promoted(promotion, self.pass(&bound, want))
                    .await;
            lock(&self.promotions).remove(&arn);
            match looked {
                Some(report) => report,
                // A pod change arrived before it read anything: the change's pass, asked
                // for, now also does the full diff's look (one health read, not two).
                None => return (arn, want, Action::Requeue),
            }
        } else {
            self.pass(&bound, want).await
        };
        self.finished(&arn, want, report);
        // A gated pod it selects waits for its target to turn healthy: its gate is
        // looked at again soon.
        let action = match action {
            Action::Done if self.gate_pending(&bound) => Action::GatesPending,
            other => other,
        };
        (arn, want, action)
    }

    /// Settles the gates of `bound`'s pods waiting on theirs (see `reconcile::gates`:
    /// open once the target is healthy in every group that selects the pod; closed with
    /// ELBv2's reason meanwhile). No lease: the patch carries the pod's UID, and a gate
    /// changes no target. Gates still waiting are looked at again soon.
    async fn settle_waiting_gates(&self, bound: &BoundGroup) -> Action {
        let engine = self.engine;
        let waiting: Vec<crate::core::PodFacts> = engine
            .controller
            .informer
            .view(&bound.binding)
            .map(|(pods, _)| pods)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| matches!(contribution(p, &bound.binding), Some((_, Some(false)))))
            .collect();
        let arn = &bound.group.arn;
        let mut still = false;
        for pod in waiting {
            let mut r = GroupReport::new(arn, &bound.group.group_name(), Outcome::InSync);
            match engine.settle_gate(&pod, &mut r).await {
                crate::reconcile::Settled::Opened => lock(&self.out)
                    .watch
                    .gates_opened
                    .append(&mut r.gates_opened),
                crate::reconcile::Settled::Failed => lock(&self.out).watch.changes.push(r),
                crate::reconcile::Settled::Closed | crate::reconcile::Settled::Unchanged => {
                    still = true;
                }
            }
        }
        if still {
            Action::GatesPending
        } else {
            Action::Done
        }
    }

    /// Observe, and if something is to change, the leased pass; what should happen
    /// next.
    async fn pass(&self, bound: &BoundGroup, want: Want) -> (Option<GroupReport>, Action) {
        let engine = self.engine;
        let informer = &engine.controller.informer;
        let namespace = &bound.binding.namespace;
        let give_up = tokio::time::Instant::now() + STORE_WAIT;
        let held = if informer.wait_live(namespace, give_up).await {
            informer.view(&bound.binding)
        } else {
            None
        };
        let (pods, _) = match held {
            Some(view) => view,
            None => match engine
                .pods
                .list_versioned(namespace, Some(&bound.binding.selector))
                .await
            {
                Ok(listing) => (listing.pods, listing.resource_version),
                Err(e) => {
                    let report = GroupReport::with_error(
                        &bound.group.arn,
                        &bound.group.group_name(),
                        Outcome::Failed,
                        &e,
                    );
                    return (Some(report), Action::Failed);
                }
            },
        };
        let index = PodIndex::new(&pods);
        let (due, indexed) = {
            let verify = lock(&self.verify);
            let due = if want.changed {
                None
            } else {
                verify.due.as_ref().map(|d| {
                    let mut one = HashSet::new();
                    if d.contains(&bound.group.arn) {
                        one.insert(bound.group.arn.clone());
                    }
                    one
                })
            };
            (due, verify.indexed.clone())
        };
        let opts = RunOptions {
            use_checkpoint: !want.changed,
            ..self.opts.clone()
        };
        let scope = crate::reconcile::Scope {
            due: due.as_ref(),
            indexed: indexed.as_deref(),
            // A pod change's pass reads its group's state alone, now.
            ahead: self.ahead.get().filter(|_| !want.changed),
            ..Default::default()
        };
        let observed = engine.observe(bound, &index, &opts, &scope).await;
        drop(index);
        drop(pods);
        match observed {
            crate::reconcile::Observed::Done(report, action) => (Some(report), action),
            crate::reconcile::Observed::Irrelevant => (None, Action::Done),
            crate::reconcile::Observed::Change(report, prior) => {
                let view = |b: &crate::core::Binding| informer.view(b);
                let reads = PodReads::Held(&view);
                let (report, action) = engine
                    .reconcile_leased(bound.clone(), report, &opts, &reads, Some(prior))
                    .await;
                (Some(report), action)
            }
        }
    }

    /// Records a finished pass: the full diff's result, the watch's counts, the gates
    /// it leaves waiting.
    fn finished(&self, arn: &str, want: Want, report: Option<GroupReport>) {
        if let Some(r) = &report {
            let reaction = want
                .since
                .zip(r.applied_at)
                .map(|(since, applied)| Duration::from_millis(applied.0.saturating_sub(since.0)));
            self.engine.pass_done(r, false, reaction);
            let mut out = lock(&self.out);
            if want.changed {
                out.watch.passes += 1;
                out.watch.registered += r.registered.len();
                out.watch.deregistered += r.deregistered.len();
                out.watch
                    .gates_opened
                    .extend(r.gates_opened.iter().cloned());
                if let Some(reaction) = reaction {
                    out.reactions
                        .push(u64::try_from(reaction.as_millis()).unwrap_or(u64::MAX));
                }
                if r.is_eventful() || !r.gates_opened.is_empty() {
                    out.watch.changes.push(r.clone());
                }
            }
            if want.verify {
                out.full.insert(arn.to_owned(), r.clone());
            }
        }
        // A pass deferred or cut before it finished did not look: its group stays at the
        // front for the next full diff.
        let looked_at = report.as_ref().is_none_or(|r| {
            r.outcome != Outcome::Deferred && r.error.as_deref() != Some(crate::reconcile::CUT)
        });
        if want.verify {
            if looked_at {
                let mut looked = lock(&self.engine.controller.looked);
                let run = looked.runs;
                looked.at.insert(arn.to_owned(), run);
            }
            if lock(&self.verify).remaining.remove(arn) {
                self.verified.notify_waiters();
            }
        }
    }

    /// Whether a gated pod of `b` waits for its gate (as the store has the pods).
    fn gate_pending(&self, b: &BoundGroup) -> bool {
        self.engine
            .controller
            .informer
            .view(&b.binding)
            .is_some_and(|(pods, _)| {
                pods.iter()
                    .any(|p| matches!(contribution(p, &b.binding), Some((_, Some(false)))))
            })
    }
}

/// What puts a group ahead of others looked at as long ago.
struct Priority<'a> {
    /// This cluster's index: a group not in it is new (nothing registered here yet).
    indexed: Option<&'a BTreeSet<String>>,
    /// Groups whose re-verification turn is this run's.
    due: &'a HashSet<String>,
}

/// The order of a run's full diff: the groups this container looked at longest ago
/// first (never: first of all); among groups looked at as long ago, new ones, then the
/// rest, then the ones due for re-verification, shuffled. A group not due costs one
/// state read when it is at rest and holds a change when it is not, while a due one
/// waits for a paced Describe: behind 120 of them (the default budget of a run), a
/// just-bound group of a cold container waited a minute. A run that runs out of time is continued where it
/// stopped by the next run of a warm container, so a group waits at most until the
/// container has looked at every other group once (measured at 1,000 groups: a run at
/// Lambda's CPU share reaches fewer). A fresh container (no memory) starts in a shuffled
/// order, so what its short runs leave out differs from run to run.
fn visit_order<'a>(
    bound: impl Iterator<Item = &'a str>,
    looked: &HashMap<String, u64>,
    priority: &Priority<'_>,
    rng: &mut fastrand::Rng,
) -> Vec<&'a str> {
    let mut order: Vec<&str> = bound.collect();
    rng.shuffle(&mut order);
    order.sort_by_cached_key(|arn| {
        let new = priority.indexed.is_some_and(|i| !i.contains(*arn));
        (
            looked.get(*arn).copied().unwrap_or(0),
            !new,
            priority.due.contains(*arn),
        )
    });
    order
}

#[cfg(test)]
mod tests;
