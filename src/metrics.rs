//! CloudWatch Embedded Metric Format (dimensions `Function` and `Cluster`, plus
//! `TargetGroup` on per-group metrics, whose lines also carry the group's ARN and
//! `Account` as properties), printed straight to stdout (Lambda ships stdout to
//! CloudWatch Logs, which extracts the metrics; no PutMetricData calls, no extra
//! latency):
//!
//! - **one line per pass, as it ends** ([`pass_lines`]): a pass that changed or failed a
//!   group, found its lease held, waited for backoff, or acted on a pod change. Its
//!   counts (`Registered`, `Deregistered`, `ReconcileErrors`, …, and `ReactionLatency`)
//!   go to the function-level metrics, so those count every pass — the full diff's, the
//!   watch's, pod-events' — when it happens, not when the invocation ends; a group that
//!   changed or failed also gets its per-group metrics (`DesiredTargets`,
//!   `RegisteredTargets`, `HealthyTargets`, …) on the same line;
//! - one line per opened readiness gate ([`gate_lines`]: `GateLatency`);
//! - one line per run ([`emf_lines`]): the heartbeat, the run's duration and run-level
//!   errors, ELBv2 throttles and retries, whether the controller watched, and (full
//!   diffs) the orphan gauge.
//!
//! Per-group metrics are emitted only for groups with something to say, so a
//! steady-state fleet of 1,000 groups adds no per-group metrics (each dimension value is
//! a billed custom metric); the group's name stays searchable as a property in Logs
//! Insights.
//!
//! **Every line reaches CloudWatch, at every log level.** With JSON logs and an
//! application log level (the template's `LogLevel`), Lambda drops every line whose
//! `level` is below the configured one, counts a line without a valid `level` as INFO,
//! and a line without a valid RFC 3339 `timestamp` as INFO too (Lambda developer guide,
//! "Log-level filtering"). An EMF line without them would vanish at WARN, ERROR or FATAL
//! and every alarm on these metrics would go quiet. So each line carries a `timestamp`
//! and a `level` that passes the filter: see [`emf_level`]. Both are extra root members,
//! which the EMF specification allows; the `_aws` block is untouched.
//!
//! **Dry runs emit nothing.** A dry run is a manual look at a plan: its counts are what a
//! run *would* do, and in the production namespace and dimensions they would feed the
//! alarms and dashboards (a planned registration counted as drift found). A separate
//! namespace would be custom metrics nobody reads; the dry-run report returned to the
//! caller already holds everything.

use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::core::UnixMillis;
use crate::logging::{LambdaLevel, rfc3339};
use crate::report::{GroupReport, Outcome, Report};

/// CloudWatch namespace of every tgsync metric.
pub const NAMESPACE: &str = "tgsync";

/// The `level` of the metric lines, given the application log level Lambda filters at
/// (`AWS_LAMBDA_LOG_LEVEL`). Lambda passes a line whose level is at or above the
/// configured one, so the line takes the configured level when that is above INFO
/// (WARN, ERROR, FATAL: exactly the least severe level that still passes), and INFO
/// otherwise (what these lines are: routine records, which pass at TRACE, DEBUG, INFO
/// and when no level is configured). Not always FATAL, which would also pass: then every
/// run would put a FATAL line in the log, tripping any alert or Logs Insights query on
/// fatal errors when nothing is wrong.
pub fn emf_level(configured: Option<LambdaLevel>) -> LambdaLevel {
    match configured {
        Some(level) if level > LambdaLevel::Info => level,
        _ => LambdaLevel::Info,
    }
}

