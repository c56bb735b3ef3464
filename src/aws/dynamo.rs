//! [`StateStore`] on DynamoDB: one item per target group (see `items`), every change
//! one conditional UpdateItem, reads strongly consistent.
//!
//! A zero-drift run reads every group's item (a full diff in batches of BatchGetItem)
//! and writes nothing. Ledger changes are fenced by the lease (`owner = :me AND
//! leaseUntil >= :now`); writes made without the lease (a verification checkpoint,
//! folding in rows of the earlier layout) are conditional on the item's `version` and on
//! nobody holding the lease, so they never overwrite a newer state.

mod batch;
mod index;
mod items;
mod legacy;
mod table;
mod update;

use std::collections::{BTreeMap, HashSet};
use std::error::Error;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{ReturnValue, ReturnValuesOnConditionCheckFailure};
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use super::calls::ApiCalls;
use super::error_summary;
use crate::core::lease_protocol as protocol;
use crate::core::{Checkpoint, UnixMillis};
use crate::state::{Acquire, Change, Glance, GroupState, Release, StateError, StateStore};
use items::Item;
use update::Update;

pub use table::create_table;

const GET_ITEM: &str = "GetItem";
const BATCH_GET_ITEM: &str = "BatchGetItem";
const QUERY: &str = "Query";
const BATCH_WRITE_ITEM: &str = "BatchWriteItem";
const UPDATE_ITEM: &str = "UpdateItem";
const PUT_ITEM: &str = "PutItem";
const TRANSACT_WRITE_ITEMS: &str = "TransactWriteItems";

const OPERATIONS: &[&str] = &[
    GET_ITEM,
    BATCH_GET_ITEM,
    QUERY,
    BATCH_WRITE_ITEM,
    UPDATE_ITEM,
    PUT_ITEM,
    TRANSACT_WRITE_ITEMS,
];

/// The IAM actions the store's calls need, and all of them: `template.yaml` grants
/// exactly these. A TransactWriteItems is authorised per item (the orphan index's
/// removal deletes rows and checks an item: DeleteItem, ConditionCheckItem).
pub const IAM_ACTIONS: [&str; 8] = [
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:UpdateItem",
    "dynamodb:Query",
    "dynamodb:PutItem",
    "dynamodb:DeleteItem",
    "dynamodb:ConditionCheckItem",
    "dynamodb:BatchWriteItem",
];

/// Rounds of "take it / mark it dirty" before giving up: each failed round means the
/// holder released (or the lease expired) between our two writes, which is rare.
const ACQUIRE_ROUNDS: u32 = 3;

/// The DynamoDB state store of one cluster's deployment. Cheap to clone; clones share
/// the client, the call counters and the list of rows of the earlier layout to delete.
#[derive(Clone)]
pub struct DynamoState {
    client: Client,
    table: Arc<str>,
    cluster: Arc<str>,
    calls: Arc<ApiCalls>,
    query_page_limit: Option<i32>,
    /// Groups whose state was handed out with rows of the earlier layout folded in; the
    /// rows are deleted after the first write that stores them in the item.
    legacy_pending: Arc<Mutex<HashSet<String>>>,
    /// Acquisitions that found the lease held by someone else.
    contended: Arc<std::sync::atomic::AtomicU64>,
}

impl Debug for DynamoState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoState")
            .field("table", &self.table)
            .field("cluster", &self.cluster)
            .field("calls", &self.calls.snapshot())
            .finish_non_exhaustive()
    }
}

/// Whether a conditional write was refused because its condition did not hold.
fn condition_failed<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> bool {
    err.code() == Some("ConditionalCheckFailedException")
}

/// The item a refused conditional UpdateItem reported (ReturnValuesOnConditionCheckFailure).
fn refused_item<R>(
    err: &SdkError<aws_sdk_dynamodb::operation::update_item::UpdateItemError, R>,
) -> Option<Item> {
    match err.as_service_error() {
        Some(aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(e)) => {
            e.item().cloned()
        }
        _ => None,
    }
}

/// A request-building error: only possible if a required field were left out, which the
/// code never does; reported rather than panicking.
fn build_error(operation: &'static str, err: impl std::fmt::Display) -> StateError {
    StateError::Dynamo {
        operation,
        message: format!("could not build the request: {err}"),
    }
}

impl DynamoState {
    /// The store for `cluster`'s deployment in `table_name`. Items are keyed by target
    /// group ARN alone, so deployments of clusters sharing a group share its ledger and
    /// lease; each ledger entry names its cluster.
    pub fn new(client: Client, table_name: impl Into<String>, cluster: impl Into<String>) -> Self {
        Self {
            client,
            table: Arc::from(table_name.into()),
            cluster: Arc::from(cluster.into()),
            calls: Arc::new(ApiCalls::new(OPERATIONS)),
            query_page_limit: None,
            legacy_pending: Arc::new(Mutex::new(HashSet::new())),
            contended: Arc::default(),
        }
    }

