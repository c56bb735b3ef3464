//! The state table's item layout and its encoding. Pure functions, unit tested here.
//!
//! One item per target group: `pk = "tg#<target group arn>"`, `sk = "group"`, holding
//! the ledger (a map from `ip:port` to its entry), the lease (`owner`, `leaseUntil`,
//! `dirty`), `backoff`, `held` (registrations held back target by target), `checkpoint`,
//! a `version` counter, and `migrated`, the set of
//! clusters whose rows of the earlier layout were folded in. The item has no TTL
//! attribute: it holds ownership, which must never expire.
//!
//! Beside them, per cluster, an index of its bound groups and of the groups whose ledger
//! holds (or held) its entries: `pk = "owners#<cluster>"`, `sk = "<target group arn>"`,
//! with `ns` and `sel` (the namespace and selector of the group's binding when the row
//! was written), the group's name and facts, `binding` (the binding's fingerprint) and
//! `bound` (`false` once discovery found the group no longer bound). One Query reads it:
//! a resync finds ledgers of groups no longer bound, pod-events its namespace's groups.
//! Its meta item, `pk = "meta#<cluster>"`, `sk = "index"`, holds `generation`, bumped by
//! every change of the rows.
//!
//! The earlier layout (one partition per cluster and group, `pk = "tg#<cluster>#<arn>"`,
//! a row per ledger target and rows for lease, backoff and checkpoint) is still read, to
//! migrate it on first touch.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::core::holds::{Full, RefusedTarget};
use crate::core::{BackoffState, Checkpoint, Holds, PodRef, Target, UnixMillis};
use crate::state::{Glance, GroupState, LeaseView, LedgerEntry, StateError};

/// An item as the SDK takes and returns it.
pub(super) type Item = HashMap<String, AttributeValue>;

/// Partition key attribute.
pub(super) const PK: &str = "pk";
/// Sort key attribute.
pub(super) const SK: &str = "sk";
/// TTL attribute (epoch seconds); only lease rows of the earlier layout carry it.
pub(super) const EXPIRES_AT: &str = "expiresAt";
/// Attribute of an index row: the namespace of the group's binding when the row was
/// written (a cold container watches these namespaces before discovery ends).
pub(super) const INDEX_NAMESPACE: &str = "ns";
/// Attribute of an index row: the selector (tag form) of the group's binding then.
pub(super) const INDEX_SELECTOR: &str = "sel";
/// Attributes of an index row: the group's name, target type, port (when it has one),
/// `IpAddressType` and whether its protocol is QUIC, which ELBv2 never changes.
pub(super) const INDEX_NAME: &str = "tgName";
pub(super) const INDEX_TARGET_TYPE: &str = "targetType";
pub(super) const INDEX_PORT: &str = "port";
pub(super) const INDEX_IP_TYPE: &str = "ipType";
pub(super) const INDEX_QUIC: &str = "quic";
/// Attribute of an index row: the fingerprint of the binding the row was written for.
pub(super) const INDEX_BINDING: &str = "binding";
/// Attribute of an index row: `false` once discovery found the group no longer bound.
pub(super) const INDEX_BOUND: &str = "bound";
/// Attribute of a cluster's index meta item: its generation, bumped by every change of
/// the index's rows.
pub(super) const META_GENERATION: &str = "generation";
/// Attribute of a cluster's index meta item: the groups whose requests for a pass a run
/// handed on (a string set).
pub(super) const META_REQUESTED: &str = "requested";
/// Sort key of a group's item.
pub(super) const GROUP_SK: &str = "group";

/// Attribute names, always used through these placeholders (`owner` is a reserved word,
/// and one spelling everywhere keeps the expressions consistent).
pub(super) const NAMES: [(&str, &str); 10] = [
    ("#o", "owner"),
    ("#u", "leaseUntil"),
    ("#d", "dirty"),
    ("#l", "ledger"),
    ("#b", "backoff"),
    ("#c", "checkpoint"),
    ("#v", "version"),
    ("#m", "migrated"),
    ("#s", "seen"),
    ("#h", "held"),
];

/// Attributes of a group's item a glance leaves out: the ledger, most of the item's
/// size, and the pod versions, which only a pass reads.
const NOT_GLANCED: [&str; 2] = ["ledger", "seen"];

