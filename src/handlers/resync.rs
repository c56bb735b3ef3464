//! The resync function: full diff of every bound group (or the requested ones), or a
//! release of named groups. Deployed, it serves the schedule alone
//! ([`handle_schedule`]): its one reserved slot is busy watching most of the minute, so
//! manual runs go to the manual function ([`super::manual`]), which has slots of its own.

use std::time::Duration;

use serde_json::Value;

use super::HandlerError;
use crate::controller::Engine;
use crate::core::UnixMillis;
use crate::groups::TargetGroupApi;
use crate::input::resync::ResyncRequest;
use crate::pods::PodSource;
use crate::state::StateStore;

/// Stop watching this long before the invocation's deadline, so the report gets out.
pub const WATCH_END_MARGIN: Duration = Duration::from_secs(10);

/// Handles one invocation of the deployed resync function: the scheduled event only. A
/// manual payload is refused with the way to the manual function: served here, it would
/// take the slot the next scheduled run needs (and a release would need no more than the
/// grant to invoke the schedule's function).
pub async fn handle_schedule<P: PodSource, G: TargetGroupApi, S: StateStore>(
    engine: &Engine<P, G, S>,
    payload: &Value,
    deadline: Option<UnixMillis>,
    watch: Duration,
) -> Result<Value, HandlerError> {
    let request = ResyncRequest::parse(payload)
        .inspect_err(|e| tracing::error!(error = %e, "refusing input"))?;
    if !request.scheduled {
        let e = crate::input::InputError::Malformed(
            "the resync function runs the schedule (and watches); invoke the manual function instead (<prefix>-manual, the stack's ManualFunctionName output), or use `tgsync plan` / `tgsync sync` / `tgsync release`".into(),
        );
        tracing::error!(error = %e, "refusing input");
        return Err(e.into());
    }
    handle(engine, payload, deadline, watch).await
}

/// Handles one invocation: the scheduled event or a manual payload (the library's entry
/// for both; the deployed function takes [`handle_schedule`]'s way). A scheduled run
/// keeps watching for `watch` after it started (watch mode; zero: off), always ending
/// [`WATCH_END_MARGIN`] before the deadline.
pub async fn handle<P: PodSource, G: TargetGroupApi, S: StateStore>(
    engine: &Engine<P, G, S>,
    payload: &Value,
    deadline: Option<UnixMillis>,
    watch: Duration,
) -> Result<Value, HandlerError> {
    let started = engine.core.clock.now();
    let request = ResyncRequest::parse(payload)
        .inspect_err(|e| tracing::error!(error = %e, "refusing input"))?;
    let mut opts = request.options();
    opts.deadline = deadline;
    let watch_until = (request.scheduled && !watch.is_zero()).then(|| {
        let mut until = started.plus(watch);
        if let Some(d) = deadline.filter(|d| *d > started) {
            let margin = u64::try_from(WATCH_END_MARGIN.as_millis()).unwrap_or(0);
            until = until.min(UnixMillis(d.0.saturating_sub(margin)));
        }
        until
    });
    // Boxed: a run's future (its queue, runner and watches) is tens of kilobytes, too
    // large for the caller's stack.
    let report = match (&request.release, watch_until) {
        (Some(arns), _) => Box::pin(engine.release(arns, &opts)).await,
        (None, Some(until)) => Box::pin(engine.run_scheduled(&opts, until)).await,
        (None, None) => Box::pin(engine.resync(&opts)).await,
    };
    super::log_run_errors(&report);
    tracing::info!(
        dry_run = report.dry_run,
        groups = report.totals.groups,
        changed = report.totals.changed,
        registered = report.totals.registered,
        deregistered = report.totals.deregistered,
        released = report.totals.released,
        orphaned = report.totals.orphaned,
        errors = report.totals.errors,
        duration_ms = report.duration_ms,
        "resync finished"
    );
    crate::metrics::emit(&report);
    Ok(serde_json::to_value(&report)?)
}
