//! What a pod event names: the pod, and what the event already tells. The event is only
//! a hint for *which* groups; what they should hold is read afresh, as always (the run
//! is `controller::pod_event`).

use std::collections::BTreeMap;

use crate::pods::PodsError;

/// Which pod an event is about, and what the event already tells.
#[derive(Debug, Clone, PartialEq)]
pub struct PodEvent {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID when the event carries one.
    pub uid: Option<String>,
    /// Labels from the event (the exporter looks them up; absent for a pod gone).
    pub labels: Option<BTreeMap<String, String>>,
    /// The event says the pod was deleted.
    pub deleted: bool,
    /// Event reason (`Started`, `Killing`, ...), `pod` for a Pod detail, `invoke` for a
    /// direct invoke.
    pub reason: String,
}

/// Why a pod event could not be handled; the invocation fails so EventBridge retries it.
#[derive(Debug, thiserror::Error)]
pub enum PodEventError {
    /// The pod could not be read.
    #[error(transparent)]
    Pods(#[from] PodsError),
    /// Target groups could not be discovered.
    #[error("discovering target groups failed: {0}")]
    Discovery(#[from] crate::groups::ElbError),
    /// The change was not applied to these groups before the invocation ended, and
    /// handing it on to the next run failed too.
    #[error(
        "the change was neither applied to {} nor handed on to the next run ({source}); the event is retried",
        groups.join(", ")
    )]
    NotHandedOn {
        /// The groups left unserved.
        groups: Vec<String>,
        /// Why handing them on failed.
        source: crate::state::StateError,
    },
}
