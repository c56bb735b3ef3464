//! In-memory implementations of the three I/O traits, with the semantics of the real
//! services where tgsync depends on them: conditional lease writes, draining after
//! deregistration, pods that vanish. Used by engine, race and crash tests.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use k8s_openapi::api::core::v1::Pod;

use crate::clock::ManualClock;
use crate::core::lease_protocol as protocol;
use crate::core::rollout::GroupAttributes;
use crate::core::{
    AdministrativeOverride, BackoffState, Checkpoint, HealthState, PodFacts, Selector, Target,
    TargetHealth, UnixMillis,
};
use crate::groups::{
    ElbError, Fence, Priority, Refusal, Refused, TagsByArn, TargetGroup, TargetGroupApi,
};
use crate::pods::{PodSource, PodsError};
use crate::state::{
    Acquire, Change, Glance, GroupState, LeaseView, LedgerEntry, Release, StateError, StateStore,
};
use crate::sync::lock;

/// Seeded scheduling noise: every fake call first yields to the runtime a random number
/// of times, so concurrent reconciles interleave differently per seed — and, on a
/// single-threaded runtime, reproducibly.
#[derive(Debug, Default)]
pub struct Chaos(Mutex<Option<fastrand::Rng>>);

impl Chaos {
    /// Turns the noise on with `seed`.
    pub fn seed(&self, seed: u64) {
        *lock(&self.0) = Some(fastrand::Rng::with_seed(seed));
    }

    /// Yields 0–7 times, and now and then up to 63 times (a slow call), so that long
    /// stalls between two side effects happen too. Nothing when off.
    pub async fn pause(&self) {
        let n = lock(&self.0).as_mut().map_or(0, |r| {
            if r.u8(0..5) == 0 {
                r.u8(0..64)
            } else {
                r.u8(0..8)
            }
        });
        for _ in 0..n {
            tokio::task::yield_now().await;
        }
    }
}

/// A call that takes time on a manual clock (a slow API server, a throttled table): it
/// yields first, so other reconciles run meanwhile as during a real wait, then moves the
/// clock on. Nothing when off.
#[derive(Debug, Default)]
pub struct Delay(Mutex<Option<(ManualClock, u64)>>);

impl Delay {
    /// Makes every call take `ms` on `clock` (0: no delay).
    fn set(&self, clock: &ManualClock, ms: u64) {
        *lock(&self.0) = (ms > 0).then(|| (clock.clone(), ms));
    }

    async fn wait(&self) {
        let delay = lock(&self.0).clone();
        if let Some((clock, ms)) = delay {
            // A little real time too, so timers (the lease heartbeat) run meanwhile.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            clock.advance(ms);
        }
    }
}

/// A change made to a pod at a chosen moment.
type PodHook = Box<dyn FnOnce(&mut Pod) + Send>;

/// Pods of a fake cluster, keyed by `namespace/name`.
#[derive(Default)]
pub struct FakePods {
    /// Scheduling noise for race tests.
    pub chaos: Chaos,
    pods: Mutex<BTreeMap<(String, String), Pod>>,
    fail: AtomicBool,
    lists: AtomicU64,
    gets: AtomicU64,
    slow_list: Delay,
    slow_get: Delay,
    before_gate: Mutex<Option<PodHook>>,
    changes: Mutex<Changes>,
    /// Zone label per node name.
    zones: Mutex<BTreeMap<String, String>>,
    gates_set: AtomicU64,
}

/// Every change since the fake started, for watches: the revision counter, the log of
/// (revision, pod before, pod after), and the live watchers.
#[derive(Default)]
struct Changes {
    revision: u64,
    log: Vec<PodChange>,
    watchers: Vec<tokio::sync::mpsc::UnboundedSender<PodChange>>,
}

/// One change of a pod: its revision, the pod before and after (`None`: absent).
type PodChange = (u64, Option<PodFacts>, Option<PodFacts>);

impl FakePods {
    /// Records a change of one pod (`None`: absent) for watchers.
    fn changed(&self, before: Option<&Pod>, after: Option<&Pod>) {
        let facts = |p: Option<&Pod>| p.map(|p| PodFacts::from_pod(p.clone()));
        let mut changes = lock(&self.changes);
        changes.revision += 1;
        let entry = (changes.revision, facts(before), facts(after));
        changes.watchers.retain(|w| w.send(entry.clone()).is_ok());
        changes.log.push(entry);
    }

    /// Adds or replaces a pod.
    pub fn put(&self, pod: Pod) {
        let key = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let before = lock(&self.pods).insert(key, pod.clone());
        self.changed(before.as_ref(), Some(&pod));
    }

    /// Deletes a pod (gone from the API at once).
    pub fn delete(&self, namespace: &str, name: &str) -> Option<Pod> {
        let gone = lock(&self.pods).remove(&(namespace.to_owned(), name.to_owned()));
        if gone.is_some() {
            self.changed(gone.as_ref(), None);
        }
        gone
    }

    /// Changes a pod in place.
    pub fn update(&self, namespace: &str, name: &str, f: impl FnOnce(&mut Pod)) {
        let change = {
            let mut pods = lock(&self.pods);
            pods.get_mut(&(namespace.to_owned(), name.to_owned()))
                .map(|p| {
                    let before = p.clone();
                    f(p);
                    (before, p.clone())
                })
        };
        if let Some((before, after)) = change {
            self.changed(Some(&before), Some(&after));
        }
    }

    /// Makes every LIST and GET fail (API unreachable) until called with `false`.
    pub fn set_failing(&self, failing: bool) {
        self.fail.store(failing, Ordering::SeqCst);
    }

    /// LIST calls served.
    pub fn list_calls(&self) -> u64 {
        self.lists.load(Ordering::SeqCst)
    }

    /// Makes every LIST take `ms` on `clock` (a slow API server), to test what the
    /// engine does when time runs out between its leases and its group passes.
    pub fn slow_lists(&self, clock: &ManualClock, ms: u64) {
        self.slow_list.set(clock, ms);
    }

