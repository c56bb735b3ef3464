//! The pod-events function: reconcile the groups one pod touches.

use std::time::Duration;

use serde_json::Value;

use super::HandlerError;
use crate::controller::Engine;
use crate::core::UnixMillis;
use crate::groups::TargetGroupApi;
use crate::input::pod_event::{Parsed, parse};
use crate::pods::PodSource;
use crate::reconcile::RunOptions;
use crate::report::Report;
use crate::state::StateStore;

/// Handles one invocation. Garbage and other clusters' events are answered with a report
/// that says why they were ignored (no error, so EventBridge does not retry them);
/// failures to read the pod or discover groups are errors, so the event is retried and
/// ends in the dead-letter queue if it keeps failing.
pub async fn handle<P: PodSource, G: TargetGroupApi, S: StateStore>(
    engine: &Engine<P, G, S>,
    payload: &Value,
    ready_wait: Duration,
    deadline: Option<UnixMillis>,
) -> Result<Value, HandlerError> {
    let report = match parse(payload, &engine.core.cluster) {
        Parsed::Ignore(reason) => {
            tracing::info!(reason = %reason, "ignoring input");
            let now = engine.core.clock.now();
            let mut report = Report::new("pod-events", &engine.core.cluster, false, now);
            report.notes.push(format!("ignored: {reason}"));
            report.finish(now)
        }
        Parsed::Pod(event) => {
            let opts = RunOptions {
                deadline,
                ..RunOptions::default()
            };
            // Boxed: the pass's future is too large for the caller's stack.
            let report = Box::pin(engine.pod_event(&event, ready_wait, &opts))
                .await
                .inspect_err(|e| tracing::error!(error = %e, pod = %format!("{}/{}", event.namespace, event.name), "pod event failed"))?;
            super::log_run_errors(&report);
            tracing::info!(
                pod = %format!("{}/{}", event.namespace, event.name),
                reason = %event.reason,
                groups = report.groups.len(),
                registered = report.totals.registered,
                deregistered = report.totals.deregistered,
                errors = report.totals.errors,
                duration_ms = report.duration_ms,
                "pod event handled"
            );
            report
        }
    };
    crate::metrics::emit(&report);
    Ok(serde_json::to_value(&report)?)
}
