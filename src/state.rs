//! The state table: one item per target group holding its ownership ledger, lease,
//! backoff and verification checkpoint.
//!
//! Lambdas keep nothing between invocations, so everything that must survive a crash is
//! here. One item per group makes a zero-drift run cost one consistent read per group
//! and no write, and lets deployments of several clusters that share a group share one
//! ledger and one lease. Every change is one conditional write: ledger changes are
//! fenced by the lease (a holder whose lease expired or was taken over can no longer
//! write), and the write-ahead order (entry before RegisterTargets, removal after
//! DeregisterTargets) keeps the ledger a superset of what tgsync registered.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use serde::Serialize;
use thiserror::Error;

use crate::core::{
    BackoffState, Binding, Checkpoint, GroupFacts, Holds, PodRef, Selector, Target, UnixMillis,
};

/// A row of a cluster's index of bound groups: a group, and the namespace and selector
/// of the binding its row was written for (possibly stale: the group's tags decide).
/// Discovery writes a row for every bound group (whether or not it holds targets yet)
/// and marks rows of groups no longer bound; a pass writes one before the group's first
/// entry of the cluster, so the index is also a superset of the groups holding them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedGroup {
    /// The group's ARN.
    pub group: String,
    /// Its binding's namespace.
    pub namespace: String,
    /// Its binding's selector (`None` when the recorded one no longer parses).
    pub selector: Option<Selector>,
    /// The group's name and facts as recorded with the row: ELBv2 never changes them
    /// (target type, port, protocol and address type are fixed at creation), so a cold
    /// container reads only the group's tags ahead of discovery. `None` for rows
    /// written before they were recorded.
    pub described: Option<(String, GroupFacts)>,
    /// The fingerprint of the binding the row was written for ([`Binding::fingerprint`];
    /// `None` for rows written before it was recorded).
    pub binding: Option<u64>,
    /// Whether the group was bound when the row was last written (`false`: discovery
    /// found it no longer bound; the row stays while its ledger may hold the cluster's
    /// entries, for the orphan report).
    pub bound: bool,
}

/// A cluster's index of bound groups as a whole: bumped by every change of its rows, so
/// a function that holds the bound groups as of a generation knows, with one read,
/// whether they are still the last discovery's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexMeta {
    /// Bumped by every change of the index's rows (0: never written).
    pub generation: u64,
    /// Groups with a request for a pass a run handed on when it ended (their `dirty`
    /// flags are set too): the next run serves them first.
    pub requested: std::collections::BTreeSet<String>,
}

/// One change of a cluster's index of bound groups.
#[derive(Debug, Clone, Copy)]
pub enum IndexUpdate<'a> {
    /// `group` is bound by `binding`; `described` is its name and facts.
    Bound {
        /// The group's ARN.
        group: &'a str,
        /// Its binding.
        binding: &'a Binding,
        /// Its name and facts.
        described: (&'a str, &'a GroupFacts),
    },
    /// `group` is no longer bound to the cluster (its row, if any, is kept and marked).
    Unbound {
        /// The group's ARN.
        group: &'a str,
    },
}

/// One target a tgsync deployment registered or adopted, and for which pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgerEntry {
    /// The target.
    pub target: Target,
    /// The pod it was registered for.
    pub pod: PodRef,
    /// The cluster whose deployment owns it (only that deployment ever deregisters it).
    pub cluster: String,
    /// When the entry was written.
    pub registered_at: UnixMillis,
    /// A tombstone: when its target was deregistered. The entry stays for the forget
    /// grace ([`crate::core::FORGET_GRACE`]): an ELBv2 attempt to register it that was
    /// abandoned may land after the deregistration, and a pass that finds it registered
    /// then deregisters it again, even in shared mode. The ledger is so a superset of
    /// what tgsync may have registered, also when a call lands late.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deregistered_at: Option<UnixMillis>,
}

impl LedgerEntry {
    /// The entry as the diff sees it: `cluster`'s or another's, since when, and whether
    /// it is a tombstone.
    pub fn claim(&self, cluster: &str) -> crate::core::Claim {
        crate::core::Claim {
            mine: self.cluster == cluster,
            since: self.deregistered_at.unwrap_or(self.registered_at),
            tombstone: self.deregistered_at.is_some(),
        }
    }
}

/// The claims of `ledger` as the diff sees them, `cluster`'s or another's.
pub fn claims(
    ledger: &BTreeMap<Target, LedgerEntry>,
    cluster: &str,
) -> BTreeMap<Target, crate::core::Claim> {
    ledger.iter().map(|(t, e)| (*t, e.claim(cluster))).collect()
}

