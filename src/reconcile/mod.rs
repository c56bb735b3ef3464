//! The reconcile engine both functions share: discover bound groups, take each group's
//! lease, read pods and target health *after* the lease is held, apply the core's plan
//! with the write-ahead ledger, record backoff, and release — running again while the
//! lease's `dirty` flag says something changed meanwhile.
//!
//! Everything here is generic over the three I/O traits, so the same code runs against
//! AWS and Kubernetes in Lambda, against moto and the emulator in integration tests, and
//! against in-memory fakes in race and fault tests.

mod group;
mod namespace;
mod pod_event;

pub use pod_event::PodEventError;
#[cfg(test)]
mod pod_event_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::Clock;
use crate::core::{BackoffPolicy, Binding, UnixMillis};
use crate::faults::{Faults, NoFaults};
use crate::groups::{TargetGroup, TargetGroupApi};
use crate::pods::PodSource;
use crate::report::{GroupReport, Outcome, Report};
use crate::state::StateStore;

/// Tunables of the engine.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Groups reconciled at once (bounded so ELBv2's Describe token bucket is not drained).
    pub concurrency: usize,
    /// Lease length when the caller gives no deadline (beyond any function timeout).
    pub lease: Duration,
    /// Passes under one lease before giving up on a group that keeps being marked dirty.
    pub max_passes: u32,
    /// Backoff delays.
    pub backoff: BackoffPolicy,
    /// How long pod-events reuses discovered bindings.
    pub discovery_ttl: Duration,
    /// How long a verified, unchanged group may go without a DescribeTargetHealth on the
    /// schedule (`None`: verify every run). Bounds how late external drift is found.
    pub verify_interval: Option<Duration>,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            concurrency: 16,
            lease: Duration::from_secs(180),
            max_passes: 5,
            backoff: BackoffPolicy::default(),
            discovery_ttl: Duration::from_secs(60),
            verify_interval: Some(Duration::from_secs(600)),
        }
    }
}

/// What a run should do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Plan only: no lease, no ELBv2 or DynamoDB writes.
    pub dry_run: bool,
    /// Ignore backoff.
    pub force: bool,
    /// Only these target group ARNs (all bound groups when `None`).
    pub only: Option<Vec<String>>,
    /// When the invocation must end (Lambda deadline); leases last until 30 s after it,
    /// and groups not started 20 s before it are deferred to the next run.
    pub deadline: Option<UnixMillis>,
    /// Let a verified, unchanged group skip DescribeTargetHealth (the scheduled resync;
    /// never pod-events, `force` or a dry run).
    pub use_checkpoint: bool,
}

/// A target group with a valid binding for this cluster.
#[derive(Debug, Clone)]
pub struct BoundGroup {
    /// The group.
    pub group: TargetGroup,
    /// Its binding.
    pub binding: Binding,
}

/// Discovery result: bound groups plus reports for groups with bad tags.
#[derive(Debug, Default)]
pub struct Bindings {
    /// Groups with a valid binding for this cluster.
    pub bound: Vec<BoundGroup>,
    /// Binding errors, one report per group.
    pub errors: Vec<GroupReport>,
}

