//! The manual function: one pass over what an operator asked for (a dry run, a resync of
//! some or all groups, a release), then it ends. It has its own reserved concurrency, so
//! it always answers while the scheduled resync holds the resync function's slot
//! watching, and it never watches.
//!
//! **Who may release.** A plan and a release are one Lambda invoke each; IAM can only
//! tell them apart by the ARN invoked. So a release that changes something is served only
//! when the function is invoked through its alias [`RELEASE_ALIAS`]
//! (`<function>:release`, a separate `lambda:InvokeFunction` resource); through the
//! unqualified function (or any other version) a release is refused, and everything else
//! (dry runs, the release plan included, and resyncs) is served. Lambda always names the
//! invoked function, version or alias ARN to the runtime; a local runtime API that names
//! none (`cargo lambda watch` says `function-arn`) has no IAM in front of it to separate
//! the two, and everything is served.

use serde_json::Value;

use super::HandlerError;
use crate::controller::Engine;
use crate::core::UnixMillis;
use crate::groups::TargetGroupApi;
use crate::input::InputError;
use crate::input::resync::ResyncRequest;
use crate::pods::PodSource;
use crate::state::StateStore;

/// The alias through which the manual function may release groups (`template.yaml`
/// publishes it with `AutoPublishAlias`).
pub const RELEASE_ALIAS: &str = "release";

/// The `Function` of the manual function's reports and metrics.
pub const FUNCTION: &str = "manual";

/// What Lambda says about one invocation besides its payload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Invocation {
    /// When the invocation must end.
    pub deadline: Option<UnixMillis>,
    /// The function, version or alias ARN the caller invoked (the runtime API's
    /// `Lambda-Runtime-Invoked-Function-Arn`).
    pub invoked_function_arn: String,
}

/// What the invoked ARN allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Invoked through the release alias: everything, releases included.
    ReleaseAlias,
    /// Invoked as the function (or a version, or another alias): no release.
    Function {
        /// The qualifier invoked, if any (`$LATEST`, a version, an alias).
        qualifier: Option<String>,
    },
    /// No Lambda function ARN at all: a local runtime, no IAM in front of it.
    Local,
}

impl Caller {
    /// Reads `arn:<partition>:lambda:<region>:<account>:function:<name>[:<qualifier>]`.
    pub fn from_invoked_arn(arn: &str) -> Self {
        let parts: Vec<&str> = arn.split(':').collect();
        let is_function = parts.len() >= 7
            && parts[0] == "arn"
            && parts[2] == "lambda"
            && parts[5] == "function"
            && !parts[6].is_empty();
        if !is_function {
            return Self::Local;
        }
        match parts.get(7) {
            Some(&RELEASE_ALIAS) if parts.len() == 8 => Self::ReleaseAlias,
            Some(q) => Self::Function {
                qualifier: Some((*q).to_owned()),
            },
            None => Self::Function { qualifier: None },
        }
    }

    /// Whether this caller may run a release that changes something.
    pub fn may_release(&self) -> bool {
        !matches!(self, Self::Function { .. })
    }
}

/// Handles one manual invocation: `{"dryRun", "targetGroups", "force"}` (a resync of
/// those groups, or all) or `{"release": [...], "dryRun"}`. The scheduled event is
/// refused: the schedule invokes the resync function, which watches; this one never
/// does.
pub async fn handle<P: PodSource, G: TargetGroupApi, S: StateStore>(
    engine: &Engine<P, G, S>,
    payload: &Value,
    invocation: &Invocation,
) -> Result<Value, HandlerError> {
    let request = parse(
        payload,
        &Caller::from_invoked_arn(&invocation.invoked_function_arn),
    )
    .inspect_err(|e| tracing::error!(error = %e, "refusing input"))?;
    let mut opts = request.options();
    opts.deadline = invocation.deadline;
    let mut report = match &request.release {
        // Boxed: a run's future is too large for the caller's stack.
        Some(arns) => Box::pin(engine.release(arns, &opts)).await,
        None => Box::pin(engine.resync(&opts)).await,
    };
    report.function = FUNCTION;
    super::log_run_errors(&report);
    tracing::info!(
        dry_run = report.dry_run,
        release = request.release.is_some(),
        groups = report.totals.groups,
        changed = report.totals.changed,
        registered = report.totals.registered,
        deregistered = report.totals.deregistered,
        released = report.totals.released,
        errors = report.totals.errors,
        duration_ms = report.duration_ms,
        "manual run finished"
    );
    crate::metrics::emit(&report);
    Ok(serde_json::to_value(&report)?)
}