/// The targets `cluster`'s deployment owns in `ledger`.
pub fn owned_by(ledger: &BTreeMap<Target, LedgerEntry>, cluster: &str) -> BTreeSet<Target> {
    ledger
        .values()
        .filter(|e| e.cluster == cluster)
        .map(|e| e.target)
        .collect()
}

/// Who holds a group's lease, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// The holder's owner id (`<function>-<cluster>-<random>`).
    pub owner: String,
    /// Valid until then; renewed by the holder's heartbeat while it works.
    pub until: UnixMillis,
}

/// Everything stored for one group (one consistent read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupState {
    /// Targets registered or adopted by tgsync deployments (the ledger), by target.
    pub ledger: BTreeMap<Target, LedgerEntry>,
    /// Failure record, absent after a success.
    pub backoff: Option<BackoffState>,
    /// Registrations held back target by target (refused targets, a full group).
    pub held: Holds,
    /// Last verification that the group held exactly its desired set.
    pub checkpoint: Option<Checkpoint>,
    /// The current lease, if one is stored (it may have expired).
    pub lease: Option<LeaseView>,
    /// Somebody asked for another pass while the lease was held, and no pass has served
    /// that request yet (set with or without a holder: a holder that gave up leaves it).
    pub dirty: bool,
    /// Bumped by every change of ledger, backoff or checkpoint and by every taking of
    /// the lease: writes made without the lease are conditional on it, so they never
    /// overwrite a newer state.
    pub version: u64,
    /// Per cluster, the pods' `resourceVersion` its last pass decided from (a LIST's, or
    /// a watch store's), written with every change: a pass that would decide from a
    /// store behind it reads the pods afresh, so it never undoes a newer pass of another
    /// process with older reads.
    pub seen: BTreeMap<String, String>,
}

impl GroupState {
    /// Whether a lease is held at `now` by someone other than `owner`.
    pub fn held_by_other(&self, owner: Option<&str>, now: UnixMillis) -> bool {
        held_by_other(self.lease.as_ref(), owner, now)
    }

    /// What a glance at the group would have read of this state.
    pub fn glance(&self) -> Glance {
        Glance {
            backoff: self.backoff,
            held: self.held.clone(),
            checkpoint: self.checkpoint,
            lease: self.lease.clone(),
            dirty: self.dirty,
            version: self.version,
        }
    }
}

/// A group's state without its ledger (and pod versions): what a look at a group at rest
/// needs to see that nothing changed (its checkpoint, lease, `dirty` flag and backoff),
/// at a few hundred bytes instead of ~120 bytes a target. Not a [`GroupState`], so it
/// is never taken for one whose ledger is empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Glance {
    /// As [`GroupState::backoff`].
    pub backoff: Option<BackoffState>,
    /// As [`GroupState::held`].
    pub held: Holds,
    /// As [`GroupState::checkpoint`].
    pub checkpoint: Option<Checkpoint>,
    /// As [`GroupState::lease`].
    pub lease: Option<LeaseView>,
    /// As [`GroupState::dirty`].
    pub dirty: bool,
    /// As [`GroupState::version`].
    pub version: u64,
}

impl Glance {
    /// Whether a lease is held at `now` by someone other than `owner`.
    pub fn held_by_other(&self, owner: Option<&str>, now: UnixMillis) -> bool {
        held_by_other(self.lease.as_ref(), owner, now)
    }
}

fn held_by_other(lease: Option<&LeaseView>, owner: Option<&str>, now: UnixMillis) -> bool {
    lease.is_some_and(|l| l.until >= now && Some(l.owner.as_str()) != owner)
}

/// A change to a group's stored state, applied atomically in one write. `None` leaves a
/// part as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    /// The whole new ledger.
    pub ledger: Option<BTreeMap<Target, LedgerEntry>>,
    /// The new backoff record (`Some(None)` clears it).
    pub backoff: Option<Option<BackoffState>>,
    /// The registrations held back, whole (empty clears them).
    pub held: Option<Holds>,
    /// The new checkpoint (`Some(None)` clears it).
    pub checkpoint: Option<Option<Checkpoint>>,
    /// The new per-cluster pod versions (see [`GroupState::seen`]), whole.
    pub seen: Option<BTreeMap<String, String>>,
}

impl Change {
    /// Whether nothing would change.
    pub fn is_empty(&self) -> bool {
        self.ledger.is_none()
            && self.backoff.is_none()
            && self.held.is_none()
            && self.checkpoint.is_none()
            && self.seen.is_none()
    }
}

