//! The DynamoDB state store against moto's real DynamoDB wire protocol: one item per
//! group, conditional writes, the lease and its fencing, the calls a zero-drift read
//! costs, and the upgrade from the earlier one-row-per-target layout.

#[path = "support/moto.rs"]
mod moto;

use std::collections::BTreeMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, TimeToLiveStatus};
use tgsync::aws::{DynamoState, create_table};
use tgsync::core::{
    AddressFamily, BackoffState, Checkpoint, GroupFacts, PodRef, Target, UnixMillis,
};
use tgsync::state::{Acquire, Change, LedgerEntry, Release, StateError, StateStore};

const GROUP: &str =
    "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/web/0123456789abcdef";

const T0: UnixMillis = UnixMillis(1_800_000_000_000);

fn at(secs: u64) -> UnixMillis {
    UnixMillis(T0.0 + secs * 1000)
}

/// A fresh table (unique per test) and a store on it for cluster `c1`.
async fn store() -> (Client, DynamoState) {
    let client = Client::new(&moto::sdk_config().await);
    let table = moto::unique("tgsync-state");
    create_table(&client, &table).await.expect("create table");
    let state = DynamoState::new(client.clone(), table, "c1");
    (client, state)
}

fn entry(target: &str, i: usize, cluster: &str) -> LedgerEntry {
    LedgerEntry {
        target: target.parse().expect("target"),
        pod: PodRef {
            namespace: "shop".into(),
            name: format!("web-{i}"),
            uid: format!("uid-{i}"),
        },
        cluster: cluster.into(),
        registered_at: UnixMillis(1_700_000_000_000 + i as u64),
        deregistered_at: None,
    }
}

fn ledger(n: usize) -> BTreeMap<Target, LedgerEntry> {
    (0..n)
        .map(|i| {
            let e = entry(&format!("10.0.{}.{}:8080", i / 250, i % 250), i, "c1");
            (e.target, e)
        })
        .collect()
}

fn with_ledger(l: &BTreeMap<Target, LedgerEntry>) -> Change {
    Change {
        ledger: Some(l.clone()),
        ..Change::default()
    }
}

async fn raw_item(client: &Client, table: &str) -> Option<BTreeMap<String, AttributeValue>> {
    client
        .get_item()
        .table_name(table)
        .key("pk", AttributeValue::S(format!("tg#{GROUP}")))
        .key("sk", AttributeValue::S("group".into()))
        .consistent_read(true)
        .send()
        .await
        .expect("get item")
        .item
        .map(|i| i.into_iter().collect())
}

async fn take(state: &DynamoState, owner: &str, now: UnixMillis) -> Acquire {
    state
        .acquire(GROUP, owner, now, UnixMillis(now.0 + 15_000))
        .await
        .expect("acquire")
}

/// The group's item's version, for a holder's next write.
async fn version(state: &DynamoState) -> u64 {
    state.peek(GROUP).await.expect("peek").version
}

#[tokio::test]
async fn create_table_is_idempotent_and_enables_ttl() {
    let (client, state) = store().await;
    create_table(&client, state.table_name())
        .await
        .expect("second create");
    let ttl = client
        .describe_time_to_live()
        .table_name(state.table_name())
        .send()
        .await
        .expect("describe ttl");
    let desc = ttl.time_to_live_description().expect("ttl description");
    assert_eq!(desc.attribute_name(), Some("expiresAt"));
    assert_eq!(desc.time_to_live_status(), Some(&TimeToLiveStatus::Enabled));
}

/// A zero-drift run reads one item per group and writes nothing (after the one-time
/// record that there was nothing of the earlier layout to fold in).
#[tokio::test]
async fn reading_a_group_is_one_get_item_and_no_write() {
    let (_, state) = store().await;
    state.load(GROUP).await.expect("first load");
    let before = state.api_calls();
    for _ in 0..3 {
        let s = state.load(GROUP).await.expect("load");
        assert!(s.ledger.is_empty() && s.lease.is_none());
    }
    let after = state.api_calls();
    assert_eq!(after["GetItem"] - before["GetItem"], 3);
    for op in ["UpdateItem", "Query", "BatchWriteItem"] {
        assert_eq!(after[op], before[op], "{op}");
    }
}

