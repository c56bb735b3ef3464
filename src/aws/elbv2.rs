//! [`TargetGroupApi`] on the real ELBv2 API.
//!
//! Every request — Describe calls and mutations, first attempts and retries alike —
//! waits for the client-side token bucket of its kind, shared by every clone of the
//! adapter; throttling and 5xx are retried here (the SDK's own retries are off for
//! ELBv2, since they would skip the bucket exactly when ELBv2 is throttling), and a
//! throttled answer slows every caller down (see `pace`). What survives is mapped to
//! [`ElbError`].

mod convert;
mod failure;
mod limiter;
mod pace;
mod rate;
mod zones;

use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::sync::Arc;

use aws_sdk_elasticloadbalancingv2::Client;
use aws_sdk_elasticloadbalancingv2::operation::describe_tags::DescribeTagsError;
use aws_sdk_elasticloadbalancingv2::operation::describe_target_groups::DescribeTargetGroupsOutput;
use aws_sdk_elasticloadbalancingv2::types::TargetDescription;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_runtime_api::http::Response as HttpResponse;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use super::calls::ApiCalls;
use crate::core::rollout::GroupAttributes;
use crate::core::{MAX_TARGETS_PER_CALL, Target, TargetHealth};
use crate::groups::{
    ElbError, Fence, Priority, Refusal, Refused, TagsByArn, TargetGroup, TargetGroupApi,
};

use failure::{Failure, NOT_FOUND, TOO_MANY_TARGETS, elb_error};
use pace::{Pace, Stopped};
pub use rate::{DESCRIBE_WINDOW_SECONDS, MutationRate, RateError};

/// DescribeTargetGroups page size: the API's maximum, so discovery of many groups costs
/// as few Describe tokens as possible.
pub const DESCRIBE_PAGE_SIZE: i32 = 400;

/// DescribeTags accepts at most 20 resource ARNs per call.
pub const TAGS_BATCH: usize = 20;

const DESCRIBE_TARGET_GROUPS: &str = "DescribeTargetGroups";
const DESCRIBE_TAGS: &str = "DescribeTags";
const DESCRIBE_TARGET_HEALTH: &str = "DescribeTargetHealth";
const DESCRIBE_TARGET_GROUP_ATTRIBUTES: &str = "DescribeTargetGroupAttributes";
const REGISTER_TARGETS: &str = "RegisterTargets";
const DEREGISTER_TARGETS: &str = "DeregisterTargets";

const OPERATIONS: &[&str] = &[
    DESCRIBE_TARGET_GROUPS,
    DESCRIBE_TAGS,
    DESCRIBE_TARGET_HEALTH,
    DESCRIBE_TARGET_GROUP_ATTRIBUTES,
    REGISTER_TARGETS,
    DEREGISTER_TARGETS,
];