/// The result of trying to take a group's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// We hold it; the group's state as of taking it.
    Acquired(GroupState),
    /// Someone else holds it until `until`; their `dirty` flag is now set, so a live
    /// holder will run again.
    HeldElsewhere {
        /// The holder.
        owner: String,
        /// Its lease's expiry.
        until: UnixMillis,
    },
}

/// The result of trying to release a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// Released; nobody asked for a re-run.
    Released,
    /// Someone set `dirty` while we worked: the flag is cleared, the lease renewed, and
    /// the caller must reconcile again; the group's state as of now.
    RunAgain(GroupState),
    /// The lease had expired or was taken over; the new holder is responsible now.
    Lost,
}

/// The state table's operations. `group` is the target group ARN (the full ARN, so
/// groups of different accounts never collide).
pub trait StateStore: Send + Sync {
    /// Reads a group's state with a strongly consistent read. The first read of a group
    /// may write once (to record the upgrade from an earlier table layout).
    fn load(&self, group: &str) -> impl Future<Output = Result<GroupState, StateError>> + Send;

    /// Like [`StateStore::load`], but never writes (dry runs, lease waiters).
    fn peek(&self, group: &str) -> impl Future<Output = Result<GroupState, StateError>> + Send {
        self.load(group)
    }

    /// Reads several groups' states, each as [`StateStore::load`] would, in batched
    /// strongly consistent reads (up to 100 a request), and never writes: a full diff
    /// reads ahead of its looks, so that a group costs a share of a request instead of
    /// one of its own. A group left out (still unprocessed after the retries, or whose
    /// item must first be upgraded from an earlier layout) is missing from the result,
    /// and its look reads it alone.
    fn load_many(
        &self,
        groups: &[String],
    ) -> impl Future<Output = Result<Vec<(String, GroupState)>, StateError>> + Send;

    /// As [`StateStore::load_many`], but glances: the states without ledgers (and pod
    /// versions), a few hundred bytes a group instead of ~120 bytes a target, for looks
    /// that a group at rest ends without its ledger.
    fn glance_many(
        &self,
        groups: &[String],
    ) -> impl Future<Output = Result<Vec<(String, Glance)>, StateError>> + Send;

    /// Takes the lease for `owner` until `until` if it is free, expired at `now`, or
    /// already `owner`'s (so a retried write that had landed is not a conflict);
    /// otherwise sets the holder's `dirty` flag. Taking it clears `dirty` (the new
    /// holder's first pass serves the request), removes the checkpoint (only a verified
    /// result writes one back, so a holder cut mid-pass leaves none that lets the
    /// schedule skip the group) and bumps the version.
    fn acquire(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        until: UnixMillis,
    ) -> impl Future<Output = Result<Acquire, StateError>> + Send;

    /// Asks the lease's holder for another pass without taking the lease: sets `dirty`
    /// while `holder` holds it with an expiry at or after `held_after` (the caller's
    /// now less the takeover grace: a lease nobody may take over yet), as
    /// [`StateStore::acquire`] does when it finds the lease held. `Ok(false)` when
    /// `holder` no longer holds it (given back, expired, taken over): nothing written.
    /// What a look writes when the group's item shows the lease held elsewhere, before
    /// any ELBv2 read.
    fn ask_holder(
        &self,
        group: &str,
        holder: &str,
        held_after: UnixMillis,
    ) -> impl Future<Output = Result<bool, StateError>> + Send;

    /// Extends `owner`'s lease to `until` while it is still `owner`'s — also after it
    /// expired, if nobody else took it meanwhile (a slow holder takes its lease back);
    /// `Ok(false)` when another holder has it or it was given up (the holder must stop
    /// before its next write).
    fn renew(
        &self,
        group: &str,
        owner: &str,
        until: UnixMillis,
    ) -> impl Future<Output = Result<bool, StateError>> + Send;

    /// Shortens `owner`'s lease to `until` and sets `dirty`, while the lease is still
    /// `owner`'s: what a holder that is shutting down writes at once, so that if it dies
    /// before it gives the lease back, its group waits only until `until` and the next
    /// holder runs a pass. `Ok(false)` when another holder has it or it was given up.
    fn hand_over(
        &self,
        group: &str,
        owner: &str,
        until: UnixMillis,
    ) -> impl Future<Output = Result<bool, StateError>> + Send;

