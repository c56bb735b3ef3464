//! [`TargetGroupApi`] on the real ELBv2 API.
//!
//! Reads (DescribeTargetGroups, DescribeTags, DescribeTargetHealth) go straight to the
//! SDK; mutations (RegisterTargets, DeregisterTargets) first wait on a client-side rate
//! limiter shared by every clone of the adapter. Throttling and 5xx are retried by the
//! SDK's standard retry strategy ([`super::sdk_config`]); what survives is mapped to
//! [`ElbError`].

mod convert;
mod rate;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::error::Error;
use std::fmt::Debug;
use std::sync::Arc;

use aws_sdk_elasticloadbalancingv2::Client;
use aws_sdk_elasticloadbalancingv2::operation::describe_tags::DescribeTagsError;
use aws_sdk_elasticloadbalancingv2::types::TargetDescription;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_runtime_api::http::Response as HttpResponse;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use governor::DefaultDirectRateLimiter;

use super::calls::ApiCalls;
use super::{error_summary, is_access_denied_code, is_throttling_code};
use crate::core::{HealthState, MAX_TARGETS_PER_CALL, Target};
use crate::groups::{ElbError, TargetGroup, TargetGroupApi};

pub use rate::{MutationRate, RateError};

/// DescribeTargetGroups page size: the API's maximum, so discovery of many groups costs
/// as few Describe tokens as possible.
pub const DESCRIBE_PAGE_SIZE: i32 = 400;

/// DescribeTags accepts at most 20 resource ARNs per call.
pub const TAGS_BATCH: usize = 20;

const DESCRIBE_TARGET_GROUPS: &str = "DescribeTargetGroups";
const DESCRIBE_TAGS: &str = "DescribeTags";
const DESCRIBE_TARGET_HEALTH: &str = "DescribeTargetHealth";
const REGISTER_TARGETS: &str = "RegisterTargets";
const DEREGISTER_TARGETS: &str = "DeregisterTargets";

const OPERATIONS: &[&str] = &[
    DESCRIBE_TARGET_GROUPS,
    DESCRIBE_TAGS,
    DESCRIBE_TARGET_HEALTH,
    REGISTER_TARGETS,
    DEREGISTER_TARGETS,
];

/// The ELBv2 adapter. Cheap to clone; clones share the client, the mutation rate
/// limiter and the call counters, so one limiter bounds all concurrent reconciles.
#[derive(Clone)]
pub struct Elbv2TargetGroups {
    client: Client,
    limiter: Arc<DefaultDirectRateLimiter>,
    describe_limiter: Option<Arc<DefaultDirectRateLimiter>>,
    calls: Arc<ApiCalls>,
}

impl Debug for Elbv2TargetGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elbv2TargetGroups")
            .field("calls", &self.calls.snapshot())
            .finish_non_exhaustive()
    }
}

impl Elbv2TargetGroups {
    /// An adapter over `client` whose RegisterTargets / DeregisterTargets calls are held
    /// to `rate` across all clones.
    pub fn new(client: Client, rate: MutationRate) -> Self {
        Self {
            client,
            limiter: Arc::new(rate.limiter()),
            describe_limiter: None,
            calls: Arc::new(ApiCalls::new(OPERATIONS)),
        }
    }

    /// Also holds the Describe calls (DescribeTargetGroups pages, DescribeTags,
    /// DescribeTargetHealth) to `rate` across all clones: ELBv2's Describe calls share a
    /// small per-account token bucket with every other tool in the account, so tgsync
    /// keeps its own bursts under a bound instead of relying on throttling and retries.
    pub fn with_describe_rate(mut self, rate: MutationRate) -> Self {
        self.describe_limiter = Some(Arc::new(rate.limiter()));
        self
    }

    /// Waits for a Describe slot when a Describe rate is set.
    async fn describe_slot(&self) {
        if let Some(limiter) = &self.describe_limiter {
            limiter.until_ready().await;
        }
    }