/// The request, if `caller` may make it.
fn parse(payload: &Value, caller: &Caller) -> Result<ResyncRequest, InputError> {
    let request = ResyncRequest::parse(payload)?;
    if request.scheduled {
        return Err(InputError::Malformed(
            "the scheduled event goes to the resync function, which watches; the manual function runs one pass over what it is asked for: {\"dryRun\", \"targetGroups\", \"force\"} or {\"release\", \"dryRun\"}".into(),
        ));
    }
    if request.release.is_some() && !request.dry_run && !caller.may_release() {
        return Err(InputError::Malformed(format!(
            "a release is served only through the function's `{RELEASE_ALIAS}` alias (invoke <function>:{RELEASE_ALIAS}, which needs lambda:InvokeFunction on that alias ARN); this invocation came through {}. Add \"dryRun\": true to see the release plan here",
            match caller {
                Caller::Function { qualifier: Some(q) } => format!("qualifier `{q}`"),
                _ => "the unqualified function".to_owned(),
            }
        )));
    }
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FN: &str = "arn:aws:lambda:eu-west-1:111122223333:function:tgsync-manual";
    const TG: &str =
        "arn:aws:elasticloadbalancing:eu-west-1:111122223333:targetgroup/web/0123456789abcdef";

    #[test]
    fn the_invoked_arn_says_who_may_release() {
        assert_eq!(
            Caller::from_invoked_arn(&format!("{FN}:release")),
            Caller::ReleaseAlias
        );
        assert_eq!(
            Caller::from_invoked_arn(FN),
            Caller::Function { qualifier: None }
        );
        for q in ["$LATEST", "7", "Release", "release2"] {
            let c = Caller::from_invoked_arn(&format!("{FN}:{q}"));
            assert_eq!(
                c,
                Caller::Function {
                    qualifier: Some(q.to_owned())
                }
            );
            assert!(!c.may_release(), "{q}");
        }
        // cargo lambda watch's stand-in, and nothing at all: a local runtime.
        for local in ["function-arn", "", "arn:aws:iam::111122223333:role/x"] {
            assert_eq!(Caller::from_invoked_arn(local), Caller::Local, "{local}");
        }
        assert!(Caller::ReleaseAlias.may_release() && Caller::Local.may_release());
    }

    #[test]
    fn a_release_needs_the_alias_and_its_plan_does_not() {
        let plain = Caller::from_invoked_arn(FN);
        let alias = Caller::from_invoked_arn(&format!("{FN}:release"));
        let release = json!({ "release": [TG] });
        let err = parse(&release, &plain).unwrap_err().to_string();
        assert!(
            err.contains("`release` alias") && err.contains("dryRun"),
            "{err}"
        );
        assert!(parse(&release, &alias).is_ok());
        assert!(parse(&release, &Caller::Local).is_ok());
        let plan = json!({ "release": [TG], "dryRun": true });
        assert!(parse(&plan, &plain).is_ok());
        for ok in [
            json!({}),
            json!({"dryRun": true}),
            json!({"force": true, "targetGroups": [TG]}),
        ] {
            assert!(parse(&ok, &plain).is_ok(), "{ok}");
        }
    }

    #[test]
    fn the_schedule_is_not_the_manual_functions() {
        let scheduled: Value =
            serde_json::from_str(include_str!("../../events/scheduled.json")).unwrap();
        let err = parse(&scheduled, &Caller::Local).unwrap_err().to_string();
        assert!(err.contains("resync function"), "{err}");
    }
}