    /// Applies `change` if `owner` still holds an unexpired lease at `now` and the item
    /// is still at `version` (the one the holder last read or wrote: an older write of
    /// the holder, delivered late by a retry, never overwrites a newer one);
    /// [`StateError::LeaseLost`] otherwise: the fencing check. Returns the item's new
    /// version (`version` itself for an empty change, which writes nothing).
    fn write(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        version: u64,
        change: &Change,
    ) -> impl Future<Output = Result<u64, StateError>> + Send;

    /// Applies `change` and releases `owner`'s lease unless `dirty` is set; then clears
    /// `dirty`, renews the lease to `until` and asks for another pass instead. With
    /// `linger` (an ELBv2 attempt under the lease was abandoned and may still land) the
    /// lease is not deleted but ends at `now`, so a taker waits the takeover grace. Like
    /// every write of the holder, conditional on the item's `version`.
    #[allow(clippy::too_many_arguments)]
    fn release(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        version: u64,
        until: UnixMillis,
        change: &Change,
        linger: bool,
    ) -> impl Future<Output = Result<Release, StateError>> + Send;

    /// Applies `change` (if the lease is still `owner`'s) and gives the lease up whatever
    /// its `dirty` flag, which stays set: a waiter that sees it knows its change was not
    /// served and takes the group itself. With `dirty`, the flag is set too (the holder
    /// leaves a request unserved: its own, or one it cleared); also when the lease had
    /// expired but was still `owner`'s. With `linger`, as in [`StateStore::release`]: the
    /// holder stays recorded and the lease ends at `now` (or when it expired). `change` is
    /// written only at `version`, as by [`StateStore::write`].
    #[allow(clippy::too_many_arguments)]
    fn abandon(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        version: u64,
        change: &Change,
        dirty: bool,
        linger: bool,
    ) -> impl Future<Output = Result<(), StateError>> + Send;

    /// Records a verification made without the lease (a scheduled run that found the
    /// group right), only if the state is still `version` and the lease is free: nobody
    /// holds it, or it expired before `expired_before` (the caller's time less the
    /// takeover grace: [`crate::lease::expired_before`]; an ELBv2 attempt of its holder
    /// may land until then); `Ok(false)` otherwise (the checkpoint is then not written,
    /// which only costs a verification later).
    fn record_verified(
        &self,
        group: &str,
        version: u64,
        expired_before: UnixMillis,
        checkpoint: Checkpoint,
    ) -> impl Future<Output = Result<bool, StateError>> + Send;
    /// The groups whose ledger may hold `cluster`'s entries: an index kept beside the
    /// groups' items, so that a resync finds the groups it once filled and that are no
    /// longer bound (orphans) with one read, without scanning the table. A superset:
    /// every ledger that holds an entry of `cluster` is in it.
    fn indexed_groups(
        &self,
        cluster: &str,
    ) -> impl Future<Output = Result<std::collections::BTreeSet<String>, StateError>> + Send;

    /// Each group in `cluster`'s index with the namespace and selector recorded with its
    /// row (rows that recorded none are left out; an unreadable selector is `None`):
    /// what a cold container watches first, and whose groups it reads first for a pod
    /// change, before discovery has read every group's tags.
    fn indexed_selections(
        &self,
        cluster: &str,
    ) -> impl Future<Output = Result<Vec<IndexedGroup>, StateError>> + Send;