    /// Makes every GET take `ms` on `clock` (time passing while pod-events waits).
    pub fn slow_gets(&self, clock: &ManualClock, ms: u64) {
        self.slow_get.set(clock, ms);
    }

    /// GET calls served.
    pub fn get_calls(&self) -> u64 {
        self.gets.load(Ordering::SeqCst)
    }

    /// Requests of any kind served (LIST, GET, gate patches): what the Kubernetes API saw.
    pub fn requests(&self) -> u64 {
        self.list_calls() + self.get_calls()
    }

    /// Gate condition patches served so far.
    pub fn gates_set(&self) -> u64 {
        self.gates_set.load(Ordering::SeqCst)
    }

    /// Runs `f` on the pod named in the next gate patch, just before the patch is applied
    /// (a pod replaced by a namesake between the read and the write).
    pub fn before_next_gate(&self, f: impl FnOnce(&mut Pod) + Send + 'static) {
        *lock(&self.before_gate) = Some(Box::new(f));
    }
}

impl std::fmt::Debug for FakePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakePods").finish_non_exhaustive()
    }
}

/// The watch event a change makes for a watcher of `namespace` and `selector`, as the
/// API server's watch cache makes it: a pod entering the selection is ADDED, leaving it
/// DELETED (with its last state), staying in it MODIFIED.
fn watch_event(
    namespace: &str,
    selector: Option<&Selector>,
    revision: u64,
    before: Option<&PodFacts>,
    after: Option<&PodFacts>,
) -> Option<crate::pods::WatchEvent> {
    use crate::pods::{WatchEvent, WatchedPod};
    let selected = |p: &&PodFacts| {
        p.pod.namespace == namespace && selector.is_none_or(|s| s.matches(&p.labels))
    };
    let watched = |p: &PodFacts| WatchedPod {
        facts: p.clone(),
        resource_version: Some(revision.to_string()),
    };
    match (before.filter(selected), after.filter(selected)) {
        (None, Some(a)) => Some(WatchEvent::Added(watched(a))),
        (Some(_), Some(a)) => Some(WatchEvent::Modified(watched(a))),
        (Some(b), None) => Some(WatchEvent::Deleted(watched(b))),
        (None, None) => None,
    }
}

impl FakePods {
    /// Labels node `node` with `zone` (`topology.kubernetes.io/zone`).
    pub fn set_node_zone(&self, node: &str, zone: &str) {
        lock(&self.zones).insert(node.to_owned(), zone.to_owned());
    }
}

impl PodSource for FakePods {
    async fn node_zone(&self, name: &str) -> Result<Option<String>, PodsError> {
        Ok(lock(&self.zones).get(name).cloned())
    }

    async fn list_versioned(
        &self,
        namespace: &str,
        selector: Option<&Selector>,
    ) -> Result<crate::pods::Listing, PodsError> {
        let revision = lock(&self.changes).revision;
        let pods = self.list(namespace, selector).await?;
        Ok(crate::pods::Listing {
            pods,
            resource_version: revision.to_string(),
        })
    }

    async fn watch(
        &self,
        namespace: &str,
        selector: Option<&Selector>,
        resource_version: &str,
        _timeout: std::time::Duration,
    ) -> Result<crate::pods::WatchStream, PodsError> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(PodsError::Watch {
                namespace: namespace.to_owned(),
                reason: "503 Service Unavailable (injected)".into(),
            });
        }
        let from: u64 = resource_version.parse().unwrap_or(0);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        {
            let mut changes = lock(&self.changes);
            for entry in changes.log.iter().filter(|(rev, _, _)| *rev > from) {
                let _ = tx.send(entry.clone());
            }
            changes.watchers.push(tx);
        }
        let (namespace, selector) = (namespace.to_owned(), selector.cloned());
        let events = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let events = futures::StreamExt::filter_map(events, move |(rev, before, after)| {
            let event = watch_event(
                &namespace,
                selector.as_ref(),
                rev,
                before.as_ref(),
                after.as_ref(),
            );
            async move { event.map(Ok) }
        });
        Ok(futures::StreamExt::boxed(events))
    }

    async fn list(
        &self,
        namespace: &str,
        selector: Option<&Selector>,
    ) -> Result<Vec<PodFacts>, PodsError> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.slow_list.wait().await;
        if self.fail.load(Ordering::SeqCst) {
            return Err(PodsError::List {
                namespace: namespace.to_owned(),
                reason: "503 Service Unavailable (injected)".into(),
            });
        }
        let pods = lock(&self.pods);
        Ok(pods
            .iter()
            .filter(|((ns, _), _)| ns == namespace)
            .map(|(_, p)| PodFacts::from_pod(p.clone()))
            .filter(|f| selector.is_none_or(|s| s.matches(&f.labels)))
            .collect())
    }

    async fn get(&self, namespace: &str, name: &str) -> Result<Option<Pod>, PodsError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.slow_get.wait().await;
        self.chaos.pause().await;
        if self.fail.load(Ordering::SeqCst) {
            return Err(PodsError::Get {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                reason: "503 Service Unavailable (injected)".into(),
            });
        }
        Ok(lock(&self.pods)
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned())
    }

    async fn set_gate(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        verdict: &crate::core::gate::GateVerdict,
        _transition: bool,
    ) -> Result<(), PodsError> {
        self.chaos.pause().await;
        let hook = lock(&self.before_gate).take();
        match lock(&self.pods).get_mut(&(namespace.to_owned(), name.to_owned())) {
            Some(pod) => {
                if let Some(hook) = hook {
                    hook(pod);
                }
                let stored = pod.metadata.uid.clone().unwrap_or_default();
                if stored != uid {
                    return Err(PodsError::Patch {
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                        reason: format!(
                            "HTTP 422 Invalid: Pod \"{name}\" is invalid: metadata.uid: Invalid value: \"{uid}\": field is immutable (stored {stored})"
                        ),
                    });
                }
                crate::testkit::set_gate_condition(
                    pod,
                    verdict.open,
                    &verdict.reason,
                    &verdict.message,
                );
                self.gates_set.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            None => Err(PodsError::Patch {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                reason: "404 NotFound".into(),
            }),
        }
    }
}