/// What a glance reads of a group's item, as a projection expression and the attribute
/// names it uses: the key (to tell a batch's items apart) and every attribute of
/// [`NAMES`] but [`NOT_GLANCED`], so an attribute added there is read by glances too.
pub(super) fn glance_projection() -> (String, HashMap<String, String>) {
    let names: HashMap<String, String> = [("#pk", PK), ("#sk", SK)]
        .into_iter()
        .chain(NAMES.into_iter().filter(|(_, n)| !NOT_GLANCED.contains(n)))
        .map(|(p, n)| (p.to_owned(), n.to_owned()))
        .collect();
    let mut placeholders: Vec<&str> = names.keys().map(String::as_str).collect();
    placeholders.sort_unstable();
    (placeholders.join(", "), names)
}

/// The key of a group's item.
pub(super) fn group_key(group: &str) -> Item {
    HashMap::from([
        (PK.to_owned(), s(format!("tg#{group}"))),
        (SK.to_owned(), s(GROUP_SK)),
    ])
}

/// The group whose item `key` (an item, or its key) is; `None` for any other row.
pub(super) fn group_of_key(key: &Item) -> Option<String> {
    if string(key, SK).ok()? != GROUP_SK {
        return None;
    }
    string(key, PK).ok()?.strip_prefix("tg#").map(str::to_owned)
}

/// The partition of a cluster's index of the groups its ledger entries are in.
pub(super) fn index_partition(cluster: &str) -> String {
    format!("owners#{cluster}")
}

/// The key of one group's row in a cluster's index.
pub(super) fn index_key(cluster: &str, group: &str) -> Item {
    key(&index_partition(cluster), group)
}

/// The key of a cluster's index meta item (its own partition, so a Query of the index's
/// rows never reads it).
pub(super) fn index_meta_key(cluster: &str) -> Item {
    key(&format!("meta#{cluster}"), "index")
}