/// A full diff reads its groups' states in batches, whole or as glances: the states
/// reads one by one give (but the ledgers), 100 groups a BatchGetItem, and no write.
#[tokio::test]
async fn groups_read_in_batches_are_what_reads_one_by_one_give() {
    let (_, state) = store().await;
    let groups: Vec<String> = (0..150)
        .map(|i| {
            format!("arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/g{i}/{i:016x}")
        })
        .collect();
    for (i, g) in groups.iter().enumerate().filter(|(i, _)| i % 3 != 2) {
        let Acquire::Acquired(taken) = state
            .acquire(g, "me", T0, UnixMillis(T0.0 + 15_000))
            .await
            .expect("acquire")
        else {
            panic!("{g}: lease not taken");
        };
        let change = Change {
            checkpoint: Some(Some(Checkpoint {
                desired: i as u64,
                verified_at: T0,
            })),
            ledger: (i % 3 == 0).then(|| ledger(i % 7 + 1)),
            backoff: (i % 5 == 0).then_some(Some(BackoffState {
                failures: 2,
                next_attempt: T0,
            })),
            ..Change::default()
        };
        // Every other group keeps its lease, the rest give it back.
        if i % 2 == 0 {
            state
                .write(g, "me", T0, taken.version, &change)
                .await
                .expect("write");
        } else {
            let released = state
                .release(
                    g,
                    "me",
                    T0,
                    taken.version,
                    UnixMillis(T0.0 + 15_000),
                    &change,
                    false,
                )
                .await
                .expect("release");
            assert_eq!(released, Release::Released, "{g}");
        }
    }
    // A group without an item has nothing recording that there is nothing of the
    // earlier layout to fold in: the batch leaves it to its read alone.
    let before = state.api_calls();
    let first = state.load_many(&groups).await.expect("batched read");
    let after = state.api_calls();
    let index = |g: &String| groups.iter().position(|x| x == g).unwrap_or(usize::MAX);
    assert!(
        first.iter().all(|(g, _)| index(g) % 3 != 2),
        "a group without an item is left out"
    );
    for op in ["UpdateItem", "PutItem", "Query"] {
        assert_eq!(after[op], before[op], "{op}: a batched read never writes");
    }
    let mut one_by_one = Vec::new();
    for g in &groups {
        one_by_one.push((g.clone(), state.load(g).await.expect("load")));
    }
    let before = state.api_calls();
    let mut batched = state.load_many(&groups).await.expect("batched read");
    let after = state.api_calls();
    batched.sort_by_key(|(g, _)| groups.iter().position(|x| x == g));
    assert_eq!(batched, one_by_one);
    assert!(
        batched[2].1 == tgsync::state::GroupState::default()
            && batched[0].1.lease.is_some()
            && batched[0].1.ledger.len() == 1
            && batched[0].1.backoff.is_some()
            && batched[1].1.checkpoint.is_some(),
        "empty, leased and checkpointed groups: {:?}",
        &batched[..3]
    );
    only_batch_reads(&before, &after);
    // Glances: the same states but for their ledgers, in as many requests.
    let before = state.api_calls();
    let mut glanced = state.glance_many(&groups).await.expect("batched glance");
    let after = state.api_calls();
    glanced.sort_by_key(|(g, _)| groups.iter().position(|x| x == g));
    let glances: Vec<_> = one_by_one
        .iter()
        .map(|(g, s)| (g.clone(), s.glance()))
        .collect();
    assert_eq!(glanced, glances);
    only_batch_reads(&before, &after);
}

/// Between two counts of the store's calls: two BatchGetItems (150 groups) and nothing else.
fn only_batch_reads(before: &BTreeMap<&str, u64>, after: &BTreeMap<&str, u64>) {
    assert_eq!(after["BatchGetItem"] - before["BatchGetItem"], 2);
    for op in [
        "GetItem",
        "UpdateItem",
        "PutItem",
        "Query",
        "BatchWriteItem",
    ] {
        assert_eq!(after[op], before[op], "{op}");
    }
}