    /// Builds the client from an SDK configuration (normally [`super::sdk_config`]).
    pub fn from_sdk_config(
        config: &aws_config::SdkConfig,
        table_name: impl Into<String>,
        cluster: impl Into<String>,
    ) -> Self {
        let config = aws_sdk_dynamodb::config::Builder::from(config)
            .retry_partition(super::retry_partition("tgsync-dynamodb"))
            .build();
        Self::new(Client::from_conf(config), table_name, cluster)
    }

    /// Caps the items per Query page of the earlier layout's rows. Only for tests:
    /// DynamoDB (and moto) page at 1 MB, which a test cannot reach cheaply.
    pub fn with_query_page_limit(mut self, items_per_page: i32) -> Self {
        self.query_page_limit = Some(items_per_page.max(1));
        self
    }

    /// How many lease acquisitions (and looks that asked the holder) found the lease held
    /// by someone else and marked it dirty: how often reconciles of one group met, for
    /// benchmarks and race tests.
    pub fn leases_found_held(&self) -> u64 {
        self.contended.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The table this store uses, for logs and reports.
    pub fn table_name(&self) -> &str {
        &self.table
    }

    /// Calls made so far per operation (each page and each BatchWriteItem round counts;
    /// SDK retries do not), for benchmarks and reports.
    pub fn api_calls(&self) -> BTreeMap<&'static str, u64> {
        self.calls.snapshot()
    }

    /// Maps an SDK error that survived retries: a missing table gets its own message
    /// (the deployment is incomplete), an item over 400 KB its own, anything else its
    /// `Code: message`.
    fn error<E, R>(&self, operation: &'static str, group: &str, err: SdkError<E, R>) -> StateError
    where
        E: ProvideErrorMetadata + Error + 'static,
        R: Debug + 'static,
    {
        match err.code() {
            Some("ResourceNotFoundException") => StateError::NoTable {
                table: self.table.to_string(),
            },
            Some("ValidationException")
                if err.message().is_some_and(|m| m.contains("Item size")) =>
            {
                StateError::TooLarge {
                    group: group.to_owned(),
                    targets: 0,
                }
            }
            _ => StateError::Dynamo {
                operation,
                message: error_summary(&err),
            },
        }
    }

    /// Sends one UpdateItem built from `update`; `Ok(None)` when its condition failed,
    /// with the item as it was (if asked for).
    async fn update(
        &self,
        group: &str,
        update: Update,
        return_new: bool,
    ) -> Result<Result<Option<Item>, Option<Item>>, StateError> {
        self.calls.count(UPDATE_ITEM);
        let out = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(items::group_key(group)))
            .update_expression(update.expression())
            .set_condition_expression(update.condition_expression())
            .set_expression_attribute_names(Some(update.names()))
            .set_expression_attribute_values(update.values())
            .return_values(if return_new {
                ReturnValue::AllNew
            } else {
                ReturnValue::None
            })
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match out {
            Ok(out) => Ok(Ok(out.attributes)),
            Err(e) if condition_failed(&e) => Ok(Err(refused_item(&e))),
            Err(e) => Err(self.error(UPDATE_ITEM, group, e)),
        }
    }

    /// The state from an item, with this cluster's rows of the earlier layout folded in
    /// until the item records them (and, unless `read_only`, recorded in it).
    async fn state_of(&self, group: &str, item: Option<&Item>) -> Result<GroupState, StateError> {
        self.state_from(group, item, false).await
    }

    async fn state_from(
        &self,
        group: &str,
        item: Option<&Item>,
        read_only: bool,
    ) -> Result<GroupState, StateError> {
        let mut state = match item {
            Some(item) => items::parse_group(item)?,
            None => GroupState::default(),
        };
        if !items::migrated(item, &self.cluster) {
            self.fold_in_legacy(group, item, &mut state, read_only)
                .await?;
        }
        Ok(state)
    }

