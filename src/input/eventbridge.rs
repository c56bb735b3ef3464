//! The EventBridge envelope the resync and pod-events receive (the schedule's event,
//! pod events), read through `aws_lambda_events`' [`EventBridgeEvent`] with tgsync's
//! strictness on top: a top-level field EventBridge does not send (an input
//! transformer's, or one added by hand) is refused by name, and a field of the wrong
//! type or form (a `time` that is not RFC 3339, a `detail` of the wrong shape) is named
//! in the message.

use aws_lambda_events::eventbridge::EventBridgeEvent;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Reads `payload` as an EventBridge event whose `detail` is a `D`. The error names the
/// field that is wrong (or unknown) and says what was expected.
pub fn parse<D>(payload: &Value) -> Result<EventBridgeEvent<D>, String>
where
    D: Serialize + DeserializeOwned,
{
    let event: EventBridgeEvent<D> = serde_path_to_error::deserialize(payload).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            e.inner().to_string()
        } else {
            format!("field `{path}`: {}", e.inner())
        }
    })?;
    if let Some(extra) = event.other.keys().next() {
        return Err(format!(
            "field `{extra}` is not one EventBridge sends (expected only version, id, detail-type, source, account, time, region, resources, detail)"
        ));
    }
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Empty {}

    fn envelope() -> Value {
        serde_json::from_str(include_str!("../../events/scheduled.json")).unwrap()
    }

    #[test]
    fn reads_the_documented_envelope() {
        let e: EventBridgeEvent<Empty> = parse(&envelope()).unwrap();
        assert_eq!(e.source, "aws.events");
        assert_eq!(e.detail_type, "Scheduled Event");
        assert_eq!(
            e.time.map(|t| t.timestamp()),
            Some(1_795_262_400),
            "2026-11-21T12:00:00Z"
        );
    }

    #[test]
    fn errors_name_the_field() {
        let with = |key: &str, value: Value| {
            let mut v = envelope();
            v[key] = value;
            parse::<Empty>(&v).unwrap_err()
        };
        let err = with("dryRun", json!(true));
        assert!(err.contains("`dryRun`"), "{err}");
        let err = with("time", json!("yesterday"));
        assert!(err.contains("`time`"), "{err}");
        let err = with("detail", json!({"force": true}));
        assert!(err.contains("`detail.force`"), "{err}");
        let err = with("resources", json!("arn"));
        assert!(err.contains("`resources`"), "{err}");
        let mut v = envelope();
        v.as_object_mut().unwrap().remove("source");
        let err = parse::<Empty>(&v).unwrap_err();
        assert!(err.contains("`source`"), "{err}");
    }
}
