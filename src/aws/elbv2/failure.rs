//! What ELBv2 said when a call failed for good: the SDK error mapped to [`ElbError`],
//! and for a mutation, whether the refusal is the group's capacity or one target's.

use std::error::Error;
use std::fmt::Debug;

use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_runtime_api::http::Response as HttpResponse;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use crate::aws::{credentials_failure, error_summary, is_access_denied_code, is_throttling_code};
use crate::groups::{ElbError, Refusal};

/// ELBv2's error code for a target group that does not exist.
pub(super) const NOT_FOUND: &str = "TargetGroupNotFound";

/// ELBv2's error code for a registration beyond the group's targets quota.
pub(super) const TOO_MANY_TARGETS: &str = "TooManyTargets";

/// ELBv2's error code for a target registered with as many groups of a load balancer as
/// it may be.
pub(super) const TOO_MANY_REGISTRATIONS: &str = "TooManyRegistrationsForTargetId";

/// Maps an SDK error that survived retries: a missing group (when the call names one),
/// throttling, IAM refusal, or anything else with its `Code: message`.
pub(super) fn elb_error<E, R>(
    operation: &'static str,
    arn: Option<&str>,
    err: SdkError<E, R>,
) -> ElbError
where
    E: ProvideErrorMetadata + Error + 'static,
    R: Debug + 'static,
{
    if let Some(message) = credentials_failure(&err) {
        return ElbError::Credentials { operation, message };
    }
    match (err.code(), arn) {
        (Some(NOT_FOUND), Some(arn)) => ElbError::NotFound {
            arn: arn.to_owned(),
        },
        (Some(code), _) if is_throttling_code(code) => ElbError::Throttled { operation },
        (Some(code), _) if is_access_denied_code(code) => ElbError::AccessDenied {
            operation,
            message: error_summary(&err),
        },
        _ => ElbError::Other {
            operation,
            message: error_summary(&err),
        },
    }
}

/// A mutating call that failed for good, with what ELBv2 said.
pub(super) struct Failure {
    pub(super) error: ElbError,
    pub(super) code: Option<String>,
    message: String,
}

impl Failure {
    pub(super) fn new<E>(operation: &'static str, arn: &str, err: SdkError<E, HttpResponse>) -> Self
    where
        E: ProvideErrorMetadata + Error + 'static,
    {
        let code = err.code().map(str::to_owned);
        let message = err.message().unwrap_or_default().to_owned();
        Self {
            error: elb_error(operation, Some(arn), err),
            code,
            message,
        }
    }

    /// ELBv2 refused the call because of what is in it (a target it will not take):
    /// worth narrowing down, never worth repeating as is.
    pub(super) fn per_target(&self) -> bool {
        matches!(
            self.code.as_deref(),
            Some("ValidationError" | "InvalidTarget" | TOO_MANY_REGISTRATIONS)
        )
    }

    /// What the refused targets take: capacity, for the group's targets quota; a target
    /// registered with too many groups of one load balancer is refused for itself (the
    /// quota is the target's, not the group's).
    pub(super) fn refusal(&self) -> Refusal {
        match self.code.as_deref() {
            Some(TOO_MANY_TARGETS) => Refusal::Capacity,
            _ => Refusal::Target,
        }
    }

    /// The IP of ELBv2's "When cross-zone load balancing is disabled on this target
    /// group, you must specify an Availability Zone for IP target '…' since it is
    /// outside of the VPC" (an ALB group that refuses `all`).
    pub(super) fn zone_required_ip(&self) -> Option<std::net::IpAddr> {
        self.validation_ip("must specify an Availability Zone", "IP target '")
    }

    /// The IP of ELBv2's "The Availability Zone is required for IP address '…' because
    /// it is not in the VPC".
    pub(super) fn outside_vpc_ip(&self) -> Option<std::net::IpAddr> {
        self.validation_ip("not in the VPC", "IP address '")
    }

    /// The IP quoted after `before` in a `ValidationError` whose message says `says`.
    fn validation_ip(&self, says: &str, before: &str) -> Option<std::net::IpAddr> {
        if self.code.as_deref() != Some("ValidationError") || !self.message.contains(says) {
            return None;
        }
        let (_, rest) = self.message.split_once(before)?;
        rest.split_once('\'')?.0.parse().ok()
    }

    /// The reason reported for the targets of this call.
    pub(super) fn reason(&self) -> String {
        self.error.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: &str, message: &str) -> Failure {
        Failure {
            error: ElbError::Other {
                operation: super::super::REGISTER_TARGETS,
                message: format!("{code}: {message}"),
            },
            code: Some(code.to_owned()),
            message: message.to_owned(),
        }
    }

    #[test]
    fn elbv2s_zone_refusals_name_the_ip() {
        // As ELBv2 words them (quoted in the AWS Load Balancer Controller's issues).
        let f = failure(
            "ValidationError",
            "When cross-zone load balancing is disabled on this target group, you must specify an Availability Zone for IP target '172.16.0.108' since it is outside of the VPC",
        );
        assert_eq!(f.zone_required_ip(), "172.16.0.108".parse().ok());
        assert_eq!(f.outside_vpc_ip(), None);
        let f = failure(
            "ValidationError",
            "The Availability Zone is required for IP address '10.4.40.87' because it is not in the VPC",
        );
        assert_eq!(f.outside_vpc_ip(), "10.4.40.87".parse().ok());
        assert_eq!(f.zone_required_ip(), None);
        assert_eq!(
            failure(
                "InvalidTarget",
                "must specify an Availability Zone for IP target '1.2.3.4'"
            )
            .zone_required_ip(),
            None
        );
    }

    #[test]
    fn the_groups_quota_is_capacity_and_a_targets_quota_its_own() {
        let too_many = failure(
            TOO_MANY_TARGETS,
            "You've reached the limit on the number of targets.",
        );
        assert_eq!(too_many.refusal(), Refusal::Capacity);
        assert!(
            !too_many.per_target(),
            "halved as capacity, not as a bad target"
        );
        let per_id = failure(
            TOO_MANY_REGISTRATIONS,
            "You've reached the limit on the number of times a target can be registered with a load balancer.",
        );
        assert_eq!(per_id.refusal(), Refusal::Target);
        assert!(per_id.per_target(), "narrowed down to the target");
        for code in ["ValidationError", "InvalidTarget", "Throttling"] {
            assert_eq!(failure(code, "x").refusal(), Refusal::Target, "{code}");
        }
    }
}
