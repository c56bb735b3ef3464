//! The JSON report every function returns: what changed, per group, in words an operator
//! can act on. Targets appear as `ip:port`.

use serde::{Deserialize, Deserializer, Serialize};

use crate::core::{AdministrativeOverride, Plan, RolloutCheck, Target, TargetHealth, UnixMillis};

/// How one group's reconcile ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
    /// unless only registrations wait target by target (`waiting`: targets ELBv2 refused
    /// for themselves, or a full group's targets beyond its capacity): those are tried
    /// again on their own, and the group does not back off.
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

/// A registration held back, its pod, why and until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitingTarget {
    /// The target.
    pub target: Target,
    /// Its pod (`namespace/name`).
    pub pod: String,
    /// Why it waits: ELBv2's code and message for a target refused for itself, or the
    /// full group's capacity.
    pub reason: String,
    /// When it is tried again (unix ms).
    pub retry_at: UnixMillis,
}

/// A target a call failed for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailedTarget {
    /// The target.
    pub target: Target,
    /// `register` or `deregister`.
    #[serde(deserialize_with = "operation")]
    pub operation: Name,
    /// The error.
    pub error: String,
}

/// A registered target the load balancer does not use (`unused`: its group has no load
/// balancer or listener, its zone is not enabled, it is in an invalid state) or whose
/// health it cannot tell (`unavailable`), with ELBv2's words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodError {
    /// `namespace/name`.
    pub pod: String,
    /// What is wrong.
    pub error: String,
    /// The pod's address, when it is one ELBv2 never takes (never sent; counted in the
    /// `UnusableAddresses` metric).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unusable_address: Option<String>,
}

/// One group's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupReport {
    /// Target group ARN.
    pub target_group_arn: String,
    /// Target group name.
    pub name: String,
    /// The AWS account that owns the group (from its ARN): with target account roles, a
    /// deployment serves groups of several accounts, and an operator must know where to
    /// look.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub account: String,
    /// How it ended.
    pub outcome: Outcome,
    /// Targets registered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub registered: Vec<Target>,
    /// Targets deregistered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deregistered: Vec<Target>,
    /// Ledger rows dropped because their target was removed by hand.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forgotten: Vec<Target>,
    /// Targets tgsync did not register and left in place (shared mode).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub foreign_kept: Vec<Target>,
    /// Dry run only: what a real run would do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    /// Targets whose register/deregister call failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_targets: Vec<FailedTarget>,
    /// Registrations held back target by target (the group does not back off for them):
    /// targets ELBv2 refused for themselves, each backing off alone, and targets a full
    /// group has no room for until its next probe.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<WaitingTarget>,
    /// Gated pods whose `tgsync/target-health` condition was set True (`namespace/name`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gates_opened: Vec<String>,
    /// Pods that should be targets but cannot be.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_errors: Vec<PodError>,
    /// Registered targets that get no traffic (`unused`) or whose health is unknown
    /// (`unavailable`), from the last health read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unused_targets: Vec<UnusedTarget>,
    /// Registered targets under an administrative override (zonal shift), from the last
    /// health read: never deregistered for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub administrative_overrides: Vec<OverriddenTarget>,
    /// Number of desired targets after the last pass.
    pub desired: usize,
    /// The error that stopped or failed this group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When a backing-off group will be tried again (unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<UnixMillis>,
    /// `leaseHeld`: until when the holder's lease lasts unless renewed (unix ms); a
    /// holder that died frees the group then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<UnixMillis>,
    /// Reconcile passes run under the lease (more than one when asked to run again).
    pub passes: u32,
    /// True when the desired set was unchanged and verified recently, so target health
    /// was not read this run (the checkpoint).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verification_skipped: bool,
    /// When the pass's first ELBv2 change was answered (reaction latency; not part of
    /// the JSON report).
    #[serde(skip)]
    pub applied_at: Option<UnixMillis>,
    /// Targets registered in the group after the pass (not draining), when it read
    /// target health.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registered_targets: Option<usize>,
    /// Of them, those healthy at the pass's health read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healthy_targets: Option<usize>,
    /// The rollout check: whether the pods' termination covers tgsync's deregistration
    /// latency and the load balancer's propagation, and whether they carry the
    /// readiness gate, with the numbers it used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutCheck>,
}

