//! CloudWatch Embedded Metric Format (dimensions `Function` and `Cluster`, plus
//! `TargetGroup` on per-group lines, which also carry the group's ARN and `Account` as
//! properties): one JSON line per run, and one per group that had drift or an error, printed straight to stdout (Lambda ships stdout to CloudWatch Logs,
//! which extracts the metrics; no PutMetricData calls, no extra latency).
//!
//! Per-group lines are emitted only for groups with something to say, so a steady-state
//! fleet of 1,000 groups adds no per-group metrics (each dimension value is a billed
//! custom metric); the group's name stays searchable as a property in Logs Insights.
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

use serde_json::{Map, Value, json};

use crate::logging::{LambdaLevel, rfc3339};
use crate::report::{Outcome, Report};

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

/// The EMF lines for a finished report, labelled `level` (see [`emf_level`]). Pure, so
/// it is tested without stdout. None for a dry run (see the module docs).
pub fn emf_lines(report: &Report, level: LambdaLevel) -> Vec<String> {
    if report.dry_run {
        return Vec::new();
    }
    let t = &report.totals;
    // A group backing off is still failing: counting it keeps the errors alarm from
    // clearing between its attempts.
    let errors = t.errors + t.backing_off + report.errors.len();
    let mut lines = vec![line(
        report,
        level,
        &["Function", "Cluster"],
        [
            ("GroupsReconciled", json!(t.groups)),
            ("DriftFound", json!(t.changed)),
            ("Registered", json!(t.registered)),
            ("Deregistered", json!(t.deregistered)),
            ("Forgotten", json!(t.forgotten)),
            ("ReconcileErrors", json!(errors)),
            ("LeaseHeld", json!(t.lease_held)),
            ("BackingOff", json!(t.backing_off)),
            ("Duration", json!(report.duration_ms)),
            // The heartbeat: one per finished run. A run that crashes, times out or is
            // never invoked writes none, and the heartbeat alarm sees the gap.
            ("RunsCompleted", json!(1)),
        ],
    )];
    if report.orphans.is_some() {
        // A gauge of groups no longer bound whose ledger still holds our targets, from
        // the runs that look for them (full resyncs) only, so that its minimum and
        // average mean something.
        lines.push(line(
            report,
            level,
            &["Function", "Cluster"],
            [("OrphanedGroups", json!(t.orphaned))],
        ));
    }
    for g in report.groups.iter().filter(|g| g.is_eventful()) {
        let failed = g.outcome.is_error();
        lines.push(line(
            report,
            level,
            &["Function", "Cluster", "TargetGroup"],
            [
                ("TargetGroup", json!(g.name)),
                ("TargetGroupArn", json!(g.target_group_arn)),
                // A property, not a dimension: the ARN already tells groups apart, and
                // each dimension value would be one more billed custom metric.
                ("Account", json!(g.account)),
                (
                    "Outcome",
                    serde_json::to_value(g.outcome).unwrap_or(Value::Null),
                ),
                ("DriftFound", json!(u8::from(g.outcome == Outcome::Changed))),
                ("Registered", json!(g.registered.len())),
                ("Deregistered", json!(g.deregistered.len())),
                ("ReconcileErrors", json!(u8::from(failed))),
            ],
        ));
    }
    lines
}

/// Prints the EMF lines of `report` to stdout, at the level the function's log filter
/// lets through.
pub fn emit(report: &Report) {
    for l in emf_lines(report, emf_level(LambdaLevel::configured())) {
        println!("{l}");
    }
}

/// Every metric tgsync emits and its unit; a line declares those among its fields.
const UNITS: [(&str, &str); 11] = [
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
];

