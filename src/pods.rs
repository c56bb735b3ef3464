//! The pod side of I/O: read the pods a binding selects, completely or not at all.

use std::future::Future;

use k8s_openapi::api::core::v1::Pod;
use thiserror::Error;

use crate::core::{PodFacts, Selector};

/// Reads pods from the cluster.
///
/// Implementations must never return a partial list as if it were whole: a failed,
/// cut-short or inconsistent listing is an error, because "no pods" deregisters
/// everything.
pub trait PodSource: Send + Sync {
    /// Every pod of `namespace` matching `selector` (all pods when `None`), read with a
    /// consistent (quorum) LIST, all pages.
    fn list(
        &self,
        namespace: &str,
        selector: Option<&Selector>,
    ) -> impl Future<Output = Result<Vec<PodFacts>, PodsError>> + Send;

    /// One pod by name; `Ok(None)` when it does not exist (HTTP 404).
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Pod>, PodsError>> + Send;

    /// Sets the `tgsync/target-health` readiness-gate condition of pod `uid` True (a
    /// strategic merge patch of `pods/status` with a UID precondition, so a namesake
    /// created since is never touched), once its target is healthy in the NLB.
    fn open_gate(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(), PodsError>> + Send;
}

/// The `pods/status` patch that opens the readiness gate: conditions merge by `type`, so
/// only this condition is added or changed; `metadata.uid` makes the API server refuse
/// it (409 Conflict) for any other pod of that name.
pub fn gate_patch(now_rfc3339: &str, uid: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": { "uid": uid },
        "status": {
            "conditions": [{
                "type": crate::core::pod::READINESS_GATE,
                "status": "True",
                "reason": "TargetHealthy",
                "message": "the pod's NLB target is healthy (set by tgsync)",
                "lastTransitionTime": now_rfc3339,
            }]
        }
    })
}

/// Why pods could not be read; every affected group is skipped, never emptied.
#[derive(Debug, Clone, Error)]
pub enum PodsError {
    /// The cluster endpoint, CA or token could not be obtained.
    #[error("cannot reach cluster `{cluster}`: {reason}")]
    Access {
        /// Cluster name.
        cluster: String,
        /// What failed (DescribeCluster, CA, token).
        reason: String,
    },
    /// The Kubernetes API answered with an error or could not be reached.
    #[error("listing pods in namespace `{namespace}` failed: {reason}")]
    List {
        /// Namespace being listed.
        namespace: String,
        /// Status code and message, or the transport error.
        reason: String,
    },
    /// Pages ended early or the continue token kept expiring.
    #[error(
        "pod list of namespace `{namespace}` is incomplete: {reason}; the affected groups are left untouched"
    )]
    Incomplete {
        /// Namespace being listed.
        namespace: String,
        /// What was inconsistent.
        reason: String,
    },
    /// Patching a pod's status failed.
    #[error(
        "setting the tgsync/target-health condition of pod `{namespace}/{name}` failed: {reason}"
    )]
    Patch {
        /// Namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// Status code and message, or the transport error.
        reason: String,
    },
    /// Reading a single pod failed.
    #[error("reading pod `{namespace}/{name}` failed: {reason}")]
    Get {
        /// Namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// Status code and message, or the transport error.
        reason: String,
    },
}