/// The partition of a group's rows in the earlier layout.
pub(super) fn legacy_partition(cluster: &str, group: &str) -> String {
    format!("tg#{cluster}#{group}")
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

/// The ledger as stored: `ip:port` → `{c, ns, pod, uid, at}`, and `gone` (when it was
/// deregistered) for a tombstone (short names: the item is limited to 400 KB, and every
/// write sends the whole ledger).
pub(super) fn ledger_value(ledger: &BTreeMap<Target, LedgerEntry>) -> AttributeValue {
    AttributeValue::M(
        ledger
            .values()
            .map(|e| {
                let mut m = HashMap::from([
                    ("c".to_owned(), s(e.cluster.as_str())),
                    ("ns".to_owned(), s(e.pod.namespace.as_str())),
                    ("pod".to_owned(), s(e.pod.name.as_str())),
                    ("uid".to_owned(), s(e.pod.uid.as_str())),
                    ("at".to_owned(), n(e.registered_at.0)),
                ]);
                if let Some(gone) = e.deregistered_at {
                    m.insert("gone".to_owned(), n(gone.0));
                }
                (e.target.to_string(), AttributeValue::M(m))
            })
            .collect(),
    )
}

/// The backoff record as stored.
pub(super) fn backoff_value(b: &BackoffState) -> AttributeValue {
    AttributeValue::M(HashMap::from([
        ("failures".to_owned(), n(b.failures)),
        ("next".to_owned(), n(b.next_attempt.0)),
    ]))
}

/// The registrations held back as stored: `refused` (`ip:port` → `{n, next, why, c}`) and
/// `full` (`{cap, n, next}`).
pub(super) fn held_value(h: &Holds) -> AttributeValue {
    let mut m = HashMap::new();
    if !h.refused.is_empty() {
        let refused = h
            .refused
            .iter()
            .map(|(t, r)| {
                (
                    t.to_string(),
                    AttributeValue::M(HashMap::from([
                        ("n".to_owned(), n(r.failures)),
                        ("next".to_owned(), n(r.next_attempt.0)),
                        ("why".to_owned(), s(r.reason.as_str())),
                        ("c".to_owned(), s(r.cluster.as_str())),
                    ])),
                )
            })
            .collect();
        m.insert("refused".to_owned(), AttributeValue::M(refused));
    }
    if let Some(f) = &h.full {
        m.insert(
            "full".to_owned(),
            AttributeValue::M(HashMap::from([
                ("cap".to_owned(), n(f.capacity)),
                ("n".to_owned(), n(f.failures)),
                ("next".to_owned(), n(f.next_probe.0)),
            ])),
        );
    }
    AttributeValue::M(m)
}

/// Reads the registrations held back; what cannot be read is left out (it only holds
/// registrations back: without it they are sent, and a refusal records it again).
fn parse_held(value: Option<&AttributeValue>) -> Holds {
    let Some(AttributeValue::M(m)) = value else {
        return Holds::default();
    };
    let refused = match m.get("refused") {
        Some(AttributeValue::M(r)) => r
            .iter()
            .filter_map(|(t, v)| {
                let v = map(v).ok()?;
                Some((
                    t.parse().ok()?,
                    RefusedTarget {
                        failures: number(v, "n").ok()?,
                        next_attempt: UnixMillis(number(v, "next").ok()?),
                        reason: string(v, "why").ok()?.to_owned(),
                        cluster: string(v, "c").ok()?.to_owned(),
                    },
                ))
            })
            .collect(),
        _ => BTreeMap::new(),
    };
    let full = m.get("full").and_then(|v| {
        let v = map(v).ok()?;
        Some(Full {
            capacity: number(v, "cap").ok()?,
            failures: number(v, "n").ok()?,
            next_probe: UnixMillis(number(v, "next").ok()?),
        })
    });
    Holds { refused, full }
}

/// The checkpoint as stored: the desired set's fingerprint (hex) and when it was verified.
pub(super) fn checkpoint_value(c: &Checkpoint) -> AttributeValue {
    AttributeValue::M(HashMap::from([
        ("fp".to_owned(), s(format!("{:016x}", c.desired))),
        ("at".to_owned(), n(c.verified_at.0)),
    ]))
}

/// The per-cluster pod versions as stored: `cluster` → `resourceVersion`.
pub(super) fn seen_value(seen: &BTreeMap<String, String>) -> AttributeValue {
    AttributeValue::M(
        seen.iter()
            .map(|(c, v)| (c.clone(), s(v.as_str())))
            .collect(),
    )
}

/// Reads a group's item. A ledger that cannot be understood is an error (acting on a
/// half-read ledger could deregister the wrong targets); a checkpoint that cannot be
/// read is dropped (it only saves calls).
pub(super) fn parse_group(item: &Item) -> Result<GroupState, StateError> {
    let malformed = malformed_group(item);
    let Glance {
        backoff,
        held,
        checkpoint,
        lease,
        dirty,
        version,
    } = parse_glance(item)?;
    let mut state = GroupState {
        backoff,
        held,
        checkpoint,
        lease,
        dirty,
        version,
        ..GroupState::default()
    };
    match item.get("ledger") {
        None => {}
        Some(AttributeValue::M(entries)) => {
            for (target, value) in entries {
                let entry = parse_entry(target, value).map_err(&malformed)?;
                state.ledger.insert(entry.target, entry);
            }
        }
        Some(_) => return Err(malformed("attribute ledger is not a map".into())),
    }
    // Only a hint for when to read pods afresh: an unreadable entry is left out.
    if let Some(AttributeValue::M(seen)) = item.get("seen") {
        state.seen = seen
            .iter()
            .filter_map(|(c, v)| Some((c.clone(), v.as_s().ok()?.clone())))
            .collect();
    }
    Ok(state)
}

/// The error for a group's item that cannot be understood, naming its key.
fn malformed_group(item: &Item) -> impl Fn(String) -> StateError + '_ {
    |reason| StateError::Malformed {
        key: format!("{} / {}", string(item, PK).unwrap_or("?"), GROUP_SK),
        reason,
    }
}

