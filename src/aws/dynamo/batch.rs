//! BatchWriteItem in chunks of 25 with bounded retries of `UnprocessedItems`.
//!
//! DynamoDB may accept a batch yet leave some writes unprocessed (throttled partitions);
//! that is not an error response, so the SDK does not retry it. AWS's guidance is to
//! resend them with exponential backoff; after a bounded number of rounds the write is
//! reported as failed, the reconcile stops before touching ELBv2, and the group backs
//! off (the write-ahead rule: no RegisterTargets without its ledger rows).

use std::time::Duration;

use aws_sdk_dynamodb::types::WriteRequest;

use super::{BATCH_WRITE_ITEM, DynamoState};
use crate::state::StateError;

/// BatchWriteItem's limit on requests per call.
pub(super) const BATCH_SIZE: usize = 25;

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