impl GroupReport {
    /// An empty report for a group, to be filled in.
    pub fn new(arn: &str, name: &str, outcome: Outcome) -> Self {
        Self {
            target_group_arn: arn.to_owned(),
            name: name.to_owned(),
            account: crate::core::arn::arn_account(arn)
                .unwrap_or_default()
                .to_owned(),
            outcome,
            registered: Vec::new(),
            deregistered: Vec::new(),
            forgotten: Vec::new(),
            foreign_kept: Vec::new(),
            plan: None,
            failed_targets: Vec::new(),
            waiting: Vec::new(),
            gates_opened: Vec::new(),
            pod_errors: Vec::new(),
            unused_targets: Vec::new(),
            administrative_overrides: Vec::new(),
            desired: 0,
            error: None,
            next_attempt_at: None,
            lease_until: None,
            passes: 0,
            verification_skipped: false,
            applied_at: None,
            registered_targets: None,
            healthy_targets: None,
            rollout: None,
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// ELBv2's push-back: answers that throttled, and attempts that were retries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ElbPressure {
    /// Throttled answers.
    pub throttles: u64,
    /// Retried attempts (after throttling, a 5xx or a transport failure).
    pub retries: u64,
}

impl ElbPressure {
    /// What happened between `self` (earlier) and `later`.
    pub fn since(self, later: Self) -> Self {
        Self {
            throttles: later.throttles.saturating_sub(self.throttles),
            retries: later.retries.saturating_sub(self.retries),
        }
    }
}

/// What a watch did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Watches resumed from a store's version without a LIST (at the start of an
    /// invocation, or after the connection broke).
    pub resumed: u64,
    /// LISTs of a namespace: a cold start, a namespace newly bound, a 410 Gone, a changed
    /// selection, or the relist period.
    pub relisted: u64,
    /// Pod objects those LISTs returned (0 when every store was warm).
    pub listed_pods: u64,
    /// Pods held in the watch's stores when the run ended: the container's memory
    /// grows with them.
    #[serde(default)]
    pub stored_pods: u64,
    /// Targets registered.
    pub registered: usize,
    /// Targets deregistered.
    pub deregistered: usize,
    /// Readiness gates opened (`namespace/name`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gates_opened: Vec<String>,
    /// Group reports of the passes that changed something or failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<GroupReport>,
    /// Errors of the watch itself (a namespace that could not be watched).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// The whole run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Which function produced it (`resync`, `pod-events` or `manual`).
    #[serde(deserialize_with = "function")]
    pub function: Name,
    /// The tgsync release that produced it (the crate version), so a report says which
    /// code made its decisions. A report read back from another release says `other`.
    #[serde(deserialize_with = "version", default = "unknown_version")]
    pub version: Name,
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
    /// ELBv2's push-back during the run: throttled answers and retried attempts.
    #[serde(default)]
    pub elb: ElbPressure,
    /// Full resyncs (the runs that look): groups no longer bound that still hold this
    /// cluster's targets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orphans: Option<Vec<Orphan>>,
    /// Errors not tied to one group (discovery failed, an unknown ARN requested).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Notes about the input (e.g. why an event was ignored).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Groups whose requests the run could not serve before it ended (a pod change, or
    /// what a one-shot run was asked for that failed, was deferred or backs off), handed
    /// on to the next run: their `dirty` flags set and the cluster index's record of
    /// requests, which the next scheduled run serves first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handed_on: Vec<String>,
}

/// A name the code gives (a function, an operation). Spelt as an alias so that serde's
/// derive does not borrow it from the input: it is read back as one of the known names.
pub type Name = &'static str;

/// A report's `function` read back (the CLI reads the manual function's reports): one
/// of the functions' names, `other` for anything else.
fn function<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    Ok(match String::deserialize(d)?.as_str() {
        "resync" => "resync",
        "pod-events" => "pod-events",
        "manual" => "manual",
        _ => "other",
    })
}

/// A failed target's `operation` read back.
/// A report's `version` read back: this release's, or `other`.
fn version<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    let v = String::deserialize(d)?;
    Ok(if v == env!("CARGO_PKG_VERSION") {
        env!("CARGO_PKG_VERSION")
    } else {
        "other"
    })
}

fn unknown_version() -> &'static str {
    "other"
}

fn operation<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    Ok(match String::deserialize(d)?.as_str() {
        "register" => "register",
        "deregister" => "deregister",
        _ => "other",
    })
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
            version: env!("CARGO_PKG_VERSION"),
            cluster: cluster.to_owned(),
            dry_run,
            started_at,
            duration_ms: 0,
            totals: Totals::default(),
            verification: None,
            watch: None,
            groups: Vec::new(),
            elb: ElbPressure::default(),
            orphans: None,
            errors: Vec::new(),
            notes: Vec::new(),
            handed_on: Vec::new(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An operator reading a report (or a log of one) can tell which release made it.
    #[test]
    fn every_report_names_the_release() {
        let report = Report::new("resync", "demo", false, UnixMillis(1)).finish(UnixMillis(2));
        let json = serde_json::to_value(&report).expect("a report is JSON");
        assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
    }
}

#[cfg(test)]
mod read_back_tests {
    use super::*;

    /// The CLI reads the manual function's reports back: every field survives the trip,
    /// the lists left out when empty included.
    #[test]
    fn a_report_reads_back_as_it_was_written() {
        let t = |s: &str| s.parse::<Target>().unwrap();
        let mut r = Report::new("manual", "demo", true, UnixMillis(1_800_000_000_000));
        let mut g = GroupReport::new(
            "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/web/0123456789abcdef",
            "web",
            Outcome::Planned,
        );
        g.plan = Some(Plan {
            register: vec![t("10.0.1.1:8080")],
            foreign_kept: vec![t("10.0.9.9:8080")],
            ..Plan::default()
        });
        g.failed_targets.push(FailedTarget {
            target: t("10.0.1.2:8080"),
            operation: "deregister",
            error: "refused".into(),
        });
        g.desired = 1;
        r.groups.push(g);
        r.groups.push(GroupReport::with_error(
            "arn:b",
            "broken",
            Outcome::BindingError,
            "tag missing",
        ));
        r.orphans = Some(vec![]);
        let r = r.finish(UnixMillis(1_800_000_000_100));
        let back: Report = serde_json::from_value(serde_json::to_value(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        let other: Report = serde_json::from_value(serde_json::json!({
            "function": "elsewhere", "cluster": "c", "dryRun": false, "startedAt": 1,
            "durationMs": 2, "totals": Totals::default(), "groups": [],
        }))
        .unwrap();
        assert_eq!(other.function, "other");
    }
}