/// Reads a group's item but for its ledger and pod versions (a whole item, or one read
/// with [`glance_projection`]), with [`parse_group`]'s rules.
pub(super) fn parse_glance(item: &Item) -> Result<Glance, StateError> {
    let malformed = malformed_group(item);
    let mut state = Glance::default();
    if let Some(value) = item.get("backoff") {
        let m = map(value).map_err(|e| malformed(format!("backoff: {e}")))?;
        state.backoff = Some(BackoffState {
            failures: number(m, "failures").map_err(|e| malformed(format!("backoff: {e}")))?,
            next_attempt: UnixMillis(
                number(m, "next").map_err(|e| malformed(format!("backoff: {e}")))?,
            ),
        });
    }
    state.held = parse_held(item.get("held"));
    state.checkpoint = item.get("checkpoint").and_then(|v| {
        let m = map(v).ok()?;
        Some(Checkpoint {
            desired: u64::from_str_radix(string(m, "fp").ok()?, 16).ok()?,
            verified_at: UnixMillis(number(m, "at").ok()?),
        })
    });
    if let (Ok(owner), Ok(until)) = (string(item, "owner"), number(item, "leaseUntil")) {
        state.lease = Some(LeaseView {
            owner: owner.to_owned(),
            until: UnixMillis(until),
        });
    }
    state.dirty = matches!(item.get("dirty"), Some(AttributeValue::Bool(true)));
    state.version = number(item, "version").unwrap_or(0);
    Ok(state)
}

/// The lease part of a group's item, as the protocol's transitions see it.
pub(super) fn parse_record(
    item: &Item,
) -> Result<crate::core::lease_protocol::Record<String>, StateError> {
    let g = parse_glance(item)?;
    Ok(crate::core::lease_protocol::Record {
        owner: g.lease.as_ref().map(|l| l.owner.clone()),
        until: g.lease.as_ref().map_or(0, |l| l.until.0),
        dirty: g.dirty,
        version: g.version,
    })
}

/// Whether the item records that `cluster`'s rows of the earlier layout were folded in.
pub(super) fn migrated(item: Option<&Item>, cluster: &str) -> bool {
    match item.and_then(|i| i.get("migrated")) {
        Some(AttributeValue::Ss(clusters)) => clusters.iter().any(|c| c == cluster),
        _ => false,
    }
}

fn parse_entry(target: &str, value: &AttributeValue) -> Result<LedgerEntry, String> {
    let parsed: Target = target
        .parse()
        .map_err(|e| format!("ledger key `{target}` is not ip:port ({e})"))?;
    let m = map(value).map_err(|e| format!("ledger entry {target}: {e}"))?;
    let field = |name| string(m, name).map_err(|e| format!("ledger entry {target}: {e}"));
    Ok(LedgerEntry {
        target: parsed,
        pod: PodRef {
            namespace: field("ns")?.to_owned(),
            name: field("pod")?.to_owned(),
            uid: field("uid")?.to_owned(),
        },
        cluster: field("c")?.to_owned(),
        registered_at: UnixMillis(
            number(m, "at").map_err(|e| format!("ledger entry {target}: {e}"))?,
        ),
        deregistered_at: number(m, "gone").ok().map(UnixMillis),
    })
}

/// What the earlier layout's rows of one cluster and group held.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Legacy {
    /// Ledger rows, as entries of `cluster`.
    pub ledger: BTreeMap<Target, LedgerEntry>,
    /// The backoff row.
    pub backoff: Option<BackoffState>,
    /// The checkpoint row.
    pub checkpoint: Option<Checkpoint>,
    /// Sort keys of every row read (to delete them once folded in).
    pub sort_keys: Vec<String>,
}