/// The run lines of a finished report, labelled `level` (see [`emf_level`]): the
/// heartbeat line and, for full diffs, the orphan gauge. Group counts are not here:
/// each pass reported its own as it ended ([`pass_lines`]). Pure, so it is tested
/// without stdout. None for a dry run (see the module docs).
pub fn emf_lines(report: &Report, level: LambdaLevel) -> Vec<String> {
    if report.dry_run {
        return Vec::new();
    }
    let t = &report.totals;
    let at = report.started_at.0 + report.duration_ms;
    let mut run = vec![
        ("GroupsReconciled", json!(t.groups)),
        // Run-level errors (an account that could not be read, a requested group that
        // is not bound); each failing group counts on its own pass line.
        ("ReconcileErrors", json!(report.errors.len())),
        ("Duration", json!(report.duration_ms)),
        // The heartbeat: one per finished run. A run that crashes, times out or is
        // never invoked writes none, and the heartbeat alarm sees the gap.
        ("RunsCompleted", json!(1)),
        ("ElbThrottles", json!(report.elb.throttles)),
        ("ElbRetries", json!(report.elb.retries)),
    ];
    if let Some(watch) = &report.watch {
        // The controller watched during this run, and for how long: the watch alarm
        // compares the watched time of a period with what the schedule and
        // WatchSeconds make it (template.yaml, WatchNotRunningAlarm).
        run.push(("WatchRunning", json!(1)));
        run.push(("WatchedSeconds", json!(watch.watched_ms as f64 / 1000.0)));
        // What the container's memory grows with, beside the sizes the README gives.
        run.push(("WatchedPods", json!(watch.stored_pods)));
    }
    let mut lines = vec![line(
        report.function,
        &report.cluster,
        at,
        level,
        &[&["Function", "Cluster"]],
        run,
    )];
    if report.orphans.is_some() {
        // A gauge of groups no longer bound whose ledger still holds our targets, from
        // the runs that look for them (full resyncs) only, so that its minimum and
        // average mean something.
        lines.push(line(
            report.function,
            &report.cluster,
            at,
            level,
            &[&["Function", "Cluster"]],
            [("OrphanedGroups", json!(t.orphaned))],
        ));
    }
    lines
}

/// A pass as it ends: the group's report, and what the engine knows beside it.
#[derive(Debug, Clone, Copy)]
pub struct PassDone<'a> {
    /// The function that ran it (`resync`, `pod-events`, `manual`).
    pub function: &'a str,
    /// The cluster this deployment serves.
    pub cluster: &'a str,
    /// The group's report.
    pub report: &'a GroupReport,
    /// A dry run's pass changes nothing and is not counted.
    pub dry_run: bool,
    /// For a pass a pod change asked for: from the change seen to its first ELBv2 call
    /// answered.
    pub reaction: Option<Duration>,
    /// When it ended (unix ms).
    pub at: UnixMillis,
}

/// The EMF line of one pass (see the module docs); none when it has nothing to count.
pub fn pass_lines(pass: &PassDone<'_>, level: LambdaLevel) -> Vec<String> {
    let g = pass.report;
    let held = g.outcome == Outcome::LeaseHeld;
    let unusable = g
        .pod_errors
        .iter()
        .filter(|e| e.unusable_address.is_some())
        .count();
    if pass.dry_run || !(g.is_eventful() || held || pass.reaction.is_some() || unusable > 0) {
        return Vec::new();
    }
    let failed = g.outcome.is_error();
    let mut fields = vec![
        ("DriftFound", json!(u8::from(g.outcome == Outcome::Changed))),
        ("Registered", json!(g.registered.len())),
        ("Deregistered", json!(g.deregistered.len())),
        ("Forgotten", json!(g.forgotten.len())),
        // A group backing off is still failing: counting it keeps the errors alarm from
        // clearing between its attempts.
        ("ReconcileErrors", json!(u8::from(failed))),
        ("LeaseHeld", json!(u8::from(held))),
        (
            "BackingOff",
            json!(u8::from(g.outcome == Outcome::BackingOff)),
        ),
    ];
    if unusable > 0 {
        // Pods whose address ELBv2 never takes (never sent): their network is wrong.
        fields.push(("UnusableAddresses", json!(unusable)));
    }
    if let Some(short) = g.rollout.as_ref().map(|r| r.too_short).filter(|n| *n > 0) {
        // The group's pods whose termination does not cover tgsync's deregistration
        // latency plus the load balancer's propagation (the rollout check): on the line
        // of a pass that writes one anyway (a change, a reaction, a failure), so a quiet
        // run stays quiet and a rollout, whose passes always write one, shows it.
        fields.push(("TerminationTooShort", json!(short)));
    }
    if !g.waiting.is_empty() {
        // Registrations held back target by target (refused targets, a full group):
        // the group does not back off for them, so BackingOff does not count them.
        fields.push(("WaitingTargets", json!(g.waiting.len())));
    }
    if let Some(reaction) = pass.reaction {
        fields.push((
            "ReactionLatency",
            json!(u64::try_from(reaction.as_millis()).unwrap_or(u64::MAX)),
        ));
    }
    let mut dimensions: Vec<&[&str]> = vec![&["Function", "Cluster"]];
    if g.is_eventful() {
        // A property, not a dimension: the ARN already tells groups apart, and each
        // dimension value would be one more billed custom metric.
        fields.push(("TargetGroup", json!(g.name)));
        fields.push(("TargetGroupArn", json!(g.target_group_arn)));
        fields.push(("Account", json!(g.account)));
        fields.push((
            "Outcome",
            serde_json::to_value(g.outcome).unwrap_or(Value::Null),
        ));
        fields.push(("DesiredTargets", json!(g.desired)));
        if let Some(n) = g.registered_targets {
            fields.push(("RegisteredTargets", json!(n)));
        }
        if let Some(n) = g.healthy_targets {
            fields.push(("HealthyTargets", json!(n)));
        }
        dimensions.push(&["Function", "Cluster", "TargetGroup"]);
    }
    vec![line(
        pass.function,
        pass.cluster,
        pass.at.0,
        level,
        &dimensions,
        fields,
    )]
}