/// Reads each new target stays invisible for, and the reads left per (group, target).
type ReadLag = (u32, BTreeMap<(String, Target), u32>);

/// A fake group: its description and its targets.
type FakeGroup = (TargetGroup, BTreeMap<Target, HealthState>);

/// What a fake DescribeTargetHealth says of a target besides its state.
#[derive(Debug, Clone, Default)]
struct Detail {
    reason: Option<String>,
    description: Option<String>,
    administrative_override: Option<AdministrativeOverride>,
}

/// Target groups of a fake ELBv2.
#[derive(Debug, Default)]
pub struct FakeElb {
    /// Scheduling noise for race tests.
    pub chaos: Chaos,
    groups: Mutex<BTreeMap<String, FakeGroup>>,
    calls: Mutex<BTreeMap<&'static str, u64>>,
    fail_mutations: AtomicBool,
    read_lag: Mutex<ReadLag>,
    refused: Mutex<BTreeMap<Target, String>>,
    /// Reason, description and override per (group, target), as DescribeTargetHealth
    /// reports them.
    details: Mutex<BTreeMap<(String, Target), Detail>>,
    /// Targets quota per group (`TooManyTargets` beyond it).
    quotas: Mutex<BTreeMap<String, usize>>,
    /// Groups that refuse registrations without a named zone (an ALB with cross-zone
    /// load balancing off, all pods outside its VPC), and the zone of each target
    /// registered in one.
    zoned: Mutex<BTreeMap<String, BTreeMap<Target, String>>>,
    slow_mutation: Delay,
    held_health: Mutex<BTreeMap<String, std::sync::Arc<tokio::sync::Semaphore>>>,
    /// What DescribeTargetGroupAttributes (and the group's description) say per group,
    /// when set; an error message makes the read fail (access denied).
    attributes: Mutex<BTreeMap<String, Result<GroupAttributes, String>>>,
}

impl FakeElb {
    /// Holds every target-health read of `arn` until the returned semaphore gets
    /// permits (a group whose Describe waits long in the budget).
    pub fn hold_health(&self, arn: &str) -> std::sync::Arc<tokio::sync::Semaphore> {
        let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
        lock(&self.held_health).insert(arn.to_owned(), gate.clone());
        gate
    }

    /// Adds a target group.
    pub fn add_group(&self, group: TargetGroup) {
        lock(&self.groups).insert(group.arn.clone(), (group, BTreeMap::new()));
    }

    /// Deletes a target group (an operator's `delete-target-group`).
    pub fn delete_group(&self, arn: &str) {
        lock(&self.groups).remove(arn);
    }

    /// Registers a target by hand (a foreign target, or an operator's edit).
    pub fn add_target(&self, arn: &str, target: Target, state: HealthState) {
        if let Some((_, targets)) = lock(&self.groups).get_mut(arn) {
            targets.insert(target, state);
        }
    }

    /// Removes a target by hand.
    pub fn remove_target(&self, arn: &str, target: &Target) {
        if let Some((_, targets)) = lock(&self.groups).get_mut(arn) {
            targets.remove(target);
        }
    }

    /// The group's targets and states.
    pub fn targets(&self, arn: &str) -> BTreeMap<Target, HealthState> {
        lock(&self.groups)
            .get(arn)
            .map(|(_, t)| t.clone())
            .unwrap_or_default()
    }

    /// Targets not draining: what receives traffic.
    pub fn live_targets(&self, arn: &str) -> Vec<Target> {
        self.targets(arn)
            .into_iter()
            .filter(|(_, s)| !s.is_draining())
            .map(|(t, _)| t)
            .collect()
    }

    /// Ends draining and health checks: draining targets disappear, new ones turn healthy.
    pub fn settle(&self) {
        for (_, targets) in lock(&self.groups).values_mut() {
            targets.retain(|_, s| !s.is_draining());
            for s in targets.values_mut() {
                if *s == HealthState::Initial {
                    *s = HealthState::Healthy;
                }
            }
        }
    }

    /// ELBv2's eventual consistency: targets registered from now on stay invisible to
    /// the next `reads` DescribeTargetHealth calls of their group.
    pub fn lag_reads(&self, reads: u32) {
        lock(&self.read_lag).0 = reads;
    }

    /// Sets (or with `None` removes) a tag of a group, as `AddTags`/`RemoveTags` would.
    pub fn set_tag(&self, arn: &str, key: &str, value: Option<&str>) {
        if let Some((group, _)) = lock(&self.groups).get_mut(arn) {
            match value {
                Some(v) => group.tags.insert(key.to_owned(), v.to_owned()),
                None => group.tags.remove(key),
            };
        }
    }

    /// Makes every Register/DeregisterTargets take `ms` on `clock` (a throttled ELBv2);
    /// 0 makes them instant again.
    pub fn slow_mutations(&self, clock: &ManualClock, ms: u64) {
        self.slow_mutation.set(clock, ms);
    }

    /// Makes RegisterTargets refuse `target` with `reason` (the others of the call still
    /// go through, as the real adapter's splitting makes it).
    pub fn refuse(&self, target: Target, reason: &str) {
        lock(&self.refused).insert(target, reason.to_owned());
    }

    /// Makes DescribeTargetHealth report `reason` (and `description`) for `target`.
    pub fn set_reason(&self, arn: &str, target: Target, reason: &str, description: Option<&str>) {
        let mut details = lock(&self.details);
        let d = details.entry((arn.to_owned(), target)).or_default();
        d.reason = Some(reason.to_owned());
        d.description = description.map(str::to_owned);
    }

