//! Each cluster's index of its bound groups and of the groups holding its ledger
//! entries (see `items`): one Query lists them, a PutItem writes one (and an UpdateItem
//! bumps the index's generation), and a transaction removes one only if its group's item
//! is unchanged and unleased.

use std::collections::BTreeSet;

use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Delete, PutRequest, TransactWriteItem, WriteRequest,
};
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use super::items::{self, Item};
use super::{
    BATCH_WRITE_ITEM, DynamoState, GET_ITEM, PUT_ITEM, QUERY, TRANSACT_WRITE_ITEMS, UPDATE_ITEM,
    build_error,
};
use crate::core::{AddressFamily, Binding, GroupFacts, Selector, UnixMillis};
use crate::state::{IndexMeta, IndexUpdate, IndexedGroup, StateError};

/// One row of a cluster's index, as read.
struct IndexRow {
    group: String,
    namespace: Option<String>,
    selector: Option<String>,
    described: Option<(String, GroupFacts)>,
    binding: Option<u64>,
    bound: bool,
}

/// The group's name and facts a row records, if it records them all.
fn described(row: &items::Item) -> Option<(String, GroupFacts)> {
    let text = |name| row.get(name).and_then(|v| v.as_s().ok());
    let family = AddressFamily::from_ip_address_type(Some(text(items::INDEX_IP_TYPE)?))?;
    let facts = GroupFacts {
        target_type: text(items::INDEX_TARGET_TYPE)?.clone(),
        port: row
            .get(items::INDEX_PORT)
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse().ok()),
        family,
        quic: *row.get(items::INDEX_QUIC)?.as_bool().ok()?,
    };
    Some((text(items::INDEX_NAME)?.clone(), facts))
}

/// Writes of one hand-off in flight at once.
const IN_FLIGHT: usize = 16;

/// `group`'s row in `cluster`'s index: its binding's namespace, selector and
/// fingerprint, the group's name and facts, bound.
fn row(group: &str, cluster: &str, binding: &Binding, (name, facts): (&str, &GroupFacts)) -> Item {
    let mut row = items::index_key(cluster, group);
    let text = |v: &str| AttributeValue::S(v.to_owned());
    row.insert(items::INDEX_NAMESPACE.to_owned(), text(&binding.namespace));
    row.insert(
        items::INDEX_SELECTOR.to_owned(),
        text(&binding.selector.to_string()),
    );
    row.insert(items::INDEX_NAME.to_owned(), text(name));
    row.insert(
        items::INDEX_TARGET_TYPE.to_owned(),
        text(&facts.target_type),
    );
    if let Some(port) = facts.port {
        row.insert(items::INDEX_PORT.to_owned(), items::n(u64::from(port)));
    }
    row.insert(
        items::INDEX_IP_TYPE.to_owned(),
        text(facts.family.ip_address_type()),
    );
    row.insert(
        items::INDEX_QUIC.to_owned(),
        AttributeValue::Bool(facts.quic),
    );
    row.insert(
        items::INDEX_BINDING.to_owned(),
        items::n(binding.fingerprint()),
    );
    row.insert(items::INDEX_BOUND.to_owned(), AttributeValue::Bool(true));
    row
}

impl DynamoState {
    /// The rows of `cluster`'s index (every page): each group, with the namespace and
    /// selector its row records (rows written before they were recorded have none).
    async fn index_rows(&self, cluster: &str) -> Result<Vec<IndexRow>, StateError> {
        let mut pages = self
            .client
            .query()
            .table_name(self.table.as_ref())
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", AttributeValue::S(items::index_partition(cluster)))
            .projection_expression("sk, #ns, #sel, #name, #tt, #port, #ipt, #quic, #bnd, #bound")
            .expression_attribute_names("#ns", items::INDEX_NAMESPACE)
            .expression_attribute_names("#sel", items::INDEX_SELECTOR)
            .expression_attribute_names("#name", items::INDEX_NAME)
            .expression_attribute_names("#tt", items::INDEX_TARGET_TYPE)
            .expression_attribute_names("#port", items::INDEX_PORT)
            .expression_attribute_names("#ipt", items::INDEX_IP_TYPE)
            .expression_attribute_names("#quic", items::INDEX_QUIC)
            .expression_attribute_names("#bnd", items::INDEX_BINDING)
            .expression_attribute_names("#bound", items::INDEX_BOUND)
            .set_limit(self.query_page_limit)
            .into_paginator()
            .send();
        let mut rows = Vec::new();
        while let Some(page) = pages.next().await {
            self.calls.count(QUERY);
            let page = page.map_err(|e| self.error(QUERY, cluster, e))?;
            rows.extend(page.items().iter().filter_map(|row| {
                let text = |name| row.get(name).and_then(|v| v.as_s().ok()).cloned();
                Some(IndexRow {
                    group: text(items::SK)?,
                    namespace: text(items::INDEX_NAMESPACE),
                    selector: text(items::INDEX_SELECTOR),
                    described: described(row),
                    binding: row
                        .get(items::INDEX_BINDING)
                        .and_then(|v| v.as_n().ok())
                        .and_then(|n| n.parse().ok()),
                    bound: row
                        .get(items::INDEX_BOUND)
                        .and_then(|v| v.as_bool().ok())
                        .is_none_or(|b| *b),
                })
            }));
        }
        Ok(rows)
    }

