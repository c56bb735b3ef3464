//! Property tests of input parsing: arbitrary bytes and mutated real events never panic,
//! and whatever is accepted names a pod by valid names. (Coverage-guided cargo-fuzz needs
//! a nightly toolchain, which this project does not assume; proptest runs on stable.)

use proptest::prelude::*;
use serde_json::{Value, json};

use super::pod_event::{Parsed, parse};
use super::resync::ResyncRequest;

/// Every real payload shape the functions receive.
const EVENTS: [&str; 10] = [
    include_str!("../../events/pod-started.json"),
    include_str!("../../events/pod-killing.json"),
    include_str!("../../events/pod-unhealthy.json"),
    include_str!("../../events/pod-detail.json"),
    include_str!("../../events/pod-foreign-cluster.json"),
    include_str!("../../events/pod-malformed.json"),
    include_str!("../../events/pod-invoke.json"),
    include_str!("../../events/scheduled.json"),
    include_str!("../../events/resync-dry-run.json"),
    include_str!("../../events/resync-force.json"),
];

/// Cases per property; `PROPTEST_CASES` overrides it for longer runs.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

fn junk(rng: &mut fastrand::Rng, depth: u32) -> Value {
    match rng.u8(0..12) {
        0 => Value::Null,
        1 => json!(rng.bool()),
        2 => json!(rng.i64(..)),
        3 => json!(rng.f64() * 1e300),
        4 => json!(""),
        5 => json!("x".repeat(rng.usize(0..5000))),
        6 => json!("Pod"),
        7 => json!("../..//\u{0}\u{202e}ünï"),
        8 if depth < 3 => {
            Value::Array((0..rng.usize(0..4)).map(|_| junk(rng, depth + 1)).collect())
        }
        9 if depth < 3 => {
            let mut m = serde_json::Map::new();
            for k in [
                "kind",
                "name",
                "namespace",
                "labels",
                "metadata",
                "detail",
                "clusterName",
            ] {
                if rng.bool() {
                    m.insert(k.to_owned(), junk(rng, depth + 1));
                }
            }
            Value::Object(m)
        }
        _ => json!({}),
    }
}

/// Replaces, deletes or retypes a random node of `v`.
fn mutate(v: &mut Value, rng: &mut fastrand::Rng) {
    match v {
        Value::Object(map) if !map.is_empty() && rng.u8(0..4) != 0 => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = &keys[rng.usize(0..keys.len())];
            match rng.u8(0..6) {
                0 => {
                    map.remove(key);
                }
                1 => {
                    map.insert(key.clone(), junk(rng, 0));
                }
                _ => {
                    if let Some(child) = map.get_mut(key) {
                        mutate(child, rng);
                    }
                }
            }
        }
        Value::Array(items) if !items.is_empty() && rng.bool() => {
            let i = rng.usize(0..items.len());
            mutate(&mut items[i], rng);
        }
        _ => *v = junk(rng, 0),
    }
}

fn check_pod_event(v: &Value) {
    for cluster in ["demo", "other", ""] {
        if let Parsed::Pod(ev) = parse(v, cluster) {
            assert!(
                !ev.namespace.is_empty() && ev.namespace.len() <= 63,
                "{ev:?}"
            );
            assert!(!ev.name.is_empty() && ev.name.len() <= 253, "{ev:?}");
            assert!(
                !ev.name.contains('/') && !ev.namespace.contains('/'),
                "{ev:?}"
            );
        }
    }
    let _ = ResyncRequest::parse(v);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Arbitrary bytes: whatever decodes as JSON is parsed without panicking.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
            check_pod_event(&v);
        }
        let text = String::from_utf8_lossy(&bytes);
        let _ = serde_json::from_str::<Value>(&format!("{{\"detail\": {text}}}")).map(|v| check_pod_event(&v));
    }

    /// Real events with 1–8 random structural mutations never panic either.
    #[test]
    fn mutated_real_events_never_panic(which in 0..EVENTS.len(), seed in any::<u64>(), rounds in 1u8..8) {
        let mut v: Value = serde_json::from_str(EVENTS[which]).expect("event files are JSON");
        let mut rng = fastrand::Rng::with_seed(seed);
        for _ in 0..rounds {
            mutate(&mut v, &mut rng);
        }
        check_pod_event(&v);
    }
}
