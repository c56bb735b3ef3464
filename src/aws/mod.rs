//! AWS adapters: the ELBv2 side of [`TargetGroupApi`](crate::groups::TargetGroupApi) and
//! the DynamoDB side of [`StateStore`](crate::state::StateStore).
//!
//! Both share one SDK configuration, so every call gets the SDK's own standard retry
//! strategy (exponential backoff with jitter on throttling, 5xx and transient network
//! errors) and bounded timeouts; nothing here hand-writes a retry loop for those. What
//! survives the SDK's retries is mapped to the crate's typed errors with a short
//! `Code: message` an operator can act on.

pub mod accounts;
mod calls;
pub mod dynamo;
pub mod elbv2;
mod sdk_error;
pub mod zone_names;

use std::error::Error;
use std::fmt::Debug;
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, ConfigLoader, SdkConfig};
use aws_smithy_runtime_api::client::result::SdkError;

pub use accounts::{Accounts, TargetAccountRole};
pub use calls::ApiCalls;
pub use dynamo::{DynamoState, IAM_ACTIONS as DYNAMODB_IAM_ACTIONS, create_table};
pub use elbv2::{DESCRIBE_WINDOW_SECONDS, Elbv2TargetGroups, MutationRate, RateError};
pub use sdk_error::{
    chain as error_chain, error_detail, error_fields, error_line as error_summary,
};

/// Attempts per call (the first plus seven retries, backing off exponentially from
/// 100 ms to at most 5 s): enough to ride out a storm of throttling from a per-account
/// token bucket (at 50 % faulted answers, one call in 256 fails for good, against one in
/// 32 with five attempts) without outliving a Lambda or a lease.
pub const MAX_ATTEMPTS: u32 = 8;

/// First backoff of the SDK's retries (DynamoDB, EKS); it doubles up to [`MAX_BACKOFF`].
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(100);

/// Largest backoff between two attempts of one call.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Time to open a connection; AWS endpoints answer in milliseconds, so a longer wait
/// means a network problem better retried than waited on.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Bound on one attempt (connect, send, read), so a hung connection is retried instead
/// of eating the whole invocation.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Bound on one RegisterTargets / DeregisterTargets attempt, all of it: resolving
/// credentials, connecting, signing, sending and reading the answer. The lease's write
/// margin ([`crate::lease::Timings::write_margin`]) is longer, so an attempt started
/// under a fresh lease has ended (answered or abandoned) before the lease expires; the
/// takeover grace ([`crate::lease::Timings::takeover_grace`]) is longer too, so one
/// sent by a holder whose clock ran behind still lands before a new holder acts.
pub const MUTATION_ATTEMPT_DEADLINE: Duration = Duration::from_secs(5);

/// Bound on a whole call including all retries and their backoff, well inside a Lambda
/// timeout so the function can still report and release its lease.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(40);

/// The retry partition of tgsync's clients of `service`: the SDK's standard retries
/// without the SDK's retry quota.
///
/// By default every client of a service and region in the process draws its retries
/// from one quota (500 tokens, 5 per retry, 1 back per success). A throttling storm
/// empties it in about 100 retries, and it stays empty across warm invocations: from
/// then on each call gives up on its first throttled or failed answer, so groups fail
/// run after run exactly while the service is struggling. tgsync bounds its attempts
/// itself (every ELBv2 attempt through its client-side buckets; every call by
/// [`MAX_ATTEMPTS`], backoff and [`OPERATION_TIMEOUT`], at its own concurrency), so the
/// quota only costs convergence.
pub fn retry_partition(service: &'static str) -> aws_sdk_dynamodb::config::retry::RetryPartition {
    use aws_sdk_dynamodb::config::retry::{RetryPartition, TokenBucket};
    RetryPartition::custom(service)
        .token_bucket(TokenBucket::unlimited())
        .build()
}

/// The loader behind [`sdk_config`]: the standard credential and region chain with
/// tgsync's retry and timeout settings. Tests and the local sandbox start from it and
/// override the endpoint, region and credentials explicitly, so they exercise exactly
/// the retry and timeout behaviour production gets.
pub fn config_loader() -> ConfigLoader {
    aws_config::defaults(BehaviorVersion::latest())
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(MAX_ATTEMPTS)
                .with_initial_backoff(INITIAL_BACKOFF)
                .with_max_backoff(MAX_BACKOFF),
        )
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .operation_attempt_timeout(ATTEMPT_TIMEOUT)
                .operation_timeout(OPERATION_TIMEOUT)
                .build(),
        )
}

/// The SDK configuration both adapters are built from: region and credentials from the
/// standard chain (in Lambda, the function's role), `AWS_ENDPOINT_URL` honoured by the
/// SDK itself (how local emulators are reached), standard retries with
/// [`MAX_ATTEMPTS`] and the timeouts above.
pub async fn sdk_config() -> SdkConfig {
    config_loader().load().await
}

/// What the credentials provider said when a call failed for want of credentials (for a
/// target account: the role could not be assumed), found anywhere in the error's chain;
/// `None` for any other failure. Such a failure is not worth retrying call by call: the
/// provider's own STS client has already retried what was transient.
pub fn credentials_failure<E, R>(err: &SdkError<E, R>) -> Option<String>
where
    E: Error + 'static,
    R: Debug + 'static,
{
    let mut next: Option<&(dyn Error + 'static)> = Some(err);
    while let Some(e) = next {
        if e.is::<aws_credential_types::provider::error::CredentialsError>() {
            return Some(chain_summary(e));
        }
        next = e.source();
    }
    None
}

/// `Code: message` of the first service error in `err`'s chain (what STS said when a
/// role could not be assumed), or else the chain's messages joined by `: `; never the
/// SDK's debug dump of the raw response.
fn chain_summary(err: &(dyn Error + 'static)) -> String {
    let mut messages = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(meta) = e.downcast_ref::<aws_smithy_types::error::ErrorMetadata>()
            && let Some(code) = meta.code()
        {
            return match meta.message() {
                Some(message) if !message.is_empty() => format!("{code}: {message}"),
                _ => code.to_owned(),
            };
        }
        messages.push(e.to_string());
        next = e.source();
    }
    messages.join(": ")
}

/// Error codes AWS services use for throttling (the SDK's own retry classifier list):
/// such an error that survives the SDK's retries means "back off", not "broken".
const THROTTLING_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "LimitExceededException",
    "RequestThrottled",
    "SlowDown",
    "PriorRequestNotComplete",
    "EC2ThrottledException",
];

/// Whether an error code means the caller was throttled.
pub fn is_throttling_code(code: &str) -> bool {
    THROTTLING_CODES.contains(&code)
}

/// Whether an error code means IAM refused the call (fix the role, retrying won't help).
pub fn is_access_denied_code(code: &str) -> bool {
    matches!(
        code,
        "AccessDenied" | "AccessDeniedException" | "UnauthorizedOperation"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_codes() {
        assert!(is_throttling_code("Throttling"));
        assert!(is_throttling_code("ProvisionedThroughputExceededException"));
        assert!(!is_throttling_code("ValidationError"));
        assert!(is_access_denied_code("AccessDenied"));
        assert!(is_access_denied_code("AccessDeniedException"));
        assert!(!is_access_denied_code("TargetGroupNotFound"));
    }
}
