//! What a look or a pass notes in its group's report, in the words an operator acts
//! on: a backoff that holds registrations, the pods that need an operator, a failed
//! chunk of changes.

use crate::core::{BackoffState, Desired, SkipReason, Target, UnixMillis};
use crate::report::{FailedTarget, GroupReport, PodError};

/// Notes in `report` that the group's registrations wait for its backoff until `until`,
/// in the words an operator acts on (the caller sets the outcome).
pub(super) fn note_backoff(
    report: &mut GroupReport,
    until: UnixMillis,
    backoff: Option<&BackoffState>,
) {
    let failures = backoff.map_or(0, |b| b.failures);
    report.next_attempt_at = Some(until);
    report.error = Some(format!(
        "registrations back off after {failures} consecutive failure(s); deregistrations still happen at once; `tgsync sync --force` (the manual function with \"force\": true) retries now"
    ));
}

/// The selected pods that need an operator (a port that does not resolve, a duplicate).
pub(super) fn pod_errors(desired: &Desired) -> Vec<PodError> {
    desired
        .skipped
        .iter()
        .filter(|s| s.reason.is_error())
        .map(|s| PodError {
            pod: s.pod.to_string(),
            error: s.reason.to_string(),
            unusable_address: match &s.reason {
                SkipReason::UnusableAddress { address, .. } => Some(address.clone()),
                _ => None,
            },
        })
        .collect()
}

/// Records a failed chunk in the report; returns 1 for counting.
pub(super) fn fail(
    report: &mut GroupReport,
    chunk: &[Target],
    operation: &'static str,
    error: &str,
) -> usize {
    tracing::warn!(operation, targets = chunk.len(), error = %error, "ELBv2 change failed");
    report
        .failed_targets
        .extend(chunk.iter().map(|t| FailedTarget {
            target: *t,
            operation,
            error: error.to_owned(),
        }));
    1
}