/// One EMF line of `report`: its `Function` and `Cluster`, then `fields`.
fn line(
    report: &Report,
    level: LambdaLevel,
    dimensions: &[&str],
    fields: impl IntoIterator<Item = (&'static str, Value)>,
) -> String {
    let mut fields: Map<String, Value> = [
        ("Function", json!(report.function)),
        ("Cluster", json!(report.cluster)),
    ]
    .into_iter()
    .chain(fields)
    .map(|(name, value)| (name.to_owned(), value))
    .collect();
    let metrics: Vec<Value> = UNITS
        .iter()
        .filter(|(name, _)| fields.contains_key(*name))
        .map(|(name, unit)| json!({"Name": name, "Unit": unit}))
        .collect();
    let at = report.started_at.0 + report.duration_ms;
    fields.insert("level".to_owned(), json!(level.as_str()));
    fields.insert("timestamp".to_owned(), json!(rfc3339(at)));
    fields.insert(
        "_aws".to_owned(),
        json!({
            "Timestamp": at,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [dimensions],
                "Metrics": metrics,
            }],
        }),
    );
    Value::Object(fields).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::UnixMillis;
    use crate::report::GroupReport;

    fn report() -> Report {
        let mut r = Report::new("resync", "demo", false, UnixMillis(1_800_000_000_000));
        let mut changed = GroupReport::new("arn:a", "web", Outcome::Changed);
        changed.registered = vec![
            "10.0.0.1:80".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        ];
        r.groups.push(changed);
        r.groups
            .push(GroupReport::new("arn:b", "quiet", Outcome::InSync));
        r.groups.push(GroupReport::with_error(
            "arn:c",
            "broken",
            Outcome::BindingError,
            "tag missing",
        ));
        r.finish(UnixMillis(1_800_000_000_250))
    }

    /// A group still backing off is still failing: the errors alarm must not clear
    /// while it waits for its next attempt.
    #[test]
    fn groups_in_backoff_count_as_reconcile_errors() {
        let mut r = Report::new("resync", "demo", false, UnixMillis(1_800_000_000_000));
        r.groups
            .push(GroupReport::new("arn:a", "web", Outcome::BackingOff));
        let r = r.finish(UnixMillis(1_800_000_000_100));
        let lines: Vec<Value> = emf_lines(&r, LambdaLevel::Info)
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["ReconcileErrors"], 1, "{:?}", lines[0]);
        assert_eq!(lines.len(), 2, "the backing-off group has its own line");
        assert_eq!(lines[1]["ReconcileErrors"], 1);
    }

    #[test]
    fn one_run_line_and_one_per_eventful_group() {
        let lines: Vec<Value> = emf_lines(&report(), LambdaLevel::Info)
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "the in-sync group emits nothing");
        let run = &lines[0];
        assert_eq!(run["_aws"]["CloudWatchMetrics"][0]["Namespace"], "tgsync");
        assert_eq!(
            run["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["Function", "Cluster"]])
        );
        assert_eq!(run["Cluster"], "demo");
        assert_eq!(run["Function"], "resync");
        assert_eq!(
            (run["Registered"].as_u64(), run["ReconcileErrors"].as_u64()),
            (Some(2), Some(1))
        );
        assert_eq!(run["Duration"], 250);
        assert_eq!(run["_aws"]["Timestamp"], 1_800_000_000_250u64);
        // Every declared metric has a value on the line.
        for m in run["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
        {
            assert!(run[m["Name"].as_str().unwrap()].is_number(), "{m}");
        }
        // Groups come sorted by name.
        assert_eq!(lines[1]["TargetGroup"], "broken");
        assert_eq!(lines[1]["ReconcileErrors"], 1);
        assert_eq!(lines[2]["TargetGroup"], "web");
        assert_eq!(lines[2]["DriftFound"], 1);
        assert_eq!(run["RunsCompleted"], 1, "the heartbeat");
    }

    /// A deployment serving several accounts names each group's account on its line, as
    /// a property (searchable in Logs Insights) and not as a dimension (no new metrics).
    #[test]
    fn group_lines_name_the_account_as_a_property() {
        let arn =
            "arn:aws:elasticloadbalancing:us-east-1:222222222222:targetgroup/web/0123456789abcdef";
        let mut r = Report::new("resync", "demo", false, UnixMillis(1_800_000_000_000));
        r.groups
            .push(GroupReport::with_error(arn, "web", Outcome::Failed, "boom"));
        let r = r.finish(UnixMillis(1_800_000_000_100));
        let lines: Vec<Value> = emf_lines(&r, LambdaLevel::Info)
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[1]["Account"], "222222222222");
        assert_eq!(lines[1]["TargetGroupArn"], arn);
        assert_eq!(
            lines[1]["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["Function", "Cluster", "TargetGroup"]])
        );
        assert!(lines[0].get("Account").is_none(), "not on the run line");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["groups"][0]["account"], "222222222222");
    }

    /// Lambda drops a JSON line below its application log level, and counts a line
    /// without `level` (or without a valid timestamp) as INFO: at WARN, ERROR and FATAL
    /// the metric lines must still get through, with the EMF block intact.
    #[test]
    fn metric_lines_pass_every_lambda_log_level() {
        use LambdaLevel::*;
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
            let lines = emf_lines(&report(), level);
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
                let directive = &v["_aws"]["CloudWatchMetrics"][0];
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

    /// A dry run's counts are what a run would do: they must not reach the metrics the
    /// alarms read.
    #[test]
    fn dry_runs_emit_no_metrics() {
        let mut r = Report::new("resync", "demo", true, UnixMillis(1_800_000_000_000));
        r.groups
            .push(GroupReport::new("arn:a", "web", Outcome::Planned));
        r.groups.push(GroupReport::with_error(
            "arn:b",
            "broken",
            Outcome::BindingError,
            "tag missing",
        ));
        let r = r.finish(UnixMillis(1_800_000_000_100));
        for level in [LambdaLevel::Info, LambdaLevel::Fatal] {
            assert!(emf_lines(&r, level).is_empty());
        }
    }
}
