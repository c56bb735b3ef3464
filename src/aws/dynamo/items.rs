//! The state table's item layout: how ledger, backoff and lease rows are keyed and
//! encoded, and how stored rows are read back. Pure functions, unit tested here.
//!
//! Every row of a group shares `pk = "tg#<cluster>#<target group arn>"` (deployments for
//! different clusters may share one table), so one Query reads a group's whole state.

use std::collections::HashMap;
use std::str::FromStr;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::core::{BackoffState, Checkpoint, PodRef, Target, UnixMillis};
use crate::state::{LedgerRow, StateError};

/// An item as the SDK takes and returns it.
pub(super) type Item = HashMap<String, AttributeValue>;

/// Partition key attribute.
pub(super) const PK: &str = "pk";
/// Sort key attribute.
pub(super) const SK: &str = "sk";
/// TTL attribute (epoch seconds); only lease rows carry it.
pub(super) const EXPIRES_AT: &str = "expiresAt";
/// Sort-key prefix of ledger rows; the rest is the target's `ip:port` form.
pub(super) const LEDGER_PREFIX: &str = "target#";
/// Sort key of the backoff row.
pub(super) const BACKOFF_SK: &str = "backoff";
/// Sort key of the lease row.
pub(super) const LEASE_SK: &str = "lease";
/// Sort key of the verification checkpoint row.
pub(super) const CHECKPOINT_SK: &str = "checkpoint";
/// How long after its expiry DynamoDB's TTL may sweep an abandoned lease row (seconds).
/// Correctness never depends on the sweep; it only keeps dead rows from piling up.
pub(super) const LEASE_TTL_GRACE_SECS: u64 = 3600;

/// The partition key of a group's rows.
pub(super) fn partition_key(cluster: &str, group: &str) -> String {
    format!("tg#{cluster}#{group}")
}

/// The sort key of a target's ledger row (`target#10.0.1.7:8080`, `target#[fd00::1]:80`).
pub(super) fn ledger_sort_key(target: &Target) -> String {
    format!("{LEDGER_PREFIX}{target}")
}

fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

/// A DynamoDB number attribute.
pub(super) fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// The primary key of one row.
pub(super) fn key(pk: &str, sk: &str) -> Item {
    HashMap::from([(PK.to_owned(), s(pk)), (SK.to_owned(), s(sk))])
}

/// A ledger row. No `expiresAt`: ownership records never expire, they are deleted only
/// after the target is gone.
pub(super) fn ledger_item(pk: &str, cluster: &str, row: &LedgerRow) -> Item {
    let mut item = key(pk, &ledger_sort_key(&row.target));
    item.extend([
        ("target".to_owned(), s(row.target.to_string())),
        ("namespace".to_owned(), s(row.pod.namespace.as_str())),
        ("pod".to_owned(), s(row.pod.name.as_str())),
        ("uid".to_owned(), s(row.pod.uid.as_str())),
        ("cluster".to_owned(), s(cluster)),
        ("registeredAt".to_owned(), n(row.registered_at.0)),
    ]);
    item
}

/// The backoff row.
pub(super) fn backoff_item(pk: &str, state: &BackoffState) -> Item {
    let mut item = key(pk, BACKOFF_SK);
    item.extend([
        ("failures".to_owned(), n(state.failures)),
        ("nextAttemptAt".to_owned(), n(state.next_attempt.0)),
    ]);
    item
}

/// The checkpoint row: the verified desired set's fingerprint (hex) and when.
pub(super) fn checkpoint_item(pk: &str, checkpoint: &Checkpoint) -> Item {
    let mut item = key(pk, CHECKPOINT_SK);
    item.extend([
        (
            "desired".to_owned(),
            s(format!("{:016x}", checkpoint.desired)),
        ),
        ("verifiedAt".to_owned(), n(checkpoint.verified_at.0)),
    ]);
    item
}

/// `expiresAt` of a lease held until `until`.
pub(super) fn lease_expires_at(until: UnixMillis) -> u64 {
    until.as_secs().saturating_add(LEASE_TTL_GRACE_SECS)
}

/// A fresh lease row: held by `owner` until `until`, not dirty.
pub(super) fn lease_item(pk: &str, owner: &str, until: UnixMillis) -> Item {
    let mut item = key(pk, LEASE_SK);
    item.extend([
        ("owner".to_owned(), s(owner)),
        ("leaseUntil".to_owned(), n(until.0)),
        (EXPIRES_AT.to_owned(), n(lease_expires_at(until))),
        ("dirty".to_owned(), AttributeValue::Bool(false)),
    ]);
    item
}

/// A stored row as [`StateStore::load`](crate::state::StateStore::load) understands it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Row {
    /// A ledger row.
    Ledger(LedgerRow),
    /// The backoff row.
    Backoff(BackoffState),
    /// The checkpoint row.
    Checkpoint(Checkpoint),
    /// The lease, or a row kind a later version added: not part of [`crate::state::GroupState`].
    Other,
}