#[tokio::test]
async fn the_ledger_round_trips_through_fenced_writes() {
    let (client, state) = store().await;
    let Acquire::Acquired(s) = take(&state, "a", T0).await else {
        panic!("free lease")
    };
    assert!(s.ledger.is_empty());
    let l = ledger(900);
    let v = state
        .write(GROUP, "a", at(1), s.version, &with_ledger(&l))
        .await
        .expect("write");
    assert_eq!(v, s.version + 1);
    let backoff = BackoffState {
        failures: 2,
        next_attempt: at(9),
    };
    let checkpoint = Checkpoint {
        desired: 0xabc,
        verified_at: at(2),
    };
    let last = Change {
        backoff: Some(Some(backoff)),
        checkpoint: Some(Some(checkpoint)),
        ..Change::default()
    };
    assert_eq!(
        state
            .release(GROUP, "a", at(2), v, at(17), &last, false)
            .await
            .expect("release"),
        Release::Released
    );
    let s = state.load(GROUP).await.expect("load");
    assert_eq!(s.ledger, l);
    assert_eq!(s.backoff, Some(backoff));
    assert_eq!(s.checkpoint, Some(checkpoint));
    assert_eq!(s.lease, None, "released");
    assert_eq!(s.version, 3, "taking the lease, the write and the release");
    let item = raw_item(&client, state.table_name()).await.expect("item");
    assert!(!item.contains_key("expiresAt"), "ownership never expires");
    assert!(!item.contains_key("owner"));
}

/// The fencing check: once another holder took the lease over, the old holder's writes
/// fail and change nothing.
#[tokio::test]
async fn a_holder_whose_lease_was_taken_over_cannot_change_the_ledger() {
    let (_, state) = store().await;
    let Acquire::Acquired(a) = take(&state, "a", T0).await else {
        panic!("free lease")
    };
    let mine = ledger(2);
    let v = state
        .write(GROUP, "a", at(1), a.version, &with_ledger(&mine))
        .await
        .expect("a writes while it holds the lease");
    // `a` stalls past its lease; `b` takes over.
    let Acquire::Acquired(b) = take(&state, "b", at(20)).await else {
        panic!("taken over")
    };
    let err = state
        .write(GROUP, "a", at(21), v, &with_ledger(&ledger(5)))
        .await
        .expect_err("a's write after losing the lease");
    assert!(matches!(err, StateError::LeaseLost { .. }), "{err}");
    // Even with a clock that lags (it thinks its lease is still valid).
    let err = state
        .write(GROUP, "a", at(5), v, &with_ledger(&ledger(5)))
        .await
        .expect_err("a's write with a lagging clock");
    assert!(matches!(err, StateError::LeaseLost { .. }), "{err}");
    assert!(!state.renew(GROUP, "a", at(36)).await.expect("renew"));
    assert!(
        !state
            .hand_over(GROUP, "a", at(25))
            .await
            .expect("hand over"),
        "a hands over a lease b holds"
    );
    assert_eq!(
        state
            .release(
                GROUP,
                "a",
                at(21),
                v,
                at(36),
                &with_ledger(&ledger(5)),
                false
            )
            .await
            .expect("release"),
        Release::Lost
    );
    state
        .abandon(
            GROUP,
            "a",
            at(21),
            v,
            &with_ledger(&ledger(5)),
            false,
            false,
        )
        .await
        .expect("abandon");
    let s = state.load(GROUP).await.expect("load");
    assert_eq!(s.ledger, mine, "the old holder changed the ledger");
    assert_eq!(s.lease.expect("b holds it").owner, "b");
    state
        .write(GROUP, "b", at(22), b.version, &with_ledger(&ledger(3)))
        .await
        .expect("the new holder writes");
}

