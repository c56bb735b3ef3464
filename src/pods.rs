//! The pod side of I/O: read the pods a binding selects, completely or not at all.

use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use thiserror::Error;

use crate::core::gate::GateVerdict;
use crate::core::{PodFacts, Selector};

/// A consistent listing and the `resourceVersion` it is consistent at: a watch started
/// from that version misses no change.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// The pods.
    pub pods: Vec<PodFacts>,
    /// The LIST's `resourceVersion` (empty if the server sent none).
    pub resource_version: String,
}

/// A pod as a watch event carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedPod {
    /// The pod's facts, as a LIST would give them.
    pub facts: PodFacts,
    /// The object's `metadata.resourceVersion`, where a resumed watch continues from
    /// (`None` if the object has none).
    pub resource_version: Option<String>,
}

/// The `Status` an `ERROR` watch event carries (410 Gone when the watch's version is too
/// old and the watcher must LIST again).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WatchStatus {
    /// Suggested HTTP code (0 when unset).
    pub code: u16,
    /// Machine-readable reason, e.g. `Expired` (empty when unset).
    pub reason: String,
    /// Human-readable message (empty when unset).
    pub message: String,
}

/// One event of a pod watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// `ADDED`: a pod appeared (or is replayed at the start of a watch).
    Added(WatchedPod),
    /// `MODIFIED`: a pod changed.
    Modified(WatchedPod),
    /// `DELETED`: a pod is gone (or left the watch's selection); the object is its last
    /// state.
    Deleted(WatchedPod),
    /// `BOOKMARK`: no change, but the watch has seen everything up to this version.
    Bookmark {
        /// `object.metadata.resourceVersion`.
        resource_version: String,
    },
    /// `ERROR`: the watch ended with this status.
    Error(WatchStatus),
}

/// A live watch: events as they arrive, until the server ends the stream (a timeout, a
/// closed connection: the caller resumes from the last version it saw). An `Err` item is
/// a broken stream; nothing after it is read.
pub type WatchStream = BoxStream<'static, Result<WatchEvent, PodsError>>;

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

    /// Like [`PodSource::list`], with the version the listing is consistent at.
    fn list_versioned(
        &self,
        namespace: &str,
        selector: Option<&Selector>,
    ) -> impl Future<Output = Result<Listing, PodsError>> + Send;

    /// Watches pods of `namespace` matching `selector` from `resource_version` (with
    /// bookmarks), the server ending the stream after `timeout`. A version too old to
    /// resume from is [`PodsError::Expired`] here, or an `ERROR` 410 event in the stream.
    fn watch(
        &self,
        namespace: &str,
        selector: Option<&Selector>,
        resource_version: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<WatchStream, PodsError>> + Send;

    /// One pod by name; `Ok(None)` when it does not exist (HTTP 404).
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Pod>, PodsError>> + Send;

    /// Sets the `tgsync/target-health` readiness-gate condition of pod `uid` as
    /// `verdict` says (True once its target is healthy in every group that selects it;
    /// False, with ELBv2's reason, while it is not): a strategic merge patch of
    /// `pods/status` with a UID precondition, so a namesake created since is never
    /// touched. `transition`: the status changes (its `lastTransitionTime` is set).
    fn set_gate(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        verdict: &GateVerdict,
        transition: bool,
    ) -> impl Future<Output = Result<(), PodsError>> + Send;

    /// The Availability Zone of node `name` (its `topology.kubernetes.io/zone` label);
    /// `Ok(None)` when the node is gone or unlabelled, or the source knows no nodes. An
    /// ALB group with cross-zone load balancing off wants its targets outside the VPC
    /// registered in a named zone: their pods' nodes'.
    fn node_zone(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>, PodsError>> + Send {
        let _ = name;
        async { Ok(None) }
    }
}

/// The `pods/status` patch that sets the readiness gate's condition: conditions merge by
/// `type`, so only this condition is added or changed; `metadata.uid` makes the API
/// server refuse it (409 Conflict) for any other pod of that name. `lastTransitionTime`
/// is sent only when the status changes (`transition`), as Kubernetes means it.
pub fn gate_patch(
    now_rfc3339: &str,
    uid: &str,
    verdict: &GateVerdict,
    transition: bool,
) -> serde_json::Value {
    let mut condition = serde_json::json!({
        "type": crate::core::pod::READINESS_GATE,
        "status": if verdict.open { "True" } else { "False" },
        "reason": verdict.reason,
        "message": verdict.message,
    });
    if transition {
        condition["lastTransitionTime"] = serde_json::json!(now_rfc3339);
    }
    serde_json::json!({
        "metadata": { "uid": uid },
        "status": { "conditions": [condition] }
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
    /// A watch could not be started or broke off.
    #[error("watching pods in namespace `{namespace}` failed: {reason}")]
    Watch {
        /// Namespace being watched.
        namespace: String,
        /// Status code and message, or the transport error.
        reason: String,
    },
    /// The version a watch was to resume from is gone (HTTP 410): LIST again.
    #[error(
        "the pod watch of namespace `{namespace}` cannot resume from version {resource_version} (HTTP 410 Gone); listing again"
    )]
    Expired {
        /// Namespace being watched.
        namespace: String,
        /// The version asked for.
        resource_version: String,
    },
    /// Reading a node (for its zone) failed.
    #[error("reading node `{name}` for its zone failed: {reason}")]
    Node {
        /// Node name.
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