    /// Builds the client from an SDK configuration (normally [`super::sdk_config`]).
    pub fn from_sdk_config(config: &aws_config::SdkConfig, rate: MutationRate) -> Self {
        Self::new(Client::new(config), rate)
    }

    /// Calls made so far per operation (each page counts; SDK retries do not), for
    /// benchmarks and reports.
    pub fn api_calls(&self) -> BTreeMap<&'static str, u64> {
        self.calls.snapshot()
    }

    /// Tags of up to [`TAGS_BATCH`] groups into `tags`, and the ARNs of groups deleted
    /// since they were listed into `deleted`. One deleted group makes the whole batch
    /// fail with TargetGroupNotFound; the batch is then asked one ARN at a time.
    async fn tags(
        &self,
        arns: &[String],
        tags: &mut TagsByArn,
        deleted: &mut HashSet<String>,
    ) -> Result<(), ElbError> {
        match self.describe_tags(arns).await {
            Ok(found) => tags.extend(found),
            Err(err) if err.code() == Some(NOT_FOUND) && arns.len() > 1 => {
                for arn in arns {
                    match self.describe_tags(std::slice::from_ref(arn)).await {
                        Ok(found) => tags.extend(found),
                        Err(err) if err.code() == Some(NOT_FOUND) => {
                            deleted.insert(arn.clone());
                        }
                        Err(err) => return Err(elb_error(DESCRIBE_TAGS, None, err)),
                    }
                }
            }
            Err(err) if err.code() == Some(NOT_FOUND) => deleted.extend(arns.iter().cloned()),
            Err(err) => return Err(elb_error(DESCRIBE_TAGS, None, err)),
        }
        Ok(())
    }

    async fn describe_tags(
        &self,
        arns: &[String],
    ) -> Result<TagsByArn, SdkError<DescribeTagsError, HttpResponse>> {
        self.describe_slot().await;
        self.calls.count(DESCRIBE_TAGS);
        let out = self
            .client
            .describe_tags()
            .set_resource_arns(Some(arns.to_vec()))
            .send()
            .await?;
        Ok(convert::tag_map(out.tag_descriptions()))
    }

    /// One mutating call per chunk of at most [`MAX_TARGETS_PER_CALL`] targets. Every
    /// attempt, retries included, waits for the shared limiter: the SDK's own retries are
    /// off for these calls (they would skip the limiter exactly when ELBv2 is throttling),
    /// and throttling, 5xx and transport failures are retried here, up to
    /// [`MAX_ATTEMPTS`](super::MAX_ATTEMPTS), with exponential backoff and full jitter.
    async fn mutate(&self, kind: Mutation, arn: &str, targets: &[Target]) -> Result<(), ElbError> {
        for chunk in targets.chunks(MAX_TARGETS_PER_CALL) {
            let descriptions: Vec<TargetDescription> =
                chunk.iter().map(convert::description).collect();
            let operation = kind.operation();
            // Counted once per call, like every other operation (attempts are not calls).
            self.calls.count(operation);
            let mut attempt = 0u32;
            loop {
                attempt += 1;
                self.limiter.until_ready().await;
                let no_retry = aws_sdk_elasticloadbalancingv2::config::Builder::default()
                    .retry_config(aws_config::retry::RetryConfig::disabled());
                let (retry, error) = match kind {
                    Mutation::Register => match self
                        .client
                        .register_targets()
                        .target_group_arn(arn)
                        .set_targets(Some(descriptions.clone()))
                        .customize()
                        .config_override(no_retry)
                        .send()
                        .await
                    {
                        Ok(_) => break,
                        Err(e) => (retryable(&e), elb_error(operation, Some(arn), e)),
                    },
                    Mutation::Deregister => match self
                        .client
                        .deregister_targets()
                        .target_group_arn(arn)
                        .set_targets(Some(descriptions.clone()))
                        .customize()
                        .config_override(no_retry)
                        .send()
                        .await
                    {
                        Ok(_) => break,
                        Err(e) => (retryable(&e), elb_error(operation, Some(arn), e)),
                    },
                };
                if !retry || attempt >= super::MAX_ATTEMPTS {
                    return Err(error);
                }
                let ceiling_ms = 100u64.saturating_mul(1 << (attempt - 1).min(6)).min(5_000);
                tokio::time::sleep(std::time::Duration::from_millis(fastrand::u64(
                    0..=ceiling_ms,
                )))
                .await;
            }
        }
        Ok(())
    }
}

