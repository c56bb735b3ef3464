//! What a resync writes to its log at Lambda's default level (INFO, JSON lines): the real
//! resync handler over the in-memory fakes, with the product's own log setup installed
//! as the process's subscriber (so this file is its own test binary, and its tests take
//! turns). Every log line is a CloudWatch Logs charge, and the SDK's DEBUG chatter used
//! to be hundreds of lines per run; a quiet run must cost one line.
//!
//! `cargo run --example log_volume` prints the same numbers (and, with `--live`, those of
//! the production adapters against moto and the Kubernetes API emulator).

use std::sync::OnceLock;

use serde_json::{Value, json};
use tgsync::Engine;
use tgsync::clock::ManualClock;
use tgsync::core::UnixMillis;
use tgsync::fakes::{FakeElb, FakePods, FakeState};
use tgsync::logging::LambdaLevel;
use tgsync::reconcile::RunOptions;
use tgsync::testkit::{Fleet, LogCapture};

const FLEET: Fleet = Fleet {
    groups: 100,
    namespaces: 5,
    pods_per_group: 10,
};

/// The process's one subscriber: INFO, JSON, into memory.
fn logs() -> &'static LogCapture {
    static LOGS: OnceLock<LogCapture> = OnceLock::new();
    LOGS.get_or_init(|| {
        let capture = LogCapture::default();
        tgsync::logging::init_with(Some("INFO"), true, capture.clone());
        capture
    })
}

/// The tests share the subscriber: one at a time.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

type FakeEngine = Engine<FakePods, FakeElb, FakeState>;

/// 100 bound groups, filled by a first run and settled: the next run has zero drift.
async fn converged_fleet() -> FakeEngine {
    let engine = FLEET.fake_engine(ManualClock::new(UnixMillis(1_800_000_000_000)));
    let first =
        tgsync::handlers::resync::handle(&engine, &json!({}), None, std::time::Duration::ZERO)
            .await
            .expect("first run");
    assert_eq!(
        first["totals"]["registered"],
        FLEET.groups * FLEET.pods_per_group
    );
    engine.core.groups.settle();
    engine
}

/// Each line as JSON, checked against what Lambda's log-level filter needs: a level it
/// recognises (upper case) and an RFC 3339 timestamp (without one, Lambda would count
/// the line as INFO whatever its level).
fn parse_lines(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            let level = v["level"]
                .as_str()
                .unwrap_or_else(|| panic!("no level: {l}"));
            assert!(
                ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level),
                "{l}"
            );
            let ts = v["timestamp"]
                .as_str()
                .unwrap_or_else(|| panic!("no timestamp: {l}"));
            aws_smithy_types::DateTime::from_str(ts, aws_smithy_types::date_time::Format::DateTime)
                .unwrap_or_else(|e| panic!("timestamp {ts} is not RFC 3339 ({e}): {l}"));
            v
        })
        .collect()
}

#[tokio::test]
async fn zero_drift_resync_of_100_groups_writes_one_line_at_info() {
    let logs = logs();
    let _turn = TURN.lock().await;
    let engine = converged_fleet().await;
    logs.take();
    let report =
        tgsync::handlers::resync::handle(&engine, &json!({}), None, std::time::Duration::ZERO)
            .await
            .expect("zero-drift run");
    assert_eq!(report["totals"]["groups"], FLEET.groups);
    assert_eq!(report["totals"]["changed"], 0);
    assert_eq!(report["totals"]["errors"], 0);
    let lines = logs.take();
    assert_eq!(lines.len(), 1, "one summary line: {lines:#?}");
    let summary = &parse_lines(&lines)[0];
    assert_eq!(summary["message"], "resync finished");
    assert_eq!(summary["level"], "INFO");
    assert_eq!(summary["groups"], FLEET.groups);
}

