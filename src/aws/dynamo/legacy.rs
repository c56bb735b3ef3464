//! Upgrading from the earlier layout (one partition per cluster and group, a row per
//! ledger target) without losing ownership.
//!
//! Until a group's item records that this cluster's rows were folded in (`migrated`),
//! every state read also reads those rows (one Query) and adds them to the ledger, so
//! targets registered by the earlier version stay owned. The first write that stores the
//! whole ledger records the migration; a read that finds rows and nobody holding the
//! lease stores them at once; a read that finds none records the migration with an
//! idempotent `ADD`. The rows are deleted once stored.

use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, WriteRequest};

use super::items::{self, Item, Legacy};
use super::update::Update;
use super::{BATCH_WRITE_ITEM, DynamoState, QUERY, build_error};
use crate::state::{Change, GroupState, StateError};

impl DynamoState {
    /// Reads this cluster's rows of the earlier layout for `group` and folds them into
    /// `state` (entries the item already has win; backoff and checkpoint only fill gaps),
    /// then records the migration in the item when that is safe.
    pub(super) async fn fold_in_legacy(
        &self,
        group: &str,
        item: Option<&Item>,
        state: &mut GroupState,
        read_only: bool,
    ) -> Result<(), StateError> {
        let legacy = self.read_legacy(group).await?;
        if legacy.sort_keys.is_empty() {
            if read_only {
                return Ok(());
            }
            // Nothing to migrate: record it so later reads skip the Query.
            let mark = Update::default().add("#m :cluster").value(
                ":cluster",
                AttributeValue::Ss(vec![self.cluster.to_string()]),
            );
            if let Err(e) = self.update(group, mark, false).await {
                tracing::debug!(target_group = group, error = %e, "recording the migration failed; retried on the next read");
            }
            return Ok(());
        }
        tracing::info!(
            target_group = group,
            rows = legacy.sort_keys.len(),
            "folding in ledger rows of the earlier table layout"
        );
        let Legacy {
            ledger,
            backoff,
            checkpoint,
            ..
        } = legacy;
        for (target, entry) in ledger {
            state.ledger.entry(target).or_insert(entry);
        }
        if state.backoff.is_none() {
            state.backoff = backoff;
        }
        if state.checkpoint.is_none() {
            state.checkpoint = checkpoint;
        }
        if read_only {
            return Ok(());
        }
        if let Ok(mut pending) = self.legacy_pending.lock() {
            pending.insert(group.to_owned());
        }
        // Store them now unless a lease is recorded (its holder's next write stores them).
        let unchanged = if item.is_some_and(|i| i.contains_key("version")) {
            "#v = :version"
        } else {
            "attribute_not_exists(#v)"
        };
        let store = Update::default()
            .change(
                &Change {
                    ledger: Some(state.ledger.clone()),
                    backoff: state.backoff.map(Some),
                    held: None,
                    checkpoint: state.checkpoint.map(Some),
                    seen: None,
                },
                &self.cluster,
            )
            .condition(format!("{unchanged} AND attribute_not_exists(#o)"))
            .value(":version", items::n(state.version));
        match self.update(group, store, false).await? {
            Ok(_) => {
                state.version += 1;
                if let Ok(mut pending) = self.legacy_pending.lock() {
                    pending.remove(group);
                }
                self.delete_legacy(group).await;
            }
            Err(_) => tracing::debug!(
                target_group = group,
                "the group changed or is leased; its next write stores the folded-in rows"
            ),
        }
        Ok(())
    }

    /// Every row of `group`'s partition in the earlier layout, for this cluster.
    async fn read_legacy(&self, group: &str) -> Result<Legacy, StateError> {
        let pk = items::legacy_partition(&self.cluster, group);
        let mut pages = self
            .client
            .query()
            .table_name(self.table.as_ref())
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", AttributeValue::S(pk))
            .consistent_read(true)
            .set_limit(self.query_page_limit)
            .into_paginator()
            .send();
        let mut legacy = Legacy::default();
        while let Some(page) = pages.next().await {
            self.calls.count(QUERY);
            let page = page.map_err(|e| self.error(QUERY, group, e))?;
            for row in page.items() {
                items::parse_legacy_row(row, &self.cluster, &mut legacy)?;
            }
        }
        Ok(legacy)
    }

    /// Deletes `group`'s rows of the earlier layout (best effort).
    pub(super) async fn delete_legacy(&self, group: &str) {
        let pk = items::legacy_partition(&self.cluster, group);
        let rows = match self.read_legacy(group).await {
            Ok(l) => l.sort_keys,
            Err(e) => {
                tracing::warn!(target_group = group, error = %e, "reading rows of the earlier layout for deletion failed");
                return;
            }
        };
        let requests: Result<Vec<WriteRequest>, StateError> = rows
            .iter()
            .map(|sk| {
                DeleteRequest::builder()
                    .set_key(Some(items::key(&pk, sk)))
                    .build()
                    .map(|del| WriteRequest::builder().delete_request(del).build())
                    .map_err(|e| build_error(BATCH_WRITE_ITEM, e))
            })
            .collect();
        let result = match requests {
            Ok(requests) => self.batch_write(requests).await,
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::warn!(target_group = group, error = %e, "deleting rows of the earlier layout failed; they are ignored from now on");
        }
    }
}