/// A retry of an acquisition whose answer was lost finds the lease already its own.
#[tokio::test]
async fn acquiring_is_idempotent_for_its_owner_and_marks_other_holders_dirty() {
    let (_, state) = store().await;
    assert!(matches!(take(&state, "a", T0).await, Acquire::Acquired(_)));
    assert!(matches!(
        take(&state, "a", at(1)).await,
        Acquire::Acquired(_)
    ));
    match take(&state, "b", at(2)).await {
        Acquire::HeldElsewhere { owner, until } => {
            assert_eq!(owner, "a");
            assert_eq!(until, at(16));
        }
        other => panic!("expected the lease held, got {other:?}"),
    }
    let s = state.load(GROUP).await.expect("load");
    assert!(s.dirty);
    // The holder is asked to run again, once.
    let none = Change::default();
    match state
        .release(
            GROUP,
            "a",
            at(3),
            version(&state).await,
            at(18),
            &none,
            false,
        )
        .await
        .expect("release")
    {
        Release::RunAgain(s) => {
            assert!(!s.dirty);
            assert_eq!(s.lease.expect("still held").until, at(18));
        }
        other => panic!("expected RunAgain, got {other:?}"),
    }
    assert!(state.renew(GROUP, "a", at(19)).await.expect("renew"));
    assert_eq!(
        state
            .release(
                GROUP,
                "a",
                at(5),
                version(&state).await,
                at(20),
                &none,
                false
            )
            .await
            .expect("release"),
        Release::Released
    );
    assert!(matches!(
        take(&state, "b", at(6)).await,
        Acquire::Acquired(_)
    ));
}

/// A look that finds the lease held elsewhere asks the holder for a pass without taking
/// the lease: `dirty` is set only while that holder still holds it (its expiry at or
/// after the time given), and nothing is written otherwise.
#[tokio::test]
async fn asking_the_holder_marks_it_dirty_only_while_it_holds_the_lease() {
    let (_, state) = store().await;
    assert!(!state.ask_holder(GROUP, "a", T0).await.expect("ask"));
    assert_eq!(state.load(GROUP).await.expect("load"), Default::default());
    assert!(matches!(take(&state, "a", T0).await, Acquire::Acquired(_)));
    let asked = |holder: &'static str, after: UnixMillis| {
        let state = state.clone();
        async move { state.ask_holder(GROUP, holder, after).await.expect("ask") }
    };
    assert!(!asked("b", at(1)).await, "not b's lease");
    assert!(!asked("a", at(16)).await, "a's lease ends at 15 s");
    assert!(!state.load(GROUP).await.expect("load").dirty);
    assert!(asked("a", at(15)).await);
    let s = state.load(GROUP).await.expect("load");
    assert!(s.dirty, "{s:?}");
    assert_eq!(s.lease.map(|l| l.owner).as_deref(), Some("a"), "not taken");
    assert_eq!(state.leases_found_held(), 1);
}

/// A holder shutting down hands its lease over: shortened (to the write margin) with a
/// request for another pass, so its group's next holder takes it when it ends and serves
/// the request, even if the holder never gives it back.
#[tokio::test]
async fn a_handed_over_lease_ends_early_with_a_request_for_another_pass() {
    let (_, state) = store().await;
    assert!(matches!(take(&state, "a", T0).await, Acquire::Acquired(_)));
    assert!(state.hand_over(GROUP, "a", at(4)).await.expect("hand over"));
    let s = state.load(GROUP).await.expect("load");
    assert_eq!(s.lease.as_ref().map(|l| l.until), Some(at(4)), "{s:?}");
    assert!(s.dirty, "{s:?}");
    assert!(matches!(
        take(&state, "b", at(3)).await,
        Acquire::HeldElsewhere { .. }
    ));
    assert!(matches!(
        take(&state, "b", at(5)).await,
        Acquire::Acquired(_)
    ));
}

/// Giving a lease up leaves a pending request visible, so a waiter knows it was not
/// served.
#[tokio::test]
async fn abandoning_keeps_the_dirty_flag_for_waiters() {
    let (_, state) = store().await;
    assert!(matches!(take(&state, "a", T0).await, Acquire::Acquired(_)));
    assert!(matches!(
        take(&state, "b", at(1)).await,
        Acquire::HeldElsewhere { .. }
    ));
    state
        .abandon(
            GROUP,
            "a",
            at(2),
            version(&state).await,
            &Change::default(),
            false,
            false,
        )
        .await
        .expect("abandon");
    let s = state.load(GROUP).await.expect("load");
    assert_eq!(s.lease, None);
    assert!(s.dirty, "the unserved request stays visible");
    let Acquire::Acquired(s) = take(&state, "b", at(3)).await else {
        panic!("free")
    };
    assert!(!s.dirty, "the new holder serves it");
}

