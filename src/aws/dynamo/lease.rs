//! The per-group lease: at most one reconcile of a group at a time, across both
//! functions and every concurrent invocation, with the workqueue's "dirty" guarantee (a
//! group changed while it was being reconciled is reconciled again).
//!
//! Everything is a single conditional write, so the lease is correct under any
//! interleaving; the TTL attribute only sweeps abandoned rows eventually.

use aws_sdk_dynamodb::types::AttributeValue;

use super::items::{self, EXPIRES_AT, LEASE_SK};
use super::{DELETE_ITEM, DynamoState, PUT_ITEM, UPDATE_ITEM, condition_failed, values};
use crate::core::UnixMillis;
use crate::state::{Acquire, Release, StateError};

/// Rounds of "take it / mark it dirty" before giving up: each failed round means the
/// holder released (or the lease expired) between our two writes, which is rare.
const ACQUIRE_ROUNDS: u32 = 3;

/// `owner` is a DynamoDB reserved word, so expressions name it through this alias.
const OWNER: (&str, &str) = ("#owner", "owner");

impl DynamoState {
    /// Takes the lease if it is free, expired at `now`, or unreadable; otherwise sets
    /// the holder's `dirty` flag. Retries when the lease changes hands between the two.
    pub(super) async fn acquire_lease(
        &self,
        pk: &str,
        owner: &str,
        now: UnixMillis,
        until: UnixMillis,
    ) -> Result<Acquire, StateError> {
        for _ in 0..ACQUIRE_ROUNDS {
            self.calls.count(PUT_ITEM);
            let put = self
                .client
                .put_item()
                .table_name(self.table.as_ref())
                .set_item(Some(items::lease_item(pk, owner, until)))
                .condition_expression(
                    "attribute_not_exists(pk) OR attribute_not_exists(leaseUntil) OR leaseUntil < :now",
                )
                .set_expression_attribute_values(Some(values([(":now", items::n(now.0))])))
                .send()
                .await;
            match put {
                Ok(_) => return Ok(Acquire::Acquired),
                Err(e) if condition_failed(&e) => {}
                Err(e) => return Err(self.error(PUT_ITEM, e)),
            }

            self.calls.count(UPDATE_ITEM);
            let mark = self
                .client
                .update_item()
                .table_name(self.table.as_ref())
                .set_key(Some(items::key(pk, LEASE_SK)))
                .update_expression("SET dirty = :true")
                .condition_expression("attribute_exists(pk) AND leaseUntil >= :now")
                .set_expression_attribute_values(Some(values([
                    (":true", AttributeValue::Bool(true)),
                    (":now", items::n(now.0)),
                ])))
                .send()
                .await;
            match mark {
                Ok(_) => return Ok(Acquire::HeldElsewhere),
                Err(e) if condition_failed(&e) => {
                    tracing::debug!(pk, "lease changed hands while acquiring; trying again");
                }
                Err(e) => return Err(self.error(UPDATE_ITEM, e)),
            }
        }
        Err(StateError::Dynamo {
            operation: PUT_ITEM,
            message: format!(
                "lease of {pk} kept changing hands during {ACQUIRE_ROUNDS} acquire rounds; \
                 the group is retried on the next run"
            ),
        })
    }

    /// Deletes `owner`'s lease unless it is dirty; a dirty lease is cleaned and extended
    /// to `until` instead and the caller runs again; a lease no longer ours is lost.
    /// Deletes the lease if `owner` holds it, dirty or not; a lease someone else took
    /// over is left alone.
    pub(super) async fn abandon_lease(&self, pk: &str, owner: &str) -> Result<(), StateError> {
        self.calls.count(DELETE_ITEM);
        let delete = self
            .client
            .delete_item()
            .table_name(self.table.as_ref())
            .set_key(Some(items::key(pk, LEASE_SK)))
            .condition_expression("#owner = :me")
            .expression_attribute_names(OWNER.0, OWNER.1)
            .set_expression_attribute_values(Some(values([(
                ":me",
                AttributeValue::S(owner.to_owned()),
            )])))
            .send()
            .await;
        match delete {
            Ok(_) => Ok(()),
            Err(e) if condition_failed(&e) => Ok(()),
            Err(e) => Err(self.error(DELETE_ITEM, e)),
        }
    }

    pub(super) async fn release_lease(
        &self,
        pk: &str,
        owner: &str,
        until: UnixMillis,
    ) -> Result<Release, StateError> {
        self.calls.count(DELETE_ITEM);
        let delete = self
            .client
            .delete_item()
            .table_name(self.table.as_ref())
            .set_key(Some(items::key(pk, LEASE_SK)))
            .condition_expression("#owner = :me AND dirty = :false")
            .expression_attribute_names(OWNER.0, OWNER.1)
            .set_expression_attribute_values(Some(values([
                (":me", AttributeValue::S(owner.to_owned())),
                (":false", AttributeValue::Bool(false)),
            ])))
            .send()
            .await;
        match delete {
            Ok(_) => return Ok(Release::Released),
            Err(e) if condition_failed(&e) => {}
            Err(e) => return Err(self.error(DELETE_ITEM, e)),
        }

        self.calls.count(UPDATE_ITEM);
        let extend = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(items::key(pk, LEASE_SK)))
            .update_expression(format!(
                "SET dirty = :false, leaseUntil = :until, {EXPIRES_AT} = :expires"
            ))
            .condition_expression("#owner = :me")
            .expression_attribute_names(OWNER.0, OWNER.1)
            .set_expression_attribute_values(Some(values([
                (":me", AttributeValue::S(owner.to_owned())),
                (":false", AttributeValue::Bool(false)),
                (":until", items::n(until.0)),
                (":expires", items::n(items::lease_expires_at(until))),
            ])))
            .send()
            .await;
        match extend {
            Ok(_) => Ok(Release::RunAgain),
            Err(e) if condition_failed(&e) => Ok(Release::Lost),
            Err(e) => Err(self.error(UPDATE_ITEM, e)),
        }
    }
}
