//! What can go wrong, each with what to do about it: one line for people, the SDK's own
//! account of it ([`CliError::detail`]) only under `--verbose`.

use std::fmt::Debug;

use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use thiserror::Error;

use crate::exit;

/// A failure of the command; printed as `tgsync: <message>`, with the exit code of
/// [`CliError::exit_code`].
#[derive(Debug, Error)]
pub enum CliError {
    /// No credentials could be found (the whole chain: environment, profile, SSO,
    /// container, instance metadata).
    #[error("{}", no_credentials(profile.as_deref()))]
    NoCredentials {
        /// The profile asked for (`--profile` or `AWS_PROFILE`), if any.
        profile: Option<String>,
        /// What the credentials chain said.
        detail: String,
    },
    /// No region: neither `--region`, `AWS_REGION` nor the profile names one.
    #[error(
        "no AWS region: pass --region, set AWS_REGION, or give the profile one (`aws configure set region <region>`)"
    )]
    NoRegion,
    /// IAM refused a call.
    #[error("access denied: {action}{}; {advice}", on.as_ref().map(|o| format!(" on {o}")).unwrap_or_default())]
    AccessDenied {
        /// The IAM action (`cloudformation:DescribeStacks`).
        action: &'static str,
        /// What it was called on, when that helps (`stack tgsync`).
        on: Option<String>,
        /// What to do.
        advice: &'static str,
        /// What AWS said (names the identity and the policy that refused).
        detail: String,
    },
    /// `--stack` names no stack in the region.
    #[error(
        "stack `{stack}` not found in {region}: check the name (--stack or TGSYNC_STACK) and the region (--region or AWS_REGION)"
    )]
    StackNotFound {
        /// The stack.
        stack: String,
        /// The region asked.
        region: String,
        /// What CloudFormation said.
        detail: String,
    },
    /// The stack has no output (or parameter) the command needs.
    #[error(
        "stack `{stack}` ({status}) has no {what} `{name}`: is it a tgsync stack, created from tgsync's template.yaml? Or give {flag}"
    )]
    StackOutput {
        /// The stack.
        stack: String,
        /// Its status (`CREATE_COMPLETE`, `ROLLBACK_COMPLETE`, ...).
        status: String,
        /// `output` or `output or parameter`.
        what: &'static str,
        /// The output's name.
        name: &'static str,
        /// The flag that gives the value instead.
        flag: &'static str,
    },
    /// The manual function (or its alias) does not exist.
    #[error(
        "function `{function}` not found in {region}: give the deployment's stack (--stack) or its ManualFunctionName output (--function), and check the region (--region)"
    )]
    FunctionNotFound {
        /// The function (and qualifier) invoked.
        function: String,
        /// The region asked.
        region: String,
        /// What Lambda said.
        detail: String,
    },
    /// An AWS endpoint could not be reached (network, proxy, endpoint override).
    #[error("cannot reach {service} ({cause}): check the network, the region and AWS_ENDPOINT_URL")]
    Unreachable {
        /// The service.
        service: &'static str,
        /// The innermost cause (`Connection refused (os error 111)`, `timed out`).
        cause: String,
        /// The SDK's account of it.
        detail: String,
    },
    /// Any other failure of an AWS call: its code and message.
    #[error("{operation} failed: {summary}")]
    Aws {
        /// `Service Operation`.
        operation: &'static str,
        /// `Code: message`.
        summary: String,
        /// The SDK's account of it.
        detail: String,
    },
    /// A setting the command needs is not given, and no stack names it.
    #[error(
        "{flag} is not set: pass --stack NAME (or set TGSYNC_STACK) to read it from the deployment's stack, or {flag} (or {variable})"
    )]
    Missing {
        /// The flag.
        flag: &'static str,
        /// The environment variable that can stand for it.
        variable: &'static str,
    },
    /// A setting is not valid (names the variable).
    #[error(transparent)]
    Config(#[from] tgsync::config::ConfigError),
    /// The adapters could not be set up (region, credentials, CA file).
    #[error(transparent)]
    App(#[from] tgsync::app::AppError),
    /// A target group named on the command line does not exist.
    #[error(
        "no target group named `{0}` in this account and region; give its ARN (groups of other accounts are named by ARN)"
    )]
    NoSuchGroup(String),
    /// An ELBv2 read failed.
    #[error(transparent)]
    Elb(tgsync::groups::ElbError),
    /// `status` could read nothing at all (every account's discovery failed).
    #[error("reading the target groups failed: {0}")]
    Unread(String),
    /// Every attempt found the manual function's slots busy.
    #[error(
        "{function} stayed busy for {waited} s (another manual run holds its slot: Lambda answered 429 TooManyRequestsException); try again, or raise --wait"
    )]
    Busy {
        /// The function.
        function: String,
        /// Seconds spent retrying.
        waited: u64,
    },
    /// The function ran and failed, or refused the request.
    #[error("{function} failed: {message}")]
    Function {
        /// The function (and qualifier) invoked.
        function: String,
        /// Its error message.
        message: String,
    },
    /// The answer was not a report.
    #[error("{function} answered something that is not a report: {message}")]
    Answer {
        /// The function.
        function: String,
        /// Why it could not be read.
        message: String,
    },
    /// Reading the confirmation failed.
    #[error("reading the confirmation failed: {0}")]
    Io(#[from] std::io::Error),
    /// JSON output failed (never expected).
    #[error("JSON output failed: {0}")]
    Json(#[from] serde_json::Error),
}

impl CliError {
    /// The exit code: [`exit::SETUP`] when nothing of the deployment could be looked at
    /// (credentials, region, permissions, names), [`exit::ERROR`] otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NoCredentials { .. }
            | Self::NoRegion
            | Self::AccessDenied { .. }
            | Self::StackNotFound { .. }
            | Self::StackOutput { .. }
            | Self::FunctionNotFound { .. }
            | Self::Unreachable { .. }
            | Self::Missing { .. }
            | Self::Config(_)
            | Self::App(_) => exit::SETUP,
            _ => exit::ERROR,
        }
    }

    /// The SDK's (or AWS's) own account of the failure, for `--verbose`.
    pub fn detail(&self) -> Option<&str> {
        match self {
            Self::NoCredentials { detail, .. }
            | Self::AccessDenied { detail, .. }
            | Self::StackNotFound { detail, .. }
            | Self::FunctionNotFound { detail, .. }
            | Self::Unreachable { detail, .. }
            | Self::Aws { detail, .. } => Some(detail),
            _ => None,
        }
    }

    /// A `--verbose` account of a failure that is no SDK error (see
    /// `tgsync::aws::error_fields`): its kind and its cause, one `name: value` line each.
    pub fn detail_of(kind: &str, cause: &str) -> String {
        format!("kind: {kind}\ncause: {cause}")
    }

    /// The failure of an AWS call as what it means to the caller: no credentials, access
    /// denied (`action`, on `on`, with `advice`), an endpoint out of reach, or else
    /// `operation`'s error code and message. Callers match the codes that mean
    /// something of their own (not found) first.
    pub fn from_sdk<E, R>(err: &SdkError<E, R>, call: Call) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: Debug + 'static,
    {
        let detail = tgsync::aws::error_detail(err);
        if tgsync::aws::credentials_failure(err).is_some() {
            return Self::NoCredentials {
                profile: None,
                detail,
            };
        }
        if err.code().is_some_and(tgsync::aws::is_access_denied_code) {
            return Self::AccessDenied {
                action: call.action,
                on: call.on,
                advice: call.advice,
                detail,
            };
        }
        if matches!(
            err,
            SdkError::DispatchFailure(_) | SdkError::TimeoutError(_)
        ) {
            return Self::Unreachable {
                service: call.service,
                cause: innermost(err),
                detail,
            };
        }
        Self::Aws {
            operation: call.operation,
            summary: tgsync::aws::error_summary(err),
            detail,
        }
    }

    /// An ELBv2 failure of the library, as the CLI's caller should read it: IAM's refusal
    /// and missing credentials are the caller's, not a function role's.
    pub fn from_elb(err: tgsync::groups::ElbError) -> Self {
        use tgsync::groups::ElbError;
        match err {
            ElbError::AccessDenied { operation, message } => Self::AccessDenied {
                action: match operation {
                    "DescribeTargetGroups" => "elasticloadbalancing:DescribeTargetGroups",
                    "DescribeTags" => "elasticloadbalancing:DescribeTags",
                    "DescribeTargetHealth" => "elasticloadbalancing:DescribeTargetHealth",
                    "DescribeTargetGroupAttributes" => {
                        "elasticloadbalancing:DescribeTargetGroupAttributes"
                    }
                    _ => "elasticloadbalancing",
                },
                on: None,
                advice: "use credentials that may read target groups (docs/cli.md lists the permissions), or name groups by ARN",
                detail: Self::detail_of("the service answered with an error", &message),
            },
            ElbError::Credentials { message, .. } => Self::NoCredentials {
                profile: None,
                detail: Self::detail_of("no credentials", &message),
            },
            other => Self::Elb(other),
        }
    }
}

