//! The DynamoDB state store against moto's real DynamoDB wire protocol.

#[path = "support/moto.rs"]
mod moto;

use std::collections::BTreeMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, TimeToLiveStatus};
use tgsync::aws::{DynamoState, create_table};
use tgsync::core::{BackoffState, PodRef, Target, UnixMillis};
use tgsync::state::{Acquire, GroupState, LedgerRow, Release, StateError, StateStore};

const GROUP: &str =
    "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/web/0123456789abcdef";

/// A fresh table (unique per test) and a store on it for cluster `c1`.
async fn store() -> (Client, DynamoState) {
    let client = Client::new(&moto::sdk_config().await);
    let table = moto::unique("tgsync-state");
    create_table(&client, &table).await.expect("create table");
    let state = DynamoState::new(client.clone(), table, "c1");
    (client, state)
}

fn row(target: &str, i: usize) -> LedgerRow {
    LedgerRow {
        target: target.parse().expect("target"),
        pod: PodRef {
            namespace: "shop".into(),
            name: format!("web-{i}"),
            uid: format!("uid-{i}"),
        },
        registered_at: UnixMillis(1_700_000_000_000 + i as u64),
    }
}

async fn raw_item(
    client: &Client,
    table: &str,
    sk: &str,
) -> Option<BTreeMap<String, AttributeValue>> {
    client
        .get_item()
        .table_name(table)
        .key("pk", AttributeValue::S(format!("tg#c1#{GROUP}")))
        .key("sk", AttributeValue::S(sk.into()))
        .consistent_read(true)
        .send()
        .await
        .expect("get item")
        .item
        .map(|i| i.into_iter().collect())
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

#[tokio::test]
async fn ledger_round_trips_across_batches_and_pages() {
    let (client, state) = store().await;
    let state = state.with_query_page_limit(7);
    assert_eq!(
        state.load(GROUP).await.expect("empty load"),
        GroupState::default()
    );

    // 60 rows (three BatchWriteItem calls), IPv4 and IPv6, plus a duplicate target.
    let mut rows: Vec<LedgerRow> = (0..50)
        .map(|i| row(&format!("10.0.{}.{}:8080", i / 10, i % 10), i))
        .collect();
    rows.extend((50..60).map(|i| row(&format!("[fd00:10::{i:x}]:80"), i)));
    rows.push(row("10.0.0.1:8080", 99)); // the later row for a target wins
    state.record(GROUP, &rows).await.expect("record");
    assert_eq!(state.api_calls()["BatchWriteItem"], 3);

    let loaded = state.load(GROUP).await.expect("load");
    let expected: BTreeMap<Target, LedgerRow> =
        rows.iter().map(|r| (r.target, r.clone())).collect();
    assert_eq!(expected.len(), 60);
    assert_eq!(loaded.ledger, expected);
    assert_eq!(loaded.ledger[&rows[1].target].pod.name, "web-99");
    assert_eq!(loaded.backoff, None);
    // 60 items at 7 per page: several Query pages, all read.
    assert!(state.api_calls()["Query"] >= 9, "{:?}", state.api_calls());

    // The stored layout other tools (and template.yaml's TTL) rely on.
    let item = raw_item(&client, state.table_name(), "target#[fd00:10::32]:80")
        .await
        .expect("ipv6 row");
    assert_eq!(item["target"], AttributeValue::S("[fd00:10::32]:80".into()));
    assert_eq!(item["namespace"], AttributeValue::S("shop".into()));
    assert_eq!(item["pod"], AttributeValue::S("web-50".into()));
    assert_eq!(item["uid"], AttributeValue::S("uid-50".into()));
    assert_eq!(item["cluster"], AttributeValue::S("c1".into()));
    assert_eq!(
        item["registeredAt"],
        AttributeValue::N("1700000000050".into())
    );
    assert!(!item.contains_key("expiresAt"));

    // Another cluster sharing the table sees none of it.
    let other = DynamoState::new(client.clone(), state.table_name(), "c2");
    assert!(other.load(GROUP).await.expect("load").ledger.is_empty());

    let gone: Vec<Target> = rows[..30].iter().map(|r| r.target).collect();
    state.remove(GROUP, &gone).await.expect("remove");
    let left = state.load(GROUP).await.expect("load");
    assert_eq!(left.ledger.len(), 30);
    assert!(gone.iter().all(|t| !left.ledger.contains_key(t)));
    state
        .remove(GROUP, &gone)
        .await
        .expect("removing twice is fine");
}

#[tokio::test]
async fn malformed_ledger_rows_are_reported_and_unknown_rows_ignored() {
    let (client, state) = store().await;
    state
        .record(GROUP, &[row("10.0.0.1:80", 1)])
        .await
        .expect("record");
    client
        .put_item()
        .table_name(state.table_name())
        .item("pk", AttributeValue::S(format!("tg#c1#{GROUP}")))
        .item("sk", AttributeValue::S("checkpoint".into()))
        .send()
        .await
        .expect("put unknown row");
    assert_eq!(state.load(GROUP).await.expect("load").ledger.len(), 1);

    client
        .put_item()
        .table_name(state.table_name())
        .item("pk", AttributeValue::S(format!("tg#c1#{GROUP}")))
        .item("sk", AttributeValue::S("target#not-an-ip".into()))
        .send()
        .await
        .expect("put bad row");
    match state.load(GROUP).await {
        Err(StateError::Malformed { key, reason }) => {
            assert!(key.ends_with("target#not-an-ip"), "{key}");
            assert!(reason.contains("not ip:port"), "{reason}");
        }
        other => panic!("expected Malformed, got {other:?}"),
    }
}

#[tokio::test]
async fn backoff_is_set_and_cleared() {
    let (client, state) = store().await;
    let b = BackoffState {
        failures: 4,
        next_attempt: UnixMillis(1_700_000_123_456),
    };
    state.set_backoff(GROUP, Some(b)).await.expect("set");
    assert_eq!(state.load(GROUP).await.expect("load").backoff, Some(b));
    let item = raw_item(&client, state.table_name(), "backoff")
        .await
        .expect("row");
    assert_eq!(item["failures"], AttributeValue::N("4".into()));
    assert_eq!(
        item["nextAttemptAt"],
        AttributeValue::N("1700000123456".into())
    );
    state.set_backoff(GROUP, None).await.expect("clear");
    assert_eq!(state.load(GROUP).await.expect("load").backoff, None);
    state
        .set_backoff(GROUP, None)
        .await
        .expect("clearing twice is fine");
}

#[tokio::test]
async fn lease_dirty_flag_forces_another_pass() {
    let (client, state) = store().await;
    let t0 = UnixMillis(1_700_000_000_000);
    let until = UnixMillis(t0.0 + 900_000);
    assert_eq!(
        state.acquire(GROUP, "a", t0, until).await.expect("acquire"),
        Acquire::Acquired
    );
    let lease = raw_item(&client, state.table_name(), "lease")
        .await
        .expect("lease row");
    assert_eq!(lease["owner"], AttributeValue::S("a".into()));
    assert_eq!(lease["leaseUntil"], AttributeValue::N(until.0.to_string()));
    assert_eq!(
        lease["expiresAt"],
        AttributeValue::N((until.0 / 1000 + 3600).to_string())
    );
    assert_eq!(lease["dirty"], AttributeValue::Bool(false));

    // A second run finds it held and marks it dirty.
    let t1 = UnixMillis(t0.0 + 1_000);
    assert_eq!(
        state
            .acquire(GROUP, "b", t1, UnixMillis(t1.0 + 900_000))
            .await
            .expect("acquire"),
        Acquire::HeldElsewhere
    );
    let lease = raw_item(&client, state.table_name(), "lease")
        .await
        .expect("lease row");
    assert_eq!(lease["dirty"], AttributeValue::Bool(true));
    assert_eq!(lease["owner"], AttributeValue::S("a".into()));

    // The holder must run again; the lease is extended and cleaned.
    let extended = UnixMillis(t0.0 + 2_000_000);
    assert_eq!(
        state.release(GROUP, "a", extended).await.expect("release"),
        Release::RunAgain
    );
    let lease = raw_item(&client, state.table_name(), "lease")
        .await
        .expect("lease row");
    assert_eq!(lease["dirty"], AttributeValue::Bool(false));
    assert_eq!(
        lease["leaseUntil"],
        AttributeValue::N(extended.0.to_string())
    );
    assert_eq!(
        lease["expiresAt"],
        AttributeValue::N((extended.0 / 1000 + 3600).to_string())
    );

    assert_eq!(
        state.release(GROUP, "a", extended).await.expect("release"),
        Release::Released
    );
    assert!(
        raw_item(&client, state.table_name(), "lease")
            .await
            .is_none()
    );
    // Free again: the next run takes it at once.
    assert_eq!(
        state.acquire(GROUP, "b", t1, until).await.expect("acquire"),
        Acquire::Acquired
    );

    let calls = state.api_calls();
    assert_eq!(calls["PutItem"], 3);
    assert_eq!(calls["UpdateItem"], 2);
    assert_eq!(calls["DeleteItem"], 2);
}

#[tokio::test]
async fn expired_lease_is_taken_over_and_the_old_owner_loses_it() {
    let (_client, state) = store().await;
    let t0 = UnixMillis(1_700_000_000_000);
    let until = UnixMillis(t0.0 + 60_000);
    assert_eq!(
        state
            .acquire(GROUP, "old", t0, until)
            .await
            .expect("acquire"),
        Acquire::Acquired
    );
    // Exactly at leaseUntil the lease still holds.
    assert_eq!(
        state
            .acquire(GROUP, "new", until, UnixMillis(until.0 + 60_000))
            .await
            .expect("acquire"),
        Acquire::HeldElsewhere
    );
    // Past it, a new owner takes over (and the dirty flag starts clean).
    let later = UnixMillis(until.0 + 1);
    assert_eq!(
        state
            .acquire(GROUP, "new", later, UnixMillis(later.0 + 60_000))
            .await
            .expect("acquire"),
        Acquire::Acquired
    );
    assert_eq!(
        state
            .release(GROUP, "old", UnixMillis(later.0 + 60_000))
            .await
            .expect("release"),
        Release::Lost
    );
    // The old owner's release changed nothing: the new owner releases normally.
    assert_eq!(
        state.release(GROUP, "new", later).await.expect("release"),
        Release::Released
    );
    // Releasing a lease nobody holds is Lost, not an error.
    assert_eq!(
        state.release(GROUP, "new", later).await.expect("release"),
        Release::Lost
    );
}

#[tokio::test]
async fn groups_and_clusters_have_separate_leases() {
    let (client, state) = store().await;
    let other_cluster = DynamoState::new(client, state.table_name(), "c2");
    let t0 = UnixMillis(1_700_000_000_000);
    let until = UnixMillis(t0.0 + 60_000);
    assert_eq!(
        state.acquire(GROUP, "a", t0, until).await.expect("acquire"),
        Acquire::Acquired
    );
    assert_eq!(
        state
            .acquire("other-group", "a", t0, until)
            .await
            .expect("acquire"),
        Acquire::Acquired
    );
    assert_eq!(
        other_cluster
            .acquire(GROUP, "b", t0, until)
            .await
            .expect("acquire"),
        Acquire::Acquired
    );
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

/// What moto cannot show: BatchWriteItem answering with `UnprocessedItems` (a throttled
/// table). A tiny HTTP server answers with canned DynamoDB (JSON) responses.
mod canned {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use aws_sdk_dynamodb::Client;
    use serde_json::{Value, json};
    use tgsync::aws::DynamoState;
    use tgsync::state::{StateError, StateStore};

    use super::{GROUP, row};

    type Handler = dyn Fn(usize, &Value) -> Value + Send + Sync;

    /// Serves BatchWriteItem with `handler(call index, request)`; returns the URL and
    /// the log of request bodies.
    fn serve(handler: Box<Handler>) -> (String, Arc<Mutex<Vec<Value>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&log);
        let calls = AtomicUsize::new(0);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let Some(request) = read_json(&mut stream) else {
                    continue;
                };
                let body = handler(calls.fetch_add(1, Ordering::SeqCst), &request).to_string();
                seen.lock().expect("log").push(request);
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.0\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes());
            }
        });
        (url, log)
    }

    fn read_json(stream: &mut std::net::TcpStream) -> Option<Value> {
        let mut reader = BufReader::new(stream);
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).ok()?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().ok()?;
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).ok()?;
        serde_json::from_slice(&body).ok()
    }

    async fn store(url: &str) -> DynamoState {
        let client = Client::new(&super::moto::sdk_config_for(url).await);
        DynamoState::new(client, "t", "c1")
    }

    fn requests(body: &Value) -> Vec<Value> {
        body["RequestItems"]["t"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn unprocessed_items_are_resent() {
        // The first answer leaves the last two writes unprocessed.
        let (url, log) = serve(Box::new(|call, body| {
            let mut items = requests(body);
            if call == 0 {
                let rest = items.split_off(items.len() - 2);
                json!({ "UnprocessedItems": { "t": rest } })
            } else {
                json!({ "UnprocessedItems": {} })
            }
        }));
        let state = store(&url).await;
        let rows: Vec<_> = (0..5).map(|i| row(&format!("10.0.0.{i}:80"), i)).collect();
        state.record(GROUP, &rows).await.expect("record");
        let log = log.lock().expect("log");
        assert_eq!(log.len(), 2);
        assert_eq!(requests(&log[0]).len(), 5);
        assert_eq!(requests(&log[1]), requests(&log[0])[3..]);
        assert_eq!(state.api_calls()["BatchWriteItem"], 2);
    }

    #[tokio::test]
    async fn writes_that_stay_unprocessed_are_an_error() {
        let (url, log) = serve(Box::new(
            |_, body| json!({ "UnprocessedItems": { "t": requests(body) } }),
        ));
        let state = store(&url).await;
        let targets = ["10.0.0.1:80".parse().expect("target")];
        match state.remove(GROUP, &targets).await {
            Err(StateError::Dynamo { operation, message }) => {
                assert_eq!(operation, "BatchWriteItem");
                assert!(
                    message.contains("1 write(s) still unprocessed"),
                    "{message}"
                );
            }
            other => panic!("expected a Dynamo error, got {other:?}"),
        }
        // The first attempt and six resends.
        assert_eq!(log.lock().expect("log").len(), 7);
    }
}