/// The EMF line of one readiness gate opened `latency` after the target was first seen
/// healthy.
pub fn gate_lines(
    function: &str,
    cluster: &str,
    at: UnixMillis,
    latency: Duration,
    level: LambdaLevel,
) -> Vec<String> {
    vec![line(
        function,
        cluster,
        at.0,
        level,
        &[&["Function", "Cluster"]],
        [(
            "GateLatency",
            json!(u64::try_from(latency.as_millis()).unwrap_or(u64::MAX)),
        )],
    )]
}

/// Prints the run lines of `report` to stdout, at the level the function's log filter
/// lets through.
pub fn emit(report: &Report) {
    for l in emf_lines(report, emf_level(LambdaLevel::configured())) {
        println!("{l}");
    }
}

/// Writes what a pass that ended says: its metric line to stdout, and one log line for
/// a group that changed (INFO) or is failing (WARN, with its error) — none for a group
/// in sync, so a quiet run costs one summary line however many groups it looked at.
pub fn emit_pass(pass: &PassDone<'_>) {
    let level = emf_level(LambdaLevel::configured());
    for l in pass_lines(pass, level) {
        println!("{l}");
    }
    if !pass.dry_run {
        log_pass(pass);
    }
}

/// The log lines of a pass (see [`emit_pass`]); a group holding registered targets that
/// get no traffic (`unused`, `unavailable`) also gets a WARN line naming the first with
/// ELBv2's reason.
fn log_pass(pass: &PassDone<'_>) {
    let g = pass.report;
    if let Some(first) = g.unused_targets.first() {
        tracing::warn!(
            target_group = %g.name,
            account = %g.account,
            unused_targets = g.unused_targets.len(),
            first = %format_args!(
                "{} {} ({})",
                first.target,
                first.state,
                first.reason.as_deref().unwrap_or("no reason given")
            ),
            administrative_overrides = g.administrative_overrides.len(),
            "registered targets get no traffic; see unusedTargets in the report"
        );
    }
    if !matches!(g.outcome, Outcome::Changed | Outcome::Released) && !g.outcome.is_error() {
        return;
    }
    let outcome = serde_json::to_value(g.outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    if g.outcome.is_error() {
        tracing::warn!(
            target_group = %g.name,
            account = %g.account,
            outcome = %outcome,
            error = g.error.as_deref().unwrap_or(""),
            failed_targets = g.failed_targets.len(),
            "target group not reconciled"
        );
    } else {
        tracing::info!(
            target_group = %g.name,
            account = %g.account,
            registered = g.registered.len(),
            deregistered = g.deregistered.len(),
            forgotten = g.forgotten.len(),
            reaction_ms = pass.reaction.map(|r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX)),
            "target group changed"
        );
    }
}

/// Where the engine tells what its passes did as they end: printed lines in the
/// functions ([`Printed`]), something to look at in tests.
pub trait Sink: Send + Sync {
    /// A pass ended.
    fn pass(&self, pass: &PassDone<'_>);
    /// A readiness gate was opened `latency` after its target was first seen healthy.
    fn gate(&self, function: &str, cluster: &str, at: UnixMillis, latency: Duration);
}

/// The functions' sink: the log and metric lines on stdout/stderr ([`emit_pass`],
/// [`emit_gate`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Printed;

impl Sink for Printed {
    fn pass(&self, pass: &PassDone<'_>) {
        emit_pass(pass);
    }

