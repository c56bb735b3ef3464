//! The target-group side of I/O: discover groups with their tags, read health, and
//! register or deregister targets — in this account, and in the accounts a deployment
//! reaches through roles (see [`crate::aws::accounts`]).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;

use thiserror::Error;

use crate::core::rollout::GroupAttributes;
use crate::core::{GroupFacts, Target, TargetHealth};

/// A target group as discovery sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetGroup {
    /// Target group ARN.
    pub arn: String,
    /// Target group name (for reports).
    pub name: String,
    /// Target type, port and address family.
    pub facts: GroupFacts,
    /// All tags of the group.
    pub tags: BTreeMap<String, String>,
}

/// Whether a mutating ELBv2 call may still go out. Implemented by the lease: checked
/// before every attempt — first tries, retries and chunk splits alike — so a holder that
/// lost its lease (or is about to) sends nothing more, however long its call has been
/// retrying.
pub trait Fence: Send + Sync {
    /// `Err` with the reason when no further attempt may be sent.
    fn check(&self) -> Result<(), String>;

    /// An attempt sent under the fence was abandoned without an answer (its deadline
    /// passed, or the connection failed): it may still land later. The lease it was
    /// sent under then ends with the takeover grace instead of at once.
    fn abandoned(&self) {}
}

/// How a request's ELBv2 reads wait for the Describe budget: the request carries it to
/// each call it makes (see `aws::elbv2::pace`). Changes (Register/DeregisterTargets)
/// always take their slot as a reaction's do.
#[derive(Debug, Clone, Default)]
pub enum Priority {
    /// A pod change's or a gate's read, an operator's, a one-shot run's: slots in
    /// arrival order.
    #[default]
    Reaction,
    /// Background work (discovery, the full diff's verifications): yields the budget to
    /// reactions until promoted, and may stand down before its first call (see
    /// [`Promotion`]).
    Background(Promotion),
}

impl Priority {
    /// Background work not tied to a group (discovery).
    pub fn background() -> Self {
        Self::Background(Promotion::default())
    }

    /// The promotion of background work that still yields (not promoted yet).
    pub fn yielding(&self) -> Option<&Promotion> {
        match self {
            Self::Background(p) if !p.is_promoted() => Some(p),
            _ => None,
        }
    }

    /// Right before each call goes out: background work that stands down stops here
    /// (see [`Promotion`]); it is dropped by [`until_stood_down`].
    pub(crate) async fn sending(&self) {
        if let Self::Background(p) = self {
            p.sending().await;
        }
    }
}

/// Two priorities are the same when both are reactions' or both are the same work's.
impl PartialEq for Priority {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Reaction, Self::Reaction) => true,
            (Self::Background(a), Self::Background(b)) => std::sync::Arc::ptr_eq(&a.0, &b.0),
            _ => false,
        }
    }
}

impl Eq for Priority {}

/// What happens to background work when a pod change for its group arrives (the change
/// can only start once the work ends: one pass per group at a time). Work that has sent
/// no ELBv2 call yet stands down: [`until_stood_down`] drops it at its first
/// call and the change's own pass looks at the group instead, so the group's health is
/// read once, for pods as they are now (a verification that went on would read it for
/// pods as they were, then the change's pass again). Work that has sent a call may be
/// changing the group: it is promoted to a reaction's priority instead.
#[derive(Debug, Clone, Default)]
pub struct Promotion(std::sync::Arc<PromotionInner>);

#[derive(Debug, Default)]
struct PromotionInner {
    promoted: std::sync::atomic::AtomicBool,
    /// The work found a change to make (see [`Promotion::found_change`]).
    ahead: std::sync::atomic::AtomicBool,
    /// [`UNSENT`], [`SENT`], [`STANDING_DOWN`] or [`STOOD_DOWN`].
    calls: std::sync::atomic::AtomicU8,
    notify: tokio::sync::Notify,
}

/// No ELBv2 call of the work has gone out.
const UNSENT: u8 = 0;
/// One has.
const SENT: u8 = 1;
/// A pod change arrived before any did: the work stops at its first call.
const STANDING_DOWN: u8 = 2;
/// The work reached its first call standing down and waits to be dropped.
const STOOD_DOWN: u8 = 3;

