//! The CLI's JSON gives times as RFC 3339 (UTC, milliseconds: `2027-01-15T08:00:00.250Z`)
//! where the functions' reports and the state table keep Unix milliseconds: people and
//! `jq` read the one, `date -d` parses it, and no script has to guess the unit.

use serde_json::Value;

/// Whether `key` names a time: a camelCase `…At`, or the lease's `until`/`leaseUntil`.
fn is_time(key: &str) -> bool {
    key.ends_with("At") || key == "until" || key == "leaseUntil"
}

/// Rewrites every time in `value` (an unsigned integer of milliseconds under a key
/// [`is_time`] names) as RFC 3339.
pub fn rfc3339(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            for (key, field) in fields.iter_mut() {
                match field.as_u64() {
                    Some(ms) if is_time(key) => {
                        *field = Value::String(tgsync::logging::rfc3339(ms))
                    }
                    _ => rfc3339(field),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(rfc3339),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn times_become_rfc3339_and_nothing_else_changes() {
        let mut v = json!({
            "startedAt": 1_800_000_000_250u64,
            "durationMs": 1_800_000_000_250u64,
            "groups": [{
                "nextAttemptAt": 1_800_000_000_000u64,
                "leaseUntil": 1_800_000_001_000u64,
                "waiting": [{"retryAt": 1_800_000_002_000u64, "port": 8080}],
                "lease": {"until": 1_800_000_003_000u64, "owner": "resync-1"},
                "lastVerifiedAt": null,
                "targets": 3
            }]
        });
        rfc3339(&mut v);
        assert_eq!(
            v,
            json!({
                "startedAt": "2027-01-15T08:00:00.250Z",
                "durationMs": 1_800_000_000_250u64,
                "groups": [{
                    "nextAttemptAt": "2027-01-15T08:00:00.000Z",
                    "leaseUntil": "2027-01-15T08:00:01.000Z",
                    "waiting": [{"retryAt": "2027-01-15T08:00:02.000Z", "port": 8080}],
                    "lease": {"until": "2027-01-15T08:00:03.000Z", "owner": "resync-1"},
                    "lastVerifiedAt": null,
                    "targets": 3
                }]
            })
        );
    }
}