    /// Makes DescribeTargetHealth report an administrative override (`None`: none) for
    /// `target`, as during an NLB zonal shift.
    pub fn set_override(&self, arn: &str, target: Target, o: Option<AdministrativeOverride>) {
        lock(&self.details)
            .entry((arn.to_owned(), target))
            .or_default()
            .administrative_override = o;
    }

    /// Gives `arn` a targets quota: a RegisterTargets registers what fits (draining
    /// targets not counted) and refuses the rest for capacity, as the real adapter's
    /// halving leaves it.
    pub fn set_quota(&self, arn: &str, quota: usize) {
        lock(&self.quotas).insert(arn.to_owned(), quota);
    }

    /// Makes `arn` refuse registrations without a named zone (ZoneRequired), as an ALB
    /// group with cross-zone load balancing off does for IPs outside its VPC.
    pub fn require_zones(&self, arn: &str) {
        lock(&self.zoned).entry(arn.to_owned()).or_default();
    }

    /// The zone `target` was registered in with `register_in_zones`.
    pub fn zone_of(&self, arn: &str, target: &Target) -> Option<String> {
        lock(&self.zoned).get(arn)?.get(target).cloned()
    }

    /// Sets what the group's description and attributes say (the rollout check reads
    /// them); by default a group is an NLB's (`TCP`, or `QUIC` for a QUIC group) with
    /// ELBv2's defaults: a 300-s deregistration delay, no connection termination, health
    /// checks every 30 s with a threshold of 2.
    pub fn set_attributes(&self, arn: &str, attributes: GroupAttributes) {
        lock(&self.attributes).insert(arn.to_owned(), Ok(attributes));
    }

    /// Makes reading `arn`'s attributes fail with `message` (as IAM refuses
    /// DescribeTargetGroupAttributes to a role that lacks it).
    pub fn refuse_attributes(&self, arn: &str, message: &str) {
        lock(&self.attributes).insert(arn.to_owned(), Err(message.to_owned()));
    }

    /// Makes Register/DeregisterTargets fail until called with `false`.
    pub fn set_failing_mutations(&self, failing: bool) {
        self.fail_mutations.store(failing, Ordering::SeqCst);
    }

    /// Calls per operation.
    pub fn calls(&self) -> BTreeMap<&'static str, u64> {
        lock(&self.calls).clone()
    }

    fn count(&self, op: &'static str) {
        *lock(&self.calls).entry(op).or_default() += 1;
    }

    /// RegisterTargets as ELBv2 does it: refusals per target, the quota as a whole.
    async fn register_now(
        &self,
        arn: &str,
        targets: &[Target],
        fence: &dyn Fence,
    ) -> Result<(), ElbError> {
        self.chaos.pause().await;
        // The fence is asked as the attempt goes out; then it takes its time.
        fenced("RegisterTargets", fence)?;
        self.slow_mutation.wait().await;
        // Beyond the quota: the targets the real adapter's halving would leave refused.
        let mut over: Vec<Target> = Vec::new();
        if let Some(quota) = lock(&self.quotas).get(arn).copied() {
            let live: BTreeSet<Target> = self.live_targets(arn).into_iter().collect();
            let mut room = quota.saturating_sub(live.len());
            for t in targets.iter().filter(|t| !live.contains(t)) {
                if room > 0 {
                    room -= 1;
                } else {
                    over.push(*t);
                }
            }
        }
        let targets: Vec<Target> = targets
            .iter()
            .filter(|t| !over.contains(t))
            .copied()
            .collect();
        let targets = targets.as_slice();
        {
            let mut lag = lock(&self.read_lag);
            let reads = lag.0;
            if reads > 0 {
                for t in targets {
                    lag.1.insert((arn.to_owned(), *t), reads);
                }
            }
        }
        let refused: Vec<(Target, String)> = {
            let refusals = lock(&self.refused);
            targets
                .iter()
                .filter_map(|t| refusals.get(t).map(|why| (*t, why.clone())))
                .collect()
        };
        self.mutate("RegisterTargets", arn, |group| {
            for t in targets {
                if refused.iter().any(|(r, _)| r == t) {
                    continue;
                }
                let state = group.entry(*t).or_insert(HealthState::Initial);
                if state.is_draining() {
                    *state = HealthState::Initial;
                }
            }
        })?;
        if refused.is_empty() && over.is_empty() {
            Ok(())
        } else {
            Err(ElbError::Rejected {
                operation: "RegisterTargets",
                targets: refused
                    .into_iter()
                    .map(|(t, why)| Refused::target(t, why))
                    .chain(over.into_iter().map(|t| Refused {
                        target: t,
                        reason: "ELBv2 RegisterTargets failed: TooManyTargets: You've reached the limit on the number of targets.".into(),
                        refusal: Refusal::Capacity,
                    }))
                    .collect(),
            })
        }
    }

    fn mutate(
        &self,
        op: &'static str,
        arn: &str,
        f: impl FnOnce(&mut BTreeMap<Target, HealthState>),
    ) -> Result<(), ElbError> {
        self.count(op);
        if self.fail_mutations.load(Ordering::SeqCst) {
            return Err(ElbError::Other {
                operation: op,
                message: "InternalFailure: injected".into(),
            });
        }
        match lock(&self.groups).get_mut(arn) {
            Some((_, targets)) => {
                f(targets);
                Ok(())
            }
            None => Err(ElbError::NotFound {
                arn: arn.to_owned(),
            }),
        }
    }
}

impl TargetGroupApi for FakeElb {
    async fn discover(&self, _: &Priority) -> Result<Vec<TargetGroup>, ElbError> {
        self.chaos.pause().await;
        self.count("DescribeTargetGroups");
        Ok(lock(&self.groups)
            .values()
            .map(|(g, _)| g.clone())
            .collect())
    }

    async fn describe(&self, arns: &[String], _: &Priority) -> Result<Vec<TargetGroup>, ElbError> {
        self.chaos.pause().await;
        self.count("DescribeTargetGroups");
        self.count("DescribeTags");
        let groups = lock(&self.groups);
        arns.iter()
            .map(|arn| match groups.get(arn) {
                Some((g, _)) => Ok(g.clone()),
                None => Err(ElbError::NotFound { arn: arn.clone() }),
            })
            .collect()
    }