    /// The groups in `cluster`'s index.
    pub(super) async fn read_index(&self, cluster: &str) -> Result<BTreeSet<String>, StateError> {
        Ok(self
            .index_rows(cluster)
            .await?
            .into_iter()
            .map(|row| row.group)
            .collect())
    }

    /// Each row of `cluster`'s index that records its namespace and selector.
    pub(super) async fn read_index_selections(
        &self,
        cluster: &str,
    ) -> Result<Vec<IndexedGroup>, StateError> {
        Ok(self
            .index_rows(cluster)
            .await?
            .into_iter()
            .filter_map(|row| {
                Some(IndexedGroup {
                    namespace: row.namespace?,
                    selector: row.selector.and_then(|s| Selector::parse(&s).ok()),
                    group: row.group,
                    described: row.described,
                    binding: row.binding,
                    bound: row.bound,
                })
            })
            .collect())
    }

    /// Writes `updates` to `cluster`'s index where its rows do not say so already and,
    /// when one was written, bumps its generation; the new generation.
    pub(super) async fn write_index(
        &self,
        cluster: &str,
        updates: &[IndexUpdate<'_>],
    ) -> Result<Option<u64>, StateError> {
        let mut written = false;
        let bound: Vec<Item> = updates
            .iter()
            .filter_map(|u| match *u {
                IndexUpdate::Bound {
                    group,
                    binding,
                    described,
                } => Some(row(group, cluster, binding, described)),
                IndexUpdate::Unbound { .. } => None,
            })
            .collect();
        match <[Item; 1]>::try_from(bound) {
            // One row (a pass's): written only if it does not say so already.
            Ok([row]) => written |= self.put_row(row).await?,
            // Discovery's: rows it found to differ, in batches.
            Err(rows) if !rows.is_empty() => {
                let requests = rows
                    .into_iter()
                    .map(|item| {
                        let put = PutRequest::builder()
                            .set_item(Some(item))
                            .build()
                            .map_err(|e| build_error(BATCH_WRITE_ITEM, e))?;
                        Ok(WriteRequest::builder().put_request(put).build())
                    })
                    .collect::<Result<Vec<_>, StateError>>()?;
                self.batch_write(requests).await?;
                written = true;
            }
            Err(_) => {}
        }
        for update in updates {
            if let IndexUpdate::Unbound { group } = *update {
                written |= self.mark_unbound(group, cluster).await?;
            }
        }
        if !written {
            return Ok(None);
        }
        self.calls.count(UPDATE_ITEM);
        let out = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(items::index_meta_key(cluster)))
            .update_expression("ADD #g :one")
            .expression_attribute_names("#g", items::META_GENERATION)
            .expression_attribute_values(":one", items::n(1))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedNew)
            .send()
            .await
            .map_err(|e| self.error(UPDATE_ITEM, cluster, e))?;
        Ok(out
            .attributes()
            .and_then(|a| a.get(items::META_GENERATION))
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse().ok()))
    }

    /// `cluster`'s index meta item (generation 0 when it has none).
    pub(super) async fn read_index_meta(&self, cluster: &str) -> Result<IndexMeta, StateError> {
        self.calls.count(GET_ITEM);
        let out = self
            .client
            .get_item()
            .table_name(self.table.as_ref())
            .set_key(Some(items::index_meta_key(cluster)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.error(GET_ITEM, cluster, e))?;
        let item = out.item();
        let generation = item
            .and_then(|i| i.get(items::META_GENERATION))
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        let requested = item
            .and_then(|i| i.get(items::META_REQUESTED))
            .and_then(|v| v.as_ss().ok())
            .map(|arns| arns.iter().cloned().collect())
            .unwrap_or_default();
        Ok(IndexMeta {
            generation,
            requested,
        })
    }

    /// Sets each group's `dirty` flag (where it is not set; up to [`IN_FLIGHT`] writes
    /// at a time) and adds the groups to `cluster`'s handed-on requests.
    pub(super) async fn hand_on(&self, cluster: &str, groups: &[String]) -> Result<(), StateError> {
        for chunk in groups.chunks(IN_FLIGHT) {
            let writes: Vec<_> = chunk.iter().map(|g| self.set_dirty(g)).collect();
            futures::future::try_join_all(writes).await?;
        }
        self.requests(cluster, groups, "ADD").await
    }

    /// Sets `group`'s `dirty` flag unless it is set.
    async fn set_dirty(&self, group: &str) -> Result<(), StateError> {
        self.calls.count(UPDATE_ITEM);
        let result = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(items::group_key(group)))
            .update_expression("SET #d = :true")
            .condition_expression("attribute_not_exists(#d) OR #d = :false")
            .expression_attribute_names("#d", "dirty")
            .expression_attribute_values(":true", AttributeValue::Bool(true))
            .expression_attribute_values(":false", AttributeValue::Bool(false))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(()),
            Err(e) => Err(self.error(UPDATE_ITEM, group, e)),
        }
    }

    /// Adds `groups` to (`ADD`) or takes them out of (`DELETE`) `cluster`'s handed-on
    /// requests.
    pub(super) async fn requests(
        &self,
        cluster: &str,
        groups: &[String],
        verb: &str,
    ) -> Result<(), StateError> {
        if groups.is_empty() {
            return Ok(());
        }
        self.calls.count(UPDATE_ITEM);
        self.client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(items::index_meta_key(cluster)))
            .update_expression(format!("{verb} #r :arns"))
            .expression_attribute_names("#r", items::META_REQUESTED)
            .expression_attribute_values(":arns", AttributeValue::Ss(groups.to_vec()))
            .send()
            .await
            .map_err(|e| self.error(UPDATE_ITEM, cluster, e))?;
        Ok(())
    }

    /// Puts `row` in its cluster's index unless the row there records the same
    /// binding as bound already; whether it was written.
    async fn put_row(&self, row: Item) -> Result<bool, StateError> {
        self.calls.count(PUT_ITEM);
        let group = row
            .get(items::SK)
            .and_then(|v| v.as_s().ok())
            .cloned()
            .unwrap_or_default();
        let fingerprint = row
            .get(items::INDEX_BINDING)
            .cloned()
            .unwrap_or_else(|| items::n(0));
        let result = self
            .client
            .put_item()
            .table_name(self.table.as_ref())
            .set_item(Some(row))
            .condition_expression(
                "attribute_not_exists(#bnd) OR #bnd <> :bnd OR attribute_not_exists(#name) OR #bound = :false",
            )
            .expression_attribute_names("#bnd", items::INDEX_BINDING)
            .expression_attribute_names("#name", items::INDEX_NAME)
            .expression_attribute_names("#bound", items::INDEX_BOUND)
            .expression_attribute_values(":bnd", fingerprint)
            .expression_attribute_values(":false", AttributeValue::Bool(false))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(false),
            Err(e) => Err(self.error(PUT_ITEM, &group, e)),
        }
    }

    /// Marks `group`'s row in `cluster`'s index as no longer bound (no row, or marked
    /// already: nothing); whether it was written.
    async fn mark_unbound(&self, group: &str, cluster: &str) -> Result<bool, StateError> {
        self.calls.count(UPDATE_ITEM);
        let result = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(items::index_key(cluster, group)))
            .update_expression("SET #bound = :false")
            .condition_expression(
                "attribute_exists(sk) AND (attribute_not_exists(#bound) OR #bound = :true)",
            )
            .expression_attribute_names("#bound", items::INDEX_BOUND)
            .expression_attribute_values(":false", AttributeValue::Bool(false))
            .expression_attribute_values(":true", AttributeValue::Bool(true))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(false),
            Err(e) => Err(self.error(UPDATE_ITEM, group, e)),
        }
    }

    /// Deletes `group`'s row from `cluster`'s index (and, with `delete`, the group's
    /// item), in one transaction conditional on the item being unchanged since
    /// `version`, unleased and not asked for a pass at `now`.
    pub(super) async fn remove_from_index(
        &self,
        group: &str,
        cluster: &str,
        version: u64,
        expired_before: UnixMillis,
        delete: bool,
    ) -> Result<bool, StateError> {
        let op = TRANSACT_WRITE_ITEMS;
        // The protocol's guard (unchanged, the lease free past its takeover grace, no
        // pass asked for), rendered as every lease write is.
        let mut guard = super::update::Update::step(&crate::core::lease_protocol::Step {
            guard: crate::core::lease_protocol::retire(version, expired_before.0),
            effect: crate::core::lease_protocol::Effect::default(),
        });
        if delete {
            guard = guard
                .and_condition("attribute_not_exists(#l) OR size(#l) = :zero")
                .value(":zero", items::n(0));
        }
        let condition = guard.condition_expression().unwrap_or_default();
        let names = guard.names();
        let values = guard.values().unwrap_or_default();
        let key = items::group_key(group);
        // One key and condition: a Delete of the item, or only a check of it.
        macro_rules! guarded {
            ($kind:ident) => {
                $kind::builder()
                    .table_name(self.table.as_ref())
                    .set_key(Some(key))
                    .condition_expression(condition)
                    .set_expression_attribute_names(Some(names))
                    .set_expression_attribute_values(Some(values))
                    .build()
                    .map_err(|e| build_error(op, e))?
            };
        }
        let guard = if delete {
            TransactWriteItem::builder().delete(guarded!(Delete))
        } else {
            TransactWriteItem::builder().condition_check(guarded!(ConditionCheck))
        };
        let drop_row = TransactWriteItem::builder().delete(
            Delete::builder()
                .table_name(self.table.as_ref())
                .set_key(Some(items::index_key(cluster, group)))
                .build()
                .map_err(|e| build_error(op, e))?,
        );
        self.calls.count(op);
        match self
            .client
            .transact_write_items()
            .transact_items(guard.build())
            .transact_items(drop_row.build())
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("TransactionCanceledException") => Ok(false),
            Err(e) => Err(self.error(op, group, e)),
        }
    }
}
