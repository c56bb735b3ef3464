//! Why a group's pass did not finish, typed: the controller's queue (its one error
//! policy, `controller::queue::Queue::done`) decides when the group is tried again from
//! it, and the report's words are written from it — nothing decides from a report field
//! or a message.

use crate::core::UnixMillis;
use crate::groups::ElbError;
use crate::pods::PodsError;
use crate::state::StateError;

/// The report's word for a pass cut before it finished.
pub(crate) const CUT: &str =
    "the pass was cut (the run ended or the function is shutting down); another pass was asked for";

/// The report's word for a group left to the next run.
pub(crate) const DEFERRED: &str =
    "the invocation is near its deadline; the next run reconciles this group";

/// Why a group's pass (or release) ended without finishing its work.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PassError {
    /// Stopped before it finished: the run's time is up, or the process is shutting
    /// down. Again as soon as a run can.
    #[error("{CUT}")]
    Cut,
    /// Not started: the invocation is near its deadline. Again as soon as a run can.
    #[error("{DEFERRED}")]
    Deferred,
    /// A verification stood down before its first read for a pod change's pass, which
    /// does its look (one health read, not two). Again at once.
    #[error("stood down for a pod change's pass, which looks at the group instead")]
    Yielded,
    /// Failed with nothing stored (before the lease, or a release interrupted): tried
    /// again after the queue's own backoff (a release gives up on a failure no retry
    /// can help: [`Failure::retryable`]).
    #[error(transparent)]
    Failed(Failure),
    /// Failed under the lease: the group's stored backoff holds its registrations until
    /// `until` (a pod change still runs at once: nothing delays a deregistration).
    #[error("{cause}")]
    BackingOff {
        /// What failed.
        cause: Failure,
        /// When registrations may be tried again.
        until: UnixMillis,
    },
}

/// What failed in a pass.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Failure {
    /// The group's state item could not be read.
    #[error("reading the state table failed: {0}")]
    StateRead(StateError),
    /// The group's target health could not be read.
    #[error("reading target health failed: {0}")]
    HealthRead(ElbError),
    /// The group's tags could not be read again.
    #[error("reading the group's tags failed: {0}")]
    TagRead(ElbError),
    /// The group's pods could not be listed.
    #[error(transparent)]
    Pods(PodsError),
    /// The lease could not be taken.
    #[error("taking the lease failed: {0}")]
    LeaseTake(StateError),
    /// The lease's holder could not be asked for a pass.
    #[error("asking the lease's holder for a pass failed: {0}")]
    AskHolder(StateError),
    /// The group's first entry could not be indexed; nothing was registered.
    #[error("indexing the group in the state table failed, nothing registered: {0}")]
    Index(StateError),
    /// A ledger write ahead of registrations failed; they were not sent.
    #[error("ledger write failed, not registered: {0}")]
    Ledger(StateError),
    /// Some ELBv2 changes failed (the report's `failedTargets` names them).
    #[error("{0} change(s) failed; see failedTargets")]
    Changes(usize),
    /// A release lost its lease, or was cut, before it finished.
    #[error("the lease was lost during the release; invoke the release again")]
    ReleaseInterrupted,
}

impl Failure {
    /// Whether trying again in this run can help: not when the state table is missing
    /// or one of its items cannot be used (an operator's to fix).
    pub fn retryable(&self) -> bool {
        !matches!(
            self,
            Self::LeaseTake(
                StateError::NoTable { .. }
                    | StateError::Malformed { .. }
                    | StateError::TooLarge { .. }
            )
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_words_of_a_failure_are_the_reports() {
        let e = PassError::BackingOff {
            cause: Failure::Changes(2),
            until: UnixMillis(5),
        };
        assert_eq!(e.to_string(), "2 change(s) failed; see failedTargets");
        assert_eq!(PassError::Cut.to_string(), CUT);
        assert_eq!(PassError::Deferred.to_string(), DEFERRED);
    }

    #[test]
    fn a_missing_table_is_not_retried_a_throttled_read_is() {
        let missing = Failure::LeaseTake(StateError::NoTable { table: "t".into() });
        assert!(!missing.retryable());
        let throttled = Failure::StateRead(StateError::Dynamo {
            operation: "GetItem",
            message: "ThrottlingException: slow down".into(),
        });
        assert!(throttled.retryable());
    }
}