    /// One consistent GetItem of the group's item.
    async fn get(&self, group: &str) -> Result<Option<Item>, StateError> {
        self.calls.count(GET_ITEM);
        let out = self
            .client
            .get_item()
            .table_name(self.table.as_ref())
            .set_key(Some(items::group_key(group)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.error(GET_ITEM, group, e))?;
        Ok(out.item)
    }

    /// After a write that stored the whole ledger: deletes the earlier layout's rows
    /// whose contents it now holds (best effort: once the item records the migration
    /// they are never read again).
    async fn after_ledger_write(&self, group: &str, change: &Change) {
        if change.ledger.is_none() {
            return;
        }
        let pending = self
            .legacy_pending
            .lock()
            .map(|mut p| p.remove(group))
            .unwrap_or(false);
        if pending {
            self.delete_legacy(group).await;
        }
    }
}

impl StateStore for DynamoState {
    async fn load(&self, group: &str) -> Result<GroupState, StateError> {
        let item = self.get(group).await?;
        self.state_from(group, item.as_ref(), false).await
    }

    async fn peek(&self, group: &str) -> Result<GroupState, StateError> {
        let item = self.get(group).await?;
        self.state_from(group, item.as_ref(), true).await
    }

    async fn load_many(&self, groups: &[String]) -> Result<Vec<(String, GroupState)>, StateError> {
        self.batch_load(groups).await
    }

    async fn glance_many(&self, groups: &[String]) -> Result<Vec<(String, Glance)>, StateError> {
        self.batch_glance(groups).await
    }

    async fn acquire(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        until: UnixMillis,
    ) -> Result<Acquire, StateError> {
        for _ in 0..ACQUIRE_ROUNDS {
            // Idempotent for its owner: a retry of a write that landed finds `#o = :me`.
            // Taking the lease clears a pending request (the first pass serves it),
            // removes the checkpoint (only a verified result writes one back) and bumps
            // the version (no write made without the lease may follow an older read).
            let me = owner.to_owned();
            let take = Update::default()
                .set("#l = if_not_exists(#l, :empty)")
                .value(
                    ":empty",
                    aws_sdk_dynamodb::types::AttributeValue::M(Default::default()),
                )
                .with_step(&protocol::take(&me, now.0, until.0));
            let holder = match self.update(group, take, true).await? {
                Ok(item) => {
                    let state = self.state_of(group, item.as_ref()).await?;
                    return Ok(Acquire::Acquired(state));
                }
                Err(old) => old
                    .as_ref()
                    .map(items::parse_group)
                    .transpose()?
                    .and_then(|s| s.lease),
            };
            let Some(holder) = holder else { continue };
            let mark = Update::step(&protocol::mark(&holder.owner, now.0));
            match self.update(group, mark, false).await? {
                Ok(_) => {
                    self.contended
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Ok(Acquire::HeldElsewhere {
                        owner: holder.owner,
                        until: holder.until,
                    });
                }
                Err(_) => tracing::debug!(
                    target_group = group,
                    "lease changed hands while acquiring; trying again"
                ),
            }
        }
        Err(StateError::Dynamo {
            operation: UPDATE_ITEM,
            message: format!(
                "the lease of {group} kept changing hands during {ACQUIRE_ROUNDS} acquire rounds; \
                 the group is retried on the next run"
            ),
        })
    }

