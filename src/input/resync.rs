//! The resync function's input: the EventBridge scheduled event, or a manual payload
//! `{"dryRun": bool, "targetGroups": [arn…], "force": bool}` (all optional; `{}` is a
//! full resync), or `{"release": [arn…], "dryRun": bool}` to take tgsync out of groups.
//!
//! Strict on purpose: a payload of any other shape — JSON `null` (an invoke without a
//! payload), a scheduled event with fields EventBridge does not send (an input
//! transformer, or someone adding `"dryRun": true` to it) — is refused with a message,
//! never read as "run everything for real".

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{InputError, eventbridge};
use crate::reconcile::RunOptions;

/// The `detail` of a scheduled event: always `{}`. A field in it (an input transformer,
/// or `"dryRun": true` added by hand) is refused by name.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduledDetail {}

/// A manual resync request. Unknown fields are refused: a misspelt `dryrun` must not
/// silently become a real run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResyncRequest {
    /// Plan only; change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Only these target group ARNs.
    #[serde(default)]
    pub target_groups: Option<Vec<String>>,
    /// Ignore per-group backoff.
    #[serde(default)]
    pub force: bool,
    /// Release these groups instead of reconciling: deregister every target this
    /// cluster owns in them and delete its ledger entries, bound or not.
    #[serde(default)]
    pub release: Option<Vec<String>>,
    /// The invocation is the schedule's (not a manual payload): it may watch afterwards.
    #[serde(skip)]
    pub scheduled: bool,
}

impl ResyncRequest {
    /// Reads the invocation payload.
    pub fn parse(payload: &Value) -> Result<Self, InputError> {
        match payload {
            Value::Null => Err(InputError::Malformed(
                "the payload is empty (JSON null); invoke with {} for a full resync, or {\"dryRun\": true} to see the plan".into(),
            )),
            Value::Object(map) if map.contains_key("detail-type") => Self::scheduled(payload),
            Value::Object(_) => {
                let req: Self = serde_json::from_value(payload.clone()).map_err(|e| {
                    InputError::Malformed(format!(
                        "{e}; resync takes {{\"dryRun\": bool, \"targetGroups\": [arn, ...], \"force\": bool}} or {{\"release\": [arn, ...], \"dryRun\": bool}}"
                    ))
                })?;
                if let Some(release) = &req.release {
                    if req.target_groups.is_some() || req.force {
                        return Err(InputError::Malformed(
                            "\"release\" takes only \"dryRun\" beside it: it names its groups itself and has no backoff to force".into(),
                        ));
                    }
                    if release.is_empty() {
                        return Err(InputError::Malformed(
                            "\"release\" is empty; name the target group ARNs to release".into(),
                        ));
                    }
                }
                let arns = req.target_groups.iter().chain(&req.release).flatten();
                if let Some(bad) = arns
                    .into_iter()
                    .find(|a| !a.starts_with("arn:") || !a.contains(":targetgroup/"))
                {
                    return Err(InputError::Malformed(format!(
                        "{bad:?} is not a target group ARN"
                    )));
                }
                Ok(req)
            }
            other => Err(InputError::Malformed(format!(
                "expected a JSON object, got {}",
                match other {
                    Value::Bool(_) => "a boolean",
                    Value::Number(_) => "a number",
                    Value::String(_) => "a string",
                    Value::Array(_) => "an array",
                    _ => "something else",
                }
            ))),
        }
    }

    /// The schedule's event, through `aws_lambda_events`' envelope: the source and
    /// detail-type of a schedule, no field EventBridge does not send, and an empty
    /// `detail`.
    fn scheduled(payload: &Value) -> Result<Self, InputError> {
        let field = |k: &str| payload.get(k).and_then(Value::as_str).unwrap_or_default();
        let (source, kind) = (field("source"), field("detail-type"));
        if source != "aws.events" || kind != "Scheduled Event" {
            return Err(InputError::Malformed(format!(
                "an EventBridge event of source {source:?} and detail-type {kind:?} is not a schedule; resync takes the scheduled event or {{\"dryRun\", \"targetGroups\", \"force\"}}"
            )));
        }
        eventbridge::parse::<ScheduledDetail>(payload).map_err(|e| {
            InputError::Malformed(format!(
                "the scheduled event is not as EventBridge sends it: {e} (an input transformer?); resync refuses to guess what it asks for: a manual run takes {{\"dryRun\", \"targetGroups\", \"force\"}} on its own"
            ))
        })?;
        Ok(Self {
            scheduled: true,
            ..Self::default()
        })
    }