/// After an ELBv2 attempt that was abandoned (it may still land), a lease given back,
/// released or given up, is not deleted: its holder stays recorded with the lease ending
/// then, so a taker waits the takeover grace as after an expiry (`take`'s `now` here is
/// the taker's time less the grace).
#[tokio::test]
async fn a_lease_given_back_after_an_abandoned_attempt_ends_then_and_keeps_its_holder() {
    let (_, state) = store().await;
    let none = Change::default();
    assert!(matches!(take(&state, "a", T0).await, Acquire::Acquired(_)));
    assert_eq!(
        state
            .release(
                GROUP,
                "a",
                at(2),
                version(&state).await,
                at(17),
                &none,
                true
            )
            .await
            .expect("release"),
        Release::Released
    );
    let s = state.load(GROUP).await.expect("load");
    assert_eq!(
        s.lease.map(|l| (l.owner, l.until)),
        Some(("a".into(), at(2)))
    );
    assert!(matches!(
        take(&state, "b", at(2)).await,
        Acquire::HeldElsewhere { .. }
    ));
    assert!(matches!(
        take(&state, "b", at(3)).await,
        Acquire::Acquired(_)
    ));
    state
        .abandon(GROUP, "b", at(4), version(&state).await, &none, true, true)
        .await
        .expect("abandon");
    let s = state.load(GROUP).await.expect("load");
    assert_eq!(
        s.lease.map(|l| (l.owner, l.until)),
        Some(("b".into(), at(4)))
    );
    assert!(s.dirty, "the request stays for the next holder");
    assert!(matches!(
        take(&state, "c", at(4)).await,
        Acquire::HeldElsewhere { .. }
    ));
    assert!(matches!(
        take(&state, "c", at(5)).await,
        Acquire::Acquired(_)
    ));
}

/// A renewal delivered after a later one (sent earlier, slow on the wire) never
/// shortens the lease; the holder still counts it as renewed.
#[tokio::test]
async fn renewals_only_extend_the_lease() {
    let (_, state) = store().await;
    assert!(matches!(take(&state, "a", T0).await, Acquire::Acquired(_)));
    assert!(state.renew(GROUP, "a", at(25)).await.expect("renew"));
    assert!(state.renew(GROUP, "a", at(20)).await.expect("renew"));
    let s = state.load(GROUP).await.expect("load");
    assert_eq!(s.lease.map(|l| l.until), Some(at(25)));
    assert!(
        !state.renew(GROUP, "b", at(30)).await.expect("renew"),
        "not ours"
    );
}

/// Every write of a holder is conditional on the item's version: a copy of an older
/// whole-ledger write delivered late (an SDK retry) is refused instead of overwriting a
/// newer ledger, and a retry of a write that had landed still counts as written.
#[tokio::test]
async fn a_late_copy_of_an_older_ledger_write_never_overwrites_a_newer_one() {
    let (_, state) = store().await;
    let Acquire::Acquired(s) = take(&state, "a", T0).await else {
        panic!("free lease")
    };
    let v = s.version;
    let (older, newer) = (with_ledger(&ledger(1)), with_ledger(&ledger(2)));
    assert_eq!(
        state
            .write(GROUP, "a", at(1), v, &older)
            .await
            .expect("write"),
        v + 1
    );
    assert_eq!(
        state
            .write(GROUP, "a", at(1), v, &older)
            .await
            .expect("its retry"),
        v + 1,
        "landed already"
    );
    assert_eq!(
        state
            .write(GROUP, "a", at(2), v + 1, &newer)
            .await
            .expect("write"),
        v + 2
    );
    let err = state
        .write(GROUP, "a", at(1), v, &older)
        .await
        .expect_err("the older write, late");
    assert!(matches!(err, StateError::LeaseLost { .. }), "{err}");
    assert_eq!(state.load(GROUP).await.expect("load").ledger, ledger(2));
}

