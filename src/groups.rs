//! The target-group side of I/O: discover groups with their tags, read health, and
//! register or deregister targets.

use std::collections::BTreeMap;
use std::future::Future;

use thiserror::Error;

use crate::core::{GroupFacts, HealthState, Target};

/// A target group as discovery sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetGroup {
    /// Target group ARN.
    pub arn: String,
    /// Target group name (for reports).
    pub name: String,
    /// Target type, port and address family.
    pub facts: GroupFacts,
    /// All tags of the group.
    pub tags: BTreeMap<String, String>,
}

/// ELBv2 operations tgsync needs. Implementations rate-limit the mutating calls and retry
/// throttling and 5xx with backoff and jitter.
pub trait TargetGroupApi: Send + Sync {
    /// Every target group of the account and region with its tags (DescribeTargetGroups
    /// pages + DescribeTags in batches of 20).
    fn discover(&self) -> impl Future<Output = Result<Vec<TargetGroup>, ElbError>> + Send;

    /// The current tags of one group (DescribeTags): a pass that acts on a cached
    /// binding re-reads them first.
    fn tags(
        &self,
        arn: &str,
    ) -> impl Future<Output = Result<BTreeMap<String, String>, ElbError>> + Send;

    /// One DescribeTargetHealth: every registered target and its state.
    fn health(
        &self,
        arn: &str,
    ) -> impl Future<Output = Result<Vec<(Target, HealthState)>, ElbError>> + Send;

    /// RegisterTargets with at most 200 targets. When ELBv2 refuses the call because of
    /// some of them, the others are still registered and the refused ones come back in
    /// [`ElbError::Rejected`] with ELBv2's reason.
    fn register(
        &self,
        arn: &str,
        targets: &[Target],
    ) -> impl Future<Output = Result<(), ElbError>> + Send;

    /// DeregisterTargets with at most 200 targets.
    fn deregister(
        &self,
        arn: &str,
        targets: &[Target],
    ) -> impl Future<Output = Result<(), ElbError>> + Send;
}

/// Why an ELBv2 call failed (after the SDK's retries).
#[derive(Debug, Clone, Error)]
pub enum ElbError {
    /// The target group does not exist (deleted since discovery).
    #[error("target group {arn} not found (deleted?)")]
    NotFound {
        /// The ARN.
        arn: String,
    },
    /// Throttled even after retries.
    #[error("ELBv2 {operation} throttled after retries; the group backs off and retries later")]
    Throttled {
        /// The API operation.
        operation: &'static str,
    },
    /// IAM refused the call.
    #[error("ELBv2 {operation} denied: {message}; check the function role's policy")]
    AccessDenied {
        /// The API operation.
        operation: &'static str,
        /// The service's message.
        message: String,
    },
    /// ELBv2 refused these targets (each with its reason); every other target of the
    /// call went through.
    #[error("ELBv2 {operation} refused {} target(s): {}", targets.len(), targets.first().map(|(t, why)| format!("{t}: {why}")).unwrap_or_default())]
    Rejected {
        /// The API operation.
        operation: &'static str,
        /// The refused targets and ELBv2's reason for each.
        targets: Vec<(Target, String)>,
    },
    /// Any other failure.
    #[error("ELBv2 {operation} failed: {message}")]
    Other {
        /// The API operation.
        operation: &'static str,
        /// Error code and message.
        message: String,
    },
}