    /// The engine options for this request.
    pub fn options(&self) -> RunOptions {
        RunOptions {
            dry_run: self.dry_run,
            force: self.force,
            only: self.target_groups.clone(),
            deadline: None,
            priority: crate::groups::Priority::Reaction,
            // `force` (and a dry run) always read target health in full.
            use_checkpoint: !self.force && !self.dry_run,
            cut_at: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scheduled_event_is_a_full_resync() {
        let ev: Value = serde_json::from_str(include_str!("../../events/scheduled.json")).unwrap();
        let r = ResyncRequest::parse(&ev).unwrap();
        assert!(r.scheduled);
        assert_eq!(r.options(), ResyncRequest::default().options());
    }

    #[test]
    fn manual_payloads() {
        let ev: Value =
            serde_json::from_str(include_str!("../../events/resync-dry-run.json")).unwrap();
        let r = ResyncRequest::parse(&ev).unwrap();
        assert!(r.dry_run);
        assert_eq!(
            ResyncRequest::parse(&json!({})).unwrap(),
            ResyncRequest::default()
        );
        let err = ResyncRequest::parse(&Value::Null).unwrap_err().to_string();
        assert!(err.contains("{}"), "null is refused with the fix: {err}");
        assert!(ResyncRequest::parse(&json!({"force": true})).unwrap().force);
        let ev: Value =
            serde_json::from_str(include_str!("../../events/release-dry-run.json")).unwrap();
        let r = ResyncRequest::parse(&ev).unwrap();
        assert!(r.dry_run && r.release.is_some_and(|a| a.len() == 1));
    }

    #[test]
    fn typos_and_garbage_are_refused() {
        for bad in [
            json!({"dryrun": true}),
            json!({"dryRun": "yes"}),
            json!({"targetGroups": ["not-an-arn"]}),
            json!([1, 2]),
            json!("resync"),
            json!({"detail-type": "Object Created", "source": "aws.s3"}),
            json!(null),
            json!({"detail-type": "Scheduled Event", "source": "aws.events", "dryRun": true}),
            json!({"detail-type": "Scheduled Event", "source": "aws.events", "detail": {"force": true}}),
        ] {
            assert!(ResyncRequest::parse(&bad).is_err(), "{bad}");
        }
        let arn =
            "arn:aws:elasticloadbalancing:eu-west-1:111122223333:targetgroup/web/0123456789abcdef";
        for bad in [
            json!({"release": []}),
            json!({"release": ["web"]}),
            json!({"release": [arn], "force": true}),
            json!({"release": [arn], "targetGroups": [arn]}),
        ] {
            assert!(ResyncRequest::parse(&bad).is_err(), "{bad}");
        }
        let err = ResyncRequest::parse(&json!({"dryrun": true}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("dryrun") && err.contains("dryRun"), "{err}");
    }

    #[test]
    fn refusals_of_a_scheduled_event_name_the_field() {
        let scheduled = || -> Value {
            serde_json::from_str(include_str!("../../events/scheduled.json")).unwrap()
        };
        for (key, value, want) in [
            ("dryRun", json!(true), "`dryRun`"),
            ("detail", json!({"force": true}), "`force`"),
            ("time", json!("noon"), "`time`"),
        ] {
            let mut ev = scheduled();
            ev[key] = value;
            let err = ResyncRequest::parse(&ev).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
        let mut ev = scheduled();
        ev["source"] = json!("aws.s3");
        let err = ResyncRequest::parse(&ev).unwrap_err().to_string();
        assert!(err.contains("is not a schedule"), "{err}");
    }
}
