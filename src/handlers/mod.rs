//! What each function does with one invocation: parse, run the engine, shape the report.
//! Generic over the adapters, so tests drive the exact handler code against moto and the
//! Kubernetes emulator without a Lambda runtime.

pub mod pod_events;
pub mod resync;

use thiserror::Error;

use crate::report::Report;

/// An invocation that could not run at all (bad input or configuration).
#[derive(Debug, Error)]
pub enum HandlerError {
    /// The payload is not something this function accepts.
    #[error(transparent)]
    Input(#[from] crate::input::InputError),
    /// The pod or the target groups could not be read; retry the event.
    #[error(transparent)]
    PodEvent(#[from] crate::reconcile::PodEventError),
    /// The report could not be serialised (never expected).
    #[error("report serialisation failed: {0}")]
    Report(#[from] serde_json::Error),
}

/// One log line per group that changed or is failing, and none for a group in sync: a
/// run's log costs one summary line plus one line per group with something to say,
/// however many groups it looked at (every line is a CloudWatch Logs charge). Changes
/// are INFO, failures (binding errors and backoff included) WARN with their error, and
/// a group holding registered targets that get no traffic (`unused`, `unavailable`)
/// gets a WARN line naming the first with ELBv2's reason. Each run-level error (an
/// account whose target groups could not be discovered, a requested group that is not
/// bound) gets a WARN line too.
pub(crate) fn log_groups(report: &Report) {
    for e in &report.errors {
        tracing::warn!(error = %e, "run error");
    }
    for g in report.groups.iter().filter(|g| g.is_eventful()) {
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
        } else if matches!(
            g.outcome,
            crate::report::Outcome::Changed | crate::report::Outcome::Released
        ) {
            tracing::info!(
                target_group = %g.name,
                account = %g.account,
                registered = g.registered.len(),
                deregistered = g.deregistered.len(),
                forgotten = g.forgotten.len(),
                "target group changed"
            );
        }
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{HealthState, TargetHealth, UnixMillis};
    use crate::report::{GroupReport, Outcome};
    use crate::testkit::LogCapture;

    fn logged(report: &Report) -> Vec<String> {
        let capture = LogCapture::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(capture.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || log_groups(report));
        capture.take()
    }

    #[test]
    fn a_group_whose_targets_get_no_traffic_gets_a_warning_naming_the_reason() {
        let mut report = Report::new("resync", "demo", false, UnixMillis(0));
        let mut quiet = GroupReport::new("arn:a", "quiet", Outcome::InSync);
        let mut idle = GroupReport::new("arn:b", "idle", Outcome::InSync);
        let health = [
            TargetHealth::new("10.0.1.1:80".parse().unwrap(), HealthState::Unused)
                .with_reason("Target.NotInUse", None),
        ];
        quiet.note_health(&[]);
        idle.note_health(&health);
        report.groups = vec![quiet, idle];
        let lines = logged(&report);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("WARN"), "{lines:?}");
        assert!(lines[0].contains("target_group=idle"), "{lines:?}");
        assert!(
            lines[0].contains("10.0.1.1:80 unused (Target.NotInUse)"),
            "{lines:?}"
        );
    }
}