    async fn tags_of(&self, arns: &[String], _: &Priority) -> Result<TagsByArn, ElbError> {
        self.chaos.pause().await;
        self.count("DescribeTags");
        let groups = lock(&self.groups);
        // ELBv2 answers for none of them when one does not exist.
        arns.iter()
            .map(|arn| match groups.get(arn) {
                Some((g, _)) => Ok((arn.clone(), g.tags.clone())),
                None => Err(ElbError::NotFound { arn: arn.clone() }),
            })
            .collect()
    }

    async fn health(&self, arn: &str, _: &Priority) -> Result<Vec<TargetHealth>, ElbError> {
        let held = lock(&self.held_health).get(arn).cloned();
        if let Some(gate) = held {
            let _passed = gate.acquire().await;
        }
        self.chaos.pause().await;
        self.count("DescribeTargetHealth");
        let mut lag = lock(&self.read_lag);
        let details = lock(&self.details);
        match lock(&self.groups).get(arn) {
            Some((_, targets)) => Ok(targets
                .iter()
                .filter(|(t, _)| match lag.1.get_mut(&(arn.to_owned(), **t)) {
                    Some(0) | None => true,
                    Some(n) => {
                        *n -= 1;
                        false
                    }
                })
                .map(|(t, s)| {
                    let d = details
                        .get(&(arn.to_owned(), *t))
                        .cloned()
                        .unwrap_or_default();
                    TargetHealth {
                        target: *t,
                        state: s.clone(),
                        reason: d.reason,
                        description: d.description,
                        administrative_override: d.administrative_override,
                    }
                })
                .collect()),
            None => Err(ElbError::NotFound {
                arn: arn.to_owned(),
            }),
        }
    }

    /// Counted as one call, `DescribeTargetGroupAttributes` (the real adapter also
    /// makes a DescribeTargetGroups of the group).
    async fn attributes(&self, arn: &str, _: &Priority) -> Result<GroupAttributes, ElbError> {
        self.chaos.pause().await;
        self.count("DescribeTargetGroupAttributes");
        let quic = match lock(&self.groups).get(arn) {
            Some((g, _)) => g.facts.quic,
            None => {
                return Err(ElbError::NotFound {
                    arn: arn.to_owned(),
                });
            }
        };
        match lock(&self.attributes).get(arn) {
            Some(Ok(set)) => Ok(set.clone()),
            Some(Err(message)) => Err(ElbError::AccessDenied {
                operation: "DescribeTargetGroupAttributes",
                message: message.clone(),
            }),
            None => Ok(GroupAttributes {
                protocol: Some(if quic { "QUIC" } else { "TCP" }.to_owned()),
                health_check_interval_seconds: Some(30),
                unhealthy_threshold_count: Some(2),
                deregistration_delay_seconds: Some(300),
                connection_termination: Some(false),
            }),
        }
    }

    async fn register(
        &self,
        arn: &str,
        targets: &[Target],
        fence: &dyn Fence,
    ) -> Result<(), ElbError> {
        if lock(&self.zoned).contains_key(arn) {
            self.count("RegisterTargets");
            return Err(ElbError::Rejected {
                operation: "RegisterTargets",
                targets: targets
                    .iter()
                    .map(|t| Refused {
                        target: *t,
                        reason: "ValidationError: When cross-zone load balancing is disabled on this target group, you must specify an Availability Zone".into(),
                        refusal: Refusal::ZoneRequired,
                    })
                    .collect(),
            });
        }
        self.register_now(arn, targets, fence).await
    }

    async fn register_in_zones(
        &self,
        arn: &str,
        targets: &[(Target, String)],
        fence: &dyn Fence,
    ) -> Result<(), ElbError> {
        if let Some(zones) = lock(&self.zoned).get_mut(arn) {
            zones.extend(targets.iter().cloned());
        }
        let targets: Vec<Target> = targets.iter().map(|(t, _)| *t).collect();
        self.register_now(arn, &targets, fence).await
    }

    async fn deregister(
        &self,
        arn: &str,
        targets: &[Target],
        fence: &dyn Fence,
    ) -> Result<(), ElbError> {
        self.chaos.pause().await;
        fenced("DeregisterTargets", fence)?;
        self.slow_mutation.wait().await;
        self.mutate("DeregisterTargets", arn, |group| {
            for t in targets {
                if let Some(state) = group.get_mut(t) {
                    *state = HealthState::Draining;
                }
            }
        })
    }
}

/// The fence's answer as the real adapter gives it, right before the call goes out.
fn fenced(operation: &'static str, fence: &dyn Fence) -> Result<(), ElbError> {
    fence
        .check()
        .map_err(|reason| ElbError::Fenced { operation, reason })
}

/// A row of [`FakeState`]'s index: the namespace, selector, and name and facts recorded.
/// A row of a cluster's index: namespace, selector, name and facts, the binding's
/// fingerprint, and whether the group is bound.
#[derive(Debug, Clone)]
struct IndexRow {
    namespace: String,
    selector: Selector,
    described: Option<(String, crate::core::GroupFacts)>,
    binding: Option<u64>,
    bound: bool,
}

/// A fake state table: one record per group with DynamoDB's conditional-write
/// semantics (the lease, fencing, the version check of unleased writes).
#[derive(Debug, Default)]
pub struct FakeState {
    /// Scheduling noise for race tests.
    pub chaos: Chaos,
    groups: Mutex<HashMap<String, GroupState>>,
    /// `(cluster, group)` pairs of the orphan index, with what each row records.
    index: Mutex<BTreeMap<(String, String), IndexRow>>,
    /// Each cluster's index meta item.
    index_meta: Mutex<BTreeMap<String, crate::state::IndexMeta>>,
    fail: AtomicBool,
    fail_renewals: AtomicBool,
    slow_read: Delay,
    writes: AtomicU64,
    reads: AtomicU64,
    /// Reads of one group, by group.
    reads_of: Mutex<HashMap<String, u64>>,
    batch_reads: AtomicU64,
    glance_batches: AtomicU64,
    fail_batches: AtomicBool,
    leave_out: AtomicBool,
    leases_held_elsewhere: AtomicU64,
}