impl Promotion {
    /// The work found that its group has something to change (a verification whose
    /// checkpoint does not cover the group's desired set): from its next call on, it
    /// still yields to reactions but goes ahead of background work that only
    /// re-verifies a group at rest, so a change the watch could not see (a cold
    /// container's first run) never waits for a large fleet's re-verifications.
    pub fn found_change(&self) {
        self.0
            .ahead
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether [`Promotion::found_change`] was called.
    pub fn has_change(&self) -> bool {
        self.0.ahead.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A pod change for the work's group arrived: the work stands down if it has sent
    /// no ELBv2 call yet, else it is promoted (see [`Promotion`]).
    pub fn change_arrived(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        if self
            .0
            .calls
            .compare_exchange(UNSENT, STANDING_DOWN, SeqCst, SeqCst)
            .is_ok()
        {
            self.0.notify.notify_waiters();
        } else {
            self.promote();
        }
    }

    /// From now on, the work's calls no longer yield to reactions (also those waiting).
    pub fn promote(&self) {
        self.0
            .promoted
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }

    /// Whether [`Promotion::promote`] was called.
    pub fn is_promoted(&self) -> bool {
        self.0.promoted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether the work stands down (see [`Promotion::change_arrived`]).
    fn standing_down(&self) -> bool {
        self.0.calls.load(std::sync::atomic::Ordering::SeqCst) >= STANDING_DOWN
    }

    /// Completes once promoted or standing down: the work no longer waits as background.
    pub async fn promoted(&self) {
        self.until(|p| p.is_promoted() || p.standing_down()).await;
    }

    /// Completes once `done` holds (checked at each notification).
    async fn until(&self, done: impl Fn(&Self) -> bool) {
        loop {
            let notified = self.0.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if done(self) {
                return;
            }
            notified.await;
        }
    }

    /// An ELBv2 call of the work is about to go out: recorded, unless the work stands
    /// down, in which case this never completes and the work is dropped.
    async fn sending(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        match self.0.calls.compare_exchange(UNSENT, SENT, SeqCst, SeqCst) {
            Ok(_) | Err(SENT) => {}
            Err(_) => {
                self.0.calls.store(STOOD_DOWN, SeqCst);
                self.0.notify.notify_waiters();
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Runs `work`, background work of `promotion` (its reads carry
/// [`Priority::Background`] of it); `None` when the work stood down before its first
/// ELBv2 call (see [`Promotion`]): it was dropped there, having sent nothing to ELBv2.
pub async fn until_stood_down<F: Future>(promotion: Promotion, work: F) -> Option<F::Output> {
    let stood_down =
        promotion.until(|p| p.0.calls.load(std::sync::atomic::Ordering::SeqCst) == STOOD_DOWN);
    tokio::select! {
        biased;
        out = work => Some(out),
        () = stood_down => None,
    }
}

/// Tags per target group ARN (a DescribeTags answer).
pub type TagsByArn = HashMap<String, BTreeMap<String, String>>;

/// Takes `arn`'s tags out of a DescribeTags answer: a group the answer leaves out was not
/// found (moto answers an unknown ARN so; ELBv2 fails the whole call instead).
pub(crate) fn take_tags(
    read: &mut TagsByArn,
    arn: &str,
) -> Result<BTreeMap<String, String>, ElbError> {
    read.remove(arn).ok_or_else(|| ElbError::NotFound {
        arn: arn.to_owned(),
    })
}

/// ELBv2 operations tgsync needs. Implementations rate-limit the mutating calls and retry
/// throttling and 5xx with backoff and jitter.
pub trait TargetGroupApi: Send + Sync {
    /// Every target group of the account and region with its tags (DescribeTargetGroups
    /// pages + DescribeTags in batches of 20). Each read waits for the Describe budget
    /// at `priority`, here and in every read below.
    fn discover(
        &self,
        priority: &Priority,
    ) -> impl Future<Output = Result<Vec<TargetGroup>, ElbError>> + Send;

    /// Every target group of every account the implementation reaches, with one error
    /// per account whose discovery failed: a role that cannot be assumed (or any failure
    /// in one account) must cost only that account's groups, never the others'. `Err`
    /// only when nothing could be discovered in the one account there is. The default,
    /// for single-account implementations, is [`TargetGroupApi::discover`].
    fn discover_accounts(
        &self,
        priority: &Priority,
    ) -> impl Future<Output = Result<Discovery, ElbError>> + Send {
        async move {
            Ok(Discovery {
                groups: self.discover(priority).await?,
                failed: Vec::new(),
            })
        }
    }

    /// The named groups (at most 20) with their tags: one DescribeTargetGroups and one
    /// DescribeTags. A cold container reads this way the groups its index says a pod
    /// change concerns, ahead of discovery's pages. `Err` when any of them cannot be
    /// read (a deleted one included): discovery, which reads them all, decides then.
    fn describe(
        &self,
        arns: &[String],
        priority: &Priority,
    ) -> impl Future<Output = Result<Vec<TargetGroup>, ElbError>> + Send;

    /// The current tags of the named groups, at most 20 of one account: one
    /// DescribeTags. A pass that acts on a cached binding re-reads its group's, and with
    /// the same call those of the groups its container may serve next. `Err` with
    /// [`ElbError::NotFound`] when any of them no longer exists (ELBv2 then answers for
    /// none); a group missing from the answer was not found either.
    fn tags_of(
        &self,
        arns: &[String],
        priority: &Priority,
    ) -> impl Future<Output = Result<TagsByArn, ElbError>> + Send;

    /// The current tags of one group (one DescribeTags).
    fn tags(
        &self,
        arn: &str,
        priority: &Priority,
    ) -> impl Future<Output = Result<BTreeMap<String, String>, ElbError>> + Send {
        async move {
            let arns = [arn.to_owned()];
            take_tags(&mut self.tags_of(&arns, priority).await?, arn)
        }
    }

    /// What the rollout check reads of a group beyond its facts: its protocol and health
    /// check (one DescribeTargetGroups of the group) and its deregistration delay and
    /// connection termination (one DescribeTargetGroupAttributes). They rarely change:
    /// the reconcile core caches them (see `reconcile::rollout`).
    fn attributes(
        &self,
        arn: &str,
        priority: &Priority,
    ) -> impl Future<Output = Result<GroupAttributes, ElbError>> + Send;

    /// One DescribeTargetHealth of the whole group (never filtered by target, so never
    /// by a zone ELBv2 may have recorded differently): every registered target with its
    /// state, ELBv2's reason and description, and any administrative override.
    fn health(
        &self,
        arn: &str,
        priority: &Priority,
    ) -> impl Future<Output = Result<Vec<TargetHealth>, ElbError>> + Send;

    /// RegisterTargets with at most 200 targets. When ELBv2 refuses the call because of
    /// some of them, the others are still registered and the refused ones come back in
    /// [`ElbError::Rejected`], each with ELBv2's reason and what it takes
    /// ([`Refusal`]): targets beyond the group's quota, and targets ELBv2 wants in a
    /// named zone, are told apart from targets refused for themselves. `fence` is checked
    /// before every attempt ([`ElbError::Fenced`] when it refuses).
    fn register(
        &self,
        arn: &str,
        targets: &[Target],
        fence: &dyn Fence,
    ) -> impl Future<Output = Result<(), ElbError>> + Send;

    /// RegisterTargets of targets outside the group's VPC, each in the Availability Zone
    /// given (its pod's node's): what ELBv2 requires of an ALB group with cross-zone
    /// load balancing off, after [`Refusal::ZoneRequired`]. Refusals and `fence` as for
    /// [`TargetGroupApi::register`].
    fn register_in_zones(
        &self,
        arn: &str,
        targets: &[(Target, String)],
        fence: &dyn Fence,
    ) -> impl Future<Output = Result<(), ElbError>> + Send;

    /// DeregisterTargets with at most 200 targets; `fence` as for
    /// [`TargetGroupApi::register`].
    fn deregister(
        &self,
        arn: &str,
        targets: &[Target],
        fence: &dyn Fence,
    ) -> impl Future<Output = Result<(), ElbError>> + Send;

    /// ELBv2's push-back so far (throttled answers, retried attempts), for metrics.
    fn pressure(&self) -> crate::report::ElbPressure {
        crate::report::ElbPressure::default()
    }
}

/// A target ELBv2 refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The target.
    pub target: Target,
    /// ELBv2's error, as the report shows it.
    pub reason: String,
    /// What the refusal takes.
    pub refusal: Refusal,
}

impl Refused {
    /// `target` refused for itself with `reason`.
    pub fn target(target: Target, reason: impl Into<String>) -> Self {
        Self {
            target,
            reason: reason.into(),
            refusal: Refusal::Target,
        }
    }
}

/// What a refused registration takes to go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Something about the target ELBv2 will not take (an address outside the VPC, a
    /// target registered with as many groups of the load balancer as it may be:
    /// `TooManyRegistrationsForTargetId`): the target backs off alone.
    Target,
    /// Capacity: the group is at its targets quota (`TooManyTargets`). Only room helps
    /// (a raised quota, a split group, targets leaving): the group registers what its
    /// learnt capacity leaves room for and probes beyond it once per growing interval.
    /// Deregistrations are unaffected.
    Capacity,
    /// ELBv2 wants this target (outside the group's VPC) in a named Availability Zone:
    /// an ALB group with cross-zone load balancing off refuses `all`. Register it again
    /// with [`TargetGroupApi::register_in_zones`].
    ZoneRequired,
}

/// What discovery found across accounts.
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    /// The groups of every account whose discovery succeeded.
    pub groups: Vec<TargetGroup>,
    /// One entry per account whose discovery failed: its groups are unknown this run and
    /// left untouched (an unreadable account must never look like an empty one).
    pub failed: Vec<AccountError>,
}

/// Discovery failed in one account. Its message names the account and the role, so the
/// run-level error in the report (and the metric counting it) points at what to fix.
#[derive(Debug, Clone, Error)]
#[error(
    "{}: discovering target groups failed: {error}; that account's target groups are left untouched",
    account_label(account.as_deref(), role.as_deref())
)]
pub struct AccountError {
    /// The account id (`None`: this deployment's own account, before its id was learnt
    /// from a target group ARN).
    pub account: Option<String>,
    /// The role assumed for it (`None`: this deployment's own account and credentials).
    pub role: Option<String>,
    /// What went wrong.
    pub error: ElbError,
}

/// How reports name an account: `account 123456789012 (role arn:…)`, or `this account`.
fn account_label(account: Option<&str>, role: Option<&str>) -> String {
    match (account, role) {
        (Some(a), Some(r)) => format!("account {a} (role {r})"),
        (None, Some(r)) => format!("the account of role {r}"),
        (Some(a), None) => format!("account {a} (this deployment's own)"),
        (None, None) => "this deployment's own account".to_owned(),
    }
}

/// Why an ELBv2 call failed (after the SDK's retries).
#[derive(Debug, Clone, Error)]
pub enum ElbError {
    /// The target group does not exist (deleted since discovery).
    #[error("target group {arn} not found (deleted?)")]
    NotFound {
        /// The ARN.
        arn: String,
    },
    /// Throttled even after retries.
    #[error("ELBv2 {operation} throttled after retries; the group backs off and retries later")]
    Throttled {
        /// The API operation.
        operation: &'static str,
    },
    /// IAM refused the call.
    #[error("ELBv2 {operation} denied: {message}; check the function role's policy")]
    AccessDenied {
        /// The API operation.
        operation: &'static str,
        /// The service's message.
        message: String,
    },
    /// ELBv2 refused these targets (each with its reason); every other target of the
    /// call went through.
    #[error("ELBv2 {operation} refused {} target(s): {}", targets.len(), targets.first().map(|r| format!("{}: {}", r.target, r.reason)).unwrap_or_default())]
    Rejected {
        /// The API operation.
        operation: &'static str,
        /// The refused targets, ELBv2's reason and what each refusal takes.
        targets: Vec<Refused>,
    },
    /// No credentials for the call: for a target account, the role could not be
    /// assumed. Not retried call by call (STS's own client already retried what is
    /// worth retrying); the account's groups wait for the next run.
    #[error(
        "ELBv2 {operation}: no credentials: {message}; check that the role exists, trusts the function roles (with the external ID, if set), and that the function role may sts:AssumeRole it"
    )]
    Credentials {
        /// The API operation.
        operation: &'static str,
        /// What the credentials provider said.
        message: String,
    },
    /// The group's ARN names an account this deployment has no client for (neither its
    /// own nor one of `TGSYNC_TARGET_ACCOUNT_ROLES`).
    #[error(
        "target group {arn} is in account {account}, which this deployment reaches with no role; add one to TGSYNC_TARGET_ACCOUNT_ROLES"
    )]
    NoAccount {
        /// The ARN.
        arn: String,
        /// Its account (empty when the ARN names none).
        account: String,
    },
    /// The fence refused the next attempt (the lease was lost or ran out): nothing more
    /// was sent; whoever holds the group now finishes it.
    #[error("ELBv2 {operation} not sent: {reason}")]
    Fenced {
        /// The API operation.
        operation: &'static str,
        /// Why the fence refused.
        reason: String,
    },
    /// Any other failure.
    #[error("ELBv2 {operation} failed: {message}")]
    Other {
        /// The API operation.
        operation: &'static str,
        /// Error code and message.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_errors_name_the_account_and_the_role() {
        let e = AccountError {
            account: Some("222222222222".into()),
            role: Some("arn:aws:iam::222222222222:role/tgsync".into()),
            error: ElbError::Credentials {
                operation: "DescribeTargetGroups",
                message: "AccessDenied".into(),
            },
        };
        let text = e.to_string();
        assert!(
            text.starts_with("account 222222222222 (role arn:aws:iam::222222222222:role/tgsync): discovering target groups failed: ELBv2 DescribeTargetGroups: no credentials: AccessDenied"),
            "{text}"
        );
    }
}
