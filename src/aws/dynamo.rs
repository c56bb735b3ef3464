//! [`StateStore`] on DynamoDB: one table, one partition per (cluster, target group).
//!
//! Layout (see `items`): ledger rows `sk = "target#<ip:port>"`, the backoff row
//! `sk = "backoff"`, the lease row `sk = "lease"`. Reads are strongly consistent so a
//! ledger row written just before a crash is always seen by the next run.

mod batch;
mod items;
mod lease;
mod table;

use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::fmt::Debug;
use std::sync::Arc;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, PutRequest, WriteRequest};
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use super::calls::ApiCalls;
use super::error_summary;
use crate::core::{BackoffState, Checkpoint, Target, UnixMillis};
use crate::state::{Acquire, GroupState, LedgerRow, Release, StateError, StateStore};

pub use table::create_table;

const QUERY: &str = "Query";
const BATCH_WRITE_ITEM: &str = "BatchWriteItem";
const PUT_ITEM: &str = "PutItem";
const UPDATE_ITEM: &str = "UpdateItem";
const DELETE_ITEM: &str = "DeleteItem";

const OPERATIONS: &[&str] = &[QUERY, BATCH_WRITE_ITEM, PUT_ITEM, UPDATE_ITEM, DELETE_ITEM];

/// The DynamoDB state store of one cluster's deployment. Cheap to clone; clones share
/// the client and the call counters.
#[derive(Clone)]
pub struct DynamoState {
    client: Client,
    table: Arc<str>,
    cluster: Arc<str>,
    calls: Arc<ApiCalls>,
    query_page_limit: Option<i32>,
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

impl DynamoState {
    /// Writes a single-row record (`Some`), or deletes it (`None`): the backoff and
    /// checkpoint rows.
    async fn put_or_delete(
        &self,
        pk: &str,
        sk: &str,
        item: Option<items::Item>,
    ) -> Result<(), StateError> {
        match item {
            Some(item) => {
                self.calls.count(PUT_ITEM);
                self.client
                    .put_item()
                    .table_name(self.table.as_ref())
                    .set_item(Some(item))
                    .send()
                    .await
                    .map_err(|e| self.error(PUT_ITEM, e))?;
            }
            None => {
                self.calls.count(DELETE_ITEM);
                self.client
                    .delete_item()
                    .table_name(self.table.as_ref())
                    .set_key(Some(items::key(pk, sk)))
                    .send()
                    .await
                    .map_err(|e| self.error(DELETE_ITEM, e))?;
            }
        }
        Ok(())
    }

    /// The store for `cluster`'s rows in `table_name`. The cluster is part of every key,
    /// so deployments for different clusters can share a table without seeing each
    /// other's ledgers or leases.
    pub fn new(client: Client, table_name: impl Into<String>, cluster: impl Into<String>) -> Self {
        Self {
            client,
            table: Arc::from(table_name.into()),
            cluster: Arc::from(cluster.into()),
            calls: Arc::new(ApiCalls::new(OPERATIONS)),
            query_page_limit: None,
        }
    }

    /// Builds the client from an SDK configuration (normally [`super::sdk_config`]).
    pub fn from_sdk_config(
        config: &aws_config::SdkConfig,
        table_name: impl Into<String>,
        cluster: impl Into<String>,
    ) -> Self {
        Self::new(Client::new(config), table_name, cluster)
    }

