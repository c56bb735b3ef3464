//! CloudWatch Embedded Metric Format (dimensions `Function` and `Cluster`, plus
//! `TargetGroup` on per-group lines): one JSON line per run, and one per group that had
//! drift or an error, printed straight to stdout (Lambda ships stdout to CloudWatch Logs,
//! which extracts the metrics; no PutMetricData calls, no extra latency).
//!
//! Per-group lines are emitted only for groups with something to say, so a steady-state
//! fleet of 1,000 groups adds no per-group metrics (each dimension value is a billed
//! custom metric); the group's name stays searchable as a property in Logs Insights.

use serde_json::{Map, Value, json};

use crate::report::{Outcome, Report};

/// CloudWatch namespace of every tgsync metric.
pub const NAMESPACE: &str = "tgsync";

/// The EMF lines for a finished report. Pure, so it is tested without stdout.
pub fn emf_lines(report: &Report) -> Vec<String> {
    let t = &report.totals;
    // A group backing off is still failing: counting it keeps the errors alarm from
    // clearing between its attempts.
    let errors = t.errors + t.backing_off + report.errors.len();
    let mut lines = vec![line(
        report,
        &["Function", "Cluster"],
        Map::from_iter([
            ("Function".to_owned(), json!(report.function)),
            ("Cluster".to_owned(), json!(report.cluster)),
            ("GroupsReconciled".to_owned(), json!(t.groups)),
            ("DriftFound".to_owned(), json!(t.changed)),
            ("Registered".to_owned(), json!(t.registered)),
            ("Deregistered".to_owned(), json!(t.deregistered)),
            ("Forgotten".to_owned(), json!(t.forgotten)),
            ("ReconcileErrors".to_owned(), json!(errors)),
            ("LeaseHeld".to_owned(), json!(t.lease_held)),
            ("BackingOff".to_owned(), json!(t.backing_off)),
            ("Duration".to_owned(), json!(report.duration_ms)),
            ("DryRun".to_owned(), json!(report.dry_run)),
        ]),
    )];
    for g in &report.groups {
        let failed = matches!(
            g.outcome,
            Outcome::Failed | Outcome::BindingError | Outcome::Aborted | Outcome::BackingOff
        );
        if g.outcome != Outcome::Changed && !failed {
            continue;
        }
        lines.push(line(
            report,
            &["Function", "Cluster", "TargetGroup"],
            Map::from_iter([
                ("Function".to_owned(), json!(report.function)),
                ("Cluster".to_owned(), json!(report.cluster)),
                ("TargetGroup".to_owned(), json!(g.name)),
                ("TargetGroupArn".to_owned(), json!(g.target_group_arn)),
                (
                    "Outcome".to_owned(),
                    serde_json::to_value(g.outcome).unwrap_or(Value::Null),
                ),
                (
                    "DriftFound".to_owned(),
                    json!(u8::from(g.outcome == Outcome::Changed)),
                ),
                ("Registered".to_owned(), json!(g.registered.len())),
                ("Deregistered".to_owned(), json!(g.deregistered.len())),
                ("ReconcileErrors".to_owned(), json!(u8::from(failed))),
            ]),
        ));
    }
    lines
}

/// Prints the EMF lines of `report` to stdout.
pub fn emit(report: &Report) {
    for l in emf_lines(report) {
        println!("{l}");
    }
}

fn line(report: &Report, dimensions: &[&str], mut fields: Map<String, Value>) -> String {
    let metric = |name: &str, unit: &str| json!({"Name": name, "Unit": unit});
    let mut metrics = vec![
        metric("DriftFound", "Count"),
        metric("Registered", "Count"),
        metric("Deregistered", "Count"),
        metric("ReconcileErrors", "Count"),
    ];
    if !dimensions.contains(&"TargetGroup") {
        metrics.extend([
            metric("GroupsReconciled", "Count"),
            metric("Forgotten", "Count"),
            metric("LeaseHeld", "Count"),
            metric("BackingOff", "Count"),
            metric("Duration", "Milliseconds"),
        ]);
    }
    fields.insert(
        "_aws".to_owned(),
        json!({
            "Timestamp": report.started_at.0 + report.duration_ms,
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
        let lines: Vec<Value> = emf_lines(&r)
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["ReconcileErrors"], 1, "{:?}", lines[0]);
        assert_eq!(lines.len(), 2, "the backing-off group has its own line");
        assert_eq!(lines[1]["ReconcileErrors"], 1);
    }

    #[test]
    fn one_run_line_and_one_per_eventful_group() {
        let lines: Vec<Value> = emf_lines(&report())
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
    }
}