    async fn ask_holder(
        &self,
        group: &str,
        holder: &str,
        held_after: UnixMillis,
    ) -> Result<bool, StateError> {
        let mark = Update::step(&protocol::mark(&holder.to_owned(), held_after.0));
        let asked = self.update(group, mark, false).await?.is_ok();
        if asked {
            self.contended
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(asked)
    }

    async fn renew(&self, group: &str, owner: &str, until: UnixMillis) -> Result<bool, StateError> {
        // Conditional on ownership, not expiry: a lease that expired under a slow holder
        // and that nobody took since is taken back (any other taker changes the owner).
        // Only extending: a renewal delivered after a later one changes nothing, and the
        // lease, still ours for as long, goes on.
        let me = owner.to_owned();
        let renew = Update::step(&protocol::renew(&me, until.0));
        match self.update(group, renew, false).await? {
            Ok(_) => Ok(true),
            Err(old) => {
                let old = old.as_ref().map(items::parse_record).transpose()?;
                Ok(protocol::renewed(old.as_ref(), &me, until.0))
            }
        }
    }

    async fn hand_over(
        &self,
        group: &str,
        owner: &str,
        until: UnixMillis,
    ) -> Result<bool, StateError> {
        let hand_over = Update::step(&protocol::hand_over(&owner.to_owned(), until.0));
        Ok(self.update(group, hand_over, false).await?.is_ok())
    }

    async fn write(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        version: u64,
        change: &Change,
    ) -> Result<u64, StateError> {
        if change.is_empty() {
            return Ok(version);
        }
        let me = owner.to_owned();
        let write = Update::default()
            .change(change, &self.cluster)
            .with_step(&protocol::write(&me, now.0, version));
        match self.update(group, write, false).await {
            Ok(Ok(_)) => {
                self.after_ledger_write(group, change).await;
                Ok(version + 1)
            }
            Ok(Err(old)) => {
                // A retry of a write that had landed is refused by its own version.
                let old = old.as_ref().map(items::parse_record).transpose()?;
                if protocol::write_landed(old.as_ref(), &me, version) {
                    self.after_ledger_write(group, change).await;
                    return Ok(version + 1);
                }
                Err(StateError::LeaseLost {
                    group: group.to_owned(),
                })
            }
            Err(StateError::TooLarge { group, .. }) => Err(StateError::TooLarge {
                group,
                targets: change.ledger.as_ref().map_or(0, BTreeMap::len),
            }),
            Err(e) => Err(e),
        }
    }

    async fn release(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        version: u64,
        until: UnixMillis,
        change: &Change,
        linger: bool,
    ) -> Result<Release, StateError> {
        let me = owner.to_owned();
        let changes = !change.is_empty();
        let release = Update::default()
            .change(change, &self.cluster)
            .with_step(&protocol::release(&me, now.0, version, changes, linger));
        let old = match self.update(group, release, false).await? {
            Ok(_) => {
                self.after_ledger_write(group, change).await;
                return Ok(Release::Released);
            }
            Err(old) => old.as_ref().map(items::parse_record).transpose()?,
        };
        match protocol::release_refused(old.as_ref(), &me, now.0, version, changes) {
            protocol::Refused::Landed => return Ok(Release::Released),
            protocol::Refused::Lost => return Ok(Release::Lost),
            protocol::Refused::RunAgain => {}
        }
        // Asked to run again: keep the lease, clear the flag, and still write the change.
        let again = Update::default()
            .change(change, &self.cluster)
            .with_step(&protocol::run_again(&me, now.0, version, until.0, changes));
        match self.update(group, again, true).await? {
            Ok(item) => {
                self.after_ledger_write(group, change).await;
                Ok(Release::RunAgain(
                    self.state_of(group, item.as_ref()).await?,
                ))
            }
            Err(_) => Ok(Release::Lost),
        }
    }

    async fn abandon(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        version: u64,
        change: &Change,
        dirty: bool,
        linger: bool,
    ) -> Result<(), StateError> {
        let me = owner.to_owned();
        let give_up =
            Update::default()
                .change(change, &self.cluster)
                .with_step(&protocol::give_up(
                    &me,
                    now.0,
                    version,
                    !change.is_empty(),
                    dirty,
                    linger,
                ));
        if self.update(group, give_up, false).await?.is_ok() {
            self.after_ledger_write(group, change).await;
            return Ok(());
        }
        // Expired meanwhile: write nothing, but give back what may still be ours (and
        // leave the request for the next holder). After an abandoned attempt the holder
        // stays recorded: its expiry lets a taker in only after the grace.
        if let Some(step) = protocol::just_go(&me, dirty, linger) {
            self.update(group, Update::step(&step), false).await?.ok();
        }
        Ok(())
    }

    async fn record_verified(
        &self,
        group: &str,
        version: u64,
        expired_before: UnixMillis,
        checkpoint: Checkpoint,
    ) -> Result<bool, StateError> {
        let change = Change {
            checkpoint: Some(Some(checkpoint)),
            ..Change::default()
        };
        let write = Update::default()
            .change(&change, &self.cluster)
            .with_step(&protocol::verified(version, expired_before.0));
        Ok(self.update(group, write, false).await?.is_ok())
    }

    async fn indexed_groups(
        &self,
        cluster: &str,
    ) -> Result<std::collections::BTreeSet<String>, StateError> {
        self.read_index(cluster).await
    }

    async fn indexed_selections(
        &self,
        cluster: &str,
    ) -> Result<Vec<crate::state::IndexedGroup>, StateError> {
        self.read_index_selections(cluster).await
    }

    async fn sync_index(
        &self,
        cluster: &str,
        updates: &[crate::state::IndexUpdate<'_>],
    ) -> Result<Option<u64>, StateError> {
        self.write_index(cluster, updates).await
    }

    async fn index_meta(&self, cluster: &str) -> Result<crate::state::IndexMeta, StateError> {
        self.read_index_meta(cluster).await
    }

    async fn request_passes(&self, cluster: &str, groups: &[String]) -> Result<(), StateError> {
        self.hand_on(cluster, groups).await
    }

    async fn take_requests(&self, cluster: &str, groups: &[String]) -> Result<(), StateError> {
        self.requests(cluster, groups, "DELETE").await
    }

    async fn retire(
        &self,
        group: &str,
        cluster: &str,
        version: u64,
        expired_before: UnixMillis,
        delete: bool,
    ) -> Result<bool, StateError> {
        self.remove_from_index(group, cluster, version, expired_before, delete)
            .await
    }
}
