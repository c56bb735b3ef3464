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

/// One WARN line per run-level error (an account whose target groups could not be
/// discovered, a requested group that is not bound). Each group's own line was written
/// when its pass ended (see [`crate::metrics::emit_pass`]).
pub(crate) fn log_run_errors(report: &Report) {
    for e in &report.errors {
        tracing::warn!(error = %e, "run error");
    }
}