impl FakeState {
    /// Makes every read take `ms` on `clock` (a slow or throttled table).
    pub fn slow_reads(&self, clock: &ManualClock, ms: u64) {
        self.slow_read.set(clock, ms);
    }

    /// The ledger of a group.
    pub fn ledger(&self, group: &str) -> BTreeMap<Target, LedgerEntry> {
        lock(&self.groups)
            .get(group)
            .map(|r| r.ledger.clone())
            .unwrap_or_default()
    }

    /// The ledger of a group without its tombstones (entries of deregistered targets
    /// kept for the forget grace): the targets it holds as registered.
    pub fn live_ledger(&self, group: &str) -> BTreeMap<Target, LedgerEntry> {
        let mut ledger = self.ledger(group);
        ledger.retain(|_, e| e.deregistered_at.is_none());
        ledger
    }

    /// The whole stored state of a group.
    pub fn stored(&self, group: &str) -> GroupState {
        lock(&self.groups).get(group).cloned().unwrap_or_default()
    }

    /// Replaces the stored state of a group (a crash left it so; a test sets it up).
    pub fn put(&self, group: &str, state: GroupState) {
        lock(&self.groups).insert(group.to_owned(), state);
    }

    /// Whether `group` is in `cluster`'s index.
    pub fn indexed(&self, cluster: &str, group: &str) -> bool {
        lock(&self.index).contains_key(&(cluster.to_owned(), group.to_owned()))
    }

    /// Whether the group has an item at all (release deletes it when nothing is left).
    pub fn has_item(&self, group: &str) -> bool {
        lock(&self.groups).contains_key(group)
    }

    /// Whether a lease is recorded and unexpired at `now`.
    pub fn lease_held(&self, group: &str, now: UnixMillis) -> bool {
        lock(&self.groups)
            .get(group)
            .and_then(|r| r.lease.as_ref())
            .is_some_and(|l| l.until >= now)
    }

    /// The backoff record of a group.
    pub fn backoff(&self, group: &str) -> Option<BackoffState> {
        lock(&self.groups).get(group).and_then(|r| r.backoff)
    }

    /// Makes every call fail until called with `false`.
    pub fn set_failing(&self, failing: bool) {
        self.fail.store(failing, Ordering::SeqCst);
    }

    /// Makes every lease renewal fail (a throttled table) until called with `false`.
    pub fn set_failing_renewals(&self, failing: bool) {
        self.fail_renewals.store(failing, Ordering::SeqCst);
    }

    /// Writes (conditional updates of any kind) and reads served so far.
    pub fn calls(&self) -> (u64, u64) {
        (
            self.writes.load(Ordering::SeqCst),
            self.reads.load(Ordering::SeqCst),
        )
    }

    /// Batched reads (each of up to 100 groups) served so far.
    pub fn batch_reads(&self) -> u64 {
        self.batch_reads.load(Ordering::SeqCst)
    }

    /// Reads of `group` alone (not in a batch) served so far.
    pub fn reads_of(&self, group: &str) -> u64 {
        lock(&self.reads_of).get(group).copied().unwrap_or(0)
    }

    /// Those of [`Self::batch_reads`] that were glances (items without ledgers).
    pub fn glance_batches(&self) -> u64 {
        self.glance_batches.load(Ordering::SeqCst)
    }

    /// Batched reads of `groups`, 100 a batch, each state as `read` gives it (as
    /// DynamoDB's BatchGetItem: failing or leaving groups out as set); `glances` counts
    /// them in [`Self::glance_batches`] too.
    async fn batch<T>(
        &self,
        groups: &[String],
        read: fn(&GroupState) -> T,
        glances: bool,
    ) -> Result<Vec<(String, T)>, StateError> {
        let mut states = Vec::with_capacity(groups.len());
        for chunk in groups.chunks(100) {
            self.slow_read.wait().await;
            self.check("BatchGetItem").await?;
            if glances {
                self.glance_batches.fetch_add(1, Ordering::SeqCst);
            }
            if self.fail_batches.load(Ordering::SeqCst) {
                return Err(StateError::Dynamo {
                    operation: "BatchGetItem",
                    message: "ProvisionedThroughputExceededException: injected".into(),
                });
            }
            if !self.leave_out.load(Ordering::SeqCst) {
                states.extend(chunk.iter().map(|g| (g.clone(), read(&self.stored(g)))));
            }
        }
        Ok(states)
    }

    /// Makes every batched read fail (a throttled table) until called with `false`;
    /// reads of one group still work.
    pub fn set_failing_batches(&self, failing: bool) {
        self.fail_batches.store(failing, Ordering::SeqCst);
    }

    /// Makes batched reads leave every group out (as DynamoDB's leaves out items that
    /// must first be upgraded by a read alone) until called with `false`.
    pub fn leave_out_of_batches(&self, leave_out: bool) {
        self.leave_out.store(leave_out, Ordering::SeqCst);
    }

    /// How many acquisitions (and looks that asked the holder) found the lease held by
    /// someone else (each set `dirty`): race tests check that the race they stage really
    /// happened.
    pub fn contended(&self) -> u64 {
        self.leases_held_elsewhere.load(Ordering::SeqCst)
    }

    async fn check(&self, operation: &'static str) -> Result<(), StateError> {
        self.chaos.pause().await;
        if operation == "GetItem" {
            self.reads.fetch_add(1, Ordering::SeqCst);
        } else if operation == "BatchGetItem" {
            self.batch_reads.fetch_add(1, Ordering::SeqCst);
        } else {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(StateError::Dynamo {
                operation,
                message: "InternalServerError: injected".into(),
            });
        }
        Ok(())
    }
}

