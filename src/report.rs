//! The JSON report both functions return: what changed, per group, in words an operator
//! can act on. Targets appear as `ip:port`.

use serde::Serialize;

use crate::core::{AdministrativeOverride, Plan, Target, TargetHealth, UnixMillis};

/// How one group's reconcile ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// Nothing to change.
    InSync,
    /// Targets were registered, deregistered or forgotten.
    Changed,
    /// Dry run: the plan is reported, nothing was changed.
    Planned,
    /// The group's tags do not make a valid binding; the group is untouched.
    BindingError,
    /// Another reconcile holds the group's lease; it was asked to run again.
    LeaseHeld,
    /// Skipped: the group is backing off after failures (use `force` to override).
    BackingOff,
    /// The reconcile failed; see `error` and `failedTargets`. The group backs off —
    /// unless only the group's targets quota refused registrations: then nothing but a
    /// larger quota or a split group helps, and it is tried again every run.
    Failed,
    /// Stopped at an injected fault (tests only).
    Aborted,
    /// Not started: the invocation was too close to its deadline; the next run does it.
    Deferred,
    /// A `release` took tgsync out of the group: every target this cluster owned in it
    /// was deregistered (or found gone) and its ledger entries deleted.
    Released,
}

impl Outcome {
    /// Whether the group is failing: it failed, its tags are wrong, or it is backing off
    /// after failures (still failing between its attempts, so alarms and logs keep
    /// seeing it instead of clearing until the next attempt).
    pub fn is_error(self) -> bool {
        matches!(
            self,
            Self::Failed | Self::BindingError | Self::Aborted | Self::BackingOff
        )
    }
}

/// A target a call failed for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailedTarget {
    /// The target.
    pub target: Target,
    /// `register` or `deregister`.
    pub operation: &'static str,
    /// The error.
    pub error: String,
}

/// A registered target the load balancer does not use (`unused`: its group has no load
/// balancer or listener, its zone is not enabled, it is in an invalid state) or whose
/// health it cannot tell (`unavailable`), with ELBv2's words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnusedTarget {
    /// The target.
    pub target: Target,
    /// `unused` or `unavailable`.
    pub state: String,
    /// ELBv2's reason code (`Target.NotInUse`, `Target.InvalidState`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// ELBv2's description.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A registered target the load balancer routes around by an administrative override
/// (an NLB zonal shift): still registered and, for tgsync, as healthy as its state says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OverriddenTarget {
    /// The target.
    pub target: Target,
    /// Its health state.
    pub state: String,
    /// The override.
    pub administrative_override: AdministrativeOverride,
}

/// A selected pod that yields no target because of a mistake an operator must fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodError {
    /// `namespace/name`.
    pub pod: String,
    /// What is wrong.
    pub error: String,
}

/// One group's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupReport {
    /// Target group ARN.
    pub target_group_arn: String,
    /// Target group name.
    pub name: String,
    /// The AWS account that owns the group (from its ARN): with target account roles, a
    /// deployment serves groups of several accounts, and an operator must know where to
    /// look.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub account: String,
    /// How it ended.
    pub outcome: Outcome,
    /// Targets registered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub registered: Vec<Target>,
    /// Targets deregistered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deregistered: Vec<Target>,
    /// Ledger rows dropped because their target was removed by hand.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub forgotten: Vec<Target>,
    /// Targets tgsync did not register and left in place (shared mode).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub foreign_kept: Vec<Target>,
    /// Dry run only: what a real run would do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    /// Targets whose register/deregister call failed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed_targets: Vec<FailedTarget>,
    /// Gated pods whose `tgsync/target-health` condition was set True (`namespace/name`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gates_opened: Vec<String>,
    /// Pods that should be targets but cannot be.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pod_errors: Vec<PodError>,
    /// Registered targets that get no traffic (`unused`) or whose health is unknown
    /// (`unavailable`), from the last health read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unused_targets: Vec<UnusedTarget>,
    /// Registered targets under an administrative override (zonal shift), from the last
    /// health read: never deregistered for it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub administrative_overrides: Vec<OverriddenTarget>,
    /// Number of desired targets after the last pass.
    pub desired: usize,
    /// The error that stopped or failed this group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When a backing-off group will be tried again (unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<UnixMillis>,
    /// Reconcile passes run under the lease (more than one when asked to run again).
    pub passes: u32,
    /// True when the desired set was unchanged and verified recently, so target health
    /// was not read this run (the checkpoint).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub verification_skipped: bool,
    /// The group was found deleted, or its tags changed since they were read: cached
    /// bindings must be dropped (not part of the JSON report).
    #[serde(skip)]
    pub gone: bool,
}