/// Reads one row of the earlier layout into `legacy`. Ledger rows that cannot be
/// understood are errors, as in [`parse_group`]; other rows are only collected for
/// deletion.
pub(super) fn parse_legacy_row(
    item: &Item,
    cluster: &str,
    legacy: &mut Legacy,
) -> Result<(), StateError> {
    let pk = string(item, PK).unwrap_or("?");
    let sk = string(item, SK).unwrap_or("?").to_owned();
    let malformed = |reason: String| StateError::Malformed {
        key: format!("{pk} / {sk}"),
        reason,
    };
    if let Some(rest) = sk.strip_prefix("target#") {
        let target: Target = rest
            .parse()
            .map_err(|e| malformed(format!("sort key target `{rest}` is not ip:port ({e})")))?;
        let field = |name| string(item, name).map_err(&malformed);
        let entry = LedgerEntry {
            target,
            pod: PodRef {
                namespace: field("namespace")?.to_owned(),
                name: field("pod")?.to_owned(),
                uid: field("uid")?.to_owned(),
            },
            cluster: cluster.to_owned(),
            registered_at: UnixMillis(number(item, "registeredAt").map_err(&malformed)?),
            deregistered_at: None,
        };
        legacy.ledger.insert(target, entry);
    } else if sk == "backoff" {
        legacy.backoff = Some(BackoffState {
            failures: number(item, "failures").map_err(&malformed)?,
            next_attempt: UnixMillis(number(item, "nextAttemptAt").map_err(&malformed)?),
        });
    } else if sk == "checkpoint" {
        legacy.checkpoint = match (
            string(item, "desired")
                .ok()
                .and_then(|h| u64::from_str_radix(h, 16).ok()),
            number(item, "verifiedAt").ok(),
        ) {
            (Some(desired), Some(at)) => Some(Checkpoint {
                desired,
                verified_at: UnixMillis(at),
            }),
            _ => None,
        };
    }
    legacy.sort_keys.push(sk);
    Ok(())
}

fn map(value: &AttributeValue) -> Result<&HashMap<String, AttributeValue>, String> {
    match value {
        AttributeValue::M(m) => Ok(m),
        _ => Err("not a map".into()),
    }
}

fn string<'a>(item: &'a HashMap<String, AttributeValue>, name: &str) -> Result<&'a str, String> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Ok(v),
        Some(_) => Err(format!("attribute {name} is not a string")),
        None => Err(format!("attribute {name} is missing")),
    }
}

