//! The reconcile engine every function shares: discover bound groups, observe each one
//! (state, pods, target health → plan) without a lease, and only for groups whose plan
//! is not empty take the lease, read pods and health afresh, and apply the plan with
//! the write-ahead ledger — running again while the lease's `dirty` flag says something
//! changed meanwhile. The lease protocol itself lives in [`crate::lease`].
//!
//! Everything here is generic over the three I/O traits, so the same code runs against
//! AWS and Kubernetes in Lambda, against moto and the emulator in integration tests, and
//! against in-memory fakes in race and fault tests.

mod action;
mod elsewhere;
mod error;
mod gates;
mod leased;
mod notes;
mod observe;
mod pass;
mod pod_event;
mod read_ahead;
mod reads;
mod refusals;
mod release;
mod rollout;
mod stop;
mod tag_reads;

pub use action::{Action, Reconciled};
pub(crate) use error::{CUT, DEFERRED};
pub use error::{Failure, PassError};
pub(crate) use gates::Settled;
pub(crate) use observe::Observed;
pub use pod_event::{PodEvent, PodEventError};
pub(crate) use read_ahead::ReadAhead;
pub(crate) use reads::PodReads;
pub(crate) use release::unreleased;
pub use stop::Stop;
#[cfg(test)]
mod motion_tests;
#[cfg(test)]
mod pod_event_tests;
#[cfg(test)]
mod release_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::Clock;
use crate::core::checkpoint::{Rotation, rank_order};
use crate::core::{Binding, GroupFacts, UnixMillis};
use crate::faults::FaultPoint;
use crate::groups::{Priority, TargetGroup, TargetGroupApi};
use crate::lease;
use crate::pods::PodSource;
use crate::report::{GroupReport, Outcome};
use crate::state::{StateError, StateStore};

pub use crate::settings::EngineSettings;

/// What a run should do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Plan only: no lease, no ELBv2 or DynamoDB writes.
    pub dry_run: bool,
    /// Ignore backoff.
    pub force: bool,
    /// Only these target group ARNs (all bound groups when `None`).
    pub only: Option<Vec<String>>,
    /// When the invocation must end (Lambda deadline): groups not started
    /// [`START_CUTOFF`] before it are deferred to the next run.
    pub deadline: Option<UnixMillis>,
    /// How the request's ELBv2 reads wait for the Describe budget (a verification of
    /// the full diff yields to reactions).
    pub priority: Priority,
    /// Let a verified, unchanged group skip DescribeTargetHealth when its verification
    /// turn has not come (the scheduled resync; never pod-events, `force` or a dry run).
    pub use_checkpoint: bool,
    /// Passes still running at this time stop before their next change, write what
    /// they did, give the lease back and ask for another pass (the controller's end).
    pub cut_at: Option<UnixMillis>,
}

/// No group pass starts with less than this left before the invocation's deadline.
pub const START_CUTOFF: Duration = Duration::from_secs(20);

pub use crate::index::BoundGroup;

/// Discovery result: bound groups plus reports for groups with bad tags.
#[derive(Debug, Default)]
pub struct Bindings {
    /// Groups with a valid binding for this cluster.
    pub bound: Vec<BoundGroup>,
    /// Binding errors, one report per group.
    pub errors: Vec<GroupReport>,
    /// Accounts whose discovery failed (their groups are unknown and left untouched):
    /// one run-level error each in the report.
    pub accounts_failed: Vec<crate::groups::AccountError>,
}