/// The ELBv2 adapter. Cheap to clone; clones share the client, the mutation rate
/// limiter and the call counters, so one limiter bounds all concurrent reconciles.
#[derive(Clone)]
pub struct Elbv2TargetGroups {
    client: Client,
    mutations: Arc<Pace>,
    describes: Arc<Pace>,
    calls: Arc<ApiCalls>,
    /// Targets (per group) ELBv2 said are outside the group's VPC, or that
    /// DescribeTargetHealth shows in zone `all`, and the zone each is registered and
    /// deregistered with; groups that want a named zone for them.
    zones: Arc<zones::Zones>,
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
            client: without_retries(&client),
            mutations: Arc::new(Pace::new(Some(rate))),
            describes: Arc::new(Pace::new(None)),
            calls: Arc::new(ApiCalls::new(OPERATIONS)),
            zones: Arc::default(),
        }
    }

    /// Also holds the Describe calls (DescribeTargetGroups pages, DescribeTags,
    /// DescribeTargetHealth) to `rate` across all clones: ELBv2's Describe calls share a
    /// small per-account token bucket with every other tool in the account, so tgsync
    /// keeps its own bursts under a bound instead of relying on throttling and retries.
    pub fn with_describe_rate(mut self, rate: MutationRate) -> Self {
        self.describes = Arc::new(Pace::new(Some(rate)));
        self
    }

    /// The adapter for another account: calls go through `client` (whose credentials
    /// are a role in that account), and share this adapter's paces, call counters and
    /// out-of-VPC memory. The paces are the deployment's ELBv2 budget: however many
    /// accounts it serves, it never sends more than its configured rates in total. (The
    /// out-of-VPC memory is keyed by target group ARN, which names the account.)
    pub fn for_client(&self, client: Client) -> Self {
        Self {
            client: without_retries(&client),
            ..self.clone()
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

    /// The ARN of the target group named `name` in this adapter's account and region
    /// (one DescribeTargetGroups by name), `None` when there is none: operators name
    /// groups, tgsync's payloads and state take ARNs. Read-only, for the CLI.
    pub async fn arn_of_name(&self, name: &str) -> Result<Option<String>, ElbError> {
        self.calls.count(DESCRIBE_TARGET_GROUPS);
        let out = self
            .describes
            .attempts(&Priority::Reaction, || {
                self.client.describe_target_groups().names(name).send()
            })
            .await;
        match out {
            Ok(page) => Ok(page
                .target_groups()
                .iter()
                .find_map(|g| g.target_group_arn().map(str::to_owned))),
            Err(e) if e.code() == Some(NOT_FOUND) => Ok(None),
            Err(e) => Err(elb_error(DESCRIBE_TARGET_GROUPS, None, e)),
        }
    }

    /// One DescribeTargetGroups: a page of every group (from `marker`), or the named
    /// groups.
    async fn groups_page(
        &self,
        named: Option<&[String]>,
        marker: Option<String>,
        priority: &Priority,
    ) -> Result<DescribeTargetGroupsOutput, ElbError> {
        self.calls.count(DESCRIBE_TARGET_GROUPS);
        self.describes
            .attempts(priority, || {
                self.client
                    .describe_target_groups()
                    .set_target_group_arns(named.map(<[String]>::to_vec))
                    .set_page_size(named.is_none().then_some(DESCRIBE_PAGE_SIZE))
                    .set_marker(marker.clone())
                    .send()
            })
            .await
            .map_err(|e| elb_error(DESCRIBE_TARGET_GROUPS, None, e))
    }

    /// `groups` with their tags (DescribeTags in batches of [`TAGS_BATCH`]), less those
    /// deleted meanwhile.
    async fn with_tags(
        &self,
        mut groups: Vec<TargetGroup>,
        priority: &Priority,
    ) -> Result<Vec<TargetGroup>, ElbError> {
        let arns: Vec<String> = groups.iter().map(|g| g.arn.clone()).collect();
        let mut tags = TagsByArn::with_capacity(arns.len());
        let mut deleted = HashSet::new();
        for batch in arns.chunks(TAGS_BATCH) {
            self.batch_tags(batch, &mut tags, &mut deleted, priority)
                .await?;
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

    /// Tags of up to [`TAGS_BATCH`] groups into `tags`, and the ARNs of groups deleted
    /// since they were listed into `deleted`. One deleted group makes the whole batch
    /// fail with TargetGroupNotFound; the batch is then asked one ARN at a time.
    async fn batch_tags(
        &self,
        arns: &[String],
        tags: &mut TagsByArn,
        deleted: &mut HashSet<String>,
        priority: &Priority,
    ) -> Result<(), ElbError> {
        match self.describe_tags(arns, priority).await {
            Ok(found) => tags.extend(found),
            Err(err) if err.code() == Some(NOT_FOUND) && arns.len() > 1 => {
                for arn in arns {
                    match self
                        .describe_tags(std::slice::from_ref(arn), priority)
                        .await
                    {
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
        priority: &Priority,
    ) -> Result<TagsByArn, SdkError<DescribeTagsError, HttpResponse>> {
        self.calls.count(DESCRIBE_TAGS);
        let out = self
            .describes
            .attempts(priority, || {
                self.client
                    .describe_tags()
                    .set_resource_arns(Some(arns.to_vec()))
                    .send()
            })
            .await?;
        Ok(convert::tag_map(out.tag_descriptions()))
    }

    /// One mutating call per chunk of at most [`MAX_TARGETS_PER_CALL`] targets, each
    /// split further when ELBv2 refuses it because of some of its targets, so one bad
    /// target never blocks the others; the refused ones come back in
    /// [`ElbError::Rejected`], each with what it takes ([`Refusal`]):
    /// - an IP outside the group's VPC (a peered VPC, a hybrid node) is sent again with
    ///   `AvailabilityZone=all`, as ELBv2 requires;
    /// - an ALB group with cross-zone load balancing off refuses `all` and wants a zone
    ///   of its VPC: its registrations come back as [`Refusal::ZoneRequired`] for the
    ///   caller to send again with their pods' zones (remembered, so later registrations
    ///   to it make no refused call first);
    /// - the group's targets quota (`TooManyTargets`): the call is halved to register
    ///   what fits; once a single target does not fit, the rest are refused without a
    ///   call, as [`Refusal::Capacity`] (`TooManyRegistrationsForTargetId`, the quota of
    ///   one target, is narrowed down to the target like any per-target refusal);
    /// - any other per-target refusal is narrowed down by halving until the refused
    ///   targets stand alone.
    async fn mutate(
        &self,
        kind: Mutation,
        arn: &str,
        targets: &[Target],
        fence: &dyn Fence,
    ) -> Result<(), ElbError> {
        let mut refused: Vec<Refused> = Vec::new();
        let mut queue: std::collections::VecDeque<Vec<Target>> = targets
            .chunks(MAX_TARGETS_PER_CALL)
            .map(<[Target]>::to_vec)
            .collect();
        // The group is at its quota: ELBv2's reason, for the targets not tried.
        let mut full: Option<String> = None;
        let mut zones_learnt = false;
        while let Some(mut batch) = queue.pop_front() {
            if let Some(reason) = &full {
                refused.extend(batch.iter().map(|t| Refused {
                    target: *t,
                    reason: reason.clone(),
                    refusal: Refusal::Capacity,
                }));
                continue;
            }
            if matches!(kind, Mutation::Register) && self.zones.wants_named(arn) {
                // No refused call first: every registration of such a group is made in
                // its pod's zone (for an IP of the VPC the zone is optional, and its
                // node's is its own).
                let (waiting, ready): (Vec<Target>, Vec<Target>) = batch
                    .into_iter()
                    .partition(|t| self.zones.zone(arn, t).is_none_or(|z| z == zones::ALL));
                refused.extend(waiting.into_iter().map(|t| Refused {
                    target: t,
                    reason: ZONE_REQUIRED.to_owned(),
                    refusal: Refusal::ZoneRequired,
                }));
                if ready.is_empty() {
                    continue;
                }
                batch = ready;
            }
            let failure = match self.call(kind, arn, &batch, fence).await {
                Ok(()) => continue,
                Err(Stopped::Fenced(reason)) => {
                    return Err(ElbError::Fenced {
                        operation: kind.operation(),
                        reason,
                    });
                }
                Err(Stopped::Failed(f)) => f,
            };
            if let Some(ip) = failure.zone_required_ip() {
                let newly = self.zones.mark_wants_named(arn);
                let named: Vec<Target> = batch.iter().filter(|t| t.ip == ip).copied().collect();
                let marked = self.zones.mark_outside(arn, &named);
                match kind {
                    Mutation::Register if newly || marked => {
                        queue.push_front(batch);
                        continue;
                    }
                    // A deregistration wants the zone the target is described in:
                    // learn it once (one DescribeTargetHealth) and try again.
                    Mutation::Deregister if !zones_learnt => {
                        zones_learnt = true;
                        if self.health(arn, &Priority::Reaction).await.is_ok() {
                            queue.push_front(batch);
                            continue;
                        }
                    }
                    _ => {}
                }
            }
            if let Some(ip) = failure.outside_vpc_ip() {
                let newly_outside: Vec<Target> =
                    batch.iter().filter(|t| t.ip == ip).copied().collect();
                if !newly_outside.is_empty() && self.zones.mark_outside(arn, &newly_outside) {
                    queue.push_front(batch);
                    continue;
                }
            }
            let refusal = failure.refusal();
            let splits = failure.per_target() || refusal == Refusal::Capacity;
            if !splits && !matches!(kind, Mutation::Deregister) {
                // A failure of the call, not of its targets (access denied, retries
                // exhausted): the group's, whatever went through before it.
                return Err(failure.error);
            }
            if splits && batch.len() > 1 {
                let (a, b) = batch.split_at(batch.len() / 2);
                queue.push_front(b.to_vec());
                queue.push_front(a.to_vec());
                continue;
            }
            // Deregistering a target that is not registered: ELBv2 documents that as a
            // success; an answer of InvalidTarget for it (some implementations, or a
            // retry of a call that had landed) means the target is gone, as wanted.
            if matches!(kind, Mutation::Deregister)
                && failure.code.as_deref() == Some("InvalidTarget")
            {
                tracing::debug!(
                    target_group = arn,
                    targets = batch.len(),
                    "deregistering targets that are not registered"
                );
                continue;
            }
            let reason = failure.reason();
            if failure.code.as_deref() == Some(TOO_MANY_TARGETS) {
                // One target does not fit: neither will the rest.
                full = Some(reason.clone());
            }
            if !splits {
                // A deregistration that failed for the call: ELBv2's error as it is.
                return Err(failure.error);
            }
            refused.extend(batch.iter().map(|t| Refused {
                target: *t,
                reason: reason.clone(),
                refusal,
            }));
        }
        if refused.is_empty() {
            Ok(())
        } else {
            // Refused for what is in them (each target's reason, even a call's single
            // target): the caller settles each target.
            Err(ElbError::Rejected {
                operation: kind.operation(),
                targets: refused,
            })
        }
    }

    /// One RegisterTargets / DeregisterTargets of `batch`, every attempt paced (see
    /// [`Pace`]) and fenced.
    async fn call(
        &self,
        kind: Mutation,
        arn: &str,
        batch: &[Target],
        fence: &dyn Fence,
    ) -> Result<(), Stopped<Failure>> {
        let descriptions: Vec<TargetDescription> = batch
            .iter()
            .map(|t| convert::description(t, self.zones.zone(arn, t).as_deref()))
            .collect();
        let operation = kind.operation();
        // Counted once per call, like every other operation (attempts are not calls).
        self.calls.count(operation);
        match kind {
            Mutation::Register => self
                .mutations
                .fenced_attempts(Some(fence), || {
                    self.client
                        .register_targets()
                        .target_group_arn(arn)
                        .set_targets(Some(descriptions.clone()))
                        .send()
                })
                .await
                .map(|_| ())
                .map_err(|e| e.map(|e| Failure::new(operation, arn, e))),
            Mutation::Deregister => self
                .mutations
                .fenced_attempts(Some(fence), || {
                    self.client
                        .deregister_targets()
                        .target_group_arn(arn)
                        .set_targets(Some(descriptions.clone()))
                        .send()
                })
                .await
                .map(|_| ())
                .map_err(|e| e.map(|e| Failure::new(operation, arn, e))),
        }
    }
}

/// `client` with the SDK's own retries off: [`Pace::attempts`] retries instead, each
/// attempt through the client-side bucket. Set once on the client: an override per
/// request builds and merges a configuration layer on every call. (So the adapter's
/// clients need no retry partition: they draw on no retry quota.)
fn without_retries(client: &Client) -> Client {
    Client::from_conf(
        client
            .config()
            .to_builder()
            .retry_config(aws_config::retry::RetryConfig::disabled())
            .build(),
    )
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

/// Why a target of a group that refuses `all` was not sent yet.
const ZONE_REQUIRED: &str = "ELBv2 RegisterTargets: the group has cross-zone load balancing off and wants an Availability Zone of its VPC for this IP outside the VPC; it is registered in its node's zone";

impl TargetGroupApi for Elbv2TargetGroups {
    async fn discover(&self, priority: &Priority) -> Result<Vec<TargetGroup>, ElbError> {
        let mut groups = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let page = self.groups_page(None, marker.clone(), priority).await?;
            groups.extend(page.target_groups().iter().filter_map(convert::group));
            match page.next_marker().filter(|m| !m.is_empty()) {
                Some(next) if marker.as_deref() != Some(next) => marker = Some(next.to_owned()),
                _ => break,
            }
        }

        self.with_tags(groups, priority).await
    }

    async fn describe(
        &self,
        arns: &[String],
        priority: &Priority,
    ) -> Result<Vec<TargetGroup>, ElbError> {
        if arns.is_empty() {
            return Ok(Vec::new());
        }
        let page = self.groups_page(Some(arns), None, priority).await?;
        let groups = page
            .target_groups()
            .iter()
            .filter_map(convert::group)
            .collect();
        self.with_tags(groups, priority).await
    }

    async fn tags_of(&self, arns: &[String], priority: &Priority) -> Result<TagsByArn, ElbError> {
        let named = arns.first().map(String::as_str);
        self.describe_tags(arns, priority)
            .await
            .map_err(|e| elb_error(DESCRIBE_TAGS, named, e))
    }

    async fn health(&self, arn: &str, priority: &Priority) -> Result<Vec<TargetHealth>, ElbError> {
        self.calls.count(DESCRIBE_TARGET_HEALTH);
        // The whole group, never filtered by target: a filter naming a zone finds
        // nothing when ELBv2 recorded another, and a target would look unregistered.
        let out = self
            .describes
            .attempts(priority, || {
                self.client
                    .describe_target_health()
                    .target_group_arn(arn)
                    .send()
            })
            .await
            .map_err(|e| elb_error(DESCRIBE_TARGET_HEALTH, Some(arn), e))?;
        Ok(out
            .target_health_descriptions()
            .iter()
            .filter_map(|d| {
                let health = convert::health(d)?;
                let zone = d.target().and_then(|t| t.availability_zone());
                self.zones.described(arn, &health.target, zone);
                Some(health)
            })
            .collect())
    }

    async fn attributes(
        &self,
        arn: &str,
        priority: &Priority,
    ) -> Result<GroupAttributes, ElbError> {
        self.calls.count(DESCRIBE_TARGET_GROUPS);
        let page = self
            .describes
            .attempts(priority, || {
                self.client
                    .describe_target_groups()
                    .target_group_arns(arn)
                    .send()
            })
            .await
            .map_err(|e| elb_error(DESCRIBE_TARGET_GROUPS, Some(arn), e))?;
        let Some(group) = page
            .target_groups()
            .iter()
            .find(|g| g.target_group_arn() == Some(arn))
        else {
            return Err(ElbError::NotFound {
                arn: arn.to_owned(),
            });
        };
        self.calls.count(DESCRIBE_TARGET_GROUP_ATTRIBUTES);
        let out = self
            .describes
            .attempts(priority, || {
                self.client
                    .describe_target_group_attributes()
                    .target_group_arn(arn)
                    .send()
            })
            .await
            .map_err(|e| elb_error(DESCRIBE_TARGET_GROUP_ATTRIBUTES, Some(arn), e))?;
        Ok(convert::attributes(group, out.attributes()))
    }

    async fn register(
        &self,
        arn: &str,
        targets: &[Target],
        fence: &dyn Fence,
    ) -> Result<(), ElbError> {
        self.mutate(Mutation::Register, arn, targets, fence).await
    }

    async fn register_in_zones(
        &self,
        arn: &str,
        targets: &[(Target, String)],
        fence: &dyn Fence,
    ) -> Result<(), ElbError> {
        for (t, zone) in targets {
            self.zones.set(arn, t, zone);
        }
        let targets: Vec<Target> = targets.iter().map(|(t, _)| *t).collect();
        self.mutate(Mutation::Register, arn, &targets, fence).await
    }

    async fn deregister(
        &self,
        arn: &str,
        targets: &[Target],
        fence: &dyn Fence,
    ) -> Result<(), ElbError> {
        self.mutate(Mutation::Deregister, arn, targets, fence).await
    }

    fn pressure(&self) -> crate::report::ElbPressure {
        let (m, d) = (self.mutations.pressure(), self.describes.pressure());
        crate::report::ElbPressure {
            throttles: m.throttles + d.throttles,
            retries: m.retries + d.retries,
        }
    }
}
