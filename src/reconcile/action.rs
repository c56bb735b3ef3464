//! What a group's pass says should happen next when it finished: kube-runtime's
//! `Action`, in tgsync's words. The pass decides *what* (done; the lease is held
//! elsewhere until a time; registrations back off until a time; a gated pod waits), or
//! why it did not finish ([`super::PassError`]); the controller's queue alone decides
//! *when* the group is tried again (`controller::queue`), so that question has one
//! answer in one file.

use crate::core::UnixMillis;

/// A pass's result: what should happen next, or why it did not finish.
pub type Reconciled = Result<Action, super::PassError>;

/// What should happen to a group after its pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing more until something changes.
    Done,
    /// Another process holds the group's lease until `until` (as stored: wall clock); it
    /// was asked to run again, and serves the request if it is alive.
    LeaseHeld {
        /// The holder's lease expiry as last seen.
        until: UnixMillis,
    },
    /// The group's registrations back off until `until` (its stored backoff, or the
    /// first retry of a registration waiting target by target); a pod change still runs
    /// at once: nothing delays a deregistration.
    BackOff {
        /// When registrations may be tried again.
        until: UnixMillis,
    },
    /// A gated pod of the group waits for its target to turn healthy: look again soon.
    GatesPending,
}
