//! Each cluster's index of the groups holding its ledger entries (see `items`): one
//! Query lists them, a PutItem adds one, and a transaction removes one only if its
//! group's item is unchanged and unleased.

use std::collections::BTreeSet;

use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, Delete, TransactWriteItem};
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use super::items::{self, NAMES};
use super::{DynamoState, PUT_ITEM, QUERY, TRANSACT_WRITE_ITEMS, build_error};
use crate::core::{Binding, Selector, UnixMillis};
use crate::state::{IndexedGroup, StateError};

/// One row of a cluster's index, as read.
struct IndexRow {
    group: String,
    namespace: Option<String>,
    selector: Option<String>,
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
            .projection_expression("sk, #ns, #sel")
            .expression_attribute_names("#ns", items::INDEX_NAMESPACE)
            .expression_attribute_names("#sel", items::INDEX_SELECTOR)
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
                })
            })
            .collect())
    }

    /// Puts `group`'s row in `cluster`'s index, with its binding's namespace and
    /// selector.
    pub(super) async fn add_to_index(
        &self,
        group: &str,
        cluster: &str,
        binding: &Binding,
    ) -> Result<(), StateError> {
        self.calls.count(PUT_ITEM);
        let mut row = items::index_key(cluster, group);
        row.insert(
            items::INDEX_NAMESPACE.to_owned(),
            AttributeValue::S(binding.namespace.clone()),
        );
        row.insert(
            items::INDEX_SELECTOR.to_owned(),
            AttributeValue::S(binding.selector.to_string()),
        );
        self.client
            .put_item()
            .table_name(self.table.as_ref())
            .set_item(Some(row))
            .send()
            .await
            .map_err(|e| self.error(PUT_ITEM, group, e))?;
        Ok(())
    }

    /// Deletes `group`'s row from `cluster`'s index (and, with `delete`, the group's
    /// item), in one transaction conditional on the item being unchanged since
    /// `version`, unleased and not asked for a pass at `now`.
    pub(super) async fn remove_from_index(
        &self,
        group: &str,
        cluster: &str,
        version: u64,
        now: UnixMillis,
        delete: bool,
    ) -> Result<bool, StateError> {
        let op = TRANSACT_WRITE_ITEMS;
        let unchanged = if version == 0 {
            "attribute_not_exists(#v)"
        } else {
            "#v = :version"
        };
        let mut condition = format!(
            "{unchanged} AND (attribute_not_exists(#o) OR #u < :now) AND (attribute_not_exists(#d) OR #d = :false)"
        );
        if delete {
            condition.push_str(" AND (attribute_not_exists(#l) OR size(#l) = :zero)");
        }
        let names = NAMES
            .iter()
            .filter(|(p, _)| ["#v", "#o", "#u", "#d"].contains(p) || (delete && *p == "#l"))
            .map(|(p, n)| ((*p).to_owned(), (*n).to_owned()))
            .collect();
        let mut values = std::collections::HashMap::from([
            (":now".to_owned(), items::n(now.0)),
            (":false".to_owned(), AttributeValue::Bool(false)),
        ]);
        if version != 0 {
            values.insert(":version".to_owned(), items::n(version));
        }
        if delete {
            values.insert(":zero".to_owned(), items::n(0));
        }
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