/// Which groups a run looks at beyond their binding: `focus` narrows a pod event to the
/// groups its pod can matter to.
#[derive(Debug, Default)]
pub(crate) struct Scope<'a> {
    /// Groups whose re-verification turn has come (scheduled runs).
    pub(crate) due: Option<&'a HashSet<String>>,
    /// The pod an event is about, when its labels are unknown: groups whose selector
    /// cannot be checked are reconciled only if their ledger holds it.
    pub(crate) focus: Option<&'a PodEvent>,
    /// This cluster's index of groups holding its entries, as read at the start of a
    /// full resync: a bound group whose ledger holds our entries and is missing from it
    /// (written before the index existed) is added.
    pub(crate) indexed: Option<&'a std::collections::BTreeSet<String>>,
    /// The full diff's read-ahead of the groups' states (none: each look reads its
    /// group's state alone).
    pub(crate) ahead: Option<&'a read_ahead::ReadAhead>,
}

/// The reconcile core: one group's pass and what passes share (I/O, clock, settings,
/// the index of bound groups, the gates' and tag reads' memory). The controller's
/// engine holds it beside its warm state.
pub struct Reconciler<P, G, S> {
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
    /// Fault injection (tests only).
    #[cfg(any(test, feature = "testing"))]
    pub faults: Arc<dyn crate::faults::Faults>,
    /// Tunables.
    pub settings: EngineSettings,
    /// Prefix of lease owner ids (`resync`, `pod-events`), for debugging held leases.
    pub owner_prefix: String,
    rng: Mutex<fastrand::Rng>,
    /// Whether the process is shutting down (SIGTERM), and the leased passes the
    /// shutdown hook waits for.
    pub stop: Stop,
    /// Told about every pass as it ends, and every gate opened: the log and metric
    /// lines, printed as they happen.
    sink: Arc<dyn crate::metrics::Sink>,
    /// Target health as last read per group (the gates' verdicts reuse fresh reads).
    health_cache: gates::HealthCache,
    /// The bound groups: one index, one owner (see [`crate::index`]).
    pub index: crate::index::BoundIndex,
    /// What each gated pod's condition was last written to say (its writes are
    /// patched only when the verdict changes, whoever in this container settles it).
    gates_said: gates::GatesSaid,
    /// When each gated pod's gate was last found closed (for its latency once opened).
    gates_waiting: gates::GatesWaiting,
    /// Each group's newest tag read in this container (a pass's re-read serves the
    /// passes after it for `binding_max_age`).
    tag_reads: tag_reads::TagReads,
    /// The leases this container's passes hold, and since when looks find each group's
    /// lease held elsewhere (see [`elsewhere`]).
    leases: elsewhere::Leases,
    /// Each group's attributes as the rollout check last read them (see [`rollout`]).
    attribute_reads: rollout::AttributeReads,
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Reconciler<P, G, S> {
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
            #[cfg(any(test, feature = "testing"))]
            faults: Arc::new(crate::faults::NoFaults),
            settings: EngineSettings::default(),
            owner_prefix: "tgsync".into(),
            rng: Mutex::new(fastrand::Rng::new()),
            stop: Stop::default(),
            sink: Arc::new(crate::metrics::Printed),
            health_cache: gates::HealthCache::default(),
            index: crate::index::BoundIndex::default(),
            gates_said: gates::GatesSaid::default(),
            gates_waiting: gates::GatesWaiting::default(),
            tag_reads: tag_reads::TagReads::default(),
            leases: elsewhere::Leases::default(),
            attribute_reads: rollout::AttributeReads::default(),
        }
    }

    /// Replaces the fault hook (tests).
    #[cfg(any(test, feature = "testing"))]
    pub fn with_faults(mut self, faults: Arc<dyn crate::faults::Faults>) -> Self {
        self.faults = faults;
        self
    }

    /// Replaces the settings.
    pub fn with_settings(mut self, settings: EngineSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Replaces where passes are told (tests).
    pub fn with_sink(mut self, sink: Arc<dyn crate::metrics::Sink>) -> Self {
        self.sink = sink;
        self
    }

    /// Tells the sink that a pass of this engine ended with `report` (a pod change
    /// seen `reaction` before its first ELBv2 change was answered).
    pub(crate) fn pass_done(
        &self,
        report: &GroupReport,
        dry_run: bool,
        reaction: Option<Duration>,
    ) {
        self.sink.pass(&crate::metrics::PassDone {
            function: &self.owner_prefix,
            cluster: &self.cluster,
            report,
            dry_run,
            reaction,
            at: self.clock.now(),
        });
    }

    /// Tells the sink that a gate was opened `latency` after its target was first seen
    /// healthy.
    pub(crate) fn gate_done(&self, latency: Duration) {
        self.sink
            .gate(&self.owner_prefix, &self.cluster, self.clock.now(), latency);
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

    /// Stops here if a test asked to crash at `point`; nothing in production builds.
    fn fault(&self, point: FaultPoint) -> Result<(), FaultPoint> {
        #[cfg(any(test, feature = "testing"))]
        {
            self.faults.check(point)
        }
        #[cfg(not(any(test, feature = "testing")))]
        {
            let _ = point;
            Ok(())
        }
    }

    /// Discovers target groups and splits them into valid bindings and binding errors
    /// (bad tags, or tags asking for more than the deployment's binding policy allows).
    /// An account whose discovery failed is listed in `accounts_failed`; `Err` only when
    /// the single account there is could not be read. Nothing is written: the caller
    /// makes them the container's ([`crate::index::BoundIndex::discovered`]) and, unless
    /// it is a dry run, the state table's ([`Reconciler::publish_bindings`]).
    pub async fn bindings(&self, priority: &Priority) -> Result<Bindings, crate::groups::ElbError> {
        let read_at = self.clock.now();
        let discovery = self.groups.discover_accounts(priority).await?;
        let mut out = Bindings {
            accounts_failed: discovery.failed,
            ..Bindings::default()
        };
        for group in discovery.groups {
            match self.bind(group, read_at) {
                None => {}
                Some(Ok(bound)) => out.bound.push(bound),
                Some(Err(report)) => out.errors.push(report),
            }
        }
        Ok(out)
    }

    /// Brings the state table's index of bound groups to a discovery's result: a row
    /// for every bound group that has none for its binding, and rows of groups no
    /// longer bound (in accounts that could be read) marked so; the index's generation
    /// is bumped when anything changed (and the container's view follows it), so
    /// pod-events and the gates of every function see the groups the last discovery
    /// found. Nothing is written when the rows say so already. A failure is logged: the
    /// rows are brought there by the next discovery.
    pub(crate) async fn publish_bindings(&self, found: &Bindings) {
        let rows = match self.state.indexed_selections(&self.cluster).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "reading this cluster's index in the state table failed; it is brought to the bound groups at the next discovery");
                return;
            }
        };
        let recorded: std::collections::HashMap<&str, &crate::state::IndexedGroup> =
            rows.iter().map(|r| (r.group.as_str(), r)).collect();
        let mut updates: Vec<crate::state::IndexUpdate<'_>> = found
            .bound
            .iter()
            .filter(|b| {
                recorded.get(b.group.arn.as_str()).is_none_or(|r| {
                    !r.bound || r.binding != Some(b.binding.fingerprint()) || r.described.is_none()
                })
            })
            .map(|b| crate::state::IndexUpdate::Bound {
                group: &b.group.arn,
                binding: &b.binding,
                described: (&b.group.name, &b.group.facts),
            })
            .collect();
        let bound: BTreeSet<&str> = found.bound.iter().map(|b| b.group.arn.as_str()).collect();
        let unread: BTreeSet<Option<&str>> = found
            .accounts_failed
            .iter()
            .map(|f| f.account.as_deref())
            .collect();
        // An account that could not be read (or whose name is not known) may still
        // bind its groups.
        let readable = |arn: &str| {
            !unread.contains(&None) && !unread.contains(&crate::core::arn::arn_account(arn))
        };
        updates.extend(
            rows.iter()
                .filter(|r| r.bound && !bound.contains(r.group.as_str()) && readable(&r.group))
                .map(|r| crate::state::IndexUpdate::Unbound { group: &r.group }),
        );
        if updates.is_empty() {
            return;
        }
        let before = self.index.generation();
        match self.state.sync_index(&self.cluster, &updates).await {
            Ok(Some(generation)) => self.index.wrote(before, generation),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "writing this cluster's index of bound groups failed; tried again at the next discovery");
            }
        }
    }

    /// Records `bound` in the state table's index of bound groups (a pass before the
    /// group's first entry of this cluster, and a group found in the ledgers but missing
    /// from the index), keeping the container's view current when its own write is the
    /// index's only change.
    pub(crate) async fn record_bound(&self, bound: &BoundGroup) -> Result<(), StateError> {
        let before = self.index.generation();
        let update = crate::state::IndexUpdate::Bound {
            group: &bound.group.arn,
            binding: &bound.binding,
            described: (&bound.group.name, &bound.group.facts),
        };
        let written = self.state.sync_index(&self.cluster, &[update]).await?;
        if let Some(generation) = written {
            self.index.wrote(before, generation);
        }
        Ok(())
    }

    /// The groups of `batch` (at most [`crate::aws::elbv2::TAGS_BATCH`]) as they are
    /// now: those whose index rows record their names and facts (which ELBv2 never
    /// changes) from one DescribeTags, the others described as discovery does (one
    /// DescribeTargetGroups more); these are returned too. What reads a few groups
    /// without discovering every group of the account.
    pub(crate) async fn read_groups(
        &self,
        batch: Vec<(String, Option<(String, GroupFacts)>)>,
    ) -> Result<(Vec<TargetGroup>, BTreeSet<String>), crate::groups::ElbError> {
        let mut described = Vec::new();
        let mut undescribed = BTreeSet::new();
        for (arn, recorded) in batch {
            match recorded {
                Some((name, facts)) => described.push(TargetGroup {
                    name,
                    facts,
                    tags: BTreeMap::new(),
                    arn,
                }),
                None => {
                    undescribed.insert(arn);
                }
            }
        }
        let mut groups = Vec::with_capacity(described.len() + undescribed.len());
        if !described.is_empty() {
            let arns: Vec<String> = described.iter().map(|g| g.arn.clone()).collect();
            let mut tags = self.groups.tags_of(&arns, &Priority::Reaction).await?;
            for mut group in described {
                match tags.remove(&group.arn) {
                    Some(t) => {
                        group.tags = t;
                        groups.push(group);
                    }
                    // Another account's (one DescribeTags reads one account's groups).
                    None => {
                        undescribed.insert(group.arn);
                    }
                }
            }
        }
        if !undescribed.is_empty() {
            let arns: Vec<String> = undescribed.iter().cloned().collect();
            groups.extend(self.groups.describe(&arns, &Priority::Reaction).await?);
        }
        Ok((groups, undescribed))
    }

    /// `group` bound to this cluster under the deployment's binding policy, its tags
    /// read at `read_at`: `None` when its tags do not name this cluster, its report
    /// when they are wrong.
    pub(crate) fn bind(
        &self,
        group: crate::groups::TargetGroup,
        read_at: UnixMillis,
    ) -> Option<Result<BoundGroup, GroupReport>> {
        let policy = &self.settings.binding_policy;
        match Binding::for_cluster(&group.tags, &group.facts, &self.cluster, policy)? {
            Ok(binding) => Some(Ok(BoundGroup {
                group,
                binding,
                read_at,
            })),
            Err(e) => {
                // DEBUG: the report carries it, and the resync handler logs one line
                // per failing group every run; pod-events, which rediscovers every
                // minute, would only repeat it.
                tracing::debug!(target_group = %group.arn, error = %e, "binding error");
                Some(Err(GroupReport::with_error(
                    &group.arn,
                    &group.group_name(),
                    Outcome::BindingError,
                    e,
                )))
            }
        }
    }

    /// Re-verifications one scheduled run may spend (at least one).
    pub(crate) fn verify_budget_per_run(&self) -> usize {
        let per_run =
            self.settings.verify_describes_per_second * self.settings.schedule_period.as_secs_f64();
        (per_run.floor() as usize).max(1)
    }

    /// This run's place in the verification rotation over `bound`: the groups whose
    /// re-verification turn has come, and what the report says of the rotation.
    pub(crate) fn rotation(
        &self,
        bound: &[BoundGroup],
        now: UnixMillis,
    ) -> (HashSet<String>, crate::report::Verification) {
        let period = u64::try_from(self.settings.schedule_period.as_millis())
            .unwrap_or(60_000)
            .max(1);
        let rotation = Rotation::new(bound.len(), self.verify_budget_per_run(), now.0 / period);
        let due = rank_order(bound.iter().map(|b| b.group.arn.as_str()))
            .iter()
            .enumerate()
            .filter(|(rank, _)| rotation.due(*rank))
            .map(|(_, arn)| (*arn).to_owned())
            .collect();
        let verification = crate::report::Verification {
            budget_per_run: self.verify_budget_per_run(),
            cycle_runs: rotation.cycle,
            detection_bound_seconds: rotation
                .detection_bound(self.settings.schedule_period)
                .as_secs(),
        };
        (due, verification)
    }

    /// Whether passes must stop now: the process is shutting down, or the run's
    /// `cut_at` has come.
    pub(crate) fn cut_due(&self, opts: &RunOptions) -> bool {
        self.stop.is_shutting_down() || opts.cut_at.is_some_and(|t| self.clock.now() >= t)
    }

    /// Whether the invocation is too close to its deadline to start another group pass.
    pub(crate) fn past_start_deadline(&self, opts: &RunOptions) -> bool {
        let now = self.clock.now();
        opts.deadline
            .is_some_and(|d| d > now && now.plus(START_CUTOFF) >= d)
    }

    /// Takes `group`'s lease as this engine's holder, or finds it held elsewhere (the
    /// holder is asked to run again; the caller's queue parks the request).
    pub(crate) async fn take_lease(&self, group: &str) -> Result<lease::Taken<'_, S>, StateError> {
        lease::take(
            &self.state,
            self.clock.as_ref(),
            group,
            self.new_owner(),
            self.settings.lease,
        )
        .await
    }

    /// A unique lease owner id naming the function and the cluster (another cluster's
    /// deployment cannot serve our pods, so a waiter must tell the two apart).
    fn new_owner(&self) -> String {
        let n = self.rng.lock().map(|mut r| r.u64(..)).unwrap_or_default();
        crate::lease::owner_id(&self.owner_prefix, &self.cluster, n)
    }

    pub(crate) fn jitter_rng(&self) -> fastrand::Rng {
        let seed = self.rng.lock().map(|mut r| r.u64(..)).unwrap_or_default();
        fastrand::Rng::with_seed(seed)
    }

    /// The claims of a ledger as the diff sees them (this cluster's or another's).
    fn claims(
        &self,
        ledger: &BTreeMap<crate::core::Target, crate::state::LedgerEntry>,
    ) -> BTreeMap<crate::core::Target, crate::core::Claim> {
        ledger
            .iter()
            .map(|(t, e)| {
                (
                    *t,
                    crate::core::Claim {
                        mine: e.cluster == self.cluster,
                        since: e.deregistered_at.unwrap_or(e.registered_at),
                        tombstone: e.deregistered_at.is_some(),
                    },
                )
            })
            .collect()
    }

    /// Targets this cluster's deployment owns in `ledger`.
    fn mine(
        &self,
        ledger: &BTreeMap<crate::core::Target, crate::state::LedgerEntry>,
    ) -> BTreeSet<crate::core::Target> {
        ledger
            .values()
            .filter(|e| e.cluster == self.cluster)
            .map(|e| e.target)
            .collect()
    }
}
