//! The state table: ownership ledger, per-group lease and backoff.
//!
//! Lambdas keep nothing between invocations, so everything that must survive a crash is
//! here. The write-ahead order (ledger row before RegisterTargets, deletion after
//! DeregisterTargets) keeps the ledger a superset of what tgsync registered.

use std::collections::BTreeMap;
use std::future::Future;

use serde::Serialize;
use thiserror::Error;

use crate::core::{BackoffState, Checkpoint, PodRef, Target, UnixMillis};

/// One target tgsync registered, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgerRow {
    /// The target.
    pub target: Target,
    /// The pod it was registered for.
    pub pod: PodRef,
    /// When the row was written.
    pub registered_at: UnixMillis,
}

/// Everything stored for one group (one Query).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupState {
    /// Targets tgsync registered (the ledger), keyed by target.
    pub ledger: BTreeMap<Target, LedgerRow>,
    /// Failure record, absent after a success.
    pub backoff: Option<BackoffState>,
    /// Last full verification, if any.
    pub checkpoint: Option<Checkpoint>,
}

/// The result of trying to take a group's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// We hold it until the given time.
    Acquired,
    /// Someone else holds it; their `dirty` flag is now set, so they will run again.
    HeldElsewhere,
}

/// The result of trying to release a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Released; nobody asked for a re-run.
    Released,
    /// Someone set `dirty` while we worked: the flag is cleared, the lease extended, and
    /// the caller must reconcile again before releasing.
    RunAgain,
    /// The lease had expired and was taken over; the new holder is responsible now.
    Lost,
}

/// The state table's operations. `group` is the target group ARN; implementations key
/// rows by cluster too, so deployments for different clusters can share a table.
pub trait StateStore: Send + Sync {
    /// Reads ledger and backoff of a group (strongly consistent).
    fn load(&self, group: &str) -> impl Future<Output = Result<GroupState, StateError>> + Send;

    /// Writes ledger rows (before RegisterTargets).
    fn record(
        &self,
        group: &str,
        rows: &[LedgerRow],
    ) -> impl Future<Output = Result<(), StateError>> + Send;

    /// Deletes ledger rows (after DeregisterTargets, or for forgotten targets).
    fn remove(
        &self,
        group: &str,
        targets: &[Target],
    ) -> impl Future<Output = Result<(), StateError>> + Send;

    /// Writes (`Some`) or clears (`None`) the backoff record.
    fn set_backoff(
        &self,
        group: &str,
        state: Option<BackoffState>,
    ) -> impl Future<Output = Result<(), StateError>> + Send;

    /// Writes (`Some`) or clears (`None`) the verification checkpoint.
    fn set_checkpoint(
        &self,
        group: &str,
        checkpoint: Option<Checkpoint>,
    ) -> impl Future<Output = Result<(), StateError>> + Send;

    /// Takes the lease for `owner` until `until` if it is free or expired at `now`;
    /// otherwise sets the holder's `dirty` flag.
    fn acquire(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        until: UnixMillis,
    ) -> impl Future<Output = Result<Acquire, StateError>> + Send;

    /// Releases `owner`'s lease unless `dirty` is set (then clears it, extends to
    /// `until` and asks for another pass).
    fn release(
        &self,
        group: &str,
        owner: &str,
        until: UnixMillis,
    ) -> impl Future<Output = Result<Release, StateError>> + Send;

    /// Deletes `owner`'s lease whatever its `dirty` flag (a group that failed, is backing
    /// off, or kept changing past the pass limit): a pending re-run is left to the next
    /// scheduled resync rather than holding the group until the lease expires.
    fn abandon(
        &self,
        group: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), StateError>> + Send;
}

/// Why the state table could not be used; the group is skipped (never changed blind).
#[derive(Debug, Clone, Error)]
pub enum StateError {
    /// The table does not exist.
    #[error("state table `{table}` not found; create it (template.yaml) or fix TGSYNC_TABLE_NAME")]
    NoTable {
        /// Table name.
        table: String,
    },
    /// A stored row could not be understood.
    #[error("state table row {key} is malformed: {reason}")]
    Malformed {
        /// The row's key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// DynamoDB failed (after retries).
    #[error("DynamoDB {operation} failed: {message}")]
    Dynamo {
        /// The API operation.
        operation: &'static str,
        /// Error code and message.
        message: String,
    },
}