impl GroupReport {
    /// An empty report for a group, to be filled in.
    pub fn new(arn: &str, name: &str, outcome: Outcome) -> Self {
        Self {
            target_group_arn: arn.to_owned(),
            name: name.to_owned(),
            account: crate::groups::arn_account(arn)
                .unwrap_or_default()
                .to_owned(),
            outcome,
            registered: Vec::new(),
            deregistered: Vec::new(),
            forgotten: Vec::new(),
            foreign_kept: Vec::new(),
            plan: None,
            failed_targets: Vec::new(),
            gates_opened: Vec::new(),
            pod_errors: Vec::new(),
            unused_targets: Vec::new(),
            administrative_overrides: Vec::new(),
            desired: 0,
            error: None,
            next_attempt_at: None,
            passes: 0,
            verification_skipped: false,
            gone: false,
        }
    }

    /// Whether the group is worth a log line and a per-group metric line: it changed,
    /// it is failing, or it holds targets that get no traffic. A group in sync (the
    /// steady state of almost every group) is not, so a quiet run costs one summary line
    /// however many groups it looked at.
    pub fn is_eventful(&self) -> bool {
        matches!(self.outcome, Outcome::Changed | Outcome::Released)
            || self.outcome.is_error()
            || !self.unused_targets.is_empty()
    }

    /// Records what a health read says beyond the diff: the targets that get no traffic
    /// and those under an administrative override (replacing what an earlier read of
    /// this run said).
    pub fn note_health(&mut self, actual: &[TargetHealth]) {
        self.unused_targets = actual
            .iter()
            .filter(|h| h.gets_no_traffic())
            .map(|h| UnusedTarget {
                target: h.target,
                state: h.state.as_str().to_owned(),
                reason: h.reason.clone(),
                description: h.description.clone(),
            })
            .collect();
        self.administrative_overrides = actual
            .iter()
            .filter_map(|h| {
                Some(OverriddenTarget {
                    target: h.target,
                    state: h.state.as_str().to_owned(),
                    administrative_override: h.administrative_override.clone()?,
                })
            })
            .collect();
    }

    /// A report that only carries an error.
    pub fn with_error(arn: &str, name: &str, outcome: Outcome, error: impl ToString) -> Self {
        let mut r = Self::new(arn, name, outcome);
        r.error = Some(error.to_string());
        r
    }
}

/// Counts over all groups, for a glance and for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    /// Groups bound to this cluster (including binding errors).
    pub groups: usize,
    /// Groups changed.
    pub changed: usize,
    /// Targets registered.
    pub registered: usize,
    /// Targets deregistered.
    pub deregistered: usize,
    /// Ledger rows forgotten.
    pub forgotten: usize,
    /// Groups failed, with binding errors, or aborted.
    pub errors: usize,
    /// Groups skipped because another run held the lease.
    pub lease_held: usize,
    /// Groups skipped by backoff.
    pub backing_off: usize,
    /// Groups deferred to the next run (deadline).
    pub deferred: usize,
    /// Groups whose health read was skipped by the checkpoint.
    pub verification_skipped: usize,
    /// Groups released (`release`).
    pub released: usize,
    /// Groups no longer bound whose ledger still holds this cluster's targets.
    pub orphaned: usize,
}

/// A group no longer bound to this cluster (its tags were removed or changed, or it was
/// deleted) whose ledger still holds targets this cluster registered. tgsync never acts
/// on it by itself: a `release` deregisters what is left and deletes the entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Orphan {
    /// Target group ARN.
    pub target_group_arn: String,
    /// Ledger entries of this cluster in it (targets that may still get traffic).
    pub targets: usize,
    /// What to do about it.
    pub action: String,
}

