//! In-memory implementations of the three I/O traits, with the semantics of the real
//! services where tgsync depends on them: conditional lease writes, draining after
//! deregistration, pods that vanish. Used by engine, race and crash tests.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use k8s_openapi::api::core::v1::Pod;

use crate::clock::ManualClock;
use crate::core::{BackoffState, Checkpoint, HealthState, PodFacts, Selector, Target, UnixMillis};
use crate::groups::{ElbError, TargetGroup, TargetGroupApi};
use crate::pods::{PodSource, PodsError};
use crate::state::{Acquire, GroupState, LedgerRow, Release, StateError, StateStore};

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
    /// Makes every call take `ms` on `clock`.
    fn set(&self, clock: &ManualClock, ms: u64) {
        *lock(&self.0) = Some((clock.clone(), ms));
    }

    async fn wait(&self) {
        let delay = lock(&self.0).clone();
        if let Some((clock, ms)) = delay {
            tokio::task::yield_now().await;
            clock.advance(ms);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Pods of a fake cluster, keyed by `namespace/name`.
#[derive(Debug, Default)]
pub struct FakePods {
    /// Scheduling noise for race tests.
    pub chaos: Chaos,
    pods: Mutex<BTreeMap<(String, String), Pod>>,
    fail: AtomicBool,
    lists: AtomicU64,
    slow_list: Delay,
}

impl FakePods {
    /// Adds or replaces a pod.
    pub fn put(&self, pod: Pod) {
        let key = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        lock(&self.pods).insert(key, pod);
    }

    /// Deletes a pod (gone from the API at once).
    pub fn delete(&self, namespace: &str, name: &str) -> Option<Pod> {
        lock(&self.pods).remove(&(namespace.to_owned(), name.to_owned()))
    }

    /// Changes a pod in place.
    pub fn update(&self, namespace: &str, name: &str, f: impl FnOnce(&mut Pod)) {
        if let Some(p) = lock(&self.pods).get_mut(&(namespace.to_owned(), name.to_owned())) {
            f(p);
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
}

impl PodSource for FakePods {
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

    async fn open_gate(&self, namespace: &str, name: &str) -> Result<(), PodsError> {
        self.chaos.pause().await;
        match lock(&self.pods).get_mut(&(namespace.to_owned(), name.to_owned())) {
            Some(pod) => {
                crate::testkit::set_condition(pod, crate::core::pod::READINESS_GATE, true);
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

/// A fake group: its description and its targets.
type FakeGroup = (TargetGroup, BTreeMap<Target, HealthState>);

/// Target groups of a fake ELBv2.
#[derive(Debug, Default)]
pub struct FakeElb {
    /// Scheduling noise for race tests.
    pub chaos: Chaos,
    groups: Mutex<BTreeMap<String, FakeGroup>>,
    calls: Mutex<BTreeMap<&'static str, u64>>,
    fail_mutations: AtomicBool,
}

impl FakeElb {
    /// Adds a target group.
    pub fn add_group(&self, group: TargetGroup) {
        lock(&self.groups).insert(group.arn.clone(), (group, BTreeMap::new()));
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
    async fn discover(&self) -> Result<Vec<TargetGroup>, ElbError> {
        self.chaos.pause().await;
        self.count("DescribeTargetGroups");
        Ok(lock(&self.groups)
            .values()
            .map(|(g, _)| g.clone())
            .collect())
    }

    async fn health(&self, arn: &str) -> Result<Vec<(Target, HealthState)>, ElbError> {
        self.chaos.pause().await;
        self.count("DescribeTargetHealth");
        match lock(&self.groups).get(arn) {
            Some((_, targets)) => Ok(targets.iter().map(|(t, s)| (*t, s.clone())).collect()),
            None => Err(ElbError::NotFound {
                arn: arn.to_owned(),
            }),
        }
    }

    async fn register(&self, arn: &str, targets: &[Target]) -> Result<(), ElbError> {
        self.chaos.pause().await;
        self.mutate("RegisterTargets", arn, |group| {
            for t in targets {
                let state = group.entry(*t).or_insert(HealthState::Initial);
                if state.is_draining() {
                    *state = HealthState::Initial;
                }
            }
        })
    }

    async fn deregister(&self, arn: &str, targets: &[Target]) -> Result<(), ElbError> {
        self.chaos.pause().await;
        self.mutate("DeregisterTargets", arn, |group| {
            for t in targets {
                if let Some(state) = group.get_mut(t) {
                    *state = HealthState::Draining;
                }
            }
        })
    }
}

#[derive(Debug, Clone)]
struct Lease {
    owner: String,
    until: UnixMillis,
    dirty: bool,
}

#[derive(Debug, Default)]
struct Rows {
    ledger: BTreeMap<Target, LedgerRow>,
    backoff: Option<BackoffState>,
    checkpoint: Option<Checkpoint>,
    lease: Option<Lease>,
}

/// A fake state table with DynamoDB's conditional-write semantics for the lease.
#[derive(Debug, Default)]
pub struct FakeState {
    /// Scheduling noise for race tests.
    pub chaos: Chaos,
    groups: Mutex<HashMap<String, Rows>>,
    fail: AtomicBool,
    slow_acquire: Delay,
}

impl FakeState {
    /// Makes every lease acquisition take `ms` on `clock` (a slow or throttled table).
    pub fn slow_acquires(&self, clock: &ManualClock, ms: u64) {
        self.slow_acquire.set(clock, ms);
    }

    /// The ledger of a group.
    pub fn ledger(&self, group: &str) -> BTreeMap<Target, LedgerRow> {
        lock(&self.groups)
            .get(group)
            .map(|r| r.ledger.clone())
            .unwrap_or_default()
    }

    /// Whether a lease row exists and is unexpired at `now`.
    pub fn lease_held(&self, group: &str, now: UnixMillis) -> bool {
        lock(&self.groups)
            .get(group)
            .and_then(|r| r.lease.as_ref())
            .is_some_and(|l| l.until >= now)
    }

    /// The backoff row of a group.
    pub fn backoff(&self, group: &str) -> Option<BackoffState> {
        lock(&self.groups).get(group).and_then(|r| r.backoff)
    }

    /// Makes every call fail until called with `false`.
    pub fn set_failing(&self, failing: bool) {
        self.fail.store(failing, Ordering::SeqCst);
    }

    async fn check(&self, operation: &'static str) -> Result<(), StateError> {
        self.chaos.pause().await;
        if self.fail.load(Ordering::SeqCst) {
            return Err(StateError::Dynamo {
                operation,
                message: "InternalServerError: injected".into(),
            });
        }
        Ok(())
    }
}

impl StateStore for FakeState {
    async fn load(&self, group: &str) -> Result<GroupState, StateError> {
        self.check("Query").await?;
        let groups = lock(&self.groups);
        Ok(groups
            .get(group)
            .map(|r| GroupState {
                ledger: r.ledger.clone(),
                backoff: r.backoff,
                checkpoint: r.checkpoint,
            })
            .unwrap_or_default())
    }

    async fn record(&self, group: &str, rows: &[LedgerRow]) -> Result<(), StateError> {
        self.check("BatchWriteItem").await?;
        let mut groups = lock(&self.groups);
        let entry = groups.entry(group.to_owned()).or_default();
        for r in rows {
            entry.ledger.insert(r.target, r.clone());
        }
        Ok(())
    }

    async fn remove(&self, group: &str, targets: &[Target]) -> Result<(), StateError> {
        self.check("BatchWriteItem").await?;
        if let Some(entry) = lock(&self.groups).get_mut(group) {
            for t in targets {
                entry.ledger.remove(t);
            }
        }
        Ok(())
    }

    async fn set_backoff(
        &self,
        group: &str,
        state: Option<BackoffState>,
    ) -> Result<(), StateError> {
        self.check("PutItem").await?;
        lock(&self.groups)
            .entry(group.to_owned())
            .or_default()
            .backoff = state;
        Ok(())
    }

    async fn set_checkpoint(
        &self,
        group: &str,
        checkpoint: Option<Checkpoint>,
    ) -> Result<(), StateError> {
        self.check("PutItem").await?;
        lock(&self.groups)
            .entry(group.to_owned())
            .or_default()
            .checkpoint = checkpoint;
        Ok(())
    }

    async fn acquire(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        until: UnixMillis,
    ) -> Result<Acquire, StateError> {
        self.slow_acquire.wait().await;
        self.check("PutItem").await?;
        let mut groups = lock(&self.groups);
        let entry = groups.entry(group.to_owned()).or_default();
        match &mut entry.lease {
            Some(lease) if lease.until >= now => {
                lease.dirty = true;
                Ok(Acquire::HeldElsewhere)
            }
            _ => {
                entry.lease = Some(Lease {
                    owner: owner.to_owned(),
                    until,
                    dirty: false,
                });
                Ok(Acquire::Acquired)
            }
        }
    }

    async fn release(
        &self,
        group: &str,
        owner: &str,
        until: UnixMillis,
    ) -> Result<Release, StateError> {
        self.check("DeleteItem").await?;
        let mut groups = lock(&self.groups);
        let Some(entry) = groups.get_mut(group) else {
            return Ok(Release::Lost);
        };
        match &mut entry.lease {
            Some(lease) if lease.owner == owner && lease.dirty => {
                lease.dirty = false;
                lease.until = until;
                Ok(Release::RunAgain)
            }
            Some(lease) if lease.owner == owner => {
                entry.lease = None;
                Ok(Release::Released)
            }
            _ => Ok(Release::Lost),
        }
    }

    async fn abandon(&self, group: &str, owner: &str) -> Result<(), StateError> {
        self.check("DeleteItem").await?;
        if let Some(entry) = lock(&self.groups).get_mut(group)
            && entry.lease.as_ref().is_some_and(|l| l.owner == owner)
        {
            entry.lease = None;
        }
        Ok(())
    }
}