/// The lease part of a group's state, as the protocol's transitions see it.
fn record(state: &GroupState) -> protocol::Record<String> {
    protocol::Record {
        owner: state.lease.as_ref().map(|l| l.owner.clone()),
        until: state.lease.as_ref().map_or(0, |l| l.until.0),
        dirty: state.dirty,
        version: state.version,
    }
}

/// Applies one of the protocol's transitions to a group's state, as DynamoDB applies
/// its conditional write; whether its condition held. Taking the lease also removes
/// the checkpoint.
fn step(state: &mut GroupState, step: &protocol::Step<String>) -> bool {
    let mut r = record(state);
    if !step.apply(&mut r) {
        return false;
    }
    if step.effect.take {
        state.checkpoint = None;
    }
    state.lease = r.owner.map(|owner| LeaseView {
        owner,
        until: UnixMillis(r.until),
    });
    state.dirty = r.dirty;
    state.version = r.version;
    true
}

fn apply(state: &mut GroupState, change: &Change) {
    if let Some(ledger) = &change.ledger {
        state.ledger.clone_from(ledger);
    }
    if let Some(backoff) = change.backoff {
        state.backoff = backoff;
    }
    if let Some(held) = &change.held {
        state.held.clone_from(held);
    }
    if let Some(checkpoint) = change.checkpoint {
        state.checkpoint = checkpoint;
    }
    if let Some(seen) = &change.seen {
        state.seen.clone_from(seen);
    }
}

impl StateStore for FakeState {
    async fn load(&self, group: &str) -> Result<GroupState, StateError> {
        self.slow_read.wait().await;
        self.check("GetItem").await?;
        *lock(&self.reads_of).entry(group.to_owned()).or_default() += 1;
        Ok(self.stored(group))
    }

    async fn load_many(&self, groups: &[String]) -> Result<Vec<(String, GroupState)>, StateError> {
        self.batch(groups, Clone::clone, false).await
    }

    async fn glance_many(&self, groups: &[String]) -> Result<Vec<(String, Glance)>, StateError> {
        self.batch(groups, GroupState::glance, true).await
    }

    async fn acquire(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        until: UnixMillis,
    ) -> Result<Acquire, StateError> {
        self.check("UpdateItem").await?;
        let mut groups = lock(&self.groups);
        let entry = groups.entry(group.to_owned()).or_default();
        let me = owner.to_owned();
        if step(entry, &protocol::take(&me, now.0, until.0)) {
            return Ok(Acquire::Acquired(entry.clone()));
        }
        // Refused: held by another holder, not past its grace (one lock: it cannot
        // change hands between the two writes, as it can in DynamoDB).
        let Some(held) = entry.lease.clone() else {
            return Err(StateError::Dynamo {
                operation: "UpdateItem",
                message: "a take refused with no holder".into(),
            });
        };
        if !step(entry, &protocol::mark(&held.owner, now.0)) {
            return Err(StateError::Dynamo {
                operation: "UpdateItem",
                message: "the holder a take found could not be marked".into(),
            });
        }
        self.leases_held_elsewhere.fetch_add(1, Ordering::SeqCst);
        Ok(Acquire::HeldElsewhere {
            owner: held.owner,
            until: held.until,
        })
    }

    async fn ask_holder(
        &self,
        group: &str,
        holder: &str,
        held_after: UnixMillis,
    ) -> Result<bool, StateError> {
        self.check("UpdateItem").await?;
        let mut groups = lock(&self.groups);
        let Some(entry) = groups.get_mut(group) else {
            return Ok(false);
        };
        let held = step(entry, &protocol::mark(&holder.to_owned(), held_after.0));
        if held {
            self.leases_held_elsewhere.fetch_add(1, Ordering::SeqCst);
        }
        Ok(held)
    }

    async fn renew(&self, group: &str, owner: &str, until: UnixMillis) -> Result<bool, StateError> {
        self.check("UpdateItem").await?;
        if self.fail_renewals.load(Ordering::SeqCst) {
            return Err(StateError::Dynamo {
                operation: "UpdateItem",
                message: "ThrottlingException: injected".into(),
            });
        }
        let mut groups = lock(&self.groups);
        // Ownership only: an expired lease nobody took since is taken back; and only
        // extending it.
        let Some(state) = groups.get_mut(group) else {
            return Ok(false);
        };
        let me = owner.to_owned();
        if step(state, &protocol::renew(&me, until.0)) {
            return Ok(true);
        }
        Ok(protocol::renewed(Some(&record(state)), &me, until.0))
    }

    async fn hand_over(
        &self,
        group: &str,
        owner: &str,
        until: UnixMillis,
    ) -> Result<bool, StateError> {
        self.check("UpdateItem").await?;
        let mut groups = lock(&self.groups);
        Ok(groups
            .get_mut(group)
            .is_some_and(|s| step(s, &protocol::hand_over(&owner.to_owned(), until.0))))
    }

    async fn write(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        version: u64,
        change: &Change,
    ) -> Result<u64, StateError> {
        self.check("UpdateItem").await?;
        if change.is_empty() {
            return Ok(version);
        }
        let mut groups = lock(&self.groups);
        let me = owner.to_owned();
        let lost = || StateError::LeaseLost {
            group: group.to_owned(),
        };
        let state = groups.get_mut(group).ok_or_else(lost)?;
        if step(state, &protocol::write(&me, now.0, version)) {
            apply(state, change);
            return Ok(state.version);
        }
        if protocol::write_landed(Some(&record(state)), &me, version) {
            return Ok(version + 1);
        }
        Err(lost())
    }