/// The reconcile engine. Cheap to share behind an `Arc`.
pub struct Engine<P, G, S> {
    /// The EKS cluster this deployment serves.
    pub cluster: String,
    /// Pod reads.
    pub pods: P,
    /// ELBv2.
    pub groups: G,
    /// The state table.
    pub state: S,
    /// Time.
    pub clock: Arc<dyn Clock>,
    /// Fault injection (no-op in production).
    pub faults: Arc<dyn Faults>,
    /// Tunables.
    pub settings: EngineSettings,
    /// Prefix of lease owner ids (`resync`, `pod-events`), for debugging held leases.
    pub owner_prefix: String,
    rng: Mutex<fastrand::Rng>,
    bindings_cache: tokio::sync::Mutex<Option<(UnixMillis, Arc<Vec<BoundGroup>>)>>,
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    /// An engine with default settings, the system clock and no faults.
    pub fn new(
        cluster: impl Into<String>,
        pods: P,
        groups: G,
        state: S,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            cluster: cluster.into(),
            pods,
            groups,
            state,
            clock,
            faults: Arc::new(NoFaults),
            settings: EngineSettings::default(),
            owner_prefix: "tgsync".into(),
            rng: Mutex::new(fastrand::Rng::new()),
            bindings_cache: tokio::sync::Mutex::new(None),
        }
    }

    /// Replaces the fault hook (tests).
    pub fn with_faults(mut self, faults: Arc<dyn Faults>) -> Self {
        self.faults = faults;
        self
    }

    /// Replaces the settings.
    pub fn with_settings(mut self, settings: EngineSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Names lease owners after the calling function.
    pub fn with_owner_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.owner_prefix = prefix.into();
        self
    }

    /// Seeds the jitter source (tests).
    pub fn with_seed(self, seed: u64) -> Self {
        if let Ok(mut rng) = self.rng.lock() {
            *rng = fastrand::Rng::with_seed(seed);
        }
        self
    }

    /// Discovers target groups and splits them into valid bindings and binding errors.
    pub async fn bindings(&self) -> Result<Bindings, crate::groups::ElbError> {
        let mut out = Bindings::default();
        for group in self.groups.discover().await? {
            match Binding::for_cluster(&group.tags, &group.facts, &self.cluster) {
                None => {}
                Some(Ok(binding)) => out.bound.push(BoundGroup { group, binding }),
                Some(Err(e)) => {
                    tracing::warn!(target_group = %group.arn, error = %e, "binding error");
                    out.errors.push(GroupReport::with_error(
                        &group.arn,
                        &group.group_name(),
                        Outcome::BindingError,
                        e,
                    ))
                }
            }
        }
        Ok(out)
    }

    /// The scheduled / manual full diff of every bound group (or the requested ones).
    pub async fn resync(&self, opts: &RunOptions) -> Report {
        let started = self.clock.now();
        let mut report = Report::new("resync", &self.cluster, opts.dry_run, started);
        let bindings = match self.bindings().await {
            Ok(b) => b,
            Err(e) => {
                report
                    .errors
                    .push(format!("discovering target groups failed: {e}"));
                return report.finish(self.clock.now());
            }
        };
        let Bindings {
            mut bound,
            mut errors,
        } = bindings;
        if let Some(only) = &opts.only {
            for arn in only {
                let known = bound.iter().any(|b| &b.group.arn == arn)
                    || errors.iter().any(|e| &e.target_group_arn == arn);
                if !known {
                    report.errors.push(format!(
                        "target group {arn} was requested but is not bound to cluster `{}` (missing, or its tgsync/cluster tag does not name this cluster)",
                        self.cluster
                    ));
                }
            }
            bound.retain(|b| only.contains(&b.group.arn));
            errors.retain(|e| only.contains(&e.target_group_arn));
        }
        report.groups.append(&mut errors);
        report
            .groups
            .extend(self.reconcile_groups(bound, opts).await);
        report.finish(self.clock.now())
    }

    /// Reconciles the given bound groups: namespace by namespace, one consistent pod LIST
    /// per namespace taken after the leases are held.
    pub async fn reconcile_groups(
        &self,
        bound: Vec<BoundGroup>,
        opts: &RunOptions,
    ) -> Vec<GroupReport> {
        let mut by_namespace: BTreeMap<String, Vec<BoundGroup>> = BTreeMap::new();
        for b in bound {
            by_namespace
                .entry(b.binding.namespace.clone())
                .or_default()
                .push(b);
        }
        // Groups start in a shuffled order (the semaphore is FIFO): when a run runs out
        // of time, the groups it defers are not the same ones every run.
        let mut rng = self.jitter_rng();
        let mut by_namespace: Vec<(String, Vec<BoundGroup>)> = by_namespace.into_iter().collect();
        rng.shuffle(&mut by_namespace);
        for (_, groups) in &mut by_namespace {
            rng.shuffle(groups);
        }
        let concurrency = self.settings.concurrency.max(1);
        let permits = Arc::new(tokio::sync::Semaphore::new(concurrency));
        // Namespaces are admitted while fewer than two rounds of `concurrency` groups are
        // in flight (one namespace weighs at most `concurrency`). Taking every lease of
        // every namespace up front would, with a slow state table, spend the whole
        // invocation on leases and defer every group; admitted namespaces finish, and
        // the ones not admitted by the cut-off are deferred without taking a lease.
        let admission = Arc::new(tokio::sync::Semaphore::new(2 * concurrency));
        let runs = by_namespace.into_iter().map(|(ns, groups)| {
            let weight = u32::try_from(groups.len().clamp(1, concurrency)).unwrap_or(1);
            let (admission, permits) = (admission.clone(), permits.clone());
            async move {
                let _admitted = admission.acquire_many(weight).await;
                self.reconcile_namespace(ns, groups, opts, permits).await
            }
        });
        futures::future::join_all(runs)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Whether the invocation is too close to its deadline to start another group.
    fn past_start_deadline(&self, opts: &RunOptions) -> bool {
        let now = self.clock.now();
        opts.deadline
            .is_some_and(|d| d > now && now.plus(Duration::from_secs(20)) >= d)
    }

    /// When a lease taken now should expire.
    fn lease_until(&self, opts: &RunOptions) -> UnixMillis {
        let now = self.clock.now();
        match opts.deadline {
            Some(deadline) if deadline > now => deadline.plus(Duration::from_secs(30)),
            _ => now.plus(self.settings.lease),
        }
    }

    /// A unique lease owner id.
    fn new_owner(&self) -> String {
        let n = self.rng.lock().map(|mut r| r.u64(..)).unwrap_or_default();
        format!("{}-{n:016x}", self.owner_prefix)
    }

    fn jitter_rng(&self) -> fastrand::Rng {
        let seed = self.rng.lock().map(|mut r| r.u64(..)).unwrap_or_default();
        fastrand::Rng::with_seed(seed)
    }
}

impl TargetGroup {
    /// The name, or the ARN when discovery had none.
    pub fn group_name(&self) -> String {
        if self.name.is_empty() {
            self.arn.clone()
        } else {
            self.name.clone()
        }
    }
}
