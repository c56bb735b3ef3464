//! BatchWriteItem in chunks of 25 with bounded retries of `UnprocessedItems`, and
//! BatchGetItem (items whole, or glances without ledgers) in chunks of 100 with bounded
//! retries of `UnprocessedKeys`.
//!
//! DynamoDB may accept a batch yet leave some of it unprocessed (throttled partitions,
//! an answer over 16 MB); that is not an error response, so the SDK does not retry it.
//! AWS's guidance is to resend the rest with exponential backoff. After a bounded number
//! of rounds a write is reported as failed, the reconcile stops before touching ELBv2,
//! and the group backs off (the write-ahead rule: no RegisterTargets without its ledger
//! rows); keys still unread after two resends are left out of the answer, and each is
//! read alone later.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::{KeysAndAttributes, WriteRequest};

use super::items::{self, Item};
use super::{BATCH_GET_ITEM, BATCH_WRITE_ITEM, DynamoState};
use crate::state::{Glance, GroupState, StateError};

/// BatchWriteItem's limit on requests per call.
pub(super) const BATCH_SIZE: usize = 25;

/// BatchGetItem's limit on keys per call.
const READ_BATCH_SIZE: usize = 100;

/// Rounds of resending unprocessed keys: a read ahead is only worth its freshness, and a
/// key left out is read alone later.
const MAX_UNREAD_RETRIES: u32 = 2;

/// Rounds of resending unprocessed items before giving up (at most about 5 s of backoff in all).
const MAX_UNPROCESSED_RETRIES: u32 = 6;

/// Backoff before resend `round` (1-based): full jitter under 50 ms · 2^round, at most 2 s.
fn delay(round: u32) -> Duration {
    let ceiling = 50u64.saturating_mul(1 << round.min(16)).min(2_000);
    Duration::from_millis(fastrand::u64(ceiling / 2..=ceiling))
}

impl DynamoState {
    /// Writes `requests` (puts or deletes of distinct keys) in batches of 25, resending
    /// unprocessed items with backoff.
    pub(super) async fn batch_write(&self, requests: Vec<WriteRequest>) -> Result<(), StateError> {
        for chunk in requests.chunks(BATCH_SIZE) {
            let mut pending = chunk.to_vec();
            let mut round = 0;
            loop {
                self.calls.count(BATCH_WRITE_ITEM);
                let out = self
                    .client
                    .batch_write_item()
                    .request_items(self.table.as_ref(), pending)
                    .send()
                    .await
                    .map_err(|e| self.error(BATCH_WRITE_ITEM, "", e))?;
                pending = out
                    .unprocessed_items
                    .and_then(|mut m| m.remove(self.table.as_ref()))
                    .unwrap_or_default();
                if pending.is_empty() {
                    break;
                }
                round += 1;
                if round > MAX_UNPROCESSED_RETRIES {
                    return Err(StateError::Dynamo {
                        operation: BATCH_WRITE_ITEM,
                        message: format!(
                            "{} write(s) still unprocessed after {MAX_UNPROCESSED_RETRIES} retries \
                             (table throttled?); the group is retried later",
                            pending.len()
                        ),
                    });
                }
                tracing::debug!(
                    unprocessed = pending.len(),
                    round,
                    "resending unprocessed writes"
                );
                tokio::time::sleep(delay(round)).await;
            }
        }
        Ok(())
    }

    /// Reads the items of `groups` whole with consistent BatchGetItems of up to 100
    /// keys, resending unprocessed keys with backoff; the states of the groups read, in
    /// no particular order. Never writes.
    pub(super) async fn batch_load(
        &self,
        groups: &[String],
    ) -> Result<Vec<(String, GroupState)>, StateError> {
        self.batch_read(groups, None, items::parse_group).await
    }

    /// As [`Self::batch_load`], but glances: the items without ledgers and pod versions.
    pub(super) async fn batch_glance(
        &self,
        groups: &[String],
    ) -> Result<Vec<(String, Glance)>, StateError> {
        let projection = items::glance_projection();
        self.batch_read(groups, Some(projection), items::parse_glance)
            .await
    }

    /// Reads `groups`' items (only the attributes of `projection`, an expression and
    /// the names it uses, when given) and parses each with `parse`.
    async fn batch_read<T>(
        &self,
        groups: &[String],
        projection: Option<(String, HashMap<String, String>)>,
        parse: fn(&Item) -> Result<T, StateError>,
    ) -> Result<Vec<(String, T)>, StateError> {
        let (projection, names) = projection.unzip();
        let mut states = Vec::with_capacity(groups.len());
        for chunk in groups.chunks(READ_BATCH_SIZE) {
            let mut found: Vec<Item> = Vec::with_capacity(chunk.len());
            let mut pending: Vec<Item> = chunk.iter().map(|g| items::group_key(g)).collect();
            let mut round = 0;
            loop {
                let keys = KeysAndAttributes::builder()
                    .set_keys(Some(pending))
                    .consistent_read(true)
                    .set_projection_expression(projection.clone())
                    .set_expression_attribute_names(names.clone())
                    .build()
                    .map_err(|e| super::build_error(BATCH_GET_ITEM, e))?;
                self.calls.count(BATCH_GET_ITEM);
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(self.table.as_ref(), keys)
                    .send()
                    .await
                    .map_err(|e| self.error(BATCH_GET_ITEM, "", e))?;
                found.extend(
                    out.responses
                        .and_then(|mut r| r.remove(self.table.as_ref()))
                        .unwrap_or_default(),
                );
                pending = out
                    .unprocessed_keys
                    .and_then(|mut u| u.remove(self.table.as_ref()))
                    .map(|k| k.keys)
                    .unwrap_or_default();
                if pending.is_empty() {
                    break;
                }
                round += 1;
                if round > MAX_UNREAD_RETRIES {
                    tracing::debug!(
                        unprocessed = pending.len(),
                        "keys still unprocessed; each is read alone when its group is looked at"
                    );
                    break;
                }
                tracing::debug!(
                    unprocessed = pending.len(),
                    round,
                    "resending unprocessed reads"
                );
                tokio::time::sleep(delay(round)).await;
            }
            // Keys still unprocessed are not in `found`: they are left out below.
            let mut by_group: HashMap<String, Item> = found
                .into_iter()
                .filter_map(|item| Some((items::group_of_key(&item)?, item)))
                .collect();
            for group in chunk {
                // Left out, so that its look reads it alone: a group with no item yet,
                // or whose item does not record that this cluster's rows of the earlier
                // layout were folded in (that read folds them in and records it, a
                // Query and a write), and an item that cannot be understood (that read
                // reports the error for that group only; a glance does not read the
                // ledger, whose errors the group's next whole read finds).
                let Some(item) = by_group
                    .remove(group)
                    .filter(|i| items::migrated(Some(i), &self.cluster))
                else {
                    continue;
                };
                if let Ok(state) = parse(&item) {
                    states.push((group.clone(), state));
                }
            }
        }
        Ok(states)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_and_are_capped() {
        for round in 1..=MAX_UNPROCESSED_RETRIES + 5 {
            let d = delay(round);
            assert!(d <= Duration::from_secs(2), "{round}: {d:?}");
            assert!(d >= Duration::from_millis(50), "{round}: {d:?}");
        }
    }
}