/// Writes made without the lease treat it as free only past its takeover grace: the
/// caller passes its time less the grace (`expired_before`), and a lease that ended
/// after that (a holder's abandoned attempt may still land) refuses them.
#[tokio::test]
async fn writes_without_the_lease_wait_for_its_takeover_grace() {
    let (_, state) = store().await;
    let Acquire::Acquired(s) = take(&state, "a", T0).await else {
        panic!("free lease")
    };
    let none = Change::default();
    state
        .release(GROUP, "a", at(2), s.version, at(17), &none, true)
        .await
        .expect("release");
    let cp = Checkpoint {
        desired: 1,
        verified_at: at(3),
    };
    let v = version(&state).await;
    assert!(
        !state
            .record_verified(GROUP, v, at(2), cp)
            .await
            .expect("record")
    );
    assert!(
        !state
            .retire(GROUP, "c1", v, at(2), false)
            .await
            .expect("retire")
    );
    assert!(
        state
            .record_verified(GROUP, v, at(3), cp)
            .await
            .expect("record")
    );
    let v = version(&state).await;
    assert!(
        state
            .retire(GROUP, "c1", v, at(3), false)
            .await
            .expect("retire")
    );
}

/// A checkpoint written without the lease never overwrites a newer state.
#[tokio::test]
async fn a_verification_without_the_lease_is_conditional_on_the_version() {
    let (_, state) = store().await;
    let s = state.load(GROUP).await.expect("load");
    let cp = |desired| Checkpoint {
        desired,
        verified_at: T0,
    };
    assert!(
        state
            .record_verified(GROUP, s.version, T0, cp(1))
            .await
            .expect("record")
    );
    let s = state.load(GROUP).await.expect("load");
    assert_eq!(s.checkpoint, Some(cp(1)));
    // Stale version: refused.
    assert!(
        !state
            .record_verified(GROUP, s.version - 1, T0, cp(2))
            .await
            .expect("record")
    );
    // Someone holds the lease: refused. (Taking the lease removed the checkpoint: only
    // the holder's verified result writes one back.)
    assert!(matches!(
        take(&state, "a", at(1)).await,
        Acquire::Acquired(_)
    ));
    assert!(
        !state
            .record_verified(GROUP, s.version, at(2), cp(3))
            .await
            .expect("record")
    );
    assert_eq!(state.load(GROUP).await.expect("load").checkpoint, None);
}