    /// Caps the items per Query page. Only for tests: DynamoDB (and moto) page at 1 MB,
    /// which a test cannot reach cheaply, so this forces [`StateStore::load`] through its
    /// multi-page path.
    pub fn with_query_page_limit(mut self, items_per_page: i32) -> Self {
        self.query_page_limit = Some(items_per_page.max(1));
        self
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

    fn pk(&self, group: &str) -> String {
        items::partition_key(&self.cluster, group)
    }

    /// Maps an SDK error that survived retries: a missing table gets its own message
    /// (the deployment is incomplete), anything else its `Code: message`.
    fn error<E, R>(&self, operation: &'static str, err: SdkError<E, R>) -> StateError
    where
        E: ProvideErrorMetadata + Error + 'static,
        R: Debug,
    {
        match err.code() {
            Some("ResourceNotFoundException") => StateError::NoTable {
                table: self.table.to_string(),
            },
            _ => StateError::Dynamo {
                operation,
                message: error_summary(&err),
            },
        }
    }
}

/// Whether a conditional write was refused because its condition did not hold.
fn condition_failed<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> bool {
    err.code() == Some("ConditionalCheckFailedException")
}

/// A request-building error: only possible if a required field were left out, which the
/// code never does; reported rather than panicking.
fn build_error(operation: &'static str, err: impl std::fmt::Display) -> StateError {
    StateError::Dynamo {
        operation,
        message: format!("could not build the request: {err}"),
    }
}

impl StateStore for DynamoState {
    async fn load(&self, group: &str) -> Result<GroupState, StateError> {
        let mut pages = self
            .client
            .query()
            .table_name(self.table.as_ref())
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", AttributeValue::S(self.pk(group)))
            .consistent_read(true)
            .set_limit(self.query_page_limit)
            .into_paginator()
            .send();
        let mut state = GroupState::default();
        while let Some(page) = pages.next().await {
            self.calls.count(QUERY);
            let page = page.map_err(|e| self.error(QUERY, e))?;
            for item in page.items() {
                match items::parse_row(item)? {
                    items::Row::Ledger(row) => {
                        state.ledger.insert(row.target, row);
                    }
                    items::Row::Backoff(b) => state.backoff = Some(b),
                    items::Row::Checkpoint(c) => state.checkpoint = Some(c),
                    items::Row::Other => {}
                }
            }
        }
        Ok(state)
    }

    async fn record(&self, group: &str, rows: &[LedgerRow]) -> Result<(), StateError> {
        let pk = self.pk(group);
        // One request per key: BatchWriteItem rejects a batch naming a key twice.
        let unique: BTreeMap<Target, &LedgerRow> = rows.iter().map(|r| (r.target, r)).collect();
        let requests = unique
            .values()
            .map(|row| {
                PutRequest::builder()
                    .set_item(Some(items::ledger_item(&pk, &self.cluster, row)))
                    .build()
                    .map(|put| WriteRequest::builder().put_request(put).build())
                    .map_err(|e| build_error(BATCH_WRITE_ITEM, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.batch_write(requests).await
    }

    async fn remove(&self, group: &str, targets: &[Target]) -> Result<(), StateError> {
        let pk = self.pk(group);
        let unique: std::collections::BTreeSet<&Target> = targets.iter().collect();
        let requests = unique
            .into_iter()
            .map(|t| {
                DeleteRequest::builder()
                    .set_key(Some(items::key(&pk, &items::ledger_sort_key(t))))
                    .build()
                    .map(|del| WriteRequest::builder().delete_request(del).build())
                    .map_err(|e| build_error(BATCH_WRITE_ITEM, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.batch_write(requests).await
    }

    async fn set_checkpoint(
        &self,
        group: &str,
        checkpoint: Option<Checkpoint>,
    ) -> Result<(), StateError> {
        let pk = self.pk(group);
        let item = checkpoint.map(|c| items::checkpoint_item(&pk, &c));
        self.put_or_delete(&pk, items::CHECKPOINT_SK, item).await
    }

    async fn set_backoff(
        &self,
        group: &str,
        state: Option<BackoffState>,
    ) -> Result<(), StateError> {
        let pk = self.pk(group);
        let item = state.map(|b| items::backoff_item(&pk, &b));
        self.put_or_delete(&pk, items::BACKOFF_SK, item).await
    }

    async fn acquire(
        &self,
        group: &str,
        owner: &str,
        now: UnixMillis,
        until: UnixMillis,
    ) -> Result<Acquire, StateError> {
        self.acquire_lease(&self.pk(group), owner, now, until).await
    }

    async fn release(
        &self,
        group: &str,
        owner: &str,
        until: UnixMillis,
    ) -> Result<Release, StateError> {
        self.release_lease(&self.pk(group), owner, until).await
    }

    async fn abandon(&self, group: &str, owner: &str) -> Result<(), StateError> {
        self.abandon_lease(&self.pk(group), owner).await
    }
}

/// Values for expressions, built from pairs.
fn values<const N: usize>(pairs: [(&str, AttributeValue); N]) -> HashMap<String, AttributeValue> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}