/// How a scheduled run spends the account-wide Describe budget on re-verifying groups
/// that nothing changed, and what that means for finding hand edits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    /// Unchanged groups one run may re-verify (`TGSYNC_VERIFY_DESCRIBES_PER_SECOND` ×
    /// the schedule period).
    pub budget_per_run: usize,
    /// Runs it takes to re-verify every group (1 while the fleet fits the budget).
    pub cycle_runs: u64,
    /// The longest a hand edit of an unchanged group can go unnoticed.
    pub detection_bound_seconds: u64,
}

/// What a watch did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchReport {
    /// How long it watched (ms).
    pub watched_ms: u64,
    /// Namespaces watched.
    pub namespaces: usize,
    /// Pod events received (bookmarks not counted).
    pub events: u64,
    /// Events that could change a group (and so asked for a pass).
    pub relevant_events: u64,
    /// Group passes run because of them (each an observation, and a leased pass when
    /// something was to change).
    pub passes: u64,
    /// Watches resumed after the server ended the stream or the connection broke.
    pub resumed: u64,
    /// Fresh LISTs after a 410 Gone.
    pub relisted: u64,
    /// Targets registered.
    pub registered: usize,
    /// Targets deregistered.
    pub deregistered: usize,
    /// Readiness gates opened (`namespace/name`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gates_opened: Vec<String>,
    /// Group reports of the passes that changed something or failed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<GroupReport>,
    /// Errors of the watch itself (a namespace that could not be watched).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// The whole run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Which function produced it (`resync` or `pod-events`).
    pub function: &'static str,
    /// The cluster this deployment serves.
    pub cluster: String,
    /// Whether nothing was changed on purpose.
    pub dry_run: bool,
    /// Start time (unix ms).
    pub started_at: UnixMillis,
    /// Wall time of the run.
    pub duration_ms: u64,
    /// Counts.
    pub totals: Totals,
    /// Scheduled runs: the verification rotation and its detection bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
    /// Watch mode: what the watch after the full diff did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watch: Option<WatchReport>,
    /// Per group, sorted by name.
    pub groups: Vec<GroupReport>,
    /// Full resyncs (the runs that look): groups no longer bound that still hold this
    /// cluster's targets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orphans: Option<Vec<Orphan>>,
    /// Errors not tied to one group (discovery failed, an unknown ARN requested).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Notes about the input (e.g. why an event was ignored).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Report {
    /// An empty report.
    pub fn new(
        function: &'static str,
        cluster: &str,
        dry_run: bool,
        started_at: UnixMillis,
    ) -> Self {
        Self {
            function,
            cluster: cluster.to_owned(),
            dry_run,
            started_at,
            duration_ms: 0,
            totals: Totals::default(),
            verification: None,
            watch: None,
            groups: Vec::new(),
            orphans: None,
            errors: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Sorts groups and computes totals and duration.
    pub fn finish(mut self, now: UnixMillis) -> Self {
        self.groups.sort_by(|a, b| {
            a.name
                .cmp(&b.name)
                .then_with(|| a.target_group_arn.cmp(&b.target_group_arn))
        });
        let mut t = Totals {
            groups: self.groups.len(),
            orphaned: self.orphans.as_ref().map_or(0, Vec::len),
            ..Totals::default()
        };
        for g in &self.groups {
            t.verification_skipped += usize::from(g.verification_skipped);
            t.registered += g.registered.len();
            t.deregistered += g.deregistered.len();
            t.forgotten += g.forgotten.len();
            match g.outcome {
                Outcome::Changed => t.changed += 1,
                Outcome::BindingError | Outcome::Failed | Outcome::Aborted => t.errors += 1,
                Outcome::LeaseHeld => t.lease_held += 1,
                Outcome::BackingOff => t.backing_off += 1,
                Outcome::Deferred => t.deferred += 1,
                Outcome::Released => t.released += 1,
                Outcome::InSync | Outcome::Planned => {}
            }
        }
        self.totals = t;
        self.duration_ms = now.0.saturating_sub(self.started_at.0);
        self
    }

    /// The report for one group ARN, if present.
    pub fn group(&self, arn: &str) -> Option<&GroupReport> {
        self.groups.iter().find(|g| g.target_group_arn == arn)
    }
}