fn number<T: FromStr>(item: &HashMap<String, AttributeValue>, name: &str) -> Result<T, String> {
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

    fn entry(target: &str, cluster: &str) -> LedgerEntry {
        LedgerEntry {
            target: target.parse().unwrap(),
            pod: PodRef {
                namespace: "ns".into(),
                name: "web-0".into(),
                uid: "u-1".into(),
            },
            cluster: cluster.into(),
            registered_at: UnixMillis(1_700_000_000_123),
            deregistered_at: None,
        }
    }

    fn item_with(ledger: &BTreeMap<Target, LedgerEntry>) -> Item {
        let mut item = group_key("arn:g");
        item.insert("ledger".into(), ledger_value(ledger));
        item
    }

    #[test]
    fn the_item_round_trips_for_both_families_and_clusters() {
        let ledger: BTreeMap<Target, LedgerEntry> = [
            entry("10.0.1.7:8080", "blue"),
            entry("[fd00::1]:80", "green"),
        ]
        .into_iter()
        .map(|e| (e.target, e))
        .collect();
        let mut item = item_with(&ledger);
        item.insert(
            "backoff".into(),
            backoff_value(&BackoffState {
                failures: 3,
                next_attempt: UnixMillis(42),
            }),
        );
        item.insert(
            "checkpoint".into(),
            checkpoint_value(&Checkpoint {
                desired: 0xa46c_7d1b_5827_2b7d,
                verified_at: UnixMillis(9),
            }),
        );
        item.insert("owner".into(), s("resync-x"));
        item.insert("leaseUntil".into(), n(77));
        item.insert("dirty".into(), AttributeValue::Bool(true));
        item.insert("version".into(), n(5));
        item.insert("migrated".into(), AttributeValue::Ss(vec!["blue".into()]));
        let state = parse_group(&item).unwrap();
        assert_eq!(state.ledger, ledger);
        assert_eq!(state.backoff.unwrap().failures, 3);
        assert_eq!(state.checkpoint.unwrap().desired, 0xa46c_7d1b_5827_2b7d);
        assert_eq!(state.lease.unwrap().until, UnixMillis(77));
        assert!(state.dirty);
        assert_eq!(state.version, 5);
        assert!(migrated(Some(&item), "blue") && !migrated(Some(&item), "green"));
        assert!(!item.contains_key(EXPIRES_AT), "ownership never expires");
    }

    fn some_holds() -> Holds {
        let mut h = Holds::default();
        h.refused.insert(
            "10.0.9.9:80".parse().unwrap(),
            RefusedTarget {
                failures: 2,
                next_attempt: UnixMillis(1_700_000_005_000),
                reason: "InvalidTarget: not in the VPC".into(),
                cluster: "blue".into(),
            },
        );
        h.full = Some(Full {
            capacity: 1000,
            failures: 3,
            next_probe: UnixMillis(1_700_000_060_000),
        });
        h
    }

    /// What existing tables hold: the attribute names and types of each stored value,
    /// spelled out (a round trip alone would pass with any layout).
    #[test]
    fn the_stored_layout_is_the_one_tables_hold() {
        let m = |pairs: Vec<(&str, AttributeValue)>| {
            AttributeValue::M(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
        };
        let mut gone = entry("10.0.1.7:8080", "blue");
        gone.deregistered_at = Some(UnixMillis(1_700_000_009_000));
        let ledger = BTreeMap::from([(gone.target, gone)]);
        assert_eq!(
            ledger_value(&ledger),
            m(vec![(
                "10.0.1.7:8080",
                m(vec![
                    ("c", s("blue")),
                    ("ns", s("ns")),
                    ("pod", s("web-0")),
                    ("uid", s("u-1")),
                    ("at", n(1_700_000_000_123u64)),
                    ("gone", n(1_700_000_009_000u64)),
                ]),
            )])
        );
        assert_eq!(
            backoff_value(&BackoffState {
                failures: 3,
                next_attempt: UnixMillis(42),
            }),
            m(vec![("failures", n(3)), ("next", n(42))])
        );
        assert_eq!(
            held_value(&some_holds()),
            m(vec![
                (
                    "refused",
                    m(vec![(
                        "10.0.9.9:80",
                        m(vec![
                            ("n", n(2)),
                            ("next", n(1_700_000_005_000u64)),
                            ("why", s("InvalidTarget: not in the VPC")),
                            ("c", s("blue")),
                        ]),
                    )]),
                ),
                (
                    "full",
                    m(vec![
                        ("cap", n(1000)),
                        ("n", n(3)),
                        ("next", n(1_700_000_060_000u64)),
                    ]),
                ),
            ])
        );
        assert_eq!(held_value(&Holds::default()), m(vec![]));
        assert_eq!(
            checkpoint_value(&Checkpoint {
                desired: 0xa46c_7d1b_5827_2b7d,
                verified_at: UnixMillis(9),
            }),
            m(vec![("fp", s("a46c7d1b58272b7d")), ("at", n(9))])
        );
        assert_eq!(
            seen_value(&BTreeMap::from([("blue".into(), "12".into())])),
            m(vec![("blue", s("12"))])
        );
    }

    #[test]
    fn held_registrations_round_trip_and_a_bad_one_is_left_out() {
        let mut item = item_with(&BTreeMap::new());
        item.insert("held".into(), held_value(&some_holds()));
        assert_eq!(parse_group(&item).unwrap().held, some_holds());
        item.insert("held".into(), s("garbage"));
        assert_eq!(parse_group(&item).unwrap().held, Holds::default());
        if let AttributeValue::M(mut m) = held_value(&some_holds()) {
            m.insert(
                "refused".into(),
                AttributeValue::M(HashMap::from([("nonsense".into(), n(1))])),
            );
            item.insert("held".into(), AttributeValue::M(m));
        }
        let held = parse_group(&item).unwrap().held;
        assert!(held.refused.is_empty() && held.full.is_some());
    }

    #[test]
    fn a_glance_reads_all_but_the_ledger_and_pod_versions() {
        let ledger: BTreeMap<Target, LedgerEntry> = [entry("10.0.1.7:8080", "blue")]
            .into_iter()
            .map(|e| (e.target, e))
            .collect();
        // An item with every attribute set to something other than its default.
        let mut item = item_with(&ledger);
        item.extend([
            (
                "backoff".to_owned(),
                backoff_value(&BackoffState {
                    failures: 2,
                    next_attempt: UnixMillis(42),
                }),
            ),
            (
                "checkpoint".to_owned(),
                checkpoint_value(&Checkpoint {
                    desired: 7,
                    verified_at: UnixMillis(9),
                }),
            ),
            ("owner".to_owned(), s("resync-x")),
            ("leaseUntil".to_owned(), n(77)),
            ("dirty".to_owned(), AttributeValue::Bool(true)),
            ("version".to_owned(), n(5)),
            (
                "migrated".to_owned(),
                AttributeValue::Ss(vec!["blue".into()]),
            ),
            (
                "seen".to_owned(),
                seen_value(&BTreeMap::from([("blue".into(), "12".into())])),
            ),
            ("held".to_owned(), held_value(&some_holds())),
        ]);
        let written: Vec<&str> = NAMES.iter().map(|(_, n)| *n).collect();
        assert!(
            written.iter().all(|n| item.contains_key(*n)),
            "the item sets every attribute"
        );
        // What DynamoDB returns for the projection.
        let (expression, names) = glance_projection();
        let projected: Item = expression
            .split(", ")
            .filter_map(|p| {
                let name = &names[p];
                Some((name.clone(), item.get(name)?.clone()))
            })
            .collect();
        assert_eq!(
            names.len(),
            expression.split(", ").count(),
            "every name used"
        );
        let mut left_out: Vec<&String> = item
            .keys()
            .filter(|k| !projected.contains_key(*k))
            .collect();
        left_out.sort();
        assert_eq!(left_out, ["ledger", "seen"]);
        let whole = parse_group(&item).unwrap();
        assert_eq!(parse_glance(&projected).unwrap(), whole.glance());
        assert_ne!(whole.glance(), Glance::default());
        assert!(migrated(Some(&projected), "blue"));
        assert_eq!(group_of_key(&projected).as_deref(), Some("arn:g"));
    }

    #[test]
    fn a_bad_ledger_is_malformed_and_a_bad_checkpoint_dropped() {
        let mut item = item_with(&BTreeMap::new());
        item.insert(
            "ledger".into(),
            AttributeValue::M(HashMap::from([(
                "nonsense".into(),
                AttributeValue::M(HashMap::new()),
            )])),
        );
        assert!(matches!(
            parse_group(&item),
            Err(StateError::Malformed { .. })
        ));
        let ledger = BTreeMap::from([("10.0.0.1:80".parse().unwrap(), entry("10.0.0.1:80", "c"))]);
        let mut item = item_with(&ledger);
        if let Some(AttributeValue::M(m)) = item.get_mut("ledger")
            && let Some(AttributeValue::M(e)) = m.get_mut("10.0.0.1:80")
        {
            e.remove("uid");
        }
        let err = parse_group(&item).unwrap_err().to_string();
        assert!(err.contains("uid is missing"), "{err}");
        let mut item = item_with(&BTreeMap::new());
        item.insert("checkpoint".into(), s("garbage"));
        assert_eq!(parse_group(&item).unwrap().checkpoint, None);
    }

    #[test]
    fn legacy_rows_are_read_as_this_clusters_entries() {
        let mut legacy = Legacy::default();
        let mut row = key("tg#blue#arn:g", "target#10.0.0.1:80");
        row.extend([
            ("namespace".to_owned(), s("ns")),
            ("pod".to_owned(), s("web-0")),
            ("uid".to_owned(), s("u-1")),
            ("registeredAt".to_owned(), n(1_700_000_000_123u64)),
        ]);
        parse_legacy_row(&row, "blue", &mut legacy).unwrap();
        let mut lease = key("tg#blue#arn:g", "lease");
        lease.insert("owner".into(), s("old"));
        parse_legacy_row(&lease, "blue", &mut legacy).unwrap();
        let mut backoff = key("tg#blue#arn:g", "backoff");
        backoff.extend([
            ("failures".to_owned(), n(2)),
            ("nextAttemptAt".to_owned(), n(5)),
        ]);
        parse_legacy_row(&backoff, "blue", &mut legacy).unwrap();
        assert_eq!(
            legacy.ledger.values().next().unwrap(),
            &entry("10.0.0.1:80", "blue")
        );
        assert_eq!(legacy.backoff.unwrap().failures, 2);
        assert_eq!(legacy.sort_keys, ["target#10.0.0.1:80", "lease", "backoff"]);
        let mut bad = key("tg#blue#arn:g", "target#nonsense");
        bad.insert("uid".into(), s("u"));
        assert!(parse_legacy_row(&bad, "blue", &mut legacy).is_err());
    }
}