#[tokio::test]
async fn each_group_with_changes_or_errors_adds_one_line() {
    let logs = logs();
    let _turn = TURN.lock().await;
    let engine = converged_fleet().await;
    // Three groups gain a pod; two get tags they may not have (binding errors).
    for g in [3, 40, 77] {
        engine.core.pods.put(FLEET.pod(g, FLEET.pods_per_group));
    }
    engine
        .core
        .groups
        .set_tag(&FLEET.arn(12), "tgsync/mode", Some("sideways"));
    engine
        .core
        .groups
        .set_tag(&FLEET.arn(55), "tgsync/selector", Some("app!=web"));
    logs.take();
    let report =
        tgsync::handlers::resync::handle(&engine, &json!({}), None, std::time::Duration::ZERO)
            .await
            .expect("run");
    assert_eq!(report["totals"]["changed"], 3, "{report}");
    assert_eq!(report["totals"]["errors"], 2, "{report}");
    let lines = parse_lines(&logs.take());
    assert_eq!(lines.len(), 1 + 3 + 2, "{lines:#?}");
    let mut changed: Vec<&str> = lines
        .iter()
        .filter(|l| l["message"] == "target group changed")
        .map(|l| {
            assert_eq!(l["level"], "INFO");
            assert_eq!(l["registered"], 1);
            l["target_group"].as_str().unwrap()
        })
        .collect();
    changed.sort_unstable();
    assert_eq!(changed, ["svc-3", "svc-40", "svc-77"]);
    let mut failed: Vec<&str> = lines
        .iter()
        .filter(|l| l["message"] == "target group not reconciled")
        .map(|l| {
            assert_eq!(l["level"], "WARN");
            assert_eq!(l["outcome"], "bindingError");
            assert!(l["error"].as_str().unwrap().contains("tgsync/"), "{l}");
            l["target_group"].as_str().unwrap()
        })
        .collect();
    failed.sort_unstable();
    assert_eq!(failed, ["svc-12", "svc-55"]);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l["message"] == "resync finished")
            .count(),
        1
    );
}

/// The metric lines of a real run pass Lambda's filter at every level an operator can
/// set, timestamped, with the EMF block CloudWatch extracts the metrics from.
#[tokio::test]
async fn metric_lines_of_a_run_pass_warn_error_and_fatal() {
    let _turn = TURN.lock().await;
    let engine = converged_fleet().await;
    engine
        .core
        .groups
        .set_tag(&FLEET.arn(7), "tgsync/namespace", Some("Not_A_Namespace"));
    let report = engine.resync(&RunOptions::default()).await;
    for configured in [LambdaLevel::Warn, LambdaLevel::Error, LambdaLevel::Fatal] {
        let level = tgsync::metrics::emf_level(Some(configured));
        let mut lines = tgsync::metrics::emf_lines(&report, level);
        for g in &report.groups {
            lines.extend(tgsync::metrics::pass_lines(
                &tgsync::metrics::PassDone {
                    function: report.function,
                    cluster: &report.cluster,
                    report: g,
                    dry_run: false,
                    reaction: None,
                    at: report.started_at,
                },
                level,
            ));
        }
        assert_eq!(
            lines.len(),
            3,
            "the run line, the orphan gauge (a full resync looks for orphans) and the failing group's pass line"
        );
        for l in &lines {
            let v: Value = serde_json::from_str(l).unwrap();
            // Lambda passes a line at or above the configured level.
            let passes =
                LambdaLevel::parse(v["level"].as_str().unwrap()).is_some_and(|l| l >= configured);
            assert!(passes, "{configured}: {l}");
            let ts = v["timestamp"].as_str().unwrap();
            aws_smithy_types::DateTime::from_str(ts, aws_smithy_types::date_time::Format::DateTime)
                .unwrap_or_else(|e| panic!("{ts}: {e}"));
            assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Namespace"], "tgsync");
            match (v.get("OrphanedGroups"), v.get("RunsCompleted")) {
                (Some(orphaned), _) => assert_eq!(orphaned, 0, "{l}"),
                (None, Some(runs)) => assert_eq!(runs, 1, "{l}"),
                (None, None) => assert!(v["ReconcileErrors"].as_u64().unwrap() >= 1, "{l}"),
            }
        }
    }
    // A dry run feeds no metric.
    let dry = engine
        .resync(&RunOptions {
            dry_run: true,
            ..RunOptions::default()
        })
        .await;
    assert!(tgsync::metrics::emf_lines(&dry, LambdaLevel::Info).is_empty());
}