/// Whether a failed call is worth another attempt: throttling, a 5xx, a timeout or a
/// transport failure (what the SDK's standard retry classifier retries).
fn retryable<E: ProvideErrorMetadata>(err: &SdkError<E, HttpResponse>) -> bool {
    match err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(ctx) => {
            ctx.raw().status().as_u16() >= 500 || ctx.err().code().is_some_and(is_throttling_code)
        }
        _ => false,
    }
}

/// The two rate-limited calls.
#[derive(Debug, Clone, Copy)]
enum Mutation {
    Register,
    Deregister,
}

impl Mutation {
    fn operation(self) -> &'static str {
        match self {
            Self::Register => REGISTER_TARGETS,
            Self::Deregister => DEREGISTER_TARGETS,
        }
    }
}

/// Tags per target group ARN.
type TagsByArn = HashMap<String, BTreeMap<String, String>>;

/// ELBv2's error code for a target group that does not exist.
const NOT_FOUND: &str = "TargetGroupNotFound";

/// Maps an SDK error that survived retries: a missing group (when the call names one),
/// throttling, IAM refusal, or anything else with its `Code: message`.
fn elb_error<E, R>(operation: &'static str, arn: Option<&str>, err: SdkError<E, R>) -> ElbError
where
    E: ProvideErrorMetadata + Error + 'static,
    R: Debug,
{
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

impl TargetGroupApi for Elbv2TargetGroups {
    async fn discover(&self) -> Result<Vec<TargetGroup>, ElbError> {
        let mut groups = Vec::new();
        let mut pages = self
            .client
            .describe_target_groups()
            .page_size(DESCRIBE_PAGE_SIZE)
            .into_paginator()
            .send();
        loop {
            self.describe_slot().await;
            let Some(page) = pages.next().await else {
                break;
            };
            self.calls.count(DESCRIBE_TARGET_GROUPS);
            let page = page.map_err(|e| elb_error(DESCRIBE_TARGET_GROUPS, None, e))?;
            groups.extend(page.target_groups().iter().filter_map(convert::group));
        }

        let arns: Vec<String> = groups.iter().map(|g| g.arn.clone()).collect();
        let mut tags = TagsByArn::with_capacity(arns.len());
        let mut deleted = HashSet::new();
        for batch in arns.chunks(TAGS_BATCH) {
            self.tags(batch, &mut tags, &mut deleted).await?;
        }
        if !deleted.is_empty() {
            tracing::info!(
                count = deleted.len(),
                "target groups deleted during discovery; skipped"
            );
            groups.retain(|g| !deleted.contains(&g.arn));
        }
        for group in &mut groups {
            group.tags = tags.remove(&group.arn).unwrap_or_default();
        }
        Ok(groups)
    }

    async fn health(&self, arn: &str) -> Result<Vec<(Target, HealthState)>, ElbError> {
        self.describe_slot().await;
        self.calls.count(DESCRIBE_TARGET_HEALTH);
        let out = self
            .client
            .describe_target_health()
            .target_group_arn(arn)
            .send()
            .await
            .map_err(|e| elb_error(DESCRIBE_TARGET_HEALTH, Some(arn), e))?;
        Ok(out
            .target_health_descriptions()
            .iter()
            .filter_map(convert::health)
            .collect())
    }

    async fn register(&self, arn: &str, targets: &[Target]) -> Result<(), ElbError> {
        self.mutate(Mutation::Register, arn, targets).await
    }

    async fn deregister(&self, arn: &str, targets: &[Target]) -> Result<(), ElbError> {
        self.mutate(Mutation::Deregister, arn, targets).await
    }
}