    /// Writes `updates` to `cluster`'s index — a bound group's row with its binding's
    /// namespace, selector and fingerprint and the group's name and facts; a row of a
    /// group no longer bound marked so — each only where the row does not say so already,
    /// and when one was written, bumps the index's generation: what discovery writes
    /// when the bound groups changed, and a pass before the first entry of `cluster`
    /// goes into a group's ledger, so the index stays a superset of the groups holding
    /// the cluster's entries. Returns the new generation, or `None` when every row
    /// already said so.
    fn sync_index(
        &self,
        cluster: &str,
        updates: &[IndexUpdate<'_>],
    ) -> impl Future<Output = Result<Option<u64>, StateError>> + Send;

    /// Records `group` as bound by `binding` in `cluster`'s index (its name and facts
    /// `described`): a [`StateStore::sync_index`] of one group.
    fn index(
        &self,
        group: &str,
        cluster: &str,
        binding: &Binding,
        described: (&str, &GroupFacts),
    ) -> impl Future<Output = Result<Option<u64>, StateError>> + Send {
        async move {
            let update = IndexUpdate::Bound {
                group,
                binding,
                described,
            };
            self.sync_index(cluster, &[update]).await
        }
    }

    /// `cluster`'s index as a whole (one consistent read): its generation tells whether
    /// bound groups read from it earlier are still the last discovery's, and the groups
    /// whose requests a run handed on.
    fn index_meta(
        &self,
        cluster: &str,
    ) -> impl Future<Output = Result<IndexMeta, StateError>> + Send;

    /// Hands on requests for a pass of `groups` that a run of `cluster`'s deployment
    /// could not serve (its time was up, the process is shutting down): each group's
    /// `dirty` flag is set (where it is not: conditional writes, several in flight),
    /// so whoever holds or next takes its lease serves it, and the groups are recorded
    /// in the index's meta item, so the next run serves them first.
    fn request_passes(
        &self,
        cluster: &str,
        groups: &[String],
    ) -> impl Future<Output = Result<(), StateError>> + Send;

    /// Takes `groups` out of the requests recorded in `cluster`'s index meta item (a run
    /// asked for their passes; their `dirty` flags stay until a pass serves them).
    fn take_requests(
        &self,
        cluster: &str,
        groups: &[String],
    ) -> impl Future<Output = Result<(), StateError>> + Send;

    /// Takes `group` out of `cluster`'s index, only if the group's state is still
    /// `version` (as the caller saw it, holding no entry of `cluster`), its lease is free
    /// (as in [`StateStore::record_verified`], `expired_before` the caller's time less
    /// the takeover grace) and nobody asked for a pass: a concurrent first registration
    /// is never left out of the index. With `delete`, the group's item goes too (the
    /// caller saw its ledger empty). `Ok(false)` when the state changed meanwhile.
    fn retire(
        &self,
        group: &str,
        cluster: &str,
        version: u64,
        expired_before: UnixMillis,
        delete: bool,
    ) -> impl Future<Output = Result<bool, StateError>> + Send;
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
    /// A stored item could not be understood.
    #[error("state table item {key} is malformed: {reason}")]
    Malformed {
        /// The item's key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The write was refused because the lease is no longer ours (expired or taken
    /// over): another reconcile owns the group now.
    #[error(
        "the lease of {group} was lost (expired or taken over); this reconcile stopped before changing anything more"
    )]
    LeaseLost {
        /// The group.
        group: String,
    },
    /// The process is shutting down and handed the lease over (see
    /// [`StateStore::hand_over`]): no write starts under it any more.
    #[error(
        "the process is shutting down: the lease of {group} was handed over (it ends within the write margin) with a request for another pass"
    )]
    HandedOver {
        /// The group.
        group: String,
    },
    /// The group's item would exceed DynamoDB's 400 KB item limit.
    #[error(
        "the state of {group} would exceed DynamoDB's 400 KB item limit ({targets} ledger entries); split the group's pods over several target groups"
    )]
    TooLarge {
        /// The group.
        group: String,
        /// Ledger entries it would hold.
        targets: usize,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ip: &str, cluster: &str, deregistered_at: Option<u64>) -> LedgerEntry {
        let target = Target {
            ip: ip.parse().expect("an IP"),
            port: 8080,
            quic_server_id: None,
        };
        LedgerEntry {
            target,
            pod: PodRef {
                namespace: "shop".into(),
                name: format!("web-{ip}"),
                uid: ip.into(),
            },
            cluster: cluster.into(),
            registered_at: UnixMillis(1_000),
            deregistered_at: deregistered_at.map(UnixMillis),
        }
    }

    #[test]
    fn a_ledger_is_read_for_the_cluster_that_asks() {
        let ledger: BTreeMap<Target, LedgerEntry> = [
            entry("10.0.1.1", "demo", None),
            entry("10.0.1.2", "demo", Some(5_000)),
            entry("10.0.1.3", "other", None),
        ]
        .into_iter()
        .map(|e| (e.target, e))
        .collect();
        let owned: Vec<String> = owned_by(&ledger, "demo")
            .iter()
            .map(|t| t.ip.to_string())
            .collect();
        // A tombstone is still the deployment's: it may deregister it again.
        assert_eq!(owned, ["10.0.1.1", "10.0.1.2"]);
        let claims: Vec<(bool, u64, bool)> = claims(&ledger, "demo")
            .values()
            .map(|c| (c.mine, c.since.0, c.tombstone))
            .collect();
        // A tombstone's claim dates from its deregistration.
        assert_eq!(
            claims,
            [
                (true, 1_000, false),
                (true, 5_000, true),
                (false, 1_000, false)
            ]
        );
    }
}