/// Reads one stored row. Ledger and backoff rows that cannot be understood are errors
/// (acting on a half-read ledger could deregister the wrong targets); unknown sort keys
/// are ignored so newer row kinds do not break older code.
pub(super) fn parse_row(item: &Item) -> Result<Row, StateError> {
    let pk = string(item, PK).unwrap_or("?");
    let sk = string(item, SK).unwrap_or("?");
    let malformed = |reason: String| StateError::Malformed {
        key: format!("{pk} / {sk}"),
        reason,
    };
    if let Some(rest) = sk.strip_prefix(LEDGER_PREFIX) {
        return parse_ledger(item, rest).map(Row::Ledger).map_err(malformed);
    }
    if sk == BACKOFF_SK {
        return Ok(Row::Backoff(BackoffState {
            failures: number(item, "failures").map_err(malformed)?,
            next_attempt: UnixMillis(number(item, "nextAttemptAt").map_err(malformed)?),
        }));
    }
    if sk == CHECKPOINT_SK {
        // A checkpoint only saves calls; one that cannot be read is dropped, not fatal.
        let desired = string(item, "desired")
            .ok()
            .and_then(|h| u64::from_str_radix(h, 16).ok());
        let verified = number(item, "verifiedAt").ok();
        return Ok(match (desired, verified) {
            (Some(desired), Some(at)) => Row::Checkpoint(Checkpoint {
                desired,
                verified_at: UnixMillis(at),
            }),
            _ => Row::Other,
        });
    }
    Ok(Row::Other)
}

fn parse_ledger(item: &Item, key_target: &str) -> Result<LedgerRow, String> {
    let target: Target = key_target
        .parse()
        .map_err(|e| format!("sort key target `{key_target}` is not ip:port ({e})"))?;
    if let Ok(stored) = string(item, "target")
        && stored != key_target
    {
        return Err(format!(
            "attribute target `{stored}` differs from the sort key"
        ));
    }
    Ok(LedgerRow {
        target,
        pod: PodRef {
            namespace: string(item, "namespace")?.to_owned(),
            name: string(item, "pod")?.to_owned(),
            uid: string(item, "uid")?.to_owned(),
        },
        registered_at: UnixMillis(number(item, "registeredAt")?),
    })
}

fn string<'a>(item: &'a Item, name: &str) -> Result<&'a str, String> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Ok(v),
        Some(_) => Err(format!("attribute {name} is not a string")),
        None => Err(format!("attribute {name} is missing")),
    }
}

fn number<T: FromStr>(item: &Item, name: &str) -> Result<T, String> {
    match item.get(name) {
        Some(AttributeValue::N(v)) => v
            .parse()
            .map_err(|_| format!("attribute {name} = {v} is out of range")),
        Some(_) => Err(format!("attribute {name} is not a number")),
        None => Err(format!("attribute {name} is missing")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(target: &str) -> LedgerRow {
        LedgerRow {
            target: target.parse().unwrap(),
            pod: PodRef {
                namespace: "ns".into(),
                name: "web-0".into(),
                uid: "u-1".into(),
            },
            registered_at: UnixMillis(1_700_000_000_123),
        }
    }

    #[test]
    fn ledger_rows_round_trip_for_both_families() {
        for t in ["10.0.1.7:8080", "[fd00::1]:80"] {
            let item = ledger_item("tg#c#arn", "c", &row(t));
            assert_eq!(item[SK], AttributeValue::S(format!("target#{t}")));
            assert!(!item.contains_key(EXPIRES_AT));
            assert_eq!(parse_row(&item).unwrap(), Row::Ledger(row(t)));
        }
    }

    #[test]
    fn bad_ledger_rows_are_malformed_and_unknown_rows_ignored() {
        let mut item = ledger_item("tg#c#arn", "c", &row("10.0.0.1:80"));
        item.insert(SK.into(), AttributeValue::S("target#nonsense".into()));
        assert!(matches!(
            parse_row(&item),
            Err(StateError::Malformed { .. })
        ));
        let mut item = ledger_item("tg#c#arn", "c", &row("10.0.0.1:80"));
        item.remove("uid");
        let err = parse_row(&item).unwrap_err().to_string();
        assert!(err.contains("uid is missing"), "{err}");
        assert_eq!(
            parse_row(&key("tg#c#arn", "checkpoint")).unwrap(),
            Row::Other
        );
        assert_eq!(
            parse_row(&lease_item("tg#c#arn", "me", UnixMillis(5_000))).unwrap(),
            Row::Other
        );
    }

    #[test]
    fn backoff_and_lease_encoding() {
        let state = BackoffState {
            failures: 3,
            next_attempt: UnixMillis(42),
        };
        assert_eq!(
            parse_row(&backoff_item("p", &state)).unwrap(),
            Row::Backoff(state)
        );
        let lease = lease_item("p", "me", UnixMillis(10_500));
        assert_eq!(lease[EXPIRES_AT], AttributeValue::N("3610".into()));
        assert_eq!(lease["dirty"], AttributeValue::Bool(false));
    }
}