/// Beyond DynamoDB's 400 KB item limit the write fails as a whole, with a message that
/// says so; nothing is stored (and nothing registered, by the write-ahead rule).
#[tokio::test]
async fn a_ledger_beyond_the_item_limit_is_refused_whole() {
    let (_, state) = store().await;
    assert!(matches!(take(&state, "a", T0).await, Acquire::Acquired(_)));
    let mut big = ledger(1);
    for i in 0..4000 {
        let mut e = entry(&format!("10.1.{}.{}:8080", i / 250, i % 250), i, "c1");
        e.pod.name = format!("{}-{i}", "x".repeat(120));
        big.insert(e.target, e);
    }
    let err = state
        .write(GROUP, "a", at(1), version(&state).await, &with_ledger(&big))
        .await
        .expect_err("too large");
    assert!(
        matches!(err, StateError::TooLarge { targets: 4001, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("400 KB"), "{err}");
    assert!(state.load(GROUP).await.expect("load").ledger.is_empty());
}

/// Upgrading: rows of the earlier layout (one partition per cluster and group) are
/// folded into the group's item on first touch, for each cluster, and deleted; nothing
/// they owned is lost.
#[tokio::test]
async fn rows_of_the_earlier_layout_are_folded_in_on_first_touch() {
    let (client, c1) = store().await;
    let c2 = DynamoState::new(client.clone(), c1.table_name(), "c2");
    let put = |cluster: &str, sk: &str, extra: Vec<(&str, AttributeValue)>| {
        let mut item = std::collections::HashMap::from([
            (
                "pk".to_owned(),
                AttributeValue::S(format!("tg#{cluster}#{GROUP}")),
            ),
            ("sk".to_owned(), AttributeValue::S(sk.to_owned())),
        ]);
        for (k, v) in extra {
            item.insert(k.to_owned(), v);
        }
        client
            .put_item()
            .table_name(c1.table_name())
            .set_item(Some(item))
            .send()
    };
    let ledger_row = |pod: &str| {
        vec![
            ("target", AttributeValue::S("x".into())),
            ("namespace", AttributeValue::S("shop".into())),
            ("pod", AttributeValue::S(pod.into())),
            ("uid", AttributeValue::S(format!("uid-{pod}"))),
            ("registeredAt", AttributeValue::N("1700000000000".into())),
        ]
    };
    put("c1", "target#10.0.0.1:80", ledger_row("a"))
        .await
        .unwrap();
    put("c1", "target#10.0.0.2:80", ledger_row("b"))
        .await
        .unwrap();
    put(
        "c1",
        "backoff",
        vec![
            ("failures", AttributeValue::N("3".into())),
            ("nextAttemptAt", AttributeValue::N("5".into())),
        ],
    )
    .await
    .unwrap();
    put(
        "c1",
        "lease",
        vec![("owner", AttributeValue::S("old".into()))],
    )
    .await
    .unwrap();
    put("c2", "target#10.0.0.9:80", ledger_row("z"))
        .await
        .unwrap();

    let s = c1.load(GROUP).await.expect("load");
    let targets: Vec<String> = s.ledger.keys().map(Target::to_string).collect();
    assert_eq!(targets, ["10.0.0.1:80", "10.0.0.2:80"]);
    assert!(s.ledger.values().all(|e| e.cluster == "c1"));
    assert_eq!(s.backoff.map(|b| b.failures), Some(3));
    let s = c2.load(GROUP).await.expect("load");
    let owners: Vec<(String, String)> = s
        .ledger
        .values()
        .map(|e| (e.target.to_string(), e.cluster.clone()))
        .collect();
    assert_eq!(
        owners,
        [
            ("10.0.0.1:80".to_owned(), "c1".to_owned()),
            ("10.0.0.2:80".to_owned(), "c1".to_owned()),
            ("10.0.0.9:80".to_owned(), "c2".to_owned()),
        ]
    );
    // The old rows are gone; later reads are one GetItem.
    let left = client
        .scan()
        .table_name(c1.table_name())
        .send()
        .await
        .unwrap()
        .items()
        .len();
    assert_eq!(left, 1, "only the group's item is left");
    let before = c1.api_calls();
    assert_eq!(c1.load(GROUP).await.expect("load").ledger.len(), 3);
    let after = c1.api_calls();
    assert_eq!(after["Query"], before["Query"]);
    assert_eq!(after["UpdateItem"], before["UpdateItem"]);
}

#[tokio::test]
async fn missing_table_is_reported_as_such() {
    let client = Client::new(&moto::sdk_config().await);
    let state = DynamoState::new(client, moto::unique("no-such-table"), "c1");
    match state.load(GROUP).await {
        Err(StateError::NoTable { table }) => assert_eq!(table, state.table_name()),
        other => panic!("expected NoTable, got {other:?}"),
    }
    let err = state
        .acquire(GROUP, "a", UnixMillis(1), UnixMillis(2))
        .await
        .expect_err("no table");
    assert!(matches!(err, StateError::NoTable { .. }), "{err}");
}

/// The orphan index: rows per cluster, listed by one Query; a row leaves only in a
/// transaction that finds the group's item unchanged, unleased and not asked for a pass,
/// and the item goes with it only when its ledger is empty.
#[tokio::test]
async fn the_index_row_leaves_only_with_an_unchanged_unleased_item() {
    let (client, state) = store().await;
    let other = GROUP.replace("/web/", "/api/");
    let web = tgsync::testkit::binding("c1", "shop", "app=web tier=fe", 8080);
    let api = tgsync::testkit::binding("c1", "api", "app=api", 8080);
    let web_facts = GroupFacts {
        target_type: "ip".into(),
        port: Some(8080),
        family: AddressFamily::Ipv4,
        quic: false,
    };
    // A QUIC group of IPv6 targets with no port of its own.
    let api_facts = GroupFacts {
        target_type: "ip".into(),
        port: None,
        family: AddressFamily::Ipv6,
        quic: true,
    };
    let web_row = ("web", &web_facts);
    state
        .index(GROUP, "c1", &web, web_row)
        .await
        .expect("index");
    state
        .index(GROUP, "c1", &web, web_row)
        .await
        .expect("idempotent");
    state
        .index(&other, "c1", &api, ("api", &api_facts))
        .await
        .expect("index");
    state
        .index(GROUP, "c2", &web, web_row)
        .await
        .expect("another cluster's index");
    // A row of the earlier layout: namespace and selector, no name or facts.
    let old = GROUP.replace("/web/", "/old/");
    client
        .put_item()
        .table_name(state.table_name())
        .item("pk", AttributeValue::S("owners#c1".into()))
        .item("sk", AttributeValue::S(old.clone()))
        .item("ns", AttributeValue::S("bank".into()))
        .item("sel", AttributeValue::S("app=old".into()))
        .send()
        .await
        .expect("put a row of the earlier layout");
    let c1 = state.indexed_groups("c1").await.expect("query");
    assert_eq!(
        c1.into_iter().collect::<Vec<_>>(),
        [other.clone(), old.clone(), GROUP.to_owned()]
    );
    // Each row records its binding's namespace and selector (what a cold container
    // watches before discovery) and the group's name and facts (so it reads only the
    // group's tags ahead of discovery).
    let mut selections = state.indexed_selections("c1").await.expect("query");
    selections.sort_by(|a, b| a.namespace.cmp(&b.namespace));
    assert_eq!(
        selections,
        [
            tgsync::state::IndexedGroup {
                group: other.clone(),
                namespace: "api".to_owned(),
                selector: Some(api.selector.clone()),
                described: Some(("api".into(), api_facts)),
                binding: Some(api.fingerprint()),
                bound: true,
            },
            tgsync::state::IndexedGroup {
                group: old,
                namespace: "bank".to_owned(),
                selector: tgsync::core::Selector::parse("app=old").ok(),
                described: None,
                binding: None,
                bound: true,
            },
            tgsync::state::IndexedGroup {
                group: GROUP.to_owned(),
                namespace: "shop".to_owned(),
                selector: Some(web.selector.clone()),
                described: Some(("web".into(), web_facts)),
                binding: Some(web.fingerprint()),
                bound: true,
            },
        ]
    );

    // A holder is at work on the group: the row stays.
    let Acquire::Acquired(s) = take(&state, "a", at(0)).await else {
        panic!("free lease")
    };
    assert!(
        !state
            .retire(GROUP, "c1", s.version, at(1), false)
            .await
            .unwrap()
    );
    state
        .write(GROUP, "a", at(2), s.version, &with_ledger(&ledger(1)))
        .await
        .expect("first entry");
    state
        .abandon(
            GROUP,
            "a",
            at(3),
            version(&state).await,
            &Change::default(),
            false,
            false,
        )
        .await
        .unwrap();
    // The caller saw the state before that write: refused.
    assert!(
        !state
            .retire(GROUP, "c1", s.version, at(4), false)
            .await
            .unwrap()
    );
    assert!(state.indexed_groups("c1").await.unwrap().contains(GROUP));
    // With the ledger's entries in it, `delete` is refused whatever the version.
    let now = state.peek(GROUP).await.unwrap();
    assert!(
        !state
            .retire(GROUP, "c1", now.version, at(5), true)
            .await
            .unwrap()
    );
    assert!(raw_item(&client, state.table_name()).await.is_some());
    // Unchanged, unleased: the row goes, the item stays.
    assert!(
        state
            .retire(GROUP, "c1", now.version, at(5), false)
            .await
            .unwrap()
    );
    assert!(!state.indexed_groups("c1").await.unwrap().contains(GROUP));
    assert!(raw_item(&client, state.table_name()).await.is_some());
    assert!(
        state.indexed_groups("c2").await.unwrap().contains(GROUP),
        "c2's row stays"
    );
    // An emptied ledger, and `delete`: the item goes too.
    let Acquire::Acquired(_) = take(&state, "b", at(6)).await else {
        panic!("free lease")
    };
    state
        .release(
            GROUP,
            "b",
            at(7),
            version(&state).await,
            at(20),
            &with_ledger(&BTreeMap::new()),
            false,
        )
        .await
        .unwrap();
    let now = state.peek(GROUP).await.unwrap();
    assert!(
        state
            .retire(GROUP, "c1", now.version, at(8), true)
            .await
            .unwrap()
    );
    assert!(raw_item(&client, state.table_name()).await.is_none());
    let calls = state.api_calls();
    assert_eq!(calls["PutItem"], 4);
    assert_eq!(calls["TransactWriteItems"], 5);
}