    async fn release(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        version: u64,
        until: UnixMillis,
        change: &Change,
        linger: bool,
    ) -> Result<Release, StateError> {
        self.check("UpdateItem").await?;
        let mut groups = lock(&self.groups);
        let Some(state) = groups.get_mut(group) else {
            return Ok(Release::Lost);
        };
        let me = owner.to_owned();
        let changes = !change.is_empty();
        if step(
            state,
            &protocol::release(&me, now.0, version, changes, linger),
        ) {
            apply(state, change);
            return Ok(Release::Released);
        }
        match protocol::release_refused(Some(&record(state)), &me, now.0, version, changes) {
            protocol::Refused::Landed => Ok(Release::Released),
            protocol::Refused::Lost => Ok(Release::Lost),
            protocol::Refused::RunAgain => {
                if step(
                    state,
                    &protocol::run_again(&me, now.0, version, until.0, changes),
                ) {
                    apply(state, change);
                    Ok(Release::RunAgain(state.clone()))
                } else {
                    Ok(Release::Lost)
                }
            }
        }
    }

    async fn abandon(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        version: u64,
        change: &Change,
        dirty: bool,
        linger: bool,
    ) -> Result<(), StateError> {
        self.check("UpdateItem").await?;
        let mut groups = lock(&self.groups);
        let Some(state) = groups.get_mut(group) else {
            return Ok(());
        };
        let me = owner.to_owned();
        let give_up = protocol::give_up(&me, now.0, version, !change.is_empty(), dirty, linger);
        if step(state, &give_up) {
            apply(state, change);
        } else if let Some(go) = protocol::just_go(&me, dirty, linger) {
            step(state, &go);
        }
        Ok(())
    }

    async fn record_verified(
        &self,
        group: &str,
        version: u64,
        expired_before: UnixMillis,
        checkpoint: Checkpoint,
    ) -> Result<bool, StateError> {
        self.check("UpdateItem").await?;
        let mut groups = lock(&self.groups);
        let state = groups.entry(group.to_owned()).or_default();
        if !step(state, &protocol::verified(version, expired_before.0)) {
            return Ok(false);
        }
        state.checkpoint = Some(checkpoint);
        Ok(true)
    }

    async fn indexed_groups(&self, cluster: &str) -> Result<BTreeSet<String>, StateError> {
        self.check("GetItem").await?;
        Ok(lock(&self.index)
            .keys()
            .filter(|(c, _)| c == cluster)
            .map(|(_, g)| g.clone())
            .collect())
    }

    async fn indexed_selections(
        &self,
        cluster: &str,
    ) -> Result<Vec<crate::state::IndexedGroup>, StateError> {
        self.check("GetItem").await?;
        Ok(lock(&self.index)
            .iter()
            .filter(|((c, _), _)| c == cluster)
            .map(|((_, group), row)| crate::state::IndexedGroup {
                group: group.clone(),
                namespace: row.namespace.clone(),
                selector: Some(row.selector.clone()),
                described: row.described.clone(),
                binding: row.binding,
                bound: row.bound,
            })
            .collect())
    }

    async fn sync_index(
        &self,
        cluster: &str,
        updates: &[crate::state::IndexUpdate<'_>],
    ) -> Result<Option<u64>, StateError> {
        let mut written = false;
        for update in updates {
            self.check("PutItem").await?;
            let mut index = lock(&self.index);
            match *update {
                crate::state::IndexUpdate::Bound {
                    group,
                    binding,
                    described: (name, facts),
                } => {
                    let key = (cluster.to_owned(), group.to_owned());
                    let fingerprint = Some(binding.fingerprint());
                    let same = index.get(&key).is_some_and(|r| {
                        r.bound && r.binding == fingerprint && r.described.is_some()
                    });
                    if !same {
                        index.insert(
                            key,
                            IndexRow {
                                namespace: binding.namespace.clone(),
                                selector: binding.selector.clone(),
                                described: Some((name.to_owned(), facts.clone())),
                                binding: fingerprint,
                                bound: true,
                            },
                        );
                        written = true;
                    }
                }
                crate::state::IndexUpdate::Unbound { group } => {
                    if let Some(row) = index
                        .get_mut(&(cluster.to_owned(), group.to_owned()))
                        .filter(|r| r.bound)
                    {
                        row.bound = false;
                        written = true;
                    }
                }
            }
        }
        if !written {
            return Ok(None);
        }
        self.check("UpdateItem").await?;
        let mut metas = lock(&self.index_meta);
        let meta = metas.entry(cluster.to_owned()).or_default();
        meta.generation += 1;
        Ok(Some(meta.generation))
    }

    async fn index_meta(&self, cluster: &str) -> Result<crate::state::IndexMeta, StateError> {
        self.check("GetItem").await?;
        Ok(lock(&self.index_meta)
            .get(cluster)
            .cloned()
            .unwrap_or_default())
    }

    async fn request_passes(&self, cluster: &str, groups: &[String]) -> Result<(), StateError> {
        for group in groups {
            self.check("UpdateItem").await?;
            lock(&self.groups).entry(group.clone()).or_default().dirty = true;
        }
        self.check("UpdateItem").await?;
        lock(&self.index_meta)
            .entry(cluster.to_owned())
            .or_default()
            .requested
            .extend(groups.iter().cloned());
        Ok(())
    }

    async fn take_requests(&self, cluster: &str, groups: &[String]) -> Result<(), StateError> {
        self.check("UpdateItem").await?;
        if let Some(meta) = lock(&self.index_meta).get_mut(cluster) {
            meta.requested.retain(|g| !groups.contains(g));
        }
        Ok(())
    }

    async fn retire(
        &self,
        group: &str,
        cluster: &str,
        version: u64,
        expired_before: UnixMillis,
        delete: bool,
    ) -> Result<bool, StateError> {
        self.check("TransactWriteItems").await?;
        let mut groups = lock(&self.groups);
        let unchanged = groups.get(group).is_none_or(|s| {
            protocol::retire(version, expired_before.0).holds(&record(s))
                && (!delete || s.ledger.is_empty())
        });
        if !unchanged {
            return Ok(false);
        }
        if delete {
            groups.remove(group);
        }
        lock(&self.index).remove(&(cluster.to_owned(), group.to_owned()));
        Ok(true)
    }
}