    fn gate(&self, function: &str, cluster: &str, at: UnixMillis, latency: Duration) {
        emit_gate(function, cluster, at, latency);
    }
}

/// Writes the metric line of an opened gate.
pub fn emit_gate(function: &str, cluster: &str, at: UnixMillis, latency: Duration) {
    for l in gate_lines(
        function,
        cluster,
        at,
        latency,
        emf_level(LambdaLevel::configured()),
    ) {
        println!("{l}");
    }
}

/// Every metric tgsync emits and its unit; a line declares those among its fields (each
/// in the directives whose dimensions it is meant for, see [`per_group`]).
const UNITS: [(&str, &str); 24] = [
    ("DriftFound", "Count"),
    ("Registered", "Count"),
    ("Deregistered", "Count"),
    ("ReconcileErrors", "Count"),
    ("GroupsReconciled", "Count"),
    ("Forgotten", "Count"),
    ("LeaseHeld", "Count"),
    ("BackingOff", "Count"),
    ("Duration", "Milliseconds"),
    ("RunsCompleted", "Count"),
    ("OrphanedGroups", "Count"),
    ("ReactionLatency", "Milliseconds"),
    ("GateLatency", "Milliseconds"),
    ("ElbThrottles", "Count"),
    ("ElbRetries", "Count"),
    ("WatchRunning", "Count"),
    ("WatchedSeconds", "Seconds"),
    ("WatchedPods", "Count"),
    ("DesiredTargets", "Count"),
    ("RegisteredTargets", "Count"),
    ("HealthyTargets", "Count"),
    ("UnusableAddresses", "Count"),
    ("WaitingTargets", "Count"),
    ("TerminationTooShort", "Count"),
];

/// Which metrics a directive with the `TargetGroup` dimension carries (the per-group
/// ones), and which the function-level directive does.
fn per_group(metric: &str, group_level: bool) -> bool {
    const GROUP_ONLY: [&str; 3] = ["DesiredTargets", "RegisteredTargets", "HealthyTargets"];
    const BOTH: [&str; 4] = [
        "DriftFound",
        "Registered",
        "Deregistered",
        "ReconcileErrors",
    ];
    if group_level {
        GROUP_ONLY.contains(&metric) || BOTH.contains(&metric)
    } else {
        !GROUP_ONLY.contains(&metric)
    }
}

/// One EMF line: `Function` and `Cluster`, then `fields`, with one directive per
/// dimension set (each declaring the metrics meant for it).
fn line(
    function: &str,
    cluster: &str,
    at: u64,
    level: LambdaLevel,
    dimensions: &[&[&str]],
    fields: impl IntoIterator<Item = (&'static str, Value)>,
) -> String {
    let mut fields: Map<String, Value> =
        [("Function", json!(function)), ("Cluster", json!(cluster))]
            .into_iter()
            .chain(fields)
            .map(|(name, value)| (name.to_owned(), value))
            .collect();
    let directives: Vec<Value> = dimensions
        .iter()
        .map(|dims| {
            let group_level = dims.contains(&"TargetGroup");
            let metrics: Vec<Value> = UNITS
                .iter()
                .filter(|(name, _)| fields.contains_key(*name) && per_group(name, group_level))
                .map(|(name, unit)| json!({"Name": name, "Unit": unit}))
                .collect();
            json!({
                "Namespace": NAMESPACE,
                "Dimensions": [dims],
                "Metrics": metrics,
            })
        })
        .collect();
    fields.insert("level".to_owned(), json!(level.as_str()));
    fields.insert("timestamp".to_owned(), json!(rfc3339(at)));
    fields.insert(
        "_aws".to_owned(),
        json!({
            "Timestamp": at,
            "CloudWatchMetrics": directives,
        }),
    );
    Value::Object(fields).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::GroupReport;

    const AT: UnixMillis = UnixMillis(1_800_000_000_250);

    fn report() -> Report {
        let mut r = Report::new("resync", "demo", false, UnixMillis(1_800_000_000_000));
        r.errors
            .push("account 222222222222: discovering target groups failed".into());
        r.elb = crate::report::ElbPressure {
            throttles: 3,
            retries: 4,
        };
        r.groups
            .push(GroupReport::new("arn:b", "quiet", Outcome::InSync));
        r.finish(AT)
    }

    fn pass(report: &GroupReport) -> PassDone<'_> {
        PassDone {
            function: "resync",
            cluster: "demo",
            report,
            dry_run: false,
            reaction: None,
            at: AT,
        }
    }

    fn parsed(lines: Vec<String>) -> Vec<Value> {
        lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The metrics each directive of `line` declares, by its dimension set.
    fn declared(line: &Value) -> Vec<(Vec<String>, Vec<String>)> {
        line["_aws"]["CloudWatchMetrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                let dims = d["Dimensions"][0]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_str().unwrap().to_owned())
                    .collect();
                let metrics = d["Metrics"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["Name"].as_str().unwrap().to_owned())
                    .collect();
                (dims, metrics)
            })
            .collect()
    }

    #[test]
    fn the_run_line_is_the_heartbeat_with_run_errors_and_elbv2_pressure() {
        let lines = parsed(emf_lines(&report(), LambdaLevel::Info));
        assert_eq!(lines.len(), 1, "an in-sync group emits nothing");
        let run = &lines[0];
        assert_eq!(run["_aws"]["CloudWatchMetrics"][0]["Namespace"], "tgsync");
        assert_eq!(
            run["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["Function", "Cluster"]])
        );
        assert_eq!(
            (run["Cluster"].as_str(), run["Function"].as_str()),
            (Some("demo"), Some("resync"))
        );
        assert_eq!(run["ReconcileErrors"], 1, "the run-level error");
        assert_eq!(
            (run["ElbThrottles"].as_u64(), run["ElbRetries"].as_u64()),
            (Some(3), Some(4))
        );
        assert_eq!(run["Duration"], 250);
        assert_eq!(run["RunsCompleted"], 1, "the heartbeat");
        assert!(run.get("WatchRunning").is_none(), "no watch in this run");
        assert_eq!(run["_aws"]["Timestamp"], 1_800_000_000_250u64);
        for m in run["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
        {
            assert!(run[m["Name"].as_str().unwrap()].is_number(), "{m}");
        }
        assert!(run.get("WatchedPods").is_none(), "no stores in this run");
        assert!(
            run.get("WatchedSeconds").is_none(),
            "no watched time in this run"
        );
        let mut watching = report();
        watching.watch = Some(crate::report::WatchReport {
            stored_pods: 12_345,
            watched_ms: 55_250,
            ..Default::default()
        });
        let run = &parsed(emf_lines(&watching, LambdaLevel::Info))[0];
        assert_eq!(run["WatchRunning"], 1);
        assert_eq!(run["WatchedSeconds"], 55.25, "how long it watched");
        assert_eq!(run["WatchedPods"], 12_345, "the pods its stores hold");
        let (_, metrics) = &declared(run)[0];
        for m in ["WatchedPods", "WatchedSeconds"] {
            assert!(metrics.iter().any(|n| n == m), "{m}: {metrics:?}");
        }
    }

    /// The rollout check's count of pods whose termination is too short rides on the
    /// line of a pass that writes one (a change, a reaction), at the function level; a
    /// pass in sync writes no line for it.
    #[test]
    fn pods_terminating_too_soon_are_counted_on_the_passs_line() {
        let pods = [crate::core::PodFacts::from_pod(
            crate::testkit::PodBuilder::new("shop", "web-1")
                .ip("10.0.1.1")
                .build(),
        )];
        let group = crate::core::rollout::GroupAttributes {
            protocol: Some("TCP".into()),
            ..Default::default()
        };
        let rollout = crate::core::rollout::check(
            &pods,
            crate::core::rollout::Latency::watch(),
            Ok(&group),
            crate::core::rollout::Allowances::default(),
            false,
        );
        assert_eq!(rollout.too_short, 1);
        let mut changed = GroupReport::new("arn:a", "web", Outcome::Changed);
        changed.rollout = Some(rollout.clone());
        let lines = parsed(pass_lines(&pass(&changed), LambdaLevel::Info));
        assert_eq!(lines[0]["TerminationTooShort"], 1);
        let directives = declared(&lines[0]);
        assert!(directives[0].1.iter().any(|m| m == "TerminationTooShort"));
        assert!(!directives[1].1.iter().any(|m| m == "TerminationTooShort"));
        let mut quiet = GroupReport::new("arn:a", "web", Outcome::InSync);
        quiet.rollout = Some(rollout);
        assert!(pass_lines(&pass(&quiet), LambdaLevel::Info).is_empty());
    }

    /// A pass that changed a group counts at the function level and, with the group's
    /// own numbers, at the group level; one in sync counts nothing.
    #[test]
    fn a_changed_pass_counts_for_the_function_and_its_group() {
        let mut changed = GroupReport::new("arn:a", "web", Outcome::Changed);
        changed.registered = vec![
            "10.0.0.1:80".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        ];
        changed.desired = 3;
        changed.registered_targets = Some(3);
        changed.healthy_targets = Some(1);
        let mut p = pass(&changed);
        p.reaction = Some(Duration::from_millis(420));
        let lines = parsed(pass_lines(&p, LambdaLevel::Info));
        assert_eq!(lines.len(), 1);
        let l = &lines[0];
        assert_eq!(
            (l["Registered"].as_u64(), l["DriftFound"].as_u64()),
            (Some(2), Some(1))
        );
        assert_eq!(l["ReactionLatency"], 420);
        assert_eq!(l["TargetGroup"], "web");
        let directives = declared(l);
        let function = &directives[0];
        assert_eq!(function.0, ["Function", "Cluster"]);
        assert!(function.1.contains(&"ReactionLatency".to_owned()));
        assert!(
            !function.1.contains(&"DesiredTargets".to_owned()),
            "per group only"
        );
        let group = &directives[1];
        assert_eq!(group.0, ["Function", "Cluster", "TargetGroup"]);
        for m in [
            "DesiredTargets",
            "RegisteredTargets",
            "HealthyTargets",
            "Registered",
        ] {
            assert!(group.1.contains(&m.to_owned()), "{m}");
        }
        assert!(!group.1.contains(&"ReactionLatency".to_owned()));
        for (_, metrics) in &directives {
            for m in metrics {
                assert!(l[m.as_str()].is_number(), "{m} declared without a value");
            }
        }
        let quiet = GroupReport::new("arn:b", "quiet", Outcome::InSync);
        assert!(pass_lines(&pass(&quiet), LambdaLevel::Info).is_empty());
    }

    /// A group still backing off is still failing: the errors alarm must not clear
    /// while it waits for its next attempt.
    #[test]
    fn groups_in_backoff_count_as_reconcile_errors() {
        let waiting = GroupReport::new("arn:a", "web", Outcome::BackingOff);
        let lines = parsed(pass_lines(&pass(&waiting), LambdaLevel::Info));
        assert_eq!(lines[0]["ReconcileErrors"], 1, "{:?}", lines[0]);
        assert_eq!(lines[0]["BackingOff"], 1);
        // A lease found held counts at the function level only (no per-group metric).
        let held = GroupReport::new("arn:a", "web", Outcome::LeaseHeld);
        let lines = parsed(pass_lines(&pass(&held), LambdaLevel::Info));
        assert_eq!(lines[0]["LeaseHeld"], 1);
        assert_eq!(declared(&lines[0]).len(), 1);
        assert!(lines[0].get("TargetGroup").is_none());
    }

    /// A deployment serving several accounts names each group's account on its line, as
    /// a property (searchable in Logs Insights) and not as a dimension (no new metrics).
    #[test]
    fn group_lines_name_the_account_as_a_property() {
        let arn =
            "arn:aws:elasticloadbalancing:us-east-1:222222222222:targetgroup/web/0123456789abcdef";
        let failed = GroupReport::with_error(arn, "web", Outcome::Failed, "boom");
        let lines = parsed(pass_lines(&pass(&failed), LambdaLevel::Info));
        assert_eq!(lines[0]["Account"], "222222222222");
        assert_eq!(lines[0]["TargetGroupArn"], arn);
        assert_eq!(
            lines[0]["_aws"]["CloudWatchMetrics"][1]["Dimensions"],
            json!([["Function", "Cluster", "TargetGroup"]])
        );
        let run = parsed(emf_lines(&report(), LambdaLevel::Info));
        assert!(run[0].get("Account").is_none(), "not on the run line");
    }

    /// A group whose registered targets get no traffic is worth a WARN line naming the
    /// first and ELBv2's reason; a group in sync with none is worth nothing.
    #[test]
    fn a_group_whose_targets_get_no_traffic_gets_a_warning_naming_the_reason() {
        use crate::core::{HealthState, TargetHealth};
        let capture = crate::testkit::LogCapture::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(capture.clone())
            .with_ansi(false)
            .finish();
        let mut quiet = GroupReport::new("arn:a", "quiet", Outcome::InSync);
        let mut idle = GroupReport::new("arn:b", "idle", Outcome::InSync);
        let health = [
            TargetHealth::new("10.0.1.1:80".parse().unwrap(), HealthState::Unused)
                .with_reason("Target.NotInUse", None),
        ];
        quiet.note_health(&[]);
        idle.note_health(&health);
        tracing::subscriber::with_default(subscriber, || {
            log_pass(&pass(&quiet));
            log_pass(&pass(&idle));
        });
        let lines = capture.take();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("WARN"), "{lines:?}");
        assert!(lines[0].contains("target_group=idle"), "{lines:?}");
        assert!(
            lines[0].contains("10.0.1.1:80 unused (Target.NotInUse)"),
            "{lines:?}"
        );
    }

    /// Lambda drops a JSON line below its application log level, and counts a line
    /// without `level` (or without a valid timestamp) as INFO: at WARN, ERROR and FATAL
    /// the metric lines must still get through, with the EMF block intact.
    #[test]
    fn metric_lines_pass_every_lambda_log_level() {
        use LambdaLevel::*;
        let changed = GroupReport::new("arn:a", "web", Outcome::Changed);
        for (configured, want) in [
            (None, Info),
            (Some(Trace), Info),
            (Some(Debug), Info),
            (Some(Info), Info),
            (Some(Warn), Warn),
            (Some(Error), Error),
            (Some(Fatal), Fatal),
        ] {
            let level = emf_level(configured);
            assert_eq!(level, want, "{configured:?}");
            // What Lambda lets through at `configured`: lines at or above it.
            assert!(level >= configured.unwrap_or(Info), "{configured:?}");
            let mut lines = emf_lines(&report(), level);
            lines.extend(pass_lines(&pass(&changed), level));
            lines.extend(gate_lines(
                "resync",
                "demo",
                AT,
                Duration::from_millis(900),
                level,
            ));
            assert_eq!(lines.len(), 3, "{configured:?}");
            for l in &lines {
                let v: Value = serde_json::from_str(l).unwrap();
                assert_eq!(v["level"], want.as_str(), "{l}");
                let ts = v["timestamp"].as_str().expect("timestamp");
                let parsed = aws_smithy_types::DateTime::from_str(
                    ts,
                    aws_smithy_types::date_time::Format::DateTime,
                )
                .unwrap_or_else(|e| panic!("{ts}: {e}"));
                assert_eq!(parsed.to_millis().unwrap(), 1_800_000_000_250, "{ts}");
                assert_eq!(v["_aws"]["Timestamp"], 1_800_000_000_250u64);
                for directive in v["_aws"]["CloudWatchMetrics"].as_array().unwrap() {
                    assert_eq!(directive["Namespace"], NAMESPACE);
                    for m in directive["Metrics"].as_array().unwrap() {
                        assert!(v[m["Name"].as_str().unwrap()].is_number(), "{m} in {l}");
                    }
                    for d in directive["Dimensions"][0].as_array().unwrap() {
                        assert!(v[d.as_str().unwrap()].is_string(), "{d} in {l}");
                    }
                }
            }
        }
    }

    /// A dry run's counts are what a run would do: they must not reach the metrics the
    /// alarms read.
    #[test]
    fn dry_runs_emit_no_metrics() {
        let mut r = Report::new("resync", "demo", true, UnixMillis(1_800_000_000_000));
        r.groups
            .push(GroupReport::new("arn:a", "web", Outcome::Planned));
        let broken =
            GroupReport::with_error("arn:b", "broken", Outcome::BindingError, "tag missing");
        r.groups.push(broken.clone());
        let r = r.finish(UnixMillis(1_800_000_000_100));
        let mut dry = pass(&broken);
        dry.dry_run = true;
        for level in [LambdaLevel::Info, LambdaLevel::Fatal] {
            assert!(emf_lines(&r, level).is_empty());
            assert!(pass_lines(&dry, level).is_empty());
        }
    }
}
