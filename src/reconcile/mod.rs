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
mod bindings;
mod elsewhere;
mod error;
mod gates;
mod leased;
mod memory;
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
pub use bindings::Bindings;
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

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::Clock;
use crate::core::UnixMillis;
use crate::core::checkpoint::{Rotation, rank_order};
use crate::faults::FaultPoint;
use crate::groups::{Priority, TargetGroupApi};
use crate::lease;
use crate::pods::PodSource;
use crate::report::GroupReport;
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

/// The reconcile core: one group's pass and what passes share — the adapters and the
/// clock (`pods`, `groups`, `state`, `clock`), the settings, the index of bound groups,
/// the shutdown ([`Stop`]), what passes remember between them (`memory`) and where
/// they are told (`sink`). The controller's engine holds it beside its warm state.
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
    /// The bound groups: one index, one owner (see [`crate::index`]).
    pub index: crate::index::BoundIndex,
    /// What the container's passes remember between them: fresh reads, what gates
    /// said, whose leases it holds.
    memory: memory::Memory,
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
            memory: memory::Memory::default(),
            sink: Arc::new(crate::metrics::Printed),
            index: crate::index::BoundIndex::default(),
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
}