impl From<tgsync::groups::ElbError> for CliError {
    fn from(err: tgsync::groups::ElbError) -> Self {
        Self::from_elb(err)
    }
}

/// An AWS call, named for the messages of [`CliError::from_sdk`].
pub struct Call {
    /// The service as people name it (`CloudFormation`).
    pub service: &'static str,
    /// `Service Operation` (`CloudFormation DescribeStacks`).
    pub operation: &'static str,
    /// The IAM action.
    pub action: &'static str,
    /// What it is called on.
    pub on: Option<String>,
    /// What to do when IAM refuses it.
    pub advice: &'static str,
}

/// What to do without credentials: sign in, or name a profile that has them.
fn no_credentials(profile: Option<&str>) -> String {
    match profile {
        Some(p) => format!(
            "no AWS credentials for profile `{p}`: run `aws sso login --profile {p}` or `aws configure --profile {p}`, or pass another --profile"
        ),
        None => "no AWS credentials: run `aws configure` or `aws sso login`, pass --profile (or set AWS_PROFILE), or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY".to_owned(),
    }
}

/// The last message of an error's chain: the cause a person can act on (`Connection
/// refused (os error 111)`), without the layers the SDK wraps it in.
fn innermost(err: &(dyn std::error::Error + 'static)) -> String {
    let mut last = err;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_is_one_line_and_says_what_to_do() {
        let errors = [
            CliError::NoCredentials {
                profile: None,
                detail: "d".into(),
            },
            CliError::NoCredentials {
                profile: Some("prod".into()),
                detail: "d".into(),
            },
            CliError::NoRegion,
            CliError::StackNotFound {
                stack: "tgsync".into(),
                region: "eu-west-1".into(),
                detail: "d".into(),
            },
            CliError::FunctionNotFound {
                function: "tgsync-manual".into(),
                region: "eu-west-1".into(),
                detail: "d".into(),
            },
            CliError::Missing {
                flag: "--table",
                variable: "TGSYNC_TABLE_NAME",
            },
        ];
        for e in &errors {
            let line = e.to_string();
            assert!(!line.contains('\n'), "{line}");
            assert!(!line.contains("role"), "no cross-account hint: {line}");
            assert_eq!(e.exit_code(), exit::SETUP, "{line}");
        }
        assert!(
            errors[1]
                .to_string()
                .contains("`aws sso login --profile prod`")
        );
        assert!(errors[0].to_string().contains("pass --profile"));
    }
}
