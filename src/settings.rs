//! The engine's tunables, shared by the reconcile core and the controller (so neither
//! imports the other for them): every function's settings come from the environment
//! through [`crate::config`] into one [`EngineSettings`].

use std::time::Duration;

use crate::core::rollout::{Allowances, Latency};
use crate::core::{BackoffPolicy, BindingPolicy};
use crate::lease::Timings;

/// How long one watch request asks the server to keep the stream open: under the
/// client's 30 s read timeout, so a quiet namespace ends its stream cleanly and resumes.
pub const WATCH_REQUEST: Duration = Duration::from_secs(25);

/// The default relist period (`TGSYNC_RELIST_MINUTES`, 120): a safety net only — the
/// watch protocol itself guarantees no gap (a 410 or an error relists at once) — priced
/// so that at 100,000 pods (a ~430 MiB LIST) it costs under 1 % of a LIST per minute on
/// average.
pub const RELIST_AFTER: Duration = Duration::from_secs(120 * 60);

/// Tunables of the engine.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Groups observed or reconciled at once (bounded so ELBv2's Describe token bucket
    /// is not drained).
    pub concurrency: usize,
    /// Lease duration, heartbeat and polling.
    pub lease: Timings,
    /// How long a one-shot run (a manual run, a pod event) keeps a request parked on a
    /// lease another process holds, for the holder to give the lease back (or die) so
    /// that the request's own pass runs; `None`: the holder, asked to run again, serves
    /// it. (A watching run keeps it parked for as long as it runs.)
    pub lease_wait: Option<Duration>,
    /// Passes under one lease before giving up on a group that keeps being marked dirty.
    pub max_passes: u32,
    /// Backoff delays of a group's registrations after failures of the whole group.
    pub backoff: BackoffPolicy,
    /// Backoff delays of one target ELBv2 refused for itself (5 s doubling to 1,000 s:
    /// a handful of tries in its first minute, then ever fewer).
    pub target_backoff: BackoffPolicy,
    /// Intervals between a full group's probes for room (15 s doubling to 5 min: a
    /// raised quota is noticed within minutes, at one refused call an interval).
    pub full_probe: BackoffPolicy,
    /// A pass under the lease re-reads the group's tags when its binding is older than
    /// this (pod-events and watch mode work from cached bindings).
    pub binding_max_age: Duration,
    /// Target-health reads the schedule may spend per second on re-verifying groups
    /// nothing has changed (the account-wide budget; `TGSYNC_VERIFY_DESCRIBES_PER_SECOND`).
    pub verify_describes_per_second: f64,
    /// The schedule's period (`TGSYNC_SCHEDULE_MINUTES`): with the rate above, how many
    /// groups one scheduled run re-verifies.
    pub schedule_period: Duration,
    /// What the deployment lets binding tags ask for (`TGSYNC_ALLOWED_NAMESPACES`,
    /// `TGSYNC_ALLOW_EXCLUSIVE`); a binding outside it is a binding error.
    pub binding_policy: BindingPolicy,
    /// How long one watch request asks the server to keep its stream open (watch mode).
    pub watch_request: Duration,
    /// A watched namespace whose LIST is older than this is listed again, a safety net
    /// beside the watch (`TGSYNC_RELIST_MINUTES`; `None`: never).
    pub relist_after: Option<Duration>,
    /// What the rollout check holds the pods' termination to.
    pub rollout: RolloutSettings,
}

/// The rollout check's numbers (see [`crate::core::rollout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RolloutSettings {
    /// tgsync's deregistration latency in this deployment (from `TGSYNC_WATCH_SECONDS`
    /// and `TGSYNC_SCHEDULE_MINUTES`).
    pub latency: Latency,
    /// Each load balancer type's propagation allowance
    /// (`TGSYNC_NLB_PROPAGATION_SECONDS`, `TGSYNC_ALB_PROPAGATION_SECONDS`).
    pub allowances: Allowances,
}

impl Default for RolloutSettings {
    fn default() -> Self {
        Self {
            latency: Latency::watch(),
            allowances: Allowances::default(),
        }
    }
}

impl Default for EngineSettings {
    fn default() -> Self {
        let lease = Timings::default();
        Self {
            concurrency: 16,
            // A dead holder's lease is taken over once it expired and its grace passed.
            lease_wait: Some(lease.duration + lease.takeover_grace + Duration::from_secs(2)),
            lease,
            max_passes: 5,
            backoff: BackoffPolicy::default(),
            target_backoff: BackoffPolicy {
                min: Duration::from_secs(5),
                max: Duration::from_secs(1000),
            },
            full_probe: BackoffPolicy {
                min: Duration::from_secs(15),
                max: Duration::from_secs(300),
            },
            binding_max_age: Duration::from_secs(5),
            verify_describes_per_second: 2.0,
            schedule_period: Duration::from_secs(60),
            // The engine alone imposes no limits (the tag table decides); a deployment's
            // limits come from its settings (`App::build`), whose default is stricter.
            binding_policy: BindingPolicy::unrestricted(),
            watch_request: WATCH_REQUEST,
            relist_after: Some(RELIST_AFTER),
            rollout: RolloutSettings::default(),
        }
    }
}
