//! What each function does with one invocation: parse, run the engine, shape the report.
//! Generic over the adapters, so tests drive the exact handler code against moto and the
//! Kubernetes emulator without a Lambda runtime.

pub mod manual;
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
/// are INFO, failures (binding errors and backoff included) WARN with their error. Each
/// run-level error (an account whose target groups could not be discovered, a requested
/// group that is not bound) gets a WARN line too.
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
        } else {
            tracing::info!(
                target_group = %g.name,
                account = %g.account,
                registered = g.registered.len(),
                deregistered = g.deregistered.len(),
                forgotten = g.forgotten.len(),
                "target group changed"
            );
        }
    }
}
