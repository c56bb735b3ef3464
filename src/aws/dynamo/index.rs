//! Each cluster's index of the groups holding its ledger entries (see `items`): one
//! Query lists them, a PutItem adds one, and a transaction removes one only if its
//! group's item is unchanged and unleased.

use std::collections::BTreeSet;

use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, Delete, TransactWriteItem};
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use super::items::{self, NAMES};
use super::{DynamoState, PUT_ITEM, QUERY, TRANSACT_WRITE_ITEMS, build_error};
use crate::core::{AddressFamily, Binding, GroupFacts, Selector, UnixMillis};
use crate::state::{IndexedGroup, StateError};

/// One row of a cluster's index, as read.
struct IndexRow {
    group: String,
    namespace: Option<String>,
    selector: Option<String>,
    described: Option<(String, GroupFacts)>,
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
            .projection_expression("sk, #ns, #sel, #name, #tt, #port, #ipt, #quic")
            .expression_attribute_names("#ns", items::INDEX_NAMESPACE)
            .expression_attribute_names("#sel", items::INDEX_SELECTOR)
            .expression_attribute_names("#name", items::INDEX_NAME)
            .expression_attribute_names("#tt", items::INDEX_TARGET_TYPE)
            .expression_attribute_names("#port", items::INDEX_PORT)
            .expression_attribute_names("#ipt", items::INDEX_IP_TYPE)
            .expression_attribute_names("#quic", items::INDEX_QUIC)
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
                })
            })
            .collect())
    }

    /// Puts `group`'s row in `cluster`'s index, with its binding's namespace and
    /// selector and the group's name and facts.
    pub(super) async fn add_to_index(
        &self,
        group: &str,
        cluster: &str,
        binding: &Binding,
        (name, facts): (&str, &GroupFacts),
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
        let text = |v: &str| AttributeValue::S(v.to_owned());
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
