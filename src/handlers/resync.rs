//! The resync function: full diff of every bound group (or the requested ones).

use serde_json::Value;

use super::HandlerError;
use crate::core::UnixMillis;
use crate::groups::TargetGroupApi;
use crate::input::resync::ResyncRequest;
use crate::pods::PodSource;
use crate::reconcile::Engine;
use crate::state::StateStore;

/// Handles one invocation: the scheduled event or a manual payload.
pub async fn handle<P: PodSource, G: TargetGroupApi, S: StateStore>(
    engine: &Engine<P, G, S>,
    payload: &Value,
    deadline: Option<UnixMillis>,
) -> Result<Value, HandlerError> {
    let request = ResyncRequest::parse(payload)
        .inspect_err(|e| tracing::error!(error = %e, "refusing input"))?;
    let mut opts = request.options();
    opts.deadline = deadline;
    let report = engine.resync(&opts).await;
    super::log_groups(&report);
    tracing::info!(
        dry_run = report.dry_run,
        groups = report.totals.groups,
        changed = report.totals.changed,
        registered = report.totals.registered,
        deregistered = report.totals.deregistered,
        errors = report.totals.errors,
        duration_ms = report.duration_ms,
        "resync finished"
    );
    crate::metrics::emit(&report);
    Ok(serde_json::to_value(&report)?)
}
